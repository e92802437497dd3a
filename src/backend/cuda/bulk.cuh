/* bulk.cuh — the copy engine's one-instruction global -> shared copies (cp.async.bulk, sm_90) and the
 * transaction mbarriers that say when they landed, for the prefill attention's K / V tiles (attention_tc.cu;
 * large copies pay: row-sized ones, 128-512 bytes, made the DeltaNet pass 2.2x slower). A copy moves 16..N x
 * 16 bytes between 16-byte aligned addresses; one thread arms a barrier with the bytes of its phase
 * (bk_expect, the phase's single arrival) and any thread then issues copies against it; every consumer waits
 * on the phase's parity. A buffer the block read by ordinary loads is rewritten only after a __syncthreads
 * and bk_fence by the issuing thread. */
#ifndef CI_CUDA_BULK_CUH
#define CI_CUDA_BULK_CUH

#include <stdint.h>

static __device__ __forceinline__ unsigned bk_sa(const void *p) {
    return (unsigned)__cvta_generic_to_shared(p);
}
/* one arrival a phase (bk_expect's) */
static __device__ __forceinline__ void bk_init(uint64_t *bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bk_sa(bar)) : "memory");
}
/* after the thread's bk_init calls, before the block's __syncthreads */
static __device__ __forceinline__ void bk_init_fence(void) {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
/* the block's first n barriers set up by thread 0 (bk_init + bk_init_fence), then a __syncthreads so that no
 * thread uses one before it exists; every thread of the block calls it */
static __device__ __forceinline__ void bk_init_block(uint64_t *bar, int n) {
    if (threadIdx.x == 0) {
        for (int i = 0; i < n; i++) bk_init(bar + i);
        bk_init_fence();
    }
    __syncthreads();
}
/* the phase's arrival, with the bytes its copies will bring */
static __device__ __forceinline__ void bk_expect(uint64_t *bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bk_sa(bar)), "r"(bytes)
                 : "memory");
}
/* the block's earlier ordinary accesses of shared memory before the copy engine's writes */
static __device__ __forceinline__ void bk_fence(void) {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
static __device__ __forceinline__ void bk_copy(void *dst, const void *src, unsigned bytes, uint64_t *bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
            bk_sa(dst)),
        "l"(src), "r"(bytes), "r"(bk_sa(bar))
        : "memory");
}
static __device__ __forceinline__ void bk_wait(uint64_t *bar, unsigned parity) {
    unsigned ok = 0;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(ok)
                     : "r"(bk_sa(bar)), "r"(parity)
                     : "memory");
    } while (!ok);
}

#endif

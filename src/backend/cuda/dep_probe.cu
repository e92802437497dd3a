/* dep_probe.cu — diagnostics only (no forward uses it): how soon a kernel launched by programmatic dependent
 * launch is released after the kernel before it finishes, by three handoffs, in a chain of GEMV-like kernels
 * (each block streams its slice of bf16 "weights" with ld.global.cs; a consumer's first chunk is requested
 * before its wait, as the decode GEMVs do):
 *  0  griddepcontrol.wait (today's decode step);
 *  1  a counter: every producer block's thread 0, after the barrier, __threadfence() (fence.sc.gpu) then
 *     atomicAdd; the consumer's thread 0 polls with ld.acquire.gpu, then __threadfence() and the barrier
 *     (session 8's CINFER_CUDA_DEP, measured no earlier than mode 0 on the H200 and since removed);
 *  2  the same counter with no fence.sc on either side: red.release.gpu to post, ld.acquire.gpu alone to
 *     poll;
 *  3  griddepcontrol.wait, each block's stamps stored at an index it takes by atomicAdd on one counter, as
 *     gemv3.cu's timeline stamps (g3_stamp_put) do: what that diagnostic itself adds to the gap it shows.
 * Each block records %globaltimer at its start, when its wait is done and at its end (before its post). */
#include "backend/cuda/common.cuh"

__device__ __forceinline__ unsigned long long dp_now(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ unsigned dp_ld_acquire(const unsigned *p) {
    unsigned v;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
#else
    v = *(volatile const unsigned *)p;
#endif
    return v;
}

/* w: this launch's weights, vec uint4 per block; wait / post: counters (mode 1, 2; NULL wait: the first
 * launch); st: [gridDim.x][3] stamps; sink: written only if the XOR of everything read is a value it never is
 * (keeps the loads) */
__global__ void __launch_bounds__(256)
    dep_probe_kernel(const uint4 *__restrict__ w, size_t vec, const unsigned *wait, unsigned wait_n,
                     unsigned *post, int mode, unsigned long long *st, unsigned *sink, unsigned *slot) {
    __shared__ unsigned red[8];
    unsigned long long t0 = dp_now();
    const uint4 *p = w + blockIdx.x * vec;
    uint4 a = threadIdx.x < vec ? __ldcs(p + threadIdx.x) : make_uint4(0, 0, 0, 0);
    if (mode == 0 || mode == 3 || !wait) {
        griddep_wait();
    } else {
        if (threadIdx.x == 0) {
            unsigned long long ts = 0;
            for (unsigned it = 0; dp_ld_acquire(wait) < wait_n; it++) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
                __nanosleep(32);
#endif
                if ((it & 1023u) == 1023u) { /* never hang a test: give up after ~1 s */
                    unsigned long long t = dp_now();
                    if (!ts)
                        ts = t;
                    else if (t - ts > 1000000000ull)
                        break;
                }
            }
            if (mode == 1) __threadfence();
        }
        __syncthreads();
    }
    unsigned long long t1 = dp_now();
    griddep_launch();
    unsigned x = a.x ^ a.y ^ a.z ^ a.w;
    for (size_t i = threadIdx.x + blockDim.x; i < vec; i += blockDim.x) {
        uint4 b = __ldcs(p + i);
        x ^= b.x ^ b.y ^ b.z ^ b.w;
    }
    for (int o = 16; o > 0; o >>= 1) x ^= __shfl_xor_sync(0xffffffffu, x, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = x;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned v = 0;
        for (int i = 0; i < (int)(blockDim.x >> 5); i++) v ^= red[i];
        if (v == 0x9e3779b9u) sink[blockIdx.x] = v;
        unsigned long long t2 = dp_now();
        /* mode 3: the slot by atomicAdd (the count runs over launches: modulo the grid, a permutation of this
         * launch's blocks) */
        unsigned b = mode == 3 ? atomicAdd(slot, 1u) % gridDim.x : blockIdx.x;
        unsigned long long *s = st + (size_t)b * 3;
        s[0] = t0, s[1] = t1, s[2] = t2;
        if (post && mode == 1) {
            __threadfence();
            atomicAdd(post, 1u);
        } else if (post && mode == 2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(post) : "memory");
#else
            atomicAdd(post, 1u);
#endif
        }
    }
}

extern "C" int cu_dep_probe(cu_ctx *c, int mode, int launches, const uint16_t *w, size_t bytes_each,
                            int blocks, unsigned *ctr, unsigned long long *st, unsigned *sink) {
    if (mode < 0 || mode > 3 || launches <= 0 || blocks <= 0 || bytes_each % (16 * (size_t)blocks)) return -1;
    size_t vec = bytes_each / 16 / (size_t)blocks;
    cudaMemsetAsync(ctr, 0, ((size_t)launches + 1) * sizeof(unsigned), c->stream);
    c->pdl_break = 1; /* the first launch follows the memset */
    for (int l = 0; l < launches; l++) {
        const uint4 *wl = reinterpret_cast<const uint4 *>(w + (size_t)l * (bytes_each / 2));
        cu_launch_pdl(c, 1, dep_probe_kernel, dim3((unsigned)blocks), dim3(256), wl, vec,
                      (const unsigned *)(l ? ctr + l - 1 : NULL), (unsigned)blocks,
                      (unsigned *)(mode == 1 || mode == 2 ? ctr + l : NULL), mode,
                      st + (size_t)l * blocks * 3, sink, ctr + launches);
    }
    return 0;
}

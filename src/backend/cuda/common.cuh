/* common.cuh — what every CUDA source of the backend shares: the context struct, bf16 helpers, warp and
 * block reductions. Kernels never allocate; launchers only enqueue on c->stream. */
#ifndef CI_CUDA_COMMON_CUH
#define CI_CUDA_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "backend/cuda/cuda_ops.h"

struct cu_ctx {
    cudaStream_t stream;
    /* cu_h2d_side's copies: a non-blocking stream made at its first use, and the event the stream waits on */
    cudaStream_t side;
    cudaEvent_t side_done;
    cublasHandle_t blas;
    void *blas_ws; /* cuBLAS workspace (fixed, so capture never allocates) */
    size_t blas_ws_bytes;
    cudaGraph_t graph; /* the graph being captured */
    float *ytmp;       /* [2M][N] f32 for stacked hi/lo products (cu_set_gemm_scratch), or NULL */
    size_t ytmp_floats;
    int xb_rows; /* rows of K each half of cu_gemm's xb holds (cu_set_gemm_scratch); 0: unknown, no padding */
    int skinny;  /* this context's CINFER_CUDA_SKINNY mode (cu_ctx_set_skinny), 0: the process-wide one */
    /* 1 when the last operation enqueued on the stream (or captured) may not be a kernel: a memcpy, memset,
     * event record or graph launch (runtime.cu sets it). The next launch then goes without the PDL attribute
     * (cu_launch_pdl) and clears it: see there why PDL must never follow such an operation. */
    int pdl_break;
    /* CINFER_CUDA_L2PF_NEXT: the next decode GEMV launched (gemv3_kernel) requests these bytes — the head of
     * the GEMV after it — into L2 from the blocks of its second half once their loads are out; NULL none. Set
     * by cu_set_gemv_next (forward_cuda.c sets it before a fused GEMV and clears it after) */
    const void *gemv_next;
    size_t gemv_next_bytes;
    /* bf16 passes of this context's tensor-core GEMMs (cu_set_bf16_passes): 1 one rounding of the activations
     * (precision fast), anything else (0 as created) hi + lo, two (exact). Per context, so two contexts of one
     * process (a fast server beside an exact test, a draft model) run their own mode */
    int bf16_passes;
};

__device__ __forceinline__ float bf16_f32(uint16_t h) {
    return __uint_as_float((uint32_t)h << 16);
}

/* round to nearest even, NaN kept quiet (matches util/bf16.h) */
__device__ __forceinline__ uint16_t f32_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* v as bf16 hi = bf16(v) at y[i] and lo = bf16(v - hi) at y[lo + i]: the halves of cu_gemm's two-pass path
 * (gemm.cu), for the kernels that write them for it (CINFER_CUDA_PF_SPLIT); the subtraction never contracted
 * with a product making v */
__device__ __forceinline__ void split_put(uint16_t *y, size_t i, size_t lo, float v) {
    uint16_t h = f32_bf16(v);
    y[i] = h;
    if (lo) y[lo + i] = f32_bf16(__fsub_rn(v, bf16_f32(h))); /* lo 0: the one-pass GEMM reads hi only */
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result */
__device__ __forceinline__ float block_sum(float v, float *sh /* [32] */) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    float t = 0.0f;
    if (w == 0) {
        t = lane < nw ? sh[lane] : 0.0f;
        t = warp_sum(t);
        if (lane == 0) sh[0] = t;
    }
    __syncthreads();
    return sh[0];
}

/* one row of the residual stream x (H floats): x += add when add is given, then 1 / sqrt(mean(x^2) + eps),
 * each thread summing elements threadIdx.x + k blockDim.x in order, the block's sums joined by block_sum: the
 * RMSNorm's scale of add_rmsnorm_kernel (rownorm.cu) and add_rmsnorm_split_kernel (gemm.cu), the same bits */
__device__ __forceinline__ float row_add_rms_inv(float *xr, const float *add, int H, float eps, float *sh) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        float v = xr[i];
        if (add) {
            v += add[i];
            xr[i] = v;
        }
        ss += v * v;
    }
    ss = block_sum(ss, sh);
    return 1.0f / sqrtf(ss / (float)H + eps);
}

__device__ __forceinline__ float dev_sigmoid(float x) {
    return 1.0f / (1.0f + expf(-x));
}
__device__ __forceinline__ float dev_silu(float x) {
    return x / (1.0f + expf(-x));
}
__device__ __forceinline__ float dev_softplus(float x) {
    return x > 20.0f ? x : log1pf(expf(x));
}

/* Programmatic dependent launch (sm_90). griddep_wait: block until the kernel before this one in the stream
 * has completed and its writes are visible (a no-op when this kernel was not launched with the PDL
 * attribute). griddep_launch: let the next kernel, if launched with the attribute, start its blocks now (a
 * no-op otherwise; that kernel still waits for this one's completion before reading what it writes). */
__device__ __forceinline__ void griddep_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void griddep_launch(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Programmatic dependent launch (PDL) across the decode step, CINFER_CUDA_PDL (cu_set_pdl): 0 off, 1 the
 * GEMVs only (session 4's form), 2 every kernel of a decode step (embedding, norms, GEMVs, the fused DeltaNet
 * and attention decode kernels, lm_head, sampling). The rules every kernel launched this way keeps:
 *  - before griddep_wait() it reads only what no kernel of the step writes (weights; the state of its own
 *    layer, written one step earlier; the step's metadata, uploaded before its first kernel) and writes
 *    nothing; every block executes griddep_wait(), including blocks that have nothing to do: wait in kernel
 *    C covers only its immediate predecessor B, and B, launched by PDL, counts as complete once its blocks
 *    exit, so a block of B that skipped its wait would let B complete before A and C read A's unfinished
 *    output;
 *  - griddep_launch() comes after griddep_wait() (never before): then when kernel N starts, every kernel
 *    before N - 1 has completed, which is what makes the pre-wait reads above safe;
 *  - PDL never follows an operation that is not a kernel (cu_ctx.pdl_break): griddep_wait covers the kernel
 *    before, not an event record, memcpy or memset between the two, so the chain "C complete implies
 *    everything before C complete", on which stream completion and every later operation rely, would not
 *    hold across one. (Session 4's "PDL crash" of the profiled bench was not this: the bench profiled a
 *    4096-token prefill in KV space sized for --prefill 512, PDL or not; bench_cuda.c now caps it.) */
extern "C" int cu_pdl_on(void);
/* kern<<<grid, block, smem, stream>>>(args...), by programmatic dependent launch when pdl (and the last
 * operation on the stream was a kernel) */
template <class... KA, class... A>
static void cu_launch_pdl_smem(cu_ctx *c, int pdl, void (*kern)(KA...), dim3 grid, dim3 block, size_t smem,
                               A... args) {
    if (!pdl || c->pdl_break) {
        c->pdl_break = 0;
        kern<<<grid, block, smem, c->stream>>>(args...);
        return;
    }
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    cudaLaunchKernelEx(&cfg, kern, args...);
}
template <class... KA, class... A>
static void cu_launch_pdl(cu_ctx *c, int pdl, void (*kern)(KA...), dim3 grid, dim3 block, A... args) {
    cu_launch_pdl_smem(c, pdl, kern, grid, block, 0, args...);
}
/* kernel classes for CINFER_CUDA_PDL_MASK (diagnostics: which kinds of kernel go by PDL; default all) */
enum { PDL_ROWS = 1, PDL_GDN = 2, PDL_ATTN = 4, PDL_SAMPLE = 8, PDL_GEMV = 16 };
extern "C" int cu_pdl_mask(void);
/* the GEMVs: by PDL from CINFER_CUDA_PDL=gemv on */
template <class... KA, class... A>
static void cu_launch_gemv(cu_ctx *c, void (*kern)(KA...), dim3 grid, dim3 block, A... args) {
    cu_launch_pdl(c, cu_pdl_on() >= 1 && (cu_pdl_mask() & PDL_GEMV), kern, grid, block, args...);
}
/* every other kernel of a decode step (cls: PDL_*): by PDL under CINFER_CUDA_PDL=1 */
template <class... KA, class... A>
static void cu_launch_step(cu_ctx *c, int cls, void (*kern)(KA...), dim3 grid, dim3 block, A... args) {
    cu_launch_pdl(c, cu_pdl_on() >= 2 && (cu_pdl_mask() & cls), kern, grid, block, args...);
}

/* part b of n of [p, p + bytes) (16-byte aligned, bytes a multiple of 16) into L2 by sm_90's bulk prefetch,
 * no registers held; one thread calls it */
__device__ __forceinline__ void l2_prefetch_part(const void *p, size_t bytes, size_t b, size_t nb) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    size_t per = ((bytes / 16 + nb - 1) / nb) * 16, o = b * per, e = o + per < bytes ? o + per : bytes;
    const char *c = static_cast<const char *>(p);
    for (; o < e; o += 65536) {
        unsigned n = (unsigned)(e - o < 65536 ? e - o : 65536);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(c + o), "r"(n) : "memory");
    }
#else
    (void)p, (void)bytes, (void)b, (void)nb;
#endif
}
static inline unsigned cdiv(size_t a, size_t b) {
    return (unsigned)((a + b - 1) / b);
}

#endif

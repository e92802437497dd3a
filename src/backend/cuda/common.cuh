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
    cublasHandle_t blas;
    void *blas_ws; /* cuBLAS workspace (fixed, so capture never allocates) */
    size_t blas_ws_bytes;
    cudaGraph_t graph; /* the graph being captured */
    float *ytmp;       /* [2M][N] f32 for stacked hi/lo products (cu_set_gemm_scratch), or NULL */
    size_t ytmp_floats;
    int skinny; /* this context's CINFER_CUDA_SKINNY mode (cu_ctx_set_skinny), 0: the process-wide one */
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

/* kernel<<<grid, block, 0, stream>>>(args...), with programmatic dependent launch when cu_set_pdl(1): the
 * kernel's blocks may start while the kernel before it still runs; each GEMV kernel calls griddep_wait()
 * before its first read of x, and reads only weights before that */
extern "C" int cu_pdl_on(void);
/* kern<<<grid, block, 0, stream>>>(args...), by programmatic dependent launch when pdl */
template <class... KA, class... A>
static void cu_launch_pdl(cu_ctx *c, int pdl, void (*kern)(KA...), dim3 grid, dim3 block, A... args) {
    if (!pdl) {
        kern<<<grid, block, 0, c->stream>>>(args...);
        return;
    }
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = 0;
    cfg.stream = c->stream;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    cudaLaunchKernelEx(&cfg, kern, args...);
}
template <class... KA, class... A>
static void cu_launch_gemv(cu_ctx *c, void (*kern)(KA...), dim3 grid, dim3 block, A... args) {
    cu_launch_pdl(c, cu_pdl_on(), kern, grid, block, args...);
}

static inline unsigned cdiv(size_t a, size_t b) {
    return (unsigned)((a + b - 1) / b);
}

#endif

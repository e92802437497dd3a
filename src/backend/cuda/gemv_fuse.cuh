/* gemv_fuse.cuh — the decode fusions' arithmetic, shared by the GEMV v3 (gemv3.cu) and the skinny tensor-core
 * GEMM (gemm_mma.cu) so that both finish an output the same way: the RMSNorm prologue's scale from the row's
 * sum of squares, and the three epilogues (store, residual add, SwiGLU). */
#ifndef CI_CUDA_GEMV_FUSE_CUH
#define CI_CUDA_GEMV_FUSE_CUH

#include "backend/cuda/common.cuh"

enum { GF_STORE = CU_EPI_STORE, GF_ADD = CU_EPI_ADD, GF_SWIGLU = CU_EPI_SWIGLU };

/* 1 / rms(x) from Σ x² over the K elements of the row (the kernel applies it to Σ w · (x · g) at the end) */
__device__ __forceinline__ float gf_rms_inv(float sumsq, int K, float eps) {
    return 1.0f / sqrtf(sumsq / (float)K + eps);
}

/* v: the output's dot product (the gate's under SwiGLU), u: the up row's (SwiGLU only) */
template <int EPI> __device__ __forceinline__ void gf_store(float *out, float v, float u) {
    if (EPI == GF_SWIGLU)
        *out = dev_silu(v) * u;
    else if (EPI == GF_ADD)
        *out += v;
    else
        *out = v;
}

#endif

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

/* conv1d + SiLU of one channel for one token: silu(w . [window | xin]); win holds the K-1 earlier inputs,
 * oldest first, wt their weights, wl the current input's (the loop is unrolled with constant indices, so
 * arrays filled the same way stay in registers). DeltaNet's conv, wherever it runs (deltanet.cu's kernels,
 * the in_proj GEMVs' conv epilogue) */
#define CONV_MAXK 8
template <int N>
__device__ __forceinline__ float conv_tap(const float (&wt)[N], const float (&win)[N], float wl, float xin,
                                          int K) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < N - 1; j++)
        if (j < K - 1) acc = fmaf(wt[j], win[j], acc);
    return dev_silu(fmaf(wl, xin, acc));
}

/* the conv epilogue's inputs for output channel j of row m (j < cv.C): window and weights, loaded ahead */
struct gf_conv_in {
    float win[CONV_MAXK], wt[CONV_MAXK], wl;
    float *cst; /* the row's window base, channel j */
};
__device__ __forceinline__ void gf_conv_load(gf_conv_in &ci, const cu_conv_epi &cv, int m, int j) {
    ci.cst = cv.state + ((size_t)cv.slot[m] * cv.n_lin + cv.lin) * (size_t)(cv.K - 1) * cv.C + j;
#pragma unroll
    for (int t = 0; t < CONV_MAXK - 1; t++) {
        ci.win[t] = t < cv.K - 1 ? ci.cst[(size_t)t * cv.C] : 0.0f;
        ci.wt[t] = t < cv.K - 1 ? cv.w[(size_t)t * cv.C + j] : 0.0f;
    }
    ci.win[CONV_MAXK - 1] = ci.wt[CONV_MAXK - 1] = 0.0f;
    ci.wl = cv.w[(size_t)(cv.K - 1) * cv.C + j];
}
/* y = the channel's conv output of the GEMV value v; the window advanced by v */
__device__ __forceinline__ float gf_conv_apply(const gf_conv_in &ci, const cu_conv_epi &cv, float v) {
    float y = conv_tap(ci.wt, ci.win, ci.wl, v, cv.K);
#pragma unroll
    for (int t = 0; t < CONV_MAXK - 1; t++)
        if (t < cv.K - 1) ci.cst[(size_t)t * cv.C] = t + 1 < cv.K - 1 ? ci.win[t + 1] : v;
    return y;
}

#endif

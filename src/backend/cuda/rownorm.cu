/* rownorm.cu — per-row ops of the residual stream: embedding gather, (residual add +) RMSNorm, SwiGLU,
 * row add. One block per row; reductions in f32. Launched by programmatic dependent launch under
 * CINFER_CUDA_PDL=1 (cu_launch_step): each waits for the kernel before it first, then lets the next one
 * start (common.cuh says why in that order). */
#include "backend/cuda/common.cuh"

__global__ void embed_kernel(float *x, const uint16_t *E, const int *ids, int H) {
    griddep_wait(); /* writes x, which the kernel before may still read */
    griddep_launch();
    int r = blockIdx.x;
    const uint16_t *row = E + (size_t)ids[r] * H;
    for (int i = threadIdx.x; i < H; i += blockDim.x) x[(size_t)r * H + i] = bf16_f32(row[i]);
}

extern "C" void cu_embed(cu_ctx *c, float *x, const uint16_t *E, const int *ids, int T, int H) {
    if (T > 0) cu_launch_step(c, PDL_ROWS, embed_kernel, dim3((unsigned)T), dim3(256), x, E, ids, H);
}

/* y = (x * (1 / sqrt(mean(x^2) + eps))) * w, the CPU's rounding order */
__global__ void add_rmsnorm_kernel(float *x, const float *add, float *y, const float *w, int H, float eps,
                                   const int *src) {
    __shared__ float sh[32];
    griddep_wait();
    griddep_launch(); /* a GEMV launched with PDL after this may start fetching its weights */
    int r = blockIdx.x;
    float *xr = x + (size_t)(src ? src[r] : r) * H;
    float inv = row_add_rms_inv(xr, add ? add + (size_t)r * H : NULL, H, eps, sh);
    for (int i = threadIdx.x; i < H; i += blockDim.x) y[(size_t)r * H + i] = (xr[i] * inv) * w[i];
}

extern "C" void cu_add_rmsnorm(cu_ctx *c, float *x, const float *add, float *y, const float *w, int T, int H,
                               float eps) {
    if (T > 0)
        cu_launch_step(c, PDL_ROWS, add_rmsnorm_kernel, dim3((unsigned)T), dim3(256), x, add, y, w, H, eps,
                       (const int *)NULL);
}

extern "C" void cu_gather_rmsnorm(cu_ctx *c, float *y, const float *x, const int *src, const float *w, int n,
                                  int H, float eps) {
    if (n > 0)
        cu_launch_step(c, PDL_ROWS, add_rmsnorm_kernel, dim3((unsigned)n), dim3(256), (float *)x,
                       (const float *)NULL, y, w, H, eps, src);
}

__global__ void swiglu_kernel(float *y, const float *gu, int I) {
    griddep_wait();   /* before any block returns (common.cuh) */
    griddep_launch(); /* a GEMV launched with PDL after this may start fetching its weights */
    int r = blockIdx.x;
    int i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i >= I) return;
    const float *g = gu + (size_t)r * 2 * I;
    y[(size_t)r * I + i] = dev_silu(g[i]) * g[I + i];
}

extern "C" void cu_swiglu(cu_ctx *c, float *y, const float *gu, int T, int I) {
    if (T <= 0) return;
    dim3 grid((unsigned)T, cdiv((size_t)I, 256));
    cu_launch_step(c, PDL_ROWS, swiglu_kernel, grid, dim3(256), y, gu, I);
}

__global__ void add_kernel(float *x, const float *y, size_t n) {
    griddep_wait();
    griddep_launch();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] += y[i];
}

extern "C" void cu_add(cu_ctx *c, float *x, const float *y, int T, int n) {
    size_t N = (size_t)T * n;
    if (!N) return;
    unsigned g = cdiv(N, 256);
    if (g > 65535u * 16u) g = 65535u * 16u;
    cu_launch_step(c, PDL_ROWS, add_kernel, dim3(g), dim3(256), x, y, N);
}

__global__ void concat_kernel(float *y, const float *a, const float *b, int H) {
    int r = blockIdx.x;
    for (int i = threadIdx.x; i < 2 * H; i += blockDim.x)
        y[(size_t)r * 2 * H + i] = i < H ? a[(size_t)r * H + i] : b[(size_t)r * H + i - H];
}

extern "C" void cu_concat_rows(cu_ctx *c, float *y, const float *a, const float *b, int T, int H) {
    if (T > 0) concat_kernel<<<T, 256, 0, c->stream>>>(y, a, b, H);
}

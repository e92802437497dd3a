/* ops.h — the CPU's small f32 kernels (norms, activations, dot products) used by the forward pass.
 * Reductions use a fixed 16-lane order so results depend only on the inputs, never on the batch, and every
 * ISA path (AVX-512, AVX2, C; chosen like the matmul's) gives the same bits. */
#ifndef CI_OPS_H
#define CI_OPS_H

#include <math.h>

/* Σ a[i]*b[i] over n, in 16 interleaved partial sums combined in a fixed tree. */
float ops_dot(const float *a, const float *b, int n);
/* y[i] += s * x[i]  (the product rounded, then the sum: never fused) */
void ops_axpy(float *y, float s, const float *x, int n);
/* C[m*ldc + n] += A[m*lda + k] * B[k*ldb + n] over k, for m < M, n < N: exactly the bits of
 *   for m, for k = 0..K-1: ops_axpy(C + m*ldc, neg ? -A[m*lda + k] : A[m*lda + k], B + k*ldb, N)
 * (each product rounded, then added, in k order), but blocked in registers: B's rows are loaded once per
 * block of rows and C stays in registers across K (~5x the axpy loop at 64 x 128 x 128). For the chunked
 * DeltaNet's products (D = U - W S, O = Q S, S += K^T D), which are such axpy loops today. C must not alias
 * A or B. */
void ops_gemm_acc(float *C, long ldc, const float *A, long lda, const float *B, long ldb, int M, int N, int K,
                  int neg);
/* y[i] *= s */
void ops_scale(float *y, float s, int n);
/* y[i] += x[i] */
void ops_add(float *y, const float *x, int n);
/* y[i] = x[i] * rsqrt(mean(x²) + eps) * w[i]  (w already holds 1 + w for zero-centred norms) */
void ops_rmsnorm(float *y, const float *x, const float *w, int n, float eps);
/* y[i] = x[i] * rsqrt(Σx² + eps)  (l2 normalisation, in place allowed) */
void ops_l2norm(float *y, const float *x, int n, float eps);

static inline float ops_sigmoid(float x) {
    return 1.0f / (1.0f + expf(-x));
}
static inline float ops_silu(float x) {
    return x / (1.0f + expf(-x));
}
/* torch.nn.functional.softplus with beta 1, threshold 20 */
static inline float ops_softplus(float x) {
    return x > 20.0f ? x : log1pf(expf(x));
}

#endif

/* ops.c — see ops.h. Each op has a portable C body and, on x86-64, AVX-512 and AVX2 bodies chosen at run
 * time by the same switch as the matmul (cpu_simd_level: CINFER_SIMD and cpu_matmul_isa_force apply). The
 * vector bodies give the C body's bits exactly: they use separate multiply and add (never FMA: the C body
 * rounds the product, then the sum), the same 16 lanes for dot products and the same folding tree.
 * The C bodies are only built for the baseline ISA (no FMA to contract into), and the project builds without
 * -ffast-math, so they are the order written here. Measured: the scalar axpy was a third of a 512-token
 * prefill (the chunked DeltaNet calls it ~70M times with n = 128). */
#include "backend/cpu/ops.h"

#include "backend/cpu/matmul.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* ---------------------------------------------------------------- portable C (the order, written out) */

static float dot_c(const float *a, const float *b, int n) {
    float acc[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) acc[l] += a[i + l] * b[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += a[i] * b[i];
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) acc[l] += acc[l + w];
    return acc[0];
}

static void axpy_c(float *y, float s, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] += s * x[i];
}

static void scale_c(float *y, float s, int n) {
    for (int i = 0; i < n; i++) y[i] *= s;
}

static void add_c(float *y, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] += x[i];
}

/* y[i] = (x[i] * r) * w[i]; w NULL: y[i] = x[i] * r */
static void scale_mul_c(float *y, const float *x, float r, const float *w, int n) {
    if (w)
        for (int i = 0; i < n; i++) y[i] = (x[i] * r) * w[i];
    else
        for (int i = 0; i < n; i++) y[i] = x[i] * r;
}

/* C[m][n] = C[m][n] + (a * B[k][n]) with a = A[m][k] (negated when neg), for k = 0, 1, ... in turn */
static void gemm_acc_c(float *C, long ldc, const float *A, long lda, const float *B, long ldb, int M, int N,
                       int K, int neg) {
    for (int m = 0; m < M; m++)
        for (int k = 0; k < K; k++) {
            float a = neg ? -A[(long)m * lda + k] : A[(long)m * lda + k];
            axpy_c(C + (long)m * ldc, a, B + (long)k * ldb, N);
        }
}

#if defined(__x86_64__)

/* ---------------------------------------------------------------- AVX-512 F */

#define O512 __attribute__((target("avx512f")))

static inline __mmask16 tail16(int rem) {
    return (__mmask16)((1u << rem) - 1u);
}

/* The 16-lane tree of dot_c: (l, l+8), (l, l+4), (l, l+2), (0, 1). */
static float fold16(const float *acc) {
    float a[16];
    for (int l = 0; l < 16; l++) a[l] = acc[l];
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) a[l] += a[l + w];
    return a[0];
}

static O512 float dot512(const float *a, const float *b, int n) {
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16)
        acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
    if (i < n) { /* the tail goes into lanes 0..rem-1; the others keep their value exactly */
        __mmask16 m = tail16(n - i);
        __m512 p = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i));
        acc = _mm512_mask_add_ps(acc, m, acc, p);
    }
    /* fold16's tree in registers: (l, l+8), (l, l+4), (l, l+2), (0, 1) */
    __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(acc),
                              _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1)));
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

static O512 void axpy512(float *y, float s, const float *x, int n) {
    __m512 sv = _mm512_set1_ps(s);
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i,
                         _mm512_add_ps(_mm512_loadu_ps(y + i), _mm512_mul_ps(sv, _mm512_loadu_ps(x + i))));
    if (i < n) {
        __mmask16 m = tail16(n - i);
        __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + i),
                                 _mm512_mul_ps(sv, _mm512_maskz_loadu_ps(m, x + i)));
        _mm512_mask_storeu_ps(y + i, m, v);
    }
}

static O512 void scale512(float *y, float s, int n) {
    __m512 sv = _mm512_set1_ps(s);
    int i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_loadu_ps(y + i), sv));
    if (i < n) {
        __mmask16 m = tail16(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, y + i), sv));
    }
}

static O512 void add512(float *y, const float *x, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_add_ps(_mm512_loadu_ps(y + i), _mm512_loadu_ps(x + i)));
    if (i < n) {
        __mmask16 m = tail16(n - i);
        _mm512_mask_storeu_ps(
            y + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + i), _mm512_maskz_loadu_ps(m, x + i)));
    }
}

static O512 void scale_mul512(float *y, const float *x, float r, const float *w, int n) {
    __m512 rv = _mm512_set1_ps(r);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + i), rv);
        if (w) v = _mm512_mul_ps(v, _mm512_loadu_ps(w + i));
        _mm512_storeu_ps(y + i, v);
    }
    if (i < n) {
        __mmask16 m = tail16(n - i);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), rv);
        if (w) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + i));
        _mm512_mask_storeu_ps(y + i, m, v);
    }
}

/* A block of R rows x 32 columns of C in 2R registers across the whole K: per k, two vectors of B serve every
 * row and each row's A element is broadcast once. Each element still sees its K products added one by one
 * in k order, each product rounded first (mul, then add), so the bits are those of the axpy sequence. */
#define GEMM512_R 8
static O512 inline __attribute__((always_inline)) void gemm512_blk(const int R, float *C, long ldc,
                                                                   const float *A, long lda, const float *B,
                                                                   long ldb, int K, int neg, __mmask16 m0,
                                                                   __mmask16 m1) {
    __m512 acc[GEMM512_R][2];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        acc[r][0] = _mm512_maskz_loadu_ps(m0, C + (long)r * ldc);
        acc[r][1] = _mm512_maskz_loadu_ps(m1, C + (long)r * ldc + 16);
    }
    const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(neg ? (int)0x80000000u : 0));
    for (int k = 0; k < K; k++) {
        __m512 b0 = _mm512_maskz_loadu_ps(m0, B + (long)k * ldb),
               b1 = _mm512_maskz_loadu_ps(m1, B + (long)k * ldb + 16);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            /* -a by flipping the sign bit: exact, as the scalar negation is */
            __m512 a = _mm512_castsi512_ps(_mm512_xor_si512(
                _mm512_castps_si512(_mm512_set1_ps(A[(long)r * lda + k])), _mm512_castps_si512(sign)));
            acc[r][0] = _mm512_add_ps(acc[r][0], _mm512_mul_ps(a, b0));
            acc[r][1] = _mm512_add_ps(acc[r][1], _mm512_mul_ps(a, b1));
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        _mm512_mask_storeu_ps(C + (long)r * ldc, m0, acc[r][0]);
        _mm512_mask_storeu_ps(C + (long)r * ldc + 16, m1, acc[r][1]);
    }
}

static O512 void gemm_acc512(float *C, long ldc, const float *A, long lda, const float *B, long ldb, int M,
                             int N, int K, int neg) {
    for (int n0 = 0; n0 < N; n0 += 32) {
        int rem = N - n0;
        __mmask16 m0 = rem >= 16 ? (__mmask16)0xffff : tail16(rem);
        __mmask16 m1 = rem >= 32 ? (__mmask16)0xffff : rem > 16 ? tail16(rem - 16) : (__mmask16)0;
        for (int r0 = 0; r0 < M; r0 += GEMM512_R) {
            float *c = C + (long)r0 * ldc + n0;
            const float *a = A + (long)r0 * lda, *b = B + n0;
            switch (M - r0 < GEMM512_R ? M - r0 : GEMM512_R) {
            case 8:
                gemm512_blk(8, c, ldc, a, lda, b, ldb, K, neg, m0, m1);
                break;
            case 7:
                gemm512_blk(7, c, ldc, a, lda, b, ldb, K, neg, m0, m1);
                break;
            case 6:
                gemm512_blk(6, c, ldc, a, lda, b, ldb, K, neg, m0, m1);
                break;
            case 5:
                gemm512_blk(5, c, ldc, a, lda, b, ldb, K, neg, m0, m1);
                break;
            case 4:
                gemm512_blk(4, c, ldc, a, lda, b, ldb, K, neg, m0, m1);
                break;
            case 3:
                gemm512_blk(3, c, ldc, a, lda, b, ldb, K, neg, m0, m1);
                break;
            case 2:
                gemm512_blk(2, c, ldc, a, lda, b, ldb, K, neg, m0, m1);
                break;
            default:
                gemm512_blk(1, c, ldc, a, lda, b, ldb, K, neg, m0, m1);
                break;
            }
        }
    }
}

/* ---------------------------------------------------------------- AVX2 (8 lanes; two for the 16 of a dot) */

#define O256 __attribute__((target("avx2")))

static O256 float dot256(const float *a, const float *b, int n) {
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        lo = _mm256_add_ps(lo, _mm256_mul_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
        hi = _mm256_add_ps(hi, _mm256_mul_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8)));
    }
    float l[16];
    _mm256_storeu_ps(l, lo);
    _mm256_storeu_ps(l + 8, hi);
    for (int k = 0; i < n; i++, k++) l[k] += a[i] * b[i];
    return fold16(l);
}

static O256 void axpy256(float *y, float s, const float *x, int n) {
    __m256 sv = _mm256_set1_ps(s);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_mul_ps(sv, _mm256_loadu_ps(x + i))));
    for (; i < n; i++) y[i] += s * x[i];
}

static O256 void scale256(float *y, float s, int n) {
    __m256 sv = _mm256_set1_ps(s);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), sv));
    for (; i < n; i++) y[i] *= s;
}

static O256 void add256(float *y, const float *x, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
    for (; i < n; i++) y[i] += x[i];
}

static O256 void scale_mul256(float *y, const float *x, float r, const float *w, int n) {
    __m256 rv = _mm256_set1_ps(r);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), rv);
        if (w) v = _mm256_mul_ps(v, _mm256_loadu_ps(w + i));
        _mm256_storeu_ps(y + i, v);
    }
    for (; i < n; i++) y[i] = w ? (x[i] * r) * w[i] : x[i] * r;
}

/* gemm_acc512's block for AVX2: R rows x 16 columns in 2R ymm registers. */
#define GEMM256_R 6
static O256 inline __attribute__((always_inline)) void gemm256_blk(const int R, float *C, long ldc,
                                                                   const float *A, long lda, const float *B,
                                                                   long ldb, int K, int neg, __m256i m0,
                                                                   __m256i m1) {
    __m256 acc[GEMM256_R][2];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        acc[r][0] = _mm256_maskload_ps(C + (long)r * ldc, m0);
        acc[r][1] = _mm256_maskload_ps(C + (long)r * ldc + 8, m1);
    }
    const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(neg ? (int)0x80000000u : 0));
    for (int k = 0; k < K; k++) {
        __m256 b0 = _mm256_maskload_ps(B + (long)k * ldb, m0),
               b1 = _mm256_maskload_ps(B + (long)k * ldb + 8, m1);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            __m256 a = _mm256_xor_ps(_mm256_set1_ps(A[(long)r * lda + k]), sign);
            acc[r][0] = _mm256_add_ps(acc[r][0], _mm256_mul_ps(a, b0));
            acc[r][1] = _mm256_add_ps(acc[r][1], _mm256_mul_ps(a, b1));
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        _mm256_maskstore_ps(C + (long)r * ldc, m0, acc[r][0]);
        _mm256_maskstore_ps(C + (long)r * ldc + 8, m1, acc[r][1]);
    }
}

static O256 __m256i mask8(int n) { /* lanes < n set */
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static O256 void gemm_acc256(float *C, long ldc, const float *A, long lda, const float *B, long ldb, int M,
                             int N, int K, int neg) {
    for (int n0 = 0; n0 < N; n0 += 16) {
        int rem = N - n0;
        __m256i m0 = mask8(rem), m1 = mask8(rem - 8);
        for (int r0 = 0; r0 < M; r0 += GEMM256_R) {
            float *c = C + (long)r0 * ldc + n0;
            const float *a = A + (long)r0 * lda, *b = B + n0;
            switch (M - r0 < GEMM256_R ? M - r0 : GEMM256_R) {
            case 6:
                gemm256_blk(6, c, ldc, a, lda, b, ldb, K, neg, m0, m1);
                break;
            case 5:
                gemm256_blk(5, c, ldc, a, lda, b, ldb, K, neg, m0, m1);
                break;
            case 4:
                gemm256_blk(4, c, ldc, a, lda, b, ldb, K, neg, m0, m1);
                break;
            case 3:
                gemm256_blk(3, c, ldc, a, lda, b, ldb, K, neg, m0, m1);
                break;
            case 2:
                gemm256_blk(2, c, ldc, a, lda, b, ldb, K, neg, m0, m1);
                break;
            default:
                gemm256_blk(1, c, ldc, a, lda, b, ldb, K, neg, m0, m1);
                break;
            }
        }
    }
}

#define LEVEL() cpu_simd_level()
#else
#define LEVEL() CPU_SIMD_SCALAR
#endif /* __x86_64__ */

/* ---------------------------------------------------------------- dispatch */

#if defined(__x86_64__)
#define DISPATCH(c_call, v512_call, v256_call)                                                               \
    do {                                                                                                     \
        int lv_ = LEVEL();                                                                                   \
        if (lv_ == CPU_SIMD_AVX512)                                                                          \
            v512_call;                                                                                       \
        else if (lv_ == CPU_SIMD_AVX2)                                                                       \
            v256_call;                                                                                       \
        else                                                                                                 \
            c_call;                                                                                          \
    } while (0)
#else
#define DISPATCH(c_call, v512_call, v256_call) c_call
#endif

float ops_dot(const float *a, const float *b, int n) {
    float r;
    DISPATCH(r = dot_c(a, b, n), r = dot512(a, b, n), r = dot256(a, b, n));
    return r;
}

void ops_axpy(float *y, float s, const float *x, int n) {
    DISPATCH(axpy_c(y, s, x, n), axpy512(y, s, x, n), axpy256(y, s, x, n));
}

void ops_scale(float *y, float s, int n) {
    DISPATCH(scale_c(y, s, n), scale512(y, s, n), scale256(y, s, n));
}

void ops_add(float *y, const float *x, int n) {
    DISPATCH(add_c(y, x, n), add512(y, x, n), add256(y, x, n));
}

void ops_gemm_acc(float *C, long ldc, const float *A, long lda, const float *B, long ldb, int M, int N, int K,
                  int neg) {
    if (M <= 0 || N <= 0 || K <= 0) return;
    DISPATCH(gemm_acc_c(C, ldc, A, lda, B, ldb, M, N, K, neg),
             gemm_acc512(C, ldc, A, lda, B, ldb, M, N, K, neg),
             gemm_acc256(C, ldc, A, lda, B, ldb, M, N, K, neg));
}

static void scale_mul(float *y, const float *x, float r, const float *w, int n) {
    DISPATCH(scale_mul_c(y, x, r, w, n), scale_mul512(y, x, r, w, n), scale_mul256(y, x, r, w, n));
}

void ops_rmsnorm(float *y, const float *x, const float *w, int n, float eps) {
    float ss = ops_dot(x, x, n);
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    scale_mul(y, x, r, w, n);
}

void ops_l2norm(float *y, const float *x, int n, float eps) {
    float ss = ops_dot(x, x, n);
    float r = 1.0f / sqrtf(ss + eps);
    scale_mul(y, x, r, NULL, n);
}

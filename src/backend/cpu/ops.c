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
        _mm512_storeu_ps(y + i, _mm512_add_ps(_mm512_loadu_ps(y + i), _mm512_mul_ps(sv, _mm512_loadu_ps(x + i))));
    if (i < n) {
        __mmask16 m = tail16(n - i);
        __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + i), _mm512_mul_ps(sv, _mm512_maskz_loadu_ps(m, x + i)));
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
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_add_ps(_mm512_loadu_ps(y + i), _mm512_loadu_ps(x + i)));
    if (i < n) {
        __mmask16 m = tail16(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + i), _mm512_maskz_loadu_ps(m, x + i)));
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
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_mul_ps(sv, _mm256_loadu_ps(x + i))));
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
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
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

#define LEVEL() cpu_simd_level()
#else
#define LEVEL() CPU_SIMD_SCALAR
#endif /* __x86_64__ */

/* ---------------------------------------------------------------- dispatch */

#if defined(__x86_64__)
#define DISPATCH(c_call, v512_call, v256_call)                                                                \
    do {                                                                                                      \
        int lv_ = LEVEL();                                                                                    \
        if (lv_ == CPU_SIMD_AVX512) v512_call;                                                                \
        else if (lv_ == CPU_SIMD_AVX2) v256_call;                                                             \
        else c_call;                                                                                          \
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

/* matmul.c — y = x · Wᵀ on the CPU: the reduction-order contract, the run-time ISA choice, the thread
 * split over output features, and the AVX-512 / AVX2 / portable kernels that all honour the same order.
 *
 * The order (every path, every shape): output (m, n) owns 16 f32 lanes, all starting at +0. Lane l
 * accumulates fma(x[k], w[k], lane) for k = l, l+16, l+32, ... in increasing k; the last partial block of
 * 16 is padded with x = w = 0 (so it still performs fma(0, 0, lane), exactly like a masked vector load
 * does). The 16 lanes are then folded by one fixed tree: s8[i] = a[i] + a[i+8], s4[i] = s8[i] + s8[i+4],
 * s2[i] = s4[i] + s4[i+2], y = s2[0] + s2[1]. Only K shapes this order, so a row's bits do not depend on M,
 * N, the other rows, the thread count, the blocking or the ISA (IEEE fma and add are exact-rounded and
 * commutative, so a 16-lane zmm, two 8-lane ymm halves and a scalar fmaf loop give the same bits). */
#include "backend/cpu/matmul.h"

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cinfer.h"
#include "util/bf16.h"
#include "util/err.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

enum { ISA_NONE = 0, ISA_SCALAR = 1, ISA_AVX2 = 2, ISA_AVX512 = 3 };

#define MK_MAXR 8 /* most rows of x one kernel call handles */
#define MK_MAXC 8 /* most columns of W one kernel call handles */

/* The converted panel: 512 KiB of f32, half a Zen 4/5 core's L2, leaving room for the rows of x streaming
 * past it (measured on Zen 5: 256 KiB is ~3% slower at M=512, K=1024; 128 KiB ~7%). Thread-local, so
 * concurrent callers with their own pools never share it, and fixed, so nothing is allocated on the
 * decode/prefill path. */
#define PANEL_FLOATS (128 * 1024)
static _Thread_local float tl_panel[PANEL_FLOATS] __attribute__((aligned(64)));

/* K longer than this is cut into slices of it for the blocked kernels (a multiple of 16: see mk512), so
 * that a block of rows of x (8 x 1024 f32 = 32 KiB) stays in L1 beside the columns of W it meets. A panel
 * then holds at most SLICE_MAX_COLS columns, whose carried accumulators (tl_acc) stay near L1 too.
 * Measured on Zen 5 (noisy shared host): K = 3584 ~5-10% faster sliced; slices of 512 cost K = 1024 ~5%. */
#define K_SLICE 1024
_Static_assert(K_SLICE % 16 == 0, "a slice must end on a 16-lane block boundary");
#define SLICE_MAX_COLS 96
static _Thread_local float tl_acc[SLICE_MAX_COLS * MK_MAXR * 16] __attribute__((aligned(64)));

/* A kernel computes y[r*ldy + c] for r < rv, c < cv (rv <= its R, cv <= its C) over the full K. Rows of x
 * are ldx floats apart, columns of W ldw elements of W's type apart. Rows and columns past rv/cv are
 * clamped to the last valid one (computed, not stored), so one kernel serves ragged edges. */
typedef void (*mk_fn)(const float *x, long ldx, int rv, const void *w, long ldw, int cv, int K, float *y,
                      long ldy);
/* The same over a slice of K, with the accumulators carried in accb between slices (see mk512). */
typedef void (*mks_fn)(const float *x, long ldx, int rv, const void *w, long ldw, int cv, int K, float *y,
                       long ldy, float *accb, int first, int last);
/* Converts K elements of one column of W to f32 at dst and zero-fills dst up to Kp (a multiple of 16). */
typedef void (*cvt_fn)(float *dst, const void *src, wtype wt, int K, int Kp);

#define DEC_MAXR 8 /* most rows of x a decode kernel handles: at or below it, one call covers all rows */

typedef struct {
    const char *name;
    int R, C;                   /* blocked kernels: rows and columns per call */
    mk_fn blk[3][MK_MAXR + 1];  /* [weight type][rows in this call]; blk[WT_F32] also runs on the panel */
    int dec_max;                /* M up to this takes the decode kernels */
    int dec_c[DEC_MAXR + 1];    /* columns per decode call for exactly r rows (as many as registers allow) */
    mk_fn dec[3][DEC_MAXR + 1]; /* [weight type][r]: exactly r rows, dec_c[r] columns, prefetching W */
    mks_fn slc[MK_MAXR + 1];    /* [rows]: blk[WT_F32] over a slice of K (NULL: no K slicing) */
    cvt_fn cvt;
} mm_kernels;

static size_t wt_size(wtype wt) {
    return wt == WT_F32 ? 4 : 2;
}

/* ---------------------------------------------------------------- portable C */

static inline float load_w_scalar(const void *w, long k, wtype wt) {
    if (wt == WT_F32) return ((const float *)w)[k];
    if (wt == WT_BF16) return bf16_to_f32(((const uint16_t *)w)[k]);
    return f16_to_f32(((const uint16_t *)w)[k]);
}

/* The contract, written out: 16 lanes, fmaf (one rounding, as the vector FMA), zero-padded last block,
 * the fixed folding tree. */
static float dot_scalar(const float *x, const void *w, wtype wt, int K) {
    float a[16] = {0};
    for (int kb = 0; kb < K; kb += 16)
        for (int l = 0; l < 16; l++) {
            int k = kb + l;
            float xv = k < K ? x[k] : 0.0f, wv = k < K ? load_w_scalar(w, k, wt) : 0.0f;
            a[l] = fmaf(xv, wv, a[l]);
        }
    for (int i = 0; i < 8; i++) a[i] = a[i] + a[i + 8];
    for (int i = 0; i < 4; i++) a[i] = a[i] + a[i + 4];
    for (int i = 0; i < 2; i++) a[i] = a[i] + a[i + 2];
    return a[0] + a[1];
}

static void mk_scalar(const float *x, long ldx, int rv, const void *w, long ldw, int cv, int K, float *y,
                      long ldy, wtype wt) {
    size_t es = wt_size(wt);
    for (int r = 0; r < rv; r++)
        for (int c = 0; c < cv; c++)
            y[(long)r * ldy + c] =
                dot_scalar(x + (long)r * ldx, (const char *)w + (size_t)c * (size_t)ldw * es, wt, K);
}

static void mk_scalar_f32(const float *x, long ldx, int rv, const void *w, long ldw, int cv, int K, float *y,
                          long ldy) {
    mk_scalar(x, ldx, rv, w, ldw, cv, K, y, ldy, WT_F32);
}
static void mk_scalar_bf16(const float *x, long ldx, int rv, const void *w, long ldw, int cv, int K, float *y,
                           long ldy) {
    mk_scalar(x, ldx, rv, w, ldw, cv, K, y, ldy, WT_BF16);
}
static void mk_scalar_f16(const float *x, long ldx, int rv, const void *w, long ldw, int cv, int K, float *y,
                          long ldy) {
    mk_scalar(x, ldx, rv, w, ldw, cv, K, y, ldy, WT_F16);
}

static void cvt_scalar(float *dst, const void *src, wtype wt, int K, int Kp) {
    for (int k = 0; k < K; k++) dst[k] = load_w_scalar(src, k, wt);
    for (int k = K; k < Kp; k++) dst[k] = 0.0f;
}

static const mm_kernels kern_scalar = {
    .name = "scalar",
    .R = 1,
    .C = 4,
    .blk = {{NULL, mk_scalar_f32}, {NULL, mk_scalar_bf16}, {NULL, mk_scalar_f16}},
    .dec_max = 1,
    .dec_c = {0, 4},
    .dec = {{NULL, mk_scalar_f32}, {NULL, mk_scalar_bf16}, {NULL, mk_scalar_f16}},
    .cvt = cvt_scalar,
};

#if defined(__x86_64__)

/* ---------------------------------------------------------------- AVX-512 (F, BW, VL) + FMA + F16C */

#define A512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx2")))
#define AINL __attribute__((always_inline)) inline

static A512 AINL __m512 ld512(const void *p, long i, int wt) {
    if (wt == WT_F32) return _mm512_loadu_ps((const float *)p + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
    if (wt == WT_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

/* Masked-off lanes read as 0 and never touch memory: the zero padding of the contract. */
static A512 AINL __m512 ld512_mask(const void *p, long i, int wt, __mmask16 m) {
    if (wt == WT_F32) return _mm512_maskz_loadu_ps(m, (const float *)p + i);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i);
    if (wt == WT_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

/* The contract's folding tree: halves (i, i+8), then (i, i+4), (i, i+2), (0, 1). */
static A512 AINL float hsum512(__m512 v) {
    __m256 lo = _mm512_castps512_ps256(v);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    __m256 s8 = _mm256_add_ps(lo, hi);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
    return _mm_cvtss_f32(s1);
}

/* The contract's tree for 16 (fold16) or 8 (fold8) accumulators at once, transposing as it goes, so each
 * add instruction does one tree level for several outputs (about a third of the instructions of hsum512
 * per output; at K = 1024 the per-output folds were ~7% of a prefill kernel's time). Level by level:
 * L1 pairs 256-bit halves (i, i+8), L2 128-bit quarters (i, i+4), L3 64-bit pairs (i, i+2), L4 (0, 1).
 * After L4, output 4e + j sits at position 4j + e: one permute puts it back in order. */
static A512 AINL void fold_l1(const __m512 *v, __m512 *t8, int pairs) {
    for (int p = 0; p < pairs; p++)
        t8[p] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0x44),
                              _mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0xEE));
}
static A512 AINL void fold_l2(const __m512 *t8, __m512 *t4, int quads) {
    for (int q = 0; q < quads; q++) /* lane j of t4[q]: s4 of v[4q + j] */
        t4[q] = _mm512_add_ps(_mm512_shuffle_f32x4(t8[2 * q], t8[2 * q + 1], 0x88),
                              _mm512_shuffle_f32x4(t8[2 * q], t8[2 * q + 1], 0xDD));
}
static A512 AINL __m512 fold_l3(__m512 a, __m512 b) { /* lane j: s2 of a's j-th, then of b's j-th */
    return _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
}
static A512 AINL __m512 fold_l4(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
}
static A512 AINL __m512i fold_order(void) { /* out[p] = t1[4 * (p % 4) + p / 4] */
    return _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
}
static A512 AINL void fold16(const __m512 *v, float *out) {
    __m512 t8[8], t4[4];
    fold_l1(v, t8, 8);
    fold_l2(t8, t4, 4);
    __m512 t1 = fold_l4(fold_l3(t4[0], t4[1]), fold_l3(t4[2], t4[3]));
    _mm512_storeu_ps(out, _mm512_permutexvar_ps(fold_order(), t1));
}
static A512 AINL void fold8(const __m512 *v, float *out) {
    __m512 t8[4], t4[2];
    fold_l1(v, t8, 4);
    fold_l2(t8, t4, 2);
    __m512 t2 = fold_l3(t4[0], t4[1]);
    __m512 t1 = fold_l4(t2, t2);
    _mm256_storeu_ps(out, _mm512_castps512_ps256(_mm512_permutexvar_ps(fold_order(), t1)));
}

/* PF: prefetch each column's own row pf_ahead(R, C) bytes ahead of the read, and past the row's end the same
 * offset in the next group's row c (C*ldw elements on: the decode path walks W linearly, and short 2-7 KiB
 * rows give the hardware prefetcher little to lock onto). About PF_AHEAD bytes of W are then in flight per
 * thread whatever K is. The first scheme, the same position of the next group, put C rows ahead = 16 KiB
 * at K = 1024 but 56-96 KiB at K = 3584-6144, more than L1 (48 KiB): the prefetched lines pushed out x and
 * each other. Measured on Zen 5, one thread, W in L2 (in-cache GFLOP/s): K = 2048 M=1 81 -> 108, M=2 123 ->
 * 176, M=3 159 -> 209; K = 6144 M=1 77 -> 106, M=2 122 -> 164; K = 1024 and M=8 about unchanged. (Cutting
 * K into L1-sized slices for M=8, to keep x in L1, was tried and gained nothing.) */
#define PF_AHEAD 8192
static inline size_t pf_ahead(int R, int C) {
    /* Five to eight rows (3-4 columns per call, K <= 1024 since longer K splits them into 4-row passes)
     * stream more slowly per byte and gain from 4x the distance: M=8 at 6144x1024, 2 threads, alternating in
     * one process: 37.6 -> 41.2 GB/s (and 38.5 -> 41.6 in another run). For 1-4 rows, 8 KiB was best (M=1
     * 60.8 vs 56.2 GB/s at 32 KiB; M=4 57.7 vs 54.8; 4-row passes at K=2048 34.7 vs 30.9). */
    return (size_t)((R > 4 ? 4 : 1) * PF_AHEAD / C) & ~(size_t)63;
}
/* accb/first/last: a slice of a longer K. The 16 lanes of every accumulator start from accb (unless first)
 * and go back to it unfolded (unless last); saving and reloading a lane is exact, so a K split into slices
 * that are multiples of 16 keeps the contract's order bit for bit. accb: [R*C][16] f32. */
static A512 AINL void mk512(const int R, const int C, const int wt, const int PF, const float *x, long ldx,
                            int rv, const void *w, long ldw, int cv, int K, float *y, long ldy, float *accb,
                            int first, int last) {
    const float *xp[MK_MAXR];
    const void *wp[MK_MAXC];
    size_t es = wt_size((wtype)wt);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) xp[r] = x + (long)(r < rv ? r : rv - 1) * ldx;
#pragma GCC unroll 8
    for (int c = 0; c < C; c++) wp[c] = (const char *)w + (size_t)(c < cv ? c : cv - 1) * (size_t)ldw * es;
    __m512 acc[MK_MAXR][MK_MAXC];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++)
            acc[r][c] = first ? _mm512_setzero_ps() : _mm512_load_ps(accb + (r * C + c) * 16);
    const size_t rowb = (size_t)ldw * es, pfd = (size_t)C * rowb, ahead = pf_ahead(R, C);
    long k = 0;
    for (; k + 16 <= K; k += 16) {
        __m512 wv[MK_MAXC];
        if (PF) {
            size_t off = (size_t)k * es + ahead;
            if (off >= rowb) off += pfd - rowb;
#pragma GCC unroll 8
            for (int c = 0; c < C; c++) _mm_prefetch((const char *)wp[c] + off, _MM_HINT_T0);
        }
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) wv[c] = ld512(wp[c], k, wt);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 xv = _mm512_loadu_ps(xp[r] + k);
            /* Keep x in a register: left alone, GCC folds the load into each of the C FMAs, and C loads
             * per row bind the decode kernels on the load ports instead of the FMA pipes. */
            __asm__("" : "+v"(xv));
#pragma GCC unroll 8
            for (int c = 0; c < C; c++) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
        }
    }
    if (k < K) {
        __mmask16 m = (__mmask16)((1u << (K - k)) - 1u);
        __m512 wv[MK_MAXC];
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) wv[c] = ld512_mask(wp[c], k, wt, m);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 xv = _mm512_maskz_loadu_ps(m, xp[r] + k);
#pragma GCC unroll 8
            for (int c = 0; c < C; c++) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
        }
    }
    if (!last) {
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
#pragma GCC unroll 8
            for (int c = 0; c < C; c++) _mm512_store_ps(accb + (r * C + c) * 16, acc[r][c]);
        return;
    }
    __m512 flat[MK_MAXR * MK_MAXC];
    float out[MK_MAXR * MK_MAXC];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) flat[r * C + c] = acc[r][c];
    int i = 0;
#pragma GCC unroll 4
    for (; i + 16 <= R * C; i += 16) fold16(flat + i, out + i);
#pragma GCC unroll 4
    for (; i + 8 <= R * C; i += 8) fold8(flat + i, out + i);
#pragma GCC unroll 8
    for (; i < R * C; i++) out[i] = hsum512(flat[i]);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++)
            if (r < rv && c < cv) y[(long)r * ldy + c] = out[r * C + c];
}

/* Blocked (prefill) kernels: 8 rows x 3 columns. Per step of 16 k: 8 loads of x (the row block stays in
 * L1), 3 of W (the panel, from L2), 24 FMAs. Measured on Zen 5 at M=512, K=1024: 8x3 and 6x4 both ~81% of
 * one core's FMA peak, 4x6 ~75% (more W traffic from L2), 3x8 ~57%. No software prefetch here: it cost
 * ~10%, the panel is already in L2. */
#define K512_R 8
#define K512_C 3
#define DEF512(WT, WN, R)                                                                                    \
    static A512 void k512_##WN##_##R(const float *x, long ldx, int rv, const void *w, long ldw, int cv,      \
                                     int K, float *y, long ldy) {                                            \
        mk512(R, K512_C, WT, 0, x, ldx, rv, w, ldw, cv, K, y, ldy, NULL, 1, 1);                              \
    }
#define DEF512_ALL(WT, WN)                                                                                   \
    DEF512(WT, WN, 1)                                                                                        \
    DEF512(WT, WN, 2)                                                                                        \
    DEF512(WT, WN, 3)                                                                                        \
    DEF512(WT, WN, 4) DEF512(WT, WN, 5) DEF512(WT, WN, 6) DEF512(WT, WN, 7) DEF512(WT, WN, 8)
DEF512_ALL(WT_F32, f32)
DEF512_ALL(WT_BF16, bf16)
DEF512_ALL(WT_F16, f16)
#define K512_ROW(WN)                                                                                         \
    {                                                                                                        \
        NULL, k512_##WN##_1, k512_##WN##_2, k512_##WN##_3, k512_##WN##_4, k512_##WN##_5, k512_##WN##_6,      \
            k512_##WN##_7, k512_##WN##_8                                                                     \
    }

/* K-sliced blocked kernels on f32 (the panel), for K longer than K_SLICE. */
#define DEFS512(R)                                                                                           \
    static A512 void s512_##R(const float *x, long ldx, int rv, const void *w, long ldw, int cv, int K,      \
                              float *y, long ldy, float *accb, int first, int last) {                        \
        mk512(R, K512_C, WT_F32, 0, x, ldx, rv, w, ldw, cv, K, y, ldy, accb, first, last);                   \
    }
DEFS512(1)
DEFS512(2)
DEFS512(3)
DEFS512(4) DEFS512(5) DEFS512(6) DEFS512(7) DEFS512(8)

/* Decode kernels: r rows x D512_C(r) columns, at most 24 accumulators + the columns + one x in 32 zmm. */
#define D512_C(R) ((R) <= 2 ? 8 : (R) <= 4 ? 6 : (R) <= 6 ? 4 : 3)
#define DEFD512(WT, WN, R)                                                                                   \
    static A512 void d512_##WN##_##R(const float *x, long ldx, int rv, const void *w, long ldw, int cv,      \
                                     int K, float *y, long ldy) {                                            \
        mk512(R, D512_C(R), WT, 1, x, ldx, rv, w, ldw, cv, K, y, ldy, NULL, 1, 1);                           \
    }
#define DEFD512_ALL(WT, WN)                                                                                  \
    DEFD512(WT, WN, 1)                                                                                       \
    DEFD512(WT, WN, 2)                                                                                       \
    DEFD512(WT, WN, 3)                                                                                       \
    DEFD512(WT, WN, 4) DEFD512(WT, WN, 5) DEFD512(WT, WN, 6) DEFD512(WT, WN, 7) DEFD512(WT, WN, 8)
    DEFD512_ALL(WT_F32, f32) DEFD512_ALL(WT_BF16, bf16) DEFD512_ALL(WT_F16, f16)
#define D512_ROW(WN)                                                                                         \
    {                                                                                                        \
        NULL, d512_##WN##_1, d512_##WN##_2, d512_##WN##_3, d512_##WN##_4, d512_##WN##_5, d512_##WN##_6,      \
            d512_##WN##_7, d512_##WN##_8                                                                     \
    }

        static A512 void cvt512(float *dst, const void *src, wtype wt, int K, int Kp) {
    long k = 0;
    for (; k + 16 <= K; k += 16) _mm512_store_ps(dst + k, ld512(src, k, (int)wt));
    if (k < K) {
        _mm512_store_ps(dst + k, ld512_mask(src, k, (int)wt, (__mmask16)((1u << (K - k)) - 1u)));
        k += 16;
    }
    for (; k < Kp; k += 16) _mm512_store_ps(dst + k, _mm512_setzero_ps());
}

static const mm_kernels kern_avx512 = {
    .name = "avx512",
    .R = K512_R,
    .C = K512_C,
    .blk = {K512_ROW(f32), K512_ROW(bf16), K512_ROW(f16)},
    .dec_max = 8,
    .dec_c = {0, D512_C(1), D512_C(2), D512_C(3), D512_C(4), D512_C(5), D512_C(6), D512_C(7), D512_C(8)},
    .dec = {D512_ROW(f32), D512_ROW(bf16), D512_ROW(f16)},
    .slc = {NULL, s512_1, s512_2, s512_3, s512_4, s512_5, s512_6, s512_7, s512_8},
    .cvt = cvt512,
};

/* ---------------------------------------------------------------- AVX2 + FMA + F16C */

#define A256 __attribute__((target("avx2,fma,f16c")))

static A256 AINL __m256 ld256(const void *p, long i, int wt) {
    if (wt == WT_F32) return _mm256_loadu_ps((const float *)p + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
    if (wt == WT_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

/* The same tree as hsum512, entered with lanes 0-7 in lo and 8-15 in hi. */
static A256 AINL float hsum256x2(__m256 lo, __m256 hi) {
    __m256 s8 = _mm256_add_ps(lo, hi);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
    return _mm_cvtss_f32(s1);
}

static A256 AINL void mk256(const int R, const int C, const int wt, const int PF, const float *x, long ldx,
                            int rv, const void *w, long ldw, int cv, int K, float *y, long ldy) {
    const float *xp[MK_MAXR];
    const void *wp[MK_MAXC];
    size_t es = wt_size((wtype)wt);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) xp[r] = x + (long)(r < rv ? r : rv - 1) * ldx;
#pragma GCC unroll 8
    for (int c = 0; c < C; c++) wp[c] = (const char *)w + (size_t)(c < cv ? c : cv - 1) * (size_t)ldw * es;
    __m256 acc[MK_MAXR][MK_MAXC][2];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) acc[r][c][0] = acc[r][c][1] = _mm256_setzero_ps();
    const size_t rowb = (size_t)ldw * es, pfd = (size_t)C * rowb, ahead = pf_ahead(R, C); /* as in mk512 */
    long k = 0;
    for (; k + 16 <= K; k += 16) {
        if (PF) {
            size_t off = (size_t)k * es + ahead;
            if (off >= rowb) off += pfd - rowb;
#pragma GCC unroll 8
            for (int c = 0; c < C; c++) _mm_prefetch((const char *)wp[c] + off, _MM_HINT_T0);
        }
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256 wv[MK_MAXC];
#pragma GCC unroll 8
            for (int c = 0; c < C; c++) wv[c] = ld256(wp[c], k + 8 * h, wt);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                __m256 xv = _mm256_loadu_ps(xp[r] + k + 8 * h);
                __asm__("" : "+x"(xv)); /* as in mk512 */
#pragma GCC unroll 8
                for (int c = 0; c < C; c++) acc[r][c][h] = _mm256_fmadd_ps(xv, wv[c], acc[r][c][h]);
            }
        }
    }
    if (k < K) {
        /* AVX2 has no 16-bit masked load: copy the tail, zero-padded, and convert it exactly. */
        float xt[MK_MAXR][16], wtl[MK_MAXC][16];
        int rem = (int)(K - k);
        for (int r = 0; r < R; r++)
            for (int l = 0; l < 16; l++) xt[r][l] = l < rem ? xp[r][k + l] : 0.0f;
        for (int c = 0; c < C; c++)
            for (int l = 0; l < 16; l++) wtl[c][l] = l < rem ? load_w_scalar(wp[c], k + l, (wtype)wt) : 0.0f;
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++)
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                __m256 xv = _mm256_loadu_ps(xt[r] + 8 * h);
#pragma GCC unroll 8
                for (int c = 0; c < C; c++)
                    acc[r][c][h] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(wtl[c] + 8 * h), acc[r][c][h]);
            }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++)
            if (r < rv && c < cv) y[(long)r * ldy + c] = hsum256x2(acc[r][c][0], acc[r][c][1]);
}

/* 16 ymm: blocked 2 rows x 3 columns (12 accumulators, each output owning two 8-lane halves); decode 1 x 4
 * and 2 x 3, prefetching the next group of W. */
#define K256_C 3
#define DEF256(WT, WN, R)                                                                                    \
    static A256 void k256_##WN##_##R(const float *x, long ldx, int rv, const void *w, long ldw, int cv,      \
                                     int K, float *y, long ldy) {                                            \
        mk256(R, K256_C, WT, 0, x, ldx, rv, w, ldw, cv, K, y, ldy);                                          \
    }                                                                                                        \
    static A256 void d256_##WN##_##R(const float *x, long ldx, int rv, const void *w, long ldw, int cv,      \
                                     int K, float *y, long ldy) {                                            \
        mk256(R, R == 1 ? 4 : 3, WT, 1, x, ldx, rv, w, ldw, cv, K, y, ldy);                                  \
    }
#define DEF256_ALL(WT, WN) DEF256(WT, WN, 1) DEF256(WT, WN, 2)
DEF256_ALL(WT_F32, f32)
DEF256_ALL(WT_BF16, bf16)
DEF256_ALL(WT_F16, f16)

static A256 void cvt256(float *dst, const void *src, wtype wt, int K, int Kp) {
    long k = 0;
    for (; k + 8 <= K; k += 8) _mm256_store_ps(dst + k, ld256(src, k, (int)wt));
    for (; k < K; k++) dst[k] = load_w_scalar(src, k, wt);
    for (; k < Kp; k++) dst[k] = 0.0f;
}

static const mm_kernels kern_avx2 = {
    .name = "avx2",
    .R = 2,
    .C = K256_C,
    .blk = {{NULL, k256_f32_1, k256_f32_2}, {NULL, k256_bf16_1, k256_bf16_2}, {NULL, k256_f16_1, k256_f16_2}},
    .dec_max = 2,
    .dec_c = {0, 4, 3},
    .dec = {{NULL, d256_f32_1, d256_f32_2}, {NULL, d256_bf16_1, d256_bf16_2}, {NULL, d256_f16_1, d256_f16_2}},
    .cvt = cvt256,
};

#endif /* __x86_64__ */

/* ---------------------------------------------------------------- dispatch */

static atomic_int g_isa;      /* ISA_NONE until first use; then the family in force */
atomic_int cpu_simd_cur = -1; /* g_isa as a CPU_SIMD_* level, for cpu_simd_level's inline read */

static int level_of(int isa) {
    return isa == ISA_AVX512 ? CPU_SIMD_AVX512 : isa == ISA_AVX2 ? CPU_SIMD_AVX2 : CPU_SIMD_SCALAR;
}

static void isa_set(int isa) {
    atomic_store(&g_isa, isa);
    atomic_store(&cpu_simd_cur, level_of(isa));
}

static int isa_best(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    /* clang 14's __builtin_cpu_supports does not know "f16c": read CPUID leaf 1, ECX bit 29. */
    unsigned a, b, c, d;
    int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || !f16c) return ISA_SCALAR;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return ISA_AVX512;
    return ISA_AVX2;
#else
    return ISA_SCALAR;
#endif
}

static int isa_from_name(const char *s) {
    if (!strcmp(s, "scalar")) return ISA_SCALAR;
    if (!strcmp(s, "avx2")) return ISA_AVX2;
    if (!strcmp(s, "avx512")) return ISA_AVX512;
    return ISA_NONE;
}

static int isa_detect(void) {
    int best = isa_best();
    const char *cap = getenv("CINFER_SIMD");
    if (cap && *cap) {
        int c = isa_from_name(cap);
        if (c != ISA_NONE && c < best) best = c; /* an unknown value leaves the machine's best */
    }
    return best;
}

static int isa_current(void) {
    int isa = atomic_load_explicit(&g_isa, memory_order_relaxed);
    if (isa == ISA_NONE) {
        /* Racing first calls compute the same value; whichever store lands is the same choice. */
        isa = isa_detect();
        isa_set(isa);
    }
    return isa;
}

static const mm_kernels *kernels_for(int isa) {
#if defined(__x86_64__)
    if (isa == ISA_AVX512) return &kern_avx512;
    if (isa == ISA_AVX2) return &kern_avx2;
#endif
    (void)isa;
    return &kern_scalar;
}

int cpu_simd_level_first(void) {
    return level_of(isa_current());
}

const char *cpu_matmul_isa(void) {
    return kernels_for(isa_current())->name;
}

int cpu_matmul_isa_force(const char *isa) {
    if (!isa) {
        isa_set(isa_detect());
        return 0;
    }
    int want = isa_from_name(isa);
    if (want == ISA_NONE) return CINFER_EINVAL;
    if (want > isa_best()) return CINFER_EUNSUPPORTED;
    isa_set(want);
    return 0;
}

/* ---------------------------------------------------------------- threading */

enum { PATH_DEC, PATH_BLK, PATH_PANEL };

/* One thread's share of the columns: [next, end), claimed a work item at a time from the front. A line of
 * its own, since its owner bumps it while others may be reading theirs. */
typedef struct {
    atomic_long next;
    long end;
    char pad[64 - sizeof(atomic_long) - sizeof(long)];
} mm_range;
#define MM_MAX_RANGES 64

typedef struct {
    float *y;       /* [M, N] f32 */
    const float *x; /* [M, K] f32 */
    const void *w;  /* [N, K] of type wt */
    wtype wt;
    int M, N, K;
    const mm_kernels *kt;
    int path;
    long chunk; /* columns per work item; a multiple of the path's column group */
    int nranges;
    mm_range rg[MM_MAX_RANGES];
} mm_job;

/* Columns [n0, n1) for every row, on the decode path: all rows of x in one kernel call, so each group of
 * columns of W is read from memory once, in its own type, and each converted vector serves every row
 * while it sits in a register. */
/* Eight rows whose x outgrows 32 KiB (K >= 2048: every matrix of the 2B shape) go as two passes of four rows
 * over the item's columns: the second pass reads W from L2 (an item is ~128 KiB), and
 * each pass's x stays nearer L1. Measured (Zen 5, 2 threads, W from DRAM, alternating in one process):
 * M=8 at 6144x2048 32.7 -> 34.7 GB/s, 2048x2048 33.4 -> 37.2, 2048x6144 34.9 -> 36.1; K = 1024 unsplit. */
#define DEC_SPLIT 4
static void run_dec(const mm_job *j, long n0, long n1) {
    const int K = j->K;
    const size_t es = wt_size(j->wt);
    /* Only an even split pays: 4 + 2 for M=6 was slower in-cache (208 -> 178 GFLOP/s at K = 2048). */
    const int split = j->M == 2 * DEC_SPLIT && (long)j->M * K * 4 > 32 * 1024 ? DEC_SPLIT : j->M;
    for (int m0 = 0; m0 < j->M; m0 += split) {
        const int rows = j->M - m0 < split ? j->M - m0 : split;
        const mk_fn k = j->kt->dec[j->wt][rows];
        const int C = j->kt->dec_c[rows];
        for (long n = n0; n < n1; n += C) {
            int cv = (int)(n1 - n < C ? n1 - n : C);
            k(j->x + (long)m0 * K, K, rows, (const char *)j->w + (size_t)n * (size_t)K * es, K, cv, K,
              j->y + (long)m0 * j->N + n, j->N);
        }
    }
}

/* K too long for the panel: groups of C columns in their own type, held in L1/L2 while every row group of
 * x passes over them. */
static void run_blk(const mm_job *j, long n0, long n1) {
    const mm_kernels *kt = j->kt;
    const int R = kt->R, C = kt->C, M = j->M, N = j->N, K = j->K;
    const size_t es = wt_size(j->wt);
    for (long n = n0; n < n1; n += C) {
        int cv = (int)(n1 - n < C ? n1 - n : C);
        for (int m = 0; m < M; m += R) {
            int rv = M - m < R ? M - m : R;
            kt->blk[j->wt][rv](j->x + (long)m * K, K, rv, (const char *)j->w + (size_t)n * (size_t)K * es, K,
                               cv, K, j->y + (long)m * N + n, N);
        }
    }
}

/* Prefill: the columns [n0, n1) (one panel), converted to f32 once (f32 weights are used in place), serve
 * every row of x from L2; each row group of x (R rows, from L1) sweeps the panel's column groups. */
static void run_panel(const mm_job *j, long n0, long n1) {
    const mm_kernels *kt = j->kt;
    const int R = kt->R, C = kt->C, M = j->M, N = j->N, K = j->K;
    const long pn = n1 - n0;
    const float *panel;
    long ldp;
    if (j->wt == WT_F32) {
        panel = (const float *)j->w + (size_t)n0 * (size_t)K;
        ldp = K;
    } else {
        const size_t es = wt_size(j->wt);
        ldp = ((long)K + 15) / 16 * 16;
        for (long c = 0; c < pn; c++)
            kt->cvt(tl_panel + c * ldp, (const char *)j->w + (size_t)(n0 + c) * (size_t)K * es, j->wt, K,
                    (int)ldp);
        panel = tl_panel;
    }
    if (kt->slc[1] && K > K_SLICE) {
        /* Long K: the row block's x over K_SLICE floats (8 rows: 16 KiB) stays in L1 while it sweeps the
         * panel's column groups; each group's accumulators wait in tl_acc for the next slice. */
        for (int m = 0; m < M; m += R) {
            int rv = M - m < R ? M - m : R;
            for (long kb = 0; kb < K; kb += K_SLICE) {
                int len = (int)(K - kb < K_SLICE ? K - kb : K_SLICE);
                for (long n = 0; n < pn; n += C) {
                    int cv = (int)(pn - n < C ? pn - n : C);
                    kt->slc[rv](j->x + (long)m * K + kb, K, rv, panel + n * ldp + kb, ldp, cv, len,
                                j->y + (long)m * N + n0 + n, N, tl_acc + n / C * (R * C * 16), kb == 0,
                                kb + len >= K);
                }
            }
        }
        return;
    }
    for (int m = 0; m < M; m += R) {
        int rv = M - m < R ? M - m : R;
        for (long n = 0; n < pn; n += C) {
            int cv = (int)(pn - n < C ? pn - n : C);
            kt->blk[WT_F32][rv](j->x + (long)m * K, K, rv, panel + n * ldp, ldp, cv, K,
                                j->y + (long)m * N + n0 + n, N);
        }
    }
}

/* Each thread owns a contiguous share of the columns (so each streams one run of W, and its prefetches
 * land in its own next item), claims work items from its front, and when done claims the items left in
 * the other shares. Which thread computes a column cannot change its bits (never a slice of K: see the
 * contract above), so the stealing costs no reproducibility, and a thread descheduled for a while (shared
 * or virtualised cores) no longer holds up the whole call the way a fixed split does. Measured: a single
 * shared counter handing out interleaved items was ~13% slower at M=1, N=4096 with 2 threads. */
static void mm_thread(void *ctx, int ith, int nth) {
    mm_job *j = ctx;
    for (int i = 0; i < j->nranges; i++) {
        mm_range *rg = &j->rg[(ith + i) % j->nranges];
        for (;;) {
            long n0 = atomic_fetch_add_explicit(&rg->next, j->chunk, memory_order_relaxed);
            if (n0 >= rg->end) break;
            long n1 = n0 + j->chunk < rg->end ? n0 + j->chunk : rg->end;
            if (j->path == PATH_DEC)
                run_dec(j, n0, n1);
            else if (j->path == PATH_BLK)
                run_blk(j, n0, n1);
            else
                run_panel(j, n0, n1);
        }
    }
}

static long round_up(long v, long m) {
    return (v + m - 1) / m * m;
}

void cpu_matmul(threadpool *tp, float *y, const float *x, const void *w, wtype wt, int M, int N, int K) {
    CI_ASSERT(M >= 0 && N >= 0 && K >= 0);
    CI_ASSERT(wt == WT_F32 || wt == WT_BF16 || wt == WT_F16);
    if (M == 0 || N == 0) return;
    const mm_kernels *kt = kernels_for(isa_current());
    const long Kp = round_up(K, 16), nth = tp_size(tp);
    mm_job j = {y, x, w, wt, M, N, K, kt, PATH_PANEL, 0, 0, {{0}}};
    if (M <= kt->dec_max) {
        /* ~128 KiB of W per item, and at least 8 items per thread for balance on small matrices. */
        long c = (128L << 10) / ((long)(K > 0 ? K : 1) * (long)wt_size(wt));
        long most = (N + 8 * nth - 1) / (8 * nth);
        j.path = PATH_DEC;
        j.chunk = round_up(c < most ? c : most, kt->dec_c[M]);
    } else if (M <= DEC_MAXR || (wt != WT_F32 && kt->C * Kp > PANEL_FLOATS)) {
        /* A few rows past the decode kernels (AVX2: 3-8) convert each vector of W for too few FMAs to pay for
         * a panel; and K too long for a panel has no choice. */
        j.path = PATH_BLK;
        j.chunk = round_up((N + 8 * nth - 1) / (8 * nth), kt->C);
    } else {
        /* One panel per item: as many columns as fit the panel, fewer when that would starve threads. */
        long fit = PANEL_FLOATS / (wt == WT_F32 ? (K > 0 ? K : 1) : (Kp > 0 ? Kp : 16)) / kt->C * kt->C;
        if (kt->slc[1] && K > K_SLICE && fit > SLICE_MAX_COLS / kt->C * kt->C)
            fit = SLICE_MAX_COLS / kt->C * kt->C;
        long most = round_up((N + 2 * nth - 1) / (2 * nth), kt->C);
        j.chunk = fit < most ? fit : most;
        if (j.chunk < kt->C) j.chunk = kt->C;
    }
    /* Shares in whole work items (so every item boundary is a multiple of the path's column group). A tiny
     * product (a decode step's 16-row in_proj_a/b: 32 KiB, ~1 us) runs on the caller alone: a hand-off to
     * the pool costs about as much, and far more when a worker is descheduled. */
    long items = (N + j.chunk - 1) / j.chunk;
    int tiny = (double)N * K * wt_size(wt) <= 64 * 1024 && (double)M * N * K <= 1 << 20;
    j.nranges = tiny ? 1 : (int)(nth < MM_MAX_RANGES ? nth : MM_MAX_RANGES);
    for (int i = 0; i < j.nranges; i++) {
        long b, e;
        tp_range(items, i, j.nranges, &b, &e);
        atomic_init(&j.rg[i].next, b * j.chunk);
        j.rg[i].end = e * j.chunk < N ? e * j.chunk : N;
    }
    if (tiny)
        mm_thread(&j, 0, 1);
    else
        tp_run(tp, mm_thread, &j); /* one job per call: the split is inside mm_thread */
}

void cpu_matmul_ref(float *y, const float *x, const void *w, wtype wt, int M, int N, int K) {
    CI_ASSERT(M >= 0 && N >= 0 && K >= 0);
    const char *wb = w;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++)
            y[(long)m * N + n] = dot_scalar(x + (long)m * K, wb + (size_t)n * (size_t)K * wt_size(wt), wt, K);
}

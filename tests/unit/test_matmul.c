/* test_matmul.c — cpu_matmul against a double-precision reference for f32/bf16/f16 weights, and the
 * exactness contract: each row's bits equal the scalar reference's and do not change with M, the other
 * rows, the thread count or the ISA. Every ISA this machine supports is exercised through
 * cpu_matmul_isa_force. The small vector ops (ops.h) follow the same switch and are held to the bits of
 * their written-out order here too. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "cinfer.h"
#include "test.h"
#include "util/alloc.h"
#include "util/bf16.h"
#include "util/threadpool.h"

typedef struct {
    uint64_t s;
} rng;

static uint64_t rng_next(rng *r) {
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return r->s;
}

/* Uniform in [-1, 1). */
static float rng_unit(rng *r) {
    return (float)((double)(rng_next(r) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* Weights of type wt with finite random values of mixed magnitude (f16: exponents 2^-6 .. 2^3, some
 * subnormal-free, never inf/nan). */
static void *make_w(rng *r, wtype wt, long n) {
    if (wt == WT_F32) {
        float *w = malloc((size_t)(n ? n : 1) * 4);
        for (long i = 0; i < n; i++) w[i] = rng_unit(r) * (float)(1 + (rng_next(r) & 3));
        return w;
    }
    uint16_t *w = malloc((size_t)(n ? n : 1) * 2);
    for (long i = 0; i < n; i++) {
        if (wt == WT_BF16) {
            w[i] = f32_to_bf16(rng_unit(r) * 3.0f);
        } else {
            uint64_t b = rng_next(r);
            uint16_t sign = (uint16_t)((b & 1) << 15), exp = (uint16_t)(9 + (b >> 1) % 10),
                     man = (uint16_t)((b >> 8) & 0x3ff);
            w[i] = (uint16_t)(sign | (exp << 10) | man);
        }
    }
    return w;
}

static float *make_x(rng *r, long n) {
    float *x = malloc((size_t)(n ? n : 1) * 4);
    for (long i = 0; i < n; i++) x[i] = rng_unit(r);
    return x;
}

static double w_at(const void *w, wtype wt, long i) {
    if (wt == WT_F32) return ((const float *)w)[i];
    if (wt == WT_BF16) return bf16_to_f32(((const uint16_t *)w)[i]);
    return f16_to_f32(((const uint16_t *)w)[i]);
}

/* y (poisoned with NaN before the call, with a NaN guard after M*N that must survive) against the double
 * product: |y - ref| <= 1e-5 * Σ|x||w| for every element. Returns the number of bad elements. */
static int check_against_double(const float *y, const float *x, const void *w, wtype wt, int M, int N,
                                int K) {
    int bad = 0;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0, a = 0;
            for (int k = 0; k < K; k++) {
                double p = (double)x[(long)m * K + k] * w_at(w, wt, (long)n * K + k);
                s += p;
                a += fabs(p);
            }
            double v = y[(long)m * N + n];
            if (!(fabs(v - s) <= 1e-5 * a)) {
                if (bad < 3)
                    test_fail(__FILE__, __LINE__, "wt=%d M=%d N=%d K=%d y[%d][%d]=%.9g ref=%.9g scale=%.3g",
                              (int)wt, M, N, K, m, n, v, s, a);
                bad++;
            }
        }
    return bad;
}

static float *alloc_y(long n) {
    float *y = malloc((size_t)(n + 1) * 4);
    for (long i = 0; i <= n; i++) y[i] = NAN; /* y[n] is the guard: must stay NaN */
    return y;
}

static const wtype all_wt[3] = {WT_F32, WT_BF16, WT_F16};
static const char *all_isa[3] = {"scalar", "avx2", "avx512"};

/* (M, N, K) with edges around 1, 15/16/17, odd sizes, every decode row count, more than one panel per
 * thread (12 x 200 x 1024), K cut into slices with a ragged last one (2100, 1040; 500 columns also hit the
 * sliced panel's column cap), and a K too long for even one column group of the panel (70001: the
 * blocked path straight from W), and decode shapes with long K (rows of W longer than the prefetch distance,
 * so the prefetch wraps into the next column group mid-row). */
static const int shapes[][3] = {
    {1, 1, 1},
    {1, 1, 15},
    {1, 1, 16},
    {1, 1, 17},
    {1, 15, 16},
    {1, 16, 17},
    {1, 17, 15},
    {2, 3, 5},
    {3, 7, 31},
    {6, 9, 48},
    {4, 6, 32},
    {5, 13, 33},
    {7, 17, 100},
    {8, 19, 47},
    {9, 5, 16},
    {9, 23, 1},
    {15, 16, 17},
    {16, 15, 16},
    {17, 17, 17},
    {13, 11, 129},
    {37, 29, 65},
    {12, 200, 1024},
    {10, 130, 257},
    {1, 301, 1031},
    {9, 3, 70001},
    {10, 7, 2100},
    {9, 500, 1040},
    {0, 5, 5},
    {3, 0, 7},
    {3, 5, 0},
    /* decode rows with long K and ragged column groups */
    {8, 50, 2100},
    {3, 40, 4000},
    {5, 29, 1700},
    {1, 17, 9000},
    {2, 9, 5000},
    {7, 101, 1200},
};

static void run_shapes(threadpool *tp, const char *isa) {
    rng r = {0x9e3779b97f4a7c15ull};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
        for (int t = 0; t < 3; t++) {
            wtype wt = all_wt[t];
            float *x = make_x(&r, (long)M * K);
            void *w = make_w(&r, wt, (long)N * K);
            float *y = alloc_y((long)M * N), *yr = alloc_y((long)M * N);
            cpu_matmul(tp, y, x, w, wt, M, N, K);
            cpu_matmul_ref(yr, x, w, wt, M, N, K);
            CHECK_MSG(isnan(y[(long)M * N]), "%s: wrote past y (M=%d N=%d K=%d)", isa, M, N, K);
            CHECK_EQ_INT(check_against_double(y, x, w, wt, M, N, K), 0);
            CHECK_MSG(!memcmp(y, yr, (size_t)M * N * 4),
                      "%s wt=%d M=%d N=%d K=%d: bits differ from cpu_matmul_ref", isa, (int)wt, M, N, K);
            free(x);
            free(w);
            free(y);
            free(yr);
        }
    }
}

TEST(matmul_isa_names_and_force) {
    const char *cur = cpu_matmul_isa();
    CHECK(!strcmp(cur, "scalar") || !strcmp(cur, "avx2") || !strcmp(cur, "avx512") ||
          !strcmp(cur, "avx512bf16"));
    CHECK_EQ_INT(cpu_matmul_isa_force("sse9"), CINFER_EINVAL);
    CHECK_EQ_INT(cpu_matmul_isa_force("scalar"), 0);
    CHECK(!strcmp(cpu_matmul_isa(), "scalar"));
    CHECK_EQ_INT(cpu_matmul_isa_force(NULL), 0);
    CHECK(!strcmp(cpu_matmul_isa(), cur));
}

TEST(matmul_matches_double_and_ref_every_isa) {
    threadpool *tp = tp_create(2);
    int ran = 0;
    for (int i = 0; i < 3; i++) {
        if (cpu_matmul_isa_force(all_isa[i]) != 0) continue; /* this CPU lacks it */
        CHECK(!strcmp(cpu_matmul_isa(), all_isa[i]));
        run_shapes(tp, all_isa[i]);
        ran++;
    }
    cpu_matmul_isa_force(NULL);
    CHECK(ran >= 1);
#if defined(__x86_64__)
    CHECK(ran >= 2); /* every x86-64 that runs CI has AVX2 */
#endif
    tp_destroy(tp);
}

/* A row's bits alone (M=1), in one M=37 call with other rows, under 1, 2 and 3 threads and without a
 * pool, for each ISA and weight type, with N and K off the kernels' multiples. */
TEST(matmul_rows_bit_identical_across_batch_and_threads) {
    const int M = 37, N = 83, K = 1041;
    rng r = {12345};
    threadpool *tps[3] = {tp_create(1), tp_create(2), tp_create(3)};
    for (int i = 0; i < 3; i++) {
        if (cpu_matmul_isa_force(all_isa[i]) != 0) continue;
        for (int t = 0; t < 3; t++) {
            wtype wt = all_wt[t];
            float *x = make_x(&r, (long)M * K);
            void *w = make_w(&r, wt, (long)N * K);
            float *yb = alloc_y((long)M * N), *y1 = alloc_y(N);
            cpu_matmul(tps[1], yb, x, w, wt, M, N, K);
            CHECK(isnan(yb[M * N]));
            for (int m = 0; m < M; m++) {
                cpu_matmul(tps[m % 3], y1, x + (long)m * K, w, wt, 1, N, K);
                CHECK_MSG(!memcmp(y1, yb + (long)m * N, (size_t)N * 4),
                          "%s wt=%d row %d: M=1 differs from M=37", all_isa[i], (int)wt, m);
            }
            for (int ti = 0; ti < 4; ti++) {
                float *yt = alloc_y((long)M * N);
                cpu_matmul(ti < 3 ? tps[ti] : NULL, yt, x, w, wt, M, N, K);
                CHECK_MSG(!memcmp(yt, yb, (size_t)M * N * 4), "%s wt=%d: %d threads differ from 2",
                          all_isa[i], (int)wt, ti < 3 ? ti + 1 : 0);
                free(yt);
            }
            /* Sub-batches of every decode size and a few panel sizes, taken from the middle of the 37, give
             * the same bits as inside it. */
            static const int sub[] = {2, 3, 4, 5, 6, 7, 8, 9, 10, 16, 17};
            for (size_t si = 0; si < sizeof sub / sizeof sub[0]; si++) {
                int ms = sub[si], off = (int)(si * 3 % (M - ms));
                float *ys = alloc_y((long)ms * N);
                cpu_matmul(tps[si % 3], ys, x + (long)off * K, w, wt, ms, N, K);
                CHECK(isnan(ys[(long)ms * N]));
                CHECK_MSG(!memcmp(ys, yb + (long)off * N, (size_t)ms * N * 4),
                          "%s wt=%d: rows %d..%d as M=%d differ", all_isa[i], (int)wt, off, off + ms - 1, ms);
                free(ys);
            }
            free(x);
            free(w);
            free(yb);
            free(y1);
        }
    }
    cpu_matmul_isa_force(NULL);
    for (int i = 0; i < 3; i++) tp_destroy(tps[i]);
}

/* Every supported ISA produces the same bits as every other (they share the reduction order). */
TEST(matmul_isas_agree_bitwise) {
    const int M = 11, N = 45, K = 301;
    rng r = {777};
    for (int t = 0; t < 3; t++) {
        wtype wt = all_wt[t];
        float *x = make_x(&r, (long)M * K);
        void *w = make_w(&r, wt, (long)N * K);
        float *y0 = alloc_y((long)M * N), *y = alloc_y((long)M * N);
        REQUIRE(cpu_matmul_isa_force("scalar") == 0);
        cpu_matmul(NULL, y0, x, w, wt, M, N, K);
        for (int i = 1; i < 3; i++) {
            if (cpu_matmul_isa_force(all_isa[i]) != 0) continue;
            cpu_matmul(NULL, y, x, w, wt, M, N, K);
            CHECK_MSG(!memcmp(y, y0, (size_t)M * N * 4), "%s differs from scalar, wt=%d", all_isa[i],
                      (int)wt);
        }
        free(x);
        free(w);
        free(y0);
        free(y);
    }
    cpu_matmul_isa_force(NULL);
}

/* Exact small cases: K = 0 gives +0; integer-valued inputs give the exact sum; a NaN or inf in one row of x
 * stays in that row. */
TEST(matmul_exact_small_cases) {
    for (int i = 0; i < 3; i++) {
        if (cpu_matmul_isa_force(all_isa[i]) != 0) continue;
        float y[6];
        float x0[1] = {0};
        uint16_t w0[2] = {0, 0};
        for (int k = 0; k < 6; k++) y[k] = NAN;
        cpu_matmul(NULL, y, x0, w0, WT_BF16, 2, 3, 0);
        for (int k = 0; k < 6; k++) CHECK(y[k] == 0.0f && !signbit(y[k]));

        /* x = 1..20, w row n = (n+1) everywhere: y = (n+1) * 210, exact in f32. */
        float x[2 * 20];
        uint16_t wb[3 * 20];
        for (int k = 0; k < 20; k++) x[k] = (float)(k + 1);
        for (int k = 0; k < 20; k++) x[20 + k] = k == 7 ? NAN : 1.0f;
        for (int n = 0; n < 3; n++)
            for (int k = 0; k < 20; k++) wb[n * 20 + k] = f32_to_bf16((float)(n + 1));
        cpu_matmul(NULL, y, x, wb, WT_BF16, 2, 3, 20);
        for (int n = 0; n < 3; n++) CHECK_NEAR(y[n], 210.0 * (n + 1), 0);
        for (int n = 0; n < 3; n++) CHECK(isnan(y[3 + n]));
    }
    cpu_matmul_isa_force(NULL);
}

/* The decode, panel and K-sliced paths allocate nothing (the engine arms the no-alloc guard around decode
 * steps): the caller thread's x*alloc count stays put with the guard armed. */
TEST(matmul_does_not_allocate) {
    const int N = 50, K = 1100;
    rng r = {4242};
    float *x = make_x(&r, 20L * K);
    void *w = make_w(&r, WT_BF16, (long)N * K);
    float *y = alloc_y(20L * N);
    threadpool *tp = tp_create(2);
    cpu_matmul(tp, y, x, w, WT_BF16, 1, N, K); /* first use picks the ISA outside the guard */
    long before = alloc_count();
    alloc_guard_arm(1);
    alloc_guard_begin();
    cpu_matmul(tp, y, x, w, WT_BF16, 1, N, K);
    cpu_matmul(tp, y, x, w, WT_BF16, 8, N, K);
    cpu_matmul(tp, y, x, w, WT_BF16, 20, N, K);
    cpu_matmul(tp, y, x, w, WT_BF16, 20, N, 300);
    alloc_guard_end();
    alloc_guard_arm(0);
    CHECK_EQ_INT(alloc_count(), before);
    CHECK(isnan(y[20L * N]));
    tp_destroy(tp);
    free(x);
    free(w);
    free(y);
}

/* ---- ops.h: every ISA gives the bits of the order written out below (products rounded before the add,
 * 16 lanes, the tail in lanes 0.., the (l, l+8) (l, l+4) (l, l+2) (0, 1) tree). */

static float ref_dot(const float *a, const float *b, int n) {
    float acc[16] = {0};
    for (int i = 0; i < n; i++) {
        float p = a[i] * b[i];
        acc[i % 16] = acc[i % 16] + p;
    }
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) acc[l] = acc[l] + acc[l + w];
    return acc[0];
}

static int same_bits(const float *a, const float *b, int n) {
    return !memcmp(a, b, (size_t)n * sizeof(float));
}

TEST(ops_every_isa_matches_written_order_bitwise) {
    rng r = {0xabcdef12345ull};
    enum { NMAX = 1120 }; /* the longest n (1099) from the furthest offset (6), and its guard */
    float *a = malloc(NMAX * 4), *b = malloc(NMAX * 4), *w = malloc(NMAX * 4);
    float *y = malloc((NMAX + 1) * 4), *yr = malloc((NMAX + 1) * 4);
    REQUIRE(a && b && w && y && yr);
    /* Mixed magnitudes, so that a fused multiply-add or another summation order would change low bits. */
    for (int i = 0; i < NMAX; i++) {
        a[i] = rng_unit(&r) * (float)(1 << (rng_next(&r) % 12));
        b[i] = rng_unit(&r) / (float)(1 << (rng_next(&r) % 12));
        w[i] = 1.0f + rng_unit(&r);
    }
    static const int ns[] = {0, 1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 127, 128, 129, 256, 1000, 1099};
    int ran = 0, differ_from_fma = 0;
    for (int isa = 0; isa < 3; isa++) {
        if (cpu_matmul_isa_force(all_isa[isa]) != 0) continue;
        CHECK_EQ_INT(cpu_simd_level(), isa == 0   ? CPU_SIMD_SCALAR
                                       : isa == 1 ? CPU_SIMD_AVX2
                                                  : CPU_SIMD_AVX512);
        ran++;
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
            int n = ns[ni];
            const float *ao = a + ni % 3, *bo = b + (ni * 5) % 7; /* unaligned starts too */
            float d = ops_dot(ao, bo, n), dr = ref_dot(ao, bo, n);
            CHECK_MSG(!memcmp(&d, &dr, 4), "%s dot n=%d: %.9g vs %.9g", all_isa[isa], n, d, dr);

            float s = rng_unit(&r) * 3.0f;
            for (int i = 0; i <= n; i++) y[i] = yr[i] = bo[i] * 7.0f;
            y[n] = yr[n] = NAN; /* guard */
            ops_axpy(y, s, ao, n);
            for (int i = 0; i < n; i++) {
                float p = s * ao[i];
                yr[i] = yr[i] + p;
                if (fmaf(s, ao[i], bo[i] * 7.0f) != yr[i]) differ_from_fma++;
            }
            CHECK_MSG(same_bits(y, yr, n) && isnan(y[n]), "%s axpy n=%d", all_isa[isa], n);

            for (int i = 0; i <= n; i++) y[i] = yr[i] = ao[i];
            y[n] = yr[n] = NAN;
            ops_scale(y, s, n);
            for (int i = 0; i < n; i++) yr[i] = yr[i] * s;
            CHECK_MSG(same_bits(y, yr, n) && isnan(y[n]), "%s scale n=%d", all_isa[isa], n);

            ops_add(y, bo, n);
            for (int i = 0; i < n; i++) yr[i] = yr[i] + bo[i];
            CHECK_MSG(same_bits(y, yr, n) && isnan(y[n]), "%s add n=%d", all_isa[isa], n);

            if (n == 0) continue;
            float eps = 1e-6f;
            y[n] = NAN;
            ops_rmsnorm(y, ao, w, n, eps);
            float rr = 1.0f / sqrtf(ref_dot(ao, ao, n) / (float)n + eps);
            for (int i = 0; i < n; i++) {
                float t = ao[i] * rr;
                yr[i] = t * w[i];
            }
            CHECK_MSG(same_bits(y, yr, n) && isnan(y[n]), "%s rmsnorm n=%d", all_isa[isa], n);

            for (int i = 0; i < n; i++) y[i] = ao[i];
            ops_l2norm(y, y, n, eps); /* in place, as the DeltaNet prep calls it */
            float rl = 1.0f / sqrtf(ref_dot(ao, ao, n) + eps);
            for (int i = 0; i < n; i++) yr[i] = ao[i] * rl;
            CHECK_MSG(same_bits(y, yr, n) && isnan(y[n]), "%s l2norm n=%d", all_isa[isa], n);
        }
    }
    cpu_matmul_isa_force(NULL);
    CHECK(ran >= 1);
    CHECK(differ_from_fma > 0); /* the inputs do tell a fused axpy from the rounded one */
    free(a);
    free(b);
    free(w);
    free(y);
    free(yr);
}

/* Exact cases: integer sums, and a NaN in one element reaches the dot and only its own axpy element. */
TEST(ops_exact_small_cases) {
    float a[40], b[40], y[40];
    for (int i = 0; i < 40; i++) a[i] = (float)(i + 1), b[i] = 2.0f;
    for (int isa = 0; isa < 3; isa++) {
        if (cpu_matmul_isa_force(all_isa[isa]) != 0) continue;
        CHECK_NEAR(ops_dot(a, b, 40), 1640.0, 0);
        CHECK_NEAR(ops_dot(a, b, 0), 0.0, 0);
        for (int i = 0; i < 40; i++) y[i] = 1.0f;
        b[13] = NAN;
        CHECK(isnan(ops_dot(a, b, 40)));
        ops_axpy(y, 0.5f, b, 40);
        for (int i = 0; i < 40; i++) CHECK(i == 13 ? isnan(y[i]) : y[i] == 2.0f);
        b[13] = 2.0f;
    }
    cpu_matmul_isa_force(NULL);
}

/* ops_gemm_acc: the bits of the axpy sequence it stands for, every ISA, ragged rows and columns, strided
 * operands, both signs; C's padding between rows (ldc > N) is never written. */
TEST(ops_gemm_acc_matches_axpy_sequence_bitwise) {
    rng r = {0x5eed1234ull};
    static const int Ms[] = {1, 2, 5, 6, 7, 8, 9, 13, 64}, Ns[] = {1, 15, 16, 17, 31, 32, 33, 100, 128},
                     Ks[] = {0, 1, 5, 128};
    int ran = 0, bad = 0;
    for (int isa = 0; isa < 3; isa++) {
        if (cpu_matmul_isa_force(all_isa[isa]) != 0) continue;
        ran++;
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++)
            for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++)
                for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) {
                    int M = Ms[mi], N = Ns[ni], K = Ks[ki], neg = (int)((mi + ni + ki) & 1);
                    long ldc = N + 3, lda = K + 2, ldb = N + 5;
                    float *A = make_x(&r, (long)M * lda), *B = make_x(&r, (long)(K ? K : 1) * ldb);
                    float *C = make_x(&r, (long)M * ldc), *Cr = malloc((size_t)M * ldc * 4);
                    for (long i = 0; i < (long)M * lda; i++) A[i] *= (float)(1 << (i % 9));
                    memcpy(Cr, C, (size_t)M * ldc * 4);
                    ops_gemm_acc(C, ldc, A, lda, B, ldb, M, N, K, neg);
                    for (int m = 0; m < M; m++)
                        for (int k = 0; k < K; k++) {
                            float a = A[(long)m * lda + k];
                            if (neg) a = -a;
                            for (int n = 0; n < N; n++) {
                                float p = a * B[(long)k * ldb + n];
                                Cr[(long)m * ldc + n] = Cr[(long)m * ldc + n] + p;
                            }
                        }
                    if (memcmp(C, Cr, (size_t)M * ldc * 4)) {
                        if (bad++ < 3)
                            test_fail(__FILE__, __LINE__, "%s gemm_acc M=%d N=%d K=%d neg=%d differs",
                                      all_isa[isa], M, N, K, neg);
                    }
                    free(A);
                    free(B);
                    free(C);
                    free(Cr);
                }
    }
    cpu_matmul_isa_force(NULL);
    CHECK(ran >= 1);
    CHECK_EQ_INT(bad, 0);
}

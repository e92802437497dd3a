/* test_cuda_skinny.c — the skinny GEMM on tensor cores (cu_skinny, gemm_mma.cu; CINFER_CUDA_SKINNY): every
 * fusion (norm prologue, residual epilogue, SwiGLU epilogue, plain) against the CPU in double at the real
 * matrix shapes of the 4B / 27B / 35B-A3B models and at odd ones (N not a multiple of a block, K a multiple
 * of 8 but not of 64), 32 rows of x, outputs starting as NaN (an unwritten element or any NaN fails), the
 * relative error printed and bounded by 1e-5; then the same matrices at M = 1, 2, 3, 4, 8, 16 and a row
 * alone, each row BITWISE equal to that row among 32; the routing of the switch; and a microbench
 * (cuda_skinny_speed) of the real matrices at M = 1, 4, 8, 16, 32, v3 against skinny. Without a CUDA build
 * or device every test skips. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/ops.h"
#include "cinfer.h"
#include "model/forward_cuda.h"
#include "test.h"
#include "util/bf16.h"

#ifdef CINFER_CUDA
#include "backend/cuda/cuda_ops.h"
#define CUDA_TEST_SEED 0x2545f4914f6cdd1dull /* this file's inputs as before the shared helpers */
#include "cuda_test_util.h"

#define NO_DEVICE() (!cuda_built() || cuda_devices() < 1)
#define SK_M        32

typedef struct sshape {
    const char *what;
    int N, K, epi, norm; /* N: outputs (SwiGLU: w has 2N rows) */
} sshape;

static const sshape g_shapes[] = {
    {"odd N=203 K=264", 203, 264, CU_EPI_STORE, 1},
    {"odd swiglu I=37 K=72", 37, 72, CU_EPI_SWIGLU, 1},
    {"odd add N=77 K=296", 77, 296, CU_EPI_ADD, 0},
    {"odd N=1000 K=1160", 1000, 1160, CU_EPI_STORE, 0},
    {"one output N=1 K=2048", 1, 2048, CU_EPI_STORE, 0},
    {"tiny K=8 N=33", 33, 8, CU_EPI_STORE, 1},
    {"4B deltanet in_proj", 12352, 2560, CU_EPI_STORE, 1},
    {"4B attention in_proj", 10240, 2560, CU_EPI_STORE, 1},
    {"4B out_proj", 2560, 4096, CU_EPI_ADD, 0},
    {"4B gate_up (swiglu)", 9216, 2560, CU_EPI_SWIGLU, 1},
    {"4B down", 2560, 9216, CU_EPI_ADD, 0},
    {"4B lm_head", 248320, 2560, CU_EPI_STORE, 0},
    {"27B deltanet in_proj", 16480, 5120, CU_EPI_STORE, 1},
    {"27B down", 5120, 17408, CU_EPI_ADD, 0},
    {"27B gate_up (swiglu)", 17408, 5120, CU_EPI_SWIGLU, 1},
    {"35B-A3B in_proj", 12352, 2048, CU_EPI_STORE, 1},
    {"35B-A3B out_proj", 2048, 4096, CU_EPI_ADD, 0},
};

/* cu_skinny over the first M rows of dx (row stride K) into a fresh y: STORE / SwiGLU outputs start as NaN,
 * ADD outputs as y0; NULL on any error */
static float *run(cu_ctx *c, const sshape *s, const float *dx, const uint16_t *dw, const float *dg,
                  const float *dy0, int M, int via_fused) {
    char err[256];
    size_t ny = (size_t)M * s->N;
    float *dy = NULL, *y = NULL;
    if (cu_alloc((void **)&dy, ny * 4, err, sizeof err)) return NULL;
    if (s->epi == CU_EPI_ADD)
        cu_d2d_async(c, dy, dy0, ny * 4);
    else
        cu_fill_f32(c, dy, ny, NAN);
    int rc = via_fused ? cu_gemv_fused(c, dy, dx, dw, M, s->N, s->K, s->norm ? dg : NULL, 1e-6f, s->epi)
                       : cu_skinny(c, dy, dx, dw, M, s->N, s->K, s->norm ? dg : NULL, 1e-6f, s->epi);
    if (rc == 0 && cu_sync(c, err, sizeof err) == 0) {
        y = malloc(ny * 4 + 4);
        if (cu_download(y, dy, ny * 4, err, sizeof err)) free(y), y = NULL;
    }
    cu_free(dy);
    return y;
}

/* reference of output n of row m in double, from the CPU's normed row xn (ops_rmsnorm, f32) */
static double ref_out(const sshape *s, const float *xn, const uint16_t *w, const float *y0, int m, int n) {
    int K = s->K;
    double d[2] = {0, 0};
    for (int h = 0; h < (s->epi == CU_EPI_SWIGLU ? 2 : 1); h++) {
        const uint16_t *wr = w + ((size_t)n + (size_t)h * s->N) * K;
        for (int k = 0; k < K; k++) d[h] += (double)bf16_to_f32(wr[k]) * xn[k];
    }
    double v = d[0];
    if (s->epi == CU_EPI_SWIGLU) v = v / (1.0 + exp(-v)) * d[1];
    if (s->epi == CU_EPI_ADD) v += y0[(size_t)m * s->N + n];
    return v;
}

TEST(cuda_skinny_vs_cpu) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    double worst = 0;
    for (size_t si = 0; si < sizeof g_shapes / sizeof g_shapes[0]; si++) {
        const sshape *s = &g_shapes[si];
        int N = s->N, K = s->K, rows = s->epi == CU_EPI_SWIGLU ? 2 * N : N;
        size_t nw = (size_t)rows * K;
        uint16_t *w = malloc(nw * 2);
        float *x = malloc((size_t)SK_M * K * 4), *g = malloc((size_t)K * 4);
        float *y0 = malloc((size_t)SK_M * N * 4), *xn = malloc((size_t)SK_M * K * 4);
        for (size_t i = 0; i < nw; i++) w[i] = f32_to_bf16(frand() * 0.05f);
        /* rows of different scales: the norm's per-row scale and the hi + lo split of each are exercised */
        for (int m = 0; m < SK_M; m++)
            for (int k = 0; k < K; k++) x[(size_t)m * K + k] = frand() * (1.0f + (float)(m % 5));
        for (int k = 0; k < K; k++) g[k] = 1.0f + 0.5f * frand();
        for (size_t i = 0; i < (size_t)SK_M * N; i++) y0[i] = frand();
        for (int m = 0; m < SK_M; m++) {
            if (s->norm)
                ops_rmsnorm(xn + (size_t)m * K, x + (size_t)m * K, g, K, 1e-6f);
            else
                memcpy(xn + (size_t)m * K, x + (size_t)m * K, (size_t)K * 4);
        }
        uint16_t *dw = dup_dev(w, nw * 2);
        float *dx = dup_dev(x, (size_t)SK_M * K * 4), *dg = dup_dev(g, (size_t)K * 4);
        float *dy0 = dup_dev(y0, (size_t)SK_M * N * 4);
        REQUIRE(dw && dx && dg && dy0);
        float *y32 = run(c, s, dx, dw, dg, dy0, SK_M, 0);
        CHECK_MSG(y32 != NULL, "%s: the launch failed", s->what);
        REQUIRE(y32 != NULL);
        /* every output written and finite */
        size_t bad = 0;
        for (size_t i = 0; i < (size_t)SK_M * N; i++) bad += !isfinite(y32[i]);
        CHECK_MSG(bad == 0, "%s: %zu of %zu outputs NaN / inf / unwritten", s->what, bad, (size_t)SK_M * N);
        /* against the CPU: every output of the small shapes, a spread of columns of the big ones (all rows)
         */
        size_t per_col = (size_t)SK_M * K * (s->epi == CU_EPI_SWIGLU ? 2 : 1);
        int stride = (int)((size_t)N * per_col / 40000000u) + 1;
        double dd = 0, rr = 0;
        int nan_seen = 0;
        for (int n = 0; n < N; n += stride) {
            int nn =
                stride > 1 ? (n + (int)(si * 7919u) % stride) % N : n; /* not always column 0 of a tile */
            for (int m = 0; m < SK_M; m++) {
                double r = ref_out(s, xn + (size_t)m * K, w, y0, m, nn), v = y32[(size_t)m * N + nn];
                if (!isfinite(v)) nan_seen = 1;
                dd += (v - r) * (v - r), rr += r * r;
            }
        }
        double e = nan_seen ? INFINITY : sqrt(dd / (rr > 0 ? rr : 1));
        if (e > worst) worst = e;
        printf("     %-24s %6dx%-5d splits %d: rel %.2e (every %d-th column, 32 rows)\n", s->what, rows, K,
               cu_skinny_splits(N, K, s->epi), e, stride);
        CHECK_MSG(e <= 1e-5, "%s: rel %.3e > 1e-5", s->what, e);
        /* each row's bits whatever M: the first M rows, and row 5 alone */
        static const int Ms[] = {1, 2, 3, 4, 8, 16};
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
            int M = Ms[mi];
            float *yM = run(c, s, dx, dw, dg, dy0, M, 0);
            REQUIRE(yM != NULL);
            CHECK_MSG(!memcmp(yM, y32, (size_t)M * N * 4),
                      "%s: the first %d rows differ from the same rows "
                      "among 32",
                      s->what, M);
            free(yM);
        }
        /* every configuration (weight tiles per warp, chunks in flight, x requested ahead) at 8 and 32 rows
         */
        static const int cfg[][4] = {{1, 1, 0, 8}, {1, 2, 1, 4}, {2, 1, 1, 8}, {2, 2, 0, 4},
                                     {1, 1, 1, 4}, {2, 1, 0, 8}, {2, 1, 1, 4}};
        for (size_t ci = 0; ci < sizeof cfg / sizeof cfg[0]; ci++)
            for (int M = 8; M <= SK_M; M += SK_M - 8) {
                cu_set_skinny_config(cfg[ci][0], cfg[ci][1], cfg[ci][2], cfg[ci][3], 0);
                float *yc = run(c, s, dx, dw, dg, dy0, M, 0);
                cu_set_skinny_config(0, 0, -1, 0, 0);
                REQUIRE(yc != NULL);
                CHECK_MSG(!memcmp(yc, y32, (size_t)M * N * 4),
                          "%s: tiles %d, in flight %d, x ahead %d, warps %d at M = %d: other bits", s->what,
                          cfg[ci][0], cfg[ci][1], cfg[ci][2], cfg[ci][3], M);
                free(yc);
            }
        {
            sshape one = *s;
            float *y5 = run(c, &one, dx + (size_t)5 * K, dw, dg, dy0 + (size_t)5 * N, 1, 0);
            REQUIRE(y5 != NULL);
            CHECK_MSG(!memcmp(y5, y32 + (size_t)5 * N, (size_t)N * 4),
                      "%s: row 5 alone differs from row 5 "
                      "among 32",
                      s->what);
            free(y5);
        }
        free(y32);
        cu_free(dw), cu_free(dx), cu_free(dg), cu_free(dy0);
        free(w), free(x), free(g), free(y0), free(xn);
    }
    printf("     worst rel %.2e (bound 1e-5)\n", worst);
    cu_ctx_destroy(c);
}

/* The switch: off, the fused GEMVs stop at cu_gemv_max rows; 1 takes every M <= 32 through cu_skinny (the
 * same bits from cu_gemv_fused and cu_gemm as from cu_skinny); 2 leaves one row to v3 */
TEST(cuda_skinny_routing) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    int mode0 = cu_skinny_mode(), max0 = cu_skinny_max();
    cu_set_skinny(0);
    CHECK(!cu_skinny_takes(NULL, 4, 64) && !cu_gemv_fusable(cu_gemv_max() + 1, 64));
    cu_set_skinny_max(0);
    CHECK(cu_skinny_max() == 8);
    cu_set_skinny(1);
    CHECK(cu_skinny_takes(NULL, 8, 64) && !cu_skinny_takes(NULL, 9, 64));
    cu_set_skinny_max(32);
    cu_set_skinny(2);
    CHECK(!cu_skinny_takes(NULL, 1, 64) && cu_skinny_takes(NULL, 2, 64) && cu_skinny_takes(NULL, 32, 64));
    cu_set_skinny(1);
    CHECK(cu_skinny_takes(NULL, 1, 64) && cu_skinny_takes(NULL, 32, 64) && !cu_skinny_takes(NULL, 33, 64));
    CHECK(!cu_skinny_takes(NULL, 4, 68) && cu_gemv_fusable(32, 64) && !cu_gemv_fusable(32, 68));
    /* a context's own mode (CINFER_CUDA_SKINNY=auto) over the process-wide one, and back */
    cu_ctx_set_skinny(c, 2);
    CHECK(!cu_skinny_takes(c, 1, 64) && cu_skinny_takes(c, 2, 64) && cu_skinny_takes(NULL, 1, 64));
    cu_set_skinny(0);
    CHECK(cu_skinny_takes(c, 2, 64) && !cu_skinny_takes(NULL, 2, 64) && cu_skinny_any());
    cu_ctx_set_skinny(c, 0);
    CHECK(!cu_skinny_takes(c, 2, 64));
    cu_set_skinny(1);
    const sshape s = {"routing N=300 K=520", 300, 520, CU_EPI_STORE, 1};
    int M = 20, K = s.K, N = s.N;
    uint16_t *w = malloc((size_t)N * K * 2);
    float *x = malloc((size_t)M * K * 4), *g = malloc((size_t)K * 4);
    for (size_t i = 0; i < (size_t)N * K; i++) w[i] = f32_to_bf16(frand() * 0.05f);
    for (size_t i = 0; i < (size_t)M * K; i++) x[i] = frand();
    for (int k = 0; k < K; k++) g[k] = 1.0f;
    uint16_t *dw = dup_dev(w, (size_t)N * K * 2);
    float *dx = dup_dev(x, (size_t)M * K * 4), *dg = dup_dev(g, (size_t)K * 4), *dy = NULL;
    REQUIRE(dw && dx && dg && cu_alloc((void **)&dy, (size_t)M * N * 4, err, sizeof err) == 0);
    float *a = run(c, &s, dx, dw, dg, NULL, M, 0), *b = run(c, &s, dx, dw, dg, NULL, M, 1);
    REQUIRE(a && b);
    CHECK_MSG(!memcmp(a, b, (size_t)M * N * 4), "cu_gemv_fused under the switch differs from cu_skinny");
    /* cu_gemm (no norm) against cu_skinny without norm */
    const sshape p = {"routing plain", N, K, CU_EPI_STORE, 0};
    float *pa = run(c, &p, dx, dw, NULL, NULL, M, 0), *pb = malloc((size_t)M * N * 4);
    cu_gemm(c, dy, dx, dw, M, N, K, NULL, 0);
    REQUIRE(pa && cu_sync(c, err, sizeof err) == 0 &&
            cu_download(pb, dy, (size_t)M * N * 4, err, sizeof err) == 0);
    CHECK_MSG(!memcmp(pa, pb, (size_t)M * N * 4), "cu_gemm under the switch differs from cu_skinny");
    cu_set_skinny(mode0);
    cu_set_skinny_max(max0);
    free(a), free(b), free(pa), free(pb), free(w), free(x), free(g);
    cu_free(dw), cu_free(dx), cu_free(dg), cu_free(dy);
    cu_ctx_destroy(c);
}

static int g_reps = 20; /* launches per timed pass (CINFER_SKINNY_ONE: 1, for a profiler) */

/* us per product of M rows, weights rotated through copies (> 400 MB: L2 holds 50). what: 0 v3 (cu_gemv_fused
 * with the switch off), 1 skinny, 2 cuBLAS on hi + lo (cu_gemm past the GEMV rows: the plain product, without
 * the norm / epilogue kernels it would need) */
static double bench_us(cu_ctx *c, int what, const sshape *s, uint16_t **dw, int ncopy, float *dx, float *dy,
                       const float *dg, int M, uint16_t *xb) {
    cu_timer *t;
    if (cu_timer_create(&t)) return 0;
    int reps = g_reps;
    double us = 0;
    for (int pass = 0; pass < 2; pass++) { /* the first pass warms up */
        cu_timer_start(c, t);
        for (int i = 0; i < reps; i++) {
            const uint16_t *w = dw[i % ncopy];
            if (what == 2)
                cu_gemm(c, dy, dx, w, M, s->epi == CU_EPI_SWIGLU ? 2 * s->N : s->N, s->K, xb, 0);
            else if (what == 1)
                cu_skinny(c, dy, dx, w, M, s->N, s->K, s->norm ? dg : NULL, 1e-6f, s->epi);
            else
                cu_gemv_fused(c, dy, dx, w, M, s->N, s->K, s->norm ? dg : NULL, 1e-6f, s->epi);
        }
        us = cu_timer_stop_ms(c, t) * 1e3 / reps;
    }
    cu_timer_destroy(t);
    return us;
}

/* CINFER_SKINNY_BENCH=quick: each matrix at M = 1, 2, 8: v3 and the skinny kernel, plain launches, then both
 * with every launch by programmatic dependent launch (cu_set_pdl(1): the next product's weights requested
 * during this one's tail, as in a decode step); the sums over the matrices at the end. CINFER_SKINNY_ONE=1:
 * the first matrix at M = 1, each launched twice (profiling) */
static void speed_quick(cu_ctx *c, const sshape *bs, size_t nbs) {
    static const int Ms[] = {1, 2, 8};
    const char *one = getenv("CINFER_SKINNY_ONE");
    int nm = 3;
    if (one && !strcmp(one, "1")) nbs = 1, nm = 1, g_reps = 1;
    double sum[3][4] = {{0}}; /* v3, skinny, by PDL v3, skinny */
    char err[256];
    for (size_t si = 0; si < nbs; si++) {
        const sshape *s = &bs[si];
        int N = s->N, K = s->K, rows = s->epi == CU_EPI_SWIGLU ? 2 * N : N;
        size_t nw = (size_t)rows * K, bytes = nw * 2;
        int ncopy = (int)(((size_t)400 << 20) / (bytes + 1)) + 1;
        if (ncopy > 24) ncopy = 24;
        uint16_t *dw[24];
        for (int i = 0; i < ncopy; i++) {
            if (cu_alloc((void **)&dw[i], bytes, err, sizeof err)) return;
            cu_fill_random_bf16(c, dw[i], nw, 0.02f, 91 + (uint64_t)si * 31 + (uint64_t)i);
        }
        float *dx, *dy, *dg;
        if (cu_alloc((void **)&dx, (size_t)32 * K * 4, err, sizeof err) ||
            cu_alloc((void **)&dy, (size_t)32 * rows * 4, err, sizeof err) ||
            cu_alloc((void **)&dg, (size_t)K * 4, err, sizeof err))
            return;
        cu_fill_f32(c, dx, (size_t)32 * K, 0.5f);
        cu_fill_f32(c, dy, (size_t)32 * rows, 0.0f);
        cu_fill_f32(c, dg, (size_t)K, 1.0f);
        double gb = (double)bytes / 1e3;
        printf("     %-22s %6dx%-5d splits %d:", s->what, rows, K, cu_skinny_splits(N, K, s->epi));
        cu_set_skinny(0);
        for (int mi = 0; mi < nm; mi++) {
            int M = Ms[mi];
            double t[4];
            for (int p = 0; p < 2; p++) {
                cu_set_pdl(p);
                t[2 * p] = bench_us(c, 0, s, dw, ncopy, dx, dy, dg, M, NULL);
                t[2 * p + 1] = bench_us(c, 1, s, dw, ncopy, dx, dy, dg, M, NULL);
            }
            cu_set_pdl(0);
            for (int q = 0; q < 4; q++) sum[mi][q] += t[q];
            printf(" | M=%d v3 %.1f us (%.0f GB/s) skinny %.1f; by PDL %.1f / %.1f", M, t[0], gb / t[0], t[1],
                   t[2], t[3]);
        }
        printf("\n");
        cu_sync(c, err, sizeof err);
        for (int i = 0; i < ncopy; i++) cu_free(dw[i]);
        cu_free(dx), cu_free(dy), cu_free(dg);
    }
    g_reps = 20;
    for (int mi = 0; mi < nm; mi++)
        printf("     summed us M=%d: v3 %.1f, skinny %.1f; by PDL: v3 %.1f, skinny %.1f\n", Ms[mi],
               sum[mi][0], sum[mi][1], sum[mi][2], sum[mi][3]);
}

/* Prints each real matrix's us and GB/s at M = 1, 4, 8, 16, 32: v3 (cu_gemv_fused with the switch off),
 * skinny, and cuBLAS on hi + lo past 8 rows; then skinny's sweep of tiles per warp x chunks in flight x x
 * requested ahead at every M. CINFER_SKINNY_BENCH=0 skips it. */
TEST(cuda_skinny_speed) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    const char *ev = getenv("CINFER_SKINNY_BENCH");
    if (ev && !strcmp(ev, "0")) SKIP("CINFER_SKINNY_BENCH=0: skipped");
    static const sshape bs[] = {
        {"4B deltanet in_proj", 12352, 2560, CU_EPI_STORE, 1},
        {"4B attention in_proj", 10240, 2560, CU_EPI_STORE, 1},
        {"4B out_proj", 2560, 4096, CU_EPI_ADD, 0},
        {"4B gate_up (swiglu)", 9216, 2560, CU_EPI_SWIGLU, 1},
        {"4B down", 2560, 9216, CU_EPI_ADD, 0},
        {"4B lm_head", 248320, 2560, CU_EPI_STORE, 0},
        {"27B in_proj", 16480, 5120, CU_EPI_STORE, 1},
        {"27B gate_up (swiglu)", 17408, 5120, CU_EPI_SWIGLU, 1},
        {"27B down", 5120, 17408, CU_EPI_ADD, 0},
        {"35B-A3B out_proj", 2048, 4096, CU_EPI_ADD, 0},
    };
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    int mode0 = cu_skinny_mode();
    if (ev && !strcmp(ev, "quick")) {
        speed_quick(c, bs, sizeof bs / sizeof bs[0]);
        cu_set_skinny(mode0);
        cu_ctx_destroy(c);
        return;
    }
    static const int Ms[] = {1, 4, 8, 16, 32};
    double sum[3][5] = {{0}};
    for (size_t si = 0; si < sizeof bs / sizeof bs[0]; si++) {
        const sshape *s = &bs[si];
        int N = s->N, K = s->K, rows = s->epi == CU_EPI_SWIGLU ? 2 * N : N;
        size_t nw = (size_t)rows * K, bytes = nw * 2;
        int ncopy = (int)(((size_t)400 << 20) / (bytes + 1)) + 1;
        if (ncopy > 24) ncopy = 24;
        uint16_t *dw[24];
        for (int i = 0; i < ncopy; i++) {
            REQUIRE(cu_alloc((void **)&dw[i], bytes, err, sizeof err) == 0);
            cu_fill_random_bf16(c, dw[i], nw, 0.02f, 91 + (uint64_t)si * 31 + (uint64_t)i);
        }
        float *dx, *dy, *dg, *dt;
        uint16_t *xb;
        REQUIRE(cu_alloc((void **)&dx, (size_t)32 * K * 4, err, sizeof err) == 0);
        REQUIRE(cu_alloc((void **)&dy, (size_t)32 * rows * 4, err, sizeof err) == 0);
        REQUIRE(cu_alloc((void **)&dg, (size_t)K * 4, err, sizeof err) == 0);
        REQUIRE(cu_alloc((void **)&dt, (size_t)64 * rows * 4, err, sizeof err) == 0);
        REQUIRE(cu_alloc((void **)&xb, (size_t)64 * K * 2, err, sizeof err) == 0);
        cu_set_gemm_scratch(c, dt, (size_t)64 * rows); /* the stacked hi / lo product, as the forward has */
        cu_fill_f32(c, dx, (size_t)32 * K, 0.5f);
        cu_fill_f32(c, dy, (size_t)32 * rows, 0.0f);
        cu_fill_f32(c, dg, (size_t)K, 1.0f);
        double gb = (double)bytes / 1e3;
        printf("     %-22s %6dx%-5d %4d MB splits %d:", s->what, rows, K, (int)(bytes >> 20),
               cu_skinny_splits(N, K, s->epi));
        cu_set_skinny(0);
        for (int mi = 0; mi < 5; mi++) {
            double v3 = bench_us(c, 0, s, dw, ncopy, dx, dy, dg, Ms[mi], xb);
            double sk = bench_us(c, 1, s, dw, ncopy, dx, dy, dg, Ms[mi], xb);
            sum[0][mi] += v3, sum[1][mi] += sk;
            printf(" | M=%d v3 %.1f us %.0f GB/s, skinny %.1f %.0f", Ms[mi], v3, gb / v3, sk, gb / sk);
            if (Ms[mi] > cu_gemv_max()) {
                double bl = bench_us(c, 2, s, dw, ncopy, dx, dy, dg, Ms[mi], xb);
                sum[2][mi] += bl;
                printf(", cuBLAS %.1f", bl);
            }
        }
        printf("\n       sweep (M: tiles/inflight/x ahead: us):");
        static const int tr[] = {1, 1, 1, 1, 2, 2, 2, 2}, u[] = {1, 1, 2, 2, 1, 1, 2, 2},
                         xp[] = {0, 1, 0, 1, 0, 1, 0, 1};
        for (int mi = 0; mi < 5; mi++)
            for (int v = 0; v < 8; v++) {
                if (Ms[mi] > 16 && xp[v]) continue;
                cu_set_skinny_config(tr[v], u[v], xp[v], 0, 0);
                printf(" %d:%d/%d/%d:%.1f", Ms[mi], tr[v], u[v], xp[v],
                       bench_us(c, 1, s, dw, ncopy, dx, dy, dg, Ms[mi], xb));
            }
        cu_set_skinny_config(0, 0, -1, 0, 0);
        printf("\n       warps 4 / splits 1 2 4 8 (us, automatic otherwise):");
        for (int mi = 0; mi < 5; mi++) {
            cu_set_skinny_config(0, 0, -1, 4, 0);
            printf(" | M=%d w4 %.1f", Ms[mi], bench_us(c, 1, s, dw, ncopy, dx, dy, dg, Ms[mi], xb));
            for (int ks = 1; ks <= 8; ks *= 2) {
                cu_set_skinny_config(0, 0, -1, 0, ks);
                printf(" ks%d %.1f", ks, bench_us(c, 1, s, dw, ncopy, dx, dy, dg, Ms[mi], xb));
                cu_set_skinny_config(0, 0, -1, 4, ks);
                printf("/%.1f", bench_us(c, 1, s, dw, ncopy, dx, dy, dg, Ms[mi], xb));
            }
        }
        cu_set_skinny_config(0, 0, -1, 0, 0);
        printf("\n");
        REQUIRE(cu_sync(c, err, sizeof err) == 0);
        cu_set_gemm_scratch(c, NULL, 0);
        for (int i = 0; i < ncopy; i++) cu_free(dw[i]);
        cu_free(dx), cu_free(dy), cu_free(dg), cu_free(dt), cu_free(xb);
    }
    printf("     summed us (all matrices), v3 / skinny / cuBLAS:");
    for (int mi = 0; mi < 5; mi++)
        printf(" M=%d %.1f / %.1f / %.1f", Ms[mi], sum[0][mi], sum[1][mi], sum[2][mi]);
    printf("\n");
    cu_set_skinny(mode0);
    cu_ctx_destroy(c);
}

#else

TEST(cuda_skinny_not_built) {
    SKIP("no CUDA device: skipped (built without CUDA)");
}

#endif

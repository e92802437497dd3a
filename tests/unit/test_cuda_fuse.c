/* test_cuda_fuse.c — the decode GEMV v3 and its fusions (cu_gemv_fused; default, CINFER_CUDA_FUSE=0 off):
 * every variant (norm prologue, residual epilogue, SwiGLU epilogue, plain) against the CPU at the real matrix
 * shapes of the 4B / 27B / 35B-A3B models and at odd small ones, M = 1..8, outputs starting as NaN (an
 * unwritten element or any NaN fails), each row's bits the same whatever M, every K-split and loads-in-flight
 * setting; then the whole forward
 * with the switch on against it off, graphs against eager, alone against in a batch; and a microbench of the
 * real matrices, v1 / v2 / v3 and fused against unfused, with the weights rotated through enough copies that
 * L2 (50 MB) never holds them. Without a CUDA build or device every test skips. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "cinfer.h"
#include "model/forward_cuda.h"
#include "cuda_ctx.h"
#include "test.h"
#include "util/bf16.h"

#ifdef CINFER_CUDA
#include "backend/cuda/cuda_ops.h"
#include "cuda_test_util.h"

#define NO_DEVICE() (!cuda_built() || cuda_devices() < 1)

/* rel (cuda_test_util.h) against a double reference: a NaN or inf anywhere gives +inf */
static double rel64(const float *got, const double *ref, size_t n) {
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) return INFINITY;
        double e = (double)got[i] - ref[i];
        d += e * e, r += ref[i] * ref[i];
    }
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

typedef struct fshape {
    const char *what;
    int N, K, epi, norm; /* N: outputs (SwiGLU: w has 2N rows) */
} fshape;

/* the fused layer GEMVs of the real models, and small odd ones (K % 256 != 0, N not a multiple of a block,
 * a single output) */
static const fshape g_shapes[] = {
    {"small in_proj N=203 K=264", 203, 264, CU_EPI_STORE, 1},
    {"small gate_up I=37 K=72", 37, 72, CU_EPI_SWIGLU, 1},
    {"small down N=64 K=37x8", 64, 296, CU_EPI_ADD, 0},
    {"one output N=1 K=2048", 1, 2048, CU_EPI_STORE, 0},
    {"4B deltanet in_proj", 12352, 2560, CU_EPI_STORE, 1},
    {"4B attention in_proj", 10240, 2560, CU_EPI_STORE, 1},
    {"4B out_proj", 2560, 4096, CU_EPI_ADD, 0},
    {"4B gate_up (swiglu)", 9216, 2560, CU_EPI_SWIGLU, 1},
    {"4B down", 2560, 9216, CU_EPI_ADD, 0},
    {"27B out_proj", 5120, 6144, CU_EPI_ADD, 0},
    {"27B down", 5120, 17408, CU_EPI_ADD, 0},
    {"35B-A3B out_proj", 2048, 4096, CU_EPI_ADD, 0},
};

/* reference rows in double from the CPU's normed input ((x / rms) * g in f32, ops_rmsnorm) */
static void reference(double *ref, const float *x, const float *y0, const uint16_t *w, const float *g,
                      const fshape *s, int M) {
    int N = s->N, K = s->K, rows = s->epi == CU_EPI_SWIGLU ? 2 * N : N;
    float *xn = malloc((size_t)K * 4);
    double *dot = malloc((size_t)rows * sizeof(double));
    for (int m = 0; m < M; m++) {
        if (s->norm)
            ops_rmsnorm(xn, x + (size_t)m * K, g, K, 1e-6f);
        else
            memcpy(xn, x + (size_t)m * K, (size_t)K * 4);
        for (int n = 0; n < rows; n++) {
            const uint16_t *wr = w + (size_t)n * K;
            double a = 0;
            for (int k = 0; k < K; k++) a += (double)bf16_to_f32(wr[k]) * xn[k];
            dot[n] = a;
        }
        for (int n = 0; n < N; n++) {
            double v = dot[n];
            if (s->epi == CU_EPI_SWIGLU) v = v / (1.0 + exp(-v)) * dot[N + n];
            if (s->epi == CU_EPI_ADD) v += y0[(size_t)m * N + n];
            ref[(size_t)m * N + n] = v;
        }
    }
    free(xn), free(dot);
}

/* y = fused GEMV of the first M rows of dx; STORE / SwiGLU outputs start as NaN, ADD outputs as y0 */
static float *run_fused(cu_ctx *c, const fshape *s, const float *dx, const uint16_t *dw, const float *dg,
                        const float *dy0, int M) {
    char err[256];
    size_t ny = (size_t)M * s->N;
    float *dy = NULL;
    if (cu_alloc((void **)&dy, ny * 4, err, sizeof err)) return NULL;
    if (s->epi == CU_EPI_ADD)
        cu_d2d_async(c, dy, dy0, ny * 4);
    else
        cu_fill_f32(c, dy, ny, NAN);
    int rc = cu_gemv_fused(c, dy, dx, dw, M, s->N, s->K, s->norm ? dg : NULL, 1e-6f, s->epi);
    float *y = NULL;
    if (rc == 0 && cu_sync(c, err, sizeof err) == 0) y = get(dy, ny);
    cu_free(dy);
    return y;
}

TEST(cuda_gemv3_fused_vs_cpu) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    for (size_t si = 0; si < sizeof g_shapes / sizeof g_shapes[0]; si++) {
        const fshape *s = &g_shapes[si];
        int N = s->N, K = s->K, rows = s->epi == CU_EPI_SWIGLU ? 2 * N : N;
        size_t nw = (size_t)rows * K;
        uint16_t *w = malloc(nw * 2);
        for (size_t i = 0; i < nw; i++) w[i] = f32_to_bf16(frand() * 0.05f);
        float *x = malloc((size_t)8 * K * 4), *g = malloc((size_t)K * 4), *y0 = malloc((size_t)8 * N * 4);
        for (size_t i = 0; i < (size_t)8 * K; i++) x[i] = frand() * 3.0f; /* a residual far from unit rms */
        for (int k = 0; k < K; k++) g[k] = 1.0f + 0.5f * frand();
        for (size_t i = 0; i < (size_t)8 * N; i++) y0[i] = frand();
        double *ref = malloc((size_t)8 * N * sizeof(double));
        reference(ref, x, y0, w, g, s, 8);
        uint16_t *dw = dup_dev(w, nw * 2);
        float *dx = dup_dev(x, (size_t)8 * K * 4), *dg = dup_dev(g, (size_t)K * 4),
              *dy0 = dup_dev(y0, (size_t)8 * N * 4);
        REQUIRE(dw && dx && dg && dy0);
        printf("     %-28s N=%5d K=%5d splits %d:", s->what, N, K, cu_gemv3_splits(rows, K));
        float *y8 = run_fused(c, s, dx, dw, dg, dy0, 8);
        REQUIRE(y8);
        double worst = 0;
        for (int M = 1; M <= 8; M++) {
            float *y = M == 8 ? y8 : run_fused(c, s, dx, dw, dg, dy0, M);
            REQUIRE(y);
            double r = rel64(y, ref, (size_t)M * N);
            if (!(r <= worst)) worst = r;
            CHECK_MSG(r <= 1e-5, "%s M=%d: ||d||/||ref|| = %.3g", s->what, M, r);
            CHECK_MSG(!memcmp(y, y8, (size_t)M * N * 4), "%s: the first %d rows differ alone and among 8",
                      s->what, M);
            if (M != 8) free(y);
        }
        printf(" M=1..8 vs CPU <= %.2e", worst);
        /* rows per warp and loads in flight never change a bit; every split count is within the bound */
        for (int ks = 1; ks <= 8; ks *= 2) {
            float *ya = NULL;
            for (int v = 0; v < 16; v++) {
                static const int nr[] = {0, 1, 2, 4, 1, 2, 4, 1, 2, 4, 1, 2, 4, 2, 4, 2},
                                 u[] = {0, 1, 1, 1, 2, 2, 2, 4, 4, 2, 1, 2, 1, 2, 1, 1},
                                 ld[] = {-1, 0, 0, 0, 0, 0, 0, 0, 2, 2, 4, 4, 6, 6, 2, 2};
                if (ks == 8 && (ld[v] & 2)) continue; /* 4-warp blocks split K at most 4 ways */
                cu_set_gemv3_config(ks, nr[v], u[v], ld[v]);
                float *y = run_fused(c, s, dx, dw, dg, dy0, 1);
                REQUIRE(y);
                if (!ya) {
                    ya = y;
                    double r = rel64(y, ref, (size_t)N);
                    CHECK_MSG(r <= 1e-5, "%s %d splits: ||d||/||ref|| = %.3g", s->what, ks, r);
                    printf(" | %d: %.1e", ks, r);
                } else {
                    CHECK_MSG(!memcmp(y, ya, (size_t)N * 4),
                              "%s %d splits: %d rows a warp, %d in flight, variant %d differ", s->what, ks,
                              nr[v], u[v], ld[v]);
                    free(y);
                }
            }
            free(ya);
        }
        cu_set_gemv3_config(0, 0, 0, -1);
        /* with programmatic dependent launch: the same bits */
        cu_set_pdl(1);
        float *yp = run_fused(c, s, dx, dw, dg, dy0, 3);
        cu_set_pdl(0);
        REQUIRE(yp);
        CHECK_MSG(!memcmp(yp, y8, (size_t)3 * N * 4), "%s: with PDL differs", s->what);
        printf("\n");
        free(yp), free(y8);
        free(w), free(x), free(g), free(y0), free(ref);
        cu_free(dw), cu_free(dx), cu_free(dg), cu_free(dy0);
    }
    /* combinations that are not built launch nothing and say so */
    CHECK(cu_gemv_fused(c, NULL, NULL, NULL, 1, 8, 8, (const float *)1, 1e-6f, CU_EPI_ADD) == -1);
    CHECK(cu_gemv_fused(c, NULL, NULL, NULL, 1, 8, 8, NULL, 1e-6f, CU_EPI_SWIGLU) == -1);
    CHECK(cu_gemv_fused(c, NULL, NULL, NULL, 1, 8, 12, NULL, 1e-6f, CU_EPI_STORE) == -1);
    CHECK(!cu_gemv_fusable(cu_gemv_max() + 1, 64) && !cu_gemv_fusable(1, 70) && cu_gemv_fusable(1, 64));
    cu_ctx_destroy(c);
}

/* ---- the whole forward ---- */

static double worst_row(const float *got, const float *ref, int rows, int V) {
    double worst = 0;
    for (int t = 0; t < rows; t++) {
        double d = 0, n = 0;
        for (int v = 0; v < V; v++) {
            double e = (double)got[(size_t)t * V + v] - ref[(size_t)t * V + v];
            if (!isfinite(got[(size_t)t * V + v])) e = INFINITY;
            d += e * e, n += (double)ref[(size_t)t * V + v] * ref[(size_t)t * V + v];
        }
        double r = sqrt(d / (n > 0 ? n : 1));
        if (!(r <= worst)) worst = r;
    }
    return worst;
}

/* per fixture: fused vs unfused (3 sequences, prefill 2 then 10 decode steps at batch 3: every GEMV
 * fused), fused graphs vs fused eager bit for bit, sequence 0 alone vs in the batch of 3 bit for bit */
static void fuse_case(const char *fixture) {
    char dir[512], err[512];
    snprintf(dir, sizeof dir, "%s/%s", test_fixtures_dir(), fixture);
    cinfer_model *m;
    REQUIRE(cinfer_model_open(dir, &m, err, sizeof err) == 0);
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    int V = info.vocab_size, B = 3, P = 2, D = 10; /* 6 prompt rows: every GEMV on the GEMV, none on cuBLAS */
    size_t n = (size_t)(D + 1) * B * V;
    float *unf = malloc(n * 4), *fz = malloc(n * 4), *eager = malloc(n * 4), *alone = malloc(n * 4);
    setenv("CINFER_CUDA_FUSE", "0", 1);
    int rc = test_run_seqs(m, B, P, D, V, 0, unf);
    setenv("CINFER_CUDA_FUSE", "1", 1);
    rc |= test_run_seqs(m, B, P, D, V, 0, fz);
    setenv("CINFER_CUDA_GRAPHS", "0", 1);
    rc |= test_run_seqs(m, B, P, D, V, 0, eager);
    unsetenv("CINFER_CUDA_GRAPHS");
    rc |= test_run_seqs(m, 1, P, D, V, 0, alone);
    unsetenv("CINFER_CUDA_FUSE");
    if (!rc) {
        double w = worst_row(fz, unf, (D + 1) * B, V);
        int same_graph = !memcmp(fz, eager, n * 4), same_alone = 1;
        for (int t = 0; t <= D; t++)
            same_alone &= !memcmp(alone + (size_t)t * V, fz + (size_t)t * B * V, (size_t)V * 4);
        printf(
            "     %-16s fused vs unfused max ||d||/||ref|| = %.2e; graphs vs eager %s; alone vs batch %s\n",
            fixture, w, same_graph ? "bit-identical" : "DIFFER", same_alone ? "bit-identical" : "DIFFER");
        CHECK_MSG(w <= 1e-4, "%s: fused forward differs from unfused by %.3g", fixture, w);
        CHECK_MSG(same_graph, "%s: fused decode from CUDA graphs differs from eager launches", fixture);
        CHECK_MSG(same_alone, "%s: a fused sequence alone differs from the same in a batch of 3", fixture);
    }
    free(unf), free(fz), free(eager), free(alone);
    cinfer_model_close(m);
}

TEST(cuda_gemv3_forward_fused_vs_unfused) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    fuse_case("qwen35_dense");
    fuse_case("qwen35_text");
    fuse_case("qwen35_moe"); /* MoE layers keep their kernels; the attention / DeltaNet GEMVs fuse */
    fuse_case("qwen3_next");
}

/* ---- microbench ---- */

typedef struct bshape {
    const char *what;
    int N, K, epi, norm;
} bshape;

static const bshape g_bench[] = {
    {"4B deltanet in_proj", 12352, 2560, CU_EPI_STORE, 1},
    {"4B attention in_proj", 10240, 2560, CU_EPI_STORE, 1},
    {"4B out_proj", 2560, 4096, CU_EPI_ADD, 0},
    {"4B gate_up", 9216, 2560, CU_EPI_SWIGLU, 1},
    {"4B down", 2560, 9216, CU_EPI_ADD, 0},
    {"4B lm_head", 248320, 2560, CU_EPI_STORE, 0},
    {"27B deltanet in_proj", 16480, 5120, CU_EPI_STORE, 1},
    {"27B attention in_proj", 14336, 5120, CU_EPI_STORE, 1},
    {"27B out_proj", 5120, 6144, CU_EPI_ADD, 0},
    {"27B gate_up", 17408, 5120, CU_EPI_SWIGLU, 1},
    {"27B down", 5120, 17408, CU_EPI_ADD, 0},
    {"35B-A3B deltanet in_proj", 12352, 2048, CU_EPI_STORE, 1},
    {"35B-A3B out_proj", 2048, 4096, CU_EPI_ADD, 0},
};

/* mean microseconds of one launch over `reps` launches cycling through ncopy weight copies (so no launch
 * finds its weights in L2); what: 0 cu_gemm (the version set), 1 the fused v3, 2 the unfused sequence the
 * fused one replaces (add_rmsnorm + GEMV, GEMV + add, GEMV + swiglu) */
static double bench_us(cu_ctx *c, int what, const bshape *s, uint16_t **dw, int ncopy, float *dx, float *dxn,
                       float *dy, float *dt, const float *dg, int M) {
    cu_timer *t;
    if (cu_timer_create(&t)) return 0;
    int reps = 24, rows = s->epi == CU_EPI_SWIGLU ? 2 * s->N : s->N;
    double us = 0;
    for (int pass = 0; pass < 2; pass++) { /* the first pass warms up */
        cu_timer_start(c, t);
        for (int i = 0; i < reps; i++) {
            const uint16_t *w = dw[i % ncopy];
            if (what == 0) {
                cu_gemm(c, dy, dx, w, M, rows, s->K, NULL, 1);
            } else if (what == 1) {
                cu_gemv_fused(c, dy, dx, w, M, s->N, s->K, s->norm ? dg : NULL, 1e-6f, s->epi);
            } else {
                if (s->norm) cu_add_rmsnorm(c, dx, NULL, dxn, dg, M, s->K, 1e-6f);
                cu_gemm(c, dt, s->norm ? dxn : dx, w, M, rows, s->K, NULL, 1);
                if (s->epi == CU_EPI_SWIGLU) cu_swiglu(c, dy, dt, M, s->N);
                if (s->epi == CU_EPI_ADD) cu_add(c, dy, dt, M, s->N);
            }
        }
        us = cu_timer_stop_ms(c, t) * 1e3 / reps;
    }
    cu_timer_destroy(t);
    return us;
}

/* Prints, at one row (and a few at 8 rows), each real matrix's time and GB/s: v1, the default v2, v3 with
 * its automatic configuration, the fused v3 against the unfused sequence it replaces, with and without PDL,
 * and every v3 configuration (splits x rows per warp x loads in flight) to choose the automatic one from.
 * CINFER_FUSE_BENCH=0 skips it (it takes a few seconds of GPU time). */
TEST(cuda_gemv3_bench) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    const char *ev = getenv("CINFER_FUSE_BENCH");
    if (ev && !strcmp(ev, "0")) SKIP("CINFER_FUSE_BENCH=0: skipped");
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    int ver0 = cu_gemv_version();
    double sum[8] = {0};
    for (size_t si = 0; si < sizeof g_bench / sizeof g_bench[0]; si++) {
        const bshape *s = &g_bench[si];
        int N = s->N, K = s->K, rows = s->epi == CU_EPI_SWIGLU ? 2 * N : N;
        size_t nw = (size_t)rows * K, bytes = nw * 2;
        int ncopy = (int)((size_t)400 << 20) / (bytes + 1) + 1; /* > 400 MB in all: L2 holds 50 */
        if (ncopy > 24) ncopy = 24;
        uint16_t *dw[24];
        for (int i = 0; i < ncopy; i++) {
            REQUIRE(cu_alloc((void **)&dw[i], bytes, err, sizeof err) == 0);
            cu_fill_random_bf16(c, dw[i], nw, 0.02f, 77 + (uint64_t)si * 31 + (uint64_t)i);
        }
        float *dx, *dxn, *dy, *dt, *dg;
        REQUIRE(cu_alloc((void **)&dx, (size_t)8 * K * 4, err, sizeof err) == 0);
        REQUIRE(cu_alloc((void **)&dxn, (size_t)8 * K * 4, err, sizeof err) == 0);
        REQUIRE(cu_alloc((void **)&dy, (size_t)8 * rows * 4, err, sizeof err) == 0);
        REQUIRE(cu_alloc((void **)&dt, (size_t)8 * rows * 4, err, sizeof err) == 0);
        REQUIRE(cu_alloc((void **)&dg, (size_t)K * 4, err, sizeof err) == 0);
        cu_fill_f32(c, dx, (size_t)8 * K, 0.5f);
        cu_fill_f32(c, dg, (size_t)K, 1.0f);
        cu_set_gemv_version(1);
        double v1 = bench_us(c, 0, s, dw, ncopy, dx, dxn, dy, dt, dg, 1);
        cu_set_gemv_version(2);
        double v2 = bench_us(c, 0, s, dw, ncopy, dx, dxn, dy, dt, dg, 1);
        cu_set_gemv_version(4);
        double v3 = bench_us(c, 0, s, dw, ncopy, dx, dxn, dy, dt, dg, 1);
        cu_set_gemv_version(2);
        double unf = bench_us(c, 2, s, dw, ncopy, dx, dxn, dy, dt, dg, 1);
        double fus = bench_us(c, 1, s, dw, ncopy, dx, dxn, dy, dt, dg, 1);
        cu_set_pdl(1);
        double unfp = bench_us(c, 2, s, dw, ncopy, dx, dxn, dy, dt, dg, 1);
        double fusp = bench_us(c, 1, s, dw, ncopy, dx, dxn, dy, dt, dg, 1);
        cu_set_pdl(0);
        double unf8 = bench_us(c, 2, s, dw, ncopy, dx, dxn, dy, dt, dg, 8);
        double fus8 = bench_us(c, 1, s, dw, ncopy, dx, dxn, dy, dt, dg, 8);
        REQUIRE(cu_sync(c, err, sizeof err) == 0);
        double gb = (double)bytes / 1e3;
        printf("     %-24s %6dx%-5d %3d MB: v1 %6.1f us %4.0f GB/s | v2 %6.1f %4.0f | v3 %6.1f %4.0f (splits "
               "%d) "
               "| unfused %6.1f, fused %6.1f %4.0f GB/s | +PDL %6.1f, %6.1f | M=8 %6.1f, %6.1f\n",
               s->what, rows, K, (int)(bytes >> 20), v1, gb / v1, v2, gb / v2, v3, gb / v3,
               cu_gemv3_splits(rows, K), unf, fus, gb / fus, unfp, fusp, unf8, fus8);
        double row[8] = {v1, v2, v3, unf, fus, unfp, fusp, fus8 - unf8};
        for (int i = 0; i < 8; i++) sum[i] += row[i];
        /* every configuration at one row: splits x (rows per warp, loads in flight) */
        if (s->N < 200000) {
            printf(
                "       sweep (splits/rows/inflight/variant: us; variant +2: 4-warp blocks, +4: next chunks "
                "requested before the FMAs):");
            static const int nr[] = {1, 1, 1, 2, 2, 2, 4, 4}, u[] = {1, 2, 4, 1, 2, 4, 1, 2};
            double best = 1e30;
            int bk = 0, bv = 0, bl = 0;
            for (int ks = 1; ks <= 8; ks *= 2)
                for (int ld = 0; ld < 8; ld += 2)
                    for (int v = 0; v < 8 && !(ks == 8 && (ld & 2)); v++) {
                        cu_set_gemv3_config(ks, nr[v], u[v], ld);
                        double us = bench_us(c, 1, s, dw, ncopy, dx, dxn, dy, dt, dg, 1);
                        printf(" %d/%d/%d/%d:%.1f", ks, nr[v], u[v], ld, us);
                        if (us < best) best = us, bk = ks, bv = v, bl = ld;
                    }
            cu_set_gemv3_config(0, 0, 0, -1);
            REQUIRE(cu_sync(c, err, sizeof err) == 0);
            printf("\n       best %d/%d/%d/%d %.1f us %.0f GB/s\n", bk, nr[bv], u[bv], bl, best, gb / best);
        }
        for (int i = 0; i < ncopy; i++) cu_free(dw[i]);
        cu_free(dx), cu_free(dxn), cu_free(dy), cu_free(dt), cu_free(dg);
    }
    printf(
        "     summed, M=1: v1 %.1f us, v2 %.1f, v3 %.1f; unfused %.1f vs fused %.1f; +PDL %.1f vs %.1f; M=8 "
        "fused - unfused %+.1f us\n",
        sum[0], sum[1], sum[2], sum[3], sum[4], sum[5], sum[6], sum[7]);
    cu_set_gemv_version(ver0);
    cu_ctx_destroy(c);
}

/* The GEMV share of a 4B decode step: each layer's four GEMVs (in_proj 12352 x 2560, out_proj 2560 x 4096,
 * gate_up 18432 x 2560, down 2560 x 9216) and the norm / add / SwiGLU kernels the fused forms replace, over
 * 8 layers of distinct weights (1.8 GB: nothing stays in L2), captured as one CUDA graph and replayed — what
 * a decode step does between the DeltaNet / attention cores, launch gaps and tails included. Unfused (today's
 * default GEMV) against fused, each with and without programmatic dependent launch. */
TEST(cuda_gemv3_chain) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    const char *ev = getenv("CINFER_FUSE_BENCH");
    if (ev && !strcmp(ev, "0")) SKIP("CINFER_FUSE_BENCH=0: skipped");
    enum { L = 8, H = 2560, NIN = 12352, VD = 4096, I = 9216 };
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    uint16_t *w_in[L], *w_out[L], *w_gu[L], *w_dn[L];
    for (int l = 0; l < L; l++) {
        REQUIRE(cu_alloc((void **)&w_in[l], (size_t)NIN * H * 2, err, sizeof err) == 0);
        REQUIRE(cu_alloc((void **)&w_out[l], (size_t)H * VD * 2, err, sizeof err) == 0);
        REQUIRE(cu_alloc((void **)&w_gu[l], (size_t)2 * I * H * 2, err, sizeof err) == 0);
        REQUIRE(cu_alloc((void **)&w_dn[l], (size_t)H * I * 2, err, sizeof err) == 0);
        cu_fill_random_bf16(c, w_in[l], (size_t)NIN * H, 0.02f, 500 + 4 * (uint64_t)l);
        cu_fill_random_bf16(c, w_out[l], (size_t)H * VD, 0.02f, 501 + 4 * (uint64_t)l);
        cu_fill_random_bf16(c, w_gu[l], (size_t)2 * I * H, 0.02f, 502 + 4 * (uint64_t)l);
        cu_fill_random_bf16(c, w_dn[l], (size_t)H * I, 0.02f, 503 + 4 * (uint64_t)l);
    }
    float *x, *xn, *proj, *act, *out, *g;
    REQUIRE(cu_alloc((void **)&x, (size_t)H * 4, err, sizeof err) == 0);
    REQUIRE(cu_alloc((void **)&xn, (size_t)H * 4, err, sizeof err) == 0);
    REQUIRE(cu_alloc((void **)&proj, (size_t)2 * I * 4, err, sizeof err) == 0);
    REQUIRE(cu_alloc((void **)&act, (size_t)I * 4, err, sizeof err) == 0);
    REQUIRE(cu_alloc((void **)&out, (size_t)H * 4, err, sizeof err) == 0);
    REQUIRE(cu_alloc((void **)&g, (size_t)H * 4, err, sizeof err) == 0);
    cu_fill_f32(c, g, H, 1.0f);
    double bytes = (double)L * 2 * ((double)NIN * H + (double)H * VD + 2.0 * I * H + (double)H * I);
    int ver0 = cu_gemv_version();
    cu_timer *t;
    REQUIRE(cu_timer_create(&t) == 0);
    for (int fused = 0; fused < 2; fused++)
        for (int pdl = 0; pdl < 2; pdl++) {
            cu_set_gemv_version(2);
            cu_set_pdl(pdl);
            cu_fill_f32(c, x, H, 0.01f);
            REQUIRE(cu_sync(c, err, sizeof err) == 0);
            REQUIRE(cu_capture_begin(c, err, sizeof err) == 0);
            for (int l = 0; l < L; l++) {
                if (fused) {
                    cu_gemv_fused(c, proj, x, w_in[l], 1, NIN, H, g, 1e-6f, CU_EPI_STORE);
                    cu_gemv_fused(c, x, act, w_out[l], 1, H, VD, NULL, 0.0f, CU_EPI_ADD);
                    cu_gemv_fused(c, act, x, w_gu[l], 1, I, H, g, 1e-6f, CU_EPI_SWIGLU);
                    cu_gemv_fused(c, x, act, w_dn[l], 1, H, I, NULL, 0.0f, CU_EPI_ADD);
                } else {
                    cu_add_rmsnorm(c, x, l ? out : NULL, xn, g, 1, H, 1e-6f);
                    cu_gemm(c, proj, xn, w_in[l], 1, NIN, H, NULL, 0);
                    cu_gemm(c, out, act, w_out[l], 1, H, VD, NULL, 0);
                    cu_add_rmsnorm(c, x, out, xn, g, 1, H, 1e-6f);
                    cu_gemm(c, proj, xn, w_gu[l], 1, 2 * I, H, NULL, 0);
                    cu_swiglu(c, act, proj, 1, I);
                    cu_gemm(c, out, act, w_dn[l], 1, H, I, NULL, 0);
                }
            }
            void *exec = NULL;
            REQUIRE(cu_capture_end(c, &exec, err, sizeof err) == 0);
            for (int i = 0; i < 3; i++) REQUIRE(cu_graph_launch(c, exec, err, sizeof err) == 0);
            cu_timer_start(c, t);
            for (int i = 0; i < 20; i++) REQUIRE(cu_graph_launch(c, exec, err, sizeof err) == 0);
            double us = cu_timer_stop_ms(c, t) * 1e3 / 20;
            REQUIRE(cu_sync(c, err, sizeof err) == 0);
            cu_graph_destroy(exec);
            printf(
                "     4B GEMV chain, %d layers, graph: %-7s %-8s %7.1f us per step, %4.0f GB/s (%.2f GB)\n",
                L, fused ? "fused" : "unfused", pdl ? "+ PDL" : "", us, bytes / us / 1e3, bytes / 1e9);
        }
    cu_set_pdl(0);
    cu_set_gemv_version(ver0);
    cu_timer_destroy(t);
    for (int l = 0; l < L; l++) cu_free(w_in[l]), cu_free(w_out[l]), cu_free(w_gu[l]), cu_free(w_dn[l]);
    cu_free(x), cu_free(xn), cu_free(proj), cu_free(act), cu_free(out), cu_free(g);
    cu_ctx_destroy(c);
}

/* Each kind of 4B GEMV alone, 8 layers of distinct weights back to back in a graph with PDL (as in the decode
 * graph: the previous launch's tail and the PDL wait included), at every rows-per-warp / chunks-in-flight /
 * variant of gemv3_kernel: us per launch and GB/s, the best per kind; and that none changes a bit (the graph
 * once more from y = 0 against the default configuration's output). */
TEST(cuda_gemv3_chain_sweep) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    const char *ev = getenv("CINFER_FUSE_BENCH");
    if (ev && !strcmp(ev, "0")) SKIP("CINFER_FUSE_BENCH=0: skipped");
    enum { L = 8, H = 2560, NIN = 12352, VD = 4096, I = 9216 };
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    const int rows[4] = {NIN, H, 2 * I, H}, ks[4] = {H, VD, H, I};
    static const char *kind[4] = {"in_proj", "out_proj", "gate_up", "down"};
    const int n_out[4] = {NIN, H, I, H};
    float *ref = malloc((size_t)NIN * 4);
    REQUIRE(ref);
    float *x, *y, *g;
    REQUIRE(cu_alloc((void **)&x, (size_t)I * 4, err, sizeof err) == 0);
    REQUIRE(cu_alloc((void **)&y, (size_t)2 * I * 4, err, sizeof err) == 0);
    REQUIRE(cu_alloc((void **)&g, (size_t)I * 4, err, sizeof err) == 0);
    cu_fill_f32(c, g, I, 1.0f);
    cu_fill_f32(c, x, I, 0.01f);
    cu_timer *t;
    REQUIRE(cu_timer_create(&t) == 0);
    for (int q = 0; q < 4; q++) {
        uint16_t *w[L];
        for (int l = 0; l < L; l++) {
            REQUIRE(cu_alloc((void **)&w[l], (size_t)rows[q] * ks[q] * 2, err, sizeof err) == 0);
            cu_fill_random_bf16(c, w[l], (size_t)rows[q] * ks[q], 0.02f, 900 + 4 * (uint64_t)l + q);
        }
        double gb = 2.0 * rows[q] * ks[q] / 1e3, best = 1e30;
        int bn = 0, bu = 0, bv = 0;
        printf("     %-8s (nr/u/var: us a launch):", kind[q]);
        for (int v = -1; v < 54; v++) {
            int nr = v < 0 ? 0 : 1 << (v / 18), u = v < 0 ? 0 : 1 << (v / 6 % 3),
                var = v < 0 ? -1 : 2 * (v % 6);
            if (u == 4 && nr == 4) continue; /* registers */
            cu_set_gemv3_config(0, nr, u, var);
            cu_set_pdl(1);
            REQUIRE(cu_sync(c, err, sizeof err) == 0);
            REQUIRE(cu_capture_begin(c, err, sizeof err) == 0);
            for (int l = 0; l < L; l++) {
                if (q == 0) cu_gemv_fused(c, y, x, w[l], 1, NIN, H, g, 1e-6f, CU_EPI_STORE);
                if (q == 1) cu_gemv_fused(c, y, x, w[l], 1, H, VD, NULL, 0.0f, CU_EPI_ADD);
                if (q == 2) cu_gemv_fused(c, y, x, w[l], 1, I, H, g, 1e-6f, CU_EPI_SWIGLU);
                if (q == 3) cu_gemv_fused(c, y, x, w[l], 1, H, I, NULL, 0.0f, CU_EPI_ADD);
            }
            void *exec = NULL;
            REQUIRE(cu_capture_end(c, &exec, err, sizeof err) == 0);
            cu_set_gemv3_config(0, 0, 0, -1);
            cu_set_pdl(0);
            for (int i = 0; i < 2; i++) REQUIRE(cu_graph_launch(c, exec, err, sizeof err) == 0);
            cu_timer_start(c, t);
            for (int i = 0; i < 12; i++) REQUIRE(cu_graph_launch(c, exec, err, sizeof err) == 0);
            double us = cu_timer_stop_ms(c, t) * 1e3 / 12 / L;
            /* the bits: the graph once more from y = 0 (the adds accumulate into y), against the default's */
            cu_fill_f32(c, y, (size_t)2 * I, 0.0f);
            REQUIRE(cu_graph_launch(c, exec, err, sizeof err) == 0);
            REQUIRE(cu_sync(c, err, sizeof err) == 0);
            cu_graph_destroy(exec);
            float *got = get(y, (size_t)n_out[q]);
            if (v < 0)
                memcpy(ref, got, (size_t)n_out[q] * 4);
            else
                CHECK_MSG(!memcmp(got, ref, (size_t)n_out[q] * 4), "%s %d/%d/%d: not the default's bits",
                          kind[q], nr, u, var);
            free(got);
            if (v < 0)
                printf(" default %.2f (%.0f GB/s) |", us, gb / us);
            else
                printf(" %d/%d/%d %.2f", nr, u, var, us);
            if (v >= 0 && us < best) best = us, bn = nr, bu = u, bv = var;
        }
        printf("\n       best %d/%d/%d %.2f us %.0f GB/s\n", bn, bu, bv, best, gb / best);
        for (int l = 0; l < L; l++) cu_free(w[l]);
    }
    cu_timer_destroy(t);
    free(ref);
    cu_free(x), cu_free(y), cu_free(g);
    cu_ctx_destroy(c);
}

/* one launch's blocks (stamps of one tag), times in us from t0: starts, waits done and ends at the first /
 * 10% / 50% / 90% / last block, the SMs used and the most blocks one SM held */
static int cmp_u64(const void *a, const void *b) {
    unsigned long long x = *(const unsigned long long *)a, y = *(const unsigned long long *)b;
    return x < y ? -1 : x > y;
}
static void tl_row(const char *what, int print, const cu_g3_stamp *st, long n, unsigned tag,
                   unsigned long long t0, unsigned long long *prev_end, double acc[4]) {
    unsigned long long *v[3];
    long k = 0;
    int sms[1024] = {0}, nsm = 0, most = 0;
    for (int i = 0; i < 3; i++) v[i] = malloc((size_t)n * sizeof **v);
    for (long i = 0; i < n; i++)
        if (st[i].tag == tag) {
            for (int j = 0; j < 3; j++) v[j][k] = st[i].t[j];
            if (st[i].sm < 1024 && !sms[st[i].sm]++) nsm++;
            if (st[i].sm < 1024 && sms[st[i].sm] > most) most = sms[st[i].sm];
            k++;
        }
    if (k) {
        for (int j = 0; j < 3; j++) qsort(v[j], (size_t)k, sizeof **v, cmp_u64);
#define TL_AT(j, q) (((double)v[j][(size_t)((k - 1) * (q))] - (double)t0) / 1e3)
        double s0 = TL_AT(0, 0), e9 = TL_AT(2, 0.9), e1 = TL_AT(2, 1),
               gap = ((double)v[0][0] - (double)*prev_end) / 1e3;
        if (print)
            printf("       %-9s %5ld blocks on %3d SMs (<= %2d each): start %7.2f / %7.2f / %7.2f, waited "
                   "%7.2f / %7.2f, "
                   "end %7.2f / %7.2f / %7.2f / %7.2f | len %6.2f, from the last end %+6.2f, tail %5.2f us\n",
                   what, k, nsm, most, s0, TL_AT(0, 0.5), TL_AT(0, 1), TL_AT(1, 0), TL_AT(1, 1), TL_AT(2, 0),
                   TL_AT(2, 0.5), e9, e1, e1 - s0, *prev_end ? gap : 0.0, e1 - e9);
        acc[0] += e1 - s0, acc[1] += *prev_end ? gap : 0.0, acc[2] += e1 - e9, acc[3] += 1;
        *prev_end = v[2][k - 1];
#undef TL_AT
    }
    for (int i = 0; i < 3; i++) free(v[i]);
}

/* Where a decode GEMV's time goes inside a stream with PDL (issue 5): every block's start, PDL wait and end
 * (%globaltimer) over 4 layers of the 4B GEMV chain (in_proj, out_proj, gate_up, down; 0.9 GB, nothing in
 * L2) launched eagerly with PDL, at the default configuration and a few others (cu_set_gemv3_one: chunks in
 * flight / variant of the wide and the <= 8192-output matrices; none changes a bit); per launch the block
 * counts, the SMs, the ramp (first to last start), the tail (90% of the blocks done to the last) and the gap
 * from the previous launch's last block. Prints only (the arithmetic is checked above). */
TEST(cuda_gemv3_chain_timeline) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    const char *ev = getenv("CINFER_FUSE_BENCH");
    if (ev && !strcmp(ev, "0")) SKIP("CINFER_FUSE_BENCH=0: skipped");
    enum { L = 4, H = 2560, NIN = 12352, VD = 4096, I = 9216, CAP = 1 << 18 };
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    uint16_t *w[L][4];
    const int rows[4] = {NIN, H, 2 * I, H}, ks[4] = {H, VD, H, I};
    for (int l = 0; l < L; l++)
        for (int q = 0; q < 4; q++) {
            REQUIRE(cu_alloc((void **)&w[l][q], (size_t)rows[q] * ks[q] * 2, err, sizeof err) == 0);
            cu_fill_random_bf16(c, w[l][q], (size_t)rows[q] * ks[q], 0.02f, 700 + 4 * (uint64_t)l + q);
        }
    float *x, *proj, *act, *g;
    REQUIRE(cu_alloc((void **)&x, (size_t)H * 4, err, sizeof err) == 0);
    REQUIRE(cu_alloc((void **)&proj, (size_t)2 * I * 4 + (size_t)NIN * 4, err, sizeof err) == 0);
    REQUIRE(cu_alloc((void **)&act, (size_t)I * 4, err, sizeof err) == 0);
    REQUIRE(cu_alloc((void **)&g, (size_t)H * 4, err, sizeof err) == 0);
    cu_fill_f32(c, g, H, 1.0f);
    cu_fill_f32(c, x, H, 0.01f);
    cu_fill_f32(c, act, I, 0.01f);
    cu_g3_stamp *st = malloc((size_t)CAP * sizeof *st);
    REQUIRE(st);
    static const char *kind[4] = {"in_proj", "out_proj", "gate_up", "down"};
    static const struct {
        const char *what;
        int u_small, var_small, u_big, var_big, glu_nr, glu_var;
    } cfg[] = {{"default", 0, -1, 0, -1, 2, 10},
               {"gate_up variant 2 (session 6)", 0, -1, 0, -1, 2, 2},
               {"gate_up 4 rows a warp, variant 2", 0, -1, 0, -1, 4, 2},
               {"in_proj variant 10", 0, -1, 0, 10, 2, 10}};
    for (size_t ci = 0; ci < sizeof cfg / sizeof cfg[0]; ci++) {
        cu_set_pdl(1);
        cu_set_gemv3_one(cfg[ci].u_small, cfg[ci].var_small, cfg[ci].u_big, cfg[ci].var_big);
        cu_set_gemv3_glu(cfg[ci].glu_nr, cfg[ci].glu_var);
        long n = 0;
        for (int pass = 0; pass < 2; pass++) { /* the first warms up */
            REQUIRE(cu_sync(c, err, sizeof err) == 0);
            if (pass) REQUIRE(cu_gemv3_stamps_begin(c, CAP, err, sizeof err) == 0);
            for (int l = 0; l < L; l++) {
                cu_gemv_fused(c, proj, x, w[l][0], 1, NIN, H, g, 1e-6f, CU_EPI_STORE);
                cu_gemv_fused(c, x, act, w[l][1], 1, H, VD, NULL, 0.0f, CU_EPI_ADD);
                cu_gemv_fused(c, act, x, w[l][2], 1, I, H, g, 1e-6f, CU_EPI_SWIGLU);
                cu_gemv_fused(c, x, act, w[l][3], 1, H, I, NULL, 0.0f, CU_EPI_ADD);
            }
            if (pass) n = cu_gemv3_stamps_end(c, st, CAP, err, sizeof err);
        }
        cu_set_gemv3_one(0, -1, 0, -1);
        cu_set_gemv3_glu(2, 10);
        cu_set_pdl(0);
        CHECK_MSG(n > 0, "no stamps: %s", n < 0 ? err : "none recorded");
        if (n <= 0) break;
        unsigned long long t0 = ~0ull, prev = 0, tend = 0;
        for (long i = 0; i < n; i++) {
            if (st[i].t[0] < t0) t0 = st[i].t[0];
            if (st[i].t[2] > tend) tend = st[i].t[2];
        }
        printf("     %s: %ld blocks over %d launches, %.2f us first start to last end "
               "(times in us: first / 50%% / last start, first / last wait done, first / 50%% / 90%% / last "
               "end)\n",
               cfg[ci].what, n, 4 * L, (double)(tend - t0) / 1e3);
        double acc[4][4] = {{0}};
        for (int tag = 0; tag < 4 * L; tag++) {
            /* layers 0 and 2 printed; the means over every layer */
            tl_row(kind[tag % 4], tag / 4 == 0 || tag / 4 == 2, st, n, (unsigned)tag, t0, &prev,
                   acc[tag % 4]);
        }
        for (int q = 0; q < 4; q++)
            if (acc[q][3] > 0)
                printf("       mean %-9s len %6.2f us, from the last end %+6.2f, tail %5.2f\n", kind[q],
                       acc[q][0] / acc[q][3], acc[q][1] / acc[q][3], acc[q][2] / acc[q][3]);
    }
    free(st);
    for (int l = 0; l < L; l++)
        for (int q = 0; q < 4; q++) cu_free(w[l][q]);
    cu_free(x), cu_free(proj), cu_free(act), cu_free(g);
    cu_ctx_destroy(c);
}

#else

TEST(cuda_gemv3_not_built) {
    SKIP("no CUDA device: skipped (built without CUDA)");
}

#endif

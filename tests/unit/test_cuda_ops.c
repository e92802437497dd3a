/* test_cuda_ops.c — the CUDA kernels one by one against the CPU code on random inputs: f32 paths within
 * ||d|| / ||ref|| <= 1e-5, bf16-activation GEMMs within 1e-2; outputs start as NaN so an unwritten element
 * fails, as does any NaN. Without a CUDA build or device every test skips with one line. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "model/forward.h"
#include "model/forward_cuda.h"
#include "sample/sampler.h"
#include "test.h"
#include "util/bf16.h"

#ifdef CINFER_CUDA
#include "backend/cuda/cuda_ops.h"
#define CUDA_TEST_SEED 0x1234567ull /* this file's inputs as before the shared helpers */
#include "cuda_test_util.h"

#define NO_DEVICE() (cuda_devices() < 1)

TEST(cuda_gemm_vs_cpu) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    static const int Ms[] = {1, 2, 5, 8, 9, 33};
    static const int NK[][2] = {{203, 256}, {64, 72}, {37, 70}};
    for (size_t a = 0; a < sizeof NK / sizeof NK[0]; a++) {
        int N = NK[a][0], K = NK[a][1];
        uint16_t *w = malloc((size_t)N * K * 2);
        for (size_t i = 0; i < (size_t)N * K; i++) w[i] = f32_to_bf16(frand() * 0.1f);
        uint16_t *dw = dup_dev(w, (size_t)N * K * 2), *xb = NULL;
        float *tmp = NULL;
        REQUIRE(cu_alloc((void **)&xb, (size_t)2 * 64 * K * 2, err, sizeof err) == 0);
        REQUIRE(cu_alloc((void **)&tmp, (size_t)128 * N * 4, err, sizeof err) == 0);
        float *row0 = NULL;
        for (size_t b = 0; b < sizeof Ms / sizeof Ms[0]; b++) {
            int M = Ms[b];
            float *x = rnd((size_t)M * K, 1.0f), *ref = malloc((size_t)M * N * 4);
            g_rng += 7; /* x of row 0 differs per M; the row-independence check below uses its own x */
            cpu_matmul_ref(ref, x, w, WT_BF16, M, N, K);
            float *dx = dup_dev(x, (size_t)M * K * 4);
            /* mode 0: tensor cores as two accumulated products (no scratch), 1: precise (GEMV), 2: the
             * stacked hi/lo product through the scratch (<= 64 rows) */
            for (int mode = 0; mode < 3; mode++) {
                float *dy = nan_dev(c, (size_t)M * N);
                cu_set_gemm_scratch(c, mode == 2 ? tmp : NULL, mode == 2 ? (size_t)128 * N : 0);
                cu_gemm(c, dy, dx, dw, M, N, K, xb, mode == 1);
                REQUIRE(cu_sync(c, err, sizeof err) == 0);
                float *y = get(dy, (size_t)M * N);
                char what[96];
                static const char *const mn[] = {"", " precise", " stacked"};
                snprintf(what, sizeof what, "gemm M=%d N=%d K=%d%s", M, N, K, mn[mode]);
                /* the tensor-core path splits activations into bf16 hi + lo: ~2e-6 on the H200, where one
                 * bf16 rounding gave ~1.5e-3; 1e-4 fails if the split is lost */
                check_rel(what, y, ref, (size_t)M * N, (M <= CU_GEMV_MAX_M || mode == 1) ? 1e-5 : 1e-4);
                free(y);
                cu_free(dy);
            }
            cu_set_gemm_scratch(c, NULL, 0);
            free(x);
            free(ref);
            cu_free(dx);
        }
        /* a row's GEMV result does not depend on how many rows share the launch (bit for bit) */
        float *x8 = rnd((size_t)8 * K, 1.0f);
        float *dx8 = dup_dev(x8, (size_t)8 * K * 4), *dy1 = nan_dev(c, (size_t)N),
              *dy8 = nan_dev(c, (size_t)8 * N);
        cu_gemm(c, dy1, dx8, dw, 1, N, K, xb, 0);
        cu_gemm(c, dy8, dx8, dw, 8, N, K, xb, 0);
        REQUIRE(cu_sync(c, err, sizeof err) == 0);
        float *y1 = get(dy1, (size_t)N), *y8 = get(dy8, (size_t)8 * N);
        CHECK_MSG(!memcmp(y1, y8, (size_t)N * 4), "gemv N=%d K=%d: row 0 alone differs from row 0 of 8", N,
                  K);
        free(y1), free(y8), free(x8), free(row0);
        cu_free(dx8), cu_free(dy1), cu_free(dy8), cu_free(dw), cu_free(xb), cu_free(tmp);
        free(w);
    }
    cu_ctx_destroy(c);
}

/* ---- GEMV v2 (CINFER_CUDA_GEMV=v2) ---- */

typedef struct gemv_shape {
    const char *what;
    int N, K, cpu; /* cpu: also against the CPU code (weights made on the host) */
} gemv_shape;

/* mean time of one M-row GEMV of version ver over 20 eager launches, in microseconds */
static double gemv_us(cu_ctx *c, int ver, float *dy, const float *dx, const uint16_t *dw, int M, int N,
                      int K) {
    cu_timer *t;
    if (cu_timer_create(&t)) return 0;
    cu_set_gemv_version(ver);
    cu_gemm(c, dy, dx, dw, M, N, K, NULL, 1); /* warm-up */
    cu_timer_start(c, t);
    for (int i = 0; i < 20; i++) cu_gemm(c, dy, dx, dw, M, N, K, NULL, 1);
    double us = cu_timer_stop_ms(c, t) * 1e3 / 20;
    cu_timer_destroy(t);
    return us;
}

/* v2 against the CPU (small and odd shapes, and two real ones), against v1 (every shape), a row's bits the
 * same alone and among 3 or 8 rows; then at batch 1 each version's time and GB/s, the real matrices of the
 * 4B, 27B and 35B-A3B shapes (weights made on the device: random bf16) */
TEST(cuda_gemv_v2_vs_cpu_and_v1) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    static const gemv_shape shapes[] = {
        {"N=203 K=256", 203, 256, 1},
        {"N=37 K=264 (K % 256 = 8)", 37, 264, 1},
        {"N=37 K=70 (K % 8 != 0: v1)", 37, 70, 1},
        {"N=1 K=2048 (a gate)", 1, 2048, 1},
        {"4B down", 2560, 9216, 1},
        {"4B deltanet in_proj", 12352, 2560, 1},
        {"4B attention in_proj", 10240, 2560, 0},
        {"4B out_proj", 2560, 4096, 0},
        {"4B gate_up", 18432, 2560, 0},
        {"4B lm_head", 248320, 2560, 0},
        {"27B deltanet in_proj", 16480, 5120, 0},
        {"27B attention in_proj", 14336, 5120, 0},
        {"27B out_proj", 5120, 6144, 0},
        {"27B gate_up", 34816, 5120, 0},
        {"27B down", 5120, 17408, 0},
        {"35B-A3B deltanet in_proj", 12352, 2048, 0},
        {"35B-A3B attention in_proj", 9216, 2048, 0},
        {"35B-A3B out_proj", 2048, 4096, 0},
        {"35B-A3B router", 256, 2048, 0},
        {"35B-A3B shared gate_up", 1024, 2048, 0},
        {"35B-A3B shared down", 2048, 512, 0},
        {"35B-A3B lm_head", 248320, 2048, 0},
    };
    static const int Ms[] = {1, 3, 8};
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    double t1_all = 0, t2_all = 0, ta_all = 0, tap_all = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const gemv_shape *sh = &shapes[si];
        int N = sh->N, K = sh->K;
        size_t nw = (size_t)N * K;
        uint16_t *w = NULL, *dw = NULL;
        if (sh->cpu) {
            w = malloc(nw * 2);
            for (size_t i = 0; i < nw; i++) w[i] = f32_to_bf16(frand() * 0.05f);
            dw = dup_dev(w, nw * 2);
        } else {
            REQUIRE(cu_alloc((void **)&dw, nw * 2, err, sizeof err) == 0);
            cu_fill_random_bf16(c, dw, nw, 0.02f, 1000 + si);
        }
        REQUIRE(dw != NULL);
        float *x = rnd((size_t)8 * K, 1.0f), *dx = dup_dev(x, (size_t)8 * K * 4), *row0 = NULL;
        for (size_t b = 0; b < sizeof Ms / sizeof Ms[0]; b++) {
            int M = Ms[b];
            float *dy1 = nan_dev(c, (size_t)M * N), *dy2 = nan_dev(c, (size_t)M * N),
                  *dy3 = nan_dev(c, (size_t)M * N), *dy4 = nan_dev(c, (size_t)M * N);
            cu_set_gemv_version(1);
            cu_gemm(c, dy1, dx, dw, M, N, K, NULL, 1);
            cu_set_gemv_version(3); /* the split-K kernel wherever it serves */
            cu_gemm(c, dy2, dx, dw, M, N, K, NULL, 1);
            cu_set_pdl(1); /* the same kernels with programmatic dependent launch: the same bits */
            cu_gemm(c, dy3, dx, dw, M, N, K, NULL, 1);
            cu_set_gemv_version(1);
            cu_gemm(c, dy4, dx, dw, M, N, K, NULL, 1);
            cu_set_pdl(0);
            REQUIRE(cu_sync(c, err, sizeof err) == 0);
            float *y1 = get(dy1, (size_t)M * N), *y2 = get(dy2, (size_t)M * N), *y3 = get(dy3, (size_t)M * N),
                  *y4 = get(dy4, (size_t)M * N);
            CHECK_MSG(!memcmp(y2, y3, (size_t)M * N * 4), "v2 %s M=%d: with PDL differs from without",
                      sh->what, M);
            CHECK_MSG(!memcmp(y1, y4, (size_t)M * N * 4), "v1 %s M=%d: with PDL differs from without",
                      sh->what, M);
            free(y3), free(y4);
            cu_free(dy3), cu_free(dy4);
            char what[128];
            if (sh->cpu) {
                float *ref = malloc((size_t)M * N * 4);
                cpu_matmul_ref(ref, x, w, WT_BF16, M, N, K);
                snprintf(what, sizeof what, "v2 %s M=%d vs CPU", sh->what, M);
                check_rel(what, y2, ref, (size_t)M * N, 1e-5);
                free(ref);
            }
            snprintf(what, sizeof what, "v2 %s M=%d vs v1", sh->what, M);
            check_rel(what, y2, y1, (size_t)M * N, 1e-5);
            if (M == 1)
                row0 = y2, y2 = NULL;
            else
                CHECK_MSG(row0 && !memcmp(row0, y2, (size_t)N * 4),
                          "v2 %s: row 0 alone differs from row 0 of %d", sh->what, M);
            free(y1), free(y2);
            cu_free(dy1), cu_free(dy2);
        }
        float *dy = nan_dev(c, (size_t)N);
        double us1 = gemv_us(c, 1, dy, dx, dw, 1, N, K), us2 = gemv_us(c, 3, dy, dx, dw, 1, N, K),
               usa = gemv_us(c, 2, dy, dx, dw, 1, N, K);
        cu_set_pdl(1);
        double us1p = gemv_us(c, 1, dy, dx, dw, 1, N, K), us2p = gemv_us(c, 3, dy, dx, dw, 1, N, K),
               usap = gemv_us(c, 2, dy, dx, dw, 1, N, K);
        cu_set_pdl(0);
        REQUIRE(cu_sync(c, err, sizeof err) == 0);
        if (!sh->cpu || nw >= 1000000) {
            t1_all += us1, t2_all += us2, ta_all += usa, tap_all += usap;
            printf("     %-26s N=%6d K=%5d  v1 %6.1f us %4.0f GB/s  v2 %6.1f us %4.0f GB/s  +PDL: v1 %6.1f "
                   "v2 %6.1f\n",
                   sh->what, N, K, us1, nw * 2 / us1 / 1e3, us2, nw * 2 / us2 / 1e3, us1p, us2p);
        }
        cu_free(dy), cu_free(dx), cu_free(dw);
        free(x), free(w), free(row0);
    }
    /* auto: version 2, what CINFER_CUDA_GEMV=v2 runs (v2 where K >= 4096 at one row, else v1) */
    printf("     real matrices, batch 1, summed: v1 %.1f us, v2 everywhere %.1f us, auto %.1f us (%.2fx), "
           "auto + PDL "
           "%.1f us (%.2fx)\n",
           t1_all, t2_all, ta_all, t1_all / ta_all, tap_all, t1_all / tap_all);
    cu_set_gemv_version(1);
    cu_ctx_destroy(c);
}

TEST(cuda_gemv_indexed_vs_cpu) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    int E = 3, N = 48, K = 96, M = 6, div = 2, widx[6] = {2, 0, 1, 1, 0, 2};
    uint16_t *w = malloc((size_t)E * N * K * 2);
    for (size_t i = 0; i < (size_t)E * N * K; i++) w[i] = f32_to_bf16(frand() * 0.1f);
    float *x = rnd((size_t)(M / div) * K, 1.0f), *ref = malloc((size_t)M * N * 4);
    for (int m = 0; m < M; m++)
        cpu_matmul_ref(ref + (size_t)m * N, x + (size_t)(m / div) * K, w + (size_t)widx[m] * N * K, WT_BF16,
                       1, N, K);
    uint16_t *dw = dup_dev(w, (size_t)E * N * K * 2);
    float *dx = dup_dev(x, (size_t)(M / div) * K * 4), *dy = nan_dev(c, (size_t)M * N);
    int *di = dup_dev(widx, sizeof widx);
    cu_gemv_indexed(c, dy, dx, div, dw, di, M, N, K);
    REQUIRE(cu_sync(c, err, sizeof err) == 0);
    float *y = get(dy, (size_t)M * N);
    check_rel("gemv_indexed", y, ref, (size_t)M * N, 1e-5);
    free(w), free(x), free(ref), free(y);
    cu_free(dw), cu_free(dx), cu_free(dy), cu_free(di);
    cu_ctx_destroy(c);
}

TEST(cuda_row_ops_vs_cpu) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    int T = 7, H = 320, I = 200, V = 50;
    float eps = 1e-6f;
    float *x = rnd((size_t)T * H, 2.0f), *add = rnd((size_t)T * H, 1.0f), *w = rnd((size_t)H, 1.0f);
    float *xr = malloc((size_t)T * H * 4), *yr = malloc((size_t)T * H * 4);
    for (size_t i = 0; i < (size_t)T * H; i++) xr[i] = x[i] + add[i];
    for (int r = 0; r < T; r++) ops_rmsnorm(yr + (size_t)r * H, xr + (size_t)r * H, w, H, eps);
    float *dx = dup_dev(x, (size_t)T * H * 4), *dadd = dup_dev(add, (size_t)T * H * 4),
          *dw = dup_dev(w, (size_t)H * 4);
    float *dy = nan_dev(c, (size_t)T * H);
    cu_add_rmsnorm(c, dx, dadd, dy, dw, T, H, eps);
    REQUIRE(cu_sync(c, err, sizeof err) == 0);
    float *gx = get(dx, (size_t)T * H), *gy = get(dy, (size_t)T * H);
    check_rel("add+rmsnorm: residual", gx, xr, (size_t)T * H, 1e-6);
    check_rel("add+rmsnorm: normed", gy, yr, (size_t)T * H, 1e-5);
    /* gathered rows */
    int src[3] = {5, 0, 3};
    float *gr = malloc((size_t)3 * H * 4);
    for (int r = 0; r < 3; r++) ops_rmsnorm(gr + (size_t)r * H, xr + (size_t)src[r] * H, w, H, eps);
    int *dsrc = dup_dev(src, sizeof src);
    float *dg = nan_dev(c, (size_t)3 * H);
    cu_gather_rmsnorm(c, dg, dx, dsrc, dw, 3, H, eps);
    REQUIRE(cu_sync(c, err, sizeof err) == 0);
    float *gg = get(dg, (size_t)3 * H);
    check_rel("gather+rmsnorm", gg, gr, (size_t)3 * H, 1e-5);
    /* swiglu */
    float *gu = rnd((size_t)T * 2 * I, 3.0f), *sr = malloc((size_t)T * I * 4);
    for (int r = 0; r < T; r++)
        for (int i = 0; i < I; i++)
            sr[(size_t)r * I + i] = ops_silu(gu[(size_t)r * 2 * I + i]) * gu[(size_t)r * 2 * I + I + i];
    float *dgu = dup_dev(gu, (size_t)T * 2 * I * 4), *ds = nan_dev(c, (size_t)T * I);
    cu_swiglu(c, ds, dgu, T, I);
    REQUIRE(cu_sync(c, err, sizeof err) == 0);
    float *gs = get(ds, (size_t)T * I);
    check_rel("swiglu", gs, sr, (size_t)T * I, 1e-5);
    /* embedding rows are exact */
    uint16_t *E = malloc((size_t)V * H * 2);
    for (size_t i = 0; i < (size_t)V * H; i++) E[i] = f32_to_bf16(frand());
    int ids[4] = {3, 49, 0, 3};
    uint16_t *dE = dup_dev(E, (size_t)V * H * 2);
    int *dids = dup_dev(ids, sizeof ids);
    float *de = nan_dev(c, (size_t)4 * H);
    cu_embed(c, de, dE, dids, 4, H);
    REQUIRE(cu_sync(c, err, sizeof err) == 0);
    float *ge = get(de, (size_t)4 * H);
    int bad = 0;
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < H; i++) bad += ge[(size_t)r * H + i] != bf16_to_f32(E[(size_t)ids[r] * H + i]);
    CHECK_EQ_INT(bad, 0);
    free(x), free(add), free(w), free(xr), free(yr), free(gx), free(gy), free(gr), free(gg), free(gu),
        free(sr), free(gs);
    free(E), free(ge);
    cu_free(dx), cu_free(dadd), cu_free(dw), cu_free(dy), cu_free(dsrc), cu_free(dg), cu_free(dgu),
        cu_free(ds);
    cu_free(dE), cu_free(dids), cu_free(de);
    cu_ctx_destroy(c);
}

/* ---- Gated DeltaNet layer ---- */

/* The bound of the tensor-core kernels: their products split into TF32 hi + lo (tf32x3.cuh) are meant to be
 * as accurate as the f32 scalar kernel, so the bound is that kernel's own error on the same inputs times a
 * small factor, never looser than the f32 paths' 1e-5. One TF32 rounding gave ~4e-4 here (and 1e-2..3e-2 at
 * the fixtures' logits), which this fails by 40x. */
static double tc_bound(double scalar_err) {
    return 20 * scalar_err > 1e-5 ? 20 * scalar_err : 1e-5;
}

/* prefills from 0 and from ragged grid offsets (37, 60: first chunks of 27 and 4 rows), lengths not
 * multiples of 64, one-token prefills, decode tokens */
static const test_entry gdn_ents[] = {{0, 100, 0}, {37, 50, 1}, {5, 1, 2},
                                      {0, 1, 3},   {64, 1, 4},  {60, 200, 5}};
/* long prefills (16 and 11 chunks) at the decay of trained models, where the state carries hundreds of
 * tokens and an error in it travels with them */
static const test_entry gdn_long_ents[] = {{0, 1000, 0}, {300, 700, 1}, {1000, 1, 3}, {0, 1, 2}};

/* tc: also the tensor-core chunked kernel, against the CPU and against the scalar kernel on the same inputs.
 * slow: gates as trained models have them (g = A softplus(a + dt) ~ -0.001..-0.03 per token, so e^g stays
 * near 1 over a chunk and the state keeps long memory) instead of the fast decay of a in [-2, 2]. */
static void gdn_case_ex(int Hk, int Hv, int dk, int dv, int tc, const test_entry *ents, int NE, int slow) {
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    REQUIRE(cu_gdn_init(dk));
    if (tc) REQUIRE(cu_gdn_tc_init(dk));
    if (tc) REQUIRE(cu_gdn_chunk_init(dk, dv));
    int n_slots = 6, n_lin = 2, lin = 1, K = 4, kd = Hk * dk, vd = Hv * dv, C = 2 * kd + vd, T = 0;
    for (int i = 0; i < NE; i++) T += ents[i].n;
    int ld = C + 16;
    float eps = 1e-6f;
    float *qkv = rnd((size_t)T * ld, 1.0f), *z = rnd((size_t)T * vd, 2.0f), *b = rnd((size_t)T * Hv, 2.0f);
    float *a = rnd((size_t)T * Hv, 2.0f), *cw = rnd((size_t)K * C, 0.5f), *A = rnd((size_t)Hv, 1.0f);
    if (slow)
        for (size_t i = 0; i < (size_t)T * Hv; i++) a[i] = a[i] * 0.5f - 5.0f; /* softplus ~ 0.002..0.02 */
    float *dt = rnd((size_t)Hv, 0.5f), *gn = rnd((size_t)dv, 0.2f);
    for (int h = 0; h < Hv; h++) A[h] = -expf(A[h]);
    for (int j = 0; j < dv; j++) gn[j] += 1.0f;
    size_t cs_per = (size_t)(K - 1) * C, rs_per = (size_t)Hv * dk * dv;
    size_t cs_n = (size_t)n_slots * n_lin * cs_per, rs_n = (size_t)n_slots * n_lin * rs_per;
    float *cst = rnd(cs_n, 1.0f), *rst = rnd(rs_n, 0.1f);
    for (int i = 0; i < NE; i++)
        if (ents[i].len == 0) {
            memset(cst + ((size_t)ents[i].slot * n_lin + lin) * cs_per, 0, cs_per * 4);
            memset(rst + ((size_t)ents[i].slot * n_lin + lin) * rs_per, 0, rs_per * 4);
        }
    /* CPU reference */
    float *cst_r = malloc(cs_n * 4), *rst_r = malloc(rs_n * 4), *co = malloc((size_t)T * C * 4);
    float *bg = malloc((size_t)T * 2 * Hv * 4), *o_r = malloc((size_t)T * vd * 4);
    float *tmp = malloc(gdn_chunk_scratch_floats(dk, dv) * 4);
    memcpy(cst_r, cst, cs_n * 4);
    memcpy(rst_r, rst, rs_n * 4);
    for (int i = 0, r0 = 0; i < NE; r0 += ents[i].n, i++) {
        int n = ents[i].n;
        ref_conv_silu(co + (size_t)r0 * C, cst_r + ((size_t)ents[i].slot * n_lin + lin) * cs_per, cw,
                      qkv + (size_t)r0 * ld, ld, n, K, C);
        for (int t = r0; t < r0 + n; t++) {
            ref_qk_norm(co + (size_t)t * C, Hk, dk);
            for (int h = 0; h < Hv; h++) {
                bg[(size_t)t * 2 * Hv + h] = ops_sigmoid(b[(size_t)t * Hv + h]);
                bg[(size_t)t * 2 * Hv + Hv + h] = A[h] * ops_softplus(a[(size_t)t * Hv + h] + dt[h]);
            }
        }
        ref_gdn_core(co + (size_t)r0 * C, bg + (size_t)r0 * 2 * Hv,
                     rst_r + ((size_t)ents[i].slot * n_lin + lin) * rs_per, o_r + (size_t)r0 * vd, n,
                     ents[i].len, Hk, Hv, dk, dv, tmp);
        for (int t = r0; t < r0 + n; t++)
            for (int h = 0; h < Hv; h++) {
                float *oh = o_r + (size_t)t * vd + (size_t)h * dv;
                ops_rmsnorm(oh, oh, gn, dv, eps);
                for (int j = 0; j < dv; j++) oh[j] *= ops_silu(z[(size_t)t * vd + (size_t)h * dv + j]);
            }
    }
    /* device: the scalar kernel, then (tc) the tensor-core ones from the same inputs */
    cu_meta meta;
    int *dmeta;
    int *hm = pack_meta(ents, NE, NULL, &meta, &dmeta);
    float *prev_o = NULL, *prev_r = NULL;
    double err_o = 0, err_r = 0; /* the scalar kernel's error: the tensor cores' bound follows from it */
    double *err_h = calloc((size_t)NE * Hv, sizeof(double)); /* its error per (entry, head) state */
    float *conv0 = NULL, *win0 = NULL;                       /* mode 0's conv rows and windows */
    /* mode 0: the scalar kernel; 1: the phased kernels (deltanet_chunk.cu) in their WMMA form ("stage"); 2:
     * that with one TF32 rounding (the form that failed the model parity), which must fail the bound: the
     * bound can catch what it is for; 3: the mma.sync form (the default: Dekker's split, its own order of
     * the inverse's sums), within the bound against the CPU and against "stage"; 4: mma6 on the image scratch
     * by bulk copies (chunk_dt 2, "img"), which must give mma6's bits. (Session 5's other phased forms, which
     * gave stage's or the default's bits, and session 6's "mma6g", are deleted.) */
    for (int mode = 0; mode <= (tc ? 4 : 0); mode++) {
        int phased = mode >= 1, control = mode == 2;
        cu_gdn_args g = {0};
        g.T = T, g.NE = NE, g.Hk = Hk, g.Hv = Hv, g.dk = dk, g.dv = dv, g.K = K, g.C = C, g.n_lin = n_lin,
        g.lin = lin;
        g.qkv = dup_dev(qkv, (size_t)T * ld * 4), g.qkv_ld = ld, g.z = dup_dev(z, (size_t)T * vd * 4),
        g.z_ld = vd;
        g.b = dup_dev(b, (size_t)T * Hv * 4), g.a = dup_dev(a, (size_t)T * Hv * 4), g.ba_ld = Hv;
        g.conv_w = dup_dev(cw, (size_t)K * C * 4), g.A = dup_dev(A, (size_t)Hv * 4),
        g.dt_bias = dup_dev(dt, (size_t)Hv * 4);
        g.gnorm = dup_dev(gn, (size_t)dv * 4), g.conv_out = nan_dev(c, (size_t)T * C),
        g.bg = nan_dev(c, (size_t)T * 2 * Hv);
        g.o = nan_dev(c, (size_t)T * vd), g.conv_state = dup_dev(cst, cs_n * 4),
        g.rec_state = dup_dev(rst, rs_n * 4);
        g.eps = eps, g.meta = meta, g.tc = phased ? 2 : 0;
        if (phased) { /* the scratch starts as NaN: nothing may read what the kernels did not write */
            g.chunk_cap = cu_gdn_chunk_cap(T, NE), g.chunk_dt = mode == 4 ? 2 : mode == 3 ? 1 : 0;
            g.chunk_scr = nan_dev(c, cu_gdn_chunk_bytes(g.chunk_cap, T, Hv, dk, dv) / 4);
        }
        cu_set_tf32_passes(control ? 1 : 3);
        cu_gdn_layer(c, &g);
        cu_set_tf32_passes(3);
        REQUIRE(cu_sync(c, err, sizeof err) == 0);
        float *go = get(g.o, (size_t)T * vd), *gc = get(g.conv_state, cs_n), *gr = get(g.rec_state, rs_n);
        /* the conv (a thread per channel, or per (row, channel) with the phased prefill) and the q/k norms:
         * the same bits in every mode */
        float *gx = get(g.conv_out, (size_t)T * C);
        if (!mode) {
            conv0 = gx, win0 = malloc(cs_n * 4);
            memcpy(win0, gc, cs_n * 4);
        } else {
            CHECK_MSG(!memcmp(gx, conv0, (size_t)T * C * 4), "deltanet dk=%d dv=%d mode %d: conv rows differ",
                      dk, dv, mode);
            CHECK_MSG(!memcmp(gc, win0, cs_n * 4), "deltanet dk=%d dv=%d mode %d: conv windows differ", dk,
                      dv, mode);
            free(gx);
        }
        const char *kind = !mode       ? "scalar"
                           : mode == 4 ? "phased/img"
                           : mode == 3 ? "phased/mma6"
                                       : "phased/staged";
        if (phased) { /* the phased kernels ran (not the fallback): they wrote W of the first chunk */
            float *w0 = get((const float *)g.chunk_scr, 1);
            CHECK_MSG(isfinite(w0[0]), "deltanet dk=%d dv=%d %s: the phased kernels did not run", dk, dv,
                      kind);
            free(w0);
        }
        /* the slots' other layer and the slots no entry uses keep their bits */
        for (int sl = 0; sl < n_slots; sl++)
            for (int l = 0; l < n_lin; l++) {
                int used = 0;
                for (int i = 0; i < NE; i++) used |= ents[i].slot == sl;
                if (used && l == lin) continue;
                size_t off = ((size_t)sl * n_lin + l) * rs_per;
                CHECK_MSG(!memcmp(gr + off, rst + off, rs_per * 4),
                          "deltanet dk=%d dv=%d %s: slot %d layer %d written", dk, dv, kind, sl, l);
            }
        if (control) {
            double r = rel(go, o_r, (size_t)T * vd);
            printf("     deltanet dk=%d dv=%d%s %s, one TF32 rounding (control): %.2e > %.0e?\n", dk, dv,
                   slow ? " slow" : "", kind, r, tc_bound(err_o));
            CHECK_MSG(r > tc_bound(err_o),
                      "deltanet dk=%d dv=%d %s: one TF32 rounding passes the bound (%.3g)", dk, dv, kind, r);
            free(go), free(gc), free(gr);
            go = gc = gr = NULL;
        }
        /* scalar: the f32 paths' bound; tensor cores: the scalar kernel's error x 20 (tc_bound) */
        if (go) {
            double tol_o = mode ? tc_bound(err_o) : 1e-5, tol_r = mode ? tc_bound(err_r) : 1e-5;
            char what[128];
            snprintf(what, sizeof what, "deltanet dk=%d dv=%d%s %s: output", dk, dv, slow ? " slow" : "",
                     kind);
            if (!mode) err_o = rel(go, o_r, (size_t)T * vd);
            check_rel(what, go, o_r, (size_t)T * vd, tol_o);
            snprintf(what, sizeof what, "deltanet dk=%d dv=%d %s: conv windows", dk, dv, kind);
            check_rel(what, gc, cst_r, cs_n, 1e-6);
            snprintf(what, sizeof what, "deltanet dk=%d dv=%d%s %s: recurrent states", dk, dv,
                     slow ? " slow" : "", kind);
            if (!mode) err_r = rel(gr, rst_r, rs_n);
            check_rel(what, gr, rst_r, rs_n, tol_r);
            /* per entry, so a wrong form for one kind of entry cannot hide in the total */
            for (int i = 0, r0 = 0; i < NE; r0 += ents[i].n, i++) {
                snprintf(what, sizeof what, "  entry len=%d n=%d output", ents[i].len, ents[i].n);
                check_rel(what, go + (size_t)r0 * vd, o_r + (size_t)r0 * vd, (size_t)ents[i].n * vd,
                          mode ? tc_bound(err_o) : 1e-5);
            }
            /* every head's state of every entry (a head left unwritten or written with another's state
             * cannot hide in the total): within 20x the scalar kernel's error on that head */
            double worst = 0;
            int bad = 0;
            for (int i = 0; i < NE; i++)
                for (int h = 0; h < Hv; h++) {
                    size_t off = ((size_t)ents[i].slot * n_lin + lin) * rs_per + (size_t)h * dk * dv;
                    double rh = rel(gr + off, rst_r + off, (size_t)dk * dv);
                    if (!mode) {
                        err_h[(size_t)i * Hv + h] = rh;
                        continue;
                    }
                    double bh = tc_bound(err_h[(size_t)i * Hv + h]);
                    if (rh / bh > worst) worst = rh / bh;
                    if (!(rh <= bh)) {
                        if (bad++ < 4)
                            printf("     entry %d (len=%d n=%d) head %d state: %.2e > %.0e\n", i, ents[i].len,
                                   ents[i].n, h, rh, bh);
                    }
                }
            if (mode) {
                printf("     %s: %d entries x %d heads' states, worst error / bound %.2f\n", kind, NE, Hv,
                       worst);
                CHECK_MSG(!bad, "deltanet dk=%d dv=%d %s: %d head states past their bound", dk, dv, kind,
                          bad);
            }
            if (mode) {
                snprintf(what, sizeof what, "deltanet dk=%d dv=%d %s vs previous kernel: output", dk, dv,
                         kind);
                check_rel(what, go, prev_o, (size_t)T * vd, tc_bound(err_o));
                snprintf(what, sizeof what, "deltanet dk=%d dv=%d %s vs previous kernel: states", dk, dv,
                         kind);
                check_rel(what, gr, prev_r, rs_n, tc_bound(err_r));
            }
            if (mode == 3) /* mma.sync m16n8k8 for WMMA's m16n16k8, Dekker's split: said */
                printf("     %s vs the previous form: output %s, states %s\n", kind,
                       memcmp(go, prev_o, (size_t)T * vd * 4) ? "differ" : "bit-identical",
                       memcmp(gr, prev_r, rs_n * 4) ? "differ" : "bit-identical");
            if (mode == 4) { /* the same bytes staged another way: mma6's bits */
                int so = !memcmp(go, prev_o, (size_t)T * vd * 4), sr = !memcmp(gr, prev_r, rs_n * 4);
                printf("     %s vs phased/mma6: output %s, states %s\n", kind,
                       so ? "bit-identical" : "DIFFER", sr ? "bit-identical" : "DIFFER");
                CHECK_MSG(so && sr, "deltanet dk=%d dv=%d: the image staging changed the bits", dk, dv);
            }
            free(prev_o), free(prev_r), free(gc);
            prev_o = go, prev_r = gr;
        }
        cu_free((void *)g.qkv), cu_free((void *)g.z), cu_free((void *)g.b), cu_free((void *)g.a),
            cu_free((void *)g.conv_w);
        cu_free((void *)g.A), cu_free((void *)g.dt_bias), cu_free((void *)g.gnorm), cu_free(g.conv_out),
            cu_free(g.bg);
        cu_free(g.o), cu_free(g.conv_state), cu_free(g.rec_state), cu_free(g.chunk_scr);
    }
    free(err_h), free(conv0), free(win0);
    free(prev_o), free(prev_r);
    free(qkv), free(z), free(b), free(a), free(cw), free(A), free(dt), free(gn), free(cst), free(rst),
        free(cst_r), free(rst_r);
    free(co), free(bg), free(o_r), free(tmp), free(hm);
    cu_free(dmeta);
    cu_ctx_destroy(c);
}

static void gdn_case(int Hk, int Hv, int dk, int dv, int tc) {
    gdn_case_ex(Hk, Hv, dk, dv, tc, gdn_ents, (int)(sizeof gdn_ents / sizeof gdn_ents[0]), 0);
}

TEST(cuda_deltanet_layer_vs_cpu) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    gdn_case(2, 4, 32, 32, 0);
    gdn_case(2, 4, 128, 128, 0); /* the real head dims: the chunked kernel's shared memory near its limit */
}

/* the tensor-core chunked kernels (CINFER_CUDA_PREFILL=tc|gdn, the default: phased):
 * GQA ratios 1, 2, 3, dv not a multiple of the 32-column block, the real dk = dv = 128 */
TEST(cuda_deltanet_tc_vs_cpu) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    gdn_case(2, 4, 32, 32, 1);
    gdn_case(2, 4, 32, 16, 1); /* the dense fixture's dv: one 16-column tile */
    gdn_case(1, 3, 64, 48, 1);
    gdn_case(2, 2, 128, 128, 1);
    gdn_case(2, 4, 128, 128, 1);
}

/* the same at the model's scales: long prefills (1000 and 700 tokens after 300) with trained-model decay, the
 * real dk = dv = 128 (Qwen3.5: 16 key heads, 32 value heads; here 2 and 4) */
TEST(cuda_long_deltanet_tc_vs_cpu) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    int ne = (int)(sizeof gdn_long_ents / sizeof gdn_long_ents[0]);
    gdn_case_ex(2, 4, 128, 128, 1, gdn_long_ents, ne, 1);
    gdn_case_ex(2, 4, 128, 128, 1, gdn_long_ents, ne, 0);
}

/* the 4B shape's heads (16 key, 32 value heads of 128) over one 4096-token prefill, the chunk the bench
 * measures: 64 chunks in the phased form's tables, the state carried through all of them (trained decay) */
TEST(cuda_long_deltanet_tc_4b_4096) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    static const test_entry e[] = {{0, 4096, 0}};
    gdn_case_ex(16, 32, 128, 128, 1, e, 1, 1);
}

/* the 27B shape's heads (16 key, 48 value heads: GQA 3) over entries of different lengths in one batch: a
 * prompt from 0, one continuing mid-chunk (at 100: first chunk of 28 rows), one continuing on the grid, a
 * decode token, a one-token prompt and a long continuation starting 5 rows before the grid */
TEST(cuda_deltanet_tc_27b_heads) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    static const test_entry e[] = {{0, 300, 0}, {100, 200, 1}, {64, 64, 2},
                                   {7, 1, 3},   {0, 1, 4},     {955, 517, 5}};
    gdn_case_ex(16, 48, 128, 128, 1, e, 6, 1);
}

/* Device time of one DeltaNet layer over a 4096-token prefill at the 4B and 27B heads, per form of the
 * chunked prefill (printed, for the figures: the bench's profile only has the whole "deltanet core"); "conv +
 * prep + norm" is the layer without the chunked part (conv per channel), "scalar, conv by rows" the scalar
 * form after the phased path's conv (its scratch absent: the fallback), so the two conv forms' cost shows
 * as a difference. The mma.sync form must be within 1e-5 of the staged one here too. */
static void gdn_speed(int Hk, int Hv) {
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    int dk = 128, dv = 128, T = 4096, vd = Hv * dv;
    REQUIRE(cu_gdn_init(dk) && cu_gdn_tc_init(dk) && cu_gdn_chunk_init(dk, dv));
    gdn_bench gb;
    gdn_bench_make(c, &gb, Hk, Hv, T);
    cu_gdn_args g = gb.g; /* gb's pointers; the forms below set its switches */
    float *zero = gb.zero, *scr = gb.scr;
    size_t rs_n = gb.rs_n, cs_n = gb.cs_n;
    static const struct {
        const char *name;
        int tc, dt, no_chunked, scr;
    } forms[] = {{"conv + prep + norm", 0, 0, 1, 0},   {"scalar", 0, 0, 0, 0},
                 {"scalar, conv by rows", 2, 0, 0, 0}, {"phased/staged", 2, 0, 0, 1},
                 {"phased/mma6", 2, 1, 0, 1},          {"phased/img", 2, 2, 0, 1}};
    cu_timer *tm;
    REQUIRE(cu_timer_create(&tm) == 0);
    float *o0 = NULL; /* the staged form's output */
    for (size_t f = 0; f < sizeof forms / sizeof forms[0]; f++) {
        g.tc = forms[f].tc, g.chunk_dt = forms[f].dt, g.no_chunked = forms[f].no_chunked;
        g.chunk_scr = forms[f].scr ? scr : NULL, g.chunk_cap = forms[f].scr ? cu_gdn_chunk_cap(T, 1) : 0;
        float best = 1e30f;
        for (int rep = 0; rep < 4; rep++) {
            REQUIRE(cu_upload(g.rec_state, zero, rs_n * 4, err, sizeof err) == 0);
            REQUIRE(cu_upload(g.conv_state, zero, cs_n * 4, err, sizeof err) == 0);
            cu_timer_start(c, tm);
            cu_gdn_layer(c, &g);
            float ms = cu_timer_stop_ms(c, tm);
            if (rep && ms < best) best = ms; /* the first is a warm-up */
        }
        REQUIRE(cu_sync(c, err, sizeof err) == 0);
        printf("     Hk %d Hv %d, 4096 rows: %-26s %8.3f ms\n", Hk, Hv, forms[f].name, best);
        if (forms[f].scr) {
            float *go = get(g.o, (size_t)T * vd);
            if (!o0) {
                o0 = go;
            } else { /* the same sums on mma.sync: within the tensor-core bound */
                double r = rel(go, o0, (size_t)T * vd);
                printf("     %-44s vs phased/staged: %s (%.2e)\n", "", r == 0 ? "bit-identical" : "differ",
                       r);
                CHECK_MSG(r <= 1e-5, "%s: %.3g from phased/staged", forms[f].name, r);
                free(go);
            }
        }
        if (forms[f].scr) { /* its two parts alone, on the conv and gates this run left (after
                             * the bits are read: they move the state on) */
            float part[2];
            REQUIRE(gdn_part_ms(c, tm, &g, 3, part) == 0);
            printf("     %-44s prep %.3f ms, sequential pass %.3f ms\n", "", part[0], part[1]);
        }
        if (forms[f].scr) { /* where the cycles of one block of each go */
            long long hp[16];
            REQUIRE(gdn_chunk_stamps(c, &g, hp) == 0);
            printf("     prep block, cycles: loads %lld, gates %lld, A and QK %lld, mask %lld, inverse %lld, "
                   "scale + V %lld, W and U %lld\n",
                   hp[0], hp[1], hp[2], hp[3], hp[4], hp[5], hp[6]);
            long long nch = hp[15] > 0 ? hp[15] : 1;
            printf("     staged pass, cycles per chunk (%lld chunks): wait W/Qg/U %lld, D and QgS %lld, wait "
                   "QK/Kf "
                   "%lld, O and S %lld, O out %lld\n",
                   hp[15], hp[8] / nch, hp[9] / nch, hp[10] / nch, hp[11] / nch, hp[12] / nch);
        }
    }
    cu_timer_destroy(tm);
    free(o0);
    gdn_bench_free(&gb);
    cu_ctx_destroy(c);
}

TEST(cuda_deltanet_prefill_speed) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    gdn_speed(16, 32); /* 4B */
    gdn_speed(16, 48); /* 27B */
}

TEST(cuda_next_split) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    int T = 3, Hk = 2, Hv = 4, dk = 8, dv = 8, rr = Hv / Hk, kd = Hk * dk, vd = Hv * dv, C = 2 * kd + vd;
    int ld = 2 * kd + 2 * vd + 2 * Hv;
    float *in = rnd((size_t)T * ld, 1.0f);
    float *q = malloc((size_t)T * C * 4), *z = malloc((size_t)T * vd * 4), *b = malloc((size_t)T * Hv * 4),
          *a = malloc((size_t)T * Hv * 4);
    for (int r = 0; r < T; r++) {
        const float *s = in + (size_t)r * ld;
        int grp = 2 * dk + 2 * rr * dv;
        for (int g = 0; g < Hk; g++) {
            memcpy(q + (size_t)r * C + g * dk, s + g * grp, dk * 4);
            memcpy(q + (size_t)r * C + kd + g * dk, s + g * grp + dk, dk * 4);
            memcpy(q + (size_t)r * C + 2 * kd + g * rr * dv, s + g * grp + 2 * dk, (size_t)rr * dv * 4);
            memcpy(z + (size_t)r * vd + g * rr * dv, s + g * grp + 2 * dk + rr * dv, (size_t)rr * dv * 4);
            for (int j = 0; j < rr; j++) {
                b[r * Hv + g * rr + j] = s[Hk * grp + g * 2 * rr + j];
                a[r * Hv + g * rr + j] = s[Hk * grp + g * 2 * rr + rr + j];
            }
        }
    }
    float *din = dup_dev(in, (size_t)T * ld * 4), *dq = nan_dev(c, (size_t)T * C),
          *dz = nan_dev(c, (size_t)T * vd);
    float *db = nan_dev(c, (size_t)T * Hv), *da = nan_dev(c, (size_t)T * Hv);
    cu_next_split(c, din, ld, dq, dz, db, da, T, Hk, Hv, dk, dv);
    REQUIRE(cu_sync(c, err, sizeof err) == 0);
    float *gq = get(dq, (size_t)T * C), *gz = get(dz, (size_t)T * vd), *gb = get(db, (size_t)T * Hv),
          *ga = get(da, (size_t)T * Hv);
    CHECK(!memcmp(gq, q, (size_t)T * C * 4) && !memcmp(gz, z, (size_t)T * vd * 4));
    CHECK(!memcmp(gb, b, (size_t)T * Hv * 4) && !memcmp(ga, a, (size_t)T * Hv * 4));
    free(in), free(q), free(z), free(b), free(a), free(gq), free(gz), free(gb), free(ga);
    cu_free(din), cu_free(dq), cu_free(dz), cu_free(db), cu_free(da);
    cu_ctx_destroy(c);
}

/* ---- gated attention layer ---- */

static void rope_ref(float *x, int R, int pos, const float *inv) {
    for (int i = 0; i < R / 2; i++) {
        float ang = (float)pos * inv[i], cs = cosf(ang), sn = sinf(ang), p = x[i], q = x[i + R / 2];
        x[i] = p * cs - q * sn;
        x[i + R / 2] = q * cs + p * sn;
    }
}

/* prefills of several tiles from 0 and from offsets off the 16- and 32-grids, decode rows, short runs */
static const test_entry attn_ents[] = {{0, 40, 0},  {20, 1, 0},  {100, 3, 0},
                                       {300, 1, 0}, {70, 45, 0}, {33, 70, 0}};
/* long prefills: 600 rows from 0, 300 rows after 500 */
static const test_entry attn_long_ents[] = {{0, 600, 0}, {500, 300, 0}, {900, 1, 0}};

/* > 0: the untiled cases run attn_dec_kernel (cu_attn_args.dec_nsmax) with at most this many spans a row */
static int g_dec_ns = 0;
/* with g_dec_ns: rows at positions >= g_dec_p take attn_dec_kernel, the others attn_kernel (its spans from
 * each row's position: cu_attn_row_span), both launched when a batch holds both (cu_attn_args.dec_p); 0:
 * every row the dec kernel */
static int g_dec_p = 0;

/* 1: the tensor-core cases also run the fast form (cu_attn_args.fast: fp16 operands, one MMA a product) */
static int g_fast = 0;
/* the bound of the fast form against the f64 reference: bf16-level (one fp16 rounding measures ~1e-3) */
#define FAST_BOUND 1e-2

/* the two kernels' grids and classes as forward_cuda's attn_split sets them for rows at minpos..maxpos
 * (g_dec_p > 0); the dec kernel's span (its stages) stays span */
static void dec_p_grids(cu_attn_args *a, int span, int minpos, int maxpos) {
    int P = g_dec_p;
    a->dec_p = P, a->dec_cls = (minpos < P) | (maxpos >= P) << 1, a->dec_span = span;
    a->dec_nsplit = maxpos >= P ? cu_attn_dec_grid(maxpos, g_dec_ns) : 0;
    a->span = 64, a->nsplit = minpos < P ? cu_attn_row_grid(maxpos < P - 1 ? maxpos : P - 1) : 0;
}

/* Each entry of a's batch launched alone gives the bits it has in the batch (ob [T][Hq hd]): a row's
 * arithmetic must not depend on which rows share its launch or its tile (the key tiles sit on a fixed grid),
 * nor a decode row's spans on anything but its own position. The entry's own launch: tiles of tcr rows (tcr >
 * 0; with a's kv16, its own blocks of the pre-pass), else the decode kernel's grid of spans (g_dec_ns,
 * g_dec_p, span). Prints one line; each differing entry fails the test. */
static void alone_vs_batch(cu_ctx *c, const cu_attn_args *a, const float *qkv, int ld, const test_entry *ents,
                           int NE, int *const *tables, const float *ob, int tcr, int span, const char *form) {
    const int Hq = a->Hq, hd = a->hd;
    char err[256];
    int same = 1;
    for (int i = 0, r0 = 0; i < NE; r0 += ents[i].n, i++) {
        cu_meta m1;
        int *dm1, n = ents[i].n, nt1 = 0;
        int *hm1 = pack_meta(&ents[i], 1, &tables[i], &m1, &dm1), *ht1 = malloc(((size_t)n + 1) * 4);
        cu_attn_args b = *a;
        b.T = n, b.meta = m1;
        if (tcr > 0) {
            for (int t = 0; t < n; t += tcr) ht1[nt1++] = t;
            b.n_tiles = nt1, b.tiles = dup_dev(ht1, (size_t)nt1 * 4);
            if (b.kv16) b.kv16_NE = 1, b.kv16_nb = (ents[i].len + n + 15) / 16;
        } else {
            b.nsplit = cu_attn_dec_grid(ents[i].len + n - 1, g_dec_ns);
            if (g_dec_p > 0) dec_p_grids(&b, span, ents[i].len, ents[i].len + n - 1);
        }
        b.qkv = dup_dev(qkv + (size_t)r0 * ld, (size_t)n * ld * 4);
        b.o = nan_dev(c, (size_t)n * Hq * hd);
        cu_attn_layer(c, &b);
        REQUIRE(cu_sync(c, err, sizeof err) == 0);
        float *g1 = get(b.o, (size_t)n * Hq * hd);
        if (memcmp(g1, ob + (size_t)r0 * Hq * hd, (size_t)n * Hq * hd * 4)) {
            same = 0;
            CHECK_MSG(0, "attention %s hd=%d: entry len=%d n=%d alone differs from in the batch", form, hd,
                      ents[i].len, n);
        }
        free(g1), free(hm1), free(ht1);
        cu_free(dm1), cu_free(b.qkv), cu_free(b.o);
        if (tcr > 0) cu_free((void *)b.tiles);
    }
    printf("     %s: each entry alone vs in the batch: %s\n", form, same ? "bit-identical" : "DIFFERENT");
}

/* The fast form from the same inputs as a (the tensor-core tiles' launch just run; the prep rewrites the same
 * K / V rows): against the f64 reference o_r, per entry, and each entry alone bit for bit as in the batch.
 * Its K / V images start as NaN, as do the outputs. */
static void attn_fast_check(cu_ctx *c, const cu_attn_args *a, const float *qkv, int ld,
                            const test_entry *ents, int NE, int **tables, const float *o_r, int tcr) {
    char err[256], what[128];
    const int T = a->T, Hq = a->Hq, hd = a->hd;
    const size_t kvb = cu_attn_kv16_bytes(a->n_blocks, a->Hkv, hd);
    REQUIRE(cu_attn_fast_ok(hd));
    int nbmax = 0;
    for (int i = 0; i < NE; i++)
        if ((ents[i].len + ents[i].n + 15) / 16 > nbmax) nbmax = (ents[i].len + ents[i].n + 15) / 16;
    cu_attn_args b = *a;
    b.qkv = dup_dev(qkv, (size_t)T * ld * 4), b.o = nan_dev(c, (size_t)T * Hq * hd);
    REQUIRE(cu_alloc((void **)&b.kv16, kvb, err, sizeof err) == 0);
    cu_fill_f32(c, (float *)b.kv16, kvb / 4, NAN);
    b.kv16_NE = NE, b.kv16_nb = nbmax, b.fast = 1;
    cu_attn_layer(c, &b);
    REQUIRE(cu_sync(c, err, sizeof err) == 0);
    float *gf = get(b.o, (size_t)T * Hq * hd);
    snprintf(what, sizeof what, "attention Hq=%d Hkv=%d hd=%d fast (fp16 x1): output", Hq, a->Hkv, hd);
    check_rel(what, gf, o_r, (size_t)T * Hq * hd, FAST_BOUND);
    for (int i = 0, r0 = 0; i < NE; r0 += ents[i].n, i++) {
        snprintf(what, sizeof what, "  fast: entry len=%d n=%d output", ents[i].len, ents[i].n);
        check_rel(what, gf + (size_t)r0 * Hq * hd, o_r + (size_t)r0 * Hq * hd, (size_t)ents[i].n * Hq * hd,
                  FAST_BOUND);
    }
    alone_vs_batch(c, &b, qkv, ld, ents, NE, tables, gf, tcr, 0, "fast");
    free(gf);
    cu_free(b.qkv), cu_free(b.o), cu_free(b.kv16);
}

/* tiled: 0 a block per (row, head[, span]); 1 the prefill tiles; 2 the prefill tiles by the scalar kernel,
 * then on the tensor cores from the same inputs (against the CPU and against the scalar tiles).
 * gain: q_norm / k_norm weights scaled by it (scores gain^2 larger: the peaked softmax of trained models) */
static void attn_case_ex(int Hq, int Hkv, int hd, int span, int tiled, const test_entry *ents, int NE,
                         float gain) {
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    int T = 0, n_full = 2, full = 1, R = hd / 4, kvd = Hkv * hd, ld = Hq * 2 * hd + 2 * kvd + 8, g = 0;
    int n_blocks = 64; /* a power of two: the scattered order below is a permutation */
    for (int i = 0; i < NE; i++) g += (ents[i].len + ents[i].n + 15) / 16;
    while (n_blocks < g) n_blocks *= 2;
    for (int i = 0; i < NE; i++) T += ents[i].n;
    float eps = 1e-6f;
    /* block tables: entries take blocks in a scattered order */
    int **tables = malloc((size_t)NE * sizeof(int *));
    g = 0;
    for (int i = 0; i < NE; i++) {
        int k = (ents[i].len + ents[i].n + 15) / 16;
        tables[i] = malloc((size_t)k * sizeof(int));
        for (int j = 0; j < k; j++, g++)
            tables[i][j] = (g * 5 + 3) % n_blocks; /* a permutation: 5 is prime to 2^k */
    }
    size_t pool_n = (size_t)n_full * n_blocks * 16 * kvd;
    float *kp = rnd(pool_n, 1.0f), *vp = rnd(pool_n, 1.0f), *qkv = rnd((size_t)T * ld, 1.0f);
    float *qn = rnd((size_t)hd, 0.3f), *kn = rnd((size_t)hd, 0.3f), *inv = malloc((size_t)R / 2 * 4);
    for (int i = 0; i < hd; i++) qn[i] = (qn[i] + 1.0f) * gain, kn[i] = (kn[i] + 1.0f) * gain;
    for (int j = 0; j < R / 2; j++) inv[j] = 1.0f / (float)pow(1e7, (double)((float)(2 * j) / (float)R));
    float *kp_r = malloc(pool_n * 4), *vp_r = malloc(pool_n * 4), *q_r = malloc((size_t)T * Hq * hd * 4);
    float *o_r = malloc((size_t)T * Hq * hd * 4);
    memcpy(kp_r, kp, pool_n * 4);
    memcpy(vp_r, vp, pool_n * 4);
#define KROW(P, i, pos) (P + (((size_t)full * n_blocks + tables[i][(pos) / 16]) * 16 + (pos) % 16) * kvd)
    for (int i = 0, r = 0; i < NE; i++)
        for (int t = 0; t < ents[i].n; t++, r++) {
            int pos = ents[i].len + t;
            const float *row = qkv + (size_t)r * ld;
            for (int h = 0; h < Hq; h++) {
                float *q = q_r + ((size_t)r * Hq + h) * hd;
                ops_rmsnorm(q, row + (size_t)h * 2 * hd, qn, hd, eps);
                rope_ref(q, R, pos, inv);
            }
            for (int h = 0; h < Hkv; h++) {
                float *k = KROW(kp_r, i, pos) + (size_t)h * hd;
                ops_rmsnorm(k, row + (size_t)Hq * 2 * hd + (size_t)h * hd, kn, hd, eps);
                rope_ref(k, R, pos, inv);
            }
            memcpy(KROW(vp_r, i, pos), row + (size_t)Hq * 2 * hd + kvd, (size_t)kvd * 4);
        }
    for (int i = 0, r = 0; i < NE; i++)
        for (int t = 0; t < ents[i].n; t++, r++) {
            int pos = ents[i].len + t;
            for (int h = 0; h < Hq; h++) {
                int kvh = h / (Hq / Hkv);
                const float *q = q_r + ((size_t)r * Hq + h) * hd,
                            *gate = qkv + (size_t)r * ld + (size_t)h * 2 * hd + hd;
                double *sc = malloc((size_t)(pos + 1) * sizeof(double)), mx = -1e300, sum = 0;
                for (int u = 0; u <= pos; u++) {
                    const float *k = KROW(kp_r, i, u) + (size_t)kvh * hd;
                    double s = 0;
                    for (int d = 0; d < hd; d++) s += (double)q[d] * k[d];
                    sc[u] = s / sqrt((double)hd);
                    mx = sc[u] > mx ? sc[u] : mx;
                }
                for (int u = 0; u <= pos; u++) sum += (sc[u] = exp(sc[u] - mx));
                for (int d = 0; d < hd; d++) {
                    double o = 0;
                    for (int u = 0; u <= pos; u++) o += sc[u] / sum * KROW(vp_r, i, u)[(size_t)kvh * hd + d];
                    o_r[((size_t)r * Hq + h) * hd + d] = (float)(o * (1.0 / (1.0 + exp(-(double)gate[d]))));
                }
                free(sc);
            }
        }
    cu_meta meta;
    int *dmeta;
    int *hm = pack_meta(ents, NE, tables, &meta, &dmeta);
    int maxpos = 0;
    for (int i = 0; i < NE; i++)
        maxpos = ents[i].len + ents[i].n - 1 > maxpos ? ents[i].len + ents[i].n - 1 : maxpos;
    /* tiles of CU_ATTN_TILE rows for the scalar kernel, of cu_attn_tc_rows for the tensor cores */
    int *htiles = malloc(((size_t)T / CU_ATTN_TILE + NE + 1) * sizeof(int)), nt = 0, *dtiles = NULL;
    int *htc = malloc(((size_t)T / CU_ATTN_TILE + NE + 1) * sizeof(int)), ntc = 0, *dtc = NULL;
    int tcr = cu_attn_tc_rows(Hq, Hkv);
    for (int i = 0, r = 0; i < NE; r += ents[i].n, i++) {
        for (int t = 0; t < ents[i].n; t += CU_ATTN_TILE) htiles[nt++] = r + t;
        for (int t = 0; t < ents[i].n; t += tcr) htc[ntc++] = r + t;
    }
    if (tiled) {
        REQUIRE(cu_attn_init(hd));
        dtiles = dup_dev(htiles, sizeof(int) * (size_t)nt);
    }
    if (tiled == 2) {
        REQUIRE(cu_attn_tc_init(hd));
        dtc = dup_dev(htc, sizeof(int) * (size_t)ntc);
    }
    float *prev = NULL;
    double err_tiles = 0; /* the scalar tiles' error: the tensor cores' bound follows from it */
    /* mode 0: the tiles' scalar kernel (or the decode form); 1: the tensor cores (fp16 hi + lo operands); 2:
     * the tensor cores with one fp16 rounding, which must fail the bound: the bound can catch what it is for
     */
    for (int mode = 0; mode <= (tiled == 2 ? 2 : 0); mode++) {
        cu_attn_args a = {0};
        a.T = T, a.Hq = Hq, a.Hkv = Hkv, a.hd = hd, a.rope_dim = R, a.n_blocks = n_blocks, a.full = full;
        a.qkv = dup_dev(qkv, (size_t)T * ld * 4), a.ld = ld, a.q_norm = dup_dev(qn, (size_t)hd * 4),
        a.k_norm = dup_dev(kn, (size_t)hd * 4);
        a.inv_freq = dup_dev(inv, (size_t)R / 2 * 4), a.kpool = dup_dev(kp, pool_n * 4),
        a.vpool = dup_dev(vp, pool_n * 4);
        a.o = nan_dev(c, (size_t)T * Hq * hd);
        a.span = span, a.nsplit = (maxpos + span) / span;
        if (g_dec_ns && !tiled) a.dec_nsmax = g_dec_ns, a.nsplit = cu_attn_dec_grid(maxpos, g_dec_ns);
        int minpos = maxpos;
        for (int i = 0; i < NE; i++) minpos = ents[i].len < minpos ? ents[i].len : minpos;
        if (g_dec_ns && !tiled && g_dec_p > 0) {
            dec_p_grids(&a, span, minpos, maxpos);
            a.dec_part = nan_dev(c, (size_t)T * Hq * cu_attn_dec_grid(maxpos, g_dec_ns) * (hd + 4));
        }
        /* attn_dec_kernel: hd + 4 a partial; attn_kernel's rows below dec_p: up to CU_ATTN_ROW_NS spans */
        a.part =
            nan_dev(c, (size_t)T * Hq * (a.nsplit > CU_ATTN_ROW_NS ? a.nsplit : CU_ATTN_ROW_NS) * (hd + 4));
        if (tiled) a.tiles = mode ? dtc : dtiles, a.n_tiles = mode ? ntc : nt;
        a.tc = mode > 0;
        a.eps = eps, a.meta = meta;
        cu_set_tf32_passes(mode == 2 ? 1 : 3);
        cu_attn_layer(c, &a);
        cu_set_tf32_passes(3);
        REQUIRE(cu_sync(c, err, sizeof err) == 0);
        float *go = get(a.o, (size_t)T * Hq * hd), *gk = get(a.kpool, pool_n), *gv = get(a.vpool, pool_n);
        if (mode == 2) {
            double r = rel(go, o_r, (size_t)T * Hq * hd);
            printf("     attention Hq=%d Hkv=%d hd=%d gain %g, one fp16 rounding (control): %.2e > %.0e?\n",
                   Hq, Hkv, hd, gain, r, tc_bound(err_tiles));
            CHECK_MSG(r > tc_bound(err_tiles), "attention hd=%d: one fp16 rounding passes the bound (%.3g)",
                      hd, r);
            free(go), free(gk), free(gv);
            cu_free(a.qkv), cu_free((void *)a.q_norm), cu_free((void *)a.k_norm), cu_free((void *)a.inv_freq),
                cu_free(a.kpool);
            cu_free(a.vpool), cu_free(a.o), cu_free(a.part);
            continue;
        }
        char what[128];
        if (mode)
            snprintf(what, sizeof what,
                     "attention Hq=%d Hkv=%d hd=%d gain %g tensor cores %s (%d-row tiles): output", Hq, Hkv,
                     hd, gain, "fp16", tcr);
        else if (tiled)
            snprintf(what, sizeof what, "attention Hq=%d Hkv=%d hd=%d gain %g tiles of %d rows: output", Hq,
                     Hkv, hd, gain, CU_ATTN_TILE);
        else if (g_dec_ns && g_dec_p)
            snprintf(what, sizeof what,
                     "attention Hq=%d Hkv=%d hd=%d rows >= %d dec kernel (<= %d spans), others attn_kernel "
                     "(classes %d): output",
                     Hq, Hkv, hd, g_dec_p, g_dec_ns, a.dec_cls);
        else if (g_dec_ns)
            snprintf(what, sizeof what, "attention Hq=%d Hkv=%d hd=%d dec kernel (<= %d spans a row): output",
                     Hq, Hkv, hd, g_dec_ns);
        else
            snprintf(what, sizeof what, "attention hd=%d span=%d (%d splits): output", hd, span, a.nsplit);
        /* against the f64 reference: the f32 paths' bound; the tensor cores (TF32 hi + lo): the scalar
         * tiles' own error x 20 (tc_bound) */
        if (!mode) err_tiles = rel(go, o_r, (size_t)T * Hq * hd);
        check_rel(what, go, o_r, (size_t)T * Hq * hd, mode ? tc_bound(err_tiles) : 1e-5);
        if (mode) {
            /* per entry, so a wrong tile or mask for one kind of entry cannot hide in the total */
            for (int i = 0, r0 = 0; i < NE; r0 += ents[i].n, i++) {
                snprintf(what, sizeof what, "  entry len=%d n=%d output", ents[i].len, ents[i].n);
                check_rel(what, go + (size_t)r0 * Hq * hd, o_r + (size_t)r0 * Hq * hd,
                          (size_t)ents[i].n * Hq * hd, tc_bound(err_tiles));
            }
            snprintf(what, sizeof what, "attention hd=%d tensor cores vs scalar tiles: output", hd);
            check_rel(what, go, prev, (size_t)T * Hq * hd, tc_bound(err_tiles));
            if (mode == 1 && cu_attn_kv16_ok(hd)) {
                /* K and V split into fp16 hi + lo once by the pre-pass (cu_attn_args.kv16, the fragments by
                 * ldmatrix): the same bits (fresh q rows: the prep norms them in place) */
                cu_attn_args b = a;
                int nbmax = 0;
                for (int i = 0; i < NE; i++)
                    if ((ents[i].len + ents[i].n + 15) / 16 > nbmax)
                        nbmax = (ents[i].len + ents[i].n + 15) / 16;
                b.qkv = dup_dev(qkv, (size_t)T * ld * 4), b.o = nan_dev(c, (size_t)T * Hq * hd);
                REQUIRE(cu_alloc((void **)&b.kv16, cu_attn_kv16_bytes(n_blocks, Hkv, hd), err, sizeof err) ==
                        0);
                cu_fill_f32(c, (float *)b.kv16, cu_attn_kv16_bytes(n_blocks, Hkv, hd) / 4, NAN);
                b.kv16_NE = NE, b.kv16_nb = nbmax;
                cu_attn_layer(c, &b);
                REQUIRE(cu_sync(c, err, sizeof err) == 0);
                float *g16 = get(b.o, (size_t)T * Hq * hd);
                int eq = !memcmp(g16, go, (size_t)T * Hq * hd * 4);
                printf("     K, V split once (kv16) vs in every warp: %s\n",
                       eq ? "bit-identical" : "DIFFERENT");
                CHECK_MSG(eq, "attention hd=%d: kv16 differs from the per-warp split (%.3g)", hd,
                          rel(g16, go, (size_t)T * Hq * hd));
                free(g16);
                cu_free(b.qkv), cu_free(b.o), cu_free(b.kv16);
            }
            if (mode == 1 && g_fast) attn_fast_check(c, &a, qkv, ld, ents, NE, tables, o_r, tcr);
            /* each entry launched alone gives the same bits as in the batch: a row's arithmetic must not
             * depend on which rows share its launch or its tile (the key tiles sit on a fixed grid) */
            alone_vs_batch(c, &a, qkv, ld, ents, NE, tables, go, tcr, 0, "tiles");
        }
        if (g_dec_ns && !tiled) {
            /* each entry alone (its own grid of spans) gives the bits it has in the batch: a row's spans
             * follow its own position */
            alone_vs_batch(c, &a, qkv, ld, ents, NE, tables, go, 0, span, "dec");
        }
        snprintf(what, sizeof what, "attention hd=%d: K pool", hd);
        check_rel(what, gk, kp_r, pool_n, 1e-5);
        CHECK_MSG(!memcmp(gv, vp_r, pool_n * 4), "attention hd=%d: V pool differs", hd);
        free(gk), free(gv);
        if (mode) /* the scalar tiles' output stays the comparison */
            free(go);
        else
            prev = go;
        cu_free(a.qkv), cu_free((void *)a.q_norm), cu_free((void *)a.k_norm), cu_free((void *)a.inv_freq),
            cu_free(a.kpool);
        cu_free(a.vpool), cu_free(a.o), cu_free(a.part), cu_free(a.dec_part);
    }
    free(prev);
#undef KROW
    for (int i = 0; i < NE; i++) free(tables[i]);
    free(tables), free(htiles), free(htc);
    free(kp), free(vp), free(qkv), free(qn), free(kn), free(inv), free(kp_r), free(vp_r), free(q_r),
        free(o_r), free(hm);
    cu_free(dmeta), cu_free(dtiles), cu_free(dtc);
    cu_ctx_destroy(c);
}

static void attn_case(int Hq, int Hkv, int hd, int span, int tiled) {
    attn_case_ex(Hq, Hkv, hd, span, tiled, attn_ents, (int)(sizeof attn_ents / sizeof attn_ents[0]), 1.0f);
}

TEST(cuda_attention_layer_vs_cpu) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    attn_case(4, 2, 64, 1 << 20, 0); /* one span: the direct path */
    attn_case(4, 2, 64, 64, 0);      /* split positions + combine */
    attn_case(8, 2, 256, 128, 0);
    attn_case(4, 2, 64, 1 << 20, 1); /* prefill tiles */
    attn_case(8, 2, 256, 1 << 20, 1);
    attn_case(2, 1, 32, 1 << 20, 1);
}

/* CINFER_CUDA_ATTN_DEC=2's kernel (a block per kv head serving its q heads, spans from each row's position)
 * on the same untiled batches (rows of windows, decode rows): one span (several chunks of 32 positions), a
 * few long spans, spans of 32; GQA 1, 2, 4, 6, 8; f32 bound against the f64 reference */
TEST(cuda_attention_dec_vs_cpu) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    static const int nss[] = {1, 3, 32};
    for (int i = 0; i < 3; i++) {
        g_dec_ns = nss[i];
        attn_case(4, 2, 64, 1 << 20, 0);
        attn_case(8, 2, 256, 1 << 20, 0);
        attn_case(16, 4, 256, 1 << 20, 0);
        attn_case(12, 2, 256, 1 << 20, 0);
        attn_case(8, 1, 128, 1 << 20, 0);
        attn_case(3, 3, 32, 1 << 20, 0);
    }
    g_dec_ns = 0;
}

/* rows by class (CINFER_CUDA_ATTN_DEC_P): rows at positions >= P by attn_dec_kernel, the others by
 * attn_kernel with spans from their own positions, in one batch (windows straddling P among them: 70..114
 * and 33..102 at P = 100); P = 64 and 100 (both classes), 1 (every row the dec kernel but the first row of
 * 0..39), 4096 (every row attn_kernel); against the f64 reference (f32 bound) and each entry alone bitwise */
TEST(cuda_attention_dec_p_vs_cpu) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    static const int ps[] = {64, 100, 1, 4096};
    g_dec_ns = 32;
    for (int i = 0; i < 4; i++) {
        g_dec_p = ps[i];
        attn_case(16, 4, 256, 1 << 20, 0);
        attn_case(8, 2, 256, 32, 0);
        attn_case(3, 3, 32, 1 << 20, 0);
    }
    g_dec_ns = 3;
    g_dec_p = 100;
    attn_case(4, 2, 64, 1 << 20, 0);
    g_dec_ns = g_dec_p = 0;
}

/* the tensor-core prefill tiles (CINFER_CUDA_PREFILL=tc|attn): GQA ratios 1, 2, 3, 4, 6, 8 (query heads per
 * block 1, 2, 1, 4, 2, 8: tiles of 128, 64, 128, 32, 64, 16 positions), gated attention's head_dim 256 */
TEST(cuda_attention_tc_vs_cpu) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    attn_case(4, 2, 64, 1 << 20, 2);
    attn_case(3, 3, 32, 1 << 20, 2);
    attn_case(3, 1, 128, 1 << 20, 2);
    attn_case(8, 2, 256, 1 << 20, 2);
    attn_case(6, 1, 256, 1 << 20, 2);
    attn_case(16, 2, 256, 1 << 20, 2);
}

/* the same at the model's scales: long prefills (600 rows; 300 after 500) through head_dim 256 with GQA 4,
 * at plain and peaked (q/k norm weights x 2.5: scores x 6) softmax */
TEST(cuda_long_attention_tc_vs_cpu) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    int ne = (int)(sizeof attn_long_ents / sizeof attn_long_ents[0]);
    attn_case_ex(8, 2, 256, 1 << 20, 2, attn_long_ents, ne, 1.0f);
    attn_case_ex(8, 2, 256, 1 << 20, 2, attn_long_ents, ne, 2.5f);
}

/* long causal prefills in one batch for the flash-attention tiles: 1100 rows from 0 (many 128-row tiles, the
 * last one partial), 333 rows continuing 700 cached positions (tiles off the 32-key grid), 129 rows after 37,
 * 17 after 90, one decode row at 2000; GQA ratios 1, 2, 4, 8 at head_dim 128 and 256 */
static const test_entry attn_fa_ents[] = {
    {0, 1100, 0}, {700, 333, 0}, {37, 129, 0}, {2000, 1, 0}, {90, 17, 0}};
TEST(cuda_long_attention_fa_vs_cpu) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    int ne = (int)(sizeof attn_fa_ents / sizeof attn_fa_ents[0]);
    attn_case_ex(2, 2, 256, 1 << 20, 2, attn_fa_ents, ne, 1.0f); /* ratio 1: 128 positions per tile */
    attn_case_ex(4, 2, 128, 1 << 20, 2, attn_fa_ents, ne, 1.0f); /* ratio 2 */
    attn_case_ex(4, 1, 256, 1 << 20, 2, attn_fa_ents, ne, 2.5f); /* ratio 4 (the 4B shape), peaked */
    attn_case_ex(8, 1, 128, 1 << 20, 2, attn_fa_ents, ne, 1.0f); /* ratio 8: 16 positions per tile */
}

/* The key-split lists of forward_cuda.c's pack_meta for these entries (tiles of tcr rows; each entry's span
 * by cu_attn_tc_split with spans of >= 256 keys): e_span [NE] | row_poff [T] | mrows [T] | work [][2] in one
 * device array (*dlist); *ht / *nt: the plain tile list; returns the partial rows (0: nothing split) */
static int split_lists(const test_entry *e, int NE, int Hq, int Hkv, int hd, int tcr, cu_attn_split *sp,
                       int **dlist, int **dtiles, int *nt) {
    int T = 0, cap = 0;
    for (int i = 0; i < NE; i++) T += e[i].n, cap += (e[i].n + tcr - 1) / tcr;
    int *h = malloc(((size_t)NE + 2 * T + 2 * (size_t)cap * 600) * sizeof(int)),
        *ht = malloc((size_t)cap * 4);
    int *es = h, *rp = h + NE, *mr = rp + T, *wk = mr + T, nw = 0, nm = 0, np = 0;
    *nt = 0;
    for (int i = 0, r = 0; i < NE; r += e[i].n, i++) {
        int ns = 1, span = cu_attn_tc_split(Hq, Hkv, hd, e[i].n, e[i].len + e[i].n, CU_ATTN_MIN_SPAN, &ns);
        es[i] = span;
        for (int t = 0; t < e[i].n; t += tcr) {
            int last = e[i].len + (t + tcr < e[i].n ? t + tcr : e[i].n) - 1;
            ht[(*nt)++] = r + t;
            for (int s = 0; s == 0 || (span && s * span <= last); s++)
                wk[2 * nw] = r + t, wk[2 * nw + 1] = s, nw++;
        }
        for (int t = 0; t < e[i].n; t++) {
            int nsr = span ? (e[i].len + t) / span + 1 : 1;
            rp[r + t] = np;
            if (nsr > 1) mr[nm++] = r + t, np += nsr;
        }
    }
    *dlist = dup_dev(h, ((size_t)NE + 2 * T + 2 * (size_t)nw) * sizeof(int));
    *dtiles = dup_dev(ht, (size_t)*nt * sizeof(int));
    *sp = (cu_attn_split){*dlist + NE + 2 * T, *dlist, *dlist + NE, *dlist + NE + T, NULL, nw, nm};
    free(h), free(ht);
    return np;
}

/* Key splits of the tensor-core prefill tiles (cu_attn_split, CINFER_CUDA_ATTN_SPLIT): one entry of n rows
 * behind len cached keys at the 4B heads (16 q, 4 kv, hd 256), split as forward_cuda.c's pack_meta splits it,
 * against the CPU (rows spread over the entry: the f64 reference of all 64 rows at 16k keys is slow) and
 * against the unsplit kernel (every row); then the same entry after a cold 1100-row prefill in one launch
 * (that one not split): its rows bit for bit as alone. Outputs start as NaN. *span_out: the span used (0: not
 * split). */
static void attn_split_case(int n, int len, float gain, int *span_out) {
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    const int Hq = 16, Hkv = 4, hd = 256, R = hd / 4, kvd = Hkv * hd, ld = Hq * 2 * hd + 2 * kvd;
    const int L = len + n, nb = (L + 15) / 16, full = 0, nB = 1100, nbB = (nB + 15) / 16;
    int n_blocks = 16;
    while (n_blocks < nb + nbB) n_blocks *= 2;
    int *table = malloc((size_t)(nb + nbB) * sizeof(int)); /* the entry's, then the cold one's */
    for (int j = 0; j < nb + nbB; j++) table[j] = (j * 5 + 3) % n_blocks;
    size_t pool_n = (size_t)n_blocks * 16 * kvd;
    float eps = 1e-6f;
    float *kp = rnd(pool_n, 1.0f), *vp = rnd(pool_n, 1.0f), *qkv = rnd((size_t)n * ld, 1.0f);
    float *qn = rnd((size_t)hd, 0.3f), *kn = rnd((size_t)hd, 0.3f), *inv = malloc((size_t)R / 2 * 4);
    for (int i = 0; i < hd; i++) qn[i] = (qn[i] + 1.0f) * gain, kn[i] = (kn[i] + 1.0f) * gain;
    for (int j = 0; j < R / 2; j++) inv[j] = 1.0f / (float)pow(1e7, (double)((float)(2 * j) / (float)R));
        /* the reference: q and the new rows' k normed and roped, v copied, then softmax in f64 */
#define SROW(P, pos) (P + ((size_t)table[(pos) / 16] * 16 + (pos) % 16) * kvd)
    float *kp_r = malloc(pool_n * 4), *vp_r = malloc(pool_n * 4), *q_r = malloc((size_t)n * Hq * hd * 4);
    memcpy(kp_r, kp, pool_n * 4);
    memcpy(vp_r, vp, pool_n * 4);
    for (int t = 0; t < n; t++) {
        int pos = len + t;
        const float *row = qkv + (size_t)t * ld;
        for (int h = 0; h < Hq; h++) {
            float *q = q_r + ((size_t)t * Hq + h) * hd;
            ops_rmsnorm(q, row + (size_t)h * 2 * hd, qn, hd, eps);
            rope_ref(q, R, pos, inv);
        }
        for (int h = 0; h < Hkv; h++) {
            float *k = SROW(kp_r, pos) + (size_t)h * hd;
            ops_rmsnorm(k, row + (size_t)Hq * 2 * hd + (size_t)h * hd, kn, hd, eps);
            rope_ref(k, R, pos, inv);
        }
        memcpy(SROW(vp_r, pos), row + (size_t)Hq * 2 * hd + kvd, (size_t)kvd * 4);
    }
    int nchk = n < 6 ? n : 6, *chk = malloc((size_t)nchk * sizeof(int));
    for (int i = 0; i < nchk; i++) chk[i] = nchk > 1 ? (int)((long)i * (n - 1) / (nchk - 1)) : 0;
    float *o_r = malloc((size_t)nchk * Hq * hd * 4);
    double *sc = malloc((size_t)L * sizeof(double));
    for (int ci = 0; ci < nchk; ci++) {
        int t = chk[ci], pos = len + t;
        for (int h = 0; h < Hq; h++) {
            int kvh = h / (Hq / Hkv);
            const float *q = q_r + ((size_t)t * Hq + h) * hd,
                        *gate = qkv + (size_t)t * ld + (size_t)h * 2 * hd + hd;
            double mx = -1e300, sum = 0;
            for (int u = 0; u <= pos; u++) {
                const float *k = SROW(kp_r, u) + (size_t)kvh * hd;
                double s = 0;
                for (int d = 0; d < hd; d++) s += (double)q[d] * k[d];
                sc[u] = s / sqrt((double)hd);
                mx = sc[u] > mx ? sc[u] : mx;
            }
            for (int u = 0; u <= pos; u++) sum += (sc[u] = exp(sc[u] - mx));
            double acc[256] = {0};
            for (int u = 0; u <= pos; u++) {
                const float *v = SROW(vp_r, u) + (size_t)kvh * hd;
                double w = sc[u] / sum;
                for (int d = 0; d < hd; d++) acc[d] += w * v[d];
            }
            for (int d = 0; d < hd; d++)
                o_r[((size_t)ci * Hq + h) * hd + d] = (float)(acc[d] * (1.0 / (1.0 + exp(-(double)gate[d]))));
        }
    }
#undef SROW
    test_entry ent = {len, n, 0};
    cu_meta meta;
    int *dmeta, *tp = &table[0];
    int *hm = pack_meta(&ent, 1, &tp, &meta, &dmeta);
    REQUIRE(cu_attn_init(hd) && cu_attn_tc_init(hd));
    int tcr = cu_attn_tc_rows(Hq, Hkv), nt = 0, *dt = NULL, *dlist = NULL, nbt = 0, *dbt = NULL,
        *dblist = NULL;
    cu_attn_split sp1, spb;
    int np = split_lists(&ent, 1, Hq, Hkv, hd, tcr, &sp1, &dlist, &dt, &nt), ns = 1;
    int span = cu_attn_tc_split(Hq, Hkv, hd, n, L, CU_ATTN_MIN_SPAN, &ns);
    /* the batch: the cold entry first (its rows before ours), then ours */
    test_entry bents[2] = {{0, nB, 1}, {len, n, 0}};
    int *btabs[2] = {table + nb, table};
    cu_meta bmeta;
    int *dbmeta, *hbm = pack_meta(bents, 2, btabs, &bmeta, &dbmeta);
    int npb = split_lists(bents, 2, Hq, Hkv, hd, tcr, &spb, &dblist, &dbt, &nbt);
    float *qkvb = rnd((size_t)(nB + n) * ld, 1.0f);
    memcpy(qkvb + (size_t)nB * ld, qkv, (size_t)n * ld * 4);
    float *got[2] = {NULL, NULL};
    /* mode 0 unsplit, 1 split, 2 in the batch */
    for (int mode = 0; mode < 3 && (mode == 0 || span); mode++) {
        int Tm = mode == 2 ? nB + n : n;
        cu_attn_args a = {0};
        a.T = Tm, a.Hq = Hq, a.Hkv = Hkv, a.hd = hd, a.rope_dim = R, a.n_blocks = n_blocks, a.full = full;
        a.qkv = dup_dev(mode == 2 ? qkvb : qkv, (size_t)Tm * ld * 4), a.ld = ld;
        a.q_norm = dup_dev(qn, (size_t)hd * 4), a.k_norm = dup_dev(kn, (size_t)hd * 4);
        a.inv_freq = dup_dev(inv, (size_t)R / 2 * 4), a.kpool = dup_dev(kp, pool_n * 4),
        a.vpool = dup_dev(vp, pool_n * 4);
        a.o = nan_dev(c, (size_t)Tm * Hq * hd);
        a.span = 1 << 30, a.nsplit = 1, a.tc = 1, a.eps = eps;
        a.meta = mode == 2 ? bmeta : meta, a.tiles = mode == 2 ? dbt : dt, a.n_tiles = mode == 2 ? nbt : nt;
        if (g_fast) { /* the fast form: its K / V images (NaN to start) by the pre-pass */
            size_t kvb = cu_attn_kv16_bytes(n_blocks, Hkv, hd);
            REQUIRE(cu_alloc((void **)&a.kv16, kvb, err, sizeof err) == 0);
            cu_fill_f32(c, (float *)a.kv16, kvb / 4, NAN);
            a.kv16_NE = mode == 2 ? 2 : 1, a.kv16_nb = mode == 2 && nbB > nb ? nbB : nb, a.fast = 1;
        }
        if (mode) {
            a.split = mode == 2 ? spb : sp1;
            int npm = mode == 2 ? npb : np;
            a.split.part = nan_dev(c, (size_t)(npm > 0 ? npm : 1) * Hq * (hd + 2));
        }
        cu_attn_layer(c, &a);
        REQUIRE(cu_sync(c, err, sizeof err) == 0);
        float *go = get(a.o, (size_t)Tm * Hq * hd);
        if (mode == 2) {
            int eq = !memcmp(go + (size_t)nB * Hq * hd, got[1], (size_t)n * Hq * hd * 4);
            printf("     after a cold %d-row entry in one launch (%d work items): %s\n", nB, spb.n_work,
                   eq ? "bit-identical to alone" : "DIFFERENT");
            CHECK_MSG(eq, "%d rows after %d keys: in a batch differs from alone (%.3g)", n, len,
                      rel(go + (size_t)nB * Hq * hd, got[1], (size_t)n * Hq * hd));
            check_rel("  the cold entry finite", go, go, (size_t)nB * Hq * hd, 0);
            free(go);
        } else {
            got[mode] = go;
            float *sel = malloc((size_t)nchk * Hq * hd * 4);
            for (int ci = 0; ci < nchk; ci++)
                memcpy(sel + (size_t)ci * Hq * hd, go + (size_t)chk[ci] * Hq * hd, (size_t)Hq * hd * 4);
            char what[128];
            snprintf(what, sizeof what, "%d rows after %d keys gain %g %s%s: output", n, len, gain,
                     mode ? "split" : "unsplit", g_fast ? " fast" : "");
            if (mode)
                printf("     %d spans of %d keys, %d blocks, %d rows merged\n", ns, span,
                       sp1.n_work * (Hq / 4), sp1.n_mrows);
            check_rel(what, sel, o_r, (size_t)nchk * Hq * hd, g_fast ? FAST_BOUND : 1e-5);
            /* every row written, none NaN (rel is inf on a NaN) */
            check_rel(mode ? "  split vs unsplit, every row" : "  unsplit: every row finite", go, got[0],
                      (size_t)n * Hq * hd, mode ? (g_fast ? FAST_BOUND : 1e-5) : 0);
            free(sel);
        }
        cu_free(a.qkv), cu_free((void *)a.q_norm), cu_free((void *)a.k_norm), cu_free((void *)a.inv_freq);
        cu_free(a.kpool), cu_free(a.vpool), cu_free(a.o), cu_free(a.split.part), cu_free(a.kv16);
    }
    free(hbm), free(qkvb);
    cu_free(dbmeta), cu_free(dblist), cu_free(dbt), cu_free(dlist);
    free(got[0]), free(got[1]), free(hm), free(sc), free(o_r), free(chk);
    free(kp), free(vp), free(qkv), free(qn), free(kn), free(inv), free(kp_r), free(vp_r), free(q_r),
        free(table);
    cu_free(dt), cu_free(dmeta);
    cu_ctx_destroy(c);
    *span_out = span;
}

/* 64 rows (the second turn's suffix of issue 6) and 1 row behind 1k, 4k and 16k keys: split at each (one
 * entry of 2 tiles or 1 row fills 8 / 4 blocks of 132 SMs) */
TEST(cuda_attention_tc_split_vs_cpu) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    static const int lens[] = {1000, 4096, 16383};
    for (int i = 0; i < 3; i++) {
        int s64 = -1, s1 = -1;
        attn_split_case(64, lens[i], i == 2 ? 2.5f : 1.0f, &s64);
        attn_split_case(1, lens[i], 1.0f, &s1);
        CHECK_MSG(s64 > 0 && s1 > 0, "after %d keys: not split (spans %d, %d)", lens[i], s64, s1);
    }
    /* a cold prefill of 4096 rows fills the device: never split */
    int ns = 0;
    CHECK_EQ_INT(cu_attn_tc_split(16, 4, 256, 4096, 4096, CU_ATTN_MIN_SPAN, &ns), 0);
}

/* The fast form (cu_attn_args.fast, precision fast: fp16 operands, one MMA a product) within FAST_BOUND of
 * the f64 reference on the tensor-core tests' head shapes and entries (ragged batches, entries continuing
 * cached prefixes, decode rows among them), each entry alone bit for bit as in its batch; the key splits
 * (64 and 1 rows behind 1k / 4k / 16k keys) against the reference and the unsplit fast form, and bit for bit
 * in a batch beside a cold prefill */
TEST(cuda_attention_fast_vs_cpu) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    g_fast = 1;
    attn_case(4, 2, 64, 1 << 20, 2);
    attn_case(3, 3, 32, 1 << 20, 2);
    attn_case(3, 1, 128, 1 << 20, 2);
    attn_case(8, 2, 256, 1 << 20, 2);
    attn_case(6, 1, 256, 1 << 20, 2);
    attn_case(16, 2, 256, 1 << 20, 2);
    g_fast = 0;
}

TEST(cuda_long_attention_fast_vs_cpu) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    int ne = (int)(sizeof attn_fa_ents / sizeof attn_fa_ents[0]);
    g_fast = 1;
    attn_case_ex(2, 2, 256, 1 << 20, 2, attn_fa_ents, ne, 1.0f);
    attn_case_ex(4, 2, 128, 1 << 20, 2, attn_fa_ents, ne, 1.0f);
    attn_case_ex(4, 1, 256, 1 << 20, 2, attn_fa_ents, ne, 2.5f);
    attn_case_ex(8, 1, 128, 1 << 20, 2, attn_fa_ents, ne, 1.0f);
    g_fast = 0;
}

TEST(cuda_attention_fast_split_vs_cpu) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    static const int lens[] = {1000, 4096, 16383};
    g_fast = 1;
    for (int i = 0; i < 3; i++) {
        int s64 = -1, s1 = -1;
        attn_split_case(64, lens[i], i == 2 ? 2.5f : 1.0f, &s64);
        attn_split_case(1, lens[i], 1.0f, &s1);
        CHECK_MSG(s64 > 0 && s1 > 0, "after %d keys: not split (spans %d, %d)", lens[i], s64, s1);
    }
    g_fast = 0;
}

/* Device time of one attention layer's prefill (q / k norm + RoPE and the K / V write, the pre-pass, the
 * tiles) for n rows after len cached keys at hd 256, exact and fast, with TFLOP/s over the causal products
 * (4 hd FLOP per (q head, row, key)); the fast output within FAST_BOUND of the exact one */
static void attn_pf_speed(const char *name, int Hq, int Hkv, int len, int n) {
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    const int hd = 256, R = hd / 4, kvd = Hkv * hd, ld = Hq * 2 * hd + 2 * kvd, L = len + n;
    int n_blocks = (L + 15) / 16;
    REQUIRE(cu_attn_init(hd) && cu_attn_tc_init(hd) && cu_attn_fast_ok(hd));
    int *table = malloc((size_t)n_blocks * sizeof(int));
    for (int j = 0; j < n_blocks; j++) table[j] = j;
    size_t pool_n = (size_t)n_blocks * 16 * kvd;
    float *kp = rnd(pool_n, 1.0f), *qkv = rnd((size_t)n * ld, 1.0f);
    float *qn = rnd((size_t)hd, 0.3f), *inv = malloc((size_t)R / 2 * 4);
    for (int i = 0; i < hd; i++) qn[i] += 1.0f;
    for (int j = 0; j < R / 2; j++) inv[j] = 1.0f / (float)pow(1e7, (double)((float)(2 * j) / (float)R));
    test_entry ent = {len, n, 0};
    cu_meta meta;
    int *dmeta, *tp = table, *hm = pack_meta(&ent, 1, &tp, &meta, &dmeta);
    int tcr = cu_attn_tc_rows(Hq, Hkv), nt = 0, *ht = malloc(((size_t)n / tcr + 2) * sizeof(int));
    for (int t = 0; t < n; t += tcr) ht[nt++] = t;
    cu_attn_args a = {0};
    a.T = n, a.Hq = Hq, a.Hkv = Hkv, a.hd = hd, a.rope_dim = R, a.n_blocks = n_blocks, a.full = 0;
    a.qkv = dup_dev(qkv, (size_t)n * ld * 4), a.ld = ld;
    a.q_norm = dup_dev(qn, (size_t)hd * 4), a.k_norm = a.q_norm, a.inv_freq = dup_dev(inv, (size_t)R / 2 * 4);
    a.kpool = dup_dev(kp, pool_n * 4), a.vpool = dup_dev(kp, pool_n * 4);
    a.o = nan_dev(c, (size_t)n * Hq * hd);
    a.span = 1 << 30, a.nsplit = 1, a.tc = 1, a.eps = 1e-6f, a.meta = meta;
    a.tiles = dup_dev(ht, (size_t)nt * sizeof(int)), a.n_tiles = nt;
    REQUIRE(cu_alloc((void **)&a.kv16, cu_attn_kv16_bytes(n_blocks, Hkv, hd), err, sizeof err) == 0);
    a.kv16_NE = 1, a.kv16_nb = n_blocks;
    double flop = 4.0 * hd * Hq * ((double)n * len + (double)n * (n + 1) / 2);
    cu_timer *tm;
    REQUIRE(cu_timer_create(&tm) == 0);
    float *out[2] = {NULL, NULL}, best[2] = {1e30f, 1e30f};
    for (int f = 0; f < 2; f++) {
        a.fast = f;
        for (int rep = 0; rep < 4; rep++) {
            /* fresh q rows each time: the prep norms and ropes them in place */
            REQUIRE(cu_upload(a.qkv, qkv, (size_t)n * ld * 4, err, sizeof err) == 0);
            cu_timer_start(c, tm);
            cu_attn_layer(c, &a);
            float ms = cu_timer_stop_ms(c, tm);
            if (rep && ms < best[f]) best[f] = ms; /* the first is a warm-up */
        }
        REQUIRE(cu_sync(c, err, sizeof err) == 0);
        out[f] = get(a.o, (size_t)n * Hq * hd);
        printf("     %-8s %2d q / %d kv heads, %5d rows after %5d: %-5s %8.3f ms %6.1f TFLOP/s\n", name, Hq, Hkv,
               n, len, f ? "fast" : "exact", best[f], flop / (best[f] * 1e-3) / 1e12);
    }
    double r = rel(out[1], out[0], (size_t)n * Hq * hd);
    printf("     %-8s fast vs exact ||d||/||ref|| = %.2e, %.2fx\n", name, r, best[0] / best[1]);
    CHECK_MSG(r <= FAST_BOUND, "%s: fast vs exact %.3g", name, r);
    cu_timer_destroy(tm);
    free(out[0]), free(out[1]), free(table), free(kp), free(qkv), free(qn), free(inv), free(hm), free(ht);
    cu_free(a.qkv), cu_free((void *)a.q_norm), cu_free((void *)a.inv_freq), cu_free(a.kpool), cu_free(a.vpool);
    cu_free(a.o), cu_free((void *)a.tiles), cu_free(a.kv16), cu_free(dmeta);
    cu_ctx_destroy(c);
}

TEST(cuda_attention_prefill_speed) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    attn_pf_speed("4B", 16, 4, 0, 4096);
    attn_pf_speed("27B", 24, 4, 0, 4096);
    attn_pf_speed("35B-A3B", 16, 2, 0, 4096);
    attn_pf_speed("4B 32k", 16, 4, 28672, 4096); /* the last chunk of a 32k prompt */
}

TEST(cuda_moe_route_vs_cpu) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    int T = 9, E = 40, k = 5;
    float *lg = rnd((size_t)T * E, 3.0f);
    lg[3] = lg[7]; /* a tie in row 0: the lower index goes first */
    int *idx_r = malloc((size_t)T * k * 4);
    float *w_r = malloc((size_t)T * k * 4);
    for (int norm = 0; norm < 2; norm++) {
        for (int r = 0; r < T; r++) {
            float p[64], mx = -INFINITY, s = 0;
            for (int e = 0; e < E; e++) mx = fmaxf(mx, lg[r * E + e]);
            for (int e = 0; e < E; e++) s += (p[e] = expf(lg[r * E + e] - mx));
            for (int e = 0; e < E; e++) p[e] /= s;
            float ws = 0;
            for (int j = 0; j < k; j++) {
                int best = -1;
                for (int e = 0; e < E; e++) {
                    int taken = 0;
                    for (int q = 0; q < j; q++) taken |= idx_r[r * k + q] == e;
                    if (!taken && (best < 0 || p[e] > p[best])) best = e;
                }
                idx_r[r * k + j] = best;
                w_r[r * k + j] = p[best];
                ws += p[best];
            }
            if (norm)
                for (int j = 0; j < k; j++) w_r[r * k + j] /= ws;
        }
        float *dl = dup_dev(lg, (size_t)T * E * 4), *dw = nan_dev(c, (size_t)T * k);
        int *di = NULL;
        REQUIRE(cu_alloc((void **)&di, (size_t)T * k * 4, err, sizeof err) == 0);
        cu_moe_route(c, dl, di, dw, T, E, k, norm);
        REQUIRE(cu_sync(c, err, sizeof err) == 0);
        int *gi = malloc((size_t)T * k * 4);
        float *gw = get(dw, (size_t)T * k);
        REQUIRE(cu_download(gi, di, (size_t)T * k * 4, err, sizeof err) == 0);
        CHECK_MSG(!memcmp(gi, idx_r, (size_t)T * k * 4), "router top-%d choices differ (norm %d)", k, norm);
        check_rel(norm ? "router weights (renormalised)" : "router weights", gw, w_r, (size_t)T * k, 1e-5);
        free(gi), free(gw);
        cu_free(dl), cu_free(dw), cu_free(di);
    }
    free(lg), free(idx_r), free(w_r);
    cu_ctx_destroy(c);
}

/* ---- sampling on the device ---- */

/* raw log_softmax of x[tok] in f64 */
static double ref_logprob(const float *x, int V, int tok) {
    double m = -INFINITY, z = 0;
    for (int i = 0; i < V; i++)
        if (x[i] == x[i] && x[i] > m) m = x[i];
    for (int i = 0; i < V; i++)
        if (x[i] == x[i]) z += exp((double)x[i] - m);
    return (double)x[tok] - (m + log(z));
}

/* cu_sample's device side for n rows: ids, logprobs (NaN until written), its scratch and its counters (zero) */
typedef struct smp_dev {
    int *ids;
    float *lp;
    void *part;
    unsigned *cnt;
} smp_dev;
static int smp_dev_new(cu_ctx *c, int n, smp_dev *d) {
    char err[256];
    *d = (smp_dev){0};
    d->lp = nan_dev(c, (size_t)n);
    return !d->lp || cu_alloc((void **)&d->ids, (size_t)n * 4, err, sizeof err) ||
                   cu_alloc(&d->part, CU_SAMPLE_PART, err, sizeof err) ||
                   cu_alloc((void **)&d->cnt, CU_SAMPLE_GROUP * 4, err, sizeof err)
               ? -1
               : 0;
}
static void smp_dev_free(smp_dev *d) {
    cu_free(d->ids), cu_free(d->lp), cu_free(d->part), cu_free(d->cnt);
}

/* Greedy rows against the CPU sampler (ties to the lowest id, NaN never chosen); top-k rows against the CPU
 * sampler's candidates (best first, renormalised): u in the middle of candidate j's interval must give
 * candidate j, for the first, second, middle and last of k; logprobs against f64. */
TEST(cuda_sample_vs_cpu_sampler) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    enum { V = 5003, R = 4 };
    float *x = rnd((size_t)R * V, 4.0f);
    x[17] = x[1200] = 9.0f;               /* row 0: a tie at the max: 17 wins */
    x[3] = NAN;                           /* and a NaN */
    x[V + 4000] = 7.5f, x[V + 5] = NAN;   /* row 1: one clear max */
    x[2 * V + 10] = x[2 * V + 11] = 3.9f; /* row 2: equal logits inside the top-k: lower id first */
    float *dx = dup_dev(x, (size_t)R * V * 4);
    static const float temps[] = {0.7f, 1.5f};
    static const int ks[] = {5, 40};
    cu_sample_row rows[64];
    int want[64], n = 0, src[64];
    /* greedy: rows 0..3 */
    for (int r = 0; r < R; r++) {
        sampler_params sp = sampler_default_params();
        sp.temperature = 0.0f;
        sampler *sm;
        REQUIRE(sampler_create(&sp, V, &sm, err, sizeof err) == 0);
        want[n] = sampler_sample(sm, x + (size_t)r * V, NULL);
        sampler_destroy(sm);
        rows[n] = (cu_sample_row){.u = 0.0, .inv_t = 0.0f, .top_k = 1, .logprob = 1};
        src[n++] = r;
    }
    CHECK_EQ_INT(want[0], 17);
    /* top-k at a temperature: rows 2 and 3 */
    for (int r = 2; r < R; r++)
        for (int ti = 0; ti < 2; ti++) {
            sampler_params sp = sampler_default_params();
            sp.temperature = temps[ti], sp.top_k = ks[ti];
            sampler *sm;
            REQUIRE(sampler_create(&sp, V, &sm, err, sizeof err) == 0);
            int32_t ids[64];
            float pr[64];
            int nc = sampler_candidates(sm, x + (size_t)r * V, ids, pr, 64);
            sampler_destroy(sm);
            CHECK_EQ_INT(nc, ks[ti]);
            int js[4] = {0, 1, nc / 2, nc - 1};
            for (int q = 0; q < 4; q++) {
                double lo = 0;
                for (int j = 0; j < js[q]; j++) lo += pr[j];
                rows[n] = (cu_sample_row){.u = lo + 0.5 * pr[js[q]], .inv_t = 1.0f / temps[ti], .top_k = ks[ti], .logprob = q & 1};
                want[n] = ids[js[q]];
                src[n++] = r;
            }
        }
    /* the kernel reads row i of the logits for request i: lay the rows out per request */
    float *xr = malloc((size_t)n * V * 4);
    for (int i = 0; i < n; i++) memcpy(xr + (size_t)i * V, x + (size_t)src[i] * V, (size_t)V * 4);
    float *dxr = dup_dev(xr, (size_t)n * V * 4);
    cu_sample_row *drows = dup_dev(rows, sizeof(cu_sample_row) * (size_t)n);
    smp_dev sd;
    REQUIRE(smp_dev_new(c, n, &sd) == 0);
    REQUIRE(cu_sample(c, dxr, V, drows, NULL, n, sd.ids, sd.lp, sd.part, sd.cnt) == 0);
    REQUIRE(cu_sync(c, err, sizeof err) == 0);
    int gids[64];
    REQUIRE(cu_download(gids, sd.ids, (size_t)n * 4, err, sizeof err) == 0);
    float *glp = get(sd.lp, (size_t)n);
    for (int i = 0; i < n; i++) {
        CHECK_MSG(gids[i] == want[i], "request %d (row %d, top_k %d): device id %d, CPU %d", i, src[i],
                  rows[i].top_k, gids[i], want[i]);
        if (rows[i].logprob) {
            double lp = ref_logprob(x + (size_t)src[i] * V, V, want[i]);
            CHECK_MSG(fabs(glp[i] - lp) <= 1e-5 * (1 + fabs(lp)), "request %d: logprob %g, f64 %g", i,
                      (double)glp[i], lp);
        }
    }
    printf("     %d requests (greedy and top-k 5 / 40 at T 0.7 / 1.5): ids as the CPU sampler's\n", n);
    free(x), free(xr), free(glp);
    cu_free(dx), cu_free(dxr), cu_free(drows);
    smp_dev_free(&sd);
    cu_ctx_destroy(c);
}

/* The whole chain the device takes (sampler_device_ok / sampler_device_row, cu_sample with its adjusted
 * tokens) against the CPU sampler on the same logits, prompt and accepted tokens: logit_bias, the
 * repetition penalty over prompt + output, presence / frequency over the output, temperature, top_k, top_p,
 * min_p, greedy with penalties. For each setting the CPU's surviving candidates (sampler_candidates: most
 * likely first, renormalised) must be the device's: u in the middle of candidate j's interval gives
 * candidate j (the first, second, middle and last with mass > 1e-3). Two settings ask for the logprob: the
 * raw distribution's (f64 reference), the logits unwritten. At V 5003 (one block a row) and 248320. */
TEST(cuda_sample_chain_vs_cpu_sampler) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    static const int Vs[] = {5003, 248320};
    enum { NSET = 6, NJ = 4, CAPPEN = 4096 };
    int checked = 0;
    for (size_t vi = 0; vi < sizeof Vs / sizeof Vs[0]; vi++) {
        int V = Vs[vi];
        float *x = rnd((size_t)V, 3.0f);
        /* a head of close logits, so that top_p and min_p cut inside the top_k */
        static const int head[] = {11, 400, 401, 2000, 3999, 17, 5, 4242, 123, 321};
        for (int i = 0; i < 10; i++) x[head[i]] = 9.0f - 0.35f * (float)i;
        x[77] = NAN;
        int32_t prompt[] = {11, 400, 400, 17, 5, 9, 77, 1000};
        int32_t out[] = {401, 401, 2000, 11};
        sampler_bias bias[] = {{400, 0.75f}, {3999, -1.5f}, {60, 2.0f}};
        sampler_params ps[NSET];
        for (int k = 0; k < NSET; k++) ps[k] = sampler_default_params();
        ps[0].temperature = 0.7f, ps[0].top_k = 20, ps[0].top_p = 0.8f, ps[0].repetition_penalty = 1.1f;
        ps[0].logit_bias = bias, ps[0].n_logit_bias = 3;
        ps[1].temperature = 1.0f, ps[1].top_k = 64, ps[1].min_p = 0.05f, ps[1].presence_penalty = 0.5f;
        ps[1].frequency_penalty = 0.3f;
        ps[2].temperature = 1.5f, ps[2].top_k = 40, ps[2].top_p = 0.95f, ps[2].min_p = 0.02f;
        ps[3].temperature = 0.0f, ps[3].repetition_penalty = 1.5f, ps[3].logit_bias = bias + 1;
        ps[3].n_logit_bias = 1; /* greedy: 11, the raw max, is penalised */
        ps[4].temperature = 0.6f, ps[4].top_k = 1, ps[4].logit_bias = bias, ps[4].n_logit_bias = 3;
        ps[5].temperature = 0.8f, ps[5].top_k = 20, ps[5].top_p = 0.9f, ps[5].repetition_penalty = 1.3f;
        ps[5].repeat_last_n = 3, ps[5].presence_penalty = -0.5f, ps[5].frequency_penalty = 1.0f;
        cu_sample_row rows[NSET * NJ];
        cu_sample_pen *pens = malloc(sizeof *pens * NSET * NJ * CAPPEN);
        int want[NSET * NJ], n = 0, np = 0, pen_set[NSET * NJ];
        for (int k = 0; k < NSET; k++) {
            sampler *sm;
            REQUIRE(sampler_create(&ps[k], V, &sm, err, sizeof err) == 0);
            REQUIRE(sampler_set_prompt(sm, prompt, 8, err, sizeof err) == 0);
            for (int i = 0; i < 4; i++) REQUIRE(sampler_accept(sm, out[i]) == 0);
            CHECK(sampler_device_ok(sm, CU_SAMPLE_MAX_K, CAPPEN));
            int32_t ids[64];
            float pr[64];
            int nc = sampler_candidates(sm, x, ids, pr, 64);
            sampler_dev_row q;
            sampler_dev_pen pk[CAPPEN];
            int kp = 0;
            REQUIRE(sampler_device_row(sm, CU_SAMPLE_MAX_K, &q, pk, CAPPEN, &kp) == 0);
            sampler_destroy(sm);
            if (k == 3) CHECK(nc == 1 && ids[0] != 11);
            int js[NJ] = {0, 1, nc / 2, nc - 1};
            for (int t = 0; t < NJ; t++) {
                int j = js[t];
                if (j >= nc || (t > 0 && pr[j] <= 1e-3f)) continue;
                double lo = 0;
                for (int i = 0; i < j; i++) lo += pr[i];
                int greedy = q.temperature < SAMPLER_GREEDY_TEMP || q.top_k == 1;
                rows[n] = (cu_sample_row){.u = lo + 0.5 * pr[j],
                                          .inv_t = greedy ? 0.0f : 1.0f / q.temperature,
                                          .top_k = greedy ? 1 : q.top_k,
                                          .top_p = greedy ? 1.0f : q.top_p,
                                          .min_p = greedy ? 0.0f : q.min_p,
                                          .logprob = k == 0 || k == 3,
                                          .rep = q.repetition_penalty,
                                          .pen0 = np,
                                          .n_pen = kp};
                for (int i = 0; i < kp; i++)
                    pens[np + i] = (cu_sample_pen){pk[i].token, pk[i].flags, pk[i].bias, pk[i].sub};
                np += kp;
                want[n] = ids[j], pen_set[n] = k;
                n++;
            }
        }
        float *xr = malloc((size_t)n * V * 4);
        for (int i = 0; i < n; i++) memcpy(xr + (size_t)i * V, x, (size_t)V * 4);
        float *dxr = dup_dev(xr, (size_t)n * V * 4);
        cu_sample_row *drows = dup_dev(rows, sizeof(cu_sample_row) * (size_t)n);
        cu_sample_pen *dpen = dup_dev(pens, sizeof(cu_sample_pen) * (size_t)(np ? np : 1));
        smp_dev sd;
        REQUIRE(smp_dev_new(c, n, &sd) == 0);
        REQUIRE(cu_sample(c, dxr, V, drows, dpen, n, sd.ids, sd.lp, sd.part, sd.cnt) == 0);
        REQUIRE(cu_sync(c, err, sizeof err) == 0);
        int gids[NSET * NJ];
        REQUIRE(cu_download(gids, sd.ids, (size_t)n * 4, err, sizeof err) == 0);
        float *gx = get(dxr, (size_t)n * V), *glp = get(sd.lp, (size_t)n);
        CHECK_MSG(!memcmp(gx, xr, (size_t)n * V * 4), "V %d: the device wrote into the logits", V);
        for (int i = 0; i < n; i++) {
            CHECK_MSG(gids[i] == want[i], "V %d, setting %d, request %d: device id %d, CPU %d", V, pen_set[i], i,
                      gids[i], want[i]);
            if (rows[i].logprob) {
                double lp = ref_logprob(x, V, want[i]);
                CHECK_MSG(fabs(glp[i] - lp) <= 1e-5 * (1 + fabs(lp)), "V %d, setting %d: logprob %g, f64 %g", V,
                          pen_set[i], (double)glp[i], lp);
            }
            checked++;
        }
        free(glp);
        free(x), free(xr), free(pens), free(gx);
        cu_free(dxr), cu_free(drows), cu_free(dpen);
        smp_dev_free(&sd);
    }
    printf("     %d draws over 6 settings (bias, penalties, top_k / top_p / min_p, greedy): the CPU sampler's tokens\n",
           checked);
    cu_ctx_destroy(c);
}

/* cu_sample's top_k set and its order (logit desc, id asc; NaN as -inf) against a sort on the host, on rows
 * made of ties: every logit equal (the slices' floors reach thousands of pairs: the last block raises its
 * floor again), three levels, a few finite values among -inf and NaN, and normal logits with adjusted tokens
 * lifted into the set and its best pushed out. At a temperature so high that every finite candidate weighs
 * exactly 1, u = (j + 0.5) / f draws the j-th of the f finite candidates, so each draw names one place of the
 * list. One row alone (the most slices) and 12 rows in one launch (at V 248320 slices of three chunks, the K best
 * kept from one chunk to the next), at V 248320 and 5003, top_k 64 and 7. */
typedef struct tk_pair {
    float v;
    int id;
} tk_pair;
static int tk_cmp(const void *a, const void *b) {
    const tk_pair *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}
TEST(cuda_sample_topk_set_with_ties) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    static const int Vs[] = {248320, 5003}, Ks[] = {64, 7};
    enum { NPAT = 4, NJ = 3, NPEN = 4 };
    int checked = 0;
    for (int vi = 0; vi < 2; vi++)
        for (int ki = 0; ki < 2; ki++) {
            const int V = Vs[vi], K = Ks[ki];
            float *x = malloc((size_t)NPAT * V * 4);
            tk_pair *pr = malloc((size_t)V * sizeof *pr);
            cu_sample_pen pens[NPAT * NPEN];
            cu_sample_row rows[NPAT * NJ];
            int want[NPAT * NJ], n = 0, np = 0;
            uint64_t h = 0x9E3779B97F4A7C15ull;
            for (int pt = 0; pt < NPAT; pt++) {
                float *r = x + (size_t)pt * V;
                int pen0 = np;
                for (int i = 0; i < V; i++) {
                    h = h * 6364136223846793005ull + 1442695040888963407ull;
                    unsigned z = (unsigned)(h >> 33);
                    r[i] = pt == 0   ? 0.25f
                           : pt == 1 ? (float)(z % 3u)
                           : pt == 2 ? (z % 97u == 0 ? NAN : -INFINITY)
                                     : ((float)(z % 20001u) - 10000.0f) * 1e-3f;
                }
                if (pt == 2)
                    for (int i = 0; i < 10; i++) r[(i * 7919 + 13) % V] = (float)(i % 4);
                if (pt == 3) { /* three tokens lifted in, the best pushed out */
                    int best = 0;
                    for (int i = 1; i < V; i++)
                        if (r[i] > r[best]) best = i;
                    int lift[3] = {V - 1, V / 2, 3};
                    for (int i = 0; i < 3; i++) pens[np++] = (cu_sample_pen){lift[i], CU_PEN_BIAS, 10.0f + i, 0.0f};
                    if (best != V - 1 && best != V / 2 && best != 3)
                        pens[np++] = (cu_sample_pen){best, CU_PEN_BIAS, -20.0f, 0.0f};
                }
                for (int i = 0; i < V; i++) pr[i] = (tk_pair){r[i] != r[i] ? -INFINITY : r[i], i};
                for (int q = pen0; q < np; q++) pr[pens[q].token].v += pens[q].bias;
                qsort(pr, (size_t)V, sizeof *pr, tk_cmp);
                int f = 0;
                while (f < K && isfinite(pr[f].v)) f++;
                const int js[NJ] = {0, f / 2, f - 1};
                for (int t = 0; t < NJ; t++) {
                    rows[n] = (cu_sample_row){.u = (js[t] + 0.5) / f, .inv_t = 1e-30f, .top_k = K, .top_p = 1.0f,
                                              .rep = 1.0f, .pen0 = pen0, .n_pen = np - pen0};
                    want[n++] = pr[js[t]].id;
                }
            }
            /* row i reads the logits of pattern i / NJ */
            float *xr = malloc((size_t)n * V * 4);
            for (int i = 0; i < n; i++) memcpy(xr + (size_t)i * V, x + (size_t)(i / NJ) * V, (size_t)V * 4);
            float *dxr = dup_dev(xr, (size_t)n * V * 4);
            cu_sample_row *drows = dup_dev(rows, sizeof rows);
            cu_sample_pen *dpen = dup_dev(pens, sizeof pens);
            smp_dev sd;
            REQUIRE(smp_dev_new(c, n, &sd) == 0);
            int gids[NPAT * NJ];
            /* every row alone (the most slices a row), then all in one launch */
            for (int i = 0; i < n; i++)
                REQUIRE(cu_sample(c, dxr + (size_t)i * V, V, drows + i, dpen, 1, sd.ids + i, sd.lp, sd.part,
                                  sd.cnt) == 0);
            REQUIRE(cu_sync(c, err, sizeof err) == 0);
            REQUIRE(cu_download(gids, sd.ids, (size_t)n * 4, err, sizeof err) == 0);
            for (int i = 0; i < n; i++, checked++)
                CHECK_MSG(gids[i] == want[i], "V %d, top_k %d, pattern %d, draw %d, alone: device id %d, host %d", V, K,
                          i / NJ, i % NJ, gids[i], want[i]);
            REQUIRE(cu_sample(c, dxr, V, drows, dpen, n, sd.ids, sd.lp, sd.part, sd.cnt) == 0);
            REQUIRE(cu_sync(c, err, sizeof err) == 0);
            REQUIRE(cu_download(gids, sd.ids, (size_t)n * 4, err, sizeof err) == 0);
            for (int i = 0; i < n; i++, checked++)
                CHECK_MSG(gids[i] == want[i], "V %d, top_k %d, pattern %d, draw %d, batched: device id %d, host %d", V,
                          K, i / NJ, i % NJ, gids[i], want[i]);
            free(x), free(pr), free(xr);
            cu_free(dxr), cu_free(drows), cu_free(dpen);
            smp_dev_free(&sd);
        }
    REQUIRE(cu_sample(c, NULL, CU_SAMPLE_MAX_V + 1, NULL, NULL, 1, NULL, NULL, NULL, NULL) == -1);
    printf("     %d draws on rows of ties, alone and batched: the host sort's places\n", checked);
    cu_ctx_destroy(c);
}

/* cu_argmax (greedy rows without logprobs: many blocks a row) against the CPU sampler's greedy choice and
 * cu_sample's, at vocabularies that slice evenly and not, from one row to more rows than the SMs: a tie at
 * the max in different slices (the lower id), the max at the first and the last id, NaNs (never chosen), a
 * row all NaN and one all -inf (id 0, as cu_sample), a row whose max is +inf. Run twice on the same buffers:
 * the counters are set back by the launch. */
TEST(cuda_argmax_vs_cpu_sampler) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    static const int Vs[] = {248320, 151936, 5003, 37};
    static const int Ns[] = {1, 3, 200};
    int checked = 0;
    for (size_t vi = 0; vi < sizeof Vs / sizeof Vs[0]; vi++)
        for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++) {
            int V = Vs[vi], n = Ns[ni];
            float *x = rnd((size_t)n * V, 4.0f);
            for (int r = 0; r < n; r++) {
                float *row = x + (size_t)r * V;
                switch (r % 7) {
                case 0: row[V / 3] = row[V - 2] = 50.0f, row[1] = NAN; break; /* tie across slices */
                case 1: row[0] = 50.0f; break;
                case 2: row[V - 1] = 50.0f, row[V / 2] = NAN; break;
                case 3: for (int i = 0; i < V; i++) row[i] = NAN; break;
                case 4: for (int i = 0; i < V; i++) row[i] = -INFINITY; break;
                case 5: row[V / 5 + 1] = INFINITY, row[V / 7] = INFINITY; break;
                default: break; /* random: its own max */
                }
            }
            float *dx = dup_dev(x, (size_t)n * V * 4);
            int *dids = NULL, *dids2 = NULL;
            unsigned *dcnt = NULL;
            void *dpart = NULL;
            REQUIRE(cu_alloc((void **)&dids, (size_t)n * 4, err, sizeof err) == 0);
            REQUIRE(cu_alloc((void **)&dids2, (size_t)n * 4, err, sizeof err) == 0);
            REQUIRE(cu_alloc((void **)&dcnt, (size_t)n * 4, err, sizeof err) == 0);
            REQUIRE(cu_alloc(&dpart, CU_ARGMAX_PART(n), err, sizeof err) == 0);
            cu_sample_row *rows = calloc((size_t)n, sizeof *rows);
            for (int r = 0; r < n; r++) rows[r] = (cu_sample_row){.inv_t = 0.0f, .top_k = 1};
            cu_sample_row *drows = dup_dev(rows, sizeof(cu_sample_row) * (size_t)n);
            float *dlp = nan_dev(c, (size_t)n);
            int *gids = malloc((size_t)n * 4), *sids = malloc((size_t)n * 4);
            void *dspart = NULL;
            unsigned *dscnt = NULL;
            REQUIRE(cu_alloc(&dspart, CU_SAMPLE_PART, err, sizeof err) == 0);
            REQUIRE(cu_alloc((void **)&dscnt, CU_SAMPLE_GROUP * 4, err, sizeof err) == 0);
            REQUIRE(cu_sample(c, dx, V, drows, NULL, n, dids2, dlp, dspart, dscnt) == 0);
            REQUIRE(cu_sync(c, err, sizeof err) == 0);
            REQUIRE(cu_download(sids, dids2, (size_t)n * 4, err, sizeof err) == 0);
            for (int rep = 0; rep < 2; rep++) {
                memset(gids, 0xff, (size_t)n * 4); /* -1: an id never written fails */
                REQUIRE(cu_upload(dids, gids, (size_t)n * 4, err, sizeof err) == 0);
                cu_argmax(c, dx, V, n, dids, dpart, dcnt);
                REQUIRE(cu_sync(c, err, sizeof err) == 0);
                REQUIRE(cu_download(gids, dids, (size_t)n * 4, err, sizeof err) == 0);
                for (int r = 0; r < n; r++) {
                    sampler_params sp = sampler_default_params();
                    sp.temperature = 0.0f;
                    sampler *sm;
                    REQUIRE(sampler_create(&sp, V, &sm, err, sizeof err) == 0);
                    int want = sampler_sample(sm, x + (size_t)r * V, NULL);
                    sampler_destroy(sm);
                    if (r % 7 == 0) CHECK_EQ_INT(want, V / 3);
                    if (r % 7 == 3 || r % 7 == 4) want = 0; /* no finite logit: cu_sample's id 0 */
                    CHECK_MSG(gids[r] == want && sids[r] == want,
                              "V %d, %d rows, row %d (pass %d): cu_argmax %d, cu_sample %d, CPU %d", V, n, r, rep,
                              gids[r], sids[r], want);
                    checked++;
                }
            }
            free(x), free(rows), free(gids), free(sids);
            cu_free(dx), cu_free(dids), cu_free(dids2), cu_free(dcnt), cu_free(dpart), cu_free(drows), cu_free(dlp);
            cu_free(dspart), cu_free(dscnt);
        }
    printf("     %d rows: cu_argmax's ids = cu_sample's = the CPU sampler's\n", checked);
    cu_ctx_destroy(c);
}

#else

TEST(cuda_ops_not_built) {
    SKIP("no CUDA device: skipped (built without CUDA)");
}

#endif

/* which sampler settings the device sampler takes (the rest stays on the host); runs without a device */
TEST(cuda_sample_eligibility) {
    CHECK(cuda_sample_eligible(0.0f, 0, 1000));   /* greedy */
    CHECK(cuda_sample_eligible(1e-6f, 50, 1000)); /* below the greedy temperature */
    CHECK(cuda_sample_eligible(0.8f, 1, 1000));   /* top_k 1 is greedy */
    CHECK(cuda_sample_eligible(0.8f, 64, 1000));  /* top_k up to 64 */
    CHECK(!cuda_sample_eligible(0.8f, 65, 1000)); /* more: the host */
    CHECK(!cuda_sample_eligible(0.8f, 0, 1000));  /* the whole vocabulary: the host */
    CHECK(!cuda_sample_eligible(0.8f, 40, 40));   /* top_k >= V is the whole vocabulary */
    CHECK(!cuda_sample_eligible(-1.0f, 5, 1000)); /* invalid */
    CHECK(!cuda_sample_eligible(NAN, 5, 1000));
}

/* test_cuda_presplit.c — CINFER_CUDA_PF_SPLIT: prefill norms and SwiGLU (and, through the forward, the
 * DeltaNet gated norm and the attention tiles) writing the bf16 hi + lo halves of the GEMM after them
 * (cu_add_rmsnorm_split, cu_swiglu_split, cu_gemm_presplit) instead of f32 rows cu_gemm splits. The claim is
 * the same bits, so both are checked bitwise: op by op (the halves, the products, the residual the norm adds
 * into; padded and unpadded rows, outputs starting as NaN) and through the whole forward (every fixture, a
 * 150-token prefill with all logits and decode steps after it, and prefills beside a decode row in one batch,
 * the switch on against off). Skips without a CUDA build or device. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cinfer.h"
#include "cuda_ctx.h"
#include "model/forward_cuda.h"
#include "test.h"
#include "util/bf16.h"

#ifdef CINFER_CUDA
#include "backend/cuda/cuda_ops.h"
#define CUDA_TEST_SEED 0x2545f4914f6cdd1dull /* this file's inputs as before the shared helpers */
#include "cuda_test_util.h"

/* both producers against f32 rows + cu_gemm_rows, at M rows (K = N-side sizes small, real code paths);
 * passes 1 (precision fast): the producers write one bf16 copy (lo 0) and the product is one pass */
static void presplit_case(cu_ctx *c, int M, int pad, int passes) {
    enum { K = 320, N = 96, MAXM = 256 };
    char err[256];
    int was = cu_gemm_pad();
    cu_set_gemm_pad(pad);
    cu_set_bf16_passes(c, passes);
    size_t lo = cu_gemm_presplit_lo(c, M, K);
    CHECK_MSG(passes == 1 ? lo == 0 : lo == (size_t)M * K, "passes %d: lo offset %zu", passes, lo);
    int Mb = cu_gemm_presplit_rows(c, M, K, MAXM);
    CHECK_MSG(Mb >= M && Mb <= MAXM, "M %d pad %d: presplit rows %d", M, pad, Mb);
    if (Mb < M || Mb > MAXM) {
        cu_set_gemm_pad(was);
        cu_set_bf16_passes(c, 2);
        return;
    }
    lo = cu_gemm_presplit_lo(c, Mb, K);
    size_t nx = (size_t)MAXM * K, ny = (size_t)MAXM * N;
    float *hgu = malloc(sizeof(float) * 2 * nx), *hx = malloc(sizeof(float) * nx),
          *hadd = malloc(sizeof(float) * nx);
    float *hw = malloc(sizeof(float) * K);
    uint16_t *hW = malloc(sizeof(uint16_t) * N * K);
    for (size_t i = 0; i < 2 * nx; i++) hgu[i] = 3.0f * frand();
    for (size_t i = 0; i < nx; i++) hx[i] = 2.0f * frand(), hadd[i] = frand();
    for (int i = 0; i < K; i++) hw[i] = 1.0f + 0.3f * frand();
    for (int i = 0; i < N * K; i++) hW[i] = f32_to_bf16(0.05f * frand());
    float *gu = dup_dev(hgu, sizeof(float) * 2 * nx), *x0 = dup_dev(hx, sizeof(float) * nx),
          *x1 = dup_dev(hx, sizeof(float) * nx), *add = dup_dev(hadd, sizeof(float) * nx),
          *w = dup_dev(hw, sizeof(float) * K);
    uint16_t *W = dup_dev(hW, sizeof(uint16_t) * N * K);
    float *act = NULL, *y0 = NULL, *y1 = NULL;
    uint16_t *xb0 = NULL, *xb1 = NULL;
    REQUIRE(cu_alloc((void **)&act, sizeof(float) * nx, err, sizeof err) == 0);
    REQUIRE(cu_alloc((void **)&y0, sizeof(float) * ny, err, sizeof err) == 0);
    REQUIRE(cu_alloc((void **)&y1, sizeof(float) * ny, err, sizeof err) == 0);
    REQUIRE(cu_alloc((void **)&xb0, sizeof(uint16_t) * 2 * nx, err, sizeof err) == 0);
    REQUIRE(cu_alloc((void **)&xb1, sizeof(uint16_t) * 2 * nx, err, sizeof err) == 0);
    for (int op = 0; op < 2; op++) { /* 0 SwiGLU, 1 residual add + RMSNorm */
        const char *what = op ? "add + rmsnorm" : "swiglu";
        cu_fill_f32(c, y0, ny, NAN), cu_fill_f32(c, y1, ny, NAN);
        cu_fill_f32(c, (float *)xb0, nx, NAN), cu_fill_f32(c, (float *)xb1, nx, NAN);
        if (op) {
            cu_add_rmsnorm(c, x0, add, act, w, M, K, 1e-6f);
            cu_add_rmsnorm_split(c, x1, add, xb1, w, M, K, 1e-6f, lo);
        } else {
            cu_swiglu(c, act, gu, M, K);
            cu_swiglu_split(c, xb1, gu, M, K, lo);
        }
        cu_gemm_rows(c, y0, act, W, M, N, K, xb0, MAXM);
        cu_gemm_presplit(c, y1, xb1, W, M, N, K, Mb);
        REQUIRE(cu_sync(c, err, sizeof err) == 0);
        float *g0 = get_bytes(y0, sizeof(float) * ny), *g1 = get_bytes(y1, sizeof(float) * ny);
        uint16_t *b0 = get_bytes(xb0, sizeof(uint16_t) * 2 * nx),
                 *b1 = get_bytes(xb1, sizeof(uint16_t) * 2 * nx);
        REQUIRE(g0 && g1 && b0 && b1);
        int unwritten = 0;
        for (size_t i = 0; i < (size_t)M * N; i++) unwritten += !isfinite(g1[i]);
        int same_y = !memcmp(g0, g1, sizeof(float) * (size_t)M * N);
        int same_h = !memcmp(b0, b1, sizeof(uint16_t) * (size_t)M * K) &&
                     (passes == 1 || !memcmp(b0 + (size_t)Mb * K, b1 + (size_t)Mb * K, sizeof(uint16_t) * (size_t)M * K));
        int lo_kept = 1; /* one pass: nothing written past the one copy's rows */
        if (passes == 1)
            for (size_t i = (size_t)Mb * K; i < 2 * nx; i++) lo_kept &= b1[i] == b0[i] || (isnan(bf16_to_f32(b1[i])) && isnan(bf16_to_f32(b0[i])));
        int same_x = 1;
        if (op) {
            float *a0 = get_bytes(x0, sizeof(float) * nx), *a1 = get_bytes(x1, sizeof(float) * nx);
            REQUIRE(a0 && a1);
            same_x = !memcmp(a0, a1, sizeof(float) * nx);
            free(a0), free(a1);
        }
        printf("     M %3d (%s of %3d rows, pad %d) %-13s: halves %s, product %s%s\n", M,
               passes == 1 ? "one copy" : "halves", Mb, pad, what,
               same_h ? "same bits" : "DIFFER", same_y ? "same bits" : "DIFFERS",
               op ? (same_x ? ", residual same bits" : ", residual DIFFERS") : "");
        CHECK_EQ_INT(unwritten, 0);
        CHECK_MSG(same_h, "M %d %s: the producer's halves differ from cu_gemm's split", M, what);
        CHECK_MSG(same_y, "M %d %s: the product from the producer's halves differs", M, what);
        CHECK_MSG(same_x, "M %d %s: the residual rows differ", M, what);
        CHECK_MSG(lo_kept, "M %d %s: one pass wrote past its one copy", M, what);
        free(g0), free(g1), free(b0), free(b1);
    }
    cu_set_gemm_pad(was);
    cu_set_bf16_passes(c, 2);
    free(hgu), free(hx), free(hadd), free(hw), free(hW);
    cu_free(gu), cu_free(x0), cu_free(x1), cu_free(add), cu_free(w), cu_free(W), cu_free(act), cu_free(y0),
        cu_free(y1), cu_free(xb0), cu_free(xb1);
}

TEST(cuda_presplit_ops_bitwise) {
    if (cuda_devices() < 1) SKIP("no CUDA device: skipped");
    char err[256];
    cu_ctx *c = NULL;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    cu_set_gemm_xb_rows(c, 256);
    /* where the two-pass path does not serve a product, the producers must not be used */
    CHECK_EQ_INT(cu_gemm_presplit_rows(c, 64, 320, 256), 0);
    CHECK_EQ_INT(cu_gemm_presplit_rows(c, cu_gemv_max(), 320, 256), 0);
    for (int passes = 2; passes >= 1; passes--) {
        cu_set_fast_presplit(1); /* one pass: the producers' one copy (CINFER_CUDA_FAST_PRESPLIT) */
        presplit_case(c, 65, 1, passes);
        presplit_case(c, 150, 1, passes);
        presplit_case(c, 150, 0, passes);
        presplit_case(c, 256, 1, passes);
    }
    cu_ctx_destroy(c);
}

/* CINFER_CUDA_FAST_GU16's two ops: cu_swiglu16 (bf16 gate | up rows in, one bf16 copy out) against the host's
 * bf16(silu(g) * u), within one bf16 rounding (expf may differ in the last f32 bit), both kernel forms (I % 8
 * == 0 or not); cu_gemm_presplit_out16 against the f32 product rounded once */
TEST(cuda_fast_gu16_ops) {
    if (cuda_devices() < 1) SKIP("no CUDA device: skipped");
    char err[256];
    cu_ctx *c = NULL;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    cu_set_bf16_passes(c, 1);
    static const int Is[] = {264, 260};
    for (int q = 0; q < 2; q++) {
        int T = 70, I = Is[q];
        size_t n = (size_t)T * 2 * I;
        uint16_t *hgu = malloc(n * 2), *hout = malloc((size_t)T * I * 2);
        for (size_t i = 0; i < n; i++) hgu[i] = f32_to_bf16(4.0f * frand());
        uint16_t *gu = dup_dev(hgu, n * 2), *out = NULL;
        REQUIRE(cu_alloc((void **)&out, (size_t)T * I * 2, err, sizeof err) == 0);
        cu_swiglu16(c, out, gu, T, I);
        REQUIRE(cu_sync(c, err, sizeof err) == 0);
        REQUIRE(cu_download(hout, out, (size_t)T * I * 2, err, sizeof err) == 0);
        double worst = 0;
        for (int r = 0; r < T; r++)
            for (int i = 0; i < I; i++) {
                float g = bf16_to_f32(hgu[(size_t)r * 2 * I + i]), u = bf16_to_f32(hgu[(size_t)r * 2 * I + I + i]);
                float want = g / (1.0f + expf(-g)) * u, got = bf16_to_f32(hout[(size_t)r * I + i]);
                double e = fabs((double)got - want) / (fabs(want) + 1e-6);
                if (!(e <= worst)) worst = e;
            }
        printf("     cu_swiglu16 T %d I %d: worst relative error %.2e (one bf16 rounding: 3.9e-3)\n", T, I, worst);
        CHECK_MSG(worst <= 4.0e-3, "cu_swiglu16 I %d: relative error %.3g", I, worst);
        free(hgu), free(hout);
        cu_free(gu), cu_free(out);
    }
    enum { M = 96, N = 80, K = 128 };
    uint16_t hx[M * K], hw[N * K], hy[M * N];
    for (int i = 0; i < M * K; i++) hx[i] = f32_to_bf16(frand());
    for (int i = 0; i < N * K; i++) hw[i] = f32_to_bf16(0.1f * frand());
    uint16_t *x = dup_dev(hx, sizeof hx), *w = dup_dev(hw, sizeof hw), *y = NULL;
    REQUIRE(cu_alloc((void **)&y, sizeof hy, err, sizeof err) == 0);
    cu_gemm_presplit_out16(c, y, x, w, N, K, M);
    REQUIRE(cu_sync(c, err, sizeof err) == 0);
    REQUIRE(cu_download(hy, y, sizeof hy, err, sizeof err) == 0);
    double worst = 0;
    for (int m = 0; m < M; m++)
        for (int j = 0; j < N; j++) {
            double acc = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                double p = (double)bf16_to_f32(hx[m * K + k]) * bf16_to_f32(hw[j * K + k]);
                acc += p, mag += fabs(p);
            }
            double e = fabs(bf16_to_f32(hy[m * N + j]) - acc) / (fabs(acc) + 1e-3 * mag + 1e-9);
            if (!(e <= worst)) worst = e;
        }
    printf("     cu_gemm_presplit_out16 %dx%dx%d: worst relative error %.2e\n", M, N, K, worst);
    CHECK_MSG(worst <= 5e-3, "cu_gemm_presplit_out16: relative error %.3g", worst);
    cu_free(x), cu_free(w), cu_free(y);
    cu_ctx_destroy(c);
}

/* one 150-token prefill with every logit, then 4 decode steps: [154][V] */
static int run_long(cinfer_model *m, int V, float *out) {
    enum { P = 150, D = 4 };
    char err[512];
    cinfer_ctx *c = test_ctx(m, CINFER_DEVICE_CUDA, 1, P + D + 1, P, 2);
    if (!c) return -1;
    int32_t toks[P + D];
    for (int i = 0; i < P + D; i++) toks[i] = (int32_t)((i * 37 + 5) % V);
    int seq = cinfer_seq_open(c, err, sizeof err);
    cinfer_batch_entry e = {seq, toks, P, 1};
    int rc = cinfer_forward(c, &e, 1, out, err, sizeof err);
    for (int t = 0; t < D && !rc; t++) {
        e = (cinfer_batch_entry){seq, toks + P + t, 1, 0};
        rc = cinfer_forward(c, &e, 1, out + (size_t)(P + t) * V, err, sizeof err);
    }
    if (rc) test_fail(__FILE__, __LINE__, "forward: %s", err);
    cinfer_ctx_destroy(c);
    return rc;
}

/* three sequences: prefills of 100 and 80 tokens in one call (all logits), then a mixed step: sequence 0's
 * next token beside sequence 2's 90-token prefill (a decode row in the tiles and the DeltaNet batch); then
 * a step of the three: [180 + 91 + 3][V] */
static int run_mixed(cinfer_model *m, int V, float *out) {
    char err[512];
    cinfer_ctx *c = test_ctx(m, CINFER_DEVICE_CUDA, 3, 200, 200, 2);
    if (!c) return -1;
    int32_t toks[3][128];
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < 128; i++) toks[s][i] = (int32_t)((i * 29 + s * 13 + 3) % V);
    int sq[3];
    for (int s = 0; s < 3; s++) sq[s] = cinfer_seq_open(c, err, sizeof err);
    cinfer_batch_entry be[3] = {{sq[0], toks[0], 100, 1}, {sq[1], toks[1], 80, 1}};
    int rc = cinfer_forward(c, be, 2, out, err, sizeof err);
    be[0] = (cinfer_batch_entry){sq[0], toks[0] + 100, 1, 1};
    be[1] = (cinfer_batch_entry){sq[2], toks[2], 90, 1};
    if (!rc) rc = cinfer_forward(c, be, 2, out + (size_t)180 * V, err, sizeof err);
    be[0] = (cinfer_batch_entry){sq[0], toks[0] + 101, 1, 0};
    be[1] = (cinfer_batch_entry){sq[1], toks[1] + 80, 1, 0};
    be[2] = (cinfer_batch_entry){sq[2], toks[2] + 90, 1, 0};
    if (!rc) rc = cinfer_forward(c, be, 3, out + (size_t)271 * V, err, sizeof err);
    if (rc) test_fail(__FILE__, __LINE__, "forward: %s", err);
    cinfer_ctx_destroy(c);
    return rc;
}

/* The fixtures' logits with the switch env at off, then at on (NULL: unset, its default), over a 150-token
 * prefill + 4 steps and over 3 sequences with prefills beside a decode row: the same bits, no NaN */
static void switch_bitwise(const char *const *fx, size_t nfx, const char *env, const char *off,
                           const char *on, const char *what) {
    for (size_t i = 0; i < nfx; i++) {
        char dir[512], err[512];
        snprintf(dir, sizeof dir, "%s/%s", test_fixtures_dir(), fx[i]);
        cinfer_model *m;
        if (cinfer_model_open(dir, &m, err, sizeof err)) {
            test_fail(__FILE__, __LINE__, "%s: %s", fx[i], err);
            continue;
        }
        cinfer_model_info info;
        cinfer_model_get_info(m, &info);
        for (int kind = 0; kind < 2; kind++) {
            size_t n = (size_t)(kind ? 274 : 154) * info.vocab_size;
            float *ref = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
            for (size_t k = 0; k < n; k++) ref[k] = got[k] = NAN;
            setenv(env, off, 1);
            int rc = kind ? run_mixed(m, info.vocab_size, ref) : run_long(m, info.vocab_size, ref);
            if (on)
                setenv(env, on, 1);
            else
                unsetenv(env);
            rc |= kind ? run_mixed(m, info.vocab_size, got) : run_long(m, info.vocab_size, got);
            unsetenv(env);
            if (!rc) {
                int same = !memcmp(ref, got, n * sizeof(float)), nan = 0;
                for (size_t k = 0; k < n; k++) nan += isnan(got[k]);
                printf("     %-14s %-44s %s: %s\n", fx[i],
                       kind ? "3 sequences, prefills beside a decode row" : "150-token prefill + 4 steps",
                       what, same ? "bit-identical" : "DIFFER");
                CHECK_EQ_INT(nan, 0);
                CHECK_MSG(same, "%s: %s: the logits differ (%s)", fx[i], what,
                          kind ? "mixed batch" : "long prefill");
            }
            free(ref), free(got);
        }
        cinfer_model_close(m);
    }
}

TEST(cuda_presplit_forward_bitwise) {
    if (cuda_devices() < 1) SKIP("no CUDA device: skipped");
    static const char *fx[] = {"qwen35_dense", "qwen35_text", "qwen35_moe", "qwen3_next"};
    switch_bitwise(fx, sizeof fx / sizeof fx[0], "CINFER_CUDA_PF_SPLIT", "0", NULL,
                   "CINFER_CUDA_PF_SPLIT on vs off");
}

/* precision fast: the producers' one bf16 copy (CINFER_CUDA_FAST_PRESPLIT, default on) against f32 rows that
 * cu_gemm converts (=0), through the whole forward: the same bits */
TEST(cuda_fast_presplit_forward_bitwise) {
    if (cuda_devices() < 1) SKIP("no CUDA device: skipped");
    static const char *fx[] = {"qwen35_dense", "qwen3_next"};
    const char *old = getenv("CINFER_PRECISION");
    char *keep = old ? strdup(old) : NULL;
    setenv("CINFER_PRECISION", "fast", 1);
    /* gate_up in bf16 (CINFER_CUDA_FAST_GU16) needs the one copy, so it would run on one side only */
    setenv("CINFER_CUDA_FAST_GU16", "0", 1);
    switch_bitwise(fx, sizeof fx / sizeof fx[0], "CINFER_CUDA_FAST_PRESPLIT", "0", "1",
                   "fast, one bf16 copy vs f32 rows");
    unsetenv("CINFER_CUDA_FAST_GU16");
    if (keep)
        setenv("CINFER_PRECISION", keep, 1);
    else
        unsetenv("CINFER_PRECISION");
    free(keep);
}

#else

TEST(cuda_presplit_not_built) {
    SKIP("no CUDA backend in this build: skipped");
}

#endif

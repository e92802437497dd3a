/* test_cuda_stage.c — the staged decode GEMV (CINFER_CUDA_GEMV_STAGE: out_proj's weight rows copied into
 * shared memory before the PDL wait, cu_set_gemv_stage) must give the register form's bits: per op at the
 * 4B / 35B-A3B out_proj shapes and odd small ones (K % 256 != 0, a last block of fewer rows, one output) at
 * several rows a block, and through the whole forward at the fixtures (one sequence, whose steps take the
 * staged form, and three, whose do not) with every bit of the switch against it unset, eager and from PDL
 * graphs. Without a CUDA build or device every test skips. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cinfer.h"
#include "model/forward_cuda.h"
#include "cuda_ctx.h"
#include "test.h"

#ifdef CINFER_CUDA
#include "backend/cuda/cuda_ops.h"

#define NO_DEVICE() (!cuda_built() || cuda_devices() < 1)

static uint64_t g_rng = 0x2545f4914f6cdd1dull;
static float frand(void) { /* [-1, 1) */
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

/* y0 + x . w^T by cu_gemv_fused (residual epilogue) with the staged form at rows a block (0: the register
 * form); NULL on failure */
static float *run_add(cu_ctx *c, const float *dx, const uint16_t *dw, const float *dy0, int N, int K,
                      int rows) {
    char err[256];
    float *dy = NULL, *h = malloc((size_t)N * 4);
    if (!h || cu_alloc((void **)&dy, (size_t)N * 4, err, sizeof err)) {
        free(h);
        return NULL;
    }
    cu_d2d_async(c, dy, dy0, (size_t)N * 4);
    cu_set_gemv_stage(c, rows);
    int rc = cu_gemv_fused(c, dy, dx, dw, 1, N, K, NULL, 0.0f, CU_EPI_ADD);
    cu_set_gemv_stage(c, 0);
    if (rc || cu_sync(c, err, sizeof err) || cu_download(h, dy, (size_t)N * 4, err, sizeof err)) {
        free(h);
        h = NULL;
    }
    cu_free(dy);
    return h;
}

TEST(cuda_gemv_stage_bitwise) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    static const struct {
        const char *what;
        int N, K;
    } sh[] = {
        {"4B out_proj", 2560, 4096},   {"35B-A3B out_proj", 2048, 4096}, {"small N=203 K=264", 203, 264},
        {"small N=64 K=296", 64, 296}, {"one output K=2048", 1, 2048},   {"N=37 K=8", 37, 8},
    };
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    /* the 27B's out_proj (5120 x 6144 = 63 MB) does not fit one block an SM */
    CHECK(cu_gemv_stage_rows(5120, 6144, 0) == 0);
    CHECK(cu_gemv_stage_rows(2560, 4096, 0) > 0);
    for (size_t si = 0; si < sizeof sh / sizeof sh[0]; si++) {
        int N = sh[si].N, K = sh[si].K;
        float *x = malloc((size_t)K * 4), *y0 = malloc((size_t)N * 4);
        uint16_t *w = malloc((size_t)N * K * 2);
        REQUIRE(x && y0 && w);
        for (int k = 0; k < K; k++) x[k] = frand();
        for (int n = 0; n < N; n++) y0[n] = frand();
        for (size_t i = 0; i < (size_t)N * K; i++) {
            float v = 0.05f * frand();
            uint32_t u;
            memcpy(&u, &v, 4);
            w[i] = (uint16_t)(u >> 16);
        }
        float *dx, *dy0;
        uint16_t *dw;
        REQUIRE(cu_alloc((void **)&dx, (size_t)K * 4, err, sizeof err) == 0);
        REQUIRE(cu_alloc((void **)&dy0, (size_t)N * 4, err, sizeof err) == 0);
        REQUIRE(cu_alloc((void **)&dw, (size_t)N * K * 2, err, sizeof err) == 0);
        REQUIRE(cu_upload(dx, x, (size_t)K * 4, err, sizeof err) == 0);
        REQUIRE(cu_upload(dy0, y0, (size_t)N * 4, err, sizeof err) == 0);
        REQUIRE(cu_upload(dw, w, (size_t)N * K * 2, err, sizeof err) == 0);
        float *ref = run_add(c, dx, dw, dy0, N, K, 0);
        int nrun = 0;
        CHECK(ref != NULL);
        /* rows a staged block (0: one block an SM), then the register form with 8 / 4 chunks early */
        const int rows[] = {0, 1, 3, 7, 10, 20, 33, -8, -4};
        for (size_t ri = 0; ref && ri < sizeof rows / sizeof rows[0]; ri++) {
            int RB = rows[ri] < 0 ? rows[ri] : cu_gemv_stage_rows(N, K, rows[ri]);
            if (!RB) continue; /* too big a block for shared memory */
            nrun++;
            for (int pdl = 0; pdl < 2; pdl++) {
                cu_set_pdl(pdl);
                float *got = run_add(c, dx, dw, dy0, N, K, RB);
                cu_set_pdl(0);
                int same = got && !memcmp(got, ref, (size_t)N * 4);
                if (!same)
                    printf("     %s: %d rows a block%s: DIFFER\n", sh[si].what, RB, pdl ? " (PDL)" : "");
                CHECK_MSG(same, "%s: staged at %d rows a block differs from the register form", sh[si].what,
                          RB);
                free(got);
            }
        }
        printf("     %-20s staged vs register form: %d forms checked\n", sh[si].what, nrun);
        free(ref);
        cu_free(dx), cu_free(dy0), cu_free(dw);
        free(x), free(y0), free(w);
    }
    cu_ctx_destroy(c);
}

/* B sequences (2-token prefill, 8 decode steps) with CINFER_CUDA_GEMV_STAGE=stage (NULL unset) and
 * CINFER_CUDA_GRAPHS=graphs (NULL: the default) */
static int run_stage(cinfer_model *m, const char *stage, const char *graphs, int B, int V, float *out) {
    if (stage)
        setenv("CINFER_CUDA_GEMV_STAGE", stage, 1);
    else
        unsetenv("CINFER_CUDA_GEMV_STAGE");
    if (graphs)
        setenv("CINFER_CUDA_GRAPHS", graphs, 1);
    else
        unsetenv("CINFER_CUDA_GRAPHS");
    int rc = test_run_seqs(m, B, 2, 8, V, 0, out);
    unsetenv("CINFER_CUDA_GEMV_STAGE");
    unsetenv("CINFER_CUDA_GRAPHS");
    return rc;
}

TEST(cuda_gemv_stage_forward) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    /* the fixtures, then the 4B shape with few layers where CINFER_TEST_PDL_MODEL names one (test_cuda_pdl)
     */
    static const char *fx[] = {"qwen35_dense", "qwen35_text", "qwen35_moe", "qwen3_next", "4b-shape"};
    static const char *forms[] = {"1", "5", "2", "8", "1,1", "1,10", "17", "33"};
    const char *m4 = getenv("CINFER_TEST_PDL_MODEL");
    for (size_t fi = 0; fi < sizeof fx / sizeof fx[0]; fi++) {
        char dir[512], err[512];
        if (fi == 4 && !(m4 && *m4)) break;
        if (fi == 4)
            snprintf(dir, sizeof dir, "%s", m4);
        else
            snprintf(dir, sizeof dir, "%s/%s", test_fixtures_dir(), fx[fi]);
        cinfer_model *m;
        if (cinfer_model_open(dir, &m, err, sizeof err)) {
            test_fail(__FILE__, __LINE__, "%s: %s", fx[fi], err);
            continue;
        }
        cinfer_model_info info;
        cinfer_model_get_info(m, &info);
        int V = info.vocab_size, D = 8;
        for (int B = 1; B <= 3; B += 2) {
            size_t n = (size_t)(D + 1) * B * V, nb = n * sizeof(float);
            float *ref = malloc(nb), *got = malloc(nb);
            REQUIRE(ref && got);
            for (size_t i = 0; i < n; i++) ref[i] = NAN;
            if (run_stage(m, NULL, NULL, B, V, ref)) {
                free(ref), free(got);
                break;
            }
            for (size_t k = 0; k < sizeof forms / sizeof forms[0]; k++)
                for (int g = 0; g < 2; g++) {
                    for (size_t i = 0; i < n; i++) got[i] = NAN;
                    if (run_stage(m, forms[k], g ? "0" : NULL, B, V, got)) continue;
                    int same = !memcmp(got, ref, nb);
                    printf("     %-13s B=%d CINFER_CUDA_GEMV_STAGE=%-4s %-6s vs unset: %s\n", fx[fi], B,
                           forms[k], g ? "eager" : "graphs", same ? "bit-identical" : "DIFFER");
                    CHECK_MSG(same, "%s: B=%d stage %s %s differs", fx[fi], B, forms[k],
                              g ? "eager" : "graphs");
                }
            free(ref), free(got);
        }
        cinfer_model_close(m);
    }
}

#else

TEST(cuda_gemv_stage_not_built) {
    SKIP("no CUDA device: skipped (built without CUDA)");
}

#endif

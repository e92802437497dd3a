/* test_cuda_gemm_pad.c — cu_gemm's hi + lo products with CINFER_CUDA_GEMM_PAD: 9-64 rows stacked on M rounded
 * up to a multiple of CU_GEMM_PAD_ROWS, more rows (cu_gemm_rows into a y with room) on M rounded up to
 * CU_GEMM_PAD_BIG, so cuBLAS meets few shapes per matrix: every row against a double CPU reference, padded
 * and not (||d|| / ||ref|| <= 1e-5, outputs start as NaN so an unwritten one fails), rows past the bucket
 * untouched (past M for the stacked form), a row's bits the same whether its call had M or the bucket's full
 * rows. Skips without a CUDA build or device. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward_cuda.h"
#include "test.h"
#include "util/bf16.h"

#ifdef CINFER_CUDA
#include "backend/cuda/cuda_ops.h"
#include "cuda_test_util.h"

TEST(cuda_gemm_pad_rows_match_cpu_and_their_bucket) {
    if (cuda_devices() < 1) SKIP("no CUDA device: skipped");
    enum { N = 320, K = 512, MAXM = 256 };
    char err[256];
    cu_ctx *c = NULL;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    float *hx = malloc(sizeof(float) * MAXM * K);
    uint16_t *hw = malloc(sizeof(uint16_t) * N * K);
    for (int i = 0; i < MAXM * K; i++) hx[i] = frand() * 2.0f;
    for (int i = 0; i < N * K; i++) hw[i] = f32_to_bf16(frand() * 0.05f);
    float *dx = NULL, *dy = NULL, *dt = NULL, *dy64 = NULL;
    uint16_t *dw = NULL, *xb = NULL;
    size_t tf = (size_t)2 * MAXM * N;
    REQUIRE(cu_alloc((void **)&dx, sizeof(float) * MAXM * K, err, sizeof err) == 0);
    REQUIRE(cu_alloc((void **)&dw, sizeof(uint16_t) * N * K, err, sizeof err) == 0);
    REQUIRE(cu_alloc((void **)&dy, sizeof(float) * MAXM * N, err, sizeof err) == 0);
    REQUIRE(cu_alloc((void **)&dy64, sizeof(float) * MAXM * N, err, sizeof err) == 0);
    REQUIRE(cu_alloc((void **)&dt, sizeof(float) * tf, err, sizeof err) == 0);
    REQUIRE(cu_alloc((void **)&xb, sizeof(uint16_t) * 2 * MAXM * K, err, sizeof err) == 0);
    REQUIRE(cu_upload(dx, hx, sizeof(float) * MAXM * K, err, sizeof err) == 0);
    REQUIRE(cu_upload(dw, hw, sizeof(uint16_t) * N * K, err, sizeof err) == 0);
    cu_set_gemm_scratch(c, dt, tf);
    cu_set_gemm_xb_rows(c, MAXM);
    double *ref = malloc(sizeof(double) * MAXM * N);
    for (int m = 0; m < MAXM; m++)
        for (int n = 0; n < N; n++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += (double)hx[m * K + k] * bf16_to_f32(hw[n * K + k]);
            ref[m * N + n] = s;
        }
    const int Ms[] = {9, 16, 17, 33, 47, 63, 64, 65, 100, 128, 200};
    int pad_was = cu_gemm_pad();
    for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
        int M = Ms[mi], step = M <= 64 ? CU_GEMM_PAD_ROWS : CU_GEMM_PAD_BIG, B = (M + step - 1) / step * step;
        float *y[2] = {NULL, NULL}, *yb = NULL;
        for (int pad = 0; pad < 2; pad++) {
            cu_set_gemm_pad(pad);
            cu_fill_f32(c, dy, (size_t)MAXM * N, NAN);
            cu_gemm_rows(c, dy, dx, dw, M, N, K, xb, MAXM);
            REQUIRE(cu_sync(c, err, sizeof err) == 0);
            y[pad] = get(dy, (size_t)MAXM * N);
            REQUIRE(y[pad]);
        }
        /* the bucket's full rows in one call, with the switch: the first M rows must be the same bits */
        cu_fill_f32(c, dy64, (size_t)MAXM * N, NAN);
        cu_gemm_rows(c, dy64, dx, dw, B, N, K, xb, MAXM);
        REQUIRE(cu_sync(c, err, sizeof err) == 0);
        yb = get(dy64, (size_t)MAXM * N);
        REQUIRE(yb);
        double worst[2] = {0, 0};
        int unwritten = 0, beyond = 0, same = 1;
        for (int pad = 0; pad < 2; pad++) {
            double d = 0, r = 0;
            for (int i = 0; i < M * N; i++) {
                if (!isfinite(y[pad][i])) unwritten++;
                double e = y[pad][i] - ref[i];
                d += e * e, r += ref[i] * ref[i];
            }
            worst[pad] = sqrt(d / r);
            for (int i = (M <= 64 || !pad ? M : B) * N; i < MAXM * N; i++) beyond += !isnan(y[pad][i]);
        }
        same = !memcmp(y[1], yb, sizeof(float) * (size_t)M * N);
        printf("     M %2d (bucket %2d): ||d||/||ref|| %.3g unpadded, %.3g padded; rows as in a %d-row call: "
               "%s\n",
               M, B, worst[0], worst[1], B, same ? "same bits" : "DIFFER");
        CHECK_EQ_INT(unwritten, 0);
        CHECK_EQ_INT(beyond, 0);
        CHECK_MSG(worst[0] <= 1e-5 && worst[1] <= 1e-5, "M %d: %.3g / %.3g (bound 1e-5)", M, worst[0],
                  worst[1]);
        CHECK_MSG(same, "M %d: padded rows differ from the same rows of a %d-row call", M, B);
        free(y[0]), free(y[1]), free(yb);
    }
    cu_set_gemm_pad(pad_was);
    free(ref), free(hx), free(hw);
    cu_free(dx), cu_free(dw), cu_free(dy), cu_free(dy64), cu_free(dt), cu_free(xb);
    cu_ctx_destroy(c);
}

#else

TEST(cuda_gemm_pad_rows_match_cpu_and_their_bucket) {
    SKIP("no CUDA backend in this build: skipped");
}

#endif

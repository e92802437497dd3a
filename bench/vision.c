/* vision.c — images/s through preprocessing (smart_resize + PIL bicubic + normalize + patchify, from RGB) and
 * the vision tower, for square photos of given sides, on a random tower of a real Qwen3.5 shape:
 *   [CINFER_DEVICE=cuda] bench/run_vision.sh [threads] [preset: 0.8b|27b] [sides...]
 * With CINFER_DEVICE=cuda the tower runs on the GPU (model/vision_cuda.h; a warm-up call first, then the mean
 * of 3 calls per side up to 1024, 1 above; pixels up and features down included).
 * Prints per side: patches, merged tokens, seconds for preprocessing and for the tower, images/s, and the
 * tower's GFLOP/s (linear layers 2*N*params, attention 4*N^2*D per block). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/vision.h"
#include "model/vision_cuda.h"
#include "util/bf16.h"
#include "util/threadpool.h"
#include "vision/preprocess.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rs = 88172645463325252ull;
static float urand(void) {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (float)((rs >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static wmat rmat(int rows, int cols, float scale) {
    uint16_t *w = malloc(sizeof(uint16_t) * (size_t)rows * cols);
    for (size_t i = 0; i < (size_t)rows * cols; i++) w[i] = f32_to_bf16(scale * urand());
    return (wmat){w, WT_BF16, rows, cols};
}
static float *rvec(int n, float mean, float scale) {
    float *v = malloc(sizeof(float) * n);
    for (int i = 0; i < n; i++) v[i] = mean + scale * urand();
    return v;
}

int main(int argc, char **argv) {
    int nth = argc > 1 ? atoi(argv[1]) : 0;
    const char *preset = argc > 2 ? argv[2] : "0.8b";
    int depth = 12, D = 768, heads = 12, I = 3072, out = 1024;
    if (!strcmp(preset, "27b")) depth = 27, D = 1152, heads = 16, I = 4304, out = 5120;
    static model m;
    vision_weights *v = &m.vis;
    m.H = out;
    *v = (vision_weights){.present = 1,
                          .D = D,
                          .heads = heads,
                          .head_dim = D / heads,
                          .I = I,
                          .depth = depth,
                          .patch = 16,
                          .temporal = 2,
                          .merge = 2,
                          .in_ch = 3,
                          .patch_dim = 1536,
                          .out_hidden = out,
                          .grid_side = 48};
    float s = 0.03f;
    v->patch_w = rmat(D, 1536, s);
    v->patch_b = rvec(D, 0, 0.1f);
    v->pos = rvec(48 * 48 * D, 0, 0.5f);
    v->inv_freq = malloc(sizeof(float) * v->head_dim / 4);
    for (int i = 0; i < v->head_dim / 4; i++)
        v->inv_freq[i] = 1.0f / powf(10000.0f, (float)(2 * i) / (float)(v->head_dim / 2));
    v->blocks = calloc((size_t)depth, sizeof *v->blocks);
    for (int b = 0; b < depth; b++) {
        vision_block_weights *w = &v->blocks[b];
        w->norm1_w = rvec(D, 1, 0.1f), w->norm1_b = rvec(D, 0, 0.1f), w->norm2_w = rvec(D, 1, 0.1f),
        w->norm2_b = rvec(D, 0, 0.1f);
        w->qkv = rmat(3 * D, D, s), w->qkv_b = rvec(3 * D, 0, 0.1f);
        w->proj = rmat(D, D, s), w->proj_b = rvec(D, 0, 0.1f);
        w->fc1 = rmat(I, D, s), w->fc1_b = rvec(I, 0, 0.1f);
        w->fc2 = rmat(D, I, s), w->fc2_b = rvec(D, 0, 0.1f);
    }
    v->mnorm_w = rvec(D, 1, 0.1f), v->mnorm_b = rvec(D, 0, 0.1f);
    v->mfc1 = rmat(4 * D, 4 * D, s), v->mfc1_b = rvec(4 * D, 0, 0.1f);
    v->mfc2 = rmat(out, 4 * D, s), v->mfc2_b = rvec(out, 0, 0.1f);
    threadpool *tp = tp_create(nth);
    const char *dev = getenv("CINFER_DEVICE");
    cuda_vision *cv = NULL;
    if (dev && !strcmp(dev, "cuda")) {
        char err[256];
        float *wx = calloc((size_t)16 * 1536, sizeof(float)), *wo = malloc(sizeof(float) * 4 * out);
        vision_grid wg = {1, 4, 4};
        if (cuda_vision_create(&m, &cv, err, sizeof err) ||
            cuda_vision_encode(cv, wx, &wg, 1, wo, NULL, NULL, err, sizeof err)) {
            fprintf(stderr, "cuda: %s\n", err);
            return 1;
        }
        free(wx), free(wo);
    }
    printf("vision tower %s (depth %d, width %d, heads %d, mlp %d -> %d), %s\n", preset, depth, D, heads, I,
           out, cv ? "cuda" : "cpu");
    if (!cv) printf("%d threads\n", tp_size(tp));
    printf("%6s %8s %7s %10s %10s %9s %9s\n", "side", "patches", "tokens", "prep s", "tower s", "images/s",
           "GFLOP/s");
    vision_pp_config pc = vision_pp_default_config();
    int sides_def[] = {448, 1024, 2048};
    int ns = argc > 3 ? argc - 3 : 3;
    for (int k = 0; k < ns; k++) {
        int side = argc > 3 ? atoi(argv[3 + k]) : sides_def[k];
        uint8_t *rgb = malloc((size_t)side * side * 3);
        for (size_t i = 0; i < (size_t)side * side * 3; i++)
            rgb[i] = (uint8_t)(i * 2654435761u >> 24) ^ (uint8_t)(i / (side * 3));
        char err[256];
        vision_pixels px;
        double t0 = now();
        if (vision_preprocess(rgb, side, side, &pc, &px, err, sizeof err)) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        double t1 = now();
        vision_grid g = {px.grid_t, px.grid_h, px.grid_w};
        int64_t N = px.n_patches, T = vision_tokens(v, g);
        float *o = malloc(sizeof(float) * (size_t)T * out);
        int reps = cv && side <= 1024 ? 3 : 1;
        for (int r = 0; r < reps; r++)
            if (cv ? cuda_vision_encode(cv, px.data, &g, 1, o, NULL, NULL, err, sizeof err)
                   : vision_encode(&m, tp, px.data, &g, 1, o, NULL, NULL, err, sizeof err)) {
                fprintf(stderr, "%s\n", err);
                return 1;
            }
        double t2 = t1 + (now() - t1) / reps;
        double lin = 2.0 * N * ((double)depth * (4.0 * D * D + 2.0 * D * I) + 1536.0 * D) +
                     2.0 * (N / 4.0) * (16.0 * D * D + 4.0 * D * out);
        double att = (double)depth * 4.0 * (double)N * N * D;
        printf("%6d %8lld %7lld %10.3f %10.3f %9.4f %9.1f\n", side, (long long)N, (long long)T, t1 - t0,
               t2 - t1, 1.0 / (t2 - t0), (lin + att) / (t2 - t1) * 1e-9);
        fflush(stdout);
        free(o);
        free(rgb);
        vision_pixels_free(&px);
    }
    cuda_vision_destroy(cv);
    tp_destroy(tp);
    return 0;
}

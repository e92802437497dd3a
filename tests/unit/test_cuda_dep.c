/* test_cuda_dep.c — the counter handoff between decode GEMVs (CINFER_CUDA_DEP, backend/cuda/common.cuh's
 * dep_post / dep_wait): a GEMV that reads the output of the GEMV launched just before it waits for that
 * launch's blocks to bump a counter instead of griddepcontrol.wait. Only when blocks start reading changes,
 * so every output must be BITWISE what griddep_wait gives: the 4B layer's GEMV chain (in_proj with the norm,
 * out_proj adding into the residual, gate_up with SwiGLU, down adding) at M = 1, 3, 8, 9 (two launches), 64,
 * eager and from a graph replayed twice, against the same chain without counters; every consumer must really
 * have waited by a counter (cu_dep_last_waited). And the bookkeeping that keeps a wrong pairing (a silent
 * race) out: a launch that does not post (a row kernel), a copy, cu_dep_end, or a chain without
 * cu_dep_chain leaves the next GEMV on griddep_wait — with 40 residual adds between a poster and a GEMV
 * reading their sum, which a GEMV released by the poster's counter would race. The whole forward with the
 * switch is in test_cuda_pdl.c. Without a CUDA build or device every test skips. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cinfer.h"
#include "model/forward_cuda.h"
#include "cuda_ctx.h"
#include "test.h"

#ifdef CINFER_CUDA
#include "backend/cuda/cuda_ops.h"

#define NO_DEVICE() (!cuda_built() || cuda_devices() < 1)

enum { L = 2, H = 2560, NIN = 12352, VD = 4096, I = 9216, MMAX = 64 };

typedef struct {
    uint16_t *w[L][4];
    float *x, *proj, *act, *g;
} chain_bufs;

static float *get(const float *d, size_t n) {
    char err[256];
    float *h = malloc(n * sizeof(float));
    if (h && cu_download(h, d, n * sizeof(float), err, sizeof err)) {
        free(h);
        return NULL;
    }
    return h;
}

/* The chain of L layers from fresh inputs; dep: with the counters (each GEMV after the first chained);
 * waited: how many consumers waited by a counter */
static void enqueue_chain(cu_ctx *c, chain_bufs *b, int M, int dep, int *waited) {
    if (dep) cu_dep_begin(c);
    for (int l = 0; l < L; l++) {
        for (int q = 0; q < 4; q++) {
            if (dep && (l || q)) cu_dep_chain(c);
            if (q == 0) cu_gemv_fused(c, b->proj, b->x, b->w[l][0], M, NIN, H, b->g, 1e-6f, CU_EPI_STORE);
            if (q == 1) cu_gemv_fused(c, b->x, b->act, b->w[l][1], M, H, VD, NULL, 0.0f, CU_EPI_ADD);
            if (q == 2) cu_gemv_fused(c, b->act, b->x, b->w[l][2], M, I, H, b->g, 1e-6f, CU_EPI_SWIGLU);
            if (q == 3) cu_gemv_fused(c, b->x, b->act, b->w[l][3], M, H, I, NULL, 0.0f, CU_EPI_ADD);
            /* in_proj -> out_proj is no producer / consumer pair in the model (the DeltaNet or attention
             * kernel is between), but here it is one: out_proj reads act, written by the previous down's
             * predecessor, and adds into x, which every GEMV before it wrote — so it waits too */
            if (waited) *waited += cu_dep_last_waited(c);
        }
    }
    if (dep) cu_dep_end(c);
}

/* x, proj and act after the chain, from the same inputs */
static int run_chain(cu_ctx *c, chain_bufs *b, int M, int dep, int graph, int *waited, float **out) {
    char err[256];
    cu_fill_f32(c, b->x, (size_t)M * H, 0.5f);
    cu_fill_f32(c, b->act, (size_t)M * I, 0.01f);
    cu_fill_f32(c, b->proj, (size_t)M * NIN, NAN);
    if (cu_sync(c, err, sizeof err)) return -1;
    if (graph) {
        void *exec = NULL;
        if (cu_capture_begin(c, err, sizeof err)) return -1;
        enqueue_chain(c, b, M, dep, waited);
        if (cu_capture_end(c, &exec, err, sizeof err)) return -1;
        /* replayed twice: the counters are zeroed by the graph's own memset each time */
        for (int r = 0; r < 2; r++) {
            cu_fill_f32(c, b->x, (size_t)M * H, 0.5f);
            cu_fill_f32(c, b->act, (size_t)M * I, 0.01f);
            if (cu_graph_launch(c, exec, err, sizeof err)) return -1;
        }
        if (cu_sync(c, err, sizeof err)) return -1;
        cu_graph_destroy(exec);
    } else {
        enqueue_chain(c, b, M, dep, waited);
        if (cu_sync(c, err, sizeof err)) return -1;
    }
    out[0] = get(b->x, (size_t)M * H);
    out[1] = get(b->proj, (size_t)M * NIN);
    out[2] = get(b->act, (size_t)M * I);
    return out[0] && out[1] && out[2] ? 0 : -1;
}

static int alloc_chain(cu_ctx *c, chain_bufs *b) {
    char err[256];
    const int rows[4] = {NIN, H, 2 * I, H}, ks[4] = {H, VD, H, I};
    memset(b, 0, sizeof *b);
    for (int l = 0; l < L; l++)
        for (int q = 0; q < 4; q++) {
            if (cu_alloc((void **)&b->w[l][q], (size_t)rows[q] * ks[q] * 2, err, sizeof err)) return -1;
            cu_fill_random_bf16(c, b->w[l][q], (size_t)rows[q] * ks[q], 0.02f, 1300 + 4 * (uint64_t)l + q);
        }
    if (cu_alloc((void **)&b->x, (size_t)MMAX * H * 4, err, sizeof err) ||
        cu_alloc((void **)&b->proj, (size_t)MMAX * NIN * 4, err, sizeof err) ||
        cu_alloc((void **)&b->act, (size_t)MMAX * I * 4, err, sizeof err) ||
        cu_alloc((void **)&b->g, (size_t)H * 4, err, sizeof err))
        return -1;
    float gh[H];
    for (int i = 0; i < H; i++) gh[i] = 0.5f + (float)(i % 7) * 0.125f;
    if (cu_upload(b->g, gh, sizeof gh, err, sizeof err)) return -1;
    return 0;
}
static void free_chain(chain_bufs *b) {
    for (int l = 0; l < L; l++)
        for (int q = 0; q < 4; q++) cu_free(b->w[l][q]);
    cu_free(b->x), cu_free(b->proj), cu_free(b->act), cu_free(b->g);
}

TEST(cuda_dep_gemv_chain_bitwise) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    chain_bufs b;
    REQUIRE(alloc_chain(c, &b) == 0);
    const int dep0 = cu_dep_on(), pdl0 = cu_pdl_on();
    cu_set_pdl_mask(31);
    static const int Ms[] = {1, 3, 8, 9, 64};
    for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
        int M = Ms[mi];
        float *ref[3] = {0}, *got[3] = {0};
        cu_set_pdl(1);
        cu_set_dep(0);
        REQUIRE(run_chain(c, &b, M, 0, 0, NULL, ref) == 0);
        if (mi == 0) { /* the reference itself: every output written */
            int nan = 0;
            for (size_t i = 0; i < (size_t)M * NIN; i++) nan |= isnan(ref[1][i]);
            CHECK_MSG(!nan, "the chain without counters left an output unwritten");
        }
        for (int graph = 0; graph < 2; graph++) {
            int waited = 0;
            cu_set_dep(1);
            int rc = run_chain(c, &b, M, 1, graph, &waited, got);
            cu_set_dep(0);
            CHECK_MSG(rc == 0, "M=%d %s: the run failed", M, graph ? "graph" : "eager");
            if (rc) break;
            /* the graph ran twice from the same inputs: the same result as once */
            int same = !memcmp(got[0], ref[0], (size_t)M * H * 4) &&
                       !memcmp(got[1], ref[1], (size_t)M * NIN * 4) &&
                       !memcmp(got[2], ref[2], (size_t)M * I * 4);
            int nan = 0;
            for (size_t i = 0; i < (size_t)M * NIN; i++) nan |= isnan(got[1][i]);
            printf("     M=%2d %-5s dep on vs off: %s, %d of %d GEMVs waited by a counter\n", M,
                   graph ? "graph" : "eager", same ? "bit-identical" : "DIFFER", waited, 4 * L - 1);
            CHECK_MSG(same && !nan, "M=%d %s: the chain with counters differs from griddep_wait", M,
                      graph ? "graph" : "eager");
            /* the skinny tensor-core GEMM (CINFER_CUDA_SKINNY), where it takes these rows, never waits by one
             */
            int want = cu_skinny_takes(c, M, H) ? 0 : 4 * L - 1;
            CHECK_MSG(waited == want, "M=%d %s: %d chained GEMVs waited by a counter, want %d", M,
                      graph ? "graph" : "eager", waited, want);
            for (int k = 0; k < 3; k++) free(got[k]), got[k] = NULL;
        }
        for (int k = 0; k < 3; k++) free(ref[k]);
    }
    /* without PDL for the GEMVs nothing posts (a non-PDL consumer waits for completion anyway) */
    cu_set_pdl(0);
    cu_set_dep(1);
    int waited = 0;
    enqueue_chain(c, &b, 1, 1, &waited);
    REQUIRE(cu_sync(c, err, sizeof err) == 0);
    CHECK_MSG(waited == 0, "without PDL %d GEMVs waited by a counter", waited);
    cu_set_dep(dep0);
    cu_set_pdl(pdl0);
    free_chain(&b);
    cu_ctx_destroy(c);
}

/* A poster (down adding into x), then what case k puts between it and in_proj reading x: 40 residual adds
 * x += d (row kernels: they post nothing, so they disarm), a copy, nothing but without cu_dep_chain, or
 * cu_dep_end; in_proj must then wait by griddep_wait (for the last add), not by down's counter, and give what
 * it gives without counters. Then the control: adjacent, chained, it waits by the counter. */
static float *disarm_run(cu_ctx *c, chain_bufs *b, const float *d, int dep, int k, int *waited) {
    char err[256];
    cu_set_dep(dep);
    cu_fill_f32(c, b->x, H, 0.5f);
    cu_fill_f32(c, b->act, I, 0.01f);
    if (cu_sync(c, err, sizeof err)) return NULL;
    cu_dep_begin(c);
    cu_gemv_fused(c, b->x, b->act, b->w[0][3], 1, H, I, NULL, 0.0f, CU_EPI_ADD); /* posts */
    if (k == 0)
        for (int i = 0; i < 40; i++) cu_add(c, b->x, d, 1, H);
    if (k == 1) cu_d2d_async(c, b->proj, d, 16);
    if (k == 3) cu_dep_end(c);
    if (k != 2) cu_dep_chain(c);
    cu_gemv_fused(c, b->proj, b->x, b->w[1][0], 1, NIN, H, b->g, 1e-6f, CU_EPI_STORE);
    *waited = cu_dep_last_waited(c);
    cu_dep_end(c);
    cu_set_dep(0);
    if (cu_sync(c, err, sizeof err)) return NULL;
    return get(b->proj, NIN);
}

TEST(cuda_dep_disarm) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    chain_bufs b;
    REQUIRE(alloc_chain(c, &b) == 0);
    float *d = NULL;
    REQUIRE(cu_alloc((void **)&d, (size_t)H * 4, err, sizeof err) == 0);
    {
        float dh[H];
        for (int i = 0; i < H; i++) dh[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
        REQUIRE(cu_upload(d, dh, sizeof dh, err, sizeof err) == 0);
    }
    const int dep0 = cu_dep_on(), pdl0 = cu_pdl_on();
    cu_set_pdl_mask(31);
    cu_set_pdl(2);
    static const char *what[] = {"40 row kernels", "a copy", "no cu_dep_chain", "after cu_dep_end",
                                 "adjacent (control)"};
    for (int k = 0; k < 5; k++) {
        int w0 = 0, w1 = 0;
        float *ref = disarm_run(c, &b, d, 0, k, &w0), *got = disarm_run(c, &b, d, 1, k, &w1);
        REQUIRE(ref && got);
        int same = !memcmp(got, ref, (size_t)NIN * 4), want = k == 4;
        printf("     poster, %-18s, waiter: waited by a counter %d (off: %d), %s\n", what[k], w1, w0,
               same ? "bit-identical" : "DIFFER");
        CHECK_MSG(same, "%s: differs from the run without counters", what[k]);
        CHECK_MSG(w1 == want && w0 == 0, "%s: waited by a counter %d (off %d), want %d", what[k], w1, w0,
                  want);
        free(ref), free(got);
    }
    cu_set_dep(dep0);
    cu_set_pdl(pdl0);
    cu_free(d);
    free_chain(&b);
    cu_ctx_destroy(c);
}

#else

TEST(cuda_dep_not_built) {
    SKIP("no CUDA device: skipped (built without CUDA)");
}

#endif

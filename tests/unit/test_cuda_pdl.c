/* test_cuda_pdl.c — programmatic dependent launch across the decode step (CINFER_CUDA_PDL: 1 every decode
 * kernel, gemv the GEMVs only). PDL changes when a kernel's blocks start, never what they compute, so every
 * logit must be bit for bit what the plain launches give: per model, 3 sequences (a 2-token prefill, then
 * decode steps at batch 3), eager launches without PDL as the reference against PDL from CUDA graphs, PDL
 * eager, GEMV-only PDL, a profiled run with PDL (an event recorded between the phases: session 4's illegal
 * address), the attention decode kernel's prefetch (CINFER_CUDA_ATTN_PF=1) without and with PDL, that
 * with the L2 prefetch of the next GEMV's weights at 8 MB (CINFER_CUDA_L2PF_NEXT=8), the DeltaNet decode
 * kernel as clusters (CINFER_CUDA_GDN_CLUSTER=1 the first form, =2 the second) eager and from graphs with
 * PDL, and sequence 0 alone under all of them against the batch reference. PDL's level 2 covers decode steps
 * of contexts that do not speculate (pdl_step in forward_cuda.c). At the fixtures, and at the 4B shape with
 * few layers when CINFER_TEST_PDL_MODEL names such a checkpoint (`cinfer synth --like qwen3.5-4b
 * --layers 4 --vocab 2048 --out DIR`; the GPU script makes one). Without a CUDA build or device every test
 * skips. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cinfer.h"
#include "model/forward_cuda.h"
#include "runtime/ctx_internal.h"
#include "cuda_ctx.h"
#include "test.h"

#ifdef CINFER_CUDA

#define NO_DEVICE() (!cuda_built() || cuda_devices() < 1)

/* one run under the given switches (NULL: unset); pf: CINFER_CUDA_ATTN_PF=1 unless "0", and "2" the attention
 * prefetch and the next GEMV's weights prefetched at 8 MB (CINFER_CUDA_L2PF_NEXT=8); gdnc: the value of
 * CINFER_CUDA_GDN_CLUSTER (NULL unset) */
static int run_with(cinfer_model *m, const char *pdl, const char *graphs, const char *pf, const char *gdnc,
                    int B, int prof, int V, float *out) {
    if (gdnc) { /* at every batch size (its default covers only the smallest) */
        setenv("CINFER_CUDA_GDN_CLUSTER", gdnc, 1);
        setenv("CINFER_CUDA_GDN_CLUSTER_MAX", "0", 1);
    } else {
        unsetenv("CINFER_CUDA_GDN_CLUSTER");
        unsetenv("CINFER_CUDA_GDN_CLUSTER_MAX");
    }
    if (pf && !strcmp(pf, "2")) {
        setenv("CINFER_CUDA_L2PF_NEXT", "8", 1);
    } else {
        unsetenv("CINFER_CUDA_L2PF_NEXT");
    }
    if (pdl)
        setenv("CINFER_CUDA_PDL", pdl, 1);
    else
        unsetenv("CINFER_CUDA_PDL");
    if (graphs)
        setenv("CINFER_CUDA_GRAPHS", graphs, 1);
    else
        unsetenv("CINFER_CUDA_GRAPHS");
    if (pf)
        setenv("CINFER_CUDA_ATTN_PF", strcmp(pf, "0") ? "1" : "0", 1);
    else
        unsetenv("CINFER_CUDA_ATTN_PF");
    int rc = test_run_seqs(m, B, 2, 8, V, prof, out);
    unsetenv("CINFER_CUDA_PDL");
    unsetenv("CINFER_CUDA_GRAPHS");
    unsetenv("CINFER_CUDA_ATTN_PF");
    unsetenv("CINFER_CUDA_L2PF_NEXT");
    unsetenv("CINFER_CUDA_GDN_CLUSTER");
    unsetenv("CINFER_CUDA_GDN_CLUSTER_MAX");
    return rc;
}

static void pdl_case(const char *dir, const char *name) {
    char err[512];
    cinfer_model *m;
    if (cinfer_model_open(dir, &m, err, sizeof err)) {
        test_fail(__FILE__, __LINE__, "%s: %s", name, err);
        return;
    }
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    int V = info.vocab_size, B = 3, D = 8;
    size_t n = (size_t)(D + 1) * B * V, nb = n * sizeof(float);
    float *ref = malloc(nb), *got = malloc(nb);
    /* NaN everywhere first: a run that leaves a logit unwritten differs from the reference */
    for (size_t i = 0; i < n; i++) ref[i] = NAN;
    int rc = run_with(m, "0", "0", "0", "0", B, 0, V, ref);
    static const struct {
        const char *what, *pdl, *graphs, *pf, *gdnc;
        int prof;
    } runs[] = {
        {"PDL graphs", "1", NULL, NULL, NULL, 0},
        {"PDL eager", "1", "0", NULL, NULL, 0},
        {"GEMV-only PDL graphs", "gemv", NULL, NULL, NULL, 0},
        {"PDL profiled", "1", "0", NULL, NULL, 1},
        {"attention prefetch", "0", NULL, "1", NULL, 0},
        {"PDL + attn prefetch", "1", NULL, "1", NULL, 0},
        {"GDN clusters eager", "0", "0", "0", "1", 0},
        {"GDN clusters PDL graph", "1", NULL, NULL, "1", 0},
        {"GDN clusters 2 eager", "0", "0", "0", "2", 0},
        {"GDN clusters 2 PDL graph", "1", NULL, NULL, "2", 0},
        {"PDL + every new form", "1", NULL, "2", "2", 0},
    };
    for (size_t k = 0; !rc && k < sizeof runs / sizeof runs[0]; k++) {
        for (size_t i = 0; i < n; i++) got[i] = NAN;
        if (run_with(m, runs[k].pdl, runs[k].graphs, runs[k].pf, runs[k].gdnc, B, runs[k].prof, V, got))
            break;
        int same = !memcmp(got, ref, nb);
        printf("     %-14s %-22s vs plain eager: %s\n", name, runs[k].what,
               same ? "bit-identical" : "DIFFER");
        CHECK_MSG(same, "%s: %s differs from plain eager launches", name, runs[k].what);
    }
    if (!rc) {
        /* sequence 0 alone, PDL from graphs, against its row in the plain batch */
        for (size_t i = 0; i < n; i++) got[i] = NAN;
        if (!run_with(m, "1", NULL, "2", "2", 1, 0, V, got)) {
            int same = 1;
            for (int t = 0; t <= D; t++)
                same &= !memcmp(got + (size_t)t * V, ref + (size_t)t * B * V, (size_t)V * sizeof(float));
            printf("     %-14s %-22s vs plain batch: %s\n", name, "PDL alone",
                   same ? "bit-identical" : "DIFFER");
            CHECK_MSG(same, "%s: a sequence alone under PDL differs from the same in a plain batch", name);
        }
    }
    free(ref), free(got);
    cinfer_model_close(m);
}

TEST(cuda_pdl_bitwise_fixtures) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    static const char *fx[] = {"qwen35_dense", "qwen35_text", "qwen35_moe", "qwen3_next"};
    for (size_t i = 0; i < sizeof fx / sizeof fx[0]; i++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/%s", test_fixtures_dir(), fx[i]);
        pdl_case(dir, fx[i]);
    }
}

TEST(cuda_pdl_bitwise_4b_shape) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    const char *dir = getenv("CINFER_TEST_PDL_MODEL");
    if (!dir || !*dir)
        SKIP("CINFER_TEST_PDL_MODEL unset (a `cinfer synth --like qwen3.5-4b --layers 4` dir)");
    pdl_case(dir, "4b-shape");
}

#else

TEST(cuda_pdl_not_built) {
    SKIP("no CUDA device: skipped (built without CUDA)");
}

#endif

/* test_cuda_dep_probe.c — how soon a PDL-launched kernel is released after the one before it (dep_probe.cu):
 * griddepcontrol.wait against a counter with fences (session 8's CINFER_CUDA_DEP, removed: no earlier on the
 * H200) and a counter with release / acquire only, in a chain of 16 GEMV-like kernels of 640 blocks, each
 * streaming 20 MB (out_proj-sized; 320 MB in all, nothing stays in L2). Per mode the mean gap from a
 * producer's last block end to its consumer's first block released, the mean kernel length and the chain's
 * time; and griddepcontrol.wait with the stamps stored at an index taken by atomicAdd on one counter, as the
 * GEMV timeline test's are (how much of the gap that test shows is its own). Fails if a consumer block is
 * released before its producer's last block ended (a broken handoff).
 * Without a CUDA build or device it skips. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "cinfer.h"
#include "model/forward_cuda.h"
#include "cuda_ctx.h"
#include "test.h"

#ifdef CINFER_CUDA
#include "backend/cuda/cuda_ops.h"

#define NO_DEVICE() (!cuda_built() || cuda_devices() < 1)

TEST(cuda_dep_probe_handoff) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    enum { NL = 16, NB = 640 };
    const size_t each = (size_t)NB * 16 * 2048; /* 20 MB */
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    uint16_t *w = NULL;
    unsigned *ctr = NULL, *sink = NULL;
    unsigned long long *st = NULL;
    REQUIRE(cu_alloc((void **)&w, each * NL, err, sizeof err) == 0);
    REQUIRE(cu_alloc((void **)&ctr, (NL + 1) * sizeof(unsigned), err, sizeof err) == 0);
    REQUIRE(cu_alloc((void **)&sink, NB * sizeof(unsigned), err, sizeof err) == 0);
    REQUIRE(cu_alloc((void **)&st, (size_t)NL * NB * 3 * 8, err, sizeof err) == 0);
    cu_fill_random_bf16(c, w, each * NL / 2, 0.02f, 4242);
    unsigned long long *h = malloc((size_t)NL * NB * 3 * 8);
    REQUIRE(h);
    static const char *name[4] = {"griddepcontrol.wait", "counter + fence.sc", "counter, release/acquire",
                                  "wait, stamps by atomicAdd"};
    for (int mode = 0; mode < 4; mode++) {
        double gap = 0, len = 0, total = 0;
        int bad = 0;
        for (int rep = 0; rep < 3; rep++) { /* the first warms up */
            REQUIRE(cu_dep_probe(c, mode, NL, w, each, NB, ctr, st, sink) == 0);
            REQUIRE(cu_sync(c, err, sizeof err) == 0);
            if (!rep) continue;
            REQUIRE(cu_download(h, st, (size_t)NL * NB * 3 * 8, err, sizeof err) == 0);
            unsigned long long first = ~0ull, last = 0, prev_end = 0;
            for (int l = 0; l < NL; l++) {
                unsigned long long s0 = ~0ull, w0 = ~0ull, e1 = 0;
                for (int b = 0; b < NB; b++) {
                    const unsigned long long *s = h + ((size_t)l * NB + b) * 3;
                    if (s[0] < s0) s0 = s[0];
                    if (s[1] < w0) w0 = s[1];
                    if (s[2] > e1) e1 = s[2];
                    /* %globaltimer ticks are ~0.25 us: a release more than one tick before the end is a bug
                     */
                    if (l && s[1] + 300 < prev_end) bad++;
                }
                if (l) gap += ((double)w0 - (double)prev_end) / 1e3;
                len += ((double)e1 - (double)s0) / 1e3;
                if (s0 < first) first = s0;
                if (e1 > last) last = e1;
                prev_end = e1;
            }
            total += ((double)last - (double)first) / 1e3;
        }
        printf("     %-26s released %+5.2f us after the producer's last block (mean of %d x 2), kernel %6.2f "
               "us, "
               "chain of %d %7.2f us\n",
               name[mode], gap / (2.0 * (NL - 1)), NL - 1, len / (2.0 * NL), NL, total / 2.0);
        CHECK_MSG(!bad, "%s: %d consumer blocks released before their producer ended", name[mode], bad);
    }
    free(h);
    cu_free(w), cu_free(ctr), cu_free(sink), cu_free(st);
    cu_ctx_destroy(c);
}

#else

TEST(cuda_dep_probe_not_built) {
    SKIP("no CUDA device: skipped (built without CUDA)");
}

#endif

/* cuda_ctx.h — what the CUDA tests share (test_cuda_pdl, test_cuda_fuse, test_parity_cuda*): a context with
 * the sizes a test needs, and a run of B sequences (a prefill, then decode steps of all of them at once)
 * whose logits the tests compare bit for bit between switches. A context that cannot be made fails the test
 * (it never aborts). */
#ifndef CI_TESTS_CUDA_CTX_H
#define CI_TESTS_CUDA_CTX_H

#include <stdint.h>
#include <stdio.h>

#include "cinfer.h"
#include "model/forward_cuda.h"
#include "runtime/ctx_internal.h"
#include "test.h"

static inline cinfer_ctx *test_ctx(cinfer_model *m, int device, int seqs, int n_ctx, int batch, int threads) {
    cinfer_ctx_params p = cinfer_ctx_default_params();
    p.max_seqs = seqs, p.max_ctx = n_ctx, p.max_batch = batch, p.n_threads = threads, p.device = device;
    cinfer_ctx *c = NULL;
    char err[512];
    if (cinfer_ctx_create(m, &p, &c, err, sizeof err)) {
        test_fail(__FILE__, __LINE__, "%s context: %s", device == CINFER_DEVICE_CUDA ? "cuda" : "cpu", err);
        return NULL;
    }
    return c;
}

/* B (<= 8) sequences on a fresh cuda context: a prefill of P tokens each (one call), then D decode steps of
 * all B at once; out gets [D + 1][B][V] (the prefill's last rows, then each step's). prof: the profile on
 * for the whole run (an event recorded between the phases of every step) */
static inline int test_run_seqs(cinfer_model *m, int B, int P, int D, int V, int prof, float *out) {
    char err[512];
    if (B > 8 || P + D > 64) {
        test_fail(__FILE__, __LINE__, "test_run_seqs: %d sequences of %d tokens (at most 8 of 64)", B, P + D);
        return -1;
    }
    cinfer_ctx *c = test_ctx(m, CINFER_DEVICE_CUDA, B, 64, 64, 2);
    if (!c) return -1;
    int seqs[8];
    int32_t toks[8][64];
    for (int s = 0; s < B; s++) {
        seqs[s] = cinfer_seq_open(c, err, sizeof err);
        for (int i = 0; i < P + D; i++) toks[s][i] = (int32_t)((i * 37 + s * 11 + 5) % V);
    }
    if (prof) ctx_profile(c, 1, NULL, NULL);
    cinfer_batch_entry be[8];
    for (int s = 0; s < B; s++) be[s] = (cinfer_batch_entry){seqs[s], toks[s], P, 0};
    int rc = cinfer_forward(c, be, B, out, err, sizeof err);
    for (int t = 0; t < D && !rc; t++) {
        for (int s = 0; s < B; s++) be[s] = (cinfer_batch_entry){seqs[s], toks[s] + P + t, 1, 0};
        rc = cinfer_forward(c, be, B, out + (size_t)(t + 1) * B * V, err, sizeof err);
    }
    if (!rc) rc = ctx_sync(c, err, sizeof err);
    if (prof) {
        double ms[CP_N];
        int calls = 0;
        ctx_profile(c, 0, ms, &calls);
    }
    if (rc) test_fail(__FILE__, __LINE__, "forward: %s", err);
    cinfer_ctx_destroy(c);
    return rc;
}

#endif

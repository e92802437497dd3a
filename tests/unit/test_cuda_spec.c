/* test_cuda_spec.c — issue 6 on the GPU (GPU only; every test skips without a CUDA device): speculative
 * windows roll the device DeltaNet state back exactly (after 0, 1, k-1 and k accepted drafts the slot holds
 * the bits of never having drafted), the engine's greedy output with n-gram, oracle and draft-model drafts is
 * the plain cuda output token for token (alone and 16 at once), and a prompt resumed from the prefix cache
 * (state snapshots spilled to pinned host memory, KV blocks shared, a partial block copied on the device)
 * gives its cold logits and the same greedy tokens. The fixture model qwen35_dense travels with the tests (no
 * models/default weights on the GPU machine). Contexts stay under 64 positions, entries under 16 rows and
 * every GEMM on the f32-activation GEMV (CINFER_CUDA_GEMV_MAX), so the attention takes one split and no tiles
 * and a row's bits do not depend on its batch: exact equality is the right check. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cinfer.h"
#include "model/forward_cuda.h"
#include "runtime/ctx_internal.h"
#include "runtime/engine_internal.h"
#include "fixture.h"
#include "test.h"

static int no_device(void) {
    return !cuda_built() || cuda_devices() < 1;
}

static cinfer_ctx *cuda_ctx(cinfer_model *m, int seqs, int ctx, int batch, int spec_window,
                            int64_t prefix_mem) {
    cinfer_ctx_params p = cinfer_ctx_default_params();
    p.max_seqs = seqs;
    p.max_ctx = ctx;
    p.max_batch = batch;
    p.n_threads = 2;
    p.spec_window = spec_window;
    p.prefix_cache_memory = prefix_mem;
    p.device = CINFER_DEVICE_CUDA;
    cinfer_ctx *c = NULL;
    char err[512];
    if (cinfer_ctx_create(m, &p, &c, err, sizeof err)) test_fail(__FILE__, __LINE__, "cuda context: %s", err);
    return c;
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Sequence A decodes the kept tokens one by one; sequence B (same prompt) verifies a window [last | k drafts]
 * whose first `acc` drafts are the true tokens, commits 1 + acc, and must then hold A's state bit for bit,
 * give the window's kept rows A's logits, and continue exactly as A. acc = -1: the window is dropped (commit
 * 0). */
static void rollback_case(cinfer_model *m, int acc, int k) {
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    int V = info.vocab_size, P = 11;
    char err[512];
    cinfer_ctx *c = cuda_ctx(m, 2, 64, 64, k + 1, 0);
    REQUIRE(c);
    size_t nf = ctx_seq_state_floats(c);
    float *sa = malloc(nf * sizeof(float)), *sb = malloc(nf * sizeof(float));
    float *la = malloc(sizeof(float) * (size_t)(k + 2) * V),
          *lb = malloc(sizeof(float) * (size_t)(k + 2) * V);
    int32_t prompt[16], toks[16];
    for (int i = 0; i < P; i++) prompt[i] = (int32_t)((i * 37 + 5) % V);
    int a = cinfer_seq_open(c, err, sizeof err), b = cinfer_seq_open(c, err, sizeof err);
    REQUIRE(a >= 0 && b >= 0);
    cinfer_batch_entry pa = {a, prompt, P, 0, 0, NULL}, pb = {b, prompt, P, 0, 0, NULL};
    REQUIRE(cinfer_forward(c, &pa, 1, la, err, sizeof err) == 0);
    REQUIRE(cinfer_forward(c, &pb, 1, lb, err, sizeof err) == 0);
    /* A: greedy tokens toks[0..k] one by one (toks[0] follows the prompt), logits of each step kept */
    toks[0] = argmax(la, V);
    float *steps = malloc(sizeof(float) * (size_t)(k + 1) * V);
    for (int t = 0; t < k + 1; t++) {
        cinfer_batch_entry d = {a, &toks[t], 1, 0, 0, NULL};
        REQUIRE(cinfer_forward(c, &d, 1, steps + (size_t)t * V, err, sizeof err) == 0);
        toks[t + 1] = argmax(steps + (size_t)t * V, V);
    }
    /* B: the window, drafts right up to acc then wrong */
    int32_t win[16];
    win[0] = toks[0];
    for (int j = 1; j <= k; j++) win[j] = j <= acc ? toks[j] : (toks[j] + 1) % V;
    cinfer_batch_entry w = {b, win, k + 1, 1, 1, NULL};
    REQUIRE(cinfer_forward(c, &w, 1, lb, err, sizeof err) == 0);
    int keep = acc < 0 ? 0 : acc + 1;
    for (int t = 0; t < keep; t++)
        CHECK_MSG(!memcmp(lb + (size_t)t * V, steps + (size_t)t * V, sizeof(float) * (size_t)V),
                  "accepted %d: window row %d differs from plain decode", acc, t);
    REQUIRE(cinfer_seq_commit(c, b, keep, err, sizeof err) == 0);
    /* A must stand where B now stands: rewind A by rebuilding it to the same length */
    cinfer_seq_close(c, a);
    a = cinfer_seq_open(c, err, sizeof err);
    REQUIRE(a >= 0);
    REQUIRE(cinfer_forward(c, &pa, 1, la, err, sizeof err) == 0);
    for (int t = 0; t < keep; t++) {
        cinfer_batch_entry d = {a, &toks[t], 1, 0, 0, NULL};
        REQUIRE(cinfer_forward(c, &d, 1, la, err, sizeof err) == 0);
    }
    CHECK_EQ_INT(cinfer_seq_len(c, a), cinfer_seq_len(c, b));
    REQUIRE(ctx_seq_state_copy(c, a, sa, err, sizeof err) == 0);
    REQUIRE(ctx_seq_state_copy(c, b, sb, err, sizeof err) == 0);
    size_t diff = 0, first = 0;
    double worst = 0;
    for (size_t i = 0; i < nf; i++)
        if (memcmp(&sa[i], &sb[i], sizeof(float))) {
            if (!diff++) first = i;
            double d = fabs((double)sa[i] - sb[i]);
            if (!(d <= worst)) worst = d;
        }
    /* an index below n_lin x (K-1) x C is in a conv window, above it in some layer's S */
    CHECK_MSG(
        diff == 0,
        "accepted %d of %d: %zu of %zu state floats differ from never having drafted (first at %zu: %.9g vs "
        "%.9g, max |d| %.3g)",
        acc, k, diff, nf, first, diff ? (double)sb[first] : 0.0, diff ? (double)sa[first] : 0.0, worst);
    /* both continue with the same token: same logits, bit for bit (KV truncation: B's rejected rows are dead)
     */
    int32_t nxt = toks[keep];
    cinfer_batch_entry da = {a, &nxt, 1, 0, 0, NULL}, db = {b, &nxt, 1, 0, 0, NULL};
    REQUIRE(cinfer_forward(c, &da, 1, la, err, sizeof err) == 0);
    REQUIRE(cinfer_forward(c, &db, 1, lb, err, sizeof err) == 0);
    CHECK_MSG(!memcmp(la, lb, sizeof(float) * (size_t)V), "accepted %d: the next step's logits differ", acc);
    free(sa), free(sb), free(la), free(lb), free(steps);
    cinfer_ctx_destroy(c);
}

/* every GEMM on the GEMV (row results independent of the batch) for the contexts made until gemv_off() */
static void gemv_on(void) {
    setenv("CINFER_CUDA_GEMV_MAX", "1000000", 1);
}
static void gemv_off(void) {
    unsetenv("CINFER_CUDA_GEMV_MAX");
}

TEST(cuda_spec_rollback_is_exact) {
    if (no_device()) SKIP("no CUDA device: skipped");
    gemv_on();
    cinfer_model *m = open_fixture("qwen35_dense");
    REQUIRE(m);
    int k = 4;
    int accs[] = {-1, 0, 1, k - 1, k};
    for (int i = 0; i < 5; i++) rollback_case(m, accs[i], k);
    gemv_off();
    cinfer_model_close(m);
}

/* Rounds back to back, as the engine runs them: B verifies windows with 0 / 1 / k-1 / k right drafts (some
 * with every draft wrong, some dropped whole, some shorter than the window with pad rows after them), plain
 * decode steps in between, never reading its state until the end — so with CINFER_CUDA_SPEC_FUSE=1 every
 * commit is replayed by the slot's next step (a window or a decode token) inside its kernels. Every kept
 * row's logits must be plain decode's bit for bit, and B's state at the end the state of decoding the same
 * tokens. */
static void rounds_case(cinfer_model *m, int k) {
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    enum { P = 9, N = 44 };
    int V = info.vocab_size;
    char err[512];
    cinfer_ctx *c = cuda_ctx(m, 3, 64, 64, k + 1, 0);
    REQUIRE(c);
    size_t nf = ctx_seq_state_floats(c);
    float *sa = malloc(nf * sizeof(float)), *sb = malloc(nf * sizeof(float));
    float *steps = malloc(sizeof(float) * (size_t)(N + 1) * V),
          *lb = malloc(sizeof(float) * (size_t)(k + 1) * V);
    int32_t prompt[P], toks[N + 2];
    for (int i = 0; i < P; i++) prompt[i] = (int32_t)((i * 41 + 3) % V);
    int a = cinfer_seq_open(c, err, sizeof err), b = cinfer_seq_open(c, err, sizeof err);
    REQUIRE(a >= 0 && b >= 0);
    cinfer_batch_entry pa = {a, prompt, P, 0, 0, NULL}, pb = {b, prompt, P, 0, 0, NULL};
    REQUIRE(cinfer_forward(c, &pa, 1, steps, err, sizeof err) == 0);
    REQUIRE(cinfer_forward(c, &pb, 1, lb, err, sizeof err) == 0);
    toks[0] = argmax(steps, V);
    for (int t = 0; t < N; t++) { /* A: plain decode; steps row t: the logits after feeding toks[t] */
        cinfer_batch_entry d = {a, &toks[t], 1, 0, 0, NULL};
        REQUIRE(cinfer_forward(c, &d, 1, steps + (size_t)t * V, err, sizeof err) == 0);
        toks[t + 1] = argmax(steps + (size_t)t * V, V);
    }
    /* B: round r verifies a window of k + 1 rows holding nd = (r % (k + 1)) drafts, the first acc right */
    int g = 0, r = 0, bad_rows = 0, kept_rows = 0;
    while (g + k + 2 < N) {
        int nd = r % (k + 1), acc = (r / (k + 1)) % (nd + 2) - 1; /* acc: -1 (dropped) .. nd */
        r++;
        if (r % 5 == 0) { /* a plain decode step between windows */
            cinfer_batch_entry d = {b, &toks[g], 1, 0, 0, NULL};
            REQUIRE(cinfer_forward(c, &d, 1, lb, err, sizeof err) == 0);
            bad_rows += memcmp(lb, steps + (size_t)g * V, sizeof(float) * (size_t)V) != 0;
            kept_rows++, g++;
            continue;
        }
        int32_t win[17];
        win[0] = toks[g];
        for (int j = 1; j <= nd; j++) win[j] = j <= acc ? toks[g + j] : (toks[g + j] + 1) % V;
        for (int j = nd + 1; j <= k; j++) win[j] = win[j - 1]; /* pad rows repeat the last token */
        cinfer_batch_entry w = {b, win, k + 1, 1, 1, NULL};
        REQUIRE(cinfer_forward(c, &w, 1, lb, err, sizeof err) == 0);
        int keep = acc < 0 ? 0 : acc + 1;
        for (int t = 0; t < keep; t++) {
            bad_rows +=
                memcmp(lb + (size_t)t * V, steps + (size_t)(g + t) * V, sizeof(float) * (size_t)V) != 0;
            kept_rows++;
        }
        REQUIRE(cinfer_seq_commit(c, b, keep, err, sizeof err) == 0);
        g += keep;
    }
    /* one decode step last: with deferred commits it replays the last window's kept tokens itself */
    cinfer_batch_entry d = {b, &toks[g], 1, 0, 0, NULL};
    REQUIRE(cinfer_forward(c, &d, 1, lb, err, sizeof err) == 0);
    bad_rows += memcmp(lb, steps + (size_t)g * V, sizeof(float) * (size_t)V) != 0;
    kept_rows++, g++;
    printf("     %d rounds, %d tokens kept: %d rows differ from plain decode\n", r, g, bad_rows);
    CHECK_MSG(bad_rows == 0, "%d of %d kept rows differ from plain decode", bad_rows, kept_rows);
    /* C decodes the same g tokens one by one: B's state must be its state bit for bit */
    int cs = cinfer_seq_open(c, err, sizeof err);
    REQUIRE(cs >= 0);
    cinfer_batch_entry pc = {cs, prompt, P, 0, 0, NULL};
    REQUIRE(cinfer_forward(c, &pc, 1, lb, err, sizeof err) == 0);
    for (int t = 0; t < g; t++) {
        cinfer_batch_entry dc = {cs, &toks[t], 1, 0, 0, NULL};
        REQUIRE(cinfer_forward(c, &dc, 1, lb, err, sizeof err) == 0);
    }
    CHECK_EQ_INT(cinfer_seq_len(c, cs), cinfer_seq_len(c, b));
    REQUIRE(ctx_seq_state_copy(c, cs, sa, err, sizeof err) == 0);
    REQUIRE(ctx_seq_state_copy(c, b, sb, err, sizeof err) == 0);
    size_t diff = 0;
    for (size_t i = 0; i < nf; i++) diff += memcmp(&sa[i], &sb[i], sizeof(float)) != 0;
    CHECK_MSG(diff == 0, "after %d rounds: %zu of %zu state floats differ from decoding the kept tokens", r,
              diff, nf);
    free(sa), free(sb), free(steps), free(lb);
    cinfer_ctx_destroy(c);
}

/* the switches of the speculation's GPU path, each on and off: deferred commits (CINFER_CUDA_SPEC_FUSE) and
 * verify steps from CUDA graphs (CINFER_CUDA_VERIFY_GRAPHS) */
static void spec_switches(int fuse, int graphs) {
    setenv("CINFER_CUDA_SPEC_FUSE", fuse ? "1" : "0", 1);
    setenv("CINFER_CUDA_VERIFY_GRAPHS", graphs ? "1" : "0", 1);
}
static void spec_defaults(void) {
    unsetenv("CINFER_CUDA_SPEC_WINFUSED");
    unsetenv("CINFER_CUDA_SPEC_FUSE");
    unsetenv("CINFER_CUDA_VERIFY_GRAPHS");
    unsetenv("CINFER_SPEC_PAD");
}

TEST(cuda_spec_fused_rollback_is_exact) {
    if (no_device()) SKIP("no CUDA device: skipped");
    gemv_on();
    cinfer_model *m = open_fixture("qwen35_dense");
    REQUIRE(m);
    /* v 0-3: deferred commits x verify graphs; v 4: both, with the one-kernel decode layers of
     * CINFER_CUDA_GDN_FUSED / ATTN_FUSED in the plain steps between windows (a deferred commit is then done
     * by the commit kernels before such a step); v 5 / 6: the fused verify layer
     * (CINFER_CUDA_SPEC_WINFUSED=1) with deferred commits and graphs / with neither */
    for (int v = 0; v < 7; v++) {
        int fuse = v == 4 || v == 5 || (v < 4 && (v & 1)), graphs = v == 4 || v == 5 || (v < 4 && (v >> 1));
        spec_switches(fuse, graphs);
        if (v == 4) setenv("CINFER_CUDA_GDN_FUSED", "1", 1), setenv("CINFER_CUDA_ATTN_FUSED", "1", 1);
        /* the fused verify layer: off in v 0-3 (the five kernels), its default form in v 4, the first in 5 /
         * 6 */
        if (v != 4) setenv("CINFER_CUDA_SPEC_WINFUSED", v >= 5 ? "1" : "0", 1);
        printf("     CINFER_CUDA_SPEC_FUSE=%d CINFER_CUDA_VERIFY_GRAPHS=%d%s CINFER_CUDA_SPEC_WINFUSED=%s\n",
               fuse, graphs, v == 4 ? " CINFER_CUDA_GDN_FUSED=1 CINFER_CUDA_ATTN_FUSED=1" : "",
               v >= 5   ? "1"
               : v == 4 ? "default (2)"
                        : "0");
        rounds_case(m, 3);
        /* the single-round cases too (their state read flushes a deferred commit through the commit kernels)
         */
        int accs[] = {-1, 0, 1, 2, 3};
        for (int i = 0; i < 5; i++) rollback_case(m, accs[i], 3);
        unsetenv("CINFER_CUDA_GDN_FUSED"), unsetenv("CINFER_CUDA_ATTN_FUSED"),
            unsetenv("CINFER_CUDA_SPEC_WINFUSED");
    }
    spec_defaults();
    gemv_off();
    cinfer_model_close(m);
}

/* ---- the engine: speculation changes nothing in the greedy output ---- */

typedef struct got {
    int32_t ids[64];
    int n;
    int cached;
} got;

static cinfer_request_params greedy(const int32_t *p, int n, int max_tokens) {
    cinfer_request_params rp;
    memset(&rp, 0, sizeof rp);
    rp.prompt = p;
    rp.n_prompt = n;
    rp.max_tokens = max_tokens;
    rp.sampling = cinfer_sampling_default();
    rp.sampling.temperature = 0;
    rp.sampling.n_logprobs = 0;
    rp.ignore_eos = 1;
    return rp;
}

static void drain(cinfer_request *r, got *g) {
    memset(g, 0, sizeof *g);
    cinfer_event ev;
    while (cinfer_request_next(r, &ev, 60000) == 1) {
        if (ev.type == CINFER_EV_LOGPROB && g->n < 64) g->ids[g->n++] = ev.token;
        if (ev.type == CINFER_EV_DONE) g->cached = ev.cached_tokens;
    }
}

enum { NR = 16 };
typedef struct oracle {
    int32_t (*prompts)[32];
    const int *lens;
    got *plain;
    int calls;
} oracle;

/* drafts from the plain output with one wrong position per call, cycling 0..k: every acceptance count happens
 */
static int oracle_draft(void *ud, const int32_t *hist, int n_hist, int32_t *out, int k) {
    oracle *o = ud;
    for (int i = 0; i < NR; i++) {
        int L = o->lens[i];
        if (n_hist < L || memcmp(hist, o->prompts[i], sizeof(int32_t) * (size_t)L)) continue;
        int g = n_hist - L, bad = o->calls++ % (k + 1), cnt = 0;
        while (cnt < k && g + cnt < o->plain[i].n) {
            int32_t t = o->plain[i].ids[g + cnt];
            out[cnt] = cnt == bad ? (t + 1) % 256 : t;
            cnt++;
        }
        return cnt;
    }
    return 0;
}

/* each request's params past greedy(): request i, room for its logit_bias */
typedef void (*req_adjust)(cinfer_request_params *rp, int i, cinfer_logit_bias *lb);

static void run_engine_with(cinfer_model *m, int n, int32_t prompts[][32], const int *lens, const int *gens,
                            cinfer_spec_mode spec, cinfer_model *draft, oracle *o, req_adjust adj, got *out,
                            cinfer_engine_stats *st) {
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.max_seqs = NR;
    ep.ctx_size = 64;
    ep.step_tokens = 128;
    ep.n_threads = 2;
    ep.device = CINFER_DEVICE_CUDA;
    ep.spec = spec;
    ep.spec_max_draft = 4;
    ep.draft_model = draft;
    cinfer_engine *e;
    char err[1024];
    memset(st, 0, sizeof *st);
    if (cinfer_engine_create(m, &ep, &e, err, sizeof err)) {
        test_fail(__FILE__, __LINE__, "%s", err);
        return;
    }
    if (o) engine_set_drafter(e, oracle_draft, o);
    cinfer_request *rq[NR];
    for (int i = 0; i < n; i++) {
        cinfer_request_params rp = greedy(prompts[i], lens[i], gens[i]);
        cinfer_logit_bias lb[4];
        if (adj) adj(&rp, i, lb);
        if (cinfer_engine_submit(e, &rp, &rq[i], err, sizeof err)) {
            test_fail(__FILE__, __LINE__, "%s", err);
            rq[i] = NULL;
        }
    }
    for (int i = 0; i < n; i++)
        if (rq[i]) {
            drain(rq[i], &out[i]);
            cinfer_request_free(rq[i]);
        }
    cinfer_engine_get_stats(e, st);
    cinfer_engine_destroy(e);
}

static void run_engine(cinfer_model *m, int n, int32_t prompts[][32], const int *lens, const int *gens,
                       cinfer_spec_mode spec, cinfer_model *draft, oracle *o, got *out,
                       cinfer_engine_stats *st) {
    run_engine_with(m, n, prompts, lens, gens, spec, draft, o, NULL, out, st);
}

static void compare(const char *what, int n, const got *plain, const got *spec, const int *gens) {
    for (int i = 0; i < n; i++) {
        int at = 0;
        while (at < gens[i] && at < plain[i].n && at < spec[i].n && plain[i].ids[at] == spec[i].ids[at]) at++;
        if (at < gens[i])
            printf("     %s: request %d first differs at token %d of %d\n", what, i, at, gens[i]);
        CHECK_MSG(spec[i].n == gens[i] && plain[i].n == gens[i], "%s: request %d: %d / %d tokens of %d", what,
                  i, plain[i].n, spec[i].n, gens[i]);
        CHECK_MSG(!memcmp(plain[i].ids, spec[i].ids, sizeof(int32_t) * (size_t)gens[i]),
                  "%s: request %d: the output changed", what, i);
    }
}

static void engine_greedy_case(void) {
    gemv_on();
    /* the host chooses the tokens of the reference runs (device choice is the default since session 3) */
    setenv("CINFER_CUDA_SAMPLE", "0", 1);
    cinfer_model *m = open_fixture("qwen35_dense");
    REQUIRE(m);
    static int32_t prompts[NR][32];
    int lens[NR], gens[NR];
    for (int i = 0; i < NR; i++) {
        /* a motif repeated, so the n-gram lookup has drafts to make */
        int motif = 2 + i % 4;
        lens[i] = 8 + (i * 5) % 8; /* under 16 rows: no entry ever takes the tiled attention */
        for (int t = 0; t < lens[i]; t++) prompts[i][t] = (int32_t)(((t % motif) * 53 + i * 17 + 3) % 256);
        gens[i] = 16 + (i * 3) % 16;
    }
    static got plain[NR], spec[NR], alone[1];
    cinfer_engine_stats s0, s1;
    for (int batch = 1; batch <= NR; batch += NR - 1) {
        const char *tag = batch == 1 ? "alone" : "batch of 16";
        run_engine(m, batch, prompts, lens, gens, CINFER_SPEC_NONE, NULL, NULL, plain, &s0);
        run_engine(m, batch, prompts, lens, gens, CINFER_SPEC_NGRAM, NULL, NULL, spec, &s1);
        printf("     %s, ngram: %lld drafted, %lld accepted; steps %lld -> %lld\n", tag,
               (long long)s1.spec_drafted, (long long)s1.spec_accepted, (long long)s0.steps_total,
               (long long)s1.steps_total);
        compare("ngram", batch, plain, spec, gens);
        oracle o = {prompts, lens, plain, 0};
        run_engine(m, batch, prompts, lens, gens, CINFER_SPEC_NGRAM, NULL, &o, spec, &s1);
        printf("     %s, oracle drafts: %lld drafted, %lld accepted; steps %lld -> %lld\n", tag,
               (long long)s1.spec_drafted, (long long)s1.spec_accepted, (long long)s0.steps_total,
               (long long)s1.steps_total);
        compare("oracle drafts", batch, plain, spec, gens);
        CHECK(s1.spec_accepted > 0 && s1.steps_total < s0.steps_total);
        run_engine(m, batch, prompts, lens, gens, CINFER_SPEC_DRAFT, m, NULL, spec, &s1);
        printf("     %s, self-draft model: %lld drafted, %lld accepted; steps %lld -> %lld\n", tag,
               (long long)s1.spec_drafted, (long long)s1.spec_accepted, (long long)s0.steps_total,
               (long long)s1.steps_total);
        compare("draft model", batch, plain, spec, gens);
        CHECK_MSG(s1.spec_accepted * 10 >= s1.spec_drafted * 7, "self-draft accepted %lld of %lld",
                  (long long)s1.spec_accepted, (long long)s1.spec_drafted);
        run_engine(m, batch, prompts, lens, gens, CINFER_SPEC_MTP, NULL, NULL, spec, &s1);
        printf("     %s, MTP head: %lld drafted, %lld accepted; steps %lld -> %lld\n", tag,
               (long long)s1.spec_drafted, (long long)s1.spec_accepted, (long long)s0.steps_total,
               (long long)s1.steps_total);
        compare("MTP head", batch, plain, spec, gens);
        CHECK_MSG(s1.spec_drafted > 0, "the MTP head never drafted");
        if (batch == 1) alone[0] = plain[0];
    }
    /* greedy tokens chosen on the device (the default; verify windows' rows too) are the host's */
    static got dplain[NR];
    unsetenv("CINFER_CUDA_SAMPLE");
    run_engine(m, NR, prompts, lens, gens, CINFER_SPEC_NONE, NULL, NULL, dplain, &s0);
    compare("device choice, plain", NR, plain, dplain, gens);
    oracle od = {prompts, lens, plain, 0};
    run_engine(m, NR, prompts, lens, gens, CINFER_SPEC_NGRAM, NULL, &od, spec, &s1);
    compare("device choice, oracle drafts", NR, plain, spec, gens);
    CHECK(s1.spec_accepted > 0);
    run_engine(m, NR, prompts, lens, gens, CINFER_SPEC_MTP, NULL, NULL, spec, &s1);
    compare("device choice, MTP head", NR, plain, spec, gens);
    /* a sequence alone and in the batch of 16: on the GEMV path the same tokens */
    CHECK_MSG(!memcmp(alone[0].ids, plain[0].ids, sizeof(int32_t) * (size_t)gens[0]),
              "request 0 alone differs from in the batch");
    gemv_off();
    cinfer_model_close(m);
}

/* The engine's device sampler (session 12): requests with logit_bias and the repetition / presence /
 * frequency penalties. Greedy ones give the host sampler's tokens exactly (the adjusted logits are the CPU's
 * bit for bit, so their argmax is); sampled ones (T 0.8, top_k 20, top_p 0.9, min_p 0.02) give the same
 * tokens again with the same seed, alone and in a batch of 16 (the draw order depends on the request only).
 * The engine's counter shows the device chose them (and chose none with CINFER_CUDA_SAMPLE=0). */
/* logit_bias and the three penalties; sampled: T 0.8, top_k 20, top_p 0.9, min_p 0.02 and a seed */
static void with_penalties(cinfer_request_params *rp, int i, cinfer_logit_bias *lb) {
    lb[0] = (cinfer_logit_bias){rp->prompt[0], -1.5f};
    lb[1] = (cinfer_logit_bias){(rp->prompt[1] + 7) % 256, 2.0f};
    rp->sampling.repetition_penalty = 1.3f;
    rp->sampling.presence_penalty = 0.4f;
    rp->sampling.frequency_penalty = 0.2f;
    rp->sampling.logit_bias = lb, rp->sampling.n_logit_bias = 2;
    (void)i;
}
static void sampled_with_penalties(cinfer_request_params *rp, int i, cinfer_logit_bias *lb) {
    with_penalties(rp, i, lb);
    rp->sampling.temperature = 0.8f, rp->sampling.top_k = 20, rp->sampling.top_p = 0.9f;
    rp->sampling.min_p = 0.02f, rp->sampling.seed = 1000 + (uint64_t)i, rp->sampling.has_seed = 1;
}
static void run_sampled(cinfer_model *m, int n, int32_t prompts[][32], const int *lens, const int *gens,
                        int sampled, got *out, cinfer_engine_stats *st) {
    run_engine_with(m, n, prompts, lens, gens, CINFER_SPEC_NONE, NULL, NULL,
                    sampled ? sampled_with_penalties : with_penalties, out, st);
}

TEST(cuda_engine_device_sampler) {
    if (no_device()) SKIP("no CUDA device: skipped");
    gemv_on();
    cinfer_model *m = open_fixture("qwen35_dense");
    REQUIRE(m);
    static int32_t prompts[NR][32];
    int lens[NR], gens[NR];
    long total = 0;
    for (int i = 0; i < NR; i++) {
        lens[i] = 8 + (i * 5) % 8;
        for (int t = 0; t < lens[i]; t++) prompts[i][t] = (int32_t)(((t % 3) * 53 + i * 17 + 3) % 256);
        gens[i] = 16 + (i * 3) % 16;
        total += gens[i];
    }
    static got host[NR], dev[NR], again[NR], alone[1];
    cinfer_engine_stats s0, s1;
    setenv("CINFER_CUDA_SAMPLE", "0", 1);
    run_sampled(m, NR, prompts, lens, gens, 0, host, &s0);
    unsetenv("CINFER_CUDA_SAMPLE");
    CHECK_EQ_INT((int)s0.device_chosen_tokens, 0);
    run_sampled(m, NR, prompts, lens, gens, 0, dev, &s1);
    CHECK_MSG(s1.device_chosen_tokens == total, "greedy with penalties: the device chose %lld of %ld tokens",
              (long long)s1.device_chosen_tokens, total);
    compare("greedy with logit_bias and penalties, device vs host", NR, host, dev, gens);
    run_sampled(m, NR, prompts, lens, gens, 1, dev, &s1);
    CHECK_MSG(s1.device_chosen_tokens == total, "sampled: the device chose %lld of %ld tokens",
              (long long)s1.device_chosen_tokens, total);
    run_sampled(m, NR, prompts, lens, gens, 1, again, &s1);
    compare("sampled with a seed, run twice", NR, dev, again, gens);
    run_sampled(m, 1, prompts, lens, gens, 1, alone, &s1);
    compare("sampled with a seed, alone and in the batch", 1, dev, alone, gens);
    int differ = 0;
    for (int i = 0; i < NR; i++) differ |= memcmp(dev[i].ids, host[i].ids, sizeof(int32_t) * (size_t)gens[i]) != 0;
    CHECK_MSG(differ, "the sampled runs gave the greedy tokens everywhere: the sampler never drew");
    gemv_off();
    cinfer_model_close(m);
}

/* the engine as before padding, deferred commits and verify graphs (each switched off) */
TEST(cuda_spec_engine_greedy_is_exact) {
    if (no_device()) SKIP("no CUDA device: skipped");
    setenv("CINFER_SPEC_PAD", "0", 1);
    setenv("CINFER_CUDA_SPEC_WINFUSED", "0", 1);
    spec_switches(0, 0);
    engine_greedy_case();
    spec_defaults();
}

/* The same with windows padded to spec_max_draft + 1 rows (CINFER_SPEC_PAD=1: every drafter's windows, and
 * the decode entries without drafts beside them; budgets ending inside a window), commits deferred into the
 * next step's kernels and verify steps from CUDA graphs (the defaults on cuda, set here explicitly). */
TEST(cuda_spec_engine_padded_fused_graphs_is_exact) {
    if (no_device()) SKIP("no CUDA device: skipped");
    setenv("CINFER_SPEC_PAD", "1", 1);
    spec_switches(1, 1);
    engine_greedy_case();
    spec_defaults();
}

/* The same through the fused verify layer's first form (CINFER_CUDA_SPEC_WINFUSED=1; the default, 2, runs in
 * the test above), with the other defaults. */
TEST(cuda_spec_engine_winfused_is_exact) {
    if (no_device()) SKIP("no CUDA device: skipped");
    setenv("CINFER_CUDA_SPEC_WINFUSED", "1", 1);
    engine_greedy_case();
    unsetenv("CINFER_CUDA_SPEC_WINFUSED");
}

/* ---- the prefix cache on cuda ---- */

/* A prompt of 45 tokens (a partial last block) is recorded; a fresh sequence resumes after its first 45 and
 * prefills the rest of a 57-token prompt: its logits are the cold run's (issue 5's bound; the same argmax),
 * and 8 greedy steps from either give the same tokens. */
TEST(cuda_prefix_resume_matches_cold) {
    if (no_device()) SKIP("no CUDA device: skipped");
    cinfer_model *m = open_fixture("qwen35_dense");
    REQUIRE(m);
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    int V = info.vocab_size, N1 = 45, N2 = 57, G = 6;
    char err[512];
    int32_t p[64];
    for (int i = 0; i < N2; i++) p[i] = (int32_t)((i * 91 + 7) % V);
    cinfer_ctx *warm = cuda_ctx(m, 2, 64, 64, 0, 64 << 20), *cold = cuda_ctx(m, 1, 64, 64, 0, 0);
    REQUIRE(warm && cold);
    float *lw = malloc(sizeof(float) * (size_t)N2 * V), *lc = malloc(sizeof(float) * (size_t)N2 * V);
    int s = cinfer_seq_open(warm, err, sizeof err);
    cinfer_batch_entry e1 = {s, p, N1, 0, 0, NULL};
    REQUIRE(cinfer_forward(warm, &e1, 1, lw, err, sizeof err) == 0);
    REQUIRE(ctx_seq_snapshot(warm, s, p, err, sizeof err) == 0);
    cinfer_seq_close(warm, s);
    s = cinfer_seq_open(warm, err, sizeof err);
    int cached = 0;
    REQUIRE(ctx_seq_resume(warm, s, p, N2, &cached, err, sizeof err) == 0);
    CHECK_EQ_INT(cached, N1);
    cinfer_batch_entry e2 = {s, p + cached, N2 - cached, 1, 0, NULL};
    REQUIRE(cinfer_forward(warm, &e2, 1, lw, err, sizeof err) == 0);
    int c0 = cinfer_seq_open(cold, err, sizeof err);
    cinfer_batch_entry ec = {c0, p, N2, 1, 0, NULL};
    REQUIRE(cinfer_forward(cold, &ec, 1, lc, err, sizeof err) == 0);
    double worst = 0;
    int bad = 0;
    for (int t = 0; t < N2 - cached; t++) {
        const float *a = lw + (size_t)t * V, *b = lc + (size_t)(cached + t) * V;
        double d = 0, n = 0;
        for (int v = 0; v < V; v++) {
            double x = (double)a[v] - b[v];
            d += isfinite(a[v]) ? x * x : INFINITY;
            n += (double)b[v] * b[v];
        }
        double rel = sqrt(d / (n > 0 ? n : 1));
        if (!(rel <= worst)) worst = rel;
        bad += argmax(a, V) != argmax(b, V);
    }
    printf("     resumed after %d of %d tokens: ||d||/||ref|| %.3g at worst, %d argmax differ\n", cached, N2,
           worst, bad);
    CHECK_MSG(worst <= 1e-2, "resumed logits differ from cold by %.3g (bound 1e-2)", worst);
    CHECK_EQ_INT(bad, 0);
    /* greedy steps from both */
    int32_t tw = argmax(lw + (size_t)(N2 - cached - 1) * V, V), tc = argmax(lc + (size_t)(N2 - 1) * V, V);
    for (int g = 0; g < G; g++) {
        CHECK_MSG(tw == tc, "greedy step %d: %d resumed vs %d cold", g, tw, tc);
        cinfer_batch_entry dw = {s, &tw, 1, 0, 0, NULL}, dc = {c0, &tc, 1, 0, 0, NULL};
        REQUIRE(cinfer_forward(warm, &dw, 1, lw, err, sizeof err) == 0);
        REQUIRE(cinfer_forward(cold, &dc, 1, lc, err, sizeof err) == 0);
        tw = argmax(lw, V), tc = argmax(lc, V);
    }
    free(lw), free(lc);
    cinfer_ctx_destroy(warm);
    cinfer_ctx_destroy(cold);
    cinfer_model_close(m);
}

/* The engine with --prefix-cache-memory on cuda: a second turn (the first turn's prompt + its answer + more)
 * reports cached tokens and gives the cold engine's greedy tokens. */
TEST(cuda_prefix_engine_second_turn) {
    if (no_device()) SKIP("no CUDA device: skipped");
    cinfer_model *m = open_fixture("qwen35_dense");
    REQUIRE(m);
    int32_t p[64];
    for (int i = 0; i < 40; i++) p[i] = (int32_t)((i * 29 + 11) % 256);
    got g1, g2, gc, gm;
    /* pass 0: with the cache; 1: cold; 2: with the cache and MTP drafts (the resumed second turn's head
     * starts at the cached position and attends from there, cu_meta.e_astart) */
    for (int pass = 0; pass < 3; pass++) {
        cinfer_engine_params ep = cinfer_engine_default_params();
        ep.max_seqs = 2;
        ep.ctx_size = 64;
        ep.n_threads = 2;
        ep.device = CINFER_DEVICE_CUDA;
        ep.prefix_cache_memory = pass == 1 ? 0 : 64 << 20;
        if (pass == 2) ep.spec = CINFER_SPEC_MTP, ep.spec_max_draft = 3;
        cinfer_engine *e;
        char err[1024];
        REQUIRE(cinfer_engine_create(m, &ep, &e, err, sizeof err) == 0);
        cinfer_request *r;
        if (pass != 1) {
            cinfer_request_params rp = greedy(p, 20, 8);
            REQUIRE(cinfer_engine_submit(e, &rp, &r, err, sizeof err) == 0);
            drain(r, &g1);
            cinfer_request_free(r);
            for (int i = 0; i < 8; i++) CHECK(pass == 0 || p[20 + i] == g1.ids[i]);
            for (int i = 0; i < 8; i++) p[20 + i] = g1.ids[i];
        }
        cinfer_request_params rp = greedy(p, 36, 12);
        REQUIRE(cinfer_engine_submit(e, &rp, &r, err, sizeof err) == 0);
        drain(r, pass == 0 ? &g2 : pass == 1 ? &gc : &gm);
        cinfer_request_free(r);
        cinfer_engine_destroy(e);
    }
    printf("     second turn: %d of 36 prompt tokens from the cache\n", g2.cached);
    CHECK_MSG(g2.cached >= 19, "the second turn took %d tokens from the cache", g2.cached);
    CHECK_EQ_INT(gc.cached, 0);
    CHECK_EQ_INT(g2.n, 12);
    CHECK_MSG(!memcmp(g2.ids, gc.ids, sizeof(int32_t) * 12),
              "the cached second turn's tokens differ from cold");
    CHECK_MSG(gm.cached >= 19 && gm.n == 12, "with MTP: %d cached, %d tokens", gm.cached, gm.n);
    CHECK_MSG(!memcmp(gm.ids, gc.ids, sizeof(int32_t) * 12),
              "the cached second turn with MTP differs from cold");
    cinfer_model_close(m);
}

/* One resume on cuda as in cuda_prefix_resume_matches_cold: a 45-token prompt snapshotted, a fresh sequence
 * resumed after it prefills the rest of a 57-token prompt; every resumed row's logits into out [12][V]. */
static int resumed_logits(cinfer_model *m, float *out) {
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    int V = info.vocab_size, N1 = 45, N2 = 57, cached = 0, rc = 1;
    char err[512];
    int32_t p[64];
    for (int i = 0; i < N2; i++) p[i] = (int32_t)((i * 91 + 7) % V);
    cinfer_ctx *c = cuda_ctx(m, 2, 64, 64, 0, 64 << 20);
    if (!c) return 1;
    float *tmp = malloc(sizeof(float) * (size_t)N1 * V);
    int s = cinfer_seq_open(c, err, sizeof err);
    cinfer_batch_entry e1 = {s, p, N1, 0, 0, NULL};
    if (cinfer_forward(c, &e1, 1, tmp, err, sizeof err) || ctx_seq_snapshot(c, s, p, err, sizeof err))
        goto out;
    cinfer_seq_close(c, s);
    s = cinfer_seq_open(c, err, sizeof err);
    if (ctx_seq_resume(c, s, p, N2, &cached, err, sizeof err) || cached != N1) goto out;
    cinfer_batch_entry e2 = {s, p + N1, N2 - N1, 1, 0, NULL};
    rc = cinfer_forward(c, &e2, 1, out, err, sizeof err);
out:
    if (rc) test_fail(__FILE__, __LINE__, "resume: %s (cached %d)", err, cached);
    free(tmp);
    cinfer_ctx_destroy(c);
    return rc;
}

/* CINFER_PREFIX_DEVICE=1 keeps the snapshots in device memory: a resume from there gives the host store's
 * logits bit for bit (both are plain copies of the same state). */
TEST(cuda_prefix_device_store_matches_host_store) {
    if (no_device()) SKIP("no CUDA device: skipped");
    cinfer_model *m = open_fixture("qwen35_dense");
    REQUIRE(m);
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    size_t n = (size_t)12 * info.vocab_size;
    float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) a[i] = b[i] = NAN;
    setenv("CINFER_PREFIX_DEVICE", "0", 1);
    REQUIRE(resumed_logits(m, a) == 0);
    setenv("CINFER_PREFIX_DEVICE", "1", 1);
    int rc = resumed_logits(m, b);
    unsetenv("CINFER_PREFIX_DEVICE");
    REQUIRE(rc == 0);
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad += !isfinite(a[i]) || memcmp(&a[i], &b[i], sizeof(float)) != 0;
    CHECK_MSG(bad == 0, "%d of %zu logits differ between the device and host snapshot stores", bad, n);
    free(a), free(b);
    cinfer_model_close(m);
}

/* The GEMM warm-up at creation (forward_cuda.c warm_gemms, on by default) and CINFER_TTFT_TRACE=2 (every call
 * records its trace marks, PDL off in marked calls) may not change a bit: a prompt's logits on a context made
 * so equal those of a context made with CINFER_CUDA_WARMUP=0 and no trace. */
TEST(cuda_warmup_and_trace_change_no_logits) {
    if (no_device()) SKIP("no CUDA device: skipped");
    cinfer_model *m = open_fixture("qwen35_dense");
    REQUIRE(m);
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    int V = info.vocab_size, N = 100;
    int32_t p[128];
    for (int i = 0; i < N + 1; i++) p[i] = (int32_t)((i * 37 + 5) % V);
    float *lg[2];
    char err[512];
    for (int k = 0; k < 2; k++) {
        if (k)
            setenv("CINFER_TTFT_TRACE", "2", 1);
        else
            setenv("CINFER_CUDA_WARMUP", "0", 1);
        cinfer_ctx *c = cuda_ctx(m, 2, 256, 128, 0, 0);
        unsetenv("CINFER_CUDA_WARMUP"), unsetenv("CINFER_TTFT_TRACE");
        REQUIRE(c);
        lg[k] = malloc(sizeof(float) * (size_t)(N + 1) * V);
        for (size_t i = 0; i < (size_t)(N + 1) * V; i++) lg[k][i] = NAN;
        int s = cinfer_seq_open(c, err, sizeof err);
        cinfer_batch_entry e = {s, p, N, 1, 0, NULL}, d = {s, p + N, 1, 0, 0, NULL};
        REQUIRE(cinfer_forward(c, &e, 1, lg[k], err, sizeof err) == 0);
        REQUIRE(cinfer_forward(c, &d, 1, lg[k] + (size_t)N * V, err, sizeof err) == 0);
        cinfer_ctx_destroy(c);
    }
    int bad = 0;
    for (size_t i = 0; i < (size_t)(N + 1) * V; i++)
        bad += !isfinite(lg[0][i]) || memcmp(&lg[0][i], &lg[1][i], sizeof(float)) != 0;
    CHECK_MSG(bad == 0, "%d logits differ with the warm-up and the trace on", bad);
    free(lg[0]), free(lg[1]);
    cinfer_model_close(m);
}

/* ---- the MTP head on cuda ---- */

/* The target's final-normed hidden rows (cinfer_batch_entry.hidden) and the MTP head's logits and normed
 * output on cuda against the CPU, teacher-forced over a prompt (both heads fed the CPU's hidden rows), then
 * one chained row: ||d||/||ref|| <= 1e-2 per row and the same argmax wherever the CPU's top-2 margin is
 * clear. */
TEST(cuda_mtp_head_matches_cpu) {
    if (no_device()) SKIP("no CUDA device: skipped");
    cinfer_model *m = open_fixture("qwen35_dense");
    REQUIRE(m);
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    REQUIRE(info.has_mtp);
    int V = info.vocab_size, H = info.hidden_size, P = 20;
    char err[512];
    cinfer_ctx *cc[2];
    for (int d = 0; d < 2; d++) {
        cinfer_ctx_params p = cinfer_ctx_default_params();
        p.max_seqs = 2, p.max_ctx = 64, p.max_batch = 64, p.n_threads = 2;
        p.device = d ? CINFER_DEVICE_CUDA : CINFER_DEVICE_CPU;
        REQUIRE(cinfer_ctx_create(m, &p, &cc[d], err, sizeof err) == 0);
        REQUIRE(ctx_mtp_init(cc[d], 0, err, sizeof err) == 0);
    }
    int32_t x[32];
    for (int i = 0; i < P + 1; i++) x[i] = (int32_t)((i * 53 + 9) % V);
    float *hid[2], *lg[2], *ho[2], *tl = malloc(sizeof(float) * (size_t)P * V);
    for (int d = 0; d < 2; d++) {
        hid[d] = malloc(sizeof(float) * (size_t)P * H);
        ho[d] = malloc(sizeof(float) * (size_t)P * H);
        lg[d] = malloc(sizeof(float) * (size_t)P * V);
        int s = cinfer_seq_open(cc[d], err, sizeof err);
        cinfer_batch_entry be = {s, x, P, 1, 0, hid[d]};
        REQUIRE(cinfer_forward(cc[d], &be, 1, tl, err, sizeof err) == 0);
    }
    double worst_h = 0;
    for (size_t i = 0; i < (size_t)P * H; i++) {
        double dd = fabs((double)hid[1][i] - hid[0][i]);
        if (!(dd <= worst_h)) worst_h = dd;
    }
    printf("     target hidden rows: max |cuda - cpu| %.3g\n", worst_h);
    CHECK_MSG(worst_h <= 5e-2, "the cuda target's hidden rows differ from the CPU's by %.3g", worst_h);
    /* rows t = 0..P-2: token x[t+1] with hidden row t (the CPU's for both) */
    for (int d = 0; d < 2; d++) {
        ctx_mtp_entry me = {0, 0, x + 1, hid[0], P - 1, ho[d], 2};
        REQUIRE(ctx_mtp_forward(cc[d], &me, 1, lg[d], err, sizeof err) == 0);
    }
    double worst = 0;
    int bad = 0;
    for (int t = 0; t < P - 1; t++) {
        const float *a = lg[1] + (size_t)t * V, *b = lg[0] + (size_t)t * V;
        double dn = 0, nn = 0;
        int ra = 0, rb = -1;
        for (int v = 0; v < V; v++) {
            double q = (double)a[v] - b[v];
            dn += isfinite(a[v]) ? q * q : INFINITY;
            nn += (double)b[v] * b[v];
            if (b[v] > b[ra]) ra = v;
        }
        for (int v = 0; v < V; v++)
            if (v != ra && (rb < 0 || b[v] > b[rb])) rb = v;
        double rel = sqrt(dn / (nn > 0 ? nn : 1));
        if (!(rel <= worst)) worst = rel;
        if (rb >= 0 && b[ra] - b[rb] > 1e-2 * sqrt(nn / V) && argmax(a, V) != ra) bad++;
    }
    printf("     MTP head logits over %d rows: ||d||/||ref|| %.3g at worst, %d clear argmax differ\n", P - 1,
           worst, bad);
    CHECK_MSG(worst <= 1e-2, "cuda MTP logits differ from the CPU's by %.3g (bound 1e-2)", worst);
    CHECK_EQ_INT(bad, 0);
    /* one chained row at position P - 1 from the head's own last output (each device its own) */
    for (int d = 0; d < 2; d++) {
        int32_t nx = x[P];
        ctx_mtp_entry me = {0, P - 1, &nx, ho[d] + (size_t)(P - 2) * H, 1, NULL, 1};
        REQUIRE(ctx_mtp_forward(cc[d], &me, 1, lg[d], err, sizeof err) == 0);
    }
    double dn = 0, nn = 0;
    for (int v = 0; v < V; v++) {
        double q = (double)lg[1][v] - lg[0][v];
        dn += q * q;
        nn += (double)lg[0][v] * lg[0][v];
    }
    printf("     chained row: ||d||/||ref|| %.3g\n", sqrt(dn / (nn > 0 ? nn : 1)));
    CHECK(sqrt(dn / (nn > 0 ? nn : 1)) <= 1e-2);
    /* a head that starts mid-sequence (a prompt resumed from the prefix cache): rows 5..P-2 of a fresh
     * sequence, attending from position 5 only (cu_meta.e_astart on cuda) */
    for (int d = 0; d < 2; d++) {
        int s2 = cinfer_seq_open(cc[d], err, sizeof err);
        REQUIRE(s2 >= 0);
        ctx_mtp_entry me = {s2, 5, x + 6, hid[0] + (size_t)5 * H, P - 6, NULL, 2};
        REQUIRE(ctx_mtp_forward(cc[d], &me, 1, lg[d], err, sizeof err) == 0);
    }
    worst = 0;
    for (int t = 0; t < P - 6; t++) {
        double dd = 0, n2 = 0;
        for (int v = 0; v < V; v++) {
            double q = (double)lg[1][(size_t)t * V + v] - lg[0][(size_t)t * V + v];
            dd += q * q;
            n2 += (double)lg[0][(size_t)t * V + v] * lg[0][(size_t)t * V + v];
        }
        double rel = sqrt(dd / (n2 > 0 ? n2 : 1));
        if (!(rel <= worst)) worst = rel;
    }
    printf("     head resumed at position 5: ||d||/||ref|| %.3g at worst\n", worst);
    CHECK_MSG(worst <= 1e-2, "a head starting mid-sequence differs from the CPU's by %.3g", worst);
    for (int d = 0; d < 2; d++) {
        free(hid[d]), free(ho[d]), free(lg[d]);
        cinfer_ctx_destroy(cc[d]);
    }
    free(tl);
    cinfer_model_close(m);
}

/* The head's drafts chosen on the device (ctx_mtp_forward_ids, what the engine uses with device choice) are
 * the argmax of the logits ctx_mtp_forward brings back for the same rows (ties to the lowest id), over the
 * full vocabulary and over a draft vocabulary prefix. */
TEST(cuda_mtp_head_ids_match_argmax) {
    if (no_device()) SKIP("no CUDA device: skipped");
    cinfer_model *m = open_fixture("qwen35_dense");
    REQUIRE(m);
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    int V = info.vocab_size, H = info.hidden_size, P = 20;
    char err[512];
    for (int pass = 0; pass < 2; pass++) {
        int nv = pass ? V / 2 : V;
        cinfer_ctx *c = cuda_ctx(m, 1, 64, 64, 0, 0);
        REQUIRE(c);
        REQUIRE(ctx_mtp_init(c, pass ? nv : 0, err, sizeof err) == 0);
        int32_t x[32], ids[32];
        for (int i = 0; i < P + 1; i++) x[i] = (int32_t)((i * 61 + 17) % V);
        float *hid = malloc(sizeof(float) * (size_t)P * H), *lg = malloc(sizeof(float) * (size_t)P * V);
        int s = cinfer_seq_open(c, err, sizeof err);
        cinfer_batch_entry be = {s, x, P, 1, 0, hid};
        REQUIRE(cinfer_forward(c, &be, 1, lg, err, sizeof err) == 0);
        ctx_mtp_entry me = {s, 0, x + 1, hid, P - 1, NULL, 2};
        REQUIRE(ctx_mtp_forward(c, &me, 1, lg, err, sizeof err) == 0);
        REQUIRE(ctx_mtp_forward_ids(c, &me, 1, ids, err, sizeof err) == 0);
        int bad = 0;
        for (int t = 0; t < P - 1; t++) bad += ids[t] != argmax(lg + (size_t)t * nv, nv);
        printf("     %d head rows over %d ids: %d device choices differ from the host argmax\n", P - 1, nv,
               bad);
        CHECK_EQ_INT(bad, 0);
        free(hid), free(lg);
        cinfer_ctx_destroy(c);
    }
    cinfer_model_close(m);
}

/* CINFER_CUDA_GRAPH_UPDATE=1: a sequence decoding past attention split boundaries (every 64 positions here),
 * with a verify window every third step, gives from graphs updated in place the logits of eager launches bit
 * for bit; the updates happen. */
TEST(cuda_graph_update_matches_eager) {
    if (no_device()) SKIP("no CUDA device: skipped");
    cinfer_model *m = open_fixture("qwen35_dense");
    REQUIRE(m);
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    int V = info.vocab_size, P = 10, N = 150, W = 4;
    char err[512];
    cinfer_ctx *c[2];
    setenv("CINFER_CUDA_GRAPH_UPDATE", "1", 1);
    setenv("CINFER_CUDA_VERIFY_GRAPHS", "1", 1);
    /* under CINFER_CUDA_ATTN_DEC=2 at most 4 spans a row: the key changes at 128 positions (one span of 32 per
     * row up to there, two stages of chunks after); no effect otherwise */
    setenv("CINFER_CUDA_ATTN_DEC_NS", "4", 1);
    c[0] = cuda_ctx(m, 1, 256, 64, W, 0);
    unsetenv("CINFER_CUDA_GRAPH_UPDATE");
    setenv("CINFER_CUDA_GRAPHS", "0", 1);
    c[1] = cuda_ctx(m, 1, 256, 64, W, 0);
    unsetenv("CINFER_CUDA_GRAPHS");
    unsetenv("CINFER_CUDA_VERIFY_GRAPHS");
    unsetenv("CINFER_CUDA_ATTN_DEC_NS");
    REQUIRE(c[0] && c[1]);
    float *lg[2];
    int32_t x[256], win[8];
    for (int i = 0; i < P; i++) x[i] = (int32_t)((i * 29 + 3) % V);
    int s[2];
    for (int d = 0; d < 2; d++) {
        lg[d] = malloc(sizeof(float) * (size_t)W * V);
        s[d] = cinfer_seq_open(c[d], err, sizeof err);
        cinfer_batch_entry pe = {s[d], x, P, 0, 0, NULL};
        REQUIRE(cinfer_forward(c[d], &pe, 1, lg[d], err, sizeof err) == 0);
    }
    int bad = 0, n = P;
    x[n] = argmax(lg[1], V);
    for (int st = 0; st < N && n + W < 256; st++) {
        int rows = st % 3 == 2 ? W : 1;
        for (int j = 0; j < W; j++) win[j] = (x[n] + 7 * j) % V;
        for (int d = 0; d < 2; d++) {
            cinfer_batch_entry be = {s[d], rows > 1 ? win : &x[n], rows, rows > 1, rows > 1, NULL};
            REQUIRE(cinfer_forward(c[d], &be, 1, lg[d], err, sizeof err) == 0);
            if (rows > 1) REQUIRE(cinfer_seq_commit(c[d], s[d], 1, err, sizeof err) == 0);
        }
        bad += memcmp(lg[0], lg[1], sizeof(float) * (size_t)rows * V) != 0;
        x[n + 1] = argmax(lg[1], V);
        n++;
    }
    int gc, gu;
    ctx_graph_stats(c[0], &gc, &gu);
    printf(
        "     %d steps to position %d: %d differ from eager; %d graphs instantiated, %d updated in place\n",
        N, n, bad, gc, gu);
    CHECK_EQ_INT(bad, 0);
    CHECK_MSG(gu > 0, "no graph was updated in place (%d instantiated)", gc);
    for (int d = 0; d < 2; d++) {
        free(lg[d]);
        cinfer_ctx_destroy(c[d]);
    }
    cinfer_model_close(m);
}

/* CINFER_CUDA_MTP_GRAPHS=1: a chain of head rows (each fed the head's own last output, as the engine's
 * chained drafts) run from graphs gives the eager launches' logits and outputs bit for bit, graphs made. */
TEST(cuda_mtp_graphs_match_eager) {
    if (no_device()) SKIP("no CUDA device: skipped");
    cinfer_model *m = open_fixture("qwen35_dense");
    REQUIRE(m);
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    int V = info.vocab_size, H = info.hidden_size, P = 12, N = 10;
    char err[512];
    cinfer_ctx *c[2];
    setenv("CINFER_CUDA_MTP_GRAPHS", "1", 1);
    c[0] = cuda_ctx(m, 1, 64, 64, 0, 0);
    unsetenv("CINFER_CUDA_MTP_GRAPHS");
    setenv("CINFER_CUDA_GRAPHS", "0", 1);
    c[1] = cuda_ctx(m, 1, 64, 64, 0, 0);
    unsetenv("CINFER_CUDA_GRAPHS");
    REQUIRE(c[0] && c[1]);
    int32_t x[64];
    for (int i = 0; i < P + N + 1; i++) x[i] = (int32_t)((i * 43 + 5) % V);
    float *hid[2], *lg[2], *h1[2];
    int bad = 0;
    for (int d = 0; d < 2; d++) {
        hid[d] = malloc(sizeof(float) * (size_t)P * H);
        h1[d] = malloc(sizeof(float) * (size_t)H);
        lg[d] = malloc(sizeof(float) * (size_t)P * V);
        REQUIRE(ctx_mtp_init(c[d], 0, err, sizeof err) == 0);
        int s = cinfer_seq_open(c[d], err, sizeof err);
        cinfer_batch_entry be = {s, x, P, 1, 0, hid[d]};
        REQUIRE(cinfer_forward(c[d], &be, 1, lg[d], err, sizeof err) == 0);
        ctx_mtp_entry me = {s, 0, x + 1, hid[d], P - 1, hid[d], 1};
        REQUIRE(ctx_mtp_forward(c[d], &me, 1, lg[d], err, sizeof err) == 0);
        memcpy(h1[d], hid[d] + (size_t)(P - 2) * H, sizeof(float) * (size_t)H);
    }
    for (int j = 0; j < N; j++) {
        for (int d = 0; d < 2; d++) {
            ctx_mtp_entry me = {0, P - 1 + j, &x[P + j], h1[d], 1, h1[d], 1};
            REQUIRE(ctx_mtp_forward(c[d], &me, 1, lg[d], err, sizeof err) == 0);
        }
        bad += memcmp(lg[0], lg[1], sizeof(float) * (size_t)V) ||
               memcmp(h1[0], h1[1], sizeof(float) * (size_t)H);
    }
    int gc, gu;
    ctx_graph_stats(c[0], &gc, &gu);
    printf("     %d chained head rows: %d differ from eager; %d graphs made\n", N, bad, gc);
    CHECK_EQ_INT(bad, 0);
    CHECK_MSG(gc > 0, "the head never ran from a graph");
    for (int d = 0; d < 2; d++) {
        free(hid[d]), free(h1[d]), free(lg[d]);
        cinfer_ctx_destroy(c[d]);
    }
    cinfer_model_close(m);
}

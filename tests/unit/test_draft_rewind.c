/* test_draft_rewind.c — the draft model's exact rollback without speculative windows (engine.c,
 * draft_model_step / draft_model_sync; ctx_seq_state_stash / ctx_seq_rewind): a sequence decoding plain
 * steps, its state stashed before each window token, rewound to 1..k-1 kept tokens holds bit for bit the
 * state (and then gives the logits) of a sequence that only ever read the kept tokens; bad rewinds are
 * refused and leave the sequence as it was. On the CPU and, with a device, on cuda (stashes in device
 * memory). The engine-level check: the draft model's drafts with rewinds are the ones the old
 * speculative-window form makes (same drafted / accepted counts, same output) for 16 mixed requests, greedy
 * and sampled. */
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

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Sequence A reads the prompt, then window tokens w0..w(k-1) as plain decode steps, its state stashed before
 * each wj (j >= 1), as draft_model_step does; for every kept count c in 1..k-1 it is rewound to prompt + c
 * from stash c and must then equal sequence B, which read prompt + w0..w(c-1) only: the whole state bit for
 * bit, and the logits of the next token. Then A reads on (the rows past the rewind are overwritten). */
static void rewind_case(cinfer_model *m, cinfer_device dev) {
    enum { P = 11, K = 4 };
    char err[512];
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    int V = info.vocab_size;
    cinfer_ctx_params p = cinfer_ctx_default_params();
    p.max_seqs = 2;
    p.max_ctx = 64;
    p.max_batch = 64;
    p.n_threads = 2;
    p.device = dev;
    cinfer_ctx *c = NULL;
    if (cinfer_ctx_create(m, &p, &c, err, sizeof err)) {
        test_fail(__FILE__, __LINE__, "context: %s", err);
        return;
    }
    size_t nf = ctx_seq_state_floats(c);
    REQUIRE(nf > 0);
    size_t bytes = (size_t)K * nf * sizeof(float);
    float *stash = dev == CINFER_DEVICE_CUDA ? cuda_dev_alloc(bytes) : malloc(bytes);
    float *sa = malloc(nf * sizeof(float)), *sb = malloc(nf * sizeof(float));
    float *la = malloc(sizeof(float) * (size_t)V), *lb = malloc(sizeof(float) * (size_t)V);
    REQUIRE(stash && sa && sb && la && lb);
    int32_t prompt[P], w[K], next = 5 % V;
    for (int i = 0; i < P; i++) prompt[i] = (int32_t)((i * 29 + 7) % V);
    for (int j = 0; j < K; j++) w[j] = (int32_t)((j * 13 + 2) % V);
    int bad_state = 0, bad_logits = 0;
    for (int kept = 1; kept < K; kept++) {
        int a = cinfer_seq_open(c, err, sizeof err), b = cinfer_seq_open(c, err, sizeof err);
        REQUIRE(a >= 0 && b >= 0);
        cinfer_batch_entry pa = {a, prompt, P, 0, 0, NULL}, pb = {b, prompt, P, 0, 0, NULL};
        REQUIRE(cinfer_forward(c, &pa, 1, la, err, sizeof err) == 0);
        REQUIRE(cinfer_forward(c, &pb, 1, lb, err, sizeof err) == 0);
        for (int j = 0; j < K; j++) {
            if (j) REQUIRE(ctx_seq_state_stash(c, a, stash + (size_t)(j - 1) * nf, err, sizeof err) == 0);
            cinfer_batch_entry d = {a, &w[j], 1, 0, 0, NULL};
            REQUIRE(cinfer_forward(c, &d, 1, la, err, sizeof err) == 0);
        }
        for (int j = 0; j < kept; j++) {
            cinfer_batch_entry d = {b, &w[j], 1, 0, 0, NULL};
            REQUIRE(cinfer_forward(c, &d, 1, lb, err, sizeof err) == 0);
        }
        /* refused, and nothing moves: past the length, a negative length, no state */
        CHECK_EQ_INT(ctx_seq_rewind(c, a, P + K + 1, stash, err, sizeof err), CINFER_EINVAL);
        CHECK_EQ_INT(ctx_seq_rewind(c, a, -1, stash, err, sizeof err), CINFER_EINVAL);
        CHECK_EQ_INT(ctx_seq_rewind(c, a, P + kept, NULL, err, sizeof err), CINFER_EINVAL);
        CHECK_EQ_INT(cinfer_seq_len(c, a), P + K);
        REQUIRE(ctx_seq_rewind(c, a, P + kept, stash + (size_t)(kept - 1) * nf, err, sizeof err) == 0);
        CHECK_EQ_INT(cinfer_seq_len(c, a), P + kept);
        REQUIRE(ctx_seq_state_copy(c, a, sa, err, sizeof err) == 0);
        REQUIRE(ctx_seq_state_copy(c, b, sb, err, sizeof err) == 0);
        bad_state += memcmp(sa, sb, nf * sizeof(float)) != 0;
        /* both read the same next tokens: the same logits, bit for bit (A's KV rows past the rewind are
         * overwritten) */
        for (int t = 0; t < 3; t++) {
            cinfer_batch_entry da = {a, &next, 1, 0, 0, NULL}, db = {b, &next, 1, 0, 0, NULL};
            REQUIRE(cinfer_forward(c, &da, 1, la, err, sizeof err) == 0);
            REQUIRE(cinfer_forward(c, &db, 1, lb, err, sizeof err) == 0);
            bad_logits += memcmp(la, lb, sizeof(float) * (size_t)V) != 0;
            next = argmax(la, V);
        }
        cinfer_seq_close(c, a);
        cinfer_seq_close(c, b);
    }
    CHECK_MSG(!bad_state, "%d of %d rewinds left a state other than never having read the dropped tokens",
              bad_state, K - 1);
    CHECK_MSG(!bad_logits,
              "%d rows after a rewind differ from the sequence that never read the dropped tokens",
              bad_logits);
    /* a pending speculative window is refused (a context that verifies) */
    cinfer_ctx_destroy(c);
    p.spec_window = 3;
    REQUIRE(cinfer_ctx_create(m, &p, &c, err, sizeof err) == 0);
    int a = cinfer_seq_open(c, err, sizeof err);
    REQUIRE(a >= 0);
    cinfer_batch_entry pa = {a, prompt, P, 0, 0, NULL}, win = {a, w, 3, 1, 1, NULL};
    float *lw = malloc(sizeof(float) * 3 * (size_t)V);
    REQUIRE(lw);
    REQUIRE(cinfer_forward(c, &pa, 1, la, err, sizeof err) == 0);
    REQUIRE(cinfer_forward(c, &win, 1, lw, err, sizeof err) == 0);
    CHECK_EQ_INT(ctx_seq_rewind(c, a, P - 1, stash, err, sizeof err), CINFER_ESTATE);
    CHECK_EQ_INT(ctx_seq_state_stash(c, a, stash, err, sizeof err), CINFER_ESTATE);
    REQUIRE(cinfer_seq_commit(c, a, 0, err, sizeof err) == 0);
    CHECK_EQ_INT(cinfer_seq_len(c, a), P);
    cinfer_ctx_destroy(c);
    free(lw);
    if (dev == CINFER_DEVICE_CUDA)
        cuda_dev_free(stash);
    else
        free(stash);
    free(sa), free(sb), free(la), free(lb);
}

TEST(draft_rewind_is_exact_cpu) {
    cinfer_model *m = open_fixture("qwen35_dense");
    REQUIRE(m);
    rewind_case(m, CINFER_DEVICE_CPU);
    cinfer_model_close(m);
}

/* (named cuda_spec_* so that the GPU runs' cuda_spec filter takes it) */
TEST(cuda_spec_draft_rewind_is_exact) {
    if (!cuda_built() || cuda_devices() < 1) SKIP("no CUDA device: skipped");
    /* the f32-activation GEMV for every product, as the other cuda_spec tests: a row's bits then do not
     * depend on how many rows share its launch */
    setenv("CINFER_CUDA_GEMV_MAX", "1000000", 1);
    cinfer_model *m = open_fixture("qwen35_dense");
    REQUIRE(m);
    rewind_case(m, CINFER_DEVICE_CUDA);
    unsetenv("CINFER_CUDA_GEMV_MAX");
    cinfer_model_close(m);
}

/* A rewind into a KV block the prefix cache shares is refused: later rows would write into the cached
 * block. A sequence resumed from the cache maps the cached prompt's full blocks by reference. */
TEST(draft_rewind_refuses_a_shared_block) {
    enum { P = 40 };
    char err[512];
    cinfer_model *m = open_fixture("qwen35_dense");
    REQUIRE(m);
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    cinfer_ctx_params p = cinfer_ctx_default_params();
    p.max_seqs = 2;
    p.max_ctx = 64;
    p.max_batch = 64;
    p.n_threads = 2;
    p.device = CINFER_DEVICE_CPU;
    p.prefix_cache_memory = 64 << 20;
    cinfer_ctx *c = NULL;
    REQUIRE(cinfer_ctx_create(m, &p, &c, err, sizeof err) == 0);
    int32_t prompt[P];
    for (int i = 0; i < P; i++) prompt[i] = (int32_t)((i * 31 + 1) % info.vocab_size);
    float *lg = malloc(sizeof(float) * (size_t)info.vocab_size),
          *st = malloc(ctx_seq_state_floats(c) * sizeof(float));
    REQUIRE(lg && st);
    int a = cinfer_seq_open(c, err, sizeof err);
    REQUIRE(a >= 0);
    cinfer_batch_entry pa = {a, prompt, P - 1, 0, 0, NULL};
    REQUIRE(cinfer_forward(c, &pa, 1, lg, err, sizeof err) == 0);
    REQUIRE(ctx_seq_snapshot(c, a, prompt, err, sizeof err) == 0);
    int b = cinfer_seq_open(c, err, sizeof err), cached = 0;
    REQUIRE(b >= 0);
    REQUIRE(ctx_seq_resume(c, b, prompt, P, &cached, err, sizeof err) == 0);
    REQUIRE(cached == P - 1);
    REQUIRE(ctx_seq_state_stash(c, b, st, err, sizeof err) == 0);
    /* position 20 lies in block 1 (16..31), which A and the cache hold too */
    CHECK_EQ_INT(ctx_seq_rewind(c, b, 20, st, err, sizeof err), CINFER_ESTATE);
    CHECK_EQ_INT(cinfer_seq_len(c, b), P - 1);
    /* a block boundary is fine: nothing of a shared block is written again */
    CHECK_EQ_INT(ctx_seq_rewind(c, b, 32, st, err, sizeof err), 0);
    CHECK_EQ_INT(cinfer_seq_len(c, b), 32);
    free(lg), free(st);
    cinfer_ctx_destroy(c);
    cinfer_model_close(m);
}

/* ---- the engine: the draft model's proposals after rewinds ---- */

typedef struct got {
    int32_t ids[64];
    int n;
} got;

/* Every window the draft model proposed, with the history it drafted from (engine_set_draft_observer) */
enum { NREC = 600, RH = 96 };
typedef struct recorder {
    int n;
    int32_t hist[NREC][RH];
    int nh[NREC];
    int32_t d[NREC][8];
    int nd[NREC];
} recorder;

static void record_draft(void *ud, const int32_t *hist, int n_hist, const int32_t *out, int k) {
    recorder *r = ud;
    if (r->n < NREC && n_hist <= RH && k <= 8) {
        memcpy(r->hist[r->n], hist, sizeof(int32_t) * (size_t)n_hist);
        r->nh[r->n] = n_hist;
        memcpy(r->d[r->n], out, sizeof(int32_t) * (size_t)k);
        r->nd[r->n++] = k;
    }
}

static void run_draft_engine(cinfer_model *m, cinfer_model *draft, cinfer_spec_mode spec, int n,
                             int32_t prompts[][48], const int *lens, const int *gens, const float *temps,
                             const float *pens, recorder *rec, got *out, cinfer_engine_stats *st) {
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.max_seqs = 16;
    ep.ctx_size = 128;
    ep.step_tokens = 96;
    ep.n_threads = 2;
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
    if (rec) engine_set_draft_observer(e, record_draft, rec);
    cinfer_request *rq[16];
    for (int i = 0; i < n; i++) {
        cinfer_request_params rp;
        memset(&rp, 0, sizeof rp);
        rp.prompt = prompts[i];
        rp.n_prompt = lens[i];
        rp.max_tokens = gens[i];
        rp.sampling = cinfer_sampling_default();
        rp.sampling.temperature = temps[i];
        rp.sampling.repetition_penalty = pens[i];
        rp.sampling.n_logprobs = 0; /* a LOGPROB event per token: how the test reads the ids */
        rp.sampling.has_seed = 1;
        rp.sampling.seed = 501 + (uint64_t)i;
        rp.ignore_eos = 1;
        if (cinfer_engine_submit(e, &rp, &rq[i], err, sizeof err)) {
            test_fail(__FILE__, __LINE__, "%s", err);
            rq[i] = NULL;
        }
    }
    for (int i = 0; i < n; i++) {
        memset(&out[i], 0, sizeof out[i]);
        if (!rq[i]) continue;
        cinfer_event ev;
        while (cinfer_request_next(rq[i], &ev, 20000) == 1)
            if (ev.type == CINFER_EV_LOGPROB && out[i].n < 64) out[i].ids[out[i].n++] = ev.token;
        cinfer_request_free(rq[i]);
    }
    cinfer_engine_get_stats(e, st);
    cinfer_engine_destroy(e);
}

/* Self-draft on qwen35_text, where the target's requests change its choices: a repetition penalty on some
 * greedy requests (the draft, which knows nothing of it, proposes the repeats the target then refuses),
 * sampling on others, so that windows keep 1..k tokens and the draft rewinds to every length. The output is
 * plain decoding's, token for token, and every window the draft model proposed is its own greedy
 * continuation of the true history (checked against a fresh context that read exactly that history; only a
 * near tie may differ, the engine's draft having read it in other pieces): a rewind to the wrong length or
 * from the wrong stash would leave the draft drafting from a state no history gives. */
TEST(engine_draft_model_rewinds_draft_from_the_true_history) {
    cinfer_model *m = open_fixture("qwen35_text"), *dm = open_fixture("qwen35_text");
    REQUIRE(m && dm);
    enum { NR = 16 };
    static int32_t prompts[NR][48];
    int lens[NR], gens[NR];
    float temps[NR], pens[NR];
    for (int i = 0; i < NR; i++) {
        lens[i] = 3 + (i * 11) % 40;
        for (int t = 0; t < lens[i]; t++)
            prompts[i][t] = (int32_t)(((t % (2 + i % 3)) * 37 + i * 19 + 5) % 384);
        gens[i] = 12 + (i * 5) % 20;
        temps[i] = i % 4 == 1 ? 0.8f : 0.0f;
        pens[i] = i % 4 >= 2 ? 1.1f + 0.2f * (float)(i % 3) : 1.0f;
    }
    static got plain[NR], rew[NR];
    static recorder rec;
    rec.n = 0;
    cinfer_engine_stats s0, s1;
    run_draft_engine(m, NULL, CINFER_SPEC_NONE, NR, prompts, lens, gens, temps, pens, NULL, plain, &s0);
    run_draft_engine(m, dm, CINFER_SPEC_DRAFT, NR, prompts, lens, gens, temps, pens, &rec, rew, &s1);
    for (int i = 0; i < NR; i++) {
        CHECK_EQ_INT(rew[i].n, gens[i]);
        CHECK_MSG(!memcmp(plain[i].ids, rew[i].ids, sizeof(int32_t) * (size_t)gens[i]),
                  "request %d (temp %.1f): the draft model changed the output", i, (double)temps[i]);
    }
    /* every recorded draft against the draft model's argmax after exactly its history */
    char err[512];
    cinfer_ctx_params cp = cinfer_ctx_default_params();
    cp.max_seqs = 1, cp.max_ctx = 128, cp.max_batch = 128, cp.n_threads = 2;
    cinfer_ctx *c = NULL;
    REQUIRE(cinfer_ctx_create(dm, &cp, &c, err, sizeof err) == 0);
    cinfer_model_info info;
    cinfer_model_get_info(dm, &info);
    int V = info.vocab_size, checked = 0, wrong = 0, ties = 0;
    float *row = malloc(sizeof(float) * (size_t)V);
    REQUIRE(row);
    for (int k = 0; k < rec.n; k++) {
        int s = cinfer_seq_open(c, err, sizeof err);
        REQUIRE(s >= 0);
        cinfer_batch_entry h = {s, rec.hist[k], rec.nh[k], 0, 0, NULL};
        REQUIRE(cinfer_forward(c, &h, 1, row, err, sizeof err) == 0);
        for (int j = 0; j < rec.nd[k]; j++) {
            if (j) {
                cinfer_batch_entry d = {s, &rec.d[k][j - 1], 1, 0, 0, NULL};
                REQUIRE(cinfer_forward(c, &d, 1, row, err, sizeof err) == 0);
            }
            int a = 0;
            for (int v = 1; v < V; v++)
                if (row[v] > row[a]) a = v;
            checked++;
            if (rec.d[k][j] != a) {
                wrong++;
                ties += row[a] - row[rec.d[k][j]] < 1e-3f * fabsf(row[a]);
            }
        }
        cinfer_seq_close(c, s);
    }
    free(row);
    cinfer_ctx_destroy(c);
    printf("     %lld drafted, %lld accepted (steps %lld plain, %lld); %d windows, %d drafts checked against "
           "the "
           "history, %d differ (%d near ties)\n",
           (long long)s1.spec_drafted, (long long)s1.spec_accepted, (long long)s0.steps_total,
           (long long)s1.steps_total, rec.n, checked, wrong, ties);
    CHECK(s1.spec_accepted > 0 && s1.spec_accepted < s1.spec_drafted); /* rejections happened */
    CHECK(rec.n > 50 && rec.n < NREC);
    CHECK_EQ_INT(wrong, ties);
    CHECK_EQ_INT(s1.kv_blocks_used, 0);
    cinfer_model_close(dm);
    cinfer_model_close(m);
}

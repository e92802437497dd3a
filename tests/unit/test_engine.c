/* test_engine.c — the continuous-batching engine on models/default: many requests at once give each its
 * solo greedy output, cancellation frees slots and blocks, a full queue says busy, stop strings cut the
 * text exactly, max_tokens is clamped to the context, logprobs and text events arrive in order. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cinfer.h"
#include "runtime/engine_internal.h"
#include "test.h"

#define MODEL "models/default"

static cinfer_model *open_default(void) {
    char err[1024];
    cinfer_model *m = NULL;
    if (cinfer_model_open(MODEL, &m, err, sizeof err)) {
        test_fail(__FILE__, __LINE__, "%s", err);
        return NULL;
    }
    return m;
}

/* Solo greedy continuation through the plain context API (the reference the engine must reproduce). */
static void solo_greedy(cinfer_model *m, const int32_t *prompt, int np, int n, int32_t *out) {
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    cinfer_ctx_params p = cinfer_ctx_default_params();
    p.max_seqs = 1;
    p.max_ctx = np + n;
    p.max_batch = np;
    p.n_threads = 2;
    char err[512];
    cinfer_ctx *c;
    if (cinfer_ctx_create(m, &p, &c, err, sizeof err)) return;
    int s = cinfer_seq_open(c, err, sizeof err);
    float *lg = malloc(sizeof(float) * info.vocab_size);
    cinfer_batch_entry e = {s, prompt, np, 0};
    cinfer_forward(c, &e, 1, lg, err, sizeof err);
    for (int i = 0; i < n; i++) {
        int best = 0;
        for (int v = 1; v < info.vocab_size; v++)
            if (lg[v] > lg[best]) best = v;
        out[i] = best;
        cinfer_batch_entry d = {s, &out[i], 1, 0};
        if (i + 1 < n) cinfer_forward(c, &d, 1, lg, err, sizeof err);
    }
    free(lg);
    cinfer_ctx_destroy(c);
}

static cinfer_request_params greedy_params(const int32_t *prompt, int np, int max_tokens) {
    cinfer_request_params rp;
    memset(&rp, 0, sizeof rp);
    rp.prompt = prompt;
    rp.n_prompt = np;
    rp.max_tokens = max_tokens;
    rp.sampling = cinfer_sampling_default();
    rp.sampling.temperature = 0;
    rp.sampling.n_logprobs = 0; /* a LOGPROB event per token: how the test reads the ids */
    rp.ignore_eos = 1;
    rp.skip_special_tokens = 1;
    return rp;
}

typedef struct collected {
    int32_t ids[512];
    int n_ids;
    char text[8192];
    size_t text_len;
    char finish[32];
    int completion_tokens;
} collected;

static void drain(cinfer_request *r, collected *c) {
    memset(c, 0, sizeof *c);
    cinfer_event ev;
    while (cinfer_request_next(r, &ev, 20000) == 1) {
        if (ev.type == CINFER_EV_LOGPROB && c->n_ids < 512) c->ids[c->n_ids++] = ev.token;
        if (ev.type == CINFER_EV_CONTENT && c->text_len + ev.len < sizeof c->text) {
            memcpy(c->text + c->text_len, ev.text, ev.len);
            c->text_len += ev.len;
        }
        if (ev.type == CINFER_EV_DONE) {
            snprintf(c->finish, sizeof c->finish, "%s", ev.finish_reason);
            c->completion_tokens = ev.completion_tokens;
        }
        if (ev.type == CINFER_EV_ERROR) snprintf(c->finish, sizeof c->finish, "error");
    }
}

static void make_prompt(int32_t *p, int n, uint64_t seed, int V) {
    for (int i = 0; i < n; i++) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        p[i] = (int32_t)(seed % (uint64_t)V);
    }
}

TEST(engine_concurrent_requests_match_solo) {
    cinfer_model *m = open_default();
    REQUIRE(m);
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.max_seqs = 4; /* 10 requests: queueing and admission mid-flight */
    ep.ctx_size = 256;
    ep.step_tokens = 48; /* small budget: long prompts prefill in chunks mixed with decode */
    ep.n_threads = 2;
    cinfer_engine *e;
    char err[1024];
    REQUIRE(cinfer_engine_create(m, &ep, &e, err, sizeof err) == 0);
    enum { NR = 10 };
    int32_t prompts[NR][120];
    int lens[NR], gen[NR];
    cinfer_request *rq[NR];
    for (int i = 0; i < NR; i++) {
        lens[i] = 1 + (i * 37) % 110;
        gen[i] = 5 + (i * 7) % 20;
        make_prompt(prompts[i], lens[i], 100 + i, info.vocab_size);
        cinfer_request_params rp = greedy_params(prompts[i], lens[i], gen[i]);
        REQUIRE(cinfer_engine_submit(e, &rp, &rq[i], err, sizeof err) == 0);
    }
    for (int i = 0; i < NR; i++) {
        collected c;
        drain(rq[i], &c);
        int32_t want[64];
        solo_greedy(m, prompts[i], lens[i], gen[i], want);
        CHECK_MSG(c.n_ids == gen[i], "request %d: %d tokens, expected %d", i, c.n_ids, gen[i]);
        CHECK_MSG(!memcmp(c.ids, want, sizeof(int32_t) * (size_t)gen[i]), "request %d: tokens differ from its solo run", i);
        CHECK_MSG(!strcmp(c.finish, "length"), "request %d: finish %s", i, c.finish);
        CHECK_EQ_INT(c.completion_tokens, gen[i]);
        cinfer_request_free(rq[i]);
    }
    cinfer_engine_stats st;
    cinfer_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.running, 0);
    CHECK_EQ_INT(st.kv_blocks_used, 0);
    CHECK_EQ_INT(st.slots_used, 0);
    CHECK_EQ_INT(st.requests_total, NR);
    cinfer_engine_destroy(e);
    cinfer_model_close(m);
}

TEST(engine_cancel_busy_and_limits) {
    cinfer_model *m = open_default();
    REQUIRE(m);
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.max_seqs = 1;
    ep.ctx_size = 64;
    ep.queue_limit = 1;
    ep.n_threads = 2;
    cinfer_engine *e;
    char err[1024];
    REQUIRE(cinfer_engine_create(m, &ep, &e, err, sizeof err) == 0);
    int32_t p[80];
    make_prompt(p, 80, 9, 4000);
    /* prompt longer than the context: ERANGE naming both counts */
    cinfer_request_params rp = greedy_params(p, 70, 10);
    cinfer_request *r0;
    CHECK_EQ_INT(cinfer_engine_submit(e, &rp, &r0, err, sizeof err), CINFER_ERANGE);
    CHECK_STR_CONTAINS(err, "70 tokens");
    CHECK_STR_CONTAINS(err, "64");
    /* a long request, cancelled after its first tokens */
    rp = greedy_params(p, 10, 1000); /* clamped to the 54 tokens of room */
    cinfer_request *r1, *r2, *r3;
    REQUIRE(cinfer_engine_submit(e, &rp, &r1, err, sizeof err) == 0);
    REQUIRE(cinfer_engine_submit(e, &rp, &r2, err, sizeof err) == 0);     /* waits in the queue */
    CHECK_EQ_INT(cinfer_engine_submit(e, &rp, &r3, err, sizeof err), CINFER_EBUSY); /* one past the limit */
    cinfer_event ev;
    int got = 0;
    while (got < 3 && cinfer_request_next(r1, &ev, 20000) == 1)
        if (ev.type == CINFER_EV_LOGPROB) got++;
    CHECK_EQ_INT(got, 3);
    cinfer_request_cancel(r1);
    collected c;
    drain(r1, &c);
    CHECK_MSG(!strcmp(c.finish, "cancelled"), "finish %s", c.finish);
    cinfer_request_free(r1);
    /* r2 then runs to the clamp: 64 - 10 = 54 tokens, finish "length" */
    drain(r2, &c);
    CHECK_EQ_INT(c.n_ids, 54);
    CHECK_MSG(!strcmp(c.finish, "length"), "finish %s", c.finish);
    cinfer_request_free(r2);
    /* freeing a request mid-flight without reading it: the engine lets go by itself */
    REQUIRE(cinfer_engine_submit(e, &rp, &r3, err, sizeof err) == 0);
    cinfer_request_free(r3);
    cinfer_engine_stats st;
    for (int i = 0; i < 200; i++) {
        cinfer_engine_get_stats(e, &st);
        if (!st.running && !st.waiting) break;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    CHECK_EQ_INT(st.running, 0);
    CHECK_EQ_INT(st.waiting, 0);
    CHECK_EQ_INT(st.kv_blocks_used, 0);
    cinfer_engine_destroy(e);
    cinfer_model_close(m);
}

TEST(engine_stop_strings_cut_text) {
    cinfer_model *m = open_default();
    REQUIRE(m);
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.max_seqs = 2;
    ep.ctx_size = 128;
    ep.n_threads = 2;
    cinfer_engine *e;
    char err[1024];
    REQUIRE(cinfer_engine_create(m, &ep, &e, err, sizeof err) == 0);
    int32_t *p;
    int np;
    REQUIRE(cinfer_tokenize(m, "def main():\n    return", 22, 0, &p, &np, err, sizeof err) == 0);
    cinfer_request_params rp = greedy_params(p, np, 40);
    cinfer_request *r;
    REQUIRE(cinfer_engine_submit(e, &rp, &r, err, sizeof err) == 0);
    collected full;
    drain(r, &full);
    cinfer_request_free(r);
    /* the streamed text equals the detokenized ids */
    char *dec;
    REQUIRE(cinfer_detokenize(m, full.ids, full.n_ids, 1, &dec, err, sizeof err) == 0);
    CHECK_MSG(strlen(dec) == full.text_len && !memcmp(dec, full.text, full.text_len), "streamed text differs from decode");
    /* a stop string from the middle of that text: the output ends right before it */
    REQUIRE(full.text_len > 12);
    size_t at = full.text_len / 2;
    char stop[8];
    memcpy(stop, full.text + at, 3);
    stop[3] = 0;
    const char *first = strstr(full.text, stop);
    REQUIRE(first);
    const char *stops[1] = {stop};
    rp.stop = stops;
    rp.n_stop = 1;
    REQUIRE(cinfer_engine_submit(e, &rp, &r, err, sizeof err) == 0);
    collected cut;
    drain(r, &cut);
    cinfer_request_free(r);
    CHECK_MSG(cut.text_len == (size_t)(first - full.text), "stopped text is %zu bytes, expected %zu", cut.text_len,
              (size_t)(first - full.text));
    CHECK(!memcmp(cut.text, full.text, cut.text_len));
    CHECK_MSG(!strcmp(cut.finish, "stop"), "finish %s", cut.finish);
    free(dec);
    free(p);
    cinfer_engine_destroy(e);
    cinfer_model_close(m);
}

TEST(text_api_tokenize_template) {
    cinfer_model *m = open_default();
    REQUIRE(m);
    char err[1024];
    CHECK(cinfer_model_has_tokenizer(m));
    CHECK(cinfer_model_chat_template(m) != NULL);
    const char *ctx = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"add_generation_prompt\": true}";
    char *out;
    REQUIRE(cinfer_apply_chat_template(m, ctx, strlen(ctx), &out, err, sizeof err) == 0);
    CHECK_STR_CONTAINS(out, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    int32_t *ids;
    int n;
    REQUIRE(cinfer_tokenize(m, out, strlen(out), 0, &ids, &n, err, sizeof err) == 0);
    char *back;
    REQUIRE(cinfer_detokenize(m, ids, n, 0, &back, err, sizeof err) == 0);
    CHECK(!strcmp(back, out));
    free(back), free(ids), free(out);
    const char *bad = "{\"messages\": [{\"role\": \"assistant\", \"content\": \"x\"}], \"add_generation_prompt\": true}";
    int rc = cinfer_apply_chat_template(m, bad, strlen(bad), &out, err, sizeof err);
    if (rc == 0) free(out);
    CHECK_EQ_INT(rc, CINFER_EINVAL); /* Qwen3.5's template raises "No user query found in messages." */
    CHECK_STR_CONTAINS(err, "No user query");
    cinfer_model_close(m);
}

/* Speculation (n-gram drafts) changes nothing in the output: greedy and seeded sampling give exactly the
 * tokens of plain decoding, for 16 mixed requests at once, because each verified position is sampled with the
 * same calls and generator draws as plain decode and a sequence's logits do not depend on the batch. */
/* Runs n requests at once (seeded; temps[i] 0 = greedy) and collects each one's events. draft: the draft
 * model (CINFER_SPEC_DRAFT); drafter: replaces the engine's drafter (with CINFER_SPEC_NGRAM). */
static void run_batch_with(cinfer_model *m, cinfer_spec_mode spec, cinfer_model *draft, engine_draft_fn drafter,
                           void *drafter_ud, int n, int32_t prompts[][96], const int *lens, const int *gens,
                           const float *temps, collected *out, cinfer_engine_stats *st) {
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.max_seqs = 16;
    ep.ctx_size = 256;
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
    if (drafter) engine_set_drafter(e, drafter, drafter_ud);
    cinfer_request *rq[32];
    for (int i = 0; i < n; i++) {
        cinfer_request_params rp = greedy_params(prompts[i], lens[i], gens[i]);
        rp.sampling.temperature = temps[i];
        rp.sampling.has_seed = 1;
        rp.sampling.seed = 77 + (uint64_t)i;
        if (cinfer_engine_submit(e, &rp, &rq[i], err, sizeof err)) test_fail(__FILE__, __LINE__, "%s", err);
    }
    for (int i = 0; i < n; i++) {
        drain(rq[i], &out[i]);
        cinfer_request_free(rq[i]);
    }
    cinfer_engine_get_stats(e, st);
    cinfer_engine_destroy(e);
}

static void run_batch(cinfer_model *m, cinfer_spec_mode spec, int n, int32_t prompts[][96], const int *lens,
                      const int *gens, const float *temps, collected *out, cinfer_engine_stats *st) {
    run_batch_with(m, spec, NULL, NULL, NULL, n, prompts, lens, gens, temps, out, st);
}

TEST(engine_ngram_speculation_is_exact) {
    cinfer_model *m = open_default();
    REQUIRE(m);
    enum { NR = 16 };
    static int32_t prompts[NR][96];
    int lens[NR], gens[NR];
    float temps[NR];
    for (int i = 0; i < NR; i++) {
        /* repetitive prompts (a motif repeated) so the n-gram drafter has something to propose */
        int motif = 2 + i % 5;
        lens[i] = 20 + (i * 13) % 60;
        make_prompt(prompts[i], motif, 500 + i, 4096);
        for (int t = motif; t < lens[i]; t++) prompts[i][t] = prompts[i][t % motif];
        gens[i] = 24 + (i * 5) % 24;
        temps[i] = i % 4 == 3 ? 0.8f : 0.0f; /* a quarter sampled with seeds */
    }
    static collected plain[NR], spec[NR];
    cinfer_engine_stats s0, s1;
    run_batch(m, CINFER_SPEC_NONE, NR, prompts, lens, gens, temps, plain, &s0);
    run_batch(m, CINFER_SPEC_NGRAM, NR, prompts, lens, gens, temps, spec, &s1);
    for (int i = 0; i < NR; i++) {
        CHECK_MSG(plain[i].n_ids == gens[i] && spec[i].n_ids == gens[i], "request %d: %d / %d tokens", i, plain[i].n_ids,
                  spec[i].n_ids);
        CHECK_MSG(!memcmp(plain[i].ids, spec[i].ids, sizeof(int32_t) * (size_t)gens[i]),
                  "request %d (temp %.1f): speculation changed the output", i, temps[i]);
        CHECK(!strcmp(plain[i].text, spec[i].text));
    }
    CHECK_EQ_INT(s0.spec_drafted, 0);
    /* the random-weight default model rarely continues a motif, so drafts are mostly rejected here; the
     * oracle test below covers acceptance */
    CHECK_MSG(s1.spec_drafted > 0, "drafted %lld: the test never speculated", (long long)s1.spec_drafted);
    printf("     ngram: %lld drafted, %lld accepted; steps %lld -> %lld\n", (long long)s1.spec_drafted,
           (long long)s1.spec_accepted, (long long)s0.steps_total, (long long)s1.steps_total);
    CHECK_EQ_INT(s1.kv_blocks_used, 0);
    cinfer_model_close(m);
}

/* Drafts from an oracle that knows each request's plain output but corrupts one draft position per step
 * (cycling 0..k), so every acceptance count from 0 to k happens; the output must not change. */
typedef struct oracle {
    int n;
    int32_t (*prompts)[96];
    const int *lens;
    collected *plain;
    int calls;
} oracle;

static int oracle_draft(void *ud, const int32_t *hist, int n_hist, int32_t *out, int k) {
    oracle *o = ud;
    for (int i = 0; i < o->n; i++) {
        int L = o->lens[i];
        if (n_hist < L || memcmp(hist, o->prompts[i], sizeof(int32_t) * (size_t)L)) continue;
        int g = n_hist - L; /* tokens generated so far; hist[n_hist-1] is plain[i].ids[g-1] */
        int bad = o->calls++ % (k + 1);
        int cnt = 0;
        while (cnt < k && g + cnt < o->plain[i].n_ids) {
            int32_t t = o->plain[i].ids[g + cnt];
            out[cnt] = cnt == bad ? (t + 1) % 4096 : t;
            cnt++;
        }
        return cnt;
    }
    return 0;
}

TEST(engine_speculation_partial_acceptance_is_exact) {
    cinfer_model *m = open_default();
    REQUIRE(m);
    enum { NR = 16 };
    static int32_t prompts[NR][96];
    int lens[NR], gens[NR];
    float temps[NR];
    for (int i = 0; i < NR; i++) {
        lens[i] = 5 + (i * 11) % 70;
        make_prompt(prompts[i], lens[i], 900 + i, 4096);
        gens[i] = 20 + (i * 7) % 30;
        temps[i] = i % 3 == 2 ? 1.0f : 0.0f;
    }
    static collected plain[NR], spec[NR];
    cinfer_engine_stats s0, s1;
    run_batch(m, CINFER_SPEC_NONE, NR, prompts, lens, gens, temps, plain, &s0);
    /* same batch with the oracle drafter */
    oracle o = {NR, prompts, lens, plain, 0};
    run_batch_with(m, CINFER_SPEC_NGRAM, NULL, oracle_draft, &o, NR, prompts, lens, gens, temps, spec, &s1);
    for (int i = 0; i < NR; i++) {
        CHECK_EQ_INT(spec[i].n_ids, gens[i]);
        CHECK_MSG(!memcmp(plain[i].ids, spec[i].ids, sizeof(int32_t) * (size_t)gens[i]),
                  "request %d (temp %.1f): speculation changed the output", i, temps[i]);
        CHECK_MSG(!strcmp(plain[i].finish, spec[i].finish), "request %d: finish %s vs %s", i, plain[i].finish, spec[i].finish);
    }
    printf("     oracle drafts: %lld drafted, %lld accepted; steps %lld -> %lld\n", (long long)s1.spec_drafted,
           (long long)s1.spec_accepted, (long long)s0.steps_total, (long long)s1.steps_total);
    CHECK(s1.spec_accepted > s1.spec_drafted / 4);
    CHECK(s1.steps_total < s0.steps_total);
    CHECK_EQ_INT(s1.kv_blocks_used, 0);
    CHECK_EQ_INT(s1.slots_used, 0);
    cinfer_model_close(m);
}

/* Drafts shorter than the window: call c proposes c % (k + 1) drafts (0..k) of the plain output, the one at
 * (c / (k + 1)) % (k + 1) wrong (past the end: all right). */
static int short_draft(void *ud, const int32_t *hist, int n_hist, int32_t *out, int k) {
    oracle *o = ud;
    for (int i = 0; i < o->n; i++) {
        int L = o->lens[i];
        if (n_hist < L || memcmp(hist, o->prompts[i], sizeof(int32_t) * (size_t)L)) continue;
        int g = n_hist - L, c = o->calls++, want = c % (k + 1), bad = (c / (k + 1)) % (k + 1), cnt = 0;
        while (cnt < want && g + cnt < o->plain[i].n_ids) {
            int32_t t = o->plain[i].ids[g + cnt];
            out[cnt] = cnt == bad ? (t + 1) % 4096 : t;
            cnt++;
        }
        return cnt;
    }
    return 0;
}

/* n requests at once, request i stopping at stops[i] (empty: none); *pad_rows: the engine's pad rows */
static void run_stops(cinfer_model *m, cinfer_spec_mode spec, engine_draft_fn drafter, void *ud, int n,
                      int32_t prompts[][96], const int *lens, const int *gens, const float *temps,
                      char stops[][8], collected *out, cinfer_engine_stats *st, long long *pad_rows) {
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.max_seqs = 16, ep.ctx_size = 256, ep.step_tokens = 96, ep.n_threads = 2;
    ep.spec = spec, ep.spec_max_draft = 4;
    cinfer_engine *e;
    char err[1024];
    if (cinfer_engine_create(m, &ep, &e, err, sizeof err)) {
        test_fail(__FILE__, __LINE__, "%s", err);
        return;
    }
    if (drafter) engine_set_drafter(e, drafter, ud);
    cinfer_request *rq[32];
    for (int i = 0; i < n; i++) {
        cinfer_request_params rp = greedy_params(prompts[i], lens[i], gens[i]);
        rp.sampling.temperature = temps[i];
        rp.sampling.has_seed = 1;
        rp.sampling.seed = 31 + (uint64_t)i;
        const char *sv[1] = {stops[i]};
        if (stops[i][0]) rp.stop = sv, rp.n_stop = 1;
        if (cinfer_engine_submit(e, &rp, &rq[i], err, sizeof err)) test_fail(__FILE__, __LINE__, "%s", err);
    }
    for (int i = 0; i < n; i++) {
        drain(rq[i], &out[i]);
        cinfer_request_free(rq[i]);
    }
    cinfer_engine_get_stats(e, st);
    *pad_rows = engine_pad_rows(e);
    cinfer_engine_destroy(e);
}

/* CINFER_SPEC_PAD=1 (every decode entry of a step with drafts becomes a window of spec_max_draft + 1 rows):
 * drafts shorter than the window (0 to k), output budgets ending inside a window, and stop strings inside
 * kept drafts give the plain output — the same tokens, text and finish reasons — with pad rows in play. */
TEST(engine_padded_windows_are_exact) {
    cinfer_model *m = open_default();
    REQUIRE(m);
    enum { NR = 16 };
    static int32_t prompts[NR][96];
    static char stops[NR][8];
    int lens[NR], gens[NR];
    float temps[NR];
    for (int i = 0; i < NR; i++) {
        lens[i] = 6 + (i * 13) % 60;
        make_prompt(prompts[i], lens[i], 300 + i, 4096);
        gens[i] = 9 + (i * 7) % 26; /* budgets that end anywhere inside a 5-row window */
        temps[i] = i % 4 == 3 ? 0.9f : 0.0f;
        stops[i][0] = 0;
    }
    static collected plain[NR], spec[NR];
    cinfer_engine_stats s0, s1;
    long long pads = 0;
    run_stops(m, CINFER_SPEC_NONE, NULL, NULL, NR, prompts, lens, gens, temps, stops, plain, &s0, &pads);
    /* a stop string from the middle of every third request's text (3 bytes, as engine_stop_strings_cut_text)
     */
    for (int i = 0; i < NR; i += 3)
        if (plain[i].text_len > 12)
            memcpy(stops[i], plain[i].text + plain[i].text_len / 2, 3), stops[i][3] = 0;
    run_stops(m, CINFER_SPEC_NONE, NULL, NULL, NR, prompts, lens, gens, temps, stops, plain, &s0, &pads);
    setenv("CINFER_SPEC_PAD", "1", 1);
    oracle o = {NR, prompts, lens, plain, 0};
    run_stops(m, CINFER_SPEC_NGRAM, short_draft, &o, NR, prompts, lens, gens, temps, stops, spec, &s1, &pads);
    unsetenv("CINFER_SPEC_PAD");
    for (int i = 0; i < NR; i++) {
        CHECK_MSG(spec[i].n_ids == plain[i].n_ids &&
                      !memcmp(plain[i].ids, spec[i].ids, sizeof(int32_t) * (size_t)plain[i].n_ids),
                  "request %d (temp %.1f, stop \"%s\"): padded windows changed the output", i, temps[i],
                  stops[i]);
        CHECK_MSG(spec[i].text_len == plain[i].text_len &&
                      !memcmp(spec[i].text, plain[i].text, plain[i].text_len),
                  "request %d: the text differs", i);
        CHECK_MSG(!strcmp(plain[i].finish, spec[i].finish), "request %d: finish %s vs %s", i, plain[i].finish,
                  spec[i].finish);
    }
    int n_stop = 0;
    for (int i = 0; i < NR; i++) n_stop += !strcmp(plain[i].finish, "stop");
    printf("     padded windows: %lld drafted, %lld accepted, %lld pad rows; steps %lld -> %lld; %d stopped "
           "by a string\n",
           (long long)s1.spec_drafted, (long long)s1.spec_accepted, pads, (long long)s0.steps_total,
           (long long)s1.steps_total, n_stop);
    CHECK_MSG(pads > 0, "no window was padded");
    CHECK(n_stop > 0);
    CHECK(s1.spec_accepted > 0 && s1.steps_total < s0.steps_total);
    CHECK_EQ_INT(s1.kv_blocks_used, 0);
    CHECK_EQ_INT(s1.slots_used, 0);
    cinfer_model_close(m);
}

/* drafts that are never right: the plain output's next tokens, each one off */
static int wrong_draft(void *ud, const int32_t *hist, int n_hist, int32_t *out, int k) {
    oracle *o = ud;
    for (int i = 0; i < o->n; i++) {
        int L = o->lens[i];
        if (n_hist < L || memcmp(hist, o->prompts[i], sizeof(int32_t) * (size_t)L)) continue;
        int g = n_hist - L, cnt = 0;
        while (cnt < k && g + cnt < o->plain[i].n_ids)
            out[cnt] = (o->plain[i].ids[g + cnt] + 1) % 4096, cnt++;
        return cnt;
    }
    return 0;
}

/* CINFER_SPEC_COST=1 (with padding): steps speculate only when the measured cost of a padded step against a
 * plain one is below the tokens the drafts are expected to yield. Drafts that are never right: most steps
 * decline them (only probes and the first measurements verify). The output is the plain one either way. */
TEST(engine_spec_cost_declines_bad_drafts) {
    cinfer_model *m = open_default();
    REQUIRE(m);
    enum { NR = 8 };
    static int32_t prompts[NR][96];
    static char stops[NR][8];
    int lens[NR], gens[NR];
    float temps[NR];
    for (int i = 0; i < NR; i++) {
        lens[i] = 8 + i * 5;
        make_prompt(prompts[i], lens[i], 700 + i, 4096);
        gens[i] = 60;
        temps[i] = 0.0f;
        stops[i][0] = 0;
    }
    static collected plain[NR], spec[NR];
    cinfer_engine_stats s0, s1, s2;
    long long pads;
    run_stops(m, CINFER_SPEC_NONE, NULL, NULL, NR, prompts, lens, gens, temps, stops, plain, &s0, &pads);
    setenv("CINFER_SPEC_PAD", "1", 1);
    unsetenv("CINFER_SPEC_COST");
    oracle o = {NR, prompts, lens, plain, 0};
    run_stops(m, CINFER_SPEC_NGRAM, wrong_draft, &o, NR, prompts, lens, gens, temps, stops, spec, &s1, &pads);
    setenv("CINFER_SPEC_COST", "1", 1);
    run_stops(m, CINFER_SPEC_NGRAM, wrong_draft, &o, NR, prompts, lens, gens, temps, stops, spec, &s2, &pads);
    for (int i = 0; i < NR; i++)
        CHECK_MSG(spec[i].n_ids == gens[i] &&
                      !memcmp(plain[i].ids, spec[i].ids, sizeof(int32_t) * (size_t)gens[i]),
                  "request %d: the output changed", i);
    printf("     wrong drafts: %lld drafted always verifying, %lld with the cost rule; steps %lld / %lld / "
           "%lld\n",
           (long long)s1.spec_drafted, (long long)s2.spec_drafted, (long long)s0.steps_total,
           (long long)s1.steps_total, (long long)s2.steps_total);
    CHECK_MSG(s2.spec_drafted * 2 < s1.spec_drafted, "the cost rule verified %lld of %lld drafts",
              (long long)s2.spec_drafted, (long long)s1.spec_drafted);
    /* mostly right drafts (short_draft: 0..k of the plain output, one wrong), alone: the output again
     * (whether they pay depends on this machine's costs, e.g. not under the sanitizers: printed, not checked)
     */
    run_stops(m, CINFER_SPEC_NONE, NULL, NULL, 1, prompts, lens, gens, temps, stops, plain, &s0, &pads);
    o.n = 1;
    run_stops(m, CINFER_SPEC_NGRAM, short_draft, &o, 1, prompts, lens, gens, temps, stops, spec, &s2, &pads);
    unsetenv("CINFER_SPEC_COST");
    unsetenv("CINFER_SPEC_PAD");
    CHECK(!memcmp(plain[0].ids, spec[0].ids, sizeof(int32_t) * (size_t)gens[0]));
    printf("     right drafts alone: %lld drafted, %lld accepted; steps %lld -> %lld\n",
           (long long)s2.spec_drafted, (long long)s2.spec_accepted, (long long)s0.steps_total,
           (long long)s2.steps_total);
    cinfer_model_close(m);
}

/* The wording: a sequence's greedy output is identical whether it ran alone or among 63 others. */
TEST(engine_64_concurrent_match_solo) {
    cinfer_model *m = open_default();
    REQUIRE(m);
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.max_seqs = 64;
    ep.ctx_size = 128;
    ep.step_tokens = 256;
    ep.n_threads = 2;
    cinfer_engine *e;
    char err[1024];
    REQUIRE(cinfer_engine_create(m, &ep, &e, err, sizeof err) == 0);
    enum { NR = 64 };
    static int32_t prompts[NR][64];
    int lens[NR], gen[NR];
    cinfer_request *rq[NR];
    for (int i = 0; i < NR; i++) {
        lens[i] = 1 + (i * 29) % 60;
        gen[i] = 8 + (i * 3) % 12;
        make_prompt(prompts[i], lens[i], 7000 + i, info.vocab_size);
        cinfer_request_params rp = greedy_params(prompts[i], lens[i], gen[i]);
        REQUIRE(cinfer_engine_submit(e, &rp, &rq[i], err, sizeof err) == 0);
    }
    int bad = 0;
    for (int i = 0; i < NR; i++) {
        collected c;
        drain(rq[i], &c);
        int32_t want[32];
        solo_greedy(m, prompts[i], lens[i], gen[i], want);
        if (c.n_ids != gen[i] || memcmp(c.ids, want, sizeof(int32_t) * (size_t)gen[i])) bad++;
        cinfer_request_free(rq[i]);
    }
    CHECK_MSG(bad == 0, "%d of 64 concurrent requests differ from their solo greedy output", bad);
    cinfer_engine_destroy(e);
    cinfer_model_close(m);
}

/* Prefix cache: a second chat turn resumes from the first turn's snapshot and produces exactly what a
 * cold run of the same prompt produces — the same tokens and the same top-20 logprobs bit for bit. */
typedef struct lp_trace {
    int32_t ids[64];
    float lp[64][21];
    int n;
    int cached;
} lp_trace;

static void run_traced(cinfer_engine *e, const int32_t *prompt, int np, int n, lp_trace *t) {
    char err[512];
    cinfer_request_params rp = greedy_params(prompt, np, n);
    rp.sampling.n_logprobs = 20;
    cinfer_request *r;
    memset(t, 0, sizeof *t);
    if (cinfer_engine_submit(e, &rp, &r, err, sizeof err)) {
        test_fail(__FILE__, __LINE__, "%s", err);
        return;
    }
    cinfer_event ev;
    while (cinfer_request_next(r, &ev, 20000) == 1) {
        if (ev.type == CINFER_EV_LOGPROB && t->n < 64) {
            t->ids[t->n] = ev.token;
            t->lp[t->n][0] = ev.logprob;
            for (int i = 0; i < ev.n_top && i < 20; i++) t->lp[t->n][1 + i] = ev.top[i].logprob;
            t->n++;
        }
        if (ev.type == CINFER_EV_DONE) t->cached = ev.cached_tokens;
    }
    cinfer_request_free(r);
}

static int32_t *render(cinfer_model *m, const char *ctx, int *n) {
    char *out, err[512];
    int32_t *ids = NULL;
    if (cinfer_apply_chat_template(m, ctx, strlen(ctx), &out, err, sizeof err)) return NULL;
    if (cinfer_tokenize(m, out, strlen(out), 0, &ids, n, err, sizeof err)) ids = NULL;
    free(out);
    return ids;
}

TEST(engine_prefix_cache_second_turn_equals_cold) {
    cinfer_model *m = open_default();
    REQUIRE(m);
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.max_seqs = 2;
    ep.ctx_size = 512;
    ep.n_threads = 2;
    ep.prefix_cache_memory = 64 << 20;
    char err[1024];
    cinfer_engine *warm, *cold;
    REQUIRE(cinfer_engine_create(m, &ep, &warm, err, sizeof err) == 0);
    REQUIRE(cinfer_engine_create(m, &ep, &cold, err, sizeof err) == 0);
    const char *t1 = "{\"messages\": [{\"role\": \"system\", \"content\": \"You write Python.\"}, {\"role\": \"user\", \"content\": "
                     "\"Write a function that reverses a string.\"}], \"add_generation_prompt\": true}";
    const char *t2 = "{\"messages\": [{\"role\": \"system\", \"content\": \"You write Python.\"}, {\"role\": \"user\", \"content\": "
                     "\"Write a function that reverses a string.\"}, {\"role\": \"assistant\", \"content\": \"def rev(s):\\n    "
                     "return s[::-1]\"}, {\"role\": \"user\", \"content\": \"Now make it handle None.\"}], \"add_generation_prompt\": true}";
    int n1, n2;
    int32_t *p1 = render(m, t1, &n1), *p2 = render(m, t2, &n2);
    REQUIRE(p1 && p2);
    lp_trace a, b, c, d;
    run_traced(warm, p1, n1, 16, &a);  /* turn 1: a miss that leaves snapshots at each message boundary */
    run_traced(warm, p2, n2, 16, &b);  /* turn 2: resumes */
    run_traced(cold, p2, n2, 16, &c);  /* turn 2 cold */
    run_traced(warm, p2, n2, 16, &d);  /* turn 2 again: resumes at the last prompt token */
    CHECK_EQ_INT(a.cached, 0);
    CHECK_EQ_INT(c.cached, 0);
    CHECK_MSG(b.cached > 0 && b.cached < n2 - 1, "turn 2 resumed after %d of %d tokens", b.cached, n2);
    CHECK_EQ_INT(d.cached, n2 - 1);
    CHECK_EQ_INT(b.n, 16);
    CHECK_MSG(!memcmp(b.ids, c.ids, sizeof b.ids) && !memcmp(b.lp, c.lp, sizeof b.lp), "a cached turn differs from cold");
    CHECK_MSG(!memcmp(d.ids, c.ids, sizeof d.ids) && !memcmp(d.lp, c.lp, sizeof d.lp), "a fully cached prompt differs from cold");
    cinfer_engine_stats st;
    cinfer_engine_get_stats(warm, &st);
    CHECK_EQ_INT(st.prefix_hits, 2);
    CHECK(st.prefix_tokens_served == b.cached + d.cached);
    CHECK(st.prefix_bytes > 0);
    CHECK_EQ_INT(st.running, 0);
    printf("     turn 2: %d of %d prompt tokens from the cache; %lld snapshot bytes held\n", b.cached, n2,
           (long long)st.prefix_bytes);
    free(p1), free(p2);
    cinfer_engine_destroy(warm);
    cinfer_engine_destroy(cold);
    cinfer_model_close(m);
}

/* Draft-model speculation with the target as its own draft (self-draft): greedy drafts are exactly the
 * target's greedy tokens, so every greedy draft is accepted; seeded sampling still gives exactly the plain
 * output. 16 mixed requests at once, prompts that end mid-chunk, windows that hit max_tokens. */
TEST(engine_draft_model_self_draft_is_exact) {
    cinfer_model *m = open_default(), *dm = open_default();
    REQUIRE(m && dm);
    enum { NR = 16 };
    static int32_t prompts[NR][96];
    int lens[NR], gens[NR];
    float temps[NR];
    for (int i = 0; i < NR; i++) {
        lens[i] = 3 + (i * 17) % 90;
        make_prompt(prompts[i], lens[i], 3100 + i, 4096);
        gens[i] = 9 + (i * 7) % 31;
        temps[i] = i % 4 == 1 ? 0.9f : 0.0f;
    }
    static collected plain[NR], spec[NR];
    cinfer_engine_stats s0, s1;
    run_batch(m, CINFER_SPEC_NONE, NR, prompts, lens, gens, temps, plain, &s0);
    run_batch_with(m, CINFER_SPEC_DRAFT, dm, NULL, NULL, NR, prompts, lens, gens, temps, spec, &s1);
    for (int i = 0; i < NR; i++) {
        CHECK_EQ_INT(spec[i].n_ids, gens[i]);
        CHECK_MSG(!memcmp(plain[i].ids, spec[i].ids, sizeof(int32_t) * (size_t)gens[i]),
                  "request %d (temp %.1f): the draft model changed the output", i, temps[i]);
    }
    printf("     self-draft: %lld drafted, %lld accepted; steps %lld -> %lld\n", (long long)s1.spec_drafted,
           (long long)s1.spec_accepted, (long long)s0.steps_total, (long long)s1.steps_total);
    /* 12 of 16 requests are greedy: their drafts all hold; the sampled ones hold less often */
    CHECK(s1.spec_accepted * 10 >= s1.spec_drafted * 7);
    CHECK(s1.steps_total < s0.steps_total); /* the sampled requests (near-uniform here) bound the step count */
    CHECK_EQ_INT(s1.kv_blocks_used, 0);
    cinfer_model_close(dm);
    cinfer_model_close(m);
}

/* CINFER_PREFIX_GAP (engine.c next_stop): a second turn resumed one token before the 4096-token snapshot interval
 * takes no snapshot there with a gap of 64 (one piece to its last prompt token: one snapshot where a gap of 0 takes
 * two) and gives the cold run's tokens either way, its logprobs within 1e-4 (not bitwise: the cold run reads
 * position P1 - 1 inside a whole DeltaNet chunk, the resumed one as a row of its own, as without the gap). */
TEST(engine_prefix_gap_skips_an_interval_snapshot_after_a_resume) {
    char err[1024];
    cinfer_model *m = NULL;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/qwen35_dense", test_fixtures_dir());
    REQUIRE(cinfer_model_open(dir, &m, err, sizeof err) == 0);
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    enum { P1 = 4096, P2 = 4096 + 40 };
    static int32_t p[P2];
    make_prompt(p, P2, 4242, info.vocab_size);
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.max_seqs = 2;
    ep.ctx_size = P2 + 16;
    ep.n_threads = 2;
    ep.prefix_cache_memory = 64 << 20;
    cinfer_engine *cold;
    REQUIRE(cinfer_engine_create(m, &ep, &cold, err, sizeof err) == 0);
    lp_trace a, b, c;
    run_traced(cold, p, P2, 8, &c);
    CHECK_EQ_INT(c.cached, 0);
    cinfer_engine_destroy(cold);
    long long snaps[2] = {0, 0};
    for (int gap = 0; gap < 2; gap++) {
        setenv("CINFER_PREFIX_GAP", gap ? "64" : "0", 1);
        setenv("CINFER_PREFIX_EXACT", "0", 1); /* resume at P1 - 1 (cuda's default; the CPU's waits for 4032) */
        cinfer_engine *warm;
        REQUIRE(cinfer_engine_create(m, &ep, &warm, err, sizeof err) == 0);
        unsetenv("CINFER_PREFIX_GAP");
        unsetenv("CINFER_PREFIX_EXACT");
        cinfer_engine_stats s1, s2;
        run_traced(warm, p, P1, 4, &a); /* one snapshot, at P1 - 1 */
        cinfer_engine_get_stats(warm, &s1);
        run_traced(warm, p, P2, 8, &b); /* resumes at P1 - 1, one token before the interval */
        cinfer_engine_get_stats(warm, &s2);
        CHECK_EQ_INT(b.cached, P1 - 1);
        CHECK_EQ_INT(b.n, 8);
        double worst = 0;
        for (int i = 0; i < 8; i++)
            for (int k = 0; k < 21; k++) {
                double d = fabs((double)b.lp[i][k] - c.lp[i][k]);
                if (!(d <= worst)) worst = d;
            }
        printf("     gap %d: logprobs differ from cold by %.3g at most\n", gap ? 64 : 0, worst);
        CHECK_MSG(!memcmp(b.ids, c.ids, sizeof b.ids), "gap %d: the cached turn's tokens differ from cold",
                  gap ? 64 : 0);
        CHECK_MSG(worst <= 1e-4, "gap %d: logprobs differ from cold by %.3g", gap ? 64 : 0, worst);
        REQUIRE(s1.prefix_bytes > 0);
        snaps[gap] = s2.prefix_bytes / s1.prefix_bytes - 1; /* snapshots the second turn added */
        cinfer_engine_destroy(warm);
    }
    printf("     snapshots taken by the resumed turn: %lld with gap 0, %lld with gap 64\n", snaps[0], snaps[1]);
    CHECK_EQ_INT((int)snaps[0], 2);
    CHECK_EQ_INT((int)snaps[1], 1);
    cinfer_model_close(m);
}

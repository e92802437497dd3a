/* test_engine.c — the continuous-batching engine on models/default: many requests at once give each its
 * solo greedy output, cancellation frees slots and blocks, a full queue says busy, stop strings cut the
 * text exactly, max_tokens is clamped to the context, logprobs and text events arrive in order. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cinfer.h"
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

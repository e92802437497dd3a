/* test_prefix_chat.c — issue 6's "output identical to a cold run" through the real chat path: a two-turn
 * conversation rendered by the model's own template (turn 2 = turn 1's messages + the reply the engine
 * generated + a new user message), with thinking on (the template's default) and off (the server's
 * chat_template_args), long enough that the turns cross DeltaNet chunk boundaries. Turn 2 resumed from the
 * prefix cache gives exactly the tokens and logprobs (the token's and the top 20) of the same engine
 * configuration run cold, and turn 1 asked again (a fully cached prompt) too. Raw prompts (no chat marks: the
 * completions API, benchmarks) that extend an earlier one resume at its last chunk-grid point (the engine
 * snapshots there with CINFER_PREFIX_EXACT, the CPU's default) and are bit for bit their cold run too;
 * without it they resume one token before the earlier prompt's end, a point the cold run reads inside a
 * chunk. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cinfer.h"
#include "test.h"

static cinfer_model *open_default(void) {
    char err[512];
    cinfer_model *m = NULL;
    if (cinfer_model_open("models/default", &m, err, sizeof err)) test_fail(__FILE__, __LINE__, "%s", err);
    return m;
}

typedef struct trace {
    int32_t ids[32];
    float lp[32][21];
    int n, cached;
    char text[1024];
} trace;

static void run(cinfer_engine *e, const int32_t *prompt, int np, int n, trace *t) {
    char err[512];
    cinfer_request_params rp;
    memset(&rp, 0, sizeof rp);
    rp.prompt = prompt, rp.n_prompt = np, rp.max_tokens = n;
    rp.sampling = cinfer_sampling_default();
    rp.sampling.temperature = 0, rp.sampling.n_logprobs = 20;
    rp.skip_special_tokens = 1;
    cinfer_request *r;
    memset(t, 0, sizeof *t);
    if (cinfer_engine_submit(e, &rp, &r, err, sizeof err)) {
        test_fail(__FILE__, __LINE__, "%s", err);
        return;
    }
    cinfer_event ev;
    size_t tl = 0;
    while (cinfer_request_next(r, &ev, 20000) == 1) {
        if (ev.type == CINFER_EV_LOGPROB && t->n < 32) {
            t->ids[t->n] = ev.token;
            t->lp[t->n][0] = ev.logprob;
            for (int i = 0; i < ev.n_top && i < 20; i++) t->lp[t->n][1 + i] = ev.top[i].logprob;
            t->n++;
        }
        if ((ev.type == CINFER_EV_CONTENT || ev.type == CINFER_EV_REASONING) &&
            tl + ev.len < sizeof t->text) {
            memcpy(t->text + tl, ev.text, ev.len);
            tl += ev.len;
        }
        if (ev.type == CINFER_EV_DONE) t->cached = ev.cached_tokens;
    }
    cinfer_request_free(r);
}

/* the template's rendering of msgs (a JSON array), generation prompt added, tokenized */
static int32_t *render(cinfer_model *m, json_t *msgs, int thinking, int *n) {
    json_t *ctx = json_pack("{s:O, s:b}", "messages", msgs, "add_generation_prompt", 1);
    if (thinking >= 0) json_object_set_new(ctx, "enable_thinking", json_boolean(thinking));
    char *js = json_dumps(ctx, JSON_COMPACT), *out, err[512];
    json_decref(ctx);
    int32_t *ids = NULL;
    if (!cinfer_apply_chat_template(m, js, strlen(js), &out, err, sizeof err)) {
        if (cinfer_tokenize(m, out, strlen(out), 0, &ids, n, err, sizeof err)) ids = NULL;
        free(out);
    } else {
        test_fail(__FILE__, __LINE__, "template: %s", err);
    }
    free(js);
    return ids;
}

static int same(const trace *a, const trace *b) {
    return a->n == b->n && !memcmp(a->ids, b->ids, sizeof a->ids) && !memcmp(a->lp, b->lp, sizeof a->lp);
}

static float worst(const trace *a, const trace *b) {
    float w = 0;
    for (int i = 0; i < a->n && i < b->n; i++)
        for (int k = 0; k < 21; k++) {
            float d = a->lp[i][k] - b->lp[i][k];
            if (d < 0) d = -d;
            if (d > w) w = d;
        }
    return w;
}

static void chat_case(cinfer_model *m, int thinking) {
    char err[512];
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.max_seqs = 2, ep.ctx_size = 1024, ep.n_threads = 2;
    ep.prefix_cache_memory = 64 << 20;
    cinfer_engine *warm, *cold;
    REQUIRE(cinfer_engine_create(m, &ep, &warm, err, sizeof err) == 0);
    REQUIRE(cinfer_engine_create(m, &ep, &cold, err, sizeof err) == 0);
    json_t *msgs =
        json_pack("[{s:s, s:s}, {s:s, s:s}]", "role", "system", "content",
                  "You are a helpful assistant who answers in plain English and keeps answers short.", "role",
                  "user", "content",
                  "Once upon a time there was a little fox who lived at the edge of a forest. "
                  "Tell me what the fox did on its first day out of the den, and who it met.");
    int n1, n2;
    int32_t *p1 = render(m, msgs, thinking, &n1);
    REQUIRE(p1);
    trace t1, t1again, t1cold, w2, c2;
    run(warm, p1, n1, 24, &t1);
    json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "assistant", "content", t1.text));
    json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content",
                                          "And what happened on the second day? Who did the fox meet then?"));
    int32_t *p2 = render(m, msgs, thinking, &n2);
    REQUIRE(p2);
    int shared = 0;
    while (shared < n1 && shared < n2 && p1[shared] == p2[shared]) shared++;
    run(warm, p2, n2, 24, &w2);      /* turn 2, resumed */
    run(cold, p2, n2, 24, &c2);      /* turn 2, cold */
    run(warm, p1, n1, 24, &t1again); /* turn 1 again: resumes at its last prompt token */
    run(cold, p1, n1, 24, &t1cold);
    printf("     thinking %s: turn 1 %d tokens, turn 2 %d (%d shared); turn 2 resumed after %d, turn 1 again "
           "after "
           "%d; logprobs differ from cold by %.3g / %.3g\n",
           thinking < 0 ? "default"
           : thinking   ? "on"
                        : "off",
           n1, n2, shared, w2.cached, t1again.cached, (double)worst(&w2, &c2),
           (double)worst(&t1again, &t1cold));
    CHECK_MSG(w2.cached > 0, "turn 2 did not resume");
    CHECK_EQ_INT(c2.cached, 0);
    CHECK_EQ_INT(t1again.cached, n1 - 1);
    CHECK_MSG(same(&w2, &c2), "turn 2 resumed after %d tokens differs from cold", w2.cached);
    CHECK_MSG(same(&t1again, &t1cold), "turn 1 resumed after %d tokens differs from cold", t1again.cached);
    json_decref(msgs);
    free(p1), free(p2);
    cinfer_engine_destroy(warm);
    cinfer_engine_destroy(cold);
}

TEST(prefix_chat_second_turn_is_bitwise_cold) {
    cinfer_model *m = open_default();
    REQUIRE(m);
    chat_case(m, -1);
    chat_case(m, 0);
    cinfer_model_close(m);
}

static void raw_case(cinfer_model *m, int exact, trace *warm2, trace *cold2) {
    char err[512];
    enum { N1 = 150, N2 = 190 };
    static int32_t p[N2];
    uint64_t x = 0x2545f4914f6cdd1dull;
    for (int i = 0; i < N2; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = (int32_t)(x % 8000);
    }
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.max_seqs = 2, ep.ctx_size = 512, ep.n_threads = 2;
    ep.prefix_cache_memory = 64 << 20;
    setenv("CINFER_PREFIX_EXACT", exact ? "1" : "0", 1);
    cinfer_engine *warm, *cold;
    int ok = cinfer_engine_create(m, &ep, &warm, err, sizeof err) == 0;
    ok = ok && cinfer_engine_create(m, &ep, &cold, err, sizeof err) == 0;
    unsetenv("CINFER_PREFIX_EXACT");
    REQUIRE(ok);
    trace t1;
    run(warm, p, N1, 4, &t1);
    run(warm, p, N2, 16, warm2);
    run(cold, p, N2, 16, cold2);
    cinfer_engine_destroy(warm);
    cinfer_engine_destroy(cold);
}

TEST(prefix_raw_extension_resumes_on_the_chunk_grid) {
    cinfer_model *m = open_default();
    REQUIRE(m);
    trace w, c, wl, cl;
    raw_case(m, 1, &w, &c);
    raw_case(m, 0, &wl, &cl);
    printf("     exact: resumed after %d, logprobs differ from cold by %.3g; anywhere: after %d, by %.3g\n",
           w.cached, (double)worst(&w, &c), wl.cached, (double)worst(&wl, &cl));
    CHECK_EQ_INT(w.cached, 128); /* the last multiple of 64 before token 149 */
    CHECK_EQ_INT(wl.cached, 149);
    CHECK_MSG(same(&w, &c), "a raw extension resumed on the grid differs from cold");
    CHECK_MSG(!memcmp(wl.ids, cl.ids, sizeof wl.ids) && worst(&wl, &cl) < 1e-4f, "resumed anywhere: %.3g",
              (double)worst(&wl, &cl));
    cinfer_model_close(m);
}

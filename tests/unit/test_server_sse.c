/* test_server_sse.c — response formatting: the choice accumulator, OpenAI / Anthropic response bodies and
 * error shapes, the SSE streams built from engine events (chunk order, UTF-8 held back at a split
 * character, logprobs, tool calls, usage, the Anthropic event sequence), metrics text, UTF-8 helpers. */
#include <stdlib.h>
#include <string.h>

#include "server/api.h"
#include "server/metrics.h"
#include "server/sse.h"
#include "test.h"

static cinfer_event ev_text(cinfer_event_type t, const char *s) {
    cinfer_event e;
    memset(&e, 0, sizeof e);
    e.type = t;
    e.text = s;
    e.len = strlen(s);
    return e;
}

static cinfer_event ev_done(const char *finish, int p, int c, int cached) {
    cinfer_event e;
    memset(&e, 0, sizeof e);
    e.type = CINFER_EV_DONE;
    e.finish_reason = finish;
    e.prompt_tokens = p;
    e.completion_tokens = c;
    e.cached_tokens = cached;
    return e;
}

static cinfer_event ev_tool(int idx, const char *id, const char *name, const char *args) {
    cinfer_event e;
    memset(&e, 0, sizeof e);
    e.type = CINFER_EV_TOOL_CALL;
    e.tool_index = idx;
    e.tool_id = id;
    e.tool_name = name;
    e.tool_args = args;
    e.tool_args_len = args ? strlen(args) : 0;
    return e;
}

/* Splits an SSE stream into its data payloads (parsed) and event names. */
typedef struct {
    int n;
    char names[64][32];
    json_t *data[64];
    int done; /* saw data: [DONE] */
} frames;

static void frames_parse(const char *s, frames *f) {
    memset(f, 0, sizeof *f);
    const char *p = s;
    while (*p && f->n < 64) {
        const char *end = strstr(p, "\n\n");
        if (!end) break;
        char name[32] = "";
        const char *line = p;
        while (line < end) {
            const char *nl = memchr(line, '\n', (size_t)(end - line));
            if (!nl) nl = end;
            if (!strncmp(line, "event: ", 7)) snprintf(name, sizeof name, "%.*s", (int)(nl - line - 7), line + 7);
            else if (!strncmp(line, "data: [DONE]", 12)) f->done = 1;
            else if (!strncmp(line, "data: ", 6)) {
                json_error_t je;
                f->data[f->n] = json_loadb(line + 6, (size_t)(nl - line - 6), 0, &je);
                snprintf(f->names[f->n], sizeof f->names[0], "%s", name);
                f->n++;
            }
            line = nl + 1;
        }
        p = end + 2;
    }
}

static void frames_free(frames *f) {
    for (int i = 0; i < f->n; i++) json_decref(f->data[i]);
}

/* A member by path "a.b.0.c": object keys and array indexes. */
static const json_t *jget(const json_t *o, const char *path) {
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    const json_t *cur = o;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ".", &save); tok && cur; tok = strtok_r(NULL, ".", &save))
        cur = json_is_array(cur) ? json_array_get(cur, (size_t)atoi(tok)) : json_object_get(cur, tok);
    return cur;
}

static const char *jstr(const json_t *o, const char *path) {
    const json_t *v = jget(o, path);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* 1 when the string at path equals want (0 when absent, so a missing member fails without crashing). */
static int jeq(const json_t *o, const char *path, const char *want) {
    const char *v = jstr(o, path);
    return v && !strcmp(v, want);
}

TEST(server_utf8_helpers) {
    const char *e_acute = "\xC3\xA9";
    CHECK_EQ_INT(utf8_complete_prefix("ab\xC3", 3), 2);
    CHECK_EQ_INT(utf8_complete_prefix("ab\xC3\xA9", 4), 4);
    CHECK_EQ_INT(utf8_complete_prefix("\xF0\x9F\x98", 3), 0);
    CHECK_EQ_INT(utf8_complete_prefix("a\xFF", 2), 2); /* invalid: not held */
    CHECK(utf8_valid(e_acute, 2));
    CHECK(!utf8_valid("\xC3", 1));
    CHECK(!utf8_valid("\xC0\x80", 2)); /* overlong */
    CHECK(!utf8_valid("\xED\xA0\x80", 3)); /* surrogate */
    sbuf b = {0};
    CHECK_EQ_INT(utf8_append_lossy(&b, "a\xFF" "b\xC3", 4), 2);
    CHECK(!strcmp(b.data, "a\xEF\xBF\xBD" "b\xEF\xBF\xBD"));
    sb_free(&b);
    json_t *j = srv_json_text("x\x80y", 3);
    REQUIRE(j);
    CHECK(!strcmp(json_string_value(j), "x\xEF\xBF\xBDy"));
    json_decref(j);
}

TEST(server_chat_response_from_events) {
    srv_choice c;
    srv_choice_init(&c, 0, 1);
    cinfer_event ev = ev_text(CINFER_EV_REASONING, "think");
    srv_choice_add(&c, SRV_API_CHAT, &ev);
    ev = ev_text(CINFER_EV_CONTENT, "Hel");
    srv_choice_add(&c, SRV_API_CHAT, &ev);
    ev = ev_text(CINFER_EV_CONTENT, "lo");
    srv_choice_add(&c, SRV_API_CHAT, &ev);
    cinfer_top_logprob top[2] = {{5, -0.1f, "lo", 2}, {6, -2.5f, "\xC3", 1}};
    cinfer_event lp;
    memset(&lp, 0, sizeof lp);
    lp.type = CINFER_EV_LOGPROB;
    lp.token = 5;
    lp.token_text = "lo";
    lp.token_len = 2;
    lp.logprob = -0.1f;
    lp.top = top;
    lp.n_top = 2;
    srv_choice_add(&c, SRV_API_CHAT, &lp);
    ev = ev_tool(0, "call_1", "get", "{\"a\":");
    srv_choice_add(&c, SRV_API_CHAT, &ev);
    ev = ev_tool(0, NULL, NULL, "1}");
    srv_choice_add(&c, SRV_API_CHAT, &ev);
    ev = ev_tool(5, NULL, NULL, "junk"); /* out-of-order index: dropped */
    srv_choice_add(&c, SRV_API_CHAT, &ev);
    ev = ev_done("tool_calls", 11, 4, 3);
    srv_choice_add(&c, SRV_API_CHAT, &ev);
    CHECK(c.done);
    CHECK_EQ_INT(c.n_calls, 1);

    srv_resp_meta m = {"chatcmpl-1", "mod", 1700000000};
    char *body = oai_chat_response(&m, &c, 1);
    json_error_t je;
    json_t *j = json_loads(body, 0, &je);
    REQUIRE(j);
    CHECK(jeq(j, "object", "chat.completion"));
    CHECK(jeq(j, "choices.0.message.content", "Hello"));
    CHECK(jeq(j, "choices.0.message.reasoning_content", "think"));
    CHECK(jeq(j, "choices.0.message.tool_calls.0.function.arguments", "{\"a\":1}"));
    CHECK(jeq(j, "choices.0.message.tool_calls.0.id", "call_1"));
    CHECK(jeq(j, "choices.0.finish_reason", "tool_calls"));
    CHECK(jeq(j, "choices.0.logprobs.content.0.token", "lo"));
    /* the split byte is made valid in "token" but exact in "bytes" */
    CHECK(jeq(j, "choices.0.logprobs.content.0.top_logprobs.1.token", "\xEF\xBF\xBD"));
    const json_t *bytes = jget(j, "choices.0.logprobs.content.0.top_logprobs.1.bytes");
    CHECK(json_array_size(bytes) == 1 && json_integer_value(json_array_get(bytes, 0)) == 0xC3);
    json_t *u = json_object_get(j, "usage");
    CHECK_EQ_INT(json_integer_value(json_object_get(u, "prompt_tokens")), 11);
    CHECK_EQ_INT(json_integer_value(json_object_get(u, "completion_tokens")), 4);
    CHECK_EQ_INT(json_integer_value(json_object_get(u, "total_tokens")), 15);
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens")), 3);
    json_decref(j);
    free(body);

    /* Anthropic: thinking, text, tool_use blocks in that order; cache reads apart from input */
    srv_resp_meta am = {"msg_1", "mod", 0};
    body = ant_message_response(&am, &c);
    j = json_loads(body, 0, &je);
    REQUIRE(j);
    CHECK(jeq(j, "content.0.type", "thinking"));
    CHECK(jeq(j, "content.1.text", "Hello"));
    CHECK(jeq(j, "content.2.type", "tool_use"));
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(json_array_get(json_object_get(j, "content"), 2), "input"), "a")), 1);
    CHECK(jeq(j, "stop_reason", "tool_use"));
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(j, "usage"), "input_tokens")), 8);
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(j, "usage"), "cache_read_input_tokens")), 3);
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(j, "usage"), "output_tokens")), 4);
    json_decref(j);
    free(body);
    srv_choice_free(&c);
}

TEST(server_completion_response_n_choices) {
    srv_choice ch[4];
    for (int i = 0; i < 4; i++) {
        srv_choice_init(&ch[i], i, i == 0);
        cinfer_event ev = ev_text(CINFER_EV_CONTENT, i % 2 ? "odd" : "even");
        srv_choice_add(&ch[i], SRV_API_COMPLETION, &ev);
        ev = ev_done(i == 3 ? "length" : "stop", 10 + i / 2, 2, 0);
        srv_choice_add(&ch[i], SRV_API_COMPLETION, &ev);
    }
    cinfer_event lp;
    memset(&lp, 0, sizeof lp);
    lp.type = CINFER_EV_LOGPROB;
    lp.token_text = "ev";
    lp.token_len = 2;
    lp.logprob = -1;
    srv_choice_add(&ch[0], SRV_API_COMPLETION, &lp);
    lp.token_text = "en";
    srv_choice_add(&ch[0], SRV_API_COMPLETION, &lp);
    srv_resp_meta m = {"cmpl-1", "mod", 1};
    /* two prompts x n=2: prompt tokens 10 + 11 counted once per prompt */
    char *body = oai_completion_response(&m, ch, 4, 2);
    json_error_t je;
    json_t *j = json_loads(body, 0, &je);
    REQUIRE(j);
    CHECK(jeq(j, "object", "text_completion"));
    CHECK(jeq(j, "choices.1.text", "odd"));
    CHECK(jeq(j, "choices.3.finish_reason", "length"));
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens")), 21);
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), 8);
    json_t *lps = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    CHECK(jeq(lps, "tokens.1", "en"));
    CHECK_EQ_INT(json_integer_value(json_array_get(json_object_get(lps, "text_offset"), 1)), 2);
    CHECK(json_is_null(json_object_get(json_array_get(json_object_get(j, "choices"), 1), "logprobs")));
    json_decref(j);
    free(body);
    for (int i = 0; i < 4; i++) srv_choice_free(&ch[i]);
}

TEST(server_error_bodies) {
    srv_error e;
    srv_fail(&e, 400, "temperature", "'temperature' must be a number");
    char *s = oai_error_body(&e);
    json_error_t je;
    json_t *j = json_loads(s, 0, &je);
    REQUIRE(j);
    CHECK(jeq(j, "error.message", "'temperature' must be a number"));
    CHECK(jeq(j, "error.type", "invalid_request_error"));
    CHECK(jeq(j, "error.param", "temperature"));
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(j, "error"), "code")), 400);
    json_decref(j);
    free(s);
    srv_fail(&e, 429, NULL, "queue full");
    s = ant_error_body(&e);
    j = json_loads(s, 0, &je);
    REQUIRE(j);
    CHECK(jeq(j, "type", "error"));
    CHECK(jeq(j, "error.type", "rate_limit_error"));
    CHECK(jeq(j, "error.message", "queue full"));
    json_decref(j);
    free(s);
    srv_fail(&e, 401, NULL, "bad key");
    s = oai_error_body(&e);
    CHECK_STR_CONTAINS(s, "\"param\":null");
    CHECK_STR_CONTAINS(s, "authentication_error");
    free(s);
}

TEST(server_sse_openai_chat_stream) {
    srv_resp_meta m = {"chatcmpl-9", "mod", 5};
    oai_stream s;
    oai_stream_init(&s, SRV_API_CHAT, &m, 2, 1);
    sbuf out = {0};
    cinfer_event ev = ev_text(CINFER_EV_CONTENT, "caf\xC3"); /* é split across events */
    oai_stream_event(&s, 0, &ev, &out);
    cinfer_event lp;
    memset(&lp, 0, sizeof lp);
    lp.type = CINFER_EV_LOGPROB;
    lp.token_text = "\xA9!";
    lp.token_len = 2;
    lp.logprob = -0.5f;
    oai_stream_event(&s, 0, &lp, &out);
    ev = ev_text(CINFER_EV_CONTENT, "\xA9!");
    oai_stream_event(&s, 0, &ev, &out);
    ev = ev_text(CINFER_EV_REASONING, "r");
    oai_stream_event(&s, 1, &ev, &out);
    ev = ev_tool(0, "call_a", "fn", "{\"k\":");
    oai_stream_event(&s, 1, &ev, &out);
    ev = ev_tool(0, NULL, NULL, "2}");
    oai_stream_event(&s, 1, &ev, &out);
    ev = ev_done("stop", 7, 2, 0);
    oai_stream_event(&s, 0, &ev, &out);
    ev = ev_done("tool_calls", 7, 3, 0);
    oai_stream_event(&s, 1, &ev, &out);
    srv_choice ch[2];
    for (int i = 0; i < 2; i++) {
        srv_choice_init(&ch[i], i, 0);
        ch[i].prompt_tokens = 7;
        ch[i].completion_tokens = 2 + i;
    }
    oai_stream_usage(&s, ch, 2, 2, &out);
    sse_done(&out);

    frames f;
    frames_parse(out.data, &f);
    CHECK(f.done);
    REQUIRE(f.n == 8);
    for (int i = 0; i < f.n; i++) CHECK_MSG(f.data[i] != NULL, "frame %d is not JSON", i);
    /* 0: "caf" with the role; 1: "é!" with its logprob */
    CHECK(jeq(f.data[0], "object", "chat.completion.chunk"));
    CHECK(jeq(f.data[0], "choices.0.delta.role", "assistant"));
    CHECK(jeq(f.data[0], "choices.0.delta.content", "caf"));
    CHECK(jeq(f.data[1], "choices.0.delta.content", "\xC3\xA9!"));
    CHECK(jstr(f.data[1], "choices.0.delta.role") == NULL);
    CHECK(jeq(f.data[1], "choices.0.logprobs.content.0.token", "\xEF\xBF\xBD!"));
    CHECK(jeq(f.data[2], "choices.0.delta.reasoning_content", "r"));
    CHECK_EQ_INT(json_integer_value(json_object_get(json_array_get(json_object_get(f.data[2], "choices"), 0), "index")), 1);
    CHECK(jeq(f.data[3], "choices.0.delta.tool_calls.0.id", "call_a"));
    CHECK(jeq(f.data[3], "choices.0.delta.tool_calls.0.function.name", "fn"));
    CHECK(jstr(f.data[4], "choices.0.delta.tool_calls.0.id") == NULL);
    CHECK(jeq(f.data[4], "choices.0.delta.tool_calls.0.function.arguments", "2}"));
    CHECK(jeq(f.data[5], "choices.0.finish_reason", "stop"));
    CHECK(jeq(f.data[6], "choices.0.finish_reason", "tool_calls"));
    CHECK_EQ_INT(json_array_size(json_object_get(f.data[7], "choices")), 0);
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(f.data[7], "usage"), "prompt_tokens")), 7);
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(f.data[7], "usage"), "completion_tokens")), 5);
    frames_free(&f);
    sb_free(&out);
    oai_stream_free(&s);
    for (int i = 0; i < 2; i++) srv_choice_free(&ch[i]);
}

TEST(server_sse_openai_completion_stream_and_error) {
    srv_resp_meta m = {"cmpl-2", "mod", 5};
    oai_stream s;
    oai_stream_init(&s, SRV_API_COMPLETION, &m, 1, 0);
    sbuf out = {0};
    cinfer_event ev = ev_text(CINFER_EV_CONTENT, "once");
    oai_stream_event(&s, 0, &ev, &out);
    ev = ev_text(CINFER_EV_ERROR, "engine fell over");
    oai_stream_event(&s, 0, &ev, &out);
    frames f;
    frames_parse(out.data, &f);
    REQUIRE(f.n == 2);
    CHECK(jeq(f.data[0], "object", "text_completion"));
    CHECK(jeq(f.data[0], "choices.0.text", "once"));
    CHECK(jeq(f.data[1], "error.message", "engine fell over"));
    frames_free(&f);
    sb_free(&out);
    oai_stream_free(&s);
}

TEST(server_sse_anthropic_event_sequence) {
    srv_resp_meta m = {"msg_7", "mod", 0};
    ant_stream s;
    ant_stream_init(&s, &m);
    sbuf out = {0};
    ant_stream_start(&s, 12, 2, &out);
    cinfer_event ev = ev_text(CINFER_EV_REASONING, "plan");
    ant_stream_event(&s, &ev, &out);
    ev = ev_text(CINFER_EV_CONTENT, "ok ");
    ant_stream_event(&s, &ev, &out);
    ev = ev_text(CINFER_EV_CONTENT, "go");
    ant_stream_event(&s, &ev, &out);
    ev = ev_tool(0, "toolu_1", "calc", "{\"e\":");
    ant_stream_event(&s, &ev, &out);
    ev = ev_tool(0, NULL, NULL, "1}");
    ant_stream_event(&s, &ev, &out);
    ev = ev_done("tool_calls", 12, 9, 2);
    ant_stream_event(&s, &ev, &out);
    frames f;
    frames_parse(out.data, &f);
    static const char *const want[] = {
        "message_start", "ping",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop", /* thinking + signature */
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop", /* text */
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop", /* tool_use */
        "message_delta", "message_stop",
    };
    REQUIRE(f.n == (int)(sizeof want / sizeof *want));
    for (int i = 0; i < f.n; i++) {
        CHECK_MSG(!strcmp(f.names[i], want[i]), "event %d is %s, expected %s", i, f.names[i], want[i]);
        REQUIRE(f.data[i]);
        CHECK_MSG(jeq(f.data[i], "type", want[i]), "event %d data type %s", i, jstr(f.data[i], "type"));
    }
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(json_object_get(f.data[0], "message"), "usage"), "input_tokens")), 10);
    CHECK(jeq(f.data[2], "content_block.type", "thinking"));
    CHECK(jeq(f.data[3], "delta.thinking", "plan"));
    CHECK(jeq(f.data[4], "delta.type", "signature_delta"));
    CHECK(jeq(f.data[6], "content_block.type", "text"));
    CHECK_EQ_INT(json_integer_value(json_object_get(f.data[6], "index")), 1);
    CHECK(jeq(f.data[8], "delta.text", "go"));
    CHECK(jeq(f.data[10], "content_block.name", "calc"));
    CHECK(jeq(f.data[11], "delta.partial_json", "{\"e\":"));
    CHECK_EQ_INT(json_integer_value(json_object_get(f.data[13], "index")), 2);
    CHECK(jeq(f.data[14], "delta.stop_reason", "tool_use"));
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(f.data[14], "usage"), "output_tokens")), 9);
    frames_free(&f);
    sb_free(&out);
    ant_stream_free(&s);

    /* empty output still has one (text) block; a stop string gives stop_sequence */
    ant_stream_init(&s, &m);
    ant_stream_start(&s, 3, 0, &out);
    ev = ev_done("stop", 3, 1, 0);
    ev.stop_string = "###";
    ant_stream_event(&s, &ev, &out);
    frames_parse(out.data, &f);
    REQUIRE(f.n == 6);
    CHECK(!strcmp(f.names[2], "content_block_start"));
    CHECK(!strcmp(f.names[3], "content_block_stop"));
    CHECK(jeq(f.data[4], "delta.stop_reason", "stop_sequence"));
    CHECK(jeq(f.data[4], "delta.stop_sequence", "###"));
    frames_free(&f);
    sb_free(&out);
    ant_stream_free(&s);
}

TEST(server_metrics_render) {
    metrics m;
    metrics_init(&m);
    metrics_request(&m, 1, 200);
    metrics_request(&m, 1, 200);
    metrics_request(&m, 1, 429);
    metrics_tokens(&m, 10, 5);
    metrics_ttft(&m, 0.02);
    metrics_ttft(&m, 0.3);
    metrics_ttft(&m, 100);
    metrics_itl(&m, 0.004);
    cinfer_engine_stats st;
    memset(&st, 0, sizeof st);
    st.running = 3;
    st.waiting = 2;
    st.kv_blocks_used = 5;
    st.kv_blocks_total = 20;
    sbuf out = {0};
    metrics_render(&m, &st, 0, &out);
    CHECK_STR_CONTAINS(out.data, "cinfer_http_requests_total{route=\"chat_completions\",code=\"2xx\"} 2\n");
    CHECK_STR_CONTAINS(out.data, "cinfer_http_requests_total{route=\"chat_completions\",code=\"4xx\"} 1\n");
    CHECK_STR_CONTAINS(out.data, "cinfer_prompt_tokens_total 10\n");
    CHECK_STR_CONTAINS(out.data, "cinfer_generation_tokens_total 5\n");
    /* cumulative buckets: 0.02 <= 0.025, 0.3 <= 0.5, 100 only in +Inf */
    CHECK_STR_CONTAINS(out.data, "cinfer_time_to_first_token_seconds_bucket{le=\"0.01\"} 0\n");
    CHECK_STR_CONTAINS(out.data, "cinfer_time_to_first_token_seconds_bucket{le=\"0.025\"} 1\n");
    CHECK_STR_CONTAINS(out.data, "cinfer_time_to_first_token_seconds_bucket{le=\"0.5\"} 2\n");
    CHECK_STR_CONTAINS(out.data, "cinfer_time_to_first_token_seconds_bucket{le=\"60\"} 2\n");
    CHECK_STR_CONTAINS(out.data, "cinfer_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3\n");
    CHECK_STR_CONTAINS(out.data, "cinfer_time_to_first_token_seconds_count 3\n");
    CHECK_STR_CONTAINS(out.data, "cinfer_inter_token_latency_seconds_bucket{le=\"0.005\"} 1\n");
    CHECK_STR_CONTAINS(out.data, "cinfer_requests_running 3\n");
    CHECK_STR_CONTAINS(out.data, "cinfer_requests_waiting 2\n");
    CHECK_STR_CONTAINS(out.data, "cinfer_kv_blocks_used 5\n");
    CHECK_STR_CONTAINS(out.data, "cinfer_kv_cache_usage_ratio 0.250000\n");
    CHECK_STR_CONTAINS(out.data, "# TYPE cinfer_time_to_first_token_seconds histogram\n");
    sb_clear(&out);
    metrics_render(&m, NULL, 1, &out);
    CHECK_STR_CONTAINS(out.data, "cinfer_model_loading 1\n");
    CHECK(!strstr(out.data, "cinfer_requests_running"));
    sb_free(&out);
    metrics_destroy(&m);
}

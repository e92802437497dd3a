/* fuzz_http_body.c — libFuzzer target for the HTTP request-body parsers: any bytes must either be
 * refused with a 4xx naming a reason, or give a request that satisfies what the HTTP layer relies on
 * (bounded counts, a template context that is JSON). The same bytes are then pushed through the response
 * and SSE formatters as model output, which must always produce valid JSON frames. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/api.h"
#include "server/sse.h"
#include "util/err.h"

static void check_req(const srv_gen_req *r) {
    CI_ASSERT(r->n >= 1 && r->n <= SRV_MAX_N);
    CI_ASSERT(r->n_prompts >= 1 && r->n_prompts <= SRV_MAX_PROMPTS);
    CI_ASSERT(r->n_stop >= 0 && r->n_stop <= SRV_MAX_STOP);
    for (int i = 0; i < r->n_stop; i++) CI_ASSERT(r->stop[i] && strlen(r->stop[i]) > 0 && strlen(r->stop[i]) <= SRV_MAX_STOP_LEN);
    CI_ASSERT(r->sampling.n_logit_bias >= 0 && r->sampling.n_logit_bias <= SRV_MAX_LOGIT_BIAS);
    CI_ASSERT(r->sampling.n_logprobs >= -1 && r->sampling.n_logprobs <= SRV_MAX_TOP_LOGPROBS);
    CI_ASSERT(r->sampling.temperature >= 0 && r->sampling.top_p > 0 && r->sampling.top_p <= 1);
    CI_ASSERT(r->max_tokens >= 0);
    if (r->api != SRV_API_COMPLETION) {
        json_error_t je;
        json_t *ctx = json_loads(r->template_ctx, 0, &je);
        CI_ASSERT(json_is_object(ctx) && json_is_array(json_object_get(ctx, "messages")));
        json_decref(ctx);
    } else {
        for (int i = 0; i < r->n_prompts; i++) {
            CI_ASSERT((r->prompt_text[i] != NULL) != (r->prompt_ids[i] != NULL));
            for (int k = 0; r->prompt_ids[i] && k < r->n_prompt_ids[i]; k++) CI_ASSERT(r->prompt_ids[i][k] >= 0);
        }
    }
    if (r->has_tools) CI_ASSERT(r->tools_json != NULL);
}

static void check_frames(const char *s) {
    /* every line is "event: ...", a "data: " line holding JSON or [DONE], a ": comment", or empty
     * (frame ends); JSON strings never hold a raw newline, so lines are frames' own */
    for (const char *p = s; *p;) {
        const char *nl = strchr(p, '\n');
        CI_ASSERT(nl);
        size_t n = (size_t)(nl - p);
        if (n >= 6 && !strncmp(p, "data: ", 6)) {
            if (strncmp(p + 6, "[DONE]", 6)) {
                json_error_t je;
                /* model text may hold NUL, which JSON carries as \u0000 */
                json_t *j = json_loadb(p + 6, n - 6, JSON_ALLOW_NUL, &je);
                if (!j) fprintf(stderr, "bad frame: %.*s (%s)\n", (int)n, p, je.text);
                CI_ASSERT(j);
                json_decref(j);
            }
        } else {
            CI_ASSERT(n == 0 || !strncmp(p, "event: ", 7) || p[0] == ':');
        }
        p = nl + 1;
    }
}

static void format_as_output(const char *data, size_t size) {
    cinfer_event ev;
    memset(&ev, 0, sizeof ev);
    srv_resp_meta m = {"id-1", "model", 1};
    oai_stream os;
    ant_stream as;
    oai_stream_init(&os, SRV_API_CHAT, &m, 1, 1);
    ant_stream_init(&as, &m);
    srv_choice c;
    srv_choice_init(&c, 0, 1);
    sbuf out = {0};
    ant_stream_start(&as, 3, 0, &out);
    /* Cut the input into events at every 0x01 byte; the byte after it picks the kind. */
    size_t start = 0;
    for (size_t i = 0; i <= size; i++) {
        if (i < size && data[i] != 1) continue;
        const char *t = data + start;
        size_t n = i - start;
        int kind = n ? (unsigned char)t[0] % 4 : 0;
        memset(&ev, 0, sizeof ev);
        if (kind == 0) ev.type = CINFER_EV_CONTENT;
        else if (kind == 1) ev.type = CINFER_EV_REASONING;
        else if (kind == 2) {
            ev.type = CINFER_EV_TOOL_CALL;
            ev.tool_index = n > 1 ? (unsigned char)t[1] % 3 : 0;
            ev.tool_id = "call_x";
            ev.tool_name = (n > 2 && t[2] & 1) ? "fn" : NULL;
            ev.tool_args = t;
            ev.tool_args_len = n;
        } else {
            ev.type = CINFER_EV_LOGPROB;
            ev.token_text = t;
            ev.token_len = n;
            ev.logprob = -1;
        }
        ev.text = t;
        ev.len = n;
        srv_choice_add(&c, SRV_API_CHAT, &ev);
        oai_stream_event(&os, 0, &ev, &out);
        ant_stream_event(&as, &ev, &out);
        start = i + 1;
    }
    memset(&ev, 0, sizeof ev);
    ev.type = CINFER_EV_DONE;
    ev.finish_reason = "stop";
    srv_choice_add(&c, SRV_API_CHAT, &ev);
    oai_stream_event(&os, 0, &ev, &out);
    ant_stream_event(&as, &ev, &out);
    check_frames(out.data);
    char *b1 = oai_chat_response(&m, &c, 1), *b2 = ant_message_response(&m, &c), *b3 = oai_completion_response(&m, &c, 1, 1);
    json_error_t je;
    char *bs[3] = {b1, b2, b3};
    for (int k = 0; k < 3; k++) {
        json_t *j = json_loads(bs[k], JSON_ALLOW_NUL, &je);
        CI_ASSERT(j);
        json_decref(j);
        free(bs[k]);
    }
    sb_free(&out);
    srv_choice_free(&c);
    oai_stream_free(&os);
    ant_stream_free(&as);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    srv_error e;
    json_t *body;
    if (srv_parse_body((const char *)data, size, SRV_MAX_JSON_DEPTH, &body, &e) == 0) {
        srv_defaults d;
        srv_defaults_init(&d);
        int (*parsers[4])(const json_t *, const srv_defaults *, srv_gen_req *, srv_error *) = {
            oai_parse_chat, oai_parse_completion, ant_parse_messages, ant_parse_count_tokens};
        for (int p = 0; p < 4; p++) {
            srv_gen_req r;
            e.status = 0;
            if (parsers[p](body, &d, &r, &e) == 0) {
                check_req(&r);
                srv_gen_req_free(&r);
            } else {
                CI_ASSERT(e.status >= 400 && e.status < 500 && e.message[0]);
                char *s = oai_error_body(&e);
                CI_ASSERT(s);
                free(s);
            }
        }
        char *ctx = NULL;
        if (oai_parse_apply_template(body, &d, &ctx, &e) == 0) CI_ASSERT(ctx);
        free(ctx);
        json_decref(body);
    } else {
        CI_ASSERT(e.status == 400 && e.message[0]);
    }
    format_as_output((const char *)data, size);
    return 0;
}

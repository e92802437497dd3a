/* output.c — the output side shared by the APIs: a choice accumulator fed with engine events, JSON text
 * from model bytes (which need not be valid UTF-8), logprob entries, usage and error bodies. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/api.h"
#include "util/alloc.h"

json_t *srv_json_text(const char *s, size_t n) {
    if (!s) return json_string("");
    if (utf8_valid(s, n)) return json_stringn(s, n);
    sbuf b = {0};
    utf8_append_lossy(&b, s, n);
    json_t *j = json_stringn(b.data, b.len);
    sb_free(&b);
    return j;
}

static json_t *bytes_array(const char *s, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer((unsigned char)s[i]));
    return a;
}

/* JSON has no -inf (or NaN): a token of probability 0 under f32 is reported as -9999.0, as vLLM does. */
static json_t *logprob_json(float lp) { return json_real(isfinite(lp) ? (double)lp : -9999.0); }

json_t *oai_logprob_entry(const cinfer_event *ev) {
    json_t *o = json_object();
    json_object_set_new(o, "token", srv_json_text(ev->token_text, ev->token_len));
    json_object_set_new(o, "logprob", logprob_json(ev->logprob));
    json_object_set_new(o, "bytes", bytes_array(ev->token_text ? ev->token_text : "", ev->token_text ? ev->token_len : 0));
    json_t *top = json_array();
    for (int i = 0; i < ev->n_top; i++) {
        const cinfer_top_logprob *t = &ev->top[i];
        json_t *e = json_object();
        json_object_set_new(e, "token", srv_json_text(t->text, t->len));
        json_object_set_new(e, "logprob", logprob_json(t->logprob));
        json_object_set_new(e, "bytes", bytes_array(t->text ? t->text : "", t->text ? t->len : 0));
        json_array_append_new(top, e);
    }
    json_object_set_new(o, "top_logprobs", top);
    return o;
}

void srv_choice_init(srv_choice *c, int index, int want_logprobs) {
    memset(c, 0, sizeof *c);
    c->index = index;
    c->logprobs = want_logprobs ? json_array() : NULL;
}

void srv_choice_free(srv_choice *c) {
    sb_free(&c->content);
    sb_free(&c->reasoning);
    for (int i = 0; i < c->n_calls; i++) {
        free(c->calls[i].id);
        free(c->calls[i].name);
        sb_free(&c->calls[i].args);
    }
    free(c->calls);
    json_decref(c->logprobs);
    free(c->stop_string);
    free(c->error);
    memset(c, 0, sizeof *c);
}

void srv_choice_add(srv_choice *c, srv_api api, const cinfer_event *ev) {
    (void)api;
    switch (ev->type) {
    case CINFER_EV_CONTENT: sb_append(&c->content, ev->text ? ev->text : "", ev->text ? ev->len : 0); break;
    case CINFER_EV_REASONING: sb_append(&c->reasoning, ev->text ? ev->text : "", ev->text ? ev->len : 0); break;
    case CINFER_EV_TOOL_CALL: {
        /* Calls arrive in index order; a bad index from the engine is a bug there, but a response
         * must not index out of bounds: such deltas are dropped. */
        if (ev->tool_index < 0 || ev->tool_index > c->n_calls || ev->tool_index >= 1024) break;
        if (ev->tool_index == c->n_calls) {
            c->calls = xrealloc(c->calls, (size_t)(c->n_calls + 1) * sizeof *c->calls);
            memset(&c->calls[c->n_calls], 0, sizeof *c->calls);
            c->n_calls++;
        }
        srv_tool_call *t = &c->calls[ev->tool_index];
        if (ev->tool_id && !t->id) t->id = xstrdup(ev->tool_id);
        if (ev->tool_name && !t->name) t->name = xstrdup(ev->tool_name);
        if (ev->tool_args) sb_append(&t->args, ev->tool_args, ev->tool_args_len);
        break;
    }
    case CINFER_EV_LOGPROB:
        if (c->logprobs) json_array_append_new(c->logprobs, oai_logprob_entry(ev));
        break;
    case CINFER_EV_DONE:
        snprintf(c->finish_reason, sizeof c->finish_reason, "%s", ev->finish_reason ? ev->finish_reason : "stop");
        if (ev->stop_string) c->stop_string = xstrdup(ev->stop_string);
        c->prompt_tokens = ev->prompt_tokens;
        c->completion_tokens = ev->completion_tokens;
        c->cached_tokens = ev->cached_tokens;
        c->done = 1;
        break;
    case CINFER_EV_ERROR:
        free(c->error);
        c->error = xstrndup(ev->text ? ev->text : "engine error", ev->text ? ev->len : 12);
        snprintf(c->finish_reason, sizeof c->finish_reason, "error");
        c->done = 1;
        break;
    }
}

/* ---- errors ---- */

static const char *oai_error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 503: return "unavailable_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

static const char *ant_error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

char *oai_error_body(const srv_error *e) {
    json_t *err = json_object();
    json_object_set_new(err, "message", srv_json_text(e->message, strlen(e->message)));
    json_object_set_new(err, "type", json_string(oai_error_type(e->status)));
    json_object_set_new(err, "param", e->param[0] ? srv_json_text(e->param, strlen(e->param)) : json_null());
    json_object_set_new(err, "code", e->code[0] ? json_string(e->code) : json_integer(e->status));
    json_t *o = json_object();
    json_object_set_new(o, "error", err);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

char *ant_error_body(const srv_error *e) {
    json_t *err = json_object();
    json_object_set_new(err, "type", json_string(ant_error_type(e->status)));
    json_object_set_new(err, "message", srv_json_text(e->message, strlen(e->message)));
    json_t *o = json_object();
    json_object_set_new(o, "type", json_string("error"));
    json_object_set_new(o, "error", err);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

json_t *oai_usage(const srv_choice *ch, int n_choices, int n_per_prompt) {
    long long prompt = 0, completion = 0, cached = 0;
    for (int i = 0; i < n_choices; i++) {
        if (n_per_prompt <= 1 || i % n_per_prompt == 0) {
            prompt += ch[i].prompt_tokens;
            cached += ch[i].cached_tokens;
        }
        completion += ch[i].completion_tokens;
    }
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer(prompt));
    json_object_set_new(u, "completion_tokens", json_integer(completion));
    json_object_set_new(u, "total_tokens", json_integer(prompt + completion));
    json_t *d = json_object();
    json_object_set_new(d, "cached_tokens", json_integer(cached));
    json_object_set_new(u, "prompt_tokens_details", d);
    return u;
}

const char *ant_stop_reason(const char *finish_reason, const char *stop_string) {
    if (!finish_reason) return "end_turn";
    if (!strcmp(finish_reason, "length")) return "max_tokens";
    if (!strcmp(finish_reason, "tool_calls")) return "tool_use";
    if (stop_string) return "stop_sequence";
    return "end_turn";
}

/* sse.c — see sse.h. Text deltas are held back at a split UTF-8 character (the engine's token bytes need
 * not end on a character boundary) so every chunk is valid JSON; logprob entries ride on the next chunk
 * of their choice so a token's text and its logprob arrive together or in order. */
#include <stdlib.h>
#include <string.h>

#include "server/sse.h"
#include "util/alloc.h"

void sse_frame(sbuf *out, const char *name, json_t *json) {
    if (name) {
        sb_puts(out, "event: ");
        sb_puts(out, name);
        sb_puts(out, "\n");
    }
    char *s = json_dumps(json, JSON_COMPACT);
    sb_puts(out, "data: ");
    sb_puts(out, s ? s : "{}");
    sb_puts(out, "\n\n");
    free(s);
    json_decref(json);
}

void sse_done(sbuf *out) { sb_puts(out, "data: [DONE]\n\n"); }

void sse_keepalive(sbuf *out) { sb_puts(out, ": keep-alive\n\n"); }

/* Moves the complete-character prefix of carry+text into a JSON string; keeps the tail in carry. With
 * flush, everything goes (an incomplete tail becomes U+FFFD). NULL when there is nothing to send. */
static json_t *take_text(sbuf *carry, const char *text, size_t len, int flush) {
    if (text && len) sb_append(carry, text, len);
    if (!carry->len) return NULL;
    size_t n = flush ? carry->len : utf8_complete_prefix(carry->data, carry->len);
    if (!n) return NULL;
    json_t *j = srv_json_text(carry->data, n);
    memmove(carry->data, carry->data + n, carry->len - n);
    carry->len -= n;
    carry->data[carry->len] = 0;
    return j;
}

/* ---- OpenAI ---- */

void oai_stream_init(oai_stream *s, srv_api api, const srv_resp_meta *m, int n_choices, int want_logprobs) {
    memset(s, 0, sizeof *s);
    s->api = api;
    s->id = xstrdup(m->id);
    s->model = xstrdup(m->model);
    s->created = m->created;
    s->n_choices = n_choices;
    s->c = xcalloc((size_t)n_choices, sizeof *s->c);
    for (int i = 0; i < n_choices; i++)
        if (want_logprobs) s->c[i].pending_logprobs = json_array();
}

void oai_stream_free(oai_stream *s) {
    for (int i = 0; i < s->n_choices; i++) {
        sb_free(&s->c[i].carry_content);
        sb_free(&s->c[i].carry_reasoning);
        json_decref(s->c[i].pending_logprobs);
    }
    free(s->c);
    free(s->id);
    free(s->model);
    memset(s, 0, sizeof *s);
}

static json_t *chunk_base(oai_stream *s) {
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(s->id));
    json_object_set_new(o, "object", json_string(s->api == SRV_API_CHAT ? "chat.completion.chunk" : "text_completion"));
    json_object_set_new(o, "created", json_integer(s->created));
    json_object_set_new(o, "model", srv_json_text(s->model, strlen(s->model)));
    json_object_set_new(o, "system_fingerprint", json_string("cinfer-" CINFER_VERSION));
    return o;
}

/* The logprobs of choice i that have not been sent, in the API's shape, or null. */
static json_t *take_logprobs(oai_stream *s, int i) {
    oai_stream_choice *c = &s->c[i];
    if (!c->pending_logprobs || !json_array_size(c->pending_logprobs)) return json_null();
    json_t *lp;
    if (s->api == SRV_API_CHAT) {
        lp = json_object();
        json_object_set(lp, "content", c->pending_logprobs);
    } else {
        lp = oai_completion_logprobs(c->pending_logprobs, &c->text_offset);
    }
    json_decref(c->pending_logprobs);
    c->pending_logprobs = json_array();
    return lp;
}

/* One chunk for choice i. Chat: delta gets role on the choice's first chunk; delta is consumed.
 * Completions: the text is delta's "content" (or ""). */
static void emit(oai_stream *s, int i, json_t *delta, const char *finish, sbuf *out) {
    oai_stream_choice *c = &s->c[i];
    json_t *o = chunk_base(s);
    json_t *co = json_object();
    json_object_set_new(co, "index", json_integer(i));
    if (s->api == SRV_API_CHAT) {
        if (!c->role_sent) {
            json_object_set_new(delta, "role", json_string("assistant"));
            c->role_sent = 1;
        }
        json_object_set_new(co, "delta", delta);
    } else {
        json_t *text = json_object_get(delta, "content");
        json_object_set_new(co, "text", text ? json_incref(text) : json_string(""));
        json_decref(delta);
    }
    json_object_set_new(co, "logprobs", take_logprobs(s, i));
    json_object_set_new(co, "finish_reason", finish ? json_string(finish) : json_null());
    json_t *choices = json_array();
    json_array_append_new(choices, co);
    json_object_set_new(o, "choices", choices);
    sse_frame(out, NULL, o);
}

static void flush_text(oai_stream *s, int i, int flush_all, sbuf *out) {
    oai_stream_choice *c = &s->c[i];
    json_t *r = take_text(&c->carry_reasoning, NULL, 0, flush_all);
    if (r) {
        json_t *d = json_object();
        json_object_set_new(d, "reasoning_content", r);
        emit(s, i, d, NULL, out);
    }
    json_t *t = take_text(&c->carry_content, NULL, 0, flush_all);
    if (t) {
        json_t *d = json_object();
        json_object_set_new(d, "content", t);
        emit(s, i, d, NULL, out);
    }
}

void oai_stream_event(oai_stream *s, int i, const cinfer_event *ev, sbuf *out) {
    if (i < 0 || i >= s->n_choices) return;
    oai_stream_choice *c = &s->c[i];
    switch (ev->type) {
    case CINFER_EV_CONTENT:
    case CINFER_EV_REASONING: {
        int reasoning = ev->type == CINFER_EV_REASONING;
        /* Completions have no reasoning field: its text is part of the completion. */
        if (s->api != SRV_API_CHAT) reasoning = 0;
        /* Switching kind sends what the other kind held back first, so order is kept. */
        json_t *prev = take_text(reasoning ? &c->carry_content : &c->carry_reasoning, NULL, 0, 1);
        if (prev) {
            json_t *d = json_object();
            json_object_set_new(d, reasoning ? "content" : "reasoning_content", prev);
            emit(s, i, d, NULL, out);
        }
        json_t *t = take_text(reasoning ? &c->carry_reasoning : &c->carry_content, ev->text, ev->text ? ev->len : 0, 0);
        if (t) {
            json_t *d = json_object();
            json_object_set_new(d, reasoning ? "reasoning_content" : "content", t);
            emit(s, i, d, NULL, out);
        }
        break;
    }
    case CINFER_EV_TOOL_CALL: {
        if (s->api != SRV_API_CHAT) break;
        flush_text(s, i, 1, out);
        if (ev->tool_index < 0 || ev->tool_index > c->n_tools) break; /* out of order: dropped, as in srv_choice_add */
        json_t *call = json_object();
        json_object_set_new(call, "index", json_integer(ev->tool_index));
        json_t *f = json_object();
        if (ev->tool_index == c->n_tools) {
            c->n_tools++;
            json_object_set_new(call, "id", srv_json_text(ev->tool_id ? ev->tool_id : "", ev->tool_id ? strlen(ev->tool_id) : 0));
            json_object_set_new(call, "type", json_string("function"));
            json_object_set_new(f, "name", srv_json_text(ev->tool_name ? ev->tool_name : "", ev->tool_name ? strlen(ev->tool_name) : 0));
        }
        json_object_set_new(f, "arguments", srv_json_text(ev->tool_args ? ev->tool_args : "", ev->tool_args ? ev->tool_args_len : 0));
        json_object_set_new(call, "function", f);
        json_t *calls = json_array();
        json_array_append_new(calls, call);
        json_t *d = json_object();
        json_object_set_new(d, "tool_calls", calls);
        emit(s, i, d, NULL, out);
        break;
    }
    case CINFER_EV_LOGPROB:
        if (c->pending_logprobs) json_array_append_new(c->pending_logprobs, oai_logprob_entry(ev));
        break;
    case CINFER_EV_DONE:
        flush_text(s, i, 1, out);
        emit(s, i, json_object(), ev->finish_reason ? ev->finish_reason : "stop", out);
        break;
    case CINFER_EV_ERROR: {
        srv_error e;
        srv_fail(&e, 500, NULL, "%.*s", (int)(ev->text ? ev->len : 0), ev->text ? ev->text : "");
        char *body = oai_error_body(&e);
        json_error_t je;
        sse_frame(out, NULL, json_loads(body, 0, &je));
        free(body);
        break;
    }
    }
}

void oai_stream_usage(oai_stream *s, const srv_choice *ch, int n_choices, int n_per_prompt, sbuf *out) {
    json_t *o = chunk_base(s);
    json_object_set_new(o, "choices", json_array());
    json_object_set_new(o, "usage", oai_usage(ch, n_choices, n_per_prompt));
    sse_frame(out, NULL, o);
}

/* ---- Anthropic ---- */

void ant_stream_init(ant_stream *s, const srv_resp_meta *m) {
    memset(s, 0, sizeof *s);
    s->id = xstrdup(m->id);
    s->model = xstrdup(m->model);
    s->block = -1;
}

void ant_stream_free(ant_stream *s) {
    free(s->id);
    free(s->model);
    sb_free(&s->carry);
    memset(s, 0, sizeof *s);
}

void ant_stream_ping(sbuf *out) {
    json_t *o = json_object();
    json_object_set_new(o, "type", json_string("ping"));
    sse_frame(out, "ping", o);
}

void ant_stream_start(ant_stream *s, int prompt_tokens, int cached_tokens, sbuf *out) {
    json_t *msg = json_object();
    json_object_set_new(msg, "id", json_string(s->id));
    json_object_set_new(msg, "type", json_string("message"));
    json_object_set_new(msg, "role", json_string("assistant"));
    json_object_set_new(msg, "model", srv_json_text(s->model, strlen(s->model)));
    json_object_set_new(msg, "content", json_array());
    json_object_set_new(msg, "stop_reason", json_null());
    json_object_set_new(msg, "stop_sequence", json_null());
    json_object_set_new(msg, "usage", ant_usage(prompt_tokens, cached_tokens, 0));
    json_t *o = json_object();
    json_object_set_new(o, "type", json_string("message_start"));
    json_object_set_new(o, "message", msg);
    sse_frame(out, "message_start", o);
    ant_stream_ping(out);
}

static void block_delta(ant_stream *s, json_t *delta, sbuf *out) {
    json_t *o = json_object();
    json_object_set_new(o, "type", json_string("content_block_delta"));
    json_object_set_new(o, "index", json_integer(s->block));
    json_object_set_new(o, "delta", delta);
    sse_frame(out, "content_block_delta", o);
}

static void text_delta(ant_stream *s, json_t *text, sbuf *out) {
    json_t *d = json_object();
    json_object_set_new(d, "type", json_string(s->kind == 1 ? "thinking_delta" : "text_delta"));
    json_object_set_new(d, s->kind == 1 ? "thinking" : "text", text);
    block_delta(s, d, out);
}

static void close_block(ant_stream *s, sbuf *out) {
    if (s->block < 0) return;
    json_t *t = take_text(&s->carry, NULL, 0, 1);
    if (t) text_delta(s, t, out);
    if (s->kind == 1) {
        /* Thinking blocks end with their signature; cinfer does not sign, so it is empty. */
        json_t *d = json_object();
        json_object_set_new(d, "type", json_string("signature_delta"));
        json_object_set_new(d, "signature", json_string(""));
        block_delta(s, d, out);
    }
    json_t *o = json_object();
    json_object_set_new(o, "type", json_string("content_block_stop"));
    json_object_set_new(o, "index", json_integer(s->block));
    sse_frame(out, "content_block_stop", o);
    s->block = -1;
    s->kind = 0;
}

static void open_block(ant_stream *s, int kind, const cinfer_event *ev, sbuf *out) {
    close_block(s, out);
    s->block = s->n_blocks++;
    s->kind = kind;
    json_t *b = json_object();
    if (kind == 1) {
        json_object_set_new(b, "type", json_string("thinking"));
        json_object_set_new(b, "thinking", json_string(""));
        json_object_set_new(b, "signature", json_string(""));
    } else if (kind == 2) {
        json_object_set_new(b, "type", json_string("text"));
        json_object_set_new(b, "text", json_string(""));
    } else {
        s->tool = ev->tool_index;
        json_object_set_new(b, "type", json_string("tool_use"));
        json_object_set_new(b, "id", srv_json_text(ev->tool_id ? ev->tool_id : "", ev->tool_id ? strlen(ev->tool_id) : 0));
        json_object_set_new(b, "name", srv_json_text(ev->tool_name ? ev->tool_name : "", ev->tool_name ? strlen(ev->tool_name) : 0));
        json_object_set_new(b, "input", json_object());
    }
    json_t *o = json_object();
    json_object_set_new(o, "type", json_string("content_block_start"));
    json_object_set_new(o, "index", json_integer(s->block));
    json_object_set_new(o, "content_block", b);
    sse_frame(out, "content_block_start", o);
}

void ant_stream_event(ant_stream *s, const cinfer_event *ev, sbuf *out) {
    switch (ev->type) {
    case CINFER_EV_CONTENT:
    case CINFER_EV_REASONING: {
        int kind = ev->type == CINFER_EV_REASONING ? 1 : 2;
        if (!ev->text || !ev->len) break;
        if (s->kind != kind) open_block(s, kind, ev, out);
        json_t *t = take_text(&s->carry, ev->text, ev->len, 0);
        if (t) text_delta(s, t, out);
        break;
    }
    case CINFER_EV_TOOL_CALL: {
        if (ev->tool_name || s->kind != 3 || s->tool != ev->tool_index) {
            if (!ev->tool_name && (s->kind != 3 || s->tool != ev->tool_index)) break; /* a delta for a call never opened */
            open_block(s, 3, ev, out);
        }
        if (ev->tool_args && ev->tool_args_len) {
            json_t *d = json_object();
            json_object_set_new(d, "type", json_string("input_json_delta"));
            json_object_set_new(d, "partial_json", srv_json_text(ev->tool_args, ev->tool_args_len));
            block_delta(s, d, out);
        }
        break;
    }
    case CINFER_EV_LOGPROB: break;
    case CINFER_EV_DONE: {
        /* A message always has at least one content block. */
        if (!s->n_blocks) open_block(s, 2, ev, out);
        close_block(s, out);
        json_t *delta = json_object();
        json_object_set_new(delta, "stop_reason", json_string(ant_stop_reason(ev->finish_reason, ev->stop_string)));
        json_object_set_new(delta, "stop_sequence", ev->stop_string ? srv_json_text(ev->stop_string, strlen(ev->stop_string)) : json_null());
        json_t *o = json_object();
        json_object_set_new(o, "type", json_string("message_delta"));
        json_object_set_new(o, "delta", delta);
        json_object_set_new(o, "usage", ant_usage(ev->prompt_tokens, ev->cached_tokens, ev->completion_tokens));
        sse_frame(out, "message_delta", o);
        json_t *stop = json_object();
        json_object_set_new(stop, "type", json_string("message_stop"));
        sse_frame(out, "message_stop", stop);
        break;
    }
    case CINFER_EV_ERROR: {
        close_block(s, out);
        srv_error e;
        srv_fail(&e, 500, NULL, "%.*s", (int)(ev->text ? ev->len : 0), ev->text ? ev->text : "");
        char *body = ant_error_body(&e);
        json_error_t je;
        sse_frame(out, "error", json_loads(body, 0, &je));
        free(body);
        break;
    }
    }
}

/* api_anthropic.c — the Anthropic Messages API: /v1/messages and /v1/messages/count_tokens bodies into
 * srv_gen_req (system, content blocks, tool_use / tool_result, thinking, stop_sequences) by rewriting the
 * conversation into the OpenAI-style messages chat templates expect, and the non-streaming response.
 * Streaming events are in sse.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/api.h"
#include "server/req_util.h"
#include "util/alloc.h"

/* json_object_set for a borrowed member of the (const) request body: the reference count is bumped, the
 * value itself is never modified. */
static void set_ref(json_t *o, const char *key, const json_t *v) { json_object_set(o, key, (json_t *)v); }

static const char *block_type(const json_t *b) {
    const json_t *t = json_is_object(b) ? json_object_get(b, "type") : NULL;
    return json_is_string(t) ? json_string_value(t) : NULL;
}

/* Text of a content value that must be plain text: a string or an array of text blocks (system prompts,
 * tool results). Returns a new JSON string or NULL with e filled. */
static json_t *text_of(const json_t *v, const char *path, srv_error *e) {
    if (json_is_string(v)) return json_incref((json_t *)v);
    if (!v || json_is_null(v)) return json_string("");
    if (!json_is_array(v)) {
        srv_fail(e, 400, path, "'%s' must be a string or an array of text blocks", path);
        return NULL;
    }
    sbuf b = {0};
    size_t i;
    const json_t *blk;
    json_array_foreach(v, i, blk) {
        const char *t = block_type(blk);
        const json_t *text = json_is_object(blk) ? json_object_get(blk, "text") : NULL;
        if (!t || strcmp(t, "text") || !json_is_string(text)) {
            sb_free(&b);
            srv_fail(e, 400, path, "'%s[%zu]' must be a text block (got %s)", path, i, t ? t : "no type");
            return NULL;
        }
        if (b.len) sb_append(&b, "\n", 1);
        sb_append(&b, json_string_value(text), json_string_length(text));
    }
    json_t *s = json_stringn(b.data ? b.data : "", b.len);
    sb_free(&b);
    return s;
}

static void flush_user(json_t *out, json_t **parts) {
    if (!*parts) return;
    json_t *m = json_object();
    json_object_set_new(m, "role", json_string("user"));
    /* One text block becomes a plain string, the form every template handles. */
    const json_t *only_text = json_array_size(*parts) == 1 ? json_object_get(json_array_get(*parts, 0), "text") : NULL;
    if (only_text) set_ref(m, "content", only_text);
    else set_ref(m, "content", *parts);
    json_array_append_new(out, m);
    json_decref(*parts);
    *parts = NULL;
}

static int user_blocks(json_t *out, const json_t *content, const char *path, srv_gen_req *r, const srv_defaults *d,
                       srv_error *e) {
    json_t *parts = NULL;
    size_t i;
    const json_t *blk;
    json_array_foreach(content, i, blk) {
        char bpath[96];
        snprintf(bpath, sizeof bpath, "%s[%zu]", path, i);
        const char *t = block_type(blk);
        if (!t) {
            json_decref(parts);
            return srv_fail(e, 400, bpath, "'%s' must be a content block with a type", bpath);
        }
        if (!strcmp(t, "text")) {
            const json_t *text = json_object_get(blk, "text");
            if (!json_is_string(text)) {
                json_decref(parts);
                return srv_fail(e, 400, bpath, "'%s.text' must be a string", bpath);
            }
            if (!parts) parts = json_array();
            json_t *p = json_object();
            json_object_set_new(p, "type", json_string("text"));
            set_ref(p, "text", text);
            json_array_append_new(parts, p);
        } else if (!strcmp(t, "tool_result")) {
            /* Tool results become "tool" messages in place, after any text that came before them. */
            flush_user(out, &parts);
            const json_t *id = json_object_get(blk, "tool_use_id");
            if (!json_is_string(id)) return srv_fail(e, 400, bpath, "'%s.tool_use_id' must be a string", bpath);
            char cpath[112];
            snprintf(cpath, sizeof cpath, "%s.content", bpath);
            json_t *text = text_of(json_object_get(blk, "content"), cpath, e);
            if (!text) return -1;
            json_t *m = json_object();
            json_object_set_new(m, "role", json_string("tool"));
            set_ref(m, "tool_call_id", id);
            json_object_set_new(m, "content", text);
            json_array_append_new(out, m);
        } else if (!strcmp(t, "image")) {
            /* {"type":"image","source":{"type":"base64","media_type":"image/png","data":"..."}}; the server
             * never fetches a "url" source */
            const json_t *src = json_object_get(blk, "source");
            const char *st = block_type(src);
            char spath[112];
            snprintf(spath, sizeof spath, "%s.source", bpath);
            const json_t *mt = json_is_object(src) ? json_object_get(src, "media_type") : NULL;
            const json_t *data = json_is_object(src) ? json_object_get(src, "data") : NULL;
            int rc;
            if (!st) rc = srv_fail(e, 400, spath, "'%s' must be an object with a type", spath);
            else if (strcmp(st, "base64"))
                rc = srv_fail(e, 400, spath,
                              "'%s.type' \"%.32s\": only base64 images are accepted; this server does not fetch URLs or files",
                              spath, st);
            else if (!json_is_string(data) || (mt && !json_is_string(mt)))
                rc = srv_fail(e, 400, spath, "'%s' needs a string media_type and base64 data", spath);
            else
                rc = ru_image_b64(mt ? json_string_value(mt) : "", mt ? json_string_length(mt) : 0, json_string_value(data),
                                  json_string_length(data), spath, r, d, e);
            if (rc < 0) {
                json_decref(parts);
                return -1;
            }
            if (!parts) parts = json_array();
            json_t *p = json_object();
            json_object_set_new(p, "type", json_string("image"));
            json_array_append_new(parts, p);
        } else if (!strcmp(t, "document")) {
            json_decref(parts);
            return srv_fail(e, 400, bpath, "'%s': %s input is not supported by this server", bpath, t);
        } else {
            json_decref(parts);
            return srv_fail(e, 400, bpath, "'%s': block type \"%.32s\" is not allowed in a user message", bpath, t);
        }
    }
    flush_user(out, &parts);
    return 0;
}

static int assistant_blocks(json_t *out, const json_t *content, const char *path, srv_error *e) {
    sbuf text = {0}, thinking = {0};
    json_t *calls = NULL;
    size_t i;
    const json_t *blk;
    json_array_foreach(content, i, blk) {
        char bpath[96];
        snprintf(bpath, sizeof bpath, "%s[%zu]", path, i);
        const char *t = block_type(blk);
        if (t && !strcmp(t, "text") && json_is_string(json_object_get(blk, "text"))) {
            const json_t *s = json_object_get(blk, "text");
            sb_append(&text, json_string_value(s), json_string_length(s));
        } else if (t && !strcmp(t, "thinking") && json_is_string(json_object_get(blk, "thinking"))) {
            const json_t *s = json_object_get(blk, "thinking");
            sb_append(&thinking, json_string_value(s), json_string_length(s));
        } else if (t && !strcmp(t, "redacted_thinking")) {
            continue; /* opaque to us: nothing to render */
        } else if (t && !strcmp(t, "tool_use")) {
            const json_t *id = json_object_get(blk, "id"), *name = json_object_get(blk, "name");
            const json_t *input = json_object_get(blk, "input");
            if (!json_is_string(id) || !json_is_string(name) || !json_is_object(input)) {
                sb_free(&text);
                sb_free(&thinking);
                json_decref(calls);
                return srv_fail(e, 400, bpath, "'%s' must have string id and name and an object input", bpath);
            }
            json_t *f = json_object();
            set_ref(f, "name", name);
            set_ref(f, "arguments", input);
            json_t *c = json_object();
            set_ref(c, "id", id);
            json_object_set_new(c, "type", json_string("function"));
            json_object_set_new(c, "function", f);
            if (!calls) calls = json_array();
            json_array_append_new(calls, c);
        } else {
            sb_free(&text);
            sb_free(&thinking);
            json_decref(calls);
            return srv_fail(e, 400, bpath, "'%s': block type \"%.32s\" is not allowed in an assistant message", bpath, t ? t : "(none)");
        }
    }
    json_t *m = json_object();
    json_object_set_new(m, "role", json_string("assistant"));
    json_object_set_new(m, "content", json_stringn(text.data ? text.data : "", text.len));
    if (thinking.len) json_object_set_new(m, "reasoning_content", json_stringn(thinking.data, thinking.len));
    if (calls) json_object_set_new(m, "tool_calls", calls);
    json_array_append_new(out, m);
    sb_free(&text);
    sb_free(&thinking);
    return 0;
}

static json_t *ant_messages(const json_t *body, srv_gen_req *r, const srv_defaults *d, srv_error *e) {
    json_t *out = json_array();
    const json_t *sys = json_object_get(body, "system");
    if (sys && !json_is_null(sys)) {
        json_t *text = text_of(sys, "system", e);
        if (!text) goto fail;
        json_t *m = json_object();
        json_object_set_new(m, "role", json_string("system"));
        json_object_set_new(m, "content", text);
        json_array_append_new(out, m);
    }
    const json_t *msgs = json_object_get(body, "messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
        srv_fail(e, 400, "messages", "'messages' must be a non-empty array");
        goto fail;
    }
    size_t i;
    const json_t *m;
    json_array_foreach(msgs, i, m) {
        char path[48], cpath[64];
        snprintf(path, sizeof path, "messages[%zu]", i);
        snprintf(cpath, sizeof cpath, "messages[%zu].content", i);
        const json_t *role = json_is_object(m) ? json_object_get(m, "role") : NULL;
        const char *rs = json_is_string(role) ? json_string_value(role) : "";
        if (strcmp(rs, "user") && strcmp(rs, "assistant")) {
            srv_fail(e, 400, path, "'%s.role' must be \"user\" or \"assistant\"", path);
            goto fail;
        }
        const json_t *content = json_object_get(m, "content");
        if (json_is_string(content)) {
            json_t *mm = json_object();
            json_object_set_new(mm, "role", json_string(rs));
            set_ref(mm, "content", content);
            json_array_append_new(out, mm);
        } else if (json_is_array(content)) {
            if ((!strcmp(rs, "user") ? user_blocks(out, content, cpath, r, d, e) : assistant_blocks(out, content, cpath, e)) < 0) goto fail;
        } else {
            srv_fail(e, 400, cpath, "'%s' must be a string or an array of content blocks", cpath);
            goto fail;
        }
    }
    return out;
fail:
    json_decref(out);
    return NULL;
}

/* Anthropic tools {name, description, input_schema} → OpenAI function tools for the template and the
 * engine's argument typing. */
static json_t *ant_tools(const json_t *body, srv_gen_req *r, srv_error *e, int *bad) {
    *bad = 0;
    const json_t *tc = json_object_get(body, "tool_choice");
    int none = 0, forced = 0;
    const char *fname = NULL;
    if (tc && !json_is_null(tc)) {
        const char *t = block_type(tc);
        if (!t) {
            *bad = 1;
            srv_fail(e, 400, "tool_choice", "'tool_choice' must be an object with a type");
            return NULL;
        }
        if (!strcmp(t, "none")) none = 1;
        else if (!strcmp(t, "any")) forced = 1;
        else if (!strcmp(t, "tool")) {
            const json_t *nm = json_object_get(tc, "name");
            if (!json_is_string(nm)) {
                *bad = 1;
                srv_fail(e, 400, "tool_choice", "'tool_choice' of type \"tool\" needs a \"name\"");
                return NULL;
            }
            forced = 1;
            fname = json_string_value(nm);
        } else if (strcmp(t, "auto")) {
            *bad = 1;
            srv_fail(e, 400, "tool_choice", "'tool_choice' type \"%.32s\": expected auto, any, tool or none", t);
            return NULL;
        }
    }
    const json_t *tools = json_object_get(body, "tools");
    if (forced && (!json_is_array(tools) || json_array_size(tools) == 0)) {
        *bad = 1;
        srv_fail(e, 400, "tool_choice", "'tool_choice' forces a tool call but the request has no tools");
        return NULL;
    }
    if (forced && !none) {
        /* the answer is constrained to the model's tool-call syntax; the parser then reads the calls */
        r->constraint = CINFER_CONSTRAIN_TOOL_CALLS;
        r->constraint_arg = fname ? xstrdup(fname) : NULL;
        r->constraint_param = "tool_choice";
    }
    if (!tools || json_is_null(tools)) return NULL;
    if (!json_is_array(tools)) {
        *bad = 1;
        srv_fail(e, 400, "tools", "'tools' must be an array");
        return NULL;
    }
    json_t *out = json_array();
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        char path[32];
        snprintf(path, sizeof path, "tools[%zu]", i);
        const json_t *name = json_is_object(t) ? json_object_get(t, "name") : NULL;
        const json_t *schema = json_is_object(t) ? json_object_get(t, "input_schema") : NULL;
        const char *type = block_type(t);
        if (type && strcmp(type, "custom")) {
            json_decref(out);
            *bad = 1;
            srv_fail(e, 400, path, "'%s': server tool \"%.40s\" is not supported", path, type);
            return NULL;
        }
        if (!json_is_string(name) || !json_string_length(name) || (schema && !json_is_object(schema))) {
            json_decref(out);
            *bad = 1;
            srv_fail(e, 400, path, "'%s' must have a non-empty name and an object input_schema", path);
            return NULL;
        }
        json_t *f = json_object();
        set_ref(f, "name", name);
        const json_t *desc = json_object_get(t, "description");
        if (json_is_string(desc)) set_ref(f, "description", desc);
        json_object_set_new(f, "parameters", schema ? json_incref((json_t *)schema) : json_object());
        json_t *o = json_object();
        json_object_set_new(o, "type", json_string("function"));
        json_object_set_new(o, "function", f);
        json_array_append_new(out, o);
    }
    if (none || json_array_size(out) == 0) {
        json_decref(out);
        return NULL;
    }
    r->has_tools = 1;
    r->tools_json = json_dumps(out, JSON_COMPACT);
    return out;
}

static int ant_parse(const json_t *body, const srv_defaults *d, srv_gen_req *r, srv_error *e, int generate) {
    memset(r, 0, sizeof *r);
    r->api = SRV_API_ANTHROPIC;
    r->sampling = srv_sampling_base(d);
    r->thinking = -1;
    r->n = 1;
    const char *model = NULL;
    if (ru_str(body, "model", &model, e) < 0) goto fail;
    if (model) r->model = xstrdup(model);
    if (generate) {
        long long mt;
        int rc = ru_int(body, "max_tokens", 1, 1 << 30, &mt, e);
        if (rc < 0) goto fail;
        if (!rc) {
            srv_fail(e, 400, "max_tokens", "'max_tokens' is required");
            goto fail;
        }
        r->max_tokens = (int)mt;
        if (ru_bool(body, "stream", &r->stream, e) < 0) goto fail;
        if (ru_sampling(body, r, e) < 0) goto fail;
        const json_t *ss = json_object_get(body, "stop_sequences");
        if (ss && !json_is_null(ss) && !json_is_array(ss)) {
            srv_fail(e, 400, "stop_sequences", "'stop_sequences' must be an array of strings");
            goto fail;
        }
        if (ru_stop(body, "stop_sequences", r, e) < 0) goto fail;
    }
    const json_t *th = json_object_get(body, "thinking");
    if (th && !json_is_null(th)) {
        const char *t = block_type(th);
        if (!t || (strcmp(t, "enabled") && strcmp(t, "disabled") && strcmp(t, "adaptive"))) {
            srv_fail(e, 400, "thinking", "'thinking.type' must be \"enabled\", \"adaptive\" or \"disabled\"");
            goto fail;
        }
        r->thinking = strcmp(t, "disabled") != 0;
    }
    json_t *msgs = ant_messages(body, r, d, e);
    if (!msgs) goto fail;
    int bad;
    json_t *tools = ant_tools(body, r, e, &bad);
    if (bad) {
        json_decref(msgs);
        goto fail;
    }
    json_t *kw = NULL;
    if (r->thinking >= 0) {
        kw = json_object();
        json_object_set_new(kw, "enable_thinking", json_boolean(r->thinking));
    }
    r->template_ctx = ru_template_ctx(msgs, tools, d ? d->chat_template_args : NULL, kw);
    json_decref(kw);
    r->n_prompts = 1;
    r->prompt_text = xcalloc(1, sizeof *r->prompt_text);
    r->prompt_ids = xcalloc(1, sizeof *r->prompt_ids);
    r->n_prompt_ids = xcalloc(1, sizeof *r->n_prompt_ids);
    return 0;
fail:
    srv_gen_req_free(r);
    return -1;
}

int ant_parse_messages(const json_t *body, const srv_defaults *d, srv_gen_req *r, srv_error *e) {
    return ant_parse(body, d, r, e, 1);
}

int ant_parse_count_tokens(const json_t *body, const srv_defaults *d, srv_gen_req *r, srv_error *e) {
    return ant_parse(body, d, r, e, 0);
}

/* tool_use input: the call's arguments as an object (the engine's parsers emit JSON objects; anything
 * else is kept visible under "_raw" rather than dropped). */
json_t *ant_tool_input(const srv_tool_call *t) {
    json_error_t je;
    json_t *in = t->args.len ? json_loadb(t->args.data, t->args.len, 0, &je) : json_object();
    if (json_is_object(in)) return in;
    json_decref(in);
    json_t *o = json_object();
    json_object_set_new(o, "_raw", srv_json_text(t->args.data, t->args.len));
    return o;
}

json_t *ant_usage(int prompt_tokens, int cached_tokens, int output_tokens) {
    json_t *u = json_object();
    /* Anthropic counts cache reads apart from input_tokens. */
    json_object_set_new(u, "input_tokens", json_integer(prompt_tokens - cached_tokens));
    json_object_set_new(u, "cache_creation_input_tokens", json_integer(0));
    json_object_set_new(u, "cache_read_input_tokens", json_integer(cached_tokens));
    json_object_set_new(u, "output_tokens", json_integer(output_tokens));
    return u;
}

char *ant_message_response(const srv_resp_meta *m, const srv_choice *c) {
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(m->id));
    json_object_set_new(o, "type", json_string("message"));
    json_object_set_new(o, "role", json_string("assistant"));
    json_object_set_new(o, "model", srv_json_text(m->model, strlen(m->model)));
    json_t *content = json_array();
    if (c->reasoning.len) {
        json_t *b = json_object();
        json_object_set_new(b, "type", json_string("thinking"));
        json_object_set_new(b, "thinking", srv_json_text(c->reasoning.data, c->reasoning.len));
        json_object_set_new(b, "signature", json_string(""));
        json_array_append_new(content, b);
    }
    if (c->content.len || !c->n_calls) {
        json_t *b = json_object();
        json_object_set_new(b, "type", json_string("text"));
        json_object_set_new(b, "text", srv_json_text(c->content.data, c->content.len));
        json_array_append_new(content, b);
    }
    for (int i = 0; i < c->n_calls; i++) {
        json_t *b = json_object();
        json_object_set_new(b, "type", json_string("tool_use"));
        json_object_set_new(b, "id", srv_json_text(c->calls[i].id ? c->calls[i].id : "", c->calls[i].id ? strlen(c->calls[i].id) : 0));
        json_object_set_new(b, "name", srv_json_text(c->calls[i].name ? c->calls[i].name : "", c->calls[i].name ? strlen(c->calls[i].name) : 0));
        json_object_set_new(b, "input", ant_tool_input(&c->calls[i]));
        json_array_append_new(content, b);
    }
    json_object_set_new(o, "content", content);
    json_object_set_new(o, "stop_reason", json_string(ant_stop_reason(c->finish_reason, c->stop_string)));
    json_object_set_new(o, "stop_sequence", c->stop_string ? srv_json_text(c->stop_string, strlen(c->stop_string)) : json_null());
    json_object_set_new(o, "usage", ant_usage(c->prompt_tokens, c->cached_tokens, c->completion_tokens));
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

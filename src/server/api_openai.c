/* api_openai.c — the OpenAI API: /v1/chat/completions and /v1/completions request bodies into
 * srv_gen_req (every field typed and ranged, errors naming the field), and the non-streaming response
 * bodies. Streaming chunks are in sse.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/api.h"
#include "server/req_util.h"
#include "util/alloc.h"

/* Fields shared by chat and completions. */
static int parse_common(const json_t *body, srv_gen_req *r, srv_error *e) {
    const char *model = NULL;
    if (ru_str(body, "model", &model, e) < 0) return -1;
    if (model) r->model = xstrdup(model);
    if (ru_bool(body, "stream", &r->stream, e) < 0) return -1;
    const json_t *so = json_object_get(body, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) return srv_fail(e, 400, "stream_options", "'stream_options' must be an object");
        if (ru_bool(so, "include_usage", &r->include_usage, e) < 0) {
            snprintf(e->param, sizeof e->param, "stream_options.include_usage");
            return -1;
        }
    }
    long long v;
    int rc;
    if ((rc = ru_int(body, "n", 1, SRV_MAX_N, &v, e)) < 0) return -1;
    r->n = rc ? (int)v : 1;
    /* best_of is only meaningful when it equals n (OpenAI's default); more would need ranking. */
    if ((rc = ru_int(body, "best_of", 1, SRV_MAX_N, &v, e)) < 0) return -1;
    if (rc && v != r->n) return srv_fail(e, 400, "best_of", "'best_of' other than n is not supported");
    if ((rc = ru_int(body, "max_tokens", 1, 1 << 30, &v, e)) < 0) return -1;
    if (rc) r->max_tokens = (int)v;
    if ((rc = ru_int(body, "max_completion_tokens", 1, 1 << 30, &v, e)) < 0) return -1;
    if (rc) r->max_tokens = (int)v;
    if (ru_sampling(body, r, e) < 0) return -1;
    if (ru_stop(body, "stop", r, e) < 0) return -1;
    /* JSON answers by constrained decoding; the engine compiles the schema (and refuses what it cannot). */
    const json_t *rf = json_object_get(body, "response_format");
    if (rf && !json_is_null(rf)) {
        const json_t *t = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
        if (!json_is_string(t)) return srv_fail(e, 400, "response_format", "'response_format' must be an object with a \"type\"");
        const char *ty = json_string_value(t);
        if (!strcmp(ty, "json_object")) {
            r->constraint = CINFER_CONSTRAIN_JSON;
        } else if (!strcmp(ty, "json_schema")) {
            const json_t *js = json_object_get(rf, "json_schema");
            const json_t *sc = json_is_object(js) ? json_object_get(js, "schema") : NULL;
            if (!json_is_object(js))
                return srv_fail(e, 400, "response_format.json_schema", "'response_format.json_schema' must be an object with a \"schema\"");
            r->constraint = CINFER_CONSTRAIN_JSON;
            /* no schema given: any JSON object, as OpenAI's own default */
            if (sc) r->constraint_arg = json_dumps(sc, JSON_COMPACT | JSON_ENCODE_ANY);
        } else if (strcmp(ty, "text")) {
            return srv_fail(e, 400, "response_format", "'response_format' type \"%.32s\": expected \"text\", \"json_object\" or \"json_schema\"", ty);
        }
        if (r->constraint) r->constraint_param = "response_format";
    }
    return 0;
}

/* tool_calls[].function.arguments arrive as a JSON string (the OpenAI wire form); chat templates iterate
 * them as a mapping, so they are parsed here. */
static int fix_tool_calls(json_t *msg, const char *path, srv_error *e) {
    json_t *calls = json_object_get(msg, "tool_calls");
    if (!calls || json_is_null(calls)) return 0;
    if (!json_is_array(calls)) return srv_fail(e, 400, path, "'%s.tool_calls' must be an array", path);
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) {
        const json_t *f = json_is_object(c) ? json_object_get(c, "function") : NULL;
        if (!json_is_object(f) || !json_is_string(json_object_get(f, "name")))
            return srv_fail(e, 400, path, "'%s.tool_calls[%zu].function' must be an object with a string name", path, i);
        json_t *args = json_object_get(f, "arguments");
        if (json_is_string(args)) {
            json_error_t je;
            json_t *parsed = json_loadb(json_string_value(args), json_string_length(args), 0, &je);
            if (!json_is_object(parsed)) {
                json_decref(parsed);
                return srv_fail(e, 400, path, "'%s.tool_calls[%zu].function.arguments' is not a JSON object", path, i);
            }
            json_object_set_new((json_t *)f, "arguments", parsed);
        } else if (args && !json_is_null(args) && !json_is_object(args)) {
            return srv_fail(e, 400, path, "'%s.tool_calls[%zu].function.arguments' must be a JSON string or object", path, i);
        }
    }
    return 0;
}

/* Messages as given, checked, with developer → system and content parts validated. */
static json_t *chat_messages(const json_t *body, srv_gen_req *r, const srv_defaults *d, srv_error *e) {
    const json_t *msgs = json_object_get(body, "messages");
    if (!json_is_array(msgs)) {
        srv_fail(e, 400, "messages", "'messages' must be an array");
        return NULL;
    }
    size_t n = json_array_size(msgs);
    if (n == 0) {
        srv_fail(e, 400, "messages", "'messages' must not be empty");
        return NULL;
    }
    json_t *out = json_deep_copy(msgs);
    size_t i;
    json_t *m;
    json_array_foreach(out, i, m) {
        char path[48];
        snprintf(path, sizeof path, "messages[%zu]", i);
        if (!json_is_object(m)) {
            srv_fail(e, 400, path, "'%s' must be an object", path);
            goto fail;
        }
        const json_t *role = json_object_get(m, "role");
        const char *rs = json_is_string(role) ? json_string_value(role) : NULL;
        if (!rs || (strcmp(rs, "system") && strcmp(rs, "developer") && strcmp(rs, "user") && strcmp(rs, "assistant") &&
                    strcmp(rs, "tool"))) {
            srv_fail(e, 400, path, "'%s.role' must be one of system, developer, user, assistant, tool", path);
            goto fail;
        }
        int assistant = !strcmp(rs, "assistant");
        /* rs dies with the old role string */
        if (!strcmp(rs, "developer")) json_object_set_new(m, "role", json_string("system"));
        char cpath[64];
        snprintf(cpath, sizeof cpath, "%s.content", path);
        json_t *content = ru_content(json_object_get(m, "content"), cpath, r, d, e);
        if (!content) goto fail;
        json_object_set_new(m, "content", content);
        if (assistant && fix_tool_calls(m, path, e) < 0) goto fail;
        const json_t *rc = json_object_get(m, "reasoning_content");
        if (rc && !json_is_null(rc) && !json_is_string(rc)) {
            srv_fail(e, 400, path, "'%s.reasoning_content' must be a string", path);
            goto fail;
        }
    }
    return out;
fail:
    json_decref(out);
    return NULL;
}

/* tools + tool_choice → r->has_tools / r->tools_json; returns the tools to render (new reference) or
 * NULL when none. *bad set on error. */
static json_t *chat_tools(const json_t *body, srv_gen_req *r, srv_error *e, int *bad) {
    *bad = 0;
    const json_t *tools = json_object_get(body, "tools");
    const json_t *tc = json_object_get(body, "tool_choice");
    int none = 0, forced = 0;
    const char *fname = NULL;
    if (tc && !json_is_null(tc)) {
        if (json_is_string(tc)) {
            const char *s = json_string_value(tc);
            if (!strcmp(s, "none")) none = 1;
            else if (!strcmp(s, "required")) forced = 1;
            else if (strcmp(s, "auto")) {
                *bad = 1;
                srv_fail(e, 400, "tool_choice", "'tool_choice' \"%.32s\": expected \"auto\", \"none\", \"required\" or a function", s);
                return NULL;
            }
        } else {
            const json_t *ty = json_is_object(tc) ? json_object_get(tc, "type") : NULL;
            const json_t *f = json_is_object(tc) ? json_object_get(tc, "function") : NULL;
            const json_t *nm = json_is_object(f) ? json_object_get(f, "name") : NULL;
            if (!json_is_string(ty) || strcmp(json_string_value(ty), "function") || !json_is_string(nm)) {
                *bad = 1;
                srv_fail(e, 400, "tool_choice", "'tool_choice' must be a string or {\"type\": \"function\", \"function\": {\"name\": ...}}");
                return NULL;
            }
            forced = 1;
            fname = json_string_value(nm);
        }
    }
    int have = tools && !json_is_null(tools);
    if (have && ru_tools(tools, "tools", e) < 0) {
        *bad = 1;
        return NULL;
    }
    if (forced && (!have || json_array_size(tools) == 0)) {
        *bad = 1;
        srv_fail(e, 400, "tool_choice", "'tool_choice' forces a tool call but the request has no tools");
        return NULL;
    }
    if (!have || none || json_array_size(tools) == 0) return NULL;
    if (forced) {
        /* the answer is constrained to the model's tool-call syntax; the parser then reads the calls */
        r->constraint = CINFER_CONSTRAIN_TOOL_CALLS;
        r->constraint_arg = fname ? xstrdup(fname) : NULL;
        r->constraint_param = "tool_choice";
    }
    r->has_tools = 1;
    r->tools_json = json_dumps(tools, JSON_COMPACT);
    return json_deep_copy(tools);
}

static int chat_kwargs(const json_t *body, const json_t **kw, srv_error *e) {
    *kw = json_object_get(body, "chat_template_kwargs");
    if (*kw && json_is_null(*kw)) *kw = NULL;
    if (*kw && !json_is_object(*kw)) return srv_fail(e, 400, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
    return 0;
}

int oai_parse_chat(const json_t *body, const srv_defaults *d, srv_gen_req *r, srv_error *e) {
    memset(r, 0, sizeof *r);
    r->api = SRV_API_CHAT;
    r->sampling = srv_sampling_base(d);
    r->thinking = -1;
    if (parse_common(body, r, e) < 0) goto fail;
    int lp = 0;
    long long top = 0;
    int rc;
    if (ru_bool(body, "logprobs", &lp, e) < 0) goto fail;
    if ((rc = ru_int(body, "top_logprobs", 0, SRV_MAX_TOP_LOGPROBS, &top, e)) < 0) goto fail;
    if (rc && !lp) {
        srv_fail(e, 400, "top_logprobs", "'top_logprobs' needs 'logprobs' set to true");
        goto fail;
    }
    r->sampling.n_logprobs = lp ? (int)top : -1;
    const json_t *kw;
    if (chat_kwargs(body, &kw, e) < 0) goto fail;
    json_t *msgs = chat_messages(body, r, d, e);
    if (!msgs) goto fail;
    int bad;
    json_t *tools = chat_tools(body, r, e, &bad);
    if (bad) {
        json_decref(msgs);
        goto fail;
    }
    r->template_ctx = ru_template_ctx(msgs, tools, d ? d->chat_template_args : NULL, kw);
    r->n_prompts = 1;
    r->prompt_text = xcalloc(1, sizeof *r->prompt_text);
    r->prompt_ids = xcalloc(1, sizeof *r->prompt_ids);
    r->n_prompt_ids = xcalloc(1, sizeof *r->n_prompt_ids);
    return 0;
fail:
    srv_gen_req_free(r);
    return -1;
}

int oai_parse_apply_template(const json_t *body, const srv_defaults *d, char **template_ctx, srv_error *e) {
    *template_ctx = NULL;
    srv_gen_req r;
    memset(&r, 0, sizeof r);
    const json_t *kw;
    if (chat_kwargs(body, &kw, e) < 0) return -1;
    json_t *msgs = chat_messages(body, &r, d, e);
    if (!msgs) {
        srv_gen_req_free(&r);
        return -1;
    }
    int bad;
    json_t *tools = chat_tools(body, &r, e, &bad);
    srv_gen_req_free(&r);
    if (bad) {
        json_decref(msgs);
        return -1;
    }
    *template_ctx = ru_template_ctx(msgs, tools, d ? d->chat_template_args : NULL, kw);
    return 0;
}

/* One prompt of /v1/completions: a string or an array of token ids. */
static int completion_prompt(const json_t *p, const char *path, srv_gen_req *r, int i, srv_error *e) {
    if (json_is_string(p)) {
        r->prompt_text[i] = xstrndup(json_string_value(p), json_string_length(p));
        if (memchr(json_string_value(p), 0, json_string_length(p)))
            return srv_fail(e, 400, "prompt", "'%s' contains a NUL byte", path);
        return 0;
    }
    if (!json_is_array(p)) return srv_fail(e, 400, "prompt", "'%s' must be a string or an array of token ids", path);
    size_t n = json_array_size(p);
    if (n == 0) return srv_fail(e, 400, "prompt", "'%s' is empty", path);
    if (n > (1u << 24)) return srv_fail(e, 400, "prompt", "'%s' has too many tokens", path);
    r->prompt_ids[i] = xmalloc(n * sizeof(int32_t));
    r->n_prompt_ids[i] = (int)n;
    for (size_t k = 0; k < n; k++) {
        const json_t *t = json_array_get(p, k);
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > INT32_MAX)
            return srv_fail(e, 400, "prompt", "'%s[%zu]' must be a token id (a non-negative integer)", path, k);
        r->prompt_ids[i][k] = (int32_t)json_integer_value(t);
    }
    return 0;
}

int oai_parse_completion(const json_t *body, const srv_defaults *d, srv_gen_req *r, srv_error *e) {
    memset(r, 0, sizeof *r);
    r->api = SRV_API_COMPLETION;
    r->sampling = srv_sampling_base(d);
    r->thinking = -1;
    if (parse_common(body, r, e) < 0) goto fail;
    long long lp;
    int rc;
    if ((rc = ru_int(body, "logprobs", 0, SRV_MAX_TOP_LOGPROBS, &lp, e)) < 0) goto fail;
    r->sampling.n_logprobs = rc ? (int)lp : -1;
    int echo = 0;
    if (ru_bool(body, "echo", &echo, e) < 0) goto fail;
    if (echo) {
        srv_fail(e, 400, "echo", "'echo' is not supported");
        goto fail;
    }
    const char *suffix = NULL;
    if (ru_str(body, "suffix", &suffix, e) < 0) goto fail;
    if (suffix && *suffix) {
        srv_fail(e, 400, "suffix", "'suffix' is not supported");
        goto fail;
    }
    const json_t *p = json_object_get(body, "prompt");
    if (!p || json_is_null(p)) {
        srv_fail(e, 400, "prompt", "'prompt' is required");
        goto fail;
    }
    /* One prompt (a string or ids), or a list of them: ["a", "b"] or [[1,2],[3]]. A flat list of ints is
     * one tokenized prompt. */
    int list = json_is_array(p) && json_array_size(p) > 0 &&
               (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0)));
    size_t np = list ? json_array_size(p) : 1;
    if (np > SRV_MAX_PROMPTS) {
        srv_fail(e, 400, "prompt", "'prompt' has %zu prompts, at most %d", np, SRV_MAX_PROMPTS);
        goto fail;
    }
    if (np * (size_t)r->n > SRV_MAX_N * 4) {
        srv_fail(e, 400, "n", "%zu prompts x n=%d choices is more than %d", np, r->n, SRV_MAX_N * 4);
        goto fail;
    }
    r->n_prompts = (int)np;
    r->prompt_text = xcalloc(np, sizeof *r->prompt_text);
    r->prompt_ids = xcalloc(np, sizeof *r->prompt_ids);
    r->n_prompt_ids = xcalloc(np, sizeof *r->n_prompt_ids);
    for (size_t i = 0; i < np; i++) {
        char path[32];
        if (list) snprintf(path, sizeof path, "prompt[%zu]", i);
        else snprintf(path, sizeof path, "prompt");
        if (completion_prompt(list ? json_array_get(p, i) : p, path, r, (int)i, e) < 0) goto fail;
    }
    return 0;
fail:
    srv_gen_req_free(r);
    return -1;
}

/* ---- non-streaming responses ---- */

static json_t *meta_object(const srv_resp_meta *m, const char *object) {
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(m->id));
    json_object_set_new(o, "object", json_string(object));
    json_object_set_new(o, "created", json_integer(m->created));
    json_object_set_new(o, "model", srv_json_text(m->model, strlen(m->model)));
    json_object_set_new(o, "system_fingerprint", json_string("cinfer-" CINFER_VERSION));
    return o;
}

static json_t *tool_calls_json(const srv_choice *c) {
    json_t *a = json_array();
    for (int i = 0; i < c->n_calls; i++) {
        const srv_tool_call *t = &c->calls[i];
        json_t *f = json_object();
        json_object_set_new(f, "name", srv_json_text(t->name, t->name ? strlen(t->name) : 0));
        json_object_set_new(f, "arguments", srv_json_text(t->args.data ? t->args.data : "{}", t->args.data ? t->args.len : 2));
        json_t *o = json_object();
        json_object_set_new(o, "id", srv_json_text(t->id ? t->id : "", t->id ? strlen(t->id) : 0));
        json_object_set_new(o, "type", json_string("function"));
        json_object_set_new(o, "function", f);
        json_array_append_new(a, o);
    }
    return a;
}

char *oai_chat_response(const srv_resp_meta *m, const srv_choice *ch, int n_choices) {
    json_t *o = meta_object(m, "chat.completion");
    json_t *choices = json_array();
    int n_per_prompt = n_choices; /* chat has one prompt */
    for (int i = 0; i < n_choices; i++) {
        const srv_choice *c = &ch[i];
        json_t *msg = json_object();
        json_object_set_new(msg, "role", json_string("assistant"));
        /* OpenAI sends null content when the answer is only tool calls. */
        if (c->content.len || !c->n_calls) json_object_set_new(msg, "content", srv_json_text(c->content.data, c->content.len));
        else json_object_set_new(msg, "content", json_null());
        if (c->reasoning.len) json_object_set_new(msg, "reasoning_content", srv_json_text(c->reasoning.data, c->reasoning.len));
        if (c->n_calls) json_object_set_new(msg, "tool_calls", tool_calls_json(c));
        json_t *co = json_object();
        json_object_set_new(co, "index", json_integer(c->index));
        json_object_set_new(co, "message", msg);
        if (c->logprobs) {
            json_t *lp = json_object();
            json_object_set(lp, "content", c->logprobs);
            json_object_set_new(co, "logprobs", lp);
        } else
            json_object_set_new(co, "logprobs", json_null());
        json_object_set_new(co, "finish_reason", json_string(c->finish_reason[0] ? c->finish_reason : "stop"));
        json_array_append_new(choices, co);
    }
    json_object_set_new(o, "choices", choices);
    json_object_set_new(o, "usage", oai_usage(ch, n_choices, n_per_prompt));
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* Completions logprobs: {"tokens","token_logprobs","top_logprobs":[{token: logprob}],"text_offset"} from
 * the chat-shaped entries the accumulator keeps. */
json_t *oai_completion_logprobs(const json_t *entries, size_t *offset) {
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    size_t i;
    const json_t *en;
    json_array_foreach(entries, i, en) {
        json_array_append(tokens, json_object_get(en, "token"));
        json_array_append(lps, json_object_get(en, "logprob"));
        json_t *top = json_object();
        size_t k;
        const json_t *t;
        json_array_foreach(json_object_get(en, "top_logprobs"), k, t) {
            json_object_set(top, json_string_value(json_object_get(t, "token")), json_object_get(t, "logprob"));
        }
        json_array_append_new(tops, top);
        json_array_append_new(offs, json_integer((json_int_t)*offset));
        *offset += json_array_size(json_object_get(en, "bytes"));
    }
    json_t *o = json_object();
    json_object_set_new(o, "tokens", tokens);
    json_object_set_new(o, "token_logprobs", lps);
    json_object_set_new(o, "top_logprobs", tops);
    json_object_set_new(o, "text_offset", offs);
    return o;
}

char *oai_completion_response(const srv_resp_meta *m, const srv_choice *ch, int n_choices, int n_per_prompt) {
    json_t *o = meta_object(m, "text_completion");
    json_t *choices = json_array();
    for (int i = 0; i < n_choices; i++) {
        const srv_choice *c = &ch[i];
        json_t *co = json_object();
        json_object_set_new(co, "index", json_integer(c->index));
        json_object_set_new(co, "text", srv_json_text(c->content.data, c->content.len));
        if (c->logprobs) {
            size_t off = 0;
            json_object_set_new(co, "logprobs", oai_completion_logprobs(c->logprobs, &off));
        } else
            json_object_set_new(co, "logprobs", json_null());
        json_object_set_new(co, "finish_reason", json_string(c->finish_reason[0] ? c->finish_reason : "stop"));
        json_array_append_new(choices, co);
    }
    json_object_set_new(o, "choices", choices);
    json_object_set_new(o, "usage", oai_usage(ch, n_choices, n_per_prompt));
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

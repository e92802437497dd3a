/* template.c — the public face of the chat-template interpreter (template.h): compile, render with a JSON
 * context, build that context like transformers' apply_chat_template, and find a model folder's template. */
#include "tok/template.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "tok/jinja.h"
#include "util/alloc.h"
#include "util/err.h"
#include "util/file.h"

struct tmpl {
    jtemplate t;
};

int tmpl_compile(const char *src, size_t len, tmpl **out, char *err, size_t errlen) {
    *out = NULL;
    if (!src && len) return ci_err(err, errlen, CINFER_EINVAL, "template: no source");
    tmpl *t = xcalloc(1, sizeof *t);
    /* the AST of a template is a few times its source; the budget only stops absurd inputs */
    ja_init(&t->t.arena, 64u * 1024 * 1024 + len * 64);
    int rc = jinja_parse(&t->t, src ? src : "", len, err, errlen);
    if (rc) {
        ja_free(&t->t.arena);
        free(t);
        return rc;
    }
    *out = t;
    return 0;
}

void tmpl_free(tmpl *t) {
    if (!t) return;
    ja_free(&t->t.arena);
    free(t);
}

tmpl_opts tmpl_default_opts(void) {
    tmpl_opts o;
    o.max_output = 16u << 20;
    o.max_memory = 256u << 20;
    o.max_depth = 500;
    o.max_iters = 10000000;
    o.now = 0;
    return o;
}

int tmpl_render_opts(const tmpl *t, const char *ctx_json, size_t len, const tmpl_opts *opts, char **out,
                     size_t *outlen, char *err, size_t errlen) {
    *out = NULL;
    if (outlen) *outlen = 0;
    tmpl_opts o = opts ? *opts : tmpl_default_opts();
    json_error_t je;
    json_t *root = json_loadb(ctx_json ? ctx_json : "{}", ctx_json ? len : 2, JSON_ALLOW_NUL, &je);
    if (!root) return ci_err(err, errlen, CINFER_EFORMAT, "template context: %d:%d: %s", je.line, je.column, je.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return ci_err(err, errlen, CINFER_EFORMAT, "template context: not a JSON object");
    }
    jarena a;
    ja_init(&a, o.max_memory);
    jmp_buf jb;
    a.fail = &jb;
    a.err = err;
    a.errlen = errlen;
    if (setjmp(jb)) {
        json_decref(root);
        ja_free(&a);
        return CINFER_ERANGE;
    }
    jv ctx = jv_from_json(&a, root);
    json_decref(root);
    root = NULL;
    jlimits lim = {o.max_output, o.max_memory, o.max_depth, o.max_iters};
    char *res;
    size_t n;
    int rc = jinja_render(&t->t, &a, ctx, &lim, o.now, &res, &n, err, errlen);
    if (rc == 0) {
        *out = malloc(n + 1);
        if (!*out) {
            rc = ci_err(err, errlen, CINFER_ENOMEM, "template: out of memory for %zu bytes", n);
        } else {
            memcpy(*out, res, n);
            (*out)[n] = 0;
            if (outlen) *outlen = n;
        }
    }
    ja_free(&a);
    return rc;
}

int tmpl_render(const tmpl *t, const char *ctx_json, size_t len, char **out, char *err, size_t errlen) {
    return tmpl_render_opts(t, ctx_json, len, NULL, out, NULL, err, errlen);
}

static void add_special_tokens(json_t *ctx, json_t *cfg);

static json_t *parse_json(const char *what, const char *s, char *err, size_t errlen, int *rc) {
    json_error_t je;
    json_t *j = json_loads(s, JSON_ALLOW_NUL, &je);
    if (!j) *rc = ci_err(err, errlen, CINFER_EFORMAT, "%s: %d:%d: %s", what, je.line, je.column, je.text);
    return j;
}

int tmpl_build_context(const char *messages_json, const char *tools_json, int add_generation_prompt,
                       const char *tokenizer_config_json, const char *kwargs_json, char **out, char *err,
                       size_t errlen) {
    *out = NULL;
    int rc = 0;
    json_t *ctx = json_object();
    json_t *msgs = NULL, *tools = NULL, *cfg = NULL, *kw = NULL;
    if (!messages_json) {
        rc = ci_err(err, errlen, CINFER_EINVAL, "messages: missing");
        goto done;
    }
    if (!(msgs = parse_json("messages", messages_json, err, errlen, &rc))) goto done;
    /* a file holding {"messages": [...]} is accepted too */
    if (json_is_object(msgs) && json_is_array(json_object_get(msgs, "messages"))) {
        json_t *inner = json_incref(json_object_get(msgs, "messages"));
        json_decref(msgs);
        msgs = inner;
    }
    if (!json_is_array(msgs)) {
        rc = ci_err(err, errlen, CINFER_EFORMAT, "messages: expected a JSON array");
        goto done;
    }
    if (tools_json) {
        if (!(tools = parse_json("tools", tools_json, err, errlen, &rc))) goto done;
        if (!json_is_array(tools) && !json_is_null(tools)) {
            rc = ci_err(err, errlen, CINFER_EFORMAT, "tools: expected a JSON array");
            goto done;
        }
    }
    if (tokenizer_config_json) {
        if (!(cfg = parse_json("tokenizer_config.json", tokenizer_config_json, err, errlen, &rc))) goto done;
        add_special_tokens(ctx, cfg);
    }
    if (kwargs_json) {
        if (!(kw = parse_json("kwargs", kwargs_json, err, errlen, &rc))) goto done;
        if (!json_is_object(kw)) {
            rc = ci_err(err, errlen, CINFER_EFORMAT, "kwargs: expected a JSON object");
            goto done;
        }
        json_object_update(ctx, kw);
    }
    json_object_set(ctx, "messages", msgs);
    json_object_set_new(ctx, "tools", tools ? json_incref(tools) : json_null());
    json_object_set_new(ctx, "documents", json_null());
    json_object_set_new(ctx, "add_generation_prompt", json_boolean(add_generation_prompt));
    *out = json_dumps(ctx, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!*out) rc = ci_err(err, errlen, CINFER_ENOMEM, "context: cannot encode");
done:
    json_decref(ctx);
    if (msgs) json_decref(msgs);
    if (tools) json_decref(tools);
    if (cfg) json_decref(cfg);
    if (kw) json_decref(kw);
    return rc;
}

static void add_special_tokens(json_t *ctx, json_t *cfg) {
    static const char *const names[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                        "pad_token", "cls_token", "mask_token"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        json_t *v = json_object_get(cfg, names[i]);
        if (json_is_object(v)) v = json_object_get(v, "content"); /* AddedToken */
        if (json_is_string(v)) json_object_set(ctx, names[i], v);
    }
}

int tmpl_context_merge(const char *ctx_json, size_t len, const char *tokenizer_config_json, char **out, char *err,
                       size_t errlen) {
    *out = NULL;
    json_error_t je;
    json_t *user = json_loadb(ctx_json ? ctx_json : "{}", ctx_json ? len : 2, JSON_ALLOW_NUL, &je);
    if (!user) return ci_err(err, errlen, CINFER_EFORMAT, "template context: %d:%d: %s", je.line, je.column, je.text);
    if (!json_is_object(user)) {
        json_decref(user);
        return ci_err(err, errlen, CINFER_EFORMAT, "template context: not a JSON object");
    }
    json_t *ctx = json_object();
    int rc = 0;
    if (tokenizer_config_json) {
        json_t *cfg = json_loads(tokenizer_config_json, JSON_ALLOW_NUL, &je);
        if (!cfg) {
            rc = ci_err(err, errlen, CINFER_EFORMAT, "tokenizer_config.json: %d:%d: %s", je.line, je.column, je.text);
            goto done;
        }
        add_special_tokens(ctx, cfg);
        json_decref(cfg);
    }
    json_object_update(ctx, user);
    if (!json_object_get(ctx, "tools")) json_object_set_new(ctx, "tools", json_null());
    if (!json_object_get(ctx, "documents")) json_object_set_new(ctx, "documents", json_null());
    if (!json_object_get(ctx, "add_generation_prompt")) json_object_set_new(ctx, "add_generation_prompt", json_false());
    *out = json_dumps(ctx, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!*out) rc = ci_err(err, errlen, CINFER_ENOMEM, "context: cannot encode");
done:
    json_decref(ctx);
    json_decref(user);
    return rc;
}

#define MAX_CFG_BYTES (64u << 20)

/* A chat_template value: a string, or a list of {name, template} of which "default" is used. */
static int pick_template(json_t *v, const char *where, char **src, size_t *len, char *err, size_t errlen) {
    if (json_is_string(v)) {
        *len = json_string_length(v);
        *src = xstrndup(json_string_value(v), *len);
        return 0;
    }
    if (json_is_array(v)) {
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) {
            json_t *nm = json_object_get(e, "name"), *tp = json_object_get(e, "template");
            if (json_is_string(nm) && !strcmp(json_string_value(nm), "default") && json_is_string(tp)) {
                *len = json_string_length(tp);
                *src = xstrndup(json_string_value(tp), *len);
                return 0;
            }
        }
        return ci_err(err, errlen, CINFER_ENOTFOUND, "%s: chat_template has no \"default\" entry", where);
    }
    return ci_err(err, errlen, CINFER_EFORMAT, "%s: chat_template is neither a string nor a list", where);
}

int tmpl_load_dir(const char *dir, char **src, size_t *len, char **tokenizer_config, char *err, size_t errlen) {
    *src = NULL;
    *len = 0;
    if (tokenizer_config) *tokenizer_config = NULL;
    char *cfg_text = NULL;
    size_t cfg_len = 0;
    int rc = 0;
    char *p = path_join(dir, "tokenizer_config.json");
    if (file_exists(p)) {
        rc = file_read_all(p, MAX_CFG_BYTES, &cfg_text, &cfg_len, err, errlen);
        if (rc) {
            free(p);
            return rc;
        }
    }
    free(p);

    p = path_join(dir, "chat_template.jinja");
    if (file_exists(p)) {
        char *s;
        size_t n;
        rc = file_read_all(p, MAX_CFG_BYTES, &s, &n, err, errlen);
        free(p);
        if (rc) goto fail;
        *src = s;
        *len = n;
        goto ok;
    }
    free(p);

    p = path_join(dir, "chat_template.json");
    if (file_exists(p)) {
        char *s;
        size_t n;
        rc = file_read_all(p, MAX_CFG_BYTES, &s, &n, err, errlen);
        if (rc) {
            free(p);
            goto fail;
        }
        json_error_t je;
        json_t *j = json_loadb(s, n, JSON_ALLOW_NUL, &je);
        free(s);
        if (!j) {
            rc = ci_err(err, errlen, CINFER_EFORMAT, "%s: %d:%d: %s", p, je.line, je.column, je.text);
            free(p);
            goto fail;
        }
        rc = pick_template(json_object_get(j, "chat_template"), p, src, len, err, errlen);
        json_decref(j);
        free(p);
        if (rc) goto fail;
        goto ok;
    }
    free(p);

    if (!cfg_text) {
        rc = ci_err(err, errlen, CINFER_ENOTFOUND, "%s: no chat_template.jinja, chat_template.json or tokenizer_config.json", dir);
        goto fail;
    }
    {
        json_error_t je;
        json_t *j = json_loadb(cfg_text, cfg_len, JSON_ALLOW_NUL, &je);
        if (!j) {
            rc = ci_err(err, errlen, CINFER_EFORMAT, "tokenizer_config.json: %d:%d: %s", je.line, je.column, je.text);
            goto fail;
        }
        json_t *ct = json_object_get(j, "chat_template");
        if (!ct) {
            json_decref(j);
            rc = ci_err(err, errlen, CINFER_ENOTFOUND, "%s: tokenizer_config.json has no chat_template", dir);
            goto fail;
        }
        rc = pick_template(ct, "tokenizer_config.json", src, len, err, errlen);
        json_decref(j);
        if (rc) goto fail;
    }
ok:
    if (tokenizer_config)
        *tokenizer_config = cfg_text;
    else
        free(cfg_text);
    return 0;
fail:
    free(cfg_text);
    return rc;
}

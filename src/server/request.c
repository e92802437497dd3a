/* request.c — request-side pieces shared by the APIs: body parsing with a nesting bound, typed field
 * readers that name the field at fault, sampling/stop/tools validation, the chat template context, and
 * the prompt facts (reasoning mode, tool-call syntax) the engine needs. Pure functions over JSON. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "server/api.h"
#include "server/req_util.h"
#include "util/base64.h"
#include "util/alloc.h"

int srv_fail(srv_error *e, int status, const char *param, const char *fmt, ...) {
    e->status = status;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    e->code[0] = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

void srv_defaults_init(srv_defaults *d) {
    memset(d, 0, sizeof *d);
    d->temperature = -1;
    d->top_p = -1;
    d->top_k = -1;
    d->min_p = -1;
    d->repetition_penalty = -1;
    d->max_images = SRV_MAX_IMAGES;
    d->max_image_bytes = SRV_MAX_IMAGE_BYTES;
    d->max_image_pixels = SRV_MAX_IMAGE_PIXELS;
}

/* The neutral values of cinfer.h's cinfer_sampling, written out here rather than taken from
 * cinfer_sampling_default(): parsing must not need a running engine (tests, fuzzing). */
cinfer_sampling srv_sampling_base(const srv_defaults *d) {
    cinfer_sampling s;
    memset(&s, 0, sizeof s);
    s.temperature = 1.0f;
    s.top_p = 1.0f;
    s.repetition_penalty = 1.0f;
    s.repeat_last_n = 64;
    s.n_logprobs = -1;
    if (d) {
        if (d->temperature >= 0) s.temperature = d->temperature;
        if (d->top_p >= 0) s.top_p = d->top_p;
        if (d->top_k >= 0) s.top_k = d->top_k;
        if (d->min_p >= 0) s.min_p = d->min_p;
        if (d->repetition_penalty > 0) s.repetition_penalty = d->repetition_penalty;
    }
    return s;
}

void srv_gen_req_free(srv_gen_req *r) {
    free(r->model);
    for (int i = 0; i < r->n_prompts; i++) {
        if (r->prompt_text) free(r->prompt_text[i]);
        if (r->prompt_ids) free(r->prompt_ids[i]);
    }
    free(r->prompt_text);
    free(r->prompt_ids);
    free(r->n_prompt_ids);
    free(r->template_ctx);
    free(r->constraint_arg);
    free(r->logit_bias);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    free(r->tools_json);
    for (int i = 0; i < r->n_images; i++) free(r->images[i].data);
    free(r->images);
    memset(r, 0, sizeof *r);
}

int srv_parse_body(const char *data, size_t size, int max_depth, json_t **out, srv_error *e) {
    *out = NULL;
    /* Depth first, before jansson builds anything: its recursive descent has its own limit (2048), far
     * past what a request needs, and a deep body should cost nothing to refuse. Brackets inside strings
     * do not count; escapes are skipped so \" does not end a string. */
    int depth = 0, in_str = 0;
    for (size_t i = 0; i < size; i++) {
        char c = data[i];
        if (in_str) {
            if (c == '\\') i++;
            else if (c == '"') in_str = 0;
            continue;
        }
        if (c == '"') in_str = 1;
        else if (c == '[' || c == '{') {
            if (++depth > max_depth)
                return srv_fail(e, 400, "", "request body nests deeper than %d levels (at byte %zu)", max_depth, i);
        } else if (c == ']' || c == '}')
            depth--;
    }
    json_error_t je;
    json_t *j = json_loadb(data, size, JSON_REJECT_DUPLICATES, &je);
    if (!j) return srv_fail(e, 400, "", "invalid JSON in request body: %s (line %d, column %d)", je.text, je.line, je.column);
    if (!json_is_object(j)) {
        json_decref(j);
        return srv_fail(e, 400, "", "request body must be a JSON object");
    }
    *out = j;
    return 0;
}

/* ---- field readers ---- */

static const json_t *ru_get(const json_t *o, const char *key) {
    const json_t *v = json_object_get(o, key);
    return (v && !json_is_null(v)) ? v : NULL;
}

int ru_bool(const json_t *o, const char *key, int *out, srv_error *e) {
    const json_t *v = ru_get(o, key);
    if (!v) return 0;
    if (!json_is_boolean(v)) return srv_fail(e, 400, key, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 1;
}

int ru_int(const json_t *o, const char *key, long long lo, long long hi, long long *out, srv_error *e) {
    const json_t *v = ru_get(o, key);
    if (!v) return 0;
    long long x;
    if (json_is_integer(v)) x = (long long)json_integer_value(v);
    else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) && fabs(json_real_value(v)) < 9e15)
        x = (long long)json_real_value(v);
    else
        return srv_fail(e, 400, key, "'%s' must be an integer", key);
    if (x < lo || x > hi) return srv_fail(e, 400, key, "'%s' must be in [%lld, %lld], got %lld", key, lo, hi, x);
    *out = x;
    return 1;
}

int ru_num(const json_t *o, const char *key, double lo, double hi, double *out, srv_error *e) {
    const json_t *v = ru_get(o, key);
    if (!v) return 0;
    if (!json_is_number(v)) return srv_fail(e, 400, key, "'%s' must be a number", key);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) return srv_fail(e, 400, key, "'%s' must be in [%g, %g], got %g", key, lo, hi, x);
    *out = x;
    return 1;
}

int ru_str(const json_t *o, const char *key, const char **out, srv_error *e) {
    const json_t *v = ru_get(o, key);
    if (!v) return 0;
    if (!json_is_string(v)) return srv_fail(e, 400, key, "'%s' must be a string", key);
    *out = json_string_value(v);
    return 1;
}

int ru_sampling(const json_t *body, srv_gen_req *r, srv_error *e) {
    cinfer_sampling *s = &r->sampling;
    double x;
    long long k;
    int rc;
    if ((rc = ru_num(body, "temperature", 0, 100, &x, e)) < 0) return -1;
    if (rc) s->temperature = (float)x;
    if ((rc = ru_num(body, "top_p", 0, 1, &x, e)) < 0) return -1;
    if (rc) {
        if (x <= 0) return srv_fail(e, 400, "top_p", "'top_p' must be in (0, 1], got %g", x);
        s->top_p = (float)x;
    }
    /* top_k -1 is llama-server's "off"; 0 is off here too. */
    if ((rc = ru_int(body, "top_k", -1, 1 << 30, &k, e)) < 0) return -1;
    if (rc) s->top_k = k < 0 ? 0 : (int)k;
    if ((rc = ru_num(body, "min_p", 0, 1, &x, e)) < 0) return -1;
    if (rc) s->min_p = (float)x;
    if ((rc = ru_num(body, "presence_penalty", -2, 2, &x, e)) < 0) return -1;
    if (rc) s->presence_penalty = (float)x;
    if ((rc = ru_num(body, "frequency_penalty", -2, 2, &x, e)) < 0) return -1;
    if (rc) s->frequency_penalty = (float)x;
    if ((rc = ru_num(body, "repetition_penalty", 0, 10, &x, e)) < 0) return -1;
    if (rc) {
        if (x <= 0) return srv_fail(e, 400, "repetition_penalty", "'repetition_penalty' must be > 0, got %g", x);
        s->repetition_penalty = (float)x;
    }
    /* The window of the repetition penalty: llama-server's repeat_last_n, mlx-lm's
     * repetition_context_size. */
    if ((rc = ru_int(body, "repeat_last_n", -1, 1 << 30, &k, e)) < 0) return -1;
    if (rc) s->repeat_last_n = (int)k;
    if ((rc = ru_int(body, "repetition_context_size", 0, 1 << 30, &k, e)) < 0) return -1;
    if (rc) s->repeat_last_n = (int)k;
    if ((rc = ru_num(body, "xtc_probability", 0, 1, &x, e)) < 0) return -1;
    if (rc) s->xtc_probability = (float)x;
    if ((rc = ru_num(body, "xtc_threshold", 0, 1, &x, e)) < 0) return -1;
    if (rc) s->xtc_threshold = (float)x;
    const json_t *seed = ru_get(body, "seed");
    if (seed) {
        if (!json_is_integer(seed)) return srv_fail(e, 400, "seed", "'seed' must be an integer");
        s->seed = (uint64_t)json_integer_value(seed);
        s->has_seed = 1;
    }
    int b;
    if ((rc = ru_bool(body, "ignore_eos", &b, e)) < 0) return -1;
    if (rc) r->ignore_eos = b;

    const json_t *lb = ru_get(body, "logit_bias");
    if (lb) {
        if (!json_is_object(lb)) return srv_fail(e, 400, "logit_bias", "'logit_bias' must be an object of token id -> bias");
        size_t n = json_object_size(lb);
        if (n > SRV_MAX_LOGIT_BIAS)
            return srv_fail(e, 400, "logit_bias", "'logit_bias' has %zu entries, at most %d", n, SRV_MAX_LOGIT_BIAS);
        r->logit_bias = n ? xcalloc(n, sizeof *r->logit_bias) : NULL;
        int i = 0;
        const char *key;
        const json_t *val;
        json_object_foreach((json_t *)lb, key, val) {
            char *end;
            errno = 0;
            long id = strtol(key, &end, 10);
            if (!*key || *end || errno || id < 0 || id > INT32_MAX)
                return srv_fail(e, 400, "logit_bias", "'logit_bias' key \"%.40s\" is not a token id", key);
            if (!json_is_number(val) || !(json_number_value(val) >= -100 && json_number_value(val) <= 100))
                return srv_fail(e, 400, "logit_bias", "'logit_bias' value for token %ld must be a number in [-100, 100]", id);
            r->logit_bias[i].token = (int32_t)id;
            r->logit_bias[i].bias = (float)json_number_value(val);
            i++;
        }
        s->logit_bias = r->logit_bias;
        s->n_logit_bias = i;
    }
    return 0;
}

int ru_stop(const json_t *body, const char *key, srv_gen_req *r, srv_error *e) {
    const json_t *v = ru_get(body, key);
    if (!v) return 0;
    const json_t *one = json_is_string(v) ? v : NULL;
    if (!one && !json_is_array(v)) return srv_fail(e, 400, key, "'%s' must be a string or an array of strings", key);
    size_t n = one ? 1 : json_array_size(v);
    if (n > SRV_MAX_STOP) return srv_fail(e, 400, key, "'%s' has %zu strings, at most %d", key, n, SRV_MAX_STOP);
    r->stop = n ? xcalloc(n, sizeof *r->stop) : NULL;
    for (size_t i = 0; i < n; i++) {
        const json_t *s = one ? one : json_array_get(v, i);
        if (!json_is_string(s)) return srv_fail(e, 400, key, "'%s[%zu]' must be a string", key, i);
        size_t len = json_string_length(s);
        if (len == 0) return srv_fail(e, 400, key, "'%s[%zu]' is empty", key, i);
        if (len > SRV_MAX_STOP_LEN) return srv_fail(e, 400, key, "'%s[%zu]' is %zu bytes, at most %d", key, i, len, SRV_MAX_STOP_LEN);
        if (memchr(json_string_value(s), 0, len)) return srv_fail(e, 400, key, "'%s[%zu]' contains a NUL byte", key, i);
        r->stop[r->n_stop++] = xstrndup(json_string_value(s), len);
    }
    return 0;
}

int ru_tools(const json_t *tools, const char *key, srv_error *e) {
    if (!json_is_array(tools)) return srv_fail(e, 400, key, "'%s' must be an array", key);
    if (json_array_size(tools) > 256) return srv_fail(e, 400, key, "'%s' has more than 256 tools", key);
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        char path[64];
        snprintf(path, sizeof path, "%s[%zu]", key, i);
        if (!json_is_object(t)) return srv_fail(e, 400, path, "'%s' must be an object", path);
        const json_t *type = json_object_get(t, "type");
        if (type && !(json_is_string(type) && !strcmp(json_string_value(type), "function")))
            return srv_fail(e, 400, path, "'%s.type' must be \"function\"", path);
        const json_t *f = json_object_get(t, "function");
        if (!json_is_object(f)) return srv_fail(e, 400, path, "'%s.function' must be an object", path);
        const json_t *name = json_object_get(f, "name");
        if (!json_is_string(name) || !json_string_length(name))
            return srv_fail(e, 400, path, "'%s.function.name' must be a non-empty string", path);
        const json_t *params = json_object_get(f, "parameters");
        if (params && !json_is_null(params) && !json_is_object(params))
            return srv_fail(e, 400, path, "'%s.function.parameters' must be an object (a JSON schema)", path);
    }
    return 0;
}

char *ru_template_ctx(json_t *messages, json_t *tools, const json_t *server_args, const json_t *extra) {
    json_t *ctx = json_object();
    json_object_set_new(ctx, "messages", messages);
    if (tools) json_object_set_new(ctx, "tools", tools);
    json_object_set_new(ctx, "add_generation_prompt", json_true());
    /* The request's kwargs win over the server's, and neither may replace what the request itself
     * carries (messages, tools). */
    const json_t *layers[2] = {server_args, extra};
    for (int l = 0; l < 2; l++) {
        if (!json_is_object(layers[l])) continue;
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)layers[l], k, v) {
            if (!strcmp(k, "messages") || !strcmp(k, "tools")) continue;
            json_object_set(ctx, k, v);
        }
    }
    char *s = json_dumps(ctx, JSON_COMPACT);
    json_decref(ctx);
    return s;
}

int ru_image_b64(const char *mime, size_t mime_len, const char *b64, size_t b64_len, const char *path, srv_gen_req *r,
                 const srv_defaults *d, srv_error *e) {
    int max_images = d && d->max_images > 0 ? d->max_images : SRV_MAX_IMAGES;
    size_t max_bytes = d && d->max_image_bytes > 0 ? d->max_image_bytes : SRV_MAX_IMAGE_BYTES;
    if (mime_len && (mime_len < 6 || strncasecmp(mime, "image/", 6)))
        return srv_fail(e, 400, path, "'%s': media type \"%.*s\" is not an image", path, (int)(mime_len > 64 ? 64 : mime_len),
                        mime);
    if (r->n_images >= max_images)
        return srv_fail(e, 400, path, "'%s': more than %d images in one request", path, max_images);
    size_t cap = b64_decoded_max(b64_len);
    if (cap > max_bytes + 3) cap = max_bytes + 3; /* b64_decode reports ERANGE past it */
    unsigned char *buf = malloc(cap ? cap : 1);
    if (!buf) return srv_fail(e, 500, path, "out of memory decoding '%s'", path);
    size_t n = 0;
    char err[160];
    int rc = b64_decode(b64, b64_len, buf, cap, &n, err, sizeof err);
    if (rc == CINFER_ERANGE || (rc == 0 && n > max_bytes)) {
        free(buf);
        return srv_fail(e, 400, path, "'%s': the image is over the limit of %zu bytes", path, max_bytes);
    }
    if (rc) {
        free(buf);
        return srv_fail(e, 400, path, "'%s': %s", path, err);
    }
    if (n == 0) {
        free(buf);
        return srv_fail(e, 400, path, "'%s': the image is empty", path);
    }
    r->images = xrealloc(r->images, (size_t)(r->n_images + 1) * sizeof *r->images);
    r->images[r->n_images].data = buf;
    r->images[r->n_images].len = n;
    r->n_images++;
    return 0;
}

/* An image given by URL: only data: URLs with a base64 payload; the server never fetches anything. */
static int image_url(const json_t *url, const char *path, srv_gen_req *r, const srv_defaults *d, srv_error *e) {
    if (!json_is_string(url)) return srv_fail(e, 400, path, "'%s' must be a string (a data: URL)", path);
    const char *u = json_string_value(url), *mime, *b64;
    size_t n = json_string_length(url), ml, bl;
    char err[160];
    if (n < 5 || strncasecmp(u, "data:", 5))
        return srv_fail(e, 400, path,
                        "'%s': only data: URLs (base64) are accepted; this server does not fetch remote images or read files",
                        path);
    if (data_url_split(u, n, &mime, &ml, &b64, &bl, err, sizeof err)) return srv_fail(e, 400, path, "'%s': %s", path, err);
    return ru_image_b64(mime, ml, b64, bl, path, r, d, e);
}

json_t *ru_content(const json_t *content, const char *path, srv_gen_req *r, const srv_defaults *d, srv_error *e) {
    if (!content || json_is_null(content)) return json_null();
    if (json_is_string(content)) return json_incref((json_t *)content);
    if (!json_is_array(content)) {
        srv_fail(e, 400, path, "'%s' must be a string, an array of content parts, or null", path);
        return NULL;
    }
    json_t *out = json_array();
    size_t i;
    const json_t *p;
    json_array_foreach(content, i, p) {
        const json_t *type = json_is_object(p) ? json_object_get(p, "type") : NULL;
        const char *t = json_is_string(type) ? json_string_value(type) : NULL;
        const json_t *text = json_is_object(p) ? json_object_get(p, "text") : NULL;
        char ppath[96];
        snprintf(ppath, sizeof ppath, "%s[%zu]", path, i);
        if (json_is_object(p) && (!t || !strcmp(t, "text") || !strcmp(t, "input_text")) && json_is_string(text)) {
            json_array_append(out, (json_t *)p);
            continue;
        }
        if (t && (!strcmp(t, "image_url") || !strcmp(t, "input_image"))) {
            /* chat: {"image_url": {"url": ...}} (or a bare string); responses-style: {"image_url": "..."} */
            const json_t *iu = json_object_get(p, "image_url");
            const json_t *url = json_is_object(iu) ? json_object_get(iu, "url") : iu;
            char upath[112];
            snprintf(upath, sizeof upath, "%s.image_url%s", ppath, json_is_object(iu) ? ".url" : "");
            if (!url || image_url(url, upath, r, d, e) < 0) {
                if (!url) srv_fail(e, 400, ppath, "'%s' needs an image_url", ppath);
                json_decref(out);
                return NULL;
            }
            json_t *img = json_object();
            json_object_set_new(img, "type", json_string("image"));
            json_array_append_new(out, img);
            continue;
        }
        json_decref(out);
        if (t && (!strcmp(t, "image") || !strcmp(t, "input_audio") || !strcmp(t, "video") || !strcmp(t, "file"))) {
            srv_fail(e, 400, path, "'%s': %s input is not supported by this server (images: image_url parts)", ppath, t);
            return NULL;
        }
        srv_fail(e, 400, path, "'%s' must be a text part {\"type\":\"text\",\"text\":...} or an image_url part", ppath);
        return NULL;
    }
    return out;
}

/* ---- prompt facts ---- */

int srv_reasoning_mode(const char *prompt, size_t len) {
    /* The last <think> opened and not closed after it: the template left the model inside its
     * reasoning. */
    const char *open = NULL;
    for (const char *p = prompt; (p = memmem(p, len - (size_t)(p - prompt), "<think>", 7)); p += 7) open = p;
    if (!open) return 2;
    const char *after = open + 7;
    if (memmem(after, len - (size_t)(after - prompt), "</think>", 8)) return 2;
    return 1;
}

cinfer_tool_format srv_tool_format(const char *tmpl) {
    if (!tmpl) return CINFER_TOOLS_NONE;
    if (strstr(tmpl, "<function=")) return CINFER_TOOLS_QWEN_XML;
    if (strstr(tmpl, "<tool_call>")) return CINFER_TOOLS_HERMES_JSON;
    return CINFER_TOOLS_NONE;
}

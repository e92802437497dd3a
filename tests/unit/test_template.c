/* test_template.c — the chat-template interpreter: every transformers golden byte for byte
 * (tests/fixtures/templates/goldens.jsonl), then the language features one by one against values checked with
 * Python's jinja2 in transformers' environment: loop variables, scoping, namespace, macros, slicing, filters,
 * tests, methods, whitespace control, Python-style printing, errors with positions, limits. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "test.h"
#include "tok/template.h"
#include "util/err.h"
#include "util/file.h"

/* Renders src with ctx_json; returns the output (static buffer) or "ERR:<code>:<message>". */
static char *render_ex(const char *src, const char *ctx_json, const tmpl_opts *o) {
    static char *last;
    free(last);
    last = NULL;
    char err[512] = {0};
    tmpl *t = NULL;
    int rc = tmpl_compile(src, strlen(src), &t, err, sizeof err);
    if (rc == 0) {
        char *out = NULL;
        rc = tmpl_render_opts(t, ctx_json ? ctx_json : "{}", ctx_json ? strlen(ctx_json) : 2, o, &out, NULL, err, sizeof err);
        tmpl_free(t);
        if (rc == 0) {
            last = out;
            return last;
        }
    }
    if (asprintf(&last, "ERR:%d:%s", rc, err) < 0) last = NULL;
    return last;
}

__attribute__((unused)) static char *render(const char *src, const char *ctx_json) { return render_ex(src, ctx_json, NULL); }

#define CHECK_RENDER(src, ctx, want)                                                                        \
    do {                                                                                                    \
        const char *_got = render(src, ctx);                                                                \
        if (!_got || strcmp(_got, want))                                                                    \
            test_fail(__FILE__, __LINE__, "render(%s)\n   got: [%s]\n  want: [%s]", src, _got ? _got : "(null)", want); \
    } while (0)

/* ---- goldens ---- */
typedef struct cached {
    char name[64];
    tmpl *t;
    char *tokens;
} cached;

static time_t parse_now(const char *s) {
    struct tm tmv;
    memset(&tmv, 0, sizeof tmv);
    if (!s || sscanf(s, "%d-%d-%d %d:%d:%d", &tmv.tm_year, &tmv.tm_mon, &tmv.tm_mday, &tmv.tm_hour, &tmv.tm_min, &tmv.tm_sec) != 6)
        return 0;
    tmv.tm_year -= 1900;
    tmv.tm_mon -= 1;
    tmv.tm_isdst = -1;
    return mktime(&tmv);
}

TEST(template_goldens_match_transformers) {
    char path[512];
    snprintf(path, sizeof path, "%s/templates/goldens.jsonl", test_fixtures_dir());
    FILE *f = fopen(path, "r");
    REQUIRE(f != NULL);
    cached cache[32];
    int ncache = 0;
    char *line = NULL;
    size_t cap = 0;
    int n = 0, ok = 0, n_err = 0, err_ok = 0, err_msg_ok = 0, shown = 0;
    while (getline(&line, &cap, f) > 0) {
        json_error_t je;
        json_t *g = json_loads(line, 0, &je);
        REQUIRE(g != NULL);
        const char *tname = json_string_value(json_object_get(g, "template"));
        const char *cname = json_string_value(json_object_get(g, "conversation"));
        cached *c = NULL;
        for (int i = 0; i < ncache; i++)
            if (!strcmp(cache[i].name, tname)) c = &cache[i];
        if (!c) {
            REQUIRE(ncache < 32);
            c = &cache[ncache++];
            snprintf(c->name, sizeof c->name, "%s", tname);
            char p[600], err[256];
            char *src;
            size_t len;
            snprintf(p, sizeof p, "%s/templates/%s.jinja", test_fixtures_dir(), tname);
            REQUIRE(file_read_all(p, 1 << 20, &src, &len, err, sizeof err) == 0);
            int rc = tmpl_compile(src, len, &c->t, err, sizeof err);
            CHECK_MSG(rc == 0, "compile %s: %s", tname, err);
            free(src);
            snprintf(p, sizeof p, "%s/templates/%s.tokens.json", test_fixtures_dir(), tname);
            REQUIRE(file_read_all(p, 1 << 20, &c->tokens, &len, err, sizeof err) == 0);
        }
        /* the conversation */
        static json_t *convs;
        if (!convs) {
            char p[600];
            snprintf(p, sizeof p, "%s/templates/conversations.json", test_fixtures_dir());
            convs = json_load_file(p, 0, &je);
            REQUIRE(convs != NULL);
        }
        json_t *conv = NULL;
        size_t ci;
        json_t *cv;
        json_array_foreach(convs, ci, cv) if (!strcmp(json_string_value(json_object_get(cv, "name")), cname)) conv = cv;
        REQUIRE(conv != NULL);
        json_t *kw = json_deep_copy(json_object_get(g, "kwargs"));
        int agp = json_is_true(json_object_get(kw, "add_generation_prompt"));
        json_object_del(kw, "add_generation_prompt");
        char *msgs = json_dumps(json_object_get(conv, "messages"), JSON_ENCODE_ANY);
        json_t *tools = json_object_get(conv, "tools");
        char *tools_s = tools ? json_dumps(tools, JSON_ENCODE_ANY) : NULL;
        char *kw_s = json_dumps(kw, 0);
        char *ctx = NULL, err[1024] = {0};
        int rc = tmpl_build_context(msgs, tools_s, agp, c->tokens, kw_s, &ctx, err, sizeof err);
        CHECK_MSG(rc == 0, "context: %s", err);
        char *out = NULL;
        size_t outlen = 0;
        if (rc == 0 && c->t) {
            tmpl_opts o = tmpl_default_opts();
            o.now = (int64_t)parse_now(json_string_value(json_object_get(g, "now")));
            rc = tmpl_render_opts(c->t, ctx, strlen(ctx), &o, &out, &outlen, err, sizeof err);
        }
        json_t *want = json_object_get(g, "output");
        n++;
        if (want) {
            const char *w = json_string_value(want);
            size_t wl = json_string_length(want);
            if (rc == 0 && outlen == wl && !memcmp(out, w, wl)) {
                ok++;
            } else if (shown++ < 6) {
                test_fail(__FILE__, __LINE__, "golden %s x %s x %s:\n  got: [%.600s]\n want: [%.600s]", tname, cname,
                          kw_s, rc == 0 ? out : err, w);
            }
        } else {
            n_err++;
            const char *etype = json_string_value(json_object_get(g, "error_type"));
            const char *emsg = json_string_value(json_object_get(g, "error"));
            if (rc != 0) {
                err_ok++;
                /* a raise_exception message comes back exactly; Python's own errors end with the same text */
                size_t el = strlen(emsg), gl = strlen(err);
                if (!strcmp(err, emsg) || (gl >= el && !strcmp(err + gl - el, emsg))) err_msg_ok++;
                else if (!strcmp(etype, "TemplateError") && shown++ < 6)
                    test_fail(__FILE__, __LINE__, "golden %s x %s: raise_exception message [%s], want [%s]", tname, cname, err, emsg);
            } else if (shown++ < 6) {
                test_fail(__FILE__, __LINE__, "golden %s x %s x %s: rendered, but transformers raised %s: %s", tname, cname,
                          kw_s, etype, emsg);
            }
        }
        free(out);
        free(ctx);
        free(msgs);
        free(tools_s);
        free(kw_s);
        json_decref(kw);
        json_decref(g);
    }
    free(line);
    fclose(f);
    for (int i = 0; i < ncache; i++) {
        tmpl_free(cache[i].t);
        free(cache[i].tokens);
    }
    fprintf(stderr, "  template goldens: %d/%d outputs byte-identical, %d/%d errors raised (%d with the same message)\n",
            ok, n - n_err, err_ok, n_err, err_msg_ok);
    CHECK_EQ_INT(ok, n - n_err);
    CHECK_EQ_INT(err_ok, n_err);
    CHECK(n > 1000);
}

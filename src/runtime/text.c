/* text.c — see text.h. */
#include "runtime/text.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/ctx_internal.h"
#include "tok/detok.h"
#include "tok/template.h"
#include "tok/tokenizer.h"
#include "util/alloc.h"
#include "util/err.h"
#include "util/file.h"

int text_load(cinfer_model *cm, const char *dir, char *err, size_t errlen) {
    char *tj = path_join(dir, "tokenizer.json");
    int have = file_exists(tj), rc = 0;
    free(tj);
    if (have && (rc = tok_load(dir, &cm->tk, err, errlen))) return rc;
    char *src = NULL, *cfg = NULL;
    size_t len = 0;
    char e2[512];
    if (tmpl_load_dir(dir, &src, &len, &cfg, e2, sizeof e2) == 0 && src) {
        rc = tmpl_compile(src, len, &cm->tpl, err, errlen);
        if (rc) {
            ci_err_prefix(err, errlen, "%s: chat template", dir);
            free(src);
            free(cfg);
            return rc;
        }
        cm->tpl_src = src;
    } else {
        free(src);
    }
    cm->tok_config = cfg;
    return 0;
}

void text_unload(cinfer_model *cm) {
    tok_free(cm->tk);
    tmpl_free(cm->tpl);
    free(cm->tpl_src);
    free(cm->tok_config);
    cm->tk = NULL;
    cm->tpl = NULL;
    cm->tpl_src = NULL;
    cm->tok_config = NULL;
}

int cinfer_model_has_tokenizer(const cinfer_model *m) { return m && m->tk != NULL; }

const char *cinfer_model_chat_template(const cinfer_model *m) { return m ? m->tpl_src : NULL; }

int cinfer_tokenize(const cinfer_model *m, const char *text, size_t len, int add_special, int32_t **ids, int *n_ids,
                    char *err, size_t errlen) {
    if (!m || !m->tk) return ci_err(err, errlen, CINFER_ESTATE, "the model has no tokenizer.json");
    size_t n = 0;
    int rc = tok_encode(m->tk, text, len, add_special, ids, &n, err, errlen);
    if (rc) return rc;
    if (n > 0x7fffffff) {
        free(*ids);
        *ids = NULL;
        return ci_err(err, errlen, CINFER_ERANGE, "%zu tokens is too many", n);
    }
    *n_ids = (int)n;
    return 0;
}

int cinfer_detokenize(const cinfer_model *m, const int32_t *ids, int n_ids, int skip_special, char **text, char *err,
                      size_t errlen) {
    if (!m || !m->tk) return ci_err(err, errlen, CINFER_ESTATE, "the model has no tokenizer.json");
    if (n_ids < 0) return ci_err(err, errlen, CINFER_EINVAL, "negative id count");
    return tok_decode(m->tk, ids, (size_t)n_ids, skip_special, text, NULL, err, errlen);
}

int cinfer_apply_chat_template(const cinfer_model *m, const char *ctx_json, size_t len, char **out, char *err,
                               size_t errlen) {
    if (!m || !m->tpl) return ci_err(err, errlen, CINFER_ESTATE, "the model has no chat template");
    char *ctx = NULL;
    int rc = tmpl_context_merge(ctx_json, len, m->tok_config, &ctx, err, errlen);
    if (rc) return rc;
    rc = tmpl_render(m->tpl, ctx, strlen(ctx), out, err, errlen);
    free(ctx);
    return rc;
}

int32_t text_token_id(const cinfer_model *cm, const char *piece) {
    return cm->tk ? tok_piece_to_id(cm->tk, piece, strlen(piece)) : -1;
}

struct text_stream {
    const tokenizer *tk;
    detok *d;
};

text_stream *text_stream_create(const cinfer_model *cm, int skip_special) {
    text_stream *ts = xcalloc(1, sizeof *ts);
    ts->tk = cm->tk;
    if (cm->tk) ts->d = detok_create(cm->tk, skip_special);
    return ts;
}

void text_stream_free(text_stream *ts) {
    if (!ts) return;
    detok_free(ts->d);
    free(ts);
}

void text_stream_push(text_stream *ts, int32_t id, const char **txt, size_t *len) {
    *txt = "";
    *len = 0;
    char err[128];
    if (ts->d && detok_push(ts->d, id, txt, len, err, sizeof err)) *len = 0;
}

void text_stream_flush(text_stream *ts, const char **txt, size_t *len) {
    *txt = "";
    *len = 0;
    char err[128];
    if (ts->d && detok_flush(ts->d, txt, len, err, sizeof err)) *len = 0;
}

size_t text_token_bytes(const text_stream *ts, int32_t id, char *buf, size_t cap) {
    if (!ts->tk || !cap) return 0;
    char *s = NULL;
    size_t n = 0;
    char err[128];
    if (tok_decode(ts->tk, &id, 1, 0, &s, &n, err, sizeof err)) return 0;
    if (n > cap) n = cap;
    memcpy(buf, s, n);
    free(s);
    return n;
}

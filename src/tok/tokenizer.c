/* tokenizer.c — loading: tokenizer.json (+ tokenizer_config.json) into the structures of tok_internal.h,
 * with every id, count and string checked; the added vocabulary built as HF's AddedVocabulary::add_tokens
 * builds it (ids come from the vocabulary where the content is a token, else are assigned after it — the
 * "id" fields of the file are only a cross-check there too); and the small accessors. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "tok/tok_internal.h"
#include "util/alloc.h"
#include "util/err.h"
#include "util/file.h"

#define MAX_IDS (1 << 24)  /* ids beyond this are a malformed file (the largest real vocabularies are ~260k) */
#define MAX_DEPTH 16       /* nesting of Sequence components */
#define TJ "tokenizer.json: "

void tk_merges_put(tk_merges *mg, int32_t a, int32_t b, uint32_t rank, int32_t new_id);

/* ------------------------------------------------------------------ json helpers */

static int jbool(json_t *o, const char *k, int dflt) {
    json_t *v = json_object_get(o, k);
    if (json_is_boolean(v)) return json_is_true(v);
    return dflt;
}

/* A string field; s and n point into the json value. */
static int jstr(json_t *o, const char *k, const char **s, size_t *n) {
    json_t *v = json_object_get(o, k);
    if (!json_is_string(v)) return 0;
    *s = json_string_value(v);
    *n = json_string_length(v);
    return 1;
}

static const char *jtype(json_t *o) {
    json_t *t = json_object_get(o, "type");
    return json_is_string(t) ? json_string_value(t) : NULL;
}

static char *dupn(const char *s, size_t n) {
    char *p = xmalloc(n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

/* One code point string (Metaspace replacement, Strip content). */
static int one_char(const char *s, size_t n, uint32_t *cp) {
    if (n == 0 || tk_utf8_valid_prefix(s, n) != n) return 0;
    int k = tk_utf8_dec(s, n, cp);
    return (size_t)k == n;
}

/* pattern: {"String": s} or {"Regex": r} */
static int parse_pattern(json_t *o, tk_pattern *p, const char *what, char *err, size_t errlen) {
    json_t *pat = json_object_get(o, "pattern");
    const char *s;
    size_t n;
    if (json_is_object(pat) && jstr(pat, "String", &s, &n)) return tk_pattern_literal(p, s, n);
    if (json_is_object(pat) && jstr(pat, "Regex", &s, &n)) {
        int rc = tk_pattern_regex(p, s, n, err, errlen);
        if (rc) ci_err_prefix(err, errlen, TJ "%s", what);
        return rc;
    }
    return ci_err(err, errlen, CINFER_EFORMAT, TJ "%s: pattern must be {\"String\": ...} or {\"Regex\": ...}", what);
}

static int parse_behavior(json_t *o, const char *key, int dflt, int *out, char *err, size_t errlen) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (dflt < 0) return ci_err(err, errlen, CINFER_EFORMAT, TJ "missing split behavior");
        *out = dflt;
        return 0;
    }
    const char *s = json_is_string(v) ? json_string_value(v) : "";
    static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    for (int i = 0; i < 5; i++)
        if (!strcmp(s, names[i])) {
            *out = i;
            return 0;
        }
    return ci_err(err, errlen, CINFER_EFORMAT, TJ "unknown split behavior \"%s\"", s);
}

static int parse_prepend_scheme(json_t *o, int *out, char *err, size_t errlen) {
    const char *s;
    size_t n;
    *out = PREPEND_ALWAYS;
    if (jstr(o, "prepend_scheme", &s, &n)) {
        if (!strcmp(s, "always")) *out = PREPEND_ALWAYS;
        else if (!strcmp(s, "first")) *out = PREPEND_FIRST;
        else if (!strcmp(s, "never")) *out = PREPEND_NEVER;
        else return ci_err(err, errlen, CINFER_EFORMAT, TJ "unknown Metaspace prepend_scheme \"%s\"", s);
    }
    json_t *aps = json_object_get(o, "add_prefix_space");
    if (json_is_false(aps)) {
        if (*out != PREPEND_NEVER && json_object_get(o, "prepend_scheme") && *out != PREPEND_ALWAYS)
            return ci_err(err, errlen, CINFER_EFORMAT, TJ "Metaspace add_prefix_space does not match prepend_scheme");
        *out = PREPEND_NEVER;
    }
    return 0;
}

/* ------------------------------------------------------------------ normalizers */

static void norm_free(tk_norm *n) {
    if (!n) return;
    tk_pattern_free(&n->pat);
    free(n->content);
    for (int i = 0; i < n->n_items; i++) norm_free(&n->items[i]);
    free(n->items);
}

static int parse_norm(json_t *o, tk_norm *nm, int depth, char *err, size_t errlen) {
    memset(nm, 0, sizeof *nm);
    if (!json_is_object(o)) return ci_err(err, errlen, CINFER_EFORMAT, TJ "normalizer must be an object");
    if (depth > MAX_DEPTH) return ci_err(err, errlen, CINFER_EFORMAT, TJ "normalizers nested too deeply");
    const char *t = jtype(o);
    if (!t) return ci_err(err, errlen, CINFER_EFORMAT, TJ "normalizer without a type");
    const char *s;
    size_t n;
    if (!strcmp(t, "NFC")) nm->type = NORM_NFC;
    else if (!strcmp(t, "NFD")) nm->type = NORM_NFD;
    else if (!strcmp(t, "NFKC")) nm->type = NORM_NFKC;
    else if (!strcmp(t, "NFKD")) nm->type = NORM_NFKD;
    else if (!strcmp(t, "Lowercase")) nm->type = NORM_LOWERCASE;
    else if (!strcmp(t, "Replace")) {
        nm->type = NORM_REPLACE;
        if (!jstr(o, "content", &s, &n)) return ci_err(err, errlen, CINFER_EFORMAT, TJ "Replace normalizer without content");
        nm->content = dupn(s, n);
        nm->content_len = n;
        return parse_pattern(o, &nm->pat, "Replace normalizer", err, errlen);
    } else if (!strcmp(t, "Prepend")) {
        nm->type = NORM_PREPEND;
        if (!jstr(o, "prepend", &s, &n)) return ci_err(err, errlen, CINFER_EFORMAT, TJ "Prepend normalizer without prepend");
        nm->content = dupn(s, n);
        nm->content_len = n;
    } else if (!strcmp(t, "Strip")) {
        nm->type = NORM_STRIP;
        nm->strip_left = jbool(o, "strip_left", 1);
        nm->strip_right = jbool(o, "strip_right", 1);
    } else if (!strcmp(t, "Sequence")) {
        nm->type = NORM_SEQ;
        json_t *a = json_object_get(o, "normalizers");
        if (!json_is_array(a)) return ci_err(err, errlen, CINFER_EFORMAT, TJ "Sequence normalizer without normalizers");
        nm->n_items = (int)json_array_size(a);
        nm->items = xcalloc((size_t)nm->n_items + 1, sizeof *nm->items);
        for (int i = 0; i < nm->n_items; i++) {
            int rc = parse_norm(json_array_get(a, (size_t)i), &nm->items[i], depth + 1, err, errlen);
            if (rc) return rc;
        }
    } else {
        return ci_err(err, errlen, CINFER_EUNSUPPORTED, TJ "normalizer type \"%s\" is not supported", t);
    }
    return 0;
}

/* ------------------------------------------------------------------ pre-tokenizers */

static void pretok_free(tk_pretok *p) {
    if (!p) return;
    tk_pattern_free(&p->pat);
    for (int i = 0; i < p->n_items; i++) pretok_free(&p->items[i]);
    free(p->items);
}

static int parse_pretok(json_t *o, tk_pretok *pt, int depth, char *err, size_t errlen) {
    memset(pt, 0, sizeof *pt);
    if (!json_is_object(o)) return ci_err(err, errlen, CINFER_EFORMAT, TJ "pre_tokenizer must be an object");
    if (depth > MAX_DEPTH) return ci_err(err, errlen, CINFER_EFORMAT, TJ "pre_tokenizers nested too deeply");
    const char *t = jtype(o);
    if (!t) return ci_err(err, errlen, CINFER_EFORMAT, TJ "pre_tokenizer without a type");
    if (!strcmp(t, "Split")) {
        pt->type = PT_SPLIT;
        pt->invert = jbool(o, "invert", 0);
        int rc = parse_behavior(o, "behavior", -1, &pt->behavior, err, errlen);
        if (rc) return rc;
        return parse_pattern(o, &pt->pat, "Split pre_tokenizer", err, errlen);
    }
    if (!strcmp(t, "ByteLevel")) {
        pt->type = PT_BYTELEVEL;
        pt->add_prefix_space = jbool(o, "add_prefix_space", 1);
        pt->use_regex = jbool(o, "use_regex", 1);
        return 0;
    }
    if (!strcmp(t, "Metaspace")) {
        pt->type = PT_METASPACE;
        const char *s;
        size_t n;
        if (!jstr(o, "replacement", &s, &n) || !one_char(s, n, &pt->replacement))
            return ci_err(err, errlen, CINFER_EFORMAT, TJ "Metaspace replacement must be one character");
        memcpy(pt->rep, s, n);
        pt->rep_len = (int)n;
        pt->split = jbool(o, "split", 1);
        return parse_prepend_scheme(o, &pt->prepend_scheme, err, errlen);
    }
    if (!strcmp(t, "Digits")) {
        pt->type = PT_DIGITS;
        pt->individual_digits = jbool(o, "individual_digits", 0);
        return 0;
    }
    if (!strcmp(t, "Punctuation")) {
        pt->type = PT_PUNCT;
        return parse_behavior(o, "behavior", BEH_ISOLATED, &pt->behavior, err, errlen);
    }
    if (!strcmp(t, "Whitespace")) {
        pt->type = PT_WHITESPACE;
        return 0;
    }
    if (!strcmp(t, "WhitespaceSplit")) {
        pt->type = PT_WSSPLIT;
        return 0;
    }
    if (!strcmp(t, "Sequence")) {
        pt->type = PT_SEQ;
        json_t *a = json_object_get(o, "pretokenizers");
        if (!json_is_array(a)) return ci_err(err, errlen, CINFER_EFORMAT, TJ "Sequence pre_tokenizer without pretokenizers");
        pt->n_items = (int)json_array_size(a);
        pt->items = xcalloc((size_t)pt->n_items + 1, sizeof *pt->items);
        for (int i = 0; i < pt->n_items; i++) {
            int rc = parse_pretok(json_array_get(a, (size_t)i), &pt->items[i], depth + 1, err, errlen);
            if (rc) return rc;
        }
        return 0;
    }
    return ci_err(err, errlen, CINFER_EUNSUPPORTED, TJ "pre_tokenizer type \"%s\" is not supported", t);
}

/* ------------------------------------------------------------------ decoders */

static void decoder_free(tk_decoder *d) {
    if (!d) return;
    tk_pattern_free(&d->pat);
    free(d->content);
    for (int i = 0; i < d->n_items; i++) decoder_free(&d->items[i]);
    free(d->items);
}

static int parse_decoder(json_t *o, tk_decoder *d, int depth, char *err, size_t errlen) {
    memset(d, 0, sizeof *d);
    if (!json_is_object(o)) return ci_err(err, errlen, CINFER_EFORMAT, TJ "decoder must be an object");
    if (depth > MAX_DEPTH) return ci_err(err, errlen, CINFER_EFORMAT, TJ "decoders nested too deeply");
    const char *t = jtype(o);
    if (!t) return ci_err(err, errlen, CINFER_EFORMAT, TJ "decoder without a type");
    const char *s;
    size_t n;
    if (!strcmp(t, "ByteLevel")) d->type = DEC_BYTELEVEL;
    else if (!strcmp(t, "ByteFallback")) d->type = DEC_BYTEFALLBACK;
    else if (!strcmp(t, "Fuse")) d->type = DEC_FUSE;
    else if (!strcmp(t, "Strip")) {
        d->type = DEC_STRIP;
        json_t *st = json_object_get(o, "start"), *sp = json_object_get(o, "stop");
        if (!jstr(o, "content", &s, &n) || !one_char(s, n, &d->strip_char) || !json_is_integer(st) ||
            !json_is_integer(sp) || json_integer_value(st) < 0 || json_integer_value(sp) < 0)
            return ci_err(err, errlen, CINFER_EFORMAT, TJ "Strip decoder needs content (one character), start, stop");
        d->start = (size_t)json_integer_value(st);
        d->stop = (size_t)json_integer_value(sp);
    } else if (!strcmp(t, "Replace")) {
        d->type = DEC_REPLACE;
        if (!jstr(o, "content", &s, &n)) return ci_err(err, errlen, CINFER_EFORMAT, TJ "Replace decoder without content");
        d->content = dupn(s, n);
        d->content_len = n;
        return parse_pattern(o, &d->pat, "Replace decoder", err, errlen);
    } else if (!strcmp(t, "Metaspace")) {
        d->type = DEC_METASPACE;
        if (!jstr(o, "replacement", &s, &n) || !one_char(s, n, &d->replacement))
            return ci_err(err, errlen, CINFER_EFORMAT, TJ "Metaspace replacement must be one character");
        return parse_prepend_scheme(o, &d->prepend_scheme, err, errlen);
    } else if (!strcmp(t, "Sequence")) {
        d->type = DEC_SEQ;
        json_t *a = json_object_get(o, "decoders");
        if (!json_is_array(a)) return ci_err(err, errlen, CINFER_EFORMAT, TJ "Sequence decoder without decoders");
        d->n_items = (int)json_array_size(a);
        d->items = xcalloc((size_t)d->n_items + 1, sizeof *d->items);
        for (int i = 0; i < d->n_items; i++) {
            int rc = parse_decoder(json_array_get(a, (size_t)i), &d->items[i], depth + 1, err, errlen);
            if (rc) return rc;
        }
    } else {
        return ci_err(err, errlen, CINFER_EUNSUPPORTED, TJ "decoder type \"%s\" is not supported", t);
    }
    return 0;
}

/* ------------------------------------------------------------------ post-processor */

static void tpl_free(tokenizer *tk) {
    for (int i = 0; i < tk->n_tpl; i++) free(tk->tpl[i].ids);
    free(tk->tpl);
    tk->tpl = NULL;
    tk->n_tpl = 0;
}

static void tpl_push(tokenizer *tk, int is_seq, int32_t *ids, int n) {
    tk->tpl = xrealloc(tk->tpl, (size_t)(tk->n_tpl + 1) * sizeof *tk->tpl);
    tk->tpl[tk->n_tpl++] = (tk_tpl_piece){is_seq, ids, n};
}

/* One TemplateProcessing, applied after what is already in tk->tpl: the new template replaces the
 * sequence piece of the old one (a Sequence of two templates wraps twice, as the reference does). */
static int parse_template(tokenizer *tk, json_t *o, char *err, size_t errlen) {
    json_t *single = json_object_get(o, "single"), *specials = json_object_get(o, "special_tokens");
    if (!json_is_array(single)) return ci_err(err, errlen, CINFER_EFORMAT, TJ "TemplateProcessing without single");
    if (specials && !json_is_object(specials) && !json_is_null(specials))
        return ci_err(err, errlen, CINFER_EFORMAT, TJ "TemplateProcessing special_tokens must be an object");
    tk_tpl_piece *old = tk->tpl;
    int n_old = tk->n_tpl;
    tk->tpl = NULL;
    tk->n_tpl = 0;
    int rc = 0, n_seq = 0;
    for (size_t i = 0; i < json_array_size(single) && !rc; i++) {
        json_t *p = json_array_get(single, i);
        const char *name = NULL, *seq = NULL;
        char tmp[256];
        json_t *st = json_is_object(p) ? json_object_get(p, "SpecialToken") : NULL;
        json_t *sq = json_is_object(p) ? json_object_get(p, "Sequence") : NULL;
        if (json_is_object(st) && json_is_string(json_object_get(st, "id"))) name = json_string_value(json_object_get(st, "id"));
        else if (json_is_object(sq) && json_is_string(json_object_get(sq, "id"))) seq = json_string_value(json_object_get(sq, "id"));
        else if (json_is_string(p)) {
            /* the string form: "$A", "$B", "$0", "$1", "$", optionally ":type_id"; anything else a token */
            snprintf(tmp, sizeof tmp, "%s", json_string_value(p));
            char *colon = strrchr(tmp, ':');
            if (colon && colon != tmp) *colon = 0;
            if (tmp[0] == '$') seq = (!tmp[1] || !strcmp(tmp + 1, "A") || !strcmp(tmp + 1, "0")) ? "A" : "B";
            else name = tmp;
        } else {
            rc = ci_err(err, errlen, CINFER_EFORMAT, TJ "TemplateProcessing: bad template piece");
            break;
        }
        if (seq) {
            if (strcmp(seq, "A"))
                rc = ci_err(err, errlen, CINFER_EUNSUPPORTED,
                            TJ "TemplateProcessing: the single template uses sequence \"%s\" (only A exists)", seq);
            else {
                n_seq++;
                /* splice in the previous processor's template, or the bare sequence */
                if (old) {
                    for (int k = 0; k < n_old; k++) {
                        int32_t *ids = NULL;
                        if (old[k].n_ids) {
                            ids = xmalloc((size_t)old[k].n_ids * sizeof *ids);
                            memcpy(ids, old[k].ids, (size_t)old[k].n_ids * sizeof *ids);
                        }
                        tpl_push(tk, old[k].is_seq, ids, old[k].n_ids);
                    }
                } else {
                    tpl_push(tk, 1, NULL, 0);
                }
            }
            continue;
        }
        json_t *def = specials ? json_object_get(specials, name) : NULL;
        json_t *ids = json_is_object(def) ? json_object_get(def, "ids") : NULL;
        if (!json_is_array(ids)) {
            rc = ci_err(err, errlen, CINFER_EFORMAT, TJ "TemplateProcessing: missing special token \"%s\"", name);
            break;
        }
        size_t k = json_array_size(ids);
        int32_t *v = xmalloc((k + 1) * sizeof *v);
        for (size_t j = 0; j < k; j++) {
            json_t *x = json_array_get(ids, j);
            if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= MAX_IDS) {
                free(v);
                v = NULL;
                rc = ci_err(err, errlen, CINFER_EFORMAT, TJ "TemplateProcessing: bad id for \"%s\"", name);
                break;
            }
            v[j] = (int32_t)json_integer_value(x);
        }
        if (v) tpl_push(tk, 0, v, (int)k);
    }
    if (!rc && n_seq == 0 && old) {
        /* a template without $A drops the sequence; keep nothing of the old one either */
    }
    for (int k = 0; k < n_old; k++) free(old[k].ids);
    free(old);
    return rc;
}

static int parse_post(tokenizer *tk, json_t *o, int depth, char *err, size_t errlen) {
    if (!json_is_object(o)) return ci_err(err, errlen, CINFER_EFORMAT, TJ "post_processor must be an object");
    if (depth > MAX_DEPTH) return ci_err(err, errlen, CINFER_EFORMAT, TJ "post_processors nested too deeply");
    const char *t = jtype(o);
    if (!t) return ci_err(err, errlen, CINFER_EFORMAT, TJ "post_processor without a type");
    if (!strcmp(t, "ByteLevel")) return 0; /* offsets only; adds no ids */
    if (!strcmp(t, "TemplateProcessing")) return parse_template(tk, o, err, errlen);
    if (!strcmp(t, "Sequence")) {
        json_t *a = json_object_get(o, "processors");
        if (!json_is_array(a)) return ci_err(err, errlen, CINFER_EFORMAT, TJ "Sequence post_processor without processors");
        for (size_t i = 0; i < json_array_size(a); i++) {
            int rc = parse_post(tk, json_array_get(a, i), depth + 1, err, errlen);
            if (rc) return rc;
        }
        return 0;
    }
    return ci_err(err, errlen, CINFER_EUNSUPPORTED, TJ "post_processor type \"%s\" is not supported", t);
}

/* ------------------------------------------------------------------ arena */

typedef struct {
    tk_buf b;
} arena_t;

static uint32_t arena_add(arena_t *a, const char *s, size_t n) {
    uint32_t off = (uint32_t)a->b.len;
    tkb_put(&a->b, s, n);
    return off;
}

/* ------------------------------------------------------------------ model */

static int parse_model(tokenizer *tk, json_t *m, arena_t *ar, char *err, size_t errlen) {
    if (!json_is_object(m)) return ci_err(err, errlen, CINFER_EFORMAT, TJ "model must be an object");
    const char *t = jtype(m);
    if (t && strcmp(t, "BPE")) return ci_err(err, errlen, CINFER_EUNSUPPORTED, TJ "model type \"%s\" is not supported", t);
    json_t *vocab = json_object_get(m, "vocab"), *merges = json_object_get(m, "merges");
    if (!json_is_object(vocab)) return ci_err(err, errlen, CINFER_EFORMAT, TJ "model.vocab must be an object");
    if (!json_is_array(merges)) return ci_err(err, errlen, CINFER_EFORMAT, TJ "model.merges must be an array");
    json_t *dropout = json_object_get(m, "dropout");
    if (json_is_number(dropout) && json_number_value(dropout) != 0.0)
        return ci_err(err, errlen, CINFER_EUNSUPPORTED, TJ "BPE dropout %g is not supported (it is random)",
                      json_number_value(dropout));
    tk->fuse_unk = jbool(m, "fuse_unk", 0);
    tk->byte_fallback = jbool(m, "byte_fallback", 0);
    tk->ignore_merges = jbool(m, "ignore_merges", 0);
    const char *s;
    size_t n;
    if (jstr(m, "continuing_subword_prefix", &s, &n)) tk->cont_prefix = dupn(s, n), tk->cont_prefix_len = n;
    if (jstr(m, "end_of_word_suffix", &s, &n)) tk->eow_suffix = dupn(s, n), tk->eow_suffix_len = n;

    /* vocab: ids bounded; the largest decides the arrays */
    size_t nv = json_object_size(vocab);
    int32_t max_id = -1;
    const char *key;
    size_t key_len;
    json_t *val;
    json_object_keylen_foreach(vocab, key, key_len, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= MAX_IDS)
            return ci_err(err, errlen, CINFER_EFORMAT, TJ "model.vocab: bad id for \"%.*s\"", (int)(key_len > 64 ? 64 : key_len), key);
        if (json_integer_value(val) > max_id) max_id = (int32_t)json_integer_value(val);
    }
    tk->n_model = (int32_t)nv;
    tk->n_ids = max_id + 1;
    tk->str_off = xmalloc(((size_t)tk->n_ids + 1) * sizeof *tk->str_off);
    tk->str_len = xmalloc(((size_t)tk->n_ids + 1) * sizeof *tk->str_len);
    for (int32_t i = 0; i < tk->n_ids; i++) tk->str_len[i] = UINT32_MAX;
    tk_strmap_build(&tk->vocab, nv);
    size_t max_len = 0;
    json_object_keylen_foreach(vocab, key, key_len, val) {
        int32_t id = (int32_t)json_integer_value(val);
        if (tk->str_len[id] != UINT32_MAX) continue; /* two strings with one id: keep the first */
        tk->str_off[id] = arena_add(ar, key, key_len);
        tk->str_len[id] = (uint32_t)key_len;
        if (key_len > max_len) max_len = key_len;
    }
    /* the map needs the arena's final address: filled after all strings are in (see finish_maps) */
    (void)max_len;

    size_t nm = json_array_size(merges);
    if (nm > (size_t)MAX_IDS * 4) return ci_err(err, errlen, CINFER_EFORMAT, TJ "too many merges");
    return 0;
}

/* Second model pass, once the arena stops moving: the vocab map and the merges. */
static int finish_model(tokenizer *tk, json_t *m, char *err, size_t errlen) {
    tk->vocab.arena = tk->arena;
    tk->vocab.off = tk->str_off;
    tk->vocab.len = tk->str_len;
    /* insert in id order so duplicates resolve the same way every load */
    for (int32_t id = 0; id < tk->n_ids; id++)
        if (tk->str_len[id] != UINT32_MAX)
            tk_strmap_put(&tk->vocab, (uint32_t)id, tk_hash(tk->arena + tk->str_off[id], tk->str_len[id]));
    /* Strings not kept (same id twice) are still tokens in HF's map; look them up in the JSON. */
    json_t *vocab = json_object_get(m, "vocab");
    json_t *merges = json_object_get(m, "merges");
    size_t nm = json_array_size(merges);
    size_t cap = 16;
    while (cap < nm * 2 + 2) cap *= 2;
    tk->merges.keys = xmalloc(cap * sizeof *tk->merges.keys);
    memset(tk->merges.keys, 0xff, cap * sizeof *tk->merges.keys);
    tk->merges.rank = xmalloc(cap * sizeof *tk->merges.rank);
    tk->merges.new_id = xmalloc(cap * sizeof *tk->merges.new_id);
    tk->merges.mask = cap - 1;
    tk_buf cat = {0};
    for (size_t i = 0; i < nm; i++) {
        json_t *e = json_array_get(merges, i);
        const char *a, *b;
        size_t na, nb;
        if (json_is_string(e)) {
            /* legacy "a b": exactly one space */
            const char *s = json_string_value(e);
            size_t n = json_string_length(e);
            const char *sp = memchr(s, ' ', n);
            if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp - s) - 1)) {
                free(cat.p);
                return ci_err(err, errlen, CINFER_EFORMAT, TJ "merge %zu is not \"a b\"", i + 1);
            }
            a = s, na = (size_t)(sp - s), b = sp + 1, nb = n - na - 1;
        } else if (json_is_array(e) && json_array_size(e) == 2 && json_is_string(json_array_get(e, 0)) &&
                   json_is_string(json_array_get(e, 1))) {
            a = json_string_value(json_array_get(e, 0)), na = json_string_length(json_array_get(e, 0));
            b = json_string_value(json_array_get(e, 1)), nb = json_string_length(json_array_get(e, 1));
        } else {
            free(cat.p);
            return ci_err(err, errlen, CINFER_EFORMAT, TJ "merge %zu must be \"a b\" or [a, b]", i + 1);
        }
        int32_t ia = tk_strmap_get(&tk->vocab, a, na), ib = tk_strmap_get(&tk->vocab, b, nb);
        json_t *va = ia < 0 ? json_object_getn(vocab, a, na) : NULL, *vb = ib < 0 ? json_object_getn(vocab, b, nb) : NULL;
        if (va) ia = (int32_t)json_integer_value(va);
        if (vb) ib = (int32_t)json_integer_value(vb);
        if (ia < 0 || ib < 0) {
            free(cat.p);
            return ci_err(err, errlen, CINFER_EFORMAT, TJ "merge %zu: token \"%.*s\" is not in the vocabulary", i + 1,
                          (int)(ia < 0 ? (na > 64 ? 64 : na) : (nb > 64 ? 64 : nb)), ia < 0 ? a : b);
        }
        size_t pl = tk->cont_prefix ? tk->cont_prefix_len : 0;
        if (nb < pl) {
            free(cat.p);
            return ci_err(err, errlen, CINFER_EFORMAT, TJ "merge %zu: \"%.*s\" is shorter than the subword prefix", i + 1,
                          (int)(nb > 64 ? 64 : nb), b);
        }
        cat.len = 0;
        tkb_put(&cat, a, na);
        tkb_put(&cat, b + pl, nb - pl);
        int32_t inew = tk_strmap_get(&tk->vocab, cat.p ? cat.p : "", cat.len);
        json_t *vn = inew < 0 ? json_object_getn(vocab, cat.p ? cat.p : "", cat.len) : NULL;
        if (vn) inew = (int32_t)json_integer_value(vn);
        if (inew < 0) {
            int shown = (int)(cat.len > 64 ? 64 : cat.len);
            int rc = ci_err(err, errlen, CINFER_EFORMAT, TJ "merge %zu: \"%.*s\" is not in the vocabulary", i + 1, shown, cat.p);
            free(cat.p);
            return rc;
        }
        tk_merges_put(&tk->merges, ia, ib, (uint32_t)i, inew);
    }
    free(cat.p);

    const char *s;
    size_t n;
    tk->unk_id = -1;
    if (jstr(m, "unk_token", &s, &n)) {
        tk->unk_id = tk_strmap_get(&tk->vocab, s, n);
        /* HF fails at encode time when the unk token is missing from the vocab; refuse at load */
        if (tk->unk_id < 0) return ci_err(err, errlen, CINFER_EFORMAT, TJ "unk_token \"%.*s\" is not in the vocabulary", (int)(n > 64 ? 64 : n), s);
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        tk->byte_id[b] = tk_strmap_get(&tk->vocab, name, 6);
        char u[4];
        int k = tk_utf8_enc(tk_bytes_char[b], u);
        tk->bl_byte_id[b] = tk_strmap_get(&tk->vocab, u, (size_t)k);
    }
    tk->bl_fast = (!tk->cont_prefix || tk->cont_prefix_len == 0) && (!tk->eow_suffix || tk->eow_suffix_len == 0);
    for (int b = 0; b < 256 && tk->bl_fast; b++)
        if (tk->bl_byte_id[b] < 0) tk->bl_fast = 0;
    /* empty prefix/suffix strings change nothing: drop them so the generic path skips the copies */
    if (tk->cont_prefix && !tk->cont_prefix_len) free(tk->cont_prefix), tk->cont_prefix = NULL;
    if (tk->eow_suffix && !tk->eow_suffix_len) free(tk->eow_suffix), tk->eow_suffix = NULL;
    return 0;
}

/* ------------------------------------------------------------------ added vocabulary */

typedef struct {
    const char *content;
    size_t len;
    int32_t file_id;
    uint8_t special, lstrip, rstrip, single_word, normalized;
} added_src;

static int parse_added_obj(json_t *t, added_src *a, int need_id, char *err, size_t errlen) {
    json_t *c = json_object_get(t, "content");
    json_t *id = json_object_get(t, "id");
    if (!json_is_string(c)) return ci_err(err, errlen, CINFER_EFORMAT, TJ "added token without content");
    if (need_id && (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= MAX_IDS))
        return ci_err(err, errlen, CINFER_EFORMAT, TJ "added token \"%.64s\": bad id", json_string_value(c));
    a->content = json_string_value(c);
    a->len = json_string_length(c);
    a->file_id = json_is_integer(id) ? (int32_t)json_integer_value(id) : -1;
    a->special = (uint8_t)jbool(t, "special", 0);
    a->lstrip = (uint8_t)jbool(t, "lstrip", 0);
    a->rstrip = (uint8_t)jbool(t, "rstrip", 0);
    a->single_word = (uint8_t)jbool(t, "single_word", 0);
    a->normalized = (uint8_t)jbool(t, "normalized", !a->special);
    return 0;
}

static void trie_free(tk_trie *t) {
    free(t->keys);
    free(t->child);
    free(t->term);
    memset(t, 0, sizeof *t);
}

static uint32_t trie_child(const tk_trie *t, uint32_t node, unsigned char b) {
    uint64_t key = (((uint64_t)node << 8) | b) + 1;
    size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & t->mask;
    for (;;) {
        if (!t->keys[i]) return 0;
        if (t->keys[i] == key) return t->child[i];
        i = (i + 1) & t->mask;
    }
}

static void trie_build(tk_trie *t, const tokenizer *tk, int normalized_set) {
    size_t total = 1;
    for (int i = 0; i < tk->n_added; i++)
        if (tk->added[i].normalized == normalized_set) total += normalized_set ? tk->added[i].norm_len : tk->added[i].len;
    size_t cap = 16;
    while (cap < total * 2) cap *= 2;
    t->keys = xcalloc(cap, sizeof *t->keys);
    t->child = xcalloc(cap, sizeof *t->child);
    t->mask = cap - 1;
    t->term = xmalloc(total * sizeof *t->term);
    t->term[0] = -1;
    t->n_nodes = 1;
    for (int i = 0; i < tk->n_added; i++) {
        const tk_added *a = &tk->added[i];
        if (a->normalized != normalized_set) continue;
        const unsigned char *s = (const unsigned char *)tk->arena + (normalized_set ? a->norm_off : a->off);
        uint32_t n = normalized_set ? a->norm_len : a->len;
        if (n == 0) continue;
        uint32_t node = 0;
        for (uint32_t k = 0; k < n; k++) {
            uint32_t c = trie_child(t, node, s[k]);
            if (!c) {
                c = t->n_nodes++;
                t->term[c] = -1;
                uint64_t key = (((uint64_t)node << 8) | s[k]) + 1;
                size_t j = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & t->mask;
                while (t->keys[j]) j = (j + 1) & t->mask;
                t->keys[j] = key;
                t->child[j] = c;
            }
            node = c;
        }
        t->term[node] = i;
        t->first[s[0]] = 1;
        if (n > t->maxlen) t->maxlen = n;
    }
}

/* Leftmost-longest match at or after pos: 1 with [*ms, *me) and the added index. */
int tk_trie_find(const tk_trie *t, const char *s, size_t n, size_t pos, size_t *ms, size_t *me, int *which);
int tk_trie_find(const tk_trie *t, const char *s, size_t n, size_t pos, size_t *ms, size_t *me, int *which) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = pos; i < n; i++) {
        if (!t->first[u[i]]) continue;
        uint32_t node = 0;
        int best = -1;
        size_t best_end = 0;
        for (size_t j = i; j < n; j++) {
            node = trie_child(t, node, u[j]);
            if (!node) break;
            if (t->term[node] >= 0) best = t->term[node], best_end = j + 1;
        }
        if (best >= 0) {
            *ms = i;
            *me = best_end;
            *which = best;
            return 1;
        }
    }
    return 0;
}

static int32_t normalize_for_added(tokenizer *tk, const char *s, size_t n, tk_buf *out) {
    tk_scratch *sc = tk_scratch_get(tk);
    uint32_t z = 1;
    out->len = 0;
    return tk_normalize(tk, tk->normalizer, sc, s, n, out, &z);
}

/* HF AddedVocabulary::add_tokens over the file's list (then the config's extras). */
static int build_added(tokenizer *tk, added_src *src, int n_src, arena_t *ar, char *err, size_t errlen) {
    int32_t next_id = -1;
    tk->added = xcalloc((size_t)n_src + 1, sizeof *tk->added);
    int32_t max_added = -1;
    /* content -> added index (a small map over the arena, rebuilt as we go: n_src is modest) */
    tk_buf norm = {0};
    for (int i = 0; i < n_src; i++) {
        added_src *a = &src[i];
        if (a->len == 0) continue;
        int existing = -1;
        for (int k = 0; k < tk->n_added; k++)
            if (tk->added[k].len == a->len && !memcmp(ar->b.p + tk->added[k].off, a->content, a->len)) {
                existing = k;
                break;
            }
        int32_t id;
        if (existing >= 0) {
            id = tk->added[existing].id;
        } else {
            /* the model vocab decides first; ids after it otherwise (HF's next_id rule) */
            tk->vocab.arena = ar->b.p;
            tk->vocab.off = tk->str_off;
            tk->vocab.len = tk->str_len;
            id = tk_strmap_get(&tk->vocab, a->content, a->len);
            if (id < 0) {
                if (next_id < 0) next_id = tk->n_model;
                id = next_id++;
                if (id >= MAX_IDS) {
                    free(norm.p);
                    return ci_err(err, errlen, CINFER_EFORMAT, TJ "too many added tokens");
                }
            }
        }
        tk_added t = {0};
        t.off = arena_add(ar, a->content, a->len);
        t.len = (uint32_t)a->len;
        t.norm_off = t.off;
        t.norm_len = t.len;
        t.id = id;
        t.special = a->special, t.lstrip = a->lstrip, t.rstrip = a->rstrip, t.single_word = a->single_word;
        t.normalized = a->normalized;
        if (a->normalized && tk->normalizer) {
            int rc = normalize_for_added(tk, a->content, a->len, &norm);
            if (rc) {
                free(norm.p);
                return ci_err(err, errlen, CINFER_EFORMAT, TJ "added token \"%.64s\" cannot be normalized", a->content);
            }
            if (norm.len != a->len || memcmp(norm.p, a->content, a->len)) {
                t.norm_off = arena_add(ar, norm.p ? norm.p : "", norm.len);
                t.norm_len = (uint32_t)norm.len;
            }
        }
        /* one entry per id: a later token with the same id replaces the earlier (HF's map by id) */
        int slot = -1;
        for (int k = 0; k < tk->n_added; k++)
            if (tk->added[k].id == id) {
                slot = k;
                break;
            }
        if (slot >= 0) tk->added[slot] = t;
        else tk->added[tk->n_added++] = t;
        if (id > max_added) max_added = id;
    }
    free(norm.p);
    (void)max_added;
    return 0;
}

/* ------------------------------------------------------------------ config */

static int32_t config_token_id(tokenizer *tk, json_t *cfg, const char *key) {
    json_t *v = json_object_get(cfg, key);
    const char *s = NULL;
    size_t n = 0;
    if (json_is_string(v)) s = json_string_value(v), n = json_string_length(v);
    else if (json_is_object(v) && json_is_string(json_object_get(v, "content")))
        s = json_string_value(json_object_get(v, "content")), n = json_string_length(json_object_get(v, "content"));
    if (!s) return -1;
    return tok_piece_to_id(tk, s, n);
}

/* ------------------------------------------------------------------ parse */

static void special_map_build(tokenizer *tk);

int tok_parse(const char *json, size_t len, const char *config_json, size_t config_len, tokenizer **out, char *err,
              size_t errlen) {
    *out = NULL;
    tk_text_init();
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_ALLOW_NUL, &je);
    if (!root) return ci_err(err, errlen, CINFER_EFORMAT, TJ "invalid JSON at line %d: %s", je.line, je.text);
    json_t *cfg = NULL;
    if (config_json) {
        /* ints as reals: model_max_length is often 1e30, past int64; nothing read here is an integer */
        cfg = json_loadb(config_json, config_len, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &je);
        if (!cfg || !json_is_object(cfg)) {
            json_decref(root);
            json_decref(cfg);
            return ci_err(err, errlen, CINFER_EFORMAT, "tokenizer_config.json: invalid JSON at line %d: %s", je.line, je.text);
        }
    }
    tokenizer *tk = xcalloc(1, sizeof *tk);
    tk->bos_id = tk->eos_id = tk->pad_id = -1;
    tk->unk_id = -1;
    pthread_key_create(&tk->scratch_key, tk_scratch_free);
    arena_t ar = {{0}};
    added_src *src = NULL;
    int rc = 0;
    if (!json_is_object(root)) {
        rc = ci_err(err, errlen, CINFER_EFORMAT, TJ "top level must be an object");
        goto done;
    }
    json_t *ver = json_object_get(root, "version");
    if (ver && !(json_is_string(ver) && !strcmp(json_string_value(ver), "1.0"))) {
        rc = ci_err(err, errlen, CINFER_EUNSUPPORTED, TJ "version %s is not supported (1.0 is)",
                    json_is_string(ver) ? json_string_value(ver) : "?");
        goto done;
    }
    /* truncation / padding are ignored: callers (the server, transformers too) never ask for them */
    json_t *x;
    if ((x = json_object_get(root, "normalizer")) && !json_is_null(x)) {
        tk->normalizer = xcalloc(1, sizeof *tk->normalizer);
        if ((rc = parse_norm(x, tk->normalizer, 0, err, errlen))) goto done;
    }
    if ((x = json_object_get(root, "pre_tokenizer")) && !json_is_null(x)) {
        tk->pretok = xcalloc(1, sizeof *tk->pretok);
        if ((rc = parse_pretok(x, tk->pretok, 0, err, errlen))) goto done;
    }
    if ((x = json_object_get(root, "post_processor")) && !json_is_null(x))
        if ((rc = parse_post(tk, x, 0, err, errlen))) goto done;
    if ((x = json_object_get(root, "decoder")) && !json_is_null(x)) {
        tk->decoder = xcalloc(1, sizeof *tk->decoder);
        if ((rc = parse_decoder(x, tk->decoder, 0, err, errlen))) goto done;
    }
    json_t *model = json_object_get(root, "model");
    if (!model) {
        rc = ci_err(err, errlen, CINFER_EFORMAT, TJ "no model");
        goto done;
    }
    if ((rc = parse_model(tk, model, &ar, err, errlen))) goto done;

    /* added tokens: the file's list, then tokenizer_config's added_tokens_decoder entries it lacks */
    json_t *at = json_object_get(root, "added_tokens");
    if (at && !json_is_array(at) && !json_is_null(at)) {
        rc = ci_err(err, errlen, CINFER_EFORMAT, TJ "added_tokens must be an array");
        goto done;
    }
    size_t n_at = json_array_size(at);
    json_t *atd = cfg ? json_object_get(cfg, "added_tokens_decoder") : NULL;
    size_t n_atd = json_is_object(atd) ? json_object_size(atd) : 0;
    src = xcalloc(n_at + n_atd + 1, sizeof *src);
    int n_src = 0;
    for (size_t i = 0; i < n_at; i++) {
        json_t *t = json_array_get(at, i);
        if (!json_is_object(t)) {
            rc = ci_err(err, errlen, CINFER_EFORMAT, TJ "added token %zu is not an object", i);
            goto done;
        }
        if ((rc = parse_added_obj(t, &src[n_src++], 1, err, errlen))) goto done;
    }
    if (n_atd) {
        const char *key;
        json_t *val;
        json_object_foreach(atd, key, val) {
            if (!json_is_object(val)) continue;
            added_src a;
            if (parse_added_obj(val, &a, 0, err, errlen)) continue;
            int dup = 0;
            for (int k = 0; k < n_src; k++)
                if (src[k].len == a.len && !memcmp(src[k].content, a.content, a.len)) dup = 1;
            if (!dup) src[n_src++] = a;
        }
    }
    /* the normalizer must exist for added tokens' normalized forms; the vocab map for their ids */
    tk->vocab.arena = ar.b.p;
    tk->vocab.off = tk->str_off;
    tk->vocab.len = tk->str_len;
    for (int32_t id = 0; id < tk->n_ids; id++)
        if (tk->str_len[id] != UINT32_MAX)
            tk_strmap_put(&tk->vocab, (uint32_t)id, tk_hash(ar.b.p + tk->str_off[id], tk->str_len[id]));
    if ((rc = build_added(tk, src, n_src, &ar, err, errlen))) goto done;

    /* the arena is final: rebuild the vocab map over it and read the merges */
    tk->arena = ar.b.p;
    tk->arena_len = ar.b.len;
    ar.b.p = NULL;
    memset(tk->vocab.slots, 0, (tk->vocab.mask + 1) * sizeof *tk->vocab.slots);
    if ((rc = finish_model(tk, model, err, errlen))) goto done;

    int32_t max_id = tk->n_ids - 1;
    for (int i = 0; i < tk->n_added; i++)
        if (tk->added[i].id > max_id) max_id = tk->added[i].id;
    if (max_id + 1 > tk->n_ids) {
        tk->str_off = xrealloc(tk->str_off, ((size_t)max_id + 2) * sizeof *tk->str_off);
        tk->str_len = xrealloc(tk->str_len, ((size_t)max_id + 2) * sizeof *tk->str_len);
        for (int32_t i = tk->n_ids; i <= max_id; i++) tk->str_len[i] = UINT32_MAX;
        tk->vocab.off = tk->str_off;
        tk->vocab.len = tk->str_len;
        tk->n_ids = max_id + 1;
    }
    tk->id_added = xcalloc((size_t)tk->n_ids + 1, sizeof *tk->id_added);
    for (int i = 0; i < tk->n_added; i++) tk->id_added[tk->added[i].id] = i + 1;
    for (int s = 0; s < 2; s++) {
        int any = 0;
        for (int i = 0; i < tk->n_added; i++) any |= tk->added[i].normalized == s;
        if (!any) continue;
        trie_build(s ? &tk->trie_norm : &tk->trie_raw, tk, s);
        if (s) tk->has_trie_norm = 1;
        else tk->has_trie_raw = 1;
    }
    special_map_build(tk);
    for (int i = 0; i < tk->n_tpl; i++)
        for (int k = 0; k < tk->tpl[i].n_ids; k++)
            if (tk->tpl[i].ids[k] >= tk->n_ids) {
                rc = ci_err(err, errlen, CINFER_EFORMAT, TJ "TemplateProcessing id %d is past the vocabulary", tk->tpl[i].ids[k]);
                goto done;
            }
    if (cfg) {
        tk->bos_id = config_token_id(tk, cfg, "bos_token");
        tk->eos_id = config_token_id(tk, cfg, "eos_token");
        tk->pad_id = config_token_id(tk, cfg, "pad_token");
        tk->cfg_add_bos = jbool(cfg, "add_bos_token", 0);
        tk->cfg_add_eos = jbool(cfg, "add_eos_token", 0);
    }
done:
    free(src);
    free(ar.b.p);
    json_decref(root);
    json_decref(cfg);
    if (rc) {
        tok_free(tk);
        return rc;
    }
    *out = tk;
    return 0;
}

/* content -> added index; decode's skip test is by string (HF's is_special_token), so it uses this too. */
static void special_map_build(tokenizer *tk) {
    tk->added_off = xmalloc(((size_t)tk->n_added + 1) * sizeof *tk->added_off);
    tk->added_len = xmalloc(((size_t)tk->n_added + 1) * sizeof *tk->added_len);
    tk_strmap_build(&tk->added_map, (size_t)tk->n_added + 1);
    tk->added_map.arena = tk->arena;
    tk->added_map.off = tk->added_off;
    tk->added_map.len = tk->added_len;
    for (int i = 0; i < tk->n_added; i++) {
        tk->added_off[i] = tk->added[i].off;
        tk->added_len[i] = tk->added[i].len;
        if (tk_strmap_get(&tk->added_map, tk->arena + tk->added[i].off, tk->added[i].len) < 0)
            tk_strmap_put(&tk->added_map, (uint32_t)i, tk_hash(tk->arena + tk->added[i].off, tk->added[i].len));
    }
}

int tok_load(const char *path, tokenizer **out, char *err, size_t errlen) {
    *out = NULL;
    char *tj = NULL, *cj = NULL, *dir = NULL;
    size_t tl = 0, cl = 0;
    size_t n = strlen(path);
    if (n >= 5 && !strcmp(path + n - 5, ".json")) {
        tj = xstrdup(path);
        dir = xstrdup(path);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        else strcpy(dir, ".");
    } else {
        dir = xstrdup(path);
        tj = path_join(dir, "tokenizer.json");
    }
    char *cpath = path_join(dir, "tokenizer_config.json");
    char *tbuf = NULL;
    int rc = file_read_all(tj, (size_t)1 << 30, &tbuf, &tl, err, errlen);
    if (rc == 0 && file_exists(cpath)) rc = file_read_all(cpath, (size_t)256 << 20, &cj, &cl, err, errlen);
    if (rc == 0) {
        rc = tok_parse(tbuf, tl, cj, cl, out, err, errlen);
        if (rc) ci_err_prefix(err, errlen, "%s", dir);
    }
    free(tbuf);
    free(cj);
    free(tj);
    free(cpath);
    free(dir);
    return rc;
}

void tok_free(tokenizer *tk) {
    if (!tk) return;
    tk_scratch_free(pthread_getspecific(tk->scratch_key));
    pthread_setspecific(tk->scratch_key, NULL);
    pthread_key_delete(tk->scratch_key);
    free(tk->arena);
    free(tk->str_off);
    free(tk->str_len);
    free(tk->vocab.slots);
    free(tk->merges.keys);
    free(tk->merges.rank);
    free(tk->merges.new_id);
    free(tk->cont_prefix);
    free(tk->eow_suffix);
    free(tk->added);
    free(tk->id_added);
    free(tk->added_map.slots);
    free(tk->added_off);
    free(tk->added_len);
    trie_free(&tk->trie_raw);
    trie_free(&tk->trie_norm);
    norm_free(tk->normalizer);
    free(tk->normalizer);
    pretok_free(tk->pretok);
    free(tk->pretok);
    decoder_free(tk->decoder);
    free(tk->decoder);
    tpl_free(tk);
    free(tk);
}

/* ------------------------------------------------------------------ accessors */

int32_t tok_vocab_size(const tokenizer *tk) { return tk->n_ids; }

const char *tok_id_to_piece(const tokenizer *tk, int32_t id, size_t *len) {
    if (id < 0 || id >= tk->n_ids) return NULL;
    if (tk->id_added[id]) {
        const tk_added *a = &tk->added[tk->id_added[id] - 1];
        *len = a->norm_len;
        return tk->arena + a->norm_off;
    }
    if (tk->str_len[id] == UINT32_MAX) return NULL;
    *len = tk->str_len[id];
    return tk->arena + tk->str_off[id];
}

int32_t tok_piece_to_id(const tokenizer *tk, const char *piece, size_t len) {
    int32_t a = tk_strmap_get(&tk->added_map, piece, len);
    if (a >= 0) return tk->added[a].id;
    return tk_strmap_get(&tk->vocab, piece, len);
}

int tok_is_special(const tokenizer *tk, int32_t id) {
    size_t n;
    const char *s = tok_id_to_piece(tk, id, &n);
    if (!s) return 0;
    /* by string, as the reference's decode tests it */
    int32_t a = tk_strmap_get(&tk->added_map, s, n);
    return a >= 0 && tk->added[a].special;
}

int32_t tok_bos_id(const tokenizer *tk) { return tk->bos_id; }
int32_t tok_eos_id(const tokenizer *tk) { return tk->eos_id; }
int32_t tok_pad_id(const tokenizer *tk) { return tk->pad_id; }
int tok_config_add_bos(const tokenizer *tk) { return tk->cfg_add_bos; }
int tok_config_add_eos(const tokenizer *tk) { return tk->cfg_add_eos; }

/* detok.c — see detok.h. State: the ids of the current window, the decode of its first part (the prefix,
 * already emitted) and how many ids that part holds. A step decodes the window; when the result is longer than
 * the prefix and does not end in U+FFFD (an incomplete character) the difference is final and goes out, and
 * the window slides to start at the group just emitted. */
#include "tok/detok.h"

#include <stdlib.h>
#include <string.h>

#include "tok/tok_internal.h"
#include "util/alloc.h"
#include "util/err.h"

struct detok {
    const tokenizer *tk;
    int skip;
    int32_t *ids; /* window */
    size_t n, cap;
    char *prefix; /* decode of ids[0 .. prefix_n) */
    size_t prefix_len, prefix_n;
    char *out; /* the last returned text */
    int byte_groups; /* the decoder has ByteFallback: a run of <0xNN> tokens is decoded as one group */
    int in_group;    /* the last id that reached the decoder was a <0xNN> token */
    int held_group;  /* the window holds text not emitted because of in_group */
};

static int has_bytefallback(const tk_decoder *dc) {
    if (!dc) return 0;
    if (dc->type == DEC_BYTEFALLBACK) return 1;
    for (int i = 0; i < dc->n_items; i++)
        if (has_bytefallback(&dc->items[i])) return 1;
    return 0;
}

detok *detok_create(const tokenizer *tk, int skip_special_tokens) {
    detok *d = xcalloc(1, sizeof *d);
    d->tk = tk;
    d->skip = skip_special_tokens;
    d->byte_groups = has_bytefallback(tk->decoder);
    return d;
}

void detok_reset(detok *d) {
    d->n = 0;
    free(d->prefix);
    d->prefix = NULL;
    d->prefix_len = d->prefix_n = 0;
    d->in_group = 0;
    d->held_group = 0;
}

void detok_free(detok *d) {
    if (!d) return;
    free(d->ids);
    free(d->prefix);
    free(d->out);
    free(d);
}

static int ends_incomplete(const char *s, size_t n) { return n >= 3 && !memcmp(s + n - 3, "\xEF\xBF\xBD", 3); }

static void set_out(detok *d, char *s, const char **text, size_t *len, size_t from, size_t n) {
    free(d->out);
    d->out = s;
    *text = s + from;
    *len = n;
}

int detok_push(detok *d, int32_t id, const char **text, size_t *len, char *err, size_t errlen) {
    *text = "";
    *len = 0;
    int rc;
    if (d->prefix_len == 0 && d->n > 0 && !d->held_group) {
        char *p;
        size_t pl;
        if ((rc = tok_decode(d->tk, d->ids, d->n, d->skip, &p, &pl, err, errlen))) return rc;
        if (!ends_incomplete(p, pl)) {
            free(d->prefix);
            d->prefix = p;
            d->prefix_len = pl;
            d->prefix_n = d->n;
        } else {
            free(p);
        }
    }
    if (d->n == d->cap) {
        d->cap = d->cap ? d->cap * 2 : 16;
        d->ids = xrealloc(d->ids, d->cap * sizeof *d->ids);
    }
    d->ids[d->n++] = id;
    char *s;
    size_t sl;
    if ((rc = tok_decode(d->tk, d->ids, d->n, d->skip, &s, &sl, err, errlen))) return rc;
    /* ByteFallback turns a whole run of byte tokens into U+FFFDs when the run is not valid UTF-8, so text from
     * a run is final only once a token that is not a byte ends it (skipped and unknown ids change nothing) */
    size_t plen;
    const char *piece = tok_id_to_piece(d->tk, id, &plen);
    if (d->byte_groups && piece && !(d->skip && tok_is_special(d->tk, id)))
        d->in_group = plen == 6 && !memcmp(piece, "<0x", 3) && piece[5] == '>';
    d->held_group = d->in_group && sl > d->prefix_len;
    if (sl > d->prefix_len && !ends_incomplete(s, sl) && !d->in_group) {
        size_t old_len = d->prefix_len;
        if (old_len && memcmp(s, d->prefix, old_len)) {
            free(s);
            return ci_err(err, errlen, CINFER_ESTATE,
                          "detok: the decoded text no longer starts with what was emitted (id %d)", id);
        }
        /* slide: the window now starts at the group that was the prefix's tail */
        size_t new_prefix_n = d->n - d->prefix_n;
        memmove(d->ids, d->ids + d->prefix_n, new_prefix_n * sizeof *d->ids);
        d->n = new_prefix_n;
        char *p;
        size_t pl;
        if ((rc = tok_decode(d->tk, d->ids, d->n, d->skip, &p, &pl, err, errlen))) {
            free(s);
            return rc;
        }
        free(d->prefix);
        d->prefix = p;
        d->prefix_len = pl;
        d->prefix_n = new_prefix_n;
        set_out(d, s, text, len, old_len, sl - old_len);
        return 0;
    }
    free(s);
    return 0;
}

int detok_flush(detok *d, const char **text, size_t *len, char *err, size_t errlen) {
    *text = "";
    *len = 0;
    if (d->n) {
        char *s;
        size_t sl;
        int rc = tok_decode(d->tk, d->ids, d->n, d->skip, &s, &sl, err, errlen);
        if (rc) return rc;
        if (sl > d->prefix_len && !memcmp(s, d->prefix ? d->prefix : "", d->prefix_len))
            set_out(d, s, text, len, d->prefix_len, sl - d->prefix_len);
        else
            free(s);
    }
    detok_reset(d);
    return 0;
}

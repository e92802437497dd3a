/* tok_decode.c — tok_decode: ids to token strings (added tokens in their normalized form, unknown ids
 * dropped, special ones dropped on request), then the decoder chain over the list of strings exactly as HF's
 * decode_chain runs it (each decoder maps a list to a list; Metaspace and Strip look at token positions),
 * then the strings joined. */
#include <stdlib.h>
#include <string.h>

#include "tok/tok_internal.h"
#include "util/alloc.h"
#include "util/err.h"

void tkl_push(tk_toklist *l, const char *s, size_t n) {
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 64;
        l->off = xrealloc(l->off, l->cap * sizeof *l->off);
        l->len = xrealloc(l->len, l->cap * sizeof *l->len);
    }
    l->off[l->n] = (uint32_t)l->bytes.len;
    l->len[l->n] = (uint32_t)n;
    l->n++;
    tkb_put(&l->bytes, s, n);
}

void tkl_free(tk_toklist *l) {
    free(l->bytes.p);
    free(l->off);
    free(l->len);
    memset(l, 0, sizeof *l);
}

static void tkl_swap(tk_toklist *a, tk_toklist *b) {
    tk_toklist t = *a;
    *a = *b;
    *b = t;
}

#define TOK(l, i) ((l)->bytes.p ? (l)->bytes.p + (l)->off[i] : "")

static void dec_bytelevel(tk_toklist *in, tk_toklist *out) {
    tk_buf raw = {0};
    for (size_t i = 0; i < in->n; i++) {
        const char *t = TOK(in, i);
        size_t n = in->len[i], start = raw.len;
        int all = 1;
        for (size_t k = 0; k < n;) {
            uint32_t cp;
            int w = tk_utf8_dec(t + k, n - k, &cp);
            int b = tk_char_byte(cp);
            if (b < 0) {
                all = 0;
                break;
            }
            tkb_putc(&raw, (char)b);
            k += (size_t)w;
        }
        if (!all) { /* a token with other characters is taken as its own bytes */
            raw.len = start;
            tkb_put(&raw, t, n);
        }
    }
    tk_buf fixed = {0};
    tk_utf8_lossy(&fixed, raw.p ? raw.p : "", raw.len);
    tkl_push(out, fixed.p ? fixed.p : "", fixed.len);
    free(raw.p);
    free(fixed.p);
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Rust's u8::from_str_radix(s, 16) on two bytes: an optional '+' then digits. */
static int parse_byte_token(const char *t, size_t n) {
    if (n != 6 || memcmp(t, "<0x", 3) || t[5] != '>') return -1;
    if (t[3] == '+') return hexval(t[4]);
    int hi = hexval(t[3]), lo = hexval(t[4]);
    if (hi < 0 || lo < 0) return -1;
    return hi * 16 + lo;
}

static void flush_bytes(tk_buf *pend, tk_toklist *out) {
    if (!pend->len) return;
    if (tk_utf8_valid_prefix(pend->p, pend->len) == pend->len) {
        tkl_push(out, pend->p, pend->len);
    } else {
        for (size_t k = 0; k < pend->len; k++) tkl_push(out, "\xEF\xBF\xBD", 3);
    }
    pend->len = 0;
}

static void dec_bytefallback(tk_toklist *in, tk_toklist *out) {
    tk_buf pend = {0};
    for (size_t i = 0; i < in->n; i++) {
        int b = parse_byte_token(TOK(in, i), in->len[i]);
        if (b >= 0) {
            tkb_putc(&pend, (char)b);
            continue;
        }
        flush_bytes(&pend, out);
        tkl_push(out, TOK(in, i), in->len[i]);
    }
    flush_bytes(&pend, out);
    free(pend.p);
}

static void dec_strip(const tk_decoder *d, tk_toklist *in, tk_toklist *out) {
    uint32_t *cps = NULL;
    size_t *offs = NULL, cap = 0;
    for (size_t i = 0; i < in->n; i++) {
        const char *t = TOK(in, i);
        size_t n = in->len[i], nc = 0;
        if (n + 1 > cap) {
            cap = n + 1;
            cps = xrealloc(cps, cap * sizeof *cps);
            offs = xrealloc(offs, cap * sizeof *offs);
        }
        for (size_t k = 0; k < n;) {
            offs[nc] = k;
            k += (size_t)tk_utf8_dec(t + k, n - k, &cps[nc]);
            nc++;
        }
        offs[nc] = n;
        size_t start_cut = 0, stop_cut = nc;
        for (size_t k = 0; k < nc && k < d->start; k++) {
            if (cps[k] != d->strip_char) break;
            start_cut = k + 1;
        }
        for (size_t k = 0; k < d->stop && k < nc; k++) {
            size_t idx = nc - k - 1;
            if (cps[idx] != d->strip_char) break;
            stop_cut = idx;
        }
        /* the reference panics where the cuts cross; an empty token is the sane reading */
        if (start_cut > stop_cut) tkl_push(out, "", 0);
        else tkl_push(out, t + offs[start_cut], offs[stop_cut] - offs[start_cut]);
    }
    free(cps);
    free(offs);
}

static void dec_replace(const tk_decoder *d, tk_scratch *sc, tk_toklist *in, tk_toklist *out) {
    tk_buf b = {0};
    for (size_t i = 0; i < in->n; i++) {
        const char *t = TOK(in, i);
        tk_find_matches(&d->pat, sc, t, in->len[i]);
        b.len = 0;
        for (size_t k = 0; k < sc->n_spans; k++) {
            if (sc->spans[k].is_match) tkb_put(&b, d->content, d->content_len);
            else tkb_put(&b, t + sc->spans[k].start, sc->spans[k].end - sc->spans[k].start);
        }
        tkl_push(out, b.p ? b.p : "", b.len);
    }
    free(b.p);
}

static void dec_metaspace(const tk_decoder *d, tk_toklist *in, tk_toklist *out) {
    tk_buf b = {0};
    for (size_t i = 0; i < in->n; i++) {
        const char *t = TOK(in, i);
        size_t n = in->len[i];
        b.len = 0;
        for (size_t k = 0; k < n;) {
            uint32_t cp;
            int w = tk_utf8_dec(t + k, n - k, &cp);
            if (cp == d->replacement) {
                /* every replacement char of the first token goes (not just a leading one), as in the reference */
                if (!(i == 0 && d->prepend_scheme != PREPEND_NEVER)) tkb_putc(&b, ' ');
            } else {
                tkb_put(&b, t + k, (size_t)w);
            }
            k += (size_t)w;
        }
        tkl_push(out, b.p ? b.p : "", b.len);
    }
    free(b.p);
}

static int chain(const tk_decoder *d, tk_scratch *sc, tk_toklist *toks) {
    if (d->type == DEC_SEQ) {
        for (int i = 0; i < d->n_items; i++) {
            int rc = chain(&d->items[i], sc, toks);
            if (rc) return rc;
        }
        return 0;
    }
    tk_toklist out = {0};
    switch (d->type) {
    case DEC_BYTELEVEL: dec_bytelevel(toks, &out); break;
    case DEC_BYTEFALLBACK: dec_bytefallback(toks, &out); break;
    case DEC_FUSE: {
        tk_buf b = {0};
        for (size_t i = 0; i < toks->n; i++) tkb_put(&b, TOK(toks, i), toks->len[i]);
        tkl_push(&out, b.p ? b.p : "", b.len);
        free(b.p);
        break;
    }
    case DEC_STRIP: dec_strip(d, toks, &out); break;
    case DEC_REPLACE: dec_replace(d, sc, toks, &out); break;
    case DEC_METASPACE: dec_metaspace(d, toks, &out); break;
    default: tkl_free(&out); return CINFER_EINVAL;
    }
    tkl_swap(toks, &out);
    tkl_free(&out);
    return 0;
}

int tk_decode_chain(const tk_decoder *d, tk_toklist *toks, char *err, size_t errlen) {
    (void)err;
    (void)errlen;
    return chain(d, NULL, toks);
}

int tok_decode(const tokenizer *tk, const int32_t *ids, size_t n, int skip_special_tokens, char **out,
               size_t *out_len, char *err, size_t errlen) {
    *out = NULL;
    if (out_len) *out_len = 0;
    if (!ids && n) return ci_err(err, errlen, CINFER_EINVAL, "tok_decode: NULL ids");
    tk_toklist toks = {0};
    for (size_t i = 0; i < n; i++) {
        size_t len;
        const char *p = tok_id_to_piece(tk, ids[i], &len);
        if (!p) continue;
        if (skip_special_tokens && tok_is_special(tk, ids[i])) continue;
        tkl_push(&toks, p, len);
    }
    tk_buf res = {0};
    if (tk->decoder) {
        tk_scratch *sc = tk_scratch_get(tk);
        int rc = chain(tk->decoder, sc, &toks);
        if (rc) {
            tkl_free(&toks);
            return ci_err(err, errlen, rc, "tok_decode: decoder failed");
        }
        for (size_t i = 0; i < toks.n; i++) tkb_put(&res, TOK(&toks, i), toks.len[i]);
    } else {
        for (size_t i = 0; i < toks.n; i++) {
            if (i) tkb_putc(&res, ' ');
            tkb_put(&res, TOK(&toks, i), toks.len[i]);
        }
    }
    tkl_free(&toks);
    tkb_putc(&res, 0);
    *out = res.p;
    if (out_len) *out_len = res.len - 1;
    return 0;
}

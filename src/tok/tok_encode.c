/* tok_encode.c — tok_encode: HF's encode path in order. Added tokens that are matched on the raw text are
 * cut out first (AddedVocabulary::extract_and_normalize, pass 1), the remaining pieces are normalized and
 * searched for the normalized added tokens (pass 2), then pre-tokenized, then each piece goes through the
 * BPE model, and the post-processor's template adds BOS/EOS when asked. */
#include <stdlib.h>
#include <string.h>

#include "tok/tok_internal.h"
#include "util/alloc.h"
#include "util/err.h"

int tk_trie_find(const tk_trie *t, const char *s, size_t n, size_t pos, size_t *ms, size_t *me, int *which);

/* Rust regex \w$ on s[..n] and ^\w on s[0..n) (the single_word test). */
static int ends_with_word(const char *s, size_t n) {
    if (!n) return 0;
    size_t p = n - 1;
    while (p > 0 && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
    uint32_t cp;
    tk_utf8_dec(s + p, n - p, &cp);
    return tk_is_word(cp);
}

static int starts_with_word(const char *s, size_t n) {
    if (!n) return 0;
    uint32_t cp;
    tk_utf8_dec(s, n, &cp);
    return tk_is_word(cp);
}

/* Start of the trailing whitespace of s[0..n) (\s*$), and the length of the leading one (^\s*). */
static size_t space_leftmost_at_end(const char *s, size_t n) {
    size_t b = n;
    while (b > 0) {
        size_t p = b - 1;
        while (p > 0 && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
        uint32_t cp;
        tk_utf8_dec(s + p, b - p, &cp);
        if (!tk_is_whitespace(cp)) break;
        b = p;
    }
    return b;
}

static size_t space_rightmost_at_start(const char *s, size_t n) {
    size_t a = 0;
    while (a < n) {
        uint32_t cp;
        int k = tk_utf8_dec(s + a, n - a, &cp);
        if (!tk_is_whitespace(cp)) break;
        a += (size_t)k;
    }
    return a;
}

static void push_sub(tk_pieces *dst, const tk_piece *pc, size_t a, size_t b, int32_t id) {
    if (b <= a) return; /* empty splits are dropped (PreTokenizedString::split) */
    tk_piece q = *pc;
    q.off = pc->off + (uint32_t)a;
    q.len = (uint32_t)(b - a);
    q.zlen = pc->zlen > a ? pc->zlen - (uint32_t)a : 0;
    if (q.zlen > q.len) q.zlen = q.len;
    q.id = id;
    tkp_push(dst, q);
}

/* AddedVocabulary::find_matches + split_with_indices for one piece. */
static void split_added(const tokenizer *tk, const tk_trie *t, tk_scratch *s, const tk_piece *pc, tk_pieces *dst) {
    const char *text = s->text.p + pc->off;
    size_t n = pc->len, start_offset = 0, pos = 0;
    size_t ms, me;
    int which;
    while (pos < n && tk_trie_find(t, text, n, pos, &ms, &me, &which)) {
        pos = me; /* the automaton resumes after the match itself, whatever rstrip takes */
        const tk_added *a = &tk->added[which];
        size_t start = ms, stop = me;
        if (a->single_word) {
            int start_space = start == 0 || !ends_with_word(text, start);
            int stop_space = stop == n || !starts_with_word(text + stop, n - stop);
            if (!start_space || !stop_space) continue;
        }
        if (a->lstrip) {
            size_t ns = space_leftmost_at_end(text, start);
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->rstrip) stop += space_rightmost_at_start(text + stop, n - stop);
        if (start_offset < start) push_sub(dst, pc, start_offset, start, -1);
        push_sub(dst, pc, start, stop, a->id);
        start_offset = stop;
    }
    if (start_offset != n) push_sub(dst, pc, start_offset, n, -1);
}

int tok_encode(const tokenizer *tk, const char *text, size_t len, int add_special_tokens, int32_t **ids, size_t *n,
               char *err, size_t errlen) {
    *ids = NULL;
    *n = 0;
    if (!text && len) return ci_err(err, errlen, CINFER_EINVAL, "tok_encode: NULL text");
    if (len > ((size_t)1 << 28))
        return ci_err(err, errlen, CINFER_ERANGE, "tok_encode: %zu bytes is over the limit of %zu", len, (size_t)1 << 28);
    size_t valid = tk_utf8_valid_prefix(text, len);
    if (valid != len)
        return ci_err(err, errlen, CINFER_EINVAL, "tok_encode: text is not valid UTF-8 (byte %zu)", valid);
    tk_scratch *s = tk_scratch_get(tk);
    s->text.len = 0;
    s->a.n = s->b.n = 0;
    s->n_out = 0;
    tkb_put(&s->text, text, len);

    if (len) {
        uint32_t cp;
        tk_piece whole = {0, (uint32_t)len, (uint32_t)tk_utf8_dec(text, len, &cp), -1, 0};
        if (tk->has_trie_raw) split_added(tk, &tk->trie_raw, s, &whole, &s->a);
        else tkp_push(&s->a, whole);
    }
    /* pass 2: normalize what is left, then look for the normalized added tokens in it */
    if (tk->normalizer || tk->has_trie_norm) {
        s->b.n = 0;
        for (size_t i = 0; i < s->a.n; i++) {
            tk_piece pc = s->a.v[i];
            if (pc.id < 0 && tk->normalizer) {
                s->tmp.len = 0;
                uint32_t z = pc.zlen;
                int rc = tk_normalize(tk, tk->normalizer, s, s->text.p + pc.off, pc.len, &s->tmp, &z);
                if (rc) return ci_err(err, errlen, CINFER_EINVAL, "tok_encode: normalization failed");
                pc.off = (uint32_t)s->text.len;
                pc.len = (uint32_t)s->tmp.len;
                pc.zlen = z > pc.len ? pc.len : z;
                tkb_put(&s->text, s->tmp.p, s->tmp.len);
                if (!pc.len) continue;
            }
            if (pc.id < 0 && tk->has_trie_norm) split_added(tk, &tk->trie_norm, s, &pc, &s->b);
            else tkp_push(&s->b, pc);
        }
        tk_pieces t = s->a;
        s->a = s->b;
        s->b = t;
    }
    if (tk->pretok) {
        int rc = tk_pretokenize(tk, tk->pretok, s);
        if (rc) return ci_err(err, errlen, rc, "tok_encode: pre-tokenization failed");
    }
    for (size_t i = 0; i < s->a.n; i++) {
        tk_piece pc = s->a.v[i];
        if (pc.id >= 0) {
            if (s->n_out == s->cap_out) {
                s->cap_out = s->cap_out ? s->cap_out * 2 : 1024;
                s->out = xrealloc(s->out, s->cap_out * sizeof *s->out);
            }
            s->out[s->n_out++] = pc.id;
            continue;
        }
        tk_bpe_word(tk, s, s->text.p + pc.off, pc.len, pc.bl);
    }

    size_t total = s->n_out;
    if (add_special_tokens && tk->n_tpl) {
        total = 0;
        for (int k = 0; k < tk->n_tpl; k++) total += tk->tpl[k].is_seq ? s->n_out : (size_t)tk->tpl[k].n_ids;
    }
    int32_t *o = malloc((total ? total : 1) * sizeof *o);
    if (!o) return ci_err(err, errlen, CINFER_ENOMEM, "tok_encode: out of memory for %zu ids", total);
    if (add_special_tokens && tk->n_tpl) {
        size_t w = 0;
        for (int k = 0; k < tk->n_tpl; k++) {
            if (tk->tpl[k].is_seq) {
                if (s->n_out) memcpy(o + w, s->out, s->n_out * sizeof *o);
                w += s->n_out;
            } else {
                memcpy(o + w, tk->tpl[k].ids, (size_t)tk->tpl[k].n_ids * sizeof *o);
                w += (size_t)tk->tpl[k].n_ids;
            }
        }
    } else if (s->n_out) {
        memcpy(o, s->out, s->n_out * sizeof *o);
    }
    /* scratch that grew past a large request is released so one huge input does not pin memory */
    if (s->text.cap > ((size_t)64 << 20)) {
        free(s->text.p);
        s->text = (tk_buf){0};
    }
    *ids = o;
    *n = total;
    return 0;
}

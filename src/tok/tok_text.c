/* tok_text.c — the text side of encoding: UTF-8 and Unicode properties, patterns (literal strings and
 * Oniguruma regexes run through PCRE2), normalizers and pre-tokenizers, each following the HF `tokenizers`
 * code path for path so the pieces handed to the model are the reference's pieces. Offsets are not kept
 * (cinfer needs ids only) except `zlen`, the one fact a component reads from offsets: whether a piece starts
 * at original offset 0 (Metaspace prepend_scheme "first"). */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tok/tok_internal.h"
#include "util/alloc.h"
#include "util/err.h"

/* ------------------------------------------------------------------ buffers */

void tkb_reserve(tk_buf *b, size_t extra) {
    if (b->len + extra <= b->cap) return;
    size_t nc = b->cap ? b->cap : 256;
    while (nc < b->len + extra) nc *= 2;
    b->p = xrealloc(b->p, nc);
    b->cap = nc;
}

void tkb_put(tk_buf *b, const void *s, size_t n) {
    if (!n) return;
    tkb_reserve(b, n);
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

void tkp_push(tk_pieces *p, tk_piece x) {
    if (p->n == p->cap) {
        p->cap = p->cap ? p->cap * 2 : 64;
        p->v = xrealloc(p->v, p->cap * sizeof *p->v);
    }
    p->v[p->n++] = x;
}

/* ------------------------------------------------------------------ UTF-8 */

int tk_utf8_dec(const char *s, size_t n, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80 || n < 2) {
        *cp = u[0];
        return 1;
    }
    if (u[0] < 0xE0) {
        *cp = ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F);
        return 2;
    }
    if (u[0] < 0xF0 || n < 4) {
        if (n < 3) {
            *cp = u[0];
            return 1;
        }
        *cp = ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
        return 3;
    }
    *cp = ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) | ((uint32_t)(u[2] & 0x3F) << 6) |
          (u[3] & 0x3F);
    return 4;
}

int tk_utf8_enc(uint32_t cp, char *o) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length of the valid sequence at s (1..4), or -k where k is the length of the maximal invalid subpart
 * (the bytes one U+FFFD replaces, as Rust's Utf8Error::error_len and the Unicode recommendation). */
static int utf8_step(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    int need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) need = 2, lo = 0xA0;
    else if (c >= 0xE1 && c <= 0xEC) need = 2;
    else if (c == 0xED) need = 2, hi = 0x9F;
    else if (c >= 0xEE && c <= 0xEF) need = 2;
    else if (c == 0xF0) need = 3, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else if (c == 0xF4) need = 3, hi = 0x8F;
    else return -1;
    for (int i = 1; i <= need; i++) {
        if ((size_t)i >= n) return -i;
        unsigned b = s[i];
        if (b < lo || b > hi) return -i;
        lo = 0x80, hi = 0xBF;
    }
    return need + 1;
}

size_t tk_utf8_valid_prefix(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        int k = utf8_step(u + i, n - i);
        if (k < 0) return i;
        i += (size_t)k;
    }
    return n;
}

void tk_utf8_lossy(tk_buf *out, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        int k = utf8_step(u + i, n - i);
        if (k > 0) {
            i += (size_t)k;
            continue;
        }
        tkb_put(out, s + run, i - run);
        tkb_put(out, "\xEF\xBF\xBD", 3);
        i += (size_t)(-k);
        run = i;
    }
    tkb_put(out, s + run, n - run);
}

/* ------------------------------------------------------------------ Unicode properties */

int tk_is_whitespace(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

int tk_is_numeric(uint32_t c) {
    if (c < 0x80) return c >= '0' && c <= '9';
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

int tk_is_punc(uint32_t c) {
    if (c < 0x80) return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

/* Rust regex's \w is Unicode "word": Alphabetic + M + Nd + Pc + Join_Control. utf8proc has no Alphabetic,
 * so it is L + Nl + Other_Alphabetic, whose members outside M are the circled / squared letters below. */
int tk_is_word(uint32_t c) {
    if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (c == 0x200C || c == 0x200D) return 1;
    if ((c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F149) || (c >= 0x1F150 && c <= 0x1F169) ||
        (c >= 0x1F170 && c <= 0x1F189))
        return 1;
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) || k == UTF8PROC_CATEGORY_NL ||
           (k >= UTF8PROC_CATEGORY_MN && k <= UTF8PROC_CATEGORY_ME) || k == UTF8PROC_CATEGORY_ND ||
           k == UTF8PROC_CATEGORY_PC;
}

/* ------------------------------------------------------------------ byte-level alphabet */

uint16_t tk_bytes_char[256];
static int16_t g_char_byte[324];

/* GPT-2's alphabet: printable Latin-1 bytes stand for themselves, the other 68 bytes map to 256.. in order. */
static void bytes_char_init(void) {
    int n = 0;
    for (int i = 0; i < 324; i++) g_char_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        tk_bytes_char[b] = (uint16_t)(printable ? b : 256 + n++);
        g_char_byte[tk_bytes_char[b]] = (int16_t)b;
    }
}

static pthread_once_t g_text_once = PTHREAD_ONCE_INIT;
void tk_text_init(void) { pthread_once(&g_text_once, bytes_char_init); }

int tk_char_byte(uint32_t cp) { return cp < 324 ? g_char_byte[cp] : -1; }

/* ------------------------------------------------------------------ patterns */

int tk_pattern_literal(tk_pattern *p, const char *s, size_t n) {
    memset(p, 0, sizeof *p);
    p->lit = xmalloc(n + 1);
    memcpy(p->lit, s, n);
    p->lit[n] = 0;
    p->lit_len = n;
    return 0;
}

void tk_pattern_free(tk_pattern *p) {
    free(p->lit);
    if (p->re) pcre2_code_free(p->re);
    memset(p, 0, sizeof *p);
}

/* Oniguruma's Unicode classes, spelled out so PCRE2 (whose \s adds U+180E, whose \w lacks marks) matches
 * the same characters: \s is White_Space, \w is Word, \h is a hex digit. */
#define ONIG_SPACE "\\t-\\r \\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"
#define ONIG_WORD                                                                                             \
    "\\p{L}\\p{Nl}\\p{M}\\p{Nd}\\p{Pc}\\x{200c}\\x{200d}\\x{24b6}-\\x{24e9}\\x{1f130}-\\x{1f149}\\x{1f150}-" \
    "\\x{1f169}\\x{1f170}-\\x{1f189}"
#define ONIG_HEX "0-9a-fA-F"

static void put_str(tk_buf *b, const char *s) { tkb_put(b, s, strlen(s)); }

/* Rewrites an Oniguruma (Ruby syntax) pattern for PCRE2: the class escapes above, \uHHHH, \p{^X}, and the
 * inline flag m (dot matches newline in Ruby) as PCRE2's s. */
static void onig_to_pcre2(const char *src, size_t n, tk_buf *o) {
    int in_class = 0;
    for (size_t i = 0; i < n; i++) {
        char c = src[i];
        if (c == '\\' && i + 1 < n) {
            char e = src[i + 1];
            const char *cls = NULL;
            int neg = 0;
            if (e == 's' || e == 'S') cls = ONIG_SPACE, neg = e == 'S';
            else if (e == 'w' || e == 'W') cls = ONIG_WORD, neg = e == 'W';
            else if (e == 'h' || e == 'H') cls = ONIG_HEX, neg = e == 'H';
            if (cls) {
                if (!in_class) {
                    put_str(o, neg ? "[^" : "[");
                    put_str(o, cls);
                    tkb_putc(o, ']');
                } else if (!neg) {
                    put_str(o, cls);
                } else { /* a negated class inside a class: PCRE2's own escape is the nearest there is */
                    tkb_putc(o, '\\');
                    tkb_putc(o, e);
                }
                i++;
                continue;
            }
            if (e == 'u' && i + 5 < n) {
                int ok = 1;
                for (int k = 2; k < 6; k++) {
                    char h = src[i + (size_t)k];
                    if (!((h >= '0' && h <= '9') || (h >= 'a' && h <= 'f') || (h >= 'A' && h <= 'F'))) ok = 0;
                }
                if (ok) {
                    put_str(o, "\\x{");
                    tkb_put(o, src + i + 2, 4);
                    tkb_putc(o, '}');
                    i += 5;
                    continue;
                }
            }
            if ((e == 'p' || e == 'P') && i + 3 < n && src[i + 2] == '{' && src[i + 3] == '^') {
                tkb_putc(o, '\\');
                tkb_putc(o, e == 'p' ? 'P' : 'p');
                tkb_putc(o, '{');
                i += 3;
                continue;
            }
            tkb_putc(o, c);
            tkb_putc(o, e);
            i++;
            continue;
        }
        if (in_class) {
            if (c == ']' ) in_class--;
            else if (c == '[') {
                if (i + 1 < n && src[i + 1] == ':') { /* POSIX bracket: copy through its ":]" */
                    const char *end = memchr(src + i, ']', n - i);
                    if (end) {
                        tkb_put(o, src + i, (size_t)(end - (src + i)) + 1);
                        i = (size_t)(end - src);
                        continue;
                    }
                }
                in_class++; /* Ruby nested class; PCRE2 has none, copied as is (compile will say so) */
            }
            tkb_putc(o, c);
            continue;
        }
        if (c == '[') {
            in_class = 1;
            tkb_putc(o, c);
            if (i + 1 < n && src[i + 1] == '^') tkb_putc(o, '^'), i++;
            if (i + 1 < n && src[i + 1] == ']') tkb_putc(o, ']'), i++; /* a leading ] is literal */
            continue;
        }
        if (c == '(' && i + 2 < n && src[i + 1] == '?') {
            size_t j = i + 2;
            while (j < n && (src[j] == 'i' || src[j] == 'm' || src[j] == 'x' || src[j] == '-')) j++;
            if (j > i + 2 && j < n && (src[j] == ')' || src[j] == ':')) {
                put_str(o, "(?");
                for (size_t k = i + 2; k < j; k++) tkb_putc(o, src[k] == 'm' ? 's' : src[k]);
                i = j - 1;
                continue;
            }
        }
        tkb_putc(o, c);
    }
}

int tk_pattern_regex(tk_pattern *p, const char *src, size_t n, char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    tk_buf b = {0};
    onig_to_pcre2(src, n, &b);
    int ec = 0;
    PCRE2_SIZE eo = 0;
    /* MULTILINE: in Oniguruma ^ and $ are line anchors by default. */
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(b.p ? b.p : ""), b.len, PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &ec,
                                   &eo, NULL);
    free(b.p);
    if (!re) {
        char msg[256];
        pcre2_get_error_message(ec, (PCRE2_UCHAR *)msg, sizeof msg);
        return ci_err(err, errlen, CINFER_EFORMAT, "regex \"%.*s\" does not compile: %s (at %zu)",
                      (int)(n > 200 ? 200 : n), src, msg, (size_t)eo);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter when JIT is unavailable */
    p->is_regex = 1;
    p->re = re;
    return 0;
}

static void spans_push(tk_scratch *sc, size_t a, size_t b, int m) {
    if (sc->n_spans == sc->cap_spans) {
        sc->cap_spans = sc->cap_spans ? sc->cap_spans * 2 : 256;
        sc->spans = xrealloc(sc->spans, sc->cap_spans * sizeof *sc->spans);
    }
    sc->spans[sc->n_spans++] = (tk_span){(uint32_t)a, (uint32_t)b, m};
}

/* One search from pos: 1 and [*ms, *me) on a match. */
static int pat_search(const tk_pattern *p, tk_scratch *sc, const char *s, size_t n, size_t pos, size_t *ms,
                      size_t *me) {
    if (!p->is_regex) {
        if (p->lit_len == 0) {
            *ms = *me = pos;
            return 1;
        }
        if (n - pos < p->lit_len) return 0;
        const char *f = memmem(s + pos, n - pos, p->lit, p->lit_len);
        if (!f) return 0;
        *ms = (size_t)(f - s);
        *me = *ms + p->lit_len;
        return 1;
    }
    int rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, sc->md, NULL);
    if (rc < 0) return 0; /* no match; a resource limit on pathological input ends the search too */
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(sc->md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

int tk_find_matches(const tk_pattern *p, tk_scratch *sc, const char *s, size_t n) {
    sc->n_spans = 0;
    if (n == 0) {
        spans_push(sc, 0, 0, 0);
        return 0;
    }
    size_t prev = 0, pos = 0;
    long last_match_end = -1;
    /* The onig crate's find_iter: an empty match right after the previous match is skipped by stepping one
     * character from the search start. */
    while (pos <= n) {
        size_t a, b;
        if (!pat_search(p, sc, s, n, pos, &a, &b)) break;
        if (a == b && last_match_end == (long)b) {
            if (pos >= n) break;
            uint32_t cp;
            pos += (size_t)tk_utf8_dec(s + pos, n - pos, &cp);
            continue;
        }
        if (prev != a) spans_push(sc, prev, a, 0);
        spans_push(sc, a, b, 1);
        prev = b;
        pos = b;
        last_match_end = (long)b;
    }
    if (prev != n) spans_push(sc, prev, n, 0);
    return 0;
}

/* HF's Pattern for Fn(char) -> bool: every matching character is a match of its own. */
static void find_char_matches(tk_scratch *sc, const char *s, size_t n, int (*pred)(uint32_t, uint32_t),
                              uint32_t arg) {
    sc->n_spans = 0;
    if (n == 0) {
        spans_push(sc, 0, 0, 0);
        return;
    }
    size_t last = 0, i = 0;
    while (i < n) {
        uint32_t cp;
        int k = tk_utf8_dec(s + i, n - i, &cp);
        if (pred(cp, arg)) {
            if (last < i) spans_push(sc, last, i, 0);
            spans_push(sc, i, i + (size_t)k, 1);
            last = i + (size_t)k;
        }
        i += (size_t)k;
    }
    if (n > last) spans_push(sc, last, n, 0);
}

static int pred_numeric(uint32_t c, uint32_t a) { (void)a; return tk_is_numeric(c); }
static int pred_punc(uint32_t c, uint32_t a) { (void)a; return tk_is_punc(c); }
static int pred_ws(uint32_t c, uint32_t a) { (void)a; return tk_is_whitespace(c); }
static int pred_eq(uint32_t c, uint32_t a) { return c == a; }

/* ------------------------------------------------------------------ normalizers */

/* Unicode normalization. ASCII needs none, and an ASCII character followed by another ASCII character is a
 * boundary no composition or reordering crosses, so only the stretches around non-ASCII text go through
 * utf8proc (the corpus is mostly ASCII; this keeps NFC off the hot path). */
static int unicode_norm(int type, const char *in, size_t n, tk_buf *out, uint32_t *zlen) {
    int opt = UTF8PROC_STABLE;
    if (type == NORM_NFC || type == NORM_NFKC) opt |= UTF8PROC_COMPOSE;
    else opt |= UTF8PROC_DECOMPOSE;
    if (type == NORM_NFKC || type == NORM_NFKD) opt |= UTF8PROC_COMPAT;
    size_t out0 = out->len;
    size_t i = 0;
    while (i < n) {
        /* copy the ASCII run, keeping its last char if non-ASCII follows (it may compose with it) */
        size_t j = i;
        while (j < n && (unsigned char)in[j] < 0x80) j++;
        if (j == n) {
            tkb_put(out, in + i, n - i);
            break;
        }
        size_t seg = j > i ? j - 1 : j;
        tkb_put(out, in + i, seg - i);
        size_t k = j;
        while (k < n) {
            if ((unsigned char)in[k] < 0x80 && (k + 1 >= n || (unsigned char)in[k + 1] < 0x80)) break;
            k++;
        }
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)in + seg, (utf8proc_ssize_t)(k - seg), &dst,
                                          (utf8proc_option_t)opt);
        if (r < 0) return CINFER_EINVAL;
        tkb_put(out, dst, (size_t)r);
        free(dst);
        i = k;
    }
    if (*zlen > 0 && out->len > out0) {
        /* the output of the first input character keeps original offset 0 */
        uint32_t cp;
        int k = tk_utf8_dec(in, n, &cp);
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)in, k, &dst, (utf8proc_option_t)opt);
        size_t z = r > 0 ? (size_t)r : 1;
        free(dst);
        uint32_t c2;
        size_t first = (size_t)tk_utf8_dec(out->p + out0, out->len - out0, &c2);
        if (z < first) z = first;
        if (z > out->len - out0) z = out->len - out0;
        *zlen = (uint32_t)z;
    } else {
        *zlen = 0;
    }
    return 0;
}

static void lowercase(const char *in, size_t n, tk_buf *out, uint32_t *zlen) {
    size_t out0 = out->len, z = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = tk_utf8_dec(in + i, n - i, &cp);
        if (cp < 0x80) {
            tkb_putc(out, (char)(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp));
        } else if (cp == 0x130) { /* the one unconditional multi-character lowercase mapping */
            tkb_put(out, "i\xCC\x87", 3);
        } else {
            char b[4];
            tkb_put(out, b, (size_t)tk_utf8_enc((uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), b));
        }
        i += (size_t)k;
        if (i <= *zlen) z = out->len - out0;
    }
    *zlen = (uint32_t)z;
}

static int replace_norm(const tk_norm *nm, tk_scratch *sc, const char *in, size_t n, tk_buf *out, uint32_t *zlen) {
    tk_find_matches(&nm->pat, sc, in, n);
    size_t out0 = out->len;
    size_t z = 0, zin = *zlen;
    int zrun = zin > 0; /* zero-offset bytes form a prefix: stop counting at the first that is not */
    for (size_t k = 0; k < sc->n_spans; k++) {
        tk_span sp = sc->spans[k];
        if (!sp.is_match) {
            tkb_put(out, in + sp.start, sp.end - sp.start);
            if (zrun) {
                if (sp.end <= zin) z += sp.end - sp.start;
                else {
                    if (sp.start < zin) z += zin - sp.start;
                    zrun = 0;
                }
            }
        } else {
            tkb_put(out, nm->content, nm->content_len);
            /* inserted text takes the alignment of the match's last byte (or (0,0) at the very start) */
            if (zrun) {
                if (sp.end == 0 || sp.end <= zin) z += nm->content_len;
                else zrun = 0;
            }
        }
    }
    (void)out0;
    *zlen = (uint32_t)z;
    return 0;
}

static void strip_norm(int left, int right, const char *in, size_t n, tk_buf *out, uint32_t *zlen) {
    size_t a = 0, b = n;
    if (left) {
        while (a < n) {
            uint32_t cp;
            int k = tk_utf8_dec(in + a, n - a, &cp);
            if (!tk_is_whitespace(cp)) break;
            a += (size_t)k;
        }
    }
    if (right) {
        while (b > a) {
            size_t p = b - 1;
            while (p > a && ((unsigned char)in[p] & 0xC0) == 0x80) p--;
            uint32_t cp;
            tk_utf8_dec(in + p, b - p, &cp);
            if (!tk_is_whitespace(cp)) break;
            b = p;
        }
    }
    tkb_put(out, in + a, b - a);
    uint32_t z = *zlen > a ? *zlen - (uint32_t)a : 0;
    if (z > b - a) z = (uint32_t)(b - a);
    *zlen = z;
}

int tk_normalize(const tokenizer *tk, const tk_norm *nm, tk_scratch *s, const char *in, size_t n, tk_buf *out,
                 uint32_t *zlen) {
    switch (nm->type) {
    case NORM_NFC:
    case NORM_NFD:
    case NORM_NFKC:
    case NORM_NFKD:
        return unicode_norm(nm->type, in, n, out, zlen);
    case NORM_LOWERCASE:
        lowercase(in, n, out, zlen);
        return 0;
    case NORM_REPLACE:
        return replace_norm(nm, s, in, n, out, zlen);
    case NORM_PREPEND:
        if (n) {
            tkb_put(out, nm->content, nm->content_len);
            if (*zlen) *zlen += (uint32_t)nm->content_len;
        }
        tkb_put(out, in, n);
        return 0;
    case NORM_STRIP:
        strip_norm(nm->strip_left, nm->strip_right, in, n, out, zlen);
        return 0;
    case NORM_SEQ: {
        /* ping-pong through two private buffers; the last step writes to out */
        tk_buf cur = {0}, nxt = {0};
        tkb_put(&cur, in, n);
        int rc = 0;
        for (int i = 0; i < nm->n_items && rc == 0; i++) {
            nxt.len = 0;
            rc = tk_normalize(tk, &nm->items[i], s, cur.p ? cur.p : "", cur.len, &nxt, zlen);
            tk_buf t = cur;
            cur = nxt;
            nxt = t;
        }
        if (rc == 0) tkb_put(out, cur.p, cur.len);
        free(cur.p);
        free(nxt.p);
        return rc;
    }
    }
    return CINFER_EINVAL;
}

/* ------------------------------------------------------------------ pre-tokenizers */

/* Applies HF's SplitDelimiterBehavior to the spans in sc and pushes the kept, non-empty sub-pieces of
 * parent (whose bytes start at base in sc->text) to dst. */
static void split_by_spans(tk_scratch *sc, const tk_piece *parent, int behavior, tk_pieces *dst) {
    size_t n = sc->n_spans;
    tk_span *sp = sc->spans;
    /* the behaviours fold the spans into (start, end, remove) triples, in place */
    size_t m = 0;
    switch (behavior) {
    case BEH_ISOLATED:
        for (size_t i = 0; i < n; i++) sp[i].is_match = 0;
        m = n;
        break;
    case BEH_REMOVED:
        m = n;
        break;
    case BEH_CONTIGUOUS: {
        int prev = 0;
        for (size_t i = 0; i < n; i++) {
            int im = sp[i].is_match;
            if (im == prev && m > 0) sp[m - 1].end = sp[i].end;
            else sp[m++] = (tk_span){sp[i].start, sp[i].end, 0};
            prev = im;
        }
        break;
    }
    case BEH_MERGED_PREV: {
        int prev = 0;
        for (size_t i = 0; i < n; i++) {
            int im = sp[i].is_match;
            if (im && !prev && m > 0) sp[m - 1].end = sp[i].end;
            else sp[m++] = (tk_span){sp[i].start, sp[i].end, 0};
            prev = im;
        }
        break;
    }
    case BEH_MERGED_NEXT: {
        /* HF folds from the back, then reverses; done here into the tail of the same array */
        int prev = 0;
        size_t w = n; /* write index from the back */
        for (size_t i = n; i-- > 0;) {
            int im = sp[i].is_match;
            if (im && !prev && w < n) sp[w].start = sp[i].start;
            else sp[--w] = (tk_span){sp[i].start, sp[i].end, 0};
            prev = im;
        }
        memmove(sp, sp + w, (n - w) * sizeof *sp);
        m = n - w;
        break;
    }
    }
    for (size_t i = 0; i < m; i++) {
        if (sp[i].is_match) continue; /* removed */
        if (sp[i].end <= sp[i].start) continue;
        tk_piece q = *parent;
        q.off = parent->off + sp[i].start;
        q.len = sp[i].end - sp[i].start;
        q.zlen = parent->zlen > sp[i].start ? parent->zlen - sp[i].start : 0;
        if (q.zlen > q.len) q.zlen = q.len;
        tkp_push(dst, q);
    }
}

static const tk_pattern *gpt2_regex(void);

void tk_bl_materialize(tk_scratch *s, tk_piece *p) {
    if (!p->bl) return;
    size_t off = s->text.len;
    uint32_t z = 0;
    tkb_reserve(&s->text, (size_t)p->len * 2);
    for (uint32_t i = 0; i < p->len; i++) {
        char b[4];
        int k = tk_utf8_enc(tk_bytes_char[(unsigned char)s->text.p[p->off + i]], b);
        tkb_put(&s->text, b, (size_t)k);
        if (i < p->zlen) z += (uint32_t)k;
    }
    p->off = (uint32_t)off;
    p->len = (uint32_t)(s->text.len - off);
    p->zlen = z;
    p->bl = 0;
}

/* Whitespace: the matches of \w+|[^\w\s]+ are kept, the rest removed (Invert + Removed). */
static void whitespace_split(tk_scratch *sc, const tk_piece *pc, tk_pieces *dst) {
    const char *s = sc->text.p + pc->off;
    size_t n = pc->len;
    sc->n_spans = 0;
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        int k = tk_utf8_dec(s + i, n - i, &cp);
        int cls = tk_is_word(cp) ? 1 : tk_is_whitespace(cp) ? 0 : 2;
        size_t j = i + (size_t)k;
        while (j < n) {
            uint32_t c2;
            int k2 = tk_utf8_dec(s + j, n - j, &c2);
            int cls2 = tk_is_word(c2) ? 1 : tk_is_whitespace(c2) ? 0 : 2;
            if (cls2 != cls) break;
            j += (size_t)k2;
        }
        spans_push(sc, i, j, cls == 0); /* whitespace runs are the (inverted) matches: removed */
        i = j;
    }
    split_by_spans(sc, pc, BEH_REMOVED, dst);
}

static int pretok_one(const tokenizer *tk, const tk_pretok *pt, tk_scratch *s, tk_piece pc, tk_pieces *dst) {
    switch (pt->type) {
    case PT_SPLIT:
        tk_find_matches(&pt->pat, s, s->text.p + pc.off, pc.len);
        if (pt->invert)
            for (size_t i = 0; i < s->n_spans; i++) s->spans[i].is_match = !s->spans[i].is_match;
        split_by_spans(s, &pc, pt->behavior, dst);
        return 0;
    case PT_DIGITS:
        find_char_matches(s, s->text.p + pc.off, pc.len, pred_numeric, 0);
        split_by_spans(s, &pc, pt->individual_digits ? BEH_ISOLATED : BEH_CONTIGUOUS, dst);
        return 0;
    case PT_PUNCT:
        find_char_matches(s, s->text.p + pc.off, pc.len, pred_punc, 0);
        split_by_spans(s, &pc, pt->behavior, dst);
        return 0;
    case PT_WSSPLIT:
        find_char_matches(s, s->text.p + pc.off, pc.len, pred_ws, 0);
        split_by_spans(s, &pc, BEH_REMOVED, dst);
        return 0;
    case PT_WHITESPACE:
        whitespace_split(s, &pc, dst);
        return 0;
    case PT_BYTELEVEL: {
        if (pt->add_prefix_space && pc.len > 0 && s->text.p[pc.off] != ' ') {
            size_t off = s->text.len;
            tkb_reserve(&s->text, (size_t)pc.len + 1); /* the copy below reads from the same buffer */
            tkb_putc(&s->text, ' ');
            tkb_put(&s->text, s->text.p + pc.off, pc.len);
            pc.off = (uint32_t)off;
            pc.len += 1;
            if (pc.zlen) pc.zlen += 1;
        }
        size_t n0 = dst->n;
        if (pt->use_regex) {
            tk_find_matches(gpt2_regex(), s, s->text.p + pc.off, pc.len);
            split_by_spans(s, &pc, BEH_ISOLATED, dst);
        } else if (pc.len) {
            tkp_push(dst, pc);
        }
        for (size_t i = n0; i < dst->n; i++) dst->v[i].bl = 1; /* mapped when (if ever) its text is read */
        return 0;
    }
    case PT_METASPACE: {
        const char *in = s->text.p + pc.off;
        size_t off = s->text.len;
        uint32_t z = 0;
        int starts_rep = 0;
        /* replace ' ' (zero-offset status carries per input byte), then maybe prepend */
        tkb_reserve(&s->text, (size_t)pc.len * 3 + 4);
        in = s->text.p + pc.off;
        for (uint32_t i = 0; i < pc.len; i++) {
            if (in[i] == ' ') tkb_put(&s->text, pt->rep, (size_t)pt->rep_len);
            else tkb_putc(&s->text, in[i]);
            if (i < pc.zlen) z = (uint32_t)(s->text.len - off);
        }
        tk_piece q = pc;
        q.off = (uint32_t)off;
        q.len = (uint32_t)(s->text.len - off);
        q.zlen = z;
        starts_rep = q.len >= (uint32_t)pt->rep_len && !memcmp(s->text.p + q.off, pt->rep, (size_t)pt->rep_len);
        int prepend = 0;
        if (pt->prepend_scheme == PREPEND_ALWAYS) prepend = !starts_rep;
        else if (pt->prepend_scheme == PREPEND_FIRST) prepend = !starts_rep && q.zlen > 0;
        if (prepend && q.len > 0) {
            size_t off2 = s->text.len;
            tkb_reserve(&s->text, (size_t)q.len + (size_t)pt->rep_len);
            tkb_put(&s->text, pt->rep, (size_t)pt->rep_len);
            tkb_put(&s->text, s->text.p + q.off, q.len);
            q.off = (uint32_t)off2;
            q.len += (uint32_t)pt->rep_len;
            if (q.zlen) q.zlen += (uint32_t)pt->rep_len;
        }
        if (pt->split) {
            find_char_matches(s, s->text.p + q.off, q.len, pred_eq, pt->replacement);
            split_by_spans(s, &q, BEH_MERGED_NEXT, dst);
        } else if (q.len) {
            tkp_push(dst, q);
        }
        return 0;
    }
    case PT_SEQ:
        CI_ASSERT(0); /* handled by tk_pretokenize */
    }
    (void)tk;
    return CINFER_EINVAL;
}

int tk_pretokenize(const tokenizer *tk, const tk_pretok *pt, tk_scratch *s) {
    if (pt->type == PT_SEQ) {
        for (int i = 0; i < pt->n_items; i++) {
            int rc = tk_pretokenize(tk, &pt->items[i], s);
            if (rc) return rc;
        }
        return 0;
    }
    s->b.n = 0;
    for (size_t i = 0; i < s->a.n; i++) {
        tk_piece pc = s->a.v[i];
        if (pc.id >= 0) {
            tkp_push(&s->b, pc);
            continue;
        }
        tk_bl_materialize(s, &pc); /* this step reads the mapped text */
        int rc = pretok_one(tk, pt, s, pc, &s->b);
        if (rc) return rc;
    }
    tk_pieces t = s->a;
    s->a = s->b;
    s->b = t;
    return 0;
}

/* The ByteLevel pre-tokenizer's built-in regex (GPT-2's), compiled once. */
static tk_pattern g_gpt2;
static pthread_once_t g_gpt2_once = PTHREAD_ONCE_INIT;
static void gpt2_init(void) {
    static const char re[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
    int rc = tk_pattern_regex(&g_gpt2, re, sizeof re - 1, NULL, 0);
    CI_ASSERT(rc == 0);
}
static const tk_pattern *gpt2_regex(void) {
    pthread_once(&g_gpt2_once, gpt2_init);
    return &g_gpt2;
}

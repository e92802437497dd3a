/* toolcall.c — incremental tool-call parsers (Qwen3.5 XML, Hermes JSON) and the schema typing of XML
 * parameter values. The parser keeps only undecided text; inside a call it keeps the call's raw text
 * from its opening tag, so a call that never completes can be given back as content, byte for byte.
 *
 * Reference behaviour (read, not copied): vLLM vllm/tool_parsers/qwen3coder_tool_parser.py (value
 * typing, structural </parameter>, newline stripping), hermes_tool_parser.py (JSON calls), mlx-lm
 * mlx_lm/tool_parsers/qwen3_coder.py (bare <function=…> blocks). Arguments are written the way Python's
 * json.dumps(…, ensure_ascii=False) writes them, since that is what those servers return.
 * Where we differ on purpose, the code says so. */
#include "tok/toolcall.h"

#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>

#include "cinfer.h"
#include "util/alloc.h"
#include "util/err.h"

/* ---------------------------------------------------------------- string builder */

typedef struct {
    char *p;
    size_t n, cap;
} sb;

static void sb_add(sb *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 64;
        while (c < b->n + n + 1) c *= 2;
        b->p = xrealloc(b->p, c);
        b->cap = c;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void sb_str(sb *b, const char *s) {
    sb_add(b, s, strlen(s));
}
static void sb_chr(sb *b, char c) {
    sb_add(b, &c, 1);
}
static void sb_clear(sb *b) {
    b->n = 0;
    if (b->p) b->p[0] = 0;
}
static void sb_free(sb *b) {
    free(b->p);
    *b = (sb){0};
}

/* ---------------------------------------------------------------- UTF-8 and JSON strings */

/* The UTF-8 sequence at s: its length (1-4) with *cp set; 0 when invalid; -1 when s[0..n) is a valid
 * but incomplete start (more bytes could complete it). */
static int utf8_seq(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else
        return 0;
    uint32_t v = c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
    for (int k = 1; k < len; k++) {
        if ((size_t)k >= n) return -1;
        unsigned d = s[k];
        if (k == 1 ? (d < lo || d > hi) : (d < 0x80 || d > 0xBF)) return 0;
        v = (v << 6) | (d & 0x3F);
    }
    *cp = v;
    return len;
}

static void utf8_put(sb *b, uint32_t cp) {
    char t[4];
    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD; /* a lone surrogate has no UTF-8 form */
    if (cp > 0x10FFFF) cp = 0xFFFD;
    if (cp < 0x80) {
        t[0] = (char)cp;
        sb_add(b, t, 1);
    } else if (cp < 0x800) {
        t[0] = (char)(0xC0 | (cp >> 6));
        t[1] = (char)(0x80 | (cp & 0x3F));
        sb_add(b, t, 2);
    } else if (cp < 0x10000) {
        t[0] = (char)(0xE0 | (cp >> 12));
        t[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        t[2] = (char)(0x80 | (cp & 0x3F));
        sb_add(b, t, 3);
    } else {
        t[0] = (char)(0xF0 | (cp >> 18));
        t[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        t[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        t[3] = (char)(0x80 | (cp & 0x3F));
        sb_add(b, t, 4);
    }
}

/* The body of a JSON string as Python's json.dumps(ensure_ascii=False) writes it (no quotes). Bytes
 * that are not UTF-8 become U+FFFD one byte at a time, so escaping two pieces separately gives the same
 * bytes as escaping them together as long as no piece ends inside a valid sequence. */
static void json_esc(sb *b, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0; /* [run, i) is plain text waiting to be copied */
    while (i < n) {
        uint32_t cp;
        int l = utf8_seq(u + i, n - i, &cp);
        if (l > 0 && cp >= 0x20 && cp != '"' && cp != '\\') {
            i += (size_t)l;
            continue;
        }
        sb_add(b, s + run, i - run);
        if (l <= 0) {
            utf8_put(b, 0xFFFD);
            i++;
        } else {
            char e[8];
            switch (cp) {
            case '"':
                sb_str(b, "\\\"");
                break;
            case '\\':
                sb_str(b, "\\\\");
                break;
            case '\n':
                sb_str(b, "\\n");
                break;
            case '\r':
                sb_str(b, "\\r");
                break;
            case '\t':
                sb_str(b, "\\t");
                break;
            case '\b':
                sb_str(b, "\\b");
                break;
            case '\f':
                sb_str(b, "\\f");
                break;
            default:
                snprintf(e, sizeof e, "\\u%04x", (unsigned)cp);
                sb_str(b, e);
            }
            i++;
        }
        run = i;
    }
    sb_add(b, s + run, n - run);
}

static void json_str(sb *b, const char *s, size_t n) {
    sb_chr(b, '"');
    json_esc(b, s, n);
    sb_chr(b, '"');
}

/* ---------------------------------------------------------------- Python number formatting */

/* repr(float) of Python: the shortest digits that round-trip, fixed notation when the decimal exponent
 * is in (-4, 16], else d.ddde±XX. Caller guarantees d is finite. */
static void py_repr_double(sb *b, double d) {
    if (d == 0) {
        sb_str(b, signbit(d) ? "-0.0" : "0.0");
        return;
    }
    char buf[64];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, d);
        if (strtod(buf, NULL) == d) break;
    }
    /* buf: [-]D[.DDD]e±XX */
    char digits[32];
    int nd = 0, neg = 0;
    const char *q = buf;
    if (*q == '-') neg = 1, q++;
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9') digits[nd++] = *q;
    int exp10 = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    int decpt = exp10 + 1;
    if (neg) sb_chr(b, '-');
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            sb_str(b, "0.");
            for (int k = 0; k < -decpt; k++) sb_chr(b, '0');
            sb_add(b, digits, (size_t)nd);
        } else if (decpt >= nd) {
            sb_add(b, digits, (size_t)nd);
            for (int k = nd; k < decpt; k++) sb_chr(b, '0');
            sb_str(b, ".0");
        } else {
            sb_add(b, digits, (size_t)decpt);
            sb_chr(b, '.');
            sb_add(b, digits + decpt, (size_t)(nd - decpt));
        }
    } else {
        sb_chr(b, digits[0]);
        if (nd > 1) {
            sb_chr(b, '.');
            sb_add(b, digits + 1, (size_t)(nd - 1));
        }
        char e[16];
        snprintf(e, sizeof e, "e%c%02d", decpt - 1 < 0 ? '-' : '+', abs(decpt - 1));
        sb_str(b, e);
    }
}

/* Python's int(float) of an integral finite double, exactly (glibc prints %.0f exactly). */
static void py_int_of_double(sb *b, double d) {
    if (d == 0) {
        sb_chr(b, '0');
        return;
    }
    char buf[400];
    snprintf(buf, sizeof buf, "%.0f", d);
    sb_str(b, buf);
}

/* ---------------------------------------------------------------- json_t → Python json.dumps text */

static int dump_json(sb *b, json_t *v, int depth) {
    if (depth > 512) return -1;
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        sb_chr(b, '{');
        int first = 1;
        for (void *it = json_object_iter(v); it; it = json_object_iter_next(v, it)) {
            if (!first) sb_str(b, ", ");
            first = 0;
            json_str(b, json_object_iter_key(it), json_object_iter_key_len(it));
            sb_str(b, ": ");
            if (dump_json(b, json_object_iter_value(it), depth + 1)) return -1;
        }
        sb_chr(b, '}');
        return 0;
    }
    case JSON_ARRAY:
        sb_chr(b, '[');
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) sb_str(b, ", ");
            if (dump_json(b, json_array_get(v, i), depth + 1)) return -1;
        }
        sb_chr(b, ']');
        return 0;
    case JSON_STRING:
        json_str(b, json_string_value(v), json_string_length(v));
        return 0;
    case JSON_INTEGER: {
        char t[32];
        snprintf(t, sizeof t, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        sb_str(b, t);
        return 0;
    }
    case JSON_REAL:
        if (!isfinite(json_real_value(v))) return -1;
        py_repr_double(b, json_real_value(v));
        return 0;
    case JSON_TRUE:
        sb_str(b, "true");
        return 0;
    case JSON_FALSE:
        sb_str(b, "false");
        return 0;
    case JSON_NULL:
        sb_str(b, "null");
        return 0;
    }
    return -1;
}

/* ---------------------------------------------------------------- Python int() / float() of a string */

static int py_space(unsigned char c) {
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
}

static void py_strip(const char **s, size_t *n) {
    while (*n && py_space((unsigned char)**s)) (*s)++, (*n)--;
    while (*n && py_space((unsigned char)(*s)[*n - 1])) (*n)--;
}

/* Digits with single underscores between them (PEP 515), appended to out without the underscores.
 * Returns how many bytes were consumed (0: no digit). */
static size_t digitpart(const char *s, size_t n, sb *out) {
    size_t i = 0;
    if (i >= n || !isdigit((unsigned char)s[i])) return 0;
    while (i < n) {
        if (isdigit((unsigned char)s[i])) {
            if (out) sb_chr(out, s[i]);
            i++;
        } else if (s[i] == '_' && i + 1 < n && isdigit((unsigned char)s[i + 1])) {
            i++;
        } else
            break;
    }
    return i;
}

/* int(s) in base 10: canonical decimal (any size) into out; -1 when Python would raise. */
static int py_int(const char *s, size_t n, sb *out) {
    py_strip(&s, &n);
    int neg = 0;
    if (n && (*s == '+' || *s == '-')) neg = *s == '-', s++, n--;
    sb d = {0};
    size_t k = digitpart(s, n, &d);
    if (!k || k != n) {
        sb_free(&d);
        return -1;
    }
    size_t z = 0;
    while (z + 1 < d.n && d.p[z] == '0') z++;
    if (neg && !(d.n - z == 1 && d.p[z] == '0')) sb_chr(out, '-');
    sb_add(out, d.p + z, d.n - z);
    sb_free(&d);
    return 0;
}

/* float(s): 0 and *v (possibly inf/nan), or -1 when Python would raise. */
static int py_float(const char *s, size_t n, double *v) {
    py_strip(&s, &n);
    int neg = 0;
    if (n && (*s == '+' || *s == '-')) neg = *s == '-', s++, n--;
    if ((n == 3 && !strncasecmp(s, "inf", 3)) || (n == 8 && !strncasecmp(s, "infinity", 8))) {
        *v = neg ? -INFINITY : INFINITY;
        return 0;
    }
    if (n == 3 && !strncasecmp(s, "nan", 3)) {
        *v = NAN;
        return 0;
    }
    sb c = {0};
    sb_str(&c, neg ? "-" : "");
    size_t i = digitpart(s, n, &c), mant = i;
    if (i < n && s[i] == '.') {
        sb_chr(&c, '.');
        i++;
        size_t k = digitpart(s + i, n - i, &c);
        i += k;
        mant += k;
    }
    int ok = mant > 0;
    if (ok && i < n && (s[i] == 'e' || s[i] == 'E')) {
        sb_chr(&c, 'e');
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) sb_chr(&c, s[i++]);
        size_t k = digitpart(s + i, n - i, &c);
        ok = k > 0;
        i += k;
    }
    ok = ok && i == n;
    if (ok) *v = strtod(c.p, NULL);
    sb_free(&c);
    return ok ? 0 : -1;
}

/* ---------------------------------------------------------------- Python literals (ast.literal_eval) */

/* A subset of ast.literal_eval whose result json.dumps can write: str, int, float, True/False/None,
 * list, tuple (→ array), dict with scalar keys. Sets, bytes, complex and non-finite floats fail (vLLM
 * would fail in json.dumps instead). Duplicate dict keys are kept as written (Python keeps the last). */
enum { PK_STR, PK_INT, PK_FLOAT, PK_CONST, PK_ARRAY, PK_DICT };

typedef struct {
    const char *s;
    size_t n, i;
    int bracket; /* open brackets: newlines are insignificant inside them */
} plx;

static int pl_value(plx *x, sb *out, int *kind, sb *strval, int depth);

static int ident_char(char c) {
    return isalnum((unsigned char)c) || c == '_' || (unsigned char)c >= 0x80;
}

static void pl_skip(plx *x) {
    while (x->i < x->n) {
        char c = x->s[x->i];
        if (c == ' ' || c == '\t' || c == '\f')
            x->i++;
        else if ((c == '\n' || c == '\r') && x->bracket > 0)
            x->i++;
        else if (c == '#') {
            while (x->i < x->n && x->s[x->i] != '\n' && x->s[x->i] != '\r') x->i++;
        } else if (c == '\\' && x->i + 1 < x->n && (x->s[x->i + 1] == '\n' || x->s[x->i + 1] == '\r')) {
            x->i += 2;
            if (x->s[x->i - 1] == '\r' && x->i < x->n && x->s[x->i] == '\n') x->i++;
        } else
            break;
    }
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* String prefix + quote at x->i? Returns the prefix length (0-2) or -1. Bytes/f-string prefixes also
 * match (and fail later) so "b'x'" is not mistaken for a name. */
static int pl_string_start(const plx *x) {
    size_t i = x->i, k = 0;
    while (k < 2 && i + k < x->n && x->s[i + k] && strchr("rRuUbBfF", x->s[i + k])) k++;
    if (i + k < x->n && (x->s[i + k] == '\'' || x->s[i + k] == '"')) return (int)k;
    return -1;
}

/* One string literal (prefix included), decoded into val. */
static int pl_one_string(plx *x, sb *val) {
    int plen = pl_string_start(x);
    if (plen < 0) return -1;
    int raw = 0;
    for (int k = 0; k < plen; k++) {
        char c = (char)tolower((unsigned char)x->s[x->i + (size_t)k]);
        if (c == 'b' || c == 'f') return -1; /* bytes are not JSON; f-strings are not literals */
        if (c == 'r') raw = 1;
        if (c == 'u' && plen == 2) return -1; /* "ur" is not valid in Python 3 */
    }
    x->i += (size_t)plen;
    char q = x->s[x->i];
    int triple = x->i + 2 < x->n && x->s[x->i + 1] == q && x->s[x->i + 2] == q;
    x->i += triple ? 3 : 1;
    for (;;) {
        if (x->i >= x->n) return -1;
        char c = x->s[x->i];
        if (c == q) {
            if (!triple) {
                x->i++;
                return 0;
            }
            if (x->i + 2 < x->n && x->s[x->i + 1] == q && x->s[x->i + 2] == q) {
                x->i += 3;
                return 0;
            }
            sb_chr(val, c);
            x->i++;
            continue;
        }
        if ((c == '\n' || c == '\r') && !triple) return -1;
        if (c == '\r') { /* Python reads source newlines as \n */
            sb_chr(val, '\n');
            x->i += (x->i + 1 < x->n && x->s[x->i + 1] == '\n') ? 2 : 1;
            continue;
        }
        if (c != '\\') {
            sb_chr(val, c);
            x->i++;
            continue;
        }
        if (x->i + 1 >= x->n) return -1;
        char e = x->s[x->i + 1];
        if (raw) { /* a backslash only protects the next character from ending the string */
            sb_chr(val, '\\');
            sb_chr(val, e);
            x->i += 2;
            continue;
        }
        x->i += 2;
        switch (e) {
        case '\n':
            break;
        case '\r':
            if (x->i < x->n && x->s[x->i] == '\n') x->i++;
            break;
        case '\\':
            sb_chr(val, '\\');
            break;
        case '\'':
            sb_chr(val, '\'');
            break;
        case '"':
            sb_chr(val, '"');
            break;
        case 'a':
            sb_chr(val, 7);
            break;
        case 'b':
            sb_chr(val, 8);
            break;
        case 'f':
            sb_chr(val, 12);
            break;
        case 'n':
            sb_chr(val, '\n');
            break;
        case 'r':
            sb_chr(val, '\r');
            break;
        case 't':
            sb_chr(val, '\t');
            break;
        case 'v':
            sb_chr(val, 11);
            break;
        case 'x':
        case 'u':
        case 'U': {
            int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t cp = 0;
            for (int k = 0; k < nd; k++) {
                int h = x->i < x->n ? hexval(x->s[x->i]) : -1;
                if (h < 0) return -1;
                cp = cp * 16 + (uint32_t)h;
                x->i++;
            }
            if (cp > 0x10FFFF) return -1;
            utf8_put(val, cp);
            break;
        }
        case 'N':
            return -1; /* \N{NAME} needs the Unicode name table */
        default:
            if (e >= '0' && e <= '7') {
                uint32_t cp = (uint32_t)(e - '0');
                for (int k = 0; k < 2 && x->i < x->n && x->s[x->i] >= '0' && x->s[x->i] <= '7'; k++)
                    cp = cp * 8 + (uint32_t)(x->s[x->i++] - '0');
                utf8_put(val, cp);
            } else { /* unknown escapes stay as written */
                sb_chr(val, '\\');
                sb_chr(val, e);
            }
        }
    }
}

/* A number literal (no sign), written as JSON into out. */
static int pl_number(plx *x, int neg, sb *out, int *kind) {
    const char *s = x->s + x->i;
    size_t n = x->n - x->i;
    if (n >= 2 && s[0] == '0' && s[1] && strchr("xXoObB", s[1])) {
        int base = (s[1] == 'x' || s[1] == 'X') ? 16 : (s[1] == 'o' || s[1] == 'O') ? 8 : 2;
        size_t i = 2;
        uint64_t v = 0;
        int nd = 0;
        while (i < n) {
            if (s[i] == '_' && i + 1 < n && hexval(s[i + 1]) >= 0 && hexval(s[i + 1]) < base) {
                i++;
                continue;
            }
            int h = hexval(s[i]);
            if (h < 0 || h >= base) break;
            if (v > (UINT64_MAX - (uint64_t)h) / (uint64_t)base) return -1; /* beyond 64 bits: not handled */
            v = v * (uint64_t)base + (uint64_t)h;
            nd++;
            i++;
        }
        if (!nd || (i < n && (ident_char(s[i]) || s[i] == '.'))) return -1;
        char t[32];
        snprintf(t, sizeof t, "%s%llu", neg && v ? "-" : "", (unsigned long long)v);
        sb_str(out, t);
        x->i += i;
        *kind = PK_INT;
        return 0;
    }
    sb digits = {0};
    size_t i = digitpart(s, n, &digits);
    int is_float = 0;
    sb f = {0};
    sb_add(&f, digits.p ? digits.p : "", digits.n);
    if (i < n && s[i] == '.') {
        is_float = 1;
        sb_chr(&f, '.');
        i++;
        i += digitpart(s + i, n - i, &f);
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        size_t j = i + 1;
        sb_chr(&f, 'e');
        if (j < n && (s[j] == '+' || s[j] == '-')) sb_chr(&f, s[j++]);
        size_t k = digitpart(s + j, n - j, &f);
        if (!k) goto fail;
        i = j + k;
        is_float = 1;
    }
    if (i == 0 || (f.n == 1 && f.p[0] == '.')) goto fail;
    if (i < n && (ident_char(s[i]) || s[i] == '.')) goto fail; /* 1j (complex), 1abc, 1.2.3 */
    if (is_float) {
        double d = strtod(f.p, NULL);
        if (!isfinite(d)) goto fail;
        py_repr_double(out, neg ? -d : d);
        *kind = PK_FLOAT;
    } else {
        size_t z = 0;
        while (z + 1 < digits.n && digits.p[z] == '0') z++;
        if (digits.p[0] == '0' && !(digits.n - z == 1 && digits.p[z] == '0')) goto fail; /* 012 */
        if (neg && !(digits.n - z == 1 && digits.p[z] == '0')) sb_chr(out, '-');
        sb_add(out, digits.p + z, digits.n - z);
        *kind = PK_INT;
    }
    x->i += i;
    sb_free(&digits);
    sb_free(&f);
    return 0;
fail:
    sb_free(&digits);
    sb_free(&f);
    return -1;
}

/* Items of a list/tuple up to close; out already holds "[". */
static int pl_items(plx *x, sb *out, char close, int depth, int have_first) {
    int first = !have_first;
    for (;;) {
        pl_skip(x);
        if (x->i < x->n && x->s[x->i] == close) {
            x->i++;
            sb_chr(out, ']');
            return 0;
        }
        if (!first) sb_str(out, ", ");
        int k;
        sb sv = {0};
        int r = pl_value(x, out, &k, &sv, depth + 1);
        sb_free(&sv);
        if (r) return -1;
        first = 0;
        pl_skip(x);
        if (x->i < x->n && x->s[x->i] == ',') {
            x->i++;
            continue;
        }
        if (x->i < x->n && x->s[x->i] == close) continue;
        return -1;
    }
}

static int pl_value(plx *x, sb *out, int *kind, sb *strval, int depth) {
    if (depth > 100) return -1;
    pl_skip(x);
    if (x->i >= x->n) return -1;
    char c = x->s[x->i];
    if (c == '-' || c == '+') {
        x->i++;
        pl_skip(x);
        if (x->i >= x->n) return -1;
        char d = x->s[x->i];
        if (!(isdigit((unsigned char)d) ||
              (d == '.' && x->i + 1 < x->n && isdigit((unsigned char)x->s[x->i + 1]))))
            return -1; /* literal_eval takes one sign on a number only */
        return pl_number(x, c == '-', out, kind);
    }
    if (isdigit((unsigned char)c) || (c == '.' && x->i + 1 < x->n && isdigit((unsigned char)x->s[x->i + 1])))
        return pl_number(x, 0, out, kind);
    if (pl_string_start(x) >= 0) {
        sb_clear(strval);
        for (;;) { /* adjacent literals concatenate */
            if (pl_one_string(x, strval)) return -1;
            size_t save = x->i;
            pl_skip(x);
            if (x->i < x->n && pl_string_start(x) >= 0) continue;
            x->i = save;
            break;
        }
        json_str(out, strval->p ? strval->p : "", strval->n);
        *kind = PK_STR;
        return 0;
    }
    if (c == '[') {
        x->i++;
        x->bracket++;
        sb_chr(out, '[');
        int r = pl_items(x, out, ']', depth, 0);
        x->bracket--;
        *kind = PK_ARRAY;
        return r;
    }
    if (c == '(') {
        x->i++;
        x->bracket++;
        pl_skip(x);
        if (x->i < x->n && x->s[x->i] == ')') { /* () is an empty tuple */
            x->i++;
            x->bracket--;
            sb_str(out, "[]");
            *kind = PK_ARRAY;
            return 0;
        }
        sb first = {0};
        int r = pl_value(x, &first, kind, strval, depth + 1);
        if (!r) {
            pl_skip(x);
            if (x->i < x->n && x->s[x->i] == ',') { /* a tuple */
                x->i++;
                sb_chr(out, '[');
                sb_add(out, first.p, first.n);
                r = pl_items(x, out, ')', depth, 1);
                *kind = PK_ARRAY;
            } else if (x->i < x->n && x->s[x->i] == ')') { /* parentheses around one value */
                x->i++;
                sb_add(out, first.p, first.n);
            } else
                r = -1;
        }
        sb_free(&first);
        x->bracket--;
        return r;
    }
    if (c == '{') {
        x->i++;
        x->bracket++;
        sb_chr(out, '{');
        int first = 1, r = 0;
        for (;;) {
            pl_skip(x);
            if (x->i < x->n && x->s[x->i] == '}') {
                x->i++;
                sb_chr(out, '}');
                break;
            }
            sb key = {0}, sv = {0};
            int kk, vk;
            r = pl_value(x, &key, &kk, &sv, depth + 1);
            if (!r && (kk == PK_ARRAY || kk == PK_DICT)) r = -1; /* unhashable, or not a JSON key */
            pl_skip(x);
            if (!r && !(x->i < x->n && x->s[x->i] == ':')) r = -1; /* a set, or junk */
            if (!r) {
                x->i++;
                if (!first) sb_str(out, ", ");
                if (kk == PK_STR)
                    sb_add(out, key.p, key.n);
                else
                    json_str(out, key.p, key.n); /* json.dumps writes 1 / 1.5 / True / None keys as strings */
                sb_str(out, ": ");
                r = pl_value(x, out, &vk, &sv, depth + 1);
            }
            sb_free(&key);
            sb_free(&sv);
            if (r) break;
            first = 0;
            pl_skip(x);
            if (x->i < x->n && x->s[x->i] == ',') {
                x->i++;
                continue;
            }
            if (x->i < x->n && x->s[x->i] == '}') continue;
            r = -1;
            break;
        }
        x->bracket--;
        *kind = PK_DICT;
        return r;
    }
    static const struct {
        const char *word, *json;
    } consts[] = {{"True", "true"}, {"False", "false"}, {"None", "null"}};
    for (size_t k = 0; k < 3; k++) {
        size_t l = strlen(consts[k].word);
        if (x->n - x->i >= l && !memcmp(x->s + x->i, consts[k].word, l) &&
            !(x->i + l < x->n && ident_char(x->s[x->i + l]))) {
            x->i += l;
            sb_str(out, consts[k].json);
            *kind = PK_CONST;
            return 0;
        }
    }
    return -1;
}

/* ast.literal_eval(s) written as JSON into out; *kind the top value's kind, strval its text when a
 * string. -1 when literal_eval would raise (or json.dumps could not write the result). */
static int py_literal(const char *s, size_t n, sb *out, int *kind, sb *strval) {
    plx x = {s, n, 0, 0};
    /* literal_eval strips leading spaces/tabs; eval input may begin with blank lines */
    while (x.i < n && (py_space((unsigned char)s[x.i]))) x.i++;
    sb first = {0};
    int r = pl_value(&x, &first, kind, strval, 0);
    if (!r) {
        pl_skip(&x);
        if (x.i < n && s[x.i] == ',') { /* a bare tuple: 1, 2 */
            x.i++;
            sb_chr(out, '[');
            sb_add(out, first.p, first.n);
            for (;;) {
                pl_skip(&x);
                if (x.i >= n || s[x.i] == '\n' || s[x.i] == '\r') break;
                sb_str(out, ", ");
                int k;
                sb sv = {0};
                r = pl_value(&x, out, &k, &sv, 1);
                sb_free(&sv);
                if (r) break;
                pl_skip(&x);
                if (x.i < n && s[x.i] == ',') {
                    x.i++;
                    continue;
                }
                break;
            }
            if (!r) sb_chr(out, ']');
            *kind = PK_ARRAY;
        } else
            sb_add(out, first.p, first.n);
    }
    sb_free(&first);
    if (r) return -1;
    while (x.i < n) { /* trailing blank lines and comments */
        char c = s[x.i];
        if (py_space((unsigned char)c))
            x.i++;
        else if (c == '#')
            while (x.i < n && s[x.i] != '\n') x.i++;
        else
            return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- schema typing of XML values */

enum { PT_RAW, PT_STRING, PT_INT, PT_NUM, PT_BOOL, PT_CONTAINER, PT_OTHER };

typedef struct {
    int kind;
    int nullable;
} ptype;

static int starts(const char *s, const char *p) {
    return !strncmp(s, p, strlen(p));
}

static ptype type_from_name(const char *t, int nullable) {
    static const char *strs[] = {"string", "str", "text", "varchar", "char", "enum"};
    ptype r = {PT_OTHER, nullable};
    for (size_t i = 0; i < 6; i++)
        if (!strcmp(t, strs[i])) r.kind = PT_STRING;
    if (r.kind == PT_STRING) return r;
    if (starts(t, "int") || starts(t, "uint") || starts(t, "long") || starts(t, "short") ||
        starts(t, "unsigned"))
        r.kind = PT_INT;
    else if (starts(t, "num") || starts(t, "float"))
        r.kind = PT_NUM;
    else if (!strcmp(t, "boolean") || !strcmp(t, "bool") || !strcmp(t, "binary"))
        r.kind = PT_BOOL;
    else if (!strcmp(t, "object") || !strcmp(t, "array") || !strcmp(t, "arr") || starts(t, "dict") ||
             starts(t, "list"))
        r.kind = PT_CONTAINER;
    return r;
}

/* str(type).strip().lower() for a JSON string type. */
static void type_norm(const char *s, char *out, size_t cap) {
    size_t n = strlen(s);
    while (n && py_space((unsigned char)*s)) s++, n--;
    while (n && py_space((unsigned char)s[n - 1])) n--;
    if (n >= cap) n = cap - 1;
    for (size_t i = 0; i < n; i++) out[i] = (char)tolower((unsigned char)s[i]);
    out[n] = 0;
}

/* The first non-null type of a list of types (a "type" array or an "anyOf" of schemas). */
static ptype type_from_list(json_t *list, int is_anyof) {
    char t[64] = "string";
    int nullable = 0, picked = 0;
    for (size_t i = 0; i < json_array_size(list); i++) {
        json_t *e = json_array_get(list, i);
        if (is_anyof) e = json_is_object(e) ? json_object_get(e, "type") : NULL;
        if (!json_is_string(e)) continue;
        char u[64];
        type_norm(json_string_value(e), u, sizeof u);
        if (!strcmp(u, "null"))
            nullable = 1;
        else if (!picked) {
            memcpy(t, u, sizeof t);
            picked = 1;
        }
    }
    return type_from_name(t, nullable);
}

/* How vLLM's _convert_param_value types parameter pname given the tool's properties. A "type" list
 * (["string","null"]) is read like an anyOf; vLLM would take str() of the list and fall through to
 * literal_eval, which turns a string-typed "123" into a number — we judge that a bug, not a behaviour. */
static ptype classify(json_t *props, const char *pname) {
    json_t *pc = json_is_object(props) ? json_object_get(props, pname) : NULL;
    if (!pc) return (ptype){PT_RAW, 0}; /* not in the schema: kept as a string */
    json_t *ty = json_is_object(pc) ? json_object_get(pc, "type") : NULL;
    if (ty) {
        if (json_is_string(ty)) {
            char t[64];
            type_norm(json_string_value(ty), t, sizeof t);
            return type_from_name(t, !strcmp(t, "null"));
        }
        if (json_is_array(ty)) return type_from_list(ty, 0);
        return (ptype){PT_OTHER, 0};
    }
    json_t *any = json_is_object(pc) ? json_object_get(pc, "anyOf") : NULL;
    if (json_is_array(any)) return type_from_list(any, 1);
    return (ptype){PT_STRING, 0};
}

static int lower_eq(const char *s, size_t n, const char *w) {
    if (n != strlen(w)) return 0;
    for (size_t i = 0; i < n; i++)
        if (tolower((unsigned char)s[i]) != w[i]) return 0;
    return 1;
}

/* Writes the JSON of one value converted per its type into out. */
static void convert_value(ptype pt, const char *v, size_t n, sb *out) {
    if (pt.kind == PT_RAW) goto as_string;
    int is_null = lower_eq(v, n, "null") ||
                  lower_eq(v, n, "none"); /* None: the template writes null args via |string */
    if (pt.nullable && is_null) goto as_null;
    if (pt.kind == PT_STRING) goto as_string;
    if (is_null) goto as_null;
    switch (pt.kind) {
    case PT_INT: {
        size_t mark = out->n;
        if (!py_int(v, n, out)) return;
        out->n = mark;
        goto as_string;
    }
    case PT_NUM: {
        double d;
        /* inf/nan: vLLM's int(inf) raises OverflowError, which its caller turns into "everything is
         * content"; we keep the value as a string instead. */
        if (py_float(v, n, &d) || !isfinite(d)) goto as_string;
        if (d == trunc(d))
            py_int_of_double(out, d);
        else
            py_repr_double(out, d);
        return;
    }
    case PT_BOOL:
        sb_str(out, lower_eq(v, n, "true") ? "true" : "false");
        return;
    default:
        break;
    }
    {
        int container = pt.kind == PT_CONTAINER;
        sb tmp = {0}, sv = {0};
        int k;
        if (container) {
            json_error_t je;
            json_t *j = json_loadb(v, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
            if (j) {
                int ok = 0;
                /* a JSON-encoded Python repr ("{'k': 'v'}"): vLLM tries literal_eval on the string */
                if (json_is_string(j) &&
                    !py_literal(json_string_value(j), json_string_length(j), &tmp, &k, &sv)) {
                    sb_add(out, tmp.p, tmp.n);
                    ok = 1;
                }
                if (!ok) {
                    size_t mark = out->n;
                    if (dump_json(out, j, 0))
                        out->n = mark;
                    else
                        ok = 1;
                }
                json_decref(j);
                sb_free(&tmp);
                sb_free(&sv);
                if (ok) return;
                goto as_string;
            }
        }
        if (!py_literal(v, n, &tmp, &k, &sv)) {
            if (container && k == PK_STR) {
                sb tmp2 = {0}, sv2 = {0};
                int k2;
                if (!py_literal(sv.p ? sv.p : "", sv.n, &tmp2, &k2, &sv2))
                    sb_add(out, tmp2.p, tmp2.n);
                else
                    sb_add(out, tmp.p, tmp.n);
                sb_free(&tmp2);
                sb_free(&sv2);
            } else
                sb_add(out, tmp.p, tmp.n);
            sb_free(&tmp);
            sb_free(&sv);
            return;
        }
        sb_free(&tmp);
        sb_free(&sv);
    }
as_string:
    json_str(out, v, n);
    return;
as_null:
    sb_str(out, "null");
}

int tc_convert_value(const char *props_json, const char *pname, const char *value, size_t vlen, char *out,
                     size_t outcap) {
    json_t *props = props_json ? json_loads(props_json, 0, NULL) : NULL;
    sb o = {0};
    convert_value(classify(props, pname), value, vlen, &o);
    json_decref(props);
    int r = o.n + 1 > outcap ? CINFER_ERANGE : (int)o.n;
    if (r >= 0) memcpy(out, o.p, o.n + 1);
    sb_free(&o);
    return r;
}

/* ---------------------------------------------------------------- the parser */

typedef struct {
    const char *name;
    json_t *props; /* parameters.properties, or NULL */
} tc_func;

enum { P_TEXT, P_XML, P_JSON, P_CLOSE };
enum { X_OPEN, X_NAME, X_BODY, X_PNAME, X_PVSTART, X_PVALUE };
enum { J_OPEN, J_OBJ };
enum { JS_UNDECIDED, JS_STREAM, JS_OTHER };
enum { M_STREAM, M_BUFFER, M_DISCARD };
enum { R_WAIT, R_CONT };

#define NAME_MAX_LEN 256

struct tc_parser {
    tc_format fmt;
    json_t *tools; /* owns the parsed tools; funcs point into it */
    tc_func *funcs;
    size_t n_funcs;
    int have_tools;
    uint64_t rng;
    int finished;
    int n_begun, n_done;

    sb buf; /* undecided text; inside a call it starts at the call's opening tag */
    int state;
    int after_call; /* P_TEXT: blanks at the start of buf follow a call and are dropped before another */

    /* the call being parsed (positions index buf) */
    int sub;    /* X_* or J_* */
    int bare;   /* opened by <function= without <tool_call> */
    size_t pos; /* where parsing resumes */
    int begun;  /* TC_EV_CALL_BEGIN sent */
    int index;
    char id[32];
    char *name;
    json_t *props;
    sb args;   /* the arguments JSON sent so far */
    int nargs; /* parameters written into args */
    sb seen;   /* parameter names met so far, each NUL-terminated */
    /* the parameter being parsed */
    char *pname;
    ptype pt;
    int mode;
    size_t vtext, vstart, vscan, vemit;
    /* J_OBJ scan */
    size_t jstart;
    int jdepth, jstr, jesc;
    int jshape;                     /* JS_*: whether the arguments stream */
    size_t jargs_s, jargs_e, jemit; /* the arguments object [s, e) (e = 0 until closed); sent up to jemit */
};

static const char T_CALL[] = "<tool_call>", T_CALL_END[] = "</tool_call>",
                  T_FUNC[] = "<function=", T_FUNC_END[] = "</function>",
                  T_PARAM[] = "<parameter=", T_PARAM_END[] = "</parameter>";
#define TLEN(t) (sizeof(t) - 1)

static int is_blank(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* 2: buf[i..] starts with tag; 1: buf[i..] is a proper prefix of it; 0: neither. */
static int match_at(const sb *b, size_t i, const char *tag, size_t tl) {
    size_t n = b->n - i, m = n < tl ? n : tl;
    if (memcmp(b->p + i, tag, m)) return 0;
    return n >= tl ? 2 : 1;
}

static size_t skip_blank(const sb *b, size_t i) {
    while (i < b->n && is_blank((unsigned char)b->p[i])) i++;
    return i;
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void ev_content(const char *s, size_t n, tc_event_cb cb, void *ud) {
    if (!n || !cb) return;
    tc_event e = {TC_EV_CONTENT, -1, NULL, NULL, s, n};
    cb(&e, ud);
}

static void ev_args(tc_parser *p, const char *s, size_t n, tc_event_cb cb, void *ud) {
    if (!n) return;
    sb_add(&p->args, s, n);
    if (!cb) return;
    tc_event e = {TC_EV_CALL_ARGS, p->index, NULL, NULL, s, n};
    cb(&e, ud);
}

static void consume(tc_parser *p, size_t n) {
    memmove(p->buf.p, p->buf.p + n, p->buf.n - n);
    p->buf.n -= n;
    p->buf.p[p->buf.n] = 0;
}

static void call_reset(tc_parser *p) {
    free(p->name);
    free(p->pname);
    p->name = p->pname = NULL;
    p->props = NULL;
    p->begun = 0;
    p->nargs = 0;
    p->bare = 0;
    sb_clear(&p->args);
    sb_clear(&p->seen);
}

static const tc_func *find_func(const tc_parser *p, const char *name, size_t n) {
    for (size_t i = 0; i < p->n_funcs; i++)
        if (strlen(p->funcs[i].name) == n && !memcmp(p->funcs[i].name, name, n)) return &p->funcs[i];
    return NULL;
}

/* vLLM _is_valid_function_name: no template syntax, quotes or blanks. */
static int name_char_ok(unsigned char c) {
    return !strchr("{}<>\"' \t\n\r", c) && c;
}

static void call_begin(tc_parser *p, const char *name, size_t n, tc_event_cb cb, void *ud) {
    const tc_func *f = find_func(p, name, n);
    p->name = xstrndup(name, n);
    p->props = f ? f->props : NULL;
    p->index = p->n_begun++;
    uint64_t a = splitmix(&p->rng), b = splitmix(&p->rng);
    snprintf(p->id, sizeof p->id, "call_%016llx%08llx", (unsigned long long)a, (unsigned long long)(b >> 32));
    p->begun = 1;
    if (!cb) return;
    tc_event e = {TC_EV_CALL_BEGIN, p->index, p->id, p->name, NULL, 0};
    cb(&e, ud);
}

static void call_end(tc_parser *p, tc_event_cb cb, void *ud) {
    ev_args(p, p->nargs ? "}" : "{}", p->nargs ? 1 : 2, cb, ud);
    p->n_done++;
    if (cb) {
        tc_event e = {TC_EV_CALL_END, p->index, p->id, p->name, p->args.p, p->args.n};
        cb(&e, ud);
    }
    call_reset(p);
}

/* The opening tag (len tl) was not a call after all: it is content; parsing resumes right after it. */
static int not_a_call(tc_parser *p, size_t tl, tc_event_cb cb, void *ud) {
    ev_content(p->buf.p, tl, cb, ud);
    consume(p, tl);
    call_reset(p);
    p->state = P_TEXT;
    p->after_call = 0;
    return R_CONT;
}

/* The stream ended inside a call: the call's raw text becomes content. */
static int call_abort(tc_parser *p, tc_event_cb cb, void *ud) {
    if (p->begun && cb) {
        tc_event e = {TC_EV_CALL_ABORT, p->index, p->id, p->name, NULL, 0};
        cb(&e, ud);
    }
    ev_content(p->buf.p, p->buf.n, cb, ud);
    sb_clear(&p->buf);
    call_reset(p);
    p->state = P_TEXT;
    p->after_call = 0;
    return R_CONT;
}

static int need_more(tc_parser *p, int final, tc_event_cb cb, void *ud) {
    return final ? call_abort(p, cb, ud) : R_WAIT;
}

/* Which opening tag is at buf[i]: 2 full (*tl its length), 1 maybe (a prefix), 0 none. */
static int opener_at(const tc_parser *p, size_t i, size_t *tl) {
    int a = match_at(&p->buf, i, T_CALL, TLEN(T_CALL));
    int b = p->fmt == TC_FORMAT_QWEN_XML ? match_at(&p->buf, i, T_FUNC, TLEN(T_FUNC)) : 0;
    if (a == 2) *tl = TLEN(T_CALL);
    if (b == 2) *tl = TLEN(T_FUNC);
    return a == 2 || b == 2 ? 2 : (a || b) ? 1 : 0;
}

static void call_open(tc_parser *p, size_t tl) {
    call_reset(p);
    p->after_call = 0;
    p->pos = tl;
    if (p->fmt == TC_FORMAT_HERMES_JSON) {
        p->state = P_JSON;
        p->sub = J_OPEN;
    } else {
        p->state = P_XML;
        p->bare = tl == TLEN(T_FUNC);
        p->sub = p->bare ? X_NAME : X_OPEN;
    }
}

static int text_step(tc_parser *p, int final, tc_event_cb cb, void *ud) {
    size_t tl = 0;
    if (p->after_call) {
        size_t q = skip_blank(&p->buf, 0);
        if (q == p->buf.n) {
            if (final) sb_clear(&p->buf); /* blanks after the last call are not content */
            return R_WAIT;
        }
        int m = opener_at(p, q, &tl);
        if (m == 2) {
            consume(p, q);
            call_open(p, tl);
            return R_CONT;
        }
        if (m == 1 && !final) return R_WAIT;
        p->after_call = 0;
    }
    for (size_t i = 0; i < p->buf.n; i++) {
        if (p->buf.p[i] != '<') continue;
        int m = opener_at(p, i, &tl);
        if (m == 2) {
            ev_content(p->buf.p, i, cb, ud);
            consume(p, i);
            call_open(p, tl);
            return R_CONT;
        }
        if (m == 1 && !final) {
            ev_content(p->buf.p, i, cb, ud);
            consume(p, i);
            return R_WAIT;
        }
    }
    ev_content(p->buf.p, p->buf.n, cb, ud);
    sb_clear(&p->buf);
    return R_WAIT;
}

/* After a call: blanks, then an optional </tool_call>. */
static int close_step(tc_parser *p, int final) {
    size_t q = skip_blank(&p->buf, 0);
    int m = q < p->buf.n ? match_at(&p->buf, q, T_CALL_END, TLEN(T_CALL_END)) : 1;
    if (m == 2)
        consume(p, q + TLEN(T_CALL_END));
    else if (m == 1 && !final)
        return R_WAIT;
    p->state = P_TEXT;
    p->after_call = 1;
    return R_CONT;
}

static int seen_has(const tc_parser *p, const char *name, size_t n) {
    for (size_t i = 0; i < p->seen.n;) {
        size_t l = strlen(p->seen.p + i);
        if (l == n && !memcmp(p->seen.p + i, name, n)) return 1;
        i += l + 1;
    }
    return 0;
}

static int prop_known(const tc_parser *p, const char *name, size_t n) {
    return json_object_getn(p->props, name, n) != NULL;
}

/* Does a </parameter>, </function> or <parameter= at buf[i] end the current value? As in vLLM's
 * _find_true_param_end, a </parameter> is structural only when followed (after blanks) by <parameter=,
 * </function> or </tool_call> (or the end of the text), so a literal </parameter> inside a value does
 * not cut it. vLLM further requires that <parameter=NAME> name a schema parameter; that swallows a
 * parameter the schema lacks into the previous value, so we accept any NAME (unknown parameters are
 * kept, as strings). A </function> followed by </tool_call> (or the end) closes a value whose
 * </parameter> is missing, and so does a <parameter=NAME> at a line start naming a schema parameter not
 * seen yet (vLLM applies that one only when no later </parameter> exists — which a stream cannot know;
 * this is our streaming form of it). Returns 2 (ends: *vend, *next), 1 (undecided), 0 (no). */
static int value_end_at(tc_parser *p, size_t i, int final, size_t *vend, size_t *next) {
    const sb *b = &p->buf;
    int has_names = json_is_object(p->props) && json_object_size(p->props) > 0;
    int m = match_at(b, i, T_PARAM_END, TLEN(T_PARAM_END));
    if (m == 1) return final ? 0 : 1;
    if (m == 2) {
        size_t q = skip_blank(b, i + TLEN(T_PARAM_END));
        *vend = i;
        *next = i + TLEN(T_PARAM_END);
        if (q == b->n) return final ? 2 : 1;
        int a = match_at(b, q, T_PARAM, TLEN(T_PARAM));
        if (a == 2) return 2;
        int f = match_at(b, q, T_FUNC_END, TLEN(T_FUNC_END));
        int c = match_at(b, q, T_CALL_END, TLEN(T_CALL_END));
        if (f == 2 || c == 2) return 2;
        if (a == 1 || f == 1 || c == 1) return final ? 0 : 1;
        return 0;
    }
    m = match_at(b, i, T_FUNC_END, TLEN(T_FUNC_END));
    if (m == 1) return final ? 0 : 1;
    if (m == 2) {
        size_t q = skip_blank(b, i + TLEN(T_FUNC_END));
        *vend = *next = i;
        if (q == b->n) return final ? 2 : 1;
        int c = match_at(b, q, T_CALL_END, TLEN(T_CALL_END));
        return c == 2 ? 2 : (c == 1 && !final) ? 1 : 0;
    }
    if (has_names && (i == p->vtext || b->p[i - 1] == '\n')) {
        m = match_at(b, i, T_PARAM, TLEN(T_PARAM));
        if (m == 1) return final ? 0 : 1;
        if (m == 2) {
            size_t s = i + TLEN(T_PARAM);
            const char *gt = memchr(b->p + s, '>', b->n - s);
            if (!gt) return final ? 0 : 1;
            size_t nl = (size_t)(gt - (b->p + s));
            if (prop_known(p, b->p + s, nl) && !seen_has(p, b->p + s, nl)) {
                *vend = *next = i;
                return 2;
            }
        }
    }
    return 0;
}

static void args_key(tc_parser *p, tc_event_cb cb, void *ud) {
    sb k = {0};
    sb_str(&k, p->nargs ? ", " : "{");
    json_str(&k, p->pname, strlen(p->pname));
    sb_str(&k, ": ");
    p->nargs++;
    ev_args(p, k.p, k.n, cb, ud);
    sb_free(&k);
}

/* Streams a string value's text up to upto, holding back one trailing newline (the reference strips
 * one) and an unfinished UTF-8 sequence. */
static void value_stream(tc_parser *p, size_t upto, tc_event_cb cb, void *ud) {
    if (p->mode != M_STREAM) return;
    size_t safe = upto;
    if (safe > p->vemit && p->buf.p[safe - 1] == '\n') safe--;
    for (size_t back = 1; back <= 3 && back <= safe - p->vemit; back++) { /* an unfinished sequence */
        unsigned char c = (unsigned char)p->buf.p[safe - back];
        uint32_t cp;
        if (c < 0x80) break;
        if (c >= 0xC0) {
            if (utf8_seq((const unsigned char *)p->buf.p + safe - back, back, &cp) == -1) safe -= back;
            break;
        }
    }
    if (safe <= p->vemit) return;
    sb t = {0};
    json_esc(&t, p->buf.p + p->vemit, safe - p->vemit);
    ev_args(p, t.p, t.n, cb, ud);
    sb_free(&t);
    p->vemit = safe;
}

static void value_finish(tc_parser *p, size_t vend, tc_event_cb cb, void *ud) {
    if (vend > p->vstart && p->buf.p[vend - 1] == '\n') vend--;
    if (vend < p->vstart) vend = p->vstart;
    sb t = {0};
    if (p->mode == M_STREAM) {
        json_esc(&t, p->buf.p + p->vemit, vend > p->vemit ? vend - p->vemit : 0);
        sb_chr(&t, '"');
        ev_args(p, t.p, t.n, cb, ud);
    } else if (p->mode == M_BUFFER) {
        args_key(p, cb, ud);
        convert_value(p->pt, p->buf.p + p->vstart, vend - p->vstart, &t);
        ev_args(p, t.p, t.n, cb, ud);
    }
    sb_free(&t);
    free(p->pname);
    p->pname = NULL;
}

static int xml_step(tc_parser *p, int final, tc_event_cb cb, void *ud) {
    sb *b = &p->buf;
    for (;;) {
        switch (p->sub) {
        case X_OPEN: {
            size_t q = skip_blank(b, p->pos);
            int m = q < b->n ? match_at(b, q, T_FUNC, TLEN(T_FUNC)) : 1;
            if (m == 0) return not_a_call(p, TLEN(T_CALL), cb, ud);
            if (m == 1) return need_more(p, final, cb, ud);
            p->pos = q + TLEN(T_FUNC);
            p->sub = X_NAME;
            break;
        }
        case X_NAME: {
            size_t open = p->bare ? TLEN(T_FUNC) : TLEN(T_CALL);
            size_t e = p->pos;
            while (e < b->n && b->p[e] != '>' && name_char_ok((unsigned char)b->p[e])) e++;
            if (e - p->pos > NAME_MAX_LEN) return not_a_call(p, open, cb, ud);
            if (e == b->n) return need_more(p, final, cb, ud);
            if (b->p[e] != '>' || e == p->pos) return not_a_call(p, open, cb, ud);
            if (p->have_tools && !find_func(p, b->p + p->pos, e - p->pos)) return not_a_call(p, open, cb, ud);
            call_begin(p, b->p + p->pos, e - p->pos, cb, ud);
            p->pos = e + 1;
            p->sub = X_BODY;
            break;
        }
        case X_BODY: {
            size_t q = skip_blank(b, p->pos);
            if (q == b->n) return need_more(p, final, cb, ud);
            int f = match_at(b, q, T_FUNC_END, TLEN(T_FUNC_END));
            int a = match_at(b, q, T_PARAM, TLEN(T_PARAM));
            if (f == 2) {
                int bare = p->bare;
                call_end(p, cb, ud);
                consume(p, q + TLEN(T_FUNC_END));
                p->state = bare ? P_TEXT : P_CLOSE; /* a bare block has no </tool_call> to wait for */
                p->after_call = bare;
                return R_CONT;
            }
            if (a == 2) {
                p->pos = q + TLEN(T_PARAM);
                p->vscan = p->pos; /* reused as the name scan cursor */
                p->sub = X_PNAME;
                break;
            }
            if (f == 1 || a == 1) return need_more(p, final, cb, ud);
            p->pos = q + 1; /* stray text between parameters is skipped, as the reference's regexes do */
            break;
        }
        case X_PNAME: {
            const char *gt = memchr(b->p + p->vscan, '>', b->n - p->vscan);
            if (!gt) {
                p->vscan = b->n;
                return need_more(p, final, cb, ud);
            }
            size_t e = (size_t)(gt - b->p);
            p->pname = xstrndup(b->p + p->pos, e - p->pos);
            p->pos = e + 1;
            p->vtext = p->pos;
            p->sub = X_PVSTART;
            break;
        }
        case X_PVSTART: {
            if (p->pos == b->n) return need_more(p, final, cb, ud);
            if (b->p[p->pos] == '\n') p->pos++;
            p->vstart = p->vscan = p->vemit = p->pos;
            size_t nl = strlen(p->pname);
            /* a repeated parameter: the first one stands (vLLM keeps the last; a stream has already sent
             * the first) */
            if (seen_has(p, p->pname, nl))
                p->mode = M_DISCARD;
            else {
                p->pt = classify(p->props, p->pname);
                p->mode = ((p->pt.kind == PT_RAW || p->pt.kind == PT_STRING) && !p->pt.nullable) ? M_STREAM
                                                                                                 : M_BUFFER;
                sb_add(&p->seen, p->pname, nl + 1);
            }
            if (p->mode == M_STREAM) {
                args_key(p, cb, ud);
                ev_args(p, "\"", 1, cb, ud);
            }
            p->sub = X_PVALUE;
            break;
        }
        case X_PVALUE: {
            size_t vend = 0, next = 0;
            int r = 0;
            size_t i = p->vscan;
            for (; i < b->n; i++) {
                if (b->p[i] != '<') continue;
                r = value_end_at(p, i, final, &vend, &next);
                if (r) break;
            }
            if (r == 2) {
                value_stream(p, vend, cb, ud);
                value_finish(p, vend, cb, ud);
                p->pos = next;
                p->sub = X_BODY;
                break;
            }
            p->vscan = i;
            value_stream(p, i, cb, ud);
            return need_more(p, final, cb, ud);
        }
        }
    }
}

/* A Hermes call object: {"name": NAME, "arguments": {...}} (or "parameters"). Writes the arguments
 * JSON into args and returns the name, or NULL when the object is not a valid call. */
static const char *json_call(const tc_parser *p, json_t *root, sb *args) {
    if (!json_is_object(root)) return NULL;
    json_t *name = json_object_get(root, "name");
    if (!json_is_string(name) || !json_string_length(name)) return NULL;
    if (p->have_tools && !find_func(p, json_string_value(name), json_string_length(name))) return NULL;
    json_t *a = json_object_get(root, "arguments");
    if (!a) a = json_object_get(root, "parameters");
    if (!a) {
        sb_str(args, "{}");
        return json_string_value(name);
    }
    json_t *own = NULL;
    if (json_is_string(a)) /* arguments sent as a JSON string: OpenAI clients want the object */
        a = own = json_loadb(json_string_value(a), json_string_length(a), 0, NULL);
    int ok = json_is_object(a) && !dump_json(args, a, 0);
    json_decref(own);
    return ok ? json_string_value(name) : NULL;
}

/* The usual shape, {"name": "NAME", "arguments": {…}} (or "parameters"), lets a call stream: the name
 * as soon as its string closes, then the arguments object's own text as it comes (what vLLM's hermes
 * parser streams). Returns 0 (another shape), 1 (consistent so far), 2 (matched; *args_at = the
 * arguments' '{'). *name_s and *name_e are set once the name string is closed. */
static int hermes_shape(const sb *b, size_t i, size_t *name_s, size_t *name_e, size_t *args_at) {
    const char *s = b->p;
    size_t n = b->n;
#define LIT(str)                                                                                             \
    for (const char *l_ = (str); *l_; l_++, i++) {                                                           \
        if (i >= n) return 1;                                                                                \
        if (s[i] != *l_) return 0;                                                                           \
    }
#define BLANKS() i = skip_blank(b, i)
    i++; /* '{' */
    BLANKS();
    LIT("\"name\"");
    BLANKS();
    LIT(":");
    BLANKS();
    LIT("\"");
    size_t ns = i;
    for (; i < n && s[i] != '"'; i++)
        if (s[i] == '\\' || (unsigned char)s[i] < 0x20 || i - ns > NAME_MAX_LEN)
            return 0; /* escapes: jansson decodes */
    if (i >= n) return 1;
    *name_s = ns;
    *name_e = i++;
    BLANKS();
    LIT(",");
    BLANKS();
    LIT("\"");
    if (i >= n) return 1;
    if (s[i] == 'a') {
        LIT("arguments\"");
    } else {
        LIT("parameters\"");
    }
    BLANKS();
    LIT(":");
    BLANKS();
    if (i >= n) return 1;
    if (s[i] != '{') return 0;
    *args_at = i;
    return 2;
#undef LIT
#undef BLANKS
}

/* A call that failed its final check after TC_EV_CALL_BEGIN: abort it, then treat its tag as content
 * exactly as when it was never begun (so the result does not depend on when BEGIN went out). */
static int json_reject(tc_parser *p, tc_event_cb cb, void *ud) {
    if (p->begun && cb) {
        tc_event e = {TC_EV_CALL_ABORT, p->index, p->id, p->name, NULL, 0};
        cb(&e, ud);
    }
    return not_a_call(p, TLEN(T_CALL), cb, ud);
}

static int json_step(tc_parser *p, int final, tc_event_cb cb, void *ud) {
    sb *b = &p->buf;
    if (p->sub == J_OPEN) {
        size_t q = skip_blank(b, p->pos);
        if (q == b->n) return need_more(p, final, cb, ud);
        if (b->p[q] != '{') return not_a_call(p, TLEN(T_CALL), cb, ud);
        p->jstart = p->pos = q;
        p->jdepth = p->jstr = p->jesc = 0;
        p->jshape = JS_UNDECIDED;
        p->jargs_s = p->jargs_e = 0;
        p->sub = J_OBJ;
    }
    if (p->jshape == JS_UNDECIDED) {
        size_t ns = SIZE_MAX, ne = SIZE_MAX, at = 0;
        int m = hermes_shape(b, p->jstart, &ns, &ne, &at);
        if (ne != SIZE_MAX && !p->begun) {
            if (ne == ns || (p->have_tools && !find_func(p, b->p + ns, ne - ns)))
                return not_a_call(p, TLEN(T_CALL), cb, ud);
            call_begin(p, b->p + ns, ne - ns, cb, ud);
        }
        if (m == 2) {
            p->jshape = JS_STREAM;
            p->jargs_s = p->jemit = at;
        } else if (m == 0)
            p->jshape = JS_OTHER;
    }
    /* the object's extent by bracket depth outside strings; jansson judges it afterwards */
    size_t i = p->pos;
    for (; i < b->n; i++) {
        char c = b->p[i];
        if (p->jstr) {
            if (p->jesc)
                p->jesc = 0;
            else if (c == '\\')
                p->jesc = 1;
            else if (c == '"')
                p->jstr = 0;
            continue;
        }
        if (c == '"')
            p->jstr = 1;
        else if (c == '{' || c == '[')
            p->jdepth++;
        else if (c == '}' || c == ']') {
            p->jdepth--;
            if (p->jshape == JS_STREAM && !p->jargs_e && p->jdepth == 1 && i > p->jargs_s) p->jargs_e = i + 1;
            if (p->jdepth == 0) break;
        }
    }
    if (p->jshape == JS_STREAM && p->begun) { /* the arguments' text so far, verbatim */
        size_t upto = p->jargs_e ? p->jargs_e : i;
        if (upto > p->jemit) ev_args(p, b->p + p->jemit, upto - p->jemit, cb, ud);
        if (upto > p->jemit) p->jemit = upto;
    }
    if (i == b->n) {
        p->pos = i;
        return need_more(p, final, cb, ud);
    }
    size_t end = i + 1;
    json_t *root = json_loadb(b->p + p->jstart, end - p->jstart, 0, NULL);
    sb args = {0};
    int ok;
    if (p->jshape == JS_STREAM) {
        /* what was streamed must be exactly the call's arguments, and the name the call's name */
        json_t *name = json_object_get(root, "name");
        json_t *a = json_object_get(root, "arguments");
        if (!a) a = json_object_get(root, "parameters");
        json_t *streamed =
            p->jargs_e ? json_loadb(b->p + p->jargs_s, p->jargs_e - p->jargs_s, 0, NULL) : NULL;
        ok = json_is_string(name) && !strcmp(json_string_value(name), p->name) && json_is_object(streamed) &&
             json_equal(streamed, a);
        json_decref(streamed);
    } else {
        const char *name = root ? json_call(p, root, &args) : NULL;
        ok = name && (!p->begun || !strcmp(name, p->name));
        if (ok && !p->begun) call_begin(p, name, strlen(name), cb, ud);
        if (ok) ev_args(p, args.p, args.n, cb, ud);
    }
    sb_free(&args);
    json_decref(root);
    if (!ok) return json_reject(p, cb, ud);
    p->n_done++;
    if (cb) {
        tc_event e = {TC_EV_CALL_END, p->index, p->id, p->name, p->args.p, p->args.n};
        cb(&e, ud);
    }
    call_reset(p);
    consume(p, end);
    p->state = P_CLOSE;
    return R_CONT;
}

static void process(tc_parser *p, int final, tc_event_cb cb, void *ud) {
    for (;;) {
        int r = R_WAIT;
        switch (p->state) {
        case P_TEXT:
            r = text_step(p, final, cb, ud);
            break;
        case P_XML:
            r = xml_step(p, final, cb, ud);
            break;
        case P_JSON:
            r = json_step(p, final, cb, ud);
            break;
        case P_CLOSE:
            r = close_step(p, final);
            break;
        }
        if (r == R_WAIT) return;
    }
}

/* ---------------------------------------------------------------- public API */

static int load_tools(tc_parser *p, const char *js, size_t n, char *err, size_t errlen) {
    json_error_t je;
    p->tools = json_loadb(js, n, 0, &je);
    if (!p->tools) return ci_err(err, errlen, CINFER_EFORMAT, "tools: %s (line %d)", je.text, je.line);
    if (!json_is_array(p->tools)) return ci_err(err, errlen, CINFER_EFORMAT, "tools: not a JSON array");
    p->have_tools = 1;
    p->funcs = xcalloc(json_array_size(p->tools) + 1, sizeof *p->funcs);
    for (size_t i = 0; i < json_array_size(p->tools); i++) {
        json_t *t = json_array_get(p->tools, i);
        json_t *f = json_is_object(t) ? json_object_get(t, "function") : NULL;
        if (!json_is_object(f)) f = t;
        if (!json_is_object(f)) continue;
        json_t *name = json_object_get(f, "name");
        if (!json_is_string(name)) continue;
        json_t *params = json_object_get(f, "parameters");
        if (!params) params = json_object_get(f, "input_schema");
        json_t *props = json_is_object(params) ? json_object_get(params, "properties") : NULL;
        p->funcs[p->n_funcs++] = (tc_func){json_string_value(name), json_is_object(props) ? props : NULL};
    }
    return 0;
}

int tc_create(tc_parser **out, tc_format fmt, const char *tools_json, size_t tools_len, char *err,
              size_t errlen) {
    *out = NULL;
    if (fmt != TC_FORMAT_QWEN_XML && fmt != TC_FORMAT_HERMES_JSON)
        return ci_err(err, errlen, CINFER_EINVAL, "unknown tool-call format %d", (int)fmt);
    tc_parser *p = xcalloc(1, sizeof *p);
    p->fmt = fmt;
    sb_add(&p->buf, "", 0); /* buf.p is never NULL: memmove/memcmp take it */
    if (tools_json && tools_len) {
        int rc = load_tools(p, tools_json, tools_len, err, errlen);
        if (rc) {
            tc_free(p);
            return rc;
        }
    }
    /* call ids only need to be unique across requests, not secret */
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) != (ssize_t)sizeof seed)
        seed = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)p ^ ((uint64_t)clock() << 32);
    p->rng = seed;
    *out = p;
    return 0;
}

int tc_feed(tc_parser *p, const char *text, size_t len, tc_event_cb cb, void *ud) {
    if (p->finished) return CINFER_ESTATE;
    if (!len) return 0;
    sb_add(&p->buf, text, len);
    process(p, 0, cb, ud);
    return 0;
}

int tc_finish(tc_parser *p, tc_event_cb cb, void *ud) {
    if (p->finished) return CINFER_ESTATE;
    process(p, 1, cb, ud);
    p->finished = 1;
    return 0;
}

int tc_num_calls(const tc_parser *p) {
    return p->n_done;
}

void tc_free(tc_parser *p) {
    if (!p) return;
    call_reset(p);
    sb_free(&p->buf);
    sb_free(&p->args);
    sb_free(&p->seen);
    free(p->funcs);
    json_decref(p->tools);
    free(p);
}

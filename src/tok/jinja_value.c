/* jinja_value.c — the values of the template interpreter and how Python shows them: the arena they live in,
 * truthiness and ==, str()/repr() exactly as CPython prints them (templates print lists and floats, and the
 * output must be byte-identical), json.dumps for `tojson`, UTF-8 indexing, and JSON input via jansson. */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tok/jinja.h"
#include "util/err.h"

/* ---- arena ---- */
struct ja_chunk {
    ja_chunk *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

void ja_init(jarena *a, size_t limit) {
    memset(a, 0, sizeof *a);
    a->limit = limit;
}

void ja_free(jarena *a) {
    ja_chunk *c = a->head;
    while (c) {
        ja_chunk *n = c->next;
        free(c);
        c = n;
    }
    a->head = NULL;
    a->used = 0;
}

static void ja_fail(jarena *a, const char *msg) {
    if (a->err) ci_err(a->err, a->errlen, CINFER_ERANGE, "%s", msg);
    CI_ASSERT(a->fail);
    longjmp(*a->fail, 1);
}

void *ja_alloc(jarena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    if (a->limit && (n > a->limit || a->used + n > a->limit)) ja_fail(a, "template memory limit exceeded");
    ja_chunk *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t sz = n > 65536 - sizeof(ja_chunk) ? n : 65536 - sizeof(ja_chunk);
        c = malloc(sizeof(ja_chunk) + sz);
        if (!c) ja_fail(a, "out of memory");
        c->size = sz;
        c->used = 0;
        c->next = a->head;
        a->head = c;
    }
    void *p = c->data + c->used;
    c->used += n;
    a->used += n;
    memset(p, 0, n);
    return p;
}

char *ja_strdup(jarena *a, const char *s, size_t n) {
    char *p = ja_alloc(a, n + 1);
    if (n) memcpy(p, s, n);
    p[n] = 0;
    return p;
}

/* ---- constructors ---- */
jv jv_undef(void) {
    jv v;
    memset(&v, 0, sizeof v);
    v.t = JV_UNDEF;
    return v;
}
jv jv_none(void) {
    jv v = jv_undef();
    v.t = JV_NONE;
    return v;
}
jv jv_bool(int b) {
    jv v = jv_undef();
    v.t = JV_BOOL;
    v.u.i = b ? 1 : 0;
    return v;
}
jv jv_int(int64_t i) {
    jv v = jv_undef();
    v.t = JV_INT;
    v.u.i = i;
    return v;
}
jv jv_float(double f) {
    jv v = jv_undef();
    v.t = JV_FLOAT;
    v.u.f = f;
    return v;
}
jv jv_str(const char *p, size_t n) {
    jv v = jv_undef();
    v.t = JV_STR;
    v.u.s.p = p ? p : "";
    v.u.s.n = n;
    return v;
}
jv jv_cstr(const char *s) { return jv_str(s, strlen(s)); }

jv jv_list(jarena *a, size_t cap, int tuple) {
    jv v = jv_undef();
    v.t = JV_LIST;
    v.u.l = ja_alloc(a, sizeof(jlist));
    v.u.l->tuple = tuple;
    if (cap) {
        v.u.l->v = ja_alloc(a, cap * sizeof(jv));
        v.u.l->cap = cap;
    }
    return v;
}

jv jv_dict(jarena *a, size_t cap) {
    jv v = jv_undef();
    v.t = JV_DICT;
    v.u.d = ja_alloc(a, sizeof(jdict));
    if (cap) {
        v.u.d->k = ja_alloc(a, cap * sizeof(jv));
        v.u.d->v = ja_alloc(a, cap * sizeof(jv));
        v.u.d->cap = cap;
    }
    return v;
}

void jl_push(jarena *a, jlist *l, jv v) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 4;
        jv *nv = ja_alloc(a, nc * sizeof(jv));
        if (l->n) memcpy(nv, l->v, l->n * sizeof(jv));
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = v;
}

/* Python hashes keys; dicts here are small (message fields, tool schemas), so a linear scan is the cheaper
 * choice and keeps insertion order for free. */
jv *jd_get(const jdict *d, jv key) {
    for (size_t i = 0; i < d->n; i++)
        if (jv_equal(d->k[i], key)) return &d->v[i];
    return NULL;
}

jv *jd_get_str(const jdict *d, const char *key, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == JV_STR && d->k[i].u.s.n == n && !memcmp(d->k[i].u.s.p, key, n)) return &d->v[i];
    return NULL;
}

void jd_set(jarena *a, jdict *d, jv key, jv val) {
    jv *p = jd_get(d, key);
    if (p) {
        *p = val;
        return;
    }
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 4;
        jv *nk = ja_alloc(a, nc * sizeof(jv)), *nv = ja_alloc(a, nc * sizeof(jv));
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof(jv));
            memcpy(nv, d->v, d->n * sizeof(jv));
        }
        d->k = nk;
        d->v = nv;
        d->cap = nc;
    }
    d->k[d->n] = key;
    d->v[d->n] = val;
    d->n++;
}

/* ---- Python semantics ---- */
int jv_truthy(jv v) {
    switch (v.t) {
    case JV_UNDEF:
    case JV_NONE: return 0;
    case JV_BOOL:
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0.0;
    case JV_STR: return v.u.s.n != 0;
    case JV_LIST: return v.u.l->n != 0;
    case JV_DICT: return v.u.d->n != 0;
    default: return 1;
    }
}

int jv_is_num(jv v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }
double jv_num(jv v) { return v.t == JV_FLOAT ? v.u.f : (double)v.u.i; }

int jv_equal(jv a, jv b) {
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) return a.u.i == b.u.i;
        return jv_num(a) == jv_num(b);
    }
    if (a.t != b.t) return 0;
    switch (a.t) {
    case JV_UNDEF:
    case JV_NONE: return 1;
    case JV_STR: return a.u.s.n == b.u.s.n && !memcmp(a.u.s.p, b.u.s.p, a.u.s.n);
    case JV_LIST:
        if (a.u.l->tuple != b.u.l->tuple || a.u.l->n != b.u.l->n) return 0;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!jv_equal(a.u.l->v[i], b.u.l->v[i])) return 0;
        return 1;
    case JV_DICT:
        if (a.u.d->n != b.u.d->n) return 0;
        for (size_t i = 0; i < a.u.d->n; i++) {
            jv *o = jd_get(b.u.d, a.u.d->k[i]);
            if (!o || !jv_equal(a.u.d->v[i], *o)) return 0;
        }
        return 1;
    case JV_NS: return a.u.d == b.u.d;
    case JV_LOOP: return a.u.lp == b.u.lp;
    case JV_MACRO: return a.u.m == b.u.m;
    case JV_FUNC: return a.aux == b.aux;
    default: return a.u.me == b.u.me;
    }
}

const char *jv_type_name(int t) {
    switch (t) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return "list";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_LOOP: return "LoopContext";
    case JV_MACRO: return "Macro";
    case JV_FUNC: return "function";
    default: return "builtin_function_or_method";
    }
}

/* ---- buffers ---- */
void jb_init(jbuf *b, jarena *a, size_t limit) {
    memset(b, 0, sizeof *b);
    b->a = a;
    b->limit = limit;
}

static void jb_grow(jbuf *b, size_t need) {
    if (b->limit && b->n + need > b->limit) {
        if (b->a->err) ci_err(b->a->err, b->a->errlen, CINFER_ERANGE, "template output limit exceeded (%zu bytes)", b->limit);
        longjmp(*b->a->fail, 1);
    }
    if (b->n + need <= b->cap) return;
    size_t nc = b->cap ? b->cap * 2 : 64;
    while (nc < b->n + need) nc *= 2;
    char *np = ja_alloc(b->a, nc);
    if (b->n) memcpy(np, b->p, b->n);
    b->p = np;
    b->cap = nc;
}

void jb_put(jbuf *b, const char *p, size_t n) {
    if (!n) return;
    jb_grow(b, n);
    memcpy(b->p + b->n, p, n);
    b->n += n;
}
void jb_putc(jbuf *b, char c) { jb_put(b, &c, 1); }
void jb_puts(jbuf *b, const char *s) { jb_put(b, s, strlen(s)); }

void jb_printf(jbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        jb_put(b, tmp, (size_t)n);
        return;
    }
    jb_grow(b, (size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)n;
}

jstr jb_str(jbuf *b) {
    jstr s = {b->p ? b->p : "", b->n};
    return s;
}

/* ---- UTF-8 ---- */
uint32_t u8_decode(const char *p, size_t n, size_t *adv) {
    const unsigned char *s = (const unsigned char *)p;
    if (n == 0) {
        *adv = 0;
        return 0;
    }
    unsigned c = s[0];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || len > n) {
        *adv = 1;
        return 0xFFFD;
    }
    uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) {
            *adv = 1;
            return 0xFFFD;
        }
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    *adv = len;
    return cp;
}

size_t u8_len(const char *p, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        size_t adv;
        u8_decode(p + i, n - i, &adv);
        i += adv;
        k++;
    }
    return k;
}

size_t u8_offset(const char *p, size_t n, size_t idx) {
    size_t i = 0;
    while (idx > 0 && i < n) {
        size_t adv;
        u8_decode(p + i, n - i, &adv);
        i += adv;
        idx--;
    }
    return i;
}

void u8_encode(jbuf *b, uint32_t cp) {
    char t[4];
    if (cp < 0x80) {
        jb_putc(b, (char)cp);
    } else if (cp < 0x800) {
        t[0] = (char)(0xc0 | (cp >> 6));
        t[1] = (char)(0x80 | (cp & 0x3f));
        jb_put(b, t, 2);
    } else if (cp < 0x10000) {
        t[0] = (char)(0xe0 | (cp >> 12));
        t[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        t[2] = (char)(0x80 | (cp & 0x3f));
        jb_put(b, t, 3);
    } else {
        t[0] = (char)(0xf0 | (cp >> 18));
        t[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        t[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
        t[3] = (char)(0x80 | (cp & 0x3f));
        jb_put(b, t, 4);
    }
}

/* ---- printing ---- */

/* repr(float) in CPython: the shortest digit string that reads back to the same double, shown in fixed
 * notation when the decimal exponent is in [-4, 16), else as d.ddde+XX. */
void py_float_repr(char *out, size_t outlen, double f) {
    if (isnan(f)) {
        snprintf(out, outlen, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(out, outlen, f < 0 ? "-inf" : "inf");
        return;
    }
    char buf[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
        if (strtod(buf, NULL) == f) break;
    }
    /* buf = [-]d.ddde[+-]XX: split into sign, digits and exponent. */
    const char *s = buf;
    int neg = 0;
    if (*s == '-') {
        neg = 1;
        s++;
    }
    char digits[24];
    int nd = 0;
    for (; *s && *s != 'e'; s++)
        if (*s != '.') digits[nd++] = *s;
    digits[nd] = 0;
    int exp10 = atoi(s + 1); /* value = 0.d1d2... * 10^(exp10+1) */
    while (nd > 1 && digits[nd - 1] == '0') digits[--nd] = 0;
    char res[64];
    int k = 0;
    if (neg) res[k++] = '-';
    if (exp10 >= -5 + 1 && exp10 < 16) {
        /* fixed: decimal point after exp10+1 digits */
        int point = exp10 + 1;
        if (point <= 0) {
            res[k++] = '0';
            res[k++] = '.';
            for (int i = 0; i < -point; i++) res[k++] = '0';
            for (int i = 0; i < nd; i++) res[k++] = digits[i];
        } else {
            for (int i = 0; i < point; i++) res[k++] = i < nd ? digits[i] : '0';
            res[k++] = '.';
            if (point < nd)
                for (int i = point; i < nd; i++) res[k++] = digits[i];
            else
                res[k++] = '0';
        }
        res[k] = 0;
    } else {
        res[k++] = digits[0];
        if (nd > 1) {
            res[k++] = '.';
            for (int i = 1; i < nd; i++) res[k++] = digits[i];
        }
        res[k] = 0;
        snprintf(res + k, sizeof res - (size_t)k, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    }
    snprintf(out, outlen, "%s", res);
}

/* Python's str.isprintable() for one code point: everything but the Other (C*) and Separator (Z*) categories,
 * except the ASCII space. */
static int py_printable(uint32_t cp) {
    if (cp == ' ') return 1;
    if (cp < 0x20 || cp == 0x7f) return 0;
    if (cp < 0x7f) return 1;
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    switch (c) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZS:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: return 0;
    default: return 1;
    }
}

static void str_repr_into(jbuf *b, jstr s) {
    int has_sq = memchr(s.p, '\'', s.n) != NULL, has_dq = memchr(s.p, '"', s.n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    jb_putc(b, q);
    for (size_t i = 0; i < s.n;) {
        size_t adv;
        uint32_t cp = u8_decode(s.p + i, s.n - i, &adv);
        if (cp == (uint32_t)q || cp == '\\') {
            jb_putc(b, '\\');
            jb_putc(b, (char)cp);
        } else if (cp == '\n') {
            jb_puts(b, "\\n");
        } else if (cp == '\r') {
            jb_puts(b, "\\r");
        } else if (cp == '\t') {
            jb_puts(b, "\\t");
        } else if (!py_printable(cp)) {
            if (cp < 0x100)
                jb_printf(b, "\\x%02x", cp);
            else if (cp < 0x10000)
                jb_printf(b, "\\u%04x", cp);
            else
                jb_printf(b, "\\U%08x", cp);
        } else {
            jb_put(b, s.p + i, adv);
        }
        i += adv;
    }
    jb_putc(b, q);
}

static void repr_depth(jbuf *b, jv v, int depth);

static void str_depth(jbuf *b, jv v, int depth) {
    switch (v.t) {
    case JV_UNDEF: return;
    case JV_NONE: jb_puts(b, "None"); return;
    case JV_BOOL: jb_puts(b, v.u.i ? "True" : "False"); return;
    case JV_INT: jb_printf(b, "%lld", (long long)v.u.i); return;
    case JV_FLOAT: {
        char t[64];
        py_float_repr(t, sizeof t, v.u.f);
        jb_puts(b, t);
        return;
    }
    case JV_STR: jb_put(b, v.u.s.p, v.u.s.n); return;
    default: repr_depth(b, v, depth); return;
    }
}

static void repr_depth(jbuf *b, jv v, int depth) {
    if (depth > 200) {
        jb_puts(b, "...");
        return;
    }
    switch (v.t) {
    case JV_STR: str_repr_into(b, v.u.s); return;
    case JV_UNDEF: return;
    case JV_LIST: {
        jlist *l = v.u.l;
        jb_putc(b, l->tuple ? '(' : '[');
        for (size_t i = 0; i < l->n; i++) {
            if (i) jb_puts(b, ", ");
            repr_depth(b, l->v[i], depth + 1);
        }
        if (l->tuple && l->n == 1) jb_putc(b, ',');
        jb_putc(b, l->tuple ? ')' : ']');
        return;
    }
    case JV_DICT:
    case JV_NS: {
        jdict *d = v.u.d;
        if (v.t == JV_NS) jb_puts(b, "<Namespace ");
        jb_putc(b, '{');
        for (size_t i = 0; i < d->n; i++) {
            if (i) jb_puts(b, ", ");
            repr_depth(b, d->k[i], depth + 1);
            jb_puts(b, ": ");
            repr_depth(b, d->v[i], depth + 1);
        }
        jb_putc(b, '}');
        if (v.t == JV_NS) jb_putc(b, '>');
        return;
    }
    case JV_LOOP: jb_puts(b, "<LoopContext>"); return;
    case JV_MACRO: jb_puts(b, "<Macro>"); return;
    case JV_FUNC: jb_puts(b, "<function>"); return;
    case JV_METHOD: jb_puts(b, "<built-in method>"); return;
    case JV_NONE:
    case JV_BOOL:
    case JV_INT:
    case JV_FLOAT: str_depth(b, v, depth); return;
    default: CI_ASSERT(!"value of unknown type"); return;
    }
}

void jv_str_into(jbuf *b, jv v) { str_depth(b, v, 0); }
void jv_repr_into(jbuf *b, jv v) { repr_depth(b, v, 0); }

/* json.dumps string escaping: ", \, \n \r \t \b \f, other controls as \u00XX; with ensure_ascii every
 * non-ASCII code point as \uXXXX (surrogate pairs above the BMP). */
static void json_str(jbuf *b, jstr s, int ensure_ascii) {
    jb_putc(b, '"');
    for (size_t i = 0; i < s.n;) {
        unsigned char c = (unsigned char)s.p[i];
        if (c < 0x80) {
            switch (c) {
            case '"': jb_puts(b, "\\\""); break;
            case '\\': jb_puts(b, "\\\\"); break;
            case '\n': jb_puts(b, "\\n"); break;
            case '\r': jb_puts(b, "\\r"); break;
            case '\t': jb_puts(b, "\\t"); break;
            case '\b': jb_puts(b, "\\b"); break;
            case '\f': jb_puts(b, "\\f"); break;
            default:
                if (c < 0x20 || (ensure_ascii && c == 0x7f))
                    jb_printf(b, "\\u%04x", c);
                else
                    jb_putc(b, (char)c);
            }
            i++;
            continue;
        }
        size_t adv;
        uint32_t cp = u8_decode(s.p + i, s.n - i, &adv);
        if (ensure_ascii) {
            if (cp >= 0x10000) {
                uint32_t v = cp - 0x10000;
                jb_printf(b, "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
            } else {
                jb_printf(b, "\\u%04x", cp);
            }
        } else {
            jb_put(b, s.p + i, adv);
        }
        i += adv;
    }
    jb_putc(b, '"');
}

static void json_nl(jbuf *b, int indent, int level) {
    jb_putc(b, '\n');
    for (int i = 0; i < indent * level; i++) jb_putc(b, ' ');
}

static int cmp_str_keys(const void *x, const void *y) {
    const jv *a = *(const jv *const *)x, *b = *(const jv *const *)y;
    size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
    int c = memcmp(a->u.s.p, b->u.s.p, n);
    if (c) return c;
    return a->u.s.n < b->u.s.n ? -1 : a->u.s.n > b->u.s.n;
}

int jv_json_into(jbuf *b, jv v, int ensure_ascii, int indent, jstr item_sep, jstr key_sep, int sort_keys, int depth,
                 char *msg, size_t msglen) {
    if (depth > 200) return ci_err(msg, msglen, CINFER_ERANGE, "maximum recursion depth exceeded in tojson"), -1;
    switch (v.t) {
    case JV_NONE: jb_puts(b, "null"); return 0;
    case JV_BOOL: jb_puts(b, v.u.i ? "true" : "false"); return 0;
    case JV_INT: jb_printf(b, "%lld", (long long)v.u.i); return 0;
    case JV_FLOAT: {
        if (isnan(v.u.f)) {
            jb_puts(b, "NaN");
        } else if (isinf(v.u.f)) {
            jb_puts(b, v.u.f < 0 ? "-Infinity" : "Infinity");
        } else {
            char t[64];
            py_float_repr(t, sizeof t, v.u.f);
            jb_puts(b, t);
        }
        return 0;
    }
    case JV_STR: json_str(b, v.u.s, ensure_ascii); return 0;
    case JV_LIST: {
        jlist *l = v.u.l;
        if (l->n == 0) {
            jb_puts(b, "[]");
            return 0;
        }
        jb_putc(b, '[');
        for (size_t i = 0; i < l->n; i++) {
            if (i) jb_put(b, item_sep.p, item_sep.n);
            if (indent >= 0) json_nl(b, indent, depth + 1);
            if (jv_json_into(b, l->v[i], ensure_ascii, indent, item_sep, key_sep, sort_keys, depth + 1, msg, msglen))
                return -1;
        }
        if (indent >= 0) json_nl(b, indent, depth);
        jb_putc(b, ']');
        return 0;
    }
    case JV_DICT: {
        jdict *d = v.u.d;
        if (d->n == 0) {
            jb_puts(b, "{}");
            return 0;
        }
        /* json.dumps turns int/float/bool/None keys into strings; anything else is a TypeError. */
        size_t n = d->n;
        jv *keys = ja_alloc(b->a, n * sizeof(jv));
        jv **order = ja_alloc(b->a, n * sizeof(jv *));
        for (size_t i = 0; i < n; i++) {
            jv k = d->k[i];
            if (k.t == JV_STR) {
                keys[i] = k;
            } else if (k.t == JV_INT || k.t == JV_FLOAT || k.t == JV_BOOL || k.t == JV_NONE) {
                jbuf kb;
                jb_init(&kb, b->a, 0);
                if (k.t == JV_BOOL)
                    jb_puts(&kb, k.u.i ? "true" : "false");
                else if (k.t == JV_NONE)
                    jb_puts(&kb, "null");
                else
                    jv_str_into(&kb, k);
                jstr s = jb_str(&kb);
                keys[i] = jv_str(s.p, s.n);
            } else {
                ci_err(msg, msglen, CINFER_EINVAL, "keys must be str, int, float, bool or None, not %s",
                       jv_type_name(k.t));
                return -1;
            }
            order[i] = &keys[i];
        }
        if (sort_keys) qsort(order, n, sizeof(jv *), cmp_str_keys);
        jb_putc(b, '{');
        for (size_t j = 0; j < n; j++) {
            size_t i = (size_t)(order[j] - keys);
            if (j) jb_put(b, item_sep.p, item_sep.n);
            if (indent >= 0) json_nl(b, indent, depth + 1);
            json_str(b, keys[i].u.s, ensure_ascii);
            jb_put(b, key_sep.p, key_sep.n);
            if (jv_json_into(b, d->v[i], ensure_ascii, indent, item_sep, key_sep, sort_keys, depth + 1, msg, msglen))
                return -1;
        }
        if (indent >= 0) json_nl(b, indent, depth);
        jb_putc(b, '}');
        return 0;
    }
    default:
        ci_err(msg, msglen, CINFER_EINVAL, "Object of type %s is not JSON serializable", jv_type_name(v.t));
        return -1;
    }
}

/* ---- JSON input ---- */
jv jv_from_json(jarena *a, json_t *j) {
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        jv d = jv_dict(a, json_object_size(j));
        const char *k;
        json_t *val;
        json_object_foreach(j, k, val) {
            size_t kl = strlen(k);
            jd_set(a, d.u.d, jv_str(ja_strdup(a, k, kl), kl), jv_from_json(a, val));
        }
        return d;
    }
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        jv l = jv_list(a, n, 0);
        for (size_t i = 0; i < n; i++) jl_push(a, l.u.l, jv_from_json(a, json_array_get(j, i)));
        return l;
    }
    case JSON_STRING: {
        size_t n = json_string_length(j);
        return jv_str(ja_strdup(a, json_string_value(j), n), n);
    }
    case JSON_INTEGER: return jv_int((int64_t)json_integer_value(j));
    case JSON_REAL: return jv_float(json_real_value(j));
    case JSON_TRUE: return jv_bool(1);
    case JSON_FALSE: return jv_bool(0);
    default: return jv_none();
    }
}

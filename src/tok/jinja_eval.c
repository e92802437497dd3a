/* jinja_eval.c — renders a parsed template: statements, expressions with Python semantics (floor division,
 * truthiness, `and`/`or` returning operands, chained comparisons), Jinja's scoping (a for-loop body is a fresh
 * scope each iteration; `if` is not a scope; namespace() carries state out), the default Undefined, the
 * ImmutableSandboxedEnvironment's rules (no mutating methods, no `_` attributes) and the filters, tests,
 * string/dict/list methods and globals that chat templates use. Errors unwind with longjmp to jinja_render,
 * which is safe because every allocation lives in the render's arena. */
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "tok/jinja.h"
#include "util/err.h"

typedef struct scope {
    struct scope *parent;
    jdict vars;
} scope;

typedef struct jmacro {
    const node *def; /* S_MACRO, or S_CALLBLOCK for a `caller` */
    scope *closure;
    int uses_varargs, uses_kwargs, uses_caller;
} jmacro;

typedef struct jloop {
    jlist *items;
    size_t idx;
} jloop;

typedef struct jmethod {
    jv self;
    jstr name;
} jmethod;

enum { FN_RANGE = 1, FN_NAMESPACE, FN_DICT, FN_RAISE, FN_STRFTIME, FN_CYCLE };

typedef struct ctx {
    jarena *a;
    const jlimits *lim;
    int depth;
    uint64_t iters;
    jbuf *out;
    scope *root;
    jv globals;
    int64_t now;
    int brk; /* 1: break, 2: continue, pending */
    int code;
    char *err;
    size_t errlen;
    jmp_buf jb;
} ctx;

typedef struct args {
    const jv *pos;
    int npos;
    const jstr *kwn;
    const jv *kwv;
    int nkw;
} args;

/* ---- errors ---- */
__attribute__((format(printf, 3, 4), noreturn)) static void fail(ctx *c, const node *at, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (at)
        ci_err(c->err, c->errlen, CINFER_EINVAL, "%d:%d: %s", at->line, at->col, msg);
    else
        ci_err(c->err, c->errlen, CINFER_EINVAL, "%s", msg);
    c->code = CINFER_EINVAL;
    longjmp(c->jb, 1);
}

/* The message Jinja's Undefined raises with when it is used. */
static void undef_msg(jv u, char *buf, size_t n) {
    int sl = (int)(u.u.s.n > 200 ? 200 : u.u.s.n);
    const char *ot = u.ot == JV_NONE ? "None" : jv_type_name(u.ot);
    switch (u.aux) {
    case UND_ATTR:
        if (u.ot == JV_NONE)
            snprintf(buf, n, "'None' has no attribute '%.*s'", sl, u.u.s.p);
        else
            snprintf(buf, n, "'%s object' has no attribute '%.*s'", ot, sl, u.u.s.p);
        break;
    case UND_ELEM:
        if (u.ot == JV_NONE)
            snprintf(buf, n, "None has no element %.*s", sl, u.u.s.p);
        else
            snprintf(buf, n, "%s object has no element %.*s", ot, sl, u.u.s.p);
        break;
    case UND_MSG: snprintf(buf, n, "%.*s", sl, u.u.s.p); break;
    default: snprintf(buf, n, "'%.*s' is undefined", sl, u.u.s.p); break;
    }
}

__attribute__((noreturn)) static void fail_undef(ctx *c, const node *at, jv u) {
    char m[300];
    undef_msg(u, m, sizeof m);
    fail(c, at, "%s", m);
}

static jv mk_undef(int aux, int ot, const char *p, size_t n) {
    jv u = jv_undef();
    u.aux = (uint8_t)aux;
    u.ot = (uint8_t)ot;
    u.u.s.p = p;
    u.u.s.n = n;
    return u;
}

static jv undef_msgf(ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static jv undef_msgf(ctx *c, const char *fmt, ...) {
    char m[300];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    size_t n = k < 0 ? 0 : (size_t)k >= sizeof m ? sizeof m - 1 : (size_t)k;
    return mk_undef(UND_MSG, 0, ja_strdup(c->a, m, n), n);
}

static void enter(ctx *c, const node *at) {
    if (++c->depth > c->lim->max_depth) {
        c->code = CINFER_ERANGE;
        ci_err(c->err, c->errlen, CINFER_ERANGE, "%d:%d: maximum recursion depth exceeded", at ? at->line : 0,
               at ? at->col : 0);
        longjmp(c->jb, 1);
    }
}
static void leave(ctx *c) { c->depth--; }

static void count_iter(ctx *c, const node *at) {
    if (++c->iters > c->lim->max_iters) {
        c->code = CINFER_ERANGE;
        ci_err(c->err, c->errlen, CINFER_ERANGE, "%d:%d: loop iteration limit exceeded (%llu)", at->line, at->col,
               (unsigned long long)c->lim->max_iters);
        longjmp(c->jb, 1);
    }
}

/* ---- small helpers ---- */
static jv str_of(ctx *c, jv v) {
    if (v.t == JV_STR) return v;
    jbuf b;
    jb_init(&b, c->a, 0);
    jv_str_into(&b, v);
    jstr s = jb_str(&b);
    return jv_str(s.p, s.n);
}

static jv mkstr(ctx *c, jbuf *b) {
    (void)c;
    jstr s = jb_str(b);
    return jv_str(s.p, s.n);
}

static int streq(jstr s, const char *lit) { return s.n == strlen(lit) && !memcmp(s.p, lit, s.n); }

static const char *tname(jv v) { return jv_type_name(v.t); }

/* Python's str.isspace() for one code point: category Zs, or bidi class WS, B or S. */
static int u_isspace(uint32_t cp) {
    if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x1f);
    const utf8proc_property_t *pr = utf8proc_get_property((utf8proc_int32_t)cp);
    return pr->category == UTF8PROC_CATEGORY_ZS || pr->bidi_class == UTF8PROC_BIDI_CLASS_WS ||
           pr->bidi_class == UTF8PROC_BIDI_CLASS_B || pr->bidi_class == UTF8PROC_BIDI_CLASS_S;
}

static int u_isalnum(uint32_t cp) {
    if (cp < 0x80) return isalnum((int)cp);
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) || (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
}

static void put_cp_case(jbuf *b, uint32_t cp, int upper) {
    /* Python uses the full (SpecialCasing) mappings where one code point becomes several */
    static const struct {
        uint32_t cp;
        const char *up;
    } special_up[] = {{0xdf, "SS"},         {0x149, "\xca\xbcN"}, {0x1f0, "J\xcc\x8c"}, {0xfb00, "FF"}, {0xfb01, "FI"},
                      {0xfb02, "FL"},       {0xfb03, "FFI"},        {0xfb04, "FFL"},        {0xfb05, "ST"}, {0xfb06, "ST"}};
    if (upper) {
        for (size_t i = 0; i < sizeof special_up / sizeof special_up[0]; i++)
            if (special_up[i].cp == cp) {
                jb_puts(b, special_up[i].up);
                return;
            }
    } else if (cp == 0x130) {
        jb_puts(b, "i\xcc\x87");
        return;
    }
    utf8proc_int32_t r = upper ? utf8proc_toupper((utf8proc_int32_t)cp) : utf8proc_tolower((utf8proc_int32_t)cp);
    u8_encode(b, (uint32_t)r);
}

/* Python str.upper()/lower() by code point (simple case mapping; the special multi-char mappings like ß ->
 * SS are not applied). */
static jv str_case(ctx *c, jstr s, int upper) {
    jbuf b;
    jb_init(&b, c->a, 0);
    for (size_t i = 0; i < s.n;) {
        size_t adv;
        uint32_t cp = u8_decode(s.p + i, s.n - i, &adv);
        if (cp < 0x80)
            jb_putc(&b, (char)(upper ? toupper((int)cp) : tolower((int)cp)));
        else
            put_cp_case(&b, cp, upper);
        i += adv;
    }
    return mkstr(c, &b);
}

/* strip with chars (NULL: whitespace); which: 1 left, 2 right, 3 both. */
static int in_chars(uint32_t cp, const jstr *chars) {
    if (!chars) return u_isspace(cp);
    for (size_t i = 0; i < chars->n;) {
        size_t adv;
        uint32_t d = u8_decode(chars->p + i, chars->n - i, &adv);
        if (d == cp) return 1;
        i += adv;
    }
    return 0;
}

static jv str_strip(jstr s, const jstr *chars, int which) {
    size_t b = 0, e = s.n;
    if (which & 1)
        while (b < e) {
            size_t adv;
            uint32_t cp = u8_decode(s.p + b, e - b, &adv);
            if (!in_chars(cp, chars)) break;
            b += adv;
        }
    if (which & 2)
        while (e > b) {
            size_t k = e - 1;
            while (k > b && ((unsigned char)s.p[k] & 0xc0) == 0x80) k--;
            size_t adv;
            uint32_t cp = u8_decode(s.p + k, e - k, &adv);
            if (!in_chars(cp, chars)) break;
            e = k;
        }
    return jv_str(s.p + b, e - b);
}

static const char *memmem_s(jstr hay, size_t from, jstr needle) {
    if (needle.n == 0) return hay.p + from;
    if (from > hay.n || hay.n - from < needle.n) return NULL;
    return memmem(hay.p + from, hay.n - from, needle.p, needle.n);
}

/* ---- scopes ---- */
static scope *scope_new(ctx *c, scope *parent) {
    scope *s = ja_alloc(c->a, sizeof(scope));
    s->parent = parent;
    return s;
}

static void scope_set(ctx *c, scope *s, jstr name, jv v) { jd_set(c->a, &s->vars, jv_str(name.p, name.n), v); }

static jv fnv(int fn) {
    jv v = jv_undef();
    v.t = JV_FUNC;
    v.aux = (uint8_t)fn;
    return v;
}

static jv lookup(ctx *c, scope *s, jstr name) {
    for (scope *k = s; k; k = k->parent) {
        jv *v = jd_get_str(&k->vars, name.p, name.n);
        if (v) return *v;
    }
    jv *g = jd_get_str(c->globals.u.d, name.p, name.n);
    if (g) return *g;
    if (streq(name, "range")) return fnv(FN_RANGE);
    if (streq(name, "namespace")) return fnv(FN_NAMESPACE);
    if (streq(name, "dict")) return fnv(FN_DICT);
    if (streq(name, "raise_exception")) return fnv(FN_RAISE);
    if (streq(name, "strftime_now")) return fnv(FN_STRFTIME);
    return mk_undef(UND_NAME, 0, name.p, name.n);
}

/* ---- iteration ---- */
static jlist *to_list(ctx *c, const node *at, jv v) {
    switch (v.t) {
    case JV_LIST: return v.u.l;
    case JV_UNDEF: return jv_list(c->a, 0, 0).u.l;
    case JV_DICT: {
        jv l = jv_list(c->a, v.u.d->n, 0);
        for (size_t i = 0; i < v.u.d->n; i++) jl_push(c->a, l.u.l, v.u.d->k[i]);
        return l.u.l;
    }
    case JV_STR: {
        jv l = jv_list(c->a, v.u.s.n, 0);
        for (size_t i = 0; i < v.u.s.n;) {
            size_t adv;
            u8_decode(v.u.s.p + i, v.u.s.n - i, &adv);
            jl_push(c->a, l.u.l, jv_str(v.u.s.p + i, adv));
            i += adv;
        }
        return l.u.l;
    }
    default: fail(c, at, "'%s' object is not iterable", tname(v));
    }
}

/* ---- attribute and item access ---- */
static const char *const str_methods[] = {"startswith", "endswith", "strip", "lstrip", "rstrip", "split", "rsplit",
                                          "upper", "lower", "title", "capitalize", "replace", "find", "rfind",
                                          "count", "splitlines", "join", "format", "isdigit", "isalpha", "isspace",
                                          "isalnum", "islower", "isupper", "index", "swapcase", "center",
                                          "ljust", "rjust", "zfill", "partition", "rpartition", "casefold",
                                          "isnumeric", "isdecimal", "istitle", "removeprefix", "removesuffix",
                                          "expandtabs", NULL};
static const char *const dict_methods[] = {"items", "keys", "values", "get", "copy", NULL};
static const char *const dict_unsafe[] = {"pop", "popitem", "setdefault", "update", "clear", NULL};
static const char *const list_methods[] = {"index", "count", "copy", NULL};
static const char *const list_unsafe[] = {"append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear", NULL};

static int in_names(jstr n, const char *const *names) {
    for (int i = 0; names[i]; i++)
        if (streq(n, names[i])) return 1;
    return 0;
}

static jv bound(ctx *c, jv self, jstr name) {
    jv m = jv_undef();
    m.t = JV_METHOD;
    m.u.me = ja_alloc(c->a, sizeof(jmethod));
    m.u.me->self = self;
    m.u.me->name = name;
    return m;
}

static jv loop_attr(ctx *c, jloop *lp, jstr name, int *found) {
    size_t n = lp->items->n, i = lp->idx;
    *found = 1;
    if (streq(name, "index")) return jv_int((int64_t)i + 1);
    if (streq(name, "index0")) return jv_int((int64_t)i);
    if (streq(name, "revindex")) return jv_int((int64_t)(n - i));
    if (streq(name, "revindex0")) return jv_int((int64_t)(n - i - 1));
    if (streq(name, "first")) return jv_bool(i == 0);
    if (streq(name, "last")) return jv_bool(i + 1 == n);
    if (streq(name, "length")) return jv_int((int64_t)n);
    if (streq(name, "depth")) return jv_int(1);
    if (streq(name, "depth0")) return jv_int(0);
    if (streq(name, "previtem")) return i > 0 ? lp->items->v[i - 1] : undef_msgf(c, "there is no previous item");
    if (streq(name, "nextitem")) return i + 1 < n ? lp->items->v[i + 1] : undef_msgf(c, "there is no next item");
    if (streq(name, "cycle")) {
        jv f = fnv(FN_CYCLE);
        f.u.lp = lp;
        return f;
    }
    *found = 0;
    return jv_undef();
}

/* x.name: Python attribute first (methods), then item — environment.getattr of the sandbox. */
static jv get_attr(ctx *c, const node *at, jv obj, jstr name) {
    if (obj.t == JV_UNDEF) fail_undef(c, at, obj);
    if (name.n && name.p[0] == '_') return mk_undef(UND_ATTR, obj.t, name.p, name.n);
    switch (obj.t) {
    case JV_DICT: {
        if (in_names(name, dict_methods)) return bound(c, obj, name);
        if (in_names(name, dict_unsafe))
            return undef_msgf(c, "access to attribute '%.*s' of 'dict' object is unsafe.", (int)name.n, name.p);
        jv *v = jd_get_str(obj.u.d, name.p, name.n);
        if (v) return *v;
        break;
    }
    case JV_NS: {
        jv *v = jd_get_str(obj.u.d, name.p, name.n);
        if (v) return *v;
        break;
    }
    case JV_STR:
        if (in_names(name, str_methods)) return bound(c, obj, name);
        break;
    case JV_LIST:
        if (in_names(name, list_methods)) return bound(c, obj, name);
        if (in_names(name, list_unsafe))
            return undef_msgf(c, "access to attribute '%.*s' of '%s' object is unsafe.", (int)name.n, name.p,
                              obj.u.l->tuple ? "tuple" : "list");
        break;
    case JV_LOOP: {
        int found;
        jv v = loop_attr(c, obj.u.lp, name, &found);
        if (found) return v;
        break;
    }
    default: break;
    }
    return mk_undef(UND_ATTR, obj.t, name.p, name.n);
}

static int64_t norm_index(int64_t i, size_t n, int *ok) {
    if (i < 0) i += (int64_t)n;
    *ok = i >= 0 && (uint64_t)i < n;
    return i;
}

static jv slice_value(ctx *c, const node *at, jv obj, jv start, jv stop, jv step) {
    int64_t st = 1;
    if (step.t != JV_NONE && step.t != JV_UNDEF) {
        if (step.t != JV_INT && step.t != JV_BOOL) fail(c, at, "slice indices must be integers or None");
        st = step.u.i;
        if (st == 0) fail(c, at, "slice step cannot be zero");
    }
    int is_str = obj.t == JV_STR;
    size_t n;
    jlist *cps = NULL;
    if (is_str) {
        cps = to_list(c, at, obj); /* code points */
        n = cps->n;
    } else if (obj.t == JV_LIST) {
        n = obj.u.l->n;
    } else {
        return mk_undef(UND_MSG, 0, "unsliceable", 11);
    }
    int64_t N = (int64_t)n;
    int64_t lo, hi;
    /* Python's PySlice_AdjustIndices */
    if (start.t == JV_NONE || start.t == JV_UNDEF) {
        lo = st < 0 ? N - 1 : 0;
    } else {
        if (start.t != JV_INT && start.t != JV_BOOL) fail(c, at, "slice indices must be integers or None");
        lo = start.u.i;
        if (lo < 0) {
            lo += N;
            if (lo < 0) lo = st < 0 ? -1 : 0;
        } else if (lo >= N) {
            lo = st < 0 ? N - 1 : N;
        }
    }
    if (stop.t == JV_NONE || stop.t == JV_UNDEF) {
        hi = st < 0 ? -1 : N;
    } else {
        if (stop.t != JV_INT && stop.t != JV_BOOL) fail(c, at, "slice indices must be integers or None");
        hi = stop.u.i;
        if (hi < 0) {
            hi += N;
            if (hi < 0) hi = st < 0 ? -1 : 0;
        } else if (hi >= N) {
            hi = st < 0 ? N - 1 : N;
        }
    }
    jlist *src = is_str ? cps : obj.u.l;
    if (is_str) {
        jbuf b;
        jb_init(&b, c->a, 0);
        for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st) jb_put(&b, src->v[i].u.s.p, src->v[i].u.s.n);
        return mkstr(c, &b);
    }
    jv l = jv_list(c->a, 0, obj.u.l->tuple);
    for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st) jl_push(c->a, l.u.l, src->v[i]);
    return l;
}

static jv key_text(ctx *c, jv key) {
    jbuf b;
    jb_init(&b, c->a, 0);
    jv_repr_into(&b, key);
    return mkstr(c, &b);
}

/* x[key]: item first, then (for a string key) attribute — environment.getitem. */
static jv get_item(ctx *c, const node *at, jv obj, jv key) {
    if (obj.t == JV_UNDEF) fail_undef(c, at, obj);
    switch (obj.t) {
    case JV_DICT: {
        jv *v = jd_get(obj.u.d, key);
        if (v) return *v;
        break;
    }
    case JV_LIST:
        if (key.t == JV_INT || key.t == JV_BOOL) {
            int ok;
            int64_t i = norm_index(key.u.i, obj.u.l->n, &ok);
            if (ok) return obj.u.l->v[i];
        }
        break;
    case JV_STR:
        if (key.t == JV_INT || key.t == JV_BOOL) {
            size_t n = u8_len(obj.u.s.p, obj.u.s.n);
            int ok;
            int64_t i = norm_index(key.u.i, n, &ok);
            if (ok) {
                size_t off = u8_offset(obj.u.s.p, obj.u.s.n, (size_t)i), adv;
                u8_decode(obj.u.s.p + off, obj.u.s.n - off, &adv);
                return jv_str(obj.u.s.p + off, adv);
            }
        }
        break;
    default: break;
    }
    if (key.t == JV_STR) {
        jv v = get_attr(c, at, obj, key.u.s);
        if (v.t != JV_UNDEF || v.aux == UND_MSG) return v;
        return mk_undef(UND_ATTR, obj.t, key.u.s.p, key.u.s.n);
    }
    jv kt = key_text(c, key);
    return mk_undef(UND_ELEM, obj.t, kt.u.s.p, kt.u.s.n);
}

static jv percent_format(ctx *c, const node *at, jstr fmt, jv argv);

/* ---- arithmetic and comparison ---- */
static jv arith(ctx *c, const node *at, int op, jv x, jv y) {
    if (x.t == JV_UNDEF) fail_undef(c, at, x);
    if (y.t == JV_UNDEF) fail_undef(c, at, y);
    const char *opname = op == '+' ? "+" : op == '-' ? "-" : op == '*' ? "*" : op == '/' ? "/" : op == 'F' ? "//" : op == '%' ? "%" : "** or pow()";
    if (jv_is_num(x) && jv_is_num(y)) {
        if (x.t != JV_FLOAT && y.t != JV_FLOAT) {
            int64_t a = x.u.i, b = y.u.i, r;
            switch (op) {
            case '+':
                if (__builtin_add_overflow(a, b, &r)) fail(c, at, "integer overflow");
                return jv_int(r);
            case '-':
                if (__builtin_sub_overflow(a, b, &r)) fail(c, at, "integer overflow");
                return jv_int(r);
            case '*':
                if (__builtin_mul_overflow(a, b, &r)) fail(c, at, "integer overflow");
                return jv_int(r);
            case '/':
                if (b == 0) fail(c, at, "division by zero");
                return jv_float((double)a / (double)b);
            case 'F':
            case '%': {
                if (b == 0) fail(c, at, op == 'F' ? "integer division or modulo by zero" : "integer modulo by zero");
                if (a == INT64_MIN && b == -1) fail(c, at, "integer overflow");
                int64_t q = a / b, m = a % b;
                if (m != 0 && ((m < 0) != (b < 0))) {
                    q -= 1;
                    m += b;
                }
                return jv_int(op == 'F' ? q : m);
            }
            case 'P': {
                if (b < 0) return jv_float(pow((double)a, (double)b));
                int64_t res = 1, base = a;
                int64_t e = b;
                while (e > 0) {
                    if (e & 1)
                        if (__builtin_mul_overflow(res, base, &res)) fail(c, at, "integer overflow");
                    e >>= 1;
                    if (e && __builtin_mul_overflow(base, base, &base)) fail(c, at, "integer overflow");
                }
                return jv_int(res);
            }
            }
        }
        double a = jv_num(x), b = jv_num(y);
        switch (op) {
        case '+': return jv_float(a + b);
        case '-': return jv_float(a - b);
        case '*': return jv_float(a * b);
        case '/':
            if (b == 0) fail(c, at, "float division by zero");
            return jv_float(a / b);
        case 'F':
            if (b == 0) fail(c, at, "float floor division by zero");
            return jv_float(floor(a / b));
        case '%': {
            if (b == 0) fail(c, at, "float modulo");
            double m = fmod(a, b);
            if (m != 0 && ((m < 0) != (b < 0))) m += b;
            return jv_float(m);
        }
        case 'P': return jv_float(pow(a, b));
        }
    }
    if (op == '+' && x.t == JV_STR && y.t == JV_STR) {
        jbuf b;
        jb_init(&b, c->a, c->lim->max_output);
        jb_put(&b, x.u.s.p, x.u.s.n);
        jb_put(&b, y.u.s.p, y.u.s.n);
        return mkstr(c, &b);
    }
    if (op == '+' && x.t == JV_LIST && y.t == JV_LIST && x.u.l->tuple == y.u.l->tuple) {
        jv l = jv_list(c->a, x.u.l->n + y.u.l->n, x.u.l->tuple);
        for (size_t i = 0; i < x.u.l->n; i++) jl_push(c->a, l.u.l, x.u.l->v[i]);
        for (size_t i = 0; i < y.u.l->n; i++) jl_push(c->a, l.u.l, y.u.l->v[i]);
        return l;
    }
    if (op == '*' && (((x.t == JV_STR || x.t == JV_LIST) && (y.t == JV_INT || y.t == JV_BOOL)) ||
                      ((y.t == JV_STR || y.t == JV_LIST) && (x.t == JV_INT || x.t == JV_BOOL)))) {
        jv s = x.t == JV_INT || x.t == JV_BOOL ? y : x;
        int64_t k = x.t == JV_INT || x.t == JV_BOOL ? x.u.i : y.u.i;
        if (k < 0) k = 0;
        if (s.t == JV_STR) {
            if (s.u.s.n && (uint64_t)k > c->lim->max_output / s.u.s.n) fail(c, at, "repeated string too large");
            jbuf b;
            jb_init(&b, c->a, 0);
            for (int64_t i = 0; i < k; i++) jb_put(&b, s.u.s.p, s.u.s.n);
            return mkstr(c, &b);
        }
        if (s.u.l->n && (uint64_t)k > c->lim->max_iters / s.u.l->n) fail(c, at, "repeated list too large");
        jv l = jv_list(c->a, 0, s.u.l->tuple);
        for (int64_t i = 0; i < k; i++)
            for (size_t j = 0; j < s.u.l->n; j++) jl_push(c->a, l.u.l, s.u.l->v[j]);
        return l;
    }
    if (op == '+' && x.t == JV_STR) fail(c, at, "can only concatenate str (not \"%s\") to str", tname(y));
    if (op == '+' && x.t == JV_LIST)
        fail(c, at, "can only concatenate %s (not \"%s\") to %s", x.u.l->tuple ? "tuple" : "list",
             y.t == JV_LIST && y.u.l->tuple ? "tuple" : tname(y), x.u.l->tuple ? "tuple" : "list");
    if (op == '%' && x.t == JV_STR) return percent_format(c, at, x.u.s, y);
    fail(c, at, "unsupported operand type(s) for %s: '%s' and '%s'", opname, tname(x), tname(y));
}

static int cmp_values(ctx *c, const node *at, jv x, jv y, const char *op);

/* <, <=, >, >= ordering: -1/0/1, TypeError for unordered types. */
static int cmp_values(ctx *c, const node *at, jv x, jv y, const char *op) {
    if (x.t == JV_UNDEF) fail_undef(c, at, x);
    if (y.t == JV_UNDEF) fail_undef(c, at, y);
    if (jv_is_num(x) && jv_is_num(y)) {
        if (x.t != JV_FLOAT && y.t != JV_FLOAT) return x.u.i < y.u.i ? -1 : x.u.i > y.u.i;
        double a = jv_num(x), b = jv_num(y);
        return a < b ? -1 : a > b;
    }
    if (x.t == JV_STR && y.t == JV_STR) {
        size_t n = x.u.s.n < y.u.s.n ? x.u.s.n : y.u.s.n;
        int r = memcmp(x.u.s.p, y.u.s.p, n);
        if (r) return r < 0 ? -1 : 1;
        return x.u.s.n < y.u.s.n ? -1 : x.u.s.n > y.u.s.n;
    }
    if (x.t == JV_LIST && y.t == JV_LIST && x.u.l->tuple == y.u.l->tuple) {
        size_t n = x.u.l->n < y.u.l->n ? x.u.l->n : y.u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (jv_equal(x.u.l->v[i], y.u.l->v[i])) continue;
            return cmp_values(c, at, x.u.l->v[i], y.u.l->v[i], op);
        }
        return x.u.l->n < y.u.l->n ? -1 : x.u.l->n > y.u.l->n;
    }
    fail(c, at, "'%s' not supported between instances of '%s' and '%s'", op, tname(x), tname(y));
}

static int contains(ctx *c, const node *at, jv needle, jv hay) {
    switch (hay.t) {
    case JV_STR:
        if (needle.t == JV_UNDEF) fail_undef(c, at, needle);
        if (needle.t != JV_STR) fail(c, at, "'in <string>' requires string as left operand, not %s", tname(needle));
        return memmem_s(hay.u.s, 0, needle.u.s) != NULL;
    case JV_LIST:
        for (size_t i = 0; i < hay.u.l->n; i++)
            if (jv_equal(hay.u.l->v[i], needle)) return 1;
        return 0;
    case JV_DICT: return jd_get(hay.u.d, needle) != NULL;
    case JV_UNDEF: return 0;
    default: fail(c, at, "argument of type '%s' is not iterable", tname(hay));
    }
}

/* ---- calls ---- */
static jv eval(ctx *c, scope *s, const node *x);
static void exec_body(ctx *c, scope *s, node *const *items, int n);
static jv call_value(ctx *c, const node *at, jv callee, args *A, jv caller);
static jv apply_filter(ctx *c, scope *s, const node *at, jstr name, jv v, args *A);
static int apply_test(ctx *c, scope *s, const node *at, jstr name, jv v, args *A);

static jv arg_get(const args *A, int idx, const char *name, jv dflt) {
    if (idx >= 0 && idx < A->npos) return A->pos[idx];
    for (int i = 0; i < A->nkw; i++)
        if (streq(A->kwn[i], name)) return A->kwv[i];
    return dflt;
}

static int64_t as_int(ctx *c, const node *at, jv v, const char *what) {
    if (v.t == JV_INT || v.t == JV_BOOL) return v.u.i;
    if (v.t == JV_UNDEF) fail_undef(c, at, v);
    fail(c, at, "'%s' object cannot be interpreted as an integer (%s)", tname(v), what);
}

static void eval_args(ctx *c, scope *s, const node *x, args *A) {
    jv *pos = x->n ? ja_alloc(c->a, (size_t)x->n * sizeof(jv)) : NULL;
    for (int i = 0; i < x->n; i++) pos[i] = eval(c, s, x->items[i]);
    jv *kwv = x->nkw ? ja_alloc(c->a, (size_t)x->nkw * sizeof(jv)) : NULL;
    for (int i = 0; i < x->nkw; i++) kwv[i] = eval(c, s, x->kw[i]);
    A->pos = pos;
    A->npos = x->n;
    A->kwn = x->kwnames;
    A->kwv = kwv;
    A->nkw = x->nkw;
}

/* Output capture: runs a body with its output going to a fresh buffer, returns the string. */
static jv capture(ctx *c, scope *s, node *const *items, int n) {
    jbuf b;
    jb_init(&b, c->a, c->lim->max_output);
    jbuf *saved = c->out;
    c->out = &b;
    exec_body(c, s, items, n);
    c->out = saved;
    return mkstr(c, &b);
}

static int names_used(const node *x, const char *name) {
    if (!x) return 0;
    if (x->kind == N_NAME && streq(x->name, name)) return 1;
    if (names_used(x->a, name) || names_used(x->b, name) || names_used(x->c, name)) return 1;
    for (int i = 0; i < x->n; i++)
        if (names_used(x->items[i], name)) return 1;
    for (int i = 0; i < x->n2; i++)
        if (names_used(x->items2[i], name)) return 1;
    for (int i = 0; i < x->nkw; i++)
        if (names_used(x->kw[i], name)) return 1;
    return 0;
}

static jv call_macro(ctx *c, const node *at, jmacro *m, args *A, jv caller) {
    const node *d = m->def;
    enter(c, at);
    scope *s = scope_new(c, m->closure);
    int np = d->n2;
    jstr mname = d->kind == S_MACRO ? d->name : (jstr){"caller", 6};
    if (A->npos > np && !m->uses_varargs)
        fail(c, at, "macro '%.*s' takes not more than %d argument(s)", (int)mname.n, mname.p, np);
    jv kwargs = jv_dict(c->a, 0);
    int *used = A->nkw ? ja_alloc(c->a, (size_t)A->nkw * sizeof(int)) : NULL;
    for (int i = 0; i < np; i++) {
        const node *p = d->items2[i];
        jv v;
        int have = 0;
        if (i < A->npos) {
            v = A->pos[i];
            have = 1;
        }
        for (int k = 0; k < A->nkw; k++)
            if (A->kwn[k].n == p->name.n && !memcmp(A->kwn[k].p, p->name.p, p->name.n)) {
                if (have) fail(c, at, "macro '%.*s' got multiple values for argument '%.*s'", (int)mname.n, mname.p, (int)p->name.n, p->name.p);
                v = A->kwv[k];
                used[k] = 1;
                have = 1;
            }
        if (!have) {
            if (p->a)
                v = eval(c, s, p->a);
            else
                v = undef_msgf(c, "parameter '%.*s' was not provided", (int)p->name.n, p->name.p);
        }
        scope_set(c, s, p->name, v);
    }
    for (int k = 0; k < A->nkw; k++) {
        if (used[k]) continue;
        if (streq(A->kwn[k], "caller") && m->uses_caller) continue;
        if (!m->uses_kwargs)
            fail(c, at, "macro '%.*s' takes no keyword argument '%.*s'", (int)mname.n, mname.p, (int)A->kwn[k].n, A->kwn[k].p);
        jd_set(c->a, kwargs.u.d, jv_str(A->kwn[k].p, A->kwn[k].n), A->kwv[k]);
    }
    jv va = jv_list(c->a, 0, 1);
    for (int i = np; i < A->npos; i++) jl_push(c->a, va.u.l, A->pos[i]);
    scope_set(c, s, (jstr){"varargs", 7}, va);
    scope_set(c, s, (jstr){"kwargs", 6}, kwargs);
    if (caller.t != JV_UNDEF) scope_set(c, s, (jstr){"caller", 6}, caller);
    int saved_brk = c->brk;
    jv r = capture(c, s, d->items, d->n);
    c->brk = saved_brk;
    leave(c);
    return r;
}

static jv make_namespace(ctx *c, const node *at, args *A) {
    jv ns = jv_dict(c->a, 0);
    ns.t = JV_NS;
    for (int i = 0; i < A->npos; i++) {
        if (A->pos[i].t != JV_DICT) fail(c, at, "namespace() positional argument must be a mapping");
        for (size_t k = 0; k < A->pos[i].u.d->n; k++) jd_set(c->a, ns.u.d, A->pos[i].u.d->k[k], A->pos[i].u.d->v[k]);
    }
    for (int i = 0; i < A->nkw; i++) jd_set(c->a, ns.u.d, jv_str(A->kwn[i].p, A->kwn[i].n), A->kwv[i]);
    return ns;
}

static jv call_func(ctx *c, const node *at, jv f, args *A) {
    switch (f.aux) {
    case FN_RANGE: {
        int64_t start = 0, stop, step = 1;
        if (A->npos == 1) {
            stop = as_int(c, at, A->pos[0], "range");
        } else if (A->npos == 2 || A->npos == 3) {
            start = as_int(c, at, A->pos[0], "range");
            stop = as_int(c, at, A->pos[1], "range");
            if (A->npos == 3) step = as_int(c, at, A->pos[2], "range");
        } else {
            fail(c, at, "range expected 1 to 3 arguments, got %d", A->npos);
        }
        if (step == 0) fail(c, at, "range() arg 3 must not be zero");
        double cnt = ceil(((double)stop - (double)start) / (double)step);
        if (cnt > 100000) fail(c, at, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        jv l = jv_list(c->a, cnt > 0 ? (size_t)cnt : 0, 0);
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) jl_push(c->a, l.u.l, jv_int(i));
        return l;
    }
    case FN_NAMESPACE: return make_namespace(c, at, A);
    case FN_DICT: {
        jv d = make_namespace(c, at, A);
        d.t = JV_DICT;
        return d;
    }
    case FN_RAISE: {
        jv m = str_of(c, arg_get(A, 0, "message", jv_str("", 0)));
        /* exactly the template's message, no position: callers show it to users as is */
        ci_err(c->err, c->errlen, CINFER_EINVAL, "%.*s", (int)m.u.s.n, m.u.s.p);
        c->code = CINFER_EINVAL;
        longjmp(c->jb, 1);
    }
    case FN_STRFTIME: {
        jv fmt = arg_get(A, 0, "format", jv_undef());
        if (fmt.t != JV_STR) fail(c, at, "strftime_now() argument must be str, not %s", tname(fmt));
        time_t t = c->now ? (time_t)c->now : time(NULL);
        struct tm tmv;
        localtime_r(&t, &tmv);
        char fs[256], out[512];
        snprintf(fs, sizeof fs, "%.*s", (int)(fmt.u.s.n > 250 ? 250 : fmt.u.s.n), fmt.u.s.p);
        size_t n = fs[0] ? strftime(out, sizeof out, fs, &tmv) : 0;
        return jv_str(ja_strdup(c->a, out, n), n);
    }
    case FN_CYCLE: {
        if (A->npos == 0) fail(c, at, "no items for cycling given");
        return A->pos[f.u.lp->idx % (size_t)A->npos];
    }
    }
    fail(c, at, "unknown function");
}

static jv call_method(ctx *c, const node *at, jmethod *me, args *A);

static jv call_value(ctx *c, const node *at, jv callee, args *A, jv caller) {
    switch (callee.t) {
    case JV_MACRO: return call_macro(c, at, callee.u.m, A, caller);
    case JV_FUNC: return call_func(c, at, callee, A);
    case JV_METHOD: return call_method(c, at, callee.u.me, A);
    case JV_UNDEF: fail_undef(c, at, callee);
    default: fail(c, at, "'%s' object is not callable", tname(callee));
    }
}

/* ---- string methods ---- */
static jv split_impl(ctx *c, const node *at, jstr s, jv sepv, int64_t maxsplit, int from_right) {
    jv l = jv_list(c->a, 0, 0);
    if (sepv.t == JV_NONE || sepv.t == JV_UNDEF) {
        /* runs of whitespace; no empty strings */
        if (!from_right) {
            size_t i = 0;
            int64_t done = 0;
            while (i < s.n) {
                size_t adv;
                while (i < s.n && u_isspace(u8_decode(s.p + i, s.n - i, &adv))) i += adv;
                if (i >= s.n) break;
                if (maxsplit >= 0 && done >= maxsplit) {
                    jl_push(c->a, l.u.l, jv_str(s.p + i, s.n - i)); /* the rest keeps its trailing spaces */
                    break;
                }
                size_t b = i;
                while (i < s.n && !u_isspace(u8_decode(s.p + i, s.n - i, &adv))) i += adv;
                jl_push(c->a, l.u.l, jv_str(s.p + b, i - b));
                done++;
            }
            return l;
        }
        /* rsplit(None): collect all words, then merge the leading ones if maxsplit is hit */
        jv all = split_impl(c, at, s, jv_none(), -1, 0);
        if (maxsplit < 0 || (int64_t)all.u.l->n <= maxsplit) return all;
        size_t keep = (size_t)maxsplit;
        size_t first = all.u.l->n - keep;
        /* the head is the original text up to the end of word[first-1], left-stripped */
        jv last_head = all.u.l->v[first - 1];
        jstr head = {s.p, (size_t)(last_head.u.s.p + last_head.u.s.n - s.p)};
        jl_push(c->a, l.u.l, jv_str(head.p, head.n)); /* the head keeps its leading spaces */
        for (size_t i = first; i < all.u.l->n; i++) jl_push(c->a, l.u.l, all.u.l->v[i]);
        return l;
    }
    if (sepv.t != JV_STR) fail(c, at, "must be str or None, not %s", tname(sepv));
    jstr sep = sepv.u.s;
    if (sep.n == 0) fail(c, at, "empty separator");
    if (!from_right) {
        size_t i = 0;
        int64_t done = 0;
        for (;;) {
            const char *h = (maxsplit >= 0 && done >= maxsplit) ? NULL : memmem_s(s, i, sep);
            if (!h) {
                jl_push(c->a, l.u.l, jv_str(s.p + i, s.n - i));
                return l;
            }
            jl_push(c->a, l.u.l, jv_str(s.p + i, (size_t)(h - (s.p + i))));
            i = (size_t)(h - s.p) + sep.n;
            done++;
        }
    }
    /* rsplit: scan from the right, then reverse */
    jv tmp = jv_list(c->a, 0, 0);
    size_t end = s.n;
    int64_t done = 0;
    for (;;) {
        const char *h = NULL;
        if (!(maxsplit >= 0 && done >= maxsplit) && end >= sep.n)
            for (size_t k = end - sep.n + 1; k-- > 0;)
                if (!memcmp(s.p + k, sep.p, sep.n)) {
                    h = s.p + k;
                    break;
                }
        if (!h) {
            jl_push(c->a, tmp.u.l, jv_str(s.p, end));
            break;
        }
        size_t k = (size_t)(h - s.p);
        jl_push(c->a, tmp.u.l, jv_str(s.p + k + sep.n, end - k - sep.n));
        end = k;
        done++;
    }
    for (size_t i = tmp.u.l->n; i-- > 0;) jl_push(c->a, l.u.l, tmp.u.l->v[i]);
    return l;
}

static jv str_title(ctx *c, jstr s) {
    /* Python str.title(): a cased char after an uncased one is uppercased, the others lowercased */
    jbuf b;
    jb_init(&b, c->a, 0);
    int prev_cased = 0;
    for (size_t i = 0; i < s.n;) {
        size_t adv;
        uint32_t cp = u8_decode(s.p + i, s.n - i, &adv);
        utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
        int cased = k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
        if (cased)
            put_cp_case(&b, cp, !prev_cased);
        else
            jb_put(&b, s.p + i, adv);
        prev_cased = cased;
        i += adv;
    }
    return mkstr(c, &b);
}

static jv str_capitalize(ctx *c, jstr s) {
    jbuf b;
    jb_init(&b, c->a, 0);
    for (size_t i = 0; i < s.n;) {
        size_t adv;
        uint32_t cp = u8_decode(s.p + i, s.n - i, &adv);
        put_cp_case(&b, cp, i == 0);
        i += adv;
    }
    return mkstr(c, &b);
}

static int prefix_match(ctx *c, const node *at, jstr s, jv pre, int suffix) {
    if (pre.t == JV_LIST && pre.u.l->tuple) {
        for (size_t i = 0; i < pre.u.l->n; i++)
            if (prefix_match(c, at, s, pre.u.l->v[i], suffix)) return 1;
        return 0;
    }
    if (pre.t != JV_STR)
        fail(c, at, "%s first arg must be str or a tuple of str, not %s", suffix ? "endswith" : "startswith", tname(pre));
    if (pre.u.s.n > s.n) return 0;
    return !memcmp(suffix ? s.p + s.n - pre.u.s.n : s.p, pre.u.s.p, pre.u.s.n);
}

static jv str_replace(ctx *c, jstr s, jstr old, jstr new_, int64_t count) {
    jbuf b;
    jb_init(&b, c->a, c->lim->max_output);
    if (old.n == 0) {
        /* Python inserts `new` between every code point and at both ends */
        int64_t done = 0;
        for (size_t i = 0; i <= s.n;) {
            if (count < 0 || done < count) {
                jb_put(&b, new_.p, new_.n);
                done++;
            }
            if (i == s.n) break;
            size_t adv;
            u8_decode(s.p + i, s.n - i, &adv);
            jb_put(&b, s.p + i, adv);
            i += adv;
        }
        return mkstr(c, &b);
    }
    size_t i = 0;
    int64_t done = 0;
    for (;;) {
        const char *h = (count >= 0 && done >= count) ? NULL : memmem_s(s, i, old);
        if (!h) break;
        jb_put(&b, s.p + i, (size_t)(h - s.p) - i);
        jb_put(&b, new_.p, new_.n);
        i = (size_t)(h - s.p) + old.n;
        done++;
    }
    jb_put(&b, s.p + i, s.n - i);
    return mkstr(c, &b);
}

static int64_t cp_index_of(jstr s, const char *at) { return (int64_t)u8_len(s.p, (size_t)(at - s.p)); }

static jv str_method(ctx *c, const node *at, jstr s, jstr name, args *A) {
    jv a0 = arg_get(A, 0, "", jv_undef()), a1 = arg_get(A, 1, "", jv_undef());
    if (streq(name, "startswith") || streq(name, "endswith")) {
        int suffix = name.p[0] == 'e';
        jv pre = arg_get(A, 0, suffix ? "suffix" : "prefix", jv_undef());
        jstr sub = s;
        if (A->npos > 1) {
            /* start/end in code points */
            size_t n = u8_len(s.p, s.n);
            int64_t st = as_int(c, at, A->pos[1], "start"), en = (int64_t)n;
            if (A->npos > 2 && A->pos[2].t != JV_NONE) en = as_int(c, at, A->pos[2], "end");
            if (st < 0) st = st + (int64_t)n < 0 ? 0 : st + (int64_t)n;
            if (en < 0) en = en + (int64_t)n < 0 ? 0 : en + (int64_t)n;
            if (st > (int64_t)n) return jv_bool(0);
            if (en > (int64_t)n) en = (int64_t)n;
            if (en < st) en = st;
            size_t bo = u8_offset(s.p, s.n, (size_t)st), eo = u8_offset(s.p, s.n, (size_t)en);
            sub = (jstr){s.p + bo, eo - bo};
        }
        return jv_bool(prefix_match(c, at, sub, pre, suffix));
    }
    if (streq(name, "strip") || streq(name, "lstrip") || streq(name, "rstrip")) {
        jv ch = arg_get(A, 0, "chars", jv_none());
        int which = name.p[0] == 'l' ? 1 : name.p[0] == 'r' ? 2 : 3;
        if (ch.t == JV_NONE) return str_strip(s, NULL, which);
        if (ch.t != JV_STR) fail(c, at, "%.*s arg must be None or str", (int)name.n, name.p);
        return str_strip(s, &ch.u.s, which);
    }
    if (streq(name, "split") || streq(name, "rsplit")) {
        jv sep = arg_get(A, 0, "sep", jv_none());
        jv ms = arg_get(A, 1, "maxsplit", jv_int(-1));
        return split_impl(c, at, s, sep, as_int(c, at, ms, "maxsplit"), name.p[0] == 'r');
    }
    if (streq(name, "upper") || streq(name, "lower") || streq(name, "casefold")) return str_case(c, s, name.p[0] == 'u');
    if (streq(name, "title")) return str_title(c, s);
    if (streq(name, "capitalize")) return str_capitalize(c, s);
    if (streq(name, "swapcase")) {
        jbuf b;
        jb_init(&b, c->a, 0);
        for (size_t i = 0; i < s.n;) {
            size_t adv;
            uint32_t cp = u8_decode(s.p + i, s.n - i, &adv);
            utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
            if (k == UTF8PROC_CATEGORY_LU)
                put_cp_case(&b, cp, 0);
            else if (k == UTF8PROC_CATEGORY_LL)
                put_cp_case(&b, cp, 1);
            else
                jb_put(&b, s.p + i, adv);
            i += adv;
        }
        return mkstr(c, &b);
    }
    if (streq(name, "replace")) {
        jv cnt = arg_get(A, 2, "count", jv_int(-1));
        if (a0.t != JV_STR || a1.t != JV_STR) fail(c, at, "replace() arguments must be str");
        return str_replace(c, s, a0.u.s, a1.u.s, as_int(c, at, cnt, "count"));
    }
    if (streq(name, "find") || streq(name, "rfind") || streq(name, "index") || streq(name, "count")) {
        if (a0.t != JV_STR) fail(c, at, "must be str, not %s", tname(a0));
        if (streq(name, "count")) {
            if (a0.u.s.n == 0) return jv_int((int64_t)u8_len(s.p, s.n) + 1);
            int64_t k = 0;
            size_t i = 0;
            const char *h;
            while ((h = memmem_s(s, i, a0.u.s))) {
                k++;
                i = (size_t)(h - s.p) + a0.u.s.n;
            }
            return jv_int(k);
        }
        const char *h = NULL;
        if (name.p[0] == 'r') {
            for (size_t k = s.n >= a0.u.s.n ? s.n - a0.u.s.n + 1 : 0; k-- > 0;)
                if (!memcmp(s.p + k, a0.u.s.p, a0.u.s.n)) {
                    h = s.p + k;
                    break;
                }
        } else {
            h = memmem_s(s, 0, a0.u.s);
        }
        if (!h) {
            if (streq(name, "index")) fail(c, at, "substring not found");
            return jv_int(-1);
        }
        return jv_int(cp_index_of(s, h));
    }
    if (streq(name, "splitlines")) {
        jv keep = arg_get(A, 0, "keepends", jv_bool(0));
        jv l = jv_list(c->a, 0, 0);
        size_t i = 0, b = 0;
        while (i < s.n) {
            size_t adv;
            uint32_t cp = u8_decode(s.p + i, s.n - i, &adv);
            int br = cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || cp == 0x1c || cp == 0x1d || cp == 0x1e ||
                     cp == 0x85 || cp == 0x2028 || cp == 0x2029;
            if (!br) {
                i += adv;
                continue;
            }
            size_t e = i;
            i += adv;
            if (cp == '\r' && i < s.n && s.p[i] == '\n') i++;
            jl_push(c->a, l.u.l, jv_str(s.p + b, (jv_truthy(keep) ? i : e) - b));
            b = i;
        }
        if (b < s.n) jl_push(c->a, l.u.l, jv_str(s.p + b, s.n - b));
        return l;
    }
    if (streq(name, "join")) {
        jlist *items = to_list(c, at, a0);
        jbuf b;
        jb_init(&b, c->a, c->lim->max_output);
        for (size_t i = 0; i < items->n; i++) {
            if (items->v[i].t != JV_STR) fail(c, at, "sequence item %zu: expected str instance, %s found", i, tname(items->v[i]));
            if (i) jb_put(&b, s.p, s.n);
            jb_put(&b, items->v[i].u.s.p, items->v[i].u.s.n);
        }
        return mkstr(c, &b);
    }
    if (streq(name, "format")) {
        /* {} / {0} / {name} replacement, {{ and }} escapes; no format specs */
        jbuf b;
        jb_init(&b, c->a, c->lim->max_output);
        int auto_idx = 0;
        for (size_t i = 0; i < s.n; i++) {
            char ch = s.p[i];
            if (ch == '{' && i + 1 < s.n && s.p[i + 1] == '{') {
                jb_putc(&b, '{');
                i++;
            } else if (ch == '}' && i + 1 < s.n && s.p[i + 1] == '}') {
                jb_putc(&b, '}');
                i++;
            } else if (ch == '{') {
                size_t j = i + 1;
                while (j < s.n && s.p[j] != '}') j++;
                if (j >= s.n) fail(c, at, "Single '{' encountered in format string");
                jstr field = {s.p + i + 1, j - i - 1};
                jv v;
                if (field.n == 0) {
                    if (auto_idx >= A->npos) fail(c, at, "Replacement index %d out of range for positional args tuple", auto_idx);
                    v = A->pos[auto_idx++];
                } else if (isdigit((unsigned char)field.p[0])) {
                    long k = 0;
                    for (size_t z = 0; z < field.n && isdigit((unsigned char)field.p[z]) && k <= A->npos; z++) k = k * 10 + (field.p[z] - '0');
                    if (k >= A->npos) fail(c, at, "Replacement index %ld out of range for positional args tuple", k);
                    v = A->pos[k];
                } else {
                    v = jv_undef();
                    int found = 0;
                    for (int k = 0; k < A->nkw; k++)
                        if (A->kwn[k].n == field.n && !memcmp(A->kwn[k].p, field.p, field.n)) {
                            v = A->kwv[k];
                            found = 1;
                        }
                    if (!found) fail(c, at, "KeyError: '%.*s'", (int)field.n, field.p);
                }
                jv_str_into(&b, v);
                i = j;
            } else {
                jb_putc(&b, ch);
            }
        }
        return mkstr(c, &b);
    }
    if (streq(name, "isdigit") || streq(name, "isalpha") || streq(name, "isspace") || streq(name, "isalnum") ||
        streq(name, "isnumeric") || streq(name, "isdecimal")) {
        if (s.n == 0) return jv_bool(0);
        for (size_t i = 0; i < s.n;) {
            size_t adv;
            uint32_t cp = u8_decode(s.p + i, s.n - i, &adv);
            utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
            int ok;
            if (name.p[2] == 's') ok = u_isspace(cp);
            else if (streq(name, "isalpha")) ok = k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
            else if (streq(name, "isalnum")) ok = u_isalnum(cp);
            else ok = k == UTF8PROC_CATEGORY_ND || (name.p[2] == 'n' && (k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO));
            if (!ok) return jv_bool(0);
            i += adv;
        }
        return jv_bool(1);
    }
    if (streq(name, "islower") || streq(name, "isupper")) {
        int cased = 0;
        for (size_t i = 0; i < s.n;) {
            size_t adv;
            uint32_t cp = u8_decode(s.p + i, s.n - i, &adv);
            utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
            if (k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LT) {
                if (name.p[2] == 'l') return jv_bool(0);
                cased = 1;
            } else if (k == UTF8PROC_CATEGORY_LL) {
                if (name.p[2] == 'u') return jv_bool(0);
                cased = 1;
            }
            i += adv;
        }
        return jv_bool(cased);
    }
    if (streq(name, "istitle")) {
        jv t = str_title(c, s);
        int any = 0;
        for (size_t i = 0; i < s.n; i++)
            if (isalpha((unsigned char)s.p[i]) || (unsigned char)s.p[i] >= 0x80) any = 1;
        return jv_bool(any && t.u.s.n == s.n && !memcmp(t.u.s.p, s.p, s.n));
    }
    if (streq(name, "center") || streq(name, "ljust") || streq(name, "rjust") || streq(name, "zfill")) {
        int64_t w = as_int(c, at, a0, "width");
        jstr fill = {" ", 1};
        if (name.p[0] == 'z') fill = (jstr){"0", 1};
        jv fv = arg_get(A, 1, "fillchar", jv_undef());
        if (fv.t == JV_STR && name.p[0] != 'z') fill = fv.u.s;
        int64_t n = (int64_t)u8_len(s.p, s.n);
        if (w <= n) return jv_str(s.p, s.n);
        if (w - n > (int64_t)c->lim->max_output) fail(c, at, "width too large");
        int64_t pad = w - n, left;
        if (name.p[0] == 'c') left = pad / 2 + (pad & w & 1);
        else if (name.p[0] == 'l') left = 0;
        else left = pad;
        jbuf b;
        jb_init(&b, c->a, 0);
        size_t skip = 0;
        if (name.p[0] == 'z' && s.n && (s.p[0] == '-' || s.p[0] == '+')) {
            jb_putc(&b, s.p[0]);
            skip = 1;
        }
        for (int64_t i = 0; i < left; i++) jb_put(&b, fill.p, fill.n);
        jb_put(&b, s.p + skip, s.n - skip);
        for (int64_t i = 0; i < pad - left; i++) jb_put(&b, fill.p, fill.n);
        return mkstr(c, &b);
    }
    if (streq(name, "partition") || streq(name, "rpartition")) {
        if (a0.t != JV_STR || a0.u.s.n == 0) fail(c, at, "empty separator");
        jv parts = split_impl(c, at, s, a0, 1, name.p[0] == 'r');
        jv t = jv_list(c->a, 3, 1);
        if (parts.u.l->n == 2) {
            jl_push(c->a, t.u.l, parts.u.l->v[0]);
            jl_push(c->a, t.u.l, a0);
            jl_push(c->a, t.u.l, parts.u.l->v[1]);
        } else if (name.p[0] == 'r') {
            jl_push(c->a, t.u.l, jv_str("", 0));
            jl_push(c->a, t.u.l, jv_str("", 0));
            jl_push(c->a, t.u.l, jv_str(s.p, s.n));
        } else {
            jl_push(c->a, t.u.l, jv_str(s.p, s.n));
            jl_push(c->a, t.u.l, jv_str("", 0));
            jl_push(c->a, t.u.l, jv_str("", 0));
        }
        return t;
    }
    if (streq(name, "removeprefix") || streq(name, "removesuffix")) {
        if (a0.t != JV_STR) fail(c, at, "must be str, not %s", tname(a0));
        int suffix = name.p[6] == 's';
        if (a0.u.s.n <= s.n && !memcmp(suffix ? s.p + s.n - a0.u.s.n : s.p, a0.u.s.p, a0.u.s.n))
            return suffix ? jv_str(s.p, s.n - a0.u.s.n) : jv_str(s.p + a0.u.s.n, s.n - a0.u.s.n);
        return jv_str(s.p, s.n);
    }
    if (streq(name, "expandtabs")) {
        int64_t ts = as_int(c, at, arg_get(A, 0, "tabsize", jv_int(8)), "tabsize");
        jbuf b;
        jb_init(&b, c->a, c->lim->max_output);
        int64_t col = 0;
        for (size_t i = 0; i < s.n;) {
            size_t adv;
            uint32_t cp = u8_decode(s.p + i, s.n - i, &adv);
            if (cp == '\t') {
                if (ts > 0) {
                    int64_t k = ts - col % ts;
                    for (int64_t z = 0; z < k; z++) jb_putc(&b, ' ');
                    col += k;
                }
            } else {
                jb_put(&b, s.p + i, adv);
                col = (cp == '\n' || cp == '\r') ? 0 : col + 1;
            }
            i += adv;
        }
        return mkstr(c, &b);
    }
    fail(c, at, "'str' object has no attribute '%.*s'", (int)name.n, name.p);
}

static jv call_method(ctx *c, const node *at, jmethod *me, args *A) {
    jv self = me->self;
    jstr name = me->name;
    if (self.t == JV_STR) return str_method(c, at, self.u.s, name, A);
    if (self.t == JV_DICT) {
        jdict *d = self.u.d;
        if (streq(name, "items")) {
            jv l = jv_list(c->a, d->n, 0);
            for (size_t i = 0; i < d->n; i++) {
                jv t = jv_list(c->a, 2, 1);
                jl_push(c->a, t.u.l, d->k[i]);
                jl_push(c->a, t.u.l, d->v[i]);
                jl_push(c->a, l.u.l, t);
            }
            return l;
        }
        if (streq(name, "keys") || streq(name, "values")) {
            jv l = jv_list(c->a, d->n, 0);
            for (size_t i = 0; i < d->n; i++) jl_push(c->a, l.u.l, name.p[0] == 'k' ? d->k[i] : d->v[i]);
            return l;
        }
        if (streq(name, "get")) {
            if (A->npos < 1) fail(c, at, "get expected at least 1 argument, got 0");
            jv *v = jd_get(d, A->pos[0]);
            return v ? *v : (A->npos > 1 ? A->pos[1] : jv_none());
        }
        if (streq(name, "copy")) {
            jv n = jv_dict(c->a, d->n);
            for (size_t i = 0; i < d->n; i++) jd_set(c->a, n.u.d, d->k[i], d->v[i]);
            return n;
        }
    }
    if (self.t == JV_LIST) {
        jlist *l = self.u.l;
        if (streq(name, "index") || streq(name, "count")) {
            if (A->npos < 1) fail(c, at, "%.*s() takes exactly one argument (0 given)", (int)name.n, name.p);
            int64_t k = 0;
            for (size_t i = 0; i < l->n; i++)
                if (jv_equal(l->v[i], A->pos[0])) {
                    if (name.p[0] == 'i') return jv_int((int64_t)i);
                    k++;
                }
            if (name.p[0] == 'i') fail(c, at, "%s.index(x): x not in %s", l->tuple ? "tuple" : "list", l->tuple ? "tuple" : "list");
            return jv_int(k);
        }
        if (streq(name, "copy")) {
            jv n = jv_list(c->a, l->n, l->tuple);
            for (size_t i = 0; i < l->n; i++) jl_push(c->a, n.u.l, l->v[i]);
            return n;
        }
    }
    fail(c, at, "'%s' object has no attribute '%.*s'", tname(self), (int)name.n, name.p);
}

/* Python's printf-style `fmt % args` for %s %r %d %i %f %F %e %E %g %G %x %X %o %c %%, with flags, width and
 * precision; the `format` filter and the % operator on strings use it. */
static jv percent_format(ctx *c, const node *at, jstr fmt, jv argv) {
    jlist one = {1, 1, &argv, 1};
    jlist *vals = argv.t == JV_LIST && argv.u.l->tuple ? argv.u.l : &one;
    size_t k = 0;
    jbuf b;
    jb_init(&b, c->a, c->lim->max_output);
    for (size_t i = 0; i < fmt.n; i++) {
        if (fmt.p[i] != '%') {
            jb_putc(&b, fmt.p[i]);
            continue;
        }
        char spec[32];
        size_t sn = 0;
        spec[sn++] = '%';
        i++;
        while (i < fmt.n && strchr("-+ #0", fmt.p[i]) && sn < 8) spec[sn++] = fmt.p[i++];
        while (i < fmt.n && isdigit((unsigned char)fmt.p[i]) && sn < 14) spec[sn++] = fmt.p[i++];
        if (i < fmt.n && fmt.p[i] == '.') {
            spec[sn++] = fmt.p[i++];
            while (i < fmt.n && isdigit((unsigned char)fmt.p[i]) && sn < 20) spec[sn++] = fmt.p[i++];
        }
        if (i >= fmt.n) fail(c, at, "incomplete format");
        char conv = fmt.p[i];
        if (conv == '%') {
            jb_putc(&b, '%');
            continue;
        }
        if (k >= vals->n) fail(c, at, "not enough arguments for format string");
        jv v = vals->v[k++];
        char out[512];
        if (conv == 's' || conv == 'r' || conv == 'a') {
            jbuf sb;
            jb_init(&sb, c->a, c->lim->max_output);
            if (conv == 's') jv_str_into(&sb, v);
            else jv_repr_into(&sb, v);
            jstr t = jb_str(&sb);
            spec[sn] = 0;
            /* width/precision in code points are rare in templates; bytes are used */
            int width = atoi(spec + 1 + (spec[1] == '-'));
            int left = spec[1] == '-';
            int pad = width > (int)t.n ? width - (int)t.n : 0;
            if (pad > 4096) pad = 4096;
            if (!left)
                for (int z = 0; z < pad; z++) jb_putc(&b, ' ');
            jb_put(&b, t.p, t.n);
            if (left)
                for (int z = 0; z < pad; z++) jb_putc(&b, ' ');
            continue;
        }
        if (strchr("dicxXo", conv)) {
            if (v.t == JV_FLOAT && conv != 'c' && conv != 'x' && conv != 'X' && conv != 'o') v = jv_int((int64_t)v.u.f);
            if (v.t != JV_INT && v.t != JV_BOOL) fail(c, at, "%%%c format: a number is required, not %s", conv, tname(v));
            if (conv == 'c') {
                if (v.u.i < 0 || v.u.i > 0x10ffff) fail(c, at, "%%c arg not in range(0x110000)");
                u8_encode(&b, (uint32_t)v.u.i);
                continue;
            }
            spec[sn++] = 'l';
            spec[sn++] = 'l';
            spec[sn++] = conv == 'i' ? 'd' : conv;
            spec[sn] = 0;
            snprintf(out, sizeof out, spec, (long long)v.u.i);
        } else if (strchr("fFeEgG", conv)) {
            if (!jv_is_num(v)) fail(c, at, "must be real number, not %s", tname(v));
            spec[sn++] = conv;
            spec[sn] = 0;
            snprintf(out, sizeof out, spec, jv_num(v));
        } else {
            fail(c, at, "unsupported format character '%c'", conv);
        }
        jb_puts(&b, out);
    }
    if (k < vals->n && argv.t == JV_LIST && argv.u.l->tuple) fail(c, at, "not all arguments converted during string formatting");
    return mkstr(c, &b);
}

/* ---- filters ---- */
static int64_t py_len(ctx *c, const node *at, jv v) {
    switch (v.t) {
    case JV_STR: return (int64_t)u8_len(v.u.s.p, v.u.s.n);
    case JV_LIST: return (int64_t)v.u.l->n;
    case JV_DICT:
    case JV_NS: return (int64_t)v.u.d->n;
    case JV_UNDEF: return 0;
    default: fail(c, at, "object of type '%s' has no len()", tname(v));
    }
}

/* attribute="a.b" or an integer index path, as Jinja's make_attrgetter */
static jv attr_path(ctx *c, const node *at, jv v, jv attr) {
    if (attr.t == JV_INT) return get_item(c, at, v, attr);
    if (attr.t != JV_STR) fail(c, at, "attribute must be a string");
    jstr s = attr.u.s;
    size_t i = 0;
    while (i <= s.n) {
        size_t j = i;
        while (j < s.n && s.p[j] != '.') j++;
        jstr part = {s.p + i, j - i};
        int is_num = part.n > 0;
        for (size_t k = 0; k < part.n; k++)
            if (!isdigit((unsigned char)part.p[k])) is_num = 0;
        if (v.t == JV_UNDEF) return v;
        v = is_num ? get_item(c, at, v, jv_int(strtoll(part.p, NULL, 10))) : get_item(c, at, v, jv_str(part.p, part.n));
        i = j + 1;
    }
    return v;
}

typedef struct sort_ctx {
    ctx *c;
    const node *at;
    int case_sensitive;
    int reverse;
} sort_ctx;

static sort_ctx *g_sort; /* qsort has no context argument in C11; renders are single-threaded per call */

static jv sort_key(ctx *c, jv v, int case_sensitive) {
    if (!case_sensitive && v.t == JV_STR) return str_case(c, v.u.s, 0);
    return v;
}

typedef struct keyed {
    jv key, val;
    size_t idx;
} keyed;

static int keyed_cmp(const void *x, const void *y) {
    const keyed *a = x, *b = y;
    int r = cmp_values(g_sort->c, g_sort->at, a->key, b->key, "<");
    if (g_sort->reverse) r = -r;
    if (r == 0) r = a->idx < b->idx ? -1 : 1; /* stable, like Python's sort */
    return r;
}

static void sort_keyed(ctx *c, const node *at, keyed *k, size_t n, int reverse) {
    sort_ctx sc = {c, at, 0, reverse};
    sort_ctx *saved = g_sort;
    g_sort = &sc;
    qsort(k, n, sizeof(keyed), keyed_cmp);
    g_sort = saved;
}

static jv do_select(ctx *c, scope *s, const node *at, jv v, args *A, int reject, int by_attr) {
    jlist *items = to_list(c, at, v);
    jv out = jv_list(c->a, 0, 0);
    int first = 0;
    jv attr = jv_undef();
    if (by_attr) {
        attr = arg_get(A, 0, "attribute", jv_undef());
        first = 1;
    }
    jv test = A->npos > first ? A->pos[first] : jv_undef();
    args TA = {A->npos > first + 1 ? A->pos + first + 1 : NULL, A->npos > first + 1 ? A->npos - first - 1 : 0, NULL, NULL, 0};
    for (size_t i = 0; i < items->n; i++) {
        jv x = items->v[i];
        jv probe = by_attr ? attr_path(c, at, x, attr) : x;
        int ok;
        if (test.t == JV_UNDEF)
            ok = jv_truthy(probe);
        else {
            if (test.t != JV_STR) fail(c, at, "test name must be a string");
            ok = apply_test(c, s, at, test.u.s, probe, &TA);
        }
        if (ok != reject) jl_push(c->a, out.u.l, x);
    }
    return out;
}

static jv round_value(ctx *c, const node *at, jv v, int64_t prec, jstr method) {
    if (v.t == JV_UNDEF) fail_undef(c, at, v);
    if (!jv_is_num(v)) fail(c, at, "type %s doesn't define __round__ method", tname(v));
    double x = jv_num(v);
    if (streq(method, "common")) {
        if (v.t != JV_FLOAT && prec >= 0) return jv_int(v.u.i);
        if (prec > 300 || prec < -300) return jv_float(x);
        char buf[512];
        if (prec >= 0) {
            /* printf rounds the exact binary value half-to-even, as Python's round() does */
            snprintf(buf, sizeof buf, "%.*f", (int)prec, x);
            return jv_float(strtod(buf, NULL));
        }
        double p = pow(10, (double)-prec);
        return jv_float(nearbyint(x / p) * p);
    }
    double p = pow(10, (double)prec);
    if (streq(method, "ceil")) return jv_float(ceil(x * p) / p);
    if (streq(method, "floor")) return jv_float(floor(x * p) / p);
    fail(c, at, "method must be common, ceil or floor");
}

static jv parse_int_str(jstr s, int64_t base, int *ok) {
    char buf[128];
    jv st = str_strip(s, NULL, 3);
    size_t k = 0;
    for (size_t i = 0; i < st.u.s.n && k + 1 < sizeof buf; i++)
        if (st.u.s.p[i] != '_') buf[k++] = st.u.s.p[i];
    buf[k] = 0;
    *ok = 0;
    if (k == 0 || k + 1 >= sizeof buf) return jv_int(0);
    char *end;
    long long r = strtoll(buf, &end, (int)(base == 10 ? 10 : base));
    if (*end == 0 && end != buf && !(base == 10 && buf[0] == '0' && k > 1 && (buf[1] == 'x' || buf[1] == 'X'))) {
        *ok = 1;
        return jv_int(r);
    }
    double d = strtod(buf, &end);
    if (*end == 0 && end != buf && isfinite(d) && fabs(d) < 9.2e18) {
        *ok = 1;
        return jv_int((int64_t)d);
    }
    return jv_int(0);
}

static int is_filter_name(jstr n);

static jv apply_filter(ctx *c, scope *s, const node *at, jstr name, jv v, args *A) {
    if (streq(name, "length") || streq(name, "count")) return jv_int(py_len(c, at, v));
    if (streq(name, "safe") || (streq(name, "list") && v.t == JV_LIST && !v.u.l->tuple)) return v;
    if (streq(name, "default") || streq(name, "d")) {
        jv dflt = arg_get(A, 0, "default_value", jv_str("", 0));
        jv boolean = arg_get(A, 1, "boolean", jv_bool(0));
        if (v.t == JV_UNDEF || (jv_truthy(boolean) && !jv_truthy(v))) return dflt;
        return v;
    }
    if (streq(name, "string")) return str_of(c, v);
    if (streq(name, "upper") || streq(name, "lower")) return str_case(c, str_of(c, v).u.s, name.p[0] == 'u');
    if (streq(name, "trim")) {
        jv s1 = str_of(c, v);
        jv ch = arg_get(A, 0, "chars", jv_none());
        if (ch.t == JV_STR) return str_strip(s1.u.s, &ch.u.s, 3);
        return str_strip(s1.u.s, NULL, 3);
    }
    if (streq(name, "capitalize")) return str_capitalize(c, str_of(c, v).u.s);
    if (streq(name, "title")) {
        /* Jinja's title: words start after runs of [-\s({\[<] */
        jstr x = str_of(c, v).u.s;
        jbuf b;
        jb_init(&b, c->a, 0);
        int at_start = 1;
        for (size_t i = 0; i < x.n;) {
            size_t adv;
            uint32_t cp = u8_decode(x.p + i, x.n - i, &adv);
            int sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || u_isspace(cp);
            if (sep) {
                jb_put(&b, x.p + i, adv);
                at_start = 1;
            } else {
                put_cp_case(&b, cp, at_start);
                at_start = 0;
            }
            i += adv;
        }
        return mkstr(c, &b);
    }
    if (streq(name, "replace")) {
        jstr x = str_of(c, v).u.s;
        jv old = str_of(c, arg_get(A, 0, "old", jv_str("", 0))), nw = str_of(c, arg_get(A, 1, "new", jv_str("", 0)));
        jv cnt = arg_get(A, 2, "count", jv_none());
        return str_replace(c, x, old.u.s, nw.u.s, cnt.t == JV_NONE ? -1 : as_int(c, at, cnt, "count"));
    }
    if (streq(name, "tojson")) {
        jv ea = arg_get(A, 0, "ensure_ascii", jv_bool(0));
        jv ind = arg_get(A, 1, "indent", jv_none());
        jv seps = arg_get(A, 2, "separators", jv_none());
        jv sk = arg_get(A, 3, "sort_keys", jv_bool(0));
        int indent = -1;
        if (ind.t == JV_INT || ind.t == JV_BOOL) indent = ind.u.i < 0 ? 0 : (int)(ind.u.i > 64 ? 64 : ind.u.i);
        else if (ind.t != JV_NONE) fail(c, at, "tojson: indent must be an integer");
        jstr item_sep = indent >= 0 ? (jstr){",", 1} : (jstr){", ", 2}, key_sep = {": ", 2};
        if (seps.t == JV_LIST && seps.u.l->n == 2 && seps.u.l->v[0].t == JV_STR && seps.u.l->v[1].t == JV_STR) {
            item_sep = seps.u.l->v[0].u.s;
            key_sep = seps.u.l->v[1].u.s;
        } else if (seps.t != JV_NONE) {
            fail(c, at, "tojson: separators must be a pair of strings");
        }
        jbuf b;
        jb_init(&b, c->a, c->lim->max_output);
        char msg[256];
        if (jv_json_into(&b, v, jv_truthy(ea), indent, item_sep, key_sep, jv_truthy(sk), 0, msg, sizeof msg))
            fail(c, at, "%s", msg);
        return mkstr(c, &b);
    }
    if (streq(name, "items")) {
        if (v.t == JV_UNDEF) return jv_list(c->a, 0, 0);
        if (v.t != JV_DICT) fail(c, at, "Can only get item pairs from a mapping.");
        jmethod m = {v, {"items", 5}};
        args none = {0};
        return call_method(c, at, &m, &none);
    }
    if (streq(name, "dictsort")) {
        if (v.t != JV_DICT) fail(c, at, "You can only sort by either \"key\" or \"value\"");
        int cs = jv_truthy(arg_get(A, 0, "case_sensitive", jv_bool(0)));
        jv by = arg_get(A, 1, "by", jv_cstr("key"));
        int rev = jv_truthy(arg_get(A, 2, "reverse", jv_bool(0)));
        int by_value = by.t == JV_STR && streq(by.u.s, "value");
        size_t n = v.u.d->n;
        keyed *k = ja_alloc(c->a, (n ? n : 1) * sizeof(keyed));
        for (size_t i = 0; i < n; i++) {
            k[i].key = sort_key(c, by_value ? v.u.d->v[i] : v.u.d->k[i], cs);
            k[i].idx = i;
        }
        sort_keyed(c, at, k, n, rev);
        jv l = jv_list(c->a, n, 0);
        for (size_t i = 0; i < n; i++) {
            jv t = jv_list(c->a, 2, 1);
            jl_push(c->a, t.u.l, v.u.d->k[k[i].idx]);
            jl_push(c->a, t.u.l, v.u.d->v[k[i].idx]);
            jl_push(c->a, l.u.l, t);
        }
        return l;
    }
    if (streq(name, "list")) {
        jlist *l = to_list(c, at, v);
        jv out = jv_list(c->a, l->n, 0);
        for (size_t i = 0; i < l->n; i++) jl_push(c->a, out.u.l, l->v[i]);
        return out;
    }
    if (streq(name, "first") || streq(name, "last")) {
        jlist *l = to_list(c, at, v);
        if (l->n == 0) return undef_msgf(c, "No %s item, sequence was empty.", name.p[0] == 'f' ? "first" : "last");
        return name.p[0] == 'f' ? l->v[0] : l->v[l->n - 1];
    }
    if (streq(name, "join")) {
        jv d = str_of(c, arg_get(A, 0, "d", jv_str("", 0)));
        jv attr = arg_get(A, 1, "attribute", jv_none());
        jlist *l = to_list(c, at, v);
        jbuf b;
        jb_init(&b, c->a, c->lim->max_output);
        for (size_t i = 0; i < l->n; i++) {
            if (i) jb_put(&b, d.u.s.p, d.u.s.n);
            jv_str_into(&b, attr.t == JV_NONE ? l->v[i] : attr_path(c, at, l->v[i], attr));
        }
        return mkstr(c, &b);
    }
    if (streq(name, "int")) {
        jv dflt = arg_get(A, 0, "default", jv_int(0));
        int64_t base = as_int(c, at, arg_get(A, 1, "base", jv_int(10)), "base");
        if (v.t == JV_INT) return v;
        if (v.t == JV_BOOL) return jv_int(v.u.i);
        if (v.t == JV_FLOAT) {
            if (!isfinite(v.u.f) || fabs(v.u.f) >= 9.2e18) return dflt;
            return jv_int((int64_t)v.u.f);
        }
        if (v.t == JV_STR) {
            int ok;
            jv r = parse_int_str(v.u.s, base, &ok);
            return ok ? r : dflt;
        }
        return dflt;
    }
    if (streq(name, "float")) {
        jv dflt = arg_get(A, 0, "default", jv_float(0.0));
        if (v.t == JV_FLOAT) return v;
        if (v.t == JV_INT || v.t == JV_BOOL) return jv_float((double)v.u.i);
        if (v.t == JV_STR) {
            jv st = str_strip(v.u.s, NULL, 3);
            char buf[128];
            if (st.u.s.n == 0 || st.u.s.n >= sizeof buf) return dflt;
            memcpy(buf, st.u.s.p, st.u.s.n);
            buf[st.u.s.n] = 0;
            char *end;
            double d = strtod(buf, &end);
            if (*end || (isalpha((unsigned char)buf[0]) && strcasecmp(buf, "inf") && strcasecmp(buf, "nan") && strcasecmp(buf, "infinity")))
                return dflt;
            if (strchr(buf, 'x') || strchr(buf, 'X')) return dflt; /* C accepts hex floats, Python does not */
            return jv_float(d);
        }
        return dflt;
    }
    if (streq(name, "abs")) {
        if (v.t == JV_INT || v.t == JV_BOOL) {
            if (v.u.i == INT64_MIN) fail(c, at, "integer overflow");
            return jv_int(v.u.i < 0 ? -v.u.i : v.u.i);
        }
        if (v.t == JV_FLOAT) return jv_float(fabs(v.u.f));
        if (v.t == JV_UNDEF) fail_undef(c, at, v);
        fail(c, at, "bad operand type for abs(): '%s'", tname(v));
    }
    if (streq(name, "round")) {
        int64_t prec = as_int(c, at, arg_get(A, 0, "precision", jv_int(0)), "precision");
        jv m = arg_get(A, 1, "method", jv_cstr("common"));
        if (m.t != JV_STR) fail(c, at, "method must be common, ceil or floor");
        jv r = round_value(c, at, v, prec, m.u.s);
        if (r.t == JV_INT && v.t == JV_FLOAT) r = jv_float((double)r.u.i);
        return r;
    }
    if (streq(name, "selectattr") || streq(name, "rejectattr")) return do_select(c, s, at, v, A, name.p[0] == 'r', 1);
    if (streq(name, "select") || streq(name, "reject")) return do_select(c, s, at, v, A, name.p[0] == 'r', 0);
    if (streq(name, "map")) {
        jlist *l = to_list(c, at, v);
        jv out = jv_list(c->a, l->n, 0);
        jv attr = arg_get(A, -1, "attribute", jv_undef());
        if (attr.t != JV_UNDEF) {
            jv dflt = arg_get(A, -1, "default", jv_undef());
            for (size_t i = 0; i < l->n; i++) {
                jv x = attr_path(c, at, l->v[i], attr);
                if (x.t == JV_UNDEF && dflt.t != JV_UNDEF) x = dflt;
                jl_push(c->a, out.u.l, x);
            }
            return out;
        }
        if (A->npos < 1 || A->pos[0].t != JV_STR) fail(c, at, "map requires a filter argument");
        jstr fname = A->pos[0].u.s;
        if (!is_filter_name(fname)) fail(c, at, "No filter named '%.*s'.", (int)fname.n, fname.p);
        args FA = {A->pos + 1, A->npos - 1, A->kwn, A->kwv, A->nkw};
        for (size_t i = 0; i < l->n; i++) jl_push(c->a, out.u.l, apply_filter(c, s, at, fname, l->v[i], &FA));
        return out;
    }
    if (streq(name, "unique")) {
        int cs = jv_truthy(arg_get(A, 0, "case_sensitive", jv_bool(0)));
        jv attr = arg_get(A, 1, "attribute", jv_none());
        jlist *l = to_list(c, at, v);
        jv out = jv_list(c->a, 0, 0);
        jv seen = jv_list(c->a, 0, 0);
        for (size_t i = 0; i < l->n; i++) {
            jv k = sort_key(c, attr.t == JV_NONE ? l->v[i] : attr_path(c, at, l->v[i], attr), cs);
            int dup = 0;
            for (size_t j = 0; j < seen.u.l->n && !dup; j++) dup = jv_equal(seen.u.l->v[j], k);
            if (!dup) {
                jl_push(c->a, seen.u.l, k);
                jl_push(c->a, out.u.l, l->v[i]);
            }
        }
        return out;
    }
    if (streq(name, "reverse")) {
        if (v.t == JV_STR) {
            jv args3[3] = {jv_none(), jv_none(), jv_int(-1)};
            return slice_value(c, at, v, args3[0], args3[1], args3[2]);
        }
        jlist *l = to_list(c, at, v);
        jv out = jv_list(c->a, l->n, 0);
        for (size_t i = l->n; i-- > 0;) jl_push(c->a, out.u.l, l->v[i]);
        return out;
    }
    if (streq(name, "sort")) {
        int rev = jv_truthy(arg_get(A, 0, "reverse", jv_bool(0)));
        int cs = jv_truthy(arg_get(A, 1, "case_sensitive", jv_bool(0)));
        jv attr = arg_get(A, 2, "attribute", jv_none());
        jlist *l = to_list(c, at, v);
        keyed *k = ja_alloc(c->a, (l->n ? l->n : 1) * sizeof(keyed));
        for (size_t i = 0; i < l->n; i++) {
            k[i].val = l->v[i];
            k[i].key = sort_key(c, attr.t == JV_NONE ? l->v[i] : attr_path(c, at, l->v[i], attr), cs);
            k[i].idx = i;
        }
        sort_keyed(c, at, k, l->n, rev);
        jv out = jv_list(c->a, l->n, 0);
        for (size_t i = 0; i < l->n; i++) jl_push(c->a, out.u.l, k[i].val);
        return out;
    }
    if (streq(name, "min") || streq(name, "max")) {
        int cs = jv_truthy(arg_get(A, 0, "case_sensitive", jv_bool(0)));
        jv attr = arg_get(A, 1, "attribute", jv_none());
        jlist *l = to_list(c, at, v);
        if (l->n == 0) return undef_msgf(c, "No aggregated item, sequence was empty.");
        size_t best = 0;
        jv bk = sort_key(c, attr.t == JV_NONE ? l->v[0] : attr_path(c, at, l->v[0], attr), cs);
        for (size_t i = 1; i < l->n; i++) {
            jv k = sort_key(c, attr.t == JV_NONE ? l->v[i] : attr_path(c, at, l->v[i], attr), cs);
            int r = cmp_values(c, at, k, bk, "<");
            if (name.p[1] == 'i' ? r < 0 : r > 0) {
                best = i;
                bk = k;
            }
        }
        return l->v[best];
    }
    if (streq(name, "sum")) {
        jv attr = arg_get(A, 0, "attribute", jv_none());
        jv acc = arg_get(A, 1, "start", jv_int(0));
        jlist *l = to_list(c, at, v);
        for (size_t i = 0; i < l->n; i++) acc = arith(c, at, '+', acc, attr.t == JV_NONE ? l->v[i] : attr_path(c, at, l->v[i], attr));
        return acc;
    }
    if (streq(name, "indent")) {
        jv w = arg_get(A, 0, "width", jv_int(4));
        int first = jv_truthy(arg_get(A, 1, "first", jv_bool(0)));
        int blank = jv_truthy(arg_get(A, 2, "blank", jv_bool(0)));
        jbuf ib;
        jb_init(&ib, c->a, 0);
        if (w.t == JV_STR)
            jb_put(&ib, w.u.s.p, w.u.s.n);
        else {
            int64_t k = as_int(c, at, w, "width");
            if (k > 1024) k = 1024;
            for (int64_t i = 0; i < k; i++) jb_putc(&ib, ' ');
        }
        jstr ind = jb_str(&ib);
        jbuf sb;
        jb_init(&sb, c->a, 0);
        jv_str_into(&sb, v);
        jb_putc(&sb, '\n');
        jstr text = jb_str(&sb);
        jmethod m = {jv_str(text.p, text.n), {"splitlines", 10}};
        args none = {0};
        jlist *lines = call_method(c, at, &m, &none).u.l;
        jbuf b;
        jb_init(&b, c->a, c->lim->max_output);
        if (first) jb_put(&b, ind.p, ind.n);
        for (size_t i = 0; i < lines->n; i++) {
            jstr ln = lines->v[i].u.s;
            if (i) {
                jb_putc(&b, '\n');
                if (blank || ln.n) jb_put(&b, ind.p, ind.n);
            }
            jb_put(&b, ln.p, ln.n);
        }
        return mkstr(c, &b);
    }
    if (streq(name, "e") || streq(name, "escape") || streq(name, "forceescape")) {
        jstr x = str_of(c, v).u.s;
        jbuf b;
        jb_init(&b, c->a, 0);
        for (size_t i = 0; i < x.n; i++) {
            switch (x.p[i]) {
            case '&': jb_puts(&b, "&amp;"); break;
            case '<': jb_puts(&b, "&lt;"); break;
            case '>': jb_puts(&b, "&gt;"); break;
            case '"': jb_puts(&b, "&#34;"); break;
            case '\'': jb_puts(&b, "&#39;"); break;
            default: jb_putc(&b, x.p[i]);
            }
        }
        return mkstr(c, &b);
    }
    if (streq(name, "wordcount")) {
        jstr x = str_of(c, v).u.s;
        int64_t k = 0;
        int in_word = 0;
        for (size_t i = 0; i < x.n;) {
            size_t adv;
            uint32_t cp = u8_decode(x.p + i, x.n - i, &adv);
            int w = cp == '_' || u_isalnum(cp);
            if (w && !in_word) k++;
            in_word = w;
            i += adv;
        }
        return jv_int(k);
    }
    if (streq(name, "batch")) {
        int64_t n = as_int(c, at, arg_get(A, 0, "linecount", jv_undef()), "linecount");
        jv fill = arg_get(A, 1, "fill_with", jv_none());
        if (n <= 0) fail(c, at, "batch size must be positive");
        jlist *l = to_list(c, at, v);
        jv out = jv_list(c->a, 0, 0);
        jv cur = jv_undef();
        for (size_t i = 0; i < l->n; i++) {
            if (cur.t == JV_UNDEF || (int64_t)cur.u.l->n == n) {
                cur = jv_list(c->a, (size_t)(n < 64 ? n : 64), 0);
                jl_push(c->a, out.u.l, cur);
            }
            jl_push(c->a, cur.u.l, l->v[i]);
        }
        if (cur.t != JV_UNDEF && fill.t != JV_NONE)
            while ((int64_t)cur.u.l->n < n) jl_push(c->a, cur.u.l, fill);
        return out;
    }
    if (streq(name, "center")) {
        jmethod m = {str_of(c, v), {"center", 6}};
        jv w = arg_get(A, 0, "width", jv_int(80));
        args CA = {&w, 1, NULL, NULL, 0};
        return call_method(c, at, &m, &CA);
    }
    if (streq(name, "format")) {
        jv t = jv_list(c->a, (size_t)A->npos, 1);
        for (int i = 0; i < A->npos; i++) jl_push(c->a, t.u.l, A->pos[i]);
        return percent_format(c, at, str_of(c, v).u.s, t);
    }
    if (streq(name, "attr")) {
        jv nm = arg_get(A, 0, "name", jv_undef());
        if (nm.t != JV_STR) fail(c, at, "attr name must be a string");
        return get_attr(c, at, v, nm.u.s);
    }
    fail(c, at, "No filter named '%.*s'.", (int)name.n, name.p);
}

static const char *const filter_names[] = {"length", "count", "safe", "default", "d", "string", "upper", "lower",
                                           "trim", "capitalize", "title", "replace", "tojson", "items", "dictsort",
                                           "list", "first", "last", "join", "int", "float", "abs", "round",
                                           "selectattr", "rejectattr", "select", "reject", "map", "unique",
                                           "reverse", "sort", "min", "max", "sum", "indent", "e", "escape",
                                           "forceescape", "wordcount", "batch", "center", "attr", "format", NULL};
static const char *const test_names[] = {"defined", "undefined", "none", "string", "number", "integer", "float",
                                         "mapping", "sequence", "iterable", "boolean", "true", "false", "odd",
                                         "even", "divisibleby", "equalto", "eq", "==", "ne", "!=", "lt", "<", "le",
                                         "<=", "gt", ">", "ge", ">=", "sameas", "in", "lower", "upper", "callable",
                                         "escaped", "filter", "test", "greaterthan", "lessthan", NULL};

static int is_filter_name(jstr n) { return in_names(n, filter_names); }
int jinja_filter_known(const char *p, size_t n) { return in_names((jstr){p, n}, filter_names); }
int jinja_test_known(const char *p, size_t n) { return in_names((jstr){p, n}, test_names); }

/* ---- tests ---- */
static int apply_test(ctx *c, scope *s, const node *at, jstr name, jv v, args *A) {
    (void)s;
    jv a0 = arg_get(A, 0, "", jv_undef());
    if (streq(name, "defined")) return v.t != JV_UNDEF;
    if (streq(name, "undefined")) return v.t == JV_UNDEF;
    if (streq(name, "none")) return v.t == JV_NONE;
    if (streq(name, "string")) return v.t == JV_STR;
    if (streq(name, "number")) return jv_is_num(v);
    if (streq(name, "integer")) return v.t == JV_INT;
    if (streq(name, "float")) return v.t == JV_FLOAT;
    if (streq(name, "boolean")) return v.t == JV_BOOL;
    if (streq(name, "true")) return v.t == JV_BOOL && v.u.i;
    if (streq(name, "false")) return v.t == JV_BOOL && !v.u.i;
    if (streq(name, "mapping")) return v.t == JV_DICT;
    if (streq(name, "sequence")) return v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT;
    if (streq(name, "iterable")) return v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT || v.t == JV_UNDEF;
    if (streq(name, "callable")) return v.t == JV_MACRO || v.t == JV_FUNC || v.t == JV_METHOD;
    if (streq(name, "escaped")) return 0;
    if (streq(name, "odd") || streq(name, "even")) {
        int64_t i = as_int(c, at, v, name.p);
        return (int)(((i % 2) + 2) % 2) == (name.p[0] == 'o');
    }
    if (streq(name, "divisibleby")) {
        int64_t d = as_int(c, at, a0, "divisibleby");
        if (d == 0) fail(c, at, "integer division or modulo by zero");
        if (v.t == JV_FLOAT) return fmod(v.u.f, (double)d) == 0;
        int64_t i = as_int(c, at, v, "divisibleby");
        return d == -1 || i % d == 0;
    }
    if (streq(name, "equalto") || streq(name, "eq") || streq(name, "==")) return jv_equal(v, a0);
    if (streq(name, "ne") || streq(name, "!=")) return !jv_equal(v, a0);
    if (streq(name, "lt") || streq(name, "<") || streq(name, "lessthan")) return cmp_values(c, at, v, a0, "<") < 0;
    if (streq(name, "le") || streq(name, "<=")) return cmp_values(c, at, v, a0, "<=") <= 0;
    if (streq(name, "gt") || streq(name, ">") || streq(name, "greaterthan")) return cmp_values(c, at, v, a0, ">") > 0;
    if (streq(name, "ge") || streq(name, ">=")) return cmp_values(c, at, v, a0, ">=") >= 0;
    if (streq(name, "sameas")) {
        /* Python identity: singletons and small ints compare by value; containers by storage */
        if (v.t != a0.t) return 0;
        switch (v.t) {
        case JV_NONE:
        case JV_UNDEF: return 1;
        case JV_BOOL: return v.u.i == a0.u.i;
        case JV_INT: return v.u.i == a0.u.i && v.u.i >= -5 && v.u.i <= 256;
        case JV_STR: return v.u.s.p == a0.u.s.p && v.u.s.n == a0.u.s.n;
        case JV_LIST: return v.u.l == a0.u.l;
        case JV_DICT:
        case JV_NS: return v.u.d == a0.u.d;
        default: return jv_equal(v, a0);
        }
    }
    if (streq(name, "in")) return contains(c, at, v, a0);
    if (streq(name, "lower") || streq(name, "upper")) {
        jstr x = str_of(c, v).u.s;
        jmethod m = {jv_str(x.p, x.n), {name.p[0] == 'l' ? "islower" : "isupper", 7}};
        args none = {0};
        return jv_truthy(call_method(c, at, &m, &none));
    }
    if (streq(name, "filter")) return v.t == JV_STR && is_filter_name(v.u.s);
    if (streq(name, "test")) return v.t == JV_STR && in_names(v.u.s, test_names);
    fail(c, at, "No test named '%.*s'.", (int)name.n, name.p);
}

/* ---- expressions ---- */
static jv eval(ctx *c, scope *s, const node *x) {
    enter(c, x);
    jv r;
    switch (x->kind) {
    case N_CONST: r = x->val; break;
    case N_NAME: r = lookup(c, s, x->name); break;
    case N_LIST:
    case N_TUPLE:
        r = jv_list(c->a, (size_t)x->n, x->kind == N_TUPLE);
        for (int i = 0; i < x->n; i++) jl_push(c->a, r.u.l, eval(c, s, x->items[i]));
        break;
    case N_DICT:
        r = jv_dict(c->a, (size_t)x->n / 2);
        for (int i = 0; i + 1 < x->n; i += 2) {
            jv k = eval(c, s, x->items[i]);
            if (k.t == JV_LIST && !k.u.l->tuple) fail(c, x->items[i], "unhashable type: 'list'");
            if (k.t == JV_DICT) fail(c, x->items[i], "unhashable type: 'dict'");
            jd_set(c->a, r.u.d, k, eval(c, s, x->items[i + 1]));
        }
        break;
    case N_GETATTR: r = get_attr(c, x, eval(c, s, x->a), x->name); break;
    case N_GETITEM: {
        jv obj = eval(c, s, x->a);
        if (x->b->kind == N_SLICE) {
            if (obj.t == JV_UNDEF) fail_undef(c, x, obj);
            const node *sl = x->b;
            jv a = sl->a ? eval(c, s, sl->a) : jv_none(), b = sl->b ? eval(c, s, sl->b) : jv_none(),
               cc = sl->c ? eval(c, s, sl->c) : jv_none();
            r = slice_value(c, x, obj, a, b, cc);
        } else {
            r = get_item(c, x, obj, eval(c, s, x->b));
        }
        break;
    }
    case N_SLICE: fail(c, x, "slice outside of subscript");
    case N_CALL: {
        jv callee = eval(c, s, x->a);
        args A;
        eval_args(c, s, x, &A);
        r = call_value(c, x, callee, &A, jv_undef());
        break;
    }
    case N_FILTER: {
        jv v = eval(c, s, x->a);
        args A;
        eval_args(c, s, x, &A);
        r = apply_filter(c, s, x, x->name, v, &A);
        break;
    }
    case N_TEST: {
        jv v = eval(c, s, x->a);
        args A;
        eval_args(c, s, x, &A);
        r = jv_bool(apply_test(c, s, x, x->name, v, &A));
        break;
    }
    case N_NEG:
    case N_POS: {
        jv v = eval(c, s, x->a);
        if (v.t == JV_UNDEF) fail_undef(c, x, v);
        if (v.t == JV_INT || v.t == JV_BOOL) {
            if (x->kind == N_NEG && v.u.i == INT64_MIN) fail(c, x, "integer overflow");
            r = jv_int(x->kind == N_NEG ? -v.u.i : v.u.i);
        } else if (v.t == JV_FLOAT) {
            r = jv_float(x->kind == N_NEG ? -v.u.f : v.u.f);
        } else {
            fail(c, x, "bad operand type for unary %c: '%s'", x->kind == N_NEG ? '-' : '+', tname(v));
        }
        break;
    }
    case N_NOT: r = jv_bool(!jv_truthy(eval(c, s, x->a))); break;
    case N_BINOP: {
        jv a = eval(c, s, x->a), b = eval(c, s, x->b);
        if (x->op == '~') {
            jbuf buf;
            jb_init(&buf, c->a, c->lim->max_output);
            jv_str_into(&buf, a);
            jv_str_into(&buf, b);
            r = mkstr(c, &buf);
        } else {
            r = arith(c, x, x->op, a, b);
        }
        break;
    }
    case N_COMPARE: {
        jv left = eval(c, s, x->a);
        r = jv_bool(1);
        for (int i = 0; i < x->n; i++) {
            jv right = eval(c, s, x->items[i]);
            int ok;
            switch (x->ops[i]) {
            case CMP_EQ: ok = jv_equal(left, right); break;
            case CMP_NE: ok = !jv_equal(left, right); break;
            case CMP_LT: ok = cmp_values(c, x, left, right, "<") < 0; break;
            case CMP_LE: ok = cmp_values(c, x, left, right, "<=") <= 0; break;
            case CMP_GT: ok = cmp_values(c, x, left, right, ">") > 0; break;
            case CMP_GE: ok = cmp_values(c, x, left, right, ">=") >= 0; break;
            case CMP_IN: ok = contains(c, x, left, right); break;
            default: ok = !contains(c, x, left, right); break;
            }
            if (!ok) {
                r = jv_bool(0);
                break;
            }
            left = right;
        }
        break;
    }
    case N_AND: {
        jv a = eval(c, s, x->a);
        r = jv_truthy(a) ? eval(c, s, x->b) : a;
        break;
    }
    case N_OR: {
        jv a = eval(c, s, x->a);
        r = jv_truthy(a) ? a : eval(c, s, x->b);
        break;
    }
    case N_CONDEXPR:
        if (jv_truthy(eval(c, s, x->b)))
            r = eval(c, s, x->a);
        else
            r = x->c ? eval(c, s, x->c) : undef_msgf(c, "the inline if-expression on line %d evaluated to false and no else section was defined.", x->line);
        break;
    default: fail(c, x, "not an expression");
    }
    leave(c);
    return r;
}

/* ---- statements ---- */
static void assign(ctx *c, scope *s, const node *target, jv v) {
    if (target->kind == N_NAME) {
        scope_set(c, s, target->name, v);
        return;
    }
    if (target->kind == N_NSREF) {
        jv ns = lookup(c, s, target->name);
        if (ns.t != JV_NS) fail(c, target, "cannot assign attribute on non-namespace object");
        jd_set(c->a, ns.u.d, jv_str(target->attr.p, target->attr.n), v);
        return;
    }
    /* tuple unpacking */
    jlist *l = to_list(c, target, v);
    if ((int)l->n != target->n || l->n != (size_t)target->n) {
        if (l->n > (size_t)target->n) fail(c, target, "too many values to unpack (expected %d)", target->n);
        fail(c, target, "not enough values to unpack (expected %d, got %zu)", target->n, l->n);
    }
    for (int i = 0; i < target->n; i++) assign(c, s, target->items[i], l->v[i]);
}

static jv apply_filter_chain(ctx *c, scope *s, const node *f, jv input) {
    if (!f) return input;
    jv v = apply_filter_chain(c, s, f->a, input);
    args A;
    eval_args(c, s, f, &A);
    return apply_filter(c, s, f, f->name, v, &A);
}

static void exec_stmt(ctx *c, scope *s, const node *x);

static void exec_body(ctx *c, scope *s, node *const *items, int n) {
    for (int i = 0; i < n && !c->brk; i++) exec_stmt(c, s, items[i]);
}

static jv make_macro(ctx *c, scope *s, const node *def) {
    jv m = jv_undef();
    m.t = JV_MACRO;
    m.u.m = ja_alloc(c->a, sizeof(jmacro));
    m.u.m->def = def;
    m.u.m->closure = s;
    node body = {0};
    body.items = def->items;
    body.n = def->n;
    m.u.m->uses_varargs = names_used(&body, "varargs");
    m.u.m->uses_kwargs = names_used(&body, "kwargs");
    m.u.m->uses_caller = names_used(&body, "caller");
    return m;
}

static void exec_for(ctx *c, scope *s, const node *x) {
    jv it = eval(c, s, x->b);
    jlist *items = to_list(c, x->b, it);
    if (x->c) {
        /* `for a in b if cond`: filter first, so loop.length/last count only kept items */
        jv kept = jv_list(c->a, items->n, 0);
        for (size_t i = 0; i < items->n; i++) {
            count_iter(c, x);
            scope *fs = scope_new(c, s);
            assign(c, fs, x->a, items->v[i]);
            if (jv_truthy(eval(c, fs, x->c))) jl_push(c->a, kept.u.l, items->v[i]);
        }
        items = kept.u.l;
    }
    if (items->n == 0) {
        if (x->n2) exec_body(c, scope_new(c, s), x->items2, x->n2);
        return;
    }
    jloop *lp = ja_alloc(c->a, sizeof(jloop));
    lp->items = items;
    jv lv = jv_undef();
    lv.t = JV_LOOP;
    lv.u.lp = lp;
    for (size_t i = 0; i < items->n; i++) {
        count_iter(c, x);
        lp->idx = i;
        scope *is = scope_new(c, s);
        scope_set(c, is, (jstr){"loop", 4}, lv);
        assign(c, is, x->a, items->v[i]);
        exec_body(c, is, x->items, x->n);
        if (c->brk == 1) {
            c->brk = 0;
            break;
        }
        c->brk = 0;
    }
}

static void exec_stmt(ctx *c, scope *s, const node *x) {
    enter(c, x);
    switch (x->kind) {
    case S_DATA: jb_put(c->out, x->val.u.s.p, x->val.u.s.n); break;
    case S_OUTPUT: jv_str_into(c->out, eval(c, s, x->a)); break;
    case S_IF:
        for (const node *b = x; b; b = b->c) {
            if (!b->a || jv_truthy(eval(c, s, b->a))) {
                exec_body(c, s, b->items, b->n);
                break;
            }
        }
        break;
    case S_FOR: exec_for(c, s, x); break;
    case S_SET: assign(c, s, x->a, eval(c, s, x->b)); break;
    case S_SETBLOCK: {
        jv v = capture(c, scope_new(c, s), x->items, x->n);
        assign(c, s, x->a, apply_filter_chain(c, s, x->b, v));
        break;
    }
    case S_MACRO: scope_set(c, s, x->name, make_macro(c, s, x)); break;
    case S_CALLBLOCK: {
        const node *call = x->a;
        jv callee = eval(c, s, call->a);
        args A;
        eval_args(c, s, call, &A);
        jv caller = make_macro(c, s, x);
        jv out = call_value(c, call, callee, &A, caller);
        jv_str_into(c->out, out);
        break;
    }
    case S_FILTERBLOCK: {
        jv v = capture(c, scope_new(c, s), x->items, x->n);
        jv_str_into(c->out, apply_filter_chain(c, s, x->b, v));
        break;
    }
    case S_WITH: {
        scope *ws = scope_new(c, s);
        for (int i = 0; i < x->n2; i++) assign(c, ws, x->items2[i]->a, eval(c, s, x->items2[i]->b));
        exec_body(c, ws, x->items, x->n);
        break;
    }
    case S_SCOPE: exec_body(c, scope_new(c, s), x->items, x->n); break;
    case S_BREAK: c->brk = 1; break;
    case S_CONTINUE: c->brk = 2; break;
    default: fail(c, x, "not a statement");
    }
    leave(c);
}

int jinja_render(const jtemplate *t, jarena *arena, jv globals, const jlimits *lim, int64_t now, char **out,
                 size_t *outlen, char *err, size_t errlen) {
    ctx c;
    memset(&c, 0, sizeof c);
    c.a = arena;
    c.lim = lim;
    c.globals = globals;
    c.now = now;
    c.err = err;
    c.errlen = errlen;
    c.code = CINFER_EINVAL;
    jmp_buf *saved_fail = arena->fail;
    arena->fail = &c.jb;
    arena->err = err;
    arena->errlen = errlen;
    if (setjmp(c.jb)) {
        arena->fail = saved_fail;
        /* limit errors from the arena/buffers set ERANGE in err; keep the code they chose */
        if (c.code == CINFER_EINVAL && err && strstr(err, "limit exceeded")) return CINFER_ERANGE;
        return c.code;
    }
    jbuf b;
    jb_init(&b, arena, lim->max_output);
    c.out = &b;
    c.root = scope_new(&c, NULL);
    exec_body(&c, c.root, t->body, t->n);
    jb_putc(&b, 0);
    *out = b.p;
    *outlen = b.n - 1;
    arena->fail = saved_fail;
    return 0;
}

/* jinja_parse.c — template source to AST: the lexer (Jinja2's, with trim_blocks and lstrip_blocks on as
 * transformers configures them, `-`/`+` whitespace control, comments, raw blocks) and a recursive-descent
 * parser that follows jinja2/parser.py's precedence exactly (filters and tests bind to the unary operand, `**`
 * is left-associative, `is` takes one bare argument), because chat templates depend on those quirks.
 * Every error is "line:col: message"; nesting is bounded so hostile input cannot exhaust the stack. */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok/jinja.h"
#include "util/err.h"

#define MAX_NEST 200

typedef enum {
    T_EOF,
    T_DATA,
    T_VAR_BEGIN,
    T_VAR_END,
    T_BLOCK_BEGIN,
    T_BLOCK_END,
    T_NAME,
    T_STRING,
    T_INT,
    T_FLOAT,
    T_OP,
} tok_type;

typedef struct tok {
    int type;
    size_t off;  /* offset in the normalised source, for line:col */
    jstr s;      /* T_DATA, T_NAME, T_STRING (unescaped), T_OP (the operator text) */
    int64_t i;
    double f;
} tok;

typedef struct parser {
    jarena *a;
    const char *src; /* newline-normalised source */
    size_t len;
    tok *toks;
    size_t ntok, cap, pos;
    int depth;
    size_t w_off; /* where(): the last position resolved */
    int w_line, w_col;
    char *err;
    size_t errlen;
    jmp_buf jb;
} parser;

static void where(parser *p, size_t off, int *line, int *col) {
    /* nodes are made in source order, so resume from the last position asked for */
    int l = 1, c = 1;
    size_t i = 0;
    if (off >= p->w_off) {
        i = p->w_off;
        l = p->w_line;
        c = p->w_col;
    }
    for (; i < off && i < p->len; i++) {
        if (p->src[i] == '\n') {
            l++;
            c = 1;
        } else if (((unsigned char)p->src[i] & 0xc0) != 0x80) {
            c++;
        }
    }
    p->w_off = i;
    p->w_line = l;
    p->w_col = c;
    *line = l;
    *col = c;
}

__attribute__((format(printf, 3, 4), noreturn)) static void fail_at(parser *p, size_t off, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line, col;
    where(p, off, &line, &col);
    ci_err(p->err, p->errlen, CINFER_EFORMAT, "%d:%d: %s", line, col, msg);
    longjmp(p->jb, 1);
}

static void push_tok(parser *p, tok t) {
    if (p->ntok == p->cap) {
        size_t nc = p->cap ? p->cap * 2 : 256;
        tok *n = ja_alloc(p->a, nc * sizeof(tok));
        if (p->ntok) memcpy(n, p->toks, p->ntok * sizeof(tok));
        p->toks = n;
        p->cap = nc;
    }
    p->toks[p->ntok++] = t;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
static int is_name_start(unsigned char c) { return isalpha(c) || c == '_' || c >= 0x80; }
static int is_name_char(unsigned char c) { return isalnum(c) || c == '_' || c >= 0x80; }

/* ---- string literals: Python's unicode-escape, as jinja's lexer applies it ---- */
static jstr unescape(parser *p, size_t off, const char *s, size_t n) {
    jbuf b;
    jb_init(&b, p->a, 0);
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c != '\\' || i + 1 >= n) {
            jb_putc(&b, c);
            continue;
        }
        char e = s[++i];
        switch (e) {
        case '\n': break; /* line continuation */
        case '\\': jb_putc(&b, '\\'); break;
        case '\'': jb_putc(&b, '\''); break;
        case '"': jb_putc(&b, '"'); break;
        case 'a': jb_putc(&b, '\a'); break;
        case 'b': jb_putc(&b, '\b'); break;
        case 'f': jb_putc(&b, '\f'); break;
        case 'n': jb_putc(&b, '\n'); break;
        case 'r': jb_putc(&b, '\r'); break;
        case 't': jb_putc(&b, '\t'); break;
        case 'v': jb_putc(&b, '\v'); break;
        case 'x':
        case 'u':
        case 'U': {
            int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t cp = 0;
            for (int k = 0; k < nd; k++) {
                if (i + 1 + (size_t)k >= n || !isxdigit((unsigned char)s[i + 1 + k]))
                    fail_at(p, off, "invalid \\%c escape in string", e);
                char h = s[i + 1 + k];
                cp = cp * 16 + (uint32_t)(isdigit((unsigned char)h) ? h - '0' : (tolower((unsigned char)h) - 'a' + 10));
            }
            i += (size_t)nd;
            if (cp > 0x10ffff) fail_at(p, off, "invalid \\U escape in string");
            u8_encode(&b, cp);
            break;
        }
        default:
            if (e >= '0' && e <= '7') {
                uint32_t cp = (uint32_t)(e - '0');
                for (int k = 0; k < 2 && i + 1 < n && s[i + 1] >= '0' && s[i + 1] <= '7'; k++) cp = cp * 8 + (uint32_t)(s[++i] - '0');
                u8_encode(&b, cp);
            } else {
                /* unknown escapes stay as written, like Python */
                jb_putc(&b, '\\');
                jb_putc(&b, e);
            }
        }
    }
    jstr r = jb_str(&b);
    r.p = ja_strdup(p->a, r.p, r.n);
    return r;
}

/* Lexes the inside of {{ }} or {% %} from *pos; stops after the end marker. Returns the offset where the
 * text after the tag starts (with -%} / trim_blocks applied). */
static size_t lex_tag(parser *p, size_t i, int is_block, int *ends_nl) {
    const char *s = p->src;
    size_t n = p->len;
    int bal = 0;
    size_t tag_start = i;
    for (;;) {
        while (i < n && is_ws(s[i])) i++;
        if (i >= n) fail_at(p, tag_start, is_block ? "unexpected end of template, expected '%%}'" : "unexpected end of template, expected '}}'");
        char ec = is_block ? '%' : '}';
        if (bal == 0) {
            /* end markers: "+%}" (block only), "-%}\s*", "%}\n?" (trim_blocks), "-}}\s*", "}}" */
            if (is_block && s[i] == '+' && i + 2 < n + 0 && s[i + 1] == '%' && s[i + 2] == '}') {
                push_tok(p, (tok){.type = T_BLOCK_END, .off = i});
                *ends_nl = 0;
                return i + 3;
            }
            if (s[i] == '-' && i + 2 < n && s[i + 1] == ec && s[i + 2] == '}') {
                push_tok(p, (tok){.type = is_block ? T_BLOCK_END : T_VAR_END, .off = i});
                size_t j = i + 3;
                while (j < n && is_ws(s[j])) j++;
                *ends_nl = j > i + 3 && s[j - 1] == '\n';
                return j;
            }
            if (s[i] == ec && i + 1 < n && s[i + 1] == '}') {
                push_tok(p, (tok){.type = is_block ? T_BLOCK_END : T_VAR_END, .off = i});
                size_t j = i + 2;
                *ends_nl = 0;
                if (is_block && j < n && s[j] == '\n') {
                    j++;
                    *ends_nl = 1;
                }
                return j;
            }
        }
        unsigned char c = (unsigned char)s[i];
        size_t st = i;
        /* float: (\d+_)*\d+((\.(\d+_)*\d+)?e[+-]?(\d+_)*\d+|\.(\d+_)*\d+), not right after a '.' */
        if (isdigit(c)) {
            size_t j = i;
            while (j < n && (isdigit((unsigned char)s[j]) || (s[j] == '_' && j + 1 < n && isdigit((unsigned char)s[j + 1])))) j++;
            size_t k = j;
            int is_float = 0;
            if (!(st > 0 && s[st - 1] == '.')) {
                if (k + 1 < n && s[k] == '.' && isdigit((unsigned char)s[k + 1])) {
                    k++;
                    while (k < n && (isdigit((unsigned char)s[k]) || (s[k] == '_' && k + 1 < n && isdigit((unsigned char)s[k + 1])))) k++;
                    is_float = 1;
                }
                if (k < n && (s[k] == 'e' || s[k] == 'E')) {
                    size_t m = k + 1;
                    if (m < n && (s[m] == '+' || s[m] == '-')) m++;
                    if (m < n && isdigit((unsigned char)s[m])) {
                        while (m < n && (isdigit((unsigned char)s[m]) || (s[m] == '_' && m + 1 < n && isdigit((unsigned char)s[m + 1])))) m++;
                        k = m;
                        is_float = 1;
                    }
                }
            }
            char num[128];
            size_t nn = 0;
            size_t end = is_float ? k : j;
            /* integers: 0x / 0o / 0b prefixes */
            if (!is_float && c == '0' && j == i + 1 && i + 2 < n && strchr("xXoObB", s[i + 1])) {
                int base = (s[i + 1] == 'x' || s[i + 1] == 'X') ? 16 : (s[i + 1] == 'o' || s[i + 1] == 'O') ? 8 : 2;
                size_t m = i + 2;
                uint64_t v = 0;
                int any = 0;
                while (m < n) {
                    char h = s[m];
                    int d = isdigit((unsigned char)h) ? h - '0' : isxdigit((unsigned char)h) ? tolower((unsigned char)h) - 'a' + 10 : h == '_' ? -2 : -1;
                    if (d == -2) {
                        m++;
                        continue;
                    }
                    if (d < 0 || d >= base) break;
                    if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base || v * (uint64_t)base + (uint64_t)d > (uint64_t)INT64_MAX)
                        fail_at(p, st, "integer literal too large");
                    v = v * (uint64_t)base + (uint64_t)d;
                    any = 1;
                    m++;
                }
                if (!any) fail_at(p, st, "invalid integer literal");
                push_tok(p, (tok){.type = T_INT, .off = st, .i = (int64_t)v});
                i = m;
                continue;
            }
            for (size_t q = i; q < end; q++)
                if (s[q] != '_') {
                    if (nn + 1 >= sizeof num) fail_at(p, st, "number literal too long");
                    num[nn++] = s[q];
                }
            num[nn] = 0;
            if (is_float) {
                push_tok(p, (tok){.type = T_FLOAT, .off = st, .f = strtod(num, NULL)});
            } else {
                if (nn > 19 || (nn == 19 && strcmp(num, "9223372036854775807") > 0)) fail_at(p, st, "integer literal too large");
                push_tok(p, (tok){.type = T_INT, .off = st, .i = strtoll(num, NULL, 10)});
            }
            i = end;
            continue;
        }
        if (is_name_start(c)) {
            size_t j = i;
            while (j < n && is_name_char((unsigned char)s[j])) j++;
            push_tok(p, (tok){.type = T_NAME, .off = st, .s = {s + i, j - i}});
            i = j;
            continue;
        }
        if (c == '\'' || c == '"') {
            size_t j = i + 1;
            while (j < n && s[j] != (char)c) {
                if (s[j] == '\\') j++;
                j++;
            }
            if (j >= n) fail_at(p, st, "unexpected end of string");
            push_tok(p, (tok){.type = T_STRING, .off = st, .s = unescape(p, st, s + i + 1, j - i - 1)});
            i = j + 1;
            continue;
        }
        static const char *ops2[] = {"//", "**", "==", "!=", ">=", "<="};
        size_t ol = 0;
        for (size_t k = 0; k < sizeof ops2 / sizeof ops2[0]; k++)
            if (i + 1 < n && s[i] == ops2[k][0] && s[i + 1] == ops2[k][1]) ol = 2;
        if (!ol && strchr("+-/*%~[](){}><=.:|,;", c) && c) ol = 1;
        if (!ol) fail_at(p, st, "unexpected char '%c'", c);
        if (ol == 1) {
            if (c == '(' || c == '[' || c == '{') bal++;
            if (c == ')' || c == ']' || c == '}') {
                if (bal == 0) fail_at(p, st, "unexpected '%c'", c);
                bal--;
            }
        }
        push_tok(p, (tok){.type = T_OP, .off = st, .s = {s + i, ol}});
        i += ol;
    }
}

static int at(const char *s, size_t n, size_t i, const char *lit) {
    size_t l = strlen(lit);
    return i + l <= n && !memcmp(s + i, lit, l);
}

/* Splits the source into data and tags. Mirrors jinja2.lexer.Lexer.tokeniter with trim_blocks=True and
 * lstrip_blocks=True. */
static void lex(parser *p) {
    const char *s = p->src;
    size_t n = p->len, i = 0;
    int line_starting = 1;
    while (i < n) {
        /* next tag opener */
        size_t q = i;
        int kind = 0; /* 1 var, 2 block, 3 comment */
        while (q + 1 < n) {
            if (s[q] == '{' && (s[q + 1] == '{' || s[q + 1] == '%' || s[q + 1] == '#')) {
                kind = s[q + 1] == '{' ? 1 : s[q + 1] == '%' ? 2 : 3;
                break;
            }
            q++;
        }
        if (!kind) {
            push_tok(p, (tok){.type = T_DATA, .off = i, .s = {s + i, n - i}});
            return;
        }
        char sign = q + 2 < n && (s[q + 2] == '-' || s[q + 2] == '+') ? s[q + 2] : 0;
        size_t tlen = q - i; /* data before the tag */
        if (sign == '-') {
            while (tlen > 0 && is_ws(s[i + tlen - 1])) tlen--;
        } else if (sign != '+' && kind != 1) {
            /* lstrip_blocks: drop spaces between the line start and the tag */
            size_t l = tlen;
            while (l > 0 && s[i + l - 1] != '\n') l--;
            if (l > 0 || line_starting) {
                int all_ws = tlen > l;
                for (size_t k = l; k < tlen; k++)
                    if (!is_ws(s[i + k])) all_ws = 0;
                if (all_ws) tlen = l;
            }
        }
        if (tlen) push_tok(p, (tok){.type = T_DATA, .off = i, .s = {s + i, tlen}});
        size_t body = q + 2 + (sign ? 1 : 0);
        int ends_nl = 0;
        if (kind == 3) {
            /* comment: up to the first "#}", checking the char before it for - or + */
            size_t j = body;
            while (j + 1 < n && !(s[j] == '#' && s[j + 1] == '}')) j++;
            if (j + 1 >= n) fail_at(p, q, "missing end of comment tag");
            size_t after = j + 2;
            if (j > body && s[j - 1] == '-') {
                while (after < n && is_ws(s[after])) after++;
                ends_nl = after > j + 2 && s[after - 1] == '\n';
            } else if (j > body && s[j - 1] == '+') {
            } else if (after < n && s[after] == '\n') {
                after++;
                ends_nl = 1;
            }
            i = after;
            line_starting = ends_nl;
            continue;
        }
        if (kind == 2) {
            /* raw block: {% raw %} ... {% endraw %} */
            size_t j = body;
            while (j < n && is_ws(s[j])) j++;
            if (at(s, n, j, "raw") && !(j + 3 < n && is_name_char((unsigned char)s[j + 3]))) {
                size_t k = j + 3;
                while (k < n && is_ws(s[k])) k++;
                size_t content;
                if (at(s, n, k, "-%}")) {
                    content = k + 3;
                    while (content < n && is_ws(s[content])) content++;
                } else if (at(s, n, k, "%}")) {
                    content = k + 2;
                } else {
                    goto normal_block;
                }
                /* find {%[-+]? endraw [-+]?%} */
                size_t m = content;
                for (;;) {
                    if (m + 1 >= n) fail_at(p, q, "missing end of raw directive");
                    if (s[m] == '{' && s[m + 1] == '%') {
                        size_t e = m + 2;
                        char esign = e < n && (s[e] == '-' || s[e] == '+') ? s[e] : 0;
                        if (esign) e++;
                        while (e < n && is_ws(s[e])) e++;
                        if (at(s, n, e, "endraw")) {
                            e += 6;
                            while (e < n && is_ws(s[e])) e++;
                            size_t after;
                            int enl = 0;
                            if (at(s, n, e, "+%}")) {
                                after = e + 3;
                            } else if (at(s, n, e, "-%}")) {
                                after = e + 3;
                                while (after < n && is_ws(s[after])) after++;
                                enl = after > e + 3 && s[after - 1] == '\n';
                            } else if (at(s, n, e, "%}")) {
                                after = e + 2;
                                if (after < n && s[after] == '\n') {
                                    after++;
                                    enl = 1;
                                }
                            } else {
                                m++;
                                continue;
                            }
                            size_t clen = m - content;
                            if (esign == '-') {
                                while (clen > 0 && is_ws(s[content + clen - 1])) clen--;
                            } else if (esign != '+') {
                                size_t l = clen;
                                while (l > 0 && s[content + l - 1] != '\n') l--;
                                if (l > 0) {
                                    int all_ws = clen > l;
                                    for (size_t z = l; z < clen; z++)
                                        if (!is_ws(s[content + z])) all_ws = 0;
                                    if (all_ws) clen = l;
                                }
                            }
                            if (clen) push_tok(p, (tok){.type = T_DATA, .off = content, .s = {s + content, clen}});
                            i = after;
                            line_starting = enl;
                            break;
                        }
                    }
                    m++;
                }
                continue;
            }
        }
    normal_block:
        push_tok(p, (tok){.type = kind == 1 ? T_VAR_BEGIN : T_BLOCK_BEGIN, .off = q});
        i = lex_tag(p, body, kind == 2, &ends_nl);
        line_starting = ends_nl;
    }
}

/* ---- parser ---- */
static tok *cur(parser *p) { return &p->toks[p->pos]; }
static tok *peek(parser *p, size_t k) {
    size_t i = p->pos + k;
    return &p->toks[i < p->ntok ? i : p->ntok - 1];
}
static int is_op(const tok *t, const char *op) {
    return t->type == T_OP && t->s.n == strlen(op) && !memcmp(t->s.p, op, t->s.n);
}
static int is_name(const tok *t, const char *nm) {
    return t->type == T_NAME && t->s.n == strlen(nm) && !memcmp(t->s.p, nm, t->s.n);
}

static const char *describe(const tok *t, char *buf, size_t n) {
    switch (t->type) {
    case T_EOF: return "end of template";
    case T_DATA: return "template data";
    case T_VAR_BEGIN: return "begin of print statement";
    case T_VAR_END: return "end of print statement";
    case T_BLOCK_BEGIN: return "begin of statement block";
    case T_BLOCK_END: return "end of statement block";
    case T_STRING: return "string";
    case T_INT: return "integer";
    case T_FLOAT: return "float";
    default: snprintf(buf, n, "%.*s", (int)(t->s.n > 40 ? 40 : t->s.n), t->s.p); return buf;
    }
}

__attribute__((noreturn)) static void unexpected(parser *p, const char *what) {
    char b[64];
    fail_at(p, cur(p)->off, "expected %s, got '%s'", what, describe(cur(p), b, sizeof b));
}

static void expect_op(parser *p, const char *op) {
    if (!is_op(cur(p), op)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", op);
        unexpected(p, w);
    }
    p->pos++;
}

static jstr expect_name(parser *p) {
    if (cur(p)->type != T_NAME) unexpected(p, "name");
    return p->toks[p->pos++].s;
}

static node *mk(parser *p, int kind, const tok *t) {
    node *x = ja_alloc(p->a, sizeof(node));
    x->kind = kind;
    int l, c;
    where(p, t->off, &l, &c);
    x->line = l;
    x->col = c;
    return x;
}

typedef struct nvec {
    node **v;
    int n, cap;
} nvec;

static void nv_push(parser *p, nvec *v, node *x) {
    if (v->n == v->cap) {
        int nc = v->cap ? v->cap * 2 : 4;
        node **nn = ja_alloc(p->a, (size_t)nc * sizeof(node *));
        if (v->n) memcpy(nn, v->v, (size_t)v->n * sizeof(node *));
        v->v = nn;
        v->cap = nc;
    }
    v->v[v->n++] = x;
}

static void enter(parser *p) {
    if (++p->depth > MAX_NEST) fail_at(p, cur(p)->off, "template nesting too deep");
}
static void leave(parser *p) { p->depth--; }

static node *parse_expression(parser *p, int with_condexpr);
static node *parse_tuple(parser *p, int with_condexpr, int explicit_parens, const char *extra_end);
static node *parse_unary(parser *p, int with_filter);
static node *parse_postfix(parser *p, node *x);
static node *parse_filter_expr(parser *p, node *x);

static void parse_call_args(parser *p, node *call) {
    expect_op(p, "(");
    nvec args = {0};
    nvec kws = {0};
    jstr *names = NULL;
    int nnames = 0, capn = 0;
    while (!is_op(cur(p), ")")) {
        if (args.n || kws.n) {
            expect_op(p, ",");
            if (is_op(cur(p), ")")) break;
        }
        if (is_op(cur(p), "*") || is_op(cur(p), "**")) fail_at(p, cur(p)->off, "*args and **kwargs are not supported");
        if (cur(p)->type == T_NAME && is_op(peek(p, 1), "=")) {
            jstr nm = cur(p)->s;
            p->pos += 2;
            nv_push(p, &kws, parse_expression(p, 1));
            if (nnames == capn) {
                int nc = capn ? capn * 2 : 4;
                jstr *nn = ja_alloc(p->a, (size_t)nc * sizeof(jstr));
                if (nnames) memcpy(nn, names, (size_t)nnames * sizeof(jstr));
                names = nn;
                capn = nc;
            }
            names[nnames++] = nm;
        } else {
            if (kws.n) fail_at(p, cur(p)->off, "positional argument follows keyword argument");
            nv_push(p, &args, parse_expression(p, 1));
        }
    }
    expect_op(p, ")");
    call->items = args.v;
    call->n = args.n;
    call->kw = kws.v;
    call->kwnames = names;
    call->nkw = kws.n;
}

static node *parse_primary(parser *p) {
    tok *t = cur(p);
    node *x;
    if (t->type == T_NAME) {
        p->pos++;
        if (is_name(t, "true") || is_name(t, "True") || is_name(t, "false") || is_name(t, "False")) {
            x = mk(p, N_CONST, t);
            x->val = jv_bool(t->s.p[0] == 't' || t->s.p[0] == 'T');
        } else if (is_name(t, "none") || is_name(t, "None")) {
            x = mk(p, N_CONST, t);
            x->val = jv_none();
        } else {
            x = mk(p, N_NAME, t);
            x->name = t->s;
        }
        return x;
    }
    if (t->type == T_STRING) {
        /* adjacent string literals concatenate */
        jbuf b;
        jb_init(&b, p->a, 0);
        x = mk(p, N_CONST, t);
        while (cur(p)->type == T_STRING) {
            jb_put(&b, cur(p)->s.p, cur(p)->s.n);
            p->pos++;
        }
        jstr s = jb_str(&b);
        x->val = jv_str(s.p, s.n);
        return x;
    }
    if (t->type == T_INT || t->type == T_FLOAT) {
        p->pos++;
        x = mk(p, N_CONST, t);
        x->val = t->type == T_INT ? jv_int(t->i) : jv_float(t->f);
        return x;
    }
    if (is_op(t, "(")) {
        p->pos++;
        x = parse_tuple(p, 1, 1, NULL);
        expect_op(p, ")");
        return x;
    }
    if (is_op(t, "[")) {
        p->pos++;
        x = mk(p, N_LIST, t);
        nvec v = {0};
        while (!is_op(cur(p), "]")) {
            if (v.n) {
                expect_op(p, ",");
                if (is_op(cur(p), "]")) break;
            }
            nv_push(p, &v, parse_expression(p, 1));
        }
        expect_op(p, "]");
        x->items = v.v;
        x->n = v.n;
        return x;
    }
    if (is_op(t, "{")) {
        p->pos++;
        x = mk(p, N_DICT, t);
        nvec v = {0};
        while (!is_op(cur(p), "}")) {
            if (v.n) {
                expect_op(p, ",");
                if (is_op(cur(p), "}")) break;
            }
            nv_push(p, &v, parse_expression(p, 1));
            expect_op(p, ":");
            nv_push(p, &v, parse_expression(p, 1));
        }
        expect_op(p, "}");
        x->items = v.v;
        x->n = v.n;
        return x;
    }
    char b[64];
    fail_at(p, t->off, "unexpected '%s'", describe(t, b, sizeof b));
}

static int tuple_end(parser *p, const char *extra_end) {
    tok *t = cur(p);
    if (t->type == T_VAR_END || t->type == T_BLOCK_END || t->type == T_EOF) return 1;
    if (is_op(t, ")")) return 1;
    if (extra_end && is_name(t, extra_end)) return 1;
    return 0;
}

static node *parse_tuple(parser *p, int with_condexpr, int explicit_parens, const char *extra_end) {
    tok *t0 = cur(p);
    nvec v = {0};
    int is_tuple = 0;
    for (;;) {
        if (v.n) expect_op(p, ",");
        if (tuple_end(p, extra_end)) break;
        nv_push(p, &v, parse_expression(p, with_condexpr));
        if (is_op(cur(p), ","))
            is_tuple = 1;
        else
            break;
    }
    if (!is_tuple) {
        if (v.n) return v.v[0];
        if (!explicit_parens) unexpected(p, "an expression");
    }
    node *x = mk(p, N_TUPLE, t0);
    x->items = v.v;
    x->n = v.n;
    return x;
}

static node *parse_subscribed(parser *p) {
    tok *t = cur(p);
    node *args[3] = {NULL, NULL, NULL};
    if (is_op(t, ":")) {
        p->pos++;
    } else {
        node *x = parse_expression(p, 1);
        if (!is_op(cur(p), ":")) return x;
        p->pos++;
        args[0] = x;
    }
    if (!is_op(cur(p), ":") && !is_op(cur(p), "]") && !is_op(cur(p), ",")) args[1] = parse_expression(p, 1);
    if (is_op(cur(p), ":")) {
        p->pos++;
        if (!is_op(cur(p), "]") && !is_op(cur(p), ",")) args[2] = parse_expression(p, 1);
    }
    node *s = mk(p, N_SLICE, t);
    s->a = args[0];
    s->b = args[1];
    s->c = args[2];
    return s;
}

static node *parse_postfix(parser *p, node *x) {
    for (;;) {
        tok *t = cur(p);
        if (is_op(t, ".")) {
            p->pos++;
            tok *a = cur(p);
            if (a->type == T_NAME) {
                p->pos++;
                node *g = mk(p, N_GETATTR, t);
                g->a = x;
                g->name = a->s;
                x = g;
            } else if (a->type == T_INT) {
                p->pos++;
                node *g = mk(p, N_GETITEM, t);
                g->a = x;
                node *k = mk(p, N_CONST, a);
                k->val = jv_int(a->i);
                g->b = k;
                x = g;
            } else {
                fail_at(p, a->off, "expected name or number");
            }
        } else if (is_op(t, "[")) {
            p->pos++;
            nvec v = {0};
            while (!is_op(cur(p), "]")) {
                if (v.n) expect_op(p, ",");
                nv_push(p, &v, parse_subscribed(p));
            }
            expect_op(p, "]");
            if (v.n == 0) fail_at(p, t->off, "expected subscript expression");
            node *g = mk(p, N_GETITEM, t);
            g->a = x;
            if (v.n == 1) {
                g->b = v.v[0];
            } else {
                node *tu = mk(p, N_TUPLE, t);
                tu->items = v.v;
                tu->n = v.n;
                g->b = tu;
            }
            x = g;
        } else if (is_op(t, "(")) {
            node *c = mk(p, N_CALL, t);
            c->a = x;
            parse_call_args(p, c);
            x = c;
        } else {
            return x;
        }
    }
}

static jstr parse_dotted_name(parser *p) {
    jstr nm = expect_name(p);
    while (is_op(cur(p), ".")) {
        p->pos++;
        jstr more = expect_name(p);
        nm.n = (size_t)(more.p + more.n - nm.p);
    }
    return nm;
}

static node *parse_filter(parser *p, node *x) {
    tok *t = cur(p);
    expect_op(p, "|");
    node *f = mk(p, N_FILTER, t);
    f->a = x;
    f->name = parse_dotted_name(p);
    if (!jinja_filter_known(f->name.p, f->name.n))
        fail_at(p, t->off, "No filter named '%.*s'.", (int)(f->name.n > 60 ? 60 : f->name.n), f->name.p);
    if (is_op(cur(p), "(")) parse_call_args(p, f);
    return f;
}

static node *parse_test(parser *p, node *x) {
    tok *t = cur(p);
    p->pos++; /* 'is' */
    int negated = 0;
    if (is_name(cur(p), "not")) {
        p->pos++;
        negated = 1;
    }
    node *te = mk(p, N_TEST, t);
    te->a = x;
    te->name = parse_dotted_name(p);
    if (!jinja_test_known(te->name.p, te->name.n))
        fail_at(p, t->off, "No test named '%.*s'.", (int)(te->name.n > 60 ? 60 : te->name.n), te->name.p);
    tok *c = cur(p);
    if (is_op(c, "(")) {
        parse_call_args(p, te);
    } else if ((c->type == T_NAME || c->type == T_STRING || c->type == T_INT || c->type == T_FLOAT || is_op(c, "(") ||
                is_op(c, "[") || is_op(c, "{")) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        if (is_name(c, "is")) fail_at(p, c->off, "You cannot chain multiple tests with is");
        node *arg = parse_postfix(p, parse_primary(p));
        te->items = ja_alloc(p->a, sizeof(node *));
        te->items[0] = arg;
        te->n = 1;
    }
    if (negated) {
        node *nt = mk(p, N_NOT, t);
        nt->a = te;
        return nt;
    }
    return te;
}

static node *parse_filter_expr(parser *p, node *x) {
    for (;;) {
        tok *t = cur(p);
        if (is_op(t, "|"))
            x = parse_filter(p, x);
        else if (is_name(t, "is"))
            x = parse_test(p, x);
        else if (is_op(t, "(")) {
            node *c = mk(p, N_CALL, t);
            c->a = x;
            parse_call_args(p, c);
            x = c;
        } else
            return x;
    }
}

static node *parse_unary(parser *p, int with_filter) {
    enter(p);
    tok *t = cur(p);
    node *x;
    if (is_op(t, "-") || is_op(t, "+")) {
        p->pos++;
        x = mk(p, is_op(t, "-") ? N_NEG : N_POS, t);
        x->a = parse_unary(p, 0);
    } else {
        x = parse_primary(p);
    }
    x = parse_postfix(p, x);
    if (with_filter) x = parse_filter_expr(p, x);
    leave(p);
    return x;
}

static node *binop(parser *p, const tok *t, int op, node *l, node *r) {
    node *x = mk(p, N_BINOP, t);
    x->op = op;
    x->a = l;
    x->b = r;
    return x;
}

static node *parse_pow(parser *p) {
    node *l = parse_unary(p, 1);
    while (is_op(cur(p), "**")) {
        tok *t = cur(p);
        p->pos++;
        l = binop(p, t, 'P', l, parse_unary(p, 1));
    }
    return l;
}

static node *parse_math2(parser *p) {
    node *l = parse_pow(p);
    for (;;) {
        tok *t = cur(p);
        int op = is_op(t, "*") ? '*' : is_op(t, "/") ? '/' : is_op(t, "//") ? 'F' : is_op(t, "%") ? '%' : 0;
        if (!op) return l;
        p->pos++;
        l = binop(p, t, op, l, parse_pow(p));
    }
}

static node *parse_concat(parser *p) {
    node *l = parse_math2(p);
    while (is_op(cur(p), "~")) {
        tok *t = cur(p);
        p->pos++;
        l = binop(p, t, '~', l, parse_math2(p));
    }
    return l;
}

static node *parse_math1(parser *p) {
    node *l = parse_concat(p);
    for (;;) {
        tok *t = cur(p);
        int op = is_op(t, "+") ? '+' : is_op(t, "-") ? '-' : 0;
        if (!op) return l;
        p->pos++;
        l = binop(p, t, op, l, parse_concat(p));
    }
}

static node *parse_compare(parser *p) {
    tok *t0 = cur(p);
    node *first = parse_math1(p);
    nvec rest = {0};
    int *ops = NULL;
    int cap = 0;
    for (;;) {
        tok *t = cur(p);
        int op = 0;
        if (is_op(t, "==")) op = CMP_EQ;
        else if (is_op(t, "!=")) op = CMP_NE;
        else if (is_op(t, "<")) op = CMP_LT;
        else if (is_op(t, "<=")) op = CMP_LE;
        else if (is_op(t, ">")) op = CMP_GT;
        else if (is_op(t, ">=")) op = CMP_GE;
        else if (is_name(t, "in")) op = CMP_IN;
        else if (is_name(t, "not") && is_name(peek(p, 1), "in")) op = CMP_NOTIN;
        if (!op) break;
        p->pos += op == CMP_NOTIN ? 2 : 1;
        nv_push(p, &rest, parse_math1(p));
        if (rest.n > cap) {
            int nc = cap ? cap * 2 : 4;
            int *no = ja_alloc(p->a, (size_t)nc * sizeof(int));
            if (cap) memcpy(no, ops, (size_t)cap * sizeof(int));
            ops = no;
            cap = nc;
        }
        ops[rest.n - 1] = op;
    }
    if (!rest.n) return first;
    node *x = mk(p, N_COMPARE, t0);
    x->a = first;
    x->items = rest.v;
    x->n = rest.n;
    x->ops = ops;
    return x;
}

static node *parse_not(parser *p) {
    tok *t = cur(p);
    if (is_name(t, "not")) {
        p->pos++;
        enter(p);
        node *x = mk(p, N_NOT, t);
        x->a = parse_not(p);
        leave(p);
        return x;
    }
    return parse_compare(p);
}

static node *parse_and(parser *p) {
    node *l = parse_not(p);
    while (is_name(cur(p), "and")) {
        tok *t = cur(p);
        p->pos++;
        node *x = mk(p, N_AND, t);
        x->a = l;
        x->b = parse_not(p);
        l = x;
    }
    return l;
}

static node *parse_or(parser *p) {
    node *l = parse_and(p);
    while (is_name(cur(p), "or")) {
        tok *t = cur(p);
        p->pos++;
        node *x = mk(p, N_OR, t);
        x->a = l;
        x->b = parse_and(p);
        l = x;
    }
    return l;
}

static node *parse_condexpr(parser *p) {
    node *x = parse_or(p);
    while (is_name(cur(p), "if")) {
        tok *t = cur(p);
        p->pos++;
        node *c = mk(p, N_CONDEXPR, t);
        c->a = x;
        c->b = parse_or(p);
        if (is_name(cur(p), "else")) {
            p->pos++;
            enter(p);
            c->c = parse_condexpr(p);
            leave(p);
        }
        x = c;
    }
    return x;
}

static node *parse_expression(parser *p, int with_condexpr) {
    enter(p);
    node *x = with_condexpr ? parse_condexpr(p) : parse_or(p);
    leave(p);
    return x;
}

/* ---- statements ---- */
static void subparse(parser *p, nvec *body, const char *const *ends, int nends);

static void expect_block_end(parser *p) {
    if (cur(p)->type != T_BLOCK_END) unexpected(p, "end of statement block");
    p->pos++;
}

/* Assignment targets: a name, ns.attr, or a tuple of names. */
static node *parse_assign_target(parser *p, int with_ns, const char *extra_end) {
    tok *t0 = cur(p);
    nvec v = {0};
    int is_tuple = 0;
    for (;;) {
        if (v.n) expect_op(p, ",");
        if (tuple_end(p, extra_end) || is_op(cur(p), "=") || is_op(cur(p), "|")) break;
        tok *t = cur(p);
        jstr nm = expect_name(p);
        node *x;
        if (with_ns && is_op(cur(p), ".")) {
            p->pos++;
            x = mk(p, N_NSREF, t);
            x->name = nm;
            x->attr = expect_name(p);
        } else {
            x = mk(p, N_NAME, t);
            x->name = nm;
        }
        nv_push(p, &v, x);
        if (is_op(cur(p), ","))
            is_tuple = 1;
        else
            break;
    }
    if (v.n == 0) unexpected(p, "assignment target");
    if (!is_tuple) return v.v[0];
    node *x = mk(p, N_TUPLE, t0);
    x->items = v.v;
    x->n = v.n;
    return x;
}

static void parse_params(parser *p, node *x) {
    nvec params = {0};
    expect_op(p, "(");
    while (!is_op(cur(p), ")")) {
        if (params.n) expect_op(p, ",");
        tok *t = cur(p);
        node *a = mk(p, N_NAME, t);
        a->name = expect_name(p);
        if (is_op(cur(p), "=")) {
            p->pos++;
            a->a = parse_expression(p, 1);
        }
        nv_push(p, &params, a);
    }
    expect_op(p, ")");
    x->items2 = params.v;
    x->n2 = params.n;
}

/* A filter chain for {% filter f|g %} and {% set x | f %}: N_FILTER nodes whose innermost input is NULL. */
static node *parse_filter_chain(parser *p) {
    node *x = NULL;
    int first = 1;
    for (;;) {
        tok *t = cur(p);
        if (!first) {
            if (!is_op(t, "|")) break;
            p->pos++;
        }
        first = 0;
        tok *ft = cur(p);
        node *f = mk(p, N_FILTER, ft);
        f->a = x;
        f->name = parse_dotted_name(p);
        if (!jinja_filter_known(f->name.p, f->name.n))
            fail_at(p, ft->off, "No filter named '%.*s'.", (int)(f->name.n > 60 ? 60 : f->name.n), f->name.p);
        if (is_op(cur(p), "(")) parse_call_args(p, f);
        x = f;
    }
    return x;
}

static node *parse_statement(parser *p) {
    tok *t = cur(p);
    if (t->type != T_NAME) unexpected(p, "statement name");
    static const char *const end_if[] = {"elif", "else", "endif"};
    static const char *const end_for[] = {"endfor", "else"};
    static const char *const end_endfor[] = {"endfor"};
    enter(p);
    node *x = NULL;
    if (is_name(t, "if")) {
        p->pos++;
        x = mk(p, S_IF, t);
        node *c = x;
        for (;;) {
            c->a = parse_tuple(p, 0, 0, NULL);
            expect_block_end(p);
            nvec body = {0};
            subparse(p, &body, end_if, 3);
            c->items = body.v;
            c->n = body.n;
            tok *e = cur(p);
            p->pos++;
            if (is_name(e, "elif")) {
                node *n2 = mk(p, S_IF, e);
                c->c = n2;
                c = n2;
                continue;
            }
            if (is_name(e, "else")) {
                expect_block_end(p);
                node *n2 = mk(p, S_IF, e);
                nvec eb = {0};
                static const char *const end_endif[] = {"endif"};
                subparse(p, &eb, end_endif, 1);
                p->pos++;
                n2->items = eb.v;
                n2->n = eb.n;
                c->c = n2;
            }
            break;
        }
        expect_block_end(p);
    } else if (is_name(t, "for")) {
        p->pos++;
        x = mk(p, S_FOR, t);
        x->a = parse_assign_target(p, 0, "in");
        if (!is_name(cur(p), "in")) unexpected(p, "'in'");
        p->pos++;
        x->b = parse_tuple(p, 0, 0, "recursive");
        if (is_name(cur(p), "if")) {
            p->pos++;
            x->c = parse_expression(p, 1);
        }
        if (is_name(cur(p), "recursive")) fail_at(p, cur(p)->off, "recursive loops are not supported");
        expect_block_end(p);
        nvec body = {0};
        subparse(p, &body, end_for, 2);
        x->items = body.v;
        x->n = body.n;
        tok *e = cur(p);
        p->pos++;
        if (is_name(e, "else")) {
            expect_block_end(p);
            nvec eb = {0};
            subparse(p, &eb, end_endfor, 1);
            p->pos++;
            x->items2 = eb.v;
            x->n2 = eb.n;
        }
        expect_block_end(p);
    } else if (is_name(t, "set")) {
        p->pos++;
        node *target = parse_assign_target(p, 1, NULL);
        if (is_op(cur(p), "=")) {
            p->pos++;
            x = mk(p, S_SET, t);
            x->a = target;
            x->b = parse_tuple(p, 1, 0, NULL);
            expect_block_end(p);
        } else {
            x = mk(p, S_SETBLOCK, t);
            x->a = target;
            if (is_op(cur(p), "|")) {
                p->pos++;
                x->b = parse_filter_chain(p);
            }
            expect_block_end(p);
            static const char *const end_set[] = {"endset"};
            nvec body = {0};
            subparse(p, &body, end_set, 1);
            p->pos++;
            expect_block_end(p);
            x->items = body.v;
            x->n = body.n;
        }
    } else if (is_name(t, "macro")) {
        p->pos++;
        x = mk(p, S_MACRO, t);
        x->name = expect_name(p);
        parse_params(p, x);
        expect_block_end(p);
        static const char *const end_macro[] = {"endmacro"};
        nvec body = {0};
        subparse(p, &body, end_macro, 1);
        p->pos++;
        if (cur(p)->type == T_NAME) p->pos++; /* {% endmacro name %} */
        expect_block_end(p);
        x->items = body.v;
        x->n = body.n;
    } else if (is_name(t, "call")) {
        p->pos++;
        x = mk(p, S_CALLBLOCK, t);
        if (is_op(cur(p), "(")) parse_params(p, x);
        x->a = parse_expression(p, 1);
        if (x->a->kind != N_CALL) fail_at(p, t->off, "expected call");
        expect_block_end(p);
        static const char *const end_call[] = {"endcall"};
        nvec body = {0};
        subparse(p, &body, end_call, 1);
        p->pos++;
        expect_block_end(p);
        x->items = body.v;
        x->n = body.n;
    } else if (is_name(t, "filter")) {
        p->pos++;
        x = mk(p, S_FILTERBLOCK, t);
        x->b = parse_filter_chain(p);
        expect_block_end(p);
        static const char *const end_filter[] = {"endfilter"};
        nvec body = {0};
        subparse(p, &body, end_filter, 1);
        p->pos++;
        expect_block_end(p);
        x->items = body.v;
        x->n = body.n;
    } else if (is_name(t, "with")) {
        p->pos++;
        x = mk(p, S_WITH, t);
        nvec sets = {0};
        while (cur(p)->type != T_BLOCK_END) {
            if (sets.n) expect_op(p, ",");
            tok *st = cur(p);
            node *s = mk(p, S_SET, st);
            s->a = parse_assign_target(p, 0, NULL);
            expect_op(p, "=");
            s->b = parse_expression(p, 1);
            nv_push(p, &sets, s);
        }
        expect_block_end(p);
        static const char *const end_with[] = {"endwith"};
        nvec body = {0};
        subparse(p, &body, end_with, 1);
        p->pos++;
        expect_block_end(p);
        x->items = body.v;
        x->n = body.n;
        x->items2 = sets.v;
        x->n2 = sets.n;
    } else if (is_name(t, "generation")) {
        /* transformers' AssistantTracker tag: renders its body; the indices it tracks are not needed here */
        p->pos++;
        x = mk(p, S_SCOPE, t);
        expect_block_end(p);
        static const char *const end_gen[] = {"endgeneration"};
        nvec body = {0};
        subparse(p, &body, end_gen, 1);
        p->pos++;
        expect_block_end(p);
        x->items = body.v;
        x->n = body.n;
    } else if (is_name(t, "break") || is_name(t, "continue")) {
        p->pos++;
        x = mk(p, is_name(t, "break") ? S_BREAK : S_CONTINUE, t);
        expect_block_end(p);
    } else {
        fail_at(p, t->off, "Encountered unknown tag '%.*s'.", (int)(t->s.n > 40 ? 40 : t->s.n), t->s.p);
    }
    leave(p);
    return x;
}

static void subparse(parser *p, nvec *body, const char *const *ends, int nends) {
    for (;;) {
        tok *t = cur(p);
        if (t->type == T_EOF) {
            if (nends) {
                fail_at(p, t->off, "Unexpected end of template. Jinja was looking for the following tags: '%s'.", ends[nends - 1]);
            }
            return;
        }
        if (t->type == T_DATA) {
            node *d = mk(p, S_DATA, t);
            d->val = jv_str(t->s.p, t->s.n);
            nv_push(p, body, d);
            p->pos++;
        } else if (t->type == T_VAR_BEGIN) {
            p->pos++;
            node *o = mk(p, S_OUTPUT, t);
            o->a = parse_tuple(p, 1, 0, NULL);
            if (cur(p)->type != T_VAR_END) unexpected(p, "end of print statement");
            p->pos++;
            nv_push(p, body, o);
        } else if (t->type == T_BLOCK_BEGIN) {
            p->pos++;
            tok *nm = cur(p);
            for (int i = 0; i < nends; i++)
                if (is_name(nm, ends[i])) return; /* the caller consumes the end tag */
            if (nm->type == T_NAME) {
                static const char *const stray[] = {"endif", "endfor", "else", "elif", "endmacro", "endset",
                                                    "endcall", "endfilter", "endwith", "endgeneration", "endraw"};
                for (size_t i = 0; i < sizeof stray / sizeof stray[0]; i++)
                    if (is_name(nm, stray[i])) fail_at(p, nm->off, "Encountered unknown tag '%s'.", stray[i]);
            }
            nv_push(p, body, parse_statement(p));
        } else {
            unexpected(p, "template data or a tag");
        }
    }
}

int jinja_parse(jtemplate *t, const char *src, size_t len, char *err, size_t errlen) {
    parser p;
    memset(&p, 0, sizeof p);
    p.a = &t->arena;
    p.err = err;
    p.errlen = errlen;
    t->arena.fail = &p.jb;
    t->arena.err = err;
    t->arena.errlen = errlen;
    if (setjmp(p.jb)) {
        t->arena.fail = NULL;
        return CINFER_EFORMAT;
    }
    /* Newlines: \r\n and \r become \n, and one trailing newline is dropped (keep_trailing_newline=False). */
    char *s = ja_alloc(p.a, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n') n--;
    s[n] = 0;
    p.src = s;
    p.len = n;
    p.w_line = p.w_col = 1;
    lex(&p);
    push_tok(&p, (tok){.type = T_EOF, .off = n});
    nvec body = {0};
    subparse(&p, &body, NULL, 0);
    t->body = body.v;
    t->n = body.n;
    t->arena.fail = NULL;
    return 0;
}

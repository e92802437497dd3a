/* grammar.c — see grammar.h. The grammar is an array of nodes; a matcher's state is a set of stacks of
 * frames (node + a few counters). Non-consuming nodes (sequence, alternative, repeat) are expanded away
 * at once, so every live stack has a lexeme on top (literal, JSON string, raw text, number, blanks) or is
 * empty (the whole grammar matched). A byte goes to the top lexeme; a lexeme that may end (a number, blanks)
 * also offers the byte to what follows it. Alternatives fork stacks; the set is deduplicated and bounded,
 * and whatever does not fit is dropped, which only ever narrows what the model may write. */
#include "sample/grammar.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cinfer.h"
#include "util/alloc.h"
#include "util/err.h"

enum { G_LIT, G_SEQ, G_ALT, G_REP, G_STR, G_RAW, G_NUM, G_WS, G_SET };

typedef struct gnode {
    int kind;
    int n;      /* LIT: bytes; SEQ / ALT: children; RAW: terminator bytes; SET: trie nodes */
    int *kids;  /* SEQ / ALT: [n]; REP: [2] = {item, separator or -1}; SET: [n][4] trie nodes {byte, first
                   child, next sibling, a literal ends here}, node 0 the root */
    char *lit;  /* LIT: the bytes; RAW: the terminator */
    int lo, hi; /* STR / RAW: length in characters (hi -1: unbounded); REP: count; WS: hi bytes at most;
                   NUM: lo 1 for integers */
} gnode;

struct grammar {
    gnode *nodes;
    int n, cap;
    int root;
};

#define WS_MAX 12 /* blanks at one place: enough for pretty-printed JSON a few levels deep */
#define NUM_MAX_DIGITS                                                                                       \
    15              /* digits of a number (integer and fraction together: exact in a double, and in          \
                       int64 for integers); 2 of an exponent */
#define MAX_CALLS 8 /* tool calls in one constrained answer ("required") */

/* ---------------------------------------------------------------- building nodes */

static int add_node(grammar *g, int kind) {
    if (g->n == g->cap) {
        g->cap = g->cap ? g->cap * 2 : 64;
        g->nodes = xrealloc(g->nodes, (size_t)g->cap * sizeof *g->nodes);
    }
    memset(&g->nodes[g->n], 0, sizeof g->nodes[0]);
    g->nodes[g->n].kind = kind;
    g->nodes[g->n].hi = -1;
    return g->n++;
}

static int lit_n(grammar *g, const char *s, size_t n) {
    int i = add_node(g, G_LIT);
    g->nodes[i].lit = xmalloc(n + 1);
    memcpy(g->nodes[i].lit, s, n);
    g->nodes[i].lit[n] = 0;
    g->nodes[i].n = (int)n;
    return i;
}
static int lit(grammar *g, const char *s) {
    return lit_n(g, s, strlen(s));
}

/* SEQ / ALT of the given children (a -1 ends the list). */
static int list(grammar *g, int kind, const int *kids, int n) {
    int i = add_node(g, kind);
    g->nodes[i].kids = xmalloc(sizeof(int) * (size_t)(n ? n : 1));
    if (n) memcpy(g->nodes[i].kids, kids, sizeof(int) * (size_t)n);
    g->nodes[i].n = n;
    return i;
}
static int seq2(grammar *g, int a, int b) {
    return list(g, G_SEQ, (int[]){a, b}, 2);
}
static int seq3(grammar *g, int a, int b, int c) {
    return list(g, G_SEQ, (int[]){a, b, c}, 3);
}
static int alt2(grammar *g, int a, int b) {
    return list(g, G_ALT, (int[]){a, b}, 2);
}
static int empty(grammar *g) {
    return list(g, G_SEQ, NULL, 0);
}
static int ws(grammar *g) {
    int i = add_node(g, G_WS);
    g->nodes[i].hi = WS_MAX;
    return i;
}
static int rep(grammar *g, int item, int sep, int lo, int hi) {
    int i = list(g, G_REP, (int[]){item, sep}, 2);
    g->nodes[i].lo = lo;
    g->nodes[i].hi = hi;
    return i;
}
/* A set of literals (enum values) as one lexeme: a byte trie walked deterministically, so a thousand values
 * cost one stack, not a thousand alternatives. */
static int litset_cont(grammar *g, const char *const *strs, const size_t *lens, const int *conts, int n);
static int litset(grammar *g, const char *const *strs, const size_t *lens, int n) {
    return litset_cont(g, strs, lens, NULL, n);
}

/* conts[i] (when given): the node that follows literal i (its frame replaces the set's): tool names share
 * one trie and each goes on into its own parameters. "Ends here" is then 2 + that node. */
static int litset_cont(grammar *g, const char *const *strs, const size_t *lens, const int *conts, int n) {
    int cap = 16, nn = 1;
    int *t = xcalloc((size_t)cap * 4, sizeof(int));
    t[1] = t[2] = -1;
    for (int i = 0; i < n; i++) {
        int cur = 0;
        for (size_t k = 0; k < lens[i]; k++) {
            int x = (unsigned char)strs[i][k], c = t[cur * 4 + 1];
            while (c >= 0 && t[c * 4] != x) c = t[c * 4 + 2];
            if (c < 0) {
                if (nn == cap) {
                    t = xrealloc(t, sizeof(int) * 4 * (size_t)(cap *= 2));
                }
                c = nn++;
                t[c * 4] = x, t[c * 4 + 1] = -1, t[c * 4 + 2] = t[cur * 4 + 1], t[c * 4 + 3] = 0;
                t[cur * 4 + 1] = c;
            }
            cur = c;
        }
        t[cur * 4 + 3] = conts ? 2 + conts[i] : 1;
    }
    int i = add_node(g, G_SET);
    g->nodes[i].kids = t;
    g->nodes[i].n = nn;
    return i;
}

static int raw(grammar *g, const char *term, int lo, int hi) {
    int i = lit(g, term);
    g->nodes[i].kind = G_RAW;
    g->nodes[i].lo = lo;
    g->nodes[i].hi = hi;
    return i;
}

void grammar_free(grammar *g) {
    if (!g) return;
    for (int i = 0; i < g->n; i++) free(g->nodes[i].kids), free(g->nodes[i].lit);
    free(g->nodes);
    free(g);
}

/* ---------------------------------------------------------------- the schema compiler */

typedef struct {
    grammar *g;
    const json_t *root;
    json_t *refs; /* ref string -> node index (integer) */
    int any;      /* the any-JSON-value node, made on first use (-1) */
    int depth;
    char *err;
    size_t errlen;
} cctx;

#define MAX_SCHEMA_DEPTH 64

static int compile(cctx *c, const json_t *s, const char *path);

/* A JSON text as a literal: what a value given in the schema (enum, const) must be written as. */
static int json_lit(cctx *c, const json_t *v) {
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    if (!s) return -1;
    int i = lit(c->g, s);
    free(s);
    return i;
}

static int str_node(grammar *g, int lo, int hi) {
    int i = add_node(g, G_STR);
    g->nodes[i].lo = lo;
    g->nodes[i].hi = hi;
    return i;
}
static int num_node(grammar *g, int integer) {
    int i = add_node(g, G_NUM);
    g->nodes[i].lo = integer;
    return i;
}

static int any_value(cctx *c);

/* "{" members "}" where the declared properties come in order (required always, optional maybe) and
 * extra members (addl >= 0: their value node) after them. Built back to front: rest[i] = the members from
 * property i on after at least one was written, first[i] = the same before any was. */
static int object_node(cctx *c, int n, const char *const *keys, const int *vals, const int *required,
                       int addl) {
    grammar *g = c->g;
    int rest = empty(g), first = empty(g);
    if (addl >= 0) {
        int kv = list(g, G_SEQ, (int[]){str_node(g, 0, -1), ws(g), lit(g, ":"), ws(g), addl, ws(g)}, 6);
        int more = rep(g, seq3(g, lit(g, ","), ws(g), kv), -1, 0, -1);
        rest = more;
        first = alt2(g, empty(g), seq2(g, kv, more));
    }
    for (int i = n - 1; i >= 0; i--) {
        json_t *k = json_string(keys[i]);
        int key = json_lit(c, k);
        json_decref(k);
        int kv = list(g, G_SEQ, (int[]){key, ws(g), lit(g, ":"), ws(g), vals[i], ws(g)}, 6);
        int r = list(g, G_SEQ, (int[]){lit(g, ","), ws(g), kv, rest}, 4);
        int f = seq2(g, kv, rest);
        if (!required[i]) r = alt2(g, r, rest), f = alt2(g, f, first);
        rest = r, first = f;
    }
    return list(g, G_SEQ, (int[]){lit(g, "{"), ws(g), first, lit(g, "}")}, 4);
}

static int array_node(grammar *g, int item, int lo, int hi) {
    int body;
    if (hi == 0) {
        body = empty(g);
    } else {
        int items = rep(g, seq2(g, item, ws(g)), seq2(g, lit(g, ","), ws(g)), lo > 1 ? lo : 1, hi);
        body = lo == 0 ? alt2(g, empty(g), items) : items;
    }
    return list(g, G_SEQ, (int[]){lit(g, "["), ws(g), body, lit(g, "]")}, 4);
}

static int any_value(cctx *c) {
    if (c->any >= 0) return c->any;
    grammar *g = c->g;
    /* the alternative is made first so the containers can refer back to it */
    int a = add_node(g, G_ALT);
    c->any = a;
    int obj = object_node(c, 0, NULL, NULL, NULL, a);
    int arr = array_node(g, a, 0, -1);
    int kids[7] = {obj,           arr, str_node(g, 0, -1), num_node(g, 0), lit(g, "true"), lit(g, "false"),
                   lit(g, "null")};
    g->nodes[a].kids = xmalloc(sizeof kids);
    memcpy(g->nodes[a].kids, kids, sizeof kids);
    g->nodes[a].n = 7;
    return a;
}

static int fail(cctx *c, int code, const char *fmt, const char *a, const char *b) {
    char m[300];
    snprintf(m, sizeof m, fmt, a, b);
    ci_err(c->err, c->errlen, code, "%s", m);
    return -1;
}

/* A non-negative integer keyword, or dflt when absent; -2 on error. */
static int get_count(cctx *c, const json_t *s, const char *key, int dflt, const char *path) {
    const json_t *v = json_object_get(s, key);
    if (!v) return dflt;
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        fail(c, CINFER_EINVAL, "JSON Schema: '%s' at %s must be a non-negative integer", key, path);
        return -2;
    }
    json_int_t x = json_integer_value(v);
    return x > 1000000 ? 1000000 : (int)x;
}

/* The JSON pointer ref ("#", "#/$defs/x", ...) resolved in the document. */
static const json_t *resolve(cctx *c, const char *ref) {
    if (ref[0] != '#') return NULL;
    const json_t *cur = c->root;
    const char *p = ref + 1;
    while (*p == '/') {
        p++;
        char tok[256];
        size_t n = 0;
        while (*p && *p != '/') {
            char ch = *p++;
            if (ch == '~' && (*p == '0' || *p == '1')) ch = *p++ == '0' ? '~' : '/';
            if (n + 1 >= sizeof tok) return NULL;
            tok[n++] = ch;
        }
        tok[n] = 0;
        if (json_is_object(cur))
            cur = json_object_get(cur, tok);
        else if (json_is_array(cur)) {
            char *end;
            long ix = strtol(tok, &end, 10);
            cur = *end || n == 0 ? NULL : json_array_get(cur, (size_t)ix);
        } else
            cur = NULL;
        if (!cur) return NULL;
    }
    return *p ? NULL : cur;
}

static int compile_type(cctx *c, const json_t *s, const char *type, const char *path) {
    grammar *g = c->g;
    char sub[512];
    if (!strcmp(type, "string")) {
        int lo = get_count(c, s, "minLength", 0, path), hi = get_count(c, s, "maxLength", -1, path);
        if (lo == -2 || hi == -2) return -1;
        if (hi >= 0 && lo > hi)
            return fail(c, CINFER_EINVAL, "JSON Schema: minLength > maxLength at %s%s", path, "");
        return str_node(g, lo, hi);
    }
    if (!strcmp(type, "number")) return num_node(g, 0);
    if (!strcmp(type, "integer")) return num_node(g, 1);
    if (!strcmp(type, "boolean")) return alt2(g, lit(g, "true"), lit(g, "false"));
    if (!strcmp(type, "null")) return lit(g, "null");
    if (!strcmp(type, "array")) {
        const json_t *items = json_object_get(s, "items");
        int lo = get_count(c, s, "minItems", 0, path), hi = get_count(c, s, "maxItems", -1, path);
        if (lo == -2 || hi == -2) return -1;
        if (hi >= 0 && lo > hi)
            return fail(c, CINFER_EINVAL, "JSON Schema: minItems > maxItems at %s%s", path, "");
        if (json_is_array(items))
            return fail(c, CINFER_EINVAL,
                        "unsupported JSON Schema keyword 'items' as an array (tuple) at %s%s", path, "");
        int item;
        if (items) {
            snprintf(sub, sizeof sub, "%s/items", path);
            if ((item = compile(c, items, sub)) < 0) return -1;
        } else
            item = any_value(c);
        return array_node(g, item, lo, hi);
    }
    if (!strcmp(type, "object")) {
        const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required"),
                     *ap = json_object_get(s, "additionalProperties");
        if (props && !json_is_object(props))
            return fail(c, CINFER_EINVAL, "JSON Schema: 'properties' at %s must be an object%s", path, "");
        if (req && !json_is_array(req))
            return fail(c, CINFER_EINVAL, "JSON Schema: 'required' at %s must be an array%s", path, "");
        size_t n = props ? json_object_size(props) : 0;
        const char **keys = xcalloc(n + 1, sizeof *keys);
        int *vals = xcalloc(n + 1, sizeof *vals), *reqd = xcalloc(n + 1, sizeof *reqd), rc = 0;
        size_t i = 0;
        const char *k;
        const json_t *v;
        if (props) {
            /* jansson keeps insertion order: the order the schema lists the properties in */
            json_object_foreach((json_t *)props, k, v) {
                keys[i] = k;
                snprintf(sub, sizeof sub, "%s/properties/%s", path, k);
                if ((vals[i] = compile(c, v, sub)) < 0) {
                    rc = -1;
                    break;
                }
                i++;
            }
        }
        size_t ri;
        const json_t *rv;
        if (!rc && req) json_array_foreach(req, ri, rv) {
                if (!json_is_string(rv)) {
                    rc =
                        fail(c, CINFER_EINVAL, "JSON Schema: 'required' at %s must list strings%s", path, "");
                    break;
                }
                size_t j = 0;
                while (j < n && strcmp(keys[j], json_string_value(rv))) j++;
                if (j == n) {
                    rc = fail(c, CINFER_EINVAL,
                              "JSON Schema: required property '%s' is not in 'properties' at %s",
                              json_string_value(rv), path);
                    break;
                }
                reqd[j] = 1;
            }
        int addl = -1;
        if (!rc && ap && !json_is_boolean(ap)) {
            snprintf(sub, sizeof sub, "%s/additionalProperties", path);
            if ((addl = compile(c, ap, sub)) < 0) rc = -1;
        } else if (!rc && n == 0 && !json_is_false(ap)) {
            /* an object that declares nothing may hold anything; with properties declared, only those are
             * written (as OpenAI's strict mode), unless additionalProperties gives a schema */
            addl = any_value(c);
        }
        int node = rc ? -1 : object_node(c, (int)n, keys, vals, reqd, addl);
        free(keys), free(vals), free(reqd);
        return node;
    }
    return fail(c, CINFER_EINVAL, "JSON Schema: unknown type '%s' at %s", type, path);
}

static const char *const known_keys[] = {
    "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "minLength",
    "maxLength", "enum", "const", "anyOf", "oneOf", "$ref", "$defs", "definitions",
    /* annotations: they do not constrain the value */
    "title", "description", "default", "examples", "$schema", "$id", "$comment", NULL};

static int compile(cctx *c, const json_t *s, const char *path) {
    grammar *g = c->g;
    char sub[512];
    if (json_is_true(s)) return any_value(c);
    if (json_is_false(s))
        return fail(c, CINFER_EINVAL, "JSON Schema: the schema at %s is false (nothing matches)%s", path, "");
    if (!json_is_object(s))
        return fail(c, CINFER_EINVAL, "JSON Schema: the schema at %s is not an object%s", path, "");
    if (c->depth >= MAX_SCHEMA_DEPTH)
        return fail(c, CINFER_EINVAL, "JSON Schema: nested deeper than 64 at %s%s", path, "");
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)s, k, v) {
        int ok = 0;
        for (int i = 0; known_keys[i]; i++) ok |= !strcmp(known_keys[i], k);
        if (!ok) return fail(c, CINFER_EINVAL, "unsupported JSON Schema keyword '%s' at %s", k, path);
    }
    c->depth++;
    int node = -1;
    const json_t *ref = json_object_get(s, "$ref"), *en = json_object_get(s, "enum"),
                 *cn = json_object_get(s, "const"), *any = json_object_get(s, "anyOf"),
                 *one = json_object_get(s, "oneOf"), *type = json_object_get(s, "type");
    if (!any) any = one; /* oneOf as anyOf: exclusivity is not enforced */
    if (ref) {
        if (!json_is_string(ref)) {
            node = fail(c, CINFER_EINVAL, "JSON Schema: '$ref' at %s must be a string%s", path, "");
            goto out;
        }
        const char *r = json_string_value(ref);
        const json_t *memo = json_object_get(c->refs, r);
        if (memo) {
            node = (int)json_integer_value(memo);
            goto out;
        }
        const json_t *target = resolve(c, r);
        if (!target) {
            node = fail(c, CINFER_EINVAL,
                        "JSON Schema: '$ref' \"%.200s\" at %s does not resolve in the document", r, path);
            goto out;
        }
        /* a placeholder first, so recursive references find it; it becomes a one-child sequence */
        int ph = add_node(g, G_SEQ);
        json_object_set_new(c->refs, r, json_integer(ph));
        int body = compile(c, target, r);
        if (body < 0) goto out;
        g->nodes[ph].kids = xmalloc(sizeof(int));
        g->nodes[ph].kids[0] = body;
        g->nodes[ph].n = 1;
        node = ph;
    } else if (cn) {
        node = json_lit(c, cn);
    } else if (en) {
        if (!json_is_array(en) || json_array_size(en) == 0) {
            node = fail(c, CINFER_EINVAL, "JSON Schema: 'enum' at %s must be a non-empty array%s", path, "");
            goto out;
        }
        size_t n = json_array_size(en), i;
        char **strs = xcalloc(n, sizeof *strs);
        size_t *lens = xcalloc(n, sizeof *lens);
        const json_t *e;
        json_array_foreach(en, i, e) {
            strs[i] = json_dumps(e, JSON_ENCODE_ANY | JSON_COMPACT);
            lens[i] = strs[i] ? strlen(strs[i]) : 0;
        }
        node = litset(g, (const char *const *)strs, lens, (int)n);
        for (i = 0; i < n; i++) free(strs[i]);
        free(strs), free(lens);
    } else if (any) {
        if (!json_is_array(any) || json_array_size(any) == 0) {
            node = fail(c, CINFER_EINVAL, "JSON Schema: 'anyOf' / 'oneOf' at %s must be a non-empty array%s",
                        path, "");
            goto out;
        }
        size_t n = json_array_size(any), i;
        int *kids = xmalloc(sizeof(int) * n);
        const json_t *e;
        json_array_foreach(any, i, e) {
            snprintf(sub, sizeof sub, "%s/anyOf/%zu", path, i);
            if ((kids[i] = compile(c, e, sub)) < 0) {
                free(kids);
                goto out;
            }
        }
        node = list(g, G_ALT, kids, (int)n);
        free(kids);
    } else if (json_is_string(type)) {
        node = compile_type(c, s, json_string_value(type), path);
    } else if (json_is_array(type) && json_array_size(type) > 0) {
        size_t n = json_array_size(type), i;
        int *kids = xmalloc(sizeof(int) * n);
        const json_t *e;
        json_array_foreach(type, i, e) {
            if (!json_is_string(e) || (kids[i] = compile_type(c, s, json_string_value(e), path)) < 0) {
                if (!json_is_string(e))
                    fail(c, CINFER_EINVAL, "JSON Schema: 'type' at %s must list strings%s", path, "");
                free(kids);
                goto out;
            }
        }
        node = list(g, G_ALT, kids, (int)n);
        free(kids);
    } else if (type) {
        node = fail(c, CINFER_EINVAL, "JSON Schema: 'type' at %s must be a string or an array%s", path, "");
    } else if (json_object_get(s, "properties") || json_object_get(s, "additionalProperties") ||
               json_object_get(s, "required")) {
        node = compile_type(c, s, "object", path);
    } else if (json_object_get(s, "items") || json_object_get(s, "minItems") ||
               json_object_get(s, "maxItems")) {
        node = compile_type(c, s, "array", path);
    } else if (json_object_get(s, "minLength") || json_object_get(s, "maxLength")) {
        node = compile_type(c, s, "string", path);
    } else {
        node = any_value(c);
    }
out:
    c->depth--;
    return node;
}

/* The reasoning the model may write before the constrained text. */
static int with_reasoning(grammar *g, int body, int reasoning) {
    if (reasoning == GM_REASON_INSIDE) return seq3(g, raw(g, "</think>", 0, -1), ws(g), body);
    if (reasoning == GM_REASON_OPTIONAL)
        return alt2(g, list(g, G_SEQ, (int[]){lit(g, "<think>"), raw(g, "</think>", 0, -1), ws(g), body}, 4),
                    body);
    return body;
}

static grammar *new_grammar(void) {
    return xcalloc(1, sizeof(grammar));
}

static int live(const grammar *g);

int grammar_compile_json(const char *schema, size_t len, int reasoning, grammar **out, char *err,
                         size_t errlen) {
    *out = NULL;
    json_t *root = NULL;
    if (schema) {
        json_error_t je;
        root = json_loadb(schema, len, JSON_DECODE_ANY, &je);
        if (!root) return ci_err(err, errlen, CINFER_EINVAL, "JSON Schema: not JSON (%s)", je.text);
    }
    grammar *g = new_grammar();
    cctx c = {g, root, json_object(), -1, 0, err, errlen};
    int body;
    if (root) {
        body = compile(&c, root, "#");
    } else {
        body = object_node(&c, 0, NULL, NULL, NULL, any_value(&c));
    }
    json_decref(c.refs);
    json_decref(root);
    if (body < 0) {
        grammar_free(g);
        return CINFER_EINVAL;
    }
    g->root = with_reasoning(g, body, reasoning);
    if (!live(g)) {
        grammar_free(g);
        return ci_err(err, errlen, CINFER_EINVAL,
                      "JSON Schema: nothing can match it (a $ref that only refers to itself?)");
    }
    *out = g;
    return 0;
}

/* One XML parameter value: string parameters are raw text (the tool-call parser keeps them as they are),
 * everything else JSON (the parser converts it by the schema). */
static int xml_param(cctx *c, const char *pname, const json_t *ps, const char *path) {
    grammar *g = c->g;
    char open[600];
    snprintf(open, sizeof open, "<parameter=%s>\n", pname);
    const json_t *type = json_is_object(ps) ? json_object_get(ps, "type") : NULL;
    const json_t *en = json_is_object(ps) ? json_object_get(ps, "enum") : NULL;
    int is_str = json_is_string(type) && !strcmp(json_string_value(type), "string");
    int no_type = json_is_object(ps) && !type && !json_object_get(ps, "anyOf") &&
                  !json_object_get(ps, "oneOf") && !json_object_get(ps, "$ref");
    if ((is_str || no_type) && json_is_array(en) && json_array_size(en) > 0) {
        size_t n = json_array_size(en), i;
        int all_str = 1;
        const json_t *e;
        json_array_foreach(en, i, e) all_str &= json_is_string(e);
        if (all_str) {
            /* each value with the closing tag: no value is then a prefix of another */
            char **strs = xcalloc(n, sizeof *strs);
            size_t *lens = xcalloc(n, sizeof *lens);
            json_array_foreach(en, i, e) {
                size_t l = json_string_length(e);
                strs[i] = xmalloc(l + 16);
                memcpy(strs[i], json_string_value(e), l);
                memcpy(strs[i] + l, "\n</parameter>\n", 14);
                lens[i] = l + 14;
            }
            int a = litset(g, (const char *const *)strs, lens, (int)n);
            for (i = 0; i < n; i++) free(strs[i]);
            free(strs), free(lens);
            return seq2(g, lit(g, open), a);
        }
    }
    if (is_str) {
        /* check the keywords all the same, so an unsupported one is refused as for JSON */
        if (compile(c, ps, path) < 0) return -1;
        int lo = get_count(c, ps, "minLength", 0, path), hi = get_count(c, ps, "maxLength", -1, path);
        if (lo == -2 || hi == -2) return -1;
        return seq3(g, lit(g, open), raw(g, "\n</parameter>", lo, hi), lit(g, "\n"));
    }
    int v = compile(c, ps, path);
    if (v < 0) return -1;
    return seq3(g, lit(g, open), v, lit(g, "\n</parameter>\n"));
}

/* One tool's call after its name: *name_lit gets what the name is written as (with what follows it up to
 * the arguments), the return value is the node for the rest of the call. */
static int tool_call(cctx *c, const char *name, const json_t *params, int xml, char *name_lit, size_t cap) {
    grammar *g = c->g;
    c->root = params;
    json_object_clear(c->refs); /* refs are per document */
    c->any = -1;
    if (!xml) {
        json_t *nm = json_string(name);
        char *q = json_dumps(nm, JSON_ENCODE_ANY);
        json_decref(nm);
        snprintf(name_lit, cap, "%s, \"arguments\": ", q);
        free(q);
        int args;
        if (!params) {
            args = object_node(c, 0, NULL, NULL, NULL, any_value(c));
        } else {
            const json_t *t = json_is_object(params) ? json_object_get(params, "type") : NULL;
            if (t && !(json_is_string(t) && !strcmp(json_string_value(t), "object")))
                return fail(c, CINFER_EINVAL, "tool '%s': parameters must be an object schema%s", name, "");
            if ((args = compile(c, params, "#")) < 0) return -1;
        }
        return seq2(g, args, lit(g, "}\n</tool_call>"));
    }
    snprintf(name_lit, cap, "%s>\n", name);
    int body = empty(g);
    const json_t *props = json_is_object(params) ? json_object_get(params, "properties") : NULL;
    const json_t *req = json_is_object(params) ? json_object_get(params, "required") : NULL;
    if (params) {
        const char *k;
        const json_t *v;
        json_object_foreach((json_t *)params, k, v) {
            if (strcmp(k, "type") && strcmp(k, "properties") && strcmp(k, "required") &&
                strcmp(k, "additionalProperties") && strcmp(k, "$defs") && strcmp(k, "definitions") &&
                strcmp(k, "title") && strcmp(k, "description") && strcmp(k, "$schema") && strcmp(k, "$id"))
                return fail(c, CINFER_EINVAL,
                            "unsupported JSON Schema keyword '%s' in the parameters of tool '%s'", k, name);
        }
    }
    if (json_is_object(props)) {
        size_t n = json_object_size(props), i = 0;
        int *pn = xmalloc(sizeof(int) * (n + 1)), *reqd = xcalloc(n + 1, sizeof(int));
        const char *k;
        const json_t *v;
        json_object_foreach((json_t *)props, k, v) {
            char path[300];
            snprintf(path, sizeof path, "#/properties/%s", k);
            size_t ri;
            const json_t *rv;
            if (json_is_array(req))
                json_array_foreach(req, ri, rv) reqd[i] |=
                    json_is_string(rv) && !strcmp(json_string_value(rv), k);
            if ((pn[i] = xml_param(c, k, v, path)) < 0) {
                free(pn), free(reqd);
                return -1;
            }
            i++;
        }
        /* the parameters in the schema's order; optional ones may be left out */
        for (size_t j = n; j-- > 0;) {
            int with = seq2(g, pn[j], body);
            body = reqd[j] ? with : alt2(g, with, body);
        }
        free(pn), free(reqd);
    }
    return seq2(g, body, lit(g, "</function>\n</tool_call>"));
}

int grammar_compile_tools(const char *tools_json, size_t len, int xml, const char *name, int reasoning,
                          grammar **out, char *err, size_t errlen) {
    *out = NULL;
    json_error_t je;
    json_t *tools = tools_json ? json_loadb(tools_json, len, 0, &je) : NULL;
    if (!json_is_array(tools) || json_array_size(tools) == 0) {
        json_decref(tools);
        return ci_err(err, errlen, CINFER_EINVAL, "tool_choice: the request has no tools to call");
    }
    grammar *g = new_grammar();
    cctx c = {g, NULL, json_object(), -1, 0, err, errlen};
    size_t n = json_array_size(tools), i;
    int *calls = xmalloc(sizeof(int) * n), n_calls = 0, rc = 0;
    char **names = xcalloc(n, sizeof *names);
    size_t *name_lens = xcalloc(n, sizeof *name_lens);
    const json_t *t;
    json_array_foreach(tools, i, t) {
        const json_t *f = json_is_object(t) ? json_object_get(t, "function") : NULL;
        if (!json_is_object(f)) f = t;
        const json_t *nm = json_is_object(f) ? json_object_get(f, "name") : NULL;
        if (!json_is_string(nm)) {
            rc = ci_err(err, errlen, CINFER_EINVAL, "tools[%zu] has no name", i);
            break;
        }
        if (name && strcmp(name, json_string_value(nm))) continue;
        const json_t *params = json_object_get(f, "parameters");
        if (!params) params = json_object_get(f, "input_schema");
        if (json_is_null(params)) params = NULL;
        char nl[600];
        int call = tool_call(&c, json_string_value(nm), params, xml, nl, sizeof nl);
        if (call < 0) {
            rc = CINFER_EINVAL;
            break;
        }
        names[n_calls] = xstrdup(nl);
        name_lens[n_calls] = strlen(nl);
        calls[n_calls++] = call;
        if (name) break;
    }
    if (!rc && n_calls == 0)
        rc = ci_err(err, errlen, CINFER_EINVAL, "tool_choice names '%.200s', which is not among the tools",
                    name);
    if (!rc) {
        /* the opening, then the names as one trie, each going on into its own arguments: any number of
         * tools costs one stack */
        int one = seq2(g, lit(g, xml ? "<tool_call>\n<function=" : "<tool_call>\n{\"name\": "),
                       litset_cont(g, (const char *const *)names, name_lens, calls, n_calls));
        int body = name ? one : rep(g, one, lit(g, "\n"), 1, MAX_CALLS);
        g->root = with_reasoning(g, body, reasoning);
        if (!live(g))
            rc = ci_err(
                err, errlen, CINFER_EINVAL,
                "tool_choice: the tools' schemas cannot be matched (a $ref that only refers to itself?)");
    }
    for (int k = 0; k < n_calls; k++) free(names[k]);
    free(names), free(name_lens);
    free(calls);
    json_decref(c.refs);
    json_decref(tools);
    if (rc) {
        grammar_free(g);
        return rc;
    }
    *out = g;
    return 0;
}

/* ---------------------------------------------------------------- the matcher */

typedef struct {
    int32_t node, a, b, c;
} gframe;

#define MAX_STACKS     64
#define MAX_FRAMES     1024
#define MAX_DEPTH      96
#define EXPAND_BUDGET  4096 /* expansion steps per byte: bounds what a pathological grammar can cost */
#define MAX_FORK_DEPTH 48   /* nested alternatives expanded at once (a left-recursive $ref would not end) */
#define MAX_REC        8    /* lexemes that may end, handing one byte on, in a row */

/* A set of stacks: stack i is f[off[i]..off[i+1]), bottom first. */
typedef struct {
    int n;
    int off[MAX_STACKS + 1];
    gframe f[MAX_FRAMES];
} gset;

/* gm_mask's memo: the state it was asked about (its stacks, serialised) and its answer. Inside unbounded
 * text the state repeats step after step, so the walk runs once for it. */
#define MASK_CACHE 8
typedef struct {
    int used;
    uint64_t hash;
    int n_frames, n_stacks, count;
    int off[MAX_STACKS + 1];
    gframe *f;      /* [MAX_FRAMES] */
    uint32_t *mask; /* [words] */
} mask_memo;

struct gm_matcher {
    const grammar *g;
    gset cur;
    mask_memo memo[MASK_CACHE];
    int memo_next;
    const gm_vocab *memo_vocab; /* the vocabulary the memo's masks are for */
    gset *levels;               /* [GM_MAX_TOKEN_BYTES + 1] scratch of gm_mask, allocated on its first call */
    gset *after; /* [MAX_REC + 1] scratch of feed_stack: the stacks after a lexeme that may end */
    int budget;  /* expansion steps left for this byte */
    int rdepth;  /* nesting of expand's forks */
};

struct gm_vocab {
    int n_tokens, n;
    int32_t *order; /* [n] token ids sorted by their bytes */
    uint16_t *lcp;  /* [n] bytes shared with the previous token in that order */
    uint32_t *off;  /* [n + 1] into bytes, in sorted order */
    unsigned char *bytes;
};

static void set_add(gset *s, const gframe *st, int d) {
    for (int i = 0; i < s->n; i++)
        if (s->off[i + 1] - s->off[i] == d && !memcmp(s->f + s->off[i], st, sizeof(gframe) * (size_t)d))
            return;
    if (s->n == MAX_STACKS || s->off[s->n] + d > MAX_FRAMES) return; /* dropped: narrows, never widens */
    memcpy(s->f + s->off[s->n], st, sizeof(gframe) * (size_t)d);
    s->off[s->n + 1] = s->off[s->n] + d;
    s->n++;
}

static gframe frame(int node) {
    return (gframe){node, 0, 0, 0};
}

/* Runs the non-consuming nodes at the top of st (depth d) and adds the resulting stacks to out. */
static void expand(gm_matcher *m, gframe *st, int d, gset *out) {
    const grammar *g = m->g;
    for (;;) {
        if (--m->budget < 0) return;
        if (d == 0) {
            set_add(out, st, 0);
            return;
        }
        gframe *f = &st[d - 1];
        const gnode *nd = &g->nodes[f->node];
        switch (nd->kind) {
        case G_LIT:
            if (f->a >= nd->n) {
                d--;
                continue;
            }
            set_add(out, st, d);
            return;
        case G_SEQ:
            if (f->a >= nd->n) {
                d--;
                continue;
            }
            {
                int kid = nd->kids[f->a++];
                if (f->a == nd->n) {
                    *f = frame(kid); /* the last child replaces its sequence: repeats stay flat */
                } else {
                    if (d == MAX_DEPTH) return;
                    st[d++] = frame(kid);
                }
            }
            continue;
        case G_ALT: {
            if (m->rdepth >= MAX_FORK_DEPTH) return;
            gframe copy[MAX_DEPTH];
            m->rdepth++;
            for (int i = 0; i < nd->n; i++) {
                memcpy(copy, st, sizeof(gframe) * (size_t)d);
                copy[d - 1] = frame(nd->kids[i]);
                expand(m, copy, d, out);
            }
            m->rdepth--;
            return;
        }
        case G_REP: {
            int cnt = f->a, can_end = cnt >= nd->lo, can_more = nd->hi < 0 || cnt < nd->hi;
            if (can_end && can_more && m->rdepth < MAX_FORK_DEPTH) {
                gframe copy[MAX_DEPTH];
                memcpy(copy, st, sizeof(gframe) * (size_t)(d - 1));
                m->rdepth++;
                expand(m, copy, d - 1, out);
                m->rdepth--;
            } else if (can_end) {
                d--;
                continue;
            }
            if (!can_more) return;
            f->a++;
            int sep = cnt > 0 ? nd->kids[1] : -1;
            if (d + 1 + (sep >= 0) > MAX_DEPTH) return;
            st[d++] = frame(nd->kids[0]);
            if (sep >= 0) st[d++] = frame(sep);
            continue;
        }
        default: /* a lexeme */
            set_add(out, st, d);
            return;
        }
    }
}

/* For a raw-text terminator: the longest prefix of t that ends the text t[0..a) + x. */
static int kmp_next(const char *t, int a, unsigned char x) {
    for (int k = a + 1; k > 0; k--) {
        /* candidate: t[0..k) == (t[0..a) + x)[a+1-k .. a+1) */
        if ((unsigned char)t[k - 1] != x) continue;
        if (!memcmp(t, t + (a + 1 - k), (size_t)(k - 1))) return k;
    }
    return 0;
}

/* UTF-8: the continuation bytes a lead byte needs (-1: not a lead) and the allowed range of the first
 * one (overlongs, surrogates and code points past U+10FFFF excluded, as RFC 3629). */
static int utf8_lead(unsigned char x, int *lo, int *hi) {
    *lo = 0x80, *hi = 0xBF;
    if (x >= 0xC2 && x <= 0xDF) return 1;
    if (x >= 0xE0 && x <= 0xEF) {
        if (x == 0xE0) *lo = 0xA0;
        if (x == 0xED) *hi = 0x9F;
        return 2;
    }
    if (x >= 0xF0 && x <= 0xF4) {
        if (x == 0xF0) *lo = 0x90;
        if (x == 0xF4) *hi = 0x8F;
        return 3;
    }
    return -1;
}

/* A UTF-8 step inside text: c holds (pending continuations << 16 | lo << 8 | hi). Returns 1 when x was
 * taken as part of a multi-byte character (c updated, *newchar set when it started one), 0 when x is
 * ASCII with nothing pending, -1 when invalid. */
static int utf8_step(int32_t *c, unsigned char x, int *newchar) {
    int pend = *c >> 16, lo = (*c >> 8) & 0xFF, hi = *c & 0xFF;
    *newchar = 0;
    if (pend) {
        if (x < lo || x > hi) return -1;
        pend--;
        *c = pend ? (pend << 16) | (0x80 << 8) | 0xBF : 0;
        return 1;
    }
    if (x < 0x80) return 0;
    int n = utf8_lead(x, &lo, &hi);
    if (n < 0) return -1;
    *c = (n << 16) | (lo << 8) | hi;
    *newchar = 1;
    return 1;
}

static int is_hex(unsigned char x) {
    return (x >= '0' && x <= '9') || ((x | 32) >= 'a' && (x | 32) <= 'f');
}

/* The lexeme f takes byte x: 0 refused, 1 taken (more to come), 2 taken and the lexeme is complete, 3 taken
 * and the lexeme is replaced by its continuation (a literal set's). */
static int consume(const gnode *nd, gframe *f, unsigned char x) {
    int nc;
    switch (nd->kind) {
    case G_LIT:
        if ((unsigned char)nd->lit[f->a] != x) return 0;
        return ++f->a == nd->n ? 2 : 1;
    case G_SET: { /* a: the trie node reached */
        int ch = nd->kids[f->a * 4 + 1];
        while (ch >= 0 && nd->kids[ch * 4] != x) ch = nd->kids[ch * 4 + 2];
        if (ch < 0) return 0;
        f->a = ch;
        int end = nd->kids[ch * 4 + 3];
        if (end >= 2) return 3; /* a literal with its own continuation (names are prefix-free with theirs) */
        /* a literal ends here and none goes on: complete; ends but others go on: may_end decides */
        return end && nd->kids[ch * 4 + 1] < 0 ? 2 : 1;
    }
    case G_WS:
        if (f->a >= nd->hi || !(x == ' ' || x == '\n' || x == '\t' || x == '\r')) return 0;
        f->a++;
        return 1;
    case G_STR: /* a: 0 before the quote, 1 in the body, 2 after a backslash, 10+k k hex digits to go; b chars
                 */
        if (f->a == 0) return x == '"' ? (f->a = 1) : 0;
        if (f->a == 2) {
            if (x == 'u') return f->a = 14, 1;
            if (!strchr("\"\\/bfnrt", x) || !x) return 0;
            return f->a = 1, 1;
        }
        if (f->a > 10) {
            if (!is_hex(x)) return 0;
            f->a = f->a == 11 ? 1 : f->a - 1;
            return 1;
        }
        if (f->c) { /* inside a multi-byte character */
            return utf8_step(&f->c, x, &nc) == 1 ? 1 : 0;
        }
        if (x == '"') return f->b >= nd->lo ? 2 : 0;
        if (nd->hi >= 0 && f->b >= nd->hi) return 0;
        if (x < 0x20) return 0;
        /* characters are counted only when a bound needs them: unbounded text then stays in one state,
           which is what lets gm_mask reuse its answer from step to step */
        int counted = nd->lo > 0 || nd->hi >= 0;
        if (x == '\\') return f->b += counted, f->a = 2, 1;
        if (utf8_step(&f->c, x, &nc) < 0) return 0;
        f->b += counted;
        return 1;
    case G_RAW: { /* a: terminator bytes matched; b: chars of text; c: UTF-8 state */
        if (f->c) return utf8_step(&f->c, x, &nc) == 1 ? 1 : 0;
        int na = x < 0x80 ? kmp_next(nd->lit, f->a, x) : 0;
        if (na == nd->n) return f->b >= nd->lo ? 2 : 0;
        /* bytes that left the partial terminator match are text now */
        int add = f->a + 1 - na;
        if (x >= 0x80) {
            if (utf8_step(&f->c, x, &nc) < 0) return 0;
            add = f->a + 1;
        }
        if (nd->hi >= 0 && f->b + add > nd->hi) return 0;
        if (nd->lo > 0 || nd->hi >= 0) f->b += add; /* counted only when bounded, as for strings */
        f->a = na;
        return 1;
    }
    case G_NUM: { /* a: 0 start, 1 after '-', 2 int digits, 3 a leading 0, 4 after '.', 5 fraction, 6 after
                     e, 7 after the exponent sign, 8 exponent digits; b: digits; c: exponent digits */
        int dig = x >= '0' && x <= '9', integer = nd->lo;
        switch (f->a) {
        case 0:
        case 1:
            if (x == '-' && f->a == 0) return f->a = 1, 1;
            if (!dig) return 0;
            f->b = 1;
            return f->a = x == '0' ? 3 : 2, 1;
        case 2:
        case 3:
        case 5:
            if (dig && f->a != 3) return f->b < NUM_MAX_DIGITS ? (f->b++, 1) : 0;
            if (integer) return 0;
            if (x == '.' && f->a != 5) return f->a = 4, 1;
            if (x == 'e' || x == 'E') return f->a = 6, 1;
            return 0;
        case 4:
            if (!dig || f->b >= NUM_MAX_DIGITS) return 0;
            f->b++;
            return f->a = 5, 1;
        case 6:
            if (x == '+' || x == '-') return f->a = 7, 1;
            /* fall through */
        case 7:
        case 8:
            if (!dig || f->c >= 2) return 0; /* e±99 at most: always a finite double */
            f->c++;
            return f->a = 8, 1;
        }
        return 0;
    }
    }
    return 0;
}

/* Whether the lexeme may end here (the next byte can belong to what follows). */
static int may_end(const gnode *nd, const gframe *f) {
    if (nd->kind == G_WS) return 1;
    if (nd->kind == G_SET) return nd->kids[f->a * 4 + 3] == 1;
    if (nd->kind == G_NUM) return f->a == 2 || f->a == 3 || f->a == 5 || f->a == 8;
    return 0;
}

static void feed_stack(gm_matcher *m, const gframe *st, int d, unsigned char x, gset *out, int rec) {
    if (d == 0 || rec > MAX_REC) return;
    gframe copy[MAX_DEPTH];
    const gnode *nd = &m->g->nodes[st[d - 1].node];
    memcpy(copy, st, sizeof(gframe) * (size_t)d);
    int r = consume(nd, &copy[d - 1], x);
    if (r == 1) {
        set_add(out, copy, d);
    } else if (r == 2) {
        expand(m, copy, d - 1, out);
    } else if (r == 3) {
        copy[d - 1] = frame(nd->kids[copy[d - 1].a * 4 + 3] - 2);
        expand(m, copy, d, out);
    }
    if (may_end(nd, &st[d - 1])) {
        /* the lexeme ends here and x starts what follows it */
        gset *after = &m->after[rec];
        after->n = 0;
        after->off[0] = 0;
        memcpy(copy, st, sizeof(gframe) * (size_t)(d - 1));
        expand(m, copy, d - 1, after);
        for (int i = 0; i < after->n; i++)
            feed_stack(m, after->f + after->off[i], after->off[i + 1] - after->off[i], x, out, rec + 1);
    }
}

static void feed_set(gm_matcher *m, const gset *in, unsigned char x, gset *out) {
    out->n = 0;
    out->off[0] = 0;
    m->budget = EXPAND_BUDGET;
    for (int i = 0; i < in->n; i++) feed_stack(m, in->f + in->off[i], in->off[i + 1] - in->off[i], x, out, 0);
}

gm_matcher *gm_matcher_create(const grammar *g) {
    gm_matcher *m = xcalloc(1, sizeof *m);
    m->g = g;
    m->after = xmalloc(sizeof(gset) * (MAX_REC + 1));
    gframe st[MAX_DEPTH] = {frame(g->root)}; /* expand pushes in place */
    m->budget = EXPAND_BUDGET;
    expand(m, st, 1, &m->cur);
    return m;
}

void gm_matcher_free(gm_matcher *m) {
    if (!m) return;
    for (int i = 0; i < MASK_CACHE; i++) free(m->memo[i].f), free(m->memo[i].mask);
    free(m->levels), free(m->after);
    free(m);
}

int gm_feed(gm_matcher *m, const char *bytes, size_t n) {
    gset *a = xmalloc(sizeof *a), *b = xmalloc(sizeof *b);
    *a = m->cur;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        feed_set(m, a, (unsigned char)bytes[i], b);
        if (b->n == 0) rc = -1;
        gset *t = a;
        a = b, b = t;
    }
    if (!rc) m->cur = *a;
    free(a), free(b);
    return rc;
}

/* A grammar whose start expands to nothing (left recursion through $ref, or too wide) matches nothing. */
static int live(const grammar *g) {
    gm_matcher *m = gm_matcher_create(g);
    int ok = m->cur.n > 0;
    gm_matcher_free(m);
    return ok;
}

/* Whether the stack can end without more bytes: it is empty, or its top lexeme may end and what follows
 * can end too. */
static int can_finish(gm_matcher *m, const gframe *st, int d, int rec) {
    if (d == 0) return 1;
    if (rec > MAX_REC || !may_end(&m->g->nodes[st[d - 1].node], &st[d - 1])) return 0;
    gset *after = &m->after[rec];
    gframe copy[MAX_DEPTH];
    memcpy(copy, st, sizeof(gframe) * (size_t)(d - 1));
    after->n = 0;
    after->off[0] = 0;
    m->budget = EXPAND_BUDGET;
    expand(m, copy, d - 1, after);
    for (int i = 0; i < after->n; i++)
        if (can_finish(m, after->f + after->off[i], after->off[i + 1] - after->off[i], rec + 1)) return 1;
    return 0;
}

int gm_complete(gm_matcher *m) {
    for (int i = 0; i < m->cur.n; i++)
        if (can_finish(m, m->cur.f + m->cur.off[i], m->cur.off[i + 1] - m->cur.off[i], 0)) return 1;
    return 0;
}

static int mask_walk(gm_matcher *m, const gm_vocab *v, uint32_t *mask);

/* The masking below shares work between tokens the way a trie walk would: in sorted order, a token
 * shares its first lcp bytes with the one before, so the states after those bytes are still in levels[];
 * and once a prefix is refused, every following token that starts with it is skipped. */
static uint64_t set_hash(const gset *s) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)s->n;
    const unsigned char *p = (const unsigned char *)s->f;
    size_t n = sizeof(gframe) * (size_t)s->off[s->n];
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    for (int i = 0; i <= s->n; i++) h = (h ^ (uint64_t)s->off[i]) * 1099511628211ull;
    return h;
}

static mask_memo *memo_find(gm_matcher *m, const gm_vocab *v, uint64_t h) {
    if (m->memo_vocab != v) return NULL;
    const gset *s = &m->cur;
    for (int i = 0; i < MASK_CACHE; i++) {
        mask_memo *e = &m->memo[i];
        if (e->used && e->hash == h && e->n_stacks == s->n && e->n_frames == s->off[s->n] &&
            !memcmp(e->off, s->off, sizeof(int) * (size_t)(s->n + 1)) &&
            !memcmp(e->f, s->f, sizeof(gframe) * (size_t)e->n_frames))
            return e;
    }
    return NULL;
}

static void memo_store(gm_matcher *m, const gm_vocab *v, uint64_t h, const uint32_t *mask, int count) {
    size_t words = (size_t)(v->n_tokens + 31) / 32;
    if (m->memo_vocab != v) {
        for (int i = 0; i < MASK_CACHE; i++) m->memo[i].used = 0;
        m->memo_vocab = v;
    }
    mask_memo *e = &m->memo[m->memo_next];
    m->memo_next = (m->memo_next + 1) % MASK_CACHE;
    if (!e->f) e->f = xmalloc(sizeof(gframe) * MAX_FRAMES);
    if (!e->mask) e->mask = xmalloc(sizeof(uint32_t) * words); /* one vocabulary per matcher in practice */
    const gset *s = &m->cur;
    e->used = 1;
    e->hash = h;
    e->n_stacks = s->n;
    e->n_frames = s->off[s->n];
    memcpy(e->off, s->off, sizeof(int) * (size_t)(s->n + 1));
    memcpy(e->f, s->f, sizeof(gframe) * (size_t)e->n_frames);
    memcpy(e->mask, mask, sizeof(uint32_t) * words);
    e->count = count;
}

int gm_mask(gm_matcher *m, const gm_vocab *v, uint32_t *mask) {
    size_t words = (size_t)(v->n_tokens + 31) / 32;
    uint64_t h = set_hash(&m->cur);
    const mask_memo *hit = memo_find(m, v, h);
    if (hit) {
        memcpy(mask, hit->mask, sizeof(uint32_t) * words);
        return hit->count;
    }
    int count = mask_walk(m, v, mask);
    memo_store(m, v, h, mask, count);
    return count;
}

/* The walk itself. */
/* Bytes that leave a state exactly as it was: inside unbounded text (one stack, a JSON string's body or
 * raw text with no partial terminator or character pending) every ordinary byte does. Returns a table
 * (1 = such a byte) or NULL when the state has none. */
static const unsigned char *neutral_bytes(const gm_matcher *m, const gset *s, unsigned char tab[2][256],
                                          int *tab1_for) {
    if (s->n != 1 || s->off[1] == 0) return NULL;
    const gframe *f = &s->f[s->off[1] - 1];
    const gnode *nd = &m->g->nodes[f->node];
    if (nd->lo > 0 || nd->hi >= 0 || f->c) return NULL;
    if (nd->kind == G_STR && f->a == 1) return tab[0];
    if (nd->kind == G_RAW && f->a == 0) {
        int t0 = (unsigned char)nd->lit[0];
        if (*tab1_for != t0) { /* made once per terminator's first byte */
            for (int x = 0; x < 256; x++) tab[1][x] = x < 0x80 && x != t0;
            *tab1_for = t0;
        }
        return tab[1];
    }
    return NULL;
}

static int mask_walk(gm_matcher *m, const gm_vocab *v, uint32_t *mask) {
    memset(mask, 0, sizeof(uint32_t) * (size_t)((v->n_tokens + 31) / 32));
    if (!m->levels) m->levels = xmalloc(sizeof(gset) * (GM_MAX_TOKEN_BYTES + 1));
    /* lv[k]: the states after a token's first k bytes; a neutral byte makes lv[k + 1] the same set as lv[k]
     * (shared, not copied), which is most of the walk inside strings */
    const gset *lv[GM_MAX_TOKEN_BYTES + 1];
    const unsigned char *neu[GM_MAX_TOKEN_BYTES + 1];
    unsigned char tab[2][256];
    int tab1_for = -1;
    for (int x = 0; x < 256; x++) tab[0][x] = x >= 0x20 && x < 0x80 && x != '"' && x != '\\';
    m->levels[0] = m->cur;
    lv[0] = &m->levels[0];
    neu[0] = neutral_bytes(m, lv[0], tab, &tab1_for);
    int valid = 0, dead = 1 << 30, count = 0;
    for (int i = 0; i < v->n; i++) {
        int lcp = v->lcp[i], len = (int)(v->off[i + 1] - v->off[i]);
        if (lcp >= dead) continue; /* starts with a refused prefix */
        dead = 1 << 30;
        const unsigned char *b = v->bytes + v->off[i];
        int k = lcp < valid ? lcp : valid, ok = 1;
        for (; k < len; k++) {
            if (neu[k] && neu[k][b[k]]) {
                lv[k + 1] = lv[k];
                neu[k + 1] = neu[k];
                continue;
            }
            feed_set(m, lv[k], b[k], &m->levels[k + 1]);
            lv[k + 1] = &m->levels[k + 1];
            if (m->levels[k + 1].n == 0) {
                dead = k + 1;
                ok = 0;
                break;
            }
            neu[k + 1] = neutral_bytes(m, lv[k + 1], tab, &tab1_for);
        }
        valid = k;
        if (ok) {
            int32_t t = v->order[i];
            mask[t >> 5] |= 1u << (t & 31);
            count++;
        }
    }
    return count;
}

/* ---------------------------------------------------------------- the vocabulary */

static int cmp_tok(const void *pa, const void *pb, void *ud) {
    const gm_vocab *v = ud;
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    uint32_t la = v->off[a + 1] - v->off[a], lb = v->off[b + 1] - v->off[b];
    int c = memcmp(v->bytes + v->off[a], v->bytes + v->off[b], la < lb ? la : lb);
    if (c) return c;
    if (la != lb) return la < lb ? -1 : 1;
    return a < b ? -1 : a > b;
}

gm_vocab *gm_vocab_create(const char *const *tokens, const size_t *lens, int n_tokens) {
    /* first by id (for sorting), then rewritten in sorted order */
    gm_vocab tmp = {0};
    size_t total = 0;
    for (int i = 0; i < n_tokens; i++)
        if (tokens[i] && lens[i] > 0 && lens[i] <= GM_MAX_TOKEN_BYTES) total += lens[i];
    tmp.off = xmalloc(sizeof(uint32_t) * ((size_t)n_tokens + 1));
    tmp.bytes = xmalloc(total + 1);
    int32_t *ids = xmalloc(sizeof(int32_t) * ((size_t)n_tokens + 1));
    int n = 0;
    size_t o = 0;
    for (int i = 0; i < n_tokens; i++) {
        tmp.off[i] = (uint32_t)o;
        if (tokens[i] && lens[i] > 0 && lens[i] <= GM_MAX_TOKEN_BYTES) {
            memcpy(tmp.bytes + o, tokens[i], lens[i]);
            o += lens[i];
            ids[n++] = i;
        }
    }
    tmp.off[n_tokens] = (uint32_t)o;
    qsort_r(ids, (size_t)n, sizeof *ids, cmp_tok, &tmp);
    gm_vocab *v = xcalloc(1, sizeof *v);
    v->n_tokens = n_tokens;
    v->n = n;
    v->order = ids;
    v->lcp = xmalloc(sizeof(uint16_t) * ((size_t)n + 1));
    v->off = xmalloc(sizeof(uint32_t) * ((size_t)n + 1));
    v->bytes = xmalloc(total + 1);
    o = 0;
    for (int i = 0; i < n; i++) {
        int32_t t = ids[i];
        uint32_t len = tmp.off[t + 1] - tmp.off[t];
        v->off[i] = (uint32_t)o;
        memcpy(v->bytes + o, tmp.bytes + tmp.off[t], len);
        int l = 0;
        if (i > 0) {
            uint32_t pl = v->off[i] - v->off[i - 1];
            const unsigned char *p = v->bytes + v->off[i - 1], *q = v->bytes + o;
            while ((uint32_t)l < pl && (uint32_t)l < len && p[l] == q[l]) l++;
        }
        v->lcp[i] = (uint16_t)l;
        o += len;
    }
    v->off[n] = (uint32_t)o;
    free(tmp.off), free(tmp.bytes);
    return v;
}

void gm_vocab_free(gm_vocab *v) {
    if (!v) return;
    free(v->order), free(v->lcp), free(v->off), free(v->bytes);
    free(v);
}

/* jinja.h — internals of the chat-template interpreter (a Jinja2 subset): values, the arena they live in, the
 * AST, and the entry points of the parser (jinja_parse.c), the value helpers (jinja_value.c) and the evaluator
 * (jinja_eval.c). Only src/tok/template.c and the jinja_*.c files include it; the public face is template.h.
 *
 * Memory: everything a compile or a render allocates comes from one arena, freed at once at the end, so
 * values need no reference counts and an error can unwind with longjmp without leaking. The arena has a byte
 * budget: a hostile template that builds huge strings stops with an error instead of exhausting memory. */
#ifndef CI_JINJA_H
#define CI_JINJA_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

/* ---- arena ---- */
typedef struct ja_chunk ja_chunk;
typedef struct jarena {
    ja_chunk *head;
    size_t used, limit; /* bytes handed out so far; the budget */
    jmp_buf *fail;      /* where an exhausted budget unwinds to (the owner's error path) */
    char *err;          /* the owner's error buffer, for that message */
    size_t errlen;
} jarena;

void ja_init(jarena *a, size_t limit);
void ja_free(jarena *a);
void *ja_alloc(jarena *a, size_t n); /* zeroed, 16-byte aligned; longjmps to a->fail past the budget */
char *ja_strdup(jarena *a, const char *s, size_t n);

/* ---- values ---- */
typedef enum {
    JV_UNDEF = 0, /* Jinja's default Undefined: prints "", falsy, iterates empty; most other uses fail */
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST,   /* also tuples (l->tuple), which print with parentheses */
    JV_DICT,   /* insertion ordered, like Python's dict */
    JV_NS,     /* namespace(): a dict whose attributes `set ns.x = ...` may assign */
    JV_LOOP,   /* the `loop` variable of a for loop */
    JV_MACRO,  /* a macro (or the `caller` of a call block) */
    JV_FUNC,   /* a global function: range, namespace, dict, raise_exception, strftime_now, loop.cycle */
    JV_METHOD, /* a bound method of a str, list or dict, like "x".split */
} jv_type;

typedef struct jstr {
    const char *p;
    size_t n;
} jstr;

struct jlist;
struct jdict;
struct jmacro;
struct jloop;
struct jmethod;

typedef struct jv {
    uint8_t t;   /* jv_type */
    uint8_t aux; /* JV_UNDEF: how it arose (UND_*); JV_FUNC: which (FN_*) */
    uint8_t ot;  /* JV_UNDEF: the jv_type of the object a lookup failed on (JV_NONE for None) */
    union {
        int64_t i; /* JV_BOOL (0/1), JV_INT */
        double f;
        jstr s; /* JV_STR; JV_UNDEF: the name that was looked up, or the message (UND_MSG) */
        struct jlist *l;
        struct jdict *d; /* JV_DICT, JV_NS */
        struct jmacro *m;
        struct jloop *lp;
        struct jmethod *me;
    } u;
} jv;

enum { UND_NAME = 0, UND_ATTR = 1, UND_ELEM = 2, UND_MSG = 3 };

typedef struct jlist {
    size_t n, cap;
    jv *v;
    int tuple;
} jlist;

typedef struct jdict {
    size_t n, cap;
    jv *k, *v;
} jdict;

/* Constructors and helpers (jinja_value.c). */
jv jv_undef(void);
jv jv_none(void);
jv jv_bool(int b);
jv jv_int(int64_t i);
jv jv_float(double f);
jv jv_str(const char *p, size_t n); /* does not copy: p must outlive the value (arena or AST) */
jv jv_cstr(const char *s);
jv jv_list(jarena *a, size_t cap, int tuple);
jv jv_dict(jarena *a, size_t cap);
void jl_push(jarena *a, jlist *l, jv v);
jv *jd_get(const jdict *d, jv key);          /* NULL when absent */
jv *jd_get_str(const jdict *d, const char *key, size_t n);
void jd_set(jarena *a, jdict *d, jv key, jv val); /* replaces in place or appends */

int jv_truthy(jv v);
int jv_equal(jv a, jv b); /* Python ==, with True == 1 == 1.0 */
int jv_is_num(jv v);      /* int, float or bool */
double jv_num(jv v);
const char *jv_type_name(int t); /* Python's type name: "str", "dict", "NoneType", ... */

/* Growable byte buffer in the arena, for output and string building. */
typedef struct jbuf {
    jarena *a;
    char *p;
    size_t n, cap;
    size_t limit; /* 0 = no limit; past it jb_* longjmps like the arena */
} jbuf;

void jb_init(jbuf *b, jarena *a, size_t limit);
void jb_put(jbuf *b, const char *p, size_t n);
void jb_putc(jbuf *b, char c);
void jb_puts(jbuf *b, const char *s);
void jb_printf(jbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
jstr jb_str(jbuf *b); /* the bytes so far (not copied) */

/* Python str() and repr() of a value appended to b; tojson like json.dumps(ensure_ascii, indent, separators,
 * sort_keys). These return 0, or -1 with a message in msg for a value they cannot render (a macro in JSON). */
void jv_str_into(jbuf *b, jv v);
void jv_repr_into(jbuf *b, jv v);
int jv_json_into(jbuf *b, jv v, int ensure_ascii, int indent, jstr item_sep, jstr key_sep, int sort_keys, int depth,
                 char *msg, size_t msglen);
void py_float_repr(char *out, size_t outlen, double f); /* Python's repr(float): shortest round trip */

/* UTF-8 helpers: code points, by index. */
size_t u8_len(const char *p, size_t n);                 /* code points */
size_t u8_offset(const char *p, size_t n, size_t idx);  /* byte offset of code point idx (n if past the end) */
uint32_t u8_decode(const char *p, size_t n, size_t *adv); /* one code point (U+FFFD for a bad byte) */
void u8_encode(jbuf *b, uint32_t cp);

/* ---- AST ---- */
typedef enum {
    /* expressions */
    N_CONST,
    N_NAME,
    N_NSREF, /* ns.attr as an assignment target */
    N_LIST,
    N_TUPLE,
    N_DICT, /* items: key, value, key, value, ... */
    N_GETATTR,
    N_GETITEM,
    N_SLICE, /* a, b, c = start, stop, step (each may be NULL) */
    N_CALL,
    N_FILTER, /* a: input (NULL: the captured body of a filter/set block) */
    N_TEST,
    N_NEG,
    N_POS,
    N_NOT,
    N_BINOP, /* op: '+', '-', '*', '/', 'F' (//), '%', 'P' (**), '~' */
    N_COMPARE, /* a: first operand; items: the others; ops: one op per item */
    N_AND,
    N_OR,
    N_CONDEXPR, /* a if b else c */
    /* statements */
    S_DATA,
    S_OUTPUT,
    S_IF, /* a: condition (NULL for a bare else); items: body; c: the elif/else chain */
    S_FOR,
    S_SET,
    S_SETBLOCK,
    S_MACRO,
    S_CALLBLOCK,
    S_FILTERBLOCK,
    S_WITH,
    S_SCOPE, /* a body in its own scope: transformers' {% generation %} */
    S_BREAK,
    S_CONTINUE,
} node_kind;

/* Comparison operators of N_COMPARE. */
enum { CMP_EQ = 1, CMP_NE, CMP_LT, CMP_LE, CMP_GT, CMP_GE, CMP_IN, CMP_NOTIN };

typedef struct node node;
struct node {
    int kind;
    int op;
    int line, col;
    jv val;    /* N_CONST, S_DATA */
    jstr name; /* N_NAME, N_GETATTR, N_FILTER, N_TEST, N_NSREF (the variable), S_MACRO */
    jstr attr; /* N_NSREF */
    node *a, *b, *c;
    node **items; /* N_LIST/N_TUPLE/N_DICT elements, call positional args, statement bodies */
    int n;
    node **items2; /* S_FOR else body; S_MACRO / S_CALLBLOCK parameters (N_NAME, a = default or NULL);
                      S_WITH: the assignments (S_SET) */
    int n2;
    node **kw; /* keyword args of a call / filter / test */
    jstr *kwnames;
    int nkw;
    int *ops; /* N_COMPARE */
};

typedef struct jtemplate {
    jarena arena;
    node **body;
    int n;
} jtemplate;

/* Parses a template; 0 or a negative CINFER_E* code with "line:col: message" in err. */
int jinja_parse(jtemplate *t, const char *src, size_t len, char *err, size_t errlen);

/* Render limits (hostile templates must end). */
typedef struct jlimits {
    size_t max_output;     /* bytes of output */
    size_t max_arena;      /* bytes the render may allocate */
    int max_depth;         /* nested evaluation: expression depth, macro recursion */
    uint64_t max_iters;    /* loop iterations, all loops together */
} jlimits;

/* Renders with the globals in ctx (a JV_DICT). On success *out and *outlen point into `arena` (the caller's, freed
 * by the caller). raise_exception() gives CINFER_EINVAL with exactly its message; other errors carry
 * "line:col: ...". now: the time strftime_now formats (0: the real clock). */
int jinja_render(const jtemplate *t, jarena *arena, jv ctx, const jlimits *lim, int64_t now, char **out,
                 size_t *outlen, char *err, size_t errlen);

/* Whether a filter / test of that name exists (the parser rejects unknown ones, as Jinja does at compile time). */
int jinja_filter_known(const char *p, size_t n);
int jinja_test_known(const char *p, size_t n);

/* JSON (jansson) to values in the arena; objects keep their key order. */
struct json_t;
jv jv_from_json(jarena *a, struct json_t *j);

#endif

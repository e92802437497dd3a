/* fuzz_toolcall.c — random text through the reasoning splitter and the tool-call parsers, whole and in
 * a chunking derived from the input, with a tools schema. Aborts when the two runs disagree, when the
 * streamed arguments differ from the final ones, when arguments are not a JSON object, or when text is
 * lost (no completed call means the content is exactly the input).
 * Input: byte 0 = flags (bit 0 format, bit 1 prompt opened <think>, bit 2 thinking enabled, bit 3 use
 * the schema), byte 1 = chunking seed, then the text. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok/reasoning.h"
#include "tok/toolcall.h"

static const char *TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{"
    "\"s\":{\"type\":\"string\"},\"i\":{\"type\":\"integer\"},\"n\":{\"type\":\"number\"},\"b\":{\"type\":"
    "\"boolean\"},\"o\":{\"type\":\"object\"},\"a\":{\"type\":\"array\"},\"u\":{\"anyOf\":[{\"type\":"
    "\"string\"},"
    "{\"type\":\"null\"}]},\"x\":{\"type\":\"date\"}}}}},"
    "{\"name\":\"g\",\"input_schema\":{\"properties\":{\"v\":{\"type\":[\"integer\",\"null\"]}}}}]";

typedef struct {
    char *p;
    size_t n;
} buf;

static void put(buf *b, const char *s, size_t n) {
    b->p = realloc(b->p, b->n + n + 1);
    if (!b->p) abort();
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

typedef struct {
    buf reasoning, content, calls, streamed;
    int done, begun;
    tc_parser *tc;
} run_out;

static void check_args(const char *s, size_t n) {
    json_error_t e;
    json_t *j = json_loadb(s, n, JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL, &e);
    /* jansson cannot hold a key with U+0000 (valid JSON, and what json.dumps writes for it) */
    if (!j && strstr(e.text, "NUL byte in object key")) return;
    if (!json_is_object(j)) {
        fprintf(stderr, "arguments are not a JSON object: %.*s (%s)\n", (int)n, s, e.text);
        abort();
    }
    json_decref(j);
}

static void on_tc(const tc_event *e, void *ud) {
    run_out *o = ud;
    switch (e->kind) {
    case TC_EV_CONTENT:
        put(&o->content, e->text, e->len);
        break;
    case TC_EV_CALL_BEGIN:
        o->begun++;
        o->streamed.n = 0;
        put(&o->calls, "\x01", 1);
        put(&o->calls, e->name, strlen(e->name));
        break;
    case TC_EV_CALL_ARGS:
        put(&o->streamed, e->text, e->len);
        break;
    case TC_EV_CALL_END:
        if (e->len != o->streamed.n || memcmp(e->text, o->streamed.p, e->len)) abort();
        check_args(e->text, e->len);
        put(&o->calls, "\x02", 1);
        put(&o->calls, e->text, e->len);
        o->done++;
        break;
    case TC_EV_CALL_ABORT:
        put(&o->calls, "\x03", 1);
        break;
    }
}

static void on_rs(const rs_event *e, void *ud) {
    run_out *o = ud;
    if (e->kind == RS_EV_REASONING)
        put(&o->reasoning, e->text, e->len);
    else
        tc_feed(o->tc, e->text, e->len, on_tc, o);
}

static void run(const uint8_t *d, size_t n, int flags, unsigned seed, int chunked, run_out *o) {
    memset(o, 0, sizeof *o);
    put(&o->reasoning, "", 0);
    put(&o->content, "", 0);
    put(&o->calls, "", 0);
    const char *tools = (flags & 8) ? TOOLS : NULL;
    if (tc_create(&o->tc, (flags & 1) ? TC_FORMAT_HERMES_JSON : TC_FORMAT_QWEN_XML, tools,
                  tools ? strlen(tools) : 0, NULL, 0))
        abort();
    rs_parser *rs = rs_create(flags & 2, flags & 4);
    uint32_t s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n;) {
        size_t k = n - i;
        if (chunked) {
            s = s * 1103515245u + 12345u;
            k = 1 + (s >> 16) % 9;
            if (k > n - i) k = n - i;
        }
        rs_feed(rs, (const char *)d + i, k, on_rs, o);
        i += k;
    }
    rs_finish(rs, on_rs, o);
    tc_finish(o->tc, on_tc, o);
    if (tc_num_calls(o->tc) != o->done) abort();
    rs_free(rs);
    tc_free(o->tc);
}

static void same(const buf *a, const buf *b, const char *what) {
    if (a->n != b->n || memcmp(a->p, b->p, a->n)) {
        fprintf(stderr, "%s differs between whole and chunked feeding\n", what);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    int flags = data[0];
    unsigned seed = data[1];
    const uint8_t *t = data + 2;
    size_t n = size - 2;
    run_out a, b;
    run(t, n, flags, seed, 0, &a);
    run(t, n, flags, seed, 1, &b);
    same(&a.reasoning, &b.reasoning, "reasoning");
    same(&a.content, &b.content, "content");
    same(&a.calls, &b.calls, "calls");
    /* thinking disabled and no call completed: the content is the input, byte for byte */
    if (!(flags & 4) && a.done == 0 && (a.content.n != n || memcmp(a.content.p, t, n))) {
        fprintf(stderr, "text lost\n");
        abort();
    }
    if (a.done == 0 && a.reasoning.n + a.content.n > n) abort(); /* tags go, nothing is added */
    /* the value conversion alone, against each schema type: always valid JSON */
    static const char *names[] = {"s", "i", "n", "b", "o", "a", "u", "x", "zz"};
    static const char *props = "{\"s\":{\"type\":\"string\"},\"i\":{\"type\":\"integer\"},\"n\":{\"type\":"
                               "\"number\"},\"b\":{\"type\":"
                               "\"boolean\"},\"o\":{\"type\":\"object\"},\"a\":{\"type\":\"array\"},\"u\":{"
                               "\"anyOf\":[{\"type\":\"string\"},"
                               "{\"type\":\"null\"}]},\"x\":{\"type\":\"date\"}}";
    size_t cap = 8 * n + 1024; /* escapes grow 6x; float() of 1e308 is 309 digits */
    char *out = malloc(cap);
    if (!out) abort();
    const char *nm = names[seed % 9];
    int r = tc_convert_value(props, nm, (const char *)t, n < 4096 ? n : 4096, out, cap);
    if (r >= 0) {
        json_error_t e;
        json_t *j =
            json_loadb(out, (size_t)r, JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL, &e);
        if (!j && !strstr(e.text, "NUL byte in object key")) {
            fprintf(stderr, "conversion of [%.*s] as %s is not JSON: %s\n", (int)n, t, nm, out);
            abort();
        }
        json_decref(j);
    }
    free(out);
    run_out *both[2] = {&a, &b};
    for (int k = 0; k < 2; k++) {
        free(both[k]->reasoning.p);
        free(both[k]->content.p);
        free(both[k]->calls.p);
        free(both[k]->streamed.p);
    }
    return 0;
}

/* test_grammar.c — constrained decoding: the schema compiler's subset and its refusals, the matcher on
 * valid and invalid byte streams (whole and split at every byte), the tool-call syntaxes, the reasoning
 * prefix, and gm_mask against a token-by-token reference on a random vocabulary; then random walks that
 * only take masked tokens always end in text that parses and satisfies the schema. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cinfer.h"
#include "sample/grammar.h"
#include "test.h"

static grammar *schema(const char *s) {
    char err[256];
    grammar *g = NULL;
    int rc = grammar_compile_json(s, s ? strlen(s) : 0, GM_REASON_NONE, &g, err, sizeof err);
    if (rc) test_fail(__FILE__, __LINE__, "compile %s: %s", s ? s : "(object)", err);
    return g;
}

/* 1: text is a complete match; 0: a valid prefix only; -1: refused. */
static int match(const grammar *g, const char *text) {
    gm_matcher *m = gm_matcher_create(g);
    int r = gm_feed(m, text, strlen(text)) ? -1 : gm_complete(m);
    gm_matcher_free(m);
    return r;
}

/* The same text fed one byte at a time must give the same answer. */
static int match_bytes(const grammar *g, const char *text) {
    gm_matcher *m = gm_matcher_create(g);
    int r = 1;
    for (size_t i = 0; text[i] && r == 1; i++)
        if (gm_feed(m, text + i, 1)) r = -1;
    if (r == 1) r = gm_complete(m);
    gm_matcher_free(m);
    return r;
}

#define OK(g, t)                                                                                             \
    do {                                                                                                     \
        CHECK_MSG(match(g, t) == 1, "should match: %s", t);                                                  \
        CHECK_MSG(match_bytes(g, t) == 1, "should match bytewise: %s", t);                                   \
    } while (0)
#define PREFIX(g, t) CHECK_MSG(match(g, t) == 0, "should be a prefix only: %s", t)
#define BAD(g, t)    CHECK_MSG(match(g, t) == -1, "should be refused: %s", t)

TEST(grammar_object_properties) {
    grammar *g =
        schema("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":"
               "\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}},"
               "\"required\":[\"name\"],\"additionalProperties\":false}");
    REQUIRE(g);
    OK(g, "{\"name\":\"Ann\"}");
    OK(g, "{\"name\":\"Ann\",\"age\":31}");
    OK(g, "{ \"name\" : \"A\\\"n\\u00e9\" , \"age\": -7, \"tags\": [\"a\", \"b\"] }");
    OK(g, "{\"name\":\"\",\"tags\":[]}");
    OK(g, "{\n  \"name\": \"x\",\n  \"age\": 0\n}");
    OK(g, "{\"name\":\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"}");
    PREFIX(g, "{\"name\":\"Ann\"");
    PREFIX(g, "{\"na");
    PREFIX(g, "");
    BAD(g, "{}");                           /* name is required */
    BAD(g, "{\"age\":3}");                  /* ... */
    BAD(g, "{\"name\":3}");                 /* wrong type */
    BAD(g, "{\"name\":\"a\",\"age\":1.5}"); /* integer */
    BAD(g, "{\"name\":\"a\",\"zip\":1}");   /* additionalProperties false */
    BAD(g, "{\"name\":\"a\"} ");            /* nothing after the value */
    BAD(g, "{\"name\":\"a\",}");
    BAD(g, "{\"name\":\"a\nb\"}");         /* raw control character */
    BAD(g, "{\"name\":\"\\x\"}");          /* bad escape */
    BAD(g, "{\"name\":\"\xc3\"}");         /* broken UTF-8 */
    BAD(g, "{\"name\":\"\xed\xa0\x80\"}"); /* a surrogate in UTF-8 */
    BAD(g, "{\"name\":\"a\",\"age\":01}");
    grammar_free(g);
}

TEST(grammar_scalars_enum_const_anyof) {
    grammar *g = schema("{\"enum\":[\"red\",\"green\",7,null]}");
    REQUIRE(g);
    OK(g, "\"red\"");
    OK(g, "7");
    OK(g, "null");
    BAD(g, "\"blue\"");
    BAD(g, "70");
    grammar_free(g);
    g = schema("{\"const\":{\"a\":[1,true]}}");
    REQUIRE(g);
    OK(g, "{\"a\":[1,true]}");
    BAD(g, "{\"a\":[1,false]}");
    grammar_free(g);
    g = schema(
        "{\"anyOf\":[{\"type\":\"number\"},{\"type\":\"boolean\"},{\"type\":\"object\",\"properties\":{"
        "\"x\":{\"type\":\"null\"}},\"required\":[\"x\"]}]}");
    REQUIRE(g);
    OK(g, "-1.25e+3");
    OK(g, "0.5");
    OK(g, "true");
    OK(g, "{\"x\":null}");
    BAD(g, "1.e");
    BAD(g, "\"1\"");
    BAD(g, "{\"x\":1}");
    PREFIX(g, "-");
    grammar_free(g);
    g = schema("{\"type\":[\"string\",\"null\"],\"minLength\":2,\"maxLength\":3}");
    REQUIRE(g);
    OK(g, "\"ab\"");
    OK(g, "\"a\\nb\"");
    OK(g, "\"\xe2\x82\xac\xe2\x82\xac\""); /* two characters, six bytes */
    OK(g, "null");
    BAD(g, "\"a\"");
    BAD(g, "\"abcd\"");
    grammar_free(g);
}

/* Enums are one trie-walking lexeme: a large one keeps every value reachable (alternatives would overflow
 * the matcher's stack set), and values that prefix one another both work. */
TEST(grammar_large_enum) {
    char text[16384] = "{\"enum\":[", v[64];
    for (int i = 0; i < 500; i++) {
        snprintf(v, sizeof v, "%s\"k%03d\"", i ? "," : "", i);
        strcat(text, v);
    }
    strcat(text, ",1,12,123]}");
    grammar *g = schema(text);
    REQUIRE(g);
    for (int i = 0; i < 500; i += 37) {
        snprintf(v, sizeof v, "\"k%03d\"", i);
        OK(g, v);
    }
    OK(g, "\"k499\"");
    OK(g, "1");
    OK(g, "12");
    OK(g, "123");
    PREFIX(g, "\"k4");
    BAD(g, "\"k500\"");
    BAD(g, "1234");
    BAD(g, "\"k49\"");
    grammar_free(g);
}

TEST(grammar_arrays_and_refs) {
    grammar *g =
        schema("{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":3}");
    REQUIRE(g);
    OK(g, "[1,2]");
    OK(g, "[ 1 , 2 , 3 ]");
    BAD(g, "[1]");
    BAD(g, "[1,2,3,4]");
    BAD(g, "[]");
    grammar_free(g);
    /* a recursive tree through $defs */
    g = schema("{\"$ref\":\"#/$defs/node\",\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{"
               "\"type\":\"integer\"},\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},"
               "\"required\":[\"v\"]}}}");
    REQUIRE(g);
    OK(g, "{\"v\":1}");
    OK(g, "{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3,\"kids\":[{\"v\":4,\"kids\":[]}]}]}");
    BAD(g, "{\"v\":1,\"kids\":[{\"w\":2}]}");
    grammar_free(g);
    g = schema("{\"definitions\":{\"s\":{\"type\":\"string\"}},\"type\":\"object\",\"properties\":{\"a\":{"
               "\"$ref\":\"#/definitions/s\"}},\"required\":[\"a\"]}");
    REQUIRE(g);
    OK(g, "{\"a\":\"x\"}");
    BAD(g, "{\"a\":1}");
    grammar_free(g);
}

TEST(grammar_json_object_any) {
    grammar *g = schema(NULL);
    REQUIRE(g);
    OK(g, "{}");
    OK(g, "{\"a\":[1,{\"b\":null},\"c\",true,-0.5e2],\"d\":{}}");
    BAD(g, "[]");
    BAD(g, "\"x\"");
    BAD(g, "{\"a\":}");
    BAD(g, "{a:1}");
    grammar_free(g);
    /* an object schema with additionalProperties as a schema */
    g = schema("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}");
    REQUIRE(g);
    OK(g, "{\"x\":1,\"y\":2}");
    BAD(g, "{\"x\":\"1\"}");
    grammar_free(g);
}

TEST(grammar_refusals_name_the_keyword) {
    struct {
        const char *schema, *want;
    } cases[] = {
        {"{\"type\":\"string\",\"pattern\":\"^a\"}", "'pattern'"},
        {"{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"number\",\"minimum\":3}}}", "'minimum'"},
        {"{\"allOf\":[{}]}", "'allOf'"},
        {"{\"type\":\"array\",\"items\":[{}]}", "'items'"},
        {"{\"type\":\"object\",\"required\":[\"x\"]}", "'x'"},
        {"{\"$ref\":\"#/$defs/missing\"}", "missing"},
        {"{\"type\":\"tuple\"}", "tuple"},
        {"{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":\"#/$defs/a\"}", "nothing can match"},
        {"[1,2", "not JSON"},
        {"false", "false"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[256] = "";
        grammar *g = NULL;
        CHECK_EQ_INT(grammar_compile_json(cases[i].schema, strlen(cases[i].schema), 0, &g, err, sizeof err),
                     CINFER_EINVAL);
        CHECK(g == NULL);
        CHECK_STR_CONTAINS(err, cases[i].want);
    }
}

static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},\"unit\":{\"type\":"
    "\"string\",\"enum\":[\"c\",\"f\"]}},\"required\":[\"city\"]}}},"
    "{\"name\":\"ping\",\"input_schema\":{\"type\":\"object\",\"properties\":{}}}]";

static grammar *tools(int xml, const char *name, int reasoning) {
    char err[256];
    grammar *g = NULL;
    if (grammar_compile_tools(TOOLS, strlen(TOOLS), xml, name, reasoning, &g, err, sizeof err))
        test_fail(__FILE__, __LINE__, "compile tools: %s", err);
    return g;
}

TEST(grammar_tool_calls_xml) {
    grammar *g = tools(1, NULL, GM_REASON_NONE);
    REQUIRE(g);
    const char *one = "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
                      "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
    OK(g, one);
    OK(g,
       "<tool_call>\n<function=ping>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n"
       "<parameter=city>\na\n</parameter\nb\n</parameter>\n<parameter=unit>\nf\n</parameter>\n</function>\n"
       "</tool_call>");
    BAD(g, "Sure! <tool_call>");
    BAD(g, "<tool_call>\n<function=nope>");
    BAD(g, "<tool_call>\n<function=get_weather>\n</function>"); /* city is required */
    BAD(g, "<tool_call>\n<function=get_weather>\n<parameter=city>\nx\n</parameter>\n<parameter=days>\nmany");
    BAD(g, "<tool_call>\n<function=get_weather>\n<parameter=city>\nx\n</parameter>\n<parameter=unit>\nk");
    grammar_free(g);
    g = tools(1, "ping", GM_REASON_INSIDE);
    REQUIRE(g);
    OK(g, "let me think </thin</think>\n\n<tool_call>\n<function=ping>\n</function>\n</tool_call>");
    BAD(g, "</think>\n\n<tool_call>\n<function=get_weather>");
    BAD(g, "</think><tool_call>\n<function=ping>\n</function>\n</tool_call>\n<tool_call>"); /* named: one */
    grammar_free(g);
    char err[256];
    CHECK_EQ_INT(grammar_compile_tools(TOOLS, strlen(TOOLS), 1, "nothere", 0, &g, err, sizeof err),
                 CINFER_EINVAL);
    CHECK_STR_CONTAINS(err, "nothere");
    CHECK_EQ_INT(grammar_compile_tools("[]", 2, 1, NULL, 0, &g, err, sizeof err), CINFER_EINVAL);
}

/* Tool names share one trie: with many tools (more than the matcher's stack set holds) every one of them
 * can still be called, each with its own parameters. */
TEST(grammar_many_tools) {
    static char tools_json[40000];
    size_t o = 0;
    o += (size_t)snprintf(tools_json + o, sizeof tools_json - o, "[");
    for (int i = 0; i < 150; i++)
        o += (size_t)snprintf(tools_json + o, sizeof tools_json - o,
                              "%s{\"name\":\"tool_%d\",\"parameters\":{\"type\":\"object\",\"properties\":{"
                              "\"p%d\":{\"type\":\"integer\"}},\"required\":[\"p%d\"]}}",
                              i ? "," : "", i, i, i);
    snprintf(tools_json + o, sizeof tools_json - o, "]");
    for (int xml = 0; xml <= 1; xml++) {
        char err[256];
        grammar *g = NULL;
        REQUIRE(grammar_compile_tools(tools_json, strlen(tools_json), xml, NULL, 0, &g, err, sizeof err) ==
                0);
        char call[256];
        for (int i = 0; i < 150; i += 49) {
            if (xml)
                snprintf(call, sizeof call,
                         "<tool_call>\n<function=tool_%d>\n<parameter=p%d>\n7\n</parameter>\n</function>\n</"
                         "tool_call>",
                         i, i);
            else
                snprintf(call, sizeof call,
                         "<tool_call>\n{\"name\": \"tool_%d\", \"arguments\": {\"p%d\": 7}}\n</tool_call>", i,
                         i);
            OK(g, call);
        }
        /* a parameter of another tool is refused */
        if (xml)
            BAD(g, "<tool_call>\n<function=tool_3>\n<parameter=p4>");
        else
            BAD(g, "<tool_call>\n{\"name\": \"tool_3\", \"arguments\": {\"p4\"");
        BAD(g, xml ? "<tool_call>\n<function=tool_150>" : "<tool_call>\n{\"name\": \"tool_150\"");
        grammar_free(g);
    }
}

TEST(grammar_tool_calls_json) {
    grammar *g = tools(0, "get_weather", GM_REASON_OPTIONAL);
    REQUIRE(g);
    OK(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"unit\": "
          "\"c\"}}\n</tool_call>");
    OK(g, "<think>hm</think>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
          "{\"city\":\"x\"}}\n</tool_call>");
    BAD(g, "<tool_call>\n{\"name\": \"ping\"");
    BAD(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}");
    grammar_free(g);
}

/* ---- the mask against a token-by-token reference ---- */

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

typedef struct {
    int n;
    char **tok;
    size_t *len;
    gm_vocab *v;
} vocab;

/* Random tokens over the bytes JSON and the tool syntax use, plus every single byte of them. */
static void make_vocab(vocab *vb, int n, uint64_t seed) {
    static const char alpha[] = "{}[]\":,.-+0123456789eE \n\\abcdefghijklmnopqrstuvwxyz<>/=_";
    vb->n = n;
    vb->tok = calloc((size_t)n, sizeof *vb->tok);
    vb->len = calloc((size_t)n, sizeof *vb->len);
    size_t na = sizeof alpha - 1;
    for (int i = 0; i < n; i++) {
        size_t l = i < (int)na ? 1 : 1 + rng_next(&seed) % 6;
        vb->tok[i] = malloc(l + 1);
        for (size_t k = 0; k < l; k++) vb->tok[i][k] = i < (int)na ? alpha[i] : alpha[rng_next(&seed) % na];
        vb->len[i] = l;
    }
    /* a few multi-byte pieces: whole and split characters */
    const char *mb[] = {"\xc3\xa9",         "\xc3",    "\xa9", "\xe2\x82\xac\"", "<tool_call>",
                        "\n</parameter>\n", "\"city\""};
    for (int k = 0; k < 7 && k < n; k++) {
        free(vb->tok[n - 1 - k]);
        vb->tok[n - 1 - k] = strdup(mb[k]);
        vb->len[n - 1 - k] = strlen(mb[k]);
    }
    vb->v = gm_vocab_create((const char *const *)vb->tok, vb->len, n);
}

static void free_vocab(vocab *vb) {
    for (int i = 0; i < vb->n; i++) free(vb->tok[i]);
    free(vb->tok), free(vb->len);
    gm_vocab_free(vb->v);
}

/* Walks a grammar by random allowed tokens; each step checks gm_mask against feeding every token into a
 * fresh matcher. Returns the text (malloc) once complete and the coin says stop, or NULL when it ran long. */
static char *walk(const grammar *g, vocab *vb, uint64_t seed, int check_every, int *mismatch) {
    gm_matcher *m = gm_matcher_create(g);
    uint32_t *mask = calloc((size_t)(vb->n + 31) / 32, 4);
    size_t cap = 8192, n = 0;
    char *text = calloc(cap + 64, 1);
    for (int step = 0; step < 400; step++) {
        if (gm_complete(m) && rng_next(&seed) % 4 == 0) break;
        int cnt = gm_mask(m, vb->v, mask);
        if (step % check_every == 0) {
            for (int t = 0; t < vb->n; t++) {
                gm_matcher *ref = gm_matcher_create(g);
                int ok = gm_feed(ref, text, n) == 0 && gm_feed(ref, vb->tok[t], vb->len[t]) == 0;
                gm_matcher_free(ref);
                if (ok != !!(mask[t >> 5] & (1u << (t & 31)))) (*mismatch)++;
            }
        }
        if (cnt == 0) break;
        /* prefer closing tokens now and then so walks end */
        int pick = (int)(rng_next(&seed) % (uint64_t)cnt), t = 0;
        for (; t < vb->n; t++)
            if ((mask[t >> 5] & (1u << (t & 31))) && pick-- == 0) break;
        if (n + vb->len[t] > cap) break;
        CHECK_EQ_INT(gm_feed(m, vb->tok[t], vb->len[t]), 0);
        memcpy(text + n, vb->tok[t], vb->len[t]);
        n += vb->len[t];
    }
    int done = gm_complete(m);
    if (!done && getenv("GRAMMAR_DEBUG")) fprintf(stderr, "incomplete walk: [%.*s]\n", (int)n, text);
    gm_matcher_free(m);
    free(mask);
    if (!done) {
        free(text);
        return NULL;
    }
    text[n] = 0;
    return text;
}

TEST(grammar_mask_matches_reference) {
    vocab vb;
    make_vocab(&vb, 300, 42);
    const char *schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"enum\":[\"x\",\"yz\"]},"
        "\"c\":{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"maxItems\":2}},\"required\":[\"a\"]}",
        "{\"anyOf\":[{\"type\":\"string\",\"maxLength\":3},{\"type\":\"number\"},{\"type\":\"null\"}]}",
        NULL,
    };
    int mismatch = 0;
    for (int s = 0; s < 3; s++) {
        grammar *g = schema(schemas[s]);
        REQUIRE(g);
        for (uint64_t seed = 1; seed <= 6; seed++) free(walk(g, &vb, seed * 7919, 3, &mismatch));
        grammar_free(g);
    }
    grammar *g = tools(1, NULL, GM_REASON_NONE);
    REQUIRE(g);
    for (uint64_t seed = 1; seed <= 3; seed++) free(walk(g, &vb, seed, 5, &mismatch));
    grammar_free(g);
    CHECK_EQ_INT(mismatch, 0);
    free_vocab(&vb);
}

TEST(grammar_random_walks_validate) {
    vocab vb;
    make_vocab(&vb, 400, 7);
    grammar *g =
        schema("{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},\"name\":{\"type\":"
               "\"string\",\"maxLength\":5},\"ok\":{\"type\":\"boolean\"},\"xs\":{\"type\":\"array\","
               "\"items\":{\"type\":\"number\"},\"maxItems\":3}},\"required\":[\"id\",\"ok\"],"
               "\"additionalProperties\":false}");
    REQUIRE(g);
    int done = 0;
    for (uint64_t seed = 1; seed <= 60; seed++) {
        int mm = 0;
        char *text = walk(g, &vb, seed * 2654435761u, 1 << 30, &mm);
        if (!text) continue;
        done++;
        json_error_t je;
        json_t *j = json_loads(text, 0, &je);
        CHECK_MSG(j != NULL, "not JSON: %s (%s)", text, je.text);
        if (j) {
            CHECK(json_is_object(j));
            CHECK(json_is_integer(json_object_get(j, "id")));
            CHECK(json_is_boolean(json_object_get(j, "ok")));
            const json_t *nm = json_object_get(j, "name"), *xs = json_object_get(j, "xs");
            if (nm) CHECK(json_is_string(nm));
            if (xs) CHECK(json_is_array(xs) && json_array_size(xs) <= 3);
            const char *k;
            json_t *v;
            json_object_foreach(j, k, v)
                CHECK(!strcmp(k, "id") || !strcmp(k, "name") || !strcmp(k, "ok") || !strcmp(k, "xs"));
        }
        json_decref(j);
        free(text);
    }
    CHECK_MSG(done >= 20, "only %d of 60 walks completed", done);
    grammar_free(g);
    free_vocab(&vb);
}

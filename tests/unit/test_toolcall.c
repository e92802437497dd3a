/* test_toolcall.c — the incremental tool-call parsers: every example is fed whole, byte by byte, split
 * in two at every position and in random chunkings, and must give the same content and calls each
 * time; the streamed argument fragments must add up to the final arguments. Expected values follow the
 * reference parsers' code (vLLM qwen3coder_tool_parser.py / hermes_tool_parser.py, mlx-lm
 * tool_parsers/qwen3_coder.py); each test says which behaviour it mirrors. */
#include <stdint.h>
#include <stdlib.h>

#include "cinfer.h"
#include "test.h"
#include "tok/toolcall.h"

/* ---- collecting events */

typedef struct {
    char *p;
    size_t n;
} str;

static void str_add(str *s, const char *t, size_t n) {
    s->p = realloc(s->p, s->n + n + 1);
    memcpy(s->p + s->n, t, n);
    s->n += n;
    s->p[s->n] = 0;
}

#define MAXC 8
typedef struct {
    str content;
    int n_begun, n_done, n_abort;
    char names[MAXC][64];
    char ids[MAXC][40];
    str streamed[MAXC]; /* concatenated TC_EV_CALL_ARGS per call */
    str args[MAXC];     /* TC_EV_CALL_END's arguments */
    int bad;            /* an event broke the protocol */
    char why[160];
} outcome;

static void on_ev(const tc_event *e, void *ud) {
    outcome *o = ud;
    switch (e->kind) {
    case TC_EV_CONTENT:
        if (!e->len || e->index != -1) o->bad = 1, snprintf(o->why, sizeof o->why, "empty/indexed content");
        str_add(&o->content, e->text, e->len);
        break;
    case TC_EV_CALL_BEGIN:
        if (e->index != o->n_begun || e->index >= MAXC || !e->id || !e->name) {
            o->bad = 1, snprintf(o->why, sizeof o->why, "begin index %d", e->index);
            return;
        }
        snprintf(o->names[e->index], 64, "%s", e->name);
        snprintf(o->ids[e->index], 40, "%s", e->id);
        o->n_begun++;
        break;
    case TC_EV_CALL_ARGS:
        if (e->index != o->n_begun - 1 || !e->len) {
            o->bad = 1, snprintf(o->why, sizeof o->why, "args for %d", e->index);
            return;
        }
        str_add(&o->streamed[e->index], e->text, e->len);
        break;
    case TC_EV_CALL_END:
        if (e->index != o->n_begun - 1 || strcmp(e->id, o->ids[e->index]) ||
            strcmp(e->name, o->names[e->index])) {
            o->bad = 1, snprintf(o->why, sizeof o->why, "end %d", e->index);
            return;
        }
        str_add(&o->args[e->index], e->text, e->len);
        if (o->streamed[e->index].n != e->len || memcmp(o->streamed[e->index].p, e->text, e->len))
            o->bad = 1,
            snprintf(o->why, sizeof o->why, "streamed args differ from final for call %d", e->index);
        o->n_done++;
        break;
    case TC_EV_CALL_ABORT:
        if (e->index != o->n_begun - 1) o->bad = 1, snprintf(o->why, sizeof o->why, "abort %d", e->index);
        o->n_abort++;
        break;
    }
}

static void outcome_free(outcome *o) {
    free(o->content.p);
    for (int i = 0; i < MAXC; i++) free(o->streamed[i].p), free(o->args[i].p);
}

static uint64_t rng_next(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* mode 0: whole; 1: byte by byte; 2: split at `at`; 3: random chunks from seed `at`. */
static void run(tc_format fmt, const char *tools, const char *text, int mode, uint64_t at, outcome *o) {
    memset(o, 0, sizeof *o);
    tc_parser *p;
    char err[128];
    if (tc_create(&p, fmt, tools, tools ? strlen(tools) : 0, err, sizeof err)) {
        o->bad = 1;
        snprintf(o->why, sizeof o->why, "create: %s", err);
        return;
    }
    size_t n = strlen(text), i = 0;
    uint64_t s = at + 1;
    while (i < n) {
        size_t k = mode == 0   ? n
                   : mode == 1 ? 1
                   : mode == 2 ? (i < at ? at - i : n - i)
                               : 1 + rng_next(&s) % 7;
        if (k > n - i) k = n - i;
        tc_feed(p, text + i, k, on_ev, o);
        i += k;
    }
    tc_finish(p, on_ev, o);
    if (tc_num_calls(p) != o->n_done) o->bad = 1, snprintf(o->why, sizeof o->why, "tc_num_calls");
    if (tc_feed(p, "x", 1, on_ev, o) != CINFER_ESTATE)
        o->bad = 1, snprintf(o->why, sizeof o->why, "feed after finish");
    tc_free(p);
}

typedef struct {
    const char *content;
    int n;
    const char *names[4];
    const char *args[4];
    int aborted;
} expect;

static int same(const outcome *o, const expect *x, char *why, size_t wl) {
    if (o->bad) return snprintf(why, wl, "protocol: %s", o->why), 0;
    const char *c = o->content.p ? o->content.p : "";
    if (strcmp(c, x->content)) return snprintf(why, wl, "content [%s] want [%s]", c, x->content), 0;
    if (o->n_done != x->n) return snprintf(why, wl, "%d calls, want %d", o->n_done, x->n), 0;
    if (o->n_abort != x->aborted) return snprintf(why, wl, "%d aborted, want %d", o->n_abort, x->aborted), 0;
    for (int i = 0; i < x->n; i++) {
        if (strcmp(o->names[i], x->names[i])) return snprintf(why, wl, "call %d name %s", i, o->names[i]), 0;
        if (strcmp(o->args[i].p, x->args[i]))
            return snprintf(why, wl, "call %d args [%s] want [%s]", i, o->args[i].p, x->args[i]), 0;
        if (strncmp(o->ids[i], "call_", 5) || strlen(o->ids[i]) != 29)
            return snprintf(why, wl, "id %s", o->ids[i]), 0;
    }
    return 1;
}

/* The example under every chunking. */
static void check_all(const char *file, int line, tc_format fmt, const char *tools, const char *text,
                      expect x) {
    size_t n = strlen(text);
    char why[1200];
    for (int mode = 0; mode < 4; mode++) {
        uint64_t reps = mode == 2 ? n + 1 : mode == 3 ? 40 : 1;
        for (uint64_t r = 0; r < reps; r++) {
            outcome o;
            run(fmt, tools, text, mode, r, &o);
            int ok = same(&o, &x, why, sizeof why);
            outcome_free(&o);
            if (!ok) {
                test_fail(file, line, "mode %d/%llu: %s", mode, (unsigned long long)r, why);
                return;
            }
        }
    }
}
#define CHECK_TC(fmt, tools, text, ...) check_all(__FILE__, __LINE__, fmt, tools, text, (expect){__VA_ARGS__})
#define XML                             TC_FORMAT_QWEN_XML
#define JSN                             TC_FORMAT_HERMES_JSON

static const char *TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},\"scale\":{\"type\":"
    "\"number\"},"
    "\"metric\":{\"type\":\"boolean\"},\"opts\":{\"type\":\"object\"},\"tags\":{\"type\":\"array\"},"
    "\"note\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"write_file\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"path\":{\"type\":\"string\"},\"content\":{\"type\":\"string\"}}}}},"
    "{\"name\":\"list_files\",\"input_schema\":{\"type\":\"object\",\"properties\":{}}}]";

/* ---- Qwen3.5 XML */

TEST(tc_xml_single_call_with_text_before) {
    /* vLLM extract_tool_calls: content is the text before <tool_call>, kept as is (trailing newlines
     * included); value "\nParis\n" loses one leading and one trailing newline; integer via int(). */
    CHECK_TC(XML, TOOLS,
             "I'll check the "
             "weather.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
             "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
             .content = "I'll check the weather.\n\n", .n = 1, .names = {"get_weather"},
             .args = {"{\"city\": \"Paris\", \"days\": 3}"});
}

TEST(tc_xml_two_calls_and_text_after) {
    /* Blank text between calls and after the last is not content (vLLM streaming skips whitespace-only
     * deltas after a closed call); other text after a call is. */
    CHECK_TC(XML, TOOLS,
             "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</"
             "tool_call>\n"
             "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n</"
             "tool_call>\n"
             "Both are on their way.",
             .content = "\nBoth are on their way.", .n = 2, .names = {"get_weather", "get_weather"},
             .args = {"{\"city\": \"Paris\"}", "{\"city\": \"Rome\"}"});
    CHECK_TC(XML, TOOLS,
             "<tool_call>\n<function=list_files>\n</function>\n</"
             "tool_call>\n\n<tool_call>\n<function=list_files>\n"
             "</function>\n</tool_call>\n",
             .content = "", .n = 2, .names = {"list_files", "list_files"}, .args = {"{}", "{}"});
}

TEST(tc_xml_typed_values) {
    /* A parameter missing from the schema stays a string (vLLM: "directly returning the string value");
     * unlike vLLM, it is also not swallowed into the previous value (see value_end_at).
     * _convert_param_value: number → int when integral else float (repr), boolean → lower()=="true",
     * "None"/"null" → null for non-string types, object via json.loads (re-dumped), array via
     * ast.literal_eval when not JSON, invalid integer degrades to the raw string, nullable string
     * (anyOf with null) maps None to null, a plain string keeps "null". */
    CHECK_TC(
        XML, TOOLS,
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nnull\n</parameter>\n<parameter=days>\nNone\n"
        "</parameter>\n<parameter=scale>\n2.50\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n"
        "<parameter=opts>\n{\"units\": \"C\",  \"limits\": [1, 2.0, -0.5e-5]}\n</parameter>\n"
        "<parameter=tags>\n['a', \"b\", (1, 2), {'k': None}]\n</parameter>\n<parameter=note>\nNone\n"
        "</parameter>\n</function>\n</tool_call>",
        .content = "", .n = 1, .names = {"get_weather"},
        .args = {
            "{\"city\": \"null\", \"days\": null, \"scale\": 2.5, \"metric\": true, \"opts\": {\"units\": "
            "\"C\", \"limits\": [1, 2.0, -5e-06]}, \"tags\": [\"a\", \"b\", [1, 2], {\"k\": null}], "
            "\"note\": null}"});
    CHECK_TC(
        XML, TOOLS,
        "<tool_call>\n<function=get_weather>\n<parameter=days>\nthree\n</parameter>\n<parameter=scale>\n3.0\n"
        "</parameter>\n<parameter=metric>\nyes\n</parameter>\n<parameter=note>\nfine\n</parameter>\n"
        "<parameter=extra>\n42\n</parameter>\n</function>\n</tool_call>",
        .content = "", .n = 1, .names = {"get_weather"},
        .args = {
            "{\"days\": \"three\", \"scale\": 3, \"metric\": false, \"note\": \"fine\", \"extra\": \"42\"}"});
}

TEST(tc_xml_strings_escaped_and_unicode) {
    /* json.dumps(ensure_ascii=False): non-ASCII stays raw, quotes/backslashes/newlines/tabs escaped,
     * other control characters as \u00XX. Only one leading/trailing newline is stripped. */
    CHECK_TC(XML, TOOLS,
             "<tool_call>\n<function=write_file>\n<parameter=path>\n/tmp/Zürich 東京 🌍.txt\n</parameter>\n"
             "<parameter=content>\n\ndef f(x):\n\treturn \"a\\\\b\" + "
             "'\x01'\n\n</parameter>\n</function>\n</tool_call>",
             .content = "", .n = 1, .names = {"write_file"},
             .args = {"{\"path\": \"/tmp/Zürich 東京 🌍.txt\", \"content\": \"\\ndef f(x):\\n\\treturn "
                      "\\\"a\\\\\\\\b\\\" + '\\u0001'\\n\"}"});
}

TEST(tc_xml_literal_markup_inside_values) {
    /* _find_true_param_end: a </parameter> not followed by a known <parameter=…>, </function> or
     * </tool_call> is part of the value (code that mentions the tags). */
    CHECK_TC(
        XML, TOOLS,
        "<tool_call>\n<function=write_file>\n<parameter=path>\na.md\n</parameter>\n<parameter=content>\n"
        "Use </parameter> to close, then more.\n<tool_call> is the opener.\n</parameter>\n</function>\n"
        "</tool_call>",
        .content = "", .n = 1, .names = {"write_file"},
        .args = {"{\"path\": \"a.md\", \"content\": \"Use </parameter> to close, then more.\\n<tool_call> is "
                 "the opener.\"}"});
}

TEST(tc_xml_missing_parameter_close) {
    /* _find_true_function_end: </function> followed by </tool_call> ends a value whose </parameter> is
     * missing; a line-start <parameter=NAME> of an unseen schema parameter does too. */
    CHECK_TC(XML, TOOLS,
             "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n<parameter=days>\n2\n</function>\n"
             "</tool_call>",
             .content = "", .n = 1, .names = {"get_weather"}, .args = {"{\"city\": \"Oslo\", \"days\": 2}"});
}

TEST(tc_xml_bare_function_block) {
    /* mlx-lm qwen3_coder tool_call_start_alt: a <function=…>…</function> block without the wrapper is a
     * call; vLLM's non-streaming back-off does the same. */
    CHECK_TC(XML, TOOLS,
             "Sure.\n<function=get_weather>\n<parameter=city>\nLima\n</parameter>\n</function>\nDone.",
             .content = "Sure.\n\nDone.", .n = 1, .names = {"get_weather"}, .args = {"{\"city\": \"Lima\"}"});
}

TEST(tc_xml_end_without_tool_call_close) {
    /* Generation stopped right after </function>: the call is complete (vLLM's regex accepts an
     * unclosed <tool_call> block). */
    CHECK_TC(XML, TOOLS,
             "<tool_call>\n<function=get_weather>\n<parameter=city>\nKyiv\n</parameter>\n</function>\n",
             .content = "", .n = 1, .names = {"get_weather"}, .args = {"{\"city\": \"Kyiv\"}"});
}

TEST(tc_xml_malformed_degrades_to_content) {
    /* Unterminated call: all of its text comes back as content (a begun call is aborted). */
    const char *t1 = "Working.<tool_call>\n<function=get_weather>\n<parameter=city>\nPar";
    CHECK_TC(XML, TOOLS, t1, .content = t1, .n = 0, .aborted = 1);
    /* Unknown function name (tools given): not a call. */
    const char *t2 =
        "<tool_call>\n<function=launch_rockets>\n<parameter=n>\n3\n</parameter>\n</function>\n</tool_call>";
    CHECK_TC(XML, TOOLS, t2, .content = t2, .n = 0);
    /* Not a function tag after <tool_call>; a name with a blank (vLLM _is_valid_function_name). */
    const char *t3 = "I use <tool_call> tags and <function=a b> like this.";
    CHECK_TC(XML, TOOLS, t3, .content = t3, .n = 0);
    /* Template leftovers are not calls. */
    const char *t4 = "<tool_call>\n<function={{ name }}>\n</function>\n</tool_call>";
    CHECK_TC(XML, TOOLS, t4, .content = t4, .n = 0);
    /* Partial tags at the end are content. */
    CHECK_TC(XML, TOOLS, "a <tool_ca", .content = "a <tool_ca", .n = 0);
    CHECK_TC(XML, TOOLS, "x <function", .content = "x <function", .n = 0);
    /* A good call, then an unterminated one: the first stands. */
    CHECK_TC(
        XML, TOOLS,
        "<tool_call>\n<function=list_files>\n</function>\n</tool_call>\n<tool_call>\n<function=list_files>\n",
        .content = "<tool_call>\n<function=list_files>\n", .n = 1, .names = {"list_files"}, .args = {"{}"},
        .aborted = 1);
}

TEST(tc_xml_without_tools_accepts_any_name) {
    /* No schema: every value stays a string (vLLM: param not in config → raw string). */
    CHECK_TC(XML, NULL,
             "<tool_call>\n<function=anything>\n<parameter=n>\n3\n</parameter>\n</function>\n</tool_call>",
             .content = "", .n = 1, .names = {"anything"}, .args = {"{\"n\": \"3\"}"});
}

TEST(tc_xml_repeated_parameter_first_wins) {
    /* Deliberate difference: vLLM keeps the last; a stream has already sent the first. */
    CHECK_TC(XML, TOOLS,
             "<tool_call>\n<function=get_weather>\n<parameter=city>\nA\n</parameter>\n<parameter=city>\nB\n"
             "</parameter>\n</function>\n</tool_call>",
             .content = "", .n = 1, .names = {"get_weather"}, .args = {"{\"city\": \"A\"}"});
}

TEST(tc_streams_before_the_end) {
    /* Content goes out at once, except a possible partial tag; a string value streams as it comes. */
    outcome o;
    memset(&o, 0, sizeof o);
    tc_parser *p;
    REQUIRE(!tc_create(&p, XML, TOOLS, strlen(TOOLS), NULL, 0));
    const char *a = "Hello <tool";
    tc_feed(p, a, strlen(a), on_ev, &o);
    CHECK(o.content.p && !strcmp(o.content.p, "Hello "));
    const char *b = "_call>\n<function=write_file>\n<parameter=content>\nline one\nline two";
    tc_feed(p, b, strlen(b), on_ev, &o);
    CHECK_EQ_INT(o.n_begun, 1);
    CHECK(!strcmp(o.names[0], "write_file"));
    CHECK(o.streamed[0].p && !strcmp(o.streamed[0].p, "{\"content\": \"line one\\nline two"));
    tc_feed(p, "\n", 1, on_ev, &o); /* a newline may be the stripped last one: held */
    CHECK(!strcmp(o.streamed[0].p, "{\"content\": \"line one\\nline two"));
    const char *c = "</parameter>\n</function>\n</tool_call>";
    tc_feed(p, c, strlen(c), on_ev, &o);
    CHECK_EQ_INT(o.n_done, 1);
    CHECK(o.args[0].p && !strcmp(o.args[0].p, "{\"content\": \"line one\\nline two\"}"));
    tc_finish(p, on_ev, &o);
    CHECK(!o.bad);
    tc_free(p);
    outcome_free(&o);
}

/* ---- Hermes JSON */

TEST(tc_json_calls) {
    /* hermes: content is the text before <tool_call>. In the usual key order the arguments are the
     * model's own text (what vLLM's streaming path sends, brace-matched). */
    CHECK_TC(JSN, TOOLS,
             "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
             "{\"city\":\"Zürich\",\"scale\":1.50,"
             "\"tags\":[\"a\",{\"b\":null}]}}\n</"
             "tool_call>\n<tool_call>\n{\"name\":\"list_files\",\"arguments\":{}}\n"
             "</tool_call>",
             .content = "Checking.\n", .n = 2, .names = {"get_weather", "list_files"},
             .args = {"{\"city\":\"Zürich\",\"scale\":1.50,\"tags\":[\"a\",{\"b\":null}]}", "{}"});
    /* Braces inside strings do not end the object. */
    CHECK_TC(JSN, TOOLS,
             "<tool_call>{\"name\": \"write_file\", \"arguments\": {\"content\": \"} </tool_call> "
             "{\"}}</tool_call>",
             .content = "", .n = 1, .names = {"write_file"}, .args = {"{\"content\": \"} </tool_call> {\"}"});
    /* Other shapes: json.dumps(arguments, ensure_ascii=False), vLLM's non-streaming form. Arguments given
     * as a JSON string are unwrapped into the object OpenAI clients expect. */
    CHECK_TC(JSN, TOOLS,
             "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"days\\\": 2}\"}\n</tool_call>",
             .content = "", .n = 1, .names = {"get_weather"}, .args = {"{\"days\": 2}"});
    CHECK_TC(JSN, TOOLS,
             "<tool_call>\n{\"arguments\": {\"city\":\"Z\\u00fcrich\",\"scale\":1.50}, \"name\": "
             "\"get_weather\"}\n"
             "</tool_call>",
             .content = "", .n = 1, .names = {"get_weather"},
             .args = {"{\"city\": \"Zürich\", \"scale\": 1.5}"});
    CHECK_TC(JSN, TOOLS, "<tool_call>\n{\"name\": \"list_files\"}\n</tool_call>", .content = "", .n = 1,
             .names = {"list_files"}, .args = {"{}"});
}

TEST(tc_json_streams_name_first) {
    outcome o;
    memset(&o, 0, sizeof o);
    tc_parser *p;
    REQUIRE(!tc_create(&p, JSN, TOOLS, strlen(TOOLS), NULL, 0));
    const char *a = "<tool_call>\n{\"name\": \"write_file\", \"arguments\": {\"content\": \"long te";
    tc_feed(p, a, strlen(a), on_ev, &o);
    CHECK_EQ_INT(o.n_begun, 1);
    CHECK(!strcmp(o.names[0], "write_file"));
    CHECK(o.streamed[0].p && !strcmp(o.streamed[0].p, "{\"content\": \"long te"));
    const char *b = "xt\"}}\n</tool_call>";
    tc_feed(p, b, strlen(b), on_ev, &o);
    CHECK_EQ_INT(o.n_done, 1);
    CHECK(o.args[0].p && !strcmp(o.args[0].p, "{\"content\": \"long text\"}"));
    tc_finish(p, on_ev, &o);
    CHECK(!o.bad);
    tc_free(p);
    outcome_free(&o);
}

TEST(tc_json_malformed_degrades) {
    /* vLLM: a json.loads failure makes the whole output content. A call already begun (name streamed)
     * is aborted first. */
    const char *t1 =
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": Paris}}\n</tool_call>";
    CHECK_TC(JSN, TOOLS, t1, .content = t1, .n = 0, .aborted = 1);
    const char *t2 = "<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>";
    CHECK_TC(JSN, TOOLS, t2, .content = t2, .n = 0);
    const char *t3 = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par";
    CHECK_TC(JSN, TOOLS, t3, .content = t3, .n = 0, .aborted = 1);
    const char *t4 = "Use <tool_call> like this: <tool_call>[1]</tool_call>";
    CHECK_TC(JSN, TOOLS, t4, .content = t4, .n = 0);
    /* The XML form is not a call in the JSON format. */
    const char *t5 = "<function=get_weather>\n</function>";
    CHECK_TC(JSN, TOOLS, t5, .content = t5, .n = 0);
    /* A second "name" that contradicts the streamed one. */
    const char *t6 =
        "<tool_call>{\"name\": \"list_files\", \"arguments\": {}, \"name\": \"write_file\"}</tool_call>";
    CHECK_TC(JSN, TOOLS, t6, .content = t6, .n = 0, .aborted = 1);
    /* A mismatched bracket inside the arguments. */
    const char *t7 = "<tool_call>{\"name\": \"list_files\", \"arguments\": {\"a\": [}]}</tool_call>";
    CHECK_TC(JSN, TOOLS, t7, .content = t7, .n = 0, .aborted = 1);
}

/* ---- value conversion, one by one */

static void conv(const char *file, int line, const char *type, const char *value, const char *want) {
    char props[256], out[512];
    snprintf(props, sizeof props, "{\"v\": %s}", type);
    int n = tc_convert_value(props, "v", value, strlen(value), out, sizeof out);
    if (n < 0 || strcmp(out, want))
        test_fail(file, line, "%s %s: got [%s] want [%s]", type, value, n < 0 ? "" : out, want);
}
#define CONV(type, value, want) conv(__FILE__, __LINE__, type, value, want)

TEST(tc_convert_value_rules) {
    /* integer: Python int() — blanks stripped, underscores, sign, any size; else the raw string */
    CONV("{\"type\":\"integer\"}", " 42 ", "42");
    CONV("{\"type\":\"integer\"}", "-1_000", "-1000");
    CONV("{\"type\":\"integer\"}", "007", "7");
    CONV("{\"type\":\"integer\"}", "123456789012345678901234567890", "123456789012345678901234567890");
    CONV("{\"type\":\"integer\"}", "1.5", "\"1.5\"");
    CONV("{\"type\":\"int64\"}", "-0", "0");
    /* number: float(), integral → int */
    CONV("{\"type\":\"number\"}", "1e20", "100000000000000000000");
    CONV("{\"type\":\"number\"}", "0.1", "0.1");
    CONV("{\"type\":\"number\"}", "-2.5e-7", "-2.5e-07");
    CONV("{\"type\":\"number\"}", "1234567.125", "1234567.125");
    CONV("{\"type\":\"float\"}", "inf", "\"inf\"");
    CONV("{\"type\":\"number\"}", "abc", "\"abc\"");
    /* boolean */
    CONV("{\"type\":\"boolean\"}", "TRUE", "true");
    CONV("{\"type\":\"boolean\"}", "1", "false");
    /* null spellings */
    CONV("{\"type\":\"integer\"}", "NULL", "null");
    CONV("{\"type\":\"string\"}", "None", "\"None\"");
    CONV("{\"type\":[\"string\",\"null\"]}", "none", "null");
    CONV("{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"integer\"}]}", "5", "5");
    /* containers: JSON first, then Python literals, then the raw string */
    CONV("{\"type\":\"object\"}", "{\"a\":1,\"b\":[true,false,null]}",
         "{\"a\": 1, \"b\": [true, false, null]}");
    CONV("{\"type\":\"object\"}", "{'a': 1, 2: 'x', True: None}", "{\"a\": 1, \"2\": \"x\", \"true\": null}");
    CONV("{\"type\":\"object\"}", "\"{'k': 'v'}\"", "{\"k\": \"v\"}");
    CONV("{\"type\":\"array\"}", "[1, 'two', 3.0, -4, 0x10]", "[1, \"two\", 3.0, -4, 16]");
    CONV("{\"type\":\"array\"}", "('a',)", "[\"a\"]");
    CONV("{\"type\":\"array\"}", "[1, 2", "\"[1, 2\"");
    CONV("{\"type\":\"array\"}", "{1, 2}", "\"{1, 2}\""); /* a set: json.dumps cannot write it */
    CONV("{\"type\":\"list[str]\"}", "['\\u00e9\\n', r'\\d']", "[\"é\\n\", \"\\\\d\"]");
    CONV("{\"type\":\"object\"}", "{\"k\": \"日本\"}", "{\"k\": \"日本\"}");
    /* other types: ast.literal_eval, else the string */
    CONV("{\"type\":\"null\"}", "x", "\"x\"");
    CONV("{\"type\":\"date\"}", "'2024-01-01'", "\"2024-01-01\"");
    CONV("{\"type\":\"date\"}", "2024-01-01", "\"2024-01-01\"");
    /* no type: string; not in the schema: string */
    CONV("{}", "5", "\"5\"");
    char out[64];
    CHECK_EQ_INT(tc_convert_value("{\"v\":{\"type\":\"integer\"}}", "w", "5", 1, out, sizeof out), 3);
    CHECK(!strcmp(out, "\"5\""));
    CHECK_EQ_INT(tc_convert_value(NULL, "v", "12345", 5, out, 4), CINFER_ERANGE);
}

TEST(tc_create_rejects_bad_tools) {
    tc_parser *p;
    char err[128] = "";
    CHECK_EQ_INT(tc_create(&p, XML, "{\"a\":1}", 7, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "array");
    CHECK_EQ_INT(tc_create(&p, XML, "[", 1, err, sizeof err), CINFER_EFORMAT);
    CHECK_EQ_INT(tc_create(&p, (tc_format)7, NULL, 0, err, sizeof err), CINFER_EINVAL);
    CHECK(p == NULL);
}

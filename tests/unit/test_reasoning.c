/* test_reasoning.c — the `<think>` splitter: each example fed whole, byte by byte, split in two at every
 * position and in random chunkings gives the same reasoning and content. Expected splits follow vLLM's
 * Qwen3ReasoningParser.extract_reasoning (and mlx-lm's TextStateMachine where the prompt did not open
 * `<think>`); each test names the behaviour it mirrors. Then the reasoning → tool-call pipeline. */
#include <stdint.h>
#include <stdlib.h>

#include "cinfer.h"
#include "test.h"
#include "tok/reasoning.h"
#include "tok/toolcall.h"

typedef struct {
    char *r, *c;
    size_t rn, cn;
    int bad, phase; /* 1: reasoning seen; 2: content after reasoning — no reasoning may follow */
} split;

static void add(char **p, size_t *n, const char *t, size_t k) {
    *p = realloc(*p, *n + k + 1);
    memcpy(*p + *n, t, k);
    *n += k;
    (*p)[*n] = 0;
}

static void on_rs(const rs_event *e, void *ud) {
    split *s = ud;
    if (!e->len) s->bad = 1;
    if (e->kind == RS_EV_REASONING) {
        if (s->phase == 2) s->bad = 1;
        add(&s->r, &s->rn, e->text, e->len);
        s->phase = 1;
    } else {
        add(&s->c, &s->cn, e->text, e->len);
        if (s->phase == 1) s->phase = 2;
    }
}

static uint64_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* mode 0: whole; 1: bytes; 2: split at `at`; 3: random chunks seeded by `at`. */
static void rs_run(int started, int enabled, const char *text, int mode, uint64_t at, split *s) {
    memset(s, 0, sizeof *s);
    rs_parser *p = rs_create(started, enabled);
    size_t n = strlen(text), i = 0;
    uint64_t seed = at + 7;
    while (i < n) {
        size_t k = mode == 0 ? n : mode == 1 ? 1 : mode == 2 ? (i < at ? at - i : n - i) : 1 + lcg(&seed) % 6;
        if (k > n - i) k = n - i;
        rs_feed(p, text + i, k, on_rs, s);
        i += k;
    }
    rs_finish(p, on_rs, s);
    if (rs_finish(p, on_rs, s) != CINFER_ESTATE) s->bad = 1;
    rs_free(p);
}

static void rs_check(const char *file, int line, int started, int enabled, const char *text,
                     const char *want_r, const char *want_c) {
    size_t n = strlen(text);
    for (int mode = 0; mode < 4; mode++) {
        uint64_t reps = mode == 2 ? n + 1 : mode == 3 ? 40 : 1;
        for (uint64_t r = 0; r < reps; r++) {
            split s;
            rs_run(started, enabled, text, mode, r, &s);
            const char *gr = s.r ? s.r : "", *gc = s.c ? s.c : "";
            int ok = !s.bad && !strcmp(gr, want_r) && !strcmp(gc, want_c);
            if (!ok)
                test_fail(file, line, "mode %d/%llu: reasoning [%s] content [%s] (bad %d); want [%s] [%s]",
                          mode, (unsigned long long)r, gr, gc, s.bad, want_r, want_c);
            free(s.r);
            free(s.c);
            if (!ok) return;
        }
    }
}
#define RS_CHECK(started, enabled, text, r, c) rs_check(__FILE__, __LINE__, started, enabled, text, r, c)

TEST(rs_qwen35_prompt_opened_think) {
    /* extract_reasoning: partition at </think>; neither side is trimmed (vLLM and mlx-lm keep the
     * template's "\n" before and "\n\n" after the tag). */
    RS_CHECK(1, 1, "The user greets me.\n</think>\n\nHello! How can I help?", "The user greets me.\n",
             "\n\nHello! How can I help?");
    /* no </think>: truncated output, everything is reasoning */
    RS_CHECK(1, 1, "Still thinking about <b> and </thi", "Still thinking about <b> and </thi", "");
    /* a second </think> or a <think> in the content is content text */
    RS_CHECK(1, 1, "r</think>c </think> <think> d", "r", "c </think> <think> d");
    /* empty reasoning */
    RS_CHECK(1, 1, "</think>\n\nAnswer", "", "\n\nAnswer");
    /* unicode on both sides, tags glued to multibyte text */
    RS_CHECK(1, 1, "思考中…🤔</think>答え：東京", "思考中…🤔", "答え：東京");
}

TEST(rs_generated_think_tag) {
    /* Old templates: the model writes <think> itself. vLLM strips it; we strip it when nothing but
     * blanks precede it. */
    RS_CHECK(1, 1, "<think>\nR\n</think>\n\nC", "\nR\n", "\n\nC");
    RS_CHECK(1, 1, "\n<think>R</think>C", "\nR", "C");
    /* after real reasoning text, a <think> is just text (vLLM would drop what precedes it) */
    RS_CHECK(1, 1, "about <think> tags</think>C", "about <think> tags", "C");
}

TEST(rs_prompt_did_not_open_think) {
    /* mlx-lm TextStateMachine from the "normal" state: text before <think> is content, the think block
     * is reasoning, then content. */
    RS_CHECK(0, 1, "<think>\nPlan.\n</think>\n\nDone.", "\nPlan.\n", "\n\nDone.");
    RS_CHECK(0, 1, "No thinking here, just <b>bold</b>.", "", "No thinking here, just <b>bold</b>.");
    RS_CHECK(0, 1, "pre <think>r", "r", "pre ");
    RS_CHECK(0, 1, "x <thi", "", "x <thi");
}

TEST(rs_thinking_disabled) {
    /* enable_thinking=false: the serving layer routes everything to content. */
    RS_CHECK(1, 0, "a</think>b<think>c", "", "a</think>b<think>c");
    RS_CHECK(0, 0, "plain", "", "plain");
}

TEST(rs_tool_call_ends_reasoning) {
    /* Qwen3ReasoningParser: <tool_call> followed by <function[\s=] ends the reasoning; the tag goes to
     * content. A bare <tool_call> mention does not. */
    RS_CHECK(1, 1, "I need the weather.\n<tool_call>\n<function=get_weather>\n</function>\n</tool_call>",
             "I need the weather.\n", "<tool_call>\n<function=get_weather>\n</function>\n</tool_call>");
    RS_CHECK(1, 1, "Write <tool_call> then JSON.</think>ok", "Write <tool_call> then JSON.", "ok");
    RS_CHECK(1, 1, "a <tool_call>\n<functional> b", "a <tool_call>\n<functional> b", "");
    /* undecided at the end of the stream: not a genuine call */
    RS_CHECK(1, 1, "a <tool_call>\n<func", "a <tool_call>\n<func", "");
    /* after </think>, tool calls are the tool parser's business */
    RS_CHECK(1, 1, "r</think><tool_call>\n<function=f>", "r", "<tool_call>\n<function=f>");
}

TEST(rs_emits_early) {
    /* Text goes out as soon as it cannot be part of a tag. */
    split s;
    memset(&s, 0, sizeof s);
    rs_parser *p = rs_create(1, 1);
    rs_feed(p, "abc <", 5, on_rs, &s);
    CHECK(s.r && !strcmp(s.r, "abc "));
    CHECK(rs_in_reasoning(p));
    rs_feed(p, "/think>x", 8, on_rs, &s);
    CHECK(s.c && !strcmp(s.c, "x"));
    CHECK(!rs_in_reasoning(p));
    rs_feed(p, "<tool_call>", 11, on_rs, &s); /* content passes straight through */
    CHECK(!strcmp(s.c, "x<tool_call>"));
    rs_finish(p, on_rs, &s);
    CHECK(!s.bad);
    rs_free(p);
    free(s.r);
    free(s.c);
}

/* ---- the pipeline the server will run: detokenized text → reasoning → tool calls */

typedef struct {
    char *reasoning, *content, *args;
    size_t rn, cn, an;
    int calls;
    tc_parser *tc;
} pipe_out;

static void on_tc(const tc_event *e, void *ud) {
    pipe_out *o = ud;
    if (e->kind == TC_EV_CONTENT) add(&o->content, &o->cn, e->text, e->len);
    if (e->kind == TC_EV_CALL_END) {
        add(&o->args, &o->an, e->name, strlen(e->name));
        add(&o->args, &o->an, e->text, e->len);
        o->calls++;
    }
}

static void on_pipe(const rs_event *e, void *ud) {
    pipe_out *o = ud;
    if (e->kind == RS_EV_REASONING)
        add(&o->reasoning, &o->rn, e->text, e->len);
    else
        tc_feed(o->tc, e->text, e->len, on_tc, o);
}

TEST(rs_pipeline_with_tool_call) {
    static const char *text =
        "The user wants Paris weather.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
        "Paris\n</parameter>\n</function>\n</tool_call>";
    static const char *tools =
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":"
        "{\"properties\":{\"city\":{\"type\":\"string\"}}}}}]";
    for (size_t chunk = 1; chunk <= strlen(text); chunk++) {
        pipe_out o;
        memset(&o, 0, sizeof o);
        REQUIRE(!tc_create(&o.tc, TC_FORMAT_QWEN_XML, tools, strlen(tools), NULL, 0));
        rs_parser *rs = rs_create(1, 1);
        for (size_t i = 0; i < strlen(text); i += chunk) {
            size_t k = strlen(text) - i < chunk ? strlen(text) - i : chunk;
            rs_feed(rs, text + i, k, on_pipe, &o);
        }
        rs_finish(rs, on_pipe, &o);
        tc_finish(o.tc, on_tc, &o);
        CHECK(o.reasoning && !strcmp(o.reasoning, "The user wants Paris weather.\n"));
        CHECK(o.content == NULL);
        CHECK_EQ_INT(o.calls, 1);
        CHECK(o.args && !strcmp(o.args, "get_weather{\"city\": \"Paris\"}"));
        rs_free(rs);
        tc_free(o.tc);
        free(o.reasoning);
        free(o.content);
        free(o.args);
    }
}

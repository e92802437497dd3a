/* test_server_api.c — request parsing and validation for the HTTP APIs (OpenAI chat/completions,
 * Anthropic messages): fields land where the engine needs them, the chat template context is built as
 * documented, and every bad field is refused with 400 naming it. */
#include <stdlib.h>
#include <string.h>

#include "server/api.h"
#include "test.h"

static json_t *J(const char *s) {
    json_error_t je;
    json_t *j = json_loads(s, 0, &je);
    if (!j) fprintf(stderr, "bad test JSON: %s: %s\n", je.text, s);
    return j;
}

/* Parses a chat body expected to fail; returns the error for inspection. */
static srv_error chat_err(const char *body) {
    srv_error e = {0};
    srv_gen_req r;
    json_t *j = J(body);
    int rc = oai_parse_chat(j, NULL, &r, &e);
    json_decref(j);
    if (rc == 0) {
        srv_gen_req_free(&r);
        e.status = 0;
    }
    return e;
}

TEST(server_body_parse_depth_and_shape) {
    srv_error e;
    json_t *j;
    CHECK_EQ_INT(srv_parse_body("{\"a\":[1,{\"b\":2}]}", 17, 64, &j, &e), 0);
    CHECK(json_is_object(j));
    json_decref(j);
    /* 65 nested arrays inside an object: over the bound of 64 */
    char deep[256] = "{\"a\":";
    for (int i = 0; i < 64; i++) strcat(deep, "[");
    for (int i = 0; i < 64; i++) strcat(deep, "]");
    strcat(deep, "}");
    CHECK_EQ_INT(srv_parse_body(deep, strlen(deep), 64, &j, &e), -1);
    CHECK_EQ_INT(e.status, 400);
    CHECK_STR_CONTAINS(e.message, "deeper than 64");
    CHECK_EQ_INT(srv_parse_body(deep, strlen(deep), 65, &j, &e), 0);
    json_decref(j);
    /* brackets and escaped quotes inside strings do not count */
    const char *s = "{\"a\":\"[[[[[\\\"{{{{{\"}";
    CHECK_EQ_INT(srv_parse_body(s, strlen(s), 2, &j, &e), 0);
    json_decref(j);
    CHECK_EQ_INT(srv_parse_body("{\"a\":", 5, 64, &j, &e), -1);
    CHECK_STR_CONTAINS(e.message, "invalid JSON");
    CHECK_EQ_INT(srv_parse_body("[1,2]", 5, 64, &j, &e), -1);
    CHECK_STR_CONTAINS(e.message, "must be a JSON object");
    CHECK_EQ_INT(srv_parse_body("{\"a\":1,\"a\":2}", 13, 64, &j, &e), -1);
    CHECK_EQ_INT(srv_parse_body("", 0, 64, &j, &e), -1);
    /* not NUL-terminated: only size bytes are read */
    char buf[8] = {'{', '}', 'x', 'x', 'x', 'x', 'x', 'x'};
    CHECK_EQ_INT(srv_parse_body(buf, 2, 64, &j, &e), 0);
    json_decref(j);
}

TEST(server_chat_parse_fields) {
    srv_defaults d;
    srv_defaults_init(&d);
    d.top_k = 40;
    json_t *targs = J("{\"enable_thinking\":true,\"server_only\":1}");
    d.chat_template_args = targs;
    json_t *body = J("{\"model\":\"m1\",\"messages\":[{\"role\":\"developer\",\"content\":\"be brief\"},"
                     "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi\"}]},"
                     "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
                     "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"}}]},"
                     "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"42\"}],"
                     "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"n\":3,\"max_tokens\":7,"
                     "\"max_completion_tokens\":9,\"temperature\":0.5,\"top_p\":0.9,\"min_p\":0.05,"
                     "\"presence_penalty\":0.5,\"frequency_penalty\":-0.5,\"repetition_penalty\":1.1,\"seed\":123,"
                     "\"logit_bias\":{\"17\":-100,\"5\":2.5},\"stop\":[\"END\",\"\\n\\n\"],\"logprobs\":true,\"top_logprobs\":3,"
                     "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}],"
                     "\"tool_choice\":\"auto\",\"chat_template_kwargs\":{\"enable_thinking\":false},"
                     "\"response_format\":{\"type\":\"text\"}}");
    srv_gen_req r;
    srv_error e = {0};
    REQUIRE(oai_parse_chat(body, &d, &r, &e) == 0);
    CHECK(!strcmp(r.model, "m1"));
    CHECK_EQ_INT(r.stream, 1);
    CHECK_EQ_INT(r.include_usage, 1);
    CHECK_EQ_INT(r.n, 3);
    CHECK_EQ_INT(r.max_tokens, 9); /* max_completion_tokens wins */
    CHECK_NEAR(r.sampling.temperature, 0.5, 1e-6);
    CHECK_NEAR(r.sampling.top_p, 0.9, 1e-6);
    CHECK_EQ_INT(r.sampling.top_k, 40); /* server default kept */
    CHECK_NEAR(r.sampling.min_p, 0.05, 1e-6);
    CHECK_NEAR(r.sampling.presence_penalty, 0.5, 1e-6);
    CHECK_NEAR(r.sampling.frequency_penalty, -0.5, 1e-6);
    CHECK_NEAR(r.sampling.repetition_penalty, 1.1, 1e-6);
    CHECK_EQ_INT(r.sampling.has_seed, 1);
    CHECK_EQ_INT(r.sampling.seed, 123);
    CHECK_EQ_INT(r.sampling.n_logprobs, 3);
    REQUIRE(r.sampling.n_logit_bias == 2);
    int saw17 = 0, saw5 = 0;
    for (int i = 0; i < 2; i++) {
        if (r.sampling.logit_bias[i].token == 17 && r.sampling.logit_bias[i].bias == -100) saw17 = 1;
        if (r.sampling.logit_bias[i].token == 5 && r.sampling.logit_bias[i].bias == 2.5f) saw5 = 1;
    }
    CHECK(saw17 && saw5);
    REQUIRE(r.n_stop == 2);
    CHECK(!strcmp(r.stop[0], "END") && !strcmp(r.stop[1], "\n\n"));
    CHECK_EQ_INT(r.has_tools, 1);
    CHECK_STR_CONTAINS(r.tools_json, "\"name\":\"f\"");
    CHECK_EQ_INT(r.n_prompts, 1);

    json_t *ctx = J(r.template_ctx);
    REQUIRE(ctx);
    CHECK(json_is_true(json_object_get(ctx, "add_generation_prompt")));
    /* request kwargs override the server's; the server's other keys stay */
    CHECK(json_is_false(json_object_get(ctx, "enable_thinking")));
    CHECK_EQ_INT(json_integer_value(json_object_get(ctx, "server_only")), 1);
    json_t *msgs = json_object_get(ctx, "messages");
    REQUIRE(json_array_size(msgs) == 4);
    CHECK(!strcmp(json_string_value(json_object_get(json_array_get(msgs, 0), "role")), "system"));
    CHECK(json_is_array(json_object_get(json_array_get(msgs, 1), "content")));
    /* arguments string became an object for the template */
    json_t *args = json_object_get(json_object_get(json_array_get(json_object_get(json_array_get(msgs, 2), "tool_calls"), 0), "function"),
                                   "arguments");
    CHECK(json_is_object(args));
    CHECK_EQ_INT(json_integer_value(json_object_get(args, "x")), 1);
    CHECK_EQ_INT(json_array_size(json_object_get(ctx, "tools")), 1);
    json_decref(ctx);
    srv_gen_req_free(&r);
    json_decref(body);
    json_decref(targs);
}

TEST(server_chat_parse_defaults) {
    srv_gen_req r;
    srv_error e = {0};
    json_t *body = J("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
                     "\"tool_choice\":\"none\",\"logprobs\":false,\"seed\":null,\"stop\":\"S\"}");
    REQUIRE(oai_parse_chat(body, NULL, &r, &e) == 0);
    CHECK_EQ_INT(r.n, 1);
    CHECK_EQ_INT(r.stream, 0);
    CHECK_EQ_INT(r.max_tokens, 0);
    CHECK_NEAR(r.sampling.temperature, 1.0, 0);
    CHECK_EQ_INT(r.sampling.has_seed, 0);
    CHECK_EQ_INT(r.sampling.n_logprobs, -1);
    CHECK_EQ_INT(r.n_stop, 1);
    /* tool_choice none: tools neither rendered nor parsed */
    CHECK_EQ_INT(r.has_tools, 0);
    CHECK(!strstr(r.template_ctx, "\"tools\""));
    CHECK(r.model == NULL);
    srv_gen_req_free(&r);
    json_decref(body);
}

TEST(server_chat_parse_errors_name_the_field) {
    static const struct {
        const char *body, *param, *msg;
    } cases[] = {
        {"{}", "messages", "must be an array"},
        {"{\"messages\":[]}", "messages", "must not be empty"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"robot\",\"content\":\"x\"}]}", "messages[1]", "role"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages[0].content", "must be a string"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]}]}",
         "messages[0].content[0].image_url.url", "only data: URLs"},
        {"{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":\"{bad\"}}]}]}", "messages[0]",
         "not a JSON object"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":\"hot\"}", "temperature", "must be a number"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":-1}", "temperature", "must be in"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_p\":0}", "top_p", "(0, 1]"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_k\":1.5}", "top_k", "must be an integer"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":0}", "n", "must be in"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":17}", "n", "must be in"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":0}", "max_tokens", "must be in"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":\"yes\"}", "stream", "boolean"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"seed\":1.5}", "seed", "integer"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logit_bias\":{\"abc\":1}}", "logit_bias", "not a token id"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logit_bias\":{\"3\":101}}", "logit_bias", "[-100, 100]"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"a\",1]}", "stop", "stop[1]"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"\"]}", "stop", "empty"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\","
         "\"11\",\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"]}",
         "stop", "at most 16"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", "top_logprobs", "needs 'logprobs'"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":21}", "top_logprobs", "must be in"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json\"}}", "response_format",
         "json_schema"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_schema\"}}",
         "response_format.json_schema", "schema"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"required\"}", "tool_choice", "no tools"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"maybe\"}", "tool_choice", "expected"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":{\"type\":\"function\"}}", "tool_choice", "function"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{}}]}", "tools[0]", "name"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":{}}", "tools", "must be an array"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":[]}", "chat_template_kwargs", "object"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream_options\":{\"include_usage\":1}}", "stream_options.include_usage",
         "boolean"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"best_of\":2}", "best_of", "not supported"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        srv_error e = chat_err(cases[i].body);
        CHECK_MSG(e.status == 400, "case %zu: status %d", i, e.status);
        CHECK_MSG(!strcmp(e.param, cases[i].param), "case %zu: param '%s', expected '%s'", i, e.param, cases[i].param);
        CHECK_MSG(strstr(e.message, cases[i].msg) != NULL, "case %zu: message '%s' lacks '%s'", i, e.message, cases[i].msg);
    }
}

TEST(server_completion_parse_prompts) {
    srv_gen_req r;
    srv_error e = {0};
    json_t *b = J("{\"prompt\":\"Once upon\",\"max_tokens\":4,\"logprobs\":2,\"n\":2}");
    REQUIRE(oai_parse_completion(b, NULL, &r, &e) == 0);
    CHECK_EQ_INT(r.api, SRV_API_COMPLETION);
    CHECK_EQ_INT(r.n_prompts, 1);
    CHECK(!strcmp(r.prompt_text[0], "Once upon"));
    CHECK(r.prompt_ids[0] == NULL);
    CHECK_EQ_INT(r.sampling.n_logprobs, 2);
    CHECK_EQ_INT(r.n, 2);
    CHECK(r.template_ctx == NULL);
    srv_gen_req_free(&r);
    json_decref(b);

    b = J("{\"prompt\":[1,2,3]}");
    REQUIRE(oai_parse_completion(b, NULL, &r, &e) == 0);
    REQUIRE(r.n_prompts == 1 && r.n_prompt_ids[0] == 3);
    CHECK(r.prompt_ids[0][0] == 1 && r.prompt_ids[0][2] == 3);
    srv_gen_req_free(&r);
    json_decref(b);

    b = J("{\"prompt\":[\"a\",[7,8]]}");
    REQUIRE(oai_parse_completion(b, NULL, &r, &e) == 0);
    REQUIRE(r.n_prompts == 2);
    CHECK(!strcmp(r.prompt_text[0], "a"));
    CHECK(r.n_prompt_ids[1] == 2 && r.prompt_ids[1][1] == 8);
    srv_gen_req_free(&r);
    json_decref(b);

    static const struct {
        const char *body, *param;
    } bad[] = {
        {"{}", "prompt"},
        {"{\"prompt\":5}", "prompt"},
        {"{\"prompt\":[1,-2]}", "prompt"},
        {"{\"prompt\":[1,\"x\"]}", "prompt"},
        {"{\"prompt\":[[]]}", "prompt"},
        {"{\"prompt\":\"x\",\"echo\":true}", "echo"},
        {"{\"prompt\":\"x\",\"suffix\":\"y\"}", "suffix"},
        {"{\"prompt\":\"x\",\"logprobs\":true}", "logprobs"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        b = J(bad[i].body);
        e.status = 0;
        int rc = oai_parse_completion(b, NULL, &r, &e);
        CHECK_MSG(rc == -1 && e.status == 400 && !strcmp(e.param, bad[i].param), "case %zu: rc %d param '%s'", i, rc, e.param);
        if (rc == 0) srv_gen_req_free(&r);
        json_decref(b);
    }
}

TEST(server_anthropic_parse_conversation) {
    json_t *b = J("{\"model\":\"claude-x\",\"max_tokens\":64,\"system\":[{\"type\":\"text\",\"text\":\"sys1\"},{\"type\":\"text\",\"text\":\"sys2\"}],"
                  "\"messages\":[{\"role\":\"user\",\"content\":\"What is 2+2?\"},"
                  "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"hmm\",\"signature\":\"s\"},"
                  "{\"type\":\"text\",\"text\":\"Let me check.\"},{\"type\":\"tool_use\",\"id\":\"tu1\",\"name\":\"calc\",\"input\":{\"e\":\"2+2\"}}]},"
                  "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"tu1\",\"content\":[{\"type\":\"text\",\"text\":\"4\"}]},"
                  "{\"type\":\"text\",\"text\":\"thanks\"}]}],"
                  "\"tools\":[{\"name\":\"calc\",\"description\":\"math\",\"input_schema\":{\"type\":\"object\"}}],"
                  "\"tool_choice\":{\"type\":\"auto\"},\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":1024},"
                  "\"stop_sequences\":[\"###\"],\"temperature\":0.2,\"top_k\":5,\"stream\":true}");
    srv_gen_req r;
    srv_error e = {0};
    REQUIRE(ant_parse_messages(b, NULL, &r, &e) == 0);
    CHECK_EQ_INT(r.api, SRV_API_ANTHROPIC);
    CHECK_EQ_INT(r.max_tokens, 64);
    CHECK_EQ_INT(r.stream, 1);
    CHECK_EQ_INT(r.thinking, 1);
    CHECK_EQ_INT(r.sampling.top_k, 5);
    REQUIRE(r.n_stop == 1);
    CHECK(!strcmp(r.stop[0], "###"));
    CHECK_EQ_INT(r.has_tools, 1);
    json_t *ctx = J(r.template_ctx);
    REQUIRE(ctx);
    CHECK(json_is_true(json_object_get(ctx, "enable_thinking")));
    json_t *m = json_object_get(ctx, "messages");
    REQUIRE(json_array_size(m) == 5);
    CHECK(!strcmp(json_string_value(json_object_get(json_array_get(m, 0), "content")), "sys1\nsys2"));
    json_t *asst = json_array_get(m, 2);
    CHECK(!strcmp(json_string_value(json_object_get(asst, "reasoning_content")), "hmm"));
    CHECK(!strcmp(json_string_value(json_object_get(asst, "content")), "Let me check."));
    json_t *call = json_array_get(json_object_get(asst, "tool_calls"), 0);
    CHECK(!strcmp(json_string_value(json_object_get(call, "id")), "tu1"));
    CHECK(json_is_object(json_object_get(json_object_get(call, "function"), "arguments")));
    json_t *tool = json_array_get(m, 3);
    CHECK(!strcmp(json_string_value(json_object_get(tool, "role")), "tool"));
    CHECK(!strcmp(json_string_value(json_object_get(tool, "tool_call_id")), "tu1"));
    CHECK(!strcmp(json_string_value(json_object_get(tool, "content")), "4"));
    CHECK(!strcmp(json_string_value(json_object_get(json_array_get(m, 4), "content")), "thanks"));
    json_t *t0 = json_array_get(json_object_get(ctx, "tools"), 0);
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(t0, "function"), "name")), "calc"));
    CHECK(json_is_object(json_object_get(json_object_get(t0, "function"), "parameters")));
    json_decref(ctx);
    srv_gen_req_free(&r);
    json_decref(b);

    /* thinking disabled reaches the template; count_tokens needs no max_tokens */
    b = J("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"thinking\":{\"type\":\"disabled\"}}");
    REQUIRE(ant_parse_count_tokens(b, NULL, &r, &e) == 0);
    CHECK_STR_CONTAINS(r.template_ctx, "\"enable_thinking\":false");
    srv_gen_req_free(&r);
    CHECK_EQ_INT(ant_parse_messages(b, NULL, &r, &e), -1);
    CHECK(!strcmp(e.param, "max_tokens"));
    json_decref(b);

    static const struct {
        const char *body, *param;
    } bad[] = {
        {"{\"max_tokens\":5}", "messages"},
        {"{\"max_tokens\":5,\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}", "messages[0]"},
        {"{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\",\"source\":{}}]}]}",
         "messages[0].content[0].source"},
        {"{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":{\"type\":\"any\"}}", "tool_choice"},
        {"{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"web_search_20250305\",\"name\":\"w\"}]}",
         "tools[0]"},
        {"{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"system\":5}", "system"},
        {"{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"thinking\":{\"type\":\"maybe\"}}", "thinking"},
        {"{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop_sequences\":\"x\"}", "stop_sequences"},
        {"{\"max_tokens\":0,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", "max_tokens"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        b = J(bad[i].body);
        e.status = 0;
        int rc = ant_parse_messages(b, NULL, &r, &e);
        CHECK_MSG(rc == -1 && e.status == 400 && !strcmp(e.param, bad[i].param), "case %zu: rc %d param '%s' (%s)", i, rc, e.param, e.message);
        if (rc == 0) srv_gen_req_free(&r);
        json_decref(b);
    }
}

TEST(server_apply_template_ctx) {
    json_t *b = J("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"g\"}}]}");
    char *ctx;
    srv_error e;
    REQUIRE(oai_parse_apply_template(b, NULL, &ctx, &e) == 0);
    CHECK_STR_CONTAINS(ctx, "\"tools\":[");
    CHECK_STR_CONTAINS(ctx, "\"add_generation_prompt\":true");
    free(ctx);
    json_decref(b);
}

TEST(server_reasoning_mode_and_tool_format) {
    const char *open = "<|im_start|>assistant\n<think>\n";
    const char *closed = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
    const char *none = "<|im_start|>assistant\n";
    const char *old = "<think>a</think> user <think>\n";
    CHECK_EQ_INT(srv_reasoning_mode(open, strlen(open)), 1);
    CHECK_EQ_INT(srv_reasoning_mode(closed, strlen(closed)), 2);
    CHECK_EQ_INT(srv_reasoning_mode(none, strlen(none)), 2);
    CHECK_EQ_INT(srv_reasoning_mode(old, strlen(old)), 1);
    CHECK_EQ_INT(srv_reasoning_mode("", 0), 2);
    CHECK_EQ_INT(srv_tool_format("...<tool_call>\\n<function=example_function_name>..."), CINFER_TOOLS_QWEN_XML);
    CHECK_EQ_INT(srv_tool_format("<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call>"),
                 CINFER_TOOLS_HERMES_JSON);
    CHECK_EQ_INT(srv_tool_format("{{ messages }}"), CINFER_TOOLS_NONE);
    CHECK_EQ_INT(srv_tool_format(NULL), CINFER_TOOLS_NONE);
    /* the real Qwen3.5 template in the repository */
    FILE *f = fopen("tools/oracle/qwen35_chat_template.jinja", "rb");
    if (f) {
        static char t[65536];
        size_t n = fread(t, 1, sizeof t - 1, f);
        t[n] = 0;
        fclose(f);
        CHECK_EQ_INT(srv_tool_format(t), CINFER_TOOLS_QWEN_XML);
    }
}

/* Constrained decoding requests: what reaches the engine (it compiles and may still refuse the schema). */
TEST(server_constraints_parsed) {
    static const char *tools =
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}]";
    char body[512];
    srv_gen_req r;
    srv_error e;
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":"
             "\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":{\"type\":\"object\"}}}}");
    json_t *b = J(body);
    REQUIRE(oai_parse_chat(b, NULL, &r, &e) == 0);
    CHECK_EQ_INT(r.constraint, CINFER_CONSTRAIN_JSON);
    CHECK(r.constraint_arg && !strcmp(r.constraint_arg, "{\"type\":\"object\"}"));
    CHECK(!strcmp(r.constraint_param, "response_format"));
    srv_gen_req_free(&r);
    json_decref(b);
    b = J("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_"
          "object\"}}");
    REQUIRE(oai_parse_chat(b, NULL, &r, &e) == 0);
    CHECK(r.constraint == CINFER_CONSTRAIN_JSON && r.constraint_arg == NULL);
    srv_gen_req_free(&r);
    json_decref(b);
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],%s,\"tool_choice\":{\"type\":"
             "\"function\",\"function\":{\"name\":\"f\"}}}",
             tools);
    b = J(body);
    REQUIRE(oai_parse_chat(b, NULL, &r, &e) == 0);
    CHECK(r.constraint == CINFER_CONSTRAIN_TOOL_CALLS && r.constraint_arg && !strcmp(r.constraint_arg, "f"));
    CHECK(r.has_tools);
    srv_gen_req_free(&r);
    json_decref(b);
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],%s,\"tool_choice\":\"required\"}", tools);
    b = J(body);
    REQUIRE(oai_parse_chat(b, NULL, &r, &e) == 0);
    CHECK(r.constraint == CINFER_CONSTRAIN_TOOL_CALLS && r.constraint_arg == NULL);
    srv_gen_req_free(&r);
    json_decref(b);
    b = J("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"name\":\"g\","
          "\"input_schema\":{\"type\":\"object\"}}],\"tool_choice\":{\"type\":\"tool\",\"name\":\"g\"}}");
    REQUIRE(ant_parse_messages(b, NULL, &r, &e) == 0);
    CHECK(r.constraint == CINFER_CONSTRAIN_TOOL_CALLS && r.constraint_arg && !strcmp(r.constraint_arg, "g"));
    srv_gen_req_free(&r);
    json_decref(b);
    b = J(
        "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"name\":\"g\"}],"
        "\"tool_choice\":{\"type\":\"any\"}}");
    REQUIRE(ant_parse_messages(b, NULL, &r, &e) == 0);
    CHECK(r.constraint == CINFER_CONSTRAIN_TOOL_CALLS && r.constraint_arg == NULL);
    srv_gen_req_free(&r);
    json_decref(b);
}

/* Image parts: data: URLs and Anthropic base64 sources are decoded into the request (the template sees
 * {"type":"image"}); remote URLs, bad base64, non-image media types and the limits are 400s naming the part. */
TEST(server_image_parts) {
    srv_defaults d;
    srv_defaults_init(&d);
    srv_gen_req r;
    srv_error e;
    /* "iVBORw0KGgo=" is the PNG signature's first 8 bytes */
    json_t *b = J("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"look\"},"
                  "{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,iVBORw0KGgo=\",\"detail\":\"low\"}},"
                  "{\"type\":\"image_url\",\"image_url\":\"data:image/jpeg;base64,/9j/4A==\"}]}]}");
    REQUIRE(oai_parse_chat(b, &d, &r, &e) == 0);
    CHECK_EQ_INT(r.n_images, 2);
    CHECK_EQ_INT(r.images[0].len, 8);
    CHECK(r.images[0].data[0] == 0x89 && r.images[0].data[1] == 'P');
    CHECK_EQ_INT(r.images[1].len, 4);
    CHECK(r.images[1].data[0] == 0xff && r.images[1].data[1] == 0xd8);
    CHECK_STR_CONTAINS(r.template_ctx, "{\"type\":\"image\"}");
    CHECK(!strstr(r.template_ctx, "base64"));
    srv_gen_req_free(&r);
    json_decref(b);

    b = J("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\",\"source\":{\"type\":\"base64\","
          "\"media_type\":\"image/png\",\"data\":\"iVBORw0KGgo=\"}},{\"type\":\"text\",\"text\":\"what is it?\"}]}]}");
    REQUIRE(ant_parse_messages(b, &d, &r, &e) == 0);
    CHECK_EQ_INT(r.n_images, 1);
    CHECK_EQ_INT(r.images[0].len, 8);
    CHECK_STR_CONTAINS(r.template_ctx, "{\"type\":\"image\"}");
    srv_gen_req_free(&r);
    json_decref(b);
    /* an image-only Anthropic message keeps its parts (no collapse to a string) */
    b = J("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\",\"source\":{\"type\":\"base64\","
          "\"media_type\":\"image/png\",\"data\":\"iVBORw0KGgo=\"}}]}]}");
    REQUIRE(ant_parse_messages(b, &d, &r, &e) == 0);
    CHECK_STR_CONTAINS(r.template_ctx, "\"content\":[{\"type\":\"image\"}]");
    srv_gen_req_free(&r);
    json_decref(b);

    static const struct {
        int ant;
        const char *body, *param, *msg;
    } bad[] = {
        {0, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"https://x.org/a.png\"}}]}]}",
         "messages[0].content[0].image_url.url", "does not fetch"},
        {0, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"file:///etc/passwd\"}}]}]}",
         "messages[0].content[0].image_url.url", "only data: URLs"},
        {0, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,!!!\"}}]}]}",
         "messages[0].content[0].image_url.url", "not base64"},
        {0, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png,abc\"}}]}]}",
         "messages[0].content[0].image_url.url", "must be base64"},
        {0, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:text/plain;base64,YWJj\"}}]}]}",
         "messages[0].content[0].image_url.url", "not an image"},
        {0, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,\"}}]}]}",
         "messages[0].content[0].image_url.url", "empty"},
        {0, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", "messages[0].content[0]", "needs an image_url"},
        {1, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\",\"source\":{\"type\":\"url\","
            "\"url\":\"https://x.org/a.png\"}}]}]}",
         "messages[0].content[0].source", "does not fetch"},
        {1, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\",\"source\":{\"type\":\"base64\","
            "\"media_type\":\"image/png\",\"data\":\"Zm9v=\"}}]}]}",
         "messages[0].content[0].source", "padding"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        b = J(bad[i].body);
        e.status = 0;
        int rc = bad[i].ant ? ant_parse_messages(b, &d, &r, &e) : oai_parse_chat(b, &d, &r, &e);
        CHECK_MSG(rc == -1 && e.status == 400 && !strcmp(e.param, bad[i].param) && strstr(e.message, bad[i].msg),
                  "case %zu: rc %d status %d param '%s' message '%s'", i, rc, e.status, e.param, e.message);
        if (rc == 0) srv_gen_req_free(&r);
        json_decref(b);
    }

    /* limits: image count and encoded bytes */
    d.max_images = 1;
    b = J("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,AAAA\"}},"
          "{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,AAAA\"}}]}]}");
    CHECK_EQ_INT(oai_parse_chat(b, &d, &r, &e), -1);
    CHECK_STR_CONTAINS(e.message, "more than 1 images");
    json_decref(b);
    d.max_images = 0;
    d.max_image_bytes = 5;
    b = J("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,AAAAAAAA\"}}]}]}");
    CHECK_EQ_INT(oai_parse_chat(b, &d, &r, &e), -1);
    CHECK_STR_CONTAINS(e.message, "over the limit of 5 bytes");
    json_decref(b);
}

/* The server's sampling defaults (command line, else the model's generation_config.json) fill what a request
 * leaves out, and what a request names wins — repetition_penalty included. */
TEST(server_sampling_defaults_fill_unset_fields) {
    srv_defaults d;
    srv_defaults_init(&d);
    d.temperature = 0.7f;
    d.top_p = 0.8f;
    d.top_k = 20;
    d.repetition_penalty = 1.1f;
    srv_gen_req r;
    srv_error e;
    json_t *body = J("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
    REQUIRE(oai_parse_chat(body, &d, &r, &e) == 0);
    CHECK_NEAR(r.sampling.temperature, 0.7, 1e-6);
    CHECK_NEAR(r.sampling.top_p, 0.8, 1e-6);
    CHECK_EQ_INT(r.sampling.top_k, 20);
    CHECK_NEAR(r.sampling.repetition_penalty, 1.1, 1e-6);
    srv_gen_req_free(&r);
    json_decref(body);
    body = J("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"temperature\":0,\"repetition_penalty\":1.0}");
    REQUIRE(oai_parse_chat(body, &d, &r, &e) == 0);
    CHECK_NEAR(r.sampling.temperature, 0.0, 1e-6);
    CHECK_NEAR(r.sampling.repetition_penalty, 1.0, 1e-6);
    CHECK_EQ_INT(r.sampling.top_k, 20);
    srv_gen_req_free(&r);
    json_decref(body);
    /* no defaults: the API's neutral values */
    srv_defaults_init(&d);
    body = J("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
    REQUIRE(oai_parse_chat(body, &d, &r, &e) == 0);
    CHECK_NEAR(r.sampling.temperature, 1.0, 1e-6);
    CHECK_NEAR(r.sampling.repetition_penalty, 1.0, 1e-6);
    srv_gen_req_free(&r);
    json_decref(body);
}

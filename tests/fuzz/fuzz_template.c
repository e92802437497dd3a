/* fuzz_template.c — libFuzzer target for the chat-template interpreter: any bytes, compiled as a template and
 * rendered against a fixed conversation (tools, tool calls, content parts, reasoning), must either render
 * within the limits (output NUL-terminated, length within max_output) or fail with a negative code and a
 * message — never crash, hang or exhaust memory. The input is a template source; the seed corpus holds the real
 * chat templates of tests/fixtures/templates plus snippets of each construct. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tok/template.h"
#include "util/err.h"

static const char CTX[] =
    "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_generation_prompt\": true, \"enable_thinking\": false,"
    " \"documents\": null, \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\":"
    " \"Weather \\u00e9\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\","
    " \"description\": \"City\"}, \"days\": {\"type\": [\"integer\", \"null\"], \"default\": 3}}, \"required\": [\"city\"]}}}],"
    " \"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": [{\"type\": \"image\"},"
    " {\"type\": \"text\", \"text\": \"what?\"}]}, {\"role\": \"assistant\", \"content\": \"<think>r</think>a\","
    " \"reasoning_content\": \"r\", \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\","
    " \"arguments\": {\"city\": \"Z\\u00fcrich\", \"days\": 2.5}}}]}, {\"role\": \"tool\", \"content\": \"21 C\"},"
    " {\"role\": \"user\", \"content\": \"thanks\"}]}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    err[0] = 0;
    tmpl *t = NULL;
    int rc = tmpl_compile((const char *)data, size, &t, err, sizeof err);
    if (rc) {
        CI_ASSERT(rc < 0 && err[0] && !t);
        return 0;
    }
    tmpl_opts o = tmpl_default_opts();
    o.max_output = 1 << 20;
    o.max_memory = 64u << 20;
    o.max_iters = 200000;
    o.now = 1700000000;
    char *out = NULL;
    size_t n = 0;
    rc = tmpl_render_opts(t, CTX, sizeof CTX - 1, &o, &out, &n, err, sizeof err);
    if (rc == 0) {
        CI_ASSERT(out && out[n] == 0 && n <= o.max_output);
    } else {
        CI_ASSERT(rc < 0 && !out); /* raise_exception('') fails with an empty message */
    }
    free(out);
    tmpl_free(t);
    return 0;
}

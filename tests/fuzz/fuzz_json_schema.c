/* fuzz_json_schema.c — the JSON Schema compiler and the matcher on arbitrary input. Input: byte 0 = flags
 * (bits 0-1 reasoning mode, bit 2 compile as a tool's parameters, bit 3 XML tool syntax), then the schema up
 * to the first NUL, then bytes to match. Aborts when the bytes fed at once and one by one disagree, or when
 * gm_mask allows a token that then cannot be fed (or refuses one that can). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sample/grammar.h"

static const char *const TOKS[] = {"{",           "}",
                                   "[",           "]",
                                   "\"",          ":",
                                   ",",           " ",
                                   "\n",          "0",
                                   "1",           "-",
                                   ".",           "e",
                                   "a",           "true",
                                   "false",       "null",
                                   "\"a\"",       "{\"",
                                   "\":",         "\",\"",
                                   "</think>",    "<tool_call>\n",
                                   "<parameter=", "\n</parameter>\n",
                                   "</function>", "\xc3\xa9",
                                   "\xc3",        "\\u00",
                                   "12",          "\"x\": "};
#define NT (int)(sizeof TOKS / sizeof TOKS[0])

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    int flags = data[0];
    const char *s = (const char *)data + 1;
    size_t rest = size - 1, sl = 0;
    while (sl < rest && s[sl]) sl++;
    const char *text = s + sl + (sl < rest);
    size_t tl = rest - sl - (sl < rest);
    if (tl > 256) tl = 256;
    grammar *g = NULL;
    char err[256];
    int rc;
    if (flags & 4) {
        /* the schema as the parameters of one tool */
        char *tools = malloc(sl + 64);
        if (!tools) return 0;
        int n = snprintf(tools, sl + 64, "[{\"name\":\"t\",\"parameters\":%.*s}]", (int)sl, s);
        rc = grammar_compile_tools(tools, (size_t)n, (flags >> 3) & 1, (flags & 16) ? "t" : NULL, flags & 3,
                                   &g, err, sizeof err);
        free(tools);
    } else {
        rc = grammar_compile_json(s, sl, flags & 3, &g, err, sizeof err);
    }
    if (rc) {
        if (g || !err[0]) abort();
        return 0;
    }
    size_t lens[NT];
    for (int i = 0; i < NT; i++) lens[i] = strlen(TOKS[i]);
    gm_vocab *v = gm_vocab_create(TOKS, lens, NT);
    gm_matcher *whole = gm_matcher_create(g), *bytes = gm_matcher_create(g);
    int ok_whole = gm_feed(whole, text, tl) == 0, ok_bytes = 1;
    size_t i = 0;
    uint32_t mask[(NT + 31) / 32];
    for (; i < tl; i++) {
        if (i < 8) {
            /* the mask agrees with feeding each token after the same prefix */
            gm_mask(bytes, v, mask);
            for (int t = 0; t < NT; t++) {
                gm_matcher *m = gm_matcher_create(g);
                int ok = gm_feed(m, text, i) == 0 && gm_feed(m, TOKS[t], lens[t]) == 0;
                gm_matcher_free(m);
                if (ok != (int)((mask[t >> 5] >> (t & 31)) & 1)) abort();
            }
        }
        if (gm_feed(bytes, text + i, 1)) {
            ok_bytes = 0;
            break;
        }
    }
    if (ok_whole != ok_bytes) abort();
    if (ok_whole && gm_complete(whole) != gm_complete(bytes)) abort();
    gm_matcher_free(whole);
    gm_matcher_free(bytes);
    gm_vocab_free(v);
    grammar_free(g);
    return 0;
}

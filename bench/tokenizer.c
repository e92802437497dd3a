/* bench/tokenizer.c — single-thread encode throughput of cinfer's tokenizer over a JSONL corpus (one JSON
 * string per line, a document), measured exactly as tools/oracle/tokenizer_goldens.py's `bench` times HF
 * `tokenizers`: one encode call per document, add_special_tokens off, best of 3 passes, MB of UTF-8 input per
 * second. The corpus is read and parsed before timing; only tok_encode is inside the clock.
 *
 *   bench/run_tokenizer.sh CORPUS.jsonl[.xz] NAME=TOKENIZER_DIR ... */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tok/tokenizer.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s CORPUS.jsonl NAME=DIR ...\n", argv[0]);
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    size_t cap = 1024, n = 0, nbytes = 0;
    char **docs = malloc(cap * sizeof *docs);
    size_t *lens = malloc(cap * sizeof *lens);
    char *line = NULL;
    size_t lcap = 0;
    ssize_t got;
    while ((got = getline(&line, &lcap, f)) > 0) {
        json_error_t je;
        json_t *s = json_loadb(line, (size_t)got, JSON_DECODE_ANY, &je);
        if (!s || !json_is_string(s)) {
            fprintf(stderr, "%s: line %zu is not a JSON string\n", argv[1], n + 1);
            return 1;
        }
        if (n == cap) {
            cap *= 2;
            docs = realloc(docs, cap * sizeof *docs);
            lens = realloc(lens, cap * sizeof *lens);
        }
        lens[n] = json_string_length(s);
        docs[n] = malloc(lens[n] + 1);
        memcpy(docs[n], json_string_value(s), lens[n] + 1);
        nbytes += lens[n];
        n++;
        json_decref(s);
    }
    free(line);
    fclose(f);
    for (int a = 2; a < argc; a++) {
        char *eq = strchr(argv[a], '=');
        const char *name = eq ? argv[a] : argv[a], *dir = eq ? eq + 1 : argv[a];
        if (eq) *eq = 0;
        tokenizer *tk;
        char err[512];
        if (tok_load(dir, &tk, err, sizeof err)) {
            fprintf(stderr, "%s: %s\n", dir, err);
            return 1;
        }
        double best = 1e30;
        size_t ntok = 0;
        for (int rep = 0; rep < 3; rep++) {
            ntok = 0;
            double t0 = now();
            for (size_t i = 0; i < n; i++) {
                int32_t *ids;
                size_t k;
                if (tok_encode(tk, docs[i], lens[i], 0, &ids, &k, err, sizeof err)) {
                    fprintf(stderr, "doc %zu: %s\n", i, err);
                    return 1;
                }
                ntok += k;
                free(ids);
            }
            double dt = now() - t0;
            if (dt < best) best = dt;
        }
        printf("cinfer %s: %zu docs, %.2f MB, %zu tokens, best of 3 %.3f s, %.2f MB/s single thread\n", name,
               n, (double)nbytes / 1e6, ntok, best, (double)nbytes / 1e6 / best);
        tok_free(tk);
    }
    for (size_t i = 0; i < n; i++) free(docs[i]);
    free(docs);
    free(lens);
    return 0;
}

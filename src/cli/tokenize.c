/* tokenize.c — `cinfer tokenize` and `cinfer detokenize`: text to ids and ids to text with a model's
 * tokenizer.json, as the reference encode(text, add_special_tokens=False) / decode(ids) give them.
 *   cinfer tokenize -t PATH (--text S | --jsonl FILE) [--add-special-tokens]
 *     prints a JSON array of ids; with --jsonl (each line a JSON string; FILE may be -) one array per line
 *   cinfer detokenize -t PATH --ids 1,2,3 [--skip-special-tokens]
 *     prints the text (exactly: no newline is added unless stdout is a terminal)
 * PATH is a model directory or a folder holding tokenizer.json / tokenizer_config.json. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tok/tokenizer.h"

int cli_tokenize(int argc, char **argv);
int cli_detokenize(int argc, char **argv);

static void tokenize_usage(FILE *f) {
    fprintf(f, "usage: cinfer tokenize -t PATH (--text S | --jsonl FILE) [--add-special-tokens]\n"
               "  prints the ids as a JSON array; --jsonl reads one JSON string per line (FILE may be -)\n"
               "  and prints one array per line. PATH: a model directory or a folder with tokenizer.json.\n");
}

static void detokenize_usage(FILE *f) {
    fprintf(f, "usage: cinfer detokenize -t PATH --ids 1,2,3 [--skip-special-tokens]\n"
               "  prints the decoded text. PATH: a model directory or a folder with tokenizer.json.\n");
}

static void print_ids(const int32_t *ids, size_t n) {
    putchar('[');
    for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
    fputs("]\n", stdout);
}

static int encode_print(const tokenizer *tk, const char *s, size_t n, int special) {
    int32_t *ids = NULL;
    size_t ni = 0;
    char err[512];
    if (tok_encode(tk, s, n, special, &ids, &ni, err, sizeof err)) {
        fprintf(stderr, "cinfer tokenize: %s\n", err);
        return 1;
    }
    print_ids(ids, ni);
    free(ids);
    return 0;
}

int cli_tokenize(int argc, char **argv) {
    const char *path = NULL, *text = NULL, *jsonl = NULL;
    int special = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if ((!strcmp(a, "-t") || !strcmp(a, "--tokenizer")) && i + 1 < argc) path = argv[++i];
        else if (!strcmp(a, "--text") && i + 1 < argc) text = argv[++i];
        else if (!strcmp(a, "--jsonl") && i + 1 < argc) jsonl = argv[++i];
        else if (!strcmp(a, "--add-special-tokens")) special = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            tokenize_usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "cinfer tokenize: unknown or incomplete option '%s'\n", a);
            tokenize_usage(stderr);
            return 2;
        }
    }
    if (!path || (!text == !jsonl)) {
        tokenize_usage(stderr);
        return 2;
    }
    char err[1024];
    tokenizer *tk = NULL;
    if (tok_load(path, &tk, err, sizeof err)) {
        fprintf(stderr, "cinfer tokenize: %s\n", err);
        return 1;
    }
    int rc = 0;
    if (text) {
        rc = encode_print(tk, text, strlen(text), special);
    } else {
        FILE *f = !strcmp(jsonl, "-") ? stdin : fopen(jsonl, "r");
        if (!f) {
            fprintf(stderr, "cinfer tokenize: %s: %s\n", jsonl, strerror(errno));
            tok_free(tk);
            return 1;
        }
        char *line = NULL;
        size_t cap = 0;
        ssize_t got;
        long lineno = 0;
        while (rc == 0 && (got = getline(&line, &cap, f)) >= 0) {
            lineno++;
            json_error_t je;
            /* JSON_ALLOW_NUL: a "\u0000" in the text is a character like any other */
            json_t *v = json_loadb(line, (size_t)got, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
            if (!json_is_string(v)) {
                fprintf(stderr, "cinfer tokenize: %s:%ld: not a JSON string%s%s\n", jsonl, lineno, v ? "" : ": ",
                        v ? "" : je.text);
                json_decref(v);
                rc = 1;
                break;
            }
            rc = encode_print(tk, json_string_value(v), json_string_length(v), special);
            json_decref(v);
        }
        free(line);
        if (f != stdin) fclose(f);
    }
    fflush(stdout);
    tok_free(tk);
    return rc;
}

/* "1,2,3", "1 2 3" or "[1, 2, 3]". */
static int parse_ids(const char *s, int32_t **out, size_t *n) {
    size_t cap = 16, k = 0;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return -1;
    const char *p = s;
    while (*p) {
        while (*p == ' ' || *p == ',' || *p == '[' || *p == ']' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX) {
            free(v);
            return -1;
        }
        if (k == cap) {
            cap *= 2;
            int32_t *nv = realloc(v, cap * sizeof *v);
            if (!nv) {
                free(v);
                return -1;
            }
            v = nv;
        }
        v[k++] = (int32_t)x;
        p = end;
    }
    *out = v;
    *n = k;
    return 0;
}

int cli_detokenize(int argc, char **argv) {
    const char *path = NULL, *ids_s = NULL;
    int skip = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if ((!strcmp(a, "-t") || !strcmp(a, "--tokenizer")) && i + 1 < argc) path = argv[++i];
        else if (!strcmp(a, "--ids") && i + 1 < argc) ids_s = argv[++i];
        else if (!strcmp(a, "--skip-special-tokens")) skip = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            detokenize_usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "cinfer detokenize: unknown or incomplete option '%s'\n", a);
            detokenize_usage(stderr);
            return 2;
        }
    }
    if (!path || !ids_s) {
        detokenize_usage(stderr);
        return 2;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    if (parse_ids(ids_s, &ids, &n)) {
        fprintf(stderr, "cinfer detokenize: --ids: expected a list of non-negative integers like 1,2,3\n");
        return 2;
    }
    char err[1024];
    tokenizer *tk = NULL;
    if (tok_load(path, &tk, err, sizeof err)) {
        fprintf(stderr, "cinfer detokenize: %s\n", err);
        free(ids);
        return 1;
    }
    char *text = NULL;
    size_t len = 0;
    int rc = tok_decode(tk, ids, n, skip, &text, &len, err, sizeof err);
    if (rc) {
        fprintf(stderr, "cinfer detokenize: %s\n", err);
    } else {
        fwrite(text, 1, len, stdout);
        if (isatty(STDOUT_FILENO)) putchar('\n');
        fflush(stdout);
    }
    free(text);
    free(ids);
    tok_free(tk);
    return rc ? 1 : 0;
}

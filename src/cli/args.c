/* args.c — see args.h. */
#include "cli/args.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *arg_value(int argc, char **argv, const char *flag, const char *alt) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], flag) || (alt && !strcmp(argv[i], alt))) return i + 1 < argc ? argv[i + 1] : NULL;
    return NULL;
}

int arg_flag(int argc, char **argv, const char *flag) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], flag)) return 1;
    return 0;
}

static int in_list(const char *s, const char *const *list) {
    for (; list && *list; list++)
        if (!strcmp(s, *list)) return 1;
    return 0;
}

int arg_check(int argc, char **argv, const char *const *value_flags, const char *const *bool_flags, const char *verb) {
    for (int i = 1; i < argc; i++) {
        if (in_list(argv[i], value_flags)) {
            if (i + 1 >= argc) {
                fprintf(stderr, "cinfer %s: %s needs a value\n", verb, argv[i]);
                return -1;
            }
            i++;
        } else if (!in_list(argv[i], bool_flags)) {
            fprintf(stderr, "cinfer %s: unknown argument '%s' (see cinfer %s --help)\n", verb, argv[i], verb);
            return -1;
        }
    }
    return 0;
}

int parse_ids(const char *s, int32_t **out, int *n) {
    int cap = 16, cnt = 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    if (!ids) return -1;
    const char *p = s;
    while (*p) {
        while (*p == ' ') p++;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "cinfer: bad token id list at \"%.20s\" (expected comma-separated non-negative integers)\n", p);
            free(ids);
            return -1;
        }
        if (cnt == cap) {
            cap *= 2;
            int32_t *nid = realloc(ids, (size_t)cap * sizeof *ids);
            if (!nid) {
                free(ids);
                return -1;
            }
            ids = nid;
        }
        ids[cnt++] = (int32_t)v;
        p = end;
        while (*p == ' ') p++;
        if (*p == ',') {
            p++;
            if (!*p) {
                fprintf(stderr, "cinfer: token id list ends with a comma\n");
                free(ids);
                return -1;
            }
        } else if (*p) {
            fprintf(stderr, "cinfer: bad token id list at \"%.20s\"\n", p);
            free(ids);
            return -1;
        }
    }
    if (!cnt) {
        fprintf(stderr, "cinfer: empty token id list\n");
        free(ids);
        return -1;
    }
    *out = ids;
    *n = cnt;
    return 0;
}

int parse_int(const char *s, const char *what, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || end == s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "cinfer: %s must be an integer in [%ld, %ld], got '%s'\n", what, lo, hi, s ? s : "");
        return -1;
    }
    *out = v;
    return 0;
}

int parse_float(const char *s, const char *what, double *out) {
    char *end;
    errno = 0;
    double v = s ? strtod(s, &end) : 0;
    if (!s || end == s || *end || errno || v != v) {
        fprintf(stderr, "cinfer: %s must be a number, got '%s'\n", what, s ? s : "");
        return -1;
    }
    *out = v;
    return 0;
}

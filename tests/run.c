/* run.c — the test runner: runs every registered TEST (or those whose name contains argv[1]) and ends
 * with "N passed, N failed". Exit status is 0 only when nothing failed. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test.h"

typedef struct {
    const char *name, *file;
    test_fn fn;
} test_case;

static test_case *g_tests;
static int g_n, g_cap;
static int g_cur_failed, g_cur_skipped;
static char g_skip_reason[256];
static char g_tmpdir[256];

void test_register(const char *name, const char *file, test_fn fn) {
    if (g_n == g_cap) {
        g_cap = g_cap ? g_cap * 2 : 64;
        g_tests = realloc(g_tests, (size_t)g_cap * sizeof *g_tests);
        if (!g_tests) abort();
    }
    g_tests[g_n++] = (test_case){name, file, fn};
}

void test_fail(const char *file, int line, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "  FAIL %s:%d: %s\n", file, line, buf);
    g_cur_failed++;
}

void test_skip(const char *reason) {
    g_cur_skipped = 1;
    snprintf(g_skip_reason, sizeof g_skip_reason, "%s", reason);
}

const char *test_fixtures_dir(void) {
    const char *d = getenv("CINFER_FIXTURES");
    return d ? d : "tests/fixtures";
}

int test_run(const char *cmd) {
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

const char *test_tmpdir(void) {
    if (!g_tmpdir[0]) {
        snprintf(g_tmpdir, sizeof g_tmpdir, "/tmp/cinfer-test-XXXXXX");
        if (!mkdtemp(g_tmpdir)) abort();
    }
    return g_tmpdir;
}

static int cmp_tests(const void *a, const void *b) {
    const test_case *x = a, *y = b;
    int c = strcmp(x->file, y->file);
    return c ? c : strcmp(x->name, y->name);
}

int main(int argc, char **argv) {
    const char *filter = argc > 1 ? argv[1] : NULL;
    qsort(g_tests, (size_t)g_n, sizeof *g_tests, cmp_tests);
    int passed = 0, failed = 0, skipped = 0;
    for (int i = 0; i < g_n; i++) {
        test_case *t = &g_tests[i];
        if (filter && !strstr(t->name, filter) && !strstr(t->file, filter)) continue;
        g_cur_failed = 0;
        g_cur_skipped = 0;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        t->fn();
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
        if (g_cur_failed) {
            failed++;
            printf("FAIL %s (%s)\n", t->name, t->file);
        } else if (g_cur_skipped) {
            skipped++;
            printf("skip %s: %s\n", t->name, g_skip_reason);
        } else {
            passed++;
            printf("ok   %s (%.0f ms)\n", t->name, ms);
        }
        fflush(stdout);
    }
    if (g_tmpdir[0]) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmpdir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_tmpdir);
    }
    if (skipped) printf("%d skipped\n", skipped);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

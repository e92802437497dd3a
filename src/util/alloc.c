/* alloc.c — see alloc.h. */
#include "util/alloc.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_guard_armed;
static _Thread_local int t_in_guard;
static _Thread_local long t_count;

static void check_guard(size_t n) {
    t_count++;
    if (g_guard_armed && t_in_guard) {
        fprintf(stderr, "cinfer: allocation of %zu bytes inside a no-alloc region\n", n);
        abort();
    }
}

static void oom(size_t n) {
    fprintf(stderr, "cinfer: out of memory allocating %zu bytes\n", n);
    abort();
}

void *xmalloc(size_t n) {
    check_guard(n);
    void *p = malloc(n ? n : 1);
    if (!p) oom(n);
    return p;
}

void *xcalloc(size_t count, size_t size) {
    check_guard(count * size);
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) oom(count * size);
    return p;
}

void *xrealloc(void *p, size_t n) {
    check_guard(n);
    void *q = realloc(p, n ? n : 1);
    if (!q) oom(n);
    return q;
}

char *xstrdup(const char *s) { return xstrndup(s, strlen(s)); }

char *xstrndup(const char *s, size_t n) {
    char *d = xmalloc(n + 1);
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

void *ci_try_alloc(size_t n) {
    check_guard(n);
    void *p = NULL;
    size_t rounded = (n + 63) & ~(size_t)63;
    if (rounded < n) return NULL;
    if (posix_memalign(&p, 64, rounded ? rounded : 64)) return NULL;
    memset(p, 0, rounded ? rounded : 64);
    return p;
}

int ci_mul_overflow(size_t count, size_t size, size_t *out) {
    if (size && count > SIZE_MAX / size) return -1;
    *out = count * size;
    return 0;
}

void alloc_guard_arm(int on) { g_guard_armed = on; }
void alloc_guard_begin(void) { t_in_guard = 1; }
void alloc_guard_end(void) { t_in_guard = 0; }
long alloc_count(void) { return t_count; }

/* alloc.h — checked allocation and the no-alloc guard.
 * xmalloc & co. abort with a message on failure: they are for small bookkeeping whose failure means the
 * process is already lost. Large, input-sized buffers use ci_try_alloc and report CINFER_ENOMEM instead.
 * The guard: between alloc_guard_begin() and alloc_guard_end() on a thread, any x*alloc is fatal when
 * the guard is armed (tests arm it around decode steps to prove nothing allocates in the loop). */
#ifndef CI_ALLOC_H
#define CI_ALLOC_H

#include <stddef.h>

void *xmalloc(size_t n);
void *xcalloc(size_t count, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
char *xstrndup(const char *s, size_t n);

/* 64-byte aligned, zeroed; NULL on failure (never aborts). Free with free(). */
void *ci_try_alloc(size_t n);

/* count * size with overflow check: returns 0 and sets *out, or -1 on overflow. */
int ci_mul_overflow(size_t count, size_t size, size_t *out);

void alloc_guard_arm(int on);   /* process-wide switch, set by tests */
void alloc_guard_begin(void);   /* this thread enters a no-alloc region */
void alloc_guard_end(void);
long alloc_count(void);         /* x*alloc calls so far on this thread */

#endif

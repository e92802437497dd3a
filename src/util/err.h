/* err.h — error reporting: negative CINFER_E* codes plus a message in the caller's buffer, and
 * CI_ASSERT for invariants (a broken invariant is a bug: print file:line and abort). */
#ifndef CI_ERR_H
#define CI_ERR_H

#include <stddef.h>
#include "cinfer.h"

/* Writes a printf-style message into err (if non-NULL) and returns code, so callers can
 * `return ci_err(err, errlen, CINFER_EFORMAT, "...", ...);`. */
int ci_err(char *err, size_t errlen, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Prepends "prefix: " to the message already in err (for adding context on the way up). */
void ci_err_prefix(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

void ci_assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));

#define CI_ASSERT(cond)                                                                                   \
    do {                                                                                                  \
        if (!(cond)) ci_assert_fail(#cond, __FILE__, __LINE__);                                           \
    } while (0)

#endif

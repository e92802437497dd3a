/* err.c — message formatting for the error convention of err.h. */
#include "util/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ci_err(char *err, size_t errlen, int code, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

void ci_err_prefix(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || !errlen) return;
    char prefix[512], old[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    snprintf(old, sizeof old, "%s", err);
    snprintf(err, errlen, "%s: %s", prefix, old);
}

void ci_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "cinfer: assertion failed: %s (%s:%d)\n", expr, file, line);
    abort();
}

const char *cinfer_strerror(int code) {
    switch (code) {
    case CINFER_OK: return "ok";
    case CINFER_EINVAL: return "invalid argument";
    case CINFER_EIO: return "i/o error";
    case CINFER_ENOMEM: return "out of memory";
    case CINFER_EFORMAT: return "malformed input";
    case CINFER_EUNSUPPORTED: return "unsupported";
    case CINFER_ERANGE: return "out of range";
    case CINFER_ENOTFOUND: return "not found";
    case CINFER_ESTATE: return "invalid state";
    default: return "unknown error";
    }
}

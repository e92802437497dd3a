/* log.c — see log.h. */
#include "util/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_level = -1;

static int level_from_env(void) {
    const char *s = getenv("CINFER_LOG");
    if (!s) return LOG_WARN;
    if (!strcmp(s, "debug")) return LOG_DEBUG;
    if (!strcmp(s, "info")) return LOG_INFO;
    if (!strcmp(s, "error")) return LOG_ERROR;
    return LOG_WARN;
}

void log_set_level(int level) { g_level = level; }

void log_msg(int level, const char *fmt, ...) {
    if (g_level < 0) g_level = level_from_env();
    if (level < g_level) return;
    static const char *names[] = {"debug", "info", "warn", "error"};
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cinfer %s: %s\n", names[level & 3], buf);
}

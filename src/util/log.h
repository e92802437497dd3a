/* log.h — leveled logging to stderr. CINFER_LOG=debug|info|warn|error sets the level (default warn). */
#ifndef CI_LOG_H
#define CI_LOG_H

enum { LOG_DEBUG = 0, LOG_INFO = 1, LOG_WARN = 2, LOG_ERROR = 3 };

void log_set_level(int level);
void log_msg(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define LOG_D(...) log_msg(LOG_DEBUG, __VA_ARGS__)
#define LOG_I(...) log_msg(LOG_INFO, __VA_ARGS__)
#define LOG_W(...) log_msg(LOG_WARN, __VA_ARGS__)
#define LOG_E(...) log_msg(LOG_ERROR, __VA_ARGS__)

#endif

/* sbuf.h — a growable byte string for building responses, and the UTF-8 helpers the server needs to put
 * model text (which may split a character across tokens) into JSON, which must be valid UTF-8. */
#ifndef CI_SRV_SBUF_H
#define CI_SRV_SBUF_H

#include <stdarg.h>
#include <stddef.h>

typedef struct sbuf {
    char *data; /* NUL-terminated when non-NULL */
    size_t len, cap;
} sbuf;

void sb_append(sbuf *b, const char *s, size_t n);
void sb_puts(sbuf *b, const char *s);
void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sb_clear(sbuf *b);
void sb_free(sbuf *b);
/* Hands the string to the caller (free with free(); "" when empty) and leaves b empty. */
char *sb_take(sbuf *b);

/* Length of the longest prefix of s[0..n) that does not end inside an incomplete UTF-8 sequence: the
 * bytes after it may be completed by the next chunk. Invalid bytes count as complete (they are replaced
 * later), so at most 3 bytes are ever held back. */
size_t utf8_complete_prefix(const char *s, size_t n);

/* Appends s[0..n) to b with every invalid UTF-8 sequence replaced by U+FFFD. Returns the number of
 * replacements. */
int utf8_append_lossy(sbuf *b, const char *s, size_t n);

/* 1 when s[0..n) is valid UTF-8 (no overlongs, surrogates or code points past U+10FFFF). */
int utf8_valid(const char *s, size_t n);

#endif

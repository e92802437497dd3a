/* sbuf.c — see sbuf.h. Allocation failures abort through xrealloc: response buffers are small and
 * bounded by the request limits, so running out here means the process is already lost. */
#include "server/sbuf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/alloc.h"

static void sb_reserve(sbuf *b, size_t extra) {
    if (b->len + extra + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) cap *= 2;
    b->data = xrealloc(b->data, cap);
    b->cap = cap;
}

void sb_append(sbuf *b, const char *s, size_t n) {
    sb_reserve(b, n);
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}

void sb_puts(sbuf *b, const char *s) { sb_append(b, s, strlen(s)); }

void sb_printf(sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char tmp[256];
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        sb_append(b, tmp, (size_t)n);
        return;
    }
    sb_reserve(b, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void sb_clear(sbuf *b) {
    b->len = 0;
    if (b->data) b->data[0] = 0;
}

void sb_free(sbuf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

char *sb_take(sbuf *b) {
    char *s = b->data ? b->data : xstrdup("");
    b->data = NULL;
    b->len = b->cap = 0;
    return s;
}

/* Length of the valid sequence at s (1..4), 0 when the bytes there are not valid UTF-8, or -1 when they
 * are a valid but truncated start (more bytes are needed than n has). */
static int utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    int len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;      /* overlong */
        else if (c == 0xED) hi = 0x9F; /* surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;      /* overlong */
        else if (c == 0xF4) hi = 0x8F; /* past U+10FFFF */
    } else
        return 0;
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n) return -1;
        unsigned d = s[i];
        if (d < (i == 1 ? lo : 0x80) || d > (i == 1 ? hi : 0xBF)) return 0;
    }
    return len;
}

size_t utf8_complete_prefix(const char *s, size_t n) {
    /* Only the last 3 bytes can start a truncated sequence. */
    size_t start = n > 3 ? n - 3 : 0;
    for (size_t i = start; i < n; i++) {
        unsigned c = (unsigned char)s[i];
        if (c < 0xC2 || c > 0xF4) continue;
        if (utf8_seq((const unsigned char *)s + i, n - i) == -1) return i;
    }
    return n;
}

int utf8_append_lossy(sbuf *b, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    int bad = 0;
    size_t i = 0, run = 0;
    while (i < n) {
        int l = utf8_seq(u + i, n - i);
        if (l > 0) {
            i += (size_t)l;
            continue;
        }
        sb_append(b, s + run, i - run);
        sb_append(b, "\xEF\xBF\xBD", 3);
        bad++;
        i++;
        run = i;
    }
    sb_append(b, s + run, n - run);
    return bad;
}

int utf8_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        int l = utf8_seq(u + i, n - i);
        if (l <= 0) return 0;
        i += (size_t)l;
    }
    return 1;
}

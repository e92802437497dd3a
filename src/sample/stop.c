/* stop.c — see stop.h. Each feed works on held + delta, laid out in the caller's out buffer: the stop
 * search, the hold-back decision and the emitted text all use that one contiguous copy. */
#include "sample/stop.h"

#include <string.h>
#include <utf8proc.h>

#include "cinfer.h"
#include "util/err.h"

int stop_init(stop_matcher *m, const char *const *stops, const size_t *lens, int n, char *err,
              size_t errlen) {
    memset(m, 0, sizeof *m);
    m->matched = -1;
    if (n < 0 || n > STOP_MAX)
        return ci_err(err, errlen, CINFER_EINVAL, "stop: %d stop strings (at most %d)", n, STOP_MAX);
    if (n > 0 && !stops) return ci_err(err, errlen, CINFER_EINVAL, "stop: no strings given");
    for (int i = 0; i < n; i++) {
        if (!stops[i]) return ci_err(err, errlen, CINFER_EINVAL, "stop: string %d is missing", i);
        size_t len = lens ? lens[i] : strlen(stops[i]);
        if (len == 0) return ci_err(err, errlen, CINFER_EINVAL, "stop: string %d is empty", i);
        if (len > STOP_MAX_LEN)
            return ci_err(err, errlen, CINFER_EINVAL, "stop: string %d is %zu bytes (at most %d)", i, len,
                          STOP_MAX_LEN);
        const utf8proc_uint8_t *b = (const utf8proc_uint8_t *)stops[i];
        for (size_t o = 0; o < len;) {
            utf8proc_int32_t cp;
            utf8proc_ssize_t k = utf8proc_iterate(b + o, (utf8proc_ssize_t)(len - o), &cp);
            if (k <= 0)
                return ci_err(err, errlen, CINFER_EINVAL, "stop: string %d is not valid UTF-8 (byte %zu)", i,
                              o);
            o += (size_t)k;
        }
        memcpy(m->str[i], stops[i], len);
        m->len[i] = (uint16_t)len;
    }
    m->n = n;
    return 0;
}

/* Moves cut back to the start of a UTF-8 character that would straddle it. Bytes that are not valid
 * UTF-8 (a stray continuation byte, a lead byte without its continuations followed by more text) are
 * passed through as they are: only a possibly-incomplete character at the cut is held. */
static size_t utf8_cut(const char *s, size_t cut) {
    if (cut == 0) return 0;
    size_t j = cut - 1;
    for (int back = 0; back < 3 && j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80; back++) j--;
    unsigned char b = (unsigned char)s[j];
    size_t need = b < 0x80 ? 1 : (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 1;
    return j + need > cut ? j : cut;
}

int stop_feed(stop_matcher *m, const char *text, size_t len, char *out, size_t cap, size_t *n_out) {
    *n_out = 0;
    if (m->matched >= 0) return CINFER_ESTATE;
    if (len > SIZE_MAX - STOP_HOLD_MAX || cap < m->n_held + len) return CINFER_ERANGE;
    size_t h0 = m->n_held, total = h0 + len;
    memcpy(out, m->held, h0);
    if (len) memcpy(out + h0, text, len);

    /* Occurrences ending inside the old hold were looked for by the feed that made it: search only those
     * ending in the new bytes. For one stop the first occurrence is also the first to end. */
    int best = -1;
    size_t best_start = 0, best_end = 0;
    for (int i = 0; i < m->n; i++) {
        size_t L = m->len[i];
        if (total < L) continue;
        size_t from = h0 + 1 > L ? h0 + 1 - L : 0;
        const char *hit = memmem(out + from, total - from, m->str[i], L);
        if (!hit) continue;
        size_t st = (size_t)(hit - out), end = st + L;
        if (best < 0 || end < best_end || (end == best_end && st < best_start)) {
            best = i;
            best_start = st;
            best_end = end;
        }
    }
    if (best >= 0) {
        /* best_start >= 0 lies in this buffer: any stop that ends here began inside the last hold (which kept
         * the longest suffix that was a stop prefix) or later, never in text already emitted. */
        m->matched = best;
        m->n_held = 0;
        *n_out = best_start;
        return 1;
    }

    /* Hold the longest suffix that is a proper prefix of some stop: it may still complete. */
    size_t hold = 0;
    for (int i = 0; i < m->n; i++) {
        size_t h = (size_t)m->len[i] - 1;
        if (h > total) h = total;
        for (; h > hold; h--)
            if (!memcmp(out + total - h, m->str[i], h)) {
                hold = h;
                break;
            }
    }
    size_t cut = utf8_cut(out, total - hold);
    CI_ASSERT(total - cut <= STOP_HOLD_MAX);
    m->n_held = total - cut;
    memcpy(m->held, out + cut, m->n_held);
    *n_out = cut;
    return 0;
}

int stop_finish(stop_matcher *m, char *out, size_t cap, size_t *n_out) {
    *n_out = 0;
    if (m->matched >= 0) return 0;
    if (cap < m->n_held) return CINFER_ERANGE;
    memcpy(out, m->held, m->n_held);
    *n_out = m->n_held;
    m->n_held = 0;
    return 0;
}

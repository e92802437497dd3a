/* stop.h — stop strings matched on the streamed text. The matcher sits after the streaming detokenizer:
 * each text delta goes in, and what comes out is the text that is safe to send now. A suffix that could
 * still grow into a stop string is held back (a partial stop is never sent), as is an incomplete UTF-8
 * character (what is emitted never splits one). When a stop string completes, the text before it is
 * emitted and the stop string itself is not (OpenAI's behaviour); nothing after it is.
 *
 * Which stop wins: the occurrence that ends first in the text, and among those ending at the same byte the
 * one that starts first. That is what a byte-by-byte stream would see, so the result does not depend on
 * how the text is cut into deltas. Fixed size, no allocation: embed it in the sequence. */
#ifndef CI_STOP_H
#define CI_STOP_H

#include <stddef.h>
#include <stdint.h>

#define STOP_MAX     16  /* stop strings per request */
#define STOP_MAX_LEN 256 /* bytes per stop string */
/* Bytes the matcher can hold back: a stop prefix (< STOP_MAX_LEN) plus an incomplete UTF-8 character. */
#define STOP_HOLD_MAX (STOP_MAX_LEN + 4)

typedef struct stop_matcher {
    int n;                  /* stop strings */
    uint16_t len[STOP_MAX]; /* their byte lengths, 1..STOP_MAX_LEN */
    char str[STOP_MAX][STOP_MAX_LEN];
    char held[STOP_HOLD_MAX]; /* text received but not yet emitted */
    size_t n_held;
    int matched; /* index of the stop that matched, or -1 */
} stop_matcher;

/* stops[i] is lens[i] bytes (lens NULL: NUL-terminated strings). Each must be non-empty, at most
 * STOP_MAX_LEN bytes and valid UTF-8 (a stop starting inside a character could never be matched at a
 * character boundary). n may be 0: then only incomplete UTF-8 is held back. */
int stop_init(stop_matcher *m, const char *const *stops, const size_t *lens, int n, char *err, size_t errlen);

/* Bytes of out that stop_feed may need for a delta of len bytes. */
static inline size_t stop_out_cap(size_t len) {
    return len + STOP_HOLD_MAX;
}

/* Feeds a text delta. Writes the text now safe to emit to out (*n_out bytes; cap must be at least
 * stop_out_cap(len)). Returns 0 while no stop has matched, 1 when one matched in this delta (its index is
 * m->matched, *n_out bytes before it are the last text to send, and the rest is dropped), CINFER_ESTATE
 * when fed after a match, CINFER_ERANGE when cap is too small (nothing is consumed then). */
int stop_feed(stop_matcher *m, const char *text, size_t len, char *out, size_t cap, size_t *n_out);

/* The end of generation without a stop (EOS, max_tokens): the held-back text is final, send it. Copies it
 * to out (*n_out bytes; cap >= STOP_HOLD_MAX always suffices) and empties the matcher's hold. Returns 0
 * (with nothing to send after a match), CINFER_ERANGE when cap is too small (nothing is consumed then). */
int stop_finish(stop_matcher *m, char *out, size_t cap, size_t *n_out);

#endif

/* detok.h — the streaming detokenizer: ids go in one at a time, text comes out only once it is final and
 * complete UTF-8 (a character split over byte-level or byte-fallback tokens is held until its last byte), and
 * what comes out, concatenated and followed by detok_flush, equals tok_decode of all the ids. Decoders that
 * treat the first token differently (Metaspace, Strip) see the same context they see in the full decode: each
 * step decodes a window that starts one emitted group back, as HF's DecodeStream does.
 * One detok per sequence; not shared between threads. */
#ifndef CI_TOK_DETOK_H
#define CI_TOK_DETOK_H

#include <stddef.h>
#include <stdint.h>

#include "tok/tokenizer.h"

typedef struct detok detok;

/* skip_special_tokens: special added tokens produce no text (as tok_decode's flag). */
detok *detok_create(const tokenizer *tk, int skip_special_tokens);
void detok_free(detok *d);
/* Forget the stream (a new sequence). */
void detok_reset(detok *d);

/* Feeds one id. *text / *len get the new text (len 0 when the id completed nothing); the pointer is valid
 * until the next call on d. Returns 0, or a negative CINFER_E* code with a message. */
int detok_push(detok *d, int32_t id, const char **text, size_t *len, char *err, size_t errlen);

/* The text still held back (an incomplete character at the very end comes out as U+FFFD, as in the full
 * decode); the stream is then empty again. */
int detok_flush(detok *d, const char **text, size_t *len, char *err, size_t errlen);

#endif

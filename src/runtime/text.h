/* text.h — the text side of a model (tokenizer.json, chat template) behind cinfer.h's text API, and the
 * per-request text stream the engine turns sampled ids into text with. */
#ifndef CI_TEXT_H
#define CI_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "cinfer.h"

/* Loads dir's tokenizer.json / tokenizer_config.json and chat template when present; a file that is
 * present but malformed is an error. */
int text_load(cinfer_model *cm, const char *dir, char *err, size_t errlen);
void text_unload(cinfer_model *cm);

/* The id of an added token or vocabulary piece, or -1 (also without a tokenizer). */
int32_t text_token_id(const cinfer_model *cm, const char *piece);

typedef struct text_stream text_stream;

/* A streaming detokenizer for one request; without a tokenizer every push yields no text. */
text_stream *text_stream_create(const cinfer_model *cm, int skip_special);
void text_stream_free(text_stream *ts);
/* Feeds one id; *txt and *len get the newly completed text (valid until the next call). */
void text_stream_push(text_stream *ts, int32_t id, const char **txt, size_t *len);
/* The text still held back (an incomplete character at the end), for the end of a request. */
void text_stream_flush(text_stream *ts, const char **txt, size_t *len);
/* The bytes one token decodes to on its own (for logprobs), at most cap; returns the length. */
size_t text_token_bytes(const text_stream *ts, int32_t id, char *buf, size_t cap);

#endif

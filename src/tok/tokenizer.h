/* tokenizer.h — Hugging Face tokenizer.json in C: load (tokenizer.json + tokenizer_config.json), encode text
 * to ids and decode ids to text, exactly as the `tokenizers` library does (Tokenizer.encode / .decode).
 * Supported: model BPE (byte-level, and SentencePiece-style with byte_fallback / fuse_unk / ignore_merges);
 * added tokens with special/lstrip/rstrip/single_word/normalized; normalizers NFC NFD NFKC NFKD Lowercase
 * Replace Prepend Strip Sequence; pre-tokenizers Split ByteLevel Metaspace Digits Punctuation Whitespace
 * WhitespaceSplit Sequence; post-processors TemplateProcessing ByteLevel Sequence; decoders ByteLevel
 * ByteFallback Fuse Strip Replace Metaspace Sequence. Anything else is a load error naming the component.
 * A loaded tokenizer is immutable; tok_encode / tok_decode may run on many threads at once. */
#ifndef CI_TOK_TOKENIZER_H
#define CI_TOK_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct tokenizer tokenizer;

/* path: a directory holding tokenizer.json (and optionally tokenizer_config.json), or the path of a
 * tokenizer.json itself (tokenizer_config.json is then looked for beside it). */
int tok_load(const char *path, tokenizer **out, char *err, size_t errlen);

/* The pure parser behind tok_load: tokenizer.json text, and tokenizer_config.json text or NULL. Every
 * count, id and string from the input is checked; malformed input is CINFER_EFORMAT, a valid file using
 * a component cinfer lacks is CINFER_EUNSUPPORTED, with a message naming it. */
int tok_parse(const char *json, size_t len, const char *config_json, size_t config_len, tokenizer **out,
              char *err, size_t errlen);

void tok_free(tokenizer *tk);

/* text: UTF-8 (invalid UTF-8 is CINFER_EINVAL, as the reference accepts only str). Added tokens written in
 * the text are recognised either way; add_special_tokens applies the post-processor (BOS/EOS templates).
 * *ids is malloc'ed (free with free()); *n may be 0. */
int tok_encode(const tokenizer *tk, const char *text, size_t len, int add_special_tokens, int32_t **ids,
               size_t *n, char *err, size_t errlen);

/* Ids the tokenizer does not know are dropped, as the reference does. *out is malloc'ed, NUL-terminated,
 * valid UTF-8; *out_len (may be NULL) gets its length. */
int tok_decode(const tokenizer *tk, const int32_t *ids, size_t n, int skip_special_tokens, char **out,
               size_t *out_len, char *err, size_t errlen);

/* One past the largest id the tokenizer knows (model vocabulary and added tokens). */
int32_t tok_vocab_size(const tokenizer *tk);

/* The token string of id as the reference's id_to_token gives it (byte-level pieces in their mapped
 * form, "<0x0A>" for byte-fallback pieces); NULL for an unknown id. Not NUL-terminated: *len is set. */
const char *tok_id_to_piece(const tokenizer *tk, int32_t id, size_t *len);
/* -1 when the string is no token. Added tokens first, then the model vocabulary. */
int32_t tok_piece_to_id(const tokenizer *tk, const char *piece, size_t len);
/* 1 for an added token marked special (what skip_special_tokens drops). */
int tok_is_special(const tokenizer *tk, int32_t id);

/* From tokenizer_config.json (bos_token / eos_token / pad_token); -1 when absent or not a token. */
int32_t tok_bos_id(const tokenizer *tk);
int32_t tok_eos_id(const tokenizer *tk);
int32_t tok_pad_id(const tokenizer *tk);
/* tokenizer_config.json's add_bos_token / add_eos_token (0 when absent). Informational: encode's
 * add_special_tokens follows tokenizer.json's post_processor, as the reference library does. */
int tok_config_add_bos(const tokenizer *tk);
int tok_config_add_eos(const tokenizer *tk);

#endif

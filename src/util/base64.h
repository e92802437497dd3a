/* base64.h — base64 decoding and data: URLs, pure functions over (data, size) for request bodies that carry
 * images. Strict enough to reject garbage with the position at fault, lenient where clients differ: the
 * URL-safe alphabet, missing '=' padding and ASCII whitespace (MIME line breaks) are accepted. */
#ifndef CI_BASE64_H
#define CI_BASE64_H

#include <stddef.h>
#include <stdint.h>

/* An upper bound on the decoded size of n characters of base64. */
size_t b64_decoded_max(size_t n);

/* Decodes s[0, n) into out (cap bytes; b64_decoded_max(n) always suffices). CINFER_EFORMAT names the first
 * bad character (outside the alphabet, '=' before the end, a lone trailing character, non-zero pad bits are
 * accepted as decoders commonly do); CINFER_ERANGE when out is too small. */
int b64_decode(const char *s, size_t n, uint8_t *out, size_t cap, size_t *out_len, char *err, size_t errlen);

/* Splits a data: URL, "data:[<media type>][;param=value]*;base64,<data>". The media type (lowercase as
 * written, may be empty) and the base64 payload point into url. Only base64 payloads are accepted (an image
 * in percent-encoding is not something clients send); CINFER_EFORMAT otherwise, naming what is wrong. */
int data_url_split(const char *url, size_t n, const char **mime, size_t *mime_len, const char **b64,
                   size_t *b64_len, char *err, size_t errlen);

#endif

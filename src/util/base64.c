/* base64.c — base64 decoding (standard and URL-safe alphabets) and data: URL splitting; see base64.h. */
#include "util/base64.h"

#include <string.h>
#include <strings.h>

#include "util/err.h"

size_t b64_decoded_max(size_t n) {
    return n / 4 * 3 + 3;
}

/* 0..63 for an alphabet character, 64 for '=', 65 for whitespace, 255 otherwise */
static unsigned char b64_class(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return (unsigned char)(c - 'A');
    if (c >= 'a' && c <= 'z') return (unsigned char)(c - 'a' + 26);
    if (c >= '0' && c <= '9') return (unsigned char)(c - '0' + 52);
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    if (c == '=') return 64;
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') return 65;
    return 255;
}

int b64_decode(const char *s, size_t n, uint8_t *out, size_t cap, size_t *out_len, char *err, size_t errlen) {
    uint32_t acc = 0;
    int have = 0; /* sextets in acc */
    size_t o = 0, pads = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char k = b64_class((unsigned char)s[i]);
        if (k == 65) continue;
        if (k == 255)
            return ci_err(err, errlen, CINFER_EFORMAT, "base64: character 0x%02x at offset %zu is not base64",
                          (unsigned char)s[i], i);
        if (k == 64) {
            pads++;
            continue;
        }
        if (pads)
            return ci_err(err, errlen, CINFER_EFORMAT, "base64: data after '=' padding at offset %zu", i);
        acc = (acc << 6) | k;
        if (++have == 4) {
            if (o + 3 > cap) return ci_err(err, errlen, CINFER_ERANGE, "base64: output over %zu bytes", cap);
            out[o++] = (uint8_t)(acc >> 16);
            out[o++] = (uint8_t)(acc >> 8);
            out[o++] = (uint8_t)acc;
            acc = 0;
            have = 0;
        }
    }
    if (have == 1) return ci_err(err, errlen, CINFER_EFORMAT, "base64: truncated (a lone final character)");
    if (pads > 2 || (pads && have + pads != 4))
        return ci_err(err, errlen, CINFER_EFORMAT,
                      "base64: %zu '=' padding characters after %d data characters", pads, have);
    if (have) {
        size_t extra = (size_t)have - 1;
        if (o + extra > cap) return ci_err(err, errlen, CINFER_ERANGE, "base64: output over %zu bytes", cap);
        acc <<= 6 * (4 - have);
        out[o++] = (uint8_t)(acc >> 16);
        if (have == 3) out[o++] = (uint8_t)(acc >> 8);
    }
    *out_len = o;
    return 0;
}

int data_url_split(const char *url, size_t n, const char **mime, size_t *mime_len, const char **b64,
                   size_t *b64_len, char *err, size_t errlen) {
    if (n < 5 || strncasecmp(url, "data:", 5)) return ci_err(err, errlen, CINFER_EFORMAT, "not a data: URL");
    const char *p = url + 5, *end = url + n;
    const char *comma = memchr(p, ',', (size_t)(end - p));
    if (!comma) return ci_err(err, errlen, CINFER_EFORMAT, "data: URL without a ',' before its payload");
    const char *semi = memchr(p, ';', (size_t)(comma - p));
    const char *mt_end = semi ? semi : comma;
    /* the last parameter must be "base64" */
    const char *last = comma;
    while (last > p && last[-1] != ';') last--;
    if (!semi || (size_t)(comma - last) != 6 || strncasecmp(last, "base64", 6))
        return ci_err(err, errlen, CINFER_EFORMAT, "data: URL payload must be base64 (\";base64,\")");
    for (const char *q = p; q < mt_end; q++)
        if ((unsigned char)*q <= ' ' || (unsigned char)*q >= 0x7f)
            return ci_err(err, errlen, CINFER_EFORMAT,
                          "data: URL media type has a control or non-ASCII character");
    *mime = p;
    *mime_len = (size_t)(mt_end - p);
    *b64 = comma + 1;
    *b64_len = (size_t)(end - comma - 1);
    return 0;
}

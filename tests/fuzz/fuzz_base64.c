/* fuzz_base64.c — libFuzzer target for b64_decode and data_url_split: any input decodes within the bound
 * b64_decoded_max promises or fails with a message; a decoded payload re-encoded decodes to the same bytes;
 * a split data: URL's parts lie inside the input. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/base64.h"
#include "util/err.h"

static const char ALPHA[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static size_t encode(const uint8_t *in, size_t n, char *out) {
    size_t o = 0, i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
        out[o++] = ALPHA[v >> 18], out[o++] = ALPHA[(v >> 12) & 63], out[o++] = ALPHA[(v >> 6) & 63],
        out[o++] = ALPHA[v & 63];
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)in[i] << 16;
        out[o++] = ALPHA[v >> 18], out[o++] = ALPHA[(v >> 12) & 63], out[o++] = '=', out[o++] = '=';
    } else if (n - i == 2) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8;
        out[o++] = ALPHA[v >> 18], out[o++] = ALPHA[(v >> 12) & 63], out[o++] = ALPHA[(v >> 6) & 63],
        out[o++] = '=';
    }
    return o;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[256];
    size_t cap = b64_decoded_max(size), len = 0;
    uint8_t *out = malloc(cap + 1);
    int rc = b64_decode((const char *)data, size, out, cap, &len, err, sizeof err);
    if (rc == 0) {
        CI_ASSERT(len <= cap);
        char *enc = malloc(len / 3 * 4 + 8);
        size_t el = encode(out, len, enc);
        uint8_t *back = malloc(len + 4);
        size_t bl = 0;
        CI_ASSERT(b64_decode(enc, el, back, len + 3, &bl, err, sizeof err) == 0);
        CI_ASSERT(bl == len && !memcmp(back, out, len));
        free(enc);
        free(back);
    } else {
        CI_ASSERT(rc < 0 && err[0]);
    }
    free(out);
    const char *mime, *b64;
    size_t ml, bl;
    rc = data_url_split((const char *)data, size, &mime, &ml, &b64, &bl, err, sizeof err);
    if (rc == 0) {
        CI_ASSERT(mime >= (const char *)data && mime + ml <= (const char *)data + size);
        CI_ASSERT(b64 >= (const char *)data && b64 + bl == (const char *)data + size);
    } else {
        CI_ASSERT(rc < 0 && err[0]);
    }
    return 0;
}

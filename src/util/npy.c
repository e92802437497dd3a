/* npy.c — see npy.h. */
#include "util/npy.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"

FILE *npy_begin_f32(const char *path, const int64_t *shape, int ndim, char *err, size_t errlen) {
    char dict[256];
    int o = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (");
    for (int i = 0; i < ndim; i++)
        o += snprintf(dict + o, sizeof dict - (size_t)o, "%lld,%s", (long long)shape[i], (i + 1 < ndim || ndim == 1) ? " " : "");
    o += snprintf(dict + o, sizeof dict - (size_t)o, "), }");
    /* magic(6) + version(2) + len(2) + dict padded with spaces and a final \n to a multiple of 64 */
    size_t hlen = (size_t)o + 1, total = 10 + hlen;
    size_t pad = (64 - total % 64) % 64;
    hlen += pad;
    FILE *f = fopen(path, "wb");
    if (!f) {
        ci_err(err, errlen, CINFER_EIO, "%s: %s", path, strerror(errno));
        return NULL;
    }
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xff), (unsigned char)(hlen >> 8)};
    int ok = fwrite(pre, 1, 10, f) == 10 && fwrite(dict, 1, (size_t)o, f) == (size_t)o;
    for (size_t i = 0; ok && i < pad; i++) ok = fputc(' ', f) != EOF;
    ok = ok && fputc('\n', f) != EOF;
    if (!ok) {
        fclose(f);
        ci_err(err, errlen, CINFER_EIO, "%s: write failed", path);
        return NULL;
    }
    return f;
}

int npy_write_f32(const char *path, const float *data, const int64_t *shape, int ndim, char *err, size_t errlen) {
    FILE *f = npy_begin_f32(path, shape, ndim, err, errlen);
    if (!f) return CINFER_EIO;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    int ok = n == 0 || fwrite(data, sizeof(float), (size_t)n, f) == (size_t)n;
    if (fclose(f) != 0) ok = 0;
    if (!ok) return ci_err(err, errlen, CINFER_EIO, "%s: write failed", path);
    return 0;
}

int npy_parse_f32(const void *buf, size_t size, npy_array *out, char *err, size_t errlen) {
    const unsigned char *b = buf;
    memset(out, 0, sizeof *out);
    if (size < 10 || memcmp(b, "\x93NUMPY", 6)) return ci_err(err, errlen, CINFER_EFORMAT, "not an .npy file");
    size_t hlen, hoff;
    if (b[6] == 1) {
        hlen = (size_t)b[8] | ((size_t)b[9] << 8);
        hoff = 10;
    } else if (b[6] == 2 || b[6] == 3) {
        if (size < 12) return ci_err(err, errlen, CINFER_EFORMAT, "truncated .npy header");
        hlen = (size_t)b[8] | ((size_t)b[9] << 8) | ((size_t)b[10] << 16) | ((size_t)b[11] << 24);
        hoff = 12;
    } else {
        return ci_err(err, errlen, CINFER_EFORMAT, ".npy version %d is not supported", b[6]);
    }
    if (hlen > size - hoff) return ci_err(err, errlen, CINFER_EFORMAT, ".npy header length %zu exceeds the file", hlen);
    char h[1024];
    if (hlen >= sizeof h) return ci_err(err, errlen, CINFER_EFORMAT, ".npy header too long");
    memcpy(h, b + hoff, hlen);
    h[hlen] = 0;
    if (!strstr(h, "'descr': '<f4'")) return ci_err(err, errlen, CINFER_EFORMAT, ".npy dtype is not '<f4': %s", h);
    if (!strstr(h, "'fortran_order': False")) return ci_err(err, errlen, CINFER_EFORMAT, ".npy is not C order");
    const char *sp = strstr(h, "'shape': (");
    if (!sp) return ci_err(err, errlen, CINFER_EFORMAT, ".npy header has no shape");
    sp += 10;
    int64_t n = 1;
    while (*sp && *sp != ')') {
        while (*sp == ' ' || *sp == ',') sp++;
        if (*sp == ')') break;
        char *end;
        long long v = strtoll(sp, &end, 10);
        if (end == sp || v < 0 || out->ndim >= 8) return ci_err(err, errlen, CINFER_EFORMAT, ".npy shape is malformed");
        out->shape[out->ndim++] = v;
        if (v && n > INT64_MAX / v) return ci_err(err, errlen, CINFER_EFORMAT, ".npy shape overflows");
        n *= v;
        sp = end;
    }
    size_t doff = hoff + hlen;
    if ((uint64_t)n > (size - doff) / 4)
        return ci_err(err, errlen, CINFER_EFORMAT, ".npy holds %zu bytes of data, shape needs %lld", size - doff, (long long)n * 4);
    out->numel = n;
    out->data = (const float *)(b + doff);
    return 0;
}

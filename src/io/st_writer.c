/* st_writer.c — see st_writer.h. The header is JSON built with jansson, padded with spaces to 8 bytes. */
#include "io/st_writer.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/err.h"

#define FILL_CHUNK (8u << 20)

int st_write_file(const char *path, const st_wtensor *t, int n, st_fill_fn fill, void *ud, char *err, size_t errlen) {
    json_t *root = json_object();
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        json_t *o = json_object(), *shape = json_array(), *offs = json_array();
        int64_t numel = 1;
        for (int d = 0; d < t[i].ndim; d++) {
            json_array_append_new(shape, json_integer(t[i].shape[d]));
            numel *= t[i].shape[d];
        }
        uint64_t bytes = (uint64_t)numel * st_dtype_size(t[i].dtype);
        json_array_append_new(offs, json_integer((json_int_t)off));
        json_array_append_new(offs, json_integer((json_int_t)(off + bytes)));
        json_object_set_new(o, "dtype", json_string(st_dtype_name(t[i].dtype)));
        json_object_set_new(o, "shape", shape);
        json_object_set_new(o, "data_offsets", offs);
        json_object_set_new(root, t[i].name, o);
        off += bytes;
    }
    char *hdr = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!hdr) return ci_err(err, errlen, CINFER_ENOMEM, "cannot serialise the safetensors header");
    size_t hl = strlen(hdr), padded = (hl + 7) & ~(size_t)7;
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(hdr);
        return ci_err(err, errlen, CINFER_EIO, "%s: %s", path, strerror(errno));
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    int ok = fwrite(len8, 1, 8, f) == 8 && fwrite(hdr, 1, hl, f) == hl;
    for (size_t i = hl; ok && i < padded; i++) ok = fputc(' ', f) != EOF;
    free(hdr);
    if (!fill) {
        /* no data: the file is extended over a hole (reads as zeros, takes no disk) */
        ok = ok && fflush(f) == 0 && ftruncate(fileno(f), (off_t)(8 + padded + off)) == 0;
        if (fclose(f) != 0) ok = 0;
        return ok ? 0 : ci_err(err, errlen, CINFER_EIO, "%s: write failed", path);
    }
    void *buf = ok ? malloc(FILL_CHUNK) : NULL;
    ok = ok && buf;
    for (int i = 0; ok && i < n; i++) {
        int64_t numel = 1;
        for (int d = 0; d < t[i].ndim; d++) numel *= t[i].shape[d];
        uint64_t bytes = (uint64_t)numel * st_dtype_size(t[i].dtype);
        for (uint64_t o = 0; ok && o < bytes; o += FILL_CHUNK) {
            size_t nb = bytes - o < FILL_CHUNK ? (size_t)(bytes - o) : FILL_CHUNK;
            fill(ud, i, o, buf, nb);
            ok = fwrite(buf, 1, nb, f) == nb;
        }
    }
    free(buf);
    if (fclose(f) != 0) ok = 0;
    if (!ok) return ci_err(err, errlen, CINFER_EIO, "%s: write failed", path);
    return 0;
}

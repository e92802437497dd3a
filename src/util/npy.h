/* npy.h — NumPy .npy files (format 1.0/2.0) of little-endian float32 in C order: write, and a pure
 * parser over (data, size) for reading fixtures. */
#ifndef CI_NPY_H
#define CI_NPY_H

#include <stddef.h>
#include <stdint.h>

#include <stdio.h>

/* Opens path and writes the header of a '<f4' array of this shape; the caller writes the data (C order)
 * and closes the file. NULL on error (err filled). */
FILE *npy_begin_f32(const char *path, const int64_t *shape, int ndim, char *err, size_t errlen);
int npy_write_f32(const char *path, const float *data, const int64_t *shape, int ndim, char *err, size_t errlen);

typedef struct npy_array {
    int ndim;
    int64_t shape[8];
    int64_t numel;
    const float *data; /* points into the parsed buffer (may be unaligned-safe: the header pads to 64) */
} npy_array;

/* Parses a '<f4' C-order array from a whole file image; data points into buf. */
int npy_parse_f32(const void *buf, size_t size, npy_array *out, char *err, size_t errlen);

#endif

/* st_writer.h — writes safetensors files: declare the tensors, and a callback fills each one's bytes in
 * pieces, so a checkpoint far larger than RAM can be written (cinfer synth). */
#ifndef CI_ST_WRITER_H
#define CI_ST_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "io/safetensors.h"

typedef struct st_wtensor {
    char name[200];
    st_dtype dtype;
    int ndim;
    int64_t shape[8]; /* up to 8 dims (a vision patch embedding is 5-D) */
} st_wtensor;

/* fill(ud, idx, byte_offset, buf, nbytes): write nbytes of tensor idx starting at byte_offset into buf. */
typedef void (*st_fill_fn)(void *ud, int idx, uint64_t byte_offset, void *buf, size_t nbytes);

/* fill NULL: no data is written; the file ends in a hole of the tensors' size (sparse, reads as zeros). */
int st_write_file(const char *path, const st_wtensor *t, int n, st_fill_fn fill, void *ud, char *err, size_t errlen);

#endif

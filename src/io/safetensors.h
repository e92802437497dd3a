/* safetensors.h — the safetensors format: a pure, fully validating header parser over (data, size), and a
 * loader that mmaps every shard of a checkpoint once (following model.safetensors.index.json when present)
 * and looks tensors up by name. Tensor data is never copied. */
#ifndef CI_SAFETENSORS_H
#define CI_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    ST_BF16, ST_F16, ST_F32, ST_F64,
    ST_I8, ST_U8, ST_I16, ST_U16, ST_I32, ST_U32, ST_I64, ST_U64,
    ST_BOOL, ST_F8_E4M3, ST_F8_E5M2,
    ST_N_DTYPES
} st_dtype;

#define ST_MAX_DIMS 8

typedef struct st_tensor {
    char *name;                  /* owned */
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;
    uint64_t begin, end;         /* byte span relative to the start of the data section */
    const void *data;            /* set by the loader: points into the shard's mmap; NULL after st_parse */
    int shard;                   /* index of the shard file (loader) */
} st_tensor;

typedef struct st_header {
    st_tensor *tensors;          /* [n], sorted by name */
    int n;
    uint64_t data_offset;        /* 8 + header length: where the data section starts in the file */
    char *metadata_json;         /* the "__metadata__" object re-serialised, or NULL (owned) */
} st_header;

/* Element size in bytes, name ("BF16"), parse from name (-1 if unknown). */
size_t st_dtype_size(st_dtype t);
const char *st_dtype_name(st_dtype t);
int st_dtype_from_name(const char *s);

/* Parses and validates a whole safetensors file image: the 8-byte little-endian header length, the JSON
 * header (objects of {dtype, shape, data_offsets}), known dtypes, shape product × dtype size == byte span,
 * spans inside the data section, no two spans overlapping, no duplicate names. Pure: touches nothing but
 * its inputs and *out. `size` may exceed the header; the data section is [data_offset, size). */
int st_parse(const void *data, size_t size, st_header *out, char *err, size_t errlen);
void st_header_free(st_header *h);

/* A checkpoint: every shard mmapped once. */
typedef struct st_shard {
    char *path;
    const void *map;
    size_t size;
    st_header header;
} st_shard;

typedef struct st_set {
    st_shard *shards;
    int n_shards;
    const st_tensor **index;     /* every tensor of every shard, sorted by name (pointers into headers) */
    int n_tensors;
} st_set;

/* Opens dir/model.safetensors.index.json (its weight_map names the shards; every listed tensor must be
 * in the shard it is mapped to) or, without an index, dir/model.safetensors, or else every *.safetensors in
 * dir. Names must be unique across shards. */
int st_open_dir(const char *dir, st_set **out, char *err, size_t errlen);
/* Opens one file as a single-shard set. */
int st_open_file(const char *path, st_set **out, char *err, size_t errlen);
void st_close(st_set *s);

/* Binary search by exact name; NULL when absent. */
const st_tensor *st_find(const st_set *s, const char *name);

#endif

/* safetensors.c — the safetensors header parser (pure, over a whole file image) and the checkpoint loader
 * (one read-only mmap per shard, a global name index). Every count and offset read from a file is checked
 * before it is used; tensor bytes are never copied. */
#include "io/safetensors.h"

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/alloc.h"
#include "util/err.h"
#include "util/file.h"

/* A header is metadata only; real checkpoints have headers of a few MB at most. The format's own reference
 * implementation refuses headers over 100 MB, and so do we: a larger one is a corrupt or hostile file. */
#define ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)
/* model.safetensors.index.json is a name → file map; the largest real ones are a few MB. */
#define ST_MAX_INDEX_BYTES ((size_t)256 << 20)
/* Tensor names appear in messages; cap how much of a (possibly huge, hostile) name is printed. */
#define NAME_FMT "%.200s"

static const struct {
    const char *name;
    size_t size;
} k_dtypes[ST_N_DTYPES] = {
    [ST_BF16] = {"BF16", 2}, [ST_F16] = {"F16", 2},         [ST_F32] = {"F32", 4},
    [ST_F64] = {"F64", 8},   [ST_I8] = {"I8", 1},           [ST_U8] = {"U8", 1},
    [ST_I16] = {"I16", 2},   [ST_U16] = {"U16", 2},         [ST_I32] = {"I32", 4},
    [ST_U32] = {"U32", 4},   [ST_I64] = {"I64", 8},         [ST_U64] = {"U64", 8},
    [ST_BOOL] = {"BOOL", 1}, [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_F8_E5M2] = {"F8_E5M2", 1},
};

size_t st_dtype_size(st_dtype t) {
    return (unsigned)t < ST_N_DTYPES ? k_dtypes[t].size : 0;
}

const char *st_dtype_name(st_dtype t) {
    return (unsigned)t < ST_N_DTYPES ? k_dtypes[t].name : "?";
}

int st_dtype_from_name(const char *s) {
    if (!s) return -1;
    for (int i = 0; i < ST_N_DTYPES; i++)
        if (!strcmp(s, k_dtypes[i].name)) return i;
    return -1;
}

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

/* Writes "[4, 8]" into buf for messages. */
static void fmt_shape(char *buf, size_t n, const st_tensor *t) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int d = 0; d < t->ndim && o < n; d++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

/* Reads one tensor entry; t->name is already set. Returns 0 or a CINFER_E code with the message in err. */
static int parse_tensor(json_t *v, st_tensor *t, uint64_t data_size, char *err, size_t errlen) {
    if (!json_is_object(v))
        return ci_err(err, errlen, CINFER_EFORMAT, "tensor \"" NAME_FMT "\": entry is not an object",
                      t->name);
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
           *jo = json_object_get(v, "data_offsets");
    if (!jd) return ci_err(err, errlen, CINFER_EFORMAT, "tensor \"" NAME_FMT "\": no \"dtype\"", t->name);
    if (!js) return ci_err(err, errlen, CINFER_EFORMAT, "tensor \"" NAME_FMT "\": no \"shape\"", t->name);
    if (!jo)
        return ci_err(err, errlen, CINFER_EFORMAT, "tensor \"" NAME_FMT "\": no \"data_offsets\"", t->name);
    if (!json_is_string(jd))
        return ci_err(err, errlen, CINFER_EFORMAT, "tensor \"" NAME_FMT "\": \"dtype\" is not a string",
                      t->name);
    int dt = st_dtype_from_name(json_string_value(jd));
    if (dt < 0)
        return ci_err(err, errlen, CINFER_EUNSUPPORTED,
                      "tensor \"" NAME_FMT
                      "\": unknown dtype \"%.40s\" (known: BF16 F16 F32 F64 I8 U8 I16 U16 I32 "
                      "U32 I64 U64 BOOL F8_E4M3 F8_E5M2)",
                      t->name, json_string_value(jd));
    t->dtype = (st_dtype)dt;

    if (!json_is_array(js))
        return ci_err(err, errlen, CINFER_EFORMAT, "tensor \"" NAME_FMT "\": \"shape\" is not an array",
                      t->name);
    size_t nd = json_array_size(js);
    if (nd > ST_MAX_DIMS)
        return ci_err(err, errlen, CINFER_EFORMAT,
                      "tensor \"" NAME_FMT "\": shape has %zu dimensions (at most %d)", t->name, nd,
                      ST_MAX_DIMS);
    t->ndim = (int)nd;
    int64_t numel = 1;
    int overflow = 0;
    for (size_t d = 0; d < nd; d++) {
        json_t *e = json_array_get(js, d);
        if (!json_is_integer(e) || json_integer_value(e) < 0)
            return ci_err(err, errlen, CINFER_EFORMAT,
                          "tensor \"" NAME_FMT "\": shape entry %zu is not a non-negative integer", t->name,
                          d);
        t->shape[d] = (int64_t)json_integer_value(e);
        /* Keep multiplying after an overflow only to notice a later zero dimension (numel is then 0). */
        if (!overflow && __builtin_mul_overflow(numel, t->shape[d], &numel)) overflow = 1;
        if (t->shape[d] == 0) numel = 0, overflow = 0;
    }
    if (overflow)
        return ci_err(err, errlen, CINFER_EFORMAT,
                      "tensor \"" NAME_FMT "\": shape element count overflows 64 bits", t->name);
    t->numel = numel;

    if (!json_is_array(jo) || json_array_size(jo) != 2)
        return ci_err(err, errlen, CINFER_EFORMAT,
                      "tensor \"" NAME_FMT "\": \"data_offsets\" is not a [begin, end] pair", t->name);
    json_t *jb = json_array_get(jo, 0), *je = json_array_get(jo, 1);
    if (!json_is_integer(jb) || !json_is_integer(je) || json_integer_value(jb) < 0 ||
        json_integer_value(je) < 0)
        return ci_err(err, errlen, CINFER_EFORMAT,
                      "tensor \"" NAME_FMT "\": \"data_offsets\" entries must be non-negative integers",
                      t->name);
    t->begin = (uint64_t)json_integer_value(jb);
    t->end = (uint64_t)json_integer_value(je);
    if (t->begin > t->end)
        return ci_err(err, errlen, CINFER_EFORMAT,
                      "tensor \"" NAME_FMT "\": data_offsets [%llu, %llu) end before they begin", t->name,
                      (unsigned long long)t->begin, (unsigned long long)t->end);

    char shp[160];
    uint64_t nbytes;
    if (__builtin_mul_overflow((uint64_t)numel, (uint64_t)k_dtypes[dt].size, &nbytes)) {
        fmt_shape(shp, sizeof shp, t);
        return ci_err(err, errlen, CINFER_EFORMAT, "tensor \"" NAME_FMT "\": shape %s × %s overflows 64 bits",
                      t->name, shp, k_dtypes[dt].name);
    }
    if (nbytes != t->end - t->begin) {
        fmt_shape(shp, sizeof shp, t);
        return ci_err(err, errlen, CINFER_EFORMAT,
                      "tensor \"" NAME_FMT "\": shape %s × %s = %llu bytes but data_offsets span %llu",
                      t->name, shp, k_dtypes[dt].name, (unsigned long long)nbytes,
                      (unsigned long long)(t->end - t->begin));
    }
    if (t->end > data_size)
        return ci_err(err, errlen, CINFER_EFORMAT,
                      "tensor \"" NAME_FMT "\": span [%llu, %llu) is outside the data section (%llu bytes)",
                      t->name, (unsigned long long)t->begin, (unsigned long long)t->end,
                      (unsigned long long)data_size);
    return 0;
}

/* Sort key for the overlap check: spans by begin (then end, so equal begins are adjacent and deterministic).
 */
static int cmp_span(const void *a, const void *b) {
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int check_overlaps(st_tensor *ts, int n, char *err, size_t errlen) {
    if (n < 2) return 0;
    st_tensor **by = xmalloc((size_t)n * sizeof *by);
    int m = 0;
    for (int i = 0; i < n; i++)
        if (ts[i].end > ts[i].begin) by[m++] = &ts[i]; /* empty spans occupy no bytes and overlap nothing */
    qsort(by, (size_t)m, sizeof *by, cmp_span);
    int rc = 0;
    /* Sorted by begin, a span overlaps an earlier one iff it begins before the furthest end seen so far. */
    const st_tensor *far = NULL;
    for (int i = 0; i < m; i++) {
        if (far && by[i]->begin < far->end) {
            rc = ci_err(err, errlen, CINFER_EFORMAT,
                        "tensors \"" NAME_FMT "\" and \"" NAME_FMT
                        "\" overlap: spans [%llu, %llu) and [%llu, %llu)",
                        far->name, by[i]->name, (unsigned long long)far->begin, (unsigned long long)far->end,
                        (unsigned long long)by[i]->begin, (unsigned long long)by[i]->end);
            break;
        }
        if (!far || by[i]->end > far->end) far = by[i];
    }
    free(by);
    return rc;
}

void st_header_free(st_header *h) {
    if (!h) return;
    for (int i = 0; i < h->n; i++) free(h->tensors[i].name);
    free(h->tensors);
    free(h->metadata_json);
    memset(h, 0, sizeof *h);
}

int st_parse(const void *data, size_t size, st_header *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    const unsigned char *p = data;
    if (size < 8)
        return ci_err(err, errlen, CINFER_EFORMAT,
                      "file is %zu bytes, too short for the 8-byte header length", size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | p[i]; /* little-endian on any host */
    if (hlen == 0) return ci_err(err, errlen, CINFER_EFORMAT, "header length is 0");
    if (hlen > size - 8)
        return ci_err(err, errlen, CINFER_EFORMAT, "header length %llu exceeds file size %zu",
                      (unsigned long long)hlen, size);
    if (hlen > ST_MAX_HEADER)
        return ci_err(err, errlen, CINFER_EFORMAT, "header length %llu exceeds the limit of %llu bytes",
                      (unsigned long long)hlen, (unsigned long long)ST_MAX_HEADER);
    uint64_t data_offset = 8 + hlen;
    uint64_t data_size = (uint64_t)size - data_offset;

    json_error_t jerr;
    /* Duplicate keys are rejected by the JSON layer itself; trailing spaces (the format's padding) are
     * whitespace to jansson and accepted. */
    json_t *root =
        json_loadb((const char *)p + 8, (size_t)hlen, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (!root)
        return ci_err(err, errlen, CINFER_EFORMAT, "header is not valid JSON: %s (at byte %d)", jerr.text,
                      jerr.position);
    if (!json_is_object(root)) {
        json_decref(root);
        return ci_err(err, errlen, CINFER_EFORMAT, "header is not a JSON object");
    }

    int rc = 0;
    size_t cap = json_object_size(root);
    st_tensor *ts = xcalloc(cap ? cap : 1, sizeof *ts);
    int n = 0;
    char *meta = NULL;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (!strcmp(key, "__metadata__")) {
            if (!json_is_object(v)) {
                rc = ci_err(err, errlen, CINFER_EFORMAT, "\"__metadata__\" is not an object");
                break;
            }
            const char *mk;
            json_t *mv;
            json_object_foreach(v, mk, mv) {
                if (!json_is_string(mv)) {
                    rc = ci_err(err, errlen, CINFER_EFORMAT,
                                "\"__metadata__\" entry \"%.100s\" is not a string", mk);
                    break;
                }
            }
            if (rc) break;
            meta = json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS);
            if (!meta) {
                rc = ci_err(err, errlen, CINFER_ENOMEM, "cannot re-serialise \"__metadata__\"");
                break;
            }
            continue;
        }
        st_tensor *t = &ts[n];
        t->name = xstrdup(key);
        t->shard = 0;
        n++;
        if ((rc = parse_tensor(v, t, data_size, err, errlen))) break;
    }
    json_decref(root);
    if (!rc) {
        qsort(ts, (size_t)n, sizeof *ts, cmp_tensor_name);
        /* The JSON layer already refused duplicate keys; this guards that promise for the binary search. */
        for (int i = 1; i < n && !rc; i++)
            if (!strcmp(ts[i - 1].name, ts[i].name))
                rc = ci_err(err, errlen, CINFER_EFORMAT, "tensor \"" NAME_FMT "\" appears twice", ts[i].name);
    }
    if (!rc) rc = check_overlaps(ts, n, err, errlen);
    if (rc) {
        for (int i = 0; i < n; i++) free(ts[i].name);
        free(ts);
        free(meta);
        return rc;
    }
    out->tensors = ts;
    out->n = n;
    out->data_offset = data_offset;
    out->metadata_json = meta;
    return 0;
}

/* ---- the loader ---- */

static int cmp_tensor_ptr_name(const void *a, const void *b) {
    return strcmp((*(const st_tensor *const *)a)->name, (*(const st_tensor *const *)b)->name);
}

static const st_tensor *header_find(const st_header *h, const char *name) {
    st_tensor key = {.name = (char *)name};
    return bsearch(&key, h->tensors, (size_t)h->n, sizeof *h->tensors, cmp_tensor_name);
}

void st_close(st_set *s) {
    if (!s) return;
    for (int i = 0; i < s->n_shards; i++) {
        st_shard *sh = &s->shards[i];
        file_unmap(sh->map, sh->size);
        st_header_free(&sh->header);
        free(sh->path);
    }
    free(s->shards);
    free(s->index);
    free(s);
}

/* Maps and parses one shard into s->shards[s->n_shards] (the array has room). Messages carry the path. */
static int open_shard(st_set *s, const char *path, char *err, size_t errlen) {
    st_shard *sh = &s->shards[s->n_shards];
    memset(sh, 0, sizeof *sh);
    int rc = file_map(path, &sh->map, &sh->size, err, errlen);
    if (rc) return rc; /* file_map's message already names the path */
    rc = st_parse(sh->map, sh->size, &sh->header, err, errlen);
    if (rc) {
        ci_err_prefix(err, errlen, "%s", path);
        file_unmap(sh->map, sh->size);
        return rc;
    }
    sh->path = xstrdup(path);
    int idx = s->n_shards++;
    const unsigned char *base = (const unsigned char *)sh->map + sh->header.data_offset;
    for (int i = 0; i < sh->header.n; i++) {
        st_tensor *t = &sh->header.tensors[i];
        t->data = base + t->begin;
        t->shard = idx;
    }
    return 0;
}

/* Builds the global sorted index over every shard; names must be unique across shards. */
static int build_index(st_set *s, char *err, size_t errlen) {
    size_t total = 0;
    for (int i = 0; i < s->n_shards; i++) total += (size_t)s->shards[i].header.n;
    s->index = xmalloc((total ? total : 1) * sizeof *s->index);
    size_t k = 0;
    for (int i = 0; i < s->n_shards; i++)
        for (int j = 0; j < s->shards[i].header.n; j++) s->index[k++] = &s->shards[i].header.tensors[j];
    qsort(s->index, total, sizeof *s->index, cmp_tensor_ptr_name);
    for (size_t i = 1; i < total; i++) {
        const st_tensor *a = s->index[i - 1], *b = s->index[i];
        if (!strcmp(a->name, b->name))
            return ci_err(err, errlen, CINFER_EFORMAT, "%s: tensor \"" NAME_FMT "\" is also in %s",
                          s->shards[b->shard].path, b->name, s->shards[a->shard].path);
    }
    s->n_tensors = (int)total;
    return 0;
}

int st_open_file(const char *path, st_set **out, char *err, size_t errlen) {
    *out = NULL;
    st_set *s = xcalloc(1, sizeof *s);
    s->shards = xcalloc(1, sizeof *s->shards);
    int rc = open_shard(s, path, err, errlen);
    if (!rc) rc = build_index(s, err, errlen);
    if (rc) {
        st_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A shard name from an index file must stay inside the model directory. */
static int shard_name_ok(const char *f) {
    return f[0] && !strchr(f, '/') && !strstr(f, "..");
}

/* Opens the shards named by dir/model.safetensors.index.json and checks its weight_map against them. */
static int open_indexed(st_set *s, const char *dir, const char *ipath, char *err, size_t errlen) {
    char *text = NULL;
    size_t len = 0;
    int rc = file_read_all(ipath, ST_MAX_INDEX_BYTES, &text, &len, err, errlen);
    if (rc) return rc;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!root)
        return ci_err(err, errlen, CINFER_EFORMAT, "%s: not valid JSON: %s (line %d, column %d)", ipath,
                      jerr.text, jerr.line, jerr.column);
    json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(wm)) {
        json_decref(root);
        return ci_err(err, errlen, CINFER_EFORMAT, "%s: no \"weight_map\" object", ipath);
    }

    /* Distinct shard names, sorted so shards are opened (and numbered) in a stable order. */
    size_t nw = json_object_size(wm), nf = 0;
    const char **files = xmalloc((nw ? nw : 1) * sizeof *files);
    const char *name;
    json_t *v;
    json_object_foreach(wm, name, v) {
        if (!json_is_string(v)) {
            rc = ci_err(err, errlen, CINFER_EFORMAT,
                        "%s: weight_map entry \"" NAME_FMT "\" is not a file name", ipath, name);
            break;
        }
        const char *f = json_string_value(v);
        if (!shard_name_ok(f)) {
            rc = ci_err(err, errlen, CINFER_EFORMAT,
                        "%s: weight_map entry \"" NAME_FMT
                        "\" names shard \"%.200s\", which is not a plain file name "
                        "in the model directory",
                        ipath, name, f);
            break;
        }
        files[nf++] = f;
    }
    if (!rc && nf == 0) rc = ci_err(err, errlen, CINFER_EFORMAT, "%s: \"weight_map\" is empty", ipath);
    if (!rc) {
        qsort(files, nf, sizeof *files, cmp_str);
        size_t u = 0;
        for (size_t i = 0; i < nf; i++)
            if (!u || strcmp(files[u - 1], files[i])) files[u++] = files[i];
        nf = u;
        s->shards = xcalloc(nf, sizeof *s->shards);
        for (size_t i = 0; i < nf && !rc; i++) {
            char *sp = path_join(dir, files[i]);
            rc = open_shard(s, sp, err, errlen);
            if (rc == CINFER_ENOTFOUND) ci_err_prefix(err, errlen, "%s names a missing shard", ipath);
            free(sp);
        }
    }
    if (!rc) {
        json_object_foreach(wm, name, v) {
            const char *f = json_string_value(v);
            const char **hit = bsearch(&f, files, nf, sizeof *files, cmp_str);
            CI_ASSERT(hit); /* every value went into files above */
            const st_shard *sh = &s->shards[hit - files];
            if (!header_find(&sh->header, name)) {
                rc = ci_err(err, errlen, CINFER_ENOTFOUND,
                            "%s: tensor \"" NAME_FMT "\" is mapped to %s, which does not contain it", ipath,
                            name, f);
                break;
            }
        }
    }
    free(files);
    json_decref(root);
    return rc;
}

static int has_suffix(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* Without an index: every *.safetensors in dir, by name. */
static int open_all_in_dir(st_set *s, const char *dir, char *err, size_t errlen) {
    DIR *d = opendir(dir);
    if (!d) return ci_err(err, errlen, CINFER_ENOTFOUND, "%s: cannot open the directory", dir);
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || !has_suffix(e->d_name, ".safetensors")) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            names = xrealloc(names, cap * sizeof *names);
        }
        names[n++] = xstrdup(e->d_name);
    }
    closedir(d);
    int rc = 0;
    if (n == 0) {
        rc =
            ci_err(err, errlen, CINFER_ENOTFOUND,
                   "%s: no model.safetensors.index.json, model.safetensors or other *.safetensors file", dir);
    } else {
        qsort(names, n, sizeof *names, cmp_str);
        s->shards = xcalloc(n, sizeof *s->shards);
        for (size_t i = 0; i < n && !rc; i++) {
            char *sp = path_join(dir, names[i]);
            rc = open_shard(s, sp, err, errlen);
            free(sp);
        }
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    return rc;
}

int st_open_dir(const char *dir, st_set **out, char *err, size_t errlen) {
    *out = NULL;
    st_set *s = xcalloc(1, sizeof *s);
    char *ipath = path_join(dir, "model.safetensors.index.json");
    char *single = path_join(dir, "model.safetensors");
    int rc;
    if (file_exists(ipath)) {
        rc = open_indexed(s, dir, ipath, err, errlen);
    } else if (file_exists(single)) {
        s->shards = xcalloc(1, sizeof *s->shards);
        rc = open_shard(s, single, err, errlen);
    } else {
        rc = open_all_in_dir(s, dir, err, errlen);
    }
    free(ipath);
    free(single);
    if (!rc) rc = build_index(s, err, errlen);
    if (rc) {
        st_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

const st_tensor *st_find(const st_set *s, const char *name) {
    if (!s || !name || !s->n_tensors) return NULL;
    st_tensor key = {.name = (char *)name};
    const st_tensor *kp = &key;
    const st_tensor **hit =
        bsearch(&kp, s->index, (size_t)s->n_tensors, sizeof *s->index, cmp_tensor_ptr_name);
    return hit ? *hit : NULL;
}

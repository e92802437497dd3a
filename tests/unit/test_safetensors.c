/* test_safetensors.c — the safetensors header parser (valid files, every malformed case with its code and
 * message) and the loader (single file, sharded directory with and without an index, st_find). Files are
 * built in memory by a small writer below. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "io/safetensors.h"
#include "test.h"
#include "util/alloc.h"
#include "util/err.h"

/* Builds a safetensors image: 8-byte LE header length, the header text padded with `pad` spaces, then
 * data_len data bytes, byte i of the data section holding (i * 7 + 3) & 0xff so spans can be told apart. */
static unsigned char *st_build_hdr(const char *hdr, size_t pad, size_t data_len, size_t *size) {
    size_t hl = strlen(hdr) + pad;
    *size = 8 + hl + data_len;
    unsigned char *b = xmalloc(*size ? *size : 1);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, hdr, strlen(hdr));
    memset(b + 8 + strlen(hdr), ' ', pad);
    for (size_t i = 0; i < data_len; i++) b[8 + hl + i] = (unsigned char)((i * 7 + 3) & 0xff);
    return b;
}

static int parse_str(const char *hdr, size_t data_len, st_header *h, char *err, size_t errlen) {
    size_t n;
    unsigned char *b = st_build_hdr(hdr, 0, data_len, &n);
    int rc = st_parse(b, n, h, err, errlen);
    free(b);
    return rc;
}

static int write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(p, 1, n, f);
    return fclose(f) == 0 && w == n ? 0 : -1;
}

static int write_st(const char *path, const char *hdr, size_t data_len) {
    size_t n;
    unsigned char *b = st_build_hdr(hdr, 0, data_len, &n);
    int rc = write_file(path, b, n);
    free(b);
    return rc;
}

static const char *subdir(const char *name) {
    static char buf[512];
    snprintf(buf, sizeof buf, "%s/%s", test_tmpdir(), name);
    mkdir(buf, 0755);
    return buf;
}

static char *pj(const char *dir, const char *name) {
    static char buf[4][600];
    static int k;
    char *b = buf[k++ & 3];
    snprintf(b, sizeof buf[0], "%s/%s", dir, name);
    return b;
}

TEST(st_dtype_table) {
    CHECK_EQ_INT(st_dtype_size(ST_BF16), 2);
    CHECK_EQ_INT(st_dtype_size(ST_F32), 4);
    CHECK_EQ_INT(st_dtype_size(ST_F64), 8);
    CHECK_EQ_INT(st_dtype_size(ST_I64), 8);
    CHECK_EQ_INT(st_dtype_size(ST_BOOL), 1);
    CHECK_EQ_INT(st_dtype_size(ST_F8_E4M3), 1);
    for (int t = 0; t < ST_N_DTYPES; t++) {
        CHECK_EQ_INT(st_dtype_from_name(st_dtype_name((st_dtype)t)), t);
        CHECK(st_dtype_size((st_dtype)t) >= 1);
    }
    CHECK_EQ_INT(st_dtype_from_name("bf16"), -1); /* names are case-sensitive in the format */
    CHECK_EQ_INT(st_dtype_from_name("F4"), -1);
    CHECK_EQ_INT(st_dtype_from_name(NULL), -1);
}

TEST(st_parse_valid_several_dtypes) {
    /* Keys deliberately out of order; one 0-size tensor, one scalar, padding after the header. */
    const char *hdr = "{\"w.bf16\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
                      "\"__metadata__\":{\"format\":\"pt\",\"a\":\"b\"},"
                      "\"b.f32\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]},"
                      "\"empty\":{\"dtype\":\"U8\",\"shape\":[0,5],\"data_offsets\":[20,20]},"
                      "\"c.i64\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[20,28],\"extra\":1},"
                      "\"d.scalar\":{\"dtype\":\"BOOL\",\"shape\":[],\"data_offsets\":[28,29]}}";
    size_t n;
    unsigned char *b = st_build_hdr(hdr, 5, 29, &n);
    st_header h;
    char err[256] = "";
    int rc = st_parse(b, n, &h, err, sizeof err);
    free(b);
    REQUIRE(rc == 0);
    REQUIRE(h.n == 5);
    CHECK_EQ_INT(h.data_offset, 8 + strlen(hdr) + 5);
    const char *order[5] = {"b.f32", "c.i64", "d.scalar", "empty", "w.bf16"};
    for (int i = 0; i < 5; i++) CHECK(!strcmp(h.tensors[i].name, order[i]));
    const st_tensor *t = &h.tensors[4];
    CHECK_EQ_INT(t->dtype, ST_BF16);
    CHECK_EQ_INT(t->ndim, 2);
    CHECK_EQ_INT(t->shape[0], 2);
    CHECK_EQ_INT(t->shape[1], 3);
    CHECK_EQ_INT(t->numel, 6);
    CHECK_EQ_INT(t->begin, 0);
    CHECK_EQ_INT(t->end, 12);
    CHECK(t->data == NULL);
    CHECK_EQ_INT(h.tensors[0].dtype, ST_F32);
    CHECK_EQ_INT(h.tensors[0].numel, 2);
    CHECK_EQ_INT(h.tensors[1].dtype, ST_I64);
    CHECK_EQ_INT(h.tensors[2].ndim, 0);
    CHECK_EQ_INT(h.tensors[2].numel, 1);
    CHECK_EQ_INT(h.tensors[3].numel, 0);
    CHECK_EQ_INT(h.tensors[3].begin, 20);
    CHECK_EQ_INT(h.tensors[3].end, 20);
    REQUIRE(h.metadata_json != NULL);
    CHECK(!strcmp(h.metadata_json, "{\"a\":\"b\",\"format\":\"pt\"}"));
    st_header_free(&h);
    CHECK(h.tensors == NULL && h.n == 0);
}

TEST(st_parse_empty_object_and_no_metadata) {
    st_header h;
    char err[256] = "";
    REQUIRE(parse_str("{}", 0, &h, err, sizeof err) == 0);
    CHECK_EQ_INT(h.n, 0);
    CHECK(h.metadata_json == NULL);
    st_header_free(&h);
    /* A zero-size tensor may sit at the very end of the data section, and touch another's span. */
    REQUIRE(parse_str("{\"a\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]},"
                      "\"z\":{\"dtype\":\"F16\",\"shape\":[0],\"data_offsets\":[2,2]},"
                      "\"e\":{\"dtype\":\"F16\",\"shape\":[0],\"data_offsets\":[4,4]}}",
                      4, &h, err, sizeof err) == 0);
    CHECK_EQ_INT(h.n, 3);
    st_header_free(&h);
}

TEST(st_parse_truncated_and_bad_lengths) {
    st_header h;
    char err[256] = "";
    unsigned char small[5] = {1, 0, 0, 0, 0};
    CHECK_EQ_INT(st_parse(small, sizeof small, &h, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "5 bytes");
    CHECK_EQ_INT(st_parse(small, 0, &h, err, sizeof err), CINFER_EFORMAT);

    /* Header length 0. */
    unsigned char zero[16] = {0};
    CHECK_EQ_INT(st_parse(zero, sizeof zero, &h, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "header length is 0");

    /* Header length larger than what follows: a file cut short inside the header. */
    size_t n;
    unsigned char *b =
        st_build_hdr("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 0, 4, &n);
    CHECK_EQ_INT(st_parse(b, 30, &h, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "exceeds file size 30");
    /* Cut inside the data: the span check fires instead. */
    CHECK_EQ_INT(st_parse(b, n - 1, &h, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "outside the data section (3 bytes)");
    CHECK_EQ_INT(st_parse(b, n, &h, err, sizeof err), 0);
    st_header_free(&h);
    free(b);

    /* A length with its high bytes set (would wrap a naive 8 + len). */
    unsigned char huge[16];
    memset(huge, 0xff, 8);
    memset(huge + 8, ' ', 8);
    CHECK_EQ_INT(st_parse(huge, sizeof huge, &h, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "header length 18446744073709551615 exceeds file size 16");
}

TEST(st_parse_header_over_limit) {
    /* 100 MB + 1 of header inside a file that is big enough: refused by the limit, not by the file size.
     * calloc'd pages are never touched beyond the first, so this costs no real memory. */
    size_t hl = 100u * 1000 * 1000 + 1, n = 8 + hl;
    unsigned char *b = calloc(1, n);
    REQUIRE(b);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    st_header h;
    char err[256] = "";
    CHECK_EQ_INT(st_parse(b, n, &h, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "header length 100000001 exceeds the limit");
    free(b);
}

TEST(st_parse_bad_json) {
    st_header h;
    char err[256] = "";
    CHECK_EQ_INT(parse_str("{\"a\": ", 0, &h, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "not valid JSON");
    CHECK_EQ_INT(parse_str("hello", 0, &h, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "not valid JSON");
    CHECK_EQ_INT(parse_str("[1, 2]", 0, &h, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "not a JSON object");
    CHECK_EQ_INT(parse_str("\"x\"", 0, &h, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "not a JSON object");
    /* Trailing garbage after the object (spaces are fine, tested above). */
    CHECK_EQ_INT(parse_str("{} x", 0, &h, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "not valid JSON");
    CHECK_EQ_INT(parse_str("{\"__metadata__\":{\"n\":1}}", 0, &h, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "\"__metadata__\" entry \"n\" is not a string");
    CHECK_EQ_INT(parse_str("{\"__metadata__\":[]}", 0, &h, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "__metadata__");
}

TEST(st_parse_duplicate_key) {
    st_header h;
    char err[256] = "";
    CHECK_EQ_INT(parse_str("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                           "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
                           2, &h, err, sizeof err),
                 CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "duplicate");
}

TEST(st_parse_bad_dtype) {
    st_header h;
    char err[256] = "";
    CHECK_EQ_INT(parse_str("{\"layer.q\":{\"dtype\":\"Q4_K\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, &h,
                           err, sizeof err),
                 CINFER_EUNSUPPORTED);
    CHECK_STR_CONTAINS(err, "tensor \"layer.q\"");
    CHECK_STR_CONTAINS(err, "unknown dtype \"Q4_K\"");
    CHECK_EQ_INT(
        parse_str("{\"x\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,1]}}", 1, &h, err, sizeof err),
        CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "\"dtype\" is not a string");
    CHECK_EQ_INT(parse_str("{\"x\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, &h, err, sizeof err),
                 CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "tensor \"x\": no \"dtype\"");
    CHECK_EQ_INT(parse_str("{\"x\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1, &h, err, sizeof err),
                 CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "no \"shape\"");
    CHECK_EQ_INT(parse_str("{\"x\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, &h, err, sizeof err),
                 CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "no \"data_offsets\"");
    CHECK_EQ_INT(parse_str("{\"x\":[1]}", 1, &h, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "tensor \"x\": entry is not an object");
}

TEST(st_parse_shape_size_mismatch) {
    st_header h;
    char err[256] = "";
    CHECK_EQ_INT(
        parse_str("{\"model.norm.weight\":{\"dtype\":\"BF16\",\"shape\":[4,8],\"data_offsets\":[4,64]}}", 64,
                  &h, err, sizeof err),
        CINFER_EFORMAT);
    CHECK_STR_CONTAINS(
        err, "tensor \"model.norm.weight\": shape [4, 8] × BF16 = 64 bytes but data_offsets span 60");
    CHECK_EQ_INT(
        parse_str("{\"x\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,8]}}", 8, &h, err, sizeof err),
        CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "shape [] × F32 = 4 bytes but data_offsets span 8");
}

TEST(st_parse_bad_shape_entries) {
    st_header h;
    char err[256] = "";
    CHECK_EQ_INT(parse_str("{\"neg\":{\"dtype\":\"U8\",\"shape\":[2,-1],\"data_offsets\":[0,0]}}", 0, &h, err,
                           sizeof err),
                 CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "tensor \"neg\": shape entry 1 is not a non-negative integer");
    CHECK_EQ_INT(parse_str("{\"f\":{\"dtype\":\"U8\",\"shape\":[2.5],\"data_offsets\":[0,2]}}", 2, &h, err,
                           sizeof err),
                 CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "tensor \"f\": shape entry 0");
    CHECK_EQ_INT(parse_str("{\"s\":{\"dtype\":\"U8\",\"shape\":[\"2\"],\"data_offsets\":[0,2]}}", 2, &h, err,
                           sizeof err),
                 CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "tensor \"s\": shape entry 0");
    CHECK_EQ_INT(
        parse_str("{\"o\":{\"dtype\":\"U8\",\"shape\":{},\"data_offsets\":[0,2]}}", 2, &h, err, sizeof err),
        CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "\"shape\" is not an array");
    CHECK_EQ_INT(parse_str("{\"d\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}",
                           1, &h, err, sizeof err),
                 CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "tensor \"d\": shape has 9 dimensions (at most 8)");
    /* 2^32 * 2^32 elements overflows int64. */
    CHECK_EQ_INT(
        parse_str("{\"big\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}", 0,
                  &h, err, sizeof err),
        CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "tensor \"big\": shape element count overflows");
    /* numel fits in int64 but numel * 8 bytes does not. */
    CHECK_EQ_INT(
        parse_str("{\"big8\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],\"data_offsets\":[0,0]}}", 0,
                  &h, err, sizeof err),
        CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "tensor \"big8\": shape [4611686018427387904] × F64 overflows");
    /* A zero dimension after an overflowing product is a valid empty tensor. */
    CHECK_EQ_INT(
        parse_str("{\"z\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,0],\"data_offsets\":[0,0]}}", 0,
                  &h, err, sizeof err),
        0);
    CHECK_EQ_INT(h.tensors[0].numel, 0);
    st_header_free(&h);
}

TEST(st_parse_bad_offsets) {
    st_header h;
    char err[256] = "";
    CHECK_EQ_INT(parse_str("{\"x\":{\"dtype\":\"F32\",\"shape\":[16],\"data_offsets\":[100,164]}}", 64, &h,
                           err, sizeof err),
                 CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "tensor \"x\": span [100, 164) is outside the data section (64 bytes)");
    CHECK_EQ_INT(
        parse_str("{\"x\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[9,9]}}", 8, &h, err, sizeof err),
        CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "outside the data section (8 bytes)");
    CHECK_EQ_INT(
        parse_str("{\"r\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,2]}}", 8, &h, err, sizeof err),
        CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "tensor \"r\": data_offsets [4, 2) end before they begin");
    CHECK_EQ_INT(
        parse_str("{\"r\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 8, &h, err, sizeof err),
        CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "[begin, end] pair");
    CHECK_EQ_INT(
        parse_str("{\"r\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 8, &h, err, sizeof err),
        CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "non-negative integers");
}

TEST(st_parse_overlapping_spans) {
    st_header h;
    char err[256] = "";
    CHECK_EQ_INT(parse_str("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                           "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}",
                           20, &h, err, sizeof err),
                 CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "tensors \"a\" and \"b\" overlap");
    /* One span inside a long one, after a short one that does not overlap the next: the long span's end
     * must be remembered, not just the previous span's. */
    CHECK_EQ_INT(parse_str("{\"long\":{\"dtype\":\"U8\",\"shape\":[10],\"data_offsets\":[0,10]},"
                           "\"short\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]},"
                           "\"inner\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[5,7]}}",
                           10, &h, err, sizeof err),
                 CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "tensors \"long\" and \"short\" overlap");
    /* Identical spans. */
    CHECK_EQ_INT(parse_str("{\"p\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                           "\"q\":{\"dtype\":\"I16\",\"shape\":[1],\"data_offsets\":[0,2]}}",
                           2, &h, err, sizeof err),
                 CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "overlap");
    /* Adjacent spans do not overlap. */
    CHECK_EQ_INT(parse_str("{\"p\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]},"
                           "\"q\":{\"dtype\":\"I16\",\"shape\":[1],\"data_offsets\":[0,2]}}",
                           4, &h, err, sizeof err),
                 0);
    st_header_free(&h);
}

TEST(st_open_file_fills_data) {
    const char *d = subdir("single");
    const char *path = pj(d, "one.safetensors");
    REQUIRE(write_st(path,
                     "{\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[5,8]},"
                     "\"a\":{\"dtype\":\"U8\",\"shape\":[5],\"data_offsets\":[0,5]}}",
                     8) == 0);
    st_set *s = NULL;
    char err[256] = "";
    int rc = st_open_file(path, &s, err, sizeof err);
    CHECK_MSG(rc == 0, "st_open_file: %s", err);
    REQUIRE(rc == 0 && s);
    CHECK_EQ_INT(s->n_shards, 1);
    CHECK_EQ_INT(s->n_tensors, 2);
    const st_tensor *b = st_find(s, "b");
    REQUIRE(b);
    const unsigned char *p = b->data;
    CHECK_EQ_INT(p[0], (5 * 7 + 3) & 0xff);
    CHECK_EQ_INT(p[2], (7 * 7 + 3) & 0xff);
    CHECK(st_find(s, "a") && ((const unsigned char *)st_find(s, "a")->data)[0] == 3);
    CHECK(st_find(s, "c") == NULL);
    CHECK(st_find(s, "") == NULL);
    st_close(s);

    /* Parse errors come back prefixed with the path. */
    const char *bad = pj(d, "bad.safetensors");
    REQUIRE(write_st(bad, "{\"x\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}", 2) == 0);
    CHECK_EQ_INT(st_open_file(bad, &s, err, sizeof err), CINFER_EFORMAT);
    CHECK(s == NULL);
    CHECK_STR_CONTAINS(err, bad);
    CHECK_STR_CONTAINS(err, "outside the data section");
    CHECK_EQ_INT(st_open_file(pj(d, "nope.safetensors"), &s, err, sizeof err), CINFER_ENOTFOUND);
    CHECK_STR_CONTAINS(err, "nope.safetensors");
}

static const char *k_shard1 =
    "{\"model.embed.weight\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,8]},"
    "\"model.layers.0.w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}";
static const char *k_shard2 =
    "{\"model.norm.weight\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]},"
    "\"lm_head.weight\":{\"dtype\":\"BF16\",\"shape\":[3,2],\"data_offsets\":[4,16]}}";

static int write_index(const char *dir, const char *weight_map) {
    char buf[2048];
    snprintf(buf, sizeof buf, "{\"metadata\":{\"total_size\":28},\"weight_map\":%s}", weight_map);
    return write_file(pj(dir, "model.safetensors.index.json"), buf, strlen(buf));
}

TEST(st_open_dir_sharded_with_index) {
    const char *d = subdir("sharded");
    REQUIRE(write_st(pj(d, "model-00001-of-00002.safetensors"), k_shard1, 12) == 0);
    REQUIRE(write_st(pj(d, "model-00002-of-00002.safetensors"), k_shard2, 16) == 0);
    REQUIRE(write_index(d, "{\"model.embed.weight\":\"model-00001-of-00002.safetensors\","
                           "\"lm_head.weight\":\"model-00002-of-00002.safetensors\","
                           "\"model.norm.weight\":\"model-00002-of-00002.safetensors\","
                           "\"model.layers.0.w\":\"model-00001-of-00002.safetensors\"}") == 0);
    st_set *s = NULL;
    char err[256] = "";
    int rc = st_open_dir(d, &s, err, sizeof err);
    CHECK_MSG(rc == 0, "st_open_dir: %s", err);
    REQUIRE(rc == 0 && s);
    CHECK_EQ_INT(s->n_shards, 2);
    CHECK_EQ_INT(s->n_tensors, 4);
    /* The global index is sorted by name across shards. */
    for (int i = 1; i < s->n_tensors; i++) CHECK(strcmp(s->index[i - 1]->name, s->index[i]->name) < 0);
    const st_tensor *lm = st_find(s, "lm_head.weight");
    REQUIRE(lm);
    CHECK_EQ_INT(lm->shard, 1);
    CHECK_STR_CONTAINS(s->shards[lm->shard].path, "model-00002-of-00002.safetensors");
    CHECK_EQ_INT(((const unsigned char *)lm->data)[0], (4 * 7 + 3) & 0xff);
    CHECK(lm->data == (const unsigned char *)s->shards[1].map + s->shards[1].header.data_offset + 4);
    const st_tensor *w = st_find(s, "model.layers.0.w");
    REQUIRE(w);
    CHECK_EQ_INT(w->shard, 0);
    CHECK_EQ_INT(w->dtype, ST_F32);
    CHECK(st_find(s, "model.layers.1.w") == NULL);
    CHECK(st_find(s, "model.norm.weigh") == NULL);
    CHECK(st_find(s, "zzz") == NULL);
    st_close(s);
}

TEST(st_open_dir_index_errors) {
    st_set *s = NULL;
    char err[512] = "";
    const char *d = subdir("idx_missing_shard");
    REQUIRE(write_st(pj(d, "model-00001-of-00002.safetensors"), k_shard1, 12) == 0);
    REQUIRE(write_index(d, "{\"model.embed.weight\":\"model-00001-of-00002.safetensors\","
                           "\"lm_head.weight\":\"model-00002-of-00002.safetensors\"}") == 0);
    CHECK_EQ_INT(st_open_dir(d, &s, err, sizeof err), CINFER_ENOTFOUND);
    CHECK(s == NULL);
    CHECK_STR_CONTAINS(err, "model.safetensors.index.json names a missing shard");
    CHECK_STR_CONTAINS(err, "model-00002-of-00002.safetensors");

    d = subdir("idx_wrong_shard");
    REQUIRE(write_st(pj(d, "a.safetensors"), k_shard1, 12) == 0);
    REQUIRE(write_st(pj(d, "b.safetensors"), k_shard2, 16) == 0);
    REQUIRE(write_index(
                d, "{\"model.embed.weight\":\"a.safetensors\",\"lm_head.weight\":\"a.safetensors\"}") == 0);
    CHECK_EQ_INT(st_open_dir(d, &s, err, sizeof err), CINFER_ENOTFOUND);
    CHECK_STR_CONTAINS(err,
                       "tensor \"lm_head.weight\" is mapped to a.safetensors, which does not contain it");

    d = subdir("idx_escape");
    REQUIRE(write_st(pj(d, "a.safetensors"), k_shard1, 12) == 0);
    REQUIRE(write_index(d, "{\"model.embed.weight\":\"../a.safetensors\"}") == 0);
    CHECK_EQ_INT(st_open_dir(d, &s, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "\"../a.safetensors\"");
    REQUIRE(write_index(d, "{\"model.embed.weight\":\"/etc/a.safetensors\"}") == 0);
    CHECK_EQ_INT(st_open_dir(d, &s, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "not a plain file name");
    REQUIRE(write_index(d, "{\"model.embed.weight\":3}") == 0);
    CHECK_EQ_INT(st_open_dir(d, &s, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "weight_map entry \"model.embed.weight\" is not a file name");
    REQUIRE(write_file(pj(d, "model.safetensors.index.json"), "{\"weight_map\":", 14) == 0);
    CHECK_EQ_INT(st_open_dir(d, &s, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "model.safetensors.index.json: not valid JSON");
    REQUIRE(write_file(pj(d, "model.safetensors.index.json"), "{\"metadata\":{}}", 15) == 0);
    CHECK_EQ_INT(st_open_dir(d, &s, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "no \"weight_map\" object");

    /* A shard that fails to parse: the message names that shard. */
    d = subdir("idx_bad_shard");
    REQUIRE(write_st(pj(d, "a.safetensors"),
                     "{\"t\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 12) == 0);
    REQUIRE(write_index(d, "{\"t\":\"a.safetensors\"}") == 0);
    CHECK_EQ_INT(st_open_dir(d, &s, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err,
                       "a.safetensors: tensor \"t\": shape [3] × F32 = 12 bytes but data_offsets span 8");
}

TEST(st_open_dir_without_index) {
    st_set *s = NULL;
    char err[512] = "";
    /* Every *.safetensors, in name order; other files ignored. */
    const char *d = subdir("noindex");
    REQUIRE(write_st(pj(d, "z-part.safetensors"), k_shard1, 12) == 0);
    REQUIRE(write_st(pj(d, "a-part.safetensors"), k_shard2, 16) == 0);
    REQUIRE(write_file(pj(d, "config.json"), "{}", 2) == 0);
    int rc = st_open_dir(d, &s, err, sizeof err);
    CHECK_MSG(rc == 0, "st_open_dir: %s", err);
    REQUIRE(rc == 0);
    CHECK_EQ_INT(s->n_shards, 2);
    CHECK_STR_CONTAINS(s->shards[0].path, "a-part.safetensors");
    CHECK_EQ_INT(s->n_tensors, 4);
    CHECK(st_find(s, "model.embed.weight") && st_find(s, "model.embed.weight")->shard == 1);
    st_close(s);

    /* model.safetensors wins over the other files. */
    d = subdir("single_model");
    REQUIRE(write_st(pj(d, "model.safetensors"), k_shard2, 16) == 0);
    REQUIRE(write_st(pj(d, "other.safetensors"), k_shard1, 12) == 0);
    REQUIRE(st_open_dir(d, &s, err, sizeof err) == 0);
    CHECK_EQ_INT(s->n_shards, 1);
    CHECK(st_find(s, "lm_head.weight") != NULL);
    CHECK(st_find(s, "model.embed.weight") == NULL);
    st_close(s);

    /* The same name in two shards. */
    d = subdir("dup_across");
    REQUIRE(write_st(pj(d, "s1.safetensors"), k_shard1, 12) == 0);
    REQUIRE(write_st(pj(d, "s2.safetensors"), k_shard1, 12) == 0);
    CHECK_EQ_INT(st_open_dir(d, &s, err, sizeof err), CINFER_EFORMAT);
    CHECK(s == NULL);
    CHECK_STR_CONTAINS(err, "tensor \"model.embed.weight\" is also in");
    CHECK_STR_CONTAINS(err, "s1.safetensors");

    /* Nothing to open. */
    d = subdir("empty_dir");
    CHECK_EQ_INT(st_open_dir(d, &s, err, sizeof err), CINFER_ENOTFOUND);
    CHECK_STR_CONTAINS(err, d);
    CHECK_STR_CONTAINS(err, "safetensors");
    CHECK_EQ_INT(st_open_dir(pj(d, "does-not-exist"), &s, err, sizeof err), CINFER_ENOTFOUND);
    CHECK_STR_CONTAINS(err, "does-not-exist");
}

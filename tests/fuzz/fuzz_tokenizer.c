/* fuzz_tokenizer.c — libFuzzer target for the tokenizer. The first byte picks the mode:
 *   even: the rest is tokenizer.json for tok_parse; a file that loads must then encode and decode a few
 *         texts with every id inside the vocabulary;
 *   odd:  the rest is text for two small fixed tokenizers (byte-level with regex Split, added tokens with every
 *         flag and a normalizer sequence; SentencePiece style with Metaspace and byte fallback): invalid UTF-8
 *         must be refused, valid text must encode to ids inside the vocabulary, decode to valid UTF-8, and the
 *         streaming detokenizer must give the full decode. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tok/detok.h"
#include "tok/tokenizer.h"
#include "util/err.h"

static const char BL_JSON[] =
    "{\"version\":\"1.0\",\"added_tokens\":["
    "{\"id\":9,\"content\":\"<s>\",\"special\":true,\"normalized\":false},"
    "{\"id\":10,\"content\":\"<m>\",\"special\":true,\"lstrip\":true,\"rstrip\":true,\"normalized\":false},"
    "{\"id\":11,\"content\":\"ab\",\"special\":false,\"single_word\":true,\"normalized\":true}],"
    "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFKC\"},{\"type\":\"Lowercase\"},"
    "{\"type\":\"Replace\",\"pattern\":{\"Regex\":\"\\\\s+\"},\"content\":\" \"},{\"type\":\"Strip\",\"strip_left\":true,"
    "\"strip_right\":false}]},"
    "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
    "\"(?i:'s|'t)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s+(?!\\\\S)|\\\\s+\"},"
    "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"Digits\",\"individual_digits\":true},"
    "{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"use_regex\":false}]},"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
    "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[9],\"tokens\":[\"<s>\"]}}},"
    "\"decoder\":{\"type\":\"ByteLevel\"},"
    "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"\\u0120\":3,\"\\u0120a\":4,\"c\":5,\"1\":6,\"\\u00c3\":7,"
    "\"\\u00a9\":8},\"merges\":[\"a b\",\"\\u0120 a\"]}}";

static const char SP_JSON[] =
    "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true,\"normalized\":false}],"
    "\"normalizer\":null,"
    "\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_scheme\":\"first\",\"split\":true},"
    "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"ByteFallback\"},{\"type\":\"Metaspace\",\"replacement\":"
    "\"\\u2581\",\"prepend_scheme\":\"first\"},{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":1}]},"
    "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":true,\"byte_fallback\":true,"
    "\"vocab\":{\"<unk>\":0,\"<0x41>\":1,\"<0xC3>\":2,\"<0xA9>\":3,\"\\u2581\":4,\"x\":5,\"\\u2581x\":6,\"<0xE2>\":7},"
    "\"merges\":[[\"\\u2581\",\"x\"]]}}";

static tokenizer *g_bl, *g_sp;

/* strict: the stream must equal the full decode. Fuzzed files may chain decoders that look across tokens
 * (Fuse then a Replace regex, Strip of a trailing character): there the stream may refuse (an error), but must
 * not crash. */
static void check_tokenizer(const tokenizer *tk, const char *s, size_t n, int strict) {
    char err[512];
    int32_t *ids = NULL;
    size_t ni = 0;
    int rc = tok_encode(tk, s, n, 1, &ids, &ni, err, sizeof err);
    if (rc) {
        CI_ASSERT(rc < 0 && err[0]);
        return;
    }
    int32_t vs = tok_vocab_size(tk);
    for (size_t i = 0; i < ni; i++) CI_ASSERT(ids[i] >= 0 && ids[i] < vs);
    for (int skip = 0; skip < 2; skip++) {
        char *out = NULL;
        size_t ol = 0;
        CI_ASSERT(tok_decode(tk, ids, ni, skip, &out, &ol, err, sizeof err) == 0);
        CI_ASSERT(strlen(out) <= ol); /* NUL-terminated (an id may decode to U+0000) */
        detok *d = detok_create(tk, skip);
        size_t got = 0;
        int same = 1;
        for (size_t i = 0; i <= ni && same; i++) {
            const char *t;
            size_t tl;
            int r = i < ni ? detok_push(d, ids[i], &t, &tl, err, sizeof err) : detok_flush(d, &t, &tl, err, sizeof err);
            if (r) {
                CI_ASSERT(!strict && r < 0);
                same = 0;
                got = ol;
                break;
            }
            if (got + tl > ol || memcmp(out + got, t, tl)) same = 0;
            got += tl;
        }
        if (strict) CI_ASSERT(same && got == ol);
        detok_free(d);
        free(out);
    }
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    if (!g_bl) {
        CI_ASSERT(tok_parse(BL_JSON, sizeof BL_JSON - 1, NULL, 0, &g_bl, err, sizeof err) == 0);
        CI_ASSERT(tok_parse(SP_JSON, sizeof SP_JSON - 1, NULL, 0, &g_sp, err, sizeof err) == 0);
    }
    if (size < 1) return 0;
    const char *s = (const char *)data + 1;
    size_t n = size - 1;
    if ((data[0] & 1) == 0) {
        tokenizer *tk = NULL;
        int rc = tok_parse(s, n, NULL, 0, &tk, err, sizeof err);
        if (rc) {
            CI_ASSERT(rc < 0 && err[0] && !tk);
            return 0;
        }
        static const char *texts[] = {"", "Hello world", " a  b\n\n\tc 123 <s>", "\xE4\xB8\xAD\xF0\x9F\x98\x80 e\xCC\x81"};
        for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) check_tokenizer(tk, texts[i], strlen(texts[i]), 0);
        int32_t ids[4] = {0, 1, tok_vocab_size(tk) - 1, tok_vocab_size(tk) + 5};
        char *out = NULL;
        CI_ASSERT(tok_decode(tk, ids, 4, 0, &out, NULL, err, sizeof err) == 0);
        free(out);
        tok_free(tk);
        return 0;
    }
    check_tokenizer(g_bl, s, n, 1);
    check_tokenizer(g_sp, s, n, 1);
    return 0;
}

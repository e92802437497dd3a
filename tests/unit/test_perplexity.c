/* test_perplexity.c — `cinfer perplexity` (src/cli/perplexity.c): its NLL equals -log softmax of the logits
 * that `cinfer logits` writes for each window, summed here independently (windows cut here from the library's
 * tokenization); the window rules (short last window, a one-token tail dropped, --max-tokens); usage and
 * input errors; and, once the trained default model's fixture is there, the held-out perplexity within 0.5%
 * of transformers' figure (tests/fixtures/default_model/perplexity.json); on a GPU, precision fast's within
 * 1% of exact's. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cinfer.h"
#include "model/forward_cuda.h"
#include "test.h"
#include "util/file.h"
#include "util/npy.h"

#define MODEL "models/default"

#if defined(__SANITIZE_ADDRESS__)
#define SLOW_BUILD 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SLOW_BUILD 1
#endif
#endif
#ifndef SLOW_BUILD
#define SLOW_BUILD 0
#endif

static const char *TEXT = "def mean(xs):\n    \"\"\"Return the arithmetic mean of xs.\"\"\"\n"
                          "    if not xs:\n        raise ValueError('mean of an empty sequence')\n"
                          "    return sum(xs) / len(xs)\n\n\nprint(mean([1, 2, 3, 4]))  # 2.5\n";

static int write_text(const char *path, const char *s) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t n = strlen(s);
    int bad = fwrite(s, 1, n, f) != n;
    return fclose(f) || bad ? -1 : 0;
}

/* `cinfer perplexity ... --json` parsed; NULL (with a test failure) when it did not run. */
static json_t *ppl_json(const char *bin, const char *file, const char *extra) {
    char cmd[4096], out[600];
    snprintf(out, sizeof out, "%s/ppl.json", test_tmpdir());
    snprintf(cmd, sizeof cmd, "%s perplexity -m %s --file %s --json %s > %s", bin, MODEL, file, extra, out);
    int rc = test_run(cmd);
    if (rc != 0) {
        test_fail(__FILE__, __LINE__, "`%s` exited %d", cmd, rc);
        return NULL;
    }
    json_error_t je;
    json_t *o = json_load_file(out, 0, &je);
    if (!o) test_fail(__FILE__, __LINE__, "%s: %s", out, je.text);
    return o;
}

/* Sum over windows of -log softmax(logits[j-1])[x_j] from `cinfer logits --out`, in double. */
static int reference_nll(const char *bin, const int32_t *ids, int n, int ctx, double *sum, long *scored,
                         long *windows) {
    *sum = 0, *scored = 0, *windows = 0;
    for (int w0 = 0; w0 < n; w0 += ctx) {
        int wl = n - w0 < ctx ? n - w0 : ctx;
        if (wl < 2) break;
        char list[8192], cmd[10000], npy[600], err[256];
        size_t k = 0;
        for (int i = 0; i < wl; i++)
            k += (size_t)snprintf(list + k, sizeof list - k, i ? ",%d" : "%d", ids[w0 + i]);
        snprintf(npy, sizeof npy, "%s/w.npy", test_tmpdir());
        snprintf(cmd, sizeof cmd, "%s logits -m %s --tokens %s --out %s", bin, MODEL, list, npy);
        if (test_run(cmd) != 0) return -1;
        char *buf = NULL;
        size_t len;
        npy_array a;
        if (file_read_all(npy, (size_t)1 << 30, &buf, &len, err, sizeof err) ||
            npy_parse_f32(buf, len, &a, err, sizeof err) || a.ndim != 2 || a.shape[0] != wl) {
            free(buf);
            return -1;
        }
        int V = (int)a.shape[1];
        for (int j = 1; j < wl; j++) {
            const float *row = a.data + (size_t)(j - 1) * V;
            double mx = row[0], s = 0;
            for (int v = 1; v < V; v++) mx = fmax(mx, row[v]);
            for (int v = 0; v < V; v++) s += exp(row[v] - mx);
            *sum += mx + log(s) - row[ids[w0 + j]];
            (*scored)++;
        }
        (*windows)++;
        free(buf);
    }
    return 0;
}

static void check_against_logits(const char *bin, const char *file, const int32_t *ids, int n, int ctx,
                                 int max_tokens) {
    char extra[64];
    if (max_tokens)
        snprintf(extra, sizeof extra, "--ctx %d --max-tokens %d", ctx, max_tokens);
    else
        snprintf(extra, sizeof extra, "--ctx %d", ctx);
    int use = max_tokens && max_tokens < n ? max_tokens : n;
    double sum;
    long scored, windows;
    REQUIRE(reference_nll(bin, ids, use, ctx, &sum, &scored, &windows) == 0);
    json_t *o = ppl_json(bin, file, extra);
    REQUIRE(o);
    CHECK_EQ_INT(json_integer_value(json_object_get(o, "tokens")), use);
    CHECK_EQ_INT(json_integer_value(json_object_get(o, "tokens_scored")), scored);
    CHECK_EQ_INT(json_integer_value(json_object_get(o, "windows")), windows);
    double mean = json_real_value(json_object_get(o, "mean_nll"));
    double ppl = json_real_value(json_object_get(o, "perplexity"));
    CHECK_NEAR(mean, sum / scored, 1e-9 * fmax(1.0, fabs(mean)));
    CHECK_NEAR(ppl, exp(sum / scored), 1e-8 * ppl);
    json_decref(o);
}

TEST(perplexity_equals_nll_of_logits) {
    const char *bin = getenv("CINFER_BIN");
    if (!bin) SKIP("CINFER_BIN not set");
    char file[600], err[512];
    snprintf(file, sizeof file, "%s/text.py", test_tmpdir());
    REQUIRE(write_text(file, TEXT) == 0);
    cinfer_model *m;
    REQUIRE(cinfer_model_open(MODEL, &m, err, sizeof err) == 0);
    int32_t *ids = NULL;
    int n = 0;
    REQUIRE(cinfer_tokenize(m, TEXT, strlen(TEXT), 0, &ids, &n, err, sizeof err) == 0);
    cinfer_model_close(m);
    REQUIRE(n >= 24);
    check_against_logits(bin, file, ids, n, 7, 0);     /* several windows, a shorter last one */
    check_against_logits(bin, file, ids, n, n - 1, 0); /* a one-token tail: dropped, not scored */
    check_against_logits(bin, file, ids, n, n + 5, 0); /* one window shorter than ctx */
    check_against_logits(bin, file, ids, n, 4, 10);    /* --max-tokens 10: windows 4, 4, 2 -> 7 scored */
    free(ids);
}

TEST(perplexity_window_counts) {
    const char *bin = getenv("CINFER_BIN");
    if (!bin) SKIP("CINFER_BIN not set");
    char file[600];
    snprintf(file, sizeof file, "%s/text.py", test_tmpdir());
    REQUIRE(write_text(file, TEXT) == 0);
    json_t *o = ppl_json(bin, file, "--ctx 4 --max-tokens 10");
    REQUIRE(o);
    CHECK_EQ_INT(json_integer_value(json_object_get(o, "windows")), 3);
    CHECK_EQ_INT(json_integer_value(json_object_get(o, "tokens_scored")), 7);
    json_decref(o);
    o = ppl_json(bin, file, "--ctx 3 --max-tokens 7"); /* 3, 3, 1: the last token is not scored */
    REQUIRE(o);
    CHECK_EQ_INT(json_integer_value(json_object_get(o, "windows")), 2);
    CHECK_EQ_INT(json_integer_value(json_object_get(o, "tokens_scored")), 4);
    json_decref(o);
}

TEST(perplexity_errors) {
    const char *bin = getenv("CINFER_BIN");
    if (!bin) SKIP("CINFER_BIN not set");
    char cmd[2048], one[600], empty[600];
    const char *d = test_tmpdir();
    snprintf(one, sizeof one, "%s/one.txt", d);
    snprintf(empty, sizeof empty, "%s/empty.txt", d);
    REQUIRE(write_text(one, "x") == 0);
    REQUIRE(write_text(empty, "") == 0);
    snprintf(cmd, sizeof cmd, "%s perplexity -m %s --file %s/missing.txt 2>/dev/null", bin, MODEL, d);
    CHECK_EQ_INT(test_run(cmd), 1);
    snprintf(cmd, sizeof cmd, "%s perplexity -m %s --file %s 2>/dev/null", bin, MODEL, one);
    CHECK_EQ_INT(test_run(cmd), 1); /* one token: nothing to score */
    snprintf(cmd, sizeof cmd, "%s perplexity -m %s --file %s 2>/dev/null", bin, MODEL, empty);
    CHECK_EQ_INT(test_run(cmd), 1);
    snprintf(cmd, sizeof cmd, "%s perplexity -m %s --file %s --ctx 1 2>/dev/null", bin, MODEL, one);
    CHECK_EQ_INT(test_run(cmd), 2);
    snprintf(cmd, sizeof cmd, "%s perplexity -m %s 2>/dev/null", bin, MODEL);
    CHECK_EQ_INT(test_run(cmd), 2);
    snprintf(cmd, sizeof cmd, "%s perplexity -m %s --file %s --bogus 2>/dev/null", bin, MODEL, one);
    CHECK_EQ_INT(test_run(cmd), 2);
    snprintf(cmd, sizeof cmd, "%s perplexity -m %s/nothing-here --file %s 2>/dev/null", bin, d, one);
    CHECK_EQ_INT(test_run(cmd), 1);
}

/* The held-out fixture: tests/fixtures/default_model/perplexity.json (transformers' figures) there, and with
 * weights, the trained default model's weights too */
static int heldout_there(int weights) {
    char path[600];
    snprintf(path, sizeof path, "%s/default_model/perplexity.json", test_fixtures_dir());
    return file_exists(path) && (!weights || file_exists(MODEL "/model.safetensors"));
}

/* its JSON (NULL: it did not parse), the path of the text it scored into sample, its window into *ctx */
static json_t *heldout_ref(char *sample, size_t n, long *ctx) {
    char path[600];
    snprintf(path, sizeof path, "%s/default_model/perplexity.json", test_fixtures_dir());
    json_error_t je;
    json_t *ref = json_load_file(path, 0, &je);
    if (!ref) return NULL;
    snprintf(sample, n, "%s/default_model/%s", test_fixtures_dir(),
             json_string_value(json_object_get(ref, "file")));
    *ctx = (long)json_integer_value(json_object_get(ref, "ctx"));
    return ref;
}

/* The check: `cinfer perplexity` on the held-out split reports transformers' perplexity within
 * 0.5%. Sanitizer builds score the first 2048 ids against the prefix figure of the same file. */
TEST(perplexity_heldout_matches_transformers) {
    const char *bin = getenv("CINFER_BIN");
    if (!bin) SKIP("CINFER_BIN not set");
    char sample[600], extra[128];
    if (!heldout_there(0))
        SKIP("tests/fixtures/default_model/perplexity.json is not there (random default model)");
    long ctx;
    json_t *ref = heldout_ref(sample, sizeof sample, &ctx);
    REQUIRE(ref);
    json_t *want = ref;
    json_t *prefix = json_object_get(ref, "prefix");
    if (SLOW_BUILD && prefix) {
        want = prefix;
        snprintf(extra, sizeof extra, "--ctx %ld --max-tokens %lld", ctx,
                 (long long)json_integer_value(json_object_get(prefix, "max_tokens")));
    } else {
        snprintf(extra, sizeof extra, "--ctx %ld", ctx);
    }
    json_t *o = ppl_json(bin, sample, extra);
    if (!o) {
        json_decref(ref);
        return;
    }
    double got = json_real_value(json_object_get(o, "perplexity"));
    double hf = json_real_value(json_object_get(want, "perplexity"));
    printf("     held-out perplexity: cinfer %.4f, transformers %.4f (%+.4f%%), %lld tokens scored\n", got,
           hf, 100 * (got / hf - 1), (long long)json_integer_value(json_object_get(o, "tokens_scored")));
    CHECK_EQ_INT(json_integer_value(json_object_get(o, "tokens_scored")),
                 json_integer_value(json_object_get(want, "tokens_scored")));
    CHECK_MSG(fabs(got / hf - 1) <= 0.005, "perplexity %.6g vs transformers %.6g: %.3f%% apart (bound 0.5%%)",
              got, hf, 100 * fabs(got / hf - 1));
    json_decref(o);
    json_decref(ref);
}

/* Precision fast on the GPU: the held-out perplexity within 1% of the exact mode's (same windows, same
 * scored tokens), and the JSON says which precision ran. Skipped without a device or the trained weights. */
TEST(perplexity_cuda_fast_within_1pct_of_exact) {
    const char *bin = getenv("CINFER_BIN");
    if (!bin) SKIP("CINFER_BIN not set");
    if (!cuda_built() || cuda_devices() < 1) SKIP("no CUDA device: skipped");
    char sample[600], extra[2][128];
    if (!heldout_there(1)) SKIP("the default model's weights or perplexity.json are not there");
    long ctx;
    json_t *ref = heldout_ref(sample, sizeof sample, &ctx);
    REQUIRE(ref);
    double hf = json_real_value(json_object_get(ref, "perplexity"));
    json_decref(ref);
    double ppl[2] = {0, 0};
    long long scored[2] = {0, 0};
    for (int f = 0; f < 2; f++) {
        snprintf(extra[f], sizeof extra[f], "--ctx %ld --device cuda --precision %s", ctx, f ? "fast" : "exact");
        json_t *o = ppl_json(bin, sample, extra[f]);
        if (!o) return;
        ppl[f] = json_real_value(json_object_get(o, "perplexity"));
        scored[f] = (long long)json_integer_value(json_object_get(o, "tokens_scored"));
        const char *pr = json_string_value(json_object_get(o, "precision"));
        CHECK_MSG(pr && !strcmp(pr, f ? "fast" : "exact"), "perplexity --precision %s ran %s", f ? "fast" : "exact",
                  pr ? pr : "(none)");
        json_decref(o);
    }
    printf("     held-out perplexity on cuda: exact %.4f, fast %.4f (%+.3f%%), transformers %.4f; %lld tokens\n",
           ppl[0], ppl[1], 100 * (ppl[1] / ppl[0] - 1), hf, scored[1]);
    CHECK_EQ_INT(scored[0], scored[1]);
    CHECK_MSG(fabs(ppl[1] / ppl[0] - 1) <= 0.01, "fast perplexity %.6g vs exact %.6g: %.3f%% apart (bound 1%%)",
              ppl[1], ppl[0], 100 * fabs(ppl[1] / ppl[0] - 1));
}

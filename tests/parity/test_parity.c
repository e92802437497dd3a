/* test_parity.c — logits and greedy continuations against transformers' float32 forward, for every
 * oracle fixture (tests/fixtures/<model>/cases.json, made by tools/oracle/make_fixtures.py):
 * max |logit - reference| <= 1e-4 x std(reference logits) at every position, greedy ids identical.
 * The same checks run once through the CLI (`cinfer logits --out`, `cinfer generate --ids`). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "cinfer.h"
#include "test.h"
#include "util/file.h"
#include "util/npy.h"

#define PARITY_BOUND 1e-4

static double g_worst = 0.0;
static char g_worst_where[256];

typedef struct fixture {
    char dir[512];     /* fixture directory (cases.json, npy files) */
    char model[512];   /* model directory */
    json_t *root;
} fixture;

static int fixture_open(const char *name, const char *model_dir, fixture *f) {
    snprintf(f->dir, sizeof f->dir, "%s/%s", test_fixtures_dir(), name);
    snprintf(f->model, sizeof f->model, "%s", model_dir ? model_dir : f->dir);
    char path[600];
    snprintf(path, sizeof path, "%s/cases.json", f->dir);
    json_error_t je;
    f->root = json_load_file(path, 0, &je);
    if (!f->root) {
        test_fail(__FILE__, __LINE__, "%s: %s (fixtures are committed; run tools/oracle to remake them)", path, je.text);
        return -1;
    }
    return 0;
}

static int load_ids(json_t *arr, int32_t **out) {
    size_t n = json_array_size(arr);
    *out = malloc((n ? n : 1) * sizeof(int32_t));
    for (size_t i = 0; i < n; i++) (*out)[i] = (int32_t)json_integer_value(json_array_get(arr, i));
    return (int)n;
}

/* Compares one case's logits with its reference; returns the worst |diff| / std. */
static double compare_logits(const char *where, const float *got, const float *ref, int T, int V) {
    double s = 0, s2 = 0;
    size_t n = (size_t)T * V;
    for (size_t i = 0; i < n; i++) {
        s += ref[i];
        s2 += (double)ref[i] * ref[i];
    }
    double mean = s / n, sd = sqrt(s2 / n - mean * mean), worst = 0;
    int worst_pos = 0;
    for (int t = 0; t < T; t++)
        for (int v = 0; v < V; v++) {
            double d = fabs((double)got[(size_t)t * V + v] - ref[(size_t)t * V + v]);
            if (d != d) d = INFINITY;
            if (d / sd > worst) worst = d / sd, worst_pos = t;
        }
    CHECK_MSG(worst <= PARITY_BOUND, "%s: max |logit - ref| = %.3g x std (position %d), bound %g", where, worst, worst_pos,
              PARITY_BOUND);
    if (worst > g_worst) {
        g_worst = worst;
        snprintf(g_worst_where, sizeof g_worst_where, "%s", where);
    }
    return worst;
}

static float *read_npy(const char *dir, const char *file, int *T, int *V, char **keep) {
    char path[800], err[512];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    size_t len;
    if (file_read_all(path, (size_t)1 << 31, keep, &len, err, sizeof err)) {
        test_fail(__FILE__, __LINE__, "%s", err);
        return NULL;
    }
    npy_array a;
    if (npy_parse_f32(*keep, len, &a, err, sizeof err) || a.ndim != 2) {
        test_fail(__FILE__, __LINE__, "%s: %s", path, a.ndim != 2 ? "not 2-D" : err);
        return NULL;
    }
    *T = (int)a.shape[0];
    *V = (int)a.shape[1];
    return (float *)a.data;
}

static void run_fixture(const char *name, const char *model_dir) {
    fixture f;
    if (fixture_open(name, model_dir, &f)) return;
    char err[1024];
    cinfer_model *m;
    int rc = cinfer_model_open(f.model, &m, err, sizeof err);
    CHECK_MSG(rc == 0, "%s: %s", name, err);
    if (rc) {
        json_decref(f.root);
        return;
    }
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    json_t *cases = json_object_get(f.root, "cases"), *c;
    size_t i;
    CHECK_MSG(json_array_size(cases) >= 1, "%s: no cases", name);
    json_array_foreach(cases, i, c) {
        int32_t *toks;
        int n = load_ids(json_object_get(c, "tokens"), &toks);
        int T, V;
        char *keep = NULL;
        const float *ref = read_npy(f.dir, json_string_value(json_object_get(c, "logits")), &T, &V, &keep);
        if (ref) {
            CHECK_EQ_INT(T, n);
            CHECK_EQ_INT(V, info.vocab_size);
        }
        if (ref && T == n && V == info.vocab_size) {
            /* one forward over the whole sequence, as the reference does */
            cinfer_ctx_params p = cinfer_ctx_default_params();
            p.max_seqs = 1;
            p.max_ctx = n;
            p.max_batch = n;
            p.n_threads = 2;
            cinfer_ctx *ctx;
            REQUIRE(cinfer_ctx_create(m, &p, &ctx, err, sizeof err) == 0);
            int seq = cinfer_seq_open(ctx, err, sizeof err);
            float *got = malloc(sizeof(float) * (size_t)n * V);
            cinfer_batch_entry e = {seq, toks, n, 1};
            REQUIRE(cinfer_forward(ctx, &e, 1, got, err, sizeof err) == 0);
            char where[300];
            snprintf(where, sizeof where, "%s/%s", name, json_string_value(json_object_get(c, "name")));
            double w = compare_logits(where, got, ref, n, V);
            printf("     %-28s T=%-4d max|d|/std = %.2e\n", where, n, w);
            free(got);
            cinfer_ctx_destroy(ctx);
        }
        free(keep);
        free(toks);
    }
    json_t *greedy = json_object_get(f.root, "greedy");
    json_array_foreach(greedy, i, c) {
        int32_t *prompt, *want;
        int np = load_ids(json_object_get(c, "prompt"), &prompt);
        int nw = load_ids(json_object_get(c, "output"), &want);
        cinfer_ctx_params p = cinfer_ctx_default_params();
        p.max_seqs = 1;
        p.max_ctx = np + nw;
        p.max_batch = np;
        p.n_threads = 2;
        cinfer_ctx *ctx;
        REQUIRE(cinfer_ctx_create(m, &p, &ctx, err, sizeof err) == 0);
        int seq = cinfer_seq_open(ctx, err, sizeof err);
        float *lg = malloc(sizeof(float) * info.vocab_size);
        cinfer_batch_entry e = {seq, prompt, np, 0};
        REQUIRE(cinfer_forward(ctx, &e, 1, lg, err, sizeof err) == 0);
        int first_diff = -1;
        for (int t = 0; t < nw; t++) {
            int32_t best = 0;
            for (int v = 1; v < info.vocab_size; v++)
                if (lg[v] > lg[best]) best = v;
            if (best != want[t] && first_diff < 0) first_diff = t;
            if (t + 1 < nw) {
                cinfer_batch_entry d = {seq, &want[t], 1, 0}; /* teacher-force the reference to report every step */
                REQUIRE(cinfer_forward(ctx, &d, 1, lg, err, sizeof err) == 0);
            }
        }
        CHECK_MSG(first_diff < 0, "%s greedy %s: first differs at step %d of %d", name,
                  json_string_value(json_object_get(c, "name")), first_diff, nw);
        free(lg);
        free(prompt);
        free(want);
        cinfer_ctx_destroy(ctx);
    }
    cinfer_model_close(m);
    json_decref(f.root);
}

TEST(parity_qwen35_dense) { run_fixture("qwen35_dense", NULL); }
TEST(parity_qwen35_text_sharded) { run_fixture("qwen35_text", NULL); }
TEST(parity_qwen35_moe) { run_fixture("qwen35_moe", NULL); }
TEST(parity_qwen35_moe_fused_experts) { run_fixture("qwen35_moe_fused", NULL); }
TEST(parity_qwen3_next) { run_fixture("qwen3_next", NULL); }
TEST(parity_default_model) { run_fixture("default_model", "models/default"); }

/* the long case of the trained default model (tools/oracle/make_default_long.py): 512 held-out ids as one
 * prefill, the reference's logits at 56 positions, the same bound */
TEST(parity_default_model_long) {
    char dir[512], path[700], err[1024] = "";
    snprintf(dir, sizeof dir, "%s/default_model", test_fixtures_dir());
    snprintf(path, sizeof path, "%s/long_cases.json", dir);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        test_fail(__FILE__, __LINE__, "%s: %s (made by tools/oracle/make_default_long.py)", path, je.text);
        return;
    }
    json_t *c = json_array_get(json_object_get(root, "cases"), 0);
    int32_t *toks, *pos;
    int n = load_ids(json_object_get(c, "tokens"), &toks), P = load_ids(json_object_get(c, "positions"), &pos);
    int T, V;
    char *keep = NULL;
    const float *ref = read_npy(dir, json_string_value(json_object_get(c, "logits")), &T, &V, &keep);
    cinfer_model *m = NULL;
    if (ref && T == P && cinfer_model_open("models/default", &m, err, sizeof err) == 0) {
        cinfer_ctx_params p = cinfer_ctx_default_params();
        p.max_seqs = 1, p.max_ctx = n, p.max_batch = n, p.n_threads = 2, p.device = CINFER_DEVICE_CPU;
        cinfer_ctx *ctx;
        if (cinfer_ctx_create(m, &p, &ctx, err, sizeof err) == 0) {
            int seq = cinfer_seq_open(ctx, err, sizeof err);
            float *all = malloc(sizeof(float) * (size_t)n * V), *got = malloc(sizeof(float) * (size_t)P * V);
            cinfer_batch_entry e = {seq, toks, n, 1};
            if (cinfer_forward(ctx, &e, 1, all, err, sizeof err) == 0) {
                for (int i = 0; i < P; i++) memcpy(got + (size_t)i * V, all + (size_t)pos[i] * V, sizeof(float) * V);
                char where[64];
                snprintf(where, sizeof where, "default_model/%s", json_string_value(json_object_get(c, "name")));
                double w = compare_logits(where, got, ref, P, V);
                printf("     %-28s T=%-4d %d rows: max|d|/std = %.2e\n", where, n, P, w);
            } else {
                test_fail(__FILE__, __LINE__, "forward: %s", err);
            }
            free(all), free(got);
            cinfer_ctx_destroy(ctx);
        } else {
            test_fail(__FILE__, __LINE__, "context: %s", err);
        }
        cinfer_model_close(m);
    } else {
        test_fail(__FILE__, __LINE__, "%s: the logits (%d rows, %d positions) or models/default did not load: %s", path,
                  ref ? T : -1, P, err);
    }
    free(keep), free(toks), free(pos);
    json_decref(root);
}

TEST(parity_worst_figure) {
    /* runs after the parity_* tests (sorted by name within the file): reports the worst figure seen */
    if (g_worst == 0.0) SKIP("no parity case ran before this one");
    printf("     worst parity figure: %.3e x std at %s (bound %g)\n", g_worst, g_worst_where, PARITY_BOUND);
    CHECK(g_worst <= PARITY_BOUND);
}

/* The CLI path the outside checks use: `cinfer logits --out` and `cinfer generate --ids`. */
TEST(parity_through_cli) {
    const char *bin = getenv("CINFER_BIN");
    if (!bin) bin = "build/cinfer";
    fixture f;
    if (fixture_open("qwen35_dense", NULL, &f)) return;
    json_t *c = json_array_get(json_object_get(f.root, "cases"), json_array_size(json_object_get(f.root, "cases")) - 1);
    json_t *g = json_array_get(json_object_get(f.root, "greedy"), 0);
    REQUIRE(c && g);
    char *toks = json_dumps(json_object_get(c, "tokens"), JSON_COMPACT);
    char *prompt = json_dumps(json_object_get(g, "prompt"), JSON_COMPACT);
    char *want = json_dumps(json_object_get(g, "output"), JSON_COMPACT);
    /* "[1,2,3]" -> "1,2,3" */
    toks[strlen(toks) - 1] = 0;
    prompt[strlen(prompt) - 1] = 0;
    want[strlen(want) - 1] = 0;
    size_t cl = strlen(toks) + strlen(prompt) + 2048;
    char *cmd = malloc(cl), out[600];
    snprintf(out, sizeof out, "%s/cli_logits.npy", test_tmpdir());
    snprintf(cmd, cl, "%s logits -m %s --tokens %s --out %s", bin, f.dir, toks + 1, out);
    int rc = system(cmd);
    CHECK_MSG(rc == 0, "%s failed (%d)", "cinfer logits", rc);
    int T, V, T2, V2;
    char *k1 = NULL, *k2 = NULL;
    const float *got = read_npy(test_tmpdir(), "cli_logits.npy", &T, &V, &k1);
    const float *ref = read_npy(f.dir, json_string_value(json_object_get(c, "logits")), &T2, &V2, &k2);
    if (got && ref) {
        CHECK(T == T2 && V == V2);
        if (T == T2 && V == V2) compare_logits("cli logits", got, ref, T, V);
    }
    snprintf(cmd, cl, "%s generate -m %s --tokens %s -n %d --ids", bin, f.dir, prompt + 1,
             (int)json_array_size(json_object_get(g, "output")));
    FILE *p = popen(cmd, "r");
    REQUIRE(p);
    char line[8192] = "";
    if (!fgets(line, sizeof line, p)) line[0] = 0;
    CHECK_EQ_INT(pclose(p), 0);
    line[strcspn(line, "\n")] = 0;
    CHECK_MSG(!strcmp(line, want + 1), "cinfer generate --ids printed \"%s\", expected \"%s\"", line, want + 1);
    free(k1), free(k2), free(cmd), free(toks), free(prompt), free(want);
    json_decref(f.root);
}

/* test_precision.c — the precision parameter (cinfer_precision): parsing and names, its default from
 * $CINFER_PRECISION (a bad value there is an error naming it, never a silent exact), a bad parameter, what a
 * CPU context runs with fast asked (exact, and says so through cinfer_ctx_precision and the engine's stats),
 * and the CLI's --precision (taken out for every verb; a bad value exits 2). The CUDA side (fast mode's error
 * on the trained default model) is tests/parity/test_parity_cuda_fast.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cinfer.h"
#include "test.h"

#define MODEL "models/default"

/* sets or clears CINFER_PRECISION for one check and gives back what was there (the runner's own value) */
static char *env_swap(const char *v) {
    const char *old = getenv("CINFER_PRECISION");
    char *keep = old ? strdup(old) : NULL;
    if (v)
        setenv("CINFER_PRECISION", v, 1);
    else
        unsetenv("CINFER_PRECISION");
    return keep;
}
static void env_restore(char *keep) {
    if (keep)
        setenv("CINFER_PRECISION", keep, 1);
    else
        unsetenv("CINFER_PRECISION");
    free(keep);
}

TEST(precision_parse_and_names) {
    CHECK_EQ_INT(cinfer_precision_parse("exact"), CINFER_PRECISION_EXACT);
    CHECK_EQ_INT(cinfer_precision_parse("fast"), CINFER_PRECISION_FAST);
    CHECK_EQ_INT(cinfer_precision_parse("Fast"), -1);
    CHECK_EQ_INT(cinfer_precision_parse("fast "), -1);
    CHECK_EQ_INT(cinfer_precision_parse(""), -1);
    CHECK_EQ_INT(cinfer_precision_parse(NULL), -1);
    CHECK(!strcmp(cinfer_precision_name(CINFER_PRECISION_EXACT), "exact"));
    CHECK(!strcmp(cinfer_precision_name(CINFER_PRECISION_FAST), "fast"));
    CHECK(!strcmp(cinfer_precision_name(2), "?"));
    CHECK(!strcmp(cinfer_precision_name(-1), "?"));
}

TEST(precision_default_from_env) {
    char *keep = env_swap(NULL);
    CHECK_EQ_INT(cinfer_ctx_default_params().precision, CINFER_PRECISION_EXACT);
    CHECK_EQ_INT(cinfer_engine_default_params().precision, CINFER_PRECISION_EXACT);
    setenv("CINFER_PRECISION", "fast", 1);
    CHECK_EQ_INT(cinfer_ctx_default_params().precision, CINFER_PRECISION_FAST);
    CHECK_EQ_INT(cinfer_engine_default_params().precision, CINFER_PRECISION_FAST);
    setenv("CINFER_PRECISION", "exact", 1);
    CHECK_EQ_INT(cinfer_ctx_default_params().precision, CINFER_PRECISION_EXACT);
    setenv("CINFER_PRECISION", "bf16", 1);
    CHECK(cinfer_ctx_default_params().precision < 0);
    env_restore(keep);
}

TEST(precision_bad_values_are_errors) {
    char err[512];
    cinfer_model *m;
    REQUIRE(cinfer_model_open(MODEL, &m, err, sizeof err) == 0);
    char *keep = env_swap("bf16");
    cinfer_ctx_params p = cinfer_ctx_default_params();
    p.max_ctx = 64, p.max_batch = 16, p.n_threads = 1, p.device = CINFER_DEVICE_CPU;
    cinfer_ctx *c = NULL;
    err[0] = 0;
    CHECK_EQ_INT(cinfer_ctx_create(m, &p, &c, err, sizeof err), CINFER_EINVAL);
    CHECK(c == NULL);
    CHECK_STR_CONTAINS(err, "CINFER_PRECISION='bf16'");
    CHECK_STR_CONTAINS(err, "exact or fast");
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.ctx_size = 64, ep.max_seqs = 1, ep.step_tokens = 16, ep.n_threads = 1, ep.device = CINFER_DEVICE_CPU;
    cinfer_engine *e = NULL;
    err[0] = 0;
    CHECK_EQ_INT(cinfer_engine_create(m, &ep, &e, err, sizeof err), CINFER_EINVAL);
    CHECK(e == NULL);
    CHECK_STR_CONTAINS(err, "CINFER_PRECISION='bf16'");
    env_restore(keep);
    keep = env_swap(NULL);
    p = cinfer_ctx_default_params();
    p.max_ctx = 64, p.max_batch = 16, p.n_threads = 1, p.device = CINFER_DEVICE_CPU, p.precision = 7;
    err[0] = 0;
    CHECK_EQ_INT(cinfer_ctx_create(m, &p, &c, err, sizeof err), CINFER_EINVAL);
    CHECK_STR_CONTAINS(err, "precision 7");
    env_restore(keep);
    cinfer_model_close(m);
}

/* the CPU has one path: fast is accepted and exact runs, and both queries say exact */
TEST(precision_cpu_runs_exact) {
    char err[512];
    cinfer_model *m;
    REQUIRE(cinfer_model_open(MODEL, &m, err, sizeof err) == 0);
    cinfer_ctx_params p = cinfer_ctx_default_params();
    p.max_ctx = 64, p.max_batch = 16, p.n_threads = 1, p.device = CINFER_DEVICE_CPU,
    p.precision = CINFER_PRECISION_FAST;
    cinfer_ctx *c = NULL;
    REQUIRE(cinfer_ctx_create(m, &p, &c, err, sizeof err) == 0);
    CHECK_EQ_INT(cinfer_ctx_device(c), CINFER_DEVICE_CPU);
    CHECK_EQ_INT(cinfer_ctx_precision(c), CINFER_PRECISION_EXACT);
    cinfer_ctx_destroy(c);
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.ctx_size = 64, ep.max_seqs = 1, ep.step_tokens = 16, ep.n_threads = 1, ep.device = CINFER_DEVICE_CPU;
    ep.precision = CINFER_PRECISION_FAST;
    cinfer_engine *e = NULL;
    REQUIRE(cinfer_engine_create(m, &ep, &e, err, sizeof err) == 0);
    cinfer_engine_stats st;
    cinfer_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.device, CINFER_DEVICE_CPU);
    CHECK_EQ_INT(st.precision, CINFER_PRECISION_EXACT);
    cinfer_engine_destroy(e);
    cinfer_model_close(m);
}

/* --precision is taken out for every verb (main.c), like --device; the CPU reports what it ran */
TEST(precision_cli_flag) {
    const char *bin = getenv("CINFER_BIN");
    if (!bin) SKIP("CINFER_BIN not set");
    char cmd[2048], out[600], file[600];
    const char *d = test_tmpdir();
    snprintf(file, sizeof file, "%s/t.txt", d);
    FILE *f = fopen(file, "wb");
    REQUIRE(f);
    fputs("one two three four five six seven eight\n", f);
    fclose(f);
    snprintf(out, sizeof out, "%s/ppl.json", d);
    snprintf(cmd, sizeof cmd, "%s perplexity --precision bf16 -m %s --file %s 2>/dev/null", bin, MODEL, file);
    CHECK_EQ_INT(test_run(cmd), 2);
    snprintf(cmd, sizeof cmd, "%s generate -m %s --prompt hi -n 1 --precision 2>/dev/null", bin, MODEL);
    CHECK_EQ_INT(test_run(cmd), 2);
    snprintf(cmd, sizeof cmd, "CINFER_PRECISION=bf16 %s perplexity -m %s --file %s 2>/dev/null", bin, MODEL,
             file);
    CHECK_EQ_INT(test_run(cmd), 2);
    snprintf(cmd, sizeof cmd, "%s perplexity -m %s --file %s --device cpu --precision fast --json > %s", bin,
             MODEL, file, out);
    CHECK_EQ_INT(test_run(cmd), 0);
    char buf[4096] = {0};
    f = fopen(out, "rb");
    REQUIRE(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    CHECK_STR_CONTAINS(buf, "\"precision\":\"exact\"");
    CHECK_STR_CONTAINS(buf, "\"device\":\"cpu\"");
    snprintf(cmd, sizeof cmd, "%s generate -m %s --prompt hi -n 1 --precision exact > /dev/null 2>&1", bin,
             MODEL);
    CHECK_EQ_INT(test_run(cmd), 0);
}

/* test_model.c — the forward pass's own invariants on tiny random models of each architecture:
 * chunked == recurrent DeltaNet, batch == solo bit for bit, decode after prefill == one long prefill,
 * and a clear error for each kind of malformed checkpoint. Parity with transformers is tests/parity. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cinfer.h"
#include "model/forward.h"
#include "runtime/ctx_internal.h"
#include "test.h"
#include "tiny_model.h"
#include "util/alloc.h"

static uint64_t g_rng = 12345;
static float frand(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static void l2n(float *x, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(s + 1e-6));
    for (int i = 0; i < n; i++) x[i] *= r;
}

/* The two DeltaNet forms on the same random inputs, for lengths around the chunk boundaries. */
TEST(gdn_chunked_matches_recurrent) {
    const int dk = 16, dv = 24;
    int lens[] = {1, 2, 17, 63, 64, 65, 130, 200};
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        int n = lens[li];
        float *q = malloc(sizeof(float) * n * dk), *k = malloc(sizeof(float) * n * dk), *v = malloc(sizeof(float) * n * dv);
        float *g = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
        float *o1 = malloc(sizeof(float) * n * dv), *o2 = malloc(sizeof(float) * n * dv);
        float S1[16 * 24], S2[16 * 24];
        float *tmp = malloc(sizeof(float) * gdn_chunk_scratch_floats(dk, dv));
        for (int t = 0; t < n; t++) {
            for (int i = 0; i < dk; i++) q[t * dk + i] = frand(), k[t * dk + i] = frand();
            l2n(q + t * dk, dk);
            l2n(k + t * dk, dk);
            for (int i = 0; i < dk; i++) q[t * dk + i] *= 0.25f;
            for (int j = 0; j < dv; j++) v[t * dv + j] = frand();
            g[t] = -0.3f * (1.0f + frand()); /* log decay in (-0.6, 0] */
            b[t] = 0.5f + 0.5f * frand();
        }
        for (int i = 0; i < dk * dv; i++) S1[i] = S2[i] = 0.1f * frand(); /* a carried-in state */
        for (int i = 0; i < n * dv; i++) o1[i] = o2[i] = NAN;
        gdn_recurrent(n, q, dk, k, dk, v, dv, g, 1, b, 1, S1, dk, dv, o1, dv);
        gdn_chunked(n, 0, q, dk, k, dk, v, dv, g, 1, b, 1, S2, dk, dv, o2, dv, tmp);
        double num = 0, den = 0, sn = 0, sd = 0;
        int nan = 0;
        for (int i = 0; i < n * dv; i++) {
            nan |= o2[i] != o2[i];
            num += (o1[i] - o2[i]) * (double)(o1[i] - o2[i]);
            den += (double)o1[i] * o1[i];
        }
        for (int i = 0; i < dk * dv; i++) {
            sn += (S1[i] - S2[i]) * (double)(S1[i] - S2[i]);
            sd += (double)S1[i] * S1[i];
        }
        CHECK_MSG(!nan, "n=%d: chunked output has NaN (unwritten element)", n);
        CHECK_MSG(sqrt(num / den) <= 1e-5, "n=%d: outputs differ by %.3g relative", n, sqrt(num / den));
        CHECK_MSG(sqrt(sn / sd) <= 1e-5, "n=%d: states differ by %.3g relative", n, sqrt(sn / sd));
        free(q), free(k), free(v), free(g), free(b), free(o1), free(o2), free(tmp);
    }
}

/* Opens a tiny model of arch in a fresh subdirectory. */
static cinfer_model *open_tiny(tiny_opts o, const char *sub, char *err, size_t errlen, int *rc) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", test_tmpdir(), sub);
    if (tiny_write(dir, &o)) {
        *rc = -100;
        return NULL;
    }
    cinfer_model *m = NULL;
    *rc = cinfer_model_open(dir, &m, err, errlen);
    return m;
}

static void make_tokens(int32_t *t, int n, int V, uint64_t seed) {
    for (int i = 0; i < n; i++) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        t[i] = (int32_t)(seed % (uint64_t)V);
    }
}

/* Logits of every position of one sequence run alone, prefilling in chunks of `chunk` tokens. */
static float *solo_logits(cinfer_model *m, const int32_t *toks, int n, int chunk, int threads) {
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    cinfer_ctx_params p = cinfer_ctx_default_params();
    p.max_seqs = 1;
    p.max_ctx = n;
    p.max_batch = chunk;
    p.n_threads = threads;
    char err[512];
    cinfer_ctx *c;
    if (cinfer_ctx_create(m, &p, &c, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return NULL;
    }
    int seq = cinfer_seq_open(c, err, sizeof err);
    float *out = malloc(sizeof(float) * (size_t)n * info.vocab_size);
    for (int off = 0; off < n; off += chunk) {
        int cnt = n - off < chunk ? n - off : chunk;
        cinfer_batch_entry e = {seq, toks + off, cnt, 1};
        if (cinfer_forward(c, &e, 1, out + (size_t)off * info.vocab_size, err, sizeof err)) {
            fprintf(stderr, "%s\n", err);
            free(out);
            out = NULL;
            break;
        }
    }
    cinfer_ctx_destroy(c);
    return out;
}

static double max_rel_diff(const float *a, const float *b, size_t n) {
    double mx = 0, s = 0, s2 = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > mx || d != d) mx = d != d ? INFINITY : d;
        s += a[i];
        s2 += (double)a[i] * a[i];
    }
    double mean = s / n, sd = sqrt(s2 / n - mean * mean);
    return mx / sd;
}

static void check_arch_invariants(int arch, int multimodal) {
    char err[1024];
    int rc;
    tiny_opts o = tiny_default(arch);
    o.multimodal = multimodal;
    char sub[64];
    snprintf(sub, sizeof sub, "inv%d_%d", arch, multimodal);
    cinfer_model *m = open_tiny(o, sub, err, sizeof err, &rc);
    CHECK_MSG(rc == 0, "open: %s", err);
    if (!m) return;
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    int V = info.vocab_size;
    /* 1. decode after prefill ≈ one long prefill (different DeltaNet forms, so a tolerance) */
    const int n = 150;
    int32_t toks[150];
    make_tokens(toks, n, V, 99 + arch);
    float *full = solo_logits(m, toks, n, n, 2);
    float *split = solo_logits(m, toks, n, 1, 2); /* token by token: recurrent form throughout */
    float *chunked = solo_logits(m, toks, n, 37, 2); /* prefill chunks that straddle the 64-token chunks */
    REQUIRE(full && split && chunked);
    double d1 = max_rel_diff(full, split, (size_t)n * V), d2 = max_rel_diff(full, chunked, (size_t)n * V);
    CHECK_MSG(d1 <= 1e-4, "arch %d: token-by-token vs one prefill: max diff %.3g x std", arch, d1);
    CHECK_MSG(d2 <= 1e-4, "arch %d: 37-token chunks vs one prefill: max diff %.3g x std", arch, d2);
    /* 1b. prefill split on the 64-token grid (and anywhere for the last piece) == one prefill, bit for bit */
    float *grid = solo_logits(m, toks, n, 64, 2);
    REQUIRE(grid);
    CHECK_MSG(!memcmp(grid, full, sizeof(float) * (size_t)n * V), "arch %d: 64-token pieces differ from one prefill", arch);
    free(grid);
    /* 2. thread count does not change a bit */
    float *one = solo_logits(m, toks, n, n, 1);
    REQUIRE(one);
    CHECK_MSG(!memcmp(one, full, sizeof(float) * (size_t)n * V), "arch %d: 1 thread differs from 2", arch);

    /* 3. a ragged batch gives each sequence exactly its solo logits: 4 sequences of different lengths,
     *    prefilled together, then decoded together for 5 steps */
    int lens[4] = {1, 10, 64, 71};
    int32_t seqs[4][80];
    for (int s = 0; s < 4; s++) make_tokens(seqs[s], lens[s] + 5, V, 1000 + s);
    cinfer_ctx_params p = cinfer_ctx_default_params();
    p.max_seqs = 4;
    p.max_ctx = 80;
    p.max_batch = 256;
    p.n_threads = 2;
    cinfer_ctx *c;
    REQUIRE(cinfer_ctx_create(m, &p, &c, err, sizeof err) == 0);
    int ids[4];
    for (int s = 0; s < 4; s++) ids[s] = cinfer_seq_open(c, err, sizeof err);
    cinfer_batch_entry e[4];
    for (int s = 0; s < 4; s++) e[s] = (cinfer_batch_entry){ids[s], seqs[s], lens[s], 1};
    int rows = cinfer_batch_logit_rows(e, 4);
    float *bl = malloc(sizeof(float) * (size_t)rows * V);
    REQUIRE(cinfer_forward(c, e, 4, bl, err, sizeof err) == 0);
    float *dl = malloc(sizeof(float) * 4 * 5 * (size_t)V);
    for (int step = 0; step < 5; step++) {
        cinfer_batch_entry d[4];
        for (int s = 0; s < 4; s++) d[s] = (cinfer_batch_entry){ids[s], &seqs[s][lens[s] + step], 1, 0};
        /* vary the order of entries between steps: position in the batch must not matter */
        if (step % 2) {
            cinfer_batch_entry t = d[0];
            d[0] = d[3], d[3] = t;
        }
        float tmp[4 * 128];
        REQUIRE(V <= 128);
        REQUIRE(cinfer_forward(c, d, 4, tmp, err, sizeof err) == 0);
        for (int s = 0; s < 4; s++) {
            int slot = step % 2 ? (s == 0 ? 3 : s == 3 ? 0 : s) : s;
            memcpy(dl + ((size_t)s * 5 + step) * V, tmp + (size_t)slot * V, sizeof(float) * V);
        }
    }
    int off = 0;
    for (int s = 0; s < 4; s++) {
        int tot = lens[s] + 5;
        /* solo: prefill lens[s] in one call, then 5 single-token decodes (same call shapes as the batch) */
        cinfer_ctx_params p1 = p;
        p1.max_seqs = 1;
        cinfer_ctx *c1;
        REQUIRE(cinfer_ctx_create(m, &p1, &c1, err, sizeof err) == 0);
        int sid = cinfer_seq_open(c1, err, sizeof err);
        float *sl = malloc(sizeof(float) * (size_t)tot * V);
        cinfer_batch_entry e1 = {sid, seqs[s], lens[s], 1};
        REQUIRE(cinfer_forward(c1, &e1, 1, sl, err, sizeof err) == 0);
        for (int step = 0; step < 5; step++) {
            cinfer_batch_entry dd = {sid, &seqs[s][lens[s] + step], 1, 0};
            REQUIRE(cinfer_forward(c1, &dd, 1, sl + (size_t)(lens[s] + step) * V, err, sizeof err) == 0);
        }
        CHECK_MSG(!memcmp(sl, bl + (size_t)off * V, sizeof(float) * (size_t)lens[s] * V),
                  "arch %d: sequence %d prefill logits differ between batch and solo", arch, s);
        CHECK_MSG(!memcmp(sl + (size_t)lens[s] * V, dl + (size_t)s * 5 * V, sizeof(float) * 5 * (size_t)V),
                  "arch %d: sequence %d decode logits differ between batch and solo", arch, s);
        off += lens[s];
        free(sl);
        cinfer_ctx_destroy(c1);
    }
    /* 4. logits are finite and spread (the model is not degenerate) */
    double s2 = 0;
    int finite = 1;
    for (size_t i = 0; i < (size_t)n * V; i++) {
        finite &= isfinite(full[i]);
        s2 += (double)full[i] * full[i];
    }
    CHECK(finite);
    CHECK_MSG(sqrt(s2 / ((double)n * V)) > 0.1, "arch %d: logits are nearly constant", arch);
    free(bl), free(dl), free(full), free(split), free(chunked), free(one);
    cinfer_ctx_destroy(c);
    cinfer_model_close(m);
}

TEST(dense_batch_solo_decode_invariants) { check_arch_invariants(1, 0); }
TEST(dense_multimodal_wrapper_invariants) { check_arch_invariants(1, 1); }
TEST(moe_fused_experts_invariants) { check_arch_invariants(2, 0); }
TEST(moe_per_expert_invariants) { check_arch_invariants(4, 1); }
TEST(qwen3_next_invariants) { check_arch_invariants(3, 0); }

/* A sequence's KV and state are freed with it: reopening gives a fresh sequence with the same logits. */
TEST(seq_reuse_and_context_limits) {
    char err[1024];
    int rc;
    cinfer_model *m = open_tiny(tiny_default(1), "reuse", err, sizeof err, &rc);
    REQUIRE(m);
    cinfer_ctx_params p = cinfer_ctx_default_params();
    p.max_seqs = 1;
    p.max_ctx = 20;
    p.max_batch = 20;
    p.n_threads = 1;
    cinfer_ctx *c;
    REQUIRE(cinfer_ctx_create(m, &p, &c, err, sizeof err) == 0);
    int32_t toks[21];
    make_tokens(toks, 21, 97, 5);
    float a[97], b[97];
    int s = cinfer_seq_open(c, err, sizeof err);
    REQUIRE(s >= 0);
    CHECK(cinfer_seq_open(c, err, sizeof err) < 0); /* only one slot */
    CHECK_STR_CONTAINS(err, "in use");
    cinfer_batch_entry e = {s, toks, 12, 0};
    REQUIRE(cinfer_forward(c, &e, 1, a, err, sizeof err) == 0);
    CHECK_EQ_INT(cinfer_seq_len(c, s), 12);
    cinfer_batch_entry big = {s, toks, 9, 0};
    CHECK_EQ_INT(cinfer_forward(c, &big, 1, b, err, sizeof err), CINFER_ERANGE);
    CHECK_STR_CONTAINS(err, "exceed the context");
    int32_t bad = 97;
    cinfer_batch_entry eb = {s, &bad, 1, 0};
    CHECK_EQ_INT(cinfer_forward(c, &eb, 1, b, err, sizeof err), CINFER_EINVAL);
    CHECK_STR_CONTAINS(err, "outside the vocabulary");
    cinfer_batch_entry twice[2] = {{s, toks, 1, 0}, {s, toks, 1, 0}};
    CHECK_EQ_INT(cinfer_forward(c, twice, 2, b, err, sizeof err), CINFER_EINVAL);
    cinfer_seq_close(c, s);
    s = cinfer_seq_open(c, err, sizeof err);
    REQUIRE(s >= 0);
    CHECK_EQ_INT(cinfer_seq_len(c, s), 0);
    REQUIRE(cinfer_forward(c, &e, 1, b, err, sizeof err) == 0);
    CHECK(!memcmp(a, b, sizeof a));
    cinfer_ctx_destroy(c);
    cinfer_model_close(m);
}

/* Nothing allocates inside a decode step (the guard aborts if it does). */
TEST(decode_step_does_not_allocate) {
    char err[1024];
    int rc;
    cinfer_model *m = open_tiny(tiny_default(2), "noalloc", err, sizeof err, &rc);
    REQUIRE(m);
    cinfer_ctx_params p = cinfer_ctx_default_params();
    p.max_seqs = 2;
    p.max_ctx = 40;
    p.max_batch = 40;
    p.n_threads = 2;
    cinfer_ctx *c;
    REQUIRE(cinfer_ctx_create(m, &p, &c, err, sizeof err) == 0);
    int32_t toks[40];
    make_tokens(toks, 40, 97, 77);
    float lg[2 * 97];
    int s0 = cinfer_seq_open(c, err, sizeof err), s1 = cinfer_seq_open(c, err, sizeof err);
    cinfer_batch_entry e[2] = {{s0, toks, 20, 0}, {s1, toks + 20, 10, 0}};
    REQUIRE(cinfer_forward(c, e, 2, lg, err, sizeof err) == 0);
    alloc_guard_arm(1);
    long before = alloc_count();
    alloc_guard_begin();
    for (int i = 0; i < 5; i++) {
        cinfer_batch_entry d[2] = {{s0, toks + 30 + i, 1, 0}, {s1, toks + 35 + i, 1, 0}};
        rc = cinfer_forward(c, d, 2, lg, err, sizeof err);
    }
    alloc_guard_end();
    alloc_guard_arm(0);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(alloc_count(), before);
    cinfer_ctx_destroy(c);
    cinfer_model_close(m);
}

/* Malformed checkpoints: each gives a clear error naming what is wrong. */
static void expect_open_error(tiny_opts o, const char *sub, int code, const char *needle1, const char *needle2) {
    char err[1024] = "";
    int rc;
    cinfer_model *m = open_tiny(o, sub, err, sizeof err, &rc);
    CHECK_MSG(m == NULL, "%s: opened a malformed model", sub);
    cinfer_model_close(m);
    CHECK_MSG(rc == code, "%s: code %d, expected %d (%s)", sub, rc, code, err);
    CHECK_STR_CONTAINS(err, needle1);
    if (needle2) CHECK_STR_CONTAINS(err, needle2);
}

TEST(malformed_checkpoints_are_clear_errors) {
    tiny_opts o = tiny_default(1);
    o.drop = "model.layers.1.self_attn.k_norm.weight";
    expect_open_error(o, "bad_missing", CINFER_ENOTFOUND, "missing tensor", "model.layers.1.self_attn.k_norm.weight");
    o = tiny_default(1);
    o.reshape = "model.layers.0.linear_attn.in_proj_qkv.weight";
    expect_open_error(o, "bad_shape", CINFER_EFORMAT, "in_proj_qkv.weight", "expected BF16|F16|F32 [128, 64], got BF16 [129, 64]");
    o = tiny_default(1);
    o.i32 = "model.layers.2.mlp.up_proj.weight";
    expect_open_error(o, "bad_dtype", CINFER_EFORMAT, "mlp.up_proj.weight", "got I32");
    o = tiny_default(3);
    o.drop = "model.layers.0.linear_attn.in_proj_ba.weight";
    expect_open_error(o, "bad_next", CINFER_ENOTFOUND, "in_proj_ba.weight", NULL);
    o = tiny_default(1);
    o.tie = 0;
    o.drop = "lm_head.weight";
    expect_open_error(o, "bad_lmhead", CINFER_ENOTFOUND, "lm_head.weight", "tie_word_embeddings");
    o = tiny_default(2);
    o.drop = "model.layers.3.mlp.experts.down_proj";
    expect_open_error(o, "bad_moe", CINFER_ENOTFOUND, "model.layers.3.mlp.experts.down_proj", NULL);

    /* truncated weights file and a broken config */
    char dir[512], path[600], err[1024];
    snprintf(dir, sizeof dir, "%s/bad_trunc", test_tmpdir());
    tiny_opts ok = tiny_default(1);
    REQUIRE(tiny_write(dir, &ok) == 0);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    REQUIRE(truncate(path, 4000) == 0);
    cinfer_model *m = NULL;
    CHECK(cinfer_model_open(dir, &m, err, sizeof err) != 0);
    CHECK_STR_CONTAINS(err, "model.safetensors");
    snprintf(dir, sizeof dir, "%s/bad_cfg", test_tmpdir());
    REQUIRE(tiny_write(dir, &ok) == 0);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    fputs("{\"model_type\": \"qwen3_5_text\", \"hidden_size\": \"big\"}", f);
    fclose(f);
    CHECK(cinfer_model_open(dir, &m, err, sizeof err) != 0);
    CHECK_STR_CONTAINS(err, "hidden_size");
    CHECK_STR_CONTAINS(err, "config.json");
    CHECK(cinfer_model_open("/nonexistent/dir", &m, err, sizeof err) != 0);
    CHECK_STR_CONTAINS(err, "/nonexistent/dir");
}

/* Speculative windows: logits equal plain decode bit for bit, and a commit of n_keep in {0, 1, k-1, k}
 * leaves the DeltaNet state (conv window and recurrent S of every linear layer) bit-identical to having
 * decoded only those tokens, and the next logits identical too. */
static void check_spec_rollback(int arch) {
    char err[1024], sub[64];
    int rc;
    snprintf(sub, sizeof sub, "spec%d", arch);
    cinfer_model *m = open_tiny(tiny_default(arch), sub, err, sizeof err, &rc);
    REQUIRE(m);
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    int V = info.vocab_size;
    enum { P = 21, K = 5 };
    int32_t toks[P + K + 1];
    make_tokens(toks, P + K + 1, V, 4242 + arch);
    cinfer_ctx_params p = cinfer_ctx_default_params();
    p.max_seqs = 2;
    p.max_ctx = 64;
    p.max_batch = 64;
    p.n_threads = 2;
    p.spec_window = 8;
    cinfer_ctx *c;
    REQUIRE(cinfer_ctx_create(m, &p, &c, err, sizeof err) == 0);
    float *plain = malloc(sizeof(float) * (K + 1) * V), *spec = malloc(sizeof(float) * (K + 1) * V);
    float *tmp = malloc(sizeof(float) * 2 * V);
    int keeps[4] = {0, 1, K - 1, K};
    for (int ki = 0; ki < 4; ki++) {
        int keep = keeps[ki];
        int a = cinfer_seq_open(c, err, sizeof err), b = cinfer_seq_open(c, err, sizeof err);
        cinfer_batch_entry pa[2] = {{a, toks, P, 0}, {b, toks, P, 0}};
        REQUIRE(cinfer_forward(c, pa, 2, tmp, err, sizeof err) == 0);
        /* a: plain decode of the window's tokens one by one; b: one speculative window */
        for (int t = 0; t < K; t++) {
            cinfer_batch_entry d = {a, toks + P + t, 1, 0};
            REQUIRE(cinfer_forward(c, &d, 1, plain + (size_t)t * V, err, sizeof err) == 0);
        }
        cinfer_batch_entry w = {b, toks + P, K, 1, 1};
        REQUIRE(cinfer_forward(c, &w, 1, spec, err, sizeof err) == 0);
        CHECK_MSG(!memcmp(plain, spec, sizeof(float) * K * V), "arch %d: window logits differ from plain decode", arch);
        CHECK_EQ_INT(cinfer_seq_len(c, b), P); /* not advanced before the commit */
        cinfer_batch_entry again = {b, toks, 1, 0};
        CHECK_EQ_INT(cinfer_forward(c, &again, 1, tmp, err, sizeof err), CINFER_ESTATE);
        REQUIRE(cinfer_seq_commit(c, b, keep, err, sizeof err) == 0);
        CHECK_EQ_INT(cinfer_seq_len(c, b), P + keep);
        /* reference: a fresh sequence that decoded only the kept tokens */
        cinfer_seq_close(c, a);
        a = cinfer_seq_open(c, err, sizeof err);
        cinfer_batch_entry pr = {a, toks, P, 0};
        REQUIRE(cinfer_forward(c, &pr, 1, tmp, err, sizeof err) == 0);
        for (int t = 0; t < keep; t++) {
            cinfer_batch_entry d = {a, toks + P + t, 1, 0};
            REQUIRE(cinfer_forward(c, &d, 1, tmp, err, sizeof err) == 0);
        }
        for (int l = 0; l < info.n_linear_layers; l++)
            for (int which = 0; which < 2; which++) {
                size_t na, nb;
                const float *sa = ctx_seq_state(c, a, l, which, &na), *sb = ctx_seq_state(c, b, l, which, &nb);
                REQUIRE(sa && sb && na == nb);
                CHECK_MSG(!memcmp(sa, sb, sizeof(float) * na), "arch %d keep %d: layer %d %s state differs", arch, keep, l,
                          which ? "recurrent" : "conv");
            }
        /* the next token after the kept prefix: identical logits */
        cinfer_batch_entry na_ = {a, toks + P + K, 1, 0}, nb_ = {b, toks + P + K, 1, 0};
        REQUIRE(cinfer_forward(c, &na_, 1, tmp, err, sizeof err) == 0);
        REQUIRE(cinfer_forward(c, &nb_, 1, tmp + V, err, sizeof err) == 0);
        CHECK_MSG(!memcmp(tmp, tmp + V, sizeof(float) * V), "arch %d keep %d: next logits differ", arch, keep);
        cinfer_seq_close(c, a);
        cinfer_seq_close(c, b);
    }
    free(plain), free(spec), free(tmp);
    cinfer_ctx_destroy(c);
    cinfer_model_close(m);
}

TEST(spec_rollback_dense) { check_spec_rollback(1); }
TEST(spec_rollback_moe) { check_spec_rollback(2); }
TEST(spec_rollback_next) { check_spec_rollback(3); }

/* generation_config.json's sampling fields reach cinfer_model_info (what cinfer serve applies as defaults);
 * absent fields are < 0. */
TEST(generation_config_sampling_defaults) {
    char err[512];
    cinfer_model *cm = NULL;
    REQUIRE(cinfer_model_open("models/default", &cm, err, sizeof err) == 0);
    cinfer_model_info mi;
    cinfer_model_get_info(cm, &mi);
    CHECK_NEAR(mi.gen_temperature, 0.7, 1e-6);
    CHECK_NEAR(mi.gen_top_p, 0.8, 1e-6);
    CHECK_EQ_INT(mi.gen_top_k, 20);
    CHECK_NEAR(mi.gen_repetition_penalty, 1.1, 1e-6);
    CHECK(mi.gen_min_p < 0);
    cinfer_model_close(cm);
    /* a checkpoint whose generation_config.json names no sampling field */
    REQUIRE(cinfer_model_open("tests/fixtures/qwen35_moe", &cm, err, sizeof err) == 0);
    cinfer_model_get_info(cm, &mi);
    CHECK(mi.gen_temperature < 0 && mi.gen_top_p < 0 && mi.gen_top_k < 0 && mi.gen_repetition_penalty < 0);
    cinfer_model_close(cm);
}

/* test_sampler.c — the sampler chain: greedy ties, per-seed reproducibility, empirical frequencies against
 * known distributions, the exact candidate sets of top_k / top_p / min_p / XTC (hand-built and against a
 * brute-force reference on a large vocabulary), penalty arithmetic, logit_bias, raw logprobs, and that a
 * step never allocates. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cinfer.h"
#include "sample/sample.h"
#include "sample/sampler.h"
#include "test.h"
#include "util/alloc.h"

static sampler *mk(const sampler_params *p, int V) {
    char err[256] = "";
    sampler *s = NULL;
    int rc = sampler_create(p, V, &s, err, sizeof err);
    CHECK_MSG(rc == 0, "sampler_create: %d %s", rc, err);
    return s;
}

/* logits = log(probs): softmax gives probs back exactly up to rounding */
static void log_of(const double *probs, float *logits, int n) {
    for (int i = 0; i < n; i++) logits[i] = (float)log(probs[i]);
}

/* Candidate ids as a set, in sampler order (most likely first). */
static int cands(sampler *s, const float *logits, int32_t *ids, float *probs, int cap) {
    return sampler_candidates(s, logits, ids, probs, cap);
}

TEST(sampler_greedy_ties_lowest_id) {
    float x[8] = {0.5f, 2.0f, -1.0f, 3.0f, 1.0f, 0.0f, -3.0f, 3.0f};
    sampler_params p = sampler_default_params();
    float temps[3] = {0.0f, 1e-6f, 9e-6f};
    for (int t = 0; t < 3; t++) {
        p.temperature = temps[t];
        sampler *s = mk(&p, 8);
        REQUIRE(s);
        for (int k = 0; k < 5; k++) CHECK_EQ_INT(sampler_sample(s, x, NULL), 3);
        sampler_destroy(s);
    }
    /* all equal: lowest id; -inf and NaN never win over a finite logit */
    float y[4] = {NAN, -INFINITY, 1.0f, 1.0f};
    p.temperature = 0.0f;
    sampler *s = mk(&p, 4);
    REQUIRE(s);
    CHECK_EQ_INT(sampler_sample(s, y, NULL), 2);
    sampler_destroy(s);
    /* agrees with the CLI's sample_argmax */
    CHECK_EQ_INT(sample_argmax(x, 8), 3);
}

TEST(sampler_seed_reproducible) {
    enum { V = 1000, N = 200 };
    float *x = malloc(V * sizeof *x);
    rng r;
    rng_seed(&r, 7);
    for (int i = 0; i < V; i++) x[i] = (float)(rng_uniform(&r) * 4.0);
    sampler_params p = sampler_default_params();
    p.seed = 12345;
    p.top_k = 200;
    p.top_p = 0.9f;
    p.min_p = 0.01f;
    sampler *a = mk(&p, V), *b = mk(&p, V), *c;
    p.seed = 12346;
    c = mk(&p, V);
    REQUIRE(a && b && c);
    int32_t seq_a[N];
    int same_c = 0;
    for (int i = 0; i < N; i++) {
        seq_a[i] = sampler_sample(a, x, NULL);
        /* b is interleaved with an unrelated sampler: per-request generators do not interfere */
        sampler_sample(c, x, NULL);
        int32_t tb = sampler_sample(b, x, NULL);
        CHECK_EQ_INT(seq_a[i], tb);
    }
    /* another sampler with a's seed, run alone, gives a's sequence; c's seed gives another one */
    p.seed = 12345;
    sampler *a2 = mk(&p, V);
    REQUIRE(a2);
    for (int i = 0; i < N; i++) CHECK_EQ_INT(sampler_sample(a2, x, NULL), seq_a[i]);
    sampler_destroy(c);
    p.seed = 12346;
    c = mk(&p, V);
    for (int i = 0; i < N; i++) same_c += sampler_sample(c, x, NULL) == seq_a[i];
    CHECK_MSG(same_c < N / 4, "seeds 12345 and 12346 agree on %d of %d draws", same_c, N);
    sampler_destroy(a);
    sampler_destroy(a2);
    sampler_destroy(b);
    sampler_destroy(c);
    free(x);
}

/* Draws n times and checks every frequency against expect within 5 standard deviations. */
static void check_freqs(sampler *s, const float *x, int V, const double *expect, int n, const char *what) {
    long cnt[64] = {0};
    for (int i = 0; i < n; i++) {
        int32_t t = sampler_sample(s, x, NULL);
        if (t < 0 || t >= V) {
            CHECK_MSG(0, "%s: token %d out of range", what, (int)t);
            return;
        }
        cnt[t]++;
    }
    for (int i = 0; i < V; i++) {
        double f = (double)cnt[i] / n, sd = sqrt(expect[i] * (1 - expect[i]) / n);
        if (expect[i] == 0.0)
            CHECK_MSG(cnt[i] == 0, "%s: token %d drawn %ld times, expected never", what, i, cnt[i]);
        else
            CHECK_MSG(fabs(f - expect[i]) <= 5 * sd + 1e-9, "%s: token %d freq %.5f expected %.5f (sd %.5f)",
                      what, i, f, expect[i], sd);
    }
}

TEST(sampler_empirical_frequencies) {
    enum { V = 5, N = 100000 };
    double probs[V] = {0.4, 0.25, 0.2, 0.1, 0.05};
    float x[V];
    log_of(probs, x, V);
    for (int i = 0; i < V; i++) x[i] += 3.0f; /* a shift changes nothing */
    sampler_params p = sampler_default_params();
    p.seed = 99;
    sampler *s = mk(&p, V);
    REQUIRE(s);
    check_freqs(s, x, V, probs, N, "T=1");
    sampler_destroy(s);

    /* temperature 0.5 squares the probabilities before renormalising */
    p.temperature = 0.5f;
    s = mk(&p, V);
    REQUIRE(s);
    double sq[V], z = 0;
    for (int i = 0; i < V; i++) z += sq[i] = probs[i] * probs[i];
    for (int i = 0; i < V; i++) sq[i] /= z;
    check_freqs(s, x, V, sq, N, "T=0.5");
    sampler_destroy(s);

    /* top_k 2 renormalises the two best; top_p 0.7 keeps {0.4, 0.25, 0.2} (0.65 < 0.7 <= 0.85) */
    p = sampler_default_params();
    p.seed = 5;
    p.top_k = 2;
    s = mk(&p, V);
    REQUIRE(s);
    double k2[V] = {0.4 / 0.65, 0.25 / 0.65, 0, 0, 0};
    check_freqs(s, x, V, k2, N, "top_k=2");
    sampler_destroy(s);
    p.top_k = 0;
    p.top_p = 0.7f;
    s = mk(&p, V);
    REQUIRE(s);
    double p7[V] = {0.4 / 0.85, 0.25 / 0.85, 0.2 / 0.85, 0, 0};
    check_freqs(s, x, V, p7, N, "top_p=0.7");
    sampler_destroy(s);
}

TEST(sampler_empirical_frequencies_wide_set) {
    /* 6000 tokens: two heavy ones and a flat tail, so the surviving set is wide (> 4096: the vector draw
     * path). 20000 draws: 5 sd is 0.02 on token 0's 0.27 */
    enum { V = 6000, N = 20000 };
    float *x = malloc(V * sizeof *x);
    for (int i = 0; i < V; i++) x[i] = 0.0f;
    x[0] = logf(2000.0f);
    x[1] = logf(1000.0f);
    for (int variant = 0; variant < 3; variant++) {
        sampler_params p = sampler_default_params();
        p.seed = 100 + variant;
        double z = 2000.0 + 1000.0 + (V - 2);
        int last_kept = V - 1;
        if (variant == 1) p.min_p = 1e-6f; /* keeps everything, as a gathered set */
        if (variant == 2) {
            /* top_p 0.99: 2000 + 1000 + the lowest-id tail tokens until the mass reaches 0.99 z */
            p.top_p = 0.99f;
            double target = 0.99f * z;
            int tail = (int)ceil(target - 3000.0);
            last_kept = 1 + tail;
            z = 3000.0 + tail;
        }
        sampler *s = mk(&p, V);
        REQUIRE(s);
        long c0 = 0, c1 = 0, beyond = 0;
        for (int i = 0; i < N; i++) {
            int32_t t = sampler_sample(s, x, NULL);
            c0 += t == 0;
            c1 += t == 1;
            beyond += t > last_kept || t < 0;
        }
        double p0 = 2000.0 / z, p1 = 1000.0 / z;
        CHECK_MSG(fabs((double)c0 / N - p0) <= 5 * sqrt(p0 * (1 - p0) / N),
                  "variant %d: token 0 %.4f vs %.4f", variant, (double)c0 / N, p0);
        CHECK_MSG(fabs((double)c1 / N - p1) <= 5 * sqrt(p1 * (1 - p1) / N),
                  "variant %d: token 1 %.4f vs %.4f", variant, (double)c1 / N, p1);
        CHECK_EQ_INT(beyond, 0);
        int32_t *ids = malloc(V * sizeof *ids);
        float *pr = malloc(V * sizeof *pr);
        CHECK_EQ_INT(sampler_candidates(s, x, ids, pr, V), last_kept + 1);
        free(ids);
        free(pr);
        sampler_destroy(s);
    }
    free(x);
}

TEST(sampler_top_k_set) {
    float x[6] = {1.0f, 5.0f, 3.0f, 3.0f, 4.0f, -2.0f};
    int32_t ids[6];
    float pr[6];
    sampler_params p = sampler_default_params();
    p.top_k = 3;
    sampler *s = mk(&p, 6);
    REQUIRE(s);
    /* 5, 4, then the tie at 3 goes to the lower id (2, not 3) */
    REQUIRE(cands(s, x, ids, pr, 6) == 3);
    CHECK_EQ_INT(ids[0], 1);
    CHECK_EQ_INT(ids[1], 4);
    CHECK_EQ_INT(ids[2], 2);
    double z = exp(5.0) + exp(4.0) + exp(3.0);
    CHECK_NEAR(pr[0], exp(5.0) / z, 1e-6);
    CHECK_NEAR(pr[2], exp(3.0) / z, 1e-6);
    sampler_destroy(s);
    p.top_k = 6; /* k >= vocabulary: everything */
    s = mk(&p, 6);
    REQUIRE(s);
    CHECK_EQ_INT(cands(s, x, ids, pr, 6), 6);
    CHECK_EQ_INT(ids[5], 5);
    sampler_destroy(s);
    p.top_k = 1;
    s = mk(&p, 6);
    REQUIRE(s);
    CHECK_EQ_INT(cands(s, x, ids, pr, 6), 1);
    CHECK_EQ_INT(ids[0], 1);
    CHECK_NEAR(pr[0], 1.0, 1e-7);
    sampler_destroy(s);
}

TEST(sampler_top_p_min_p_sets) {
    double probs[5] = {0.4, 0.3, 0.2, 0.07, 0.03};
    float x[5];
    log_of(probs, x, 5);
    int32_t ids[5];
    float pr[5];
    sampler_params p = sampler_default_params();
    struct {
        float top_p;
        int n;
    } tp[] = {{0.35f, 1}, {0.65f, 2}, {0.75f, 3}, {0.95f, 4}, {0.99f, 5}};
    for (size_t i = 0; i < sizeof tp / sizeof tp[0]; i++) {
        p.top_p = tp[i].top_p;
        sampler *s = mk(&p, 5);
        REQUIRE(s);
        int n = cands(s, x, ids, pr, 5);
        CHECK_MSG(n == tp[i].n, "top_p %.2f kept %d, expected %d", tp[i].top_p, n, tp[i].n);
        for (int j = 0; j < n; j++) CHECK_EQ_INT(ids[j], j);
        double mass = 0;
        for (int j = 0; j < n; j++) mass += probs[j];
        CHECK_NEAR(pr[0], probs[0] / mass, 1e-6);
        sampler_destroy(s);
    }
    /* min_p 0.2: p >= 0.08 survives (0.4, 0.3, 0.2) */
    p = sampler_default_params();
    p.min_p = 0.2f;
    sampler *s = mk(&p, 5);
    REQUIRE(s);
    CHECK_EQ_INT(cands(s, x, ids, pr, 5), 3);
    CHECK_NEAR(pr[2], 0.2 / 0.9, 1e-6);
    sampler_destroy(s);
    /* min_p sees the temperature: at T=2 p ~ sqrt(probs); ratios to the max are sqrt(prob/0.4):
     * 1, .866, .707, .418, .274 -> min_p 0.5 keeps 3, min_p 0.3 keeps 4 */
    p.temperature = 2.0f;
    p.min_p = 0.5f;
    s = mk(&p, 5);
    REQUIRE(s);
    CHECK_EQ_INT(cands(s, x, ids, pr, 5), 3);
    sampler_destroy(s);
    p.min_p = 0.3f;
    s = mk(&p, 5);
    REQUIRE(s);
    CHECK_EQ_INT(cands(s, x, ids, pr, 5), 4);
    sampler_destroy(s);
    /* top_p before min_p: top_p 0.95 keeps 4, then min_p 0.1 (p >= 0.04) drops the 0.07? no: 0.07 >= 0.04
     * stays; min_p 0.2 (p >= 0.08) drops it -> 3. And top_k 2 then top_p 0.9 over the renormalised two:
     * 0.4/0.7 = 0.571 < 0.9 -> both */
    p = sampler_default_params();
    p.top_p = 0.95f;
    p.min_p = 0.1f;
    s = mk(&p, 5);
    REQUIRE(s);
    CHECK_EQ_INT(cands(s, x, ids, pr, 5), 4);
    sampler_destroy(s);
    p.min_p = 0.2f;
    s = mk(&p, 5);
    REQUIRE(s);
    CHECK_EQ_INT(cands(s, x, ids, pr, 5), 3);
    sampler_destroy(s);
    p = sampler_default_params();
    p.top_k = 2;
    p.top_p = 0.9f;
    s = mk(&p, 5);
    REQUIRE(s);
    CHECK_EQ_INT(cands(s, x, ids, pr, 5), 2);
    sampler_destroy(s);
    /* top_p measured over the top_k survivors: top_k 3 (mass 0.9) then top_p 0.5 of that = 0.45:
     * 0.4/0.9 = 0.444 < 0.5 -> 2 kept, while top_p 0.5 alone would keep 2 as well; top_p 0.44 alone keeps
     * 2 (0.4 < 0.44) but after top_k 3 keeps 1 (0.444 >= 0.44) */
    p.top_k = 3;
    p.top_p = 0.44f;
    s = mk(&p, 5);
    REQUIRE(s);
    CHECK_EQ_INT(cands(s, x, ids, pr, 5), 1);
    sampler_destroy(s);
    p.top_k = 0;
    s = mk(&p, 5);
    REQUIRE(s);
    CHECK_EQ_INT(cands(s, x, ids, pr, 5), 2);
    sampler_destroy(s);
}

TEST(sampler_xtc_set) {
    double probs[4] = {0.4, 0.3, 0.2, 0.1};
    float x[4];
    log_of(probs, x, 4);
    int32_t ids[4];
    float pr[4];
    sampler_params p = sampler_default_params();
    p.xtc_probability = 1.0f;
    p.xtc_threshold = 0.25f; /* 0.4 and 0.3 are above: remove all but the least likely of them (0.3) */
    sampler *s = mk(&p, 4);
    REQUIRE(s);
    REQUIRE(cands(s, x, ids, pr, 4) == 3);
    CHECK_EQ_INT(ids[0], 1);
    CHECK_EQ_INT(ids[1], 2);
    CHECK_EQ_INT(ids[2], 3);
    CHECK_NEAR(pr[0], 0.5, 1e-6);
    sampler_destroy(s);
    p.xtc_threshold = 0.15f; /* 0.4, 0.3, 0.2 above: keep 0.2 and 0.1 */
    s = mk(&p, 4);
    REQUIRE(s);
    REQUIRE(cands(s, x, ids, pr, 4) == 2);
    CHECK_EQ_INT(ids[0], 2);
    CHECK_EQ_INT(ids[1], 3);
    sampler_destroy(s);
    p.xtc_threshold = 0.35f; /* only one above: nothing removed */
    s = mk(&p, 4);
    REQUIRE(s);
    CHECK_EQ_INT(cands(s, x, ids, pr, 4), 4);
    sampler_destroy(s);
    p.xtc_threshold = 0.6f; /* > 0.5: off */
    p.xtc_probability = 1.0f;
    s = mk(&p, 4);
    REQUIRE(s);
    CHECK_EQ_INT(cands(s, x, ids, pr, 4), 4);
    sampler_destroy(s);
    /* threshold 0: every token with mass is "above"; only the least likely survives, never a -inf one */
    {
        float x6[6] = {x[0], x[1], x[2], x[3], -INFINITY, -INFINITY};
        p.xtc_threshold = 0.0f;
        /* the vocabulary-wide path, and top_k 5 keeping a -inf token in a gathered set */
        for (int topk = 0; topk <= 5; topk += 5) {
            p.top_k = topk;
            s = mk(&p, 6);
            REQUIRE(s);
            int nc6 = cands(s, x6, ids, pr, 4);
            CHECK_MSG(nc6 == 1, "top_k %d: %d candidates, first %d", topk, nc6, ids[0]);
            CHECK_EQ_INT(ids[0], 3);
            for (int i = 0; i < 20; i++) CHECK_EQ_INT(sampler_sample(s, x6, NULL), 3);
            sampler_destroy(s);
        }
        p.top_k = 0;
    }
    /* XTC measures p after top_k: top_k 3 -> 0.444, 0.333, 0.222; threshold 0.3 removes id 0 only */
    p.xtc_threshold = 0.3f;
    p.top_k = 3;
    s = mk(&p, 4);
    REQUIRE(s);
    REQUIRE(cands(s, x, ids, pr, 4) == 2);
    CHECK_EQ_INT(ids[0], 1);
    CHECK_EQ_INT(ids[1], 2);
    sampler_destroy(s);
    /* probability 0.5: applied on about half the steps; frequencies of id 0 = 0.5 * 0.4 */
    p = sampler_default_params();
    p.xtc_probability = 0.5f;
    p.xtc_threshold = 0.25f;
    p.seed = 3;
    s = mk(&p, 4);
    REQUIRE(s);
    double expect[4] = {0.5 * 0.4, 0.5 * 0.3 + 0.5 * 0.5, 0.5 * 0.2 + 0.5 * (0.2 / 0.6),
                        0.5 * 0.1 + 0.5 * (0.1 / 0.6)};
    check_freqs(s, x, 4, expect, 100000, "xtc p=0.5");
    sampler_destroy(s);
}

/* ---- brute-force reference for the filters on a large vocabulary ---- */

typedef struct {
    double l;
    int id;
} ref_c;

static int ref_cmp(const void *a, const void *b) {
    const ref_c *x = a, *y = b;
    if (x->l != y->l) return x->l > y->l ? -1 : 1;
    return x->id - y->id;
}

/* Full sort in double, then top_k, top_p (smallest prefix with mass >= p of the top_k mass), min_p. */
static int ref_filter(const float *x, int V, float temp, int top_k, float top_p, float min_p, int *out) {
    ref_c *a = malloc((size_t)V * sizeof *a);
    for (int i = 0; i < V; i++) a[i] = (ref_c){(double)x[i], i};
    qsort(a, (size_t)V, sizeof *a, ref_cmp);
    for (int i = 0; i < V; i++) a[i].l /= temp; /* order by the logits themselves, then scale */
    int n = top_k > 0 && top_k < V ? top_k : V;
    double m = a[0].l, z = 0;
    for (int i = 0; i < n; i++) z += exp(a[i].l - m);
    if (top_p < 1.0f) {
        double cum = 0;
        for (int i = 0; i < n; i++) {
            cum += exp(a[i].l - m);
            if (cum >= top_p * z) {
                n = i + 1;
                break;
            }
        }
    }
    if (min_p > 0)
        while (n > 1 && exp(a[n - 1].l - m) < min_p) n--;
    for (int i = 0; i < n; i++) out[i] = a[i].id;
    free(a);
    return n;
}

TEST(sampler_filters_match_reference_large_vocab) {
    enum { V = 50000 };
    float *x = malloc(V * sizeof *x);
    int32_t *ids = malloc(V * sizeof *ids);
    float *pr = malloc(V * sizeof *pr);
    int *ref = malloc(V * sizeof *ref);
    rng r;
    rng_seed(&r, 2024);
    int cases = 0, mismatches = 0;
    for (int trial = 0; trial < 40; trial++) {
        /* a peaked head over a wide tail, like real logits; some trials flat, to force the wide paths */
        double spread = trial % 4 == 0 ? 0.5 : 3.0;
        for (int i = 0; i < V; i++) {
            double g = 0;
            for (int k = 0; k < 4; k++) g += rng_uniform(&r) - 0.5;
            x[i] = (float)(g * spread * 2.0);
        }
        for (int k = 0; k < 20; k++) x[rng_next(&r) % V] += (float)(6.0 + 6.0 * rng_uniform(&r));
        if (trial % 5 == 1) /* exact ties across the cut */
            for (int i = 0; i < V; i += 7) x[i] = 2.0f;
        sampler_params p = sampler_default_params();
        p.temperature = (float)(0.3 + 1.4 * rng_uniform(&r));
        p.top_k = trial % 3 == 0 ? 0 : (int)(rng_next(&r) % 3000) + 1;
        p.top_p = trial % 3 == 1 ? 1.0f : (float)(0.5 + 0.49 * rng_uniform(&r));
        p.min_p = trial % 2 ? 0.0f : (float)(0.001 + 0.1 * rng_uniform(&r));
        if (trial == 7) p.top_k = 40, p.top_p = 0.95f, p.min_p = 0.05f, p.temperature = 0.7f;
        sampler *s = mk(&p, V);
        REQUIRE(s);
        int n = cands(s, x, ids, pr, V);
        int nr = ref_filter(x, V, p.temperature, p.top_k, p.top_p, p.min_p, ref);
        cases++;
        int ok = n == nr;
        for (int i = 0; ok && i < n; i++) ok = ids[i] == ref[i];
        if (!ok) {
            mismatches++;
            CHECK_MSG(0, "trial %d (T %.3f k %d p %.4f min_p %.4f): %d candidates vs reference %d", trial,
                      p.temperature, p.top_k, p.top_p, p.min_p, n, nr);
        }
        double sum = 0;
        for (int i = 0; i < n; i++) sum += pr[i];
        CHECK_NEAR(sum, 1.0, 1e-4);
        for (int i = 1; i < n; i++) CHECK(pr[i] <= pr[i - 1]);
        sampler_destroy(s);
    }
    CHECK_EQ_INT(cases, 40);
    CHECK_EQ_INT(mismatches, 0);
    free(x);
    free(ids);
    free(pr);
    free(ref);
}

TEST(sampler_penalties_exact) {
    enum { V = 8 };
    float x[V] = {2.0f, -1.0f, 3.0f, -2.0f, 0.5f, 1.0f, 0.0f, 4.0f};
    float y[V];
    sampler_params p = sampler_default_params();
    p.repetition_penalty = 1.5f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    sampler *s = mk(&p, V);
    REQUIRE(s);
    char err[128];
    int32_t prompt[3] = {2, 3, 2};
    REQUIRE(sampler_set_prompt(s, prompt, 3, err, sizeof err) == 0);
    /* generated: 3, 4, 4, 6 */
    CHECK_EQ_INT(sampler_accept(s, 3), 0);
    CHECK_EQ_INT(sampler_accept(s, 4), 0);
    CHECK_EQ_INT(sampler_accept(s, 4), 0);
    CHECK_EQ_INT(sampler_accept(s, 6), 0);
    sampler_adjusted_logits(s, x, y);
    CHECK_NEAR(y[0], 2.0f, 0); /* never seen */
    CHECK_NEAR(y[1], -1.0f, 0);
    CHECK_NEAR(y[2], 3.0f / 1.5f, 1e-6);                 /* prompt only: repetition, not presence/frequency */
    CHECK_NEAR(y[3], -2.0f * 1.5f - 0.25f - 0.5f, 1e-6); /* prompt + once generated, negative: multiplied */
    CHECK_NEAR(y[4], 0.5f / 1.5f - 2 * 0.25f - 0.5f, 1e-6);
    CHECK_NEAR(y[5], 1.0f, 0);
    CHECK_NEAR(y[6], 0.0f * 1.5f - 0.25f - 0.5f, 1e-6); /* a zero logit counts as non-positive: multiplied */
    CHECK_NEAR(y[7], 4.0f, 0);
    /* the prompt cannot be set after generation started, nor hold bad ids */
    CHECK_EQ_INT(sampler_set_prompt(s, prompt, 1, err, sizeof err), CINFER_ESTATE);
    CHECK_EQ_INT(sampler_accept(s, V), CINFER_EINVAL);
    CHECK_EQ_INT(sampler_accept(s, -1), CINFER_EINVAL);
    sampler_destroy(s);

    /* the repetition window: only the last 3 of prompt + output */
    p = sampler_default_params();
    p.repetition_penalty = 2.0f;
    p.repeat_last_n = 3;
    s = mk(&p, V);
    REQUIRE(s);
    int32_t pr2[4] = {0, 1, 2, 5};
    REQUIRE(sampler_set_prompt(s, pr2, 4, err, sizeof err) == 0); /* window 1, 2, 5 */
    sampler_adjusted_logits(s, x, y);
    CHECK_NEAR(y[0], 2.0f, 0);
    CHECK_NEAR(y[1], -2.0f, 0);
    CHECK_NEAR(y[2], 1.5f, 0);
    CHECK_NEAR(y[5], 0.5f, 0);
    sampler_accept(s, 5); /* window 2, 5, 5 */
    sampler_accept(s, 7); /* window 5, 5, 7 */
    sampler_adjusted_logits(s, x, y);
    CHECK_NEAR(y[1], -1.0f, 0);
    CHECK_NEAR(y[2], 3.0f, 0);
    CHECK_NEAR(y[5], 0.5f, 0); /* twice in the window, penalised once */
    CHECK_NEAR(y[7], 2.0f, 0);
    sampler_accept(s, 0); /* window 5, 7, 0 */
    sampler_accept(s, 0); /* window 7, 0, 0 */
    sampler_adjusted_logits(s, x, y);
    CHECK_NEAR(y[5], 1.0f, 0);
    CHECK_NEAR(y[7], 2.0f, 0);
    CHECK_NEAR(y[0], 1.0f, 0);
    sampler_destroy(s);

    /* repeat_last_n 0 turns the repetition penalty off; presence/frequency are not windowed */
    p.repeat_last_n = 0;
    p.frequency_penalty = 1.0f;
    s = mk(&p, V);
    REQUIRE(s);
    REQUIRE(sampler_set_prompt(s, pr2, 4, err, sizeof err) == 0);
    for (int i = 0; i < 10; i++) sampler_accept(s, 1);
    sampler_adjusted_logits(s, x, y);
    CHECK_NEAR(y[0], 2.0f, 0);
    CHECK_NEAR(y[1], -11.0f, 1e-6);
    sampler_destroy(s);

    /* a negative presence penalty encourages (OpenAI allows [-2, 2]) */
    p = sampler_default_params();
    p.presence_penalty = -2.0f;
    s = mk(&p, V);
    REQUIRE(s);
    sampler_accept(s, 1);
    sampler_adjusted_logits(s, x, y);
    CHECK_NEAR(y[1], 1.0f, 1e-6);
    sampler_destroy(s);
}

TEST(sampler_penalty_changes_choice) {
    /* greedy would repeat token 1 forever; repetition_penalty 2 halves it below token 0 once seen */
    float x[3] = {1.5f, 2.0f, -1.0f};
    sampler_params p = sampler_default_params();
    p.temperature = 0.0f;
    p.repetition_penalty = 2.0f;
    sampler *s = mk(&p, 3);
    REQUIRE(s);
    int32_t t = sampler_sample(s, x, NULL);
    CHECK_EQ_INT(t, 1);
    sampler_accept(s, t);
    t = sampler_sample(s, x, NULL);
    CHECK_EQ_INT(t, 0);
    sampler_destroy(s);
}

TEST(sampler_logit_bias) {
    enum { V = 4 };
    float x[V] = {0.0f, 0.0f, 0.0f, 0.0f};
    sampler_bias b[2] = {{2, -100.0f}, {3, 1.0f}};
    sampler_params p = sampler_default_params();
    p.logit_bias = b;
    p.n_logit_bias = 2;
    p.seed = 11;
    sampler *s = mk(&p, V);
    REQUIRE(s);
    b[0].bias = 0.0f; /* the sampler copied the list at create */
    float y[V];
    sampler_adjusted_logits(s, x, y);
    CHECK_NEAR(y[2], -100.0f, 0);
    CHECK_NEAR(y[3], 1.0f, 0);
    double e = exp(1.0), z = 2 + e;
    double expect[V] = {1 / z, 1 / z, 0.0, e / z};
    check_freqs(s, x, V, expect, 100000, "logit_bias");
    sampler_destroy(s);
    /* greedy: banning the argmax moves the choice */
    float w[V] = {0.0f, 5.0f, 4.0f, 1.0f};
    b[0] = (sampler_bias){1, -100.0f};
    p.n_logit_bias = 1;
    p.temperature = 0.0f;
    s = mk(&p, V);
    REQUIRE(s);
    CHECK_EQ_INT(sampler_sample(s, w, NULL), 2);
    sampler_destroy(s);
}

TEST(sampler_logprobs_raw) {
    enum { V = 300 };
    float x[V];
    rng r;
    rng_seed(&r, 77);
    for (int i = 0; i < V; i++) x[i] = (float)(rng_uniform(&r) * 20.0 - 10.0);
    x[10] = x[20] = 12.0f; /* a tie at the top: lower id first */
    double m = -1e30, z = 0;
    for (int i = 0; i < V; i++) m = x[i] > m ? x[i] : m;
    for (int i = 0; i < V; i++) z += exp((double)x[i] - m);
    double lse = m + log(z);
    /* transforms must not change the reported logprobs: they are of the raw distribution */
    sampler_bias b = {20, -50.0f};
    sampler_params p = sampler_default_params();
    p.temperature = 0.7f;
    p.top_k = 5;
    p.repetition_penalty = 1.3f;
    p.logit_bias = &b;
    p.n_logit_bias = 1;
    p.logprobs = 1;
    p.top_logprobs = SAMPLER_MAX_LOGPROBS;
    sampler *s = mk(&p, V);
    REQUIRE(s);
    sampler_accept(s, 10);
    for (int step = 0; step < 20; step++) {
        sampler_result res;
        int32_t t = sampler_sample(s, x, &res);
        CHECK_EQ_INT(res.token, t);
        CHECK_NEAR(res.logprob, x[t] - lse, 1e-6);
        REQUIRE(res.n_top == SAMPLER_MAX_LOGPROBS);
        CHECK_EQ_INT(res.top[0].token, 10);
        CHECK_EQ_INT(res.top[1].token, 20);
        for (int j = 0; j < res.n_top; j++) {
            CHECK_NEAR(res.top[j].logprob, x[res.top[j].token] - lse, 1e-6);
            if (j) CHECK(res.top[j].logprob <= res.top[j - 1].logprob);
        }
        /* the top list is exactly the 20 largest logits */
        float kth = x[res.top[SAMPLER_MAX_LOGPROBS - 1].token];
        int above = 0;
        for (int i = 0; i < V; i++) above += x[i] > kth;
        CHECK(above <= SAMPLER_MAX_LOGPROBS - 1);
    }
    sampler_destroy(s);
    /* ties at the cut of the top list go to the lower ids */
    {
        float f[6] = {1.0f, 3.0f, 1.0f, 1.0f, 3.0f, 1.0f};
        sampler_params q = sampler_default_params();
        q.top_logprobs = 3;
        sampler *t = mk(&q, 6);
        REQUIRE(t);
        sampler_result rr;
        sampler_sample(t, f, &rr);
        REQUIRE(rr.n_top == 3);
        CHECK_EQ_INT(rr.top[0].token, 1);
        CHECK_EQ_INT(rr.top[1].token, 4);
        CHECK_EQ_INT(rr.top[2].token, 0);
        CHECK_NEAR(rr.top[2].logprob, 1.0 - log(2 * exp(3.0) + 4 * exp(1.0)), 1e-6);
        sampler_destroy(t);
    }
    /* off: nothing reported; top_logprobs without logprobs reports the list only */
    p.logprobs = 0;
    p.top_logprobs = 3;
    s = mk(&p, V);
    REQUIRE(s);
    sampler_result res;
    sampler_sample(s, x, &res);
    CHECK_EQ_INT(res.n_top, 3);
    CHECK(res.logprob == 0.0f);
    sampler_destroy(s);
}

TEST(sampler_no_alloc_in_step) {
    enum { V = 248320 };
    float *x = malloc(V * sizeof *x);
    rng r;
    rng_seed(&r, 1);
    for (int i = 0; i < V; i++) x[i] = (float)(rng_uniform(&r) * 8.0);
    sampler_bias b = {5, 3.0f};
    sampler_params p = sampler_default_params();
    p.top_k = 50;
    p.top_p = 0.9f;
    p.min_p = 0.02f;
    p.xtc_probability = 0.5f;
    p.repetition_penalty = 1.1f;
    p.repeat_last_n = 64;
    p.presence_penalty = 0.3f;
    p.frequency_penalty = 0.2f;
    p.logit_bias = &b;
    p.n_logit_bias = 1;
    p.logprobs = 1;
    p.top_logprobs = 5;
    sampler *s = mk(&p, V);
    REQUIRE(s);
    sampler_params q = sampler_default_params();
    q.top_p = 0.95f; /* the wide top_p path, no top_k */
    sampler *s2 = mk(&q, V);
    REQUIRE(s2);
    alloc_guard_arm(1);
    long before = alloc_count();
    alloc_guard_begin();
    for (int i = 0; i < 100; i++) {
        sampler_result res;
        int32_t t = sampler_sample(s, x, &res);
        sampler_accept(s, t);
        sampler_accept(s2, sampler_sample(s2, x, NULL));
    }
    alloc_guard_end();
    CHECK_EQ_INT(alloc_count(), before);
    alloc_guard_arm(0);
    sampler_destroy(s);
    sampler_destroy(s2);
    free(x);
}

TEST(sampler_rejects_bad_params) {
    char err[256];
    sampler *s = (sampler *)1;
    sampler_params p = sampler_default_params();
    CHECK_EQ_INT(sampler_create(&p, 0, &s, err, sizeof err), CINFER_EINVAL);
    CHECK(s == NULL);
#define BAD(stmt, needle)                                                                                    \
    do {                                                                                                     \
        p = sampler_default_params();                                                                        \
        stmt;                                                                                                \
        err[0] = 0;                                                                                          \
        CHECK_EQ_INT(sampler_create(&p, 10, &s, err, sizeof err), CINFER_EINVAL);                            \
        CHECK_STR_CONTAINS(err, needle);                                                                     \
    } while (0)
    BAD(p.temperature = -0.5f, "temperature");
    BAD(p.temperature = INFINITY, "temperature");
    BAD(p.temperature = NAN, "temperature");
    BAD(p.top_p = 0.0f, "top_p");
    BAD(p.top_p = 1.5f, "top_p");
    BAD(p.min_p = -0.1f, "min_p");
    BAD(p.xtc_probability = 2.0f, "xtc_probability");
    BAD(p.repetition_penalty = 0.0f, "repetition_penalty");
    BAD(p.repeat_last_n = -2, "repeat_last_n");
    BAD(p.presence_penalty = 2.5f, "presence_penalty");
    BAD(p.frequency_penalty = -3.0f, "frequency_penalty");
    BAD(p.top_logprobs = 21, "top_logprobs");
    sampler_bias b = {10, 1.0f};
    BAD((p.logit_bias = &b, p.n_logit_bias = 1), "outside the vocabulary");
    b = (sampler_bias){3, -101.0f};
    BAD((p.logit_bias = &b, p.n_logit_bias = 1), "[-100, 100]");
#undef BAD
    /* bounds are inclusive where the APIs say so */
    p = sampler_default_params();
    p.top_p = 1.0f;
    p.min_p = 1.0f;
    p.presence_penalty = 2.0f;
    p.frequency_penalty = -2.0f;
    p.top_logprobs = 20;
    b = (sampler_bias){9, -100.0f};
    p.logit_bias = &b;
    p.n_logit_bias = 1;
    REQUIRE(sampler_create(&p, 10, &s, err, sizeof err) == 0);
    int32_t bad_prompt[2] = {1, 10};
    CHECK_EQ_INT(sampler_set_prompt(s, bad_prompt, 2, err, sizeof err), CINFER_EINVAL);
    CHECK_STR_CONTAINS(err, "outside the vocabulary");
    sampler_destroy(s);
}

/* sampler_device_row's adjusted tokens, applied as the device applies them (NaN as -inf, + bias, the
 * repetition penalty, - sub; src/backend/cuda/sample.cu sample_adjust_kernel), give sampler_adjusted_logits
 * bit for bit at every listed token, and every token it changed is listed; the draw is the one
 * sampler_sample would make (the same generator state after); and what stays on the host is refused. */
static float dev_apply(float v, const sampler_dev_pen *q, float rep) {
    if (v != v) v = -INFINITY;
    if (q->flags & SAMPLER_DEV_BIAS) v = v + q->bias;
    if (q->flags & SAMPLER_DEV_REP) v = v > 0.0f ? v / rep : v * rep;
    if (q->flags & SAMPLER_DEV_SUB) v = v - q->sub;
    return v;
}
/* pen[0..n) against sampler_adjusted_logits y of x[V]: each listed once, dev_apply = y bit for bit, and every
 * token y changed listed */
static void check_listed(const float *x, const float *y, int V, const sampler_dev_pen *pen, int n, float rep,
                         const char *what) {
    char *listed = calloc((size_t)V, 1);
    for (int j = 0; j < n; j++) {
        int t = pen[j].token;
        if (t < 0 || t >= V) {
            CHECK_MSG(0, "%s: token %d out of range", what, t);
            continue;
        }
        CHECK_MSG(!listed[t], "%s: token %d listed twice", what, t);
        listed[t] = 1;
        float a = dev_apply(x[t], &pen[j], rep);
        CHECK_MSG(memcmp(&a, &y[t], 4) == 0, "%s, token %d: %.9g, the CPU's %.9g", what, t, (double)a, (double)y[t]);
    }
    for (int i = 0; i < V; i++) {
        float v = x[i] == x[i] ? x[i] : -INFINITY;
        if (!listed[i]) CHECK_MSG(memcmp(&v, &y[i], 4) == 0, "%s: token %d changed but not listed", what, i);
    }
    free(listed);
}
TEST(sampler_device_row_matches_chain) {
    enum { V = 1000, CAP = 64 };
    float x[V], y[V];
    for (int i = 0; i < V; i++) x[i] = (float)((i * 37) % 101) / 10.0f - 5.0f;
    x[3] = NAN;
    sampler_bias bias[] = {{7, 1.25f}, {3, 2.0f}, {999, -0.5f}, {12, 0.5f}};
    /* a window of 2: the output's 8 and 12 (12 also in logit_bias) fall outside it */
    for (int w = 0; w < 2; w++) {
        sampler_params p = sampler_default_params();
        p.temperature = 0.8f, p.top_k = 20;
        p.repetition_penalty = 1.3f, p.repeat_last_n = 2, p.presence_penalty = 0.4f, p.frequency_penalty = -0.2f;
        p.logit_bias = bias + w, p.n_logit_bias = 4 - w;
        sampler *s = mk(&p, V);
        REQUIRE(s);
        char err[128];
        int32_t prompt[] = {7, 8, 9, 8, 3, 500}, out[] = {8, 12, 12, 999, 7};
        REQUIRE(sampler_set_prompt(s, prompt, 6, err, sizeof err) == 0);
        for (int i = 0; i < 5; i++) REQUIRE(sampler_accept(s, out[i]) == 0);
        sampler_dev_row row;
        sampler_dev_pen pen[CAP];
        int n = -1;
        REQUIRE(sampler_device_row(s, 64, &row, pen, CAP, &n) == 0);
        sampler_adjusted_logits(s, x, y);
        check_listed(x, y, V, pen, n, row.repetition_penalty, "window 2");
        CHECK_EQ_INT(n, 5); /* 999, 7 (window), 8, 12 (output: 12 biased too, by a search), 3 (bias) */
        sampler_destroy(s);
    }
    sampler_params p = sampler_default_params();
    p.temperature = 0.8f, p.top_k = 20, p.top_p = 0.9f, p.min_p = 0.01f;
    p.repetition_penalty = 1.3f, p.repeat_last_n = 6, p.presence_penalty = 0.4f, p.frequency_penalty = -0.2f;
    p.logit_bias = bias, p.n_logit_bias = 3, p.seed = 42;
    sampler *s = mk(&p, V), *t = mk(&p, V);
    REQUIRE(s && t);
    char err[128];
    int32_t prompt[] = {7, 8, 9, 8, 3, 500};
    REQUIRE(sampler_set_prompt(s, prompt, 6, err, sizeof err) == 0);
    REQUIRE(sampler_set_prompt(t, prompt, 6, err, sizeof err) == 0);
    int32_t out[] = {8, 12, 12, 999, 7};
    for (int i = 0; i < 5; i++) REQUIRE(sampler_accept(s, out[i]) == 0 && sampler_accept(t, out[i]) == 0);
    CHECK(sampler_device_ok(s, 64, CAP));
    sampler_dev_row row;
    sampler_dev_pen pen[CAP];
    int n = -1;
    REQUIRE(sampler_device_row(s, 64, &row, pen, CAP, &n) == 0);
    sampler_adjusted_logits(s, x, y);
    check_listed(x, y, V, pen, n, row.repetition_penalty, "window 6");
    /* 7, 3, 999 (bias), the window 500, 8, 12, 12, 999, 7 (the last 6 of prompt + output) and the output
     * 8, 12, 999, 7: 3, 7, 8, 12, 500, 999 */
    CHECK_EQ_INT(n, 6);
    CHECK(row.temperature == 0.8f && row.top_k == 20 && row.top_p == 0.9f && row.min_p == 0.01f);
    /* the draw: the same number sampler_sample takes next from the same generator */
    sampler_result res;
    sampler_sample(t, x, &res); /* one draw (no XTC) */
    sampler_dev_row row2;
    int n2 = 0;
    REQUIRE(sampler_device_row(t, 64, &row2, pen, CAP, &n2) == 0);
    sampler_dev_row row3;
    REQUIRE(sampler_device_row(s, 64, &row3, pen, CAP, &n2) == 0);
    CHECK(row2.u == row3.u); /* s drew once (device_row), t once (sample): both at their second draw */
    CHECK(row.u >= 0.0 && row.u < 1.0 && row.u != row3.u);
    sampler_destroy(s), sampler_destroy(t);

    /* greedy: no draw; what the device does not take */
    p = sampler_default_params();
    p.temperature = 0.0f, p.logprobs = 1;
    s = mk(&p, V);
    REQUIRE(s);
    CHECK(sampler_device_ok(s, 64, CAP));
    REQUIRE(sampler_device_row(s, 64, &row, pen, CAP, &n) == 0);
    CHECK(n == 0 && row.u == 0.0 && row.logprob);
    sampler_destroy(s);
    p.repetition_penalty = 1.2f; /* a logprob with adjusted tokens (of the raw logits, on the device too) */
    s = mk(&p, V);
    REQUIRE(sampler_set_prompt(s, prompt, 6, err, sizeof err) == 0);
    CHECK(sampler_device_ok(s, 64, CAP));
    REQUIRE(sampler_device_row(s, 64, &row, pen, CAP, &n) == 0);
    CHECK(n == 5 && row.logprob);
    sampler_destroy(s);
    p.top_logprobs = 2; /* alternatives: the host */
    s = mk(&p, V);
    REQUIRE(s);
    CHECK(!sampler_device_ok(s, 64, CAP));
    CHECK_EQ_INT(sampler_device_row(s, 64, &row, pen, CAP, &n), CINFER_EINVAL);
    sampler_destroy(s);
    static const struct {
        float t;
        int k, top_logprobs;
        float xtc;
    } no[] = {{0.7f, 0, 0, 0.0f}, {0.7f, 65, 0, 0.0f}, {0.7f, V, 0, 0.0f}, {0.0f, 0, 3, 0.0f}, {0.7f, 20, 0, 0.5f}};
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
        p = sampler_default_params();
        p.temperature = no[i].t, p.top_k = no[i].k, p.top_logprobs = no[i].top_logprobs;
        p.xtc_probability = no[i].xtc;
        s = mk(&p, V);
        REQUIRE(s);
        CHECK_MSG(!sampler_device_ok(s, 64, CAP), "case %zu accepted", i);
        sampler_destroy(s);
    }
    /* more adjusted tokens than the cap; a token twice in logit_bias */
    p = sampler_default_params();
    p.temperature = 0.0f, p.repetition_penalty = 1.1f; /* greedy: top_k off is fine */
    s = mk(&p, V);
    REQUIRE(sampler_set_prompt(s, prompt, 6, err, sizeof err) == 0);
    CHECK(sampler_device_ok(s, 64, 5) && !sampler_device_ok(s, 64, 4));
    sampler_destroy(s);
    sampler_bias twice[] = {{5, 1.0f}, {5, 1.0f}};
    p = sampler_default_params();
    p.temperature = 0.0f, p.logit_bias = twice + 1, p.n_logit_bias = 1;
    s = mk(&p, V);
    REQUIRE(s);
    CHECK(sampler_device_ok(s, 64, CAP)); /* once: taken */
    sampler_destroy(s);
    p.logit_bias = twice, p.n_logit_bias = 2;
    s = mk(&p, V);
    REQUIRE(s);
    CHECK(!sampler_device_ok(s, 64, CAP));
    sampler_destroy(s);
}

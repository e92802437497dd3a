/* test_spec_features.c — issue 6's speculation checks that the exactness tests (test_engine.c, test_mtp.c,
 * test_draft_rewind.c) leave out:
 *  - the output distribution at temperature > 0 is the target's: 3 sampled tokens of 2,000 seeded requests
 *    (top_k 4: a vocabulary of four in effect) against the exact joint probabilities, by a chi-square test
 *    whose power is shown on the same draws of a wrong rule;
 *  - the draft length adapts per sequence: a request whose drafts always fail drops to one draft per step,
 *    one whose drafts always hold keeps the maximum, in the same batch;
 *  - logprobs (the token's and the top 5), the prefix cache and cancellation keep working with a draft model
 *    speculating: logprob events equal plain decode's, a resumed second round is exact, and cancelled
 *    requests give back their slots in both contexts. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cinfer.h"
#include "runtime/ctx_internal.h"
#include "runtime/engine_internal.h"
#include "fixture.h"
#include "test.h"

/* ---- the distribution at temperature 1, top_k 4 ---- */

enum { CP = 8, CK = 4, CN = 2000 };

typedef struct dist {
    int V;
    int32_t prompt[CP];
    int32_t t1[CK];     /* the top-4 ids after the prompt */
    double p1[CK];      /* their probabilities */
    int32_t t2[CK][CK]; /* after prompt + t1[a] */
    double p2[CK][CK];
    int32_t t3[CK][CK][CK]; /* after prompt + t1[a] + t2[a][b] */
    double p3[CK][CK][CK];
    int drafts, calls;
} dist;

/* top-4 ids of a row and their softmax probabilities (temperature 1): the sampler's top_k 4 */
static void top4(const float *row, int V, int32_t *ids, double *p) {
    for (int j = 0; j < CK; j++) ids[j] = -1;
    for (int v = 0; v < V; v++) {
        int j = CK;
        while (j > 0 && (ids[j - 1] < 0 || row[v] > row[ids[j - 1]])) j--;
        if (j == CK) continue;
        for (int q = CK - 1; q > j; q--) ids[q] = ids[q - 1];
        ids[j] = v;
    }
    double s = 0;
    for (int j = 0; j < CK; j++) s += p[j] = exp((double)row[ids[j]] - row[ids[0]]);
    for (int j = 0; j < CK; j++) p[j] /= s;
}

static int find(const int32_t *ids, int32_t t) {
    for (int j = 0; j < CK; j++)
        if (ids[j] == t) return j;
    return -1;
}

/* logits of prompt + extra (n_extra tokens) through a fresh sequence */
static int row_after(cinfer_ctx *c, const int32_t *prompt, const int32_t *extra, int n_extra, float *row) {
    char err[256];
    int32_t x[CP + 2];
    memcpy(x, prompt, sizeof(int32_t) * CP);
    if (n_extra) memcpy(x + CP, extra, sizeof(int32_t) * (size_t)n_extra);
    int s = cinfer_seq_open(c, err, sizeof err);
    if (s < 0) return -1;
    cinfer_batch_entry be = {s, x, CP + n_extra, 0, 0, NULL};
    int rc = cinfer_forward(c, &be, 1, row, err, sizeof err);
    cinfer_seq_close(c, s);
    return rc;
}

/* drafts: the most likely next tokens under the exact distribution (kept with probability ~0.3-0.6) */
static int dist_draft(void *ud, const int32_t *hist, int n_hist, int32_t *out, int k) {
    dist *d = ud;
    d->calls++;
    if (k < 1 || memcmp(hist, d->prompt, sizeof(int32_t) * CP)) return 0;
    int a = n_hist > CP ? find(d->t1, hist[CP]) : -1;
    if (a < 0) return 0;
    if (n_hist == CP + 1) {
        out[0] = d->t2[a][0];
        int n = 1;
        if (k > 1) out[n++] = d->t3[a][0][0];
        d->drafts += n;
        return n;
    }
    int b = n_hist == CP + 2 ? find(d->t2[a], hist[CP + 1]) : -1;
    if (b < 0) return 0;
    out[0] = d->t3[a][b][0];
    d->drafts++;
    return 1;
}

static uint64_t xs(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}
static double unif(uint64_t *s) {
    return (double)(xs(s) >> 11) * (1.0 / 9007199254740992.0);
}
static int pick(const double *p, double u) {
    double c = 0;
    for (int j = 0; j < CK - 1; j++)
        if (u < (c += p[j])) return j;
    return CK - 1;
}

/* A wrong verification rule, for the test's power: keep the draft with probability p(draft), else sample
 * from p (the draft included: the rejection rule's residual distribution forgotten). Returns the index. */
static int wrong_rule(const double *p, int draft, uint64_t *s) {
    if (unif(s) < p[draft]) return draft;
    return pick(p, unif(s));
}

/* chi-square of counts against probabilities over 64 cells, cells expected below 5 pooled; *df out */
static double chi2(const int *count, const double *prob, int n, int *df) {
    double x = 0, pe = 0;
    int po = 0, bins = 0;
    for (int c = 0; c < CK * CK * CK; c++) {
        double e = prob[c] * n;
        if (e < 5) {
            pe += e, po += count[c];
            continue;
        }
        x += (count[c] - e) * (count[c] - e) / e;
        bins++;
    }
    if (pe > 0) x += (po - pe) * (po - pe) / pe, bins++;
    *df = bins - 1;
    return x;
}

/* the chi-square quantile at 1 - 1e-3 (Wilson-Hilferty) */
static double chi2_crit(int df) {
    double z = 3.0902, a = 2.0 / (9.0 * df), b = 1 - a + z * sqrt(a);
    return df * b * b * b;
}

TEST(spec_sampling_distribution_is_the_targets) {
    cinfer_model *m = open_fixture("qwen35_dense");
    REQUIRE(m);
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    static dist d;
    memset(&d, 0, sizeof d);
    d.V = info.vocab_size;
    for (int i = 0; i < CP; i++) d.prompt[i] = (int32_t)((i * 67 + 11) % d.V);
    /* the exact distribution of (t1, t2, t3) */
    cinfer_ctx_params cp = cinfer_ctx_default_params();
    cp.max_seqs = 1, cp.max_ctx = 32, cp.max_batch = 32, cp.n_threads = 2;
    cinfer_ctx *c = NULL;
    char err[512];
    REQUIRE(cinfer_ctx_create(m, &cp, &c, err, sizeof err) == 0);
    float *row = malloc(sizeof(float) * (size_t)d.V);
    REQUIRE(row);
    REQUIRE(row_after(c, d.prompt, NULL, 0, row) == 0);
    top4(row, d.V, d.t1, d.p1);
    static double prob[CK * CK * CK];
    for (int a = 0; a < CK; a++) {
        REQUIRE(row_after(c, d.prompt, &d.t1[a], 1, row) == 0);
        top4(row, d.V, d.t2[a], d.p2[a]);
        for (int b = 0; b < CK; b++) {
            int32_t x[2] = {d.t1[a], d.t2[a][b]};
            REQUIRE(row_after(c, d.prompt, x, 2, row) == 0);
            top4(row, d.V, d.t3[a][b], d.p3[a][b]);
            for (int q = 0; q < CK; q++) prob[(a * CK + b) * CK + q] = d.p1[a] * d.p2[a][b] * d.p3[a][b][q];
        }
    }
    free(row);
    cinfer_ctx_destroy(c);
    /* CN seeded requests through the engine, the drafter proposing the likeliest continuation */
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.max_seqs = 16, ep.ctx_size = 32, ep.step_tokens = 96, ep.n_threads = 2;
    ep.queue_limit = 64;
    ep.spec = CINFER_SPEC_NGRAM, ep.spec_max_draft = 4;
    cinfer_engine *e;
    REQUIRE(cinfer_engine_create(m, &ep, &e, err, sizeof err) == 0);
    engine_set_drafter(e, dist_draft, &d);
    static int count[CK * CK * CK];
    int outside = 0;
    for (int base = 0; base < CN; base += 32) {
        cinfer_request *rq[32];
        int nb = CN - base < 32 ? CN - base : 32;
        for (int i = 0; i < nb; i++) {
            cinfer_request_params rp;
            memset(&rp, 0, sizeof rp);
            rp.prompt = d.prompt, rp.n_prompt = CP, rp.max_tokens = 3, rp.ignore_eos = 1;
            rp.sampling = cinfer_sampling_default();
            rp.sampling.temperature = 1.0f, rp.sampling.top_k = CK;
            rp.sampling.has_seed = 1, rp.sampling.seed = 1000 + (uint64_t)(base + i);
            rp.sampling.n_logprobs = 0;
            REQUIRE(cinfer_engine_submit(e, &rp, &rq[i], err, sizeof err) == 0);
        }
        for (int i = 0; i < nb; i++) {
            cinfer_event ev;
            int32_t t[3];
            int n = 0;
            while (cinfer_request_next(rq[i], &ev, 20000) == 1)
                if (ev.type == CINFER_EV_LOGPROB && n < 3) t[n++] = ev.token;
            cinfer_request_free(rq[i]);
            int a = n == 3 ? find(d.t1, t[0]) : -1, b = a >= 0 ? find(d.t2[a], t[1]) : -1,
                q = b >= 0 ? find(d.t3[a][b], t[2]) : -1;
            if (q < 0)
                outside++;
            else
                count[(a * CK + b) * CK + q]++;
        }
    }
    cinfer_engine_stats st;
    cinfer_engine_get_stats(e, &st);
    cinfer_engine_destroy(e);
    CHECK_EQ_INT(outside, 0);
    int df;
    double x = chi2(count, prob, CN, &df), crit = chi2_crit(df);
    /* the same number of draws of a wrong rule (same drafts) must fail the same test */
    static int wcount[CK * CK * CK];
    uint64_t s = 0x1234567887654321ull;
    for (int i = 0; i < CN; i++) {
        int a = pick(d.p1, unif(&s));
        int b = wrong_rule(d.p2[a], 0, &s); /* the draft: index 0, the likeliest */
        int q = b == 0 ? wrong_rule(d.p3[a][b], 0, &s) : pick(d.p3[a][b], unif(&s));
        wcount[(a * CK + b) * CK + q]++;
    }
    int wdf;
    double wx = chi2(wcount, prob, CN, &wdf);
    printf(
        "     %d draws: chi-square %.1f on %d df (critical %.1f at 1e-3); a wrong rule: %.1f; %lld of %lld "
        "drafts kept\n",
        CN, x, df, crit, wx, (long long)st.spec_accepted, (long long)st.spec_drafted);
    CHECK_MSG(x < crit, "speculative sampling is off the target's distribution: chi-square %.1f >= %.1f", x,
              crit);
    CHECK_MSG(wx > 2 * crit, "the test cannot tell a wrong rule: %.1f", wx);
    /* drafts were verified, and both kept and refused */
    CHECK(st.spec_drafted > CN / 2 && st.spec_accepted > st.spec_drafted / 5 &&
          st.spec_accepted < st.spec_drafted * 4 / 5);
    cinfer_model_close(m);
}

/* ---- the draft length adapts per sequence ---- */

typedef struct adapt {
    int32_t prompts[2][8];
    int32_t right[64]; /* request 1's plain output: its drafts always hold */
    int n_right;
    int ks[2][64], n_ks[2]; /* the k each request was asked for, step by step */
} adapt;

static int adapt_draft(void *ud, const int32_t *hist, int n_hist, int32_t *out, int k) {
    adapt *a = ud;
    for (int i = 0; i < 2; i++) {
        if (n_hist < 8 || memcmp(hist, a->prompts[i], sizeof a->prompts[i])) continue;
        if (a->n_ks[i] < 64) a->ks[i][a->n_ks[i]++] = k;
        int g = n_hist - 8, n = 0;
        for (; n < k && g + n < a->n_right; n++)
            out[n] = i == 1 ? a->right[g + n] : (hist[n_hist - 1] + 1 + n) % 256; /* request 0: wrong */
        return n;
    }
    return 0;
}

TEST(spec_draft_length_adapts_per_sequence) {
    cinfer_model *m = open_fixture("qwen35_dense");
    REQUIRE(m);
    static adapt a;
    memset(&a, 0, sizeof a);
    for (int t = 0; t < 8; t++)
        a.prompts[0][t] = (int32_t)(t * 5 + 1), a.prompts[1][t] = (int32_t)(t * 9 + 2);
    char err[512];
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.max_seqs = 2, ep.ctx_size = 64, ep.step_tokens = 64, ep.n_threads = 2;
    enum { G = 40 };
    for (int pass = 0; pass < 2; pass++) {
        ep.spec = pass ? CINFER_SPEC_NGRAM : CINFER_SPEC_NONE, ep.spec_max_draft = 4;
        setenv("CINFER_SPEC_PAD", "0", 1); /* a padded window takes as many drafts as it holds */
        cinfer_engine *e;
        REQUIRE(cinfer_engine_create(m, &ep, &e, err, sizeof err) == 0);
        unsetenv("CINFER_SPEC_PAD");
        if (pass) engine_set_drafter(e, adapt_draft, &a);
        cinfer_request *rq[2];
        for (int i = 0; i < 2; i++) {
            cinfer_request_params rp;
            memset(&rp, 0, sizeof rp);
            rp.prompt = a.prompts[i], rp.n_prompt = 8, rp.max_tokens = G, rp.ignore_eos = 1;
            rp.sampling = cinfer_sampling_default();
            rp.sampling.temperature = 0, rp.sampling.n_logprobs = 0;
            REQUIRE(cinfer_engine_submit(e, &rp, &rq[i], err, sizeof err) == 0);
        }
        int32_t out[2][G];
        int n[2] = {0, 0};
        for (int i = 0; i < 2; i++) {
            cinfer_event ev;
            while (cinfer_request_next(rq[i], &ev, 20000) == 1)
                if (ev.type == CINFER_EV_LOGPROB && n[i] < G) out[i][n[i]++] = ev.token;
            cinfer_request_free(rq[i]);
        }
        cinfer_engine_destroy(e);
        CHECK_EQ_INT(n[0], G);
        CHECK_EQ_INT(n[1], G);
        if (!pass) {
            memcpy(a.right, out[1], sizeof out[1]);
            a.n_right = G;
        } else {
            CHECK_MSG(!memcmp(a.right, out[1], sizeof out[1]), "speculation changed request 1's output");
        }
    }
    /* request 0 (drafts always wrong): 4, 3, 2, 1, then 1 for good; request 1 (always right): 4 until its
     * output budget caps the window */
    printf("     k asked, wrong drafts:");
    for (int j = 0; j < a.n_ks[0] && j < 8; j++) printf(" %d", a.ks[0][j]);
    printf("; right drafts:");
    for (int j = 0; j < a.n_ks[1] && j < 8; j++) printf(" %d", a.ks[1][j]);
    printf("\n");
    REQUIRE(a.n_ks[0] >= 6 && a.n_ks[1] >= 4);
    int off = 0;
    for (int j = 0; j < a.n_ks[0]; j++) off += a.ks[0][j] != (j < 4 ? 4 - j : 1);
    CHECK_MSG(!off, "wrong drafts: %d steps asked for other than 4, 3, 2, 1, 1, ...", off);
    for (int j = 0; j < 3; j++) CHECK_EQ_INT(a.ks[1][j], 4);
    cinfer_model_close(m);
}

/* ---- logprobs, the prefix cache and cancellation with a draft model ---- */

typedef struct lpev {
    int32_t tok[48];
    float lp[48], top_lp[48][5];
    int32_t top[48][5];
    int n;
    char finish[16];
} lpev;

static void drain_lp(cinfer_request *r, lpev *o) {
    memset(o, 0, sizeof *o);
    cinfer_event ev;
    while (cinfer_request_next(r, &ev, 20000) == 1) {
        if (ev.type == CINFER_EV_LOGPROB && o->n < 48) {
            o->tok[o->n] = ev.token, o->lp[o->n] = ev.logprob;
            for (int j = 0; j < ev.n_top && j < 5; j++)
                o->top[o->n][j] = ev.top[j].token, o->top_lp[o->n][j] = ev.top[j].logprob;
            o->n++;
        }
        if (ev.type == CINFER_EV_DONE) snprintf(o->finish, sizeof o->finish, "%s", ev.finish_reason);
    }
}

/* 8 requests (greedy and seeded at 0.7, 5 top logprobs each), twice on one engine with the prefix cache on:
 * with the target as its own draft model every token's logprob events are plain decode's, and the second
 * round, resumed from the cache (the draft model from its own), too; then requests cancelled mid-stream give
 * back every slot of both
 * contexts (with 8 sequences, later requests could not start otherwise). */
TEST(spec_draft_model_keeps_logprobs_prefix_cache_and_cancel) {
    cinfer_model *m = open_fixture("qwen35_text"), *dm = open_fixture("qwen35_text");
    REQUIRE(m && dm);
    enum { NR = 8 };
    static int32_t prompts[NR][40];
    int lens[NR], gens[NR];
    for (int i = 0; i < NR; i++) {
        lens[i] = 20 + (i * 7) % 20;
        for (int t = 0; t < lens[i]; t++) prompts[i][t] = (int32_t)((t * 31 + i * 7 + 3) % 384);
        gens[i] = 16 + i * 3;
    }
    static lpev plain[NR], spec[2][NR];
    char err[512];
    cinfer_engine_stats st;
    for (int pass = 0; pass < 2; pass++) {
        cinfer_engine_params ep = cinfer_engine_default_params();
        ep.max_seqs = NR, ep.ctx_size = 96, ep.step_tokens = 128, ep.n_threads = 2;
        ep.prefix_cache_memory = 64 << 20; /* both: the same prefill pieces (snapshot points) */
        ep.spec = pass ? CINFER_SPEC_DRAFT : CINFER_SPEC_NONE, ep.spec_max_draft = 4;
        ep.draft_model = pass ? dm : NULL;
        cinfer_engine *e;
        REQUIRE(cinfer_engine_create(m, &ep, &e, err, sizeof err) == 0);
        long long dread[2] = {0, 0};
        for (int round = 0; round < (pass ? 2 : 1); round++) {
            long long d0 = engine_draft_prompt_tokens(e);
            cinfer_request *rq[NR];
            for (int i = 0; i < NR; i++) {
                cinfer_request_params rp;
                memset(&rp, 0, sizeof rp);
                rp.prompt = prompts[i], rp.n_prompt = lens[i], rp.max_tokens = gens[i], rp.ignore_eos = 1;
                rp.sampling = cinfer_sampling_default();
                rp.sampling.temperature = i % 2 ? 0.7f : 0.0f;
                rp.sampling.has_seed = 1, rp.sampling.seed = 40 + (uint64_t)i;
                rp.sampling.n_logprobs = 5;
                REQUIRE(cinfer_engine_submit(e, &rp, &rq[i], err, sizeof err) == 0);
            }
            for (int i = 0; i < NR; i++) {
                drain_lp(rq[i], pass ? &spec[round][i] : &plain[i]);
                cinfer_request_free(rq[i]);
            }
            dread[round] = engine_draft_prompt_tokens(e) - d0;
        }
        if (pass) {
            /* the draft model resumed from its own prefix cache: one prompt token each the second time */
            int all = 0;
            for (int i = 0; i < NR; i++) all += lens[i];
            printf("     the draft model read %lld prompt tokens cold, %lld resumed\n", dread[0], dread[1]);
            CHECK_EQ_INT((int)dread[0], all);
            CHECK_EQ_INT((int)dread[1], NR);
        }
        if (pass) {
            /* cancellation: 3 waves of 8 long requests, each cancelled after its third token */
            int32_t lp[6] = {5, 6, 7, 5, 6, 7};
            for (int wave = 0; wave < 3; wave++) {
                cinfer_request *rq[NR];
                for (int i = 0; i < NR; i++) {
                    cinfer_request_params rp;
                    memset(&rp, 0, sizeof rp);
                    rp.prompt = lp, rp.n_prompt = 6, rp.max_tokens = 80, rp.ignore_eos = 1;
                    rp.sampling = cinfer_sampling_default();
                    rp.sampling.temperature = 0, rp.sampling.n_logprobs = 0;
                    REQUIRE(cinfer_engine_submit(e, &rp, &rq[i], err, sizeof err) == 0);
                }
                for (int i = 0; i < NR; i++) {
                    cinfer_event ev;
                    int got = 0;
                    while (got < 3 && cinfer_request_next(rq[i], &ev, 20000) == 1)
                        got += ev.type == CINFER_EV_LOGPROB;
                    cinfer_request_cancel(rq[i]);
                    lpev o;
                    drain_lp(rq[i], &o);
                    CHECK_MSG(got == 3 && (!strcmp(o.finish, "cancelled") || !strcmp(o.finish, "length")),
                              "wave %d request %d: %d tokens, finish %s", wave, i, got, o.finish);
                    cinfer_request_free(rq[i]);
                }
            }
            for (int i = 0; i < 200; i++) {
                cinfer_engine_get_stats(e, &st);
                if (!st.running && !st.waiting) break;
                struct timespec ts = {0, 10 * 1000 * 1000};
                nanosleep(&ts, NULL);
            }
            CHECK_EQ_INT(st.running, 0);
            CHECK_EQ_INT(st.slots_used, 0);
            CHECK_EQ_INT(st.kv_blocks_used, 0);
            CHECK_EQ_INT(engine_draft_slots_used(e), 0);
            CHECK(st.prefix_hits >= NR);
            CHECK(st.spec_accepted > 0);
        }
        cinfer_engine_destroy(e);
    }
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < NR; i++) {
            const lpev *a = &plain[i], *b = &spec[round][i];
            for (int t = 0; t < gens[i]; t++)
                if (a->tok[t] != b->tok[t] || a->lp[t] != b->lp[t] ||
                    memcmp(a->top[t], b->top[t], sizeof a->top[t]) ||
                    memcmp(a->top_lp[t], b->top_lp[t], sizeof a->top_lp[t])) {
                    printf("     round %d request %d: token %d: %d %.9g [%d %.9g] vs %d %.9g [%d %.9g]\n",
                           round, i, t, a->tok[t], a->lp[t], a->top[t][1], a->top_lp[t][1], b->tok[t],
                           b->lp[t], b->top[t][1], b->top_lp[t][1]);
                    break;
                }
            CHECK_EQ_INT(b->n, gens[i]);
            CHECK_MSG(!memcmp(a->tok, b->tok, sizeof a->tok) && !memcmp(a->lp, b->lp, sizeof a->lp) &&
                          !memcmp(a->top, b->top, sizeof a->top) &&
                          !memcmp(a->top_lp, b->top_lp, sizeof a->top_lp),
                      "round %d request %d (temp %.1f): logprob events differ from plain decode", round, i,
                      i % 2 ? 0.7 : 0.0);
        }
    printf("     %lld of %lld drafts kept; %lld prefix hits\n", (long long)st.spec_accepted,
           (long long)st.spec_drafted, (long long)st.prefix_hits);
    cinfer_model_close(dm);
    cinfer_model_close(m);
}

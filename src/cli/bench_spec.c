/* bench_spec.c — `cinfer bench -m DIR --spec-accept A [--spec mtp] [--spec-draft K] [--batch B] [-p P] [-n
 * N]`: what speculative decoding buys at a given acceptance rate, independent of any drafter's quality. B
 * requests (random prompts of P tokens, or --prompt TEXT; greedy, N output tokens each) run once without
 * speculation, recording their outputs; then again with a forced-acceptance drafter that proposes K tokens
 * per step, each one the true next token with probability A (so a run of j accepted drafts has probability
 * A^j (1-A)), verified in the batch as usual. The outputs must match (checked); the ratio of decode
 * throughputs is the speedup. A = 1 is the self-draft bound (perfect drafts, no drafting cost). With --spec
 * mtp the MTP head still runs every step (its cost is in the figure) and the forced drafter replaces its
 * tokens; without --spec-accept the drafter's own drafts are verified: the measured acceptance and speedup of
 * the MTP head (or n-gram lookup). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cinfer.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "runtime/ctx_internal.h"
#include "model/forward_cuda.h"
#include "runtime/engine_internal.h"
#include "sample/sample.h"

typedef struct oracle {
    int n, P;
    int32_t *prompts; /* [n][P] */
    int32_t *outs;    /* [n][N] */
    int N;
    double accept;
    rng r;
    int V; /* a wrong draft stays inside the vocabulary */
} oracle;

static int forced_draft(void *ud, const int32_t *hist, int n_hist, int32_t *out, int k) {
    oracle *o = ud;
    for (int i = 0; i < o->n; i++) {
        if (n_hist < o->P || memcmp(hist, o->prompts + (size_t)i * o->P, sizeof(int32_t) * (size_t)o->P))
            continue;
        int g = n_hist - o->P, cnt = 0;
        while (cnt < k && g + cnt < o->N) {
            int32_t t = o->outs[(size_t)i * o->N + g + cnt];
            out[cnt++] = rng_uniform(&o->r) < o->accept ? t : (t + 1) % (o->V < 4096 ? o->V : 4096);
        }
        return cnt;
    }
    return 0;
}

static double median(const double *x, int n) {
    double t[64];
    memcpy(t, x, sizeof(double) * (size_t)n);
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            double u = t[j];
            t[j] = t[j - 1], t[j - 1] = u;
        }
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Runs the batch; returns decode tokens/s (from the first to the last token event over all requests). */
/* Runs the batch; returns decode tokens/s (from the first to the last token event over all requests) and in
 * *e2e the tokens/s from submission to the last event (prefill included: on a model so small that a whole
 * generation ends before the reader wakes, the event times say nothing and this is the figure). */
static double run(cinfer_model *m, const cinfer_engine_params *ep, oracle *o, int record, int *mismatch,
                  cinfer_engine_stats *st, double *e2e) {
    char err[1024];
    cinfer_engine *e;
    if (cinfer_engine_create(m, ep, &e, err, sizeof err)) {
        fprintf(stderr, "cinfer bench: %s\n", err);
        return -1;
    }
    if (!record && o->accept >= 0) engine_set_drafter(e, forced_draft, o);
    cinfer_request **rq = calloc((size_t)o->n, sizeof *rq);
    double t0 = now_s();
    for (int i = 0; i < o->n; i++) {
        cinfer_request_params rp;
        memset(&rp, 0, sizeof rp);
        rp.prompt = o->prompts + (size_t)i * o->P;
        rp.n_prompt = o->P;
        rp.max_tokens = o->N;
        rp.sampling = cinfer_sampling_default();
        rp.sampling.temperature = 0;
        rp.sampling.n_logprobs = 0;
        rp.ignore_eos = 1;
        if (cinfer_engine_submit(e, &rp, &rq[i], err, sizeof err)) fprintf(stderr, "cinfer bench: %s\n", err);
    }
    /* requests finish in lockstep-ish order; read them one after another */
    double first = 0, last = 0;
    long toks = 0;
    for (int i = 0; i < o->n; i++) {
        cinfer_event ev;
        int g = 0;
        while (rq[i] && cinfer_request_next(rq[i], &ev, -1) == 1) {
            if (ev.type != CINFER_EV_LOGPROB) continue;
            double t = now_s();
            if (!first || t < first) first = t;
            if (t > last) last = t;
            if (g < o->N) {
                int32_t *slot = o->outs + (size_t)i * o->N + g;
                if (record)
                    *slot = ev.token;
                else if (*slot != ev.token)
                    (*mismatch)++;
            }
            g++;
            toks++;
        }
        cinfer_request_free(rq[i]);
    }
    cinfer_engine_get_stats(e, st);
    cinfer_engine_destroy(e);
    free(rq);
    *e2e = (double)toks / (now_s() - t0);
    return last > first ? (double)(toks - o->n) / (last - first) : 0;
}

/* What one round is made of, each timed alone through the context API as the engine calls it (on cuda the
 * tokens chosen on the device, only ids back), the fastest of 10 (contention on a shared machine only slows a
 * run down): a plain decode step of B sequences (one row each, advancing: the decode graphs serve it as in
 * the engine), a verify round of B other sequences — a window of K+1 rows each, then the commit of 1 + K/2 of
 * them, so the rollback replays real tokens — and one MTP head row with its logits over the draft vocabulary.
 * The round's time runs until the device is done with the commits, or, when commits are deferred into the
 * slot's next step (CINFER_CUDA_SPEC_FUSE=1), includes the previous round's replays. On cuda the same two
 * steps then run profiled (eager, an event between phases) and each phase's device time is printed for both.
 * ms via *dec, *ver, *head; 0 on failure. */
static void step_costs(cinfer_model *m, int P, int K, int B, int mv, int with_head, double *dec, double *ver,
                       double *head) {
    enum { IT = 12, PROF = 3 };
    char err[512] = "";
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    int n = P + (IT + PROF + 2) * (K + 2) + 4, W = K + 1; /* positions a sequence may reach */
    cinfer_ctx_params cp = cinfer_ctx_default_params();
    cp.max_seqs = 2 * B;
    cp.max_ctx = n;
    cp.max_batch = (P > B * W ? P : B * W) + 4;
    cp.spec_window = W;
    *dec = *ver = *head = 0;
    cinfer_ctx *c;
    if (cinfer_ctx_create(m, &cp, &c, err, sizeof err)) {
        fprintf(stderr, "cinfer bench: step costs: %s\n", err);
        return;
    }
    int cuda = cinfer_ctx_device(c) == CINFER_DEVICE_CUDA;
    size_t rows = (size_t)(P > B * W ? P : B * W);
    float *lg = malloc(sizeof(float) * rows * info.vocab_size);
    float *hid = malloc(sizeof(float) * (size_t)P * info.hidden_size);
    int32_t *x = malloc(sizeof(int32_t) * (size_t)n), *ids = malloc(sizeof(int32_t) * rows);
    int *seq = malloc(sizeof(int) * 2 * (size_t)B), *len = malloc(sizeof(int) * 2 * (size_t)B);
    cinfer_batch_entry *be = malloc(sizeof *be * (size_t)B);
    cuda_sample *smp = malloc(sizeof *smp * rows);
    for (size_t i = 0; i < rows; i++) smp[i] = (cuda_sample){0.0f, 0, 0.0, 0};
    for (int i = 0; i < n; i++)
        x[i] = (int32_t)((i * 7919 + 13) % (info.vocab_size < 4096 ? info.vocab_size : 4096));
    int rc = 0, keep = 1 + K / 2;
    for (int i = 0; i < 2 * B && !rc; i++) { /* [0, B): decode sequences, [B, 2B): verify sequences */
        seq[i] = cinfer_seq_open(c, err, sizeof err);
        len[i] = P;
        cinfer_batch_entry pre = {seq[i], x, P, i == 0, 0, i == 0 ? hid : NULL};
        rc = seq[i] < 0 || cinfer_forward(c, &pre, 1, lg, err, sizeof err);
    }
    if (rc || (with_head && ctx_mtp_init(c, mv, err, sizeof err))) goto out;
    ctx_mtp_entry mp = {seq[0], 0, x + 1, hid, P - 1, hid, 1};
    if (with_head && ctx_mtp_forward(c, &mp, 1, lg, err, sizeof err)) goto out;
    double best[3] = {1e9, 1e9, 1e9}, pms[2][CP_N], first[2][2] = {{0}}; /* [decode, verify][round 0, 1] */
    for (int it = 0; it < IT + PROF && !rc; it++) {
        int prof = it >= IT;
        double t[4];
        for (int v = 0; v < 2 && !rc; v++) { /* v 0: the decode step, 1: the verify round */
            for (int i = 0; i < B; i++) {
                int q = v * B + i;
                be[i] = (cinfer_batch_entry){seq[q], x + len[q], v ? W : 1, v, v, NULL};
            }
            if (prof && cuda) ctx_profile(c, 1, NULL, NULL);
            t[v] = now_s();
            rc = cuda ? ctx_forward_sample(c, be, B, smp, ids, NULL, err, sizeof err)
                      : cinfer_forward(c, be, B, lg, err, sizeof err);
            for (int i = 0; v && i < B && !rc; i++)
                rc = cinfer_seq_commit(c, seq[B + i], keep, err, sizeof err);
            rc = rc || ctx_sync(c, err, sizeof err);
            t[v + 2] = now_s();
            if (prof && cuda) {
                double ms[CP_N];
                int calls;
                ctx_profile(c, 0, ms, &calls);
                for (int p = 0; p < CP_N; p++) pms[v][p] = it == IT ? ms[p] : pms[v][p] + ms[p];
            }
            for (int i = 0; i < B; i++) len[v * B + i] += v ? keep : 1;
        }
        double t3 = now_s();
        ctx_mtp_entry h = {seq[0], P - 1, x + P, hid, 1, NULL, 1};
        rc = rc || (with_head && ctx_mtp_forward(c, &h, 1, lg, err, sizeof err));
        double t4 = now_s();
        /* the first rounds capture graphs (and the first has no replay before it); profiled rounds run
         * eagerly */
        if (it < 2) first[0][it] = t[2] - t[0], first[1][it] = t[3] - t[1];
        if (it < 2 || prof) continue;
        best[0] = t[2] - t[0] < best[0] ? t[2] - t[0] : best[0];
        best[1] = t[3] - t[1] < best[1] ? t[3] - t[1] : best[1];
        best[2] = t4 - t3 < best[2] ? t4 - t3 : best[2];
    }
    if (rc) goto out;
    *dec = best[0] * 1e3, *ver = best[1] * 1e3, *head = best[2] * 1e3;
    /* on cuda the first rounds are where graphs are made (a decode shape is captured at its first step, a
     * verify shape at its second): what a short run pays once per shape */
    int gc, gu;
    ctx_graph_stats(c, &gc, &gu);
    printf("first rounds     decode %.2f, %.2f ms; verify %.2f, %.2f ms (then %.2f / %.2f); %d graphs "
           "instantiated, "
           "%d updated in place\n",
           first[0][0] * 1e3, first[0][1] * 1e3, first[1][0] * 1e3, first[1][1] * 1e3, *dec, *ver, gc, gu);
    if (cuda) {
        printf("step phases      device ms per step, profiled (eager): decode %d x 1 row | verify %d x %d "
               "rows\n",
               B, B, W);
        for (int p = 0; p < CP_N; p++)
            printf("  %-16s %7.3f | %7.3f\n", cuda_phase_names[p], pms[0][p] / PROF, pms[1][p] / PROF);
    }
out:
    if (rc) fprintf(stderr, "cinfer bench: step costs: %s\n", err);
    free(lg), free(hid), free(x), free(ids), free(seq), free(len), free(be), free(smp);
    cinfer_ctx_destroy(c);
}

int bench_spec(int argc, char **argv, const char *dir, double accept, int mode) {
    long K = 3, B = 1, P = 32, N = 64, nthreads = 0, R = 1, mv = 0;
    const char *v;
    if ((v = arg_value(argc, argv, "--repeat", NULL)) && parse_int(v, "--repeat", 1, 64, &R)) return 2;
    if ((v = arg_value(argc, argv, "--spec-mtp-vocab", NULL)) &&
        parse_int(v, "--spec-mtp-vocab", 0, 1 << 30, &mv))
        return 2;
    if ((v = arg_value(argc, argv, "--spec-draft", NULL)) && parse_int(v, "--spec-draft", 1, 16, &K))
        return 2;
    if ((v = arg_value(argc, argv, "--batch", NULL)) && parse_int(v, "--batch", 1, 256, &B)) return 2;
    if ((v = arg_value(argc, argv, "-p", NULL)) && parse_int(v, "-p", 1, 1 << 16, &P)) return 2;
    if ((v = arg_value(argc, argv, "-n", NULL)) && parse_int(v, "-n", 2, 1 << 16, &N)) return 2;
    if ((v = arg_value(argc, argv, "--threads", NULL)) && parse_int(v, "--threads", 0, 1024, &nthreads))
        return 2;
    char err[1024];
    cinfer_model *m;
    if (cinfer_model_open(dir, &m, err, sizeof err)) {
        fprintf(stderr, "cinfer bench: %s\n", err);
        return 1;
    }
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    oracle o = {(int)B,
                (int)P,
                malloc(sizeof(int32_t) * (size_t)(B * P)),
                malloc(sizeof(int32_t) * (size_t)(B * N)),
                (int)N,
                accept,
                {{0}}};
    o.V = info.vocab_size;
    rng_seed(&o.r, 12345);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (long i = 0; i < B * P; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        o.prompts[i] = (int32_t)(x % (uint64_t)(info.vocab_size < 4096 ? info.vocab_size : 4096));
    }
    const char *text = arg_value(argc, argv, "--prompt", NULL);
    if (text) { /* every request gets the text's tokens (raw, no chat template) */
        int32_t *ids;
        int n;
        if (cinfer_tokenize(m, text, strlen(text), 0, &ids, &n, err, sizeof err) || n < 1) {
            fprintf(stderr, "cinfer bench: --prompt: %s\n", n < 1 ? "no tokens" : err);
            free(o.prompts), free(o.outs);
            cinfer_model_close(m);
            return 1;
        }
        P = o.P = n;
        free(o.prompts);
        o.prompts = malloc(sizeof(int32_t) * (size_t)(B * P));
        for (long i = 0; i < B; i++) memcpy(o.prompts + i * P, ids, sizeof(int32_t) * (size_t)P);
        free(ids);
    }
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.max_seqs = (int)B;
    ep.ctx_size = (int)(P + N + K + 2);
    ep.step_tokens = (int)(B * (K + 1) > P ? B * (K + 1) : P);
    ep.n_threads = (int)nthreads;
    cinfer_engine_stats s0, s1;
    int mismatch = 0;
    setvbuf(stdout, NULL, _IOLBF, 0); /* rows survive a run stopped by a time limit */
    cinfer_engine_params sp = ep;
    sp.spec =
        (cinfer_spec_mode)mode; /* with --spec-accept the forced drafter replaces the drafter's tokens */
    sp.spec_mtp_vocab = (int)mv;
    sp.spec_max_draft = (int)K;
    cinfer_model *dm = NULL; /* --draft-model; without it the target drafts for itself */
    const char *dd = arg_value(argc, argv, "--draft-model", NULL);
    if (mode == CINFER_SPEC_DRAFT) {
        /* with --spec-accept the draft model still runs its steps (their cost is in the figure), reading the
         * forced drafts in place of its own: the speedup a draft model of this size would give at acceptance A */
        if (dd && cinfer_model_open(dd, &dm, err, sizeof err)) {
            fprintf(stderr, "cinfer bench: --draft-model: %s\n", err);
            free(o.prompts), free(o.outs);
            cinfer_model_close(m);
            return 1;
        }
        sp.draft_model = dm ? dm : m;
    }
    /* R (plain, speculative) pairs back to back, the median of each and of the pairs' ratios: on a shared
     * machine the load drifts between runs, less within a pair */
    double pl[64], spv[64], ratio[64], epl[64], esp[64], eratio[64];
    for (long i = 0; i < R; i++) {
        pl[i] = run(m, &ep, &o, i == 0, &mismatch, &s0, &epl[i]);
        rng_seed(&o.r, 12345); /* every repetition verifies the same drafts */
        spv[i] = pl[i] < 0 ? -1 : run(m, &sp, &o, 0, &mismatch, &s1, &esp[i]);
        if (pl[i] < 0 ||
            spv[i] < 0) { /* an engine could not be made (message printed): no figures to report */
            free(o.prompts);
            free(o.outs);
            if (dm) cinfer_model_close(dm);
            cinfer_model_close(m);
            return 1;
        }
        ratio[i] = pl[i] > 0 ? spv[i] / pl[i] : 0;
        eratio[i] = epl[i] > 0 ? esp[i] / epl[i] : 0;
        /* each pair as it finishes: a run stopped by a time limit still says something */
        printf("pair %ld           plain %.2f, speculative %.2f tok/s decode: %.2fx (acceptance %.3f)\n",
               i + 1, pl[i], spv[i], ratio[i],
               s1.spec_drafted ? (double)s1.spec_accepted / (double)s1.spec_drafted : 0);
    }
    double plain = median(pl, (int)R), spec = median(spv, (int)R), speedup = median(ratio, (int)R);
    double acc = s1.spec_drafted ? (double)s1.spec_accepted / (double)s1.spec_drafted : 0;
    printf("model            %s (%s)\n", dir, info.arch);
    if (accept >= 0)
        printf("batch %ld, prompt %ld, %ld tokens each, drafts <= %ld, %s, forced acceptance %.2f\n", B, P, N,
               K,
               mode == CINFER_SPEC_MTP     ? "MTP head running"
               : mode == CINFER_SPEC_DRAFT ? (dm ? "draft model running" : "self-draft running")
                                           : "no drafter",
               accept);
    else
        printf("batch %ld, prompt %ld, %ld tokens each, drafts <= %ld, %s drafts\n", B, P, N, K,
               mode == CINFER_SPEC_MTP     ? "MTP"
               : mode == CINFER_SPEC_DRAFT ? (dm ? "draft-model" : "self-draft (draft model = target)")
                                           : "n-gram");
    if (mode == CINFER_SPEC_MTP) {
        double dec, ver, head;
        step_costs(m, (int)P, (int)K, 1, (int)mv, 1, &dec, &ver, &head);
        printf("step costs       decode %.2f ms, verify %ld rows + rollback of %ld %.2f ms, MTP head row "
               "%.2f ms (ids [0, %d)); fastest of 10\n",
               dec, K + 1, 1 + K / 2, ver, head, mv > 0 && mv < info.vocab_size ? (int)mv : info.vocab_size);
    } else if (arg_flag(argc, argv, "--step-costs")) { /* one verify + rollback round against a decode step */
        double dec, ver, head;
        step_costs(m, (int)P, (int)K, (int)B, 0, 0, &dec, &ver, &head);
        printf("step costs       batch %ld: decode %.2f ms, verify %ld rows + rollback of %ld %.2f ms (%.2fx "
               "a decode "
               "step); fastest of 10\n",
               B, dec, K + 1, 1 + K / 2, ver, dec > 0 ? ver / dec : 0);
    }
    printf("plain            %.2f tok/s decode (%lld steps)\n", plain, (long long)s0.steps_total);
    printf(
        "speculative      %.2f tok/s decode (%lld steps), measured acceptance %.3f (%lld of %lld drafts)\n",
        spec, (long long)s1.steps_total, acc, (long long)s1.spec_accepted, (long long)s1.spec_drafted);
    if (R > 1) {
        printf("pairs            ");
        for (long i = 0; i < R; i++) printf("%s%.2f/%.2f", i ? ", " : "", spv[i], pl[i]);
        printf(" tok/s (speculative/plain)\n");
        double bp = 0,
               bs = 0; /* load only slows a run down: the fastest of each approaches the quiet machine */
        for (long i = 0; i < R; i++) bp = pl[i] > bp ? pl[i] : bp, bs = spv[i] > bs ? spv[i] : bs;
        printf("fastest          plain %.2f, speculative %.2f tok/s: %.2fx\n", bp, bs, bp > 0 ? bs / bp : 0);
    }
    printf("speedup          %.2fx   (%s; outputs %s)\n", speedup,
           R > 1 ? "median of the pairs' ratios" : "one pair", mismatch ? "DIFFER" : "identical");
    printf("end to end       plain %.2f, speculative %.2f tok/s (submit to last event, prefill included): "
           "%.2fx\n",
           median(epl, (int)R), median(esp, (int)R), median(eratio, (int)R));
    free(o.prompts);
    free(o.outs);
    if (dm) cinfer_model_close(dm);
    cinfer_model_close(m);
    return mismatch ? 1 : 0;
}

/* bench.c — `cinfer bench -m DIR [-p 512] [-n 32] [--threads N]`: prefill and decode speed of one
 * sequence on random token ids, next to the machine's memory read bandwidth measured in the same run, so
 * every figure comes with its fraction of the roofline: decode streams bytes_per_token of weights per
 * token (bandwidth-bound), prefill runs 2 FLOPs per weight per token (compute-bound). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cinfer.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "util/membw.h"
#include "util/threadpool.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* the sparse checkpoint --like made (no disk blocks, but a directory in /tmp per run) */
static void like_cleanup(const char *dir) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "cinfer bench: could not remove %s\n", dir);
}

int cli_bench(int argc, char **argv) {
    static const char *const vf[] = {"-m", "--model", "-p", "-n", "--threads", "--spec-accept", "--spec-draft", "--batch", "--prefix-turn",
                                     "--turn-new", "--spec", "--prompt", "--spec-mtp-vocab", "--repeat", "--like", "--layers", "--draft-model", NULL};
    static const char *const bf[] = {"--help", "-h", "--step-costs", NULL};
    /* rows go out as they are measured: a bench killed by a time limit (stdout to a pipe is otherwise block
     * buffered) keeps every row it finished */
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *like = arg_value(argc, argv, "--like", NULL);
    int engine_mode = arg_value(argc, argv, "--spec-accept", NULL) || arg_value(argc, argv, "--spec", NULL) ||
                      arg_value(argc, argv, "--prefix-turn", NULL);
    if (like && !engine_mode && !arg_flag(argc, argv, "--help")) return bench_cuda(argc, argv);
    if (arg_flag(argc, argv, "--help") || arg_flag(argc, argv, "-h")) {
        printf("usage: cinfer bench -m DIR [-p PROMPT_TOKENS=512] [-n DECODE_TOKENS=32] [--threads N]\n"
               "       cinfer bench --like SHAPE --device cuda [--batches 1,8,32,64] [--prefill 512,4096,32768] [-n 32]\n"
               "         [--ctx 512] [--chunk 4096] [--no-profile] [--logits device|pinned|pageable]: a real model's shapes\n"
               "         with random weights made on the GPU (--logits: where decode logits go; device (default) = greedy ids\n"
               "         chosen on the GPU, the engine's decode step; pinned / pageable = every logit copied to the host;\n"
               "         --batches 0 / --prefill 0: that part skipped)\n"
               "       cinfer bench -m DIR --spec-accept A [--spec-draft K=3] [--batch B=1] [-p 32] [-n 64]\n"
               "         speculative decoding at a forced acceptance rate A, against the same batch without it\n"
               "       cinfer bench -m DIR --spec mtp|ngram [--spec-accept A] [--spec-draft K=3] [--batch B=1] [--prompt TEXT]\n"
               "         [--spec-mtp-vocab N] [--repeat R]  (R plain/speculative pairs: medians)\n"
               "         the drafter's own acceptance and speedup (with --spec-accept: its cost, forced acceptance);\n"
               "         --step-costs: also one verify + rollback round of B windows against a decode step of B rows,\n"
               "         each timed alone (on cuda with a per-phase device breakdown of both)\n"
               "       cinfer bench -m DIR --spec draft [--draft-model DIR2] [--spec-accept A] [--spec-draft K=3] [--batch B=1] [--repeat R]\n"
               "         a draft model's acceptance and speedup; without --draft-model the target drafts for itself\n"
               "         (self-draft: every greedy draft holds, each costs a full decode step of the target); with\n"
               "         --spec-accept the draft model's steps run, reading forced drafts in place of its own\n"
               "       cinfer bench -m DIR --prefix-turn P [--turn-new N=64]\n"
               "         second-turn time to first token from the prefix cache against cold\n"
               "       cinfer bench --like SHAPE [--layers N] --device cuda --spec-accept A ... | --prefix-turn P ...\n"
               "         the last two on a real model's shape, weights made on the GPU (CINFER_CUDA_RANDOM_WEIGHTS=1)\n");
        return 0;
    }
    if (arg_check(argc, argv, vf, bf, "bench")) return 2;
    const char *dir = arg_value(argc, argv, "-m", "--model"), *v;
    char like_dir[] = "/tmp/cinfer-like-XXXXXX";
    if (like && !dir) {
        /* --like SHAPE [--layers N] with --spec-accept / --prefix-turn: the engine benches on a real model's shape,
         * a sparse checkpoint whose matrices the cuda backend fills with noise on the device (no disk, no upload) */
        if (!mkdtemp(like_dir)) {
            perror("cinfer bench: mkdtemp");
            return 1;
        }
        const char *layers = arg_value(argc, argv, "--layers", NULL);
        char *sargv[] = {"synth", "--like", (char *)like, "--out", like_dir, "--sparse", layers ? "--layers" : NULL, (char *)layers, NULL};
        if (cli_synth(layers ? 8 : 6, sargv)) return 1;
        setenv("CINFER_CUDA_RANDOM_WEIGHTS", "1", 1);
        dir = like_dir;
    }
    if (!dir) {
        fprintf(stderr, "cinfer bench: -m DIR is required\n");
        return 2;
    }
    const char *sv = arg_value(argc, argv, "--spec", NULL);
    int mode = CINFER_SPEC_NGRAM;
    if (sv && !strcmp(sv, "mtp")) mode = CINFER_SPEC_MTP;
    else if (sv && !strcmp(sv, "draft")) mode = CINFER_SPEC_DRAFT;
    else if (sv && strcmp(sv, "ngram")) {
        fprintf(stderr, "cinfer bench: --spec must be mtp, ngram or draft\n");
        return 2;
    }
    if ((v = arg_value(argc, argv, "--spec-accept", NULL)) || sv) {
        double a = -1;
        if (v && (parse_float(v, "--spec-accept", &a) || a < 0 || a > 1)) {
            fprintf(stderr, "cinfer bench: --spec-accept must be in [0, 1]\n");
            return 2;
        }
        int rc = bench_spec(argc, argv, dir, a, mode);
        if (dir == like_dir) like_cleanup(like_dir);
        return rc;
    }
    if ((v = arg_value(argc, argv, "--prefix-turn", NULL))) {
        long pt;
        if (parse_int(v, "--prefix-turn", 2, 1 << 22, &pt)) return 2;
        int rc = bench_prefix(argc, argv, dir, (int)pt);
        if (dir == like_dir) like_cleanup(like_dir);
        return rc;
    }
    long P = 512, N = 32, nthreads = 0;
    if ((v = arg_value(argc, argv, "-p", NULL)) && parse_int(v, "-p", 1, 1 << 20, &P)) return 2;
    if ((v = arg_value(argc, argv, "-n", NULL)) && parse_int(v, "-n", 1, 1 << 20, &N)) return 2;
    if ((v = arg_value(argc, argv, "--threads", NULL)) && parse_int(v, "--threads", 0, 1024, &nthreads)) return 2;
    char err[1024];
    cinfer_model *m = NULL;
    cinfer_ctx *c = NULL;
    int32_t *toks = NULL;
    float *logits = NULL;
    int rc = 1;
    if (cinfer_model_open(dir, &m, err, sizeof err)) {
        fprintf(stderr, "cinfer bench: %s\n", err);
        goto done;
    }
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    cinfer_ctx_params p = cinfer_ctx_default_params();
    p.max_seqs = 1;
    p.max_ctx = (int)(P + N + 1);
    p.max_batch = P < 512 ? (int)P : 512;
    p.n_threads = (int)nthreads;
    if (cinfer_ctx_create(m, &p, &c, err, sizeof err)) {
        fprintf(stderr, "cinfer bench: %s\n", err);
        goto done;
    }
    threadpool *tp = tp_create((int)nthreads);
    int nth = tp_size(tp);
    double bw = membw_measure(tp, 1ull << 30, 5);
    tp_destroy(tp);
    toks = malloc((size_t)(P + N) * sizeof *toks);
    logits = malloc((size_t)info.vocab_size * sizeof(float));
    if (!toks || !logits) goto done;
    uint64_t x = 88172645463325252ull;
    for (long i = 0; i < P + N; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        toks[i] = (int32_t)(x % (uint64_t)info.vocab_size);
    }
    int seq = cinfer_seq_open(c, err, sizeof err);
    if (seq < 0) goto done;
    double t0 = now_s();
    for (long off = 0; off < P; off += p.max_batch) {
        int cnt = (int)(P - off < p.max_batch ? P - off : p.max_batch);
        cinfer_batch_entry e = {seq, toks + off, cnt, 0};
        if (cinfer_forward(c, &e, 1, logits, err, sizeof err)) {
            fprintf(stderr, "cinfer bench: %s\n", err);
            goto done;
        }
    }
    double tp_s = now_s() - t0;
    t0 = now_s();
    for (long i = 0; i < N; i++) {
        cinfer_batch_entry e = {seq, toks + P + i, 1, 0};
        if (cinfer_forward(c, &e, 1, logits, err, sizeof err)) {
            fprintf(stderr, "cinfer bench: %s\n", err);
            goto done;
        }
    }
    double td_s = now_s() - t0;
    double pf_tps = P / tp_s, dec_tps = N / td_s;
    double gbs = info.bytes_per_token * dec_tps / 1e9;
    /* prefill FLOPs: 2 per active weight element per token (bytes_per_token / 2 bf16 elements) */
    double gflops = 2.0 * (info.bytes_per_token / 2.0) * pf_tps / 1e9;
    printf("model            %s (%s, %d layers, %.2f GB decode bytes/token)\n", dir, info.arch, info.n_layers,
           info.bytes_per_token / 1e9);
    printf("threads          %d\n", nth);
    printf("device           %s, precision %s\n", cinfer_ctx_device(c) == CINFER_DEVICE_CUDA ? "cuda" : "cpu",
           cinfer_precision_name(cinfer_ctx_precision(c)));
    printf("memory read      %.1f GB/s (1 GiB buffer, best of 5)\n", bw);
    printf("prefill          %ld tokens: %.1f tok/s, %.1f GFLOP/s in matmuls\n", P, pf_tps, gflops);
    printf("decode           %ld tokens: %.2f tok/s, %.1f GB/s of weights = %.0f%% of measured bandwidth "
           "(roofline %.2f tok/s)\n",
           N, dec_tps, gbs, bw > 0 ? 100.0 * gbs / bw : 0.0, bw * 1e9 / info.bytes_per_token);
    rc = 0;
done:
    free(toks);
    free(logits);
    cinfer_ctx_destroy(c);
    cinfer_model_close(m);
    return rc;
}

/* bench_cuda.c — `cinfer bench --like SHAPE --device cuda`: a real model's shapes with random weights made
 * directly in GPU memory (the checkpoint is a sparse file: config and tensor table only, never read for
 * matrices), then decode tok/s at several batch sizes and prefill tok/s at several prompt lengths, each
 * next to the roofline measured in the same run (device copy bandwidth, cuBLAS bf16 GEMM rate), and the
 * per-phase device time of one decode step and one prefill chunk. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cinfer.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "model/forward_cuda.h"
#include "runtime/ctx_internal.h"

#ifdef CINFER_CUDA
#include "backend/cuda/cuda_ops.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* "0" alone: an empty list (that part of the bench is skipped) */
static int parse_list(const char *s, long *out, int max) {
    int n = 0;
    if (s && !strcmp(s, "0")) return 0;
    while (s && *s && n < max) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1) return -1;
        out[n++] = v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

static void print_profile(cuda_fwd *f, const char *what) {
    double ms[CP_N], tot = 0;
    int calls;
    cuda_fwd_profile_get(f, ms, &calls);
    for (int i = 0; i < CP_N; i++) tot += ms[i];
    printf("  %s: %.3f ms of device time per call (eager launches, one event per phase)\n", what,
           calls ? tot / calls : 0.0);
    for (int i = 0; i < CP_N; i++)
        if (ms[i] > 0)
            printf("    %-18s %9.3f ms  %5.1f%%\n", cuda_phase_names[i], ms[i] / (calls ? calls : 1),
                   100.0 * ms[i] / tot);
}

/* expected distinct experts per MoE layer when B rows each pick k of E uniformly */
static double unique_experts(int E, int k, int B) {
    return E * (1.0 - pow(1.0 - (double)k / E, B));
}

int bench_cuda(int argc, char **argv) {
    static const char *const vf[] = {"--like", "--batches", "--prefill", "-n",
                                     "--ctx",  "--chunk",   "--logits",  "--sample", NULL};
    static const char *const bf[] = {"--help", "-h", "--no-profile", NULL};
    if (arg_check(argc, argv, vf, bf, "bench")) return 2;
    const char *like = arg_value(argc, argv, "--like", NULL), *v;
    long batches[16] = {1, 8, 32, 64}, prefill[16] = {512, 4096, 32768};
    int nb = 4, np = 3;
    if ((v = arg_value(argc, argv, "--batches", NULL)) && (nb = parse_list(v, batches, 16)) < 0) {
        fprintf(stderr, "cinfer bench: --batches takes a list like 1,8,32,64 (or 0: no decode)\n");
        return 2;
    }
    if ((v = arg_value(argc, argv, "--prefill", NULL)) && (np = parse_list(v, prefill, 16)) < 0) {
        fprintf(stderr, "cinfer bench: --prefill takes a list like 512,4096 (or 0: no prefill)\n");
        return 2;
    }
    long N = 32, ctx = 512, chunk = 4096;
    if ((v = arg_value(argc, argv, "-n", NULL)) && parse_int(v, "-n", 1, 1 << 16, &N)) return 2;
    if ((v = arg_value(argc, argv, "--ctx", NULL)) && parse_int(v, "--ctx", 1, 1 << 20, &ctx)) return 2;
    if ((v = arg_value(argc, argv, "--chunk", NULL)) && parse_int(v, "--chunk", 64, 65535, &chunk)) return 2;
    int profile = !arg_flag(argc, argv, "--no-profile");
    /* where a decode step's logits go: nowhere, greedy ids chosen on the device (the default: the engine's
     * decode step for greedy and top-k requests, cuda_fwd_run_sample), or the whole rows to pinned host
     * memory (the default until session 12) or to pageable host memory (malloc, as the first CUDA figures
     * were taken) */
    const char *lmode =
        arg_value(argc, argv, "--logits", NULL); /* arg_value's last argument is an alias, not a default */
    if (!lmode) lmode = "device";
    int l_pageable = !strcmp(lmode, "pageable"), l_device = !strcmp(lmode, "device");
    if (!l_pageable && !l_device && strcmp(lmode, "pinned")) {
        fprintf(stderr, "cinfer bench: --logits takes pinned, pageable or device\n");
        return 2;
    }
    /* how decode tokens are chosen: greedy (default), or chat: the Qwen3.5 generation_config's sampling
     * (temperature 0.7, top_k 20, top_p 0.8, repetition_penalty 1.1 over prompt + output), by a CPU sampler
     * per sequence — on the device through sampler_device_row with --logits device (the engine's path),
     * on the host over the copied rows with --logits pinned / pageable (the engine's path before session 12) */
    const char *smode = arg_value(argc, argv, "--sample", NULL);
    if (!smode) smode = "greedy";
    int s_chat = !strcmp(smode, "chat");
    if (!s_chat && strcmp(smode, "greedy")) {
        fprintf(stderr, "cinfer bench: --sample takes greedy or chat\n");
        return 2;
    }
    if (cuda_devices() < 1) {
        fprintf(stderr, "cinfer bench --like: no CUDA device\n");
        return 1;
    }
    /* --precision (main.c) arrives as CINFER_PRECISION, the contexts' default: the same for this forward */
    int prec = cinfer_ctx_default_params().precision;
    if (prec < 0) {
        fprintf(stderr, "cinfer bench: CINFER_PRECISION='%s': must be exact or fast\n", getenv("CINFER_PRECISION"));
        return 1;
    }
    /* the shape's checkpoint as a sparse file */
    char dir[] = "/tmp/cinfer-like-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("cinfer bench: mkdtemp");
        return 1;
    }
    char *sargv[] = {"synth", "--like", (char *)like, "--out", dir, "--sparse", NULL};
    if (cli_synth(6, sargv)) return 1;
    char err[1024];
    cinfer_model *cm = NULL;
    if (cinfer_model_open(dir, &cm, err, sizeof err)) {
        fprintf(stderr, "cinfer bench: %s\n", err);
        return 1;
    }
    const model *m = cinfer_model_internal(cm);
    long maxB = 1, maxP = 1;
    for (int i = 0; i < nb; i++) maxB = batches[i] > maxB ? batches[i] : maxB;
    for (int i = 0; i < np; i++) maxP = prefill[i] > maxP ? prefill[i] : maxP;
    long dec_ctx = ctx + N + 8, bps_dec = (dec_ctx + 15) / 16, bps_pre = (maxP + 15) / 16;
    cuda_fwd_params fp = {.max_tokens = (int)(chunk > maxB ? chunk : maxB),
                          .max_ctx = (int)(maxP > dec_ctx ? maxP : dec_ctx),
                          .n_slots = (int)maxB,
                          .n_blocks = (int)(maxB * bps_dec + bps_pre),
                          .random_weights = 1,
                          .seed = 7,
                          .fast = prec == CINFER_PRECISION_FAST};
    cuda_fwd *f = NULL;
    double t0 = now_s();
    if (cuda_fwd_create(m, &fp, &f, err, sizeof err)) {
        fprintf(stderr, "cinfer bench: %s\n", err);
        cinfer_model_close(cm);
        return 1;
    }
    double t_up = now_s() - t0;
    char devname[256];
    cu_device_describe(devname, sizeof devname);
    double bw = 0, tf = 0;
    if (cu_measure_roofline(cuda_fwd_stream(f), &bw, &tf, err, sizeof err))
        fprintf(stderr, "cinfer bench: %s\n", err);
    size_t wb, pb, sb;
    cuda_fwd_memory(f, &wb, &pb, &sb);
    int64_t lm_bytes = (int64_t)m->V * m->H * 2;
    int64_t exp_bytes = m->cfg.n_experts > 0 ? (int64_t)3 * m->cfg.moe_intermediate_size * m->H * 2 : 0;
    int n_moe = 0;
    for (int l = 0; l < m->L; l++) n_moe += m->layers[l].moe;
    printf("shape            %s: %s, %d layers (%d DeltaNet, %d attention), H %d, vocab %d%s\n", like,
           m->arch_name, m->L, m->n_lin, m->n_full, m->H, m->V, m->cfg.n_experts ? "" : ", dense");
    if (m->cfg.n_experts)
        printf("experts          %d, top-%d, %d MoE layers\n", m->cfg.n_experts, m->cfg.n_experts_per_tok,
               n_moe);
    printf("device           %s (precision %s)\n", devname, cinfer_precision_name(prec));
    printf("device memory    weights %.2f GB (random bf16, made on the device in %.1f s), KV + states %.2f "
           "GB, scratch %.2f GB\n",
           wb / 1e9, t_up, pb / 1e9, sb / 1e9);
    printf("roofline         copy %.0f GB/s (1 GiB device-to-device, read + write), bf16 GEMM %.0f TFLOP/s "
           "(cuBLAS 8192^3)\n",
           bw, tf);
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)(maxP > maxB * dec_ctx ? maxP : maxB * dec_ctx));
    int *blocks = malloc(sizeof(int) * (size_t)fp.n_blocks);
    size_t lbytes = sizeof(float) * (size_t)maxB * m->V;
    float *logits = l_pageable ? malloc(lbytes) : cuda_host_alloc(lbytes, 1);
    cuda_sample *smp = calloc((size_t)maxB, sizeof *smp); /* greedy rows */
    int32_t *ids = calloc((size_t)maxB, sizeof *ids);
    sampler **sms = calloc((size_t)maxB, sizeof *sms); /* --sample chat: one per sequence */
    cuda_sample_pen *pens = s_chat ? malloc(sizeof *pens * (size_t)maxB * CUDA_SAMPLE_MAX_PEN) : NULL;
    fwd_entry *fe = calloc((size_t)maxB, sizeof *fe);
    for (int i = 0; i < fp.n_blocks; i++) blocks[i] = i;
    uint64_t x = 88172645463325252ull;
    for (long i = 0; i < (maxP > maxB * dec_ctx ? maxP : maxB * dec_ctx); i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        toks[i] = (int32_t)(x % (uint64_t)m->V);
    }
    const int *pre_blocks = blocks + maxB * bps_dec;
    int rc = 0;
    /* ---- prefill ---- */
    double mm_flops_tok = (double)(m->bytes_per_token - lm_bytes); /* 2 FLOPs per bf16 weight = bytes */
    if (np) {
        printf("\nprefill (one sequence, chunks of %ld tokens, logits of the last token)\n", chunk);
        printf("  %8s %10s %12s %14s %10s\n", "tokens", "tok/s", "time s", "TFLOP/s", "of GEMM");
    }
    for (int pi = np ? -1 : 0; pi < np && !rc; pi++) {
        long P = pi < 0 ? (chunk < 512 ? chunk : 512) : prefill[pi]; /* pi = -1: warm-up */
        if ((rc = cuda_fwd_slot_reset(f, 0, err, sizeof err))) break;
        double ts = now_s();
        for (long off = 0; off < P && !rc; off += chunk) {
            int n = (int)(P - off < chunk ? P - off : chunk);
            fwd_entry e = {
                .seq_len = (int)off, .tokens = toks + off, .n = n, .slot = 0, .blocks = pre_blocks};
            rc = cuda_fwd_run(f, &e, 1, logits, err, sizeof err);
        }
        double dt = now_s() - ts;
        if (pi < 0 || rc) continue;
        /* attention: QK^T and PV, 4 hd FLOPs per (query head, position pair), causal: P^2 / 2 pairs */
        double att = 4.0 * m->Hq * m->hd * (double)P * P / 2.0 * m->n_full;
        double fl = mm_flops_tok * P + att;
        printf("  %8ld %10.0f %12.3f %14.1f %9.0f%%\n", P, P / dt, dt, fl / dt / 1e12,
               100.0 * fl / dt / 1e12 / tf);
    }
    if (!rc && profile && np) {
        /* never longer than the longest prefill asked for: the KV blocks and max_ctx above are sized for that
         * (a 4096-token profile after --prefill 512 wrote past the prefill's 32 blocks and ended in an
         * illegal memory access: session 4's "PDL crash" of the profiled bench, PDL or not) */
        long P = chunk < 4096 ? chunk : 4096;
        if (P > maxP) P = maxP;
        cuda_fwd_slot_reset(f, 0, err, sizeof err);
        cuda_fwd_profile(f, 1);
        fwd_entry e = {.seq_len = 0, .tokens = toks, .n = (int)P, .slot = 0, .blocks = pre_blocks};
        rc = cuda_fwd_run(f, &e, 1, logits, err, sizeof err);
        char what[64];
        snprintf(what, sizeof what, "prefill chunk of %ld tokens", P);
        if (!rc) print_profile(f, what);
        cuda_fwd_profile(f, 0);
    }
    /* ---- decode ---- */
    if (nb)
        printf("\ndecode (%ld steps after a %ld-token prompt per sequence; CUDA graphs; %s; %s)\n", N, ctx,
               l_device     ? "ids chosen on the device, only ids copied to the host"
               : l_pageable ? "logits copied to pageable host memory each step"
                            : "logits copied to pinned host memory each step",
               !s_chat    ? "greedy"
               : l_device ? "chat sampling (T 0.7, top_k 20, top_p 0.8, repetition 1.1) on the device"
                          : "chat sampling (T 0.7, top_k 20, top_p 0.8, repetition 1.1) by the CPU sampler");
    if (nb)
        printf("  %6s %10s %12s %12s %10s %12s\n", "batch", "tok/s", "ms/step", "GB/s moved", "of copy",
               "weights GB");
    for (int bi = 0; bi < nb && !rc; bi++) {
        int B = (int)batches[bi];
        for (int s = 0; s < B && !rc; s++) rc = cuda_fwd_slot_reset(f, s, err, sizeof err);
        /* prompts, as many sequences per call as fit in a chunk */
        for (int s0 = 0; s0 < B && !rc;) {
            int ne = 0;
            long tot = 0;
            while (s0 + ne < B && tot + ctx <= fp.max_tokens) {
                int s = s0 + ne;
                fe[ne] = (fwd_entry){.seq_len = 0,
                                     .tokens = toks + (size_t)s * dec_ctx,
                                     .n = (int)ctx,
                                     .slot = s,
                                     .blocks = blocks + (size_t)s * bps_dec};
                tot += ctx, ne++;
            }
            if (!ne) {
                rc = -1;
                snprintf(err, sizeof err, "--ctx %ld exceeds the chunk of %ld tokens", ctx, chunk);
                break;
            }
            rc = cuda_fwd_run(f, fe, ne, logits, err, sizeof err);
            s0 += ne;
        }
        for (int q = 0; s_chat && q < B && !rc; q++) {
            sampler_params sp = sampler_default_params();
            sp.temperature = 0.7f, sp.top_k = 20, sp.top_p = 0.8f, sp.repetition_penalty = 1.1f;
            sp.seed = 1234 + (uint64_t)q;
            if (sms[q]) sampler_destroy(sms[q]), sms[q] = NULL;
            if ((rc = sampler_create(&sp, m->V, &sms[q], err, sizeof err)) ||
                (rc = sampler_set_prompt(sms[q], toks + (size_t)q * dec_ctx, (int)ctx, err, sizeof err)))
                break;
        }
        double ts = 0;
        for (long t = 0; t < N + 2 && !rc; t++) {
            if (t == 2) ts = now_s(); /* two warm-up steps capture the graph */
            for (int s = 0; s < B; s++)
                fe[s] = (fwd_entry){.seq_len = (int)(ctx + t),
                                    .tokens = toks + (size_t)s * dec_ctx + ctx + t,
                                    .n = 1,
                                    .slot = s,
                                    .blocks = blocks + (size_t)s * bps_dec};
            /* device: the engine's own call for a decode step (ctx_forward_sample): one sync, after the ids.
             * chat: the previous choice joins each sequence's window first, as the engine does (the fed tokens
             * stay the prompt's continuation, so every run computes the same rows) */
            for (int q = 0; s_chat && t > 0 && q < B; q++) sampler_accept(sms[q], ids[q]);
            for (int q = 0, npen = 0; s_chat && l_device && q < B && !rc; q++) {
                sampler_dev_row dr;
                int k = 0;
                if (sampler_device_row(sms[q], CUDA_SAMPLE_MAX_K, &dr, pens + npen, CUDA_SAMPLE_MAX_PEN, &k)) {
                    rc = -1;
                    snprintf(err, sizeof err, "the chat sampler is not for the device");
                    break;
                }
                smp[q] = (cuda_sample){dr.temperature, dr.top_k, dr.u, 0, dr.top_p, dr.min_p,
                                       dr.repetition_penalty, k ? pens + npen : NULL, k};
                npen += k;
            }
            if (rc) break;
            if (l_device) {
                rc = cuda_fwd_run_sample(f, fe, B, smp, B, ids, NULL, err, sizeof err);
            } else {
                rc = cuda_fwd_run(f, fe, B, logits, err, sizeof err);
                for (int q = 0; s_chat && !rc && q < B; q++)
                    ids[q] = sampler_sample(sms[q], logits + (size_t)q * m->V, NULL);
            }
        }
        if (rc) break;
        double dt = (now_s() - ts) / N;
        double wbytes = (double)m->bytes_per_token;
        if (exp_bytes)
            wbytes +=
                (unique_experts(m->cfg.n_experts, m->cfg.n_experts_per_tok, B) - m->cfg.n_experts_per_tok) *
                (double)exp_bytes * n_moe;
        double kv = (double)B * (ctx + N / 2.0) * m->n_full * 2.0 * m->Hkv * m->hd * 4.0;
        double st =
            (double)B * m->n_lin * ((double)m->Hv * m->dk * m->dv * 8.0 + (double)(m->K - 1) * m->C * 8.0);
        double moved = wbytes + kv + st;
        printf("  %6d %10.1f %12.3f %12.0f %9.0f%% %12.2f\n", B, B / dt, dt * 1e3, moved / dt / 1e9,
               100.0 * moved / dt / 1e9 / bw, wbytes / 1e9);
        if (profile && (B == 1 || bi == nb - 1)) {
            cuda_fwd_profile(f, 1);
            for (int s = 0; s < B; s++)
                fe[s] = (fwd_entry){.seq_len = (int)(ctx + N + 2),
                                    .tokens = toks + (size_t)s * dec_ctx + ctx + N + 2,
                                    .n = 1,
                                    .slot = s,
                                    .blocks = blocks + (size_t)s * bps_dec};
            rc = cuda_fwd_run(f, fe, B, logits, err, sizeof err);
            char what[64];
            snprintf(what, sizeof what, "decode step at batch %d", B);
            if (!rc) print_profile(f, what);
            cuda_fwd_profile(f, 0);
        }
    }
    if (rc) fprintf(stderr, "cinfer bench: %s\n", err);
    for (long q = 0; q < maxB; q++)
        if (sms[q]) sampler_destroy(sms[q]);
    free(sms), free(pens);
    free(toks), free(blocks), free(fe), free(smp), free(ids);
    if (l_pageable)
        free(logits);
    else
        cuda_host_free(logits);
    cuda_fwd_destroy(f);
    cinfer_model_close(cm);
    /* the sparse checkpoint */
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "cinfer bench: could not remove %s\n", dir);
    return rc ? 1 : 0;
}

#else

int bench_cuda(int argc, char **argv) {
    (void)argc, (void)argv;
    fprintf(stderr, "cinfer bench --like: this build has no CUDA backend (make CUDA=1 with nvcc)\n");
    return 1;
}

#endif

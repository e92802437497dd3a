/* bench_prefix.c — `cinfer bench -m DIR --prefix-turn P [--turn-new N]`: what the prefix cache buys a
 * multi-turn conversation. Turn 1 is a P-token prompt (cold); turn 2 repeats it and adds N new tokens, as a
 * chat client resends the whole history. Turn 2's time to first token with the cache is set against the same
 * prompt cold (a fresh engine), and the cache's memory per cached token is reported. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cinfer.h"
#include "cli/args.h"
#include "cli/cli.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Submits prompt, returns seconds to the first generated token; *cached gets usage.cached_tokens. */
static double ttft(cinfer_engine *e, const int32_t *p, int n, int *cached, const char *what) {
    char err[512];
    /* CINFER_TTFT_TRACE: the engine's and the device's trace lines that follow belong to this turn */
    if (getenv("CINFER_TTFT_TRACE")) fprintf(stderr, "ttft-trace === %s: %d tokens\n", what, n);
    cinfer_request_params rp;
    memset(&rp, 0, sizeof rp);
    rp.prompt = p;
    rp.n_prompt = n;
    rp.max_tokens = 2;
    rp.sampling = cinfer_sampling_default();
    rp.sampling.temperature = 0;
    rp.sampling.n_logprobs = 0;
    rp.ignore_eos = 1;
    cinfer_request *r;
    double t0 = now_s(), t1 = 0;
    if (cinfer_engine_submit(e, &rp, &r, err, sizeof err)) {
        fprintf(stderr, "cinfer bench: %s\n", err);
        return -1;
    }
    cinfer_event ev;
    while (cinfer_request_next(r, &ev, -1) == 1) {
        if (ev.type == CINFER_EV_LOGPROB && !t1) t1 = now_s();
        if (ev.type == CINFER_EV_DONE) *cached = ev.cached_tokens;
    }
    cinfer_request_free(r);
    return t1 - t0;
}

int bench_prefix(int argc, char **argv, const char *dir, int P) {
    long N = 64, nthreads = 0;
    const char *v;
    if ((v = arg_value(argc, argv, "--turn-new", NULL)) && parse_int(v, "--turn-new", 1, 1 << 16, &N))
        return 2;
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
    int total = P + (int)N, total3 = P + 2 * (int)N;
    int32_t *p = malloc(sizeof(int32_t) * (size_t)total3);
    uint64_t x = 0x2545f4914f6cdd1dull;
    for (int i = 0; i < total3; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = (int32_t)(x % (uint64_t)info.vocab_size);
    }
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.max_seqs = 2; /* KV room for the cached turn and the running one, so measuring does not evict */
    ep.ctx_size = total3 + 8;
    ep.n_threads = (int)nthreads;
    ep.prefix_cache_memory = 1ll << 30;
    cinfer_engine *warm, *cold;
    if (cinfer_engine_create(m, &ep, &warm, err, sizeof err) ||
        cinfer_engine_create(m, &ep, &cold, err, sizeof err)) {
        fprintf(stderr, "cinfer bench: %s\n", err);
        return 1;
    }
    int c1 = 0, c2 = 0, c3 = 0, c4 = 0;
    /* each row as soon as it is measured (line-buffered: a run stopped by a time limit keeps them) */
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("model            %s (%s)\n", dir, info.arch);
    double t1 = ttft(warm, p, P, &c1, "turn 1 (cold)"); /* turn 1, cold: leaves a snapshot at P - 1 */
    printf("turn 1           %d tokens cold: TTFT %.3f s\n", P, t1);
    double t2 = ttft(warm, p, total, &c2, "turn 2 (from the cache)"); /* turn 2 from the cache */
    printf("turn 2           %d tokens (+%ld new), %d from the cache: TTFT %.3f s\n", total, N, c2, t2);
    double t3 = ttft(cold, p, total, &c3, "turn 2 cold (a fresh engine)"); /* turn 2 cold */
    printf("turn 2 cold      TTFT %.3f s (cached %d)\n", t3, c3);
    cinfer_engine_stats st;
    cinfer_engine_get_stats(warm, &st);
    printf("ratio            %.2f%% of cold\n", t3 > 0 ? 100.0 * t2 / t3 : 0);
    /* turn 3 adds N more tokens: the same work as turn 2 once the process has run an N-row prefill behind a
     * cached context before, so its time apart from turn 2's is what the first such prefill paid once */
    double t4 = ttft(warm, p, total3, &c4, "turn 3 (from the cache)");
    printf("turn 3           %d tokens (+%ld new), %d from the cache: TTFT %.3f s = %.2f%% of turn 2 cold\n",
           total3, N, c4, t4, t3 > 0 ? 100.0 * t4 / t3 : 0);
    printf(
        "cache memory     %.1f MB of state snapshots + %.1f MB of KV (%d blocks): %.1f KB per cached token\n",
        st.prefix_bytes / 1e6, st.prefix_kv_bytes / 1e6, st.prefix_blocks_cached,
        c2 ? ((double)st.prefix_bytes + (double)st.prefix_kv_bytes) / c2 / 1024.0 : 0);
    cinfer_engine_destroy(warm);
    cinfer_engine_destroy(cold);
    free(p);
    cinfer_model_close(m);
    return 0;
}

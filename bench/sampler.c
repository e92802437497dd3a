/* sampler.c — per-token cost of the sampler chain on a Qwen3.5-sized vocabulary.
 * bench/run_sampler.sh builds it against build/libcinfer.a and runs it. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "sample/sample.h"
#include "sample/sampler.h"

static sampler *mk(const sampler_params *p, int V) {
    sampler *s = NULL;
    char err[256];
    if (sampler_create(p, V, &s, err, sizeof err)) fprintf(stderr, "%s\n", err);
    return s;
}

static double thread_cpu_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Per-token cost on a Qwen3.5-sized vocabulary with peaked logits (a wide bulk and a few strong tokens,
 * like a model's), in thread CPU time so a busy machine does not skew it. */
int main(void) {
    enum { V = 248320, STEPS = 40 };
    float *x = malloc(V * sizeof *x);
    rng r;
    rng_seed(&r, 1);
    for (int i = 0; i < V; i++) {
        double g = 0;
        for (int k = 0; k < 4; k++) g += rng_uniform(&r) - 0.5;
        x[i] = (float)(g * 4.0);
    }
    for (int k = 0; k < 30; k++) x[rng_next(&r) % V] += (float)(10.0 + 10.0 * rng_uniform(&r));
    struct {
        const char *name;
        float temp, top_p, min_p;
        int top_k, top_logprobs;
    } cs[] = {
        {"greedy", 0.0f, 1.0f, 0.0f, 0, 0},
        {"temperature 0.8", 0.8f, 1.0f, 0.0f, 0, 0},
        {"T0.6 top_k 20 top_p 0.95", 0.6f, 0.95f, 0.0f, 20, 0},
        {"top_p 0.95", 1.0f, 0.95f, 0.0f, 0, 0},
        {"min_p 0.05", 1.0f, 1.0f, 0.05f, 0, 0},
        {"greedy + 20 top_logprobs", 0.0f, 1.0f, 0.0f, 0, 20},
    };
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        sampler_params p = sampler_default_params();
        p.temperature = cs[c].temp;
        p.top_p = cs[c].top_p;
        p.min_p = cs[c].min_p;
        p.top_k = cs[c].top_k;
        p.logprobs = cs[c].top_logprobs > 0;
        p.top_logprobs = cs[c].top_logprobs;
        sampler *s = mk(&p, V);
        if (!s) return 1;
        sampler_result res;
        double t0 = thread_cpu_s();
        for (int i = 0; i < STEPS; i++) sampler_sample(s, x, &res);
        double ms = (thread_cpu_s() - t0) * 1e3 / STEPS;
        printf("    sampler %-26s %7.3f ms/token (V=%d)\n", cs[c].name, ms, V);
        sampler_destroy(s);
    }
    free(x);
    return 0;
}

/* membw.c — see membw.h. */
#include "util/membw.h"

#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

typedef struct {
    const uint64_t *buf;
    size_t n; /* uint64 words */
    volatile uint64_t sink;
} bw_job;

#if defined(__x86_64__)
/* 256-bit loads, eight in flight per iteration */
__attribute__((target("avx2"))) static uint64_t bw_read256(const uint64_t *p, long n) {
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    for (long i = 0; i < n; i += 32) {
        s0 = _mm256_xor_si256(s0, _mm256_load_si256((const __m256i *)(p + i)));
        s1 = _mm256_xor_si256(s1, _mm256_load_si256((const __m256i *)(p + i + 8)));
        s2 = _mm256_xor_si256(s2, _mm256_load_si256((const __m256i *)(p + i + 16)));
        s3 = _mm256_xor_si256(s3, _mm256_load_si256((const __m256i *)(p + i + 24)));
        s0 = _mm256_xor_si256(s0, _mm256_load_si256((const __m256i *)(p + i + 4)));
        s1 = _mm256_xor_si256(s1, _mm256_load_si256((const __m256i *)(p + i + 12)));
        s2 = _mm256_xor_si256(s2, _mm256_load_si256((const __m256i *)(p + i + 20)));
        s3 = _mm256_xor_si256(s3, _mm256_load_si256((const __m256i *)(p + i + 28)));
    }
    s0 = _mm256_xor_si256(_mm256_xor_si256(s0, s1), _mm256_xor_si256(s2, s3));
    return (uint64_t)_mm256_extract_epi64(s0, 0);
}
#endif

static void bw_fn(void *ctx, int ith, int nth) {
    bw_job *j = ctx;
    long b, e;
    tp_range((long)(j->n / 32), ith, nth, &b, &e); /* 256-byte blocks */
    uint64_t s = 0;
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2")) {
        s = bw_read256(j->buf + b * 32, (e - b) * 32);
        if (ith == 0) j->sink = s;
        return;
    }
#endif
    for (long i = b * 32; i < e * 32; i += 8) s ^= j->buf[i] ^ j->buf[i + 4];
    if (ith == 0) j->sink = s;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

double membw_read(threadpool *tp, const uint64_t *buf, size_t bytes, int reps) {
    bw_job bj = {buf, bytes / 8, 0};
    double bw = 0;
    for (int rep = 0; rep < reps; rep++) {
        double t = now_s();
        tp_run(tp, bw_fn, &bj);
        t = now_s() - t;
        double g = (double)bytes / t / 1e9;
        if (g > bw) bw = g;
    }
    return bw;
}

double membw_measure(threadpool *tp, size_t bytes, int reps) {
    bytes &= ~(size_t)255;
    uint64_t *buf = NULL;
    if (posix_memalign((void **)&buf, 64, bytes)) return 0;
    for (size_t i = 0; i < bytes / 8; i++) buf[i] = i * 0x9e3779b97f4a7c15ull;
    double bw = membw_read(tp, buf, bytes, reps);
    free(buf);
    return bw;
}

/* bench/matmul.c — cpu_matmul against this machine's own roofline: measures the f32 FMA peak (register-only
 * loop on every thread) and the memory read bandwidth (all threads streaming a 1 GiB buffer), then times
 * the Qwen3.5 shapes and prints GB/s of weights, GFLOP/s, and the fraction of each measured ceiling.
 *
 * Build and run (bench/run_matmul.sh does exactly this):
 *   make BUILD=build && cc -std=c11 -D_GNU_SOURCE -O2 -pthread -Iinclude -Isrc bench/matmul.c \
 *       build/libcinfer.a -lm -lpthread -o build/matmul-bench && build/matmul-bench [threads] [filter]
 * threads defaults to all online CPUs; filter keeps only the cases whose label contains it ("step" runs
 * only the whole-decode-step cases: 1.5 GB (0.8B) and 3.8 GB (2B) of weights). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/matmul.h"
#include "util/bf16.h"
#include "util/membw.h"
#include "util/threadpool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------ FMA peak: 12 independent chains per thread
 * (enough to cover FMA latency x pipes on current x86), nothing but FMAs in the loop. */
#define PEAK_ITERS 20000000L

#if defined(__x86_64__)
__attribute__((target("avx512f,fma"))) static float fma_loop512(long iters) {
    __m512 a[12], b = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(0.001f);
    for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps((float)i);
    for (long it = 0; it < iters; it++) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) a[i] = _mm512_fmadd_ps(a[i], b, c);
    }
    __m512 s = a[0];
    for (int i = 1; i < 12; i++) s = _mm512_add_ps(s, a[i]);
    return _mm512_reduce_add_ps(s);
}
__attribute__((target("avx2,fma"))) static float fma_loop256(long iters) {
    __m256 a[12], b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(0.001f);
    for (int i = 0; i < 12; i++) a[i] = _mm256_set1_ps((float)i);
    for (long it = 0; it < iters; it++) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) a[i] = _mm256_fmadd_ps(a[i], b, c);
    }
    __m256 s = a[0];
    for (int i = 1; i < 12; i++) s = _mm256_add_ps(s, a[i]);
    float f[8];
    _mm256_storeu_ps(f, s);
    return f[0] + f[7];
}
#endif

typedef struct {
    int width; /* floats per FMA: 16, 8 or 1 */
    volatile float sink;
} peak_job;

static void peak_fn(void *ctx, int ith, int nth) {
    peak_job *j = ctx;
    float r = 0;
#if defined(__x86_64__)
    if (j->width == 16)
        r = fma_loop512(PEAK_ITERS);
    else if (j->width == 8)
        r = fma_loop256(PEAK_ITERS);
#endif
    if (ith == 0) j->sink = r;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Best of 3 short runs: GFLOP/s of the register-only FMA loop on every thread of tp. */
static double measure_peak(threadpool *tp, int width) {
    if (width <= 1) return 0;
    peak_job pj = {width, 0};
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double t = now();
        tp_run(tp, peak_fn, &pj);
        t = now() - t;
        if (t < best) best = t;
    }
    return (double)PEAK_ITERS * 12 * width * 2 * tp_size(tp) / best / 1e9;
}

static double measure_bw(threadpool *tp, const uint64_t *buf, size_t bytes, int reps) {
    return membw_read(tp, buf, bytes, reps);
}

/* ------------------------------------------------------------ a whole decode step's matmuls: every weight
 * matrix of a Qwen3.5 dense shape once, in the forward pass's order (DeltaNet layers: in_proj_qkv, z, b, a,
 * out_proj; every 4th layer full attention: q (with gate), k, v, o; each layer's MLP; then the lm_head), on
 * one fresh buffer as big as the model's weights (so nothing is in cache), M rows at a time. Its time is the
 * floor under `cinfer bench`'s decode (which adds the small ops between the matmuls), and M=8 against M=1
 * shows what a batch of 8 costs over one weight stream. */
typedef struct {
    const char *name;
    int H, I, L, V;
} step_shape;

typedef struct {
    int N, K;
} mm_shape;

static int step_shapes(const step_shape *ss, mm_shape *out) {
    int n = 0;
    for (int l = 0; l < ss->L; l++) {
        if (l % 4 == 3) { /* full attention: 8 q heads x 256 (+ gate), 2 kv heads x 256 */
            out[n++] = (mm_shape){8 * 256 * 2, ss->H};
            out[n++] = (mm_shape){2 * 256, ss->H};
            out[n++] = (mm_shape){2 * 256, ss->H};
            out[n++] = (mm_shape){ss->H, 8 * 256};
        } else { /* Gated DeltaNet: 16 k heads x 128 (q, k), 16 v heads x 128 */
            out[n++] = (mm_shape){2 * 16 * 128 + 16 * 128, ss->H};
            out[n++] = (mm_shape){16 * 128, ss->H};
            out[n++] = (mm_shape){16, ss->H};
            out[n++] = (mm_shape){16, ss->H};
            out[n++] = (mm_shape){ss->H, 16 * 128};
        }
        out[n++] = (mm_shape){ss->I, ss->H};
        out[n++] = (mm_shape){ss->I, ss->H};
        out[n++] = (mm_shape){ss->H, ss->I};
    }
    out[n++] = (mm_shape){ss->V, ss->H};
    return n;
}

/* Index of the first call in sh[0..n) with the same (N, K) as call i. */
static int shape_of(const mm_shape *sh, int n, int i) {
    for (int q = 0; q < n; q++)
        if (sh[q].N == sh[i].N && sh[q].K == sh[i].K) return q;
    return i;
}

static void run_steps(threadpool *tp, const char *filter, int width, uint64_t *bwbuf, size_t bw_bytes) {
    static const step_shape shapes[] = {
        {"0.8B", 1024, 3584, 24, 248320},
        {"2B", 2048, 6144, 24, 248320},
    };
    static const int Ms[] = {1, 8};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        char l1[64], l8[64];
        snprintf(l1, sizeof l1, "step %s M=1", shapes[si].name);
        snprintf(l8, sizeof l8, "step %s M=8", shapes[si].name);
        if (filter && !strstr(l1, filter) && !strstr(l8, filter)) continue;
        mm_shape sh[24 * 8 + 1];
        int n = step_shapes(&shapes[si], sh);
        size_t total = 0, maxn = 0, maxk = 0;
        for (int i = 0; i < n; i++) {
            total += (size_t)sh[i].N * sh[i].K * 2;
            if ((size_t)sh[i].N > maxn) maxn = (size_t)sh[i].N;
            if ((size_t)sh[i].K > maxk) maxk = (size_t)sh[i].K;
        }
        uint16_t *w = aligned_alloc(64, (total + 63) / 64 * 64);
        float *x = aligned_alloc(64, 8 * maxk * 4), *y = aligned_alloc(64, 8 * maxn * 4);
        if (!w || !x || !y) {
            printf("%s: cannot allocate %.2f GB\n", l1, total / 1e9);
            free(w), free(x), free(y);
            continue;
        }
        uint32_t s = 88172645u;
        for (size_t i = 0; i < total / 2; i++) {
            s ^= s << 13, s ^= s >> 17, s ^= s << 5;
            w[i] = f32_to_bf16((float)(s >> 8) / 16777216.0f - 0.5f);
        }
        for (size_t i = 0; i < 8 * maxk; i++) x[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
        /* M=1 and M=8 steps alternate, so that both see the same moments of a shared machine. */
        enum { REPS = 9 };
        int run[2];
        double shape_t[2][24 * 8 + 1] = {{0}}; /* time per distinct (N, K), indexed by its first call */
        double ts[2][REPS], bw0 = measure_bw(tp, bwbuf, bw_bytes, 2);
        for (int mi = 0; mi < 2; mi++) run[mi] = !filter || strstr(mi ? l8 : l1, filter) != NULL;
        for (int r = -1; r < REPS; r++) /* r = -1: warm-up (page faults) */
            for (int mi = 0; mi < 2; mi++) {
                if (!run[mi]) continue;
                double t = now(), t1 = t;
                const uint16_t *wp = w;
                for (int i = 0; i < n; i++) {
                    cpu_matmul(tp, y, x, wp, WT_BF16, Ms[mi], sh[i].N, sh[i].K);
                    wp += (size_t)sh[i].N * sh[i].K;
                    double t2 = now();
                    if (r >= 0) shape_t[mi][shape_of(sh, n, i)] += t2 - t1;
                    t1 = t2;
                }
                if (r >= 0) ts[mi][r] = now() - t;
            }
        double bw1 = measure_bw(tp, bwbuf, bw_bytes, 2), bwc = bw0 > bw1 ? bw0 : bw1;
        double ms[2] = {0, 0};
        for (int mi = 0; mi < 2; mi++) {
            if (!run[mi]) continue;
            qsort(ts[mi], REPS, sizeof(double), cmp_d);
            double t = ts[mi][REPS / 2];
            ms[mi] = t * 1e3;
            printf("%-26s %8.3f %8.1f %5.0f%% %8.1f %6s   %.3f | %.0f GB/s; %d matmuls, %.2f GB\n",
                   mi ? l8 : l1, t * 1e3, total / t / 1e9, 100 * total / t / 1e9 / bwc,
                   2.0 * Ms[mi] * (total / 2) / t / 1e9, "", ts[mi][0] * 1e3, bwc, n, total / 1e9);
        }
        if (ms[0] > 0 && ms[1] > 0) printf("%-26s M=8 takes %.2fx the time of M=1\n", "", ms[1] / ms[0]);
        /* Where the step's time goes: each distinct shape's calls, GB/s over all repetitions. */
        for (int mi = 0; mi < 2; mi++) {
            if (!run[mi]) continue;
            printf("%-26s by shape:", mi ? l8 : l1);
            for (int i = 0; i < n; i++) {
                if (shape_of(sh, n, i) != i) continue;
                int calls = 0;
                for (int q = 0; q < n; q++) calls += shape_of(sh, n, q) == i;
                double bytes = (double)sh[i].N * sh[i].K * 2 * calls * REPS;
                printf(" %dx%d x%d %.1f GB/s (%.1f ms);", sh[i].N, sh[i].K, calls,
                       bytes / shape_t[mi][i] / 1e9, shape_t[mi][i] / REPS * 1e3);
            }
            printf("\n");
        }
        (void)width;
        free(w);
        free(x);
        free(y);
    }
}

int main(int argc, char **argv) {
    int nthreads = argc > 1 ? atoi(argv[1]) : 0;
    const char *filter = argc > 2 ? argv[2] : NULL;
    threadpool *tp = tp_create(nthreads);
    nthreads = tp_size(tp);
    printf("cpu_matmul bench: %d threads, kernels %s\n", nthreads, cpu_matmul_isa());

    /* Peak. */
    int width = 1;
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        width = 16;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        width = 8;
#endif
    double peak = measure_peak(tp, width);
    if (peak > 0)
        printf("f32 FMA peak (%d-wide, register-only, %d threads): %.1f GFLOP/s\n", width, nthreads, peak);

    /* Bandwidth. */
    size_t bw_bytes = (size_t)1 << 30;
    uint64_t *buf = aligned_alloc(64, bw_bytes);
    if (!buf) return 1;
    memset(buf, 1, bw_bytes);
    double bw = measure_bw(tp, buf, bw_bytes, 5);
    printf("memory read bandwidth (%d threads, 1 GiB): %.1f GB/s\n", nthreads, bw);
    printf("(shared/virtual cores drift: each case's fractions use the peak and bandwidth re-measured just\n"
           " before and after it, the higher of the two, shown at the end of its line)\n\n");

    /* Cases: weights are bf16 unless said; several copies of W rotate so that W (not x or y) comes from DRAM
     * on every call unless it is one huge matrix anyway. */
    static const struct {
        int M, N, K;
        wtype wt;
    } cases[] = {
        {1, 248320, 1024, WT_BF16},  {8, 248320, 1024, WT_BF16}, {512, 6144, 1024, WT_BF16},
        {1, 6144, 1024, WT_BF16},    {8, 6144, 1024, WT_BF16},   {64, 6144, 1024, WT_BF16},
        {1, 2048, 1024, WT_BF16},    {1, 4096, 1024, WT_BF16},   {1, 3584, 1024, WT_BF16},
        {1, 1024, 1024, WT_BF16},    {1, 1024, 3584, WT_BF16},   {512, 1024, 3584, WT_BF16},
        {2048, 6144, 1024, WT_BF16}, {512, 6144, 1024, WT_F32},  {512, 6144, 1024, WT_F16},
        {1, 6144, 1024, WT_F32},     {1, 6144, 1024, WT_F16},
    };
    printf("%-26s %8s %8s %6s %8s %7s  %s\n", "case (M x N x K, type)", "ms(med)", "GB/s W", "of bw",
           "GFLOP/s", "of peak", "best ms | bw, peak around it");
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        int M = cases[ci].M, N = cases[ci].N, K = cases[ci].K;
        wtype wt = cases[ci].wt;
        const char *tn = wt == WT_BF16 ? "bf16" : wt == WT_F16 ? "f16" : "f32";
        char label[64];
        snprintf(label, sizeof label, "%d x %d x %d %s", M, N, K, tn);
        if (filter && !strstr(label, filter)) continue;
        size_t es = wt == WT_F32 ? 4 : 2, wbytes = (size_t)N * K * es;
        int copies = (int)((256u << 20) / wbytes);
        if (copies < 1) copies = 1;
        if (copies > 64) copies = 64;
        uint16_t *w = aligned_alloc(64, wbytes * copies);
        float *x = aligned_alloc(64, (size_t)M * K * 4), *y = aligned_alloc(64, (size_t)M * N * 4);
        if (!w || !x || !y) return 1;
        uint32_t s = 2463534242u;
        for (size_t i = 0; i < wbytes * copies / 2; i++) {
            s ^= s << 13, s ^= s >> 17, s ^= s << 5;
            float v = (float)(s >> 8) / 16777216.0f - 0.5f;
            /* f32 weights: each pair of halves forms a finite float (the bf16 pattern below, repeated). */
            w[i] = wt == WT_F16                   ? (uint16_t)(0x3000 | (s & 0x83ff))
                   : wt == WT_F32 && (i & 1) == 0 ? 0
                                                  : f32_to_bf16(v);
        }
        for (size_t i = 0; i < (size_t)M * K; i++) x[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
        /* Enough calls for ~0.5 s of the slower of the two ceilings, at least 5. */
        double flops = 2.0 * M * N * K;
        double est = wbytes / (bw * 1e9) + (peak > 0 ? flops / (peak * 1e9) : flops / 1e9);
        int reps = (int)(0.5 / est);
        if (reps < 5) reps = 5;
        if (reps > 2000) reps = 2000;
        double *ts = malloc(sizeof(double) * reps);
        double pk = measure_peak(tp, width), bwc = measure_bw(tp, buf, bw_bytes, 2);
        cpu_matmul(tp, y, x, w, wt, M, N, K); /* warm-up: page faults, panel TLS */
        for (int r = 0; r < reps; r++) {
            const void *wr = (const char *)w + (size_t)(r % copies) * wbytes;
            double t = now();
            cpu_matmul(tp, y, x, wr, wt, M, N, K);
            ts[r] = now() - t;
        }
        double pk2 = measure_peak(tp, width), bw2 = measure_bw(tp, buf, bw_bytes, 2);
        if (pk2 > pk) pk = pk2;
        if (bw2 > bwc) bwc = bw2;
        qsort(ts, reps, sizeof(double), cmp_d);
        double t = ts[reps / 2], tmin = ts[0];
        printf("%-26s %8.3f %8.1f %5.0f%% %8.1f %6.0f%%  %.3f | %.0f GB/s, %.0f GFLOP/s\n", label, t * 1e3,
               wbytes / t / 1e9, 100 * wbytes / t / 1e9 / bwc, flops / t / 1e9,
               pk > 0 ? 100 * flops / t / 1e9 / pk : 0, tmin * 1e3, bwc, pk);
        free(ts);
        free(w);
        free(x);
        free(y);
    }
    run_steps(tp, filter, width, buf, bw_bytes);
    free(buf);
    tp_destroy(tp);
    return 0;
}

/* test_cuda_gemm16.c — the one-pass fp16 prefill GEMM (cu_gemm_f16, gemm_f16.cu;
 * CINFER_CUDA_PREFILL_GEMM=f16) against the CPU in double: the real matrices of the 4B and 27B shapes at 4096
 * / 1000 rows (a spread of rows x columns checked, every output finite, outputs starting as NaN so an
 * unwritten one fails), rows of x from 1e-6 to 1e5 in scale (the per-row power-of-two scale), ||d||/||ref||
 * printed and bounded by 5e-4 (one bf16 rounding of x gives ~1e-3, so the bound fails a kernel that lost
 * fp16's precision); weights below fp16's normal range, their cost printed; ragged M (1 .. 4096, no multiple
 * of the tile needed) and ragged N / K on small shapes with every output checked, both CTA widths; each row's
 * bits the same alone as among all rows; cu_gemm's switch; and a microbench (cuda_gemm16_speed): TFLOP/s per
 * real matrix at M = 512 and 4096 for this kernel (with and without the row conversion, both tile widths) and
 * cuBLAS on one and on two bf16 passes. Without a CUDA build or device every test skips. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cinfer.h"
#include "model/forward_cuda.h"
#include "test.h"
#include "util/bf16.h"

#ifdef CINFER_CUDA
#include "backend/cuda/cuda_ops.h"

#define NO_DEVICE() (!cuda_built() || cuda_devices() < 1)

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static float frand(void) { /* [-1, 1) */
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

/* row m's scale: 1e-6 .. 1e5 across rows, most rows near 1 */
static float row_scale(int m) {
    static const float s[] = {1.0f, 3.0f, 0.25f, 1e5f, 1e-6f, 40.0f, 1.0f, 0.01f};
    return s[m % 8];
}

static void *dup_dev(const void *h, size_t bytes) {
    void *d = NULL;
    char err[256];
    if (cu_alloc(&d, bytes, err, sizeof err) || cu_upload(d, h, bytes, err, sizeof err)) return NULL;
    return d;
}

typedef struct gprob {
    int M, N, K;
    float *x;    /* [M][K] host */
    uint16_t *w; /* [N][K] host bf16 */
    float *wf;   /* [N][K] host, w as f32 */
    float *dx;
    uint16_t *dw, *dxb;
} gprob;

static void prob_free(gprob *p) {
    free(p->x), free(p->w), free(p->wf);
    cu_free(p->dx), cu_free(p->dw), cu_free(p->dxb);
    memset(p, 0, sizeof *p);
}

/* wamp: weights uniform in +-wamp */
static int prob_make(gprob *p, int M, int N, int K, float wamp) {
    memset(p, 0, sizeof *p);
    p->M = M, p->N = N, p->K = K;
    size_t nx = (size_t)M * K, nw = (size_t)N * K;
    p->x = malloc(nx * 4), p->w = malloc(nw * 2), p->wf = malloc(nw * 4);
    if (!p->x || !p->w || !p->wf) return -1;
    for (int m = 0; m < M; m++) {
        float s = row_scale(m);
        for (int k = 0; k < K; k++) p->x[(size_t)m * K + k] = frand() * s;
    }
    for (size_t i = 0; i < nw; i++) {
        p->w[i] = f32_to_bf16(frand() * wamp);
        p->wf[i] = bf16_to_f32(p->w[i]);
    }
    p->dx = dup_dev(p->x, nx * 4);
    p->dw = dup_dev(p->w, nw * 2);
    char err[256];
    if (cu_alloc((void **)&p->dxb, nx * 2 * 2, err, sizeof err)) p->dxb = NULL;
    return p->dx && p->dw && p->dxb ? 0 : -1;
}

/* y = cu_gemm_f16 over rows [m0, m0 + M) of the problem into fresh memory filled with NaN; NULL on error */
static float *run_f16(cu_ctx *c, const gprob *p, int m0, int M) {
    char err[256];
    size_t ny = (size_t)M * p->N;
    float *dy = NULL, *y = NULL;
    if (cu_alloc((void **)&dy, ny * 4, err, sizeof err)) return NULL;
    cu_fill_f32(c, dy, ny, NAN);
    int rc = cu_gemm_f16(c, dy, p->dx + (size_t)m0 * p->K, p->dw, M, p->N, p->K, p->dxb);
    if (rc == 0 && cu_sync(c, err, sizeof err) == 0) {
        y = malloc(ny * 4 + 4);
        if (y && cu_download(y, dy, ny * 4, err, sizeof err)) free(y), y = NULL;
    }
    cu_free(dy);
    return y;
}

/* per checked row: ||d|| / ||ref||; and per output |d| / sum over k of |x w| — one fp16 rounding of x bounds
 * that by 2^-11 (plus the f32 sums' ~K 2^-24) whatever the data, where ||d|| / ||ref|| of a row with few
 * outputs is ill-conditioned (N = 1, K = 8: a row's one output can cancel to ~0; call 1 saw 0.83 there with
 * |d| / sum |x w| at 6.5e-4 of the root-sum-square form this replaced). Each row is relative to its own scale
 * (rows differ by 1e11); the worsts are returned (NaN propagates); *nonfinite counts non-finite outputs among
 * all of y. */
static double check2(const gprob *p, const float *y, int M, const int *rows, int nr, const int *cols, int nc,
                     size_t *nonfinite, double *worst_abs) {
    size_t bad = 0;
    for (size_t i = 0; i < (size_t)M * p->N; i++) bad += !isfinite(y[i]);
    *nonfinite = bad;
    double worst = 0, wa = 0;
    for (int a = 0; a < nr; a++) {
        int m = rows ? rows[a] : a;
        const float *xr = p->x + (size_t)m * p->K;
        double dd = 0, rr = 0;
        for (int b = 0; b < nc; b++) {
            int n = cols ? cols[b] : b;
            const float *wr = p->wf + (size_t)n * p->K;
            double r = 0, q = 0;
            for (int k = 0; k < p->K; k++) {
                double t = (double)xr[k] * wr[k];
                r += t, q += fabs(t);
            }
            double v = y[(size_t)m * p->N + n], ra = fabs(v - r) / (q > 0 ? q : 1e-300);
            dd += (v - r) * (v - r), rr += r * r;
            if (!(ra <= wa)) wa = ra;
        }
        double rel = sqrt(dd / (rr > 0 ? rr : 1e-300));
        if (!(rel <= worst)) worst = rel;
    }
    *worst_abs = wa;
    return worst;
}

static double check(const gprob *p, const float *y, int M, const int *rows, int nr, const int *cols, int nc,
                    size_t *nonfinite) {
    double wc;
    return check2(p, y, M, rows, nr, cols, nc, nonfinite, &wc);
}

/* sampled indices in [0, n): 0, n - 1, tile edges, and a spread */
static int sample(int *out, int cap, int n, unsigned salt) {
    int k = 0;
    static const int edges[] = {0, 1, 7, 8, 15, 16, 63, 64, 127, 128, 129, 255, 256, 257};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0] && k < cap; i++)
        if (edges[i] < n) out[k++] = edges[i];
    if (k < cap) out[k++] = n - 1;
    for (; k < cap; k++) out[k] = (int)(((unsigned)k * 2654435761u + salt) % (unsigned)n);
    return k;
}

#define F16_BOUND 5e-4

typedef struct rshape {
    const char *what;
    int M, N, K;
} rshape;

TEST(cuda_gemm16_vs_cpu_real_shapes) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    static const rshape shapes[] = {
        {"4B deltanet in_proj", 4096, 12352, 2560},
        {"4B attention in_proj", 4096, 10240, 2560},
        {"4B out_proj", 4096, 2560, 4096},
        {"4B gate_up", 4096, 18432, 2560},
        {"4B down", 4096, 2560, 9216},
        {"27B deltanet in_proj", 1000, 16480, 5120},
        {"27B out_proj", 1000, 5120, 6144},
        {"27B down", 1000, 5120, 17408},
    };
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const rshape *s = &shapes[si];
        gprob p;
        REQUIRE(prob_make(&p, s->M, s->N, s->K, 0.05f) == 0);
        float *y = run_f16(c, &p, 0, s->M);
        CHECK_MSG(y != NULL, "%s: the launch failed", s->what);
        if (y) {
            int rows[48], cols[96];
            int nr = sample(rows, 48, s->M, 17u * (unsigned)si),
                nc = sample(cols, 96, s->N, 31u * (unsigned)si);
            size_t nf;
            double rel = check(&p, y, s->M, rows, nr, cols, nc, &nf);
            printf("     %-22s M=%-4d N=%-5d K=%-5d worst row ||d||/||ref|| = %.2e\n", s->what, s->M, s->N,
                   s->K, rel);
            CHECK_MSG(nf == 0, "%s: %zu outputs NaN / inf / unwritten", s->what, nf);
            CHECK_MSG(rel <= F16_BOUND, "%s: ||d||/||ref|| = %.3g (bound %g)", s->what, rel, F16_BOUND);
            free(y);
        }
        prob_free(&p);
    }
    cu_ctx_destroy(c);
}

/* weights of 1e-5 .. 1e-7 (fp16 subnormals, 2^-24 steps) and 1000: what converting them costs */
TEST(cuda_gemm16_weight_range) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    static const float amps[] = {1e-3f, 1e-4f, 1e-5f, 1e-6f, 1e3f};
    for (size_t i = 0; i < sizeof amps / sizeof amps[0]; i++) {
        gprob p;
        REQUIRE(prob_make(&p, 200, 136, 264, amps[i]) == 0);
        float *y = run_f16(c, &p, 0, 200);
        REQUIRE(y != NULL);
        size_t nf;
        double rel = check(&p, y, 200, NULL, 200, NULL, 136, &nf);
        printf("     weights uniform in +-%.0e: worst row ||d||/||ref|| = %.2e\n", (double)amps[i], rel);
        CHECK_MSG(nf == 0, "weights +-%g: %zu outputs not finite", (double)amps[i], nf);
        /* |w| >= 2^-14 converts exactly; below, fp16 steps of 2^-24 (~6e-8): against weights of rms 6e-5
         * (+-1e-4) ~3e-4, of rms 6e-6 (+-1e-5) ~3e-3, of 6e-7 ~3e-2 (printed, not bounded) */
        double bound = amps[i] >= 1e-3f ? F16_BOUND : amps[i] >= 1e-4f ? 1e-3 : amps[i] >= 1e-5f ? 1e-2 : 1.0;
        CHECK_MSG(rel <= bound, "weights +-%g: ||d||/||ref|| = %.3g (bound %g)", (double)amps[i], rel, bound);
        free(y);
        prob_free(&p);
    }
    cu_ctx_destroy(c);
}

/* every correct form of the kernel: odd N and K, every output checked, the same bits from every form; M from
 * a list (rows from the middle of x) on the two tile widths: each row's bits alone = among all rows */
TEST(cuda_gemm16_ragged_and_row_independent) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    static const int Ms[] = {1, 2, 7, 9, 16, 63, 65, 127, 128, 129, 255, 257, 1000, 4095, 4096};
    static const int NK[][2] = {{264, 136}, {203, 72}, {1, 8}, {520, 2056}};
    static const int forms[] = {1, 2, 4, 5, 7, 8, 9};
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    for (size_t s = 0; s < sizeof NK / sizeof NK[0]; s++) {
        int N = NK[s][0], K = NK[s][1], Mmax = N > 300 ? 300 : 4096;
        gprob p;
        REQUIRE(prob_make(&p, Mmax, N, K, 0.05f) == 0);
        float *first = NULL;
        for (size_t fi = 0; fi < sizeof forms / sizeof forms[0]; fi++) {
            int form = forms[fi];
            cu_set_gemm_f16_variant(form);
            float *all = run_f16(c, &p, 0, Mmax);
            REQUIRE(all != NULL);
            if (first) {
                CHECK_MSG(!memcmp(all, first, (size_t)Mmax * N * 4),
                          "form %d N=%d K=%d: other bits than form %d", form, N, K, forms[0]);
                free(all);
                continue;
            }
            first = all;
            size_t nf;
            double cond, rel = check2(&p, all, Mmax, NULL, Mmax, NULL, N, &nf, &cond);
            CHECK_MSG(nf == 0, "form %d N=%d K=%d M=%d: %zu outputs not finite", form, N, K, Mmax, nf);
            /* one output a row (N = 1) can cancel: there the bound holds |d| against sum |x w| */
            double worst = N >= 64 ? rel : cond;
            CHECK_MSG(worst <= F16_BOUND, "form %d N=%d K=%d: ||d||/||ref|| = %.3g, |d| / sum |xw| %.3g",
                      form, N, K, rel, cond);
            printf("     N=%-4d K=%-4d M=%d: worst row ||d||/||ref|| = %.2e, worst |d| / sum |xw| %.2e\n", N,
                   K, Mmax, rel, cond);
        }
        for (int fi = 0; fi < 2; fi++) { /* 128 x 256 and 128 x 128 tiles */
            int form = fi ? 5 : 1, differ = 0;
            cu_set_gemm_f16_variant(form);
            for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
                int M = Ms[mi];
                if (M > Mmax) continue;
                int m0 = (Mmax - M) / 2; /* rows from the middle: any offset */
                float *y = run_f16(c, &p, m0, M);
                REQUIRE(y != NULL);
                size_t bad = 0;
                for (size_t q = 0; q < (size_t)M * N; q++) bad += !isfinite(y[q]);
                CHECK_MSG(bad == 0, "form %d N=%d K=%d M=%d: %zu outputs not finite", form, N, K, M, bad);
                if (memcmp(y, first + (size_t)m0 * N, (size_t)M * N * 4)) differ++;
                free(y);
            }
            printf("     form %d N=%-4d K=%-4d: %d of the M in 1..%d give rows other bits than among all\n",
                   form, N, K, differ, Mmax);
            CHECK_MSG(differ == 0, "form %d N=%d K=%d: %d launches gave rows other bits than among all", form,
                      N, K, differ);
        }
        free(first);
        prob_free(&p);
    }
    cu_set_gemm_f16_variant(0);
    cu_ctx_destroy(c);
}

/* cu_gemm past the GEMV rows: the f16 kernel's bits with the switch on; K % 8 != 0 falls back to cuBLAS */
TEST(cuda_gemm16_switch) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    int mode0 = cu_prefill_gemm();
    gprob p;
    REQUIRE(prob_make(&p, 100, 300, 264, 0.05f) == 0);
    float *dy = NULL;
    REQUIRE(cu_alloc((void **)&dy, (size_t)100 * 300 * 4, err, sizeof err) == 0);
    float *a = malloc((size_t)100 * 300 * 4), *b = run_f16(c, &p, 0, 100);
    REQUIRE(a && b);
    cu_set_prefill_gemm(1);
    cu_fill_f32(c, dy, (size_t)100 * 300, NAN);
    cu_gemm(c, dy, p.dx, p.dw, 100, 300, 264, p.dxb, 0);
    REQUIRE(cu_sync(c, err, sizeof err) == 0 &&
            cu_download(a, dy, (size_t)100 * 300 * 4, err, sizeof err) == 0);
    CHECK_MSG(!memcmp(a, b, (size_t)100 * 300 * 4), "cu_gemm with the switch on is not cu_gemm_f16");
    /* K = 260 (not a multiple of 8): cuBLAS takes it, still correct */
    cu_fill_f32(c, dy, (size_t)100 * 300, NAN);
    cu_gemm(c, dy, p.dx, p.dw, 100, 300, 260, p.dxb, 0);
    REQUIRE(cu_sync(c, err, sizeof err) == 0 &&
            cu_download(a, dy, (size_t)100 * 300 * 4, err, sizeof err) == 0);
    double dd = 0, rr = 0;
    for (int m = 0; m < 100; m++)
        for (int n = 0; n < 300; n++) {
            double r = 0;
            for (int k = 0; k < 260; k++) r += (double)p.x[(size_t)m * 260 + k] * p.wf[(size_t)n * 260 + k];
            double v = a[(size_t)m * 300 + n];
            dd += (v - r) * (v - r), rr += r * r;
        }
    CHECK_MSG(sqrt(dd / rr) <= 1e-2, "K = 260 through cu_gemm: ||d||/||ref|| = %.3g", sqrt(dd / rr));
    cu_set_prefill_gemm(mode0);
    free(a), free(b);
    cu_free(dy);
    prob_free(&p);
    cu_ctx_destroy(c);
}

/* ms per product: what 0 f16 (rows + GEMM), 1 f16 GEMM alone (rows converted before; the form set), 2 cuBLAS
 * one bf16 pass, 3 cuBLAS two passes (cu_gemm, conversions included) */
static double bench_ms(cu_ctx *c, int what, float *dy, const float *dx, const uint16_t *dw, uint16_t *dxb,
                       int M, int N, int K) {
    cu_timer *t;
    if (cu_timer_create(&t)) return 0;
    int reps = 10;
    double ms = 0;
    if (what == 1) cu_f16_rows(c, dxb, dx, M, K);
    if (what >= 2) cu_set_bf16_passes(what == 2 ? 1 : 2);
    for (int pass = 0; pass < 2; pass++) { /* the first pass warms up */
        cu_timer_start(c, t);
        for (int i = 0; i < (pass ? reps : 2); i++) {
            if (what == 0)
                cu_gemm_f16(c, dy, dx, dw, M, N, K, dxb);
            else if (what == 1)
                cu_gemm_f16_prepared(c, dy, dxb, dw, M, N, K);
            else
                cu_gemm(c, dy, dx, dw, M, N, K, dxb, 0);
        }
        ms = cu_timer_stop_ms(c, t) / (pass ? reps : 2);
    }
    cu_set_bf16_passes(2);
    cu_timer_destroy(t);
    return ms;
}

/* CINFER_GEMM16_BENCH=0 skips it */
TEST(cuda_gemm16_speed) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    const char *ev = getenv("CINFER_GEMM16_BENCH");
    if (ev && !strcmp(ev, "0")) SKIP("CINFER_GEMM16_BENCH=0: skipped");
    static const rshape shapes[] = {
        {"4B deltanet in_proj", 0, 12352, 2560},
        {"4B attention in_proj", 0, 10240, 2560},
        {"4B out_proj", 0, 2560, 4096},
        {"4B gate_up", 0, 18432, 2560},
        {"4B down", 0, 2560, 9216},
        {"27B deltanet in_proj", 0, 16480, 5120},
        {"27B attention in_proj", 0, 14336, 5120},
        {"27B out_proj", 0, 5120, 6144},
        {"27B gate_up", 0, 34816, 5120},
        {"27B down", 0, 5120, 17408},
    };
    static const int Ms[] = {512, 4096};
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    int mode0 = cu_prefill_gemm();
    cu_set_prefill_gemm(0);
    size_t maxx = 4096u * 17408u, maxw = 34816u * 5120u, maxy = 4096u * 34816u;
    float *dx = NULL, *dy = NULL;
    uint16_t *dw = NULL, *dxb = NULL;
    REQUIRE(cu_alloc((void **)&dx, maxx * 4, err, sizeof err) == 0);
    REQUIRE(cu_alloc((void **)&dy, maxy * 4, err, sizeof err) == 0);
    REQUIRE(cu_alloc((void **)&dw, maxw * 2, err, sizeof err) == 0);
    REQUIRE(cu_alloc((void **)&dxb, maxx * 2 * 2, err, sizeof err) == 0);
    cu_fill_random_bf16(c, dw, maxw, 0.02f, 1);
    { /* x: 4M random floats repeated (the tensor cores' clocks depend on the data: not constants) */
        size_t chunk = (size_t)1 << 22;
        float *h = malloc(chunk * 4);
        REQUIRE(h != NULL);
        for (size_t i = 0; i < chunk; i++) h[i] = frand();
        for (size_t o = 0; o < maxx; o += chunk)
            REQUIRE(cu_upload(dx + o, h, (maxx - o < chunk ? maxx - o : chunk) * 4, err, sizeof err) == 0);
        free(h);
    }
    /* columns: f16 automatic with the row conversion, the GEMM alone per form 1..9 (3 and 6: no weight
     * conversion, wrong results, speed only), cuBLAS one bf16 pass, two passes (conversions included) */
    enum { NV = 2 + CU_F16_VARIANTS + 1 };
    double tot[2][NV] = {{0}};
    printf("     TFLOP/s: f16 (rows + GEMM) | GEMM form 1 .. 9 | cuBLAS 1 pass | cuBLAS 2 passes\n");
    for (size_t mi = 0; mi < 2; mi++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const rshape *s = &shapes[si];
            int M = Ms[mi];
            double fl = 2.0 * M * s->N * s->K, ms[NV];
            ms[0] = bench_ms(c, 0, dy, dx, dw, dxb, M, s->N, s->K);
            for (int v = 1; v <= CU_F16_VARIANTS; v++) {
                cu_set_gemm_f16_variant(v);
                ms[v] = bench_ms(c, 1, dy, dx, dw, dxb, M, s->N, s->K);
            }
            cu_set_gemm_f16_variant(0);
            ms[NV - 2] = bench_ms(c, 2, dy, dx, dw, dxb, M, s->N, s->K);
            ms[NV - 1] = bench_ms(c, 3, dy, dx, dw, dxb, M, s->N, s->K);
            printf("     %-22s M=%-4d N=%-5d K=%-5d", s->what, M, s->N, s->K);
            for (int v = 0; v < NV; v++) {
                printf(" %s%.0f", v ? "| " : "", fl / (ms[v] * 1e9));
                tot[mi][v] += ms[v];
            }
            printf("  (f16 %.3f ms, cuBLAS 2 passes %.3f ms)\n", ms[0], ms[NV - 1]);
        }
    for (int mi = 0; mi < 2; mi++) {
        printf("     M=%d summed ms: f16 %.3f | GEMM forms", Ms[mi], tot[mi][0]);
        for (int v = 1; v <= CU_F16_VARIANTS; v++) printf(" %d: %.3f", v, tot[mi][v]);
        printf(" | cuBLAS 1 pass %.3f | 2 passes %.3f\n", tot[mi][NV - 2], tot[mi][NV - 1]);
    }
    CHECK(cu_sync(c, err, sizeof err) == 0);
    cu_set_prefill_gemm(mode0);
    cu_free(dx), cu_free(dy), cu_free(dw), cu_free(dxb);
    cu_ctx_destroy(c);
}

#else

TEST(cuda_gemm16_not_built) {
    SKIP("no CUDA device: skipped (built without CUDA)");
}

#endif

/* cuda_test_util.h — the small helpers the CUDA op tests (tests/unit/test_cuda_*.c) share: a seeded xorshift
 * for random inputs, device copies that record a failure instead of aborting, host copies that come back
 * NaN-filled when the download fails (so a comparison fails rather than reads garbage), the relative error
 * every bound is stated in, the packed batch metadata the layer-level kernels read (pack_meta) and the CPU
 * reference of a DeltaNet entry's conv, q / k norms and core. Include it inside the file's #ifdef
 * CINFER_CUDA, after cuda_ops.h. A file that needs its own seed (its inputs, and so the errors its bounds
 * were set on, stay as they were) defines CUDA_TEST_SEED before the include. */
#ifndef CI_TESTS_CUDA_TEST_UTIL_H
#define CI_TESTS_CUDA_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/ops.h"
#include "backend/cuda/cuda_ops.h"
#include "model/forward.h"
#include "test.h"

#ifndef CUDA_TEST_SEED
#define CUDA_TEST_SEED 0x9e3779b97f4a7c15ull
#endif

static uint64_t g_rng = CUDA_TEST_SEED;

static inline float frand(void) { /* [-1, 1) */
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

/* n values in [-scale, scale) (16 bytes of slack past the end for vector loads) */
static inline float *rnd(size_t n, float scale) {
    float *p = malloc(n * sizeof(float) + 16);
    for (size_t i = 0; i < n; i++) p[i] = frand() * scale;
    return p;
}

/* ||got - ref|| / ||ref|| (||got - ref|| where ref is zero); any NaN or inf in got gives +inf */
static inline double rel(const float *got, const float *ref, size_t n) {
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) return INFINITY;
        double e = (double)got[i] - ref[i];
        d += e * e;
        r += (double)ref[i] * ref[i];
    }
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

static inline void check_rel(const char *what, const float *got, const float *ref, size_t n, double tol) {
    double r = rel(got, ref, n);
    printf("     %-52s ||d||/||ref|| = %.2e (bound %.0e)\n", what, r, tol);
    CHECK_MSG(r <= tol, "%s: ||d||/||ref|| = %.3g > %g", what, r, tol);
}

/* bytes of zeroed device memory; NULL (and the test failed) when the allocation fails */
static inline void *dev(size_t bytes) {
    void *d = NULL;
    char err[256];
    if (cu_alloc(&d, bytes, err, sizeof err)) {
        test_fail(__FILE__, __LINE__, "cu_alloc %zu: %s", bytes, err);
        return NULL;
    }
    return d;
}

/* a device copy of h; NULL (and the test failed) when the allocation fails */
static inline void *dup_dev(const void *h, size_t bytes) {
    void *d = dev(bytes);
    char err[256];
    if (d && cu_upload(d, h, bytes, err, sizeof err)) test_fail(__FILE__, __LINE__, "upload: %s", err);
    return d;
}

/* n floats of device memory filled with NaN (c's stream): an element a kernel does not write fails */
static inline float *nan_dev(cu_ctx *c, size_t n) {
    float *d = dev(n * sizeof(float));
    if (d) cu_fill_f32(c, d, n, NAN);
    return d;
}

/* a host copy of bytes of device memory (malloc'd, never NULL); all bits set (NaN, index -1) and the test
 * failed when the download fails */
static inline void *get_bytes(const void *d, size_t bytes) {
    void *h = malloc(bytes + 16);
    char err[256];
    if (cu_download(h, d, bytes, err, sizeof err)) {
        test_fail(__FILE__, __LINE__, "download: %s", err);
        memset(h, 0xff, bytes);
    }
    return h;
}
static inline float *get(const float *d, size_t n) {
    return get_bytes(d, n * sizeof(float));
}

/* 1 when a and b hold the same bits; else 0 with the first differing index in *first */
static inline int same_bits(const float *a, const float *b, size_t n, size_t *first) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(a + i, b + i, 4)) {
            *first = i;
            return 0;
        }
    return 1;
}

/* an entry of a batch: len tokens before it, n new ones, its state slot */
typedef struct test_entry {
    int len, n, slot;
} test_entry;

/* forward_cuda.c's packed metadata for these entries (host copy returned, device copy in *dmeta, m pointing
 * into it); entry i's block table blocks[i] (NULL: zeros, for kernels that read none) */
static inline int *pack_meta(const test_entry *e, int NE, int *const *blocks, cu_meta *m, int **dmeta) {
    int T = 0;
    for (int i = 0; i < NE; i++) T += e[i].n;
    size_t nb = 0;
    for (int i = 0; i < NE; i++) nb += (size_t)(e[i].len + e[i].n + 15) / 16;
    size_t o_pos = T, o_ent = 2 * (size_t)T, o_len = 3 * (size_t)T, o_n = o_len + NE, o_r0 = o_n + NE,
           o_slot = o_r0 + NE;
    size_t o_boff = o_slot + NE, o_lrow = o_boff + NE, o_blk = o_lrow + T, tot = o_blk + nb;
    int *h = calloc(tot + 1, sizeof(int));
    int r = 0;
    size_t bo = 0;
    for (int i = 0; i < NE; i++) {
        h[o_len + i] = e[i].len, h[o_n + i] = e[i].n, h[o_r0 + i] = r, h[o_slot + i] = e[i].slot,
                  h[o_boff + i] = (int)bo;
        int k = (e[i].len + e[i].n + 15) / 16;
        for (int j = 0; j < k; j++) h[o_blk + bo + j] = blocks ? blocks[i][j] : 0;
        bo += (size_t)k;
        for (int t = 0; t < e[i].n; t++, r++)
            h[o_pos + r] = e[i].len + t, h[o_ent + r] = i, h[o_lrow + r] = r;
    }
    int *d = dup_dev(h, (tot + 1) * sizeof(int));
    *dmeta = d;
    *m = (cu_meta){d,        d + o_pos,  d + o_ent,  d + o_len,  d + o_n,
                   d + o_r0, d + o_slot, d + o_boff, d + o_lrow, d + o_blk};
    return h;
}

/* The CPU reference of a DeltaNet entry's front, as the CPU backend computes it: the causal conv (K taps over
 * C channels, weights cw [K][C]) and SiLU of its n input rows x [n][ldx] behind the K - 1 inputs of its conv
 * state st [K-1][C] (left holding the last K - 1 inputs), into co [n][C] */
static inline void ref_conv_silu(float *co, float *st, const float *cw, const float *x, int ldx, int n, int K,
                                 int C) {
    float *X = malloc((size_t)(K - 1 + n) * sizeof(float));
    for (int ch = 0; ch < C; ch++) {
        for (int j = 0; j < K - 1; j++) X[j] = st[(size_t)j * C + ch];
        for (int t = 0; t < n; t++) X[K - 1 + t] = x[(size_t)t * ldx + ch];
        for (int t = 0; t < n; t++) {
            float acc = 0.0f;
            for (int j = 0; j < K; j++) acc += cw[(size_t)j * C + ch] * X[t + j];
            co[(size_t)t * C + ch] = ops_silu(acc);
        }
        for (int j = 0; j < K - 1; j++) st[(size_t)j * C + ch] = X[n + j];
    }
    free(X);
}

/* a conv row's Hk q heads and Hk k heads (its first 2 Hk dk channels) l2-normalized, q scaled by dk^-1/2 */
static inline void ref_qk_norm(float *row, int Hk, int dk) {
    for (int h = 0; h < 2 * Hk; h++) {
        float *xx = row + (size_t)h * dk;
        ops_l2norm(xx, xx, dk, 1e-6f);
        if (h < Hk)
            for (int q = 0; q < dk; q++) xx[q] *= (float)(1.0 / sqrt((double)dk));
    }
}

/* The CPU reference of an entry's DeltaNet core over its n rows (len before them): each value head h (key
 * head h / (Hv / Hk)) by the recurrent form for a decode row, else the chunked one (tmp:
 * gdn_chunk_scratch_floats), from the conv rows co [n][C] (q, k [Hk][dk] each, v [Hv][dv]) and gates bg [n][2
 * Hv] (beta, then g); the entry's states S [Hv][dk][dv] move on; o [n][Hv dv] */
static inline void ref_gdn_core(const float *co, const float *bg, float *S, float *o, int n, int len, int Hk,
                                int Hv, int dk, int dv, float *tmp) {
    const int kd = Hk * dk, vd = Hv * dv, C = 2 * kd + vd;
    for (int h = 0; h < Hv; h++) {
        const int kh = h / (Hv / Hk);
        const float *q = co + (size_t)kh * dk, *k = co + kd + (size_t)kh * dk,
                    *v = co + 2 * kd + (size_t)h * dv;
        float *Sh = S + (size_t)h * dk * dv, *oh = o + (size_t)h * dv;
        if (n == 1 && len > 0)
            gdn_recurrent(1, q, C, k, C, v, C, bg + Hv + h, 2 * Hv, bg + h, 2 * Hv, Sh, dk, dv, oh, vd);
        else
            gdn_chunked(n, len, q, C, k, C, v, C, bg + Hv + h, 2 * Hv, bg + h, 2 * Hv, Sh, dk, dv, oh, vd,
                        tmp);
    }
}

/* The speed tests' DeltaNet layer: one entry of T rows at Hk key and Hv value heads (dk = dv = 128, K = 4),
 * random inputs with trained models' decays (softplus ~ 0.002..0.02), zero states. g: the arguments (device,
 * the chunked form's switches and scratch left to the test); scr: that scratch for cu_gdn_chunk_cap(T, 1),
 * NaN; zero: host zeros to reset the states from between runs. */
typedef struct gdn_bench {
    cu_gdn_args g;
    float *scr, *zero;
    size_t rs_n, cs_n;       /* floats of the recurrent state [Hv][dk][dv] and conv state [K-1][C] */
    int *hm, *dmeta;         /* pack_meta's */
    float *qkv, *a, *cw, *A; /* host inputs */
} gdn_bench;

static inline void gdn_bench_make(cu_ctx *c, gdn_bench *b, int Hk, int Hv, int T) {
    const int dk = 128, dv = 128, K = 4, kd = Hk * dk, vd = Hv * dv, C = 2 * kd + vd;
    test_entry ent = {0, T, 0};
    cu_meta meta;
    b->hm = pack_meta(&ent, 1, NULL, &meta, &b->dmeta);
    b->qkv = rnd((size_t)T * C, 1.0f), b->a = rnd((size_t)T * Hv, 2.0f), b->cw = rnd((size_t)K * C, 0.5f);
    for (size_t i = 0; i < (size_t)T * Hv; i++) b->a[i] = b->a[i] * 0.5f - 5.0f;
    b->A = rnd((size_t)Hv, 1.0f);
    for (int h = 0; h < Hv; h++) b->A[h] = -expf(b->A[h]);
    b->rs_n = (size_t)Hv * dk * dv, b->cs_n = (size_t)(K - 1) * C;
    b->zero = calloc(b->rs_n > b->cs_n ? b->rs_n : b->cs_n, 4);
    cu_gdn_args g = {0};
    g.T = T, g.NE = 1, g.Hk = Hk, g.Hv = Hv, g.dk = dk, g.dv = dv, g.K = K, g.C = C, g.n_lin = 1, g.lin = 0;
    g.qkv = dup_dev(b->qkv, (size_t)T * C * 4), g.qkv_ld = C, g.z = dup_dev(b->qkv, (size_t)T * vd * 4),
    g.z_ld = vd;
    g.b = dup_dev(b->qkv, (size_t)T * Hv * 4), g.a = dup_dev(b->a, (size_t)T * Hv * 4), g.ba_ld = Hv;
    g.conv_w = dup_dev(b->cw, (size_t)K * C * 4), g.A = dup_dev(b->A, (size_t)Hv * 4),
    g.dt_bias = dup_dev(b->A, Hv * 4);
    g.gnorm = dup_dev(b->cw, (size_t)dv * 4), g.conv_out = nan_dev(c, (size_t)T * C),
    g.bg = nan_dev(c, (size_t)T * 2 * Hv), g.o = nan_dev(c, (size_t)T * vd);
    g.conv_state = dup_dev(b->zero, b->cs_n * 4), g.rec_state = dup_dev(b->zero, b->rs_n * 4);
    g.eps = 1e-6f, g.meta = meta;
    b->g = g;
    b->scr = nan_dev(c, cu_gdn_chunk_bytes(cu_gdn_chunk_cap(T, 1), T, Hv, dk, dv) / 4);
}

static inline void gdn_bench_free(gdn_bench *b) {
    cu_gdn_args *g = &b->g;
    free(b->qkv), free(b->a), free(b->cw), free(b->A), free(b->zero), free(b->hm);
    cu_free((void *)g->qkv), cu_free((void *)g->z), cu_free((void *)g->b), cu_free((void *)g->a),
        cu_free((void *)g->conv_w), cu_free((void *)g->A), cu_free((void *)g->dt_bias),
        cu_free((void *)g->gnorm);
    cu_free(g->conv_out), cu_free(g->bg), cu_free(g->o), cu_free(g->conv_state), cu_free(g->rec_state);
    cu_free(b->scr), cu_free(b->dmeta);
}

/* The chunked form's cycle counts (cu_gdn_args.chunk_prof, hp [16]: its prep's first block, then a pass
 * block) over one more run of its two parts on g's inputs; 0 when it ran, else the test failed */
static inline int gdn_chunk_stamps(cu_ctx *c, cu_gdn_args *g, long long *hp) {
    long long *dp = dev(16 * sizeof(long long)); /* zeroed */
    char err[256] = "cu_gdn_chunk_part did not run";
    if (!dp) return -1;
    g->chunk_prof = dp;
    int ok = cu_gdn_chunk_part(c, g, 3) && cu_sync(c, err, sizeof err) == 0 &&
             cu_download(hp, dp, 16 * sizeof(long long), err, sizeof err) == 0;
    g->chunk_prof = NULL;
    cu_free(dp);
    if (!ok) test_fail(__FILE__, __LINE__, "the chunked form's cycle counts: %s", err);
    return ok ? 0 : -1;
}

/* The chunked form's two parts alone (prep, sequential pass) on the conv and gates g's last run left: the
 * best of reps - 1 timed runs each (the first a warm-up) into ms[2]; 0 when they ran (they move the state on)
 */
static inline int gdn_part_ms(cu_ctx *c, cu_timer *tm, cu_gdn_args *g, int reps, float *ms) {
    for (int pi = 0; pi < 2; pi++) {
        ms[pi] = 1e30f;
        for (int rep = 0; rep < reps; rep++) {
            cu_timer_start(c, tm);
            if (!cu_gdn_chunk_part(c, g, pi + 1)) {
                test_fail(__FILE__, __LINE__, "cu_gdn_chunk_part %d did not run", pi + 1);
                return -1;
            }
            float t = cu_timer_stop_ms(c, tm);
            if (rep && t < ms[pi]) ms[pi] = t;
        }
    }
    return 0;
}

#endif

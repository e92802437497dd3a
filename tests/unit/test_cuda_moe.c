/* test_cuda_moe.c — the fused decode MoE kernels (moe_fused.cu, CINFER_CUDA_MOE_FUSED=1) against the CPU MoE
 * (forward_cpu.c's moe_ffn, restated here with the CPU matmul) and against the unfused device launches they
 * replace: at the 35B-A3B shape and tiny ones, 1..8 rows, ties in the router, every output written (outputs
 * start as NaN), NaN never passing; a row alone gives the bits it has among 8; the router's block counters
 * come back to zero (graph replays). Then the MoE fixture through the whole cuda forward with the switch on
 * against it off. The prefill experts' grouped tensor-core GEMMs (moe_gemm.cu,
 * CINFER_CUDA_MOE_PREFILL=grouped) the same way. GPU only: every test skips without a device. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "cinfer.h"
#include "model/forward_cuda.h"
#include "test.h"
#include "util/bf16.h"

#ifdef CINFER_CUDA
#include "backend/cuda/cuda_ops.h"
#define CUDA_TEST_SEED 0x9e3779b9ull /* this file's inputs as before the shared helpers */
#include "cuda_test_util.h"

#define NO_DEVICE() (cuda_devices() < 1)

/* one MoE block's weights: router on the host (ties are made there), experts made on the device and copied
 * back for the reference */
typedef struct moe_case {
    const char *name;
    int H, E, k, Im, Is, norm;
    int ties; /* 1: ten experts share one dominant router row and x is positive: the lowest 8 (k) must win */
} moe_case;

typedef struct moe_w {
    uint16_t *router, *gu, *down, *sgu, *sdown, *sgw;             /* host bf16 */
    uint16_t *d_router, *d_gu, *d_down, *d_sgu, *d_sdown, *d_sgw; /* device */
} moe_w;

static const int tie_set[10] = {3, 17, 40, 41, 100, 128, 200, 201, 250, 255};

static void make_weights(cu_ctx *c, const moe_case *mc, moe_w *w) {
    int H = mc->H, E = mc->E, Im = mc->Im, Is = mc->Is;
    memset(w, 0, sizeof *w);
    w->router = malloc((size_t)E * H * 2);
    for (size_t i = 0; i < (size_t)E * H; i++) w->router[i] = f32_to_bf16(frand() * 0.05f);
    if (mc->ties)
        for (int t = 0; t < 10; t++) {
            int e = tie_set[t] % E;
            for (int i = 0; i < H; i++) w->router[(size_t)e * H + i] = f32_to_bf16(0.25f);
        }
    w->d_router = dup_dev(w->router, (size_t)E * H * 2);
    size_t ngu = (size_t)E * 2 * Im * H, ndn = (size_t)E * H * Im;
    w->d_gu = dev(ngu * 2), w->d_down = dev(ndn * 2);
    cu_fill_random_bf16(c, w->d_gu, ngu, 0.03f, 11);
    cu_fill_random_bf16(c, w->d_down, ndn, 0.03f, 12);
    if (Is) {
        w->d_sgu = dev((size_t)2 * Is * H * 2), w->d_sdown = dev((size_t)H * Is * 2),
        w->d_sgw = dev((size_t)H * 2);
        cu_fill_random_bf16(c, w->d_sgu, (size_t)2 * Is * H, 0.03f, 13);
        cu_fill_random_bf16(c, w->d_sdown, (size_t)H * Is, 0.03f, 14);
        cu_fill_random_bf16(c, w->d_sgw, (size_t)H, 0.05f, 15);
    }
    char err[256];
    CHECK(cu_sync(c, err, sizeof err) == 0);
    w->gu = get_bytes(w->d_gu, ngu * 2), w->down = get_bytes(w->d_down, ndn * 2);
    if (Is) {
        w->sgu = get_bytes(w->d_sgu, (size_t)2 * Is * H * 2),
        w->sdown = get_bytes(w->d_sdown, (size_t)H * Is * 2);
        w->sgw = get_bytes(w->d_sgw, (size_t)H * 2);
    }
}

static void free_weights(moe_w *w) {
    free(w->router), free(w->gu), free(w->down), free(w->sgu), free(w->sdown), free(w->sgw);
    cu_free(w->d_router), cu_free(w->d_gu), cu_free(w->d_down), cu_free(w->d_sgu), cu_free(w->d_sdown);
    cu_free(w->d_sgw);
}

/* The CPU MoE of one row, as forward_cpu.c's route_item + moe_ffn: softmax in f32, top-k by a stable
 * descending selection (ties to the lower index), renormalised when norm; experts in index order, each
 * output weighted and accumulated; then sigmoid(x . sh_gw) times the shared expert. idx / w in ascending
 * expert order (the fused kernels' layout); act [k Im + Is] the SwiGLU outputs in that order. */
static void cpu_row(const moe_case *mc, const moe_w *w, const float *x, int *idx, float *wt, float *act,
                    float *shg, float *out) {
    int H = mc->H, E = mc->E, k = mc->k, Im = mc->Im, Is = mc->Is;
    float *p = malloc((size_t)E * 4), *g = malloc((size_t)2 * (Im > Is ? Im : Is) * 4),
          *y = malloc((size_t)H * 4);
    cpu_matmul_ref(p, x, w->router, WT_BF16, 1, E, H);
    float mx = -INFINITY, sum = 0.0f;
    for (int e = 0; e < E; e++) mx = p[e] > mx ? p[e] : mx;
    for (int e = 0; e < E; e++) sum += (p[e] = expf(p[e] - mx));
    for (int e = 0; e < E; e++) p[e] /= sum;
    int sel[64];
    float sw[64], ws = 0.0f;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int q = 0; q < j; q++) taken |= sel[q] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        sel[j] = best, sw[j] = p[best], ws += p[best];
    }
    if (mc->norm)
        for (int j = 0; j < k; j++) sw[j] /= ws;
    for (int a = 1; a < k; a++) /* ascending expert order (distinct ids) */
        for (int b = a; b > 0 && sel[b - 1] > sel[b]; b--) {
            int ti = sel[b];
            sel[b] = sel[b - 1], sel[b - 1] = ti;
            float tw = sw[b];
            sw[b] = sw[b - 1], sw[b - 1] = tw;
        }
    memset(out, 0, (size_t)H * 4);
    for (int j = 0; j < k; j++) {
        int e = sel[j];
        idx[j] = e, wt[j] = sw[j];
        cpu_matmul_ref(g, x, w->gu + (size_t)e * 2 * Im * H, WT_BF16, 1, 2 * Im, H);
        for (int n = 0; n < Im; n++) act[(size_t)j * Im + n] = ops_silu(g[n]) * g[Im + n];
        cpu_matmul_ref(y, act + (size_t)j * Im, w->down + (size_t)e * H * Im, WT_BF16, 1, H, Im);
        for (int h = 0; h < H; h++) out[h] += y[h] * sw[j];
    }
    *shg = 0.0f;
    if (Is) {
        cpu_matmul_ref(g, x, w->sgu, WT_BF16, 1, 2 * Is, H);
        float *as = act + (size_t)k * Im;
        for (int n = 0; n < Is; n++) as[n] = ops_silu(g[n]) * g[Is + n];
        cpu_matmul_ref(y, as, w->sdown, WT_BF16, 1, H, Is);
        cpu_matmul_ref(shg, x, w->sgw, WT_BF16, 1, 1, H);
        float gt = ops_sigmoid(*shg);
        for (int h = 0; h < H; h++) out[h] += gt * y[h];
    }
    free(p), free(g), free(y);
}

/* device outputs of one fused run */
typedef struct fused_out {
    int *idx;
    float *w, *act, *shg, *out, *xn; /* xn: the router's normed rows (only with d_nw) */
} fused_out;

static void free_out(fused_out *o) {
    free(o->idx), free(o->w), free(o->act), free(o->shg), free(o->out), free(o->xn);
}

/* the three kernels over T rows of x (device); outputs start as NaN; returns them on the host. Then the down
 * kernel once more in its residual form. */
static int run_fused(cu_ctx *c, const moe_case *mc, const moe_w *w, const float *d_x, int T, int variant,
                     const float *d_nw, fused_out *o) {
    int E = mc->E, k = mc->k, A = mc->k * mc->Im + mc->Is;
    char err[256];
    cu_moe_args a = {0};
    a.T = T, a.H = mc->H, a.E = E, a.k = k, a.Im = mc->Im, a.Is = mc->Is, a.norm = mc->norm, a.x = d_x;
    a.router = w->d_router, a.e_gu = w->d_gu, a.e_down = w->d_down, a.variant = variant;
    a.sh_gu = w->d_sgu, a.sh_down = w->d_sdown, a.sh_gw = w->d_sgw;
    a.logits = dev((size_t)T * E * 4), a.idx = dev((size_t)T * k * 4), a.w = dev((size_t)T * k * 4);
    a.count = dev((size_t)T * 4), a.act = dev((size_t)T * A * 4), a.shg = dev((size_t)T * 4);
    a.out = dev((size_t)T * mc->H * 4);
    if (d_nw) { /* d_x is the raw residual: the router takes the norm */
        a.norm_w = d_nw, a.eps = 1e-6f, a.xn = dev((size_t)T * mc->H * 4);
        cu_fill_f32(c, a.xn, (size_t)T * mc->H, NAN);
    }
    cu_fill_f32(c, (float *)a.idx, (size_t)T * k, NAN); /* as ints: 0x7fc00000, no expert */
    cu_fill_f32(c, a.w, (size_t)T * k, NAN);
    cu_fill_f32(c, a.act, (size_t)T * A, NAN);
    cu_fill_f32(c, a.shg, (size_t)T, NAN);
    cu_fill_f32(c, a.out, (size_t)T * mc->H, NAN);
    /* each kernel alone, in order (the tests below look at every intermediate) */
    cu_moe_fused_route(c, &a);
    cu_moe_fused_gate_up(c, &a);
    cu_moe_fused_down(c, &a);
    int rc = cu_sync(c, err, sizeof err);
    CHECK_MSG(rc == 0, "fused MoE %s T=%d: %s", mc->name, T, err);
    o->idx = get_bytes(a.idx, (size_t)T * k * 4), o->w = get_bytes(a.w, (size_t)T * k * 4);
    o->act = get_bytes(a.act, (size_t)T * A * 4), o->shg = get_bytes(a.shg, (size_t)T * 4);
    o->out = get_bytes(a.out, (size_t)T * mc->H * 4);
    o->xn = d_nw ? get_bytes(a.xn, (size_t)T * mc->H * 4) : NULL;
    /* the residual form: resid += the same sums, bit for bit the host's f32 add, and out left alone */
    float *res = malloc((size_t)T * mc->H * 4);
    for (size_t i = 0; i < (size_t)T * mc->H; i++) res[i] = frand() * 4.0f;
    a.resid = dup_dev(res, (size_t)T * mc->H * 4);
    cu_fill_f32(c, a.out, (size_t)T * mc->H, 7.0f);
    cu_moe_fused_down(c, &a);
    CHECK(cu_sync(c, err, sizeof err) == 0);
    float *res2 = get_bytes(a.resid, (size_t)T * mc->H * 4), *out2 = get_bytes(a.out, (size_t)T * mc->H * 4);
    int bad = 0;
    for (size_t i = 0; i < (size_t)T * mc->H; i++) {
        float want = res[i] + o->out[i];
        bad += memcmp(&res2[i], &want, 4) != 0 || out2[i] != 7.0f;
    }
    CHECK_MSG(!bad, "fused MoE %s T=%d: %d elements of the residual form wrong", mc->name, T, bad);
    free(res), free(res2), free(out2);
    cu_free(a.resid);
    unsigned *cnt = get_bytes(a.count, (size_t)T * 4);
    for (int r = 0; r < T; r++) CHECK_MSG(cnt[r] == 0, "router counter of row %d left at %u", r, cnt[r]);
    free(cnt);
    cu_free(a.logits), cu_free(a.idx), cu_free(a.w), cu_free(a.count), cu_free(a.act), cu_free(a.shg);
    cu_free(a.out), cu_free(a.xn);
    return rc;
}

/* the unfused decode launches forward_cuda.c's moe() makes today (device_only): out [T][H] on the host */
static float *run_unfused(cu_ctx *c, const moe_case *mc, const moe_w *w, const float *d_x, int T) {
    int H = mc->H, E = mc->E, k = mc->k, Im = mc->Im, Is = mc->Is, S = T * k;
    char err[256];
    float *lg = dev((size_t)T * E * 4), *wt = dev((size_t)S * 4), *gu = dev((size_t)S * 2 * Im * 4);
    float *ea = dev((size_t)S * Im * 4), *ey = dev((size_t)S * H * 4), *out = dev((size_t)T * H * 4);
    int *idx = dev((size_t)S * 4), *ident = dev((size_t)S * 4);
    float *shp = Is ? dev((size_t)T * 2 * Is * 4) : NULL, *sha = Is ? dev((size_t)T * Is * 4) : NULL;
    float *shy = Is ? dev((size_t)T * H * 4) : NULL, *shg = Is ? dev((size_t)T * 4) : NULL;
    int *hid = malloc((size_t)S * 4);
    for (int i = 0; i < S; i++) hid[i] = i;
    CHECK(cu_upload(ident, hid, (size_t)S * 4, err, sizeof err) == 0);
    cu_gemm(c, lg, d_x, w->d_router, T, E, H, NULL, 1);
    cu_moe_route(c, lg, idx, wt, T, E, k, mc->norm);
    cu_moe_sort_slots(c, idx, wt, T, k);
    cu_gemv_indexed(c, gu, d_x, k, w->d_gu, idx, S, 2 * Im, H);
    cu_swiglu(c, ea, gu, S, Im);
    cu_gemv_indexed(c, ey, ea, 1, w->d_down, idx, S, H, Im);
    if (Is) {
        cu_gemm(c, shp, d_x, w->d_sgu, T, 2 * Is, H, NULL, 0);
        cu_swiglu(c, sha, shp, T, Is);
        cu_gemm(c, shy, sha, w->d_sdown, T, H, Is, NULL, 0);
        cu_gemm(c, shg, d_x, w->d_sgw, T, 1, H, NULL, 1);
    }
    cu_moe_combine(c, out, ey, ident, wt, T, k, H, shy, shg);
    CHECK(cu_sync(c, err, sizeof err) == 0);
    float *h = get_bytes(out, (size_t)T * H * 4);
    cu_free(lg), cu_free(wt), cu_free(gu), cu_free(ea), cu_free(ey), cu_free(out), cu_free(idx);
    cu_free(ident), cu_free(shp), cu_free(sha), cu_free(shy), cu_free(shg);
    free(hid);
    return h;
}

static void moe_case_run(const moe_case *mc) {
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    REQUIRE(cu_moe_fused_supported(mc->H, mc->E, mc->k, mc->Im, mc->Is));
    int H = mc->H, k = mc->k, A = mc->k * mc->Im + mc->Is, T = 8;
    moe_w w;
    make_weights(c, mc, &w);
    float *x = malloc((size_t)T * H * 4);
    for (size_t i = 0; i < (size_t)T * H; i++) x[i] = mc->ties ? fabsf(frand()) + 0.1f : frand() * 1.5f;
    float *d_x = dup_dev(x, (size_t)T * H * 4);
    /* the CPU reference, row by row */
    int *ridx = malloc((size_t)T * k * 4);
    float *rw = malloc((size_t)T * k * 4), *ract = malloc((size_t)T * A * 4), *rshg = malloc((size_t)T * 4);
    float *rout = malloc((size_t)T * H * 4);
    for (int r = 0; r < T; r++)
        cpu_row(mc, &w, x + (size_t)r * H, ridx + (size_t)r * k, rw + (size_t)r * k, ract + (size_t)r * A,
                rshg + r, rout + (size_t)r * H);
    if (mc->ties) { /* the reference itself: the 8 lowest of the tied set, equal weights */
        int E = mc->E, bad = 0;
        for (int r = 0; r < T; r++)
            for (int j = 0; j < k; j++) bad |= ridx[r * k + j] != tie_set[j] % E;
        CHECK_MSG(!bad, "%s: the CPU reference did not pick the lowest tied experts", mc->name);
    }
    fused_out o8;
    REQUIRE(run_fused(c, mc, &w, d_x, T, 0, NULL, &o8) == 0);
    /* the router's own RMSNorm (variant 8): from raw rows, the bits of cu_add_rmsnorm's rows, then of the run
     * on them */
    {
        float *raw = malloc((size_t)T * H * 4), *nw = malloc((size_t)H * 4);
        for (size_t i = 0; i < (size_t)T * H; i++) raw[i] = frand() * 3.0f;
        for (int i = 0; i < H; i++) nw[i] = 1.0f + 0.2f * frand();
        float *d_raw = dup_dev(raw, (size_t)T * H * 4), *d_nw = dup_dev(nw, (size_t)H * 4);
        float *d_xn = dev((size_t)T * H * 4);
        cu_add_rmsnorm(c, d_raw, NULL, d_xn, d_nw, T, H, 1e-6f);
        fused_out on, onn;
        int rc1 = run_fused(c, mc, &w, d_xn, T, 0, NULL, &on),
            rc2 = run_fused(c, mc, &w, d_raw, T, 8, d_nw, &onn);
        float *xn_ref = get_bytes(d_xn, (size_t)T * H * 4);
        if (!rc1 && !rc2) {
            int same =
                !memcmp(onn.xn, xn_ref, (size_t)T * H * 4) && !memcmp(on.idx, onn.idx, (size_t)T * k * 4) &&
                !memcmp(on.w, onn.w, (size_t)T * k * 4) && !memcmp(on.act, onn.act, (size_t)T * A * 4) &&
                !memcmp(on.out, onn.out, (size_t)T * H * 4);
            printf("     %-52s %s\n", "  router's own norm vs cu_add_rmsnorm first",
                   same ? "bit-identical" : "DIFFERENT");
            CHECK_MSG(same, "%s: the router's norm differs from cu_add_rmsnorm then the fused block",
                      mc->name);
        }
        free_out(&on), free_out(&onn);
        free(raw), free(nw), free(xn_ref);
        cu_free(d_raw), cu_free(d_nw), cu_free(d_xn);
    }
    /* the variants (CINFER_CUDA_MOE_VARIANT: PDL launches 4, shared expert into L2 8192, selection in the
     * expert kernels 16384, there in fewer dependent steps 32768): the same bits, idx / w included (16384:
     * written by gate_up's block 0) */
    static const int vlist[] = {4,     8192,  8196,  16384, 16388, 24580, 49152,
                                49156, 57348, 32768, 32772, 40964, 122884};
    for (size_t vi = 0; vi < sizeof vlist / sizeof vlist[0]; vi++) {
        int v = vlist[vi];
        if (v & 8) continue; /* the router's own norm: its check above */
        fused_out ov;
        if (!run_fused(c, mc, &w, d_x, T, v, NULL, &ov))
            CHECK_MSG(!memcmp(ov.idx, o8.idx, (size_t)T * k * 4) && !memcmp(ov.w, o8.w, (size_t)T * k * 4) &&
                          !memcmp(ov.act, o8.act, (size_t)T * A * 4) &&
                          !memcmp(ov.out, o8.out, (size_t)T * H * 4),
                      "%s: variant %d differs from variant 0", mc->name, v);
        free_out(&ov);
    }
    /* the selection in the expert kernels (16388, 49156), row 0 alone: the bits it has among T rows */
    for (int sv = 16388; T > 1 && sv <= 49156; sv += 32768) {
        fused_out o1;
        if (!run_fused(c, mc, &w, d_x, 1, sv, NULL, &o1))
            CHECK_MSG(!memcmp(o1.idx, o8.idx, (size_t)k * 4) && !memcmp(o1.w, o8.w, (size_t)k * 4) &&
                          !memcmp(o1.act, o8.act, (size_t)A * 4) && !memcmp(o1.out, o8.out, (size_t)H * 4),
                      "%s: variant %d, row 0 alone differs from row 0 among %d", mc->name, sv, T);
        free_out(&o1);
    }
    char what[160];
    /* every row count 1..8: the first T rows of the same x; each row must hold the bits it has among 8 */
    for (int t = 1; t <= T; t++) {
        fused_out o = o8;
        if (t < T && run_fused(c, mc, &w, d_x, t, 0, NULL, &o)) {
            free_out(&o);
            continue;
        }
        int same_idx = !memcmp(o.idx, ridx, (size_t)t * k * 4);
        CHECK_MSG(same_idx, "%s T=%d: chosen experts differ from the CPU's", mc->name, t);
        if (t == 1 || t == T) {
            snprintf(what, sizeof what, "%s T=%d router weights vs CPU", mc->name, t);
            check_rel(what, o.w, rw, (size_t)t * k, 1e-5);
            snprintf(what, sizeof what, "%s T=%d gate_up+SwiGLU vs CPU", mc->name, t);
            check_rel(what, o.act, ract, (size_t)t * A, 1e-5);
            if (mc->Is) {
                snprintf(what, sizeof what, "%s T=%d shared gate logit vs CPU", mc->name, t);
                check_rel(what, o.shg, rshg, (size_t)t, 1e-5);
            }
            snprintf(what, sizeof what, "%s T=%d down+combine vs CPU", mc->name, t);
            check_rel(what, o.out, rout, (size_t)t * H, 1e-5);
        } else {
            CHECK_MSG(rel(o.out, rout, (size_t)t * H) <= 1e-5, "%s T=%d: output off the CPU's", mc->name, t);
        }
        /* equal probabilities: equal weights within a row, 1/k up to the rounding of their sum (rows differ
         * in the last bits where the untied experts' share of the softmax differs) */
        for (int i = 0; mc->ties && i < t * k; i++) {
            float w0 = o.w[i - i % k];
            CHECK_MSG(o.w[i] == w0 && fabsf(o.w[i] - 1.0f / (float)k) < 1e-6f,
                      "%s: tied weights %.9g and %.9g", mc->name, o.w[i], w0);
            if (o.w[i] != w0 || !(fabsf(o.w[i] - 1.0f / (float)k) < 1e-6f)) break;
        }
        if (t < T) {
            int same = !memcmp(o.idx, o8.idx, (size_t)t * k * 4) && !memcmp(o.w, o8.w, (size_t)t * k * 4) &&
                       !memcmp(o.act, o8.act, (size_t)t * A * 4) && !memcmp(o.out, o8.out, (size_t)t * H * 4);
            CHECK_MSG(same, "%s: the first %d rows differ from the same rows among 8", mc->name, t);
            free_out(&o);
        }
    }
    /* against the unfused launches it replaces (same products, same orders: the same bits expected) */
    float *uout = run_unfused(c, mc, &w, d_x, T);
    double ru = rel(o8.out, uout, (size_t)T * H);
    int bits = !memcmp(o8.out, uout, (size_t)T * H * 4);
    printf("     %-52s ||d||/||ref|| = %.2e (%s)\n", "  vs the unfused device launches, 8 rows", ru,
           bits ? "bit-identical" : "not bit-identical");
    CHECK_MSG(ru <= 1e-6, "%s: fused vs unfused %.3g", mc->name, ru);
    free(uout);
    free_out(&o8);
    free(x), free(ridx), free(rw), free(ract), free(rshg), free(rout);
    cu_free(d_x);
    free_weights(&w);
    cu_ctx_destroy(c);
}

TEST(cuda_moe_fused_35b_shape) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    moe_case mc = {"35B-A3B", 2048, 256, 8, 512, 512, 1, 0};
    moe_case_run(&mc);
}

TEST(cuda_moe_fused_35b_shape_ties) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    moe_case mc = {"35B-A3B ties", 2048, 256, 8, 512, 512, 1, 1};
    moe_case_run(&mc);
}

/* the 122B-A10B / 397B-A17B expert width (Im 1024: the down kernel's four-chunk form), 64 experts */
TEST(cuda_moe_fused_im1024) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    moe_case mc = {"Im 1024 (122B-A10B experts, 64 of them)", 3072, 64, 8, 1024, 1024, 1, 0};
    moe_case_run(&mc);
}

TEST(cuda_moe_fused_tiny_shapes) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    moe_case fixture = {"fixture shape", 64, 8, 2, 32, 64, 1, 0};
    moe_case_run(&fixture);
    moe_case noshared = {"no shared, no renorm", 200, 40, 5, 24, 0, 0, 0};
    moe_case_run(&noshared);
    moe_case ties = {"tiny ties (k 8 of 10 tied)", 72, 256, 8, 16, 40, 1, 1};
    moe_case_run(&ties);
    moe_case wide = {"1024 experts top-32", 136, 1024, 32, 48, 0, 1, 0};
    moe_case_run(&wide);
}

/* shapes the kernels do not take are refused (the forward keeps the unfused launches for them) */
TEST(cuda_moe_fused_supported_shapes) {
    CHECK(cu_moe_fused_supported(2048, 256, 8, 512, 512));
    CHECK(cu_moe_fused_supported(64, 8, 2, 32, 64));
    CHECK(cu_moe_fused_supported(64, 8, 2, 32, 0));
    CHECK(!cu_moe_fused_supported(60, 8, 2, 32, 64));         /* H % 8 */
    CHECK(cu_moe_fused_supported(3072, 256, 8, 1024, 1024));  /* 122B-A10B */
    CHECK(cu_moe_fused_supported(4096, 512, 10, 1024, 1024)); /* 397B-A17B */
    CHECK(cu_moe_fused_supported(2048, 512, 10, 512, 512));   /* Qwen3-Next 80B */
    CHECK(!cu_moe_fused_supported(64, 8, 2, 1032, 64));       /* Im past 1024 */
    CHECK(!cu_moe_fused_supported(64, 2048, 2, 32, 64));
    CHECK(!cu_moe_fused_supported(64, 8, 9, 32, 64)); /* k > E */
    CHECK(!cu_moe_fused_supported(64, 64, 33, 32, 64));
}

/* sets (value) or unsets (NULL) an environment variable, returning its old value (strdup'd, or NULL) */
static char *env_swap(const char *name, const char *value) {
    const char *o = getenv(name);
    char *old = o ? strdup(o) : NULL;
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
    return old;
}
static void env_restore(const char *name, char *old) {
    if (old)
        setenv(name, old, 1);
    else
        unsetenv(name);
    free(old);
}

/* the MoE fixture: B (<= 16) sequences, a prefill of 2 tokens each, then 10 decode steps (graphs unless
 * CINFER_CUDA_GRAPHS=0); logits [11][B][V] into out, under the switches as given (gemm_rows: the grouped
 * GEMMs from that many rows on, CINFER_CUDA_MOE_PREFILL=grouped) */
static int model_steps(cinfer_model *m, int V, int B, const char *fused, const char *fuse, const char *graphs,
                       const char *gemm_rows, float *out) {
    enum { P = 2, N = 10 };
    char err[512];
    char *o1 = env_swap("CINFER_CUDA_MOE_FUSED", fused), *o2 = env_swap("CINFER_CUDA_FUSE", fuse),
         *o3 = env_swap("CINFER_CUDA_GRAPHS", graphs), *o4 = env_swap("CINFER_CUDA_MOE_GEMM_ROWS", gemm_rows),
         *o5 = env_swap("CINFER_CUDA_MOE_PREFILL", gemm_rows ? "grouped" : "host");
    cinfer_ctx_params p = cinfer_ctx_default_params();
    p.max_seqs = B, p.max_ctx = 64, p.max_batch = 64, p.n_threads = 2, p.device = CINFER_DEVICE_CUDA;
    cinfer_ctx *c = NULL;
    int rc = cinfer_ctx_create(m, &p, &c, err, sizeof err);
    env_restore("CINFER_CUDA_MOE_FUSED", o1), env_restore("CINFER_CUDA_FUSE", o2);
    env_restore("CINFER_CUDA_GRAPHS", o3), env_restore("CINFER_CUDA_MOE_GEMM_ROWS", o4);
    env_restore("CINFER_CUDA_MOE_PREFILL", o5);
    if (rc) {
        test_fail(__FILE__, __LINE__, "cuda context: %s", err);
        return rc;
    }
    int seqs[16];
    int32_t prompt[16][P];
    cinfer_batch_entry be[16];
    for (int s = 0; s < B; s++) {
        seqs[s] = cinfer_seq_open(c, err, sizeof err);
        for (int i = 0; i < P; i++) prompt[s][i] = (int32_t)((i * 13 + s * 5 + 2) % V);
        be[s] = (cinfer_batch_entry){seqs[s], prompt[s], P, 0};
    }
    rc = cinfer_forward(c, be, B, out, err, sizeof err);
    for (int t = 0; t < N && !rc; t++) {
        int32_t ids[16];
        for (int s = 0; s < B; s++) {
            ids[s] = (int32_t)((t * 31 + s * 7 + 1) % V);
            be[s] = (cinfer_batch_entry){seqs[s], &ids[s], 1, 0};
        }
        rc = cinfer_forward(c, be, B, out + (size_t)(t + 1) * B * V, err, sizeof err);
    }
    if (rc) test_fail(__FILE__, __LINE__, "forward: %s", err);
    cinfer_ctx_destroy(c);
    return rc;
}

/* The MoE fixture through the whole cuda forward with CINFER_CUDA_MOE_FUSED=1 against =0: within f32 rounding
 * (the same bits expected: at up to 8 rows every product of the unfused path is a GEMV of the same order);
 * the same under CINFER_CUDA_FUSE=1, where the fused MoE adds into the residual itself and the next layer's
 * norm goes into its in_proj (1e-5); and graphs against eager launches with it on (bit for bit) */
TEST(cuda_moe_fused_model_matches_unfused) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    char dir[512], err[512];
    snprintf(dir, sizeof dir, "%s/qwen35_moe", test_fixtures_dir());
    cinfer_model *m;
    REQUIRE(cinfer_model_open(dir, &m, err, sizeof err) == 0);
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    int V = info.vocab_size;
    size_t n = (size_t)11 * 3 * V;
    float *big = malloc((size_t)11 * 12 * V * 4), *big2 = malloc((size_t)11 * 12 * V * 4);
    float *ref = malloc(n * 4), *got = malloc(n * 4);
    static const char *const fuse[2] = {"0", "1"}; /* CINFER_CUDA_FUSE is on by default */
    for (int fz = 0; fz < 2; fz++) {
        if (model_steps(m, V, 3, "0", fuse[fz], NULL, NULL, ref) ||
            model_steps(m, V, 3, "1", fuse[fz], NULL, NULL, got))
            break;
        double r = rel(got, ref, n);
        int bits = !memcmp(ref, got, n * sizeof(float));
        printf("     qwen35_moe 3 x (2 + 10 steps)%s: fused vs unfused MoE ||d||/||ref|| = %.2e (%s)\n",
               fz ? ", CINFER_CUDA_FUSE=1" : "", r, bits ? "bit-identical" : "not bit-identical");
        CHECK_MSG(r <= 1e-5, "fused MoE forward (FUSE %d) differs from the unfused one by %.3g", fz, r);
    }
    /* graphs against eager launches, the fused MoE on */
    if (!model_steps(m, V, 3, "1", NULL, "0", NULL, ref) && !model_steps(m, V, 3, "1", NULL, NULL, NULL, got))
        CHECK_MSG(!memcmp(ref, got, n * sizeof(float)), "fused MoE: CUDA graphs differ from eager launches");
    /* in graphs, against the default variant (122892: PDL launches, the router taking the norm and
     * requesting the shared expert into L2, the selection in the expert kernels at one row, its fast form):
     * 0 (none of it), 4 (the norm kernel launched), 8, 12 (no shared-expert prefetch), 8204 (the form before
     * session 9), ...: the same bits */
    static const char *const vars[] = {"0",     "4",     "8",    "12",    "16384", "16396",
                                       "24588", "49164", "8204", "40972", "57356"};
    for (int vi = 0; vi < (int)(sizeof vars / sizeof vars[0]); vi++) {
        char *ov = env_swap("CINFER_CUDA_MOE_VARIANT", vars[vi]);
        if (!model_steps(m, V, 3, "1", NULL, NULL, NULL, got))
            CHECK_MSG(!memcmp(ref, got, n * sizeof(float)), "fused MoE variant %s differs from the default",
                      vars[vi]);
        env_restore("CINFER_CUDA_MOE_VARIANT", ov);
    }
    /* one sequence (decode steps of one row: where moe() lets the expert kernels select, 16384) in graphs:
     * those variants against the default, bit for bit */
    size_t n1 = (size_t)11 * V;
    if (!model_steps(m, V, 1, "1", NULL, NULL, NULL, ref)) {
        static const char *const vars1[] = {"24588", "8204", "40972", "16384", "57356"};
        for (int vi = 0; vi < 5; vi++) {
            char *ov = env_swap("CINFER_CUDA_MOE_VARIANT", vars1[vi]);
            if (!model_steps(m, V, 1, "1", NULL, NULL, NULL, got))
                CHECK_MSG(!memcmp(ref, got, n1 * sizeof(float)),
                          "fused MoE variant %s differs from the default at one row", vars1[vi]);
            env_restore("CINFER_CUDA_MOE_VARIANT", ov);
        }
    }
    /* 12 sequences (24 prefill rows, then 12-row decode steps) on the grouped tensor-core GEMMs
     * (CINFER_CUDA_MOE_GEMM_ROWS=9) against the default device path (1e-4: tensor cores, hi + lo), and their
     * graphs against eager launches bit for bit */
    size_t n12 = (size_t)11 * 12 * V;
    if (!model_steps(m, V, 12, NULL, NULL, NULL, NULL, big) &&
        !model_steps(m, V, 12, NULL, NULL, NULL, "9", big2)) {
        double r = rel(big2, big, n12);
        printf("     qwen35_moe 12 x (2 + 10 steps): grouped GEMMs from 9 rows vs default ||d||/||ref|| = "
               "%.2e\n",
               r);
        CHECK_MSG(r <= 1e-4, "grouped GEMM decode differs from the default path by %.3g", r);
        if (!model_steps(m, V, 12, NULL, NULL, "0", "9", big))
            CHECK_MSG(!memcmp(big, big2, n12 * sizeof(float)),
                      "grouped GEMM decode: CUDA graphs differ from eager launches");
    }
    free(ref), free(got), free(big), free(big2);
    cinfer_model_close(m);
}

/* Device time of each fused kernel at the 35B-A3B shape (random weights made on the device, 1.5 GB of
 * experts: 16 sets of rows with their own choices rotate, so the chosen experts mostly come from HBM, not
 * L2), per load-batching variant, with the bytes each kernel must read; and the unfused launches for
 * comparison. Prints only (a measurement): what chooses the default variant. */
TEST(cuda_moe_fused_speed) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    /* NSH copies of the router and the shared expert (7.3 MB each, 58 MB in all: more than L2, as the 40
     * layers of the model are), set i using copy i % NSH */
    enum { SETS = 16, REPS = 48, NSH = 8 };
    int H = 2048, E = 256, k = 8, Im = 512, Is = 512, A = k * Im + Is;
    size_t ngu = (size_t)E * 2 * Im * H, ndn = (size_t)E * H * Im;
    size_t nrt = (size_t)E * H, nsgu = (size_t)2 * Is * H, nsdn = (size_t)H * Is;
    uint16_t *router = dev(NSH * nrt * 2), *gu = dev(ngu * 2), *dn = dev(ndn * 2);
    uint16_t *sgu = dev(NSH * nsgu * 2), *sdn = dev(NSH * nsdn * 2), *sgw = dev((size_t)NSH * H * 2);
    cu_fill_random_bf16(c, router, NSH * nrt, 0.05f, 31);
    cu_fill_random_bf16(c, gu, ngu, 0.03f, 32);
    cu_fill_random_bf16(c, dn, ndn, 0.03f, 33);
    cu_fill_random_bf16(c, sgu, NSH * nsgu, 0.03f, 34);
    cu_fill_random_bf16(c, sdn, NSH * nsdn, 0.03f, 35);
    cu_fill_random_bf16(c, sgw, (size_t)NSH * H, 0.05f, 36);
    cu_timer *tm;
    REQUIRE(cu_timer_create(&tm) == 0);
    for (int T = 1; T <= 8; T += 7) {
        float *x = malloc((size_t)SETS * T * H * 4);
        for (size_t i = 0; i < (size_t)SETS * T * H; i++) x[i] = frand() * 1.5f;
        float *dx = dup_dev(x, (size_t)SETS * T * H * 4);
        int *idx = dev((size_t)SETS * T * k * 4);
        float *wt = dev((size_t)SETS * T * k * 4), *lg = dev((size_t)T * E * 4),
              *act = dev((size_t)SETS * T * A * 4);
        float *shg = dev((size_t)SETS * T * 4), *out = dev((size_t)T * H * 4);
        unsigned *cnt = dev((size_t)T * 4);
        cu_moe_args a = {0};
        a.T = T, a.H = H, a.E = E, a.k = k, a.Im = Im, a.Is = Is, a.norm = 1, a.e_gu = gu;
        a.e_down = dn, a.logits = lg, a.count = cnt, a.out = out;
#define SET(i)                                                                                               \
    (a.x = dx + (size_t)(i)*T * H, a.idx = idx + (size_t)(i)*T * k, a.w = wt + (size_t)(i)*T * k,            \
     a.act = act + (size_t)(i)*T * A, a.shg = shg + (size_t)(i)*T,                                           \
     a.router = router + (size_t)((i) % NSH) * nrt, a.sh_gu = sgu + (size_t)((i) % NSH) * nsgu,              \
     a.sh_down = sdn + (size_t)((i) % NSH) * nsdn, a.sh_gw = sgw + (size_t)((i) % NSH) * H)
        for (int i = 0; i < SETS; i++) { /* every set's choices and activations, once */
            SET(i);
            cu_moe_fused(c, &a);
        }
        REQUIRE(cu_sync(c, err, sizeof err) == 0);
        double b_rt = (double)E * H * 2, b_gu = (double)T * ((double)k * 2 * Im * H + 2.0 * Is * H + H) * 2,
               b_dn = (double)T * ((double)k * H * Im + (double)H * Is) * 2;
        static const int kv[] = {0};
        for (size_t ki = 0; ki < sizeof kv / sizeof kv[0]; ki++) {
            int v = kv[ki];
            a.variant = v;
            /* the REPS launches captured into one CUDA graph and replayed (as decode steps run): device time
             * without the host's launch rate, which bounds eager launches of ~10 us kernels */
            double us[3];
            for (int kind = 0; kind < 3; kind++) {
                void *exec = NULL;
                us[kind] = -1;
                if (cu_capture_begin(c, err, sizeof err)) continue;
                for (int r = 0; r < REPS; r++) {
                    SET(r % SETS);
                    if (kind == 0)
                        cu_moe_fused_route(c, &a);
                    else if (kind == 1)
                        cu_moe_fused_gate_up(c, &a);
                    else
                        cu_moe_fused_down(c, &a);
                }
                if (cu_capture_end(c, &exec, err, sizeof err) || cu_graph_launch(c, exec, err, sizeof err)) {
                    test_fail(__FILE__, __LINE__, "graph: %s", err);
                    continue;
                }
                cu_timer_start(c, tm);
                cu_graph_launch(c, exec, err, sizeof err);
                us[kind] = cu_timer_stop_ms(c, tm) * 1000.0 / REPS;
                cu_graph_destroy(exec);
            }
            printf(
                "     35B-A3B T=%d variant %d, graphs: router %6.1f us, gate_up %6.1f us (%4.0f GB/s), down "
                "%6.1f us (%4.0f GB/s), all %6.1f us\n",
                T, v, us[0], us[1], b_gu / us[1] / 1e3, us[2], b_dn / us[2] / 1e3, us[0] + us[1] + us[2]);
        }
        /* 4: PDL launches; 8: the router takes the norm before the block (one launch less in the model);
         * 16384: the selection in the expert kernels, 32768: any selection in fewer steps, 65536: down
         * released after gate_up's selection (alternating) */
        static const int vs[] = {0,     4,     8,      12,   8204,  57356,  122892,
                                 40972, 57356, 122892, 8204, 57356, 122892, 24588};
        float *nw = dev((size_t)H * 4), *xn = dev((size_t)T * H * 4);
        cu_fill_f32(c, nw, (size_t)H, 1.0f);
        for (size_t vi = 0; vi < sizeof vs / sizeof vs[0]; vi++) {
            a.variant = vs[vi];
            a.norm_w = vs[vi] & 8 ? nw : NULL, a.eps = 1e-6f, a.xn = xn;
            void *exec = NULL;
            if (cu_capture_begin(c, err, sizeof err)) continue;
            for (int r = 0; r < REPS; r++) {
                SET(r % SETS);
                cu_moe_fused(c, &a);
            }
            if (cu_capture_end(c, &exec, err, sizeof err) || cu_graph_launch(c, exec, err, sizeof err)) {
                test_fail(__FILE__, __LINE__, "graph: %s", err);
                continue;
            }
            cu_timer_start(c, tm);
            cu_graph_launch(c, exec, err, sizeof err);
            double all = cu_timer_stop_ms(c, tm) * 1000.0 / REPS;
            cu_graph_destroy(exec);
            printf("     35B-A3B T=%d variant %d, graphs: the three back to back %.1f us for %.1f MB (%.0f "
                   "GB/s)\n",
                   T, vs[vi], all, (b_rt + b_gu + b_dn) / 1e6, (b_rt + b_gu + b_dn) / all / 1e3);
        }
        a.variant = 0, a.norm_w = NULL;
        cu_free(nw), cu_free(xn);
#undef SET
        REQUIRE(cu_sync(c, err, sizeof err) == 0);
        free(x);
        cu_free(dx), cu_free(idx), cu_free(wt), cu_free(lg), cu_free(act), cu_free(shg), cu_free(out),
            cu_free(cnt);
    }
    cu_timer_destroy(tm);
    cu_free(router), cu_free(gu), cu_free(dn), cu_free(sgu), cu_free(sdn), cu_free(sgw);
    cu_ctx_destroy(c);
}

/* ---- prefill experts: grouped GEMMs on the tensor cores (CINFER_CUDA_MOE_PREFILL=grouped) ---- */

/* T rows choose k distinct experts each; expert hot (when >= 0) is in every row (more than one 64-slot tile),
 * expert 0 in none. Slots grouped on the device, then both GEMMs against the CPU (check: every check-th slot
 * and all of hot's; bf16 tensor-core path with hi + lo activations: 1e-4 as cu_gemm's test; passes 1, precision
 * fast's activations rounded to bf16 once: 1e-2), every output written, the slots of the first T / 2 rows
 * bit-identical when only those rows run, and the forward's pre-split pair (gate_up writing the down GEMM's
 * bf16 input rows, cu_moe_gemm_swiglu_split + cu_moe_gemm_presplit) bit-identical to the f32 pair. */
static void prefill_case(const char *name, int T, int H, int E, int k, int I, int hot, int check, int passes) {
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    cu_set_bf16_passes(c, passes);
    double bound = passes == 1 ? 1e-2 : 1e-4;
    int S = T * k;
    int *idx = malloc((size_t)S * 4);
    for (int r = 0; r < T; r++)
        for (int j = 0; j < k; j++) {
            int e;
            for (;;) { /* distinct per row, never expert 0 */
                e = j == 0 && hot >= 0 ? hot : 1 + (int)((frand() * 0.5f + 0.5f) * (float)(E - 1)) % (E - 1);
                int dup = 0;
                for (int q = 0; q < j; q++) dup |= idx[r * k + q] == e;
                if (!dup) break;
            }
            idx[r * k + j] = e;
        }
    size_t ngu = (size_t)E * 2 * I * H, ndn = (size_t)E * H * I;
    uint16_t *d_gu = dev(ngu * 2), *d_dn = dev(ndn * 2);
    cu_fill_random_bf16(c, d_gu, ngu, 0.03f, 21);
    cu_fill_random_bf16(c, d_dn, ndn, 0.03f, 22);
    float *x = malloc((size_t)T * H * 4);
    for (size_t i = 0; i < (size_t)T * H; i++) x[i] = frand() * 1.5f;
    float *d_x = dup_dev(x, (size_t)T * H * 4);
    int *d_idx = dup_dev(idx, (size_t)S * 4), *d_grp = dev((size_t)(E + 1 + S) * 4),
        *d_tiles = dev((size_t)(E + 1) * 4);
    float *d_a = dev((size_t)S * I * 4), *d_y = dev((size_t)S * H * 4);
    size_t nxs = (size_t)T * H > (size_t)S * I ? (size_t)T * H : (size_t)S * I;
    uint16_t *d_xs = dev(2 * nxs * 2); /* the split rows */
    float *ga = NULL, *gy = NULL;
    /* 0: all T rows; 1: the first T / 2 only; 2: all rows again (run to run; the grouping and tiles checked
     * below are this run's) */
    for (int half = 0; half < 3; half++) {
        int Th = half == 1 ? T / 2 : T, Sh = Th * k;
        cu_fill_f32(c, d_a, (size_t)S * I, NAN);
        cu_fill_f32(c, d_y, (size_t)S * H, NAN);
        cu_moe_group(c, d_idx, Sh, E, d_grp);
        cu_moe_tiles(c, d_grp, E, d_tiles);
        cu_moe_gemm_swiglu(c, d_a, d_x, k, d_gu, d_grp, d_tiles, Sh, E, I, H, d_xs);
        cu_moe_gemm(c, d_y, d_a, 1, d_dn, d_grp, d_tiles, Sh, E, H, I, d_xs);
        REQUIRE(cu_sync(c, err, sizeof err) == 0);
        float *a = get_bytes(d_a, (size_t)Sh * I * 4), *y = get_bytes(d_y, (size_t)Sh * H * 4);
        if (!half) {
            ga = a, gy = y;
            continue;
        }
        int same = !memcmp(a, ga, (size_t)Sh * I * 4) && !memcmp(y, gy, (size_t)Sh * H * 4);
        static const char *const what[3] = {"", "  first half of the rows alone vs among all",
                                            "  all rows again"};
        printf("     %-52s %s\n", what[half], same ? "bit-identical" : "DIFFERENT");
        CHECK_MSG(same, "%s: %s differ", name, what[half]);
        free(a), free(y);
    }
    /* the pre-split pair over all T rows (the tiles of the last run): its down output equals the f32 pair's */
    {
        uint16_t *d_ys = dev((size_t)2 * S * I * 2);
        cu_fill_f32(c, d_y, (size_t)S * H, NAN);
        cu_moe_gemm_swiglu_split(c, d_ys, d_x, k, d_gu, d_grp, d_tiles, S, E, I, H, d_xs);
        cu_moe_gemm_presplit(c, d_y, d_ys, d_dn, d_grp, d_tiles, S, E, H, I);
        REQUIRE(cu_sync(c, err, sizeof err) == 0);
        float *y = get_bytes(d_y, (size_t)S * H * 4);
        int same = !memcmp(y, gy, (size_t)S * H * 4);
        printf("     %-52s %s\n", "  pre-split pair vs f32 pair", same ? "bit-identical" : "DIFFERENT");
        CHECK_MSG(same, "%s: the pre-split pair differs from the f32 pair", name);
        free(y);
        cu_free(d_ys);
    }
    /* the grouping: offsets count each expert's slots, perm holds each slot once under its expert */
    int *grp = get_bytes(d_grp, (size_t)(E + 1 + S) * 4);
    int bad = grp[0] != 0 || grp[E] != S;
    for (int e = 0; e < E && !bad; e++) {
        int cnt = 0;
        for (int sl = 0; sl < S; sl++) cnt += idx[sl] == e;
        bad |= grp[e + 1] - grp[e] != cnt;
        for (int p = grp[e]; p < grp[e + 1] && !bad; p++)
            bad |= grp[E + 1 + p] < 0 || grp[E + 1 + p] >= S || idx[grp[E + 1 + p]] != e;
    }
    CHECK_MSG(!bad, "%s: cu_moe_group: wrong offsets or slots", name);
    free(grp);
    int *tiles = get_bytes(d_tiles, (size_t)(E + 1) * 4);
    /* the CPU, slot by slot, against the run over all T rows */
    uint16_t *hgu = get_bytes(d_gu, ngu * 2), *hdn = get_bytes(d_dn, ndn * 2);
    float *ra = malloc((size_t)S * I * 4), *ry = malloc((size_t)S * H * 4), *g = malloc((size_t)2 * I * 4);
    float *ca = malloc((size_t)S * I * 4), *cy = malloc((size_t)S * H * 4);
    size_t na = 0, ny = 0;
    for (int sl = 0; sl < S; sl++) {
        int e = idx[sl];
        if (!(sl % check == 0 || e == hot)) continue;
        cpu_matmul_ref(g, x + (size_t)(sl / k) * H, hgu + (size_t)e * 2 * I * H, WT_BF16, 1, 2 * I, H);
        for (int n = 0; n < I; n++) ra[na + n] = ops_silu(g[n]) * g[I + n];
        memcpy(ca + na, ga + (size_t)sl * I, (size_t)I * 4);
        /* down from the GPU's own SwiGLU row, so the two GEMMs are checked apart */
        cpu_matmul_ref(ry + ny, ga + (size_t)sl * I, hdn + (size_t)e * H * I, WT_BF16, 1, H, I);
        memcpy(cy + ny, gy + (size_t)sl * H, (size_t)H * 4);
        na += (size_t)I, ny += (size_t)H;
    }
    char what[160];
    snprintf(what, sizeof what, "%s gate_up+SwiGLU (%zu slots) vs CPU", name, na / (size_t)I);
    check_rel(what, ca, ra, na, bound);
    snprintf(what, sizeof what, "%s down vs CPU", name);
    check_rel(what, cy, ry, ny, bound);
    /* every slot written (NaN never passes): the whole outputs are finite */
    CHECK_MSG(rel(ga, ga, (size_t)S * I) == 0 && rel(gy, gy, (size_t)S * H) == 0,
              "%s: an output slot unwritten", name);
    int want = 0; /* the tiles of the last run (all T rows) */
    for (int ee = 0; ee < E; ee++) {
        int ce = 0;
        for (int sl = 0; sl < S; sl++) ce += idx[sl] == ee;
        want += (ce + 63) / 64;
    }
    CHECK_MSG(tiles[0] == 0 && tiles[E] == want, "%s: tile offsets %d .. %d, want 0 .. %d", name, tiles[0],
              tiles[E], want);
    free(idx), free(x), free(ga), free(gy), free(tiles), free(hgu), free(hdn), free(ra), free(ry);
    free(g), free(ca), free(cy);
    cu_free(d_xs);
    cu_free(d_gu), cu_free(d_dn), cu_free(d_x), cu_free(d_idx), cu_free(d_grp), cu_free(d_tiles),
        cu_free(d_a);
    cu_free(d_y);
    cu_ctx_destroy(c);
}

TEST(cuda_moe_prefill_gemm_vs_cpu) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    prefill_case("tiny (fixture shape)", 150, 64, 8, 2, 32, 3, 1, 2);
    prefill_case("odd widths", 90, 72, 9, 3, 40, 4, 1, 2);
    prefill_case("35B-A3B shape", 130, 2048, 256, 8, 512, 5, 9, 2);
}

/* precision fast: the grouped GEMMs on the activations' hi part alone (NX 1) */
TEST(cuda_moe_prefill_gemm_fast_vs_cpu) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    prefill_case("fast: tiny (fixture shape)", 150, 64, 8, 2, 32, 3, 1, 1);
    prefill_case("fast: odd widths", 90, 72, 9, 3, 40, 4, 1, 1);
    prefill_case("fast: 35B-A3B shape", 130, 2048, 256, 8, 512, 5, 9, 1);
}

/* Device time of the two grouped GEMMs of a 4096-token 35B-A3B prefill chunk (32768 slots over 256 experts,
 * random choices), with the rate of the products (hi and lo halves counted). Prints only. */
TEST(cuda_moe_prefill_speed) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    int T = 4096, H = 2048, E = 256, k = 8, I = 512, S = T * k;
    size_t ngu = (size_t)E * 2 * I * H, ndn = (size_t)E * H * I;
    uint16_t *gu = dev(ngu * 2), *dn = dev(ndn * 2);
    cu_fill_random_bf16(c, gu, ngu, 0.03f, 41);
    cu_fill_random_bf16(c, dn, ndn, 0.03f, 42);
    int *idx = malloc((size_t)S * 4);
    for (int r = 0; r < T; r++)
        for (int j = 0; j < k; j++) {
            int e;
            for (;;) {
                e = (int)((frand() * 0.5f + 0.5f) * (float)E) % E;
                int dup = 0;
                for (int q = 0; q < j; q++) dup |= idx[r * k + q] == e;
                if (!dup) break;
            }
            idx[r * k + j] = e;
        }
    float *x = dev((size_t)T * H * 4), *ea = dev((size_t)S * I * 4), *ey = dev((size_t)S * H * 4);
    uint16_t *xs = dev((size_t)2 * S * I * 2); /* the split rows: S x I >= T x H here */
    cu_fill_f32(c, x, (size_t)T * H, 0.5f);
    int *d_idx = dup_dev(idx, (size_t)S * 4), *grp = dev((size_t)(E + 1 + S) * 4),
        *tiles = dev((size_t)(E + 1) * 4);
    cu_moe_group(c, d_idx, S, E, grp);
    cu_moe_tiles(c, grp, E, tiles);
    cu_timer *tm;
    REQUIRE(cu_timer_create(&tm) == 0);
    /* the forward's form (CINFER_CUDA_MOE_PF's default has 4: 256 weight rows x 64 of K a block step) */
    int pf0 = cu_moe_pf();
    cu_set_moe_pf(pf0 | 4);
    for (int passes = 2; passes >= 1; passes--) { /* exact's hi + lo, then precision fast's one pass */
        cu_set_bf16_passes(c, passes);
        double fl_gu = 2.0 * passes * S * 2.0 * I * H, fl_dn = 2.0 * passes * S * (double)H * I; /* all passes */
        cu_moe_gemm_swiglu(c, ea, x, k, gu, grp, tiles, S, E, I, H, xs); /* warm */
        cu_moe_gemm(c, ey, ea, 1, dn, grp, tiles, S, E, H, I, xs);
        cu_timer_start(c, tm);
        for (int r = 0; r < 5; r++) cu_moe_gemm_swiglu(c, ea, x, k, gu, grp, tiles, S, E, I, H, xs);
        double t1 = cu_timer_stop_ms(c, tm) / 5;
        cu_timer_start(c, tm);
        for (int r = 0; r < 5; r++) cu_moe_gemm(c, ey, ea, 1, dn, grp, tiles, S, E, H, I, xs);
        double t2 = cu_timer_stop_ms(c, tm) / 5;
        printf("     35B-A3B 4096-token chunk, %s: gate_up+SwiGLU %.3f ms (%.0f TFLOP/s), down %.3f ms (%.0f "
               "TFLOP/s): %.2f ms per layer\n",
               passes == 2 ? "exact (hi + lo)" : "fast (one pass)", t1, fl_gu / t1 / 1e9, t2, fl_dn / t2 / 1e9,
               t1 + t2);
    }
    cu_set_moe_pf(pf0);
    REQUIRE(cu_sync(c, err, sizeof err) == 0);
    cu_timer_destroy(tm);
    free(idx);
    cu_free(xs);
    cu_free(gu), cu_free(dn), cu_free(x), cu_free(ea), cu_free(ey), cu_free(d_idx), cu_free(grp),
        cu_free(tiles);
    cu_ctx_destroy(c);
}

/* Device time of each launch of one 35B-A3B MoE layer's prefill chunk of 4096 tokens (cuda events around 5
 * repetitions each), today's forms and CINFER_CUDA_MOE_PF's side by side. Prints only. */
TEST(cuda_moe_prefill_kernels) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    int T = 4096, H = 2048, E = 256, k = 8, I = 512, S = T * k;
    size_t ngu = (size_t)E * 2 * I * H, ndn = (size_t)E * H * I;
    uint16_t *gu = dev(ngu * 2), *dn = dev(ndn * 2), *rt = dev((size_t)E * H * 2), *sgw = dev((size_t)H * 2);
    cu_fill_random_bf16(c, gu, ngu, 0.03f, 51);
    cu_fill_random_bf16(c, dn, ndn, 0.03f, 52);
    cu_fill_random_bf16(c, rt, (size_t)E * H, 0.05f, 53);
    cu_fill_random_bf16(c, sgw, (size_t)H, 0.05f, 54);
    float *hx = malloc((size_t)T * H * 4);
    for (size_t i = 0; i < (size_t)T * H; i++) hx[i] = frand();
    float *x = dup_dev(hx, (size_t)T * H * 4), *lg = dev((size_t)T * E * 4), *wt = dev((size_t)S * 4);
    free(hx);
    float *ea = dev((size_t)S * I * 4), *ey = dev((size_t)S * H * 4), *out = dev((size_t)T * H * 4);
    float *sh = dev((size_t)T * H * 4), *shg = dev((size_t)T * 4);
    cu_fill_f32(c, sh, (size_t)T * H, 0.25f);
    uint16_t *xs = dev((size_t)2 * S * I * 2);
    int *idx = dev((size_t)S * 4), *grp = dev((size_t)(E + 1 + S) * 4), *tiles = dev((size_t)(E + 1) * 4);
    int *ident = malloc((size_t)S * 4);
    for (int i = 0; i < S; i++) ident[i] = i;
    int *d_ident = dup_dev(ident, (size_t)S * 4);
    free(ident);
    cu_timer *tm;
    REQUIRE(cu_timer_create(&tm) == 0);
    int old = cu_moe_pf();
    double fl_gu = 2.0 * 2 * S * 2.0 * I * H, fl_dn = 2.0 * 2 * S * (double)H * I; /* x2: hi and lo */
    enum { R = 5 };
    double sum0 = 0, sum1 = 0; /* today's launches, the new forms' */
#define TIME(label, acc0, acc1, call)                                                                        \
    do {                                                                                                     \
        call;                                                                                                \
        cu_timer_start(c, tm);                                                                               \
        for (int r_ = 0; r_ < R; r_++) call;                                                                 \
        double ms_ = cu_timer_stop_ms(c, tm) / R;                                                            \
        if (acc0) sum0 += ms_;                                                                               \
        if (acc1) sum1 += ms_;                                                                               \
        printf("     %-44s %8.1f us\n", label, ms_ * 1000.0);                                                \
    } while (0)
    TIME("router GEMV (f32, cu_gemm precise)", 1, 0, cu_gemm(c, lg, x, rt, T, E, H, xs, 1));
    cu_set_moe_pf(0);
    TIME("router tensor cores (cu_moe_router)", 0, 1, cu_moe_router(c, lg, x, rt, T, E, H, xs));
    cu_set_moe_pf(old);
    TIME("shared gate GEMV (N = 1)", 1, 1, cu_gemm(c, shg, x, sgw, T, 1, H, xs, 1));
    TIME("route (softmax + top-8)", 1, 0, cu_moe_route(c, lg, idx, wt, T, E, k, 1));
    TIME("sort_slots", 1, 0, cu_moe_sort_slots(c, idx, wt, T, k));
    TIME("route2 sorted", 0, 1, cu_moe_route2(c, lg, idx, wt, T, E, k, 1, 1));
    TIME("group", 1, 0, cu_moe_group(c, idx, S, E, grp));
    TIME("tiles", 1, 0, cu_moe_tiles(c, grp, E, tiles));
    int *gscr = dev((size_t)E * 4);
    TIME("group + tiles, many blocks (MOE_PF 64)", 0, 1,
         cu_moe_group_tiles(c, idx, S, E, grp, tiles, 64, gscr));
    static const int tf[] = {0, 4};
    double best = 1e30;
    for (size_t fi = 0; fi < sizeof tf / sizeof tf[0]; fi++) {
        cu_set_moe_pf(tf[fi]);
        cu_moe_gemm_swiglu(c, ea, x, k, gu, grp, tiles, S, E, I, H, xs); /* warm */
        cu_timer_start(c, tm);
        for (int r = 0; r < R; r++) cu_moe_gemm_swiglu(c, ea, x, k, gu, grp, tiles, S, E, I, H, xs);
        double t1 = cu_timer_stop_ms(c, tm) / R;
        cu_timer_start(c, tm);
        for (int r = 0; r < R; r++) cu_moe_gemm(c, ey, ea, 1, dn, grp, tiles, S, E, H, I, xs);
        double t2 = cu_timer_stop_ms(c, tm) / R;
        uint16_t *as = (uint16_t *)ea;
        cu_timer_start(c, tm);
        for (int r = 0; r < R; r++) cu_moe_gemm_swiglu_split(c, as, x, k, gu, grp, tiles, S, E, I, H, xs);
        double t3 = cu_timer_stop_ms(c, tm) / R;
        cu_timer_start(c, tm);
        for (int r = 0; r < R; r++) cu_moe_gemm_presplit(c, ey, as, dn, grp, tiles, S, E, H, I);
        double t4 = cu_timer_stop_ms(c, tm) / R;
        printf(
            "     MOE_PF tiles %2d: gate_up+SwiGLU %7.1f us (%3.0f TFLOP/s), down %7.1f us (%3.0f TFLOP/s); "
            "split out %7.1f us, split in %7.1f us (%3.0f TFLOP/s): %7.1f us\n",
            tf[fi], t1 * 1e3, fl_gu / t1 / 1e9, t2 * 1e3, fl_dn / t2 / 1e9, t3 * 1e3, t4 * 1e3,
            (fl_gu + fl_dn) / (t3 + t4) / 1e9, (t3 + t4) * 1e3);
        if (!fi) sum0 += t1 + t2;
        if (t3 + t4 < best) best = t3 + t4;
    }
    sum1 += best;
    cu_set_moe_pf(old);
    TIME("combine (+ shared expert)", 1, 1, cu_moe_combine(c, out, ey, d_ident, wt, T, k, H, sh, shg));
#undef TIME
    printf(
        "     one MoE layer (4096 rows, shared expert's GEMMs apart): today's %.3f ms, the new forms' (best "
        "tiles) %.3f ms\n",
        sum0, sum1);
    REQUIRE(cu_sync(c, err, sizeof err) == 0);
    cu_timer_destroy(tm);
    cu_free(gu), cu_free(dn), cu_free(rt), cu_free(sgw), cu_free(x), cu_free(lg), cu_free(wt), cu_free(ea);
    cu_free(ey), cu_free(out), cu_free(sh), cu_free(shg), cu_free(xs), cu_free(idx), cu_free(grp),
        cu_free(tiles), cu_free(d_ident), cu_free(gscr);
    cu_ctx_destroy(c);
}

/* The MoE fixtures through the whole cuda forward with a 150-token prefill (the path past 64 rows) with
 * CINFER_CUDA_MOE_PREFILL=grouped against the host-grouped cuBLAS path: both tensor-core hi + lo products, in
 * other orders (within 1e-4) */
TEST(cuda_moe_prefill_grouped_model) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    static const char *const fx[] = {"qwen35_moe", "qwen3_next"};
    for (int fi = 0; fi < 2; fi++) {
        char dir[512], err[512];
        snprintf(dir, sizeof dir, "%s/%s", test_fixtures_dir(), fx[fi]);
        cinfer_model *m;
        REQUIRE(cinfer_model_open(dir, &m, err, sizeof err) == 0);
        cinfer_model_info info;
        cinfer_model_get_info(m, &info);
        int V = info.vocab_size, P = 150;
        int32_t toks[150];
        for (int i = 0; i < P; i++) toks[i] = (int32_t)((i * 29 + 3) % V);
        float *out[2];
        char *old = env_swap("CINFER_CUDA_MOE_PREFILL", "host");
        for (int g = 0; g < 2; g++) {
            if (g) setenv("CINFER_CUDA_MOE_PREFILL", "grouped", 1);
            out[g] = malloc(sizeof(float) * (size_t)P * V);
            cinfer_ctx_params p = cinfer_ctx_default_params();
            p.max_seqs = 1, p.max_ctx = 256, p.max_batch = 256, p.n_threads = 2,
            p.device = CINFER_DEVICE_CUDA;
            cinfer_ctx *c = NULL;
            REQUIRE(cinfer_ctx_create(m, &p, &c, err, sizeof err) == 0);
            int seq = cinfer_seq_open(c, err, sizeof err);
            cinfer_batch_entry be = {seq, toks, P, 1};
            REQUIRE(cinfer_forward(c, &be, 1, out[g], err, sizeof err) == 0);
            cinfer_ctx_destroy(c);
        }
        env_restore("CINFER_CUDA_MOE_PREFILL", old);
        double r = rel(out[1], out[0], (size_t)P * V);
        printf("     %-12s prefill of %d: grouped vs host-grouped ||d||/||ref|| = %.2e\n", fx[fi], P, r);
        CHECK_MSG(r <= 1e-4, "%s: grouped prefill experts differ by %.3g", fx[fi], r);
        free(out[0]), free(out[1]);
        cinfer_model_close(m);
    }
}

/* ---- the prefill forms behind CINFER_CUDA_MOE_PF ---- */

/* The grouped GEMMs' forms against today's (128-row tiles, f32 SwiGLU rows split again by the down GEMM):
 * 256-row tiles (bit 4) and the SwiGLU GEMM writing the down GEMM's split input (bit 8) give the same bits:
 * the split rows equal bf16 hi / lo of today's f32 rows, and the down rows are identical. */
static void pf_forms_case(const char *name, int T, int H, int E, int k, int I) {
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    int S = T * k;
    int *idx = malloc((size_t)S * 4);
    for (int r = 0; r < T; r++)
        for (int j = 0; j < k; j++) {
            int e;
            for (;;) {
                e = j == 0 ? 1 : (int)((frand() * 0.5f + 0.5f) * (float)E) % E; /* expert 1: many tiles */
                int dup = 0;
                for (int q = 0; q < j; q++) dup |= idx[r * k + q] == e;
                if (!dup) break;
            }
            idx[r * k + j] = e;
        }
    size_t ngu = (size_t)E * 2 * I * H, ndn = (size_t)E * H * I;
    uint16_t *d_gu = dev(ngu * 2), *d_dn = dev(ndn * 2);
    cu_fill_random_bf16(c, d_gu, ngu, 0.03f, 31);
    cu_fill_random_bf16(c, d_dn, ndn, 0.03f, 32);
    float *x = malloc((size_t)T * H * 4);
    for (size_t i = 0; i < (size_t)T * H; i++) x[i] = frand() * 1.5f;
    float *d_x = dup_dev(x, (size_t)T * H * 4);
    int *d_idx = dup_dev(idx, (size_t)S * 4), *d_grp = dev((size_t)(E + 1 + S) * 4),
        *d_tiles = dev((size_t)(E + 1) * 4);
    float *d_a = dev((size_t)S * I * 4), *d_y = dev((size_t)S * H * 4);
    size_t nxs = (size_t)T * H > (size_t)S * I ? (size_t)T * H : (size_t)S * I;
    uint16_t *d_xs = dev(2 * nxs * 2), *d_as = dev((size_t)2 * S * I * 2);
    int old = cu_moe_pf();
    cu_moe_group(c, d_idx, S, E, d_grp);
    cu_moe_tiles(c, d_grp, E, d_tiles);
    float *ra = NULL, *ry = NULL;
    /* the tile forms (CINFER_CUDA_MOE_PF 4) x bit 8 (split SwiGLU output) */
    static const int tf[] = {0, 4};
    for (int form = 0; form < 4; form++) {
        int pf = tf[form >> 1], split = form & 1;
        cu_set_moe_pf(pf);
        cu_fill_f32(c, d_a, (size_t)S * I, NAN);
        cu_fill_f32(c, d_y, (size_t)S * H, NAN);
        if (split) {
            cu_moe_gemm_swiglu_split(c, d_as, d_x, k, d_gu, d_grp, d_tiles, S, E, I, H, d_xs);
            cu_moe_gemm_presplit(c, d_y, d_as, d_dn, d_grp, d_tiles, S, E, H, I);
        } else {
            cu_moe_gemm_swiglu(c, d_a, d_x, k, d_gu, d_grp, d_tiles, S, E, I, H, d_xs);
            cu_moe_gemm(c, d_y, d_a, 1, d_dn, d_grp, d_tiles, S, E, H, I, d_xs);
        }
        REQUIRE(cu_sync(c, err, sizeof err) == 0);
        float *y = get_bytes(d_y, (size_t)S * H * 4);
        if (!form) {
            ra = get_bytes(d_a, (size_t)S * I * 4), ry = y;
            CHECK_MSG(rel(ra, ra, (size_t)S * I) == 0 && rel(ry, ry, (size_t)S * H) == 0,
                      "%s: an output slot unwritten", name);
            continue;
        }
        int same = !memcmp(y, ry, (size_t)S * H * 4);
        if (split) { /* the split SwiGLU rows: hi and lo of today's f32 rows */
            uint16_t *as = get_bytes(d_as, (size_t)2 * S * I * 2);
            for (size_t i = 0; i < (size_t)S * I && same; i++) {
                uint16_t h = f32_to_bf16(ra[i]);
                same = as[i] == h && as[(size_t)S * I + i] == f32_to_bf16(ra[i] - bf16_to_f32(h));
            }
            free(as);
        } else {
            float *a = get_bytes(d_a, (size_t)S * I * 4);
            same &= !memcmp(a, ra, (size_t)S * I * 4);
            free(a);
        }
        printf("     %-22s CINFER_CUDA_MOE_PF=%3d%s vs 0, f32 rows: %s\n", name, pf | (split ? 8 : 0),
               split ? " (split SwiGLU rows)" : "", same ? "bit-identical" : "DIFFERENT");
        CHECK_MSG(same, "%s: MOE_PF %d split %d differs", name, pf, split);
        free(y);
    }
    /* cu_moe_group_tiles: the same offsets and tiles as cu_moe_group + cu_moe_tiles, each slot once under its
     * expert, and the GEMMs from its grouping give the same bits */
    {
        int *g1 = get_bytes(d_grp, (size_t)(E + 1 + S) * 4), *t1 = get_bytes(d_tiles, (size_t)(E + 1) * 4);
        int *d_scr = dev((size_t)E * 4);
        cu_fill_f32(c, (float *)d_grp, (size_t)(E + 1 + S), NAN);
        cu_fill_f32(c, (float *)d_tiles, (size_t)(E + 1), NAN);
        cu_moe_group_tiles(c, d_idx, S, E, d_grp, d_tiles, 64, d_scr);
        cu_set_moe_pf(0);
        cu_fill_f32(c, d_y, (size_t)S * H, NAN);
        cu_moe_gemm_swiglu(c, d_a, d_x, k, d_gu, d_grp, d_tiles, S, E, I, H, d_xs);
        cu_moe_gemm(c, d_y, d_a, 1, d_dn, d_grp, d_tiles, S, E, H, I, d_xs);
        REQUIRE(cu_sync(c, err, sizeof err) == 0);
        int *g2 = get_bytes(d_grp, (size_t)(E + 1 + S) * 4), *t2 = get_bytes(d_tiles, (size_t)(E + 1) * 4);
        float *y = get_bytes(d_y, (size_t)S * H * 4);
        int ok = !memcmp(g1, g2, (size_t)(E + 1) * 4) && !memcmp(t1, t2, (size_t)(E + 1) * 4);
        char *seen = calloc((size_t)S, 1);
        for (int e = 0; e < E && ok; e++)
            for (int q = g2[e]; q < g2[e + 1] && ok; q++) {
                int sl = g2[E + 1 + q];
                ok = sl >= 0 && sl < S && !seen[sl] && idx[sl] == e;
                if (ok) seen[sl] = 1;
            }
        int same = !memcmp(y, ry, (size_t)S * H * 4);
        printf("     %-22s cu_moe_group_tiles: grouping %s, down rows %s\n", name, ok ? "right" : "WRONG",
               same ? "bit-identical" : "DIFFERENT");
        CHECK_MSG(ok && same, "%s: cu_moe_group_tiles: grouping %d, rows %d", name, ok, same);
        free(g1), free(t1), free(g2), free(t2), free(y), free(seen);
        cu_free(d_scr);
    }
    cu_set_moe_pf(old);
    free(idx), free(x), free(ra), free(ry);
    cu_free(d_gu), cu_free(d_dn), cu_free(d_x), cu_free(d_idx), cu_free(d_grp), cu_free(d_tiles);
    cu_free(d_a), cu_free(d_y), cu_free(d_xs), cu_free(d_as);
    cu_ctx_destroy(c);
}

TEST(cuda_moe_pf_gemm_forms_bitwise) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    pf_forms_case("tiny (fixture shape)", 150, 64, 8, 2, 32);
    pf_forms_case("odd widths", 90, 72, 9, 3, 40);
    pf_forms_case("35B-A3B shape", 200, 2048, 256, 8, 512);
}

/* The router's logits on the tensor cores (x in three bf16 parts) against the CPU's f32 product (1e-5, an
 * f32 path) and against the f32 GEMV; the first rows alone give the bits they have among all; every logit
 * written; the top-k chosen from them equals the CPU's choice wherever the CPU's k-th and k+1-th
 * probabilities are apart by more than 1e-5 relative. */
TEST(cuda_moe_router_tc) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    static const int shapes[][4] = {{130, 2048, 256, 8}, {64, 64, 8, 2}, {97, 72, 9, 3}, {300, 512, 512, 10}};
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int T = shapes[si][0], H = shapes[si][1], E = shapes[si][2], k = shapes[si][3];
        uint16_t *w = malloc((size_t)E * H * 2);
        for (size_t i = 0; i < (size_t)E * H; i++) w[i] = f32_to_bf16(frand() * 0.05f);
        float *x = malloc((size_t)T * H * 4);
        for (size_t i = 0; i < (size_t)T * H; i++) x[i] = frand() * 2.0f;
        uint16_t *d_w = dup_dev(w, (size_t)E * H * 2), *d_xs = dev((size_t)3 * T * H * 2);
        float *d_x = dup_dev(x, (size_t)T * H * 4), *d_lg = dev((size_t)T * E * 4),
              *d_lg2 = dev((size_t)T * E * 4);
        int *d_idx = dev((size_t)T * k * 4);
        float *d_wt = dev((size_t)T * k * 4);
        cu_fill_f32(c, d_lg, (size_t)T * E, NAN);
        int Th = T / 2 + 1;
        cu_moe_router(c, d_lg, d_x, d_w, Th, E, H, d_xs);
        REQUIRE(cu_sync(c, err, sizeof err) == 0);
        float *half = get_bytes(d_lg, (size_t)Th * E * 4);
        cu_fill_f32(c, d_lg, (size_t)T * E, NAN);
        cu_moe_router(c, d_lg, d_x, d_w, T, E, H, d_xs);
        cu_gemm(c, d_lg2, d_x, d_w, T, E, H, d_xs, 1);
        cu_moe_route2(c, d_lg, d_idx, d_wt, T, E, k, 1, 0);
        REQUIRE(cu_sync(c, err, sizeof err) == 0);
        float *lg = get_bytes(d_lg, (size_t)T * E * 4), *lg2 = get_bytes(d_lg2, (size_t)T * E * 4);
        int *idx = get_bytes(d_idx, (size_t)T * k * 4);
        float *ref = malloc((size_t)T * E * 4);
        cpu_matmul_ref(ref, x, w, WT_BF16, T, E, H);
        char what[160];
        snprintf(what, sizeof what, "router T=%d H=%d E=%d: tensor cores vs CPU", T, H, E);
        check_rel(what, lg, ref, (size_t)T * E, 1e-5);
        snprintf(what, sizeof what, "router T=%d H=%d E=%d: f32 GEMV vs CPU", T, H, E);
        check_rel(what, lg2, ref, (size_t)T * E, 1e-5);
        int same = !memcmp(half, lg, (size_t)Th * E * 4);
        printf("     router: the first %d rows alone vs among %d: %s\n", Th, T,
               same ? "bit-identical" : "DIFFERENT");
        CHECK_MSG(same, "router: rows depend on the others");
        /* top-k on the CPU's logits (softmax is monotone: rank the logits; ties to the lower index) */
        int agree = 0, clear = 0;
        for (int r = 0; r < T; r++) {
            const float *q = ref + (size_t)r * E;
            int ch[64];
            float kth = 0, next = -INFINITY;
            for (int j = 0; j <= k && j < E; j++) {
                int b = -1;
                for (int e = 0; e < E; e++) {
                    int taken = 0;
                    for (int t = 0; t < j; t++) taken |= ch[t] == e;
                    if (!taken && (b < 0 || q[e] > q[b])) b = e;
                }
                ch[j] = b;
                if (j == k - 1) kth = q[b];
                if (j == k) next = q[b];
            }
            if (!(kth - next > 1e-5f * fabsf(kth) + 1e-6f)) continue;
            clear++;
            int ok = 1;
            for (int j = 0; j < k; j++) ok &= idx[(size_t)r * k + j] == ch[j];
            agree += ok;
        }
        printf("     router: top-%d equal to the CPU's in %d of %d rows with a clear k-th choice\n", k, agree,
               clear);
        CHECK_MSG(agree == clear && clear > T / 2, "router: top-k differs (%d of %d)", agree, clear);
        free(w), free(x), free(half), free(lg), free(lg2), free(idx), free(ref);
        cu_free(d_w), cu_free(d_xs), cu_free(d_x), cu_free(d_lg), cu_free(d_lg2), cu_free(d_idx),
            cu_free(d_wt);
    }
    cu_ctx_destroy(c);
}

/* cu_moe_route2 against cu_moe_route (+ cu_moe_sort_slots for its sorted form): the same indices and weights,
 * bit for bit, with ties (logits drawn from few values), both normalisations, E up to 1024 */
TEST(cuda_moe_route2_matches_route) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    static const int shapes[][3] = {{300, 256, 8}, {77, 9, 3}, {50, 512, 10}, {33, 1024, 32}, {40, 40, 1}};
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int T = shapes[si][0], E = shapes[si][1], k = shapes[si][2];
        float *lg = malloc((size_t)T * E * 4);
        for (size_t i = 0; i < (size_t)T * E; i++)
            lg[i] = i % 3 ? frand() * 4.0f : (float)((int)((frand() + 1.0f) * 4.0f)) * 0.5f; /* ties */
        float *d_lg = dup_dev(lg, (size_t)T * E * 4);
        int *i1 = dev((size_t)T * k * 4), *i2 = dev((size_t)T * k * 4);
        float *w1 = dev((size_t)T * k * 4), *w2 = dev((size_t)T * k * 4);
        for (int form = 0; form < 4; form++) {
            int norm = form & 1, sorted = form >> 1;
            cu_moe_route(c, d_lg, i1, w1, T, E, k, norm);
            if (sorted) cu_moe_sort_slots(c, i1, w1, T, k);
            cu_moe_route2(c, d_lg, i2, w2, T, E, k, norm, sorted);
            REQUIRE(cu_sync(c, err, sizeof err) == 0);
            int *a = get_bytes(i1, (size_t)T * k * 4), *b = get_bytes(i2, (size_t)T * k * 4);
            float *wa = get_bytes(w1, (size_t)T * k * 4), *wb = get_bytes(w2, (size_t)T * k * 4);
            int same = !memcmp(a, b, (size_t)T * k * 4) && !memcmp(wa, wb, (size_t)T * k * 4);
            printf("     route2 T=%d E=%d k=%d norm %d sorted %d: %s\n", T, E, k, norm, sorted,
                   same ? "bit-identical" : "DIFFERENT");
            CHECK_MSG(same, "route2 E=%d k=%d norm %d sorted %d differs", E, k, norm, sorted);
            free(a), free(b), free(wa), free(wb);
        }
        free(lg);
        cu_free(d_lg), cu_free(i1), cu_free(i2), cu_free(w1), cu_free(w2);
    }
    cu_ctx_destroy(c);
}

/* The MoE fixtures through the whole cuda forward (a 150-token prefill) with every CINFER_CUDA_MOE_PF form on
 * against them off: the router's tensor-core logits differ from the f32 GEMV's in the last bits only */
TEST(cuda_moe_pf_model) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    static const char *const fx[] = {"qwen35_moe", "qwen3_next"};
    for (int fi = 0; fi < 2; fi++) {
        char dir[512], err[512];
        snprintf(dir, sizeof dir, "%s/%s", test_fixtures_dir(), fx[fi]);
        cinfer_model *m;
        REQUIRE(cinfer_model_open(dir, &m, err, sizeof err) == 0);
        cinfer_model_info info;
        cinfer_model_get_info(m, &info);
        int V = info.vocab_size, P = 150;
        int32_t toks[150];
        for (int i = 0; i < P; i++) toks[i] = (int32_t)((i * 31 + 7) % V);
        static const char *const forms[] = {"0", "15", "14"};
        float *out[3];
        char *old = env_swap("CINFER_CUDA_MOE_PF", "0");
        for (int g = 0; g < 3; g++) {
            setenv("CINFER_CUDA_MOE_PF", forms[g], 1);
            out[g] = malloc(sizeof(float) * (size_t)P * V);
            cinfer_ctx_params p = cinfer_ctx_default_params();
            p.max_seqs = 1, p.max_ctx = 256, p.max_batch = 256, p.n_threads = 2,
            p.device = CINFER_DEVICE_CUDA;
            cinfer_ctx *c = NULL;
            REQUIRE(cinfer_ctx_create(m, &p, &c, err, sizeof err) == 0);
            int seq = cinfer_seq_open(c, err, sizeof err);
            cinfer_batch_entry be = {seq, toks, P, 1};
            REQUIRE(cinfer_forward(c, &be, 1, out[g], err, sizeof err) == 0);
            cinfer_ctx_destroy(c);
        }
        env_restore("CINFER_CUDA_MOE_PF", old);
        double r = rel(out[1], out[0], (size_t)P * V);
        int same = !memcmp(out[2], out[0], sizeof(float) * (size_t)P * V);
        printf(
            "     %-12s prefill of %d: CINFER_CUDA_MOE_PF=15 vs 0 ||d||/||ref|| = %.2e; =14 (no router) %s\n",
            fx[fi], P, r, same ? "bit-identical" : "DIFFERENT");
        CHECK_MSG(r <= 1e-4, "%s: MOE_PF=15 differs by %.3g", fx[fi], r);
        CHECK_MSG(same, "%s: MOE_PF=14 not bit-identical to 0", fx[fi]);
        free(out[0]), free(out[1]), free(out[2]);
        cinfer_model_close(m);
    }
}

#else

TEST(cuda_moe_not_built) {
    SKIP("no CUDA device: skipped (built without CUDA)");
}

#endif

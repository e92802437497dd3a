/* test_cuda_fused.c — the fused decode kernels. DeltaNet (cu_gdn_args.dec_cnt, CINFER_CUDA_GDN_FUSED) against
 * the four-kernel path and the CPU: after a chunked prefill, several decode steps of one entry and of four
 * entries in scattered slots must give the four kernels' outputs, conv windows and recurrent states BIT FOR
 * BIT (the speculative rollback and graph-vs-eager tests rely on one arithmetic per decode token), and the
 * CPU's within the f32 bound (||d|| / ||ref|| <= 1e-5). Shapes: a tiny one (3 value heads per key head, dv
 * not a multiple of the 32-column block), the 4B layer (Hk 16, Hv 32, dk = dv = 128) and the 27B layer
 * (Hk 16, Hv 48). Attention (cu_attn_args.dec_cnt, CINFER_CUDA_ATTN_FUSED): decode rows through the one
 * fused kernel against the three kernels (outputs and KV pools bitwise) and an f64 CPU reference, one split
 * and several (the merge in the last block), 4B's head_dim 256. GPU only: skips without a CUDA build or
 * device. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/ops.h"
#include "model/forward.h"
#include "model/forward_cuda.h"
#include "test.h"

#ifdef CINFER_CUDA
#include "backend/cuda/cuda_ops.h"
#include "cuda_test_util.h"

typedef struct ent {
    int len, n, slot;
} ent;

/* forward_cuda.c's packed metadata for these entries (no attention: block tables empty) */
static int *dev_meta(const ent *e, int NE, cu_meta *m) {
    int T = 0;
    for (int i = 0; i < NE; i++) T += e[i].n;
    size_t o_pos = T, o_ent = 2 * (size_t)T, o_len = 3 * (size_t)T, o_n = o_len + NE, o_r0 = o_n + NE,
           o_slot = o_r0 + NE, o_boff = o_slot + NE, o_lrow = o_boff + NE, o_spec = o_lrow + T,
           tot = o_spec + NE;
    int *h = calloc(tot + 1, sizeof(int));
    for (int i = 0, r = 0; i < NE; i++) {
        h[o_len + i] = e[i].len, h[o_n + i] = e[i].n, h[o_r0 + i] = r, h[o_slot + i] = e[i].slot;
        for (int t = 0; t < e[i].n; t++, r++)
            h[o_pos + r] = e[i].len + t, h[o_ent + r] = i, h[o_lrow + r] = r;
    }
    int *d = dup_dev(h, (tot + 1) * sizeof(int));
    free(h);
    *m = (cu_meta){d,          d + o_pos,  d + o_ent,  d + o_len, d + o_n,    d + o_r0,
                   d + o_slot, d + o_boff, d + o_lrow, d + tot,   d + o_spec, NULL};
    return d;
}

/* one layer's shape and weights (host and device) */
typedef struct layer {
    int Hk, Hv, dk, dv, K, C, vd, ld; /* ld: a projection row [qkv C | z vd | b Hv | a Hv | pad] */
    int n_slots, n_lin, lin;
    float *cw, *A, *dt, *gn;     /* host: [K][C], [Hv], [Hv], [dv] */
    float *dcw, *dA, *ddt, *dgn; /* device copies */
} layer;

static void layer_init(layer *L, int Hk, int Hv, int dk, int dv) {
    memset(L, 0, sizeof *L);
    L->Hk = Hk, L->Hv = Hv, L->dk = dk, L->dv = dv, L->K = 4, L->vd = Hv * dv;
    L->C = 2 * Hk * dk + L->vd, L->ld = L->C + L->vd + 2 * Hv + 8;
    L->n_slots = 6, L->n_lin = 2, L->lin = 1;
    L->cw = rnd((size_t)L->K * L->C, 0.5f), L->A = rnd((size_t)Hv, 1.0f), L->dt = rnd((size_t)Hv, 0.5f);
    L->gn = rnd((size_t)dv, 0.2f);
    for (int h = 0; h < Hv; h++) L->A[h] = -expf(L->A[h]);
    for (int j = 0; j < dv; j++) L->gn[j] += 1.0f;
    L->dcw = dup_dev(L->cw, (size_t)L->K * L->C * 4), L->dA = dup_dev(L->A, (size_t)Hv * 4);
    L->ddt = dup_dev(L->dt, (size_t)Hv * 4), L->dgn = dup_dev(L->gn, (size_t)dv * 4);
}
static void layer_free(layer *L) {
    free(L->cw), free(L->A), free(L->dt), free(L->gn);
    cu_free(L->dcw), cu_free(L->dA), cu_free(L->ddt), cu_free(L->dgn);
}

/* T projection rows; b and a at the scale of trained models' gates (g ~ -0.002..-0.3 per token) */
static float *proj_rows(const layer *L, int T) {
    float *p = rnd((size_t)T * L->ld, 1.0f);
    for (int r = 0; r < T; r++) {
        float *row = p + (size_t)r * L->ld;
        for (int i = 0; i < L->vd; i++) row[L->C + i] *= 2.0f;
        for (int h = 0; h < L->Hv; h++)
            row[L->C + L->vd + L->Hv + h] = row[L->C + L->vd + L->Hv + h] * 2.0f - 3.0f;
    }
    return p;
}

/* the CPU reference of one layer call (forward_cpu.c's ops): states [slots][n_lin][...] updated in place,
 * o [T][vd] */
static void cpu_layer(const layer *L, const float *proj, const ent *e, int NE, float *cst, float *rst,
                      float *o) {
    int Hk = L->Hk, Hv = L->Hv, dk = L->dk, dv = L->dv, K = L->K, C = L->C, vd = L->vd;
    size_t cs_per = (size_t)(K - 1) * C, rs_per = (size_t)Hv * dk * dv;
    int T = 0;
    for (int i = 0; i < NE; i++) T += e[i].n;
    float *co = malloc((size_t)T * C * 4), *bg = malloc((size_t)T * 2 * Hv * 4);
    float *tmp = malloc(gdn_chunk_scratch_floats(dk, dv) * 4);
    for (int i = 0, r0 = 0; i < NE; r0 += e[i].n, i++) {
        int n = e[i].n;
        ref_conv_silu(co + (size_t)r0 * C, cst + ((size_t)e[i].slot * L->n_lin + L->lin) * cs_per, L->cw,
                      proj + (size_t)r0 * L->ld, L->ld, n, K, C);
        for (int t = r0; t < r0 + n; t++) {
            ref_qk_norm(co + (size_t)t * C, Hk, dk);
            const float *row = proj + (size_t)t * L->ld;
            for (int h = 0; h < Hv; h++) {
                bg[(size_t)t * 2 * Hv + h] = ops_sigmoid(row[C + vd + h]);
                bg[(size_t)t * 2 * Hv + Hv + h] = L->A[h] * ops_softplus(row[C + vd + Hv + h] + L->dt[h]);
            }
        }
        ref_gdn_core(co + (size_t)r0 * C, bg + (size_t)r0 * 2 * Hv,
                     rst + ((size_t)e[i].slot * L->n_lin + L->lin) * rs_per, o + (size_t)r0 * vd, n, e[i].len,
                     Hk, Hv, dk, dv, tmp);
        for (int t = r0; t < r0 + n; t++)
            for (int h = 0; h < Hv; h++) {
                float *oh = o + (size_t)t * vd + (size_t)h * dv;
                ops_rmsnorm(oh, oh, L->gn, dv, 1e-6f);
                for (int j = 0; j < dv; j++)
                    oh[j] *= ops_silu(proj[(size_t)t * L->ld + C + (size_t)h * dv + j]);
            }
    }
    free(co), free(bg), free(tmp);
}

/* one device layer call on the given states; cnt NULL: the four kernels, else the fused decode kernel (as
 * thread block clusters when cluster > 0: cu_gdn_args.dec_cluster; one block a value head when cluster < 0:
 * cu_gdn_args.dec_wide). The
 * scratch starts as NaN; returns o [T][vd] (host), and *scratch_nan whether conv_out and bg stayed NaN (the
 * four kernels write them, the fused kernel never does: proof of which path ran) */
static float *dev_layer(cu_ctx *c, const layer *L, const float *dproj, const ent *e, int NE, float *dcst,
                        float *drst, unsigned *cnt, int cluster, int tc, int *scratch_nan) {
    int T = 0, decode = 1;
    for (int i = 0; i < NE; i++) T += e[i].n, decode &= e[i].n == 1 && e[i].len > 0;
    cu_meta meta;
    int *dm = dev_meta(e, NE, &meta);
    float *dco = NULL, *dbg = NULL, *dout = NULL;
    char err[256];
    size_t nco = (size_t)T * L->C, nbg = (size_t)T * 2 * L->Hv, no = (size_t)T * L->vd;
    cu_alloc((void **)&dco, nco * 4, err, sizeof err), cu_alloc((void **)&dbg, nbg * 4, err, sizeof err);
    cu_alloc((void **)&dout, no * 4, err, sizeof err);
    cu_fill_f32(c, dco, nco, NAN), cu_fill_f32(c, dbg, nbg, NAN), cu_fill_f32(c, dout, no, NAN);
    cu_gdn_args g = {0};
    g.T = T, g.NE = NE, g.Hk = L->Hk, g.Hv = L->Hv, g.dk = L->dk, g.dv = L->dv, g.K = L->K, g.C = L->C;
    g.n_lin = L->n_lin, g.lin = L->lin;
    g.qkv = dproj, g.qkv_ld = L->ld, g.z = dproj + L->C, g.z_ld = L->ld;
    g.b = dproj + L->C + L->vd, g.a = dproj + L->C + L->vd + L->Hv, g.ba_ld = L->ld;
    g.conv_w = L->dcw, g.A = L->dA, g.dt_bias = L->ddt, g.gnorm = L->dgn;
    g.conv_out = dco, g.bg = dbg, g.o = dout, g.conv_state = dcst, g.rec_state = drst, g.eps = 1e-6f;
    g.tc = tc, g.no_chunked = decode, g.dec_cnt = cnt, g.dec_cluster = cluster > 0 ? cluster : 0,
    g.meta = meta;
    g.dec_wide = cluster < 0;
    cu_gdn_layer(c, &g);
    float *o = NULL;
    if (cu_sync(c, err, sizeof err)) {
        test_fail(__FILE__, __LINE__, "cu_gdn_layer: %s", err);
    } else {
        o = get(dout, no);
        float *hco = get(dco, nco), *hbg = get(dbg, nbg);
        int nan = 1;
        for (size_t i = 0; i < nco; i++) nan &= isnan(hco[i]);
        for (size_t i = 0; i < nbg; i++) nan &= isnan(hbg[i]);
        *scratch_nan = nan;
        free(hco), free(hbg);
    }
    cu_free(dco), cu_free(dbg), cu_free(dout), cu_free(dm);
    return o;
}

/* prefill of each entry (pre[i] tokens from 0, the chunked form), then `steps` decode steps of every entry:
 * the four kernels on one copy of the states, the fused kernel on another, the fused kernel as clusters
 * (CINFER_CUDA_GDN_CLUSTER) on a third, the clustered kernel's second form (dec_cluster 2, forward_cuda's
 * default: its conv inputs first, with an L2 evict_last policy) on a fourth, the fused kernel one block a
 * value head (dec_wide, forward_cuda's default above the clusters' batches) on a fifth, the CPU on a sixth */
#define N_CL2 1
static void fused_case(const char *name, int Hk, int Hv, int dk, int dv, const ent *pre, int NE, int steps) {
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    REQUIRE(cu_gdn_init(dk));
    int tc = cu_gdn_tc_init(dk); /* the default prefill where it serves */
    layer L;
    layer_init(&L, Hk, Hv, dk, dv);
    size_t cs_n = (size_t)L.n_slots * L.n_lin * (L.K - 1) * L.C,
           rs_n = (size_t)L.n_slots * L.n_lin * Hv * dk * dv;
    /* slots start as noise: a slot this batch does not name must keep its bits */
    float *cst = rnd(cs_n, 1.0f), *rst = rnd(rs_n, 0.1f);
    size_t cs_per = (size_t)(L.K - 1) * L.C, rs_per = (size_t)Hv * dk * dv;
    for (int i = 0; i < NE; i++) {
        memset(cst + ((size_t)pre[i].slot * L.n_lin + L.lin) * cs_per, 0, cs_per * 4);
        memset(rst + ((size_t)pre[i].slot * L.n_lin + L.lin) * rs_per, 0, rs_per * 4);
    }
    float *dcst_u = dup_dev(cst, cs_n * 4), *drst_u = dup_dev(rst, rs_n * 4);
    float *dcst_f = dup_dev(cst, cs_n * 4), *drst_f = dup_dev(rst, rs_n * 4);
    float *dcst_k = dup_dev(cst, cs_n * 4), *drst_k = dup_dev(rst, rs_n * 4);
    float *dcst_2[N_CL2], *drst_2[N_CL2];
    for (int v = 0; v < N_CL2; v++) dcst_2[v] = dup_dev(cst, cs_n * 4), drst_2[v] = dup_dev(rst, rs_n * 4);
    float *dcst_w = dup_dev(cst, cs_n * 4), *drst_w = dup_dev(rst, rs_n * 4);
    /* every shape here takes the clustered form on sm_90 (at most 16 blocks a group) */
    int ck = cu_gdn_cluster_init(Hk, Hv, dk, dv);
    CHECK_MSG(ck, "%s: cu_gdn_cluster_init refused %d/%d heads, dk %d, dv %d", name, Hk, Hv, dk, dv);
    unsigned *cnt = NULL;
    REQUIRE(cu_alloc((void **)&cnt, (size_t)NE * Hk * sizeof(unsigned), err, sizeof err) == 0);
    int T = 0;
    for (int i = 0; i < NE; i++) T += pre[i].n;
    /* the prefill: the same chunked path on both device copies */
    float *proj = proj_rows(&L, T), *dproj = dup_dev(proj, (size_t)T * L.ld * 4);
    float *o_ref = malloc((size_t)T * L.vd * 4);
    cpu_layer(&L, proj, pre, NE, cst, rst, o_ref);
    int nan_u = 0, nan_f = 0, nan_k = 0;
    float *ou = dev_layer(c, &L, dproj, pre, NE, dcst_u, drst_u, NULL, 0, tc, &nan_u);
    float *of = dev_layer(c, &L, dproj, pre, NE, dcst_f, drst_f, cnt, 0, tc, &nan_f);
    float *ok_ = dev_layer(c, &L, dproj, pre, NE, dcst_k, drst_k, cnt, ck, tc, &nan_k);
    REQUIRE(ou && of && ok_);
    free(ok_);
    for (int v = 0; v < N_CL2; v++) {
        ok_ = dev_layer(c, &L, dproj, pre, NE, dcst_2[v], drst_2[v], cnt, 2 + v, tc, &nan_k);
        REQUIRE(ok_);
        free(ok_);
    }
    ok_ = dev_layer(c, &L, dproj, pre, NE, dcst_w, drst_w, cnt, -1, tc, &nan_k);
    REQUIRE(ok_);
    free(ok_);
    double r = rel(ou, o_ref, (size_t)T * L.vd);
    printf("     %-5s NE %d prefill (%s) vs cpu: %.2e\n", name, NE, tc ? "tensor cores" : "scalar", r);
    CHECK_MSG(r <= 1e-5, "%s prefill vs cpu %.3g", name, r);
    free(ou), free(of), free(proj), free(o_ref), cu_free(dproj);
    ent *dec = malloc((size_t)NE * sizeof *dec);
    for (int i = 0; i < NE; i++) dec[i] = (ent){pre[i].len + pre[i].n, 1, pre[i].slot};
    double worst = 0;
    for (int s = 0; s < steps; s++) {
        proj = proj_rows(&L, NE), dproj = dup_dev(proj, (size_t)NE * L.ld * 4);
        o_ref = malloc((size_t)NE * L.vd * 4);
        cpu_layer(&L, proj, dec, NE, cst, rst, o_ref);
        ou = dev_layer(c, &L, dproj, dec, NE, dcst_u, drst_u, NULL, 0, tc, &nan_u);
        of = dev_layer(c, &L, dproj, dec, NE, dcst_f, drst_f, cnt, 0, tc, &nan_f);
        float *ok2 = dev_layer(c, &L, dproj, dec, NE, dcst_k, drst_k, cnt, ck, tc, &nan_k);
        REQUIRE(ou && of && ok2);
        CHECK_MSG(!nan_u && nan_f && nan_k,
                  "%s step %d: the fused kernels did not run (scratch written: %d / %d / %d)", name, s,
                  !nan_u, !nan_f, !nan_k);
        size_t at = 0;
        CHECK_MSG(same_bits(of, ou, (size_t)NE * L.vd, &at),
                  "%s step %d: fused output differs at %zu: %.9g vs %.9g", name, s, at, of[at], ou[at]);
        CHECK_MSG(same_bits(ok2, ou, (size_t)NE * L.vd, &at),
                  "%s step %d: clustered output differs at %zu: %.9g vs %.9g", name, s, at, ok2[at], ou[at]);
        {
            float *ck_ = get(dcst_k, cs_n), *rk = get(drst_k, rs_n), *cu2 = get(dcst_u, cs_n),
                  *ru2 = get(drst_u, rs_n);
            CHECK_MSG(same_bits(ck_, cu2, cs_n, &at),
                      "%s step %d: clustered conv windows differ at %zu: %.9g vs %.9g", name, s, at, ck_[at],
                      cu2[at]);
            CHECK_MSG(same_bits(rk, ru2, rs_n, &at),
                      "%s step %d: clustered recurrent states differ at %zu: %.9g vs %.9g", name, s, at,
                      rk[at], ru2[at]);
            for (int v = 0; v < N_CL2; v++) {
                /* the second form: the same bits again (outputs, windows, states) */
                float *o2 = dev_layer(c, &L, dproj, dec, NE, dcst_2[v], drst_2[v], cnt, 2 + v, tc, &nan_k);
                REQUIRE(o2);
                CHECK_MSG(nan_k, "%s step %d: form %d did not run fused", name, s, 2 + v);
                float *c2 = get(dcst_2[v], cs_n), *r2 = get(drst_2[v], rs_n);
                CHECK_MSG(same_bits(o2, ou, (size_t)NE * L.vd, &at),
                          "%s step %d: clustered form %d output differs at %zu: %.9g vs %.9g", name, s, 2 + v,
                          at, o2[at], ou[at]);
                CHECK_MSG(same_bits(c2, cu2, cs_n, &at),
                          "%s step %d: clustered form %d conv windows differ at %zu: %.9g vs %.9g", name, s,
                          2 + v, at, c2[at], cu2[at]);
                CHECK_MSG(same_bits(r2, ru2, rs_n, &at),
                          "%s step %d: clustered form %d recurrent states differ at %zu: %.9g vs %.9g", name,
                          s, 2 + v, at, r2[at], ru2[at]);
                free(o2), free(c2), free(r2);
            }
            /* one block a value head: the same bits again */
            float *ow = dev_layer(c, &L, dproj, dec, NE, dcst_w, drst_w, cnt, -1, tc, &nan_k);
            REQUIRE(ow);
            CHECK_MSG(nan_k, "%s step %d: the wide form did not run fused", name, s);
            float *cw = get(dcst_w, cs_n), *rw = get(drst_w, rs_n);
            CHECK_MSG(same_bits(ow, ou, (size_t)NE * L.vd, &at),
                      "%s step %d: wide output differs at %zu: %.9g vs %.9g", name, s, at, ow[at], ou[at]);
            CHECK_MSG(same_bits(cw, cu2, cs_n, &at),
                      "%s step %d: wide conv windows differ at %zu: %.9g vs %.9g", name, s, at, cw[at],
                      cu2[at]);
            CHECK_MSG(same_bits(rw, ru2, rs_n, &at),
                      "%s step %d: wide recurrent states differ at %zu: %.9g vs %.9g", name, s, at, rw[at],
                      ru2[at]);
            free(ow), free(cw), free(rw);
            free(ck_), free(rk), free(cu2), free(ru2);
        }
        free(ok2);
        r = rel(of, o_ref, (size_t)NE * L.vd);
        if (r > worst) worst = r;
        CHECK_MSG(r <= 1e-5, "%s step %d: fused output vs cpu %.3g", name, s, r);
        float *cu_ = get(dcst_u, cs_n), *cf = get(dcst_f, cs_n), *ru = get(drst_u, rs_n),
              *rf = get(drst_f, rs_n);
        CHECK_MSG(same_bits(cf, cu_, cs_n, &at), "%s step %d: conv windows differ at %zu: %.9g vs %.9g", name,
                  s, at, cf[at], cu_[at]);
        CHECK_MSG(same_bits(rf, ru, rs_n, &at), "%s step %d: recurrent states differ at %zu: %.9g vs %.9g",
                  name, s, at, rf[at], ru[at]);
        if (s == steps - 1) {
            double rc = rel(cf, cst, cs_n), rr = rel(rf, rst, rs_n);
            printf("     %-5s NE %d %d decode steps: fused == clustered (forms 1, 2) == wide == four kernels "
                   "bitwise (outputs, "
                   "windows, "
                   "states); "
                   "vs cpu: outputs <= %.2e, windows %.2e, states %.2e\n",
                   name, NE, steps, worst, rc, rr);
            CHECK_MSG(rc <= 1e-6 && rr <= 1e-5, "%s: states vs cpu %.3g / %.3g", name, rc, rr);
        }
        free(cu_), free(cf), free(ru), free(rf);
        free(ou), free(of), free(proj), free(o_ref), cu_free(dproj);
        for (int i = 0; i < NE; i++) dec[i].len++;
    }
    /* the counters are back to zero for the next launch (a graph replays the same scratch) */
    unsigned *hc = malloc((size_t)NE * Hk * sizeof(unsigned));
    REQUIRE(cu_download(hc, cnt, (size_t)NE * Hk * sizeof(unsigned), err, sizeof err) == 0);
    int zero = 1;
    for (int i = 0; i < NE * Hk; i++) zero &= hc[i] == 0;
    CHECK_MSG(zero, "%s: the fused kernel's counters were not set back to 0", name);
    free(hc), free(dec), free(cst), free(rst);
    cu_free(dcst_u), cu_free(drst_u), cu_free(dcst_f), cu_free(drst_f), cu_free(dcst_k), cu_free(drst_k);
    for (int v = 0; v < N_CL2; v++) cu_free(dcst_2[v]), cu_free(drst_2[v]);
    cu_free(dcst_w), cu_free(drst_w);
    cu_free(cnt);
    layer_free(&L);
    cu_ctx_destroy(c);
}

/* one entry; four entries in scattered slots with prompts across and inside the 64-grid (and a 1-token one)
 */
static const ent one[] = {{0, 37, 2}};
static const ent four[] = {{0, 70, 3}, {0, 5, 0}, {0, 130, 5}, {0, 1, 1}};
#define N_OF(x) ((int)(sizeof(x) / sizeof((x)[0])))

TEST(cuda_fused_gdn_tiny) {
    if (cuda_devices() < 1) SKIP("no CUDA device: skipped");
    fused_case("tiny", 2, 6, 32, 48, one, N_OF(one), 5);
    fused_case("tiny", 2, 6, 32, 48, four, N_OF(four), 5);
    fused_case("dk64", 1, 2, 64, 64, four, N_OF(four), 3);
}

TEST(cuda_fused_gdn_4b) {
    if (cuda_devices() < 1) SKIP("no CUDA device: skipped");
    fused_case("4B", 16, 32, 128, 128, one, N_OF(one), 4);
    fused_case("4B", 16, 32, 128, 128, four, N_OF(four), 3);
}

TEST(cuda_fused_gdn_27b) {
    if (cuda_devices() < 1) SKIP("no CUDA device: skipped");
    fused_case("27B", 16, 48, 128, 128, one, N_OF(one), 3);
    fused_case("27B", 16, 48, 128, 128, four, N_OF(four), 2);
}

/* ---- attention decode: attn_kernel<FUSED> (cu_attn_args.dec_cnt, CINFER_CUDA_ATTN_FUSED) ---- */

static void rope_ref(float *x, int R, int pos, const float *inv) {
    for (int i = 0; i < R / 2; i++) {
        float ang = (float)pos * inv[i], cs = cosf(ang), sn = sinf(ang), p = x[i], q = x[i + R / 2];
        x[i] = p * cs - q * sn;
        x[i + R / 2] = q * cs + p * sn;
    }
}

/* > 0 (with nsmax): rows at positions >= g_fp by attn_dec_kernel, the others by attn_kernel
 * (cu_attn_args.dec_p, forward_cuda's grids and classes for the rows of the launch); and each row launched
 * alone (fused, its own grids and class) against its bits in the batch */
static int g_fp = 0;
/* > 0: the fused passes and the rows alone run attn_dec_kernel with this many q heads a block
 * (cu_attn_args.dec_hs), the unfused pass with the whole group: the head split must give the same bits */
static int g_fhs = 0;
static void fp_grids(cu_attn_args *a, int span, int minpos, int maxpos, int nsmax) {
    int P = g_fp;
    a->dec_p = P, a->dec_cls = (minpos < P) | (maxpos >= P) << 1;
    a->dec_span = span > 0 ? span : CU_ATTN_DEC_CH; /* its stages: one up to CU_ATTN_DEC_CH */
    a->dec_nsplit = maxpos >= P ? cu_attn_dec_grid(maxpos, nsmax) : 0;
    a->span = 64, a->nsplit = minpos < P ? cu_attn_row_grid(maxpos < P - 1 ? maxpos : P - 1) : 0;
}

/* decode rows of entries with lens[i] earlier positions (noise in the pool), `steps` steps: the three kernels
 * on one copy of the pools, the fused kernel on another (outputs and pools bitwise equal), an f64 CPU
 * reference (within 1e-5). span: positions per split (1 << 20: one split); the splits are counted from the
 * longest entry, so shorter ones have empty splits (as in a decode graph kept over several steps) */
static void attn_fused_case(int Hq, int Hkv, int hd, int span, const int *lens, int NE, int steps,
                            int nsmax) {
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    int n_full = 2, full = 1, R = hd / 4, kvd = Hkv * hd, ld = Hq * 2 * hd + 2 * kvd + 8, n_blocks = 64,
        g = 0;
    float eps = 1e-6f;
    for (int i = 0; i < NE; i++) g += (lens[i] + steps + 15) / 16;
    while (n_blocks < g) n_blocks *= 2;
    int **tables = malloc((size_t)NE * sizeof(int *));
    g = 0;
    for (int i = 0; i < NE; i++) {
        int k = (lens[i] + steps + 15) / 16;
        tables[i] = malloc((size_t)k * sizeof(int));
        for (int j = 0; j < k; j++, g++) tables[i][j] = (g * 5 + 3) % n_blocks; /* a permutation */
    }
    size_t pool_n = (size_t)n_full * n_blocks * 16 * kvd;
    float *kp = rnd(pool_n, 1.0f), *vp = rnd(pool_n, 1.0f);
    float *qn = rnd((size_t)hd, 0.3f), *kn = rnd((size_t)hd, 0.3f), *inv = malloc((size_t)R / 2 * 4);
    for (int i = 0; i < hd; i++) qn[i] += 1.0f, kn[i] += 1.0f;
    for (int j = 0; j < R / 2; j++) inv[j] = 1.0f / (float)pow(1e7, (double)((float)(2 * j) / (float)R));
    float *dkp_u = dup_dev(kp, pool_n * 4), *dvp_u = dup_dev(vp, pool_n * 4);
    float *dkp_f = dup_dev(kp, pool_n * 4), *dvp_f = dup_dev(vp, pool_n * 4);
    float *dqn = dup_dev(qn, (size_t)hd * 4), *dkn = dup_dev(kn, (size_t)hd * 4);
    float *dinv = dup_dev(inv, (size_t)R / 2 * 4);
    unsigned *cnt = NULL;
    REQUIRE(cu_alloc((void **)&cnt, (size_t)NE * Hq * sizeof(unsigned), err, sizeof err) == 0);
    cu_fill_f32(c, (float *)cnt, (size_t)NE * Hq, 0.0f);
    int maxlen = 0, minlen = lens[0], n_alone = 0, alone_same = 1;
    for (int i = 0; i < NE; i++) maxlen = lens[i] > maxlen ? lens[i] : maxlen;
    for (int i = 0; i < NE; i++) minlen = lens[i] < minlen ? lens[i] : minlen;
    size_t no = (size_t)NE * Hq * hd;
    float *o_r = malloc(no * 4), *q = malloc((size_t)hd * 4);
    double worst = 0;
    int nsplit = 0;
#define KROW(P, i, pos) (P + (((size_t)full * n_blocks + tables[i][(pos) / 16]) * 16 + (pos) % 16) * kvd)
    for (int s = 0; s < steps; s++) {
        int maxpos = maxlen + s;
        nsplit = nsmax ? cu_attn_dec_grid(maxpos, nsmax) : (maxpos + span) / span;
        float *qkv = rnd((size_t)NE * ld, 1.0f);
        /* CPU: the rows' k and v into the pools, then softmax attention in f64 */
        for (int i = 0; i < NE; i++) {
            int pos = lens[i] + s;
            const float *row = qkv + (size_t)i * ld;
            for (int h = 0; h < Hkv; h++) {
                float *k = KROW(kp, i, pos) + (size_t)h * hd;
                ops_rmsnorm(k, row + (size_t)Hq * 2 * hd + (size_t)h * hd, kn, hd, eps);
                rope_ref(k, R, pos, inv);
            }
            memcpy(KROW(vp, i, pos), row + (size_t)Hq * 2 * hd + kvd, (size_t)kvd * 4);
            for (int h = 0; h < Hq; h++) {
                int kvh = h / (Hq / Hkv);
                ops_rmsnorm(q, row + (size_t)h * 2 * hd, qn, hd, eps);
                rope_ref(q, R, pos, inv);
                const float *gate = row + (size_t)h * 2 * hd + hd;
                double *sc = malloc((size_t)(pos + 1) * sizeof(double)), mx = -1e300, sum = 0;
                for (int u = 0; u <= pos; u++) {
                    const float *k = KROW(kp, i, u) + (size_t)kvh * hd;
                    double d = 0;
                    for (int t = 0; t < hd; t++) d += (double)q[t] * k[t];
                    sc[u] = d / sqrt((double)hd);
                    mx = sc[u] > mx ? sc[u] : mx;
                }
                for (int u = 0; u <= pos; u++) sum += (sc[u] = exp(sc[u] - mx));
                for (int t = 0; t < hd; t++) {
                    double o = 0;
                    for (int u = 0; u <= pos; u++) o += sc[u] / sum * KROW(vp, i, u)[(size_t)kvh * hd + t];
                    o_r[((size_t)i * Hq + h) * hd + t] = (float)(o * (1.0 / (1.0 + exp(-(double)gate[t]))));
                }
                free(sc);
            }
        }
        /* metadata with block tables (dev_meta has none) */
        size_t nb = 0;
        for (int i = 0; i < NE; i++) nb += (size_t)(lens[i] + s + 16) / 16;
        size_t o_pos = NE, o_ent = 2 * (size_t)NE, o_len = 3 * (size_t)NE, o_n = o_len + NE, o_r0 = o_n + NE,
               o_slot = o_r0 + NE, o_boff = o_slot + NE, o_lrow = o_boff + NE, o_spec = o_lrow + NE,
               o_blk = o_spec + NE, tot = o_blk + nb;
        int *hm = calloc(tot + 1, sizeof(int));
        for (int i = 0, bo = 0; i < NE; i++) {
            int k = (lens[i] + s + 16) / 16;
            hm[o_pos + i] = lens[i] + s, hm[o_ent + i] = i, hm[o_len + i] = lens[i] + s, hm[o_n + i] = 1;
            hm[o_r0 + i] = i, hm[o_boff + i] = bo, hm[o_lrow + i] = i;
            for (int j = 0; j < k; j++) hm[o_blk + bo + j] = tables[i][j];
            bo += k;
        }
        int *dm = dup_dev(hm, (tot + 1) * sizeof(int));
        cu_meta meta = {dm,          dm + o_pos,  dm + o_ent,  dm + o_len, dm + o_n,    dm + o_r0,
                        dm + o_slot, dm + o_boff, dm + o_lrow, dm + o_blk, dm + o_spec, NULL};
        int ndp = nsmax ? cu_attn_dec_grid(maxpos, nsmax) + 8 : 1; /* the dec kernel's partials (per row) */
        float *out[3] = {NULL, NULL, NULL}, *qkv_after[3] = {NULL, NULL, NULL};
        /* pass 2: the fused kernel again with more splits launched than the positions need (forward_cuda's
         * CINFER_CUDA_ATTN_ROUND): the same bits */
        for (int pass = 0; pass < 3; pass++) {
            int fused = pass > 0, ns = pass == 2 ? ((nsplit + 7) & ~7) + 8 : nsplit;
            if (pass == 2 && nsplit == 1) continue; /* one split is never rounded */
            cu_attn_args a = {0};
            a.T = NE, a.Hq = Hq, a.Hkv = Hkv, a.hd = hd, a.rope_dim = R, a.n_blocks = n_blocks, a.full = full;
            a.qkv = dup_dev(qkv, (size_t)NE * ld * 4), a.ld = ld, a.q_norm = dqn, a.k_norm = dkn;
            a.inv_freq = dinv, a.kpool = fused ? dkp_f : dkp_u, a.vpool = fused ? dvp_f : dvp_u;
            a.o = NULL, a.part = NULL;
            cu_alloc((void **)&a.o, no * 4, err, sizeof err);
            size_t np = (size_t)NE * Hq * (ns > CU_ATTN_ROW_NS + 8 ? ns : CU_ATTN_ROW_NS + 8) * (hd + 4);
            cu_alloc((void **)&a.part, np * 4, err, sizeof err);
            cu_fill_f32(c, a.o, no, NAN), cu_fill_f32(c, a.part, np, NAN);
            a.span = span, a.nsplit = ns, a.eps = eps, a.meta = meta;
            a.dec_cnt = fused ? cnt : NULL;
            a.dec_nsmax = nsmax;
            a.dec_hs = fused ? g_fhs : 0;
            if (nsmax && g_fp > 0) {
                fp_grids(&a, span, minlen + s, maxpos, nsmax);
                if (pass == 2) { /* more splits launched than the positions need: the same bits */
                    if (a.nsplit > 1) a.nsplit += 8;
                    if (a.dec_nsplit > 1) a.dec_nsplit += 8;
                }
                cu_alloc((void **)&a.dec_part, (size_t)NE * Hq * ndp * (hd + 4) * 4, err, sizeof err);
                cu_fill_f32(c, a.dec_part, (size_t)NE * Hq * ndp * (hd + 4), NAN);
            }
            cu_attn_layer(c, &a);
            if (cu_sync(c, err, sizeof err)) test_fail(__FILE__, __LINE__, "cu_attn_layer: %s", err);
            out[pass] = get(a.o, no);
            qkv_after[pass] = get(a.qkv, (size_t)NE * ld);
            cu_free(a.qkv), cu_free(a.o), cu_free(a.part), cu_free(a.dec_part);
        }
        /* each row alone, fused, with the grids and class its own position gives (forward_cuda at one row;
         * its own K and V written again: the same values), against its bits in the batch */
        for (int i = 0; nsmax && g_fp > 0 && out[1] && i < NE; i++) {
            int pos = lens[i] + s, k = (lens[i] + s + 16) / 16, *h1 = calloc(16 + (size_t)k, sizeof(int));
            size_t p_pos = 1, p_ent = 2, p_len = 3, p_n = 4, p_r0 = 5, p_slot = 6, p_boff = 7, p_lrow = 8,
                   p_spec = 9, p_blk = 10;
            h1[p_pos] = pos, h1[p_ent] = 0, h1[p_len] = pos, h1[p_n] = 1, h1[p_lrow] = 0;
            for (int j = 0; j < k; j++) h1[p_blk + j] = tables[i][j];
            int *d1 = dup_dev(h1, (p_blk + (size_t)k) * sizeof(int));
            cu_attn_args a = {0};
            a.T = 1, a.Hq = Hq, a.Hkv = Hkv, a.hd = hd, a.rope_dim = R, a.n_blocks = n_blocks, a.full = full;
            a.qkv = dup_dev(qkv + (size_t)i * ld, (size_t)ld * 4), a.ld = ld, a.q_norm = dqn, a.k_norm = dkn;
            a.inv_freq = dinv, a.kpool = dkp_f, a.vpool = dvp_f, a.eps = eps;
            a.meta = (cu_meta){d1,          d1 + p_pos,  d1 + p_ent,  d1 + p_len, d1 + p_n,    d1 + p_r0,
                               d1 + p_slot, d1 + p_boff, d1 + p_lrow, d1 + p_blk, d1 + p_spec, NULL};
            a.dec_cnt = cnt, a.dec_nsmax = nsmax, a.dec_hs = g_fhs;
            /* the other stage count than the batch's (one stage, chunk after chunk, or two): the same bits */
            fp_grids(&a, span > CU_ATTN_DEC_CH ? CU_ATTN_DEC_CH : 2 * CU_ATTN_DEC_CH, pos, pos, nsmax);
            size_t np = (size_t)Hq * (CU_ATTN_ROW_NS + 8) * (hd + 4);
            cu_alloc((void **)&a.o, (size_t)Hq * hd * 4, err, sizeof err);
            cu_alloc((void **)&a.part, np * 4, err, sizeof err);
            cu_alloc((void **)&a.dec_part, (size_t)Hq * ndp * (hd + 4) * 4, err, sizeof err);
            cu_fill_f32(c, a.o, (size_t)Hq * hd, NAN);
            cu_attn_layer(c, &a);
            if (cu_sync(c, err, sizeof err)) test_fail(__FILE__, __LINE__, "cu_attn_layer: %s", err);
            float *g1 = get(a.o, (size_t)Hq * hd);
            size_t at1 = 0;
            int same = same_bits(g1, out[1] + (size_t)i * Hq * hd, (size_t)Hq * hd, &at1);
            CHECK_MSG(same, "attention hd=%d step %d: row %d (position %d, P %d) alone differs at %zu", hd, s,
                      i, pos, g_fp, at1);
            alone_same &= same, n_alone++;
            free(g1), free(h1);
            cu_free(d1), cu_free(a.qkv), cu_free(a.o), cu_free(a.part), cu_free(a.dec_part);
        }
        /* the three kernels norm q in place in the row; the fused kernel leaves the row as it was */
        CHECK_MSG(memcmp(qkv_after[0], qkv, (size_t)NE * ld * 4) &&
                      !memcmp(qkv_after[1], qkv, (size_t)NE * ld * 4),
                  "attention hd=%d step %d: the fused kernel did not run", hd, s);
        size_t at = 0;
        CHECK_MSG(same_bits(out[1], out[0], no, &at),
                  "attention hd=%d span %d step %d: output differs at %zu: %.9g vs %.9g", hd, span, s, at,
                  out[1][at], out[0][at]);
        double r = rel(out[1], o_r, no);
        worst = r > worst ? r : worst;
        CHECK_MSG(r <= 1e-5, "attention hd=%d span %d step %d: fused vs cpu %.3g", hd, span, s, r);
        if (out[2])
            CHECK_MSG(same_bits(out[2], out[1], no, &at),
                      "attention hd=%d span %d step %d: %d splits launched for %d differ at %zu", hd, span, s,
                      ((nsplit + 7) & ~7) + 8, nsplit, at);
        for (int t = 0; t < 3; t++) free(out[t]), free(qkv_after[t]);
        free(hm), free(qkv);
        cu_free(dm);
    }
    float *ku = get(dkp_u, pool_n), *kf = get(dkp_f, pool_n), *vu = get(dvp_u, pool_n),
          *vf = get(dvp_f, pool_n);
    size_t at = 0;
    CHECK_MSG(same_bits(kf, ku, pool_n, &at), "attention hd=%d: K pools differ at %zu", hd, at);
    CHECK_MSG(same_bits(vf, vu, pool_n, &at), "attention hd=%d: V pools differ at %zu", hd, at);
    double rk = rel(kf, kp, pool_n);
    CHECK_MSG(rk <= 1e-5 && !memcmp(vf, vp, pool_n * 4), "attention hd=%d: pools vs cpu %.3g", hd, rk);
    unsigned *hc = malloc((size_t)NE * Hq * sizeof(unsigned));
    REQUIRE(cu_download(hc, cnt, (size_t)NE * Hq * sizeof(unsigned), err, sizeof err) == 0);
    int zero = 1;
    for (int i = 0; i < NE * Hq; i++) zero &= hc[i] == 0;
    CHECK_MSG(zero, "attention hd=%d: the fused kernel's counters were not set back to 0", hd);
    printf("     attention Hq %d Hkv %d hd %d%s, %d rows, %d splits, %d steps: fused%s == unfused "
           "bitwise (outputs, pools); vs cpu <= %.2e, K pool %.2e\n",
           Hq, Hkv, hd, nsmax ? " (dec kernel)" : "", NE, nsplit, steps, g_fhs ? " (heads split)" : "", worst,
           rk);
    if (n_alone)
        printf(
            "     rows >= %d by the dec kernel, the others attn_kernel: %d rows alone vs in the batch: %s\n",
            g_fp, n_alone, alone_same ? "bit-identical" : "DIFFERENT");
#undef KROW
    free(hc), free(ku), free(kf), free(vu), free(vf);
    for (int i = 0; i < NE; i++) free(tables[i]);
    free(tables), free(kp), free(vp), free(qn), free(kn), free(inv), free(o_r), free(q);
    cu_free(dkp_u), cu_free(dvp_u), cu_free(dkp_f), cu_free(dvp_f), cu_free(dqn), cu_free(dkn), cu_free(dinv),
        cu_free(cnt);
    cu_ctx_destroy(c);
}

TEST(cuda_fused_attention_decode) {
    if (cuda_devices() < 1) SKIP("no CUDA device: skipped");
    static const int l1[] = {517}, l4[] = {20, 300, 100, 70};
    attn_fused_case(16, 4, 256, 64, l1, 1, 3, 0);      /* the 4B shape at batch 1: 9 splits */
    attn_fused_case(16, 4, 256, 1 << 20, l1, 1, 2, 0); /* one split: no merge */
    attn_fused_case(4, 2, 64, 64, l4, 4, 3, 0);        /* empty splits for the shorter rows */
    attn_fused_case(8, 1, 128, 1 << 20, l4, 4, 2, 0);
}

/* the same for CINFER_CUDA_ATTN_DEC=2's kernel (cu_attn_args.dec_nsmax): fused (prep, merge in the last
 * block, PDL's early loads) against its unfused form bitwise and the CPU; spans of 32 (17 at 517 positions),
 * three long spans, one span of many chunks; rows whose spans differ in one launch; G = 4, 2, 8, 6; one and
 * two stages of shared memory (span <= 32 or not) */
TEST(cuda_fused_attention_dec) {
    if (cuda_devices() < 1) SKIP("no CUDA device: skipped");
    static const int l1[] = {517}, l4[] = {20, 300, 100, 70}, l3[] = {1000, 31, 64};
    attn_fused_case(16, 4, 256, 0, l1, 1, 3, 32); /* span 0: one stage of shared memory */
    attn_fused_case(16, 4, 256, 64, l1, 1, 2, 3); /* 64: two, chunks double-buffered */
    attn_fused_case(16, 4, 256, 0, l1, 1, 2, 1);  /* one stage, 17 chunks one after another */
    attn_fused_case(4, 2, 64, 64, l4, 4, 3, 32);
    attn_fused_case(8, 1, 128, 0, l4, 4, 2, 4);
    attn_fused_case(24, 4, 256, 64, l3, 3, 2, 32);
}

/* rows by class (CINFER_CUDA_ATTN_DEC_P): a batch of 32 decode rows at positions 3..638 (the 4B shape)
 * with P = 512 (a row at 511 crossing it on the second step), P = 100 at G = 2, P = 1 (every row the dec
 * kernel) and P = 4096 (none): fused == unfused bitwise, vs the CPU, and every row alone (its own grids and
 * class: one launch; the dec kernel on the other stage count, CINFER_CUDA_ATTN_DEC_1ST) bit-identical to its
 * bits in the mixed batch (two launches) */
TEST(cuda_fused_attention_dec_p) {
    if (cuda_devices() < 1) SKIP("no CUDA device: skipped");
    int l32[32];
    for (int i = 0; i < 32; i++) l32[i] = 3 + (i * 37) % 636;
    l32[7] = 511;
    static const int l4[] = {20, 300, 100, 70};
    g_fp = 512;
    attn_fused_case(16, 4, 256, 64, l32, 32, 2, 64);
    g_fp = 100;
    attn_fused_case(4, 2, 64, 0, l4, 4, 3, 32);
    g_fp = 1;
    attn_fused_case(16, 4, 256, 64, l4, 4, 2, 64);
    g_fp = 4096;
    attn_fused_case(16, 4, 256, 64, l4, 4, 2, 64);
    g_fp = 0;
}

/* CINFER_CUDA_ATTN_DEC_HS: attn_dec_kernel with a kv head's q heads over several blocks (cu_attn_args.dec_hs)
 * against the unfused form with whole groups, bitwise, and the CPU: the 4B shape at one row (17 spans) with 2
 * and 1 heads a block (two stages too), the 35B-A3B's (G 8) with 4 and 2 (one span: no merge), G 6 with 3,
 * rows of different spans with each row alone (P = 1), a value that does not divide G (the whole group), and
 * the launch's own choice (-1, the default: the batch and each row alone may choose differently) */
TEST(cuda_fused_attention_dec_hs) {
    if (cuda_devices() < 1) SKIP("no CUDA device: skipped");
    static const int l1[] = {517}, l4[] = {20, 300, 100, 70}, l3[] = {1000, 31, 64};
    g_fhs = 2;
    attn_fused_case(16, 4, 256, 0, l1, 1, 3, 32);
    g_fhs = 1;
    attn_fused_case(16, 4, 256, 64, l1, 1, 2, 3);
    g_fhs = 4;
    attn_fused_case(16, 2, 256, 0, l1, 1, 3, 32);
    g_fhs = 2;
    attn_fused_case(16, 2, 256, 0, l1, 1, 2, 1);
    g_fhs = 3;
    attn_fused_case(24, 4, 256, 64, l3, 3, 2, 32);
    g_fp = 1, g_fhs = 2;
    attn_fused_case(16, 4, 256, 64, l4, 4, 2, 64);
    g_fhs = 4;
    attn_fused_case(16, 2, 256, 0, l4, 4, 2, 64);
    g_fhs = -1;
    attn_fused_case(16, 2, 256, 0, l4, 4, 2, 64);
    attn_fused_case(16, 4, 256, 64, l4, 4, 2, 64);
    g_fp = 0;
    attn_fused_case(16, 2, 256, 0, l1, 1, 3, 64);
    g_fhs = 3;
    attn_fused_case(4, 2, 64, 64, l4, 4, 2, 32);
    g_fhs = 0;
}

/* Timing, not a bound: the attention decode layer at the 4B shape (Hq 16, Hkv 4, hd 256), fused form, plain
 * launches back to back (CUDA events over 50), rows x positions 1 x 512, 1 x 4096, 1 x 32768, 64 x 512, 64 x
 * 4096: attn_kernel with forward_cuda's split choice against attn_dec_kernel at several span counts
 * (CINFER_CUDA_ATTN_DEC_NS). Fails only when a form leaves NaN in its output. */
static int g_dec_diag = 0; /* cu_attn_args.dec_diag of the new form's timings */
static int g_row_form =
    0;                   /* 1: also attn_kernel with spans from each row's position (dec_p's rows below P) */
static int g_sp_hkv = 4; /* the speed cases' kv heads (Hq 16): 4 the 4B shape, 2 the 35B-A3B's */
static int g_sp_hs = 0;  /* the dec kernel's q heads a block (cu_attn_args.dec_hs) */
static void attn_speed_case(cu_ctx *c, int T, int P, const int *nss, int nns) {
    const int Hq = 16, Hkv = g_sp_hkv, hd = 256, R = 64, kvd = Hkv * hd, ld = Hq * 2 * hd + 2 * kvd;
    int nbr = (P + 16) / 16, n_blocks = T * nbr;
    char err[256];
    size_t pool_n = (size_t)n_blocks * 16 * kvd;
    float *kp = NULL, *vp = NULL, *qkv = NULL, *o = NULL, *part = NULL, *qn = NULL, *inv = NULL;
    unsigned *cnt = NULL;
    int maxns = 64;
    for (int i = 0; i < nns; i++) maxns = nss[i] > maxns ? nss[i] : maxns;
    if (cu_alloc((void **)&kp, pool_n * 4, err, sizeof err) ||
        cu_alloc((void **)&vp, pool_n * 4, err, sizeof err) ||
        cu_alloc((void **)&qkv, (size_t)T * ld * 4, err, sizeof err) ||
        cu_alloc((void **)&o, (size_t)T * Hq * hd * 4, err, sizeof err) ||
        cu_alloc((void **)&part, (size_t)T * Hq * maxns * (hd + 4) * 4, err, sizeof err) ||
        cu_alloc((void **)&qn, (size_t)hd * 4, err, sizeof err) ||
        cu_alloc((void **)&inv, 32 * 4, err, sizeof err) ||
        cu_alloc((void **)&cnt, (size_t)T * Hq * 4, err, sizeof err))
        test_fail(__FILE__, __LINE__, "alloc: %s", err);
    cu_fill_f32(c, kp, pool_n, 0.01f), cu_fill_f32(c, vp, pool_n, 0.02f),
        cu_fill_f32(c, qkv, (size_t)T * ld, 0.5f);
    cu_fill_f32(c, qn, (size_t)hd, 1.0f), cu_fill_f32(c, inv, 32, 0.001f),
        cu_fill_f32(c, (float *)cnt, (size_t)T * Hq, 0.0f);
    /* metadata: T entries of one decode row at position P, block tables consecutive */
    size_t o_pos = T, o_ent = 2 * (size_t)T, o_len = 3 * (size_t)T, o_n = o_len + T, o_r0 = o_n + T,
           o_slot = o_r0 + T, o_boff = o_slot + T, o_lrow = o_boff + T, o_spec = o_lrow + T,
           o_blk = o_spec + T, tot = o_blk + (size_t)n_blocks;
    int *hm = calloc(tot + 1, sizeof(int));
    for (int i = 0; i < T; i++) {
        hm[o_pos + i] = P, hm[o_ent + i] = i, hm[o_len + i] = P, hm[o_n + i] = 1, hm[o_r0 + i] = i;
        hm[o_boff + i] = i * nbr, hm[o_lrow + i] = i;
    }
    for (int b = 0; b < n_blocks; b++) hm[o_blk + b] = b;
    int *dm = dup_dev(hm, (tot + 1) * sizeof(int));
    cu_meta meta = {dm,          dm + o_pos,  dm + o_ent,  dm + o_len, dm + o_n,    dm + o_r0,
                    dm + o_slot, dm + o_boff, dm + o_lrow, dm + o_blk, dm + o_spec, NULL};
    cu_timer *t0, *t1;
    REQUIRE(cu_timer_create(&t0) == 0 && cu_timer_create(&t1) == 0);
    double gb = (double)T * (P + 1) * kvd * 8.0 / 1e9;
    int iters = (double)T * P > 64.0 * 4096 ? 10 : 50;
    /* g_row_form: one more form, the last span count's dec kernel on one stage of shared memory whatever the
     * span (cu_attn_args.span <= CU_ATTN_DEC_CH: chunk after chunk, the same bits, 2 blocks an SM) */
    for (int f = g_dec_diag ? 0 : g_row_form ? -2 : -1; f < nns + g_row_form; f++) {
        cu_attn_args a = {0};
        a.T = T, a.Hq = Hq, a.Hkv = Hkv, a.hd = hd, a.rope_dim = R, a.n_blocks = n_blocks, a.full = 0;
        a.qkv = qkv, a.ld = ld, a.q_norm = qn, a.k_norm = qn, a.inv_freq = inv, a.kpool = kp, a.vpool = vp;
        a.o = o, a.part = part, a.eps = 1e-6f, a.meta = meta, a.dec_cnt = cnt, a.dec_hs = g_sp_hs;
        if (f == -2) { /* every row below dec_p: attn_kernel, spans from the row's position */
            a.dec_nsmax = 64, a.dec_p = 1 << 30, a.dec_cls = 1, a.span = 64, a.nsplit = cu_attn_row_grid(P);
        } else if (f < 0) { /* forward_cuda's attn_split for attn_kernel (ATTN_ROUND on) */
            int rows = T * Hq, want = rows >= 1024 ? 1 : (1024 + rows - 1) / rows, sp = 64;
            while ((P + sp) / sp > want) sp *= 2;
            int ns = (P + sp) / sp;
            if (ns > 1) {
                int r8 = (ns + 7) & ~7, cap = want > ns ? want : ns;
                ns = r8 < cap ? r8 : cap;
            }
            a.span = sp, a.nsplit = ns;
        } else if (f == nns) {
            a.dec_nsmax = nss[f - 1], a.nsplit = cu_attn_dec_grid(P, nss[f - 1]), a.span = CU_ATTN_DEC_CH;
        } else {
            a.dec_nsmax = nss[f], a.nsplit = cu_attn_dec_grid(P, nss[f]), a.dec_diag = g_dec_diag;
            a.span = (P + CU_ATTN_DEC_CH) / CU_ATTN_DEC_CH <= nss[f] ? CU_ATTN_DEC_CH : 2 * CU_ATTN_DEC_CH;
        }
        cu_fill_f32(c, o, (size_t)T * Hq * hd, NAN);
        cu_attn_layer(c, &a); /* warm-up */
        cu_timer_start(c, t0);
        for (int i = 0; i < iters; i++) cu_attn_layer(c, &a);
        cu_timer_start(c, t1);
        REQUIRE(cu_sync(c, err, sizeof err) == 0);
        double us = cu_timer_between_ms(t0, t1) * 1000.0 / iters;
        float *go = get(o, (size_t)T * Hq * hd);
        int nan = 0;
        for (size_t i = 0; i < (size_t)T * Hq * hd; i++) nan |= isnan(go[i]);
        free(go);
        if (f == -2)
            printf("     rows %2d pos %5d attn_kernel, row spans (%2d splits): %8.2f us  %6.0f GB/s\n", T, P,
                   a.nsplit, us, gb / us * 1e6);
        else if (f < 0)
            printf("     rows %2d pos %5d attn_kernel (%2d splits of %5d): %8.2f us  %6.0f GB/s\n", T, P,
                   a.nsplit, a.span, us, gb / us * 1e6);
        else
            printf("     rows %2d pos %5d attn_dec_kernel (Hkv %d, heads a block %d, ns <= %2d, grid %2d, "
                   "diag %d, %d stage%s): %8.2f us  %6.0f GB/s\n",
                   T, P, Hkv, g_sp_hs > 0 && (Hq / Hkv) % g_sp_hs == 0 ? g_sp_hs : Hq / Hkv, a.dec_nsmax,
                   a.nsplit, g_dec_diag, a.span <= CU_ATTN_DEC_CH ? 1 : 2,
                   a.span <= CU_ATTN_DEC_CH ? "" : "s", us, gb / us * 1e6);
        if (f >= 0 && g_dec_diag)
            printf("       (diag %d: outputs not checked)\n", g_dec_diag);
        else
            CHECK_MSG(!nan, "rows %d pos %d form %d: NaN in the output", T, P, f);
    }
    cu_timer_destroy(t0), cu_timer_destroy(t1);
    free(hm);
    cu_free(dm), cu_free(kp), cu_free(vp), cu_free(qkv), cu_free(o), cu_free(part), cu_free(qn), cu_free(inv),
        cu_free(cnt);
}

TEST(cuda_attention_dec_speed) {
    if (cuda_devices() < 1) SKIP("no CUDA device: skipped");
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    static const int ns[] = {8, 16, 32, 64};
    /* where the time of one launch goes (wrong outputs): without the merge, the norms, the arithmetic, the
     * fence and counter; all four (loads alone) */
    static const int diag[] = {1, 2, 4, 8, 15};
    for (int i = 0; i < 5; i++) {
        g_dec_diag = diag[i];
        attn_speed_case(c, 1, 512, &ns[2], 1);
    }
    g_dec_diag = 0;
    attn_speed_case(c, 1, 512, ns, 4);
    attn_speed_case(c, 1, 4096, ns, 4);
    attn_speed_case(c, 1, 32768, ns, 4);
    attn_speed_case(c, 64, 512, ns, 4);
    attn_speed_case(c, 64, 4096, ns, 4);
    cu_ctx_destroy(c);
}

/* Timing, not a bound: where attn_dec_kernel (64 spans a row at most, the default) starts to win against
 * attn_kernel, alone, at 1 and 64 rows (CINFER_CUDA_ATTN_DEC_P's crossover), with attn_kernel both as the
 * batch's split (today's) and with spans from each row's position (what rows below P take) */
TEST(cuda_attention_dec_p_speed) {
    if (cuda_devices() < 1) SKIP("no CUDA device: skipped");
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    static const int ns[] = {64};
    static const int p1[] = {256, 512, 1024, 2048, 4096, 8192};
    static const int p64[] = {512, 1024, 2048, 4096, 8192, 16384, 32768};
    g_row_form = 1;
    for (int i = 0; i < 6; i++) attn_speed_case(c, 1, p1[i], ns, 1);
    for (int i = 0; i < 7; i++) attn_speed_case(c, 64, p64[i], ns, 1);
    g_row_form = 0;
    cu_ctx_destroy(c);
}

/* Timing, not a bound: the dec kernel on two stages of shared memory against one (CINFER_CUDA_ATTN_DEC_1ST:
 * the rows from which one stage wins) at 2..32 rows, 2048 and 8192 positions, next to attn_kernel */
TEST(cuda_attention_dec_stage_speed) {
    if (cuda_devices() < 1) SKIP("no CUDA device: skipped");
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    static const int ns[] = {64}, rows[] = {2, 4, 8, 16, 32};
    g_row_form = 1;
    for (int i = 0; i < 5; i++) attn_speed_case(c, rows[i], 2048, ns, 1);
    for (int i = 0; i < 5; i++) attn_speed_case(c, rows[i], 8192, ns, 1);
    g_row_form = 0;
    cu_ctx_destroy(c);
}

/* Timing, not a bound: CINFER_CUDA_ATTN_DEC_HS (q heads a block of attn_dec_kernel) at the 4B shape (G 4, 4
 * kv heads) and the 35B-A3B's (G 8, 2 kv heads): 1 row at 512 / 4096 / 32768 positions and 64 rows at 512
 * with each divisor of G, attn_kernel first; then at 1 x 512 where the time goes (diag: without the merge,
 * the norms, the arithmetic, the fence and counter; all four) with the whole group and with 2 heads a block
 */
TEST(cuda_attention_dec_hs_speed) {
    if (cuda_devices() < 1) SKIP("no CUDA device: skipped");
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    static const int ns[] = {64}, hkv[] = {4, 2}, pos[] = {512, 4096, 32768}, diag[] = {1, 2, 4, 8, 15};
    for (int k = 0; k < 2; k++) {
        g_sp_hkv = hkv[k];
        for (int p = 0; p < 3; p++)
            for (int hs = 16 / hkv[k]; hs >= 1; hs /= 2) {
                g_sp_hs = hs, g_row_form = hs == 16 / hkv[k];
                attn_speed_case(c, 1, pos[p], ns, 1);
            }
        g_row_form = 0;
        for (int hs = 16 / hkv[k]; hs >= 1; hs /= 2) {
            g_sp_hs = hs;
            attn_speed_case(c, 64, 512, ns, 1);
        }
        for (int hs = 16 / hkv[k]; hs >= 2; hs = hs > 2 ? 2 : 1)
            for (int i = 0; i < 5; i++) {
                g_sp_hs = hs, g_dec_diag = diag[i];
                attn_speed_case(c, 1, 512, ns, 1);
            }
        g_dec_diag = 0;
    }
    g_sp_hkv = 4, g_sp_hs = 0;
    cu_ctx_destroy(c);
}

#else

TEST(cuda_fused_gdn_not_built) {
    SKIP("no CUDA device: skipped (built without CUDA)");
}

#endif

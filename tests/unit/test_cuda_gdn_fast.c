/* test_cuda_gdn_fast.c — fast mode's chunked DeltaNet prefill (cu_gdn_args.chunk_fast, deltanet_chunk.cu:
 * bf16 operands rounded once, one MMA a product, f32 state) against the CPU's f32 layer on fresh random
 * inputs at a bf16-level bound (||d|| / ||ref|| <= 1e-2 on the outputs and on every final state; outputs and
 * the scratch start as NaN, so an element left unwritten or a NaN fails), over ragged batches with entries
 * continuing cut sequences, then a second prefill and a decode step continuing from the fast prefill's
 * states; and its time per 4B layer against the exact form. Without a CUDA build or device: skipped. */
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

#define NO_DEVICE() (cuda_devices() < 1)
#define FAST_BOUND  1e-2

static int g_fused; /* batches of prefills only through cu_gdn_layer_fast (CINFER_CUDA_GDN_FAST=2) */

/* one layer's shapes and weights, and the slots' states (host: the CPU's; device: the kernels') */
typedef struct gdn_t {
    int Hk, Hv, dk, dv, K, C, n_slots, n_lin, lin, slow;
    float *cw, *A, *dt, *gn; /* [K][C], [Hv], [Hv], [dv] */
    size_t cs_per, rs_per, cs_n, rs_n;
    float *cst, *rst;     /* host [slots][n_lin][K-1][C], [slots][n_lin][Hv][dk][dv] */
    float *d_cst, *d_rst; /* device copies */
} gdn_t;

/* a batch's inputs: pre-conv rows [T][ld], z [T][Hv dv], b, a [T][Hv] */
typedef struct gdn_in {
    int T, ld;
    float *qkv, *z, *b, *a;
} gdn_in;

static gdn_in make_in(const gdn_t *L, const test_entry *ents, int NE) {
    gdn_in in = {0};
    for (int i = 0; i < NE; i++) in.T += ents[i].n;
    in.ld = L->C + 16;
    int vd = L->Hv * L->dv;
    in.qkv = rnd((size_t)in.T * in.ld, 1.0f), in.z = rnd((size_t)in.T * vd, 2.0f);
    in.b = rnd((size_t)in.T * L->Hv, 2.0f), in.a = rnd((size_t)in.T * L->Hv, 2.0f);
    if (L->slow) /* trained models' decay: softplus ~ 0.002..0.02, the state keeps long memory */
        for (size_t i = 0; i < (size_t)in.T * L->Hv; i++) in.a[i] = in.a[i] * 0.5f - 5.0f;
    return in;
}
static void free_in(gdn_in *in) {
    free(in->qkv), free(in->z), free(in->b), free(in->a);
}

/* the CPU's layer (f32): conv, norms, gates, the chunked form for prefills and the recurrence for decode
 * tokens, gated norm; moves the host states on; o [T][Hv dv] */
static void cpu_layer(gdn_t *L, const test_entry *ents, int NE, const gdn_in *in, float *o) {
    int Hk = L->Hk, Hv = L->Hv, dk = L->dk, dv = L->dv, K = L->K, C = L->C, vd = Hv * dv;
    float *co = malloc((size_t)in->T * C * 4), *bg = malloc((size_t)in->T * 2 * Hv * 4);
    float *tmp = malloc(gdn_chunk_scratch_floats(dk, dv) * 4);
    for (int i = 0, r0 = 0; i < NE; r0 += ents[i].n, i++) {
        int n = ents[i].n;
        ref_conv_silu(co + (size_t)r0 * C, L->cst + ((size_t)ents[i].slot * L->n_lin + L->lin) * L->cs_per,
                      L->cw, in->qkv + (size_t)r0 * in->ld, in->ld, n, K, C);
        for (int t = r0; t < r0 + n; t++) {
            ref_qk_norm(co + (size_t)t * C, Hk, dk);
            for (int h = 0; h < Hv; h++) {
                bg[(size_t)t * 2 * Hv + h] = ops_sigmoid(in->b[(size_t)t * Hv + h]);
                bg[(size_t)t * 2 * Hv + Hv + h] =
                    L->A[h] * ops_softplus(in->a[(size_t)t * Hv + h] + L->dt[h]);
            }
        }
        ref_gdn_core(co + (size_t)r0 * C, bg + (size_t)r0 * 2 * Hv,
                     L->rst + ((size_t)ents[i].slot * L->n_lin + L->lin) * L->rs_per, o + (size_t)r0 * vd, n,
                     ents[i].len, Hk, Hv, dk, dv, tmp);
        for (int t = r0; t < r0 + n; t++)
            for (int h = 0; h < Hv; h++) {
                float *oh = o + (size_t)t * vd + (size_t)h * dv;
                ops_rmsnorm(oh, oh, L->gn, dv, 1e-6f);
                for (int j = 0; j < dv; j++) oh[j] *= ops_silu(in->z[(size_t)t * vd + (size_t)h * dv + j]);
            }
    }
    free(co), free(bg), free(tmp);
}

/* the device's layer on the same inputs, fast mode's chunked form (the phased exact one where it does not
 * serve); moves the device states on; returns o [T][Hv dv] (host) and whether the fast kernels wrote the
 * scratch */
static float *dev_layer(cu_ctx *c, gdn_t *L, const test_entry *ents, int NE, const gdn_in *in,
                        int *fast_ran) {
    char err[256];
    int vd = L->Hv * L->dv;
    cu_meta meta;
    int *dmeta, *hm = pack_meta(ents, NE, NULL, &meta, &dmeta);
    cu_gdn_args g = {0};
    g.T = in->T, g.NE = NE, g.Hk = L->Hk, g.Hv = L->Hv, g.dk = L->dk, g.dv = L->dv, g.K = L->K, g.C = L->C,
    g.n_lin = L->n_lin, g.lin = L->lin;
    g.qkv = dup_dev(in->qkv, (size_t)in->T * in->ld * 4), g.qkv_ld = in->ld;
    g.z = dup_dev(in->z, (size_t)in->T * vd * 4), g.z_ld = vd;
    g.b = dup_dev(in->b, (size_t)in->T * L->Hv * 4), g.a = dup_dev(in->a, (size_t)in->T * L->Hv * 4),
    g.ba_ld = L->Hv;
    g.conv_w = dup_dev(L->cw, (size_t)L->K * L->C * 4), g.A = dup_dev(L->A, (size_t)L->Hv * 4),
    g.dt_bias = dup_dev(L->dt, (size_t)L->Hv * 4), g.gnorm = dup_dev(L->gn, (size_t)L->dv * 4);
    g.conv_out = nan_dev(c, (size_t)in->T * L->C), g.bg = nan_dev(c, (size_t)in->T * 2 * L->Hv);
    g.o = nan_dev(c, (size_t)in->T * vd);
    g.conv_state = L->d_cst, g.rec_state = L->d_rst;
    g.eps = 1e-6f, g.meta = meta, g.tc = 2, g.chunk_dt = 2, g.chunk_fast = 1;
    g.chunk_cap = cu_gdn_chunk_cap(in->T, NE);
    g.chunk_scr = nan_dev(c, cu_gdn_chunk_bytes(g.chunk_cap, in->T, L->Hv, L->dk, L->dv) / 4);
    int all_chunked = 1;
    for (int i = 0; i < NE; i++) all_chunked &= !(ents[i].n == 1 && ents[i].len > 0);
    if (g_fused && all_chunked)
        CHECK_MSG(cu_gdn_layer_fast(c, &g), "the fused layer refused a batch of prefills");
    else
        cu_gdn_layer(c, &g);
    CHECK_MSG(cu_sync(c, err, sizeof err) == 0, "%s", err);
    float *o = get(g.o, (size_t)in->T * vd);
    uint16_t w0[2] = {
        0xffff, 0xffff}; /* the first region starts with W's first row (fast: bf16), NaN until written */
    CHECK(cu_download(w0, g.chunk_scr, sizeof w0, err, sizeof err) == 0);
    *fast_ran = cu_gdn_chunk_fast_serves(&g) && (w0[0] & 0x7f80) != 0x7f80 && (w0[1] & 0x7f80) != 0x7f80;
    cu_free((void *)g.qkv), cu_free((void *)g.z), cu_free((void *)g.b), cu_free((void *)g.a),
        cu_free((void *)g.conv_w), cu_free((void *)g.A), cu_free((void *)g.dt_bias), cu_free((void *)g.gnorm);
    cu_free(g.conv_out), cu_free(g.bg), cu_free(g.o), cu_free(g.chunk_scr), cu_free(dmeta);
    free(hm);
    return o;
}

/* outputs (all, per entry) and the states of every (entry, head) against the CPU's; the slots and layers no
 * entry uses keep their bits */
static void compare(const char *round, gdn_t *L, const test_entry *ents, int NE, int T, const float *o,
                    const float *o_ref, const float *rst0) {
    char what[160];
    int vd = L->Hv * L->dv;
    snprintf(what, sizeof what, "Hk %d Hv %d%s %s: output", L->Hk, L->Hv, L->slow ? " slow" : "", round);
    check_rel(what, o, o_ref, (size_t)T * vd, FAST_BOUND);
    for (int i = 0, r0 = 0; i < NE; r0 += ents[i].n, i++) {
        double r = rel(o + (size_t)r0 * vd, o_ref + (size_t)r0 * vd, (size_t)ents[i].n * vd);
        CHECK_MSG(r <= FAST_BOUND, "%s: entry len=%d n=%d output %.3g", what, ents[i].len, ents[i].n, r);
    }
    float *gr = get(L->d_rst, L->rs_n), *gc = get(L->d_cst, L->cs_n);
    double worst = 0;
    int bad = 0;
    for (int i = 0; i < NE; i++)
        for (int h = 0; h < L->Hv; h++) {
            size_t off = ((size_t)ents[i].slot * L->n_lin + L->lin) * L->rs_per + (size_t)h * L->dk * L->dv;
            double r = rel(gr + off, L->rst + off, (size_t)L->dk * L->dv);
            if (!(r <= worst)) worst = r;
            if (!(r <= FAST_BOUND) && bad++ < 4)
                printf("     entry %d (len=%d n=%d) head %d state: %.2e\n", i, ents[i].len, ents[i].n, h, r);
        }
    printf("     %-52s worst of %d entries x %d heads: %.2e (bound %.0e)\n", "  states", NE, L->Hv, worst,
           FAST_BOUND);
    CHECK_MSG(!bad, "%s: %d head states past the bound", what, bad);
    snprintf(what, sizeof what, "Hk %d Hv %d %s: conv windows", L->Hk, L->Hv, round);
    double rc = rel(gc, L->cst, L->cs_n);
    CHECK_MSG(rc <= 1e-6, "%s: %.3g", what, rc);
    for (int sl = 0; sl < L->n_slots; sl++)
        for (int l = 0; l < L->n_lin; l++) {
            int used = 0;
            for (int i = 0; i < NE; i++) used |= ents[i].slot == sl;
            if (used && l == L->lin) continue;
            size_t off = ((size_t)sl * L->n_lin + l) * L->rs_per;
            CHECK_MSG(!memcmp(gr + off, rst0 + off, L->rs_per * 4), "%s: slot %d layer %d written", round, sl,
                      l);
        }
    free(gr), free(gc);
}

/* a fast prefill of ents from random states (zeros where len is 0), then a second prefill of 70 rows and a
 * decode token continuing every entry from the states the fast kernels left */
static void fast_case(int Hk, int Hv, const test_entry *ents, int NE, int slow) {
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    gdn_t L = {.Hk = Hk, .Hv = Hv, .dk = 128, .dv = 128, .K = 4, .n_lin = 2, .lin = 1, .slow = slow};
    REQUIRE(cu_gdn_init(L.dk) && cu_gdn_tc_init(L.dk) && cu_gdn_chunk_init(L.dk, L.dv));
    L.C = 2 * Hk * L.dk + Hv * L.dv;
    for (int i = 0; i < NE; i++)
        if (ents[i].slot + 1 > L.n_slots) L.n_slots = ents[i].slot + 1;
    L.n_slots++; /* one slot no entry uses */
    L.cw = rnd((size_t)L.K * L.C, 0.5f), L.A = rnd((size_t)Hv, 1.0f), L.dt = rnd((size_t)Hv, 0.5f);
    L.gn = rnd((size_t)L.dv, 0.2f);
    for (int h = 0; h < Hv; h++) L.A[h] = -expf(L.A[h]);
    for (int j = 0; j < L.dv; j++) L.gn[j] += 1.0f;
    L.cs_per = (size_t)(L.K - 1) * L.C, L.rs_per = (size_t)Hv * L.dk * L.dv;
    L.cs_n = (size_t)L.n_slots * L.n_lin * L.cs_per, L.rs_n = (size_t)L.n_slots * L.n_lin * L.rs_per;
    L.cst = rnd(L.cs_n, 1.0f), L.rst = rnd(L.rs_n, 0.1f);
    for (int i = 0; i < NE; i++)
        if (ents[i].len == 0) {
            memset(L.cst + ((size_t)ents[i].slot * L.n_lin + L.lin) * L.cs_per, 0, L.cs_per * 4);
            memset(L.rst + ((size_t)ents[i].slot * L.n_lin + L.lin) * L.rs_per, 0, L.rs_per * 4);
        }
    float *rst0 = malloc(L.rs_n * 4);
    memcpy(rst0, L.rst, L.rs_n * 4);
    L.d_cst = dup_dev(L.cst, L.cs_n * 4), L.d_rst = dup_dev(L.rst, L.rs_n * 4);
    test_entry *e2 = malloc((size_t)NE * sizeof *e2), *e3 = malloc((size_t)NE * sizeof *e3);
    for (int i = 0; i < NE; i++) {
        e2[i] = (test_entry){ents[i].len + ents[i].n, 70, ents[i].slot};
        e3[i] = (test_entry){e2[i].len + 70, 1, ents[i].slot};
    }
    const test_entry *rounds[3] = {ents, e2, e3};
    static const char *names[3] = {"fast prefill", "2nd prefill", "decode after"};
    for (int rd = 0; rd < 3; rd++) {
        gdn_in in = make_in(&L, rounds[rd], NE);
        float *o_ref = malloc((size_t)in.T * Hv * L.dv * 4);
        cpu_layer(&L, rounds[rd], NE, &in, o_ref);
        int ran = 0;
        float *o = dev_layer(c, &L, rounds[rd], NE, &in, &ran);
        if (rd < 2) CHECK_MSG(ran, "Hk %d Hv %d %s: the fast kernels did not run", Hk, Hv, names[rd]);
        compare(names[rd], &L, rounds[rd], NE, in.T, o, o_ref, rst0);
        free(o), free(o_ref);
        free_in(&in);
    }
    free(e2), free(e3), free(rst0);
    free(L.cw), free(L.A), free(L.dt), free(L.gn), free(L.cst), free(L.rst);
    cu_free(L.d_cst), cu_free(L.d_rst);
    cu_ctx_destroy(c);
}

/* the existing chunk tests' batches: prefills from 0 and from ragged grid offsets (first chunks of 27 and 4
 * rows), lengths not multiples of 64, one-token prefills, decode tokens; long prefills at trained decay; the
 * 4B's heads over 4096 rows; the 27B's (GQA 3) over a ragged batch */
/* each through cu_gdn_layer and through the fused layer (cu_gdn_layer_fast, forward_cuda's default in fast
 * mode) where the batch has prefills only */
#define N_FORMS 2
static void fast_form(int f) {
    printf("     %s\n", f ? "the fused layer" : "cu_gdn_layer");
    g_fused = f;
}

TEST(cuda_deltanet_fast_vs_cpu) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    static const test_entry e[] = {{0, 100, 0}, {37, 50, 1}, {5, 1, 2}, {0, 1, 3}, {64, 1, 4}, {60, 200, 5}};
    static const test_entry el[] = {{0, 1000, 0}, {300, 700, 1}, {1000, 1, 3}, {0, 1, 2}};
    /* prefills only (the fused layer takes its first round too): a one-token and a two-token prompt */
    static const test_entry ep[] = {{0, 100, 0}, {37, 50, 1}, {0, 1, 3}, {60, 200, 5}, {5, 2, 2}};
    for (int ci = 0; ci < N_FORMS; ci++) {
        fast_form(ci);
        fast_case(2, 4, ep, 5, 1);
        fast_case(2, 4, e, 6, 0);
        fast_case(2, 2, e, 6, 1);
        fast_case(2, 4, el, 4, 1);
        fast_case(2, 4, el, 4, 0);
    }
    fast_form(0);
}

TEST(cuda_deltanet_fast_4b_4096) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    static const test_entry e[] = {{0, 4096, 0}};
    for (int ci = 0; ci < N_FORMS; ci++) {
        fast_form(ci);
        fast_case(16, 32, e, 1, 1);
    }
    fast_form(0);
}

TEST(cuda_deltanet_fast_27b_heads) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    static const test_entry e[] = {{0, 300, 0}, {100, 200, 1}, {64, 64, 2},
                                   {7, 1, 3},   {0, 1, 4},     {955, 517, 5}};
    for (int ci = 0; ci < N_FORMS; ci++) {
        fast_form(ci);
        fast_case(16, 48, e, 6, 1);
    }
    fast_form(0);
}

/* Device time of one DeltaNet layer over a 4096-token prefill at the 4B and 27B heads: the layer without its
 * chunked part, the exact form (forward_cuda's default, "img") and fast mode's, each whole and its prep and
 * pass alone; fast's output against exact's (printed: the rounding, not a check) */
static void fast_speed(int Hk, int Hv) {
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    int dk = 128, dv = 128, T = 4096, vd = Hv * dv;
    REQUIRE(cu_gdn_init(dk) && cu_gdn_tc_init(dk) && cu_gdn_chunk_init(dk, dv));
    gdn_bench gb;
    gdn_bench_make(c, &gb, Hk, Hv, T);
    cu_gdn_args g = gb.g; /* gb's pointers, the chunked scratch in */
    g.tc = 2, g.chunk_dt = 2, g.chunk_cap = cu_gdn_chunk_cap(T, 1), g.chunk_scr = gb.scr;
    float *zero = gb.zero;
    size_t rs_n = gb.rs_n, cs_n = gb.cs_n;
    cu_timer *tm;
    REQUIRE(cu_timer_create(&tm) == 0);
    static const struct {
        const char *name;
        int no_chunked, fast, fused;
    } forms[] = {{"exact (img)", 0, 0, 0}, {"fast", 0, 1, 0}, {"fast, the fused layer", 0, 1, 1}};
    float *o_exact = NULL, *s_exact = NULL;
    for (size_t f = 0; f < sizeof forms / sizeof forms[0]; f++) {
        g.no_chunked = forms[f].no_chunked, g.chunk_fast = forms[f].fast;
        float best = 1e30f;
        for (int rep = 0; rep < 5; rep++) {
            REQUIRE(cu_upload(g.rec_state, zero, rs_n * 4, err, sizeof err) == 0);
            REQUIRE(cu_upload(g.conv_state, zero, cs_n * 4, err, sizeof err) == 0);
            cu_timer_start(c, tm);
            if (!(forms[f].fused && cu_gdn_layer_fast(c, &g))) cu_gdn_layer(c, &g);
            float ms = cu_timer_stop_ms(c, tm);
            if (rep && ms < best) best = ms; /* the first is a warm-up */
        }
        REQUIRE(cu_sync(c, err, sizeof err) == 0);
        printf("     Hk %d Hv %d, 4096 rows: %-22s %8.3f ms a layer (x24: %.2f ms)\n", Hk, Hv, forms[f].name,
               best, 24 * best);
        if (forms[f].no_chunked) continue;
        float *go = get(g.o, (size_t)T * vd), *gs = get(g.rec_state, rs_n);
        if (!o_exact) {
            o_exact = go, s_exact = gs;
        } else {
            printf("     %-40s vs exact: output %.2e, state %.2e\n", "", rel(go, o_exact, (size_t)T * vd),
                   rel(gs, s_exact, rs_n));
            free(go), free(gs);
        }
        if (forms[f].fused) continue; /* (its parts: those of "fast" with the conv inside the prep) */
        float part[2];
        REQUIRE(gdn_part_ms(c, tm, &g, 4, part) == 0);
        printf("     %-40s prep %.3f ms, sequential pass %.3f ms\n", "", part[0], part[1]);
        if (forms[f].fast) { /* where the cycles of prep's first block and one pass block go */
            long long hp[16];
            REQUIRE(gdn_chunk_stamps(c, &g, hp) == 0);
            long long nch = hp[15] > 0 ? hp[15] : 1;
            printf(
                "     %-40s prep block cycles: loads %lld, A/QK %lld, masks %lld, T diag %lld, T rounds "
                "%lld, "
                "operands %lld, W/U %lld; pass per chunk (%lld): wait %lld, step 1 %lld, step 2 %lld, issue "
                "%lld\n",
                "", hp[0], hp[1], hp[2], hp[3], hp[4], hp[5], hp[6], hp[15], hp[8] / nch, hp[9] / nch,
                hp[10] / nch, hp[11] / nch);
        }
    }
    cu_timer_destroy(tm);
    free(o_exact), free(s_exact);
    gdn_bench_free(&gb);
    cu_ctx_destroy(c);
}

TEST(cuda_deltanet_prefill_fast_speed) {
    if (NO_DEVICE()) SKIP("no CUDA device: skipped");
    fast_speed(16, 32); /* 4B */
    fast_speed(16, 48); /* 27B */
}

#else

TEST(cuda_gdn_fast_not_built) {
    SKIP("no CUDA device: skipped (built without CUDA)");
}

#endif

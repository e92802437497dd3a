/* test_cuda_fused_spec.c — the fused DeltaNet verify layer (cu_gdn_args.win_cnt, CINFER_CUDA_SPEC_WINFUSED)
 * at the kernel level. After a chunked prefill of each slot, rounds of entries that mix decode tokens and
 * speculative windows of 1..4 tokens, each entry with or without its slot's deferred commit pending
 * (meta.e_keep: the kept tokens of the slot's last window, replayed from the other record buffer), run
 * through three copies of the states:
 *   U  the unfused path (conv, prep, record, recurrent, gnorm kernels) — the reference;
 *   F  the fused verify layer: outputs, records (both buffers), recurrent states and conv windows of every
 *      slot must equal U's BIT FOR BIT after every round, and F must not touch the conv_out / bg scratch
 *      (proof that the one kernel ran);
 *   D  never drafting: each round's decode tokens and each window's kept tokens decoded one at a time
 *      (one-token steps of the unfused path): the rows the windows keep must give D's outputs bit for bit,
 *      and once the last pending commits are done (cu_gdn_spec_commit, forward_cuda.c's spec_flush) F's and
 *      U's slots must hold D's states bit for bit — speculative rollback at the kernel level.
 * Also without deferred commits (spec_buf 0: every window committed at once by cu_gdn_spec_commit). Both
 * forms of the kernel (cu_gdn_args.win_v2: CINFER_CUDA_SPEC_WINFUSED=1 / 2) in every case. Shapes:
 * tiny (3 value heads per key head, dv not a multiple of the 32-column block), dk 64, the 4B layer (Hk 16,
 * Hv 32, dk = dv = 128) and the 27B layer (Hk 16, Hv 48). GPU only: skips without a CUDA build or device. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward_cuda.h"
#include "test.h"

#ifdef CINFER_CUDA
#include "backend/cuda/cuda_ops.h"
#define CUDA_TEST_SEED 0x2545f4914f6cdd1dull /* this file's inputs as before the shared helpers */
#include "cuda_test_util.h"

#define SPEC_WIN 4 /* 3 drafts + the last real token */

/* xorshift64; the values (frand, cuda_test_util.h) and the schedule (entry kinds, window lengths, kept
 * tokens: g_sched) from separate streams, so that each case's schedule is fixed whatever the shapes draw */
static uint64_t g_sched;
static uint32_t next(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return (uint32_t)(*s >> 32);
}
static uint32_t urand(void) {
    return next(&g_sched);
}

/* one entry of a call: len tokens before it, n new, its slot; spec: a speculative window; keep / par: the
 * slot's pending commit and the record buffer this entry's window writes (forward_cuda.c's h_keep, h_par) */
typedef struct went {
    int len, n, slot, spec, keep, par;
} went;

/* forward_cuda.c's packed metadata for these entries (no attention: block tables empty) */
static int *dev_meta(const went *e, int NE, cu_meta *m) {
    int T = 0;
    for (int i = 0; i < NE; i++) T += e[i].n;
    size_t o_pos = T, o_ent = 2 * (size_t)T, o_len = 3 * (size_t)T, o_n = o_len + NE, o_r0 = o_n + NE,
           o_slot = o_r0 + NE, o_boff = o_slot + NE, o_lrow = o_boff + NE, o_spec = o_lrow + T,
           o_keep = o_spec + NE, o_par = o_keep + NE, tot = o_par + NE;
    int *h = calloc(tot + 1, sizeof(int));
    for (int i = 0, r = 0; i < NE; i++) {
        h[o_len + i] = e[i].len, h[o_n + i] = e[i].n, h[o_r0 + i] = r, h[o_slot + i] = e[i].slot;
        h[o_spec + i] = e[i].spec, h[o_keep + i] = e[i].keep, h[o_par + i] = e[i].par;
        for (int t = 0; t < e[i].n; t++, r++)
            h[o_pos + r] = e[i].len + t, h[o_ent + r] = i, h[o_lrow + r] = r;
    }
    int *d = dup_dev(h, (tot + 1) * sizeof(int));
    free(h);
    *m = (cu_meta){d,          d + o_pos,  d + o_ent, d + o_len,  d + o_n,    d + o_r0,  d + o_slot,
                   d + o_boff, d + o_lrow, d + tot,   d + o_spec, d + o_keep, d + o_par, NULL};
    return d;
}

/* one layer's shape and weights (device) */
typedef struct layer {
    int Hk, Hv, dk, dv, K, C, vd, ld; /* ld: a projection row [qkv C | z vd | b Hv | a Hv | pad] */
    int n_slots, n_lin, lin;
    float *dcw, *dA, *ddt, *dgn; /* [K][C], [Hv], [Hv], [dv] f32 */
} layer;

static void layer_init(layer *L, int Hk, int Hv, int dk, int dv) {
    memset(L, 0, sizeof *L);
    L->Hk = Hk, L->Hv = Hv, L->dk = dk, L->dv = dv, L->K = 4, L->vd = Hv * dv;
    L->C = 2 * Hk * dk + L->vd, L->ld = L->C + L->vd + 2 * Hv + 8;
    L->n_slots = 6, L->n_lin = 2, L->lin = 1;
    float *cw = rnd((size_t)L->K * L->C, 0.5f), *A = rnd((size_t)Hv, 1.0f), *dt = rnd((size_t)Hv, 0.5f),
          *gn = rnd((size_t)dv, 0.2f);
    for (int h = 0; h < Hv; h++) A[h] = -expf(A[h]);
    for (int j = 0; j < dv; j++) gn[j] += 1.0f;
    L->dcw = dup_dev(cw, (size_t)L->K * L->C * 4), L->dA = dup_dev(A, (size_t)Hv * 4);
    L->ddt = dup_dev(dt, (size_t)Hv * 4), L->dgn = dup_dev(gn, (size_t)dv * 4);
    free(cw), free(A), free(dt), free(gn);
}
static void layer_free(layer *L) {
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

/* one copy of the device state: conv windows, recurrent states, the two record buffers */
typedef struct dstate {
    float *cst, *rst, *rec;
} dstate;

/* one device layer call (rows of dproj from row `row0` on) on state s; cnt NULL: the unfused kernels, else
 * the fused verify layer. conv_out and bg start as NaN: *scratch_nan says whether they stayed so (the
 * unfused kernels write them, the fused one never does). Returns o [T][vd] (host), NULL on error. */
static float *dev_layer_timed(cu_ctx *c, const layer *L, const float *dproj, const went *e, int NE, dstate *s,
                              size_t spec_buf, unsigned *cnt, int form, int tc, int *scratch_nan, int reps,
                              double *us) {
    int T = 0, has_spec = 0, no_chunked = 1;
    for (int i = 0; i < NE; i++) {
        T += e[i].n, has_spec |= e[i].spec;
        no_chunked &= e[i].spec || (e[i].n == 1 && e[i].len > 0);
    }
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
    g.conv_out = dco, g.bg = dbg, g.o = dout, g.conv_state = s->cst, g.rec_state = s->rst, g.eps = 1e-6f;
    g.tc = tc, g.no_chunked = no_chunked, g.meta = meta;
    g.spec_rec = s->rec, g.spec_win = SPEC_WIN, g.has_spec = has_spec, g.spec_buf = spec_buf;
    g.win_cnt = cnt, g.win_v2 = form == 2;
    cu_gdn_layer(c, &g);
    if (reps > 0) { /* timed: reps more launches on the same inputs (the kernel's cost, printed) */
        cu_timer *tm = NULL;
        if (cu_sync(c, err, sizeof err) == 0 && cu_timer_create(&tm) == 0) {
            cu_timer_start(c, tm);
            for (int i = 0; i < reps; i++) cu_gdn_layer(c, &g);
            *us = cu_timer_stop_ms(c, tm) * 1e3 / reps;
            cu_timer_destroy(tm);
        }
    }
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

static float *dev_layer(cu_ctx *c, const layer *L, const float *dproj, const went *e, int NE, dstate *s,
                        size_t spec_buf, unsigned *cnt, int form, int tc, int *scratch_nan) {
    return dev_layer_timed(c, L, dproj, e, NE, s, spec_buf, cnt, form, tc, scratch_nan, 0, NULL);
}

/* a commit done now (forward_cuda.c's spec_flush): keep tokens of the record buffer par replayed */
static void commit(cu_ctx *c, const layer *L, dstate *s, size_t spec_buf, int slot, int keep, int par) {
    cu_gdn_spec_commit(c, s->cst, s->rst, s->rec + (size_t)par * spec_buf, slot, keep, L->n_lin, SPEC_WIN,
                       L->Hk, L->Hv, L->dk, L->dv, L->K, L->C);
}

/* every buffer of F equal to U's, bit for bit */
static int same_state(const char *what, int round, dstate *f, dstate *u, size_t cs_n, size_t rs_n,
                      size_t rec_n) {
    float *a[3] = {get(f->cst, cs_n), get(f->rst, rs_n), get(f->rec, rec_n)};
    float *b[3] = {get(u->cst, cs_n), get(u->rst, rs_n), get(u->rec, rec_n)};
    size_t n[3] = {cs_n, rs_n, rec_n}, at = 0;
    static const char *names[3] = {"conv windows", "recurrent states", "records"};
    int ok = 1;
    for (int i = 0; i < 3; i++) {
        if (!same_bits(a[i], b[i], n[i], &at)) {
            test_fail(__FILE__, __LINE__, "%s round %d: %s differ at %zu: %.9g vs %.9g", what, round,
                      names[i], at, a[i][at], b[i][at]);
            ok = 0;
        }
        free(a[i]), free(b[i]);
    }
    return ok;
}

/* the slots' layer-`lin` conv windows and recurrent states of x equal to ref's, bit for bit */
static int same_slots(const char *what, const layer *L, dstate *x, dstate *ref, const int *slots, int ns,
                      size_t cs_n, size_t rs_n) {
    float *xc = get(x->cst, cs_n), *xr = get(x->rst, rs_n), *rc = get(ref->cst, cs_n),
          *rr = get(ref->rst, rs_n);
    size_t cs_per = (size_t)(L->K - 1) * L->C, rs_per = (size_t)L->Hv * L->dk * L->dv, at = 0;
    int ok = 1;
    for (int i = 0; i < ns; i++) {
        size_t oc = ((size_t)slots[i] * L->n_lin + L->lin) * cs_per,
               orr = ((size_t)slots[i] * L->n_lin + L->lin) * rs_per;
        if (!same_bits(xc + oc, rc + oc, cs_per, &at)) {
            test_fail(__FILE__, __LINE__, "%s slot %d: conv window differs at %zu: %.9g vs %.9g", what,
                      slots[i], at, xc[oc + at], rc[oc + at]);
            ok = 0;
        }
        if (!same_bits(xr + orr, rr + orr, rs_per, &at)) {
            test_fail(__FILE__, __LINE__, "%s slot %d: recurrent state differs at %zu: %.9g vs %.9g", what,
                      slots[i], at, xr[orr + at], rr[orr + at]);
            ok = 0;
        }
    }
    free(xc), free(xr), free(rc), free(rr);
    return ok;
}

/* NE entries (prompt lengths pre[], slots[]), `rounds` rounds; deferred: commits deferred into the slot's
 * next entry (spec_buf = one record buffer, two of them), else done at once after each round. */
static void spec_case(const char *name, int Hk, int Hv, int dk, int dv, const int *pre, const int *slots,
                      int NE, int rounds, int deferred, int form) {
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    REQUIRE(cu_gdn_init(dk));
    int tc = cu_gdn_tc_init(dk);
    g_sched = 0x9e3779b97f4a7c15ull;
    layer L;
    layer_init(&L, Hk, Hv, dk, dv);
    size_t cs_n = (size_t)L.n_slots * L.n_lin * (L.K - 1) * L.C,
           rs_n = (size_t)L.n_slots * L.n_lin * Hv * dk * dv;
    size_t rf = CU_SPEC_REC(L.C, Hv), one_buf = (size_t)L.n_slots * L.n_lin * SPEC_WIN * rf;
    size_t spec_buf = deferred ? one_buf : 0, rec_n = deferred ? 2 * one_buf : one_buf;
    size_t cs_per = (size_t)(L.K - 1) * L.C, rs_per = (size_t)Hv * dk * dv;
    /* slots start as noise (a slot no entry names must keep its bits), the named ones at zero */
    float *cst = rnd(cs_n, 1.0f), *rst = rnd(rs_n, 0.1f), *rec = rnd(rec_n, 1.0f);
    for (int i = 0; i < NE; i++) {
        memset(cst + ((size_t)slots[i] * L.n_lin + L.lin) * cs_per, 0, cs_per * 4);
        memset(rst + ((size_t)slots[i] * L.n_lin + L.lin) * rs_per, 0, rs_per * 4);
    }
    dstate U = {dup_dev(cst, cs_n * 4), dup_dev(rst, rs_n * 4), dup_dev(rec, rec_n * 4)};
    dstate F = {dup_dev(cst, cs_n * 4), dup_dev(rst, rs_n * 4), dup_dev(rec, rec_n * 4)};
    dstate D = {dup_dev(cst, cs_n * 4), dup_dev(rst, rs_n * 4), dup_dev(rec, rec_n * 4)};
    REQUIRE(U.cst && U.rst && U.rec && F.cst && F.rst && F.rec && D.cst && D.rst && D.rec);
    free(cst), free(rst), free(rec);
    unsigned *cnt = NULL;
    REQUIRE(cu_alloc((void **)&cnt, (size_t)NE * Hk * sizeof(unsigned), err, sizeof err) == 0);
    went *e = calloc((size_t)NE, sizeof *e);
    int T = 0, nan = 0;
    for (int i = 0; i < NE; i++) e[i] = (went){0, pre[i], slots[i], 0, 0, 0}, T += pre[i];
    /* the prefill: the chunked path on each copy */
    float *proj = proj_rows(&L, T), *dproj = dup_dev(proj, (size_t)T * L.ld * 4);
    dstate *all[3] = {&U, &F, &D};
    for (int k = 0; k < 3; k++) free(dev_layer(c, &L, dproj, e, NE, all[k], spec_buf, NULL, 0, tc, &nan));
    free(proj), cu_free(dproj);
    int *pend = calloc((size_t)L.n_slots, sizeof(int)), *rpar = calloc((size_t)L.n_slots, sizeof(int));
    int cover[SPEC_WIN + 1][2] = {{0}}, decodes[2] = {0}, mixed = 0;
    for (int i = 0; i < NE; i++) e[i].len = pre[i];
    for (int r = 0; r < rounds; r++) {
        /* each entry: a decode token (1 in 4) or a window of 1..4 tokens; at least one window */
        T = 0;
        int nwin = 0;
        for (int i = 0; i < NE; i++) {
            int w = (int)(urand() % 4) != 0 || (i == NE - 1 && nwin == 0);
            e[i].spec = w, e[i].n = w ? 1 + (int)(urand() % SPEC_WIN) : 1;
            e[i].keep = pend[e[i].slot], e[i].par = rpar[e[i].slot] ^ 1;
            pend[e[i].slot] = 0;
            if (w)
                rpar[e[i].slot] ^= 1, cover[e[i].n][e[i].keep > 0]++, nwin++;
            else
                decodes[e[i].keep > 0]++;
            T += e[i].n;
        }
        mixed += nwin > 0 && nwin < NE;
        proj = proj_rows(&L, T), dproj = dup_dev(proj, (size_t)T * L.ld * 4);
        int nan_u = 0, nan_f = 0;
        float *ou = dev_layer(c, &L, dproj, e, NE, &U, spec_buf, NULL, 0, tc, &nan_u);
        float *of = dev_layer(c, &L, dproj, e, NE, &F, spec_buf, cnt, form, tc, &nan_f);
        REQUIRE(ou && of);
        CHECK_MSG(!nan_u && nan_f,
                  "%s round %d: the fused verify layer did not run (scratch written: %d / %d)", name, r,
                  !nan_u, !nan_f);
        size_t at = 0;
        CHECK_MSG(same_bits(of, ou, (size_t)T * L.vd, &at),
                  "%s round %d: fused output differs at %zu (row %zu): %.9g vs %.9g", name, r, at,
                  at / (size_t)L.vd, of[at], ou[at]);
        /* the kept tokens: what a window keeps is drawn now (0 = dropped whole, n = every draft right) */
        int *kept = calloc((size_t)NE, sizeof(int));
        for (int i = 0; i < NE; i++) kept[i] = e[i].spec ? (int)(urand() % (unsigned)(e[i].n + 1)) : 1;
        if (!deferred) /* committed at once, on both copies */
            for (int i = 0; i < NE; i++)
                if (e[i].spec && kept[i] > 0) {
                    commit(c, &L, &U, 0, e[i].slot, kept[i], 0);
                    commit(c, &L, &F, 0, e[i].slot, kept[i], 0);
                }
        REQUIRE(cu_sync(c, err, sizeof err) == 0);
        if (!same_state(name, r, &F, &U, cs_n, rs_n, rec_n)) {
            free(ou), free(of), free(kept), free(proj), cu_free(dproj);
            break;
        }
        /* D decodes the kept rows one at a time: their outputs are the window's rows, bit for bit */
        for (int i = 0, r0 = 0; i < NE; r0 += e[i].n, i++) {
            for (int t = 0; t < kept[i]; t++) {
                went d = {e[i].len + t, 1, e[i].slot, 0, 0, 0};
                float *od =
                    dev_layer(c, &L, dproj + (size_t)(r0 + t) * L.ld, &d, 1, &D, spec_buf, NULL, 0, tc, &nan);
                REQUIRE(od);
                CHECK_MSG(same_bits(of + (size_t)(r0 + t) * L.vd, od, (size_t)L.vd, &at),
                          "%s round %d entry %d (%s of %d, row %d): output differs from decoding it at %zu: "
                          "%.9g vs %.9g",
                          name, r, i, e[i].spec ? "window" : "decode", e[i].n, t, at,
                          of[(size_t)(r0 + t) * L.vd + at], od[at]);
                free(od);
            }
            e[i].len += kept[i];
            if (deferred && e[i].spec) pend[e[i].slot] = kept[i];
        }
        free(ou), free(of), free(kept), free(proj), cu_free(dproj);
    }
    /* the pending commits done as the engine would before any other use of the slots: every state is then
     * never-drafting's */
    for (int i = 0; i < NE; i++)
        if (pend[slots[i]] > 0) {
            commit(c, &L, &U, spec_buf, slots[i], pend[slots[i]], rpar[slots[i]]);
            commit(c, &L, &F, spec_buf, slots[i], pend[slots[i]], rpar[slots[i]]);
        }
    REQUIRE(cu_sync(c, err, sizeof err) == 0);
    CHECK(same_state(name, rounds, &F, &U, cs_n, rs_n, rec_n));
    int ok = same_slots(name, &L, &F, &D, slots, NE, cs_n, rs_n);
    CHECK(ok);
    unsigned *hc = malloc((size_t)NE * Hk * sizeof(unsigned));
    REQUIRE(cu_download(hc, cnt, (size_t)NE * Hk * sizeof(unsigned), err, sizeof err) == 0);
    int zero = 1;
    for (int i = 0; i < NE * Hk; i++) zero &= hc[i] == 0;
    CHECK_MSG(zero, "%s: the fused verify layer's counters were not set back to 0", name);
    /* the schedule covers what it is meant to (fixed by g_sched's seed): with four entries and deferred
     * commits, windows of every length with and without a pending commit, and decode tokens of both kinds */
    if (NE > 1 && deferred)
        for (int n = 1; n <= SPEC_WIN; n++)
            CHECK_MSG(
                cover[n][0] > 0 && cover[n][1] > 0 && decodes[0] + decodes[1] > 0 && mixed > 0,
                "%s: the schedule missed windows of %d tokens without / with a pending commit (%d / %d)",
                name, n, cover[n][0], cover[n][1]);
    printf("     %-5s form %d, NE %d, %d rounds, %s commits: fused == unfused bitwise (outputs, records, "
           "windows, "
           "states), kept rows and final states == decoding them %s; windows of 1..4 without / with a "
           "pending commit:",
           name, form, NE, rounds, deferred ? "deferred" : "immediate", ok ? "bitwise" : "NOT bitwise");
    for (int n = 1; n <= SPEC_WIN; n++) printf(" %d/%d", cover[n][0], cover[n][1]);
    printf(", decode tokens %d/%d, mixed rounds %d\n", decodes[0], decodes[1], mixed);
    free(hc), free(e), free(pend), free(rpar);
    for (int k = 0; k < 3; k++) cu_free(all[k]->cst), cu_free(all[k]->rst), cu_free(all[k]->rec);
    cu_free(cnt);
    layer_free(&L);
    cu_ctx_destroy(c);
}

/* one entry; four entries in scattered slots with prompts across and inside the 64-grid (and a 1-token
 * one) */
static const int pre1[] = {37}, slot1[] = {2};
static const int pre4[] = {70, 5, 130, 1}, slot4[] = {3, 0, 5, 1};

TEST(cuda_fused_spec_tiny) {
    if (cuda_devices() < 1) SKIP("no CUDA device: skipped");
    for (int form = 1; form <= 2; form++) spec_case("tiny", 2, 6, 32, 48, pre1, slot1, 1, 10, 1, form);
    for (int form = 1; form <= 2; form++) spec_case("tiny", 2, 6, 32, 48, pre4, slot4, 4, 12, 1, form);
    for (int form = 1; form <= 2; form++) spec_case("tiny", 2, 6, 32, 48, pre4, slot4, 4, 8, 0, form);
    for (int form = 1; form <= 2; form++) spec_case("dk64", 1, 2, 64, 64, pre4, slot4, 4, 8, 1, form);
}

TEST(cuda_fused_spec_4b) {
    if (cuda_devices() < 1) SKIP("no CUDA device: skipped");
    for (int form = 1; form <= 2; form++) spec_case("4B", 16, 32, 128, 128, pre1, slot1, 1, 8, 1, form);
    for (int form = 1; form <= 2; form++) spec_case("4B", 16, 32, 128, 128, pre4, slot4, 4, 8, 1, form);
    for (int form = 1; form <= 2; form++) spec_case("4B", 16, 32, 128, 128, pre4, slot4, 4, 4, 0, form);
}

TEST(cuda_fused_spec_27b) {
    if (cuda_devices() < 1) SKIP("no CUDA device: skipped");
    for (int form = 1; form <= 2; form++) spec_case("27B", 16, 48, 128, 128, pre1, slot1, 1, 6, 1, form);
    for (int form = 1; form <= 2; form++) spec_case("27B", 16, 48, 128, 128, pre4, slot4, 4, 8, 1, form);
}

/* The cost of one verify layer at the 4B shape (Hk 16, Hv 32, dk = dv = 128): NE entries, each a window of 4
 * tokens with a deferred commit of 2 kept tokens pending (the common round at acceptance 0.7), through the
 * five kernels and the two forms, 200 launches each after one (the states drift from launch to launch,
 * which changes no cost). Printed, not checked; each form's first launch must give the five kernels' output
 * bit for bit. */
static void speed_case(int NE) {
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    REQUIRE(cu_gdn_init(128));
    layer L;
    layer_init(&L, 16, 32, 128, 128);
    L.n_slots = NE, L.n_lin = 1, L.lin = 0;
    size_t cs_n = (size_t)L.n_slots * (L.K - 1) * L.C, rs_n = (size_t)L.n_slots * L.Hv * L.dk * L.dv;
    size_t one_buf = (size_t)L.n_slots * SPEC_WIN * CU_SPEC_REC(L.C, L.Hv), rec_n = 2 * one_buf;
    float *cst = rnd(cs_n, 1.0f), *rst = rnd(rs_n, 0.05f),
          *rec = rnd(rec_n, 0.05f); /* small: 400 replays of these records stay finite */
    went *e = calloc((size_t)NE, sizeof *e);
    for (int i = 0; i < NE; i++) e[i] = (went){100, SPEC_WIN, i, 1, 2, 0};
    float *proj = proj_rows(&L, NE * SPEC_WIN), *dproj = dup_dev(proj, (size_t)NE * SPEC_WIN * L.ld * 4);
    unsigned *cnt = NULL;
    REQUIRE(cu_alloc((void **)&cnt, (size_t)NE * L.Hk * sizeof(unsigned), err, sizeof err) == 0);
    double us[3] = {0};
    float *ref = NULL;
    for (int form = 0; form <= 2; form++) {
        dstate s = {dup_dev(cst, cs_n * 4), dup_dev(rst, rs_n * 4), dup_dev(rec, rec_n * 4)};
        int nan = 0;
        float *o = dev_layer_timed(c, &L, dproj, e, NE, &s, one_buf, form ? cnt : NULL, form, 0, &nan, 200,
                                   &us[form]);
        REQUIRE(o);
        size_t at = 0;
        if (!ref)
            ref = o;
        else {
            CHECK_MSG(same_bits(o, ref, (size_t)NE * SPEC_WIN * L.vd, &at),
                      "speed NE %d form %d: output differs at %zu", NE, form, at);
            free(o);
        }
        cu_free(s.cst), cu_free(s.rst), cu_free(s.rec);
    }
    printf(
        "     4B verify layer, %2d windows of 4 (2 kept pending): five kernels %.1f us, form 1 %.1f, form 2 "
        "%.1f\n",
        NE, us[0], us[1], us[2]);
    free(ref), free(proj), free(cst), free(rst), free(rec), free(e);
    cu_free(dproj), cu_free(cnt);
    layer_free(&L);
    cu_ctx_destroy(c);
}

TEST(cuda_fused_spec_speed) {
    if (cuda_devices() < 1) SKIP("no CUDA device: skipped");
    speed_case(1);
    speed_case(16);
}

#else

TEST(cuda_fused_spec_not_built) {
    SKIP("no CUDA device: skipped (built without CUDA)");
}

#endif

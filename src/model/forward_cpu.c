/* forward_cpu.c — the Qwen3.5 / Qwen3.5-MoE / Qwen3-Next forward pass on the CPU, in f32 from bf16
 * weights: the correctness reference that transformers' float32 forward is compared against.
 * Work is split across the thread pool by index (rows, channels, heads), never by reduction, so every
 * result is independent of the thread count and of the other rows in the batch. */
#include "model/forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/ops.h"
#include "util/alloc.h"
#include "util/bf16.h"
#include "util/err.h"

/* ---- scratch ---- */

static size_t max3(size_t a, size_t b, size_t c) { return a > b ? (a > c ? a : c) : (b > c ? b : c); }

size_t gdn_chunk_scratch_floats(int dk, int dv) {
    size_t C = GDN_CHUNK;
    /* gam, G (k·k), QK (q·k), U, W, D, kT */
    return C + 2 * C * C + C * (size_t)dv * 2 + C * (size_t)dk + (size_t)dk * C + 64;
}

int fwd_scratch_init(fwd_scratch *s, const model *m, int max_tokens, int max_ctx, int n_threads, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    const model_config *c = &m->cfg;
    size_t T = (size_t)max_tokens, H = (size_t)m->H;
    size_t vd = (size_t)m->Hv * m->dv, kd = (size_t)m->Hk * m->dk;
    size_t wp = max3((size_t)m->C, 2 * kd + 2 * vd, (size_t)m->Hq * 2 * m->hd);
    size_t wz = max3(vd, 2 * (size_t)m->Hkv * m->hd, 1);
    size_t wo = max3(vd, (size_t)m->Hq * m->hd, (size_t)m->C);
    size_t wx = max3(H, (size_t)m->Hkv * m->hd, 1);
    size_t wf = max3((size_t)c->intermediate_size, (size_t)c->moe_intermediate_size,
                     (size_t)c->shared_expert_intermediate_size);
    size_t E = (size_t)c->n_experts, k = (size_t)(c->n_experts_per_tok > 0 ? c->n_experts_per_tok : 1);
    size_t thr = max3((size_t)max_ctx + 16, gdn_chunk_scratch_floats(m->dk, m->dv), (size_t)m->dk * m->dv + 16);
    thr = (thr + 15) & ~(size_t)15;
    size_t R = (size_t)(c->rope_dim / 2 > 0 ? c->rope_dim / 2 : 1);
    size_t sizes[] = {T * H, T * H, T * H, T * wp, T * wz, T * 2 * m->Hv, T * 2 * m->Hv, T * (size_t)m->C, T * wo,
                      T * wf, T * wf, T * (E ? E : 1), T * k /*idx*/, T * k, T /*rows*/, T, T * wx, T * wx, T,
                      (size_t)n_threads * thr, R, T, T, T * H, T, T, 3 * T, R};
    size_t n = sizeof sizes / sizeof sizes[0], total = 0, off[32];
    for (size_t i = 0; i < n; i++) {
        off[i] = total;
        total += (sizes[i] + 15) & ~(size_t)15;
    }
    float *b = ci_try_alloc(total * sizeof(float));
    if (!b) return ci_err(err, errlen, CINFER_ENOMEM, "cannot allocate %zu bytes of forward scratch", total * sizeof(float));
    s->block = b;
    s->max_tokens = max_tokens;
    s->max_ctx = max_ctx;
    s->n_threads = n_threads;
    int i = 0;
    s->x = b + off[i++];
    s->xn = b + off[i++];
    s->out = b + off[i++];
    s->proj = b + off[i++];
    s->z = b + off[i++];
    s->ba = b + off[i++];
    s->ba_raw = b + off[i++];
    s->conv = b + off[i++];
    s->o = b + off[i++];
    s->ffn_g = b + off[i++];
    s->ffn_u = b + off[i++];
    s->moe_logits = b + off[i++];
    s->moe_idx = (int *)(b + off[i++]);
    s->moe_w = b + off[i++];
    s->moe_rows = (int *)(b + off[i++]);
    s->moe_rw = b + off[i++];
    s->moe_x = b + off[i++];
    s->moe_y = b + off[i++];
    s->sh_gate = b + off[i++];
    s->thr = b + off[i++];
    s->thr_floats = thr;
    s->inv_freq = b + off[i++];
    s->row_pos = (int *)(b + off[i++]);
    s->row_entry = (int *)(b + off[i++]);
    s->lrows = b + off[i++];
    s->ids = (int *)(b + off[i++]);
    s->entry_row0 = (int *)(b + off[i++]);
    s->row_rope = (int *)(b + off[i++]);
    s->rope_stream = (unsigned char *)(b + off[i++]);
    /* interleaved mRoPE (spec §3.4): frequency j takes h if j%3 == 1 and j < 3*s_h, w if j%3 == 2 and
     * j < 3*s_w, else t. Text rows have t = h = w, so this is plain RoPE for them. */
    for (int j = 0; j < c->rope_dim / 2; j++) {
        int st = 0;
        if (j % 3 == 1 && j < 3 * c->mrope_section[1]) st = 1;
        else if (j % 3 == 2 && j < 3 * c->mrope_section[2]) st = 2;
        s->rope_stream[j] = (unsigned char)st;
    }
    /* inv_freq[i] = 1 / theta^(2i/R), computed as transformers does in f32: exponent (2i)/R in f32, the
     * power rounded to f32, then the f32 reciprocal. */
    int Rd = c->rope_dim;
    for (int j = 0; j < Rd / 2; j++) {
        float e = (float)(2 * j) / (float)Rd;
        float p = (float)pow(c->rope_theta, (double)e);
        s->inv_freq[j] = 1.0f / p;
    }
    return 0;
}

void fwd_scratch_free(fwd_scratch *s) {
    free(s->block);
    memset(s, 0, sizeof *s);
}

/* ---- parallel-for over items: contiguous ranges by thread index ---- */

typedef void (*item_fn)(void *ctx, long i, int ith);
typedef struct {
    item_fn fn;
    void *ctx;
    long n;
} par_job;

static void par_thunk(void *p, int ith, int nth) {
    par_job *j = p;
    long b, e;
    tp_range(j->n, ith, nth, &b, &e);
    for (long i = b; i < e; i++) j->fn(j->ctx, i, ith);
}

static void par_for(threadpool *tp, long n, item_fn fn, void *ctx) {
    if (n <= 0) return;
    par_job j = {fn, ctx, n};
    if (n == 1) {
        fn(ctx, 0, 0);
        return;
    }
    tp_run(tp, par_thunk, &j);
}

static void wmat_mul(threadpool *tp, float *y, const float *x, const wmat *w, int M) {
    cpu_matmul(tp, y, x, w->data, w->type, M, w->rows, w->cols);
}

/* ---- shared context for the item functions of one layer ---- */

typedef struct fwd_run {
    const model *m;
    const layer_weights *lw;
    fwd_scratch *s;
    kv_pool *kv;
    state_pool *st;
    const fwd_entry *e;
    int n_entries;
    int T;
    int layer, lin, full;
    const float *qkv_src; /* [T][C] pre-conv q|k|v rows */
    float eps;
} fwd_run;

/* ---- norms over rows ---- */

typedef struct {
    float *y;
    const float *x;
    const float *w;
    int n;
    float eps;
} norm_job;

static void norm_item(void *p, long r, int ith) {
    norm_job *j = p;
    ops_rmsnorm(j->y + r * j->n, j->x + r * j->n, j->w, j->n, j->eps);
}

static void rmsnorm_rows(threadpool *tp, float *y, const float *x, const float *w, int rows, int n, float eps) {
    norm_job j = {y, x, w, n, eps};
    par_for(tp, rows, norm_item, &j);
}

void fwd_rmsnorm_rows(threadpool *tp, float *y, const float *x, const float *w, int rows, int n, float eps) {
    rmsnorm_rows(tp, y, x, w, rows, n, eps);
}

/* ---- Gated DeltaNet ---- */

void gdn_recurrent(int n, const float *q, int qs, const float *k, int ks, const float *v, int vs, const float *g,
                   int gs, const float *beta, int bs, float *S, int dk, int dv, float *o, int os) {
    float m[1024]; /* dv <= 1024 is checked by the caller */
    for (int t = 0; t < n; t++) {
        const float *qt = q + (size_t)t * qs, *kt = k + (size_t)t * ks, *vt = v + (size_t)t * vs;
        float decay = expf(g[(size_t)t * gs]), b = beta[(size_t)t * bs];
        /* decay first, then read out S^T k (spec trap 8) */
        for (int i = 0; i < dk * dv; i++) S[i] *= decay;
        for (int j = 0; j < dv; j++) m[j] = 0.0f;
        for (int i = 0; i < dk; i++) ops_axpy(m, kt[i], S + (size_t)i * dv, dv);
        for (int j = 0; j < dv; j++) m[j] = b * (vt[j] - m[j]);
        for (int i = 0; i < dk; i++) ops_axpy(S + (size_t)i * dv, kt[i], m, dv);
        float *ot = o + (size_t)t * os;
        for (int j = 0; j < dv; j++) ot[j] = 0.0f;
        for (int i = 0; i < dk; i++) ops_axpy(ot, qt[i], S + (size_t)i * dv, dv);
    }
}

/* The chunked (WY/UT) form of spec §4 over chunks of GDN_CHUNK tokens, all in f32:
 *   (I + L) U = beta V,  (I + L) W = beta Gam K  (forward substitution, L strictly lower)
 *   D = U - W S0;  O = (Gam Q) S0 + M D;  S = Gam_C S0 + Σ_r e^{gam_C - gam_r} k_r ⊗ D_r */
void gdn_chunked(int n, int pos0, const float *q, int qs, const float *k, int ks, const float *v, int vs, const float *g,
                 int gs, const float *beta, int bs, float *S, int dk, int dv, float *o, int os, float *tmp) {
    const int Cn = GDN_CHUNK;
    float *gam = tmp, *G = gam + Cn, *QK = G + Cn * Cn, *U = QK + Cn * Cn, *D = U + (size_t)Cn * dv;
    float *W = D + (size_t)Cn * dv, *kT = W + (size_t)Cn * dk;
    /* chunks sit on the absolute grid (multiples of GDN_CHUNK from the sequence's start): a prefill split at
     * grid positions computes exactly the chunks one whole prefill would, whatever the step budget did */
    for (int c0 = 0, L; c0 < n; c0 += L) {
        L = Cn - (pos0 + c0) % Cn;
        if (L > n - c0) L = n - c0;
        float acc = 0.0f;
        for (int r = 0; r < L; r++) {
            acc += g[(size_t)(c0 + r) * gs];
            gam[r] = acc;
        }
        /* kT [dk][L] so that the Gram matrices vectorise over s without reassociating sums */
        for (int r = 0; r < L; r++) {
            const float *kr = k + (size_t)(c0 + r) * ks;
            for (int i = 0; i < dk; i++) kT[(size_t)i * Cn + r] = kr[i];
        }
        for (int r = 0; r < L; r++) {
            const float *kr = k + (size_t)(c0 + r) * ks, *qr = q + (size_t)(c0 + r) * qs;
            float *Gr = G + r * Cn, *Qr = QK + r * Cn;
            for (int s2 = 0; s2 <= r; s2++) Gr[s2] = Qr[s2] = 0.0f;
            for (int i = 0; i < dk; i++) {
                ops_axpy(Gr, kr[i], kT + (size_t)i * Cn, r + 1);
                ops_axpy(Qr, qr[i], kT + (size_t)i * Cn, r + 1);
            }
        }
        /* forward substitution for U and W */
        for (int r = 0; r < L; r++) {
            float br = beta[(size_t)(c0 + r) * bs];
            const float *vr = v + (size_t)(c0 + r) * vs, *kr = k + (size_t)(c0 + r) * ks;
            float *Ur = U + (size_t)r * dv, *Wr = W + (size_t)r * dk;
            float eg = expf(gam[r]);
            for (int j = 0; j < dv; j++) Ur[j] = br * vr[j];
            for (int i = 0; i < dk; i++) Wr[i] = (br * eg) * kr[i];
            for (int s2 = 0; s2 < r; s2++) {
                float l = br * expf(gam[r] - gam[s2]) * G[r * Cn + s2];
                ops_axpy(Ur, -l, U + (size_t)s2 * dv, dv);
                ops_axpy(Wr, -l, W + (size_t)s2 * dk, dk);
            }
        }
        /* D = U - W S0 (ops_gemm_acc: the bits of the per-row axpy loop over i, register-blocked) */
        memcpy(D, U, sizeof(float) * (size_t)L * dv);
        ops_gemm_acc(D, dv, W, dk, S, dv, L, dv, dk, 1);
        /* O = (Gam Q) S0 + M D */
        for (int r = 0; r < L; r++) {
            float *orow = o + (size_t)(c0 + r) * os;
            for (int j = 0; j < dv; j++) orow[j] = 0.0f;
        }
        ops_gemm_acc(o + (size_t)c0 * os, os, q + (size_t)c0 * qs, qs, S, dv, L, dv, dk, 0);
        for (int r = 0; r < L; r++) {
            float *orow = o + (size_t)(c0 + r) * os;
            float eg = expf(gam[r]);
            for (int j = 0; j < dv; j++) orow[j] *= eg;
            for (int s2 = 0; s2 <= r; s2++) {
                float mm = expf(gam[r] - gam[s2]) * QK[r * Cn + s2];
                ops_axpy(orow, mm, D + (size_t)s2 * dv, dv);
            }
        }
        /* S = Gam_L S0 + Σ_r e^{gam_L - gam_r} k_r ⊗ D_r */
        float gl = gam[L - 1], egl = expf(gl);
        for (int i = 0; i < dk * dv; i++) S[i] *= egl;
        /* S += (f K)^T D with f_r = e^{gam_L - gam_r}: kT becomes (f K)^T in place (its rows were read above) */
        for (int r = 0; r < L; r++) {
            float f = expf(gl - gam[r]);
            const float *kr = k + (size_t)(c0 + r) * ks;
            for (int i = 0; i < dk; i++) kT[(size_t)i * Cn + r] = f * kr[i];
        }
        ops_gemm_acc(S, dv, kT, Cn, D, dv, dk, dv, L, 0);
    }
}

/* per (entry, channel): causal depthwise conv over [state | new rows] + SiLU; the window is then advanced */
typedef struct {
    fwd_run *R;
    const int *row0;
} conv_job;

#define CONV_BLK 256 /* channels per work item: the inner loops run over contiguous channels (vectorised) */

/* per (entry, block of channels): causal depthwise conv over [state | new rows] + SiLU, each output summed
 * over the taps in order (the same bits as a per-channel loop); then the window advances */
static void conv_item(void *p, long item, int ith) {
    conv_job *j = p;
    fwd_run *R = j->R;
    const model *m = R->m;
    int C = m->C, K = m->K, nblk = (C + CONV_BLK - 1) / CONV_BLK;
    int ent = (int)(item / nblk), c0 = (int)(item % nblk) * CONV_BLK, nc = C - c0 < CONV_BLK ? C - c0 : CONV_BLK;
    const fwd_entry *e = &R->e[ent];
    int r0 = j->row0[ent], n = e->n;
    float *state = state_conv(R->st, e->slot, R->lin) + c0; /* [K-1][C] */
    const float *wT = R->lw->conv_w + c0;                   /* [K][C] */
    const float *in = R->qkv_src + c0; /* qkv rows [T][C] (already de-interleaved for Qwen3-Next) */
    float acc[CONV_BLK];
    for (int t = 0; t < n; t++) {
        /* X[t + jj] for jj = 0..K-1, where X = [state (K-1 rows) | in rows] */
        for (int c = 0; c < nc; c++) acc[c] = 0.0f;
        for (int jj = 0; jj < K; jj++) {
            int xi = t + jj; /* index into X */
            const float *x = xi < K - 1 ? state + (size_t)xi * C : in + (size_t)(r0 + xi - (K - 1)) * C;
            const float *w = wT + (size_t)jj * C;
            for (int c = 0; c < nc; c++) acc[c] += w[c] * x[c];
        }
        float *y = R->s->conv + (size_t)(r0 + t) * C + c0;
        for (int c = 0; c < nc; c++) y[c] = ops_silu(acc[c]);
    }
    if (e->spec_rec) return; /* provisional: forward_spec_commit advances the window for what is kept */
    /* new window = last K-1 rows of X (rows move forward, so copying in increasing order never reads a row
     * already overwritten) */
    int tot = K - 1 + n;
    for (int jj = 0; jj < K - 1; jj++) {
        int xi = tot - (K - 1) + jj;
        const float *src = xi < K - 1 ? state + (size_t)xi * C : in + (size_t)(r0 + xi - (K - 1)) * C;
        if (src != state + (size_t)jj * C) memmove(state + (size_t)jj * C, src, sizeof(float) * (size_t)nc);
    }
}

/* per row: l2-normalise q and k heads, scale q; beta = sigmoid(b), g = A * softplus(a + dt_bias) */
static void gdn_prep_item(void *p, long r, int ith) {
    fwd_run *R = p;
    const model *m = R->m;
    const layer_weights *lw = R->lw;
    float *row = R->s->conv + (size_t)r * m->C;
    float scale = (float)(1.0 / sqrt((double)m->dk));
    for (int h = 0; h < 2 * m->Hk; h++) {
        float *x = row + (size_t)h * m->dk;
        ops_l2norm(x, x, m->dk, 1e-6f);
        if (h < m->Hk)
            for (int i = 0; i < m->dk; i++) x[i] *= scale;
    }
    float *ba = R->s->ba + (size_t)r * 2 * m->Hv;
    for (int h = 0; h < m->Hv; h++) {
        float b = ba[h], a = ba[m->Hv + h];
        ba[h] = ops_sigmoid(b);
        ba[m->Hv + h] = lw->A[h] * ops_softplus(a + lw->dt_bias[h]);
    }
}

typedef struct {
    fwd_run *R;
    const int *row0;
} gdn_job;

static void gdn_item(void *p, long item, int ith) {
    gdn_job *j = p;
    fwd_run *R = j->R;
    const model *m = R->m;
    int ent = (int)(item / m->Hv), h = (int)(item % m->Hv);
    const fwd_entry *e = &R->e[ent];
    int r0 = j->row0[ent];
    int kh = h / (m->Hv / m->Hk); /* value head h reads key head h / (Hv/Hk) (grouped, spec trap 7) */
    int C = m->C, kd = m->Hk * m->dk;
    const float *base = R->s->conv + (size_t)r0 * C;
    const float *q = base + (size_t)kh * m->dk, *k = base + kd + (size_t)kh * m->dk;
    const float *v = base + 2 * kd + (size_t)h * m->dv;
    const float *ba = R->s->ba + (size_t)r0 * 2 * m->Hv;
    float *S = state_rec(R->st, e->slot, R->lin) + (size_t)h * m->dk * m->dv;
    int vd = m->Hv * m->dv;
    float *o = R->s->o + (size_t)r0 * vd + (size_t)h * m->dv;
    if (e->spec_rec) {
        /* speculative window: the recurrent form token by token (bit-identical to plain decode) on a copy of S,
         * so the slot keeps the state from before the window until the commit */
        float *Sc = R->s->thr + (size_t)ith * R->s->thr_floats;
        memcpy(Sc, S, sizeof(float) * (size_t)m->dk * m->dv);
        gdn_recurrent(e->n, q, C, k, C, v, C, ba + m->Hv + h, 2 * m->Hv, ba + h, 2 * m->Hv, Sc, m->dk, m->dv, o, vd);
        return;
    }
    /* HF runs the recurrent kernel only for a single token continuing a cache; prefill is chunked. */
    if (e->n == 1 && e->seq_len > 0)
        gdn_recurrent(1, q, C, k, C, v, C, ba + m->Hv + h, 2 * m->Hv, ba + h, 2 * m->Hv, S, m->dk, m->dv, o, vd);
    else
        gdn_chunked(e->n, e->seq_len, q, C, k, C, v, C, ba + m->Hv + h, 2 * m->Hv, ba + h, 2 * m->Hv, S, m->dk, m->dv, o,
                    vd, R->s->thr + (size_t)ith * R->s->thr_floats);
}

size_t spec_rec_floats(const model *m) { return 2 * (size_t)m->C + 2 * (size_t)m->Hv; }

void forward_spec_commit(const model *m, state_pool *st, int slot, const float *rec, int max_win, int n_keep) {
    if (n_keep <= 0) return;
    size_t rf = spec_rec_floats(m);
    int C = m->C, K = m->K, kd = m->Hk * m->dk, vd = m->Hv * m->dv;
    float o[1024];
    for (int l = 0; l < m->n_lin; l++) {
        const float *lr = rec + (size_t)l * max_win * rf;
        /* conv window: the last K-1 rows of [window | kept pre-conv rows], as conv_item advances it */
        float *cs = state_conv(st, slot, l);
        int tot = K - 1 + n_keep;
        for (int jj = 0; jj < K - 1; jj++) {
            int xi = tot - (K - 1) + jj;
            if (xi < K - 1) {
                if (xi != jj) memcpy(cs + (size_t)jj * C, cs + (size_t)xi * C, sizeof(float) * (size_t)C);
            } else {
                memcpy(cs + (size_t)jj * C, lr + (size_t)(xi - (K - 1)) * rf, sizeof(float) * (size_t)C);
            }
        }
        /* recurrence: replay the kept tokens on the slot's state (same calls as decode, other strides) */
        for (int h = 0; h < m->Hv; h++) {
            int kh = h / (m->Hv / m->Hk);
            const float *post = lr + C;
            float *S = state_rec(st, slot, l) + (size_t)h * m->dk * m->dv;
            for (int t = 0; t < n_keep; t++) {
                const float *pt = post + (size_t)t * rf, *bt = lr + (size_t)t * rf + 2 * (size_t)C;
                gdn_recurrent(1, pt + (size_t)kh * m->dk, C, pt + kd + (size_t)kh * m->dk, C, pt + 2 * kd + (size_t)h * m->dv, C,
                              bt + m->Hv + h, 2 * m->Hv, bt + h, 2 * m->Hv, S, m->dk, m->dv, o, m->dv);
            }
        }
        (void)vd;
    }
}

/* per row: gated RMSNorm per value head: rmsnorm(o) * w * silu(z) */
static void gnorm_item(void *p, long r, int ith) {
    fwd_run *R = p;
    const model *m = R->m;
    int vd = m->Hv * m->dv;
    float *o = R->s->o + (size_t)r * vd;
    const float *z = R->s->z + (size_t)r * vd;
    for (int h = 0; h < m->Hv; h++) {
        float *oh = o + (size_t)h * m->dv;
        ops_rmsnorm(oh, oh, R->lw->gnorm, m->dv, R->eps);
        for (int j = 0; j < m->dv; j++) oh[j] = oh[j] * ops_silu(z[(size_t)h * m->dv + j]);
    }
}

/* Qwen3-Next: split the per-key-head groups of in_proj_qkvz / in_proj_ba into [q | k | v], z, b, a */
static void next_split_item(void *p, long r, int ith) {
    fwd_run *R = p;
    const model *m = R->m;
    int Hk = m->Hk, dk = m->dk, dv = m->dv, rr = m->Hv / m->Hk;
    int kd = Hk * dk, vd = m->Hv * dv, grp = 2 * dk + 2 * rr * dv;
    /* fused rows in s->proj (width 2kd + 2vd) are split into [q|k|v] rows in s->o and z rows */
    const float *src = R->s->proj + (size_t)r * (2 * kd + 2 * vd);
    float *qkv = R->s->o + (size_t)r * m->C, *z = R->s->z + (size_t)r * vd;
    for (int g = 0; g < Hk; g++) {
        const float *s = src + (size_t)g * grp;
        memcpy(qkv + (size_t)g * dk, s, (size_t)dk * sizeof(float));
        memcpy(qkv + kd + (size_t)g * dk, s + dk, (size_t)dk * sizeof(float));
        memcpy(qkv + 2 * kd + (size_t)g * rr * dv, s + 2 * dk, (size_t)rr * dv * sizeof(float));
        memcpy(z + (size_t)g * rr * dv, s + 2 * dk + rr * dv, (size_t)rr * dv * sizeof(float));
    }
    const float *bsrc = R->s->ba_raw + (size_t)r * 2 * m->Hv;
    float *ba = R->s->ba + (size_t)r * 2 * m->Hv;
    for (int g = 0; g < Hk; g++)
        for (int j = 0; j < rr; j++) {
            ba[g * rr + j] = bsrc[g * 2 * rr + j];
            ba[m->Hv + g * rr + j] = bsrc[g * 2 * rr + rr + j];
        }
}

static void deltanet_layer(threadpool *tp, fwd_run *R, const int *row0) {
    const model *m = R->m;
    const layer_weights *lw = R->lw;
    fwd_scratch *s = R->s;
    int T = R->T;
    if (lw->fused_qkvz) {
        wmat_mul(tp, s->proj, s->xn, &lw->in_qkvz, T);
        wmat_mul(tp, s->ba_raw, s->xn, &lw->in_ba, T);
        par_for(tp, T, next_split_item, R);
        R->qkv_src = s->o; /* consumed by the conv before the recurrence writes its output there */
    } else {
        wmat_mul(tp, s->proj, s->xn, &lw->in_qkv, T);
        R->qkv_src = s->proj;
        wmat_mul(tp, s->z, s->xn, &lw->in_z, T);
        /* b and a side by side in s->ba: [T][Hv] each would need two buffers; compute into ba_raw and
         * interleave per row as [b (Hv) | a (Hv)] */
        wmat_mul(tp, s->ba_raw, s->xn, &lw->in_b, T);
        wmat_mul(tp, s->ba_raw + (size_t)T * m->Hv, s->xn, &lw->in_a, T);
        for (int r = 0; r < T; r++) {
            memcpy(s->ba + (size_t)r * 2 * m->Hv, s->ba_raw + (size_t)r * m->Hv, (size_t)m->Hv * sizeof(float));
            memcpy(s->ba + (size_t)r * 2 * m->Hv + m->Hv, s->ba_raw + (size_t)(T + r) * m->Hv, (size_t)m->Hv * sizeof(float));
        }
    }
    conv_job cj = {R, row0};
    par_for(tp, (long)R->n_entries * ((m->C + CONV_BLK - 1) / CONV_BLK), conv_item, &cj);
    par_for(tp, T, gdn_prep_item, R);
    /* speculative windows: record each token's position-local inputs before the recurrence (which may reuse
     * the pre-conv rows' buffer for its output) */
    size_t rf = spec_rec_floats(m);
    for (int i = 0; i < R->n_entries; i++) {
        const fwd_entry *e = &R->e[i];
        if (!e->spec_rec) continue;
        for (int t = 0; t < e->n; t++) {
            float *dst = e->spec_rec + ((size_t)R->lin * e->spec_max_win + (size_t)t) * rf;
            size_t r = (size_t)row0[i] + (size_t)t;
            memcpy(dst, R->qkv_src + r * m->C, sizeof(float) * (size_t)m->C);
            memcpy(dst + m->C, s->conv + r * m->C, sizeof(float) * (size_t)m->C);
            memcpy(dst + 2 * (size_t)m->C, s->ba + r * 2 * m->Hv, sizeof(float) * 2 * (size_t)m->Hv);
        }
    }
    gdn_job gj = {R, row0};
    par_for(tp, (long)R->n_entries * m->Hv, gdn_item, &gj);
    par_for(tp, T, gnorm_item, R);
    wmat_mul(tp, s->out, s->o, &lw->out_proj, T);
}

/* ---- gated full attention ---- */

static void rope_apply(float *x, int R, const int *pos3, const float *inv_freq, const unsigned char *stream) {
    int half = R / 2;
    for (int i = 0; i < half; i++) {
        float ang = (float)pos3[stream[i]] * inv_freq[i];
        float c = cosf(ang), sn = sinf(ang);
        float a = x[i], b = x[i + half];
        x[i] = a * c - b * sn;
        x[i + half] = b * c + a * sn;
    }
}

/* per row: q/k norms, RoPE, and the row's K and V written into the sequence's blocks */
static void attn_prep_item(void *p, long r, int ith) {
    fwd_run *R = p;
    const model *m = R->m;
    const layer_weights *lw = R->lw;
    fwd_scratch *s = R->s;
    int hd = m->hd, kvd = m->Hkv * hd, pos = s->row_pos[r];
    float *qg = s->proj + (size_t)r * m->Hq * 2 * hd;
    for (int h = 0; h < m->Hq; h++) {
        float *q = qg + (size_t)h * 2 * hd;
        ops_rmsnorm(q, q, lw->q_norm, hd, R->eps);
        rope_apply(q, m->cfg.rope_dim, s->row_rope + 3 * (size_t)r, s->inv_freq, s->rope_stream);
    }
    const fwd_entry *e = &R->e[s->row_entry[r]];
    float *kr = s->z + (size_t)r * 2 * kvd, *vr = kr + kvd;
    float *kdst = kv_k_row(R->kv, R->full, e->blocks, pos), *vdst = kv_v_row(R->kv, R->full, e->blocks, pos);
    for (int h = 0; h < m->Hkv; h++) {
        float *k = kr + (size_t)h * hd;
        ops_rmsnorm(kdst + (size_t)h * hd, k, lw->k_norm, hd, R->eps);
        rope_apply(kdst + (size_t)h * hd, m->cfg.rope_dim, s->row_rope + 3 * (size_t)r, s->inv_freq, s->rope_stream);
    }
    memcpy(vdst, vr, (size_t)kvd * sizeof(float));
}

/* per (row, head): causal softmax attention over the sequence's cached positions [0, pos], then the
 * sigmoid output gate */
static void attn_item(void *p, long item, int ith) {
    fwd_run *R = p;
    const model *m = R->m;
    fwd_scratch *s = R->s;
    int hd = m->hd, r = (int)(item / m->Hq), h = (int)(item % m->Hq);
    int kvh = h / (m->Hq / m->Hkv), pos = s->row_pos[r];
    const fwd_entry *e = &R->e[s->row_entry[r]];
    const float *qg = s->proj + (size_t)r * m->Hq * 2 * hd + (size_t)h * 2 * hd;
    const float *q = qg, *gate = qg + hd;
    float *sc = s->thr + (size_t)ith * s->thr_floats;
    float scale = (float)(1.0 / sqrt((double)hd));
    float mx = -INFINITY;
    int u0 = e->attn_start;
    for (int u = u0; u <= pos; u++) {
        const float *k = kv_k_row(R->kv, R->full, e->blocks, u) + (size_t)kvh * hd;
        float v = ops_dot(q, k, hd) * scale;
        sc[u] = v;
        if (v > mx) mx = v;
    }
    float sum = 0.0f;
    for (int u = u0; u <= pos; u++) {
        sc[u] = expf(sc[u] - mx);
        sum += sc[u];
    }
    float inv = 1.0f / sum;
    float *o = s->o + (size_t)r * m->Hq * hd + (size_t)h * hd;
    for (int j = 0; j < hd; j++) o[j] = 0.0f;
    for (int u = u0; u <= pos; u++) {
        const float *v = kv_v_row(R->kv, R->full, e->blocks, u) + (size_t)kvh * hd;
        ops_axpy(o, sc[u] * inv, v, hd);
    }
    for (int j = 0; j < hd; j++) o[j] *= ops_sigmoid(gate[j]);
}

static void attention_layer(threadpool *tp, fwd_run *R) {
    const model *m = R->m;
    const layer_weights *lw = R->lw;
    fwd_scratch *s = R->s;
    int T = R->T, kvd = m->Hkv * m->hd;
    wmat_mul(tp, s->proj, s->xn, &lw->q_proj, T);
    /* K rows then V rows side by side per row in s->z: [T][2*kvd]; computed into moe_x/moe_y first */
    wmat_mul(tp, s->moe_x, s->xn, &lw->k_proj, T);
    wmat_mul(tp, s->moe_y, s->xn, &lw->v_proj, T);
    for (int r = 0; r < T; r++) {
        memcpy(s->z + (size_t)r * 2 * kvd, s->moe_x + (size_t)r * kvd, (size_t)kvd * sizeof(float));
        memcpy(s->z + (size_t)r * 2 * kvd + kvd, s->moe_y + (size_t)r * kvd, (size_t)kvd * sizeof(float));
    }
    par_for(tp, T, attn_prep_item, R);
    par_for(tp, (long)T * m->Hq, attn_item, R);
    wmat_mul(tp, s->out, s->o, &lw->o_proj, T);
}

/* ---- FFN ---- */

typedef struct {
    float *g;
    const float *u;
    int n;
} swiglu_job;

static void swiglu_item(void *p, long r, int ith) {
    swiglu_job *j = p;
    float *g = j->g + r * j->n;
    const float *u = j->u + r * j->n;
    for (int i = 0; i < j->n; i++) g[i] = ops_silu(g[i]) * u[i];
}

/* y[M, H] = MLP(x[M, H]) through g/u scratch */
static void mlp(threadpool *tp, fwd_scratch *s, float *y, const float *x, const wmat *wg, const wmat *wu, const wmat *wd,
                int M) {
    wmat_mul(tp, s->ffn_g, x, wg, M);
    wmat_mul(tp, s->ffn_u, x, wu, M);
    swiglu_job j = {s->ffn_g, s->ffn_u, wg->rows};
    par_for(tp, M, swiglu_item, &j);
    wmat_mul(tp, y, s->ffn_g, wd, M);
}

/* per row: softmax over all experts in f32, top-k (ties to the lower index, as a stable descending sort),
 * optionally renormalised */
static void route_item(void *p, long r, int ith) {
    fwd_run *R = p;
    const model_config *c = &R->m->cfg;
    int E = c->n_experts, k = c->n_experts_per_tok;
    float *lg = R->s->moe_logits + (size_t)r * E;
    float mx = -INFINITY, sum = 0.0f;
    for (int e = 0; e < E; e++) mx = lg[e] > mx ? lg[e] : mx;
    for (int e = 0; e < E; e++) {
        lg[e] = expf(lg[e] - mx);
        sum += lg[e];
    }
    for (int e = 0; e < E; e++) lg[e] /= sum;
    int *idx = R->s->moe_idx + (size_t)r * k;
    float *w = R->s->moe_w + (size_t)r * k;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int q = 0; q < j; q++) taken |= idx[q] == e;
            if (!taken && (best < 0 || lg[e] > lg[best])) best = e;
        }
        idx[j] = best;
        w[j] = lg[best];
    }
    if (c->norm_topk_prob) {
        float ws = 0.0f;
        for (int j = 0; j < k; j++) ws += w[j];
        for (int j = 0; j < k; j++) w[j] /= ws;
    }
}

static void moe_ffn(threadpool *tp, fwd_run *R) {
    const model *m = R->m;
    const moe_weights *w = &R->lw->moe_w;
    fwd_scratch *s = R->s;
    int T = R->T, H = m->H, E = m->cfg.n_experts, k = m->cfg.n_experts_per_tok;
    wmat_mul(tp, s->moe_logits, s->xn, &w->router, T);
    par_for(tp, T, route_item, R);
    memset(s->out, 0, (size_t)T * H * sizeof(float));
    /* experts in index order: each row accumulates its experts' weighted outputs in that fixed order */
    for (int e = 0; e < E; e++) {
        int n = 0;
        for (int r = 0; r < T; r++)
            for (int j = 0; j < k; j++)
                if (s->moe_idx[r * k + j] == e) {
                    s->moe_rows[n] = r;
                    s->moe_rw[n] = s->moe_w[r * k + j];
                    memcpy(s->moe_x + (size_t)n * H, s->xn + (size_t)r * H, (size_t)H * sizeof(float));
                    n++;
                }
        if (!n) continue;
        mlp(tp, s, s->moe_y, s->moe_x, &w->gate[e], &w->up[e], &w->down[e], n);
        for (int i = 0; i < n; i++) {
            float *dst = s->out + (size_t)s->moe_rows[i] * H;
            const float *src = s->moe_y + (size_t)i * H;
            float rw = s->moe_rw[i];
            for (int j = 0; j < H; j++) dst[j] += src[j] * rw;
        }
    }
    if (w->sh_gate.rows > 0) {
        mlp(tp, s, s->moe_y, s->xn, &w->sh_gate, &w->sh_up, &w->sh_down, T);
        wmat_mul(tp, s->sh_gate, s->xn, &w->sh_gate_w, T);
        for (int r = 0; r < T; r++) {
            float gt = ops_sigmoid(s->sh_gate[r]);
            float *dst = s->out + (size_t)r * H;
            const float *src = s->moe_y + (size_t)r * H;
            for (int j = 0; j < H; j++) dst[j] += gt * src[j];
        }
    }
}

/* ---- the whole pass ---- */

typedef struct {
    float *x;
    const float *y;
    int n;
} add_job;

static void add_item(void *p, long r, int ith) {
    add_job *j = p;
    float *x = j->x + r * j->n;
    const float *y = j->y + r * j->n;
    for (int i = 0; i < j->n; i++) x[i] += y[i];
}

typedef struct {
    const model *m;
    fwd_scratch *s;
    const int32_t *ids;
} embed_job;

static void embed_item(void *p, long r, int ith) {
    embed_job *j = p;
    const model *m = j->m;
    const wmat *E = &m->embed;
    int id = j->ids[r];
    float *x = j->s->x + (size_t)r * m->H;
    if (E->type == WT_BF16) {
        const uint16_t *row = (const uint16_t *)E->data + (size_t)id * m->H;
        for (int i = 0; i < m->H; i++) x[i] = bf16_to_f32(row[i]);
    } else if (E->type == WT_F16) {
        const uint16_t *row = (const uint16_t *)E->data + (size_t)id * m->H;
        for (int i = 0; i < m->H; i++) x[i] = f16_to_f32(row[i]);
    } else {
        memcpy(x, (const float *)E->data + (size_t)id * m->H, (size_t)m->H * sizeof(float));
    }
}

int fwd_rows_begin(fwd_scratch *s, const fwd_entry *e, int n_entries) {
    int T = 0;
    for (int i = 0; i < n_entries; i++) T += e[i].n;
    CI_ASSERT(T <= s->max_tokens && n_entries <= s->max_tokens);
    int r = 0;
    for (int i = 0; i < n_entries; i++) {
        s->entry_row0[i] = r;
        for (int t = 0; t < e[i].n; t++, r++) {
            s->ids[r] = e[i].tokens[t];
            s->row_pos[r] = e[i].seq_len + t;
            s->row_entry[r] = i;
            int *rr = s->row_rope + 3 * (size_t)r;
            if (e[i].rope_pos && t < e[i].mm_n)
                for (int k = 0; k < 3; k++) rr[k] = e[i].rope_pos[(size_t)k * e[i].rope_stride + t];
            else
                rr[0] = rr[1] = rr[2] = e[i].seq_len + t + e[i].rope_delta;
        }
    }
    return T;
}

void fwd_embed_rows(const model *m, fwd_scratch *s, threadpool *tp, int T) {
    embed_job ej = {m, s, s->ids};
    par_for(tp, T, embed_item, &ej);
}

void fwd_decoder_layer(const model *m, fwd_scratch *s, kv_pool *kv, state_pool *st, threadpool *tp, const fwd_entry *e,
                       int n_entries, int T, const layer_weights *lw, int lin, int full) {
    float eps = (float)m->cfg.rms_norm_eps;
    fwd_run R = {m, lw, s, kv, st, e, n_entries, T, 0, lin, full, NULL, eps};
    rmsnorm_rows(tp, s->xn, s->x, lw->in_norm, T, m->H, eps);
    if (lw->type == LAYER_LINEAR) deltanet_layer(tp, &R, s->entry_row0);
    else attention_layer(tp, &R);
    add_job aj = {s->x, s->out, m->H};
    par_for(tp, T, add_item, &aj);
    rmsnorm_rows(tp, s->xn, s->x, lw->post_norm, T, m->H, eps);
    if (lw->moe) moe_ffn(tp, &R);
    else mlp(tp, s, s->out, s->xn, &lw->mlp_gate, &lw->mlp_up, &lw->mlp_down, T);
    par_for(tp, T, add_item, &aj);
}

/* image tokens: the vision tower's rows replace their embeddings (masked_scatter in transformers) */
static void image_rows(const model *m, fwd_scratch *s, const fwd_entry *e, int n_entries) {
    for (int i = 0; i < n_entries; i++) {
        if (!e[i].embeds) continue;
        for (int t = 0; t < e[i].n && t < e[i].mm_n; t++)
            if (e[i].embed_row[t] >= 0)
                memcpy(s->x + (size_t)(s->entry_row0[i] + t) * m->H, e[i].embeds + (size_t)e[i].embed_row[t] * m->H,
                       (size_t)m->H * sizeof(float));
    }
}

void forward_cpu(const model *m, fwd_scratch *s, kv_pool *kv, state_pool *st, threadpool *tp, const fwd_entry *e,
                 int n_entries, float *logits) {
    int T = fwd_rows_begin(s, e, n_entries);
    fwd_embed_rows(m, s, tp, T);
    image_rows(m, s, e, n_entries);
    float eps = (float)m->cfg.rms_norm_eps;
    for (int l = 0; l < m->L; l++)
        fwd_decoder_layer(m, s, kv, st, tp, e, n_entries, T, &m->layers[l], m->lin_index[l], m->full_index[l]);
    /* the final-normed rows an entry asked for (the same ops_rmsnorm on the same row as the logits path) */
    for (int i = 0; i < n_entries; i++)
        if (e[i].hidden)
            rmsnorm_rows(tp, e[i].hidden, s->x + (size_t)s->entry_row0[i] * m->H, m->final_norm, e[i].n, m->H, eps);
    /* rows that need logits, in entry order */
    int nl = 0;
    for (int i = 0, rr = 0; i < n_entries; rr += e[i].n, i++) {
        int first = e[i].all_logits ? rr : rr + e[i].n - 1;
        for (int t = first; t < rr + e[i].n; t++)
            memcpy(s->xn + (size_t)nl++ * m->H, s->x + (size_t)t * m->H, (size_t)m->H * sizeof(float));
    }
    rmsnorm_rows(tp, s->lrows, s->xn, m->final_norm, nl, m->H, eps);
    wmat_mul(tp, logits, s->lrows, &m->lm_head, nl);
}

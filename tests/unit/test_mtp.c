/* test_mtp.c — the MTP head (model/mtp.c, spec §5) on the fixtures that carry mtp.* tensors: teacher-forced
 * logits against an independent float64 implementation written here from the spec, the target's final-normed
 * hidden against its own logits, incremental rows and rewritten tails bit-identical to one batch, a head that
 * starts mid-sequence (prefix-cache resume); and, once the trained default model lands with its oracle
 * (tests/fixtures/default_model/mtp_cases.json), against transformers-side MTP logits. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "cinfer.h"
#include "model/qwen35.h"
#include "runtime/ctx_internal.h"
#include "test.h"
#include "util/alloc.h"
#include "util/bf16.h"
#include "util/file.h"
#include "util/npy.h"

#define DENSE "tests/fixtures/qwen35_dense"

static double wget(const wmat *w, int r, int c) {
    size_t i = (size_t)r * w->cols + c;
    if (w->type == WT_BF16) return bf16_to_f32(((const uint16_t *)w->data)[i]);
    if (w->type == WT_F16) return f16_to_f32(((const uint16_t *)w->data)[i]);
    return ((const float *)w->data)[i];
}

/* y = W x (W [rows, cols]) in double */
static void matvec(const wmat *w, const double *x, double *y) {
    for (int r = 0; r < w->rows; r++) {
        double a = 0;
        for (int c = 0; c < w->cols; c++) a += wget(w, r, c) * x[c];
        y[r] = a;
    }
}

static void rmsnorm_d(double *y, const double *x, const float *w, int n, double eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double inv = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * inv * w[i];
}

static void rope_d(double *x, int R, int pos, double theta) {
    for (int i = 0; i < R / 2; i++) {
        double ang = pos / pow(theta, (double)(2 * i) / R), c = cos(ang), s = sin(ang);
        double a = x[i], b = x[i + R / 2];
        x[i] = a * c - b * s;
        x[i + R / 2] = b * c + a * s;
    }
}

static double silu_d(double x) {
    return x / (1 + exp(-x));
}

/* The head teacher-forced over rows t = 0..n-1 — row t pairs token x[t+1] with hidden hh[t], at position
 * pos0 + t, attending causally over its own rows — straight from spec §5, in float64; logits [n][V]. */
static void mtp_reference(const model *m, const int32_t *x1, const float *hh, int n, int pos0,
                          double *logits) {
    const mtp_weights *w = &m->mtp;
    const layer_weights *lw = &w->layer;
    int H = m->H, hd = m->hd, Hq = m->Hq, Hkv = m->Hkv, R = m->cfg.rope_dim;
    double eps = m->cfg.rms_norm_eps;
    double *u = calloc((size_t)n * H, sizeof(double)), *cat = malloc(sizeof(double) * 2 * H),
           *tmp = malloc(sizeof(double) * H);
    double *q = malloc(sizeof(double) * (size_t)n * Hq * 2 * hd),
           *k = malloc(sizeof(double) * (size_t)n * Hkv * hd);
    double *v = malloc(sizeof(double) * (size_t)n * Hkv * hd), *o = malloc(sizeof(double) * Hq * hd);
    double *xn = malloc(sizeof(double) * H), *y = malloc(sizeof(double) * H),
           *sc = malloc(sizeof(double) * n);
    int I = lw->mlp_gate.rows;
    double *g = malloc(sizeof(double) * (I > 0 ? I : 1)), *up = malloc(sizeof(double) * (I > 0 ? I : 1));
    for (int t = 0; t < n; t++) {
        for (int i = 0; i < H; i++) tmp[i] = wget(&m->embed, x1[t], i);
        rmsnorm_d(cat, tmp, w->pre_fc_norm_embedding, H, eps);
        for (int i = 0; i < H; i++) tmp[i] = hh[(size_t)t * H + i];
        rmsnorm_d(cat + H, tmp, w->pre_fc_norm_hidden, H, eps);
        matvec(&w->fc, cat, u + (size_t)t * H);
        rmsnorm_d(xn, u + (size_t)t * H, lw->in_norm, H, eps);
        double *qt = q + (size_t)t * Hq * 2 * hd, *kt = k + (size_t)t * Hkv * hd,
               *vt = v + (size_t)t * Hkv * hd;
        matvec(&lw->q_proj, xn, qt);
        matvec(&lw->k_proj, xn, kt);
        matvec(&lw->v_proj, xn, vt);
        for (int h = 0; h < Hq; h++) {
            rmsnorm_d(qt + (size_t)h * 2 * hd, qt + (size_t)h * 2 * hd, lw->q_norm, hd, eps);
            rope_d(qt + (size_t)h * 2 * hd, R, pos0 + t, m->cfg.rope_theta);
        }
        for (int h = 0; h < Hkv; h++) {
            rmsnorm_d(kt + (size_t)h * hd, kt + (size_t)h * hd, lw->k_norm, hd, eps);
            rope_d(kt + (size_t)h * hd, R, pos0 + t, m->cfg.rope_theta);
        }
        for (int h = 0; h < Hq; h++) {
            const double *qh = qt + (size_t)h * 2 * hd, *gate = qh + hd;
            int kh = h / (Hq / Hkv);
            double mx = -INFINITY, sum = 0;
            for (int s = 0; s <= t; s++) {
                double d = 0;
                for (int i = 0; i < hd; i++) d += qh[i] * k[((size_t)s * Hkv + kh) * hd + i];
                sc[s] = d / sqrt((double)hd);
                mx = sc[s] > mx ? sc[s] : mx;
            }
            for (int s = 0; s <= t; s++) sum += sc[s] = exp(sc[s] - mx);
            for (int i = 0; i < hd; i++) {
                double a = 0;
                for (int s = 0; s <= t; s++) a += sc[s] / sum * v[((size_t)s * Hkv + kh) * hd + i];
                o[(size_t)h * hd + i] = a / (1 + exp(-gate[i]));
            }
        }
        matvec(&lw->o_proj, o, y);
        double *ut = u + (size_t)t * H;
        for (int i = 0; i < H; i++) ut[i] += y[i];
        rmsnorm_d(xn, ut, lw->post_norm, H, eps);
        matvec(&lw->mlp_gate, xn, g);
        matvec(&lw->mlp_up, xn, up);
        for (int i = 0; i < I; i++) g[i] = silu_d(g[i]) * up[i];
        wmat dn = lw->mlp_down;
        matvec(&dn, g, y);
        for (int i = 0; i < H; i++) ut[i] += y[i];
        rmsnorm_d(xn, ut, w->norm, H, eps);
        matvec(&m->lm_head, xn, logits + (size_t)t * m->V);
    }
    free(u), free(cat), free(tmp), free(q), free(k), free(v), free(o), free(xn), free(y), free(sc), free(g),
        free(up);
}

static cinfer_ctx *open_ctx(cinfer_model *cm, int max_ctx) {
    cinfer_ctx_params p = cinfer_ctx_default_params();
    p.max_seqs = 4;
    p.max_ctx = max_ctx;
    p.max_batch = max_ctx;
    p.n_threads = 2;
    char err[512];
    cinfer_ctx *c = NULL;
    if (cinfer_ctx_create(cm, &p, &c, err, sizeof err) || ctx_mtp_init(c, 0, err, sizeof err)) {
        test_fail(__FILE__, __LINE__, "%s", err);
        cinfer_ctx_destroy(c);
        return NULL;
    }
    return c;
}

static void make_tokens(int32_t *x, int n, uint64_t seed, int V) {
    for (int i = 0; i < n; i++) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        x[i] = (int32_t)(seed % (uint64_t)V);
    }
}

/* The target's hidden rows for x[0, n) (one prefill), and its logits. */
static int target_hidden(cinfer_ctx *c, const int32_t *x, int n, float *hid, float *lg) {
    char err[512];
    int s = cinfer_seq_open(c, err, sizeof err);
    cinfer_batch_entry e = {s, x, n, 1, 0, hid};
    int rc = cinfer_forward(c, &e, 1, lg, err, sizeof err);
    if (rc) test_fail(__FILE__, __LINE__, "%s", err);
    return rc ? -1 : s;
}

static double std_of(const double *x, size_t n) {
    double s = 0, s2 = 0;
    for (size_t i = 0; i < n; i++) s += x[i], s2 += x[i] * x[i];
    return sqrt(s2 / n - (s / n) * (s / n));
}

TEST(mtp_head_matches_float64_reference) {
    cinfer_model *cm;
    char err[512];
    if (cinfer_model_open(DENSE, &cm, err, sizeof err)) {
        test_fail(__FILE__, __LINE__, "%s", err);
        return;
    }
    const model *m = cinfer_model_internal(cm);
    REQUIRE(m->mtp.present);
    enum { N = 40 };
    int V = m->V, H = m->H;
    int32_t x[N];
    make_tokens(x, N, 4242, V);
    cinfer_ctx *c = open_ctx(cm, 128);
    REQUIRE(c);
    float *hid = malloc(sizeof(float) * N * H), *lg = malloc(sizeof(float) * N * V);
    int s = target_hidden(c, x, N, hid, lg);
    REQUIRE(s >= 0);
    /* the hidden rows are the lm_head's input: their product with lm_head is the logits */
    double worst_h = 0;
    for (int t = 0; t < N; t++)
        for (int v = 0; v < V; v++) {
            double d = 0;
            for (int i = 0; i < H; i++) d += (double)hid[(size_t)t * H + i] * wget(&m->lm_head, v, i);
            worst_h = fmax(worst_h, fabs(d - lg[(size_t)t * V + v]));
        }
    CHECK_MSG(worst_h < 1e-4, "hidden . lm_head vs logits: %.3g", worst_h);
    /* teacher-forced head: rows t = 0..N-2 pair x[t+1] with hidden t */
    float *ml = malloc(sizeof(float) * N * V), *hout = malloc(sizeof(float) * N * H);
    ctx_mtp_entry me = {s, 0, x + 1, hid, N - 1, hout, 2};
    REQUIRE(ctx_mtp_forward(c, &me, 1, ml, err, sizeof err) == 0);
    CHECK_EQ_INT(ctx_mtp_len(c, s), N - 1);
    double *ref = malloc(sizeof(double) * N * V);
    mtp_reference(m, x + 1, hid, N - 1, 0, ref);
    double sd = std_of(ref, (size_t)(N - 1) * V), worst = 0;
    for (size_t i = 0; i < (size_t)(N - 1) * V; i++) worst = fmax(worst, fabs(ml[i] - ref[i]));
    printf("     mtp vs float64: max |diff| = %.3g = %.3g x std\n", worst, worst / sd);
    CHECK_MSG(worst / sd < 2e-5, "MTP logits vs the float64 reference: %.3g x std", worst / sd);
    /* a head starting at position 17 (a resumed prompt) attends only to its own rows from there */
    int s2 = cinfer_seq_open(c, err, sizeof err);
    REQUIRE(s2 >= 0);
    ctx_mtp_entry me2 = {s2, 17, x + 18, hid + 17 * H, N - 18, NULL, 2};
    REQUIRE(ctx_mtp_forward(c, &me2, 1, ml, err, sizeof err) == 0);
    mtp_reference(m, x + 18, hid + 17 * H, N - 18, 17, ref);
    worst = 0;
    for (size_t i = 0; i < (size_t)(N - 18) * V; i++) worst = fmax(worst, fabs(ml[i] - ref[i]));
    CHECK_MSG(worst / sd < 2e-5, "MTP from position 17 vs the float64 reference: %.3g x std", worst / sd);
    free(ref), free(ml), free(hout), free(hid), free(lg);
    cinfer_ctx_destroy(c);
    cinfer_model_close(cm);
}

/* Rows fed one at a time, and a tail of wrong rows rewritten (a rejected window's drafts), give exactly the
 * logits and normed outputs of one batch; the head's blocks all come back when the sequence closes. */
TEST(mtp_incremental_and_rewritten_rows_are_exact) {
    cinfer_model *cm;
    char err[512];
    REQUIRE(cinfer_model_open(DENSE, &cm, err, sizeof err) == 0);
    const model *m = cinfer_model_internal(cm);
    enum { N = 37 };
    int V = m->V, H = m->H;
    int32_t x[N], junk[N];
    make_tokens(x, N, 99, V);
    make_tokens(junk, N, 7, V);
    cinfer_ctx *c = open_ctx(cm, 128);
    REQUIRE(c);
    float *hid = malloc(sizeof(float) * N * H), *lg = malloc(sizeof(float) * N * V);
    int s = target_hidden(c, x, N, hid, lg);
    REQUIRE(s >= 0);
    float *ml = malloc(sizeof(float) * N * V), *ho = malloc(sizeof(float) * N * H);
    ctx_mtp_entry all = {s, 0, x + 1, hid, N - 1, ho, 2};
    REQUIRE(ctx_mtp_forward(c, &all, 1, ml, err, sizeof err) == 0);
    int s2 = cinfer_seq_open(c, err, sizeof err);
    float row[512], h1[512];
    REQUIRE(V <= 512 && H <= 512);
    int pos = 0, mism = 0;
    while (pos < N - 1) {
        /* a chunk of real rows, then 1..3 junk rows (junk tokens, hidden of other rows) that the next chunk
         * rewrites from its first position */
        int cnt = 1 + pos % 4;
        if (pos + cnt > N - 1) cnt = N - 1 - pos;
        for (int t = 0; t < cnt; t++) {
            ctx_mtp_entry e1 = {s2, pos + t, x + pos + t + 1, hid + (size_t)(pos + t) * H, 1, h1, 1};
            REQUIRE(ctx_mtp_forward(c, &e1, 1, row, err, sizeof err) == 0);
            mism += memcmp(row, ml + (size_t)(pos + t) * V, sizeof(float) * V) != 0;
            mism += memcmp(h1, ho + (size_t)(pos + t) * H, sizeof(float) * H) != 0;
        }
        pos += cnt;
        int nj = 1 + pos % 3;
        if (pos + nj <= N) {
            ctx_mtp_entry ej = {s2, pos, junk, hid, nj, NULL, 0};
            REQUIRE(ctx_mtp_forward(c, &ej, 1, row, err, sizeof err) == 0);
            CHECK_EQ_INT(ctx_mtp_len(c, s2), pos + nj);
        }
    }
    CHECK_EQ_INT(mism, 0);
    /* a gap and a position before the head's first row are refused */
    ctx_mtp_entry bad = {s2, ctx_mtp_len(c, s2) + 1, x, hid, 1, NULL, 0};
    CHECK(ctx_mtp_forward(c, &bad, 1, row, err, sizeof err) == CINFER_EINVAL);
    cinfer_seq_close(c, s2);
    cinfer_seq_close(c, s);
    int s3 = cinfer_seq_open(c, err, sizeof err);
    CHECK_EQ_INT(ctx_mtp_len(c, s3), 0);
    free(ml), free(ho), free(hid), free(lg);
    cinfer_ctx_destroy(c);
    cinfer_model_close(cm);
}

/* The oracle from the trained default model (tools/train/, made on the GPU machine): the target's
 * final-normed hidden and the teacher-forced MTP logits of each case, from the training code's own forward.
 */
TEST(mtp_oracle_default_model) {
    char dir[600], path[700];
    snprintf(dir, sizeof dir, "%s/default_model", test_fixtures_dir());
    snprintf(path, sizeof path, "%s/mtp_cases.json", dir);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root)
        SKIP("tests/fixtures/default_model/mtp_cases.json is not there yet (the trained default model's MTP "
             "oracle)");
    char err[512];
    cinfer_model *cm;
    if (cinfer_model_open("models/default", &cm, err, sizeof err)) {
        json_decref(root);
        test_fail(__FILE__, __LINE__, "%s", err);
        return;
    }
    const model *m = cinfer_model_internal(cm);
    CHECK_MSG(m->mtp.present, "models/default has no mtp.* tensors but the fixture has MTP cases");
    json_t *cases = json_object_get(root, "cases");
    if (!json_is_array(cases)) { /* one case at the top level */
        cases = json_array();
        json_array_append(cases, root);
    } else {
        json_incref(cases);
    }
    int V = m->V, H = m->H, n_cases = 0;
    for (size_t ci = 0; m->mtp.present && ci < json_array_size(cases); ci++) {
        json_t *cs = json_array_get(cases, ci);
        json_t *jt = json_object_get(cs, "tokens");
        const char *lf = json_string_value(json_object_get(cs, "mtp_logits")),
                   *hf = json_string_value(json_object_get(cs, "mtp_hidden"));
        if (!lf) lf = json_string_value(json_object_get(cs, "logits"));
        if (!hf) hf = json_string_value(json_object_get(cs, "hidden"));
        if (!lf) lf = "mtp_logits.npy";
        if (!hf) hf = "mtp_hidden.npy";
        int T = (int)json_array_size(jt);
        REQUIRE(T >= 2);
        int32_t *x = malloc(sizeof(int32_t) * T);
        for (int i = 0; i < T; i++) x[i] = (int32_t)json_integer_value(json_array_get(jt, i));
        char *lbuf = NULL, *hbuf = NULL;
        size_t ll, hl;
        npy_array la, ha;
        char lp[800], hp[800];
        snprintf(lp, sizeof lp, "%s/%s", dir, lf);
        snprintf(hp, sizeof hp, "%s/%s", dir, hf);
        if (file_read_all(lp, (size_t)1 << 31, &lbuf, &ll, err, sizeof err) ||
            npy_parse_f32(lbuf, ll, &la, err, sizeof err) ||
            file_read_all(hp, (size_t)1 << 31, &hbuf, &hl, err, sizeof err) ||
            npy_parse_f32(hbuf, hl, &ha, err, sizeof err)) {
            test_fail(__FILE__, __LINE__, "%s", err);
            free(x), free(lbuf), free(hbuf);
            break;
        }
        CHECK_MSG(la.ndim == 2 && la.shape[0] == T - 1 && la.shape[1] == V,
                  "%s: shape [%lld, %lld], want [%d, %d]", lf, (long long)la.shape[0], (long long)la.shape[1],
                  T - 1, V);
        CHECK_MSG(ha.ndim == 2 && ha.shape[0] == T && ha.shape[1] == H,
                  "%s: shape [%lld, %lld], want [%d, %d]", hf, (long long)ha.shape[0], (long long)ha.shape[1],
                  T, H);
        if (la.numel != (int64_t)(T - 1) * V || ha.numel != (int64_t)T * H) {
            free(x), free(lbuf), free(hbuf);
            break;
        }
        cinfer_ctx *c = open_ctx(cm, T + 8);
        float *hid = malloc(sizeof(float) * T * H), *lg = malloc(sizeof(float) * T * V),
              *ml = malloc(sizeof(float) * T * V);
        int s = c ? target_hidden(c, x, T, hid, lg) : -1;
        if (s >= 0) {
            /* hidden: relative to the reference's spread */
            double sh = 0, s2 = 0, wh = 0;
            for (int64_t i = 0; i < ha.numel; i++) sh += ha.data[i], s2 += (double)ha.data[i] * ha.data[i];
            double sdh = sqrt(s2 / ha.numel - (sh / ha.numel) * (sh / ha.numel));
            for (int64_t i = 0; i < ha.numel; i++) wh = fmax(wh, fabs(hid[i] - ha.data[i]));
            /* the head on our hidden (end to end), and on the oracle's hidden (the head alone) */
            double sl = 0, sl2 = 0, w_ours = 0, w_theirs = 0;
            for (int64_t i = 0; i < la.numel; i++) sl += la.data[i], sl2 += (double)la.data[i] * la.data[i];
            double sdl = sqrt(sl2 / la.numel - (sl / la.numel) * (sl / la.numel));
            ctx_mtp_entry me = {s, 0, x + 1, hid, T - 1, NULL, 2};
            if (ctx_mtp_forward(c, &me, 1, ml, err, sizeof err) == 0)
                for (int64_t i = 0; i < la.numel; i++) w_ours = fmax(w_ours, fabs(ml[i] - la.data[i]));
            else
                test_fail(__FILE__, __LINE__, "%s", err);
            int agree = 0;
            for (int t = 0; t < T - 1; t++) {
                int a = 0, b = 0;
                for (int v = 1; v < V; v++) {
                    if (ml[(size_t)t * V + v] > ml[(size_t)t * V + a]) a = v;
                    if (la.data[(size_t)t * V + v] > la.data[(size_t)t * V + b]) b = v;
                }
                agree += a == b;
            }
            ctx_mtp_entry me2 = {s, 0, x + 1, ha.data, T - 1, NULL, 2};
            if (ctx_mtp_forward(c, &me2, 1, ml, err, sizeof err) == 0)
                for (int64_t i = 0; i < la.numel; i++) w_theirs = fmax(w_theirs, fabs(ml[i] - la.data[i]));
            printf("     mtp oracle case %zu (T=%d): hidden %.3g x std; MTP logits %.3g x std (our hidden), "
                   "%.3g x std "
                   "(oracle hidden); argmax agrees %d/%d\n",
                   ci, T, wh / sdh, w_ours / sdl, w_theirs / sdl, agree, T - 1);
            CHECK_MSG(wh / sdh <= 1e-4, "case %zu: final-normed hidden vs oracle %.3g x std", ci, wh / sdh);
            CHECK_MSG(w_theirs / sdl <= 1e-4, "case %zu: MTP logits on the oracle's hidden %.3g x std", ci,
                      w_theirs / sdl);
            CHECK_MSG(w_ours / sdl <= 1e-4, "case %zu: MTP logits end to end %.3g x std", ci, w_ours / sdl);
            CHECK_MSG(agree == T - 1,
                      "case %zu: the head's argmax differs from the oracle's at %d of %d rows", ci,
                      T - 1 - agree, T - 1);
            n_cases++;
        }
        free(hid), free(lg), free(ml), free(x), free(lbuf), free(hbuf);
        cinfer_ctx_destroy(c);
    }
    CHECK(n_cases > 0);
    json_decref(cases);
    json_decref(root);
    cinfer_model_close(cm);
}

/* ---- the engine's --spec mtp ---- */

#include "runtime/engine_internal.h"

enum { ENR = 16, EMAXP = 64, EMAXG = 40 }; /* issue 6: a batch of 16 mixed requests */

typedef struct erun {
    int32_t prompts[ENR][EMAXP];
    int lens[ENR], gens[ENR];
    float temps[ENR];
    int32_t out[ENR][EMAXG];
    int n_out[ENR];
    int first_draft[ENR]
                   [EMAXP + EMAXG]; /* the head's first draft when the sequence held L tokens (-1: none) */
    int V;                          /* vocabulary of the model */
    int corrupt;                    /* replace drafts with the plain output, one position corrupted */
    int32_t (*plain)[EMAXG];
    int calls;
} erun;

static int find_req(erun *r, const int32_t *hist, int n_hist) {
    for (int i = 0; i < ENR; i++)
        if (n_hist >= r->lens[i] && !memcmp(hist, r->prompts[i], sizeof(int32_t) * (size_t)r->lens[i]))
            return i;
    return -1;
}

/* Sees the head's drafts (out holds them); records the first, and in corrupt mode replaces them with the
 * plain output with one position wrong (cycling), so every acceptance count happens while the head still
 * runs. */
static int mtp_hook(void *ud, const int32_t *hist, int n_hist, int32_t *out, int k) {
    erun *r = ud;
    int i = find_req(r, hist, n_hist);
    if (i < 0) return 0;
    r->first_draft[i][n_hist] = out[0];
    if (!r->corrupt) return k;
    int g = n_hist - r->lens[i], bad = r->calls++ % (k + 1), cnt = 0;
    while (cnt < k && g + cnt < r->gens[i]) {
        int32_t t = r->plain[i][g + cnt];
        out[cnt] = cnt == bad ? (t + 1) % r->V : t;
        cnt++;
    }
    return cnt;
}

static void engine_run(cinfer_model *cm, cinfer_spec_mode spec, erun *r, int hook, int prefix, int mtp_vocab,
                       cinfer_engine_stats *st) {
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.max_seqs = ENR;
    ep.ctx_size = 160;
    ep.step_tokens = 96;
    ep.n_threads = 2;
    ep.spec = spec;
    ep.spec_max_draft = 3;
    ep.prefix_cache_memory = prefix ? 64 << 20 : 0;
    ep.spec_mtp_vocab = mtp_vocab;
    cinfer_engine *e;
    char err[512];
    if (cinfer_engine_create(cm, &ep, &e, err, sizeof err)) {
        test_fail(__FILE__, __LINE__, "%s", err);
        return;
    }
    if (hook) engine_set_drafter(e, mtp_hook, r);
    cinfer_request *rq[ENR];
    /* with the prefix cache, the batch runs twice: the second round resumes each prompt from its snapshot */
    for (int round = 0; round < (prefix ? 2 : 1); round++) {
        for (int i = 0; i < ENR; i++) {
            cinfer_request_params rp;
            memset(&rp, 0, sizeof rp);
            rp.prompt = r->prompts[i];
            rp.n_prompt = r->lens[i];
            rp.max_tokens = r->gens[i];
            rp.sampling = cinfer_sampling_default();
            rp.sampling.temperature = r->temps[i];
            rp.sampling.has_seed = 1;
            rp.sampling.seed = 31 + (uint64_t)i;
            rp.sampling.n_logprobs = 0;
            rp.ignore_eos = 1;
            if (cinfer_engine_submit(e, &rp, &rq[i], err, sizeof err))
                test_fail(__FILE__, __LINE__, "%s", err);
        }
        for (int i = 0; i < ENR; i++) {
            cinfer_event ev;
            r->n_out[i] = 0;
            while (cinfer_request_next(rq[i], &ev, 30000) == 1)
                if (ev.type == CINFER_EV_LOGPROB && r->n_out[i] < EMAXG) r->out[i][r->n_out[i]++] = ev.token;
            cinfer_request_free(rq[i]);
        }
    }
    cinfer_engine_get_stats(e, st);
    cinfer_engine_destroy(e);
}

/* --spec mtp on a checkpoint with a head: 16 mixed requests at once, greedy and seeded, prompts that
 * end mid-chunk, windows that hit max_tokens — the output is the plain output token for token; the head's
 * first draft at every step is the argmax of its teacher-forced logits over the final sequence (so the engine
 * pairs tokens, hidden rows and positions right, and rewrites rejected rows); with drafts forced to the plain
 * output (one wrong position, cycling) every acceptance count happens and the output is still exact; with the
 * prefix cache the second run resumes mid-prompt and stays exact. */
static void check_engine_mtp(cinfer_model *cm) {
    char err[512];
    const model *m = cinfer_model_internal(cm);
    static erun plain, spec, forced, cached, narrow;
    memset(&plain, 0, sizeof plain);
    plain.V = m->V;
    for (int i = 0; i < ENR; i++) {
        plain.lens[i] = 3 + (i * 23) % 60;
        make_tokens(plain.prompts[i], plain.lens[i], 700 + i, m->V);
        plain.gens[i] = 8 + (i * 11) % 32;
        plain.temps[i] = i % 4 == 1 ? 0.9f : 0.0f;
    }
    cinfer_engine_stats s0, s1, s2, s3, s4;
    engine_run(cm, CINFER_SPEC_NONE, &plain, 0, 0, 0, &s0);
    spec = plain, forced = plain, cached = plain, narrow = plain;
    memset(spec.first_draft, 0xff, sizeof spec.first_draft);
    memset(narrow.first_draft, 0xff, sizeof narrow.first_draft);
    engine_run(cm, CINFER_SPEC_MTP, &spec, 1, 0, 0, &s1);
    forced.corrupt = 1;
    forced.plain = plain.out;
    engine_run(cm, CINFER_SPEC_MTP, &forced, 1, 0, 0, &s2);
    engine_run(cm, CINFER_SPEC_MTP, &cached, 0, 1, 0, &s3);
    const int NARROW = m->V * 2 / 5; /* spec_mtp_vocab: drafts among the first 40% of the ids */
    engine_run(cm, CINFER_SPEC_MTP, &narrow, 1, 0, NARROW, &s4);
    for (int i = 0; i < ENR; i++) {
        CHECK_EQ_INT(plain.n_out[i], plain.gens[i]);
        CHECK_MSG(spec.n_out[i] == plain.n_out[i] &&
                      !memcmp(spec.out[i], plain.out[i], sizeof(int32_t) * plain.gens[i]),
                  "request %d (temp %.1f): --spec mtp changed the output", i, plain.temps[i]);
        CHECK_MSG(forced.n_out[i] == plain.n_out[i] &&
                      !memcmp(forced.out[i], plain.out[i], sizeof(int32_t) * plain.gens[i]),
                  "request %d (temp %.1f): forced drafts with the head running changed the output", i,
                  plain.temps[i]);
        CHECK_MSG(cached.n_out[i] == plain.n_out[i] &&
                      !memcmp(cached.out[i], plain.out[i], sizeof(int32_t) * plain.gens[i]),
                  "request %d (temp %.1f): --spec mtp with the prefix cache changed the output", i,
                  plain.temps[i]);
        CHECK_MSG(narrow.n_out[i] == plain.n_out[i] &&
                      !memcmp(narrow.out[i], plain.out[i], sizeof(int32_t) * plain.gens[i]),
                  "request %d (temp %.1f): --spec mtp with a draft vocabulary changed the output", i,
                  plain.temps[i]);
    }
    printf("     mtp: %lld drafted, %lld accepted; forced: %lld drafted, %lld accepted, steps %lld -> %lld\n",
           (long long)s1.spec_drafted, (long long)s1.spec_accepted, (long long)s2.spec_drafted,
           (long long)s2.spec_accepted, (long long)s0.steps_total, (long long)s2.steps_total);
    CHECK(s1.spec_drafted > 0);
    CHECK(s2.spec_accepted > s2.spec_drafted / 4);
    CHECK(s2.steps_total < s0.steps_total);
    CHECK_EQ_INT(s1.kv_blocks_used, 0);
    CHECK_EQ_INT(s2.slots_used, 0);
    CHECK_MSG(s3.prefix_hits >= ENR, "prefix hits %lld: the second round did not resume",
              (long long)s3.prefix_hits);
    /* the head's first drafts against its teacher-forced argmax over each final sequence */
    cinfer_ctx *c = open_ctx(cm, EMAXP + EMAXG + 8);
    REQUIRE(c);
    int V = m->V, H = m->H, checked = 0, differ = 0, close_calls = 0, n_checked = 0, n_differ = 0;
    float *hid = malloc(sizeof(float) * (EMAXP + EMAXG) * H),
          *lg = malloc(sizeof(float) * (EMAXP + EMAXG) * V);
    float *ml = malloc(sizeof(float) * (EMAXP + EMAXG) * V);
    for (int i = 0; i < ENR; i++) {
        int32_t x[EMAXP + EMAXG];
        int n = plain.lens[i] + plain.gens[i];
        memcpy(x, plain.prompts[i], sizeof(int32_t) * plain.lens[i]);
        memcpy(x + plain.lens[i], plain.out[i], sizeof(int32_t) * plain.gens[i]);
        int s = target_hidden(c, x, n, hid, lg);
        REQUIRE(s >= 0);
        ctx_mtp_entry me = {s, 0, x + 1, hid, n - 1, NULL, 2};
        REQUIRE(ctx_mtp_forward(c, &me, 1, ml, err, sizeof err) == 0);
        for (int L = 2; L <= n; L++) {
            /* the narrow run's drafts: the argmax over ids [0, NARROW) */
            int dn = narrow.first_draft[i][L];
            if (dn >= 0) {
                const float *nrow = ml + (size_t)(L - 2) * V;
                int a = 0;
                for (int v = 1; v < NARROW; v++)
                    if (nrow[v] > nrow[a]) a = v;
                n_checked++;
                n_differ += dn != a && (dn >= NARROW || nrow[a] - nrow[dn] >= 1e-3f * fabsf(nrow[a]));
            }
            int d = spec.first_draft[i][L];
            if (d < 0) continue;
            const float *row = ml + (size_t)(L - 2) * V; /* row L-2 pairs x[L-1] with hidden L-2 */
            int a = 0;
            for (int v = 1; v < V; v++)
                if (row[v] > row[a]) a = v;
            checked++;
            if (d != a) {
                /* the engine's hidden rows come from other chunkings (decode steps, verify windows): bits may
                 * differ, so only a near tie may flip */
                differ++;
                close_calls += row[a] - row[d] < 1e-3f * fabsf(row[a]);
            }
        }
        cinfer_seq_close(c, s);
    }
    printf("     mtp first drafts: %d checked against the teacher-forced head, %d differ (%d near ties)\n",
           checked, differ, close_calls);
    CHECK(checked > 50);
    CHECK_EQ_INT(differ, close_calls);
    CHECK(n_checked > 50);
    CHECK_EQ_INT(n_differ, 0);
    free(hid), free(lg), free(ml);
    cinfer_ctx_destroy(c);
}

TEST(engine_mtp_speculation_is_exact) {
    cinfer_model *cm;
    char err[512];
    REQUIRE(cinfer_model_open(DENSE, &cm, err, sizeof err) == 0);
    check_engine_mtp(cm);
    cinfer_model_close(cm);
}

/* The same on models/default once it is the trained model with its MTP head. */
TEST(engine_mtp_default_model_is_exact) {
    cinfer_model *cm;
    char err[512];
    REQUIRE(cinfer_model_open("models/default", &cm, err, sizeof err) == 0);
    cinfer_model_info info;
    cinfer_model_get_info(cm, &info);
    if (!info.has_mtp) {
        cinfer_model_close(cm);
        SKIP("models/default has no MTP head (the random default model; the trained one carries mtp.*)");
    }
    check_engine_mtp(cm);
    cinfer_model_close(cm);
}

/* A speculative round with the head (verify window with hidden rows, commit, the head's catch-up rows and a
 * chained row) allocates nothing: the head's pool and scratch were sized at ctx_mtp_init. */
TEST(mtp_round_does_not_allocate) {
    cinfer_model *cm;
    char err[512];
    REQUIRE(cinfer_model_open(DENSE, &cm, err, sizeof err) == 0);
    const model *m = cinfer_model_internal(cm);
    cinfer_ctx_params p = cinfer_ctx_default_params();
    p.max_seqs = 2;
    p.max_ctx = 96;
    p.max_batch = 96;
    p.n_threads = 2;
    p.spec_window = 4;
    cinfer_ctx *c = NULL;
    REQUIRE(cinfer_ctx_create(cm, &p, &c, err, sizeof err) == 0);
    REQUIRE(ctx_mtp_init(c, 0, err, sizeof err) == 0);
    int32_t x[96];
    make_tokens(x, 96, 5, m->V);
    float *hid = malloc(sizeof(float) * 96 * m->H), *lg = malloc(sizeof(float) * 96 * m->V);
    int s = target_hidden(c, x, 20, hid, lg);
    REQUIRE(s >= 0);
    ctx_mtp_entry pre = {s, 0, x + 1, hid, 19, hid, 1};
    REQUIRE(ctx_mtp_forward(c, &pre, 1, lg, err, sizeof err) == 0);
    int rc = 0, len = 20;
    alloc_guard_arm(1);
    long before = alloc_count();
    alloc_guard_begin();
    for (int i = 0; i < 6 && !rc; i++) {
        cinfer_batch_entry w = {s, x + len - 1, 4, 1, 1, hid};
        rc = cinfer_forward(c, &w, 1, lg, err, sizeof err);
        int keep = 1 + i % 4;
        if (!rc) rc = cinfer_seq_commit(c, s, keep, err, sizeof err);
        ctx_mtp_entry cu = {s, len - 1, x + len, hid, keep, hid, 1};
        if (!rc) rc = ctx_mtp_forward(c, &cu, 1, lg, err, sizeof err);
        ctx_mtp_entry ch = {s, len - 1 + keep, x + len + keep, hid + (size_t)(keep - 1) * m->H, 1, hid, 1};
        if (!rc) rc = ctx_mtp_forward(c, &ch, 1, lg, err, sizeof err);
        len += keep;
    }
    alloc_guard_end();
    alloc_guard_arm(0);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK_EQ_INT(alloc_count(), before);
    free(hid), free(lg);
    cinfer_ctx_destroy(c);
    cinfer_model_close(cm);
}

#include "unit/tiny_model.h"

/* The head on the other architectures (tiny random checkpoints with an mtp.* head): MoE with fused experts,
 * MoE with per-expert tensors, Qwen3-Next. Its rows fed one by one equal one batch bit for bit, and --spec
 * mtp (the head's own drafts, and forced drafts with the head running) gives exactly the plain output. */
TEST(mtp_moe_and_next_heads_are_exact) {
    static const int archs[3] = {2, 4, 3};
    for (int a = 0; a < 3; a++) {
        tiny_opts o = tiny_default(archs[a]);
        o.mtp = 1;
        o.seed = 300 + (uint64_t)a;
        char dir[600], err[512];
        snprintf(dir, sizeof dir, "%s/mtp_arch%d", test_tmpdir(), archs[a]);
        REQUIRE(tiny_write(dir, &o) == 0);
        cinfer_model *cm;
        if (cinfer_model_open(dir, &cm, err, sizeof err)) {
            test_fail(__FILE__, __LINE__, "arch %d: %s", archs[a], err);
            continue;
        }
        const model *m = cinfer_model_internal(cm);
        CHECK(m->mtp.present && m->mtp.layer.moe == (archs[a] != 1));
        enum { N = 30 };
        int V = m->V, H = m->H;
        int32_t x[N];
        make_tokens(x, N, 11 + (uint64_t)a, V);
        cinfer_ctx *c = open_ctx(cm, 64);
        REQUIRE(c);
        float *hid = malloc(sizeof(float) * N * H), *lg = malloc(sizeof(float) * N * V),
              *ml = malloc(sizeof(float) * N * V);
        float *row = malloc(sizeof(float) * V);
        int s = target_hidden(c, x, N, hid, lg), s2 = cinfer_seq_open(c, err, sizeof err);
        REQUIRE(s >= 0 && s2 >= 0);
        ctx_mtp_entry all = {s, 0, x + 1, hid, N - 1, NULL, 2};
        REQUIRE(ctx_mtp_forward(c, &all, 1, ml, err, sizeof err) == 0);
        int mism = 0;
        for (int t = 0; t < N - 1; t++) {
            ctx_mtp_entry e1 = {s2, t, x + t + 1, hid + (size_t)t * H, 1, NULL, 1};
            REQUIRE(ctx_mtp_forward(c, &e1, 1, row, err, sizeof err) == 0);
            mism += memcmp(row, ml + (size_t)t * V, sizeof(float) * V) != 0;
        }
        CHECK_MSG(mism == 0, "arch %d: %d head rows differ fed one by one", archs[a], mism);
        free(hid), free(lg), free(ml), free(row);
        cinfer_ctx_destroy(c);
        static erun plain, spec, forced;
        memset(&plain, 0, sizeof plain);
        plain.V = V;
        for (int i = 0; i < ENR; i++) {
            plain.lens[i] = 2 + (i * 17) % 50;
            make_tokens(plain.prompts[i], plain.lens[i], 40 + (uint64_t)i, V);
            plain.gens[i] = 6 + (i * 7) % 30;
            plain.temps[i] = i % 3 == 2 ? 0.8f : 0.0f;
        }
        cinfer_engine_stats s0, s1, s3;
        engine_run(cm, CINFER_SPEC_NONE, &plain, 0, 0, 0, &s0);
        spec = plain, forced = plain;
        engine_run(cm, CINFER_SPEC_MTP, &spec, 0, 0, 0, &s1);
        forced.corrupt = 1;
        forced.plain = plain.out;
        engine_run(cm, CINFER_SPEC_MTP, &forced, 1, 0, 0, &s3);
        for (int i = 0; i < ENR; i++) {
            CHECK_MSG(spec.n_out[i] == plain.gens[i] &&
                          !memcmp(spec.out[i], plain.out[i], sizeof(int32_t) * plain.gens[i]),
                      "arch %d request %d: --spec mtp changed the output", archs[a], i);
            CHECK_MSG(forced.n_out[i] == plain.gens[i] &&
                          !memcmp(forced.out[i], plain.out[i], sizeof(int32_t) * plain.gens[i]),
                      "arch %d request %d: forced drafts with the head changed the output", archs[a], i);
        }
        CHECK(s1.spec_drafted > 0 && s3.spec_accepted > 0);
        printf("     arch %d: head drafts %lld, %lld accepted; forced %lld of %lld\n", archs[a],
               (long long)s1.spec_drafted, (long long)s1.spec_accepted, (long long)s3.spec_accepted,
               (long long)s3.spec_drafted);
        cinfer_model_close(cm);
    }
}

/* The head's pool is sized at init (the target pool's blocks plus one per sequence): when a sequence's rows
 * do not fit, the call fails with CINFER_ENOMEM having run nothing, the other sequences keep their rows, and
 * blocks given back by a closed sequence serve the next call. */
TEST(mtp_pool_exhaustion_is_an_error_not_a_crash) {
    cinfer_model *cm;
    char err[512];
    REQUIRE(cinfer_model_open(DENSE, &cm, err, sizeof err) == 0);
    const model *m = cinfer_model_internal(cm);
    cinfer_ctx_params p = cinfer_ctx_default_params();
    p.max_seqs = 2;
    p.max_ctx = 64; /* 4 blocks per sequence */
    p.max_batch = 64;
    p.n_threads = 2;
    p.kv_memory =
        (int64_t)4 * m->n_full * 2 * 16 * m->Hkv * m->hd * (int64_t)sizeof(float); /* 4 target blocks */
    cinfer_ctx *c = NULL;
    REQUIRE(cinfer_ctx_create(cm, &p, &c, err, sizeof err) == 0);
    REQUIRE(ctx_mtp_init(c, 0, err, sizeof err) == 0); /* 4 + 2 head blocks */
    int32_t x[64];
    make_tokens(x, 64, 77, m->V);
    float *hid = malloc(sizeof(float) * 64 * m->H), *lg = malloc(sizeof(float) * 64 * m->V);
    for (int i = 0; i < 64 * m->H; i++) hid[i] = (float)((i * 37) % 11) - 5.0f;
    int a = cinfer_seq_open(c, err, sizeof err), b = cinfer_seq_open(c, err, sizeof err);
    ctx_mtp_entry ea = {a, 0, x + 1, hid, 63, NULL, 1};
    REQUIRE(ctx_mtp_forward(c, &ea, 1, lg, err, sizeof err) == 0); /* 4 blocks */
    ctx_mtp_entry eb = {b, 0, x + 1, hid, 40, NULL, 1};            /* 3 more: only 2 left */
    CHECK_EQ_INT(ctx_mtp_forward(c, &eb, 1, lg, err, sizeof err), CINFER_ENOMEM);
    CHECK_EQ_INT(ctx_mtp_len(c, a), 63);
    CHECK_EQ_INT(ctx_mtp_len(c, b), 0);
    eb.n = 30; /* 2 blocks fit */
    CHECK_EQ_INT(ctx_mtp_forward(c, &eb, 1, lg, err, sizeof err), 0);
    CHECK_EQ_INT(ctx_mtp_len(c, b), 30);
    cinfer_seq_close(c, a);
    eb.pos = 30, eb.tokens = x + 31, eb.hidden = hid + 30 * m->H, eb.n = 33;
    CHECK_EQ_INT(ctx_mtp_forward(c, &eb, 1, lg, err, sizeof err), 0);
    CHECK_EQ_INT(ctx_mtp_len(c, b), 63);
    free(hid), free(lg);
    cinfer_ctx_destroy(c);
    cinfer_model_close(cm);
}

/* `cinfer generate --spec mtp` (and with a draft vocabulary, and seeded sampling) prints the plain ids. */
static int cli_ids(const char *args, char *line, size_t cap) {
    const char *bin = getenv("CINFER_BIN");
    if (!bin) bin = "build/cinfer";
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "%s generate -m %s --tokens 5,77,301,9,42,42,7,260,11 -n 40 --ids --ignore-eos %s 2>/dev/null",
             bin, DENSE, args);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    if (!fgets(line, (int)cap, p)) line[0] = 0;
    line[strcspn(line, "\n")] = 0;
    return pclose(p);
}

TEST(mtp_through_cli) {
    static const char *const modes[][2] = {
        {"", "--spec mtp"},
        {"", "--spec mtp --spec-draft 1 --spec-mtp-vocab 100"},
        {"--temp 0.9 --seed 3", "--temp 0.9 --seed 3 --spec mtp --spec-draft 2"}};
    for (int i = 0; i < 3; i++) {
        char a[4096], b[4096];
        CHECK_EQ_INT(cli_ids(modes[i][0], a, sizeof a), 0);
        CHECK_EQ_INT(cli_ids(modes[i][1], b, sizeof b), 0);
        CHECK_MSG(strlen(a) > 40 && !strcmp(a, b), "generate %s: \"%s\" vs plain \"%s\"", modes[i][1], b, a);
    }
}

/* Runs `cinfer bench ARGS` (stdout and stderr into out); returns its exit status, -1 when it did not exit. */
static int bench_cli(const char *args, char *out, size_t cap) {
    const char *bin = getenv("CINFER_BIN");
    if (!bin) bin = "build/cinfer";
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s bench %s 2>&1", bin, args);
    out[0] = 0;
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* `bench --spec mtp` on a checkpoint without an MTP head: the speculative engine cannot be made, so the bench
 * must say why and exit 1 — it printed a "speedup" from uninitialised step counts before */
TEST(mtp_bench_without_head_fails_cleanly) {
    char out[8192];
    int rc =
        bench_cli("-m tests/fixtures/qwen35_moe --spec mtp --spec-accept 0.7 -n 8 -p 8", out, sizeof out);
    CHECK_MSG(rc == 1, "exit status %d, output: %s", rc, out);
    CHECK_MSG(strstr(out, "no mtp.* tensors") != NULL, "no reason given: %s", out);
    CHECK_MSG(strstr(out, "speedup") == NULL, "figures printed after the failure: %s", out);
}

/* `bench --spec draft` without --draft-model: the target drafts for itself, so every greedy draft holds and
 * the output is the plain run's; with --spec-accept the draft model's steps still run and forced drafts
 * replace its tokens (some wrong: the draft rewinds to what it read and the target kept alike), the output
 * still the plain run's; a --draft-model that cannot be opened stops with its reason, exit 1 */
TEST(bench_self_draft_measures_and_forces_acceptance) {
    char out[8192];
    int rc = bench_cli("-m " DENSE " --spec draft -n 12 -p 8 --batch 2", out, sizeof out);
    CHECK_MSG(rc == 0, "exit status %d, output: %s", rc, out);
    CHECK_MSG(strstr(out, "self-draft") != NULL, "no self-draft line: %s", out);
    CHECK_MSG(strstr(out, "measured acceptance 1.000") != NULL, "greedy self-drafts did not all hold: %s",
              out);
    CHECK_MSG(strstr(out, "outputs identical") != NULL, "speculative output differs: %s", out);
    rc = bench_cli("-m " DENSE " --spec draft --spec-accept 0.5 -n 24 -p 8 --batch 2", out, sizeof out);
    CHECK_MSG(rc == 0, "exit status %d, output: %s", rc, out);
    CHECK_MSG(strstr(out, "self-draft running, forced acceptance 0.50") != NULL, "no forced line: %s", out);
    CHECK_MSG(strstr(out, "outputs identical") != NULL, "speculative output differs: %s", out);
    const char *a = strstr(out, "measured acceptance ");
    double acc = a ? atof(a + strlen("measured acceptance ")) : -1;
    CHECK_MSG(acc > 0.2 && acc < 0.8, "forced acceptance 0.5 measured %.3f: %s", acc, out);
    rc = bench_cli("-m " DENSE " --spec draft --draft-model /nonexistent-dir -n 8 -p 8", out, sizeof out);
    CHECK_MSG(rc == 1, "exit status %d, output: %s", rc, out);
    CHECK_MSG(strstr(out, "--draft-model") != NULL, "no reason given: %s", out);
}

/* test_cuda_attn_pre.c — the fused decode attention kernel with the RoPE's cos / sin computed before its PDL
 * wait (cu_set_attn_dec_pre, CINFER_CUDA_ATTN_PRE): against an f64 CPU reference (within 1e-5), fused against
 * unfused (attn_prep_kernel's norm_rope_warp) bit for bit (outputs and pools), and every row alone against
 * its bits in a batch whose rows take both attn_kernel (below dec_p) and attn_dec_kernel. GPU only: skips
 * without a CUDA build or device. */
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

static uint64_t g_rng = 0x2545f4914f6cdd1dull;
static float frand(void) { /* [-1, 1) */
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}
static float *rnd(size_t n, float scale) {
    float *p = malloc(n * sizeof(float) + 16);
    for (size_t i = 0; i < n; i++) p[i] = frand() * scale;
    return p;
}
/* ||got - ref|| / ||ref||; any NaN or inf in got gives +inf */
static double rel(const float *got, const float *ref, size_t n) {
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) return INFINITY;
        double e = (double)got[i] - ref[i];
        d += e * e, r += (double)ref[i] * ref[i];
    }
    return r > 0 ? sqrt(d / r) : sqrt(d);
}
static void *dup_dev(const void *h, size_t bytes) {
    void *d = NULL;
    char err[256];
    if (cu_alloc(&d, bytes, err, sizeof err) || cu_upload(d, h, bytes, err, sizeof err)) return NULL;
    return d;
}
static float *get(const float *d, size_t n) {
    float *h = malloc(n * sizeof(float) + 16);
    char err[256];
    if (cu_download(h, d, n * sizeof(float), err, sizeof err)) memset(h, 0xff, n * sizeof(float)); /* NaN */
    return h;
}
static int same_bits(const float *a, const float *b, size_t n, size_t *first) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(a + i, b + i, 4)) {
            *first = i;
            return 0;
        }
    return 1;
}
static void rope_ref(float *x, int R, int pos, const float *inv) {
    for (int i = 0; i < R / 2; i++) {
        float ang = (float)pos * inv[i], cs = cosf(ang), sn = sinf(ang), p = x[i], q = x[i + R / 2];
        x[i] = p * cs - q * sn;
        x[i + R / 2] = q * cs + p * sn;
    }
}

#define NSMAX 64 /* the dec kernel's spans at most (forward_cuda's default) */

/* forward_cuda's attn_split for rows at minpos..maxpos: the classes (attn_kernel below P, attn_dec_kernel at
 * or past it) and each kernel's grid */
static void grids(cu_attn_args *a, int minpos, int maxpos, int P) {
    a->dec_nsmax = NSMAX, a->dec_p = P;
    a->dec_cls = (minpos < P) | (maxpos >= P) << 1;
    a->dec_nsplit = maxpos >= P ? cu_attn_dec_grid(maxpos, NSMAX) : 0;
    a->dec_span = (maxpos + CU_ATTN_DEC_CH) / CU_ATTN_DEC_CH <= NSMAX ? CU_ATTN_DEC_CH : 2 * CU_ATTN_DEC_CH;
    a->span = 64, a->nsplit = minpos < P ? cu_attn_row_grid(maxpos < P - 1 ? maxpos : P - 1) : 0;
}

/* decode rows of entries with lens[i] earlier positions (noise in the pool), `steps` steps, rows at P or past
 * by attn_dec_kernel (hs q heads a block when fused): unfused (whole groups a block) on one copy of the
 * pools, fused with the cos / sin before the wait on another, bitwise; each row alone (fused, the launch's
 * own heads a block) against its bits in the batch; the CPU within 1e-5 */
static void pre_case(int Hq, int Hkv, int hd, const int *lens, int NE, int steps, int P, int hs) {
    char err[256];
    cu_ctx *c;
    REQUIRE(cu_ctx_create(&c, err, sizeof err) == 0);
    if (!cu_attn_dec_init(Hq, Hkv, hd, NSMAX)) {
        CHECK_MSG(0, "attn_dec_kernel does not serve Hq %d Hkv %d hd %d", Hq, Hkv, hd);
        cu_ctx_destroy(c);
        return;
    }
    int n_full = 2, full = 1, R = hd / 4, kvd = Hkv * hd, ld = Hq * 2 * hd + 2 * kvd + 5, n_blocks = 64,
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
    float *dkp[2] = {dup_dev(kp, pool_n * 4), dup_dev(kp, pool_n * 4)};
    float *dvp[2] = {dup_dev(vp, pool_n * 4), dup_dev(vp, pool_n * 4)};
    float *dqn = dup_dev(qn, (size_t)hd * 4), *dkn = dup_dev(kn, (size_t)hd * 4);
    float *dinv = dup_dev(inv, (size_t)R / 2 * 4);
    unsigned *cnt = NULL;
    REQUIRE(cu_alloc((void **)&cnt, (size_t)NE * Hq * sizeof(unsigned), err, sizeof err) == 0);
    cu_fill_f32(c, (float *)cnt, (size_t)NE * Hq, 0.0f);
    int maxlen = 0, minlen = lens[0], n_alone = 0, alone_same = 1;
    for (int i = 0; i < NE; i++) maxlen = lens[i] > maxlen ? lens[i] : maxlen;
    for (int i = 0; i < NE; i++) minlen = lens[i] < minlen ? lens[i] : minlen;
    size_t no = (size_t)NE * Hq * hd, np = (size_t)NE * Hq * (NSMAX + CU_ATTN_ROW_NS + 16) * (hd + 4);
    float *o_r = malloc(no * 4), *q = malloc((size_t)hd * 4);
    double worst = 0;
#define KROW(Pl, i, pos) (Pl + (((size_t)full * n_blocks + tables[i][(pos) / 16]) * 16 + (pos) % 16) * kvd)
    for (int s = 0; s < steps; s++) {
        int maxpos = maxlen + s, minpos = minlen + s;
        float *qkv = rnd((size_t)NE * ld, 1.0f);
        for (int i = 0; i < NE; i++) { /* CPU: the row's k and v into the pools, then attention in f64 */
            int pos = lens[i] + s;
            const float *row = qkv + (size_t)i * ld;
            for (int h = 0; h < Hkv; h++) {
                float *k = KROW(kp, i, pos) + (size_t)h * hd;
                ops_rmsnorm(k, row + (size_t)Hq * 2 * hd + (size_t)h * hd, kn, hd, eps);
                rope_ref(k, R, pos, inv);
            }
            memcpy(KROW(vp, i, pos), row + (size_t)Hq * 2 * hd + kvd, (size_t)kvd * 4);
            double *sc = malloc((size_t)(pos + 1) * sizeof(double));
            for (int h = 0; h < Hq; h++) {
                int kvh = h / (Hq / Hkv);
                ops_rmsnorm(q, row + (size_t)h * 2 * hd, qn, hd, eps);
                rope_ref(q, R, pos, inv);
                const float *gate = row + (size_t)h * 2 * hd + hd;
                double mx = -1e300, sum = 0;
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
            }
            free(sc);
        }
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
        float *out[2];
        for (int pass = 0; pass < 2; pass++) { /* 0 unfused, 1 fused */
            cu_attn_args a = {0};
            a.T = NE, a.Hq = Hq, a.Hkv = Hkv, a.hd = hd, a.rope_dim = R, a.n_blocks = n_blocks, a.full = full;
            a.qkv = dup_dev(qkv, (size_t)NE * ld * 4), a.ld = ld, a.q_norm = dqn, a.k_norm = dkn;
            a.inv_freq = dinv, a.kpool = dkp[pass], a.vpool = dvp[pass], a.eps = eps, a.meta = meta;
            a.dec_cnt = pass ? cnt : NULL, a.dec_hs = pass ? hs : 0;
            grids(&a, minpos, maxpos, P);
            cu_alloc((void **)&a.o, no * 4, err, sizeof err);
            cu_alloc((void **)&a.part, np * 4, err, sizeof err);
            cu_alloc((void **)&a.dec_part, np * 4, err, sizeof err);
            cu_fill_f32(c, a.o, no, NAN), cu_fill_f32(c, a.part, np, NAN),
                cu_fill_f32(c, a.dec_part, np, NAN);
            cu_attn_layer(c, &a);
            if (cu_sync(c, err, sizeof err)) test_fail(__FILE__, __LINE__, "cu_attn_layer: %s", err);
            out[pass] = get(a.o, no);
            cu_free(a.qkv), cu_free(a.o), cu_free(a.part), cu_free(a.dec_part);
        }
        size_t at = 0;
        CHECK_MSG(same_bits(out[1], out[0], no, &at),
                  "pre hd=%d step %d: fused vs unfused differ at %zu (row %zu): %.9g vs %.9g", hd, s, at,
                  at / ((size_t)Hq * hd), out[1][at], out[0][at]);
        double r = rel(out[1], o_r, no);
        worst = r > worst ? r : worst;
        CHECK_MSG(r <= 1e-5, "pre hd=%d step %d: vs cpu %.3g", hd, s, r);
        for (int i = 0; i < NE; i++) { /* each row alone: its own class, grids and heads a block */
            int pos = lens[i] + s, k = (lens[i] + s + 16) / 16, *h1 = calloc(16 + (size_t)k, sizeof(int));
            h1[1] = pos, h1[2] = 0, h1[3] = pos, h1[4] = 1, h1[8] = 0;
            for (int j = 0; j < k; j++) h1[10 + j] = tables[i][j];
            int *d1 = dup_dev(h1, (10 + (size_t)k) * sizeof(int));
            cu_attn_args a = {0};
            a.T = 1, a.Hq = Hq, a.Hkv = Hkv, a.hd = hd, a.rope_dim = R, a.n_blocks = n_blocks, a.full = full;
            a.qkv = dup_dev(qkv + (size_t)i * ld, (size_t)ld * 4), a.ld = ld, a.q_norm = dqn, a.k_norm = dkn;
            a.inv_freq = dinv, a.kpool = dkp[1], a.vpool = dvp[1], a.eps = eps;
            a.meta = (cu_meta){d1,     d1 + 1, d1 + 2, d1 + 3,  d1 + 4, d1 + 5,
                               d1 + 6, d1 + 7, d1 + 8, d1 + 10, d1 + 9, NULL};
            a.dec_cnt = cnt, a.dec_hs = -1;
            grids(&a, pos, pos, P);
            cu_alloc((void **)&a.o, (size_t)Hq * hd * 4, err, sizeof err);
            cu_alloc((void **)&a.part, np * 4, err, sizeof err);
            cu_alloc((void **)&a.dec_part, np * 4, err, sizeof err);
            cu_fill_f32(c, a.o, (size_t)Hq * hd, NAN);
            cu_attn_layer(c, &a);
            if (cu_sync(c, err, sizeof err)) test_fail(__FILE__, __LINE__, "cu_attn_layer: %s", err);
            float *g1 = get(a.o, (size_t)Hq * hd);
            size_t at1 = 0;
            int same = same_bits(g1, out[1] + (size_t)i * Hq * hd, (size_t)Hq * hd, &at1);
            CHECK_MSG(same, "pre hd=%d step %d: row %d (position %d) alone differs at %zu", hd, s, i, pos,
                      at1);
            alone_same &= same, n_alone++;
            free(g1), free(h1);
            cu_free(d1), cu_free(a.qkv), cu_free(a.o), cu_free(a.part), cu_free(a.dec_part);
        }
        free(out[0]), free(out[1]), free(hm), free(qkv);
        cu_free(dm);
    }
    float *ku = get(dkp[0], pool_n), *kf = get(dkp[1], pool_n), *vu = get(dvp[0], pool_n),
          *vf = get(dvp[1], pool_n);
    size_t at = 0;
    CHECK_MSG(same_bits(kf, ku, pool_n, &at), "pre hd=%d: K pools differ at %zu", hd, at);
    CHECK_MSG(same_bits(vf, vu, pool_n, &at), "pre hd=%d: V pools differ at %zu", hd, at);
    double rk = rel(kf, kp, pool_n);
    CHECK_MSG(rk <= 1e-5 && !memcmp(vf, vp, pool_n * 4), "pre hd=%d: pools vs cpu %.3g", hd, rk);
    unsigned *hc = malloc((size_t)NE * Hq * sizeof(unsigned));
    REQUIRE(cu_download(hc, cnt, (size_t)NE * Hq * sizeof(unsigned), err, sizeof err) == 0);
    int zero = 1;
    for (int i = 0; i < NE * Hq; i++) zero &= hc[i] == 0;
    CHECK_MSG(zero, "pre hd=%d: the dec kernel's counters were not set back to 0", hd);
    printf("     Hq %d Hkv %d hd %d, %d rows at %d..%d, %d steps, P %d, %d heads a block: fused (cos / sin "
           "before "
           "the wait) == unfused bitwise, vs cpu <= %.2e; %d rows alone: %s\n",
           Hq, Hkv, hd, NE, minlen, maxlen, steps, P, hs, worst, n_alone,
           alone_same ? "bit-identical" : "DIFFERENT");
#undef KROW
    free(hc), free(ku), free(kf), free(vu), free(vf);
    for (int i = 0; i < NE; i++) free(tables[i]);
    free(tables), free(kp), free(vp), free(qn), free(kn), free(inv), free(o_r), free(q);
    for (int i = 0; i < 2; i++) cu_free(dkp[i]), cu_free(dvp[i]);
    cu_free(dqn), cu_free(dkn), cu_free(dinv), cu_free(cnt);
    cu_ctx_destroy(c);
}

/* the 4B shape (Hq 16, Hkv 4, hd 256) at one row (17 spans after 517 positions), whole groups and 2 heads a
 * block; a short row; the 35B-A3B's group (G 8); small head dims; rows of both classes in one batch (P = 100;
 * each row alone takes one); a batch of 32 */
TEST(cuda_attn_pre_rows) {
    if (cuda_devices() < 1) SKIP("no CUDA device: skipped");
    static const int l517[] = {517}, l5[] = {5}, l6[] = {3, 1023, 300, 100, 1500, 31};
    cu_set_attn_dec_pre(1);
    pre_case(16, 4, 256, l517, 1, 3, 0, 0);
    pre_case(16, 4, 256, l517, 1, 2, 0, 2);
    pre_case(16, 4, 256, l5, 1, 2, 0, -1);
    pre_case(16, 2, 256, l517, 1, 2, 0, 4);
    pre_case(4, 2, 64, l517, 1, 2, 0, 1);
    pre_case(8, 1, 128, l6, 6, 2, 0, 8);
    pre_case(16, 4, 256, l6, 6, 2, 100, -1);
    int l32[32];
    for (int i = 0; i < 32; i++) l32[i] = 3 + (i * 37) % 1100;
    pre_case(16, 4, 256, l32, 32, 2, 0, -1);
    cu_set_attn_dec_pre(0);
}

#else
TEST(cuda_attn_pre_rows) {
    SKIP("no CUDA device: skipped");
}
#endif

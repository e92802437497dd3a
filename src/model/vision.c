/* vision.c — the Qwen3.5 vision tower on the CPU (spec §6.2), following transformers' Qwen3_5VisionModel
 * operation by operation in f32: the same order of the four bilinear taps, bias-then-residual adds, rotary
 * as x*cos + rotate_half(x)*sin, softmax then weighted sum of values. Matmuls go through cpu_matmul
 * (fixed reduction order); per-row work is split over the thread pool by rows, attention by (row, head). */
#include "model/vision.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "util/alloc.h"
#include "util/err.h"

/* Bounds on one call's input: 2^20 patches is a 16384 x 16384 image at patch 16, beyond any max_pixels a
 * Qwen3.5 processor allows; the per-side limit keeps every index product in int. */
#define VIS_MAX_PATCHES ((int64_t)1 << 20)
#define VIS_MAX_SIDE    8192
#define VIS_MAX_T       64
#define VIS_ATT_ROWS    256 /* query rows per block of attention scores */

int64_t vision_tokens(const vision_weights *v, vision_grid g) {
    return (int64_t)g.t * g.h * g.w / ((int64_t)v->merge * v->merge);
}

int vision_check_grids(const vision_weights *v, const vision_grid *grids, int n_images, int64_t *n_patches,
                       char *err, size_t errlen) {
    if (!v->present) return ci_err(err, errlen, CINFER_EUNSUPPORTED, "this model has no vision tower");
    if (n_images <= 0 || !grids) return ci_err(err, errlen, CINFER_EINVAL, "no images");
    int64_t n = 0;
    for (int i = 0; i < n_images; i++) {
        vision_grid g = grids[i];
        if (g.t < 1 || g.h < 1 || g.w < 1 || g.t > VIS_MAX_T || g.h > VIS_MAX_SIDE || g.w > VIS_MAX_SIDE ||
            g.h % v->merge || g.w % v->merge)
            return ci_err(err, errlen, CINFER_EINVAL,
                          "image %d: grid (%d, %d, %d) is not (1..%d, multiple of %d up to %d, same)", i, g.t,
                          g.h, g.w, VIS_MAX_T, v->merge, VIS_MAX_SIDE);
        n += (int64_t)g.t * g.h * g.w;
        if (n > VIS_MAX_PATCHES)
            return ci_err(err, errlen, CINFER_ERANGE, "images: %lld patches in all, over the limit of %lld",
                          (long long)n, (long long)VIS_MAX_PATCHES);
    }
    *n_patches = n;
    return 0;
}

/* ---- row-parallel helpers ---- */

typedef struct vis_run {
    const vision_weights *v;
    int64_t N;          /* patches */
    float *x;           /* [N, D] residual stream */
    float *xn;          /* [N, D] LayerNorm output */
    float *qkv;         /* [N, 3D] q | k | v per row */
    float *att;         /* [N, D] attention output (heads side by side) */
    float *h;           /* [N, max(I, D)] MLP hidden; the merger's [N/4, 4D] */
    float *cosv, *sinv; /* [N, head_dim] rotary tables, each half repeated */
    float *qh, *kh,
        *vt;   /* [max_frame][head_dim] one head's q and k of one frame, v transposed [head_dim][max_frame] */
    float *S;  /* [VIS_ATT_ROWS][max_frame] scores, then probabilities, of a block of query rows */
    float *ob; /* [VIS_ATT_ROWS][head_dim] their outputs */
    int s_cols;  /* keys of the current frame */
    int *frame0; /* [N] first row of the row's frame */
    int *framen; /* [N] rows in the row's frame */
    int max_frame;

    /* arguments of the current row job */
    const float *lw, *lb; /* LayerNorm weight, bias [D] */
    const float *bias;    /* [cols] */
    float *y;             /* [rows, cols] */
    float *res;           /* [rows, cols] residual to add into, or NULL */
    int cols, act;
} vis_run;

enum { ACT_NONE = 0, ACT_GELU_TANH = 1, ACT_GELU_ERF = 2 };

typedef struct rows_job {
    void (*fn)(vis_run *r, int64_t r0, int64_t r1, int ith);
    vis_run *r;
    int64_t n;
} rows_job;

static void rows_worker(void *ctx, int ith, int nth) {
    rows_job *j = ctx;
    long b, e;
    tp_range((long)j->n, ith, nth, &b, &e);
    if (b < e) j->fn(j->r, b, e, ith);
}

static void par_rows(threadpool *tp, vis_run *r, int64_t n, void (*fn)(vis_run *, int64_t, int64_t, int)) {
    rows_job j = {fn, r, n};
    tp_run(tp, rows_worker, &j);
}

/* nn.LayerNorm(eps 1e-6): (x - mean) / sqrt(var + eps) * w + b, biased variance. Mean and variance are
 * accumulated in double: the reference is f32 and this keeps our side of the difference negligible. */
static void layernorm_rows(vis_run *r, int64_t r0, int64_t r1, int ith) {
    int D = r->v->D;
    for (int64_t i = r0; i < r1; i++) {
        const float *x = r->x + i * D;
        float *y = r->xn + i * D;
        double s = 0, ss = 0;
        for (int d = 0; d < D; d++) s += x[d];
        double mean = s / D;
        for (int d = 0; d < D; d++) {
            double t = x[d] - mean;
            ss += t * t;
        }
        float rstd = (float)(1.0 / sqrt(ss / D + 1e-6)), m = (float)mean;
        for (int d = 0; d < D; d++) y[d] = (x[d] - m) * rstd * r->lw[d] + r->lb[d];
    }
}

static inline float gelu_tanh(float x) {
    /* torch's gelu(approximate="tanh"): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
    const float kBeta = 0.7978845608028654f, kKappa = 0.044715f;
    float inner = kBeta * (x + kKappa * x * x * x);
    return 0.5f * x * (1.0f + tanhf(inner));
}

static inline float gelu_erf(float x) {
    return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
}

/* y += bias, then the activation, then (when res) res += y: a Linear's bias and what follows it. */
static void bias_act_rows(vis_run *r, int64_t r0, int64_t r1, int ith) {
    int n = r->cols;
    for (int64_t i = r0; i < r1; i++) {
        float *y = r->y + i * n;
        for (int j = 0; j < n; j++) {
            float t = y[j] + r->bias[j];
            if (r->act == ACT_GELU_TANH)
                t = gelu_tanh(t);
            else if (r->act == ACT_GELU_ERF)
                t = gelu_erf(t);
            y[j] = t;
        }
        if (r->res) {
            float *x = r->res + i * n;
            for (int j = 0; j < n; j++) x[j] += y[j];
        }
    }
}

/* q and k of each head: x*cos + rotate_half(x)*sin over the whole head (products rounded, then added). */
static void rope_rows(vis_run *r, int64_t r0, int64_t r1, int ith) {
    const vision_weights *v = r->v;
    int D = v->D, hd = v->head_dim, half = hd / 2;
    for (int64_t i = r0; i < r1; i++) {
        const float *c = r->cosv + i * hd, *s = r->sinv + i * hd;
        for (int qk = 0; qk < 2; qk++)
            for (int hh = 0; hh < v->heads; hh++) {
                float *x = r->qkv + i * 3 * D + qk * D + hh * hd;
                for (int j = 0; j < half; j++) {
                    float a = x[j], b = x[j + half];
                    float pa = a * c[j], pb = b * s[j];
                    float qa = b * c[j + half], qb = a * s[j + half];
                    x[j] = pa - pb;
                    x[j + half] = qa + qb;
                }
            }
    }
}

/* softmax over a row of scores, as torch's softmax(dim=-1, dtype=float32) after the scale: exp(x - max) /
 * sum, the probabilities divided by their sum before they weigh the values */
static void softmax_rows(vis_run *r, int64_t r0, int64_t r1, int ith) {
    const vision_weights *v = r->v;
    float scale = 1.0f / sqrtf((float)v->head_dim);
    int n = r->s_cols;
    for (int64_t i = r0; i < r1; i++) {
        float *x = r->S + i * n, mx = -INFINITY, sum = 0;
        for (int j = 0; j < n; j++) {
            x[j] *= scale;
            if (x[j] > mx) mx = x[j];
        }
        for (int j = 0; j < n; j++) {
            x[j] = expf(x[j] - mx);
            sum += x[j];
        }
        for (int j = 0; j < n; j++) x[j] /= sum;
    }
}

/* Non-causal attention inside each frame, head by head: S = q k^T and O = P v through cpu_matmul (its
 * reduction order depends only on the sizes, so an image's result never depends on the other images or the
 * threads), over blocks of VIS_ATT_ROWS query rows so the scores stay bounded for large images. */
static void attention(threadpool *tp, vis_run *r, const vision_grid *grids, int n_images) {
    const vision_weights *v = r->v;
    int D = v->D, hd = v->head_dim;
    int64_t base = 0;
    for (int im = 0; im < n_images; im++) {
        int n = grids[im].h * grids[im].w;
        for (int t = 0; t < grids[im].t; t++, base += n) {
            for (int hh = 0; hh < v->heads; hh++) {
                for (int i = 0; i < n; i++) {
                    const float *row = r->qkv + (base + i) * 3 * D + hh * hd;
                    memcpy(r->qh + (size_t)i * hd, row, sizeof(float) * hd);
                    memcpy(r->kh + (size_t)i * hd, row + D, sizeof(float) * hd);
                    for (int j = 0; j < hd; j++) r->vt[(size_t)j * n + i] = row[2 * D + j];
                }
                r->s_cols = n;
                for (int r0 = 0; r0 < n; r0 += VIS_ATT_ROWS) {
                    int rb = n - r0 < VIS_ATT_ROWS ? n - r0 : VIS_ATT_ROWS;
                    cpu_matmul(tp, r->S, r->qh + (size_t)r0 * hd, r->kh, WT_F32, rb, n, hd);
                    par_rows(tp, r, rb, softmax_rows);
                    cpu_matmul(tp, r->ob, r->S, r->vt, WT_F32, rb, hd, n);
                    for (int i = 0; i < rb; i++)
                        memcpy(r->att + (base + r0 + i) * D + hh * hd, r->ob + (size_t)i * hd,
                               sizeof(float) * hd);
                }
            }
        }
    }
}

/* torch.linspace(0, end, steps) in float32 (its CPU kernel: the first half counts up from the start, the
 * second half down from the end). */
static float linspace_at(float end, int steps, int i) {
    if (steps == 1) return 0.0f;
    float step = end / (float)(steps - 1);
    return i < steps / 2 ? step * (float)i : end - step * (float)(steps - i - 1);
}

/* Row index (within one frame of an h x w grid) of full-resolution patch (y, x) in merge-block order. */
static inline int64_t block_row(int y, int x, int w, int M) {
    return ((int64_t)(y / M) * (w / M) + x / M) * M * M + (y % M) * M + (x % M);
}

/* The bilinear tap of patch (y, x) of a grid into the n x n learned position table
 * (fast_pos_embed_interpolate): the four corner rows and their weights. One definition for the CPU tower and
 * the CUDA tower's inputs, so both see the same bits. */
static vision_tap tap_at(int n, vision_grid g, int y, int x) {
    float hy = linspace_at((float)(n - 1), g.h, y);
    int y0 = (int)hy, y1 = y0 + 1 < n ? y0 + 1 : n - 1;
    float dh = hy - (float)y0;
    float wx = linspace_at((float)(n - 1), g.w, x);
    int x0 = (int)wx, x1 = x0 + 1 < n ? x0 + 1 : n - 1;
    float dw = wx - (float)x0;
    vision_tap t = {{y0 * n + x0, y0 * n + x1, y1 * n + x0, y1 * n + x1},
                    {(1.0f - dh) * (1.0f - dw), (1.0f - dh) * dw, dh * (1.0f - dw), dh * dw},
                    y,
                    x};
    return t;
}

/* Learned positions, bilinearly resampled to the grid (fast_pos_embed_interpolate), added to x; and the
 * rotary tables. Returns the frame table too. */
static void positions(vis_run *r, const vision_grid *grids, int n_images, float *pos_out, float *ang_out) {
    const vision_weights *v = r->v;
    int D = v->D, n = v->grid_side, M = v->merge, hd = v->head_dim, q = hd / 4;
    int64_t base = 0;
    for (int im = 0; im < n_images; im++) {
        vision_grid g = grids[im];
        int64_t fr = (int64_t)g.h * g.w;
        for (int y = 0; y < g.h; y++) {
            for (int x = 0; x < g.w; x++) {
                vision_tap tp = tap_at(n, g, y, x);
                float w00 = tp.w[0], w01 = tp.w[1], w10 = tp.w[2], w11 = tp.w[3];
                const float *p00 = v->pos + (int64_t)tp.idx[0] * D, *p01 = v->pos + (int64_t)tp.idx[1] * D;
                const float *p10 = v->pos + (int64_t)tp.idx[2] * D, *p11 = v->pos + (int64_t)tp.idx[3] * D;
                int64_t br = block_row(y, x, g.w, M);
                for (int t = 0; t < g.t; t++) {
                    int64_t row = base + t * fr + br;
                    float *xr = r->x + row * D;
                    float *po = pos_out ? pos_out + row * D : NULL;
                    for (int d = 0; d < D; d++) {
                        float a = p00[d] * w00, b = p01[d] * w01, c = p10[d] * w10, e = p11[d] * w11;
                        float pe = ((a + b) + c) + e;
                        xr[d] += pe;
                        if (po) po[d] = pe;
                    }
                    /* rotary: angle = position * inv_freq, rows then columns; cos/sin repeated per half */
                    float *cs = r->cosv + row * hd, *sn = r->sinv + row * hd;
                    for (int i = 0; i < q; i++) {
                        float ay = (float)y * v->inv_freq[i], ax = (float)x * v->inv_freq[i];
                        if (ang_out) {
                            ang_out[row * (hd / 2) + i] = ay;
                            ang_out[row * (hd / 2) + q + i] = ax;
                        }
                        cs[i] = cs[i + 2 * q] = cosf(ay);
                        sn[i] = sn[i + 2 * q] = sinf(ay);
                        cs[q + i] = cs[3 * q + i] = cosf(ax);
                        sn[q + i] = sn[3 * q + i] = sinf(ax);
                    }
                    r->frame0[row] = (int)(base + t * fr);
                    r->framen[row] = (int)fr;
                }
            }
        }
        base += (int64_t)g.t * fr;
    }
}

void vision_taps(const vision_weights *v, const vision_grid *grids, int n_images, vision_tap *out) {
    int n = v->grid_side, M = v->merge;
    int64_t base = 0;
    for (int im = 0; im < n_images; im++) {
        vision_grid g = grids[im];
        int64_t fr = (int64_t)g.h * g.w;
        for (int y = 0; y < g.h; y++)
            for (int x = 0; x < g.w; x++) {
                vision_tap t = tap_at(n, g, y, x);
                int64_t br = block_row(y, x, g.w, M);
                for (int f = 0; f < g.t; f++) out[base + f * fr + br] = t;
            }
        base += (int64_t)g.t * fr;
    }
}

int vision_encode(const model *m, threadpool *tp, const float *pixels, const vision_grid *grids, int n_images,
                  float *out, vision_trace_fn trace, void *trace_ctx, char *err, size_t errlen) {
    const vision_weights *v = &m->vis;
    int64_t N;
    int rc = vision_check_grids(v, grids, n_images, &N, err, errlen);
    if (rc) return rc;
    int D = v->D, hd = v->head_dim, I = v->I, MM = v->merge * v->merge, J = D * MM;
    int max_frame = 0;
    for (int i = 0; i < n_images; i++)
        if (grids[i].h * grids[i].w > max_frame) max_frame = grids[i].h * grids[i].w;
    int hw = I > D ? I : D;
    size_t floats = (size_t)N * ((size_t)D * 5 + (size_t)hw + 2 * (size_t)hd) + (size_t)max_frame * 3 * hd +
                    (size_t)VIS_ATT_ROWS * (max_frame + hd);
    size_t trace_floats = trace ? (size_t)N * ((size_t)D + (size_t)hd / 2) : 0;
    size_t bytes = (floats + trace_floats) * sizeof(float) + 2 * (size_t)N * sizeof(int);
    char *blk = ci_try_alloc(bytes);
    if (!blk)
        return ci_err(err, errlen, CINFER_ENOMEM,
                      "vision tower: cannot allocate %zu MiB of scratch for %lld patches", bytes >> 20,
                      (long long)N);
    vis_run r = {.v = v, .N = N, .max_frame = max_frame};
    float *f = (float *)blk;
    r.x = f, f += (size_t)N * D;
    r.xn = f, f += (size_t)N * D;
    r.qkv = f, f += (size_t)N * 3 * D;
    r.att = r.xn; /* the LayerNorm output is dead once q, k, v are projected */
    r.h = f, f += (size_t)N * hw;
    r.cosv = f, f += (size_t)N * hd;
    r.sinv = f, f += (size_t)N * hd;
    r.qh = f, f += (size_t)max_frame * hd;
    r.kh = f, f += (size_t)max_frame * hd;
    r.vt = f, f += (size_t)max_frame * hd;
    r.S = f, f += (size_t)VIS_ATT_ROWS * max_frame;
    r.ob = f, f += (size_t)VIS_ATT_ROWS * hd;
    float *pos_tr = NULL, *ang_tr = NULL;
    if (trace) {
        pos_tr = f, f += (size_t)N * D;
        ang_tr = f, f += (size_t)N * hd / 2;
    }
    r.frame0 = (int *)f;
    r.framen = r.frame0 + N;

    /* patch embedding: the Conv3d with kernel = stride is a Linear on the flattened patch, then its bias */
    cpu_matmul(tp, r.x, pixels, v->patch_w.data, v->patch_w.type, (int)N, D, v->patch_dim);
    r.y = r.x, r.bias = v->patch_b, r.cols = D, r.act = ACT_NONE, r.res = NULL;
    par_rows(tp, &r, N, bias_act_rows);
    if (trace) trace(trace_ctx, "patch_embed", r.x, N, D);
    positions(&r, grids, n_images, pos_tr, ang_tr);
    if (trace) {
        trace(trace_ctx, "pos_embed", pos_tr, N, D);
        trace(trace_ctx, "rotary", ang_tr, N, hd / 2);
    }

    for (int bi = 0; bi < v->depth; bi++) {
        const vision_block_weights *b = &v->blocks[bi];
        r.lw = b->norm1_w, r.lb = b->norm1_b;
        par_rows(tp, &r, N, layernorm_rows);
        cpu_matmul(tp, r.qkv, r.xn, b->qkv.data, b->qkv.type, (int)N, 3 * D, D);
        r.y = r.qkv, r.bias = b->qkv_b, r.cols = 3 * D, r.act = ACT_NONE, r.res = NULL;
        par_rows(tp, &r, N, bias_act_rows);
        par_rows(tp, &r, N, rope_rows);
        attention(tp, &r, grids, n_images);
        cpu_matmul(tp, r.h, r.att, b->proj.data, b->proj.type, (int)N, D, D);
        r.y = r.h, r.bias = b->proj_b, r.cols = D, r.act = ACT_NONE, r.res = r.x;
        par_rows(tp, &r, N, bias_act_rows);

        r.lw = b->norm2_w, r.lb = b->norm2_b;
        par_rows(tp, &r, N, layernorm_rows);
        cpu_matmul(tp, r.h, r.xn, b->fc1.data, b->fc1.type, (int)N, I, D);
        r.y = r.h, r.bias = b->fc1_b, r.cols = I, r.act = ACT_GELU_TANH, r.res = NULL;
        par_rows(tp, &r, N, bias_act_rows);
        cpu_matmul(tp, r.qkv, r.h, b->fc2.data, b->fc2.type, (int)N, D, I);
        r.y = r.qkv, r.bias = b->fc2_b, r.cols = D, r.act = ACT_NONE, r.res = r.x;
        par_rows(tp, &r, N, bias_act_rows);
        if (trace) {
            char nm[32];
            snprintf(nm, sizeof nm, "block%d", bi);
            trace(trace_ctx, nm, r.x, N, D);
        }
    }

    /* merger: LayerNorm per patch, then each run of merge^2 consecutive patches (one 2x2 block) is one row */
    int64_t NT = N / MM;
    r.lw = v->mnorm_w, r.lb = v->mnorm_b;
    par_rows(tp, &r, N, layernorm_rows);
    cpu_matmul(tp, r.h, r.xn, v->mfc1.data, v->mfc1.type, (int)NT, J, J);
    r.y = r.h, r.bias = v->mfc1_b, r.cols = J, r.act = ACT_GELU_ERF, r.res = NULL;
    par_rows(tp, &r, NT, bias_act_rows);
    cpu_matmul(tp, out, r.h, v->mfc2.data, v->mfc2.type, (int)NT, v->out_hidden, J);
    r.y = out, r.bias = v->mfc2_b, r.cols = v->out_hidden, r.act = ACT_NONE, r.res = NULL;
    par_rows(tp, &r, NT, bias_act_rows);
    if (trace) trace(trace_ctx, "merger", out, NT, v->out_hidden);
    free(blk);
    return 0;
}

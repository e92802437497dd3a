/* vision_cuda.c — the vision tower on a CUDA device (see vision_cuda.h). The host computes what is cheap
 * and exactly shared with the CPU tower (the bilinear taps and rotary (y, x) of every patch, vision_taps,
 * and the frame table), uploads it with the pixels, and enqueues: patch GEMM + bias, position add, then per
 * block LayerNorm, qkv GEMM + bias, rotary, attention per (frame, head), proj GEMM + bias + residual,
 * LayerNorm, fc1 GEMM + bias + GELU(tanh), fc2 GEMM + bias + residual; the merger's LayerNorm, fc1 + bias +
 * GELU(erf), fc2 + bias; the features come back to the host. */
#include "model/vision_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"

#ifndef CINFER_CUDA

int cuda_vision_create(const model *m, cuda_vision **out, char *err, size_t errlen) {
    (void)m;
    *out = NULL;
    return ci_err(err, errlen, CINFER_EUNSUPPORTED,
                  "this build has no CUDA backend (rebuild with nvcc: make CUDA=1)");
}
void cuda_vision_destroy(cuda_vision *v) {
    (void)v;
}
int cuda_vision_encode(cuda_vision *v, const float *pixels, const vision_grid *grids, int n_images,
                       float *out, vision_trace_fn trace, void *trace_ctx, char *err, size_t errlen) {
    (void)v, (void)pixels, (void)grids, (void)n_images, (void)out, (void)trace, (void)trace_ctx;
    return ci_err(err, errlen, CINFER_EUNSUPPORTED, "no CUDA backend");
}

#else

#include "backend/cuda/vision_ops.h"
#include "util/alloc.h"
#include "util/bf16.h"

_Static_assert(sizeof(vision_tap) == sizeof(cu_vis_tap), "vision_tap and cu_vis_tap share one layout");

typedef struct cv_block {
    float *n1w, *n1b, *n2w, *n2b;          /* [D] f32 */
    uint16_t *qkv, *proj;                  /* bf16 [3D][D], [D][D] */
    uint16_t *fc1, *fc2;                   /* bf16 [I][D], [D][I] */
    float *qkv_b, *proj_b, *fc1_b, *fc2_b; /* [3D], [D], [I], [D] f32 */
} cv_block;

struct cuda_vision {
    const model *m;
    cu_ctx *cu;
    int attn_tc;   /* CINFER_CUDA_VIS_ATTN=tc: attention on the tensor cores (cu_vis_attn_tc) */
    void **allocs; /* the weights' device allocations */
    int n_allocs, cap_allocs;
    uint16_t *patch_w;      /* bf16 [D][patch_dim] */
    float *patch_b;         /* [D] */
    float *pos;             /* [grid_side^2][D] f32 learned positions */
    float *inv_freq;        /* [head_dim/4] */
    cv_block *b;            /* [depth] */
    float *mnw, *mnb;       /* [D] merger LayerNorm */
    uint16_t *mfc1, *mfc2;  /* bf16 [4D][4D], [out_hidden][4D] */
    float *mfc1_b, *mfc2_b; /* [4D], [out_hidden] */
    /* scratch for up to cap_rows patches and cap_frames frames (one device block, regrown when exceeded) */
    int64_t cap_rows;
    int cap_frames;
    void *scratch;
    float *px;          /* [N][patch_dim] pixels */
    float *x, *xn;      /* [N][D] residual stream, LayerNorm output (also the attention output) */
    float *qkv;         /* [N][3D] */
    float *h;           /* [N][max(I, D)] MLP hidden, proj output; the merger's [N/4][4D] */
    float *out;         /* [N/4][out_hidden] */
    uint16_t *xb;       /* [2N][max(patch_dim, I, D)] bf16 GEMM input halves */
    cu_vis_tap *taps;   /* [N] */
    int *frames;        /* [cap_frames][2] */
    vision_tap *h_taps; /* host [N] */
    int *h_frames;      /* host [cap_frames][2] */
};

static int cv_alloc(cuda_vision *v, void **p, size_t bytes, char *err, size_t errlen) {
    int rc = cu_alloc(p, bytes ? bytes : 4, err, errlen);
    if (rc) return rc;
    if (v->n_allocs == v->cap_allocs) {
        v->cap_allocs = v->cap_allocs ? 2 * v->cap_allocs : 64;
        v->allocs = xrealloc(v->allocs, (size_t)v->cap_allocs * sizeof(void *));
    }
    v->allocs[v->n_allocs++] = *p;
    return 0;
}

static int up_vec(cuda_vision *v, float **out, const float *x, size_t n, char *err, size_t errlen) {
    int rc = cv_alloc(v, (void **)out, n * sizeof(float), err, errlen);
    return rc ? rc : cu_upload(*out, x, n * sizeof(float), err, errlen);
}

/* a host matrix (bf16 / f16 / f32) as bf16 on the device: checkpoints hold the tower in bf16, copied as is */
static int up_mat(cuda_vision *v, uint16_t **out, const wmat *w, int rows, int cols, char *err,
                  size_t errlen) {
    if (w->rows != rows || w->cols != cols)
        return ci_err(err, errlen, CINFER_EFORMAT, "vision tower: a matrix is [%d, %d], expected [%d, %d]",
                      w->rows, w->cols, rows, cols);
    size_t n = (size_t)rows * cols;
    int rc = cv_alloc(v, (void **)out, n * 2, err, errlen);
    if (rc) return rc;
    if (w->type == WT_BF16) return cu_upload(*out, w->data, n * 2, err, errlen);
    uint16_t *st = ci_try_alloc(n * 2);
    if (!st)
        return ci_err(err, errlen, CINFER_ENOMEM, "vision tower: cannot stage a %d x %d matrix", rows, cols);
    for (size_t i = 0; i < n; i++)
        st[i] = f32_to_bf16(w->type == WT_F32 ? ((const float *)w->data)[i]
                                              : f16_to_f32(((const uint16_t *)w->data)[i]));
    rc = cu_upload(*out, st, n * 2, err, errlen);
    free(st);
    return rc;
}

void cuda_vision_destroy(cuda_vision *v) {
    if (!v) return;
    for (int i = 0; i < v->n_allocs; i++) cu_free(v->allocs[i]);
    cu_free(v->scratch);
    cu_ctx_destroy(v->cu);
    free(v->allocs);
    free(v->b);
    free(v->h_taps);
    free(v->h_frames);
    free(v);
}

int cuda_vision_create(const model *m, cuda_vision **out, char *err, size_t errlen) {
    *out = NULL;
    const vision_weights *w = &m->vis;
    if (!w->present) return ci_err(err, errlen, CINFER_EUNSUPPORTED, "this model has no vision tower");
    if (cu_device_count() < 1) return ci_err(err, errlen, CINFER_EUNSUPPORTED, "no CUDA device");
    if (!cu_vis_attn_supported(w->head_dim) || w->head_dim % 4)
        return ci_err(err, errlen, CINFER_EUNSUPPORTED,
                      "cuda: vision head_dim %d (supported: 16, 32, 64, 72, 80, 96, 128)", w->head_dim);
    cuda_vision *v = xcalloc(1, sizeof *v);
    v->m = m;
    const char *at = getenv("CINFER_CUDA_VIS_ATTN");
    v->attn_tc = at && !strcmp(at, "tc") && cu_vis_attn_tc_supported(w->head_dim);
    if (at) /* a diagnostic switch: say what it selected */
        fprintf(stderr, "cinfer cuda: CINFER_CUDA_VIS_ATTN=%s: vision attention %s\n", at,
                v->attn_tc ? "on the tensor cores" : "scalar");
    int rc = cu_ctx_create(&v->cu, err, errlen);
    if (rc) {
        free(v);
        return rc;
    }
    int D = w->D, I = w->I, J = D * w->merge * w->merge;
    v->b = xcalloc((size_t)w->depth, sizeof(cv_block));
    if ((rc = up_mat(v, &v->patch_w, &w->patch_w, D, w->patch_dim, err, errlen)) ||
        (rc = up_vec(v, &v->patch_b, w->patch_b, (size_t)D, err, errlen)) ||
        (rc = up_vec(v, &v->pos, w->pos, (size_t)w->grid_side * w->grid_side * D, err, errlen)) ||
        (rc = up_vec(v, &v->inv_freq, w->inv_freq, (size_t)w->head_dim / 4, err, errlen)) ||
        (rc = up_vec(v, &v->mnw, w->mnorm_w, (size_t)D, err, errlen)) ||
        (rc = up_vec(v, &v->mnb, w->mnorm_b, (size_t)D, err, errlen)) ||
        (rc = up_mat(v, &v->mfc1, &w->mfc1, J, J, err, errlen)) ||
        (rc = up_vec(v, &v->mfc1_b, w->mfc1_b, (size_t)J, err, errlen)) ||
        (rc = up_mat(v, &v->mfc2, &w->mfc2, w->out_hidden, J, err, errlen)) ||
        (rc = up_vec(v, &v->mfc2_b, w->mfc2_b, (size_t)w->out_hidden, err, errlen)))
        goto fail;
    for (int i = 0; i < w->depth; i++) {
        const vision_block_weights *s = &w->blocks[i];
        cv_block *d = &v->b[i];
        if ((rc = up_vec(v, &d->n1w, s->norm1_w, (size_t)D, err, errlen)) ||
            (rc = up_vec(v, &d->n1b, s->norm1_b, (size_t)D, err, errlen)) ||
            (rc = up_vec(v, &d->n2w, s->norm2_w, (size_t)D, err, errlen)) ||
            (rc = up_vec(v, &d->n2b, s->norm2_b, (size_t)D, err, errlen)) ||
            (rc = up_mat(v, &d->qkv, &s->qkv, 3 * D, D, err, errlen)) ||
            (rc = up_vec(v, &d->qkv_b, s->qkv_b, (size_t)3 * D, err, errlen)) ||
            (rc = up_mat(v, &d->proj, &s->proj, D, D, err, errlen)) ||
            (rc = up_vec(v, &d->proj_b, s->proj_b, (size_t)D, err, errlen)) ||
            (rc = up_mat(v, &d->fc1, &s->fc1, I, D, err, errlen)) ||
            (rc = up_vec(v, &d->fc1_b, s->fc1_b, (size_t)I, err, errlen)) ||
            (rc = up_mat(v, &d->fc2, &s->fc2, D, I, err, errlen)) ||
            (rc = up_vec(v, &d->fc2_b, s->fc2_b, (size_t)D, err, errlen)))
            goto fail;
    }
    *out = v;
    return 0;
fail:
    cuda_vision_destroy(v);
    return rc;
}

static size_t imax(size_t a, size_t b) {
    return a > b ? a : b;
}

/* carves one device block into the scratch arrays for N patches and nf frames (256-byte aligned pieces) */
static int ensure_scratch(cuda_vision *v, int64_t N, int nf, char *err, size_t errlen) {
    if (N <= v->cap_rows && nf <= v->cap_frames) return 0;
    const vision_weights *w = &v->m->vis;
    int64_t rows = N > v->cap_rows ? N : v->cap_rows;
    int frames = nf > v->cap_frames ? nf : v->cap_frames;
    size_t n = (size_t)rows, D = (size_t)w->D, hw = imax((size_t)w->I, D);
    size_t kmax = imax(imax((size_t)w->patch_dim, (size_t)w->I), D);
    size_t sizes[9] = {n * w->patch_dim * 4,
                       n * D * 4,
                       n * D * 4,
                       n * 3 * D * 4,
                       n * hw * 4,
                       (n / ((size_t)w->merge * w->merge) + 1) * (size_t)w->out_hidden * 4,
                       2 * n * kmax * 2,
                       n * sizeof(cu_vis_tap),
                       (size_t)frames * 2 * sizeof(int)};
    size_t total = 0, off[9];
    for (int i = 0; i < 9; i++) off[i] = total, total += (sizes[i] + 255) & ~(size_t)255;
    cu_free(v->scratch);
    v->scratch = NULL;
    v->cap_rows = 0, v->cap_frames = 0;
    int rc = cu_alloc(&v->scratch, total, err, errlen);
    if (rc) return rc;
    char *b = v->scratch;
    v->px = (float *)(b + off[0]);
    v->x = (float *)(b + off[1]);
    v->xn = (float *)(b + off[2]);
    v->qkv = (float *)(b + off[3]);
    v->h = (float *)(b + off[4]);
    v->out = (float *)(b + off[5]);
    v->xb = (uint16_t *)(b + off[6]);
    v->taps = (cu_vis_tap *)(b + off[7]);
    v->frames = (int *)(b + off[8]);
    free(v->h_taps);
    free(v->h_frames);
    v->h_taps = ci_try_alloc(n * sizeof(vision_tap));
    v->h_frames = ci_try_alloc((size_t)frames * 2 * sizeof(int));
    if (!v->h_taps || !v->h_frames)
        return ci_err(err, errlen, CINFER_ENOMEM, "vision tower: host tables for %lld patches", (long long)N);
    v->cap_rows = rows, v->cap_frames = frames;
    return 0;
}

static void gemm(cuda_vision *v, float *y, const float *x, const uint16_t *w, int64_t M, int N, int K) {
    cu_gemm(v->cu, y, x, w, (int)M, N, K, v->xb, 0);
}

/* a stage to the trace callback: waits for the stream, copies rows x cols back */
static int trace_stage(cuda_vision *v, vision_trace_fn trace, void *tctx, const char *name, const float *d,
                       int64_t rows, int cols, char *err, size_t errlen) {
    float *h = ci_try_alloc((size_t)rows * cols * sizeof(float));
    if (!h) return ci_err(err, errlen, CINFER_ENOMEM, "vision trace: %lld x %d", (long long)rows, cols);
    cu_d2h_async(v->cu, h, d, (size_t)rows * cols * sizeof(float));
    int rc = cu_sync(v->cu, err, errlen);
    if (!rc) trace(tctx, name, h, rows, cols);
    free(h);
    return rc;
}

int cuda_vision_encode(cuda_vision *v, const float *pixels, const vision_grid *grids, int n_images,
                       float *out, vision_trace_fn trace, void *trace_ctx, char *err, size_t errlen) {
    const vision_weights *w = &v->m->vis;
    int64_t N;
    int rc = vision_check_grids(w, grids, n_images, &N, err, errlen);
    if (rc) return rc;
    int nf = 0, max_frame = 0;
    for (int i = 0; i < n_images; i++) {
        nf += grids[i].t;
        if (grids[i].h * grids[i].w > max_frame) max_frame = grids[i].h * grids[i].w;
    }
    if ((rc = ensure_scratch(v, N, nf, err, errlen))) return rc;
    int D = w->D, I = w->I, hd = w->head_dim, MM = w->merge * w->merge, J = D * MM;
    int64_t NT = N / MM;
    vision_taps(w, grids, n_images, v->h_taps);
    int64_t base = 0;
    for (int i = 0, k = 0; i < n_images; i++)
        for (int t = 0; t < grids[i].t; t++, k++) {
            v->h_frames[2 * k] = (int)base;
            v->h_frames[2 * k + 1] = grids[i].h * grids[i].w;
            base += (int64_t)grids[i].h * grids[i].w;
        }
    cu_ctx *c = v->cu;
    cu_h2d_async(c, v->px, pixels, (size_t)N * w->patch_dim * sizeof(float));
    cu_h2d_async(c, v->taps, v->h_taps, (size_t)N * sizeof(cu_vis_tap));
    cu_h2d_async(c, v->frames, v->h_frames, (size_t)nf * 2 * sizeof(int));

    gemm(v, v->x, v->px, v->patch_w, N, D, w->patch_dim);
    cu_vis_bias_act(c, v->x, v->patch_b, (int)N, D, CU_VIS_ACT_NONE, NULL);
    if (trace && (rc = trace_stage(v, trace, trace_ctx, "patch_embed", v->x, N, D, err, errlen))) return rc;
    cu_vis_pos_add(c, v->x, v->pos, v->taps, (int)N, D);
    for (int bi = 0; bi < w->depth; bi++) {
        const cv_block *b = &v->b[bi];
        cu_vis_layernorm(c, v->xn, v->x, b->n1w, b->n1b, (int)N, D, 1e-6f);
        gemm(v, v->qkv, v->xn, b->qkv, N, 3 * D, D);
        cu_vis_bias_act(c, v->qkv, b->qkv_b, (int)N, 3 * D, CU_VIS_ACT_NONE, NULL);
        cu_vis_rope(c, v->qkv, v->taps, v->inv_freq, (int)N, D, w->heads, hd);
        if (v->attn_tc)
            cu_vis_attn_tc(c, v->xn, v->qkv, v->frames, nf, max_frame, D, w->heads, hd);
        else
            cu_vis_attn(c, v->xn, v->qkv, v->frames, nf, max_frame, D, w->heads, hd);
        gemm(v, v->h, v->xn, b->proj, N, D, D);
        cu_vis_bias_act(c, v->h, b->proj_b, (int)N, D, CU_VIS_ACT_NONE, v->x);
        cu_vis_layernorm(c, v->xn, v->x, b->n2w, b->n2b, (int)N, D, 1e-6f);
        gemm(v, v->h, v->xn, b->fc1, N, I, D);
        cu_vis_bias_act(c, v->h, b->fc1_b, (int)N, I, CU_VIS_ACT_GELU_TANH, NULL);
        gemm(v, v->qkv, v->h, b->fc2, N, D, I);
        cu_vis_bias_act(c, v->qkv, b->fc2_b, (int)N, D, CU_VIS_ACT_NONE, v->x);
        if (trace) {
            char nm[32];
            snprintf(nm, sizeof nm, "block%d", bi);
            if ((rc = trace_stage(v, trace, trace_ctx, nm, v->x, N, D, err, errlen))) return rc;
        }
    }
    /* merger: LayerNorm per patch, then each merge^2 consecutive patches (one 2x2 block) are one row */
    cu_vis_layernorm(c, v->xn, v->x, v->mnw, v->mnb, (int)N, D, 1e-6f);
    gemm(v, v->h, v->xn, v->mfc1, NT, J, J);
    cu_vis_bias_act(c, v->h, v->mfc1_b, (int)NT, J, CU_VIS_ACT_GELU_ERF, NULL);
    gemm(v, v->out, v->h, v->mfc2, NT, w->out_hidden, J);
    cu_vis_bias_act(c, v->out, v->mfc2_b, (int)NT, w->out_hidden, CU_VIS_ACT_NONE, NULL);
    cu_d2h_async(c, out, v->out, (size_t)NT * w->out_hidden * sizeof(float));
    if ((rc = cu_sync(c, err, errlen))) return rc;
    if (trace) trace(trace_ctx, "merger", out, NT, w->out_hidden);
    return 0;
}

#endif

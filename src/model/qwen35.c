/* qwen35.c — binds a checkpoint's tensors to the model struct, by HF name, for qwen3_5 / qwen3_5_moe /
 * qwen3_next, checking dtype and shape of each. Big matrices stay in the mmap; norms, conv taps, A and
 * dt_bias (a few KB per layer) are converted once to f32 in one arena, with the zero-centred norms
 * stored as 1 + w so the forward never branches on it. */
#include "model/qwen35.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "util/alloc.h"
#include "util/file.h"
#include "util/bf16.h"
#include "util/err.h"
#include "util/log.h"

/* ---- f32 arena: the model's small converted vectors, one lifetime ---- */
typedef struct arena_block {
    struct arena_block *next;
    size_t used, cap;
    float data[];
} arena_block;

static float *arena_floats(model *m, size_t n) {
    arena_block *b = m->f32_pool;
    n = (n + 15) & ~(size_t)15; /* keep 64-byte granularity */
    if (!b || b->used + n > b->cap) {
        size_t cap = n > (1u << 18) ? n : (1u << 18);
        arena_block *nb = xmalloc(sizeof *nb + cap * sizeof(float));
        nb->next = b;
        nb->used = 0;
        nb->cap = cap;
        m->f32_pool = nb;
        b = nb;
    }
    float *p = b->data + b->used;
    b->used += n;
    return p;
}

/* ---- binder: name lookup with dtype/shape checks, and a record of what was consumed ---- */
typedef struct binder {
    model *m;
    const char *prefix; /* "model.language_model." or "model." */
    unsigned char *used; /* [n_tensors] */
    char *err;
    size_t errlen;
} binder;

static const char *dims_str(const int64_t *shape, int ndim, char *buf, size_t n) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int i = 0; i < ndim && o < n; i++) o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
    return buf;
}

static int mark_used(binder *b, const st_tensor *t) {
    /* index pointers are sorted by name; find the slot by binary search on the pointer's name */
    int lo = 0, hi = b->m->st->n_tensors - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        int c = strcmp(b->m->st->index[mid]->name, t->name);
        if (c == 0) {
            b->used[mid] = 1;
            return 0;
        }
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

static int is_float_dtype(st_dtype d) { return d == ST_BF16 || d == ST_F16 || d == ST_F32; }

/* Finds full name `name` with the given shape (ndim dims; a -1 dim accepts anything). */
static int find_checked(binder *b, const char *name, int ndim, const int64_t *shape, const st_tensor **out) {
    const st_tensor *t = st_find(b->m->st, name);
    if (!t) return ci_err(b->err, b->errlen, CINFER_ENOTFOUND, "missing tensor \"%s\"", name);
    char e[128], a[128];
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++)
        if (shape[i] >= 0 && shape[i] != t->shape[i]) ok = 0;
    if (!ok || !is_float_dtype(t->dtype))
        return ci_err(b->err, b->errlen, CINFER_EFORMAT, "tensor \"%s\": expected %s %s, got %s %s", name,
                      "BF16|F16|F32", dims_str(shape, ndim, e, sizeof e), st_dtype_name(t->dtype),
                      dims_str(t->shape, t->ndim, a, sizeof a));
    /* a crafted file can place a span at an odd offset: the kernels read whole elements */
    if ((uintptr_t)t->data % st_dtype_size(t->dtype))
        return ci_err(b->err, b->errlen, CINFER_EFORMAT, "tensor \"%s\": data offset is not a multiple of its %zu-byte element",
                      name, st_dtype_size(t->dtype));
    mark_used(b, t);
    *out = t;
    return 0;
}

static wtype wtype_of(st_dtype d) { return d == ST_BF16 ? WT_BF16 : d == ST_F16 ? WT_F16 : WT_F32; }

static int bind_mat(binder *b, const char *name, int rows, int cols, wmat *out) {
    const st_tensor *t;
    int64_t shape[2] = {rows, cols};
    int rc = find_checked(b, name, 2, shape, &t);
    if (rc) return rc;
    *out = (wmat){t->data, wtype_of(t->dtype), rows, cols};
    return 0;
}

static float elem_f32(const st_tensor *t, int64_t i) {
    switch (t->dtype) {
    case ST_BF16: return bf16_to_f32(((const uint16_t *)t->data)[i]);
    case ST_F16: return f16_to_f32(((const uint16_t *)t->data)[i]);
    default: {
        float f;
        memcpy(&f, (const char *)t->data + 4 * i, 4);
        return f;
    }
    }
}

enum { VEC_PLAIN = 0, VEC_ONE_PLUS = 1, VEC_NEG_EXP = 2 };

/* A vector of n floats (any float dtype, shape [n]) converted to f32: w, 1 + w, or -exp(w). */
static int bind_vec(binder *b, const char *name, int n, int mode, float **out) {
    const st_tensor *t;
    int64_t shape[1] = {n};
    int rc = find_checked(b, name, 1, shape, &t);
    if (rc) return rc;
    float *v = arena_floats(b->m, (size_t)n);
    for (int i = 0; i < n; i++) {
        float w = elem_f32(t, i);
        v[i] = mode == VEC_ONE_PLUS ? 1.0f + w : mode == VEC_NEG_EXP ? -expf(w) : w;
    }
    *out = v;
    return 0;
}

static char *nm(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static char *nm(char *buf, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, n, fmt, ap);
    va_end(ap);
    return buf;
}

#define NAME(...) nm(name, sizeof name, __VA_ARGS__)

static int bind_attention(binder *b, const char *lp, layer_weights *lw) {
    model *m = b->m;
    char name[512];
    int rc;
    if ((rc = bind_mat(b, NAME("%sself_attn.q_proj.weight", lp), m->Hq * 2 * m->hd, m->H, &lw->q_proj))) return rc;
    if ((rc = bind_mat(b, NAME("%sself_attn.k_proj.weight", lp), m->Hkv * m->hd, m->H, &lw->k_proj))) return rc;
    if ((rc = bind_mat(b, NAME("%sself_attn.v_proj.weight", lp), m->Hkv * m->hd, m->H, &lw->v_proj))) return rc;
    if ((rc = bind_mat(b, NAME("%sself_attn.o_proj.weight", lp), m->H, m->Hq * m->hd, &lw->o_proj))) return rc;
    if ((rc = bind_vec(b, NAME("%sself_attn.q_norm.weight", lp), m->hd, VEC_ONE_PLUS, &lw->q_norm))) return rc;
    if ((rc = bind_vec(b, NAME("%sself_attn.k_norm.weight", lp), m->hd, VEC_ONE_PLUS, &lw->k_norm))) return rc;
    return 0;
}

static int bind_deltanet(binder *b, const char *lp, layer_weights *lw) {
    model *m = b->m;
    char name[512];
    int rc;
    int vd = m->Hv * m->dv;
    if (m->cfg.arch == ARCH_QWEN3_NEXT) {
        lw->fused_qkvz = 1;
        if ((rc = bind_mat(b, NAME("%slinear_attn.in_proj_qkvz.weight", lp), 2 * m->Hk * m->dk + 2 * vd, m->H, &lw->in_qkvz)))
            return rc;
        if ((rc = bind_mat(b, NAME("%slinear_attn.in_proj_ba.weight", lp), 2 * m->Hv, m->H, &lw->in_ba))) return rc;
    } else {
        if ((rc = bind_mat(b, NAME("%slinear_attn.in_proj_qkv.weight", lp), m->C, m->H, &lw->in_qkv))) return rc;
        if ((rc = bind_mat(b, NAME("%slinear_attn.in_proj_z.weight", lp), vd, m->H, &lw->in_z))) return rc;
        if ((rc = bind_mat(b, NAME("%slinear_attn.in_proj_b.weight", lp), m->Hv, m->H, &lw->in_b))) return rc;
        if ((rc = bind_mat(b, NAME("%slinear_attn.in_proj_a.weight", lp), m->Hv, m->H, &lw->in_a))) return rc;
    }
    /* conv1d.weight [C, 1, K] depthwise, no bias */
    const st_tensor *t;
    int64_t cshape[3] = {m->C, 1, m->K};
    if ((rc = find_checked(b, NAME("%slinear_attn.conv1d.weight", lp), 3, cshape, &t))) return rc;
    lw->conv_w = arena_floats(m, (size_t)m->C * m->K);
    for (int c = 0; c < m->C; c++)
        for (int j = 0; j < m->K; j++) lw->conv_w[(size_t)j * m->C + c] = elem_f32(t, (int64_t)c * m->K + j);
    if (st_find(m->st, NAME("%slinear_attn.conv1d.bias", lp)))
        return ci_err(b->err, b->errlen, CINFER_EUNSUPPORTED, "tensor \"%s\": conv bias is not part of this architecture", name);
    /* A_log is F32 in real checkpoints, BF16 when a whole model is cast: bind_vec takes any float type. */
    if ((rc = bind_vec(b, NAME("%slinear_attn.A_log", lp), m->Hv, VEC_NEG_EXP, &lw->A))) return rc;
    if ((rc = bind_vec(b, NAME("%slinear_attn.dt_bias", lp), m->Hv, VEC_PLAIN, &lw->dt_bias))) return rc;
    if ((rc = bind_vec(b, NAME("%slinear_attn.norm.weight", lp), m->dv, VEC_PLAIN, &lw->gnorm))) return rc;
    if ((rc = bind_mat(b, NAME("%slinear_attn.out_proj.weight", lp), m->H, vd, &lw->out_proj))) return rc;
    return 0;
}

static int bind_dense_mlp(binder *b, const char *lp, int I, wmat *g, wmat *u, wmat *d) {
    model *m = b->m;
    char name[512];
    int rc;
    if ((rc = bind_mat(b, NAME("%sgate_proj.weight", lp), I, m->H, g))) return rc;
    if ((rc = bind_mat(b, NAME("%sup_proj.weight", lp), I, m->H, u))) return rc;
    if ((rc = bind_mat(b, NAME("%sdown_proj.weight", lp), m->H, I, d))) return rc;
    return 0;
}

static int bind_moe(binder *b, const char *lp, moe_weights *w) {
    model *m = b->m;
    const model_config *c = &m->cfg;
    char name[512];
    int rc, E = c->n_experts, Im = c->moe_intermediate_size, H = m->H;
    if ((rc = bind_mat(b, NAME("%smlp.gate.weight", lp), E, H, &w->router))) return rc;
    w->gate = xcalloc((size_t)E, sizeof(wmat));
    w->up = xcalloc((size_t)E, sizeof(wmat));
    w->down = xcalloc((size_t)E, sizeof(wmat));
    const st_tensor *gu = st_find(m->st, NAME("%smlp.experts.gate_up_proj", lp));
    if (gu) {
        /* fused: gate_up_proj [E, 2*Im, H] (rows 0..Im-1 gate, Im..2Im-1 up), down_proj [E, H, Im] */
        const st_tensor *t, *dn;
        int64_t s1[3] = {E, 2 * Im, H}, s2[3] = {E, H, Im};
        if ((rc = find_checked(b, name, 3, s1, &t))) return rc;
        if ((rc = find_checked(b, NAME("%smlp.experts.down_proj", lp), 3, s2, &dn))) return rc;
        if (dn->dtype != t->dtype)
            return ci_err(b->err, b->errlen, CINFER_EFORMAT, "tensor \"%s\": dtype %s differs from gate_up_proj's %s", name,
                          st_dtype_name(dn->dtype), st_dtype_name(t->dtype));
        size_t es = st_dtype_size(t->dtype);
        for (int e = 0; e < E; e++) {
            const char *base = (const char *)t->data + (size_t)e * 2 * Im * H * es;
            w->gate[e] = (wmat){base, wtype_of(t->dtype), Im, H};
            w->up[e] = (wmat){base + (size_t)Im * H * es, wtype_of(t->dtype), Im, H};
            w->down[e] = (wmat){(const char *)dn->data + (size_t)e * H * Im * es, wtype_of(dn->dtype), H, Im};
        }
    } else {
        for (int e = 0; e < E; e++) {
            char ep[400];
            snprintf(ep, sizeof ep, "%smlp.experts.%d.", lp, e);
            if ((rc = bind_dense_mlp(b, ep, Im, &w->gate[e], &w->up[e], &w->down[e]))) return rc;
        }
    }
    int Is = c->shared_expert_intermediate_size;
    if (Is > 0) {
        char sp[400];
        snprintf(sp, sizeof sp, "%smlp.shared_expert.", lp);
        if ((rc = bind_dense_mlp(b, sp, Is, &w->sh_gate, &w->sh_up, &w->sh_down))) return rc;
        if ((rc = bind_mat(b, NAME("%smlp.shared_expert_gate.weight", lp), 1, H, &w->sh_gate_w))) return rc;
    }
    return 0;
}

static int bind_ffn(binder *b, const char *lp, int moe, layer_weights *lw) {
    char p[400];
    lw->moe = moe;
    if (moe) return bind_moe(b, lp, &lw->moe_w);
    if (b->m->cfg.intermediate_size <= 0)
        return ci_err(b->err, b->errlen, CINFER_EFORMAT, "config.json: intermediate_size is needed for a dense layer");
    snprintf(p, sizeof p, "%smlp.", lp);
    return bind_dense_mlp(b, p, b->m->cfg.intermediate_size, &lw->mlp_gate, &lw->mlp_up, &lw->mlp_down);
}

static int bind_layer(binder *b, int i, layer_weights *lw) {
    model *m = b->m;
    char lp[256], name[512];
    int rc;
    snprintf(lp, sizeof lp, "%slayers.%d.", b->prefix, i);
    lw->type = m->cfg.layer_types[i];
    if ((rc = bind_vec(b, NAME("%sinput_layernorm.weight", lp), m->H, VEC_ONE_PLUS, &lw->in_norm))) return rc;
    if ((rc = bind_vec(b, NAME("%spost_attention_layernorm.weight", lp), m->H, VEC_ONE_PLUS, &lw->post_norm))) return rc;
    rc = lw->type == LAYER_LINEAR ? bind_deltanet(b, lp, lw) : bind_attention(b, lp, lw);
    if (rc) return rc;
    return bind_ffn(b, lp, config_layer_is_moe(&m->cfg, i), lw);
}

/* MTP head: fc, its two pre-norms, a final norm, and one full-attention layer (dense MLP or MoE). */
static int bind_mtp(binder *b) {
    model *m = b->m;
    char name[512];
    int rc;
    if (!st_find(m->st, "mtp.fc.weight")) return 0;
    mtp_weights *t = &m->mtp;
    t->present = 1;
    if ((rc = bind_mat(b, "mtp.fc.weight", m->H, 2 * m->H, &t->fc))) return rc;
    const char *norms[3] = {"mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight"};
    float **slots[3] = {&t->pre_fc_norm_embedding, &t->pre_fc_norm_hidden, &t->norm};
    for (int i = 0; i < 3; i++) /* all MTP norms are zero-centred like the main model's (spec §5) */
        if ((rc = bind_vec(b, norms[i], m->H, VEC_ONE_PLUS, slots[i]))) return rc;
    layer_weights *lw = &t->layer;
    lw->type = LAYER_FULL;
    const char *lp = "mtp.layers.0.";
    if ((rc = bind_vec(b, NAME("%sinput_layernorm.weight", lp), m->H, VEC_ONE_PLUS, &lw->in_norm))) return rc;
    if ((rc = bind_vec(b, NAME("%spost_attention_layernorm.weight", lp), m->H, VEC_ONE_PLUS, &lw->post_norm))) return rc;
    if ((rc = bind_attention(b, lp, lw))) return rc;
    return bind_ffn(b, lp, m->cfg.n_experts > 0, lw);
}

/* A small matrix ([rows, cols] of any float dtype) copied to f32. */
static int bind_f32_mat(binder *b, const char *name, int rows, int cols, float **out) {
    const st_tensor *t;
    int64_t shape[2] = {rows, cols};
    int rc = find_checked(b, name, 2, shape, &t);
    if (rc) return rc;
    float *v = arena_floats(b->m, (size_t)rows * cols);
    for (int64_t i = 0; i < (int64_t)rows * cols; i++) v[i] = elem_f32(t, i);
    *out = v;
    return 0;
}

/* Weight and bias of a Linear: [rows, cols] and [rows]. */
static int bind_linear(binder *b, const char *pfx, int rows, int cols, wmat *w, float **bias) {
    char name[512];
    int rc;
    if ((rc = bind_mat(b, NAME("%s.weight", pfx), rows, cols, w))) return rc;
    return bind_vec(b, NAME("%s.bias", pfx), rows, VEC_PLAIN, bias);
}

static int bind_layernorm(binder *b, const char *pfx, int n, float **w, float **bias) {
    char name[512];
    int rc;
    if ((rc = bind_vec(b, NAME("%s.weight", pfx), n, VEC_PLAIN, w))) return rc;
    return bind_vec(b, NAME("%s.bias", pfx), n, VEC_PLAIN, bias);
}

/* model.visual.* (spec §6.2). Absent tensors with a vision_config mean a text-only extraction: no tower. */
static int bind_vision(binder *b) {
    model *m = b->m;
    const model_config *c = &m->cfg;
    vision_weights *v = &m->vis;
    char name[512], p[256];
    int rc;
    if (!c->has_vision || !st_find(m->st, "model.visual.patch_embed.proj.weight")) return 0;
    v->D = c->vis_hidden;
    v->heads = c->vis_heads;
    v->head_dim = c->vis_hidden / c->vis_heads;
    v->I = c->vis_intermediate;
    v->depth = c->vis_depth;
    v->patch = c->vis_patch;
    v->temporal = c->vis_temporal;
    v->merge = c->vis_merge;
    v->in_ch = c->vis_in_channels;
    v->patch_dim = v->in_ch * v->temporal * v->patch * v->patch;
    v->out_hidden = c->vis_out_hidden;
    for (v->grid_side = 0; (v->grid_side + 1) * (v->grid_side + 1) <= c->vis_num_pos;) v->grid_side++;
    if (v->out_hidden != m->H)
        return ci_err(b->err, b->errlen, CINFER_EFORMAT,
                      "config.json: vision_config.out_hidden_size %d differs from the text hidden size %d", v->out_hidden,
                      m->H);
    int D = v->D, J = D * v->merge * v->merge;
    const st_tensor *t;
    int64_t pshape[5] = {D, v->in_ch, v->temporal, v->patch, v->patch};
    if ((rc = find_checked(b, "model.visual.patch_embed.proj.weight", 5, pshape, &t))) return rc;
    v->patch_w = (wmat){t->data, wtype_of(t->dtype), D, v->patch_dim};
    if ((rc = bind_vec(b, "model.visual.patch_embed.proj.bias", D, VEC_PLAIN, &v->patch_b))) return rc;
    if ((rc = bind_f32_mat(b, "model.visual.pos_embed.weight", c->vis_num_pos, D, &v->pos))) return rc;
    v->blocks = xcalloc((size_t)(v->depth > 0 ? v->depth : 1), sizeof *v->blocks);
    for (int i = 0; i < v->depth; i++) {
        vision_block_weights *bw = &v->blocks[i];
        snprintf(p, sizeof p, "model.visual.blocks.%d.", i);
        if ((rc = bind_layernorm(b, NAME("%snorm1", p), D, &bw->norm1_w, &bw->norm1_b)) ||
            (rc = bind_layernorm(b, NAME("%snorm2", p), D, &bw->norm2_w, &bw->norm2_b)) ||
            (rc = bind_linear(b, NAME("%sattn.qkv", p), 3 * D, D, &bw->qkv, &bw->qkv_b)) ||
            (rc = bind_linear(b, NAME("%sattn.proj", p), D, D, &bw->proj, &bw->proj_b)) ||
            (rc = bind_linear(b, NAME("%smlp.linear_fc1", p), v->I, D, &bw->fc1, &bw->fc1_b)) ||
            (rc = bind_linear(b, NAME("%smlp.linear_fc2", p), D, v->I, &bw->fc2, &bw->fc2_b)))
            return rc;
    }
    if ((rc = bind_layernorm(b, "model.visual.merger.norm", D, &v->mnorm_w, &v->mnorm_b)) ||
        (rc = bind_linear(b, "model.visual.merger.linear_fc1", J, J, &v->mfc1, &v->mfc1_b)) ||
        (rc = bind_linear(b, "model.visual.merger.linear_fc2", v->out_hidden, J, &v->mfc2, &v->mfc2_b)))
        return rc;
    /* Qwen3_5VisionRotaryEmbedding(head_dim / 2): inv_freq[i] = 1 / theta^(2i / (head_dim/2)), in f32 */
    int rd = v->head_dim / 2;
    v->inv_freq = arena_floats(m, (size_t)rd / 2);
    for (int i = 0; i < rd / 2; i++) v->inv_freq[i] = 1.0f / powf((float)c->vis_rope_theta, (float)(2 * i) / (float)rd);
    v->present = 1;
    return 0;
}

static void free_layer(layer_weights *lw) {
    free(lw->moe_w.gate);
    free(lw->moe_w.up);
    free(lw->moe_w.down);
}

void model_free(model *m) {
    if (!m) return;
    if (m->layers)
        for (int i = 0; i < m->L; i++) free_layer(&m->layers[i]);
    free_layer(&m->mtp.layer);
    free(m->vis.blocks);
    free(m->layers);
    free(m->lin_index);
    free(m->full_index);
    for (arena_block *b = m->f32_pool; b;) {
        arena_block *n = b->next;
        free(b);
        b = n;
    }
    st_close(m->st);
    free(m);
}

static int bind_all(binder *b) {
    model *m = b->m;
    const model_config *c = &m->cfg;
    char name[512];
    int rc;
    if (st_find(m->st, "model.language_model.embed_tokens.weight")) b->prefix = "model.language_model.";
    else if (st_find(m->st, "model.embed_tokens.weight")) b->prefix = "model.";
    else
        return ci_err(b->err, b->errlen, CINFER_ENOTFOUND,
                      "missing tensor \"%sembed_tokens.weight\" (looked for model.language_model. and model. prefixes)",
                      c->multimodal ? "model.language_model." : "model.");
    if ((rc = bind_mat(b, NAME("%sembed_tokens.weight", b->prefix), m->V, m->H, &m->embed))) return rc;
    if ((rc = bind_vec(b, NAME("%snorm.weight", b->prefix), m->H, VEC_ONE_PLUS, &m->final_norm))) return rc;
    if (st_find(m->st, "lm_head.weight")) {
        if ((rc = bind_mat(b, "lm_head.weight", m->V, m->H, &m->lm_head))) return rc;
    } else if (c->tie_word_embeddings) {
        m->lm_head = m->embed;
    } else {
        return ci_err(b->err, b->errlen, CINFER_ENOTFOUND,
                      "missing tensor \"lm_head.weight\" (config.json says tie_word_embeddings is false)");
    }
    m->layers = xcalloc((size_t)m->L, sizeof(layer_weights));
    for (int i = 0; i < m->L; i++)
        if ((rc = bind_layer(b, i, &m->layers[i]))) return rc;
    if ((rc = bind_mtp(b))) return rc;
    if ((rc = bind_vision(b))) return rc;
    return 0;
}

static int64_t wmat_bytes(const wmat *w) {
    return w->data ? (int64_t)w->rows * w->cols * (w->type == WT_F32 ? 4 : 2) : 0;
}

/* Bytes one decode token streams: every layer's matrices, only k of E experts, and the lm_head. */
static int64_t decode_bytes(const model *m) {
    int64_t b = wmat_bytes(&m->lm_head);
    for (int i = 0; i < m->L; i++) {
        const layer_weights *l = &m->layers[i];
        const wmat *mats[] = {&l->in_qkv, &l->in_z, &l->in_b, &l->in_a, &l->in_qkvz, &l->in_ba, &l->out_proj,
                              &l->q_proj, &l->k_proj, &l->v_proj, &l->o_proj, &l->mlp_gate, &l->mlp_up, &l->mlp_down,
                              &l->moe_w.router, &l->moe_w.sh_gate, &l->moe_w.sh_up, &l->moe_w.sh_down, &l->moe_w.sh_gate_w};
        for (size_t j = 0; j < sizeof mats / sizeof mats[0]; j++) b += wmat_bytes(mats[j]);
        if (l->moe && m->cfg.n_experts > 0) {
            int64_t e = wmat_bytes(&l->moe_w.gate[0]) + wmat_bytes(&l->moe_w.up[0]) + wmat_bytes(&l->moe_w.down[0]);
            b += e * m->cfg.n_experts_per_tok;
        }
    }
    return b;
}

/* A number field of generation_config.json within [lo, hi], else -1 (absent, null or out of range: ignored,
 * as the file is advisory). */
static float gen_number(json_t *root, const char *key, double lo, double hi) {
    json_t *v = json_object_get(root, key);
    if (!json_is_number(v)) return -1;
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) {
        LOG_W("generation_config.json: %s = %g is outside [%g, %g], ignored", key, x, lo, hi);
        return -1;
    }
    return (float)x;
}

/* generation_config.json: its eos_token_id (int or list) overrides config.json's, as transformers does; its
 * sampling fields become the defaults of requests that name none (what vLLM does with --generation-config
 * auto, its default): a small model's card values (e.g. repetition_penalty) are part of how it is meant to
 * be run. */
static void load_generation_config(model *m, const char *dir) {
    for (int i = 0; i < m->cfg.n_eos; i++) m->eos_ids[i] = m->cfg.eos_token_ids[i];
    m->n_eos = m->cfg.n_eos;
    m->gen_temperature = m->gen_top_p = m->gen_min_p = m->gen_repetition_penalty = -1;
    m->gen_top_k = -1;
    char *path = path_join(dir, "generation_config.json"), *text = NULL;
    size_t len;
    char e[256];
    if (file_read_all(path, 1 << 20, &text, &len, e, sizeof e) == 0) {
        json_error_t je;
        json_t *root = json_loadb(text, len, 0, &je);
        json_t *eos = root ? json_object_get(root, "eos_token_id") : NULL;
        if (json_is_integer(eos)) {
            m->eos_ids[0] = (int)json_integer_value(eos);
            m->n_eos = 1;
        } else if (json_is_array(eos) && json_array_size(eos) <= CONFIG_MAX_EOS) {
            int n = 0;
            for (size_t i = 0; i < json_array_size(eos); i++)
                if (json_is_integer(json_array_get(eos, i))) m->eos_ids[n++] = (int)json_integer_value(json_array_get(eos, i));
            m->n_eos = n;
        } else if (!root) {
            LOG_W("%s: not valid JSON (%s), ignored", path, je.text);
        }
        if (json_is_object(root)) {
            m->gen_temperature = gen_number(root, "temperature", 0, 100);
            m->gen_top_p = gen_number(root, "top_p", 1e-9, 1);
            m->gen_min_p = gen_number(root, "min_p", 0, 1);
            m->gen_repetition_penalty = gen_number(root, "repetition_penalty", 1e-6, 10);
            float k = gen_number(root, "top_k", 0, 1 << 30);
            m->gen_top_k = k < 0 ? -1 : (int)k;
        }
        json_decref(root);
        free(text);
    }
    free(path);
}

static const char *arch_str(model_arch a) {
    return a == ARCH_QWEN35 ? "qwen3_5" : a == ARCH_QWEN35_MOE ? "qwen3_5_moe" : "qwen3_next";
}

int model_load(const char *dir, model **out, char *err, size_t errlen) {
    model *m = xcalloc(1, sizeof *m);
    int rc = config_load(dir, &m->cfg, err, errlen);
    if (rc) {
        free(m);
        return rc;
    }
    const model_config *c = &m->cfg;
    m->H = c->hidden_size;
    m->V = c->vocab_size;
    m->L = c->n_layers;
    m->Hq = c->n_heads;
    m->Hkv = c->n_kv_heads;
    m->hd = c->head_dim;
    m->Hk = c->lin_n_key_heads;
    m->Hv = c->lin_n_value_heads;
    m->dk = c->lin_key_head_dim;
    m->dv = c->lin_value_head_dim;
    m->K = c->lin_conv_kernel;
    m->C = 2 * m->Hk * m->dk + m->Hv * m->dv;
    snprintf(m->arch_name, sizeof m->arch_name, "%s", arch_str(c->arch));
    m->lin_index = xmalloc((size_t)m->L * sizeof(int));
    m->full_index = xmalloc((size_t)m->L * sizeof(int));
    for (int i = 0; i < m->L; i++) {
        int full = c->layer_types[i] == LAYER_FULL;
        m->lin_index[i] = full ? -1 : m->n_lin++;
        m->full_index[i] = full ? m->n_full++ : -1;
        m->layer_map[i] = full ? 'F' : 'L';
    }
    m->layer_map[m->L] = 0;

    if ((rc = st_open_dir(dir, &m->st, err, errlen))) {
        model_free(m);
        return rc;
    }
    binder b = {m, NULL, xcalloc((size_t)m->st->n_tensors + 1, 1), err, errlen};
    rc = bind_all(&b);
    if (rc) {
        ci_err_prefix(err, errlen, "%s", dir);
        free(b.used);
        model_free(m);
        return rc;
    }
    /* Account every tensor: bound ones count as parameters; model.visual.* and anything unknown are
     * reported (unknown ones with a warning: a checkpoint with extra tensors still loads). */
    int unknown = 0;
    for (int i = 0; i < m->st->n_tensors; i++) {
        const st_tensor *t = m->st->index[i];
        m->n_params_total += t->numel;
        m->bytes_by_dtype[t->dtype] += (int64_t)(t->end - t->begin);
        int is_mtp = !strncmp(t->name, "mtp.", 4), is_vis = !strncmp(t->name, "model.visual.", 13);
        if (is_vis) m->n_visual++;
        else if (b.used[i] && !is_mtp) m->n_params += t->numel;
        if (!b.used[i] && !is_vis) {
            if (unknown++ < 5) LOG_W("%s: tensor \"%s\" is not used by the model", dir, t->name);
        }
    }
    if (unknown > 5) LOG_W("%s: %d tensors in all are not used by the model", dir, unknown);
    free(b.used);
    m->bytes_per_token = decode_bytes(m);
    load_generation_config(m, dir);
    *out = m;
    return 0;
}

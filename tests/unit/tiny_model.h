/* tiny_model.h — writes small random checkpoints of each architecture for the model tests (the oracle
 * fixtures cover parity with transformers; these cover batching, state handling and malformed files).
 * Options let a test break one thing at a time: drop a tensor, change a shape or dtype. */
#ifndef CI_TINY_MODEL_H
#define CI_TINY_MODEL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/st_writer.h"
#include "util/bf16.h"

typedef struct tiny_opts {
    int arch;            /* 1 dense qwen3_5_text, 2 qwen3_5_moe_text (fused experts), 3 qwen3_next, 4 moe per-expert */
    int H, L, V, Hq, Hkv, hd, Hk, Hv, dk, dv, I, E, k, Im, Is;
    int tie;
    int multimodal;      /* write a qwen3_5 wrapper config and model.language_model. names */
    const char *drop;    /* name of a tensor to leave out */
    const char *reshape; /* name of a tensor whose first dim gets +1 */
    const char *i32;     /* name of a tensor written as I32 */
    uint64_t seed;
    int vision;          /* with multimodal: a 1-block vision tower (D 16, 2 heads, 4x4 positions) and token ids
                            vision_start V-6, vision_end V-5, image_pad V-4, video_pad V-3 */
    int mtp;             /* an MTP head (mtp.*: fc, three norms, one full-attention layer of the arch's FFN kind) */
} tiny_opts;

static tiny_opts tiny_default(int arch) {
    tiny_opts o = {arch, 64, 4, 97, 4, 2, 32, 2, 4, 16, 16, 96, 0, 0, 0, 0, 1, 0, NULL, NULL, NULL, 7};
    if (arch != 1) {
        o.E = 6;
        o.k = 2;
        o.Im = 32;
        o.Is = 48;
    }
    return o;
}

typedef struct tiny_t {
    st_wtensor w;
    float scale;
    float offset;
} tiny_t;

typedef struct tiny_set {
    tiny_t t[512];
    int n;
    uint64_t seed;
} tiny_set;

static void tiny_add(tiny_set *s, const tiny_opts *o, const char *name, int ndim, int64_t a, int64_t b, int64_t c,
                     float scale, float offset) {
    if (o->drop && !strcmp(o->drop, name)) return;
    tiny_t *t = &s->t[s->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->w.name, sizeof t->w.name, "%s", name);
    t->w.dtype = o->i32 && !strcmp(o->i32, name) ? ST_I32 : ST_BF16;
    t->w.ndim = ndim;
    t->w.shape[0] = a + (o->reshape && !strcmp(o->reshape, name) ? 1 : 0);
    t->w.shape[1] = b;
    t->w.shape[2] = c;
    t->scale = scale;
    t->offset = offset;
}

static void tiny_fill(void *ud, int idx, uint64_t off, void *buf, size_t nb) {
    tiny_set *s = ud;
    tiny_t *t = &s->t[idx];
    uint64_t x = (s->seed + 1) * 0x9e3779b97f4a7c15ull ^ ((uint64_t)(idx + 1) << 20) ^ off;
    size_t es = st_dtype_size(t->w.dtype);
    for (size_t i = 0; i < nb / es; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        float u = (float)((x >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
        float v = t->offset + t->scale * u;
        if (es == 2) ((uint16_t *)buf)[i] = f32_to_bf16(v);
        else memcpy((char *)buf + 4 * i, &v, 4);
    }
}

/* One decoder layer's tensors under prefix lp: DeltaNet or (full) gated attention, then the arch's FFN. */
static void tiny_layer(tiny_set *s, const tiny_opts *o, const char *lp, int full) {
    char nm[256];
    int next = o->arch == 3, moe = o->arch != 1;
    int kd = o->Hk * o->dk, vd = o->Hv * o->dv, C = 2 * kd + vd;
    float ws = 0.25f; /* wide enough that logits spread */
#define N(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)
    tiny_add(s, o, N("%sinput_layernorm.weight", lp), 1, o->H, 0, 0, 0.2f, 0);
    tiny_add(s, o, N("%spost_attention_layernorm.weight", lp), 1, o->H, 0, 0, 0.2f, 0);
    if (!full) {
        if (next) {
            tiny_add(s, o, N("%slinear_attn.in_proj_qkvz.weight", lp), 2, 2 * kd + 2 * vd, o->H, 0, ws, 0);
            tiny_add(s, o, N("%slinear_attn.in_proj_ba.weight", lp), 2, 2 * o->Hv, o->H, 0, ws, 0);
        } else {
            tiny_add(s, o, N("%slinear_attn.in_proj_qkv.weight", lp), 2, C, o->H, 0, ws, 0);
            tiny_add(s, o, N("%slinear_attn.in_proj_z.weight", lp), 2, vd, o->H, 0, ws, 0);
            tiny_add(s, o, N("%slinear_attn.in_proj_b.weight", lp), 2, o->Hv, o->H, 0, ws, 0);
            tiny_add(s, o, N("%slinear_attn.in_proj_a.weight", lp), 2, o->Hv, o->H, 0, ws, 0);
        }
        tiny_add(s, o, N("%slinear_attn.conv1d.weight", lp), 3, C, 1, 4, 0.5f, 0);
        tiny_add(s, o, N("%slinear_attn.A_log", lp), 1, o->Hv, 0, 0, 1.0f, 0.5f);
        tiny_add(s, o, N("%slinear_attn.dt_bias", lp), 1, o->Hv, 0, 0, 0.5f, 0);
        tiny_add(s, o, N("%slinear_attn.norm.weight", lp), 1, o->dv, 0, 0, 0.2f, 1.0f);
        tiny_add(s, o, N("%slinear_attn.out_proj.weight", lp), 2, o->H, vd, 0, ws, 0);
    } else {
        tiny_add(s, o, N("%sself_attn.q_proj.weight", lp), 2, o->Hq * 2 * o->hd, o->H, 0, ws, 0);
        tiny_add(s, o, N("%sself_attn.k_proj.weight", lp), 2, o->Hkv * o->hd, o->H, 0, ws, 0);
        tiny_add(s, o, N("%sself_attn.v_proj.weight", lp), 2, o->Hkv * o->hd, o->H, 0, ws, 0);
        tiny_add(s, o, N("%sself_attn.o_proj.weight", lp), 2, o->H, o->Hq * o->hd, 0, ws, 0);
        tiny_add(s, o, N("%sself_attn.q_norm.weight", lp), 1, o->hd, 0, 0, 0.2f, 0);
        tiny_add(s, o, N("%sself_attn.k_norm.weight", lp), 1, o->hd, 0, 0, 0.2f, 0);
    }
    if (moe) {
        tiny_add(s, o, N("%smlp.gate.weight", lp), 2, o->E, o->H, 0, ws, 0);
        if (o->arch == 2) {
            tiny_add(s, o, N("%smlp.experts.gate_up_proj", lp), 3, o->E, 2 * o->Im, o->H, ws, 0);
            tiny_add(s, o, N("%smlp.experts.down_proj", lp), 3, o->E, o->H, o->Im, ws, 0);
        } else {
            for (int e = 0; e < o->E; e++) {
                tiny_add(s, o, N("%smlp.experts.%d.gate_proj.weight", lp, e), 2, o->Im, o->H, 0, ws, 0);
                tiny_add(s, o, N("%smlp.experts.%d.up_proj.weight", lp, e), 2, o->Im, o->H, 0, ws, 0);
                tiny_add(s, o, N("%smlp.experts.%d.down_proj.weight", lp, e), 2, o->H, o->Im, 0, ws, 0);
            }
        }
        tiny_add(s, o, N("%smlp.shared_expert.gate_proj.weight", lp), 2, o->Is, o->H, 0, ws, 0);
        tiny_add(s, o, N("%smlp.shared_expert.up_proj.weight", lp), 2, o->Is, o->H, 0, ws, 0);
        tiny_add(s, o, N("%smlp.shared_expert.down_proj.weight", lp), 2, o->H, o->Is, 0, ws, 0);
        tiny_add(s, o, N("%smlp.shared_expert_gate.weight", lp), 2, 1, o->H, 0, ws, 0);
    } else {
        tiny_add(s, o, N("%smlp.gate_proj.weight", lp), 2, o->I, o->H, 0, ws, 0);
        tiny_add(s, o, N("%smlp.up_proj.weight", lp), 2, o->I, o->H, 0, ws, 0);
        tiny_add(s, o, N("%smlp.down_proj.weight", lp), 2, o->H, o->I, 0, ws, 0);
    }
#undef N
}

/* Writes dir/config.json and dir/model.safetensors. Returns 0 on success. */
static int tiny_write(const char *dir, const tiny_opts *o) {
    static tiny_set s;
    memset(&s, 0, sizeof s);
    s.seed = o->seed;
    mkdir(dir, 0755);
    const char *P = o->multimodal ? "model.language_model." : "model.";
    char nm[256];
    int next = o->arch == 3, moe = o->arch != 1;
    float ws = 0.25f; /* wide enough that logits spread */
#define N(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)
    tiny_add(&s, o, N("%sembed_tokens.weight", P), 2, o->V, o->H, 0, 1.0f, 0);
    if (!o->tie) tiny_add(&s, o, "lm_head.weight", 2, o->V, o->H, 0, ws, 0);
    tiny_add(&s, o, N("%snorm.weight", P), 1, o->H, 0, 0, 0.2f, 0);
    for (int i = 0; i < o->L; i++) {
        char lp[128];
        snprintf(lp, sizeof lp, "%slayers.%d.", P, i);
        tiny_layer(&s, o, lp, (i + 1) % 2 == 0); /* pattern L F L F */
    }
    if (o->mtp) {
        tiny_add(&s, o, "mtp.fc.weight", 2, o->H, 2 * o->H, 0, ws, 0);
        tiny_add(&s, o, "mtp.pre_fc_norm_embedding.weight", 1, o->H, 0, 0, 0.2f, 0);
        tiny_add(&s, o, "mtp.pre_fc_norm_hidden.weight", 1, o->H, 0, 0, 0.2f, 0);
        tiny_add(&s, o, "mtp.norm.weight", 1, o->H, 0, 0, 0.2f, 0);
        tiny_layer(&s, o, "mtp.layers.0.", 1);
    }
    if (o->vision) {
        const int D = 16, VI = 32, J = D * 4;
        tiny_add(&s, o, "model.visual.patch_embed.proj.weight", 3, D, 3, 2, 0.05f, 0);
        s.t[s.n - 1].w.ndim = 5; /* [D, 3, 2, 16, 16] */
        s.t[s.n - 1].w.shape[3] = 16;
        s.t[s.n - 1].w.shape[4] = 16;
        tiny_add(&s, o, "model.visual.patch_embed.proj.bias", 1, D, 0, 0, 0.1f, 0);
        tiny_add(&s, o, "model.visual.pos_embed.weight", 2, 16, D, 0, 0.5f, 0);
        const char *bp = "model.visual.blocks.0.";
        tiny_add(&s, o, N("%snorm1.weight", bp), 1, D, 0, 0, 0.1f, 1.0f);
        tiny_add(&s, o, N("%snorm1.bias", bp), 1, D, 0, 0, 0.1f, 0);
        tiny_add(&s, o, N("%snorm2.weight", bp), 1, D, 0, 0, 0.1f, 1.0f);
        tiny_add(&s, o, N("%snorm2.bias", bp), 1, D, 0, 0, 0.1f, 0);
        tiny_add(&s, o, N("%sattn.qkv.weight", bp), 2, 3 * D, D, 0, 0.4f, 0);
        tiny_add(&s, o, N("%sattn.qkv.bias", bp), 1, 3 * D, 0, 0, 0.1f, 0);
        tiny_add(&s, o, N("%sattn.proj.weight", bp), 2, D, D, 0, 0.4f, 0);
        tiny_add(&s, o, N("%sattn.proj.bias", bp), 1, D, 0, 0, 0.1f, 0);
        tiny_add(&s, o, N("%smlp.linear_fc1.weight", bp), 2, VI, D, 0, 0.4f, 0);
        tiny_add(&s, o, N("%smlp.linear_fc1.bias", bp), 1, VI, 0, 0, 0.1f, 0);
        tiny_add(&s, o, N("%smlp.linear_fc2.weight", bp), 2, D, VI, 0, 0.3f, 0);
        tiny_add(&s, o, N("%smlp.linear_fc2.bias", bp), 1, D, 0, 0, 0.1f, 0);
        tiny_add(&s, o, "model.visual.merger.norm.weight", 1, D, 0, 0, 0.1f, 1.0f);
        tiny_add(&s, o, "model.visual.merger.norm.bias", 1, D, 0, 0, 0.1f, 0);
        tiny_add(&s, o, "model.visual.merger.linear_fc1.weight", 2, J, J, 0, 0.2f, 0);
        tiny_add(&s, o, "model.visual.merger.linear_fc1.bias", 1, J, 0, 0, 0.1f, 0);
        tiny_add(&s, o, "model.visual.merger.linear_fc2.weight", 2, o->H, J, 0, 0.2f, 0);
        tiny_add(&s, o, "model.visual.merger.linear_fc2.bias", 1, o->H, 0, 0, 0.1f, 0);
    }
#undef N
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st_wtensor w[512];
    for (int i = 0; i < s.n; i++) w[i] = s.t[i].w;
    if (st_write_file(path, w, s.n, tiny_fill, &s, err, sizeof err)) {
        fprintf(stderr, "tiny_write: %s\n", err);
        return -1;
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    const char *type = o->arch == 1 ? "qwen3_5_text" : o->arch == 3 ? "qwen3_next" : "qwen3_5_moe_text";
    char body[2048];
    int n = snprintf(body, sizeof body,
                     "\"hidden_size\": %d, \"num_hidden_layers\": %d, \"vocab_size\": %d, \"num_attention_heads\": %d,"
                     " \"num_key_value_heads\": %d, \"head_dim\": %d, \"linear_num_key_heads\": %d,"
                     " \"linear_num_value_heads\": %d, \"linear_key_head_dim\": %d, \"linear_value_head_dim\": %d,"
                     " \"linear_conv_kernel_dim\": 4, \"full_attention_interval\": 2, \"rms_norm_eps\": 1e-6,"
                     " \"tie_word_embeddings\": %s, \"eos_token_id\": %d, \"intermediate_size\": %d",
                     o->H, o->L, o->V, o->Hq, o->Hkv, o->hd, o->Hk, o->Hv, o->dk, o->dv, o->tie ? "true" : "false", o->V - 1, o->I);
    if (moe)
        n += snprintf(body + n, sizeof body - (size_t)n,
                      ", \"num_experts\": %d, \"num_experts_per_tok\": %d, \"moe_intermediate_size\": %d,"
                      " \"shared_expert_intermediate_size\": %d",
                      o->E, o->k, o->Im, o->Is);
    if (next)
        n += snprintf(body + n, sizeof body - (size_t)n,
                      ", \"rope_theta\": 10000.0, \"partial_rotary_factor\": 0.5, \"norm_topk_prob\": true,"
                      " \"decoder_sparse_step\": 1, \"mlp_only_layers\": []");
    else
        n += snprintf(body + n, sizeof body - (size_t)n,
                      ", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0,"
                      " \"partial_rotary_factor\": 0.5, \"mrope_section\": [2, 2, 4], \"mrope_interleaved\": true}");
    char vis[1024] = "";
    if (o->vision)
        snprintf(vis, sizeof vis,
                 ", \"vision_config\": {\"depth\": 1, \"hidden_size\": 16, \"intermediate_size\": 32, \"num_heads\": 2,"
                 " \"in_channels\": 3, \"patch_size\": 16, \"temporal_patch_size\": 2, \"spatial_merge_size\": 2,"
                 " \"out_hidden_size\": %d, \"num_position_embeddings\": 16, \"hidden_act\": \"gelu_pytorch_tanh\"},"
                 " \"vision_start_token_id\": %d, \"vision_end_token_id\": %d, \"image_token_id\": %d, \"video_token_id\": %d",
                 o->H, o->V - 6, o->V - 5, o->V - 4, o->V - 3);
    if (o->multimodal)
        fprintf(f, "{\"model_type\": \"%s\", \"tie_word_embeddings\": %s, \"text_config\": {\"model_type\": \"%s_text\", %s}%s}\n",
                o->arch == 1 ? "qwen3_5" : "qwen3_5_moe", o->tie ? "true" : "false", o->arch == 1 ? "qwen3_5" : "qwen3_5_moe",
                body, vis);
    else
        fprintf(f, "{\"model_type\": \"%s\", %s}\n", type, body);
    fclose(f);
    return 0;
}

#endif

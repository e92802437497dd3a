/* qwen35.h — the immutable model: config, tokenizer-free weights bound by name from the safetensors set
 * (pointers into the mmaps; only small vectors are converted to f32 copies), for qwen3_5, qwen3_5_moe and
 * qwen3_next. One bind function per architecture; each checks every tensor's dtype and shape. */
#ifndef CI_QWEN35_H
#define CI_QWEN35_H

#include <stdint.h>

#include "backend/cpu/matmul.h"
#include "io/config.h"
#include "io/safetensors.h"

/* A weight matrix in HF [rows = out, cols = in] layout, bf16/f16/f32, pointing into the mmap. */
typedef struct wmat {
    const void *data;
    wtype type;
    int rows, cols;
} wmat;

typedef struct moe_weights {
    wmat router;          /* [E, H] */
    wmat *gate, *up;      /* [E] each [Im, H] (views into fused gate_up_proj or per-expert tensors) */
    wmat *down;           /* [E] each [H, Im] */
    wmat sh_gate, sh_up;  /* [Is, H]; rows == 0 when there is no shared expert */
    wmat sh_down;         /* [H, Is] */
    wmat sh_gate_w;       /* shared_expert_gate [1, H] */
} moe_weights;

typedef struct layer_weights {
    int type;             /* LAYER_LINEAR or LAYER_FULL */
    int moe;              /* FFN is MoE */
    float *in_norm;       /* [H] f32, 1 + w (zero-centred) */
    float *post_norm;     /* [H] f32, 1 + w */

    /* Gated DeltaNet (linear) */
    int fused_qkvz;       /* Qwen3-Next: in_proj_qkvz / in_proj_ba grouped per key head */
    wmat in_qkv;          /* [C, H]          (Qwen3.5) */
    wmat in_z;            /* [Hv*dv, H]      (Qwen3.5) */
    wmat in_b, in_a;      /* [Hv, H]         (Qwen3.5) */
    wmat in_qkvz;         /* [2*Hk*dk + 2*Hv*dv, H] (Qwen3-Next) */
    wmat in_ba;           /* [2*Hv, H]       (Qwen3-Next) */
    float *conv_w;        /* [K][C] f32: conv1d.weight [C, 1, K] transposed, so a tap is contiguous over channels */
    float *A;             /* [Hv] f32: -exp(A_log) */
    float *dt_bias;       /* [Hv] f32 */
    float *gnorm;         /* [dv] f32, plain w (gated norm) */
    wmat out_proj;        /* [H, Hv*dv] */

    /* gated full attention */
    wmat q_proj;          /* [Hq*2*hd, H]: per head hd query rows then hd gate rows */
    wmat k_proj, v_proj;  /* [Hkv*hd, H] */
    wmat o_proj;          /* [H, Hq*hd] */
    float *q_norm, *k_norm; /* [hd] f32, 1 + w */

    /* FFN */
    wmat mlp_gate, mlp_up; /* [I, H] */
    wmat mlp_down;         /* [H, I] */
    moe_weights moe_w;
} layer_weights;

/* The MTP head (spec §5), run by mtp.c. */
typedef struct mtp_weights {
    int present;
    wmat fc;               /* [H, 2H]: input [normed embedding | normed hidden] */
    float *pre_fc_norm_embedding, *pre_fc_norm_hidden, *norm; /* [H] f32 each, 1 + w (zero-centred) */
    layer_weights layer;   /* one full-attention decoder layer */
} mtp_weights;

/* The vision tower (spec §6.2), when the checkpoint has model.visual.*. Vectors are f32 copies. */
typedef struct vision_block_weights {
    float *norm1_w, *norm1_b; /* [D] f32 LayerNorm before attention */
    float *norm2_w, *norm2_b; /* [D] f32 LayerNorm before the MLP */
    wmat qkv;                 /* [3D, D]: rows q | k | v, each heads x head_dim */
    float *qkv_b;             /* [3D] f32 */
    wmat proj;                /* [D, D] */
    float *proj_b;            /* [D] f32 */
    wmat fc1;                 /* [I, D] */
    float *fc1_b;             /* [I] f32 */
    wmat fc2;                 /* [D, I] */
    float *fc2_b;             /* [D] f32 */
} vision_block_weights;

typedef struct vision_weights {
    int present;
    int D, heads, head_dim, I, depth;  /* head_dim = D / heads */
    int patch, temporal, merge, in_ch; /* 16, 2, 2, 3 */
    int patch_dim;                     /* in_ch * temporal * patch^2 (1536) */
    int out_hidden;                    /* merger output = text hidden size */
    int grid_side;                     /* sqrt(rows of the position table) */
    wmat patch_w;                      /* [D, patch_dim]: Conv3d [D, C, T, P, P] flattened C,T,Y,X */
    float *patch_b;                    /* [D] f32 */
    float *pos;                        /* [grid_side^2, D] f32 learned position table */
    float *inv_freq;                   /* [head_dim/4] f32 2-D rotary frequencies, theta 10000 */
    vision_block_weights *blocks;      /* [depth] */
    float *mnorm_w, *mnorm_b;          /* [D] f32 merger LayerNorm (per patch, before the 2x2 join) */
    wmat mfc1;                         /* [4D, 4D] */
    float *mfc1_b;                     /* [4D] f32 */
    wmat mfc2;                         /* [out_hidden, 4D] */
    float *mfc2_b;                     /* [out_hidden] f32 */
} vision_weights;

typedef struct model {
    model_config cfg;
    st_set *st;
    /* derived sizes */
    int H, V, L, Hq, Hkv, hd, Hk, Hv, dk, dv, K, C; /* C = conv channels = 2*Hk*dk + Hv*dv */
    int n_lin, n_full;     /* layer counts by type */
    int *lin_index;        /* [L]: index among linear layers, or -1 */
    int *full_index;       /* [L]: index among full-attention layers, or -1 */
    wmat embed;            /* [V, H] */
    wmat lm_head;          /* [V, H] (= embed when tied) */
    float *final_norm;     /* [H] f32, 1 + w */
    layer_weights *layers; /* [L] */
    mtp_weights mtp;
    int n_visual;          /* model.visual.* tensors in the checkpoint */
    vision_weights vis;    /* bound when config.json has vision_config and the tensors are there */
    int64_t n_params, n_params_total;
    int64_t bytes_per_token;   /* weight bytes streamed by one decode step */
    int eos_ids[CONFIG_MAX_EOS];
    int n_eos;
    /* generation_config.json's sampling defaults (< 0 when the file or the field is absent) */
    float gen_temperature, gen_top_p, gen_min_p, gen_repetition_penalty;
    int gen_top_k;
    int64_t bytes_by_dtype[ST_N_DTYPES];
    char layer_map[CONFIG_MAX_LAYERS + 1];
    char arch_name[32];
    void *f32_pool;        /* one allocation holding every small f32 vector above */
} model;

int model_load(const char *dir, model **out, char *err, size_t errlen);
void model_free(model *m);

#endif

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
    int n_visual;          /* model.visual.* tensors mapped (the vision tower comes later) */
    int64_t n_params, n_params_total;
    int64_t bytes_per_token;   /* weight bytes streamed by one decode step */
    int eos_ids[CONFIG_MAX_EOS];
    int n_eos;
    int64_t bytes_by_dtype[ST_N_DTYPES];
    char layer_map[CONFIG_MAX_LAYERS + 1];
    char arch_name[32];
    void *f32_pool;        /* one allocation holding every small f32 vector above */
} model;

int model_load(const char *dir, model **out, char *err, size_t errlen);
void model_free(model *m);

#endif

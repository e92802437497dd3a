/* config.h — config.json of qwen3_5 (multimodal wrapper with text_config), qwen3_5_text, qwen3_5_moe
 * (wrapper or flat text) and qwen3_next, read into one flat struct. Errors name the field and the file. */
#ifndef CI_CONFIG_H
#define CI_CONFIG_H

#include <stddef.h>

typedef enum {
    ARCH_QWEN35 = 1,     /* dense Qwen3.5 (qwen3_5, qwen3_5_text) */
    ARCH_QWEN35_MOE = 2, /* Qwen3.5-MoE (qwen3_5_moe, qwen3_5_moe_text) */
    ARCH_QWEN3_NEXT = 3, /* Qwen3-Next (qwen3_next) */
} model_arch;

enum { LAYER_LINEAR = 0, LAYER_FULL = 1 };

#define CONFIG_MAX_LAYERS 1024
#define CONFIG_MAX_EOS 8

typedef struct model_config {
    model_arch arch;
    char model_type[32];          /* as written in the file (top level) */
    int multimodal;               /* 1 when the file is a wrapper with text_config (weights under model.language_model.) */

    int hidden_size;              /* H */
    int n_layers;                 /* L */
    int vocab_size;               /* V */
    int n_heads;                  /* Hq  (num_attention_heads) */
    int n_kv_heads;               /* Hkv (num_key_value_heads) */
    int head_dim;                 /* hd */
    int layer_types[CONFIG_MAX_LAYERS]; /* LAYER_LINEAR / LAYER_FULL, from layer_types or full_attention_interval */

    int lin_n_key_heads;          /* Hk  (linear_num_key_heads) */
    int lin_n_value_heads;        /* Hv  (linear_num_value_heads); Hv % Hk == 0 */
    int lin_key_head_dim;         /* dk */
    int lin_value_head_dim;       /* dv */
    int lin_conv_kernel;          /* K   (linear_conv_kernel_dim) */

    double rope_theta;
    double partial_rotary_factor; /* default 0.25 */
    int rope_dim;                 /* R = (int)(head_dim * partial_rotary_factor), even */
    int mrope_section[3];         /* t, h, w frequency counts; {0,0,0} when absent */
    int mrope_interleaved;

    double rms_norm_eps;
    int intermediate_size;        /* dense MLP width (0 if absent) */

    int n_experts;                /* E (0 = dense) */
    int n_experts_per_tok;        /* k */
    int moe_intermediate_size;    /* Im */
    int shared_expert_intermediate_size; /* Is (0 = no shared expert) */
    int norm_topk_prob;           /* Qwen3.5-MoE: always 1; Qwen3-Next: from the file (default 1) */
    int decoder_sparse_step;      /* Qwen3-Next (default 1); 1 for Qwen3.5-MoE */
    int mlp_only_layers[CONFIG_MAX_LAYERS]; /* 1 = this layer uses the dense MLP (Qwen3-Next) */

    int tie_word_embeddings;      /* true at either level counts */
    int mtp_num_hidden_layers;
    int eos_token_ids[CONFIG_MAX_EOS];
    int n_eos;
    int bos_token_id;             /* -1 if absent */
    int max_position_embeddings;

    /* multimodal extras (0 / -1 when absent) */
    int has_vision;               /* a vision_config object is present */
    int image_token_id, video_token_id, vision_start_token_id, vision_end_token_id;
    /* vision_config (Qwen3_5VisionConfig; its defaults when a field is absent), read when has_vision */
    int vis_depth;                /* blocks (27) */
    int vis_hidden;               /* D (1152) */
    int vis_intermediate;         /* block MLP width (4304) */
    int vis_heads;                /* attention heads; D % heads == 0, head dim even */
    int vis_in_channels;          /* 3 */
    int vis_patch;                /* 16 */
    int vis_temporal;             /* 2 */
    int vis_merge;                /* spatial_merge_size, 2 */
    int vis_out_hidden;           /* merger output width: the text hidden size */
    int vis_num_pos;              /* learned position table rows, a perfect square (2304 = 48^2) */
    double vis_rope_theta;        /* vision_config.rope_parameters.rope_theta of the 2-D rotary (10000) */
} model_config;

/* Pure parser over the text of a config.json; `path` is used only in error messages. */
int config_parse(const char *json, size_t len, const char *path, model_config *out, char *err, size_t errlen);
/* Reads dir/config.json and parses it. */
int config_load(const char *dir, model_config *out, char *err, size_t errlen);

/* Layer i's FFN is MoE (not the dense MLP). */
int config_layer_is_moe(const model_config *c, int i);

#endif

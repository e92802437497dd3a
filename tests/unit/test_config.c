/* test_config.c — config.json parsing: real-shaped Qwen3.5-35B-A3B and 0.8B wrapper configs, a flat
 * qwen3_5_text, a Qwen3-Next config, tied embeddings at either level, and one case per validation error
 * (each checks the code and that the message names the field and the file). Variants of a base config
 * are made by editing its JSON with jansson. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "io/config.h"
#include "test.h"
#include "util/err.h"

#define LT4  "\"linear_attention\",\"linear_attention\",\"linear_attention\",\"full_attention\""
#define LT40 LT4 "," LT4 "," LT4 "," LT4 "," LT4 "," LT4 "," LT4 "," LT4 "," LT4 "," LT4

/* Qwen3.5-35B-A3B as released (spec §1.3): MoE wrapper, partial_rotary_factor beside rope_parameters. */
static const char *k_35b =
    "{\"architectures\":[\"Qwen3_5MoeForConditionalGeneration\"],\"model_type\":\"qwen3_5_moe\","
    "\"image_token_id\":248056,\"video_token_id\":248057,\"vision_start_token_id\":248053,"
    "\"vision_end_token_id\":248054,\"tie_word_embeddings\":false,"
    "\"text_config\":{\"model_type\":\"qwen3_5_moe_text\",\"attention_bias\":false,\"attn_output_gate\":true,"
    "\"dtype\":\"bfloat16\",\"eos_token_id\":248044,\"full_attention_interval\":4,\"head_dim\":256,"
    "\"hidden_act\":\"silu\",\"hidden_size\":2048,\"initializer_range\":0.02,\"layer_types\":[" LT40 "],"
    "\"linear_conv_kernel_dim\":4,\"linear_key_head_dim\":128,\"linear_num_key_heads\":16,"
    "\"linear_num_value_heads\":32,\"linear_value_head_dim\":128,\"mamba_ssm_dtype\":\"float32\","
    "\"max_position_embeddings\":262144,\"moe_intermediate_size\":512,\"mtp_num_hidden_layers\":1,"
    "\"mtp_use_dedicated_embeddings\":false,\"num_attention_heads\":16,\"num_experts\":256,"
    "\"num_experts_per_tok\":8,\"num_hidden_layers\":40,\"num_key_value_heads\":2,\"rms_norm_eps\":1e-06,"
    "\"router_aux_loss_coef\":0.001,\"shared_expert_intermediate_size\":512,\"use_cache\":true,"
    "\"vocab_size\":248320,\"partial_rotary_factor\":0.25,"
    "\"rope_parameters\":{\"mrope_interleaved\":true,\"mrope_section\":[11,11,10],\"rope_theta\":10000000,"
    "\"rope_type\":\"default\"}},"
    "\"transformers_version\":\"4.57.0.dev0\","
    "\"vision_config\":{\"deepstack_visual_indexes\":[],\"depth\":27,\"hidden_act\":\"gelu_pytorch_tanh\","
    "\"hidden_size\":1152,\"in_channels\":3,\"intermediate_size\":4304,\"model_type\":\"qwen3_5_moe\","
    "\"num_heads\":16,\"num_position_embeddings\":2304,\"out_hidden_size\":2048,\"patch_size\":16,"
    "\"spatial_merge_size\":2,\"temporal_patch_size\":2}}";

/* A Qwen3.5-0.8B-like dense wrapper: layer_types given, rope fields all inside rope_parameters, tied at the
 * top level only. */
static const char *k_08b =
    "{\"architectures\":[\"Qwen3_5ForConditionalGeneration\"],\"model_type\":\"qwen3_5\","
    "\"image_token_id\":248056,\"video_token_id\":248057,\"vision_start_token_id\":248053,"
    "\"vision_end_token_id\":248054,\"tie_word_embeddings\":true,"
    "\"text_config\":{\"model_type\":\"qwen3_5_text\",\"bos_token_id\":null,\"eos_token_id\":248044,\"head_"
    "dim\":256,"
    "\"hidden_size\":1024,\"intermediate_size\":3584,\"layer_types\":[" LT4 "," LT4 "," LT4 "," LT4 "," LT4
    "," LT4 "],\"linear_conv_kernel_dim\":4,\"linear_key_head_dim\":128,\"linear_num_key_heads\":16,"
    "\"linear_num_value_heads\":16,\"linear_value_head_dim\":128,\"max_position_embeddings\":262144,"
    "\"mtp_num_hidden_layers\":1,\"num_attention_heads\":8,\"num_hidden_layers\":24,\"num_key_value_heads\":"
    "2,"
    "\"rms_norm_eps\":1e-06,\"vocab_size\":248320,"
    "\"rope_parameters\":{\"mrope_interleaved\":true,\"mrope_section\":[11,11,10],\"partial_rotary_factor\":"
    "0.25,"
    "\"rope_theta\":10000000,\"rope_type\":\"default\"}},"
    "\"vision_config\":{\"depth\":12,\"hidden_size\":768,\"num_heads\":12,\"out_hidden_size\":1024}}";

/* A flat text-only save: full_attention_interval instead of layer_types, rope_theta at the top level,
 * rope_scaling null, no head_dim (hidden_size / heads = 128), eos as a list. */
static const char *k_flat =
    "{\"architectures\":[\"Qwen3_5ForCausalLM\"],\"model_type\":\"qwen3_5_text\",\"hidden_size\":512,"
    "\"num_hidden_layers\":6,\"vocab_size\":1000,\"num_attention_heads\":4,\"num_key_value_heads\":1,"
    "\"linear_num_key_heads\":2,\"linear_num_value_heads\":4,\"linear_key_head_dim\":32,"
    "\"linear_value_head_dim\":64,\"linear_conv_kernel_dim\":4,\"intermediate_size\":1024,"
    "\"full_attention_interval\":2,\"rope_theta\":1000000.0,\"rope_scaling\":null,\"rms_norm_eps\":1e-05,"
    "\"eos_token_id\":[7,9],\"bos_token_id\":1,\"tie_word_embeddings\":true}";

/* Qwen3-Next (flat): dense layers from mlp_only_layers and decoder_sparse_step 2. */
static const char *k_next =
    "{\"architectures\":[\"Qwen3NextForCausalLM\"],\"model_type\":\"qwen3_next\",\"hidden_size\":2048,"
    "\"num_hidden_layers\":8,\"vocab_size\":151936,\"num_attention_heads\":16,\"num_key_value_heads\":2,"
    "\"head_dim\":256,\"linear_num_key_heads\":16,\"linear_num_value_heads\":32,\"linear_key_head_dim\":128,"
    "\"linear_value_head_dim\":128,\"linear_conv_kernel_dim\":4,\"intermediate_size\":5120,\"num_experts\":"
    "512,"
    "\"num_experts_per_tok\":10,\"moe_intermediate_size\":512,\"shared_expert_intermediate_size\":512,"
    "\"norm_topk_prob\":false,\"decoder_sparse_step\":2,\"mlp_only_layers\":[0,5],\"full_attention_"
    "interval\":4,"
    "\"rope_theta\":10000000,\"partial_rotary_factor\":0.25,\"rope_scaling\":null,\"rms_norm_eps\":1e-06,"
    "\"bos_token_id\":151643,\"eos_token_id\":151645,\"tie_word_embeddings\":false,"
    "\"max_position_embeddings\":262144}";

#define PATH "models/x/config.json"

static int parse(const char *text, model_config *c, char *err, size_t errlen) {
    return config_parse(text, strlen(text), PATH, c, err, errlen);
}

/* Parses `base` with the field at dotted path `key` replaced by the JSON `value` (NULL: removed). */
static int parse_edit(const char *base, const char *key, const char *value, model_config *c, char *err,
                      size_t errlen) {
    json_t *root = json_loads(base, 0, NULL);
    if (!root) return 99;
    json_t *obj = root;
    char k[128];
    snprintf(k, sizeof k, "%s", key);
    char *leaf = k, *dot;
    while ((dot = strchr(leaf, '.'))) {
        *dot = 0;
        obj = json_object_get(obj, leaf);
        if (!json_is_object(obj)) {
            json_decref(root);
            return 98;
        }
        leaf = dot + 1;
    }
    if (value)
        json_object_set_new(obj, leaf, json_loads(value, JSON_DECODE_ANY, NULL));
    else
        json_object_del(obj, leaf);
    char *text = json_dumps(root, 0);
    json_decref(root);
    int rc = parse(text, c, err, errlen);
    free(text);
    return rc;
}

TEST(cfg_qwen35_moe_35b_a3b) {
    model_config c;
    char err[512] = "";
    int rc = parse(k_35b, &c, err, sizeof err);
    CHECK_MSG(rc == 0, "config_parse: %s", err);
    REQUIRE(rc == 0);
    CHECK_EQ_INT(c.arch, ARCH_QWEN35_MOE);
    CHECK(!strcmp(c.model_type, "qwen3_5_moe"));
    CHECK_EQ_INT(c.multimodal, 1);
    CHECK_EQ_INT(c.hidden_size, 2048);
    CHECK_EQ_INT(c.n_layers, 40);
    CHECK_EQ_INT(c.vocab_size, 248320);
    CHECK_EQ_INT(c.n_heads, 16);
    CHECK_EQ_INT(c.n_kv_heads, 2);
    CHECK_EQ_INT(c.head_dim, 256);
    CHECK_EQ_INT(c.lin_n_key_heads, 16);
    CHECK_EQ_INT(c.lin_n_value_heads, 32);
    CHECK_EQ_INT(c.lin_key_head_dim, 128);
    CHECK_EQ_INT(c.lin_value_head_dim, 128);
    CHECK_EQ_INT(c.lin_conv_kernel, 4);
    int full = 0;
    for (int i = 0; i < c.n_layers; i++) {
        CHECK_EQ_INT(c.layer_types[i], (i % 4 == 3) ? LAYER_FULL : LAYER_LINEAR);
        full += c.layer_types[i] == LAYER_FULL;
        CHECK(config_layer_is_moe(&c, i));
    }
    CHECK_EQ_INT(full, 10);
    CHECK_NEAR(c.rope_theta, 1e7, 0);
    CHECK_NEAR(c.partial_rotary_factor, 0.25, 0);
    CHECK_EQ_INT(c.rope_dim, 64);
    CHECK_EQ_INT(c.mrope_section[0], 11);
    CHECK_EQ_INT(c.mrope_section[1], 11);
    CHECK_EQ_INT(c.mrope_section[2], 10);
    CHECK_EQ_INT(c.mrope_interleaved, 1);
    CHECK_NEAR(c.rms_norm_eps, 1e-6, 1e-18);
    CHECK_EQ_INT(c.intermediate_size, 0);
    CHECK_EQ_INT(c.n_experts, 256);
    CHECK_EQ_INT(c.n_experts_per_tok, 8);
    CHECK_EQ_INT(c.moe_intermediate_size, 512);
    CHECK_EQ_INT(c.shared_expert_intermediate_size, 512);
    CHECK_EQ_INT(c.norm_topk_prob, 1);
    CHECK_EQ_INT(c.decoder_sparse_step, 1);
    CHECK_EQ_INT(c.tie_word_embeddings, 0);
    CHECK_EQ_INT(c.mtp_num_hidden_layers, 1);
    CHECK_EQ_INT(c.n_eos, 1);
    CHECK_EQ_INT(c.eos_token_ids[0], 248044);
    CHECK_EQ_INT(c.bos_token_id, -1);
    CHECK_EQ_INT(c.max_position_embeddings, 262144);
    CHECK_EQ_INT(c.has_vision, 1);
    CHECK_EQ_INT(c.image_token_id, 248056);
    CHECK_EQ_INT(c.video_token_id, 248057);
    CHECK_EQ_INT(c.vision_start_token_id, 248053);
    CHECK_EQ_INT(c.vision_end_token_id, 248054);
    CHECK(!config_layer_is_moe(&c, -1));
    CHECK(!config_layer_is_moe(&c, 40));
}

TEST(cfg_qwen35_dense_08b_wrapper) {
    model_config c;
    char err[512] = "";
    int rc = parse(k_08b, &c, err, sizeof err);
    CHECK_MSG(rc == 0, "config_parse: %s", err);
    REQUIRE(rc == 0);
    CHECK_EQ_INT(c.arch, ARCH_QWEN35);
    CHECK_EQ_INT(c.multimodal, 1);
    CHECK_EQ_INT(c.hidden_size, 1024);
    CHECK_EQ_INT(c.n_layers, 24);
    CHECK_EQ_INT(c.n_heads, 8);
    CHECK_EQ_INT(c.lin_n_value_heads, 16);
    CHECK_EQ_INT(c.intermediate_size, 3584);
    CHECK_EQ_INT(c.n_experts, 0);
    CHECK_EQ_INT(c.tie_word_embeddings, 1); /* top level only */
    CHECK_EQ_INT(c.rope_dim, 64);
    CHECK_EQ_INT(c.mrope_interleaved, 1);
    CHECK_EQ_INT(c.bos_token_id, -1); /* null is absent */
    CHECK_EQ_INT(c.has_vision, 1);
    for (int i = 0; i < c.n_layers; i++) {
        CHECK(!config_layer_is_moe(&c, i));
        CHECK_EQ_INT(c.layer_types[i], (i + 1) % 4 == 0 ? LAYER_FULL : LAYER_LINEAR);
    }
    /* Without vision_config the wrapper is still multimodal in layout (weights under language_model). */
    REQUIRE(parse_edit(k_08b, "vision_config", NULL, &c, err, sizeof err) == 0);
    CHECK_EQ_INT(c.has_vision, 0);
    CHECK_EQ_INT(c.multimodal, 1);
    /* A wrapper model_type without text_config is read flat. */
    REQUIRE(parse_edit(k_flat, "model_type", "\"qwen3_5\"", &c, err, sizeof err) == 0);
    CHECK_EQ_INT(c.multimodal, 0);
    CHECK_EQ_INT(c.hidden_size, 512);
}

TEST(cfg_qwen35_flat_text) {
    model_config c;
    char err[512] = "";
    int rc = parse(k_flat, &c, err, sizeof err);
    CHECK_MSG(rc == 0, "config_parse: %s", err);
    REQUIRE(rc == 0);
    CHECK_EQ_INT(c.arch, ARCH_QWEN35);
    CHECK_EQ_INT(c.multimodal, 0);
    CHECK_EQ_INT(c.head_dim, 128);
    CHECK_EQ_INT(c.rope_dim, 32);
    CHECK_NEAR(c.rope_theta, 1e6, 0);
    CHECK_NEAR(c.rms_norm_eps, 1e-5, 1e-18);
    CHECK_EQ_INT(c.mrope_section[0] + c.mrope_section[1] + c.mrope_section[2], 0);
    CHECK_EQ_INT(c.mrope_interleaved, 0);
    for (int i = 0; i < 6; i++) CHECK_EQ_INT(c.layer_types[i], i % 2 ? LAYER_FULL : LAYER_LINEAR);
    CHECK_EQ_INT(c.n_eos, 2);
    CHECK_EQ_INT(c.eos_token_ids[0], 7);
    CHECK_EQ_INT(c.eos_token_ids[1], 9);
    CHECK_EQ_INT(c.bos_token_id, 1);
    CHECK_EQ_INT(c.tie_word_embeddings, 1);
    CHECK_EQ_INT(c.has_vision, 0);
    CHECK_EQ_INT(c.image_token_id, -1);
    CHECK_EQ_INT(c.max_position_embeddings, 0);
    CHECK_EQ_INT(c.mtp_num_hidden_layers, 0);
    /* Defaults: interval 4, eps 1e-6, partial factor 0.25 (head_dim 128 → R 32). */
    REQUIRE(parse_edit(k_flat, "full_attention_interval", NULL, &c, err, sizeof err) == 0);
    for (int i = 0; i < 6; i++) CHECK_EQ_INT(c.layer_types[i], i == 3 ? LAYER_FULL : LAYER_LINEAR);
    REQUIRE(parse_edit(k_flat, "rms_norm_eps", NULL, &c, err, sizeof err) == 0);
    CHECK_NEAR(c.rms_norm_eps, 1e-6, 1e-18);
    /* A rope_scaling object may carry the mRoPE sections (older files). */
    REQUIRE(parse_edit(k_flat, "rope_scaling",
                       "{\"rope_type\":\"default\",\"mrope_section\":[6,5,5],\"mrope_interleaved\":true}", &c,
                       err, sizeof err) == 0);
    CHECK_EQ_INT(c.mrope_section[0], 6);
    CHECK_EQ_INT(c.mrope_interleaved, 1);
    /* A plain list of eos ids can be empty; an id with no list is one entry. */
    REQUIRE(parse_edit(k_flat, "eos_token_id", "[]", &c, err, sizeof err) == 0);
    CHECK_EQ_INT(c.n_eos, 0);
    /* MoE flat text save. */
    REQUIRE(parse_edit(k_flat, "model_type", "\"qwen3_5_moe_text\"", &c, err, sizeof err) ==
            CINFER_ENOTFOUND);
    CHECK_STR_CONTAINS(err, "field \"num_experts\" is missing");
}

TEST(cfg_qwen3_next) {
    model_config c;
    char err[512] = "";
    int rc = parse(k_next, &c, err, sizeof err);
    CHECK_MSG(rc == 0, "config_parse: %s", err);
    REQUIRE(rc == 0);
    CHECK_EQ_INT(c.arch, ARCH_QWEN3_NEXT);
    CHECK_EQ_INT(c.multimodal, 0);
    CHECK_EQ_INT(c.n_experts, 512);
    CHECK_EQ_INT(c.n_experts_per_tok, 10);
    CHECK_EQ_INT(c.norm_topk_prob, 0);
    CHECK_EQ_INT(c.decoder_sparse_step, 2);
    CHECK_EQ_INT(c.intermediate_size, 5120);
    CHECK_EQ_INT(c.mlp_only_layers[0], 1);
    CHECK_EQ_INT(c.mlp_only_layers[5], 1);
    CHECK_EQ_INT(c.mlp_only_layers[1], 0);
    /* MoE iff (i+1) % 2 == 0 and i not in {0, 5}: layers 1, 3, 7. */
    const int moe[8] = {0, 1, 0, 1, 0, 0, 0, 1};
    for (int i = 0; i < 8; i++) CHECK_MSG(config_layer_is_moe(&c, i) == moe[i], "layer %d", i);
    CHECK_EQ_INT(c.rope_dim, 64);
    CHECK_EQ_INT(c.bos_token_id, 151643);
    CHECK_EQ_INT(c.eos_token_ids[0], 151645);
    CHECK_EQ_INT(c.vocab_size, 151936);
    CHECK_EQ_INT(c.has_vision, 0);
    /* Defaults: norm_topk_prob true, step 1, no dense layers → intermediate_size not needed. */
    const char *json =
        "{\"model_type\":\"qwen3_next\",\"hidden_size\":64,\"num_hidden_layers\":4,\"vocab_size\":10,"
        "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"head_dim\":32,"
        "\"linear_num_key_heads\":1,\"linear_num_value_heads\":2,\"linear_key_head_dim\":8,"
        "\"linear_value_head_dim\":8,\"linear_conv_kernel_dim\":4,\"num_experts\":4,"
        "\"num_experts_per_tok\":2,\"moe_intermediate_size\":16,\"shared_expert_intermediate_size\":0,"
        "\"rope_theta\":10000}";
    rc = parse(json, &c, err, sizeof err);
    CHECK_MSG(rc == 0, "config_parse: %s", err);
    REQUIRE(rc == 0);
    CHECK_EQ_INT(c.norm_topk_prob, 1);
    CHECK_EQ_INT(c.decoder_sparse_step, 1);
    CHECK_EQ_INT(c.intermediate_size, 0);
    CHECK_EQ_INT(c.shared_expert_intermediate_size, 0);
    CHECK_EQ_INT(c.rope_dim, 8);
    for (int i = 0; i < 4; i++) CHECK(config_layer_is_moe(&c, i));
    /* With a dense layer, intermediate_size becomes required. */
    CHECK_EQ_INT(parse_edit(k_next, "intermediate_size", NULL, &c, err, sizeof err), CINFER_ENOTFOUND);
    CHECK_STR_CONTAINS(err, PATH ": field \"intermediate_size\" is missing");
    CHECK_EQ_INT(parse_edit(k_next, "mlp_only_layers", "[8]", &c, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "field \"mlp_only_layers[0]\" must be a layer index in [0, 8)");
    CHECK_EQ_INT(parse_edit(k_next, "norm_topk_prob", "1", &c, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "field \"norm_topk_prob\" must be true or false");
}

TEST(cfg_tie_at_either_level) {
    model_config c;
    char err[512] = "";
    REQUIRE(parse_edit(k_35b, "text_config.tie_word_embeddings", "true", &c, err, sizeof err) == 0);
    CHECK_EQ_INT(c.tie_word_embeddings, 1); /* top level false, text_config true */
    REQUIRE(parse_edit(k_35b, "tie_word_embeddings", "true", &c, err, sizeof err) == 0);
    CHECK_EQ_INT(c.tie_word_embeddings, 1);
    REQUIRE(parse_edit(k_35b, "tie_word_embeddings", NULL, &c, err, sizeof err) == 0);
    CHECK_EQ_INT(c.tie_word_embeddings, 0); /* absent everywhere */
    REQUIRE(parse_edit(k_08b, "text_config.tie_word_embeddings", "false", &c, err, sizeof err) == 0);
    CHECK_EQ_INT(c.tie_word_embeddings, 1); /* top true wins over text false */
    CHECK_EQ_INT(parse_edit(k_08b, "text_config.tie_word_embeddings", "\"yes\"", &c, err, sizeof err),
                 CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, PATH ": field \"text_config.tie_word_embeddings\" must be true or false");
    /* eos: text_config first, then the top level. */
    REQUIRE(parse_edit(k_35b, "eos_token_id", "[1,2,3]", &c, err, sizeof err) == 0);
    CHECK_EQ_INT(c.n_eos, 1);
    CHECK_EQ_INT(c.eos_token_ids[0], 248044);
    REQUIRE(parse_edit(k_35b, "text_config.eos_token_id", NULL, &c, err, sizeof err) == 0);
    CHECK_EQ_INT(c.n_eos, 0);
}

TEST(cfg_err_missing_field) {
    model_config c;
    char err[512] = "";
    CHECK_EQ_INT(parse_edit(k_35b, "text_config.linear_num_key_heads", NULL, &c, err, sizeof err),
                 CINFER_ENOTFOUND);
    CHECK_STR_CONTAINS(err, PATH ": field \"text_config.linear_num_key_heads\" is missing");
    CHECK_EQ_INT(parse_edit(k_35b, "text_config.shared_expert_intermediate_size", NULL, &c, err, sizeof err),
                 CINFER_ENOTFOUND);
    CHECK_STR_CONTAINS(err, "\"text_config.shared_expert_intermediate_size\" is missing");
    CHECK_EQ_INT(parse_edit(k_08b, "text_config.intermediate_size", NULL, &c, err, sizeof err),
                 CINFER_ENOTFOUND);
    CHECK_STR_CONTAINS(err, "\"text_config.intermediate_size\" is missing");
    CHECK_EQ_INT(parse_edit(k_flat, "vocab_size", "null", &c, err, sizeof err), CINFER_ENOTFOUND);
    CHECK_STR_CONTAINS(err, PATH ": field \"vocab_size\" is missing");
    CHECK_EQ_INT(parse_edit(k_35b, "model_type", NULL, &c, err, sizeof err), CINFER_ENOTFOUND);
    CHECK_STR_CONTAINS(err, "field \"model_type\" is missing");
    /* rope_theta in neither place. */
    CHECK_EQ_INT(parse_edit(k_35b, "text_config.rope_parameters.rope_theta", NULL, &c, err, sizeof err),
                 CINFER_ENOTFOUND);
    CHECK_STR_CONTAINS(err, PATH ": field \"text_config.rope_parameters.rope_theta\" is missing");
    CHECK_EQ_INT(parse_edit(k_flat, "rope_theta", NULL, &c, err, sizeof err), CINFER_ENOTFOUND);
    CHECK_STR_CONTAINS(err, "field \"rope_parameters.rope_theta\" is missing");
}

TEST(cfg_err_wrong_type) {
    model_config c;
    char err[512] = "";
    const char *bad[] = {"\"2048\"", "0", "-5", "2048.5", "true", "[2048]"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK_EQ_INT(parse_edit(k_35b, "text_config.hidden_size", bad[i], &c, err, sizeof err),
                     CINFER_EFORMAT);
        CHECK_STR_CONTAINS(err, PATH ": field \"text_config.hidden_size\" must be a positive integer");
    }
    CHECK_EQ_INT(parse_edit(k_flat, "num_key_value_heads", "\"1\"", &c, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, PATH ": field \"num_key_value_heads\" must be a positive integer");
    CHECK_EQ_INT(parse_edit(k_35b, "text_config.shared_expert_intermediate_size", "-1", &c, err, sizeof err),
                 CINFER_EFORMAT);
    CHECK_STR_CONTAINS(
        err, "field \"text_config.shared_expert_intermediate_size\" must be a non-negative integer");
    CHECK_EQ_INT(parse_edit(k_35b, "text_config.rms_norm_eps", "\"1e-6\"", &c, err, sizeof err),
                 CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "field \"text_config.rms_norm_eps\" must be a number");
    CHECK_EQ_INT(parse_edit(k_35b, "text_config.rope_parameters", "[1]", &c, err, sizeof err),
                 CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "field \"text_config.rope_parameters\" must be an object");
    CHECK_EQ_INT(parse_edit(k_35b, "text_config", "[]", &c, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "field \"text_config\" must be an object");
    CHECK_EQ_INT(parse_edit(k_35b, "text_config.eos_token_id", "\"x\"", &c, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "field \"text_config.eos_token_id\" must be a token id or a list");
    CHECK_EQ_INT(parse_edit(k_35b, "text_config.eos_token_id", "[1,-2]", &c, err, sizeof err),
                 CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "field \"text_config.eos_token_id[1]\"");
    CHECK_EQ_INT(parse_edit(k_35b, "text_config.eos_token_id", "[1,2,3,4,5,6,7,8,9]", &c, err, sizeof err),
                 CINFER_ERANGE);
    CHECK_STR_CONTAINS(err, "lists 9 ids");
    CHECK_EQ_INT(parse_edit(k_35b, "model_type", "5", &c, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "field \"model_type\" must be a string");
    CHECK_EQ_INT(
        parse_edit(k_35b, "architectures", "\"Qwen3_5MoeForConditionalGeneration\"", &c, err, sizeof err),
        CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "field \"architectures\" must be a list of strings");
    CHECK_EQ_INT(parse_edit(k_35b, "vision_config", "1", &c, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "field \"vision_config\" must be an object");
    CHECK_EQ_INT(parse_edit(k_35b, "image_token_id", "-3", &c, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "field \"image_token_id\" must be a non-negative integer");
    /* Over the limits. */
    CHECK_EQ_INT(parse_edit(k_flat, "num_hidden_layers", "1025", &c, err, sizeof err), CINFER_ERANGE);
    CHECK_STR_CONTAINS(err, "field \"num_hidden_layers\" is 1025, over the limit of 1024");
    CHECK_EQ_INT(parse_edit(k_flat, "vocab_size", "99999999999", &c, err, sizeof err), CINFER_ERANGE);
    CHECK_STR_CONTAINS(err, "field \"vocab_size\" is 99999999999");
}

TEST(cfg_err_unsupported_model_type) {
    model_config c;
    char err[512] = "";
    CHECK_EQ_INT(parse_edit(k_flat, "model_type", "\"llama\"", &c, err, sizeof err), CINFER_EUNSUPPORTED);
    CHECK_STR_CONTAINS(err,
                       PATH ": model_type \"llama\" is not supported (qwen3_5, qwen3_5_text, qwen3_5_moe, "
                            "qwen3_5_moe_text, qwen3_next)");
    /* text_config's own model_type is not the file's type. */
    REQUIRE(parse_edit(k_35b, "text_config.model_type", "\"something_else\"", &c, err, sizeof err) == 0);
    /* Only "default" RoPE: scaled variants change every frequency. */
    CHECK_EQ_INT(parse_edit(k_35b, "text_config.rope_parameters.rope_type", "\"yarn\"", &c, err, sizeof err),
                 CINFER_EUNSUPPORTED);
    CHECK_STR_CONTAINS(err, PATH ": field \"text_config.rope_parameters.rope_type\" is \"yarn\"");
    CHECK_EQ_INT(
        parse_edit(k_flat, "rope_scaling", "{\"type\":\"linear\",\"factor\":2.0}", &c, err, sizeof err),
        CINFER_EUNSUPPORTED);
    CHECK_STR_CONTAINS(err, "field \"rope_scaling.type\" is \"linear\"");
}

TEST(cfg_err_bad_layer_types) {
    model_config c;
    char err[512] = "";
    CHECK_EQ_INT(parse_edit(k_35b, "text_config.layer_types", "[" LT4 "]", &c, err, sizeof err),
                 CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err,
                       PATH ": field \"text_config.layer_types\" has 4 entries but num_hidden_layers is 40");
    CHECK_EQ_INT(parse_edit(k_08b, "text_config.layer_types",
                            "[" LT4 "," LT4 "," LT4 "," LT4 "," LT4
                            ",\"linear_attention\",\"sliding_attention\","
                            "\"linear_attention\",\"full_attention\"]",
                            &c, err, sizeof err),
                 CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "field \"text_config.layer_types[21]\" is \"sliding_attention\"");
    CHECK_EQ_INT(parse_edit(k_08b, "text_config.layer_types", "\"full_attention\"", &c, err, sizeof err),
                 CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "field \"text_config.layer_types\" must be a list");
    CHECK_EQ_INT(parse_edit(k_flat, "full_attention_interval", "0", &c, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "field \"full_attention_interval\" must be a positive integer");
}

TEST(cfg_err_head_ratios) {
    model_config c;
    char err[512] = "";
    CHECK_EQ_INT(parse_edit(k_35b, "text_config.linear_num_value_heads", "24", &c, err, sizeof err),
                 CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, PATH ": field \"text_config.linear_num_value_heads\" (24) must be a multiple of "
                                 "linear_num_key_heads (16)");
    CHECK_EQ_INT(parse_edit(k_35b, "text_config.num_key_value_heads", "3", &c, err, sizeof err),
                 CINFER_EFORMAT);
    CHECK_STR_CONTAINS(
        err, "field \"text_config.num_attention_heads\" (16) must be a multiple of num_key_value_heads (3)");
    CHECK_EQ_INT(parse_edit(k_35b, "text_config.num_experts_per_tok", "257", &c, err, sizeof err),
                 CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err,
                       "field \"text_config.num_experts_per_tok\" (257) must not exceed num_experts (256)");
}

TEST(cfg_err_rope_dim) {
    model_config c;
    char err[512] = "";
    /* 254 * 0.25 = 63.5 → 63: odd. */
    CHECK_EQ_INT(parse_edit(k_35b, "text_config.head_dim", "254", &c, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(
        err, PATH ": field \"text_config.partial_rotary_factor\" 0.25 with head_dim 254 gives rope dim 63");
    /* 2 * 0.25 = 0.5 → 0. */
    CHECK_EQ_INT(parse_edit(k_08b, "text_config.head_dim", "2", &c, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err,
                       "field \"text_config.rope_parameters.partial_rotary_factor\" 0.25 with head_dim 2");
    CHECK_EQ_INT(
        parse_edit(k_08b, "text_config.rope_parameters.partial_rotary_factor", "1.5", &c, err, sizeof err),
        CINFER_EFORMAT);
    CHECK_STR_CONTAINS(
        err, "field \"text_config.rope_parameters.partial_rotary_factor\" must be a number in (0, 1]");
    /* A factor of 0.5 makes R = 128; the mRoPE sections (32 frequencies) no longer cover R/2 = 64. */
    CHECK_EQ_INT(
        parse_edit(k_08b, "text_config.rope_parameters.partial_rotary_factor", "0.5", &c, err, sizeof err),
        CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err,
                       "field \"text_config.rope_parameters.mrope_section\" sums to 32 but the rope dim 128");
    CHECK_EQ_INT(
        parse_edit(k_08b, "text_config.rope_parameters.mrope_section", "[11,11]", &c, err, sizeof err),
        CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "\"text_config.rope_parameters.mrope_section\" must be a list of 3");
    CHECK_EQ_INT(parse_edit(k_08b, "text_config.rope_parameters.rope_theta", "0", &c, err, sizeof err),
                 CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "field \"text_config.rope_parameters.rope_theta\" must be a number");
}

TEST(cfg_err_invalid_json) {
    model_config c;
    char err[512] = "";
    CHECK_EQ_INT(parse("{\"model_type\": \"qwen3_5\",", &c, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, PATH ": invalid JSON");
    CHECK_EQ_INT(parse("{\"model_type\": \"qwen3_5\", \"model_type\": \"qwen3_5\"}", &c, err, sizeof err),
                 CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "duplicate");
    CHECK_EQ_INT(parse("[]", &c, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, PATH ": the top level is not a JSON object");
    CHECK_EQ_INT(config_parse("", 0, NULL, &c, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "config.json: invalid JSON");
}

TEST(cfg_load_from_dir) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/cfgdir", test_tmpdir());
    snprintf(path, sizeof path, "%s/config.json", dir);
    model_config c;
    char err[512] = "";
    CHECK_EQ_INT(config_load(dir, &c, err, sizeof err), CINFER_ENOTFOUND);
    CHECK_STR_CONTAINS(err, "cfgdir/config.json");
    char cmd[700];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
    REQUIRE(system(cmd) == 0);
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    fputs(k_next, f);
    fclose(f);
    int rc = config_load(dir, &c, err, sizeof err);
    CHECK_MSG(rc == 0, "config_load: %s", err);
    CHECK_EQ_INT(c.arch, ARCH_QWEN3_NEXT);
    f = fopen(path, "w");
    REQUIRE(f);
    fputs("{\"model_type\":\"qwen3_next\"}", f);
    fclose(f);
    CHECK_EQ_INT(config_load(dir, &c, err, sizeof err), CINFER_ENOTFOUND);
    CHECK_STR_CONTAINS(err, path);
    CHECK_STR_CONTAINS(err, "field \"hidden_size\" is missing");
}

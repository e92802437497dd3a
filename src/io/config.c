/* config.c — config.json → model_config for qwen3_5 / qwen3_5_moe (multimodal wrapper with text_config, or
 * flat), qwen3_5_text / qwen3_5_moe_text and qwen3_next. Every field is type- and range-checked, and every
 * message names the file and the field by its dotted path (text_config.X when read inside text_config). */
#include "io/config.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"
#include "util/file.h"

/* No real model has a width, head count or vocabulary anywhere near this; the cap keeps every product the
 * model code forms from these sizes (H*V, E*Im*H, ...) far from overflowing 64 bits. */
#define CFG_MAX_DIM  (1 << 24)
#define CFG_MAX_FILE ((size_t)16 << 20)

typedef struct {
    const char *path; /* for messages */
    char *err;
    size_t errlen;
} cfg_ctx;

/* A JSON null counts as absent: transformers writes null for optional fields it leaves unset. */
static json_t *get(json_t *obj, const char *key) {
    json_t *v = json_is_object(obj) ? json_object_get(obj, key) : NULL;
    return json_is_null(v) ? NULL : v;
}

static int missing(cfg_ctx *c, const char *pre, const char *key) {
    return ci_err(c->err, c->errlen, CINFER_ENOTFOUND, "%s: field \"%s%s\" is missing", c->path, pre, key);
}

/* Reads an integer in [lo, hi]. Absent: an error when required, else *out = def. */
static int get_int(cfg_ctx *c, json_t *obj, const char *pre, const char *key, int required, long long lo,
                   long long hi, int def, int *out) {
    json_t *v = get(obj, key);
    if (!v) {
        if (required) return missing(c, pre, key);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < lo)
        return ci_err(c->err, c->errlen, CINFER_EFORMAT, "%s: field \"%s%s\" must be a %s integer", c->path,
                      pre, key, lo > 0 ? "positive" : "non-negative");
    if (json_integer_value(v) > hi)
        return ci_err(c->err, c->errlen, CINFER_ERANGE, "%s: field \"%s%s\" is %lld, over the limit of %lld",
                      c->path, pre, key, (long long)json_integer_value(v), hi);
    *out = (int)json_integer_value(v);
    return 0;
}

/* Reads a number (integer or real) in (0, hi]. */
static int get_pos_num(cfg_ctx *c, json_t *obj, const char *pre, const char *key, double hi, double *out) {
    json_t *v = get(obj, key);
    if (!v) return missing(c, pre, key);
    double x = json_number_value(v);
    if (!json_is_number(v) || !(x > 0) || !(x <= hi))
        return ci_err(c->err, c->errlen, CINFER_EFORMAT, "%s: field \"%s%s\" must be a number in (0, %g]",
                      c->path, pre, key, hi);
    *out = x;
    return 0;
}

static int get_bool(cfg_ctx *c, json_t *obj, const char *pre, const char *key, int def, int *out) {
    json_t *v = get(obj, key);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v))
        return ci_err(c->err, c->errlen, CINFER_EFORMAT, "%s: field \"%s%s\" must be true or false", c->path,
                      pre, key);
    *out = json_is_true(v);
    return 0;
}

/* eos_token_id: an id or a list of ids. */
static int get_token_list(cfg_ctx *c, json_t *v, const char *pre, const char *key, int *ids, int *n) {
    if (json_is_integer(v)) {
        if (json_integer_value(v) < 0 || json_integer_value(v) > 0x7fffffff)
            return ci_err(c->err, c->errlen, CINFER_EFORMAT,
                          "%s: field \"%s%s\" must be a non-negative token id", c->path, pre, key);
        ids[0] = (int)json_integer_value(v);
        *n = 1;
        return 0;
    }
    if (!json_is_array(v))
        return ci_err(c->err, c->errlen, CINFER_EFORMAT,
                      "%s: field \"%s%s\" must be a token id or a list of them", c->path, pre, key);
    if (json_array_size(v) > CONFIG_MAX_EOS)
        return ci_err(c->err, c->errlen, CINFER_ERANGE, "%s: field \"%s%s\" lists %zu ids (at most %d)",
                      c->path, pre, key, json_array_size(v), CONFIG_MAX_EOS);
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > 0x7fffffff)
            return ci_err(c->err, c->errlen, CINFER_EFORMAT,
                          "%s: field \"%s%s[%zu]\" must be a non-negative token id", c->path, pre, key, i);
        ids[i] = (int)json_integer_value(e);
    }
    *n = (int)json_array_size(v);
    return 0;
}

/* RoPE type strings that mean plain (unscaled) frequencies: "mrope" is the legacy rope_scaling spelling of
 * multimodal RoPE with default frequencies. Anything else (yarn, linear, dynamic, ...) changes the numbers.
 */
static int check_rope_type(cfg_ctx *c, json_t *obj, const char *pre, const char *key) {
    json_t *v = get(obj, key);
    if (!v) return 0;
    if (!json_is_string(v))
        return ci_err(c->err, c->errlen, CINFER_EFORMAT, "%s: field \"%s%s\" must be a string", c->path, pre,
                      key);
    const char *s = json_string_value(v);
    if (strcmp(s, "default") && strcmp(s, "mrope"))
        return ci_err(c->err, c->errlen, CINFER_EUNSUPPORTED,
                      "%s: field \"%s%s\" is \"%.40s\": only \"default\" RoPE is supported", c->path, pre,
                      key, s);
    return 0;
}

static int parse_rope(cfg_ctx *c, json_t *lvl, const char *tp, model_config *o) {
    char rpp[64], rsp[64];
    snprintf(rpp, sizeof rpp, "%srope_parameters.", tp);
    snprintf(rsp, sizeof rsp, "%srope_scaling.", tp);
    json_t *rp = get(lvl, "rope_parameters"), *rs = get(lvl, "rope_scaling");
    if (rp && !json_is_object(rp))
        return ci_err(c->err, c->errlen, CINFER_EFORMAT, "%s: field \"%srope_parameters\" must be an object",
                      c->path, tp);
    if (rs && !json_is_object(rs))
        return ci_err(c->err, c->errlen, CINFER_EFORMAT,
                      "%s: field \"%srope_scaling\" must be an object or null", c->path, tp);
    int rc;
    if ((rc = check_rope_type(c, rp, rpp, "rope_type")) || (rc = check_rope_type(c, rp, rpp, "type")) ||
        (rc = check_rope_type(c, rs, rsp, "rope_type")) || (rc = check_rope_type(c, rs, rsp, "type")))
        return rc;

    /* Newer files keep these inside rope_parameters; older ones (and Qwen3-Next) at the text level. Real
     * Qwen3.5 files mix the two (partial_rotary_factor beside rope_parameters), so look in both. */
    if (get(rp, "rope_theta"))
        rc = get_pos_num(c, rp, rpp, "rope_theta", 1e12, &o->rope_theta);
    else if (get(lvl, "rope_theta"))
        rc = get_pos_num(c, lvl, tp, "rope_theta", 1e12, &o->rope_theta);
    else
        rc = missing(c, rpp, "rope_theta");
    if (rc) return rc;
    o->partial_rotary_factor = 0.25;
    const char *fpre = rpp; /* where the factor was read, for the message below */
    if (get(rp, "partial_rotary_factor"))
        rc = get_pos_num(c, rp, rpp, "partial_rotary_factor", 1.0, &o->partial_rotary_factor);
    else if (get(lvl, "partial_rotary_factor"))
        rc = get_pos_num(c, lvl, fpre = tp, "partial_rotary_factor", 1.0, &o->partial_rotary_factor);
    if (rc) return rc;
    o->rope_dim = (int)(o->head_dim * o->partial_rotary_factor);
    if (o->rope_dim <= 0 || o->rope_dim % 2 || o->rope_dim > o->head_dim)
        return ci_err(
            c->err, c->errlen, CINFER_EFORMAT,
            "%s: field \"%spartial_rotary_factor\" %g with head_dim %d gives rope dim %d, which must be "
            "even and positive",
            c->path, fpre, o->partial_rotary_factor, o->head_dim, o->rope_dim);

    json_t *src = get(rp, "mrope_section") ? rp : get(rs, "mrope_section") ? rs : NULL;
    const char *sp = src == rp ? rpp : rsp;
    if (src) {
        json_t *ms = get(src, "mrope_section");
        int sum = 0;
        if (!json_is_array(ms) || json_array_size(ms) != 3)
            return ci_err(c->err, c->errlen, CINFER_EFORMAT,
                          "%s: field \"%smrope_section\" must be a list of 3 non-negative integers", c->path,
                          sp);
        for (int i = 0; i < 3; i++) {
            json_t *e = json_array_get(ms, (size_t)i);
            if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > CFG_MAX_DIM)
                return ci_err(c->err, c->errlen, CINFER_EFORMAT,
                              "%s: field \"%smrope_section\" must be a list of 3 non-negative integers",
                              c->path, sp);
            o->mrope_section[i] = (int)json_integer_value(e);
            sum += o->mrope_section[i];
        }
        /* The sections split the R/2 rotary frequencies between t, h and w: they must cover them exactly. */
        if (sum != o->rope_dim / 2)
            return ci_err(c->err, c->errlen, CINFER_EFORMAT,
                          "%s: field \"%smrope_section\" sums to %d but the rope dim %d has %d frequencies",
                          c->path, sp, sum, o->rope_dim, o->rope_dim / 2);
    }
    src = get(rp, "mrope_interleaved") ? rp : get(rs, "mrope_interleaved") ? rs : NULL;
    if (src) return get_bool(c, src, src == rp ? rpp : rsp, "mrope_interleaved", 0, &o->mrope_interleaved);
    return 0;
}

static int parse_layer_types(cfg_ctx *c, json_t *lvl, const char *tp, model_config *o) {
    json_t *lt = get(lvl, "layer_types");
    if (!lt) {
        int interval;
        int rc = get_int(c, lvl, tp, "full_attention_interval", 0, 1, CFG_MAX_DIM, 4, &interval);
        if (rc) return rc;
        for (int i = 0; i < o->n_layers; i++)
            o->layer_types[i] = (i + 1) % interval == 0 ? LAYER_FULL : LAYER_LINEAR;
        return 0;
    }
    if (!json_is_array(lt))
        return ci_err(
            c->err, c->errlen, CINFER_EFORMAT,
            "%s: field \"%slayer_types\" must be a list of \"linear_attention\" / \"full_attention\"",
            c->path, tp);
    if (json_array_size(lt) != (size_t)o->n_layers)
        return ci_err(c->err, c->errlen, CINFER_EFORMAT,
                      "%s: field \"%slayer_types\" has %zu entries but num_hidden_layers is %d", c->path, tp,
                      json_array_size(lt), o->n_layers);
    for (int i = 0; i < o->n_layers; i++) {
        const char *s = json_string_value(json_array_get(lt, (size_t)i));
        if (s && !strcmp(s, "linear_attention"))
            o->layer_types[i] = LAYER_LINEAR;
        else if (s && !strcmp(s, "full_attention"))
            o->layer_types[i] = LAYER_FULL;
        else
            return ci_err(c->err, c->errlen, CINFER_EFORMAT,
                          "%s: field \"%slayer_types[%d]\" is %s%.40s%s, not \"linear_attention\" or "
                          "\"full_attention\"",
                          c->path, tp, i, s ? "\"" : "", s ? s : "not a string", s ? "\"" : "");
    }
    return 0;
}

static int parse_ffn(cfg_ctx *c, json_t *lvl, const char *tp, model_config *o) {
    int rc;
    o->norm_topk_prob = 1;
    o->decoder_sparse_step = 1;
    if (o->arch == ARCH_QWEN35)
        return get_int(c, lvl, tp, "intermediate_size", 1, 1, CFG_MAX_DIM, 0, &o->intermediate_size);

    if ((rc = get_int(c, lvl, tp, "num_experts", 1, 1, CFG_MAX_DIM, 0, &o->n_experts)) ||
        (rc = get_int(c, lvl, tp, "num_experts_per_tok", 1, 1, CFG_MAX_DIM, 0, &o->n_experts_per_tok)) ||
        (rc =
             get_int(c, lvl, tp, "moe_intermediate_size", 1, 1, CFG_MAX_DIM, 0, &o->moe_intermediate_size)) ||
        (rc = get_int(c, lvl, tp, "shared_expert_intermediate_size", 1, 0, CFG_MAX_DIM, 0,
                      &o->shared_expert_intermediate_size)))
        return rc;
    if (o->n_experts_per_tok > o->n_experts)
        return ci_err(c->err, c->errlen, CINFER_EFORMAT,
                      "%s: field \"%snum_experts_per_tok\" (%d) must not exceed num_experts (%d)", c->path,
                      tp, o->n_experts_per_tok, o->n_experts);

    /* Qwen3.5-MoE: every layer MoE, top-k always renormalised. transformers dropped norm_topk_prob,
     * decoder_sparse_step and mlp_only_layers for it, so such keys in a file are ignored, as there. */
    if (o->arch == ARCH_QWEN35_MOE)
        return get_int(c, lvl, tp, "intermediate_size", 0, 0, CFG_MAX_DIM, 0, &o->intermediate_size);

    /* Qwen3-Next: the MoE/dense pattern comes from the file. */
    if ((rc = get_bool(c, lvl, tp, "norm_topk_prob", 1, &o->norm_topk_prob)) ||
        (rc = get_int(c, lvl, tp, "decoder_sparse_step", 0, 1, CFG_MAX_DIM, 1, &o->decoder_sparse_step)))
        return rc;
    json_t *ml = get(lvl, "mlp_only_layers");
    if (ml) {
        if (!json_is_array(ml))
            return ci_err(c->err, c->errlen, CINFER_EFORMAT,
                          "%s: field \"%smlp_only_layers\" must be a list of layer indices", c->path, tp);
        for (size_t i = 0; i < json_array_size(ml); i++) {
            json_t *e = json_array_get(ml, i);
            if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= o->n_layers)
                return ci_err(c->err, c->errlen, CINFER_EFORMAT,
                              "%s: field \"%smlp_only_layers[%zu]\" must be a layer index in [0, %d)",
                              c->path, tp, i, o->n_layers);
            o->mlp_only_layers[json_integer_value(e)] = 1;
        }
    }
    int any_dense = 0;
    for (int i = 0; i < o->n_layers; i++) any_dense |= !config_layer_is_moe(o, i);
    return get_int(c, lvl, tp, "intermediate_size", any_dense, any_dense ? 1 : 0, CFG_MAX_DIM, 0,
                   &o->intermediate_size);
}

/* vision_config: Qwen3_5VisionConfig's fields with its defaults. Only gelu_pytorch_tanh blocks exist in
 * Qwen3.5 checkpoints; another activation would change the numbers, so it is refused. */
static int parse_vision(cfg_ctx *c, json_t *vc, model_config *o) {
    const char *tp = "vision_config.";
    int rc;
    if ((rc = get_int(c, vc, tp, "depth", 0, 0, CONFIG_MAX_LAYERS, 27, &o->vis_depth)) ||
        (rc = get_int(c, vc, tp, "hidden_size", 0, 1, CFG_MAX_DIM, 1152, &o->vis_hidden)) ||
        (rc = get_int(c, vc, tp, "intermediate_size", 0, 1, CFG_MAX_DIM, 4304, &o->vis_intermediate)) ||
        (rc = get_int(c, vc, tp, "num_heads", 0, 1, CFG_MAX_DIM, 16, &o->vis_heads)) ||
        (rc = get_int(c, vc, tp, "in_channels", 0, 1, 16, 3, &o->vis_in_channels)) ||
        (rc = get_int(c, vc, tp, "patch_size", 0, 1, 1024, 16, &o->vis_patch)) ||
        (rc = get_int(c, vc, tp, "temporal_patch_size", 0, 1, 64, 2, &o->vis_temporal)) ||
        (rc = get_int(c, vc, tp, "spatial_merge_size", 0, 1, 64, 2, &o->vis_merge)) ||
        (rc = get_int(c, vc, tp, "out_hidden_size", 0, 1, CFG_MAX_DIM, 3584, &o->vis_out_hidden)) ||
        (rc = get_int(c, vc, tp, "num_position_embeddings", 0, 1, CFG_MAX_DIM, 2304, &o->vis_num_pos)))
        return rc;
    if (o->vis_hidden % o->vis_heads || (o->vis_hidden / o->vis_heads) % 4)
        return ci_err(c->err, c->errlen, CINFER_EFORMAT,
                      "%s: vision_config.hidden_size %d over num_heads %d must give a head size divisible by 4",
                      c->path, o->vis_hidden, o->vis_heads);
    int side = 0;
    while ((long long)(side + 1) * (side + 1) <= o->vis_num_pos) side++;
    if (side * side != o->vis_num_pos)
        return ci_err(c->err, c->errlen, CINFER_EFORMAT,
                      "%s: vision_config.num_position_embeddings %d is not a perfect square", c->path,
                      o->vis_num_pos);
    o->vis_rope_theta = 10000.0;
    json_t *vrp = get(vc, "rope_parameters");
    if (vrp && get(vrp, "rope_theta") &&
        (rc = get_pos_num(c, vrp, "vision_config.rope_parameters.", "rope_theta", 1e12, &o->vis_rope_theta)))
        return rc;
    json_t *act = get(vc, "hidden_act");
    if (act && (!json_is_string(act) || strcmp(json_string_value(act), "gelu_pytorch_tanh")))
        return ci_err(c->err, c->errlen, CINFER_EUNSUPPORTED,
                      "%s: vision_config.hidden_act must be \"gelu_pytorch_tanh\"", c->path);
    json_t *ds = get(vc, "deepstack_visual_indexes");
    if (ds && (!json_is_array(ds) || json_array_size(ds) > 0))
        return ci_err(c->err, c->errlen, CINFER_EUNSUPPORTED,
                      "%s: vision_config.deepstack_visual_indexes (Qwen3-VL's deepstack) is not part of Qwen3.5",
                      c->path);
    return 0;
}

int config_parse(const char *json, size_t len, const char *path, model_config *out, char *err,
                 size_t errlen) {
    cfg_ctx cx = {path ? path : "config.json", err, errlen}, *c = &cx;
    memset(out, 0, sizeof *out);
    model_config *o = out;
    o->bos_token_id = -1;
    o->image_token_id = o->video_token_id = o->vision_start_token_id = o->vision_end_token_id = -1;

    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (!root)
        return ci_err(err, errlen, CINFER_EFORMAT, "%s: invalid JSON: %s (line %d, column %d)", c->path,
                      jerr.text, jerr.line, jerr.column);
    int rc = 0;
    if (!json_is_object(root)) {
        rc = ci_err(err, errlen, CINFER_EFORMAT, "%s: the top level is not a JSON object", c->path);
        goto done;
    }

    json_t *mt = get(root, "model_type");
    if (!mt) {
        rc = missing(c, "", "model_type");
        goto done;
    }
    const char *type = json_string_value(mt);
    if (!type) {
        rc = ci_err(err, errlen, CINFER_EFORMAT, "%s: field \"model_type\" must be a string", c->path);
        goto done;
    }
    int wrapper = 0;
    if (!strcmp(type, "qwen3_5"))
        o->arch = ARCH_QWEN35, wrapper = 1;
    else if (!strcmp(type, "qwen3_5_text"))
        o->arch = ARCH_QWEN35;
    else if (!strcmp(type, "qwen3_5_moe"))
        o->arch = ARCH_QWEN35_MOE, wrapper = 1;
    else if (!strcmp(type, "qwen3_5_moe_text"))
        o->arch = ARCH_QWEN35_MOE;
    else if (!strcmp(type, "qwen3_next"))
        o->arch = ARCH_QWEN3_NEXT;
    else {
        rc = ci_err(err, errlen, CINFER_EUNSUPPORTED,
                    "%s: model_type \"%.40s\" is not supported (qwen3_5, qwen3_5_text, qwen3_5_moe, "
                    "qwen3_5_moe_text, qwen3_next)",
                    c->path, type);
        goto done;
    }
    snprintf(o->model_type, sizeof o->model_type, "%s", type);

    /* architectures is informative only (fine-tunes rename it); it just has to be a list of strings. */
    json_t *ar = get(root, "architectures");
    if (ar) {
        int ok = json_is_array(ar);
        for (size_t i = 0; ok && i < json_array_size(ar); i++) ok = json_is_string(json_array_get(ar, i));
        if (!ok) {
            rc = ci_err(err, errlen, CINFER_EFORMAT, "%s: field \"architectures\" must be a list of strings",
                        c->path);
            goto done;
        }
    }

    /* The multimodal wrappers keep the text model in text_config; a wrapper type without one is read flat
     * (as mlx-lm does). The flat types never look inside a text_config. */
    json_t *lvl = root;
    const char *tp = "";
    json_t *tc = get(root, "text_config");
    if (wrapper && tc) {
        if (!json_is_object(tc)) {
            rc = ci_err(err, errlen, CINFER_EFORMAT, "%s: field \"text_config\" must be an object", c->path);
            goto done;
        }
        lvl = tc;
        tp = "text_config.";
        o->multimodal = 1;
    }

    if ((rc = get_int(c, lvl, tp, "hidden_size", 1, 1, CFG_MAX_DIM, 0, &o->hidden_size)) ||
        (rc = get_int(c, lvl, tp, "num_hidden_layers", 1, 1, CONFIG_MAX_LAYERS, 0, &o->n_layers)) ||
        (rc = get_int(c, lvl, tp, "vocab_size", 1, 1, CFG_MAX_DIM, 0, &o->vocab_size)) ||
        (rc = get_int(c, lvl, tp, "num_attention_heads", 1, 1, CFG_MAX_DIM, 0, &o->n_heads)) ||
        (rc = get_int(c, lvl, tp, "num_key_value_heads", 1, 1, CFG_MAX_DIM, 0, &o->n_kv_heads)) ||
        (rc = get_int(c, lvl, tp, "linear_num_key_heads", 1, 1, CFG_MAX_DIM, 0, &o->lin_n_key_heads)) ||
        (rc = get_int(c, lvl, tp, "linear_num_value_heads", 1, 1, CFG_MAX_DIM, 0, &o->lin_n_value_heads)) ||
        (rc = get_int(c, lvl, tp, "linear_key_head_dim", 1, 1, CFG_MAX_DIM, 0, &o->lin_key_head_dim)) ||
        (rc = get_int(c, lvl, tp, "linear_value_head_dim", 1, 1, CFG_MAX_DIM, 0, &o->lin_value_head_dim)) ||
        (rc = get_int(c, lvl, tp, "linear_conv_kernel_dim", 1, 1, CFG_MAX_DIM, 0, &o->lin_conv_kernel)))
        goto done;
    /* transformers' default when head_dim is absent: hidden_size // num_attention_heads. */
    if ((rc = get_int(c, lvl, tp, "head_dim", 0, 1, CFG_MAX_DIM, o->hidden_size / o->n_heads, &o->head_dim)))
        goto done;
    if (o->head_dim <= 0) {
        rc = ci_err(err, errlen, CINFER_EFORMAT,
                    "%s: field \"%shead_dim\" is absent and hidden_size %d / num_attention_heads %d is 0",
                    c->path, tp, o->hidden_size, o->n_heads);
        goto done;
    }
    if (o->n_heads % o->n_kv_heads) {
        rc = ci_err(err, errlen, CINFER_EFORMAT,
                    "%s: field \"%snum_attention_heads\" (%d) must be a multiple of num_key_value_heads (%d)",
                    c->path, tp, o->n_heads, o->n_kv_heads);
        goto done;
    }
    if (o->lin_n_value_heads % o->lin_n_key_heads) {
        rc = ci_err(
            err, errlen, CINFER_EFORMAT,
            "%s: field \"%slinear_num_value_heads\" (%d) must be a multiple of linear_num_key_heads (%d)",
            c->path, tp, o->lin_n_value_heads, o->lin_n_key_heads);
        goto done;
    }
    o->rms_norm_eps = 1e-6;
    if (get(lvl, "rms_norm_eps") && (rc = get_pos_num(c, lvl, tp, "rms_norm_eps", 1.0, &o->rms_norm_eps)))
        goto done;

    if ((rc = parse_layer_types(c, lvl, tp, o)) || (rc = parse_rope(c, lvl, tp, o)) ||
        (rc = parse_ffn(c, lvl, tp, o)))
        goto done;

    /* Tied embeddings: multimodal files say so at the top level, mlx-lm reads text_config; either true
     * counts. */
    int tie_top = 0, tie_text = 0;
    if ((rc = get_bool(c, root, "", "tie_word_embeddings", 0, &tie_top))) goto done;
    if (lvl != root && (rc = get_bool(c, lvl, tp, "tie_word_embeddings", 0, &tie_text))) goto done;
    o->tie_word_embeddings = tie_top || tie_text;

    /* Token ids: the text model's own first, then the top level. */
    json_t *eos = get(lvl, "eos_token_id");
    const char *eos_pre = tp;
    if (!eos) eos = get(root, "eos_token_id"), eos_pre = "";
    if (eos && (rc = get_token_list(c, eos, eos_pre, "eos_token_id", o->eos_token_ids, &o->n_eos))) goto done;
    if (get(lvl, "bos_token_id")) {
        if ((rc = get_int(c, lvl, tp, "bos_token_id", 1, 0, 0x7fffffff, -1, &o->bos_token_id))) goto done;
    } else if ((rc = get_int(c, root, "", "bos_token_id", 0, 0, 0x7fffffff, -1, &o->bos_token_id)))
        goto done;

    if ((rc = get_int(c, lvl, tp, "max_position_embeddings", 0, 0, 0x7fffffff, 0,
                      &o->max_position_embeddings)) ||
        (rc = get_int(c, lvl, tp, "mtp_num_hidden_layers", 0, 0, CONFIG_MAX_LAYERS, 0,
                      &o->mtp_num_hidden_layers)))
        goto done;

    json_t *vc = get(root, "vision_config");
    if (vc && !json_is_object(vc)) {
        rc = ci_err(err, errlen, CINFER_EFORMAT, "%s: field \"vision_config\" must be an object", c->path);
        goto done;
    }
    o->has_vision = vc != NULL;
    if (vc && (rc = parse_vision(c, vc, o))) goto done;
    if ((rc = get_int(c, root, "", "image_token_id", 0, 0, 0x7fffffff, -1, &o->image_token_id)) ||
        (rc = get_int(c, root, "", "video_token_id", 0, 0, 0x7fffffff, -1, &o->video_token_id)) ||
        (rc = get_int(c, root, "", "vision_start_token_id", 0, 0, 0x7fffffff, -1,
                      &o->vision_start_token_id)) ||
        (rc = get_int(c, root, "", "vision_end_token_id", 0, 0, 0x7fffffff, -1, &o->vision_end_token_id)))
        goto done;

done:
    json_decref(root);
    return rc;
}

int config_load(const char *dir, model_config *out, char *err, size_t errlen) {
    char *path = path_join(dir, "config.json"), *text = NULL;
    size_t len = 0;
    int rc = file_read_all(path, CFG_MAX_FILE, &text, &len, err, errlen);
    if (!rc) rc = config_parse(text, len, path, out, err, errlen);
    free(text);
    free(path);
    return rc;
}

int config_layer_is_moe(const model_config *c, int i) {
    if (!c || i < 0 || i >= c->n_layers || c->n_experts <= 0) return 0;
    switch (c->arch) {
    case ARCH_QWEN35_MOE:
        return 1;
    case ARCH_QWEN3_NEXT:
        /* transformers' Qwen3-Next rule: MoE unless listed dense, and only on every decoder_sparse_step-th
         * layer. */
        return !c->mlp_only_layers[i] && c->decoder_sparse_step > 0 && (i + 1) % c->decoder_sparse_step == 0;
    default:
        return 0;
    }
}

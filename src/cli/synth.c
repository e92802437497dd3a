/* synth.c — `cinfer synth --like NAME --out DIR [--layers N] [--vocab N] [--seed S]`: a random-weight
 * checkpoint with the exact shapes of a real model (spec §1.3), for benchmarks: config.json (the text-only
 * form, weights under "model."), bf16 weights (A_log in f32, as real checkpoints store it), sharded at
 * 4 GiB with model.safetensors.index.json when larger. Values are uniform with std 0.02 for matrices, so
 * the arithmetic is realistic; nothing about them is trained. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "io/st_writer.h"
#include "util/bf16.h"
#include "util/file.h"

typedef struct preset {
    const char *name, *model_type;
    int H, L, Hq, Hkv, Hk, Hv, I, E, k, Im, Is, tie, V;
} preset;

/* From spec/qwen35.md §1.3. The 2B's dense width is not published in what we could read: 6144 is an
 * estimate (marked in the table there as unknown). */
static const preset presets[] = {
    {"qwen3.5-0.8b", "qwen3_5_text", 1024, 24, 8, 2, 16, 16, 3584, 0, 0, 0, 0, 1, 248320},
    {"qwen3.5-2b", "qwen3_5_text", 2048, 24, 8, 2, 16, 16, 6144, 0, 0, 0, 0, 1, 248320},
    {"qwen3.5-4b", "qwen3_5_text", 2560, 32, 16, 4, 16, 32, 9216, 0, 0, 0, 0, 1, 248320},
    {"qwen3.5-9b", "qwen3_5_text", 4096, 32, 16, 4, 16, 32, 12288, 0, 0, 0, 0, 0, 248320},
    {"qwen3.5-27b", "qwen3_5_text", 5120, 64, 24, 4, 16, 48, 17408, 0, 0, 0, 0, 0, 248320},
    {"qwen3.5-35b-a3b", "qwen3_5_moe_text", 2048, 40, 16, 2, 16, 32, 0, 256, 8, 512, 512, 0, 248320},
    {"qwen3.5-122b-a10b", "qwen3_5_moe_text", 3072, 48, 32, 2, 16, 64, 0, 256, 8, 1024, 1024, 0, 248320},
    {"qwen3.5-397b-a17b", "qwen3_5_moe_text", 4096, 60, 32, 2, 16, 64, 0, 512, 10, 1024, 1024, 0, 248320},
    {"qwen3-next-80b-a3b", "qwen3_next", 2048, 48, 16, 2, 16, 32, 5120, 512, 10, 512, 512, 0, 151936},
};

enum { INIT_MAT, INIT_NORM0, INIT_ONES, INIT_ALOG, INIT_DT, INIT_CONV };

typedef struct synth_t {
    st_wtensor w;
    int init;
    uint64_t bytes;
} synth_t;

typedef struct synth {
    synth_t *t;
    int n, cap;
    uint64_t seed;
} synth;

static void add(synth *s, int init, st_dtype dt, const char *name, int ndim, int64_t a, int64_t b, int64_t c) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        s->t = realloc(s->t, (size_t)s->cap * sizeof *s->t);
        if (!s->t) abort();
    }
    synth_t *t = &s->t[s->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->w.name, sizeof t->w.name, "%s", name);
    t->w.dtype = dt;
    t->w.ndim = ndim;
    t->w.shape[0] = a;
    t->w.shape[1] = b;
    t->w.shape[2] = c;
    int64_t numel = a * (ndim > 1 ? b : 1) * (ndim > 2 ? c : 1);
    t->bytes = (uint64_t)numel * st_dtype_size(dt);
    t->init = init;
}

#define ADD2(init, fmt, ...) do { snprintf(nm, sizeof nm, fmt, __VA_ARGS__); add(s, init, ST_BF16, nm, 2, r_, c_, 0); } while (0)

/* One decoder layer's tensors under prefix lp: DeltaNet or (full) gated attention, then the MLP or MoE. */
static void add_layer(synth *s, const preset *p, const char *lp, int full) {
    char nm[256];
    int hd = 256, dk = 128, dv = 128, K = 4, kd = p->Hk * dk, vd = p->Hv * dv, C = 2 * kd + vd;
    int64_t r_, c_;
    int next = !strcmp(p->model_type, "qwen3_next");
    snprintf(nm, sizeof nm, "%sinput_layernorm.weight", lp);
    add(s, INIT_NORM0, ST_BF16, nm, 1, p->H, 0, 0);
    snprintf(nm, sizeof nm, "%spost_attention_layernorm.weight", lp);
    add(s, INIT_NORM0, ST_BF16, nm, 1, p->H, 0, 0);
    if (!full) {
        if (next) {
            r_ = 2 * kd + 2 * vd, c_ = p->H;
            ADD2(INIT_MAT, "%slinear_attn.in_proj_qkvz.weight", lp);
            r_ = 2 * p->Hv;
            ADD2(INIT_MAT, "%slinear_attn.in_proj_ba.weight", lp);
        } else {
            r_ = C, c_ = p->H;
            ADD2(INIT_MAT, "%slinear_attn.in_proj_qkv.weight", lp);
            r_ = vd;
            ADD2(INIT_MAT, "%slinear_attn.in_proj_z.weight", lp);
            r_ = p->Hv;
            ADD2(INIT_MAT, "%slinear_attn.in_proj_b.weight", lp);
            ADD2(INIT_MAT, "%slinear_attn.in_proj_a.weight", lp);
        }
        snprintf(nm, sizeof nm, "%slinear_attn.conv1d.weight", lp);
        add(s, INIT_CONV, ST_BF16, nm, 3, C, 1, K);
        snprintf(nm, sizeof nm, "%slinear_attn.A_log", lp);
        add(s, INIT_ALOG, ST_F32, nm, 1, p->Hv, 0, 0);
        snprintf(nm, sizeof nm, "%slinear_attn.dt_bias", lp);
        add(s, INIT_DT, ST_BF16, nm, 1, p->Hv, 0, 0);
        snprintf(nm, sizeof nm, "%slinear_attn.norm.weight", lp);
        add(s, INIT_ONES, ST_BF16, nm, 1, dv, 0, 0);
        r_ = p->H, c_ = vd;
        ADD2(INIT_MAT, "%slinear_attn.out_proj.weight", lp);
    } else {
        r_ = (int64_t)p->Hq * 2 * hd, c_ = p->H;
        ADD2(INIT_MAT, "%sself_attn.q_proj.weight", lp);
        r_ = (int64_t)p->Hkv * hd;
        ADD2(INIT_MAT, "%sself_attn.k_proj.weight", lp);
        ADD2(INIT_MAT, "%sself_attn.v_proj.weight", lp);
        r_ = p->H, c_ = (int64_t)p->Hq * hd;
        ADD2(INIT_MAT, "%sself_attn.o_proj.weight", lp);
        snprintf(nm, sizeof nm, "%sself_attn.q_norm.weight", lp);
        add(s, INIT_NORM0, ST_BF16, nm, 1, hd, 0, 0);
        snprintf(nm, sizeof nm, "%sself_attn.k_norm.weight", lp);
        add(s, INIT_NORM0, ST_BF16, nm, 1, hd, 0, 0);
    }
    if (p->E) {
        r_ = p->E, c_ = p->H;
        ADD2(INIT_MAT, "%smlp.gate.weight", lp);
        if (next) {
            for (int e = 0; e < p->E; e++) {
                r_ = p->Im, c_ = p->H;
                ADD2(INIT_MAT, "%smlp.experts.%d.gate_proj.weight", lp, e);
                ADD2(INIT_MAT, "%smlp.experts.%d.up_proj.weight", lp, e);
                r_ = p->H, c_ = p->Im;
                ADD2(INIT_MAT, "%smlp.experts.%d.down_proj.weight", lp, e);
            }
        } else {
            snprintf(nm, sizeof nm, "%smlp.experts.gate_up_proj", lp);
            add(s, INIT_MAT, ST_BF16, nm, 3, p->E, 2 * p->Im, p->H);
            snprintf(nm, sizeof nm, "%smlp.experts.down_proj", lp);
            add(s, INIT_MAT, ST_BF16, nm, 3, p->E, p->H, p->Im);
        }
        r_ = p->Is, c_ = p->H;
        ADD2(INIT_MAT, "%smlp.shared_expert.gate_proj.weight", lp);
        ADD2(INIT_MAT, "%smlp.shared_expert.up_proj.weight", lp);
        r_ = p->H, c_ = p->Is;
        ADD2(INIT_MAT, "%smlp.shared_expert.down_proj.weight", lp);
        r_ = 1, c_ = p->H;
        ADD2(INIT_MAT, "%smlp.shared_expert_gate.weight", lp);
    } else {
        r_ = p->I, c_ = p->H;
        ADD2(INIT_MAT, "%smlp.gate_proj.weight", lp);
        ADD2(INIT_MAT, "%smlp.up_proj.weight", lp);
        r_ = p->H, c_ = p->I;
        ADD2(INIT_MAT, "%smlp.down_proj.weight", lp);
    }
}

static void build(synth *s, const preset *p, int L, int V) {
    char nm[256];
    int64_t r_, c_;
    r_ = V, c_ = p->H;
    ADD2(INIT_MAT, "%s", "model.embed_tokens.weight");
    if (!p->tie) ADD2(INIT_MAT, "%s", "lm_head.weight");
    add(s, INIT_NORM0, ST_BF16, "model.norm.weight", 1, p->H, 0, 0);
    for (int i = 0; i < L; i++) {
        char lp[64];
        snprintf(lp, sizeof lp, "model.layers.%d.", i);
        add_layer(s, p, lp, (i + 1) % 4 == 0);
    }
    /* the MTP head real checkpoints carry (spec §5): fc over [embedding | hidden], three norms, one
     * full-attention layer with the model's own FFN kind */
    r_ = p->H, c_ = 2 * (int64_t)p->H;
    ADD2(INIT_MAT, "%s", "mtp.fc.weight");
    add(s, INIT_NORM0, ST_BF16, "mtp.pre_fc_norm_embedding.weight", 1, p->H, 0, 0);
    add(s, INIT_NORM0, ST_BF16, "mtp.pre_fc_norm_hidden.weight", 1, p->H, 0, 0);
    add(s, INIT_NORM0, ST_BF16, "mtp.norm.weight", 1, p->H, 0, 0);
    add_layer(s, p, "mtp.layers.0.", 1);
}

/* Deterministic per (seed, tensor, offset): each 8 MB piece restarts a xorshift from a hash of those. */
static void fill(void *ud, int idx, uint64_t off, void *buf, size_t nb) {
    synth *s = ud;
    const synth_t *t = &s->t[idx];
    uint64_t x = s->seed * 0x9e3779b97f4a7c15ull ^ ((uint64_t)idx << 32) ^ off ^ 0x2545f4914f6cdd1dull;
    x |= 1;
    size_t es = st_dtype_size(t->w.dtype), n = nb / es;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        float u = (float)((x >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; /* [-1, 1) */
        float v;
        switch (t->init) {
        case INIT_MAT: v = u * 0.0346f; break; /* std 0.02 */
        case INIT_NORM0: v = u * 0.05f; break;
        case INIT_ONES: v = 1.0f + u * 0.05f; break;
        case INIT_ALOG: v = logf(1.0f + 15.0f * (u * 0.5f + 0.5f)); break;
        case INIT_DT: v = u * 0.5f; break;
        default: v = u * 0.3f; break; /* conv taps */
        }
        if (es == 4) memcpy((char *)buf + 4 * i, &v, 4);
        else ((uint16_t *)buf)[i] = f32_to_bf16(v);
    }
}

static int write_config(const char *dir, const preset *p, int L, int V) {
    json_t *c = json_object();
    int next = !strcmp(p->model_type, "qwen3_next");
    json_object_set_new(c, "architectures", json_pack("[s]", next ? "Qwen3NextForCausalLM" : p->E ? "Qwen3_5MoeForCausalLM" : "Qwen3_5ForCausalLM"));
    json_object_set_new(c, "model_type", json_string(p->model_type));
    json_object_set_new(c, "hidden_size", json_integer(p->H));
    json_object_set_new(c, "num_hidden_layers", json_integer(L));
    json_object_set_new(c, "vocab_size", json_integer(V));
    json_object_set_new(c, "num_attention_heads", json_integer(p->Hq));
    json_object_set_new(c, "num_key_value_heads", json_integer(p->Hkv));
    json_object_set_new(c, "head_dim", json_integer(256));
    json_object_set_new(c, "linear_num_key_heads", json_integer(p->Hk));
    json_object_set_new(c, "linear_num_value_heads", json_integer(p->Hv));
    json_object_set_new(c, "linear_key_head_dim", json_integer(128));
    json_object_set_new(c, "linear_value_head_dim", json_integer(128));
    json_object_set_new(c, "linear_conv_kernel_dim", json_integer(4));
    json_object_set_new(c, "full_attention_interval", json_integer(4));
    json_object_set_new(c, "rms_norm_eps", json_real(1e-6));
    json_object_set_new(c, "tie_word_embeddings", json_boolean(p->tie));
    json_object_set_new(c, "max_position_embeddings", json_integer(262144));
    if (next) {
        json_object_set_new(c, "rope_theta", json_real(1e7));
        json_object_set_new(c, "partial_rotary_factor", json_real(0.25));
        json_object_set_new(c, "norm_topk_prob", json_true());
        json_object_set_new(c, "decoder_sparse_step", json_integer(1));
        json_object_set_new(c, "mlp_only_layers", json_array());
        json_object_set_new(c, "intermediate_size", json_integer(p->I));
        json_object_set_new(c, "eos_token_id", json_integer(151645));
    } else {
        json_object_set_new(c, "rope_parameters", json_pack("{s:s, s:f, s:f, s:[i,i,i], s:b}", "rope_type", "default", "rope_theta", 1e7,
                                                            "partial_rotary_factor", 0.25, "mrope_section", 11, 11, 10,
                                                            "mrope_interleaved", 1));
        json_object_set_new(c, "eos_token_id", json_integer(248044));
        if (!p->E) json_object_set_new(c, "intermediate_size", json_integer(p->I));
    }
    if (p->E) {
        json_object_set_new(c, "num_experts", json_integer(p->E));
        json_object_set_new(c, "num_experts_per_tok", json_integer(p->k));
        json_object_set_new(c, "moe_intermediate_size", json_integer(p->Im));
        json_object_set_new(c, "shared_expert_intermediate_size", json_integer(p->Is));
    }
    char *path = path_join(dir, "config.json");
    int rc = json_dump_file(c, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    free(path);
    json_decref(c);
    return rc;
}

int cli_synth(int argc, char **argv) {
    static const char *const vf[] = {"--like", "--out", "--layers", "--vocab", "--seed", NULL};
    static const char *const bf[] = {"--help", "-h", "--sparse", NULL};
    if (arg_flag(argc, argv, "--help") || arg_flag(argc, argv, "-h") || arg_check(argc, argv, vf, bf, "synth")) {
        printf("usage: cinfer synth --like NAME --out DIR [--layers N] [--vocab N] [--seed S] [--sparse]\n"
               "  --sparse: tensor data left as file holes (zeros, no disk): for benches that make their own weights\n  NAME:");
        for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) printf(" %s", presets[i].name);
        printf("\n");
        return arg_flag(argc, argv, "--help") || arg_flag(argc, argv, "-h") ? 0 : 2;
    }
    const char *like = arg_value(argc, argv, "--like", NULL), *out = arg_value(argc, argv, "--out", NULL), *v;
    if (!like || !out) {
        fprintf(stderr, "cinfer synth: --like NAME and --out DIR are required\n");
        return 2;
    }
    const preset *p = NULL;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (!strcmp(presets[i].name, like)) p = &presets[i];
    if (!p) {
        fprintf(stderr, "cinfer synth: unknown model '%s' (cinfer synth --help lists them)\n", like);
        return 2;
    }
    long L = p->L, V = p->V, seed = 1;
    if ((v = arg_value(argc, argv, "--layers", NULL)) && parse_int(v, "--layers", 1, 1024, &L)) return 2;
    if ((v = arg_value(argc, argv, "--vocab", NULL)) && parse_int(v, "--vocab", 1, 1 << 22, &V)) return 2;
    if ((v = arg_value(argc, argv, "--seed", NULL)) && parse_int(v, "--seed", 0, 0x7fffffff, &seed)) return 2;
    if (mkdir(out, 0755) && errno != EEXIST) {
        fprintf(stderr, "cinfer synth: cannot create %s: %s\n", out, strerror(errno));
        return 1;
    }
    synth s = {0};
    s.seed = (uint64_t)seed;
    build(&s, p, (int)L, (int)V);
    /* shards of at most 4 GiB, in declaration order */
    const uint64_t shard_max = 4ull << 30;
    uint64_t total = 0;
    for (int i = 0; i < s.n; i++) total += s.t[i].bytes;
    int n_shards = 0, rc = 0;
    json_t *wmap = json_object();
    char err[512];
    for (int i0 = 0; i0 < s.n && !rc;) {
        int i1 = i0;
        uint64_t sz = 0;
        while (i1 < s.n && (i1 == i0 || sz + s.t[i1].bytes <= shard_max)) sz += s.t[i1++].bytes;
        n_shards++;
        char fname[64];
        if (total <= shard_max) snprintf(fname, sizeof fname, "model.safetensors");
        else snprintf(fname, sizeof fname, "model-%05d.safetensors", n_shards);
        st_wtensor *w = malloc((size_t)(i1 - i0) * sizeof *w);
        synth sub = {s.t + i0, i1 - i0, 0, s.seed};
        for (int i = i0; i < i1; i++) {
            w[i - i0] = s.t[i].w;
            json_object_set_new(wmap, s.t[i].w.name, json_string(fname));
        }
        char *path = path_join(out, fname);
        fprintf(stderr, "cinfer synth: writing %s (%d tensors, %.2f GB)\n", path, i1 - i0, sz / 1e9);
        rc = st_write_file(path, w, i1 - i0, arg_flag(argc, argv, "--sparse") ? NULL : fill, &sub, err, sizeof err);
        if (rc) fprintf(stderr, "cinfer synth: %s\n", err);
        free(path);
        free(w);
        i0 = i1;
    }
    if (!rc && n_shards > 1) {
        json_t *idx = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total, "weight_map", wmap);
        char *path = path_join(out, "model.safetensors.index.json");
        rc = json_dump_file(idx, path, JSON_INDENT(2));
        free(path);
        json_decref(idx);
    } else {
        json_decref(wmap);
    }
    if (!rc && write_config(out, p, (int)L, (int)V)) {
        fprintf(stderr, "cinfer synth: cannot write %s/config.json\n", out);
        rc = 1;
    }
    free(s.t);
    if (!rc) fprintf(stderr, "cinfer synth: %s-shaped checkpoint in %s (%.2f GB)\n", p->name, out, total / 1e9);
    return rc ? 1 : 0;
}

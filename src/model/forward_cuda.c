/* forward_cuda.c — forward_cpu's pass on a CUDA device (see forward_cuda.h). The host builds one int buffer
 * of per-row / per-entry metadata per call, copies it up, and enqueues the layers; kernels read positions,
 * slots and block tables from that buffer (never from launch arguments), so a decode step of a given batch
 * shape is the same launch sequence every time and is replayed from a captured CUDA graph.
 * Matrices are concatenated on upload where their inputs are the same rows (DeltaNet qkv|z|b|a, attention
 * q|k|v, gate|up), so a layer runs one input GEMM. */
#include "model/forward_cuda.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/mtp.h"
#include "util/alloc.h"
#include "util/bf16.h"
#include "util/err.h"

const char *const cuda_phase_names[CP_N] = {
    "embed+norms",     "in_proj gemm", "deltanet core", "attention core", "out_proj gemm", "ffn gemms",
    "ffn act/combine", "moe router",   "moe experts",   "lm_head",        "logits to host"};

int cuda_sample_eligible(float temperature, int top_k, int V) {
    if (!(temperature >= 0.0f) || V < 1 || V > CUDA_SAMPLE_MAX_V) return 0;
    if (temperature < CUDA_SAMPLE_GREEDY_TEMP || top_k == 1) return 1;
    return top_k > 1 && top_k <= CUDA_SAMPLE_MAX_K && top_k < V;
}

#ifndef CINFER_CUDA

int cuda_built(void) {
    return 0;
}
int cuda_devices(void) {
    return 0;
}
int cuda_fwd_create(const model *m, const cuda_fwd_params *p, cuda_fwd **out, char *err, size_t errlen) {
    (void)m, (void)p;
    *out = NULL;
    return ci_err(err, errlen, CINFER_EUNSUPPORTED,
                  "this build has no CUDA backend (rebuild with nvcc: make CUDA=1)");
}
void cuda_fwd_destroy(cuda_fwd *f) {
    (void)f;
}
int cuda_fwd_slot_reset(cuda_fwd *f, int slot, char *err, size_t errlen) {
    (void)f, (void)slot;
    return ci_err(err, errlen, CINFER_EUNSUPPORTED, "no CUDA backend");
}
int cuda_fwd_run(cuda_fwd *f, const fwd_entry *e, int n, float *logits, char *err, size_t errlen) {
    (void)f, (void)e, (void)n, (void)logits;
    return ci_err(err, errlen, CINFER_EUNSUPPORTED, "no CUDA backend");
}
int cuda_fwd_spec_commit(cuda_fwd *f, int slot, int n_keep, char *err, size_t errlen) {
    (void)f, (void)slot, (void)n_keep;
    return ci_err(err, errlen, CINFER_EUNSUPPORTED, "no CUDA backend");
}
int cuda_fwd_run_sample(cuda_fwd *f, const fwd_entry *e, int n_entries, const cuda_sample *rows, int n,
                        int32_t *ids, float *logprobs, char *err, size_t errlen) {
    (void)f, (void)e, (void)n_entries, (void)rows, (void)n, (void)ids, (void)logprobs;
    return ci_err(err, errlen, CINFER_EUNSUPPORTED, "no CUDA backend");
}
size_t cuda_fwd_state_floats(const cuda_fwd *f) {
    (void)f;
    return 0;
}
int cuda_fwd_state_save(cuda_fwd *f, int slot, float *dst, char *err, size_t errlen) {
    (void)f, (void)slot, (void)dst;
    return ci_err(err, errlen, CINFER_EUNSUPPORTED, "no CUDA backend");
}
int cuda_fwd_state_load(cuda_fwd *f, int slot, const float *src, char *err, size_t errlen) {
    (void)f, (void)slot, (void)src;
    return ci_err(err, errlen, CINFER_EUNSUPPORTED, "no CUDA backend");
}
int cuda_fwd_kv_copy(cuda_fwd *f, int dst, int src, int rows, char *err, size_t errlen) {
    (void)f, (void)dst, (void)src, (void)rows;
    return ci_err(err, errlen, CINFER_EUNSUPPORTED, "no CUDA backend");
}
int cuda_fwd_sync(cuda_fwd *f, char *err, size_t errlen) {
    (void)f;
    return ci_err(err, errlen, CINFER_EUNSUPPORTED, "no CUDA backend");
}
int cuda_fwd_mtp_init(cuda_fwd *f, int n_blocks, char *err, size_t errlen) {
    (void)f, (void)n_blocks;
    return ci_err(err, errlen, CINFER_EUNSUPPORTED, "no CUDA backend");
}
int cuda_fwd_mtp_run(cuda_fwd *f, const fwd_entry *e, const mtp_io *io, int n, int n_vocab, float *logits,
                     char *err, size_t errlen) {
    (void)f, (void)e, (void)io, (void)n, (void)n_vocab, (void)logits;
    return ci_err(err, errlen, CINFER_EUNSUPPORTED, "no CUDA backend");
}
int cuda_fwd_mtp_run_ids(cuda_fwd *f, const fwd_entry *e, const mtp_io *io, int n, int n_vocab, int32_t *ids,
                         char *err, size_t errlen) {
    (void)f, (void)e, (void)io, (void)n, (void)n_vocab, (void)ids;
    return ci_err(err, errlen, CINFER_EUNSUPPORTED, "no CUDA backend");
}
void cuda_fwd_profile(cuda_fwd *f, int on) {
    (void)f, (void)on;
}
void cuda_fwd_profile_get(cuda_fwd *f, double ms[CP_N], int *calls) {
    (void)f;
    memset(ms, 0, sizeof(double) * CP_N);
    *calls = 0;
}
void cuda_fwd_memory(const cuda_fwd *f, size_t *w, size_t *p, size_t *s) {
    (void)f;
    *w = *p = *s = 0;
}
struct cu_ctx *cuda_fwd_stream(cuda_fwd *f) {
    (void)f;
    return NULL;
}
void cuda_fwd_graph_stats(const cuda_fwd *f, int *captured, int *updated) {
    (void)f;
    *captured = *updated = 0;
}
int cuda_fwd_sample(cuda_fwd *f, const cuda_sample *rows, int n, int32_t *ids, float *logprobs, char *err,
                    size_t errlen) {
    (void)f, (void)rows, (void)n, (void)ids, (void)logprobs;
    return ci_err(err, errlen, CINFER_EUNSUPPORTED, "no CUDA backend");
}
void *cuda_host_alloc(size_t bytes, int pin) {
    (void)pin;
    return malloc(bytes);
}
void cuda_host_free(void *p) {
    free(p);
}
void *cuda_dev_alloc(size_t bytes) {
    (void)bytes;
    return NULL;
}
void cuda_dev_free(void *p) {
    (void)p;
}
size_t cuda_dev_free_bytes(void) {
    return 0;
}

#else

#include "backend/cuda/cuda_ops.h"

_Static_assert(CU_PEN_BIAS == SAMPLER_DEV_BIAS && CU_PEN_REP == SAMPLER_DEV_REP &&
                   CU_PEN_SUB == SAMPLER_DEV_SUB,
               "the device sampler's adjusted-token flags are the CPU sampler's");

/* Device weights of one layer. Matrices are bf16 [rows][cols]; vectors f32. */
typedef struct cu_layer {
    uint16_t *w_in;  /* linear: [C + vd + 2Hv][H] (qkv|z|b|a) or Qwen3-Next [2kd + 2vd + 2Hv][H] (qkvz|ba);
                        full: [Hq*2hd + 2kvd][H] (q+gate | k | v) */
    int n_in;        /* its rows */
    uint16_t *w_out; /* [H][vd] or [H][Hq*hd] */
    float *in_norm, *post_norm;          /* [H] */
    float *conv_w, *A, *dt_bias, *gnorm; /* [K][C], [Hv], [Hv], [dv] */
    float *q_norm, *k_norm;              /* [hd] */
    uint16_t *w_gu, *w_down;             /* dense: [2I][H], [H][I] */
    uint16_t *router;                    /* [E][H] */
    uint16_t *e_gu, *e_down;             /* [E][2Im][H], [E][H][Im] */
    uint16_t *sh_gu, *sh_down, *sh_gw;   /* [2Is][H], [H][Is], [1][H]; NULL without a shared expert */
} cu_layer;

#define MAX_GRAPHS         64
#define ATTN_TARGET_BLOCKS 1024 /* split positions until (rows x heads x splits) reaches this */
#define PROF_MAX_MARKS     4096
#define ATTN_SPLIT_WORK    512 /* work items an entry split over keys adds at most (cu_attn_tc_split) */
/* rows a launch of attn_dec_kernel (its partials' bound; CINFER_CUDA_ATTN_DEC) */
#define ATTN_DEC_ROWS      64

/* A captured step: every launch of a batch depends only on these (entries, rows, logits rows, whether a
 * speculative window is in it, attention splits, multimodal rotary rows); per-entry lengths, positions, slots
 * and block tables are read from the metadata buffer, so one graph serves every batch of the same key. */
typedef struct graph_ent {
    int B, T, nl, spec, nochunk, span, nsplit, mm; /* mm: captured with multimodal rotary positions */
    unsigned long long used; /* last replay (the least recently used goes when the table is full) */
    void *exec;
    /* the decode attention's row classes and attn_dec_kernel's span and grid (run_shape: acls, dspan,
     * dnsplit): the launches a class pattern makes are part of the graph */
    int acls, dspan, dnsplit;
} graph_ent;

/* the same key (every field but used and exec) */
static int graph_key_eq(const graph_ent *q, const graph_ent *k) {
    return q->B == k->B && q->T == k->T && q->nl == k->nl && q->spec == k->spec && q->nochunk == k->nochunk &&
           q->span == k->span && q->nsplit == k->nsplit && q->mm == k->mm && q->acls == k->acls &&
           q->dspan == k->dspan && q->dnsplit == k->dnsplit;
}

struct cuda_fwd {
    const model *m;
    cuda_fwd_params p;
    cu_ctx *cu;
    cu_layer *L;
    uint16_t *embed, *lm_head; /* [V][H] (lm_head may alias embed) */
    float *final_norm, *inv_freq;
    void **allocs; /* every device allocation, freed together */
    int n_allocs, cap_allocs;
    size_t bytes_w, bytes_pools, bytes_scratch;
    /* pools */
    float *kpool, *vpool; /* [n_full][n_blocks][16][Hkv*hd] */
    float *conv_state;    /* [slots][n_lin][K-1][C] */
    float *rec_state;     /* [slots][n_lin][Hv][dk][dv] */
    float *spec_rec; /* [slots][n_lin][spec_window][CU_SPEC_REC(C, Hv)] speculative window records, or NULL */
    /* scratch, T = max_tokens rows, S = T * k MoE slots */
    float *x, *xn, *out;      /* [T][H] */
    float *proj;              /* [T][Wp]: the widest first projection / gate_up / router output */
    float *act;               /* [T][Wa]: swiglu output, attention / DeltaNet output */
    float *conv_out, *bg;     /* [T][C], [T][2Hv] */
    float *sq, *sz, *sb, *sa; /* Qwen3-Next split: [T][C], [T][vd], [T][Hv] x 2 */
    uint16_t *xb;             /* [2][max(T, S)][Kmax] bf16 GEMM input: hi then lo halves */
    float *ytmp;              /* [2 x 64][Nmax] f32: stacked hi/lo products of up to 64 rows */
    size_t ytmp_floats;
    float *part; /* attention split partials */
    size_t part_floats;
    /* the prefill tiles' key-span partials (cu_attn_split.part), grown when a batch needs more; with the
     * split switch (CINFER_CUDA_ATTN_SPLIT) */
    float *apart;
    size_t apart_floats;
    int attn_split;    /* 0: off, else the least keys per span (CINFER_CUDA_ATTN_SPLIT) */
    uint16_t *kv16;    /* the tiles' K, V split once (cu_attn_args.kv16; CINFER_CUDA_ATTN_KV16), or NULL */
    int attn_fast;     /* the tiles' fast form (cu_attn_args.fast; precision fast, CINFER_CUDA_ATTN_FAST) */
    float *logits;     /* [T][V] */
    float *moe_logits; /* [T][E] */
    int *moe_idx;      /* [S] */
    float *moe_w;      /* [S] */
    float *xg, *gu, *ea, *ey; /* [S][H], [S][2Im], [S][Im], [S][H] */
    float *shy, *shg;         /* [T][H], [T] */
    int *moe_ident;           /* [S]: 0, 1, 2, ... */
    int *moe_host;            /* device: src [S] | pos [S] | w [S] (floats as bits) */
    int *moe_grp;             /* device: slots grouped by expert, off [E + 1] | perm [S] (cu_moe_gemm*) */
    int moe_fused;            /* the decode MoE block by cu_moe_fused (CINFER_CUDA_MOE_FUSED=0: off) */
    float *moe_fa;            /* [T][k Im + Is]: the fused path's SwiGLU outputs */
    unsigned *moe_cnt;        /* [T]: the fused router's finished-block counters (zeroed, kept zeroed) */
    int moe_variant;          /* cu_moe_args.variant (CINFER_CUDA_MOE_VARIANT, measurements) */
    int moe_pf_grouped;       /* prefill experts by cu_moe_gemm* (CINFER_CUDA_MOE_PREFILL=host: off) */
    int moe_gemm_rows; /* with it, decode batches of at least this many rows too (CINFER_CUDA_MOE_GEMM_ROWS)
                        */
    int *moe_tiles;    /* [E + 1]: 64-slot tiles before each expert (cu_moe_tiles) */
    int moe_pf;        /* CINFER_CUDA_MOE_PF's bits (moe(); where it is read says what each does) */
    int *moe_gscr;     /* [E]: cu_moe_group_tiles' scratch */
    size_t xb_elems;   /* bf16 elements of xb */
    int pdl;           /* cu_set_pdl's level: CINFER_CUDA_PDL=1 2 (every decode kernel), =gemv 1, else 0 */
    int pdl_any;       /* CINFER_CUDA_PDL_ANY=1: level 2 in every step, not only pdl_step()'s (diagnostics) */
    int fuse;          /* norms, adds, SwiGLU in the GEMVs (enqueue; CINFER_CUDA_FUSE=0: off) */
    int *h_moe_idx;    /* pinned [S] */
    float *h_moe_w;    /* pinned [S] */
    int *h_moe_up;     /* pinned [3S] */
    int *h_cnt, *h_off, *h_fill; /* [E + 1] each: rows per expert, their offsets, filled so far */
    int *meta;                   /* device ints */
    int *h_meta;                 /* pinned */
    size_t meta_cap;             /* ints */
    int max_S;
    int tiles_ok; /* the tiled prefill attention kernel fits this head dim */
    /* prefill kernels on the tensor cores (CINFER_CUDA_PREFILL), when they serve the model */
    int gdn_tc, attn_tc; /* gdn_tc: cu_gdn_args.tc (2: the phased form, in gdn_chunk) */
    /* the fused decode kernels' counters, or NULL when off: [max_tokens][Hk] DeltaNet
     * (CINFER_CUDA_GDN_FUSED), [max_tokens][Hq] attention (CINFER_CUDA_ATTN_FUSED) */
    unsigned *gdn_cnt, *attn_cnt;
    /* the fused DeltaNet decode kernel as thread block clusters (cu_gdn_args.dec_cluster) up to
     * gdn_cluster_max entries a step (dec_cluster_max) */
    int gdn_cluster, gdn_cluster_max;
    int gdn_wide;                   /* cu_gdn_args.dec_wide (CINFER_CUDA_GDN_WIDE, default 1) */
    unsigned long long *gdn_stamps; /* CINFER_CUDA_GDN_STAMPS=1 (cu_gdn_args.dec_stamps), else NULL */
    unsigned long long *astamps;    /* CINFER_CUDA_ATTN_STAMPS=1 (cu_attn_args.dec_stamps), else NULL */
    void *gdn_chunk;                /* the phased DeltaNet prefill's scratch (cu_gdn_chunk_bytes), or NULL */
    int gdn_chunk_cap, gdn_chunk_dt;
    int gdn_fast; /* cu_gdn_args.chunk_fast: fast mode's DeltaNet prefill (bf16 operands, one MMA a product);
                     2 also the fused layer (cu_gdn_layer_fast) for batches of prefills only
                   */
    /* CINFER_CUDA_PF_SPLIT: prefill norms and SwiGLU write the next GEMM's bf16 halves themselves (pf_split);
     * xb_for: f->xn while f->xb holds the halves of what a norm would have written there, else NULL */
    int pf_split;
    const float *xb_for;
    int gu16; /* fast mode (CINFER_CUDA_FAST_GU16, default on): mlp's gate_up product in bf16
                 (cu_gemm_presplit_out16) */
    /* precision "fast" (cuda_fwd_params.fast, from the context's cinfer_precision): the prefill's
     * tensor-core work on activations rounded to bf16 once, as llama.cpp and vLLM run it, instead of the
     * near-f32 products of "exact" (the default, which every random fixture needs) */
    int fast;
    int attn_rows; /* rows per prefill attention tile: CU_ATTN_TILE, or cu_attn_tc_rows with attn_tc */
    /* device sampling (cuda_fwd_sample) of the last call's logits rows */
    int last_nl; /* logits rows the last cuda_fwd_run left in f->logits */
    /* one upload per sampled step: [n] rows, then their adjusted tokens (at most CUDA_SAMPLE_PEN_CAP) */
    cu_sample_row *d_smp; /* device [max_tokens] rows + the tokens' room */
    cu_sample_row *h_smp; /* pinned, the same */
    int *d_ids, *h_ids;   /* [max_tokens] device / pinned */
    float *d_lps, *h_lps; /* [max_tokens] device / pinned */
    void *d_am_part;      /* cu_argmax's partials: CU_ARGMAX_PART(max_tokens) bytes */
    unsigned *d_am_cnt;   /* [max_tokens] cu_argmax's counters (zero between launches) */
    void *d_smp_part;     /* cu_sample's scratch: CU_SAMPLE_PART bytes */
    unsigned *d_smp_cnt;  /* [CU_SAMPLE_GROUP] cu_sample's counters (zero between launches) */
    /* the MTP head (cuda_fwd_mtp_init): its weights, its one-layer KV pool and its fc input */
    cu_layer *mtp_L;
    uint16_t *mtp_fc;                          /* [H][2H] */
    float *mtp_norm_e, *mtp_norm_h, *mtp_norm; /* [H] each (1 + w) */
    float *mtp_kpool, *mtp_vpool;              /* [mtp_blocks][16][Hkv*hd] */
    int mtp_blocks;
    float *mtp_cat, *mtp_hin; /* [T][2H] fc input, [T][H] the hidden rows uploaded */
    int *mtp_lmode;           /* [T] host: each entry's logits rows (mtp_io.logits) */
    /* graphs */
    graph_ent graphs[MAX_GRAPHS];
    int n_graphs;
    unsigned long long graph_clock;
    int verify_graphs; /* verify steps replay graphs too (CINFER_CUDA_VERIFY_GRAPHS=1) */
    /* verify-step keys met once and run eagerly: a key is captured the second time it comes, so the shapes a
     * run meets once (the shorter windows where an output budget ends) never pay a capture */
    graph_ent seen[16];
    int n_seen;
    /* CINFER_CUDA_GRAPH_UPDATE=1: a key that differs from a held one only in its attention split (positions
     * grew past a split boundary) updates that one's graph in place instead of instantiating another */
    int graph_update;
    int mtp_graphs;            /* CINFER_CUDA_MTP_GRAPHS=1: the MTP head's runs from graphs too (mtp_run) */
    int n_captures, n_updates; /* graphs made: captured + instantiated, captured + updated in place */
    /* CINFER_CUDA_SPEC_FUSE=1: a window's commit is deferred to its slot's next step, whose conv and
     * recurrent kernels replay the kept tokens first (no commit launches, S read and written once a round);
     * spec_rec then holds two record buffers, a window writing the one its slot's pending commit does not
     * read */
    int spec_fuse;
    int *pend_keep;      /* [n_slots] host: tokens of the slot's last window kept and not yet replayed */
    int *rec_par;        /* [n_slots] host: the record buffer of the slot's last window */
    int *h_keep, *h_par; /* [max_tokens] host: per entry of a call, e_keep and e_par */
    unsigned *
        win_cnt; /* [max_tokens][Hk] counters of the fused verify layer (NULL: CINFER_CUDA_SPEC_WINFUSED=0) */
    int win_v2;  /* its second form (cu_gdn_args.win_v2; 0: CINFER_CUDA_SPEC_WINFUSED=1) */
    /* profiling */
    int profile, prof_calls;
    double prof_ms[CP_N];
    cu_timer *marks[PROF_MAX_MARKS];
    int mark_phase[PROF_MAX_MARKS];
    int n_marks;
    /* CINFER_TTFT_TRACE (diagnostics of a short prefill behind a cached context, bench --prefix-turn): 1 a
     * line per call on stderr with its host phases (metadata, launches or capture, wait) and its device time
     * between two events; 2 also, in eager calls of more than one row, an event and a host timestamp at every
     * phase mark (PDL off in those calls: an event between PDL launches is what the profile avoids) */
    int trace;
    int marking;                      /* this call records marks for the trace (not the profile) */
    double mark_host[PROF_MAX_MARKS]; /* host ms at each mark while marking */
    cu_timer *tr_ev[2];               /* the trace's call start / end events */
    /* CINFER_CUDA_DIAG_AB=1 (measurements; diag_ab): kernel classes (DG_*) left out of / launched twice in
     * the decode steps being captured, and the batch sizes already measured (bit B - 1) */
    int diag_ab, diag_skip, diag_dup;
    size_t l2pf_next; /* CINFER_CUDA_L2PF_NEXT=MB: bytes of the next GEMV's head each fused GEMV prefetches */
    int attn_round;   /* CINFER_CUDA_ATTN_ROUND (default 1): attn_split rounds nsplit up */
    int attn_dec_ns; /* CINFER_CUDA_ATTN_DEC (default): cu_attn_args.dec_nsmax (CINFER_CUDA_ATTN_DEC_NS), else
                        0 */
    int attn_dec_p;  /* with attn_dec_ns: cu_attn_args.dec_p (CINFER_CUDA_ATTN_DEC_P) */
    int attn_dec_1st; /* CINFER_CUDA_ATTN_DEC_1ST: steps of at least this many rows on one stage (0: none) */
    int attn_dec_hs[2]; /* CINFER_CUDA_ATTN_DEC_HS "heads,rows": dec_hs in steps of <= rows rows */
    size_t part_attn;   /* floats of part for attn_kernel's partials; attn_dec_kernel's follow them */
    int l2pf_next_rows; /* CINFER_CUDA_L2PF_NEXT_ROWS (default 32): L2PF_NEXT only in steps of at most this
                           many rows */
    int step_rows;      /* the rows of the step enqueue() is building */
    int attn_pf;        /* CINFER_CUDA_ATTN_PF (cu_set_attn_decode_pf) */
    int glu[2];         /* CINFER_CUDA_GEMV_GLU "nr,var" (cu_set_gemv3_glu) */
    unsigned long long diag_done;
    /* CINFER_CUDA_G3_STAMPS=1 (measurements): every block of in_proj and out_proj in one-row steps records
     * its start, PDL wait and end (cu_gemv3_stamps_begin); g3st_kind[tag]: layer * 4 + 2 (attention) + 1
     * (out_proj); the timeline goes to stderr at teardown */
    int g3st_on, *g3st_kind;
};

int cuda_built(void) {
    return 1;
}
int cuda_devices(void) {
    return cu_device_count();
}

static int dev_alloc(cuda_fwd *f, void **p, size_t bytes, size_t *acct, char *err, size_t errlen) {
    int rc = cu_alloc(p, bytes, err, errlen);
    if (rc) return rc;
    if (f->n_allocs == f->cap_allocs) {
        f->cap_allocs = f->cap_allocs ? 2 * f->cap_allocs : 256;
        f->allocs = xrealloc(f->allocs, (size_t)f->cap_allocs * sizeof(void *));
    }
    f->allocs[f->n_allocs++] = *p;
    *acct += bytes;
    return 0;
}

/* Copies rows of a host matrix (bf16/f16/f32) into bf16 device memory at dst, converting through a staging
 * buffer; with random weights the rows are filled with noise on the device instead. */
typedef struct upload_ctx {
    uint16_t *stage;
    size_t stage_elems;
    uint64_t seed;
} upload_ctx;

static int upload_mat(cuda_fwd *f, upload_ctx *u, uint16_t *dst, const wmat *w, char *err, size_t errlen) {
    size_t n = (size_t)w->rows * w->cols;
    if (!n) return 0;
    if (f->p.random_weights) {
        cu_fill_random_bf16(f->cu, dst, n, 0.02f, u->seed++);
        return 0;
    }
    if (w->type == WT_BF16) return cu_upload(dst, w->data, n * 2, err, errlen);
    for (size_t off = 0; off < n; off += u->stage_elems) {
        size_t cnt = n - off < u->stage_elems ? n - off : u->stage_elems;
        for (size_t i = 0; i < cnt; i++) {
            float v = w->type == WT_F32 ? ((const float *)w->data)[off + i]
                                        : f16_to_f32(((const uint16_t *)w->data)[off + i]);
            u->stage[i] = f32_to_bf16(v);
        }
        int rc = cu_upload(dst + off, u->stage, cnt * 2, err, errlen);
        if (rc) return rc;
    }
    return 0;
}

/* a device matrix holding the given host matrices one after another (same cols) */
static int upload_cat(cuda_fwd *f, upload_ctx *u, uint16_t **out, const wmat *const *ws, int nw,
                      int *rows_out, char *err, size_t errlen) {
    size_t rows = 0;
    int cols = ws[0]->cols;
    for (int i = 0; i < nw; i++) {
        if (ws[i]->cols != cols)
            return ci_err(err, errlen, CINFER_EFORMAT, "concatenated matrices differ in width");
        rows += (size_t)ws[i]->rows;
    }
    int rc = dev_alloc(f, (void **)out, rows * cols * 2, &f->bytes_w, err, errlen);
    if (rc) return rc;
    size_t r0 = 0;
    for (int i = 0; i < nw; i++) {
        if ((rc = upload_mat(f, u, *out + r0 * cols, ws[i], err, errlen))) return rc;
        r0 += (size_t)ws[i]->rows;
    }
    if (rows_out) *rows_out = (int)rows;
    return 0;
}

static int upload_vec(cuda_fwd *f, float **out, const float *v, size_t n, char *err, size_t errlen) {
    int rc = dev_alloc(f, (void **)out, n * sizeof(float), &f->bytes_w, err, errlen);
    return rc ? rc : cu_upload(*out, v, n * sizeof(float), err, errlen);
}

/* one decoder layer's weights (the model's layer l, or the MTP head's layer) */
static int upload_layer(cuda_fwd *f, upload_ctx *u, cu_layer *cl, const layer_weights *lw, int l, char *err,
                        size_t errlen) {
    const model *m = f->m;
    int rc = 0;
    if ((rc = upload_vec(f, &cl->in_norm, lw->in_norm, (size_t)m->H, err, errlen)) ||
        (rc = upload_vec(f, &cl->post_norm, lw->post_norm, (size_t)m->H, err, errlen)))
        return rc;
    if (lw->type == LAYER_LINEAR) {
        if (lw->fused_qkvz) {
            const wmat *ws[2] = {&lw->in_qkvz, &lw->in_ba};
            rc = upload_cat(f, u, &cl->w_in, ws, 2, &cl->n_in, err, errlen);
        } else {
            const wmat *ws[4] = {&lw->in_qkv, &lw->in_z, &lw->in_b, &lw->in_a};
            rc = upload_cat(f, u, &cl->w_in, ws, 4, &cl->n_in, err, errlen);
        }
        const wmat *wo[1] = {&lw->out_proj};
        if (rc || (rc = upload_cat(f, u, &cl->w_out, wo, 1, NULL, err, errlen)) ||
            (rc = upload_vec(f, &cl->conv_w, lw->conv_w, (size_t)m->K * m->C, err, errlen)) ||
            (rc = upload_vec(f, &cl->A, lw->A, (size_t)m->Hv, err, errlen)) ||
            (rc = upload_vec(f, &cl->dt_bias, lw->dt_bias, (size_t)m->Hv, err, errlen)) ||
            (rc = upload_vec(f, &cl->gnorm, lw->gnorm, (size_t)m->dv, err, errlen)))
            return rc;
    } else {
        const wmat *ws[3] = {&lw->q_proj, &lw->k_proj, &lw->v_proj};
        const wmat *wo[1] = {&lw->o_proj};
        if ((rc = upload_cat(f, u, &cl->w_in, ws, 3, &cl->n_in, err, errlen)) ||
            (rc = upload_cat(f, u, &cl->w_out, wo, 1, NULL, err, errlen)) ||
            (rc = upload_vec(f, &cl->q_norm, lw->q_norm, (size_t)m->hd, err, errlen)) ||
            (rc = upload_vec(f, &cl->k_norm, lw->k_norm, (size_t)m->hd, err, errlen)))
            return rc;
    }
    if (!lw->moe) {
        const wmat *gu[2] = {&lw->mlp_gate, &lw->mlp_up};
        const wmat *dn[1] = {&lw->mlp_down};
        if ((rc = upload_cat(f, u, &cl->w_gu, gu, 2, NULL, err, errlen)) ||
            (rc = upload_cat(f, u, &cl->w_down, dn, 1, NULL, err, errlen)))
            return rc;
    } else {
        const moe_weights *mw = &lw->moe_w;
        int E = m->cfg.n_experts, Im = m->cfg.moe_intermediate_size, H = m->H;
        const wmat *r1[1] = {&mw->router};
        if ((rc = upload_cat(f, u, &cl->router, r1, 1, NULL, err, errlen)) ||
            (rc = dev_alloc(f, (void **)&cl->e_gu, (size_t)E * 2 * Im * H * 2, &f->bytes_w, err, errlen)) ||
            (rc = dev_alloc(f, (void **)&cl->e_down, (size_t)E * H * Im * 2, &f->bytes_w, err, errlen)))
            return rc;
        for (int e = 0; e < E && !rc; e++) {
            if (mw->gate[e].rows != Im || mw->up[e].rows != Im || mw->down[e].cols != Im) {
                rc = ci_err(err, errlen, CINFER_EFORMAT, "layer %d expert %d: unexpected shape", l, e);
                return rc;
            }
            uint16_t *g = cl->e_gu + (size_t)e * 2 * Im * H;
            if ((rc = upload_mat(f, u, g, &mw->gate[e], err, errlen)) ||
                (rc = upload_mat(f, u, g + (size_t)Im * H, &mw->up[e], err, errlen)) ||
                (rc = upload_mat(f, u, cl->e_down + (size_t)e * H * Im, &mw->down[e], err, errlen)))
                return rc;
        }
        if (rc) return rc;
        if (mw->sh_gate.rows > 0) {
            const wmat *sgu[2] = {&mw->sh_gate, &mw->sh_up};
            const wmat *sdn[1] = {&mw->sh_down};
            const wmat *sgw[1] = {&mw->sh_gate_w};
            if ((rc = upload_cat(f, u, &cl->sh_gu, sgu, 2, NULL, err, errlen)) ||
                (rc = upload_cat(f, u, &cl->sh_down, sdn, 1, NULL, err, errlen)) ||
                (rc = upload_cat(f, u, &cl->sh_gw, sgw, 1, NULL, err, errlen)))
                return rc;
        }
    }
    return 0;
}

static int upload_layers(cuda_fwd *f, char *err, size_t errlen) {
    const model *m = f->m;
    upload_ctx u = {NULL, (size_t)1 << 22, f->p.seed ? f->p.seed : 1};
    u.stage = xmalloc(u.stage_elems * sizeof(uint16_t));
    int rc = 0;
    f->L = xcalloc((size_t)m->L, sizeof(cu_layer));
    const wmat *one[1] = {&m->embed};
    if ((rc = upload_cat(f, &u, &f->embed, one, 1, NULL, err, errlen))) goto done;
    if (m->lm_head.data == m->embed.data && !f->p.random_weights) {
        f->lm_head = f->embed;
    } else {
        one[0] = &m->lm_head;
        if ((rc = upload_cat(f, &u, &f->lm_head, one, 1, NULL, err, errlen))) goto done;
    }
    if ((rc = upload_vec(f, &f->final_norm, m->final_norm, (size_t)m->H, err, errlen))) goto done;
    for (int l = 0; l < m->L && !rc; l++) rc = upload_layer(f, &u, &f->L[l], &m->layers[l], l, err, errlen);
    if (!rc) rc = cu_sync(f->cu, err, errlen);
done:
    free(u.stage);
    return rc;
}

static size_t zmax(size_t a, size_t b) {
    return a > b ? a : b;
}

static int alloc_scratch(cuda_fwd *f, char *err, size_t errlen) {
    const model *m = f->m;
    const model_config *c = &m->cfg;
    size_t T = (size_t)f->p.max_tokens, H = (size_t)m->H, vd = (size_t)m->Hv * m->dv,
           kvd = (size_t)m->Hkv * m->hd;
    int k = c->n_experts_per_tok > 0 ? c->n_experts_per_tok : 1;
    size_t S = m->cfg.n_experts > 0 ? T * (size_t)k : 1;
    f->max_S = (int)S;
    size_t I = (size_t)c->intermediate_size, Im = (size_t)c->moe_intermediate_size,
           Is = (size_t)c->shared_expert_intermediate_size;
    size_t Wp = 2 * zmax(I, Is) + 8;
    for (int l = 0; l < m->L; l++) Wp = zmax(Wp, (size_t)f->L[l].n_in);
    Wp = zmax(Wp, (size_t)c->n_experts);
    size_t Wa = zmax(zmax(I, Is), zmax(vd, (size_t)m->Hq * m->hd));
    size_t Kmax = zmax(zmax(H, zmax(I, Is)), zmax(zmax(vd, (size_t)m->Hq * m->hd), zmax(Im, 8)));
    if (m->mtp.present) Kmax = zmax(Kmax, 2 * H); /* the MTP head's fc reads [embedding | hidden] rows */
    (void)kvd;
    /* attention partials: splits are only used while rows x heads < ATTN_TARGET_BLOCKS (see attn_split) */
    f->part_floats = f->part_attn = (size_t)2 * ATTN_TARGET_BLOCKS * (size_t)(m->hd + 2);
    /* CINFER_CUDA_ATTN_DEC: up to attn_dec_ns spans for any row (a row's spans follow its own position),
     * for ATTN_DEC_ROWS rows a launch (attention() launches more rows in groups), after attn_kernel's (a
     * batch may hold rows of both) */
    if (f->attn_dec_ns) {
        size_t rows = T < ATTN_DEC_ROWS ? T : ATTN_DEC_ROWS;
        /* attn_kernel's rows below attn_dec_p: up to CU_ATTN_ROW_NS spans each (cu_attn_row_span) */
        f->part_attn = zmax(f->part_attn, rows * m->Hq * CU_ATTN_ROW_NS * (size_t)(m->hd + 2));
        f->part_floats = f->part_attn + rows * m->Hq * (size_t)f->attn_dec_ns * (size_t)(m->hd + 4);
    }
    size_t *a = &f->bytes_scratch;
    int rc;
    if ((rc = dev_alloc(f, (void **)&f->x, T * H * 4, a, err, errlen)) ||
        (rc = dev_alloc(f, (void **)&f->xn, T * H * 4, a, err, errlen)) ||
        (rc = dev_alloc(f, (void **)&f->out, T * H * 4, a, err, errlen)) ||
        (rc = dev_alloc(f, (void **)&f->proj, T * Wp * 4, a, err, errlen)) ||
        (rc = dev_alloc(f, (void **)&f->act, T * Wa * 4, a, err, errlen)) ||
        (rc = dev_alloc(f, (void **)&f->xb, (f->xb_elems = 2 * zmax(T, S) * Kmax) * 2, a, err, errlen)) ||
        (rc = dev_alloc(f, (void **)&f->ytmp,
                        (f->ytmp_floats = (size_t)128 * zmax(Wp, zmax(H, (size_t)m->V))) * 4, a, err,
                        errlen)) ||
        (rc = dev_alloc(f, (void **)&f->part, f->part_floats * 4, a, err, errlen)) ||
        (rc = dev_alloc(f, (void **)&f->logits, T * (size_t)m->V * 4, a, err, errlen)))
        return rc;
    if (m->n_lin > 0) {
        if ((rc = dev_alloc(f, (void **)&f->conv_out, T * (size_t)m->C * 4, a, err, errlen)) ||
            (rc = dev_alloc(f, (void **)&f->bg, T * 2 * (size_t)m->Hv * 4, a, err, errlen)) ||
            (rc = dev_alloc(f, (void **)&f->sq, T * (size_t)m->C * 4, a, err, errlen)) ||
            (rc = dev_alloc(f, (void **)&f->sz, T * vd * 4, a, err, errlen)) ||
            (rc = dev_alloc(f, (void **)&f->sb, T * (size_t)m->Hv * 4, a, err, errlen)) ||
            (rc = dev_alloc(f, (void **)&f->sa, T * (size_t)m->Hv * 4, a, err, errlen)))
            return rc;
    }
    if (c->n_experts > 0) {
        size_t E = (size_t)c->n_experts;
        if ((rc = dev_alloc(f, (void **)&f->moe_logits, T * E * 4, a, err, errlen)) ||
            (rc = dev_alloc(f, (void **)&f->moe_idx, S * 4, a, err, errlen)) ||
            (rc = dev_alloc(f, (void **)&f->moe_w, S * 4, a, err, errlen)) ||
            (rc = dev_alloc(f, (void **)&f->xg, S * H * 4, a, err, errlen)) ||
            (rc = dev_alloc(f, (void **)&f->gu, S * 2 * Im * 4, a, err, errlen)) ||
            (rc = dev_alloc(f, (void **)&f->ea, S * Im * 4, a, err, errlen)) ||
            (rc = dev_alloc(f, (void **)&f->ey, S * H * 4, a, err, errlen)) ||
            (rc = dev_alloc(f, (void **)&f->shy, T * H * 4, a, err, errlen)) ||
            (rc = dev_alloc(f, (void **)&f->shg, T * 4, a, err, errlen)) ||
            (rc = dev_alloc(f, (void **)&f->moe_ident, S * 4, a, err, errlen)) ||
            (rc = dev_alloc(f, (void **)&f->moe_host, 3 * S * 4, a, err, errlen)) ||
            (rc = dev_alloc(f, (void **)&f->moe_grp, (E + 1 + S) * 4, a, err, errlen)) ||
            (rc = dev_alloc(f, (void **)&f->moe_fa, (S * Im + T * Is) * 4, a, err, errlen)) ||
            (rc = dev_alloc(f, (void **)&f->moe_cnt, T * 4, a, err, errlen)) ||
            (rc = dev_alloc(f, (void **)&f->moe_tiles, (E + 1) * 4, a, err, errlen)) ||
            (rc = dev_alloc(f, (void **)&f->moe_gscr, E * 4, a, err, errlen)) ||
            (rc = cu_alloc_host((void **)&f->h_moe_idx, S * 4, err, errlen)) ||
            (rc = cu_alloc_host((void **)&f->h_moe_w, S * 4, err, errlen)) ||
            (rc = cu_alloc_host((void **)&f->h_moe_up, 3 * S * 4, err, errlen)))
            return rc;
        f->h_cnt = xcalloc(E + 1, sizeof(int));
        f->h_off = xcalloc(E + 1, sizeof(int));
        f->h_fill = xcalloc(E + 1, sizeof(int));
        for (size_t i = 0; i < S; i++) f->h_moe_up[i] = (int)i;
        if ((rc = cu_upload(f->moe_ident, f->h_moe_up, S * 4, err, errlen))) return rc;
    }
    /* metadata: ids, row_pos, row_entry (T each), five per-entry arrays (<= T entries), logit rows (T), and
     * block tables (each KV block belongs to one sequence, so at most n_blocks + one table per entry) */
    size_t bps = ((size_t)f->p.max_ctx + 15) / 16;
    size_t tables = zmax(T * bps < (size_t)f->p.n_blocks + T ? T * bps : (size_t)f->p.n_blocks + T, 1);
    /* + spec flags (<= T entries), attention tiles (at most one per row), hidden rows (T) and [T][3] mRoPE
     * positions */
    f->meta_cap = 18 * T + tables + 64; /* + the MTP head's attention starts, e_keep, e_par (<= T entries) */
    /* + the attention tiles' key splits: spans per entry, partial offsets and merged rows (T each), work
     * items (2 ints: the tiles, and up to ATTN_SPLIT_WORK more per split entry) */
    f->meta_cap += 5 * T + 2 * (T < (size_t)f->p.n_slots ? T : (size_t)f->p.n_slots) * ATTN_SPLIT_WORK;
    if ((rc = dev_alloc(f, (void **)&f->meta, f->meta_cap * 4, a, err, errlen)) ||
        (rc = cu_alloc_host((void **)&f->h_meta, f->meta_cap * 4, err, errlen)))
        return rc;
    size_t up = T * sizeof(cu_sample_row) + CUDA_SAMPLE_PEN_CAP * sizeof(cu_sample_pen);
    if ((rc = dev_alloc(f, (void **)&f->d_smp, up, a, err, errlen)) ||
        (rc = dev_alloc(f, (void **)&f->d_ids, T * 4, a, err, errlen)) ||
        (rc = dev_alloc(f, (void **)&f->d_lps, T * 4, a, err, errlen)) ||
        (rc = dev_alloc(f, &f->d_am_part, CU_ARGMAX_PART(T), a, err, errlen)) ||
        (rc = dev_alloc(f, (void **)&f->d_am_cnt, T * 4, a, err, errlen)) ||
        (rc = dev_alloc(f, &f->d_smp_part, CU_SAMPLE_PART, a, err, errlen)) ||
        (rc = dev_alloc(f, (void **)&f->d_smp_cnt, CU_SAMPLE_GROUP * 4, a, err, errlen)) ||
        (rc = cu_alloc_host((void **)&f->h_smp, up, err, errlen)) ||
        (rc = cu_alloc_host((void **)&f->h_ids, T * 4, err, errlen)) ||
        (rc = cu_alloc_host((void **)&f->h_lps, T * 4, err, errlen)))
        return rc;
    return 0;
}

/* A kernel's phase stamps (CINFER_CUDA_GDN_STAMPS, CINFER_CUDA_ATTN_STAMPS): dev holds a count, then up to
 * cap records of ns %globaltimer stamps; the mean of each phase (stamp x - stamp x-1, named phase[x - 1])
 * over the last three quarters of the records (warm) goes to stderr */
static void stamps_report(const char *what, const void *dev, size_t cap, int ns, const char *const *phase) {
    size_t n = 1 + cap * (size_t)ns;
    unsigned long long *h = malloc(n * sizeof *h);
    double *acc = calloc((size_t)ns, sizeof *acc);
    char err[256];
    if (h && acc && !cu_download(h, dev, n * sizeof *h, err, sizeof err)) {
        size_t cnt = h[0] < cap ? (size_t)h[0] : cap, used = 0;
        for (size_t i = cnt / 4; i < cnt; i++, used++)
            for (int x = 1; x < ns; x++) acc[x] += (double)(h[1 + i * ns + x] - h[1 + i * ns + x - 1]) / 1e3;
        if (used) {
            fprintf(stderr, "cinfer cuda: %s stamps over %zu of %llu records (us):", what, used, h[0]);
            for (int x = 1; x < ns; x++)
                fprintf(stderr, "%s %s %.3f", x > 1 ? "," : "", phase[x - 1], acc[x] / used);
            fputc('\n', stderr);
        }
    }
    free(acc);
    free(h);
}

/* CINFER_CUDA_G3_STAMPS: records kept (cu_gemv3_stamps_begin) and tags whose kind is remembered */
#define G3ST_CAP           (1u << 21)
#define G3ST_KINDS         8192

/* one launch of a stamped GEMV in one step (the graph replays a tag once a step) */
typedef struct g3_occ {
    int tag;
    unsigned long long s0, smed, w0, e1; /* first / median start, first wait done, last end */
    int n, early;                        /* blocks, blocks started before the first wait was done */
} g3_occ;
static int g3st_cmp(const void *a, const void *b) {
    const cu_g3_stamp *x = a, *y = b;
    if (x->tag != y->tag) return x->tag < y->tag ? -1 : 1;
    return x->t[0] < y->t[0] ? -1 : x->t[0] > y->t[0];
}
/* The timeline of out_proj against in_proj in the one-row steps, per layer kind (DeltaNet, attention): from
 * in_proj's last block end E, when out_proj's blocks start, how many start before the core kernel between
 * them ends (out_proj's first wait done), when they are done. Means over every replay but each tag's first.
 * What it showed (H200, session 10 calls 3-4, 4B batch 1 after 512 positions, us from E): DeltaNet layers -
 * out_proj's 640 blocks all start before the core ends (first +2.6-3.0, median +2.8-3.2), the core ends
 * +5.9-6.2 (its block 0: 3.3 after its own wait), out_proj done 6.0 after the core, as long as a cold
 * 21 MB GEMV; attention layers - first +4.6, median +8.8, core end +17.9, done 6.3 after it. A kernel's
 * dependents are placed only once the kernel before it has completed: moving the DeltaNet kernel's
 * launch_dependents before its PDL wait left out_proj's first block at +3.05 (+3.03), so out_proj gets ~3
 * us beside the DeltaNet kernel, in which its resident blocks hold only their first 2 chunks a warp (5 MB).
 * Lost there (same bits, removed): out_proj's rows copied whole into shared memory before the wait (bulk
 * copies, 128 / 256 blocks: the rows landed +13.2, 7 us after the core; 4B b1 407.5 -> 359.6 / 366.6
 * tok/s), 8 / 4 chunks a warp before the wait (62% / 82% of the blocks resident early, 7.9 / 9.1 us after
 * the core; 397.8 / 393.6), a max-shared carveout (GEMVs: in_proj 17.3 -> 20.0 us, the L1 left holds too
 * few loads in flight, 404 -> 363; the DeltaNet kernel: its end +6.1 -> +9.2) */
static void g3_timeline_report(cuda_fwd *f) {
    cu_g3_stamp *st = malloc((size_t)G3ST_CAP * sizeof *st);
    g3_occ *oc = st ? malloc((size_t)G3ST_CAP / 16 * sizeof *oc) : NULL;
    char err[256];
    long n = st ? cu_gemv3_stamps_end(f->cu, st, G3ST_CAP, err, sizeof err) : -1;
    if (!oc || n <= 0) {
        fprintf(stderr, "cinfer cuda: g3 stamps: none (%ld)\n", n);
        free(st), free(oc);
        return;
    }
    qsort(st, (size_t)n, sizeof *st, g3st_cmp);
    long no = 0, cap = (long)G3ST_CAP / 16;
    for (long i = 0; i < n && no < cap;) { /* occurrences: a tag's blocks, split where starts jump > 200 us */
        long j = i + 1;
        while (j < n && st[j].tag == st[i].tag && st[j].t[0] - st[j - 1].t[0] < 200000) j++;
        g3_occ *o = &oc[no++];
        o->tag = (int)st[i].tag, o->n = (int)(j - i), o->s0 = st[i].t[0], o->smed = st[i + (j - i) / 2].t[0];
        o->w0 = ~0ull, o->e1 = 0, o->early = 0;
        for (long k = i; k < j; k++) {
            if (st[k].t[1] < o->w0) o->w0 = st[k].t[1];
            if (st[k].t[2] > o->e1) o->e1 = st[k].t[2];
        }
        for (long k = i; k < j; k++) o->early += st[k].t[0] < o->w0;
        i = j;
    }
    /* per kind: in_proj length, out start first / median after E, early share, core end, out end, blocks */
    double acc[2][7] = {{0}};
    int cnt[2] = {0, 0};
    for (long a = 0; a < no; a++) {
        int kd = oc[a].tag < G3ST_KINDS ? f->g3st_kind[oc[a].tag] : 0;
        if (!(kd & 1) || a == 0 || oc[a - 1].tag != oc[a].tag) continue; /* out_proj, not its tag's first */
        const g3_occ *in = NULL; /* the in_proj launch of the same step: tag - 1, ended last before */
        for (long b = 0; b < no; b++)
            if (oc[b].tag == oc[a].tag - 1 && oc[b].e1 <= oc[a].w0 && oc[a].w0 - oc[b].e1 < 100000 &&
                (!in || oc[b].e1 > in->e1))
                in = &oc[b];
        if (!in) continue;
        int at = (kd & 2) != 0;
        double E = (double)in->e1;
        acc[at][0] += (E - (double)in->s0) / 1e3;
        acc[at][1] += ((double)oc[a].s0 - E) / 1e3;
        acc[at][2] += ((double)oc[a].smed - E) / 1e3;
        acc[at][3] += (double)oc[a].early / oc[a].n;
        acc[at][4] += ((double)oc[a].w0 - E) / 1e3;
        acc[at][5] += ((double)oc[a].e1 - E) / 1e3;
        acc[at][6] += oc[a].n;
        cnt[at]++;
    }
    for (int at = 0; at < 2; at++) {
        if (!cnt[at]) continue;
        double *v = acc[at];
        int c = cnt[at];
        fprintf(
            stderr,
            "cinfer cuda: g3 timeline %s (%d launches, %.0f blocks; us from in_proj's last end E): in_proj "
            "%.2f long; out_proj first start %+.2f, median start %+.2f, %.0f%% of blocks started before "
            "the core ended; core ended (out_proj's first wait done) %+.2f; out_proj done %+.2f (%.2f "
            "after the core)\n",
            at ? "attention" : "deltanet", c, v[6] / c, v[0] / c, v[1] / c, v[2] / c, 100.0 * v[3] / c,
            v[4] / c, v[5] / c, (v[5] - v[4]) / c);
    }
    free(st), free(oc);
}

/* CINFER_CUDA_GDN_STAMPS: the clustered DeltaNet kernel's phases (block 0) */
static void gdn_stamps_report(cuda_fwd *f) {
    static const char *const ph[CU_GDN_STAMPS - 1] = {
        "start->wait",      "wait->conv",   "conv->l2norm",          "l2norm->read-out",
        "read-out->update", "update->sent", "sent->cluster barrier", "barrier->end"};
    stamps_report("gdn (block 0)", f->gdn_stamps, CU_GDN_STAMP_CAP, CU_GDN_STAMPS, ph);
}

/* CINFER_CUDA_ATTN_STAMPS: the fused dec kernel's merging blocks' phases */
static void attn_stamps_report(cuda_fwd *f) {
    static const char *const ph[CU_ATTN_STAMPS - 1] = {
        "start->wait",       "wait->norms",    "norms->chunks",  "chunks->partials",
        "partials->counter", "counter->(m,l)", "(m,l)->weights", "weights->end"};
    stamps_report("attn (merging block)", f->astamps, CU_ATTN_STAMP_CAP, CU_ATTN_STAMPS, ph);
}

void cuda_fwd_destroy(cuda_fwd *f) {
    if (!f) return;
    if (f->astamps) attn_stamps_report(f);
    if (f->gdn_stamps) gdn_stamps_report(f);
    if (f->g3st_on) g3_timeline_report(f);
    free(f->g3st_kind);
    for (int i = 0; i < f->n_graphs; i++) cu_graph_destroy(f->graphs[i].exec);
    for (int i = 0; i < PROF_MAX_MARKS; i++) cu_timer_destroy(f->marks[i]);
    cu_timer_destroy(f->tr_ev[0]);
    cu_timer_destroy(f->tr_ev[1]);
    for (int i = 0; i < f->n_allocs; i++) cu_free(f->allocs[i]);
    cu_free(f->apart);
    cu_free_host(f->h_meta);
    cu_free_host(f->h_moe_idx);
    cu_free_host(f->h_moe_w);
    cu_free_host(f->h_moe_up);
    cu_free_host(f->h_smp);
    cu_free_host(f->h_ids);
    cu_free_host(f->h_lps);
    cu_ctx_destroy(f->cu);
    free(f->allocs);
    free(f->L);
    free(f->mtp_L);
    free(f->mtp_lmode);
    free(f->h_cnt);
    free(f->h_off);
    free(f->h_fill);
    free(f->pend_keep), free(f->rec_par), free(f->h_keep), free(f->h_par);
    free(f);
}

static int warm_gemms(cuda_fwd *f, char *err, size_t errlen);

int cuda_fwd_create(const model *m, const cuda_fwd_params *p, cuda_fwd **out, char *err, size_t errlen) {
    *out = NULL;
    if (cu_device_count() < 1) return ci_err(err, errlen, CINFER_EUNSUPPORTED, "no CUDA device");
    if (m->hd % 32 || m->hd > CU_ATTN_MAX_HD || ((m->hd / 32) & (m->hd / 32 - 1)))
        return ci_err(err, errlen, CINFER_EUNSUPPORTED,
                      "cuda: head_dim %d (supported: 32, 64, 128, 256, 512)", m->hd);
    if (m->K > 8 || m->K < 1)
        return ci_err(err, errlen, CINFER_EUNSUPPORTED, "cuda: conv kernel %d (at most 8)", m->K);
    if (m->cfg.n_experts > 1024 || m->cfg.n_experts_per_tok > 32)
        return ci_err(err, errlen, CINFER_EUNSUPPORTED, "cuda: %d experts / top-%d (limits 1024 / 32)",
                      m->cfg.n_experts, m->cfg.n_experts_per_tok);
    if (p->max_tokens > 65535)
        return ci_err(err, errlen, CINFER_ERANGE, "cuda: max_batch %d (at most 65535)", p->max_tokens);
    if (m->n_lin > 0 && !cu_gdn_init(m->dk))
        return ci_err(err, errlen, CINFER_EUNSUPPORTED,
                      "cuda: linear_key_head_dim %d needs more shared memory than the device has", m->dk);
    cuda_fwd *f = xcalloc(1, sizeof *f);
    f->m = m;
    f->p = *p;
    /* "1": every matrix is noise made on the device, whatever the checkpoint holds (cinfer bench --like with
     * the engine benches, whose contexts the engine creates: a sparse checkpoint gives the shapes) */
    const char *rw = getenv("CINFER_CUDA_RANDOM_WEIGHTS");
    if (rw && !strcmp(rw, "1") && !f->p.random_weights)
        f->p.random_weights = 1, f->p.seed = f->p.seed ? f->p.seed : 7;
    /* "1": steps with verify windows replay graphs too (a shape captured the second time it comes). Off again
     * since the fused verify layers: the H200 call of 10:07 timed an eager 4B verify step as fast as its
     * graph (4.12 vs 4.08 ms at batch 1, 7.17 vs 7.24 at 16) while a capture costs ~1 / ~4.5 ms, and at 10:27
     * eager verify steps gave 1.71x / 1.54x at batch 1 / 16 against 1.70x / 1.39x from graphs (A = 0.7, 3
     * drafts, -n 48). Earlier, with the five DeltaNet kernels, graphs had paid (1.60x vs 1.54x at 08:53). */
    const char *mg = getenv("CINFER_CUDA_MTP_GRAPHS");
    f->mtp_graphs = mg && !strcmp(mg, "1");
    const char *gu = getenv("CINFER_CUDA_GRAPH_UPDATE");
    f->graph_update = gu && !strcmp(gu, "1");
    const char *vg = getenv("CINFER_CUDA_VERIFY_GRAPHS");
    f->verify_graphs = vg && !strcmp(vg, "1");
    const char *dab = getenv("CINFER_CUDA_DIAG_AB"); /* "1": diag_ab (measurements; wrong outputs) */
    f->diag_ab = dab && !strcmp(dab, "1");
    const char *g = getenv("CINFER_CUDA_GRAPHS"); /* "0": launch every step eagerly (tests compare the two) */
    if (g && !strcmp(g, "0")) f->p.no_graphs = 1;
    /* diagnostics: f32-activation GEMV for up to this many rows */
    const char *gm = getenv("CINFER_CUDA_GEMV_MAX");
    cu_set_gemv_max(gm ? atoi(gm) : 0);
    /* precision fast (the context's parameter): activations rounded to bf16 once before the tensor cores
     * (faster, coarser); exact: hi + lo, two passes. CINFER_CUDA_BF16_PASSES overrides the GEMMs' count (a
     * measurement switch) */
    f->fast = p->fast != 0;
    const char *fps = getenv("CINFER_CUDA_FAST_PRESPLIT");
    cu_set_fast_presplit(!(fps && !strcmp(fps, "0")));
    /* fast mode's gate_up in bf16 and cuBLASLt algorithms timed per shape (gemm.cu: the figures; "0" off) */
    const char *g16 = getenv("CINFER_CUDA_FAST_GU16");
    f->gu16 = f->fast && !(g16 && !strcmp(g16, "0"));
    const char *ltt = getenv("CINFER_CUDA_LT_TUNE");
    cu_set_lt_tune(!(ltt && !strcmp(ltt, "0")), ltt && !strcmp(ltt, "1"));
    /* GEMV: "v2", the default since the H200 run of 07:17 (4B batch 1 227 -> 243 tok/s, batch 8 unchanged,
     * every test passing with it), takes the split-K kernel where it measured faster and v1 elsewhere; "v1"
     * the warp-per-2-rows kernel everywhere; "v2all" the split-K kernel wherever it serves; "v3" the kernel
     * of the fused GEMVs (gemv3.cu) wherever K % 8 == 0 */
    const char *gv = getenv("CINFER_CUDA_GEMV");
    cu_set_gemv_version(!gv || !strcmp(gv, "v2") ? 2 : !strcmp(gv, "v2all") ? 3 : !strcmp(gv, "v3") ? 4 : 1);
    if (gv) fprintf(stderr, "cinfer cuda: CINFER_CUDA_GEMV=%s: GEMV version %d\n", gv, cu_gemv_version());
    /* programmatic dependent launch (backend/cuda/common.cuh: the rules): "1" every kernel of a decode step
     * (each requests what needs nothing from the kernel before it — weights, its own layer's state — while
     * that one still runs; pdl_step: decode steps of contexts that do not speculate); "gemv" the GEMVs only
     * (session 4's "1"); "0" off; the same bits in every form. "1" is the default since the H200 call 2 of
     * session 5: 4B batch 1 353.1 -> 371.8 tok/s, batch 8 1,354 -> 1,392; bit-identical to plain launches at
     * every fixture and at the 4B shape (cuda_pdl), cuda_spec passing. CINFER_CUDA_PDL_BREAK=0
     * (diagnostics) lets a PDL launch follow a memcpy or event record */
    const char *pdl = getenv("CINFER_CUDA_PDL"), *pdb = getenv("CINFER_CUDA_PDL_BREAK");
    f->pdl = !pdl || !strcmp(pdl, "1") ? 2 : !strcmp(pdl, "gemv") ? 1 : 0;
    const char *pdm = getenv("CINFER_CUDA_PDL_MASK");
    cu_set_pdl_mask(pdm ? atoi(pdm) : 31);
    const char *pda = getenv("CINFER_CUDA_PDL_ANY");
    f->pdl_any = pda && !strcmp(pda, "1");
    cu_set_pdl(f->pdl);
    cu_set_pdl_break(!(pdb && !strcmp(pdb, "0")));
    /* the fused attention decode kernel's k / v loads one position ahead (the same bits); "0" off. On by
     * default since the H200 call 3 of session 5: 4B batch 1 371.8 -> 380.5 tok/s over PDL; bit-identical in
     * cuda_pdl (fixtures, 4B shape), cuda_spec passing with it (call 2) */
    const char *apf = getenv("CINFER_CUDA_ATTN_PF");
    f->attn_pf = !(apf && !strcmp(apf, "0"));
    cu_set_attn_decode_pf(f->attn_pf);
    const char *l2n = getenv("CINFER_CUDA_L2PF_NEXT"); /* MB of the next GEMV's head into L2 (gemv_next) */
    /* default 6 MB: the H200's call 4 of session 6 (diag, 4B batch 1): off +0.050 ms, 2 MB +0.039, 3 +0.021,
     * 6 -0.014 against 4 (call 3: 8 MB worse than 4, 16 worse than none); only in steps of at most
     * CINFER_CUDA_L2PF_NEXT_ROWS rows (default 32; 0 any): at 64 rows the step was 3% slower with it (and the
     * attention prefetch off), at 32 even */
    f->l2pf_next = (size_t)(l2n ? (atoi(l2n) > 0 ? atoi(l2n) : 0) : 6) << 20;
    const char *l2r = getenv("CINFER_CUDA_L2PF_NEXT_ROWS");
    f->l2pf_next_rows = l2r ? (atoi(l2r) > 0 ? atoi(l2r) : 0) : 32;
    const char *aro = getenv("CINFER_CUDA_ATTN_ROUND"); /* "0": nsplit exact (a capture every 64 positions) */
    f->attn_round = !(aro && !strcmp(aro, "0"));
    /* CINFER_CUDA_ATTN_DEC (default "2"; "0": every decode row by attn_kernel split by the batch, session 7's
     * default): decode rows (and verify windows' rows, no tiles) by attn_dec_kernel, a block per (kv head,
     * row, span) for the GQA group, spans from the row's own position, at most CINFER_CUDA_ATTN_DEC_NS
     * (default 64) a row; another summation order than attn_kernel. H200 session 8, 4B, old vs this in one
     * call (with CINFER_CUDA_ATTN_DEC_1ST=2): decode after 512 positions b1 / 8 / 32 / 64 400.1 / 1387.3 /
     * 4251.8 / 5588.6 -> 401.7 / 1395.5 / 4283.6 / 5859.9 tok/s, b64 after 4096 2708.2 -> 3964.9; b1 after
     * 4096 332.6 -> 335.8 (call 1); final call, b1 after 32768 260.8 -> 286.6. Alone it won at every position
     * measured (256 - 32768) at 1 to 64 rows, hence CINFER_CUDA_ATTN_DEC_P 0. The exception: the 35B-A3B (2
     * kv heads, 34 blocks a row after 512 positions) loses 1.7-2.8% at batch 1 from 512 to 8192 positions
     * (403.3 vs 410.2 tok/s after 512 with CINFER_CUDA_ATTN_DEC_P=1000000) and gains 8% at batch 8 after 4096
     * (903.6 vs 835.5); a row's kernel may not depend on its batch, so the serving default stays and
     * CINFER_CUDA_ATTN_DEC_P=1000000 is the single-stream setting (README) */
    const char *adec = getenv("CINFER_CUDA_ATTN_DEC"), *adns = getenv("CINFER_CUDA_ATTN_DEC_NS");
    f->attn_dec_ns = adec && !strcmp(adec, "0") ? 0 : adns && atoi(adns) > 0 ? atoi(adns) : 64;
    if (f->attn_dec_ns > 256) f->attn_dec_ns = 256;
    /* CINFER_CUDA_ATTN_DEC_P=N: with the dec kernel, only rows at positions >= N take it, the others
     * attn_kernel with spans from their own position (a row's kernel follows its own position, never its
     * batch; two launches a layer when a batch holds both); 0 (the default): every row. The crossover, H200
     * session 8, one layer alone (4B): the dec kernel ahead from 256 positions on at 1 row (11.7 vs 21.7 us)
     * and from 512 at 64 rows (166 vs 225 us; 817 vs 1708 at 4096 on one stage) */
    const char *adp = getenv("CINFER_CUDA_ATTN_DEC_P");
    f->attn_dec_p = adp && atoi(adp) > 0 ? atoi(adp) : 0;
    /* CINFER_CUDA_ATTN_DEC_1ST=N (default 2; 0: never): steps of at least N rows run the dec kernel on one
     * stage of shared memory, chunk after chunk (two blocks an SM instead of one; the same bits). H200
     * session 8, alone, 2048 / 8192 positions: one stage faster from 2 rows (27.5 vs 31.9 us, 70.4 vs 81.9),
     * two at 1 row (20.4 vs 21.7, 46.7 vs 56.8) */
    const char *a1s = getenv("CINFER_CUDA_ATTN_DEC_1ST");
    f->attn_dec_1st = a1s ? (atoi(a1s) > 0 ? atoi(a1s) : 0) : 2;
    /* CINFER_CUDA_ATTN_DEC_HS="N[,R]": in steps of at most R rows (default: any) attn_dec_kernel's blocks
     * serve N q heads each (a divisor of the GQA group), the group over several blocks: more blocks when a
     * row has few kv heads (the 35B-A3B at one row: 2 kv heads x 17 spans after 512 positions); 0 the whole
     * group (session 8's); the default -1: the launch picks the fewest heads a block (the most blocks) within
     * two blocks an SM (cu_attn_args.dec_hs). Every head's arithmetic is unchanged, so the choice may follow
     * the batch: the same bits. H200 call 1 (22:45), one layer alone, the 35B-A3B's shape at 1 row, whole
     * group vs 4 heads a block: 16.6 vs 13.0 us at 512 positions, 36.0 vs 26.8 at 4096, 184 vs 135 at 32768
     * (2 heads: 12.9, 38.8, 200); batch 1 in the graph 392.1 -> 401.0 tok/s (2 heads, R 8); the 4B's shape (G
     * 4) 12.8 / 27.1 / 135 whole, 12.7 / 38.8 / 201 with 2; at 64 rows the whole group (113.8 vs 170 us) */
    const char *ahs = getenv("CINFER_CUDA_ATTN_DEC_HS");
    f->attn_dec_hs[0] = -1, f->attn_dec_hs[1] = 1 << 30;
    if (ahs) sscanf(ahs, "%d,%d", &f->attn_dec_hs[0], &f->attn_dec_hs[1]);
    const char *gv4 = getenv("CINFER_CUDA_GEMV_VAR4"); /* "0": the small GEMVs' earlier variant at one row */
    cu_set_gemv3_small_var4(!(gv4 && !strcmp(gv4, "0")));
    const char *glu = getenv("CINFER_CUDA_GEMV_GLU"); /* gate_up at one row: "rows a warp,variant" (2,10) */
    f->glu[0] = 2, f->glu[1] = 10;
    if (glu) sscanf(glu, "%d,%d", &f->glu[0], &f->glu[1]);
    cu_set_gemv3_glu(f->glu[0], f->glu[1]);
    /* CINFER_CUDA_ATTN_PRE (default on; "0" off): the fused attention decode kernel's RoPE cos / sin before
     * its PDL wait (the same bits). H200 session 11 call 8, 4B b1 after 512, alternating: off 404.3 / 404.6 /
     * 406.1 tok/s, on 404.6 / 404.5 / 408.0; attention core ended +18.55 -> +17.48 us (CINFER_CUDA_G3_STAMPS)
     */
    const char *apre = getenv("CINFER_CUDA_ATTN_PRE");
    cu_set_attn_dec_pre(!(apre && !strcmp(apre, "0")));
    const char *apr = getenv("CINFER_CUDA_ATTN_PF_ROWS"); /* the attention prefetch up to this many rows */
    cu_set_attn_decode_pf_rows(apr ? atoi(apr) : 32);
    if (pdl || pdb)
        fprintf(stderr, "cinfer cuda: CINFER_CUDA_PDL=%s: programmatic dependent launch %s%s\n",
                pdl ? pdl : "",
                f->pdl == 2 ? "for every decode kernel"
                : f->pdl    ? "for the GEMVs"
                            : "off",
                pdb && !strcmp(pdb, "0") ? " (also after memcpys and events: diagnostics)" : "");
    /* norms, residual adds and SwiGLU inside the decode GEMVs (the GEMV v3 kernel); "0" turns it off. On by
     * default since the H200 call 1 of session 4: 4B batch 1 242.8 -> 256.6 tok/s (264.0 with PDL), batch
     * 8 1,190 -> 1,219, 27B batch 1 58.9 -> 59.0; fixture parity unchanged (3.37e-4), speculation exact */
    const char *fz = getenv("CINFER_CUDA_FUSE");
    f->fuse = !(fz && !strcmp(fz, "0"));
    if (fz)
        fprintf(stderr, "cinfer cuda: CINFER_CUDA_FUSE=%s: fused decode GEMVs %s\n", fz,
                f->fuse ? "on" : "off");
    /* the skinny GEMM on tensor cores (gemm_mma.cu) for decode-sized products: "1" every product of up to
     * CINFER_CUDA_SKINNY_MAX rows (default 8, at most 32; the fused decode GEMVs then serve that many), "2"
     * the same from 2 rows (one row stays on the GEMV v3: faster at one row, but then a verify window's rows
     * and plain decode rows differ in bits, which exact rollback cannot have), "auto" (the default) 1 for a
     * context that may verify speculative windows and off otherwise, "0" off everywhere. Why not 2 outside
     * speculation, though faster there (H200 10:27, session 4: 4B batch 4 / 8 999 -> 1,149 / 1,346 -> 1,932
     * tok/s, batch 1 unchanged; 27B batch 8 274 -> 448): a sequence's row alone (one row, the GEMV) and in a
     * batch (the skinny GEMM) would then differ in bits, which cuda_gemv3_forward_fused_vs_unfused and
     * cuda_vision_text_rows_unchanged refuse (H200 10:52). With speculation every row takes the skinny GEMM:
     * 4B at forced acceptance 0.7, 3 drafts, batch 1: 1.71x -> 1.96x (650 tok/s), rollback bitwise exact.
     * Session 9 (H200, same calls): mode 1 everywhere, the kernel by PDL and with the next GEMV's head into
     * L2 as v3, against the default: 4B b1 / 2 / 4 / 8 356.8 / 688.9 / 1,226.8 / 2,129.0 vs 407.7 / 651.7 /
     * 1,020.9 / 1,382.0 tok/s; with the (lost, removed) cp.async form too, 27B b1 / 8 65.2 / 445.7 vs 75.6 /
     * 273.7, 35B-A3B 383.1 / 1,076.5 vs 419.4 / 967.4. One row stays 9-14% slower, so "auto" stays: at one
     * row the kernel holds 128 registers a thread, 16 warps an SM (ncu: 17.5% achieved occupancy against
     * v3's 40%), too few bytes in flight (summed over 10 real matrices at one row, by PDL: v3 531.6 us,
     * skinny 602.4; gate_up 23.7 vs 27.9, down 13.2 vs 16.4); registers capped for 24 / 32 warps (spills)
     * and a cp.async ring in shared memory (12 / 20 KB a warp) were slower still */
    const char *sk = getenv("CINFER_CUDA_SKINNY"), *skm = getenv("CINFER_CUDA_SKINNY_MAX");
    int sk_auto = !sk || !strcmp(sk, "auto");
    if (!sk_auto) cu_set_skinny(sk ? atoi(sk) : 0);
    cu_set_skinny_max(skm ? atoi(skm) : 0);
    /* CINFER_CUDA_SKINNY_CFG="tr,u,xp,w,ks" (measurements: cu_set_skinny_config; 0 / -1 automatic; ks other
     * sums, the rest the same bits) */
    const char *skc = getenv("CINFER_CUDA_SKINNY_CFG");
    if (skc) {
        int cv[5] = {0, 0, -1, 0, 0};
        sscanf(skc, "%d,%d,%d,%d,%d", &cv[0], &cv[1], &cv[2], &cv[3], &cv[4]);
        cu_set_skinny_config(cv[0], cv[1], cv[2], cv[3], cv[4]);
        fprintf(stderr,
                "cinfer cuda: CINFER_CUDA_SKINNY_CFG=%s: tiles %d, in flight %d, x ahead %d, warps %d, "
                "splits %d\n",
                skc, cv[0], cv[1], cv[2], cv[3], cv[4]);
    }
    /* 1: the tensor-core prefill kernels round operands to TF32 once (~4e-4 per product); default 3 */
    const char *tp = getenv("CINFER_CUDA_TF32_PASSES");
    cu_set_tf32_passes(tp ? atoi(tp) : 3);
    int rc = cu_ctx_create(&f->cu, err, errlen);
    if (rc) {
        free(f);
        return rc;
    }
    /* this context's GEMM passes (cu_ctx: per context, so contexts of one process may differ) */
    const char *bp = getenv("CINFER_CUDA_BF16_PASSES");
    cu_set_bf16_passes(f->cu, bp ? atoi(bp) : f->fast ? 1 : 2);
    /* the dec kernel only where it serves the shape (else every row stays on attn_kernel) */
    if (f->attn_dec_ns && !(m->n_full > 0 && cu_attn_dec_init(m->Hq, m->Hkv, m->hd, f->attn_dec_ns)))
        f->attn_dec_ns = 0;
    const char *g3s = getenv("CINFER_CUDA_G3_STAMPS");
    if (g3s && !strcmp(g3s, "1")) {
        f->g3st_kind = calloc(G3ST_KINDS, sizeof *f->g3st_kind);
        if (f->g3st_kind && !cu_gemv3_stamps_begin(f->cu, G3ST_CAP, err, errlen)) {
            f->g3st_on = 1;
            cu_gemv3_stamps_pause(1);
        }
    }
    if ((rc = upload_layers(f, err, errlen)) || (rc = alloc_scratch(f, err, errlen))) goto fail;
    cu_set_gemm_scratch(f->cu, f->ytmp, f->ytmp_floats);
    cu_set_gemm_xb_rows(f->cu, (int)zmax((size_t)p->max_tokens, (size_t)f->max_S));
    /* CINFER_CUDA_GEMM_PAD (default on; "0": off): products of 9-64 rows on M rounded up to 16, of more rows
     * up to 64 (gemm.cu: few cuBLAS shapes per matrix, met once by the warm-up below instead of by the first
     * request of each size). The H200 call of 12:44: the 16k second turn 0.017 s with +64 rows, 0.016 s with
     * +37 (its third turn 0.016 / 0.015 s: no first-time cost left); cuda_gemm_pad, fixture parity and batch
     * tests pass */
    const char *gpad = getenv("CINFER_CUDA_GEMM_PAD");
    cu_set_gemm_pad(!(gpad && !strcmp(gpad, "0")));
    if (sk_auto) cu_ctx_set_skinny(f->cu, f->p.spec_window > 0 ? 1 : 0);
    if (sk)
        fprintf(stderr, "cinfer cuda: CINFER_CUDA_SKINNY=%s: skinny GEMM mode %d up to %d rows\n", sk,
                sk_auto ? (f->p.spec_window > 0 ? 1 : 0) : cu_skinny_mode(), cu_skinny_max());
    size_t kvd = (size_t)m->Hkv * m->hd;
    if (m->n_full > 0) {
        size_t kvb = (size_t)m->n_full * (size_t)p->n_blocks * 16 * kvd * 4;
        if ((rc = dev_alloc(f, (void **)&f->kpool, kvb, &f->bytes_pools, err, errlen)) ||
            (rc = dev_alloc(f, (void **)&f->vpool, kvb, &f->bytes_pools, err, errlen)))
            goto fail;
    }
    if (m->n_lin > 0) {
        size_t cs = (size_t)p->n_slots * m->n_lin * (size_t)(m->K - 1) * m->C * 4;
        size_t rs = (size_t)p->n_slots * m->n_lin * (size_t)m->Hv * m->dk * m->dv * 4;
        if ((rc = dev_alloc(f, (void **)&f->conv_state, cs, &f->bytes_pools, err, errlen)) ||
            (rc = dev_alloc(f, (void **)&f->rec_state, rs, &f->bytes_pools, err, errlen)))
            goto fail;
    }
    /* CINFER_CUDA_GDN_FUSED: a step of decode tokens only runs each DeltaNet layer as one fused kernel (the
     * same bits as the four kernels) — the default ("0": the four kernels). H200, 4B, session 4 call 2
     * (fused attention in both): batch 1 / 8 / 16 / 32 / 64 292 -> 339 / 1,259 -> 1,350 / 2,508 -> 2,695 /
     * 3,943 -> 4,185 / 6,056 -> 6,184 tok/s; "deltanet core" of an eager step 0.88 -> 0.35 ms at batch 1,
     * 3.96 -> 3.43 at 64. (Call 1's kernel lost at 64, 5,928 -> 5,487: b/g loaded after a barrier, the conv
     * taps in local memory, a fence over each thread's state stores.) */
    const char *gf = getenv("CINFER_CUDA_GDN_FUSED");
    if (m->n_lin > 0 && !(gf && !strcmp(gf, "0")) &&
        (rc = dev_alloc(f, (void **)&f->gdn_cnt, (size_t)p->max_tokens * m->Hk * sizeof(unsigned),
                        &f->bytes_scratch, err, errlen)))
        goto fail;
    if (gf)
        fprintf(stderr, "cinfer cuda: CINFER_CUDA_GDN_FUSED=%s: fused deltanet decode %s\n", gf,
                f->gdn_cnt ? "on" : "off");
    /* CINFER_CUDA_GDN_CLUSTER: that kernel as thread block clusters, a key head's group one cluster (the same
     * bits, fewer dependent round trips; cu_gdn_cluster_init says whether the shape and device take it) — the
     * default ("0": off) in steps of at most CINFER_CUDA_GDN_CLUSTER_MAX entries (default 2; 0 any). H200,
     * session 7: ncu at the 4B shape 10.7 -> 8.6 us; call 2, batch 1: 4B 384.6 -> 392.3 tok/s (2.600 -> 2.549
     * ms a step; the DIAG_AB "skip deltanet" delta 0.26 -> 0.18 ms), 35B-A3B 397.2 -> 406.0; but clusters at
     * every batch lost at 8 / 32 / 64: 1,397 -> 1,387, 4,281 -> 4,094, 5,975 -> 5,568 (more blocks than one
     * wave: each cluster waits for its slowest block); call 3: 4B batch 1 / 2 / 4 / 8 2.587 / 3.129 / 3.839 /
     * 5.695 -> 2.532 / 3.082 / 3.845 / 5.727 ms a step, hence 2 */
    const char *gc = getenv("CINFER_CUDA_GDN_CLUSTER");
    f->gdn_cluster =
        f->gdn_cnt && !(gc && !strcmp(gc, "0")) && cu_gdn_cluster_init(m->Hk, m->Hv, m->dk, m->dv);
    /* the second form (fused_decode_cluster2_kernel) unless CINFER_CUDA_GDN_CLUSTER=1 (the first): the same
     * bits, a shorter chain after the PDL wait. H200 session 9 call 2, first -> second form: 4B b1 397.7 ->
     * 403.3 / 400.5 tok/s, b2 639.6 -> 646.5 / 641.4, 35B-A3B b1 398.0 -> 403.4; DIAG_AB "dup deltanet"
     * 0.102 ms a step (call 1, the first form: 0.145); block 0's stamps after the PDL wait 4.9 -> 3.3 us; its
     * conv inputs read before S under an L2 evict_last policy: call 4, alternating without / with: 4B b1
     * 407.4 / 404.7 -> 409.5 / 409.0, b2 651.9 / 649.2 -> 655.2 / 654.0, 35B-A3B b1 418.8 -> 421.6 (first
     * form 403.6 / 642.3; the form without the policy is gone) */
    if (f->gdn_cluster && !(gc && !strcmp(gc, "1"))) f->gdn_cluster = 2;
    const char *gcm = getenv("CINFER_CUDA_GDN_CLUSTER_MAX");
    f->gdn_cluster_max = gcm ? atoi(gcm) : 2;
    /* CINFER_CUDA_GDN_WIDE: the steps the clusters do not take run the fused decode kernel one block a value
     * head (cu_gdn_args.dec_wide: 4x the state a block, the conv and norms once a head, the gated norm in the
     * block; the same bits); "0": 32 columns a block (fused_decode_kernel). H200 session 14 call 7, 4B
     * b4 / b8 / b32 / b64 1,040 / 1,421 / 4,777 / 6,657 -> 1,074 / 1,477 / 5,193 / 7,408 tok/s; call 1:
     * 27B b32 / b64 1,259 / 1,902 -> 1,341 / 2,074, 35B-A3B 1,450 / 2,169 -> 1,497 / 2,259 */
    const char *gw = getenv("CINFER_CUDA_GDN_WIDE");
    f->gdn_wide = !(gw && !strcmp(gw, "0"));
    if (gw)
        fprintf(stderr, "cinfer cuda: CINFER_CUDA_GDN_WIDE=%s: wide deltanet decode %s\n", gw,
                f->gdn_wide ? "on" : "off");
    /* CINFER_CUDA_ATTN_STAMPS=1 (measurements): the fused dec kernel's merging blocks stamp their phases
     * (%globaltimer), printed at teardown */
    const char *ast = getenv("CINFER_CUDA_ATTN_STAMPS");
    if (ast && !strcmp(ast, "1")) {
        size_t sb = (1 + (size_t)CU_ATTN_STAMP_CAP * CU_ATTN_STAMPS) * sizeof(unsigned long long);
        if ((rc = dev_alloc(f, (void **)&f->astamps, sb, &f->bytes_scratch, err, errlen))) goto fail;
        cu_memset_async(f->cu, f->astamps, sb);
    }
    const char *gst = getenv("CINFER_CUDA_GDN_STAMPS");
    if (f->gdn_cluster && gst && !strcmp(gst, "1")) {
        size_t sb = (1 + (size_t)CU_GDN_STAMP_CAP * CU_GDN_STAMPS) * sizeof(unsigned long long);
        if ((rc = dev_alloc(f, (void **)&f->gdn_stamps, sb, &f->bytes_scratch, err, errlen))) goto fail;
        cu_memset_async(f->cu, f->gdn_stamps, sb);
    }
    if (gc || gcm)
        fprintf(stderr,
                "cinfer cuda: CINFER_CUDA_GDN_CLUSTER=%s: clustered deltanet decode %s (batches <= %d)\n",
                gc ? gc : "(default)", f->gdn_cluster ? "on" : "off", f->gdn_cluster_max);
    /* CINFER_CUDA_ATTN_FUSED: decode-only steps run each attention layer as one kernel (q/k norm, RoPE and
     * the KV write in its prologue, the merge of the splits in the last split's block) — the default ("0":
     * three kernels). H200, 4B (session 4 call 1): attention core 0.316 -> 0.240 ms at batch 1, 1.36 -> 1.30
     * ms at batch 64, the same bits */
    const char *af = getenv("CINFER_CUDA_ATTN_FUSED");
    if (m->n_full > 0 && !(af && !strcmp(af, "0")) &&
        (rc = dev_alloc(f, (void **)&f->attn_cnt, (size_t)p->max_tokens * m->Hq * sizeof(unsigned),
                        &f->bytes_scratch, err, errlen)))
        goto fail;
    if (af)
        fprintf(stderr, "cinfer cuda: CINFER_CUDA_ATTN_FUSED=%s: fused attention decode %s\n", af,
                f->attn_cnt ? "on" : "off");
    /* steps of windows and decode tokens only run each DeltaNet layer as one kernel (cu_gdn_args.win_cnt; the
     * same bits as the five kernels): by default its second form (cu_gdn_args.win_v2; H200 call of 09:45, 4B,
     * A = 0.7, 3 drafts: a verify step's deltanet core 1.41 -> 0.57 ms at batch 1, 3.02 -> 2.41 at batch 16);
     * "1" the first form, "0" the five kernels */
    const char *wf = getenv("CINFER_CUDA_SPEC_WINFUSED");
    if (m->n_lin > 0 && p->spec_window > 0 && !(wf && !strcmp(wf, "0"))) {
        size_t wb = (size_t)p->max_tokens * m->Hk * sizeof(unsigned);
        if ((rc = dev_alloc(f, (void **)&f->win_cnt, wb, &f->bytes_scratch, err, errlen))) goto fail;
        cu_memset_async(f->cu, f->win_cnt, wb);
        f->win_v2 = !(wf && !strcmp(wf, "1"));
    }
    if (wf)
        fprintf(stderr, "cinfer cuda: CINFER_CUDA_SPEC_WINFUSED=%s: fused deltanet verify layers %s\n", wf,
                !f->win_cnt ? "off"
                : f->win_v2 ? "on (second form)"
                            : "on (first form)");
    /* deferred commits: on by default ("0": the commit kernels at each commit) */
    const char *sf = getenv("CINFER_CUDA_SPEC_FUSE");
    f->spec_fuse = m->n_lin > 0 && p->spec_window > 0 && !(sf && !strcmp(sf, "0"));
    f->pend_keep = xcalloc((size_t)p->n_slots, sizeof(int));
    f->rec_par = xcalloc((size_t)p->n_slots, sizeof(int));
    f->h_keep = xcalloc((size_t)p->max_tokens, sizeof(int));
    f->h_par = xcalloc((size_t)p->max_tokens, sizeof(int));
    if (m->n_lin > 0 && p->spec_window > 0) {
        size_t sr = (size_t)p->n_slots * m->n_lin * (size_t)p->spec_window * CU_SPEC_REC(m->C, m->Hv) * 4;
        if ((rc = dev_alloc(f, (void **)&f->spec_rec, f->spec_fuse ? 2 * sr : sr, &f->bytes_pools, err,
                            errlen)))
            goto fail;
    }
    /* inv_freq exactly as forward_cpu computes it */
    int R = m->cfg.rope_dim;
    float *inv = xcalloc((size_t)(R / 2 > 0 ? R / 2 : 1), sizeof(float));
    for (int j = 0; j < R / 2; j++) {
        float ex = (float)(2 * j) / (float)R;
        float pw = (float)pow(m->cfg.rope_theta, (double)ex);
        inv[j] = 1.0f / pw;
    }
    rc = upload_vec(f, &f->inv_freq, inv, (size_t)(R / 2 > 0 ? R / 2 : 1), err, errlen);
    free(inv);
    if (rc) goto fail;
    f->tiles_ok = m->n_full > 0 && cu_attn_init(m->hd);
    /* CINFER_CUDA_PREFILL: "tc" (the default when unset) both prefill kernels on the tensor cores, "gdn" the
     * chunked DeltaNet only, "attn" only the attention, "scalar" neither. The H200 run of 06:05 UTC (session
     * 3): with the hi + lo TF32 split the tensor-core DeltaNet is exact to 3.3e-4 per position on the
     * fixtures (scalar 5.6e-4) and cut its share of a 4B 4096-token chunk from 256 to 202 ms. The attention
     * is the flash-attention-2 kernel of attention_tc.cu on tiles of cu_attn_tc_rows rows (attn_rows);
     * session 4's first H200 call: every op test within 20x the scalar tiles' error (3e-7 - 7e-7; entries
     * alone bitwise as in a batch), fixture parity 3.38e-4 (scalar tiles 3.37e-4), 4B attention core per
     * 4096-token chunk 112.6 -> 27.9 ms, prefill 32768 3,462 -> 8,129 tok/s: so it is on by default ("gdn"
     * keeps the scalar attention tiles). The second call: its fp16 hi + lo form as exact (op tests 2e-7 -
     * 6e-7, parity 3.34e-4) and faster (21.2 ms, 32768 tokens at 9,101 tok/s; 27B tf32 332.5 -> 84.5 ms),
     * so that is the default form (the TF32 one was deleted in session 5). */
    /* The DeltaNet prefill of "tc" and "gdn" (also "tc2", "gdn2", and "tc1", "gdn1", whose one kernel walking
     * all chunks per column block, deltanet_tc.cu, is gone) runs in phases, parallel over the chunks
     * (deltanet_chunk.cu), with the tensor-core / scalar attention. Session 4's H200 calls: the phased form
     * gives the one kernel's bits in every op test (4B and 27B heads, ragged entries, 4096 rows) and passes
     * fixture parity, graphs vs eager, the batch of 32, speculation and the prefix cache; one layer over 4096
     * rows at the 4B heads 7.88 -> 1.70 ms (27B heads 13.2 -> 2.95 ms), "deltanet core" of a 4096-token chunk
     * 199 -> 43 ms (4B), 663 -> 167 ms (27B), 249 -> 52 ms (35B-A3B). Two forms (CINFER_CUDA_GDN_DT below):
     * "stage" (session 4's: WMMA, each chunk's inputs staged in shared memory one chunk ahead; one 4B layer
     * over 4096 rows 1.70 ms) and, the default since session 5's third H200 call (13:06), "mma6": the prep
     * and the sequential pass on mma.sync with S in registers, Dekker's split, compiled for dk = 128 (op
     * tests within their bounds: 27B heads, ragged entries 5.3e-7 against the CPU, "stage" 6.0e-7; fixture
     * parity worst per position 5.1e-4, text fixture len 150, "stage" 2.3e-4 there; graphs vs eager, the
     * batch of 32, speculation and the prefix cache passing; one 4B layer 0.99 ms, "deltanet core" of the 4B
     * chunk 43.6 -> 26.5 ms). Session 5's steps between (mma, mma2, mma3, mma4, mma7) and session 4's other
     * staged forms (il, pad, 16, 32) all measured slower and were deleted in session 6 (names now mean the
     * default). */
    const char *pf = getenv("CINFER_CUDA_PREFILL");
    const char *pfv = pf ? pf : "tc";
    int phased = !strcmp(pfv, "tc") || !strcmp(pfv, "gdn") || !strcmp(pfv, "gdn2") || !strcmp(pfv, "tc2") ||
                 !strcmp(pfv, "gdn1") || !strcmp(pfv, "tc1");
    if (!strcmp(pfv, "tc") || !strcmp(pfv, "attn") || !strcmp(pfv, "tc1") || !strcmp(pfv, "tc2"))
        f->attn_tc = f->tiles_ok && cu_attn_tc_init(m->hd);
    f->attn_rows = f->attn_tc ? cu_attn_tc_rows(m->Hq, m->Hkv) : CU_ATTN_TILE;
    /* CINFER_CUDA_ATTN_SPLIT (on by default; "0": off): the tensor-core tiles of an entry with few rows
     * behind a long context split over keys (flash-decoding for the prefill kernel; cu_attn_tc_split), spans
     * of CU_ATTN_MIN_SPAN keys or more; =N (> 1): spans of N keys or more (tests: the split on the fixtures'
     * short contexts). H200, session 5's first call: op tests 2e-7 - 5e-7 (unsplit 3e-7 - 5e-7), fixture
     * parity unchanged with spans of 32 keys (dense 3.34e-4); the 4B 16k second turn (64 new rows) 0.080 ->
     * 0.047 s, its third turn 0.059 -> 0.026 s, the cold 16k prompt 1.36 -> 1.05 s (its 512-row chunks split
     * in two) */
    const char *asp = getenv("CINFER_CUDA_ATTN_SPLIT");
    f->attn_split = !asp             ? CU_ATTN_MIN_SPAN
                    : atoi(asp) > 1  ? atoi(asp)
                    : atoi(asp) == 1 ? CU_ATTN_MIN_SPAN
                                     : 0;
    /* CINFER_CUDA_ATTN_KV16 (default on; "0": off): the tiles of prefill chunks read K and V split into fp16
     * hi + lo once per layer by a pre-pass (one layer's pool of scratch) instead of in every warp, the
     * fragments loaded by ldmatrix; the same bits. H200, session 5's third call: bitwise equal to the
     * per-warp split in every op test (cuda_attention_tc_vs_cpu, 6 head shapes); 4B "attention core" per
     * 4096-token chunk 22.98 ms -> 18.07 ms (the form with 32-bit loads, 19.35 ms, is gone) */
    const char *akv = getenv("CINFER_CUDA_ATTN_KV16");
    if (f->attn_tc && !(akv && !strcmp(akv, "0")) && cu_attn_kv16_ok(m->hd) &&
        (rc = dev_alloc(f, (void **)&f->kv16, cu_attn_kv16_bytes(p->n_blocks, m->Hkv, m->hd),
                        &f->bytes_scratch, err, errlen)))
        goto fail;
    /* CINFER_CUDA_ATTN_FAST (precision fast only; default on, "0": the exact tiles): the prefill tiles on Q,
     * K, V and P rounded to fp16 once, one MMA a product (attention_tc.cu's attn_ff_kernel), chunks' key
     * splits included. H200 session 10 call 2: every fast op test within 3e-4 - 8e-4 of f64 (bound 1e-2),
     * one 4B layer at 4096 rows 1.815 -> 0.943 ms, its 32k chunk 20.27 -> 7.17 ms (288 TFLOP/s); 4B
     * --precision fast prefill 4096 41,394 -> 44,308 tok/s, attention core 14.29 -> 7.32 ms */
    const char *afs = getenv("CINFER_CUDA_ATTN_FAST");
    f->attn_fast = f->fast && f->kv16 && cu_attn_fast_ok(m->hd) && !(afs && !strcmp(afs, "0"));
    if (phased && m->n_lin > 0 && cu_gdn_tc_init(m->dk) && cu_gdn_chunk_init(m->dk, m->dv)) {
        f->gdn_chunk_cap = cu_gdn_chunk_cap(p->max_tokens, p->n_slots);
        size_t cb = cu_gdn_chunk_bytes(f->gdn_chunk_cap, p->max_tokens, m->Hv, m->dk, m->dv);
        if ((rc = dev_alloc(f, &f->gdn_chunk, cb, &f->bytes_scratch, err, errlen))) goto fail;
        f->gdn_tc = 2;
    }
    /* CINFER_CUDA_PF_SPLIT (default on; "0": off): prefill norms (dense layers), SwiGLU, the DeltaNet gated
     * norm and the attention tiles write the bf16 hi + lo halves of the GEMM after them instead of f32 rows
     * it splits (norm_for_gemm, mlp, out_split_rows). H200, session 6's second call: bit-identical in every
     * op test and through the forward (cuda_presplit: 4 fixtures, long prefills, prefills beside a decode
     * row); 4B prefill 4096 27,247 -> 28,013 tok/s, device time of a 4096 chunk 146.6 -> 137.0 ms (ffn
     * act 6.5 -> 3.6, ffn GEMMs 56.3 -> 51.0, out_proj 9.7 -> 7.8 ms); the third call, as the default:
     * 26,814 ("0") -> 29,601 tok/s, 143.5 -> 134.2 ms, parity, batch of 32, graphs, prefix cache and vision
     * tests passing */
    const char *pfs = getenv("CINFER_CUDA_PF_SPLIT");
    f->pf_split = !(pfs && !strcmp(pfs, "0"));
    /* CINFER_CUDA_GDN_DT: "stage" the WMMA form of the phased DeltaNet prefill (session 4's; run_cuda.sh
     * old), "mma6" the mma.sync form, anything else that on the image scratch ("img", the default).
     * ("mma6g", its prep reading Q and V from conv_out to fit three blocks an SM, gave the same bits but
     * measured slower in session 6's third H200 call: prep 0.308 -> 0.380 ms per 4B layer, its W and U
     * products' V loads from L2 2.5x the cycles; removed. "bulk", the pass staged by one warp's row-sized
     * cp.async.bulk copies (320 a chunk) instead of every thread's 16-byte cp.async, gave the same bits but a
     * 4B layer's pass took 0.947 ms against 0.423 in session 7's second H200 call: removed.) */
    /* "img" (the default since session 7's third H200 call: the same bits, a 4B layer's pass 0.429 -> 0.320
     * ms, prefill 4096 29,978 -> 30,281 tok/s): the mma.sync form on a scratch laid out as the pass's shared
     * memory, a chunk staged by three bulk copies; "mma6" the mma.sync form staged by cp.async */
    const char *gdt = getenv("CINFER_CUDA_GDN_DT");
    f->gdn_chunk_dt = gdt && !strcmp(gdt, "stage") ? 0 : gdt && !strcmp(gdt, "mma6") ? 1 : 2;
    /* fast mode's chunked DeltaNet prefill (deltanet_chunk.cu, FLA's bf16 form), the default in fast mode
     * since H200 call 4 of session 10, with the fused layer (cu_gdn_layer_fast: the conv, norms and gates
     * inside the prep; batches of prefills only) and the prep's inverse rounds on the tensor cores since call
     * 5: every fast op test within 4.5e-3 of the CPU (1e-2 the bound), one 4B layer over 4096 rows 0.921 ->
     * 0.496 ms (unfused 0.589), 27B heads 1.461 -> 0.723, the 4B 4096 chunk's deltanet core 15.70 / 15.93 ->
     * 15.06 / 15.00 ms. CINFER_CUDA_GDN_FAST=0: the exact form; =1: without the fused layer. Exact mode never
     * takes either. */
    const char *gfa = getenv("CINFER_CUDA_GDN_FAST");
    f->gdn_fast = !f->fast ? 0 : !gfa ? 2 : !strcmp(gfa, "0") ? 0 : !strcmp(gfa, "1") ? 1 : 2;
    /* decode MoE blocks (device_only) as three launches (router + selection, gate_up + SwiGLU, down + combine
     * + shared expert) instead of ~15, the same arithmetic (moe_fused.cu); the default since the H200 run of
     * 08:52 (35B-A3B batch 1 188.9 -> 233.6 tok/s, batch 8 721.5 -> 758.3, every test passing); "0": the
     * unfused launches */
    const char *mf = getenv("CINFER_CUDA_MOE_FUSED");
    if (!(mf && !strcmp(mf, "0")) && m->cfg.n_experts > 0) {
        const model_config *mc = &m->cfg;
        f->moe_fused = cu_moe_fused_supported(m->H, mc->n_experts, mc->n_experts_per_tok,
                                              mc->moe_intermediate_size, mc->shared_expert_intermediate_size);
    }
    /* the fused kernels' variant, all the same bits: default 122892 (PDL launches, the router taking the
     * post-attention norm itself under CINFER_CUDA_FUSE, and requesting the shared expert's weights into L2
     * before its PDL wait; 16384, 32768 and 65536 below). H200 runs: PDL at 09:22 of session 4 (35B-A3B batch
     * 1 292.2 -> 316.4 tok/s), the router's norm at 10:05 (339.5 / 341.2 -> 347.8 tok/s) and, once its loads
     * were batched, session 5's call 2 (351.7 -> 369.9); the shared-expert prefetch in session 6's call 4
     * (15:53, alternating: 396.3 / 397.7
     * -> 401.7 / 401.8; batch 8 969.1 / 968.2 -> 972.6 / 973.1). Session 4's load-batching bits 1, 2, 16,
     * session 5's 32, 64, 256, 512 and session 6's flag-started gate_up, L2 prefetch of down, one-launch
     * gate_up + down, cluster router, down rows all before the wait and router in fewer registers are gone
     * (bit-identical, slower or no faster in session 6's H200 calls 1-3: their commits give the figures) */
    /* 16384 (default since session 9): the router writes only its logits; every gate_up block serving a
     * chosen expert and every down block selects from them itself (mf_select, the same bits), so the chain
     * from the logits to the experts' weight requests loses the router's fence, counter, last block and the
     * idx round trip (decode steps of one row only: moe()); 32768 (default since session 9; E <= 256): the
     * selection, wherever it is made, in fewer dependent steps (mf_select8_fast). H200, session 9's first
     * call (35B-A3B, tok/s b1 / b8, two runs each): 8204 391.6 / 964.4, 392.1 / 965.4; 24588 387.3 / 909.7,
     * 385.6 / 910.2; 57356 399.5 / 917.0, 399.1 / 913.4 (16384 at 8 rows: every block of every row selects
     * before its loads, hence one row only); second call, three runs each alternating: 8204 400.4 / 958.8,
     * 400.6 / 957.7, 400.6 / 956.8; 40972 407.2 / 963.6, 405.0 / 964.1, 407.3 / 964.5; 57356 412.9 / 963.5,
     * 412.9 / 964.4, 413.2 / 963.6; CINFER_CUDA_DIAG_AB's batch-1 graph 2.4503 -> 2.4082 -> 2.3771 ms, "skip
     * moe router" -0.2874 -> -0.2448 -> -0.1063 ms. 65536 (default since session 9's third call; with
     * 16384): gate_up lets the down kernel start only after its selection (down's own selection and loads
     * not beside it); that call, two alternating runs, b1 / b8: 57356 415.8 / 961.3, 413.5 / 960.3; 8204
     * 402.1 / 958.9, 394.0 / 954.1; 122892 416.7 / 964.3, 416.6 / 960.8 (DIAG_AB graph 2.3644 ms) */
    const char *mv = getenv("CINFER_CUDA_MOE_VARIANT");
    f->moe_variant =
        mv ? atoi(mv) & (4 | 8 | 8192 | 16384 | 32768 | 65536) : 12 | 8192 | 16384 | 32768 | 65536;
    if (mf)
        fprintf(stderr, "cinfer cuda: CINFER_CUDA_MOE_FUSED=%s: %s\n", mf,
                f->moe_fused ? "fused decode MoE kernels" : "the unfused decode MoE kernels");
    /* "grouped" (the default since the H200 run of 08:52: 35B-A3B prefill 4096 3,390 -> 7,391 tok/s, the
     * experts of a chunk 353 -> 98 ms): prefill experts (more than 64 rows) by two grouped tensor-core GEMMs
     * from device-side offsets (on rows split once into bf16 hi / lo, cp.async, ldmatrix; session 4's slower
     * forms with the same bits, grouped1 / grouped2 / grouped4, are gone: those names now mean "grouped");
     * "host": a host round trip per layer and a cuBLAS call per expert and half */
    const char *mp = getenv("CINFER_CUDA_MOE_PREFILL"), *mpv = mp ? mp : "grouped";
    if (m->cfg.n_experts > 0)
        f->moe_pf_grouped = !strncmp(mpv, "grouped", 7) && m->cfg.n_experts <= 1024 && m->H % 8 == 0 &&
                            m->cfg.moe_intermediate_size % 8 == 0;
    if (mp)
        fprintf(stderr, "cinfer cuda: CINFER_CUDA_MOE_PREFILL=%s: prefill experts %s\n", mp,
                f->moe_pf_grouped ? "by grouped GEMMs on the device" : "grouped on the host");
    /* CINFER_CUDA_MOE_PF: the MoE forms of prefill chunks (the grouped path), bits: 1 the router's logits on
     * the tensor cores (cu_moe_router, chunks of more than 64 rows), 2 cu_moe_route2 (sorted: no
     * cu_moe_sort_slots), 4 the grouped GEMMs in tiles of 256 weight rows x 64 of K, 8 the SwiGLU GEMM
     * writing the down GEMM's split input (cu_moe_gemm_swiglu_split), 64 cu_moe_group_tiles (the grouping
     * over many blocks). Default 79 (all five): H200 session 6, every form exact (2, 4, 8, 64 bit-identical
     * to 0; the MoE fixtures at 150 rows 7e-6 from 0, parity 1.70e-4 against 1.81e-4); one 4096-row layer:
     * router 202 -> 96 us, top-k + sort 30 -> 11 us, grouping 45 -> 22 us, experts 1.94 -> 1.57 ms; 35B-A3B
     * prefill 4096 20,706
     * -> 23,120 tok/s, decode batch 64 (grouped too) 1,701 -> 2,028 (call 3). 0: the forms before */
    const char *mpf = getenv("CINFER_CUDA_MOE_PF");
    f->moe_pf = mpf ? atoi(mpf) & (1 | 2 | 4 | 8 | 64) : 79;
    cu_set_moe_pf(f->moe_pf);
    if (m->cfg.n_experts > 0) cu_moe_gemm_prepare();
    if (mpf) fprintf(stderr, "cinfer cuda: CINFER_CUDA_MOE_PF=%d\n", f->moe_pf);
    /* N: decode-sized batches (<= 64 rows) of N rows or more take the grouped GEMMs too (each chosen expert
     * streamed once for all its rows; the indexed and fused paths stream it once per row). Default 64: the
     * H200 run of 09:22 (35B-A3B, 128-token prompts): batch 32 1,220.5 tok/s fused vs 992.2 grouped, batch 64
     * 1,347.3 vs 1,506.3 */
    const char *gr = getenv("CINFER_CUDA_MOE_GEMM_ROWS");
    f->moe_gemm_rows = gr && atoi(gr) > 0 ? atoi(gr) : 64;
    if (pf) /* a diagnostic switch: say what it selected, so a bench log shows which kernels ran */
        fprintf(stderr,
                "cinfer cuda: CINFER_CUDA_PREFILL=%s: deltanet prefill %s, attention prefill %s, %d TF32 "
                "passes\n",
                pf, f->gdn_tc ? "tensor cores, phased" : "scalar",
                f->attn_tc ? "tensor cores, fp16 hi + lo" : "scalar", cu_tf32_passes());
    for (int i = 0; i < PROF_MAX_MARKS; i++) cu_timer_create(&f->marks[i]);
    const char *tt = getenv("CINFER_TTFT_TRACE");
    f->trace = tt ? atoi(tt) : 0;
    if (f->trace) cu_timer_create(&f->tr_ev[0]), cu_timer_create(&f->tr_ev[1]);
    /* one cuBLAS call before any graph capture, so its lazy initialisation never happens inside one */
    if (p->max_tokens > CU_GEMV_MAX_M) {
        cu_gemm(f->cu, f->logits, f->xn, f->lm_head, CU_GEMV_MAX_M + 1, m->V, m->H, f->xb, 0);
        if ((rc = cu_sync(f->cu, err, errlen))) goto fail;
    }
    /* CINFER_CUDA_WARMUP (default on; "0": off): warm_gemms (72-95 ms in the first context of a process on
     * the H200 for the 4B shape up to 64 rows, 2.2 ms in the next: cuBLAS keeps its choices per process) */
    const char *wu = getenv("CINFER_CUDA_WARMUP");
    if (!(wu && !strcmp(wu, "0")) && (rc = warm_gemms(f, err, errlen))) goto fail;
    *out = f;
    return 0;
fail:
    cuda_fwd_destroy(f);
    return rc;
}

int cuda_fwd_slot_reset(cuda_fwd *f, int slot, char *err, size_t errlen) {
    const model *m = f->m;
    if (slot < 0 || slot >= f->p.n_slots)
        return ci_err(err, errlen, CINFER_EINVAL, "slot %d out of range", slot);
    if (m->n_lin > 0) {
        size_t cs = (size_t)m->n_lin * (size_t)(m->K - 1) * m->C,
               rs = (size_t)m->n_lin * (size_t)m->Hv * m->dk * m->dv;
        cu_memset_async(f->cu, f->conv_state + (size_t)slot * cs, cs * 4);
        cu_memset_async(f->cu, f->rec_state + (size_t)slot * rs, rs * 4);
    }
    f->pend_keep[slot] = 0; /* a new sequence: the last one's uncommitted window is moot */
    return cu_sync(f->cu, err, errlen);
}

/* ---- profiling marks ---- */

static double host_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static void mark(cuda_fwd *f, int phase) {
    if (!(f->profile || f->marking) || f->n_marks >= PROF_MAX_MARKS) return;
    if (f->marking) f->mark_host[f->n_marks] = host_ms();
    cu_timer_start(f->cu, f->marks[f->n_marks]);
    f->mark_phase[f->n_marks++] = phase;
}

void cuda_fwd_profile(cuda_fwd *f, int on) {
    f->profile = on;
    /* the profile's events between kernels need no PDL switch: no launch goes by PDL right after one
     * (cu_ctx.pdl_break, backend/cuda/common.cuh, which also says what the illegal address of session 4's
     * profiled PDL bench was) */
    f->prof_calls = 0;
    memset(f->prof_ms, 0, sizeof f->prof_ms);
}

void cuda_fwd_profile_get(cuda_fwd *f, double ms[CP_N], int *calls) {
    memcpy(ms, f->prof_ms, sizeof f->prof_ms);
    *calls = f->prof_calls;
}

void cuda_fwd_memory(const cuda_fwd *f, size_t *w, size_t *p, size_t *s) {
    *w = f->bytes_w;
    *p = f->bytes_pools;
    *s = f->bytes_scratch;
}

struct cu_ctx *cuda_fwd_stream(cuda_fwd *f) {
    return f->cu;
}

void cuda_fwd_graph_stats(const cuda_fwd *f, int *captured, int *updated) {
    *captured = f->n_captures;
    *updated = f->n_updates;
}

/* ---- the pass ---- */

/* floats in one buffer of speculative records ([slots][n_lin][spec_window][CU_SPEC_REC]) */
static size_t spec_buf_floats(const cuda_fwd *f) {
    const model *m = f->m;
    return (size_t)f->p.n_slots * m->n_lin * (size_t)f->p.spec_window * CU_SPEC_REC(m->C, m->Hv);
}

/* A deferred commit done now, by the commit kernels (before a use of the slot that does not replay it). */
static void spec_flush(cuda_fwd *f, int slot) {
    const model *m = f->m;
    int keep = f->pend_keep[slot];
    f->pend_keep[slot] = 0;
    if (keep > 0)
        cu_gdn_spec_commit(f->cu, f->conv_state, f->rec_state,
                           f->spec_rec + (size_t)f->rec_par[slot] * spec_buf_floats(f), slot, keep, m->n_lin,
                           f->p.spec_window, m->Hk, m->Hv, m->dk, m->dv, m->K, m->C);
}

typedef struct run_shape {
    int T, NE, nl, span, nsplit; /* span, nsplit: attn_kernel's (attn_split) */
    int has_spec;                /* a speculative window in the batch */
    int no_chunked;              /* no entry takes the chunked DeltaNet form (cu_gdn_args.no_chunked) */
    const int *tiles;            /* attention prefill tiles (device), or NULL */
    int n_tiles;
    cu_meta meta;
    const int *rope3;      /* [T][3] multimodal rotary positions (device), or NULL for text */
    const fwd_entry *mm_e; /* the entries when some carry image features, else NULL */
    int mm_ne;
    int gdn_fused;       /* the DeltaNet layers run the fused decode kernel (cu_gdn_args.dec_cnt) */
    cu_attn_split split; /* the attention tiles split over keys (device lists in meta), or zero */
    int max_nb;          /* KV blocks of the longest entry (cu_attn_args.kv16_nb) */
    /* with the dec kernel (attn_dec_ns): the row classes the batch holds (cu_attn_args.dec_cls; 0 without),
     * attn_dec_kernel's span and grid (dec_span, dec_nsplit; 0 when no row takes it) */
    int acls, dspan, dnsplit;
    int all_chunked; /* every entry takes the chunked DeltaNet form (no decode token, no speculative window)
                      */
} run_shape;

/* the rows y holds: one of the [max_tokens][*] scratch buffers (not a slice, as the MoE experts' rows are)
 * lets the GEMM pad its rows (cu_gemm_rows, CINFER_CUDA_GEMM_PAD) */
static int y_rows(const cuda_fwd *f, const float *y, int M) {
    int whole =
        y == f->proj || y == f->out || y == f->logits || y == f->x || y == f->shy || y == f->moe_logits;
    return whole ? f->p.max_tokens : M;
}

static void gemm(cuda_fwd *f, float *y, const float *x, const uint16_t *w, int M, int N, int K) {
    int Mb;
    if (x && x == f->xb_for && (Mb = cu_gemm_presplit_rows(f->cu, M, K, y_rows(f, y, M)))) {
        cu_gemm_presplit(f->cu, y, f->xb, w, M, N, K, Mb); /* the norm wrote the halves (norm_for_gemm) */
        return;
    }
    cu_gemm_rows(f->cu, y, x, w, M, N, K, f->xb, y_rows(f, y, M));
}

/* x += add; the RMSNorm of x by w into f->xn for the GEMMs that read it into f->proj, or with
 * CINFER_CUDA_PF_SPLIT, where those take the two-pass path, straight into their halves in f->xb (f->xb_for)
 */
static void norm_for_gemm(cuda_fwd *f, const float *add, const float *w, int T) {
    const model *m = f->m;
    float eps = (float)m->cfg.rms_norm_eps;
    int Mb = f->pf_split ? cu_gemm_presplit_rows(f->cu, T, m->H, y_rows(f, f->proj, T)) : 0;
    if (Mb) {
        cu_add_rmsnorm_split(f->cu, f->x, add, f->xb, w, T, m->H, eps, cu_gemm_presplit_lo(f->cu, Mb, m->H));
        f->xb_for = f->xn;
    } else {
        cu_add_rmsnorm(f->cu, f->x, add, f->xn, w, T, m->H, eps);
        f->xb_for = NULL;
    }
}

/* Kernel classes of a decode step for CINFER_CUDA_DIAG_AB (diag_ab): how many times enqueue launches one of
 * them, 0 (left out), 1 or 2 (twice). Outside the diagnostics always 1. */
enum { DG_IN = 1, DG_GDN = 2, DG_ATTN = 4, DG_OUT = 8, DG_GU = 16, DG_DOWN = 32, DG_LM = 64, DG_ROUTE = 128 };
static int diag_n(const cuda_fwd *f, int cls) {
    return (f->diag_skip & cls) ? 0 : (f->diag_dup & cls) ? 2 : 1;
}

/* the model's layer cl is a full-attention one (the MTP head's layers: no) */
static int cl_attn(const cuda_fwd *f, const cu_layer *cl) {
    return cl >= f->L && cl < f->L + f->m->L && f->m->full_index[cl - f->L] >= 0;
}
/* CINFER_CUDA_G3_STAMPS: the next decode GEMV of layer cl records its blocks' stamps (what: 1 out_proj) */
static void g3st_mark(cuda_fwd *f, const cu_layer *cl, int T, int what) {
    if (!f->g3st_on || T != 1) return;
    int tag = cu_gemv3_stamp_tag(), l = (int)(cl - f->L);
    if (tag < 0 || tag >= G3ST_KINDS || l < 0 || l >= f->m->L) return;
    f->g3st_kind[tag] = l * 4 + (cl_attn(f, cl) ? 2 : 0) + what;
    cu_gemv3_stamps_pause(0);
}
static void g3st_unmark(cuda_fwd *f) {
    if (f->g3st_on) cu_gemv3_stamps_pause(1);
}

/* The layer's input projection: from f->xn (normed by the caller), or with fz from the raw residual f->x,
 * normed inside the GEMV by the layer's input norm */
static void in_proj(cuda_fwd *f, const cu_layer *cl, int T, int fz) {
    const model *m = f->m;
    if (fz) {
        g3st_mark(f, cl, T, 0);
        cu_gemv_fused(f->cu, f->proj, f->x, cl->w_in, T, cl->n_in, m->H, cl->in_norm,
                      (float)m->cfg.rms_norm_eps, CU_EPI_STORE);
        g3st_unmark(f);
    } else
        gemm(f, f->proj, f->xn, cl->w_in, T, cl->n_in, m->H);
}

/* The layer's output projection of f->act: into f->out (the caller adds it to the residual), or with fz
 * added to the residual f->x by the GEMV itself */
/* CINFER_CUDA_L2PF_NEXT: the next fused GEMV requests the head (up to f->l2pf_next bytes) of w, the matrix of
 * the GEMV after it, into L2 (cu_set_gemv_next); w NULL: nothing */
static void gemv_next(cuda_fwd *f, const uint16_t *w, size_t bytes) {
    if (!f->l2pf_next || !w || (f->l2pf_next_rows && f->step_rows > f->l2pf_next_rows)) {
        cu_set_gemv_next(f->cu, NULL, 0);
        return;
    }
    cu_set_gemv_next(f->cu, w, bytes < f->l2pf_next ? bytes : f->l2pf_next);
}
/* the matrix of the GEMV after layer cl's FFN: the next layer's in_proj, lm_head after the last */
static const uint16_t *after_ffn(const cuda_fwd *f, const cu_layer *cl, size_t *bytes) {
    const model *m = f->m;
    *bytes = 0;
    if (cl >= f->L && cl + 1 < f->L + m->L) {
        *bytes = (size_t)cl[1].n_in * m->H * 2;
        return cl[1].w_in;
    }
    if (cl == f->L + m->L - 1) {
        *bytes = (size_t)m->V * m->H * 2;
        return f->lm_head;
    }
    return NULL;
}

static void out_proj(cuda_fwd *f, const cu_layer *cl, int T, int K, int fz) {
    if (fz) {
        gemv_next(f, cl->w_gu, (size_t)2 * f->m->cfg.intermediate_size * f->m->H * 2);
        g3st_mark(f, cl, T, 1);
        cu_gemv_fused(f->cu, f->x, f->act, cl->w_out, T, f->m->H, K, NULL, 0.0f, CU_EPI_ADD);
        g3st_unmark(f);
        gemv_next(f, NULL, 0);
    } else
        gemm(f, f->out, f->act, cl->w_out, T, f->m->H, K);
}

/* CINFER_CUDA_PF_SPLIT: Mb when the layer's core kernel (ok: it writes every output row itself) can write the
 * halves of its out_proj GEMM of K columns, else 0 */
static int out_split_rows(cuda_fwd *f, int T, int K, int fz, int ok) {
    return f->pf_split && !fz && ok ? cu_gemm_presplit_rows(f->cu, T, K, y_rows(f, f->out, T)) : 0;
}

/* out_proj, or with Mb from the halves the core kernel wrote into f->xb */
static void out_proj_from(cuda_fwd *f, const cu_layer *cl, int T, int K, int fz, int Mb) {
    if (Mb)
        cu_gemm_presplit(f->cu, f->out, f->xb, cl->w_out, T, f->m->H, K, Mb);
    else
        out_proj(f, cl, T, K, fz);
}

/* fin: the input norm inside in_proj (else f->xn is the normed input); fz: out_proj adds into f->x */
static void deltanet(cuda_fwd *f, const cu_layer *cl, const layer_weights *lw, int lin, const run_shape *rs,
                     int fin, int fz) {
    const model *m = f->m;
    int T = rs->T, kd = m->Hk * m->dk, vd = m->Hv * m->dv, C = m->C;
    mark(f, CP_GEMM_IN);
    for (int n = diag_n(f, DG_IN); n > 0; n--) in_proj(f, cl, T, fin);
    mark(f, CP_GDN);
    cu_gdn_args a = {0};
    a.T = T, a.NE = rs->NE, a.Hk = m->Hk, a.Hv = m->Hv, a.dk = m->dk, a.dv = m->dv, a.K = m->K, a.C = C;
    a.n_lin = m->n_lin, a.lin = lin;
    if (lw->fused_qkvz) {
        cu_next_split(f->cu, f->proj, cl->n_in, f->sq, f->sz, f->sb, f->sa, T, m->Hk, m->Hv, m->dk, m->dv);
        a.qkv = f->sq, a.qkv_ld = C, a.z = f->sz, a.z_ld = vd, a.b = f->sb, a.a = f->sa, a.ba_ld = m->Hv;
    } else {
        a.qkv = f->proj, a.qkv_ld = cl->n_in;
        a.z = f->proj + C, a.z_ld = cl->n_in;
        a.b = f->proj + C + vd, a.a = f->proj + C + vd + m->Hv, a.ba_ld = cl->n_in;
    }
    (void)kd;
    a.conv_w = cl->conv_w, a.A = cl->A, a.dt_bias = cl->dt_bias, a.gnorm = cl->gnorm;
    a.conv_out = f->conv_out, a.bg = f->bg, a.o = f->act;
    a.conv_state = f->conv_state, a.rec_state = f->rec_state, a.eps = (float)m->cfg.rms_norm_eps;
    a.meta = rs->meta, a.tc = f->gdn_tc;
    a.chunk_scr = f->gdn_chunk, a.chunk_cap = f->gdn_chunk_cap, a.chunk_dt = f->gdn_chunk_dt;
    a.chunk_fast = f->gdn_fast;
    a.spec_rec = f->spec_rec, a.spec_win = f->p.spec_window, a.has_spec = rs->has_spec;
    a.spec_buf = f->spec_fuse ? spec_buf_floats(f) : 0;
    a.no_chunked = rs->no_chunked, a.dec_cnt = rs->gdn_fused ? f->gdn_cnt : NULL;
    a.dec_cluster = f->gdn_cluster, a.dec_cluster_max = f->gdn_cluster_max, a.dec_stamps = f->gdn_stamps;
    a.dec_wide = f->gdn_wide;
    /* CINFER_CUDA_PF_SPLIT: a step with prefill rows ends in gnorm_kernel, which then writes out_proj's
     * halves */
    int Mb = out_split_rows(f, T, vd, fz, !rs->no_chunked);
    if (Mb) a.o_xb = f->xb, a.o_lo = cu_gemm_presplit_lo(f->cu, Mb, vd);
    a.win_cnt = rs->has_spec && rs->no_chunked ? f->win_cnt : NULL, a.win_v2 = f->win_v2;
    /* fast mode, a batch of prefills only: the fused layer where it serves (the default; not with
     * CINFER_CUDA_GDN_FAST=1) */
    int lf = f->gdn_fast == 2 && rs->all_chunked;
    for (int n = diag_n(f, DG_GDN); n > 0; n--)
        if (!(lf && cu_gdn_layer_fast(f->cu, &a))) cu_gdn_layer(f->cu, &a);
    mark(f, CP_GEMM_OUT);
    for (int n = diag_n(f, DG_OUT); n > 0; n--) out_proj_from(f, cl, T, vd, fz, Mb);
}

/* kpool / vpool: the model's pools (layer full of f->p.n_blocks blocks each) or the MTP head's (full 0) */
static void attention(cuda_fwd *f, const cu_layer *cl, int full, const run_shape *rs, float *kpool,
                      float *vpool, int n_blocks, int fin, int fz) {
    const model *m = f->m;
    int T = rs->T;
    mark(f, CP_GEMM_IN);
    for (int n = diag_n(f, DG_IN); n > 0; n--) in_proj(f, cl, T, fin);
    mark(f, CP_ATTN);
    cu_attn_args a = {0};
    a.T = T, a.Hq = m->Hq, a.Hkv = m->Hkv, a.hd = m->hd, a.rope_dim = m->cfg.rope_dim, a.n_blocks = n_blocks;
    a.full = full, a.qkv = f->proj, a.ld = cl->n_in, a.q_norm = cl->q_norm, a.k_norm = cl->k_norm;
    a.inv_freq = f->inv_freq, a.kpool = kpool, a.vpool = vpool, a.o = f->act, a.part = f->part;
    a.span = rs->span, a.nsplit = rs->nsplit, a.eps = (float)m->cfg.rms_norm_eps, a.meta = rs->meta;
    a.tiles = rs->tiles, a.n_tiles = rs->n_tiles, a.tc = f->attn_tc, a.split = rs->split;
    /* K and V split once per layer for tiles of many rows on the model's pool (the pre-pass reads every key
     * of the launch's entries: with few rows the tiles' own splits cost less); the same bits either way.
     * The fast form reads only the pre-pass's images: with key splits too */
    if (f->kv16 && rs->tiles && (!rs->split.work || f->attn_fast) && T >= 256 && kpool == f->kpool)
        a.kv16 = f->kv16, a.kv16_NE = rs->NE, a.kv16_nb = rs->max_nb, a.fast = f->attn_fast;
    a.rope3 = rs->rope3, a.mrope_h = m->cfg.mrope_section[1], a.mrope_w = m->cfg.mrope_section[2];
    /* decode-only steps of the model (the MTP head's calls leave no_chunked 0) */
    a.dec_cnt = rs->no_chunked && !rs->has_spec && !rs->tiles ? f->attn_cnt : NULL;
    a.dec_nsmax = f->attn_dec_ns;
    a.dec_p = f->attn_dec_p, a.dec_cls = rs->acls, a.dec_span = rs->dspan, a.dec_nsplit = rs->dnsplit;
    a.dec_part = f->part + f->part_attn;
    a.dec_hs = T <= f->attn_dec_hs[1] ? f->attn_dec_hs[0] : 0;
    a.dec_stamps = f->astamps;
    /* CINFER_CUDA_PF_SPLIT: tensor-core tiles without key splits write every row's output themselves */
    int Mb = out_split_rows(f, T, m->Hq * m->hd, fz, a.tiles && a.tc && !a.split.work);
    if (Mb) a.o_xb = f->xb, a.o_lo = cu_gemm_presplit_lo(f->cu, Mb, m->Hq * m->hd);
    for (int n = diag_n(f, DG_ATTN); n > 0; n--) {
        if (!a.dec_nsmax || a.tiles || T <= ATTN_DEC_ROWS) {
            cu_attn_layer(f->cu, &a);
            continue;
        }
        /* attn_dec_kernel: groups of ATTN_DEC_ROWS rows (the partials hold that many); a row's arithmetic
         * does not depend on its group */
        for (int r0 = 0; r0 < T; r0 += ATTN_DEC_ROWS) {
            cu_attn_args b = a;
            b.T = T - r0 < ATTN_DEC_ROWS ? T - r0 : ATTN_DEC_ROWS;
            b.meta.row_pos += r0, b.meta.row_entry += r0;
            b.qkv += (size_t)r0 * a.ld, b.o += (size_t)r0 * m->Hq * m->hd;
            if (b.rope3) b.rope3 += 3 * (size_t)r0;
            cu_attn_layer(f->cu, &b);
        }
    }
    mark(f, CP_GEMM_OUT);
    for (int n = diag_n(f, DG_OUT); n > 0; n--) out_proj_from(f, cl, T, m->Hq * m->hd, fz, Mb);
}

static void mlp(cuda_fwd *f, float *y, const float *x, const uint16_t *gu, const uint16_t *down, int M,
                int I) {
    const model *m = f->m;
    mark(f, CP_FFN_GEMM);
    /* CINFER_CUDA_FAST_GU16 (fast, the norm wrote gate_up's one bf16 copy): gate_up into bf16, SwiGLU from it
     * into the down GEMM's copy: the [M][2I] product moves in half the bytes */
    int Mg, Md;
    if (f->gu16 && x && x == f->xb_for &&
        (Mg = cu_gemm_presplit_rows(f->cu, M, m->H, y_rows(f, f->proj, M))) &&
        !cu_gemm_presplit_lo(f->cu, Mg, m->H) && (Md = cu_gemm_presplit_rows(f->cu, M, I, y_rows(f, y, M)))) {
        cu_gemm_presplit_out16(f->cu, (uint16_t *)f->proj, f->xb, gu, 2 * I, m->H, Mg);
        mark(f, CP_FFN_ACT);
        cu_swiglu16(f->cu, f->xb, (const uint16_t *)f->proj, M, I);
        mark(f, CP_FFN_GEMM);
        cu_gemm_presplit(f->cu, y, f->xb, down, M, m->H, I, Md);
        return;
    }
    gemm(f, f->proj, x, gu, M, 2 * I, m->H);
    mark(f, CP_FFN_ACT);
    /* CINFER_CUDA_PF_SPLIT: SwiGLU straight into the down GEMM's halves where it takes the two-pass path */
    int Mb = f->pf_split ? cu_gemm_presplit_rows(f->cu, M, I, y_rows(f, y, M)) : 0;
    if (Mb) {
        cu_swiglu_split(f->cu, f->xb, f->proj, M, I, cu_gemm_presplit_lo(f->cu, Mb, I));
        mark(f, CP_FFN_GEMM);
        cu_gemm_presplit(f->cu, y, f->xb, down, M, m->H, I, Mb);
        return;
    }
    cu_swiglu(f->cu, f->act, f->proj, M, I);
    mark(f, CP_FFN_GEMM);
    gemm(f, y, f->act, down, M, m->H, I);
}

/* the dense FFN on the raw residual: x += down(swiglu(gate_up(rmsnorm(x) * post_norm))) in two GEMVs */
static void mlp_fused(cuda_fwd *f, const cu_layer *cl, int M) {
    const model *m = f->m;
    int I = m->cfg.intermediate_size;
    mark(f, CP_FFN_GEMM);
    size_t nb = 0;
    const uint16_t *nw = after_ffn(f, cl, &nb);
    for (int n = diag_n(f, DG_GU); n > 0; n--) {
        gemv_next(f, cl->w_down, (size_t)m->H * I * 2);
        cu_gemv_fused(f->cu, f->act, f->x, cl->w_gu, M, I, m->H, cl->post_norm, (float)m->cfg.rms_norm_eps,
                      CU_EPI_SWIGLU);
    }
    for (int n = diag_n(f, DG_DOWN); n > 0; n--) {
        gemv_next(f, nw, nb);
        cu_gemv_fused(f->cu, f->x, f->act, cl->w_down, M, m->H, I, NULL, 0.0f, CU_EPI_ADD);
    }
    gemv_next(f, NULL, 0);
}

/* 1 when moe() runs this batch's MoE block on the fused decode kernels */
static int moe_fused_path(const cuda_fwd *f, int T, int device_only) {
    return device_only && f->moe_fused && !(f->moe_pf_grouped && T >= f->moe_gemm_rows);
}

/* into_x: the caller takes the block's output added into the residual f->x (*added = 1 when it was: the fused
 * decode path), else it lands in f->out (*added = 0). norm_w: NULL, or (fused path only) the post-attention
 * norm the caller left to the router, which takes it from f->x into f->xn */
static int moe(cuda_fwd *f, const cu_layer *cl, const run_shape *rs, int device_only, int into_x,
               const float *norm_w, int *added, char *err, size_t errlen) {
    const model *m = f->m;
    const model_config *c = &m->cfg;
    int T = rs->T, H = m->H, E = c->n_experts, k = c->n_experts_per_tok, Im = c->moe_intermediate_size;
    int S = T * k, rc;
    *added = 0;
    /* the grouped tensor-core GEMMs: past 64 rows (prefill), and decode batches from moe_gemm_rows rows on */
    int gemm_path = f->moe_pf_grouped && (!device_only || T >= f->moe_gemm_rows);
    if (moe_fused_path(f, T, device_only)) {
        /* router + selection, gate_up + SwiGLU (+ the shared expert and its gate), down + combine */
        cu_moe_args a = {0};
        a.T = T, a.H = H, a.E = E, a.k = k, a.Im = Im,
        a.Is = cl->sh_gu ? c->shared_expert_intermediate_size : 0;
        a.norm = c->norm_topk_prob, a.x = f->xn, a.router = cl->router, a.e_gu = cl->e_gu,
        a.e_down = cl->e_down;
        a.sh_gu = cl->sh_gu, a.sh_down = cl->sh_down, a.sh_gw = cl->sh_gw;
        a.logits = f->moe_logits, a.idx = f->moe_idx, a.w = f->moe_w, a.count = f->moe_cnt, a.act = f->moe_fa;
        a.shg = f->shg, a.out = f->out, a.resid = into_x ? f->x : NULL,
        a.variant =
            f->profile ? f->moe_variant & ~4 : f->moe_variant; /* no PDL beside the profile's events */
        /* the selection in the expert kernels (16384) at one row only: with more, every block of every row
         * selects before its loads, wave after wave (H200, session 9's first call: 35B-A3B batch 8 964.4 ->
         * 917.0 tok/s); either form gives the same bits */
        if (T > 1) a.variant &= ~16384;
        *added = into_x;
        if (norm_w) a.x = f->x, a.norm_w = norm_w, a.eps = (float)m->cfg.rms_norm_eps, a.xn = f->xn;
        /* CINFER_CUDA_DIAG_AB's classes: the router (DG_ROUTE), gate_up (DG_GU), down (DG_DOWN) */
        int nr = diag_n(f, DG_ROUTE), ng = diag_n(f, DG_GU), nd = diag_n(f, DG_DOWN);
        mark(f, CP_MOE_ROUTE);
        for (int n = nr; n > 0; n--) cu_moe_fused_route(f->cu, &a);
        mark(f, CP_MOE_EXPERTS);
        for (int n = ng; n > 0; n--) cu_moe_fused_gate_up(f->cu, &a);
        for (int n = nd; n > 0; n--) cu_moe_fused_down(f->cu, &a);
        return 0;
    }
    mark(f, CP_MOE_ROUTE);
    /* f32 activations (routing is exact-ish): the f32 GEMV, or (moe_pf & 1, chunks of more than 64 rows) the
     * tensor cores on x split in three bf16 parts (at 64 rows, decode, the GEMV was faster: H200 call 2) */
    if ((f->moe_pf & 1) && T > 64 && H % 8 == 0 && (size_t)3 * T * H <= f->xb_elems)
        cu_moe_router(f->cu, f->moe_logits, f->xn, cl->router, T, E, H, f->xb);
    else
        cu_gemm(f->cu, f->moe_logits, f->xn, cl->router, T, E, H, f->xb, 1);
    /* every path below wants each row's choices in ascending expert order (the host path sorts again) */
    int sorted = (f->moe_pf & 2) && E <= 1024 && k <= 32;
    if (sorted)
        cu_moe_route2(f->cu, f->moe_logits, f->moe_idx, f->moe_w, T, E, k, c->norm_topk_prob, 1);
    else
        cu_moe_route(f->cu, f->moe_logits, f->moe_idx, f->moe_w, T, E, k, c->norm_topk_prob);
    const int *pos;
    const float *wts;
    if (gemm_path) {
        /* slots grouped by expert and counted in 64-slot tiles on the device; two grouped GEMMs (SwiGLU in
         * the first's epilogue) write each slot's row; the combine reads slots in ascending expert order */
        if (!sorted) cu_moe_sort_slots(f->cu, f->moe_idx, f->moe_w, T, k);
        if (f->moe_pf & 64) {
            cu_moe_group_tiles(f->cu, f->moe_idx, S, E, f->moe_grp, f->moe_tiles, 64, f->moe_gscr);
        } else {
            cu_moe_group(f->cu, f->moe_idx, S, E, f->moe_grp);
            cu_moe_tiles(f->cu, f->moe_grp, E, f->moe_tiles);
        }
        mark(f, CP_MOE_EXPERTS);
        if (f->moe_pf & 8) { /* ea's S Im floats hold the down GEMM's bf16 hi + lo rows (2 S Im halves) */
            uint16_t *eas = (uint16_t *)f->ea;
            cu_moe_gemm_swiglu_split(f->cu, eas, f->xn, k, cl->e_gu, f->moe_grp, f->moe_tiles, S, E, Im, H,
                                     f->xb);
            cu_moe_gemm_presplit(f->cu, f->ey, eas, cl->e_down, f->moe_grp, f->moe_tiles, S, E, H, Im);
        } else {
            cu_moe_gemm_swiglu(f->cu, f->ea, f->xn, k, cl->e_gu, f->moe_grp, f->moe_tiles, S, E, Im, H,
                               f->xb);
            cu_moe_gemm(f->cu, f->ey, f->ea, 1, cl->e_down, f->moe_grp, f->moe_tiles, S, E, H, Im, f->xb);
        }
        pos = f->moe_ident;
        wts = f->moe_w;
    } else if (device_only) {
        /* decode: every (row, choice) slot streams its expert through the indexed GEMV, no host round trip */
        if (!sorted) cu_moe_sort_slots(f->cu, f->moe_idx, f->moe_w, T, k);
        mark(f, CP_MOE_EXPERTS);
        cu_gemv_indexed(f->cu, f->gu, f->xn, k, cl->e_gu, f->moe_idx, S, 2 * Im, H);
        cu_swiglu(f->cu, f->ea, f->gu, S, Im);
        cu_gemv_indexed(f->cu, f->ey, f->ea, 1, cl->e_down, f->moe_idx, S, H, Im);
        pos = f->moe_ident;
        wts = f->moe_w;
    } else {
        /* grouped: rows sorted by expert on the host, one GEMM per expert over its rows */
        cu_d2h_async(f->cu, f->h_moe_idx, f->moe_idx, (size_t)S * 4);
        cu_d2h_async(f->cu, f->h_moe_w, f->moe_w, (size_t)S * 4);
        if ((rc = cu_sync(f->cu, err, errlen))) return rc;
        int *cnt = f->h_cnt, *off = f->h_off,
            *fill = f->h_fill; /* sized at creation: nothing allocated per step */
        memset(cnt, 0, sizeof(int) * ((size_t)E + 1));
        memset(off, 0, sizeof(int) * ((size_t)E + 1));
        memset(fill, 0, sizeof(int) * ((size_t)E + 1));
        for (int p = 0; p < S; p++) {
            int e = f->h_moe_idx[p];
            if (e < 0 || e >= E) e = 0; /* cannot happen: the router writes indices < E */
            f->h_moe_idx[p] = e;
            cnt[e]++;
        }
        for (int e = 0; e < E; e++) off[e + 1] = off[e] + cnt[e];
        int *src = f->h_moe_up, *hp = f->h_moe_up + S;
        float *hw = (float *)(f->h_moe_up + 2 * S);
        for (int r = 0; r < T; r++) {
            int *ir = f->h_moe_idx + (size_t)r * k;
            float *wr = f->h_moe_w + (size_t)r * k;
            /* this row's choices in ascending expert order */
            for (int a = 1; a < k; a++)
                for (int b = a; b > 0 && ir[b - 1] > ir[b]; b--) {
                    int ti = ir[b];
                    ir[b] = ir[b - 1], ir[b - 1] = ti;
                    float tw = wr[b];
                    wr[b] = wr[b - 1], wr[b - 1] = tw;
                }
            for (int j = 0; j < k; j++) {
                int e = ir[j], p = off[e] + fill[e]++;
                src[p] = r;
                hp[r * k + j] = p;
                hw[r * k + j] = wr[j];
            }
        }
        cu_h2d_async(f->cu, f->moe_host, f->h_moe_up, (size_t)3 * S * 4);
        mark(f, CP_MOE_EXPERTS);
        cu_gather_rows(f->cu, f->xg, f->xn, f->moe_host, S, H);
        for (int e = 0; e < E; e++)
            if (cnt[e])
                gemm(f, f->gu + (size_t)off[e] * 2 * Im, f->xg + (size_t)off[e] * H,
                     cl->e_gu + (size_t)e * 2 * Im * H, cnt[e], 2 * Im, H);
        cu_swiglu(f->cu, f->ea, f->gu, S, Im);
        for (int e = 0; e < E; e++)
            if (cnt[e])
                gemm(f, f->ey + (size_t)off[e] * H, f->ea + (size_t)off[e] * Im,
                     cl->e_down + (size_t)e * H * Im, cnt[e], H, Im);
        pos = f->moe_host + S;
        wts = (const float *)(f->moe_host + 2 * S);
        /* the pinned upload buffer is reused by the next MoE layer: wait for this copy first */
        if ((rc = cu_sync(f->cu, err, errlen))) return rc;
    }
    const float *sh = NULL, *shg = NULL;
    if (cl->sh_gu) {
        int Is = c->shared_expert_intermediate_size;
        mlp(f, f->shy, f->xn, cl->sh_gu, cl->sh_down, T, Is);
        mark(f, CP_MOE_ROUTE);
        cu_gemm(f->cu, f->shg, f->xn, cl->sh_gw, T, 1, H, f->xb, 1);
        sh = f->shy, shg = f->shg;
    }
    mark(f, CP_FFN_ACT);
    cu_moe_combine(f->cu, f->out, f->ey, pos, wts, T, k, H, sh, shg);
    return 0;
}

/* image tokens: the vision features (host rows) replace their embeddings, one copy per run of consecutive
 * feature rows (never inside a graph: batches with image rows run eagerly) */
static void image_rows(cuda_fwd *f, const run_shape *rs) {
    const fwd_entry *e = rs->mm_e;
    size_t H = (size_t)f->m->H;
    for (int i = 0, r0 = 0; i < rs->mm_ne; r0 += e[i].n, i++) {
        if (!e[i].embeds) continue;
        int n = e[i].n < e[i].mm_n ? e[i].n : e[i].mm_n;
        for (int t = 0; t < n;) {
            int row = e[i].embed_row[t], k = 1;
            if (row < 0) {
                t++;
                continue;
            }
            while (t + k < n && e[i].embed_row[t + k] == row + k) k++;
            cu_h2d_async(f->cu, f->x + (size_t)(r0 + t) * H, e[i].embeds + (size_t)row * H,
                         (size_t)k * H * sizeof(float));
            t += k;
        }
    }
}

/* The PDL level of a step (cu_set_pdl, set per step: the level is process-wide): CINFER_CUDA_PDL's level only
 * where the H200 showed it exact (session 5, calls 1-3: every fixture and the 4B shape, graphs and eager,
 * alone and batched, bit for bit): steps of decode tokens only, in a context that never verifies speculative
 * windows; elsewhere none. In a context that may verify, PDL (even session 4's GEMV-only form, through the
 * skinny GEMM, which goes by PDL again since session 9, here only) broke cuda_spec_rollback_is_exact; the row
 * kernels alone did not (CINFER_CUDA_PDL_ANY=1 with CINFER_CUDA_PDL_MASK=1, call 3). CINFER_CUDA_PDL_ANY=1
 * keeps the level everywhere (diagnostics). */
static void pdl_step(cuda_fwd *f, const run_shape *rs) {
    int plain = rs->no_chunked && !rs->has_spec && !rs->tiles && f->p.spec_window == 0;
    cu_set_pdl(plain || f->pdl_any ? f->pdl : 0);
}

/* everything after the metadata upload up to the logits on the device */
static int enqueue(cuda_fwd *f, const run_shape *rs, int moe_device, char *err, size_t errlen) {
    const model *m = f->m;
    int T = rs->T, H = m->H, rc;
    float eps = (float)m->cfg.rms_norm_eps;
    pdl_step(f, rs);
    f->step_rows = T;
    f->xb_for = NULL;
    mark(f, CP_EMBED_NORM);
    cu_embed(f->cu, f->x, f->embed, rs->meta.ids, T, H);
    /* image rows are copied into x between the embedding and the first GEMV: a memcpy between two kernels,
     * after which the next launch goes without PDL (cu_ctx.pdl_break) */
    if (rs->mm_e) image_rows(f, rs);
    /* CINFER_CUDA_FUSE: at decode-sized T every GEMV of a dense layer takes cu_gemv_fused (K % 8 == 0 for
     * all of them); pend: f->out holds an output not yet added to the residual f->x (always, unfused; after
     * a MoE layer, fused) — the next norm kernel adds it, and a fused GEMV never reads x while one pends */
    int I = m->cfg.intermediate_size, vd = m->Hv * m->dv;
    int fz = f->fuse && cu_gemv_fusable(T, H) && cu_gemv_fusable(T, m->Hq * m->hd) &&
             (I <= 0 || cu_gemv_fusable(T, I)) && (vd <= 0 || cu_gemv_fusable(T, vd));
    int pend = 0;
    for (int l = 0; l < m->L; l++) {
        const cu_layer *cl = &f->L[l];
        const layer_weights *lw = &m->layers[l];
        int fin = fz && !pend; /* this layer's input norm inside its in_proj */
        if (!fin) {
            mark(f, CP_EMBED_NORM);
            /* the previous layer's FFN output joins the residual here (fused with this layer's input norm) */
            norm_for_gemm(f, pend ? f->out : NULL, cl->in_norm, T);
        }
        if (lw->type == LAYER_LINEAR)
            deltanet(f, cl, lw, m->lin_index[l], rs, fin, fz);
        else
            attention(f, cl, m->full_index[l], rs, f->kpool, f->vpool, f->p.n_blocks, fin, fz);
        f->xb_for = NULL;
        pend = !fz;
        /* CINFER_CUDA_MOE_VARIANT & 8: the fused MoE's router takes this norm itself (nothing pends under fz)
         */
        int moe_norm = lw->moe && fz && (f->moe_variant & 8) && cu_moe_fused_norm_ok(H) &&
                       moe_fused_path(f, T, moe_device);
        if ((lw->moe || !fz) && !moe_norm) {
            mark(f, CP_EMBED_NORM);
            if (lw->moe) /* the router and the experts read f->xn */
                cu_add_rmsnorm(f->cu, f->x, pend ? f->out : NULL, f->xn, cl->post_norm, T, H, eps);
            else
                norm_for_gemm(f, pend ? f->out : NULL, cl->post_norm, T);
        }
        if (lw->moe) {
            /* under CINFER_CUDA_FUSE the fused MoE adds into the residual itself, so the next layer's input
             * norm can go into its in_proj */
            int added;
            if ((rc = moe(f, cl, rs, moe_device, fz, moe_norm ? cl->post_norm : NULL, &added, err, errlen)))
                return rc;
            pend = !added;
        } else if (fz) {
            mlp_fused(f, cl, T);
            pend = 0;
        } else {
            mlp(f, f->out, f->xn, cl->w_gu, cl->w_down, T, m->cfg.intermediate_size);
            pend = 1;
        }
        f->xb_for = NULL;
    }
    mark(f, CP_EMBED_NORM);
    if (pend) cu_add(f->cu, f->x, f->out, T, H);
    /* final norm of the rows that need logits (gathered), then lm_head */
    cu_gather_rmsnorm(f->cu, f->xn, f->x, rs->meta.lrow, f->final_norm, rs->nl, H, eps);
    mark(f, CP_LM_HEAD);
    for (int n = diag_n(f, DG_LM); n > 0; n--) gemm(f, f->logits, f->xn, f->lm_head, rs->nl, m->V, H);
    return 0;
}

/* CINFER_CUDA_DIAG_AB=1 (measurements only: the state and the KV of the batch's sequences advance by every
 * replay, so what follows the diagnostics is not the model's output): at the first replay of a decode graph
 * of B rows (once per B), the same step captured again with one kernel class left out or launched twice
 * (or without PDL), each graph replayed back to back between two events; a line per variant on stderr. The
 * difference to the base is that class's cost inside the graph, overlap included. */
static void diag_ab(cuda_fwd *f, const run_shape *rs, int moe_device) {
    static const struct {
        const char *name;
        int skip, dup, nopdl, apf; /* apf: CINFER_CUDA_ATTN_PF (-1: 0) */
        const char *g3;            /* "u_small,var_small,u_big,var_big[,glu_nr,glu_var]", or NULL */
        int l2n;                   /* CINFER_CUDA_L2PF_NEXT MB (-1: 0) */
    } v[] = {
        {"base", 0, 0, 0},
        {"g3 glu old 2,2", 0, 0, 0, 0, "0,-1,0,-1,2,2"},
        {"g3 glu 4,2", 0, 0, 0, 0, "0,-1,0,-1,4,2"},
        {"g3 glu 2,8", 0, 0, 0, 0, "0,-1,0,-1,2,8"},
        {"g3 in_proj var10", 0, 0, 0, 0, "0,-1,0,10"},
        {"g3 in_proj var8", 0, 0, 0, 0, "0,-1,0,8"},
        {"g3 in_proj var0", 0, 0, 0, 0, "0,-1,0,0"},
        {"g3 base again", 0, 0, 0, 0, NULL},
        {"l2pf next off", 0, 0, 0, 0, NULL, -1},
        {"l2pf next 4", 0, 0, 0, 0, NULL, 4},
        {"l2pf next 5", 0, 0, 0, 0, NULL, 5},
        {"l2pf next 8", 0, 0, 0, 0, NULL, 8},
        {"g3 small var0", 0, 0, 0, 0, "0,0,0,-1"},
        {"g3 small var0 + next off", 0, 0, 0, 0, "0,0,0,-1", -1},
        {"attn pf 0", 0, 0, 0, -1},
        {"pdl off", 0, 0, 1},
        {"skip in_proj", DG_IN, 0, 0},
        {"skip deltanet", DG_GDN, 0, 0},
        {"skip attention", DG_ATTN, 0, 0},
        {"skip out_proj", DG_OUT, 0, 0},
        {"skip gate_up", DG_GU, 0, 0},
        {"skip down", DG_DOWN, 0, 0},
        {"skip lm_head", DG_LM, 0, 0},
        {"skip deltanet+attn", DG_GDN | DG_ATTN, 0, 0},
        {"skip all gemv", DG_IN | DG_OUT | DG_GU | DG_DOWN | DG_LM, 0, 0},
        {"skip moe router", DG_ROUTE, 0, 0},
        {"skip moe block", DG_ROUTE | DG_GU | DG_DOWN, 0, 0},
        {"skip everything", 255, 0, 0},
        {"dup in_proj", 0, DG_IN, 0},
        {"dup deltanet", 0, DG_GDN, 0},
        {"dup attention", 0, DG_ATTN, 0},
        {"dup out_proj", 0, DG_OUT, 0},
        {"dup gate_up", 0, DG_GU, 0},
        {"dup down", 0, DG_DOWN, 0},
        {"dup lm_head", 0, DG_LM, 0},
        {"dup moe router", 0, DG_ROUTE, 0},
        {"base again", 0, 0, 0},
    };
    enum { REPS = 30 };
    cu_timer *t0 = NULL, *t1 = NULL;
    char err[256];
    if (cu_timer_create(&t0) || cu_timer_create(&t1)) goto done;
    double base = 0;
    int pdl = f->pdl;
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        f->diag_skip = v[i].skip, f->diag_dup = v[i].dup;
        if (v[i].nopdl) f->pdl = 0;
        size_t l2n = f->l2pf_next;
        if (v[i].l2n) f->l2pf_next = v[i].l2n > 0 ? (size_t)v[i].l2n << 20 : 0;
        if (v[i].apf) cu_set_attn_decode_pf(v[i].apf > 0 ? v[i].apf : 0);
        int g3[6] = {0, -1, 0, -1, 0, 0};
        if (v[i].g3 &&
            sscanf(v[i].g3, "%d,%d,%d,%d,%d,%d", &g3[0], &g3[1], &g3[2], &g3[3], &g3[4], &g3[5]) >= 4)
            cu_set_gemv3_one(g3[0], g3[1], g3[2], g3[3]);
        if (g3[4]) cu_set_gemv3_glu(g3[4], g3[5]);
        void *exec = NULL;
        int rc = cu_capture_begin(f->cu, err, sizeof err);
        int rc2 = rc ? rc : enqueue(f, rs, moe_device, err, sizeof err);
        if (!rc) rc = cu_capture_end(f->cu, &exec, err, sizeof err);
        f->pdl = pdl, f->diag_skip = f->diag_dup = 0;
        f->l2pf_next = l2n;
        cu_set_attn_decode_pf(f->attn_pf);
        cu_set_gemv3_one(0, -1, 0, -1);
        cu_set_gemv3_glu(f->glu[0], f->glu[1]);
        if (rc || rc2) {
            fprintf(stderr, "cinfer diag: %s: %s\n", v[i].name, err);
            cu_graph_destroy(exec);
            break;
        }
        for (int r = 0; r < 3 && !rc; r++) rc = cu_graph_launch(f->cu, exec, err, sizeof err);
        cu_timer_start(f->cu, t0);
        for (int r = 0; r < REPS && !rc; r++) rc = cu_graph_launch(f->cu, exec, err, sizeof err);
        cu_timer_start(f->cu, t1);
        if (!rc) rc = cu_sync(f->cu, err, sizeof err);
        cu_graph_destroy(exec);
        if (rc) {
            fprintf(stderr, "cinfer diag: %s: %s\n", v[i].name, err);
            break;
        }
        double ms = cu_timer_between_ms(t0, t1) / REPS;
        if (i == 0) base = ms;
        fprintf(stderr, "cinfer diag: B=%d %-20s %8.4f ms/step %+8.4f\n", rs->NE, v[i].name, ms, ms - base);
    }
done:
    if (t0) cu_timer_destroy(t0);
    if (t1) cu_timer_destroy(t1);
}

/* attention position splits: enough (rows x heads x splits) blocks to fill the device at decode, none when
 * the rows alone do; spans are powers of two times 64 so a decode graph stays valid for many steps */
static void attn_split_old(const cuda_fwd *f, int T, int maxpos, int *span, int *nsplit);
/* rows at positions minpos..maxpos: with the dec kernel, the classes they hold (rows at positions >= P =
 * attn_dec_p: attn_dec_kernel; the others attn_kernel, split as the rows below P alone need), else
 * attn_kernel's split (acls 0) */
static void attn_split(const cuda_fwd *f, int T, int minpos, int maxpos, run_shape *rs) {
    rs->acls = rs->dspan = rs->dnsplit = 0;
    if (!f->attn_dec_ns) {
        attn_split_old(f, T, maxpos, &rs->span, &rs->nsplit);
        return;
    }
    int P = f->attn_dec_p;
    rs->acls = (minpos < P) | (maxpos >= P) << 1;
    if (rs->acls & 2) { /* attn_dec_kernel: spans per row from its own position; span says whether every
                           row's spans are one chunk (one stage of shared memory; cu_attn_args.dec_nsmax) */
        rs->dnsplit = cu_attn_dec_grid(maxpos, f->attn_dec_ns);
        rs->dspan = (maxpos + CU_ATTN_DEC_CH) / CU_ATTN_DEC_CH <= f->attn_dec_ns ? CU_ATTN_DEC_CH
                                                                                 : 2 * CU_ATTN_DEC_CH;
        if (f->attn_dec_1st && T >= f->attn_dec_1st) rs->dspan = CU_ATTN_DEC_CH;
    }
    /* attn_kernel's rows: spans from each row's own position (cu_attn_row_span), never from the batch */
    rs->span = rs->nsplit = 0;
    if (rs->acls & 1) rs->span = 64, rs->nsplit = cu_attn_row_grid(maxpos < P - 1 ? maxpos : P - 1);
}
static void attn_split_old(const cuda_fwd *f, int T, int maxpos, int *span, int *nsplit) {
    int rows = T * f->m->Hq, want = rows >= ATTN_TARGET_BLOCKS ? 1 : (ATTN_TARGET_BLOCKS + rows - 1) / rows;
    int s = 64;
    while ((maxpos + 1 + s - 1) / s > want) s *= 2;
    *span = s;
    *nsplit = (maxpos + 1 + s - 1) / s;
    /* CINFER_CUDA_ATTN_ROUND (default on): more than one split launches a multiple of 8 of them (within
     * want), the ones past the row's position returning at once, so a decode graph (whose key holds nsplit)
     * serves 512 positions instead of 64 before the next capture (~1.4 ms at the 4B shape, one in the 64
     * timed steps of the bench); every split's span and the merge's count (row_pos / span + 1) are unchanged:
     * the same bits */
    if (f->attn_round && *nsplit > 1) {
        int r = (*nsplit + 7) & ~7, cap = want > *nsplit ? want : *nsplit;
        *nsplit = r < cap ? r : cap;
    }
}

/* Lays out and uploads one call's metadata (cu_meta) and fills rs. lmode: per entry 0 no logits row, 1 its
 * last row, 2 every row (NULL: from all_logits); hidden rows (entries with e.hidden) listed at *o_hrow_out;
 * astart: the entries' attn_start go up too (meta.e_astart). For a decode step every offset up to the block
 * tables depends on NE alone (graphs). */
static int pack_meta(cuda_fwd *f, const fwd_entry *e, int NE, const int *lmode, int T, int nl, int nh,
                     int max_n, int maxpos, int has_spec, int mm, int mm_rows, int astart, const int *keep,
                     const int *par, run_shape *rs, size_t *o_hrow_out, char *err, size_t errlen) {
    int *h = f->h_meta;
    size_t o_ids = 0, o_pos = o_ids + T, o_ent = o_pos + T, o_len = o_ent + T, o_n = o_len + NE,
           o_r0 = o_n + NE;
    size_t o_slot = o_r0 + NE, o_boff = o_slot + NE, o_lrow = o_boff + NE, o_spec = o_lrow + nl,
           o_keep = o_spec + NE, o_par = o_keep + NE, o_rope = o_par + NE,
           o_blk = o_rope + (mm ? 3 * (size_t)T : 0);
    size_t nb = 0, ntile = 0;
    for (int i = 0; i < NE; i++) nb += (size_t)(e[i].seq_len + e[i].n + 15) / 16;
    /* a prefill chunk in the batch: attention by tiles of rows sharing K/V loads */
    int tiled = f->tiles_ok && max_n >= CU_ATTN_TILE;
    if (tiled)
        for (int i = 0; i < NE; i++) ntile += (size_t)(e[i].n + f->attn_rows - 1) / f->attn_rows;
    size_t o_tile = o_blk + nb;
    *o_hrow_out = o_tile + ntile;
    size_t o_hrow = *o_hrow_out;
    size_t o_ast = o_hrow + nh, n_meta = o_ast + (astart ? (size_t)NE : 0);
    cu_attn_split split = {0};
    if (tiled && f->attn_split && f->attn_tc && !astart) {
        /* the tiles of entries with few rows behind long contexts split over keys (cu_attn_tc_split: a
         * function of the entry alone); lists: e_span [NE], row_poff [T], mrows, work [][2] */
        const model *m = f->m;
        size_t o_es = n_meta, o_rp = o_es + NE, o_mr = o_rp + T, o_wk = o_mr + T, nw = 0, nm = 0, np = 0;
        for (int i = 0, r = 0; i < NE; r += e[i].n, i++) {
            int ns = 1, L = e[i].seq_len + e[i].n,
                span = cu_attn_tc_split(m->Hq, m->Hkv, m->hd, e[i].n, L, f->attn_split, &ns);
            if (o_wk + 2 * (nw + (size_t)(e[i].n + f->attn_rows - 1) / f->attn_rows * ns) > f->meta_cap)
                span = 0; /* past the metadata bound (never at ATTN_SPLIT_WORK per entry) */
            h[o_es + i] = span;
            for (int t = 0; t < e[i].n; t += f->attn_rows) {
                int last = e[i].seq_len + (t + f->attn_rows < e[i].n ? t + f->attn_rows : e[i].n) - 1;
                for (int sp = 0; sp == 0 || (span && sp * span <= last); sp++)
                    h[o_wk + 2 * nw] = r + t, h[o_wk + 2 * nw + 1] = sp, nw++;
            }
            for (int t = 0; t < e[i].n; t++) {
                int nsr = span ? (e[i].seq_len + t) / span + 1 : 1;
                h[o_rp + r + t] = (int)np;
                if (nsr > 1) h[o_mr + nm++] = r + t, np += (size_t)nsr;
            }
        }
        if (nw > ntile) { /* some entry split */
            size_t need = np * (size_t)m->Hq * (size_t)(m->hd + 2);
            if (need > f->apart_floats) {
                cu_free(f->apart); /* synchronises: no launch still reads the old one */
                f->apart = NULL, f->apart_floats = 0;
                int rc = cu_alloc((void **)&f->apart, need * sizeof(float), err, errlen);
                if (rc) return rc;
                f->apart_floats = need;
            }
            int *d = f->meta;
            split = (cu_attn_split){d + o_wk, d + o_es, d + o_rp, d + o_mr, f->apart, (int)nw, (int)nm};
            n_meta = o_wk + 2 * nw;
        }
    }
    if (n_meta > f->meta_cap)
        return ci_err(err, errlen, CINFER_ERANGE, "cuda: block tables exceed the metadata buffer");
    for (int i = 0; astart && i < NE; i++) h[o_ast + i] = e[i].attn_start;
    int r = 0, li = 0, ti = 0, hi = 0;
    size_t bo = 0;
    for (int i = 0; i < NE; i++) {
        h[o_len + i] = e[i].seq_len;
        h[o_n + i] = e[i].n;
        h[o_r0 + i] = r;
        h[o_slot + i] = e[i].slot;
        h[o_boff + i] = (int)bo;
        h[o_spec + i] = e[i].spec_rec != NULL;
        h[o_keep + i] = keep ? keep[i] : 0;
        h[o_par + i] = par ? par[i] : 0;
        int nbi = (e[i].seq_len + e[i].n + 15) / 16;
        memcpy(h + o_blk + bo, e[i].blocks, (size_t)nbi * sizeof(int));
        bo += (size_t)nbi;
        for (int t = 0; t < e[i].n; t++, r++) {
            if (tiled && t % f->attn_rows == 0) h[o_tile + ti++] = r;
            h[o_ids + r] = e[i].tokens[t];
            h[o_pos + r] = e[i].seq_len + t;
            h[o_ent + r] = i;
            int lm = lmode ? lmode[i] : e[i].all_logits ? 2 : 1;
            if (lm == 2 || (lm == 1 && t == e[i].n - 1)) h[o_lrow + li++] = r;
            if (e[i].hidden) h[o_hrow + hi++] = r;
            if (mm) {
                int *rr = h + o_rope + 3 * (size_t)r;
                if (e[i].rope_pos && t < e[i].mm_n)
                    for (int k = 0; k < 3; k++) rr[k] = e[i].rope_pos[(size_t)k * e[i].rope_stride + t];
                else
                    rr[0] = rr[1] = rr[2] = e[i].seq_len + t + e[i].rope_delta;
            }
        }
    }
    int *d = f->meta;
    *rs = (run_shape){T,
                      NE,
                      nl,
                      0,
                      0,
                      has_spec,
                      0,
                      tiled ? d + o_tile : NULL,
                      (int)ntile,
                      {d + o_ids, d + o_pos, d + o_ent, d + o_len, d + o_n, d + o_r0, d + o_slot, d + o_boff,
                       d + o_lrow, d + o_blk, d + o_spec, d + o_keep, d + o_par}};
    rs->rope3 = mm ? d + o_rope : NULL;
    rs->mm_e = mm_rows ? e : NULL;
    rs->mm_ne = NE;
    rs->meta.e_astart = astart ? d + o_ast : NULL;
    rs->split = split;
    rs->max_nb = (maxpos + 1 + 15) / 16;
    int minpos = maxpos;
    for (int i = 0; i < NE; i++) minpos = e[i].seq_len < minpos ? e[i].seq_len : minpos;
    attn_split(f, T, minpos, maxpos, rs);
    cu_h2d_async(f->cu, f->meta, h, n_meta * sizeof(int));
    return 0;
}

/* 1 when key was met before (the seen list, LRU); else remembers it and returns 0: a shape is captured the
 * second time it comes, so shapes a run meets once never pay a capture */
static int seen_before(cuda_fwd *f, const graph_ent *key) {
    for (int i = 0; i < f->n_seen; i++) {
        const graph_ent *q = &f->seen[i];
        if (graph_key_eq(q, key)) return 1;
    }
    if (f->n_seen == (int)(sizeof f->seen / sizeof f->seen[0])) {
        memmove(f->seen, f->seen + 1, sizeof f->seen - sizeof f->seen[0]);
        f->n_seen--;
    }
    f->seen[f->n_seen++] = *key;
    return 0;
}

/* a slot of the graph table for a new graph: the next free one, or the least recently replayed (destroyed) */
static int graph_slot(cuda_fwd *f) {
    int slot = f->n_graphs;
    if (slot == MAX_GRAPHS) {
        slot = 0;
        for (int i = 1; i < f->n_graphs; i++)
            if (f->graphs[i].used < f->graphs[slot].used) slot = i;
        cu_graph_destroy(f->graphs[slot].exec);
    }
    return slot;
}

/* CINFER_TTFT_TRACE: one call's line (host ms: metadata packed, launched / captured, waited; device ms from
 * its start to end event) and, when it recorded marks, device and host ms by phase and its slowest launch on
 * the host (a first-time cost: a library's per-shape selection or a module load blocks the host there) */
static void trace_call(cuda_fwd *f, int T, int NE, int nl, int maxpos, const char *mode, double t0,
                       double t_pack, double t_cap, double t_launch) {
    double t_end = host_ms();
    fprintf(
        stderr,
        "ttft-trace fwd T=%d NE=%d nl=%d maxpos=%d %s: host pack %.3f launch %.3f (capture %.3f) wait %.3f "
        "total %.3f ms; device %.3f ms\n",
        T, NE, nl, maxpos, mode, t_pack - t0, t_launch - t_pack, t_cap, t_end - t_launch, t_end - t0,
        cu_timer_between_ms(f->tr_ev[0], f->tr_ev[1]));
    if (!f->marking) return;
    double dev[CP_N] = {0}, host[CP_N] = {0}, worst = 0;
    int worst_i = -1;
    for (int i = 0; i + 1 < f->n_marks; i++) {
        int ph = f->mark_phase[i];
        if (ph < 0) continue;
        double h = f->mark_host[i + 1] - f->mark_host[i];
        dev[ph] += cu_timer_between_ms(f->marks[i], f->marks[i + 1]);
        host[ph] += h;
        if (h > worst) worst = h, worst_i = i;
    }
    fprintf(stderr, "ttft-trace   phases device/host ms:");
    for (int p = 0; p < CP_N; p++)
        if (dev[p] > 0 || host[p] > 0)
            fprintf(stderr, " [%s %.3f/%.3f]", cuda_phase_names[p], dev[p], host[p]);
    if (worst_i >= 0)
        fprintf(stderr, "; slowest host launch: mark %d of %d (%s) %.3f ms", worst_i, f->n_marks,
                cuda_phase_names[f->mark_phase[worst_i]], worst);
    fprintf(stderr, "\n");
    f->marking = 0;
    if (!f->profile) f->n_marks = 0;
}

/* sync 0: returns with the step still running (cuda_fwd_run_sample's sample waits for it) */
static int fwd_run(cuda_fwd *f, const fwd_entry *e, int NE, float *logits, int sync, char *err,
                   size_t errlen) {
    const model *m = f->m;
    int T = 0, nl = 0, maxpos = 0, all_decode = 1, max_n = 0, has_spec = 0, nh = 0, mm = 0, mm_rows = 0,
        any_chunked = 0, all_chunked = 1;
    for (int i = 0; i < NE; i++) {
        /* a prompt with images: its own rotary positions, and feature rows in place of embeddings */
        if (e[i].rope_pos || e[i].rope_delta) mm = 1;
        if (e[i].embeds && e[i].mm_n > 0) mm_rows = 1;
        if (e[i].spec_rec && (e[i].n > f->p.spec_window || (m->n_lin > 0 && !f->spec_rec)))
            return ci_err(err, errlen, CINFER_EINVAL,
                          "cuda: a speculative window of %d tokens (spec_window %d)", e[i].n,
                          f->p.spec_window);
        if (e[i].attn_start)
            return ci_err(err, errlen, CINFER_EUNSUPPORTED,
                          "cuda: attention from a later start (attn_start)");
        T += e[i].n;
        nl += e[i].all_logits ? e[i].n : 1;
        if (e[i].hidden) nh += e[i].n;
        if (e[i].spec_rec) has_spec = 1;
        if (!e[i].spec_rec && !(e[i].n == 1 && e[i].seq_len > 0))
            any_chunked = 1;
        else
            all_chunked = 0;
        if (e[i].seq_len + e[i].n - 1 > maxpos) maxpos = e[i].seq_len + e[i].n - 1;
        /* graphs hold decode entries and speculative windows (no prefill: its tiles and chunk shapes vary) */
        if (!(e[i].n == 1 && !e[i].all_logits && !e[i].spec_rec) && !(e[i].spec_rec && f->verify_graphs))
            all_decode = 0;
        if (e[i].n > max_n) max_n = e[i].n;
    }
    if (T > f->p.max_tokens || NE > f->p.max_tokens)
        return ci_err(err, errlen, CINFER_ERANGE, "cuda: batch of %d tokens exceeds %d", T, f->p.max_tokens);
    run_shape rs;
    size_t o_hrow;
    double tr0 = f->trace ? host_ms() : 0, tr_pack = 0, tr_cap = 0;
    const char *tr_mode = "eager";
    if (f->trace) cu_timer_start(f->cu, f->tr_ev[0]);
    /* deferred commits (spec_fuse): an entry whose kernels replay its slot's kept tokens (a decode token or a
     * window: recurrent_kernel) takes them in e_keep; any other use of the slot gets them committed first,
     * and so does every entry of a step whose conv is not conv_kernel: a step of decode tokens only under
     * the fused DeltaNet decode kernel (cu_gdn_args.dec_cnt; the default, CINFER_CUDA_GDN_FUSED) or one with
     * prefill rows under the phased prefill (gdn_tc 2: conv_rows_kernel) */
    int gdn_fused = f->gdn_cnt && !has_spec && !any_chunked;
    int conv_replays = !gdn_fused && !(f->gdn_tc == 2 && any_chunked);
    for (int i = 0; i < NE && f->spec_fuse; i++) {
        int s = e[i].slot, replays = conv_replays && (e[i].spec_rec || (e[i].n == 1 && e[i].seq_len > 0));
        if (!replays) spec_flush(f, s);
        f->h_keep[i] = f->pend_keep[s];
        f->h_par[i] = f->rec_par[s] ^ 1;
        f->pend_keep[s] = 0;
        if (e[i].spec_rec) f->rec_par[s] ^= 1;
    }
    int rc =
        pack_meta(f, e, NE, NULL, T, nl, nh, max_n, maxpos, has_spec, mm, mm_rows, 0,
                  f->spec_fuse ? f->h_keep : NULL, f->spec_fuse ? f->h_par : NULL, &rs, &o_hrow, err, errlen);
    if (rc) {
        for (int i = 0; i < NE && f->spec_fuse; i++) { /* nothing ran: the commits stay pending */
            if (e[i].spec_rec) f->rec_par[e[i].slot] ^= 1;
            if (f->h_keep[i]) f->pend_keep[e[i].slot] = f->h_keep[i];
        }
        return rc;
    }
    rs.no_chunked = !any_chunked, rs.gdn_fused = gdn_fused, rs.all_chunked = all_chunked && any_chunked;
    if (f->trace) tr_pack = host_ms();
    int *d = f->meta;
    /* MoE decode without the host (graph-capturable): every (row, choice) slot through the indexed GEMV; past
     * 64 rows the experts are grouped on the host and run as GEMMs */
    int moe_device = T <= 64;
    int use_graph = all_decode && max_n < CU_ATTN_TILE && !mm_rows && !f->profile && !f->p.no_graphs &&
                    (m->cfg.n_experts == 0 || moe_device);
    graph_ent *g = NULL, key = {NE, T, nl,   has_spec, rs.no_chunked, rs.span,   rs.nsplit,
                                mm, 0, NULL, rs.acls,  rs.dspan,      rs.dnsplit};
    for (int i = 0; use_graph && i < f->n_graphs; i++)
        if (graph_key_eq(&f->graphs[i], &key)) g = &f->graphs[i];
    if (use_graph && !g && has_spec && !seen_before(f, &key)) use_graph = 0; /* a verify shape: eager once */
    graph_ent *sib = NULL;
    for (int i = 0; use_graph && !g && f->graph_update && i < f->n_graphs; i++) {
        const graph_ent *q = &f->graphs[i];
        if (q->B == NE && q->T == T && q->nl == nl && q->spec == has_spec && q->nochunk == rs.no_chunked &&
            q->mm == mm && q->acls == rs.acls) /* the same launches (a class pattern makes its own) */
            sib = &f->graphs[i];
    }
    if (use_graph && sib) {
        /* the same launches but for the attention's split: captured, then the sibling's graph updated to it
         */
        tr_mode = "update";
        if ((rc = cu_capture_begin(f->cu, err, errlen))) return rc;
        int rc2 = enqueue(f, &rs, moe_device, err, errlen);
        void *exec = NULL;
        rc = cu_capture_end_update(f->cu, rc2 ? NULL : sib->exec, &exec, err, errlen);
        if (rc2 || rc) {
            if (exec != sib->exec) cu_graph_destroy(exec);
            return rc2 ? rc2 : rc;
        }
        if (exec != sib->exec)
            cu_graph_destroy(sib->exec), f->n_captures++;
        else
            f->n_updates++;
        *sib = key;
        sib->exec = exec;
        g = sib;
        if (f->trace) tr_cap = host_ms() - tr_pack;
    }
    if (use_graph) {
        if (!g) {
            int slot = graph_slot(f);
            /* the metadata offsets depend only on the key (NE, T, nl, mm): see pack_meta */
            if ((rc = cu_capture_begin(f->cu, err, errlen))) return rc;
            int rc2 = enqueue(f, &rs, moe_device, err, errlen);
            void *exec = NULL;
            rc = cu_capture_end(f->cu, &exec, err, errlen);
            if (rc2 || rc) { /* an evicted slot's graph is gone: close the gap */
                cu_graph_destroy(exec);
                if (slot < f->n_graphs) f->graphs[slot] = f->graphs[--f->n_graphs];
                return rc2 ? rc2 : rc;
            }
            if (slot == f->n_graphs) f->n_graphs++;
            g = &f->graphs[slot];
            *g = key;
            g->exec = exec;
            f->n_captures++;
            tr_mode = "capture";
            if (f->trace) tr_cap = host_ms() - tr_pack;
        } else if (strcmp(tr_mode, "update")) {
            tr_mode = "replay";
        }
        g->used = ++f->graph_clock;
        if ((rc = cu_graph_launch(f->cu, g->exec, err, errlen))) return rc;
        if (f->diag_ab && !strcmp(tr_mode, "replay") && T == NE && NE <= 64 && !has_spec &&
            !(f->diag_done >> (NE - 1) & 1)) {
            f->diag_done |= 1ull << (NE - 1);
            diag_ab(f, &rs, moe_device);
        }
    } else {
        f->n_marks = 0;
        int pdl_was = 0;
        if (f->trace >= 2 && !f->profile && T > 1) {
            f->marking = 1;
            if ((pdl_was = cu_pdl_on())) cu_set_pdl(0);
        }
        rc = enqueue(f, &rs, moe_device, err, errlen);
        if (pdl_was) cu_set_pdl(1);
        if (rc) {
            f->marking = 0;
            return rc;
        }
    }
    if (nh) {
        /* the final-normed rows of the entries that asked (the MTP head's input): the lm_head rows' kernel on
         * other rows, so a row present in both has the same bits; f->out is free once the last residual is in
         */
        cu_gather_rmsnorm(f->cu, f->out, f->x, d + o_hrow, f->final_norm, nh, m->H,
                          (float)m->cfg.rms_norm_eps);
        for (int i = 0, h0 = 0; i < NE; i++)
            if (e[i].hidden) {
                cu_d2h_async(f->cu, e[i].hidden, f->out + (size_t)h0 * m->H,
                             (size_t)e[i].n * m->H * sizeof(float));
                h0 += e[i].n;
            }
    }
    mark(f, CP_COPY_OUT);
    f->last_nl = nl;
    if (logits) cu_d2h_async(f->cu, logits, f->logits, (size_t)nl * m->V * sizeof(float));
    if ((f->profile || f->marking) && f->n_marks < PROF_MAX_MARKS) {
        if (f->marking) f->mark_host[f->n_marks] = host_ms();
        cu_timer_start(f->cu, f->marks[f->n_marks]);
        f->mark_phase[f->n_marks++] = -1;
    }
    if (f->trace) cu_timer_start(f->cu, f->tr_ev[1]);
    double tr_launch = f->trace ? host_ms() : 0;
    if (!sync && !f->profile && !f->trace) return 0;
    if ((rc = cu_sync(f->cu, err, errlen))) {
        f->marking = 0;
        return rc;
    }
    if (f->trace) trace_call(f, T, NE, nl, maxpos, tr_mode, tr0, tr_pack, tr_cap, tr_launch);
    if (f->profile) {
        /* each mark's phase runs until the next mark */
        for (int i = 0; i + 1 < f->n_marks; i++) {
            float ms = cu_timer_between_ms(f->marks[i], f->marks[i + 1]);
            if (f->mark_phase[i] >= 0) f->prof_ms[f->mark_phase[i]] += ms;
        }
        f->prof_calls++;
        f->n_marks = 0;
    }
    return 0;
}

/* The GEMM warm-up (CINFER_CUDA_WARMUP, default "gemm"): every weight shape's product at the row counts
 * CINFER_CUDA_GEMM_PAD rounds to (16, 32, 48, 64 stacked; with the pad on, 128 to WARM_MAX_ROWS in steps of
 * 64), once at creation on the scratch buffers, so that cuBLAS's per-shape choice (5-17 ms each the first
 * time in a process on the H200) happens here and not inside the first request that runs such a step (a
 * resumed turn's suffix, a batch of 9+ decode rows). The lm_head only up to 64 rows (more is a rare
 * all-logits prefill). */
#define WARM_MAX_ROWS      512
/* one product of every distinct weight shape at M rows: a DeltaNet and an attention layer's in_proj /
 * out_proj, the dense FFN's gate_up / down, the shared expert's; gu16: gate_up's bf16-out form too (precision
 * fast) */
static void warm_shapes(cuda_fwd *f, int M, int gu16) {
    const model *m = f->m;
    int H = m->H, I = m->cfg.intermediate_size;
    for (int l = 0, lin = 0, full = 0, ffn = 0, moe = 0; l < m->L; l++) {
        const cu_layer *cl = &f->L[l];
        const layer_weights *lw = &m->layers[l];
        int is_lin = lw->type == LAYER_LINEAR;
        if (is_lin ? !lin : !full) {
            gemm(f, f->proj, f->xn, cl->w_in, M, cl->n_in, H);
            gemm(f, f->out, f->act, cl->w_out, M, H, is_lin ? m->Hv * m->dv : m->Hq * m->hd);
            lin |= is_lin, full |= !is_lin;
        }
        if (!lw->moe && !ffn && I > 0) {
            gemm(f, f->proj, f->xn, cl->w_gu, M, 2 * I, H);
            if (gu16) cu_gemm_presplit_out16(f->cu, (uint16_t *)f->proj, f->xb, cl->w_gu, 2 * I, H, M);
            gemm(f, f->out, f->act, cl->w_down, M, H, I);
            ffn = 1;
        }
        if (lw->moe && !moe && cl->sh_gu) {
            int Is = m->cfg.shared_expert_intermediate_size;
            gemm(f, f->proj, f->xn, cl->sh_gu, M, 2 * Is, H);
            gemm(f, f->shy, f->act, cl->sh_down, M, H, Is);
            moe = 1;
        }
    }
}
static int warm_gemms(cuda_fwd *f, char *err, size_t errlen) {
    const model *m = f->m;
    int H = m->H, top = cu_gemm_pad() ? WARM_MAX_ROWS : 64;
    double t0 = host_ms();
    for (int M = CU_GEMM_PAD_ROWS; M <= top && M <= f->p.max_tokens;
         M += M < 64 ? CU_GEMM_PAD_ROWS : CU_GEMM_PAD_BIG) {
        if (M > f->p.max_tokens) break;
        warm_shapes(f, M, 0);
        if (M <= 64) gemm(f, f->logits, f->xn, f->lm_head, M, m->V, H);
    }
    /* CINFER_CUDA_LT_TUNE in fast mode: the full chunk's shapes timed here, at creation, not in the first
     * long prefill (gemm.cu's lt_gemm: once per shape class in the process) */
    if (cu_lt_tune() && f->fast && f->p.max_tokens >= CU_LT_MIN_ROWS)
        warm_shapes(f, f->p.max_tokens, f->gu16);
    int rc = cu_sync(f->cu, err, errlen);
    if (f->trace) fprintf(stderr, "ttft-trace gemm warm-up: %.3f ms\n", host_ms() - t0);
    return rc;
}

int cuda_fwd_run(cuda_fwd *f, const fwd_entry *e, int NE, float *logits, char *err, size_t errlen) {
    return fwd_run(f, e, NE, logits, 1, err, errlen);
}

/* the device sampler's plan of a call (sample_prepare, below) */
typedef struct sample_plan {
    int n, plain, want_lp;
    size_t np; /* adjusted tokens of the call */
} sample_plan;
static int sample_prepare(cuda_fwd *f, const cuda_sample *rows, int n, int with_lp, sample_plan *sp,
                          char *err, size_t errlen);
static int sample_finish(cuda_fwd *f, const sample_plan *sp, int32_t *ids, float *logprobs, char *err,
                         size_t errlen);
int cuda_fwd_run_sample(cuda_fwd *f, const fwd_entry *e, int NE, const cuda_sample *rows, int n, int32_t *ids,
                        float *logprobs, char *err, size_t errlen) {
    sample_plan sp;
    int rc = fwd_run(f, e, NE, NULL, 0, err, errlen);
    double t0 = f->trace ? host_ms() : 0;
    if (!rc) rc = sample_prepare(f, rows, n, logprobs != NULL, &sp, err, errlen);
    if (f->trace && !rc) fprintf(stderr, "ttft-trace sample %d rows: host %.3f ms\n", n, host_ms() - t0);
    if (!rc) rc = sample_finish(f, &sp, ids, logprobs, err, errlen);
    if (rc) {
        char e2[64]; /* nothing may still run when the caller's next call refills the pinned buffers */
        cu_sync(f->cu, e2, sizeof e2);
    }
    return rc;
}

int cuda_fwd_mtp_init(cuda_fwd *f, int n_blocks, char *err, size_t errlen) {
    const model *m = f->m;
    if (!m->mtp.present) return ci_err(err, errlen, CINFER_EUNSUPPORTED, "the checkpoint has no MTP head");
    if (f->mtp_L) return ci_err(err, errlen, CINFER_ESTATE, "cuda: the MTP head is already on the device");
    if (n_blocks < 1) return ci_err(err, errlen, CINFER_EINVAL, "cuda: an MTP pool of %d blocks", n_blocks);
    /* a seed of its own, so random weights (benches) differ from the main layers' */
    upload_ctx u = {NULL, (size_t)1 << 22, (f->p.seed ? f->p.seed : 1) + 0x9e3779b9ull};
    u.stage = xmalloc(u.stage_elems * sizeof(uint16_t));
    const wmat *fc[1] = {&m->mtp.fc};
    size_t H = (size_t)m->H, T = (size_t)f->p.max_tokens, kvb = (size_t)n_blocks * 16 * m->Hkv * m->hd * 4;
    f->mtp_L = xcalloc(1, sizeof(cu_layer));
    int rc;
    if ((rc = upload_cat(f, &u, &f->mtp_fc, fc, 1, NULL, err, errlen)) ||
        (rc = upload_vec(f, &f->mtp_norm_e, m->mtp.pre_fc_norm_embedding, H, err, errlen)) ||
        (rc = upload_vec(f, &f->mtp_norm_h, m->mtp.pre_fc_norm_hidden, H, err, errlen)) ||
        (rc = upload_vec(f, &f->mtp_norm, m->mtp.norm, H, err, errlen)) ||
        (rc = upload_layer(f, &u, f->mtp_L, &m->mtp.layer, -1, err, errlen)) ||
        (rc = dev_alloc(f, (void **)&f->mtp_kpool, kvb, &f->bytes_pools, err, errlen)) ||
        (rc = dev_alloc(f, (void **)&f->mtp_vpool, kvb, &f->bytes_pools, err, errlen)) ||
        (rc = dev_alloc(f, (void **)&f->mtp_cat, T * 2 * H * 4, &f->bytes_scratch, err, errlen)) ||
        (rc = dev_alloc(f, (void **)&f->mtp_hin, T * H * 4, &f->bytes_scratch, err, errlen)) ||
        (rc = cu_sync(f->cu, err, errlen))) {
        free(u.stage);
        free(f->mtp_L);
        f->mtp_L = NULL; /* what was allocated stays in f->allocs until destroy */
        return rc;
    }
    free(u.stage);
    f->mtp_lmode = xmalloc(T * sizeof(int));
    f->mtp_blocks = n_blocks;
    return 0;
}

/* the MTP head's launches from its hidden rows (f->mtp_hin) to its logits rows (f->logits) and normed
 * output rows (f->xn); the host's copies stay outside, so that a graph can hold these */
static int mtp_enqueue(cuda_fwd *f, const run_shape *rs, int nl, int n_vocab, char *err, size_t errlen) {
    const model *m = f->m;
    int T = rs->T, H = m->H, rc;
    float eps = (float)m->cfg.rms_norm_eps;
    pdl_step(f, rs);
    /* u = fc([rmsnorm(embed(x_{t+1})) | rmsnorm(hh_t)]) (spec §5: the embedding first) */
    cu_embed(f->cu, f->x, f->embed, rs->meta.ids, T, H);
    cu_add_rmsnorm(f->cu, f->x, NULL, f->xn, f->mtp_norm_e, T, H, eps);
    cu_add_rmsnorm(f->cu, f->mtp_hin, NULL, f->out, f->mtp_norm_h, T, H, eps);
    cu_concat_rows(f->cu, f->mtp_cat, f->xn, f->out, T, H);
    gemm(f, f->x, f->mtp_cat, f->mtp_fc, T, H, 2 * H);
    /* the decoder layer on its own KV pool, as a full-attention layer of the model */
    const cu_layer *cl = f->mtp_L;
    const layer_weights *lw = &m->mtp.layer;
    cu_add_rmsnorm(f->cu, f->x, NULL, f->xn, cl->in_norm, T, H, eps);
    attention(f, cl, 0, rs, f->mtp_kpool, f->mtp_vpool, f->mtp_blocks, 0, 0);
    cu_add_rmsnorm(f->cu, f->x, f->out, f->xn, cl->post_norm, T, H, eps);
    if (lw->moe) {
        int added;
        if ((rc = moe(f, cl, rs, T <= 64, 0, NULL, &added, err, errlen))) return rc;
    } else {
        mlp(f, f->out, f->xn, cl->w_gu, cl->w_down, T, m->cfg.intermediate_size);
    }
    cu_add(f->cu, f->x, f->out, T, H);
    /* every row after mtp.norm (the next chained step's input), and the logits rows from the same kernel on
     * the same rows, so the two agree bit for bit; a draft vocabulary is a prefix of lm_head's rows */
    cu_add_rmsnorm(f->cu, f->x, NULL, f->xn, f->mtp_norm, T, H, eps);
    if (nl) {
        cu_gather_rmsnorm(f->cu, f->out, f->x, rs->meta.lrow, f->mtp_norm, nl, H, eps);
        gemm(f, f->logits, f->out, f->lm_head, nl, n_vocab, H);
    }
    return 0;
}

static int mtp_run(cuda_fwd *f, const fwd_entry *e, const mtp_io *io, int NE, int n_vocab, float *logits,
                   int32_t *ids, char *err, size_t errlen) {
    const model *m = f->m;
    if (!f->mtp_L) return ci_err(err, errlen, CINFER_ESTATE, "cuda: the MTP head is not initialised");
    int T = 0, nl = 0, maxpos = 0, max_n = 0, *lmode = f->mtp_lmode, astart = 0;
    if (NE > f->p.max_tokens) return ci_err(err, errlen, CINFER_ERANGE, "cuda: %d MTP entries", NE);
    for (int i = 0; i < NE; i++) {
        /* a head that starts mid-sequence (a prompt resumed from the prefix cache) attends from there only */
        if (e[i].attn_start < 0 || e[i].attn_start > e[i].seq_len)
            return ci_err(err, errlen, CINFER_EINVAL, "cuda: MTP entry %d starts attention at %d of %d", i,
                          e[i].attn_start, e[i].seq_len);
        if (e[i].attn_start) astart = 1;
        lmode[i] = io[i].logits;
        T += e[i].n;
        nl += io[i].logits == 2 ? e[i].n : io[i].logits ? 1 : 0;
        if (e[i].seq_len + e[i].n - 1 > maxpos) maxpos = e[i].seq_len + e[i].n - 1;
        if (e[i].n > max_n) max_n = e[i].n;
    }
    if (T > f->p.max_tokens)
        return ci_err(err, errlen, CINFER_ERANGE, "cuda: MTP batch of %d rows exceeds %d", T,
                      f->p.max_tokens);
    if (n_vocab < 1 || n_vocab > m->V) n_vocab = m->V;
    run_shape rs;
    size_t o_hrow;
    int rc = pack_meta(f, e, NE, lmode, T, nl, 0, max_n, maxpos, 0, 0, 0, astart, NULL, NULL, &rs, &o_hrow,
                       err, errlen);
    if (rc) return rc;
    if (astart) {
        /* the start is honoured by the untiled kernel on one split: every position of a row in one block */
        rs.tiles = NULL, rs.n_tiles = 0, rs.nsplit = 1;
        rs.span = maxpos + 1;
        if (rs.acls & 2) rs.dnsplit = 1, rs.dspan = maxpos + 1;
    }
    int H = m->H;
    for (int i = 0, r0 = 0; i < NE; r0 += e[i].n, i++)
        cu_h2d_async(f->cu, f->mtp_hin + (size_t)r0 * H, io[i].hidden, (size_t)e[i].n * H * sizeof(float));
    /* CINFER_CUDA_MTP_GRAPHS=1: the head's launches from a graph per (entries, rows, logits rows, attention
     * split, draft vocabulary), met twice before it is captured (the chained rows repeat; the catch-up rows
     * of a step vary); not for a head resumed mid-sequence (its attention span follows the positions) */
    int use_graph = f->mtp_graphs && !astart && T <= 64 && !f->profile && !f->p.no_graphs;
    graph_ent key = {NE, T, nl, 0, 0, rs.span, rs.nsplit, -n_vocab, 0, NULL, rs.acls, rs.dspan, rs.dnsplit},
              *g = NULL;
    for (int i = 0; use_graph && i < f->n_graphs; i++)
        if (graph_key_eq(&f->graphs[i], &key)) g = &f->graphs[i];
    if (use_graph && !g && !seen_before(f, &key)) use_graph = 0;
    if (use_graph && !g) {
        int slot = graph_slot(f);
        if ((rc = cu_capture_begin(f->cu, err, errlen))) return rc;
        int rc2 = mtp_enqueue(f, &rs, nl, n_vocab, err, errlen);
        void *exec = NULL;
        rc = cu_capture_end(f->cu, &exec, err, errlen);
        if (rc2 || rc) {
            cu_graph_destroy(exec);
            if (slot < f->n_graphs) f->graphs[slot] = f->graphs[--f->n_graphs];
            return rc2 ? rc2 : rc;
        }
        if (slot == f->n_graphs) f->n_graphs++;
        g = &f->graphs[slot];
        *g = key;
        g->exec = exec;
        f->n_captures++;
    }
    if (g) {
        g->used = ++f->graph_clock;
        if ((rc = cu_graph_launch(f->cu, g->exec, err, errlen))) return rc;
    } else if ((rc = mtp_enqueue(f, &rs, nl, n_vocab, err, errlen))) {
        return rc;
    }
    for (int i = 0, r0 = 0; i < NE; r0 += e[i].n, i++)
        if (io[i].hidden_out)
            cu_d2h_async(f->cu, io[i].hidden_out, f->xn + (size_t)r0 * H, (size_t)e[i].n * H * sizeof(float));
    if (nl) {
        if (logits) cu_d2h_async(f->cu, logits, f->logits, (size_t)nl * n_vocab * sizeof(float));
        if (ids) { /* greedy rows: cuda_fwd_sample's argmax over the head's n_vocab columns */
            cu_argmax(f->cu, f->logits, n_vocab, nl, f->d_ids, f->d_am_part, f->d_am_cnt);
            cu_d2h_async(f->cu, f->h_ids, f->d_ids, (size_t)nl * 4);
        }
    }
    f->last_nl = 0; /* the device rows are the head's now, not a forward's */
    if ((rc = cu_sync(f->cu, err, errlen))) return rc;
    for (int r = 0; ids && r < nl; r++) ids[r] = f->h_ids[r];
    return 0;
}

int cuda_fwd_mtp_run(cuda_fwd *f, const fwd_entry *e, const mtp_io *io, int NE, int n_vocab, float *logits,
                     char *err, size_t errlen) {
    return mtp_run(f, e, io, NE, n_vocab, logits, NULL, err, errlen);
}
int cuda_fwd_mtp_run_ids(cuda_fwd *f, const fwd_entry *e, const mtp_io *io, int NE, int n_vocab, int32_t *ids,
                         char *err, size_t errlen) {
    return mtp_run(f, e, io, NE, n_vocab, NULL, ids, err, errlen);
}

int cuda_fwd_spec_commit(cuda_fwd *f, int slot, int n_keep, char *err, size_t errlen) {
    const model *m = f->m;
    if (slot < 0 || slot >= f->p.n_slots || n_keep < 0 || n_keep > f->p.spec_window)
        return ci_err(err, errlen, CINFER_EINVAL, "cuda_fwd_spec_commit: slot %d, keep %d (window %d)", slot,
                      n_keep, f->p.spec_window);
    if (f->spec_fuse) {
        /* deferred: the slot's next step replays them (cuda_fwd_run), or spec_flush before another use */
        f->pend_keep[slot] = n_keep;
        return 0;
    }
    if (m->n_lin > 0 && n_keep > 0)
        cu_gdn_spec_commit(f->cu, f->conv_state, f->rec_state, f->spec_rec, slot, n_keep, m->n_lin,
                           f->p.spec_window, m->Hk, m->Hv, m->dk, m->dv, m->K, m->C);
    return 0;
}

size_t cuda_fwd_state_floats(const cuda_fwd *f) {
    const model *m = f->m;
    return (size_t)m->n_lin * ((size_t)(m->K - 1) * m->C + (size_t)m->Hv * m->dk * m->dv);
}

/* one slot's conv windows and its S are each contiguous in the device pools: two copies either way */
static int state_copy(cuda_fwd *f, int slot, float *dst, const float *src, char *err, size_t errlen) {
    const model *m = f->m;
    if (slot < 0 || slot >= f->p.n_slots)
        return ci_err(err, errlen, CINFER_EINVAL, "slot %d out of range", slot);
    if (m->n_lin <= 0) return 0;
    size_t cs = (size_t)m->n_lin * (size_t)(m->K - 1) * m->C,
           rs = (size_t)m->n_lin * (size_t)m->Hv * m->dk * m->dv;
    float *dc = f->conv_state + (size_t)slot * cs, *dr = f->rec_state + (size_t)slot * rs;
    if (dst)
        spec_flush(f, slot); /* the state as committed */
    else
        f->pend_keep[slot] = 0; /* replaced whole */
    /* dst / src in host memory (pinned: DMA over the link) or, for the prefix cache's device store, in device
     * memory (a copy on the device): unified addressing picks the direction */
    if (dst) {
        cu_copy_async(f->cu, dst, dc, cs * 4);
        cu_copy_async(f->cu, dst + cs, dr, rs * 4);
    } else {
        cu_copy_async(f->cu, dc, src, cs * 4);
        cu_copy_async(f->cu, dr, src + cs, rs * 4);
    }
    return 0;
}
int cuda_fwd_state_save(cuda_fwd *f, int slot, float *dst, char *err, size_t errlen) {
    return state_copy(f, slot, dst, NULL, err, errlen);
}
int cuda_fwd_state_load(cuda_fwd *f, int slot, const float *src, char *err, size_t errlen) {
    return state_copy(f, slot, NULL, src, err, errlen);
}

int cuda_fwd_kv_copy(cuda_fwd *f, int dst, int src, int rows, char *err, size_t errlen) {
    const model *m = f->m;
    if (dst < 0 || src < 0 || dst >= f->p.n_blocks || src >= f->p.n_blocks || rows < 0 || rows > 16)
        return ci_err(err, errlen, CINFER_EINVAL, "cuda_fwd_kv_copy: blocks %d <- %d, %d rows", dst, src,
                      rows);
    size_t row = (size_t)m->Hkv * m->hd, blk = 16 * row;
    for (int l = 0; l < m->n_full && rows > 0; l++) {
        size_t layer = (size_t)l * f->p.n_blocks * blk;
        cu_d2d_async(f->cu, f->kpool + layer + (size_t)dst * blk, f->kpool + layer + (size_t)src * blk,
                     (size_t)rows * row * 4);
        cu_d2d_async(f->cu, f->vpool + layer + (size_t)dst * blk, f->vpool + layer + (size_t)src * blk,
                     (size_t)rows * row * 4);
    }
    return 0;
}

int cuda_fwd_sync(cuda_fwd *f, char *err, size_t errlen) {
    return cu_sync(f->cu, err, errlen);
}

/* A sampled step's choices, checked and put in the pinned buffer, then uploaded in one copy (rows, then their
 * adjusted tokens) unless every row is plain greedy (cu_argmax then, nothing uploaded). cuda_fwd_run_sample
 * does this once the step is enqueued: the host's part runs beside the step, and the copy goes on the side
 * stream, done long before lm_head, so that it no longer stands between lm_head and the sampler. (Made and
 * copied before the step instead, H200 session 13 call 1: the same at batch 1, but at batch 64 the host's
 * ~37,000 entries held the step back: 6,360 / 6,393 tok/s against greedy's 6,504 / 6,480) */
static int sample_prepare(cuda_fwd *f, const cuda_sample *rows, int n, int with_lp, sample_plan *sp,
                          char *err, size_t errlen) {
    if (n < 1 || n > f->p.max_tokens)
        return ci_err(err, errlen, CINFER_EINVAL, "cuda_fwd_sample: %d rows (at most %d)", n,
                      f->p.max_tokens);
    int V = f->m->V, want_lp = 0, plain = 1;
    size_t np = 0;
    cu_sample_pen *hpen = (cu_sample_pen *)(f->h_smp + n); /* the tokens follow the rows: one upload */
    for (int r = 0; r < n; r++) {
        const cuda_sample *q = &rows[r];
        if (!cuda_sample_eligible(q->temperature, q->top_k, V))
            return ci_err(err, errlen, CINFER_EINVAL,
                          "cuda_fwd_sample: row %d: temperature %g, top_k %d is not "
                          "for the device sampler",
                          r, (double)q->temperature, q->top_k);
        if (q->n_pen < 0 || q->n_pen > CUDA_SAMPLE_MAX_PEN || (q->n_pen && !q->pen))
            return ci_err(err, errlen, CINFER_EINVAL,
                          "cuda_fwd_sample: row %d: %d adjusted tokens (at most %d)", r, q->n_pen,
                          CUDA_SAMPLE_MAX_PEN);
        if (np + (size_t)q->n_pen > CUDA_SAMPLE_PEN_CAP)
            return ci_err(err, errlen, CINFER_ERANGE,
                          "cuda_fwd_sample: more than %d adjusted tokens in one call", CUDA_SAMPLE_PEN_CAP);
        int greedy = q->temperature < CUDA_SAMPLE_GREEDY_TEMP || q->top_k == 1;
        for (int j = 0; j < q->n_pen; j++) {
            const cuda_sample_pen *e = &q->pen[j];
            if (e->token < 0 || e->token >= V)
                return ci_err(err, errlen, CINFER_EINVAL, "cuda_fwd_sample: row %d: adjusted token %d of %d",
                              r, e->token, V);
            hpen[np + (size_t)j] = (cu_sample_pen){e->token, e->flags, e->bias, e->sub};
        }
        f->h_smp[r] = (cu_sample_row){q->u,
                                      greedy ? 0.0f : 1.0f / q->temperature,
                                      greedy ? 1 : q->top_k,
                                      q->logprob && with_lp,
                                      greedy ? 1.0f : q->top_p,
                                      greedy ? 0.0f : q->min_p,
                                      q->repetition_penalty,
                                      (int)np,
                                      q->n_pen};
        np += (size_t)q->n_pen;
        want_lp |= q->logprob && with_lp;
        plain &= greedy && !q->n_pen;
    }
    *sp = (sample_plan){n, plain, want_lp, np};
    /* CINFER_CUDA_SAMPLE_SIDE=0: the copy in order on the step's stream, between lm_head and the sampler
     * (H200 session 13 call 5, 4B chat sampling at batch 1: 2.479-2.487 ms a step against 2.462-2.473) */
    static int side = -1;
    if (side < 0) {
        const char *sv = getenv("CINFER_CUDA_SAMPLE_SIDE");
        side = !(sv && !strcmp(sv, "0"));
    }
    if (!(plain && !want_lp))
        (side ? cu_h2d_side : cu_h2d_async)(f->cu, f->d_smp, f->h_smp,
                                            (size_t)n * sizeof(cu_sample_row) + np * sizeof(cu_sample_pen));
    return 0;
}

/* the planned choice of the last call's first sp->n logits rows, then the one wait */
static int sample_finish(cuda_fwd *f, const sample_plan *sp, int32_t *ids, float *logprobs, char *err,
                         size_t errlen) {
    int V = f->m->V, n = sp->n;
    if (n > f->last_nl)
        return ci_err(err, errlen, CINFER_EINVAL, "cuda_fwd_sample: %d rows, the last call left %d", n,
                      f->last_nl);
    /* greedy rows without adjusted tokens or logprobs (the usual greedy step): the argmax over many blocks;
     * else the sampler kernel (the same greedy ids) */
    if (sp->plain && !sp->want_lp)
        cu_argmax(f->cu, f->logits, V, n, f->d_ids, f->d_am_part, f->d_am_cnt);
    else if (cu_sample(f->cu, f->logits, V, f->d_smp, (const cu_sample_pen *)(f->d_smp + n), n, f->d_ids,
                       f->d_lps, f->d_smp_part, f->d_smp_cnt))
        return ci_err(err, errlen, CINFER_EINVAL, "cuda_fwd_sample: a vocabulary of %d", V);
    cu_d2h_async(f->cu, f->h_ids, f->d_ids, (size_t)n * 4);
    if (sp->want_lp) cu_d2h_async(f->cu, f->h_lps, f->d_lps, (size_t)n * 4);
    int rc = cu_sync(f->cu, err, errlen);
    if (rc) return rc;
    for (int r = 0; r < n; r++) {
        ids[r] = f->h_ids[r];
        if (logprobs) logprobs[r] = f->h_smp[r].logprob ? f->h_lps[r] : 0.0f;
    }
    return 0;
}

int cuda_fwd_sample(cuda_fwd *f, const cuda_sample *rows, int n, int32_t *ids, float *logprobs, char *err,
                    size_t errlen) {
    if (n < 1 || n > f->last_nl)
        return ci_err(err, errlen, CINFER_EINVAL, "cuda_fwd_sample: %d rows, the last call left %d", n,
                      f->last_nl);
    sample_plan sp;
    int rc = sample_prepare(f, rows, n, logprobs != NULL, &sp, err, errlen);
    if (!rc) rc = sample_finish(f, &sp, ids, logprobs, err, errlen);
    if (rc) {
        char e2[64]; /* nothing may still read the pinned buffer when the caller's next call refills it */
        cu_sync(f->cu, e2, sizeof e2);
    }
    return rc;
}

/* pinned when a device takes it, else plain memory; a 64-byte header says which */
void *cuda_host_alloc(size_t bytes, int pin) {
    unsigned char *p = NULL;
    char err[128];
    int pinned = pin && cu_device_count() > 0 && cu_alloc_host((void **)&p, bytes + 64, err, sizeof err) == 0;
    if (!pinned && !(p = malloc(bytes + 64))) return NULL;
    p[0] = (unsigned char)pinned;
    return p + 64;
}
void *cuda_dev_alloc(size_t bytes) {
    void *p = NULL;
    char err[128];
    if (cu_device_count() < 1 || cu_alloc(&p, bytes, err, sizeof err)) return NULL;
    return p;
}
void cuda_dev_free(void *p) {
    cu_free(p);
}
size_t cuda_dev_free_bytes(void) {
    return cu_device_count() > 0 ? cu_mem_free() : 0;
}
void cuda_host_free(void *ptr) {
    if (!ptr) return;
    unsigned char *p = (unsigned char *)ptr - 64;
    if (p[0])
        cu_free_host(p);
    else
        free(p);
}

#endif

/* forward.h — one forward pass of a ragged batch on the CPU: each entry is a run of new tokens of one
 * sequence (prefill chunk or a single decode token) with its own DeltaNet state slot and KV block table.
 * Rows from all entries go through every matmul together (weights stream once per step); the per-sequence
 * parts (conv window, DeltaNet recurrence, attention) run per entry. A row's result never depends on the
 * other rows: the matmul reduces over K in a fixed order and nothing else mixes rows. */
#ifndef CI_FORWARD_H
#define CI_FORWARD_H

#include <stdint.h>

#include "model/qwen35.h"
#include "runtime/kvcache.h"
#include "runtime/state.h"
#include "util/threadpool.h"

#define GDN_CHUNK 64

typedef struct fwd_entry {
    int seq_len;           /* tokens the sequence held before this call = position of its first new token */
    const int32_t *tokens; /* [n] */
    int n;
    int all_logits;        /* logits for every new token, else for the last one only */
    int slot;              /* DeltaNet state slot */
    const int *blocks;     /* KV block table covering positions [0, seq_len + n) */
    float *spec_rec;       /* NULL, or: a speculative window. The DeltaNet state and conv window are left
                              untouched (the recurrence runs on a copy) and each token's position-local inputs
                              are recorded here, [n_lin][max_win][spec_rec_floats], so forward_spec_commit can
                              rebuild the state for any accepted prefix with the same arithmetic as plain decode */
    int spec_max_win;      /* tokens per layer the record holds */
    float *hidden;         /* NULL, or [n][H] f32: each new token's hidden state after the final norm (the
                              lm_head input, which the MTP head reads), the same bits the logits are made from */
    int attn_start;        /* first KV position the attention reads (0; > 0 only for an MTP head whose
                              sequence resumed from the prefix cache and so has no rows before it) */
    /* multimodal (a prompt with images, spec §6.3); all zero for text, which keeps rotary position = position */
    const int32_t *rope_pos; /* NULL, or the rotary positions of the first mm_n new tokens: stream k (t, h, w) of
                                token t at rope_pos[k * rope_stride + t] */
    int mm_n, rope_stride;
    int rope_delta;          /* tokens past those: rotary position = position + rope_delta on all three streams */
    const float *embeds;     /* NULL, or [*, H] f32 vision features */
    const int32_t *embed_row;/* with embeds: [mm_n] the row of embeds that replaces token t's embedding, or -1 */
} fwd_entry;

/* Scratch sized once for max_tokens rows per call and max_ctx positions per sequence. */
typedef struct fwd_scratch {
    int max_tokens, max_ctx, n_threads;
    float *x;          /* [T, H] residual stream */
    float *xn;         /* [T, H] normed input of a sub-layer */
    float *out;        /* [T, H] sub-layer output before the residual add */
    float *proj;       /* [T, Wp] first projection: qkv / qkvz / q+gate, Wp = max of those widths */
    float *z;          /* [T, Hv*dv] DeltaNet output gate (also K|V rows of attention: [T, 2*Hkv*hd]) */
    float *ba;         /* [T, 2*Hv] DeltaNet b then a (beta and g after activation) */
    float *ba_raw;     /* [T, 2*Hv] Qwen3-Next fused ba before the split */
    float *conv;       /* [T, C] conv + SiLU output (q | k | v) */
    float *o;          /* [T, max(Hv*dv, Hq*hd)] DeltaNet / attention output */
    float *ffn_g, *ffn_u; /* [T, max(I, Im, Is)] */
    float *moe_logits; /* [T, E] */
    int *moe_idx;      /* [T, k] */
    float *moe_w;      /* [T, k] */
    int *moe_rows;     /* [T] rows routed to the current expert */
    float *moe_rw;     /* [T] their routing weights */
    float *moe_x;      /* [T, H] gathered rows */
    float *moe_y;      /* [T, H] expert output */
    float *sh_gate;    /* [T] shared expert gate logits */
    float *thr;        /* per-thread scratch: [n_threads][thr_floats] */
    size_t thr_floats;
    float *inv_freq;   /* [rope_dim/2] f32 */
    int *row_pos;      /* [T] position of each row (its KV slot) */
    int *row_rope;     /* [T][3] rotary positions t, h, w of each row (all = row_pos for text) */
    unsigned char *rope_stream; /* [rope_dim/2] the stream (0 t, 1 h, 2 w) each frequency takes its position from */
    int *row_entry;    /* [T] entry of each row */
    float *lrows;      /* [T, H] rows that need logits, normed */
    int *ids;          /* [T] token ids of the rows */
    int *entry_row0;   /* [T] first row of each entry */
    void *block;       /* the one allocation all of the above live in */
} fwd_scratch;

int fwd_scratch_init(fwd_scratch *s, const model *m, int max_tokens, int max_ctx, int n_threads, char *err, size_t errlen);
void fwd_scratch_free(fwd_scratch *s);

/* Runs the batch and writes logits rows ([rows][V] f32, entry order). Entries must be valid: n >= 1,
 * Σ n <= max_tokens, seq_len + n <= max_ctx, blocks allocated; the caller (ctx.c) checks. */
void forward_cpu(const model *m, fwd_scratch *s, kv_pool *kv, state_pool *st, threadpool *tp, const fwd_entry *e,
                 int n_entries, float *logits);

/* Building blocks shared with the MTP head (mtp.c), which runs one more decoder layer on its own rows. */
/* Lays out the batch's rows (ids, positions, entries; s->entry_row0); returns the row count T. */
int fwd_rows_begin(fwd_scratch *s, const fwd_entry *e, int n_entries);
/* s->x[0, T) = the embedding rows of s->ids. */
void fwd_embed_rows(const model *m, fwd_scratch *s, threadpool *tp, int T);
/* y[r] = rmsnorm(x[r]) * w for rows of n floats (w already 1 + w for zero-centred norms). */
void fwd_rmsnorm_rows(threadpool *tp, float *y, const float *x, const float *w, int rows, int n, float eps);
/* One decoder layer in place on s->x[0, T): norm, DeltaNet (state slot lin) or gated attention (KV layer full of
 * kv), residual, norm, MLP or MoE, residual. */
void fwd_decoder_layer(const model *m, fwd_scratch *s, kv_pool *kv, state_pool *st, threadpool *tp, const fwd_entry *e,
                       int n_entries, int T, const layer_weights *lw, int lin, int full);

/* Floats one token of a speculative record takes per linear layer: pre-conv q|k|v (C), post-conv normalised
 * q|k|v (C), beta and g (2 Hv). */
size_t spec_rec_floats(const model *m);
/* Keeps the first n_keep tokens of a speculative window of the sequence in slot: advances its conv window and
 * replays the recurrence for those tokens from the recorded inputs, bit-identical to having decoded them one
 * by one. */
void forward_spec_commit(const model *m, state_pool *st, int slot, const float *rec, int max_win, int n_keep);

/* The two DeltaNet forms, exposed for tests: per value head, state S [dk][dv] updated in place.
 * q, k: rows of dk with stride qs/ks (q already l2-normalised and scaled, k l2-normalised); v: rows of dv
 * with stride vs; g (log decay) and beta per token; o: rows of dv with stride os. */
void gdn_recurrent(int n, const float *q, int qs, const float *k, int ks, const float *v, int vs, const float *g,
                   int gs, const float *beta, int bs, float *S, int dk, int dv, float *o, int os);
/* pos0: the absolute position of the first token (chunks align to multiples of GDN_CHUNK from position 0);
 * tmp: at least gdn_chunk_scratch_floats(dk, dv) floats */
void gdn_chunked(int n, int pos0, const float *q, int qs, const float *k, int ks, const float *v, int vs, const float *g,
                 int gs, const float *beta, int bs, float *S, int dk, int dv, float *o, int os, float *tmp);
size_t gdn_chunk_scratch_floats(int dk, int dv);

#endif

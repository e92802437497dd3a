/* mtp.h — the multi-token-prediction head of Qwen3.5 / Qwen3-Next on the CPU (spec §5): from a token's
 * embedding and the main model's final-normed hidden state at the position before it, one more full-attention
 * decoder layer (its own KV cache) predicts the token after. The engine drafts with it (--spec mtp). */
#ifndef CI_MTP_H
#define CI_MTP_H

#include "model/forward.h"

/* The per-entry inputs and outputs beyond a fwd_entry (whose tokens are x_{t+1}, seq_len the MTP position t
 * of the first row, blocks the head's own block table, attn_start its first row). */
typedef struct mtp_io {
    const float *hidden; /* [n][H] f32: hh_t, the main model's final-normed hidden (or the head's own normed
                            output when chaining drafts) */
    float *hidden_out;   /* NULL, or [n][H] f32: each row after mtp.norm (the next chained step's hh) */
    int logits;          /* 0: no logits rows, 1: the last row's, 2: every row's */
} mtp_io;

/* Floats of the scratch forward_mtp needs besides fwd_scratch: [max_tokens][2H]. */
size_t mtp_scratch_floats(const model *m, int max_tokens);

/* Runs the head over the batch: per row u = fc([rmsnorm1p(embed(x_{t+1})) | rmsnorm1p(hh_t)]), the decoder
 * layer (RoPE and KV row at position t, layer 0 of kv), then rmsnorm1p(u, mtp.norm) · lm_head. Logits rows
 * ([rows][n_vocab] f32: token ids [0, n_vocab), n_vocab <= V) in entry order as io asks. Entries must be
 * valid (ctx.c checks); m->mtp.present. */
void forward_mtp(const model *m, fwd_scratch *s, kv_pool *kv, threadpool *tp, const fwd_entry *e,
                 const mtp_io *io, int n_entries, float *cat, int n_vocab, float *logits);

/* Rows of logits forward_mtp writes for these entries. */
int mtp_logit_rows(const fwd_entry *e, const mtp_io *io, int n_entries);

#endif

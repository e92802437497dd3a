/* ctx_internal.h — what the engine (same library) may ask a context beyond the public API. */
#ifndef CI_CTX_INTERNAL_H
#define CI_CTX_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "cinfer.h"
#include "vision/preprocess.h"

struct model;
struct tokenizer;
struct tmpl;

/* The public model handle: the immutable model plus its text side (both optional: a checkpoint without
 * tokenizer.json still runs on ids). */
struct cinfer_model {
    struct model *m;
    struct tokenizer *tk;     /* NULL without tokenizer.json */
    struct tmpl *tpl;         /* NULL without a chat template */
    char *tpl_src;            /* the template text */
    char *tok_config;         /* tokenizer_config.json text, or NULL */
    vision_pp_config pp;      /* preprocessor_config.json (defaults when absent) */
    char pp_err[256];         /* non-empty: why images cannot be loaded (malformed or mismatched config) */
};

/* cinfer_forward on a cuda context with the tokens chosen on the device (model/forward_cuda.h's
 * cuda_fwd_sample): smp and ids (lps when asked) per logits row, nothing else comes back. */
struct cuda_sample;
int ctx_forward_sample(cinfer_ctx *c, const cinfer_batch_entry *e, int n, const struct cuda_sample *smp,
                       int32_t *ids, float *lps, char *err, size_t errlen);
/* Waits for everything enqueued on the context's device (a commit only enqueues); 0 at once on the CPU. */
int ctx_sync(cinfer_ctx *c, char *err, size_t errlen);
/* cuda: on 1 starts timing each phase of the forward calls (model/forward_cuda.h: profiling runs them eagerly);
 * on 0 stops and gives the device ms per phase since the start ([CP_N]) and the calls. -1 on the CPU. */
int ctx_profile(cinfer_ctx *c, int on, double *ms, int *calls);
/* cuda: CUDA graphs made so far, instantiated / updated in place (model/forward_cuda.h); 0 / 0 on the CPU */
void ctx_graph_stats(const cinfer_ctx *c, int *captured, int *updated);

/* Blocks an admission may count on: free ones plus those only the prefix cache holds. */
int ctx_kv_free_blocks(const cinfer_ctx *c);
int ctx_kv_blocks_per_seq(const cinfer_ctx *c);
/* Prefix cache: the cached length a prompt would resume after (n_shared: blocks mapped by reference) */
int ctx_prefix_peek(const cinfer_ctx *c, const int32_t *tokens, int n, int *n_shared);
/* On a fresh sequence: resume after the longest cached prefix of prompt[0, n_prompt - 1) (KV blocks
 * mapped, state copied). *cached = tokens skipped (0 on a miss). */
int ctx_seq_resume(cinfer_ctx *c, int id, const int32_t *prompt, int n_prompt, int *cached, char *err, size_t errlen);
/* Records the sequence's first len tokens (tokens[0, len)) with a snapshot of its current state. */
int ctx_seq_snapshot(cinfer_ctx *c, int id, const int32_t *tokens, char *err, size_t errlen);
/* The next position after pos (<= end) where a snapshot is wanted (marks, interval, end). */
int ctx_prefix_next(const cinfer_ctx *c, const int *marks, int n_marks, int pos, int end);
struct prefix_stats;
void ctx_prefix_stats(const cinfer_ctx *c, struct prefix_stats *st);
int ctx_kv_total_blocks(const cinfer_ctx *c);
int ctx_slots_used(const cinfer_ctx *c);
const struct model *cinfer_model_internal(const cinfer_model *m);
/* A sequence's DeltaNet state of one linear layer (recurrent S, or the conv window), for tests. */
const float *ctx_seq_state(const cinfer_ctx *c, int seq, int layer, int recurrent, size_t *n_floats);
/* A sequence's whole DeltaNet state (every layer's conv window, then every layer's S), copied into dst
 * ([ctx_seq_state_floats] f32) on either device, for tests (a cuda context waits for its stream). */
size_t ctx_seq_state_floats(const cinfer_ctx *c);
int ctx_seq_state_copy(cinfer_ctx *c, int seq, float *dst, char *err, size_t errlen);
/* A draft model's exact rollback without speculative windows (engine.c, draft_model_step): stash copies the
 * sequence's committed DeltaNet state into dst ([ctx_seq_state_floats] f32; device memory on a cuda context,
 * where the copy is queued on the context's stream and nothing waits); rewind drops the sequence back to its
 * first len tokens (len <= its length, no window pending), loading src (a stash taken at len; NULL when the
 * model has no DeltaNet layers). KV rows past len are overwritten later; blocks wholly past it go back. A
 * rewind into a block the prefix cache shares is refused (CINFER_ESTATE): later rows would write into it. */
int ctx_seq_state_stash(cinfer_ctx *c, int seq, float *dst, char *err, size_t errlen);
int ctx_seq_rewind(cinfer_ctx *c, int seq, int len, const float *src, char *err, size_t errlen);

/* The MTP head (spec §5; model/mtp.h): ctx_mtp_init sizes its KV pool with the others (once, before any
 * decoding); each sequence then holds head rows at positions [start, len). A forward entry's rows start at pos:
 * pos == len continues, pos < len first drops the rows from pos on (the drafts of a rejected window); a
 * sequence's first entry may start anywhere (a prompt resumed from the prefix cache: the head attends only
 * to its own rows). */
/* n_vocab: the head's logits cover token ids [0, n_vocab) (0 or >= V: all of them). */
int ctx_mtp_init(cinfer_ctx *c, int n_vocab, char *err, size_t errlen);
int ctx_mtp_len(const cinfer_ctx *c, int seq); /* -1: no head or no such sequence */
typedef struct ctx_mtp_entry {
    int seq;
    int pos;               /* position t of the first row */
    const int32_t *tokens; /* [n] x_{t+1} */
    const float *hidden;   /* [n][H] f32 hh_t (may alias hidden_out) */
    int n;
    float *hidden_out;     /* NULL, or [n][H] f32: each row's output after mtp.norm */
    int logits;            /* 0: none, 1: the last row's, 2: every row's */
} ctx_mtp_entry;
/* logits: [rows][n_vocab] f32 in entry order. On CINFER_ENOMEM (no KV block) nothing ran, but each entry's sequence
 * has dropped its rows from pos on; other errors change nothing. */
int ctx_mtp_forward(cinfer_ctx *c, const ctx_mtp_entry *e, int n, float *logits, char *err, size_t errlen);
/* cuda: the same with each logits row's argmax taken on the device (ids [rows]; the logits stay there) */
int ctx_mtp_forward_ids(cinfer_ctx *c, const ctx_mtp_entry *e, int n, int32_t *ids, char *err, size_t errlen);

#endif

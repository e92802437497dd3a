/* cinfer.h — the public API of libcinfer: opaque handles, plain C types, no tensor internals.
 * Every function that can fail returns 0 or a negative CINFER_E* code and writes a message into the
 * caller's (err, errlen) buffer. Nothing here exits the process. */
#ifndef CINFER_H
#define CINFER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CINFER_VERSION "0.1.0"

/* Error codes: 0 is success, every failure is negative. */
enum {
    CINFER_OK = 0,
    CINFER_EINVAL = -1,       /* a bad argument from the caller */
    CINFER_EIO = -2,          /* open/read/mmap failed */
    CINFER_ENOMEM = -3,       /* an allocation or a memory budget failed */
    CINFER_EFORMAT = -4,      /* a malformed file: safetensors, json, config */
    CINFER_EUNSUPPORTED = -5, /* valid input that cinfer does not handle (an architecture, a dtype) */
    CINFER_ERANGE = -6,       /* a count or size beyond a limit (context length, pool size) */
    CINFER_ENOTFOUND = -7,    /* a named thing is missing (a tensor, a file, a field) */
    CINFER_ESTATE = -8,       /* a call that is wrong in the object's current state */
};

/* A short static name for a code ("invalid argument", ...). */
const char *cinfer_strerror(int code);

/* ---- model: immutable after open; shareable by many contexts ---- */
typedef struct cinfer_model cinfer_model;

/* Opens a Hugging Face style model directory (config.json + *.safetensors [+ index]); weights are
 * mmapped, not copied. */
int cinfer_model_open(const char *dir, cinfer_model **out, char *err, size_t errlen);
void cinfer_model_close(cinfer_model *m);

typedef struct cinfer_model_info {
    const char *arch;       /* "qwen3_5", "qwen3_5_moe", "qwen3_next" */
    int n_layers;           /* decoder layers */
    int n_linear_layers;    /* Gated DeltaNet layers */
    int n_full_layers;      /* gated full-attention layers */
    int hidden_size;
    int vocab_size;         /* rows of the logits */
    int n_experts;          /* 0 for dense */
    int n_experts_per_tok;
    int64_t n_params;       /* parameters bound for the text forward (mtp/vision excluded) */
    int64_t n_params_total; /* every tensor in the checkpoint */
    int64_t bytes_bf16, bytes_f16, bytes_f32, bytes_other; /* checkpoint bytes by dtype */
    const char *layer_map;  /* one char per layer: 'L' linear (DeltaNet), 'F' full attention */
    int64_t bytes_per_token;/* weight bytes one decode step streams (active experts only, lm_head included) */
    const int *eos_ids;     /* generation stops after any of these (generation_config.json, else config.json) */
    int n_eos;
    int has_mtp;            /* the checkpoint carries an MTP head (mtp.*) */
    int n_visual_tensors;   /* model.visual.* tensors (vision tower, mapped, not used yet) */
} cinfer_model_info;

void cinfer_model_get_info(const cinfer_model *m, cinfer_model_info *out);

/* ---- context: the model's mutable side (KV block pool, DeltaNet state slots, scratch) ---- */
typedef struct cinfer_ctx cinfer_ctx;

typedef struct cinfer_ctx_params {
    int max_seqs;    /* sequences alive at once (state slots) */
    int max_ctx;     /* tokens per sequence */
    int max_batch;   /* tokens per forward call */
    int n_threads;   /* 0: all online CPUs */
} cinfer_ctx_params;

cinfer_ctx_params cinfer_ctx_default_params(void);
int cinfer_ctx_create(cinfer_model *m, const cinfer_ctx_params *p, cinfer_ctx **out, char *err, size_t errlen);
void cinfer_ctx_destroy(cinfer_ctx *c);

/* A sequence is an id in [0, max_seqs): its KV blocks and DeltaNet state slot. */
int cinfer_seq_open(cinfer_ctx *c, char *err, size_t errlen);   /* >= 0: the id; < 0: error */
void cinfer_seq_close(cinfer_ctx *c, int seq);
int cinfer_seq_len(const cinfer_ctx *c, int seq);               /* tokens processed so far */

/* One forward over a ragged batch: for each entry, n_tokens new tokens of sequence seq, appended after
 * what that sequence already holds. Rows of logits come back for every token of an entry when
 * all_logits is set, otherwise for its last token only, in entry order: logits is [rows][vocab] f32.
 * A sequence's logits do not depend on what else is in the batch (bit for bit). */
typedef struct cinfer_batch_entry {
    int seq;
    const int32_t *tokens;
    int n_tokens;
    int all_logits;
} cinfer_batch_entry;

int cinfer_forward(cinfer_ctx *c, const cinfer_batch_entry *entries, int n_entries, float *logits,
                   char *err, size_t errlen);

/* Rows of logits that cinfer_forward will write for these entries. */
int cinfer_batch_logit_rows(const cinfer_batch_entry *entries, int n_entries);

#ifdef __cplusplus
}
#endif
#endif

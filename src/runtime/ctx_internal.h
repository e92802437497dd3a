/* ctx_internal.h — what the engine (same library) may ask a context beyond the public API. */
#ifndef CI_CTX_INTERNAL_H
#define CI_CTX_INTERNAL_H

#include <stddef.h>

#include "cinfer.h"

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
};

int ctx_kv_free_blocks(const cinfer_ctx *c);
int ctx_kv_total_blocks(const cinfer_ctx *c);
int ctx_slots_used(const cinfer_ctx *c);
const struct model *cinfer_model_internal(const cinfer_model *m);
/* A sequence's DeltaNet state of one linear layer (recurrent S, or the conv window), for tests. */
const float *ctx_seq_state(const cinfer_ctx *c, int seq, int layer, int recurrent, size_t *n_floats);

#endif

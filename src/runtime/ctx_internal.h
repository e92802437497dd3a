/* ctx_internal.h — what the engine (same library) may ask a context beyond the public API. */
#ifndef CI_CTX_INTERNAL_H
#define CI_CTX_INTERNAL_H

#include "cinfer.h"

struct model;

int ctx_kv_free_blocks(const cinfer_ctx *c);
int ctx_kv_total_blocks(const cinfer_ctx *c);
int ctx_slots_used(const cinfer_ctx *c);
const struct model *cinfer_model_internal(const cinfer_model *m);

#endif

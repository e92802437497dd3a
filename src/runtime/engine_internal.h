/* engine_internal.h — test and benchmark hooks of the engine (same library; not public API). */
#ifndef CI_ENGINE_INTERNAL_H
#define CI_ENGINE_INTERNAL_H

#include <stdint.h>

#include "cinfer.h"

/* A drafter: given the sequence so far (prompt + generated, ending with the token about to be fed), write
 * up to k draft tokens to out and return how many. Replaces the engine's own drafter (set before submitting;
 * the engine must have speculation enabled). Called on the scheduler thread. */
typedef int (*engine_draft_fn)(void *ud, const int32_t *hist, int n_hist, int32_t *out, int k);
void engine_set_drafter(cinfer_engine *e, engine_draft_fn fn, void *ud);
/* Tests: told each window the draft model (CINFER_SPEC_DRAFT) proposed, with the history it drafted from. */
typedef void (*engine_draft_observer_fn)(void *ud, const int32_t *hist, int n_hist, const int32_t *drafts, int n);
void engine_set_draft_observer(cinfer_engine *e, engine_draft_observer_fn fn, void *ud);
/* Pad rows verify windows have carried so far (CINFER_SPEC_PAD=1): rows past each window's drafts. */
long long engine_pad_rows(cinfer_engine *e);
/* Sequences open in the draft model's context (0 without one; tests: read while the engine is idle). */
int engine_draft_slots_used(cinfer_engine *e);
/* Prompt tokens the draft model has read (0 without one; tests, engine idle). */
long long engine_draft_prompt_tokens(cinfer_engine *e);

#endif

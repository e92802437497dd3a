/* state.h — the pool of DeltaNet state slots: per slot, every linear layer's conv window and recurrent
 * state, in f32. Sized once at creation (worst case: max_seqs slots). */
#ifndef CI_STATE_H
#define CI_STATE_H

#include <stddef.h>

typedef struct state_pool {
    int n_slots, n_layers;   /* slots, linear (DeltaNet) layers */
    int conv_len, conv_dim;  /* K-1, C */
    int Hv, dk, dv;
    size_t conv_floats;      /* per slot per layer: conv_len * conv_dim */
    size_t rec_floats;       /* per slot per layer: Hv * dk * dv */
    float *conv;             /* [n_slots][n_layers][K-1][C] f32: the last K-1 pre-conv inputs */
    float *rec;              /* [n_slots][n_layers][Hv][dk][dv] f32: S, HF/FLA layout (k index, then v) */
    unsigned char *in_use;   /* [n_slots] */
} state_pool;

int state_pool_init(state_pool *p, int n_slots, int n_layers, int conv_len, int conv_dim, int Hv, int dk, int dv,
                    char *err, size_t errlen);
void state_pool_free(state_pool *p);
int state_alloc_slot(state_pool *p);   /* a zeroed slot, or -1 */
void state_free_slot(state_pool *p, int slot);

static inline float *state_conv(const state_pool *p, int slot, int layer) {
    return p->conv + ((size_t)slot * p->n_layers + (size_t)layer) * p->conv_floats;
}
static inline float *state_rec(const state_pool *p, int slot, int layer) {
    return p->rec + ((size_t)slot * p->n_layers + (size_t)layer) * p->rec_floats;
}

#endif

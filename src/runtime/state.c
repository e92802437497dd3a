/* state.c — see state.h. */
#include "runtime/state.h"

#include <stdlib.h>
#include <string.h>

#include "util/alloc.h"
#include "util/err.h"

int state_pool_init(state_pool *p, int n_slots, int n_layers, int conv_len, int conv_dim, int Hv, int dk, int dv,
                    char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    p->n_slots = n_slots;
    p->n_layers = n_layers;
    p->conv_len = conv_len;
    p->conv_dim = conv_dim;
    p->Hv = Hv;
    p->dk = dk;
    p->dv = dv;
    p->conv_floats = (size_t)conv_len * (size_t)conv_dim;
    p->rec_floats = (size_t)Hv * (size_t)dk * (size_t)dv;
    size_t nc, nr;
    if (ci_mul_overflow((size_t)n_slots * (size_t)n_layers, p->conv_floats * sizeof(float), &nc) ||
        ci_mul_overflow((size_t)n_slots * (size_t)n_layers, p->rec_floats * sizeof(float), &nr))
        return ci_err(err, errlen, CINFER_ERANGE, "state pool size overflows");
    if (nc) p->conv = ci_try_alloc(nc);
    if (nr) p->rec = ci_try_alloc(nr);
    if ((nc && !p->conv) || (nr && !p->rec)) {
        state_pool_free(p);
        return ci_err(err, errlen, CINFER_ENOMEM, "cannot allocate %d DeltaNet state slots (%zu bytes)", n_slots, nc + nr);
    }
    p->in_use = xcalloc((size_t)(n_slots > 0 ? n_slots : 1), 1);
    return 0;
}

void state_pool_free(state_pool *p) {
    free(p->conv);
    free(p->rec);
    free(p->in_use);
    memset(p, 0, sizeof *p);
}

int state_alloc_slot(state_pool *p) {
    for (int s = 0; s < p->n_slots; s++) {
        if (p->in_use[s]) continue;
        p->in_use[s] = 1;
        for (int l = 0; l < p->n_layers; l++) {
            if (p->conv) memset(state_conv(p, s, l), 0, p->conv_floats * sizeof(float));
            if (p->rec) memset(state_rec(p, s, l), 0, p->rec_floats * sizeof(float));
        }
        return s;
    }
    return -1;
}

void state_free_slot(state_pool *p, int slot) {
    CI_ASSERT(slot >= 0 && slot < p->n_slots && p->in_use[slot]);
    p->in_use[slot] = 0;
}

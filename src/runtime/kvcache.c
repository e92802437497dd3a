/* kvcache.c — see kvcache.h. */
#include "runtime/kvcache.h"

#include <stdlib.h>
#include <string.h>

#include "util/alloc.h"
#include "util/err.h"

int kv_pool_init(kv_pool *p, int n_layers, int n_blocks, int kv_dim, char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    size_t per, total;
    if (ci_mul_overflow((size_t)n_layers * (size_t)n_blocks, (size_t)KV_BLOCK * (size_t)kv_dim, &per) ||
        ci_mul_overflow(per, sizeof(float), &total))
        return ci_err(err, errlen, CINFER_ERANGE, "KV pool size overflows");
    p->n_layers = n_layers;
    p->n_blocks = n_blocks;
    p->kv_dim = kv_dim;
    if (total) {
        p->k = ci_try_alloc(total);
        p->v = ci_try_alloc(total);
        if (!p->k || !p->v) {
            kv_pool_free(p);
            return ci_err(err, errlen, CINFER_ENOMEM, "cannot allocate the KV pool: 2 x %zu bytes", total);
        }
    }
    p->free_ids = xmalloc((size_t)(n_blocks > 0 ? n_blocks : 1) * sizeof(int));
    for (int i = 0; i < n_blocks; i++) p->free_ids[i] = n_blocks - 1 - i;
    p->n_free = n_blocks;
    return 0;
}

void kv_pool_free(kv_pool *p) {
    free(p->k);
    free(p->v);
    free(p->free_ids);
    memset(p, 0, sizeof *p);
}

int kv_alloc_block(kv_pool *p) { return p->n_free > 0 ? p->free_ids[--p->n_free] : -1; }

void kv_free_block(kv_pool *p, int id) {
    CI_ASSERT(id >= 0 && id < p->n_blocks && p->n_free < p->n_blocks);
    p->free_ids[p->n_free++] = id;
}

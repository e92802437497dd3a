/* kvcache.h — the paged KV pool of the full-attention layers: fixed-size blocks of KV_BLOCK tokens, the
 * same block id in every layer, handed to sequences through block tables. Sized once at creation; a
 * sequence that needs a block when none is free gets CINFER_ENOMEM, never a reallocation. */
#ifndef CI_KVCACHE_H
#define CI_KVCACHE_H

#include <stddef.h>

#define KV_BLOCK 16

typedef struct kv_pool {
    int n_layers;    /* full-attention layers */
    int n_blocks;
    int kv_dim;      /* Hkv * hd */
    float *k, *v;    /* [n_layers][n_blocks][KV_BLOCK][kv_dim] f32 each */
    int *free_ids;   /* [n_blocks] stack of free block ids */
    int n_free;
} kv_pool;

int kv_pool_init(kv_pool *p, int n_layers, int n_blocks, int kv_dim, char *err, size_t errlen);
void kv_pool_free(kv_pool *p);
int kv_alloc_block(kv_pool *p);            /* a block id, or -1 when the pool is empty */
void kv_free_block(kv_pool *p, int id);

/* Row of position pos (through a block table) in layer l. */
static inline float *kv_k_row(const kv_pool *p, int l, const int *blocks, int pos) {
    size_t b = (size_t)blocks[pos / KV_BLOCK];
    return p->k + (((size_t)l * p->n_blocks + b) * KV_BLOCK + (size_t)(pos % KV_BLOCK)) * p->kv_dim;
}
static inline float *kv_v_row(const kv_pool *p, int l, const int *blocks, int pos) {
    size_t b = (size_t)blocks[pos / KV_BLOCK];
    return p->v + (((size_t)l * p->n_blocks + b) * KV_BLOCK + (size_t)(pos % KV_BLOCK)) * p->kv_dim;
}

#endif

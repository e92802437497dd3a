/* test_prefix_io.c — the prefix cache over a backend that keeps its own state slots and KV blocks (prefix_io:
 * how a cuda context spills its device slots to pinned host memory). The "device" here is host arrays in
 * another layout, and the host pools have no layers, as on cuda: a snapshot must go through save / load, a
 * partial block through kv_copy, the store through alloc / free, and a failing copy must leave every count as
 * it was. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cinfer.h"
#include "runtime/prefix.h"
#include "test.h"

#define D_SLOTS  4
#define D_FLOATS 10 /* floats of one device slot (= one snapshot) */
#define D_BLOCKS 16
#define D_DIM    3

typedef struct dev {
    float state[D_SLOTS][D_FLOATS];
    float kv[D_BLOCKS][KV_BLOCK][D_DIM];
    int saves, loads, copies, allocs, frees;
    int fail_load;
    int last_dst, last_src, last_rows;
} dev;

static dev D;

static int d_save(void *u, int slot, float *dst) {
    dev *d = u;
    d->saves++;
    memcpy(dst, d->state[slot], sizeof d->state[slot]);
    return 0;
}
static int d_load(void *u, int slot, const float *src) {
    dev *d = u;
    d->loads++;
    if (d->fail_load) return CINFER_EIO;
    memcpy(d->state[slot], src, sizeof d->state[slot]);
    return 0;
}
static int d_kv_copy(void *u, int dst, int src, int rows) {
    dev *d = u;
    d->copies++;
    d->last_dst = dst, d->last_src = src, d->last_rows = rows;
    memcpy(d->kv[dst], d->kv[src], sizeof(float) * (size_t)rows * D_DIM);
    return 0;
}
static void *d_alloc(size_t bytes) {
    D.allocs++;
    return malloc(bytes);
}
static void d_free(void *p) {
    if (p) D.frees++;
    free(p);
}

TEST(prefix_io_hooks_move_state_and_partial_blocks) {
    char err[256];
    memset(&D, 0, sizeof D);
    kv_pool kv;
    state_pool st;
    REQUIRE(kv_pool_init(&kv, 0, D_BLOCKS, D_DIM, err, sizeof err) == 0);
    REQUIRE(state_pool_init(&st, D_SLOTS, 0, 3, 4, 2, 2, 2, err, sizeof err) == 0);
    prefix_io io = {&D, D_FLOATS, d_save, d_load, d_kv_copy, d_alloc, d_free, 1000};
    prefix_params pp = {4 * D_FLOATS * sizeof(float), 0, 0, &io};
    prefix_cache *pc;
    REQUIRE(prefix_create(&kv, &st, &pp, &pc, err, sizeof err) == 0);
    CHECK_EQ_INT(D.allocs, 1);
    /* sequence A: 45 tokens in 3 blocks (the last partial), its "device" state and rows */
    int tok[64], ba[4], sa = state_alloc_slot(&st);
    for (int i = 0; i < 64; i++) tok[i] = 100 + i;
    for (int b = 0; b < 3; b++) REQUIRE((ba[b] = prefix_alloc_block(pc)) >= 0);
    for (int i = 0; i < D_FLOATS; i++) D.state[sa][i] = 1.5f + (float)i;
    for (int p = 0; p < 45; p++)
        for (int j = 0; j < D_DIM; j++) D.kv[ba[p / KV_BLOCK]][p % KV_BLOCK][j] = (float)(p * 10 + j);
    REQUIRE(prefix_insert(pc, tok, 45, ba, sa, err, sizeof err) == 0);
    CHECK_EQ_INT(D.saves, 1);
    prefix_release_blocks(pc, ba, 3);
    state_free_slot(&st, sa);
    /* sequence B resumes: the state comes back through load, the partial block through kv_copy */
    int bb[8], sb = state_alloc_slot(&st);
    memset(D.state[sb], 0, sizeof D.state[sb]);
    prefix_hit hit;
    REQUIRE(prefix_lookup(pc, tok, 60, bb, 8, sb, &hit, err, sizeof err) == 0);
    CHECK_EQ_INT(hit.n_tokens, 45);
    CHECK_EQ_INT(hit.n_shared, 2);
    CHECK_EQ_INT(D.loads, 1);
    CHECK_EQ_INT(D.copies, 1);
    CHECK_EQ_INT(D.last_src, ba[2]);
    CHECK_EQ_INT(D.last_dst, bb[2]);
    CHECK_EQ_INT(D.last_rows, 45 % KV_BLOCK);
    CHECK(bb[2] != ba[2]);
    for (int i = 0; i < D_FLOATS; i++) CHECK(D.state[sb][i] == 1.5f + (float)i);
    for (int p = 32; p < 45; p++) CHECK(D.kv[bb[2]][p % KV_BLOCK][1] == (float)(p * 10 + 1));
    prefix_stats ps;
    prefix_get_stats(pc, &ps);
    CHECK_EQ_INT((int)ps.kv_bytes_cached,
                 ps.blocks_cached * 1000); /* kv_block_bytes, not the empty host pool */
    CHECK(prefix_check(pc, err, sizeof err) == 0);
    prefix_release_blocks(pc, bb, hit.n_blocks);
    /* a load that fails: the error comes back and every reference taken is returned */
    int free_before = prefix_available_blocks(pc);
    D.fail_load = 1;
    CHECK_EQ_INT(prefix_lookup(pc, tok, 60, bb, 8, sb, &hit, err, sizeof err), CINFER_EIO);
    CHECK_STR_CONTAINS(err, "state copy failed");
    CHECK_EQ_INT(prefix_available_blocks(pc), free_before);
    CHECK_EQ_INT(prefix_block_refs(pc, ba[0]), 1); /* the tree's own reference only */
    CHECK(prefix_check(pc, err, sizeof err) == 0);
    state_free_slot(&st, sb);
    prefix_destroy(pc);
    CHECK_EQ_INT(D.frees, 1);
    kv_pool_free(&kv);
    state_pool_free(&st);
}

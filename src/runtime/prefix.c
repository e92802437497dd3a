/* prefix.c — see prefix.h for the design: the radix tree, block refcounts, snapshot store and eviction.
 * Nodes live in one array and link by index; the snapshot store and every table are carved at creation,
 * so lookup, insert, allocation and release never allocate. */
#include "runtime/prefix.h"

#include <stdlib.h>
#include <string.h>

#include "util/alloc.h"
#include "util/err.h"

typedef struct pnode {
    int live;
    int parent, child, sibling; /* node indices, -1 = none; sibling is also the free-list link */
    int start, end;         /* the run [start, end) of token positions this node adds to its parent's path */
    int snap;               /* snapshot slot holding the state after `end` tokens, or -1 */
    int lru_prev, lru_next; /* snapshot LRU list (most recent at the head); only while snap >= 0 */
    int pin;                /* an insert or lookup in progress keeps this node (and so its ancestors) */
    int nblk;               /* (end - 1) / KV_BLOCK - start / KV_BLOCK + 1 */
    int blk[PREFIX_NODE_BLOCKS]; /* block ids of block indices start / KV_BLOCK ...; one tree ref each */
} pnode;

struct prefix_cache {
    kv_pool *kv;
    state_pool *st;
    int n_blocks;
    int *ref;  /* [n_blocks] sequence + tree references; 0 <=> on the pool's free list */
    int *tref; /* [n_blocks] tree references */
    int *btok; /* [n_blocks][KV_BLOCK] the token whose KV each row holds (rows some node claims) */
    int n_cached, n_cache_only;

    pnode *nodes; /* [max_nodes]; node 0 is the root (empty run, no blocks, never freed) */
    int max_nodes, n_nodes, free_node;

    float *snaps;   /* [max_snaps][n_linear_layers][conv_floats + rec_floats] f32: conv then S per layer */
    int *snap_free; /* [max_snaps] stack of free snapshot slots */
    int max_snaps, n_snap_free;
    size_t snap_floats; /* per snapshot */
    int lru_head, lru_tail;
    int interval;
    prefix_io io; /* all NULL: the host pools */

    long long lookups, hits, misses, tokens_served, inserts, ev_snaps, ev_blocks;
};

#define ROOT 0

/* ---- block references ---- */

/* n_cached / n_cache_only follow each block's (ref, tref) so stats and admission read them in O(1). */
static void track(prefix_cache *pc, int b, int sign) {
    int cached = pc->tref[b] > 0, only = cached && pc->ref[b] == pc->tref[b];
    pc->n_cached += sign * cached;
    pc->n_cache_only += sign * only;
}

static void bref(prefix_cache *pc, int b, int tree) {
    track(pc, b, -1);
    pc->ref[b]++;
    if (tree) pc->tref[b]++;
    track(pc, b, +1);
}

/* Returns 1 when the block went back to the pool. */
static int bunref(prefix_cache *pc, int b, int tree) {
    CI_ASSERT(pc->ref[b] > 0 && (!tree || pc->tref[b] > 0));
    track(pc, b, -1);
    pc->ref[b]--;
    if (tree) pc->tref[b]--;
    CI_ASSERT(pc->ref[b] >= pc->tref[b]);
    track(pc, b, +1);
    if (pc->ref[b] == 0) {
        kv_free_block(pc->kv, b);
        return 1;
    }
    return 0;
}

/* ---- nodes ---- */

static inline int node_tok(const prefix_cache *pc, const pnode *x, int pos) {
    int b = x->blk[pos / KV_BLOCK - x->start / KV_BLOCK];
    return pc->btok[(size_t)b * KV_BLOCK + (size_t)(pos % KV_BLOCK)];
}

static int node_new(prefix_cache *pc) {
    int i = pc->free_node;
    if (i < 0) return -1;
    pnode *x = &pc->nodes[i];
    pc->free_node = x->sibling;
    memset(x, 0, sizeof *x);
    x->live = 1;
    x->parent = x->child = x->sibling = -1;
    x->snap = x->lru_prev = x->lru_next = -1;
    pc->n_nodes++;
    return i;
}

static void lru_unlink(prefix_cache *pc, int i) {
    pnode *x = &pc->nodes[i];
    if (x->lru_prev >= 0)
        pc->nodes[x->lru_prev].lru_next = x->lru_next;
    else
        pc->lru_head = x->lru_next;
    if (x->lru_next >= 0)
        pc->nodes[x->lru_next].lru_prev = x->lru_prev;
    else
        pc->lru_tail = x->lru_prev;
    x->lru_prev = x->lru_next = -1;
}

static void lru_push_front(prefix_cache *pc, int i) {
    pnode *x = &pc->nodes[i];
    x->lru_prev = -1;
    x->lru_next = pc->lru_head;
    if (pc->lru_head >= 0) pc->nodes[pc->lru_head].lru_prev = i;
    pc->lru_head = i;
    if (pc->lru_tail < 0) pc->lru_tail = i;
}

static void snap_drop(prefix_cache *pc, int i) {
    pnode *x = &pc->nodes[i];
    CI_ASSERT(x->snap >= 0);
    lru_unlink(pc, i);
    pc->snap_free[pc->n_snap_free++] = x->snap;
    x->snap = -1;
}

static float *snap_data(const prefix_cache *pc, int s) {
    return pc->snaps + (size_t)s * pc->snap_floats;
}

static void unlink_child(prefix_cache *pc, int parent, int i) {
    int *link = &pc->nodes[parent].child;
    while (*link != i) {
        CI_ASSERT(*link >= 0);
        link = &pc->nodes[*link].sibling;
    }
    *link = pc->nodes[i].sibling;
    pc->nodes[i].sibling = -1;
}

/* Removes a childless node; returns the number of blocks that went back to the pool. */
static int node_free(prefix_cache *pc, int i) {
    pnode *x = &pc->nodes[i];
    CI_ASSERT(i != ROOT && x->live && x->child < 0);
    int freed = 0;
    if (x->snap >= 0) snap_drop(pc, i);
    for (int k = 0; k < x->nblk; k++) freed += bunref(pc, x->blk[k], 1);
    unlink_child(pc, x->parent, i);
    x->live = 0;
    x->sibling = pc->free_node;
    pc->free_node = i;
    pc->n_nodes--;
    return freed;
}

/* Leaves without a snapshot can never be resumed: remove them, walking up. */
static int prune_up(prefix_cache *pc, int i) {
    int freed = 0;
    while (i != ROOT && !pc->nodes[i].pin && pc->nodes[i].child < 0 && pc->nodes[i].snap < 0) {
        int p = pc->nodes[i].parent;
        freed += node_free(pc, i);
        i = p;
    }
    return freed;
}

/* Drops the least recently used snapshot (whatever node holds it) and prunes. 0 when there is none. */
static int evict_snapshot(prefix_cache *pc) {
    int i = pc->lru_tail;
    if (i < 0) return 0;
    snap_drop(pc, i);
    pc->ev_snaps++;
    pc->ev_blocks += prune_up(pc, i);
    return 1;
}

/* Removes the least recently used unpinned leaf (every leaf holds a snapshot, so all are on the LRU list).
 * 0 when there is none. */
static int evict_leaf(prefix_cache *pc) {
    for (int i = pc->lru_tail; i >= 0; i = pc->nodes[i].lru_prev) {
        if (pc->nodes[i].child >= 0 || pc->nodes[i].pin) continue;
        snap_drop(pc, i);
        pc->ev_snaps++;
        pc->ev_blocks += prune_up(pc, i);
        return 1;
    }
    return 0;
}

static int alloc_evicting(prefix_cache *pc) {
    int b;
    while ((b = kv_alloc_block(pc->kv)) < 0)
        if (!evict_leaf(pc)) return -1;
    CI_ASSERT(pc->ref[b] == 0);
    bref(pc, b, 0);
    return b;
}

/* ---- matching ---- */

typedef struct match {
    int node; /* the node the match ends in (ROOT when nothing matched) */
    int len;  /* tokens matched */
    int best; /* deepest fully matched node with a snapshot, or -1 */
} match;

static int find_child(const prefix_cache *pc, int x, int tok) {
    for (int c = pc->nodes[x].child; c >= 0; c = pc->nodes[c].sibling)
        if (node_tok(pc, &pc->nodes[c], pc->nodes[c].start) == tok) return c;
    return -1;
}

static match tree_match(const prefix_cache *pc, const int *tokens, int n) {
    match m = {ROOT, 0, -1};
    int x = ROOT, pos = 0;
    while (pos < n) {
        int c = find_child(pc, x, tokens[pos]);
        if (c < 0) break;
        const pnode *y = &pc->nodes[c];
        int p = pos;
        while (p < y->end && p < n && node_tok(pc, y, p) == tokens[p]) p++;
        if (p < y->end) {
            m.node = c;
            m.len = p;
            return m;
        }
        x = c;
        pos = p;
        if (y->snap >= 0) m.best = c;
    }
    m.node = x;
    m.len = pos;
    return m;
}

/* ---- creation ---- */

/* The host pools' prefix_io (u = the cache): the default when prefix_params.io is NULL, so lookups and
 * inserts move data through one interface whichever device holds the pools. */
static int host_save(void *u, int slot, float *dst) {
    const state_pool *st = ((prefix_cache *)u)->st;
    for (int l = 0; l < st->n_layers; l++) {
        memcpy(dst, state_conv(st, slot, l), st->conv_floats * sizeof(float));
        dst += st->conv_floats;
        memcpy(dst, state_rec(st, slot, l), st->rec_floats * sizeof(float));
        dst += st->rec_floats;
    }
    return 0;
}

static int host_load(void *u, int slot, const float *src) {
    const state_pool *st = ((prefix_cache *)u)->st;
    for (int l = 0; l < st->n_layers; l++) {
        memcpy(state_conv(st, slot, l), src, st->conv_floats * sizeof(float));
        src += st->conv_floats;
        memcpy(state_rec(st, slot, l), src, st->rec_floats * sizeof(float));
        src += st->rec_floats;
    }
    return 0;
}

static int host_kv_copy(void *u, int dst, int src, int rows) {
    const kv_pool *kv = ((prefix_cache *)u)->kv;
    size_t row = (size_t)kv->kv_dim, blk = (size_t)KV_BLOCK * row;
    for (int l = 0; l < kv->n_layers; l++) {
        size_t layer = (size_t)l * (size_t)kv->n_blocks * blk;
        memcpy(kv->k + layer + (size_t)dst * blk, kv->k + layer + (size_t)src * blk,
               (size_t)rows * row * sizeof(float));
        memcpy(kv->v + layer + (size_t)dst * blk, kv->v + layer + (size_t)src * blk,
               (size_t)rows * row * sizeof(float));
    }
    return 0;
}

static void *host_alloc(size_t bytes) {
    return ci_try_alloc(bytes);
}

int prefix_create(kv_pool *kv, state_pool *st, const prefix_params *pp, prefix_cache **out, char *err,
                  size_t errlen) {
    if (!kv || !st || !out)
        return ci_err(err, errlen, CINFER_EINVAL, "prefix_create: pools and out are required");
    prefix_params p = pp ? *pp : (prefix_params){0};
    if (kv->n_free != kv->n_blocks)
        return ci_err(err, errlen, CINFER_ESTATE, "prefix_create: %d of %d KV blocks are in use",
                      kv->n_blocks - kv->n_free, kv->n_blocks);
    if (p.max_nodes < 0 || p.interval < 0)
        return ci_err(err, errlen, CINFER_EINVAL, "prefix_create: negative max_nodes or interval");
    size_t snap_floats = p.io ? p.io->snap_floats : (size_t)st->n_layers * (st->conv_floats + st->rec_floats);
    size_t snap_bytes = snap_floats * sizeof(float);
    size_t max_snaps = 0;
    if (p.budget_bytes) {
        if (snap_bytes == 0)
            return ci_err(err, errlen, CINFER_EINVAL,
                          "prefix cache: the model has no DeltaNet state to snapshot");
        max_snaps = p.budget_bytes / snap_bytes;
        if (max_snaps == 0)
            return ci_err(err, errlen, CINFER_EINVAL,
                          "prefix cache memory of %zu bytes holds no state snapshot (%zu bytes each)",
                          p.budget_bytes, snap_bytes);
        if (max_snaps > (1u << 24))
            max_snaps = 1u << 24; /* node indices stay ints; 16M snapshots is beyond any budget */
    }
    long max_nodes = p.max_nodes ? p.max_nodes : 2L * kv->n_blocks + 4L * (long)max_snaps + 64;
    if (max_nodes > (1L << 28)) max_nodes = 1L << 28;
    if (max_nodes < 1) max_nodes = 1;

    prefix_cache *pc = xcalloc(1, sizeof *pc);
    pc->kv = kv;
    pc->st = st;
    pc->n_blocks = kv->n_blocks;
    pc->interval = p.interval;
    if (p.io) {
        pc->io = *p.io;
    } else {
        pc->io = (prefix_io){
            pc,           snap_floats,
            host_save,    host_load,
            host_kv_copy, host_alloc,
            free,         2 * (size_t)kv->n_layers * KV_BLOCK * (size_t)kv->kv_dim * sizeof(float)};
    }
    size_t nb = (size_t)(kv->n_blocks > 0 ? kv->n_blocks : 1);
    pc->ref = xcalloc(nb, sizeof(int));
    pc->tref = xcalloc(nb, sizeof(int));
    pc->btok = xcalloc(nb * KV_BLOCK, sizeof(int));
    pc->max_nodes = (int)max_nodes;
    pc->nodes = ci_try_alloc((size_t)max_nodes * sizeof(pnode));
    pc->max_snaps = (int)max_snaps;
    pc->snap_floats = snap_floats;
    size_t store = 0;
    if (max_snaps && ci_mul_overflow(max_snaps, snap_bytes, &store)) store = SIZE_MAX;
    pc->snaps = max_snaps ? pc->io.alloc(store) : NULL;
    pc->snap_free = xmalloc((max_snaps ? max_snaps : 1) * sizeof(int));
    if (!pc->nodes || (max_snaps && !pc->snaps)) {
        prefix_destroy(pc);
        return ci_err(err, errlen, CINFER_ENOMEM,
                      "cannot allocate the prefix cache (%ld nodes, %zu snapshot bytes)", max_nodes, store);
    }
    for (int i = 0; i < pc->max_snaps; i++) pc->snap_free[i] = pc->max_snaps - 1 - i;
    pc->n_snap_free = pc->max_snaps;
    pc->lru_head = pc->lru_tail = -1;
    pc->free_node = -1;
    for (int i = pc->max_nodes - 1; i >= 1; i--) {
        pc->nodes[i].live = 0;
        pc->nodes[i].sibling = pc->free_node;
        pc->free_node = i;
    }
    pnode *r = &pc->nodes[ROOT];
    *r = (pnode){
        .live = 1, .parent = -1, .child = -1, .sibling = -1, .snap = -1, .lru_prev = -1, .lru_next = -1};
    pc->n_nodes = 1;
    *out = pc;
    return 0;
}

void prefix_destroy(prefix_cache *pc) {
    if (!pc) return;
    free(pc->ref);
    free(pc->tref);
    free(pc->btok);
    free(pc->nodes);
    if (pc->io.free)
        pc->io.free(pc->snaps); /* NULL only when creation failed before io was set */
    else
        free(pc->snaps);
    free(pc->snap_free);
    free(pc);
}

/* ---- blocks for sequences ---- */

int prefix_alloc_block(prefix_cache *pc) {
    return alloc_evicting(pc);
}

void prefix_release_blocks(prefix_cache *pc, const int *blocks, int n) {
    for (int i = 0; i < n; i++) {
        CI_ASSERT(blocks[i] >= 0 && blocks[i] < pc->n_blocks);
        bunref(pc, blocks[i], 0);
    }
}

int prefix_available_blocks(const prefix_cache *pc) {
    return pc->kv->n_free + pc->n_cache_only;
}

int prefix_block_refs(const prefix_cache *pc, int block) {
    return block >= 0 && block < pc->n_blocks ? pc->ref[block] : -1;
}

/* ---- lookup ---- */

static int check_slot(const prefix_cache *pc, int slot, char *err, size_t errlen) {
    if (slot < 0 || slot >= pc->st->n_slots || !pc->st->in_use[slot])
        return ci_err(err, errlen, CINFER_EINVAL, "state slot %d is not in use", slot);
    return 0;
}

int prefix_lookup(prefix_cache *pc, const int *tokens, int n_tokens, int *blocks, int max_blocks, int slot,
                  prefix_hit *hit, char *err, size_t errlen) {
    if (!pc || !hit || (n_tokens > 0 && (!tokens || !blocks)) || max_blocks < 0)
        return ci_err(err, errlen, CINFER_EINVAL, "prefix_lookup: bad arguments");
    int rc = check_slot(pc, slot, err, errlen);
    if (rc) return rc;
    *hit = (prefix_hit){0, 0, 0};
    pc->lookups++;
    int n = n_tokens;
    if ((long)max_blocks * KV_BLOCK < n) n = max_blocks * KV_BLOCK; /* no more than the table can map */
    match m = n > 0 && pc->max_snaps ? tree_match(pc, tokens, n) : (match){ROOT, 0, -1};
    if (m.best < 0) {
        pc->misses++;
        return 0;
    }
    pnode *e = &pc->nodes[m.best];
    int L = e->end, nb = (L + KV_BLOCK - 1) / KV_BLOCK, full = L / KV_BLOCK;
    for (int b = 0; b < nb; b++) blocks[b] = -1;
    /* bottom-up: for an index two nodes share (a run starting mid-block), the deeper node's block wins */
    for (int x = m.best; x != ROOT; x = pc->nodes[x].parent) {
        const pnode *y = &pc->nodes[x];
        int first = y->start / KV_BLOCK;
        for (int k = 0; k < y->nblk; k++)
            if (blocks[first + k] < 0) blocks[first + k] = y->blk[k];
    }
    for (int b = 0; b < full; b++) bref(pc, blocks[b], 0);
    if (full < nb) {
        /* partial last block: the sequence appends into it, so it gets its own copy of the cached rows */
        int src = blocks[full], rows = L % KV_BLOCK;
        e->pin++; /* evicting for the copy must keep the path and the source block */
        int dst = alloc_evicting(pc);
        e = &pc->nodes[m.best];
        e->pin--;
        if (dst < 0) {
            prefix_release_blocks(pc, blocks, full);
            pc->misses++;
            return ci_err(err, errlen, CINFER_ENOMEM,
                          "prefix cache hit of %d tokens: no free KV block for the partial block", L);
        }
        if ((rc = pc->io.kv_copy(pc->io.u, dst, src, rows))) {
            blocks[full] = dst;
            prefix_release_blocks(pc, blocks, nb);
            pc->misses++;
            return ci_err(err, errlen, rc, "prefix cache hit of %d tokens: the KV copy failed", L);
        }
        blocks[full] = dst;
    }
    if ((rc = pc->io.load(pc->io.u, slot, snap_data(pc, e->snap)))) {
        prefix_release_blocks(pc, blocks, nb);
        pc->misses++;
        return ci_err(err, errlen, rc, "prefix cache hit of %d tokens: the state copy failed", L);
    }
    lru_unlink(pc, m.best);
    lru_push_front(pc, m.best);
    pc->hits++;
    pc->tokens_served += L;
    *hit = (prefix_hit){L, nb, full};
    return 0;
}

int prefix_peek(const prefix_cache *pc, const int *tokens, int n_tokens, int max_blocks, int *n_shared) {
    int n = n_tokens;
    if ((long)max_blocks * KV_BLOCK < n) n = max_blocks * KV_BLOCK;
    match m = n > 0 && tokens && pc->max_snaps ? tree_match(pc, tokens, n) : (match){ROOT, 0, -1};
    int L = m.best < 0 ? 0 : pc->nodes[m.best].end;
    if (n_shared) *n_shared = L / KV_BLOCK;
    return L;
}

/* ---- insert ---- */

/* Node count of the chain that covers [pos, n): each piece touches at most PREFIX_NODE_BLOCKS indices. */
static int pieces(int pos, int n) {
    int c = 0;
    while (pos < n) {
        int end = (pos / KV_BLOCK + PREFIX_NODE_BLOCKS) * KV_BLOCK;
        pos = end < n ? end : n;
        c++;
    }
    return c;
}

/* Splits node i at position d (start < d < end): a new head [start, d) takes i's place under its parent and
 * i keeps [d, end) with its children and snapshot. Returns the head. */
static int split(prefix_cache *pc, int i, int d) {
    int h = node_new(pc);
    CI_ASSERT(h >= 0); /* reserved by the caller */
    pnode *x = &pc->nodes[i], *y = &pc->nodes[h];
    y->start = x->start;
    y->end = d;
    y->nblk = (d - 1) / KV_BLOCK - x->start / KV_BLOCK + 1;
    for (int k = 0; k < y->nblk; k++) {
        y->blk[k] = x->blk[k];
        bref(pc, y->blk[k], 1); /* taken before the tail lets go, so no count passes through 0 */
    }
    int shift = d / KV_BLOCK - x->start / KV_BLOCK;
    for (int k = 0; k < shift; k++) bunref(pc, x->blk[k], 1);
    memmove(x->blk, x->blk + shift, (size_t)(x->nblk - shift) * sizeof(int));
    x->nblk -= shift;
    x->start = d;
    /* the head takes the tail's place in the parent's child list */
    y->parent = x->parent;
    int *link = &pc->nodes[x->parent].child;
    while (*link != i) link = &pc->nodes[*link].sibling;
    *link = h;
    y->sibling = x->sibling;
    x->sibling = -1;
    x->parent = h;
    y->child = i;
    return h;
}

int prefix_insert(prefix_cache *pc, const int *tokens, int n_tokens, const int *blocks, int slot, char *err,
                  size_t errlen) {
    if (!pc || n_tokens < 0 || (n_tokens > 0 && (!tokens || !blocks)))
        return ci_err(err, errlen, CINFER_EINVAL, "prefix_insert: bad arguments");
    if (n_tokens == 0 || pc->max_snaps == 0) return 0;
    int rc = check_slot(pc, slot, err, errlen);
    if (rc) return rc;
    int nb = (n_tokens + KV_BLOCK - 1) / KV_BLOCK;
    for (int b = 0; b < nb; b++)
        if (blocks[b] < 0 || blocks[b] >= pc->n_blocks || pc->ref[blocks[b]] <= 0)
            return ci_err(err, errlen, CINFER_EINVAL,
                          "prefix_insert: block %d at index %d is not held by the sequence", blocks[b], b);

    match m = tree_match(pc, tokens, n_tokens);
    pnode *x = &pc->nodes[m.node];
    int at_end = m.len == x->end; /* the match ends at a node boundary (always for the root) */
    if (m.len == n_tokens && at_end && x->snap >= 0) {
        lru_unlink(pc, m.node); /* already cached: this counts as a use */
        lru_push_front(pc, m.node);
        return 0;
    }
    int pinned = m.node;
    pc->nodes[pinned].pin++;
    int need = (at_end ? 0 : 1) + pieces(m.len, n_tokens);
    while (pc->max_nodes - pc->n_nodes < need)
        if (!evict_leaf(pc)) break;
    if (pc->max_nodes - pc->n_nodes < need) {
        pc->nodes[pinned].pin--;
        pc->ev_blocks += prune_up(pc, pinned);
        return ci_err(err, errlen, CINFER_ENOMEM, "prefix cache: %d nodes needed, %d free after eviction",
                      need, pc->max_nodes - pc->n_nodes);
    }
    if (pc->n_snap_free == 0) evict_snapshot(pc); /* may take the pinned node's own: it stays, pruned below */
    CI_ASSERT(pc->n_snap_free > 0);

    int attach = at_end ? m.node : split(pc, m.node, m.len);
    int pos = m.len;
    while (pos < n_tokens) {
        int c = node_new(pc);
        CI_ASSERT(c >= 0);
        pnode *y = &pc->nodes[c];
        int first = pos / KV_BLOCK, end = (first + PREFIX_NODE_BLOCKS) * KV_BLOCK;
        y->start = pos;
        y->end = end < n_tokens ? end : n_tokens;
        y->nblk = (y->end - 1) / KV_BLOCK - first + 1;
        for (int k = 0; k < y->nblk; k++) {
            y->blk[k] = blocks[first + k];
            bref(pc, y->blk[k], 1);
        }
        for (int p = pos; p < y->end; p++)
            pc->btok[(size_t)blocks[p / KV_BLOCK] * KV_BLOCK + (size_t)(p % KV_BLOCK)] = tokens[p];
        y->parent = attach;
        y->sibling = pc->nodes[attach].child;
        pc->nodes[attach].child = c;
        attach = c;
        pos = y->end;
    }
    pnode *t = &pc->nodes[attach];
    CI_ASSERT(t->end == n_tokens && t->snap < 0);
    t->snap = pc->snap_free[--pc->n_snap_free];
    /* the host copy is done on return; the device one is enqueued (an error surfaces at the next sync) */
    pc->io.save(pc->io.u, slot, snap_data(pc, t->snap));
    lru_push_front(pc, attach);
    pc->inserts++;
    pc->nodes[pinned].pin--;
    pc->ev_blocks += prune_up(pc, pinned); /* a split tail whose snapshot was just evicted */
    return 0;
}

void prefix_clear(prefix_cache *pc) {
    /* children before parents: free leaves repeatedly, walking down from the root */
    int x = ROOT;
    while (pc->nodes[ROOT].child >= 0) {
        while (pc->nodes[x].child >= 0) x = pc->nodes[x].child;
        int p = pc->nodes[x].parent;
        node_free(pc, x);
        x = p;
    }
}

int prefix_next_snapshot(const prefix_cache *pc, const int *marks, int n_marks, int pos, int end) {
    int best = end;
    for (int i = 0; i < n_marks; i++)
        if (marks[i] > pos && marks[i] < best) best = marks[i];
    if (pc->interval > 0) {
        long q = ((long)pos / pc->interval + 1) * pc->interval;
        if (q < best) best = (int)q;
    }
    return best;
}

void prefix_get_stats(const prefix_cache *pc, prefix_stats *s) {
    memset(s, 0, sizeof *s);
    s->lookups = pc->lookups;
    s->hits = pc->hits;
    s->misses = pc->misses;
    s->tokens_served = pc->tokens_served;
    s->inserts = pc->inserts;
    s->evicted_snapshots = pc->ev_snaps;
    s->evicted_blocks = pc->ev_blocks;
    s->max_snapshots = pc->max_snaps;
    s->n_snapshots = pc->max_snaps - pc->n_snap_free;
    s->bytes_per_snapshot = pc->snap_floats * sizeof(float);
    s->snapshot_bytes = (size_t)s->n_snapshots * s->bytes_per_snapshot;
    s->n_nodes = pc->n_nodes;
    s->max_nodes = pc->max_nodes;
    s->blocks_cached = pc->n_cached;
    s->blocks_cache_only = pc->n_cache_only;
    s->kv_bytes_cached = (size_t)pc->n_cached * pc->io.kv_block_bytes;
}

/* ---- invariants (tests) ---- */

int prefix_check(const prefix_cache *pc, char *err, size_t errlen) {
    int rc = 0, nb = pc->n_blocks;
    int *tref = xcalloc((size_t)(nb > 0 ? nb : 1), sizeof(int));
    unsigned char *is_free = xcalloc((size_t)(nb > 0 ? nb : 1), 1);
    unsigned char *snap_seen = xcalloc((size_t)(pc->max_snaps > 0 ? pc->max_snaps : 1), 1);
#define FAIL(...)                                                                                            \
    do {                                                                                                     \
        rc = ci_err(err, errlen, CINFER_ESTATE, __VA_ARGS__);                                                \
        goto out;                                                                                            \
    } while (0)
    int live = 0, with_snap = 0;
    for (int i = 0; i < pc->max_nodes; i++) {
        const pnode *x = &pc->nodes[i];
        if (!x->live) continue;
        live++;
        if (x->pin) FAIL("node %d is still pinned", i);
        if (i == ROOT) {
            if (x->start || x->end || x->nblk || x->snap >= 0) FAIL("root is not empty");
        } else {
            const pnode *p = &pc->nodes[x->parent];
            if (!p->live || x->start != p->end || x->end <= x->start)
                FAIL("node %d: run [%d,%d) under parent end %d", i, x->start, x->end, p->end);
            if (x->nblk != (x->end - 1) / KV_BLOCK - x->start / KV_BLOCK + 1 || x->nblk > PREFIX_NODE_BLOCKS)
                FAIL("node %d: %d blocks for [%d,%d)", i, x->nblk, x->start, x->end);
            if (x->child < 0 && x->snap < 0) FAIL("node %d is a leaf without a snapshot", i);
            int found = 0;
            for (int c = p->child; c >= 0; c = pc->nodes[c].sibling) found += c == i;
            if (found != 1) FAIL("node %d appears %d times among its parent's children", i, found);
            for (int k = 0; k < x->nblk; k++) {
                if (x->blk[k] < 0 || x->blk[k] >= nb) FAIL("node %d: block id %d", i, x->blk[k]);
                tref[x->blk[k]]++;
            }
        }
        for (int c = x->child; c >= 0; c = pc->nodes[c].sibling) {
            if (pc->nodes[c].parent != i) FAIL("node %d: child %d has parent %d", i, c, pc->nodes[c].parent);
            for (int d = pc->nodes[c].sibling; d >= 0; d = pc->nodes[d].sibling)
                if (node_tok(pc, &pc->nodes[c], pc->nodes[c].start) ==
                    node_tok(pc, &pc->nodes[d], pc->nodes[d].start))
                    FAIL("node %d: children %d and %d start with the same token", i, c, d);
        }
        if (x->snap >= 0) {
            with_snap++;
            if (x->snap >= pc->max_snaps || snap_seen[x->snap]++)
                FAIL("node %d: snapshot slot %d reused", i, x->snap);
        }
    }
    if (live != pc->n_nodes) FAIL("%d live nodes, count says %d", live, pc->n_nodes);
    if (with_snap != pc->max_snaps - pc->n_snap_free)
        FAIL("%d snapshots held, store says %d", with_snap, pc->max_snaps - pc->n_snap_free);
    int on_list = 0, prev = -1;
    for (int i = pc->lru_head; i >= 0; i = pc->nodes[i].lru_next) {
        if (++on_list > with_snap || pc->nodes[i].snap < 0 || pc->nodes[i].lru_prev != prev)
            FAIL("LRU list is broken at node %d", i);
        prev = i;
    }
    if (on_list != with_snap || pc->lru_tail != prev)
        FAIL("LRU list holds %d of %d snapshots", on_list, with_snap);
    for (int k = 0; k < pc->kv->n_free; k++) {
        int b = pc->kv->free_ids[k];
        if (b < 0 || b >= nb || is_free[b]++) FAIL("free list: block %d twice or out of range", b);
    }
    int cached = 0, only = 0;
    for (int b = 0; b < nb; b++) {
        if (tref[b] != pc->tref[b])
            FAIL("block %d: %d tree references, count says %d", b, tref[b], pc->tref[b]);
        if (pc->ref[b] < pc->tref[b]) FAIL("block %d: ref %d below tree refs %d", b, pc->ref[b], pc->tref[b]);
        if ((pc->ref[b] == 0) != (is_free[b] != 0))
            FAIL("block %d: ref %d but %son the free list", b, pc->ref[b], is_free[b] ? "" : "not ");
        cached += tref[b] > 0;
        only += tref[b] > 0 && pc->ref[b] == tref[b];
    }
    if (cached != pc->n_cached || only != pc->n_cache_only)
        FAIL("cached blocks %d/%d, cache-only %d/%d", cached, pc->n_cached, only, pc->n_cache_only);
#undef FAIL
out:
    free(tref);
    free(is_free);
    free(snap_seen);
    return rc;
}

/* prefix.h — the prefix cache of a hybrid (DeltaNet + attention) model: a radix tree over token ids shared
 * by all sequences, the reference counts of every KV block of the pool, and DeltaNet state snapshots within
 * a byte budget. A request resumes from the longest cached prefix that ends at a snapshot.
 *
 * Design note
 * -----------
 * Why snapshots. Attention KV of a prefix is a function of the prefix alone and is written once, so full KV
 * blocks can be shared by reference. The DeltaNet conv window and recurrent S are rewritten by every token:
 * they cannot be shared, only copied, and only exist for positions someone saved. A hybrid model can resume
 * at position L only if (a) the KV of [0, L) is present and (b) a state snapshot taken after exactly L
 * tokens exists. The tree keeps snapshots at the positions the caller asks for (end of a prompt, each chat
 * message boundary, every `interval` tokens of a long prefill) and a lookup ends at the deepest of them.
 *
 * The tree. Node = a run of tokens [start, end) added to its parent's path (root: the empty path). A node
 * holds one tree reference on the KV block of every block index its run touches, start/KV_BLOCK ..
 * (end-1)/KV_BLOCK, at most PREFIX_NODE_BLOCKS of them (long runs become chains of nodes), and at most one
 * snapshot: the state after `end` tokens. Snapshots sit only at node ends (inserting one inside a run splits
 * the node), so "where can a lookup stop" is a property of nodes. When a run starts inside a block (its
 * parent ends mid-block), the parent's last block and the child's first block share an index; the child's
 * block is the one that is valid for the child's path (its rows before `start` hold the same prefix, its
 * later rows the child's own tokens), so for a path, block index b maps to the deepest node holding b.
 * Children are found by their first token. Invariant: every leaf holds a snapshot — a run beyond the last
 * snapshot can never be resumed, so it is pruned at once and its blocks released.
 *
 * Tokens are not stored per node: each KV block row records the token whose KV it holds (btok), written
 * when a node claims the row. A block's rows are only ever written by the one sequence that allocated it
 * (shared blocks are full and read-only; a partial block is copied, never shared), so every node that
 * holds a block agrees with it on the rows it claims.
 *
 * Refcounts and the pool's free list. While a prefix cache exists, every KV block goes through it:
 * prefix_alloc_block (ref = 1, owned by the calling sequence) and prefix_release_blocks (ref -= 1). ref[b]
 * counts sequence references + tree references; a block is on kv_pool's free list exactly when ref[b] == 0,
 * and goes back to it the moment the last reference is dropped. Never call kv_alloc_block/kv_free_block
 * directly on a pool the cache manages. A block whose references are all the tree's is "cache-only": it
 * can be reclaimed by eviction, so free-for-admission = kv.n_free + cache-only (prefix_available_blocks).
 *
 * Copy on write. A hit of L tokens maps the L/KV_BLOCK full blocks by reference (ref += 1: read-only from
 * now on for everyone, since sequences only append). If L is not a multiple of KV_BLOCK, the block holding
 * rows [0, L % KV_BLOCK) is partial: the new sequence would append into it, so it gets a fresh block with
 * those rows copied (the owner of the original keeps writing its own later rows undisturbed).
 *
 * Eviction. Snapshots: a fixed store of budget_bytes / snapshot_bytes slots carved at creation; inserting
 * into a full store drops the least recently used snapshot (a hit or an insert counts as a use). Dropping a
 * leaf's snapshot prunes the leaf and every snapshot-less ancestor that becomes a leaf: the cached path
 * shrinks back to the last snapshot still present, releasing the blocks only it held. Blocks: when the pool
 * has no free block, prefix_alloc_block (and the copy of a partial block in a lookup) removes least recently
 * used leaves, with their snapshots, until a block comes free. Nodes: a fixed pool too; an insert that needs
 * more evicts leaves the same way. Nothing allocates after prefix_create (tested under the no-alloc guard).
 *
 * Threading: one owner (the scheduler thread), no locks; /metrics reads a copy (prefix_get_stats). The
 * snapshots live in host memory; a GPU backend copies slot <-> snapshot (spilling GPU states to host RAM is
 * what this store already is on the CPU path). */
#ifndef CI_PREFIX_H
#define CI_PREFIX_H

#include <stddef.h>

#include "runtime/kvcache.h"
#include "runtime/state.h"

#define PREFIX_NODE_BLOCKS 16 /* block indices one node may touch: runs of up to 256 tokens */

typedef struct prefix_cache prefix_cache;

/* A backend whose KV blocks and state slots are not the host pools' memory (cuda: the pools there keep only
 * the free lists): the cache moves data through these instead of memcpy. The snapshot store is then
 * host memory from alloc (page-locked, so the device copies run asynchronously at full link speed: the GPU
 * states spill to host RAM) and each snapshot snap_floats floats in the backend's own layout, which only
 * load reads back. The copies are enqueued in the backend's stream order, so a load after a save of the
 * same snapshot sees it without the host waiting. Each returns 0 or a CINFER_E* code. */
typedef struct prefix_io {
    void *u;
    size_t snap_floats;
    int (*save)(void *u, int slot, float *dst);       /* state slot -> snapshot */
    int (*load)(void *u, int slot, const float *src); /* snapshot -> state slot */
    int (*kv_copy)(void *u, int dst_block, int src_block, int rows); /* rows [0, rows) in every layer */
    void *(*alloc)(size_t bytes);
    void (*free)(void *p);
    size_t kv_block_bytes; /* K and V of one block in every layer (the stats; the host pool has no layers) */
} prefix_io;

typedef struct prefix_params {
    size_t budget_bytes; /* snapshot memory (--prefix-cache-memory); 0 = no caching (refcounts still kept) */
    int max_nodes;       /* tree nodes; 0 = 2 * n_blocks + 4 * snapshots + 64 */
    int interval; /* a snapshot every `interval` tokens of a long prefill (prefix_next_snapshot); 0 = none */
    const prefix_io *io; /* NULL: the host pools */
} prefix_params;

typedef struct prefix_hit {
    int n_tokens; /* cached tokens the sequence resumes after (0 = miss) */
    int n_blocks; /* block ids written: ceil(n_tokens / KV_BLOCK) */
    int n_shared; /* the first n_shared are shared by reference; a partial last one is the sequence's copy */
} prefix_hit;

typedef struct prefix_stats {
    long long lookups, hits, misses;
    long long tokens_served;     /* sum of hit lengths */
    long long inserts;           /* snapshots stored */
    long long evicted_snapshots; /* dropped for the budget, for free blocks or for free nodes */
    long long evicted_blocks;    /* blocks returned to the pool by eviction */
    int n_snapshots, max_snapshots;
    size_t snapshot_bytes;     /* bytes of the snapshots held: n_snapshots * bytes_per_snapshot */
    size_t bytes_per_snapshot; /* n_linear_layers * (conv_len * conv_dim + Hv * dk * dv) * 4 */
    int n_nodes, max_nodes;
    int blocks_cached;      /* distinct blocks the tree references */
    int blocks_cache_only;  /* of which no sequence holds: reclaimable */
    size_t kv_bytes_cached; /* blocks_cached * bytes of one block (K and V, all full-attention layers) */
} prefix_stats;

/* Creates the cache over the pools (which must outlive it). Every block of kv must be free. Allocates the
 * snapshot store (floor(budget / snapshot size) snapshots), the nodes and the per-block tables; a nonzero
 * budget below one snapshot is CINFER_EINVAL. */
int prefix_create(kv_pool *kv, state_pool *st, const prefix_params *p, prefix_cache **out, char *err,
                  size_t errlen);
/* Frees the cache's memory; the pool is not touched (destroy the pools after it, or together). */
void prefix_destroy(prefix_cache *pc);

/* A free block for a sequence (ref = 1), evicting least recently used cache leaves when the pool is empty;
 * -1 when every block is held by a sequence. */
int prefix_alloc_block(prefix_cache *pc);
/* Drops one reference on each block; a block whose count reaches 0 returns to the pool's free list. */
void prefix_release_blocks(prefix_cache *pc, const int *blocks, int n);

/* Longest cached prefix of tokens[0, n_tokens) that ends at a snapshot. On a hit, writes hit->n_blocks ids
 * into blocks[] (taking one reference each for the sequence; the partial last block is a fresh copy) and
 * copies the snapshot into state slot `slot`. The caller passes n_tokens = prompt length - 1 so that at
 * least one token is left to prefill (its logits start the answer). CINFER_ENOMEM (nothing taken) when the
 * partial block cannot be copied for lack of a free block. Allocates nothing. */
int prefix_lookup(prefix_cache *pc, const int *tokens, int n_tokens, int *blocks, int max_blocks, int slot,
                  prefix_hit *hit, char *err, size_t errlen);

/* What prefix_lookup would return for the same tokens (hit length; *n_shared: blocks it would map by
 * reference), without taking anything, copying, counting or touching the LRU order: for an admission that
 * must know how many new blocks a request needs before it opens a sequence. */
int prefix_peek(const prefix_cache *pc, const int *tokens, int n_tokens, int max_blocks, int *n_shared);

/* Records tokens[0, n_tokens) of a sequence whose KV sits in blocks[0, ceil(n_tokens / KV_BLOCK)) (blocks
 * it holds) and whose state slot holds the state after exactly n_tokens tokens, with a snapshot at
 * n_tokens. The tree takes its own references; the sequence keeps its own. A no-op without a budget. */
int prefix_insert(prefix_cache *pc, const int *tokens, int n_tokens, const int *blocks, int slot, char *err,
                  size_t errlen);

/* Empties the tree: every tree reference is dropped (blocks no sequence holds go back to the pool). */
void prefix_clear(prefix_cache *pc);

/* The next position after pos (up to and including end) where a snapshot is wanted: the smallest of the
 * caller's marks (e.g. each <|im_start|> position; any order) in (pos, end], the next multiple of
 * the interval, and end itself. A chunked prefill stops its chunk there and calls prefix_insert. */
int prefix_next_snapshot(const prefix_cache *pc, const int *marks, int n_marks, int pos, int end);

/* Free blocks plus blocks only the cache holds (what an admission may count on). */
int prefix_available_blocks(const prefix_cache *pc);
void prefix_get_stats(const prefix_cache *pc, prefix_stats *s);
/* Reference count of one block (tests, asserts). */
int prefix_block_refs(const prefix_cache *pc, int block);
/* Checks every invariant of the tree, the LRU list, the counts and the free list (tests; allocates).
 * 0 or CINFER_ESTATE with the first violation. */
int prefix_check(const prefix_cache *pc, char *err, size_t errlen);

#endif

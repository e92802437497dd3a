/* test_prefix.c — the prefix cache over small synthetic pools. A simulated forward writes every KV row and
 * the DeltaNet state as a hash of the token path that produced it, so a wrong block mapping, a shared block
 * written by another sequence or a snapshot from another path shows up as a wrong row or a wrong state. */
#include <stdint.h>
#include <stdlib.h>

#include "cinfer.h"
#include "runtime/prefix.h"
#include "test.h"
#include "util/alloc.h"

/* geometry: 2 attention layers of kv_dim 3; 2 DeltaNet layers with conv 3 x 2 and S 2 x 2 x 2 */
#define T_KV_LAYERS 2
#define T_KV_DIM    3
#define T_LIN       2
#define T_CONV_LEN  3
#define T_CONV_DIM  2
#define T_HV        2
#define T_DK        2
#define T_DV        2
#define T_SLOTS     8
#define SNAP_BYTES  ((size_t)T_LIN * (T_CONV_LEN * T_CONV_DIM + T_HV * T_DK * T_DV) * sizeof(float))
#define MAXT        1024
#define MAXB        (MAXT / KV_BLOCK)

typedef struct world {
    kv_pool kv;
    state_pool st;
    prefix_cache *pc;
} world;

typedef struct seq {
    int open;
    int tokens[MAXT];
    int len;
    int blocks[MAXB];
    int nblk;
    int slot;
} seq;

static int world_init(world *w, int n_blocks, size_t budget, int max_nodes, int interval) {
    char err[256];
    if (kv_pool_init(&w->kv, T_KV_LAYERS, n_blocks, T_KV_DIM, err, sizeof err)) return -1;
    if (state_pool_init(&w->st, T_SLOTS, T_LIN, T_CONV_LEN, T_CONV_DIM, T_HV, T_DK, T_DV, err, sizeof err))
        return -1;
    prefix_params p = {budget, max_nodes, interval};
    if (prefix_create(&w->kv, &w->st, &p, &w->pc, err, sizeof err)) {
        fprintf(stderr, "prefix_create: %s\n", err);
        return -1;
    }
    return 0;
}

static void world_free(world *w) {
    prefix_destroy(w->pc);
    kv_pool_free(&w->kv);
    state_pool_free(&w->st);
}

static int world_ok(world *w) {
    char err[256];
    int rc = prefix_check(w->pc, err, sizeof err);
    if (rc) fprintf(stderr, "  prefix_check: %s\n", err);
    return rc == 0;
}

/* h(path) for the first n tokens: the value behind the KV row of position n-1 and the state after n */
static uint64_t path_hash(const int *t, int n) {
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < n; i++) {
        h ^= (uint64_t)(uint32_t)t[i] + 0x632be59bd9b4e019ull;
        h *= 0xff51afd7ed558ccdull;
        h ^= h >> 29;
    }
    return h;
}

static float hval(uint64_t h, int i) {
    uint64_t x = h + (uint64_t)(i + 1) * 0xd6e8feb86659fd93ull;
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    return (float)(x >> 41); /* < 2^23: an exact integer in f32 */
}

static float *k_row(world *w, int l, int b, int r) {
    return w->kv.k + (((size_t)l * w->kv.n_blocks + (size_t)b) * KV_BLOCK + (size_t)r) * T_KV_DIM;
}
static float *v_row(world *w, int l, int b, int r) {
    return w->kv.v + (((size_t)l * w->kv.n_blocks + (size_t)b) * KV_BLOCK + (size_t)r) * T_KV_DIM;
}

static void write_state(world *w, int slot, uint64_t h) {
    for (int l = 0; l < T_LIN; l++) {
        float *c = state_conv(&w->st, slot, l), *s = state_rec(&w->st, slot, l);
        for (size_t i = 0; i < w->st.conv_floats; i++) c[i] = hval(h, 1000 * l + (int)i);
        for (size_t i = 0; i < w->st.rec_floats; i++) s[i] = hval(h, 1000 * l + 500 + (int)i);
    }
}

static int state_matches(world *w, int slot, uint64_t h) {
    for (int l = 0; l < T_LIN; l++) {
        const float *c = state_conv(&w->st, slot, l), *s = state_rec(&w->st, slot, l);
        for (size_t i = 0; i < w->st.conv_floats; i++)
            if (c[i] != hval(h, 1000 * l + (int)i)) return 0;
        for (size_t i = 0; i < w->st.rec_floats; i++)
            if (s[i] != hval(h, 1000 * l + 500 + (int)i)) return 0;
    }
    return 1;
}

/* Every KV row of the sequence and its state are those of its own token path. */
static int seq_consistent(world *w, const seq *s) {
    for (int p = 0; p < s->len; p++) {
        uint64_t h = path_hash(s->tokens, p + 1);
        int b = s->blocks[p / KV_BLOCK], r = p % KV_BLOCK;
        for (int l = 0; l < T_KV_LAYERS; l++)
            for (int i = 0; i < T_KV_DIM; i++)
                if (k_row(w, l, b, r)[i] != hval(h, l * 16 + i) ||
                    v_row(w, l, b, r)[i] != hval(h, 100 + l * 16 + i))
                    return 0;
    }
    return state_matches(w, s->slot, path_hash(s->tokens, s->len));
}

static int seq_open(world *w, seq *s) {
    memset(s, 0, sizeof *s);
    s->slot = state_alloc_slot(&w->st);
    if (s->slot < 0) return -1;
    s->open = 1;
    write_state(w, s->slot, path_hash(NULL, 0));
    return 0;
}

/* Lookup for a prompt of n tokens (at least one left to prefill); the prompt is copied into the sequence. */
static int seq_resume(world *w, seq *s, const int *prompt, int n, prefix_hit *hit) {
    char err[256];
    memcpy(s->tokens, prompt, (size_t)n * sizeof(int));
    int rc = prefix_lookup(w->pc, prompt, n - 1, s->blocks, MAXB, s->slot, hit, err, sizeof err);
    if (rc) return rc;
    s->len = hit->n_tokens;
    s->nblk = hit->n_blocks;
    return 0;
}

/* The simulated forward of tokens [len, len + cnt) (already in s->tokens): blocks from the cache's
 * allocator, a KV row per position, the state after the last one. */
static int seq_feed(world *w, seq *s, int cnt) {
    int need = (s->len + cnt + KV_BLOCK - 1) / KV_BLOCK;
    while (s->nblk < need) {
        int b = prefix_alloc_block(w->pc);
        if (b < 0) return -1;
        s->blocks[s->nblk++] = b;
    }
    for (int p = s->len; p < s->len + cnt; p++) {
        uint64_t h = path_hash(s->tokens, p + 1);
        int b = s->blocks[p / KV_BLOCK], r = p % KV_BLOCK;
        for (int l = 0; l < T_KV_LAYERS; l++)
            for (int i = 0; i < T_KV_DIM; i++) {
                k_row(w, l, b, r)[i] = hval(h, l * 16 + i);
                v_row(w, l, b, r)[i] = hval(h, 100 + l * 16 + i);
            }
    }
    s->len += cnt;
    write_state(w, s->slot, path_hash(s->tokens, s->len));
    return 0;
}

static int seq_insert(world *w, seq *s) {
    char err[256];
    int rc = prefix_insert(w->pc, s->tokens, s->len, s->blocks, s->slot, err, sizeof err);
    if (rc) fprintf(stderr, "  prefix_insert: %s\n", err);
    return rc;
}

static void seq_close(world *w, seq *s) {
    if (!s->open) return;
    prefix_release_blocks(w->pc, s->blocks, s->nblk);
    state_free_slot(&w->st, s->slot);
    s->open = 0;
}

/* A whole request: lookup, prefill the rest with snapshots at `marks`, close. Returns the hit length. */
static int run_prompt(world *w, const int *prompt, int n, const int *marks, int n_marks) {
    seq s;
    prefix_hit hit;
    if (seq_open(w, &s) || seq_resume(w, &s, prompt, n, &hit)) return -1;
    while (s.len < n) {
        int to = prefix_next_snapshot(w->pc, marks, n_marks, s.len, n);
        if (seq_feed(w, &s, to - s.len) || seq_insert(w, &s)) return -1;
    }
    int ok = seq_consistent(w, &s);
    seq_close(w, &s);
    return ok ? hit.n_tokens : -1;
}

static int lookup_len(world *w, const int *prompt, int n) {
    seq s;
    prefix_hit hit;
    if (seq_open(w, &s) || seq_resume(w, &s, prompt, n, &hit)) return -1;
    int ok = seq_consistent(w, &s);
    seq_close(w, &s);
    return ok ? hit.n_tokens : -2;
}

static void fill(int *t, int from, int to, int base) {
    for (int i = from; i < to; i++) t[i] = base + i;
}

/* ---- tests ---- */

TEST(prefix_longest_match_and_mid_block_divergence) {
    world w;
    REQUIRE(world_init(&w, 64, 64 * SNAP_BYTES, 0, 0) == 0);
    seq a, b, c;
    prefix_hit hit;
    int pa[64], pb[64], pc_[64];
    fill(pa, 0, 40, 100);
    /* A: 40 tokens, snapshots at 20 and 40 */
    REQUIRE(seq_open(&w, &a) == 0 && seq_resume(&w, &a, pa, 40, &hit) == 0);
    CHECK_EQ_INT(hit.n_tokens, 0);
    REQUIRE(seq_feed(&w, &a, 20) == 0 && seq_insert(&w, &a) == 0);
    REQUIRE(seq_feed(&w, &a, 20) == 0 && seq_insert(&w, &a) == 0);
    CHECK(world_ok(&w));

    /* B shares 37 tokens with A (diverges inside block 2): it resumes at the snapshot at 20, not at 37 */
    memcpy(pb, pa, 37 * sizeof(int));
    fill(pb, 37, 50, 900);
    REQUIRE(seq_open(&w, &b) == 0 && seq_resume(&w, &b, pb, 50, &hit) == 0);
    CHECK_EQ_INT(hit.n_tokens, 20);
    CHECK_EQ_INT(hit.n_blocks, 2);
    CHECK_EQ_INT(hit.n_shared, 1);
    CHECK_EQ_INT(b.blocks[0], a.blocks[0]);                /* full block: shared */
    CHECK(b.blocks[1] != a.blocks[1]);                     /* partial block: copied */
    CHECK_EQ_INT(prefix_block_refs(w.pc, a.blocks[0]), 3); /* A, the node [0,20), B */
    CHECK(seq_consistent(&w, &b));
    REQUIRE(seq_feed(&w, &b, 30) == 0); /* B writes rows 4.. of its copy: A's block 1 must stay A's */
    CHECK(seq_consistent(&w, &a));
    CHECK(seq_consistent(&w, &b));
    REQUIRE(seq_insert(&w, &b) == 0); /* splits A's run [20,40) at 37 */
    CHECK(world_ok(&w));

    /* C extends B: resumes at 50 with A's blocks 0 and 1, B's block 2 (the deeper node's), a copy of B's 3 */
    memcpy(pc_, pb, 50 * sizeof(int));
    fill(pc_, 50, 60, 2000);
    REQUIRE(seq_open(&w, &c) == 0 && seq_resume(&w, &c, pc_, 60, &hit) == 0);
    CHECK_EQ_INT(hit.n_tokens, 50);
    CHECK_EQ_INT(hit.n_blocks, 4);
    CHECK_EQ_INT(hit.n_shared, 3);
    CHECK_EQ_INT(c.blocks[0], a.blocks[0]);
    CHECK_EQ_INT(c.blocks[1], a.blocks[1]);
    CHECK_EQ_INT(c.blocks[2], b.blocks[2]);
    CHECK(c.blocks[3] != b.blocks[3]);
    CHECK(seq_consistent(&w, &c));
    REQUIRE(seq_feed(&w, &c, 10) == 0);
    CHECK(seq_consistent(&w, &a) && seq_consistent(&w, &b) && seq_consistent(&w, &c));
    seq_close(&w, &c);

    /* A's whole prompt plus more: resumes at 40 (block 2 copied: 8 rows) */
    int pd[64];
    memcpy(pd, pa, 40 * sizeof(int));
    fill(pd, 40, 45, 3000);
    CHECK_EQ_INT(lookup_len(&w, pd, 45), 40);
    /* 30 matching tokens then something else: only the snapshot at 20 can be resumed */
    int pe[64];
    memcpy(pe, pa, 30 * sizeof(int));
    fill(pe, 30, 44, 4000);
    CHECK_EQ_INT(lookup_len(&w, pe, 44), 20);
    /* exactly A's prompt: one token must be left to prefill, so the snapshot at 40 is out of reach */
    CHECK_EQ_INT(lookup_len(&w, pa, 40), 20);
    /* diverging at token 0: a miss */
    int pf[8] = {7, 8, 9, 10, 11, 12, 13, 14};
    CHECK_EQ_INT(lookup_len(&w, pf, 8), 0);
    /* diverging at the split point 37 with a token neither A nor B has: the snapshot at 20 */
    int pg[64];
    memcpy(pg, pa, 37 * sizeof(int));
    fill(pg, 37, 60, 5000);
    CHECK_EQ_INT(lookup_len(&w, pg, 60), 20);

    prefix_stats st;
    prefix_get_stats(w.pc, &st);
    CHECK_EQ_INT(st.hits, 6);   /* B, C, pd, pe, pa, pg */
    CHECK_EQ_INT(st.misses, 2); /* A, pf */
    CHECK_EQ_INT(st.tokens_served, 20 + 50 + 40 + 20 + 20 + 20);
    seq_close(&w, &a);
    seq_close(&w, &b);
    CHECK(world_ok(&w));
    world_free(&w);
}

TEST(prefix_refcounts_return_every_block) {
    world w;
    REQUIRE(world_init(&w, 48, 32 * SNAP_BYTES, 0, 24) == 0);
    int p[200];
    fill(p, 0, 200, 10);
    int marks[] = {33, 70};
    CHECK_EQ_INT(run_prompt(&w, p, 150, marks, 2), 0);
    /* the same conversation, longer: resumes at the deepest snapshot before 199 (150) */
    CHECK_EQ_INT(run_prompt(&w, p, 200, marks, 2), 150);
    int q[120];
    memcpy(q, p, 50 * sizeof(int));
    fill(q, 50, 120, 7000);
    CHECK_EQ_INT(run_prompt(&w, q, 120, NULL, 0), 48); /* snapshots every 24: 24, 33, 48 are on q's path */
    CHECK(world_ok(&w));
    prefix_stats st;
    prefix_get_stats(w.pc, &st);
    /* no sequence is open: everything the tree holds is cache-only, and the rest of the pool is free */
    CHECK_EQ_INT(st.blocks_cache_only, st.blocks_cached);
    CHECK_EQ_INT(w.kv.n_free + st.blocks_cached, 48);
    CHECK_EQ_INT(prefix_available_blocks(w.pc), 48);
    /* open sequences hold references across a clear; their release returns the blocks */
    seq s;
    prefix_hit hit;
    REQUIRE(seq_open(&w, &s) == 0 && seq_resume(&w, &s, p, 200, &hit) == 0);
    CHECK_EQ_INT(hit.n_tokens, 192);
    prefix_clear(w.pc);
    CHECK(world_ok(&w));
    CHECK(seq_consistent(&w, &s));
    CHECK_EQ_INT(w.kv.n_free, 48 - s.nblk);
    seq_close(&w, &s);
    CHECK_EQ_INT(w.kv.n_free, 48);
    for (int b = 0; b < 48; b++) CHECK_EQ_INT(prefix_block_refs(w.pc, b), 0);
    prefix_get_stats(w.pc, &st);
    CHECK_EQ_INT(st.n_nodes, 1);
    CHECK_EQ_INT(st.n_snapshots, 0);
    CHECK_EQ_INT(st.blocks_cached, 0);
    world_free(&w);
}

TEST(prefix_lru_eviction_under_tiny_budget) {
    world w;
    REQUIRE(world_init(&w, 64, 3 * SNAP_BYTES + SNAP_BYTES / 2, 0, 0) == 0);
    int p[6][21];
    for (int i = 0; i < 6; i++) fill(p[i], 0, 21, 1000 * (i + 1));
    int mark[] = {20};
    for (int i = 0; i < 3; i++)
        CHECK_EQ_INT(run_prompt(&w, p[i], 21, mark, 1), 0); /* snapshots at 20 and 21 */
    prefix_stats st;
    prefix_get_stats(w.pc, &st);
    CHECK_EQ_INT(st.max_snapshots, 3);
    CHECK_EQ_INT(st.n_snapshots, 3);
    /* 6 inserts into 3 slots: p0@20, p0@21, p1@20 evicted in that order; p0's path pruned entirely */
    CHECK_EQ_INT(st.evicted_snapshots, 3);
    CHECK_EQ_INT(lookup_len(&w, p[0], 21), 0);
    CHECK_EQ_INT(lookup_len(&w, p[1], 21), 0); /* p1@21 is left, out of reach of a 21-token prompt */
    CHECK_EQ_INT(lookup_len(&w, p[2], 21), 20);
    world_free(&w);

    /* one snapshot per prompt: p0, p1, p2 cached; a hit on p0 makes p1 the least recently used */
    REQUIRE(world_init(&w, 64, 3 * SNAP_BYTES + SNAP_BYTES / 2, 0, 0) == 0);
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(run_prompt(&w, p[i], 20, NULL, 0), 0);
    CHECK_EQ_INT(lookup_len(&w, p[0], 21), 20);
    CHECK_EQ_INT(run_prompt(&w, p[3], 20, NULL, 0), 0); /* evicts p1 */
    CHECK_EQ_INT(lookup_len(&w, p[1], 21), 0);
    CHECK_EQ_INT(w.kv.n_free, 64 - 3 * 2); /* p1's two blocks went back with its snapshot */
    /* order of use now (oldest first): p2, p0, p3 → lookups p2, p0, p3 make it p2, p0, p3 again */
    CHECK_EQ_INT(lookup_len(&w, p[2], 21), 20);
    CHECK_EQ_INT(lookup_len(&w, p[0], 21), 20);
    CHECK_EQ_INT(lookup_len(&w, p[3], 21), 20);
    CHECK_EQ_INT(run_prompt(&w, p[4], 20, NULL, 0), 0); /* evicts p2 */
    CHECK_EQ_INT(run_prompt(&w, p[5], 20, NULL, 0), 0); /* evicts p0 */
    CHECK_EQ_INT(lookup_len(&w, p[2], 21), 0);
    CHECK_EQ_INT(lookup_len(&w, p[0], 21), 0);
    CHECK_EQ_INT(lookup_len(&w, p[3], 21), 20);
    CHECK_EQ_INT(lookup_len(&w, p[4], 21), 20);
    CHECK_EQ_INT(lookup_len(&w, p[5], 21), 20);
    prefix_get_stats(w.pc, &st);
    CHECK_EQ_INT(st.evicted_snapshots, 3);
    CHECK_EQ_INT(st.evicted_blocks, 6);
    CHECK(world_ok(&w));
    world_free(&w);
}

TEST(prefix_evicted_snapshot_limits_reuse_to_the_last_one_before) {
    world w;
    REQUIRE(world_init(&w, 64, 3 * SNAP_BYTES, 0, 16) == 0);
    int p[60], q[20];
    fill(p, 0, 60, 50);
    fill(q, 0, 20, 9000);
    CHECK_EQ_INT(run_prompt(&w, p, 48, NULL, 0), 0); /* snapshots at 16, 32, 48 */
    CHECK_EQ_INT(w.kv.n_free, 64 - 3);
    /* a new snapshot evicts the one at 16: an inner one, so every block stays and 48 is still served */
    CHECK_EQ_INT(run_prompt(&w, q, 16, NULL, 0), 0);
    CHECK_EQ_INT(w.kv.n_free, 64 - 3 - 1);
    CHECK_EQ_INT(lookup_len(&w, p, 60), 48);
    CHECK(world_ok(&w));
    /* the next evicts 32 (48 was just used): still 48 */
    int r[20];
    fill(r, 0, 20, 11000);
    CHECK_EQ_INT(run_prompt(&w, r, 16, NULL, 0), 0);
    CHECK_EQ_INT(lookup_len(&w, p, 60), 48);
    CHECK_EQ_INT(lookup_len(&w, p, 40), 0); /* 32 is gone and 16 too: the blocks alone do not make a hit */
    /* and the next evicts q@16, then 48 goes: p's path has no snapshot left, its 3 blocks return */
    int s2[20], s3[20];
    fill(s2, 0, 20, 13000);
    fill(s3, 0, 20, 15000);
    CHECK_EQ_INT(lookup_len(&w, r, 17), 16);
    CHECK_EQ_INT(run_prompt(&w, s2, 16, NULL, 0), 0); /* evicts q@16 */
    CHECK_EQ_INT(lookup_len(&w, q, 17), 0);
    CHECK_EQ_INT(run_prompt(&w, s3, 16, NULL, 0), 0); /* evicts p@48 */
    CHECK_EQ_INT(lookup_len(&w, p, 60), 0);
    CHECK_EQ_INT(w.kv.n_free, 64 - 3); /* r, s2, s3 */
    CHECK(world_ok(&w));
    world_free(&w);
}

TEST(prefix_byte_accounting_exact) {
    world w;
    /* a budget one byte short of 5 snapshots holds 4 */
    REQUIRE(world_init(&w, 64, 5 * SNAP_BYTES - 1, 0, 0) == 0);
    prefix_stats st;
    prefix_get_stats(w.pc, &st);
    CHECK_EQ_INT(st.bytes_per_snapshot,
                 (2 * (3 * 2 + 2 * 2 * 2)) * 4); /* 112: conv 3x2 + S 2x2x2 per layer, f32 */
    CHECK_EQ_INT(st.max_snapshots, 4);
    CHECK_EQ_INT(st.snapshot_bytes, 0);
    int p[8][40];
    for (int i = 0; i < 8; i++) fill(p[i], 0, 40, 100 * (i + 1));
    for (int i = 0; i < 6; i++) {
        run_prompt(&w, p[i], 20 + i, NULL, 0);
        prefix_get_stats(w.pc, &st);
        int n = i + 1 < 4 ? i + 1 : 4;
        CHECK_EQ_INT(st.n_snapshots, n);
        CHECK_EQ_INT(st.snapshot_bytes, (size_t)n * 112);
        CHECK(st.snapshot_bytes <= 5 * SNAP_BYTES - 1);
        /* blocks: prompt i has ceil((20 + i) / 16) = 2 blocks, the cached ones are those of the last 4 */
        CHECK_EQ_INT(st.blocks_cached, 2 * n);
        CHECK_EQ_INT(st.kv_bytes_cached, (size_t)2 * n * 2 * T_KV_LAYERS * KV_BLOCK * T_KV_DIM * 4);
    }
    CHECK_EQ_INT(st.inserts, 6);
    CHECK_EQ_INT(st.evicted_snapshots, 2);
    world_free(&w);

    /* a budget below one snapshot is refused with the sizes in the message; 0 disables caching */
    kv_pool kv;
    state_pool sp;
    char err[256];
    REQUIRE(kv_pool_init(&kv, T_KV_LAYERS, 8, T_KV_DIM, err, sizeof err) == 0);
    REQUIRE(state_pool_init(&sp, 2, T_LIN, T_CONV_LEN, T_CONV_DIM, T_HV, T_DK, T_DV, err, sizeof err) == 0);
    prefix_cache *pc = NULL;
    prefix_params pp = {SNAP_BYTES - 1, 0, 0};
    CHECK_EQ_INT(prefix_create(&kv, &sp, &pp, &pc, err, sizeof err), CINFER_EINVAL);
    CHECK_STR_CONTAINS(err, "112 bytes");
    kv_pool_free(&kv);
    state_pool_free(&sp);

    REQUIRE(world_init(&w, 8, 0, 0, 0) == 0);
    CHECK_EQ_INT(run_prompt(&w, p[0], 40, NULL, 0), 0);
    CHECK_EQ_INT(run_prompt(&w, p[0], 40, NULL, 0), 0);
    prefix_get_stats(w.pc, &st);
    CHECK_EQ_INT(st.n_snapshots + st.blocks_cached + st.inserts, 0);
    CHECK_EQ_INT(st.misses, 2);
    CHECK_EQ_INT(w.kv.n_free, 8);
    world_free(&w);
}

TEST(prefix_alloc_evicts_cache_only_blocks_lru) {
    world w;
    REQUIRE(world_init(&w, 8, 16 * SNAP_BYTES, 0, 0) == 0);
    int a[41], b[41], c[130];
    fill(a, 0, 41, 100);
    fill(b, 0, 41, 200);
    fill(c, 0, 130, 300);
    CHECK_EQ_INT(run_prompt(&w, a, 40, NULL, 0), 0); /* 3 blocks each */
    CHECK_EQ_INT(run_prompt(&w, b, 40, NULL, 0), 0);
    CHECK_EQ_INT(w.kv.n_free, 2);
    CHECK_EQ_INT(prefix_available_blocks(w.pc), 8);
    /* a sequence of 4 blocks: 2 free, then a's leaf (the older) goes and its 3 blocks come back */
    seq s;
    REQUIRE(seq_open(&w, &s) == 0);
    fill(s.tokens, 0, 64, 400);
    REQUIRE(seq_feed(&w, &s, 64) == 0);
    CHECK_EQ_INT(w.kv.n_free, 1);
    CHECK(seq_consistent(&w, &s));
    CHECK(world_ok(&w));
    CHECK_EQ_INT(lookup_len(&w, a, 41), 0);
    CHECK_EQ_INT(lookup_len(&w, b, 41), 40);
    /* more than free + cache-only: b is evicted too, and the last allocation fails with nothing left */
    REQUIRE(seq_feed(&w, &s, 64) == 0);
    CHECK_EQ_INT(w.kv.n_free, 0);
    CHECK_EQ_INT(lookup_len(&w, b, 41), 0);
    CHECK_EQ_INT(prefix_alloc_block(w.pc), -1);
    prefix_stats st;
    prefix_get_stats(w.pc, &st);
    CHECK_EQ_INT(st.evicted_blocks, 6);
    CHECK_EQ_INT(st.n_snapshots, 0);
    seq_close(&w, &s);
    CHECK_EQ_INT(w.kv.n_free, 8);
    /* a hit whose partial block cannot be copied: ENOMEM and nothing taken */
    CHECK_EQ_INT(run_prompt(&w, c, 120, NULL, 0), 0); /* 8 blocks, the last partial */
    seq t;
    prefix_hit hit;
    char err[128];
    REQUIRE(seq_open(&w, &t) == 0);
    CHECK_EQ_INT(prefix_lookup(w.pc, c, 129, t.blocks, MAXB, t.slot, &hit, err, sizeof err), CINFER_ENOMEM);
    CHECK_EQ_INT(hit.n_tokens, 0);
    CHECK_EQ_INT(w.kv.n_free, 0);
    CHECK(world_ok(&w));
    for (int i = 0; i < 8; i++) CHECK_EQ_INT(prefix_block_refs(w.pc, i), 1); /* the tree's references only */
    state_free_slot(&w.st, t.slot);
    world_free(&w);
}

TEST(prefix_long_runs_become_chains) {
    world w;
    REQUIRE(world_init(&w, 128, 8 * SNAP_BYTES, 0, 0) == 0);
    static int p[MAXT];
    fill(p, 0, 900, 1);
    int marks[] = {300, 700};
    CHECK_EQ_INT(run_prompt(&w, p, 800, marks, 2), 0);
    prefix_stats st;
    prefix_get_stats(w.pc, &st);
    /* [0,256) [256,300) | [300,544) [544,700) | [700,800): a node touches at most 16 block indices */
    CHECK_EQ_INT(st.n_nodes, 6);
    CHECK_EQ_INT(st.blocks_cached, 50);
    CHECK(world_ok(&w));
    CHECK_EQ_INT(lookup_len(&w, p, 900), 800);
    CHECK_EQ_INT(lookup_len(&w, p, 800), 700);
    CHECK_EQ_INT(lookup_len(&w, p, 600), 300);
    CHECK_EQ_INT(lookup_len(&w, p, 300), 0);
    /* a node pool too small for the chain: the insert fails cleanly and the tree stays whole */
    world_free(&w);
    REQUIRE(world_init(&w, 128, 8 * SNAP_BYTES, 2, 0) == 0);
    seq s;
    REQUIRE(seq_open(&w, &s) == 0);
    memcpy(s.tokens, p, 300 * sizeof(int));
    REQUIRE(seq_feed(&w, &s, 300) == 0);
    char err[128];
    CHECK_EQ_INT(prefix_insert(w.pc, s.tokens, 300, s.blocks, s.slot, err, sizeof err), CINFER_ENOMEM);
    CHECK(world_ok(&w));
    s.len = 200; /* a snapshot inside the first 256 tokens fits in one node */
    write_state(&w, s.slot, path_hash(s.tokens, 200));
    CHECK_EQ_INT(seq_insert(&w, &s), 0);
    seq_close(&w, &s);
    CHECK_EQ_INT(lookup_len(&w, p, 300), 200);
    CHECK(world_ok(&w));
    world_free(&w);
}

TEST(prefix_node_pool_exhaustion_evicts_lru_leaves) {
    world w;
    REQUIRE(world_init(&w, 64, 16 * SNAP_BYTES, 4, 0) == 0); /* root + 3 nodes */
    int p[5][20];
    for (int i = 0; i < 5; i++) fill(p[i], 0, 20, 100 * (i + 1));
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(run_prompt(&w, p[i], 18, NULL, 0), 0);
    CHECK_EQ_INT(lookup_len(&w, p[0], 19), 18);
    CHECK_EQ_INT(run_prompt(&w, p[3], 18, NULL, 0), 0); /* needs a node: p1's leaf goes */
    CHECK_EQ_INT(lookup_len(&w, p[1], 19), 0);
    CHECK_EQ_INT(lookup_len(&w, p[0], 19), 18);
    CHECK_EQ_INT(lookup_len(&w, p[2], 19), 18);
    CHECK_EQ_INT(lookup_len(&w, p[3], 19), 18);
    /* splitting p3 at 10 needs a node too: the least recent leaf (p0) goes */
    int q[20];
    memcpy(q, p[3], 10 * sizeof(int));
    fill(q, 10, 20, 7777);
    CHECK_EQ_INT(run_prompt(&w, q, 10, NULL, 0), 0);
    CHECK_EQ_INT(lookup_len(&w, p[0], 19), 0);
    CHECK_EQ_INT(lookup_len(&w, p[3], 19), 18);
    CHECK_EQ_INT(lookup_len(&w, q, 19), 10);
    CHECK(world_ok(&w));
    world_free(&w);
}

TEST(prefix_bad_arguments) {
    world w;
    REQUIRE(world_init(&w, 16, 4 * SNAP_BYTES, 0, 0) == 0);
    char err[128];
    int t[20], blocks[4] = {3, 5, 0, 0};
    fill(t, 0, 20, 1);
    prefix_hit hit;
    seq s;
    REQUIRE(seq_open(&w, &s) == 0);
    /* blocks the sequence does not hold */
    CHECK_EQ_INT(prefix_insert(w.pc, t, 20, blocks, s.slot, err, sizeof err), CINFER_EINVAL);
    blocks[0] = 99;
    CHECK_EQ_INT(prefix_insert(w.pc, t, 20, blocks, s.slot, err, sizeof err), CINFER_EINVAL);
    /* a slot not in use */
    CHECK_EQ_INT(prefix_lookup(w.pc, t, 20, blocks, 4, 7, &hit, err, sizeof err), CINFER_EINVAL);
    CHECK_EQ_INT(prefix_lookup(w.pc, t, 20, blocks, 4, -1, &hit, err, sizeof err), CINFER_EINVAL);
    /* a table too short for the cached prefix: the hit is capped to what it can map */
    memcpy(s.tokens, t, sizeof t);
    REQUIRE(seq_feed(&w, &s, 20) == 0 && seq_insert(&w, &s) == 0);
    s.len = 16;
    write_state(&w, s.slot, path_hash(s.tokens, 16));
    REQUIRE(seq_insert(&w, &s) == 0);
    seq_close(&w, &s);
    int t2[30];
    memcpy(t2, t, sizeof t);
    fill(t2, 20, 30, 50);
    seq u;
    REQUIRE(seq_open(&w, &u) == 0);
    CHECK_EQ_INT(prefix_lookup(w.pc, t2, 29, u.blocks, 1, u.slot, &hit, err, sizeof err), 0);
    CHECK_EQ_INT(hit.n_tokens, 16);
    u.nblk = hit.n_blocks;
    /* again with room for two blocks (a second reference on block 0, a copy of block 1) */
    CHECK_EQ_INT(prefix_lookup(w.pc, t2, 29, u.blocks, 2, u.slot, &hit, err, sizeof err), 0);
    CHECK_EQ_INT(hit.n_tokens, 20);
    CHECK_EQ_INT(prefix_block_refs(w.pc, u.blocks[0]), 3);
    prefix_release_blocks(w.pc, u.blocks, hit.n_blocks);
    seq_close(&w, &u); /* the first hit's reference */
    CHECK(world_ok(&w));
    prefix_clear(w.pc);
    CHECK_EQ_INT(w.kv.n_free, 16);
    world_free(&w);
}

TEST(prefix_next_snapshot_positions) {
    world w;
    REQUIRE(world_init(&w, 4, 0, 0, 100) == 0);
    int marks[] = {250, 40, 7};
    CHECK_EQ_INT(prefix_next_snapshot(w.pc, marks, 3, 0, 500), 7);
    CHECK_EQ_INT(prefix_next_snapshot(w.pc, marks, 3, 7, 500), 40);
    CHECK_EQ_INT(prefix_next_snapshot(w.pc, marks, 3, 40, 500), 100);
    CHECK_EQ_INT(prefix_next_snapshot(w.pc, marks, 3, 100, 500), 200);
    CHECK_EQ_INT(prefix_next_snapshot(w.pc, marks, 3, 200, 500), 250);
    CHECK_EQ_INT(prefix_next_snapshot(w.pc, marks, 3, 450, 480), 480);
    CHECK_EQ_INT(prefix_next_snapshot(w.pc, marks, 3, 0, 5), 5);
    CHECK_EQ_INT(prefix_next_snapshot(w.pc, NULL, 0, 99, 1000), 100);
    world_free(&w);
}

/* ---- property test: random requests against a reference model ---- */

typedef struct model_entry {
    int tokens[MAXT];
    int len;
    long last_use;
} model_entry;

typedef struct ref_model {
    model_entry *e;
    int n, cap;
    long tick;
} ref_model;

static int model_find(const ref_model *m, const int *t, int len) {
    for (int i = 0; i < m->n; i++)
        if (m->e[i].len == len && !memcmp(m->e[i].tokens, t, (size_t)len * sizeof(int))) return i;
    return -1;
}

static void model_insert(ref_model *m, const int *t, int len) {
    int i = model_find(m, t, len);
    if (i < 0) {
        if (m->n == m->cap) {
            int lru = 0;
            for (int j = 1; j < m->n; j++)
                if (m->e[j].last_use < m->e[lru].last_use) lru = j;
            m->e[lru] = m->e[--m->n];
        }
        i = m->n++;
        memcpy(m->e[i].tokens, t, (size_t)len * sizeof(int));
        m->e[i].len = len;
    }
    m->e[i].last_use = ++m->tick;
}

static int model_lookup(ref_model *m, const int *t, int n, int touch) {
    int best = -1;
    for (int i = 0; i < m->n; i++)
        if (m->e[i].len <= n && !memcmp(m->e[i].tokens, t, (size_t)m->e[i].len * sizeof(int)) &&
            (best < 0 || m->e[i].len > m->e[best].len))
            best = i;
    if (best < 0) return 0;
    if (touch) m->e[best].last_use = ++m->tick;
    return m->e[best].len;
}

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

#define N_HIST     16
#define MAX_PROMPT 120

/* A prompt that often extends an earlier one whole (the next turn of a chat) or branches off it (a shared
 * system prompt, an edited message), with a tiny alphabet so that branches share many tokens. */
static int make_prompt(uint64_t *r, int hist[N_HIST][MAX_PROMPT + 8], const int *hist_len, int *out) {
    int n = 0;
    int k = (int)(rng_next(r) % N_HIST);
    if (hist_len[k] > 0 && rng_next(r) % 4) {
        n = rng_next(r) % 2 ? hist_len[k] : (int)(rng_next(r) % (unsigned)(hist_len[k] + 1));
        memcpy(out, hist[k], (size_t)n * sizeof(int));
    }
    int add = 1 + (int)(rng_next(r) % 40);
    if (n + add > MAX_PROMPT) add = MAX_PROMPT - n;
    if (add < 1) add = 1, n--;
    for (int i = 0; i < add; i++) out[n + i] = (int)(rng_next(r) % 3);
    return n + add;
}

/* exact: a pool large enough that only the snapshot budget evicts, so the cache must equal an LRU set of
 * (token path, position) snapshots with longest-prefix lookup */
static void property_run(uint64_t seed, int n_blocks, int budget_snaps, int max_nodes, int exact) {
    world w;
    REQUIRE(world_init(&w, n_blocks, (size_t)budget_snaps * SNAP_BYTES, max_nodes, exact ? 0 : 24) == 0);
    ref_model m = {calloc((size_t)budget_snaps, sizeof(model_entry)), 0, budget_snaps, 0};
    static int hist[N_HIST][MAX_PROMPT + 8];
    int hist_len[N_HIST] = {0};
    static seq seqs[T_SLOTS];
    for (int i = 0; i < T_SLOTS; i++) seqs[i].open = 0;
    uint64_t r = seed;
    int fails = 0, hits = 0, long_hits = 0, copies = 0, dry = 0;
    for (int op = 0; op < 3000 && fails < 5; op++) {
        int i = (int)(rng_next(&r) % T_SLOTS);
        seq *s = &seqs[i];
        if (!s->open) {
            int p[MAX_PROMPT + 8];
            int n = make_prompt(&r, hist, hist_len, p);
            int h = (int)(rng_next(&r) % N_HIST);
            memcpy(hist[h], p, (size_t)n * sizeof(int));
            hist_len[h] = n;
            prefix_hit hit;
            if (seq_open(&w, s)) continue;
            int shared = -1, peek = prefix_peek(w.pc, p, n - 1, MAXB, &shared);
            int rc = seq_resume(&w, s, p, n, &hit);
            if (rc) { /* only with pool pressure: the partial block could not be copied */
                CHECK(!exact && rc == CINFER_ENOMEM);
                state_free_slot(&w.st, s->slot);
                s->open = 0;
                continue;
            }
            if (peek != hit.n_tokens || shared != hit.n_shared) {
                fails++;
                CHECK_MSG(0, "seed %llu op %d: peek %d/%d, lookup %d/%d", (unsigned long long)seed, op, peek,
                          shared, hit.n_tokens, hit.n_shared);
            }
            hits += hit.n_tokens > 0;
            long_hits += hit.n_tokens >= 2 * KV_BLOCK;
            copies += hit.n_blocks > hit.n_shared;
            if (exact) {
                int want = model_lookup(&m, p, n - 1, 1);
                if (hit.n_tokens != want) {
                    fails++;
                    CHECK_MSG(0, "seed %llu op %d: lookup gave %d, the model %d", (unsigned long long)seed,
                              op, hit.n_tokens, want);
                }
            }
            if (!seq_consistent(&w, s)) {
                fails++;
                CHECK_MSG(0, "seed %llu op %d: resumed sequence has foreign KV or state",
                          (unsigned long long)seed, op);
            }
            /* prefill with snapshots at a random mark, the interval, n - 1 and n */
            int marks[2] = {1 + (int)(rng_next(&r) % (unsigned)n), n - 1};
            while (s->len < n) {
                int to = prefix_next_snapshot(w.pc, marks, 2, s->len, n);
                if (seq_feed(&w, s, to - s->len)) {
                    CHECK(!exact);
                    seq_close(&w, s);
                    break;
                }
                int irc = seq_insert(&w, s);
                CHECK(irc == 0 || (!exact && irc == CINFER_ENOMEM));
                if (exact && irc == 0) model_insert(&m, s->tokens, s->len);
            }
        } else if (rng_next(&r) % 3 == 0) {
            /* a turn ends: sometimes its whole text is cached, then it closes */
            if (rng_next(&r) % 2 && s->len < MAXT) {
                int irc = seq_insert(&w, s);
                CHECK(irc == 0 || (!exact && irc == CINFER_ENOMEM));
                if (exact && irc == 0) model_insert(&m, s->tokens, s->len);
            }
            seq_close(&w, s);
        } else if (s->len + 4 <= MAX_PROMPT + 8 - 1) {
            /* decode a few tokens into its own blocks */
            int cnt = 1 + (int)(rng_next(&r) % 3);
            for (int k = 0; k < cnt; k++) s->tokens[s->len + k] = (int)(rng_next(&r) % 3);
            if (seq_feed(&w, s, cnt)) {
                CHECK(!exact);
                seq_close(&w, s);
            }
        }
        if (exact) {
            int k = (int)(rng_next(&r) % N_HIST), cut = hist_len[k] ? hist_len[k] - 1 : 0;
            int got = prefix_peek(w.pc, hist[k], cut, MAXB, NULL), want = model_lookup(&m, hist[k], cut, 0);
            if (got != want) {
                fails++;
                CHECK_MSG(0, "seed %llu op %d: peek gave %d, the model %d", (unsigned long long)seed, op, got,
                          want);
            }
        }
        dry += w.kv.n_free == 0; /* the pool ran dry: allocations had to evict */
        if (op % 97 == 0) {
            if (!world_ok(&w)) fails++;
            for (int j = 0; j < T_SLOTS; j++)
                if (seqs[j].open && !seq_consistent(&w, &seqs[j])) {
                    fails++;
                    CHECK_MSG(0, "seed %llu op %d: sequence %d was overwritten", (unsigned long long)seed, op,
                              j);
                }
        }
    }
    /* the workload does exercise shared blocks and copied partial blocks */
    CHECK_MSG(long_hits > 30 && copies > 50, "hits %d, of 32+ tokens %d, with a copied block %d", hits,
              long_hits, copies);
    CHECK(exact ? dry == 0 : dry > 100);
    for (int j = 0; j < T_SLOTS; j++) {
        if (seqs[j].open) CHECK(seq_consistent(&w, &seqs[j]));
        seq_close(&w, &seqs[j]);
    }
    CHECK(world_ok(&w));
    prefix_stats st;
    prefix_get_stats(w.pc, &st);
    CHECK_EQ_INT(st.blocks_cache_only, st.blocks_cached);
    CHECK_EQ_INT(w.kv.n_free + st.blocks_cached, n_blocks);
    if (exact) CHECK_EQ_INT(st.n_snapshots, m.n);
    prefix_clear(w.pc);
    CHECK_EQ_INT(w.kv.n_free, n_blocks);
    for (int b = 0; b < n_blocks; b++)
        if (prefix_block_refs(w.pc, b)) {
            CHECK_MSG(0, "block %d leaked", b);
            break;
        }
    free(m.e);
    world_free(&w);
}

TEST(prefix_property_matches_lru_model) {
    for (uint64_t seed = 1; seed <= 6; seed++) property_run(seed * 0x9e3779b97f4a7c15ull, 1024, 32, 0, 1);
}

TEST(prefix_property_under_pool_pressure) {
    /* few blocks and nodes: lookups, allocations and inserts evict; every hit must still be exact */
    for (uint64_t seed = 1; seed <= 6; seed++) property_run(seed * 0xbf58476d1ce4e5b9ull, 32, 40, 40, 0);
}

TEST(prefix_lookup_insert_release_do_not_allocate) {
    world w;
    REQUIRE(world_init(&w, 32, 4 * SNAP_BYTES, 12, 0) == 0);
    int p[100];
    fill(p, 0, 100, 3);
    int marks[] = {20, 50};
    CHECK_EQ_INT(run_prompt(&w, p, 60, marks, 2), 0); /* warm: the tree exists */
    long before = alloc_count();
    alloc_guard_arm(1);
    alloc_guard_begin();
    int r1 =
        run_prompt(&w, p, 100, marks, 2); /* lookup + copy, allocations, inserts with splits + eviction */
    int q[40];
    memcpy(q, p, 35 * sizeof(int));
    fill(q, 35, 40, 900);
    int r2 = run_prompt(&w, q, 40, NULL, 0);
    for (int k = 0; k < 6; k++) {
        int t[30];
        fill(t, 0, 30, 5000 * (k + 1));
        run_prompt(&w, t, 30, NULL, 0); /* snapshot and node eviction */
    }
    prefix_clear(w.pc);
    alloc_guard_end();
    alloc_guard_arm(0);
    CHECK_EQ_INT(alloc_count(), before);
    CHECK_EQ_INT(r1, 60);
    CHECK_EQ_INT(r2, 20);
    CHECK_EQ_INT(w.kv.n_free, 32);
    CHECK(world_ok(&w));
    world_free(&w);
}

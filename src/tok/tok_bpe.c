/* tok_bpe.c — the BPE model: string and pair hash maps, the merge loop (HF's: a min-heap of (rank, position)
 * over a linked list of symbols, stale entries recognised by the merged id), and a per-thread cache of
 * recent words. Byte-level pieces arrive as raw bytes (bl = 1) and start as one symbol per byte from a
 * 256-entry table, so the mapped string is never built on the hot path. */
#include <stdlib.h>
#include <string.h>

#include "tok/tok_internal.h"
#include "util/alloc.h"
#include "util/err.h"

/* ------------------------------------------------------------------ hashing */

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ull;
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ull;
    x ^= x >> 32;
    return x;
}

uint64_t tk_hash(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, s, 8);
        h = (h ^ mix64(v)) * 0x9E3779B97F4A7C15ull;
        s += 8;
        n -= 8;
    }
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v |= (uint64_t)s[i] << (8 * i);
    h = (h ^ mix64(v ^ n)) * 0x9E3779B97F4A7C15ull;
    return mix64(h);
}

void tk_strmap_build(tk_strmap *m, size_t n_expected) {
    size_t cap = 16;
    while (cap < n_expected * 2) cap *= 2;
    m->slots = xcalloc(cap, sizeof *m->slots);
    m->mask = cap - 1;
}

void tk_strmap_put(tk_strmap *m, uint32_t id, uint64_t h) {
    size_t i = (size_t)h & m->mask;
    while (m->slots[i]) i = (i + 1) & m->mask;
    m->slots[i] = id + 1;
}

int32_t tk_strmap_get(const tk_strmap *m, const char *s, size_t n) {
    if (!m->slots) return -1;
    size_t i = (size_t)tk_hash(s, n) & m->mask;
    for (;;) {
        uint32_t v = m->slots[i];
        if (!v) return -1;
        uint32_t id = v - 1;
        if (m->len[id] == n && !memcmp(m->arena + m->off[id], s, n)) return (int32_t)id;
        i = (i + 1) & m->mask;
    }
}

static inline int merges_get(const tk_merges *mg, int32_t a, int32_t b, uint32_t *rank, int32_t *new_id) {
    if (!mg->keys) return 0;
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = (size_t)mix64(key) & mg->mask;
    for (;;) {
        uint64_t k = mg->keys[i];
        if (k == UINT64_MAX) return 0;
        if (k == key) {
            *rank = mg->rank[i];
            *new_id = (int32_t)mg->new_id[i];
            return 1;
        }
        i = (i + 1) & mg->mask;
    }
}

/* Used by the loader: later duplicates overwrite earlier ones, as collecting into HF's HashMap does. */
void tk_merges_put(tk_merges *mg, int32_t a, int32_t b, uint32_t rank, int32_t new_id);
void tk_merges_put(tk_merges *mg, int32_t a, int32_t b, uint32_t rank, int32_t new_id) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = (size_t)mix64(key) & mg->mask;
    while (mg->keys[i] != UINT64_MAX && mg->keys[i] != key) i = (i + 1) & mg->mask;
    mg->keys[i] = key;
    mg->rank[i] = rank;
    mg->new_id[i] = (uint32_t)new_id;
}

/* ------------------------------------------------------------------ the merge loop */

typedef struct tk_sym {
    int32_t c;
    int32_t prev, next;
    uint32_t len; /* bytes; 0 marks a symbol merged into its left neighbour */
} tk_sym;

typedef struct tk_heapent {
    uint32_t rank, pos;
    int32_t new_id;
} tk_heapent;

static inline int he_less(const tk_heapent *a, const tk_heapent *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(tk_scratch *s, size_t *n, tk_heapent e) {
    if (*n == s->cap_heap) {
        s->cap_heap = s->cap_heap ? s->cap_heap * 2 : 256;
        s->heap = xrealloc(s->heap, s->cap_heap * sizeof *s->heap);
    }
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!he_less(&e, &s->heap[p])) break;
        s->heap[i] = s->heap[p];
        i = p;
    }
    s->heap[i] = e;
}

static tk_heapent heap_pop(tk_scratch *s, size_t *n) {
    tk_heapent top = s->heap[0];
    tk_heapent last = s->heap[--(*n)];
    size_t i = 0, m = *n;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= m) break;
        size_t c = (l + 1 < m && he_less(&s->heap[l + 1], &s->heap[l])) ? l + 1 : l;
        if (!he_less(&s->heap[c], &last)) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (m) s->heap[i] = last;
    return top;
}

static void sym_add(tk_scratch *s, size_t *n, int32_t c, uint32_t len) {
    if (*n == s->cap_syms) {
        s->cap_syms = s->cap_syms ? s->cap_syms * 2 : 256;
        s->syms = xrealloc(s->syms, s->cap_syms * sizeof *s->syms);
    }
    int32_t i = (int32_t)*n;
    if (i > 0) s->syms[i - 1].next = i;
    s->syms[i] = (tk_sym){c, i - 1, -1, len};
    (*n)++;
}

static void merge_all(const tokenizer *tk, tk_scratch *s, size_t nsym) {
    tk_sym *sy = s->syms;
    size_t hn = 0;
    for (size_t i = 0; i + 1 < nsym; i++) {
        uint32_t r;
        int32_t nid;
        if (merges_get(&tk->merges, sy[i].c, sy[i + 1].c, &r, &nid)) heap_push(s, &hn, (tk_heapent){r, (uint32_t)i, nid});
    }
    while (hn) {
        tk_heapent top = heap_pop(s, &hn);
        sy = s->syms;
        tk_sym *cur = &sy[top.pos];
        if (cur->len == 0 || cur->next == -1) continue;
        int32_t nx = cur->next;
        tk_sym right = sy[nx];
        uint32_t r;
        int32_t nid;
        /* an entry is stale when the pair now at pos no longer merges into the same id */
        if (!merges_get(&tk->merges, cur->c, right.c, &r, &nid) || nid != top.new_id) continue;
        cur->c = top.new_id;
        cur->len += right.len;
        cur->next = right.next;
        sy[nx].len = 0;
        if (right.next > -1 && (size_t)right.next < nsym) sy[right.next].prev = (int32_t)top.pos;
        if (cur->prev >= 0) {
            tk_sym *pv = &sy[cur->prev];
            if (merges_get(&tk->merges, pv->c, cur->c, &r, &nid))
                heap_push(s, &hn, (tk_heapent){r, (uint32_t)cur->prev, nid});
        }
        if (cur->next >= 0 && (size_t)cur->next < nsym) {
            if (merges_get(&tk->merges, cur->c, sy[cur->next].c, &r, &nid))
                heap_push(s, &hn, (tk_heapent){r, top.pos, nid});
        }
    }
}

static void out_push(tk_scratch *s, int32_t id) {
    if (s->n_out == s->cap_out) {
        s->cap_out = s->cap_out ? s->cap_out * 2 : 1024;
        s->out = xrealloc(s->out, s->cap_out * sizeof *s->out);
    }
    s->out[s->n_out++] = id;
}

/* HF BPE::merge_word over the characters of w (already mapped when byte-level). */
static int merge_word_generic(const tokenizer *tk, tk_scratch *s, const char *w, size_t n, size_t *nsym_out) {
    size_t nsym = 0;
    int32_t unk_id = -1;
    uint32_t unk_len = 0;
    int have_unk = 0;
    char stackbuf[256];
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = tk_utf8_dec(w + i, n - i, &cp);
        int is_first = i == 0, is_last = i + (size_t)k >= n;
        const char *str = w + i;
        size_t slen = (size_t)k;
        char *heap = NULL;
        if ((!is_first && tk->cont_prefix) || (is_last && tk->eow_suffix)) {
            size_t need = (size_t)k + (tk->cont_prefix ? tk->cont_prefix_len : 0) + (tk->eow_suffix ? tk->eow_suffix_len : 0);
            char *b = need <= sizeof stackbuf ? stackbuf : (heap = xmalloc(need));
            size_t L = 0;
            if (!is_first && tk->cont_prefix) memcpy(b, tk->cont_prefix, tk->cont_prefix_len), L = tk->cont_prefix_len;
            memcpy(b + L, w + i, (size_t)k), L += (size_t)k;
            if (is_last && tk->eow_suffix) memcpy(b + L, tk->eow_suffix, tk->eow_suffix_len), L += tk->eow_suffix_len;
            str = b;
            slen = L;
        }
        int32_t id = tk_strmap_get(&tk->vocab, str, slen);
        if (id >= 0) {
            if (have_unk) sym_add(s, &nsym, unk_id, unk_len), have_unk = 0;
            sym_add(s, &nsym, id, (uint32_t)k);
        } else {
            int done = 0;
            if (tk->byte_fallback) {
                int all = 1;
                for (size_t j = 0; j < slen; j++)
                    if (tk->byte_id[(unsigned char)str[j]] < 0) all = 0;
                if (all) {
                    for (size_t j = 0; j < slen; j++) sym_add(s, &nsym, tk->byte_id[(unsigned char)str[j]], 1);
                    done = 1;
                }
            }
            if (!done && tk->unk_id >= 0) {
                if (have_unk && tk->fuse_unk) {
                    unk_len += (uint32_t)k;
                } else {
                    if (have_unk) sym_add(s, &nsym, unk_id, unk_len);
                    unk_id = tk->unk_id;
                    unk_len = (uint32_t)k;
                    have_unk = 1;
                }
            }
            /* neither: the character is dropped, as in the reference */
        }
        free(heap);
        i += (size_t)k;
    }
    if (have_unk) sym_add(s, &nsym, unk_id, unk_len);
    *nsym_out = nsym;
    return 0;
}

/* ------------------------------------------------------------------ cache */

/* The table starts small (a tokenizer parsed for one short text should not pay for it) and doubles up to
 * CACHE_SLOTS; past that it is cleared, which is cheaper than an LRU and keeps the hit rate on real text. */
#define CACHE_SLOTS_MIN (1u << 10)
#define CACHE_SLOTS (1u << 15)
#define CACHE_MAX_WORD 256

static void cache_reset(tk_scratch *s) {
    if (!s->cache) {
        s->cache = xcalloc(CACHE_SLOTS_MIN, sizeof *s->cache);
        s->cache_mask = CACHE_SLOTS_MIN - 1;
    } else {
        memset(s->cache, 0, (s->cache_mask + 1) * sizeof *s->cache);
    }
    s->cache_n = 0;
    s->cache_keys.len = 0;
    s->cache_ids_n = 0;
}

static void cache_grow(tk_scratch *s) {
    size_t old_n = s->cache_mask + 1, nn = old_n * 2;
    tk_cache_ent *old = s->cache;
    s->cache = xcalloc(nn, sizeof *s->cache);
    s->cache_mask = nn - 1;
    for (size_t i = 0; i < old_n; i++) {
        if (!old[i].used) continue;
        size_t j = (size_t)old[i].h & s->cache_mask;
        while (s->cache[j].used) j = (j + 1) & s->cache_mask;
        s->cache[j] = old[i];
    }
    free(old);
}

static tk_cache_ent *cache_find(tk_scratch *s, const char *w, size_t n, int bl, uint64_t h, int *found) {
    size_t i = (size_t)h & s->cache_mask;
    for (;;) {
        tk_cache_ent *e = &s->cache[i];
        if (!e->used) {
            *found = 0;
            return e;
        }
        if (e->h == h && e->key_len == n && e->bl == bl && !memcmp(s->cache_keys.p + e->key_off, w, n)) {
            *found = 1;
            return e;
        }
        i = (i + 1) & s->cache_mask;
    }
}

/* Tokenizes one pre-tokenized word, appending its ids to s->out. */
int tk_bpe_word(const tokenizer *tk, tk_scratch *s, const char *w, size_t n, int bl) {
    if (n == 0) return 0;
    if (!s->cache) cache_reset(s);
    uint64_t h = 0;
    int cacheable = n < CACHE_MAX_WORD;
    tk_cache_ent *slot = NULL;
    if (cacheable) {
        h = tk_hash(w, n) ^ (uint64_t)bl;
        int found;
        slot = cache_find(s, w, n, bl, h, &found);
        if (found) {
            for (uint32_t i = 0; i < slot->n_ids; i++) out_push(s, s->cache_ids[slot->ids_off + i]);
            return 0;
        }
    }
    size_t first_out = s->n_out;
    const char *mw = w;
    size_t mn = n;
    if (bl && (!tk->bl_fast || tk->ignore_merges)) {
        /* the generic path reads the mapped string */
        s->tmp2.len = 0;
        for (size_t i = 0; i < n; i++) {
            char b[4];
            tkb_put(&s->tmp2, b, (size_t)tk_utf8_enc(tk_bytes_char[(unsigned char)w[i]], b));
        }
        mw = s->tmp2.p;
        mn = s->tmp2.len;
    }
    int32_t whole = tk->ignore_merges ? tk_strmap_get(&tk->vocab, mw, mn) : -1;
    if (whole >= 0) {
        out_push(s, whole);
    } else {
        size_t nsym = 0;
        if (bl && tk->bl_fast) {
            for (size_t i = 0; i < n; i++) sym_add(s, &nsym, tk->bl_byte_id[(unsigned char)w[i]], 1);
        } else {
            merge_word_generic(tk, s, mw, mn, &nsym);
        }
        merge_all(tk, s, nsym);
        for (size_t i = 0; i < nsym; i++)
            if (s->syms[i].len) out_push(s, s->syms[i].c);
    }
    if (cacheable) {
        if (s->cache_n * 2 >= s->cache_mask + 1 && s->cache_mask + 1 < CACHE_SLOTS) {
            cache_grow(s);
            int found;
            slot = cache_find(s, w, n, bl, h, &found);
        } else if (s->cache_n * 2 >= s->cache_mask + 1 || s->cache_keys.len > (8u << 20)) {
            cache_reset(s);
            int found;
            slot = cache_find(s, w, n, bl, h, &found);
        }
        size_t nids = s->n_out - first_out;
        if (s->cache_ids_n + nids > s->cache_ids_cap) {
            size_t nc = s->cache_ids_cap ? s->cache_ids_cap : 4096;
            while (nc < s->cache_ids_n + nids) nc *= 2;
            s->cache_ids = xrealloc(s->cache_ids, nc * sizeof *s->cache_ids);
            s->cache_ids_cap = nc;
        }
        if (nids) memcpy(s->cache_ids + s->cache_ids_n, s->out + first_out, nids * sizeof *s->out);
        slot->used = 1;
        slot->bl = (uint8_t)bl;
        slot->h = h;
        slot->key_off = (uint32_t)s->cache_keys.len;
        slot->key_len = (uint32_t)n;
        slot->ids_off = (uint32_t)s->cache_ids_n;
        slot->n_ids = (uint32_t)nids;
        tkb_put(&s->cache_keys, w, n);
        s->cache_ids_n += nids;
        s->cache_n++;
    }
    return 0;
}

/* ------------------------------------------------------------------ scratch */

void tk_scratch_free(void *p) {
    tk_scratch *s = p;
    if (!s) return;
    free(s->text.p);
    free(s->a.v);
    free(s->b.v);
    free(s->tmp.p);
    free(s->tmp2.p);
    if (s->md) pcre2_match_data_free(s->md);
    free(s->spans);
    free(s->syms);
    free(s->heap);
    free(s->out);
    free(s->cache);
    free(s->cache_keys.p);
    free(s->cache_ids);
    free(s);
}

tk_scratch *tk_scratch_get(const tokenizer *tk) {
    tk_scratch *s = pthread_getspecific(tk->scratch_key);
    if (s) return s;
    s = xcalloc(1, sizeof *s);
    /* ovector pairs: the patterns here have few groups; PCRE2 grows nothing, so size it generously */
    s->md = pcre2_match_data_create(64, NULL);
    pthread_setspecific(tk->scratch_key, s);
    return s;
}

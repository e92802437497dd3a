/* tok_internal.h — the tokenizer's internals shared by tokenizer.c (load), tok_text.c (Unicode, regexes,
 * normalizers, pre-tokenizers), tok_bpe.c (the BPE model) and tok_decode.c. Not a public header. */
#ifndef CI_TOK_INTERNAL_H
#define CI_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "tok/tokenizer.h"

/* ---- growable buffers ---- */
typedef struct {
    char *p;
    size_t len, cap;
} tk_buf;

void tkb_reserve(tk_buf *b, size_t extra);
void tkb_put(tk_buf *b, const void *s, size_t n);
static inline void tkb_putc(tk_buf *b, char c) {
    if (b->len == b->cap) tkb_reserve(b, 1);
    b->p[b->len++] = c;
}

/* ---- UTF-8 and Unicode properties (tok_text.c) ---- */
/* Decodes one code point at s[0..n) (n >= 1, s valid UTF-8); returns its length. */
int tk_utf8_dec(const char *s, size_t n, uint32_t *cp);
int tk_utf8_enc(uint32_t cp, char *out);
/* Length of the longest valid UTF-8 prefix; == n when all valid. */
size_t tk_utf8_valid_prefix(const char *s, size_t n);
/* Appends s with every invalid sequence replaced by U+FFFD, maximal subparts as Rust's from_utf8_lossy. */
void tk_utf8_lossy(tk_buf *out, const char *s, size_t n);
int tk_is_whitespace(uint32_t cp); /* Unicode White_Space (Rust char::is_whitespace) */
int tk_is_numeric(uint32_t cp);    /* Nd Nl No (Rust char::is_numeric) */
int tk_is_punc(uint32_t cp);       /* ASCII punctuation or P* (HF Punctuation pre-tokenizer) */
int tk_is_word(uint32_t cp);       /* Rust regex \w: Alphabetic, M, Nd, Pc, Join_Control */

/* ---- patterns: a literal string or a regex (Oniguruma dialect translated for PCRE2) ---- */
typedef struct {
    int is_regex;
    char *lit; /* literal bytes (is_regex == 0) */
    size_t lit_len;
    pcre2_code *re;
} tk_pattern;

int tk_pattern_literal(tk_pattern *p, const char *s, size_t n);
/* flavor 'o': an Oniguruma pattern from tokenizer.json; 'r': Rust regex crate syntax (built-ins). */
int tk_pattern_regex(tk_pattern *p, const char *src, size_t n, char *err, size_t errlen);
void tk_pattern_free(tk_pattern *p);

/* One span of a find_matches result: [start, end) and whether it is a match. */
typedef struct {
    uint32_t start, end;
    int is_match;
} tk_span;

/* ---- components ---- */
enum { NORM_NFC = 1, NORM_NFD, NORM_NFKC, NORM_NFKD, NORM_LOWERCASE, NORM_REPLACE, NORM_PREPEND, NORM_STRIP, NORM_SEQ };
typedef struct tk_norm {
    int type;
    tk_pattern pat;      /* Replace */
    char *content;       /* Replace content, Prepend string */
    size_t content_len;
    int strip_left, strip_right;
    struct tk_norm *items; /* Sequence */
    int n_items;
} tk_norm;

enum { BEH_REMOVED = 0, BEH_ISOLATED, BEH_MERGED_PREV, BEH_MERGED_NEXT, BEH_CONTIGUOUS };
enum { PT_SPLIT = 1, PT_BYTELEVEL, PT_METASPACE, PT_DIGITS, PT_PUNCT, PT_WHITESPACE, PT_WSSPLIT, PT_SEQ };
enum { PREPEND_ALWAYS = 0, PREPEND_FIRST, PREPEND_NEVER };
typedef struct tk_pretok {
    int type;
    tk_pattern pat; /* Split */
    int behavior, invert;
    int add_prefix_space, use_regex;  /* ByteLevel */
    uint32_t replacement;             /* Metaspace */
    char rep[4];
    int rep_len;
    int prepend_scheme, split;
    int individual_digits;
    struct tk_pretok *items;
    int n_items;
} tk_pretok;

enum { DEC_BYTELEVEL = 1, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP, DEC_REPLACE, DEC_METASPACE, DEC_SEQ };
typedef struct tk_decoder {
    int type;
    tk_pattern pat; /* Replace */
    char *content;
    size_t content_len;
    uint32_t strip_char; /* Strip */
    size_t start, stop;
    uint32_t replacement; /* Metaspace */
    int prepend_scheme;
    struct tk_decoder *items;
    int n_items;
} tk_decoder;

/* Post-processing as the template pieces of the single-sequence case: a run of ids or the sequence. */
typedef struct {
    int is_seq;
    int32_t *ids;
    int n_ids;
} tk_tpl_piece;

/* ---- string -> id map (open addressing over an index of strings in one arena) ---- */
typedef struct {
    uint32_t *slots; /* id + 1, 0 empty */
    size_t mask;
    const char *arena;     /* strings of the owner */
    const uint32_t *off;   /* [id] offset in arena */
    const uint32_t *len;   /* [id] length (UINT32_MAX: no string) */
} tk_strmap;

uint64_t tk_hash(const void *p, size_t n);
void tk_strmap_build(tk_strmap *m, size_t n_expected);
void tk_strmap_put(tk_strmap *m, uint32_t id, uint64_t h);
int32_t tk_strmap_get(const tk_strmap *m, const char *s, size_t n);

/* Merge table: pair of ids -> (rank, new id). */
typedef struct {
    uint64_t *keys; /* (a << 32 | b), UINT64_MAX empty */
    uint32_t *rank, *new_id;
    size_t mask;
} tk_merges;

/* ---- added tokens and their tries (leftmost-longest matching, as daachorse's) ---- */
typedef struct {
    uint32_t off, len;           /* content in the tokenizer's arena */
    uint32_t norm_off, norm_len; /* content after the normalizer (== content unless normalized) */
    int32_t id;
    uint8_t special, lstrip, rstrip, single_word, normalized;
} tk_added;

typedef struct {
    uint64_t *keys;   /* (node << 8 | byte) + 1, 0 empty */
    uint32_t *child;
    size_t mask;
    int32_t *term;    /* [node] index into added, or -1 */
    uint32_t n_nodes, cap_nodes;
    uint8_t first[256];
    uint32_t maxlen;
} tk_trie;

/* ---- the tokenizer ---- */
struct tokenizer {
    char *arena; /* every string: vocab, added contents */
    size_t arena_len;

    /* model (BPE) */
    int32_t n_ids;     /* one past the largest id (model or added) */
    uint32_t *str_off; /* [n_ids] id -> string offset in arena (model vocab, or added content) */
    uint32_t *str_len; /* [n_ids] UINT32_MAX for no string */
    int32_t n_model;   /* entries in the model vocab (HF get_vocab_size(false)) */
    tk_strmap vocab;   /* model vocab string -> id */
    tk_merges merges;
    int32_t unk_id;    /* -1 none */
    int fuse_unk, byte_fallback, ignore_merges;
    char *cont_prefix, *eow_suffix; /* NULL when absent */
    size_t cont_prefix_len, eow_suffix_len;
    int32_t byte_id[256];      /* byte-fallback "<0xNN>" ids, -1 missing */
    int32_t bl_byte_id[256];   /* ids of the byte-level chars of each byte, -1 missing */
    int bl_fast;               /* all 256 present and no prefix/suffix: BPE may work on raw bytes */

    /* added vocabulary */
    tk_added *added;
    int n_added;
    int32_t *id_added; /* [n_ids] index + 1 into added, 0 none */
    tk_strmap added_map;             /* content -> added index */
    uint32_t *added_off, *added_len; /* [n_added] content, for added_map */
    tk_trie trie_raw, trie_norm;
    int has_trie_raw, has_trie_norm;

    tk_norm *normalizer;     /* NULL none */
    tk_pretok *pretok;       /* NULL none */
    tk_decoder *decoder;     /* NULL none: tokens joined with " " */
    tk_tpl_piece *tpl;       /* NULL: no post-processor adds tokens */
    int n_tpl;

    int32_t bos_id, eos_id, pad_id;
    int cfg_add_bos, cfg_add_eos;

    pthread_key_t scratch_key; /* per-thread scratch + BPE cache */
};

/* ---- encode-time pieces ---- */
typedef struct {
    uint32_t off, len; /* bytes in the scratch text buffer */
    uint32_t zlen;     /* leading bytes whose original offset is 0 (Metaspace prepend_scheme "first") */
    int32_t id;        /* an added token's id, or -1 for text still to tokenize */
    uint8_t bl;        /* bytes are raw but ByteLevel-mapped (materialised lazily) */
} tk_piece;

typedef struct {
    tk_piece *v;
    size_t n, cap;
} tk_pieces;

void tkp_push(tk_pieces *p, tk_piece x);

/* BPE cache entry. */
typedef struct {
    uint64_t h;
    uint32_t key_off, key_len, ids_off, n_ids; /* key in keys arena, ids in ids arena */
    uint8_t used, bl;
} tk_cache_ent;

typedef struct tk_scratch {
    tk_buf text;             /* piece bytes */
    tk_pieces a, b;          /* ping-pong piece lists */
    tk_buf tmp, tmp2;        /* transformations */
    pcre2_match_data *md;
    tk_span *spans;
    size_t n_spans, cap_spans;
    /* BPE working arrays */
    struct tk_sym *syms;
    size_t cap_syms;
    struct tk_heapent *heap;
    size_t cap_heap;
    int32_t *out;
    size_t n_out, cap_out;
    /* cache */
    tk_cache_ent *cache;
    size_t cache_mask, cache_n;
    tk_buf cache_keys;
    int32_t *cache_ids;
    size_t cache_ids_n, cache_ids_cap;
} tk_scratch;

tk_scratch *tk_scratch_get(const tokenizer *tk);
void tk_scratch_free(void *p);

/* ---- pipeline steps (tok_text.c) ---- */
/* Applies the normalizer to in[0..n) appending to out; *zlen in/out as in tk_piece. */
int tk_normalize(const tokenizer *tk, const tk_norm *nm, tk_scratch *s, const char *in, size_t n, tk_buf *out,
                 uint32_t *zlen);
/* Runs the pre-tokenizer over pieces in s->a (result in s->a). */
int tk_pretokenize(const tokenizer *tk, const tk_pretok *pt, tk_scratch *s);
/* Finds the spans of pattern p in [s, s+n) (HF Pattern::find_matches). */
int tk_find_matches(const tk_pattern *p, tk_scratch *sc, const char *s, size_t n);
/* ByteLevel: materialise a lazily mapped piece into s->text (clears bl). */
void tk_bl_materialize(tk_scratch *s, tk_piece *p);
extern uint16_t tk_bytes_char[256]; /* byte -> code point of the GPT-2 byte-level alphabet */
void tk_text_init(void);             /* fills tk_bytes_char; idempotent, thread-safe */
int tk_char_byte(uint32_t cp);            /* inverse; -1 for other code points */

/* ---- BPE (tok_bpe.c) ---- */
int tk_bpe_word(const tokenizer *tk, tk_scratch *s, const char *w, size_t n, int bl);

/* ---- decode (tok_decode.c) ---- */
typedef struct {
    tk_buf bytes;
    uint32_t *off, *len; /* token strings in bytes */
    size_t n, cap;
} tk_toklist;
void tkl_push(tk_toklist *l, const char *s, size_t n);
void tkl_free(tk_toklist *l);
int tk_decode_chain(const tk_decoder *d, tk_toklist *toks, char *err, size_t errlen);

#endif

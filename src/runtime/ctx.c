/* ctx.c — the public model and context API of cinfer.h on the CPU backend: a context owns the thread
 * pool, the KV block pool, the DeltaNet state slots and the forward scratch, all sized at creation.
 * cinfer_forward validates a ragged batch, gives sequences the KV blocks they need, and runs it. */
#include <stdlib.h>
#include <string.h>

#include "cinfer.h"
#include "model/forward.h"
#include "model/forward_cuda.h"
#include "model/mtp.h"
#include "model/qwen35.h"
#include "model/vision_cuda.h"
#include "runtime/ctx_internal.h"
#include "runtime/mm.h"
#include "runtime/prefix.h"
#include "runtime/text.h"
#include "util/alloc.h"
#include "util/err.h"


typedef struct seq_rec {
    int active;
    int len;     /* tokens processed */
    int slot;    /* DeltaNet state slot */
    int *blocks; /* [blocks_per_seq] KV block ids; the first ceil(len / KV_BLOCK) are allocated */
    int n_blocks;
    int pending; /* tokens of a speculative window awaiting cinfer_seq_commit */
    float *spec; /* [n_lin][spec_window][spec_rec_floats] the window's recorded DeltaNet inputs, or NULL */
    /* the MTP head's rows of this sequence: positions [mtp_start, mtp_len) of its own KV layer */
    int mtp_start, mtp_len;
    int *mtp_blocks; /* [blocks_per_seq] MTP KV block ids (-1 below mtp_start's block) */
    int mtp_n_blocks;
    /* a prompt with images (cinfer_seq_set_images); NULL / 0 for text */
    int32_t *mm_tokens; /* [mm.n] the prompt, to check what cinfer_forward feeds */
    mm_layout mm;       /* positions and feature rows of the prompt's tokens */
    float *mm_feat;     /* [mm.n_feat][H] f32 image features */
} seq_rec;

struct cinfer_ctx {
    model *m;
    cinfer_ctx_params p;
    threadpool *tp;
    kv_pool kv;
    state_pool st;
    fwd_scratch s;
    seq_rec *seqs;       /* [max_seqs] */
    int blocks_per_seq;
    int *block_store;    /* [max_seqs][blocks_per_seq] */
    fwd_entry *fe;       /* [max_batch] */
    float *spec_store;   /* [max_seqs] records of spec_window tokens each (see forward.h) */
    prefix_cache *pc;    /* owns the KV blocks' reference counts (every block goes through it) */
    cuda_fwd *cf;        /* CUDA device: the pools live there and kv/st above keep only the free lists */
    cuda_vision *cv;     /* CUDA device: the vision tower, made at the first image */
    unsigned char *seen; /* [max_seqs] per-call duplicate check */
    /* MTP head (ctx_mtp_init): its one-layer KV pool, block tables, entries and fc-input scratch */
    int mtp_on;
    int mtp_vocab;        /* the head's logits cover token ids [0, mtp_vocab) */
    kv_pool mkv;
    int *mtp_block_store; /* [max_seqs][blocks_per_seq] */
    fwd_entry *mfe;       /* [max_batch] */
    mtp_io *mio;          /* [max_batch] */
    float *mtp_cat;       /* [max_batch][2H] f32 */
};

int cinfer_model_open(const char *dir, cinfer_model **out, char *err, size_t errlen) {
    if (!dir || !out) return ci_err(err, errlen, CINFER_EINVAL, "cinfer_model_open: dir and out are required");
    model *m;
    int rc = model_load(dir, &m, err, errlen);
    if (rc) return rc;
    cinfer_model *cm = xcalloc(1, sizeof *cm);
    cm->m = m;
    if ((rc = text_load(cm, dir, err, errlen))) {
        cinfer_model_close(cm);
        return rc;
    }
    mm_model_load(cm, dir);
    *out = cm;
    return 0;
}

void cinfer_model_close(cinfer_model *cm) {
    if (!cm) return;
    text_unload(cm);
    model_free(cm->m);
    free(cm);
}

void cinfer_model_get_info(const cinfer_model *cm, cinfer_model_info *o) {
    const model *m = cm->m;
    memset(o, 0, sizeof *o);
    o->arch = m->arch_name;
    o->n_layers = m->L;
    o->n_linear_layers = m->n_lin;
    o->n_full_layers = m->n_full;
    o->hidden_size = m->H;
    o->vocab_size = m->V;
    o->n_experts = m->cfg.n_experts;
    o->n_experts_per_tok = m->cfg.n_experts_per_tok;
    o->n_params = m->n_params;
    o->n_params_total = m->n_params_total;
    o->bytes_bf16 = m->bytes_by_dtype[ST_BF16];
    o->bytes_f16 = m->bytes_by_dtype[ST_F16];
    o->bytes_f32 = m->bytes_by_dtype[ST_F32];
    for (int d = 0; d < ST_N_DTYPES; d++)
        if (d != ST_BF16 && d != ST_F16 && d != ST_F32) o->bytes_other += m->bytes_by_dtype[d];
    o->layer_map = m->layer_map;
    o->bytes_per_token = m->bytes_per_token;
    o->eos_ids = m->eos_ids;
    o->n_eos = m->n_eos;
    o->gen_temperature = m->gen_temperature;
    o->gen_top_p = m->gen_top_p;
    o->gen_min_p = m->gen_min_p;
    o->gen_repetition_penalty = m->gen_repetition_penalty;
    o->gen_top_k = m->gen_top_k;
    o->has_mtp = m->mtp.present;
    o->n_visual_tensors = m->n_visual;
    o->has_vision = m->vis.present;
    o->image_token_id = m->cfg.image_token_id;
    o->vision_start_token_id = m->cfg.vision_start_token_id;
    o->vision_end_token_id = m->cfg.vision_end_token_id;
}

/* CINFER_DEVICE=cpu|cuda|auto chooses the default device (the CLI's --device sets it); unset or unknown: cpu */
static int default_device(void) {
    const char *d = getenv("CINFER_DEVICE");
    if (d && !strcmp(d, "cuda")) return CINFER_DEVICE_CUDA;
    if (d && !strcmp(d, "auto")) return CINFER_DEVICE_AUTO;
    return CINFER_DEVICE_CPU;
}

int cinfer_precision_parse(const char *s) {
    if (s && !strcmp(s, "exact")) return CINFER_PRECISION_EXACT;
    if (s && !strcmp(s, "fast")) return CINFER_PRECISION_FAST;
    return -1;
}

const char *cinfer_precision_name(int p) {
    return p == CINFER_PRECISION_EXACT ? "exact" : p == CINFER_PRECISION_FAST ? "fast" : "?";
}

/* CINFER_PRECISION=exact|fast chooses the default precision (the CLI's --precision sets it); unset: exact. A
 * value that is neither stays -1 here, so cinfer_ctx_create refuses it by name instead of running exact
 * silently when fast was meant (a typo in a benchmark's environment would otherwise measure the wrong mode) */
static int default_precision(void) {
    const char *s = getenv("CINFER_PRECISION");
    return s ? cinfer_precision_parse(s) : CINFER_PRECISION_EXACT;
}

cinfer_ctx_params cinfer_ctx_default_params(void) {
    cinfer_ctx_params p = {.max_seqs = 4, .max_ctx = 4096, .max_batch = 512, .n_threads = 0, .kv_memory = 0, .spec_window = 0,
                           .device = default_device(), .precision = default_precision()};
    return p;
}

static void seq_mm_free(seq_rec *s) {
    free(s->mm_tokens);
    free(s->mm_feat);
    mm_layout_free(&s->mm);
    s->mm_tokens = NULL;
    s->mm_feat = NULL;
}

void cinfer_ctx_destroy(cinfer_ctx *c) {
    if (!c) return;
    cuda_vision_destroy(c->cv);
    cuda_fwd_destroy(c->cf);
    if (c->seqs)
        for (int i = 0; i < c->p.max_seqs; i++) seq_mm_free(&c->seqs[i]);
    prefix_destroy(c->pc);
    tp_destroy(c->tp);
    kv_pool_free(&c->kv);
    state_pool_free(&c->st);
    fwd_scratch_free(&c->s);
    free(c->seqs);
    free(c->block_store);
    free(c->fe);
    free(c->seen);
    free(c->spec_store);
    kv_pool_free(&c->mkv);
    free(c->mtp_block_store);
    free(c->mfe);
    free(c->mio);
    free(c->mtp_cat);
    free(c);
}

/* the prefix cache's data movement on a cuda context (prefix_io) */
static int px_save(void *u, int slot, float *dst) {
    char e[128];
    return cuda_fwd_state_save(u, slot, dst, e, sizeof e);
}
static int px_load(void *u, int slot, const float *src) {
    char e[128];
    return cuda_fwd_state_load(u, slot, src, e, sizeof e);
}
static int px_kv_copy(void *u, int dst, int src, int rows) {
    char e[128];
    return cuda_fwd_kv_copy(u, dst, src, rows, e, sizeof e);
}
static void *px_alloc(size_t bytes) { return cuda_host_alloc(bytes, 1); }

int cinfer_ctx_create(cinfer_model *cm, const cinfer_ctx_params *pp, cinfer_ctx **out, char *err, size_t errlen) {
    if (!cm || !out) return ci_err(err, errlen, CINFER_EINVAL, "cinfer_ctx_create: model and out are required");
    cinfer_ctx_params p = pp ? *pp : cinfer_ctx_default_params();
    if (p.max_seqs < 1 || p.max_seqs > 65536) return ci_err(err, errlen, CINFER_EINVAL, "max_seqs %d: must be 1..65536", p.max_seqs);
    if (p.max_ctx < 1 || p.max_ctx > (1 << 24)) return ci_err(err, errlen, CINFER_EINVAL, "max_ctx %d: must be 1..16777216", p.max_ctx);
    if (p.max_batch < 1 || p.max_batch > (1 << 20)) return ci_err(err, errlen, CINFER_EINVAL, "max_batch %d: must be 1..1048576", p.max_batch);
    model *m = cm->m;
    if (m->dv > 1024 || m->K > 64 || m->K < 1)
        return ci_err(err, errlen, CINFER_EUNSUPPORTED, "linear_value_head_dim %d / conv kernel %d: limits are 1024 / 64", m->dv, m->K);
    if (p.device == CINFER_DEVICE_AUTO)
        p.device = cuda_devices() > 0 ? CINFER_DEVICE_CUDA : CINFER_DEVICE_CPU;
    if (p.device != CINFER_DEVICE_CPU && p.device != CINFER_DEVICE_CUDA)
        return ci_err(err, errlen, CINFER_EINVAL, "device %d: must be cpu, cuda or auto", p.device);
    if (p.precision != CINFER_PRECISION_EXACT && p.precision != CINFER_PRECISION_FAST) {
        const char *env = getenv("CINFER_PRECISION");
        if (env && cinfer_precision_parse(env) < 0)
            return ci_err(err, errlen, CINFER_EINVAL, "CINFER_PRECISION='%s': must be exact or fast", env);
        return ci_err(err, errlen, CINFER_EINVAL, "precision %d: must be exact (0) or fast (1)", p.precision);
    }
    int cuda = p.device == CINFER_DEVICE_CUDA;
    if (cuda && !cuda_built()) return ci_err(err, errlen, CINFER_EUNSUPPORTED, "device cuda: this build has no CUDA backend (make CUDA=1)");
    if (cuda && cuda_devices() < 1) return ci_err(err, errlen, CINFER_EUNSUPPORTED, "device cuda: no CUDA device is visible");
    cinfer_ctx *c = xcalloc(1, sizeof *c);
    c->m = m;
    c->p = p;
    c->tp = tp_create(p.n_threads);
    c->p.n_threads = tp_size(c->tp);
    c->blocks_per_seq = (p.max_ctx + KV_BLOCK - 1) / KV_BLOCK;
    int rc;
    long n_blocks = (long)p.max_seqs * c->blocks_per_seq;
    int64_t block_bytes = (int64_t)m->n_full * 2 * KV_BLOCK * m->Hkv * m->hd * (int64_t)sizeof(float);
    if (p.kv_memory > 0 && block_bytes > 0 && p.kv_memory / block_bytes < n_blocks) {
        n_blocks = (long)(p.kv_memory / block_bytes);
        if (n_blocks < c->blocks_per_seq) {
            cinfer_ctx_destroy(c);
            return ci_err(err, errlen, CINFER_ENOMEM, "kv_memory %lld bytes holds %ld blocks; one sequence of %d tokens needs %d",
                          (long long)p.kv_memory, n_blocks, p.max_ctx, c->blocks_per_seq);
        }
    }
    /* on cuda the host pools are created without layers: only their block / slot free lists are used */
    if ((rc = kv_pool_init(&c->kv, cuda ? 0 : m->n_full, (int)n_blocks, m->Hkv * m->hd, err, errlen)) ||
        (rc = state_pool_init(&c->st, p.max_seqs, cuda ? 0 : m->n_lin, m->K - 1, m->C, m->Hv, m->dk, m->dv, err, errlen)) ||
        (!cuda && (rc = fwd_scratch_init(&c->s, m, p.max_batch, p.max_ctx, c->p.n_threads, err, errlen)))) {
        cinfer_ctx_destroy(c);
        return rc;
    }
    if (cuda) {
        cuda_fwd_params cp = {.max_tokens = p.max_batch, .max_ctx = p.max_ctx, .n_slots = p.max_seqs, .n_blocks = (int)n_blocks,
                              .spec_window = p.spec_window >= 0 && p.spec_window <= 64 ? p.spec_window : 0,
                              .fast = p.precision == CINFER_PRECISION_FAST};
        if ((rc = cuda_fwd_create(m, &cp, &c->cf, err, errlen))) {
            cinfer_ctx_destroy(c);
            return rc;
        }
    }
    /* snapshots also every 4096 tokens of a long prompt (a multiple of the DeltaNet chunk, so these stops cost
     * no extra chunk split), so a long document shared by later requests resumes near where they diverge */
    prefix_params pp2 = {.budget_bytes = p.prefix_cache_memory > 0 ? (size_t)p.prefix_cache_memory : 0, .max_nodes = 0,
                         .interval = 4096};
    /* on cuda the snapshots are copies of the device slots in pinned host memory, partial blocks copied there */
    prefix_io pio = {c->cf, c->cf ? cuda_fwd_state_floats(c->cf) : 0, px_save, px_load, px_kv_copy, px_alloc, cuda_host_free,
                     (size_t)m->n_full * 2 * KV_BLOCK * m->Hkv * m->hd * sizeof(float)};
    /* where the snapshots live (CINFER_PREFIX_DEVICE): "1" device memory, "0" pinned host memory; unset, device
     * memory when the budget is at most half of what the device has free once the pools are made. On the device
     * a resume and a snapshot are copies there (a 4B state, 50 MB: 0.03 ms) instead of over the link (0.96 ms
     * each way; H200 call of 12:12) */
    const char *pd = getenv("CINFER_PREFIX_DEVICE");
    int px_dev = pd ? !strcmp(pd, "1") : (size_t)p.prefix_cache_memory <= cuda_dev_free_bytes() / 2;
    if (c->cf && p.prefix_cache_memory > 0 && px_dev) pio.alloc = cuda_dev_alloc, pio.free = cuda_dev_free;
    if (c->cf) pp2.io = &pio;
    if ((rc = prefix_create(&c->kv, &c->st, &pp2, &c->pc, err, errlen))) {
        cinfer_ctx_destroy(c);
        return rc;
    }
    c->seqs = xcalloc((size_t)p.max_seqs, sizeof(seq_rec));
    c->block_store = xmalloc((size_t)p.max_seqs * c->blocks_per_seq * sizeof(int));
    for (int i = 0; i < p.max_seqs; i++) c->seqs[i].blocks = c->block_store + (size_t)i * c->blocks_per_seq;
    c->fe = xmalloc((size_t)p.max_batch * sizeof(fwd_entry));
    c->seen = xcalloc((size_t)p.max_seqs, 1);
    if (p.spec_window < 0 || p.spec_window > 64) {
        cinfer_ctx_destroy(c);
        return ci_err(err, errlen, CINFER_EINVAL, "spec_window %d: must be 0..64", p.spec_window);
    }
    if (p.spec_window > 0) {
        /* on cuda the records live on the device (forward_cuda.h): a float per sequence only marks its windows */
        size_t per = cuda ? 1 : (size_t)m->n_lin * p.spec_window * spec_rec_floats(m);
        c->spec_store = ci_try_alloc(sizeof(float) * per * p.max_seqs + 64);
        if (!c->spec_store) {
            cinfer_ctx_destroy(c);
            return ci_err(err, errlen, CINFER_ENOMEM, "cannot allocate speculative records (%zu bytes)",
                          sizeof(float) * per * p.max_seqs);
        }
        for (int i = 0; i < p.max_seqs; i++) c->seqs[i].spec = c->spec_store + per * i;
    }
    *out = c;
    return 0;
}

int cinfer_ctx_device(const cinfer_ctx *c) { return c->cf ? CINFER_DEVICE_CUDA : CINFER_DEVICE_CPU; }

/* the CPU backend has one path, f32 activations: it takes fast and runs exact, and says so here */
int cinfer_ctx_precision(const cinfer_ctx *c) { return c->cf ? c->p.precision : CINFER_PRECISION_EXACT; }

int cinfer_seq_open(cinfer_ctx *c, char *err, size_t errlen) {
    for (int i = 0; i < c->p.max_seqs; i++) {
        seq_rec *s = &c->seqs[i];
        if (s->active) continue;
        int slot = state_alloc_slot(&c->st);
        if (slot < 0) break;
        int rc = c->cf ? cuda_fwd_slot_reset(c->cf, slot, err, errlen) : 0;
        if (rc) {
            state_free_slot(&c->st, slot);
            return rc;
        }
        s->active = 1;
        s->len = 0;
        s->slot = slot;
        s->n_blocks = 0;
        s->pending = 0;
        return i;
    }
    return ci_err(err, errlen, CINFER_ERANGE, "all %d sequences are in use", c->p.max_seqs);
}

/* Keeps the sequence's MTP rows below len (never below its first row): blocks wholly past them go back. */
static void mtp_drop(cinfer_ctx *c, seq_rec *s, int len) {
    if (len < s->mtp_start) len = s->mtp_start;
    int keep = (len + KV_BLOCK - 1) / KV_BLOCK;
    while (s->mtp_n_blocks > keep) {
        int b = s->mtp_blocks[--s->mtp_n_blocks];
        if (b >= 0) kv_free_block(&c->mkv, b);
    }
    if (s->mtp_len > len) s->mtp_len = len;
}

static void mtp_reset(cinfer_ctx *c, seq_rec *s) {
    s->mtp_start = 0;
    mtp_drop(c, s, 0);
    s->mtp_len = 0;
}

void cinfer_seq_close(cinfer_ctx *c, int id) {
    if (!c || id < 0 || id >= c->p.max_seqs || !c->seqs[id].active) return;
    seq_rec *s = &c->seqs[id];
    prefix_release_blocks(c->pc, s->blocks, s->n_blocks);
    state_free_slot(&c->st, s->slot);
    if (c->mtp_on) mtp_reset(c, s);
    seq_mm_free(s);
    float *spec = s->spec;
    int *mb = s->mtp_blocks;
    memset(s, 0, sizeof *s);
    s->blocks = c->block_store + (size_t)id * c->blocks_per_seq;
    s->spec = spec;
    s->mtp_blocks = mb;
}

int cinfer_seq_len(const cinfer_ctx *c, int id) {
    if (!c || id < 0 || id >= c->p.max_seqs || !c->seqs[id].active) return -1;
    return c->seqs[id].len;
}

int cinfer_batch_logit_rows(const cinfer_batch_entry *e, int n) {
    int rows = 0;
    for (int i = 0; i < n; i++) rows += e[i].all_logits ? e[i].n_tokens : (e[i].n_tokens > 0 ? 1 : 0);
    return rows;
}

/* logits: the rows to the host; or (cuda) smp: one choice per logits row made on the device, ids / lps back */
static int forward_impl(cinfer_ctx *c, const cinfer_batch_entry *e, int n, float *logits, const cuda_sample *smp,
                        int32_t *ids, float *lps, char *err, size_t errlen) {
    if (!c || (!e && n) || n < 0 || (!logits && !smp)) return ci_err(err, errlen, CINFER_EINVAL, "cinfer_forward: bad arguments");
    if (n == 0) return 0;
    const model *m = c->m;
    long total = 0;
    int rc = 0;
    memset(c->seen, 0, (size_t)c->p.max_seqs);
    for (int i = 0; i < n; i++) {
        if (e[i].seq < 0 || e[i].seq >= c->p.max_seqs || !c->seqs[e[i].seq].active)
            return ci_err(err, errlen, CINFER_EINVAL, "batch entry %d: sequence %d is not open", i, e[i].seq);
        if (c->seen[e[i].seq]++)
            return ci_err(err, errlen, CINFER_EINVAL, "batch entry %d: sequence %d appears twice in one batch", i, e[i].seq);
        if (e[i].n_tokens < 1 || !e[i].tokens)
            return ci_err(err, errlen, CINFER_EINVAL, "batch entry %d: no tokens", i);
        const seq_rec *s = &c->seqs[e[i].seq];
        /* a new window may replace a pending one (a drafter growing its window token by token): windows leave
         * the slot untouched, so only committed tokens ever count */
        if (s->pending && !e[i].spec)
            return ci_err(err, errlen, CINFER_ESTATE, "sequence %d has a speculative window awaiting cinfer_seq_commit", e[i].seq);
        if (e[i].spec && (e[i].n_tokens > c->p.spec_window || !s->spec))
            return ci_err(err, errlen, CINFER_EINVAL, "batch entry %d: a speculative window of %d tokens (spec_window is %d)", i,
                          e[i].n_tokens, c->p.spec_window);
        if ((long)s->len + e[i].n_tokens > c->p.max_ctx)
            return ci_err(err, errlen, CINFER_ERANGE, "sequence %d: %d + %d tokens exceed the context of %d", e[i].seq, s->len,
                          e[i].n_tokens, c->p.max_ctx);
        for (int t = 0; t < e[i].n_tokens; t++)
            if (e[i].tokens[t] < 0 || e[i].tokens[t] >= m->V)
                return ci_err(err, errlen, CINFER_EINVAL, "token id %d at position %d is outside the vocabulary [0, %d)",
                              e[i].tokens[t], t, m->V);
        /* a sequence given images must be fed the prompt they were laid out for */
        for (int t = 0; s->mm_tokens && t < e[i].n_tokens && s->len + t < s->mm.n; t++)
            if (e[i].tokens[t] != s->mm_tokens[s->len + t])
                return ci_err(err, errlen, CINFER_EINVAL,
                              "sequence %d: token %d at position %d differs from the prompt given with its images (%d)",
                              e[i].seq, e[i].tokens[t], s->len + t, s->mm_tokens[s->len + t]);
        total += e[i].n_tokens;
    }
    if (total > c->p.max_batch)
        return ci_err(err, errlen, CINFER_ERANGE, "batch of %ld tokens exceeds max_batch %d", total, c->p.max_batch);
    /* KV blocks: allocate what each sequence's new tokens need; on failure return the ones just taken */
    for (int i = 0; i < n && !rc; i++) {
        seq_rec *s = &c->seqs[e[i].seq];
        int need = (s->len + e[i].n_tokens + KV_BLOCK - 1) / KV_BLOCK;
        while (s->n_blocks < need) {
            int b = prefix_alloc_block(c->pc);
            if (b < 0) {
                rc = ci_err(err, errlen, CINFER_ENOMEM, "KV pool exhausted (%d blocks)", c->kv.n_blocks);
                break;
            }
            s->blocks[s->n_blocks++] = b;
        }
    }
    if (rc) {
        for (int i = 0; i < n; i++) {
            seq_rec *s = &c->seqs[e[i].seq];
            int keep = (s->len + KV_BLOCK - 1) / KV_BLOCK;
            while (s->n_blocks > keep) {
                s->n_blocks--;
                prefix_release_blocks(c->pc, &s->blocks[s->n_blocks], 1);
            }
        }
        return rc;
    }
    for (int i = 0; i < n; i++) {
        const seq_rec *s = &c->seqs[e[i].seq];
        c->fe[i] = (fwd_entry){s->len, e[i].tokens, e[i].n_tokens, e[i].all_logits, s->slot, s->blocks,
                               e[i].spec ? s->spec : NULL, c->p.spec_window, e[i].hidden, 0};
        if (s->mm_tokens) {
            fwd_entry *f = &c->fe[i];
            f->rope_delta = s->mm.delta;
            if (s->len < s->mm.n) {
                f->mm_n = s->mm.n - s->len;
                f->rope_pos = s->mm.pos + s->len;
                f->rope_stride = s->mm.n;
                f->embeds = s->mm_feat;
                f->embed_row = s->mm.row + s->len;
            }
        }
    }
    if (c->cf && smp) {
        rc = cuda_fwd_run_sample(c->cf, c->fe, n, smp, cinfer_batch_logit_rows(e, n), ids, lps, err, errlen);
        if (rc) return rc;
    } else if (c->cf) {
        if ((rc = cuda_fwd_run(c->cf, c->fe, n, logits, err, errlen))) return rc;
    } else {
        forward_cpu(m, &c->s, &c->kv, &c->st, c->tp, c->fe, n, logits);
    }
    for (int i = 0; i < n; i++) {
        if (e[i].spec) c->seqs[e[i].seq].pending = e[i].n_tokens;
        else c->seqs[e[i].seq].len += e[i].n_tokens;
    }
    return 0;
}

int cinfer_forward(cinfer_ctx *c, const cinfer_batch_entry *e, int n, float *logits, char *err, size_t errlen) {
    return forward_impl(c, e, n, logits, NULL, NULL, NULL, err, errlen);
}

int ctx_forward_sample(cinfer_ctx *c, const cinfer_batch_entry *e, int n, const cuda_sample *smp, int32_t *ids,
                       float *lps, char *err, size_t errlen) {
    if (!c || !c->cf || !smp || !ids)
        return ci_err(err, errlen, CINFER_EINVAL, "ctx_forward_sample: a cuda context, choices and ids are needed");
    /* refused before anything runs, so that a bad request never leaves a step half done */
    for (int r = 0; r < cinfer_batch_logit_rows(e, n); r++)
        if (!cuda_sample_eligible(smp[r].temperature, smp[r].top_k, c->m->V))
            return ci_err(err, errlen, CINFER_EINVAL, "ctx_forward_sample: row %d is not for the device sampler", r);
    return forward_impl(c, e, n, NULL, smp, ids, lps, err, errlen);
}

/* An image not yet encoded goes through the context's device tower (made at the first image). */
static int ctx_cuda_encode(cinfer_ctx *c, cinfer_image *im, char *err, size_t errlen) {
    if (im->feat) return 0;
    int rc;
    if (!c->cv && (rc = cuda_vision_create(c->m, &c->cv, err, errlen))) return rc;
    float *f = ci_try_alloc((size_t)im->n_tokens * c->m->H * sizeof(float));
    if (!f) return ci_err(err, errlen, CINFER_ENOMEM, "cannot allocate the features of an image of %d tokens", im->n_tokens);
    vision_grid g = {im->px.grid_t, im->px.grid_h, im->px.grid_w};
    if ((rc = cuda_vision_encode(c->cv, im->px.data, &g, 1, f, NULL, NULL, err, errlen))) {
        free(f);
        return rc;
    }
    im->feat = f;
    return 0;
}

int cinfer_seq_set_images(cinfer_ctx *c, int id, const int32_t *prompt, int n_prompt, cinfer_image *const *images,
                          int n_images, int *rope_delta, char *err, size_t errlen) {
    if (!c || id < 0 || id >= c->p.max_seqs || !c->seqs[id].active)
        return ci_err(err, errlen, CINFER_EINVAL, "cinfer_seq_set_images: sequence %d is not open", id);
    seq_rec *s = &c->seqs[id];
    if (s->len || s->pending || s->mm_tokens)
        return ci_err(err, errlen, CINFER_ESTATE, "sequence %d: images go with the whole prompt, before any token", id);
    if (!prompt || n_prompt < 1 || n_images < 1 || !images)
        return ci_err(err, errlen, CINFER_EINVAL, "cinfer_seq_set_images: a prompt and at least one image are needed");
    if (n_prompt > c->p.max_ctx)
        return ci_err(err, errlen, CINFER_ERANGE, "sequence %d: a prompt of %d tokens exceeds the context of %d", id, n_prompt,
                      c->p.max_ctx);
    const model *m = c->m;
    if (!m->vis.present) return ci_err(err, errlen, CINFER_EUNSUPPORTED, "this model has no vision tower");
    vision_grid *g = xmalloc((size_t)n_images * sizeof *g);
    for (int i = 0; i < n_images; i++) {
        if (!images[i] || images[i]->H != m->H) {
            free(g);
            return ci_err(err, errlen, CINFER_EINVAL, "image %d is missing or was loaded for another model", i);
        }
        g[i] = (vision_grid){images[i]->px.grid_t, images[i]->px.grid_h, images[i]->px.grid_w};
    }
    mm_layout L;
    int rc = mm_layout_build(&m->cfg, m->vis.merge, prompt, n_prompt, g, n_images, &L, err, errlen);
    free(g);
    if (rc) return rc;
    float *feat = ci_try_alloc((size_t)L.n_feat * m->H * sizeof(float) + 64);
    int32_t *toks = malloc((size_t)n_prompt * sizeof(int32_t));
    if (!feat || !toks) rc = ci_err(err, errlen, CINFER_ENOMEM, "cannot allocate the features of %d image tokens", L.n_feat);
    size_t off = 0;
    for (int i = 0; !rc && i < n_images; i++) {
        if ((rc = c->cf ? ctx_cuda_encode(c, images[i], err, errlen) : mm_image_encode(m, images[i], c->tp, err, errlen)))
            break;
        memcpy(feat + off, images[i]->feat, (size_t)images[i]->n_tokens * m->H * sizeof(float));
        off += (size_t)images[i]->n_tokens * m->H;
    }
    if (rc) {
        free(feat);
        free(toks);
        mm_layout_free(&L);
        return rc;
    }
    memcpy(toks, prompt, (size_t)n_prompt * sizeof(int32_t));
    s->mm_tokens = toks;
    s->mm_feat = feat;
    s->mm = L;
    if (rope_delta) *rope_delta = L.delta;
    return 0;
}

int cinfer_seq_commit(cinfer_ctx *c, int id, int n_keep, char *err, size_t errlen) {
    if (!c || id < 0 || id >= c->p.max_seqs || !c->seqs[id].active)
        return ci_err(err, errlen, CINFER_EINVAL, "cinfer_seq_commit: sequence %d is not open", id);
    seq_rec *s = &c->seqs[id];
    if (n_keep < 0 || n_keep > s->pending)
        return ci_err(err, errlen, CINFER_EINVAL, "cinfer_seq_commit: keep %d of a %d-token window", n_keep, s->pending);
    if (c->cf) {
        int rc = cuda_fwd_spec_commit(c->cf, s->slot, n_keep, err, errlen);
        if (rc) return rc;
    } else {
        forward_spec_commit(c->m, &c->st, s->slot, s->spec, c->p.spec_window, n_keep);
    }
    s->len += n_keep;
    s->pending = 0;
    /* KV rows past the kept length are simply overwritten later; blocks wholly past it go back now */
    int keep_blocks = (s->len + KV_BLOCK - 1) / KV_BLOCK;
    while (s->n_blocks > keep_blocks) {
        s->n_blocks--;
        prefix_release_blocks(c->pc, &s->blocks[s->n_blocks], 1);
    }
    return 0;
}

/* ---- for the engine (ctx_internal.h) ---- */
int ctx_seq_state_stash(cinfer_ctx *c, int id, float *dst, char *err, size_t errlen) {
    if (!c || id < 0 || id >= c->p.max_seqs || !c->seqs[id].active)
        return ci_err(err, errlen, CINFER_EINVAL, "ctx_seq_state_stash: sequence %d is not open", id);
    if (c->seqs[id].pending)
        return ci_err(err, errlen, CINFER_ESTATE,
                      "sequence %d has a speculative window awaiting cinfer_seq_commit", id);
    if (c->m->n_lin <= 0) return 0;
    if (!dst) return ci_err(err, errlen, CINFER_EINVAL, "ctx_seq_state_stash: no destination");
    int slot = c->seqs[id].slot;
    if (c->cf) return cuda_fwd_state_save(c->cf, slot, dst, err, errlen);
    for (int l = 0; l < c->st.n_layers; l++, dst += c->st.conv_floats)
        memcpy(dst, state_conv(&c->st, slot, l), c->st.conv_floats * sizeof(float));
    for (int l = 0; l < c->st.n_layers; l++, dst += c->st.rec_floats)
        memcpy(dst, state_rec(&c->st, slot, l), c->st.rec_floats * sizeof(float));
    return 0;
}

int ctx_seq_rewind(cinfer_ctx *c, int id, int len, const float *src, char *err, size_t errlen) {
    if (!c || id < 0 || id >= c->p.max_seqs || !c->seqs[id].active)
        return ci_err(err, errlen, CINFER_EINVAL, "ctx_seq_rewind: sequence %d is not open", id);
    seq_rec *s = &c->seqs[id];
    if (s->pending)
        return ci_err(err, errlen, CINFER_ESTATE,
                      "sequence %d has a speculative window awaiting cinfer_seq_commit", id);
    if (len < 0 || len > s->len)
        return ci_err(err, errlen, CINFER_EINVAL, "ctx_seq_rewind: sequence %d has %d tokens, not %d", id,
                      s->len, len);
    if (c->m->n_lin > 0 && !src)
        return ci_err(err, errlen, CINFER_EINVAL, "ctx_seq_rewind: no state to load");
    if (len == s->len) return 0; /* the state is already the one at len */
    if (len % KV_BLOCK && prefix_block_refs(c->pc, s->blocks[len / KV_BLOCK]) > 1)
        return ci_err(err, errlen, CINFER_ESTATE,
                      "ctx_seq_rewind: position %d lies in a block the prefix cache shares", len);
    if (c->m->n_lin > 0) {
        int slot = s->slot, rc;
        if (c->cf) {
            if ((rc = cuda_fwd_state_load(c->cf, slot, src, err, errlen))) return rc;
        } else {
            for (int l = 0; l < c->st.n_layers; l++, src += c->st.conv_floats)
                memcpy(state_conv(&c->st, slot, l), src, c->st.conv_floats * sizeof(float));
            for (int l = 0; l < c->st.n_layers; l++, src += c->st.rec_floats)
                memcpy(state_rec(&c->st, slot, l), src, c->st.rec_floats * sizeof(float));
        }
    }
    s->len = len;
    int keep_blocks = (len + KV_BLOCK - 1) / KV_BLOCK;
    while (s->n_blocks > keep_blocks) {
        s->n_blocks--;
        prefix_release_blocks(c->pc, &s->blocks[s->n_blocks], 1);
    }
    if (c->mtp_on) mtp_drop(c, s, len);
    return 0;
}

int ctx_sync(cinfer_ctx *c, char *err, size_t errlen) {
    return c->cf ? cuda_fwd_sync(c->cf, err, errlen) : 0;
}

void ctx_graph_stats(const cinfer_ctx *c, int *captured, int *updated) {
    *captured = *updated = 0;
    if (c->cf) cuda_fwd_graph_stats(c->cf, captured, updated);
}

int ctx_profile(cinfer_ctx *c, int on, double *ms, int *calls) {
    if (!c->cf) return -1;
    if (!on) cuda_fwd_profile_get(c->cf, ms, calls);
    cuda_fwd_profile(c->cf, on);
    return 0;
}

int ctx_kv_free_blocks(const cinfer_ctx *c) { return prefix_available_blocks(c->pc); }
int ctx_kv_blocks_per_seq(const cinfer_ctx *c) { return c->blocks_per_seq; }

int ctx_prefix_peek(const cinfer_ctx *c, const int32_t *tokens, int n, int *n_shared) {
    return prefix_peek(c->pc, tokens, n, c->blocks_per_seq, n_shared);
}

int ctx_seq_resume(cinfer_ctx *c, int id, const int32_t *prompt, int n_prompt, int *cached, char *err, size_t errlen) {
    *cached = 0;
    seq_rec *s = &c->seqs[id];
    if (!s->active || s->len || s->n_blocks || n_prompt < 1) return 0;
    prefix_hit hit; /* (a 1-token prompt: a lookup of nothing, a miss) */
    int rc = prefix_lookup(c->pc, prompt, n_prompt - 1, s->blocks, c->blocks_per_seq, s->slot, &hit, err, errlen);
    if (rc) return rc;
    s->len = hit.n_tokens;
    s->n_blocks = hit.n_blocks;
    *cached = hit.n_tokens;
    return 0;
}

int ctx_seq_snapshot(cinfer_ctx *c, int id, const int32_t *tokens, char *err, size_t errlen) {
    seq_rec *s = &c->seqs[id];
    if (!s->active || s->pending) return ci_err(err, errlen, CINFER_ESTATE, "no snapshot of sequence %d now", id);
    return prefix_insert(c->pc, tokens, s->len, s->blocks, s->slot, err, errlen);
}

int ctx_prefix_next(const cinfer_ctx *c, const int *marks, int n_marks, int pos, int end) {
    return prefix_next_snapshot(c->pc, marks, n_marks, pos, end);
}

void ctx_prefix_stats(const cinfer_ctx *c, prefix_stats *st) { prefix_get_stats(c->pc, st); }
int ctx_kv_total_blocks(const cinfer_ctx *c) { return c->kv.n_blocks; }
int ctx_slots_used(const cinfer_ctx *c) {
    int n = 0;
    for (int i = 0; i < c->p.max_seqs; i++) n += c->seqs[i].active;
    return n;
}
const model *cinfer_model_internal(const cinfer_model *m) { return m->m; }

const float *ctx_seq_state(const cinfer_ctx *c, int seq, int layer, int recurrent, size_t *n_floats) {
    if (seq < 0 || seq >= c->p.max_seqs || !c->seqs[seq].active || layer < 0 || layer >= c->st.n_layers) return NULL;
    *n_floats = recurrent ? c->st.rec_floats : c->st.conv_floats;
    return recurrent ? state_rec(&c->st, c->seqs[seq].slot, layer) : state_conv(&c->st, c->seqs[seq].slot, layer);
}

size_t ctx_seq_state_floats(const cinfer_ctx *c) {
    const model *m = c->m;
    return (size_t)m->n_lin * ((size_t)(m->K - 1) * m->C + (size_t)m->Hv * m->dk * m->dv);
}

int ctx_seq_state_copy(cinfer_ctx *c, int seq, float *dst, char *err, size_t errlen) {
    if (seq < 0 || seq >= c->p.max_seqs || !c->seqs[seq].active)
        return ci_err(err, errlen, CINFER_EINVAL, "ctx_seq_state_copy: sequence %d is not open", seq);
    int slot = c->seqs[seq].slot, rc;
    if (c->cf) {
        if ((rc = cuda_fwd_state_save(c->cf, slot, dst, err, errlen))) return rc;
        return cuda_fwd_sync(c->cf, err, errlen);
    }
    for (int l = 0; l < c->st.n_layers; l++) {
        memcpy(dst, state_conv(&c->st, slot, l), c->st.conv_floats * sizeof(float));
        dst += c->st.conv_floats;
    }
    for (int l = 0; l < c->st.n_layers; l++) {
        memcpy(dst, state_rec(&c->st, slot, l), c->st.rec_floats * sizeof(float));
        dst += c->st.rec_floats;
    }
    return 0;
}

/* ---- the MTP head (ctx_internal.h) ---- */

int ctx_mtp_init(cinfer_ctx *c, int n_vocab, char *err, size_t errlen) {
    const model *m = c->m;
    if (c->mtp_on) return ci_err(err, errlen, CINFER_ESTATE, "the MTP head is already initialised");
    if (!m->mtp.present) return ci_err(err, errlen, CINFER_EUNSUPPORTED, "the checkpoint has no MTP head (mtp.* tensors)");
    /* a sequence's head rows never outrun its target rows by more than a window, and a sequence resumed from
     * the prefix cache has head rows only past the cached prefix: the target pool's block count plus one
     * block per sequence covers every case, and never more than every sequence at full context */
    long nb = (long)c->kv.n_blocks + c->p.max_seqs, full = (long)c->p.max_seqs * c->blocks_per_seq;
    if (nb > full) nb = full;
    /* on cuda the head's pool is on the device (the host pool keeps the free list) */
    int rc = kv_pool_init(&c->mkv, c->cf ? 0 : 1, (int)nb, m->Hkv * m->hd, err, errlen);
    if (rc) return rc;
    if (c->cf && (rc = cuda_fwd_mtp_init(c->cf, (int)nb, err, errlen))) {
        kv_pool_free(&c->mkv);
        return rc;
    }
    c->mtp_cat = c->cf ? NULL : ci_try_alloc(sizeof(float) * mtp_scratch_floats(m, c->p.max_batch));
    if (!c->cf && !c->mtp_cat) {
        kv_pool_free(&c->mkv);
        return ci_err(err, errlen, CINFER_ENOMEM, "cannot allocate the MTP scratch");
    }
    c->mtp_block_store = xmalloc((size_t)c->p.max_seqs * c->blocks_per_seq * sizeof(int));
    for (int i = 0; i < c->p.max_seqs; i++) c->seqs[i].mtp_blocks = c->mtp_block_store + (size_t)i * c->blocks_per_seq;
    c->mfe = xcalloc((size_t)c->p.max_batch, sizeof *c->mfe);
    c->mio = xcalloc((size_t)c->p.max_batch, sizeof *c->mio);
    c->mtp_vocab = n_vocab > 0 && n_vocab < m->V ? n_vocab : m->V;
    c->mtp_on = 1;
    return 0;
}

int ctx_mtp_len(const cinfer_ctx *c, int seq) {
    if (!c->mtp_on || seq < 0 || seq >= c->p.max_seqs || !c->seqs[seq].active) return -1;
    return c->seqs[seq].mtp_len;
}

static int mtp_forward(cinfer_ctx *c, const ctx_mtp_entry *e, int n, float *logits, int32_t *ids, char *err,
                       size_t errlen) {
    if (!c->mtp_on) return ci_err(err, errlen, CINFER_ESTATE, "the MTP head is not initialised (ctx_mtp_init)");
    if (n <= 0) return 0;
    const model *m = c->m;
    long total = 0;
    memset(c->seen, 0, (size_t)c->p.max_seqs);
    for (int i = 0; i < n; i++) {
        if (e[i].seq < 0 || e[i].seq >= c->p.max_seqs || !c->seqs[e[i].seq].active)
            return ci_err(err, errlen, CINFER_EINVAL, "MTP entry %d: sequence %d is not open", i, e[i].seq);
        if (c->seen[e[i].seq]++)
            return ci_err(err, errlen, CINFER_EINVAL, "MTP entry %d: sequence %d appears twice in one batch", i, e[i].seq);
        const seq_rec *s = &c->seqs[e[i].seq];
        if (e[i].n < 1 || !e[i].tokens || !e[i].hidden) return ci_err(err, errlen, CINFER_EINVAL, "MTP entry %d: no rows", i);
        /* rows continue the head's rows or rewrite its tail; a fresh head may start anywhere (a resumed prompt) */
        if (e[i].pos < 0 || (s->mtp_len > s->mtp_start && (e[i].pos > s->mtp_len || e[i].pos < s->mtp_start)))
            return ci_err(err, errlen, CINFER_EINVAL, "MTP entry %d: position %d, the head holds [%d, %d)", i, e[i].pos,
                          s->mtp_start, s->mtp_len);
        if ((long)e[i].pos + e[i].n > c->p.max_ctx)
            return ci_err(err, errlen, CINFER_ERANGE, "MTP entry %d: %d + %d rows exceed the context of %d", i, e[i].pos, e[i].n,
                          c->p.max_ctx);
        for (int t = 0; t < e[i].n; t++)
            if (e[i].tokens[t] < 0 || e[i].tokens[t] >= m->V)
                return ci_err(err, errlen, CINFER_EINVAL, "token id %d outside the vocabulary [0, %d)", e[i].tokens[t], m->V);
        total += e[i].n;
    }
    if (total > c->p.max_batch) return ci_err(err, errlen, CINFER_ERANGE, "MTP batch of %ld rows exceeds max_batch %d", total, c->p.max_batch);
    /* blocks: drop what lies past each entry's first row, then cover its rows; on exhaustion nothing runs */
    int short_of = 0;
    for (int i = 0; i < n; i++) {
        seq_rec *s = &c->seqs[e[i].seq];
        if (s->mtp_len <= s->mtp_start) { /* no rows yet: the head starts at this entry's first row */
            mtp_reset(c, s);
            s->mtp_start = e[i].pos;
            for (int b = 0; b < s->mtp_start / KV_BLOCK; b++) s->mtp_blocks[b] = -1;
            s->mtp_n_blocks = s->mtp_start / KV_BLOCK;
        } else {
            mtp_drop(c, s, e[i].pos);
        }
        s->mtp_len = e[i].pos;
        int need = (e[i].pos + e[i].n + KV_BLOCK - 1) / KV_BLOCK;
        while (s->mtp_n_blocks < need) {
            int b = kv_alloc_block(&c->mkv);
            if (b < 0) {
                short_of = 1;
                break;
            }
            s->mtp_blocks[s->mtp_n_blocks++] = b;
        }
    }
    if (short_of) {
        for (int i = 0; i < n; i++) mtp_drop(c, &c->seqs[e[i].seq], e[i].pos);
        return ci_err(err, errlen, CINFER_ENOMEM, "the MTP KV pool is exhausted (%d blocks)", c->mkv.n_blocks);
    }
    for (int i = 0; i < n; i++) {
        const seq_rec *s = &c->seqs[e[i].seq];
        c->mfe[i] = (fwd_entry){e[i].pos, e[i].tokens, e[i].n, 0, -1, s->mtp_blocks, NULL, 0, NULL, s->mtp_start};
        c->mio[i] = (mtp_io){e[i].hidden, e[i].hidden_out, e[i].logits};
    }
    if (c->cf) {
        int rc = ids ? cuda_fwd_mtp_run_ids(c->cf, c->mfe, c->mio, n, c->mtp_vocab, ids, err, errlen)
                     : cuda_fwd_mtp_run(c->cf, c->mfe, c->mio, n, c->mtp_vocab, logits, err, errlen);
        if (rc) { /* as on ENOMEM: the rows from each entry's pos on are gone */
            for (int i = 0; i < n; i++) mtp_drop(c, &c->seqs[e[i].seq], e[i].pos);
            return rc;
        }
    } else {
        forward_mtp(m, &c->s, &c->mkv, c->tp, c->mfe, c->mio, n, c->mtp_cat, c->mtp_vocab, logits);
    }
    for (int i = 0; i < n; i++) c->seqs[e[i].seq].mtp_len = e[i].pos + e[i].n;
    return 0;
}

int ctx_mtp_forward(cinfer_ctx *c, const ctx_mtp_entry *e, int n, float *logits, char *err, size_t errlen) {
    return mtp_forward(c, e, n, logits, NULL, err, errlen);
}

int ctx_mtp_forward_ids(cinfer_ctx *c, const ctx_mtp_entry *e, int n, int32_t *ids, char *err,
                        size_t errlen) {
    if (!c || !c->cf || !ids)
        return ci_err(err, errlen, CINFER_EINVAL, "ctx_mtp_forward_ids: a cuda context and ids are needed");
    return mtp_forward(c, e, n, NULL, ids, err, errlen);
}

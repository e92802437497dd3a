/* engine.c — continuous batching (DESIGN §3): HTTP threads submit requests; one scheduler thread owns
 * the context (KV blocks, DeltaNet slots) and runs steps. Each step gathers one decode token per running
 * sequence plus prefill chunks of the sequences still reading their prompt, within a token budget, and
 * runs them as one ragged batch; a sequence's result does not depend on the batch (forward.h). Sampled
 * tokens go through the streaming detokenizer, stop strings, the reasoning splitter and the tool-call
 * parser, and come out as events on the request's own queue. Finished, stopped and cancelled sequences
 * leave the batch at once and give back their slot and blocks. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cinfer.h"
#include "model/forward.h"
#include "model/forward_cuda.h"
#include "model/qwen35.h"
#include "runtime/ctx_internal.h"
#include "runtime/engine_internal.h"
#include "util/bf16.h"
#include "runtime/kvcache.h"
#include "runtime/mm.h"
#include "runtime/prefix.h"
#include "runtime/text.h"
#include "sample/grammar.h"
#include "sample/sampler.h"
#include "sample/stop.h"
#include "tok/reasoning.h"
#include "tok/tokenizer.h"
#include "tok/toolcall.h"
#include "util/alloc.h"
#include "util/err.h"
#include "util/log.h"

#define MAX_STOP 16

/* ---- events: a queue per request, produced by the scheduler, consumed by the client thread ---- */
typedef struct ev_node {
    struct ev_node *next;
    cinfer_event ev;
    cinfer_top_logprob *top; /* owned */
    char *buf;               /* owned: text / tool strings / token text */
} ev_node;

typedef enum { RQ_QUEUED, RQ_RUNNING, RQ_FINISHED } rq_state;

struct cinfer_request {
    cinfer_engine *eng;
    struct cinfer_request *next; /* in the engine's waiting list */
    /* copied at submit, read-only after */
    int32_t *prompt;
    int32_t *key; /* [n_prompt] the prefix cache's key when the prompt has images (image_key), else NULL */
    int n_prompt, max_tokens, ignore_eos, skip_special, reasoning;
    cinfer_sampling samp;
    cinfer_logit_bias *bias;
    char *stop[MAX_STOP];
    int n_stop;
    cinfer_tool_format tool_format;
    char *tools_json;
    cinfer_image **images; /* [n_images] until admission hands them to the context (owned) */
    int n_images;          /* images of the prompt (negative once admission freed them) */
    /* the client side (under mu) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ev_node *head, *tail, *cur;
    int final_queued, final_taken, client_gone, engine_done;
    atomic_int cancel;
    /* the scheduler side */
    rq_state state;
    int seq;              /* context sequence id */
    int n_fed;            /* prompt tokens already run through the model */
    int n_gen;
    int32_t last;         /* the last sampled token, fed at the next step */
    int n_tool_calls;
    int *marks;           /* prefix cache: positions where a snapshot is wanted (each <|im_start|> after the first) */
    int n_marks;
    int cached;           /* prompt tokens served from the prefix cache */
    int32_t *hist;        /* prompt + generated tokens (speculation's n-gram lookup), [n_prompt + max_tokens + 1] */
    int n_hist;
    int draft_len;        /* speculation: drafts proposed per step, adapted to the acceptance rate */
    int32_t drafts[64];   /* this step's window: [r->last | drafts] (drafts[1..n_drafts]) */
    int n_drafts;
    int dseq;             /* draft model: the request's sequence in the draft context (-1: none) */
    int d_fed;            /* draft model: prompt tokens it has read */
    int d_window;         /* draft model: window tokens ([last, d1..]) it read this step, as plain decode steps
                             that draft_model_sync keeps or rewinds */
    int32_t dread[64];    /* draft model: the window tokens it read (drafts[0, d_window)) */
    int32_t catchup[64];  /* draft model: kept tokens it has yet to read (fed at the next step) */
    int32_t forced[64];   /* draft model under a test's or benchmark's drafter: the tokens it reads instead of
                             its own argmax (bench --spec draft --spec-accept) */
    int dk;               /* draft model: drafts this step (draft_len, the output budget, the forced count) */
    int n_catchup;
    int mtp_off;          /* MTP: the head lost its rows for this request (no KV block): no more drafts */
    int mtp_next;         /* MTP: the head's first chained position (its rows below are the target's) */
    double acc_num,
        acc_den;   /* CINFER_SPEC_COST: decayed counts of kept drafts / drafts checked (a ~ num / den) */
    int32_t probe; /* CINFER_SPEC_COST: the first draft of a step that declined to speculate (-1: none) */
    sampler *smp;
    sampler_result res;   /* the last step's token and logprobs */
    text_stream *ts;      /* detokenizer for this request */
    stop_matcher stop_m;
    char *stop_buf;       /* stop_feed output, STOP_HOLD_MAX + the longest text delta */
    size_t stop_cap;
    rs_parser *rs;
    tc_parser *tc;
    const char *finish;
    char *stop_hit;
    grammar *gr;          /* constrained decoding (NULL: none) */
    gm_matcher *gm;
    uint32_t *mask;       /* [(V + 31) / 32] tokens the grammar allows this step */
    float *masked;        /* [V] f32: the row with the rest at -inf, what the sampler sees */
    int dev_greedy;       /* cuda: plain greedy (no bias, penalties, top_logprobs): the device may choose */
    int dev_lp;           /* with the chosen token's logprob */
    double t_submit;      /* CINFER_TTFT_TRACE: ms (now_ms) at submit */
};

struct cinfer_engine {
    cinfer_model *cm;
    const model *m;
    cinfer_engine_params p;
    cinfer_ctx *ctx;
    float *logits;                  /* [max_seqs * (1 + spec_max_draft)][V] f32: the rows cinfer_forward writes */
    int *entry_row;                 /* [max_seqs] first logits row of each entry */
    int64_t spec_drafted, spec_accepted; /* speculation counters (scheduler thread) */
    int32_t im_start;               /* <|im_start|>, where chat messages begin (-1: none) */
    atomic_llong stat_px_lookups, stat_px_hits, stat_px_tokens, stat_px_evict, stat_px_bytes;
    atomic_int stat_px_blocks;
    atomic_llong stat_px_kv_bytes;
    cinfer_ctx *dctx;               /* CINFER_SPEC_DRAFT: the draft model's context (same max_seqs, ctx_size) */
    float *dlogits;                 /* [max_seqs][V] the draft model's rows (NULL when the device chooses) */
    float *dsnap;                   /* [max_seqs][spec_max_draft - 1][dsnap_floats] f32: draft states after 1..k-1
                                       window tokens (device memory on cuda), or NULL */
    size_t dsnap_floats;            /* ctx_seq_state_floats of the draft context */
    int dsnap_dev;                  /* dsnap is cuda_dev_alloc'd */
    cuda_sample *ddsmp;             /* [max_seqs] greedy choices of the draft's rows on the device, or NULL */
    int32_t *ddids;                 /* [max_seqs] the draft's argmax per row */
    long long d_prompt_read;        /* prompt tokens the draft model read (tests: engine_draft_prompt_tokens) */
    cinfer_batch_entry *dentries;   /* [max_seqs] */
    cinfer_request **dreq;          /* [max_seqs] */
    /* CINFER_SPEC_MTP: the head reads the target's final-normed hidden rows of each step */
    float *hid;                     /* [step_tokens][H] f32: this step's target hidden rows, entry after entry */
    int *entry_hrow;                /* [max_seqs] first hidden row of each entry */
    int *entry_pos;                 /* [max_seqs] position of each entry's first token */
    int *entry_keep;                /* [max_seqs] tokens of the entry the sequence kept (0: finished or failed) */
    ctx_mtp_entry *ment;            /* [max_seqs] */
    cinfer_request **mreq;          /* [max_seqs] */
    float *mtp_h;                   /* [max_seqs][H] f32: the head's last normed output per sequence id (chaining) */
    float *mlogits;                 /* [max_seqs][mtp_vocab] f32 */
    int32_t *mids;                  /* [max_seqs] the head rows' argmax when the device takes it */
    int mtp_vocab;                  /* the head drafts among ids [0, mtp_vocab) */
    engine_draft_fn drafter;        /* NULL: the built-in n-gram drafter */
    void *drafter_ud;
    engine_draft_observer_fn dobs;  /* tests: told each window the draft model proposed */
    void *dobs_ud;
    cinfer_batch_entry *entries;    /* [max_seqs] */
    cinfer_request **entry_req;     /* [max_seqs] */
    cinfer_request **running;       /* [max_seqs] */
    int n_running;
    pthread_t thread;
    pthread_mutex_t mu;             /* guards the waiting list, stop, stats counters below */
    pthread_cond_t cv;
    cinfer_request *wait_head, *wait_tail;
    int n_waiting, stop;
    int n_admitted;                 /* running requests, as counted under mu (for the queue limit) */
    atomic_llong requests_total, prompt_tokens_total, generated_tokens_total, steps_total;
    atomic_llong device_chosen_total; /* tokens the device chose (cinfer_engine_stats.device_chosen_tokens) */
    atomic_int stat_running, stat_kv_used, stat_slots_used;
    atomic_llong stat_spec_drafted, stat_spec_accepted;
    /* constrained decoding: each token's bytes, built at the first constrained request (under gv_mu) */
    pthread_mutex_t gv_mu;
    gm_vocab *gv;
    char **gv_tok;                  /* [V] the bytes of token t (NULL: never under a grammar: special, EOS) */
    size_t *gv_len;                 /* [V] */
    /* cuda with CINFER_CUDA_SAMPLE=1: steps whose every row is plain greedy choose on the device */
    int dev_sample;
    int pad;                        /* windows padded to spec_max_draft + 1 rows (step(); CINFER_SPEC_PAD) */
    atomic_llong stat_pad_rows;     /* rows past the drafts that padded windows carried */
    /* CINFER_SPEC_COST=1 (with padding): measured wall ms of pure decode steps of B entries, plain and padded
     * (spec_pays), each after its first cost_skip samples */
    int cost_on;
    int trace;                      /* CINFER_TTFT_TRACE: stderr lines timing admission, steps and snapshots */
    int px_gap;                     /* next_stop: interval snapshots this close past a resume point are skipped */
    int px_exact;                   /* resume only where the request's own cold prefill ends a piece (resume_len) */
    double *cost_ms[2];             /* [max_seqs + 1] each: 0 plain, 1 padded windows; 0: not measured yet */
    int *cost_n[2];                 /* [max_seqs + 1] samples seen */
    long cost_steps;                /* decisions made (every COST_PROBE-th re-measures the kind not chosen) */
    int cost_skip; /* first samples of a (kind, B) not counted: on cuda eager, then a capture */
    cuda_sample *dsmp;              /* [max_seqs * (1 + spec_max_draft)]: one per logits row */
    cuda_sample_pen *dpen;          /* [CUDA_SAMPLE_PEN_CAP]: the sampled rows' adjusted tokens of a step */
    int32_t *dids;                  /* [max_seqs * (1 + spec_max_draft)] */
    float *dlps;                    /* [max_seqs * (1 + spec_max_draft)] */
};

/* ---- event queue ---- */

static void push_event(cinfer_request *r, ev_node *n) {
    pthread_mutex_lock(&r->mu);
    if (r->client_gone) { /* nobody will read it */
        pthread_mutex_unlock(&r->mu);
        free(n->top);
        free(n->buf);
        free(n);
        return;
    }
    if (n->ev.type == CINFER_EV_DONE || n->ev.type == CINFER_EV_ERROR) r->final_queued = 1;
    if (r->tail) r->tail->next = n;
    else r->head = n;
    r->tail = n;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static ev_node *new_event(cinfer_event_type t, size_t buflen) {
    ev_node *n = xcalloc(1, sizeof *n);
    n->ev.type = t;
    if (buflen) n->buf = xmalloc(buflen + 1);
    return n;
}

static void emit_text(cinfer_request *r, cinfer_event_type t, const char *s, size_t len) {
    if (!len) return;
    ev_node *n = new_event(t, len);
    memcpy(n->buf, s, len);
    n->buf[len] = 0;
    n->ev.text = n->buf;
    n->ev.len = len;
    push_event(r, n);
}

static void tc_cb(const tc_event *e, void *ud) {
    cinfer_request *r = ud;
    switch (e->kind) {
    case TC_EV_CONTENT: emit_text(r, CINFER_EV_CONTENT, e->text, e->len); break;
    case TC_EV_CALL_BEGIN: {
        size_t a = strlen(e->id), b = strlen(e->name);
        ev_node *n = new_event(CINFER_EV_TOOL_CALL, a + b + 2);
        memcpy(n->buf, e->id, a + 1);
        memcpy(n->buf + a + 1, e->name, b + 1);
        n->ev.tool_index = e->index;
        n->ev.tool_id = n->buf;
        n->ev.tool_name = n->buf + a + 1;
        n->ev.tool_args = "";
        push_event(r, n);
        r->n_tool_calls++;
        break;
    }
    case TC_EV_CALL_ARGS: {
        ev_node *n = new_event(CINFER_EV_TOOL_CALL, e->len);
        memcpy(n->buf, e->text, e->len);
        n->buf[e->len] = 0;
        n->ev.tool_index = e->index;
        n->ev.tool_args = n->buf;
        n->ev.tool_args_len = e->len;
        push_event(r, n);
        break;
    }
    case TC_EV_CALL_ABORT: r->n_tool_calls--; break;
    default: break;
    }
}

static void content(cinfer_request *r, const char *s, size_t len) {
    if (r->tc) tc_feed(r->tc, s, len, tc_cb, r);
    else emit_text(r, CINFER_EV_CONTENT, s, len);
}

static void rs_cb(const rs_event *e, void *ud) {
    cinfer_request *r = ud;
    if (e->kind == RS_EV_REASONING) emit_text(r, CINFER_EV_REASONING, e->text, e->len);
    else content(r, e->text, e->len);
}

/* Text that passed the stop matcher: split reasoning, then tool calls. */
static void route_text(cinfer_request *r, const char *s, size_t len) {
    if (!len) return;
    if (r->rs) rs_feed(r->rs, s, len, rs_cb, r);
    else content(r, s, len);
}

/* Text from the detokenizer through the stop matcher; returns 1 when a stop string completed. */
static int feed_stop(cinfer_request *r, const char *txt, size_t len) {
    while (len) {
        /* feed in pieces that fit the output buffer */
        size_t piece = len, cap_text = r->stop_cap - STOP_HOLD_MAX;
        if (piece > cap_text) piece = cap_text;
        size_t n_out = 0;
        int rc = stop_feed(&r->stop_m, txt, piece, r->stop_buf, r->stop_cap, &n_out);
        if (rc < 0) return 0;
        route_text(r, r->stop_buf, n_out);
        if (rc == 1) {
            r->stop_hit = xstrdup(r->stop[r->stop_m.matched]);
            return 1;
        }
        txt += piece;
        len -= piece;
    }
    return 0;
}

/* ---- request lifecycle ---- */

static void request_release_engine_side(cinfer_request *r) {
    sampler_destroy(r->smp);
    text_stream_free(r->ts);
    rs_free(r->rs);
    tc_free(r->tc);
    gm_matcher_free(r->gm);
    grammar_free(r->gr);
    free(r->mask), free(r->masked);
    r->gm = NULL, r->gr = NULL, r->mask = NULL, r->masked = NULL;
    free(r->stop_buf);
    r->stop_buf = NULL;
    r->smp = NULL;
    r->ts = NULL;
    r->rs = NULL;
    r->tc = NULL;
}

static void request_destroy(cinfer_request *r) {
    request_release_engine_side(r);
    for (ev_node *n = r->head; n;) {
        ev_node *x = n->next;
        free(n->top), free(n->buf), free(n);
        n = x;
    }
    if (r->cur) free(r->cur->top), free(r->cur->buf), free(r->cur);
    free(r->prompt);
    free(r->key);
    free(r->marks);
    free(r->hist);
    free(r->bias);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->tools_json);
    for (int i = 0; i < r->n_images; i++) cinfer_image_free(r->images[i]); /* n_images < 0: already freed */
    free(r->images);
    free(r->stop_hit);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

static void update_stats(cinfer_engine *e);

/* The engine is done with r: queue DONE (unless the client left) and drop the engine's reference. */
static void finish_request(cinfer_engine *e, cinfer_request *r, const char *reason) {
    if (r->state == RQ_RUNNING) {
        /* flush held text: stop matcher, reasoning, tool calls */
        if (r->ts && strcmp(reason, "cancelled") && strcmp(reason, "stop_string")) {
            /* the end: what the detokenizer and the stop matcher still hold is final */
            const char *txt;
            size_t len, n_out = 0;
            text_stream_flush(r->ts, &txt, &len);
            if (len) feed_stop(r, txt, len);
            if (r->stop_m.matched < 0 && stop_finish(&r->stop_m, r->stop_buf, r->stop_cap, &n_out) == 0)
                route_text(r, r->stop_buf, n_out);
        }
        if (!strcmp(reason, "stop_string")) reason = "stop";
        if (r->rs) rs_finish(r->rs, rs_cb, r);
        if (r->tc) tc_finish(r->tc, tc_cb, r);
        cinfer_seq_close(e->ctx, r->seq);
        if (e->dctx && r->dseq >= 0) cinfer_seq_close(e->dctx, r->dseq);
        r->dseq = -1;
        pthread_mutex_lock(&e->mu);
        e->n_admitted--;
        pthread_mutex_unlock(&e->mu);
        /* before DONE goes out: a client that reads the stats right after sees its blocks back */
        update_stats(e);
    }
    if (!strcmp(reason, "stop") && r->n_tool_calls > 0) reason = "tool_calls";
    ev_node *n = new_event(CINFER_EV_DONE, r->stop_hit ? strlen(r->stop_hit) : 0);
    n->ev.finish_reason = reason; /* static strings */
    if (r->stop_hit) {
        strcpy(n->buf, r->stop_hit);
        n->ev.stop_string = n->buf;
    }
    n->ev.prompt_tokens = r->n_prompt;
    n->ev.completion_tokens = r->n_gen;
    n->ev.cached_tokens = r->cached;
    r->state = RQ_FINISHED;
    request_release_engine_side(r);
    push_event(r, n);
    pthread_mutex_lock(&r->mu);
    r->engine_done = 1;
    int gone = r->client_gone;
    pthread_mutex_unlock(&r->mu);
    if (gone) request_destroy(r);
}

/* ---- one step ---- */

/* Constrained decoding: the row with every token the grammar refuses at -inf; EOS stays when the answer is
 * complete (or when nothing else is left, so a dead end still ends). */
static const float *constrain_row(cinfer_engine *e, cinfer_request *r, const float *row) {
    if (!r->gm) return row;
    int V = e->m->V, n = gm_mask(r->gm, e->gv, r->mask);
    for (int t = 0; t < V; t++) r->masked[t] = (r->mask[t >> 5] >> (t & 31)) & 1 ? row[t] : -INFINITY;
    if (n == 0 || gm_complete(r->gm))
        for (int i = 0; i < e->m->n_eos; i++)
            if (e->m->eos_ids[i] >= 0 && e->m->eos_ids[i] < V) r->masked[e->m->eos_ids[i]] = row[e->m->eos_ids[i]];
    return r->masked;
}

static int is_eos(const cinfer_engine *e, int32_t t) {
    for (int i = 0; i < e->m->n_eos; i++)
        if (e->m->eos_ids[i] == t) return 1;
    return 0;
}

/* Sampled token t for r: logprobs, text, stops. Returns the finish reason or NULL to continue. */
static const char *accept_token(cinfer_engine *e, cinfer_request *r, int32_t t) {
    r->n_gen++;
    if (r->hist) r->hist[r->n_hist++] = t;
    if (r->samp.n_logprobs >= 0) {
        const sampler_result *lp = &r->res;
        ev_node *n = new_event(CINFER_EV_LOGPROB, 0);
        n->ev.token = t;
        n->ev.logprob = lp->logprob;
        /* token texts: one buffer holding the chosen token's bytes and each alternative's */
        char tb[256], alt[SAMPLER_MAX_LOGPROBS][256];
        size_t tl = text_token_bytes(r->ts, t, tb, sizeof tb), alt_len[SAMPLER_MAX_LOGPROBS], need = tl + 1;
        int nt = lp->n_top;
        for (int i = 0; i < nt; i++) {
            alt_len[i] = text_token_bytes(r->ts, lp->top[i].token, alt[i], sizeof alt[i]);
            need += alt_len[i] + 1;
        }
        n->buf = xmalloc(need + 1);
        memcpy(n->buf, tb, tl);
        n->buf[tl] = 0;
        n->ev.token_text = n->buf;
        n->ev.token_len = tl;
        size_t off = tl + 1;
        if (nt) n->top = xcalloc((size_t)nt, sizeof *n->top);
        for (int i = 0; i < nt; i++) {
            memcpy(n->buf + off, alt[i], alt_len[i]);
            n->buf[off + alt_len[i]] = 0;
            n->top[i] = (cinfer_top_logprob){lp->top[i].token, lp->top[i].logprob, n->buf + off, alt_len[i]};
            off += alt_len[i] + 1;
        }
        n->ev.top = n->top;
        n->ev.n_top = nt;
        push_event(r, n);
    }
    int eos = is_eos(e, t) && !r->ignore_eos;
    if (eos) return "stop";
    if (r->gm && e->gv_tok[t] && gm_feed(r->gm, e->gv_tok[t], e->gv_len[t]))
        LOG_W("constrained decoding: token %d was sampled outside the grammar", t); /* a bug if ever */
    const char *txt;
    size_t len;
    text_stream_push(r->ts, t, &txt, &len);
    if (len && feed_stop(r, txt, len)) return "stop_string";
    if (r->n_gen >= r->max_tokens) return "length";
    if (r->n_prompt + r->n_gen >= e->p.ctx_size) return "length";
    return NULL;
}

static void update_stats(cinfer_engine *e) {
    if (e->p.prefix_cache_memory > 0) {
        prefix_stats ps;
        ctx_prefix_stats(e->ctx, &ps);
        atomic_store(&e->stat_px_lookups, ps.lookups);
        atomic_store(&e->stat_px_hits, ps.hits);
        atomic_store(&e->stat_px_tokens, ps.tokens_served);
        atomic_store(&e->stat_px_evict, ps.evicted_snapshots);
        atomic_store(&e->stat_px_bytes, (long long)ps.snapshot_bytes);
        atomic_store(&e->stat_px_blocks, ps.blocks_cached);
        atomic_store(&e->stat_px_kv_bytes, (long long)ps.kv_bytes_cached);
    }
    atomic_store(&e->stat_spec_drafted, e->spec_drafted);
    atomic_store(&e->stat_spec_accepted, e->spec_accepted);
    atomic_store(&e->stat_running, e->n_running);
    atomic_store(&e->stat_kv_used, ctx_kv_total_blocks(e->ctx) - ctx_kv_free_blocks(e->ctx));
    atomic_store(&e->stat_slots_used, ctx_slots_used(e->ctx));
}

/* The prefix cache's key of a prompt with images: the prompt's ids, except that the j-th <|image_pad|> of
 * image k's run becomes a mix of the image's hash (grid and preprocessed pixels, cinfer_image_hash) with j,
 * as a negative int32 (never a real id, which is >= 0; never -1). Two prompts then share a cached prefix
 * inside or past an image only when the images are the same picture. Only the cache sees the key: what feeds
 * the model, drafts, stop strings and text use the real ids. The layout was checked (mm_layout_build), so the
 * runs are exactly where and as long as the images say. */
static int32_t *image_key(const cinfer_engine *e, const cinfer_request_params *p, const int32_t *prompt) {
    int32_t *key = xmalloc((size_t)p->n_prompt * sizeof(int32_t));
    memcpy(key, prompt, (size_t)p->n_prompt * sizeof(int32_t));
    int pad = e->m->cfg.image_token_id, k = 0;
    for (int i = 0; i < p->n_prompt && k < p->n_images;) {
        if (prompt[i] != pad) {
            i++;
            continue;
        }
        uint64_t h = cinfer_image_hash(p->images[k++]);
        for (uint64_t j = 0; i < p->n_prompt && prompt[i] == pad; i++, j++) {
            uint64_t x = (h ^ ((j + 1) * 0x9E3779B97F4A7C15ull)) * 0xBF58476D1CE4E5B9ull;
            x = (x ^ (x >> 31)) * 0x94D049BB133111EBull;
            key[i] = INT32_MIN + (int32_t)((x >> 33) % 0x7FFFFFFFu); /* [INT32_MIN, -2] */
        }
    }
    return key;
}

/* What the prefix cache matches and stores for r. */
static const int32_t *cache_key(const cinfer_request *r) {
    return r->key ? r->key : r->prompt;
}

/* The token the device chose for logits row `row` of a step, recorded in r->res as sampler_sample reports
 * it (the token, and its logprob when asked). */
static int32_t device_choice(cinfer_engine *e, cinfer_request *r, int row) {
    atomic_fetch_add(&e->device_chosen_total, 1);
    memset(&r->res, 0, sizeof r->res);
    r->res.token = e->dids[row];
    if (r->dev_lp) r->res.logprob = e->dlps[row];
    return r->res.token;
}

static double now_ms(void);

/* Admits waiting requests while a slot and KV blocks for their whole budget are free. */
static int resume_len(const cinfer_engine *e, const cinfer_request *r, int *shared);

static void admit(cinfer_engine *e) {
    pthread_mutex_lock(&e->mu);
    while (e->wait_head && e->n_running < e->p.max_seqs) {
        cinfer_request *r = e->wait_head;
        if (atomic_load(&r->cancel)) {
            e->wait_head = r->next;
            if (!e->wait_head) e->wait_tail = NULL;
            e->n_waiting--;
            pthread_mutex_unlock(&e->mu);
            finish_request(e, r, "cancelled");
            pthread_mutex_lock(&e->mu);
            continue;
        }
        int need = (r->n_prompt + r->max_tokens + KV_BLOCK - 1) / KV_BLOCK, shared = 0;
        int at = e->p.prefix_cache_memory > 0 ? resume_len(e, r, &shared) : 0;
        if (need - shared > ctx_kv_free_blocks(e->ctx)) break; /* FIFO: wait for blocks to come back */
        char err[256];
        int seq = cinfer_seq_open(e->ctx, err, sizeof err);
        if (seq < 0) break;
        if (e->dctx) {
            r->dseq = cinfer_seq_open(e->dctx, err, sizeof err);
            if (r->dseq < 0) {
                cinfer_seq_close(e->ctx, seq);
                break;
            }
        }
        if (r->n_images) {
            /* the vision tower runs here, on the context's threads; the features are copied into the sequence */
            int rc = cinfer_seq_set_images(e->ctx, seq, r->prompt, r->n_prompt, r->images, r->n_images, NULL, err,
                                           sizeof err);
            for (int i = 0; i < r->n_images; i++) cinfer_image_free(r->images[i]);
            r->n_images = -r->n_images; /* freed; still marks the request as one with images */
            if (rc) {
                cinfer_seq_close(e->ctx, seq);
                if (r->dseq >= 0) cinfer_seq_close(e->dctx, r->dseq);
                r->dseq = -1;
                e->wait_head = r->next;
                if (!e->wait_head) e->wait_tail = NULL;
                e->n_waiting--;
                pthread_mutex_unlock(&e->mu);
                LOG_W("image request: %s", err);
                emit_text(r, CINFER_EV_ERROR, err, strlen(err));
                finish_request(e, r, "error");
                pthread_mutex_lock(&e->mu);
                continue;
            }
        }
        if (e->p.prefix_cache_memory > 0) {
            /* resume after the longest cached prefix that ends at a state snapshot; on ENOMEM (no block for
             * the partial-block copy) the sequence is untouched and runs cold. With images, the sequence has
             * its layout already, and the context indexes feature rows and mRoPE positions by the sequence's
             * length, so a resume point anywhere (inside an image's span too) feeds the suffix exactly as a
             * chunked prefill would. */
            int cached = 0;
            double t0 = e->trace ? now_ms() : 0;
            if (ctx_seq_resume(e->ctx, seq, cache_key(r), at + 1, &cached, err, sizeof err) == 0) {
                r->n_fed = cached;
                r->cached = cached;
            }
            /* the draft model resumes from its own cache (snapshots at the same stops, draft_model_step): a
             * second turn does not make it read the whole conversation again */
            int dc = 0;
            if (e->dctx && r->dseq >= 0 && ctx_seq_resume(e->dctx, r->dseq, cache_key(r), r->n_prompt, &dc, err, sizeof err) == 0)
                r->d_fed = dc;
            if (e->trace) { /* the restore's copies are enqueued: wait for them here to see what they cost */
                double t1 = now_ms();
                char e2[128];
                ctx_sync(e->ctx, e2, sizeof e2);
                fprintf(stderr, "ttft-trace admit +%.3f ms after submit: resume of %d tokens host %.3f ms, copies %.3f ms\n",
                        t0 - r->t_submit, cached, t1 - t0, now_ms() - t1);
            }
        }
        e->wait_head = r->next;
        if (!e->wait_head) e->wait_tail = NULL;
        e->n_waiting--;
        r->seq = seq;
        r->state = RQ_RUNNING;
        e->n_admitted++;
        e->running[e->n_running++] = r;
    }
    pthread_mutex_unlock(&e->mu);
}

/* Prompt-lookup drafting: the longest n-gram (n = 3, 2, 1) ending the context that occurred earlier in it
 * proposes the tokens that followed its latest earlier occurrence. Deterministic, so the rejection rule for
 * temperature > 0 reduces to "sample as usual and keep the draft only if the sample equals it". */
static int ngram_draft(const int32_t *h, int n, int32_t *out, int k) {
    for (int g = 3; g >= 1; g--) {
        if (n < g + 1) continue;
        const int32_t *tail = h + n - g;
        for (int start = n - g - 1; start >= 0; start--) {
            if (memcmp(h + start, tail, sizeof(int32_t) * (size_t)g)) continue;
            int from = start + g, cnt = 0;
            while (cnt < k && from + cnt < n) {
                out[cnt] = h[from + cnt];
                cnt++;
            }
            if (cnt > 0) return cnt;
        }
    }
    return 0;
}

/* The next snapshot stop of r's prompt after pos (ctx_prefix_next), passing over an interval stop (neither a
 * message boundary nor the prompt's last token) fewer than e->px_gap tokens past the snapshot r resumed from: a
 * snapshot there would save a later request at most px_gap tokens of prefill, and costs this one a piece
 * boundary (a one-row step when the resume point sits just before an interval multiple), a state copy and a
 * snapshot's memory. CINFER_PREFIX_GAP sets px_gap. */
/* The next stop after pos: ctx_prefix_next's (marks, interval, the last prompt token), and with px_exact, for a
 * prompt without chat marks (raw tokens: completions, benchmarks), also the last multiple of GDN_CHUNK before
 * its last token — a later prompt that extends this one can then resume at a point where its own cold prefill
 * has a chunk boundary too (resume_len), bit for bit, at most GDN_CHUNK - 1 rows earlier than the end. */
static int stop_after(const cinfer_engine *e, const cinfer_request *r, int pos, int end) {
    int q = ctx_prefix_next(e->ctx, r->marks, r->n_marks, pos, end), g = end / GDN_CHUNK * GDN_CHUNK;
    return e->px_exact && !r->n_marks && g > pos && g < q ? g : q;
}

static int next_stop(const cinfer_engine *e, const cinfer_request *r, int pos) {
    int end = r->n_prompt - 1, q = stop_after(e, r, pos, end);
    while (q < end && r->cached > 0 && q - r->cached < e->px_gap) {
        int mark = 0;
        for (int i = 0; i < r->n_marks && !mark; i++) mark = r->marks[i] == q;
        if (mark) break;
        q = stop_after(e, r, q, end);
    }
    return q;
}

/* Where a cold prefill of r ends a piece, so that its DeltaNet chunks (aligned to the absolute grid within a
 * piece, forward.h) start again: multiples of GDN_CHUNK, r's chat marks, its last prompt token. Resumed there,
 * r's suffix runs exactly the cold run's arithmetic. */
static int cold_boundary(const cinfer_request *r, int L) {
    if (L % GDN_CHUNK == 0 || L == r->n_prompt - 1) return 1;
    for (int i = 0; i < r->n_marks; i++)
        if (r->marks[i] == L) return 1;
    return 0;
}

/* The cached length r resumes after: the deepest snapshot on its prompt's path (ctx_prefix_peek), with px_exact
 * the deepest at a cold_boundary of r. A second chat turn resumes at the message boundary before the last
 * reply, where turn 1 left a snapshot (prefix_chat_second_turn_is_bitwise_cold); a raw prompt that extends an
 * earlier one at the earlier one's last chunk-grid point (stop_after). Without px_exact a resume at the earlier
 * prompt's last token is a few rows shorter but differs from cold by rounding (~5e-6 in logprobs at 4k, CPU).
 * *shared: the blocks it maps by reference. */
static int resume_len(const cinfer_engine *e, const cinfer_request *r, int *shared) {
    int n = r->n_prompt - 1;
    for (;;) {
        int L = n > 0 ? ctx_prefix_peek(e->ctx, cache_key(r), n, shared) : 0;
        if (L <= 0) *shared = 0;
        if (L <= 0 || !e->px_exact || cold_boundary(r, L)) return L > 0 ? L : 0;
        n = L - 1;
    }
}

/* This step's prefill piece for r, in tokens. Pieces end on the DeltaNet chunk grid (multiples of
 * GDN_CHUNK) or at the prompt's end, so how the step budget splits a prompt never changes its arithmetic
 * (forward.h: chunks align to the absolute grid). With the prefix cache, a piece also stops at each
 * snapshot position (message boundaries, the last prompt token): a later request resuming there then
 * computes exactly the chunks a cold run does. 0 when no allowed end fits in the budget. */
static int prefill_piece(const cinfer_engine *e, const cinfer_request *r, int budget) {
    int pos = r->n_fed, limit = r->n_prompt;
    if (e->p.prefix_cache_memory > 0 && pos < r->n_prompt - 1) limit = next_stop(e, r, pos);
    if (limit - pos <= budget) return limit - pos;
    int end = (pos + budget) / GDN_CHUNK * GDN_CHUNK;
    return end > pos ? end - pos : 0;
}

static int argmax_row(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* CINFER_SPEC_COST=1: whether a step whose B decode entries (e->entry_req[0, B)) have drafts should verify
 * them. A padded step costs cost_ms[1][B] whatever the drafts, a plain one cost_ms[0][B]; entry i's window
 * yields E_i = (1 - a^(k+1)) / (1 - a) tokens on average (k drafts, each kept with probability a, its
 * request's estimate: the decayed kept / checked drafts with one of each as prior; 1 without drafts), a plain
 * step one. It pays when mean E > the cost ratio, taken at B or, until B is measured both ways, at the
 * nearest batch size that is (requests join and leave: each B learnt alone would take long). With no ratio
 * yet the kind not measured at B is chosen; every COST_PROBE-th decision takes the other kind, so neither
 * estimate goes stale (the acceptance stays measured while plain: step() checks the first draft against the
 * sampled token). */
#define COST_PROBE 16
static double cost_ratio(const cinfer_engine *e, int B) {
    for (int d = 0; d <= e->p.max_seqs; d++)
        for (int sg = -1; sg <= 1; sg += 2) {
            int b = B + sg * d;
            if (b >= 1 && b <= e->p.max_seqs && e->cost_ms[0][b] > 0 && e->cost_ms[1][b] > 0)
                return e->cost_ms[1][b] / e->cost_ms[0][b];
        }
    return -1;
}
static int spec_pays(cinfer_engine *e, int B) {
    double ratio = cost_ratio(e, B);
    if (ratio < 0) return e->cost_ms[1][B] <= 0;
    double gain = 0;
    for (int i = 0; i < B; i++) {
        const cinfer_request *r = e->entry_req[i];
        double a = (r->acc_num + 1.0) / (r->acc_den + 2.0);
        gain += r->n_drafts ? (1.0 - pow(a, r->n_drafts + 1)) / (1.0 - a) : 1.0;
    }
    int pays = gain / B > ratio;
    return ++e->cost_steps % COST_PROBE == 0 ? !pays : pays;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* The draft model's forward: its rows' argmax into dids[0, n) — on cuda chosen on the device, only the ids
 * coming back (a row of logits is 1 MB at Qwen3.5's vocabulary) */
static int draft_forward(cinfer_engine *e, int n, int32_t *dids, char *err, size_t errlen) {
    if (e->ddsmp) {
        for (int i = 0; i < n; i++) e->ddsmp[i] = (cuda_sample){0.0f, 0, 0.0, 0};
        return ctx_forward_sample(e->dctx, e->dentries, n, e->ddsmp, dids, NULL, err, errlen);
    }
    int rc = cinfer_forward(e->dctx, e->dentries, n, e->dlogits, err, errlen);
    for (int i = 0; !rc && i < n; i++) dids[i] = argmax_row(e->dlogits + (size_t)i * e->m->V, e->m->V);
    return rc;
}

static float *draft_snap(cinfer_engine *e, const cinfer_request *r, int j) {
    return e->dsnap +
           ((size_t)r->dseq * (size_t)(e->p.spec_max_draft - 1) + (size_t)(j - 1)) * e->dsnap_floats;
}

/* Draft model (CINFER_SPEC_DRAFT): first bring every draft sequence up to what its target has read (prompt
 * pieces, and the kept tokens it has not read: after a window kept whole, its last draft), in one batch; then
 * grow each decoding request's window [last, d1, ...] one greedy draft at a time, every request in one batch
 * per draft position. Each draft position is a plain decode step of the draft context (one row per request:
 * the draft runs exactly as that model decodes alone — CUDA graphs, PDL, the decode GEMVs), and before
 * reading window token j (j >= 1) the draft's DeltaNet state is stashed (a device copy), so that
 * draft_model_sync can rewind it exactly to any kept length. (Until session 6 draft position j was a
 * speculative window of j + 1 rows committed after verification; on cuda such steps run eagerly, without
 * PDL, through the skinny GEMM: a draft step cost ~1.9x a plain step, self-draft 0.54x / 0.31x at batch 1 /
 * 16 on the H200. With plain steps, the call of 14:53: 0.78x / 0.72x, the windows 0.65x at batch 1.) */
static void draft_model_step(cinfer_engine *e) {
    char err[512];
    int n = 0, budget = e->p.step_tokens;
    for (int i = 0; i < e->n_running; i++) {
        cinfer_request *r = e->running[i];
        if (r->dseq < 0) continue;
        if (r->d_window) {
            /* drafts no verification answered (never so far: every decode entry fits a step): the draft
             * cannot tell how far to go back, so it stops drafting for this request */
            LOG_W("draft model: a window went unverified; request drafts no more");
            cinfer_seq_close(e->dctx, r->dseq);
            r->dseq = -1;
            r->d_window = r->n_catchup = 0;
            continue;
        }
        if (r->n_catchup && r->d_fed >= r->n_prompt) {
            if (r->n_catchup > budget) continue;
            e->dentries[n] = (cinfer_batch_entry){r->dseq, r->catchup, r->n_catchup, 0};
            e->dreq[n++] = r;
            budget -= r->n_catchup;
        } else if (r->d_fed < r->n_prompt && budget > 0) {
            int cnt = r->n_prompt - r->d_fed < budget ? r->n_prompt - r->d_fed : budget;
            if (e->p.prefix_cache_memory > 0 && r->d_fed < r->n_prompt - 1) { /* its snapshots: the target's stops */
                int q = next_stop(e, r, r->d_fed) - r->d_fed;
                if (q > 0 && q < cnt) cnt = q;
            }
            e->dentries[n] = (cinfer_batch_entry){r->dseq, r->prompt + r->d_fed, cnt, 0};
            e->dreq[n++] = r;
            budget -= cnt;
        }
    }
    if (n && draft_forward(e, n, e->ddids, err, sizeof err)) {
        LOG_E("draft model: %s", err); /* nothing was read: try again next step */
        n = 0;
    }
    for (int i = 0; i < n; i++) {
        cinfer_request *r = e->dreq[i];
        if (e->dentries[i].tokens == r->catchup) {
            r->n_catchup = 0;
            continue;
        }
        r->d_fed += e->dentries[i].n_tokens;
        e->d_prompt_read += e->dentries[i].n_tokens;
        if (e->p.prefix_cache_memory > 0 && r->d_fed < r->n_prompt && next_stop(e, r, r->d_fed - 1) == r->d_fed &&
            ctx_seq_snapshot(e->dctx, r->dseq, cache_key(r), err, sizeof err))
            LOG_W("draft model: prefix cache: %s", err);
    }
    int kmax = 0;
    for (int i = 0; i < e->n_running; i++) {
        cinfer_request *r = e->running[i];
        r->n_drafts = 0;
        r->d_window = 0;
        r->drafts[0] = r->last;
        int room = r->max_tokens - r->n_gen - 1;
        r->dk = 0;
        if (r->dseq < 0 || r->n_fed < r->n_prompt || r->d_fed < r->n_prompt || r->n_catchup || room <= 0) continue;
        int k = r->draft_len < room ? r->draft_len : room;
        if (e->drafter) { /* forced drafts: the draft model reads them in place of its own, as it would read
                             its own tokens at that acceptance (so it rewinds and catches up as a real one) */
            int c = e->drafter(e->drafter_ud, r->hist, r->n_hist, r->forced, k);
            k = c < 0 ? 0 : c < k ? c : k;
        }
        r->dk = k;
        if (k > kmax) kmax = k;
    }
    for (int j = 0; j < kmax; j++) {
        n = 0;
        for (int i = 0; i < e->n_running; i++) {
            cinfer_request *r = e->running[i];
            if (r->dseq < 0 || r->n_drafts != j || j >= r->dk) continue;
            if (j && e->dsnap && ctx_seq_state_stash(e->dctx, r->dseq, draft_snap(e, r, j), err, sizeof err)) {
                LOG_E("draft model: %s", err);
                continue; /* its drafts so far stand */
            }
            e->dentries[n] = (cinfer_batch_entry){r->dseq, r->drafts + j, 1, 0, 0};
            e->dreq[n++] = r;
        }
        if (!n) break;
        if (draft_forward(e, n, e->ddids, err, sizeof err)) {
            LOG_E("draft model: %s", err);
            break;
        }
        for (int i = 0; i < n; i++) {
            cinfer_request *r = e->dreq[i];
            r->drafts[j + 1] = e->drafter ? r->forced[j] : e->ddids[i];
            r->n_drafts = j + 1;
            r->d_window = j + 1;
        }
    }
    for (int i = 0; i < e->n_running; i++) {
        cinfer_request *r = e->running[i];
        memcpy(r->dread, r->drafts, sizeof(int32_t) * (size_t)r->d_window);
        if (e->dobs && r->n_drafts) e->dobs(e->dobs_ud, r->hist, r->n_hist, r->drafts + 1, r->n_drafts);
    }
}

/* After the target kept `kept` window tokens of r ([last, d1..]): the draft model keeps the same ones. It
 * read d_window of them and rewinds to the stash taken at the kept length when fewer were kept (or when a
 * test's drafter replaced what it read); kept tokens it has not read are read at the next step. */
static void draft_model_sync(cinfer_engine *e, cinfer_request *r, int kept) {
    char err[256];
    if (r->dseq < 0) return;
    int c = 0; /* the tokens it read that the target kept: a prefix of both */
    while (c < r->d_window && c < kept && r->dread[c] == r->drafts[c]) c++;
    if (c < r->d_window) {
        /* c >= 1 (a window's first token, r->last, is always kept): the stash before reading token c */
        int len = cinfer_seq_len(e->dctx, r->dseq) - (r->d_window - c);
        if (ctx_seq_rewind(e->dctx, r->dseq, len, e->dsnap ? draft_snap(e, r, c) : NULL, err, sizeof err)) {
            LOG_E("draft model: %s; this request drafts no more", err);
            cinfer_seq_close(e->dctx, r->dseq);
            r->dseq = -1;
            r->n_catchup = 0;
            r->d_window = 0;
            return;
        }
    }
    r->d_window = 0;
    for (int t = c; t < kept; t++) {
        if (r->n_catchup == (int)(sizeof r->catchup / sizeof r->catchup[0])) {
            /* the draft fell too far behind (its prompt still reading): stop drafting for this request */
            cinfer_seq_close(e->dctx, r->dseq);
            r->dseq = -1;
            r->n_catchup = 0;
            return;
        }
        r->catchup[r->n_catchup++] = r->drafts[t];
    }
}

/* MTP (CINFER_SPEC_MTP), after the step's sampling: the head reads what each sequence kept — row t pairs the
 * token at t + 1 with the target's normed hidden at t, rewriting from the window's first position the rows its
 * chained drafts left — and the last row's argmax is the first draft of the next window; each further draft
 * feeds back the head's own normed output with the embedding of the draft it just made (spec §5). Every
 * request goes in one batch per draft position; drafts are deterministic (argmax), so verification's "sample
 * as usual and keep while equal" keeps greedy and seeded output exactly the plain one. */
static void mtp_step(cinfer_engine *e, int n_entries) {
    char err[512];
    size_t H = (size_t)e->m->H, V = (size_t)e->mtp_vocab;
    int n = 0, kmax = 0;
    for (int i = 0; i < n_entries; i++) {
        cinfer_request *r = e->entry_req[i];
        if (!e->entry_keep[i] || r->mtp_off) continue;
        int room = r->max_tokens - r->n_gen - 1, k = r->draft_len < room ? r->draft_len : room;
        int decoding = r->n_fed >= r->n_prompt;
        int pos = e->entry_pos[i];
        r->n_drafts = 0;
        e->ment[n] = (ctx_mtp_entry){r->seq, pos, r->hist + pos + 1, e->hid + (size_t)e->entry_hrow[i] * H, e->entry_keep[i],
                                     e->hid + (size_t)e->entry_hrow[i] * H, decoding && k > 0};
        e->mreq[n++] = r;
        if (decoding && k > kmax) kmax = k;
    }
    if (!n) return;
    /* on cuda with device choice the head's argmax is taken there too: only ids come back (a row over a 248k
     * vocabulary is 1 MB of logits otherwise, per chained draft) */
    int dev = e->dev_sample;
    if (dev ? ctx_mtp_forward_ids(e->ctx, e->ment, n, e->mids, err, sizeof err)
            : ctx_mtp_forward(e->ctx, e->ment, n, e->mlogits, err, sizeof err)) {
        LOG_W("MTP: %s; these requests go on without drafts", err);
        for (int i = 0; i < n; i++) e->mreq[i]->mtp_off = 1, e->mreq[i]->n_drafts = 0;
        return;
    }
    for (int i = 0, row = 0; i < n; i++) {
        cinfer_request *r = e->mreq[i];
        const ctx_mtp_entry *me = &e->ment[i];
        memcpy(e->mtp_h + (size_t)r->seq * H, me->hidden_out + (size_t)(me->n - 1) * H, sizeof(float) * H);
        r->mtp_next = me->pos + me->n;
        if (!me->logits) continue;
        r->drafts[1] = dev ? e->mids[row++] : argmax_row(e->mlogits + (size_t)row++ * V, (int)V);
        r->n_drafts = 1;
    }
    /* chained drafts at the head's next positions; each request stops at its own k */
    for (int j = 1; j < kmax; j++) {
        int nc = 0;
        for (int i = 0; i < n; i++) {
            cinfer_request *r = e->mreq[i];
            int room = r->max_tokens - r->n_gen - 1, k = r->draft_len < room ? r->draft_len : room;
            if (r->n_drafts != j || j >= k) continue;
            float *h = e->mtp_h + (size_t)r->seq * H;
            e->ment[nc] = (ctx_mtp_entry){r->seq, r->mtp_next + j - 1, &r->drafts[j], h, 1, h, 1};
            e->mreq[nc++] = r; /* (nc <= i: entries not yet read are never overwritten) */
        }
        if (!nc) break;
        if (dev ? ctx_mtp_forward_ids(e->ctx, e->ment, nc, e->mids, err, sizeof err)
                : ctx_mtp_forward(e->ctx, e->ment, nc, e->mlogits, err, sizeof err)) {
            LOG_W("MTP: %s", err); /* the drafts so far stand; the next catch-up rewrites from its window */
            break;
        }
        for (int i = 0; i < nc; i++) {
            cinfer_request *r = e->mreq[i];
            r->drafts[j + 1] = dev ? e->mids[i] : argmax_row(e->mlogits + (size_t)i * V, (int)V);
            r->n_drafts = j + 1;
        }
        n = nc;
    }
    /* a test or benchmark drafter replaces the tokens (the head's cost stays in the step) */
    if (e->drafter)
        for (int i = 0; i < n_entries; i++) {
            cinfer_request *r = e->entry_req[i];
            if (!e->entry_keep[i] || r->mtp_off || !r->n_drafts) continue;
            int c = e->drafter(e->drafter_ud, r->hist, r->n_hist, r->drafts + 1, r->n_drafts);
            r->n_drafts = c < 0 || c > r->n_drafts ? 0 : c;
        }
}

static void step(cinfer_engine *e) {
    /* drop cancelled sequences first: they leave the batch within one step */
    for (int i = 0; i < e->n_running;) {
        cinfer_request *r = e->running[i];
        if (atomic_load(&r->cancel)) {
            e->running[i] = e->running[--e->n_running];
            finish_request(e, r, "cancelled");
        } else {
            i++;
        }
    }
    admit(e);
    if (e->dctx) draft_model_step(e);
    int budget = e->p.step_tokens, n = 0, rows = 0, hrows = 0, any_drafts = 0;
    int mtp = e->p.spec == CINFER_SPEC_MTP;
    /* decode tokens first (latency of running streams), then prefill chunks in admission order; with
     * speculation a decode entry is a window [last token | drafts] verified in this same batch */
    for (int i = 0; i < e->n_running && budget > 0; i++) {
        cinfer_request *r = e->running[i];
        if (r->n_fed < r->n_prompt) continue;
        if (!e->dctx && !mtp) r->n_drafts = 0; /* (the draft model proposed its drafts above, the MTP head at
                                                   the end of the last step) */
        if (mtp && r->mtp_off) r->n_drafts = 0;
        if (mtp && r->n_drafts > budget - 1) r->n_drafts = budget - 1 > 0 ? budget - 1 : 0;
        int room = r->max_tokens - r->n_gen - 1; /* drafts beyond the output budget could never be kept */
        if (!e->dctx && !mtp && r->hist && r->draft_len > 0 && room > 0) {
            /* padded windows cost their full row count whatever the drafts: a drafter that costs nothing
             * (n-gram lookup, a test's) proposes as many as a window holds */
            int dl = e->pad ? e->p.spec_max_draft : r->draft_len;
            int k = dl < room ? dl : room;
            if (k > budget - 1) k = budget - 1;
            /* hist already ends with r->last, the token about to be fed */
            if (k > 0)
                r->n_drafts = e->drafter ? e->drafter(e->drafter_ud, r->hist, r->n_hist, r->drafts + 1, k)
                                         : ngram_draft(r->hist, r->n_hist, r->drafts + 1, k);
            if (r->n_drafts > k || r->n_drafts < 0) r->n_drafts = 0;
        }
        if (r->n_drafts) any_drafts = 1;
        e->entries[n] = (cinfer_batch_entry){r->seq, &r->last, 1, 0};
        if (mtp) e->entry_pos[n] = r->n_prompt + r->n_gen - 1; /* r->last's position */
        e->entry_req[n++] = r;
        budget -= 1 + r->n_drafts;
    }
    int n_dec = n;
    if (any_drafts && e->cost_on && !spec_pays(e, n_dec)) {
        any_drafts = 0; /* a plain step: the drafts wait (their first is checked against the sampled token) */
        for (int i = 0; i < n_dec; i++) {
            cinfer_request *r = e->entry_req[i];
            r->probe = r->n_drafts ? r->drafts[1] : -1;
            budget += r->n_drafts;
            r->n_drafts = 0;
        }
    }
    /* The decode entries' rows. Without padding a window holds 1 + its drafts. With CINFER_SPEC_PAD=1, once
     * any entry of the step drafts, every decode entry is a window of spec_max_draft + 1 rows (fewer only
     * where the output budget ends first), the rows past the drafts repeating the last token: the step's
     * shape is then the same every time (one CUDA graph per batch size). Pad rows are never kept:
     * verification reads rows 0..n_drafts only, and the commit keeps at most 1 + n_drafts tokens, so their KV
     * rows lie past the kept length (overwritten later) and their DeltaNet records are never replayed. */
    int pad = e->pad && any_drafts;
    for (int i = 0; i < n; i++) {
        cinfer_request *r = e->entry_req[i];
        int w = 1 + r->n_drafts;
        if (pad) {
            int room = r->max_tokens - r->n_gen - 1, want = 1 + e->p.spec_max_draft;
            if (want > room + 1) want = room + 1; /* (room >= n_drafts: never below w) */
            if (want - w > budget) want = w + budget;
            if (want > w) {
                budget -= want - w;
                atomic_fetch_add(&e->stat_pad_rows, want - w);
                w = want;
            }
        }
        if (w > 1) {
            r->drafts[0] = r->last;
            for (int j = 1 + r->n_drafts; j < w; j++) r->drafts[j] = r->drafts[j - 1];
            e->entries[i] = (cinfer_batch_entry){r->seq, r->drafts, w, 1, 1};
        }
        e->entry_row[i] = rows;
        rows += w > 1 ? w : 1;
    }
    for (int i = 0; i < e->n_running && budget > 0; i++) {
        cinfer_request *r = e->running[i];
        if (r->n_fed >= r->n_prompt) continue;
        int cnt = prefill_piece(e, r, budget);
        if (cnt <= 0) continue; /* no boundary within this step's budget: next step */
        e->entries[n] = (cinfer_batch_entry){r->seq, r->prompt + r->n_fed, cnt, 0};
        e->entry_row[n] = rows++;
        if (mtp) e->entry_pos[n] = r->n_fed;
        e->entry_req[n++] = r;
        budget -= cnt;
    }
    if (!n) return;
    if (mtp)
        for (int i = 0; i < n; i++) {
            e->entries[i].hidden = e->hid + (size_t)hrows * e->m->H;
            e->entry_hrow[i] = hrows;
            e->entry_keep[i] = 0;
            hrows += e->entries[i].n_tokens;
        }
    char err[512];
    /* cuda: when every row that samples can be chosen on the device, only the chosen ids come back: plain
     * greedy rows, a verify window's rows too (greedy acceptance needs only each row's argmax; the device
     * takes it from the same logits bits); and, in steps without verify windows, the rows whose sampler
     * chain the device runs (sampler_device_ok: temperature, top_k <= 64, top_p, min_p, logit_bias,
     * penalties), so that the default chat settings no longer copy every row's logits back and sample on
     * the host one row after another. A prompt's middle chunks choose nothing and hold no one back. */
    int dev = e->dev_sample, any_spec = 0;
    for (int i = 0; i < n; i++) {
        cinfer_request *r = e->entry_req[i];
        any_spec |= e->entries[i].spec;
        /* a plain decode row's previous token joins its sampler's windows before the forward, so that a
         * device sampler's penalties see it as the host's do (nothing reads the sampler in between) */
        if (r->n_fed >= r->n_prompt && !e->entries[i].spec) sampler_accept(r->smp, r->last);
    }
    for (int i = 0; dev && i < n; i++) {
        cinfer_request *r = e->entry_req[i];
        int samples = r->n_fed + e->entries[i].n_tokens >= r->n_prompt;
        dev = !samples || (!r->gm && (r->dev_greedy || (!any_spec && n <= CUDA_SAMPLE_PEN_CAP / CUDA_SAMPLE_MAX_PEN &&
                                                        sampler_device_ok(r->smp, CUDA_SAMPLE_MAX_K,
                                                                          CUDA_SAMPLE_MAX_PEN - 1))));
    }
    for (int i = 0, np = 0; dev && i < n; i++) {
        cinfer_request *r = e->entry_req[i];
        int nr = e->entries[i].all_logits ? e->entries[i].n_tokens : 1;
        for (int j = 0; j < nr; j++) e->dsmp[e->entry_row[i] + j] = (cuda_sample){0.0f, 0, 0.0, r->dev_lp};
        if (r->dev_greedy || r->n_fed + e->entries[i].n_tokens < r->n_prompt) continue;
        sampler_dev_row q;
        int k = 0;
        if (sampler_device_row(r->smp, CUDA_SAMPLE_MAX_K, &q, e->dpen + np, CUDA_SAMPLE_MAX_PEN, &k)) {
            LOG_E("engine: a row sampler_device_ok accepted was refused"); /* cannot happen: same checks */
            k = 0;
        }
        e->dsmp[e->entry_row[i]] = (cuda_sample){q.temperature, q.top_k, q.u, q.logprob, q.top_p, q.min_p,
                                                 q.repetition_penalty, k ? e->dpen + np : NULL, k};
        np += k;
    }
    double t0 = e->cost_on || e->trace ? now_ms() : 0;
    int rc = dev ? ctx_forward_sample(e->ctx, e->entries, n, e->dsmp, e->dids, e->dlps, err, sizeof err)
                 : cinfer_forward(e->ctx, e->entries, n, e->logits, err, sizeof err);
    if (e->cost_on && !rc && n == n_dec) {
        /* a pure decode step: its cost by kind and entries, as the fastest recent one (a step only runs
         * slower than its shape's cost — a graph capture, a new attention split, a busy host — so a sample
         * above the estimate moves it up by at most 5%, one below takes it) */
        double dt = now_ms() - t0, *c = &e->cost_ms[pad][n];
        if (++e->cost_n[pad][n] > e->cost_skip)
            *c = *c > 0 && dt > *c ? (dt < 1.05 * *c ? dt : 1.05 * *c) : dt;
    }
    atomic_fetch_add(&e->steps_total, 1);
    if (e->trace)
        fprintf(stderr, "ttft-trace step +%.3f ms after submit: %d entries, first %d rows from position %d: forward %.3f ms\n",
                t0 - e->entry_req[0]->t_submit, n, e->entries[0].n_tokens, e->entry_req[0]->n_fed < e->entry_req[0]->n_prompt ? e->entry_req[0]->n_fed : -1,
                now_ms() - t0);
    if (rc) {
        /* the batch was validated at submit; a failure here is a bug or an exhausted pool */
        LOG_E("engine step failed: %s", err);
        for (int i = 0; i < n; i++) {
            cinfer_request *r = e->entry_req[i];
            emit_text(r, CINFER_EV_ERROR, err, strlen(err));
        }
    }
    size_t V = (size_t)e->m->V;
    for (int i = 0; i < n; i++) {
        cinfer_request *r = e->entry_req[i];
        const char *fin = NULL;
        const float *row = e->logits + (size_t)e->entry_row[i] * V;
        if (rc) {
            fin = "error";
        } else if (r->n_fed < r->n_prompt) {
            r->n_fed += e->entries[i].n_tokens;
            atomic_fetch_add(&e->prompt_tokens_total, e->entries[i].n_tokens);
            if (e->p.prefix_cache_memory > 0 && r->n_fed < r->n_prompt &&
                next_stop(e, r, r->n_fed - 1) == r->n_fed) {
                char e2[256];
                double ts = e->trace ? now_ms() : 0;
                if (ctx_seq_snapshot(e->ctx, r->seq, cache_key(r), e2, sizeof e2))
                    LOG_W("prefix cache: %s", e2);
                if (e->trace) {
                    double ts1 = now_ms();
                    ctx_sync(e->ctx, e2, sizeof e2);
                    fprintf(stderr, "ttft-trace snapshot at %d: host %.3f ms, copies %.3f ms\n", r->n_fed, ts1 - ts, now_ms() - ts1);
                }
            }
            if (mtp) e->entry_keep[i] = e->entries[i].n_tokens;
            if (r->n_fed < r->n_prompt) continue; /* more prompt to read */
        } else if (e->entries[i].spec) {
            /* verify: sample each position as plain decode would (same sampler calls, same generator draws),
             * keep drafts while the sample equals them; the first mismatch's sample is the correction, and when
             * every draft holds the last row gives a bonus token */
            int kept = 1; /* window position 0 (the fed token) is always kept */
            for (int j = 0; j <= r->n_drafts && !fin; j++) {
                sampler_accept(r->smp, r->drafts[j]);
                int32_t t = dev ? device_choice(e, r, e->entry_row[i] + j)
                                : sampler_sample(r->smp, row + (size_t)j * V, &r->res);
                r->last = t;
                atomic_fetch_add(&e->generated_tokens_total, 1);
                fin = accept_token(e, r, t);
                if (j < r->n_drafts && t == r->drafts[j + 1]) kept++;
                else break;
            }
            char e2[256];
            if (cinfer_seq_commit(e->ctx, r->seq, kept, e2, sizeof e2)) LOG_E("engine: %s", e2);
            if (e->dctx) draft_model_sync(e, r, kept);
            e->spec_drafted += r->n_drafts;
            e->spec_accepted += kept - 1;
            if (r->n_drafts) { /* kept - 1 right, then one wrong unless all held */
                r->acc_num = 0.9 * r->acc_num + (kept - 1);
                r->acc_den = 0.9 * r->acc_den + (kept - 1) + (kept - 1 < r->n_drafts);
            }
            /* adapt: all drafts held -> one more next time; under half -> one fewer (never below 1); a padded
             * window without drafts says nothing about them */
            if (r->n_drafts && kept - 1 == r->n_drafts && r->draft_len < e->p.spec_max_draft)
                r->draft_len++;
            else if (2 * (kept - 1) < r->n_drafts && r->draft_len > 1) r->draft_len--;
            if (!fin) {
                if (mtp) e->entry_keep[i] = kept;
                continue;
            }
            goto finished;
        } else {
            if (e->dctx) draft_model_sync(e, r, 1); /* a plain decode step: the draft reads the same token (the
                                                      sampler took it before the forward) */
        }
        if (!fin) {
            int32_t t = dev ? device_choice(e, r, e->entry_row[i])
                            : sampler_sample(r->smp, constrain_row(e, r, row), &r->res);
            r->last = t;
            atomic_fetch_add(&e->generated_tokens_total, 1);
            fin = accept_token(e, r, t);
            if (r->probe >= 0) { /* a declined draft: would it have been kept? */
                r->acc_num = 0.9 * r->acc_num + (t == r->probe);
                r->acc_den = 0.9 * r->acc_den + 1;
                r->probe = -1;
            }
        }
        if (mtp) e->entry_keep[i] = fin ? 0 : e->entries[i].n_tokens;
    finished:
        if (fin) {
            for (int k = 0; k < e->n_running; k++)
                if (e->running[k] == r) {
                    e->running[k] = e->running[--e->n_running];
                    break;
                }
            finish_request(e, r, fin);
        }
    }
    if (mtp && !rc) mtp_step(e, n);
}

static void *sched_main(void *arg) {
    cinfer_engine *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->stop && !e->wait_head && e->n_running == 0) pthread_cond_wait(&e->cv, &e->mu);
        int stop = e->stop;
        pthread_mutex_unlock(&e->mu);
        if (stop) break;
        step(e);
        update_stats(e);
    }
    /* shut down: everything still queued or running ends as cancelled */
    while (e->n_running) finish_request(e, e->running[--e->n_running], "cancelled");
    pthread_mutex_lock(&e->mu);
    cinfer_request *r = e->wait_head;
    e->wait_head = e->wait_tail = NULL;
    e->n_waiting = 0;
    pthread_mutex_unlock(&e->mu);
    while (r) {
        cinfer_request *nx = r->next;
        finish_request(e, r, "cancelled");
        r = nx;
    }
    update_stats(e);
    return NULL;
}

/* ---- public API ---- */

cinfer_engine_params cinfer_engine_default_params(void) {
    cinfer_engine_params p = {.max_seqs = 8, .ctx_size = 4096, .step_tokens = 512, .queue_limit = 64, .n_threads = 0,
                              .kv_memory = 0, .spec = CINFER_SPEC_NONE, .spec_max_draft = 4};
    cinfer_ctx_params cp = cinfer_ctx_default_params();
    p.device = cp.device;
    p.precision = cp.precision;
    return p;
}

long long engine_pad_rows(cinfer_engine *e) {
    return atomic_load(&e->stat_pad_rows);
}

int engine_draft_slots_used(cinfer_engine *e) { return e->dctx ? ctx_slots_used(e->dctx) : 0; }
long long engine_draft_prompt_tokens(cinfer_engine *e) { return e->d_prompt_read; }

void engine_set_draft_observer(cinfer_engine *e, engine_draft_observer_fn fn, void *ud) {
    e->dobs = fn;
    e->dobs_ud = ud;
}

void engine_set_drafter(cinfer_engine *e, engine_draft_fn fn, void *ud) {
    e->drafter = fn;
    e->drafter_ud = ud;
}

cinfer_sampling cinfer_sampling_default(void) {
    cinfer_sampling s;
    memset(&s, 0, sizeof s);
    s.temperature = 1.0f;
    s.top_p = 1.0f;
    s.repetition_penalty = 1.0f;
    s.repeat_last_n = 64;
    s.n_logprobs = -1;
    return s;
}

int cinfer_engine_create(cinfer_model *cm, const cinfer_engine_params *pp, cinfer_engine **out, char *err, size_t errlen) {
    if (!cm || !out) return ci_err(err, errlen, CINFER_EINVAL, "cinfer_engine_create: model and out are required");
    cinfer_engine_params p = pp ? *pp : cinfer_engine_default_params();
    if (p.max_seqs < 1 || p.max_seqs > 4096) return ci_err(err, errlen, CINFER_EINVAL, "max_seqs %d: must be 1..4096", p.max_seqs);
    /* every running sequence's decode window plus one whole DeltaNet chunk of prefill fit in a step, so
     * prefill pieces can always end on the chunk grid */
    if (p.step_tokens < p.max_seqs * (1 + (p.spec ? p.spec_max_draft : 0)) + GDN_CHUNK)
        p.step_tokens = p.max_seqs * (1 + (p.spec ? p.spec_max_draft : 0)) + GDN_CHUNK;
    if (p.queue_limit < 0) p.queue_limit = 0;
    if (p.spec != CINFER_SPEC_NONE && p.spec != CINFER_SPEC_NGRAM && p.spec != CINFER_SPEC_DRAFT && p.spec != CINFER_SPEC_MTP)
        return ci_err(err, errlen, CINFER_EINVAL, "speculation mode %d: must be none, ngram, mtp or draft", p.spec);
    if (p.spec == CINFER_SPEC_MTP && !cinfer_model_internal(cm)->mtp.present)
        return ci_err(err, errlen, CINFER_EUNSUPPORTED, "speculation with the MTP head: the checkpoint has no mtp.* tensors");
    if (p.spec == CINFER_SPEC_DRAFT) {
        if (!p.draft_model) return ci_err(err, errlen, CINFER_EINVAL, "speculation with a draft model needs draft_model");
        cinfer_model_info ti, di;
        cinfer_model_get_info(cm, &ti);
        cinfer_model_get_info(p.draft_model, &di);
        if (ti.vocab_size != di.vocab_size)
            return ci_err(err, errlen, CINFER_EINVAL, "the draft model's vocabulary (%d) differs from the target's (%d)",
                          di.vocab_size, ti.vocab_size);
    }
    if (p.spec == CINFER_SPEC_NONE) p.spec_max_draft = 0;
    if (p.spec_max_draft < 0 || p.spec_max_draft > 16)
        return ci_err(err, errlen, CINFER_EINVAL, "spec_max_draft %d: must be 0..16", p.spec_max_draft);
    if (p.spec == CINFER_SPEC_MTP && p.spec_max_draft < 1) /* the head reads each request's token history */
        return ci_err(err, errlen, CINFER_EINVAL, "speculation with the MTP head needs spec_max_draft >= 1");
    cinfer_engine *e = xcalloc(1, sizeof *e);
    e->cm = cm;
    e->m = cinfer_model_internal(cm);
    e->p = p;
    cinfer_ctx_params cp = cinfer_ctx_default_params();
    cp.max_seqs = p.max_seqs;
    cp.max_ctx = p.ctx_size;
    cp.max_batch = p.step_tokens;
    cp.n_threads = p.n_threads;
    cp.kv_memory = p.kv_memory;
    cp.spec_window = p.spec_max_draft ? p.spec_max_draft + 1 : 0;
    cp.prefix_cache_memory = p.prefix_cache_memory;
    cp.device = p.device;
    cp.precision = p.precision; /* the draft context (below) copies it: its drafts are checked by the target anyway */
    int rc = cinfer_ctx_create(cm, &cp, &e->ctx, err, errlen);
    if (rc) {
        free(e);
        return rc;
    }
    if (p.spec == CINFER_SPEC_DRAFT) {
        cinfer_ctx_params dp = cp; /* its prefix cache: a budget of the same size (its snapshots are smaller) */
        dp.spec_window = 0; /* plain decode steps: the context is made as for decoding alone */
        if ((rc = cinfer_ctx_create(p.draft_model, &dp, &e->dctx, err, errlen))) {
            ci_err_prefix(err, errlen, "draft model");
            cinfer_ctx_destroy(e->ctx);
            free(e);
            return rc;
        }
        e->dentries = xcalloc((size_t)p.max_seqs, sizeof *e->dentries);
        e->dreq = xcalloc((size_t)p.max_seqs, sizeof *e->dreq);
        e->ddids = xcalloc((size_t)p.max_seqs, sizeof *e->ddids);
        if (cinfer_ctx_device(e->dctx) == CINFER_DEVICE_CUDA &&
            !(getenv("CINFER_CUDA_SAMPLE") && !strcmp(getenv("CINFER_CUDA_SAMPLE"), "0")))
            e->ddsmp = xcalloc((size_t)p.max_seqs, sizeof *e->ddsmp);
        else
            e->dlogits = xmalloc((size_t)p.max_seqs * e->m->V * sizeof(float));
        /* the rewind's stashes: spec_max_draft - 1 states per sequence (a 4B draft: 50 MB each) */
        e->dsnap_floats = ctx_seq_state_floats(e->dctx);
        size_t nsnap = (size_t)p.max_seqs * (size_t)(p.spec_max_draft > 1 ? p.spec_max_draft - 1 : 0);
        if (nsnap && e->dsnap_floats) {
            size_t bytes = nsnap * e->dsnap_floats * sizeof(float);
            e->dsnap_dev = cinfer_ctx_device(e->dctx) == CINFER_DEVICE_CUDA;
            e->dsnap = e->dsnap_dev ? cuda_dev_alloc(bytes) : ci_try_alloc(bytes);
            if (!e->dsnap) {
                cinfer_ctx_destroy(e->dctx);
                cinfer_ctx_destroy(e->ctx);
                free(e->dentries), free(e->dreq), free(e->ddids), free(e->ddsmp), free(e->dlogits), free(e);
                return ci_err(err, errlen, CINFER_ENOMEM,
                              "draft model: cannot allocate %zu MB of state stashes", bytes >> 20);
            }
        }
    }
    if (p.spec == CINFER_SPEC_MTP) {
        /* the head's KV pool and buffers, sized here with the others: nothing grows while decoding */
        size_t H = (size_t)e->m->H, V = (size_t)e->m->V;
        e->hid = ci_try_alloc(sizeof(float) * (size_t)p.step_tokens * H);
        e->mtp_h = ci_try_alloc(sizeof(float) * (size_t)p.max_seqs * H);
        e->mtp_vocab = p.spec_mtp_vocab > 0 && p.spec_mtp_vocab < (int)V ? p.spec_mtp_vocab : (int)V;
        e->mlogits = ci_try_alloc(sizeof(float) * (size_t)p.max_seqs * (size_t)e->mtp_vocab);
        if ((rc = ctx_mtp_init(e->ctx, e->mtp_vocab, err, errlen)) == 0 && (!e->hid || !e->mtp_h || !e->mlogits))
            rc = ci_err(err, errlen, CINFER_ENOMEM, "cannot allocate the MTP buffers");
        if (rc) {
            cinfer_ctx_destroy(e->ctx);
            free(e->hid), free(e->mtp_h), free(e->mlogits), free(e);
            return rc;
        }
        e->entry_hrow = xcalloc((size_t)p.max_seqs, sizeof(int));
        e->entry_pos = xcalloc((size_t)p.max_seqs, sizeof(int));
        e->entry_keep = xcalloc((size_t)p.max_seqs, sizeof(int));
        e->mids = xcalloc((size_t)p.max_seqs, sizeof(int32_t));
        e->ment = xcalloc((size_t)p.max_seqs, sizeof *e->ment);
        e->mreq = xcalloc((size_t)p.max_seqs, sizeof *e->mreq);
    }
    /* on cuda the rows arrive by DMA each step: page-locked memory (cuda_host_alloc) */
    e->logits = cuda_host_alloc((size_t)p.max_seqs * (1 + p.spec_max_draft) * e->m->V * sizeof(float),
                                cinfer_ctx_device(e->ctx) == CINFER_DEVICE_CUDA);
    if (!e->logits) {
        cinfer_ctx_destroy(e->ctx);
        free(e);
        return ci_err(err, errlen, CINFER_ENOMEM, "cannot allocate logits for %d sequences", p.max_seqs);
    }
    /* greedy steps choose on the device unless CINFER_CUDA_SAMPLE=0: on the H200 (session 3) only the ids come
     * back and 4B decode went from 2,816 to 3,563 tok/s at batch 32 and 3,965 to 5,311 at 64 (bench --logits) */
    const char *ds = getenv("CINFER_CUDA_SAMPLE");
    if (cinfer_ctx_device(e->ctx) == CINFER_DEVICE_CUDA && !(ds && !strcmp(ds, "0")) && e->m->V <= CUDA_SAMPLE_MAX_V) {
        e->dev_sample = 1;
        size_t rows = (size_t)p.max_seqs * (1 + (size_t)p.spec_max_draft);
        e->dsmp = xcalloc(rows, sizeof *e->dsmp);
        e->dpen = xcalloc(CUDA_SAMPLE_PEN_CAP, sizeof *e->dpen);
        e->dids = xcalloc(rows, sizeof *e->dids);
        e->dlps = xcalloc(rows, sizeof *e->dlps);
    }
    /* padded windows: on by default on cuda, where a step's rows cost little next to its weights and one
     * shape lets the verify steps replay one graph (H200, 4B, A = 0.7: 1.54x -> 1.60x at batch 1); off on the
     * CPU, where every row costs ("1" / "0" force either) */
    const char *pv = getenv("CINFER_SPEC_PAD");
    e->pad =
        p.spec_max_draft > 0 && (pv ? !strcmp(pv, "1") : cinfer_ctx_device(e->ctx) == CINFER_DEVICE_CUDA);
    const char *tv = getenv("CINFER_TTFT_TRACE"); /* diagnostics: stderr lines timing admission, steps, snapshots */
    e->trace = tv && atoi(tv) > 0;
    const char *pg = getenv("CINFER_PREFIX_GAP");
    /* CINFER_PREFIX_EXACT: unset = on for the CPU, off on cuda, where a prefill piece's GEMM bits depend on its
     * row count anyway (cuBLAS picks per shape), so no resume point makes a suffix the cold run's bit for bit
     * and the rows it would add buy nothing; "1" / "0" force it */
    const char *pxe = getenv("CINFER_PREFIX_EXACT");
    e->px_exact = pxe ? !strcmp(pxe, "1") : cinfer_ctx_device(e->ctx) != CINFER_DEVICE_CUDA;
    e->px_gap = pg ? atoi(pg) : GDN_CHUNK; /* H200 call of 12:12: the 16k second turn 0.093 -> 0.055 s with the
                                              other fixes of then, one piece instead of a row, a snapshot, 63 rows */
    const char *cv = getenv("CINFER_SPEC_COST");
    e->cost_on = e->pad && cv && !strcmp(cv, "1");
    e->cost_skip = cinfer_ctx_device(e->ctx) == CINFER_DEVICE_CUDA ? 2 : 0;
    for (int k = 0; k < 2; k++) {
        e->cost_ms[k] = xcalloc((size_t)p.max_seqs + 1, sizeof(double));
        e->cost_n[k] = xcalloc((size_t)p.max_seqs + 1, sizeof(int));
    }
    e->im_start = text_token_id(cm, "<|im_start|>");
    e->entries = xcalloc((size_t)p.max_seqs, sizeof *e->entries);
    e->entry_req = xcalloc((size_t)p.max_seqs, sizeof *e->entry_req);
    e->entry_row = xcalloc((size_t)p.max_seqs, sizeof *e->entry_row);
    e->running = xcalloc((size_t)p.max_seqs, sizeof *e->running);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    pthread_mutex_init(&e->gv_mu, NULL);
    if (pthread_create(&e->thread, NULL, sched_main, e)) {
        cinfer_ctx_destroy(e->ctx);
        free(e->dsmp), free(e->dpen), free(e->dids), free(e->dlps);
        for (int k = 0; k < 2; k++) free(e->cost_ms[k]), free(e->cost_n[k]);
        cuda_host_free(e->logits), free(e->entries), free(e->entry_req), free(e->running), free(e);
        return ci_err(err, errlen, CINFER_ENOMEM, "cannot start the scheduler thread");
    }
    update_stats(e);
    *out = e;
    return 0;
}

void cinfer_engine_destroy(cinfer_engine *e) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->stop = 1;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    cinfer_ctx_destroy(e->ctx);
    cinfer_ctx_destroy(e->dctx);
    free(e->dlogits), free(e->dentries), free(e->dreq), free(e->ddids), free(e->ddsmp);
    if (e->dsnap_dev) cuda_dev_free(e->dsnap);
    else free(e->dsnap);
    free(e->hid), free(e->mtp_h), free(e->mlogits), free(e->entry_hrow), free(e->entry_pos), free(e->entry_keep);
    free(e->mids);
    free(e->ment), free(e->mreq);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->gv_mu);
    gm_vocab_free(e->gv);
    if (e->gv_tok)
        for (int t = 0; t < e->m->V; t++) free(e->gv_tok[t]);
    free(e->gv_tok), free(e->gv_len);
    free(e->dsmp), free(e->dpen), free(e->dids), free(e->dlps);
    for (int k = 0; k < 2; k++) free(e->cost_ms[k]), free(e->cost_n[k]);
    cuda_host_free(e->logits), free(e->entries), free(e->entry_req), free(e->entry_row), free(e->running), free(e);
}

/* The vocabulary as bytes for the grammar's mask, made once per engine (the first constrained request pays). */
static int grammar_vocab(cinfer_engine *e, char *err, size_t errlen) {
    pthread_mutex_lock(&e->gv_mu);
    if (!e->gv && e->cm->tk) {
        int V = e->m->V, nt = tok_vocab_size(e->cm->tk);
        e->gv_tok = xcalloc((size_t)V, sizeof *e->gv_tok);
        e->gv_len = xcalloc((size_t)V, sizeof *e->gv_len);
        for (int t = 0; t < V && t < nt; t++) {
            if (tok_is_special(e->cm->tk, t) || is_eos(e, t)) continue;
            char *s = NULL, e2[128];
            size_t n = 0;
            int32_t id = t;
            if (tok_decode(e->cm->tk, &id, 1, 0, &s, &n, e2, sizeof e2) == 0 && n > 0) {
                e->gv_tok[t] = s;
                e->gv_len[t] = n;
            } else {
                free(s);
            }
        }
        e->gv = gm_vocab_create((const char *const *)e->gv_tok, e->gv_len, V);
    }
    int ok = e->gv != NULL;
    pthread_mutex_unlock(&e->gv_mu);
    return ok ? 0 : ci_err(err, errlen, CINFER_EINVAL, "constrained decoding needs the model's tokenizer");
}

/* Compiles the request's constraint (on the caller's thread, so a bad schema is the caller's error). */
static int request_constraint(cinfer_engine *e, cinfer_request *r, const cinfer_request_params *p, char *err,
                              size_t errlen) {
    if (p->constraint == CINFER_CONSTRAIN_NONE) return 0;
    /* reasoning the prompt opened must close first; where thinking is off (mode 2) none is allowed */
    int reason = r->reasoning == 1 ? GM_REASON_INSIDE : GM_REASON_NONE;
    int rc;
    if (p->constraint == CINFER_CONSTRAIN_JSON) {
        const char *s = p->constraint_arg;
        rc = grammar_compile_json(s, s ? strlen(s) : 0, reason, &r->gr, err, errlen);
    } else if (p->constraint == CINFER_CONSTRAIN_TOOL_CALLS) {
        if (p->tool_format == CINFER_TOOLS_NONE || !p->tools_json)
            return ci_err(err, errlen, CINFER_EINVAL, "tool calls were required but the request has no tools");
        rc = grammar_compile_tools(p->tools_json, strlen(p->tools_json), p->tool_format == CINFER_TOOLS_QWEN_XML,
                                   p->constraint_arg, reason, &r->gr, err, errlen);
    } else {
        return ci_err(err, errlen, CINFER_EINVAL, "unknown constraint %d", (int)p->constraint);
    }
    if (!rc) rc = grammar_vocab(e, err, errlen);
    if (rc) return rc;
    r->gm = gm_matcher_create(r->gr);
    r->mask = xcalloc(((size_t)e->m->V + 31) / 32, sizeof(uint32_t));
    r->masked = xmalloc((size_t)e->m->V * sizeof(float));
    r->draft_len = 0; /* no speculation: drafts would have to be checked against the grammar as well */
    return 0;
}

int cinfer_engine_submit(cinfer_engine *e, const cinfer_request_params *p, cinfer_request **out, char *err, size_t errlen) {
    if (!e || !p || !out) return ci_err(err, errlen, CINFER_EINVAL, "cinfer_engine_submit: bad arguments");
    if (p->n_prompt < 1 || !p->prompt) return ci_err(err, errlen, CINFER_EINVAL, "the prompt is empty");
    if (p->n_prompt >= e->p.ctx_size)
        return ci_err(err, errlen, CINFER_ERANGE, "the prompt has %d tokens; the context holds %d (prompt + at least 1 output)",
                      p->n_prompt, e->p.ctx_size);
    for (int i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= e->m->V)
            return ci_err(err, errlen, CINFER_EINVAL, "prompt token %d at position %d is outside the vocabulary [0, %d)",
                          p->prompt[i], i, e->m->V);
    if (p->n_stop < 0 || p->n_stop > MAX_STOP) return ci_err(err, errlen, CINFER_EINVAL, "at most %d stop strings", MAX_STOP);
    if (p->n_images < 0 || p->n_images > 256 || (p->n_images && !p->images))
        return ci_err(err, errlen, CINFER_EINVAL, "images: 0..256 expected");
    if (p->n_images) {
        /* the prompt's layout is checked now, so a mismatch is the client's error (400), not a failed step */
        vision_grid g[256];
        for (int i = 0; i < p->n_images; i++) {
            if (!p->images[i] || p->images[i]->H != e->m->H)
                return ci_err(err, errlen, CINFER_EINVAL, "image %d is missing or was loaded for another model", i);
            g[i] = (vision_grid){p->images[i]->px.grid_t, p->images[i]->px.grid_h, p->images[i]->px.grid_w};
        }
        mm_layout L;
        int lrc = mm_layout_build(&e->m->cfg, e->m->vis.merge, p->prompt, p->n_prompt, g, p->n_images, &L, err, errlen);
        if (lrc) return lrc;
        mm_layout_free(&L);
    }
    cinfer_request *r = xcalloc(1, sizeof *r);
    r->eng = e;
    r->t_submit = e->trace ? now_ms() : 0;
    r->prompt = xmalloc((size_t)p->n_prompt * sizeof(int32_t));
    memcpy(r->prompt, p->prompt, (size_t)p->n_prompt * sizeof(int32_t));
    r->n_prompt = p->n_prompt;
    int room = e->p.ctx_size - p->n_prompt;
    r->max_tokens = p->max_tokens <= 0 || p->max_tokens > room ? room : p->max_tokens;
    r->ignore_eos = p->ignore_eos;
    r->skip_special = p->skip_special_tokens;
    r->reasoning = p->reasoning;
    r->samp = p->sampling;
    if (p->sampling.n_logit_bias > 0) {
        r->bias = xmalloc((size_t)p->sampling.n_logit_bias * sizeof *r->bias);
        memcpy(r->bias, p->sampling.logit_bias, (size_t)p->sampling.n_logit_bias * sizeof *r->bias);
    }
    r->samp.logit_bias = r->bias;
    for (int i = 0; i < p->n_stop; i++) r->stop[r->n_stop++] = xstrdup(p->stop[i]);
    if (e->p.prefix_cache_memory > 0 && p->n_images) r->key = image_key(e, p, r->prompt);
    if (e->p.prefix_cache_memory > 0 && e->im_start >= 0) {
        for (int i = 1; i < r->n_prompt - 1; i++) r->n_marks += r->prompt[i] == e->im_start;
        r->marks = xmalloc(sizeof(int) * (size_t)(r->n_marks + 1));
        r->n_marks = 0;
        for (int i = 1; i < r->n_prompt - 1; i++)
            if (r->prompt[i] == e->im_start) r->marks[r->n_marks++] = i;
    }
    if (e->p.spec_max_draft > 0) {
        r->hist = xmalloc(((size_t)r->n_prompt + (size_t)r->max_tokens + 2) * sizeof(int32_t));
        memcpy(r->hist, r->prompt, (size_t)r->n_prompt * sizeof(int32_t));
        r->n_hist = r->n_prompt;
        r->draft_len = e->p.spec_max_draft;
    }
    r->probe = -1;
    r->dseq = -1;
    r->tool_format = p->tool_format;
    r->tools_json = p->tools_json ? xstrdup(p->tools_json) : NULL;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    sampler_params sp = sampler_default_params();
    sp.temperature = p->sampling.temperature;
    sp.top_k = p->sampling.top_k;
    sp.top_p = p->sampling.top_p;
    sp.min_p = p->sampling.min_p;
    sp.xtc_probability = p->sampling.xtc_probability;
    sp.xtc_threshold = p->sampling.xtc_threshold;
    sp.repetition_penalty = p->sampling.repetition_penalty;
    sp.repeat_last_n = p->sampling.repeat_last_n;
    sp.presence_penalty = p->sampling.presence_penalty;
    sp.frequency_penalty = p->sampling.frequency_penalty;
    sp.logit_bias = (const sampler_bias *)r->bias; /* same layout: {int32 token; float bias} */
    sp.n_logit_bias = p->sampling.n_logit_bias;
    /* no seed given: one per request from the clock and a counter, so unseeded requests differ */
    sp.seed = p->sampling.has_seed ? p->sampling.seed
                                   : (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull + (uint64_t)atomic_fetch_add(&e->requests_total, 0) * 7919u +
                                         (uint64_t)(uintptr_t)r;
    sp.logprobs = p->sampling.n_logprobs >= 0;
    sp.top_logprobs = p->sampling.n_logprobs > 0 ? p->sampling.n_logprobs : 0;
    /* the device may choose for requests the CPU sampler would run as a bare argmax */
    r->dev_greedy = sp.temperature < SAMPLER_GREEDY_TEMP && !sp.n_logit_bias && sp.repetition_penalty == 1.0f &&
                    sp.presence_penalty == 0.0f && sp.frequency_penalty == 0.0f && sp.xtc_probability == 0.0f &&
                    !sp.top_logprobs;
    r->dev_lp = sp.logprobs;
    int rc = sampler_create(&sp, e->m->V, &r->smp, err, errlen);
    if (!rc) rc = stop_init(&r->stop_m, (const char *const *)r->stop, NULL, r->n_stop, err, errlen);
    if (!rc) {
        r->ts = text_stream_create(e->cm, r->skip_special);
        r->stop_cap = STOP_HOLD_MAX + 4096;
        r->stop_buf = xmalloc(r->stop_cap);
    }
    if (!rc && r->reasoning) r->rs = rs_create(r->reasoning == 1, 1);
    if (!rc && r->tool_format != CINFER_TOOLS_NONE) {
        tc_format f = r->tool_format == CINFER_TOOLS_QWEN_XML ? TC_FORMAT_QWEN_XML : TC_FORMAT_HERMES_JSON;
        rc = tc_create(&r->tc, f, r->tools_json, r->tools_json ? strlen(r->tools_json) : 0, err, errlen);
    }
    if (!rc) rc = sampler_set_prompt(r->smp, r->prompt, r->n_prompt, err, errlen);
    if (!rc) rc = request_constraint(e, r, p, err, errlen);
    if (rc) {
        request_destroy(r);
        return rc;
    }
    pthread_mutex_lock(&e->mu);
    if (e->stop) rc = ci_err(err, errlen, CINFER_ESTATE, "the engine is shutting down");
    else if (e->n_waiting + e->n_admitted >= e->p.max_seqs + e->p.queue_limit)
        rc = ci_err(err, errlen, CINFER_EBUSY, "the queue is full (%d waiting)", e->n_waiting);
    if (!rc) {
        r->state = RQ_QUEUED;
        if (p->n_images) { /* the engine owns the images from here (the scheduler reads them under mu) */
            r->images = xmalloc((size_t)p->n_images * sizeof *r->images);
            memcpy(r->images, p->images, (size_t)p->n_images * sizeof *r->images);
            r->n_images = p->n_images;
        }
        if (e->wait_tail) e->wait_tail->next = r;
        else e->wait_head = r;
        e->wait_tail = r;
        e->n_waiting++;
        atomic_fetch_add(&e->requests_total, 1);
        pthread_cond_signal(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
    if (rc) {
        request_destroy(r);
        return rc;
    }
    *out = r;
    return 0;
}

int cinfer_request_next(cinfer_request *r, cinfer_event *ev, int timeout_ms) {
    pthread_mutex_lock(&r->mu);
    if (r->cur) {
        free(r->cur->top), free(r->cur->buf), free(r->cur);
        r->cur = NULL;
    }
    if (r->final_taken) {
        pthread_mutex_unlock(&r->mu);
        return -1;
    }
    struct timespec dl;
    if (timeout_ms >= 0) {
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += timeout_ms / 1000;
        dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
    }
    while (!r->head) {
        if (timeout_ms < 0) pthread_cond_wait(&r->cv, &r->mu);
        else if (pthread_cond_timedwait(&r->cv, &r->mu, &dl) == ETIMEDOUT) break;
    }
    ev_node *n = r->head;
    if (!n) {
        pthread_mutex_unlock(&r->mu);
        return 0;
    }
    r->head = n->next;
    if (!r->head) r->tail = NULL;
    r->cur = n;
    if (n->ev.type == CINFER_EV_DONE || n->ev.type == CINFER_EV_ERROR) r->final_taken = 1;
    *ev = n->ev;
    pthread_mutex_unlock(&r->mu);
    return 1;
}

void cinfer_request_cancel(cinfer_request *r) {
    if (!r) return;
    atomic_store(&r->cancel, 1);
    cinfer_engine *e = r->eng;
    pthread_mutex_lock(&e->mu);
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

void cinfer_request_free(cinfer_request *r) {
    if (!r) return;
    atomic_store(&r->cancel, 1);
    cinfer_engine *e = r->eng;
    pthread_mutex_lock(&e->mu);
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_mutex_lock(&r->mu);
    r->client_gone = 1;
    int done = r->engine_done;
    pthread_mutex_unlock(&r->mu);
    if (done) request_destroy(r); /* otherwise the scheduler frees it when it lets go */
}

void cinfer_engine_get_stats(cinfer_engine *e, cinfer_engine_stats *o) {
    memset(o, 0, sizeof *o);
    pthread_mutex_lock(&e->mu);
    o->waiting = e->n_waiting;
    pthread_mutex_unlock(&e->mu);
    o->running = atomic_load(&e->stat_running);
    o->max_seqs = e->p.max_seqs;
    o->queue_limit = e->p.queue_limit;
    o->kv_blocks_used = atomic_load(&e->stat_kv_used);
    o->kv_blocks_total = ctx_kv_total_blocks(e->ctx);
    o->device = cinfer_ctx_device(e->ctx);
    o->precision = cinfer_ctx_precision(e->ctx);
    o->slots_used = atomic_load(&e->stat_slots_used);
    o->slots_total = e->p.max_seqs;
    o->requests_total = atomic_load(&e->requests_total);
    o->prompt_tokens_total = atomic_load(&e->prompt_tokens_total);
    o->generated_tokens_total = atomic_load(&e->generated_tokens_total);
    o->device_chosen_tokens = atomic_load(&e->device_chosen_total);
    o->steps_total = atomic_load(&e->steps_total);
    o->spec_drafted = atomic_load(&e->stat_spec_drafted);
    o->spec_accepted = atomic_load(&e->stat_spec_accepted);
    o->prefix_lookups = atomic_load(&e->stat_px_lookups);
    o->prefix_hits = atomic_load(&e->stat_px_hits);
    o->prefix_tokens_served = atomic_load(&e->stat_px_tokens);
    o->prefix_evictions = atomic_load(&e->stat_px_evict);
    o->prefix_bytes = atomic_load(&e->stat_px_bytes);
    o->prefix_blocks_cached = atomic_load(&e->stat_px_blocks);
    o->prefix_kv_bytes = atomic_load(&e->stat_px_kv_bytes);
}

/* http.c — libmicrohttpd glue for `cinfer serve`: routing, auth, CORS, body and header limits, the
 * generation handlers (tokenize, submit, wait or stream) and the small endpoints. One thread per
 * connection: a handler may block on the engine, and a stream's reader callback blocks on
 * cinfer_request_next. A client that goes away is noticed by the watcher thread (watch.h), which cancels
 * its requests at once; the engine's DONE then wakes the handler, so waiting threads need not poll. */
#include "server/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/metrics.h"
#include "server/web.h"
#include "server/sse.h"
#include "server/watch.h"
#include "util/alloc.h"
#include "util/err.h"
#include "util/log.h"

/* How long one wait on the engine lasts before the client's socket is checked again: short when the
 * watcher cannot tell us (no watch entry) or when a generation has several choices (the wait is on one
 * choice while another may have events); long otherwise, since a hang-up cancels the request and the
 * DONE wakes us. The long wait only bounds how late `stopping` and keep-alives are seen. */
#define WAIT_MS 20
#define WAIT_LONG_MS 1000
/* A stream that has sent nothing for this long sends a keep-alive (SSE comment / Anthropic ping). */
#define KEEPALIVE_S 10.0

typedef enum {
    R_OTHER = 0, R_CHAT, R_COMPLETIONS, R_MODELS, R_MESSAGES, R_COUNT_TOKENS,
    R_HEALTH, R_METRICS, R_TOKENIZE, R_DETOKENIZE, R_APPLY_TEMPLATE, R_OPTIONS, R_WEB,
} route;

typedef struct server {
    srv_config cfg;
    struct MHD_Daemon *d;
    cinfer_model *model;
    cinfer_model *draft;  /* --spec draft: the draft model, or NULL */
    cinfer_engine *engine;
    atomic_int ready;    /* model and engine usable (set once, after both exist) */
    atomic_int stopping; /* shutting down: streams end */
    srv_watch *watch;    /* client hang-ups of waiting generations; NULL: handlers poll their socket */
    char model_id[256];
    int vocab_size, ctx_size;
    int device, precision; /* what the engine's forward runs (cinfer_engine_stats), set before ready */
    cinfer_tool_format tool_format;
    long long started;
    metrics m;
    atomic_ullong id_counter;
    uint64_t id_salt;
} server;

typedef struct conn {
    route rt;
    int post;           /* the route takes a body */
    int anthropic;      /* errors in Anthropic's shape */
    sbuf body;
    int too_big;
    int status;         /* what was answered, for the log */
    double t0;          /* arrival, seconds (CLOCK_MONOTONIC) */
    char method[8];
    char path[128];
    int prompt_tokens, completion_tokens;
} conn;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void srv_config_init(srv_config *c) {
    memset(c, 0, sizeof *c);
    c->host = "127.0.0.1";
    c->port = 8080;
    c->model_dir = "models/default";
    srv_defaults_init(&c->defaults);
    c->max_body = 8u << 20;
    c->max_connections = 512;
    c->timeout_s = 60;
}

/* ---- responses ---- */

static void add_cors(server *s, struct MHD_Connection *c, struct MHD_Response *r) {
    const char *allowed = s->cfg.allowed_origins;
    if (!allowed || !*allowed) return;
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (!origin) return;
    int ok = !strcmp(allowed, "*");
    size_t ol = strlen(origin);
    for (const char *p = allowed; !ok && *p;) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        while (n && *p == ' ') p++, n--;
        while (n && p[n - 1] == ' ') n--;
        if (n == ol && !strncmp(p, origin, n)) ok = 1;
        p = comma ? comma + 1 : p + strlen(p);
    }
    if (!ok) return;
    MHD_add_response_header(r, "Access-Control-Allow-Origin", !strcmp(allowed, "*") ? "*" : origin);
    MHD_add_response_header(r, "Vary", "Origin");
}

static enum MHD_Result send_body(server *s, struct MHD_Connection *c, conn *cc, int status, const char *type,
                                 const char *body, size_t len, const char *retry_after) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    if (retry_after) MHD_add_response_header(r, "Retry-After", retry_after);
    if (status == 405) {
        MHD_add_response_header(r, "Allow", cc->post ? "POST, OPTIONS" : "GET, OPTIONS");
    }
    add_cors(s, c, r);
    cc->status = status;
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result send_json(server *s, struct MHD_Connection *c, conn *cc, int status, char *owned_json) {
    enum MHD_Result rc = send_body(s, c, cc, status, "application/json", owned_json, strlen(owned_json), NULL);
    free(owned_json);
    return rc;
}

static enum MHD_Result send_jobj(server *s, struct MHD_Connection *c, conn *cc, int status, json_t *o) {
    char *txt = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return send_json(s, c, cc, status, txt);
}

static enum MHD_Result send_error(server *s, struct MHD_Connection *c, conn *cc, const srv_error *e) {
    char *body = cc->anthropic ? ant_error_body(e) : oai_error_body(e);
    const char *retry = (e->status == 429 || e->status == 503) ? "1" : NULL;
    enum MHD_Result rc = send_body(s, c, cc, e->status, "application/json", body, strlen(body), retry);
    free(body);
    return rc;
}

static enum MHD_Result fail(server *s, struct MHD_Connection *c, conn *cc, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static enum MHD_Result fail(server *s, struct MHD_Connection *c, conn *cc, int status, const char *param, const char *fmt, ...) {
    srv_error e;
    srv_fail(&e, status, param, "%s", "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.message, sizeof e.message, fmt, ap);
    va_end(ap);
    return send_error(s, c, cc, &e);
}

/* ---- the client's socket ---- */

/* 1 when the peer has closed or reset the connection. Pipelined bytes are not a close: only a 0-byte
 * peek or an error/hang-up is. */
static int peer_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLHUP | POLLERR | POLLNVAL | POLLRDHUP)) return 1;
    if (p.revents & POLLIN) {
        char b;
        ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0) return 1;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return 1;
    }
    return 0;
}

static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* ---- generation ---- */

/* The requests of one HTTP generation call: n choices per prompt, each its own engine request. */
typedef struct gen {
    server *s;
    srv_gen_req req;
    int n_choices;
    cinfer_request **rq;  /* [n_choices]; NULL once finished and freed */
    srv_choice *ch;       /* [n_choices] */
    double *t_last;       /* [n_choices] time of the last output event, 0 before the first */
    int n_done;
    double t0;
    int fd;               /* the client's socket */
    char id[64];
    /* streaming */
    int stream;
    oai_stream os;
    ant_stream as;
    sbuf out;
    size_t out_off;
    int finished;         /* the closing frames are in out */
    double t_sent;
    atomic_int cancelled; /* set once, by the handler or the watcher thread */
    atomic_int all_done;  /* every choice has its DONE (read by the watcher thread) */
    uint64_t watch_id;    /* entry in s->watch, 0: none */
    int first_token_seen;
    cinfer_image **ims;   /* [req.n_images] decoded for the first choice until it is submitted, else NULL */
    cinfer_image **ims_keep; /* [req.n_images] copies the other choices (n > 1) duplicate, else NULL */
} gen;

static void make_id(server *s, const char *prefix, char *out, size_t n) {
    unsigned long long k = atomic_fetch_add(&s->id_counter, 1) + 1;
    uint64_t x = s->id_salt ^ (k * 0x9E3779B97F4A7C15ull);
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    snprintf(out, n, "%s%016llx%04llx", prefix, (unsigned long long)x, k & 0xffff);
}

static void gen_cancel(gen *g);

static void gen_free(gen *g) {
    if (!g) return;
    /* first: after this the watcher thread never touches g */
    watch_remove(g->s->watch, g->watch_id);
    /* MHD may have seen the client go (a failed send) before the reader did: still a cancellation */
    if (g->rq && g->n_done < g->n_choices) gen_cancel(g);
    for (int i = 0; i < g->n_choices; i++) {
        if (g->rq && g->rq[i]) cinfer_request_free(g->rq[i]);
        if (g->ch) srv_choice_free(&g->ch[i]);
    }
    free(g->rq);
    free(g->ch);
    free(g->t_last);
    if (g->stream) {
        if (g->req.api == SRV_API_ANTHROPIC) ant_stream_free(&g->as);
        else oai_stream_free(&g->os);
        metrics_stream(&g->s->m, -1);
    }
    sb_free(&g->out);
    if (g->ims)
        for (int i = 0; i < g->req.n_images; i++) cinfer_image_free(g->ims[i]);
    free(g->ims);
    if (g->ims_keep)
        for (int i = 0; i < g->req.n_images; i++) cinfer_image_free(g->ims_keep[i]);
    free(g->ims_keep);
    srv_gen_req_free(&g->req);
    free(g);
}

static void gen_cancel(gen *g) {
    if (atomic_exchange(&g->cancelled, 1)) return;
    int any = 0;
    for (int i = 0; i < g->n_choices; i++)
        if (g->rq[i] && !g->ch[i].done) {
            cinfer_request_cancel(g->rq[i]);
            any = 1;
        }
    if (any) metrics_cancelled(&g->s->m);
}

/* The watcher thread's callback (under its lock): the client hung up. Cancels every choice; the engine
 * ends each with DONE "cancelled", which wakes the handler out of its long wait. Touches only atomics and
 * the rq pointers, which stay valid until gen_free has removed the watch entry. */
static void gen_peer_gone(void *ud) {
    gen *g = ud;
    if (atomic_load(&g->all_done) || atomic_exchange(&g->cancelled, 1)) return;
    for (int i = 0; i < g->n_choices; i++)
        if (g->rq[i]) cinfer_request_cancel(g->rq[i]); /* a choice already done: a harmless no-op */
    metrics_cancelled(&g->s->m);
}

/* Records timing for an output event of choice i. */
static void gen_timing(gen *g, int i, const cinfer_event *ev) {
    if (ev->type == CINFER_EV_DONE || ev->type == CINFER_EV_ERROR) return;
    double t = now_s();
    if (!g->t_last[i]) {
        metrics_ttft(&g->s->m, t - g->t0);
    } else if (ev->type != CINFER_EV_LOGPROB) {
        metrics_itl(&g->s->m, t - g->t_last[i]);
    }
    if (ev->type != CINFER_EV_LOGPROB || !g->t_last[i]) g->t_last[i] = t;
}

/* Handles one event of choice i: accumulate, and in streaming mode format it. */
static void gen_event(gen *g, int i, const cinfer_event *ev) {
    gen_timing(g, i, ev);
    srv_choice_add(&g->ch[i], g->req.api, ev);
    if (g->stream) {
        if (g->req.api == SRV_API_ANTHROPIC) ant_stream_event(&g->as, ev, &g->out);
        else oai_stream_event(&g->os, i, ev, &g->out);
    }
    if (ev->type == CINFER_EV_DONE || ev->type == CINFER_EV_ERROR) {
        g->n_done++;
        if (g->n_done == g->n_choices) atomic_store(&g->all_done, 1);
        metrics_tokens(&g->s->m, ev->prompt_tokens, ev->completion_tokens);
    }
}

/* Waits up to WAIT_MS (WAIT_LONG_MS: one choice, watched) for events of any unfinished choice and
 * handles all that are ready. Returns the number handled. */
static int gen_poll(gen *g) {
    int handled = 0;
    cinfer_event ev;
    /* Drain what is ready without waiting, then wait on the first unfinished choice. */
    for (int i = 0; i < g->n_choices; i++) {
        while (!g->ch[i].done && cinfer_request_next(g->rq[i], &ev, 0) == 1) {
            gen_event(g, i, &ev);
            handled++;
        }
    }
    if (handled) return handled;
    int wait_ms = g->n_choices == 1 && g->watch_id ? WAIT_LONG_MS : WAIT_MS;
    for (int i = 0; i < g->n_choices; i++) {
        if (g->ch[i].done) continue;
        int rc = cinfer_request_next(g->rq[i], &ev, wait_ms);
        if (rc == 1) {
            gen_event(g, i, &ev);
            handled++;
        } else if (rc < 0 && !g->ch[i].done) {
            /* the engine ended the request without a DONE (it should not): close the choice */
            memset(&ev, 0, sizeof ev);
            ev.type = CINFER_EV_ERROR;
            ev.text = "request ended without a result";
            ev.len = strlen(ev.text);
            gen_event(g, i, &ev);
            handled++;
        }
        break;
    }
    return handled;
}

static void free_images(cinfer_image **ims, int n) {
    if (!ims) return;
    for (int i = 0; i < n; i++) cinfer_image_free(ims[i]);
    free(ims);
}

/* Decodes and preprocesses the request's images (400 naming the image when one is bad or too large). */
static int decode_images(server *s, const srv_gen_req *r, int encode, cinfer_image ***out, srv_error *e) {
    cinfer_image **ims = xcalloc((size_t)r->n_images, sizeof *ims);
    char err[512];
    for (int k = 0; k < r->n_images; k++) {
        int rc = cinfer_image_load(s->model, r->images[k].data, r->images[k].len, s->cfg.defaults.max_image_pixels, &ims[k], err,
                                   sizeof err);
        if (rc < 0) {
            free_images(ims, k);
            return srv_fail(e, rc == CINFER_ENOMEM ? 500 : 400, "messages", "image %d: %s", k, err);
        }
        if (encode) {
            /* the tower runs here, on this connection's thread, so the scheduler never stalls the running
             * streams for it: admission only copies the features */
            rc = cinfer_image_encode(s->model, ims[k], s->cfg.n_threads, err, sizeof err);
            if (rc < 0) {
                free_images(ims, k + 1);
                return srv_fail(e, rc == CINFER_ENOMEM ? 503 : 500, "messages", "image %d: vision tower: %s", k, err);
            }
        }
    }
    *out = ims;
    return 0;
}

/* A chat prompt with images: the images decoded (kept in g->ims for the first choice) and each
 * <|vision_start|><|image_pad|><|vision_end|> the template wrote expanded to the image's token count. */
static int load_images_into(server *s, gen *g, srv_gen_req *r, int p, srv_error *e) {
    cinfer_model_info mi;
    cinfer_model_get_info(s->model, &mi);
    if (!mi.has_vision)
        return srv_fail(e, 400, "messages", "the model %s has no vision tower: it does not accept images", s->model_id);
    if (!r->template_ctx || r->n_prompts != 1) return srv_fail(e, 400, "messages", "images go in chat messages");
    cinfer_image **ims;
    /* on a GPU the context's own tower encodes them at admission (milliseconds there; the CPU tower would
     * take seconds to minutes per image on this thread) */
    cinfer_engine_stats st;
    cinfer_engine_get_stats(s->engine, &st);
    if (decode_images(s, r, st.device != CINFER_DEVICE_CUDA, &ims, e) < 0) return -1;
    int32_t *x = NULL;
    int nx = 0;
    char err[512];
    int rc = cinfer_expand_image_pads(s->model, r->prompt_ids[p], r->n_prompt_ids[p], ims, r->n_images, &x, &nx, err, sizeof err);
    if (rc < 0) {
        free_images(ims, r->n_images);
        return srv_fail(e, 400, "messages", "images: %s", err);
    }
    free(r->prompt_ids[p]);
    r->prompt_ids[p] = x;
    r->n_prompt_ids[p] = nx;
    g->ims = ims;
    return 0;
}

/* Tokenizes the prompts and submits n_prompts x n requests. On failure fills e. */
static int gen_submit(server *s, gen *g, srv_error *e) {
    srv_gen_req *r = &g->req;
    char err[512];
    int reasoning = 0;
    for (int p = 0; p < r->n_prompts; p++) {
        if (r->template_ctx) {
            char *text = NULL;
            int rc = cinfer_apply_chat_template(s->model, r->template_ctx, strlen(r->template_ctx), &text, err, sizeof err);
            if (rc < 0) return srv_fail(e, rc == CINFER_EINVAL ? 400 : 500, "messages", "chat template: %s", err);
            r->prompt_text[p] = text;
            reasoning = srv_reasoning_mode(text, strlen(text));
        }
        if (r->prompt_text[p]) {
            /* The chat template already wrote the special tokens; a raw completion prompt gets the
             * model's own (BOS, where it has one). */
            int rc = cinfer_tokenize(s->model, r->prompt_text[p], strlen(r->prompt_text[p]), r->template_ctx ? 0 : 1,
                                     &r->prompt_ids[p], &r->n_prompt_ids[p], err, sizeof err);
            if (rc < 0) return srv_fail(e, rc == CINFER_EINVAL ? 400 : 500, "prompt", "tokenize: %s", err);
        } else {
            for (int k = 0; k < r->n_prompt_ids[p]; k++)
                if (r->prompt_ids[p][k] >= s->vocab_size)
                    return srv_fail(e, 400, "prompt", "token id %d at position %d is outside the vocabulary (%d)", r->prompt_ids[p][k], k,
                                    s->vocab_size);
        }
        if (r->n_prompt_ids[p] <= 0) return srv_fail(e, 400, "prompt", "the prompt is empty");
        if (r->n_images && load_images_into(s, g, r, p, e) < 0) return -1;
        if (r->n_prompt_ids[p] >= s->ctx_size) {
            srv_fail(e, 400, r->template_ctx ? "messages" : "prompt",
                     "the prompt has %d tokens, the context holds %d (prompt plus output); shorten it", r->n_prompt_ids[p],
                     s->ctx_size);
            snprintf(e->code, sizeof e->code, "context_length_exceeded");
            return -1;
        }
    }
    g->n_choices = r->n_prompts * r->n;
    g->rq = xcalloc((size_t)g->n_choices, sizeof *g->rq);
    g->ch = xcalloc((size_t)g->n_choices, sizeof *g->ch);
    g->t_last = xcalloc((size_t)g->n_choices, sizeof *g->t_last);
    for (int i = 0; i < g->n_choices; i++) srv_choice_init(&g->ch[i], i, r->sampling.n_logprobs >= 0 && r->api != SRV_API_ANTHROPIC);
    int max_tokens = r->max_tokens ? r->max_tokens : s->cfg.defaults.max_tokens;
    for (int i = 0; i < g->n_choices; i++) {
        int p = i / r->n;
        cinfer_request_params rp;
        memset(&rp, 0, sizeof rp);
        rp.prompt = r->prompt_ids[p];
        rp.n_prompt = r->n_prompt_ids[p];
        /* No cap asked: the engine clamps to the room left in the context. */
        rp.max_tokens = max_tokens > 0 ? max_tokens : s->ctx_size;
        rp.sampling = r->sampling;
        if (r->sampling.has_seed) rp.sampling.seed = r->sampling.seed + (uint64_t)(i % r->n);
        rp.stop = (const char *const *)r->stop;
        rp.n_stop = r->n_stop;
        rp.ignore_eos = r->ignore_eos;
        rp.skip_special_tokens = 1;
        rp.reasoning = r->template_ctx ? reasoning : 0;
        rp.tool_format = r->has_tools ? s->tool_format : CINFER_TOOLS_NONE;
        rp.tools_json = r->has_tools ? r->tools_json : NULL;
        rp.constraint = r->constraint;
        rp.constraint_arg = r->constraint_arg;
        /* each choice is its own engine request and owns its images: the first reuses those loaded for the
         * pad expansion, the others decode them again */
        cinfer_image **ims = NULL;
        if (r->n_images) {
            if (i == 0) {
                if (g->n_choices > 1) { /* keep copies for the other choices before the engine takes these */
                    g->ims_keep = xcalloc((size_t)r->n_images, sizeof *g->ims_keep);
                    for (int k = 0; k < r->n_images; k++) g->ims_keep[k] = cinfer_image_dup(g->ims[k]);
                    for (int k = 0; k < r->n_images; k++)
                        if (!g->ims_keep[k]) return srv_fail(e, 503, NULL, "out of memory for the images");
                }
                ims = g->ims;
                g->ims = NULL;
            } else {
                /* the first choice's images were handed to the engine; the later ones copy them from the
                 * copies kept in g->ims_keep (features included: the tower runs once per request) */
                ims = xcalloc((size_t)r->n_images, sizeof *ims);
                for (int k = 0; k < r->n_images; k++)
                    if (!(ims[k] = cinfer_image_dup(g->ims_keep[k]))) {
                        free_images(ims, k);
                        for (int q = 0; q < i; q++) {
                            cinfer_request_free(g->rq[q]);
                            g->rq[q] = NULL;
                        }
                        return srv_fail(e, 503, NULL, "out of memory for the images of choice %d", i);
                    }
            }
            rp.images = ims;
            rp.n_images = r->n_images;
        }
        int rc = cinfer_engine_submit(s->engine, &rp, &g->rq[i], err, sizeof err);
        if (rc == 0) free(ims); /* the array; the engine owns the images now */
        else free_images(ims, r->n_images);
        if (rc < 0) {
            g->rq[i] = NULL;
            for (int k = 0; k < i; k++) {
                cinfer_request_free(g->rq[k]);
                g->rq[k] = NULL;
            }
            if (rc == CINFER_EBUSY) {
                metrics_busy(&s->m);
                return srv_fail(e, 429, NULL, "the server is busy (request queue full): retry later");
            }
            if (rc == CINFER_ERANGE) {
                srv_fail(e, 400, r->template_ctx ? "messages" : "prompt", "%s", err);
                snprintf(e->code, sizeof e->code, "context_length_exceeded");
                return -1;
            }
            if (rc == CINFER_EINVAL && r->constraint) return srv_fail(e, 400, r->constraint_param, "'%s': %s", r->constraint_param, err);
            return srv_fail(e, rc == CINFER_EINVAL ? 400 : 500, NULL, "submit: %s", err);
        }
    }
    return 0;
}

/* The stream's reader: hands out formatted bytes, waiting on the engine when there are none. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    gen *g = cls;
    (void)pos;
    for (;;) {
        if (g->out_off < g->out.len) {
            size_t n = g->out.len - g->out_off;
            if (n > max) n = max;
            memcpy(buf, g->out.data + g->out_off, n);
            g->out_off += n;
            if (g->out_off == g->out.len) {
                sb_clear(&g->out);
                g->out_off = 0;
            }
            g->t_sent = now_s();
            return (ssize_t)n;
        }
        if (g->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        if (atomic_load(&g->s->stopping) || peer_gone(g->fd)) {
            gen_cancel(g);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (g->n_done == g->n_choices) {
            if (g->req.api != SRV_API_ANTHROPIC) {
                if (g->req.include_usage) oai_stream_usage(&g->os, g->ch, g->n_choices, g->req.n, &g->out);
                sse_done(&g->out);
            }
            metrics_e2e(&g->s->m, now_s() - g->t0);
            g->finished = 1;
            continue;
        }
        gen_poll(g);
        if (!g->out.len && now_s() - g->t_sent > KEEPALIVE_S) {
            if (g->req.api == SRV_API_ANTHROPIC) ant_stream_ping(&g->out);
            else sse_keepalive(&g->out);
        }
    }
}

static void stream_free(void *cls) { gen_free(cls); }

static enum MHD_Result handle_generate(server *s, struct MHD_Connection *c, conn *cc, json_t *body) {
    srv_error e = {0};
    gen *g = xcalloc(1, sizeof *g);
    g->s = s;
    g->t0 = cc->t0;
    g->fd = conn_fd(c);
    int rc;
    const char *prefix;
    switch (cc->rt) {
    case R_CHAT:
        rc = oai_parse_chat(body, &s->cfg.defaults, &g->req, &e);
        prefix = "chatcmpl-";
        break;
    case R_COMPLETIONS:
        rc = oai_parse_completion(body, &s->cfg.defaults, &g->req, &e);
        prefix = "cmpl-";
        break;
    default:
        rc = ant_parse_messages(body, &s->cfg.defaults, &g->req, &e);
        prefix = "msg_";
        break;
    }
    json_decref(body);
    if (rc < 0 || gen_submit(s, g, &e) < 0) {
        gen_free(g);
        return send_error(s, c, cc, &e);
    }
    g->watch_id = watch_add(s->watch, g->fd, gen_peer_gone, g);
    make_id(s, prefix, g->id, sizeof g->id);
    srv_resp_meta meta = {g->id, g->req.model ? g->req.model : s->model_id, (long long)time(NULL)};

    if (g->req.stream) {
        g->stream = 1;
        metrics_stream(&s->m, 1);
        if (g->req.api == SRV_API_ANTHROPIC) {
            ant_stream_init(&g->as, &meta);
            ant_stream_start(&g->as, g->req.n_prompt_ids[0], 0, &g->out);
        } else {
            oai_stream_init(&g->os, g->req.api, &meta, g->n_choices, g->req.sampling.n_logprobs >= 0);
        }
        g->t_sent = now_s();
        cc->prompt_tokens = g->req.n_prompt_ids[0];
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, g, stream_free);
        if (!r) {
            gen_free(g);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        MHD_add_response_header(r, "X-Accel-Buffering", "no");
        add_cors(s, c, r);
        cc->status = 200;
        enum MHD_Result q = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        return q;
    }

    while (g->n_done < g->n_choices) {
        if (atomic_load(&s->stopping) || peer_gone(g->fd)) {
            gen_cancel(g);
            gen_free(g);
            cc->status = 499; /* client closed; nothing is sent */
            return MHD_NO;
        }
        gen_poll(g);
    }
    metrics_e2e(&s->m, now_s() - g->t0);
    for (int i = 0; i < g->n_choices; i++) {
        cc->prompt_tokens += g->ch[i].prompt_tokens;
        cc->completion_tokens += g->ch[i].completion_tokens;
        if (g->ch[i].error) {
            srv_fail(&e, 500, NULL, "generation failed: %s", g->ch[i].error);
            gen_free(g);
            return send_error(s, c, cc, &e);
        }
    }
    char *out;
    if (g->req.api == SRV_API_CHAT) out = oai_chat_response(&meta, g->ch, g->n_choices);
    else if (g->req.api == SRV_API_COMPLETION) out = oai_completion_response(&meta, g->ch, g->n_choices, g->req.n);
    else out = ant_message_response(&meta, &g->ch[0]);
    gen_free(g);
    return send_json(s, c, cc, 200, out);
}

/* ---- small endpoints ---- */

static enum MHD_Result handle_tokenize(server *s, struct MHD_Connection *c, conn *cc, json_t *body) {
    const json_t *content = json_object_get(body, "content");
    int add_special = 0, with_pieces = 0;
    srv_error e;
    if (!json_is_string(content)) {
        json_decref(body);
        return fail(s, c, cc, 400, "content", "'content' must be a string");
    }
    const json_t *as = json_object_get(body, "add_special"), *wp = json_object_get(body, "with_pieces");
    if ((as && !json_is_boolean(as)) || (wp && !json_is_boolean(wp))) {
        json_decref(body);
        return fail(s, c, cc, 400, as && !json_is_boolean(as) ? "add_special" : "with_pieces", "must be a boolean");
    }
    add_special = json_is_true(as);
    with_pieces = json_is_true(wp);
    int32_t *ids = NULL;
    int n = 0;
    char err[512];
    int rc = cinfer_tokenize(s->model, json_string_value(content), json_string_length(content), add_special, &ids, &n, err, sizeof err);
    json_decref(body);
    if (rc < 0) {
        srv_fail(&e, 400, "content", "tokenize: %s", err);
        return send_error(s, c, cc, &e);
    }
    json_t *toks = json_array();
    for (int i = 0; i < n; i++) {
        if (!with_pieces) {
            json_array_append_new(toks, json_integer(ids[i]));
            continue;
        }
        char *piece = NULL;
        json_t *o = json_object();
        json_object_set_new(o, "id", json_integer(ids[i]));
        if (cinfer_detokenize(s->model, &ids[i], 1, 0, &piece, err, sizeof err) == 0) {
            size_t pl = strlen(piece);
            /* llama-server's shape: the piece as a string when it is valid UTF-8, else its bytes */
            if (utf8_valid(piece, pl)) json_object_set_new(o, "piece", json_stringn(piece, pl));
            else {
                json_t *b = json_array();
                for (size_t k = 0; k < pl; k++) json_array_append_new(b, json_integer((unsigned char)piece[k]));
                json_object_set_new(o, "piece", b);
            }
        }
        free(piece);
        json_array_append_new(toks, o);
    }
    free(ids);
    json_t *o = json_object();
    json_object_set_new(o, "tokens", toks);
    return send_jobj(s, c, cc, 200, o);
}

static enum MHD_Result handle_detokenize(server *s, struct MHD_Connection *c, conn *cc, json_t *body) {
    const json_t *toks = json_object_get(body, "tokens");
    if (!json_is_array(toks)) {
        json_decref(body);
        return fail(s, c, cc, 400, "tokens", "'tokens' must be an array of token ids");
    }
    size_t n = json_array_size(toks);
    int32_t *ids = xmalloc((n ? n : 1) * sizeof *ids);
    for (size_t i = 0; i < n; i++) {
        const json_t *t = json_array_get(toks, i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= s->vocab_size) {
            free(ids);
            json_decref(body);
            return fail(s, c, cc, 400, "tokens", "'tokens[%zu]' must be a token id in [0, %d)", i, s->vocab_size);
        }
        ids[i] = (int32_t)json_integer_value(t);
    }
    json_decref(body);
    char *text = NULL, err[512];
    int rc = cinfer_detokenize(s->model, ids, (int)n, 0, &text, err, sizeof err);
    free(ids);
    if (rc < 0) return fail(s, c, cc, 400, "tokens", "detokenize: %s", err);
    json_t *o = json_object();
    json_object_set_new(o, "content", srv_json_text(text, strlen(text)));
    free(text);
    return send_jobj(s, c, cc, 200, o);
}

/* Renders the template for /apply-template and count_tokens. */
static int render(server *s, const char *ctx, char **out, srv_error *e) {
    char err[512];
    int rc = cinfer_apply_chat_template(s->model, ctx, strlen(ctx), out, err, sizeof err);
    if (rc < 0) return srv_fail(e, rc == CINFER_EINVAL ? 400 : 500, "messages", "chat template: %s", err);
    return 0;
}

static enum MHD_Result handle_apply_template(server *s, struct MHD_Connection *c, conn *cc, json_t *body) {
    srv_error e;
    char *ctx = NULL, *prompt = NULL;
    int rc = oai_parse_apply_template(body, &s->cfg.defaults, &ctx, &e);
    json_decref(body);
    if (rc < 0 || render(s, ctx, &prompt, &e) < 0) {
        free(ctx);
        return send_error(s, c, cc, &e);
    }
    free(ctx);
    json_t *o = json_object();
    json_object_set_new(o, "prompt", srv_json_text(prompt, strlen(prompt)));
    free(prompt);
    return send_jobj(s, c, cc, 200, o);
}

static enum MHD_Result handle_count_tokens(server *s, struct MHD_Connection *c, conn *cc, json_t *body) {
    srv_error e;
    srv_gen_req r;
    int rc = ant_parse_count_tokens(body, &s->cfg.defaults, &r, &e);
    json_decref(body);
    if (rc < 0) return send_error(s, c, cc, &e);
    char *prompt = NULL, err[512];
    if (render(s, r.template_ctx, &prompt, &e) < 0) {
        srv_gen_req_free(&r);
        return send_error(s, c, cc, &e);
    }
    int32_t *ids = NULL;
    int n = 0;
    rc = cinfer_tokenize(s->model, prompt, strlen(prompt), 0, &ids, &n, err, sizeof err);
    free(prompt);
    if (rc < 0) {
        srv_gen_req_free(&r);
        return fail(s, c, cc, 400, "messages", "tokenize: %s", err);
    }
    /* images count as the tokens they expand to */
    cinfer_image **ims = NULL;
    if (r.n_images && decode_images(s, &r, 0, &ims, &e) < 0) {
        free(ids);
        srv_gen_req_free(&r);
        return send_error(s, c, cc, &e);
    }
    for (int k = 0; k < r.n_images; k++) n += cinfer_image_n_tokens(ims[k]) - 1;
    free_images(ims, r.n_images);
    free(ids);
    srv_gen_req_free(&r);
    json_t *o = json_object();
    json_object_set_new(o, "input_tokens", json_integer(n));
    return send_jobj(s, c, cc, 200, o);
}

static enum MHD_Result handle_models(server *s, struct MHD_Connection *c, conn *cc) {
    json_t *m = json_object();
    json_object_set_new(m, "id", json_string(s->model_id));
    json_object_set_new(m, "object", json_string("model"));
    json_object_set_new(m, "created", json_integer(s->started));
    json_object_set_new(m, "owned_by", json_string("cinfer"));
    json_t *meta = json_object();
    json_object_set_new(meta, "n_ctx", json_integer(s->ctx_size));
    json_object_set_new(meta, "n_vocab", json_integer(s->vocab_size));
    /* what the forward runs (cinfer_engine_stats), so a client can tell exact from fast numerics */
    json_object_set_new(meta, "device", json_string(s->device == CINFER_DEVICE_CUDA ? "cuda" : "cpu"));
    json_object_set_new(meta, "precision", json_string(cinfer_precision_name(s->precision)));
    json_object_set_new(m, "meta", meta);
    json_t *data = json_array();
    json_array_append_new(data, m);
    json_t *o = json_object();
    json_object_set_new(o, "object", json_string("list"));
    json_object_set_new(o, "data", data);
    return send_jobj(s, c, cc, 200, o);
}

static enum MHD_Result handle_metrics(server *s, struct MHD_Connection *c, conn *cc) {
    sbuf out = {0};
    cinfer_engine_stats st;
    int ready = atomic_load(&s->ready);
    if (ready) cinfer_engine_get_stats(s->engine, &st);
    metrics_render(&s->m, ready ? &st : NULL, !ready, &out);
    enum MHD_Result rc = send_body(s, c, cc, 200, "text/plain; version=0.0.4; charset=utf-8", out.data ? out.data : "", out.len, NULL);
    sb_free(&out);
    return rc;
}

/* ---- routing ---- */

typedef struct {
    const char *path;
    route rt;
    int post;
} route_entry;

static const route_entry routes[] = {
    {"/v1/chat/completions", R_CHAT, 1},      {"/chat/completions", R_CHAT, 1},
    {"/v1/completions", R_COMPLETIONS, 1},    {"/completions", R_COMPLETIONS, 1},
    {"/v1/models", R_MODELS, 0},              {"/models", R_MODELS, 0},
    {"/v1/messages", R_MESSAGES, 1},          {"/v1/messages/count_tokens", R_COUNT_TOKENS, 1},
    {"/health", R_HEALTH, 0},                 {"/v1/health", R_HEALTH, 0},
    {"/metrics", R_METRICS, 0},               {"/tokenize", R_TOKENIZE, 1},
    {"/detokenize", R_DETOKENIZE, 1},         {"/apply-template", R_APPLY_TEMPLATE, 1},
    {"/", R_WEB, 0},                          {"/index.html", R_WEB, 0},
    {"/app.js", R_WEB, 0},                    {"/app.css", R_WEB, 0},
};

static const route_entry *route_find(const char *url) {
    size_t n = strcspn(url, "?");
    /* one trailing slash is forgiven: SDKs join base URLs in different ways */
    if (n > 1 && url[n - 1] == '/') n--;
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++)
        if (strlen(routes[i].path) == n && !strncmp(routes[i].path, url, n)) return &routes[i];
    return NULL;
}

/* Constant-time comparison: the key's bytes are not revealed by timing. */
static int key_equal(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    unsigned char d = (unsigned char)(la != lb);
    for (size_t i = 0; i < lb; i++) d |= (unsigned char)(a[i < la ? i : 0] ^ b[i]);
    return d == 0;
}

static int authorized(server *s, struct MHD_Connection *c) {
    const char *key = s->cfg.api_key;
    if (!key || !*key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (h && !strncasecmp(h, "Bearer ", 7) && key_equal(h + 7, key)) return 1;
    const char *x = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    return x && key_equal(x, key);
}

/* The chat page and its script and style, embedded; a strict CSP (own origin only) and no sniffing. */
static enum MHD_Result handle_web(server *s, struct MHD_Connection *c, conn *cc) {
    const unsigned char *data;
    size_t len;
    const char *type;
    if (!web_asset(cc->path, &data, &len, &type)) return fail(s, c, cc, 404, NULL, "not found");
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)data, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    MHD_add_response_header(r, "Content-Security-Policy", WEB_CSP);
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    cc->status = 200;
    enum MHD_Result rc = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result dispatch(server *s, struct MHD_Connection *c, conn *cc) {
    if (cc->rt == R_OPTIONS) {
        struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        add_cors(s, c, r);
        if (s->cfg.allowed_origins && *s->cfg.allowed_origins) {
            MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
            MHD_add_response_header(r, "Access-Control-Allow-Headers",
                                    "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta, x-stainless-*");
            MHD_add_response_header(r, "Access-Control-Max-Age", "600");
        }
        cc->status = 204;
        enum MHD_Result rc = MHD_queue_response(c, 204, r);
        MHD_destroy_response(r);
        return rc;
    }
    if (cc->rt == R_HEALTH) {
        if (!atomic_load(&s->ready)) return fail(s, c, cc, 503, NULL, "Loading model");
        json_t *o = json_object();
        json_object_set_new(o, "status", json_string("ok"));
        return send_jobj(s, c, cc, 200, o);
    }
    if (cc->rt == R_METRICS) return handle_metrics(s, c, cc);
    if (cc->rt == R_WEB) return handle_web(s, c, cc);
    if (!atomic_load(&s->ready)) return fail(s, c, cc, 503, NULL, "Loading model");
    if (cc->rt == R_MODELS) return handle_models(s, c, cc);

    srv_error e;
    json_t *body;
    if (srv_parse_body(cc->body.data ? cc->body.data : "", cc->body.len, SRV_MAX_JSON_DEPTH, &body, &e) < 0)
        return send_error(s, c, cc, &e);
    sb_free(&cc->body);
    switch (cc->rt) {
    case R_CHAT:
    case R_COMPLETIONS:
    case R_MESSAGES: return handle_generate(s, c, cc, body);
    case R_COUNT_TOKENS: return handle_count_tokens(s, c, cc, body);
    case R_TOKENIZE: return handle_tokenize(s, c, cc, body);
    case R_DETOKENIZE: return handle_detokenize(s, c, cc, body);
    case R_APPLY_TEMPLATE: return handle_apply_template(s, c, cc, body);
    default: json_decref(body); return fail(s, c, cc, 404, NULL, "not found");
    }
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method, const char *version,
                                  const char *upload_data, size_t *upload_size, void **con_cls) {
    server *s = cls;
    (void)version;
    conn *cc = *con_cls;
    if (!cc) {
        /* First call: headers only. Decide everything that does not need the body now, so a refused
         * request never has its body buffered. */
        cc = xcalloc(1, sizeof *cc);
        *con_cls = cc;
        cc->t0 = now_s();
        snprintf(cc->method, sizeof cc->method, "%s", method);
        snprintf(cc->path, sizeof cc->path, "%s", url);
        const route_entry *re = route_find(url);
        cc->anthropic = !strncmp(url, "/v1/messages", 12);
        if (!strcmp(method, "OPTIONS")) {
            cc->rt = R_OPTIONS;
            return MHD_YES;
        }
        if (!re) return fail(s, c, cc, 404, NULL, "no route for %s %.100s", method, url);
        cc->rt = re->rt;
        cc->post = re->post;
        if (strcmp(method, re->post ? "POST" : "GET") && !(strcmp(method, "HEAD") == 0 && !re->post))
            return fail(s, c, cc, 405, NULL, "%s is not allowed on %.100s (use %s)", method, re->path, re->post ? "POST" : "GET");
        /* the page is static and public; the API calls it makes carry the key the user types in */
        if (re->rt != R_HEALTH && re->rt != R_WEB && !authorized(s, c))
            return fail(s, c, cc, 401, NULL, "invalid or missing API key (Authorization: Bearer <key> or x-api-key)");
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->cfg.max_body)
            return fail(s, c, cc, 413, NULL, "request body of %s bytes is over the limit of %zu", cl, s->cfg.max_body);
        return MHD_YES;
    }
    if (cc->status) {
        /* already answered (an early refusal): the rest of the body is dropped */
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        /* Chunked bodies have no Content-Length: the limit is checked as bytes arrive, and the rest is
         * read and dropped so the 413 can be sent. */
        if (!cc->too_big && cc->body.len + *upload_size > s->cfg.max_body) {
            cc->too_big = 1;
            sb_free(&cc->body);
        }
        if (!cc->too_big) sb_append(&cc->body, upload_data, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (cc->too_big) return fail(s, c, cc, 413, NULL, "request body is over the limit of %zu bytes", s->cfg.max_body);
    return dispatch(s, c, cc);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    server *s = cls;
    (void)c;
    conn *cc = *con_cls;
    if (!cc) return;
    *con_cls = NULL;
    int status = cc->status ? cc->status : 499;
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && status == 200) status = 499; /* the client left mid-response */
    metrics_request(&s->m, (int)cc->rt, status);
    double ms = (now_s() - cc->t0) * 1e3;
    if (s->cfg.log_json) {
        json_t *o = json_object();
        json_object_set_new(o, "ts", json_integer((json_int_t)time(NULL)));
        json_object_set_new(o, "method", json_string(cc->method));
        json_object_set_new(o, "path", srv_json_text(cc->path, strlen(cc->path)));
        json_object_set_new(o, "status", json_integer(status));
        json_object_set_new(o, "ms", json_real(ms));
        if (cc->prompt_tokens) json_object_set_new(o, "prompt_tokens", json_integer(cc->prompt_tokens));
        if (cc->completion_tokens) json_object_set_new(o, "completion_tokens", json_integer(cc->completion_tokens));
        char *line = json_dumps(o, JSON_COMPACT);
        fprintf(stderr, "%s\n", line);
        free(line);
        json_decref(o);
    } else if (!(cc->rt == R_HEALTH && status == 200)) {
        fprintf(stderr, "cinfer serve: %s %s %d %.1f ms\n", cc->method, cc->path, status, ms);
    }
    sb_free(&cc->body);
    free(cc);
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, ap);
    LOG_W("http: %s", buf);
}

/* ---- run ---- */

static int resolve(const char *host, int port, struct sockaddr_storage *ss, socklen_t *len, char *err, size_t errlen) {
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(host, ps, &hints, &res);
    if (rc) return ci_err(err, errlen, CINFER_EINVAL, "cannot resolve host '%s': %s", host, gai_strerror(rc));
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

int srv_run(const srv_config *cfg, volatile sig_atomic_t *stop, char *err, size_t errlen) {
    server *s = xcalloc(1, sizeof *s);
    s->cfg = *cfg;
    metrics_init(&s->m);
    s->started = (long long)time(NULL);
    s->id_salt = (uint64_t)time(NULL) * 0x100000001B3ull ^ (uint64_t)getpid() << 32 ^ (uint64_t)(uintptr_t)s;
    const char *name = cfg->model_name;
    if (!name) {
        const char *dir = cfg->model_dir;
        size_t n = strlen(dir);
        while (n > 1 && dir[n - 1] == '/') n--;
        const char *slash = dir + n;
        while (slash > dir && slash[-1] != '/') slash--;
        snprintf(s->model_id, sizeof s->model_id, "%.*s", (int)(dir + n - slash), slash);
    } else
        snprintf(s->model_id, sizeof s->model_id, "%s", name);

    struct sockaddr_storage ss;
    socklen_t sl;
    int rc = resolve(cfg->host, cfg->port, &ss, &sl, err, errlen);
    if (rc < 0) goto out;
    char werr[256];
    if (watch_create(&s->watch, werr, sizeof werr) < 0) /* handlers then poll their sockets as before */
        LOG_W("no connection watcher (%s): waiting streams poll their sockets", werr);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG;
    if (ss.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->d = MHD_start_daemon(flags, (uint16_t)cfg->port, NULL, NULL, on_request, s,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, /* first, or MHD logs the rest itself */
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)cfg->max_connections,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->timeout_s,
                            /* bounds the request line and headers (MHD answers 431 past it) */
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024),
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_END);
    if (!s->d) {
        rc = ci_err(err, errlen, CINFER_EIO, "cannot listen on %s:%d: %s", cfg->host, cfg->port, strerror(errno));
        goto out;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    int port = di ? di->port : cfg->port;
    const char *h = cfg->host;
    int v6 = strchr(h, ':') != NULL;
    printf("cinfer serve: listening on http://%s%s%s:%d (model %s loading)\n", v6 ? "[" : "", h, v6 ? "]" : "", port, cfg->model_dir);
    fflush(stdout);

    rc = cinfer_model_open(cfg->model_dir, &s->model, err, errlen);
    if (rc < 0) goto out;
    if (!cinfer_model_has_tokenizer(s->model)) {
        rc = ci_err(err, errlen, CINFER_ENOTFOUND, "%s has no tokenizer.json: the server needs one", cfg->model_dir);
        goto out;
    }
    cinfer_model_info info;
    cinfer_model_get_info(s->model, &info);
    s->vocab_size = info.vocab_size;
    /* the model's generation_config.json fills the sampling defaults the command line left unset */
    if (!cfg->no_generation_config) {
        srv_defaults *d = &s->cfg.defaults;
        if (d->temperature < 0 && info.gen_temperature >= 0) d->temperature = info.gen_temperature;
        if (d->top_p < 0 && info.gen_top_p > 0) d->top_p = info.gen_top_p;
        if (d->top_k < 0 && info.gen_top_k >= 0) d->top_k = info.gen_top_k;
        if (d->min_p < 0 && info.gen_min_p >= 0) d->min_p = info.gen_min_p;
        if (d->repetition_penalty <= 0 && info.gen_repetition_penalty > 0) d->repetition_penalty = info.gen_repetition_penalty;
        printf("cinfer serve: sampling defaults temperature %g, top_p %g, top_k %d, min_p %g, repetition_penalty %g "
               "(command line, else %s/generation_config.json; requests override)\n",
               d->temperature < 0 ? 1.0 : d->temperature, d->top_p < 0 ? 1.0 : d->top_p, d->top_k < 0 ? 0 : d->top_k,
               d->min_p < 0 ? 0.0 : d->min_p, d->repetition_penalty <= 0 ? 1.0 : d->repetition_penalty, cfg->model_dir);
        fflush(stdout);
    }
    s->tool_format = srv_tool_format(cinfer_model_chat_template(s->model));
    cinfer_engine_params ep = cinfer_engine_default_params();
    if (cfg->ctx_size > 0) ep.ctx_size = cfg->ctx_size;
    if (cfg->max_seqs > 0) ep.max_seqs = cfg->max_seqs;
    if (cfg->queue_limit > 0) ep.queue_limit = cfg->queue_limit;
    if (cfg->n_threads > 0) ep.n_threads = cfg->n_threads;
    if (cfg->kv_memory > 0) ep.kv_memory = cfg->kv_memory;
    ep.prefix_cache_memory = cfg->prefix_cache_memory;
    if (cfg->step_tokens > 0) ep.step_tokens = cfg->step_tokens;
    ep.spec = (cinfer_spec_mode)cfg->spec;
    if (cfg->spec_max_draft > 0) ep.spec_max_draft = cfg->spec_max_draft;
    ep.spec_mtp_vocab = cfg->spec_mtp_vocab;
    if (cfg->spec == CINFER_SPEC_DRAFT) {
        if (!cfg->draft_model_dir) {
            rc = ci_err(err, errlen, CINFER_EINVAL, "--spec draft needs --draft-model DIR");
            goto out;
        }
        if ((rc = cinfer_model_open(cfg->draft_model_dir, &s->draft, err, errlen)) < 0) goto out;
        ep.draft_model = s->draft;
    }
    rc = cinfer_engine_create(s->model, &ep, &s->engine, err, errlen);
    if (rc < 0) goto out;
    s->ctx_size = ep.ctx_size;
    cinfer_engine_stats est;
    cinfer_engine_get_stats(s->engine, &est);
    s->device = est.device, s->precision = est.precision;
    atomic_store(&s->ready, 1);
    printf("cinfer serve: ready on http://%s%s%s:%d (model %s: %s, %d layers, ctx %d, %d sequences, %s, precision %s%s)\n",
           v6 ? "[" : "", h, v6 ? "]" : "", port, s->model_id, info.arch, info.n_layers, ep.ctx_size, ep.max_seqs,
           s->device == CINFER_DEVICE_CUDA ? "cuda" : "cpu", cinfer_precision_name(s->precision),
           ep.precision == CINFER_PRECISION_FAST && s->precision != CINFER_PRECISION_FAST ? " (fast asked: the CPU runs exact)" : "");
    fflush(stdout);

    while (!*stop) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    rc = 0;
out:
    /* Streams see `stopping` within one wait and end (fire_all cancels the watched ones, whose DONE wakes
     * them now); then the daemon joins its threads, and only then may the watcher and the engine go. */
    atomic_store(&s->stopping, 1);
    watch_fire_all(s->watch);
    if (s->d) MHD_stop_daemon(s->d);
    watch_destroy(s->watch);
    if (s->engine) cinfer_engine_destroy(s->engine);
    if (s->model) cinfer_model_close(s->model);
    if (s->draft) cinfer_model_close(s->draft);
    metrics_destroy(&s->m);
    free(s);
    return rc;
}

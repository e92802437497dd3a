/* mock_engine.c — a stand-in for libcinfer's text and engine API (include/cinfer.h), for testing the HTTP
 * layer on its own: deterministic and fast, with the same contract (a scheduler thread, a bounded queue,
 * max_seqs running, events per request, cancel within a step, stats). It is linked instead of
 * libcinfer into build/cinfer-mock-serve only; the real server links the real engine.
 *
 * The "model": bytes are tokens (vocab 256 + 2 specials), the chat template is ChatML, and the output
 * of a request is a function of its prompt (and of the seed when temperature > 0): the letters of the
 * prompt's last user line, rotated, one byte per token, ending with EOS when the prompt asks "stop". */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "cinfer.h"

#define MOCK_VOCAB 258
#define MOCK_STEP_MS 4

struct cinfer_model {
    char dir[512];
};

int cinfer_model_open(const char *dir, cinfer_model **out, char *err, size_t errlen) {
    /* MOCK_LOAD_DELAY_MS lets the tests see the server while it loads (503). */
    const char *delay = getenv("MOCK_LOAD_DELAY_MS");
    if (delay) {
        long ms = atol(delay);
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    cinfer_model *m = calloc(1, sizeof *m);
    snprintf(m->dir, sizeof m->dir, "%s", dir);
    *out = m;
    (void)err, (void)errlen;
    return 0;
}

void cinfer_model_close(cinfer_model *m) { free(m); }

static const int mock_eos[1] = {257};

void cinfer_model_get_info(const cinfer_model *m, cinfer_model_info *out) {
    (void)m;
    memset(out, 0, sizeof *out);
    out->arch = "mock";
    out->n_layers = 1;
    out->vocab_size = MOCK_VOCAB;
    out->eos_ids = mock_eos;
    out->n_eos = 1;
}

int cinfer_model_has_tokenizer(const cinfer_model *m) { return m != NULL; }

int cinfer_tokenize(const cinfer_model *m, const char *text, size_t len, int add_special, int32_t **ids, int *n_ids, char *err,
                    size_t errlen) {
    (void)m, (void)add_special, (void)err, (void)errlen;
    *ids = malloc((len ? len : 1) * sizeof **ids);
    for (size_t i = 0; i < len; i++) (*ids)[i] = (unsigned char)text[i];
    *n_ids = (int)len;
    return 0;
}

int cinfer_detokenize(const cinfer_model *m, const int32_t *ids, int n_ids, int skip_special, char **text, char *err, size_t errlen) {
    (void)m, (void)err, (void)errlen;
    char *s = malloc((size_t)n_ids * 8 + 1);
    size_t k = 0;
    for (int i = 0; i < n_ids; i++) {
        if (ids[i] < 256) s[k++] = (char)ids[i];
        else if (!skip_special) k += (size_t)sprintf(s + k, "<%d>", ids[i]);
    }
    s[k] = 0;
    *text = s;
    return 0;
}

static const char mock_template[] = "ChatML; tools as <tool_call>\\n<function=name>\\n<parameter=p>\\nv\\n</parameter>\\n</function>\\n</tool_call>";

const char *cinfer_model_chat_template(const cinfer_model *m) { return m ? mock_template : NULL; }

static void put_text(char **b, size_t *n, size_t *cap, const char *s) {
    size_t l = strlen(s);
    while (*n + l + 1 > *cap) *b = realloc(*b, *cap *= 2);
    memcpy(*b + *n, s, l + 1);
    *n += l;
}

int cinfer_apply_chat_template(const cinfer_model *m, const char *ctx_json, size_t len, char **out, char *err, size_t errlen) {
    (void)m;
    json_error_t je;
    json_t *ctx = json_loadb(ctx_json, len, 0, &je);
    json_t *msgs = json_object_get(ctx, "messages");
    if (!json_is_array(msgs) || !json_array_size(msgs)) {
        json_decref(ctx);
        snprintf(err, errlen, "No messages provided.");
        return CINFER_EINVAL;
    }
    size_t n = 0, cap = 256;
    char *b = malloc(cap);
    b[0] = 0;
    json_t *tools = json_object_get(ctx, "tools");
    if (json_array_size(tools)) {
        char *t = json_dumps(tools, JSON_COMPACT);
        put_text(&b, &n, &cap, "<|im_start|>system\n<tools>");
        put_text(&b, &n, &cap, t);
        put_text(&b, &n, &cap, "</tools><|im_end|>\n");
        free(t);
    }
    size_t i;
    json_t *msg;
    json_array_foreach(msgs, i, msg) {
        put_text(&b, &n, &cap, "<|im_start|>");
        put_text(&b, &n, &cap, json_string_value(json_object_get(msg, "role")) ? json_string_value(json_object_get(msg, "role")) : "?");
        put_text(&b, &n, &cap, "\n");
        json_t *c = json_object_get(msg, "content");
        if (json_is_string(c)) put_text(&b, &n, &cap, json_string_value(c));
        else if (json_is_array(c)) {
            size_t k;
            json_t *p;
            json_array_foreach(c, k, p) if (json_is_string(json_object_get(p, "text"))) put_text(&b, &n, &cap, json_string_value(json_object_get(p, "text")));
        }
        put_text(&b, &n, &cap, "<|im_end|>\n");
    }
    if (json_is_true(json_object_get(ctx, "add_generation_prompt"))) {
        put_text(&b, &n, &cap, "<|im_start|>assistant\n");
        json_t *th = json_object_get(ctx, "enable_thinking");
        put_text(&b, &n, &cap, json_is_true(th) ? "<think>\n" : "");
    }
    json_decref(ctx);
    *out = b;
    return 0;
}

/* ---- engine ---- */

struct cinfer_request {
    struct cinfer_engine *e;
    int32_t *prompt;
    int n_prompt, max_tokens, generated;
    uint64_t h;     /* the output's letters come from this hash */
    int tool_mode;  /* the prompt said CALLTOOL and tools were given: answer with a call */
    char tool_name[64];
    int out_len;    /* EOS after this many */
    char stop[16][64];
    int n_stop;
    int n_logprobs;
    int reasoning, think_open;
    atomic_int cancel;
    int state;      /* 0 waiting, 1 running, 2 finished */
    int freed;      /* the client released it */
    /* event queue (single producer: the scheduler; single consumer: the HTTP thread) */
    cinfer_event evs[64];
    char evtext[64][8];
    int head, tail; /* ring of 64 */
    int ended;      /* DONE pushed */
    int consumed_done;
    cinfer_event cur;
    char curtext[8];
    cinfer_top_logprob top[20];
    char toptext[20][2];
    char emitted[8192];
    int n_emitted, n_sent;
    struct cinfer_request *next;
};

struct cinfer_engine {
    cinfer_engine_params p;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int quit;
    cinfer_request *list; /* all live requests, waiting and running */
    int64_t requests_total, prompt_total, gen_total, steps;
};

cinfer_engine_params cinfer_engine_default_params(void) {
    cinfer_engine_params p = {.max_seqs = 4, .ctx_size = 4096, .step_tokens = 512, .queue_limit = 16, .n_threads = 0, .kv_memory = 0};
    return p;
}

cinfer_sampling cinfer_sampling_default(void) {
    cinfer_sampling s;
    memset(&s, 0, sizeof s);
    s.temperature = 1;
    s.top_p = 1;
    s.repetition_penalty = 1;
    s.n_logprobs = -1;
    return s;
}

static void push(cinfer_request *r, cinfer_event ev, const char *text) {
    int slot = r->tail % 64;
    r->evs[slot] = ev;
    if (text) {
        snprintf(r->evtext[slot], sizeof r->evtext[slot], "%s", text);
        r->evs[slot].text = NULL;
    }
    r->tail++;
}

static void finish(cinfer_request *r, const char *reason, const char *stop) {
    cinfer_event ev;
    memset(&ev, 0, sizeof ev);
    ev.type = CINFER_EV_DONE;
    ev.finish_reason = reason;
    ev.stop_string = stop;
    ev.prompt_tokens = r->n_prompt;
    ev.completion_tokens = r->generated;
    push(r, ev, NULL);
    r->ended = 1;
    r->state = 2;
}

/* Pushes text events (at most 7 bytes each, the size of an event's text slot). */
static void emit_text(cinfer_request *r, const char *t, int n) {
    while (n > 0) {
        char buf[8];
        int k = n < 7 ? n : 7;
        memcpy(buf, t, (size_t)k);
        buf[k] = 0;
        cinfer_event ev;
        memset(&ev, 0, sizeof ev);
        ev.type = r->think_open ? CINFER_EV_REASONING : CINFER_EV_CONTENT;
        push(r, ev, buf);
        r->n_sent += k;
        t += k;
        n -= k;
        if (r->think_open && r->n_sent >= 3) r->think_open = 0; /* three letters of "thinking" */
    }
}

/* A scripted tool call: "ok" as content, then a call to the first tool in two argument deltas. */
static void step_tool(cinfer_request *r) {
    cinfer_event ev;
    memset(&ev, 0, sizeof ev);
    int k = r->generated++;
    if (k == 0) {
        ev.type = CINFER_EV_CONTENT;
        push(r, ev, "ok");
    } else if (k == 1 || k == 2) {
        ev.type = CINFER_EV_TOOL_CALL;
        ev.tool_index = 0;
        if (k == 1) {
            ev.tool_id = "call_mock1";
            ev.tool_name = r->tool_name;
        }
        ev.tool_args = k == 1 ? "{\"city\": " : "\"Paris\"}";
        ev.tool_args_len = strlen(ev.tool_args);
        push(r, ev, NULL);
    } else {
        r->generated = 3;
        finish(r, "tool_calls", NULL);
    }
}

static void step_request(cinfer_engine *e, cinfer_request *r) {
    if (atomic_load(&r->cancel)) {
        finish(r, "cancelled", NULL);
        return;
    }
    if (r->tool_mode) {
        step_tool(r);
        return;
    }
    if (r->tail - r->head > 60) return; /* the consumer is slow: the mock does not drop events */
    if (r->generated >= r->max_tokens || r->generated >= r->out_len) {
        if (r->n_emitted > r->n_sent) emit_text(r, r->emitted + r->n_sent, r->n_emitted - r->n_sent);
        finish(r, r->generated >= r->max_tokens ? "length" : "stop", NULL);
        return;
    }
    if (r->n_emitted + 1 >= (int)sizeof r->emitted) {
        finish(r, "length", NULL);
        return;
    }
    int i = r->generated++;
    char c = (char)('a' + ((r->h >> (i % 50)) + (uint64_t)i / 50) % 26);
    e->gen_total++;
    if (r->n_logprobs >= 0) {
        cinfer_event lp;
        memset(&lp, 0, sizeof lp);
        lp.type = CINFER_EV_LOGPROB;
        lp.token = (unsigned char)c;
        lp.logprob = -0.25f;
        lp.n_top = r->n_logprobs; /* top entries: the chosen byte then the next letters */
        push(r, lp, (char[2]){c, 0});
    }
    r->emitted[r->n_emitted++] = c;
    r->emitted[r->n_emitted] = 0;
    /* Stop strings as the real engine treats them: a match ends the output before it, and text that
     * could be the start of a match is held back until it is known not to be. */
    for (int s = 0; s < r->n_stop; s++) {
        char *hit = strstr(r->emitted, r->stop[s]);
        if (hit) {
            int upto = (int)(hit - r->emitted);
            if (upto > r->n_sent) emit_text(r, r->emitted + r->n_sent, upto - r->n_sent);
            finish(r, "stop", r->stop[s]);
            return;
        }
    }
    int hold = 0;
    for (int s = 0; s < r->n_stop; s++) {
        int sl = (int)strlen(r->stop[s]);
        for (int k = sl - 1; k > hold; k--)
            if (k <= r->n_emitted - r->n_sent && !strncmp(r->emitted + r->n_emitted - k, r->stop[s], (size_t)k)) {
                hold = k;
                break;
            }
    }
    if (r->n_emitted - hold > r->n_sent) emit_text(r, r->emitted + r->n_sent, r->n_emitted - hold - r->n_sent);
}

static void *sched(void *arg) {
    cinfer_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    while (!e->quit) {
        int running = 0;
        for (cinfer_request *r = e->list; r; r = r->next) running += r->state == 1;
        for (cinfer_request *r = e->list; r && running < e->p.max_seqs; r = r->next)
            if (r->state == 0) r->state = 1, running++;
        for (cinfer_request *r = e->list; r; r = r->next)
            if (r->state == 1) step_request(e, r);
        /* reap requests both finished and released */
        cinfer_request **pp = &e->list;
        while (*pp) {
            cinfer_request *r = *pp;
            if (r->freed && r->state == 2) {
                *pp = r->next;
                free(r->prompt);
                free(r);
            } else if (r->freed && r->state == 0) {
                *pp = r->next;
                free(r->prompt);
                free(r);
            } else
                pp = &r->next;
        }
        e->steps++;
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
        struct timespec ts = {0, MOCK_STEP_MS * 1000000L};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&e->mu);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

int cinfer_engine_create(cinfer_model *m, const cinfer_engine_params *p, cinfer_engine **out, char *err, size_t errlen) {
    (void)m, (void)err, (void)errlen;
    cinfer_engine *e = calloc(1, sizeof *e);
    e->p = *p;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    pthread_create(&e->th, NULL, sched, e);
    *out = e;
    return 0;
}

void cinfer_engine_destroy(cinfer_engine *e) {
    pthread_mutex_lock(&e->mu);
    e->quit = 1;
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->th, NULL);
    while (e->list) {
        cinfer_request *r = e->list;
        e->list = r->next;
        free(r->prompt);
        free(r);
    }
    free(e);
}

int cinfer_engine_submit(cinfer_engine *e, const cinfer_request_params *p, cinfer_request **out, char *err, size_t errlen) {
    if (p->n_prompt >= e->p.ctx_size) {
        snprintf(err, errlen, "the prompt has %d tokens, the context holds %d", p->n_prompt, e->p.ctx_size);
        return CINFER_ERANGE;
    }
    pthread_mutex_lock(&e->mu);
    int waiting = 0, running = 0;
    for (cinfer_request *r = e->list; r; r = r->next) {
        if (r->freed) continue;
        waiting += r->state == 0;
        running += r->state == 1;
    }
    if (waiting + running >= e->p.max_seqs + e->p.queue_limit) {
        pthread_mutex_unlock(&e->mu);
        snprintf(err, errlen, "queue full");
        return CINFER_EBUSY;
    }
    cinfer_request *r = calloc(1, sizeof *r);
    r->e = e;
    r->n_prompt = p->n_prompt;
    r->prompt = malloc((size_t)p->n_prompt * sizeof *r->prompt);
    memcpy(r->prompt, p->prompt, (size_t)p->n_prompt * sizeof *r->prompt);
    int room = e->p.ctx_size - p->n_prompt;
    r->max_tokens = p->max_tokens < room ? p->max_tokens : room;
    r->n_logprobs = p->sampling.n_logprobs;
    r->reasoning = p->reasoning;
    r->think_open = p->reasoning == 1;
    for (int i = 0; i < p->n_stop && i < 16; i++) snprintf(r->stop[r->n_stop++], 64, "%s", p->stop[i]);
    /* The output: the letters and spaces of the prompt's tail, after its last newline-delimited user
     * text, rotated by a hash of the whole prompt (and the seed when sampling). */
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < p->n_prompt; i++) h = (h ^ (uint64_t)p->prompt[i]) * 1099511628211ull;
    if (p->sampling.temperature > 0) h ^= p->sampling.has_seed ? p->sampling.seed * 0x9E3779B97F4A7C15ull : (uint64_t)rand();
    r->h = h;
    if (p->tools_json && p->tool_format != CINFER_TOOLS_NONE) {
        int n = p->n_prompt;
        for (int i = 0; i + 8 <= n && !r->tool_mode; i++) {
            static const char key[] = "CALLTOOL";
            int k = 0;
            while (k < 8 && p->prompt[i + k] == key[k]) k++;
            r->tool_mode = k == 8;
        }
        json_error_t je;
        json_t *tools = json_loads(p->tools_json, 0, &je);
        const char *name = json_string_value(json_object_get(json_object_get(json_array_get(tools, 0), "function"), "name"));
        snprintf(r->tool_name, sizeof r->tool_name, "%s", name ? name : "none");
        json_decref(tools);
    }
    r->out_len = p->ignore_eos ? 1 << 30 : 8 + (int)(h % 40); /* EOS after out_len, unless ignored */
    e->requests_total++;
    e->prompt_total += p->n_prompt;
    r->next = e->list;
    e->list = r;
    pthread_mutex_unlock(&e->mu);
    *out = r;
    return 0;
}

int cinfer_request_next(cinfer_request *r, cinfer_event *ev, int timeout_ms) {
    cinfer_engine *e = r->e;
    pthread_mutex_lock(&e->mu);
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    long long ns = dl.tv_nsec + (long long)(timeout_ms < 0 ? 0 : timeout_ms) * 1000000LL;
    dl.tv_sec += ns / 1000000000LL;
    dl.tv_nsec = ns % 1000000000LL;
    while (r->head == r->tail && !r->consumed_done && timeout_ms != 0) {
        if (timeout_ms < 0) pthread_cond_wait(&e->cv, &e->mu);
        else if (pthread_cond_timedwait(&e->cv, &e->mu, &dl)) break;
    }
    int rc;
    if (r->head < r->tail) {
        int slot = r->head % 64;
        r->cur = r->evs[slot];
        memcpy(r->curtext, r->evtext[slot], sizeof r->curtext);
        r->head++;
        if (r->cur.type == CINFER_EV_CONTENT || r->cur.type == CINFER_EV_REASONING) {
            r->cur.text = r->curtext;
            r->cur.len = strlen(r->curtext);
        } else if (r->cur.type == CINFER_EV_LOGPROB) {
            r->cur.token_text = r->curtext;
            r->cur.token_len = strlen(r->curtext);
            for (int k = 0; k < r->cur.n_top && k < 20; k++) {
                r->toptext[k][0] = (char)('a' + (r->curtext[0] - 'a' + k) % 26);
                r->toptext[k][1] = 0;
                r->top[k].token = (unsigned char)r->toptext[k][0];
                r->top[k].logprob = -0.25f - k;
                r->top[k].text = r->toptext[k];
                r->top[k].len = 1;
            }
            r->cur.top = r->top;
        }
        if (r->cur.type == CINFER_EV_DONE) r->consumed_done = 1;
        *ev = r->cur;
        rc = 1;
    } else
        rc = r->consumed_done ? -1 : 0;
    pthread_mutex_unlock(&e->mu);
    return rc;
}

void cinfer_request_cancel(cinfer_request *r) { atomic_store(&r->cancel, 1); }

void cinfer_request_free(cinfer_request *r) {
    if (!r) return;
    cinfer_engine *e = r->e;
    pthread_mutex_lock(&e->mu);
    atomic_store(&r->cancel, 1);
    r->freed = 1;
    pthread_mutex_unlock(&e->mu);
}

/* the server names the precision the engine runs (its stats' precision: 0 here, exact, as on the CPU) */
const char *cinfer_precision_name(int p) {
    return p == CINFER_PRECISION_EXACT ? "exact" : p == CINFER_PRECISION_FAST ? "fast" : "?";
}

void cinfer_engine_get_stats(cinfer_engine *e, cinfer_engine_stats *out) {
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&e->mu);
    for (cinfer_request *r = e->list; r; r = r->next) {
        if (r->state == 0) out->waiting++;
        if (r->state == 1) {
            out->running++;
            out->kv_blocks_used += (r->n_prompt + r->generated + 15) / 16;
        }
    }
    out->max_seqs = e->p.max_seqs;
    out->queue_limit = e->p.queue_limit;
    out->kv_blocks_total = e->p.max_seqs * ((e->p.ctx_size + 15) / 16);
    out->slots_used = out->running;
    out->slots_total = e->p.max_seqs;
    out->requests_total = e->requests_total;
    out->prompt_tokens_total = e->prompt_total;
    out->generated_tokens_total = e->gen_total;
    out->steps_total = e->steps;
    pthread_mutex_unlock(&e->mu);
}

/* Images: the mock model has no vision tower (cinfer_model_info.has_vision is 0), so the server refuses
 * image requests before these are reached; they exist for the link and answer as a text-only model. */
int cinfer_image_load(const cinfer_model *m, const void *data, size_t size, int64_t max_pixels, cinfer_image **out,
                      char *err, size_t errlen) {
    (void)m, (void)data, (void)size, (void)max_pixels;
    *out = NULL;
    snprintf(err, errlen, "this model has no vision tower: images are not accepted");
    return CINFER_EUNSUPPORTED;
}
int cinfer_image_n_tokens(const cinfer_image *im) { return im ? 1 : 0; }
int cinfer_image_encode(const cinfer_model *m, cinfer_image *im, int n_threads, char *err, size_t errlen) {
    (void)m, (void)im, (void)n_threads;
    snprintf(err, errlen, "this model has no vision tower");
    return CINFER_EUNSUPPORTED;
}
cinfer_image *cinfer_image_dup(const cinfer_image *im) { return (cinfer_image *)im; }
void cinfer_image_free(cinfer_image *im) { (void)im; }
int cinfer_expand_image_pads(const cinfer_model *m, const int32_t *ids, int n, cinfer_image *const *images, int n_images,
                             int32_t **out, int *n_out, char *err, size_t errlen) {
    (void)m, (void)ids, (void)n, (void)images, (void)n_images, (void)out, (void)n_out;
    snprintf(err, errlen, "this model has no vision tower");
    return CINFER_EUNSUPPORTED;
}

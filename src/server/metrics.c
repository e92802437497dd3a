/* metrics.c — see metrics.h. One mutex guards the counters: it is taken a few times per token per
 * stream, far off the engine's hot path (the scheduler thread never touches it). */
#include "server/metrics.h"

#include <string.h>

const char *const metrics_route_names[METRICS_ROUTES] = {
    "other", "chat_completions", "completions", "models", "messages", "count_tokens",
    "health", "metrics", "tokenize", "detokenize", "apply_template", "options",
};

static const double ttft_le[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
static const double itl_le[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5};
static const double e2e_le[] = {0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};

void metrics_hist_init(metrics_hist *h, const double *le, int n) {
    memset(h, 0, sizeof *h);
    if (n > METRICS_MAX_BUCKETS) n = METRICS_MAX_BUCKETS;
    h->n_buckets = n;
    memcpy(h->le, le, (size_t)n * sizeof *le);
}

void metrics_hist_add(metrics_hist *h, double v) {
    int b = 0;
    while (b < h->n_buckets && v > h->le[b]) b++;
    h->count[b]++;
    h->n++;
    h->sum += v;
}

void metrics_init(metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    metrics_hist_init(&m->ttft, ttft_le, (int)(sizeof ttft_le / sizeof *ttft_le));
    metrics_hist_init(&m->itl, itl_le, (int)(sizeof itl_le / sizeof *itl_le));
    metrics_hist_init(&m->e2e, e2e_le, (int)(sizeof e2e_le / sizeof *e2e_le));
}

void metrics_destroy(metrics *m) { pthread_mutex_destroy(&m->mu); }

void metrics_request(metrics *m, int route, int status) {
    if (route < 0 || route >= METRICS_ROUTES) route = 0;
    int cls = status / 100 - 2;
    if (cls < 0) cls = 0;
    if (cls > 3) cls = 3;
    pthread_mutex_lock(&m->mu);
    m->requests[route][cls]++;
    pthread_mutex_unlock(&m->mu);
}

void metrics_tokens(metrics *m, int prompt_tokens, int completion_tokens) {
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += (uint64_t)(prompt_tokens > 0 ? prompt_tokens : 0);
    m->completion_tokens += (uint64_t)(completion_tokens > 0 ? completion_tokens : 0);
    pthread_mutex_unlock(&m->mu);
}

#define LOCKED(stmt)                                                                                      \
    do {                                                                                                  \
        pthread_mutex_lock(&m->mu);                                                                       \
        stmt;                                                                                             \
        pthread_mutex_unlock(&m->mu);                                                                     \
    } while (0)

void metrics_ttft(metrics *m, double s) { LOCKED(metrics_hist_add(&m->ttft, s)); }
void metrics_itl(metrics *m, double s) { LOCKED(metrics_hist_add(&m->itl, s)); }
void metrics_e2e(metrics *m, double s) { LOCKED(metrics_hist_add(&m->e2e, s)); }
void metrics_cancelled(metrics *m) { LOCKED(m->cancelled++); }
void metrics_busy(metrics *m) { LOCKED(m->rejected_busy++); }
void metrics_stream(metrics *m, int delta) { LOCKED(m->streams_active += delta); }

static void head(sbuf *o, const char *name, const char *type, const char *help) {
    sb_printf(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void hist(sbuf *o, const char *name, const char *help, const metrics_hist *h) {
    head(o, name, "histogram", help);
    uint64_t cum = 0;
    for (int b = 0; b < h->n_buckets; b++) {
        cum += h->count[b];
        sb_printf(o, "%s_bucket{le=\"%g\"} %llu\n", name, h->le[b], (unsigned long long)cum);
    }
    cum += h->count[h->n_buckets];
    sb_printf(o, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    sb_printf(o, "%s_sum %.9g\n%s_count %llu\n", name, h->sum, name, (unsigned long long)h->n);
}

void metrics_render(metrics *m, const cinfer_engine_stats *st, int loading, sbuf *o) {
    pthread_mutex_lock(&m->mu);
    static const char *const cls[4] = {"2xx", "3xx", "4xx", "5xx"};
    head(o, "cinfer_http_requests_total", "counter", "HTTP requests answered, by route and status class.");
    for (int r = 0; r < METRICS_ROUTES; r++)
        for (int c = 0; c < 4; c++)
            if (m->requests[r][c])
                sb_printf(o, "cinfer_http_requests_total{route=\"%s\",code=\"%s\"} %llu\n", metrics_route_names[r], cls[c],
                          (unsigned long long)m->requests[r][c]);
    head(o, "cinfer_prompt_tokens_total", "counter", "Prompt tokens of finished generation requests.");
    sb_printf(o, "cinfer_prompt_tokens_total %llu\n", (unsigned long long)m->prompt_tokens);
    head(o, "cinfer_generation_tokens_total", "counter", "Tokens generated for finished requests.");
    sb_printf(o, "cinfer_generation_tokens_total %llu\n", (unsigned long long)m->completion_tokens);
    head(o, "cinfer_requests_cancelled_total", "counter", "Generations cancelled because the client disconnected.");
    sb_printf(o, "cinfer_requests_cancelled_total %llu\n", (unsigned long long)m->cancelled);
    head(o, "cinfer_requests_rejected_busy_total", "counter", "Requests refused with 429 because the queue was full.");
    sb_printf(o, "cinfer_requests_rejected_busy_total %llu\n", (unsigned long long)m->rejected_busy);
    head(o, "cinfer_streams_active", "gauge", "Streaming responses open now.");
    sb_printf(o, "cinfer_streams_active %lld\n", (long long)m->streams_active);
    hist(o, "cinfer_time_to_first_token_seconds", "From request arrival to the first generated token.", &m->ttft);
    hist(o, "cinfer_inter_token_latency_seconds", "Between consecutive generated tokens of one request.", &m->itl);
    hist(o, "cinfer_request_duration_seconds", "From request arrival to the last token.", &m->e2e);
    pthread_mutex_unlock(&m->mu);

    head(o, "cinfer_model_loading", "gauge", "1 while the model is loading.");
    sb_printf(o, "cinfer_model_loading %d\n", loading ? 1 : 0);
    if (!st) return;
    head(o, "cinfer_requests_running", "gauge", "Sequences in the running batch.");
    sb_printf(o, "cinfer_requests_running %d\n", st->running);
    head(o, "cinfer_requests_waiting", "gauge", "Requests queued for a slot (queue depth).");
    sb_printf(o, "cinfer_requests_waiting %d\n", st->waiting);
    head(o, "cinfer_max_seqs", "gauge", "Sequences that can run at once.");
    sb_printf(o, "cinfer_max_seqs %d\n", st->max_seqs);
    head(o, "cinfer_queue_limit", "gauge", "Requests that may wait beyond the running ones.");
    sb_printf(o, "cinfer_queue_limit %d\n", st->queue_limit);
    head(o, "cinfer_kv_blocks_used", "gauge", "KV cache blocks in use.");
    sb_printf(o, "cinfer_kv_blocks_used %d\n", st->kv_blocks_used);
    head(o, "cinfer_kv_blocks_total", "gauge", "KV cache blocks in the pool.");
    sb_printf(o, "cinfer_kv_blocks_total %d\n", st->kv_blocks_total);
    head(o, "cinfer_kv_cache_usage_ratio", "gauge", "Fraction of KV blocks in use.");
    sb_printf(o, "cinfer_kv_cache_usage_ratio %.6f\n", st->kv_blocks_total ? (double)st->kv_blocks_used / st->kv_blocks_total : 0.0);
    head(o, "cinfer_state_slots_used", "gauge", "DeltaNet state slots in use.");
    sb_printf(o, "cinfer_state_slots_used %d\n", st->slots_used);
    head(o, "cinfer_state_slots_total", "gauge", "DeltaNet state slots in the pool.");
    sb_printf(o, "cinfer_state_slots_total %d\n", st->slots_total);
    head(o, "cinfer_engine_requests_total", "counter", "Requests the engine accepted.");
    sb_printf(o, "cinfer_engine_requests_total %lld\n", (long long)st->requests_total);
    head(o, "cinfer_engine_prompt_tokens_total", "counter", "Prompt tokens the engine accepted.");
    sb_printf(o, "cinfer_engine_prompt_tokens_total %lld\n", (long long)st->prompt_tokens_total);
    head(o, "cinfer_engine_generated_tokens_total", "counter", "Tokens the engine sampled.");
    sb_printf(o, "cinfer_engine_generated_tokens_total %lld\n", (long long)st->generated_tokens_total);
    head(o, "cinfer_engine_steps_total", "counter", "Scheduler steps (batched forward passes).");
    sb_printf(o, "cinfer_engine_steps_total %lld\n", (long long)st->steps_total);
    head(o, "cinfer_prefix_cache_lookups_total", "counter", "Prefix cache lookups at admission.");
    sb_printf(o, "cinfer_prefix_cache_lookups_total %lld\n", (long long)st->prefix_lookups);
    head(o, "cinfer_prefix_cache_hits_total", "counter", "Admissions that resumed from a cached prefix.");
    sb_printf(o, "cinfer_prefix_cache_hits_total %lld\n", (long long)st->prefix_hits);
    head(o, "cinfer_prefix_cache_misses_total", "counter", "Admissions that found no cached prefix.");
    sb_printf(o, "cinfer_prefix_cache_misses_total %lld\n", (long long)(st->prefix_lookups - st->prefix_hits));
    head(o, "cinfer_prefix_cache_tokens_total", "counter", "Prompt tokens served from the prefix cache.");
    sb_printf(o, "cinfer_prefix_cache_tokens_total %lld\n", (long long)st->prefix_tokens_served);
    head(o, "cinfer_prefix_cache_evictions_total", "counter", "State snapshots evicted.");
    sb_printf(o, "cinfer_prefix_cache_evictions_total %lld\n", (long long)st->prefix_evictions);
    head(o, "cinfer_prefix_cache_bytes", "gauge", "Bytes of DeltaNet state snapshots held.");
    sb_printf(o, "cinfer_prefix_cache_bytes %lld\n", (long long)st->prefix_bytes);
    head(o, "cinfer_prefix_cache_blocks", "gauge", "KV blocks the prefix cache references.");
    sb_printf(o, "cinfer_prefix_cache_blocks %d\n", st->prefix_blocks_cached);
    head(o, "cinfer_spec_draft_tokens_total", "counter", "Speculative draft tokens proposed.");
    sb_printf(o, "cinfer_spec_draft_tokens_total %lld\n", (long long)st->spec_drafted);
    head(o, "cinfer_spec_accepted_tokens_total", "counter", "Speculative draft tokens accepted.");
    sb_printf(o, "cinfer_spec_accepted_tokens_total %lld\n", (long long)st->spec_accepted);
    head(o, "cinfer_device_chosen_tokens_total", "counter",
         "Generated tokens the GPU's sampler chose (only their ids came back to the host).");
    sb_printf(o, "cinfer_device_chosen_tokens_total %lld\n", (long long)st->device_chosen_tokens);
}

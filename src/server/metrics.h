/* metrics.h — the server's Prometheus metrics: HTTP request counts by route and status, token counts,
 * TTFT and inter-token latency histograms measured in the HTTP layer (what a client sees), plus the
 * engine's gauges (queue depth, running sequences, KV blocks, state slots) read at scrape time. */
#ifndef CI_SRV_METRICS_H
#define CI_SRV_METRICS_H

#include <pthread.h>
#include <stdint.h>

#include "cinfer.h"
#include "server/sbuf.h"

#define METRICS_MAX_BUCKETS 16
#define METRICS_ROUTES 12

typedef struct metrics_hist {
    int n_buckets;
    double le[METRICS_MAX_BUCKETS];           /* upper bounds, seconds, ascending */
    uint64_t count[METRICS_MAX_BUCKETS + 1];  /* per bucket (not cumulative); the last is +Inf */
    uint64_t n;
    double sum;
} metrics_hist;

typedef struct metrics {
    pthread_mutex_t mu;
    /* [route][status class 2xx..5xx, as status/100 - 2] */
    uint64_t requests[METRICS_ROUTES][4];
    uint64_t prompt_tokens, completion_tokens;
    uint64_t cancelled;     /* generations stopped because the client went away */
    uint64_t rejected_busy; /* 429s from a full queue */
    int64_t streams_active; /* streaming responses open now */
    metrics_hist ttft, itl, e2e;
} metrics;

/* Route names used as the route label (index = the srv_route value in http.c). */
extern const char *const metrics_route_names[METRICS_ROUTES];

void metrics_init(metrics *m);
void metrics_destroy(metrics *m);
void metrics_request(metrics *m, int route, int status);
void metrics_tokens(metrics *m, int prompt_tokens, int completion_tokens);
void metrics_ttft(metrics *m, double seconds);
void metrics_itl(metrics *m, double seconds);
void metrics_e2e(metrics *m, double seconds);
void metrics_cancelled(metrics *m);
void metrics_busy(metrics *m);
void metrics_stream(metrics *m, int delta);

void metrics_hist_init(metrics_hist *h, const double *le, int n);
void metrics_hist_add(metrics_hist *h, double v);

/* The exposition text (Prometheus 0.0.4). stats may be NULL while the model loads. */
void metrics_render(metrics *m, const cinfer_engine_stats *stats, int loading, sbuf *out);

#endif

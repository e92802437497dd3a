/* server.h — `cinfer serve`: the HTTP server (libmicrohttpd, one thread per connection) in front of one
 * cinfer engine. HTTP threads parse, validate, render the chat template, tokenize and submit; the
 * engine's scheduler thread owns the model state (DESIGN §3). */
#ifndef CI_SRV_SERVER_H
#define CI_SRV_SERVER_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "server/api.h"

typedef struct srv_config {
    const char *host;            /* address to bind ("127.0.0.1", "0.0.0.0", "::", a name) */
    int port;                    /* 0: any free port (the URL printed says which) */
    const char *model_dir;
    const char *model_name;      /* the id /v1/models reports; NULL: the directory's last component */
    const char *api_key;         /* NULL: no authentication */
    const char *allowed_origins; /* CORS: "*" or a comma list of origins; NULL: no CORS headers */
    int log_json;                /* access log lines as JSON (else text) */
    /* engine */
    int ctx_size, max_seqs, queue_limit, n_threads; /* 0: the engine's defaults */
    int64_t kv_memory;           /* 0: the engine's default */
    int64_t prefix_cache_memory; /* prefix cache snapshot budget (0: off) */
    int no_generation_config;    /* --generation-config none: the model's sampling defaults are not applied */
    int step_tokens;             /* tokens per engine step (0: the engine's default) */
    int spec;                    /* cinfer_spec_mode: speculative decoding (0: off) */
    int spec_max_draft;          /* drafts per step at most (0: the engine's default) */
    int spec_mtp_vocab;          /* --spec mtp: draft among token ids [0, N) (0: all) */
    const char *draft_model_dir; /* --spec draft: the draft model's directory */
    srv_defaults defaults;       /* per-request defaults (max_tokens, temperature, ...) */
    /* limits */
    size_t max_body;             /* request body bytes (413 past it) */
    int max_connections;
    int timeout_s;               /* idle / slow-client connection timeout */
} srv_config;

void srv_config_init(srv_config *c);

/* Starts listening (the printed URL comes first, so clients can wait on /health), loads the model
 * (503 meanwhile), serves until *stop becomes non-zero, then shuts down. Returns 0, or a negative code
 * with err filled when the server could not start or the model could not load. */
int srv_run(const srv_config *c, volatile sig_atomic_t *stop, char *err, size_t errlen);

#endif

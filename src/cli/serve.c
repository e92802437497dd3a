/* serve.c — `cinfer serve`: flags into an srv_config, signals into a stop flag, and the server's exit
 * status. The server itself is src/server/. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cinfer.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "server/server.h"

static volatile sig_atomic_t g_stop;

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: cinfer serve [options]\n"
            "  -m, --model DIR            model directory (default models/default)\n"
            "  --host ADDR                address to bind (default 127.0.0.1)\n"
            "  --port N                   port (default 8080; 0 picks a free one)\n"
            "  --api-key KEY              require Authorization: Bearer KEY or x-api-key: KEY\n"
            "  --ctx-size N               tokens per sequence, prompt + output\n"
            "  --max-seqs N               sequences decoded at once\n"
            "  --queue-limit N            requests waiting beyond the running ones (then 429)\n"
            "  --kv-memory BYTES          KV pool size (suffix K, M or G)\n"
            "  --threads N                CPU threads (0: all)\n"
            "  --max-tokens N             output tokens when a request names none (default: up to the context)\n"
            "  --temp T, --top-p P, --top-k K, --min-p P, --repeat-penalty R\n"
            "                             sampling defaults for requests that name none (else the model's\n"
            "                             generation_config.json, else the API's neutral values)\n"
            "  --generation-config auto|none  apply the model's generation_config.json sampling defaults (auto, the\n"
            "                             default) or not (none)\n"
            "  --chat-template-args JSON  extra chat template variables, e.g. '{\"enable_thinking\":false}'\n"
            "  --allowed-origins LIST     CORS: '*' or comma-separated origins\n"
            "  --log-format json|text     access log format on stderr (default text)\n"
            "  --max-body BYTES           request body limit (default 8M)\n"
            "  --timeout S                idle connection timeout in seconds (default 60)\n"
            "  --max-connections N        open connections (default 512)\n"
            "  --step-tokens N            tokens per scheduler step, decode + prefill (default 512; smaller bounds\n"
            "                             the inter-token latency of running streams while prompts prefill)\n"
            "  --prefix-cache-memory BYTES  prefix cache for DeltaNet state snapshots (suffix K, M, G; 0: off)\n"
            "  --spec none|ngram|mtp|draft  speculative decoding, exact (n-gram drafts from the prompt and output,\n"
            "                             the checkpoint's MTP head, or a draft model: --draft-model DIR, same vocabulary)\n"
            "  --spec-draft N             drafts per step at most (default 4; 3 with mtp)\n"
            "  --spec-mtp-vocab N         mtp: draft among token ids [0, N) only (a cheaper head step on a large\n"
            "                             vocabulary; output unchanged; default 0: all ids)\n"
            "  --max-images N             images per request (default 16; models with a vision tower)\n"
            "  --max-image-pixels N       decoded width x height of one image (default 33554432)\n"
            "  --device cpu|cuda|auto     where the model runs (default cpu)\n"
            "  --precision exact|fast     the GPU's numerics (default exact; fast: activations rounded to bf16 once\n"
            "                             before the tensor cores, a faster prefill; the CPU runs exact either way)\n");
}

static int parse_size(const char *s, const char *what, long long *out) {
    char *end;
    double v = s ? strtod(s, &end) : -1;
    if (!s || end == s || v < 0) goto bad;
    double mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1024.0, end++;
    else if (*end == 'M' || *end == 'm') mul = 1024.0 * 1024, end++;
    else if (*end == 'G' || *end == 'g') mul = 1024.0 * 1024 * 1024, end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end || v * mul > 9e18) goto bad;
    *out = (long long)(v * mul);
    return 0;
bad:
    fprintf(stderr, "cinfer serve: %s must be a size like 512M or 2G, got '%s'\n", what, s ? s : "");
    return -1;
}

int cli_serve(int argc, char **argv) {
    static const char *const vf[] = {"-m", "--model", "--host", "--port", "--api-key", "--ctx-size", "--max-seqs", "--queue-limit",
                                     "--kv-memory", "--threads", "--max-tokens", "--temp", "--top-p", "--top-k", "--min-p", "--repeat-penalty", "--generation-config",
                                     "--chat-template-args", "--allowed-origins", "--log-format", "--max-body", "--timeout",
                                     "--max-connections", "--alias", "--spec", "--spec-draft", "--spec-mtp-vocab", "--prefix-cache-memory", "--draft-model", "--step-tokens",
                                     "--max-images", "--max-image-pixels", NULL};
    static const char *const bf[] = {"--help", "-h", NULL};
    if (arg_flag(argc, argv, "--help") || arg_flag(argc, argv, "-h")) {
        usage(stdout);
        return 0;
    }
    if (arg_check(argc, argv, vf, bf, "serve")) return 2;
    srv_config c;
    srv_config_init(&c);
    const char *v;
    long n;
    double x;
    if ((v = arg_value(argc, argv, "-m", "--model"))) c.model_dir = v;
    if ((v = arg_value(argc, argv, "--host", NULL))) c.host = v;
    if ((v = arg_value(argc, argv, "--alias", NULL))) c.model_name = v;
    if ((v = arg_value(argc, argv, "--port", NULL))) {
        if (parse_int(v, "--port", 0, 65535, &n)) return 2;
        c.port = (int)n;
    }
    c.api_key = arg_value(argc, argv, "--api-key", NULL);
    if (!c.api_key) c.api_key = getenv("CINFER_API_KEY");
    static const struct {
        const char *flag;
        long lo, hi;
        int *dst;
    } ints[] = {
        {"--ctx-size", 16, 1 << 24, NULL}, {"--max-seqs", 1, 4096, NULL}, {"--queue-limit", 0, 1 << 20, NULL},
        {"--threads", 0, 4096, NULL},      {"--max-tokens", 0, 1 << 24, NULL}, {"--top-k", 0, 1 << 20, NULL},
        {"--timeout", 1, 86400, NULL},     {"--max-connections", 4, 65536, NULL},
    };
    int *dsts[] = {&c.ctx_size, &c.max_seqs, &c.queue_limit, &c.n_threads, &c.defaults.max_tokens, &c.defaults.top_k, &c.timeout_s,
                   &c.max_connections};
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
        if (!(v = arg_value(argc, argv, ints[i].flag, NULL))) continue;
        if (parse_int(v, ints[i].flag, ints[i].lo, ints[i].hi, &n)) return 2;
        *dsts[i] = (int)n;
    }
    static const struct {
        const char *flag;
        double lo, hi;
    } floats[] = {{"--temp", 0, 100}, {"--top-p", 1e-9, 1}, {"--min-p", 0, 1}, {"--repeat-penalty", 1e-6, 10}};
    float *fd[] = {&c.defaults.temperature, &c.defaults.top_p, &c.defaults.min_p, &c.defaults.repetition_penalty};
    for (size_t i = 0; i < sizeof floats / sizeof *floats; i++) {
        if (!(v = arg_value(argc, argv, floats[i].flag, NULL))) continue;
        if (parse_float(v, floats[i].flag, &x)) return 2;
        if (x < floats[i].lo || x > floats[i].hi) {
            fprintf(stderr, "cinfer serve: %s must be in [%g, %g], got %s\n", floats[i].flag, floats[i].lo, floats[i].hi, v);
            return 2;
        }
        *fd[i] = (float)x;
    }
    if ((v = arg_value(argc, argv, "--generation-config", NULL))) {
        if (strcmp(v, "auto") && strcmp(v, "none")) {
            fprintf(stderr, "cinfer serve: --generation-config must be auto or none, got '%s'\n", v);
            return 2;
        }
        c.no_generation_config = !strcmp(v, "none");
    }
    long long sz;
    if ((v = arg_value(argc, argv, "--kv-memory", NULL))) {
        if (parse_size(v, "--kv-memory", &sz)) return 2;
        c.kv_memory = sz;
    }
    if ((v = arg_value(argc, argv, "--step-tokens", NULL))) {
        if (parse_int(v, "--step-tokens", 16, 1 << 20, &n)) return 2;
        c.step_tokens = (int)n;
    }
    if ((v = arg_value(argc, argv, "--prefix-cache-memory", NULL))) {
        if (parse_size(v, "--prefix-cache-memory", &sz)) return 2;
        c.prefix_cache_memory = sz;
    }
    if ((v = arg_value(argc, argv, "--max-images", NULL))) {
        if (parse_int(v, "--max-images", 1, 256, &n)) return 2;
        c.defaults.max_images = (int)n;
    }
    if ((v = arg_value(argc, argv, "--max-image-pixels", NULL))) {
        if (parse_int(v, "--max-image-pixels", 1, 1LL << 31, &n)) return 2;
        c.defaults.max_image_pixels = n;
    }
    if ((v = arg_value(argc, argv, "--max-body", NULL))) {
        if (parse_size(v, "--max-body", &sz) || sz < 1024) {
            fprintf(stderr, "cinfer serve: --max-body must be at least 1K\n");
            return 2;
        }
        c.max_body = (size_t)sz;
    }
    if ((v = arg_value(argc, argv, "--spec", NULL))) {
        if (!strcmp(v, "ngram")) c.spec = CINFER_SPEC_NGRAM;
        else if (!strcmp(v, "draft")) c.spec = CINFER_SPEC_DRAFT;
        else if (!strcmp(v, "none")) c.spec = CINFER_SPEC_NONE;
        else if (!strcmp(v, "mtp")) c.spec = CINFER_SPEC_MTP;
        else {
            fprintf(stderr, "cinfer serve: --spec must be none, ngram, mtp or draft\n");
            return 2;
        }
    }
    c.draft_model_dir = arg_value(argc, argv, "--draft-model", NULL);
    if (c.spec == CINFER_SPEC_DRAFT && !c.draft_model_dir) {
        fprintf(stderr, "cinfer serve: --spec draft needs --draft-model DIR\n");
        return 2;
    }
    if ((v = arg_value(argc, argv, "--spec-draft", NULL))) {
        if (parse_int(v, "--spec-draft", 1, 16, &n)) return 2;
        c.spec_max_draft = (int)n;
    } else if (c.spec == CINFER_SPEC_MTP) {
        c.spec_max_draft = 3; /* chained MTP drafts lose accuracy fast: 1..3 (adapted) */
    }
    if ((v = arg_value(argc, argv, "--spec-mtp-vocab", NULL))) {
        if (parse_int(v, "--spec-mtp-vocab", 0, 1 << 30, &n)) return 2;
        c.spec_mtp_vocab = (int)n;
    }
    json_t *targs = NULL;
    if ((v = arg_value(argc, argv, "--chat-template-args", NULL))) {
        json_error_t je;
        targs = json_loads(v, 0, &je);
        if (!json_is_object(targs)) {
            fprintf(stderr, "cinfer serve: --chat-template-args must be a JSON object: %s\n", targs ? "not an object" : je.text);
            json_decref(targs);
            return 2;
        }
        c.defaults.chat_template_args = targs;
    }
    c.allowed_origins = arg_value(argc, argv, "--allowed-origins", NULL);
    if ((v = arg_value(argc, argv, "--log-format", NULL))) {
        if (strcmp(v, "json") && strcmp(v, "text")) {
            fprintf(stderr, "cinfer serve: --log-format must be json or text\n");
            json_decref(targs);
            return 2;
        }
        c.log_json = !strcmp(v, "json");
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN); /* a client that vanished mid-write must not kill the server */

    char err[1024];
    int rc = srv_run(&c, &g_stop, err, sizeof err);
    json_decref(targs);
    if (rc < 0) {
        fprintf(stderr, "cinfer serve: %s\n", err);
        return 1;
    }
    return 0;
}

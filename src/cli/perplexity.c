/* perplexity.c — `cinfer perplexity -m DIR --file F [--ctx N] [--threads N] [--max-tokens N] [--json]`:
 * the model's perplexity on a text file, windowed exactly as tools/train/export_eval.py does for the
 * transformers figure it is compared with:
 *   - the whole file is tokenized as one text without special tokens (added tokens written in the text
 *     are still recognised, as tokenizers does); --max-tokens keeps only the first N ids;
 *   - the ids are cut into consecutive non-overlapping windows of --ctx tokens (default 512; the last one
 *     shorter, a window of one token dropped), each a fresh sequence starting at position 0;
 *   - in each window the tokens at positions 1..n-1 are scored with -log softmax(logits[j-1])[x_j]
 *     (the first token of a window is context only);
 *   - perplexity = exp(sum of NLL / tokens scored), the sum in double.
 * Prints tokens scored, mean NLL and perplexity (one JSON object with --json). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cinfer.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "util/file.h"

#define PPL_MAX_FILE ((size_t)1 << 30)
#define PPL_CHUNK    512 /* tokens per forward call: bounds the logits buffer at PPL_CHUNK x vocab floats */

typedef struct {
    int64_t tokens;  /* ids considered (after --max-tokens) */
    int64_t scored;  /* tokens whose NLL was summed */
    int64_t windows; /* windows of >= 2 tokens */
    double nll_sum;
    int device, precision; /* what the context ran (cinfer_ctx_device / cinfer_ctx_precision) */
} ppl_result;

/* -log softmax(row)[target] in double. */
static double row_nll(const float *row, int V, int target) {
    float mx = row[0];
    for (int i = 1; i < V; i++)
        if (row[i] > mx) mx = row[i];
    double s = 0;
    for (int i = 0; i < V; i++) s += exp((double)row[i] - mx);
    return (double)mx + log(s) - row[target];
}

static int score_windows(cinfer_model *m, const int32_t *ids, int64_t n, int ctx, int n_threads,
                         ppl_result *r, char *err, size_t errlen) {
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    const int V = info.vocab_size;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V) {
            snprintf(err, errlen, "token id %d at %lld is outside the vocabulary (%d)", ids[i], (long long)i,
                     V);
            return CINFER_EINVAL;
        }
    cinfer_ctx_params p = cinfer_ctx_default_params();
    p.max_seqs = 1;
    p.max_ctx = ctx;
    p.max_batch = ctx < PPL_CHUNK ? ctx : PPL_CHUNK;
    p.n_threads = n_threads;
    cinfer_ctx *c = NULL;
    int rc = cinfer_ctx_create(m, &p, &c, err, errlen);
    if (rc) return rc;
    float *logits = malloc((size_t)p.max_batch * V * sizeof(float));
    if (!logits) {
        cinfer_ctx_destroy(c);
        snprintf(err, errlen, "out of memory for %d x %d logits", p.max_batch, V);
        return CINFER_ENOMEM;
    }
    memset(r, 0, sizeof *r);
    r->tokens = n;
    r->device = cinfer_ctx_device(c);
    r->precision = cinfer_ctx_precision(c);
    for (int64_t w0 = 0; w0 < n && !rc; w0 += ctx) {
        int wl = n - w0 < ctx ? (int)(n - w0) : ctx;
        if (wl < 2) break; /* only the last window can be this short: nothing to score */
        const int32_t *w = ids + w0;
        int seq = cinfer_seq_open(c, err, errlen);
        if (seq < 0) {
            rc = seq;
            break;
        }
        for (int off = 0; off < wl && !rc; off += p.max_batch) {
            int cnt = wl - off < p.max_batch ? wl - off : p.max_batch;
            cinfer_batch_entry e = {.seq = seq, .tokens = w + off, .n_tokens = cnt, .all_logits = 1};
            if ((rc = cinfer_forward(c, &e, 1, logits, err, errlen))) break;
            for (int t = 0; t < cnt; t++) {
                int j = off + t; /* row j predicts w[j + 1] */
                if (j + 1 >= wl) break;
                r->nll_sum += row_nll(logits + (size_t)t * V, V, w[j + 1]);
                r->scored++;
            }
        }
        cinfer_seq_close(c, seq);
        r->windows++;
    }
    free(logits);
    cinfer_ctx_destroy(c);
    if (!rc && r->scored == 0) {
        snprintf(err, errlen, "nothing to score: the text has %lld token(s); at least 2 are needed",
                 (long long)n);
        rc = CINFER_EINVAL;
    }
    return rc;
}

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: cinfer perplexity -m DIR --file F [--ctx N] [--threads N] [--max-tokens N] [--json]\n"
        "  perplexity of the model on the text of F: tokenized without special tokens, cut into\n"
        "  non-overlapping windows of N tokens (default 512), the first token of each window not scored\n");
}

int cli_perplexity(int argc, char **argv) {
    static const char *const vf[] = {"-m", "--model", "--file", "--ctx", "--threads", "--max-tokens", NULL};
    static const char *const bf[] = {"--help", "-h", "--json", NULL};
    if (arg_flag(argc, argv, "--help") || arg_flag(argc, argv, "-h")) {
        usage(stdout);
        return 0;
    }
    if (arg_check(argc, argv, vf, bf, "perplexity")) return 2;
    const char *dir = arg_value(argc, argv, "-m", "--model"), *path = arg_value(argc, argv, "--file", NULL);
    const char *sctx = arg_value(argc, argv, "--ctx", NULL), *thr = arg_value(argc, argv, "--threads", NULL);
    const char *smax = arg_value(argc, argv, "--max-tokens", NULL);
    int as_json = arg_flag(argc, argv, "--json");
    if (!dir || !path) {
        fprintf(stderr, "cinfer perplexity: -m DIR and --file F are required\n");
        usage(stderr);
        return 2;
    }
    long ctx = 512, nthreads = 0, max_tokens = 0;
    if (sctx && parse_int(sctx, "--ctx", 2, 1 << 20, &ctx)) return 2;
    if (thr && parse_int(thr, "--threads", 0, 1024, &nthreads)) return 2;
    if (smax && parse_int(smax, "--max-tokens", 2, 1L << 40, &max_tokens)) return 2;

    char err[1024];
    char *text = NULL;
    size_t len = 0;
    int32_t *ids = NULL;
    int n = 0, rc = 1;
    cinfer_model *m = NULL;
    if (file_read_all(path, PPL_MAX_FILE, &text, &len, err, sizeof err)) {
        fprintf(stderr, "cinfer perplexity: %s\n", err);
        goto done;
    }
    if (cinfer_model_open(dir, &m, err, sizeof err)) {
        fprintf(stderr, "cinfer perplexity: %s\n", err);
        goto done;
    }
    if (!cinfer_model_has_tokenizer(m)) {
        fprintf(stderr, "cinfer perplexity: %s has no tokenizer.json\n", dir);
        goto done;
    }
    if (cinfer_tokenize(m, text, len, 0, &ids, &n, err, sizeof err)) {
        fprintf(stderr, "cinfer perplexity: %s: %s\n", path, err);
        goto done;
    }
    int64_t use = max_tokens && max_tokens < n ? max_tokens : n;
    ppl_result r;
    if (score_windows(m, ids, use, (int)ctx, (int)nthreads, &r, err, sizeof err)) {
        fprintf(stderr, "cinfer perplexity: %s\n", err);
        goto done;
    }
    double mean = r.nll_sum / (double)r.scored, ppl = exp(mean);
    if (as_json) {
        json_t *o =
            json_pack("{s:s, s:I, s:I, s:I, s:I, s:i, s:f, s:f, s:s, s:s}", "file", path, "bytes", (json_int_t)len,
                      "tokens", (json_int_t)r.tokens, "windows", (json_int_t)r.windows, "tokens_scored",
                      (json_int_t)r.scored, "ctx", (int)ctx, "mean_nll", mean, "perplexity", ppl, "device",
                      r.device == CINFER_DEVICE_CUDA ? "cuda" : "cpu", "precision", cinfer_precision_name(r.precision));
        char *s = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(17)) : NULL;
        if (!s) {
            json_decref(o);
            fprintf(stderr, "cinfer perplexity: out of memory\n");
            goto done;
        }
        printf("%s\n", s);
        free(s);
        json_decref(o);
    } else {
        printf("file: %s (%zu bytes, %lld tokens)\n", path, len, (long long)r.tokens);
        printf("windows: %lld of up to %ld tokens (first token of each not scored)\n", (long long)r.windows,
               ctx);
        printf("tokens scored: %lld\n", (long long)r.scored);
        printf("mean NLL: %.6f\n", mean);
        printf("perplexity: %.4f\n", ppl);
        printf("device: %s, precision %s\n", r.device == CINFER_DEVICE_CUDA ? "cuda" : "cpu", cinfer_precision_name(r.precision));
    }
    rc = 0;
done:
    free(ids);
    free(text);
    cinfer_model_close(m);
    return rc;
}

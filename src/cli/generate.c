/* generate.c — `cinfer generate -m DIR (--tokens LIST | --prompt TEXT) -n N [--temp T] [--seed S] [--ids]`:
 * prefill the prompt, then decode N tokens one at a time (greedy unless --temp > 0). Stops after an EOS id
 * as transformers' generate() does (the EOS id is part of the output). --ids prints the generated ids
 * comma-separated on one line; --prompt (the model's tokenizer) prints the text as it is generated;
 * otherwise one id per line. Timing goes to stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cinfer.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "cli/images.h"
#include "sample/sample.h"

#define GEN_CHUNK 256

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Prints the part of the decoded output not printed yet, holding back an incomplete UTF-8 character
 * (decoding the whole output each time is cheap at CLI lengths and always matches the full decode). */
static void print_new_text(cinfer_model *m, const int32_t *ids, int n, size_t *printed) {
    char *s = NULL, err[256];
    if (cinfer_detokenize(m, ids, n, 1, &s, err, sizeof err)) return;
    size_t len = strlen(s);
    /* a trailing U+FFFD (EF BF BD) is an unfinished character: wait for its next byte */
    if (len >= 3 && !memcmp(s + len - 3, "\xEF\xBF\xBD", 3)) len -= 3;
    if (len > *printed) {
        fwrite(s + *printed, 1, len - *printed, stdout);
        fflush(stdout);
        *printed = len;
    }
    free(s);
}

/* The engine path (for --spec): one request, its tokens read from LOGPROB events. Greedy or seeded, the
 * tokens equal the plain path's. */
static int generate_engine(cinfer_model *m, const int32_t *prompt, int np, int n_gen, float temp, uint64_t seed,
                           int ignore_eos, int nthreads, int spec, int spec_draft, int mtp_vocab, const char *draft_dir, int32_t *out,
                           int *n_out, int show_text, cinfer_image ***ims, int n_ims) {
    char err[1024];
    cinfer_model *dm = NULL;
    if (spec == CINFER_SPEC_DRAFT) {
        if (!draft_dir) {
            fprintf(stderr, "cinfer generate: --spec draft needs --draft-model DIR\n");
            return 2;
        }
        if (cinfer_model_open(draft_dir, &dm, err, sizeof err)) {
            fprintf(stderr, "cinfer generate: draft model: %s\n", err);
            return 1;
        }
    }
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.max_seqs = 1;
    ep.ctx_size = np + n_gen + 1;
    ep.n_threads = nthreads;
    ep.spec = (cinfer_spec_mode)spec;
    ep.spec_max_draft = spec_draft;
    ep.spec_mtp_vocab = mtp_vocab;
    ep.draft_model = dm;
    cinfer_engine *e;
    if (cinfer_engine_create(m, &ep, &e, err, sizeof err)) {
        fprintf(stderr, "cinfer generate: %s\n", err);
        cinfer_model_close(dm);
        return 1;
    }
    cinfer_request_params rp;
    memset(&rp, 0, sizeof rp);
    rp.prompt = prompt;
    rp.n_prompt = np;
    rp.max_tokens = n_gen;
    rp.sampling = cinfer_sampling_default();
    rp.sampling.temperature = temp;
    rp.sampling.has_seed = 1;
    rp.sampling.seed = seed;
    rp.sampling.n_logprobs = 0;
    rp.ignore_eos = ignore_eos;
    rp.skip_special_tokens = 1;
    rp.images = *ims;
    rp.n_images = n_ims;
    cinfer_request *r;
    double t0 = now_s();
    if (cinfer_engine_submit(e, &rp, &r, err, sizeof err)) {
        fprintf(stderr, "cinfer generate: %s\n", err);
        cinfer_engine_destroy(e);
        cinfer_model_close(dm);
        return 1;
    }
    if (n_ims) { /* the engine owns the images now */
        free(*ims);
        *ims = NULL;
    }
    cinfer_event ev;
    *n_out = 0;
    while (cinfer_request_next(r, &ev, -1) == 1) {
        if (ev.type == CINFER_EV_LOGPROB && *n_out < n_gen) out[(*n_out)++] = ev.token;
        if (show_text && (ev.type == CINFER_EV_CONTENT || ev.type == CINFER_EV_REASONING)) {
            fwrite(ev.text, 1, ev.len, stdout);
            fflush(stdout);
        }
    }
    double t = now_s() - t0;
    cinfer_request_free(r);
    cinfer_engine_stats st;
    cinfer_engine_get_stats(e, &st);
    fprintf(stderr, "cinfer generate: %d tokens in %.3f s (prompt included), %lld steps; speculation: %lld drafted, %lld accepted\n",
            *n_out, t, (long long)st.steps_total, (long long)st.spec_drafted, (long long)st.spec_accepted);
    cinfer_engine_destroy(e);
    cinfer_model_close(dm);
    return 0;
}

int cli_generate(int argc, char **argv) {
    static const char *const vf[] = {"-m", "--model", "--tokens", "--prompt", "-n", "--temp", "--seed", "--threads", "--spec",
                                     "--spec-draft", "--draft-model", "--image", "--spec-mtp-vocab", NULL};
    static const char *const bf[] = {"--ids", "--ignore-eos", "--help", "-h", NULL};
    if (arg_flag(argc, argv, "--help") || arg_flag(argc, argv, "-h")) {
        printf("usage: cinfer generate -m DIR (--tokens LIST | --prompt TEXT) -n N [--temp T] [--seed S] [--ids] [--ignore-eos] "
               "[--threads N] [--spec none|ngram|mtp|draft] [--spec-draft N] [--draft-model DIR] [--spec-mtp-vocab N] [--image FILE ...]\n"
               "  --image (repeatable; models with a vision tower): with --tokens, LIST holds one <|image_pad|> id per\n"
               "  image (after <|vision_start|>), expanded in place; with --prompt, TEXT is sent as one chat user message\n"
               "  after the images (or used as is when it already holds <|image_pad|> placeholders)\n"
               "  --spec runs through the engine with speculation (n-gram lookup, the checkpoint's MTP head, or a\n"
               "  draft model): the same tokens, fewer steps; --spec-draft defaults to 4 (3 with mtp)\n");
        return 0;
    }
    if (arg_check(argc, argv, vf, bf, "generate")) return 2;
    const char *dir = arg_value(argc, argv, "-m", "--model"), *toks = arg_value(argc, argv, "--tokens", NULL);
    const char *text = arg_value(argc, argv, "--prompt", NULL);
    if (!dir || !!toks == !!text) {
        fprintf(stderr, "cinfer generate: -m DIR and one of --tokens LIST or --prompt TEXT are required\n");
        return 2;
    }
    long n_gen = 16, seed = 0, nthreads = 0;
    double temp = 0.0;
    const char *v;
    if ((v = arg_value(argc, argv, "-n", NULL)) && parse_int(v, "-n", 0, 1 << 24, &n_gen)) return 2;
    if ((v = arg_value(argc, argv, "--seed", NULL)) && parse_int(v, "--seed", 0, 0x7fffffffffffffffL, &seed)) return 2;
    if ((v = arg_value(argc, argv, "--threads", NULL)) && parse_int(v, "--threads", 0, 1024, &nthreads)) return 2;
    if ((v = arg_value(argc, argv, "--temp", NULL)) && parse_float(v, "--temp", &temp)) return 2;
    if (temp < 0) {
        fprintf(stderr, "cinfer generate: --temp must be >= 0\n");
        return 2;
    }
    int print_ids = arg_flag(argc, argv, "--ids"), ignore_eos = arg_flag(argc, argv, "--ignore-eos");
    long spec_draft = 4;
    int spec = 0;
    if ((v = arg_value(argc, argv, "--spec", NULL))) {
        if (!strcmp(v, "ngram")) spec = CINFER_SPEC_NGRAM;
        else if (!strcmp(v, "draft")) spec = CINFER_SPEC_DRAFT;
        else if (!strcmp(v, "mtp")) spec = CINFER_SPEC_MTP, spec_draft = 3;
        else if (strcmp(v, "none")) {
            fprintf(stderr, "cinfer generate: --spec %s is not available (none, ngram, mtp, draft)\n", v);
            return 2;
        }
    }
    if ((v = arg_value(argc, argv, "--spec-draft", NULL)) && parse_int(v, "--spec-draft", 1, 16, &spec_draft)) return 2;
    long mtp_vocab = 0;
    if ((v = arg_value(argc, argv, "--spec-mtp-vocab", NULL)) && parse_int(v, "--spec-mtp-vocab", 0, 1 << 30, &mtp_vocab))
        return 2;
    int32_t *prompt = NULL;
    int np = 0;
    if (toks && parse_ids(toks, &prompt, &np)) return 2;
    char err[1024];
    cinfer_model *m = NULL;
    cinfer_ctx *c = NULL;
    float *logits = NULL, *work = NULL;
    int32_t *out = NULL;
    int rc = 1, n_out = 0, n_ims = 0;
    cinfer_image **ims = NULL;
    if (cinfer_model_open(dir, &m, err, sizeof err)) {
        fprintf(stderr, "cinfer generate: %s\n", err);
        goto done;
    }
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    if (cli_images_load(m, argc, argv, "generate", &ims, &n_ims)) goto done;
    if (n_ims) {
        if (text ? cli_images_prompt_text(m, text, ims, n_ims, "generate", &prompt, &np)
                 : cli_images_expand(m, &prompt, &np, ims, n_ims, "generate"))
            goto done;
    } else if (text && cinfer_tokenize(m, text, strlen(text), 0, &prompt, &np, err, sizeof err)) {
        fprintf(stderr, "cinfer generate: %s\n", err);
        goto done;
    }
    if (np < 1) {
        fprintf(stderr, "cinfer generate: the prompt is empty\n");
        goto done;
    }
    cinfer_ctx_params p = cinfer_ctx_default_params();
    p.max_seqs = 1;
    p.max_ctx = np + (int)n_gen;
    p.max_batch = np < GEN_CHUNK ? np : GEN_CHUNK;
    p.n_threads = (int)nthreads;
    if (cinfer_ctx_create(m, &p, &c, err, sizeof err)) {
        fprintf(stderr, "cinfer generate: %s\n", err);
        goto done;
    }
    int seq = cinfer_seq_open(c, err, sizeof err);
    if (seq < 0) {
        fprintf(stderr, "cinfer generate: %s\n", err);
        goto done;
    }
    size_t V = (size_t)info.vocab_size;
    logits = malloc(V * sizeof(float));
    work = malloc(V * sizeof(float));
    out = malloc(((size_t)n_gen + 1) * sizeof(int32_t));
    if (!logits || !work || !out) {
        fprintf(stderr, "cinfer generate: out of memory\n");
        goto done;
    }
    if (spec) {
        rc = generate_engine(m, prompt, np, (int)n_gen, (float)temp, (uint64_t)seed, ignore_eos, (int)nthreads, spec,
                             (int)spec_draft, (int)mtp_vocab, arg_value(argc, argv, "--draft-model", NULL), out, &n_out, text && !print_ids,
                             &ims, n_ims);
        if (rc) goto done;
        goto print;
    }
    if (n_ims && cinfer_seq_set_images(c, seq, prompt, np, ims, n_ims, NULL, err, sizeof err)) {
        fprintf(stderr, "cinfer generate: %s\n", err);
        goto done;
    }
    rng r;
    rng_seed(&r, (uint64_t)seed);
    double t0 = now_s();
    for (int off = 0; off < np; off += p.max_batch) {
        int cnt = np - off < p.max_batch ? np - off : p.max_batch;
        cinfer_batch_entry e = {seq, prompt + off, cnt, 0};
        if (cinfer_forward(c, &e, 1, logits, err, sizeof err)) {
            fprintf(stderr, "cinfer generate: %s\n", err);
            goto done;
        }
    }
    double t1 = now_s();
    size_t printed = 0;
    for (long i = 0; i < n_gen; i++) {
        int32_t tok = sample_temperature(logits, (int)V, (float)temp, &r, work);
        out[n_out++] = tok;
        if (text && !print_ids) print_new_text(m, out, n_out, &printed);
        int is_eos = 0;
        for (int k = 0; k < info.n_eos; k++) is_eos |= tok == info.eos_ids[k];
        if ((is_eos && !ignore_eos) || i + 1 == n_gen) break;
        cinfer_batch_entry e = {seq, &tok, 1, 0};
        if (cinfer_forward(c, &e, 1, logits, err, sizeof err)) {
            fprintf(stderr, "cinfer generate: %s\n", err);
            goto done;
        }
    }
    double t2 = now_s();
    fprintf(stderr, "cinfer generate: prompt %d tokens in %.3f s (%.1f tok/s), %d generated in %.3f s (%.2f tok/s)\n", np,
            t1 - t0, np / (t1 - t0 > 0 ? t1 - t0 : 1e-9), n_out, t2 - t1,
            n_out > 1 ? (n_out - 1) / (t2 - t1 > 0 ? t2 - t1 : 1e-9) : 0.0);
print:
    if (print_ids) {
        for (int i = 0; i < n_out; i++) printf("%s%d", i ? "," : "", out[i]);
        printf("\n");
    } else if (text) {
        printf("\n");
    } else {
        for (int i = 0; i < n_out; i++) printf("%d\n", out[i]);
    }
    rc = 0;
done:
    cli_images_free(ims, n_ims);
    free(logits);
    free(work);
    free(out);
    free(prompt);
    cinfer_ctx_destroy(c);
    cinfer_model_close(m);
    return rc;
}

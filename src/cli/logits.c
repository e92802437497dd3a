/* logits.c — `cinfer logits -m DIR --tokens LIST [--out FILE.npy] [--threads N]`: the logits of every
 * position of one sequence, as float32 [T, vocab]; prefill runs in chunks of the batch size. Without
 * --out, prints each position's top 5 ids with their logits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cinfer.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "cli/images.h"
#include "util/npy.h"

#define LOGITS_CHUNK 256

int cli_logits(int argc, char **argv) {
    static const char *const vf[] = {"-m", "--model", "--tokens", "--out", "--threads", "--image", NULL};
    static const char *const bf[] = {"--help", "-h", NULL};
    if (arg_flag(argc, argv, "--help") || arg_flag(argc, argv, "-h")) {
        printf("usage: cinfer logits -m DIR --tokens 1,2,3 [--image FILE ...] [--out FILE.npy] [--threads N]\n"
               "  writes the logits of every position as a float32 .npy of shape [T, vocab]; with --image, LIST holds one\n"
               "  <|image_pad|> id per image (after <|vision_start|>), expanded in place to the image's token count\n");
        return 0;
    }
    if (arg_check(argc, argv, vf, bf, "logits")) return 2;
    const char *dir = arg_value(argc, argv, "-m", "--model"), *toks = arg_value(argc, argv, "--tokens", NULL);
    const char *outp = arg_value(argc, argv, "--out", NULL), *thr = arg_value(argc, argv, "--threads", NULL);
    if (!dir || !toks) {
        fprintf(stderr, "cinfer logits: -m DIR and --tokens LIST are required\n");
        return 2;
    }
    long nthreads = 0;
    if (thr && parse_int(thr, "--threads", 0, 1024, &nthreads)) return 2;
    int32_t *ids;
    int n;
    if (parse_ids(toks, &ids, &n)) return 2;
    char err[1024];
    cinfer_model *m = NULL;
    cinfer_ctx *c = NULL;
    float *logits = NULL;
    FILE *f = NULL;
    int rc = 1, n_ims = 0;
    cinfer_image **ims = NULL;
    if (cinfer_model_open(dir, &m, err, sizeof err)) {
        fprintf(stderr, "cinfer logits: %s\n", err);
        goto done;
    }
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    if (cli_images_load(m, argc, argv, "logits", &ims, &n_ims)) goto done;
    if (n_ims && cli_images_expand(m, &ids, &n, ims, n_ims, "logits")) goto done;
    cinfer_ctx_params p = cinfer_ctx_default_params();
    p.max_seqs = 1;
    p.max_ctx = n;
    p.max_batch = n < LOGITS_CHUNK ? n : LOGITS_CHUNK;
    p.n_threads = (int)nthreads;
    if (cinfer_ctx_create(m, &p, &c, err, sizeof err)) {
        fprintf(stderr, "cinfer logits: %s\n", err);
        goto done;
    }
    int seq = cinfer_seq_open(c, err, sizeof err);
    if (seq < 0) {
        fprintf(stderr, "cinfer logits: %s\n", err);
        goto done;
    }
    if (n_ims && cinfer_seq_set_images(c, seq, ids, n, ims, n_ims, NULL, err, sizeof err)) {
        fprintf(stderr, "cinfer logits: %s\n", err);
        goto done;
    }
    size_t V = (size_t)info.vocab_size;
    logits = malloc((size_t)p.max_batch * V * sizeof(float));
    if (!logits) {
        fprintf(stderr, "cinfer logits: out of memory for %d x %zu logits\n", p.max_batch, V);
        goto done;
    }
    if (outp) {
        int64_t shape[2] = {n, (int64_t)V};
        if (!(f = npy_begin_f32(outp, shape, 2, err, sizeof err))) {
            fprintf(stderr, "cinfer logits: %s\n", err);
            goto done;
        }
    }
    for (int off = 0; off < n; off += p.max_batch) {
        int cnt = n - off < p.max_batch ? n - off : p.max_batch;
        cinfer_batch_entry e = {seq, ids + off, cnt, 1};
        if (cinfer_forward(c, &e, 1, logits, err, sizeof err)) {
            fprintf(stderr, "cinfer logits: %s\n", err);
            goto done;
        }
        if (f) {
            if (fwrite(logits, sizeof(float), (size_t)cnt * V, f) != (size_t)cnt * V) {
                fprintf(stderr, "cinfer logits: write to %s failed\n", outp);
                goto done;
            }
        } else {
            for (int t = 0; t < cnt; t++) {
                const float *row = logits + (size_t)t * V;
                int top[5] = {-1, -1, -1, -1, -1};
                for (int k = 0; k < 5 && k < (int)V; k++)
                    for (size_t i = 0; i < V; i++) {
                        int used = 0;
                        for (int q = 0; q < k; q++) used |= top[q] == (int)i;
                        if (!used && (top[k] < 0 || row[i] > row[top[k]])) top[k] = (int)i;
                    }
                printf("%d:", off + t);
                for (int k = 0; k < 5 && top[k] >= 0; k++) printf(" %d(%.4f)", top[k], row[top[k]]);
                printf("\n");
            }
        }
    }
    if (f) {
        int bad = fclose(f);
        f = NULL;
        if (bad) {
            fprintf(stderr, "cinfer logits: write to %s failed\n", outp);
            goto done;
        }
    }
    rc = 0;
done:
    cli_images_free(ims, n_ims);
    if (f) fclose(f);
    free(logits);
    free(ids);
    cinfer_ctx_destroy(c);
    cinfer_model_close(m);
    return rc;
}

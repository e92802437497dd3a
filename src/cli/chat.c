/* chat.c — `cinfer chat -m DIR [-n MAX] [--temp T] [--seed S] [--system TEXT] [--no-think]`: an interactive
 * terminal chat. Each turn renders the model's chat template over the whole history, runs it through the
 * engine (the same path the server uses) and streams the answer; reasoning (<think>…</think>) is shown
 * apart, dimmed on a terminal, and is not sent back in the history (the Qwen3.5 template drops earlier
 * turns' reasoning anyway). Empty line or EOF ends the chat; /reset clears the history. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cinfer.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "cli/images.h"

/* The generation prompt left an open <think> (thinking on): output starts inside the reasoning. */
static int prompt_opens_think(const char *prompt) {
    const char *open = NULL, *close = NULL, *p = prompt;
    while ((p = strstr(p, "<think>"))) open = p++;
    p = prompt;
    while ((p = strstr(p, "</think>"))) close = p++;
    return open && (!close || open > close);
}

int cli_chat(int argc, char **argv) {
    static const char *const vf[] = {"-m", "--model", "-n", "--temp", "--seed", "--system", "--threads", "--ctx-size", "--image", NULL};
    static const char *const bf[] = {"--no-think", "--help", "-h", NULL};
    if (arg_flag(argc, argv, "--help") || arg_flag(argc, argv, "-h")) {
        printf("usage: cinfer chat -m DIR [-n MAX_TOKENS] [--temp T] [--seed S] [--system TEXT] [--no-think] [--ctx-size N]\n"
               "                  [--image FILE ...]   (the images go with the first message, and again after /reset)\n");
        return 0;
    }
    if (arg_check(argc, argv, vf, bf, "chat")) return 2;
    const char *dir = arg_value(argc, argv, "-m", "--model"), *v;
    if (!dir) dir = "models/default";
    long max_tokens = 512, seed = -1, nthreads = 0, ctx_size = 4096;
    double temp = 0.7;
    if ((v = arg_value(argc, argv, "-n", NULL)) && parse_int(v, "-n", 1, 1 << 20, &max_tokens)) return 2;
    if ((v = arg_value(argc, argv, "--seed", NULL)) && parse_int(v, "--seed", 0, 0x7fffffffffffffffL, &seed)) return 2;
    if ((v = arg_value(argc, argv, "--threads", NULL)) && parse_int(v, "--threads", 0, 1024, &nthreads)) return 2;
    if ((v = arg_value(argc, argv, "--ctx-size", NULL)) && parse_int(v, "--ctx-size", 16, 1 << 24, &ctx_size)) return 2;
    if ((v = arg_value(argc, argv, "--temp", NULL)) && parse_float(v, "--temp", &temp)) return 2;
    const char *system = arg_value(argc, argv, "--system", NULL);
    int think = !arg_flag(argc, argv, "--no-think");
    char err[1024];
    cinfer_model *m;
    if (cinfer_model_open(dir, &m, err, sizeof err)) {
        fprintf(stderr, "cinfer chat: %s\n", err);
        return 1;
    }
    if (!cinfer_model_has_tokenizer(m) || !cinfer_model_chat_template(m)) {
        fprintf(stderr, "cinfer chat: %s has no tokenizer.json or no chat template\n", dir);
        cinfer_model_close(m);
        return 1;
    }
    /* images: checked now; each turn re-sends the whole history, so each request gets a fresh copy */
    cinfer_image **ims = NULL;
    int n_ims = 0;
    if (cli_images_load(m, argc, argv, "chat", &ims, &n_ims)) {
        cinfer_model_close(m);
        return 1;
    }
    cli_images_free(ims, n_ims);
    int images_pending = n_ims > 0, images_in_history = 0;
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.max_seqs = 1;
    ep.ctx_size = (int)ctx_size;
    ep.n_threads = (int)nthreads;
    cinfer_engine *e;
    if (cinfer_engine_create(m, &ep, &e, err, sizeof err)) {
        fprintf(stderr, "cinfer chat: %s\n", err);
        cinfer_model_close(m);
        return 1;
    }
    int tty = isatty(STDOUT_FILENO);
    const char *dim = tty ? "\033[2m" : "", *reset = tty ? "\033[0m" : "";
    json_t *history = json_array();
    if (system) json_array_append_new(history, json_pack("{s:s, s:s}", "role", "system", "content", system));
    char line[16384];
    uint64_t turn = 0;
    for (;;) {
        if (tty) printf("> "), fflush(stdout);
        if (!fgets(line, sizeof line, stdin)) break;
        line[strcspn(line, "\n")] = 0;
        if (!line[0]) break;
        if (!strcmp(line, "/reset")) {
            json_array_clear(history);
            if (system) json_array_append_new(history, json_pack("{s:s, s:s}", "role", "system", "content", system));
            images_pending = n_ims > 0, images_in_history = 0;
            continue;
        }
        int with_images = images_pending;
        if (with_images) {
            json_t *content = json_array();
            for (int i = 0; i < n_ims; i++) json_array_append_new(content, json_pack("{s:s}", "type", "image"));
            json_array_append_new(content, json_pack("{s:s, s:s}", "type", "text", "text", line));
            json_array_append_new(history, json_pack("{s:s, s:o}", "role", "user", "content", content));
        } else {
            json_array_append_new(history, json_pack("{s:s, s:s}", "role", "user", "content", line));
        }
        json_t *ctx = json_pack("{s:O, s:b, s:b}", "messages", history, "add_generation_prompt", 1, "enable_thinking", think);
        char *cj = json_dumps(ctx, JSON_COMPACT), *prompt = NULL;
        json_decref(ctx);
        int32_t *ids = NULL;
        int n = 0, rc = cinfer_apply_chat_template(m, cj, strlen(cj), &prompt, err, sizeof err);
        free(cj);
        if (!rc) rc = cinfer_tokenize(m, prompt, strlen(prompt), 0, &ids, &n, err, sizeof err);
        cinfer_request *r = NULL;
        ims = NULL;
        int n_sent = 0;
        if (!rc && (images_in_history || with_images)) {
            if (cli_images_load(m, argc, argv, "chat", &ims, &n_sent) || cli_images_expand(m, &ids, &n, ims, n_sent, "chat"))
                rc = -1, snprintf(err, sizeof err, "the images could not be sent");
        }
        if (!rc) {
            cinfer_request_params rp;
            memset(&rp, 0, sizeof rp);
            rp.prompt = ids;
            rp.n_prompt = n;
            rp.max_tokens = (int)max_tokens;
            rp.sampling = cinfer_sampling_default();
            rp.sampling.temperature = (float)temp;
            rp.sampling.has_seed = seed >= 0;
            rp.sampling.seed = (uint64_t)seed + turn++;
            rp.skip_special_tokens = 1;
            rp.reasoning = prompt_opens_think(prompt) ? 1 : 2;
            rp.images = ims;
            rp.n_images = n_sent;
            rc = cinfer_engine_submit(e, &rp, &r, err, sizeof err);
            if (!rc) free(ims), ims = NULL; /* the engine owns the images */
        }
        cli_images_free(ims, n_sent);
        free(prompt);
        free(ids);
        if (rc) {
            fprintf(stderr, "cinfer chat: %s\n", err);
            json_array_remove(history, json_array_size(history) - 1);
            continue;
        }
        if (with_images) images_pending = 0, images_in_history = 1;
        char *answer = NULL;
        size_t alen = 0;
        int in_reasoning = 0;
        cinfer_event ev;
        while (cinfer_request_next(r, &ev, -1) == 1) {
            if (ev.type == CINFER_EV_REASONING) {
                if (!in_reasoning) printf("%s[thinking] ", dim), in_reasoning = 1;
                fwrite(ev.text, 1, ev.len, stdout);
            } else if (ev.type == CINFER_EV_CONTENT) {
                if (in_reasoning) printf("%s\n", reset), in_reasoning = 0;
                fwrite(ev.text, 1, ev.len, stdout);
                char *na = realloc(answer, alen + ev.len + 1);
                if (na) {
                    answer = na;
                    memcpy(answer + alen, ev.text, ev.len);
                    alen += ev.len;
                    answer[alen] = 0;
                }
            } else if (ev.type == CINFER_EV_ERROR) {
                fprintf(stderr, "\ncinfer chat: %.*s\n", (int)ev.len, ev.text);
            } else if (ev.type == CINFER_EV_DONE && !strcmp(ev.finish_reason, "length")) {
                printf("%s\n[stopped at %d tokens]", reset, ev.completion_tokens);
            }
            fflush(stdout);
        }
        printf("%s\n", reset);
        cinfer_request_free(r);
        json_array_append_new(history, json_pack("{s:s, s:s}", "role", "assistant", "content", answer ? answer : ""));
        free(answer);
    }
    json_decref(history);
    cinfer_engine_destroy(e);
    cinfer_model_close(m);
    return 0;
}

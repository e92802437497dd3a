/* template.c — `cinfer template -t PATH --messages FILE [--tools FILE] [--add-generation-prompt] [--kwargs JSON]`:
 * renders a model's chat template for a conversation, as transformers' apply_chat_template(tokenize=False) would,
 * and prints it exactly (no newline added). Exit 0 ok, 1 an I/O or input error, 2 a usage or template error
 * (the template's own message, e.g. from raise_exception, on stderr). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok/template.h"
#include "util/file.h"

#define MAX_INPUT (256u << 20)

static void usage(FILE *f) {
    fprintf(f, "usage: cinfer template -t PATH --messages FILE [--tools FILE] [--add-generation-prompt] [--kwargs JSON]\n"
               "  PATH: a model folder, or a folder holding tokenizer_config.json / chat_template.jinja\n"
               "  --messages FILE  a JSON array of messages (or an object with \"messages\")\n"
               "  --tools FILE     a JSON array of tool definitions\n"
               "  --kwargs JSON    extra template variables, e.g. '{\"enable_thinking\": false}'\n");
}

int cli_template(int argc, char **argv) {
    const char *path = NULL, *msgs_file = NULL, *tools_file = NULL, *kwargs = NULL;
    int agp = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if ((!strcmp(a, "-t") || !strcmp(a, "--tokenizer") || !strcmp(a, "-m")) && i + 1 < argc) {
            path = argv[++i];
        } else if (!strcmp(a, "--messages") && i + 1 < argc) {
            msgs_file = argv[++i];
        } else if (!strcmp(a, "--tools") && i + 1 < argc) {
            tools_file = argv[++i];
        } else if (!strcmp(a, "--kwargs") && i + 1 < argc) {
            kwargs = argv[++i];
        } else if (!strcmp(a, "--add-generation-prompt")) {
            agp = 1;
        } else {
            fprintf(stderr, "cinfer template: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!path || !msgs_file) {
        usage(stderr);
        return 2;
    }
    char err[1024] = {0};
    char *src = NULL, *cfg = NULL, *msgs = NULL, *tools = NULL, *ctx = NULL, *out = NULL;
    size_t src_len = 0, n = 0, outlen = 0;
    tmpl *t = NULL;
    int status = 1;
    if (tmpl_load_dir(path, &src, &src_len, &cfg, err, sizeof err)) goto fail;
    if (file_read_all(msgs_file, MAX_INPUT, &msgs, &n, err, sizeof err)) goto fail;
    if (tools_file && file_read_all(tools_file, MAX_INPUT, &tools, &n, err, sizeof err)) goto fail;
    if (tmpl_build_context(msgs, tools, agp, cfg, kwargs, &ctx, err, sizeof err)) goto fail;
    if (tmpl_compile(src, src_len, &t, err, sizeof err)) {
        status = 2;
        goto fail;
    }
    if (tmpl_render_opts(t, ctx, strlen(ctx), NULL, &out, &outlen, err, sizeof err)) {
        status = 2;
        goto fail;
    }
    fwrite(out, 1, outlen, stdout);
    fflush(stdout);
    status = 0;
    goto done;
fail:
    fprintf(stderr, "%s\n", err);
done:
    tmpl_free(t);
    free(src);
    free(cfg);
    free(msgs);
    free(tools);
    free(ctx);
    free(out);
    return status;
}

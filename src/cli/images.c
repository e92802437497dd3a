/* images.c — `--image FILE` for the CLI verbs; see images.h. */
#include "cli/images.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CLI_IMAGE_MAX_BYTES ((long)64 << 20)

static unsigned char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n >= 0 && n <= CLI_IMAGE_MAX_BYTES && fseek(f, 0, SEEK_SET) == 0 &&
            (buf = malloc((size_t)n + 1))) {
            *len = fread(buf, 1, (size_t)n, f);
            if (*len != (size_t)n) {
                free(buf);
                buf = NULL;
            }
        }
    }
    fclose(f);
    return buf;
}

void cli_images_free(cinfer_image **ims, int n) {
    if (!ims) return;
    for (int i = 0; i < n; i++) cinfer_image_free(ims[i]);
    free(ims);
}

int cli_images_load(cinfer_model *m, int argc, char **argv, const char *verb, cinfer_image ***out, int *n) {
    *out = NULL;
    *n = 0;
    int cnt = 0;
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--image")) cnt++, i++;
    if (!cnt) return 0;
    cinfer_image **ims = calloc((size_t)cnt, sizeof *ims);
    if (!ims) return 1;
    int k = 0;
    char err[512];
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--image")) continue;
        const char *path = argv[++i];
        size_t len = 0;
        unsigned char *buf = read_file(path, &len);
        if (!buf) {
            fprintf(stderr, "cinfer %s: cannot read %s (missing, unreadable or over 64 MiB)\n", verb, path);
            cli_images_free(ims, k);
            return 1;
        }
        int rc = cinfer_image_load(m, buf, len, 0, &ims[k], err, sizeof err);
        free(buf);
        if (rc) {
            fprintf(stderr, "cinfer %s: %s: %s\n", verb, path, err);
            cli_images_free(ims, k);
            return 1;
        }
        k++;
    }
    *out = ims;
    *n = k;
    return 0;
}

int cli_images_expand(cinfer_model *m, int32_t **ids, int *n_ids, cinfer_image **ims, int n,
                      const char *verb) {
    int32_t *x = NULL;
    int nx = 0;
    char err[512];
    if (cinfer_expand_image_pads(m, *ids, *n_ids, ims, n, &x, &nx, err, sizeof err)) {
        fprintf(stderr, "cinfer %s: %s\n", verb, err);
        return 1;
    }
    free(*ids);
    *ids = x;
    *n_ids = nx;
    return 0;
}

int cli_images_prompt_text(cinfer_model *m, const char *text, cinfer_image **ims, int n, const char *verb,
                           int32_t **ids, int *n_ids) {
    char err[512], *prompt = NULL;
    const char *use = text;
    static const char PH[] = "<|vision_start|><|image_pad|><|vision_end|>";
    if (!strstr(text, "<|image_pad|>")) {
        if (cinfer_model_chat_template(m)) {
            json_t *content = json_array();
            for (int i = 0; i < n; i++) json_array_append_new(content, json_pack("{s:s}", "type", "image"));
            json_array_append_new(content, json_pack("{s:s, s:s}", "type", "text", "text", text));
            json_t *ctx = json_pack("{s:[{s:s, s:o}], s:b}", "messages", "role", "user", "content", content,
                                    "add_generation_prompt", 1);
            char *js = json_dumps(ctx, JSON_COMPACT);
            json_decref(ctx);
            int rc = js ? cinfer_apply_chat_template(m, js, strlen(js), &prompt, err, sizeof err) : -1;
            free(js);
            if (rc) {
                fprintf(stderr, "cinfer %s: chat template: %s\n", verb, rc == -1 ? "out of memory" : err);
                return 1;
            }
        } else {
            size_t len = strlen(text) + (size_t)n * (sizeof PH - 1) + 1;
            prompt = malloc(len);
            if (!prompt) return 1;
            prompt[0] = 0;
            for (int i = 0; i < n; i++) strcat(prompt, PH);
            strcat(prompt, text);
        }
        use = prompt;
    }
    int rc = cinfer_tokenize(m, use, strlen(use), 0, ids, n_ids, err, sizeof err);
    free(prompt);
    if (rc) {
        fprintf(stderr, "cinfer %s: %s\n", verb, err);
        return 1;
    }
    return cli_images_expand(m, ids, n_ids, ims, n, verb);
}

/* main.c — `cinfer VERB ...`: dispatches to the verb files. Only this layer exits the process. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cinfer.h"
#include "cli/cli.h"

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} verb;

static const verb verbs[] = {
    {"serve", cli_serve, "OpenAI + Anthropic compatible HTTP server: [-m DIR] [--host H] [--port P] (cinfer serve --help)"},
    {"chat", cli_chat, "interactive chat in the terminal: [-m DIR] [--system TEXT] [--no-think]"},
    {"generate", cli_generate, "generate from a prompt: -m DIR (--tokens LIST | --prompt TEXT) -n N [--temp T --seed S] [--ids]"},
    {"perplexity", cli_perplexity, "perplexity on a text file: -m DIR --file F [--ctx N] [--threads N] [--json]"},
    {"logits", cli_logits, "write the logits of every position: -m DIR --tokens LIST [--out FILE.npy]"},
    {"info", cli_info, "architecture, layer map, parameter count, bytes by dtype: -m DIR"},
    {"synth", cli_synth, "write a random-weight checkpoint of a real model's shape: --like NAME --out DIR"},
    {"bench", cli_bench, "prefill and decode tokens/s with achieved GB/s: -m DIR"},
    {"tokenize", cli_tokenize, "text to ids as a JSON array: -t PATH (--text S | --jsonl FILE) [--add-special-tokens]"},
    {"detokenize", cli_detokenize, "ids to text: -t PATH --ids 1,2,3 [--skip-special-tokens]"},
    {"template", cli_template, "render the chat template: -t PATH --messages FILE [--tools FILE] [--add-generation-prompt] [--kwargs JSON]"},
};

static void usage(FILE *f) {
    fprintf(f, "cinfer %s — inference for Qwen3.5 / Qwen3.5-MoE / Qwen3-Next\n\nusage: cinfer VERB [options]\n\n",
            CINFER_VERSION);
    for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++) fprintf(f, "  %-10s %s\n", verbs[i].name, verbs[i].help);
    fprintf(f, "\nEvery verb that runs the model takes --device cpu|cuda|auto (default cpu; auto: the GPU when one is\n"
               "visible and nothing CUDA lacks is asked for) and --precision exact|fast (default exact: near-f32\n"
               "products on the GPU; fast: activations rounded to bf16 once before the tensor cores, a faster prefill;\n"
               "the CPU runs exact either way).\n`cinfer VERB --help` for a verb's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("cinfer %s\n", CINFER_VERSION);
        return 0;
    }
    /* --device cpu|cuda|auto is taken out here for every verb: it becomes CINFER_DEVICE, the default of the
     * context and engine parameters */
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--device")) continue;
        const char *d = i + 1 < argc ? argv[i + 1] : "";
        if (strcmp(d, "cpu") && strcmp(d, "cuda") && strcmp(d, "auto")) {
            fprintf(stderr, "cinfer: --device must be cpu, cuda or auto\n");
            return 2;
        }
        setenv("CINFER_DEVICE", d, 1);
        for (int j = i; j + 2 <= argc; j++) argv[j] = argv[j + 2];
        argc -= 2;
        i--;
    }
    /* --precision exact|fast likewise becomes CINFER_PRECISION (cinfer_precision's default) */
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--precision")) continue;
        const char *d = i + 1 < argc ? argv[i + 1] : "";
        if (cinfer_precision_parse(d) < 0) {
            fprintf(stderr, "cinfer: --precision must be exact or fast, got '%s'\n", d);
            return 2;
        }
        setenv("CINFER_PRECISION", d, 1);
        for (int j = i; j + 2 <= argc; j++) argv[j] = argv[j + 2];
        argc -= 2;
        i--;
    }
    const char *pe = getenv("CINFER_PRECISION");
    if (pe && cinfer_precision_parse(pe) < 0) {
        fprintf(stderr, "cinfer: CINFER_PRECISION must be exact or fast, got '%s'\n", pe);
        return 2;
    }
    for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++)
        if (!strcmp(argv[1], verbs[i].name)) return verbs[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "cinfer: unknown verb '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}

/* info.c — `cinfer info -m DIR`: architecture, layer map, parameter count and bytes by dtype. */
#include <stdio.h>

#include "cinfer.h"
#include "cli/args.h"
#include "cli/cli.h"

int cli_info(int argc, char **argv) {
    static const char *const vf[] = {"-m", "--model", NULL};
    static const char *const bf[] = {"--help", "-h", NULL};
    if (arg_flag(argc, argv, "--help") || arg_flag(argc, argv, "-h")) {
        printf("usage: cinfer info -m DIR\n");
        return 0;
    }
    if (arg_check(argc, argv, vf, bf, "info")) return 2;
    const char *dir = arg_value(argc, argv, "-m", "--model");
    if (!dir) {
        fprintf(stderr, "cinfer info: -m DIR is required\n");
        return 2;
    }
    char err[1024];
    cinfer_model *m;
    if (cinfer_model_open(dir, &m, err, sizeof err)) {
        fprintf(stderr, "cinfer info: %s\n", err);
        return 1;
    }
    cinfer_model_info i;
    cinfer_model_get_info(m, &i);
    printf("architecture      %s\n", i.arch);
    printf("layers            %d (%d Gated DeltaNet, %d full attention)\n", i.n_layers, i.n_linear_layers, i.n_full_layers);
    printf("layer map         %s\n", i.layer_map);
    printf("hidden size       %d\n", i.hidden_size);
    printf("vocab             %d\n", i.vocab_size);
    if (i.n_experts) printf("experts           %d, %d per token\n", i.n_experts, i.n_experts_per_tok);
    printf("parameters        %lld (text forward), %lld in the checkpoint\n", (long long)i.n_params, (long long)i.n_params_total);
    printf("bytes             BF16 %lld, F16 %lld, F32 %lld, other %lld\n", (long long)i.bytes_bf16, (long long)i.bytes_f16,
           (long long)i.bytes_f32, (long long)i.bytes_other);
    printf("decode bytes/tok  %lld\n", (long long)i.bytes_per_token);
    printf("eos ids          ");
    for (int k = 0; k < i.n_eos; k++) printf(" %d", i.eos_ids[k]);
    printf("\nmtp head          %s\n", i.has_mtp ? "yes (cinfer generate|serve --spec mtp)" : "no");
    printf("vision tensors    %d%s\n", i.n_visual_tensors,
           i.has_vision ? " (vision tower bound: images accepted)" : i.n_visual_tensors ? " (no vision_config: not used)" : "");
    cinfer_model_close(m);
    return 0;
}

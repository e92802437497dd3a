/* fuzz_config.c — libFuzzer target for config_parse: any text must either yield a config that satisfies
 * the invariants the model code relies on, or fail with a negative code and a message. */
#include <stdint.h>
#include <stdlib.h>

#include "io/config.h"
#include "util/err.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static model_config c; /* ~8 KB: keep it off the fuzzer's stack */
    char err[512];
    int rc = config_parse((const char *)data, size, "config.json", &c, err, sizeof err);
    if (rc == 0) {
        CI_ASSERT(c.n_layers > 0 && c.n_layers <= CONFIG_MAX_LAYERS);
        CI_ASSERT(c.hidden_size > 0 && c.vocab_size > 0 && c.head_dim > 0);
        CI_ASSERT(c.n_heads % c.n_kv_heads == 0);
        CI_ASSERT(c.lin_n_value_heads % c.lin_n_key_heads == 0);
        CI_ASSERT(c.rope_dim > 0 && c.rope_dim % 2 == 0 && c.rope_dim <= c.head_dim);
        CI_ASSERT(c.n_eos >= 0 && c.n_eos <= CONFIG_MAX_EOS);
        CI_ASSERT(c.n_experts_per_tok <= c.n_experts);
        for (int i = 0; i < c.n_layers; i++) {
            CI_ASSERT(c.layer_types[i] == LAYER_LINEAR || c.layer_types[i] == LAYER_FULL);
            /* A dense FFN layer always has a width to bind. */
            if (!config_layer_is_moe(&c, i)) CI_ASSERT(c.intermediate_size > 0);
        }
    } else {
        CI_ASSERT(rc < 0 && err[0]);
    }
    return 0;
}

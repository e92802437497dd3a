/* fuzz_safetensors.c — libFuzzer target for st_parse: any byte string must either parse into a header
 * whose every span lies inside the data section, or fail with a negative code and a message. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "util/err.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    st_header h;
    char err[256];
    int rc = st_parse(data, size, &h, err, sizeof err);
    if (rc == 0) {
        /* What the parser promises its callers; a broken promise is a crash the fuzzer reports. */
        CI_ASSERT(h.data_offset >= 8 && h.data_offset <= size);
        for (int i = 0; i < h.n; i++) {
            const st_tensor *t = &h.tensors[i];
            CI_ASSERT(t->begin <= t->end && t->end <= size - h.data_offset);
            CI_ASSERT((uint64_t)t->numel * st_dtype_size(t->dtype) == t->end - t->begin);
            if (i) CI_ASSERT(strcmp(h.tensors[i - 1].name, t->name) < 0);
        }
        st_header_free(&h);
    } else {
        CI_ASSERT(rc < 0 && err[0]);
    }
    return 0;
}

/* vision_cuda.h — the vision tower of vision.h on a CUDA device: the same stages (patch embedding,
 * bilinear learned positions, 2-D rotary, pre-LayerNorm blocks with attention inside each frame, the 2x2
 * merger), matrices uploaded once as bf16 and run through cu_gemm (activations as bf16 hi + lo, f32
 * accumulation), everything else in f32 on its own stream. Scratch grows with the largest input seen.
 * Built without CUDA, create fails with a message. */
#ifndef CI_VISION_CUDA_H
#define CI_VISION_CUDA_H

#include <stddef.h>

#include "model/qwen35.h"
#include "model/vision.h"

typedef struct cuda_vision cuda_vision;

/* CINFER_EUNSUPPORTED without a device, a tower, or with a head_dim the attention kernel lacks.
 * CINFER_CUDA_VIS_ATTN=tc (read here) runs the attention on the tensor cores (bf16 hi + lo operands). */
int cuda_vision_create(const model *m, cuda_vision **out, char *err, size_t errlen);
void cuda_vision_destroy(cuda_vision *v);

/* vision_encode's contract: pixels [Σ t*h*w, patch_dim] f32 (host), out [Σ tokens, out_hidden] f32 (host).
 * trace (tests; may be NULL) gets host copies of the stages vision_encode names "patch_embed", "block<i>"
 * and "merger" (each one a synchronisation and a copy). */
int cuda_vision_encode(cuda_vision *v, const float *pixels, const vision_grid *grids, int n_images,
                       float *out, vision_trace_fn trace, void *trace_ctx, char *err, size_t errlen);

#endif

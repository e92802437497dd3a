/* vision.h — the Qwen3.5 vision tower on the CPU (spec §6.2): patch embedding, bilinear learned positions,
 * 2-D rotary, pre-LayerNorm blocks with attention inside each frame, and the 2x2 merger into the text
 * hidden size. Input is the preprocessor's pixel rows (vision/preprocess.h), output one row per merged
 * token, in the order the <|image_pad|> tokens take them. */
#ifndef CI_VISION_H
#define CI_VISION_H

#include <stdint.h>

#include "model/qwen35.h"
#include "util/threadpool.h"

/* One image's grid in patches (image_grid_thw): t frames of h x w patches, h and w multiples of merge. */
typedef struct vision_grid {
    int t, h, w;
} vision_grid;

/* Merged tokens an image of this grid becomes: t*h*w / merge^2. */
int64_t vision_tokens(const vision_weights *v, vision_grid g);

/* Checks grids against the tower (positive, h and w multiples of merge, sizes bounded) and returns the
 * patch count in *n_patches. */
int vision_check_grids(const vision_weights *v, const vision_grid *grids, int n_images, int64_t *n_patches,
                       char *err, size_t errlen);

/* Called with each intermediate stage when tracing (tests): name is "patch_embed", "pos_embed",
 * "rotary" (angles [N, head_dim/2]), "block<i>", "merger". */
typedef void (*vision_trace_fn)(void *ctx, const char *name, const float *data, int64_t rows, int cols);

/* One patch row's learned-position taps as the tower takes them (bilinear over the grid_side^2 table:
 * rows idx and weights w of the taps 00, 01, 10, 11) and its full-resolution (y, x) for the 2-D rotary. */
typedef struct vision_tap {
    int32_t idx[4];
    float w[4];
    int32_t y, x;
} vision_tap;

/* The taps of every patch row of the images (out: [Σ t*h*w], merge-block order, same values as
 * vision_encode uses); for the CUDA tower. Grids must have passed vision_check_grids. */
void vision_taps(const vision_weights *v, const vision_grid *grids, int n_images, vision_tap *out);

/* Runs the tower over n_images images whose patch rows are concatenated in pixels ([Σ t*h*w, patch_dim]
 * f32, merge-block order) and writes [Σ tokens, out_hidden] f32 to out. Allocates its scratch (sized by
 * the input) and returns CINFER_ENOMEM when that fails; CINFER_EUNSUPPORTED when the model has no tower. */
int vision_encode(const model *m, threadpool *tp, const float *pixels, const vision_grid *grids, int n_images,
                  float *out, vision_trace_fn trace, void *trace_ctx, char *err, size_t errlen);

#endif

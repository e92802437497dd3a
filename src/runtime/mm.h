/* mm.h — images behind cinfer.h: struct cinfer_image (decoded and preprocessed pixels, and the vision
 * tower's output once encoded) and the layout of a prompt with images: which tokens the image features
 * replace and every token's mRoPE positions (spec §6.3, transformers' get_rope_index). */
#ifndef CI_MM_H
#define CI_MM_H

#include <stddef.h>
#include <stdint.h>

#include "cinfer.h"
#include "io/config.h"
#include "model/vision.h"
#include "vision/preprocess.h"

struct cinfer_image {
    vision_pixels px;  /* [n_patches][patch_dim] f32, merge-block order, and the grid */
    int n_tokens;      /* merged tokens = <|image_pad|> tokens it takes */
    int width, height; /* the decoded image */
    uint64_t hash;     /* of the grid and the preprocessed pixels */
    float *feat;       /* NULL until encoded, then [n_tokens][H] f32 */
    int H;
};

/* A prompt with images, expanded (one <|image_pad|> per merged token). */
typedef struct mm_layout {
    int n;        /* prompt tokens */
    int32_t *pos; /* [3][n] rotary positions: stream t, then h, then w */
    int32_t *row; /* [n] row of the concatenated image features for each token, -1 for text */
    int n_feat;   /* image tokens in all */
    int delta;    /* rope_delta: max position + 1 - n; later tokens use position + delta */
} mm_layout;

/* Checks the prompt against the images and builds its layout. Each image is one run of exactly its
 * token count of <|image_pad|> right after a <|vision_start|>, runs in image order; anything else
 * (a stray pad, a run of the wrong length, more or fewer runs than images, a video) is CINFER_EINVAL. */
int mm_layout_build(const model_config *c, int merge, const int32_t *ids, int n, const vision_grid *grids,
                    int n_images, mm_layout *out, char *err, size_t errlen);
void mm_layout_free(mm_layout *l);

/* Reads dir/preprocessor_config.json (defaults when absent) into the model handle. A malformed file or
 * one that disagrees with vision_config makes image loading fail later with its message, not model open. */
void mm_model_load(cinfer_model *cm, const char *dir);

/* Runs the tower for an image not yet encoded (tp: the caller's pool, may be NULL). */
int mm_image_encode(const model *m, cinfer_image *im, threadpool *tp, char *err, size_t errlen);

#endif

/* preprocess.h — image preprocessing for the Qwen3.5 vision tower, bit-exact with transformers'
 * Qwen2-VL image processor on its PIL path (Qwen2VLImageProcessor / Qwen2VLImageProcessorPil):
 * smart_resize, PIL's BICUBIC resample (ImagingResample, antialiased, fixed point), rescale,
 * normalize, temporal duplication and patchify in 2x2 merge-block order (spec/qwen35.md §6.1). */
#ifndef CI_VISION_PREPROCESS_H
#define CI_VISION_PREPROCESS_H

#include <stddef.h>
#include <stdint.h>

/* preprocessor_config.json, the fields that change the numbers. */
typedef struct vision_pp_config {
    int patch_size;          /* 16 */
    int temporal_patch_size; /* 2: an image is repeated to this many frames */
    int merge_size;          /* 2: the merger joins merge_size x merge_size patches */
    int64_t min_pixels;      /* size.shortest_edge (65536) */
    int64_t max_pixels;      /* size.longest_edge (16777216) */
    double rescale_factor;   /* 1/255, applied in float64 then cast to float32 like numpy */
    float image_mean[3];     /* [0.5, 0.5, 0.5] */
    float image_std[3];      /* [0.5, 0.5, 0.5] */
} vision_pp_config;

/* The Qwen3.5 values (spec §6.1). */
vision_pp_config vision_pp_default_config(void);

/* Parses preprocessor_config.json (pure: data, size). Fields missing from the file keep the value
 * from vision_pp_default_config(); min_pixels/max_pixels at the top level override size{}.
 * A resample other than 3 (BICUBIC) or do_resize/do_rescale/do_normalize/do_convert_rgb false
 * is CINFER_EUNSUPPORTED: the rest of the pipeline assumes them. */
int vision_pp_config_parse(const char *data, size_t size, vision_pp_config *out, char *err, size_t errlen);

/* transformers' smart_resize: both sides multiples of factor, area within [min, max] pixels,
 * Python's round-half-to-even for the first guess. Aspect ratio > 200 is CINFER_EINVAL. */
int vision_smart_resize(int height, int width, int factor, int64_t min_pixels, int64_t max_pixels, int *out_h,
                        int *out_w, char *err, size_t errlen);

/* PIL's Image.resize((dw, dh), Image.BICUBIC) on an 8-bit RGB image, bit for bit: separable passes
 * (horizontal first, only over the rows the vertical pass reads), the filter's support scaled by the
 * downscale factor (antialiasing), coefficients normalised then rounded to 22-bit fixed point,
 * rounding and clamping to uint8 between the passes. src [sh][sw][3] u8, dst [dh][dw][3] u8.
 * Same size in and out is a copy (PIL skips both passes). */
int vision_resize_bicubic(const uint8_t *src, int sw, int sh, uint8_t *dst, int dw, int dh, char *err,
                          size_t errlen);

/* The processor's output for one image. */
typedef struct vision_pixels {
    float *data;       /* [n_patches][patch_dim] f32, rows in 2x2 merge-block order (spec §6.1) */
    int64_t n_patches; /* grid_t * grid_h * grid_w */
    int patch_dim;     /* 3 * temporal_patch_size * patch_size^2 = 1536 */
    int grid_t, grid_h, grid_w; /* image_grid_thw: (1, resized_h / patch, resized_w / patch) */
} vision_pixels;

/* rgb [h][w][3] u8 → smart_resize → bicubic resize → rescale/normalize → patchify. */
int vision_preprocess(const uint8_t *rgb, int w, int h, const vision_pp_config *cfg, vision_pixels *out, char *err,
                      size_t errlen);

/* The last three steps alone on an already resized image (rh, rw multiples of patch*merge):
 * rescale/normalize, repeat to temporal_patch_size frames, patchify. out->data is allocated. */
int vision_patchify(const uint8_t *rgb, int rw, int rh, const vision_pp_config *cfg, vision_pixels *out, char *err,
                    size_t errlen);

void vision_pixels_free(vision_pixels *p);

#endif

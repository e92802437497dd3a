/* image.h — decoding PNG, JPEG, GIF (first frame), BMP and WebP from memory into 8-bit RGB, pixel for
 * pixel what the reference pipeline gets from PIL: transformers' load_image (Image.open, then
 * ImageOps.exif_transpose, then convert("RGB")). Limits on encoded bytes, sides and pixel count are
 * checked from the header before any pixel buffer exists, so a decompression bomb is an error. */
#ifndef CI_VISION_IMAGE_H
#define CI_VISION_IMAGE_H

#include <stddef.h>
#include <stdint.h>

typedef enum image_format {
    IMAGE_FMT_UNKNOWN = 0,
    IMAGE_FMT_PNG,
    IMAGE_FMT_JPEG,
    IMAGE_FMT_GIF,
    IMAGE_FMT_BMP,
    IMAGE_FMT_WEBP,
} image_format;

typedef struct image_limits {
    size_t max_bytes;   /* encoded size */
    int max_side;       /* width and height each */
    int64_t max_pixels; /* width * height of the decoded canvas */
} image_limits;

/* 64 MiB encoded, 32768 per side, 89478485 pixels (PIL's own decompression-bomb threshold,
 * 1 GiB / 4 / 3: anything PIL would open without a warning opens here). */
image_limits image_default_limits(void);

typedef struct image_rgb {
    int width, height;
    uint8_t *pixels;     /* [height][width][3] u8, RGB, rows top to bottom, no padding */
    image_format format; /* what the bytes were */
    int had_alpha;       /* the file carried alpha (or transparency); it was dropped like convert("RGB") */
    int orientation;     /* EXIF orientation found (1..8, 0 none); already applied to pixels */
} image_rgb;

/* The format from the magic bytes (no decoding). */
image_format image_sniff(const uint8_t *data, size_t size);
const char *image_format_name(image_format f);

/* Reads only the header: format and stored size (before any EXIF rotation). Pure, no codec
 * library involved; CINFER_EFORMAT when the header is malformed or the format unknown. */
int image_probe(const uint8_t *data, size_t size, image_format *fmt, int *width, int *height, char *err, size_t errlen);

/* Decodes into out (free with image_free). Errors: CINFER_ERANGE over a limit (checked from the
 * header first), CINFER_EFORMAT malformed or truncated data, CINFER_EUNSUPPORTED a valid file this
 * decoder does not handle (12-bit JPEG, RLE BMP, ...) or a codec library missing at run time,
 * CINFER_ENOMEM. lim NULL means image_default_limits(). */
int image_decode(const uint8_t *data, size_t size, const image_limits *lim, image_rgb *out, char *err, size_t errlen);

void image_free(image_rgb *img);


#endif

/* fuzz_image.c — the image decoders (PNG, JPEG, GIF, BMP, WebP) and header probes over arbitrary
 * bytes with small limits, then the preprocessing of whatever decodes (resize to a smart_resize size,
 * patchify); inputs that start with '{' go to the preprocessor_config.json parser. */
#include <stddef.h>
#include <stdint.h>

#include "vision/image.h"
#include "vision/preprocess.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[256];
    if (size > 0 && data[0] == '{') {
        vision_pp_config c;
        (void)vision_pp_config_parse((const char *)data, size, &c, err, sizeof err);
        return 0;
    }
    image_format f;
    int w, h;
    (void)image_probe(data, size, &f, &w, &h, err, sizeof err);
    /* small limits keep each run fast and bound memory: a bomb must stop at the header */
    image_limits lim = {.max_bytes = 1 << 20, .max_side = 2048, .max_pixels = 1 << 18};
    image_rgb img;
    if (image_decode(data, size, &lim, &img, err, sizeof err) == 0) {
        vision_pp_config cfg = vision_pp_default_config();
        cfg.min_pixels = 1024;
        cfg.max_pixels = 16384;
        vision_pixels pv;
        if (vision_preprocess(img.pixels, img.width, img.height, &cfg, &pv, err, sizeof err) == 0) {
            volatile float s = pv.data[0] + pv.data[pv.n_patches * pv.patch_dim - 1];
            (void)s;
            vision_pixels_free(&pv);
        }
        image_free(&img);
    }
    return 0;
}

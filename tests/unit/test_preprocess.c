/* test_preprocess.c — smart_resize, PIL-exact bicubic resampling, normalisation and patchify
 * against the goldens of tools/oracle/image_goldens.py (PIL 9.4 + numpy mirroring transformers'
 * PIL-path Qwen2-VL processor), and the patch order against a direct reshape/transpose emulation. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cinfer.h"
#include "test.h"
#include "vision/image.h"
#include "vision/preprocess.h"

/* from test_image.c */
uint64_t imgtest_csum(const void *data, size_t n);
int imgtest_csum_eq(const void *data, size_t n, const char *hex);
json_t *imgtest_goldens(void);
int imgtest_decode(const char *name, image_rgb *img);

TEST(pp_smart_resize_half_to_even) {
    char err[256];
    int h, w;
    /* h/32 exactly x.5: Python's round goes to the even neighbour */
    REQUIRE(vision_smart_resize(48, 80, 32, 1, 1 << 30, &h, &w, err, sizeof err) == 0);
    CHECK_EQ_INT(h, 64); /* 1.5 -> 2 */
    CHECK_EQ_INT(w, 64); /* 2.5 -> 2 */
    REQUIRE(vision_smart_resize(112, 144, 32, 1, 1 << 30, &h, &w, err, sizeof err) == 0);
    CHECK_EQ_INT(h, 128); /* 3.5 -> 4 */
    CHECK_EQ_INT(w, 128); /* 4.5 -> 4 */
    /* the clamps: under min -> ceil of the scaled size; over max -> floor, at least one factor */
    REQUIRE(vision_smart_resize(7, 5, 32, 65536, 16777216, &h, &w, err, sizeof err) == 0);
    CHECK_EQ_INT(h, 320);
    CHECK_EQ_INT(w, 224);
    CHECK(h * w >= 65536);
    REQUIRE(vision_smart_resize(50000, 300, 32, 4096, 50176, &h, &w, err, sizeof err) == 0);
    CHECK_EQ_INT(w, 32);
    CHECK_EQ_INT(h, 2880);
    CHECK_EQ_INT(vision_smart_resize(1, 201, 32, 65536, 16777216, &h, &w, err, sizeof err), CINFER_EINVAL);
    CHECK_STR_CONTAINS(err, "aspect ratio");
    CHECK_EQ_INT(vision_smart_resize(0, 10, 32, 1, 100, &h, &w, err, sizeof err), CINFER_EINVAL);
}

TEST(pp_smart_resize_table) {
    json_t *g = imgtest_goldens();
    REQUIRE(g);
    size_t i;
    json_t *e;
    int n = 0;
    json_array_foreach(json_object_get(g, "smart_resize"), i, e) {
        int h = (int)json_integer_value(json_object_get(e, "h")), w = (int)json_integer_value(json_object_get(e, "w"));
        int64_t mn = json_integer_value(json_object_get(e, "min")), mx = json_integer_value(json_object_get(e, "max"));
        json_t *o = json_object_get(e, "out");
        int rh = 0, rw = 0;
        char err[256];
        int rc = vision_smart_resize(h, w, 32, mn, mx, &rh, &rw, err, sizeof err);
        if (json_is_null(o)) {
            CHECK_MSG(rc == CINFER_EINVAL, "%dx%d: expected the aspect-ratio error", h, w);
        } else {
            int eh = (int)json_integer_value(json_array_get(o, 0)), ew = (int)json_integer_value(json_array_get(o, 1));
            CHECK_MSG(rc == 0 && rh == eh && rw == ew, "smart_resize(%d, %d, min %lld, max %lld) = %dx%d, want %dx%d", h, w,
                      (long long)mn, (long long)mx, rh, rw, eh, ew);
        }
        n++;
    }
    CHECK(n >= 20);
    json_decref(g);
}

/* PIL's resize to sizes the processor would not choose: up, down by non-integer factors, mixed
 * (up in one axis, down in the other), to 1x1, to a size that only needs one pass. */
TEST(pp_resize_matches_pil) {
    json_t *g = imgtest_goldens();
    REQUIRE(g);
    json_t *r = json_object_get(g, "resize");
    image_rgb src;
    REQUIRE(imgtest_decode(json_string_value(json_object_get(r, "source")), &src) == 0);
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(r, "cases"), i, e) {
        int w = (int)json_integer_value(json_object_get(e, "width")), h = (int)json_integer_value(json_object_get(e, "height"));
        uint8_t *dst = malloc((size_t)w * h * 3);
        char err[256];
        REQUIRE(vision_resize_bicubic(src.pixels, src.width, src.height, dst, w, h, err, sizeof err) == 0);
        CHECK_MSG(imgtest_csum_eq(dst, (size_t)w * h * 3, json_string_value(json_object_get(e, "resized"))),
                  "resize %dx%d -> %dx%d differs from PIL", src.width, src.height, w, h);
        free(dst);
    }
    image_free(&src);
    json_decref(g);
}

/* Each fixture through the whole processor, for both configs: the resize to the smart_resize size
 * and the pixel_values, bit for bit. */
TEST(pp_preprocess_matches_reference) {
    json_t *g = imgtest_goldens();
    REQUIRE(g);
    json_t *cfgs = json_object_get(g, "configs");
    size_t i;
    json_t *e;
    int n_checked = 0;
    json_array_foreach(json_object_get(g, "images"), i, e) {
        const char *name = json_string_value(json_object_get(e, "file"));
        image_rgb img;
        if (imgtest_decode(name, &img)) continue;
        const char *cname;
        json_t *cj;
        json_object_foreach(cfgs, cname, cj) {
            vision_pp_config cfg = vision_pp_default_config();
            cfg.min_pixels = json_integer_value(json_object_get(cj, "min_pixels"));
            cfg.max_pixels = json_integer_value(json_object_get(cj, "max_pixels"));
            json_t *x = json_object_get(e, cname);
            char err[256];
            int rh, rw;
            int rc = vision_smart_resize(img.height, img.width, 32, cfg.min_pixels, cfg.max_pixels, &rh, &rw, err, sizeof err);
            if (json_object_get(x, "error")) {
                CHECK_MSG(rc == CINFER_EINVAL, "%s/%s: expected an aspect-ratio error", name, cname);
                vision_pixels pv;
                CHECK(vision_preprocess(img.pixels, img.width, img.height, &cfg, &pv, err, sizeof err) == CINFER_EINVAL);
                continue;
            }
            int eh = (int)json_integer_value(json_object_get(x, "resized_h"));
            int ew = (int)json_integer_value(json_object_get(x, "resized_w"));
            CHECK_MSG(rc == 0 && rh == eh && rw == ew, "%s/%s: smart_resize %dx%d, want %dx%d", name, cname, rw, rh, ew, eh);
            if (rc || rh != eh || rw != ew) continue;
            uint8_t *rs = malloc((size_t)rw * rh * 3);
            REQUIRE(vision_resize_bicubic(img.pixels, img.width, img.height, rs, rw, rh, err, sizeof err) == 0);
            CHECK_MSG(imgtest_csum_eq(rs, (size_t)rw * rh * 3, json_string_value(json_object_get(x, "resized"))),
                      "%s/%s: resize to %dx%d differs from PIL", name, cname, rw, rh);
            free(rs);
            vision_pixels pv;
            REQUIRE(vision_preprocess(img.pixels, img.width, img.height, &cfg, &pv, err, sizeof err) == 0);
            json_t *grid = json_object_get(x, "grid");
            CHECK_EQ_INT(pv.grid_t, json_integer_value(json_array_get(grid, 0)));
            CHECK_EQ_INT(pv.grid_h, json_integer_value(json_array_get(grid, 1)));
            CHECK_EQ_INT(pv.grid_w, json_integer_value(json_array_get(grid, 2)));
            CHECK_EQ_INT(pv.patch_dim, 1536);
            CHECK_EQ_INT(pv.n_patches, (int64_t)pv.grid_t * pv.grid_h * pv.grid_w);
            double sum = 0;
            for (int64_t k = 0; k < pv.n_patches * pv.patch_dim; k++) sum += pv.data[k];
            CHECK_NEAR(sum, json_number_value(json_object_get(x, "pv_sum")), 1e-6 * (1 + fabs(sum)));
            CHECK_MSG(imgtest_csum_eq(pv.data, (size_t)pv.n_patches * pv.patch_dim * sizeof(float),
                                      json_string_value(json_object_get(x, "pixel_values"))),
                      "%s/%s: pixel_values differ from the reference", name, cname);
            json_t *first = json_object_get(x, "pv_first");
            for (int k = 0; k < 4; k++)
                CHECK_NEAR(pv.data[k], json_number_value(json_array_get(first, (size_t)k)), 0);
            vision_pixels_free(&pv);
            n_checked++;
        }
        image_free(&img);
    }
    CHECK(n_checked >= 100);
    json_decref(g);
}

/* The patch order, checked against a literal emulation of the processor's numpy steps: a C-order
 * array of shape (1, gt, T, C, gh/M, M, P, gw/M, M, P) over the frames [T][C][H][W], transposed by
 * (0, 1, 4, 7, 5, 8, 3, 2, 6, 9) and flattened. */
TEST(pp_patchify_order) {
    const int P = 4, M = 2, T = 2, C = 3, rh = 24, rw = 16; /* a small geometry keeps the check exhaustive */
    vision_pp_config cfg = vision_pp_default_config();
    cfg.patch_size = P;
    cfg.merge_size = M;
    cfg.temporal_patch_size = T;
    cfg.image_mean[0] = 0.25f, cfg.image_mean[1] = 0.5f, cfg.image_mean[2] = 0.75f;
    cfg.image_std[0] = 0.5f, cfg.image_std[1] = 0.25f, cfg.image_std[2] = 2.0f;
    uint8_t *rgb = malloc((size_t)rh * rw * 3);
    for (int i = 0; i < rh * rw * 3; i++) rgb[i] = (uint8_t)((i * 7919) % 251);
    vision_pixels pv;
    char err[256];
    REQUIRE(vision_patchify(rgb, rw, rh, &cfg, &pv, err, sizeof err) == 0);
    const int gh = rh / P, gw = rw / P;
    CHECK_EQ_INT(pv.grid_t, 1);
    CHECK_EQ_INT(pv.grid_h, gh);
    CHECK_EQ_INT(pv.grid_w, gw);
    CHECK_EQ_INT(pv.patch_dim, C * T * P * P);
    int64_t shape[10] = {1, 1, T, C, gh / M, M, P, gw / M, M, P};
    int perm[10] = {0, 1, 4, 7, 5, 8, 3, 2, 6, 9};
    int64_t stride[10];
    stride[9] = 1;
    for (int d = 8; d >= 0; d--) stride[d] = stride[d + 1] * shape[d + 1];
    int64_t total = (int64_t)gh * gw * C * T * P * P, bad = 0;
    for (int64_t flat = 0; flat < total; flat++) {
        /* unravel flat over the transposed shape, then ravel in the original order */
        int64_t rem = flat, off = 0;
        for (int d = 9; d >= 0; d--) {
            int64_t idx = rem % shape[perm[d]];
            rem /= shape[perm[d]];
            off += idx * stride[perm[d]];
        }
        /* off indexes frames[t][c][y][x] (C order over T, C, H, W) */
        int64_t x = off % rw, y = (off / rw) % rh, c = (off / ((int64_t)rw * rh)) % C;
        float r = (float)((double)rgb[(y * rw + x) * 3 + c] * (1.0 / 255.0));
        float want = (r - cfg.image_mean[c]) / cfg.image_std[c];
        if (pv.data[flat] != want && bad++ < 5)
            test_fail(__FILE__, __LINE__, "pixel_values[%lld] = %g, want %g", (long long)flat, pv.data[flat], want);
    }
    CHECK_EQ_INT(bad, 0);
    vision_pixels_free(&pv);
    /* sizes that are not multiples of patch * merge are refused */
    CHECK_EQ_INT(vision_patchify(rgb, rw - 1, rh, &cfg, &pv, err, sizeof err), CINFER_EINVAL);
    free(rgb);
}

TEST(pp_resize_identity_and_errors) {
    uint8_t src[5 * 3 * 3], dst[5 * 3 * 3];
    for (int i = 0; i < 45; i++) src[i] = (uint8_t)(i * 5);
    char err[256];
    REQUIRE(vision_resize_bicubic(src, 5, 3, dst, 5, 3, err, sizeof err) == 0);
    CHECK(!memcmp(src, dst, sizeof src));
    CHECK_EQ_INT(vision_resize_bicubic(src, 5, 3, dst, 0, 3, err, sizeof err), CINFER_EINVAL);
    /* a constant image stays constant at any size (the weights sum to one in fixed point) */
    uint8_t flat[7 * 4 * 3];
    memset(flat, 200, sizeof flat);
    uint8_t big[23 * 19 * 3];
    REQUIRE(vision_resize_bicubic(flat, 7, 4, big, 23, 19, err, sizeof err) == 0);
    int ok = 1;
    for (size_t i = 0; i < sizeof big; i++) ok &= big[i] == 200;
    CHECK(ok);
}

TEST(pp_config_parse) {
    const char *js = "{\"size\": {\"longest_edge\": 16777216, \"shortest_edge\": 65536}, \"patch_size\": 16,"
                     " \"temporal_patch_size\": 2, \"merge_size\": 2, \"image_mean\": [0.5, 0.5, 0.5],"
                     " \"image_std\": [0.5, 0.5, 0.5], \"processor_class\": \"Qwen3VLProcessor\","
                     " \"image_processor_type\": \"Qwen2VLImageProcessorFast\", \"rescale_factor\": 0.00392156862745098,"
                     " \"resample\": 3, \"do_convert_rgb\": true}";
    vision_pp_config c;
    char err[256];
    REQUIRE(vision_pp_config_parse(js, strlen(js), &c, err, sizeof err) == 0);
    vision_pp_config d = vision_pp_default_config();
    CHECK_EQ_INT(c.patch_size, 16);
    CHECK_EQ_INT(c.min_pixels, 65536);
    CHECK_EQ_INT(c.max_pixels, 16777216);
    CHECK(c.rescale_factor == d.rescale_factor); /* 0.00392156862745098 is the double nearest 1/255 */
    CHECK(c.image_mean[1] == 0.5f && c.image_std[2] == 0.5f);
    const char *js2 = "{\"min_pixels\": 3136, \"max_pixels\": 1003520, \"patch_size\": 14,"
                      " \"image_mean\": [0.48145466, 0.4578275, 0.40821073]}";
    REQUIRE(vision_pp_config_parse(js2, strlen(js2), &c, err, sizeof err) == 0);
    CHECK_EQ_INT(c.min_pixels, 3136);
    CHECK_EQ_INT(c.max_pixels, 1003520);
    CHECK_EQ_INT(c.patch_size, 14);
    CHECK(c.image_mean[0] == 0.48145466f);
    const char *bad[] = {"{\"resample\": 2}", "{\"patch_size\": 0}", "{\"image_std\": [0.5, 0, 0.5]}",
                         "{\"image_mean\": [0.5, 0.5]}", "{\"do_normalize\": false}", "[1]", "{\"size\": 5}",
                         "{\"min_pixels\": 100, \"max_pixels\": 10}", "{"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_MSG(vision_pp_config_parse(bad[i], strlen(bad[i]), &c, err, sizeof err) < 0, "accepted %s", bad[i]);
}

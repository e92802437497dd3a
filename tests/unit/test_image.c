/* test_image.c — image decoding against PIL's pixels (tests/fixtures/images/goldens.json, made by
 * tools/oracle/image_goldens.py with Pillow 9.4 on libjpeg-turbo 2.1 / libwebp 1.2), header probes,
 * limits checked before decoding, malformed and truncated input. Also the golden helpers that
 * test_preprocess.c shares (imgtest_*). */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cinfer.h"
#include "test.h"
#include "util/file.h"
#include "vision/image.h"

/* The checksum tools/oracle/image_goldens.py writes (see its docstring). */
uint64_t imgtest_csum(const void *data, size_t n) {
    const uint8_t *p = data;
    uint64_t s = 0;
    for (size_t i = 0; i * 8 < n; i++) {
        uint64_t w = 0;
        size_t k = n - i * 8 < 8 ? n - i * 8 : 8;
        for (size_t j = 0; j < k; j++) w |= (uint64_t)p[i * 8 + j] << (8 * j);
        uint64_t x = (w ^ ((uint64_t)i * 0x9E3779B97F4A7C15ull)) * 0xBF58476D1CE4E5B9ull;
        x ^= x >> 29;
        s += x;
    }
    return s ^ (uint64_t)n;
}

int imgtest_csum_eq(const void *data, size_t n, const char *hex) {
    char buf[32];
    snprintf(buf, sizeof buf, "%016llx", (unsigned long long)imgtest_csum(data, n));
    return hex && !strcmp(buf, hex);
}

/* goldens.json, or NULL with a test failure naming the generator. */
json_t *imgtest_goldens(void) {
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s/images/goldens.json", test_fixtures_dir());
    char *buf;
    size_t len;
    if (file_read_all(path, 16 << 20, &buf, &len, err, sizeof err)) {
        test_fail(__FILE__, __LINE__, "%s (run tools/oracle/image_goldens.py)", err);
        return NULL;
    }
    json_error_t je;
    json_t *j = json_loadb(buf, len, 0, &je);
    free(buf);
    if (!j) test_fail(__FILE__, __LINE__, "goldens.json: %s", je.text);
    return j;
}

/* Reads tests/fixtures/images/<name>. */
int imgtest_read(const char *name, uint8_t **data, size_t *len) {
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s/images/%s", test_fixtures_dir(), name);
    char *buf;
    if (file_read_all(path, 64 << 20, &buf, len, err, sizeof err)) {
        test_fail(__FILE__, __LINE__, "%s", err);
        return -1;
    }
    *data = (uint8_t *)buf;
    return 0;
}

/* Decodes a fixture; fails the test (with the decoder's message) when it does not decode. */
int imgtest_decode(const char *name, image_rgb *img) {
    uint8_t *d;
    size_t n;
    if (imgtest_read(name, &d, &n)) return -1;
    char err[256];
    int rc = image_decode(d, n, NULL, img, err, sizeof err);
    free(d);
    if (rc) test_fail(__FILE__, __LINE__, "%s: %s", name, err);
    return rc;
}

static image_format fmt_of_name(const char *name) {
    const char *dot = strrchr(name, '.');
    if (!dot) return IMAGE_FMT_UNKNOWN;
    if (!strcmp(dot, ".png")) return IMAGE_FMT_PNG;
    if (!strcmp(dot, ".jpg")) return IMAGE_FMT_JPEG;
    if (!strcmp(dot, ".gif")) return IMAGE_FMT_GIF;
    if (!strcmp(dot, ".bmp")) return IMAGE_FMT_BMP;
    if (!strcmp(dot, ".webp")) return IMAGE_FMT_WEBP;
    return IMAGE_FMT_UNKNOWN;
}

/* Every fixture decodes to exactly PIL's RGB pixels (Image.open + exif_transpose + convert("RGB")). */
TEST(image_decode_matches_pil) {
    json_t *g = imgtest_goldens();
    REQUIRE(g);
    json_t *imgs = json_object_get(g, "images");
    REQUIRE(json_array_size(imgs) >= 50);
    size_t i;
    json_t *e;
    int n_fmt[6] = {0};
    json_array_foreach(imgs, i, e) {
        const char *name = json_string_value(json_object_get(e, "file"));
        image_rgb img;
        if (imgtest_decode(name, &img)) continue;
        int w = (int)json_integer_value(json_object_get(e, "width"));
        int h = (int)json_integer_value(json_object_get(e, "height"));
        CHECK_MSG(img.width == w && img.height == h, "%s: %dx%d, PIL %dx%d", name, img.width, img.height, w, h);
        if (img.width == w && img.height == h)
            CHECK_MSG(imgtest_csum_eq(img.pixels, (size_t)w * h * 3, json_string_value(json_object_get(e, "rgb"))),
                      "%s: pixels differ from PIL's (mode %s)", name,
                      json_string_value(json_object_get(e, "pil_mode")));
        CHECK_MSG(img.format == fmt_of_name(name), "%s: format %s", name, image_format_name(img.format));
        n_fmt[img.format]++;
        image_free(&img);
    }
    /* every format is covered by several files */
    for (int f = IMAGE_FMT_PNG; f <= IMAGE_FMT_WEBP; f++)
        CHECK_MSG(n_fmt[f] >= 4, "%s: only %d fixtures", image_format_name((image_format)f), n_fmt[f]);
    json_decref(g);
}

TEST(image_alpha_is_dropped_not_composited) {
    /* rgba_97x61.png has alpha 0 in its first column: convert("RGB") keeps the stored colour there,
     * compositing on white would give 255s. The RGB must equal the opaque photo_97x61.png. */
    image_rgb a, b;
    REQUIRE(imgtest_decode("rgba_97x61.png", &a) == 0);
    REQUIRE(imgtest_decode("photo_97x61.png", &b) == 0);
    CHECK(a.had_alpha);
    CHECK(!b.had_alpha);
    REQUIRE(a.width == b.width && a.height == b.height);
    CHECK(!memcmp(a.pixels, b.pixels, (size_t)a.width * a.height * 3));
    image_free(&a);
    image_free(&b);
}

TEST(image_exif_orientation) {
    image_rgb ref;
    REQUIRE(imgtest_decode("exif_orient1.jpg", &ref) == 0);
    CHECK_EQ_INT(ref.orientation, 1);
    for (int o = 2; o <= 8; o++) {
        char name[64];
        snprintf(name, sizeof name, "exif_orient%d.jpg", o);
        image_rgb img;
        if (imgtest_decode(name, &img)) continue;
        CHECK_EQ_INT(img.orientation, o);
        /* same JPEG data, so the transposed pixels are a permutation of the reference's */
        int swap = o >= 5;
        CHECK_EQ_INT(img.width, swap ? ref.height : ref.width);
        CHECK_EQ_INT(img.height, swap ? ref.width : ref.height);
        if (o == 6) {
            /* ROTATE_270 (clockwise): output (x, y) = input (y, H-1-x) */
            const uint8_t *p = img.pixels + ((size_t)3 * img.width + 5) * 3;
            const uint8_t *q = ref.pixels + ((size_t)(ref.height - 1 - 5) * ref.width + 3) * 3;
            CHECK(!memcmp(p, q, 3));
        }
        image_free(&img);
    }
    image_free(&ref);
}

TEST(image_probe_headers) {
    json_t *g = imgtest_goldens();
    REQUIRE(g);
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(g, "images"), i, e) {
        const char *name = json_string_value(json_object_get(e, "file"));
        uint8_t *d;
        size_t n;
        if (imgtest_read(name, &d, &n)) continue;
        image_format f;
        int w, h;
        char err[256];
        int rc = image_probe(d, n, &f, &w, &h, err, sizeof err);
        CHECK_MSG(rc == 0, "%s: %s", name, err);
        CHECK_MSG(f == fmt_of_name(name), "%s: sniffed %s", name, image_format_name(f));
        int gw = (int)json_integer_value(json_object_get(e, "width")), gh = (int)json_integer_value(json_object_get(e, "height"));
        /* the header holds the stored size: before EXIF rotation, before a GIF frame grows the canvas */
        if (!strncmp(name, "exif_orient", 11) && name[11] >= '5') {
            int t = gw;
            gw = gh;
            gh = t;
        }
        if (strcmp(name, "frame_past_screen.gif"))
            CHECK_MSG(rc || (w == gw && h == gh), "%s: probe %dx%d, PIL %dx%d", name, w, h, gw, gh);
        free(d);
    }
    json_decref(g);
    image_format f;
    int w, h;
    char err[256];
    CHECK(image_probe((const uint8_t *)"", 0, &f, &w, &h, err, sizeof err) == CINFER_EFORMAT);
    CHECK(image_probe((const uint8_t *)"hello world, not an image", 25, &f, &w, &h, err, sizeof err) == CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "not an image");
}

/* ---- limits: refused from the header, before any decoding ---- */

static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

TEST(image_limits_refuse_before_decoding) {
    char err[256];
    image_rgb img;
    /* Headers claiming huge images, with no pixel data behind them. A decoder that allocated first
     * would try to get tens of GB (or fail with ENOMEM / a truncation error): the answer must be the
     * limit, from the header alone. */
    uint8_t png[64] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 13, 'I', 'H', 'D', 'R'};
    put_be32(png + 16, 100000);
    put_be32(png + 20, 100000);
    png[24] = 8, png[25] = 2;
    CHECK_EQ_INT(image_decode(png, sizeof png, NULL, &img, err, sizeof err), CINFER_ERANGE);
    CHECK_STR_CONTAINS(err, "PNG image 100000x100000");
    put_be32(png + 16, 20000);
    put_be32(png + 20, 20000); /* each side under 32768, 400M pixels over 89M */
    CHECK_EQ_INT(image_decode(png, sizeof png, NULL, &img, err, sizeof err), CINFER_ERANGE);
    CHECK_STR_CONTAINS(err, "pixels, over the limit");
    uint8_t jpg[] = {0xFF, 0xD8, 0xFF, 0xE0, 0, 4, 0, 0, 0xFF, 0xC0, 0, 11, 8, 0xFF, 0xF0, 0xFF, 0xF0, 1, 1, 0x11, 0, 0, 0};
    CHECK_EQ_INT(image_decode(jpg, sizeof jpg, NULL, &img, err, sizeof err), CINFER_ERANGE);
    CHECK_STR_CONTAINS(err, "JPEG image 65520x65520");
    uint8_t gif[32] = {'G', 'I', 'F', '8', '9', 'a', 0xFF, 0xFF, 0xFF, 0xFF};
    CHECK_EQ_INT(image_decode(gif, sizeof gif, NULL, &img, err, sizeof err), CINFER_ERANGE);
    uint8_t bmp[64] = {'B', 'M', [10] = 54, [14] = 40, [18] = 0x50, 0xC3, 0, 0, 0x50, 0xC3, 0, 0, 1, 0, 24};
    CHECK_EQ_INT(image_decode(bmp, sizeof bmp, NULL, &img, err, sizeof err), CINFER_ERANGE); /* 50000x50000 */
    uint8_t webp[40] = {'R', 'I', 'F', 'F', 32, 0, 0, 0, 'W', 'E', 'B', 'P', 'V', 'P', '8', 'X', 10, 0, 0, 0, 0, 0, 0, 0,
                        0xFF, 0x3F, 0, 0xFF, 0x3F, 0};
    CHECK_EQ_INT(image_decode(webp, sizeof webp, NULL, &img, err, sizeof err), CINFER_ERANGE); /* 16384x16384 */
    CHECK(img.pixels == NULL);

    /* real files against small limits: every format stops at the header */
    const char *files[] = {"photo_97x61.png", "photo_97x61_q95.jpg", "palette_97x61.gif", "photo_97x61_24.bmp",
                           "photo_97x61_q80.webp"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        uint8_t *d;
        size_t n;
        if (imgtest_read(files[i], &d, &n)) continue;
        image_limits lim = image_default_limits();
        lim.max_pixels = 97 * 61 - 1;
        CHECK_MSG(image_decode(d, n, &lim, &img, err, sizeof err) == CINFER_ERANGE, "%s: %s", files[i], err);
        lim = image_default_limits();
        lim.max_side = 96;
        CHECK_MSG(image_decode(d, n, &lim, &img, err, sizeof err) == CINFER_ERANGE, "%s: %s", files[i], err);
        lim = image_default_limits();
        lim.max_bytes = n - 1;
        CHECK_MSG(image_decode(d, n, &lim, &img, err, sizeof err) == CINFER_ERANGE, "%s: %s", files[i], err);
        lim.max_bytes = n;
        lim.max_pixels = 97 * 61;
        lim.max_side = 97;
        CHECK_MSG(image_decode(d, n, &lim, &img, err, sizeof err) == 0, "%s at its exact limits: %s", files[i], err);
        image_free(&img);
        free(d);
    }
}

/* ---- malformed input ---- */

TEST(image_truncated_and_garbage) {
    const char *files[] = {"photo_97x61.png", "interlaced_97x61.png", "photo_97x61_q95.jpg", "photo_97x61_prog.jpg",
                           "palette_97x61.gif", "palette_97x61_noint.gif", "photo_97x61_24.bmp", "palette_97x61_8.bmp",
                           "photo_97x61_q80.webp", "photo_97x61_lossless.webp"};
    char err[256];
    image_rgb img;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        uint8_t *d;
        size_t n;
        if (imgtest_read(files[i], &d, &n)) continue;
        /* cut inside the pixel data: an error naming the format, never a partial image */
        size_t cuts[] = {n / 2, n * 4 / 5, 40, 10};
        for (size_t k = 0; k < 4; k++) {
            int rc = image_decode(d, cuts[k], NULL, &img, err, sizeof err);
            CHECK_MSG(rc == CINFER_EFORMAT, "%s cut at %zu of %zu: rc %d (%s)", files[i], cuts[k], n, rc, rc ? err : "decoded");
            CHECK(img.pixels == NULL);
            if (rc) CHECK_STR_CONTAINS(err, image_format_name(fmt_of_name(files[i])));
        }
        /* the magic followed by noise */
        uint64_t st = 0x1234567 + i;
        for (size_t k = 16; k < n; k++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            d[k] = (uint8_t)(st >> 56);
        }
        int rc = image_decode(d, n, NULL, &img, err, sizeof err);
        CHECK_MSG(rc < 0, "%s with noise after the magic decoded", files[i]);
        image_free(&img);
        free(d);
    }
    uint8_t junk[100];
    for (int i = 0; i < 100; i++) junk[i] = (uint8_t)(i * 37 + 11);
    CHECK_EQ_INT(image_decode(junk, sizeof junk, NULL, &img, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "PNG, JPEG, GIF, BMP or WebP");
    CHECK_EQ_INT(image_decode(junk, 0, NULL, &img, err, sizeof err), CINFER_EFORMAT);
}

TEST(image_unsupported_variants) {
    char err[256];
    image_rgb img;
    /* RLE BMP: a clear "not supported", not a wrong picture */
    uint8_t *d;
    size_t n;
    REQUIRE(imgtest_read("palette_97x61_8.bmp", &d, &n) == 0);
    d[30] = 1; /* BI_RLE8 */
    CHECK_EQ_INT(image_decode(d, n, NULL, &img, err, sizeof err), CINFER_EUNSUPPORTED);
    CHECK_STR_CONTAINS(err, "RLE");
    free(d);
}

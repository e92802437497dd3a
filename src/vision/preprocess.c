/* preprocess.c — smart_resize, PIL's bicubic resample, normalisation and patchify for the Qwen3.5
 * vision tower. Every step reproduces the reference (transformers' slow/PIL image processor and
 * Pillow's libImaging/Resample.c) exactly: the same double-precision coefficient arithmetic, the
 * same fixed-point rounding, the same float32 normalisation, so pixel_values match bit for bit. */
#include "vision/preprocess.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/alloc.h"
#include "util/err.h"

/* The coefficient arithmetic must round like Pillow's (compiled without contraction on x86-64):
 * no fused multiply-add. gcc in ISO C mode does not contract; clang needs to be told. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

vision_pp_config vision_pp_default_config(void) {
    vision_pp_config c = {
        .patch_size = 16,
        .temporal_patch_size = 2,
        .merge_size = 2,
        .min_pixels = 65536,
        .max_pixels = 16777216,
        .rescale_factor = 1.0 / 255.0,
        .image_mean = {0.5f, 0.5f, 0.5f},
        .image_std = {0.5f, 0.5f, 0.5f},
    };
    return c;
}

/* ---- preprocessor_config.json ---- */

static int json_get_int(json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out, char *err, size_t errlen) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v)) return ci_err(err, errlen, CINFER_EFORMAT, "preprocessor_config: %s is not an integer", key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return ci_err(err, errlen, CINFER_ERANGE, "preprocessor_config: %s = %lld outside [%lld, %lld]", key,
                      (long long)x, (long long)lo, (long long)hi);
    *out = x;
    return 1;
}

static int json_get_triple(json_t *o, const char *key, float out[3], int positive, char *err, size_t errlen) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    double x[3];
    if (json_is_number(v)) {
        x[0] = x[1] = x[2] = json_number_value(v);
    } else if (json_is_array(v) && json_array_size(v) == 3) {
        for (int i = 0; i < 3; i++) {
            json_t *e = json_array_get(v, (size_t)i);
            if (!json_is_number(e)) return ci_err(err, errlen, CINFER_EFORMAT, "preprocessor_config: %s[%d] is not a number", key, i);
            x[i] = json_number_value(e);
        }
    } else {
        return ci_err(err, errlen, CINFER_EFORMAT, "preprocessor_config: %s must be a number or 3 numbers", key);
    }
    for (int i = 0; i < 3; i++) {
        if (!isfinite(x[i]) || (positive && !(x[i] > 0)))
            return ci_err(err, errlen, CINFER_ERANGE, "preprocessor_config: %s[%d] is not a valid value", key, i);
        out[i] = (float)x[i]; /* numpy builds the mean/std arrays in the image's dtype, float32 */
    }
    return 1;
}

static int json_require_true(json_t *o, const char *key, char *err, size_t errlen) {
    json_t *v = json_object_get(o, key);
    if (v && json_is_false(v))
        return ci_err(err, errlen, CINFER_EUNSUPPORTED, "preprocessor_config: %s = false is not supported", key);
    return 0;
}

int vision_pp_config_parse(const char *data, size_t size, vision_pp_config *out, char *err, size_t errlen) {
    vision_pp_config c = vision_pp_default_config();
    json_error_t je;
    json_t *root = json_loadb(data, size, JSON_REJECT_DUPLICATES, &je);
    if (!root) return ci_err(err, errlen, CINFER_EFORMAT, "preprocessor_config: %s (line %d)", je.text, je.line);
    int rc = 0;
    if (!json_is_object(root)) {
        rc = ci_err(err, errlen, CINFER_EFORMAT, "preprocessor_config: not a JSON object");
        goto done;
    }
    int64_t v;
    if ((rc = json_get_int(root, "patch_size", 1, 1024, &v, err, errlen)) < 0) goto done;
    if (rc) c.patch_size = (int)v;
    if ((rc = json_get_int(root, "temporal_patch_size", 1, 16, &v, err, errlen)) < 0) goto done;
    if (rc) c.temporal_patch_size = (int)v;
    if ((rc = json_get_int(root, "merge_size", 1, 16, &v, err, errlen)) < 0) goto done;
    if (rc) c.merge_size = (int)v;
    json_t *sz = json_object_get(root, "size");
    if (sz && json_is_object(sz)) {
        if ((rc = json_get_int(sz, "shortest_edge", 1, INT64_C(1) << 40, &v, err, errlen)) < 0) goto done;
        if (rc) c.min_pixels = v;
        if ((rc = json_get_int(sz, "longest_edge", 1, INT64_C(1) << 40, &v, err, errlen)) < 0) goto done;
        if (rc) c.max_pixels = v;
        if ((rc = json_get_int(sz, "min_pixels", 1, INT64_C(1) << 40, &v, err, errlen)) < 0) goto done;
        if (rc) c.min_pixels = v;
        if ((rc = json_get_int(sz, "max_pixels", 1, INT64_C(1) << 40, &v, err, errlen)) < 0) goto done;
        if (rc) c.max_pixels = v;
    } else if (sz && !json_is_null(sz)) {
        rc = ci_err(err, errlen, CINFER_EFORMAT, "preprocessor_config: size is not an object");
        goto done;
    }
    /* The processor's __init__ lets min_pixels / max_pixels override size{} (backward compatibility). */
    if ((rc = json_get_int(root, "min_pixels", 1, INT64_C(1) << 40, &v, err, errlen)) < 0) goto done;
    if (rc) c.min_pixels = v;
    if ((rc = json_get_int(root, "max_pixels", 1, INT64_C(1) << 40, &v, err, errlen)) < 0) goto done;
    if (rc) c.max_pixels = v;
    json_t *rf = json_object_get(root, "rescale_factor");
    if (rf && !json_is_null(rf)) {
        if (!json_is_number(rf) || !isfinite(json_number_value(rf)) || !(json_number_value(rf) > 0)) {
            rc = ci_err(err, errlen, CINFER_EFORMAT, "preprocessor_config: rescale_factor is not a positive number");
            goto done;
        }
        c.rescale_factor = json_number_value(rf);
    }
    if ((rc = json_get_triple(root, "image_mean", c.image_mean, 0, err, errlen)) < 0) goto done;
    if ((rc = json_get_triple(root, "image_std", c.image_std, 1, err, errlen)) < 0) goto done;
    if ((rc = json_get_int(root, "resample", 0, 5, &v, err, errlen)) < 0) goto done;
    if (rc && v != 3) {
        rc = ci_err(err, errlen, CINFER_EUNSUPPORTED, "preprocessor_config: resample %lld (only 3, BICUBIC)", (long long)v);
        goto done;
    }
    const char *must[] = {"do_resize", "do_rescale", "do_normalize", "do_convert_rgb"};
    for (size_t i = 0; i < sizeof must / sizeof must[0]; i++)
        if ((rc = json_require_true(root, must[i], err, errlen)) < 0) goto done;
    if (c.min_pixels > c.max_pixels) {
        rc = ci_err(err, errlen, CINFER_ERANGE, "preprocessor_config: min_pixels %lld > max_pixels %lld",
                    (long long)c.min_pixels, (long long)c.max_pixels);
        goto done;
    }
    rc = 0;
    *out = c;
done:
    json_decref(root);
    return rc;
}

/* ---- smart_resize ---- */

int vision_smart_resize(int height, int width, int factor, int64_t min_pixels, int64_t max_pixels, int *out_h,
                        int *out_w, char *err, size_t errlen) {
    if (height <= 0 || width <= 0) return ci_err(err, errlen, CINFER_EINVAL, "image size %dx%d is empty", width, height);
    if (factor <= 0 || min_pixels < 0 || max_pixels <= 0)
        return ci_err(err, errlen, CINFER_EINVAL, "smart_resize: bad factor %d or pixel bounds", factor);
    double hi = height > width ? height : width, lo = height > width ? width : height;
    if (hi / lo > 200.0)
        return ci_err(err, errlen, CINFER_EINVAL, "image aspect ratio %.1f (%dx%d) is over 200", hi / lo, width, height);
    /* Python: round(height / factor) * factor — true division in double, round half to even
     * (rint in the default rounding mode). No lower clamp here: 0 falls into the min_pixels branch. */
    double h = height, w = width, f = factor;
    int64_t hb = (int64_t)rint(h / f) * factor;
    int64_t wb = (int64_t)rint(w / f) * factor;
    if (hb * wb > max_pixels) {
        double beta = sqrt((h * w) / (double)max_pixels);
        hb = (int64_t)floor(h / beta / f) * factor;
        wb = (int64_t)floor(w / beta / f) * factor;
        if (hb < factor) hb = factor;
        if (wb < factor) wb = factor;
    } else if (hb * wb < min_pixels) {
        double beta = sqrt((double)min_pixels / (h * w));
        hb = (int64_t)ceil(h * beta / f) * factor;
        wb = (int64_t)ceil(w * beta / f) * factor;
    }
    if (hb <= 0 || wb <= 0 || hb > INT_MAX / 4 || wb > INT_MAX / 4)
        return ci_err(err, errlen, CINFER_ERANGE, "smart_resize: %dx%d gives %lldx%lld", width, height, (long long)wb,
                      (long long)hb);
    *out_h = (int)hb;
    *out_w = (int)wb;
    return 0;
}

/* ---- PIL's ImagingResample, BICUBIC, 8 bits per channel ---- */

#define PP_PRECISION_BITS (32 - 8 - 2) /* Pillow: 8 bits of result, 2 bits of headroom for overshoot */

static double bicubic_filter(double x) {
    const double a = -0.5; /* Pillow's choice (Keys, a = -0.5) */
    if (x < 0.0) x = -x;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
}

/* One axis: for each output index, the first input index and count (bounds) and ksize fixed-point
 * weights. The arithmetic is Pillow's precompute_coeffs + normalize_coeffs_8bpc, operation for
 * operation (box = [0, in_size] as float, as Image.resize passes it). */
typedef struct resample_axis {
    int ksize;
    int *bounds;    /* [out][2]: xmin, count */
    int32_t *coeff; /* [out][ksize] */
} resample_axis;

static void axis_free(resample_axis *a) {
    free(a->bounds);
    free(a->coeff);
}

static int axis_init(resample_axis *a, int in_size, int out_size, char *err, size_t errlen) {
    memset(a, 0, sizeof *a);
    float in0 = 0.0f, in1 = (float)in_size;
    double scale = (double)(in1 - in0) / out_size;
    double filterscale = scale < 1.0 ? 1.0 : scale;
    double support = 2.0 * filterscale; /* BICUBIC support 2, widened by the downscale factor */
    int ksize = (int)ceil(support) * 2 + 1;
    size_t n;
    if (ci_mul_overflow((size_t)out_size, (size_t)ksize, &n) || n > SIZE_MAX / sizeof(double))
        return ci_err(err, errlen, CINFER_ERANGE, "resize %d -> %d: coefficient table too large", in_size, out_size);
    double *kk = malloc(n * sizeof(double) + 1);
    a->coeff = malloc(n * sizeof(int32_t) + 1);
    a->bounds = malloc((size_t)out_size * 2 * sizeof(int) + 1);
    if (!kk || !a->coeff || !a->bounds) {
        free(kk);
        axis_free(a);
        return ci_err(err, errlen, CINFER_ENOMEM, "resize %d -> %d: out of memory for coefficients", in_size, out_size);
    }
    a->ksize = ksize;
    for (int xx = 0; xx < out_size; xx++) {
        double center = in0 + (xx + 0.5) * scale;
        double ww = 0.0;
        double ss = 1.0 / filterscale;
        int xmin = (int)(center - support + 0.5);
        if (xmin < 0) xmin = 0;
        int xmax = (int)(center + support + 0.5);
        if (xmax > in_size) xmax = in_size;
        xmax -= xmin;
        double *k = &kk[(size_t)xx * ksize];
        int x;
        for (x = 0; x < xmax; x++) {
            double wgt = bicubic_filter((x + xmin - center + 0.5) * ss);
            k[x] = wgt;
            ww += wgt;
        }
        for (x = 0; x < xmax; x++)
            if (ww != 0.0) k[x] /= ww;
        for (; x < ksize; x++) k[x] = 0;
        a->bounds[xx * 2 + 0] = xmin;
        a->bounds[xx * 2 + 1] = xmax;
    }
    for (size_t i = 0; i < n; i++) {
        /* Round half away from zero, then truncate toward zero: Pillow's exact expression. */
        if (kk[i] < 0)
            a->coeff[i] = (int32_t)(-0.5 + kk[i] * (1 << PP_PRECISION_BITS));
        else
            a->coeff[i] = (int32_t)(0.5 + kk[i] * (1 << PP_PRECISION_BITS));
    }
    free(kk);
    return 0;
}

static inline uint8_t clip8(int32_t ss) {
    int32_t v = ss >> PP_PRECISION_BITS; /* arithmetic shift: Pillow indexes a table with it */
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* Horizontal pass over rows [y0, y0 + rows) of src (width sw) into dst (width dw). */
static void resample_h(const uint8_t *src, int sw, int y0, int rows, uint8_t *dst, int dw, const resample_axis *ax) {
    for (int yy = 0; yy < rows; yy++) {
        const uint8_t *in = src + ((size_t)(y0 + yy) * sw) * 3;
        uint8_t *out = dst + (size_t)yy * dw * 3;
        for (int xx = 0; xx < dw; xx++) {
            int xmin = ax->bounds[xx * 2], xmax = ax->bounds[xx * 2 + 1];
            const int32_t *k = &ax->coeff[(size_t)xx * ax->ksize];
            int32_t s0 = 1 << (PP_PRECISION_BITS - 1), s1 = s0, s2 = s0;
            const uint8_t *p = in + (size_t)xmin * 3;
            for (int x = 0; x < xmax; x++) {
                s0 += p[x * 3 + 0] * k[x];
                s1 += p[x * 3 + 1] * k[x];
                s2 += p[x * 3 + 2] * k[x];
            }
            out[xx * 3 + 0] = clip8(s0);
            out[xx * 3 + 1] = clip8(s1);
            out[xx * 3 + 2] = clip8(s2);
        }
    }
}

/* Vertical pass: src has width w; bounds are relative to src's first row minus y_shift. */
static void resample_v(const uint8_t *src, int w, int y_shift, uint8_t *dst, int dh, const resample_axis *ax) {
    for (int yy = 0; yy < dh; yy++) {
        int ymin = ax->bounds[yy * 2] - y_shift, ymax = ax->bounds[yy * 2 + 1];
        const int32_t *k = &ax->coeff[(size_t)yy * ax->ksize];
        uint8_t *out = dst + (size_t)yy * w * 3;
        for (int xx = 0; xx < w * 3; xx++) {
            int32_t s = 1 << (PP_PRECISION_BITS - 1);
            const uint8_t *p = src + (size_t)ymin * w * 3 + xx;
            for (int y = 0; y < ymax; y++) s += p[(size_t)y * w * 3] * k[y];
            out[xx] = clip8(s);
        }
    }
}

int vision_resize_bicubic(const uint8_t *src, int sw, int sh, uint8_t *dst, int dw, int dh, char *err,
                          size_t errlen) {
    if (sw <= 0 || sh <= 0 || dw <= 0 || dh <= 0)
        return ci_err(err, errlen, CINFER_EINVAL, "resize %dx%d -> %dx%d: empty size", sw, sh, dw, dh);
    int need_h = dw != sw, need_v = dh != sh;
    if (!need_h && !need_v) {
        memcpy(dst, src, (size_t)sw * sh * 3);
        return 0;
    }
    resample_axis vax, hax;
    int rc = axis_init(&vax, sh, dh, err, errlen);
    if (rc) return rc;
    /* Pillow runs the horizontal pass only over the source rows the vertical pass will read. */
    int y_first = vax.bounds[0];
    int y_last = vax.bounds[dh * 2 - 2] + vax.bounds[dh * 2 - 1];
    if (!need_h) {
        resample_v(src, sw, 0, dst, dh, &vax);
        axis_free(&vax);
        return 0;
    }
    if ((rc = axis_init(&hax, sw, dw, err, errlen))) {
        axis_free(&vax);
        return rc;
    }
    if (!need_v) {
        resample_h(src, sw, 0, sh, dst, dw, &hax);
    } else {
        uint8_t *tmp = malloc((size_t)(y_last - y_first) * dw * 3 + 1);
        if (!tmp) {
            axis_free(&vax);
            axis_free(&hax);
            return ci_err(err, errlen, CINFER_ENOMEM, "resize: out of memory for a %dx%d intermediate", dw, y_last - y_first);
        }
        resample_h(src, sw, y_first, y_last - y_first, tmp, dw, &hax);
        resample_v(tmp, dw, y_first, dst, dh, &vax);
        free(tmp);
    }
    axis_free(&vax);
    axis_free(&hax);
    return 0;
}

/* ---- rescale, normalize, patchify ---- */

int vision_patchify(const uint8_t *rgb, int rw, int rh, const vision_pp_config *cfg, vision_pixels *out, char *err,
                    size_t errlen) {
    memset(out, 0, sizeof *out);
    const int P = cfg->patch_size, M = cfg->merge_size, T = cfg->temporal_patch_size;
    if (P <= 0 || M <= 0 || T <= 0) return ci_err(err, errlen, CINFER_EINVAL, "patchify: bad patch/merge/temporal size");
    if (rw <= 0 || rh <= 0 || rw % (P * M) || rh % (P * M))
        return ci_err(err, errlen, CINFER_EINVAL, "patchify: %dx%d is not a multiple of %d", rw, rh, P * M);
    /* value = float32(float64(u8) * rescale) then (x - mean) / std in float32, as numpy does it:
     * a table per channel makes that exact and cheap. */
    float lut[3][256];
    for (int c = 0; c < 3; c++)
        for (int v = 0; v < 256; v++) {
            float r = (float)((double)v * cfg->rescale_factor);
            lut[c][v] = (r - cfg->image_mean[c]) / cfg->image_std[c];
        }
    const int gh = rh / P, gw = rw / P, gt = 1; /* one image = one temporal group of T identical frames */
    const int dim = 3 * T * P * P;
    int64_t n = (int64_t)gt * gh * gw;
    size_t bytes;
    if (ci_mul_overflow((size_t)n, (size_t)dim * sizeof(float), &bytes))
        return ci_err(err, errlen, CINFER_ERANGE, "patchify: %lld patches overflow", (long long)n);
    float *pv = malloc(bytes);
    if (!pv) return ci_err(err, errlen, CINFER_ENOMEM, "patchify: out of memory (%zu bytes)", bytes);
    /* Row order: [t][block_y][block_x][my][mx]; column order: [c][t][py][px] (spec §6.1). */
    int64_t row = 0;
    for (int by = 0; by < gh / M; by++)
        for (int bx = 0; bx < gw / M; bx++)
            for (int my = 0; my < M; my++)
                for (int mx = 0; mx < M; mx++, row++) {
                    float *o = pv + row * dim;
                    int y0 = (by * M + my) * P, x0 = (bx * M + mx) * P;
                    for (int c = 0; c < 3; c++) {
                        float *oc = o + (size_t)c * T * P * P;
                        for (int py = 0; py < P; py++) {
                            const uint8_t *s = rgb + ((size_t)(y0 + py) * rw + x0) * 3 + c;
                            for (int px = 0; px < P; px++) oc[py * P + px] = lut[c][s[px * 3]];
                        }
                        for (int t = 1; t < T; t++) memcpy(oc + (size_t)t * P * P, oc, (size_t)P * P * sizeof(float));
                    }
                }
    out->data = pv;
    out->n_patches = n;
    out->patch_dim = dim;
    out->grid_t = gt;
    out->grid_h = gh;
    out->grid_w = gw;
    return 0;
}

int vision_preprocess(const uint8_t *rgb, int w, int h, const vision_pp_config *cfg, vision_pixels *out, char *err,
                      size_t errlen) {
    memset(out, 0, sizeof *out);
    int rh, rw;
    int rc = vision_smart_resize(h, w, cfg->patch_size * cfg->merge_size, cfg->min_pixels, cfg->max_pixels, &rh, &rw,
                                 err, errlen);
    if (rc) return rc;
    size_t bytes;
    if (ci_mul_overflow((size_t)rh * 3, (size_t)rw, &bytes))
        return ci_err(err, errlen, CINFER_ERANGE, "resize target %dx%d too large", rw, rh);
    uint8_t *resized = malloc(bytes);
    if (!resized) return ci_err(err, errlen, CINFER_ENOMEM, "out of memory for a %dx%d image", rw, rh);
    rc = vision_resize_bicubic(rgb, w, h, resized, rw, rh, err, errlen);
    if (!rc) rc = vision_patchify(resized, rw, rh, cfg, out, err, errlen);
    free(resized);
    return rc;
}

void vision_pixels_free(vision_pixels *p) {
    if (!p) return;
    free(p->data);
    memset(p, 0, sizeof *p);
}

/* mm.c — images on the public API (decode → preprocess → vision tower) and the multimodal prompt layout:
 * image token runs checked against the images, features assigned in order, mRoPE positions as transformers'
 * Qwen3_5Model.get_rope_index computes them (spec §6.3). */
#include "runtime/mm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/qwen35.h"
#include "runtime/ctx_internal.h"
#include "util/alloc.h"
#include "util/err.h"
#include "util/file.h"
#include "vision/image.h"

#define PP_MAX_FILE ((size_t)1 << 20)

void mm_model_load(cinfer_model *cm, const char *dir) {
    cm->pp = vision_pp_default_config();
    cm->pp_err[0] = 0;
    const model *m = cm->m;
    if (!m->vis.present) return;
    char *path = path_join(dir, "preprocessor_config.json"), *text = NULL;
    size_t len;
    char e[200];
    if (file_exists(path)) {
        if (file_read_all(path, PP_MAX_FILE, &text, &len, e, sizeof e) ||
            vision_pp_config_parse(text, len, &cm->pp, e, sizeof e))
            snprintf(cm->pp_err, sizeof cm->pp_err, "%s: %s", path, e);
    }
    free(text);
    free(path);
    const vision_weights *v = &m->vis;
    if (!cm->pp_err[0] && (cm->pp.patch_size != v->patch || cm->pp.temporal_patch_size != v->temporal ||
                           cm->pp.merge_size != v->merge))
        snprintf(cm->pp_err, sizeof cm->pp_err,
                 "preprocessor_config.json (patch %d, temporal %d, merge %d) disagrees with vision_config "
                 "(%d, %d, %d)",
                 cm->pp.patch_size, cm->pp.temporal_patch_size, cm->pp.merge_size, v->patch, v->temporal,
                 v->merge);
}

/* Mixes 8-byte words with their index (order matters), splitmix-style; then the length. */
static uint64_t hash_bytes(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    uint64_t i = 0;
    for (; n >= 8; n -= 8, p += 8, i++) {
        uint64_t w;
        memcpy(&w, p, 8);
        uint64_t x = (w ^ (i * 0x9E3779B97F4A7C15ull)) * 0xBF58476D1CE4E5B9ull;
        x ^= x >> 29;
        h = (h ^ x) * 0x94D049BB133111EBull;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ w ^ (n << 56)) * 0x94D049BB133111EBull;
    return h ^ (h >> 31);
}

int cinfer_image_load(const cinfer_model *cm, const void *data, size_t size, int64_t max_pixels,
                      cinfer_image **out, char *err, size_t errlen) {
    if (!cm || !out || (!data && size))
        return ci_err(err, errlen, CINFER_EINVAL, "cinfer_image_load: bad arguments");
    *out = NULL;
    const model *m = cm->m;
    if (!m->vis.present)
        return ci_err(err, errlen, CINFER_EUNSUPPORTED,
                      "this model has no vision tower: images are not accepted");
    if (cm->pp_err[0]) return ci_err(err, errlen, CINFER_EFORMAT, "%s", cm->pp_err);
    image_limits lim = image_default_limits();
    if (max_pixels > 0 && max_pixels < lim.max_pixels) lim.max_pixels = max_pixels;
    image_rgb img;
    int rc = image_decode(data, size, &lim, &img, err, errlen);
    if (rc) return rc;
    cinfer_image *im = xcalloc(1, sizeof *im);
    im->width = img.width;
    im->height = img.height;
    rc = vision_preprocess(img.pixels, img.width, img.height, &cm->pp, &im->px, err, errlen);
    image_free(&img);
    if (rc) {
        free(im);
        return rc;
    }
    vision_grid g = {im->px.grid_t, im->px.grid_h, im->px.grid_w};
    int64_t np;
    if ((rc = vision_check_grids(&m->vis, &g, 1, &np, err, errlen))) {
        cinfer_image_free(im);
        return rc;
    }
    im->n_tokens = (int)vision_tokens(&m->vis, g);
    im->H = m->H;
    int grid[3] = {g.t, g.h, g.w};
    im->hash = hash_bytes(hash_bytes(0x243F6A8885A308D3ull, grid, sizeof grid), im->px.data,
                          (size_t)im->px.n_patches * im->px.patch_dim * sizeof(float));
    *out = im;
    return 0;
}

int cinfer_image_n_tokens(const cinfer_image *im) {
    return im ? im->n_tokens : 0;
}

void cinfer_image_get_grid(const cinfer_image *im, int *t, int *h, int *w) {
    if (t) *t = im->px.grid_t;
    if (h) *h = im->px.grid_h;
    if (w) *w = im->px.grid_w;
}

void cinfer_image_get_size(const cinfer_image *im, int *width, int *height) {
    if (width) *width = im->width;
    if (height) *height = im->height;
}

uint64_t cinfer_image_hash(const cinfer_image *im) {
    return im ? im->hash : 0;
}

const float *cinfer_image_features(const cinfer_image *im) {
    return im ? im->feat : NULL;
}

cinfer_image *cinfer_image_dup(const cinfer_image *im) {
    if (!im) return NULL;
    cinfer_image *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    *d = *im;
    size_t pb = (size_t)im->px.n_patches * im->px.patch_dim * sizeof(float);
    size_t fb = im->feat ? (size_t)im->n_tokens * im->H * sizeof(float) : 0;
    d->px.data = malloc(pb ? pb : 1);
    d->feat = im->feat ? malloc(fb ? fb : 1) : NULL;
    if (!d->px.data || (im->feat && !d->feat)) {
        free(d->px.data);
        free(d->feat);
        free(d);
        return NULL;
    }
    memcpy(d->px.data, im->px.data, pb);
    if (fb) memcpy(d->feat, im->feat, fb);
    return d;
}

void cinfer_image_free(cinfer_image *im) {
    if (!im) return;
    vision_pixels_free(&im->px);
    free(im->feat);
    free(im);
}

int mm_image_encode(const model *m, cinfer_image *im, threadpool *tp, char *err, size_t errlen) {
    if (im->feat) return 0;
    if (im->H != m->H) return ci_err(err, errlen, CINFER_EINVAL, "the image was loaded for another model");
    float *f = ci_try_alloc((size_t)im->n_tokens * m->H * sizeof(float));
    if (!f)
        return ci_err(err, errlen, CINFER_ENOMEM, "cannot allocate the features of an image of %d tokens",
                      im->n_tokens);
    vision_grid g = {im->px.grid_t, im->px.grid_h, im->px.grid_w};
    int rc = vision_encode(m, tp, im->px.data, &g, 1, f, NULL, NULL, err, errlen);
    if (rc) {
        free(f);
        return rc;
    }
    im->feat = f;
    return 0;
}

int cinfer_image_encode(const cinfer_model *cm, cinfer_image *im, int n_threads, char *err, size_t errlen) {
    if (!cm || !im) return ci_err(err, errlen, CINFER_EINVAL, "cinfer_image_encode: bad arguments");
    if (im->feat) return 0;
    threadpool *tp = n_threads == 1 ? NULL : tp_create(n_threads);
    int rc = mm_image_encode(cm->m, im, tp, err, errlen);
    tp_destroy(tp);
    return rc;
}

int cinfer_expand_image_pads(const cinfer_model *cm, const int32_t *ids, int n, cinfer_image *const *images,
                             int n_images, int32_t **out, int *n_out, char *err, size_t errlen) {
    if (!cm || (!ids && n) || n < 0 || !out || !n_out || n_images < 0 || (n_images && !images))
        return ci_err(err, errlen, CINFER_EINVAL, "cinfer_expand_image_pads: bad arguments");
    const model_config *c = &cm->m->cfg;
    int pad = c->image_token_id, vs = c->vision_start_token_id;
    int64_t total = n;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (ids[i] == pad && i > 0 && ids[i - 1] == vs && pad >= 0) {
            if (k >= n_images)
                return ci_err(err, errlen, CINFER_EINVAL,
                              "the prompt has more image placeholders than the %d images given", n_images);
            total += images[k++]->n_tokens - 1;
        }
    if (k != n_images)
        return ci_err(err, errlen, CINFER_EINVAL, "%d images given, the prompt has %d image placeholders",
                      n_images, k);
    if (total > (1 << 30)) return ci_err(err, errlen, CINFER_ERANGE, "the expanded prompt is too long");
    int32_t *o = malloc((size_t)(total ? total : 1) * sizeof *o);
    if (!o) return ci_err(err, errlen, CINFER_ENOMEM, "cannot allocate the expanded prompt");
    int64_t j = 0;
    k = 0;
    for (int i = 0; i < n; i++) {
        if (ids[i] == pad && i > 0 && ids[i - 1] == vs && pad >= 0) {
            for (int t = 0; t < images[k]->n_tokens; t++) o[j++] = pad;
            k++;
        } else {
            o[j++] = ids[i];
        }
    }
    *out = o;
    *n_out = (int)j;
    return 0;
}

void mm_layout_free(mm_layout *l) {
    free(l->pos);
    free(l->row);
    memset(l, 0, sizeof *l);
}

int mm_layout_build(const model_config *c, int merge, const int32_t *ids, int n, const vision_grid *grids,
                    int n_images, mm_layout *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    int pad = c->image_token_id, vs = c->vision_start_token_id, vid = c->video_token_id;
    if (pad < 0 || vs < 0)
        return ci_err(err, errlen, CINFER_EUNSUPPORTED,
                      "config.json has no image_token_id / vision_start_token_id");
    if (n < 1) return ci_err(err, errlen, CINFER_EINVAL, "empty prompt");
    out->pos = malloc(3 * (size_t)n * sizeof(int32_t));
    out->row = malloc((size_t)n * sizeof(int32_t));
    if (!out->pos || !out->row) {
        mm_layout_free(out);
        return ci_err(err, errlen, CINFER_ENOMEM, "cannot allocate the layout of a %d-token prompt", n);
    }
    int32_t *pt = out->pos, *ph = out->pos + n, *pw = out->pos + 2 * (size_t)n;
    int64_t cur = 0;
    int k = 0, feat = 0, rc = 0;
    for (int i = 0; i < n;) {
        if (ids[i] == pad) {
            if (i == 0 || ids[i - 1] != vs) {
                rc = ci_err(err, errlen, CINFER_EINVAL,
                            "position %d: <|image_pad|> must follow <|vision_start|>", i);
                break;
            }
            int run = 0;
            while (i + run < n && ids[i + run] == pad) run++;
            if (k >= n_images) {
                rc = ci_err(err, errlen, CINFER_EINVAL,
                            "the prompt has more image token runs than the %d images given", n_images);
                break;
            }
            vision_grid g = grids[k];
            int lt = g.t, lh = g.h / merge, lw = g.w / merge;
            int64_t need = (int64_t)lt * lh * lw;
            if (run != need) {
                rc = ci_err(err, errlen, CINFER_EINVAL,
                            "image %d: the prompt has a run of %d <|image_pad|> tokens at position %d, the "
                            "image takes %lld",
                            k, run, i, (long long)need);
                break;
            }
            /* t, h, w positions of the merged grid, from where the text left off; the text after the image
             * resumes at the block's start + max(t, h, w) */
            int j = i;
            for (int ft = 0; ft < lt; ft++)
                for (int y = 0; y < lh; y++)
                    for (int x = 0; x < lw; x++, j++) {
                        pt[j] = (int32_t)(cur + ft);
                        ph[j] = (int32_t)(cur + y);
                        pw[j] = (int32_t)(cur + x);
                        out->row[j] = feat++;
                    }
            int mx = lt > lh ? lt : lh;
            if (lw > mx) mx = lw;
            cur += mx;
            i += run;
            k++;
        } else {
            if (vid >= 0 && ids[i] == vid && i > 0 && ids[i - 1] == vs) {
                rc = ci_err(err, errlen, CINFER_EUNSUPPORTED, "position %d: video input is not supported", i);
                break;
            }
            pt[i] = ph[i] = pw[i] = (int32_t)cur++;
            out->row[i] = -1;
            i++;
        }
    }
    if (!rc && k != n_images)
        rc = ci_err(err, errlen, CINFER_EINVAL, "%d images given, the prompt has %d image token runs",
                    n_images, k);
    if (rc) {
        mm_layout_free(out);
        return rc;
    }
    out->n = n;
    out->n_feat = feat;
    out->delta = (int)(cur - n);
    return 0;
}

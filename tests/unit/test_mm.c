/* test_mm.c — the multimodal prompt layout (src/runtime/mm.c): mRoPE positions and rope_delta of a prompt
 * with images written out by hand from spec §6.3, every malformed layout refused with its reason, and the
 * public image API's argument checks (cinfer_image_load on a text-only model, pad expansion). Parity of
 * positions, features and logits with transformers is tests/parity/test_parity_vision.c. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cinfer.h"
#include "io/config.h"
#include "runtime/mm.h"
#include "test.h"

static model_config mm_cfg(void) {
    model_config c;
    memset(&c, 0, sizeof c);
    c.image_token_id = 10;
    c.vision_start_token_id = 9;
    c.vision_end_token_id = 8;
    c.video_token_id = 11;
    return c;
}

TEST(mm_layout_one_image_by_hand) {
    model_config c = mm_cfg();
    /* grid (1, 4, 6) -> 2 x 3 merged tokens */
    int32_t ids[] = {1, 9, 10, 10, 10, 10, 10, 10, 8, 2, 3};
    vision_grid g = {1, 4, 6};
    mm_layout L;
    char err[256];
    REQUIRE(mm_layout_build(&c, 2, ids, 11, &g, 1, &L, err, sizeof err) == 0);
    int32_t wt[] = {0, 1, 2, 2, 2, 2, 2, 2, 5, 6, 7};
    int32_t wh[] = {0, 1, 2, 2, 2, 3, 3, 3, 5, 6, 7};
    int32_t ww[] = {0, 1, 2, 3, 4, 2, 3, 4, 5, 6, 7};
    int32_t wr[] = {-1, -1, 0, 1, 2, 3, 4, 5, -1, -1, -1};
    for (int i = 0; i < 11; i++) {
        CHECK_MSG(L.pos[i] == wt[i] && L.pos[11 + i] == wh[i] && L.pos[22 + i] == ww[i],
                  "token %d: (%d, %d, %d), want (%d, %d, %d)", i, L.pos[i], L.pos[11 + i], L.pos[22 + i],
                  wt[i], wh[i], ww[i]);
        CHECK_EQ_INT(L.row[i], wr[i]);
    }
    CHECK_EQ_INT(L.n_feat, 6);
    CHECK_EQ_INT(L.delta, 8 - 11); /* max position 7, + 1, - 11 tokens */
    mm_layout_free(&L);
}

TEST(mm_layout_two_images_tall_then_wide) {
    model_config c = mm_cfg();
    /* a tall image (1, 6, 2) -> 3 x 1, then a wide (1, 2, 8) -> 1 x 4: the next text resumes at start + max
     */
    int32_t ids[] = {9, 10, 10, 10, 8, 5, 9, 10, 10, 10, 10, 8};
    vision_grid g[2] = {{1, 6, 2}, {1, 2, 8}};
    mm_layout L;
    char err[256];
    REQUIRE(mm_layout_build(&c, 2, ids, 12, g, 2, &L, err, sizeof err) == 0);
    int32_t wt[] = {0, 1, 1, 1, 4, 5, 6, 7, 7, 7, 7, 11};
    int32_t wh[] = {0, 1, 2, 3, 4, 5, 6, 7, 7, 7, 7, 11};
    int32_t ww[] = {0, 1, 1, 1, 4, 5, 6, 7, 8, 9, 10, 11};
    for (int i = 0; i < 12; i++)
        CHECK_MSG(L.pos[i] == wt[i] && L.pos[12 + i] == wh[i] && L.pos[24 + i] == ww[i],
                  "token %d: (%d, %d, %d), want (%d, %d, %d)", i, L.pos[i], L.pos[12 + i], L.pos[24 + i],
                  wt[i], wh[i], ww[i]);
    CHECK_EQ_INT(L.row[7], 3);
    CHECK_EQ_INT(L.n_feat, 7);
    CHECK_EQ_INT(L.delta, 0);
    mm_layout_free(&L);
}

TEST(mm_layout_refuses_malformed) {
    model_config c = mm_cfg();
    vision_grid g = {1, 2, 4}; /* 2 tokens */
    mm_layout L;
    char err[256];
    int32_t stray[] = {1, 10, 10, 8};
    CHECK_EQ_INT(mm_layout_build(&c, 2, stray, 4, &g, 1, &L, err, sizeof err), CINFER_EINVAL);
    CHECK_STR_CONTAINS(err, "must follow <|vision_start|>");
    int32_t short_run[] = {9, 10, 8};
    CHECK_EQ_INT(mm_layout_build(&c, 2, short_run, 3, &g, 1, &L, err, sizeof err), CINFER_EINVAL);
    CHECK_STR_CONTAINS(err, "the image takes 2");
    int32_t two[] = {9, 10, 10, 8, 9, 10, 10, 8};
    CHECK_EQ_INT(mm_layout_build(&c, 2, two, 8, &g, 1, &L, err, sizeof err), CINFER_EINVAL);
    CHECK_STR_CONTAINS(err, "more image token runs");
    int32_t none[] = {1, 2, 3};
    CHECK_EQ_INT(mm_layout_build(&c, 2, none, 3, &g, 1, &L, err, sizeof err), CINFER_EINVAL);
    CHECK_STR_CONTAINS(err, "1 images given, the prompt has 0");
    int32_t video[] = {9, 11, 8, 9, 10, 10, 8};
    CHECK_EQ_INT(mm_layout_build(&c, 2, video, 7, &g, 1, &L, err, sizeof err), CINFER_EUNSUPPORTED);
    CHECK_STR_CONTAINS(err, "video");
    model_config none_cfg = c;
    none_cfg.image_token_id = -1;
    CHECK_EQ_INT(mm_layout_build(&none_cfg, 2, two, 8, &g, 1, &L, err, sizeof err), CINFER_EUNSUPPORTED);
    CHECK(L.pos == NULL && L.row == NULL);
}

TEST(mm_image_api_on_text_model) {
    char dir[512], err[256];
    snprintf(dir, sizeof dir, "%s/qwen35_text", test_fixtures_dir());
    cinfer_model *m;
    REQUIRE(cinfer_model_open(dir, &m, err, sizeof err) == 0);
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    CHECK(!info.has_vision);
    static const unsigned char png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    cinfer_image *im = (cinfer_image *)1;
    CHECK_EQ_INT(cinfer_image_load(m, png_sig, sizeof png_sig, 0, &im, err, sizeof err), CINFER_EUNSUPPORTED);
    CHECK(im == NULL);
    CHECK_STR_CONTAINS(err, "no vision tower");
    cinfer_model_close(m);
}

/* On the dense fixture's tiny tower: a broken image is a clear error, a good one expands its placeholder. */
TEST(mm_image_load_and_expand) {
    char dir[512], err[256];
    snprintf(dir, sizeof dir, "%s/qwen35_dense", test_fixtures_dir());
    cinfer_model *m;
    REQUIRE(cinfer_model_open(dir, &m, err, sizeof err) == 0);
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    REQUIRE(info.has_vision);
    cinfer_image *im = NULL;
    static const unsigned char junk[16] = "not an image...";
    CHECK(cinfer_image_load(m, junk, sizeof junk, 0, &im, err, sizeof err) < 0);
    CHECK(im == NULL);

    char path[600];
    snprintf(path, sizeof path, "%s/images/bilevel_97x61.png", test_fixtures_dir());
    FILE *f = fopen(path, "rb");
    REQUIRE(f);
    unsigned char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    /* over a pixel cap: refused from the header */
    CHECK_EQ_INT(cinfer_image_load(m, buf, n, 1000, &im, err, sizeof err), CINFER_ERANGE);
    REQUIRE(cinfer_image_load(m, buf, n, 0, &im, err, sizeof err) == 0);
    int t, h, w, wd, ht;
    cinfer_image_get_grid(im, &t, &h, &w);
    cinfer_image_get_size(im, &wd, &ht);
    CHECK_EQ_INT(wd, 97);
    CHECK_EQ_INT(ht, 61);
    CHECK_EQ_INT(t, 1);
    CHECK_EQ_INT(cinfer_image_n_tokens(im), t * h * w / 4);
    CHECK(cinfer_image_hash(im) != 0);
    CHECK(cinfer_image_features(im) == NULL);
    REQUIRE(cinfer_image_encode(m, im, 2, err, sizeof err) == 0);
    CHECK(cinfer_image_features(im) != NULL);

    int32_t vs = info.vision_start_token_id, pad = info.image_token_id, ve = info.vision_end_token_id;
    int32_t ids[] = {1, vs, pad, ve, 2};
    int32_t *out = NULL;
    int n_out = 0;
    cinfer_image *ims[1] = {im};
    REQUIRE(cinfer_expand_image_pads(m, ids, 5, ims, 1, &out, &n_out, err, sizeof err) == 0);
    CHECK_EQ_INT(n_out, 4 + cinfer_image_n_tokens(im));
    CHECK_EQ_INT(out[0], 1);
    CHECK_EQ_INT(out[1], vs);
    for (int i = 0; i < cinfer_image_n_tokens(im); i++) CHECK_EQ_INT(out[2 + i], pad);
    CHECK_EQ_INT(out[n_out - 1], 2);
    free(out);
    CHECK_EQ_INT(cinfer_expand_image_pads(m, ids, 5, ims, 0, &out, &n_out, err, sizeof err), CINFER_EINVAL);
    cinfer_image_free(im);
    cinfer_model_close(m);
}

/* test_mm.c — the multimodal prompt layout (src/runtime/mm.c): mRoPE positions and rope_delta of a prompt
 * with images written out by hand from spec §6.3, every malformed layout refused with its reason, and the
 * public image API's argument checks (cinfer_image_load on a text-only model, pad expansion). Parity of
 * positions, features and logits with transformers is tests/parity/test_parity_vision.c. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cinfer.h"
#include "io/config.h"
#include "runtime/mm.h"
#include "test.h"
#include "util/npy.h"

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
    cinfer_image *cp = cinfer_image_dup(im);
    REQUIRE(cp);
    CHECK(cinfer_image_hash(cp) == cinfer_image_hash(im));
    CHECK(cinfer_image_features(cp) != cinfer_image_features(im));
    CHECK(!memcmp(cinfer_image_features(cp), cinfer_image_features(im),
                  sizeof(float) * cinfer_image_n_tokens(im) * info.hidden_size));
    cinfer_image_free(cp);

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

/* ---- a tiny model with a vision tower (tiny_model.h): batching, images that matter, the engine ---- */

#include "tiny_model.h"

static cinfer_model *open_tiny_vision(void) {
    char dir[512], err[512];
    snprintf(dir, sizeof dir, "%s/tiny_vision", test_tmpdir());
    tiny_opts o = tiny_default(1);
    o.multimodal = 1;
    o.vision = 1;
    if (tiny_write(dir, &o)) return NULL;
    cinfer_model *m;
    if (cinfer_model_open(dir, &m, err, sizeof err)) {
        test_fail(__FILE__, __LINE__, "%s", err);
        return NULL;
    }
    return m;
}

static cinfer_image *fixture_image(cinfer_model *m, const char *name) {
    char path[600], err[256];
    snprintf(path, sizeof path, "%s/images/%s", test_fixtures_dir(), name);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static unsigned char buf[1 << 17];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    cinfer_image *im = NULL;
    if (cinfer_image_load(m, buf, n, 0, &im, err, sizeof err))
        test_fail(__FILE__, __LINE__, "%s: %s", name, err);
    return im;
}

/* [1, 2, <vision_start>, pad x n, <vision_end>, 5, 6, 7] */
static int image_prompt(const cinfer_model_info *info, int n_pad, int32_t *p) {
    int k = 0;
    p[k++] = 1;
    p[k++] = 2;
    p[k++] = info->vision_start_token_id;
    for (int i = 0; i < n_pad; i++) p[k++] = info->image_token_id;
    p[k++] = info->vision_end_token_id;
    p[k++] = 5;
    p[k++] = 6;
    p[k++] = 7;
    return k;
}

/* logits of the whole prompt ([n][V]) of a fresh sequence with im, optionally batched with a text sequence */
static int run_prompt(cinfer_model *m, const int32_t *p, int n, cinfer_image *im, int with_text, float *out,
                      int V) {
    cinfer_ctx_params cp = cinfer_ctx_default_params();
    cp.max_seqs = 2;
    cp.max_ctx = 256;
    cp.max_batch = 256;
    cp.n_threads = 2;
    cinfer_ctx *c;
    char err[512];
    if (cinfer_ctx_create(m, &cp, &c, err, sizeof err)) return -1;
    int a = cinfer_seq_open(c, err, sizeof err), b = cinfer_seq_open(c, err, sizeof err);
    int rc = cinfer_seq_set_images(c, a, p, n, &im, 1, NULL, err, sizeof err);
    int32_t text[9] = {3, 1, 4, 1, 5, 9, 2, 6, 5};
    cinfer_batch_entry e[2] = {{b, text, 9, 1, 0}, {a, p, n, 1, 0}};
    float *tmp = malloc(sizeof(float) * (size_t)(n + 9) * V);
    if (!rc) rc = cinfer_forward(c, with_text ? e : e + 1, with_text ? 2 : 1, tmp, err, sizeof err);
    if (!rc) memcpy(out, tmp + (with_text ? (size_t)9 * V : 0), sizeof(float) * (size_t)n * V);
    if (rc) test_fail(__FILE__, __LINE__, "%s", err);
    free(tmp);
    cinfer_ctx_destroy(c);
    return rc;
}

TEST(mm_tiny_image_rows_batch_invariant_and_matter) {
    cinfer_model *m = open_tiny_vision();
    REQUIRE(m);
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    REQUIRE(info.has_vision);
    cinfer_image *im1 = fixture_image(m, "bilevel_97x61.png"), *im2 = fixture_image(m, "gray16_97x61.png");
    REQUIRE(im1 && im2);
    CHECK_EQ_INT(cinfer_image_n_tokens(im1), cinfer_image_n_tokens(im2));
    CHECK(cinfer_image_hash(im1) != cinfer_image_hash(im2));
    int32_t p[300];
    int n = image_prompt(&info, cinfer_image_n_tokens(im1), p);
    int V = info.vocab_size;
    float *solo = malloc(sizeof(float) * n * V), *batched = malloc(sizeof(float) * n * V),
          *other = malloc(sizeof(float) * n * V);
    REQUIRE(run_prompt(m, p, n, im1, 0, solo, V) == 0);
    REQUIRE(run_prompt(m, p, n, im1, 1, batched, V) == 0);
    REQUIRE(run_prompt(m, p, n, im2, 0, other, V) == 0);
    CHECK(memcmp(solo, batched, sizeof(float) * n * V) == 0);
    /* the tokens before the image are the same; from the first image token on, the picture shows */
    CHECK(memcmp(solo, other, sizeof(float) * 3 * V) == 0);
    CHECK(memcmp(solo + (size_t)(n - 1) * V, other + (size_t)(n - 1) * V, sizeof(float) * V) != 0);

    /* the sequence must be fed the prompt it was given */
    cinfer_ctx_params cp = cinfer_ctx_default_params();
    cp.max_seqs = 1;
    cp.max_ctx = 256;
    cp.max_batch = 256;
    cp.n_threads = 1;
    cinfer_ctx *c;
    char err[512];
    REQUIRE(cinfer_ctx_create(m, &cp, &c, err, sizeof err) == 0);
    int s = cinfer_seq_open(c, err, sizeof err);
    REQUIRE(cinfer_seq_set_images(c, s, p, n, &im1, 1, NULL, err, sizeof err) == 0);
    CHECK_EQ_INT(cinfer_seq_set_images(c, s, p, n, &im1, 1, NULL, err, sizeof err), CINFER_ESTATE);
    int32_t wrong[4] = {1, 2, 3, 4};
    cinfer_batch_entry e = {s, wrong, 4, 0, 0};
    CHECK_EQ_INT(cinfer_forward(c, &e, 1, solo, err, sizeof err), CINFER_EINVAL);
    CHECK_STR_CONTAINS(err, "differs from the prompt given with its images");
    cinfer_ctx_destroy(c);
    free(solo), free(batched), free(other);
    cinfer_image_free(im1);
    cinfer_image_free(im2);
    cinfer_model_close(m);
}

typedef struct {
    int32_t ids[64];
    int n, cached;
    char finish[32];
} got_ids;

static void drain_ids(cinfer_request *r, got_ids *g) {
    memset(g, 0, sizeof *g);
    cinfer_event ev;
    while (cinfer_request_next(r, &ev, 20000) == 1) {
        if (ev.type == CINFER_EV_LOGPROB && g->n < 64) g->ids[g->n++] = ev.token;
        if (ev.type == CINFER_EV_DONE)
            snprintf(g->finish, sizeof g->finish, "%s", ev.finish_reason), g->cached = ev.cached_tokens;
        if (ev.type == CINFER_EV_ERROR) snprintf(g->finish, sizeof g->finish, "error");
    }
}

static int argmax_v(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Image requests through the engine: greedy output equals the context's own greedy, with a text request
 * running alongside, twice (the second resumes from the prefix cache, keyed by the image's pixels), and a
 * prompt whose pads do not fit the image is refused at submit. */
TEST(mm_tiny_engine_image_requests) {
    cinfer_model *m = open_tiny_vision();
    REQUIRE(m);
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    int V = info.vocab_size;
    cinfer_image *ref_im = fixture_image(m, "bilevel_97x61.png");
    REQUIRE(ref_im);
    int32_t p[300];
    int n = image_prompt(&info, cinfer_image_n_tokens(ref_im), p);
    enum { NEW = 6 };
    /* the reference: prompt then greedy decode on a bare context */
    int32_t want[NEW];
    {
        cinfer_ctx_params cp = cinfer_ctx_default_params();
        cp.max_seqs = 1, cp.max_ctx = 256, cp.max_batch = 256, cp.n_threads = 2;
        cinfer_ctx *c;
        char err[512];
        REQUIRE(cinfer_ctx_create(m, &cp, &c, err, sizeof err) == 0);
        int s = cinfer_seq_open(c, err, sizeof err);
        REQUIRE(cinfer_seq_set_images(c, s, p, n, &ref_im, 1, NULL, err, sizeof err) == 0);
        float *lg = malloc(sizeof(float) * V);
        cinfer_batch_entry e = {s, p, n, 0, 0};
        REQUIRE(cinfer_forward(c, &e, 1, lg, err, sizeof err) == 0);
        for (int t = 0; t < NEW; t++) {
            want[t] = argmax_v(lg, V);
            cinfer_batch_entry d = {s, &want[t], 1, 0, 0};
            REQUIRE(cinfer_forward(c, &d, 1, lg, err, sizeof err) == 0);
        }
        free(lg);
        cinfer_ctx_destroy(c);
    }
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.max_seqs = 3, ep.ctx_size = 256, ep.step_tokens = 32, ep.n_threads = 2;
    ep.prefix_cache_memory = 1 << 20;
    cinfer_engine *eng;
    char err[512];
    REQUIRE(cinfer_engine_create(m, &ep, &eng, err, sizeof err) == 0);
    for (int round = 0; round < 2; round++) {
        cinfer_request_params rp;
        memset(&rp, 0, sizeof rp);
        rp.sampling = cinfer_sampling_default();
        rp.sampling.temperature = 0;
        rp.sampling.n_logprobs = 0;
        rp.ignore_eos = 1;
        rp.max_tokens = NEW;
        int32_t text[20];
        for (int i = 0; i < 20; i++) text[i] = (int32_t)(i * 7 % 80);
        rp.prompt = text;
        rp.n_prompt = 20;
        cinfer_request *rt, *ri;
        REQUIRE(cinfer_engine_submit(eng, &rp, &rt, err, sizeof err) == 0);
        cinfer_image *im = fixture_image(m, "bilevel_97x61.png");
        REQUIRE(im);
        rp.prompt = p;
        rp.n_prompt = n;
        rp.images = &im;
        rp.n_images = 1;
        REQUIRE(cinfer_engine_submit(eng, &rp, &ri, err, sizeof err) == 0); /* the engine owns im now */
        got_ids gi, gt;
        drain_ids(ri, &gi);
        drain_ids(rt, &gt);
        CHECK_EQ_INT(gi.n, NEW);
        CHECK_MSG(gi.n == NEW && !memcmp(gi.ids, want, sizeof want),
                  "round %d: engine image output differs from the context's", round);
        CHECK_EQ_INT(gt.n, NEW);
        /* the repeated prompts, the image one too, resume at their last token */
        CHECK_EQ_INT(gi.cached, round ? n - 1 : 0);
        CHECK_EQ_INT(gt.cached, round ? 19 : 0);
        cinfer_request_free(ri);
        cinfer_request_free(rt);
    }

    /* a prompt whose pad run does not fit the image: refused at submit, the caller keeps the image */
    cinfer_request_params rp;
    memset(&rp, 0, sizeof rp);
    rp.sampling = cinfer_sampling_default();
    rp.max_tokens = 2;
    int32_t shortp[6] = {1, info.vision_start_token_id, info.image_token_id, info.vision_end_token_id, 5, 6};
    rp.prompt = shortp;
    rp.n_prompt = 6;
    rp.images = &ref_im;
    rp.n_images = 1;
    cinfer_request *rb = NULL;
    CHECK_EQ_INT(cinfer_engine_submit(eng, &rp, &rb, err, sizeof err), CINFER_EINVAL);
    CHECK_STR_CONTAINS(err, "the image takes");
    cinfer_engine_destroy(eng);
    cinfer_image_free(ref_im);
    cinfer_model_close(m);
}

/* One greedy image request (ids and top-5 logprobs) on engine e; the engine takes im. */
typedef struct {
    int32_t ids[8];
    float lp[8][6];
    int n, cached;
} img_trace;

static void run_image(cinfer_engine *e, const int32_t *p, int n, cinfer_image *im, img_trace *t) {
    char err[512];
    memset(t, 0, sizeof *t);
    cinfer_request_params rp;
    memset(&rp, 0, sizeof rp);
    rp.sampling = cinfer_sampling_default();
    rp.sampling.temperature = 0;
    rp.sampling.n_logprobs = 5;
    rp.ignore_eos = 1;
    rp.max_tokens = 8;
    rp.prompt = p;
    rp.n_prompt = n;
    rp.images = &im;
    rp.n_images = 1;
    cinfer_request *r;
    if (cinfer_engine_submit(e, &rp, &r, err, sizeof err)) {
        test_fail(__FILE__, __LINE__, "%s", err);
        cinfer_image_free(im);
        return;
    }
    cinfer_event ev;
    while (cinfer_request_next(r, &ev, 20000) == 1) {
        if (ev.type == CINFER_EV_LOGPROB && t->n < 8) {
            t->ids[t->n] = ev.token;
            t->lp[t->n][0] = ev.logprob;
            for (int i = 0; i < ev.n_top && i < 5; i++) t->lp[t->n][1 + i] = ev.top[i].logprob;
            t->n++;
        }
        if (ev.type == CINFER_EV_DONE) t->cached = ev.cached_tokens;
    }
    cinfer_request_free(r);
}

/* The prefix cache keys an image's pads by its pixels. The same image request twice: the second resumes at
 * its last token and gives the first's tokens and logprobs bit for bit. The same prompt with another picture
 * of the same size (its pads have the same ids): no hit inside the span, and exactly its own cold run. H ends
 * on the image's pads, so its snapshot (at its last token) sits inside the span: F (H plus text) then resumes
 * mid-image and gives F's cold tokens; its logprobs agree to rounding only, because no piece of a cold run
 * ends there (a split inside a DeltaNet chunk rounds differently, as it does for text), so exact equality
 * is checked against a context fed in the same pieces. */
TEST(mm_tiny_engine_prefix_cache_keys_image_pixels) {
    cinfer_model *m = open_tiny_vision();
    REQUIRE(m);
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    int V = info.vocab_size;
    cinfer_image *x = fixture_image(m, "bilevel_97x61.png"), *y = fixture_image(m, "gray16_97x61.png");
    REQUIRE(x && y);
    int k = cinfer_image_n_tokens(x);
    REQUIRE(k > 1 && k == cinfer_image_n_tokens(y));
    int32_t pf[300];
    int nf = image_prompt(&info, k, pf), nh = 3 + k; /* H = [1, 2, <vision_start>, pad x k] */
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.max_seqs = 2, ep.ctx_size = 256, ep.step_tokens = 32, ep.n_threads = 2;
    ep.prefix_cache_memory = 1 << 20;
    char err[512];
    cinfer_engine *warm, *cold, *mid;
    /* resume anywhere (CINFER_PREFIX_EXACT=0, cuda's default): the mid-span resume below is the point; with the
     * CPU's default a resume waits for a point where the cold run ends a piece (test_prefix_chat.c) */
    setenv("CINFER_PREFIX_EXACT", "0", 1);
    REQUIRE(cinfer_engine_create(m, &ep, &warm, err, sizeof err) == 0);
    REQUIRE(cinfer_engine_create(m, &ep, &cold, err, sizeof err) == 0);
    REQUIRE(cinfer_engine_create(m, &ep, &mid, err, sizeof err) == 0);
    unsetenv("CINFER_PREFIX_EXACT");
    img_trace a, b, g, cg, h, f;
    run_image(warm, pf, nf, cinfer_image_dup(x), &a);
    run_image(warm, pf, nf, cinfer_image_dup(x), &b);
    run_image(warm, pf, nf, cinfer_image_dup(y), &g);
    run_image(cold, pf, nf, cinfer_image_dup(y), &cg);
    run_image(mid, pf, nh, cinfer_image_dup(x), &h);
    run_image(mid, pf, nf, cinfer_image_dup(x), &f);
    CHECK_EQ_INT(a.cached, 0);
    CHECK_EQ_INT(b.cached, nf - 1);
    CHECK_EQ_INT(a.n, 8);
    CHECK_MSG(!memcmp(b.ids, a.ids, sizeof a.ids) && !memcmp(b.lp, a.lp, sizeof a.lp),
              "the cached image request differs from its cold run");
    CHECK_MSG(g.cached <= 3, "another picture resumed after %d tokens (its pads start at 3)", g.cached);
    CHECK_EQ_INT(cg.cached, 0);
    CHECK_MSG(!memcmp(g.ids, cg.ids, sizeof cg.ids) && !memcmp(g.lp, cg.lp, sizeof cg.lp),
              "the other picture's request differs from its cold run");
    CHECK_MSG(memcmp(a.lp, g.lp, sizeof a.lp) != 0,
              "the two pictures give the same output: the test shows nothing");
    CHECK_EQ_INT(h.cached, 0);
    CHECK_EQ_INT(f.cached, nh - 1); /* mid-span: the last pad and what follows are fed */
    CHECK_MSG(!memcmp(f.ids, a.ids, sizeof a.ids), "resuming inside the image span changed the tokens");
    for (int t = 0; t < 8; t++)
        for (int j = 0; j < 6; j++)
            CHECK_MSG(fabsf(f.lp[t][j] - a.lp[t][j]) < 1e-4f, "token %d logprob %d: %g vs %g cold", t, j,
                      f.lp[t][j], a.lp[t][j]);
    /* bit for bit against a context fed in the engine's pieces: [0, nh-1) (H), [nh-1, nf-1), [nf-1, nf) */
    {
        cinfer_ctx_params cp = cinfer_ctx_default_params();
        cp.max_seqs = 1, cp.max_ctx = 256, cp.max_batch = 256, cp.n_threads = 2;
        cinfer_ctx *c;
        REQUIRE(cinfer_ctx_create(m, &cp, &c, err, sizeof err) == 0);
        int s = cinfer_seq_open(c, err, sizeof err);
        REQUIRE(cinfer_seq_set_images(c, s, pf, nf, &x, 1, NULL, err, sizeof err) == 0);
        float *lg = malloc(sizeof(float) * V);
        int cuts[4] = {0, nh - 1, nf - 1, nf};
        for (int i = 0; i < 3; i++) {
            cinfer_batch_entry e = {s, pf + cuts[i], cuts[i + 1] - cuts[i], 0, 0};
            REQUIRE(cinfer_forward(c, &e, 1, lg, err, sizeof err) == 0);
        }
        int same = 1;
        for (int t = 0; t < 8; t++) {
            int32_t id = argmax_v(lg, V);
            double mx = lg[id], z = 0;
            for (int v = 0; v < V; v++) z += exp((double)lg[v] - mx);
            same &= id == f.ids[t] && fabs((double)f.lp[t][0] + log(z)) < 1e-6;
            cinfer_batch_entry d = {s, &id, 1, 0, 0};
            REQUIRE(cinfer_forward(c, &d, 1, lg, err, sizeof err) == 0);
        }
        CHECK_MSG(same, "the mid-span resume differs from a context fed in the same pieces");
        free(lg);
        cinfer_ctx_destroy(c);
    }
    cinfer_engine_stats st;
    cinfer_engine_get_stats(warm, &st);
    CHECK_EQ_INT(st.running, 0);
    CHECK_EQ_INT(st.prefix_hits, 1);
    cinfer_engine_destroy(warm);
    cinfer_engine_destroy(cold);
    cinfer_engine_destroy(mid);
    cinfer_image_free(x);
    cinfer_image_free(y);
    cinfer_model_close(m);
}

/* `cinfer logits --image` and `cinfer generate --image --tokens` on the tiny vision model: the collapsed
 * prompt (one pad per image) expanded by the CLI gives the library's logits and greedy ids. */
TEST(mm_tiny_cli_image) {
    const char *bin = getenv("CINFER_BIN");
    if (!bin) bin = "build/cinfer";
    cinfer_model *m = open_tiny_vision();
    REQUIRE(m);
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    int V = info.vocab_size;
    cinfer_image *im = fixture_image(m, "bilevel_97x61.png");
    REQUIRE(im);
    int32_t p[300];
    int n = image_prompt(&info, cinfer_image_n_tokens(im), p);
    float *ref = malloc(sizeof(float) * n * V);
    REQUIRE(run_prompt(m, p, n, im, 0, ref, V) == 0);
    int want = argmax_v(ref + (size_t)(n - 1) * V, V);
    char img[600], out[600], dir[600], cmd[4096];
    snprintf(img, sizeof img, "%s/images/bilevel_97x61.png", test_fixtures_dir());
    snprintf(out, sizeof out, "%s/cli_mm.npy", test_tmpdir());
    snprintf(dir, sizeof dir, "%s/tiny_vision", test_tmpdir());
    char toks[128];
    snprintf(toks, sizeof toks, "1,2,%d,%d,%d,5,6,7", info.vision_start_token_id, info.image_token_id,
             info.vision_end_token_id);
    snprintf(cmd, sizeof cmd, "%s logits -m %s --tokens %s --image %s --out %s --threads 2", bin, dir, toks,
             img, out);
    CHECK_EQ_INT(system(cmd), 0);
    FILE *f = fopen(out, "rb");
    REQUIRE(f);
    static char buf[1 << 22];
    size_t len = fread(buf, 1, sizeof buf, f);
    fclose(f);
    npy_array a;
    char err[256];
    REQUIRE(npy_parse_f32(buf, len, &a, err, sizeof err) == 0);
    CHECK_EQ_INT(a.shape[0], n);
    CHECK_EQ_INT(a.shape[1], V);
    if (a.shape[0] == n && a.shape[1] == V) CHECK(!memcmp(a.data, ref, sizeof(float) * n * V));
    snprintf(cmd, sizeof cmd, "%s generate -m %s --tokens %s --image %s -n 1 --ids --threads 2 2>/dev/null",
             bin, dir, toks, img);
    FILE *pp = popen(cmd, "r");
    REQUIRE(pp);
    char line[256] = "";
    if (!fgets(line, sizeof line, pp)) line[0] = 0;
    CHECK_EQ_INT(pclose(pp), 0);
    CHECK_EQ_INT(atoi(line), want);
    /* an image the prompt has no place for */
    snprintf(cmd, sizeof cmd, "%s logits -m %s --tokens 1,2,3 --image %s 2>/dev/null", bin, dir, img);
    CHECK(system(cmd) != 0);
    free(ref);
    cinfer_image_free(im);
    cinfer_model_close(m);
}

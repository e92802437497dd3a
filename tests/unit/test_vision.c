/* test_vision.c — the vision tower (src/model/vision.c): binding and grid checks on the qwen35_dense
 * fixture's tiny tower, images encoded together == encoded one by one (bit for bit), and every stage
 * (patch embedding, positions, rotary angles, each block, merger) against transformers' float32 tower on
 * the qwen35_vision fixture (tools/oracle/make_vision_fixtures.py). */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cinfer.h"
#include "io/config.h"
#include "model/vision.h"
#include "test.h"
#include "util/file.h"
#include "util/npy.h"
#include "util/threadpool.h"

/* Stage bounds: max |ours - reference| / std(reference). The reference is transformers' f32 CPU forward;
 * the differences are f32 summation order (conv vs dot, softmax sums) and libm's cos/exp/tanh/erf. */
#define VIS_BOUND_EXACTISH 1e-6 /* positions, angles: a few operations per value */
/* The patch embedding is one dot product of patch_dim (1536) terms per value: any two f32 summation orders
 * differ by about sqrt(1536) roundings of the partial sums. On the qwen35_vision fixture transformers' own
 * conv3d output is 4.2e-6 x std from the exact (math.fsum) value and a plain sequential f32 sum 4.0e-6, so
 * 1e-6 cannot be met by any order but theirs; 2e-5 still catches a wrong tap, weight layout or bias. */
#define VIS_BOUND_PATCH 2e-5
#define VIS_BOUND_DEEP  2e-5 /* after blocks and the merger */

static uint64_t g_rng = 777;
static float frand(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static model *load(const char *name) {
    char dir[512], err[512];
    snprintf(dir, sizeof dir, "%s/%s", test_fixtures_dir(), name);
    model *m = NULL;
    int rc = model_load(dir, &m, err, sizeof err);
    CHECK_MSG(rc == 0, "%s: %s", dir, err);
    return rc ? NULL : m;
}

TEST(vision_binds_dense_fixture) {
    model *m = load("qwen35_dense");
    REQUIRE(m);
    const vision_weights *v = &m->vis;
    CHECK(v->present);
    CHECK_EQ_INT(v->D, 32);
    CHECK_EQ_INT(v->heads, 2);
    CHECK_EQ_INT(v->head_dim, 16);
    CHECK_EQ_INT(v->depth, 1);
    CHECK_EQ_INT(v->grid_side, 8);
    CHECK_EQ_INT(v->patch_dim, 1536);
    CHECK_EQ_INT(v->out_hidden, m->H);
    CHECK_EQ_INT(v->patch_w.rows, 32);
    CHECK_EQ_INT(v->patch_w.cols, 1536);
    CHECK(m->n_visual > 0);

    char err[256];
    int64_t n = 0;
    vision_grid ok[2] = {{1, 4, 6}, {1, 2, 2}};
    CHECK_EQ_INT(vision_check_grids(v, ok, 2, &n, err, sizeof err), 0);
    CHECK_EQ_INT(n, 28);
    vision_grid odd = {1, 3, 4}, zero = {1, 0, 4}, huge = {1, 8192, 8192};
    CHECK_EQ_INT(vision_check_grids(v, &odd, 1, &n, err, sizeof err), CINFER_EINVAL);
    CHECK_STR_CONTAINS(err, "image 0");
    CHECK_EQ_INT(vision_check_grids(v, &zero, 1, &n, err, sizeof err), CINFER_EINVAL);
    CHECK_EQ_INT(vision_check_grids(v, &huge, 1, &n, err, sizeof err), CINFER_ERANGE);
    CHECK_EQ_INT(vision_check_grids(v, ok, 0, &n, err, sizeof err), CINFER_EINVAL);
    model_free(m);
}

TEST(vision_text_only_model_has_no_tower) {
    model *m = load("qwen35_text");
    REQUIRE(m);
    CHECK(!m->vis.present);
    char err[256];
    vision_grid g = {1, 2, 2};
    float px[4 * 1536] = {0}, out[128];
    CHECK_EQ_INT(vision_encode(m, NULL, px, &g, 1, out, NULL, NULL, err, sizeof err), CINFER_EUNSUPPORTED);
    CHECK_STR_CONTAINS(err, "no vision tower");
    model_free(m);
}

/* vision_taps (what the CUDA tower takes) gives the CPU tower's own positions and rotary angles, bit for bit:
 * its taps recombined in the tower's order equal the "pos_embed" trace, (float)y or x times inv_freq the
 * "rotary" trace; over images of several shapes (one of two frames) in one call. */
typedef struct taps_trace {
    float *pos, *ang;
    int64_t rows;
} taps_trace;

static void keep_stage(void *ctxp, const char *name, const float *data, int64_t rows, int cols) {
    taps_trace *t = ctxp;
    float **dst = !strcmp(name, "pos_embed") ? &t->pos : !strcmp(name, "rotary") ? &t->ang : NULL;
    if (!dst) return;
    *dst = malloc(sizeof(float) * rows * cols);
    memcpy(*dst, data, sizeof(float) * rows * cols);
    t->rows = rows;
}

TEST(vision_taps_match_the_cpu_tower) {
    model *m = load("qwen35_dense");
    REQUIRE(m);
    const vision_weights *v = &m->vis;
    vision_grid g[3] = {{1, 4, 6}, {2, 6, 4}, {1, 12, 2}};
    int64_t np = 0, nt = 0;
    for (int i = 0; i < 3; i++) np += (int64_t)g[i].t * g[i].h * g[i].w, nt += vision_tokens(v, g[i]);
    float *px = malloc(sizeof(float) * np * v->patch_dim), *out = malloc(sizeof(float) * nt * m->H);
    for (int64_t i = 0; i < np * v->patch_dim; i++) px[i] = frand();
    taps_trace tr = {0};
    char err[256];
    REQUIRE(vision_encode(m, NULL, px, g, 3, out, keep_stage, &tr, err, sizeof err) == 0);
    REQUIRE(tr.pos && tr.ang && tr.rows == np);
    vision_tap *taps = malloc(sizeof(vision_tap) * np);
    vision_taps(v, g, 3, taps);
    int D = v->D, q = v->head_dim / 4, bad_pos = 0, bad_ang = 0;
    for (int64_t r = 0; r < np; r++) {
        const vision_tap *t = &taps[r];
        for (int d = 0; d < D; d++) {
            float a = v->pos[(int64_t)t->idx[0] * D + d] * t->w[0],
                  b = v->pos[(int64_t)t->idx[1] * D + d] * t->w[1];
            float c = v->pos[(int64_t)t->idx[2] * D + d] * t->w[2],
                  e = v->pos[(int64_t)t->idx[3] * D + d] * t->w[3];
            float pe = ((a + b) + c) + e;
            bad_pos += memcmp(&pe, &tr.pos[r * D + d], sizeof pe) != 0;
        }
        for (int i = 0; i < q; i++) {
            float ay = (float)t->y * v->inv_freq[i], ax = (float)t->x * v->inv_freq[i];
            bad_ang += ay != tr.ang[r * 2 * q + i] || ax != tr.ang[r * 2 * q + q + i];
        }
    }
    CHECK_MSG(bad_pos == 0, "%d position values differ from the tower's", bad_pos);
    CHECK_MSG(bad_ang == 0, "%d rotary angles differ from the tower's", bad_ang);
    /* the second image's two frames take the same taps, in merge-block order: row 24 + 4 is (y 0, x 2) */
    CHECK_EQ_INT(taps[24].y, 0);
    CHECK_EQ_INT(taps[24 + 4].x, 2);
    CHECK(!memcmp(&taps[24], &taps[48], sizeof(vision_tap)));
    free(taps), free(tr.pos), free(tr.ang), free(px), free(out);
    model_free(m);
}

/* A row's result must not depend on the other images in the call, nor on the thread count. */
TEST(vision_batch_equals_solo) {
    model *m = load("qwen35_dense");
    REQUIRE(m);
    const vision_weights *v = &m->vis;
    vision_grid g[3] = {{1, 4, 6}, {2, 2, 4}, {1, 6, 2}};
    int64_t np = 0, nt = 0;
    for (int i = 0; i < 3; i++) np += (int64_t)g[i].t * g[i].h * g[i].w, nt += vision_tokens(v, g[i]);
    float *px = malloc(sizeof(float) * np * v->patch_dim);
    for (int64_t i = 0; i < np * v->patch_dim; i++) px[i] = frand();
    float *all = malloc(sizeof(float) * nt * m->H), *one = malloc(sizeof(float) * nt * m->H);
    threadpool *tp = tp_create(3);
    char err[256];
    REQUIRE(vision_encode(m, tp, px, g, 3, all, NULL, NULL, err, sizeof err) == 0);
    int64_t po = 0, to = 0;
    for (int i = 0; i < 3; i++) {
        REQUIRE(vision_encode(m, NULL, px + po * v->patch_dim, &g[i], 1, one + to * m->H, NULL, NULL, err,
                              sizeof err) == 0);
        po += (int64_t)g[i].t * g[i].h * g[i].w;
        to += vision_tokens(v, g[i]);
    }
    CHECK(memcmp(all, one, sizeof(float) * nt * m->H) == 0);
    int finite = 1;
    double s2 = 0;
    for (int64_t i = 0; i < nt * m->H; i++) finite &= isfinite(all[i]), s2 += (double)all[i] * all[i];
    CHECK(finite);
    CHECK(s2 > 0);
    tp_destroy(tp);
    free(px);
    free(all);
    free(one);
    model_free(m);
}

/* ---- against transformers ---- */

typedef struct stage_ref {
    const char *name; /* our trace name */
    char file[256];   /* fixture .npy, "" if the fixture lacks it */
    double bound;
    int seen;
    double worst;
} stage_ref;

typedef struct trace_ctx {
    const char *dir, *case_name;
    stage_ref *st;
    int n;
} trace_ctx;

static double compare(const char *what, const float *got, const float *ref, int64_t n) {
    double s = 0, s2 = 0, worst = 0;
    for (int64_t i = 0; i < n; i++) s += ref[i], s2 += (double)ref[i] * ref[i];
    double mean = s / n, sd = sqrt(s2 / n - mean * mean);
    if (!(sd > 0)) sd = 1;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (d != d) d = INFINITY;
        if (d / sd > worst) worst = d / sd;
    }
    (void)what;
    return worst;
}

static void on_stage(void *ctxp, const char *name, const float *data, int64_t rows, int cols) {
    trace_ctx *c = ctxp;
    for (int i = 0; i < c->n; i++) {
        stage_ref *s = &c->st[i];
        if (strcmp(s->name, name) || !s->file[0]) continue;
        char path[800], err[256], *buf = NULL;
        size_t len;
        snprintf(path, sizeof path, "%s/%s", c->dir, s->file);
        if (file_read_all(path, (size_t)1 << 30, &buf, &len, err, sizeof err)) {
            test_fail(__FILE__, __LINE__, "%s", err);
            return;
        }
        npy_array a;
        if (npy_parse_f32(buf, len, &a, err, sizeof err) || a.numel != rows * cols) {
            test_fail(__FILE__, __LINE__, "%s: %s (%lld values, want %lld x %d)", path, err,
                      (long long)a.numel, (long long)rows, cols);
        } else {
            s->worst = compare(name, data, a.data, rows * cols);
            s->seen = 1;
            CHECK_MSG(s->worst <= s->bound, "%s %s: max |diff| = %.3g x std, bound %g", c->case_name, name,
                      s->worst, s->bound);
            printf("  %s %-12s %.3g x std\n", c->case_name, name, s->worst);
        }
        free(buf);
    }
}

TEST(vision_tower_matches_transformers) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/qwen35_vision", test_fixtures_dir());
    snprintf(path, sizeof path, "%s/cases.json", dir);
    if (!file_exists(path))
        SKIP("tests/fixtures/qwen35_vision not made yet (tools/oracle/make_vision_fixtures.py)");
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    REQUIRE(root);
    model *m = load("qwen35_vision");
    REQUIRE(m);
    REQUIRE(m->vis.present);
    threadpool *tp = tp_create(2);
    size_t ci;
    json_t *c;
    json_array_foreach(json_object_get(root, "cases"), ci, c) {
        const char *cname = json_string_value(json_object_get(c, "name"));
        json_t *grids = json_object_get(c, "image_grid_thw");
        int ni = (int)json_array_size(grids);
        vision_grid g[8];
        REQUIRE(ni >= 1 && ni <= 8);
        for (int i = 0; i < ni; i++) {
            json_t *e = json_array_get(grids, (size_t)i);
            g[i] = (vision_grid){(int)json_integer_value(json_array_get(e, 0)),
                                 (int)json_integer_value(json_array_get(e, 1)),
                                 (int)json_integer_value(json_array_get(e, 2))};
        }
        char pp[800], err[512], *pbuf = NULL;
        size_t plen;
        snprintf(pp, sizeof pp, "%s/%s", dir, json_string_value(json_object_get(c, "pixel_values")));
        REQUIRE(file_read_all(pp, (size_t)1 << 30, &pbuf, &plen, err, sizeof err) == 0);
        npy_array px;
        REQUIRE(npy_parse_f32(pbuf, plen, &px, err, sizeof err) == 0);
        int64_t np = 0, nt = 0;
        REQUIRE(vision_check_grids(&m->vis, g, ni, &np, err, sizeof err) == 0);
        for (int i = 0; i < ni; i++) nt += vision_tokens(&m->vis, g[i]);
        CHECK_EQ_INT(px.shape[0], np);
        CHECK_EQ_INT(px.shape[1], m->vis.patch_dim);

        stage_ref st[16];
        int n = 0;
        json_t *stages = json_object_get(c, "vision_stages");
        const char *keys[][2] = {
            {"patch_embed", "patch_embed"}, {"pos_embed", "pos_embed"}, {"rotary", "rotary_angles"}};
        for (int k = 0; k < 3; k++) {
            st[n] = (stage_ref){keys[k][0], "", k == 0 ? VIS_BOUND_PATCH : VIS_BOUND_EXACTISH, 0, 0};
            const char *f = json_string_value(json_object_get(stages, keys[k][1]));
            if (f) snprintf(st[n].file, sizeof st[n].file, "%s", f);
            n++;
        }
        static char bnames[8][24];
        for (int b = 0; b < m->vis.depth && b < 8; b++) {
            snprintf(bnames[b], sizeof bnames[b], "block%d", b);
            st[n] = (stage_ref){bnames[b], "", VIS_BOUND_DEEP, 0, 0};
            const char *f = json_string_value(json_object_get(stages, bnames[b]));
            if (f) snprintf(st[n].file, sizeof st[n].file, "%s", f);
            n++;
        }
        st[n] = (stage_ref){"merger", "", VIS_BOUND_DEEP, 0, 0};
        snprintf(st[n].file, sizeof st[n].file, "%s", json_string_value(json_object_get(c, "vision")));
        n++;
        trace_ctx tc = {dir, cname, st, n};
        float *out = malloc(sizeof(float) * (size_t)nt * m->H);
        CHECK_EQ_INT(vision_encode(m, tp, px.data, g, ni, out, on_stage, &tc, err, sizeof err), 0);
        for (int i = 0; i < n; i++)
            CHECK_MSG(st[i].seen || !st[i].file[0], "%s: stage %s not compared", cname, st[i].name);
        CHECK_MSG(st[n - 1].seen, "%s: the merged output was not compared", cname);
        free(out);
        free(pbuf);
    }
    tp_destroy(tp);
    model_free(m);
    json_decref(root);
}

/* vision_config: defaults, fields read, and what changes the numbers refused. */
TEST(vision_config_parse) {
    static model_config c;
    char err[512];
    const char *head =
        "{\"model_type\":\"qwen3_5\",\"text_config\":{\"hidden_size\":64,\"num_hidden_layers\":2,\"vocab_"
        "size\":100,"
        "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"head_dim\":32,\"linear_num_key_heads\":1,"
        "\"linear_num_value_heads\":1,\"linear_key_head_dim\":16,\"linear_value_head_dim\":16,"
        "\"linear_conv_kernel_dim\":4,\"intermediate_size\":32,\"full_attention_interval\":2,"
        "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":10000.0,\"partial_rotary_factor\":0.5}"
        "},"
        "\"vision_config\":";
    char buf[2048];
    snprintf(buf, sizeof buf, "%s{}}", head);
    REQUIRE(config_parse(buf, strlen(buf), "c.json", &c, err, sizeof err) == 0);
    CHECK(c.has_vision);
    CHECK_EQ_INT(c.vis_depth, 27);
    CHECK_EQ_INT(c.vis_hidden, 1152);
    CHECK_EQ_INT(c.vis_num_pos, 2304);
    CHECK_NEAR(c.vis_rope_theta, 10000.0, 0);
    snprintf(buf, sizeof buf,
             "%s{\"depth\":2,\"hidden_size\":32,\"num_heads\":2,\"num_position_embeddings\":36,"
             "\"rope_parameters\":{\"rope_theta\":500.0,\"rope_type\":\"axial\"}}}",
             head);
    REQUIRE(config_parse(buf, strlen(buf), "c.json", &c, err, sizeof err) == 0);
    CHECK_EQ_INT(c.vis_depth, 2);
    CHECK_EQ_INT(c.vis_num_pos, 36);
    CHECK_NEAR(c.vis_rope_theta, 500.0, 0);
    const char *bad[] = {"{\"num_position_embeddings\":35}", "{\"hidden_act\":\"gelu\"}",
                         "{\"deepstack_visual_indexes\":[5]}", "{\"hidden_size\":30,\"num_heads\":4}", "[]"};
    const char *why[] = {"perfect square", "hidden_act", "deepstack", "head size", "must be an object"};
    for (int i = 0; i < 5; i++) {
        snprintf(buf, sizeof buf, "%s%s}", head, bad[i]);
        CHECK_MSG(config_parse(buf, strlen(buf), "c.json", &c, err, sizeof err) < 0, "%s accepted", bad[i]);
        CHECK_STR_CONTAINS(err, why[i]);
    }
}

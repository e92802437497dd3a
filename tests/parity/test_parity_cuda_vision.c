/* test_parity_cuda_vision.c — images on --device cuda (GPU only; each test skips without a device):
 * the CUDA vision tower against transformers' features (tests/fixtures/qwen35_vision) and against the CPU
 * tower, on the fixture and on a random tower of the real 27B / 35B-A3B shape (head_dim 72, frames wider
 * than the attention kernel's tiles); the logits of the fixture's image prompts through a cuda context
 * against transformers (prompt) and the CPU (decode steps fed generate()'s ids); and text rows unchanged:
 * a text prompt gives the same bits before and after an image request, and a text decode step batched with
 * an image sequence's step gives the bits it gives alone. Bound as for every bf16 CUDA path:
 * ||d|| / ||ref|| <= 1e-2 per row. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cinfer.h"
#include "model/forward_cuda.h"
#include "model/vision.h"
#include "model/vision_cuda.h"
#include "runtime/ctx_internal.h"
#include "runtime/mm.h"
#include "cuda_ctx.h"
#include "test.h"
#include "util/bf16.h"
#include "util/file.h"
#include "util/npy.h"
#include "util/threadpool.h"

#define CUDA_BOUND 1e-2

static int no_device(void) {
    return !cuda_built() || cuda_devices() < 1;
}

/* worst per-row ||got - ref|| / ||ref|| over rows of n */
static double row_rel(const float *got, const float *ref, int64_t rows, int n) {
    double worst = 0;
    for (int64_t r = 0; r < rows; r++) {
        double d = 0, s = 0;
        for (int i = 0; i < n; i++) {
            double e = (double)got[r * n + i] - ref[r * n + i];
            if (!isfinite(got[r * n + i])) e = INFINITY;
            d += e * e, s += (double)ref[r * n + i] * ref[r * n + i];
        }
        double rel = sqrt(d / (s > 0 ? s : 1));
        if (!(rel <= worst)) worst = rel;
    }
    return worst;
}

static float *read_npy(const char *dir, const char *file, int64_t *rows, int64_t *cols, char **keep) {
    char path[800], err[512];
    size_t len;
    snprintf(path, sizeof path, "%s/%s", dir, file ? file : "(null)");
    *keep = NULL;
    if (!file || file_read_all(path, (size_t)1 << 31, keep, &len, err, sizeof err)) {
        test_fail(__FILE__, __LINE__, "%s: %s", path, file ? err : "not named");
        return NULL;
    }
    npy_array a;
    if (npy_parse_f32(*keep, len, &a, err, sizeof err) || a.ndim != 2) {
        test_fail(__FILE__, __LINE__, "%s: %s", path, a.ndim != 2 ? "not 2-D" : err);
        return NULL;
    }
    *rows = a.shape[0], *cols = a.shape[1];
    return (float *)a.data;
}

/* the CPU tower's stages, kept by name; the CUDA tower's stages compared against them as they come */
typedef struct stages {
    char name[16][24];
    float *data[16];
    int64_t n[16];
    int count;
    const char *label;
    double worst;
} stages;

static void keep_stage(void *ctxp, const char *name, const float *data, int64_t rows, int cols) {
    stages *s = ctxp;
    if (s->count == 16 || !strcmp(name, "pos_embed") || !strcmp(name, "rotary")) return;
    snprintf(s->name[s->count], sizeof s->name[0], "%s", name);
    s->data[s->count] = malloc(sizeof(float) * rows * cols);
    memcpy(s->data[s->count], data, sizeof(float) * rows * cols);
    s->n[s->count++] = rows * cols;
}

static double row_rel(const float *got, const float *ref, int64_t rows, int n);

static void compare_stage(void *ctxp, const char *name, const float *data, int64_t rows, int cols) {
    stages *s = ctxp;
    for (int i = 0; i < s->count; i++)
        if (!strcmp(s->name[i], name) && s->n[i] == rows * cols) {
            double w = row_rel(data, s->data[i], rows, cols);
            printf("    %-10s %-11s cuda vs cpu %.2e\n", s->label, name, w);
            if (!(w <= s->worst)) s->worst = w;
            return;
        }
    test_fail(__FILE__, __LINE__, "%s: the CUDA tower traced %s, which the CPU tower did not", s->label,
              name);
}

static void free_stages(stages *s) {
    for (int i = 0; i < s->count; i++) free(s->data[i]);
    s->count = 0;
}

static json_t *fixture_cases(char *dir, size_t dlen) {
    char path[700];
    snprintf(dir, dlen, "%s/qwen35_vision", test_fixtures_dir());
    snprintf(path, sizeof path, "%s/cases.json", dir);
    json_error_t je;
    return json_load_file(path, 0, &je);
}

/* Without a device the tower refuses with a message (this one runs everywhere). */
TEST(cuda_vision_refuses_without_device) {
    if (!no_device()) SKIP("a CUDA device is visible: the refusal is for machines without one");
    char dir[512], err[256];
    snprintf(dir, sizeof dir, "%s/qwen35_vision", test_fixtures_dir());
    cinfer_model *m;
    REQUIRE(cinfer_model_open(dir, &m, err, sizeof err) == 0);
    cuda_vision *v = (cuda_vision *)1;
    CHECK_EQ_INT(cuda_vision_create(cinfer_model_internal(m), &v, err, sizeof err), CINFER_EUNSUPPORTED);
    CHECK(v == NULL);
    CHECK(strlen(err) > 0);
    cinfer_model_close(m);
}

/* a second tower with the attention on the tensor cores (CINFER_CUDA_VIS_ATTN=tc), or NULL */
static cuda_vision *tower_tc(const model *m) {
    char err[256];
    setenv("CINFER_CUDA_VIS_ATTN", "tc", 1);
    cuda_vision *v = NULL;
    int rc = cuda_vision_create(m, &v, err, sizeof err);
    unsetenv("CINFER_CUDA_VIS_ATTN");
    CHECK_MSG(rc == 0, "cuda_vision_create (tc): %s", err);
    return rc ? NULL : v;
}

TEST(cuda_vision_tower_fixture) {
    if (no_device()) SKIP("no CUDA device: skipped");
    char dir[512], err[512];
    json_t *root = fixture_cases(dir, sizeof dir);
    REQUIRE(root);
    cinfer_model *cm;
    REQUIRE(cinfer_model_open(dir, &cm, err, sizeof err) == 0);
    const model *m = cinfer_model_internal(cm);
    cuda_vision *cv = NULL;
    int rc = cuda_vision_create(m, &cv, err, sizeof err);
    CHECK_MSG(rc == 0, "cuda_vision_create: %s", err);
    cuda_vision *tc = rc ? NULL : tower_tc(m);
    threadpool *tp = tp_create(4);
    size_t ci;
    json_t *c;
    json_array_foreach(json_object_get(root, "cases"), ci, c) {
        if (rc) break;
        const char *cname = json_string_value(json_object_get(c, "name"));
        json_t *grids = json_object_get(c, "image_grid_thw");
        int ni = (int)json_array_size(grids);
        REQUIRE(ni >= 1 && ni <= 8);
        vision_grid g[8];
        int64_t nt = 0;
        for (int i = 0; i < ni; i++) {
            json_t *e = json_array_get(grids, (size_t)i);
            g[i] = (vision_grid){(int)json_integer_value(json_array_get(e, 0)),
                                 (int)json_integer_value(json_array_get(e, 1)),
                                 (int)json_integer_value(json_array_get(e, 2))};
            nt += vision_tokens(&m->vis, g[i]);
        }
        char *pk, *fk;
        int64_t pr, pc, fr, fc;
        const float *px = read_npy(dir, json_string_value(json_object_get(c, "pixel_values")), &pr, &pc, &pk);
        const float *ref = read_npy(dir, json_string_value(json_object_get(c, "vision")), &fr, &fc, &fk);
        if (px && ref && fr == nt && fc == m->H) {
            float *gpu = malloc(sizeof(float) * nt * m->H), *cpu = malloc(sizeof(float) * nt * m->H),
                  *one = malloc(sizeof(float) * nt * m->H);
            stages st = {.label = cname};
            CHECK_EQ_INT(vision_encode(m, tp, px, g, ni, cpu, keep_stage, &st, err, sizeof err), 0);
            CHECK_EQ_INT(cuda_vision_encode(cv, px, g, ni, gpu, compare_stage, &st, err, sizeof err), 0);
            free_stages(&st);
            /* each image alone: attention never crosses images */
            int64_t po = 0, to = 0;
            for (int i = 0; i < ni; i++) {
                CHECK_EQ_INT(cuda_vision_encode(cv, px + po * pc, &g[i], 1, one + to * m->H, NULL, NULL, err,
                                                sizeof err),
                             0);
                po += (int64_t)g[i].t * g[i].h * g[i].w;
                to += vision_tokens(&m->vis, g[i]);
            }
            double vs_ref = row_rel(gpu, ref, nt, m->H), vs_cpu = row_rel(gpu, cpu, nt, m->H),
                   cpu_ref = row_rel(cpu, ref, nt, m->H), solo = row_rel(one, gpu, nt, m->H);
            printf("  %-11s cuda tower vs transformers %.2e, vs cpu %.2e (cpu vs transformers %.2e), "
                   "alone vs together %.2e\n",
                   cname, vs_ref, vs_cpu, cpu_ref, solo);
            CHECK_MSG(vs_ref <= CUDA_BOUND, "%s: cuda tower vs transformers %.3g", cname, vs_ref);
            CHECK_MSG(vs_cpu <= CUDA_BOUND, "%s: cuda tower vs cpu %.3g", cname, vs_cpu);
            CHECK_MSG(solo <= CUDA_BOUND, "%s: images alone vs together %.3g", cname, solo);
            if (tc) {
                stages st2 = {.label = "tc"};
                CHECK_EQ_INT(vision_encode(m, tp, px, g, ni, cpu, keep_stage, &st2, err, sizeof err), 0);
                CHECK_EQ_INT(cuda_vision_encode(tc, px, g, ni, one, compare_stage, &st2, err, sizeof err), 0);
                free_stages(&st2);
                double t_ref = row_rel(one, ref, nt, m->H), t_cpu = row_rel(one, cpu, nt, m->H);
                printf("  %-11s tensor-core attention: vs transformers %.2e, vs cpu %.2e\n", cname, t_ref,
                       t_cpu);
                CHECK_MSG(t_ref <= CUDA_BOUND && t_cpu <= CUDA_BOUND, "%s: tc tower %.3g / %.3g", cname,
                          t_ref, t_cpu);
            }
            free(gpu), free(cpu), free(one);
        } else {
            CHECK_MSG(0, "%s: fixture arrays missing or of the wrong shape", cname);
        }
        free(pk), free(fk);
    }
    tp_destroy(tp);
    cuda_vision_destroy(cv);
    cuda_vision_destroy(tc);
    cinfer_model_close(cm);
    json_decref(root);
}

static uint64_t g_rng = 4242;
static float urand(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}
static wmat rmat(int rows, int cols, float scale) {
    uint16_t *w = malloc(sizeof(uint16_t) * (size_t)rows * cols);
    for (size_t i = 0; i < (size_t)rows * cols; i++) w[i] = f32_to_bf16(scale * urand());
    return (wmat){w, WT_BF16, rows, cols};
}
static float *rvec(int n, float mean, float scale) {
    float *v = malloc(sizeof(float) * n);
    for (int i = 0; i < n; i++) v[i] = mean + scale * urand();
    return v;
}

/* A random tower of a real shape: width D, heads, mlp I, depth, into out_hidden (48 x 48 position table). */
static void make_tower(model *m, int D, int heads, int I, int depth, int out) {
    vision_weights *v = &m->vis;
    m->H = out;
    *v = (vision_weights){.present = 1,
                          .D = D,
                          .heads = heads,
                          .head_dim = D / heads,
                          .I = I,
                          .depth = depth,
                          .patch = 16,
                          .temporal = 2,
                          .merge = 2,
                          .in_ch = 3,
                          .patch_dim = 1536,
                          .out_hidden = out,
                          .grid_side = 48};
    float s = 1.0f / sqrtf((float)D);
    v->patch_w = rmat(D, 1536, 1.0f / sqrtf(1536.0f));
    v->patch_b = rvec(D, 0, 0.1f);
    v->pos = rvec(48 * 48 * D, 0, 0.5f);
    v->inv_freq = malloc(sizeof(float) * v->head_dim / 4);
    for (int i = 0; i < v->head_dim / 4; i++)
        v->inv_freq[i] = 1.0f / powf(10000.0f, (float)(2 * i) / (float)(v->head_dim / 2));
    v->blocks = calloc((size_t)depth, sizeof *v->blocks);
    for (int b = 0; b < depth; b++) {
        vision_block_weights *w = &v->blocks[b];
        w->norm1_w = rvec(D, 1, 0.1f), w->norm1_b = rvec(D, 0, 0.1f), w->norm2_w = rvec(D, 1, 0.1f),
        w->norm2_b = rvec(D, 0, 0.1f);
        w->qkv = rmat(3 * D, D, 2 * s), w->qkv_b = rvec(3 * D, 0, 0.1f);
        w->proj = rmat(D, D, s), w->proj_b = rvec(D, 0, 0.1f);
        w->fc1 = rmat(I, D, s), w->fc1_b = rvec(I, 0, 0.1f);
        w->fc2 = rmat(D, I, 1.0f / sqrtf((float)I)), w->fc2_b = rvec(D, 0, 0.1f);
    }
    v->mnorm_w = rvec(D, 1, 0.1f), v->mnorm_b = rvec(D, 0, 0.1f);
    v->mfc1 = rmat(4 * D, 4 * D, 0.5f * s), v->mfc1_b = rvec(4 * D, 0, 0.1f);
    v->mfc2 = rmat(out, 4 * D, 0.5f * s), v->mfc2_b = rvec(out, 0, 0.1f);
}

static void free_tower(model *m) {
    vision_weights *v = &m->vis;
    free((void *)v->patch_w.data), free(v->patch_b), free(v->pos), free(v->inv_freq);
    for (int b = 0; b < v->depth; b++) {
        vision_block_weights *w = &v->blocks[b];
        free(w->norm1_w), free(w->norm1_b), free(w->norm2_w), free(w->norm2_b);
        free((void *)w->qkv.data), free(w->qkv_b), free((void *)w->proj.data), free(w->proj_b);
        free((void *)w->fc1.data), free(w->fc1_b), free((void *)w->fc2.data), free(w->fc2_b);
    }
    free(v->blocks), free(v->mnorm_w), free(v->mnorm_b);
    free((void *)v->mfc1.data), free(v->mfc1_b), free((void *)v->mfc2.data), free(v->mfc2_b);
}

/* The 27B / 35B-A3B tower's shape (width 1152, 16 heads of 72, mlp 4304), two blocks, against the CPU:
 * a 20 x 20 image (400 patches: several query blocks and key tiles per frame), a 4 x 6 one and a two-frame
 * 6 x 4 one in one call. Then the 0.8B shape (768 / 12 heads of 64). */
TEST(cuda_vision_tower_real_shapes) {
    if (no_device()) SKIP("no CUDA device: skipped");
    int shapes[2][5] = {{1152, 16, 4304, 2, 2048}, {768, 12, 3072, 1, 1024}};
    threadpool *tp = tp_create(8);
    for (int s = 0; s < 2; s++) {
        static model m;
        memset(&m, 0, sizeof m);
        make_tower(&m, shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], shapes[s][4]);
        vision_grid g[3] = {{1, 20, 20}, {1, 4, 6}, {2, 6, 4}};
        int64_t np = 0, nt = 0;
        for (int i = 0; i < 3; i++)
            np += (int64_t)g[i].t * g[i].h * g[i].w, nt += vision_tokens(&m.vis, g[i]);
        float *px = malloc(sizeof(float) * np * 1536);
        for (int64_t i = 0; i < np * 1536; i++) px[i] = urand();
        float *gpu = malloc(sizeof(float) * nt * m.H), *cpu = malloc(sizeof(float) * nt * m.H);
        char err[256];
        cuda_vision *cv = NULL;
        int rc = cuda_vision_create(&m, &cv, err, sizeof err);
        CHECK_MSG(rc == 0, "%s", err);
        if (!rc) {
            stages st = {.label = s ? "0.8b" : "27b"};
            CHECK_EQ_INT(vision_encode(&m, tp, px, g, 3, cpu, keep_stage, &st, err, sizeof err), 0);
            CHECK_EQ_INT(cuda_vision_encode(cv, px, g, 3, gpu, compare_stage, &st, err, sizeof err), 0);
            free_stages(&st);
            double w = row_rel(gpu, cpu, nt, m.H);
            printf("  tower %d/%d heads of %d, depth %d: cuda vs cpu %.2e per row at worst (%lld tokens)\n",
                   shapes[s][0], shapes[s][1], m.vis.head_dim, m.vis.depth, w, (long long)nt);
            CHECK_MSG(w <= CUDA_BOUND, "width %d: cuda tower vs cpu %.3g", shapes[s][0], w);
            cuda_vision *tc = tower_tc(&m);
            if (tc) {
                stages st2 = {.label = "tc"};
                CHECK_EQ_INT(vision_encode(&m, tp, px, g, 3, cpu, keep_stage, &st2, err, sizeof err), 0);
                CHECK_EQ_INT(cuda_vision_encode(tc, px, g, 3, gpu, compare_stage, &st2, err, sizeof err), 0);
                free_stages(&st2);
                double wt = row_rel(gpu, cpu, nt, m.H);
                printf("  tower %d: tensor-core attention vs cpu %.2e\n", shapes[s][0], wt);
                CHECK_MSG(wt <= CUDA_BOUND, "width %d: tc tower vs cpu %.3g", shapes[s][0], wt);
            }
            cuda_vision_destroy(tc);
        }
        cuda_vision_destroy(cv);
        free(px), free(gpu), free(cpu);
        free_tower(&m);
    }
    tp_destroy(tp);
}

static cinfer_image *load_image(cinfer_model *m, const char *dir, json_t *meta, const char *name) {
    size_t i;
    json_t *e;
    json_array_foreach(meta, i, e) {
        if (strcmp(json_string_value(json_object_get(e, "name")), name)) continue;
        char path[800], err[512], *buf = NULL;
        size_t len;
        snprintf(path, sizeof path, "%s/%s", dir, json_string_value(json_object_get(e, "file")));
        if (file_read_all(path, (size_t)1 << 26, &buf, &len, err, sizeof err)) {
            test_fail(__FILE__, __LINE__, "%s", err);
            return NULL;
        }
        cinfer_image *im = NULL;
        int rc = cinfer_image_load(m, buf, len, 0, &im, err, sizeof err);
        free(buf);
        CHECK_MSG(rc == 0, "%s: %s", path, err);
        return rc ? NULL : im;
    }
    return NULL;
}

/* prompt in chunks of `chunk` (all logits), then the given tokens one step each; rows [n + n_dec][V] */
static int run_seq(cinfer_ctx *ctx, const int32_t *ids, int n, cinfer_image **ims, int ni, int chunk,
                   const int32_t *dec, int n_dec, float *rows, int V, char *err, size_t errlen) {
    int seq = cinfer_seq_open(ctx, err, errlen);
    if (seq < 0) return seq;
    int rc = cinfer_seq_set_images(ctx, seq, ids, n, ims, ni, NULL, err, errlen);
    for (int off = 0; off < n && !rc; off += chunk) {
        int k = n - off < chunk ? n - off : chunk;
        cinfer_batch_entry e = {seq, ids + off, k, 1, 0};
        rc = cinfer_forward(ctx, &e, 1, rows + (size_t)off * V, err, errlen);
    }
    for (int t = 0; t < n_dec && !rc; t++) {
        cinfer_batch_entry e = {seq, dec + t, 1, 1, 0};
        rc = cinfer_forward(ctx, &e, 1, rows + (size_t)(n + t) * V, err, errlen);
    }
    cinfer_seq_close(ctx, seq);
    return rc;
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

TEST(cuda_vision_logits_fixture) {
    if (no_device()) SKIP("no CUDA device: skipped");
    char dir[512], err[512];
    json_t *root = fixture_cases(dir, sizeof dir);
    REQUIRE(root);
    cinfer_model *m;
    REQUIRE(cinfer_model_open(dir, &m, err, sizeof err) == 0);
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    int V = info.vocab_size;
    json_t *meta = json_object_get(root, "images");
    size_t ci;
    json_t *c;
    int n_cases = 0;
    json_array_foreach(json_object_get(root, "cases"), ci, c) {
        const char *cname = json_string_value(json_object_get(c, "name"));
        json_t *names = json_object_get(c, "images");
        int ni = (int)json_array_size(names);
        REQUIRE(ni >= 1 && ni <= 8);
        /* each context encodes its own copy: the cuda one on the device, the cpu one on the cpu */
        cinfer_image *gi[8] = {0}, *ci_[8] = {0};
        int ok = 1;
        for (int i = 0; i < ni; i++) {
            const char *nm = json_string_value(json_array_get(names, (size_t)i));
            ok &= (gi[i] = load_image(m, dir, meta, nm)) != NULL;
            ok &= (ci_[i] = load_image(m, dir, meta, nm)) != NULL;
        }
        json_t *jids = json_object_get(c, "input_ids");
        json_t *gout = json_object_get(json_object_get(c, "greedy"), "output");
        int n = (int)json_array_size(jids), nd = (int)json_array_size(gout);
        int32_t *ids = malloc(sizeof(int32_t) * n), *dec = malloc(sizeof(int32_t) * (nd + 1));
        for (int i = 0; i < n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(jids, (size_t)i));
        for (int i = 0; i < nd; i++) dec[i] = (int32_t)json_integer_value(json_array_get(gout, (size_t)i));
        char *lk;
        int64_t lr, lc;
        const float *ref = read_npy(dir, json_string_value(json_object_get(c, "logits")), &lr, &lc, &lk);
        float *g = malloc(sizeof(float) * (size_t)(n + nd) * V),
              *cp = malloc(sizeof(float) * (size_t)(n + nd) * V);
        if (ok && ref && lr == n && lc == V) {
            cinfer_ctx *cc = test_ctx(m, CINFER_DEVICE_CPU, 1, n + nd + 1, n, 4);
            REQUIRE(cc);
            /* decode steps take generate()'s ids (all but the last, whose logits nothing checks) */
            CHECK_EQ_INT(run_seq(cc, ids, n, ci_, ni, n, dec, nd - 1, cp, V, err, sizeof err), 0);
            cinfer_ctx_destroy(cc);
            int chunks[2] = {n, 7};
            for (int k = 0; k < 2; k++) {
                cinfer_ctx *gc = test_ctx(m, CINFER_DEVICE_CUDA, 1, n + nd + 1, n, 4);
                REQUIRE(gc);
                int rc = run_seq(gc, ids, n, gi, ni, chunks[k], dec, nd - 1, g, V, err, sizeof err);
                CHECK_MSG(rc == 0, "%s: %s", cname, err);
                cinfer_ctx_destroy(gc);
                if (rc) break;
                double pre = row_rel(g, ref, n, V),
                       dcd = row_rel(g + (size_t)n * V, cp + (size_t)n * V, nd - 1, V);
                /* greedy: the argmax after the prompt and after each fed id against generate()'s next id */
                int agree = 0;
                for (int t = 0; t < nd; t++) agree += argmax(g + (size_t)(n - 1 + t) * V, V) == dec[t];
                printf("  %-11s chunks of %-3d cuda prompt logits vs transformers %.2e, decode vs cpu %.2e, "
                       "greedy %d/%d\n",
                       cname, chunks[k], pre, dcd, agree, nd);
                CHECK_MSG(pre <= CUDA_BOUND, "%s chunks of %d: prompt logits %.3g", cname, chunks[k], pre);
                CHECK_MSG(dcd <= CUDA_BOUND, "%s chunks of %d: decode logits vs cpu %.3g", cname, chunks[k],
                          dcd);
                /* the first choice after the prompt, where transformers' top-2 margin is clear (> 0.05 x its
                 * std, as the text parity test) */
                const float *rl = ref + (size_t)(n - 1) * V;
                int ra = argmax(rl, V), rb = ra ? 0 : 1;
                double s1 = 0, s2 = 0;
                for (int v = 0; v < V; v++) {
                    s1 += rl[v], s2 += (double)rl[v] * rl[v];
                    if (v != ra && rl[v] > rl[rb]) rb = v;
                }
                double sd = sqrt(s2 / V - (s1 / V) * (s1 / V));
                if (rl[ra] - rl[rb] > 0.05 * sd)
                    CHECK_MSG(argmax(g + (size_t)(n - 1) * V, V) == ra, "%s: first greedy id differs", cname);
            }
            n_cases++;
        } else {
            CHECK_MSG(0, "%s: fixture missing pieces", cname);
        }
        free(g), free(cp), free(lk), free(ids), free(dec);
        for (int i = 0; i < ni; i++) cinfer_image_free(gi[i]), cinfer_image_free(ci_[i]);
    }
    CHECK(n_cases >= 2);
    cinfer_model_close(m);
    json_decref(root);
}

/* Text rows keep their bits: the same text prompt before and after an image prompt ran in the context, and
 * a text decode step alone vs batched with an image sequence's decode step (both rows <= 8: the GEMV path,
 * whose rows do not depend on the batch). */
TEST(cuda_vision_text_rows_unchanged) {
    if (no_device()) SKIP("no CUDA device: skipped");
    char dir[512], err[512];
    json_t *root = fixture_cases(dir, sizeof dir);
    REQUIRE(root);
    cinfer_model *m;
    REQUIRE(cinfer_model_open(dir, &m, err, sizeof err) == 0);
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    int V = info.vocab_size;
    json_t *c = json_array_get(json_object_get(root, "cases"), 0);
    json_t *jids = json_object_get(c, "input_ids");
    int n = (int)json_array_size(jids);
    int32_t *ids = malloc(sizeof(int32_t) * n);
    for (int i = 0; i < n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(jids, (size_t)i));
    cinfer_image *im = load_image(m, dir, json_object_get(root, "images"),
                                  json_string_value(json_array_get(json_object_get(c, "images"), 0)));
    REQUIRE(im);
    int32_t text[12] = {100, 2000, 31, 4000, 577, 8, 1234, 99, 300, 4321, 17, 2500};
    cinfer_ctx *ctx = test_ctx(m, CINFER_DEVICE_CUDA, 3, n + 16, n + 16, 4);
    REQUIRE(ctx);
    float *a = malloc(sizeof(float) * 12 * V), *b = malloc(sizeof(float) * 12 * V),
          *img = malloc(sizeof(float) * (size_t)n * V), *two = malloc(sizeof(float) * 2 * V);
    /* text alone */
    int s0 = cinfer_seq_open(ctx, err, sizeof err);
    cinfer_batch_entry e = {s0, text, 11, 1, 0};
    REQUIRE(cinfer_forward(ctx, &e, 1, a, err, sizeof err) == 0);
    cinfer_batch_entry d = {s0, text + 11, 1, 1, 0};
    REQUIRE(cinfer_forward(ctx, &d, 1, a + (size_t)11 * V, err, sizeof err) == 0);
    cinfer_seq_close(ctx, s0);
    /* an image prompt, left open */
    int si = cinfer_seq_open(ctx, err, sizeof err);
    REQUIRE(cinfer_seq_set_images(ctx, si, ids, n, &im, 1, NULL, err, sizeof err) == 0);
    cinfer_batch_entry pe = {si, ids, n, 1, 0};
    REQUIRE(cinfer_forward(ctx, &pe, 1, img, err, sizeof err) == 0);
    /* the text prompt again; its last token batched with the image sequence's first decode step */
    int s1 = cinfer_seq_open(ctx, err, sizeof err);
    cinfer_batch_entry e2 = {s1, text, 11, 1, 0};
    REQUIRE(cinfer_forward(ctx, &e2, 1, b, err, sizeof err) == 0);
    int32_t nxt = argmax(img + (size_t)(n - 1) * V, V);
    cinfer_batch_entry both[2] = {{si, &nxt, 1, 1, 0}, {s1, text + 11, 1, 1, 0}};
    REQUIRE(cinfer_forward(ctx, both, 2, two, err, sizeof err) == 0);
    memcpy(b + (size_t)11 * V, two + V, sizeof(float) * V);
    CHECK_MSG(!memcmp(a, b, sizeof(float) * 11 * V), "a text prompt's logits changed after an image request");
    CHECK_MSG(!memcmp(a + (size_t)11 * V, b + (size_t)11 * V, sizeof(float) * V),
              "a text decode row batched with an image sequence differs from the row alone");
    cinfer_ctx_destroy(ctx);
    cinfer_image_free(im);
    free(a), free(b), free(img), free(two), free(ids);
    cinfer_model_close(m);
    json_decref(root);
}

/* test_parity_vision.c — prompts with images against transformers (tests/fixtures/qwen35_vision, made by
 * tools/oracle/make_vision_fixtures.py): for every case, the PNGs through cinfer_image_load give the
 * processor's pixel_values and image_grid_thw, the collapsed prompt expands back to its input_ids, the
 * layout gives its 3 x T mRoPE positions and rope_delta exactly, the logits of the whole prompt are within
 * 1e-4 x std of transformers' float32 ones at every position (also when the prompt is fed in chunks), and
 * greedy decoding after the prompt gives generate()'s ids. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cinfer.h"
#include "model/qwen35.h"
#include "runtime/ctx_internal.h"
#include "runtime/mm.h"
#include "test.h"
#include "util/file.h"
#include "util/npy.h"

#define VPARITY_BOUND 1e-4

static float *load_npy(const char *dir, const char *file, int64_t *rows, int64_t *cols, char **keep) {
    char path[800], err[512];
    snprintf(path, sizeof path, "%s/%s", dir, file ? file : "(null)");
    size_t len;
    if (!file || file_read_all(path, (size_t)1 << 31, keep, &len, err, sizeof err)) {
        test_fail(__FILE__, __LINE__, "%s: %s", path, file ? err : "no file named");
        return NULL;
    }
    npy_array a;
    if (npy_parse_f32(*keep, len, &a, err, sizeof err) || a.ndim != 2) {
        test_fail(__FILE__, __LINE__, "%s: %s", path, a.ndim != 2 ? "not 2-D" : err);
        return NULL;
    }
    *rows = a.shape[0];
    *cols = a.shape[1];
    return (float *)a.data;
}

static double max_rel(const float *got, const float *ref, int64_t n, int64_t *where) {
    double s = 0, s2 = 0, worst = 0;
    for (int64_t i = 0; i < n; i++) s += ref[i], s2 += (double)ref[i] * ref[i];
    double mean = s / n, sd = sqrt(s2 / n - mean * mean);
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (d != d) d = INFINITY;
        if (d / sd > worst) worst = d / sd, *where = i;
    }
    return worst;
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
    test_fail(__FILE__, __LINE__, "image %s not in cases.json", name);
    return NULL;
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Feeds prompt in chunks of `chunk` tokens (all logits) into a fresh sequence with the images; then greedy
 * decodes n_new tokens. logits: [n + n_new][V]. */
static int run_case(cinfer_model *m, const int32_t *ids, int n, cinfer_image **ims, int ni, int chunk,
                    int n_new, int32_t *out_new, float *logits, int V, int *delta, char *err, size_t errlen) {
    cinfer_ctx_params p = cinfer_ctx_default_params();
    p.max_seqs = 1;
    p.max_ctx = n + n_new + 1;
    p.max_batch = n;
    p.n_threads = 2;
    cinfer_ctx *ctx;
    int rc = cinfer_ctx_create(m, &p, &ctx, err, errlen);
    if (rc) return rc;
    int seq = cinfer_seq_open(ctx, err, errlen);
    if ((rc = cinfer_seq_set_images(ctx, seq, ids, n, ims, ni, delta, err, errlen))) goto done;
    for (int off = 0; off < n && !rc; off += chunk) {
        int k = n - off < chunk ? n - off : chunk;
        cinfer_batch_entry e = {seq, ids + off, k, 1, 0};
        rc = cinfer_forward(ctx, &e, 1, logits + (size_t)off * V, err, errlen);
    }
    int32_t tok = argmax(logits + (size_t)(n - 1) * V, V);
    for (int t = 0; t < n_new && !rc; t++) {
        out_new[t] = tok;
        cinfer_batch_entry e = {seq, &tok, 1, 1, 0};
        float *row = logits + (size_t)(n + t) * V;
        rc = cinfer_forward(ctx, &e, 1, row, err, errlen);
        tok = argmax(row, V);
    }
done:
    cinfer_ctx_destroy(ctx);
    return rc;
}

TEST(parity_vision_fixture) {
    char dir[512], path[600], err[1024];
    snprintf(dir, sizeof dir, "%s/qwen35_vision", test_fixtures_dir());
    snprintf(path, sizeof path, "%s/cases.json", dir);
    if (!file_exists(path))
        SKIP("tests/fixtures/qwen35_vision not made yet (tools/oracle/make_vision_fixtures.py)");
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    REQUIRE(root);
    cinfer_model *m;
    REQUIRE(cinfer_model_open(dir, &m, err, sizeof err) == 0);
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    REQUIRE(info.has_vision);
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
        cinfer_image *ims[8] = {0};
        int ok = 1;
        for (int i = 0; i < ni; i++)
            ok &= (ims[i] = load_image(m, dir, meta, json_string_value(json_array_get(names, i)))) != NULL;
        if (!ok) continue;

        /* preprocessing: grids and pixel values as the processor made them */
        char *pk = NULL;
        int64_t pr = 0, pc = 0, off = 0;
        const float *pv = load_npy(dir, json_string_value(json_object_get(c, "pixel_values")), &pr, &pc, &pk);
        json_t *grids = json_object_get(c, "image_grid_thw");
        double pv_worst = 0;
        for (int i = 0; i < ni; i++) {
            int t, h, w;
            cinfer_image_get_grid(ims[i], &t, &h, &w);
            json_t *g = json_array_get(grids, (size_t)i);
            CHECK_MSG(t == json_integer_value(json_array_get(g, 0)) &&
                          h == json_integer_value(json_array_get(g, 1)) &&
                          w == json_integer_value(json_array_get(g, 2)),
                      "%s image %d: grid (%d, %d, %d) differs from the processor's", cname, i, t, h, w);
            int64_t np = (int64_t)t * h * w;
            if (pv && off + np <= pr && pc == ims[i]->px.patch_dim)
                for (int64_t j = 0; j < np * pc; j++) {
                    double d = fabs((double)ims[i]->px.data[j] - pv[off * pc + j]);
                    if (d > pv_worst) pv_worst = d;
                }
            off += np;
        }
        CHECK_MSG(pv && off == pr, "%s: %lld patches, the processor made %lld", cname, (long long)off,
                  (long long)pr);
        CHECK_MSG(pv_worst <= 1e-6, "%s: pixel_values differ by %.3g", cname, pv_worst);
        free(pk);

        /* the prompt: collapsing each image run to one pad and expanding gives input_ids back */
        json_t *jids = json_object_get(c, "input_ids");
        int n = (int)json_array_size(jids);
        int32_t *ids = malloc(sizeof(int32_t) * n), *col = malloc(sizeof(int32_t) * n), *exp = NULL;
        int nc = 0, ne = 0;
        for (int i = 0; i < n; i++) {
            ids[i] = (int32_t)json_integer_value(json_array_get(jids, (size_t)i));
            if (!(ids[i] == info.image_token_id && i > 0 && ids[i - 1] == info.image_token_id))
                col[nc++] = ids[i];
        }
        REQUIRE(cinfer_expand_image_pads(m, col, nc, ims, ni, &exp, &ne, err, sizeof err) == 0);
        CHECK_MSG(ne == n && !memcmp(exp, ids, sizeof(int32_t) * n),
                  "%s: expanded prompt differs from input_ids", cname);
        free(exp);
        free(col);

        /* positions: the layout against the model's own position_ids */
        mm_layout L;
        vision_grid vg[8];
        for (int i = 0; i < ni; i++)
            vg[i] = (vision_grid){ims[i]->px.grid_t, ims[i]->px.grid_h, ims[i]->px.grid_w};
        REQUIRE(mm_layout_build(&cinfer_model_internal(m)->cfg, 2, ids, n, vg, ni, &L, err, sizeof err) == 0);
        json_t *pos = json_object_get(c, "position_ids");
        int bad = 0;
        for (int k = 0; k < 3; k++)
            for (int i = 0; i < n; i++)
                bad += L.pos[(size_t)k * n + i] !=
                       json_integer_value(json_array_get(json_array_get(pos, (size_t)k), (size_t)i));
        CHECK_MSG(!bad, "%s: %d mRoPE positions differ", cname, bad);
        CHECK_EQ_INT(L.delta, json_integer_value(json_object_get(c, "rope_delta")));
        mm_layout_free(&L);

        /* logits of the whole prompt, then greedy */
        char *lk = NULL;
        int64_t lr = 0, lc = 0;
        const float *ref = load_npy(dir, json_string_value(json_object_get(c, "logits")), &lr, &lc, &lk);
        json_t *gout = json_object_get(json_object_get(c, "greedy"), "output");
        int n_new = (int)json_array_size(gout);
        float *lg = malloc(sizeof(float) * (size_t)(n + n_new) * V);
        int32_t *got = malloc(sizeof(int32_t) * (n_new + 1));
        int delta = 0;
        if (ref && lr == n && lc == V) {
            int chunks[2] = {n, 7};
            for (int ch = 0; ch < 2; ch++) {
                int rc = run_case(m, ids, n, ims, ni, chunks[ch], n_new, got, lg, V, &delta, err, sizeof err);
                CHECK_MSG(rc == 0, "%s: %s", cname, err);
                if (rc) break;
                int64_t where = 0;
                double worst = max_rel(lg, ref, (int64_t)n * V, &where);
                CHECK_MSG(worst <= VPARITY_BOUND,
                          "%s (chunks of %d): max |logit - ref| = %.3g x std at position %lld", cname,
                          chunks[ch], worst, (long long)(where / V));
                printf("  %s chunks of %-3d logits %.3g x std\n", cname, chunks[ch], worst);
                int same = 1;
                for (int t = 0; t < n_new; t++)
                    same &= got[t] == json_integer_value(json_array_get(gout, (size_t)t));
                CHECK_MSG(same, "%s (chunks of %d): greedy continuation differs from generate()", cname,
                          chunks[ch]);
            }
            CHECK_EQ_INT(delta, json_integer_value(json_object_get(c, "rope_delta")));
        } else {
            CHECK_MSG(0, "%s: reference logits %lld x %lld, want %d x %d", cname, (long long)lr,
                      (long long)lc, n, V);
        }
        free(lg);
        free(got);
        free(lk);
        free(ids);
        for (int i = 0; i < ni; i++) cinfer_image_free(ims[i]);
        n_cases++;
    }
    CHECK(n_cases >= 2);

    /* images the processor saw alone (the tiny one, upscaled 20x30 -> 96x64): grid and pixel values */
    int n_alone = 0;
    json_t *im;
    json_array_foreach(meta, ci, im) {
        const char *pvf = json_string_value(json_object_get(im, "pixel_values"));
        if (!pvf) continue;
        const char *iname = json_string_value(json_object_get(im, "name"));
        cinfer_image *ci_im = load_image(m, dir, meta, iname);
        char *pk = NULL;
        int64_t pr = 0, pc = 0;
        const float *pv = load_npy(dir, pvf, &pr, &pc, &pk);
        if (ci_im && pv) {
            int t, h, w;
            cinfer_image_get_grid(ci_im, &t, &h, &w);
            json_t *g = json_object_get(im, "grid_thw");
            CHECK_MSG(t == json_integer_value(json_array_get(g, 0)) &&
                          h == json_integer_value(json_array_get(g, 1)) &&
                          w == json_integer_value(json_array_get(g, 2)),
                      "%s: grid (%d, %d, %d) differs from the processor's", iname, t, h, w);
            double worst = 0;
            int same = (int64_t)t * h * w == pr && pc == ci_im->px.patch_dim;
            for (int64_t j = 0; same && j < pr * pc; j++) {
                double d = fabs((double)ci_im->px.data[j] - pv[j]);
                if (!(d <= worst)) worst = d;
            }
            CHECK_MSG(same && worst <= 1e-6, "%s: pixel_values %lld x %lld differ by %.3g", iname,
                      (long long)pr, (long long)pc, worst);
            printf("  %s pixel_values max |diff| %.3g\n", iname, worst);
            n_alone++;
        }
        free(pk);
        cinfer_image_free(ci_im);
    }
    CHECK(n_alone >= 1);
    cinfer_model_close(m);
    json_decref(root);
}

/* `cinfer generate --image F --prompt TEXT` renders TEXT as one chat user message after the image: on the
 * fixture's one-image case (an image, then text) it must print generate()'s greedy ids; `cinfer chat --image`
 * answers through the engine. */
TEST(parity_vision_cli_prompt) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/qwen35_vision", test_fixtures_dir());
    snprintf(path, sizeof path, "%s/cases.json", dir);
    if (!file_exists(path))
        SKIP("tests/fixtures/qwen35_vision not made yet (tools/oracle/make_vision_fixtures.py)");
    const char *bin = getenv("CINFER_BIN");
    if (!bin) bin = "build/cinfer";
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    REQUIRE(root);
    size_t ci;
    json_t *c;
    int done = 0;
    json_array_foreach(json_object_get(root, "cases"), ci, c) {
        json_t *content = json_object_get(json_array_get(json_object_get(c, "messages"), 0), "content");
        /* exactly [image, text] */
        if (json_array_size(content) != 2 ||
            strcmp(json_string_value(json_object_get(json_array_get(content, 0), "type")), "image"))
            continue;
        const char *text = json_string_value(json_object_get(json_array_get(content, 1), "text"));
        const char *img = json_string_value(json_array_get(json_object_get(c, "images"), 0));
        json_t *gout = json_object_get(json_object_get(c, "greedy"), "output");
        REQUIRE(text && img && !strchr(text, '\'') && json_array_size(gout) > 0);
        char cmd[2048], want[1024] = "";
        for (size_t i = 0; i < json_array_size(gout); i++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", i ? "," : "",
                     (long long)json_integer_value(json_array_get(gout, i)));
        snprintf(
            cmd, sizeof cmd,
            "%s generate -m %s --image %s/images/%s.png --prompt '%s' -n %zu --ids --ignore-eos 2>/dev/null",
            bin, dir, dir, img, text, json_array_size(gout));
        FILE *p = popen(cmd, "r");
        REQUIRE(p);
        char line[2048] = "";
        if (!fgets(line, sizeof line, p)) line[0] = 0;
        CHECK_EQ_INT(pclose(p), 0);
        line[strcspn(line, "\n")] = 0;
        CHECK_MSG(!strcmp(line, want),
                  "%s: cinfer generate --image --prompt printed \"%s\", generate() gave \"%s\"",
                  json_string_value(json_object_get(c, "name")), line, want);
        snprintf(cmd, sizeof cmd,
                 "printf 'hello\\n' | %s chat -m %s --image %s/images/%s.png -n 3 --temp 0 >/dev/null 2>&1",
                 bin, dir, dir, img);
        CHECK_EQ_INT(system(cmd), 0);
        done++;
    }
    CHECK(done >= 1);
    json_decref(root);
}

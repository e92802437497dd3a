/* sampler.c — the sampler chain (see sampler.h). Owns the per-request working set: one allocation at
 * create holds the candidate array and the penalty bookkeeping, so a step touches no allocator.
 *
 * Order (vLLM v1 Sampler.forward and llama.cpp's default chain agree on the first two steps):
 *   raw logprobs → logit_bias → repetition, frequency, presence penalties → greedy | temperature →
 *   top_k → top_p → min_p → XTC → draw.
 * vLLM applies min_p before top_k/top_p and llama.cpp applies temperature last; we follow the order the
 * project fixed (temperature, then llama.cpp's top_k → top_p → min_p → XTC). top_k and min_p are both
 * "keep a prefix of the sorted order" and commute with each other; only top_p's position matters: its
 * mass is measured over the top_k survivors, before min_p trims the tail.
 *
 * Candidates are ordered by (logit descending, id ascending): a total order, so every selection and sort
 * below is deterministic, and ties anywhere resolve to the lower token id. */
#include "sample/sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cinfer.h"
#include "sample/sample.h"
#include "util/alloc.h"
#include "util/err.h"

typedef struct cand {
    float l; /* the adjusted logit (unscaled, so the order is exactly the logits' order) */
    int32_t id;
} cand;

struct sampler {
    sampler_params p; /* p.logit_bias points at bias */
    int n_vocab;
    rng r;
    sampler_bias *bias; /* [p.n_logit_bias] */
    float *w;           /* [n_vocab] logits after logit_bias and penalties (unscaled) */
    cand *c;            /* [n_vocab] candidate sets gathered from w: logit + id */
    /* Repetition window over prompt + output; NULL when the penalty is off. */
    int32_t *rep_count; /* [n_vocab] occurrences of each token inside the window */
    int32_t *rep_ids;   /* [n_vocab] the distinct tokens with rep_count > 0, unordered (n_rep of them) */
    int32_t *rep_pos;   /* [n_vocab] index of a token in rep_ids, valid while its rep_count > 0 */
    int n_rep;
    int32_t
        *ring; /* [repeat_last_n] the window's tokens when repeat_last_n > 0; oldest at ring_head once full */
    int ring_len, ring_head;
    /* Generated tokens for presence/frequency; NULL when both are 0. */
    int32_t *out_count; /* [n_vocab] occurrences among generated tokens */
    int32_t *out_ids;   /* [n_vocab] the distinct generated tokens (n_out of them) */
    int n_out;
    int64_t n_accepted;
};

sampler_params sampler_default_params(void) {
    sampler_params p;
    memset(&p, 0, sizeof p);
    p.temperature = 1.0f;
    p.top_p = 1.0f;
    p.xtc_threshold = 0.1f;
    p.repetition_penalty = 1.0f;
    p.repeat_last_n = -1;
    return p;
}

static int in_range(float v, float lo, float hi) {
    return v >= lo && v <= hi;
} /* false for NaN */

static size_t round64(size_t n) {
    return (n + 63) & ~(size_t)63;
}

int sampler_create(const sampler_params *p, int n_vocab, sampler **out, char *err, size_t errlen) {
    *out = NULL;
    if (n_vocab <= 0) return ci_err(err, errlen, CINFER_EINVAL, "sampler: vocabulary size %d", n_vocab);
    if (!(p->temperature >= 0.0f) || isinf(p->temperature))
        return ci_err(err, errlen, CINFER_EINVAL, "temperature must be a finite number >= 0");
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return ci_err(err, errlen, CINFER_EINVAL, "top_p must be in (0, 1]");
    if (!in_range(p->min_p, 0.0f, 1.0f)) return ci_err(err, errlen, CINFER_EINVAL, "min_p must be in [0, 1]");
    if (!in_range(p->xtc_probability, 0.0f, 1.0f))
        return ci_err(err, errlen, CINFER_EINVAL, "xtc_probability must be in [0, 1]");
    if (!(p->xtc_threshold >= 0.0f) || isinf(p->xtc_threshold))
        return ci_err(err, errlen, CINFER_EINVAL, "xtc_threshold must be a finite number >= 0");
    if (!(p->repetition_penalty > 0.0f) || isinf(p->repetition_penalty))
        return ci_err(err, errlen, CINFER_EINVAL, "repetition_penalty must be a finite number > 0");
    if (p->repeat_last_n < -1 || p->repeat_last_n > SAMPLER_MAX_WINDOW)
        return ci_err(err, errlen, CINFER_EINVAL, "repeat_last_n must be -1 (all), 0 (off) or up to %d",
                      SAMPLER_MAX_WINDOW);
    if (!in_range(p->presence_penalty, -2.0f, 2.0f))
        return ci_err(err, errlen, CINFER_EINVAL, "presence_penalty must be in [-2, 2]");
    if (!in_range(p->frequency_penalty, -2.0f, 2.0f))
        return ci_err(err, errlen, CINFER_EINVAL, "frequency_penalty must be in [-2, 2]");
    if (p->top_logprobs < 0 || p->top_logprobs > SAMPLER_MAX_LOGPROBS)
        return ci_err(err, errlen, CINFER_EINVAL, "top_logprobs must be in [0, %d]", SAMPLER_MAX_LOGPROBS);
    if (p->n_logit_bias < 0 || (p->n_logit_bias > 0 && !p->logit_bias))
        return ci_err(err, errlen, CINFER_EINVAL, "logit_bias: %d entries", p->n_logit_bias);
    for (int i = 0; i < p->n_logit_bias; i++) {
        const sampler_bias *b = &p->logit_bias[i];
        if (b->token < 0 || b->token >= n_vocab)
            return ci_err(err, errlen, CINFER_EINVAL, "logit_bias: token %d is outside the vocabulary (%d)",
                          (int)b->token, n_vocab);
        if (!in_range(b->bias, -100.0f, 100.0f))
            return ci_err(err, errlen, CINFER_EINVAL, "logit_bias: bias for token %d must be in [-100, 100]",
                          (int)b->token);
    }

    int rep_on = p->repetition_penalty != 1.0f && p->repeat_last_n != 0;
    int out_on = p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
    size_t V = (size_t)n_vocab, ring_n = rep_on && p->repeat_last_n > 0 ? (size_t)p->repeat_last_n : 0;
    size_t o_w = round64(sizeof(sampler));
    size_t o_c = o_w + round64(V * sizeof(float));
    size_t o_bias = o_c + round64(V * sizeof(cand));
    size_t o_rep = o_bias + round64((size_t)p->n_logit_bias * sizeof(sampler_bias));
    size_t o_ring = o_rep + (rep_on ? 3 * round64(V * sizeof(int32_t)) : 0);
    size_t o_out = o_ring + round64(ring_n * sizeof(int32_t));
    size_t total = o_out + (out_on ? 2 * round64(V * sizeof(int32_t)) : 0);
    char *mem = ci_try_alloc(total);
    if (!mem) return ci_err(err, errlen, CINFER_ENOMEM, "sampler: cannot allocate %zu bytes", total);

    sampler *s = (sampler *)mem; /* ci_try_alloc zeroes: counts start at 0 */
    s->p = *p;
    s->n_vocab = n_vocab;
    s->w = (float *)(mem + o_w);
    s->c = (cand *)(mem + o_c);
    s->bias = (sampler_bias *)(mem + o_bias);
    if (p->n_logit_bias) memcpy(s->bias, p->logit_bias, (size_t)p->n_logit_bias * sizeof(sampler_bias));
    s->p.logit_bias = s->bias;
    if (rep_on) {
        s->rep_count = (int32_t *)(mem + o_rep);
        s->rep_ids = (int32_t *)(mem + o_rep + round64(V * sizeof(int32_t)));
        s->rep_pos = (int32_t *)(mem + o_rep + 2 * round64(V * sizeof(int32_t)));
        if (ring_n) s->ring = (int32_t *)(mem + o_ring);
    }
    if (out_on) {
        s->out_count = (int32_t *)(mem + o_out);
        s->out_ids = (int32_t *)(mem + o_out + round64(V * sizeof(int32_t)));
    }
    rng_seed(&s->r, p->seed);
    *out = s;
    return 0;
}

void sampler_destroy(sampler *s) {
    free(s);
}

/* ---- penalty bookkeeping ---- */

static void rep_add(sampler *s, int32_t t) {
    if (s->rep_count[t]++ == 0) {
        s->rep_pos[t] = s->n_rep;
        s->rep_ids[s->n_rep++] = t;
    }
}

static void rep_remove(sampler *s, int32_t t) {
    CI_ASSERT(s->rep_count[t] > 0);
    if (--s->rep_count[t] == 0) { /* swap the last distinct token into t's place */
        int i = s->rep_pos[t];
        int32_t last = s->rep_ids[--s->n_rep];
        s->rep_ids[i] = last;
        s->rep_pos[last] = i;
    }
}

static void rep_push(sampler *s, int32_t t) {
    if (!s->rep_count) return;
    if (s->ring) {
        int cap = s->p.repeat_last_n;
        if (s->ring_len == cap)
            rep_remove(s, s->ring[s->ring_head]);
        else
            s->ring_len++;
        s->ring[s->ring_head] = t;
        s->ring_head = s->ring_head + 1 == cap ? 0 : s->ring_head + 1;
    }
    rep_add(s, t);
}

int sampler_set_prompt(sampler *s, const int32_t *tokens, int n, char *err, size_t errlen) {
    if (s->n_accepted)
        return ci_err(err, errlen, CINFER_ESTATE, "sampler: the prompt must be set before generated tokens");
    if (n < 0 || (n > 0 && !tokens))
        return ci_err(err, errlen, CINFER_EINVAL, "sampler: %d prompt tokens", n);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= s->n_vocab)
            return ci_err(err, errlen, CINFER_EINVAL,
                          "sampler: prompt token %d at %d is outside the vocabulary (%d)", (int)tokens[i], i,
                          s->n_vocab);
    for (int i = 0; i < n; i++) rep_push(s, tokens[i]);
    return 0;
}

int sampler_accept(sampler *s, int32_t t) {
    if (t < 0 || t >= s->n_vocab) return CINFER_EINVAL;
    rep_push(s, t);
    if (s->out_count && s->out_count[t]++ == 0) s->out_ids[s->n_out++] = t;
    s->n_accepted++;
    return 0;
}

/* ---- ordering, selection, sorting on (logit desc, id asc) ---- */

static inline int better(const cand *a, const cand *b) {
    return a->l > b->l || (a->l == b->l && a->id < b->id);
}

static inline void swap_c(cand *a, cand *b) {
    cand t = *a;
    *a = *b;
    *b = t;
}

static void insertion_sort(cand *a, int n) {
    for (int i = 1; i < n; i++) {
        cand x = a[i];
        int j = i;
        for (; j > 0 && better(&x, &a[j - 1]); j--) a[j] = a[j - 1];
        a[j] = x;
    }
}

/* Median of three moved to the end, then Lomuto: returns the pivot's final index p, with a[0..p) better
 * than it and a[p+1..n) worse. Keys are all distinct (the id breaks ties), so no equal-key degeneracy. */
static int partition(cand *a, int n) {
    cand *x = &a[0], *y = &a[n / 2], *z = &a[n - 1];
    cand *med = better(x, y) ? (better(y, z) ? y : (better(x, z) ? z : x))
                             : (better(x, z) ? x : (better(y, z) ? z : y));
    swap_c(med, &a[n - 1]);
    cand piv = a[n - 1];
    int i = 0;
    /* Branch-free Lomuto: always swap, advance only past a better element (a[0..i) better than the
     * pivot, a[i..j) not). The comparison is a coin flip for the branch predictor, and partitioning was
     * most of a wide top_p step before this. */
    for (int j = 0; j < n - 1; j++) {
        cand t = a[j];
        a[j] = a[i];
        a[i] = t;
        i += (t.l > piv.l) | ((t.l == piv.l) & (t.id < piv.id));
    }
    swap_c(&a[i], &a[n - 1]);
    return i;
}

/* Heap with the worst element on top; popping it to the back leaves the array best-first. */
static void sift_down(cand *a, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, w = i;
        if (l < n && better(&a[w], &a[l])) w = l;
        if (l + 1 < n && better(&a[w], &a[l + 1])) w = l + 1;
        if (w == i) return;
        swap_c(&a[i], &a[w]);
        i = w;
    }
}

static void heap_sort(cand *a, int n) {
    for (int i = n / 2 - 1; i >= 0; i--) sift_down(a, n, i);
    for (int e = n - 1; e > 0; e--) {
        swap_c(&a[0], &a[e]);
        sift_down(a, e, 0);
    }
}

static int depth_limit(int n) {
    int d = 0;
    while (n > 1) n >>= 1, d++;
    return 2 * d + 2;
}

/* Introsort, best first. Our own rather than qsort: glibc's qsort may malloc a merge buffer, and the
 * decode loop must not allocate. */
static void sort_rec(cand *a, int n, int depth) {
    while (n > 16) {
        if (depth-- == 0) {
            heap_sort(a, n);
            return;
        }
        int p = partition(a, n);
        if (p < n - 1 - p) {
            sort_rec(a, p, depth);
            a += p + 1;
            n -= p + 1;
        } else {
            sort_rec(a + p + 1, n - 1 - p, depth);
            n = p;
        }
    }
    insertion_sort(a, n);
}

static void sort_desc(cand *a, int n) {
    sort_rec(a, n, depth_limit(n));
}

/* Moves the k best of a[0..n) into a[0..k), in no particular order (quickselect, O(n) expected; falls back
 * to a full sort of the remaining range past the depth limit). */
static void select_top(cand *a, int n, int k) {
    int depth = depth_limit(n);
    while (k > 0 && k < n) {
        if (n <= 16 || depth-- == 0) {
            sort_desc(a, n);
            return;
        }
        int p = partition(a, n);
        if (p == k || p + 1 == k) return;
        if (k < p)
            n = p;
        else {
            a += p + 1;
            n -= p + 1;
            k -= p + 1;
        }
    }
}

static int argmax_c(const cand *a, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (better(&a[i], &a[b])) b = i;
    return b;
}

/* ---- exp over the vocabulary ---- */

/* The vocabulary-wide passes (softmax sums, the draw, raw logprobs) each take 248k exponentials per token;
 * libm's expf is scalar and was most of a step's time. This is Cephes' expf (range reduction by ln 2,
 * degree-5 polynomial, relative error about 1e-7) written on GCC/clang vector extensions: four lanes on
 * SSE2/NEON, plain scalar code where there is no SIMD. Inputs are <= 0 here (x - max); anything below
 * -87 (exp underflows to a denormal), -inf and NaN give 0. exp1 is the same arithmetic on one float, so
 * sums over a gathered subset agree with sums over the whole vocabulary. */
typedef float v4sf __attribute__((vector_size(16)));
typedef int32_t v4si __attribute__((vector_size(16)));
#define V4(c)     ((v4sf){(c), (c), (c), (c)})
#define EXP_LO    -87.0f
#define EXP_LOG2E 1.44269504088896341f
#define EXP_MAGIC 12582912.0f /* 1.5 * 2^23: adding and subtracting it rounds to an integer */
#define EXP_C1    0.693359375f
#define EXP_C2    -2.12194440e-4f
#define EXP_P0    1.9875691500e-4f
#define EXP_P1    1.3981999507e-3f
#define EXP_P2    8.3334519073e-3f
#define EXP_P3    4.1665795894e-2f
#define EXP_P4    1.6666665459e-1f
#define EXP_P5    5.0000001201e-1f

static inline v4sf exp4(v4sf x) {
    v4si keep = x >= V4(EXP_LO); /* false for NaN and -inf as well */
    x = (v4sf)((v4si)x & keep);  /* dropped lanes compute exp(0), masked below */
    v4sf n = (x * V4(EXP_LOG2E) + V4(EXP_MAGIC)) - V4(EXP_MAGIC);
    v4sf r = x - n * V4(EXP_C1);
    r = r - n * V4(EXP_C2);
    v4sf p = V4(EXP_P0);
    p = p * r + V4(EXP_P1);
    p = p * r + V4(EXP_P2);
    p = p * r + V4(EXP_P3);
    p = p * r + V4(EXP_P4);
    p = p * r + V4(EXP_P5);
    v4sf y = p * r * r + r + V4(1.0f);
    v4si e = (__builtin_convertvector(n, v4si) + 127) << 23;
    y = y * (v4sf)e;
    return (v4sf)((v4si)y & keep);
}

static inline float exp1(float x) {
    if (!(x >= EXP_LO)) return 0.0f;
    float n = (x * EXP_LOG2E + EXP_MAGIC) - EXP_MAGIC;
    float r = x - n * EXP_C1;
    r = r - n * EXP_C2;
    float p = EXP_P0;
    p = p * r + EXP_P1;
    p = p * r + EXP_P2;
    p = p * r + EXP_P3;
    p = p * r + EXP_P4;
    p = p * r + EXP_P5;
    float y = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) * (1 << 23);
    float sc;
    memcpy(&sc, &bits, sizeof sc);
    return y * sc;
}

/* Sums go in blocks of EXP_BLOCK: f32 within a block (relative error ~1e-7 * 8), f64 across blocks. */
#define EXP_BLOCK 32

/* exp((w[j] - m) * k) for j < EXP_BLOCK into e (when non-NULL); returns their sum. */
static float exp_block(const float *w, float m, float k, float *e) {
    v4sf acc = V4(0.0f);
    for (int j = 0; j < EXP_BLOCK; j += 4) {
        v4sf x;
        memcpy(&x, w + j, sizeof x);
        v4sf y = exp4((x - V4(m)) * V4(k));
        if (e) memcpy(e + j, &y, sizeof y);
        acc += y;
    }
    return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

static float exp_tail(const float *w, int n, float m, float k, float *e) {
    float acc = 0.0f;
    for (int j = 0; j < n; j++) {
        float y = exp1((w[j] - m) * k);
        if (e) e[j] = y;
        acc += y;
    }
    return acc;
}

/* The sum of e[0..n), n <= EXP_BLOCK, in the same order exp_block and exp_tail add. */
static float sum_chunk(const float *e, int n) {
    if (n == EXP_BLOCK) {
        v4sf acc = V4(0.0f);
        for (int j = 0; j < EXP_BLOCK; j += 4) {
            v4sf y;
            memcpy(&y, e + j, sizeof y);
            acc += y;
        }
        return (acc[0] + acc[1]) + (acc[2] + acc[3]);
    }
    float acc = 0.0f;
    for (int j = 0; j < n; j++) acc += e[j];
    return acc;
}

static float exp_chunk(const float *w, int n, float m, float k, float *e) {
    return n == EXP_BLOCK ? exp_block(w, m, k, e) : exp_tail(w, n, m, k, e);
}

/* The unnormalised probability of logit l at temperature 1/k against the maximum m. */
static inline float wexp(float l, float m, float k) {
    return exp1((l - m) * k);
}

/* sum over i < n of exp((w[i] - m) * k) */
static double exp_sum(const float *w, int n, float m, float k) {
    double z = 0.0;
    for (int i = 0; i < n; i += EXP_BLOCK)
        z += exp_chunk(w + i, n - i < EXP_BLOCK ? n - i : EXP_BLOCK, m, k, NULL);
    return z;
}

/* sum of exp((w[i] - m) * k) over the i with lo <= w[i] < hi */
static double exp_sum_range(const float *w, int n, float m, float k, float lo, float hi) {
    double z = 0.0;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        v4sf x;
        memcpy(&x, w + i, sizeof x);
        v4si in = (x >= V4(lo)) & (x < V4(hi));
        v4sf y = (v4sf)((v4si)exp4((x - V4(m)) * V4(k)) & in);
        z += (double)((y[0] + y[1]) + (y[2] + y[3]));
    }
    for (; i < n; i++)
        if (w[i] >= lo && w[i] < hi) z += exp1((w[i] - m) * k);
    return z;
}

/* e[i] = exp((w[i] - m) * k) for i < n (e may be w); returns the sum, added up as stored_walk does. */
static double exp_store(const float *w, float *e, int n, float m, float k) {
    double z = 0.0;
    for (int i = 0; i < n; i += EXP_BLOCK) {
        int len = n - i < EXP_BLOCK ? n - i : EXP_BLOCK;
        exp_chunk(w + i, len, m, k, e + i);
        z += sum_chunk(e + i, len);
    }
    return z;
}

/* The first i where the running sum of e[0..i] passes u, u in [0, exp_store's sum): whole blocks are
 * skipped by their sums, computed exactly as exp_store added them. -1 when nothing has mass. */
static int stored_walk(const float *e, int n, double u) {
    double acc = 0.0;
    int last_blk = -1;
    for (int i = 0; i < n; i += EXP_BLOCK) {
        int len = n - i < EXP_BLOCK ? n - i : EXP_BLOCK;
        float b = sum_chunk(e + i, len);
        if (b > 0.0f) last_blk = i;
        if (acc + b > u) {
            double a = acc;
            for (int j = 0; j < len; j++) {
                a += e[i + j];
                if (u < a) return i + j;
            }
        }
        acc += b;
    }
    if (last_blk < 0) return -1;
    /* rounding left u at the very top: the last token with positive mass */
    int j = (n - last_blk < EXP_BLOCK ? n - last_blk : EXP_BLOCK) - 1;
    while (j > 0 && !(e[last_blk + j] > 0.0f)) j--;
    return last_blk + j;
}

static float max_f(const float *w, int n) {
    v4sf mv = V4(-INFINITY);
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        v4sf x;
        memcpy(&x, w + i, sizeof x);
        v4si gt = x > mv; /* NaN compares false: never the max */
        mv = (v4sf)(((v4si)x & gt) | ((v4si)mv & ~gt));
    }
    float m = mv[0];
    for (int j = 1; j < 4; j++) m = mv[j] > m ? mv[j] : m;
    for (; i < n; i++) m = w[i] > m ? w[i] : m;
    return m;
}

/* The lowest index holding the maximum (greedy's tie rule); 0 when nothing compares (all NaN). */
static int argmax_first(const float *w, int n) {
    float m = max_f(w, n);
    for (int i = 0; i < n; i++)
        if (w[i] == m) return i;
    return 0;
}

/* ---- the chain ---- */

/* w = logits with NaN as -inf (so comparisons order everything), then logit_bias and penalties. */
static void load_adjusted(sampler *s, const float *logits) {
    float *w = s->w;
    int V = s->n_vocab, i = 0;
    for (; i + 4 <= V; i += 4) {
        v4sf x;
        memcpy(&x, logits + i, sizeof x);
        v4si ok = x == x;
        x = (v4sf)(((v4si)x & ok) | ((v4si)V4(-INFINITY) & ~ok));
        memcpy(w + i, &x, sizeof x);
    }
    for (; i < V; i++) w[i] = logits[i] == logits[i] ? logits[i] : -INFINITY;
    for (int j = 0; j < s->p.n_logit_bias; j++) w[s->bias[j].token] += s->bias[j].bias;
    if (s->rep_count) {
        /* vLLM and llama.cpp: divide positive logits, multiply the others, so the penalty always lowers. */
        float pen = s->p.repetition_penalty;
        for (int j = 0; j < s->n_rep; j++) {
            float *l = &w[s->rep_ids[j]];
            *l = *l > 0.0f ? *l / pen : *l * pen;
        }
    }
    if (s->out_count) {
        float fp = s->p.frequency_penalty, pp = s->p.presence_penalty;
        for (int j = 0; j < s->n_out; j++) {
            int32_t t = s->out_ids[j];
            w[t] -= fp * (float)s->out_count[t] + pp;
        }
    }
}

void sampler_adjusted_logits(sampler *s, const float *logits, float *out) {
    load_adjusted(s, logits);
    memcpy(out, s->w, (size_t)s->n_vocab * sizeof *out);
}

static void sift_up(cand *a, int i) {
    while (i > 0) {
        int par = (i - 1) / 2;
        if (!better(&a[par], &a[i])) return;
        swap_c(&a[par], &a[i]);
        i = par;
    }
}

/* The k best of w[0..n) into c[0..k) as (logit, id), unordered. One pass with a k-heap whose top is the
 * worst kept: most tokens fail one comparison against it. Ids rise along the pass, so a newcomer beats the
 * top only with a strictly larger logit. */
static void heap_top(const float *w, int n, int k, cand *c) {
    int h = 0;
    for (int i = 0; i < n; i++) {
        float v = w[i] == w[i] ? w[i] : -INFINITY; /* the caller's logits may hold NaN */
        if (h < k) {
            c[h] = (cand){v, i};
            sift_up(c, h++);
        } else if (v > c[0].l) {
            c[0] = (cand){v, i};
            sift_down(c, k, 0);
        }
    }
}

/* top_k up to this uses heap_top; beyond, quickselect over all candidates */
#define TOP_K_HEAP_MAX 1024
/* Up to this vocabulary size, top_p gathers every candidate at once rather than by falling threshold. */
#define TOP_P_GATHER_ALL 1024

/* The length L of the shortest best-first prefix of c[0..n) whose mass (exp((l - m) * k)) reaches target;
 * moves that prefix's members to c[0..L), unordered. A quickselect weighted by mass: a flat distribution
 * can keep most of the vocabulary under top_p; this is O(n) expected instead of a sort of all of it. */
static int top_p_select(cand *c, int n, double target, float m, float k) {
    int lo = 0, hi = n, depth = depth_limit(n);
    double acc = 0.0; /* mass of c[0..lo), all better than anything in c[lo..n) */
    while (hi - lo > 16 && depth-- > 0) {
        int piv = lo + partition(c + lo, hi - lo);
        double left = 0.0;
        for (int i = lo; i < piv; i++) left += wexp(c[i].l, m, k);
        if (acc + left >= target) {
            hi = piv; /* the prefix ends before the pivot */
        } else {
            acc += left + wexp(c[piv].l, m, k);
            if (acc >= target) return piv + 1;
            lo = piv + 1;
        }
    }
    sort_desc(c + lo, hi - lo);
    for (int i = lo; i < hi; i++) {
        acc += wexp(c[i].l, m, k);
        if (acc >= target) return i + 1;
    }
    return hi; /* rounding kept the sum just short of target: everything up to hi */
}

/* XTC's test, p >= threshold, for a token with positive probability only: threshold 0 must not count
 * tokens that cannot be drawn at all (-inf logits, or exp underflow) among those "above". */
static inline int xtc_above(float e, double z, double thr) {
    return e > 0.0f && e / z >= thr;
}

typedef struct chain {
    const float *w; /* the logits the chain read: s->w after adjustments, or the caller's */
    int have_c;     /* candidates are c[0..n); else all of w */
    cand *c;
    int n;
    float m; /* the maximum logit (of w, when !have_c: XTC may have lowered it) */
    float inv_t;
} chain;

/* Gathers w's entries with lo <= w < hi into c[n..]; returns the new n. */
static int gather(const float *w, int V, float lo, float hi, cand *c, int n) {
    for (int i = 0; i < V; i++) {
        float v = w[i];
        if (v >= lo && v < hi) c[n++] = (cand){v, i};
    }
    return n;
}

/* Runs the chain up to the draw. Returns a token when the choice is already made (greedy, or logits with
 * no finite maximum), else -1 with the surviving candidates described by *ch. */
static int32_t run_chain(sampler *s, const float *logits, chain *ch) {
    const sampler_params *p = &s->p;
    const float *w = logits;
    int V = s->n_vocab;
    /* Nothing to adjust: work on the caller's logits directly and skip a copy of the vocabulary (the
     * steps below read NaN as never-the-max and zero mass). XTC may remove tokens from w: it needs the
     * copy. */
    if (p->n_logit_bias || s->rep_count || s->out_count || p->xtc_probability > 0.0f) {
        load_adjusted(s, logits);
        w = s->w;
    }
    if (p->temperature < SAMPLER_GREEDY_TEMP) return argmax_first(w, V);
    float m = max_f(w, V), T = p->temperature, inv_t = 1.0f / T;
    if (!isfinite(m)) return argmax_first(w, V); /* all -inf, or a +inf logit: nothing to weigh */

    /* The temperature is applied as (w - m) / T wherever a probability is needed: candidate order does
     * not depend on it, and keeping logits unscaled keeps that order exact (scaling in f32 could merge
     * two close logits into a tie). */
    cand *c = s->c;
    int have_c = 0, n = V;
    if (p->top_k > 0 && p->top_k < V) {
        n = p->top_k;
        if (n <= TOP_K_HEAP_MAX) {
            heap_top(w, V, n, c);
        } else {
            for (int i = 0; i < V; i++) c[i] = (cand){w[i] == w[i] ? w[i] : -INFINITY, i};
            select_top(c, V, n);
        }
        have_c = 1;
    }

    /* min_p keeps p_i >= min_p * p_max, i.e. exp((w_i - m) / T) >= min_p. minp_lo and minp_hi bracket that
     * in logit space (a little below, a little above): below is out, above is in, and only between does
     * the exact exp test run. */
    float minp_lo = p->min_p > 0.0f ? m + T * (logf(p->min_p) - 1e-3f) : -INFINITY;
    float minp_hi = p->min_p > 0.0f ? m + T * (logf(p->min_p) + 1e-3f) : -INFINITY;

    if (p->top_p < 1.0f) {
        double z, target, mass = 0.0;
        int n1;
        if (have_c) {
            z = 0.0;
            for (int i = 0; i < n; i++) z += wexp(c[i].l, m, inv_t);
            n1 = n;
            target = (double)p->top_p * z;
        } else {
            /* Sorting 248k candidates per token is the cost to avoid: gather those above a falling
             * threshold until they hold the target mass (they are then a prefix of the sorted order, so
             * the top_p prefix lies inside them) and select among those only. Reaching min_p's bound first
             * means everything below would be trimmed anyway. */
            z = exp_sum(w, V, m, inv_t);
            target = (double)p->top_p * z;
            n1 = 0;
            float hi = INFINITY;
            for (float d = 4.0f;; d *= 2.0f) {
                float lo = V <= TOP_P_GATHER_ALL ? -INFINITY : m - d * T;
                if (lo < minp_lo) lo = minp_lo;
                int k = gather(w, V, lo, hi, c, n1);
                if (k - n1 > V / 8) /* a wide gather: one vector pass beats that many scalar exps */
                    mass += exp_sum_range(w, V, m, inv_t, lo, hi);
                else
                    for (int i = n1; i < k; i++) mass += wexp(c[i].l, m, inv_t);
                n1 = k;
                hi = lo;
                if (mass >= target || lo <= minp_lo || n1 == V) break;
            }
            have_c = 1;
        }
        n = top_p_select(c, n1, target, m, inv_t);
    }

    if (p->min_p > 0.0f) {
        if (!have_c) {
            n = 0;
            for (int i = 0; i < V; i++) {
                float v = w[i];
                if (v >= minp_hi || (v >= minp_lo && wexp(v, m, inv_t) >= p->min_p)) c[n++] = (cand){v, i};
            }
            have_c = 1; /* the maximum is always among them: exp(0) = 1 >= min_p */
        } else {
            int k = 0;
            for (int j = 0; j < n; j++)
                if (wexp(c[j].l, m, inv_t) >= p->min_p) swap_c(&c[k++], &c[j]);
            n = k;
        }
    }

    /* XTC (llama.cpp semantics): with probability xtc_probability, if two or more candidates have a
     * renormalised p >= threshold, remove all of them but the least likely one. */
    if (p->xtc_probability > 0.0f && p->xtc_threshold <= 0.5f && n >= 2 &&
        rng_uniform(&s->r) < (double)p->xtc_probability) {
        double thr = p->xtc_threshold;
        if (have_c) {
            double z = 0.0;
            for (int i = 0; i < n; i++) z += wexp(c[i].l, m, inv_t);
            int k = 0;
            for (int j = 0; j < n; j++)
                if (xtc_above(wexp(c[j].l, m, inv_t), z, thr)) swap_c(&c[k++], &c[j]);
            if (k >= 2) {
                int wst = 0; /* the least likely of the k, by the same total order */
                for (int j = 1; j < k; j++)
                    if (better(&c[wst], &c[j])) wst = j;
                swap_c(&c[wst], &c[k - 1]);
                c += k - 1;
                n -= k - 1;
            }
        } else {
            double z = exp_sum(w, V, m, inv_t);
            float lo = thr > 0.0 ? m + T * ((float)log(thr * z) - 1e-3f) : -FLT_MAX;
            int k = 0;
            for (int i = 0; i < V; i++) {
                float v = w[i];
                if (v >= lo && xtc_above(wexp(v, m, inv_t), z, thr)) c[k++] = (cand){v, i};
            }
            if (k >= 2) {
                /* Remove them from w itself (scratch owned by this step); the least likely stays and is
                 * the new maximum, since the set above a threshold is a prefix of the order. */
                int wst = 0;
                for (int j = 1; j < k; j++)
                    if (better(&c[wst], &c[j])) wst = j;
                CI_ASSERT(w == s->w);
                for (int j = 0; j < k; j++)
                    if (j != wst) s->w[c[j].id] = -INFINITY;
                m = c[wst].l;
            }
        }
    }
    ch->w = w;
    ch->have_c = have_c;
    ch->c = c;
    ch->n = n;
    ch->m = m;
    ch->inv_t = inv_t;
    return -1;
}

/* Raw logprobs: log_softmax of the logits exactly as the model produced them (a NaN counts as -inf), and
 * the k most likely, best first, equal logits by lower id. */
static void raw_logprobs(const float *x, int V, sampler_result *res, int want_tok, int k) {
    float m = max_f(x, V);
    int nt = 0;
    sampler_logprob *top = res->top;
    for (int i0 = 0; k > 0 && i0 < V; i0 += 4) {
        if (nt == k && i0 + 4 <= V) { /* once full, whole groups of four are rejected by one compare */
            v4sf xv;
            memcpy(&xv, x + i0, sizeof xv);
            v4si gt = xv > V4(top[k - 1].logprob);
            if (!(gt[0] | gt[1] | gt[2] | gt[3])) continue;
        }
        for (int i = i0; i < i0 + 4 && i < V; i++) {
            float v = x[i];
            /* i is larger than every id held, so it ranks above one only with a strictly larger logit */
            if (nt == k && !(v > top[k - 1].logprob)) continue;
            if (v != v) v = -INFINITY;
            int j = nt < k ? nt++ : k - 1;
            for (; j > 0 && top[j - 1].logprob < v; j--) top[j] = top[j - 1];
            top[j].token = i;
            top[j].logprob = v;
        }
    }
    double lse = isfinite(m) ? (double)m + log(exp_sum(x, V, m, 1.0f)) : (double)m;
    for (int j = 0; j < nt; j++) top[j].logprob = (float)((double)top[j].logprob - lse);
    res->n_top = nt;
    if (want_tok) {
        float v = x[res->token];
        res->logprob = v == v ? (float)((double)v - lse) : -INFINITY;
    }
}

int32_t sampler_sample(sampler *s, const float *logits, sampler_result *res) {
    chain ch;
    int32_t tok = run_chain(s, logits, &ch);
    if (tok < 0) {
        if (ch.have_c && ch.n > 4096) {
            /* a wide set (flat distributions under min_p or top_p): lay the logits out flat in the
             * scratch (w is not read again) and use the vector exp */
            cand *c = ch.c;
            int n = ch.n;
            float mc = c[argmax_c(c, n)].l;
            for (int i = 0; i < n; i++) s->w[i] = c[i].l;
            double z = exp_store(s->w, s->w, n, mc, ch.inv_t);
            int i = stored_walk(s->w, n, rng_uniform(&s->r) * z);
            tok = c[i >= 0 ? i : argmax_c(c, n)].id;
        } else if (ch.have_c) {
            cand *c = ch.c;
            int n = ch.n;
            float mc = c[argmax_c(c, n)].l; /* m, unless XTC removed the head */
            double z = 0.0;
            for (int i = 0; i < n; i++) {
                c[i].l = wexp(c[i].l, mc, ch.inv_t);
                z += c[i].l;
            }
            double u = rng_uniform(&s->r) * z, acc = 0.0;
            int last = 0;
            for (int i = 0; i < n; i++) {
                if (c[i].l > 0.0f) last = i;
                acc += c[i].l;
                if (u < acc) {
                    tok = c[i].id;
                    break;
                }
            }
            if (tok < 0) tok = c[last].id; /* rounding left u at the very top: the last positive mass */
        } else {
            /* one exp pass, stored: the walk then only adds (s->w is this step's scratch) */
            double z = exp_store(ch.w, s->w, s->n_vocab, ch.m, ch.inv_t);
            int i = stored_walk(s->w, s->n_vocab, rng_uniform(&s->r) * z);
            tok = i >= 0 ? i : argmax_first(ch.w, s->n_vocab);
        }
    }
    if (res) {
        memset(res, 0, sizeof *res);
        res->token = tok;
        if (s->p.logprobs || s->p.top_logprobs)
            raw_logprobs(logits, s->n_vocab, res, s->p.logprobs, s->p.top_logprobs);
    }
    return tok;
}

int sampler_candidates(sampler *s, const float *logits, int32_t *ids, float *probs, int cap) {
    chain ch;
    int32_t tok = run_chain(s, logits, &ch);
    if (tok >= 0) {
        if (cap > 0) {
            ids[0] = tok;
            probs[0] = 1.0f;
        }
        return 1;
    }
    cand *c = ch.c;
    int n = ch.n;
    /* -FLT_MAX leaves out the -inf entries: zero mass, and where XTC removed tokens from w */
    if (!ch.have_c) n = gather(ch.w, s->n_vocab, -FLT_MAX, INFINITY, c, 0);
    sort_desc(c, n);
    float mc = c[0].l;
    while (n > 1 && !(wexp(c[n - 1].l, mc, ch.inv_t) > 0.0f)) n--; /* zero mass: can never be drawn */
    double z = 0.0;
    for (int i = 0; i < n; i++) z += wexp(c[i].l, mc, ch.inv_t);
    for (int i = 0; i < n && i < cap; i++) {
        ids[i] = c[i].id;
        probs[i] = (float)(wexp(c[i].l, mc, ch.inv_t) / z);
    }
    return n;
}

/* ---- the chain for a device sampler ---- */

static int dev_n_adjusted(const sampler *s) {
    return s->p.n_logit_bias + (s->rep_count ? s->n_rep : 0) + (s->out_count ? s->n_out : 0);
}

int sampler_device_ok(const sampler *s, int max_k, int cap) {
    const sampler_params *p = &s->p;
    if (p->top_logprobs || (p->xtc_probability > 0.0f && p->xtc_threshold <= 0.5f)) return 0;
    if (p->temperature >= SAMPLER_GREEDY_TEMP && !(p->top_k >= 1 && p->top_k <= max_k && p->top_k < s->n_vocab))
        return 0;
    int n = dev_n_adjusted(s);
    if (n > cap) return 0;
    for (int i = 0; i < p->n_logit_bias; i++) /* a token twice: two roundings the device would fold into one */
        for (int j = 0; j < i; j++)
            if (s->bias[i].token == s->bias[j].token) return 0;
    return 1;
}

int sampler_device_row(sampler *s, int max_k, sampler_dev_row *row, sampler_dev_pen *pen, int cap, int *n_pen) {
    if (!sampler_device_ok(s, max_k, cap)) return CINFER_EINVAL;
    const sampler_params *p = &s->p;
    /* The repetition window's tokens first, in rep_ids' order, so that a token's entry is its rep_pos: no
     * lookup table over the vocabulary (marking one in the scratch w, as this did first, touched a cache line
     * of a 1 MB array per token each step); the output's tokens outside the window after them, then logit_bias's
     * (a linear search among the output's own entries, both lists short). */
    int n = 0;
    for (int i = 0; s->rep_count && i < s->n_rep; i++)
        pen[n++] = (sampler_dev_pen){s->rep_ids[i], SAMPLER_DEV_REP, 0.0f, 0.0f};
    const int n_win = n;
    for (int i = 0; s->out_count && i < s->n_out; i++) {
        int32_t t = s->out_ids[i];
        int at = s->rep_count && s->rep_count[t] > 0 ? s->rep_pos[t] : n;
        if (at == n) pen[n++] = (sampler_dev_pen){t, 0, 0.0f, 0.0f};
        pen[at].flags |= SAMPLER_DEV_SUB;
        pen[at].sub = p->frequency_penalty * (float)s->out_count[t] + p->presence_penalty; /* load_adjusted's, f32 */
    }
    for (int i = 0; i < p->n_logit_bias; i++) {
        int32_t t = s->bias[i].token;
        int at = n;
        if (s->rep_count && s->rep_count[t] > 0)
            at = s->rep_pos[t];
        else if (s->out_count && s->out_count[t] > 0)
            for (int j = n_win; j < n; j++)
                if (pen[j].token == t) at = j;
        if (at == n) pen[n++] = (sampler_dev_pen){t, 0, 0.0f, 0.0f};
        pen[at].flags |= SAMPLER_DEV_BIAS, pen[at].bias = s->bias[i].bias;
    }
    *n_pen = n;
    int greedy = p->temperature < SAMPLER_GREEDY_TEMP;
    *row = (sampler_dev_row){p->temperature, p->top_k, p->top_p, p->min_p, p->repetition_penalty,
                             greedy ? 0.0 : rng_uniform(&s->r), p->logprobs};
    return 0;
}

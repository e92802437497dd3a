/* sampler.h — the per-request sampler chain the server runs on each row of logits: logit_bias →
 * penalties (repetition over a window of prompt+output, presence/frequency over output) → temperature
 * (greedy below 1e-5) → top_k → top_p → min_p → XTC → a draw from the request's own seeded generator,
 * plus logprobs of the raw model distribution. A sampler owns buffers sized to the vocabulary, made once
 * at sampler_create; sampler_sample and sampler_accept never allocate. */
#ifndef CI_SAMPLER_H
#define CI_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#define SAMPLER_MAX_LOGPROBS 20        /* OpenAI's top_logprobs limit */
#define SAMPLER_GREEDY_TEMP  1e-5f     /* temperatures below this are greedy (vLLM's _SAMPLING_EPS) */
#define SAMPLER_MAX_WINDOW   (1 << 24) /* repeat_last_n beyond this is refused (use -1 for all) */

typedef struct sampler_bias {
    int32_t token;
    float bias; /* added to the token's logit; -100 effectively bans it, +100 effectively forces it */
} sampler_bias;

typedef struct sampler_params {
    float temperature;     /* >= 0; below SAMPLER_GREEDY_TEMP: argmax, ties to the lowest id */
    int top_k;             /* keep the k most likely; <= 0: off */
    float top_p;           /* keep the smallest prefix with mass >= top_p; in (0, 1], 1: off */
    float min_p;           /* keep p >= min_p * p_max; in [0, 1], 0: off */
    float xtc_probability; /* chance per token that XTC applies; in [0, 1], 0: off */
    float xtc_threshold;   /* XTC removes all but the least likely of the tokens with p >= this; > 0.5: off */
    float repetition_penalty; /* > 0, 1: off. Seen logits > 0 are divided by it, <= 0 multiplied */
    int repeat_last_n; /* tokens of prompt+output the repetition penalty looks back over; -1: all, 0: off */
    float presence_penalty;         /* in [-2, 2]: subtracted once from each token generated so far */
    float frequency_penalty;        /* in [-2, 2]: subtracted once per occurrence in the generated tokens */
    const sampler_bias *logit_bias; /* [n_logit_bias]; copied by sampler_create */
    int n_logit_bias;
    uint64_t seed;    /* the request's generator seed: same request + same seed = same tokens */
    int logprobs;     /* nonzero: report the chosen token's logprob */
    int top_logprobs; /* 0..SAMPLER_MAX_LOGPROBS most likely tokens to report with their logprobs */
} sampler_params;

typedef struct sampler_logprob {
    int32_t token;
    float logprob;
} sampler_logprob;

/* What one step reports besides the token. Logprobs are those of the raw model distribution
 * (log_softmax of the logits as the model produced them, before logit_bias, penalties, temperature and
 * the filters) — what vLLM returns by default (logprobs_mode = raw_logprobs) and what OpenAI documents. */
typedef struct sampler_result {
    int32_t token;
    float logprob;                             /* of token; set when params.logprobs */
    int n_top;                                 /* = params.top_logprobs */
    sampler_logprob top[SAMPLER_MAX_LOGPROBS]; /* most likely first; equal logits: lower id first */
} sampler_result;

typedef struct sampler sampler;

/* temperature 1, every filter and penalty off, repeat_last_n -1, xtc_threshold 0.1, seed 0. */
sampler_params sampler_default_params(void);

/* Checks p and allocates the per-request buffers for a vocabulary of n_vocab tokens. */
int sampler_create(const sampler_params *p, int n_vocab, sampler **out, char *err, size_t errlen);
void sampler_destroy(sampler *s);

/* Records prompt tokens: they count for the repetition penalty (vLLM: prompt + output) but not for
 * presence/frequency (OpenAI: generated tokens only). Must come before the first sampler_accept; it may be
 * called several times (chunks of one prompt), appending. */
int sampler_set_prompt(sampler *s, const int32_t *tokens, int n, char *err, size_t errlen);

/* Records a token the sequence committed to (the sampled one, or a forced one). sampler_sample does not
 * call it: speculative decoding samples tokens it may then reject. 0, or CINFER_EINVAL for a bad id. */
int sampler_accept(sampler *s, int32_t token);

/* Chooses the next token from logits[n_vocab] (f32, not modified). A greedy step draws nothing from the
 * generator; a sampled step draws one number, plus one for XTC's coin when XTC is on. Fills *res when res is
 * non-NULL (logprobs only when the params asked for them). Returns the token id. Allocation-free. */
int32_t sampler_sample(sampler *s, const float *logits, sampler_result *res);

/* For tests and inspection. sampler_adjusted_logits writes out[n_vocab] = logits after logit_bias and
 * penalties (what temperature sees). sampler_candidates runs the whole chain except the final draw
 * (XTC's coin flip does use the generator) and writes the surviving tokens that have nonzero probability,
 * with their renormalised probabilities, most likely first (ties: lower id first), up to cap of them;
 * returns how many survive (greedy: the argmax alone). */
void sampler_adjusted_logits(sampler *s, const float *logits, float *out);
int sampler_candidates(sampler *s, const float *logits, int32_t *ids, float *probs, int cap);

/* The chain as a device sampler takes it (model/forward_cuda.h's cuda_sample): the filters' settings, and
 * the adjusted tokens — each distinct token that logit_bias or a penalty touches, with what applies to it,
 * in load_adjusted's order (+ bias, then the repetition penalty, then - sub). */
#define SAMPLER_DEV_BIAS 1
#define SAMPLER_DEV_REP  2
#define SAMPLER_DEV_SUB  4
typedef struct sampler_dev_pen {
    int32_t token;
    int flags;  /* SAMPLER_DEV_* */
    float bias; /* with SAMPLER_DEV_BIAS */
    float sub;  /* with SAMPLER_DEV_SUB: frequency_penalty * count + presence_penalty, in f32 */
} sampler_dev_pen;
typedef struct sampler_dev_row {
    float temperature; /* below SAMPLER_GREEDY_TEMP: greedy */
    int top_k;
    float top_p, min_p, repetition_penalty;
    double u; /* the draw sampler_sample would make, taken from the request's generator (0 when greedy) */
    int logprob;
} sampler_dev_row;
/* 1 when the chain can go to a device sampler taking top_k up to max_k and up to cap adjusted tokens: no
 * XTC, no top_logprobs, top_k in 1..max_k (below the vocabulary) unless greedy, at most cap adjusted tokens,
 * no token twice in logit_bias. */
int sampler_device_ok(const sampler *s, int max_k, int cap);
/* For a step sampler_device_ok accepted: fills *row and pen[0..*n_pen) (cap entries at most) and, unless
 * greedy, draws the step's uniform number from the generator, as sampler_sample would. 0, or CINFER_EINVAL
 * when the chain is not for the device. */
int sampler_device_row(sampler *s, int max_k, sampler_dev_row *row, sampler_dev_pen *pen, int cap, int *n_pen);

#endif

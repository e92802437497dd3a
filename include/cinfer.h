/* cinfer.h — the public API of libcinfer: opaque handles, plain C types, no tensor internals.
 * Every function that can fail returns 0 or a negative CINFER_E* code and writes a message into the
 * caller's (err, errlen) buffer. Nothing here exits the process. */
#ifndef CINFER_H
#define CINFER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CINFER_VERSION "0.1.0"

/* Error codes: 0 is success, every failure is negative. */
enum {
    CINFER_OK = 0,
    CINFER_EINVAL = -1,       /* a bad argument from the caller */
    CINFER_EIO = -2,          /* open/read/mmap failed */
    CINFER_ENOMEM = -3,       /* an allocation or a memory budget failed */
    CINFER_EFORMAT = -4,      /* a malformed file: safetensors, json, config */
    CINFER_EUNSUPPORTED = -5, /* valid input that cinfer does not handle (an architecture, a dtype) */
    CINFER_ERANGE = -6,       /* a count or size beyond a limit (context length, pool size) */
    CINFER_ENOTFOUND = -7,    /* a named thing is missing (a tensor, a file, a field) */
    CINFER_ESTATE = -8,       /* a call that is wrong in the object's current state */
    CINFER_EBUSY = -9,        /* the engine's queue is full: retry later (HTTP 429) */
    CINFER_ECANCELLED = -10,  /* the request was cancelled */
};

/* A short static name for a code ("invalid argument", ...). */
const char *cinfer_strerror(int code);

/* ---- model: immutable after open; shareable by many contexts ---- */
typedef struct cinfer_model cinfer_model;

/* Opens a Hugging Face style model directory (config.json + *.safetensors [+ index]); weights are
 * mmapped, not copied. */
int cinfer_model_open(const char *dir, cinfer_model **out, char *err, size_t errlen);
void cinfer_model_close(cinfer_model *m);

typedef struct cinfer_model_info {
    const char *arch;       /* "qwen3_5", "qwen3_5_moe", "qwen3_next" */
    int n_layers;           /* decoder layers */
    int n_linear_layers;    /* Gated DeltaNet layers */
    int n_full_layers;      /* gated full-attention layers */
    int hidden_size;
    int vocab_size;         /* rows of the logits */
    int n_experts;          /* 0 for dense */
    int n_experts_per_tok;
    int64_t n_params;       /* parameters bound for the text forward (mtp/vision excluded) */
    int64_t n_params_total; /* every tensor in the checkpoint */
    int64_t bytes_bf16, bytes_f16, bytes_f32, bytes_other; /* checkpoint bytes by dtype */
    const char *layer_map;  /* one char per layer: 'L' linear (DeltaNet), 'F' full attention */
    int64_t bytes_per_token;/* weight bytes one decode step streams (active experts only, lm_head included) */
    const int *eos_ids;     /* generation stops after any of these (generation_config.json, else config.json) */
    int n_eos;
    /* generation_config.json's sampling defaults, < 0 where absent (cinfer serve applies them to requests that
     * name none, unless --generation-config none) */
    float gen_temperature, gen_top_p, gen_min_p, gen_repetition_penalty;
    int gen_top_k;
    int has_mtp;            /* the checkpoint carries an MTP head (mtp.*) */
    int n_visual_tensors;   /* model.visual.* tensors in the checkpoint */
    int has_vision;         /* the vision tower is bound: images can be given (cinfer_image_load) */
    int image_token_id, vision_start_token_id, vision_end_token_id; /* -1 when absent */
} cinfer_model_info;

void cinfer_model_get_info(const cinfer_model *m, cinfer_model_info *out);

/* ---- context: the model's mutable side (KV block pool, DeltaNet state slots, scratch) ---- */
typedef struct cinfer_ctx cinfer_ctx;

/* CUDA: weights, KV blocks and DeltaNet states in device memory (builds with nvcc), with speculative decoding,
 * the MTP head, the prefix cache (state snapshots spilled to pinned host memory) and images as on the CPU.
 * AUTO: CUDA when a device is visible, else CPU. */
typedef enum { CINFER_DEVICE_CPU = 0, CINFER_DEVICE_CUDA = 1, CINFER_DEVICE_AUTO = 2 } cinfer_device;

/* Numerics of the CUDA forward's tensor-core work (prefill GEMMs, attention, DeltaNet chunks).
 * EXACT (the default): near-f32 products (activations split into bf16 hi + lo halves, two passes), within 1e-2
 *   of transformers' float32 forward on every fixture, the tiny random ones included.
 * FAST: activations rounded to bf16 once before the tensor cores (one pass) and bf16 operands in the prefill's
 *   attention and DeltaNet MMAs, f32 accumulation and f32 state kept (what llama.cpp and vLLM run): faster
 *   prefill, validated on the trained default model (tests/fixtures/default_model), not on the random fixtures.
 * The CPU backend takes FAST and runs EXACT (it has one path): cinfer_ctx_precision() says what runs. */
typedef enum { CINFER_PRECISION_EXACT = 0, CINFER_PRECISION_FAST = 1 } cinfer_precision;

/* "exact" / "fast" to a cinfer_precision; -1 for anything else (NULL included). */
int cinfer_precision_parse(const char *s);
/* "exact", "fast", or "?" for a value that is neither. */
const char *cinfer_precision_name(int precision);

typedef struct cinfer_ctx_params {
    int max_seqs;    /* sequences alive at once (state slots) */
    int max_ctx;     /* tokens per sequence */
    int max_batch;   /* tokens per forward call */
    int n_threads;   /* 0: all online CPUs */
    int64_t kv_memory; /* bytes of the KV block pool; 0: max_seqs x max_ctx tokens (never runs out) */
    int spec_window;   /* longest speculative window (tokens per verify entry); 0: no speculation */
    int64_t prefix_cache_memory; /* bytes of DeltaNet state snapshots the prefix cache may keep; 0: no caching */
    int device;        /* cinfer_device: where the forward runs (default: $CINFER_DEVICE = cpu|cuda|auto, else cpu) */
    int precision;     /* cinfer_precision (default: $CINFER_PRECISION = exact|fast, else exact; any other value
                          there makes cinfer_ctx_create fail with CINFER_EINVAL naming it) */
} cinfer_ctx_params;

cinfer_ctx_params cinfer_ctx_default_params(void);
int cinfer_ctx_create(cinfer_model *m, const cinfer_ctx_params *p, cinfer_ctx **out, char *err, size_t errlen);
void cinfer_ctx_destroy(cinfer_ctx *c);
/* The device the context runs on (CINFER_DEVICE_CPU or CINFER_DEVICE_CUDA, AUTO resolved). */
int cinfer_ctx_device(const cinfer_ctx *c);
/* The precision the context's forward runs: its parameter on CUDA, CINFER_PRECISION_EXACT on the CPU. */
int cinfer_ctx_precision(const cinfer_ctx *c);

/* A sequence is an id in [0, max_seqs): its KV blocks and DeltaNet state slot. */
int cinfer_seq_open(cinfer_ctx *c, char *err, size_t errlen);   /* >= 0: the id; < 0: error */
void cinfer_seq_close(cinfer_ctx *c, int seq);
int cinfer_seq_len(const cinfer_ctx *c, int seq);               /* tokens processed so far */

/* One forward over a ragged batch: for each entry, n_tokens new tokens of sequence seq, appended after
 * what that sequence already holds (a spec entry may also replace the sequence's pending window). Rows of
 * logits come back for every token of an entry when all_logits is set, otherwise for its last token only, in
 * entry order: logits is [rows][vocab] f32.
 * A sequence's logits do not depend on what else is in the batch (bit for bit). */
typedef struct cinfer_batch_entry {
    int seq;
    const int32_t *tokens;
    int n_tokens;
    int all_logits;
    int spec;        /* a speculative window (n_tokens <= spec_window): logits as usual, but the sequence does
                        not advance until cinfer_seq_commit keeps a prefix of it */
    float *hidden;   /* NULL, or [n_tokens][hidden_size] f32: each token's last hidden state after the final norm
                        (the lm_head input; what an MTP head reads) */
} cinfer_batch_entry;

int cinfer_forward(cinfer_ctx *c, const cinfer_batch_entry *entries, int n_entries, float *logits,
                   char *err, size_t errlen);

/* ---- images (Qwen3.5 vision tower) ---- */
typedef struct cinfer_image cinfer_image;

/* Decodes an encoded image (PNG, JPEG, GIF first frame, BMP, WebP) and preprocesses it as transformers'
 * Qwen2-VL image processor does, with the model's preprocessor_config.json. max_pixels > 0 caps the decoded
 * width x height (a larger image is CINFER_ERANGE before any pixel buffer exists); 0 takes the decoder's
 * default limits. CINFER_EUNSUPPORTED when the model has no vision tower. */
int cinfer_image_load(const cinfer_model *m, const void *data, size_t size, int64_t max_pixels, cinfer_image **out,
                      char *err, size_t errlen);
/* <|image_pad|> tokens the image takes in a prompt: grid_t * grid_h * grid_w / merge^2. */
int cinfer_image_n_tokens(const cinfer_image *im);
/* image_grid_thw in patches, and the decoded size */
void cinfer_image_get_grid(const cinfer_image *im, int *t, int *h, int *w);
void cinfer_image_get_size(const cinfer_image *im, int *width, int *height);
/* A 64-bit hash of the grid and the preprocessed pixels: equal for the same picture, whatever its encoding. */
uint64_t cinfer_image_hash(const cinfer_image *im);
/* Runs the vision tower now on n_threads threads (0: all online CPUs) and keeps the features in the image;
 * otherwise cinfer_seq_set_images does it on the context's threads. Calling it again does nothing. */
int cinfer_image_encode(const cinfer_model *m, cinfer_image *im, int n_threads, char *err, size_t errlen);
/* The features ([n_tokens][hidden_size] f32) once encoded, else NULL. */
const float *cinfer_image_features(const cinfer_image *im);
/* A copy (pixels and, when encoded, features), or NULL when memory runs out. */
cinfer_image *cinfer_image_dup(const cinfer_image *im);
void cinfer_image_free(cinfer_image *im);

/* Expands, in ids, the k-th <|image_pad|> that directly follows a <|vision_start|> into images[k]'s token
 * count (what the processor does to the text); there must be exactly n_images of them. *out is allocated
 * (free with free()). */
int cinfer_expand_image_pads(const cinfer_model *m, const int32_t *ids, int n, cinfer_image *const *images, int n_images,
                             int32_t **out, int *n_out, char *err, size_t errlen);

/* Gives an empty sequence the images of its prompt (the whole prompt, already expanded): the vision tower runs
 * for images not yet encoded, and the features are copied, so the images may be freed afterwards. Later
 * cinfer_forward calls for the sequence must feed exactly this prompt first (in chunks of any size); its
 * image tokens take the features, every token gets its mRoPE position (spec §6.3), and tokens after the prompt
 * the position plus rope_delta. *rope_delta may be NULL. */
int cinfer_seq_set_images(cinfer_ctx *c, int seq, const int32_t *prompt, int n_prompt, cinfer_image *const *images,
                          int n_images, int *rope_delta, char *err, size_t errlen);

/* Keeps the first n_keep tokens of the sequence's pending speculative window and drops the rest: the KV
 * cache is truncated and the DeltaNet state rebuilt exactly as if only those tokens had been decoded, one by
 * one (bit for bit). n_keep may be 0. */
int cinfer_seq_commit(cinfer_ctx *c, int seq, int n_keep, char *err, size_t errlen);

/* Rows of logits that cinfer_forward will write for these entries. */
int cinfer_batch_logit_rows(const cinfer_batch_entry *entries, int n_entries);

/* ---- text: the model's tokenizer (tokenizer.json) and chat template (tokenizer_config.json) ---- */

/* 1 when the model directory has a tokenizer.json that loaded. */
int cinfer_model_has_tokenizer(const cinfer_model *m);
/* Encodes UTF-8 text; *ids is allocated (free with free()). Added tokens written in the text are
 * recognised; BOS/EOS and other template tokens only with add_special. */
int cinfer_tokenize(const cinfer_model *m, const char *text, size_t len, int add_special, int32_t **ids, int *n_ids,
                    char *err, size_t errlen);
/* Decodes ids into a NUL-terminated string (free with free()). */
int cinfer_detokenize(const cinfer_model *m, const int32_t *ids, int n_ids, int skip_special, char **text, char *err,
                      size_t errlen);
/* Renders the chat template. ctx_json is a JSON object: {"messages": [...], "tools": [...]?,
 * "add_generation_prompt": bool, and any extra keyword arguments (enable_thinking, ...)}; the special
 * tokens of tokenizer_config.json are added as transformers does. A template that raises returns
 * CINFER_EINVAL with the template's own message. *out is allocated (free with free()). */
int cinfer_apply_chat_template(const cinfer_model *m, const char *ctx_json, size_t len, char **out, char *err,
                               size_t errlen);
/* The template's text, or NULL when the model has none. */
const char *cinfer_model_chat_template(const cinfer_model *m);

/* ---- engine: continuous batching over many requests on a scheduler thread ---- */
typedef struct cinfer_engine cinfer_engine;
typedef struct cinfer_request cinfer_request;

typedef enum {
    CINFER_SPEC_NONE = 0,
    CINFER_SPEC_NGRAM = 1, /* drafts from n-gram lookup in the prompt and the output so far (no model) */
    CINFER_SPEC_MTP = 2,   /* the checkpoint's MTP head (mtp.*), chaining its own drafts */
    CINFER_SPEC_DRAFT = 3, /* a smaller draft model sharing the tokenizer (cinfer_engine_params.draft_model) */
} cinfer_spec_mode;

typedef struct cinfer_engine_params {
    int max_seqs;      /* sequences running at once (DeltaNet state slots) */
    int ctx_size;      /* tokens per sequence (prompt + output) */
    int step_tokens;   /* token budget of one step: decode tokens + prefill chunks */
    int queue_limit;   /* requests waiting beyond the running ones; one more gets CINFER_EBUSY */
    int n_threads;     /* 0: all online CPUs */
    int64_t kv_memory; /* bytes for the KV block pool; 0: enough for max_seqs x ctx_size */
    int64_t prefix_cache_memory; /* prefix cache: bytes of DeltaNet state snapshots (KV blocks are shared from
                                    the pool); 0: no prefix caching */
    cinfer_spec_mode spec; /* speculative decoding: drafts verified in the same batch, exact rollback */
    int spec_max_draft;    /* drafts per step at most (adapted per sequence to its acceptance) */
    cinfer_model *draft_model; /* CINFER_SPEC_DRAFT: the draft model (same vocabulary); not owned */
    int device;            /* cinfer_device of the context (default as cinfer_ctx_default_params) */
    int spec_mtp_vocab;    /* CINFER_SPEC_MTP: the head drafts among token ids [0, N) only, so each draft step
                              multiplies N rows of the lm_head instead of the whole vocabulary (BPE ids are in
                              merge order, roughly by frequency); output is exact either way. 0: all ids */
    int precision;         /* cinfer_precision of the contexts (default as cinfer_ctx_default_params) */
} cinfer_engine_params;

cinfer_engine_params cinfer_engine_default_params(void);
int cinfer_engine_create(cinfer_model *m, const cinfer_engine_params *p, cinfer_engine **out, char *err, size_t errlen);
/* Stops the scheduler thread; requests still running end with CINFER_EV_DONE "cancelled". */
void cinfer_engine_destroy(cinfer_engine *e);

typedef struct cinfer_logit_bias {
    int32_t token;
    float bias;
} cinfer_logit_bias;

typedef struct cinfer_sampling {
    float temperature;          /* 0: greedy */
    int top_k;                  /* 0: off */
    float top_p;                /* 1: off */
    float min_p;                /* 0: off */
    float xtc_probability, xtc_threshold;
    float repetition_penalty;   /* 1: off */
    int repeat_last_n;          /* window of the repetition penalty: -1 whole context, 0 off */
    float presence_penalty, frequency_penalty;
    const cinfer_logit_bias *logit_bias; /* copied at submit */
    int n_logit_bias;
    uint64_t seed;
    int has_seed;               /* 0: a seed is drawn per request */
    int n_logprobs;             /* -1: no logprobs; 0: the chosen token's; 1..20: also that many top alternatives */
} cinfer_sampling;

cinfer_sampling cinfer_sampling_default(void);

typedef enum {
    CINFER_TOOLS_NONE = 0,
    CINFER_TOOLS_QWEN_XML = 1,    /* <tool_call><function=..><parameter=..> (Qwen3.5, Qwen3-Coder) */
    CINFER_TOOLS_HERMES_JSON = 2, /* <tool_call>{"name":..,"arguments":..}</tool_call> (Qwen3) */
} cinfer_tool_format;

/* Constrained decoding: tokens that cannot continue a valid answer are masked before sampling, and the end
 * of the sequence is allowed only once the answer is complete. Reasoning the prompt opened (`reasoning` 1)
 * comes first, unconstrained up to its "</think>"; with `reasoning` 2 none is allowed. Logprobs are then
 * those of the masked distribution, and the request does not speculate. */
typedef enum {
    CINFER_CONSTRAIN_NONE = 0,
    CINFER_CONSTRAIN_JSON = 1,       /* JSON matching the JSON Schema constraint_arg (NULL: any JSON object) */
    CINFER_CONSTRAIN_TOOL_CALLS = 2, /* tool calls in tool_format of tools_json: constraint_arg NULL one or more
                                        calls of any tool, else one call of the function of that name */
} cinfer_constraint;

typedef struct cinfer_request_params {
    const int32_t *prompt;      /* copied at submit */
    int n_prompt;
    int max_tokens;             /* clamped to the room left in the context (finish_reason "length") */
    cinfer_sampling sampling;
    const char *const *stop;    /* stop strings, copied at submit (at most 16) */
    int n_stop;
    int ignore_eos;
    int skip_special_tokens;    /* in the text emitted (normally 1) */
    int reasoning;              /* 0: no reasoning split; 1: output starts inside <think> (the prompt opened it);
                                   2: split <think>...</think> if the model writes it */
    cinfer_tool_format tool_format;
    const char *tools_json;     /* the request's tools array (schemas type parameter values), copied */
    cinfer_constraint constraint; /* compiled at submit: an unsupported schema is CINFER_EINVAL naming it */
    const char *constraint_arg;
    cinfer_image *const *images; /* the prompt's images in order (prompt expanded: cinfer_expand_image_pads); the
                                    engine owns them after a successful submit and frees them. Such a request
                                    bypasses the prefix cache (no lookup, no snapshot): a cached state never
                                    stands for another picture. The tower runs at admission for images not
                                    yet encoded (cinfer_image_encode). */
    int n_images;
} cinfer_request_params;

typedef enum {
    CINFER_EV_CONTENT = 1,   /* text: a delta of the answer */
    CINFER_EV_REASONING = 2, /* text: a delta of the reasoning */
    CINFER_EV_TOOL_CALL = 3, /* tool_index, tool_id and tool_name on its first event; tool_args: arguments delta */
    CINFER_EV_LOGPROB = 4,   /* one sampled token: token, token_text, logprob, top[] */
    CINFER_EV_DONE = 5,      /* last event: finish_reason and usage */
    CINFER_EV_ERROR = 6,     /* text: the message; last event */
} cinfer_event_type;

typedef struct cinfer_top_logprob {
    int32_t token;
    float logprob;
    const char *text;        /* the token's bytes (may be part of a UTF-8 character) */
    size_t len;
} cinfer_top_logprob;

typedef struct cinfer_event {
    cinfer_event_type type;
    const char *text;        /* CONTENT, REASONING, ERROR */
    size_t len;
    int tool_index;
    const char *tool_id, *tool_name; /* non-NULL on a call's first event */
    const char *tool_args;   /* arguments JSON delta */
    size_t tool_args_len;
    int32_t token;           /* LOGPROB */
    const char *token_text;
    size_t token_len;
    float logprob;
    const cinfer_top_logprob *top;
    int n_top;
    const char *finish_reason; /* DONE: "stop", "length", "tool_calls", "cancelled" */
    const char *stop_string;   /* DONE: the stop string that matched, if any */
    int prompt_tokens, completion_tokens, cached_tokens;
} cinfer_event;

/* Queues a request; CINFER_EBUSY when the queue is full, CINFER_ERANGE when the prompt does not fit the
 * context (the message gives both counts). */
int cinfer_engine_submit(cinfer_engine *e, const cinfer_request_params *p, cinfer_request **out, char *err, size_t errlen);
/* Waits up to timeout_ms (-1: forever) for the next event: 1 with *ev filled (its pointers stay valid until
 * the next call or cinfer_request_free), 0 on timeout, < 0 after the last event. */
int cinfer_request_next(cinfer_request *r, cinfer_event *ev, int timeout_ms);
/* Asks the scheduler to drop the request at its next step (a client went away). */
void cinfer_request_cancel(cinfer_request *r);
/* Cancels if still running and releases the request (after its DONE, or at once: the engine keeps what it
 * still needs). */
void cinfer_request_free(cinfer_request *r);

typedef struct cinfer_engine_stats {
    int running, waiting, max_seqs, queue_limit;
    int kv_blocks_used, kv_blocks_total;
    int slots_used, slots_total;
    int64_t requests_total, prompt_tokens_total, generated_tokens_total, steps_total;
    int64_t spec_drafted, spec_accepted; /* speculation: draft tokens proposed and kept */
    int64_t device_chosen_tokens; /* tokens chosen by the device sampler (only ids came back; cuda) */
    int64_t prefix_lookups, prefix_hits, prefix_tokens_served, prefix_evictions; /* prefix cache */
    int64_t prefix_bytes;      /* snapshot bytes held */
    int64_t prefix_kv_bytes;   /* bytes of the KV blocks the prefix cache references */
    int prefix_blocks_cached;  /* KV blocks the prefix cache references */
    int device;                /* cinfer_device the engine's context runs on (CPU or CUDA) */
    int precision;             /* cinfer_precision the engine's context runs (cinfer_ctx_precision) */
} cinfer_engine_stats;

void cinfer_engine_get_stats(cinfer_engine *e, cinfer_engine_stats *out);

#ifdef __cplusplus
}
#endif
#endif

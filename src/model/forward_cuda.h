/* forward_cuda.h — the forward pass of forward_cpu.c on a CUDA device: the same ragged batch of fwd_entry,
 * with the weights uploaded once as bf16 (small vectors f32), the residual stream in f32, the KV blocks and
 * DeltaNet state slots in device memory (same block ids and slot numbers as the host-side pools, which only
 * keep the bookkeeping). Decode steps replay CUDA graphs captured per batch shape.
 * Built without CUDA (make CUDA=0, the asan and fuzz builds), every entry point fails with a message. */
#ifndef CI_FORWARD_CUDA_H
#define CI_FORWARD_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "model/forward.h"
#include "model/qwen35.h"
#include "sample/sampler.h"

typedef struct cuda_fwd cuda_fwd;

/* 1 when this build has the CUDA backend; devices visible now (0 without a device or driver). */
int cuda_built(void);
int cuda_devices(void);

typedef struct cuda_fwd_params {
    int max_tokens;     /* rows per call */
    int max_ctx;        /* positions per sequence */
    int n_slots;        /* DeltaNet state slots */
    int n_blocks;       /* KV blocks */
    int random_weights; /* 1: fill matrices with uniform noise on the device instead of reading the model's
                           (the bench's --like shapes); the f32 vectors still come from the model */
    uint64_t seed;
    int no_graphs;   /* 1: never capture (tests compare both) */
    int spec_window; /* tokens a speculative window may hold (0: none; records take n_slots x n_lin x this) */
    int fast;        /* precision fast (cinfer_precision): the prefill's tensor-core work on bf16-rounded activations */
} cuda_fwd_params;

int cuda_fwd_create(const model *m, const cuda_fwd_params *p, cuda_fwd **out, char *err, size_t errlen);
void cuda_fwd_destroy(cuda_fwd *f);
/* zeroes a DeltaNet slot (conv window and recurrent state) for a new sequence */
int cuda_fwd_slot_reset(cuda_fwd *f, int slot, char *err, size_t errlen);
/* Runs the batch (same contract as forward_cpu) and writes the logits rows to host memory (pinned memory from
 * cuda_host_alloc copies fastest); logits NULL leaves them on the device for cuda_fwd_sample. An entry's
 * spec_rec only marks a speculative window (n <= spec_window): its records live on the device, per slot, and
 * the slot's DeltaNet state is left as it was until cuda_fwd_spec_commit. hidden rows (the MTP head's input)
 * are copied back with the logits. */
int cuda_fwd_run(cuda_fwd *f, const fwd_entry *e, int n_entries, float *logits, char *err, size_t errlen);
/* Keeps the first n_keep tokens of slot's last speculative window (forward_spec_commit on the device: the
 * conv window advanced, S replayed from the records with the decode kernel's arithmetic). Enqueued only:
 * later calls on the context see it in stream order. */
int cuda_fwd_spec_commit(cuda_fwd *f, int slot, int n_keep, char *err, size_t errlen);
/* A slot's whole DeltaNet state as cuda_fwd_state_floats() floats: every layer's conv windows, then every
 * layer's S (the device layout; only cuda_fwd_state_load reads it back). Save / load are enqueued copies
 * (pinned host memory makes them asynchronous); cuda_fwd_sync waits. The prefix cache's snapshots. */
size_t cuda_fwd_state_floats(const cuda_fwd *f);
int cuda_fwd_state_save(cuda_fwd *f, int slot, float *dst, char *err, size_t errlen);
int cuda_fwd_state_load(cuda_fwd *f, int slot, const float *src, char *err, size_t errlen);
/* KV rows [0, rows) of block src copied into block dst in every full-attention layer (copy on write) */
int cuda_fwd_kv_copy(cuda_fwd *f, int dst, int src, int rows, char *err, size_t errlen);
int cuda_fwd_sync(cuda_fwd *f, char *err, size_t errlen);
/* The MTP head (model/mtp.h's forward_mtp on the device): cuda_fwd_mtp_init uploads its weights and makes its
 * one-layer KV pool of n_blocks blocks (block ids of the context's MTP pool); cuda_fwd_mtp_run has
 * forward_mtp's contract (entries' blocks are head block tables; a head resumed mid-sequence attends from its
 * attn_start, through the untiled attention kernel). */
struct mtp_io;
int cuda_fwd_mtp_init(cuda_fwd *f, int n_blocks, char *err, size_t errlen);
int cuda_fwd_mtp_run(cuda_fwd *f, const fwd_entry *e, const struct mtp_io *io, int n_entries, int n_vocab,
                     float *logits, char *err, size_t errlen);
/* The same with each logits row's argmax (ties to the lowest id) chosen on the device: ids [rows], nothing
 * else of the logits comes back (the head's drafts) */
int cuda_fwd_mtp_run_ids(cuda_fwd *f, const fwd_entry *e, const struct mtp_io *io, int n_entries, int n_vocab,
                         int32_t *ids, char *err, size_t errlen);

/* Token choice on the device for the rows the last cuda_fwd_run left there, so that only ids (and logprobs
 * when asked) come back. It follows the CPU sampler's chain (src/sample/sampler.h) for what it accepts:
 * logit_bias and the repetition / presence / frequency penalties (pen: the row's adjusted tokens, distinct,
 * as sampler_device_row lists them), then greedy (temperature below 1e-5, or top_k 1: argmax, ties to the
 * lowest id), or top_k in 2..64 (< V) at a temperature, then top_p and min_p. The caller keeps the rest on
 * the host (top_k off or above 64, XTC, grammars, top_logprobs). u is the request's own uniform draw, so the
 * generator stays on the host. A zeroed row is greedy with every filter off. The logits rows are not
 * written: a logprob is of the raw distribution, as the CPU sampler reports it. */
#define CUDA_SAMPLE_MAX_K       64
#define CUDA_SAMPLE_GREEDY_TEMP 1e-5f
#define CUDA_SAMPLE_MAX_PEN     4096    /* adjusted tokens a row at most */
#define CUDA_SAMPLE_PEN_CAP     (1 << 20) /* adjusted tokens of one call at most */
#define CUDA_SAMPLE_MAX_V       524288    /* vocabularies the device sampler takes at most */
typedef sampler_dev_pen cuda_sample_pen; /* flags SAMPLER_DEV_*: the device's CU_PEN_* */
typedef struct cuda_sample {
    float temperature;
    int top_k;
    double u;    /* [0, 1), unused when greedy */
    int logprob; /* report the chosen token's raw logprob (log_softmax of the model's logits) */
    float top_p; /* in (0, 1): on; else off */
    float min_p; /* > 0: on */
    float repetition_penalty; /* for the pen entries with flag 2 */
    const cuda_sample_pen *pen; /* [n_pen] distinct tokens, or NULL */
    int n_pen;
} cuda_sample;
int cuda_sample_eligible(float temperature, int top_k, int V);
int cuda_fwd_sample(cuda_fwd *f, const cuda_sample *rows, int n, int32_t *ids, float *logprobs, char *err,
                    size_t errlen);
/* cuda_fwd_run (logits left on the device) then cuda_fwd_sample of its first n logits rows, with one wait for
 * both instead of one each: the sample is enqueued behind the step, so the device runs it without waiting for
 * the host to wake up between them. */
int cuda_fwd_run_sample(cuda_fwd *f, const fwd_entry *e, int n_entries, const cuda_sample *rows, int n,
                        int32_t *ids, float *logprobs, char *err, size_t errlen);
/* Host memory for logits rows: page-locked when pin and a device is there (the copy runs at full link speed
 * instead of through a bounce buffer), else plain (NULL when out of memory); free with cuda_host_free. */
void *cuda_host_alloc(size_t bytes, int pin);
void cuda_host_free(void *p);
/* Device memory outside any context (the prefix cache's snapshots with CINFER_PREFIX_DEVICE=1), NULL when
 * there is none or no device; cuda_fwd_state_save / _load copy to and from it device to device. */
void *cuda_dev_alloc(size_t bytes);
void cuda_dev_free(void *p);
/* device memory free now (0 without a device) */
size_t cuda_dev_free_bytes(void);

/* Per-phase device time of the calls since the last reset (profiling disables graphs). */
enum {
    CP_EMBED_NORM,
    CP_GEMM_IN,
    CP_GDN,
    CP_ATTN,
    CP_GEMM_OUT,
    CP_FFN_GEMM,
    CP_FFN_ACT,
    CP_MOE_ROUTE,
    CP_MOE_EXPERTS,
    CP_LM_HEAD,
    CP_COPY_OUT,
    CP_N
};
extern const char *const cuda_phase_names[CP_N];
void cuda_fwd_profile(cuda_fwd *f, int on);
void cuda_fwd_profile_get(cuda_fwd *f, double ms[CP_N], int *calls);
/* bytes of device memory the weights, KV pool + state slots, and scratch took */
void cuda_fwd_memory(const cuda_fwd *f, size_t *weights, size_t *pools, size_t *scratch);
/* graphs made so far: captured and instantiated, captured and updated into a held one
 * (CINFER_CUDA_GRAPH_UPDATE) */
void cuda_fwd_graph_stats(const cuda_fwd *f, int *captured, int *updated);
/* the context's stream handle for roofline probes */
struct cu_ctx *cuda_fwd_stream(cuda_fwd *f);

#endif

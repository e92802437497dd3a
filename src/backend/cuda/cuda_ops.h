/* cuda_ops.h — the CUDA backend seen from C: device memory, one stream + cuBLAS handle per context, and a
 * launcher per kernel (the .cu files beside this header, one per op family). Launchers only enqueue work on
 * the context's stream; errors surface at cu_sync / cu_check. Every pointer named d_* is device memory. bf16
 * tensors are uint16_t (raw bits); everything else is f32 unless said. Row-major throughout. Built only when
 * the Makefile finds nvcc (CINFER_CUDA); the C side compiles without it. */
#ifndef CI_CUDA_OPS_H
#define CI_CUDA_OPS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cu_ctx cu_ctx;

/* Devices visible to the runtime; 0 when there is no device or no driver (never an error). */
int cu_device_count(void);
/* Name and memory of device 0, for logs. */
void cu_device_describe(char *buf, size_t len);

/* A stream, a cuBLAS handle with a fixed workspace (so graph capture never allocates). */
int cu_ctx_create(cu_ctx **out, char *err, size_t errlen);
void cu_ctx_destroy(cu_ctx *c);

int cu_alloc(void **p, size_t bytes, char *err, size_t errlen); /* zeroed device memory */
void cu_free(void *p);
int cu_alloc_host(void **p, size_t bytes, char *err, size_t errlen); /* pinned */
void cu_free_host(void *p);
int cu_upload(void *d_dst, const void *src, size_t bytes, char *err, size_t errlen); /* synchronous */
int cu_download(void *dst, const void *d_src, size_t bytes, char *err, size_t errlen);
void cu_h2d_async(cu_ctx *c, void *d_dst, const void *src, size_t bytes);
/* the copy on a side stream, which starts it at once (beside whatever the stream is running); the stream's
 * next operations wait for it. src (pinned) and d_dst must not be touched by anything the stream runs before
 * them */
void cu_h2d_side(cu_ctx *c, void *d_dst, const void *src, size_t bytes);
void cu_d2h_async(cu_ctx *c, void *dst, const void *d_src, size_t bytes);
void cu_d2d_async(cu_ctx *c, void *d_dst, const void *d_src, size_t bytes);
/* either side on the device or the host (unified addressing tells which) */
void cu_copy_async(cu_ctx *c, void *dst, const void *src, size_t bytes);
/* device memory free now (cudaMemGetInfo), 0 on error */
size_t cu_mem_free(void);
void cu_memset_async(cu_ctx *c, void *d, size_t bytes);
/* Waits for the stream; returns the first error of anything enqueued since. */
int cu_sync(cu_ctx *c, char *err, size_t errlen);
/* Launch-time errors (bad configuration) without waiting. */
int cu_check(char *err, size_t errlen);

/* CUDA graphs over the context's stream: begin capture, end it into an executable graph, replay it. */
int cu_capture_begin(cu_ctx *c, char *err, size_t errlen);
int cu_capture_end(cu_ctx *c, void **graph_exec, char *err, size_t errlen);
/* cu_capture_end that updates `old` in place when the driver accepts the graph for it (*graph_exec == old) */
int cu_capture_end_update(cu_ctx *c, void *old, void **graph_exec, char *err, size_t errlen);
int cu_graph_launch(cu_ctx *c, void *graph_exec, char *err, size_t errlen);
void cu_graph_destroy(void *graph_exec);

/* Timing of enqueued work (for the bench's per-kernel breakdown). */
typedef struct cu_timer cu_timer;
int cu_timer_create(cu_timer **t);
void cu_timer_destroy(cu_timer *t);
void cu_timer_start(cu_ctx *c, cu_timer *t);
float cu_timer_stop_ms(cu_ctx *c, cu_timer *t); /* synchronises */
/* ms between the start events of two timers (both recorded and complete) */
float cu_timer_between_ms(cu_timer *a, cu_timer *b);

/* ---- GEMM (gemm.cu) ---- */
/* y[M][N] = x[M][K] · w[N][K]^T, f32 out. Rows of x are f32; with M <= CU_GEMV_MAX_M (or precise) a
 * bf16-weight GEMV keeps x in f32 and streams w once for all rows (each output's sum has a fixed order, so a
 * row's result does not depend on M); otherwise x is split into bf16 hi + lo in xb ([2M][K] scratch) and
 * cuBLAS runs bf16 x bf16 -> f32 on tensor cores over both halves. */
#define CU_GEMV_MAX_M 8
/* diagnostics: route up to m rows through the f32-activation GEMV (CINFER_CUDA_GEMV_MAX; 0 restores 8) */
void cu_set_gemv_max(int m);
void cu_gemm(cu_ctx *c, float *d_y, const float *d_x, const uint16_t *d_w, int M, int N, int K,
             uint16_t *d_xb, int precise);
/* rows up to which cu_gemm takes the f32-activation GEMV (cu_set_gemv_max) */
int cu_gemv_max(void);
/* which f32-activation GEMV cu_gemm runs: 1 (default) a warp per 2 weight rows; 2 (CINFER_CUDA_GEMV=v2) a
 * block per 4 rows with K split among its 8 warps where that was measured faster (one row of x, K >= 4096),
 * v1 elsewhere; 3 (CINFER_CUDA_GEMV=v2all) the split-K kernel wherever K % 8 == 0; 4 (CINFER_CUDA_GEMV=v3)
 * cu_gemv_fused's kernel without prologue or epilogue wherever K % 8 == 0. Each is independent of M row by
 * row; they differ from each other by f32 rounding. */
void cu_set_gemv_version(int v);
int cu_gemv_version(void);
/* programmatic dependent launch (common.cuh says the rules): 0 off; 1 the GEMVs (CINFER_CUDA_PDL=gemv):
 * their blocks start while the kernel before them finishes and request their first weights then; 2 every
 * kernel of a decode step (CINFER_CUDA_PDL=1), each doing what needs nothing from the kernel before it
 * (weights, its own layer's state) before it waits for it. The same bits in every mode. */
void cu_set_pdl(int level);
int cu_pdl_on(void);
/* 1 (default): no PDL launch right after a memcpy, memset, event record or graph launch; 0 only to
 * reproduce session 4's illegal address (CINFER_CUDA_PDL_BREAK=0) */
/* Diagnostics (dep_probe.cu): a chain of `launches` GEMV-like kernels of `blocks` blocks, each streaming
 * bytes_each of w (launch l from w + l bytes_each), each but the first launched by PDL and released by mode 0
 * griddepcontrol.wait, 1 a counter with fences (__threadfence + atomicAdd / ld.acquire + __threadfence), 2 a
 * counter without fence.sc (red.release / ld.acquire), 3 as 0 with the stamps stored at an index taken by
 * atomicAdd (as gemv3.cu's timeline). ctr: [launches + 1] device counters; st: [launches][blocks][3] device
 * %globaltimer stamps (start, wait done, end); sink: [blocks] device. 0, or -1 on bad arguments. */
int cu_dep_probe(cu_ctx *c, int mode, int launches, const uint16_t *w, size_t bytes_each, int blocks,
                 unsigned *ctr, unsigned long long *st, unsigned *sink);
void cu_set_pdl_break(int on);
int cu_pdl_break_on(void);
/* which kernels go by PDL (CINFER_CUDA_PDL_MASK, diagnostics; default 31, all): 1 embedding / norms / SwiGLU
 * / adds, 2 the fused DeltaNet decode kernel, 4 the fused attention decode kernel, 8 sampling, 16 GEMVs */
void cu_set_pdl_mask(int mask);
/* 1 (CINFER_CUDA_ATTN_PF=1, the default): the fused attention decode kernel requests each warp's next
 * position's k / v before the current one's arithmetic (and its first, under PDL, before waiting for
 * in_proj); 0 off; the same bits */
void cu_set_attn_decode_pf(int on);
/* the prefetch above only in batches of at most rows rows (default 32; 0: any batch); the same bits */
void cu_set_attn_decode_pf_rows(int rows);
/* 1 (the default; CINFER_CUDA_ATTN_PRE=0: 0): the fused attn_dec_kernel computes the RoPE's cos / sin before
 * its PDL wait (norm_rope_pre) instead of after the q / k loads; the same bits */
void cu_set_attn_dec_pre(int on);
/* f32 scratch for the stacked hi/lo product of up to 64 rows (2 x 64 x widest N floats) */
void cu_set_gemm_scratch(cu_ctx *c, float *d_t, size_t floats);
/* the rows each half of the xb given to cu_gemm holds (at least the M of any call): with cu_set_gemm_pad on,
 * the stacked product of up to 64 rows runs on M rounded up to a multiple of 16 (CU_GEMM_PAD_ROWS) where xb
 * holds it */
void cu_set_gemm_xb_rows(cu_ctx *c, int rows);
#define CU_GEMM_PAD_ROWS 16
#define CU_GEMM_PAD_BIG  64
/* cu_gemm (precise 0) into a y of y_rows rows: with the pad switch, more than 64 rows run as M rounded up to
 * CU_GEMM_PAD_BIG where y_rows and the context's xb rows allow (rows M.. of y then overwritten) */
void cu_gemm_rows(cu_ctx *c, float *d_y, const float *d_x, const uint16_t *d_w, int M, int N, int K,
                  uint16_t *d_xb, int y_rows);
void cu_set_gemm_pad(int on);
int cu_gemm_pad(void);
/* CINFER_CUDA_PF_SPLIT: the producer of a prefill GEMM's input writes its bf16 hi | lo halves (the lo half at
 * lo = Mb * K halves) instead of f32 rows for cu_gemm to split; the same bits as cu_gemm on those rows.
 * cu_gemm_presplit_rows: Mb for a product of M rows into a y of y_rows rows where it takes the tensor-core
 * path (more than 64 rows; two bf16 passes, or one with cu_set_fast_presplit on), else 0 (then cu_gemm
 * must run); cu_gemm_presplit: that product from the halves (one pass: the one copy) in xb. */
int cu_gemm_presplit_rows(cu_ctx *c, int M, int K, int y_rows);
void cu_gemm_presplit(cu_ctx *c, float *d_y, const uint16_t *d_xb, const uint16_t *d_w, int M, int N, int K,
                      int Mb);
/* xb = split(silu(gate) * up) of gu [T][2I] (cu_swiglu's values) */
void cu_swiglu_split(cu_ctx *c, uint16_t *d_xb, const float *d_gu, int T, int I, size_t lo);
/* x += add (add may be NULL); xb = split(rmsnorm(x) * w) (cu_add_rmsnorm's values) */
void cu_add_rmsnorm_split(cu_ctx *c, float *d_x, const float *d_add, uint16_t *d_xb, const float *d_w, int T,
                          int H, float eps, size_t lo);
/* this context's GEMMs: 2 (default): activations as bf16 hi + lo through the tensor cores; 1: one bf16
 * rounding (precision fast, or CINFER_CUDA_BF16_PASSES) */
void cu_set_bf16_passes(cu_ctx *c, int passes);
/* where the producers write for cu_gemm_presplit: the lo half's offset Mb * K with two passes, 0 with one
 * (one bf16 copy, split_put writes hi only) */
size_t cu_gemm_presplit_lo(cu_ctx *c, int Mb, int K);
/* CINFER_CUDA_FAST_PRESPLIT (default on): with one pass, producers write the GEMM's one bf16 copy; 0: f32 */
void cu_set_fast_presplit(int on);
/* CINFER_CUDA_LT_TUNE (default on; report: each choice on stderr): one-pass products of at least
 * CU_LT_MIN_ROWS rows on the cuBLASLt algorithm timed fastest for their shape (gemm.cu); cu_lt_tune: whether
 * it is on. Not below 1024: at the engine's 512-row chunks (4B, H200, session 10's fourth call) the choice
 * measured within noise of GemmEx's (42,657 tok/s without it, 42,880 from 256 rows up) */
#define CU_LT_MIN_ROWS 1024
void cu_set_lt_tune(int on, int report);
int cu_lt_tune(void);
/* CINFER_CUDA_FAST_GU16 (precision fast, default on): the gate_up product from the norm's bf16 copy into bf16
 * y [Mb][N] (cu_gemm_presplit_out16), and xb = bf16(silu(gate) * up) from it (cu_swiglu16), the down GEMM's
 * one copy */
void cu_gemm_presplit_out16(cu_ctx *c, uint16_t *d_y, const uint16_t *d_xb, const uint16_t *d_w, int N, int K,
                            int Mb);
void cu_swiglu16(cu_ctx *c, uint16_t *d_xb, const uint16_t *d_gu, int T, int I);
/* Same, but every row m uses its own matrix w + widx[m] * N * K (MoE experts at decode; M <= any). */
void cu_gemv_indexed(cu_ctx *c, float *d_y, const float *d_x, int x_row_div, const uint16_t *d_w,
                     const int *d_widx, int M, int N, int K);
/* ---- the decode GEMV v3 with its fusions (gemv3.cu) ---- */
/* y = x · w^T at decode-sized M (cu_gemv_fusable: M <= cu_gemv_max(), K % 8 == 0), rows of x f32 with
 * stride K, rows of y f32 with stride N, each row's bits independent of M. norm_w ([K] f32, the 1 + weight
 * form) or NULL: x rows are rmsnorm(x) * norm_w first (eps), the sum of squares computed in the kernel, so x
 * is the raw residual; epi: CU_EPI_STORE y = ..., CU_EPI_ADD y += ... (the residual stream: y must not be x
 * or be read by the kernel otherwise), CU_EPI_SWIGLU w holds 2N rows (gate rows, then up rows) and
 * y = silu(x · gate^T) * (x · up^T). Built: norm + STORE, norm + SWIGLU, no norm + ADD, no norm + STORE;
 * another combination returns -1 and launches nothing. */
enum { CU_EPI_STORE = 0, CU_EPI_ADD = 1, CU_EPI_SWIGLU = 2 };
int cu_gemv_fusable(int M, int K);
int cu_gemv_fused(cu_ctx *c, float *d_y, const float *d_x, const uint16_t *d_w, int M, int N, int K,
                  const float *d_norm_w, float eps, int epi);
/* K-splits of the v3 kernel for a matrix of `rows` weight rows (2N for SwiGLU) and width K: a function of
 * the shape only, which fixes every sum's order */
int cu_gemv3_splits(int rows, int K);
/* measurements: force the K-splits (1, 2, 4, 8), the output rows per warp (1, 2, 4), the chunks in flight
 * (1, 2, 4) and the variant (0: blocks of 8 warps, 2: of 4 warps, at most 4 splits; + 4: the next chunks
 * requested before the current ones' FMAs) at one row of x; 0 (-1 for var) = automatic. The splits change
 * f32 rounding; the others never change a bit. */
void cu_set_gemv3_config(int ks, int nr, int u, int var);
/* measurements: at one row, the chunks in flight (1, 2, 4) and the variant (0, 2, 4, 6) of the <= 8192-output
 * matrices and of the wider ones (0 / -1: automatic); never a changed bit */
void cu_set_gemv3_one(int u_small, int var_small, int u_big, int var_big);
/* the wide SwiGLU GEMV at one row of x: output rows a warp (1, 2 default, 4) and variant (0-10 even, default
 * 10; where K <= 4096); never a changed bit */
void cu_set_gemv3_glu(int nr, int var);
/* 1 (default; CINFER_CUDA_GEMV_VAR4=0: 0): the <= 4096-output matrices at one row take variant 4 */
void cu_set_gemv3_small_var4(int on);
/* diagnostics (tests): every block of the decode GEMVs launched between _begin and _end records %globaltimer
 * (ns) at its start, after its PDL wait and at its end, its SM, the launch's tag (0, 1, ... in launch order
 * from _begin; cu_gemv3_stamp_tag: the next one), its block and the grid's size; _end waits for the device
 * and returns how many stamps it copied into out (at most cap) */
typedef struct cu_g3_stamp {
    unsigned long long t[3];
    unsigned sm, tag, block, grid;
} cu_g3_stamp;
int cu_gemv3_stamps_begin(cu_ctx *c, size_t cap, char *err, size_t errlen);
long cu_gemv3_stamps_end(cu_ctx *c, cu_g3_stamp *out, size_t cap, char *err, size_t errlen);
int cu_gemv3_stamp_tag(void);
/* 1: launches take no tag and record nothing until called with 0 (CINFER_CUDA_G3_STAMPS: a forward stamps
 * only the GEMVs it picks, in_proj and out_proj) */
void cu_gemv3_stamps_pause(int on);
/* CINFER_CUDA_L2PF_NEXT: the next cu_gemv_fused (register form) requests bytes at w — the head of the matrix
 * of the GEMV after it — into L2 from the blocks of its second half once their loads are out; w NULL: none.
 * Weights only: no value changes */
void cu_set_gemv_next(cu_ctx *c, const void *w, size_t bytes);
/* ---- the skinny GEMM on tensor cores (gemm_mma.cu) ---- */
/* cu_gemv_fused's interface and fusions for up to 32 rows of x at a time (more in tiles of 32): bf16 weights
 * as the MMA's A operand, x split into bf16 hi + lo as its B operand (x to ~2^-17: ||dy|| / ||y|| ~ 1e-6),
 * f32 sums in an order fixed by the shape, so each row's bits are independent of M. Returns -1 as
 * cu_gemv_fused does for a combination it does not build (K % 8 != 0 among them). */
int cu_skinny(cu_ctx *c, float *d_y, const float *d_x, const uint16_t *d_w, int M, int N, int K,
              const float *d_norm_w, float eps, int epi);
/* CINFER_CUDA_SKINNY: 0 off (default); 1: cu_gemv_fused and cu_gemm (not precise) take cu_skinny for every
 * M <= cu_skinny_max() (and cu_gemv_fusable says yes up to it); 2: the same for M >= 2 only (one row stays on
 * v3). CINFER_CUDA_SKINNY_MAX: that bound, 1..32 (default 8) */
void cu_set_skinny(int mode);
int cu_skinny_mode(void);
void cu_set_skinny_max(int m);
int cu_skinny_max(void);
/* this context's own mode (0: the process-wide cu_set_skinny one). CINFER_CUDA_SKINNY=auto: 1 for a
 * context that may verify speculative windows (decode rows and verify rows then share the kernel, as exact
 * rollback needs), 2 for one that never does (one row stays on the faster GEMV v3) */
void cu_ctx_set_skinny(cu_ctx *c, int mode);
/* 1 when any mode is on (process-wide or some context's) */
int cu_skinny_any(void);
/* 1 when c's mode routes a product of M rows of width K to cu_skinny (c NULL: the process-wide mode) */
int cu_skinny_takes(const cu_ctx *c, int M, int K);
/* K-splits of the skinny kernel for N outputs of width K with epilogue epi (a function of the shape only) */
int cu_skinny_splits(int N, int K, int epi);
/* measurements: weight tiles of 16 rows per warp (1, 2; SwiGLU: gate + up rows of 8 or 16 outputs), chunks in
 * flight (1, 2), x requested with its chunk's weights (1) or when consumed (0; always 0 above 16 rows), warps
 * per block (4, 8; 8 with 8 splits), none of which changes a bit; and the K-splits (1, 2, 4, 8), which do
 * (every sum's order); 0 / -1 = automatic */
void cu_set_skinny_config(int tr, int u, int xp, int w, int ks);
/* Fills n bf16 values with uniform noise of the given std (random weights built on the device). */
void cu_fill_random_bf16(cu_ctx *c, uint16_t *d, size_t n, float std, uint64_t seed);
void cu_fill_f32(cu_ctx *c, float *d, size_t n, float v);
/* f32 -> bf16, n values */
void cu_f32_to_bf16(cu_ctx *c, uint16_t *d_y, const float *d_x, size_t n);
/* Device copy bandwidth (GB/s, read + write counted) and bf16 GEMM rate (TFLOP/s), measured now. */
int cu_measure_roofline(cu_ctx *c, double *copy_gbs, double *gemm_tflops, char *err, size_t errlen);

/* ---- row ops (rownorm.cu) ---- */
/* x[T][H] = bf16 embed rows of ids */
void cu_embed(cu_ctx *c, float *d_x, const uint16_t *d_embed, const int *d_ids, int T, int H);
/* if d_add: x += add (residual); then y = rmsnorm(x) * w (w is 1 + weight, f32) */
void cu_add_rmsnorm(cu_ctx *c, float *d_x, const float *d_add, float *d_y, const float *d_w, int T, int H,
                    float eps);
/* y[r] = rmsnorm(x[src[r]]) * w for r < n (rows gathered through src) */
void cu_gather_rmsnorm(cu_ctx *c, float *d_y, const float *d_x, const int *d_src, const float *d_w, int n,
                       int H, float eps);
/* y[T][I] = silu(gu[:, :I]) * gu[:, I:2I] */
void cu_swiglu(cu_ctx *c, float *d_y, const float *d_gu, int T, int I);
/* x[r] += y[r] (T rows of n) */
void cu_add(cu_ctx *c, float *d_x, const float *d_y, int T, int n);
/* y[r] = [a[r] | b[r]] (T rows of 2H from two of H: the MTP head's fc input) */
void cu_concat_rows(cu_ctx *c, float *d_y, const float *d_a, const float *d_b, int T, int H);

/* ---- per-call metadata, laid out by cu_meta_layout (device int buffer) ---- */
typedef struct cu_meta {
    const int *ids;       /* [T] */
    const int *row_pos;   /* [T] */
    const int *row_entry; /* [T] */
    const int *e_len;     /* [NE] tokens before this call */
    const int *e_n;       /* [NE] new tokens */
    const int *e_row0;    /* [NE] first row */
    const int *e_slot;    /* [NE] DeltaNet slot */
    const int *e_boff;    /* [NE] offset of the entry's block table in blocks */
    const int *lrow;      /* [nl] rows that need logits */
    const int *blocks;    /* block tables, concatenated */
    const int *e_spec; /* [NE] 1: a speculative window (the slot is read, never written; see cu_gdn_args) */
    const int *e_keep; /* NULL, or [NE] tokens of the slot's last window kept and not yet committed: replayed
                          into the slot before the entry's own tokens (cu_gdn_args.spec_buf; 0 without) */
    const int
        *e_par; /* [NE] the record buffer this entry's window writes; e_keep's records are in the other */
    const int *e_astart; /* NULL, or [NE] first position the attention reads (an MTP head resumed
                            mid-sequence: only the one-split, untiled decode kernel honours it) */
} cu_meta;

/* ---- Gated DeltaNet (deltanet.cu) ---- */
typedef struct cu_gdn_args {
    int T, NE, Hk, Hv, dk, dv, K, C; /* C = 2*Hk*dk + Hv*dv */
    int n_lin, lin;                  /* linear layers, this one's index (state layout) */
    const float *qkv;
    int qkv_ld; /* pre-conv rows [T][C] with row stride */
    const float *z;
    int z_ld; /* output gate [T][Hv*dv] */
    const float *b;
    const float *a;
    int ba_ld;           /* [T][Hv] each */
    const float *conv_w; /* [K][C] */
    const float *A, *dt_bias, *gnorm;
    float *conv_out; /* [T][C] scratch */
    float *bg;       /* [T][2Hv] scratch: beta | g */
    float *o;        /* [T][Hv*dv] output (gated-normed) */
    /* NULL, or (CINFER_CUDA_PF_SPLIT) the out_proj GEMM's bf16 halves [2][Mb][Hv*dv] (lo at o_lo halves) that
     * the gated norm writes instead of o (o then holds the pass's un-normed rows) */
    uint16_t *o_xb;
    size_t o_lo;
    float *conv_state; /* [slots][n_lin][K-1][C] */
    float *rec_state;  /* [slots][n_lin][Hv][dk][dv] */
    float eps;
    int tc; /* the chunked (prefill) form: 0 the scalar kernel; nonzero (2 from forward_cuda) on the tensor
               cores in phases, parallel over the chunks (deltanet_chunk.cu), where chunk_scr holds the batch
               (else the scalar kernel); 2 also takes the conv by rows */
    void *chunk_scr; /* tc 2: cu_gdn_chunk_bytes(chunk_cap, T, Hv, dk, dv) bytes of device scratch */
    int chunk_cap; /* tc 2: chunks the scratch holds (cu_gdn_chunk_cap); a batch that may span more: scalar */
    int chunk_dt;  /* tc 2: the kernels (CINFER_CUDA_GDN_DT): 0 "stage" (WMMA, each chunk's inputs staged in
                      shared memory one chunk ahead), 1 the mma.sync form ("mma6"), 2 that on its shared-memory
                      image staged by bulk copies (dk 128, dv a multiple of 32, else 1; forward_cuda's default)
                    */
    /* tc 2: 1 fast mode's form (deltanet_chunk.cu: bf16 operands rounded once, one mma.sync m16n8k16 a
     * product, f32 accumulation, decays and T = (I + A)^-1 in f32, the state f32) where it serves (dk 128,
     * dv a multiple of 32 up to 128), else the form chunk_dt names; 0 chunk_dt's */
    int chunk_fast;
    long long *chunk_prof; /* diagnostics, normally NULL: [16] device clock cycles per phase of one prep block
                              ([0..6]) and of one block of the staged pass ([8..12], chunks in [15]) */
    /* speculative windows (meta.e_spec): the conv window and S of the slot stay as they were; each token's
     * position-local inputs go to spec_rec [slots][n_lin][spec_win][CU_SPEC_REC(C, Hv)] (pre-conv q|k|v, the
     * normed post-conv q|k|v, beta, g) for cu_gdn_spec_commit; the recurrence runs token by token from the
     * slot's S in registers, the decode kernel's arithmetic. has_spec 0: no such entry in the batch (nothing
     * extra is launched, so decode graphs never hold the record kernel) */
    float *spec_rec;
    int spec_win, has_spec;
    /* floats in one record buffer: with deferred commits (CINFER_CUDA_SPEC_FUSE=1) spec_rec holds two, and a
     * window's commit is done by the next step of its slot (meta.e_keep) from the buffer it wrote; 0: one */
    size_t spec_buf;
    /* 1: no entry takes the chunked form (every one a decode token continuing its sequence or a speculative
     * window): its kernel is not launched — it would only return, but as NE x Hv x dv/32 blocks each holding
     * ~156 KB of shared memory, one block per SM at a time, which at decode batch 64 took milliseconds */
    int no_chunked;
    /* NULL: the four kernels (conv, prep, recurrent, gnorm) always. Else [NE][Hk] counters, zero between
     * launches (device memory, zeroed once; the kernel sets them back): a batch of decode tokens only
     * (no_chunked, !has_spec) runs the whole layer as one fused kernel with the same bits
     * (CINFER_CUDA_GDN_FUSED) */
    unsigned *dec_cnt;
    /* NULL: windows through the kernels above. Else [NE][Hk] counters as dec_cnt's: a batch of speculative
     * windows and decode tokens only (no_chunked, has_spec) runs the whole layer as one fused kernel with the
     * same bits, records and deferred commits included (CINFER_CUDA_SPEC_WINFUSED) */
    unsigned *win_cnt;
    /* with win_cnt: 1 the kernel's second form (fewer dependent loads; the same bits),
     * CINFER_CUDA_SPEC_WINFUSED=2 */
    int win_v2;
    /* with dec_cnt: 1 the decode kernel as thread block clusters, a key head's group one cluster (the same
     * bits; cu_gdn_cluster_init must have said yes), CINFER_CUDA_GDN_CLUSTER; 2 its second
     * form (fused_decode_cluster2_kernel: the same bits, a shorter chain after the PDL wait, its conv inputs
     * read first under an L2 evict_last policy; forward_cuda's default) */
    int dec_cluster;
    int dec_cluster_max; /* with dec_cluster: batches of at most this many entries only (<= 0: any) */
    /* with dec_cnt, where the clusters do not take the step: 1 the decode kernel one block a value head
     * (fused_decode_wide_kernel: a thread four columns, float4 state loads, the head's gated norm in the
     * block; the same bits) where dk <= 128, dv <= 128, dv % 4 == 0 and K <= 4, CINFER_CUDA_GDN_WIDE; 0 32
     * columns a block (fused_decode_kernel) */
    int dec_wide;
    /* diagnostics, normally NULL (CINFER_CUDA_GDN_STAMPS): [0] a counter, then per launch of the clustered
     * kernel up to CU_GDN_STAMP_CAP records of CU_GDN_STAMPS %globaltimer values of its block (0, 0, 0):
     * start, PDL wait done, conv done, l2norm factors done, the read-out joined, update done, outputs sent
     * and state stored, cluster barrier done, end */
    unsigned long long *dec_stamps;
    float dec_qscale; /* set by cu_gdn_layer for the clustered kernel: (float)(1 / sqrt(dk)) */
    cu_meta meta;
} cu_gdn_args;
#define CU_GDN_STAMPS      9
#define CU_GDN_STAMP_CAP   8192
#define CU_SPEC_REC(C, Hv) (2 * (size_t)(C) + 2 * (size_t)(Hv))
/* conv1d + SiLU (window advanced), l2norm q/k + scale, beta/g, recurrent (decode) or chunked (prefill)
 * DeltaNet, gated RMSNorm: a whole DeltaNet layer between in_proj and out_proj. */
void cu_gdn_layer(cu_ctx *c, const cu_gdn_args *a);
/* Keeps the first n_keep tokens of the last speculative window of slot in every linear layer: the conv
 * window advanced by the kept pre-conv rows and S replayed over them from the records with the decode
 * kernel's arithmetic (bit-identical to decoding them one by one). Only enqueues; n_keep <= spec_win. */
void cu_gdn_spec_commit(cu_ctx *c, float *d_conv_state, float *d_rec_state, const float *d_spec_rec, int slot,
                        int n_keep, int n_lin, int spec_win, int Hk, int Hv, int dk, int dv, int K, int C);
/* Qwen3-Next: per key-head groups of in_proj_qkvz | in_proj_ba ([T][ld] rows) into q|k|v, z, b, a */
void cu_next_split(cu_ctx *c, const float *d_in, int ld, float *d_qkv, float *d_z, float *d_b, float *d_a,
                   int T, int Hk, int Hv, int dk, int dv);
/* 1 when the clustered decode kernel (cu_gdn_args.dec_cluster) serves this shape on this device (a key
 * head's rr x dv/32 blocks, at most 16, as one cluster); sets its attributes (call before any graph capture)
 */
int cu_gdn_cluster_init(int Hk, int Hv, int dk, int dv);
/* 1 when the chunked kernel's shared memory for this dk fits the device; raises the kernel's opt-in limit
 * (call before any graph capture) */
int cu_gdn_init(int dk);
/* 1 when the tensor-core (phased) chunked prefill serves this dk (a multiple of 16, 16..128; dv and the
 * device's shared memory: cu_gdn_chunk_init) */
int cu_gdn_tc_init(int dk);
/* 1 when the phased tensor-core prefill (deltanet_chunk.cu) serves dk, dv (multiples of 16, dk <= 128, dv <=
 * 256) and fits the device; raises its kernels' shared-memory limits (before any graph capture) */
int cu_gdn_chunk_init(int dk, int dv);
/* chunks a batch of up to T rows in up to NE entries can span (an entry of n rows: at most n / 64 + 2) */
int cu_gdn_chunk_cap(int T, int NE);
/* bytes of cu_gdn_args.chunk_scr for cap chunks and up to T rows (per chunk and value head: W, e^g Q,
 * e^(g_L - g) K [64][dk], U [64][dv], the decayed Q K^T [64][64]; then the chunk table) */
size_t cu_gdn_chunk_bytes(int cap, int T, int Hv, int dk, int dv);
/* for measurements (cuda_deltanet_prefill_speed): one part of the phased prefill of a layer whose conv, norms
 * and gates already ran (conv_out, bg filled) — parts 1: the chunk table and the parallel prep, 2: the
 * sequential pass (after a 1), 3: both; 0 when the scratch cannot hold the batch */
int cu_gdn_chunk_part(cu_ctx *c, const cu_gdn_args *a, int parts);
/* 1 when fast mode's chunked form (cu_gdn_args.chunk_fast) serves a's shapes (after cu_gdn_chunk_init) */
int cu_gdn_chunk_fast_serves(const cu_gdn_args *a);
/* fast mode's whole DeltaNet layer for a batch whose every entry takes the chunked form (no decode token, no
 * speculative window): the conv, norms and gates inside its prep from the pre-conv rows (no conv_out), the
 * window advance, the pass, the gated norm; 0 (nothing enqueued) where it does not serve: run cu_gdn_layer */
int cu_gdn_layer_fast(cu_ctx *c, const cu_gdn_args *a);
/* clusters of cl of the pass's blocks the device holds at once (cudaOccupancyMaxActiveClusters; printed by
 * cuda_deltanet_prefill_fast_speed) */
int cu_gdn_fast_max_clusters(int cl);
/* The tensor-core prefill kernels (DeltaNet and attention) split each f32 operand into TF32 hi + lo and run
 * three MMAs per product (3, the default: f32-accurate); 1: one TF32 rounding (CINFER_CUDA_TF32_PASSES=1, to
 * measure what the split costs: ~4e-4 per product, past the model parity bound; the fp16 attention then
 * takes one fp16 rounding) */
void cu_set_tf32_passes(int passes);
int cu_tf32_passes(void);

/* ---- gated attention (attention.cu) ---- */
/* The tensor-core prefill tiles split over keys (split.work != NULL, tc set; cu_attn_tc_split): an
 * entry with few rows behind a long context runs each (tile, key span) in its own block. A row of an
 * entry whose span is e_span[e] (0: not split) has pos / span + 1 spans: with one, its block writes o as
 * the unsplit kernel does (the same bits); with more, each span's block writes (m, l, acc) at
 * part + (row_poff[r] * Hq + h * ns + s) * (hd + 2), and a merge over mrows (combine_rowhead of the
 * decode splits) writes o. */
typedef struct cu_attn_split {
    const int *work;     /* [n_work][2]: first row of a tile (as in tiles), key span index */
    const int *e_span;   /* [NE] keys per span (a multiple of 32), 0: the entry is not split */
    const int *row_poff; /* [T] the row's first partial, in rows of Hq * (hd + 2) floats */
    const int *mrows;    /* [n_mrows] the rows with more than one span */
    float *part;         /* partials, f32 */
    int n_work, n_mrows;
} cu_attn_split;
typedef struct cu_attn_args {
    int T, Hq, Hkv, hd, rope_dim, n_blocks, full; /* full: this layer's index among full-attention layers */
    float *qkv;
    int ld; /* [T][ld] rows: per head q(hd) gate(hd), then k (Hkv*hd), then v (Hkv*hd) */
    const float *q_norm, *k_norm, *inv_freq;
    float *kpool, *vpool; /* [n_full][n_blocks][16][Hkv*hd] */
    float *o;             /* [T][Hq*hd] */
    /* NULL, or (CINFER_CUDA_PF_SPLIT; tensor-core tiles without key splits only) the out_proj GEMM's bf16
     * halves [2][Mb][Hq*hd] (lo at o_lo halves), written instead of o */
    uint16_t *o_xb;
    size_t o_lo;
    float *part;      /* split-softmax partials [T][Hq][nsplit][hd + 2] */
    int span, nsplit; /* positions per split, splits */
    const int *tiles; /* NULL: a block per (row, head[, span]); else prefill tiles: first rows of runs of up
                         to CU_ATTN_TILE rows of one entry (tc: cu_attn_tc_rows rows), [n_tiles], each
                         block sharing its K/V loads */
    int n_tiles;
    int tc; /* nonzero: the prefill tiles on the tensor cores (attention_tc.cu, flash-attention form, fp16 hi
               + lo operands); 0: the scalar tile kernel */
    float eps;
    cu_meta meta;
    /* multimodal rotary (a batch with image prompts), else NULL: rotary positions [T][3] (t, h, w); pair i
     * takes stream h when i % 3 == 1 and i < 3 * mrope_h, w when i % 3 == 2 and i < 3 * mrope_w, else t */
    const int *rope3;
    int mrope_h, mrope_w;
    /* NULL: q/k norm + RoPE + the KV write, the attention and the merge of the splits as three kernels. Else
     * [T][Hq] counters, zero between launches (the kernel sets them back), and the batch holds decode tokens
     * only (one row per entry, no tiles): one kernel does all three with the same bits
     * (CINFER_CUDA_ATTN_FUSED) */
    unsigned *dec_cnt;
    cu_attn_split split; /* zero: no key splits */
    /* NULL, or cu_attn_kv16_bytes(n_blocks, Hkv, hd) of device scratch: the tensor-core tiles' K and V split
     * into fp16 hi + lo once by a pre-pass over the blocks of the launch's entries (kv16_NE entries, at most
     * kv16_nb blocks each) instead of in every warp, fragments by ldmatrix; the same bits
     * (CINFER_CUDA_ATTN_KV16) */
    uint16_t *kv16;
    int kv16_NE, kv16_nb;
    /* nonzero (precision "fast"), with kv16 and cu_attn_fast_ok(hd): the tiles (key splits too) on Q, K, V
     * and P rounded to fp16 once, one MMA a product (attention_tc.cu's attn_ff_kernel; kv16 then holds
     * its images, which fit in cu_attn_kv16_bytes); the bits differ from the exact form's by ~1e-3 */
    int fast;
    /* 0: the decode rows (no tiles) by attn_kernel, a block per (q head, row, span of span positions). > 0
     * (CINFER_CUDA_ATTN_DEC, the default): by attn_dec_kernel, a block per (kv head, row, span) serving the
     * kv head's q heads together; a row at position pos splits into cu_attn_dec_span(pos, min(dec_nsmax,
     * nsplit)) spans (span: <= CU_ATTN_DEC_CH when every row's spans are one chunk, then one stage of shared
     * memory; the same bits either way), so with nsplit = cu_attn_dec_grid(maxpos, dec_nsmax) its bits depend
     * on its own position alone; partials [T][Hq][nsplit][hd + 4] (attn_kernel's: hd + 2), dec_cnt [T][Hkv]
     * used */
    int dec_nsmax;
    /* with dec_nsmax > 0, the class of a row follows its own position (CINFER_CUDA_ATTN_DEC_P): rows at
     * positions >= dec_p take attn_dec_kernel, the others attn_kernel (dec_p <= 0: every row the dec kernel).
     * dec_cls: the classes the batch holds, 1 rows below dec_p, 2 rows at or past it, 3 both (0: both), one
     * launch of each kernel a class, each kernel's blocks of the other class's rows returning at once (so a
     * graph captured with both stays right as rows cross dec_p). dec_span / dec_nsplit: the dec kernel's
     * span (stages) and grid (0: span / nsplit, which are then attn_kernel's); dec_part: its partials (NULL:
     * part; the two kernels' partials must not overlap when both run) */
    int dec_p, dec_cls, dec_span, dec_nsplit;
    float *dec_part;
    /* attn_dec_kernel's q heads a block (CINFER_CUDA_ATTN_DEC_HS): a divisor of Hq / Hkv splits each kv
     * head's group over Hq / Hkv / dec_hs blocks (more blocks when a row has few kv heads); < 0: the launch
     * picks the fewest heads a block whose grid stays within two blocks an SM; anything else (0): the whole
     * group. Every head's arithmetic is the same either way: the same bits */
    int dec_hs;
    /* diagnostics, normally NULL (CINFER_CUDA_ATTN_STAMPS): [0] a counter, then per (row, kv head group)
     * merge of the fused dec kernel up to CU_ATTN_STAMP_CAP records of CU_ATTN_STAMPS %globaltimer values of
     * the merging block's thread 0: entry, PDL wait done, norms done, chunks done, partials written, counter
     * passed, (m, l) loaded, weights done, merge done */
    unsigned long long *dec_stamps;
    /* measurements only (wrong outputs), 0 otherwise: attn_dec_kernel's fused form leaves out 1 the merge, 2
     * the q / k norm + RoPE, 4 the arithmetic of the chunks, 8 the partials' fence and counter */
    int dec_diag;
} cu_attn_args;
/* attn_dec_kernel's positions per span of a row at position pos: the least CU_ATTN_DEC_CH * 2^k giving at
 * most nsmax spans; *ns the spans */
#define CU_ATTN_DEC_CH    32
#define CU_ATTN_STAMPS    9
#define CU_ATTN_STAMP_CAP (1 << 16)
static inline int cu_attn_dec_span(int pos, int nsmax, int *ns) {
    int n = pos + 1, s = CU_ATTN_DEC_CH;
    while ((n + s - 1) / s > nsmax) s *= 2;
    *ns = (n + s - 1) / s;
    return s;
}
/* attn_kernel's positions per split of a row when the dec kernel is on (dec_nsmax > 0: its rows below
 * dec_p): the least 64 * 2^k giving at most CU_ATTN_ROW_NS splits, from the row's own position (what the
 * split of one 16-head row always was), so its bits never depend on its batch; *ns the splits */
#define CU_ATTN_ROW_NS 64
static inline int cu_attn_row_span(int pos, int *ns) {
    int s = 64;
    while ((pos + s) / s > CU_ATTN_ROW_NS) s *= 2;
    *ns = (pos + s) / s;
    return s;
}
/* splits to launch for attn_kernel's rows up to maxpos then: a multiple of 8 within CU_ATTN_ROW_NS */
static inline int cu_attn_row_grid(int maxpos) {
    int ns, r;
    cu_attn_row_span(maxpos, &ns);
    r = ns > 1 ? (ns + 7) & ~7 : 1;
    return r < CU_ATTN_ROW_NS ? r : CU_ATTN_ROW_NS;
}
/* splits to launch for rows up to maxpos: at least every row's spans, a multiple of 8 within nsmax (a decode
 * graph then serves many steps) */
static inline int cu_attn_dec_grid(int maxpos, int nsmax) {
    int n = (maxpos + CU_ATTN_DEC_CH) / CU_ATTN_DEC_CH, r;
    n = n < nsmax ? n : nsmax;
    r = (n + 7) & ~7;
    return r < nsmax ? r : nsmax;
}
#define CU_ATTN_TILE 16
void cu_attn_layer(cu_ctx *c, const cu_attn_args *a);
/* 1 when attn_dec_kernel serves this shape with up to nsmax spans a row on this device (its shared-memory
 * limit raised once, before any graph capture); 0: the decode rows stay on attn_kernel */
int cu_attn_dec_init(int Hq, int Hkv, int hd, int nsmax);
/* raises the tiled kernels' shared-memory limit (before any graph capture); 0 when hd does not fit */
int cu_attn_init(int hd);
/* 1 when the tensor-core prefill kernel serves this head dim (32, 64, 128, 256) and fits the device */
int cu_attn_tc_init(int hd);
/* rows of one entry per tile for the tensor-core prefill kernel: 128 query rows per block, as 128 / QH
 * positions of QH query heads sharing a KV head (QH: the largest power of two <= 8 dividing Hq / Hkv) */
int cu_attn_tc_rows(int Hq, int Hkv);
/* keys per span when an entry of n new rows reaching keys positions splits over keys (split), else 0:
 * only when its own (tile, head group) blocks fill less than half the device and keys >= 2 x min_span
 * (CU_ATTN_MIN_SPAN: a block's Q load and split cost about two key tiles); the spans then fill about one
 * wave. A function of (n, keys) and the model alone, so an entry's bits never depend on the other entries
 * of its launch. *ns: spans of its last row. */
int cu_attn_tc_split(int Hq, int Hkv, int hd, int n, int keys, int min_span, int *ns);
#define CU_ATTN_MIN_SPAN 256
/* 1 when the tiles' split-once form (cu_attn_args.kv16) serves hd (after cu_attn_tc_init); its scratch */
int cu_attn_kv16_ok(int hd);
size_t cu_attn_kv16_bytes(int n_blocks, int Hkv, int hd);
/* 1 when the fast form (cu_attn_args.fast) serves hd (after cu_attn_tc_init) */
int cu_attn_fast_ok(int hd);
/* Largest supported head dim (hd must be a multiple of 32 up to this) */
#define CU_ATTN_MAX_HD 512

/* ---- MoE (moe.cu) ---- */
/* per row: softmax over E logits, top-k (ties to the lower index), renormalised when norm; idx/w [T][k] */
void cu_moe_route(cu_ctx *c, const float *d_logits, int *d_idx, float *d_w, int T, int E, int k, int norm);
/* cu_moe_route's values (the same softmax and selection, bit for bit), a warp per row with the probabilities
 * in registers (E <= 1024, k <= 32); sorted: each row's choices then in ascending expert order, as
 * cu_moe_sort_slots leaves them (the weights' renormalisation still sums in selection order) */
void cu_moe_route2(cu_ctx *c, const float *d_logits, int *d_idx, float *d_w, int T, int E, int k, int norm,
                   int sorted);
/* xg[p] = x[src[p]] for p < n (rows of H) */
void cu_gather_rows(cu_ctx *c, float *d_xg, const float *d_x, const int *d_src, int n, int H);
/* out[r] = Σ_j w[r][j] * y[pos[r][j]] over j in the given order (pos: slot positions, [T][k]); then
 * if sh: out[r] += sigmoid(shg[r]) * sh[r] */
void cu_moe_combine(cu_ctx *c, float *d_out, const float *d_y, const int *d_pos, const float *d_w, int T,
                    int k, int H, const float *d_sh, const float *d_shg);
/* grp [E + 1 + S] = off | perm: the S slots of idx grouped by expert (E <= 1024), for cu_moe_gemm* */
void cu_moe_group(cu_ctx *c, const int *d_idx, int S, int E, int *d_grp);
/* cu_moe_group then cu_moe_tiles (tiles of tile_rows slots; tile_off [E + 1]) in launches over many blocks
 * (CINFER_CUDA_MOE_PF 64); d_scr: [E] ints of scratch */
void cu_moe_group_tiles(cu_ctx *c, const int *d_idx, int S, int E, int *d_grp, int *d_tile_off, int tile_rows,
                        int *d_scr);
/* decode form without the host: slot (r, j) reads row r; order of accumulation is by ascending expert id */
void cu_moe_sort_slots(cu_ctx *c, int *d_idx, float *d_w, int T, int k);

/* The fused decode MoE block (moe_fused.cu, CINFER_CUDA_MOE_FUSED=1): router, gate_up + SwiGLU, down +
 * combine in three launches, each row in blocks of its own (a row's result does not depend on T). The values
 * are those of the launches it replaces: the router GEMV of cu_gemm(precise), cu_moe_route,
 * cu_moe_sort_slots, cu_gemv_indexed, cu_swiglu and cu_moe_combine. */
typedef struct cu_moe_args {
    int T, H, E, k, Im, Is, norm; /* rows, hidden, experts, top-k, expert and shared widths, renormalise */
    const float *x;               /* [T][H] normed rows, f32 */
    const uint16_t *router;       /* [E][H] bf16 */
    const uint16_t *e_gu;         /* [E][2Im][H] bf16: gate rows then up rows */
    const uint16_t *e_down;       /* [E][H][Im] bf16 */
    const uint16_t *sh_gu, *sh_down, *sh_gw; /* [2Is][H], [H][Is], [1][H] bf16; all NULL: no shared expert */
    float *logits;                           /* [T][E] router logits (scratch) */
    int *idx;                                /* [T][k] chosen experts, ascending */
    float *w;                                /* [T][k] their weights, same order */
    unsigned *count;     /* [T] zeroed once at allocation; every launch leaves it zeroed */
    float *act;          /* [T][k Im + Is]: SwiGLU outputs of the k experts, then the shared one */
    float *shg;          /* [T] the shared expert's gate logit (before the sigmoid) */
    float *out;          /* [T][H] Σ_j w_j expert_j(x) + sigmoid(shg) shared(x) */
    float *resid;        /* NULL, or [T][H]: resid += that sum (the residual add) and out untouched */
    const float *norm_w; /* NULL, or [H] (1 + weight): x is the raw residual and the router takes its RMSNorm
                            (add_rmsnorm's arithmetic) into xn itself (H <= 4096: cu_moe_fused_norm_ok) */
    float eps;
    float *xn;   /* [T][H] the normed rows when norm_w (the gate_up kernel reads them) */
    int variant; /* 4: programmatic dependent launch (each kernel lets the next be scheduled, then waits for
                    the one before; the same bits). CINFER_CUDA_MOE_VARIANT, default 122892 (8: the caller's
                    norm_w; 8192: the router requests the shared expert's weights into L2 before its wait;
                    16384: the router writes only logits, the gate_up and down kernels select from them
                    themselves and gate_up writes idx / w; 32768: the selection, wherever it is made, in
                    fewer dependent steps, E <= 256; 65536 with 16384: gate_up releases the down kernel
                    (griddep_launch) after its selection instead of right after its wait) */
} cu_moe_args;
/* 1 when the fused kernels serve this shape: H, Im, Is multiples of 8, Im <= 1024, E <= 1024, k <= 32 */
int cu_moe_fused_supported(int H, int E, int k, int Im, int Is);
int cu_moe_fused_norm_ok(int H);
void cu_moe_fused_route(cu_ctx *c, const cu_moe_args *a); /* logits, idx, w (16384: logits only) */
void cu_moe_fused_gate_up(cu_ctx *c,
                          const cu_moe_args *a);         /* act, shg (reads idx; 16384: logits -> idx, w) */
void cu_moe_fused_down(cu_ctx *c, const cu_moe_args *a); /* out (reads idx, w, act, shg; 16384: logits) */
void cu_moe_fused(cu_ctx *c, const cu_moe_args *a);      /* the three in order */

/* Prefill experts without the host (moe_gemm.cu, CINFER_CUDA_MOE_PREFILL=grouped): grouped GEMMs on the
 * tensor cores (bf16 weights, activations split into bf16 hi + lo, f32 accumulation) over every expert in one
 * launch, from cu_moe_group's grp = off [E + 1] | perm [S]. tile_off [E + 1]: cu_moe_tiles' count of 64-slot
 * tiles before each expert. Slot s reads x row s / div and writes y row s. K % 8 == 0. d_xs (required):
 * scratch for x split once into bf16 hi / lo rows, 2 x (S / div) x K bf16. */
void cu_moe_tiles(cu_ctx *c, const int *d_grp, int E, int *d_tile_off);
/* y[s][n] = silu(x_s · gate_e[n]) * (x_s · up_e[n]) for n < I; w_gu [E][2I][K] (gate rows then up rows) */
void cu_moe_gemm_swiglu(cu_ctx *c, float *d_y, const float *d_x, int div, const uint16_t *d_w_gu,
                        const int *d_grp, const int *d_tile_off, int S, int E, int I, int K, uint16_t *d_xs);
/* y[s][n] = x_s · w_e[n] for n < N; w [E][N][K] */
void cu_moe_gemm(cu_ctx *c, float *d_y, const float *d_x, int div, const uint16_t *d_w, const int *d_grp,
                 const int *d_tile_off, int S, int E, int N, int K, uint16_t *d_xs);
/* cu_moe_gemm_swiglu with y written split, as the next GEMM reads it: bf16 hi rows [S][I] at d_ys, lo rows
 * [S][I] at d_ys + S I (what cu_moe_gemm's own split of an f32 y would make, bit for bit) */
void cu_moe_gemm_swiglu_split(cu_ctx *c, uint16_t *d_ys, const float *d_x, int div, const uint16_t *d_w_gu,
                              const int *d_grp, const int *d_tile_off, int S, int E, int I, int K,
                              uint16_t *d_xs);
/* cu_moe_gemm (div 1) on an x already split: d_xs2 = hi [S][K] then lo [S][K] */
void cu_moe_gemm_presplit(cu_ctx *c, float *d_y, const uint16_t *d_xs2, const uint16_t *d_w, const int *d_grp,
                          const int *d_tile_off, int S, int E, int N, int K);
/* A prefill chunk's router logits [T][E] = x [T][K] · w [E][K]^T on the tensor cores, x split into three bf16
 * parts (hi, lo, rest: x to ~2^-25, about f32's own rounding), bf16 w, f32 accumulation in a fixed K order: a
 * row's logits never depend on the other rows or on T. d_xs: scratch for 3 T K bf16. K % 8 == 0. */
void cu_moe_router(cu_ctx *c, float *d_logits, const float *d_x, const uint16_t *d_w, int T, int E, int K,
                   uint16_t *d_xs);
/* the forms behind CINFER_CUDA_MOE_PF (a bitmask, forward_cuda.c reads it): 4 = the grouped GEMMs in tiles of
 * 256 weight rows x 64 of K (the same bits as 128 x 32); the other bits are the caller's */
void cu_set_moe_pf(int mask);
int cu_moe_pf(void);
/* the kernels' shared-memory limits, set once before any graph capture */
void cu_moe_gemm_prepare(void);

/* ---- sampling (sample.cu) ---- */
#define CU_SAMPLE_MAX_K 64
typedef struct cu_sample_row {
    double u;        /* the host generator's uniform draw in [0, 1) (unused when greedy) */
    float inv_t;     /* 1 / temperature as the CPU sampler computes it (1.0f / T); 0: greedy */
    int top_k;       /* 2..CU_SAMPLE_MAX_K when sampling (1 is greedy) */
    int logprob;     /* nonzero: lps[row] = the chosen token's raw log_softmax */
    float top_p;     /* in (0, 1): the smallest best-first prefix of the top_k with that mass; else off */
    float min_p;     /* > 0: keep p >= min_p * p_max; else off */
    float rep;       /* the repetition penalty of pen entries with CU_PEN_REP */
    int pen0, n_pen; /* this row's entries of the pen list (cu_sample's pen) */
} cu_sample_row;
/* One adjusted token of a row, applied to its logit (NaN read as -inf) in the CPU sampler's order
 * (sampler.c load_adjusted): + bias, then the repetition penalty (v > 0: v / rep, else v * rep), then - sub
 * (frequency * count + presence, computed by the host in f32 as the CPU does) */
#define CU_PEN_BIAS 1
#define CU_PEN_REP  2
#define CU_PEN_SUB  4
typedef struct cu_sample_pen {
    int token, flags;
    float bias, sub;
} cu_sample_pen;
/* rows cu_sample takes in one launch (its partials' bound; more are launched in groups) */
#define CU_SAMPLE_GROUP 256
/* slices of a row at most (the argmax's); vocabularies cu_sample takes at most (a slice's bitmap of adjusted
 * tokens fits its shared memory) */
#define CU_SAMPLE_MAXNB 64
#define CU_SAMPLE_MAX_V 524288
/* cu_sample's scratch: the slices' candidates and their (max, sum) for logprobs */
#define CU_SAMPLE_PART                                                                                       \
    ((size_t)CU_SAMPLE_GROUP * CU_SAMPLE_MAXNB * CU_SAMPLE_MAX_K * 8 +                                       \
     (size_t)CU_SAMPLE_GROUP * CU_SAMPLE_MAXNB * 16)
/* ids[r] (and lps[r] when asked) for the n logits rows [n][V], as the CPU sampler's chain: the row's pen
 * entries (distinct tokens) adjusted as load_adjusted does, then the top_k best (logit desc, id asc; NaN as
 * -inf) by many blocks a row, then top_p, min_p and the draw at u walking the candidates best first; the
 * logprob of the raw logits (never written). d_pen: the rows' entries (NULL when none has any); d_part:
 * CU_SAMPLE_PART bytes; d_cnt: [CU_SAMPLE_GROUP] counters, zero before (set back by the kernel). -1 (nothing
 * launched) when V is not in 1..CU_SAMPLE_MAX_V */
int cu_sample(cu_ctx *c, const float *d_logits, int V, const cu_sample_row *d_rows,
              const cu_sample_pen *d_pen, int n, int *d_ids, float *d_lps, void *d_part, unsigned *d_cnt);
/* Greedy ids of n rows of V logits (the argmax, ties to the lowest id, NaN never the max: cu_sample's greedy
 * ids) by many blocks a row. d_part: CU_ARGMAX_PART(n) bytes of scratch; d_cnt: [n] counters, zero before
 * (device memory zeroed once; the kernel sets them back) */
#define CU_ARGMAX_MAXNB   64
#define CU_ARGMAX_PART(n) ((size_t)(n)*CU_ARGMAX_MAXNB * 8)
void cu_argmax(cu_ctx *c, const float *d_logits, int V, int n, int *d_ids, void *d_part, unsigned *d_cnt);

#ifdef __cplusplus
}
#endif

#endif

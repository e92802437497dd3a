/* vision_ops.h — launchers of the vision tower's kernels (vision.cu), used by model/vision_cuda.c. Same
 * conventions as cuda_ops.h: they enqueue on the context's stream, d_* is device memory, f32 row-major. */
#ifndef CI_VISION_OPS_H
#define CI_VISION_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "backend/cuda/cuda_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One patch row's learned-position taps (bilinear over the grid_side^2 table, already in merge-block order)
 * and its full-resolution (y, x) for the 2-D rotary. */
typedef struct cu_vis_tap {
    int32_t idx[4]; /* table rows of the taps 00, 01, 10, 11 */
    float w[4];     /* their weights */
    int32_t y, x;
} cu_vis_tap;

enum { CU_VIS_ACT_NONE = 0, CU_VIS_ACT_GELU_TANH = 1, CU_VIS_ACT_GELU_ERF = 2 };

/* y[r] = LayerNorm(x[r]) * w + b (biased variance, eps), rows of D */
void cu_vis_layernorm(cu_ctx *c, float *d_y, const float *d_x, const float *d_w, const float *d_b, int rows,
                      int D, float eps);
/* y = act(y + bias) over rows of cols; then res += y when d_res */
void cu_vis_bias_act(cu_ctx *c, float *d_y, const float *d_bias, int rows, int cols, int act, float *d_res);
/* x[r] += ((p00 w00 + p01 w01) + p10 w10) + p11 w11 with p the taps' rows of the table pos [*, D] */
void cu_vis_pos_add(cu_ctx *c, float *d_x, const float *d_pos, const cu_vis_tap *d_taps, int rows, int D);
/* 2-D rotary on the q and k heads of qkv rows [rows][3D] (q | k | v), head_dim hd, inv_freq [hd/4]:
 * angle of pair j < hd/4 is y * inv_freq[j], of pair hd/4 + j is x * inv_freq[j] (rotate_half pairing) */
void cu_vis_rope(cu_ctx *c, float *d_qkv, const cu_vis_tap *d_taps, const float *d_inv_freq, int rows, int D,
                 int heads, int hd);
/* Non-causal softmax attention within each frame: frames [n_frames][2] = (first row, rows); qkv rows
 * [*][3D]; o rows [*][D] (heads side by side). max_rows: the largest frame. */
int cu_vis_attn_supported(int hd);
void cu_vis_attn(cu_ctx *c, float *d_o, const float *d_qkv, const int *d_frames, int n_frames, int max_rows,
                 int D, int heads, int hd);

/* The same on the tensor cores (bf16 hi + lo operands, f32 accumulation): head_dim 16, 32, 64, 72, 80, 96. */
int cu_vis_attn_tc_supported(int hd);
void cu_vis_attn_tc(cu_ctx *c, float *d_o, const float *d_qkv, const int *d_frames, int n_frames,
                    int max_rows, int D, int heads, int hd);

#ifdef __cplusplus
}
#endif

#endif

/* vision.cu — the vision tower's own kernels (the GEMMs go through cu_gemm): LayerNorm with bias, bias +
 * activation (+ residual), the bilinear learned positions, the 2-D rotary, and non-causal attention inside
 * each frame. Element-wise ops follow model/vision.c's rounding order; the attention uses an online
 * softmax (one pass over the keys), so it differs from the CPU's exact softmax by f32 rounding only. */
#include "backend/cuda/common.cuh"
#include "backend/cuda/vision_ops.h"

/* one block per row: mean, then the variance around it (two passes over the row, as nn.LayerNorm) */
__global__ void vis_layernorm_kernel(float *y, const float *x, const float *w, const float *b, int D,
                                     float eps) {
    __shared__ float sh[32];
    size_t r = blockIdx.x;
    const float *xr = x + r * D;
    float s = 0.0f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) s += xr[i];
    float mean = block_sum(s, sh) / (float)D;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float t = xr[i] - mean;
        ss += t * t;
    }
    float var = block_sum(ss, sh) / (float)D;
    float rstd = 1.0f / sqrtf(var + eps);
    for (int i = threadIdx.x; i < D; i += blockDim.x) y[r * D + i] = (xr[i] - mean) * rstd * w[i] + b[i];
}

extern "C" void cu_vis_layernorm(cu_ctx *c, float *y, const float *x, const float *w, const float *b,
                                 int rows, int D, float eps) {
    if (rows > 0) vis_layernorm_kernel<<<rows, 128, 0, c->stream>>>(y, x, w, b, D, eps);
}

__device__ __forceinline__ float vis_gelu_tanh(float x) {
    const float kBeta = 0.7978845608028654f, kKappa = 0.044715f;
    float inner = kBeta * (x + kKappa * x * x * x);
    return 0.5f * x * (1.0f + tanhf(inner));
}

__device__ __forceinline__ float vis_gelu_erf(float x) {
    return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
}

__global__ void vis_bias_act_kernel(float *y, const float *bias, size_t n, int cols, int act, float *res) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float t = y[i] + bias[i % cols];
        if (act == CU_VIS_ACT_GELU_TANH)
            t = vis_gelu_tanh(t);
        else if (act == CU_VIS_ACT_GELU_ERF)
            t = vis_gelu_erf(t);
        y[i] = t;
        if (res) res[i] += t;
    }
}

extern "C" void cu_vis_bias_act(cu_ctx *c, float *y, const float *bias, int rows, int cols, int act,
                                float *res) {
    size_t n = (size_t)rows * cols;
    if (!n) return;
    unsigned g = cdiv(n, 256);
    if (g > 65535u * 16u) g = 65535u * 16u;
    vis_bias_act_kernel<<<g, 256, 0, c->stream>>>(y, bias, n, cols, act, res);
}

/* products rounded, then added in the CPU's order (no contraction into fma) */
__global__ void vis_pos_add_kernel(float *x, const float *pos, const cu_vis_tap *taps, int D) {
    size_t r = blockIdx.x;
    const cu_vis_tap t = taps[r];
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float a = __fmul_rn(pos[(size_t)t.idx[0] * D + d], t.w[0]);
        float b = __fmul_rn(pos[(size_t)t.idx[1] * D + d], t.w[1]);
        float c = __fmul_rn(pos[(size_t)t.idx[2] * D + d], t.w[2]);
        float e = __fmul_rn(pos[(size_t)t.idx[3] * D + d], t.w[3]);
        float pe = __fadd_rn(__fadd_rn(__fadd_rn(a, b), c), e);
        x[r * D + d] = __fadd_rn(x[r * D + d], pe);
    }
}

extern "C" void cu_vis_pos_add(cu_ctx *c, float *x, const float *pos, const cu_vis_tap *taps, int rows,
                               int D) {
    if (rows > 0) vis_pos_add_kernel<<<rows, 128, 0, c->stream>>>(x, pos, taps, D);
}

/* one thread per rotated pair (row, q|k, head, j < hd/2) */
__global__ void vis_rope_kernel(float *qkv, const cu_vis_tap *taps, const float *inv, size_t n, int D,
                                int heads, int hd) {
    int half = hd / 2, q = hd / 4;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int j = (int)(i % half);
        size_t rest = i / half;
        int h = (int)(rest % (2 * heads)); /* q heads, then k heads */
        size_t r = rest / (2 * heads);
        float ang = j < q ? __fmul_rn((float)taps[r].y, inv[j]) : __fmul_rn((float)taps[r].x, inv[j - q]);
        float cs = cosf(ang), sn = sinf(ang);
        float *x = qkv + r * 3 * D + (size_t)(h / heads) * D + (size_t)(h % heads) * hd;
        float a = x[j], b = x[j + half];
        x[j] = __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn));
        x[j + half] = __fadd_rn(__fmul_rn(b, cs), __fmul_rn(a, sn));
    }
}

extern "C" void cu_vis_rope(cu_ctx *c, float *qkv, const cu_vis_tap *taps, const float *inv, int rows, int D,
                            int heads, int hd) {
    size_t n = (size_t)rows * 2 * heads * (hd / 2);
    if (!n) return;
    unsigned g = cdiv(n, 256);
    if (g > 65535u * 16u) g = 65535u * 16u;
    vis_rope_kernel<<<g, 256, 0, c->stream>>>(qkv, taps, inv, n, D, heads, hd);
}

/* A block of VA_Q query rows of one (frame, head); each thread keeps its row's q and output accumulator in
 * registers and runs an online softmax over the frame's keys, which pass through shared memory VA_K at a
 * time (every thread reads the same key: broadcasts, no bank conflicts). */
#define VA_Q 64
#define VA_K 32

template <int HD>
__global__ void __launch_bounds__(VA_Q)
    vis_attn_kernel(float *o, const float *qkv, const int *frames, int D, float scale) {
    __shared__ float Ks[VA_K][HD], Vs[VA_K][HD];
    int f = blockIdx.z, h = blockIdx.y;
    int start = frames[2 * f], n = frames[2 * f + 1];
    int q0 = blockIdx.x * VA_Q;
    if (q0 >= n) return; /* the whole block: frames shorter than the largest */
    int qi = q0 + threadIdx.x;
    bool valid = qi < n;
    float q[HD], acc[HD];
    const float *qr = qkv + (size_t)(start + (valid ? qi : q0)) * 3 * D + (size_t)h * HD;
#pragma unroll
    for (int d = 0; d < HD; d++) q[d] = qr[d], acc[d] = 0.0f;
    float mx = -INFINITY, l = 0.0f;
    for (int k0 = 0; k0 < n; k0 += VA_K) {
        int nk = n - k0 < VA_K ? n - k0 : VA_K;
        __syncthreads();
        for (int i = threadIdx.x; i < nk * HD; i += VA_Q) {
            int j = i / HD, d = i % HD;
            const float *kr = qkv + (size_t)(start + k0 + j) * 3 * D + (size_t)h * HD;
            Ks[j][d] = kr[D + d];
            Vs[j][d] = kr[2 * D + d];
        }
        __syncthreads();
        for (int j = 0; j < nk; j++) {
            float s = 0.0f;
#pragma unroll
            for (int d = 0; d < HD; d++) s = fmaf(q[d], Ks[j][d], s);
            s *= scale;
            if (s > mx) {
                float cr = expf(mx - s);
                l *= cr;
#pragma unroll
                for (int d = 0; d < HD; d++) acc[d] *= cr;
                mx = s;
            }
            float p = expf(s - mx);
            l += p;
#pragma unroll
            for (int d = 0; d < HD; d++) acc[d] = fmaf(p, Vs[j][d], acc[d]);
        }
    }
    if (!valid) return;
    float inv = 1.0f / l;
    float *orow = o + (size_t)(start + qi) * D + (size_t)h * HD;
#pragma unroll
    for (int d = 0; d < HD; d++) orow[d] = acc[d] * inv;
}

extern "C" int cu_vis_attn_supported(int hd) {
    return hd == 16 || hd == 32 || hd == 64 || hd == 72 || hd == 80 || hd == 96 || hd == 128;
}

extern "C" void cu_vis_attn(cu_ctx *c, float *o, const float *qkv, const int *frames, int n_frames,
                            int max_rows, int D, int heads, int hd) {
    if (n_frames < 1 || max_rows < 1) return;
    dim3 grid(cdiv((size_t)max_rows, VA_Q), (unsigned)heads, (unsigned)n_frames);
    float scale = 1.0f / sqrtf((float)hd);
    switch (hd) {
    case 16:
        vis_attn_kernel<16><<<grid, VA_Q, 0, c->stream>>>(o, qkv, frames, D, scale);
        break;
    case 32:
        vis_attn_kernel<32><<<grid, VA_Q, 0, c->stream>>>(o, qkv, frames, D, scale);
        break;
    case 64:
        vis_attn_kernel<64><<<grid, VA_Q, 0, c->stream>>>(o, qkv, frames, D, scale);
        break;
    case 72:
        vis_attn_kernel<72><<<grid, VA_Q, 0, c->stream>>>(o, qkv, frames, D, scale);
        break;
    case 80:
        vis_attn_kernel<80><<<grid, VA_Q, 0, c->stream>>>(o, qkv, frames, D, scale);
        break;
    case 96:
        vis_attn_kernel<96><<<grid, VA_Q, 0, c->stream>>>(o, qkv, frames, D, scale);
        break;
    case 128:
        vis_attn_kernel<128><<<grid, VA_Q, 0, c->stream>>>(o, qkv, frames, D, scale);
        break;
    default:
        break; /* refused by the caller (cu_vis_attn_supported) */
    }
}

/* vision.cu — the vision tower's own kernels (the GEMMs go through cu_gemm): LayerNorm with bias, bias +
 * activation (+ residual), the bilinear learned positions, the 2-D rotary, and non-causal attention inside
 * each frame. Element-wise ops follow model/vision.c's rounding order; the attention uses an online
 * softmax (one pass over the keys), so it differs from the CPU's exact softmax by f32 rounding only. */
#include <cuda_bf16.h>
#include <mma.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/vision_ops.h"

using namespace nvcuda;

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

/* The same attention on the tensor cores (CINFER_CUDA_VIS_ATTN=tc; within the bound, but on the H200 the 27B
 * tower at 2048^2 took 2.17 s with it against 1.88 s with the scalar kernel: the output rows' round trip
 * through shared memory every 16 keys and the one-lane-per-row softmax cost more than the MMAs save): a block
 * of VT_Q = 64 query rows of one (frame, head), 4 warps of 16 rows; keys VT_K = 16 at a time. Every operand
 * is split into bf16 hi + lo and each product taken as hi*hi + hi*lo + lo*hi with f32 accumulation (about
 * 2^-16 relative, like cu_gemm's two passes), for S = q k^T and for O += P v; the online softmax runs in f32
 * per row (one lane per row), the output rows live in shared memory (rescaled there each key tile). head_dim
 * is padded with zeros to HDP, a multiple of 16. */
#define VT_Q 64
#define VT_K 16

__device__ __forceinline__ void split_bf16(float x, __nv_bfloat16 *hi, __nv_bfloat16 *lo) {
    __nv_bfloat16 h = __float2bfloat16(x);
    *hi = h;
    *lo = __float2bfloat16(x - __bfloat162float(h));
}

template <int HD, int HDP>
__global__ void __launch_bounds__(128)
    vis_attn_tc_kernel(float *o, const float *qkv, const int *frames, int D, float scale) {
    /* Os first holds q as bf16 hi | lo (the same bytes), then the output rows */
    __shared__ __align__(32) float Os[VT_Q][HDP];
    __shared__ __align__(32) __nv_bfloat16 Kh[VT_K][HDP], Kl[VT_K][HDP], Vh[VT_K][HDP], Vl[VT_K][HDP];
    __shared__ __align__(32) float Ss[VT_Q][VT_K];
    __shared__ __align__(32) __nv_bfloat16 Ph[VT_Q][VT_K], Pl[VT_Q][VT_K];
    __shared__ float Ms[VT_Q], Ls[VT_Q], Cs[VT_Q];
    int f = blockIdx.z, h = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    int start = frames[2 * f], n = frames[2 * f + 1], q0 = blockIdx.x * VT_Q;
    if (q0 >= n) return;
    __nv_bfloat16 *Qh = reinterpret_cast<__nv_bfloat16 *>(&Os[0][0]), *Ql = Qh + VT_Q * HDP;
    for (int i = tid; i < VT_Q * HDP; i += 128) {
        int r = i / HDP, d = i % HDP;
        float x = 0.0f;
        if (q0 + r < n && d < HD) x = qkv[(size_t)(start + q0 + r) * 3 * D + (size_t)h * HD + d];
        split_bf16(x, &Qh[i], &Ql[i]);
    }
    __syncthreads();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> qh[HDP / 16], ql[HDP / 16];
#pragma unroll
    for (int k = 0; k < HDP / 16; k++) {
        wmma::load_matrix_sync(qh[k], Qh + (size_t)warp * 16 * HDP + k * 16, HDP);
        wmma::load_matrix_sync(ql[k], Ql + (size_t)warp * 16 * HDP + k * 16, HDP);
    }
    __syncthreads();
    for (int i = tid; i < VT_Q * HDP; i += 128) (&Os[0][0])[i] = 0.0f;
    if (tid < VT_Q) Ms[tid] = -INFINITY, Ls[tid] = 0.0f;
    for (int k0 = 0; k0 < n; k0 += VT_K) {
        __syncthreads(); /* the previous tile is consumed (and the initialisation above is visible) */
        for (int i = tid; i < VT_K * HDP; i += 128) {
            int j = i / HDP, d = i % HDP;
            float kx = 0.0f, vx = 0.0f;
            if (k0 + j < n && d < HD) {
                const float *row = qkv + (size_t)(start + k0 + j) * 3 * D + (size_t)h * HD;
                kx = row[D + d];
                vx = row[2 * D + d];
            }
            split_bf16(kx, &Kh[j][d], &Kl[j][d]);
            split_bf16(vx, &Vh[j][d], &Vl[j][d]);
        }
        __syncthreads();
        /* this warp's 16 rows of scores */
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> sc;
        wmma::fill_fragment(sc, 0.0f);
#pragma unroll
        for (int k = 0; k < HDP / 16; k++) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> kh, kl;
            wmma::load_matrix_sync(kh, &Kh[0][k * 16], HDP);
            wmma::load_matrix_sync(kl, &Kl[0][k * 16], HDP);
            wmma::mma_sync(sc, qh[k], kh, sc);
            wmma::mma_sync(sc, qh[k], kl, sc);
            wmma::mma_sync(sc, ql[k], kh, sc);
        }
        wmma::store_matrix_sync(&Ss[warp * 16][0], sc, VT_K, wmma::mem_row_major);
        __syncwarp();
        if (lane < 16) {
            int r = warp * 16 + lane;
            float mo = Ms[r], mx = mo, sv[VT_K];
#pragma unroll
            for (int j = 0; j < VT_K; j++) {
                sv[j] = k0 + j < n ? Ss[r][j] * scale : -INFINITY;
                mx = fmaxf(mx, sv[j]);
            }
            float corr = expf(mo - mx), sum = 0.0f;
#pragma unroll
            for (int j = 0; j < VT_K; j++) {
                float p = expf(sv[j] - mx);
                sum += p;
                split_bf16(p, &Ph[r][j], &Pl[r][j]);
            }
            Ms[r] = mx;
            Ls[r] = Ls[r] * corr + sum;
            Cs[r] = corr;
        }
        __syncwarp();
        for (int i = lane; i < 16 * HDP; i += 32) {
            int r = warp * 16 + i / HDP;
            Os[r][i % HDP] *= Cs[r];
        }
        __syncwarp();
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> ph, pl;
        wmma::load_matrix_sync(ph, &Ph[warp * 16][0], VT_K);
        wmma::load_matrix_sync(pl, &Pl[warp * 16][0], VT_K);
#pragma unroll
        for (int nt = 0; nt < HDP / 16; nt++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> vh, vl;
            wmma::load_matrix_sync(acc, &Os[warp * 16][nt * 16], HDP, wmma::mem_row_major);
            wmma::load_matrix_sync(vh, &Vh[0][nt * 16], HDP);
            wmma::load_matrix_sync(vl, &Vl[0][nt * 16], HDP);
            wmma::mma_sync(acc, ph, vh, acc);
            wmma::mma_sync(acc, ph, vl, acc);
            wmma::mma_sync(acc, pl, vh, acc);
            wmma::store_matrix_sync(&Os[warp * 16][nt * 16], acc, HDP, wmma::mem_row_major);
        }
        __syncwarp();
    }
    __syncthreads();
    for (int i = tid; i < VT_Q * HD; i += 128) {
        int r = i / HD, d = i % HD;
        if (q0 + r < n) o[(size_t)(start + q0 + r) * D + (size_t)h * HD + d] = Os[r][d] / Ls[r];
    }
}

extern "C" int cu_vis_attn_tc_supported(int hd) {
    return hd == 16 || hd == 32 || hd == 64 || hd == 72 || hd == 80 || hd == 96;
}

extern "C" void cu_vis_attn_tc(cu_ctx *c, float *o, const float *qkv, const int *frames, int n_frames,
                               int max_rows, int D, int heads, int hd) {
    if (n_frames < 1 || max_rows < 1) return;
    dim3 grid(cdiv((size_t)max_rows, VT_Q), (unsigned)heads, (unsigned)n_frames);
    float scale = 1.0f / sqrtf((float)hd);
    switch (hd) {
    case 16:
        vis_attn_tc_kernel<16, 16><<<grid, 128, 0, c->stream>>>(o, qkv, frames, D, scale);
        break;
    case 32:
        vis_attn_tc_kernel<32, 32><<<grid, 128, 0, c->stream>>>(o, qkv, frames, D, scale);
        break;
    case 64:
        vis_attn_tc_kernel<64, 64><<<grid, 128, 0, c->stream>>>(o, qkv, frames, D, scale);
        break;
    case 72:
        vis_attn_tc_kernel<72, 80><<<grid, 128, 0, c->stream>>>(o, qkv, frames, D, scale);
        break;
    case 80:
        vis_attn_tc_kernel<80, 80><<<grid, 128, 0, c->stream>>>(o, qkv, frames, D, scale);
        break;
    case 96:
        vis_attn_tc_kernel<96, 96><<<grid, 128, 0, c->stream>>>(o, qkv, frames, D, scale);
        break;
    default:
        break; /* refused by the caller (cu_vis_attn_tc_supported) */
    }
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

/* gemm.cu — y = x · w^T with bf16 weights: a GEMV for decode-sized M that streams each weight row once for
 * all rows of x (kept in f32), and cuBLAS bf16 x bf16 -> f32 on tensor cores for everything larger. */
#include <cublasLt.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "backend/cuda/common.cuh"

#define GEMV_WARPS 8
/* output rows per warp: each x value loaded into registers serves all of them (4 from 4 rows of x up, where
 * the loads of x would otherwise outweigh the weights') */
#define GEMV_NR(MR) ((MR) >= 4 ? 4 : 2)

/* One warp computes NR outputs for MR rows of x. Lane l reads 8 consecutive weights at k = 8l + 256i;
 * per-lane partial sums run in k order and are combined by the same butterfly for any MR, so an output's
 * value does not depend on how many rows share the launch. */
template <int MR, int NR>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_kernel(float *__restrict__ y, const float *__restrict__ x, const uint16_t *__restrict__ w, int N,
                int K) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int n0 = (blockIdx.x * GEMV_WARPS + warp) * NR;
    griddep_wait(); /* x is written by the kernel before (a no-op unless launched with PDL, cu_set_pdl) */
    if (n0 >= N) return;
    x += (size_t)blockIdx.y * MR * K; /* tiles of MR rows along grid.y */
    y += (size_t)blockIdx.y * MR * N;
    float acc[NR][MR];
#pragma unroll
    for (int r = 0; r < NR; r++)
#pragma unroll
        for (int m = 0; m < MR; m++) acc[r][m] = 0.0f;
    constexpr int UNR = MR <= 2 ? 4 : MR <= 3 ? 2 : 1; /* iterations in flight (registers allowing) */
    if ((K & 7) == 0) {
#pragma unroll(UNR)
        for (int k = lane * 8; k < K; k += 256) {
            float wf[NR][8];
#pragma unroll
            for (int r = 0; r < NR; r++) {
                int n = n0 + r < N ? n0 + r : N - 1;
                uint4 u = *reinterpret_cast<const uint4 *>(w + (size_t)n * K + k);
                const uint32_t p[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    wf[r][2 * q] = __uint_as_float(p[q] << 16);
                    wf[r][2 * q + 1] = __uint_as_float(p[q] & 0xffff0000u);
                }
            }
#pragma unroll
            for (int m = 0; m < MR; m++) {
                const float4 *xp = reinterpret_cast<const float4 *>(x + (size_t)m * K + k);
                float4 a = xp[0], b = xp[1];
                float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
                for (int r = 0; r < NR; r++)
#pragma unroll
                    for (int q = 0; q < 8; q++) acc[r][m] = fmaf(wf[r][q], xv[q], acc[r][m]);
            }
        }
    } else {
        for (int k = lane; k < K; k += 32) {
#pragma unroll
            for (int r = 0; r < NR; r++) {
                int n = n0 + r < N ? n0 + r : N - 1;
                float wv = bf16_f32(w[(size_t)n * K + k]);
#pragma unroll
                for (int m = 0; m < MR; m++) acc[r][m] = fmaf(wv, x[(size_t)m * K + k], acc[r][m]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < NR; r++)
#pragma unroll
        for (int m = 0; m < MR; m++) {
            float v = warp_sum(acc[r][m]);
            if (lane == 0 && n0 + r < N) y[(size_t)m * N + n0 + r] = v;
        }
}

static int g_pdl = 0;
extern "C" void cu_set_pdl(int level) {
    g_pdl = level >= 0 && level <= 2 ? level : 0;
}
extern "C" int cu_pdl_on(void) {
    return g_pdl;
}
/* 0 (CINFER_CUDA_PDL_BREAK=0, diagnostics only): PDL launches follow memcpys and event records too, as in
 * session 4, to reproduce what that did */
static int g_pdl_break = 1;
extern "C" void cu_set_pdl_break(int on) {
    g_pdl_break = on != 0;
}
extern "C" int cu_pdl_break_on(void) {
    return g_pdl_break;
}
static int g_pdl_mask = 31;
extern "C" void cu_set_pdl_mask(int mask) {
    g_pdl_mask = mask & 31;
}
extern "C" int cu_pdl_mask(void) {
    return g_pdl_mask;
}

template <int MR>
static void gemv_launch(cu_ctx *c, float *y, const float *x, const uint16_t *w, int tiles, int N, int K) {
    constexpr int NR = GEMV_NR(MR);
    dim3 grid(cdiv((size_t)N, GEMV_WARPS * NR), (unsigned)tiles);
    cu_launch_gemv(c, gemv_kernel<MR, NR>, grid, dim3(GEMV_WARPS * 32), y, x, w, N, K);
}

/* whole tiles of 8 rows in one launch, the remainder in a second */
static void gemv_rows(cu_ctx *c, float *y, const float *x, const uint16_t *w, int M, int N, int K) {
    int full = M / 8, rest = M % 8;
    if (full) gemv_launch<8>(c, y, x, w, full, N, K);
    float *yy = y + (size_t)full * 8 * N;
    const float *xx = x + (size_t)full * 8 * K;
    switch (rest) {
    case 1:
        gemv_launch<1>(c, yy, xx, w, 1, N, K);
        break;
    case 2:
        gemv_launch<2>(c, yy, xx, w, 1, N, K);
        break;
    case 3:
        gemv_launch<3>(c, yy, xx, w, 1, N, K);
        break;
    case 4:
        gemv_launch<4>(c, yy, xx, w, 1, N, K);
        break;
    case 5:
        gemv_launch<5>(c, yy, xx, w, 1, N, K);
        break;
    case 6:
        gemv_launch<6>(c, yy, xx, w, 1, N, K);
        break;
    case 7:
        gemv_launch<7>(c, yy, xx, w, 1, N, K);
        break;
    default:
        break;
    }
}

/* GEMV v2 (CINFER_CUDA_GEMV=v2). v1 gives each warp 2 whole weight rows, so a matrix of few rows is few
 * warps: the 4B's down / out projections (N = 2560) are 160 blocks on 132 SMs, where 28 SMs stream twice
 * what the others do (~60% of the copy rate at batch 1, while the wide gate_up / lm_head reach ~95%). Here a
 * block of 8 warps owns V2_R = 4 weight rows and splits K among its warps (256-element chunks c = warp,
 * warp + 8, ...: lane l reads 16 bytes of each row at 256c + 8l), so every matrix is N / 4 blocks: 640 for
 * N = 2560, about 5 per SM, each with 4 x 16 bytes per lane in flight per chunk. The warps' sums meet in
 * shared memory in warp order. Every sum's order (chunk order per lane, the butterfly, warp order) is fixed
 * and independent of MR, so a row's value does not depend on how many rows share the launch. K % 8 == 0
 * (16-byte rows); other K take v1. */
#define V2_WARPS 8
#define V2_R     4

/* weights are read once per step: stream them past L1 (ld.global.cs) */
__device__ __forceinline__ uint4 ld_stream(const uint16_t *p) {
    return __ldcs(reinterpret_cast<const uint4 *>(p));
}

/* batch 1 in <= 64 registers: 4 blocks (32 warps) per SM, so the 640 blocks of an N = 2560 matrix are
 * nearly one wave (528 at once); batch 2: 3 blocks */
template <int MR>
__global__ void __launch_bounds__(V2_WARPS * 32, MR == 1   ? 4
                                                 : MR == 2 ? 3
                                                           : 1)
    gemv2_kernel(float *__restrict__ y, const float *__restrict__ x, const uint16_t *__restrict__ w, int N,
                 int K) {
    __shared__ float red[V2_WARPS][V2_R * MR];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, n0 = blockIdx.x * V2_R;
    x += (size_t)blockIdx.y * MR * K; /* tiles of MR rows along grid.y */
    y += (size_t)blockIdx.y * MR * N;
    const uint16_t *wr[V2_R];
#pragma unroll
    for (int r = 0; r < V2_R; r++) wr[r] = w + (size_t)(n0 + r < N ? n0 + r : N - 1) * K;
    float acc[V2_R][MR];
#pragma unroll
    for (int r = 0; r < V2_R; r++)
#pragma unroll
        for (int m = 0; m < MR; m++) acc[r][m] = 0.0f;
    /* the weights depend on nothing before this kernel: the first chunk is requested before waiting for the
     * kernel that writes x (a no-op unless launched with programmatic dependent launch, cu_set_pdl); after
     * that each chunk's loads go out before the previous chunk's FMAs */
    int k = warp * 256 + lane * 8;
    uint4 u[V2_R];
    if (k < K)
#pragma unroll
        for (int r = 0; r < V2_R; r++) u[r] = ld_stream(wr[r] + k);
    griddep_wait();
    for (; k < K; k += V2_WARPS * 256) {
        uint4 cur[V2_R];
#pragma unroll
        for (int r = 0; r < V2_R; r++) cur[r] = u[r];
        if (k + V2_WARPS * 256 < K)
#pragma unroll
            for (int r = 0; r < V2_R; r++) u[r] = ld_stream(wr[r] + k + V2_WARPS * 256);
#pragma unroll
        for (int m = 0; m < MR; m++) {
            const float4 *xp = reinterpret_cast<const float4 *>(x + (size_t)m * K + k);
            float4 a = __ldg(xp), b = __ldg(xp + 1);
            float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
            for (int r = 0; r < V2_R; r++) {
                const uint32_t p[4] = {cur[r].x, cur[r].y, cur[r].z, cur[r].w};
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    acc[r][m] = fmaf(__uint_as_float(p[q] << 16), xv[2 * q], acc[r][m]);
                    acc[r][m] = fmaf(__uint_as_float(p[q] & 0xffff0000u), xv[2 * q + 1], acc[r][m]);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < V2_R; r++)
#pragma unroll
        for (int m = 0; m < MR; m++) {
            float v = warp_sum(acc[r][m]);
            if (lane == 0) red[warp][r * MR + m] = v;
        }
    __syncthreads();
    if (threadIdx.x < V2_R * MR) {
        int r = threadIdx.x / MR, m = threadIdx.x % MR;
        float v = 0.0f;
#pragma unroll
        for (int q = 0; q < V2_WARPS; q++) v += red[q][threadIdx.x];
        if (n0 + r < N) y[(size_t)m * N + n0 + r] = v;
    }
}

template <int MR>
static void gemv2_launch(cu_ctx *c, float *y, const float *x, const uint16_t *w, int tiles, int N, int K) {
    dim3 grid(cdiv((size_t)N, V2_R), (unsigned)tiles);
    cu_launch_gemv(c, gemv2_kernel<MR>, grid, dim3(V2_WARPS * 32), y, x, w, N, K);
}

/* as gemv_rows: whole tiles of 8 rows in one launch, the remainder in a second */
static void gemv2_rows(cu_ctx *c, float *y, const float *x, const uint16_t *w, int M, int N, int K) {
    int full = M / 8, rest = M % 8;
    if (full) gemv2_launch<8>(c, y, x, w, full, N, K);
    float *yy = y + (size_t)full * 8 * N;
    const float *xx = x + (size_t)full * 8 * K;
    switch (rest) {
    case 1:
        gemv2_launch<1>(c, yy, xx, w, 1, N, K);
        break;
    case 2:
        gemv2_launch<2>(c, yy, xx, w, 1, N, K);
        break;
    case 3:
        gemv2_launch<3>(c, yy, xx, w, 1, N, K);
        break;
    case 4:
        gemv2_launch<4>(c, yy, xx, w, 1, N, K);
        break;
    case 5:
        gemv2_launch<5>(c, yy, xx, w, 1, N, K);
        break;
    case 6:
        gemv2_launch<6>(c, yy, xx, w, 1, N, K);
        break;
    case 7:
        gemv2_launch<7>(c, yy, xx, w, 1, N, K);
        break;
    default:
        break;
    }
}

static int g_gemv_version = 1;
extern "C" void cu_set_gemv_version(int v) {
    g_gemv_version = v >= 2 && v <= 4 ? v : 1;
}
extern "C" int cu_gemv_version(void) {
    return g_gemv_version;
}

/* the f32-activation GEMV of cu_gemm. Version 2 takes v2 where the H200 run of 06:05 measured it faster:
 * one row of x and K >= 4096 (4B down 18.7 -> 14.6 us, 27B in/out/down 5-11% faster); with K of 2048-2560 the
 * 10 chunks of a row leave 6 of 8 warps one chunk (4B in_proj 18.1 -> 20.1 us, lm_head 284 -> 330 us), and
 * with 8 rows of x its 168 registers allow one block per SM (4B batch 8: 1142 -> 752 tok/s). Version 3: v2
 * wherever K % 8 == 0 (tests, measurements). */
static void gemv_any(cu_ctx *c, float *y, const float *x, const uint16_t *w, int M, int N, int K) {
    if (g_gemv_version == 4 && (K & 7) == 0) { /* v3 (gemv3.cu), no prologue or epilogue */
        cu_gemv_fused(c, y, x, w, M, N, K, NULL, 0.0f, CU_EPI_STORE);
        return;
    }
    int v2 = (K & 7) == 0 && (g_gemv_version == 3 || (g_gemv_version == 2 && M == 1 && K >= 4096));
    if (v2)
        gemv2_rows(c, y, x, w, M, N, K);
    else
        gemv_rows(c, y, x, w, M, N, K);
}

__global__ void f32_to_bf16_kernel(uint16_t *y, const float *x, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = f32_bf16(x[i]);
}

extern "C" void cu_f32_to_bf16(cu_ctx *c, uint16_t *y, const float *x, size_t n) {
    unsigned g = cdiv(n, 256);
    if (g > 65535u * 16u) g = 65535u * 16u;
    f32_to_bf16_kernel<<<g, 256, 0, c->stream>>>(y, x, n);
}

static int g_gemv_max = CU_GEMV_MAX_M;
extern "C" void cu_set_gemv_max(int m) {
    g_gemv_max = m > 0 ? m : CU_GEMV_MAX_M;
}
extern "C" int cu_gemv_max(void) {
    return g_gemv_max;
}

/* x = hi + lo with hi = bf16(x), lo = bf16(x - hi): n values each, hi at y, lo at y + lo (lo >= n: the rows
 * between, padding, are left as they are) */
__global__ void split_bf16_kernel(uint16_t *y, const float *x, size_t n, size_t lo) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        split_put(y, i, lo, x[i]);
}

/* ---- prefill producers writing the next GEMM's halves themselves (CINFER_CUDA_PF_SPLIT) ----
 * The two-pass path of a product of more than 64 rows splits its f32 input x into bf16 hi | lo (xb, lo
 * half at Mb K) before the two cuBLAS calls. Where x is a SwiGLU or an RMSNorm output made just for that
 * product, the kernel making it can write the halves instead: the f32 rows are never written or read back.
 * The values are the same expressions rounded the same way (products by __fmul_rn, so none is contracted
 * into the split's subtraction), so the halves, and the product, are the same bits. */

/* xb = split(silu(gate) * up) of gu [T][2I] rows: swiglu_kernel's expression per element; V4 (I % 4 == 0):
 * four elements a thread, 16-byte loads and 8-byte stores of each half */
template <bool V4> __global__ void swiglu_split_kernel(uint16_t *xb, const float *gu, int I, size_t lo) {
    int r = blockIdx.x;
    int i = (blockIdx.y * blockDim.x + threadIdx.x) * (V4 ? 4 : 1);
    if (i >= I) return;
    const float *g = gu + (size_t)r * 2 * I;
    if constexpr (V4) {
        float4 gv = *reinterpret_cast<const float4 *>(g + i),
               uv = *reinterpret_cast<const float4 *>(g + I + i);
        float v[4] = {__fmul_rn(dev_silu(gv.x), uv.x), __fmul_rn(dev_silu(gv.y), uv.y),
                      __fmul_rn(dev_silu(gv.z), uv.z), __fmul_rn(dev_silu(gv.w), uv.w)};
        uint16_t h[4], l[4];
#pragma unroll
        for (int q = 0; q < 4; q++) { /* split_put's halves */
            h[q] = f32_bf16(v[q]);
            l[q] = f32_bf16(__fsub_rn(v[q], bf16_f32(h[q])));
        }
        *reinterpret_cast<ushort4 *>(xb + (size_t)r * I + i) = make_ushort4(h[0], h[1], h[2], h[3]);
        if (lo) /* lo 0: one bf16 copy (precision fast's one-pass GEMM) */
            *reinterpret_cast<ushort4 *>(xb + lo + (size_t)r * I + i) = make_ushort4(l[0], l[1], l[2], l[3]);
    } else {
        split_put(xb, (size_t)r * I + i, lo, __fmul_rn(dev_silu(g[i]), g[I + i]));
    }
}

extern "C" void cu_swiglu_split(cu_ctx *c, uint16_t *xb, const float *gu, int T, int I, size_t lo) {
    if (T <= 0) return;
    if (I % 4 == 0 && lo % 4 == 0)
        swiglu_split_kernel<true>
            <<<dim3((unsigned)T, cdiv((size_t)I / 4, 256)), 256, 0, c->stream>>>(xb, gu, I, lo);
    else
        swiglu_split_kernel<false>
            <<<dim3((unsigned)T, cdiv((size_t)I, 256)), 256, 0, c->stream>>>(xb, gu, I, lo);
}

/* CINFER_CUDA_FAST_GU16 (precision fast; default on; "0": off): xb = bf16(silu(gate) * up) of gu16 [T][2I]
 * bf16, the gate_up product cuBLAS wrote in bf16 (cu_gemm_presplit_out16): half the bytes of the f32 product
 * written and read back, one more bf16 rounding (of gate and up) than an f32 SwiGLU input, as vLLM runs it;
 * eight elements a thread where I % 8 == 0 (16-byte loads of each half, one 16-byte store). H200, session
 * 10's third call, 4B 4096-token chunk in fast mode: 68.7 -> 67.0 ms (ffn act 3.0 -> 1.8 ms), with LT_TUNE
 * 65.7 ms, 64,405 tok/s = 55% of the GEMM rate; the default model's 1024 held-out tokens, every fast form on:
 * fast vs exact worst 4.8e-3, perplexity 7.5110 vs 7.5111 */
template <bool V8> __global__ void swiglu16_kernel(uint16_t *xb, const uint16_t *gu, int I) {
    int r = blockIdx.x;
    int i = (blockIdx.y * blockDim.x + threadIdx.x) * (V8 ? 8 : 1);
    if (i >= I) return;
    const uint16_t *g = gu + (size_t)r * 2 * I;
    if constexpr (V8) {
        uint4 gv = *reinterpret_cast<const uint4 *>(g + i), uv = *reinterpret_cast<const uint4 *>(g + I + i);
        const uint32_t gp[4] = {gv.x, gv.y, gv.z, gv.w}, up[4] = {uv.x, uv.y, uv.z, uv.w};
        uint32_t o[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            float a0 = __uint_as_float(gp[q] << 16), a1 = __uint_as_float(gp[q] & 0xffff0000u);
            float b0 = __uint_as_float(up[q] << 16), b1 = __uint_as_float(up[q] & 0xffff0000u);
            o[q] = (uint32_t)f32_bf16(__fmul_rn(dev_silu(a0), b0)) |
                   ((uint32_t)f32_bf16(__fmul_rn(dev_silu(a1), b1)) << 16);
        }
        *reinterpret_cast<uint4 *>(xb + (size_t)r * I + i) = make_uint4(o[0], o[1], o[2], o[3]);
    } else {
        xb[(size_t)r * I + i] = f32_bf16(__fmul_rn(dev_silu(bf16_f32(g[i])), bf16_f32(g[I + i])));
    }
}

extern "C" void cu_swiglu16(cu_ctx *c, uint16_t *xb, const uint16_t *gu, int T, int I) {
    if (T <= 0) return;
    if (I % 8 == 0)
        swiglu16_kernel<true><<<dim3((unsigned)T, cdiv((size_t)I / 8, 256)), 256, 0, c->stream>>>(xb, gu, I);
    else
        swiglu16_kernel<false><<<dim3((unsigned)T, cdiv((size_t)I, 256)), 256, 0, c->stream>>>(xb, gu, I);
}

/* x += add (when given); xb = split(rmsnorm(x) * w): add_rmsnorm_kernel's scale (row_add_rms_inv) and
 * expression (256 threads) */
__global__ void add_rmsnorm_split_kernel(float *x, const float *add, uint16_t *xb, const float *w, int H,
                                         float eps, size_t lo) {
    __shared__ float sh[32];
    int r = blockIdx.x;
    float *xr = x + (size_t)r * H;
    float inv = row_add_rms_inv(xr, add ? add + (size_t)r * H : NULL, H, eps, sh);
    for (int i = threadIdx.x; i < H; i += blockDim.x)
        split_put(xb, (size_t)r * H + i, lo, __fmul_rn(xr[i] * inv, w[i]));
}

extern "C" void cu_add_rmsnorm_split(cu_ctx *c, float *x, const float *add, uint16_t *xb, const float *w,
                                     int T, int H, float eps, size_t lo) {
    if (T > 0) add_rmsnorm_split_kernel<<<T, 256, 0, c->stream>>>(x, add, xb, w, H, eps, lo);
}

/* y[m] = t[m] + t[lo + m]: the hi and lo halves of a stacked product (lo: the lo half's offset) */
__global__ void add_halves_kernel(float *y, const float *t, size_t n, size_t lo) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = t[i] + t[lo + i];
}

extern "C" void cu_set_bf16_passes(cu_ctx *c, int p) {
    c->bf16_passes = p == 1 ? 1 : 2;
}
static int one_pass(const cu_ctx *c) {
    return c->bf16_passes == 1;
}

extern "C" void cu_set_gemm_scratch(cu_ctx *c, float *t, size_t floats) {
    c->ytmp = t;
    c->ytmp_floats = floats;
}
extern "C" void cu_set_gemm_xb_rows(cu_ctx *c, int rows) {
    c->xb_rows = rows;
}

/* CINFER_CUDA_GEMM_PAD (default 1): cuBLAS picks (and loads) a kernel for every new shape the first time it
 * meets it, on the host, 5-17 ms per GEMM shape on the H200 (call of 12:12: a first 63-row prefill's launches
 * blocked the host for 39 ms, a first 64-row one 14 ms): with the stacked products' M rounded up to a
 * multiple of CU_GEMM_PAD_ROWS, 9-64 rows make four shapes per weight matrix, and past 64 rows M is rounded
 * up to a multiple of CU_GEMM_PAD_BIG where the caller's y holds the rows (cu_gemm_rows); forward_cuda.c's
 * warm-up meets those shapes once at creation. The pad rows' outputs are never read; a row's bits depend only
 * on its bucket. */
static int g_gemm_pad = 0;
extern "C" void cu_set_gemm_pad(int on) {
    g_gemm_pad = on;
}
extern "C" int cu_gemm_pad(void) {
    return g_gemm_pad;
}

/* ---- CINFER_CUDA_LT_TUNE (precision fast; default on; "0": off; "1": on, each choice reported on stderr):
 * one-pass products of >= 1024 rows on the cuBLASLt algorithm that measured fastest for their shape ----
 * cublasGemmEx's default takes cuBLAS's heuristic pick, which on the H200 left the 4B prefill GEMMs at 790-870
 * TFLOP/s at 4096 rows where another of its candidates runs 890-930. The first product of each (N, K, M's
 * power-of-two class, output type) times the default and up to 16 heuristic candidates on the context's stream
 * (4 runs each, ~15 ms a shape, once per shape in the process; never while a graph is captured; forward_cuda.c's
 * warm-up meets the full chunk's shapes at creation) and keeps the fastest when it beats the default by 2%;
 * later products of that class run it (checked against their M by cublasLtMatmulAlgoCheck, else the default).
 * The choice is per shape, not per batch, so a row's bits still depend only on its bucket. Exact mode's
 * two-pass products never take this path. H200, session 10's third call, 4B 4096-token chunk in fast mode:
 * 68.7 -> 67.1 ms of device time, 55,854 -> 62,759 tok/s (in_proj 10.8 -> 10.1 ms, ffn GEMMs 24.6 -> 23.5) */
static int g_lt_tune = 0, g_lt_report = 0;
extern "C" void cu_set_lt_tune(int on, int report) {
    g_lt_tune = on;
    g_lt_report = report;
}
extern "C" int cu_lt_tune(void) {
    return g_lt_tune;
}

#define LT_MAX   64
#define LT_CANDS 16
typedef struct lt_entry {
    int N, K, mcls; /* the shape: N, K and floor(log2(M)) */
    int out16;      /* y in bf16 (cu_gemm_presplit_out16), else f32 */
    int use;        /* 1: algo beat GemmEx's default when timed */
    cublasLtMatmulAlgo_t algo;
} lt_entry;
static lt_entry g_lt[LT_MAX];
static int g_nlt;
static pthread_mutex_t g_lt_mu = PTHREAD_MUTEX_INITIALIZER;
static cublasLtHandle_t g_lth;

typedef struct lt_descs {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
} lt_descs;

/* blas()'s product as cuBLASLt descriptors: Y^T [N x M] = W [K x N]^T · X^T [K x M], bf16 in, f32 (or with
 * out16 bf16) out */
static int lt_make(lt_descs *d, int M, int N, int K, int out16) {
    memset(d, 0, sizeof *d);
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    if (cublasLtMatmulDescCreate(&d->op, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) return -1;
    cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (cublasLtMatrixLayoutCreate(&d->a, CUDA_R_16BF, K, N, K) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatrixLayoutCreate(&d->b, CUDA_R_16BF, K, M, K) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatrixLayoutCreate(&d->c, out16 ? CUDA_R_16BF : CUDA_R_32F, N, M, N) != CUBLAS_STATUS_SUCCESS)
        return -1;
    return 0;
}
static void lt_free(lt_descs *d) {
    if (d->c) cublasLtMatrixLayoutDestroy(d->c);
    if (d->b) cublasLtMatrixLayoutDestroy(d->b);
    if (d->a) cublasLtMatrixLayoutDestroy(d->a);
    if (d->op) cublasLtMatmulDescDestroy(d->op);
}

static int mclass(int M) {
    int k = 0;
    while ((2 << k) <= M) k++;
    return k;
}

static void blas_default(cu_ctx *c, void *y, const uint16_t *xb, const uint16_t *w, int M, int N, int K,
                         float beta, int out16);

/* mean ms of reps runs of one product on c's stream (one warm run first) */
template <typename F> static float lt_time(cu_ctx *c, F run) {
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    run();
    cudaEventRecord(e0, c->stream);
    const int reps = 4;
    for (int i = 0; i < reps; i++) run();
    cudaEventRecord(e1, c->stream);
    float ms = -1.0f;
    if (cudaEventSynchronize(e1) == cudaSuccess) cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return ms < 0 ? 1e30f : ms / reps;
}

/* times GemmEx's default and the heuristic's candidates for this shape into e (g_lt_mu held) */
static void lt_tune_shape(cu_ctx *c, lt_entry *e, void *y, const uint16_t *xb, const uint16_t *w, int M, int N,
                          int K) {
    e->use = 0;
    if (!g_lth && cublasLtCreate(&g_lth) != CUBLAS_STATUS_SUCCESS) return;
    lt_descs d;
    if (lt_make(&d, M, N, K, e->out16)) {
        lt_free(&d);
        return;
    }
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    size_t wsb = c->blas_ws_bytes;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
    cublasLtMatmulHeuristicResult_t res[LT_CANDS];
    int n = 0;
    if (cublasLtMatmulAlgoGetHeuristic(g_lth, d.op, d.a, d.b, d.c, d.c, pref, LT_CANDS, res, &n) !=
        CUBLAS_STATUS_SUCCESS)
        n = 0;
    cublasLtMatmulPreferenceDestroy(pref);
    float base = lt_time(c, [&] { blas_default(c, y, xb, w, M, N, K, 0.0f, e->out16); }), best = base;
    int bi = -1;
    const float one = 1.0f, zero = 0.0f;
    for (int i = 0; i < n; i++) {
        if (res[i].state != CUBLAS_STATUS_SUCCESS || res[i].workspaceSize > wsb) continue;
        float ms = lt_time(c, [&] {
            cublasLtMatmul(g_lth, d.op, &one, w, d.a, xb, d.b, &zero, y, d.c, y, d.c, &res[i].algo, c->blas_ws, wsb,
                           c->stream);
        });
        if (ms < best) best = ms, bi = i;
    }
    lt_free(&d);
    if (bi >= 0 && best < 0.98f * base) e->use = 1, e->algo = res[bi].algo;
    if (g_lt_report)
        fprintf(stderr, "cinfer cuda: CINFER_CUDA_LT_TUNE M %d N %d K %d%s: default %.3f ms (%.0f TFLOP/s), %s %.3f ms (%.0f "
                    "TFLOP/s) of %d candidates\n",
            M, N, K, e->out16 ? " (bf16 out)" : "", base, 2e-9 * M * N * K / base, e->use ? "takes" : "keeps the default; best", best,
            2e-9 * M * N * K / best, n);
}

/* the tuned product when LT_TUNE serves it; 0: the caller runs GemmEx */
static int lt_gemm(cu_ctx *c, void *y, const uint16_t *xb, const uint16_t *w, int M, int N, int K, float beta,
                   int out16) {
    if (!g_lt_tune || !one_pass(c) || M < CU_LT_MIN_ROWS || beta != 0.0f) return 0;
    cudaStreamCaptureStatus cs;
    if (cudaStreamIsCapturing(c->stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) return 0;
    int mc = mclass(M);
    lt_entry *e = NULL;
    pthread_mutex_lock(&g_lt_mu);
    for (int i = 0; i < g_nlt && !e; i++)
        if (g_lt[i].N == N && g_lt[i].K == K && g_lt[i].mcls == mc && g_lt[i].out16 == out16) e = &g_lt[i];
    if (!e && g_nlt < LT_MAX) {
        e = &g_lt[g_nlt++];
        e->N = N, e->K = K, e->mcls = mc, e->out16 = out16;
        lt_tune_shape(c, e, y, xb, w, M, N, K);
    }
    lt_entry got = e ? *e : lt_entry{};
    pthread_mutex_unlock(&g_lt_mu);
    if (!got.use) return 0;
    lt_descs d;
    int ok = 0;
    if (!lt_make(&d, M, N, K, out16)) {
        cublasLtMatmulHeuristicResult_t chk;
        const float one = 1.0f;
        ok = cublasLtMatmulAlgoCheck(g_lth, d.op, d.a, d.b, d.c, d.c, &got.algo, &chk) == CUBLAS_STATUS_SUCCESS &&
             chk.workspaceSize <= c->blas_ws_bytes &&
             cublasLtMatmul(g_lth, d.op, &one, w, d.a, xb, d.b, &beta, y, d.c, y, d.c, &got.algo, c->blas_ws,
                            c->blas_ws_bytes, c->stream) == CUBLAS_STATUS_SUCCESS;
    }
    lt_free(&d);
    return ok;
}

static void blas(cu_ctx *c, float *y, const uint16_t *xb, const uint16_t *w, int M, int N, int K,
                 float beta) {
    if (lt_gemm(c, y, xb, w, M, N, K, beta, 0)) return;
    blas_default(c, y, xb, w, M, N, K, beta, 0);
}

static void blas_default(cu_ctx *c, void *y, const uint16_t *xb, const uint16_t *w, int M, int N, int K,
                         float beta, int out16) {
    const float one = 1.0f;
    /* column-major view: Y^T [N x M] = W [K x N]^T · X^T [K x M] */
    cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, w, CUDA_R_16BF, K, xb, CUDA_R_16BF, K,
                 &beta, y, out16 ? CUDA_R_16BF : CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

/* Tensor cores take bf16 activations; one rounding of the activations costs ~1e-3 relative per product, which
 * the tiny random fixture models amplify past 1e-2 at the logits. So x is split into hi + lo (both bf16, x to
 * ~2^-17) and both halves go through the tensor cores: up to 64 rows as one product of 2M stacked rows (the
 * weights still stream once, as decode needs), beyond that as two products accumulated by cuBLAS. */
static void gemm_impl(cu_ctx *c, float *y, const float *x, const uint16_t *w, int M, int N, int K,
                      uint16_t *xb, int precise, int y_rows);
extern "C" void cu_gemm(cu_ctx *c, float *y, const float *x, const uint16_t *w, int M, int N, int K,
                        uint16_t *xb, int precise) {
    gemm_impl(c, y, x, w, M, N, K, xb, precise, M);
}
extern "C" void cu_gemm_rows(cu_ctx *c, float *y, const float *x, const uint16_t *w, int M, int N, int K,
                             uint16_t *xb, int y_rows) {
    gemm_impl(c, y, x, w, M, N, K, xb, 0, y_rows);
}

/* past 64 rows the two products write y itself: M padded to CU_GEMM_PAD_BIG rows where y and xb hold them */
static int big_rows(const cu_ctx *c, int M, int y_rows) {
    if (!g_gemm_pad) return M;
    int r = (M + CU_GEMM_PAD_BIG - 1) / CU_GEMM_PAD_BIG * CU_GEMM_PAD_BIG;
    return r <= c->xb_rows && r <= y_rows ? r : M;
}

static void gemm_impl(cu_ctx *c, float *y, const float *x, const uint16_t *w, int M, int N, int K,
                      uint16_t *xb, int precise, int y_rows) {
    if (M <= 0 || N <= 0) return;
    if (!precise && cu_skinny_takes(c, M, K)) { /* CINFER_CUDA_SKINNY (gemm_mma.cu) */
        cu_skinny(c, y, x, w, M, N, K, NULL, 0.0f, CU_EPI_STORE);
        return;
    }
    /* the vector path reads x rows as float4: K % 8 == 0 keeps them aligned, else the scalar loop runs */
    if (M <= g_gemv_max || precise || !xb) {
        gemv_any(c, y, x, w, M, N, K);
        return;
    }
    size_t n = (size_t)M * K;
    unsigned g = cdiv(n, 256);
    if (g > 65535u * 16u) g = 65535u * 16u;
    if (one_pass(c)) {
        /* rows padded as the two-pass path pads them (16s up to 64, then 64s), so the warm-up's shapes are
         * the ones met later and a row's bits depend only on its bucket; the pad rows' outputs are not read */
        int Mb = M;
        if (M <= 64 && g_gemm_pad) {
            int r = (M + CU_GEMM_PAD_ROWS - 1) / CU_GEMM_PAD_ROWS * CU_GEMM_PAD_ROWS;
            if (r <= c->xb_rows && r <= y_rows) Mb = r;
        } else if (M > 64) {
            Mb = big_rows(c, M, y_rows);
        }
        cu_f32_to_bf16(c, xb, x, n);
        blas(c, y, xb, w, Mb, N, K, 0.0f);
        return;
    }
    int stacked = M <= 64 && c->ytmp && (size_t)2 * M * N <= c->ytmp_floats, Mb = M;
    if (stacked && g_gemm_pad) {
        int r = (M + CU_GEMM_PAD_ROWS - 1) / CU_GEMM_PAD_ROWS * CU_GEMM_PAD_ROWS;
        if (r <= c->xb_rows && (size_t)2 * r * N <= c->ytmp_floats) Mb = r;
    }
    if (!stacked) Mb = big_rows(c, M, y_rows);
    split_bf16_kernel<<<g, 256, 0, c->stream>>>(xb, x, n, (size_t)Mb * K);
    if (stacked) {
        blas(c, c->ytmp, xb, w, 2 * Mb, N, K, 0.0f);
        size_t ny = (size_t)M * N;
        unsigned gy = cdiv(ny, 256);
        if (gy > 65535u * 16u) gy = 65535u * 16u;
        add_halves_kernel<<<gy, 256, 0, c->stream>>>(y, c->ytmp, ny, (size_t)Mb * N);
    } else {
        cu_gemm_presplit(c, y, xb, w, M, N, K, Mb);
    }
}

/* precision fast (one pass), CINFER_CUDA_FAST_PRESPLIT (default on; "0": off): the producers write one bf16
 * copy (lo 0) instead of f32 rows that cu_gemm would convert, half the bytes of exact's halves and no
 * conversion kernel; the same bits (test_cuda_presplit). H200, session 10's second call, 4B 4096-token chunk
 * in fast mode: 93.6 -> 84.0 ms of device time (out_proj 5.2 -> 3.7, ffn GEMMs 29.0 -> 24.4, ffn act 6.4 ->
 * 3.0), 40,885 -> 47,592 tok/s */
static int g_fast_presplit = 1;
extern "C" void cu_set_fast_presplit(int on) {
    g_fast_presplit = on;
}

extern "C" int cu_gemm_presplit_rows(cu_ctx *c, int M, int K, int y_rows) {
    if (M <= 64 || M <= g_gemv_max || cu_skinny_takes(c, M, K)) return 0;
    if (one_pass(c) && !g_fast_presplit) return 0;
    return big_rows(c, M, y_rows);
}

extern "C" size_t cu_gemm_presplit_lo(cu_ctx *c, int Mb, int K) {
    return one_pass(c) ? 0 : (size_t)Mb * K;
}

extern "C" void cu_gemm_presplit(cu_ctx *c, float *y, const uint16_t *xb, const uint16_t *w, int M, int N,
                                 int K, int Mb) {
    (void)M; /* rows M..Mb of y are overwritten (pad rows, never read) */
    blas(c, y, xb, w, Mb, N, K, 0.0f);
    if (!one_pass(c)) blas(c, y, xb + (size_t)Mb * K, w, Mb, N, K, 1.0f);
}

/* one pass from the producer's bf16 copy into a bf16 y [Mb][N] (CINFER_CUDA_FAST_GU16): f32 accumulation,
 * the output rounded once */
extern "C" void cu_gemm_presplit_out16(cu_ctx *c, uint16_t *y, const uint16_t *xb, const uint16_t *w, int N, int K,
                                       int Mb) {
    if (!lt_gemm(c, y, xb, w, Mb, N, K, 0.0f, 1)) blas_default(c, y, xb, w, Mb, N, K, 0.0f, 1);
}

/* Row m of x (x row m / div) times matrix widx[m] of w: one M = 1 GEMV per block row, for MoE experts. */
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_indexed_kernel(float *__restrict__ y, const float *__restrict__ x, int div,
                        const uint16_t *__restrict__ w, const int *__restrict__ widx, int N, int K) {
    int m = blockIdx.y;
    const uint16_t *wm = w + (size_t)widx[m] * N * K;
    const float *xm = x + (size_t)(m / div) * K;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int n0 = (blockIdx.x * GEMV_WARPS + warp) * 2;
    if (n0 >= N) return;
    float acc[2] = {0.0f, 0.0f};
    if ((K & 7) == 0) {
        for (int k = lane * 8; k < K; k += 256) {
            const float4 *xp = reinterpret_cast<const float4 *>(xm + k);
            float4 a = xp[0], b = xp[1];
            float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
            for (int r = 0; r < 2; r++) {
                int n = n0 + r < N ? n0 + r : N - 1;
                uint4 u = *reinterpret_cast<const uint4 *>(wm + (size_t)n * K + k);
                const uint32_t p[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    acc[r] = fmaf(__uint_as_float(p[q] << 16), xv[2 * q], acc[r]);
                    acc[r] = fmaf(__uint_as_float(p[q] & 0xffff0000u), xv[2 * q + 1], acc[r]);
                }
            }
        }
    } else {
        for (int k = lane; k < K; k += 32)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                int n = n0 + r < N ? n0 + r : N - 1;
                acc[r] = fmaf(bf16_f32(wm[(size_t)n * K + k]), xm[k], acc[r]);
            }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float v = warp_sum(acc[r]);
        if (lane == 0 && n0 + r < N) y[(size_t)m * N + n0 + r] = v;
    }
}

extern "C" void cu_gemv_indexed(cu_ctx *c, float *y, const float *x, int x_row_div, const uint16_t *w,
                                const int *widx, int M, int N, int K) {
    if (M <= 0 || N <= 0) return;
    dim3 grid(cdiv((size_t)N, GEMV_WARPS * 2), (unsigned)M);
    gemv_indexed_kernel<<<grid, GEMV_WARPS * 32, 0, c->stream>>>(y, x, x_row_div, w, widx, N, K);
}

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__global__ void fill_random_kernel(uint16_t *d, size_t n, float amp, uint64_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t h = mix64(seed + 0x9e3779b97f4a7c15ull * (i + 1));
        float u = (float)(h >> 40) * (1.0f / 16777216.0f); /* [0, 1) */
        d[i] = f32_bf16((2.0f * u - 1.0f) * amp);
    }
}

extern "C" void cu_fill_random_bf16(cu_ctx *c, uint16_t *d, size_t n, float std, uint64_t seed) {
    unsigned g = cdiv(n, 256);
    if (g > 65535u * 16u) g = 65535u * 16u;
    fill_random_kernel<<<g, 256, 0, c->stream>>>(d, n, std * 1.7320508f, seed); /* uniform on ±std·√3 */
}

__global__ void fill_f32_kernel(float *d, size_t n, float v) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        d[i] = v;
}
extern "C" void cu_fill_f32(cu_ctx *c, float *d, size_t n, float v) {
    unsigned g = cdiv(n, 256);
    if (g > 65535u * 16u) g = 65535u * 16u;
    fill_f32_kernel<<<g, 256, 0, c->stream>>>(d, n, v);
}

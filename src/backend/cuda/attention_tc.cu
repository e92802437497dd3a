/* attention_tc.cu — varlen causal prefill attention over the paged KV pool on the tensor cores (TF32 WMMA,
 * f32 accumulation; the pool and the normed/roped q rows are f32, each operand split into TF32 hi + lo,
 * three MMAs per product (tf32x3.cuh), so S = Q K^T and O = P V come out as accurate as f32 sums). Selected
 * by cu_attn_args.tc (CINFER_CUDA_PREFILL=tc or attn); attn_tile_kernel of attention.cu stays the default
 * until a device run shows this one within bounds and faster.
 *
 * A block per (group of QH <= 4 query heads sharing one KV head, tile of up to 16 rows of one entry): the
 * M = 16 QH query rows (head-major) share every K/V load. WMMA fragments have no documented element
 * layout, so the softmax cannot rescale an accumulator row by row; instead two passes over the keys:
 * pass 1 computes S = Q K^T per 32-key step and keeps each row's running max and sum (a thread per row);
 * pass 2 recomputes S, forms P = e^(s - max) / sum exactly, and O += P V accumulates in registers over the
 * whole key range (no rescaling ever). 1.5x the products of a one-pass flash kernel, no spills, no layout
 * assumptions. Then the sigmoid output gate. */
#include <mma.h>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/tf32x3.cuh"

using namespace nvcuda;

#define AT_KVB  16 /* = KV_BLOCK */
#define AT_KS   32 /* keys per step */
#define AT_SLD  (AT_KS + 4)
#define AT_ROWS 16 /* = CU_ATTN_TILE */
#define AT_QH   4  /* query heads per block, at most */

typedef wmma::fragment<wmma::accumulator, 16, 16, 8, float> at_acc;

__device__ __forceinline__ const float *at_kv_row(const float *pool, const cu_attn_args &a, const int *blocks,
                                                  int pos) {
    size_t b = (size_t)blocks[pos / AT_KVB];
    return pool +
           (((size_t)a.full * a.n_blocks + b) * AT_KVB + (size_t)(pos % AT_KVB)) * (size_t)(a.Hkv * a.hd);
}

/* acc += A[16][K] B[K][16]; A row-major (lda); B row-major (element (k, n) at B[k ldb + n]) or col-major
 * (at B[k + n ldb]). P: TF32 passes (tf32x3.cuh). The tensor cores truncate at every MMA (a bias growing
 * with the chain: ~1.4e-5 over 900 keys in the H200 run of 06:05), so each AT_KC of K goes into a fresh
 * accumulator (3 x 4 MMAs) that joins acc through ordinary rounded f32 adds: O over the keys, S over hd. */
#define AT_KC 32
template <int P, class LB>
__device__ __forceinline__ void at_mma(at_acc &acc, const float *A, int lda, const float *B, int ldb, int K) {
    wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, LB> fb;
    for (int k0 = 0; k0 < K; k0 += AT_KC) {
        at_acc part;
        wmma::fill_fragment(part, 0.0f);
        for (int k = k0; k < k0 + AT_KC && k < K; k += 8) {
            wmma::load_matrix_sync(fa, A + k, lda);
            wmma::load_matrix_sync(fb, std::is_same<LB, wmma::row_major>::value ? B + (size_t)k * ldb : B + k,
                                   ldb);
            mma_tf32x<P>(part, fa, fb);
        }
#pragma unroll
        for (int t = 0; t < acc.num_elements; t++) acc.x[t] += part.x[t];
    }
}

/* shared memory in floats: Q [64][HD + 4], K and V [32][HD + 4], S/P [64][36], row max and 1/sum [64] each */
static size_t at_smem_floats(int hd) {
    return (size_t)(AT_QH * AT_ROWS + 2 * AT_KS) * (hd + 4) + AT_QH * AT_ROWS * AT_SLD + 2 * AT_QH * AT_ROWS;
}

template <int HD, int P> __global__ void __launch_bounds__(256) attn_tc_kernel(cu_attn_args a, int QH) {
    extern __shared__ __align__(128) float sma[];
    constexpr int LD = HD + 4, NT = HD / 16, NF = (AT_QH * NT + 7) / 8; /* O tiles per warp, at most */
    const int tid = threadIdx.x, warp = tid >> 5, G = a.Hq / a.Hkv, ngrp = G / QH, M = AT_ROWS * QH;
    int kvh = blockIdx.x / ngrp, h0 = kvh * G + (blockIdx.x % ngrp) * QH; /* first query head */
    int r0 = a.tiles[blockIdx.y], e = a.meta.row_entry[r0], end = a.meta.e_row0[e] + a.meta.e_n[e];
    int rows = end - r0 < AT_ROWS ? end - r0 : AT_ROWS;
    int pos0 = a.meta.row_pos[r0], maxpos = pos0 + rows - 1;
    const int *blocks = a.meta.blocks + a.meta.e_boff[e];
    float *Qs = sma, *Ks = Qs + AT_QH * AT_ROWS * LD, *Vs = Ks + AT_KS * LD, *Sb = Vs + AT_KS * LD;
    float *rmax = Sb + AT_QH * AT_ROWS * AT_SLD, *rinv = rmax + AT_QH * AT_ROWS;
    for (int idx = tid; idx < M * HD; idx += blockDim.x) {
        int m = idx / HD, d = idx % HD, r = m % AT_ROWS;
        Qs[m * LD + d] =
            r < rows ? a.qkv[(size_t)(r0 + r) * a.ld + (size_t)(h0 + m / AT_ROWS) * 2 * HD + d] : 0.0f;
    }
    const float scale = (float)(1.0 / sqrt((double)HD));
    /* pass 1: row max and sum; thread m < M owns row m */
    float mrun = -INFINITY, lrun = 0.0f;
    int myr = tid % AT_ROWS, mypos = pos0 + myr, mine = tid < M && myr < rows;
    for (int c0 = 0; c0 <= maxpos; c0 += AT_KS) {
        __syncthreads();
        for (int i = tid; i < AT_KS * HD / 4; i += blockDim.x) {
            int j = i / (HD / 4), d = 4 * (i % (HD / 4)), u = c0 + j;
            float4 kv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (u <= maxpos)
                kv = *reinterpret_cast<const float4 *>(at_kv_row(a.kpool, a, blocks, u) + (size_t)kvh * HD +
                                                       d);
            *reinterpret_cast<float4 *>(Ks + j * LD + d) = kv;
        }
        __syncthreads();
        for (int t = warp; t < 2 * QH; t += 8) {
            int mi = t >> 1, ni = t & 1;
            at_acc acc;
            wmma::fill_fragment(acc, 0.0f);
            at_mma<P, wmma::col_major>(acc, Qs + mi * 16 * LD, LD, Ks + ni * 16 * LD, LD, HD);
            wmma::store_matrix_sync(Sb + mi * 16 * AT_SLD + ni * 16, acc, AT_SLD, wmma::mem_row_major);
        }
        __syncthreads();
        if (mine) {
            const float *s = Sb + tid * AT_SLD;
            int nj = mypos - c0 + 1 < AT_KS ? mypos - c0 + 1 : AT_KS; /* keys u <= mypos */
            if (nj > 0) {
                float cm = -INFINITY;
                for (int j = 0; j < nj; j++) cm = fmaxf(cm, s[j] * scale);
                float mn = fmaxf(mrun, cm), sum = 0.0f;
                for (int j = 0; j < nj; j++) sum += expf(s[j] * scale - mn);
                lrun = lrun * expf(mrun - mn) + sum;
                mrun = mn;
            }
        }
    }
    if (tid < M) {
        rmax[tid] = mine ? mrun : 0.0f;
        rinv[tid] = mine ? 1.0f / lrun : 0.0f;
    }
    /* pass 2: P = e^(s - max) / sum, O += P V in registers */
    at_acc o[NF];
#pragma unroll
    for (int f = 0; f < NF; f++) wmma::fill_fragment(o[f], 0.0f);
    for (int c0 = 0; c0 <= maxpos; c0 += AT_KS) {
        __syncthreads();
        for (int i = tid; i < AT_KS * HD / 4; i += blockDim.x) {
            int j = i / (HD / 4), d = 4 * (i % (HD / 4)), u = c0 + j;
            float4 kv = make_float4(0.0f, 0.0f, 0.0f, 0.0f), vv = kv;
            if (u <= maxpos) {
                kv = *reinterpret_cast<const float4 *>(at_kv_row(a.kpool, a, blocks, u) + (size_t)kvh * HD +
                                                       d);
                vv = *reinterpret_cast<const float4 *>(at_kv_row(a.vpool, a, blocks, u) + (size_t)kvh * HD +
                                                       d);
            }
            *reinterpret_cast<float4 *>(Ks + j * LD + d) = kv;
            *reinterpret_cast<float4 *>(Vs + j * LD + d) = vv;
        }
        __syncthreads();
        for (int t = warp; t < 2 * QH; t += 8) {
            int mi = t >> 1, ni = t & 1;
            at_acc acc;
            wmma::fill_fragment(acc, 0.0f);
            at_mma<P, wmma::col_major>(acc, Qs + mi * 16 * LD, LD, Ks + ni * 16 * LD, LD, HD);
            wmma::store_matrix_sync(Sb + mi * 16 * AT_SLD + ni * 16, acc, AT_SLD, wmma::mem_row_major);
        }
        __syncthreads();
        for (int idx = tid; idx < M * AT_KS; idx += blockDim.x) {
            int m = idx / AT_KS, j = idx % AT_KS, r = m % AT_ROWS, u = c0 + j;
            float p = 0.0f;
            if (r < rows && u <= pos0 + r) p = expf(Sb[m * AT_SLD + j] * scale - rmax[m]) * rinv[m];
            Sb[m * AT_SLD + j] = p;
        }
        __syncthreads();
#pragma unroll
        for (int f = 0; f < NF; f++) {
            int t = warp + 8 * f;
            if (t < QH * NT)
                at_mma<P, wmma::row_major>(o[f], Sb + (t / NT) * 16 * AT_SLD, AT_SLD, Vs + (t % NT) * 16, LD,
                                           AT_KS);
        }
    }
    __syncthreads(); /* Q is no longer read: O goes through its rows */
#pragma unroll
    for (int f = 0; f < NF; f++) {
        int t = warp + 8 * f;
        if (t < QH * NT)
            wmma::store_matrix_sync(Qs + (t / NT) * 16 * LD + (t % NT) * 16, o[f], LD, wmma::mem_row_major);
    }
    __syncthreads();
    for (int idx = tid; idx < M * HD; idx += blockDim.x) {
        int m = idx / HD, d = idx % HD, r = m % AT_ROWS, h = h0 + m / AT_ROWS;
        if (r >= rows) continue;
        float gate = a.qkv[(size_t)(r0 + r) * a.ld + (size_t)h * 2 * HD + HD + d];
        a.o[(size_t)(r0 + r) * a.Hq * HD + (size_t)h * HD + d] = Qs[m * LD + d] * dev_sigmoid(gate);
    }
}

/* query heads per block: the largest divisor of the GQA ratio up to AT_QH */
static int at_qh(int Hq, int Hkv) {
    int G = Hq / Hkv, q = AT_QH;
    while (G % q) q--;
    return q;
}

template <int HD> static int at_attr(size_t smem) {
    return cudaFuncSetAttribute(attn_tc_kernel<HD, 3>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)smem) == cudaSuccess &&
           cudaFuncSetAttribute(attn_tc_kernel<HD, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)smem) == cudaSuccess;
}

extern "C" int cu_attn_tc_init(int hd) {
    int dev = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 0;
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    size_t smem = at_smem_floats(hd) * sizeof(float);
    if (smem > (size_t)optin) return 0;
    switch (hd) {
    case 32:
        return at_attr<32>(smem);
    case 64:
        return at_attr<64>(smem);
    case 128:
        return at_attr<128>(smem);
    case 256:
        return at_attr<256>(smem);
    default:
        return 0; /* 512: Q, K and V rows would not fit; the scalar tiles serve it */
    }
}

template <int HD> static void at_launch(cu_ctx *c, const cu_attn_args *a, dim3 grid, int QH, size_t sm) {
    if (cu_tf32_passes() == 1)
        attn_tc_kernel<HD, 1><<<grid, 256, sm, c->stream>>>(*a, QH);
    else
        attn_tc_kernel<HD, 3><<<grid, 256, sm, c->stream>>>(*a, QH);
}

extern "C" void cu_attn_tiled_tc(cu_ctx *c, const cu_attn_args *a) {
    int QH = at_qh(a->Hq, a->Hkv);
    dim3 grid((unsigned)(a->Hq / QH), (unsigned)a->n_tiles);
    size_t sm = at_smem_floats(a->hd) * sizeof(float);
    switch (a->hd) {
    case 32:
        at_launch<32>(c, a, grid, QH, sm);
        break;
    case 64:
        at_launch<64>(c, a, grid, QH, sm);
        break;
    case 128:
        at_launch<128>(c, a, grid, QH, sm);
        break;
    case 256:
        at_launch<256>(c, a, grid, QH, sm);
        break;
    default:
        break;
    }
}

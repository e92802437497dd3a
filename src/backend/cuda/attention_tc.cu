/* attention_tc.cu — varlen causal prefill attention over the paged KV pool on the tensor cores, in the
 * flash-attention-2 form (CINFER_CUDA_PREFILL=tc or attn, the default; cu_attn_args.tc). The pool and the
 * normed/roped q rows are f32; every product runs on operands split into fp16 hi + lo with three
 * mma.sync.m16n8k16 (the small terms first), so S = Q K^T and O = P V come out as accurate as f32 sums
 * (tf32x3.cuh says why one rounding is not enough): 21.2 ms of attention per 4B 4096-token chunk on the
 * H200, where the scalar tiles took 112.6 ms. (A TF32 hi + lo form with m16n8k8, 27.9 ms, was deleted in
 * session 5: only older and slower.)
 *
 * A block holds FA_ROWS = 128 query rows: QH query heads sharing one KV head (the largest power of two up to
 * 8 dividing the GQA ratio) x FA_ROWS / QH consecutive positions of one entry (a tile of cu_attn_tc_rows
 * rows). Each of its 8 warps owns 16 of those rows (one head, 16 positions) for the whole key range: S in
 * registers, the online softmax in f32 on the accumulator layout (a row's 8 keys of an n-tile sit in the
 * quad of lanes 4g..4g+3), O in registers. K and V tiles of FA_BN keys come from the paged pool by cp.async
 * into shared memory and serve all 128 rows (the 4 query heads of a 4B KV head read each K/V row once per
 * 32 positions instead of once per 16 rows of one head). V of tile j loads while S of tile j runs, K of tile
 * j + 1 while P V of tile j runs (FlashAttention-2's single-buffer pipeline; 195 KB of shared memory at
 * head_dim 256). Causal masking by tile: a warp skips the key tiles past its last position and masks only
 * the tiles that cross its diagonal. Blocks run longest tile first. With key splits (cu_attn_split) a block
 * runs one span of keys of a tile. */
#include <cuda_fp16.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/bulk.cuh"
#include "backend/cuda/common.cuh"

#define FA_ROWS  128 /* (head, position) rows per block: 8 warps x 16 */
#define FA_BN    32  /* keys per tile */
#define FA_KVB   16  /* = KV_BLOCK */
#define FA_MAXQH 8
#define FB_VLD   24 /* bulk tiles: halves per V row (16 keys + 8: rows in distinct banks) */

/* 16 bytes global -> shared, bypassing L1; n = 0 fills zeros (rows past the last position: never NaN) */
__device__ __forceinline__ void fa_cp16(float *dst, const float *src, int n) {
    unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void fa_commit(void) {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void fa_wait(void) {
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

/* ---- fp16 hi + lo operands ----
 * fp16 has TF32's 11 significant bits, so hi = fp16(x), lo = fp16(x - hi) holds x to ~2^-22, within fp16's
 * range: |x| < 65504 (q and k are RMS-normed, P is in [0, 1], v rows are activations), and a lo below 2^-14
 * (|x| < ~2^-3) is subnormal: x then to ~2^-25 absolute. Q is split once into shared memory as fp16 hi | lo
 * (the bytes its f32 rows took). K and V: split once per layer by attn_kv16_kernel (cu_attn_args.kv16, the
 * default for chunks of >= 256 rows: 23.0 -> 18.1 ms per 4B 4096-token chunk) and loaded as halves, or f32
 * from cp.async with each warp splitting its fragments. */
__device__ __forceinline__ void h2_split(float x, float y, uint32_t &hi, uint32_t &lo) {
    __half2 h = __floats2half2_rn(x, y); /* x in the low half: the lower k index */
    float2 hf = __half22float2(h);
    __half2 l = __floats2half2_rn(x - hf.x, y - hf.y);
    hi = *reinterpret_cast<uint32_t *>(&h);
    lo = *reinterpret_cast<uint32_t *>(&l);
}

/* h2_split for one value (the K / V pre-passes): the same hi and lo */
__device__ __forceinline__ void split16(float x, __half &hi, __half &lo) {
    hi = __float2half_rn(x);
    lo = __float2half_rn(x - __half2float(hi));
}

/* d += a b, m16n8k16 fp16: A a0 (g, 2t..2t+1), a1 (g + 8, 2t..), a2 (g, 2t + 8..), a3 (g + 8, 2t + 8..);
 * B b0 (k 2t..2t+1, n g), b1 (k 2t + 8..2t + 9, n g); D as m16n8k8 */
__device__ __forceinline__ void fh_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* P 3: lo hi, hi lo, hi hi; P 1 (CINFER_CUDA_TF32_PASSES=1, a diagnostic of what the split costs): hi hi */
template <int P>
__device__ __forceinline__ void fh_mma3(float (&d)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4],
                                        uint32_t bh0, uint32_t bh1, uint32_t bl0, uint32_t bl1) {
    if constexpr (P == 3) {
        fh_mma(d, al, bh0, bh1);
        fh_mma(d, ah, bl0, bl1);
    }
    fh_mma(d, ah, bh0, bh1);
}

/* FA_BN rows of K or V into S ([FA_BN][LD] f32) */
template <int HD, int LD>
__device__ __forceinline__ void fh_load_kv(float *S, const float *pool, const cu_attn_args &a,
                                           const int *blocks, int kvh, int c0, int maxpos) {
    constexpr int C4 = HD / 4;
    for (int i = threadIdx.x; i < FA_BN * C4; i += blockDim.x) {
        int j = i / C4, c = i % C4, u = c0 + j, ok = u <= maxpos;
        const float *src = pool;
        if (ok)
            src =
                pool +
                (((size_t)a.full * a.n_blocks + (size_t)blocks[u / FA_KVB]) * FA_KVB + (size_t)(u % FA_KVB)) *
                    (size_t)(a.Hkv * HD) +
                (size_t)kvh * HD + 4 * c;
        fa_cp16(S + j * LD + 4 * c, src, ok ? 16 : 0);
    }
}

/* ---- K and V split once (cu_attn_args.kv16): a pre-pass writes every key and value of the launch's
 * entries as fp16 hi + lo (h2_split's values), so the tiles load the halves by cp.async and no warp splits a
 * fragment (each of the 8 warps split every K and V element of a tile: ~1,500 of a warp's ~2,700 instructions
 * per 32-key tile). The same operands in the same MMAs: the same bits. Layout per layer (n_blocks pool
 * blocks): K hi, K lo [n_blocks][16][Hkv][hd]; V hi, V lo [n_blocks][Hkv][hd][16] (keys innermost: a B
 * fragment of P V is two consecutive keys of one dim). */
__global__ void attn_kv16_kernel(cu_attn_args a) {
    const int e = blockIdx.y, bi = blockIdx.x, L = a.meta.e_len[e] + a.meta.e_n[e];
    if (bi * FA_KVB >= L) return;
    const int b = a.meta.blocks[a.meta.e_boff[e] + bi], W = a.Hkv * a.hd;
    const size_t nh = (size_t)a.n_blocks * FA_KVB * W; /* halves per array */
    __half *kh = reinterpret_cast<__half *>(a.kv16), *kl = kh + nh, *vh = kl + nh, *vl = vh + nh;
    const float *kp = a.kpool + ((size_t)a.full * a.n_blocks + b) * FA_KVB * W,
                *vp = a.vpool + ((size_t)a.full * a.n_blocks + b) * FA_KVB * W;
    /* all 16 positions (past the entry's length too: the tiles never load those, and an entry sharing the
     * block writes the same halves) */
    for (int i = threadIdx.x; i < W; i += blockDim.x) {
        __align__(16) __half vhi[FA_KVB];
        __align__(16) __half vlo[FA_KVB];
#pragma unroll
        for (int j = 0; j < FA_KVB; j++) {
            float x = kp[(size_t)j * W + i], y = vp[(size_t)j * W + i];
            split16(x, kh[((size_t)b * FA_KVB + j) * W + i], kl[((size_t)b * FA_KVB + j) * W + i]);
            split16(y, vhi[j], vlo[j]);
        }
        uint4 *dh = reinterpret_cast<uint4 *>(vh + ((size_t)b * W + i) * FA_KVB),
              *dl = reinterpret_cast<uint4 *>(vl + ((size_t)b * W + i) * FA_KVB);
        dh[0] = *reinterpret_cast<uint4 *>(vhi), dh[1] = *reinterpret_cast<uint4 *>(vhi + 8);
        dl[0] = *reinterpret_cast<uint4 *>(vlo), dl[1] = *reinterpret_cast<uint4 *>(vlo + 8);
    }
}

/* 16 bytes of halves global -> shared; n bytes copied, the rest zeros */
__device__ __forceinline__ void fh_cp16(__half *dst, const __half *src, int n) {
    unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(n) : "memory");
}

/* FA_BN keys' K hi, lo ([FA_BN][HD + 8] halves each) from the kv16 scratch; keys past maxpos zeros */
template <int HD>
__device__ __forceinline__ void fh_load_k16(__half *Kh, const cu_attn_args &a, const int *blocks, int kvh,
                                            int c0, int maxpos) {
    constexpr int C8 = HD / 8, LD = HD + 8;
    const size_t nh = (size_t)a.n_blocks * FA_KVB * a.Hkv * HD;
    const __half *src0 = reinterpret_cast<const __half *>(a.kv16);
    for (int i = threadIdx.x; i < 2 * FA_BN * C8; i += blockDim.x) {
        int lo = i / (FA_BN * C8), r = i % (FA_BN * C8), j = r / C8, c = r % C8, u = c0 + j, ok = u <= maxpos;
        const __half *src = src0;
        if (ok)
            src = src0 + lo * nh + (((size_t)blocks[u / FA_KVB] * FA_KVB + u % FA_KVB) * a.Hkv + kvh) * HD +
                  8 * c;
        fh_cp16(Kh + lo * FA_BN * LD + j * LD + 8 * c, src, ok ? 16 : 0);
    }
}

/* FA_BN keys' V hi, lo transposed ([HD][FA_BN + 8] halves each: keys innermost) from the kv16 scratch */
template <int HD>
__device__ __forceinline__ void fh_load_v16(__half *Vh, const cu_attn_args &a, const int *blocks, int kvh,
                                            int c0, int maxpos) {
    constexpr int Q8 = FA_BN / 8, LD = FA_BN + 8;
    const size_t nh = (size_t)a.n_blocks * FA_KVB * a.Hkv * HD;
    const __half *src0 = reinterpret_cast<const __half *>(a.kv16) + 2 * nh;
    for (int i = threadIdx.x; i < 2 * HD * Q8; i += blockDim.x) {
        int lo = i / (HD * Q8), r = i % (HD * Q8), d = r / Q8, q = r % Q8, u0 = c0 + 8 * q;
        int n = maxpos - u0 + 1;
        n = n < 0 ? 0 : n > 8 ? 8 : n;
        const __half *src = src0;
        if (n)
            src = src0 + lo * nh + (((size_t)blocks[u0 / FA_KVB] * a.Hkv + kvh) * HD + d) * FA_KVB +
                  u0 % FA_KVB;
        fh_cp16(Vh + lo * HD * LD + d * LD + 8 * q, src, 2 * n);
    }
}

/* Q hi | lo [FA_ROWS][HD + 8] fp16 each; then K [FA_BN][HD + 8] f32 (8-byte fragment loads: rows 8 words
 * apart), V [FA_BN][HD + 4] f32 (rows 2t and 2t + 1 of a fragment 4 words apart); or (S16) K hi | lo
 * [FA_BN][HD + 8], V hi | lo [HD][FA_BN + 8] fp16 (rows 20 words apart: a fragment's 8 dims x 4 key pairs in
 * distinct banks) */
template <int HD, bool S16, bool BK = false> constexpr size_t fh_smem_bytes() {
    return (size_t)2 * FA_ROWS * (HD + 8) * 2 +
           (BK    ? (size_t)2 * FA_BN * (HD + 8) * 2 + (size_t)2 * HD * FB_VLD * 2 * 2 + 16
            : S16 ? (size_t)2 * FA_BN * (HD + 8) * 2 + (size_t)2 * HD * (FA_BN + 8) * 2
                  : (size_t)FA_BN * (HD + 8) * 4 + (size_t)FA_BN * (HD + 4) * 4);
}

/* ---- K and V tiles by bulk copies (CINFER_CUDA_ATTN_BULK, the default at hd 128 / 256; "0": kv16's) ----
 * The H200 (session 7, call 1: ncu of one 4B layer at 4096 rows) showed the tiles' loads costing ~4,100
 * 16-byte cp.async per 32-key tile (K and V hi + lo), issued by every thread at the tile's two barriers, and
 * the tensor pipe ~30% busy with two warps a scheduler. Call 2: 4B attention per 4096-token chunk 18.7 ->
 * 15.6 ms, prefill 4096 28,638 -> 29,446 tok/s, 32768 17,217 -> 19,109 (+11%), the same bits. Here
 * the pre-pass (attn_kvb_kernel) writes each pool block's halves as the image the tile wants in shared
 * memory, per (block, KV head): K hi, K lo [16][hd + 8], V hi, V lo [hd][FB_VLD] (keys innermost, 16 of
 * FB_VLD used), so a tile is 2 to 4 bulk copies per block of 16 keys (bulk.cuh), issued by one thread,
 * awaited on an mbarrier. V in shared memory is [hi | lo][block of the tile][hd][FB_VLD]: P V's k-step j
 * reads block j (rows 48 bytes apart: the 8 rows of an ldmatrix matrix in distinct banks). The same halves in
 * the same fragments: the same bits as kv16. Keys past the tile's last one: V zeroed after the copies (P is 0
 * there, but 0 x NaN is not), K left as it is (those scores are masked). */
template <int HD> __host__ __device__ constexpr int fb_img_halves() { /* one (block, KV head) image */
    return 2 * FA_KVB * (HD + 8) + 2 * HD * FB_VLD;
}

__global__ void attn_kvb_kernel(cu_attn_args a) {
    const int e = blockIdx.y, bi = blockIdx.x, L = a.meta.e_len[e] + a.meta.e_n[e];
    if (bi * FA_KVB >= L) return;
    const int b = a.meta.blocks[a.meta.e_boff[e] + bi], hd = a.hd, W = a.Hkv * hd, LK = hd + 8;
    const int KH = FA_KVB * LK, VH = hd * FB_VLD, IMG = 2 * KH + 2 * VH;
    __half *base = reinterpret_cast<__half *>(a.kv16);
    const float *kp = a.kpool + ((size_t)a.full * a.n_blocks + b) * FA_KVB * W,
                *vp = a.vpool + ((size_t)a.full * a.n_blocks + b) * FA_KVB * W;
    for (int i = threadIdx.x; i < W; i += blockDim.x) {
        const int kvh = i / hd, d = i % hd;
        __half *img = base + ((size_t)b * a.Hkv + kvh) * IMG;
        __align__(16) __half vhi[FA_KVB];
        __align__(16) __half vlo[FA_KVB];
#pragma unroll
        for (int j = 0; j < FA_KVB; j++) {
            float x = kp[(size_t)j * W + i], y = vp[(size_t)j * W + i];
            split16(x, img[j * LK + d], img[KH + j * LK + d]);
            split16(y, vhi[j], vlo[j]);
        }
        uint4 *dh = reinterpret_cast<uint4 *>(img + 2 * KH + d * FB_VLD),
              *dl = reinterpret_cast<uint4 *>(img + 2 * KH + VH + d * FB_VLD);
        dh[0] = *reinterpret_cast<uint4 *>(vhi), dh[1] = *reinterpret_cast<uint4 *>(vhi + 8);
        dl[0] = *reinterpret_cast<uint4 *>(vlo), dl[1] = *reinterpret_cast<uint4 *>(vlo + 8);
    }
}

/* K hi, lo of the tile's blocks (one thread): rows 0-15 from block c0 / 16, rows 16-31 from the next one
 * unless the tile ends before it */
template <int HD>
__device__ __forceinline__ void fb_load_k(__half *K16, const cu_attn_args &a, const int *blocks, int kvh,
                                          int c0, int khi, uint64_t *bar) {
    constexpr int LK = HD + 8, KH = FA_KVB * LK;
    const int nb = c0 + FA_KVB <= khi ? 2 : 1;
    const __half *base = reinterpret_cast<const __half *>(a.kv16);
    bk_fence();
    bk_expect(bar, (unsigned)(2 * nb * KH * 2));
    for (int j = 0; j < nb; j++) {
        const __half *img = base + ((size_t)blocks[c0 / FA_KVB + j] * a.Hkv + kvh) * fb_img_halves<HD>();
        bk_copy(K16 + j * KH, img, KH * 2u, bar);
        bk_copy(K16 + FA_BN * LK + j * KH, img + KH, KH * 2u, bar);
    }
}

/* V hi, lo of the tile's blocks (one thread) */
template <int HD>
__device__ __forceinline__ void fb_load_v(__half *V16, const cu_attn_args &a, const int *blocks, int kvh,
                                          int c0, int khi, uint64_t *bar) {
    constexpr int KH = FA_KVB * (HD + 8), VH = HD * FB_VLD;
    const int nb = c0 + FA_KVB <= khi ? 2 : 1;
    const __half *base = reinterpret_cast<const __half *>(a.kv16);
    bk_fence();
    bk_expect(bar, (unsigned)(2 * nb * VH * 2));
    for (int j = 0; j < nb; j++) {
        const __half *img =
            base + ((size_t)blocks[c0 / FA_KVB + j] * a.Hkv + kvh) * fb_img_halves<HD>() + 2 * KH;
        bk_copy(V16 + j * VH, img, VH * 2u, bar);
        bk_copy(V16 + 2 * VH + j * VH, img + VH, VH * 2u, bar);
    }
}

/* the tile's V past key khi (its last tile only): zeros */
template <int HD> __device__ __forceinline__ void fb_zero_v(__half *V16, int c0, int khi) {
    constexpr int VH = HD * FB_VLD;
    for (int i = threadIdx.x; i < 2 * 2 * HD * FA_KVB; i += blockDim.x) {
        int k = i % FA_KVB, r = i / FA_KVB, j = (r / HD) % 2;
        if (c0 + j * FA_KVB + k > khi)
            V16[(r / HD / 2) * 2 * VH + j * VH + (r % HD) * FB_VLD + k] = __float2half(0.0f);
    }
}

/* four 8x8 b16 matrices from shared memory: lane l gives row l % 8 of matrix l / 8; r[j] holds for lane
 * (g, t) row g, columns 2t, 2t + 1 of matrix j: the mma.sync fragment layout */
__device__ __forceinline__ void fh_ldsm4(uint32_t (&r)[4], const __half *p) {
    unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

/* ---- a block's work, a warp's results: the exact (attn_fh_kernel) and fast (attn_ff_kernel) forms' ---- */

/* What blockIdx says: a tile, or with key splits a (tile, span) work item; either way the longest first */
struct fa_work {
    int BP;            /* positions per query head: FA_ROWS / QH */
    int kvh, h0;       /* the KV head; the block's first query head (QH of them) */
    int r0, rows;      /* the block's first batch row, its rows (<= BP, of one entry) */
    int pos0, maxpos;  /* the positions of rows r0 and r0 + rows - 1 */
    const int *blocks; /* the entry's block table */
    int span, sp;      /* key splits: keys per span (0: unsplit) and this block's span */
    int klo, khi;      /* this block's keys */
};

__device__ __forceinline__ fa_work fa_work_of(const cu_attn_args &a, int QH) {
    fa_work w;
    const int G = a.Hq / a.Hkv, ngrp = G / QH;
    w.BP = FA_ROWS / QH;
    w.kvh = blockIdx.x / ngrp, w.h0 = w.kvh * G + (blockIdx.x % ngrp) * QH;
    const int *wk = a.split.work ? a.split.work + 2 * (a.split.n_work - 1 - (int)blockIdx.y) : NULL;
    w.r0 = wk ? wk[0] : a.tiles[a.n_tiles - 1 - (int)blockIdx.y];
    const int e = a.meta.row_entry[w.r0], end = a.meta.e_row0[e] + a.meta.e_n[e];
    w.rows = end - w.r0 < w.BP ? end - w.r0 : w.BP;
    w.pos0 = a.meta.row_pos[w.r0], w.maxpos = w.pos0 + w.rows - 1;
    w.blocks = a.meta.blocks + a.meta.e_boff[e];
    /* klo .. khi: a span on the 32-key grid, so a row's key tiles are those of the unsplit kernel; a row with
     * one span sees exactly the tiles it would unsplit */
    w.span = wk ? a.split.e_span[e] : 0, w.sp = wk ? wk[1] : 0;
    w.klo = w.sp * w.span;
    w.khi = w.span && w.klo + w.span - 1 < w.maxpos ? w.klo + w.span - 1 : w.maxpos;
    return w;
}

/* A warp's 16 rows (head h, the block's rows off .. off + 15; lane (g, t) holds rows off + g and off + g + 8
 * as la, ma, o[][0..1] and lb, mb, o[][2..3]) when its keys are done: the row sums over the quad, then per
 * row a span's partial (maximum, sum, unnormalised O: combine_rowhead merges them) when the row has more
 * than one span, else O / l times sigmoid(gate) into a.o, or as the out_proj GEMM's halves (a.o_xb,
 * CINFER_CUDA_PF_SPLIT). FAST: the maximum came in log2 units (to natural-log units for the partial, as the
 * exact form writes it), O times 1 / l, and every gate pair loaded before the first store (a.o may alias
 * a.qkv for the compiler: a load after a store waits for it, one memory latency a pair; call 3 put the 4B
 * layer at 4096 rows ~0.24 ms over its tiles' rate at 32k). */
template <int HD, bool FAST>
__device__ __forceinline__ void fa_finish(const cu_attn_args &a, const fa_work &w, int h, int off, int g,
                                          int t, const float (&o)[HD / 8][4], float la, float lb, float ma,
                                          float mb) {
    constexpr int ONT = HD / 8;
    la += __shfl_xor_sync(0xffffffffu, la, 1);
    la += __shfl_xor_sync(0xffffffffu, la, 2);
    lb += __shfl_xor_sync(0xffffffffu, lb, 1);
    lb += __shfl_xor_sync(0xffffffffu, lb, 2);
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        int p = off + g + 8 * hr;
        if (p >= w.rows) continue;
        float l = hr ? lb : la;
        const int ns = w.span ? (w.pos0 + p) / w.span + 1 : 1; /* the row's spans */
        if (w.sp >= ns) continue;                              /* no key of this span is the row's */
        if (ns > 1) {
            float *pp = a.split.part + ((size_t)a.split.row_poff[w.r0 + p] * a.Hq + (size_t)h * ns + w.sp) *
                                           (size_t)(HD + 2);
            const float m = hr ? mb : ma;
            if (t == 0) pp[0] = FAST ? m * 0.6931471805599453f : m, pp[1] = l;
#pragma unroll
            for (int n = 0; n < ONT; n++)
                *reinterpret_cast<float2 *>(pp + 2 + n * 8 + 2 * t) =
                    make_float2(o[n][2 * hr], o[n][2 * hr + 1]);
            continue;
        }
        const float *gate = a.qkv + (size_t)(w.r0 + p) * a.ld + (size_t)h * 2 * HD + HD;
        const size_t obase = (size_t)(w.r0 + p) * a.Hq * HD + (size_t)h * HD;
        float *orow = a.o + obase;
        float2 gv[ONT];
        if constexpr (FAST) {
#pragma unroll
            for (int n = 0; n < ONT; n++) gv[n] = *reinterpret_cast<const float2 *>(gate + n * 8 + 2 * t);
        }
        const float il = 1.0f / l;
#pragma unroll
        for (int n = 0; n < ONT; n++) {
            int d = n * 8 + 2 * t;
            if constexpr (!FAST) gv[n] = *reinterpret_cast<const float2 *>(gate + d);
            float2 ov;
            if constexpr (FAST)
                ov = make_float2(o[n][2 * hr] * il * dev_sigmoid(gv[n].x),
                                 o[n][2 * hr + 1] * il * dev_sigmoid(gv[n].y));
            else
                ov = make_float2(__fmul_rn(o[n][2 * hr] / l, dev_sigmoid(gv[n].x)),
                                 __fmul_rn(o[n][2 * hr + 1] / l, dev_sigmoid(gv[n].y)));
            if (a.o_xb) {
                split_put(a.o_xb, obase + d, a.o_lo, ov.x);
                split_put(a.o_xb, obase + d + 1, a.o_lo, ov.y);
            } else {
                *reinterpret_cast<float2 *>(orow + d) = ov;
            }
        }
    }
}

/* S16: false K and V f32, split by each warp; true split once (cu_attn_args.kv16), the fragments by ldmatrix
 * (4 an instruction). (Session 5's third form, the split halves by 32-bit loads, measured slower: removed.)
 */
template <int HD, int P, bool S16, bool BK = false>
__global__ void __launch_bounds__(256, HD >= 128 ? 1 : 2) attn_fh_kernel(cu_attn_args a, int QH) {
    extern __shared__ __align__(16) float fsm[];
    constexpr int LDQ = HD + 8, LDK = HD + 8, LDV = HD + 4, NBT = FA_BN / 8;
    constexpr int ONT = HD / 8, NC = ONT < 8 ? ONT : 8;
    constexpr int SKC = 2; /* k16-steps of S per fresh partial (32 of hd) */
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const fa_work w = fa_work_of(a, QH);
    const int BP = w.BP, kvh = w.kvh, h0 = w.h0, r0 = w.r0, rows = w.rows, pos0 = w.pos0, maxpos = w.maxpos;
    const int *blocks = w.blocks, klo = w.klo, khi = w.khi;
    __half *Qh = reinterpret_cast<__half *>(fsm), *Ql = Qh + FA_ROWS * LDQ;
    float *Ks = reinterpret_cast<float *>(Ql + FA_ROWS * LDQ), *Vs = Ks + FA_BN * LDK;
    constexpr int LK16 = HD + 8, LV16 = FA_BN + 8; /* S16: halves per K row, per V (dim) row */
    __half *K16 = Ql + FA_ROWS * LDQ, *V16 = K16 + 2 * FA_BN * LK16;
    /* BK: V [2][2][HD][FB_VLD], then the K and V barriers */
    uint64_t *bar = reinterpret_cast<uint64_t *>(V16 + 2 * 2 * HD * FB_VLD);
    unsigned par_k = 0, par_v = 0;

    if constexpr (BK) {
        bk_init_block(bar, 2);
        if (tid == 0) fb_load_k<HD>(K16, a, blocks, kvh, klo, khi, bar);
    } else {
        if constexpr (S16)
            fh_load_k16<HD>(K16, a, blocks, kvh, klo, khi);
        else
            fh_load_kv<HD, LDK>(Ks, a.kpool, a, blocks, kvh, klo, khi);
        fa_commit();
    }
    for (int i = tid; i < FA_ROWS * HD / 2; i += blockDim.x) {
        int m = i / (HD / 2), c = 2 * (i % (HD / 2)), p = m % BP;
        float2 x = make_float2(0.0f, 0.0f);
        if (p < rows)
            x = *reinterpret_cast<const float2 *>(a.qkv + (size_t)(r0 + p) * a.ld +
                                                  (size_t)(h0 + m / BP) * 2 * HD + c);
        uint32_t hi, lo;
        h2_split(x.x, x.y, hi, lo);
        *reinterpret_cast<uint32_t *>(Qh + m * LDQ + c) = hi;
        *reinterpret_cast<uint32_t *>(Ql + m * LDQ + c) = lo;
    }

    const int wph = 8 / QH, qi = warp / wph, off = (warp % wph) * 16, h = h0 + qi;
    const int live = off < rows;
    const int wmin = pos0 + off, wmax = pos0 + off + 15 < maxpos ? pos0 + off + 15 : maxpos;
    const int pa = pos0 + off + g < maxpos ? pos0 + off + g : maxpos;
    const int pb = pos0 + off + g + 8 < maxpos ? pos0 + off + g + 8 : maxpos;
    const __half *Qwh = Qh + (qi * BP + off) * LDQ, *Qwl = Ql + (qi * BP + off) * LDQ;
    const float scale = (float)(1.0 / sqrt((double)HD));

    float o[ONT][4];
#pragma unroll
    for (int n = 0; n < ONT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float ma = -INFINITY, mb = -INFINITY, la = 0.0f, lb = 0.0f;

    for (int c0 = klo; c0 <= khi; c0 += FA_BN) {
        if constexpr (BK) {
            bk_wait(bar, par_k);
            par_k ^= 1u;
        } else {
            fa_wait();
        }
        __syncthreads(); /* K of this tile (and Q) in place; every warp is done with the last tile's V */
        if constexpr (BK) {
            if (tid == 0) fb_load_v<HD>(V16, a, blocks, kvh, c0, khi, bar + 1);
        } else {
            if constexpr (S16)
                fh_load_v16<HD>(V16, a, blocks, kvh, c0, khi);
            else
                fh_load_kv<HD, LDV>(Vs, a.vpool, a, blocks, kvh, c0, khi);
            fa_commit();
        }
        const int act = live && c0 <= wmax;
        float s[NBT][4], ca = 1.0f, cb = 1.0f;
        if (act) {
#pragma unroll
            for (int n = 0; n < NBT; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
            for (int kc = 0; kc < HD / 16; kc += SKC) {
                float part[NBT][4];
#pragma unroll
                for (int n = 0; n < NBT; n++) part[n][0] = part[n][1] = part[n][2] = part[n][3] = 0.0f;
#pragma unroll
                for (int ks = kc; ks < kc + SKC && ks < HD / 16; ks++) {
                    uint32_t ah[4], al[4];
                    if constexpr (S16) {
                        /* matrices: rows 0-7 / 8-15 x dims 0-7 / 8-15 of the k-step */
                        const int mo = ((lane >> 3) & 1) * 8 + (lane & 7), co = ks * 16 + (lane >> 4) * 8;
                        fh_ldsm4(ah, Qwh + mo * LDQ + co);
                        fh_ldsm4(al, Qwl + mo * LDQ + co);
#pragma unroll
                        for (int n = 0; n < NBT; n += 2) {
                            /* matrices: keys of n-tiles n, n + 1 x dims 0-7 / 8-15 */
                            const __half *kr = K16 + ((n + (lane >> 4)) * 8 + (lane & 7)) * LK16 + ks * 16 +
                                               ((lane >> 3) & 1) * 8;
                            uint32_t bh[4], bl[4];
                            fh_ldsm4(bh, kr);
                            fh_ldsm4(bl, kr + FA_BN * LK16);
                            fh_mma3<P>(part[n], ah, al, bh[0], bh[1], bl[0], bl[1]);
                            fh_mma3<P>(part[n + 1], ah, al, bh[2], bh[3], bl[2], bl[3]);
                        }
                    } else {
                        const int k = ks * 16 + 2 * t;
                        ah[0] = *reinterpret_cast<const uint32_t *>(Qwh + g * LDQ + k);
                        ah[1] = *reinterpret_cast<const uint32_t *>(Qwh + (g + 8) * LDQ + k);
                        ah[2] = *reinterpret_cast<const uint32_t *>(Qwh + g * LDQ + k + 8);
                        ah[3] = *reinterpret_cast<const uint32_t *>(Qwh + (g + 8) * LDQ + k + 8);
                        al[0] = *reinterpret_cast<const uint32_t *>(Qwl + g * LDQ + k);
                        al[1] = *reinterpret_cast<const uint32_t *>(Qwl + (g + 8) * LDQ + k);
                        al[2] = *reinterpret_cast<const uint32_t *>(Qwl + g * LDQ + k + 8);
                        al[3] = *reinterpret_cast<const uint32_t *>(Qwl + (g + 8) * LDQ + k + 8);
#pragma unroll
                        for (int n = 0; n < NBT; n++) {
                            const float *kr = Ks + (n * 8 + g) * LDK + k;
                            float2 k0 = *reinterpret_cast<const float2 *>(kr),
                                   k1 = *reinterpret_cast<const float2 *>(kr + 8);
                            uint32_t bh0, bl0, bh1, bl1;
                            h2_split(k0.x, k0.y, bh0, bl0);
                            h2_split(k1.x, k1.y, bh1, bl1);
                            fh_mma3<P>(part[n], ah, al, bh0, bh1, bl0, bl1);
                        }
                    }
                }
#pragma unroll
                for (int n = 0; n < NBT; n++)
#pragma unroll
                    for (int r = 0; r < 4; r++) s[n][r] += part[n][r];
            }
            const int mask = c0 + FA_BN - 1 > wmin;
            float xa = -INFINITY, xb = -INFINITY;
#pragma unroll
            for (int n = 0; n < NBT; n++)
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    int u = c0 + n * 8 + 2 * t + (r & 1);
                    float v = s[n][r] * scale;
                    if (mask && u > (r < 2 ? pa : pb)) v = -INFINITY;
                    s[n][r] = v;
                    if (r < 2)
                        xa = fmaxf(xa, v);
                    else
                        xb = fmaxf(xb, v);
                }
            xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, 1));
            xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, 2));
            xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, 1));
            xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, 2));
            float na = fmaxf(ma, xa), nb = fmaxf(mb, xb);
            float sa = na == -INFINITY ? 0.0f : na, sb = nb == -INFINITY ? 0.0f : nb, suma = 0.0f,
                  sumb = 0.0f;
            ca = expf(ma - sa), cb = expf(mb - sb);
#pragma unroll
            for (int n = 0; n < NBT; n++)
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    float p = expf(s[n][r] - (r < 2 ? sa : sb));
                    s[n][r] = p;
                    if (r < 2)
                        suma += p;
                    else
                        sumb += p;
                }
            la = la * ca + suma, lb = lb * cb + sumb;
            ma = na, mb = nb;
        }
        if constexpr (BK) {
            bk_wait(bar + 1, par_v);
            par_v ^= 1u;
            if (c0 + FA_BN - 1 > khi) fb_zero_v<HD>(V16, c0, khi);
        } else {
            fa_wait();
        }
        __syncthreads(); /* V of this tile landed; every warp is done with K */
        if constexpr (BK) {
            if (c0 + FA_BN <= khi && tid == 0) fb_load_k<HD>(K16, a, blocks, kvh, c0 + FA_BN, khi, bar);
        } else {
            if (c0 + FA_BN <= khi) {
                if constexpr (S16)
                    fh_load_k16<HD>(K16, a, blocks, kvh, c0 + FA_BN, khi);
                else
                    fh_load_kv<HD, LDK>(Ks, a.kpool, a, blocks, kvh, c0 + FA_BN, khi);
            }
            fa_commit();
        }
        if (act) {
            /* O = O c + P V: the k16 A operand is the accumulators of S's n-tiles 2j and 2j + 1 as they lie
             * (keys 2t, 2t + 1 and 8 + 2t, 9 + 2t of the 16) */
#pragma unroll
            for (int dc = 0; dc < ONT; dc += NC) {
                float part[NC][4];
#pragma unroll
                for (int n = 0; n < NC; n++) part[n][0] = part[n][1] = part[n][2] = part[n][3] = 0.0f;
#pragma unroll
                for (int j = 0; j < NBT / 2; j++) {
                    uint32_t ah[4], al[4];
                    h2_split(s[2 * j][0], s[2 * j][1], ah[0], al[0]);
                    h2_split(s[2 * j][2], s[2 * j][3], ah[1], al[1]);
                    h2_split(s[2 * j + 1][0], s[2 * j + 1][1], ah[2], al[2]);
                    h2_split(s[2 * j + 1][2], s[2 * j + 1][3], ah[3], al[3]);
                    if constexpr (S16) {
#pragma unroll
                        for (int n = 0; n < NC; n += 2) {
                            /* matrices: dims of n-tiles n, n + 1 x keys 0-7 / 8-15 of the k-step (BK: of
                             * block j of the tile) */
                            const int dr = (dc + n + (lane >> 4)) * 8 + (lane & 7),
                                      ko = ((lane >> 3) & 1) * 8;
                            const __half *w =
                                BK ? V16 + (j * HD + dr) * FB_VLD + ko : V16 + dr * LV16 + j * 16 + ko;
                            uint32_t bh[4], bl[4];
                            fh_ldsm4(bh, w);
                            fh_ldsm4(bl, w + (BK ? 2 * HD * FB_VLD : HD * LV16));
                            fh_mma3<P>(part[n], ah, al, bh[0], bh[1], bl[0], bl[1]);
                            fh_mma3<P>(part[n + 1], ah, al, bh[2], bh[3], bl[2], bl[3]);
                        }
                    } else {
                        const float *v0 = Vs + (j * 16 + 2 * t) * LDV + dc * 8 + g;
#pragma unroll
                        for (int n = 0; n < NC; n++) {
                            uint32_t bh0, bl0, bh1, bl1;
                            h2_split(v0[n * 8], v0[LDV + n * 8], bh0, bl0);
                            h2_split(v0[8 * LDV + n * 8], v0[9 * LDV + n * 8], bh1, bl1);
                            fh_mma3<P>(part[n], ah, al, bh0, bh1, bl0, bl1);
                        }
                    }
                }
#pragma unroll
                for (int n = 0; n < NC; n++) {
                    o[dc + n][0] = fmaf(o[dc + n][0], ca, part[n][0]);
                    o[dc + n][1] = fmaf(o[dc + n][1], ca, part[n][1]);
                    o[dc + n][2] = fmaf(o[dc + n][2], cb, part[n][2]);
                    o[dc + n][3] = fmaf(o[dc + n][3], cb, part[n][3]);
                }
            }
        }
    }
    if constexpr (!BK) fa_wait(); /* (BK: every copy issued was awaited) */
    if (!live) return;
    fa_finish<HD, false>(a, w, h, off, g, t, o, la, lb, ma, mb);
}

/* ---- fast mode (cu_attn_args.fast; CINFER_PRECISION=fast): one fp16 rounding of Q, K, V and P ----
 * What FlashAttention-2 does: S = Q K^T and O += P V each one m16n8k16 MMA with f32 accumulation, the online
 * softmax in f32 (exp2 on log2e-prescaled scores). fp16 rather than bf16: the same MMA rate and the same
 * range assumption as the exact form's hi halves (|x| < 65504: q and k are RMS-normed, P is in [0, 1], v rows
 * are activations), with 3 more significant bits (a rounding of 2^-11 instead of 2^-8). The pre-pass
 * (attn_kvf_kernel) rounds each pool block's keys and values once into the image a tile wants in shared
 * memory, per (block, KV head): K [16][hd + 8] (rows 16 bytes apart mod 128: ldmatrix rows in distinct
 * banks), then V [hd][16] (keys innermost; the two 16-byte halves of a dim row swapped when (d / 4) is odd,
 * so the 8 dim rows of an ldmatrix matrix hit distinct banks without padding). One bulk copy an image.
 * The kernel: the exact form's block (FA_ROWS rows = QH heads x positions, 8 warps x 16 rows, Q in shared
 * memory), FF_BN = 64 keys a tile (4 pool blocks), FF_NS = 2 stages: thread 0 issues tile i + 1 while the
 * warps compute tile i, each stage with a full barrier (the copies' bytes) and an empty one (a warp's arrival
 * when it is done reading), so no block-wide barrier runs per tile and the warps drift apart. Rows never see
 * other rows' values (keys past a row's position have P = 0 exactly; O is rescaled only by factors that are
 * exactly 1 for rows whose maximum did not move): a row's bits do not depend on its batch. */
#define FF_BN 64 /* keys per tile */
#define FF_NS 2  /* stages */

template <int HD> __host__ __device__ constexpr int ff_img_halves() { /* one (block, KV head) image */
    return FA_KVB * (HD + 8) + HD * FA_KVB;
}
template <int HD> constexpr size_t ff_smem_bytes() {
    return (size_t)FA_ROWS * (HD + 8) * 2 + (size_t)FF_NS * (FF_BN / FA_KVB) * ff_img_halves<HD>() * 2 +
           2 * FF_NS * 8;
}

/* every block of the launch's entries: the images (all 16 positions: the tiles never use keys past a span's
 * end unmasked, and an entry sharing the block writes the same halves) */
template <int HD> __global__ void attn_kvf_kernel(cu_attn_args a) {
    const int e = blockIdx.y, bi = blockIdx.x, L = a.meta.e_len[e] + a.meta.e_n[e];
    if (bi * FA_KVB >= L) return;
    constexpr int LK = HD + 8, KH = FA_KVB * LK;
    const int b = a.meta.blocks[a.meta.e_boff[e] + bi], W = a.Hkv * HD;
    __half *base = reinterpret_cast<__half *>(a.kv16);
    const float *kp = a.kpool + ((size_t)a.full * a.n_blocks + b) * FA_KVB * W,
                *vp = a.vpool + ((size_t)a.full * a.n_blocks + b) * FA_KVB * W;
    for (int i = threadIdx.x; i < W; i += blockDim.x) {
        const int kvh = i / HD, d = i % HD;
        __half *img = base + ((size_t)b * a.Hkv + kvh) * ff_img_halves<HD>();
        /* the 32 loads before any store (the image may alias the pool for the compiler: each load waited for
         * the store before it): 34 -> 15 us a 4B layer at 4096 rows (ncu, H200 calls 4 and 5) */
        float kx[FA_KVB], vx[FA_KVB];
#pragma unroll
        for (int j = 0; j < FA_KVB; j++) kx[j] = kp[(size_t)j * W + i], vx[j] = vp[(size_t)j * W + i];
        __align__(16) __half v[FA_KVB];
#pragma unroll
        for (int j = 0; j < FA_KVB; j++) {
            img[j * LK + d] = __float2half_rn(kx[j]);
            v[j] = __float2half_rn(vx[j]);
        }
        uint4 *dv = reinterpret_cast<uint4 *>(img + KH + d * FA_KVB);
        const int sw = (d >> 2) & 1;
        dv[sw] = *reinterpret_cast<uint4 *>(v), dv[sw ^ 1] = *reinterpret_cast<uint4 *>(v + 8);
    }
}

__device__ __forceinline__ void ff_bar_init(uint64_t *bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bk_sa(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void ff_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bk_sa(bar)) : "memory");
}
__device__ __forceinline__ uint32_t ff_h2(float x, float y) { /* x in the low half: the lower k index */
    __half2 h = __floats2half2_rn(x, y);
    return *reinterpret_cast<uint32_t *>(&h);
}

__device__ __forceinline__ float ff_ex2(float x) { /* 2^x, flushing subnormal results (P < 2^-126: 0) */
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* log2(e) / sqrt(hd) is folded into Q before its rounding (scores come out in log2 units), the masked and
 * plain tiles' softmax run apart, P = ex2.approx.ftz, one reciprocal of l a row (H200 call 3, 4B layer at 4096
 * rows 0.828 -> 0.790 ms, 32k chunk 7.06 -> 6.71 ms). Tried and removed: a lazy maximum, moved only when a
 * tile's exceeded it by 2^8 so that O's rescale skips most tiles (call 4: 0.717 vs 0.720 ms); warp pairs
 * sharing 32 rows, each S over half the keys and O over half the dims (~100 instead of 144 ldmatrix a warp a
 * tile; call 5: 4B layer 0.725 vs 0.708 / 0.726 ms, 27B 1.07 vs 1.03, only the 32k chunk faster, 6.4 vs 6.7:
 * the kernel waits on MMA and ldmatrix latencies with two warps a scheduler, not on shared-memory bandwidth) */
template <int HD>
__global__ void __launch_bounds__(256, 1) attn_ff_kernel(cu_attn_args a, int QH) {
    extern __shared__ __align__(16) float fsm[];
    constexpr int LDQ = HD + 8, LK = HD + 8, KH = FA_KVB * LK, IMG = ff_img_halves<HD>();
    constexpr int NBT = FF_BN / 8, ONT = HD / 8, NB = FF_BN / FA_KVB, STG = NB * IMG;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const fa_work w = fa_work_of(a, QH);
    const int BP = w.BP, kvh = w.kvh, h0 = w.h0, r0 = w.r0, rows = w.rows, pos0 = w.pos0, maxpos = w.maxpos;
    const int *blocks = w.blocks, klo = w.klo, khi = w.khi;
    const int ntile = (khi - klo) / FF_BN + 1;
    __half *Q = reinterpret_cast<__half *>(fsm), *KV = Q + FA_ROWS * LDQ;
    uint64_t *full = reinterpret_cast<uint64_t *>(KV + FF_NS * STG), *empty = full + FF_NS;
    const __half *img0 = reinterpret_cast<const __half *>(a.kv16);

    /* tile i into stage i % FF_NS (thread 0): the images of its blocks up to khi */
    auto issue = [&](int i) {
        const int s = i % FF_NS, c0 = klo + i * FF_BN, nb = (khi - c0) / FA_KVB + 1 < NB ? (khi - c0) / FA_KVB + 1
                                                                                        : NB;
        bk_fence();
        bk_expect(full + s, (unsigned)(nb * IMG * 2));
        for (int j = 0; j < nb; j++)
            bk_copy(KV + s * STG + j * IMG, img0 + ((size_t)blocks[c0 / FA_KVB + j] * a.Hkv + kvh) * IMG,
                    IMG * 2u, full + s);
    };
    if (tid == 0) {
        for (int s = 0; s < FF_NS; s++) ff_bar_init(full + s, 1), ff_bar_init(empty + s, 8);
        bk_init_fence();
    }
    __syncthreads();
    if (tid == 0)
        for (int i = 0; i < FF_NS - 1 && i < ntile; i++) issue(i);
    /* Q rounded into shared memory: a thread's QN pairs in batches of up to 32 loads in flight (one loop
     * iteration a load waited for each pair: ~64 memory latencies, ~50 us a block, H200 call 2) */
    const float sl2 = (float)(1.4426950408889634 / sqrt((double)HD)); /* log2(e) / sqrt(hd) */
    constexpr int QN = FA_ROWS * HD / 2 / 256, QB = QN < 32 ? QN : 32;
    for (int b0 = 0; b0 < QN; b0 += QB) {
        float2 x[QB];
#pragma unroll
        for (int k = 0; k < QB; k++) {
            const int i = tid + (b0 + k) * 256, m = i / (HD / 2), c = 2 * (i % (HD / 2)), p = m % BP;
            x[k] = make_float2(0.0f, 0.0f);
            if (p < rows)
                x[k] = *reinterpret_cast<const float2 *>(a.qkv + (size_t)(r0 + p) * a.ld +
                                                         (size_t)(h0 + m / BP) * 2 * HD + c);
        }
#pragma unroll
        for (int k = 0; k < QB; k++) {
            const int i = tid + (b0 + k) * 256, m = i / (HD / 2), c = 2 * (i % (HD / 2));
            x[k].x *= sl2, x[k].y *= sl2;
            *reinterpret_cast<uint32_t *>(Q + m * LDQ + c) = ff_h2(x[k].x, x[k].y);
        }
    }
    __syncthreads();

    const int wph = 8 / QH, qi = warp / wph, off = (warp % wph) * 16, h = h0 + qi;
    const int live = off < rows;
    const int wmin = pos0 + off, wmax = pos0 + off + 15 < maxpos ? pos0 + off + 15 : maxpos;
    const int pa = pos0 + off + g < maxpos ? pos0 + off + g : maxpos;
    const int pb = pos0 + off + g + 8 < maxpos ? pos0 + off + g + 8 : maxpos;
    /* a row's last key: its position, or the span's end */
    const int la_k = pa < khi ? pa : khi, lb_k = pb < khi ? pb : khi, wlim = wmin < khi ? wmin : khi;
    const __half *Qw = Q + (qi * BP + off) * LDQ;
    /* ldmatrix lane offsets (halves): Q rows 0-7 / 8-15 x dims 0-7 / 8-15 of a k-step; K keys of n-tiles n,
     * n + 1 x dims 0-7 / 8-15; V dims of n-tiles n, n + 1 x keys 0-7 / 8-15 (swizzled as the pre-pass wrote) */
    const int qo = (((lane >> 3) & 1) * 8 + (lane & 7)) * LDQ + (lane >> 4) * 8;
    const int kr = (lane >> 4) * 8 + (lane & 7), ko = ((lane >> 3) & 1) * 8;
    const int vr = (lane >> 4) * 8 + (lane & 7), vk = (lane >> 3) & 1;

    float o[ONT][4];
#pragma unroll
    for (int n = 0; n < ONT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float ma = -INFINITY, mb = -INFINITY, la = 0.0f, lb = 0.0f;

    for (int i = 0; i < ntile; i++) {
        const int s = i % FF_NS, c0 = klo + i * FF_BN;
        if (tid == 0 && i + FF_NS - 1 < ntile) {
            const int k = i + FF_NS - 1;
            if (k >= FF_NS) bk_wait(empty + k % FF_NS, (unsigned)((k / FF_NS - 1) & 1));
            issue(k);
        }
        bk_wait(full + s, (unsigned)((i / FF_NS) & 1));
        __syncwarp(); /* the lanes' spins ended apart: ldmatrix and mma.sync want the warp whole */
        const __half *St = KV + s * STG;
        if (c0 + FF_BN - 1 > khi) {
            /* the last tile, past khi: V zeroed (P is 0 there, but 0 x NaN is not; blocks past khi were not
             * loaded at all). Block-uniform: every thread comes here once, after the copies landed */
            __half *Vz = KV + s * STG;
            for (int x = tid; x < NB * HD * FA_KVB; x += blockDim.x) {
                const int jb = x / (HD * FA_KVB), d = (x / FA_KVB) % HD, k = x % FA_KVB;
                if (c0 + jb * FA_KVB + k > khi)
                    Vz[jb * IMG + KH + d * FA_KVB + ((((k >> 3) ^ (d >> 2)) & 1) << 3) + (k & 7)] =
                        __float2half(0.0f);
            }
            __syncthreads();
        }
        if (live && c0 <= wmax) {
            float sc[NBT][4];
#pragma unroll
            for (int n = 0; n < NBT; n++) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < HD / 16; ks++) {
                uint32_t aq[4];
                fh_ldsm4(aq, Qw + qo + ks * 16);
#pragma unroll
                for (int n = 0; n < NBT; n += 2) {
                    const int key = n * 8 + kr; /* within the tile: block key / 16 */
                    uint32_t b[4];
                    fh_ldsm4(b, St + (key >> 4) * IMG + (key & 15) * LK + ks * 16 + ko);
                    fh_mma(sc[n], aq, b[0], b[1]);
                    fh_mma(sc[n + 1], aq, b[2], b[3]);
                }
            }
            const int mask = c0 + FF_BN - 1 > wlim;
            float xa = -INFINITY, xb = -INFINITY;
            if (mask) {
#pragma unroll
                for (int n = 0; n < NBT; n++)
#pragma unroll
                    for (int r = 0; r < 4; r++) {
                        int u = c0 + n * 8 + 2 * t + (r & 1);
                        float v = sc[n][r];
                        if (u > (r < 2 ? la_k : lb_k)) v = -INFINITY;
                        sc[n][r] = v;
                        if (r < 2)
                            xa = fmaxf(xa, v);
                        else
                            xb = fmaxf(xb, v);
                    }
            } else {
#pragma unroll
                for (int n = 0; n < NBT; n++) {
                    xa = fmaxf(xa, fmaxf(sc[n][0], sc[n][1]));
                    xb = fmaxf(xb, fmaxf(sc[n][2], sc[n][3]));
                }
            }
            xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, 1));
            xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, 2));
            xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, 1));
            xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, 2));
            const float na = fmaxf(ma, xa), nb = fmaxf(mb, xb);
            const float sa = na == -INFINITY ? 0.0f : na, sb = nb == -INFINITY ? 0.0f : nb;
            /* exactly 1 where the maximum stayed (the warp's rescale then leaves the row's bits alone) */
            const float ca = ma == sa ? 1.0f : ff_ex2(ma - sa), cb = mb == sb ? 1.0f : ff_ex2(mb - sb);
            float suma = 0.0f, sumb = 0.0f;
#pragma unroll
            for (int n = 0; n < NBT; n++) {
                sc[n][0] = ff_ex2(sc[n][0] - sa), sc[n][1] = ff_ex2(sc[n][1] - sa);
                sc[n][2] = ff_ex2(sc[n][2] - sb), sc[n][3] = ff_ex2(sc[n][3] - sb);
                suma += sc[n][0] + sc[n][1], sumb += sc[n][2] + sc[n][3];
            }
            la = la * ca + suma, lb = lb * cb + sumb;
            ma = na, mb = nb;
            /* O rescaled only when some row's maximum moved (ca, cb are then exactly 1 elsewhere) */
            if (__any_sync(0xffffffffu, ca != 1.0f || cb != 1.0f)) {
#pragma unroll
                for (int n = 0; n < ONT; n++) o[n][0] *= ca, o[n][1] *= ca, o[n][2] *= cb, o[n][3] *= cb;
            }
#pragma unroll
            for (int j = 0; j < NB; j++) {
                /* the k16 A operand: the probabilities of n-tiles 2j, 2j + 1 as they lie (block j's keys) */
                uint32_t ap[4];
                ap[0] = ff_h2(sc[2 * j][0], sc[2 * j][1]);
                ap[1] = ff_h2(sc[2 * j][2], sc[2 * j][3]);
                ap[2] = ff_h2(sc[2 * j + 1][0], sc[2 * j + 1][1]);
                ap[3] = ff_h2(sc[2 * j + 1][2], sc[2 * j + 1][3]);
                const __half *Vb = St + j * IMG + KH;
#pragma unroll
                for (int n = 0; n < ONT; n += 2) {
                    const int d = n * 8 + vr;
                    uint32_t b[4];
                    fh_ldsm4(b, Vb + d * FA_KVB + ((vk ^ (d >> 2)) & 1) * 8);
                    fh_mma(o[n], ap, b[0], b[1]);
                    fh_mma(o[n + 1], ap, b[2], b[3]);
                }
            }
        }
        __syncwarp();
        if (lane == 0) ff_arrive(empty + s);
    }
    if (!live) return;
    fa_finish<HD, true>(a, w, h, off, g, t, o, la, lb, ma, mb);
}

static int fa_kv16_ok[9];  /* by hd / 32: the S16 kernels' shared memory fits (cu_attn_tc_init) */
static int fa_bulk_ok[9];  /* by hd / 32: the BK kernels too (hd 128, 256) */
static int fa_bulk_on = 1; /* CINFER_CUDA_ATTN_BULK, default on (read by cu_attn_tc_init) */
static int fa_fast_ok[9];  /* by hd / 32: attn_ff_kernel's shared memory fits */

extern "C" int cu_attn_kv16_ok(int hd) {
    return hd > 0 && hd % 32 == 0 && hd / 32 < 9 && fa_kv16_ok[hd / 32];
}

extern "C" int cu_attn_fast_ok(int hd) {
    return hd > 0 && hd % 32 == 0 && hd / 32 < 9 && fa_fast_ok[hd / 32];
}

static int fa_bulk(int hd) {
    return fa_bulk_on && cu_attn_kv16_ok(hd) && fa_bulk_ok[hd / 32];
}

extern "C" size_t cu_attn_kv16_bytes(int n_blocks, int Hkv, int hd) {
    if (fa_bulk(hd)) /* the tile images (attn_kvb_kernel) */
        return (size_t)n_blocks * (size_t)Hkv * (size_t)(2 * FA_KVB * (hd + 8) + 2 * hd * FB_VLD) * 2;
    return (size_t)n_blocks * FA_KVB * (size_t)Hkv * (size_t)hd * 2 * 4;
}

/* query heads per block: the largest power of two up to FA_MAXQH dividing the GQA ratio */
static int fa_qh(int Hq, int Hkv) {
    int G = Hq / Hkv, q = FA_MAXQH;
    while (G % q) q /= 2;
    return q;
}

extern "C" int cu_attn_tc_rows(int Hq, int Hkv) {
    return Hkv > 0 && Hq % Hkv == 0 ? FA_ROWS / fa_qh(Hq, Hkv) : CU_ATTN_TILE;
}

extern "C" int cu_attn_tc_split(int Hq, int Hkv, int hd, int n, int keys, int min_span, int *ns) {
    static int n_sm = 0;
    *ns = 1;
    if (!n_sm) {
        int dev = 0, v = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || v <= 0)
            return 0;
        n_sm = v;
    }
    if (Hkv <= 0 || Hq % Hkv || n <= 0) return 0;
    int QH = fa_qh(Hq, Hkv), BP = FA_ROWS / QH;
    int blocks = (n + BP - 1) / BP * (Hq / QH), target = n_sm * (hd >= 128 ? 1 : 2);
    if (2 * blocks > target) return 0; /* the entry fills half the device alone */
    if (min_span < FA_BN) min_span = FA_BN;
    int want = target / blocks, most = keys / min_span;
    if (want > most) want = most;
    if (want < 2) return 0;
    int span = (keys + want - 1) / want;
    span = (span + FA_BN - 1) / FA_BN * FA_BN;
    *ns = (keys - 1) / span + 1;
    return *ns > 1 ? span : 0;
}

template <int HD, int P, bool S16, bool BK = false> static int fa_attr1(int optin) {
    size_t sm = fh_smem_bytes<HD, S16, BK>();
    return sm <= (size_t)optin &&
           cudaFuncSetAttribute(attn_fh_kernel<HD, P, S16, BK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)sm) == cudaSuccess;
}
template <int HD> static int fa_attr(int optin) {
    if (!fa_attr1<HD, 3, false>(optin) || !fa_attr1<HD, 1, false>(optin)) return 0;
    fa_fast_ok[HD / 32] = ff_smem_bytes<HD>() <= (size_t)optin &&
                          cudaFuncSetAttribute(attn_ff_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)ff_smem_bytes<HD>()) == cudaSuccess;
    /* the split-once form where it fits (cu_attn_kv16_ok) */
    fa_kv16_ok[HD / 32] = fa_attr1<HD, 3, true>(optin) && fa_attr1<HD, 1, true>(optin);
    if constexpr (HD >= 128)
        fa_bulk_ok[HD / 32] =
            fa_kv16_ok[HD / 32] && fa_attr1<HD, 3, true, true>(optin) && fa_attr1<HD, 1, true, true>(optin);
    return 1;
}

extern "C" int cu_attn_tc_init(int hd) {
    int dev = 0, optin = 0;
    const char *bk = getenv("CINFER_CUDA_ATTN_BULK"); /* "0": the kv16 tiles by cp.async (hd 128 / 256) */
    fa_bulk_on = !(bk && !strcmp(bk, "0"));
    if (cudaGetDevice(&dev) != cudaSuccess) return 0;
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    switch (hd) {
    case 32:
        return fa_attr<32>(optin);
    case 64:
        return fa_attr<64>(optin);
    case 128:
        return fa_attr<128>(optin);
    case 256:
        return fa_attr<256>(optin);
    default:
        return 0; /* 512: Q, K and V tiles would not fit; the scalar tiles serve it */
    }
}

template <int HD, bool S16, bool BK = false>
static void fa_launch2(cu_ctx *c, const cu_attn_args *a, dim3 grid, int QH) {
    if (cu_tf32_passes() == 1)
        attn_fh_kernel<HD, 1, S16, BK><<<grid, 256, fh_smem_bytes<HD, S16, BK>(), c->stream>>>(*a, QH);
    else
        attn_fh_kernel<HD, 3, S16, BK><<<grid, 256, fh_smem_bytes<HD, S16, BK>(), c->stream>>>(*a, QH);
}

template <int HD> static void fa_launch(cu_ctx *c, const cu_attn_args *a) {
    int QH = fa_qh(a->Hq, a->Hkv);
    dim3 grid((unsigned)(a->Hq / QH), (unsigned)(a->split.work ? a->split.n_work : a->n_tiles));
    if (a->fast && a->kv16 && fa_fast_ok[HD / 32]) {
        attn_kvf_kernel<HD><<<dim3((unsigned)a->kv16_nb, (unsigned)a->kv16_NE), 256, 0, c->stream>>>(*a);
        attn_ff_kernel<HD><<<grid, 256, ff_smem_bytes<HD>(), c->stream>>>(*a, QH);
        return;
    }
    if constexpr (HD >= 128) {
        if (a->kv16 && fa_bulk(HD)) {
            attn_kvb_kernel<<<dim3((unsigned)a->kv16_nb, (unsigned)a->kv16_NE), 256, 0, c->stream>>>(*a);
            fa_launch2<HD, true, true>(c, a, grid, QH);
            return;
        }
    }
    if (a->kv16)
        attn_kv16_kernel<<<dim3((unsigned)a->kv16_nb, (unsigned)a->kv16_NE), 256, 0, c->stream>>>(*a);
    if (a->kv16)
        fa_launch2<HD, true>(c, a, grid, QH);
    else
        fa_launch2<HD, false>(c, a, grid, QH);
}

extern "C" void cu_attn_tiled_tc(cu_ctx *c, const cu_attn_args *a) {
    if (a->n_tiles <= 0) return;
    switch (a->hd) {
    case 32:
        fa_launch<32>(c, a);
        break;
    case 64:
        fa_launch<64>(c, a);
        break;
    case 128:
        fa_launch<128>(c, a);
        break;
    case 256:
        fa_launch<256>(c, a);
        break;
    default:
        break; /* refused by cu_attn_tc_init */
    }
}

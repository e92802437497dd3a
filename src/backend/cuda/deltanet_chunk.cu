/* deltanet_chunk.cu — the chunked Gated DeltaNet prefill (spec §4, WY/UT form, chunk 64 on the absolute grid)
 * in phases, so that what does not depend on the state runs in parallel over every chunk of the batch and
 * only the state's recurrence walks the chunks in order (the split of FLA's chunk_gated_delta_rule; written
 * here from the spec). Selected by cu_gdn_args.tc (the default: CINFER_CUDA_PREFILL=tc|gdn); a batch the
 * scratch cannot hold runs deltanet.cu's scalar chunked kernel. (Session 4's one-kernel form, deltanet_tc.cu,
 * a block per column block walking all chunks with the Gram matrices recomputed per block, 4.6x slower and
 * the same sums, is gone.)
 *
 * Every product on the tensor cores, TF32 hi + lo, three MMAs, runs of 32 of K in fresh accumulators
 * (tf32x3.cuh), the CPU's factor expressions and order of the sums. Two forms (cu_gdn_args.chunk_dt): 0
 * ("stage", session 4's) on WMMA with each chunk's inputs staged in shared memory one chunk ahead, and 1
 * ("mma6"; 2, "img", the default since session 7: the same on a scratch laid out as the pass's shared memory,
 * staged by bulk copies, pass 0.43 -> 0.32 ms a 4B layer) on mma.sync m16n8k8 with fragments in registers,
 * the state in registers, Dekker's split, the prep's products and its inverse's off-diagonal blocks on
 * mma.sync too, compiled for dk = 128 where dk is 128. What the H200 showed (one 4B layer over 4096 rows,
 * cuda_deltanet_prefill_speed): stage 1.67 ms (prep 0.48 + pass 0.93), mma6 0.99 (0.32 + 0.42). Session 5's
 * other forms (L2 fragments 16 / 32, runs of K side by side "il", padded rows "pad", the mma.sync steps mma /
 * mma2 / mma3 / mma4, the pass scaling Q and K itself mma7, the output in its own pass mma5) all measured
 * slower and are gone. In the mma pass a chunk costs ~14k cycles: 6.5k for D and Qg S, 2.5k for O and S,
 * ~4.8k issuing and waiting for the next chunk's 120 KB of W, Qg, Kf, QK and U (the four column blocks of a
 * head each load the same W, Qg, Kf and QK: a cluster multicast would load them once).
 *
 *   plan  (one thread): the chunk table of the batch — (entry, first row, length) per chunk of every entry
 * that takes the chunked form, the first chunk of a prompt continuing a sequence cut at the 64-grid.
 *   prep  (a block per (chunk, value head), all chunks at once): the decay cumsum gam, A = strictly lower
 * beta_r e^(g_r - g_s) K K^T, T = (I + A)^-1 by substitution, and into the scratch
 *       W  = T diag(beta e^g) K   [64][dk]     U  = T diag(beta) V   [64][dv]
 *       Qg = diag(e^g) Q          [64][dk]     Kf = diag(e^(g_L - g)) K [64][dk]
 *       QK = e^(g_r - g_s) Q K^T (s <= r)   [64][64],  e^(g_L)
 * (rows past the chunk's length are zeros in all of them).
 *   state (a block per (entry, value head, 32 value columns), chunks in order, S's column slice from the slot
 * and back): D = U - W S,  O = Qg S + QK D,  S <- e^(g_L) S + Kf^T D.
 */
#include <cuda_fp16.h>
#include <cuda_pipeline.h>
#include <mma.h>

#include "backend/cuda/bulk.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/tf32x3.cuh"

using namespace nvcuda;

/* diagnostics (cu_gdn_args.chunk_prof): thread 0 of one block adds the cycles since the last mark to
 * counter m, in registers, written out at the end */
#define CK_PROF_DECL(on)                                                                                     \
    long long ckp[8] = {0, 0, 0, 0, 0, 0, 0, 0}, ckp_last = clock64();                                       \
    const bool ckp_on = (on)
#define CK_MARK(m)                                                                                           \
    if (ckp_on) {                                                                                            \
        long long now_ = clock64();                                                                          \
        ckp[m] += now_ - ckp_last;                                                                           \
        ckp_last = now_;                                                                                     \
    }
#define CK_PROF_OUT(base)                                                                                    \
    if (ckp_on)                                                                                              \
        for (int m_ = 0; m_ < 8; m_++) a.chunk_prof[(base) + m_] = ckp[m_];

#define CK_CH  64 /* chunk length, = GDN_CHUNK */
#define CK_GLD (CK_CH + 4)

/* Dekker's split (FP32 adds at full rate instead of two conversions): hi = x rounded to 11 significant bits
 * (a TF32 value, as its bits), lo = x - hi exactly (13 bits: the tensor cores keep its top 11, x to ~2^-22
 * as with tf32 conversions); rounded operations, never contracted into an FMA */
static __device__ __forceinline__ void ckm_split(float x, uint32_t &hi, uint32_t &lo) {
    float t = __fmul_rn(x, 8193.0f), h = __fsub_rn(t, __fsub_rn(t, x));
    hi = __float_as_uint(h);
    lo = __float_as_uint(__fsub_rn(x, h));
}

/* d += A B, m16n8k8 TF32: A 16x8 (a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4)), B 8x8 (b0 (k
 * t, n g), b1 (k t + 4, n g)), D 16x8 (d0 (g, 2t), d1 (g, 2t + 1), d2 (g + 8, 2t), d3 (g + 8, 2t + 1)); g =
 * lane / 4, t = lane % 4 */
static __device__ __forceinline__ void ckm_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* acc[n] += A[16][K] B[K][n0 + n*8 .. + 7] for the first nc (<= 4) n-tiles, with tc_mma's split of both
 * operands (on the fly) and its runs of TC_KC: the prep's products on mma.sync. A at A[m * lda + k]; B at
 * B[k * ldb + n] or (BT) B[n * ldb + k], n counted from the unit's first column. */
template <bool BT>
static __device__ __forceinline__ void ckm_tiles(float (&acc)[4][4], int nc, const float *A, int lda,
                                                 const float *B, int ldb, int K, int g, int t) {
    for (int k0 = 0; k0 < K; k0 += TC_KC) {
        float p[4][4];
#pragma unroll
        for (int n = 0; n < 4; n++) p[n][0] = p[n][1] = p[n][2] = p[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < TC_KC; kk += 8) {
            int k = k0 + kk;
            if (k < K) {
                uint32_t ah[4], al[4];
                ckm_split(A[(size_t)g * lda + k + t], ah[0], al[0]);
                ckm_split(A[(size_t)(g + 8) * lda + k + t], ah[1], al[1]);
                ckm_split(A[(size_t)g * lda + k + t + 4], ah[2], al[2]);
                ckm_split(A[(size_t)(g + 8) * lda + k + t + 4], ah[3], al[3]);
#pragma unroll
                for (int n = 0; n < 4; n++)
                    if (n < nc) {
                        float x0 =
                            BT ? B[(size_t)(n * 8 + g) * ldb + k + t] : B[(size_t)(k + t) * ldb + n * 8 + g];
                        float x1 = BT ? B[(size_t)(n * 8 + g) * ldb + k + t + 4]
                                      : B[(size_t)(k + t + 4) * ldb + n * 8 + g];
                        uint32_t bh0, bl0, bh1, bl1;
                        ckm_split(x0, bh0, bl0);
                        ckm_split(x1, bh1, bl1);
                        ckm_mma(p[n], al, bh0, bh1);
                        ckm_mma(p[n], ah, bl0, bl1);
                        ckm_mma(p[n], ah, bh0, bh1);
                    }
            }
        }
#pragma unroll
        for (int n = 0; n < 4; n++)
#pragma unroll
            for (int r = 0; r < 4; r++) acc[n][r] += p[n][r];
    }
}

/* T = (I + A)^-1 of a chunk (A strictly lower triangular, f32 [64][CK_GLD] in shared memory), shared by the
 * exact prep (MM) and the fast one: */

/* column c of diagonal block base / 16 of T by substitution (one thread), the column in registers (unrolled):
 * the same fmaf chain as through T in shared memory, without its stores and loads between the steps */
static __device__ __forceinline__ void ck_diag_col(const float *Am, float *Tm, int base, int c) {
    float tc[16];
#pragma unroll
    for (int r = 0; r < 16; r++) {
        float v = r == c ? 1.0f : 0.0f;
#pragma unroll
        for (int s = 0; s < r; s++)
            if (s >= c) v = fmaf(-Am[(base + r) * CK_GLD + base + s], tc[s], v);
        tc[r] = v;
        Tm[(base + r) * CK_GLD + base + c] = v;
    }
}

/* a warp's 16-row product stored as f32 at dst, rows of stride ld (int or size_t: each caller's index
 * arithmetic), negated with NEG: the first nc (<= NT) of its m16n8 accumulators acc[n]; lane (g, t4) holds rows
 * g and g + 8, columns 2 t4 and 2 t4 + 1 of each n-tile */
template <bool NEG, int NT, int NA, class LD>
static __device__ __forceinline__ void ck_store_tiles(float *dst, LD ld, const float (&acc)[NA][4], int nc, int g,
                                                      int t4) {
#pragma unroll
    for (int n = 0; n < NT; n++)
        if (n < nc)
#pragma unroll
            for (int hh = 0; hh < 2; hh++)
                *(float2 *)(dst + (LD)(g + 8 * hh) * ld + n * 8 + 2 * t4) =
                    NEG ? make_float2(-acc[n][2 * hh], -acc[n][2 * hh + 1])
                        : make_float2(acc[n][2 * hh], acc[n][2 * hh + 1]);
}

/* the blocks below the diagonal (the diagonal ones done, those above zero) in three rounds on mma.sync, warp
 * j < bi taking X_j = sum_{m=j}^{bi-1} A_{bi,m} T_{m,j} (into X, f32 [3][16][16]), then T_{bi,j} = -T_{bi,bi}
 * X_j. Tiles is the 16 x 16 product, acc[n] (n < 2) += A[16][K] B[K][n*8 ..] (A at A[m * lda + k], B at B[k *
 * ldb + n]): the exact prep's TF32 x3 (ck_tiles_x3) or the fast one's single TF32 rounding (fk_tiles_1x); NA,
 * the n-tiles of its accumulator (ckm_tiles' holds 4, of which these products use 2). */
template <int NA, class Tiles>
static __device__ __forceinline__ void ck_inverse_rounds(const float *Am, float *Tm, float *X, int tid,
                                                         Tiles tiles) {
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    for (int bi = 1; bi < 4; bi++) {
        if (warp < bi) {
            float acc[NA][4] = {};
            tiles(acc, Am + bi * 16 * CK_GLD + warp * 16, CK_GLD, Tm + warp * 16 * CK_GLD + warp * 16, CK_GLD,
                  (bi - warp) * 16, g, t4);
            ck_store_tiles<false, 2>(X + warp * 256, 16, acc, 2, g, t4);
        }
        __syncthreads();
        if (warp < bi) {
            float acc[NA][4] = {};
            tiles(acc, Tm + bi * 16 * CK_GLD + bi * 16, CK_GLD, X + warp * 256, 16, 16, g, t4);
            ck_store_tiles<true, 2>(Tm + bi * 16 * CK_GLD + warp * 16, CK_GLD, acc, 2, g, t4);
        }
        __syncthreads();
    }
}

struct ck_tiles_x3 { /* the exact prep's products: TF32 x3 (ckm_tiles) */
    __device__ __forceinline__ void operator()(float (&acc)[4][4], const float *A, int lda, const float *B,
                                               int ldb, int K, int g, int t) const {
        ckm_tiles<false>(acc, 2, A, lda, B, ldb, K, g, t);
    }
};

/* floats of one (chunk, value head) in the scratch: W, Qg, Kf [64][dk], U [64][dv], QK [64][64], e^(g_L)
 * (padded to 8 floats: every array starts on 32 bytes, as WMMA loads want) */
/* IMG (cu_gdn_args.chunk_dt 2): the same arrays laid out as the mma pass's shared memory wants them, so a
 * chunk's staging is three bulk copies: [W | Qg] at rows of dk + 4, [Kf | QK] at rows of dk + 8 and 68, U as
 * dv / 32 column blocks of [64][40], e^(g_L) last */
static __host__ __device__ size_t ck_img_u(int dk) { /* U's offset */
    return 2 * (size_t)CK_CH * (dk + 4) + (size_t)CK_CH * (dk + 8) + (size_t)CK_CH * CK_GLD;
}
static __host__ __device__ size_t ck_img_misc(int dk, int dv) {
    return ck_img_u(dk) + (size_t)((dv + 31) / 32) * CK_CH * (32 + 8);
}
static __host__ __device__ size_t ck_stride(int dk, int dv) { /* either layout (IMG's is the longer) */
    size_t plain = 3 * (size_t)CK_CH * dk + (size_t)CK_CH * dv + (size_t)CK_CH * CK_CH + 8,
           img = ck_img_misc(dk, dv) + 8;
    return plain > img ? plain : img;
}

/* the chunk table after the float region: [0] chunks, [1 + 3k ..] (entry, first row, length) of chunk k,
 * [1 + 3 cap + e] the first chunk of entry e */
static __host__ __device__ int *ck_table(const cu_gdn_args &a) {
    return (int *)((float *)a.chunk_scr + (size_t)a.chunk_cap * a.Hv * ck_stride(a.dk, a.dv));
}

/* the entries the chunked form serves (the rest are recurrent_kernel's: decode tokens, speculative windows)
 */
static __device__ __forceinline__ bool ck_entry(const cu_gdn_args &a, int e) {
    int n = a.meta.e_n[e], pos0 = a.meta.e_len[e];
    return n > 0 && !(n == 1 && pos0 > 0) && !(a.has_spec && a.meta.e_spec[e]);
}

__global__ void ck_plan_kernel(cu_gdn_args a) {
    if (threadIdx.x) return;
    int *tab = ck_table(a), *ch = tab + 1, *first = tab + 1 + 3 * (size_t)a.chunk_cap, cnt = 0;
    for (int e = 0; e < a.NE; e++) {
        first[e] = cnt;
        if (!ck_entry(a, e)) continue;
        int n = a.meta.e_n[e], pos0 = a.meta.e_len[e];
        for (int c0 = 0, L; c0 < n; c0 += L, cnt++) {
            L = CK_CH - (pos0 + c0) % CK_CH;
            if (L > n - c0) L = n - c0;
            if (cnt < a.chunk_cap) ch[3 * cnt] = e, ch[3 * cnt + 1] = c0, ch[3 * cnt + 2] = L;
        }
    }
    tab[0] = cnt < a.chunk_cap ? cnt : a.chunk_cap; /* cu_gdn_chunked_phased launches only when all fit */
}

/* shared memory of prep in floats: K [64][dk + 4], Q then V [64][max(dk, dv) + 4], A, T [64][68], X [3][256],
 * gam, bet, egam, fl [64] */
static size_t ck_prep_smem_floats(int dk, int dv) {
    int xw = dk > dv ? dk : dv;
    return (size_t)CK_CH * (dk + 4) + (size_t)CK_CH * (xw + 4) + 2 * (size_t)CK_CH * CK_GLD + 3 * 256 +
           4 * CK_CH;
}

/* MM: false the products in WMMA ("stage"); true on mma.sync with Dekker's split, the scaling four at a time,
 * the diagonal blocks' substitution in registers and the off-diagonal blocks of T on mma.sync (the default).
 * DK: 0 dk from the arguments, 128 a constant (every run of K unrolled) */
template <int P, bool MM = false, int DK = 0, bool IMG = false>
__global__ void __launch_bounds__(256) ck_prep_kernel(cu_gdn_args a) {
    extern __shared__ __align__(128) float smp[];
    const int *tab = ck_table(a);
    int k = blockIdx.x, h = blockIdx.y;
    if (k >= tab[0]) return;
    int e = tab[1 + 3 * k], c0 = tab[2 + 3 * k], L = tab[3 + 3 * k];
    const int dk = DK ? DK : a.dk, dv = a.dv, tid = threadIdx.x, nt = blockDim.x, warp = tid >> 5,
              nw = nt >> 5;
    const int KLD = dk + 4, XLD = (dk > dv ? dk : dv) + 4;
    int r0 = a.meta.e_row0[e] + c0, kh = h / (a.Hv / a.Hk), kd = a.Hk * dk, C = a.C;
    float *Ks = smp, *Xs = Ks + CK_CH * KLD, *Am = Xs + CK_CH * XLD, *Tm = Am + CK_CH * CK_GLD;
    float *X = Tm + CK_CH * CK_GLD, *gam = X + 3 * 256, *bet = gam + CK_CH, *egam = bet + CK_CH,
          *fl = egam + CK_CH;
    float *W = (float *)a.chunk_scr + ((size_t)k * a.Hv + h) * ck_stride(dk, dv);
    /* row strides of W and Qg, Kf, QK, U (IMG: U by 32-column blocks of [64][40]) */
    const int WLD = IMG ? dk + 4 : dk, FLD = IMG ? dk + 8 : dk, QLD = IMG ? CK_GLD : CK_CH,
              ULD = IMG ? 40 : dv;
    float *Qg = W + CK_CH * WLD, *Kf = Qg + CK_CH * WLD;
    float *U = IMG ? W + ck_img_u(dk) : Kf + CK_CH * dk, *QK = IMG ? Kf + CK_CH * FLD : U + CK_CH * dv;
    float *misc = IMG ? W + ck_img_misc(dk, dv) : QK + CK_CH * CK_CH;
    CK_PROF_DECL(a.chunk_prof && k == 0 && h == 0 && tid == 0);
    /* Q and K rows by cp.async, 16 bytes a copy, all in flight at once (rows past L: zeros) */
    for (int idx = tid; idx < CK_CH * (dk / 4); idx += nt) {
        int t = idx / (dk / 4), i = idx % (dk / 4) * 4, z = t < L ? 0 : 16;
        const float *row = a.conv_out + (size_t)(r0 + (t < L ? t : 0)) * C + (size_t)kh * dk + i;
        __pipeline_memcpy_async(Xs + t * XLD + i, row, 16, z);
        __pipeline_memcpy_async(Ks + t * KLD + i, row + kd, 16, z);
    }
    __pipeline_commit();
    if (tid < L) { /* beta and g of every row at once; the sum below is one thread's, in the CPU's order */
        const float *bg = a.bg + (size_t)(r0 + tid) * 2 * a.Hv;
        gam[tid] = bg[a.Hv + h];
        bet[tid] = bg[h];
    }
    __pipeline_wait_prior(0);
    __syncthreads();
    CK_MARK(0);
    if (tid == 0) { /* the CPU's cumulative sum, in its order */
        float acc = 0.0f;
        for (int t = 0; t < L; t++) {
            acc += gam[t];
            gam[t] = acc;
        }
    }
    __syncthreads();
    float gl = gam[L - 1];
    __syncthreads();
    if (tid < CK_CH) { /* the CPU's factor expressions; rows past L contribute nothing */
        int t = tid;
        egam[t] = t < L ? expf(gam[t]) : 0.0f;
        fl[t] = t < L ? expf(gl - gam[t]) : 0.0f;
        if (t >= L) gam[t] = 0.0f, bet[t] = 0.0f;
        if (t == L - 1) misc[0] = egam[t];
    }
    __syncthreads();
    CK_MARK(1);
    /* A = K K^T, and Q K^T into T's place (free until the inversion): the 10 + 10 tiles on and below the
     * diagonal (the mask below zeroes the rest and writes the decayed Q K^T out), spread evenly over the
     * warps
     */
    if constexpr (MM) { /* mma.sync: warp w takes matrix w & 1, and of row tiles
                           3 - w / 4 and w / 4 the half (w / 2 & 1) of the 8-column tiles on and below the
                           diagonal: 5 n-tiles a warp, each A fragment split once for its row's tiles */
        const int lane = tid & 31, g = lane >> 2, t4 = lane & 3;
        for (int w = warp; w < 8; w += nw) {
            int which = w & 1, hb = (w >> 1) & 1, grp = w >> 2;
            for (int u = 0; u < 2; u++) {
                int mi = u ? grp : 3 - grp, nc = mi + 1, n0 = hb * nc;
                float acc[4][4] = {};
                ckm_tiles<true>(acc, nc, which ? Xs + mi * 16 * XLD : Ks + mi * 16 * KLD, which ? XLD : KLD,
                                Ks + n0 * 8 * KLD, KLD, dk, g, t4);
                ck_store_tiles<false, 4>((which ? Tm : Am) + mi * 16 * CK_GLD + n0 * 8, CK_GLD, acc, nc, g, t4);
            }
        }
    }
    for (int t = warp; t < (MM ? 0 : 20); t += nw) {
        int which = t / 10, u = t % 10, mi = u >= 6 ? 3 : u >= 3 ? 2 : u >= 1 ? 1 : 0;
        int ni = u - mi * (mi + 1) / 2;
        tc_facc acc;
        wmma::fill_fragment(acc, 0.0f);
        tc_mma<P, wmma::row_major, wmma::col_major>(acc, (which ? Xs + mi * 16 * XLD : Ks + mi * 16 * KLD),
                                                    which ? XLD : KLD, Ks + ni * 16 * KLD, KLD, dk);
        wmma::store_matrix_sync((which ? Tm : Am) + mi * 16 * CK_GLD + ni * 16, acc, CK_GLD,
                                wmma::mem_row_major);
    }
    __syncthreads();
    CK_MARK(2);
    for (int idx = tid; idx < CK_CH * CK_CH; idx += nt) {
        int r = idx / CK_CH, s = idx % CK_CH;
        float d = r < L && s <= r ? expf(gam[r] - gam[s]) : 0.0f;
        Am[r * CK_GLD + s] = s < r ? bet[r] * d * Am[r * CK_GLD + s] : 0.0f;
        QK[r * QLD + s] =
            s <= r ? d * Tm[r * CK_GLD + s] : 0.0f; /* tiles above the diagonal: never written */
    }
    if constexpr (MM) { /* four at a time: the same products, a quarter of the stores */
        for (int idx = tid; idx < CK_CH * (dk / 4); idx += nt) {
            int t = idx / (dk / 4), i = idx % (dk / 4) * 4;
            float4 q = *(const float4 *)(Xs + t * XLD + i), kk = *(const float4 *)(Ks + t * KLD + i);
            float eg = egam[t], f = fl[t];
            q.x *= eg, q.y *= eg, q.z *= eg, q.w *= eg;
            kk.x *= f, kk.y *= f, kk.z *= f, kk.w *= f;
            *(float4 *)(Qg + (size_t)t * WLD + i) = q;
            *(float4 *)(Kf + (size_t)t * FLD + i) = kk;
        }
    } else {
        for (int idx = tid; idx < CK_CH * dk; idx += nt) {
            int t = idx / dk, i = idx % dk;
            Qg[idx] = Xs[t * XLD + i] * egam[t];
            Kf[idx] = Ks[t * KLD + i] * fl[t];
        }
    }
    __syncthreads();
    CK_MARK(3);
    /* T = (I + A)^-1: thread (b, c) of the first 64 inverts column c of diagonal block b by substitution;
     * the rest zero the blocks above the diagonal and bring V in over Q (read by the Q K^T products above) */
    if (tid < 64) {
        int base = (tid >> 4) * 16, c = tid & 15;
        if constexpr (MM) {
            ck_diag_col(Am, Tm, base, c);
        } else {
            for (int r = 0; r < 16; r++) {
                float v = r == c ? 1.0f : 0.0f;
                for (int s = c; s < r; s++)
                    v = fmaf(-Am[(base + r) * CK_GLD + base + s], Tm[(base + s) * CK_GLD + base + c], v);
                Tm[(base + r) * CK_GLD + base + c] = v;
            }
        }
    }
    for (int idx = tid; idx < CK_CH * CK_CH; idx += nt) {
        int r = idx / CK_CH, s = idx % CK_CH;
        if (s / 16 > r / 16) Tm[r * CK_GLD + s] = 0.0f;
    }
    for (int idx = tid; idx < CK_CH * (dv / 4); idx += nt) { /* V, in flight during the inversion */
        int t = idx / (dv / 4), j = idx % (dv / 4) * 4, z = t < L ? 0 : 16;
        const float *row =
            a.conv_out + (size_t)(r0 + (t < L ? t : 0)) * C + 2 * (size_t)kd + (size_t)h * dv + j;
        __pipeline_memcpy_async(Xs + t * XLD + j, row, 16, z);
    }
    __pipeline_commit();
    __syncthreads();
    if constexpr (MM) /* the rounds below on mma.sync, TF32 x3 */
        ck_inverse_rounds<4>(Am, Tm, X, tid, ck_tiles_x3());
    for (int bi = 1; bi < 4 && !MM; bi++) {
        /* X_j = sum_{k=j}^{bi-1} A_{bi,k} T_{k,j} for j < bi */
        for (int idx = tid; idx < bi * 256; idx += nt) {
            int bj = idx >> 8, rr = (idx >> 4) & 15, cc = idx & 15;
            float x = 0.0f;
            for (int m = bj * 16; m < bi * 16; m++)
                x = fmaf(Am[(bi * 16 + rr) * CK_GLD + m], Tm[m * CK_GLD + bj * 16 + cc], x);
            X[idx] = x;
        }
        __syncthreads();
        /* T_{bi,j} = -T_{bi,bi} X_j */
        for (int idx = tid; idx < bi * 256; idx += nt) {
            int bj = idx >> 8, rr = (idx >> 4) & 15, cc = idx & 15;
            float v = 0.0f;
            for (int m = 0; m < 16; m++)
                v = fmaf(Tm[(bi * 16 + rr) * CK_GLD + bi * 16 + m], X[bj * 256 + m * 16 + cc], v);
            Tm[(bi * 16 + rr) * CK_GLD + bj * 16 + cc] = -v;
        }
        __syncthreads();
    }
    CK_MARK(4);
    /* Am <- T diag(beta e^g) (A is no longer needed), T <- T diag(beta) */
    for (int idx = tid; idx < CK_CH * CK_CH; idx += nt) {
        int r = idx / CK_CH, s = idx % CK_CH;
        float tv = Tm[r * CK_GLD + s];
        Am[r * CK_GLD + s] = tv * (bet[s] * egam[s]);
        Tm[r * CK_GLD + s] = tv * bet[s];
    }
    __pipeline_wait_prior(0); /* V */
    __syncthreads();
    CK_MARK(5);
    /* W = (T diag(beta e^g)) K: 4 x dk/16 tiles; U = (T diag(beta)) V: 4 x dv/16 tiles; a warp takes two
     * column tiles of a row tile at once (tc_mma2), the last alone when their count is odd */
    if constexpr (MM) { /* mma.sync: a warp per (row tile, 32 columns) of W or U, straight to the scratch;
                           row tiles 0 and 1 of T stop at column 32 (zeros past it: the second run would only
                           add zeros) */
        const int lane = tid & 31, g = lane >> 2, t4 = lane & 3, ck = (dk + 31) / 32, cvb = (dv + 31) / 32;
        for (int u = warp; u < 4 * (ck + cvb); u += nw) {
            int isv = u >= 4 * ck, u2 = isv ? u - 4 * ck : u, nb = isv ? cvb : ck, mi = u2 / nb, cb = u2 % nb;
            int cols = isv ? dv : dk, nc = (cols - cb * 32) / 8;
            if (nc > 4) nc = 4;
            float acc[4][4] = {};
            ckm_tiles<false>(acc, nc, (isv ? Tm : Am) + mi * 16 * CK_GLD, CK_GLD, (isv ? Xs : Ks) + cb * 32,
                             isv ? XLD : KLD, mi < 2 ? 32 : CK_CH, g, t4);
            const int ld = isv ? ULD : WLD;
            float *dst = isv ? (IMG ? U + (size_t)cb * CK_CH * 40 + (size_t)mi * 16 * 40
                                    : U + (size_t)mi * 16 * dv + cb * 32)
                             : W + (size_t)mi * 16 * WLD + cb * 32;
            ck_store_tiles<false, 4>(dst, (size_t)ld, acc, nc, g, t4);
        }
    }
    const int pk = (dk / 16 + 1) / 2, pv = (dv / 16 + 1) / 2;
    for (int t = warp; t < (MM ? 0 : 4 * (pk + pv)); t += nw) {
        int isv = t >= 4 * pk, t2 = isv ? t - 4 * pk : t, np = isv ? pv : pk, mi = t2 / np,
            ni = 2 * (t2 % np);
        const float *Aop = (isv ? Tm : Am) + mi * 16 * CK_GLD, *Bop = isv ? Xs : Ks;
        int ldb = isv ? XLD : KLD, cols = isv ? dv : dk;
        float *dst = (isv ? U : W) + mi * 16 * cols + ni * 16;
        tc_facc a0, a1;
        wmma::fill_fragment(a0, 0.0f);
        if ((ni + 1) * 16 < cols) { /* tile ni + 1 exists */
            wmma::fill_fragment(a1, 0.0f);
            tc_mma2<P, wmma::row_major, wmma::row_major>(a0, a1, Aop, CK_GLD, Bop + ni * 16,
                                                         Bop + ni * 16 + 16, ldb, CK_CH);
            wmma::store_matrix_sync(dst + 16, a1, cols, wmma::mem_row_major);
        } else {
            tc_mma<P, wmma::row_major, wmma::row_major>(a0, Aop, CK_GLD, Bop + ni * 16, ldb, CK_CH);
        }
        wmma::store_matrix_sync(dst, a0, cols, wmma::mem_row_major);
    }
    CK_MARK(6);
    CK_PROF_OUT(0);
}

/* The sequential pass ("stage", WMMA): each chunk's W, Qg, U's columns, Kf and QK staged in shared memory by
 * cp.async, one step ahead: W, Qg and U of chunk i + 1 load while the second step of chunk i runs, QK and Kf
 * of chunk i + 1 while the first step of chunk i + 1 runs. 32 value columns, 8 warps, each on both
 * 16-column tiles of a row tile at once (tc_mma2: the A fragment loaded and split once, two independent MMA
 * chains). */
#define CKS_DT 32
static size_t ck_stage_smem_floats(int dk) {
    return 3 * (size_t)CK_CH * (dk + 4) + (size_t)CK_CH * CK_GLD + ((size_t)dk + 3 * CK_CH) * (CKS_DT + 4);
}

/* rows x cols floats (cols a multiple of 4) from global (row stride cols) to shared (row stride ld), 16 bytes
 * per copy */
template <bool FAST = false>
static __device__ __forceinline__ void ck_stage(float *dst, int ld, const float *src, int rows, int cols,
                                                int tid, int nt) {
    int q = cols / 4;
    if (FAST && nt % q == 0) { /* a thread's copies walk down one column: no division per copy */
        int c = tid % q * 4, step = nt / q;
        for (int r = tid / q; r < rows; r += step)
            __pipeline_memcpy_async(dst + r * ld + c, src + (size_t)r * cols + c, 16);
        return;
    }
    for (int idx = tid; idx < rows * q; idx += nt) {
        int r = idx / q, c = (idx % q) * 4;
        __pipeline_memcpy_async(dst + r * ld + c, src + (size_t)r * cols + c, 16);
    }
}

/* the block's CKS_DT columns of U [64][dv] (from column j0; columns past dv: zeros) */
static __device__ __forceinline__ void ck_stage_u(float *dst, int ld, const float *U, int dv, int j0, int tid,
                                                  int nt) {
    for (int idx = tid; idx < CK_CH * (CKS_DT / 4); idx += nt) {
        int t = idx / (CKS_DT / 4), c = idx % (CKS_DT / 4) * 4, ok = j0 + c < dv;
        __pipeline_memcpy_async(dst + t * ld + c, ok ? U + (size_t)t * dv + j0 + c : U, 16, ok ? 0 : 16);
    }
}

/* the two staging groups of both passes from one (chunk, value head)'s scratch at src: group A (W, Qg
 * [64][dk] at rows of KLD, U's block columns at rows of ULD), read by a chunk's first step; group B (QK at
 * rows of CK_GLD, Kf at rows of KBL), read by its second. Each committed as its own cp.async group. */
template <bool FAST>
static __device__ __forceinline__ void ck_stage_a(float *Wb, float *Qb, int KLD, float *Ub, int ULD,
                                                  const float *src, int dk, int dv, int j0, int tid, int nt) {
    ck_stage<FAST>(Wb, KLD, src, CK_CH, dk, tid, nt);
    ck_stage<FAST>(Qb, KLD, src + CK_CH * dk, CK_CH, dk, tid, nt);
    ck_stage_u(Ub, ULD, src + 3 * CK_CH * dk, dv, j0, tid, nt);
    __pipeline_commit();
}
template <bool FAST>
static __device__ __forceinline__ void ck_stage_b(float *QKb, float *Kb, int KBL, const float *src, int dk,
                                                  int dv, int tid, int nt) {
    ck_stage<FAST>(QKb, CK_GLD, src + 3 * CK_CH * dk + CK_CH * dv, CK_CH, CK_CH, tid, nt);
    ck_stage<FAST>(Kb, KBL, src + 2 * CK_CH * dk, CK_CH, dk, tid, nt);
    __pipeline_commit();
}

template <int P> __global__ void __launch_bounds__(256) ck_state_stage_kernel(cu_gdn_args a) {
    extern __shared__ __align__(128) float smg[];
    int e = blockIdx.z;
    if (!ck_entry(a, e)) return;
    const int DT = CKS_DT, VLD = DT + 4; /* DT = 32: two column tiles, taken together by tc_mma2 */
    const int dk = a.dk, dv = a.dv, KLD = dk + 4, tid = threadIdx.x, nt = blockDim.x, warp = tid >> 5,
              nw = nt >> 5;
    int h = blockIdx.y, j0 = blockIdx.x * DT, n = a.meta.e_n[e], pos0 = a.meta.e_len[e];
    int r0 = a.meta.e_row0[e];
    float *Wb = smg, *Qb = Wb + CK_CH * KLD, *Kb = Qb + CK_CH * KLD, *QKb = Kb + CK_CH * KLD;
    float *Ss = QKb + CK_CH * CK_GLD, *Ds = Ss + (size_t)dk * VLD, *Os = Ds + CK_CH * VLD,
          *Ub = Os + CK_CH * VLD;
    float *Sg = a.rec_state + (((size_t)a.meta.e_slot[e] * a.n_lin + a.lin) * a.Hv + h) * (size_t)dk * dv;
    for (int idx = tid; idx < dk * DT; idx += nt) {
        int i = idx / DT, jj = idx % DT;
        Ss[i * VLD + jj] = j0 + jj < dv ? Sg[(size_t)i * dv + j0 + jj] : 0.0f;
    }
    const int *tab = ck_table(a);
    int k = tab[1 + 3 * (size_t)a.chunk_cap + e];
    const size_t stride = ck_stride(dk, dv);
    const int mt_k = dk / 16;
    const float *base = (const float *)a.chunk_scr + ((size_t)k * a.Hv + h) * stride;
    CK_PROF_DECL(a.chunk_prof && blockIdx.x == 0 && h == 0 && tid == 0);
    /* group A of chunk 0 (W, Qg, U's columns), then group B (QK, Kf) */
    ck_stage_a<false>(Wb, Qb, KLD, Ub, VLD, base, dk, dv, j0, tid, nt);
    ck_stage_b<false>(QKb, Kb, KLD, base, dk, dv, tid, nt);
    for (int c0 = 0, L; c0 < n; c0 += L, k++) {
        L = CK_CH - (pos0 + c0) % CK_CH;
        if (L > n - c0) L = n - c0;
        const float *W = (const float *)a.chunk_scr + ((size_t)k * a.Hv + h) * stride;
        const float *U = W + 3 * CK_CH * dk, *nxt = c0 + L < n ? W + a.Hv * stride : NULL;
        float egl = U[CK_CH * dv + CK_CH * CK_CH];
        __pipeline_wait_prior(1); /* this chunk's group A */
        __syncthreads();
        CK_MARK(0);
        /* D = U - W S, Qg S into Os: a warp per row tile, both column tiles at once (tc_mma2) */
        for (int t = warp; t < 8; t += nw) {
            int mi = t & 3;
            tc_facc a0, a1;
            if (t < 4) {
                wmma::load_matrix_sync(a0, Ub + mi * 16 * VLD, VLD, wmma::mem_row_major);
                wmma::load_matrix_sync(a1, Ub + mi * 16 * VLD + 16, VLD, wmma::mem_row_major);
                tc_mma2<P, wmma::row_major, wmma::row_major>(a0, a1, Wb + mi * 16 * KLD, KLD, Ss, Ss + 16,
                                                             VLD, dk, true);
                wmma::store_matrix_sync(Ds + mi * 16 * VLD, a0, VLD, wmma::mem_row_major);
                wmma::store_matrix_sync(Ds + mi * 16 * VLD + 16, a1, VLD, wmma::mem_row_major);
            } else {
                wmma::fill_fragment(a0, 0.0f);
                wmma::fill_fragment(a1, 0.0f);
                tc_mma2<P, wmma::row_major, wmma::row_major>(a0, a1, Qb + mi * 16 * KLD, KLD, Ss, Ss + 16,
                                                             VLD, dk);
                wmma::store_matrix_sync(Os + mi * 16 * VLD, a0, VLD, wmma::mem_row_major);
                wmma::store_matrix_sync(Os + mi * 16 * VLD + 16, a1, VLD, wmma::mem_row_major);
            }
        }
        __syncthreads();
        CK_MARK(1);
        if (nxt) /* the next chunk's group A over this one's W, Qg and U, read by now */
            ck_stage_a<false>(Wb, Qb, KLD, Ub, VLD, nxt, dk, dv, j0, tid, nt);
        else
            __pipeline_commit();
        __pipeline_wait_prior(1); /* this chunk's group B */
        __syncthreads();
        CK_MARK(2);
        /* O += QK D; S <- e^(g_L) S + Kf^T D: row tiles of O and of S, both column tiles at once */
        for (int t = warp; t < 4 + mt_k; t += nw) {
            tc_facc a0, a1;
            if (t < 4) {
                wmma::load_matrix_sync(a0, Os + t * 16 * VLD, VLD, wmma::mem_row_major);
                wmma::load_matrix_sync(a1, Os + t * 16 * VLD + 16, VLD, wmma::mem_row_major);
                tc_mma2<P, wmma::row_major, wmma::row_major>(a0, a1, QKb + t * 16 * CK_GLD, CK_GLD, Ds,
                                                             Ds + 16, VLD, (t + 1) * 16);
                wmma::store_matrix_sync(Os + t * 16 * VLD, a0, VLD, wmma::mem_row_major);
                wmma::store_matrix_sync(Os + t * 16 * VLD + 16, a1, VLD, wmma::mem_row_major);
            } else {
                int mi = t - 4;
                wmma::load_matrix_sync(a0, Ss + mi * 16 * VLD, VLD, wmma::mem_row_major);
                wmma::load_matrix_sync(a1, Ss + mi * 16 * VLD + 16, VLD, wmma::mem_row_major);
#pragma unroll
                for (int u = 0; u < a0.num_elements; u++) /* never contracted with tc_mma2's adds */
                    a0.x[u] = __fmul_rn(a0.x[u], egl), a1.x[u] = __fmul_rn(a1.x[u], egl);
                tc_mma2<P, wmma::col_major, wmma::row_major>(a0, a1, Kb + mi * 16, KLD, Ds, Ds + 16, VLD,
                                                             CK_CH);
                wmma::store_matrix_sync(Ss + mi * 16 * VLD, a0, VLD, wmma::mem_row_major);
                wmma::store_matrix_sync(Ss + mi * 16 * VLD + 16, a1, VLD, wmma::mem_row_major);
            }
        }
        __syncthreads();
        CK_MARK(3);
        if (nxt) /* the next chunk's group B over this one's QK and Kf */
            ck_stage_b<false>(QKb, Kb, KLD, nxt, dk, dv, tid, nt);
        else
            __pipeline_commit();
        for (int idx = tid; idx < L * DT; idx += nt) {
            int r = idx / DT, jj = idx % DT;
            if (j0 + jj < dv)
                a.o[(size_t)(r0 + c0 + r) * a.Hv * dv + (size_t)h * dv + j0 + jj] = Os[r * VLD + jj];
        }
        CK_MARK(4);
        ckp[7]++;
    }
    CK_PROF_OUT(8);
    __pipeline_wait_prior(0);
    __syncthreads();
    for (int idx = tid; idx < dk * DT; idx += nt) {
        int i = idx / DT, jj = idx % DT;
        if (j0 + jj < dv) Sg[(size_t)i * dv + j0 + jj] = Ss[i * VLD + jj];
    }
}

/* ---- the sequential pass on mma.sync (cu_gdn_args.chunk_dt 1, the default) ----
 * The staged pass's products with fragments in registers instead of WMMA: mma.sync m16n8k8 TF32 with
 * tc_mma2's order of the sums (each operand split hi + lo, here by Dekker's split, per step of 8 of K the
 * MMAs lo hi, hi lo, hi hi, each run of 32 of K in a fresh accumulator joined by f32 adds, the same runs in
 * the same order); what changes is the data movement:
 *   - S's column slice lives in registers (warp w owns rows 16w .. 16w + 15, all 32 columns, as accumulator
 *     fragments) across all chunks: its update never loads or stores it; what the first step reads as its B
 *     operand is S split once per chunk (Sh, Sl in shared memory), not re-split by every warp at every step;
 *   - D is likewise written once, split, for the second step's B operand;
 *   - O stays in the registers of the warp that began it (step 1: Qg S; step 2: + QK D) and goes to global
 *     memory from there;
 *   - a warp takes a whole row tile (4 tiles of 8 columns), so each A fragment is loaded and split once for
 *     four n-tiles, every A and B load is one 32-bit shared load per register (rows padded so that the 32
 *     lanes of a fragment load hit 32 banks), and the four n-tiles' MMA chains are independent.
 * Roles, 8 warps: step 1 warps 0-3 D = U - W S for row tile w, warps 4-7 O = Qg S for row tile w - 4; step 2
 * warp w < dk / 16 S <- e^(g_L) S + Kf^T D for its S rows, warps 4-7 also O += QK D. */
#define CKM_DT 32 /* value columns per block */
#define CKM_SL (CKM_DT + 8)

/* shared floats: W, Qg [64][dk + 4], Kf [64][dk + 8], QK [64][68], U [64][40], S hi and lo [dk][40], D hi and
 * lo [64][40] */
static size_t ck_mma_smem_floats(int dk) {
    return 2 * (size_t)CK_CH * (dk + 4) + (size_t)CK_CH * (dk + 8) + (size_t)CK_CH * CK_GLD +
           (size_t)CK_CH * CKM_SL + 2 * (size_t)dk * CKM_SL + 2 * (size_t)CK_CH * CKM_SL + 4;
}

/* ---- staging by bulk copies (cu_gdn_args.chunk_dt 2, CINFER_CUDA_GDN_DT=img) ----
 * The H200 (session 7, call 1) showed the mma pass issuing its staging for ~4k of a chunk's ~11.4k cycles:
 * 7,680 16-byte cp.async a chunk, ~1.2 an SM cycle; copying row by row with cp.async.bulk (320 a chunk) was
 * 2.2x slower still (call 2). Here the prep writes the scratch as the pass's shared-memory image (IMG above)
 * and one thread stages a chunk by three bulk copies (bulk.cuh): [W | Qg] and U's column block (group A),
 * [Kf | QK] (group B), each group on its mbarrier. The same values in the same places: mma6's bits. */
static __device__ __forceinline__ void ckb_stage_a(float *Wb, float *Ub, const float *src, int dk, int j0,
                                                   uint64_t *bar) {
    const unsigned wq = 2u * CK_CH * (dk + 4) * 4u, ub = CK_CH * CKM_SL * 4u;
    bk_fence();
    bk_expect(bar, wq + ub);
    bk_copy(Wb, src, wq, bar);
    bk_copy(Ub, src + ck_img_u(dk) + (size_t)(j0 / CKM_DT) * CK_CH * CKM_SL, ub, bar);
}
static __device__ __forceinline__ void ckb_stage_b(float *Kb, const float *src, int dk, uint64_t *bar) {
    const unsigned fq = (unsigned)CK_CH * (dk + 8) * 4u + CK_CH * CK_GLD * 4u;
    bk_fence();
    bk_expect(bar, fq);
    bk_copy(Kb, src + 2 * (size_t)CK_CH * (dk + 4), fq, bar);
}

/* acc[n] += A[16][K] B[K][n*8 .. n*8 + 7] for the four n-tiles, in runs of TC_KC as tc_mma2. A row-major at
 * A[m * lda + k] (AT: "column-major", at A[k * lda + m]); B split, hi at Bh[k * CKM_SL + n], lo at Bl; neg:
 * A enters negated. */
template <bool AT>
static __device__ __forceinline__ void ckm_rowtile(float (&acc)[4][4], const float *A, int lda,
                                                   const float *Bh, const float *Bl, int K, bool neg, int g,
                                                   int t) {
    constexpr int NT = 4;
    for (int k0 = 0; k0 < K; k0 += TC_KC) {
        float p[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++) p[n][0] = p[n][1] = p[n][2] = p[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < TC_KC; kk += 8) {
            int k = k0 + kk;
            if (k < K) {
                float av[4];
                if constexpr (AT) {
                    av[0] = A[(size_t)(k + t) * lda + g], av[1] = A[(size_t)(k + t) * lda + g + 8];
                    av[2] = A[(size_t)(k + t + 4) * lda + g], av[3] = A[(size_t)(k + t + 4) * lda + g + 8];
                } else {
                    av[0] = A[(size_t)g * lda + k + t], av[1] = A[(size_t)(g + 8) * lda + k + t];
                    av[2] = A[(size_t)g * lda + k + t + 4], av[3] = A[(size_t)(g + 8) * lda + k + t + 4];
                }
                uint32_t ah[4], al[4];
#pragma unroll
                for (int r = 0; r < 4; r++) ckm_split(neg ? -av[r] : av[r], ah[r], al[r]);
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    int o0 = (k + t) * CKM_SL + n * 8 + g, o1 = o0 + 4 * CKM_SL;
                    uint32_t bh0 = __float_as_uint(Bh[o0]), bh1 = __float_as_uint(Bh[o1]);
                    uint32_t bl0 = __float_as_uint(Bl[o0]), bl1 = __float_as_uint(Bl[o1]);
                    ckm_mma(p[n], al, bh0, bh1);
                    ckm_mma(p[n], ah, bl0, bl1);
                    ckm_mma(p[n], ah, bh0, bh1);
                }
            }
        }
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int r = 0; r < 4; r++) acc[n][r] += p[n][r];
    }
}

/* a row tile's fragments (rows m0 + g, m0 + g + 8; columns n*8 + 2t, + 1) split into hi / lo at [row][CKM_SL]
 */
static __device__ __forceinline__ void ckm_put_split(float *Hs, float *Ls, int m0, const float (&acc)[4][4],
                                                     int g, int t) {
#pragma unroll
    for (int n = 0; n < 4; n++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            int row = m0 + g + (r >> 1) * 8, col = n * 8 + 2 * t + (r & 1);
            uint32_t h, l;
            ckm_split(acc[n][r], h, l);
            Hs[row * CKM_SL + col] = __uint_as_float(h);
            Ls[row * CKM_SL + col] = __uint_as_float(l);
        }
}

/* DK: 0 dk from the arguments; 128 (the models' dk) a constant, so every run of K unrolls. BULK: the scratch
 * in the IMG layout, staged by bulk copies (above; dv a multiple of CKM_DT) */
template <int DK = 0, bool BULK = false>
__global__ void __launch_bounds__(256) ck_state_mma_kernel(cu_gdn_args a) {
    extern __shared__ __align__(128) float smm[];
    int e = blockIdx.z;
    if (!ck_entry(a, e)) return;
    const int dk = DK ? DK : a.dk, dv = a.dv, KLD = dk + 4, KBL = dk + 8, tid = threadIdx.x, nt = blockDim.x;
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    int h = blockIdx.y, j0 = blockIdx.x * CKM_DT, n = a.meta.e_n[e], pos0 = a.meta.e_len[e];
    int r0 = a.meta.e_row0[e];
    float *Wb = smm, *Qb = Wb + CK_CH * KLD, *Kb = Qb + CK_CH * KLD, *QKb = Kb + CK_CH * KBL;
    float *Ub = QKb + CK_CH * CK_GLD, *Sh = Ub + CK_CH * CKM_SL, *Sl = Sh + (size_t)dk * CKM_SL;
    float *Dh = Sl + (size_t)dk * CKM_SL, *Dl = Dh + CK_CH * CKM_SL;
    uint64_t *bar = reinterpret_cast<uint64_t *>(Dl + CK_CH * CKM_SL); /* BULK: group A, group B */
    unsigned par_a = 0, par_b = 0;
    if constexpr (BULK) {
        bk_init_block(bar, 2);
    }
    float *Sg = a.rec_state + (((size_t)a.meta.e_slot[e] * a.n_lin + a.lin) * a.Hv + h) * (size_t)dk * dv;
    const bool owns_s = warp < dk / 16; /* S rows 16 warp .. 16 warp + 15 */
    const int ms = warp * 16;
    float s[4][4] = {}, o[4][4] = {};
    if (owns_s) {
#pragma unroll
        for (int nn = 0; nn < 4; nn++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                int row = ms + g + (r >> 1) * 8, col = j0 + nn * 8 + 2 * t + (r & 1);
                s[nn][r] = col < dv ? Sg[(size_t)row * dv + col] : 0.0f;
            }
        ckm_put_split(Sh, Sl, ms, s, g, t);
    }
    const int *tab = ck_table(a);
    int k = tab[1 + 3 * (size_t)a.chunk_cap + e];
    const size_t stride = ck_stride(dk, dv);
    const float *base = (const float *)a.chunk_scr + ((size_t)k * a.Hv + h) * stride;
    CK_PROF_DECL(a.chunk_prof && blockIdx.x == 0 && h == 0 && tid == 0);
    /* group A of chunk 0 (W, Qg, U's columns), then group B (QK, Kf): as ck_state_stage_kernel */
    if constexpr (BULK) {
        if (tid == 0) {
            ckb_stage_a(Wb, Ub, base, dk, j0, bar);
            ckb_stage_b(Kb, base, dk, bar + 1);
        }
    } else {
        ck_stage_a<true>(Wb, Qb, KLD, Ub, CKM_SL, base, dk, dv, j0, tid, nt);
        ck_stage_b<true>(QKb, Kb, KBL, base, dk, dv, tid, nt);
    }
    for (int c0 = 0, L; c0 < n; c0 += L, k++) {
        L = CK_CH - (pos0 + c0) % CK_CH;
        if (L > n - c0) L = n - c0;
        const float *W = (const float *)a.chunk_scr + ((size_t)k * a.Hv + h) * stride;
        const float *U = W + 3 * CK_CH * dk, *nxt = c0 + L < n ? W + a.Hv * stride : NULL;
        float egl = BULK ? W[ck_img_misc(dk, dv)] : U[CK_CH * dv + CK_CH * CK_CH];
        if constexpr (BULK) {
            bk_wait(bar, par_a);
            par_a ^= 1u;
        } else {
            __pipeline_wait_prior(1); /* this chunk's group A */
        }
        __syncthreads();
        CK_MARK(0);
        /* step 1: D = U - W S (warps 0-3), O = Qg S (warps 4-7) */
        {
            const int m0 = (warp & 3) * 16;
            if (warp < 4) {
                float d[4][4];
#pragma unroll
                for (int nn = 0; nn < 4; nn++)
#pragma unroll
                    for (int r = 0; r < 4; r++)
                        d[nn][r] = Ub[(m0 + g + (r >> 1) * 8) * CKM_SL + nn * 8 + 2 * t + (r & 1)];
                ckm_rowtile<false>(d, Wb + m0 * KLD, KLD, Sh, Sl, dk, true, g, t);
                ckm_put_split(Dh, Dl, m0, d, g, t);
            } else {
#pragma unroll
                for (int nn = 0; nn < 4; nn++) o[nn][0] = o[nn][1] = o[nn][2] = o[nn][3] = 0.0f;
                ckm_rowtile<false>(o, Qb + m0 * KLD, KLD, Sh, Sl, dk, false, g, t);
            }
        }
        __syncthreads();
        CK_MARK(1);
        if constexpr (BULK) {
            if (nxt && tid == 0) ckb_stage_a(Wb, Ub, nxt, dk, j0, bar);
            bk_wait(bar + 1, par_b);
            par_b ^= 1u;
        } else {
            if (nxt) /* the next chunk's group A over this one's W, Qg and U, read by now */
                ck_stage_a<true>(Wb, Qb, KLD, Ub, CKM_SL, nxt, dk, dv, j0, tid, nt);
            else
                __pipeline_commit();
            __pipeline_wait_prior(1); /* this chunk's group B */
        }
        __syncthreads();
        CK_MARK(2);
        /* step 2: S <- e^(g_L) S + Kf^T D (owners; S's split for the next chunk's step 1, whose readers of
         * Sh / Sl are past the barrier above); O += QK D (warps 4-7), then to global memory */
        if (owns_s) {
#pragma unroll
            for (int nn = 0; nn < 4; nn++)
#pragma unroll
                for (int r = 0; r < 4; r++) s[nn][r] = __fmul_rn(s[nn][r], egl);
            ckm_rowtile<true>(s, Kb + ms, KBL, Dh, Dl, CK_CH, false, g, t);
            ckm_put_split(Sh, Sl, ms, s, g, t);
        }
        if (warp >= 4) {
            const int mi = warp - 4, m0 = mi * 16;
            ckm_rowtile<false>(o, QKb + m0 * CK_GLD, CK_GLD, Dh, Dl, (mi + 1) * 16, false, g, t);
#pragma unroll
            for (int nn = 0; nn < 4; nn++)
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    int row = m0 + g + hh * 8, col = j0 + nn * 8 + 2 * t;
                    if (row < L && col < dv)
                        *(float2 *)(a.o + (size_t)(r0 + c0 + row) * a.Hv * dv + (size_t)h * dv + col) =
                            make_float2(o[nn][2 * hh], o[nn][2 * hh + 1]);
                }
        }
        __syncthreads();
        CK_MARK(3);
        if constexpr (BULK) {
            if (nxt && tid == 0) ckb_stage_b(Kb, nxt, dk, bar + 1);
        } else if (nxt) { /* the next chunk's group B over this one's QK and Kf */
            ck_stage_b<true>(QKb, Kb, KBL, nxt, dk, dv, tid, nt);
        } else {
            __pipeline_commit();
        }
        CK_MARK(4);
        ckp[7]++;
    }
    CK_PROF_OUT(8);
    if (!BULK) __pipeline_wait_prior(0); /* (bulk: every copy issued was waited for) */
    if (owns_s) {
#pragma unroll
        for (int nn = 0; nn < 4; nn++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                int row = ms + g + hh * 8, col = j0 + nn * 8 + 2 * t;
                if (col < dv)
                    *(float2 *)(Sg + (size_t)row * dv + col) = make_float2(s[nn][2 * hh], s[nn][2 * hh + 1]);
            }
    }
}

/* ---- fast mode (cu_gdn_args.chunk_fast: CINFER_PRECISION=fast) ----
 * The same phases in the form FLA's chunk_gated_delta_rule runs for bf16 models: every product's operands
 * (K, Q, V, W, U's partner T, the decayed Q K^T, D and the state's copy) rounded to bf16 once, one mma.sync
 * m16n8k16 per product, f32 accumulation; the decay, beta, A = beta e^(g_r - g_s) K K^T and its inverse T =
 * (I + A)^-1 in f32 (FLA computes A and solve_tril in f32 and rounds T only as the operand of W and U); the
 * state kept in f32 registers and stored in f32 (the decode kernel and the prefix cache read it). bf16, not
 * fp16: S, D, U and V are activations of no bounded range (fp16 would overflow at 65504), and a product's two
 * operands share one type; K and Q are normalized and would fit fp16, but their partners in the pass do not.
 * As in FLA the decays are applied in f32 outside the products, so Q and K are stored once per key head: O =
 * e^gam (Q S) + QK D and S <- e^(g_L) S + K^T (e^(g_L - gam) D), D rounded twice (as D and as the decayed D).
 * dk = 128, dv a multiple of 32 up to 128 (the Qwen3.5 heads); elsewhere fast mode runs the exact form.
 *
 * The scratch is the exact form's (the same chunk table, the same allocation): a (chunk, value head)'s
 * region holds, as the pass's shared memory wants them (rows padded so that ldmatrix's 8 rows of 16 bytes
 * fall in distinct bank groups): W bf16 [64][136], QK bf16 [64][72], f32 e^gam [64] | e^(g_L - gam) [64] |
 * e^(g_L) (132 floats), U bf16 as dv / 32 column blocks of [64][40]; a (chunk, key head kh)'s Q and K bf16
 * [64][136] each sit after that in the region of (chunk, value head kh), written by its key head's first
 * value head's prep block. A chunk of the pass is three bulk copies: [W | QK | gates], U's block, [Q | K]. */
#define FK_DK   128
#define FK_LD   136                         /* bf16 row stride of the [64][128] operands: 272 bytes */
#define FK_QL   72                          /* of QK and T (144 bytes) */
#define FK_UL   40                          /* of U's column blocks, S and D in the pass (80 bytes) */
#define FK_QK   (CK_CH * FK_LD * 2)         /* byte offsets in a region: QK */
#define FK_MISC (FK_QK + CK_CH * FK_QL * 2) /* the gates */
#define FK_U    (FK_MISC + 132 * 4)         /* U's blocks */
#define FK_UB   (CK_CH * FK_UL * 2)         /* bytes of one U block */
#define FK_QKB  (2 * CK_CH * FK_LD * 2)     /* bytes of [Q | K] */
static __host__ __device__ size_t fk_qk_off(int dv) { /* [Q | K] in the region of (chunk, kh) */
    return FK_U + (size_t)(dv / 32) * FK_UB;
}
/* prep's shared memory (72 KB: three blocks an SM): K (fp16, then bf16), Q (fp16) then V (bf16) [64][136], A
 * f32 [64][68] and X f32 [3][256] (after the inverse: T diag(beta e^gam) and T diag(beta) bf16 [64][72]), T
 * f32 [64][68], gam, beta, e^gam, e^(g_L - gam) [64] */
#define FK_PREP_SMEM (2 * FK_QK + 2 * CK_CH * CK_GLD * 4 + 3 * 256 * 4 + 4 * CK_CH * 4)
/* the pass's: two stages of [W | QK | gates], U's block, [Q | K]; S bf16 [128][40], D and the decayed D bf16
 * [64][40]; two mbarriers */
/* NB: 32-column blocks a thread block runs (256 NB threads); NB 1 takes three stages (a chunk's loads have
 * two chunks' time to land), NB 2 two (three would not fit) */
#define FK_STAGE(NB) (FK_U + (NB)*FK_UB + FK_QKB)
#define FK_NST(NB)   ((NB) == 1 ? 3 : 2)
#define FK_PASS_SMEM(NB)                                                                                     \
    (FK_NST(NB) * FK_STAGE(NB) + (NB) * (FK_DK * FK_UL * 2 + 2 * FK_UB) + 2 * FK_NST(NB) * 8)

static __device__ __forceinline__ uint32_t fk_pack(float lo, float hi) { /* bf16x2, round to nearest even */
    uint32_t d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}
static __device__ __forceinline__ uint32_t fk_pack_h(float lo, float hi) { /* fp16x2 */
    uint32_t d;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}
static __device__ __forceinline__ float fk_lo(uint32_t v) {
    return __uint_as_float(v << 16);
}
static __device__ __forceinline__ float fk_hi(uint32_t v) {
    return __uint_as_float(v & 0xffff0000u);
}
/* d += A B, m16n8k16 bf16: A 16x16 (a0 (g, 2t..), a1 (g + 8, 2t..), a2 (g, 2t + 8..), a3 (g + 8, 2t + 8..)),
 * B 16x8 (b0 (k 2t.., n g), b1 (k 2t + 8.., n g)), D as m16n8k8's */
static __device__ __forceinline__ void fk_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                              uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* the same on fp16 operands */
static __device__ __forceinline__ void fk_mma_h(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* four 8x8 b16 matrices, lane l giving the address of row l % 8 of matrix l / 8 (TR: transposed) */
template <bool TR> static __device__ __forceinline__ void fk_ldm(uint32_t (&r)[4], const uint16_t *p) {
    if constexpr (TR)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(bk_sa(p))
                     : "memory");
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(bk_sa(p))
                     : "memory");
}
/* fragment addresses for lane l: A 16x16 at (m0, k0) of a row-major [m][k]; of A stored [k][m] (transposed,
 * with fk_ldm<true>); B 16x16 (two n-tiles) at (k0, n0) of a row-major [k][n] (fk_ldm<true>: r0, r1 the
 * first n-tile's b0, b1, r2, r3 the second's); of B stored [n][k] (fk_ldm<false>) */
static __device__ __forceinline__ const uint16_t *fk_a(const uint16_t *A, int ld, int m0, int k0, int l) {
    return A + (size_t)(m0 + (l & 15)) * ld + k0 + (l >> 4) * 8;
}
static __device__ __forceinline__ const uint16_t *fk_at(const uint16_t *A, int ld, int m0, int k0, int l) {
    return A + (size_t)(k0 + (l & 7) + (l >> 4) * 8) * ld + m0 + ((l >> 3) & 1) * 8;
}
static __device__ __forceinline__ const uint16_t *fk_b(const uint16_t *B, int ld, int k0, int n0, int l) {
    return B + (size_t)(k0 + (l & 7) + ((l >> 3) & 1) * 8) * ld + n0 + (l >> 4) * 8;
}
static __device__ __forceinline__ const uint16_t *fk_bt(const uint16_t *B, int ld, int k0, int n0, int l) {
    return B + (size_t)(n0 + (l & 7) + (l >> 4) * 8) * ld + k0 + ((l >> 3) & 1) * 8;
}

/* acc[n] (n < 4) += the A fragment af (16 x 16) x B[k0 .. k0 + 15][n*8 .. n*8 + 7], B's rows by ldmatrix.trans: the
 * pass's 16 x 32 products (W S, Q S; Kf^T D; QK D) */
static __device__ __forceinline__ void fk_mma_n32(float (&acc)[4][4], const uint32_t (&af)[4], const uint16_t *B,
                                                  int ld, int k0, int l) {
    uint32_t b0[4], b1[4];
    fk_ldm<true>(b0, fk_b(B, ld, k0, 0, l));
    fk_ldm<true>(b1, fk_b(B, ld, k0, 16, l));
    fk_mma(acc[0], af, b0[0], b0[1]);
    fk_mma(acc[1], af, b0[2], b0[3]);
    fk_mma(acc[2], af, b1[0], b1[1]);
    fk_mma(acc[3], af, b1[2], b1[3]);
}

/* acc[n] (n < 2) += A[16][K] B[K][n*8 .. n*8 + 7], f32 in shared memory, one TF32 rounding (m16n8k8) */
static __device__ __forceinline__ uint32_t fk_tf32(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}
static __device__ __forceinline__ void fk_tiles_tf32(float (&acc)[2][4], const float *A, int lda,
                                                     const float *B, int ldb, int K, int g, int t) {
    for (int k = 0; k < K; k += 8) {
        uint32_t af[4] = {fk_tf32(A[g * lda + k + t]), fk_tf32(A[(g + 8) * lda + k + t]),
                          fk_tf32(A[g * lda + k + t + 4]), fk_tf32(A[(g + 8) * lda + k + t + 4])};
#pragma unroll
        for (int n = 0; n < 2; n++)
            ckm_mma(acc[n], af, fk_tf32(B[(k + t) * ldb + n * 8 + g]),
                    fk_tf32(B[(k + t + 4) * ldb + n * 8 + g]));
    }
}

struct fk_tiles_1x { /* the fast prep's products for ck_inverse_rounds: one TF32 rounding */
    __device__ __forceinline__ void operator()(float (&acc)[2][4], const float *A, int lda, const float *B,
                                               int ldb, int K, int g, int t) const {
        fk_tiles_tf32(acc, A, lda, B, ldb, K, g, t);
    }
};

/* the fused layer's front (cu_gdn_layer_fast, FUSED prep): for the chunk's rows, the causal conv (K = 4: the
 * three inputs before a row from the entry's earlier rows or the slot's window) and SiLU of the key head's q
 * and k channels and the value head's v channels, q and k l2-normalized (q scaled by dk^-1/2) as prep_kernel
 * does, straight from the pre-conv rows (no conv_out round trip); beta and g of the value head. Warp w takes
 * rows 8w .. 8w + 7, a lane 4 channels, the inputs sliding in registers. Q, K to shared memory as fp16 and
 * (qkg) to the scratch as bf16; V's rows into vv (row 8w + i, channels 4 lane ..); rows past L: zeros. */
static __device__ __forceinline__ float4 fk_in(const cu_gdn_args &a, const float *st, int row0, int p,
                                               int ch) {
    return p >= 0 ? *(const float4 *)(a.qkv + (size_t)(row0 + p) * a.qkv_ld + ch)
                  : *(const float4 *)(st + (size_t)(p + 3) * a.C + ch);
}
static __device__ __forceinline__ float fk_tap(float w0, float w1, float w2, float w3, float x0, float x1,
                                               float x2, float x3) { /* conv_tap's order */
    return dev_silu(fmaf(w3, x3, fmaf(w2, x2, fmaf(w1, x1, w0 * x0))));
}
static __device__ __forceinline__ void fk_conv(const cu_gdn_args &a, int e, int c0, int L, int h, int kh,
                                               uint16_t *Qs, uint16_t *Ks, uint16_t *qkg, float4 (&vv)[8],
                                               float *gam, float *bet) {
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, C = a.C, kd = a.Hk * FK_DK;
    const int row0 = a.meta.e_row0[e], p0 = c0 + 8 * warp; /* entry position of the warp's first row */
    const float *st = a.conv_state + ((size_t)a.meta.e_slot[e] * a.n_lin + a.lin) * 3 * (size_t)C;
    const float qscale = (float)(1.0 / sqrt((double)FK_DK));
    if (tid < CK_CH) {
        int r = row0 + c0 + (tid < L ? tid : 0);
        float b = a.b[(size_t)r * a.ba_ld + h], av = a.a[(size_t)r * a.ba_ld + h];
        gam[tid] = tid < L ? a.A[h] * dev_softplus(av + a.dt_bias[h]) : 0.0f;
        bet[tid] = tid < L ? dev_sigmoid(b) : 0.0f;
    }
#pragma unroll 1
    for (int m = 0; m < 3; m++) { /* q, k, v */
        const int ch = (m == 0 ? kh * FK_DK : m == 1 ? kd + kh * FK_DK : 2 * kd + h * FK_DK) + lane * 4;
        float4 w[4], x[11];
#pragma unroll
        for (int j = 0; j < 4; j++) w[j] = *(const float4 *)(a.conv_w + (size_t)j * C + ch);
#pragma unroll
        for (int i = 0; i < 11; i++) /* rows p0 - 3 .. p0 + 7, all in flight */
            x[i] =
                8 * warp + i - 3 < L ? fk_in(a, st, row0, p0 + i - 3, ch) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int t = 8 * warp + i;
            float4 y;
            y.x = fk_tap(w[0].x, w[1].x, w[2].x, w[3].x, x[i].x, x[i + 1].x, x[i + 2].x, x[i + 3].x);
            y.y = fk_tap(w[0].y, w[1].y, w[2].y, w[3].y, x[i].y, x[i + 1].y, x[i + 2].y, x[i + 3].y);
            y.z = fk_tap(w[0].z, w[1].z, w[2].z, w[3].z, x[i].z, x[i + 1].z, x[i + 2].z, x[i + 3].z);
            y.w = fk_tap(w[0].w, w[1].w, w[2].w, w[3].w, x[i].w, x[i + 1].w, x[i + 2].w, x[i + 3].w);
            if (m < 2) {
                float ss = warp_sum(y.x * y.x + y.y * y.y + y.z * y.z + y.w * y.w);
                float inv = 1.0f / sqrtf(ss + 1e-6f);
                if (m == 0) inv *= qscale;
                y.x *= inv, y.y *= inv, y.z *= inv, y.w *= inv;
            }
            if (t >= L) y = make_float4(0.f, 0.f, 0.f, 0.f);
            if (m == 2) {
                vv[i] = y;
                continue;
            }
            uint16_t *dsm = m ? Ks : Qs;
            *(uint2 *)(dsm + t * FK_LD + lane * 4) = make_uint2(fk_pack_h(y.x, y.y), fk_pack_h(y.z, y.w));
            if (qkg)
                *(uint2 *)(qkg + (m ? CK_CH * FK_LD : 0) + t * FK_LD + lane * 4) =
                    make_uint2(fk_pack(y.x, y.y), fk_pack(y.z, y.w));
        }
    }
}

/* prep, a block per (chunk, value head): A and Q K^T on the tensor cores from Q and K rounded to fp16 (they
 * are l2-normalized, |x| <= 1: fp16's range holds them, and its 11 bits keep a dot product that nearly
 * cancels - the single-row entries' q.k, which the gated norm's eps does not scale away - within the bound,
 * where bf16 operands missed it: 1.08e-2 in session 10's call 2), the masks, decays and T in f32, W = T
 * diag(beta e^gam) K and U = T diag(beta) V on the tensor cores from bf16 operands (V has no bounded range)
 */
template <bool FUSED> __global__ void __launch_bounds__(256, FUSED ? 2 : 3) fk_prep_kernel(cu_gdn_args a) {
    extern __shared__ __align__(128) unsigned char fsp[];
    const int *tab = ck_table(a);
    int k = blockIdx.x, h = blockIdx.y;
    if (k >= tab[0]) return;
    const int e = tab[1 + 3 * k], c0 = tab[2 + 3 * k], L = tab[3 + 3 * k];
    const int dv = a.dv, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int rr = a.Hv / a.Hk, kh = h / rr, kd = a.Hk * FK_DK, C = a.C, r0 = a.meta.e_row0[e] + c0;
    uint16_t *Kb = (uint16_t *)fsp, *QV = Kb + CK_CH * FK_LD;
    float *Am = (float *)(QV + CK_CH * FK_LD), *X = Am + CK_CH * CK_GLD, *Tm = X + 3 * 256;
    uint16_t *Tp = (uint16_t *)Am, *Tb = Tp + CK_CH * FK_QL; /* over A and X, once both are done */
    float *gam = Tm + CK_CH * CK_GLD, *bet = gam + CK_CH, *egam = bet + CK_CH, *fl = egam + CK_CH;
    const size_t stride = ck_stride(FK_DK, dv) * sizeof(float);
    unsigned char *reg = (unsigned char *)a.chunk_scr + ((size_t)k * a.Hv + h) * stride;
    uint16_t *qkg =
        h % rr
            ? NULL
            : (uint16_t *)((unsigned char *)a.chunk_scr + ((size_t)k * a.Hv + kh) * stride + fk_qk_off(dv));
    CK_PROF_DECL(a.chunk_prof && k == 0 && h == 0 && tid == 0);
    float4 vv[8]; /* V's rows in registers, into shared memory (over Q) once the Q K^T products are done */
    const int vq = dv / 4; /* float4 per row */
    if constexpr (FUSED) { /* the conv, SiLU, l2 norms and gates of the chunk's rows here (fk_conv) */
        fk_conv(a, e, c0, L, h, kh, QV, Kb, qkg, vv, gam, bet);
    } else {
        /* Q and K rows (a warp a row, 16 bytes a lane), all loads in flight at once; rows past L: zeros */
        {
            float4 qv[8], kv[8];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                int t = (tid >> 5) + 8 * i, c = lane * 4;
                const float *row = a.conv_out + (size_t)(r0 + (t < L ? t : 0)) * C + (size_t)kh * FK_DK + c;
                qv[i] = t < L ? *(const float4 *)row : make_float4(0.f, 0.f, 0.f, 0.f);
                kv[i] = t < L ? *(const float4 *)(row + kd) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
            if (tid < CK_CH) {
                const float *bg = a.bg + (size_t)(r0 + (tid < L ? tid : 0)) * 2 * a.Hv;
                gam[tid] = tid < L ? bg[a.Hv + h] : 0.0f;
                bet[tid] = tid < L ? bg[h] : 0.0f;
            }
#pragma unroll
            for (int i = 0; i < 8; i++) {
                int t = (tid >> 5) + 8 * i, c = lane * 4;
                uint2 qb = make_uint2(fk_pack(qv[i].x, qv[i].y), fk_pack(qv[i].z, qv[i].w));
                uint2 kb = make_uint2(fk_pack(kv[i].x, kv[i].y), fk_pack(kv[i].z, kv[i].w));
                *(uint2 *)(QV + t * FK_LD + c) =
                    make_uint2(fk_pack_h(qv[i].x, qv[i].y), fk_pack_h(qv[i].z, qv[i].w));
                *(uint2 *)(Kb + t * FK_LD + c) =
                    make_uint2(fk_pack_h(kv[i].x, kv[i].y), fk_pack_h(kv[i].z, kv[i].w));
                if (qkg) {
                    *(uint2 *)(qkg + t * FK_LD + c) = qb;
                    *(uint2 *)(qkg + CK_CH * FK_LD + t * FK_LD + c) = kb;
                }
            }
        }
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int idx = tid + 256 * i, t = idx / vq, c = idx % vq * 4;
            bool ok = idx < CK_CH * vq && t < L;
            vv[i] = ok ? *(const float4 *)(a.conv_out + (size_t)(r0 + t) * C + 2 * (size_t)kd +
                                           (size_t)h * dv + c)
                       : make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }
    __syncthreads();
    CK_MARK(0);
    /* warp 0: the cumulative sum of the log-decays (a scan; fast mode does not keep the CPU's order) and
     * the decay factors; every warp: the 10 + 10 tiles of K K^T and Q K^T on and below the diagonal */
    if (warp == 0) {
        float x0 = gam[lane], x1 = gam[lane + 32];
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            float y0 = __shfl_up_sync(0xffffffffu, x0, o), y1 = __shfl_up_sync(0xffffffffu, x1, o);
            if (lane >= o) x0 += y0, x1 += y1;
        }
        x1 += __shfl_sync(0xffffffffu, x0, 31);
        float gl = L > 32 ? __shfl_sync(0xffffffffu, x1, (L - 1) & 31) : __shfl_sync(0xffffffffu, x0, L - 1);
        float *misc = (float *)(reg + FK_MISC);
#pragma unroll
        for (int u = 0; u < 2; u++) {
            int t = lane + 32 * u;
            float x = u ? x1 : x0, eg = t < L ? expf(x) : 0.0f, f = t < L ? expf(gl - x) : 0.0f;
            gam[t] = t < L ? x : 0.0f;
            egam[t] = eg, fl[t] = f;
            misc[t] = eg, misc[CK_CH + t] = f;
        }
        if (lane == 0) misc[2 * CK_CH] = expf(gl);
    }
    for (int u = warp; u < 20; u += 8) {
        int which = u / 10, v = u % 10,
            mi = v >= 6   ? 3
                 : v >= 3 ? 2
                 : v >= 1 ? 1
                          : 0,
            ni = v - mi * (mi + 1) / 2;
        const uint16_t *As = which ? QV : Kb;
        float acc[2][4] = {};
#pragma unroll
        for (int ks = 0; ks < FK_DK / 16; ks++) {
            uint32_t af[4], bf[4];
            fk_ldm<false>(af, fk_a(As, FK_LD, mi * 16, ks * 16, lane));
            fk_ldm<false>(bf, fk_bt(Kb, FK_LD, ks * 16, ni * 16, lane));
            fk_mma_h(acc[0], af, bf[0], bf[1]);
            fk_mma_h(acc[1], af, bf[2], bf[3]);
        }
        ck_store_tiles<false, 2>((which ? Tm : Am) + mi * 16 * CK_GLD + ni * 16, CK_GLD, acc, 2, g, t4);
    }
    __syncthreads();
    CK_MARK(1);
    /* the masks and decays: A = beta_r e^(gam_r - gam_s) k_r.k_s (s < r), QK = e^(gam_r - gam_s) q_r.k_s (s
     * <= r) to the scratch as bf16 (rows past L: zeros); V over Q */
    {
        uint16_t *QKg = (uint16_t *)(reg + FK_QK);
        for (int idx = tid; idx < CK_CH * CK_CH / 2; idx += 256) {
            int r = idx >> 5, s = (idx & 31) * 2;
            float d0 = r < L && s <= r ? expf(gam[r] - gam[s]) : 0.0f;
            float d1 = r < L && s + 1 <= r ? expf(gam[r] - gam[s + 1]) : 0.0f;
            float *ar = Am + r * CK_GLD + s, *tr = Tm + r * CK_GLD + s;
            ar[0] = s < r ? bet[r] * d0 * ar[0] : 0.0f;
            ar[1] = s + 1 < r ? bet[r] * d1 * ar[1] : 0.0f;
            *(uint32_t *)(QKg + r * FK_QL + s) =
                fk_pack(s <= r ? d0 * tr[0] : 0.0f, s + 1 <= r ? d1 * tr[1] : 0.0f);
        }
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int idx = tid + 256 * i, t = FUSED ? 8 * warp + i : idx / vq, c = FUSED ? lane * 4 : idx % vq * 4;
            if (FUSED || idx < CK_CH * vq)
                *(uint2 *)(QV + t * FK_LD + c) =
                    make_uint2(fk_pack(vv[i].x, vv[i].y), fk_pack(vv[i].z, vv[i].w));
        }
        /* K, fp16 for the products above, to bf16 in place for W's (its partner T diag(beta e^gam) is
         * bounded only as T is) */
        for (int idx = tid; idx < CK_CH * FK_DK / 2; idx += 256) {
            uint32_t *p = (uint32_t *)(Kb + (idx >> 6) * FK_LD + (idx & 63) * 2);
            __half2 v = *(__half2 *)p;
            *p = fk_pack(__low2float(v), __high2float(v));
        }
    }
    __syncthreads();
    CK_MARK(2);
    /* T = (I + A)^-1: the diagonal blocks by substitution in f32 (a thread a column, in registers), then the
     * blocks below them (below) */
    if (tid < 64) ck_diag_col(Am, Tm, (tid >> 4) * 16, tid & 15);
    for (int idx = tid; idx < CK_CH * CK_CH; idx += 256) {
        int r = idx / CK_CH, s = idx % CK_CH;
        if (s / 16 > r / 16) Tm[r * CK_GLD + s] = 0.0f;
    }
    __syncthreads();
    CK_MARK(3);
    /* the blocks below them in three rounds, X_j = sum_{m=j}^{bi-1} A_{bi,m} T_{m,j}, T_{bi,j} = -T_{bi,bi}
     * X_j, warp j < bi taking X_j, on the tensor cores with one TF32 rounding (as FLA's solve_tril's tl.dot;
     * T is rounded to bf16 right after): H200 call 5 of session 10, a 4B layer 0.546 -> 0.496 ms with the
     * fused layer (the rounds in f32 on the CUDA cores took 6.5k cycles of a prep block, these 2.8k) */
    ck_inverse_rounds<2>(Am, Tm, X, tid, fk_tiles_1x());
    CK_MARK(4);
    /* the operands of W and U: T diag(beta e^gam), T diag(beta), rounded once */
    for (int idx = tid; idx < CK_CH * CK_CH / 2; idx += 256) {
        int r = idx >> 5, s = (idx & 31) * 2;
        float t0 = Tm[r * CK_GLD + s], t1 = Tm[r * CK_GLD + s + 1];
        *(uint32_t *)(Tp + r * FK_QL + s) = fk_pack(t0 * (bet[s] * egam[s]), t1 * (bet[s + 1] * egam[s + 1]));
        *(uint32_t *)(Tb + r * FK_QL + s) = fk_pack(t0 * bet[s], t1 * bet[s + 1]);
    }
    __syncthreads();
    CK_MARK(5);
    /* W = Tp K [64][128], U = Tb V [64][dv]: tasks (matrix, row tile mi, 64-column group), row tile mi
     * needing k-steps 0..mi (T is block lower triangular); warp w takes row tiles w % 4 and 3 - w % 4 */
#pragma unroll 1
    for (int pass = 0; pass < 2; pass++) {
        int isv = pass, cg = warp >> 2, mi = pass ? 3 - (warp & 3) : warp & 3;
        int cols = isv ? dv : FK_DK, nc = (cols - cg * 64) / 8;
        if (nc <= 0) continue;
        if (nc > 8) nc = 8;
        const uint16_t *As = isv ? Tb : Tp, *Bs = isv ? QV : Kb;
        float acc[8][4] = {};
        for (int ks = 0; ks <= mi; ks++) {
            uint32_t af[4];
            fk_ldm<false>(af, fk_a(As, FK_QL, mi * 16, ks * 16, lane));
#pragma unroll
            for (int np = 0; np < 4; np++)
                if (2 * np < nc) {
                    uint32_t bf[4];
                    fk_ldm<true>(bf, fk_b(Bs, FK_LD, ks * 16, cg * 64 + np * 16, lane));
                    fk_mma(acc[2 * np], af, bf[0], bf[1]);
                    fk_mma(acc[2 * np + 1], af, bf[2], bf[3]);
                }
        }
#pragma unroll
        for (int n = 0; n < 8; n++)
            if (n < nc)
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    int row = mi * 16 + g + 8 * hh, col = cg * 64 + n * 8 + 2 * t4;
                    uint32_t v = fk_pack(acc[n][2 * hh], acc[n][2 * hh + 1]);
                    if (isv)
                        *(uint32_t *)(reg + FK_U + (size_t)(col >> 5) * FK_UB +
                                      (row * FK_UL + (col & 31)) * 2) = v;
                    else
                        *(uint32_t *)(reg + (row * FK_LD + col) * 2) = v;
                }
    }
    CK_MARK(6);
    CK_PROF_OUT(0);
}

/* a chunk's three bulk copies into stage buffer sp (thread 0; the block's reads of it done, past a
 * barrier): [W | QK | gates], U's NB blocks, [Q | K] */
template <int NB>
static __device__ __forceinline__ void fk_stage(unsigned char *sp, const cu_gdn_args &a, size_t stride, int k,
                                                int h, int kh, int cb, uint64_t *bar) {
    const unsigned char *base = (const unsigned char *)a.chunk_scr;
    const unsigned char *rv = base + ((size_t)k * a.Hv + h) * stride,
                        *rk = base + ((size_t)k * a.Hv + kh) * stride + fk_qk_off(a.dv);
    bk_fence();
    bk_expect(bar, FK_STAGE(NB));
    bk_copy(sp, rv, FK_U, bar);
    bk_copy(sp + FK_U, rv + FK_U + (size_t)cb * NB * FK_UB, NB * FK_UB, bar);
    bk_copy(sp + FK_U + NB * FK_UB, rk, FK_QKB, bar);
}

/* the sequential pass, a block per (entry, value head, 32 NB value columns), chunks in order, FK_NST(NB)
 * stages (chunk i + FK_NST loads into chunk i's stage once it is released); 256 threads per 32 columns, whose
 * warp w owns S's rows 16w .. 16w + 15 in f32 registers.
 *   step 1: warps 0-3 D = U - W S (row tile w), warps 4-7 O = e^gam (Q S) (row tile w - 4), S read as its
 *           bf16 copy; D and e^(g_L - gam) D to shared memory as bf16
 *   step 2: every warp S <- e^(g_L) S + K^T (e^(g_L - gam) D) and its bf16 copy; warps 4-7 O += QK D, out
 * (Tried in session 10's call 3 and removed: the four blocks of a head as a thread block cluster loading each
 * chunk's shared 62 KB once by multicast, pass 0.105 -> 0.305 ms a 4B layer (30 clusters of 4 fit at once:
 * two waves), clusters of 2 0.138.) */
template <int NB> __global__ void __launch_bounds__(256 * NB, 1) fk_pass_kernel(cu_gdn_args a) {
    extern __shared__ __align__(128) unsigned char fss[];
    constexpr int NST = FK_NST(NB), STG = FK_STAGE(NB);
    const int e = blockIdx.z;
    if (!ck_entry(a, e)) return;
    const int dv = a.dv, tid = threadIdx.x, half = tid >> 8, warp = (tid >> 5) & 7, lane = tid & 31,
              g = lane >> 2, t4 = lane & 3;
    const int h = blockIdx.y, cb = blockIdx.x, j0 = (cb * NB + half) * 32, n = a.meta.e_n[e],
              pos0 = a.meta.e_len[e];
    const int r0 = a.meta.e_row0[e], kh = h / (a.Hv / a.Hk);
    uint16_t *Sb = (uint16_t *)(fss + NST * STG) + half * (FK_DK + 2 * CK_CH) * FK_UL,
             *Db = Sb + FK_DK * FK_UL, *Dl = Db + CK_CH * FK_UL;
    uint64_t *full = (uint64_t *)((uint16_t *)(fss + NST * STG) + NB * (FK_DK + 2 * CK_CH) * FK_UL);
    bk_init_block(full, NST);
    const size_t stride = ck_stride(FK_DK, dv) * sizeof(float);
    int k = ck_table(a)[1 + 3 * (size_t)a.chunk_cap + e];
    if (tid == 0) { /* chunks 0, 1, 2 (the first may be short: it ends on the 64-grid) */
        int rem = n - (CK_CH - pos0 % CK_CH);
        for (int i = 0; i < NST && (i == 0 || rem > (i - 1) * CK_CH); i++)
            fk_stage<NB>(fss + i * STG, a, stride, k + i, h, kh, cb, full + i);
    }
    CK_PROF_DECL(a.chunk_prof && blockIdx.x == 0 && h == 0 && tid == 0);
    float *Sg = a.rec_state + (((size_t)a.meta.e_slot[e] * a.n_lin + a.lin) * a.Hv + h) * (size_t)FK_DK * dv;
    const int ms = warp * 16;
    float s[4][4], o[4][4] = {};
#pragma unroll
    for (int nn = 0; nn < 4; nn++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            int row = ms + g + 8 * hh, col = nn * 8 + 2 * t4;
            float2 v = *(const float2 *)(Sg + (size_t)row * dv + j0 + col);
            s[nn][2 * hh] = v.x, s[nn][2 * hh + 1] = v.y;
            *(uint32_t *)(Sb + row * FK_UL + col) = fk_pack(v.x, v.y);
        }
    __syncthreads();
    for (int c0 = 0, L, i = 0; c0 < n; c0 += L, i++, k++) {
        L = CK_CH - (pos0 + c0) % CK_CH;
        if (L > n - c0) L = n - c0;
        const int st = i % NST, rem = n - (c0 + L); /* rows after this chunk */
        unsigned char *sp = fss + st * STG;
        const uint16_t *Wb = (const uint16_t *)sp, *QKb = (const uint16_t *)(sp + FK_QK);
        const float *misc = (const float *)(sp + FK_MISC);
        const uint16_t *Ub = (const uint16_t *)(sp + FK_U + half * FK_UB),
                       *Qb = (const uint16_t *)(sp + FK_U + NB * FK_UB), *Kb = Qb + CK_CH * FK_LD;
        bk_wait(full + st, (unsigned)(i / NST) & 1u);
        CK_MARK(0);
        { /* step 1 */
            const int m0 = (warp & 3) * 16;
            const uint16_t *As = warp < 4 ? Wb : Qb;
            float p[4][4] = {};
#pragma unroll
            for (int ks = 0; ks < FK_DK / 16; ks++) {
                uint32_t af[4];
                fk_ldm<false>(af, fk_a(As, FK_LD, m0, ks * 16, lane));
                fk_mma_n32(p, af, Sb, FK_UL, ks * 16, lane);
            }
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                int row = m0 + g + 8 * hh;
                if (warp < 4) {
                    float f = misc[CK_CH + row];
#pragma unroll
                    for (int nn = 0; nn < 4; nn++) {
                        int col = nn * 8 + 2 * t4;
                        uint32_t u = *(const uint32_t *)(Ub + row * FK_UL + col);
                        float d0 = fk_lo(u) - p[nn][2 * hh], d1 = fk_hi(u) - p[nn][2 * hh + 1];
                        *(uint32_t *)(Db + row * FK_UL + col) = fk_pack(d0, d1);
                        *(uint32_t *)(Dl + row * FK_UL + col) = fk_pack(f * d0, f * d1);
                    }
                } else {
                    float eg = misc[row];
#pragma unroll
                    for (int nn = 0; nn < 4; nn++)
                        o[nn][2 * hh] = eg * p[nn][2 * hh], o[nn][2 * hh + 1] = eg * p[nn][2 * hh + 1];
                }
            }
        }
        __syncthreads();
        CK_MARK(1);
        { /* step 2 */
            const float egl = misc[2 * CK_CH];
#pragma unroll
            for (int nn = 0; nn < 4; nn++)
#pragma unroll
                for (int r = 0; r < 4; r++) s[nn][r] *= egl;
#pragma unroll
            for (int ks = 0; ks < CK_CH / 16; ks++) {
                uint32_t af[4];
                fk_ldm<true>(af, fk_at(Kb, FK_LD, ms, ks * 16, lane));
                fk_mma_n32(s, af, Dl, FK_UL, ks * 16, lane);
            }
            if (warp >= 4) {
                const int mi = warp - 4, m0 = mi * 16;
                for (int ks = 0; ks <= mi; ks++) {
                    uint32_t af[4];
                    fk_ldm<false>(af, fk_a(QKb, FK_QL, m0, ks * 16, lane));
                    fk_mma_n32(o, af, Db, FK_UL, ks * 16, lane);
                }
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    int row = m0 + g + 8 * hh;
                    if (row < L)
#pragma unroll
                        for (int nn = 0; nn < 4; nn++)
                            *(float2 *)(a.o + (size_t)(r0 + c0 + row) * a.Hv * dv + (size_t)h * dv + j0 +
                                        nn * 8 + 2 * t4) = make_float2(o[nn][2 * hh], o[nn][2 * hh + 1]);
                }
            }
            /* S's copy for the next chunk's step 1 (every read of the old one is past the barrier above) */
#pragma unroll
            for (int nn = 0; nn < 4; nn++)
#pragma unroll
                for (int hh = 0; hh < 2; hh++)
                    *(uint32_t *)(Sb + (ms + g + 8 * hh) * FK_UL + nn * 8 + 2 * t4) =
                        fk_pack(s[nn][2 * hh], s[nn][2 * hh + 1]);
        }
        __syncthreads();
        CK_MARK(2);
        /* this stage is free: chunk i + NST into it */
        if (tid == 0 && rem > (NST - 1) * CK_CH) fk_stage<NB>(sp, a, stride, k + NST, h, kh, cb, full + st);
        CK_MARK(3);
        ckp[7]++;
    }
    CK_PROF_OUT(8);
#pragma unroll
    for (int nn = 0; nn < 4; nn++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++)
            *(float2 *)(Sg + (size_t)(ms + g + 8 * hh) * dv + j0 + nn * 8 + 2 * t4) =
                make_float2(s[nn][2 * hh], s[nn][2 * hh + 1]);
}
static int g_fk_ok = 0;    /* cu_gdn_chunk_init: the fast kernels' shared memory fits and is set */
static int g_fk_sms = 132; /* the device's SMs (cu_gdn_chunk_init) */
static bool fk_serves(const cu_gdn_args *a) {
    return g_fk_ok && a->dk == FK_DK && a->dv % 32 == 0 && a->dv <= 128 && a->Hv % a->Hk == 0 &&
           fk_qk_off(a->dv) + FK_QKB <= ck_stride(a->dk, a->dv) * sizeof(float);
}

static int g_tf32_passes = 3;
extern "C" void cu_set_tf32_passes(int p) {
    g_tf32_passes = p == 1 ? 1 : 3;
}
extern "C" int cu_tf32_passes(void) {
    return g_tf32_passes;
}

extern "C" int cu_gdn_tc_init(int dk) {
    return dk % 16 == 0 && dk >= 16 && dk <= 128;
}

extern "C" int cu_gdn_chunk_cap(int T, int NE) {
    if (NE > T) NE = T;
    return T / CK_CH + 2 * NE;
}

extern "C" size_t cu_gdn_chunk_bytes(int cap, int T, int Hv, int dk, int dv) {
    return (size_t)cap * Hv * ck_stride(dk, dv) * sizeof(float) +
           (1 + 3 * (size_t)cap + (size_t)T) * sizeof(int);
}

template <class F> static int ck_attr(F *kern, size_t floats) {
    return cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)(floats * sizeof(float))) == cudaSuccess;
}

template <int P> static int ck_set_smem(int dk, int dv) {
    size_t p = ck_prep_smem_floats(dk, dv);
    int ok = ck_attr(ck_prep_kernel<P>, p) && ck_attr(ck_state_stage_kernel<P>, ck_stage_smem_floats(dk));
    if constexpr (P == 3) /* the mma.sync form (one TF32 rounding runs the WMMA one) */
        ok = ok && ck_attr(ck_prep_kernel<P, true>, p) && ck_attr(ck_prep_kernel<P, true, 128>, p) &&
             ck_attr(ck_state_mma_kernel<>, ck_mma_smem_floats(dk)) &&
             ck_attr(ck_state_mma_kernel<128>, ck_mma_smem_floats(dk)) &&
             ck_attr(ck_state_mma_kernel<128, true>, ck_mma_smem_floats(dk)) &&
             ck_attr(ck_prep_kernel<P, true, 128, true>, p);
    return ok;
}

extern "C" int cu_gdn_chunk_init(int dk, int dv) {
    int dev = 0, optin = 0;
    if (dk % 16 || dk > 128 || dk < 16 || dv % 16 || dv > 256 || dv < 16) return 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 0;
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (ck_prep_smem_floats(dk, dv) * sizeof(float) > (size_t)optin ||
        ck_stage_smem_floats(dk) * sizeof(float) > (size_t)optin ||
        ck_mma_smem_floats(dk) * sizeof(float) > (size_t)optin)
        return 0;
    int ok = ck_set_smem<1>(dk, dv) && ck_set_smem<3>(dk, dv);
    /* fast mode's kernels where they serve (dk 128; their shared memory does not depend on dv) */
    if (ok && dk == FK_DK && (size_t)FK_PASS_SMEM(1) <= (size_t)optin &&
        (size_t)FK_PASS_SMEM(2) <= (size_t)optin)
        g_fk_ok = ck_attr(fk_prep_kernel<false>, FK_PREP_SMEM / sizeof(float)) &&
                  ck_attr(fk_prep_kernel<true>, FK_PREP_SMEM / sizeof(float)) &&
                  ck_attr(fk_pass_kernel<1>, FK_PASS_SMEM(1) / sizeof(float)) &&
                  ck_attr(fk_pass_kernel<2>, FK_PASS_SMEM(2) / sizeof(float));
    cudaDeviceGetAttribute(&g_fk_sms, cudaDevAttrMultiProcessorCount, dev);
    return ok;
}

__global__ void fk_window_kernel(cu_gdn_args a);

/* fast mode's phases (parts as ck_launch's); fused: the prep also runs the conv, norms and gates from the
 * pre-conv rows (cu_gdn_layer_fast), then the slots' conv windows advance */
static void fk_launch(cu_ctx *c, const cu_gdn_args *a, int parts, bool fused) {
    long bound = (long)a->T / CK_CH + 2L * a->NE;
    dim3 gp((unsigned)bound, (unsigned)a->Hv), gs((unsigned)(a->dv / 32), (unsigned)a->Hv, (unsigned)a->NE);
    if (parts & 1) {
        ck_plan_kernel<<<1, 32, 0, c->stream>>>(*a);
        if (fused)
            fk_prep_kernel<true><<<gp, 256, FK_PREP_SMEM, c->stream>>>(*a);
        else
            fk_prep_kernel<false><<<gp, 256, FK_PREP_SMEM, c->stream>>>(*a);
        if (fused)
            fk_window_kernel<<<dim3(cdiv((size_t)a->C, 128), (unsigned)a->NE), 128, 0, c->stream>>>(*a);
    }
    if (parts & 2) {
        /* 64 columns a block where 32 would take more than one wave of the SMs (one block an SM): the 27B's
         * 48 heads, 0.838 -> 0.801 ms a layer in H200 call 3 (cuda_deltanet_prefill_fast_speed), where the
         * 4B's 32 take 0.584 with 32 and 0.636 with 64; each column's sums are the same either way */
        if ((long)gs.x * gs.y * gs.z > g_fk_sms && (a->dv / 32) % 2 == 0) {
            gs.x /= 2;
            fk_pass_kernel<2><<<gs, 512, FK_PASS_SMEM(2), c->stream>>>(*a);
        } else {
            fk_pass_kernel<1><<<gs, 256, FK_PASS_SMEM(1), c->stream>>>(*a);
        }
    }
}

/* parts: 1 the chunk table and prep, 2 the sequential pass, 3 both */
static int ck_launch(cu_ctx *c, const cu_gdn_args *a, int parts) {
    long bound = (long)a->T / CK_CH + 2L * a->NE; /* an entry of n rows spans at most n / 64 + 2 chunks */
    if (!a->chunk_scr || bound > a->chunk_cap) return 0;
    if (a->chunk_fast && fk_serves(a)) { /* fast mode: bf16 operands, one MMA a product */
        fk_launch(c, a, parts, false);
        return 1;
    }
    /* chunk_dt 0: the WMMA form ("stage"); else the mma.sync form (with one TF32 rounding, a diagnostic, the
     * WMMA form runs instead), its kernels compiled for dk = 128 where dk is 128 */
    const int one = cu_tf32_passes() == 1, mma = a->chunk_dt != 0 && !one, dk128 = a->dk == 128;
    /* chunk_dt 2: the IMG scratch and the pass staged by bulk copies, where dk is 128 and dv 32-column blocks
     */
    const int img = mma && dk128 && a->chunk_dt == 2 && a->dv % CKM_DT == 0;
    size_t sp = ck_prep_smem_floats(a->dk, a->dv) * sizeof(float);
    size_t ss = (mma ? ck_mma_smem_floats(a->dk) : ck_stage_smem_floats(a->dk)) * sizeof(float);
    dim3 gp((unsigned)bound, (unsigned)a->Hv),
        gs(cdiv((size_t)a->dv, CKS_DT), (unsigned)a->Hv, (unsigned)a->NE);
    if (parts & 1) {
        ck_plan_kernel<<<1, 32, 0, c->stream>>>(*a);
        if (img)
            ck_prep_kernel<3, true, 128, true><<<gp, 256, sp, c->stream>>>(*a);
        else if (mma && dk128)
            ck_prep_kernel<3, true, 128><<<gp, 256, sp, c->stream>>>(*a);
        else if (mma)
            ck_prep_kernel<3, true><<<gp, 256, sp, c->stream>>>(*a);
        else if (one)
            ck_prep_kernel<1><<<gp, 256, sp, c->stream>>>(*a);
        else
            ck_prep_kernel<3><<<gp, 256, sp, c->stream>>>(*a);
    }
    if (parts & 2) {
        if (img)
            ck_state_mma_kernel<128, true><<<gs, 256, ss, c->stream>>>(*a);
        else if (mma && dk128)
            ck_state_mma_kernel<128><<<gs, 256, ss, c->stream>>>(*a);
        else if (mma)
            ck_state_mma_kernel<><<<gs, 256, ss, c->stream>>>(*a);
        else if (one)
            ck_state_stage_kernel<1><<<gs, 256, ss, c->stream>>>(*a);
        else
            ck_state_stage_kernel<3><<<gs, 256, ss, c->stream>>>(*a);
    }
    return 1;
}

/* 0 when this batch cannot take the phased form (no scratch, or more chunks than it holds): the caller runs
 * the scalar chunked kernel instead */
extern "C" int cu_gdn_chunked_phased(cu_ctx *c, const cu_gdn_args *a) {
    return ck_launch(c, a, 3);
}

extern "C" int cu_gdn_chunk_part(cu_ctx *c, const cu_gdn_args *a, int parts) {
    return ck_launch(c, a, parts);
}

extern "C" int cu_gdn_chunk_fast_serves(const cu_gdn_args *a) {
    return fk_serves(a);
}

/* the fused layer's tail: the slots' conv windows advance by the entries' last K - 1 pre-conv rows (after
 * every prep block read the old ones; deltanet.cu's conv_window_kernel), and the gated RMSNorm of each (row,
 * value head) output, rmsnorm(o) * gnorm * silu(z) (deltanet.cu's gnorm_kernel, with its out_proj halves for
 * CINFER_CUDA_PF_SPLIT) */
__global__ void fk_window_kernel(cu_gdn_args a) {
    int e = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= a.C) return;
    int n = a.meta.e_n[e], r0 = a.meta.e_row0[e], K = a.K, C = a.C;
    float *st = a.conv_state + ((size_t)a.meta.e_slot[e] * a.n_lin + a.lin) * (size_t)(K - 1) * C + c;
    float x[3];
#pragma unroll
    for (int j = 0; j < 3; j++) {
        int i = n - 3 + j;
        x[j] = i >= 0 ? a.qkv[(size_t)(r0 + i) * a.qkv_ld + c] : st[(size_t)(i + 3) * C];
    }
#pragma unroll
    for (int j = 0; j < 3; j++) st[(size_t)j * C] = x[j];
}
__global__ void fk_gnorm_kernel(cu_gdn_args a) {
    int r = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5, dv = a.dv;
    for (int h = warp; h < a.Hv; h += nw) {
        float *o = a.o + (size_t)r * a.Hv * dv + (size_t)h * dv;
        const float *z = a.z + (size_t)r * a.z_ld + (size_t)h * dv;
        float ss = 0.0f;
        for (int j = lane; j < dv; j += 32) ss = fmaf(o[j], o[j], ss);
        ss = warp_sum(ss);
        float inv = 1.0f / sqrtf(ss / (float)dv + a.eps);
        size_t base = (size_t)r * a.Hv * dv + (size_t)h * dv;
        for (int j = lane; j < dv; j += 32) {
            float v = ((o[j] * inv) * a.gnorm[j]) * dev_silu(z[j]);
            if (a.o_xb)
                split_put(a.o_xb, base + j, a.o_lo, v);
            else
                o[j] = v;
        }
    }
}

extern "C" int cu_gdn_layer_fast(cu_ctx *c, const cu_gdn_args *a) {
    long bound = (long)a->T / CK_CH + 2L * a->NE;
    if (a->T <= 0 || !a->chunk_fast || !fk_serves(a) || a->has_spec || a->K != 4 || a->dv != FK_DK ||
        a->qkv_ld % 4 || a->C % 4 || ((uintptr_t)a->qkv & 15) || !a->chunk_scr || bound > a->chunk_cap)
        return 0;
    fk_launch(c, a, 3, true);
    fk_gnorm_kernel<<<a->T, 128, 0, c->stream>>>(*a);
    return 1;
}

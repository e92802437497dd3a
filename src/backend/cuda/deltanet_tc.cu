/* deltanet_tc.cu — the chunked Gated DeltaNet prefill (spec §4, WY/UT form, chunk 64 on the absolute grid)
 * with every product on the tensor cores: TF32 WMMA (m16n16k8) with f32 accumulation, straight from the f32
 * rows in shared memory, each operand split into TF32 hi + lo (three MMAs per product, tf32x3.cuh: one TF32
 * rounding lost ~4e-4 per product, 1e-2..3e-2 at the fixtures' logits; split, it matches f32). Selected by
 * cu_gdn_args.tc (CINFER_CUDA_PREFILL=tc or gdn); the scalar chunked_kernel of deltanet.cu stays the
 * default until a device run shows this one within bounds and faster.
 *
 * A block per (entry, value head, GDN_TC_DT value columns), 8 warps. Per chunk of L <= 64 rows (rows past L
 * are zeros, so every product runs on full 16-row tiles):
 *   A  = K K^T, QK = Q K^T                                (TC)
 *   A  <- beta_r e^(g_r - g_s) A (s < r), QK <- e^(g_r - g_s) QK (s <= r)
 *   T  = (I + A)^-1, unit lower triangular: 16x16 diagonal blocks by substitution, then the off-diagonal
 *        blocks T_ij = -T_ii sum_k A_ik T_kj (f32, scalar: 64x64 is small against the dk-wide products)
 *   W  = T diag(beta e^g) K                                (TC)
 *   D  = T diag(beta) V - W S                              (TC, one accumulator)
 *   O  = diag(e^g) Q S + QK D                              (TC, one accumulator)
 *   S <- e^(g_L) S + (diag(e^(g_L - g_r)) K)^T D           (TC, the state's f32 accumulator in place)
 * The state's column slice lives in shared memory for the whole entry and goes back to the slot at the end.
 */
#include <mma.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/tf32x3.cuh"

using namespace nvcuda;

#define TC_CH   64 /* chunk length, = GDN_CHUNK */
#define TC_DT   32 /* value columns per block */
#define TC_GLD  (TC_CH + 4)
#define TC_VLD  (TC_DT + 4)
#define TC_MAXK 128 /* dk limit: shared memory */

typedef tc_facc facc;

/* shared memory in floats: Ks, Qs, Ws [64][dk + 4]; A, T, QK [64][68]; V, D [64][36]; S [dk][36];
 * X [3][16][16]; gam, bet, egam, fl [64]. Every array starts on a multiple of 8 floats (32 bytes, WMMA). */
static size_t tc_smem_floats(int dk) {
    size_t kld = (size_t)dk + 4;
    return 3 * TC_CH * kld + 3 * TC_CH * TC_GLD + 2 * TC_CH * TC_VLD + (size_t)dk * TC_VLD + 3 * 256 +
           4 * TC_CH;
}

template <int P> __global__ void __launch_bounds__(256) chunked_tc_kernel(cu_gdn_args a) {
    extern __shared__ __align__(128) float smt[];
    int e = blockIdx.z;
    int n = a.meta.e_n[e], pos0 = a.meta.e_len[e];
    if ((n == 1 && pos0 > 0) || (a.has_spec && a.meta.e_spec[e])) return; /* recurrent_kernel's */
    const int dk = a.dk, dv = a.dv, KLD = dk + 4, tid = threadIdx.x, nt = blockDim.x, warp = tid >> 5;
    const int nw = nt >> 5;
    int h = blockIdx.y, j0 = blockIdx.x * TC_DT;
    int r0 = a.meta.e_row0[e], kh = h / (a.Hv / a.Hk), kd = a.Hk * dk, C = a.C;
    float *Ks = smt, *Qs = Ks + TC_CH * KLD, *Ws = Qs + TC_CH * KLD, *Am = Ws + TC_CH * KLD;
    float *Tm = Am + TC_CH * TC_GLD, *QK = Tm + TC_CH * TC_GLD, *Vs = QK + TC_CH * TC_GLD;
    float *Ds = Vs + TC_CH * TC_VLD, *Ss = Ds + TC_CH * TC_VLD, *X = Ss + (size_t)dk * TC_VLD;
    float *gam = X + 3 * 256, *bet = gam + TC_CH, *egam = bet + TC_CH, *fl = egam + TC_CH;
    float *Sg = a.rec_state + (((size_t)a.meta.e_slot[e] * a.n_lin + a.lin) * a.Hv + h) * (size_t)dk * dv;
    for (int idx = tid; idx < dk * TC_DT; idx += nt) {
        int i = idx / TC_DT, jj = idx % TC_DT;
        Ss[i * TC_VLD + jj] = j0 + jj < dv ? Sg[(size_t)i * dv + j0 + jj] : 0.0f;
    }
    const int mt_k = dk / 16; /* 16-wide tiles along dk */
    for (int c0 = 0, L; c0 < n; c0 += L) {
        L = TC_CH - (pos0 + c0) % TC_CH;
        if (L > n - c0) L = n - c0;
        __syncthreads(); /* the previous chunk's readers of Ks, Qs, Vs, Ds are done */
        for (int idx = tid; idx < TC_CH * dk; idx += nt) {
            int t = idx / dk, i = idx % dk;
            float qv = 0.0f, kv = 0.0f;
            if (t < L) {
                const float *row = a.conv_out + (size_t)(r0 + c0 + t) * C;
                qv = row[(size_t)kh * dk + i];
                kv = row[kd + (size_t)kh * dk + i];
            }
            Qs[t * KLD + i] = qv;
            Ks[t * KLD + i] = kv;
        }
        for (int idx = tid; idx < TC_CH * TC_DT; idx += nt) {
            int t = idx / TC_DT, jj = idx % TC_DT;
            Vs[t * TC_VLD + jj] =
                t < L && j0 + jj < dv
                    ? a.conv_out[(size_t)(r0 + c0 + t) * C + 2 * (size_t)kd + (size_t)h * dv + j0 + jj]
                    : 0.0f;
        }
        if (tid == 0) {
            /* the CPU's cumulative sum and factor expressions; rows past L contribute nothing */
            float acc = 0.0f;
            for (int t = 0; t < L; t++) {
                const float *bg = a.bg + (size_t)(r0 + c0 + t) * 2 * a.Hv;
                acc += bg[a.Hv + h];
                gam[t] = acc;
                bet[t] = bg[h];
            }
            for (int t = 0; t < TC_CH; t++) {
                egam[t] = t < L ? expf(gam[t]) : 0.0f;
                fl[t] = t < L ? expf(gam[L - 1] - gam[t]) : 0.0f;
                if (t >= L) gam[t] = 0.0f, bet[t] = 0.0f;
            }
        }
        __syncthreads();
        /* A = K K^T and QK = Q K^T: 2 x 16 tiles */
        for (int t = warp; t < 32; t += nw) {
            int which = t >> 4, mi = (t >> 2) & 3, ni = t & 3;
            facc acc;
            wmma::fill_fragment(acc, 0.0f);
            if (ni <= mi) /* tiles above the diagonal are masked to zero below anyway */
                tc_mma<P, wmma::row_major, wmma::col_major>(acc, (which ? Qs : Ks) + mi * 16 * KLD, KLD,
                                                            Ks + ni * 16 * KLD, KLD, dk);
            wmma::store_matrix_sync((which ? QK : Am) + mi * 16 * TC_GLD + ni * 16, acc, TC_GLD,
                                    wmma::mem_row_major);
        }
        __syncthreads();
        for (int idx = tid; idx < TC_CH * TC_CH; idx += nt) {
            int r = idx / TC_CH, s = idx % TC_CH;
            float d = r < L && s <= r ? expf(gam[r] - gam[s]) : 0.0f;
            Am[r * TC_GLD + s] = s < r ? bet[r] * d * Am[r * TC_GLD + s] : 0.0f;
            QK[r * TC_GLD + s] = d * QK[r * TC_GLD + s];
        }
        __syncthreads();
        /* T = (I + A)^-1: thread (b, c) of the first 64 inverts column c of diagonal block b by substitution;
         * the rest zero the blocks above the diagonal */
        if (tid < 64) {
            int base = (tid >> 4) * 16, c = tid & 15;
            for (int r = 0; r < 16; r++) {
                float v = r == c ? 1.0f : 0.0f;
                for (int s = c; s < r; s++)
                    v = fmaf(-Am[(base + r) * TC_GLD + base + s], Tm[(base + s) * TC_GLD + base + c], v);
                Tm[(base + r) * TC_GLD + base + c] = v;
            }
        }
        for (int idx = tid; idx < TC_CH * TC_CH; idx += nt) {
            int r = idx / TC_CH, s = idx % TC_CH;
            if (s / 16 > r / 16) Tm[r * TC_GLD + s] = 0.0f;
        }
        __syncthreads();
        for (int bi = 1; bi < 4; bi++) {
            /* X_j = sum_{k=j}^{bi-1} A_{bi,k} T_{k,j} for j < bi */
            for (int idx = tid; idx < bi * 256; idx += nt) {
                int bj = idx >> 8, rr = (idx >> 4) & 15, cc = idx & 15;
                float x = 0.0f;
                for (int m = bj * 16; m < bi * 16; m++)
                    x = fmaf(Am[(bi * 16 + rr) * TC_GLD + m], Tm[m * TC_GLD + bj * 16 + cc], x);
                X[idx] = x;
            }
            __syncthreads();
            /* T_{bi,j} = -T_{bi,bi} X_j */
            for (int idx = tid; idx < bi * 256; idx += nt) {
                int bj = idx >> 8, rr = (idx >> 4) & 15, cc = idx & 15;
                float v = 0.0f;
                for (int m = 0; m < 16; m++)
                    v = fmaf(Tm[(bi * 16 + rr) * TC_GLD + bi * 16 + m], X[bj * 256 + m * 16 + cc], v);
                Tm[(bi * 16 + rr) * TC_GLD + bj * 16 + cc] = -v;
            }
            __syncthreads();
        }
        /* Am <- T diag(beta e^g) (A is no longer needed), T <- T diag(beta), Q rows scaled by e^g */
        for (int idx = tid; idx < TC_CH * TC_CH; idx += nt) {
            int r = idx / TC_CH, s = idx % TC_CH;
            float tv = Tm[r * TC_GLD + s];
            Am[r * TC_GLD + s] = tv * (bet[s] * egam[s]);
            Tm[r * TC_GLD + s] = tv * bet[s];
        }
        for (int idx = tid; idx < TC_CH * dk; idx += nt) {
            int t = idx / dk, i = idx % dk;
            Qs[t * KLD + i] *= egam[t];
        }
        __syncthreads();
        /* W = (T diag(beta e^g)) K: 4 x dk/16 tiles */
        for (int t = warp; t < 4 * mt_k; t += nw) {
            int mi = t / mt_k, ni = t % mt_k;
            facc acc;
            wmma::fill_fragment(acc, 0.0f);
            tc_mma<P, wmma::row_major, wmma::row_major>(acc, Am + mi * 16 * TC_GLD, TC_GLD, Ks + ni * 16, KLD,
                                                        TC_CH);
            wmma::store_matrix_sync(Ws + mi * 16 * KLD + ni * 16, acc, KLD, wmma::mem_row_major);
        }
        __syncthreads();
        /* D = (T diag(beta)) V - W S: 4 x 2 tiles */
        for (int t = warp; t < 8; t += nw) {
            int mi = t >> 1, ni = t & 1;
            facc acc;
            wmma::fill_fragment(acc, 0.0f);
            tc_mma<P, wmma::row_major, wmma::row_major>(acc, Tm + mi * 16 * TC_GLD, TC_GLD, Vs + ni * 16,
                                                        TC_VLD, TC_CH);
            tc_mma<P, wmma::row_major, wmma::row_major>(acc, Ws + mi * 16 * KLD, KLD, Ss + ni * 16, TC_VLD,
                                                        dk, true);
            wmma::store_matrix_sync(Ds + mi * 16 * TC_VLD + ni * 16, acc, TC_VLD, wmma::mem_row_major);
        }
        __syncthreads();
        /* O = (e^g Q) S + QK D into Ws (free now); K rows scaled by e^(g_L - g_r) for the state update */
        for (int t = warp; t < 8; t += nw) {
            int mi = t >> 1, ni = t & 1;
            facc acc;
            wmma::fill_fragment(acc, 0.0f);
            tc_mma<P, wmma::row_major, wmma::row_major>(acc, Qs + mi * 16 * KLD, KLD, Ss + ni * 16, TC_VLD,
                                                        dk);
            tc_mma<P, wmma::row_major, wmma::row_major>(acc, QK + mi * 16 * TC_GLD, TC_GLD, Ds + ni * 16,
                                                        TC_VLD, TC_CH);
            wmma::store_matrix_sync(Ws + mi * 16 * TC_VLD + ni * 16, acc, TC_VLD, wmma::mem_row_major);
        }
        for (int idx = tid; idx < TC_CH * dk; idx += nt) {
            int t = idx / dk, i = idx % dk;
            Ks[t * KLD + i] *= fl[t];
        }
        __syncthreads();
        for (int idx = tid; idx < L * TC_DT; idx += nt) {
            int r = idx / TC_DT, jj = idx % TC_DT;
            if (j0 + jj < dv)
                a.o[(size_t)(r0 + c0 + r) * a.Hv * dv + (size_t)h * dv + j0 + jj] = Ws[r * TC_VLD + jj];
        }
        /* S <- e^(g_L) S + (fl K)^T D: dk/16 x 2 tiles, each warp its own tiles of S in place */
        float egl = egam[L - 1];
        for (int t = warp; t < 2 * mt_k; t += nw) {
            int mi = t >> 1, ni = t & 1;
            facc acc;
            wmma::load_matrix_sync(acc, Ss + mi * 16 * TC_VLD + ni * 16, TC_VLD, wmma::mem_row_major);
#pragma unroll
            for (int u = 0; u < acc.num_elements;
                 u++) /* rounded before the adds: never contracted into them */
                acc.x[u] = __fmul_rn(acc.x[u], egl);
            tc_mma<P, wmma::col_major, wmma::row_major>(acc, Ks + mi * 16, KLD, Ds + ni * 16, TC_VLD, TC_CH);
            wmma::store_matrix_sync(Ss + mi * 16 * TC_VLD + ni * 16, acc, TC_VLD, wmma::mem_row_major);
        }
    }
    __syncthreads();
    for (int idx = tid; idx < dk * TC_DT; idx += nt) {
        int i = idx / TC_DT, jj = idx % TC_DT;
        if (j0 + jj < dv) Sg[(size_t)i * dv + j0 + jj] = Ss[i * TC_VLD + jj];
    }
}

static int g_tf32_passes = 3;
extern "C" void cu_set_tf32_passes(int p) {
    g_tf32_passes = p == 1 ? 1 : 3;
}
extern "C" int cu_tf32_passes(void) {
    return g_tf32_passes;
}

extern "C" int cu_gdn_tc_init(int dk) {
    int dev = 0, optin = 0;
    if (dk % 16 || dk > TC_MAXK || dk < 32) return 0; /* O passes through Ws: 64 x 36 floats need dk >= 32 */
    if (cudaGetDevice(&dev) != cudaSuccess) return 0;
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    size_t smem = tc_smem_floats(dk) * sizeof(float);
    if (smem > (size_t)optin) return 0;
    return cudaFuncSetAttribute(chunked_tc_kernel<3>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)smem) == cudaSuccess &&
           cudaFuncSetAttribute(chunked_tc_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)smem) == cudaSuccess;
}

extern "C" void cu_gdn_chunked_tc(cu_ctx *c, const cu_gdn_args *a) {
    size_t smem = tc_smem_floats(a->dk) * sizeof(float);
    dim3 grid(cdiv((size_t)a->dv, TC_DT), (unsigned)a->Hv, (unsigned)a->NE);
    if (g_tf32_passes == 1)
        chunked_tc_kernel<1><<<grid, 256, smem, c->stream>>>(*a);
    else
        chunked_tc_kernel<3><<<grid, 256, smem, c->stream>>>(*a);
}

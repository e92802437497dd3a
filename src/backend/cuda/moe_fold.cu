/* moe_fold.cu — the MoE router off the decode step's critical path (CINFER_CUDA_MOE_FOLD): a MoE layer's
 * out_proj launch also computes the router's choice.
 *
 * With h the residual before out_proj, a its input, h' = h + W_o a, g = (1 + w_post) and s = 1 / rms(h'), the
 * router's logits are s W_r (g h'). s > 0 does not change which k are largest, so the choice needs only
 * z = W_r (g h) + W' a with W' = W_r diag(g) W_o, a [E][D] matrix made once at upload
 * (cu_moe_fold_weights): z needs neither h' nor its norm, so its rows go in the same launch as out_proj's (z
 * blocks first in the grid, out_proj blocks after), and the last z block of a tile of rows selects the k
 * experts while the out_proj blocks still stream. The last block of the launch, once h' is complete, takes
 * its RMSNorm exactly as cu_add_rmsnorm would (the gate_up kernel reads those rows), writes h' into the
 * residual and makes the weights softmax(s z) (renormalised over the k): the gate_up and down kernels run as
 * they do after the router (moe_fused.cu).
 *
 * out_proj's rows are gemv3.cu's at the same splits (cu_gemv3_splits): per lane the chunks of a split in
 * increasing order, the butterfly, the splits summed in order, then h + v: the same bits as cu_gemv_fused's
 * residual form at every row count. Here h' goes to y first (not into h in place: the z blocks read h while
 * the out_proj blocks run). Every block works on whole rows of its tile and every sum has a fixed order, so
 * a row's result never depends on the rows beside it in the launch. */
#include "backend/cuda/common.cuh"

#define FO_WARPS 8
#define FO_NB    8 /* chunks of 256 per lane requested at once */
#define FO_MAX_E 1024
#define FO_MAX_K 32
#define FO_NJ    16 /* the last block's row in registers: H <= 4096 */

/* acc += w (8 bf16 in u) . x (8 floats), low half then high (gemv3's order) */
__device__ __forceinline__ float fo_fma8(uint4 u, const float (&x)[8], float acc) {
    const uint32_t p[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int q = 0; q < 4; q++) {
        acc = fmaf(__uint_as_float(p[q] << 16), x[2 * q], acc);
        acc = fmaf(__uint_as_float(p[q] & 0xffff0000u), x[2 * q + 1], acc);
    }
    return acc;
}

__device__ __forceinline__ void fo_ld8(float (&v)[8], const float *p) {
    const float4 *q = reinterpret_cast<const float4 *>(p);
    float4 a = __ldg(q), b = __ldg(q + 1);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

/* f32 keys whose unsigned order is the floats' order, 0 reserved (taken) */
__device__ __forceinline__ unsigned fo_key(float f) {
    unsigned u = __float_as_uint(f);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return u ? u : 1u;
}

/* acc[m] += the bf16 row w (K elements, one lane's chunks c = c0, c0 + step, ... below c1) times rows m
 * of x (x + m ldx, scaled elementwise by gsc when given); up to FO_NB chunks requested before their FMAs.
 * Lane l takes elements 256 c + 8 l. */
template <int MR, bool WAIT = false>
__device__ __forceinline__ void fo_dot(float (&acc)[MR], const uint16_t *w, const float *x, size_t ldx,
                                       const float *gsc, int K, int c0, int c1, int step, int lane) {
    const int nch = c1;
    for (int cb = c0; cb < nch; cb += step * FO_NB) {
        uint4 u[FO_NB];
#pragma unroll
        for (int i = 0; i < FO_NB; i++) {
            int c = cb + i * step, k = c * 256 + lane * 8;
            u[i] = c < nch && k < K ? __ldcs(reinterpret_cast<const uint4 *>(w + k)) : make_uint4(0, 0, 0, 0);
        }
        /* WAIT: the first batch of weights is requested before waiting for the kernel that writes x */
        if (WAIT && cb == c0) griddep_wait();
#pragma unroll
        for (int i = 0; i < FO_NB; i++) {
            int c = cb + i * step, k = c * 256 + lane * 8;
            if (c >= nch || k >= K) break;
            float gv[8];
            if (gsc) fo_ld8(gv, gsc + k);
#pragma unroll
            for (int m = 0; m < MR; m++) {
                float xv[8];
                fo_ld8(xv, x + (size_t)m * ldx + k);
                if (gsc)
#pragma unroll
                    for (int q = 0; q < 8; q++) xv[q] *= gv[q];
                acc[m] = fo_fma8(u[i], xv, acc[m]);
            }
        }
    }
}

/* the f32 row form (W' in f32): 8 floats per lane and chunk, chunks c0 .. c1 - 1 */
template <int MR, bool WAIT = false>
__device__ __forceinline__ void fo_dot_f32(float (&acc)[MR], const float *w, const float *x, size_t ldx,
                                           int K, int c0, int c1, int lane) {
    const int nch = c1;
    for (int cb = c0; cb < nch; cb += FO_NB / 2) {
        float4 u[FO_NB / 2][2];
#pragma unroll
        for (int i = 0; i < FO_NB / 2; i++) {
            int k = (cb + i) * 256 + lane * 8;
            if (cb + i < nch && k < K) {
                const float4 *p = reinterpret_cast<const float4 *>(w + k);
                u[i][0] = __ldcs(p), u[i][1] = __ldcs(p + 1);
            } else {
                u[i][0] = u[i][1] = make_float4(0.f, 0.f, 0.f, 0.f);
            }
        }
        if (WAIT && cb == c0) griddep_wait();
#pragma unroll
        for (int i = 0; i < FO_NB / 2; i++) {
            int k = (cb + i) * 256 + lane * 8;
            if (cb + i >= nch || k >= K) break;
            const float wv[8] = {u[i][0].x, u[i][0].y, u[i][0].z, u[i][0].w,
                                 u[i][1].x, u[i][1].y, u[i][1].z, u[i][1].w};
#pragma unroll
            for (int m = 0; m < MR; m++) {
                float xv[8];
                fo_ld8(xv, x + (size_t)m * ldx + k);
#pragma unroll
                for (int q = 0; q < 8; q++) acc[m] = fmaf(wv[q], xv[q], acc[m]);
            }
        }
    }
}

/* out_proj's weight rows a warp at MR rows of x (gemv3's choice: 1, 2 at 2-3 rows, 4 from 4) */
__host__ __device__ constexpr int fo_nr(int mr) {
    return mr == 1 ? 1 : mr < 4 ? 2 : 4;
}

/* out_proj's form of fo_dot: NR weight rows a warp (each x chunk loaded once for them), FO_NB / NR chunks
 * of each requested at once; per row and lane the same chunks in the same order as fo_dot (and gemv3) */
template <int MR, int NR, bool WAIT>
__device__ __forceinline__ void fo_rows(float (&acc)[NR][MR], const uint16_t *const (&w)[NR], const float *x,
                                        size_t ldx, int K, int c0, int c1, int step, int lane) {
    constexpr int NB = FO_NB / NR > 0 ? FO_NB / NR : 1;
    for (int cb = c0; cb < c1; cb += step * NB) {
        uint4 u[NB][NR];
#pragma unroll
        for (int i = 0; i < NB; i++) {
            int c = cb + i * step, k = c * 256 + lane * 8;
#pragma unroll
            for (int q = 0; q < NR; q++)
                u[i][q] = c < c1 && k < K ? __ldcs(reinterpret_cast<const uint4 *>(w[q] + k))
                                          : make_uint4(0, 0, 0, 0);
        }
        if (WAIT && cb == c0) griddep_wait();
#pragma unroll
        for (int i = 0; i < NB; i++) {
            int c = cb + i * step, k = c * 256 + lane * 8;
            if (c >= c1 || k >= K) break;
#pragma unroll
            for (int m = 0; m < MR; m++) {
                float xv[8];
                fo_ld8(xv, x + (size_t)m * ldx + k);
#pragma unroll
                for (int q = 0; q < NR; q++) acc[q][m] = fo_fma8(u[i][q], xv, acc[q][m]);
            }
        }
    }
}

/* Grid (ZB + OB, tiles), FO_WARPS warps. Blocks < ZB: z in parts, a warp per (part, expert) of the tile's MR
 * rows (below); the last of them to finish (count[tile], left at 0 again) sums each row's parts, writes z
 * and selects the k largest (ties to the lower expert, the CPU's stable selection) in warp m for row m: idx
 * in ascending expert order, zsel their z. Blocks >= ZB: out_proj, 8 / KS rows a block, KS warps a row. */
template <int MR, int EW>
__device__ void fo_select(float *z, const float *zpart, int *idx, unsigned *count, int E, int k, int P,
                          size_t r0);
template <int MR, int EW>
__device__ void fo_finish(float *x, const float *y, float *xn, const float *g, float eps, const float *z,
                          const int *idx, float *wout, int norm, unsigned *count, int H, int E, int k,
                          size_t r0);

template <int MR, bool WF32, int EW, int NR = fo_nr(MR)>
__global__ void __launch_bounds__(FO_WARPS * 32, MR == 1 ? 4 : 2) /* one row: 64 registers, 4 blocks an SM */
    fo_kernel(float *x, const float *__restrict__ a, const uint16_t *__restrict__ w_o,
              const uint16_t *__restrict__ router, const float *__restrict__ g, const void *__restrict__ wf,
              float *y, float *xn, float eps, float *z, float *zpart, int *idx, float *wout, int norm,
              unsigned *count, int H, int D, int E, int k, int KS, int ZB, int P, int PC, const void *pf0,
              size_t pf0_bytes, const void *pf1, size_t pf1_bytes) {
    __shared__ float red[FO_WARPS][NR * MR];
    __shared__ int last;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t r0 = (size_t)blockIdx.y * MR;
    x += r0 * H, a += r0 * D, y += r0 * H, z += r0 * E, zpart += r0 * (1 + P) * E;
    if ((int)blockIdx.x >= ZB) { /* out_proj: gemv3's splits and order, NR rows a warp */
        const int RG = FO_WARPS / KS, rg = warp / KS, ks = warp % KS;
        const int j0 = (((int)blockIdx.x - ZB) * RG + rg) * NR;
        float acc[NR][MR];
        const uint16_t *wr[NR];
#pragma unroll
        for (int q = 0; q < NR; q++) {
#pragma unroll
            for (int m = 0; m < MR; m++) acc[q][m] = 0.0f;
            wr[q] = w_o + (size_t)(j0 + q < H ? j0 + q : H - 1) * D;
        }
        if (j0 < H) fo_rows<MR, NR, true>(acc, wr, a, (size_t)D, D, ks, (D + 255) >> 8, KS, lane);
        griddep_wait(); /* again for warps without a row: every thread waits (common.cuh) */
        griddep_launch();
#pragma unroll
        for (int q = 0; q < NR; q++)
#pragma unroll
            for (int m = 0; m < MR; m++) {
                float v = warp_sum(acc[q][m]);
                if (lane == 0) red[warp][q * MR + m] = v;
            }
        __syncthreads();
        for (int t = threadIdx.x; t < RG * NR * MR; t += blockDim.x) {
            int grp = t / (NR * MR), q = (t / MR) % NR, m = t % MR;
            int jj = (((int)blockIdx.x - ZB) * RG + grp) * NR + q;
            if (jj < H) {
                float v = red[grp * KS][q * MR + m];
                for (int s2 = 1; s2 < KS; s2++) v += red[grp * KS + s2][q * MR + m];
                y[(size_t)m * H + jj] = x[(size_t)m * H + jj] + v;
            }
        }
        fo_finish<MR, EW>(x, y, xn, g, eps, z, idx, wout, norm, count, H, E, k, r0);
        return;
    }
    /* z in parts, a warp each: part 0 the router's row times g h (the residual h was written two kernels back
     * or earlier, the kernel before this one writes a: under PDL complete when this kernel starts,
     * common.cuh's chain, so it is summed before the wait), part p >= 1 chunks PC (p - 1) .. PC p - 1 of W'
     * times a (their weights requested before the wait), so that every z warp is one round trip after the
     * wait; the parts go to zpart [MR][1 + P][E] and the selecting block sums them in part order */
    const int item = blockIdx.x * FO_WARPS + warp, e = item % E, part = item / E;
    float acc[MR];
#pragma unroll
    for (int m = 0; m < MR; m++) acc[m] = 0.0f;
    if (part == 0)
        fo_dot<MR>(acc, router + (size_t)e * H, x, (size_t)H, g, H, 0, (H + 255) >> 8, 1, lane);
    else if (part <= P) {
        int c0 = (part - 1) * PC, c1 = c0 + PC < ((D + 255) >> 8) ? c0 + PC : ((D + 255) >> 8);
        if (WF32)
            fo_dot_f32<MR, true>(acc, static_cast<const float *>(wf) + (size_t)e * D, a, (size_t)D, D, c0, c1,
                                 lane);
        else
            fo_dot<MR, true>(acc, static_cast<const uint16_t *>(wf) + (size_t)e * D, a, (size_t)D, NULL, D,
                             c0, c1, 1, lane);
    }
    griddep_wait(); /* again: every thread waits (common.cuh) */
    if (part <= P) {
#pragma unroll
        for (int m = 0; m < MR; m++) {
            float v = warp_sum(acc[m]);
            if (lane == 0) zpart[((size_t)m * (1 + P) + part) * E + e] = v;
        }
        if (lane == 0) __threadfence(); /* visible device-wide before this block counts itself done */
    }
    griddep_launch();
    /* bytes the next kernels read whatever the choice (the shared expert's weights) into L2, a slice per z
     * block of the first tile */
    if (threadIdx.x == 0 && blockIdx.y == 0) {
        if (pf0) l2_prefetch_part(pf0, pf0_bytes, blockIdx.x, ZB);
        if (pf1) l2_prefetch_part(pf1, pf1_bytes, blockIdx.x, ZB);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(&count[2 * blockIdx.y], 1u) == (unsigned)ZB - 1;
    }
    __syncthreads();
    if (last) fo_select<MR, EW>(z, zpart, idx, count, E, k, P, r0);
    fo_finish<MR, EW>(x, y, xn, g, eps, z, idx, wout, norm, count, H, E, k, r0);
}

/* the last z block of a tile: each row's z (its parts summed in order) and its k largest (ties to the lower
 * expert, the CPU's stable selection) in warp m for row m, idx in ascending expert order */
template <int MR, int EW>
__device__ void fo_select(float *z, const float *zpart, int *idx, unsigned *count, int E, int k, int P,
                          size_t r0) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x == 0) count[2 * blockIdx.y] = 0; /* ready for the next launch (stream order) */
    __threadfence();
    for (int m = warp; m < MR; m += FO_WARPS) {
        float *zr = z + (size_t)m * E;
        const float *zp = zpart + (size_t)m * (1 + P) * E;
        unsigned kv[EW];
        float zv[EW];
#pragma unroll
        for (int i = 0; i < EW; i++) {
            int ee = lane + 32 * i;
            if (ee < E) {
                float pv[8]; /* the parts requested at once, summed in order */
#pragma unroll
                for (int p = 0; p < 8; p++) pv[p] = p <= P ? __ldcg(zp + (size_t)p * E + ee) : 0.0f;
                float v = pv[0];
#pragma unroll
                for (int p = 1; p < 8; p++)
                    if (p <= P) v += pv[p];
                for (int p = 8; p <= P; p++) v += __ldcg(zp + (size_t)p * E + ee);
                zv[i] = v, zr[ee] = v;
                kv[i] = fo_key(v);
            } else {
                zv[i] = 0.0f, kv[i] = 0u;
            }
        }
        /* k rounds: the largest key, then the lowest expert holding it; the winner's lane drops it */
        int my_e = 0;
        for (int j = 0; j < k; j++) {
            unsigned bv = 0;
            int bi = 0;
#pragma unroll
            for (int i = 0; i < EW; i++)
                if (kv[i] > bv) bv = kv[i], bi = i;
            unsigned mx = __reduce_max_sync(0xffffffffu, bv);
            unsigned be = __reduce_min_sync(0xffffffffu, bv == mx ? (unsigned)(lane + 32 * bi) : 0xffffffffu);
            if (lane == j) my_e = (int)be;
            if ((int)(be & 31u) == lane) {
#pragma unroll
                for (int i = 0; i < EW; i++)
                    if (lane + 32 * i == (int)be) kv[i] = 0u;
            }
        }
        int rank = 0;
        for (int j = 0; j < k; j++) rank += __shfl_sync(0xffffffffu, my_e, j) < my_e;
        if (lane < k) idx[(r0 + m) * k + rank] = my_e;
    }
    __threadfence();
}

/* Every block of the launch ends here; the last of a tile (count[2 tile + 1], left at 0 again), once h' and
 * the choice are complete, takes each row's RMSNorm as cu_add_rmsnorm does (256 threads, its sums, its
 * expression) into xn, writes h' into the residual x, and makes the chosen experts' weights the router's
 * way: softmax over all E of z / rms(h') (the logits of W_r xn up to rounding), renormalised over the k
 * when norm, in ascending expert order */
template <int MR, int EW>
__device__ void fo_finish(float *x, const float *y, float *xn, const float *g, float eps, const float *z,
                          const int *idx, float *wout, int norm, unsigned *count, int H, int E, int k,
                          size_t r0) {
    __shared__ float sh[32];
    __shared__ int last2;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last2 = atomicAdd(&count[2 * blockIdx.y + 1], 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last2) return;
    if (threadIdx.x == 0) count[2 * blockIdx.y + 1] = 0;
    __threadfence();
    /* every load of a step requested at once (this block is the launch's serial tail): H <= 256 FO_NJ in
     * registers, the sums in row_add_rms_inv's order */
    for (int m = 0; m < MR; m++) {
        const float *yr = y + (size_t)m * H;
        float v[FO_NJ];
        float ss = 0.0f;
        if (H <= 256 * FO_NJ) {
#pragma unroll
            for (int j = 0; j < FO_NJ; j++) {
                int i = threadIdx.x + 256 * j;
                v[j] = i < H ? __ldcg(yr + i) : 0.0f;
            }
#pragma unroll
            for (int j = 0; j < FO_NJ; j++)
                if (threadIdx.x + 256 * j < H) ss += v[j] * v[j];
        } else {
            for (int i = threadIdx.x; i < H; i += blockDim.x) {
                float u = __ldcg(yr + i);
                ss += u * u;
            }
        }
        ss = block_sum(ss, sh);
        const float inv = 1.0f / sqrtf(ss / (float)H + eps);
        if (H <= 256 * FO_NJ) {
#pragma unroll
            for (int j = 0; j < FO_NJ; j++) {
                int i = threadIdx.x + 256 * j;
                if (i < H) x[(size_t)m * H + i] = v[j], xn[(size_t)m * H + i] = (v[j] * inv) * g[i];
            }
        } else {
            for (int i = threadIdx.x; i < H; i += blockDim.x) {
                float u = __ldcg(yr + i);
                x[(size_t)m * H + i] = u;
                xn[(size_t)m * H + i] = (u * inv) * g[i];
            }
        }
        if (warp == 0) { /* lane l holds z[l + 32 i]; the chosen z by shuffles */
            const float *zr = z + (size_t)m * E;
            float zl[EW];
            float mx = -INFINITY, sum = 0.0f;
#pragma unroll
            for (int q = 0; q < EW; q++)
                zl[q] = lane + 32 * q < E ? __ldcg(zr + lane + 32 * q) * inv : -INFINITY;
            const int my_e = lane < k ? __ldcg(idx + (r0 + m) * k + lane) : 0;
#pragma unroll
            for (int q = 0; q < EW; q++) mx = fmaxf(mx, zl[q]);
            mx = warp_max(mx);
#pragma unroll
            for (int q = 0; q < EW; q++)
                if (lane + 32 * q < E) sum += expf(zl[q] - mx);
            sum = warp_sum(sum);
            float p = 0.0f;
            for (int j = 0; j < k; j++) {
                int ej = __shfl_sync(0xffffffffu, my_e, j);
                float zj = 0.0f;
#pragma unroll
                for (int q = 0; q < EW; q++)
                    if (q == (ej >> 5)) zj = zl[q];
                zj = __shfl_sync(0xffffffffu, zj, ej & 31);
                if (lane == j) p = expf(zj - mx) / sum;
            }
            float ws = 0.0f;
            for (int j = 0; j < k; j++) ws += __shfl_sync(0xffffffffu, p, j);
            if (lane < k) wout[(r0 + m) * k + lane] = norm ? p / ws : p;
        }
    }
}

/* W' [E][D] = Σ_i bf16(router[e][i]) g[i] bf16(w_o[i][d]), f32 sums in increasing i; grid (D / 256, E / 16)
 */
#define FW_E 16
template <bool F32>
__global__ void __launch_bounds__(256) fold_weights_kernel(void *out, const uint16_t *router, const float *g,
                                                           const uint16_t *w_o, int E, int H, int D) {
    __shared__ float rg[FW_E][32];
    const int d = blockIdx.x * 256 + threadIdx.x, e0 = blockIdx.y * FW_E;
    float acc[FW_E];
#pragma unroll
    for (int q = 0; q < FW_E; q++) acc[q] = 0.0f;
    for (int i0 = 0; i0 < H; i0 += 32) {
        __syncthreads();
        for (int t = threadIdx.x; t < FW_E * 32; t += 256) {
            int q = t / 32, i = i0 + t % 32;
            rg[q][t % 32] = e0 + q < E && i < H ? bf16_f32(router[(size_t)(e0 + q) * H + i]) * g[i] : 0.0f;
        }
        __syncthreads();
        if (d < D)
            for (int i = i0; i < i0 + 32 && i < H; i++) {
                float wv = bf16_f32(w_o[(size_t)i * D + d]);
#pragma unroll
                for (int q = 0; q < FW_E; q++) acc[q] = fmaf(rg[q][i - i0], wv, acc[q]);
            }
    }
    if (d >= D) return;
#pragma unroll
    for (int q = 0; q < FW_E; q++)
        if (e0 + q < E) {
            size_t o = (size_t)(e0 + q) * D + d;
            if (F32)
                static_cast<float *>(out)[o] = acc[q];
            else
                static_cast<uint16_t *>(out)[o] = f32_bf16(acc[q]);
        }
}

extern "C" size_t cu_moe_fold_scratch(int T, int D, int E, int wf32) {
    int nchd = (D + 255) / 256, PC = wf32 ? FO_NB / 2 : FO_NB;
    return (size_t)T * (1 + (nchd + PC - 1) / PC) * E;
}

extern "C" int cu_moe_fold_supported(int H, int D, int E, int k) {
    return H > 0 && H % 8 == 0 && D > 0 && D % 8 == 0 && E > 0 && E <= FO_MAX_E && k > 0 && k <= FO_MAX_K &&
           k <= E;
}

extern "C" void cu_moe_fold_weights(cu_ctx *c, void *out, int f32, const uint16_t *router, const float *g,
                                    const uint16_t *w_o, int E, int H, int D) {
    dim3 grid(cdiv((size_t)D, 256), cdiv((size_t)E, FW_E));
    if (f32)
        fold_weights_kernel<true><<<grid, 256, 0, c->stream>>>(out, router, g, w_o, E, H, D);
    else
        fold_weights_kernel<false><<<grid, 256, 0, c->stream>>>(out, router, g, w_o, E, H, D);
}

template <int MR, bool WF32, int EW>
static void fo_launch(cu_ctx *c, const cu_moe_fold_args *f, size_t r0, int tiles) {
    int nchd = (f->D + 255) / 256, PC = WF32 ? FO_NB / 2 : FO_NB, P = (nchd + PC - 1) / PC;
    constexpr int NR = fo_nr(MR); /* fo_kernel's out_proj rows a warp */
    int RG = FO_WARPS / f->KS, ZB = (int)cdiv((size_t)f->E * (1 + P), FO_WARPS);
    dim3 grid((unsigned)ZB + cdiv((size_t)f->H, (size_t)RG * NR), (unsigned)tiles);
    cu_launch_gemv(c, fo_kernel<MR, WF32, EW>, grid, dim3(FO_WARPS * 32), f->x + r0 * f->H, f->a + r0 * f->D,
                   f->w_o, f->router, f->g, f->wf, f->y + r0 * f->H, f->xn + r0 * f->H, f->eps,
                   f->z + r0 * f->E, f->zpart + r0 * (1 + P) * f->E, f->idx, f->w, f->norm, f->count + 2 * r0,
                   f->H, f->D, f->E, f->k, f->KS, ZB, P, PC, f->pf0, f->pf0_bytes, f->pf1, f->pf1_bytes);
    (void)r0;
}

/* idx / zsel rows are indexed from the start of the launch's first tile: shift them per call */
template <int MR, bool WF32> static void fo_ew(cu_ctx *c, const cu_moe_fold_args *f, size_t r0, int tiles) {
    cu_moe_fold_args s = *f;
    s.idx = f->idx + r0 * f->k, s.w = f->w + r0 * f->k;
    if (f->E <= 256)
        fo_launch<MR, WF32, 8>(c, &s, r0, tiles);
    else
        fo_launch<MR, WF32, 32>(c, &s, r0, tiles);
}

template <bool WF32> static void fo_rows(cu_ctx *c, const cu_moe_fold_args *f, size_t r0, int mr, int tiles) {
    switch (mr) {
    case 1:
        fo_ew<1, WF32>(c, f, r0, tiles);
        break;
    case 2:
        fo_ew<2, WF32>(c, f, r0, tiles);
        break;
    case 3:
        fo_ew<3, WF32>(c, f, r0, tiles);
        break;
    case 4:
        fo_ew<4, WF32>(c, f, r0, tiles);
        break;
    case 5:
        fo_ew<5, WF32>(c, f, r0, tiles);
        break;
    case 6:
        fo_ew<6, WF32>(c, f, r0, tiles);
        break;
    case 7:
        fo_ew<7, WF32>(c, f, r0, tiles);
        break;
    default:
        fo_ew<8, WF32>(c, f, r0, tiles);
        break;
    }
}

extern "C" void cu_moe_fold_outproj(cu_ctx *c, const cu_moe_fold_args *f) {
    if (f->T <= 0) return;
    /* tiles of 8 rows, then one tile of the rest (as gemv3's g3_rows) */
    int full = f->T / 8, rest = f->T % 8;
    if (f->wf_f32) {
        if (full) fo_rows<true>(c, f, 0, 8, full);
        if (rest) fo_rows<true>(c, f, (size_t)full * 8, rest, 1);
    } else {
        if (full) fo_rows<false>(c, f, 0, 8, full);
        if (rest) fo_rows<false>(c, f, (size_t)full * 8, rest, 1);
    }
}

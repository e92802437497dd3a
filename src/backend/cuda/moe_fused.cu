/* moe_fused.cu — a decode step's MoE block in three launches (CINFER_CUDA_MOE_FUSED=1) instead of ~15: the
 * router (logits, softmax, top-k, renormalisation, ascending-expert order) in one kernel whose last block per
 * row does the selection; the chosen experts' gate_up with the SwiGLU in its epilogue (the shared expert's
 * rows and its gate logit as extra warps); the down projections with the weighted combine and the shared
 * expert. Every dot product keeps gemv_indexed_kernel's lane order and butterfly and every block works on one
 * row, so a row's result never depends on the rows beside it in the launch. */
#include "backend/cuda/common.cuh"

#define MF_WARPS  8 /* warps per block of the expert kernels: one output each */
#define RT_WARPS  4 /* router: one logit per warp, so E / 4 blocks per row spread the matrix over the SMs */
#define MF_GROUP  4 /* down kernel: experts whose weights are requested together */
#define MF_MAX_E  1024
#define MF_MAX_K  32
#define MF_MAX_KD 1024 /* down kernel: Im up to 4 chunks of 256 per lane (one pass) */
#define MF_NORM_H 4096 /* the router's own RMSNorm (variant 8): rows up to this, in shared memory */

/* acc += the 8 bf16 weights in u times x[0..8), in gemv_indexed_kernel's order (low half, then high) */
__device__ __forceinline__ float fma8(uint4 u, const float *x, float acc) {
    const float4 *xp = reinterpret_cast<const float4 *>(x);
    float4 a = xp[0], b = xp[1];
    const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    const uint32_t p[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int q = 0; q < 4; q++) {
        acc = fmaf(__uint_as_float(p[q] << 16), xv[2 * q], acc);
        acc = fmaf(__uint_as_float(p[q] & 0xffff0000u), xv[2 * q + 1], acc);
    }
    return acc;
}

/* Per-lane partial dot products of R weight rows w[r] (K bf16, K % 8 == 0, 16-byte aligned) with x[r]:
 * lane l takes k = 8l + 256i in increasing i, as every GEMV of gemm.cu, so after warp_sum each value equals
 * theirs bit for bit. NB chunks of every row are requested before their FMAs (loads in flight). */
template <int R, int NB>
__device__ __forceinline__ void dot_rows(float (&acc)[R], const uint16_t *const (&w)[R],
                                         const float *const (&x)[R], int K, int lane) {
    for (int k0 = lane * 8; k0 < K; k0 += 256 * NB) {
        uint4 u[R][NB];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int c = 0; c < NB; c++) {
                int k = k0 + 256 * c;
                u[r][c] = k < K ? __ldg(reinterpret_cast<const uint4 *>(w[r] + k)) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
        for (int c = 0; c < NB; c++) {
            int k = k0 + 256 * c;
            if (k < K)
#pragma unroll
                for (int r = 0; r < R; r++) acc[r] = fma8(u[r][c], x[r] + k, acc[r]);
        }
    }
}

/* dot_rows in two halves for K <= 256 KC (one pass of KC chunks): the loads, then the FMAs, so a kernel can
 * request weights before it waits for the kernel that writes x */
template <int R, int KC>
__device__ __forceinline__ void load_rows(uint4 (&u)[R][KC], const uint16_t *const (&w)[R], int K, int lane) {
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int c = 0; c < KC; c++) {
            int k = lane * 8 + 256 * c;
            u[r][c] = k < K ? __ldg(reinterpret_cast<const uint4 *>(w[r] + k)) : make_uint4(0, 0, 0, 0);
        }
}
template <int R, int KC>
__device__ __forceinline__ void fma_rows(float (&acc)[R], const uint4 (&u)[R][KC], const float *const (&x)[R],
                                         int K, int lane) {
#pragma unroll
    for (int c = 0; c < KC; c++) {
        int k = lane * 8 + 256 * c;
        if (k < K)
#pragma unroll
            for (int r = 0; r < R; r++) acc[r] = fma8(u[r][c], x[r] + k, acc[r]);
    }
}

/* bytes (a multiple of 16, 16-byte aligned) of global memory requested into L2 without registers (sm_90's
 * bulk prefetch) */
__device__ __forceinline__ void mf_l2_prefetch(const void *p, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
    (void)p, (void)bytes;
#endif
}

/* The routing of one row in one warp, as route_kernel + sort_slots_kernel do: softmax of the E logits lg
 * (read from L2, where other blocks wrote) with per-lane sums joined by the butterfly, k rounds of a warp
 * argmax on (p, lowest index), the k weights summed in selection order. Lane j < k gets the j-th choice:
 * *e, its weight *w (renormalised when norm) and *rank, its place in ascending expert order. */
template <int EW>
__device__ __forceinline__ void mf_select(const float *lg, int E, int k, int norm, int lane, int *oe,
                                          float *ow, int *orank) {
    /* lane l owns experts l + 32i (i < EW: E <= 32 EW, 8 or 32, so E = 256 unrolls 8 steps, not 32); logits
     * read from L2, where the other blocks wrote */
    float p[EW];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < EW; i++) p[i] = lane + 32 * i < E ? __ldcg(lg + lane + 32 * i) : 0.0f;
#pragma unroll
    for (int i = 0; i < EW; i++)
        if (lane + 32 * i < E) mx = fmaxf(mx, p[i]);
    mx = warp_max(mx);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < EW; i++)
        if (lane + 32 * i < E) {
            p[i] = expf(p[i] - mx);
            s += p[i];
        }
    s = warp_sum(s);
#pragma unroll
    for (int i = 0; i < EW; i++)
        if (lane + 32 * i < E) p[i] /= s;
    /* k rounds, each two warp reductions in hardware: the largest bits(p) + 1 (0: taken; p >= 0, so every
     * untaken value is above 0 and a winner always exists while k <= E), then the lowest expert holding it.
     * Each lane keeps its best untaken (lowest i on ties, so lowest expert) and only the winner's lane
     * rescans its EW. (Session 4's form, five 64-bit shuffle steps over every lane's EW keys a round, made
     * the same choices: the H200 call 2 of session 5, router 6.7 -> 6.5 us.) */
    unsigned taken = 0, bv = 0;
    int my_e = 0, bi = 0;
    float my_p = 0.0f;
#pragma unroll
    for (int i = 0; i < EW; i++)
        if (lane + 32 * i < E) {
            unsigned v = __float_as_uint(p[i]) + 1u;
            if (v > bv) bv = v, bi = i;
        }
    for (int j = 0; j < k; j++) {
        unsigned m = __reduce_max_sync(0xffffffffu, bv);
        unsigned be = __reduce_min_sync(0xffffffffu, bv == m ? (unsigned)(lane + 32 * bi) : 0xffffffffu);
        if (lane == j) my_e = (int)be, my_p = __uint_as_float(m - 1u);
        if ((int)(be & 31u) == lane) {
            taken |= 1u << bi;
            bv = 0, bi = 0;
#pragma unroll
            for (int i = 0; i < EW; i++)
                if (lane + 32 * i < E && !((taken >> i) & 1u)) {
                    unsigned v = __float_as_uint(p[i]) + 1u;
                    if (v > bv) bv = v, bi = i;
                }
        }
    }
    float ws = 0.0f;
    for (int j = 0; j < k; j++) ws += __shfl_sync(0xffffffffu, my_p, j);
    int rank = 0;
    for (int j = 0; j < k; j++) rank += __shfl_sync(0xffffffffu, my_e, j) < my_e;
    *oe = my_e, *ow = norm ? my_p / ws : my_p, *orank = rank;
}

/* mf_select<8>'s choices, weights and ranks, bit for bit, in fewer dependent steps (E <= 256; variant 32768
 * with 16384): the row's maximum logit by one integer warp reduction on an order-preserving map of the
 * lanes' maxima (fmaxf's value: -0 and +0 give the same differences below); the same exponentials, the
 * same sums in the same order, the same divisions; then each lane sorts its 8 keys (bits(p) + 1, then the
 * lower expert first) once by a 19-exchange network, so a round's winning lane shifts its list instead of
 * rescanning its 8 values (the round's two warp reductions are unchanged: the largest head, then the lowest
 * expert holding it, so the same choices in the same order). */
__device__ __forceinline__ void mf_select8_fast(const float *lg, int E, int k, int norm, int lane, int *oe,
                                                float *ow, int *orank) {
    float p[8];
#pragma unroll
    for (int i = 0; i < 8; i++) p[i] = lane + 32 * i < E ? __ldcg(lg + lane + 32 * i) : 0.0f;
    float lm = -INFINITY;
#pragma unroll
    for (int i = 0; i < 8; i++)
        if (lane + 32 * i < E) lm = fmaxf(lm, p[i]);
    /* order-preserving map of the float bits to unsigned (negative: all bits flipped; else the sign set) */
    unsigned lb = __float_as_uint(lm);
    unsigned mb = __reduce_max_sync(0xffffffffu, lb & 0x80000000u ? ~lb : lb | 0x80000000u);
    const float mx = __uint_as_float(mb & 0x80000000u ? mb & 0x7fffffffu : ~mb);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++)
        if (lane + 32 * i < E) {
            p[i] = expf(p[i] - mx);
            s += p[i];
        }
    s = warp_sum(s);
    unsigned long long
        key[8]; /* bits(p) + 1 in the high word, 7 - i in the low: descending = mf_select's order */
#pragma unroll
    for (int i = 0; i < 8; i++)
        key[i] = lane + 32 * i < E ? (unsigned long long)(__float_as_uint(p[i] / s) + 1u) << 32 |
                                         (unsigned long long)(7 - i)
                                   : 0ull;
#define MF_CX(a, b)                                                                                          \
    {                                                                                                        \
        unsigned long long hi_ = key[a] > key[b] ? key[a] : key[b], lo_ = key[a] > key[b] ? key[b] : key[a]; \
        key[a] = hi_, key[b] = lo_;                                                                          \
    }
    MF_CX(0, 2) MF_CX(1, 3) MF_CX(4, 6) MF_CX(5, 7);
    MF_CX(0, 4) MF_CX(1, 5) MF_CX(2, 6) MF_CX(3, 7);
    MF_CX(0, 1) MF_CX(2, 3) MF_CX(4, 5) MF_CX(6, 7);
    MF_CX(2, 4) MF_CX(3, 5);
    MF_CX(1, 4) MF_CX(3, 6);
    MF_CX(1, 2) MF_CX(3, 4) MF_CX(5, 6);
#undef MF_CX
    int my_e = 0;
    float my_p = 0.0f;
    for (int j = 0; j < k; j++) {
        unsigned hv = (unsigned)(key[0] >> 32);
        unsigned m = __reduce_max_sync(0xffffffffu, hv);
        unsigned gi = (unsigned)lane + 32u * (7u - (unsigned)(key[0] & 7u));
        unsigned be = __reduce_min_sync(0xffffffffu, hv == m ? gi : 0xffffffffu);
        if (lane == j) my_e = (int)be, my_p = __uint_as_float(m - 1u);
        if ((int)(be & 31u) == lane) {
#pragma unroll
            for (int i = 0; i < 7; i++) key[i] = key[i + 1];
            key[7] = 0ull;
        }
    }
    float ws = 0.0f;
    for (int j = 0; j < k; j++) ws += __shfl_sync(0xffffffffu, my_p, j);
    int rank = 0;
    for (int j = 0; j < k; j++) rank += __shfl_sync(0xffffffffu, my_e, j) < my_e;
    *oe = my_e, *ow = norm ? my_p / ws : my_p, *orank = rank;
}

/* SEL (the expert kernels' template argument): 0 no selection there; 8 / 32 mf_select<SEL>; 9
 * mf_select8_fast */
template <int SEL>
__device__ __forceinline__ void mf_select_sel(const float *lg, int E, int k, int norm, int lane, int *oe,
                                              float *ow, int *orank) {
    if constexpr (SEL == 9)
        mf_select8_fast(lg, E, k, norm, lane, oe, ow, orank);
    else
        mf_select<SEL>(lg, E, k, norm, lane, oe, ow, orank);
}

/* Router, grid (E / RT_WARPS, T). Warp w of block b computes logit e = RT_WARPS b + w of row blockIdx.y with
 * f32 activations (the values cu_gemm(precise) gives); the block that finishes a row last (count[r], left
 * at 0 again) selects in one warp exactly as route_kernel + sort_slots_kernel do: softmax with per-lane sums
 * joined by the butterfly, k rounds of a warp argmax on (p, lowest index), the k weights summed in selection
 * order, then written in ascending expert order. NB: 256-element chunks of a row requested at once (8:
 * H = 2048 in one round trip). NORM (cu_moe_args.norm_w): x is the raw residual; every
 * block first takes the row's RMSNorm exactly as add_rmsnorm_kernel does (256 threads, the same sums, the
 * same expression) into shared memory, and block 0 writes it to xn for the gate_up kernel: the norm kernel
 * before the MoE block is not launched. EW: mf_select_sel's argument (8 or 32: mf_select<EW>; 9: its fast
 * form, variant 32768). */
template <int NB, int NORM, int EW, int PFS = 0>
__global__ void __launch_bounds__(NORM ? 256 : RT_WARPS * 32)
    mf_route_kernel(const float *__restrict__ x, const uint16_t *__restrict__ wr, float *logits, int *idx,
                    float *wout, unsigned *count, int H, int E, int k, int norm, const float *__restrict__ nw,
                    float eps, float *xn, const uint16_t *pf0, unsigned pf0_bytes, const uint16_t *pf1,
                    unsigned pf1_bytes, int sel) {
    __shared__ int last;
    __shared__ float sh[32];
    __shared__ __align__(16) float xs[NORM ? MF_NORM_H : 4];
    constexpr int WARPS = NORM ? 8 : RT_WARPS;
    const int r = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int e = blockIdx.x * WARPS + warp;
    /* the weights depend on no kernel: with H in one pass (H <= 256 NB), this warp's router row is requested
     * before waiting for the kernel that writes x (under PDL, while it still runs) */
    const bool pre = e < E && H <= 256 * NB;
    uint4 u[1][NB];
    const uint16_t *w1[1] = {wr + (size_t)(e < E ? e : 0) * H};
    if (pre) load_rows<1, NB>(u, w1, H, lane);
    /* NORM: thread t's norm weights (elements t + 256 j, add_rmsnorm_kernel's split) are weights too: in
     * registers before the wait, and its x elements are all requested at once after it (one round trip;
     * the loops over i below issued one load per step) */
    constexpr int NJ = NORM ? MF_NORM_H / 256 : 1;
    [[maybe_unused]] float nv[NJ], xv[NJ];
    if constexpr (NORM) {
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            int i = threadIdx.x + 256 * j;
            nv[j] = i < H ? __ldg(nw + i) : 0.0f;
        }
    }
    /* variant 8192: the shared expert's weights (pf0, pf1: they depend on no routing) requested into L2 while
     * the kernel before still runs, a slice per block of row 0 (one bulk prefetch each, no registers held) */
    if constexpr (PFS) {
        if (blockIdx.y == 0 && threadIdx.x == 0) {
            unsigned per = (pf0_bytes / gridDim.x + 15u) & ~15u, off = blockIdx.x * per;
            if (off < pf0_bytes)
                mf_l2_prefetch(reinterpret_cast<const char *>(pf0) + off,
                               pf0_bytes - off < per ? pf0_bytes - off : per);
            per = (pf1_bytes / gridDim.x + 15u) & ~15u, off = blockIdx.x * per;
            if (off < pf1_bytes)
                mf_l2_prefetch(reinterpret_cast<const char *>(pf1) + off,
                               pf1_bytes - off < per ? pf1_bytes - off : per);
        }
    }
    /* programmatic dependent launch (variant 4): wait for the kernel before (the norm that writes x), then
     * let the next one be scheduled (it waits for this one's completion before reading what it writes); both
     * are no-ops otherwise. Launching only after the wait keeps a chain: when a kernel of the three starts,
     * every kernel two launches back has completed. */
    griddep_wait();
    griddep_launch();
    float *lg = logits + (size_t)r * E;
    const float *xr = x + (size_t)r * H;
    if constexpr (NORM) { /* blockDim.x == 256: add_rmsnorm_kernel's sums in its order, its expression */
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            int i = threadIdx.x + 256 * j;
            xv[j] = i < H ? xr[i] : 0.0f;
        }
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < NJ; j++)
            if (threadIdx.x + 256 * j < H) ss += xv[j] * xv[j];
        ss = block_sum(ss, sh);
        float inv = 1.0f / sqrtf(ss / (float)H + eps);
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            int i = threadIdx.x + 256 * j;
            if (i < H) {
                float v = (xv[j] * inv) * nv[j];
                xs[i] = v;
                if (blockIdx.x == 0) xn[(size_t)r * H + i] = v;
            }
        }
        __syncthreads();
        xr = xs;
    }
    if (e < E) {
        float acc[1] = {0.0f};
        const float *x1[1] = {xr};
        if (pre)
            fma_rows<1, NB>(acc, u, x1, H, lane); /* dot_rows' one pass */
        else
            dot_rows<1, NB>(acc, w1, x1, H, lane);
        float v = warp_sum(acc[0]);
        if (lane == 0) {
            lg[e] = v;
            if (!sel) __threadfence(); /* visible device-wide before this block counts itself done */
        }
    }
    /* sel (variant 16384): the expert kernels select from the logits themselves, once this kernel has
     * completed (their PDL wait): no fence, counter or last block here */
    if (sel) return;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(&count[r], 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last || warp != 0) return;
    if (lane == 0) count[r] = 0; /* ready for the next launch (stream order puts it after this one) */
    __threadfence();
    int my_e, rank;
    float my_w;
    mf_select_sel<EW>(lg, E, k, norm, lane, &my_e, &my_w, &rank); /* EW 9: mf_select8_fast */
    if (lane < k) {
        idx[(size_t)r * k + rank] = my_e;
        wout[(size_t)r * k + rank] = my_w;
    }
}

/* gate_up + SwiGLU, grid (warps / MF_WARPS, T). Warp w < k Im: gate row n and up row Im + n of the row's
 * j-th chosen expert (j = w / Im, n = w % Im) -> act[r][w]; then Is warps for the shared expert's rows ->
 * act[r][k Im + n]; then one warp for the shared expert's gate logit -> shg[r]. NB: chunks per row requested
 * at once (2: 40 registers, six blocks per SM, so the 577 blocks of a 35B-A3B row are one wave).
 * SEL (variant 16384; mf_select_sel's argument, 0: off): the router wrote only its logits, and warp 0 of
 * every block serving a chosen expert (Im % 8 == 0: a block serves one j) makes the row's selection itself
 * with mf_select (the same bits as the router's last block would) and hands its j-th expert in ascending
 * order to the other warps through shared memory; block 0 also writes idx / w (the down kernel and callers
 * read them). That drops the router's fence, counter, last block and idx round trip from the chain before the
 * experts' weights are requested. */
template <int NB, int SEL>
__global__ void __launch_bounds__(MF_WARPS * 32)
    mf_gate_up_kernel(const float *__restrict__ x, const uint16_t *__restrict__ e_gu,
                      const int *__restrict__ idx, const uint16_t *__restrict__ sh_gu,
                      const uint16_t *__restrict__ sh_gw, float *act, float *shg, int H, int k, int Im,
                      int Is, const float *logits, int E, int norm, int *idx_out, float *w_out,
                      int late_launch) {
    const int r = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wg = blockIdx.x * MF_WARPS + warp, A = k * Im + Is;
    griddep_wait(); /* the router's choices */
    /* late_launch (variant 65536, SEL only): the down kernel, whose blocks select from the same logits
     * before their wait, is let start only once this block has made its selection (every block still
     * executes griddep_launch, after its wait) */
    if (!late_launch) griddep_launch();
    [[maybe_unused]] __shared__ int s_e;
    if constexpr (SEL > 0) {
        if ((int)blockIdx.x * MF_WARPS < k * Im) { /* the whole block serves choice j */
            if (warp == 0) {
                int my_e, rank;
                float my_w;
                mf_select_sel<SEL>(logits + (size_t)r * E, E, k, norm, lane, &my_e, &my_w, &rank);
                if (lane < k && rank == (int)blockIdx.x * MF_WARPS / Im) s_e = my_e;
                if (blockIdx.x == 0 && lane < k) {
                    idx_out[(size_t)r * k + rank] = my_e;
                    w_out[(size_t)r * k + rank] = my_w;
                }
            }
            __syncthreads();
        }
    }
    if (late_launch) griddep_launch();
    const float *xr = x + (size_t)r * H;
    const uint16_t *g;
    size_t up; /* elements from the gate row to the up row */
    if (wg < k * Im) {
        int j = wg / Im, n = wg - j * Im, e = SEL > 0 ? s_e : idx[(size_t)r * k + j];
        g = e_gu + ((size_t)e * 2 * Im + n) * H;
        up = (size_t)Im * H;
    } else if (wg < A) {
        int n = wg - k * Im;
        g = sh_gu + (size_t)n * H;
        up = (size_t)Is * H;
    } else {
        if (wg == A && sh_gw) {
            float acc[1] = {0.0f};
            const uint16_t *w1[1] = {sh_gw};
            const float *x1[1] = {xr};
            dot_rows<1, 4>(acc, w1, x1, H, lane);
            float v = warp_sum(acc[0]);
            if (lane == 0) shg[r] = v;
        }
        return;
    }
    float acc[2] = {0.0f, 0.0f};
    const uint16_t *w2[2] = {g, g + up};
    const float *x2[2] = {xr, xr};
    dot_rows<2, NB>(acc, w2, x2, H, lane);
    float gs = warp_sum(acc[0]), us = warp_sum(acc[1]);
    if (lane == 0) act[(size_t)r * A + wg] = dev_silu(gs) * us; /* cu_swiglu's expression */
}

/* down + combine, grid (H / MF_WARPS, T). Warp h: out[r][h] = Σ_j w_j (down_{e_j}[h] · act_j) over the
 * choices in ascending expert order, then + sigmoid(shg) (sh_down[h] · act_sh): cu_moe_combine's order. With
 * resid, resid[r][h] += that sum instead (the residual add cu_add_rmsnorm would make, the same f32 add) and
 * out is not written. SEL (variant 16384, mf_select_sel's argument): warp 0 selects from the router's logits
 * itself (complete when this kernel starts, as idx is below) and shares the choices through shared memory:
 * nothing read from what the gate_up kernel writes before the wait. */
template <int KC, int SEL>
__global__ void __launch_bounds__(MF_WARPS * 32)
    mf_down_kernel(const float *__restrict__ act, const uint16_t *__restrict__ e_down,
                   const int *__restrict__ idx, const float *__restrict__ wt,
                   const uint16_t *__restrict__ sh_down, const float *__restrict__ shg, float *out,
                   float *resid, int H, int k, int Im, int Is, const float *logits, int E, int norm) {
    const int r = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int h = blockIdx.x * MF_WARPS + warp, A = k * Im + Is;
    if (h >= H) {
        griddep_wait();
        griddep_launch();
        return;
    }
    const float *ar = act + (size_t)r * A;
    /* the router's choices are complete when this kernel starts, even under PDL (the gate_up kernel let it be
     * scheduled only after waiting for the router): read them from L2 (__ldcg: L1 may hold the previous
     * layer's) and request the first group's weights before waiting for the gate_up kernel's act */
    int my_e;
    float my_w;
    if constexpr (SEL > 0) {
        __shared__ int s_e[MF_MAX_K];
        __shared__ float s_w[MF_MAX_K];
        if (warp == 0) { /* h < H for the whole block: H % 8 == 0 */
            int rank;
            mf_select_sel<SEL>(logits + (size_t)r * E, E, k, norm, lane, &my_e, &my_w, &rank);
            if (lane < k) s_e[rank] = my_e, s_w[rank] = my_w;
        }
        __syncthreads();
        my_e = lane < k ? s_e[lane] : 0;
        my_w = lane < k ? s_w[lane] : 0.0f;
    } else {
        my_e = lane < k ? __ldcg(idx + (size_t)r * k + lane) : 0;
        my_w = lane < k ? __ldcg(wt + (size_t)r * k + lane) : 0.0f;
    }
    float acc = 0.0f;
    constexpr int G = MF_GROUP;
    uint4 u[G][KC];
    for (int j0 = 0; j0 < k; j0 += G) {
        float y[G];
        const uint16_t *wd[G];
        const float *xa[G];
#pragma unroll
        for (int g = 0; g < G; g++) {
            int j = j0 + g < k ? j0 + g : j0; /* past k: a repeat of the group's first, never summed */
            int e = __shfl_sync(0xffffffffu, my_e, j);
            wd[g] = e_down + ((size_t)e * H + h) * Im;
            xa[g] = ar + (size_t)j * Im;
            y[g] = 0.0f;
        }
        load_rows<G, KC>(u, wd, Im, lane);
        if (j0 == 0) {
            griddep_wait(); /* act */
            griddep_launch();
        }
        fma_rows<G, KC>(y, u, xa, Im, lane);
#pragma unroll
        for (int g = 0; g < G; g++) {
            float v = warp_sum(y[g]);
            float wj = __shfl_sync(0xffffffffu, my_w, j0 + g < k ? j0 + g : 0);
            if (j0 + g < k) acc += v * wj;
        }
    }
    if (sh_down) {
        float ys[1] = {0.0f};
        const uint16_t *w1[1] = {sh_down + (size_t)h * Is};
        const float *x1[1] = {ar + (size_t)k * Im};
        dot_rows<1, 2>(ys, w1, x1, Is, lane);
        float v = warp_sum(ys[0]);
        float gt = dev_sigmoid(shg[r]);
        acc += gt * v;
    }
    if (lane == 0) {
        if (resid)
            resid[(size_t)r * H + h] += acc;
        else
            out[(size_t)r * H + h] = acc;
    }
}

extern "C" int cu_moe_fused_norm_ok(int H) {
    return H <= MF_NORM_H;
}

extern "C" int cu_moe_fused_supported(int H, int E, int k, int Im, int Is) {
    return H > 0 && H % 8 == 0 && E > 0 && E <= MF_MAX_E && k > 0 && k <= MF_MAX_K && k <= E && Im > 0 &&
           Im % 8 == 0 && Im <= MF_MAX_KD && Is >= 0 && Is % 8 == 0;
}

extern "C" void cu_moe_fused_route(cu_ctx *c, const cu_moe_args *a) {
    if (a->T <= 0) return;
    int pdl = (a->variant & 4) != 0, nrm = a->norm_w != NULL;
    int warps = nrm ? 8 : RT_WARPS;
    dim3 grid(cdiv((size_t)a->E, (size_t)warps), (unsigned)a->T), block(warps * 32);
    void (*kern)(const float *, const uint16_t *, float *, int *, float *, unsigned *, int, int, int, int,
                 const float *, float, float *, const uint16_t *, unsigned, const uint16_t *, unsigned, int);
    /* variant 8192 (default): the shared expert's gate_up and down rows into L2 before the wait */
    const uint16_t *pf0 = NULL, *pf1 = NULL;
    unsigned b0 = 0, b1 = 0;
    if ((a->variant & 8192) && a->sh_gu && a->Is > 0)
        pf0 = a->sh_gu, b0 = (unsigned)((size_t)2 * a->Is * a->H * 2), pf1 = a->sh_down,
        b1 = (unsigned)((size_t)a->H * a->Is * 2);
    /* 8 chunks of a router row requested at once: H = 2048 in one round trip (session 4's 4: no faster);
     * variant 32768 (E <= 256): the last block's selection by mf_select8_fast (EW 9) */
    int ew = a->E > 256 ? 32 : (a->variant & 32768) ? 9 : 8;
    if (pf0)
        kern = ew == 8   ? (nrm ? mf_route_kernel<8, 1, 8, 1> : mf_route_kernel<8, 0, 8, 1>)
               : ew == 9 ? (nrm ? mf_route_kernel<8, 1, 9, 1> : mf_route_kernel<8, 0, 9, 1>)
                         : (nrm ? mf_route_kernel<8, 1, 32, 1> : mf_route_kernel<8, 0, 32, 1>);
    else
        kern = ew == 8   ? (nrm ? mf_route_kernel<8, 1, 8> : mf_route_kernel<8, 0, 8>)
               : ew == 9 ? (nrm ? mf_route_kernel<8, 1, 9> : mf_route_kernel<8, 0, 9>)
                         : (nrm ? mf_route_kernel<8, 1, 32> : mf_route_kernel<8, 0, 32>);
    cu_launch_pdl(c, pdl, kern, grid, block, a->x, a->router, a->logits, a->idx, a->w, a->count, a->H, a->E,
                  a->k, a->norm, a->norm_w, a->eps, a->xn, pf0, b0, pf1, b1, (a->variant & 16384) != 0);
}

extern "C" void cu_moe_fused_gate_up(cu_ctx *c, const cu_moe_args *a) {
    if (a->T <= 0) return;
    int Is = a->sh_gu ? a->Is : 0;
    size_t warps = (size_t)a->k * a->Im + (size_t)Is + (a->sh_gw ? 1 : 0);
    dim3 grid(cdiv(warps, MF_WARPS), (unsigned)a->T), block(MF_WARPS * 32);
    int pdl = (a->variant & 4) != 0;
    const float *x = a->norm_w ? a->xn : a->x; /* the router's normed rows */
    /* 2 chunks per row requested at a time: 40 registers, six blocks per SM, the 577 blocks of a 35B-A3B row
     * in one wave (session 4: 4 chunks, four blocks per SM, 14.1 vs 10.9 us) */
    void (*kern)(const float *, const uint16_t *, const int *, const uint16_t *, const uint16_t *, float *,
                 float *, int, int, int, int, const float *, int, int, int *, float *, int) =
        !(a->variant & 16384) ? mf_gate_up_kernel<2, 0>
        : a->E > 256          ? mf_gate_up_kernel<2, 32>
        : a->variant & 32768  ? mf_gate_up_kernel<2, 9>
                              : mf_gate_up_kernel<2, 8>;
    cu_launch_pdl(c, pdl, kern, grid, block, x, a->e_gu, a->idx, a->sh_gu, a->sh_gw, a->act, a->shg, a->H,
                  a->k, a->Im, Is, a->logits, a->E, a->norm, a->idx, a->w,
                  (a->variant & (16384 | 65536)) == (16384 | 65536));
}

extern "C" void cu_moe_fused_down(cu_ctx *c, const cu_moe_args *a) {
    if (a->T <= 0) return;
    int Is = a->sh_gu ? a->Is : 0;
    dim3 grid(cdiv((size_t)a->H, MF_WARPS), (unsigned)a->T), block(MF_WARPS * 32);
    const uint16_t *sh_down = Is ? a->sh_down : NULL;
    /* Im up to 512: 2 chunks per row and lane; up to 1024 (122B-A10B, 397B-A17B): 4. (Session 4's eight
     * experts' rows at once and session 5's shared row with the first group: no faster, the same bits.) */
    void (*kern)(const float *, const uint16_t *, const int *, const float *, const uint16_t *, const float *,
                 float *, float *, int, int, int, int, const float *, int, int);
    int sel = !(a->variant & 16384) ? 0 : a->E > 256 ? 32 : a->variant & 32768 ? 9 : 8;
    if (a->Im > 512)
        kern = sel == 8   ? mf_down_kernel<4, 8>
               : sel == 9 ? mf_down_kernel<4, 9>
               : sel      ? mf_down_kernel<4, 32>
                          : mf_down_kernel<4, 0>;
    else
        kern = sel == 8   ? mf_down_kernel<2, 8>
               : sel == 9 ? mf_down_kernel<2, 9>
               : sel      ? mf_down_kernel<2, 32>
                          : mf_down_kernel<2, 0>;
    cu_launch_pdl(c, (a->variant & 4) != 0, kern, grid, block, a->act, a->e_down, a->idx, a->w, sh_down,
                  a->shg, a->out, a->resid, a->H, a->k, a->Im, Is, a->logits, a->E, a->norm);
}

extern "C" void cu_moe_fused(cu_ctx *c, const cu_moe_args *a) {
    cu_moe_fused_route(c, a);
    cu_moe_fused_gate_up(c, a);
    cu_moe_fused_down(c, a);
}

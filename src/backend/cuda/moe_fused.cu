/* moe_fused.cu — a decode step's MoE block in three launches (CINFER_CUDA_MOE_FUSED=1) instead of ~15: the
 * router (logits, softmax, top-k, renormalisation, ascending-expert order) in one kernel whose last block per
 * row does the selection; the chosen experts' gate_up with the SwiGLU in its epilogue (the shared expert's
 * rows and its gate logit as extra warps); the down projections with the weighted combine and the shared
 * expert. Every dot product keeps gemv_indexed_kernel's lane order and butterfly and every block works on one
 * row, so a row's result never depends on the rows beside it in the launch. */
#include "backend/cuda/common.cuh"

#include <cooperative_groups.h>

namespace cg = cooperative_groups;

#define MF_WARPS  8 /* warps per block of the expert kernels: one output each */
#define RT_WARPS  4 /* router: one logit per warp, so E / 4 blocks per row spread the matrix over the SMs */
#define MF_GROUP  4 /* down kernel: experts whose weights are requested together */
#define MF_MAX_E  1024
#define MF_MAX_K  32
#define MF_MAX_KD 1024 /* down kernel: Im up to 4 chunks of 256 per lane (one pass) */
#define MF_NORM_H 4096 /* the router's own RMSNorm (variant 8): rows up to this, in shared memory */
#define MF_PAD    32   /* words between polled counters (one 128-byte line each) */

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

/* acquire / release on a global flag (variant 16: the router publishes a row's choices, the gate_up kernel's
 * expert warps spin on it instead of waiting for the router kernel's completion) */
__device__ __forceinline__ unsigned ld_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_release(unsigned *p, unsigned v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned long long globaltimer_ns(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* bytes (a multiple of 16, 16-byte aligned, < 4 GB) of global memory requested into L2 without registers
 * (sm_90's bulk prefetch); EVL: with an evict-last policy */
template <int EVL> __device__ __forceinline__ void mf_l2_prefetch(const void *p, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (EVL) {
        unsigned long long pol;
        asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
        asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(p), "r"(bytes),
                     "l"(pol)
                     : "memory");
    } else {
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
    }
#else
    (void)p, (void)bytes;
#endif
}

/* Row xr's RMSNorm as add_rmsnorm_kernel takes it (blockDim.x == 256: its sums in its order, its expression)
 * into shared xs [H] and, when xn, into xn too; nv: thread t's norm weights (elements t + 256 j). Every
 * block that calls it gets the same bits (the router's and, variant 16, the gate_up kernel's). */
template <int NJ>
__device__ __forceinline__ void mf_norm_row(const float *xr, const float (&nv)[NJ], int H, float eps,
                                            float *xs, float *sh, float *xn) {
    float xv[NJ];
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
            if (xn) xn[i] = v;
        }
    }
    __syncthreads();
}

/* The routing of one row in one warp, as route_kernel + sort_slots_kernel do: softmax of the E logits lg
 * (read from L2, where other blocks wrote) with per-lane sums joined by the butterfly, k rounds of a warp
 * argmax on (p, lowest index), the k weights summed in selection order. Lane j < k gets the j-th choice:
 * *e, its weight *w (renormalised when norm) and *rank, its place in ascending expert order. */
template <int EW, int SMEM = 0>
__device__ __forceinline__ void mf_select(const float *lg, int E, int k, int norm, int lane, int *oe,
                                          float *ow, int *orank) {
    /* lane l owns experts l + 32i (i < EW: E <= 32 EW, 8 or 32, so E = 256 unrolls 8 steps, not 32); logits
     * read from L2, where the other blocks wrote */
    float p[EW];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < EW; i++)
        if (lane + 32 * i < E) mx = fmaxf(mx, SMEM ? lg[lane + 32 * i] : __ldcg(lg + lane + 32 * i));
    mx = warp_max(mx);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < EW; i++)
        if (lane + 32 * i < E) {
            p[i] = expf((SMEM ? lg[lane + 32 * i] : __ldcg(lg + lane + 32 * i)) - mx);
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

/* Router, grid (E / RT_WARPS, T). Warp w of block b computes logit e = RT_WARPS b + w of row blockIdx.y with
 * f32 activations (the values cu_gemm(precise) gives); the block that finishes a row last (count[r], left
 * at 0 again) selects in one warp exactly as route_kernel + sort_slots_kernel do: softmax with per-lane sums
 * joined by the butterfly, k rounds of a warp argmax on (p, lowest index), the k weights summed in selection
 * order, then written in ascending expert order. NB: 256-element chunks of a row requested at once (8:
 * H = 2048 in one round trip). NORM (cu_moe_args.norm_w): x is the raw residual; every
 * block first takes the row's RMSNorm exactly as add_rmsnorm_kernel does (256 threads, the same sums, the
 * same expression) into shared memory, and block 0 writes it to xn for the gate_up kernel: the norm kernel
 * before the MoE block is not launched. */
template <int NB, int NORM, int EW>
__global__ void __launch_bounds__(NORM ? 256 : RT_WARPS * 32)
    mf_route_kernel(const float *__restrict__ x, const uint16_t *__restrict__ wr, float *logits, int *idx,
                    float *wout, unsigned *count, int H, int E, int k, int norm, const float *__restrict__ nw,
                    float eps, float *xn, unsigned *ready) {
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
    [[maybe_unused]] float nv[NJ];
    if constexpr (NORM) {
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            int i = threadIdx.x + 256 * j;
            nv[j] = i < H ? __ldg(nw + i) : 0.0f;
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
    if constexpr (NORM) {
        mf_norm_row<NJ>(xr, nv, H, eps, xs, sh, blockIdx.x == 0 ? xn + (size_t)r * H : nullptr);
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
            __threadfence(); /* visible device-wide before this block counts itself done */
        }
    }
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
    mf_select<EW>(lg, E, k, norm, lane, &my_e, &my_w, &rank);
    if (lane < k) {
        idx[(size_t)r * k + rank] = my_e;
        wout[(size_t)r * k + rank] = my_w;
        __threadfence();
    }
    /* variant 16: the row's choices are published (each writer fenced, then the warp joined, then a release)
     * for the gate_up kernel's expert warps; the down kernel sets the flag back to 0 */
    __syncwarp();
    if (ready && lane == 0) st_release(ready + r, 1u);
}

/* ---- variant 256: the router as one cluster of RC_CTAS blocks a row ----
 * Block c of the cluster holds router rows RC_PER c .. RC_PER (c + 1) in shared memory, copied there before
 * the PDL wait (cp.async: no registers held); warp w computes logits RC_PER c + 4 w + q (q < 4) with x's lane
 * slice read once per chunk, each logit's sum in dot_rows' lane order, so the values are mf_route_kernel's.
 * The logits go to block 0's shared memory (distributed shared memory) and after the cluster barrier block
 * 0's warp 0 selects as mf_route_kernel's last block does: no fences, counters or L2 round trips between the
 * dot products and the selection. E <= RC_CTAS RC_PER. */
#define RC_CTAS 8
#define RC_PER  32

__device__ __forceinline__ void cp_async16(void *s, const void *g) {
    unsigned sa = (unsigned)__cvta_generic_to_shared(s);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa), "l"(g) : "memory");
}

template <int NORM>
__global__ void __launch_bounds__(256)
    mf_route_cl_kernel(const float *__restrict__ x, const uint16_t *__restrict__ wr, int *idx, float *wout,
                       int H, int E, int k, int norm, const float *__restrict__ nw, float eps, float *xn,
                       unsigned *ready) {
    extern __shared__ __align__(16) unsigned char rc_smem[];
    uint16_t *ws = reinterpret_cast<uint16_t *>(rc_smem);                    /* [RC_PER][H] bf16 */
    float *xs = reinterpret_cast<float *>(rc_smem + (size_t)RC_PER * H * 2); /* [H] */
    __shared__ float lg_s[RC_CTAS * RC_PER];                                 /* block 0's: the row's logits */
    __shared__ float sh[32];
    cg::cluster_group cl = cg::this_cluster();
    const int r = blockIdx.y, rank = (int)cl.block_rank(), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int e0 = rank * RC_PER, nrows = E - e0 < RC_PER ? E - e0 : RC_PER;
    /* the weights depend on no kernel: requested before the wait */
    if (nrows > 0) {
        const size_t n16 = (size_t)nrows * H / 8;
        const uint4 *src = reinterpret_cast<const uint4 *>(wr + (size_t)e0 * H);
        for (size_t i = threadIdx.x; i < n16; i += 256) cp_async16(ws + i * 8, src + i);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    constexpr int NJ = NORM ? MF_NORM_H / 256 : 1;
    [[maybe_unused]] float nv[NJ];
    if constexpr (NORM) {
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            int i = threadIdx.x + 256 * j;
            nv[j] = i < H ? __ldg(nw + i) : 0.0f;
        }
    }
    griddep_wait();
    griddep_launch();
    const float *xr = x + (size_t)r * H;
    if constexpr (NORM) {
        mf_norm_row<NJ>(xr, nv, H, eps, xs, sh, rank == 0 ? xn + (size_t)r * H : nullptr);
    } else {
        for (int i = threadIdx.x; i < H; i += 256) xs[i] = xr[i];
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const int q0 = warp * 4;
    for (int kk = lane * 8; kk < H; kk += 256) {
        const float *xk = xs + kk;
#pragma unroll
        for (int q = 0; q < 4; q++)
            if (q0 + q < nrows)
                acc[q] = fma8(*reinterpret_cast<const uint4 *>(ws + (size_t)(q0 + q) * H + kk), xk, acc[q]);
    }
    float *lg0 = cl.map_shared_rank(lg_s, 0);
#pragma unroll
    for (int q = 0; q < 4; q++) {
        float v = warp_sum(acc[q]);
        if (lane == 0 && q0 + q < nrows) lg0[e0 + q0 + q] = v;
    }
    cl.sync(); /* every logit in block 0's shared memory */
    if (rank != 0 || warp != 0) return;
    int my_e, rank_e;
    float my_w;
    mf_select<8, 1>(lg_s, E, k, norm, lane, &my_e, &my_w, &rank_e);
    if (lane < k) {
        idx[(size_t)r * k + rank_e] = my_e;
        wout[(size_t)r * k + rank_e] = my_w;
        __threadfence();
    }
    __syncwarp();
    if (ready && lane == 0) st_release(ready + r, 1u);
}

/* gate_up + SwiGLU, grid (warps / MF_WARPS, T). Warp w < k Im: gate row n and up row Im + n of the row's
 * j-th chosen expert (j = w / Im, n = w % Im) -> act[r][w]; then Is warps for the shared expert's rows ->
 * act[r][k Im + n]; then one warp for the shared expert's gate logit -> shg[r]. NB: chunks per row requested
 * at once (2: 40 registers, six blocks per SM, so the 577 blocks of a 35B-A3B row are one wave).
 * EARLY (variant 16): no wait for the router kernel's completion. x is complete when this kernel starts
 * (under PDL the router lets it be scheduled only after its own wait, so the kernel before the router, which
 * wrote x, has completed), so the shared expert's warps start at once; the expert warps' blocks (k Im % 8 ==
 * 0: a block holds expert warps only, or none) spin on the router's flag ready[r], which it releases once the
 * row's choices are written. A block lets the down kernel be scheduled once its choices are known (the down
 * kernel reads them before its wait), and every block waits for the router's completion before it exits, so
 * the chain "when kernel N starts, every kernel before N - 1 has completed" holds. NORM (EARLY with the
 * router's own norm): x is the raw residual and every block takes the row's RMSNorm itself with the router's
 * arithmetic (mf_norm_row: the same bits as the xn the router writes) into shared memory. */
template <int NB, int EARLY, int NORM, int PF>
__global__ void __launch_bounds__(MF_WARPS * 32, EARLY ? 6 : 0) /* 6: 577 blocks a row in one wave */
    mf_gate_up_kernel(const float *__restrict__ x, const uint16_t *__restrict__ e_gu,
                      const int *__restrict__ idx, const uint16_t *__restrict__ sh_gu,
                      const uint16_t *__restrict__ sh_gw, float *act, float *shg, int H, int k, int Im,
                      int Is, const unsigned *ready, const float *__restrict__ nw, float eps,
                      const uint16_t *__restrict__ e_down, const uint16_t *__restrict__ sh_down) {
    [[maybe_unused]] __shared__ float sh[32];
    [[maybe_unused]] __shared__ __align__(16) float xs[NORM ? MF_NORM_H : 4];
    [[maybe_unused]] __shared__ int ok_sh;
    const int r = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wg = blockIdx.x * MF_WARPS + warp, A = k * Im + Is;
    const bool expert_block = blockIdx.x * MF_WARPS < k * Im;
    const float *xr = x + (size_t)r * H;
    /* PF (variants 32 / 64): each block requests 1 / (width / 8) of its matrix's down weights into L2 (16 H
     * bytes: a 35B-A3B expert's 2 MB in 64 pieces), the shared blocks at once, the experts' once chosen, so
     * the down kernel reads them from L2 (64: with an evict-last policy) */
    if (PF && !expert_block && threadIdx.x == 0 && sh_down && blockIdx.x * MF_WARPS < k * Im + Is)
        mf_l2_prefetch<PF == 2>(sh_down + (size_t)(blockIdx.x * MF_WARPS - k * Im) * H, 16u * (unsigned)H);
    if constexpr (EARLY) {
        if constexpr (NORM) {
            constexpr int NJ = MF_NORM_H / 256;
            float nv[NJ];
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                int i = threadIdx.x + 256 * j;
                nv[j] = i < H ? __ldg(nw + i) : 0.0f;
            }
            mf_norm_row<NJ>(xr, nv, H, eps, xs, sh, nullptr);
            xr = xs;
        }
        if (expert_block) {
            /* one poller a block; past 20 ms (never, unless the router did not run before this kernel) it
             * falls back to waiting for the router kernel's completion */
            if (threadIdx.x == 0) {
                unsigned ok = ld_acquire(ready + r);
                unsigned long long t0 = ok ? 0 : globaltimer_ns();
                for (unsigned ns = 32; !ok && globaltimer_ns() - t0 < 20000000ull;
                     ns = ns < 256 ? 2 * ns : ns) {
                    __nanosleep(ns); /* backing off: hundreds of pollers share the flag's line */
                    ok = ld_acquire(ready + r);
                }
                ok_sh = (int)ok;
            }
            __syncthreads();
            if (!ok_sh) griddep_wait();
        }
        griddep_launch();
    } else {
        griddep_wait(); /* the router's choices */
        griddep_launch();
    }
    const uint16_t *g = nullptr;
    size_t up = 0; /* elements from the gate row to the up row */
    if (wg < k * Im) {
        int j = wg / Im, n = wg - j * Im;
        int e = EARLY ? __ldcg(idx + (size_t)r * k + j) : idx[(size_t)r * k + j];
        g = e_gu + ((size_t)e * 2 * Im + n) * H;
        if (PF && threadIdx.x == 0) /* n is the block's first row: a multiple of 8 (Im % 8 == 0) */
            mf_l2_prefetch<PF == 2>(e_down + ((size_t)e * Im + n) * H, 16u * (unsigned)H);
        up = (size_t)Im * H;
    } else if (wg < A) {
        int n = wg - k * Im;
        g = sh_gu + (size_t)n * H;
        up = (size_t)Is * H;
    } else if (wg == A && sh_gw) {
        float acc[1] = {0.0f};
        const uint16_t *w1[1] = {sh_gw};
        const float *x1[1] = {xr};
        dot_rows<1, 4>(acc, w1, x1, H, lane);
        float v = warp_sum(acc[0]);
        if (lane == 0) shg[r] = v;
    }
    if (g) {
        float acc[2] = {0.0f, 0.0f};
        const uint16_t *w2[2] = {g, g + up};
        const float *x2[2] = {xr, xr};
        dot_rows<2, NB>(acc, w2, x2, H, lane);
        float gs = warp_sum(acc[0]), us = warp_sum(acc[1]);
        if (lane == 0) act[(size_t)r * A + wg] = dev_silu(gs) * us; /* cu_swiglu's expression */
    }
    if constexpr (EARLY) griddep_wait(); /* the router complete before this kernel completes */
}

/* down + combine, grid (H / MF_WARPS, T). Warp h: out[r][h] = Σ_j w_j (down_{e_j}[h] · act_j) over the
 * choices in ascending expert order, then + sigmoid(shg) (sh_down[h] · act_sh): cu_moe_combine's order. With
 * resid, resid[r][h] += that sum instead (the residual add cu_add_rmsnorm would make, the same f32 add) and
 * out is not written. */
template <int KC>
__global__ void __launch_bounds__(MF_WARPS * 32)
    mf_down_kernel(const float *__restrict__ act, const uint16_t *__restrict__ e_down,
                   const int *__restrict__ idx, const float *__restrict__ wt,
                   const uint16_t *__restrict__ sh_down, const float *__restrict__ shg, float *out,
                   float *resid, int H, int k, int Im, int Is, unsigned *ready) {
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
    const int my_e = lane < k ? __ldcg(idx + (size_t)r * k + lane) : 0;
    const float my_w = lane < k ? __ldcg(wt + (size_t)r * k + lane) : 0.0f;
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
            /* variant 16: every gate_up block has seen the router's flag (that kernel completed): clear it */
            if (ready && blockIdx.x == 0 && threadIdx.x == 0) ready[r] = 0u;
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

/* ---- variant 128: gate_up and down in one launch, blocks taking work in ticket order ----
 * Each block takes a ticket (a global counter) and does that piece of work: first the shared expert's gate_up
 * blocks (they need no routing), then the experts' gate_up blocks (on the router's flag, as variant 16), then
 * the down pieces, matrix by matrix (shared, then expert slot 0, 1, ...): RD rows h of one matrix per warp,
 * whose weights are requested once the routing is known and whose FMAs wait on a count of that matrix's
 * finished gate_up blocks. A piece waits only on work of lower tickets, which running blocks hold, so no
 * block waits on one that cannot be scheduled. The last piece of rows h0..h0 + 8 RD of a row combines them
 * (Σ_j w_j y_j in slot order, then + sigmoid(shg) y_sh: the down kernel's expression) into out or resid. The
 * dot products are the three-kernel path's (lane order, butterfly), so the bits are its bits. */
struct mf_ex {
    const float *x;  /* [T][H]: raw rows (NORM, with nw) or the normed rows */
    const float *nw; /* [H] the post-attention norm (NORM) */
    float eps;
    const uint16_t *e_gu, *e_down, *sh_gu, *sh_down, *sh_gw;
    const int *idx;        /* [T][k] */
    const float *wt;       /* [T][k] */
    const unsigned *ready; /* [T] the router's flags */
    float *act, *shg;      /* [T][k Im + Is], [T] */
    float *ey, *shy;       /* [T][k][H], [T][H]: each matrix's down rows before the combine */
    float *out, *resid;    /* as mf_down_kernel */
    unsigned *sync;        /* [cu_moe_fused_sync_words], zero between launches: ticket, blocks done; finished
                              gate_up blocks per (row, matrix), MF_PAD apart; finished down pieces per (row,
                              h-block) */
    int T, H, k, Im, Is, ng_sh, ng_ex, nb;
    int sd_first; /* variant 512: the shared expert's down pieces ticketed right after its gate_up blocks */
    unsigned total;
};

__device__ __forceinline__ float fma8_cg(uint4 u, const float *x, float acc) {
    /* fma8 with x read from L2 (other blocks of this launch wrote it) */
    const float4 *xp = reinterpret_cast<const float4 *>(x);
    float4 a = __ldcg(xp), b = __ldcg(xp + 1);
    const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    const uint32_t p[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int q = 0; q < 4; q++) {
        acc = fmaf(__uint_as_float(p[q] << 16), xv[2 * q], acc);
        acc = fmaf(__uint_as_float(p[q] & 0xffff0000u), xv[2 * q + 1], acc);
    }
    return acc;
}

/* thread 0 waits until *p >= want (acquire), then the block; past 20 ms (never unless misused) it gives up */
__device__ __forceinline__ void mf_block_wait_ge(const unsigned *p, unsigned want) {
    if (threadIdx.x == 0) {
        unsigned v = ld_acquire(p);
        unsigned long long t0 = v >= want ? 0 : globaltimer_ns();
        for (unsigned ns = 32; v < want && globaltimer_ns() - t0 < 20000000ull; ns = ns < 256 ? 2 * ns : ns) {
            __nanosleep(ns); /* backing off: many pollers share a line */
            v = ld_acquire(p);
        }
    }
    __syncthreads();
}

template <int KC, int NORM>
__global__ void __launch_bounds__(MF_WARPS * 32, KC == 2 ? 5 : 4) mf_experts_kernel(const mf_ex a) {
    constexpr int RD = KC == 2 ? 2 : 1; /* down rows a warp */
    [[maybe_unused]] __shared__ float sh[32];
    [[maybe_unused]] __shared__ __align__(16) float xs[NORM ? MF_NORM_H : 4];
    __shared__ unsigned tk, lastp;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int H = a.H, k = a.k, Im = a.Im, Is = a.Is, A = k * Im + Is, T = a.T;
    if (threadIdx.x == 0) tk = atomicAdd(a.sync, 1u);
    __syncthreads();
    unsigned t = tk;
    /* each polled counter on a 128-byte line of its own (MF_PAD words), away from the ticket's */
    unsigned *gcnt = a.sync + MF_PAD, *dcnt = a.sync + MF_PAD + (size_t)T * (k + 1) * MF_PAD;
    const unsigned nsh = (unsigned)(T * a.ng_sh), nex = (unsigned)(T * a.ng_ex);
    if (a.sd_first && Is) { /* variant 512: the order shared gate_up, shared down, experts' gate_up, down */
        const unsigned nshd = (unsigned)(T * a.nb);
        if (t >= nsh && t < nsh + nshd)
            t += nex;
        else if (t >= nsh + nshd && t < nsh + nshd + nex)
            t -= nshd;
    }
    if (t < nsh + nex) {
        /* gate_up: block gb of row r, as mf_gate_up_kernel<.., EARLY 1, NORM> */
        int r, gb;
        if (t < nsh)
            r = (int)(t / a.ng_sh), gb = (k * Im) / MF_WARPS + (int)(t % a.ng_sh);
        else
            r = (int)((t - nsh) / a.ng_ex), gb = (int)((t - nsh) % a.ng_ex);
        const int wg = gb * MF_WARPS + warp;
        const float *xr = a.x + (size_t)r * H;
        if constexpr (NORM) {
            constexpr int NJ = MF_NORM_H / 256;
            float nv[NJ];
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                int i = threadIdx.x + 256 * j;
                nv[j] = i < H ? __ldg(a.nw + i) : 0.0f;
            }
            mf_norm_row<NJ>(xr, nv, H, a.eps, xs, sh, nullptr);
            xr = xs;
        }
        const bool expert_block = gb * MF_WARPS < k * Im;
        if (expert_block) mf_block_wait_ge(a.ready + r, 1u);
        const uint16_t *g = nullptr;
        size_t up = 0;
        if (wg < k * Im) {
            int j = wg / Im, n = wg - j * Im;
            int e = __ldcg(a.idx + (size_t)r * k + j);
            g = a.e_gu + ((size_t)e * 2 * Im + n) * H;
            up = (size_t)Im * H;
        } else if (wg < A) {
            g = a.sh_gu + (size_t)(wg - k * Im) * H;
            up = (size_t)Is * H;
        } else if (wg == A && a.sh_gw) {
            float acc[1] = {0.0f};
            const uint16_t *w1[1] = {a.sh_gw};
            const float *x1[1] = {xr};
            dot_rows<1, 4>(acc, w1, x1, H, lane);
            float v = warp_sum(acc[0]);
            if (lane == 0) a.shg[r] = v;
        }
        if (g) {
            float acc[2] = {0.0f, 0.0f};
            const uint16_t *w2[2] = {g, g + up};
            const float *x2[2] = {xr, xr};
            dot_rows<2, 2>(acc, w2, x2, H, lane);
            float gs = warp_sum(acc[0]), us = warp_sum(acc[1]);
            if (lane == 0) a.act[(size_t)r * A + wg] = dev_silu(gs) * us;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            atomicAdd(gcnt + ((size_t)r * (k + 1) + (expert_block ? (gb * MF_WARPS) / Im : k)) * MF_PAD, 1u);
        }
        griddep_wait(); /* the router complete before this kernel completes */
        griddep_launch();
    } else {
        /* down: matrix m (k: the shared expert) of row r, rows h0 + RD warp + q */
        unsigned u0 = t - nsh - nex, per = (unsigned)(T * a.nb);
        int m, r, b;
        if (Is && u0 < per) {
            m = k;
        } else {
            if (Is) u0 -= per;
            m = (int)(u0 / per);
            u0 -= (unsigned)m * per;
        }
        r = (int)(u0 / a.nb), b = (int)(u0 % a.nb);
        const uint16_t *W;
        const float *xa;
        int K;
        if (m < k) {
            mf_block_wait_ge(a.ready + r, 1u);
            int e = __ldcg(a.idx + (size_t)r * k + m);
            W = a.e_down + (size_t)e * H * Im, xa = a.act + (size_t)r * A + (size_t)m * Im, K = Im;
        } else {
            W = a.sh_down, xa = a.act + (size_t)r * A + (size_t)k * Im, K = Is;
        }
        const int h0 = b * MF_WARPS * RD + warp * RD;
        float acc[RD];
        uint4 u[RD][KC];
#pragma unroll
        for (int q = 0; q < RD; q++) {
            acc[q] = 0.0f;
            int h = h0 + q < H ? h0 + q : H - 1; /* past H: a repeat, never written */
#pragma unroll
            for (int c = 0; c < KC; c++) {
                int kk = lane * 8 + 256 * c;
                u[q][c] = kk < K ? __ldg(reinterpret_cast<const uint4 *>(W + (size_t)h * K + kk))
                                 : make_uint4(0, 0, 0, 0);
            }
        }
        /* the matrix's gate_up blocks all done: its act is complete */
        mf_block_wait_ge(gcnt + ((size_t)r * (k + 1) + m) * MF_PAD,
                         m < k ? (unsigned)(Im / MF_WARPS) : (unsigned)a.ng_sh);
        griddep_wait();
        griddep_launch();
        for (int c0 = 0;; c0 += KC) {
#pragma unroll
            for (int c = 0; c < KC; c++) {
                int kk = lane * 8 + 256 * (c0 + c);
                if (kk < K)
#pragma unroll
                    for (int q = 0; q < RD; q++) acc[q] = fma8_cg(u[q][c], xa + kk, acc[q]);
            }
            if (256 * (c0 + KC) >= K) break;
                /* K past 256 KC (a shared expert wider than the experts): the next chunks */
#pragma unroll
            for (int q = 0; q < RD; q++) {
                int h = h0 + q < H ? h0 + q : H - 1;
#pragma unroll
                for (int c = 0; c < KC; c++) {
                    int kk = lane * 8 + 256 * (c0 + KC + c);
                    u[q][c] = kk < K ? __ldg(reinterpret_cast<const uint4 *>(W + (size_t)h * K + kk))
                                     : make_uint4(0, 0, 0, 0);
                }
            }
        }
        float *y = m < k ? a.ey + ((size_t)r * k + m) * H : a.shy + (size_t)r * H;
#pragma unroll
        for (int q = 0; q < RD; q++) {
            float v = warp_sum(acc[q]);
            if (lane == 0 && h0 + q < H) y[h0 + q] = v;
        }
        __syncthreads();
        const unsigned nmat = (unsigned)(k + (Is ? 1 : 0));
        if (threadIdx.x == 0) {
            __threadfence();
            unsigned old = atomicAdd(dcnt + (size_t)r * a.nb + b, 1u);
            lastp = old == nmat - 1;
            if (lastp) dcnt[(size_t)r * a.nb + b] = 0u; /* no other piece of this launch counts it again */
        }
        __syncthreads();
        if (lastp) {
            __threadfence();
            int h = b * MF_WARPS * RD + (int)threadIdx.x;
            if ((int)threadIdx.x < MF_WARPS * RD && h < H) {
                float s = 0.0f;
                for (int j = 0; j < k; j++)
                    s = fmaf(__ldcg(a.ey + ((size_t)r * k + j) * H + h), __ldcg(a.wt + (size_t)r * k + j), s);
                if (Is && a.sh_down)
                    s = fmaf(dev_sigmoid(__ldcg(a.shg + r)), __ldcg(a.shy + (size_t)r * H + h), s);
                if (a.resid)
                    a.resid[(size_t)r * H + h] += s;
                else
                    a.out[(size_t)r * H + h] = s;
            }
        }
    }
    /* the last block to finish leaves the counters and the router's flags at zero for the next launch */
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(a.sync + 1, 1u) == a.total - 1) {
            __threadfence();
            a.sync[0] = 0u, a.sync[1] = 0u;
            for (int i = 0; i < T * (k + 1); i++) gcnt[(size_t)i * MF_PAD] = 0u;
            for (int r = 0; r < T; r++) const_cast<unsigned *>(a.ready)[r] = 0u;
        }
    }
}

extern "C" int cu_moe_fused_norm_ok(int H) {
    return H <= MF_NORM_H;
}

extern "C" int cu_moe_fused_supported(int H, int E, int k, int Im, int Is) {
    return H > 0 && H % 8 == 0 && E > 0 && E <= MF_MAX_E && k > 0 && k <= MF_MAX_K && k <= E && Im > 0 &&
           Im % 8 == 0 && Im <= MF_MAX_KD && Is >= 0 && Is % 8 == 0;
}

/* cluster launch (variant 256), by PDL when pdl and the last operation on the stream was a kernel */
template <class... KA, class... A>
static void mf_launch_cluster(cu_ctx *c, int pdl, void (*kern)(KA...), dim3 grid, dim3 block, size_t smem,
                              unsigned cx, A... args) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[2];
    unsigned n = 0;
    at[n].id = cudaLaunchAttributeClusterDimension;
    at[n].val.clusterDim.x = cx, at[n].val.clusterDim.y = 1, at[n].val.clusterDim.z = 1;
    n++;
    if (pdl && !c->pdl_break) {
        at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[n].val.programmaticStreamSerializationAllowed = 1;
        n++;
    }
    c->pdl_break = 0;
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = c->stream;
    cfg.attrs = at, cfg.numAttrs = n;
    cudaLaunchKernelEx(&cfg, kern, args...);
}

/* the cluster router's shared memory (0: it does not serve this shape) */
static size_t mf_route_cl_smem(int H, int E) {
    size_t b = (size_t)RC_PER * H * 2 + (size_t)H * 4;
    return E <= RC_CTAS * RC_PER && H <= MF_NORM_H && b <= 200 * 1024 ? b : 0;
}

extern "C" void cu_moe_fused_route(cu_ctx *c, const cu_moe_args *a) {
    if (a->T <= 0) return;
    size_t clsm = (a->variant & 256) ? mf_route_cl_smem(a->H, a->E) : 0;
    if (clsm) {
        int nrm = a->norm_w != NULL;
        void (*kc)(const float *, const uint16_t *, int *, float *, int, int, int, int, const float *, float,
                   float *, unsigned *) = nrm ? mf_route_cl_kernel<1> : mf_route_cl_kernel<0>;
        static size_t set[2];
        if (set[nrm] < clsm) { /* past 48 KB of dynamic shared memory: once per size */
            cudaFuncSetAttribute(kc, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)clsm);
            set[nrm] = clsm;
        }
        mf_launch_cluster(c, (a->variant & 4) != 0, kc, dim3(RC_CTAS, (unsigned)a->T), dim3(256), clsm,
                          (unsigned)RC_CTAS, a->x, a->router, a->idx, a->w, a->H, a->E, a->k, a->norm,
                          a->norm_w, a->eps, a->xn, (a->variant & (16 | 128)) ? a->ready : (unsigned *)NULL);
        return;
    }
    int pdl = (a->variant & 4) != 0, nrm = a->norm_w != NULL;
    int warps = nrm ? 8 : RT_WARPS;
    dim3 grid(cdiv((size_t)a->E, (size_t)warps), (unsigned)a->T), block(warps * 32);
    void (*kern)(const float *, const uint16_t *, float *, int *, float *, unsigned *, int, int, int, int,
                 const float *, float, float *, unsigned *);
    /* 8 chunks of a router row requested at once: H = 2048 in one round trip (session 4's 4: no faster) */
    if (a->E <= 256)
        kern = nrm ? mf_route_kernel<8, 1, 8> : mf_route_kernel<8, 0, 8>;
    else
        kern = nrm ? mf_route_kernel<8, 1, 32> : mf_route_kernel<8, 0, 32>;
    cu_launch_pdl(c, pdl, kern, grid, block, a->x, a->router, a->logits, a->idx, a->w, a->count, a->H, a->E,
                  a->k, a->norm, a->norm_w, a->eps, a->xn,
                  (a->variant & (16 | 128)) ? a->ready : (unsigned *)NULL);
}

extern "C" void cu_moe_fused_gate_up(cu_ctx *c, const cu_moe_args *a) {
    if (a->T <= 0) return;
    int Is = a->sh_gu ? a->Is : 0;
    size_t warps = (size_t)a->k * a->Im + (size_t)Is + (a->sh_gw ? 1 : 0);
    dim3 grid(cdiv(warps, MF_WARPS), (unsigned)a->T), block(MF_WARPS * 32);
    int pdl = (a->variant & 4) != 0, early = (a->variant & 16) && a->ready, nrm = early && a->norm_w;
    int pf = (a->variant & 64) ? 2 : (a->variant & 32) ? 1 : 0;
    const float *x = a->norm_w && !nrm ? a->xn : a->x; /* the router's normed rows, or raw ones (nrm) */
    /* 2 chunks per row requested at a time: 40 registers, six blocks per SM, the 577 blocks of a 35B-A3B row
     * in one wave (session 4: 4 chunks, four blocks per SM, 14.1 vs 10.9 us) */
    typedef void (*gu_kern)(const float *, const uint16_t *, const int *, const uint16_t *, const uint16_t *,
                            float *, float *, int, int, int, int, const unsigned *, const float *, float,
                            const uint16_t *, const uint16_t *);
    static const gu_kern kerns[3][3] = {
        {mf_gate_up_kernel<2, 0, 0, 0>, mf_gate_up_kernel<2, 1, 0, 0>, mf_gate_up_kernel<2, 1, 1, 0>},
        {mf_gate_up_kernel<2, 0, 0, 1>, mf_gate_up_kernel<2, 1, 0, 1>, mf_gate_up_kernel<2, 1, 1, 1>},
        {mf_gate_up_kernel<2, 0, 0, 2>, mf_gate_up_kernel<2, 1, 0, 2>, mf_gate_up_kernel<2, 1, 1, 2>}};
    gu_kern kern = kerns[pf][nrm ? 2 : early ? 1 : 0];
    cu_launch_pdl(c, pdl, kern, grid, block, x, a->e_gu, a->idx, a->sh_gu, a->sh_gw, a->act, a->shg, a->H,
                  a->k, a->Im, Is, (const unsigned *)a->ready, a->norm_w, a->eps, a->e_down,
                  Is ? a->sh_down : (const uint16_t *)NULL);
}

extern "C" void cu_moe_fused_down(cu_ctx *c, const cu_moe_args *a) {
    if (a->T <= 0) return;
    int Is = a->sh_gu ? a->Is : 0;
    dim3 grid(cdiv((size_t)a->H, MF_WARPS), (unsigned)a->T), block(MF_WARPS * 32);
    const uint16_t *sh_down = Is ? a->sh_down : NULL;
    /* Im up to 512: 2 chunks per row and lane; up to 1024 (122B-A10B, 397B-A17B): 4. (Session 4's eight
     * experts' rows at once and session 5's shared row with the first group: no faster, the same bits.) */
    void (*kern)(const float *, const uint16_t *, const int *, const float *, const uint16_t *, const float *,
                 float *, float *, int, int, int, int, unsigned *) =
        a->Im > 512 ? mf_down_kernel<4> : mf_down_kernel<2>;
    cu_launch_pdl(c, (a->variant & 4) != 0, kern, grid, block, a->act, a->e_down, a->idx, a->w, sh_down,
                  a->shg, a->out, a->resid, a->H, a->k, a->Im, Is,
                  (a->variant & (16 | 128)) ? a->ready : (unsigned *)NULL);
}

/* 1 when the args take the one-launch experts kernel (variant 128): its scratch given, the flag */
static int mf_one_launch(const cu_moe_args *a) {
    return (a->variant & 128) && a->ready && a->sync && a->ey && (a->shy || !a->sh_gu);
}

extern "C" size_t cu_moe_fused_sync_words(int T, int H, int k) {
    return MF_PAD + (size_t)T * (k + 1) * MF_PAD +
           (size_t)T * cdiv((size_t)H, MF_WARPS); /* h-blocks: RD >= 1 */
}

/* gate_up + down in one launch (variant 128): mf_experts_kernel */
extern "C" void cu_moe_fused_experts(cu_ctx *c, const cu_moe_args *a) {
    if (a->T <= 0) return;
    if (!mf_one_launch(a)) {
        cu_moe_fused_gate_up(c, a);
        cu_moe_fused_down(c, a);
        return;
    }
    mf_ex p;
    int Is = a->sh_gu ? a->Is : 0, KC = a->Im > 512 ? 4 : 2, RD = KC == 2 ? 2 : 1;
    p.x = a->x, p.nw = a->norm_w, p.eps = a->eps; /* raw rows with norm_w, else normed ones */
    p.e_gu = a->e_gu, p.e_down = a->e_down, p.sh_gu = a->sh_gu, p.sh_down = Is ? a->sh_down : NULL,
    p.sh_gw = a->sh_gw;
    p.idx = a->idx, p.wt = a->w, p.ready = a->ready, p.act = a->act, p.shg = a->shg, p.ey = a->ey,
    p.shy = a->shy;
    p.out = a->out, p.resid = a->resid, p.sync = a->sync;
    p.T = a->T, p.H = a->H, p.k = a->k, p.Im = a->Im, p.Is = Is;
    p.ng_ex = a->k * a->Im / MF_WARPS;
    p.ng_sh = (int)cdiv((size_t)Is + (a->sh_gw ? 1 : 0), MF_WARPS);
    p.nb = (int)cdiv((size_t)a->H, (size_t)MF_WARPS * RD);
    p.total = (unsigned)(a->T * (p.ng_sh + p.ng_ex + (Is ? p.nb : 0) + a->k * p.nb));
    p.sd_first = (a->variant & 512) != 0;
    int nrm = a->norm_w != NULL;
    void (*kern)(const mf_ex) = KC == 2 ? (nrm ? mf_experts_kernel<2, 1> : mf_experts_kernel<2, 0>)
                                        : (nrm ? mf_experts_kernel<4, 1> : mf_experts_kernel<4, 0>);
    cu_launch_pdl(c, (a->variant & 4) != 0, kern, dim3(p.total), dim3(MF_WARPS * 32), p);
}

extern "C" void cu_moe_fused(cu_ctx *c, const cu_moe_args *a) {
    cu_moe_fused_route(c, a);
    cu_moe_fused_experts(c, a);
}

/* gemm_mma.cu — the skinny GEMM on tensor cores (CINFER_CUDA_SKINNY): y[M][N] = x[M][K] · w[N][K]^T for
 * decode-sized M (up to SK_MAX_M rows at a time; more rows run in tiles of 32 along grid.y), bf16 weights
 * streamed once, f32 activations, with the decode fusions of the GEMV v3 (gemv3.cu): RMSNorm prologue,
 * residual epilogue, SwiGLU epilogue — the same interface as cu_gemv_fused.
 *
 * Why: the f32 GEMVs do one FMA per weight per row of x, so at 4-8 rows they are ALU-bound (2x slower than
 * one row on the H200). Here the weights are the A operand of mma.sync m16n8k16 (16 weight rows per fragment)
 * and the rows of x the B operand (8 per fragment), x split into bf16 hi + lo (x to ~2^-17, two MMAs per
 * product) — the ALU work left is the split, once per 16 weight rows (32 with two tiles per warp), not once
 * per weight.
 *
 * Layout: a block of 8 warps is RG = 8 / KS row groups x KS K-splits (as v3). K is cut into chunks of 64;
 * chunk c belongs to split c % KS. In a chunk, lane (g, t) (g = lane / 4, t = lane % 4) reads 8 k (16 bytes)
 * at 64c + 8t and 8 at 64c + 32 + 8t of weight rows g and g + 8 of each of its tiles (each load instruction
 * takes 64 whole bytes of 8 rows), and the same 16 k of x row g of each 8-row tile of x. The MMA sums over
 * its 16 k in whatever order it has, so the physical k behind the fragment's logical k is ours to choose, as
 * long as A and B agree: k step s (0..3) of the chunk takes the lane's words 2s (as logical k 2t, 2t + 1) and
 * 2s + 1 (as 2t + 8, 2t + 9).
 *
 * Sums: per accumulator, chunks in ascending order, k steps in order, hi then lo MMA; the KS splits in split
 * order through shared memory. KS depends on (N, K, epilogue) only; the rows of x per launch (MT), the weight
 * tiles per warp (TR) and the chunks in flight (U) change no sum, and the MMA's columns are independent, so a
 * row's bits never depend on M. The norm: the sum of squares of the raw x row, per lane in chunk order, the
 * quad's butterfly, the splits in order; y = (Σ w · (x · g)) / rms(x), as v3. */
#include "backend/cuda/common.cuh"
#include "backend/cuda/gemv_fuse.cuh"

#define SK_WARPS 8
#define SK_MAX_M 32 /* rows of x per launch tile: 4 fragments of 8 */
/* rows the switch sends here by default: in the 4B decode bench of call 3 (session 4) batch 16 and 32 ran
 * slower on this kernel (7.69 / 12.45 ms a step) than on cuBLAS's hi + lo product (5.95 / 7.44) */
#define SK_DEFAULT_MAX 8
/* warps per block where the splits allow 4 or 8: 4 was as fast or faster for every matrix with <= 4 splits in
 * the H200 sweep of call 4 (4B in_proj 20.6 -> 19.7 us at one row, gate_up 35.3 -> 33.2, lm_head 300 -> 292)
 */
#define SK_DEFAULT_W 4

__device__ __forceinline__ uint4 sk_ld(const uint16_t *p) {
    return __ldcs(reinterpret_cast<const uint4 *>(p));
}

/* two f32 as bf16 (round to nearest even), a at the lower k in the low half */
__device__ __forceinline__ uint32_t sk_pack(float a, float b) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
    return r;
}

__device__ __forceinline__ void sk_mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                       uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t sk_word(const uint4 (&v)[2], int i) { /* word i (0..7) of 16 k */
    const uint4 &q = v[i >> 2];
    int c = i & 3;
    return c == 0 ? q.x : c == 1 ? q.y : c == 2 ? q.z : q.w;
}

/* the chunk's weights: rows g and g + 8 of each tile, k 64c + 8t .. + 7 and 64c + 32 + 8t .. + 7 (zeros past
 * K or past the last chunk) */
template <int TR>
__device__ __forceinline__ void sk_load_w(uint4 (&v)[TR][2][2], const uint16_t *const (&wp)[TR][2], int c,
                                          int nch, int K, int tq) {
    const int kb = c * 64 + tq * 8;
    const bool ok0 = c < nch && kb < K, ok1 = c < nch && kb + 32 < K;
    const uint4 z = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int r = 0; r < TR; r++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            v[r][h][0] = ok0 ? sk_ld(wp[r][h] + (size_t)c * 64) : z;
            v[r][h][1] = ok1 ? sk_ld(wp[r][h] + (size_t)c * 64 + 32) : z;
        }
}

/* the chunk's x: row 8j + g (zeros past the launch tile's rows, past K or past the last chunk) */
template <int MT>
__device__ __forceinline__ void sk_load_x(float4 (&v)[MT][4], const float *x, int c, int nch, int K, int Mt,
                                          int gq, int tq) {
    const int kb = c * 64 + tq * 8;
    const bool ok0 = c < nch && kb < K, ok1 = c < nch && kb + 32 < K;
    const float4 z = make_float4(0, 0, 0, 0);
#pragma unroll
    for (int j = 0; j < MT; j++) {
        const int m = j * 8 + gq;
        const bool on = m < Mt;
        const float4 *p = reinterpret_cast<const float4 *>(x + (size_t)(on ? m : 0) * K + (ok0 ? kb : 0));
        v[j][0] = on && ok0 ? __ldg(p) : z;
        v[j][1] = on && ok0 ? __ldg(p + 1) : z;
        v[j][2] = on && ok1 ? __ldg(p + 8) : z;
        v[j][3] = on && ok1 ? __ldg(p + 9) : z;
    }
}

/* MT: 8-row tiles of x per launch tile (1, 2, 4); TR: 16-row weight tiles per warp (SwiGLU: gate and up rows
 * of 16 outputs (2) or of 8 (1)); U: chunks in flight per warp; XP: each chunk's x requested with its
 * weights, U chunks ahead, rather than when the chunk is consumed; W: warps per block. nx: the next GEMV's
 * head into L2 (CINFER_CUDA_L2PF_NEXT) as the GEMV v3 requests it; NULL none */
template <int MT, int TR, int U, bool XP, bool NORM, int EPI, int W>
__global__ void __launch_bounds__(W * 32, (MT * TR >= 8 ? 8 : 16) / W)
    skinny_kernel(float *__restrict__ y, const float *__restrict__ x, const uint16_t *__restrict__ w, int M,
                  int N, int K, int KS, const float *__restrict__ g, float eps, const void *nx,
                  size_t nx_bytes) {
    /* SwiGLU, TR 2: a tile of 16 gate rows and one of the 16 up rows of the same outputs; TR 1: one tile of 8
     * gate rows (fragment rows 0..7) and their 8 up rows (8..15). Either way the up row of output o is red
     * row OUTS + o. */
    constexpr int MC = MT * 8, R = TR * 16, OUTS = EPI == GF_SWIGLU ? TR * 8 : R;
    __shared__ float red[W][R][MC];
    __shared__ float ssr[W][NORM ? MC : 1];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
    const int RG = W / KS, rg = warp / KS, ks = warp % KS;
    const int j0 = (blockIdx.x * RG + rg) * OUTS; /* first output of this warp */
    x += (size_t)blockIdx.y * MC * K;
    y += (size_t)blockIdx.y * MC * N;
    const int Mt = M - (int)blockIdx.y * MC < MC ? M - (int)blockIdx.y * MC : MC; /* valid rows of x */
    const uint16_t *wp[TR][2];
#pragma unroll
    for (int r = 0; r < TR; r++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const bool up = EPI == GF_SWIGLU && (TR == 2 ? r == 1 : h == 1);
            int n = j0 + (EPI == GF_SWIGLU ? (TR == 2 ? 8 * h : 0) : 16 * r + 8 * h) + gq;
            n = n < N ? n : N - 1; /* rows past N: read row N - 1, never written */
            wp[r][h] = w + ((size_t)n + (up ? (size_t)N : 0)) * K + tq * 8;
        }
    float acc[TR][MT][4], ss[MT];
#pragma unroll
    for (int j = 0; j < MT; j++) {
        ss[j] = 0.0f;
#pragma unroll
        for (int r = 0; r < TR; r++)
#pragma unroll
            for (int q = 0; q < 4; q++) acc[r][j][q] = 0.0f;
    }
    const int nch = (K + 63) >> 6, step = U * KS;
    uint4 wv[U][TR][2][2];                 /* [chunk in flight][tile][row g, g + 8][k 0..7, 8..15] */
    float4 xq[XP ? U : 1][XP ? MT : 1][4]; /* XP: [chunk in flight][8-row tile of x][16 k] */
    /* the weights depend on nothing before this kernel: requested before waiting for the one writing x */
#pragma unroll
    for (int u = 0; u < U; u++) sk_load_w<TR>(wv[u], wp, ks + u * KS, nch, K, tq);
    griddep_wait();
    if constexpr (XP)
#pragma unroll
        for (int u = 0; u < U; u++) sk_load_x<MT>(xq[u], x, ks + u * KS, nch, K, Mt, gq, tq);
    for (int c0 = ks; c0 < nch; c0 += step) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = c0 + u * KS;
            if (c >= nch) break;
            const int kb = c * 64 + tq * 8;
            const bool ok0 = kb < K, ok1 = kb + 32 < K;
            float gv[16];
            if (NORM) {
                const float4 z = make_float4(0, 0, 0, 0);
                const float4 *gp = reinterpret_cast<const float4 *>(g + (ok0 ? kb : 0));
                float4 v[4] = {ok0 ? __ldg(gp) : z, ok0 ? __ldg(gp + 1) : z, ok1 ? __ldg(gp + 8) : z,
                               ok1 ? __ldg(gp + 9) : z};
#pragma unroll
                for (int q = 0; q < 4; q++)
                    gv[4 * q] = v[q].x, gv[4 * q + 1] = v[q].y, gv[4 * q + 2] = v[q].z,
                           gv[4 * q + 3] = v[q].w;
            }
            float4 xl[XP ? 1 : MT][4];
            if constexpr (!XP) sk_load_x<MT>(xl, x, c, nch, K, Mt, gq, tq);
#pragma unroll
            for (int j = 0; j < MT; j++) {
                float xv[16];
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const float4 v = XP ? xq[XP ? u : 0][XP ? j : 0][q] : xl[XP ? 0 : j][q];
                    xv[4 * q] = v.x, xv[4 * q + 1] = v.y, xv[4 * q + 2] = v.z, xv[4 * q + 3] = v.w;
                }
                if (NORM)
#pragma unroll
                    for (int q = 0; q < 16; q++) {
                        ss[j] = fmaf(xv[q], xv[q], ss[j]);
                        xv[q] *= gv[q];
                    }
                uint32_t hi[8], lo[8];
#pragma unroll
                for (int p = 0; p < 8; p++) {
                    uint32_t h = sk_pack(xv[2 * p], xv[2 * p + 1]);
                    hi[p] = h;
                    lo[p] = sk_pack(xv[2 * p] - __uint_as_float(h << 16),
                                    xv[2 * p + 1] - __uint_as_float(h & 0xffff0000u));
                }
                /* the chunk's 8 MMAs into a fresh accumulator, added to the running sum in f32 (round to
                 * nearest): the tensor cores' own accumulation drops low bits at every step, which over a
                 * whole K = 5120 split reached 1.1e-5 relative (H200 call 3 of session 4) */
                float part[TR][4];
#pragma unroll
                for (int r = 0; r < TR; r++) part[r][0] = part[r][1] = part[r][2] = part[r][3] = 0.0f;
#pragma unroll
                for (int s = 0; s < 4; s++)
#pragma unroll
                    for (int r = 0; r < TR; r++) {
                        uint32_t a0 = sk_word(wv[u][r][0], 2 * s), a1 = sk_word(wv[u][r][1], 2 * s);
                        uint32_t a2 = sk_word(wv[u][r][0], 2 * s + 1), a3 = sk_word(wv[u][r][1], 2 * s + 1);
                        sk_mma(part[r], a0, a1, a2, a3, hi[2 * s], hi[2 * s + 1]);
                        sk_mma(part[r], a0, a1, a2, a3, lo[2 * s], lo[2 * s + 1]);
                    }
#pragma unroll
                for (int r = 0; r < TR; r++)
#pragma unroll
                    for (int q = 0; q < 4; q++) acc[r][j][q] += part[r][q];
            }
            /* this slot's next chunk: U - 1 chunks stay in flight while this one is consumed */
            sk_load_w<TR>(wv[u], wp, c + step, nch, K, tq);
            if constexpr (XP) sk_load_x<MT>(xq[u], x, c + step, nch, K, Mt, gq, tq);
        }
    }
    griddep_launch();
    /* the next GEMV's head into L2, from the blocks of the second half */
    if (nx && threadIdx.x == 0 && blockIdx.y == 0 && blockIdx.x >= gridDim.x / 2) {
        l2_prefetch_part(nx, nx_bytes, blockIdx.x - gridDim.x / 2, gridDim.x - gridDim.x / 2);
    }
    /* C fragment of tile (r, j): lane (g, t) holds weight rows g (0, 1) and g + 8 (2, 3), x rows 2t, 2t + 1
     */
#pragma unroll
    for (int r = 0; r < TR; r++)
#pragma unroll
        for (int j = 0; j < MT; j++) {
            red[warp][16 * r + gq][j * 8 + 2 * tq] = acc[r][j][0];
            red[warp][16 * r + gq][j * 8 + 2 * tq + 1] = acc[r][j][1];
            red[warp][16 * r + gq + 8][j * 8 + 2 * tq] = acc[r][j][2];
            red[warp][16 * r + gq + 8][j * 8 + 2 * tq + 1] = acc[r][j][3];
        }
    if (NORM)
#pragma unroll
        for (int j = 0; j < MT; j++) {
            float v = ss[j];
            v += __shfl_xor_sync(0xffffffffu, v, 1);
            v += __shfl_xor_sync(0xffffffffu, v, 2);
            if (tq == 0) ssr[warp][NORM ? j * 8 + gq : 0] = v;
        }
    __syncthreads();
    /* one thread per (x row, output), outputs fastest (coalesced stores); the splits in split order */
    for (int t = threadIdx.x; t < MC * RG * OUTS; t += blockDim.x) {
        const int m = t / (RG * OUTS), rest = t % (RG * OUTS), grp = rest / OUTS, o = rest % OUTS;
        const int n = blockIdx.x * RG * OUTS + rest;
        if (n >= N || m >= Mt) continue;
        float v = red[grp * KS][o][m];
        for (int q = 1; q < KS; q++) v += red[grp * KS + q][o][m];
        float u = 0.0f;
        if (EPI == GF_SWIGLU) {
            u = red[grp * KS][OUTS + o][m];
            for (int q = 1; q < KS; q++) u += red[grp * KS + q][OUTS + o][m];
        }
        if (NORM) {
            float s2 = ssr[grp * KS][NORM ? m : 0];
            for (int q = 1; q < KS; q++) s2 += ssr[grp * KS + q][NORM ? m : 0];
            float inv = gf_rms_inv(s2, K, eps);
            v *= inv, u *= inv;
        }
        gf_store<EPI>(y + (size_t)m * N + n, v, u);
    }
}

/* ---- configuration ---- */

static int g_mode = 0;             /* 0 off, 1 every M <= g_max, 2 only M >= 2 (one row stays on v3) */
static int g_any = 0;              /* some context has its own mode (cu_ctx_set_skinny) */
static int g_max = SK_DEFAULT_MAX; /* rows up to which the switch takes the skinny kernel */
static int g_tr = 0, g_u = 0, g_xp = -1, g_w = 0, g_ks = 0; /* 0 / -1: automatic (cu_set_skinny_config) */

extern "C" void cu_set_skinny(int mode) {
    g_mode = mode == 1 || mode == 2 ? mode : 0;
}
extern "C" int cu_skinny_mode(void) {
    return g_mode;
}
extern "C" void cu_set_skinny_max(int m) {
    g_max = m >= 1 && m <= SK_MAX_M ? m : SK_DEFAULT_MAX;
}
extern "C" int cu_skinny_max(void) {
    return g_max;
}
extern "C" void cu_set_skinny_config(int tr, int u, int xp, int w, int ks) {
    g_tr = tr == 1 || tr == 2 ? tr : 0;
    g_u = u == 1 || u == 2 ? u : 0;
    g_xp = xp == 0 || xp == 1 ? xp : -1;
    g_w = w == 4 || w == 8 ? w : 0;
    g_ks = ks == 1 || ks == 2 || ks == 4 || ks == 8 ? ks : 0;
}
extern "C" void cu_ctx_set_skinny(cu_ctx *c, int mode) {
    c->skinny = mode == 1 || mode == 2 ? mode : 0;
    if (c->skinny) g_any = 1;
}
extern "C" int cu_skinny_any(void) {
    return g_mode || g_any;
}
extern "C" int cu_skinny_takes(const cu_ctx *c, int M, int K) {
    int mode = c && c->skinny ? c->skinny : g_mode;
    return mode && (K & 7) == 0 && M >= (mode == 2 ? 2 : 1) && M <= g_max;
}

/* K-splits for width K: the fewest (1, 2, 4, 8) that leave each warp <= 10 chunks of 64 (SwiGLU, whose warps
 * read two rows per output: <= 20). From the H200 sweep of call 4 (every split count for every real matrix):
 * the best or within 3% everywhere (4B gate_up 30.6 us at one row with 2 splits, 33.2 with 4), against a
 * rule by warp count that gave the 27B in_proj 2 splits (51.3 us; 8: 44.7) and the lm_head 1 (305 us; 4:
 * 292). A function of the shape alone (never of M): the splits fix the order of every sum. */
extern "C" int cu_skinny_splits(int N, int K, int epi) {
    (void)N;
    if (g_ks) return g_ks;
    int nch = (K + 63) / 64, ks = 1, per = epi == CU_EPI_SWIGLU ? 20 : 10;
    while (ks < 8 && nch > per * ks) ks *= 2;
    return ks;
}

template <int MT, int TR, int U, bool XP, bool NORM, int EPI>
static void sk_launch(cu_ctx *c, float *y, const float *x, const uint16_t *w, int M, int N, int K, int KS,
                      const float *g, float eps) {
    constexpr int OUTS = EPI == GF_SWIGLU ? TR * 8 : TR * 16;
    /* By programmatic dependent launch where the step's level allows it, as the GEMV v3 (cu_launch_gemv),
     * with the next GEMV's head into L2. pdl_step allows it only in plain decode steps of contexts that never
     * verify speculative windows: in contexts that verify, PDL (session 4's CINFER_CUDA_PDL=gemv, which
     * launched this kernel so) broke cuda_spec_rollback_is_exact (session 5, call 3: window rows and the
     * state far from plain decode, |d| up to 5.7), and still does with CINFER_CUDA_PDL_ANY=1 (H200, session
     * 9, call 4: |d| up to 4.1); why is not found. In plain contexts with CINFER_CUDA_SKINNY=1 it is exact
     * (batch of 32 vs alone, graphs vs eager, cuda_pdl_bitwise_fixtures: session 9, call 1) and faster at
     * every batch: 4B b1 / 2 / 4 / 8 318.3 / 616.4 / 1,109.5 / 1,964.2 -> 346.6 / 666.0 / 1,194.7 / 2,057.9
     * tok/s (before, this kernel never went by PDL). */
    /* blocks of 4 warps where the splits allow (finer grains over the SMs: the same sums) */
    if (KS <= 4 && (g_w ? g_w : SK_DEFAULT_W) == 4) {
        dim3 grid(cdiv((size_t)N, (size_t)(4 / KS * OUTS)), cdiv((size_t)M, (size_t)MT * 8));
        cu_launch_gemv(c, skinny_kernel<MT, TR, U, XP, NORM, EPI, 4>, grid, dim3(4 * 32), y, x, w, M, N, K,
                       KS, g, eps, c->gemv_next, c->gemv_next_bytes);
        return;
    }
    int per_block = SK_WARPS / KS * OUTS;
    dim3 grid(cdiv((size_t)N, (size_t)per_block), cdiv((size_t)M, (size_t)MT * 8));
    cu_launch_gemv(c, skinny_kernel<MT, TR, U, XP, NORM, EPI, SK_WARPS>, grid, dim3(SK_WARPS * 32), y, x, w,
                   M, N, K, KS, g, eps, c->gemv_next, c->gemv_next_bytes);
}

template <int MT, int TR, bool NORM, int EPI>
static void sk_ux(cu_ctx *c, float *y, const float *x, const uint16_t *w, int M, int N, int K, int KS,
                  const float *g, float eps, int u, int xp) {
    if constexpr (MT == 4) { /* x a chunk ahead would take 64 more registers */
        if (u == 1)
            sk_launch<MT, TR, 1, false, NORM, EPI>(c, y, x, w, M, N, K, KS, g, eps);
        else
            sk_launch<MT, TR, 2, false, NORM, EPI>(c, y, x, w, M, N, K, KS, g, eps);
    } else {
        if (u == 1 && xp)
            sk_launch<MT, TR, 1, true, NORM, EPI>(c, y, x, w, M, N, K, KS, g, eps);
        else if (u == 1)
            sk_launch<MT, TR, 1, false, NORM, EPI>(c, y, x, w, M, N, K, KS, g, eps);
        else if (xp)
            sk_launch<MT, TR, 2, true, NORM, EPI>(c, y, x, w, M, N, K, KS, g, eps);
        else
            sk_launch<MT, TR, 2, false, NORM, EPI>(c, y, x, w, M, N, K, KS, g, eps);
    }
}

/* From the H200 sweeps of calls 3 and 4 (session 4): two weight tiles per warp won for every matrix of >=
 * 4096 rows and for all at 32 rows of x, one tile for the 2048 / 2560-row out_proj / down below; with two
 * tiles, one chunk in flight (fewer registers, more warps resident; 2 on the 248320-row lm_head at one row)
 * and x requested ahead at <= 8 rows; with one tile, 2 chunks and x ahead up to 4 rows of x (4B down 19.6
 * -> 17.7 us), 1 chunk and x when consumed above (4B out_proj at 8 rows 12.3 -> 11.6). None of these changes
 * a bit. */
template <int MT, bool NORM, int EPI>
static void sk_tr(cu_ctx *c, float *y, const float *x, const uint16_t *w, int M, int N, int K, int KS,
                  const float *g, float eps) {
    {
        int tr = g_tr ? g_tr : EPI == GF_SWIGLU || N >= 4096 || MT == 4 ? 2 : 1;
        int u = tr == 2 ? (N >= 65536 && MT == 1 ? 2 : 1) : M <= 4 ? 2 : 1;
        int xp = tr == 2 ? MT == 1 : M <= 4;
        if (g_u) u = g_u;
        if (g_xp >= 0) xp = g_xp;
        if (tr == 2)
            sk_ux<MT, 2, NORM, EPI>(c, y, x, w, M, N, K, KS, g, eps, u, xp);
        else
            sk_ux<MT, 1, NORM, EPI>(c, y, x, w, M, N, K, KS, g, eps, u, xp);
    }
}

template <bool NORM, int EPI>
static void sk_rows(cu_ctx *c, float *y, const float *x, const uint16_t *w, int M, int N, int K, int KS,
                    const float *g, float eps) {
    if (M <= 8)
        sk_tr<1, NORM, EPI>(c, y, x, w, M, N, K, KS, g, eps);
    else if (M <= 16)
        sk_tr<2, NORM, EPI>(c, y, x, w, M, N, K, KS, g, eps);
    else
        sk_tr<4, NORM, EPI>(c, y, x, w, M, N, K, KS, g, eps);
}

extern "C" int cu_skinny(cu_ctx *c, float *y, const float *x, const uint16_t *w, int M, int N, int K,
                         const float *norm_w, float eps, int epi) {
    if ((K & 7) || (norm_w && epi == CU_EPI_ADD) || (!norm_w && epi == CU_EPI_SWIGLU)) return -1;
    if (M <= 0 || N <= 0) return 0;
    int KS = cu_skinny_splits(N, K, epi);
    if (norm_w && epi == CU_EPI_SWIGLU)
        sk_rows<true, GF_SWIGLU>(c, y, x, w, M, N, K, KS, norm_w, eps);
    else if (norm_w)
        sk_rows<true, GF_STORE>(c, y, x, w, M, N, K, KS, norm_w, eps);
    else if (epi == CU_EPI_ADD)
        sk_rows<false, GF_ADD>(c, y, x, w, M, N, K, KS, NULL, eps);
    else
        sk_rows<false, GF_STORE>(c, y, x, w, M, N, K, KS, NULL, eps);
    return 0;
}

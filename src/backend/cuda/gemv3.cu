/* gemv3.cu — the decode GEMV v3 and its fused forms (CINFER_CUDA_FUSE=1, CINFER_CUDA_GEMV=v3): y = x · w^T
 * for decode-sized M with bf16 weights and f32 activations, optionally with the RMSNorm of x folded in (the
 * kernel reads the raw residual and the norm weight; no add_rmsnorm launch), the residual add folded out
 * (y += x · w^T: out_proj / down write the residual stream directly), or SwiGLU folded out (each warp owns
 * gate row j and up row j + I and writes silu(g) * u; no swiglu launch).
 *
 * Layout: a block of 8 warps is RG = 8 / KS row groups x KS K-splits. K is cut into 256-element chunks; the
 * warp of split s takes chunks s, s + KS, s + 2 KS, ... (lane l reads 16 bytes of each of its rows at
 * 256c + 8l), issuing U chunks of loads before any FMA. Few-row matrices (the N = 2560 out_proj / down) get
 * KS > 1 so that they still make enough warps to keep the copy engine's worth of bytes in flight (v1 makes
 * 1280 warps of them, v2 had 6-of-8-idle warps at K = 2560).
 *
 * Sums: per lane in chunk order, the warp's butterfly, then the KS splits in split order through shared
 * memory. KS depends on (rows, K) only — never on M — and the rows per warp (NR) and loads in flight (U) do
 * not change any sum, so a row's bits do not depend on how many rows share the launch. The norm: every
 * block accumulates the row's sum of squares alongside its dot products (the same chunks, lanes and order
 * in every block, so the same value everywhere) and applies it at the end: y = (Σ w · (x · g)) / rms(x),
 * equal to the CPU's Σ w · ((x / rms) · g) up to f32 rounding. */
#include <stdio.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemv_fuse.cuh"

#define G3_EINVAL (-1) /* CINFER_EINVAL */
#define G3_EIO    (-2) /* CINFER_EIO */

#define G3_WARPS 8
#define G3_MAXR  8 /* weight rows per warp at most (NR outputs, x2 for SwiGLU) */

enum { EPI_STORE = GF_STORE, EPI_ADD = GF_ADD, EPI_SWIGLU = GF_SWIGLU };

/* weights are read once per step: streamed past L1 (ld.global.cs). A 256-byte L2 prefetch hint with no L1
 * allocation (ld.global.nc.L1::no_allocate.L2::256B) measured the same or slower on the H200 (call 1 of
 * session 4), so it is gone. */
__device__ __forceinline__ uint4 g3_ld(const uint16_t *p) {
    return __ldcs(reinterpret_cast<const uint4 *>(p));
}

/* Diagnostics (cu_gemv3_stamps_begin / _end, the timeline test): with tag >= 0 each block of a decode GEMV
 * records %globaltimer at its start, after griddep_wait and at its end, with its SM, into g3s_buf; tag -1
 * (always outside the diagnostics) records nothing and costs a compare */
__device__ cu_g3_stamp *g3s_buf;
__device__ unsigned g3s_n, g3s_cap;
__device__ __forceinline__ unsigned long long g3_now(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void g3_stamp_put(int tag, unsigned long long t0, unsigned long long t1) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long t2 = g3_now();
        unsigned sm, i = atomicAdd(&g3s_n, 1u);
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        if (i < g3s_cap) {
            cu_g3_stamp *e = g3s_buf + i;
            e->t[0] = t0, e->t[1] = t1, e->t[2] = t2;
            e->sm = sm, e->tag = (unsigned)tag, e->block = blockIdx.x + blockIdx.y * gridDim.x;
            e->grid = gridDim.x * gridDim.y;
        }
    }
}

/* VAR: bit 1 blocks of 4 warps instead of G3_WARPS = 8 (finer grains over the SMs), bit 2 the next chunks'
 * loads issued before the current ones' FMAs (as v2), bit 3 registers capped for 40 resident warps an SM (10
 * blocks of 4 warps, 5 of 8; without it the big matrices' 62 registers allow 32); the same sums either way */
template <int MR, int NR, int U, bool NORM, int EPI, int VAR, int W = VAR & 2 ? 4 : G3_WARPS>
__global__ void __launch_bounds__(W * 32, VAR & 8 ? 40 / W : (MR == 1 ? 3 : 2) * 8 / W)
    gemv3_kernel(float *__restrict__ y, const float *__restrict__ x, const uint16_t *__restrict__ w, int N,
                 int K, int KS, const float *__restrict__ g, float eps, const void *nx, size_t nx_bytes,
                 int tag) {
    const unsigned long long ts0 = tag >= 0 ? g3_now() : 0;
    constexpr int ROWS = EPI == EPI_SWIGLU ? 2 * NR : NR;
    __shared__ float red[W][ROWS * MR + (NORM ? MR : 0)];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int RG = W / KS, rg = warp / KS, ks = warp % KS;
    const int j0 = (blockIdx.x * RG + rg) * NR; /* first output column of this warp */
    x += (size_t)blockIdx.y * MR * K;           /* tiles of MR rows along grid.y */
    y += (size_t)blockIdx.y * MR * N;
    const uint16_t *wr[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        int o = r < NR ? r : r - NR, j = j0 + o < N ? j0 + o : N - 1;
        wr[r] = w + ((size_t)j + (r < NR ? 0 : (size_t)N)) * K;
    }
    float acc[ROWS][MR], ss[MR];
#pragma unroll
    for (int m = 0; m < MR; m++) {
        ss[m] = 0.0f;
#pragma unroll
        for (int r = 0; r < ROWS; r++) acc[r][m] = 0.0f;
    }
    const int nch = (K + 255) >> 8, step = KS * U;
    uint4 wv[U][ROWS];
    /* the weights depend on nothing before this kernel: the first U chunks are requested before waiting for
     * the kernel that writes x (griddep_wait is a no-op unless launched with programmatic dependent launch)
     */
#pragma unroll
    for (int u = 0; u < U; u++) {
        int c = ks + u * KS, k = c * 256 + lane * 8;
        if (c < nch && k < K)
#pragma unroll
            for (int r = 0; r < ROWS; r++) wv[u][r] = g3_ld(wr[r] + k);
    }
    griddep_wait();
    const unsigned long long ts1 = tag >= 0 ? g3_now() : 0;
    for (int c0 = ks; c0 < nch; c0 += step) {
        /* VAR bit 2: the next U chunks are requested before this batch's FMAs (twice the registers) */
        constexpr int UP = VAR & 4 ? U : 1;
        uint4 nx[UP][ROWS];
        if (VAR & 4)
#pragma unroll
            for (int u = 0; u < UP; u++) {
                int c = c0 + step + u * KS, k = c * 256 + lane * 8;
                if (c < nch && k < K)
#pragma unroll
                    for (int r = 0; r < ROWS; r++) nx[u][r] = g3_ld(wr[r] + k);
            }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int c = c0 + u * KS, k = c * 256 + lane * 8;
            if (c >= nch || k >= K) break;
            float gv[8];
            if (NORM) {
                const float4 *gp = reinterpret_cast<const float4 *>(g + k);
                float4 a = __ldg(gp), b = __ldg(gp + 1);
                gv[0] = a.x, gv[1] = a.y, gv[2] = a.z, gv[3] = a.w, gv[4] = b.x, gv[5] = b.y, gv[6] = b.z,
                gv[7] = b.w;
            }
#pragma unroll
            for (int m = 0; m < MR; m++) {
                const float4 *xp = reinterpret_cast<const float4 *>(x + (size_t)m * K + k);
                float4 a = __ldg(xp), b = __ldg(xp + 1);
                float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
                if (NORM)
#pragma unroll
                    for (int q = 0; q < 8; q++) {
                        ss[m] = fmaf(xv[q], xv[q], ss[m]);
                        xv[q] *= gv[q];
                    }
#pragma unroll
                for (int r = 0; r < ROWS; r++) {
                    const uint32_t p[4] = {wv[u][r].x, wv[u][r].y, wv[u][r].z, wv[u][r].w};
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        acc[r][m] = fmaf(__uint_as_float(p[q] << 16), xv[2 * q], acc[r][m]);
                        acc[r][m] = fmaf(__uint_as_float(p[q] & 0xffff0000u), xv[2 * q + 1], acc[r][m]);
                    }
                }
            }
        }
        /* the next U chunks */
        if (VAR & 4) {
#pragma unroll
            for (int u = 0; u < UP; u++)
#pragma unroll
                for (int r = 0; r < ROWS; r++) wv[u][r] = nx[u][r];
        } else {
#pragma unroll
            for (int u = 0; u < U; u++) {
                int c = c0 + step + u * KS, k = c * 256 + lane * 8;
                if (c < nch && k < K)
#pragma unroll
                    for (int r = 0; r < ROWS; r++) wv[u][r] = g3_ld(wr[r] + k);
            }
        }
    }
    /* every load of this block is out: a GEMV launched after this one with programmatic dependent launch
     * may start its blocks (and their weight requests) once all blocks got here, during this one's tail */
    griddep_launch();
    /* the next GEMV's head into L2 (CINFER_CUDA_L2PF_NEXT), from the blocks of the second half: the last
     * to run, while this kernel's DRAM demand falls off */
    if (nx && threadIdx.x == 0 && blockIdx.y == 0 && blockIdx.x >= gridDim.x / 2)
        l2_prefetch_part(nx, nx_bytes, blockIdx.x - gridDim.x / 2, gridDim.x - gridDim.x / 2);
#pragma unroll
    for (int r = 0; r < ROWS; r++)
#pragma unroll
        for (int m = 0; m < MR; m++) {
            float v = warp_sum(acc[r][m]);
            if (lane == 0) red[warp][r * MR + m] = v;
        }
    if (NORM)
#pragma unroll
        for (int m = 0; m < MR; m++) {
            float v = warp_sum(ss[m]);
            if (lane == 0) red[warp][ROWS * MR + m] = v;
        }
    __syncthreads();
    /* one thread per (row group, output, m): the splits in split order */
    for (int t = threadIdx.x; t < RG * NR * MR; t += blockDim.x) {
        int grp = t / (NR * MR), o = (t / MR) % NR, m = t % MR, j = (blockIdx.x * RG + grp) * NR + o;
        if (j >= N) continue;
        const float *rw = red[grp * KS];
        float inv = 1.0f;
        if (NORM) {
            float s = rw[ROWS * MR + m];
            for (int q = 1; q < KS; q++) s += red[grp * KS + q][ROWS * MR + m];
            inv = gf_rms_inv(s, K, eps);
        }
        float v = rw[o * MR + m];
        for (int q = 1; q < KS; q++) v += red[grp * KS + q][o * MR + m];
        if (NORM) v *= inv;
        float u = 0.0f;
        if (EPI == EPI_SWIGLU) {
            u = rw[(NR + o) * MR + m];
            for (int q = 1; q < KS; q++) u += red[grp * KS + q][(NR + o) * MR + m];
            if (NORM) u *= inv;
        }
        gf_store<EPI>(y + (size_t)m * N + j, v, u);
    }
    if (tag >= 0) g3_stamp_put(tag, ts0, ts1);
}

/* ---- configuration ---- */

/* the next launch's tag for the stamps (diagnostics), -1 off; while paused launches take no tag */
static int g_stamp_tag = -1, g_stamp_pause = 0;
static cu_g3_stamp *g_stamp_dev = NULL;
static size_t g_stamp_cap = 0;

extern "C" int cu_gemv3_stamps_begin(cu_ctx *c, size_t cap, char *err, size_t errlen) {
    (void)c;
    if (g_stamp_dev || !cap) return G3_EINVAL;
    unsigned zero = 0, ucap = (unsigned)cap;
    if (cudaMalloc((void **)&g_stamp_dev, cap * sizeof(cu_g3_stamp)) != cudaSuccess ||
        cudaMemcpyToSymbol(g3s_buf, &g_stamp_dev, sizeof g_stamp_dev) != cudaSuccess ||
        cudaMemcpyToSymbol(g3s_n, &zero, sizeof zero) != cudaSuccess ||
        cudaMemcpyToSymbol(g3s_cap, &ucap, sizeof ucap) != cudaSuccess) {
        snprintf(err, errlen, "cu_gemv3_stamps_begin: %s", cudaGetErrorString(cudaGetLastError()));
        if (g_stamp_dev) cudaFree(g_stamp_dev);
        g_stamp_dev = NULL;
        return G3_EIO;
    }
    g_stamp_cap = cap;
    g_stamp_tag = 0;
    return 0;
}

/* waits for the device, copies up to cap stamps into out, returns how many were recorded (or < 0) */
extern "C" long cu_gemv3_stamps_end(cu_ctx *c, cu_g3_stamp *out, size_t cap, char *err, size_t errlen) {
    (void)c;
    if (!g_stamp_dev) return G3_EINVAL;
    unsigned n = 0;
    long rc = 0;
    if (cudaDeviceSynchronize() != cudaSuccess || cudaMemcpyFromSymbol(&n, g3s_n, sizeof n) != cudaSuccess) {
        snprintf(err, errlen, "cu_gemv3_stamps_end: %s", cudaGetErrorString(cudaGetLastError()));
        rc = G3_EIO;
    } else {
        size_t k = n < g_stamp_cap ? n : g_stamp_cap;
        if (k > cap) k = cap;
        if (cudaMemcpy(out, g_stamp_dev, k * sizeof(cu_g3_stamp), cudaMemcpyDeviceToHost) != cudaSuccess) {
            snprintf(err, errlen, "cu_gemv3_stamps_end: %s", cudaGetErrorString(cudaGetLastError()));
            rc = G3_EIO;
        } else
            rc = (long)k;
    }
    cu_g3_stamp *nul = NULL;
    cudaMemcpyToSymbol(g3s_buf, &nul, sizeof nul);
    cudaFree(g_stamp_dev);
    g_stamp_dev = NULL;
    g_stamp_tag = -1;
    return rc;
}
extern "C" int cu_gemv3_stamp_tag(void) {
    return g_stamp_tag;
}
extern "C" void cu_gemv3_stamps_pause(int on) {
    g_stamp_pause = on;
}

static int g_ks = 0, g_nr = 0, g_u = 0, g_var = -1; /* 0 / -1: automatic (cu_set_gemv3_config) */

/* measurements (CINFER_CUDA_DIAG_AB): at one row, the chunks in flight and the variant of the wide ([0]; the
 * variant not for SwiGLU, see cu_set_gemv3_glu) and the <= 8192-output ([1]) matrices; 0 / -1: automatic.
 * Neither changes a bit. */
static int g_one_u[2] = {0, 0}, g_one_var[2] = {-1, -1};
/* the <= 4096-output matrices at one row (the 4B / 35B-A3B out_proj and down; the 27B's, unmeasured, keep 0):
 * variant 4 (the next chunks' loads before the current ones' FMAs), the default since the H200 call 3 of
 * session 6 (4B batch-1 step in the graph -0.019 ms: 2.584 -> 2.565), CINFER_CUDA_GEMV_VAR4=0 the earlier 0;
 * the same bits */
static int g_small_var = 4;
extern "C" void cu_set_gemv3_small_var4(int on) {
    g_small_var = on ? 4 : 0;
}
extern "C" void cu_set_gemv3_one(int u_small, int var_small, int u_big, int var_big) {
    g_one_u[1] = u_small == 1 || u_small == 2 || u_small == 4 ? u_small : 0;
    g_one_u[0] = u_big == 1 || u_big == 2 || u_big == 4 ? u_big : 0;
    g_one_var[1] = var_small >= 0 && var_small <= 10 && !(var_small & 1) ? var_small : -1;
    g_one_var[0] = var_big >= 0 && var_big <= 10 && !(var_big & 1) ? var_big : -1;
}
/* the wide SwiGLU GEMV (gate_up) at one row of x (CINFER_CUDA_GEMV_GLU "nr,var"): output rows a warp (1, 2,
 * 4) and the variant where K <= 4096 (the 27B's K = 5120 keeps 2, unmeasured). Variant 10 (4-warp blocks,
 * registers for 40 warps an SM) is the default since the H200 call 3 of session 7: 4B gate_up in the chain of
 * 8 with PDL 24.63 -> 23.35 us (the tail of its 2.18 waves 3.7 -> 1.5 us), the batch-1 decode graph
 * 2.501 -> 2.458 ms; never a changed bit */
static int g_glu_nr = 2, g_glu_var = 10;
extern "C" void cu_set_gemv3_glu(int nr, int var) {
    g_glu_nr = nr == 1 || nr == 4 ? nr : 2;
    g_glu_var = var >= 0 && var <= 10 && !(var & 1) ? var : 10;
}

extern "C" void cu_set_gemv3_config(int ks, int nr, int u, int var) {
    g_var = var >= 0 && var <= 10 && !(var & 1) ? var : -1;
    g_ks = ks == 1 || ks == 2 || ks == 4 || ks == 8 ? ks : 0;
    g_nr = nr == 1 || nr == 2 || nr == 4 ? nr : 0;
    g_u = u == 1 || u == 2 || u == 4 ? u : 0;
}

/* K-splits for a matrix of `rows` weight rows (2N for SwiGLU) and width K: 2 where K <= 4096 or the matrix
 * has few rows, else 1 (each split keeping >= 2 chunks of 256). From the H200 sweep of call 1 (session 4,
 * every configuration of every real matrix at one row): 2 splits were best or within 1% for all the 4B and
 * 35B-A3B matrices (K = 2048-4096, and the 2560 x 9216 down), 1 for the 27B ones (K >= 5120; 2-4 splits
 * gained <= 4% on two of them and lost 5-10% on the others). A function of the shape alone (never of M):
 * the splits fix the order of every sum. */
extern "C" int cu_gemv3_splits(int rows, int K) {
    if (g_ks) return g_ks;
    int nch = (K + 255) / 256;
    return (K <= 4096 || rows <= 2560) && nch >= 4 ? 2 : 1;
}

extern "C" int cu_gemv_fusable(int M, int K) {
    return M >= 1 && (M <= cu_gemv_max() || (cu_skinny_any() && M <= cu_skinny_max())) && (K & 7) == 0;
}

/* ---- launchers ---- */

template <int MR, int NR, int U, bool NORM, int EPI, int VAR = 0>
static void g3_launch(cu_ctx *c, float *y, const float *x, const uint16_t *w, int tiles, int N, int K, int KS,
                      const float *g, float eps) {
    constexpr int W = VAR & 2 ? 4 : G3_WARPS;
    if (KS > W) KS = W; /* a forced 8 splits with 4-warp blocks (measurements only) */
    int per_block = W / KS * NR;
    dim3 grid(cdiv((size_t)N, (size_t)per_block), (unsigned)tiles);
    cu_launch_gemv(c, gemv3_kernel<MR, NR, U, NORM, EPI, VAR>, grid, dim3(W * 32), y, x, w, N, K, KS, g, eps,
                   c->gemv_next, c->gemv_next_bytes, g_stamp_tag >= 0 && !g_stamp_pause ? g_stamp_tag++ : -1);
}

template <int VAR, bool NORM, int EPI>
static void g3_mr1(cu_ctx *c, float *y, const float *x, const uint16_t *w, int nr, int u, int tiles, int N,
                   int K, int KS, const float *g, float eps) {
    if (nr == 1 && u == 1)
        g3_launch<1, 1, 1, NORM, EPI, VAR>(c, y, x, w, tiles, N, K, KS, g, eps);
    else if (nr == 1 && u == 2)
        g3_launch<1, 1, 2, NORM, EPI, VAR>(c, y, x, w, tiles, N, K, KS, g, eps);
    else if (nr == 1)
        g3_launch<1, 1, 4, NORM, EPI, VAR>(c, y, x, w, tiles, N, K, KS, g, eps);
    else if (nr == 2 && u == 1)
        g3_launch<1, 2, 1, NORM, EPI, VAR>(c, y, x, w, tiles, N, K, KS, g, eps);
    else if (nr == 2 && u == 2)
        g3_launch<1, 2, 2, NORM, EPI, VAR>(c, y, x, w, tiles, N, K, KS, g, eps);
    else if (nr == 2)
        g3_launch<1, 2, 4, NORM, EPI, VAR>(c, y, x, w, tiles, N, K, KS, g, eps);
    else if (u == 1)
        g3_launch<1, 4, 1, NORM, EPI, VAR>(c, y, x, w, tiles, N, K, KS, g, eps);
    else
        g3_launch<1, 4, 2, NORM, EPI, VAR>(c, y, x, w, tiles, N, K, KS, g, eps);
}

/* At one row of x (batch-1 decode), from the H200 sweeps of session 4 (call 2: every rows-per-warp /
 * chunks-in-flight / block-size / pipelining choice of every real matrix at the splits above): the wide
 * matrices (in_proj) 4 output rows per warp with one chunk in flight, gate_up 2 outputs (4 weight rows) with
 * one, both in 4-warp blocks; the <= 8192-output ones (out_proj / down) one row per warp with 2 chunks in
 * flight in 8-warp blocks. Summed over the 12 real matrices 326 us against 342 for call 2's choice (the
 * best per matrix: 325); more in flight (4, 8 chunks) or the next chunks requested before the FMAs (v2's
 * pipelining) never won: fewer warps fit. cu_set_gemv3_config overrides each (measurements). With more rows
 * of x the x loads weigh more (4 weight rows per warp from 4 rows of x, as v1) and registers less. None of
 * these changes a bit (the splits alone fix the sums). */
template <bool NORM, int EPI>
static void g3_tile(cu_ctx *c, float *y, const float *x, const uint16_t *w, int MR, int tiles, int N, int K,
                    int KS, const float *g, float eps) {
    constexpr int NR4 = EPI == EPI_SWIGLU ? 2 : 4;
    switch (MR) {
    case 1: {
        int small = N <= 8192, glu = EPI == EPI_SWIGLU && !small;
        int nr = g_nr ? g_nr : small ? 1 : glu ? g_glu_nr : 4;
        int u = g_u     ? g_u
                : small ? 2
                        : 1,
            var = g_var >= 0         ? g_var
                  : small            ? (N <= 4096 ? g_small_var : 0)
                  : glu && K <= 4096 ? g_glu_var
                                     : 2;
        if (!g_u && g_one_u[small]) u = g_one_u[small];
        if (g_var < 0 && g_one_var[small] >= 0 && !glu)
            var = g_one_var[small]; /* gate_up: cu_set_gemv3_glu */
        if (var == 2)
            g3_mr1<2, NORM, EPI>(c, y, x, w, nr, u, tiles, N, K, KS, g, eps);
        else if (var == 4)
            g3_mr1<4, NORM, EPI>(c, y, x, w, nr, u, tiles, N, K, KS, g, eps);
        else if (var == 6)
            g3_mr1<6, NORM, EPI>(c, y, x, w, nr, u, tiles, N, K, KS, g, eps);
        else if (var == 8)
            g3_mr1<8, NORM, EPI>(c, y, x, w, nr, u, tiles, N, K, KS, g, eps);
        else if (var == 10)
            g3_mr1<10, NORM, EPI>(c, y, x, w, nr, u, tiles, N, K, KS, g, eps);
        else
            g3_mr1<0, NORM, EPI>(c, y, x, w, nr, u, tiles, N, K, KS, g, eps);
        break;
    }
    case 2:
        g3_launch<2, 2, 2, NORM, EPI>(c, y, x, w, tiles, N, K, KS, g, eps);
        break;
    case 3:
        g3_launch<3, 2, 2, NORM, EPI>(c, y, x, w, tiles, N, K, KS, g, eps);
        break;
    case 4:
        g3_launch<4, NR4, 1, NORM, EPI>(c, y, x, w, tiles, N, K, KS, g, eps);
        break;
    case 5:
        g3_launch<5, NR4, 1, NORM, EPI>(c, y, x, w, tiles, N, K, KS, g, eps);
        break;
    case 6:
        g3_launch<6, NR4, 1, NORM, EPI>(c, y, x, w, tiles, N, K, KS, g, eps);
        break;
    case 7:
        g3_launch<7, NR4, 1, NORM, EPI>(c, y, x, w, tiles, N, K, KS, g, eps);
        break;
    default:
        g3_launch<8, NR4, 1, NORM, EPI>(c, y, x, w, tiles, N, K, KS, g, eps);
        break;
    }
}

template <bool NORM, int EPI>
static void g3_rows(cu_ctx *c, float *y, const float *x, const uint16_t *w, int M, int N, int K, int KS,
                    const float *g, float eps) {
    int full = M / 8, rest = M % 8;
    if (full) g3_tile<NORM, EPI>(c, y, x, w, 8, full, N, K, KS, g, eps);
    if (rest)
        g3_tile<NORM, EPI>(c, y + (size_t)full * 8 * N, x + (size_t)full * 8 * K, w, rest, 1, N, K, KS, g,
                           eps);
}

extern "C" void cu_set_gemv_next(cu_ctx *c, const void *w, size_t bytes) {
    c->gemv_next = bytes >= 16 ? w : NULL;
    c->gemv_next_bytes = bytes & ~(size_t)15;
}

extern "C" int cu_gemv_fused(cu_ctx *c, float *y, const float *x, const uint16_t *w, int M, int N, int K,
                             const float *norm_w, float eps, int epi) {
    if ((K & 7) || (norm_w && epi == CU_EPI_ADD) || (!norm_w && epi == CU_EPI_SWIGLU)) return -1;
    if (M <= 0 || N <= 0) return 0;
    if (cu_skinny_takes(c, M, K)) return cu_skinny(c, y, x, w, M, N, K, norm_w, eps, epi); /* gemm_mma.cu */
    int KS = cu_gemv3_splits(epi == CU_EPI_SWIGLU ? 2 * N : N, K);
    if (norm_w && epi == CU_EPI_SWIGLU)
        g3_rows<true, EPI_SWIGLU>(c, y, x, w, M, N, K, KS, norm_w, eps);
    else if (norm_w)
        g3_rows<true, EPI_STORE>(c, y, x, w, M, N, K, KS, norm_w, eps);
    else if (epi == CU_EPI_ADD)
        g3_rows<false, EPI_ADD>(c, y, x, w, M, N, K, KS, NULL, eps);
    else
        g3_rows<false, EPI_STORE>(c, y, x, w, M, N, K, KS, NULL, eps);
    return 0;
}

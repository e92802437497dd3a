/* moe_gemm.cu — the MoE experts of a prefill chunk as two grouped GEMMs on the tensor cores
 * (CINFER_CUDA_MOE_PREFILL=grouped), launched from device-side offsets: no host round trip and no per-expert
 * cuBLAS calls. The slots (row, choice) are grouped by expert (cu_moe_group); each block computes a 64-slot
 * by BW-weight-row tile of one expert's product with bf16 weights and the f32 activations split into bf16
 * hi + lo (as cu_gemm does for cuBLAS: x to ~2^-17), f32 accumulation (mma.sync m16n8k16). Every slot's
 * output depends only on its own row and the expert's weights (fixed K order), never on the others. The same
 * kernel in its dense form computes a prefill chunk's router logits (cu_moe_router: x in three bf16 parts).
 */
#include "backend/cuda/common.cuh"

#define MG_BM      64 /* slots per block tile */
#define MG_BK      32
#define MG_THREADS 256

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* tile_off[e] = tiles of MG_BM slots before expert e's, tile_off[E] = all of them (one block) */
__global__ void moe_tiles_kernel(const int *grp, int E, int *tile_off) {
    __shared__ int t[1025];
    for (int e = threadIdx.x; e < E; e += blockDim.x) t[e] = (grp[e + 1] - grp[e] + MG_BM - 1) / MG_BM;
    __syncthreads();
    if (threadIdx.x == 0) {
        int acc = 0;
        for (int e = 0; e < E; e++) {
            int v = t[e];
            t[e] = acc;
            acc += v;
        }
        t[E] = acc;
    }
    __syncthreads();
    for (int e = threadIdx.x; e <= E; e += blockDim.x) tile_off[e] = t[e];
}

/* the four 8x8 b16 matrices whose rows lanes 0-7, 8-15, 16-23, 24-31 point at, into r[0..3] */
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void *p) {
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/* 16 bytes global -> shared, asynchronously (zeros when !valid: nothing is read) */
__device__ __forceinline__ void cp16(void *smem, const void *gmem, bool valid) {
    unsigned a = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(a), "l"(gmem), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_commit(void) {
    asm volatile("cp.async.commit_group;");
}
__device__ __forceinline__ void cp_wait1(void) { /* all but the newest group complete */
    asm volatile("cp.async.wait_group 1;" ::: "memory");
}

/* hi[i] = bf16(x[i]), lo[i] = bf16(x[i] - hi[i]) (split_bf16_kernel's split, once per GEMM), and for nx 3
 * lo2[i] = bf16(x[i] - hi[i] - lo[i]); the parts stride apart */
__global__ void mg_split_kernel(uint16_t *y, size_t stride, const float *x, size_t n, int nx) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = x[i];
        uint16_t h = f32_bf16(v);
        float r = v - bf16_f32(h);
        uint16_t l = f32_bf16(r);
        y[i] = h;
        if (nx > 1) y[stride + i] = l;
        if (nx > 2) y[2 * stride + i] = f32_bf16(r - bf16_f32(l));
    }
}

/* Block (t, c): row tile t of the expert it falls in (tile_off) — or, DENSE, rows t * 64 .. of one matrix —
 * and weight rows c * BW .. (OUT >= 1, SwiGLU: BW / 2 gate rows n and the matching up rows up_off + n, output
 * column n; OUT 0: output column = weight row). Slot p's input row is x[perm[p] / div] (DENSE: row p), split
 * into NX bf16 rows (xs + i * xstride: hi, lo, and for NX 3 the remainder; mg_split_kernel); its output row
 * is y[perm[p]] (ldy apart): f32 (OUT 0, 1), or (OUT 2) the SwiGLU value split into bf16 hi / lo rows at ys
 * and ys + ystride, the next GEMM's input as mg_split_kernel would make it. 8 warps: 2 along the slots (32
 * each) x 4 along the weight rows (BW / 32 tiles of 8 each: SwiGLU half gate, half the matching up). K % 8 ==
 * 0. Two shared-memory stages filled by cp.async (one barrier pair per step of K), fragments by ldmatrix. A
 * slot's value is the same for every BW (per 16 of K, the splits smallest first, each an independent MMA
 * into that slot's accumulators). (Session 4's other forms — 32-bit fragment loads with one stage, registers
 * in between, four stages — ran slower with the same bits; removed.) */
template <int OUT, int NX, int BW, int DENSE, int BK>
__global__ void __launch_bounds__(MG_THREADS, BW > 128 ? 2 : 3) /* 2 or 3 blocks an SM */
    moe_gemm_kernel(float *__restrict__ y, uint16_t *__restrict__ ys, size_t ystride, int ldy,
                    const uint16_t *__restrict__ xs, size_t xstride, int div, const uint16_t *__restrict__ w,
                    size_t w_expert, int up_off, const int *__restrict__ grp,
                    const int *__restrict__ tile_off, int E, int M, int N, int K) {
    constexpr int NT = BW / 32; /* n-tiles of 8 per warp */
    constexpr int LD = BK + 8;  /* shared row stride: 80 or 144 bytes, fragment reads conflict-free */
    constexpr int CPR = BK / 8; /* 16-byte chunks a row of a stage */
    constexpr int RPP = MG_THREADS / CPR;          /* rows a pass of the block's loads */
    constexpr int XP = MG_BM / RPP, WP = BW / RPP; /* passes over the slot rows, the weight rows */
    extern __shared__ __align__(16) uint16_t mg_smem[];
    uint16_t(*xsm)[MG_BM][LD] = reinterpret_cast<uint16_t(*)[MG_BM][LD]>(mg_smem); /* [st * NX + i] */
    uint16_t(*wsm)[BW][LD] = reinterpret_cast<uint16_t(*)[BW][LD]>(mg_smem + 2 * NX * MG_BM * LD); /* [st] */
    const int t = blockIdx.x, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    int e = 0, p0, cnt;
    const int *perm = NULL;
    if (DENSE) {
        p0 = t * MG_BM;
        if (p0 >= M) return;
        cnt = min(MG_BM, M - p0);
    } else {
        if (t >= tile_off[E]) return;
        int lo = 0, hi = E; /* the largest e with tile_off[e] <= t (it has tiles: tile_off[e + 1] > t) */
        while (hi - lo > 1) {
            int mid = (lo + hi) >> 1;
            if (tile_off[mid] <= t)
                lo = mid;
            else
                hi = mid;
        }
        e = lo, p0 = grp[e] + (t - tile_off[e]) * MG_BM;
        cnt = min(MG_BM, grp[e + 1] - p0);
        perm = grp + E + 1;
    }
    const uint16_t *we = w + (size_t)e * w_expert;
    const int ncols = OUT ? BW / 2 : BW, n0 = blockIdx.y * ncols;
    /* loads: thread tid takes 8 consecutive k of slot rows tid / CPR + RPP j and of weight rows
     * tid / CPR + RPP h (their source rows; -1: none, zeros) */
    const int lrow = tid / CPR, lk = (tid % CPR) * 8;
    int xrow[XP], wrow[WP];
#pragma unroll
    for (int j = 0; j < XP; j++) {
        int r = lrow + RPP * j;
        xrow[j] = r < cnt ? (DENSE ? p0 + r : perm[p0 + r]) / div : -1;
    }
#pragma unroll
    for (int h = 0; h < WP; h++) {
        int r = lrow + RPP * h; /* weight-tile row */
        int up = OUT && r >= BW / 2;
        int n = n0 + (OUT ? r - (up ? BW / 2 : 0) : r);
        wrow[h] = n < N ? (up ? up_off : 0) + n : -1;
    }
    const int wm = warp & 1, wn = warp >> 1, g = lane >> 2, tq = lane & 3;
    float acc[2][NT][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int s = 0; s < NT; s++)
#pragma unroll
            for (int q = 0; q < 4; q++) acc[i][s][q] = 0.0f;
    /* weight-tile row of the warp's n-tile s */
    int wbase[NT];
#pragma unroll
    for (int s = 0; s < NT; s++)
        wbase[s] = OUT ? (s < NT / 2 ? wn * (BW / 8) + s * 8 : BW / 2 + wn * (BW / 8) + (s - NT / 2) * 8)
                       : wn * (BW / 4) + s * 8;
    /* the MMAs of one stage: per 16 of K, the splits smallest first, slot tiles, weight tiles */
    auto compute = [&](int st) {
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            uint32_t b[NT][2];
#pragma unroll
            for (int sp = 0; sp < NT / 2; sp++) {
                uint32_t r[4];
                int wr = (lane >> 4) ? wbase[2 * sp + 1] : wbase[2 * sp];
                ldsm_x4(r, &wsm[st][wr + (lane & 7)][kk + ((lane >> 3) & 1) * 8]);
                b[2 * sp][0] = r[0], b[2 * sp][1] = r[1], b[2 * sp + 1][0] = r[2], b[2 * sp + 1][1] = r[3];
            }
#pragma unroll
            for (int half = NX - 1; half >= 0; half--)
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    int m = wm * 32 + i * 16;
                    uint32_t a[4];
                    ldsm_x4(a, &xsm[st * NX + half][m + (lane & 15)][kk + (lane >> 4) * 8]);
#pragma unroll
                    for (int s = 0; s < NT; s++) mma_bf16(acc[i][s], a, b[s][0], b[s][1]);
                }
        }
    };
    /* stage st <- rows at k0 (zeros past cnt, N or K) */
    auto issue = [&](int st, int k0) {
        int k = k0 + lk;
        bool in = k < K;
#pragma unroll
        for (int j = 0; j < XP; j++) {
            bool v = in && xrow[j] >= 0;
#pragma unroll
            for (int i = 0; i < NX; i++)
                cp16(&xsm[st * NX + i][lrow + RPP * j][lk],
                     v ? xs + i * xstride + (size_t)xrow[j] * K + k : w, v);
        }
#pragma unroll
        for (int h = 0; h < WP; h++) {
            bool v = in && wrow[h] >= 0;
            cp16(&wsm[st][lrow + RPP * h][lk], v ? we + (size_t)wrow[h] * K + k : w, v);
        }
    };
    issue(0, 0);
    cp_commit();
    for (int k0 = 0, st = 0; k0 < K; k0 += BK, st ^= 1) {
        if (k0 + BK < K) issue(st ^ 1, k0 + BK); /* the other stage: read before the last barrier */
        cp_commit();
        cp_wait1();
        __syncthreads();
        compute(st);
        __syncthreads();
    }
    /* C fragment: c0, c1 at (row g, cols 2tq, 2tq + 1), c2, c3 at row g + 8 */
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            int row = wm * 32 + i * 16 + g + 8 * hr;
            if (row >= cnt) continue;
            size_t yo = (size_t)(DENSE ? p0 + row : perm[p0 + row]) * ldy;
#pragma unroll
            for (int s = 0; s < (OUT ? NT / 2 : NT); s++)
#pragma unroll
                for (int q = 0; q < 2; q++) {
                    int col = OUT ? n0 + wn * (BW / 8) + s * 8 + 2 * tq + q
                                  : n0 + wn * (BW / 4) + s * 8 + 2 * tq + q;
                    if (col >= N) continue;
                    float v = acc[i][s][2 * hr + q];
                    if (OUT) v = dev_silu(v) * acc[i][s + NT / 2][2 * hr + q];
                    if (OUT == 2) {
                        uint16_t h = f32_bf16(v);
                        ys[yo + col] = h;
                        if (NX > 1) ys[ystride + yo + col] = f32_bf16(v - bf16_f32(h));
                    } else {
                        y[yo + col] = v;
                    }
                }
        }
}

extern "C" void cu_moe_tiles(cu_ctx *c, const int *grp, int E, int *tile_off) {
    if (E > 0 && E <= 1024) moe_tiles_kernel<<<1, 1024, 0, c->stream>>>(grp, E, tile_off);
}

static unsigned max_tiles(int S, int E) {
    return cdiv((size_t)S, MG_BM) + (unsigned)(E < S ? E : S);
}

/* x's n values split into nx bf16 parts, n apart from xs on */
static void mg_split(cu_ctx *c, uint16_t *xs, const float *x, size_t n, int nx) {
    unsigned g = cdiv(n, 256);
    if (g > 65535u * 16u) g = 65535u * 16u;
    mg_split_kernel<<<g, 256, 0, c->stream>>>(xs, n, x, n, nx);
}

/* CINFER_CUDA_MOE_PF (forward_cuda.c): 4 = the grouped GEMMs in 256 weight rows x 64 of K per block step
 * instead of 128 x 32 (the same bits; H200, one 4096-token layer: 2.11 -> 1.66 ms with 8). (The router in
 * 64-row tiles, twice the blocks, measured no faster than 128: 98.6 against 95.7 us a layer; removed.) */
static int g_moe_pf;
extern "C" void cu_set_moe_pf(int mask) {
    g_moe_pf = mask;
}
extern "C" int cu_moe_pf(void) {
    return g_moe_pf;
}

#define MG_TP int OUT, int NX, int BW, int DENSE, int BK
#define MG_TA OUT, NX, BW, DENSE, BK
template <MG_TP> static size_t mg_smem_bytes(void) {
    return (size_t)2 * (NX * MG_BM + BW) * (BK + 8) * sizeof(uint16_t);
}
/* the dynamic shared memory past 48 KB, once per form (before any graph capture: cu_moe_gemm_prepare) */
template <MG_TP> static void mg_attr(void) {
    static int done;
    size_t b = mg_smem_bytes<MG_TA>();
    if (!done && b > 48 * 1024)
        cudaFuncSetAttribute(moe_gemm_kernel<MG_TA>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)b);
    done = 1;
}
/* the launch's arguments past the form */
typedef struct mg_args {
    unsigned tiles;
    int N;
    float *y;
    uint16_t *ys;
    size_t ystride;
    int ldy;
    const uint16_t *xs;
    size_t xstride;
    int div;
    const uint16_t *w;
    size_t w_expert;
    int up_off;
    const int *grp, *tile_off;
    int E, M, K;
} mg_args;
template <MG_TP> static void mg_launch(cu_ctx *c, const mg_args &a) {
    mg_attr<MG_TA>();
    dim3 grid(a.tiles, cdiv((size_t)a.N, OUT ? BW / 2 : BW));
    moe_gemm_kernel<MG_TA><<<grid, MG_THREADS, mg_smem_bytes<MG_TA>(), c->stream>>>(
        a.y, a.ys, a.ystride, a.ldy, a.xs, a.xstride, a.div, a.w, a.w_expert, a.up_off, a.grp, a.tile_off,
        a.E, a.M, a.N, a.K);
}
/* the grouped form g_moe_pf picks (c NULL: only the shared-memory limits set). Precision fast (the context's
 * one bf16 pass, cu_set_bf16_passes): NX 1, the activations' hi part alone, as cu_gemm's one pass; OUT 2 then
 * writes only the hi rows the down GEMM reads */
template <int OUT> static void mg_grouped(cu_ctx *c, const mg_args &a) {
    if (!c)
        mg_attr<OUT, 2, 256, 0, 64>(), mg_attr<OUT, 2, 128, 0, 32>(), mg_attr<OUT, 1, 256, 0, 64>(),
            mg_attr<OUT, 1, 128, 0, 32>();
    else if (c->bf16_passes == 1 && (g_moe_pf & 4))
        mg_launch<OUT, 1, 256, 0, 64>(c, a);
    else if (c->bf16_passes == 1)
        mg_launch<OUT, 1, 128, 0, 32>(c, a);
    else if (g_moe_pf & 4)
        mg_launch<OUT, 2, 256, 0, 64>(c, a);
    else
        mg_launch<OUT, 2, 128, 0, 32>(c, a);
}
/* the activation parts the grouped GEMMs read: hi + lo, or hi alone in precision fast */
static int mg_nx(const cu_ctx *c) {
    return c->bf16_passes == 1 ? 1 : 2;
}

extern "C" void cu_moe_gemm_prepare(void) {
    mg_args a = {0, 0, NULL, NULL, 0, 0, NULL, 0, 0, NULL, 0, 0, NULL, NULL, 0, 0, 0};
    mg_grouped<0>(NULL, a), mg_grouped<1>(NULL, a), mg_grouped<2>(NULL, a);
    mg_attr<0, 3, 128, 1, 32>();
}

/* the grouped gate_up + SwiGLU from x's split (xs: hi, lo rows of S / div x K, nx apart); y f32 (OUT 1) or
 * ys split (OUT 2) */
template <int OUT>
static void swiglu_any(cu_ctx *c, float *y, uint16_t *ys, int div, const uint16_t *w_gu, const int *grp,
                       const int *tile_off, int S, int E, int I, int K, const uint16_t *xs, size_t nx) {
    mg_args a = {max_tiles(S, E), I, y, ys, (size_t)S * I, I, xs, nx, div, w_gu, (size_t)2 * I * K, I, grp,
                 tile_off,        E, S, K};
    mg_grouped<OUT>(c, a);
}

extern "C" void cu_moe_gemm_swiglu(cu_ctx *c, float *y, const float *x, int div, const uint16_t *w_gu,
                                   const int *grp, const int *tile_off, int S, int E, int I, int K,
                                   uint16_t *xs) {
    if (S <= 0 || I <= 0) return;
    size_t nx = (size_t)cdiv((size_t)S, (size_t)div) * K; /* x rows: slot s reads row s / div */
    mg_split(c, xs, x, nx, mg_nx(c));
    swiglu_any<1>(c, y, NULL, div, w_gu, grp, tile_off, S, E, I, K, xs, nx);
}

extern "C" void cu_moe_gemm_swiglu_split(cu_ctx *c, uint16_t *ys, const float *x, int div,
                                         const uint16_t *w_gu, const int *grp, const int *tile_off, int S,
                                         int E, int I, int K, uint16_t *xs) {
    if (S <= 0 || I <= 0) return;
    size_t nx = (size_t)cdiv((size_t)S, (size_t)div) * K;
    mg_split(c, xs, x, nx, mg_nx(c));
    swiglu_any<2>(c, NULL, ys, div, w_gu, grp, tile_off, S, E, I, K, xs, nx);
}

/* y from x already split into hi and lo rows, nx apart (xs2) */
static void gemm_split_in(cu_ctx *c, float *y, const uint16_t *xs2, size_t nx, int div, const uint16_t *w,
                          const int *grp, const int *tile_off, int S, int E, int N, int K) {
    mg_args a = {max_tiles(S, E), N, y,   NULL,     0, N, xs2, nx, div, w,
                 (size_t)N * K,   0, grp, tile_off, E, S, K};
    mg_grouped<0>(c, a);
}

extern "C" void cu_moe_gemm(cu_ctx *c, float *y, const float *x, int div, const uint16_t *w, const int *grp,
                            const int *tile_off, int S, int E, int N, int K, uint16_t *xs) {
    if (S <= 0 || N <= 0) return;
    size_t nx = (size_t)cdiv((size_t)S, (size_t)div) * K;
    mg_split(c, xs, x, nx, mg_nx(c));
    gemm_split_in(c, y, xs, nx, div, w, grp, tile_off, S, E, N, K);
}

extern "C" void cu_moe_gemm_presplit(cu_ctx *c, float *y, const uint16_t *xs2, const uint16_t *w,
                                     const int *grp, const int *tile_off, int S, int E, int N, int K) {
    if (S <= 0 || N <= 0) return;
    gemm_split_in(c, y, xs2, (size_t)S * K, 1, w, grp, tile_off, S, E, N, K);
}

extern "C" void cu_moe_router(cu_ctx *c, float *logits, const float *x, const uint16_t *w, int T, int E,
                              int K, uint16_t *xs) {
    if (T <= 0 || E <= 0) return;
    size_t nx = (size_t)T * K;
    mg_split(c, xs, x, nx, 3);
    mg_args a = {
        (unsigned)cdiv((size_t)T, MG_BM), E, logits, NULL, 0, E, xs, nx, 1, w, 0, 0, NULL, NULL, 0, T, K};
    mg_launch<0, 3, 128, 1, 32>(c, a);
}

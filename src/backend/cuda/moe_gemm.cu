/* moe_gemm.cu — the MoE experts of a prefill chunk as two grouped GEMMs on the tensor cores
 * (CINFER_CUDA_MOE_PREFILL=grouped), launched from device-side offsets: no host round trip and no per-expert
 * cuBLAS calls. The slots (row, choice) are grouped by expert (cu_moe_group); each block computes a 64-slot
 * by 64- or 128-column tile of one expert's product with bf16 weights and the f32 activations split into bf16
 * hi + lo (as cu_gemm does for cuBLAS: x to ~2^-17), f32 accumulation (mma.sync m16n8k16). Every slot's
 * output depends only on its own row and the expert's weights (fixed K order), never on the others. */
#include "backend/cuda/common.cuh"

#define MG_BM      64  /* slots per block tile */
#define MG_BW      128 /* weight rows per block tile: 64 gate + 64 up (SwiGLU), or 128 output columns */
#define MG_BK      32
#define MG_LD      (MG_BK + 8) /* shared row stride in bf16: 80 bytes, so fragment reads hit distinct banks */
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

/* hi[i] = bf16(x[i]), lo[i] = bf16(x[i] - hi[i]): split_bf16_kernel's split, once per GEMM */
__global__ void mg_split_kernel(uint16_t *hi, uint16_t *lo, const float *x, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = x[i];
        uint16_t h = f32_bf16(v);
        hi[i] = h;
        lo[i] = f32_bf16(v - bf16_f32(h));
    }
}

/* Block (t, c): row tile t of the expert it falls in (tile_off), weight rows c * 64 .. (SwiGLU: gate rows
 * n and up rows up_off + n, output column n) or c * 128 .. (output column = weight row). Slot p's input row
 * is x[perm[p] / div], already split into bf16 hi / lo rows (xh, xl: mg_split_kernel); its output row is
 * y[perm[p]] (ldy floats apart). 8 warps: 2 along the slots (32 each) x 4 along the weight rows (4 tiles of 8
 * each: SwiGLU 2 gate + the 2 matching up tiles). K % 8 == 0. Two shared-memory stages filled by cp.async
 * (one barrier pair per step of K), fragments by ldmatrix. (Session 4's other forms — 32-bit fragment loads
 * with one stage, registers in between, four stages — ran slower with the same bits; removed.) */
template <int SWIGLU>
__global__ void __launch_bounds__(MG_THREADS)
    moe_gemm_kernel(float *__restrict__ y, int ldy, const uint16_t *__restrict__ xh,
                    const uint16_t *__restrict__ xl, int div, const uint16_t *__restrict__ w, size_t w_expert,
                    int up_off, const int *__restrict__ grp, const int *__restrict__ tile_off, int E, int N,
                    int K) {
    __shared__ __align__(16) uint16_t xs[2][2][MG_BM][MG_LD]; /* [stage][hi, lo][row][k] */
    __shared__ __align__(16) uint16_t ws[2][MG_BW][MG_LD];
    const int t = blockIdx.x, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    if (t >= tile_off[E]) return;
    int lo = 0, hi = E; /* the largest e with tile_off[e] <= t (it has tiles: tile_off[e + 1] > t) */
    while (hi - lo > 1) {
        int mid = (lo + hi) >> 1;
        if (tile_off[mid] <= t)
            lo = mid;
        else
            hi = mid;
    }
    const int e = lo, p0 = grp[e] + (t - tile_off[e]) * MG_BM;
    const int cnt = min(MG_BM, grp[e + 1] - p0);
    const int *perm = grp + E + 1;
    const uint16_t *we = w + (size_t)e * w_expert;
    const int ncols = SWIGLU ? MG_BW / 2 : MG_BW, n0 = blockIdx.y * ncols;
    /* loads: thread tid takes 8 consecutive k of slot row tid / 4 and of weight rows tid / 4, tid / 4 + 64 */
    const int lrow = tid >> 2, lk = (tid & 3) * 8;
    const size_t xoff = lrow < cnt ? (size_t)(perm[p0 + lrow] / div) * K : 0;
    const uint16_t *wrow[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int r = lrow + 64 * h; /* weight-tile row */
        int n = SWIGLU ? n0 + lrow : n0 + r;
        size_t off = SWIGLU && h ? (size_t)up_off : 0;
        wrow[h] = n < N ? we + (off + (size_t)n) * K : NULL;
    }
    const int wm = warp & 1, wn = warp >> 1, g = lane >> 2, tq = lane & 3;
    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int s = 0; s < 4; s++)
#pragma unroll
            for (int q = 0; q < 4; q++) acc[i][s][q] = 0.0f;
    /* weight-tile row of the warp's n-tile s */
    int wbase[4];
#pragma unroll
    for (int s = 0; s < 4; s++)
        wbase[s] = SWIGLU ? (s < 2 ? wn * 16 + s * 8 : 64 + wn * 16 + (s - 2) * 8) : wn * 32 + s * 8;
    /* the MMAs of one stage: per 16 of K, lo then hi (the small terms first), slot tiles, weight tiles */
    auto compute = [&](int st) {
#pragma unroll
        for (int kk = 0; kk < MG_BK; kk += 16) {
            uint32_t b[4][2];
#pragma unroll
            for (int sp = 0; sp < 2; sp++) {
                uint32_t r[4];
                int wr = (lane >> 4) ? wbase[2 * sp + 1] : wbase[2 * sp];
                ldsm_x4(r, &ws[st][wr + (lane & 7)][kk + ((lane >> 3) & 1) * 8]);
                b[2 * sp][0] = r[0], b[2 * sp][1] = r[1], b[2 * sp + 1][0] = r[2], b[2 * sp + 1][1] = r[3];
            }
#pragma unroll
            for (int half = 1; half >= 0; half--)
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    int m = wm * 32 + i * 16;
                    uint32_t a[4];
                    ldsm_x4(a, &xs[st][half][m + (lane & 15)][kk + (lane >> 4) * 8]);
#pragma unroll
                    for (int s = 0; s < 4; s++) mma_bf16(acc[i][s], a, b[s][0], b[s][1]);
                }
        }
    };
    /* stage st <- rows at k0 (zeros past cnt, N or K) */
    auto issue = [&](int st, int k0) {
        int k = k0 + lk;
        bool in = k < K, xin = lrow < cnt && in;
        cp16(&xs[st][0][lrow][lk], xin ? xh + xoff + k : w, xin);
        cp16(&xs[st][1][lrow][lk], xin ? xl + xoff + k : w, xin);
#pragma unroll
        for (int h = 0; h < 2; h++)
            cp16(&ws[st][lrow + 64 * h][lk], wrow[h] && in ? wrow[h] + k : w, wrow[h] && in);
    };
    issue(0, 0);
    cp_commit();
    for (int k0 = 0, st = 0; k0 < K; k0 += MG_BK, st ^= 1) {
        if (k0 + MG_BK < K) issue(st ^ 1, k0 + MG_BK); /* the other stage: read before the last barrier */
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
            float *yr = y + (size_t)perm[p0 + row] * ldy;
#pragma unroll
            for (int s = 0; s < (SWIGLU ? 2 : 4); s++)
#pragma unroll
                for (int q = 0; q < 2; q++) {
                    int col = SWIGLU ? n0 + wn * 16 + s * 8 + 2 * tq + q : n0 + wn * 32 + s * 8 + 2 * tq + q;
                    if (col >= N) continue;
                    float v = acc[i][s][2 * hr + q];
                    if (SWIGLU) v = dev_silu(v) * acc[i][s + 2][2 * hr + q];
                    yr[col] = v;
                }
        }
}

extern "C" void cu_moe_tiles(cu_ctx *c, const int *grp, int E, int *tile_off) {
    if (E > 0 && E <= 1024) moe_tiles_kernel<<<1, 1024, 0, c->stream>>>(grp, E, tile_off);
}

static unsigned max_tiles(int S, int E) {
    return cdiv((size_t)S, MG_BM) + (unsigned)(E < S ? E : S);
}

/* x's rows split into bf16 hi (xs) and lo (xs + n) */
static void mg_split(cu_ctx *c, uint16_t *xs, const float *x, size_t n) {
    unsigned g = cdiv(n, 256);
    if (g > 65535u * 16u) g = 65535u * 16u;
    mg_split_kernel<<<g, 256, 0, c->stream>>>(xs, xs + n, x, n);
}

extern "C" void cu_moe_gemm_swiglu(cu_ctx *c, float *y, const float *x, int div, const uint16_t *w_gu,
                                   const int *grp, const int *tile_off, int S, int E, int I, int K,
                                   uint16_t *xs) {
    if (S <= 0 || I <= 0) return;
    dim3 grid(max_tiles(S, E), cdiv((size_t)I, MG_BW / 2));
    size_t nx = (size_t)cdiv((size_t)S, (size_t)div) * K; /* x rows: slot s reads row s / div */
    mg_split(c, xs, x, nx);
    moe_gemm_kernel<1><<<grid, MG_THREADS, 0, c->stream>>>(y, I, xs, xs + nx, div, w_gu, (size_t)2 * I * K, I,
                                                           grp, tile_off, E, I, K);
}

extern "C" void cu_moe_gemm(cu_ctx *c, float *y, const float *x, int div, const uint16_t *w, const int *grp,
                            const int *tile_off, int S, int E, int N, int K, uint16_t *xs) {
    if (S <= 0 || N <= 0) return;
    dim3 grid(max_tiles(S, E), cdiv((size_t)N, MG_BW));
    size_t nx = (size_t)cdiv((size_t)S, (size_t)div) * K;
    mg_split(c, xs, x, nx);
    moe_gemm_kernel<0><<<grid, MG_THREADS, 0, c->stream>>>(y, N, xs, xs + nx, div, w, (size_t)N * K, 0, grp,
                                                           tile_off, E, N, K);
}

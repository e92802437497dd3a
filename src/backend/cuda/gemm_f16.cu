/* gemm_f16.cu — the one-pass prefill GEMM (CINFER_CUDA_PREFILL_GEMM=f16): y[M][N] = x[M][K] · w[N][K]^T with
 * f32 x, bf16 w, f32 y, on tensor cores as mma.sync m16n8k16 f16 x f16 -> f32.
 *
 * Why fp16 and not bf16: one bf16 rounding of the activations costs ~2^-9 relative per product, which the
 * tiny random fixture models amplify past 1e-2 at the logits, so cu_gemm's cuBLAS path splits x into bf16 hi
 * + lo and runs two GEMMs. fp16 keeps 11 significant bits (one rounding ~2^-12), so one pass suffices. fp16's
 * range is the catch: each row of x is scaled by a power of two s_m that puts its largest |x| in [2^14, 2^15)
 * (exact; every element within 2^-28 of the row's max stays a normal fp16), and y's row is multiplied by
 * 1 / s_m at the end (exact again). The weights stay bf16 in memory (the decode GEMVs read them) and become
 * fp16 in registers after ldmatrix: exact for 2^-14 <= |w| <= 65504; below 2^-14 fp16 is subnormal, so a
 * weight keeps an absolute error <= 2^-25 (~3e-8, against the ~1e-2 typical |w|: nothing at the logits), and
 * |w| < 2^-25 flushes to 0. |w| > 65504 would become inf (no bf16 checkpoint we know holds one).
 *
 * Kernel: a CTA of 8 warps (2 along M x 4 along N) computes a BM x BN = 128 x BN tile; K in steps of 64
 * through a STAGES-deep cp.async pipeline; smem rows of 64 halves (128 bytes) with the 16-byte chunk index
 * XOR (row % 8), so the 8 row addresses of every ldmatrix phase hit distinct banks. Rows of x past M, rows
 * of w past N and k past K load as zeros (cp.async with src-size 0), so ragged shapes need only K % 8 == 0.
 * Sums: per output, k tiles ascending, inside a tile the 4 k16 steps in order, each mma accumulating into
 * the f32 accumulator; nothing depends on M, so a row's bits are the same alone or among 4096. */
#include <cuda_fp16.h>

#include "backend/cuda/common.cuh"

#define F16_BM      128
#define F16_BK      64
#define F16_THREADS 256

__device__ __forceinline__ void f16_cp16(uint32_t dst, const void *src, bool ok) {
    int n = ok ? 16 : 0; /* src-size 0: the 16 bytes are zero-filled, nothing is read */
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void f16_commit(void) {
    asm volatile("cp.async.commit_group;");
}
template <int N> __device__ __forceinline__ void f16_wait(void) {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}
__device__ __forceinline__ void f16_ldm4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void f16_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* two bf16 (low half at the lower k) -> two fp16, round to nearest even */
__device__ __forceinline__ uint32_t f16_from_bf16x2(uint32_t u) {
    uint32_t r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;"
        : "=r"(r)
        : "f"(__uint_as_float(u & 0xffff0000u)), "f"(__uint_as_float(u << 16)));
    return r;
}
/* byte offset of 16-byte chunk c (0..7) of smem row r (128 bytes a row) */
__device__ __forceinline__ uint32_t f16_swz(int r, int c) {
    return (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4));
}

/* the forms' flags. F16_DB: the fragments of the next k16 step loaded before the MMAs of this one.
 * F16_NOCVT: diagnostic only, WRONG results: the bf16 weight bits fed as fp16 (what the conversion costs).
 * F16_SMEMCVT: the weights turned fp16 once per CTA in shared memory, each thread converting the chunks it
 * copied itself (visible to it after its own cp.async wait; the barrier before the MMAs publishes them),
 * instead of once per warp in registers after ldmatrix (where 2 warps convert each B fragment). */
#define F16_DB      1
#define F16_NOCVT   2
#define F16_SMEMCVT 4

/* BN: CTA columns; STAGES: k tiles in flight; MINB: CTAs per SM the registers must allow; FL: F16_* flags */
template <int BN, int STAGES, int MINB, int FL>
__global__ void __launch_bounds__(F16_THREADS, MINB)
    gemm_f16_kernel(float *__restrict__ y, const __half *__restrict__ x, const float *__restrict__ inv_s,
                    const uint16_t *__restrict__ w, int M, int N, int K) {
    constexpr int WN = BN / 4, NT = WN / 8; /* a warp's columns and its n8 tiles */
    constexpr int A_BYTES = F16_BM * 128, STAGE_BYTES = (F16_BM + BN) * 128;
    extern __shared__ __align__(128) unsigned char f16_smem[];
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(f16_smem);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wm = warp >> 2, wn = warp & 3;
    const int m0 = blockIdx.x * F16_BM, n0 = blockIdx.y * BN; /* M fastest: a wave shares its weight tiles */
    const int nk = (K + F16_BK - 1) / F16_BK;

    /* the loads of one k tile: A 128 rows x 8 chunks (4 per thread), B BN rows x 8 chunks */
    auto load = [&](int stage, int kt) {
        const uint32_t sa = sbase + stage * STAGE_BYTES, sb = sa + A_BYTES;
        const int kc = kt * F16_BK;
#pragma unroll
        for (int i = 0; i < F16_BM * 8 / F16_THREADS; i++) {
            const int idx = tid + i * F16_THREADS, r = idx >> 3, c = idx & 7;
            const int m = m0 + r, k = kc + c * 8;
            const bool ok = m < M && k < K;
            f16_cp16(sa + f16_swz(r, c), x + (ok ? (size_t)m * K + k : 0), ok);
        }
#pragma unroll
        for (int i = 0; i < BN * 8 / F16_THREADS; i++) {
            const int idx = tid + i * F16_THREADS, r = idx >> 3, c = idx & 7;
            const int n = n0 + r, k = kc + c * 8;
            const bool ok = n < N && k < K;
            f16_cp16(sb + f16_swz(r, c), w + (ok ? (size_t)n * K + k : 0), ok);
        }
    };

    float acc[4][NT][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < NT; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < nk) load(s, s);
        f16_commit();
    }
    /* ldmatrix row / chunk of this lane: A matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15) in a0..a3 order; B
     * matrices (k 0-7 | 8-15) of n rows 0-7, then of n rows 8-15: b0, b1 of n tile j, then of j + 1 */
    const int a_row = wm * 64 + (lane & 7) + ((lane >> 3) & 1) * 8, a_ch = lane >> 4;
    const int b_row = wn * WN + (lane & 7) + (lane >> 4) * 8, b_ch = (lane >> 3) & 1;
    /* fragments of k16 step kk of the stage at sa / sb: A as ldmatrix gives it, B converted to fp16 */
    auto frag = [&](uint32_t(&a)[4][4], uint32_t(&b)[NT][2], uint32_t sa, uint32_t sb, int kk) {
#pragma unroll
        for (int i = 0; i < 4; i++) f16_ldm4(a[i], sa + f16_swz(a_row + i * 16, kk * 2 + a_ch));
#pragma unroll
        for (int j = 0; j < NT; j += 2) {
            uint32_t t[4];
            f16_ldm4(t, sb + f16_swz(b_row + j * 8, kk * 2 + b_ch));
#pragma unroll
            for (int q = 0; q < 4; q++)
                t[q] = (FL & (F16_NOCVT | F16_SMEMCVT)) ? t[q] : f16_from_bf16x2(t[q]);
            b[j][0] = t[0], b[j][1] = t[1], b[j + 1][0] = t[2], b[j + 1][1] = t[3];
        }
    };
    for (int kt = 0; kt < nk; kt++) {
        f16_wait<STAGES - 2>();
        /* F16_SMEMCVT: this thread's own B chunks of tile kt, as load() placed them */
        if constexpr ((FL & F16_SMEMCVT) != 0) {
            const uint32_t sb = sbase + (kt % STAGES) * STAGE_BYTES + A_BYTES;
#pragma unroll
            for (int i = 0; i < BN * 8 / F16_THREADS; i++) {
                const int idx = tid + i * F16_THREADS;
                const uint32_t adr = sb + f16_swz(idx >> 3, idx & 7);
                uint32_t v0, v1, v2, v3;
                asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];"
                             : "=r"(v0), "=r"(v1), "=r"(v2), "=r"(v3)
                             : "r"(adr));
                v0 = f16_from_bf16x2(v0), v1 = f16_from_bf16x2(v1), v2 = f16_from_bf16x2(v2),
                v3 = f16_from_bf16x2(v3);
                asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};" ::"r"(adr), "r"(v0), "r"(v1), "r"(v2),
                             "r"(v3)
                             : "memory");
            }
        }
        __syncthreads(); /* tile kt landed for every thread; the stage refilled below is free */
        if (kt + STAGES - 1 < nk) load((kt + STAGES - 1) % STAGES, kt + STAGES - 1);
        f16_commit();
        const uint32_t sa = sbase + (kt % STAGES) * STAGE_BYTES, sb = sa + A_BYTES;
        if constexpr ((FL & F16_DB) != 0) {
            uint32_t a[2][4][4], b[2][NT][2];
            frag(a[0], b[0], sa, sb, 0);
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                if (kk < 3) frag(a[(kk + 1) & 1], b[(kk + 1) & 1], sa, sb, kk + 1);
#pragma unroll
                for (int i = 0; i < 4; i++)
#pragma unroll
                    for (int j = 0; j < NT; j++)
                        f16_mma(acc[i][j], a[kk & 1][i], b[kk & 1][j][0], b[kk & 1][j][1]);
            }
        } else {
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                uint32_t a[4][4], b[NT][2];
                frag(a, b, sa, sb, kk);
#pragma unroll
                for (int i = 0; i < 4; i++)
#pragma unroll
                    for (int j = 0; j < NT; j++) f16_mma(acc[i][j], a[i], b[j][0], b[j][1]);
            }
        }
    }
    f16_wait<0>();
    /* C fragment: lane (g, t) holds rows g (0, 1) and g + 8 (2, 3), columns 2t, 2t + 1 of each tile */
    const int g = lane >> 2, t = lane & 3;
    const bool pair = (N & 1) == 0 && ((uintptr_t)y & 7) == 0; /* 8-byte stores: even stride, aligned y */
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int m = m0 + wm * 64 + i * 16 + g + h * 8;
            if (m >= M) continue;
            const float sc = inv_s[m];
            float *yr = y + (size_t)m * N;
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const int n = n0 + wn * WN + j * 8 + 2 * t;
                const float v0 = acc[i][j][2 * h] * sc, v1 = acc[i][j][2 * h + 1] * sc;
                if (pair && n + 1 < N) {
                    *reinterpret_cast<float2 *>(yr + n) = make_float2(v0, v1);
                } else {
                    if (n < N) yr[n] = v0;
                    if (n + 1 < N) yr[n + 1] = v1;
                }
            }
        }
}

/* x row m -> fp16 (x · s_m) and inv_s[m] = 1 / s_m, s_m the power of two putting max |x| in [2^14, 2^15)
 * (1 for a row of zeros or one holding inf / NaN, which then reach y as inf / NaN). One block per row. */
__global__ void __launch_bounds__(256)
    f16_rows_kernel(__half *__restrict__ xh, float *__restrict__ inv_s, const float *__restrict__ x, int K) {
    __shared__ float sh[32];
    const int m = blockIdx.x;
    const float *xr = x + (size_t)m * K;
    __half *hr = xh + (size_t)m * K;
    float mx = 0.0f;
    int bad = 0;
    for (int k = threadIdx.x * 4; k < K; k += blockDim.x * 4) { /* K % 8 == 0: whole float4s */
        float4 v = *reinterpret_cast<const float4 *>(xr + k);
        mx = fmaxf(mx, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
        bad |= !isfinite(v.x) || !isfinite(v.y) || !isfinite(v.z) || !isfinite(v.w);
    }
    mx = warp_max(mx);
    bad = __any_sync(0xffffffffu, bad);
    const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) sh[wp] = bad ? INFINITY : mx;
    __syncthreads();
    float all = 0.0f;
    for (int i = 0; i < nw; i++) all = fmaxf(all, sh[i]);
    int e = 0; /* s = 2^e */
    if (all > 0.0f && isfinite(all)) e = 14 - ilogbf(all);
    if (e > 126) e = 126; /* keeps s and 1 / s normal f32 */
    if (e < -126) e = -126;
    const float s = ldexpf(1.0f, e);
    if (threadIdx.x == 0) inv_s[m] = ldexpf(1.0f, -e);
    for (int k = threadIdx.x * 4; k < K; k += blockDim.x * 4) {
        float4 v = *reinterpret_cast<const float4 *>(xr + k);
        __half2 p0 = __floats2half2_rn(v.x * s, v.y * s), p1 = __floats2half2_rn(v.z * s, v.w * s);
        *reinterpret_cast<__half2 *>(hr + k) = p0;
        *reinterpret_cast<__half2 *>(hr + k + 2) = p1;
    }
}

static int g_prefill_gemm = 0; /* 0 cuBLAS (bf16 passes), 1 this kernel */
static int g_f16_variant = 0;  /* 0 automatic, else one of the F16 variants below (tests, measurements) */

extern "C" void cu_set_prefill_gemm(int mode) {
    g_prefill_gemm = mode == 1 ? 1 : 0;
}
extern "C" int cu_prefill_gemm(void) {
    return g_prefill_gemm;
}
extern "C" void cu_set_gemm_f16_variant(int v) {
    g_f16_variant = v >= 1 && v <= CU_F16_VARIANTS ? v : 0;
}

template <int BN, int STAGES, int MINB, int FL>
static int f16_launch(cu_ctx *c, float *y, const __half *xh, const float *inv_s, const uint16_t *w, int M,
                      int N, int K) {
    constexpr int SMEM = STAGES * (F16_BM + BN) * 128;
    static int attr = 0; /* once per instantiation (not a stream operation: fine inside a capture too) */
    if (!attr) {
        if (cudaFuncSetAttribute(gemm_f16_kernel<BN, STAGES, MINB, FL>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM) != cudaSuccess)
            return -1;
        attr = 1;
    }
    dim3 grid(cdiv((size_t)M, F16_BM), cdiv((size_t)N, BN));
    gemm_f16_kernel<BN, STAGES, MINB, FL><<<grid, F16_THREADS, SMEM, c->stream>>>(y, xh, inv_s, w, M, N, K);
    return 0;
}

/* x -> xb as the GEMM reads it: [M][K] fp16 halves, then M f32 scales (K % 8 == 0, K >= 2) */
extern "C" void cu_f16_rows(cu_ctx *c, uint16_t *xb, const float *x, int M, int K) {
    if (M <= 0) return;
    f16_rows_kernel<<<M, 256, 0, c->stream>>>(reinterpret_cast<__half *>(xb),
                                              reinterpret_cast<float *>(xb + (size_t)M * K), x, K);
}

/* the GEMM on rows cu_f16_rows wrote */
extern "C" int cu_gemm_f16_prepared(cu_ctx *c, float *y, const uint16_t *xb, const uint16_t *w, int M, int N,
                                    int K) {
    if ((K & 7) || K < 8 || !xb || (((uintptr_t)w | (uintptr_t)xb) & 15)) return -1;
    if (M <= 0 || N <= 0) return 0;
    const __half *xh = reinterpret_cast<const __half *>(xb);
    const float *inv_s = reinterpret_cast<const float *>(xb + (size_t)M * K);
    int v = g_f16_variant;
    if (!v) /* 128 x 256 tiles where they fill the SMs (>= 2 waves of 132), 128 x 128 otherwise */
        v = cdiv((size_t)M, F16_BM) * cdiv((size_t)N, 256) >= 264 ? 1 : 4;
    switch (v) {
    case 1:
        return f16_launch<256, 3, 1, 0>(c, y, xh, inv_s, w, M, N, K);
    case 2:
        return f16_launch<256, 3, 1, F16_DB>(c, y, xh, inv_s, w, M, N, K);
    case 3:
        return f16_launch<256, 3, 1, F16_DB | F16_NOCVT>(c, y, xh, inv_s, w, M, N, K);
    case 5:
        return f16_launch<128, 3, 2, F16_DB>(c, y, xh, inv_s, w, M, N, K);
    case 6:
        return f16_launch<128, 3, 2, F16_DB | F16_NOCVT>(c, y, xh, inv_s, w, M, N, K);
    case 7:
        return f16_launch<128, 3, 2, 0>(c, y, xh, inv_s, w, M, N, K);
    case 8:
        return f16_launch<256, 3, 1, F16_DB | F16_SMEMCVT>(c, y, xh, inv_s, w, M, N, K);
    case 9:
        return f16_launch<128, 3, 2, F16_DB | F16_SMEMCVT>(c, y, xh, inv_s, w, M, N, K);
    default:
        return f16_launch<128, 4, 1, 0>(c, y, xh, inv_s, w, M, N, K);
    }
}

/* both: xb must hold 2 M K halves (cu_gemm's hi + lo scratch does) */
extern "C" int cu_gemm_f16(cu_ctx *c, float *y, const float *x, const uint16_t *w, int M, int N, int K,
                           uint16_t *xb) {
    /* 16-byte loads of x rows and cp.async of w rows need 16-byte aligned rows */
    if ((K & 7) || K < 8 || !xb || (((uintptr_t)x | (uintptr_t)w | (uintptr_t)xb) & 15)) return -1;
    if (M <= 0 || N <= 0) return 0;
    cu_f16_rows(c, xb, x, M, K);
    return cu_gemm_f16_prepared(c, y, xb, w, M, N, K);
}

/* sample.cu — token choice on the device, so that a decode step returns ids (and logprobs when asked)
 * instead of whole logits rows: greedy (argmax, NaN never the max, ties to the lowest id, as the CPU
 * sampler), and the CPU sampler's chain — logit_bias and penalties, top-k (k <= CU_SAMPLE_MAX_K) at a
 * temperature, top_p, min_p — with the uniform draw made by the request's generator on the host. The
 * weights use the CPU sampler's exp (Cephes expf, the same float operations, no contraction) and its f64
 * sums; the candidates are walked best first (logit desc, id asc), where the CPU walks its heap's order —
 * same distribution, but one draw can pick another of the candidates. */
#include "backend/cuda/common.cuh"

/* the CPU sampler's exp1 (sampler.c), operation for operation, with no fused multiply-adds */
__device__ float smp_exp1(float x) {
    if (!(x >= -87.0f)) return 0.0f;
    float n = __fsub_rn(__fadd_rn(__fmul_rn(x, 1.44269504088896341f), 12582912.0f), 12582912.0f);
    float r = __fsub_rn(x, __fmul_rn(n, 0.693359375f));
    r = __fsub_rn(r, __fmul_rn(n, -2.12194440e-4f));
    float p = 1.9875691500e-4f;
    p = __fadd_rn(__fmul_rn(p, r), 1.3981999507e-3f);
    p = __fadd_rn(__fmul_rn(p, r), 8.3334519073e-3f);
    p = __fadd_rn(__fmul_rn(p, r), 4.1665795894e-2f);
    p = __fadd_rn(__fmul_rn(p, r), 1.6666665459e-1f);
    p = __fadd_rn(__fmul_rn(p, r), 5.0000001201e-1f);
    float y = __fadd_rn(__fadd_rn(__fmul_rn(__fmul_rn(p, r), r), r), 1.0f);
    int bits = ((int)n + 127) * (1 << 23);
    return __fmul_rn(y, __int_as_float(bits));
}

/* one round of a slice's scan: x[base + u NT + tid] for u < U (-inf past i1), every load in flight before
 * any is used */
template <int U, int NT>
__device__ __forceinline__ void smp_round(float (&v)[U], const float *x, int base, int i1, int tid) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        int i = base + u * NT + tid;
        v[u] = i < i1 ? __ldcg(x + i) : -INFINITY;
    }
}

/* (logit, id) ordered as the CPU's better(): larger logit, then lower id */
__device__ __forceinline__ bool smp_better(float a, int ia, float b, int ib) {
    return a > b || (a == b && ia < ib);
}

/* the best pair over the block (every thread gets it) */
__device__ void smp_block_best(float &v, int &id, float *sv, int *si) {
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, v, o);
        int oi = __shfl_xor_sync(0xffffffffu, id, o);
        if (smp_better(ov, oi, v, id)) v = ov, id = oi;
    }
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sv[w] = v, si[w] = id;
    __syncthreads();
    if (w == 0) {
        v = lane < nw ? sv[lane] : -INFINITY;
        id = lane < nw ? si[lane] : 0x7fffffff;
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, v, o);
            int oi = __shfl_xor_sync(0xffffffffu, id, o);
            if (smp_better(ov, oi, v, id)) v = ov, id = oi;
        }
        if (lane == 0) sv[0] = v, si[0] = id;
    }
    __syncthreads();
    v = sv[0], id = si[0];
}

/* ---- the sampler: the row's top_k by many blocks, then top_p, min_p and the draw ----
 * The first sample_kernel walked a row's V logits with one block, once per candidate (k rounds of an
 * argmax): tens of microseconds a row at V = 248320, so the engine kept everything but greedy on the host (the whole
 * row copied back, the CPU sampler run on it). Here a row is cut into slices as in argmax_kernel; each
 * warp keeps a best-first list of the K = top_k best (logit desc, id asc; NaN as -inf) of what it read, in
 * registers (lane l holds entries l and 32 + l); a value enters only if it beats entry K - 1, so after the
 * first few rounds a round of 32 values costs one vote. The block joins its warps' lists, writes K
 * candidates, and the row's last block joins the slices' lists into the row's K best, which are the CPU
 * sampler's top_k set. Then, as run_chain: weights exp1((l - m) / T) (smp_exp1, the CPU's exp), top_p's
 * shortest best-first prefix reaching top_p of their sum (f64, summed best first), min_p's filter, and the
 * draw u * z walked best first (the CPU walks its heap's order: the same distribution, but one u can give
 * another of the candidates). A row's logprob: the blocks' (max, sum of exp) of the raw logits joined.
 * Tokens that logit_bias or a penalty adjusts are marked in a per-row bitmap first (sample_mark_kernel):
 * the slices leave them out and the row's last block adds them with their adjusted values (as the CPU's
 * load_adjusted forms them), so the logits themselves are never written. */
#define SMP_NT    256
#define SMP_U     8
#define SMP_FULL  0xffffffffu
#define SMP_NONE  0x7fffffff

struct smp_list {
    float av, bv; /* entries lane and 32 + lane */
    int ai, bi;
};
__device__ __forceinline__ void sl_init(smp_list &L) {
    L.av = L.bv = -INFINITY;
    L.ai = L.bi = SMP_NONE; /* worse than any real candidate, -inf ones included */
}
/* (v, i) (the same in every lane) into the list at its place if it beats entry K - 1 */
__device__ __forceinline__ void sl_insert(smp_list &L, int K, float v, int i, int lane) {
    int p = __popc(__ballot_sync(SMP_FULL, smp_better(L.av, L.ai, v, i))) +
            __popc(__ballot_sync(SMP_FULL, smp_better(L.bv, L.bi, v, i)));
    if (p >= K) return;
    float pav = __shfl_up_sync(SMP_FULL, L.av, 1), pbv = __shfl_up_sync(SMP_FULL, L.bv, 1);
    int pai = __shfl_up_sync(SMP_FULL, L.ai, 1), pbi = __shfl_up_sync(SMP_FULL, L.bi, 1);
    float a31v = __shfl_sync(SMP_FULL, L.av, 31);
    int a31i = __shfl_sync(SMP_FULL, L.ai, 31);
    if (lane == 0) pbv = a31v, pbi = a31i; /* entry 32's predecessor is entry 31 */
    int qb = 32 + lane;
    if (qb == p) L.bv = v, L.bi = i;
    else if (qb > p) L.bv = pbv, L.bi = pbi;
    if (lane == p) L.av = v, L.ai = i;
    else if (lane > p) L.av = pav, L.ai = pai;
}
/* every lane's (v, i) that beats entry K - 1, lane by lane */
__device__ __forceinline__ void sl_feed(smp_list &L, int K, float v, int i, int lane) {
    const int q = K - 1;
    float tv = __shfl_sync(SMP_FULL, q < 32 ? L.av : L.bv, q & 31);
    int ti = __shfl_sync(SMP_FULL, q < 32 ? L.ai : L.bi, q & 31);
    unsigned m = __ballot_sync(SMP_FULL, smp_better(v, i, tv, ti));
    while (m) {
        int src = __ffs(m) - 1;
        m &= m - 1;
        sl_insert(L, K, __shfl_sync(SMP_FULL, v, src), __shfl_sync(SMP_FULL, i, src), lane);
    }
}
/* the K best of the warps' lists (in sh, [warps][CU_SAMPLE_MAX_K]) into warp 0's L */
__device__ __forceinline__ void sl_join(smp_list &L, int K, const float2 *sh, int lane) {
    for (int w = 1; w < SMP_NT / 32; w++)
        for (int q0 = 0; q0 < K; q0 += 32) {
            float2 c = q0 + lane < K ? sh[w * CU_SAMPLE_MAX_K + q0 + lane] : make_float2(-INFINITY, 0.0f);
            sl_feed(L, K, c.x, q0 + lane < K ? __float_as_int(c.y) : SMP_NONE, lane);
        }
}
__device__ __forceinline__ void sl_store(const smp_list &L, float2 *dst, int lane) {
    dst[lane] = make_float2(L.av, __int_as_float(L.ai));
    dst[32 + lane] = make_float2(L.bv, __int_as_float(L.bi));
}

/* the row's adjusted tokens marked in its bitmap (a block per row), so that the slices' scans leave them
 * out: their adjusted values join the candidates at the row's last block. The raw logits stay as they are
 * (the logprob is of the raw distribution) */
__global__ void __launch_bounds__(SMP_NT)
    sample_mark_kernel(const cu_sample_row *rows, const cu_sample_pen *pen, unsigned *bits, int words) {
    const cu_sample_row p = rows[blockIdx.x]; /* uploaded before the step's kernels: no kernel writes it */
    griddep_wait(); /* the bitmap's last reader: the previous sample_kernel */
    griddep_launch();
    unsigned *b = bits + (size_t)blockIdx.x * words;
    for (int j = threadIdx.x; j < p.n_pen; j += SMP_NT) {
        int t = pen[p.pen0 + j].token;
        atomicOr(b + (t >> 5), 1u << (t & 31));
    }
}

/* a token's logit after its adjustments, as load_adjusted forms it (NaN as -inf) */
__device__ __forceinline__ float smp_adjust(float v, const cu_sample_pen &q, float rep) {
    if (v != v) v = -INFINITY;
    if (q.flags & CU_PEN_BIAS) v = __fadd_rn(v, q.bias);
    if (q.flags & CU_PEN_REP) v = v > 0.0f ? __fdiv_rn(v, rep) : __fmul_rn(v, rep);
    if (q.flags & CU_PEN_SUB) v = __fsub_rn(v, q.sub);
    return v;
}

__global__ void __launch_bounds__(SMP_NT) sample_kernel(const float *logits, int V, const cu_sample_row *rows,
                                                        const cu_sample_pen *pen, unsigned *bits, int words,
                                                        int *ids, float *lps, float2 *part, double2 *lpart,
                                                        unsigned *cnt) {
    __shared__ float2 sh[SMP_NT / 32][CU_SAMPLE_MAX_K];
    __shared__ float ew[CU_SAMPLE_MAX_K], sv[32];
    __shared__ int si[32];
    __shared__ double sd[SMP_NT / 32];
    __shared__ bool last;
    const int row = blockIdx.y, nb = gridDim.x, b = blockIdx.x, tid = threadIdx.x, lane = tid & 31,
              warp = tid >> 5;
    const cu_sample_row p = rows[row]; /* uploaded before the step's kernels: no kernel writes it */
    const int greedy = !(p.inv_t > 0.0f) || p.top_k <= 1;
    int K = greedy ? 1 : p.top_k < CU_SAMPLE_MAX_K ? p.top_k : CU_SAMPLE_MAX_K;
    if (K > V) K = V;
    const float *x = logits + (size_t)row * V;
    const int per = (V + nb - 1) / nb, i0 = b * per, i1 = i0 + per < V ? i0 + per : V;
    unsigned *rb = bits + (size_t)row * words; /* this row's marked tokens (n_pen > 0) */
    griddep_wait(); /* the logits (lm_head), the marks (sample_mark_kernel) */
    griddep_launch();
    smp_list L;
    sl_init(L);
    float lm = -INFINITY; /* the slice's largest logit (NaN left out) */
    for (int base = i0; base < i1; base += SMP_NT * SMP_U) {
        float v[SMP_U];
        smp_round<SMP_U, SMP_NT>(v, x, base, i1, tid);
        unsigned mk[SMP_U]; /* a warp's 32 consecutive ids share one word of the marks */
#pragma unroll
        for (int u = 0; u < SMP_U; u++) {
            int i = base + u * SMP_NT + tid;
            mk[u] = p.n_pen && i < i1 ? __ldcg(rb + (i >> 5)) : 0u;
        }
#pragma unroll
        for (int u = 0; u < SMP_U; u++) {
            int i = base + u * SMP_NT + tid;
            float t = v[u] != v[u] ? -INFINITY : v[u];
            lm = fmaxf(lm, t);
            int in = i < i1 && !(mk[u] >> (i & 31) & 1u); /* marked: its adjusted value joins at the end */
            sl_feed(L, K, in ? t : -INFINITY, in ? i : SMP_NONE, lane);
        }
    }
    sl_store(L, sh[warp], lane);
    __syncthreads();
    if (warp == 0) {
        sl_join(L, K, &sh[0][0], lane);
        float2 *dst = part + ((size_t)row * nb + b) * CU_SAMPLE_MAX_K;
        if (lane < K) dst[lane] = make_float2(L.av, __int_as_float(L.ai));
        if (32 + lane < K) dst[32 + lane] = make_float2(L.bv, __int_as_float(L.bi));
    }
    if (p.logprob) {
        /* the slice's (max, sum of exp(v - max)) of the raw logits (f64 sums of expf, as the CPU reference) */
        float m = lm;
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(SMP_FULL, m, o));
        if (lane == 0) sv[warp] = m;
        __syncthreads();
        m = sv[0];
        for (int w = 1; w < SMP_NT / 32; w++) m = fmaxf(m, sv[w]);
        double z = 0.0;
        if (isfinite(m))
            for (int i = i0 + tid; i < i1; i += SMP_NT) {
                float v = __ldcg(x + i);
                if (v == v) z += (double)expf(v - m);
            }
        for (int o = 16; o > 0; o >>= 1) z += __shfl_xor_sync(SMP_FULL, z, o);
        if (lane == 0) sd[warp] = z;
        __syncthreads();
        if (tid == 0) {
            double t = 0.0;
            for (int w = 0; w < SMP_NT / 32; w++) t += sd[w];
            lpart[(size_t)row * nb + b] = make_double2((double)m, t);
        }
    }
    __syncthreads();
    if (tid == 0) {
        __threadfence();
        last = atomicAdd(cnt + row, 1u) == (unsigned)(nb - 1);
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    /* the row's K best from the slices' lists: the warps take the slices in turn, then warp 0 joins them */
    sl_init(L);
    for (int s0 = warp; s0 < nb; s0 += SMP_NT / 32) {
        const float2 *src = part + ((size_t)row * nb + s0) * CU_SAMPLE_MAX_K;
        for (int q0 = 0; q0 < K; q0 += 32) {
            float2 c = q0 + lane < K ? __ldcg(src + q0 + lane) : make_float2(-INFINITY, 0.0f);
            sl_feed(L, K, c.x, q0 + lane < K ? __float_as_int(c.y) : SMP_NONE, lane);
        }
    }
    /* the adjusted tokens, with their adjusted values (the warps take them in turn); their marks cleared
     * for the next launch */
    for (int j0 = warp * 32; j0 < p.n_pen; j0 += SMP_NT) {
        cu_sample_pen q = {SMP_NONE, 0, 0.0f, 0.0f};
        float t = -INFINITY;
        if (j0 + lane < p.n_pen) {
            q = pen[p.pen0 + j0 + lane];
            t = smp_adjust(x[q.token], q, p.rep);
            rb[q.token >> 5] = 0u;
        }
        sl_feed(L, K, t, q.token, lane);
    }
    sl_store(L, sh[warp], lane);
    __syncthreads();
    if (warp != 0) return;
    sl_join(L, K, &sh[0][0], lane);
    const float m = __shfl_sync(SMP_FULL, L.av, 0);
    const int best = __shfl_sync(SMP_FULL, L.ai, 0);
    int tok = best;
    if (!greedy && isfinite(m)) {
        /* each candidate's weight, as the CPU's wexp: exp1((l - m) * (1 / T)) */
        if (lane < K) ew[lane] = smp_exp1(__fmul_rn(__fsub_rn(L.av, m), p.inv_t));
        if (32 + lane < K) ew[32 + lane] = smp_exp1(__fmul_rn(__fsub_rn(L.bv, m), p.inv_t));
        sl_store(L, sh[0], lane);
        __syncwarp();
        if (lane == 0) {
            int n = K;
            if (p.top_p > 0.0f && p.top_p < 1.0f) {
                double z = 0.0, acc = 0.0;
                for (int j = 0; j < K; j++) z += ew[j];
                const double target = (double)p.top_p * z;
                for (int j = 0; j < K; j++) {
                    acc += ew[j];
                    if (acc >= target) {
                        n = j + 1;
                        break;
                    }
                }
            }
            int keep[CU_SAMPLE_MAX_K], nk = 0;
            for (int j = 0; j < n; j++)
                if (!(p.min_p > 0.0f) || ew[j] >= p.min_p) keep[nk++] = j;
            double z = 0.0;
            for (int q = 0; q < nk; q++) z += ew[keep[q]];
            double u = p.u * z, acc = 0.0;
            int lastp = keep[0], pick = -1;
            for (int q = 0; q < nk; q++) {
                float w = ew[keep[q]];
                if (w > 0.0f) lastp = keep[q];
                acc += w;
                if (u < acc) {
                    pick = keep[q];
                    break;
                }
            }
            si[0] = __float_as_int(sh[0][pick >= 0 ? pick : lastp].y);
        }
        __syncwarp();
        tok = si[0];
    }
    if (lane == 0) {
        ids[row] = tok;
        cnt[row] = 0u; /* ready for the next launch */
        if (p.logprob) {
            double M = -INFINITY, Z = 0.0;
            for (int s0 = 0; s0 < nb; s0++) M = fmax(M, __ldcg(lpart + (size_t)row * nb + s0).x);
            if (isfinite(M))
                for (int s0 = 0; s0 < nb; s0++) {
                    double2 q = __ldcg(lpart + (size_t)row * nb + s0);
                    if (q.x > -INFINITY) Z += q.y * exp(q.x - M);
                }
            double lse = isfinite(M) ? M + log(Z) : M;
            float v = x[tok];
            lps[row] = v == v ? (float)((double)v - lse) : -INFINITY;
        }
    }
}

static int am_blocks(int V, int n);

extern "C" void cu_sample(cu_ctx *c, const float *d_logits, int V, const cu_sample_row *d_rows,
                          const cu_sample_pen *d_pen, int any_pen, int n, int *d_ids, float *d_lps, void *d_part,
                          unsigned *d_cnt) {
    float2 *part = static_cast<float2 *>(d_part);
    char *b = static_cast<char *>(d_part) + (size_t)CU_SAMPLE_GROUP * CU_ARGMAX_MAXNB * CU_SAMPLE_MAX_K * 8;
    double2 *lpart = reinterpret_cast<double2 *>(b);
    unsigned *bits = reinterpret_cast<unsigned *>(b + (size_t)CU_SAMPLE_GROUP * CU_ARGMAX_MAXNB * 16);
    const int words = (V + 31) / 32;
    for (int r0 = 0; r0 < n; r0 += CU_SAMPLE_GROUP) {
        int g = n - r0 < CU_SAMPLE_GROUP ? n - r0 : CU_SAMPLE_GROUP;
        const float *lg = d_logits + (size_t)r0 * V;
        if (any_pen)
            cu_launch_step(c, PDL_SAMPLE, sample_mark_kernel, dim3((unsigned)g), dim3(SMP_NT), d_rows + r0, d_pen,
                           bits, words);
        cu_launch_step(c, PDL_SAMPLE, sample_kernel, dim3((unsigned)am_blocks(V, g), (unsigned)g), dim3(SMP_NT),
                       lg, V, d_rows + r0, d_pen, bits, words, d_ids + r0, d_lps + r0, part, lpart, d_cnt);
    }
}

/* ---- greedy rows without logprobs: the argmax over many blocks ----
 * The first device sampler gave a row one block, which walked the row's V logits alone: a chain of
 * dependent L2 round trips (~0.09 ms a decode step at V = 248320 on the H200, more than a whole layer). Here
 * a row is cut into nb slices, a block each (every lane's loads of a round in flight together); each block
 * writes its best (logit, id) to part and counts itself in; the row's last block reduces the nb pairs. The maximum with ties
 * to the lowest id and NaN never the max is the same pair in any order of comparison, so the id is
 * sample_kernel's at K = 1. */
#define AM_THREADS 256
#define AM_UNROLL  8

__global__ void __launch_bounds__(AM_THREADS)
    argmax_kernel(const float *logits, int V, int *ids, int2 *part, unsigned *cnt) {
    __shared__ float sv[32];
    __shared__ int si[32];
    __shared__ bool last;
    const int row = blockIdx.y, nb = gridDim.x, b = blockIdx.x, tid = threadIdx.x;
    const float *x = logits + (size_t)row * V;
    const int per = (V + nb - 1) / nb, i0 = b * per, i1 = i0 + per < V ? i0 + per : V;
    griddep_wait(); /* the logits (lm_head, under CINFER_CUDA_PDL=1) */
    griddep_launch();
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int base = i0; base < i1; base += AM_THREADS * AM_UNROLL) {
        float v[AM_UNROLL];
        smp_round<AM_UNROLL, AM_THREADS>(v, x, base, i1, tid);
#pragma unroll
        for (int u = 0; u < AM_UNROLL; u++) {
            int i = base + u * AM_THREADS + tid;
            float t = v[u] != v[u] ? -INFINITY : v[u];
            if (i < i1 && smp_better(t, i, bv, bi)) bv = t, bi = i;
        }
    }
    smp_block_best(bv, bi, sv, si);
    if (tid == 0) {
        part[(size_t)row * nb + b] = make_int2(__float_as_int(bv), bi);
        __threadfence();
        last = atomicAdd(cnt + row, 1u) == (unsigned)(nb - 1);
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    bv = -INFINITY, bi = 0x7fffffff;
    for (int j = tid; j < nb; j += AM_THREADS) {
        int2 p = __ldcg(part + (size_t)row * nb + j);
        float t = __int_as_float(p.x);
        if (smp_better(t, p.y, bv, bi)) bv = t, bi = p.y;
    }
    smp_block_best(bv, bi, sv, si);
    if (tid == 0) {
        ids[row] = bi < V ? bi : 0; /* a row of NaN: sample_kernel's 0 */
        cnt[row] = 0u;              /* ready for the next launch */
    }
}

/* slices a row: enough blocks over the rows to cover the SMs twice, each at least a round of loads */
static int am_blocks(int V, int n) {
    static int sms = 0;
    if (!sms) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms < 1)
            sms = 132;
    }
    int nb = (2 * sms + n - 1) / n, most = (V + AM_THREADS * AM_UNROLL - 1) / (AM_THREADS * AM_UNROLL);
    if (nb > most) nb = most;
    if (nb > CU_ARGMAX_MAXNB) nb = CU_ARGMAX_MAXNB;
    return nb < 1 ? 1 : nb;
}

extern "C" void cu_argmax(cu_ctx *c, const float *d_logits, int V, int n, int *d_ids, void *d_part,
                          unsigned *d_cnt) {
    if (n > 0)
        cu_launch_step(c, PDL_SAMPLE, argmax_kernel, dim3((unsigned)am_blocks(V, n), (unsigned)n),
                       dim3(AM_THREADS), d_logits, V, d_ids, static_cast<int2 *>(d_part), d_cnt);
}

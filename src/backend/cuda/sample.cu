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
 * argmax); session 12's kept a best-first list a warp in registers and inserted values one at a time (~70
 * serial inserts a warp in the slices, as many again in each join: ~0.07 ms a step over greedy's argmax at
 * batch 1, H200). Here the top_k set is found by floors and ranks. The order (logit desc, id asc; NaN as
 * -inf) is total over distinct ids, so a pair's place in a set is the count of the set's pairs that beat it,
 * and every thread counts for its own pairs at once (smp_rank). A row is cut into nb slices as in
 * argmax_kernel, a block each, which reads its slice in chunks of SMP_SLICE logits, every thread holding
 * SMP_PT of a chunk. The K-th best of the threads' own bests and of the K best kept from the chunks before is
 * a floor that K values reach, so the new K best (K = top_k) are among the pairs at or above it, which only
 * the K threads or kept pairs that reached it hold (at most K (SMP_PT + 1) pairs); their ranks give the new K
 * best, best first. (At batch 1 a slice is one chunk; from the second chunk on few values reach the kept
 * K-th.) The row's last block takes the K-th best of the slices' first ceil(K / nb) entries as the row's
 * floor (K real values reach it again), gathers every slice entry and every adjusted token at or above it,
 * and ranks them: the row's K best, the set the CPU's heap keeps. Then, as run_chain: weights exp1((l - m) /
 * T) (smp_exp1, the CPU's exp), top_p's shortest best-first prefix reaching top_p of their sum (f64, summed
 * best first), min_p's filter, and the draw u * z walked best first (the CPU walks its heap's order: the same
 * distribution, but one u can give another of the candidates). A row's logprob: the blocks' (max, sum of exp)
 * of the raw logits joined. Tokens that logit_bias or a penalty adjusts: each slice marks those of the row
 * that fall in it in a bitmap of its own (shared memory) and leaves them out; the last block adds them with
 * their adjusted values (as the CPU's load_adjusted forms them), so the logits themselves are never written.
 */
#define SMP_NT    256
#define SMP_PT    16                /* logits a thread holds */
#define SMP_SLICE (SMP_NT * SMP_PT) /* a chunk's logits */
#define SMP_CAND  1088              /* pairs ranked at once */
#define SMP_FULL  0xffffffffu
#define SMP_NONE  0x7fffffff
static_assert(SMP_CAND >= CU_SAMPLE_MAX_K * (SMP_PT + 1),
              "a chunk's pairs at its floor and the K best before it are ranked at once");
static_assert(SMP_CAND >= CU_SAMPLE_MAXNB + CU_SAMPLE_MAX_K, "the slices' first entries are ranked at once");
/* a slice's bitmap of adjusted tokens at most (dynamic shared memory, with the static ~10 KB under 48 KB) */
#define SMP_MAX_PER 262144
static_assert(CU_SAMPLE_MAXNB <= CU_ARGMAX_MAXNB, "cu_sample's slices are the argmax's");

/* (bv, bi) at or above (av, ai) */
__device__ __forceinline__ bool smp_reach(float bv, int bi, float av, int ai) {
    return !smp_better(av, ai, bv, bi);
}
/* the place of (v, i) among c[0..n) (shared memory, distinct pairs): how many of them beat it */
__device__ __forceinline__ int smp_rank(const float2 *c, int n, float v, int i) {
    int r = 0;
    for (int j = 0; j < n; j++) r += smp_better(c[j].x, __float_as_int(c[j].y), v, i);
    return r;
}
/* *fl = the K-th best of c[0..n) when n >= K, else (-inf, SMP_NONE), which every pair reaches. Between two
 * __syncthreads of the caller's */
__device__ __forceinline__ void smp_floor(const float2 *c, int n, int K, float2 *fl) {
    if (n < K) {
        if (threadIdx.x == 0) *fl = make_float2(-INFINITY, __int_as_float(SMP_NONE));
        return;
    }
    for (int q = threadIdx.x; q < n; q += SMP_NT) {
        const float2 e = c[q];
        if (smp_rank(c, n, e.x, __float_as_int(e.y)) == K - 1) *fl = e;
    }
}
/* c[0..n)'s K best, best first, into dst[0..K) (global or shared), (-inf, SMP_NONE) past n */
__device__ __forceinline__ void smp_rank_out(const float2 *c, int n, int K, float2 *dst) {
    for (int q = threadIdx.x; q < n; q += SMP_NT) {
        const float2 e = c[q];
        const int r = smp_rank(c, n, e.x, __float_as_int(e.y));
        if (r < K) dst[r] = e;
    }
    for (int r = n + (int)threadIdx.x; r < K; r += SMP_NT)
        dst[r] = make_float2(-INFINITY, __int_as_float(SMP_NONE));
}

/* a token's logit after its adjustments, as load_adjusted forms it (NaN as -inf) */
__device__ __forceinline__ float smp_adjust(float v, const cu_sample_pen &q, float rep) {
    if (v != v) v = -INFINITY;
    if (q.flags & CU_PEN_BIAS) v = __fadd_rn(v, q.bias);
    if (q.flags & CU_PEN_REP) v = v > 0.0f ? __fdiv_rn(v, rep) : __fmul_rn(v, rep);
    if (q.flags & CU_PEN_SUB) v = __fsub_rn(v, q.sub);
    return v;
}

/* grid (nb, rows); dynamic shared memory: SMP_MK_BYTES(per), the slice's bitmap of adjusted tokens */
#define SMP_MK_BYTES(per) ((((size_t)(per) + 31) / 32) * 4)
__global__ void __launch_bounds__(SMP_NT)
    sample_kernel(const float *logits, int V, const cu_sample_row *rows, const cu_sample_pen *pen, int *ids,
                  float *lps, float2 *part, double2 *lpart, unsigned *cnt) {
    extern __shared__ unsigned mk[]; /* this slice's adjusted tokens */
    __shared__ float2 cand[SMP_CAND];
    __shared__ float2 top[CU_SAMPLE_MAX_K]; /* the slice's K best so far, then the row's */
    __shared__ float ew[CU_SAMPLE_MAX_K], sv[32];
    __shared__ int si[32], nc, nk, nt;
    __shared__ double sd[SMP_NT / 32];
    __shared__ float2 fl;
    __shared__ bool last;
    const int row = blockIdx.y, nb = gridDim.x, b = blockIdx.x, tid = threadIdx.x, lane = tid & 31,
              warp = tid >> 5;
    const cu_sample_row p = rows[row]; /* uploaded before the step's kernels: no kernel writes it */
    const int greedy = !(p.inv_t > 0.0f) || p.top_k <= 1;
    int K = greedy ? 1 : p.top_k < CU_SAMPLE_MAX_K ? p.top_k : CU_SAMPLE_MAX_K;
    if (K > V) K = V;
    const float *x = logits + (size_t)row * V;
    const int per = (V + nb - 1) / nb, i0 = b * per, i1 = i0 + per < V ? i0 + per : V;
    for (int w = tid; w < (per + 31) / 32; w += SMP_NT) mk[w] = 0u;
    for (int q = tid; q < K; q += SMP_NT) top[q] = make_float2(-INFINITY, __int_as_float(SMP_NONE));
    if (tid == 0) nc = 0, nk = 0, nt = 0;
    __syncthreads();
    for (int j = tid; j < p.n_pen; j += SMP_NT) { /* the pen list is uploaded too: before the wait */
        const int t = pen[p.pen0 + j].token - i0;
        if (t >= 0 && t < i1 - i0) atomicOr(mk + (t >> 5), 1u << (t & 31));
    }
    griddep_wait(); /* the logits (lm_head) */
    griddep_launch();
    float lm = -INFINITY; /* the slice's largest raw logit (NaN left out) */
    /* the slice in chunks of SMP_SLICE, a thread SMP_PT logits of each: top holds the K best of the chunks
     * before (nt of them), so the chunk's floor is the K-th best of its threads' bests and top together */
    for (int c0 = i0; c0 < i1; c0 += SMP_SLICE) {
        float v[SMP_PT];
#pragma unroll
        for (int u = 0; u < SMP_PT; u++) {
            const int i = c0 + u * SMP_NT + tid;
            v[u] = i < i1 ? __ldcg(x + i) : -INFINITY;
        }
        __syncthreads(); /* the marks; the chunk before done with cand, top, nc, nk */
        const float2 f0 = nt == K ? top[K - 1] : make_float2(-INFINITY, __int_as_float(SMP_NONE));
        const int nt0 = nt;
        float bv = -INFINITY; /* the thread's best candidate pair that reaches the floor so far */
        int bi = SMP_NONE;
        unsigned in = 0u; /* bit u: v[u] is a candidate (in the slice, not adjusted, at or above f0) */
#pragma unroll
        for (int u = 0; u < SMP_PT; u++) {
            const int o = c0 - i0 + u * SMP_NT + tid, i = i0 + o;
            const float t = v[u] != v[u] ? -INFINITY : v[u];
            v[u] = t;
            lm = fmaxf(lm, t);
            if (i < i1 && !(mk[o >> 5] >> (o & 31) & 1u) && smp_reach(t, i, f0.x, __float_as_int(f0.y))) {
                in |= 1u << u;
                if (smp_better(t, i, bv, bi)) bv = t, bi = i;
            }
        }
        if (!__syncthreads_or(bi != SMP_NONE)) continue; /* nothing of this chunk reaches the floor */
        if (bi != SMP_NONE) cand[atomicAdd(&nc, 1)] = make_float2(bv, __int_as_float(bi));
        if (tid < nt0) cand[atomicAdd(&nc, 1)] = top[tid];
        __syncthreads();
        smp_floor(cand, nc, K, &fl);
        __syncthreads();
        {
            const float fv = fl.x;
            const int fi = __float_as_int(fl.y);
#pragma unroll
            for (int u = 0; u < SMP_PT; u++) {
                const int i = c0 + u * SMP_NT + tid;
                if ((in >> u & 1u) && smp_reach(v[u], i, fv, fi))
                    cand[atomicAdd(&nk, 1)] = make_float2(v[u], __int_as_float(i));
            }
            if (tid < nt0 && smp_reach(top[tid].x, __float_as_int(top[tid].y), fv, fi))
                cand[atomicAdd(&nk, 1)] = top[tid];
        }
        __syncthreads();
        smp_rank_out(cand, nk, K, top);
        __syncthreads();
        if (tid == 0) nt = nk < K ? nk : K, nc = 0, nk = 0;
    }
    __syncthreads();
    {
        float2 *dst = part + ((size_t)row * nb + b) * CU_SAMPLE_MAX_K;
        for (int q = tid; q < K; q += SMP_NT) dst[q] = top[q];
    }
    if (p.logprob) {
        /* the slice's (max, sum of exp(v - max)) of the raw logits (f64 sums of expf, as the CPU reference)
         */
        float m = lm;
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(SMP_FULL, m, o));
        if (lane == 0) sv[warp] = m;
        __syncthreads();
        m = sv[0];
        for (int w = 1; w < SMP_NT / 32; w++) m = fmaxf(m, sv[w]);
        double z = 0.0;
        if (isfinite(m))
            for (int i = i0 + tid; i < i1; i += SMP_NT) {
                float t = __ldcg(x + i);
                if (t == t) z += (double)expf(t - m);
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
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        last = atomicAdd(cnt + row, 1u) == (unsigned)(nb - 1);
        nc = 0, nk = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    /* the row's floor: the K-th best of the slices' first m entries (at least K of them) */
    const float2 *rp = part + (size_t)row * nb * CU_SAMPLE_MAX_K;
    const int m = (K + nb - 1) / nb;
    for (int q = tid; q < nb * m; q += SMP_NT) {
        const float2 e = __ldcg(rp + (size_t)(q / m) * CU_SAMPLE_MAX_K + q % m);
        if (__float_as_int(e.y) != SMP_NONE) cand[atomicAdd(&nc, 1)] = e;
    }
    __syncthreads();
    smp_floor(cand, nc, K, &fl);
    __syncthreads();
    /* every slice entry and adjusted token at or above it; more than SMP_CAND: the K-th best of those kept is
     * a higher floor (they are distinct and reach the old one, so K - 1 of them beat it), and again */
    for (;;) {
        const float fv = fl.x;
        const int fi = __float_as_int(fl.y);
        for (int q = tid; q < nb * K; q += SMP_NT) {
            const float2 e = __ldcg(rp + (size_t)(q / K) * CU_SAMPLE_MAX_K + q % K);
            const int ei = __float_as_int(e.y);
            if (ei != SMP_NONE && smp_reach(e.x, ei, fv, fi)) {
                const int s = atomicAdd(&nk, 1);
                if (s < SMP_CAND) cand[s] = e;
            }
        }
        for (int j = tid; j < p.n_pen; j += SMP_NT) {
            const cu_sample_pen q = pen[p.pen0 + j];
            const float t = smp_adjust(x[q.token], q, p.rep);
            if (smp_reach(t, q.token, fv, fi)) {
                const int s = atomicAdd(&nk, 1);
                if (s < SMP_CAND) cand[s] = make_float2(t, __int_as_float(q.token));
            }
        }
        __syncthreads();
        if (nk <= SMP_CAND) break;
        smp_floor(cand, SMP_CAND, K, &fl);
        __syncthreads();
        if (tid == 0) nk = 0;
        __syncthreads();
    }
    smp_rank_out(cand, nk, K, top);
    __syncthreads();
    if (warp != 0) return;
    const float mx = top[0].x;
    int tok = __float_as_int(top[0].y);
    if (!greedy && isfinite(mx)) {
        /* each candidate's weight, as the CPU's wexp: exp1((l - m) * (1 / T)) */
        if (lane < K) ew[lane] = smp_exp1(__fmul_rn(__fsub_rn(top[lane].x, mx), p.inv_t));
        if (32 + lane < K) ew[32 + lane] = smp_exp1(__fmul_rn(__fsub_rn(top[32 + lane].x, mx), p.inv_t));
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
            int keep[CU_SAMPLE_MAX_K], nkeep = 0;
            for (int j = 0; j < n; j++)
                if (!(p.min_p > 0.0f) || ew[j] >= p.min_p) keep[nkeep++] = j;
            double z = 0.0;
            for (int q = 0; q < nkeep; q++) z += ew[keep[q]];
            double u = p.u * z, acc = 0.0;
            int lastp = keep[0], pick = -1;
            for (int q = 0; q < nkeep; q++) {
                float w = ew[keep[q]];
                if (w > 0.0f) lastp = keep[q];
                acc += w;
                if (u < acc) {
                    pick = keep[q];
                    break;
                }
            }
            si[0] = __float_as_int(top[pick >= 0 ? pick : lastp].y);
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

/* A one-block kernel between the step's graph and the sampler (argmax or sample_kernel), so that the sampler
 * is launched by PDL (the first launch after a graph never is: cu_ctx.pdl_break). Measured, not explained: at
 * batch 64 the next step's graph then runs ~0.25 ms faster (4B, H200 session 13 calls 8-9: greedy 6,451 /
 * 6,500 -> 6,598 / 6,628 tok/s, chat 6,370 / 6,373 -> 6,507 / 6,521; the sampler's own time unchanged, SM
 * clocks and power the same), while at batch 1 the extra launch costs ~0.01-0.03 ms a step. So from
 * SMP_GATE_ROWS rows on; CINFER_CUDA_SAMPLE_GATE=0 / 1 turns it off / on for every batch */
#define SMP_GATE_ROWS 32
__global__ void sample_gate_kernel(void) {
    griddep_wait();
    griddep_launch();
}
static void sample_gate(cu_ctx *c, int rows) {
    static int mode = -2; /* -1 by rows, 0 off, 1 on */
    if (mode == -2) {
        const char *e = getenv("CINFER_CUDA_SAMPLE_GATE");
        mode = e && !strcmp(e, "0") ? 0 : e && !strcmp(e, "1") ? 1 : -1;
    }
    if (mode == 1 || (mode < 0 && rows >= SMP_GATE_ROWS))
        cu_launch_step(c, PDL_SAMPLE, sample_gate_kernel, dim3(1), dim3(32));
}

extern "C" int cu_sample(cu_ctx *c, const float *d_logits, int V, const cu_sample_row *d_rows,
                         const cu_sample_pen *d_pen, int n, int *d_ids, float *d_lps, void *d_part,
                         unsigned *d_cnt) {
    if (V < 1 || V > CU_SAMPLE_MAX_V) return -1;
    float2 *part = static_cast<float2 *>(d_part);
    double2 *lpart = reinterpret_cast<double2 *>(
        static_cast<char *>(d_part) + (size_t)CU_SAMPLE_GROUP * CU_SAMPLE_MAXNB * CU_SAMPLE_MAX_K * 8);
    for (int r0 = 0; r0 < n; r0 += CU_SAMPLE_GROUP) {
        int g = n - r0 < CU_SAMPLE_GROUP ? n - r0 : CU_SAMPLE_GROUP;
        /* the argmax's slices, but none longer than SMP_MAX_PER */
        int nb = am_blocks(V, g), need = (V + SMP_MAX_PER - 1) / SMP_MAX_PER;
        if (nb < need) nb = need;
        const int per = (V + nb - 1) / nb;
        if (r0 == 0) sample_gate(c, n);
        cu_launch_pdl_smem(c, cu_pdl_on() >= 2 && (cu_pdl_mask() & PDL_SAMPLE), sample_kernel,
                           dim3((unsigned)nb, (unsigned)g), dim3(SMP_NT), SMP_MK_BYTES(per),
                           d_logits + (size_t)r0 * V, V, d_rows + r0, d_pen, d_ids + r0, d_lps + r0, part,
                           lpart, d_cnt);
    }
    return 0;
}

/* ---- greedy rows without logprobs: the argmax over many blocks ----
 * The first device sampler gave a row one block, which walked the row's V logits alone: a chain of
 * dependent L2 round trips (~0.09 ms a decode step at V = 248320 on the H200, more than a whole layer). Here
 * a row is cut into nb slices, a block each (every lane's loads of a round in flight together); each block
 * writes its best (logit, id) to part and counts itself in; the row's last block reduces the nb pairs. The
 * maximum with ties to the lowest id and NaN never the max is the same pair in any order of comparison, so
 * the id is sample_kernel's at K = 1. */
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
    if (n > 0) sample_gate(c, n);
    if (n > 0)
        cu_launch_step(c, PDL_SAMPLE, argmax_kernel, dim3((unsigned)am_blocks(V, n), (unsigned)n),
                       dim3(AM_THREADS), d_logits, V, d_ids, static_cast<int2 *>(d_part), d_cnt);
}

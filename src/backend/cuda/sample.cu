/* sample.cu — token choice on the device, so that a decode step returns ids (and logprobs when asked)
 * instead of whole logits rows: greedy (argmax, NaN never the max, ties to the lowest id, as the CPU
 * sampler) and top-k (k <= CU_SAMPLE_MAX_K) at a temperature, with the uniform draw made by the request's
 * generator on the host. The weights use the CPU sampler's exp (Cephes expf, the same float operations,
 * no contraction) and its f64 sums; the candidates are walked best first (logit desc, id asc), where the CPU
 * walks its heap's order — same distribution, but one draw can pick another of the k tokens. */
#include "backend/cuda/common.cuh"

#define SMP_THREADS 1024

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

__device__ double smp_block_sum_d(double v, double *sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < nw ? sh[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) sh[0] = v;
    }
    __syncthreads();
    return sh[0];
}

/* a block per row */
__global__ void __launch_bounds__(SMP_THREADS)
    sample_kernel(const float *logits, int V, const cu_sample_row *rows, int *ids, float *lps) {
    __shared__ float sv[32], cl[CU_SAMPLE_MAX_K];
    __shared__ int si[32], cid[CU_SAMPLE_MAX_K];
    __shared__ double sd[32];
    int row = blockIdx.x;
    const float *x = logits + (size_t)row * V;
    cu_sample_row p = rows[row]; /* uploaded before the step's kernels: no kernel of it writes rows */
    griddep_wait();              /* the logits (lm_head, under CINFER_CUDA_PDL=1) */
    griddep_launch();
    /* the maximum and its lowest id (NaN as -inf, so that it is never the max) */
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float v = x[i];
        if (v != v) v = -INFINITY;
        if (smp_better(v, i, bv, bi)) bv = v, bi = i;
    }
    smp_block_best(bv, bi, sv, si);
    float m = bv;
    int tok = bi < V ? bi : 0;
    int k = p.top_k < V ? p.top_k : V;
    if (p.inv_t > 0.0f && k > 1 && isfinite(m)) {
        /* the k best, best first: round j takes the best pair strictly below round j - 1's */
        float pl = m;
        int pi = bi;
        if (threadIdx.x == 0) cl[0] = m, cid[0] = bi;
        for (int j = 1; j < k; j++) {
            float v0 = -INFINITY;
            int i0 = 0x7fffffff;
            for (int i = threadIdx.x; i < V; i += blockDim.x) {
                float v = x[i];
                if (v != v) v = -INFINITY;
                if (smp_better(pl, pi, v, i) && smp_better(v, i, v0, i0)) v0 = v, i0 = i;
            }
            smp_block_best(v0, i0, sv, si);
            pl = v0, pi = i0;
            if (threadIdx.x == 0) cl[j] = v0, cid[j] = i0;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            double z = 0.0;
            for (int j = 0; j < k; j++) z += smp_exp1(__fmul_rn(__fsub_rn(cl[j], m), p.inv_t));
            double u = p.u * z, acc = 0.0;
            int last = 0, pick = -1;
            for (int j = 0; j < k; j++) {
                float w = smp_exp1(__fmul_rn(__fsub_rn(cl[j], m), p.inv_t));
                if (w > 0.0f) last = j;
                acc += w;
                if (u < acc) {
                    pick = j;
                    break;
                }
            }
            si[0] = cid[pick >= 0 ? pick : last];
        }
        __syncthreads();
        tok = si[0];
    }
    if (p.logprob) {
        /* raw log_softmax of the chosen token (before temperature), as the CPU sampler reports it */
        double z = 0.0;
        if (isfinite(m))
            for (int i = threadIdx.x; i < V; i += blockDim.x) {
                float v = x[i];
                if (v == v) z += (double)expf(v - m);
            }
        z = smp_block_sum_d(z, sd);
        if (threadIdx.x == 0) {
            double lse = isfinite(m) ? (double)m + log(z) : (double)m;
            float v = x[tok];
            lps[row] = v == v ? (float)((double)v - lse) : -INFINITY;
        }
    }
    if (threadIdx.x == 0) ids[row] = tok;
}

extern "C" void cu_sample(cu_ctx *c, const float *d_logits, int V, const cu_sample_row *d_rows, int n,
                          int *d_ids, float *d_lps) {
    if (n > 0)
        cu_launch_step(c, PDL_SAMPLE, sample_kernel, dim3((unsigned)n), dim3(SMP_THREADS), d_logits, V,
                       d_rows, d_ids, d_lps);
}

/* ---- greedy rows without logprobs: the argmax over many blocks ----
 * sample_kernel gives a row one block, which walks the row's V logits alone: a chain of dependent L2 round
 * trips (~0.09 ms a decode step at V = 248320 on the H200, more than a whole layer). Here a row is cut into
 * nb slices, a block each (every lane's loads of a round in flight together); each block writes its best
 * (logit, id) to part and counts itself in; the row's last block reduces the nb pairs. The maximum with ties
 * to the lowest id and NaN never the max is the same pair in any order of comparison, so the id is
 * sample_kernel's. */
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
#pragma unroll
        for (int u = 0; u < AM_UNROLL; u++) {
            int i = base + u * AM_THREADS + tid;
            v[u] = i < i1 ? __ldcg(x + i) : -INFINITY;
        }
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

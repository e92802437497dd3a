/* moe.cu — the MoE router (softmax over experts, top-k, optional renormalisation) and the row gathers and
 * weighted combine around the expert GEMMs (forward_cuda.c runs the experts themselves). */
#include "backend/cuda/common.cuh"

#define ROUTE_MAX_E 1024
#define ROUTE_MAX_K 32

/* the warp's largest (bv, bi) into every lane, ties to the lower index (both routers' selection step) */
__device__ __forceinline__ void warp_argmax(float &bv, int &bi) {
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) {
            bv = ov;
            bi = oi;
        }
    }
}

/* a warp per row; ties go to the lower expert index, as the CPU's stable descending selection */
__global__ void route_kernel(const float *logits, int *idx, float *w, int E, int k, int norm) {
    __shared__ float p[ROUTE_MAX_E];
    __shared__ int chosen[ROUTE_MAX_K];
    int r = blockIdx.x, lane = threadIdx.x;
    const float *lg = logits + (size_t)r * E;
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, lg[e]);
    mx = warp_max(mx);
    float s = 0.0f;
    for (int e = lane; e < E; e += 32) {
        float v = expf(lg[e] - mx);
        p[e] = v;
        s += v;
    }
    s = warp_sum(s);
    __syncwarp();
    for (int e = lane; e < E; e += 32) p[e] /= s;
    __syncwarp();
    for (int j = 0; j < k; j++) {
        float bv = -1.0f;
        int bi = E;
        for (int e = lane; e < E; e += 32) {
            int taken = 0;
            for (int q = 0; q < j; q++) taken |= chosen[q] == e;
            if (!taken && (p[e] > bv || (p[e] == bv && e < bi))) {
                bv = p[e];
                bi = e;
            }
        }
        warp_argmax(bv, bi);
        if (lane == 0) chosen[j] = bi;
        __syncwarp();
    }
    if (lane == 0) {
        float ws = 0.0f;
        for (int j = 0; j < k; j++) ws += p[chosen[j]];
        for (int j = 0; j < k; j++) {
            idx[(size_t)r * k + j] = chosen[j];
            w[(size_t)r * k + j] = norm ? p[chosen[j]] / ws : p[chosen[j]];
        }
    }
}

extern "C" void cu_moe_route(cu_ctx *c, const float *logits, int *idx, float *w, int T, int E, int k,
                             int norm) {
    if (T > 0) route_kernel<<<T, 32, 0, c->stream>>>(logits, idx, w, E, k, norm);
}

/* route_kernel's arithmetic with each lane's probabilities in registers (NPL per lane: expert lane + 32 i)
 * and a warp per row, four rows a block: the same max, sum (same order), division and selection (greater
 * probability, then lower index; a chosen expert drops out as -inf, so NaN is never chosen as before) */
template <int NPL>
__global__ void __launch_bounds__(128)
    route2_kernel(const float *logits, int *idx, float *w, int T, int E, int k, int norm, int sorted) {
    int r = blockIdx.x * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= T) return;
    const float *lg = logits + (size_t)r * E;
    float p[NPL];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        int e = lane + 32 * i;
        p[i] = e < E ? lg[e] : -INFINITY;
        if (e < E) mx = fmaxf(mx, p[i]);
    }
    mx = warp_max(mx);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < NPL; i++)
        if (lane + 32 * i < E) {
            float v = expf(p[i] - mx);
            p[i] = v;
            s += v;
        }
    s = warp_sum(s);
#pragma unroll
    for (int i = 0; i < NPL; i++)
        if (lane + 32 * i < E) p[i] /= s;
    int ci = 0; /* lane j < k: choice j's expert and probability */
    float cv = 0.0f;
    for (int j = 0; j < k; j++) {
        float bv = -1.0f;
        int bi = E;
#pragma unroll
        for (int i = 0; i < NPL; i++) /* ascending e: strictly greater keeps the lower index */
            if (p[i] > bv) bv = p[i], bi = lane + 32 * i;
        warp_argmax(bv, bi);
        if (lane == j) ci = bi, cv = bv;
        if (bi < E && (bi & 31) == lane) {
#pragma unroll
            for (int i = 0; i < NPL; i++)
                if (lane + 32 * i == bi) p[i] = -INFINITY;
        }
    }
    /* the renormalisation's sum in selection order, as route_kernel */
    float ws = 0.0f;
    for (int j = 0; j < k; j++) ws += __shfl_sync(0xffffffffu, cv, j);
    /* output slot of choice lane: its rank among the choices by expert index (distinct) when sorted */
    int slot = lane;
    if (sorted) {
        slot = 0;
        for (int j = 0; j < k; j++) slot += __shfl_sync(0xffffffffu, ci, j) < ci;
    }
    if (lane < k) {
        idx[(size_t)r * k + slot] = ci;
        w[(size_t)r * k + slot] = norm ? cv / ws : cv;
    }
}

extern "C" void cu_moe_route2(cu_ctx *c, const float *logits, int *idx, float *w, int T, int E, int k,
                              int norm, int sorted) {
    if (T <= 0) return;
    if (E <= 256)
        route2_kernel<8><<<cdiv((size_t)T, 4), 128, 0, c->stream>>>(logits, idx, w, T, E, k, norm, sorted);
    else
        route2_kernel<32><<<cdiv((size_t)T, 4), 128, 0, c->stream>>>(logits, idx, w, T, E, k, norm, sorted);
}

__global__ void gather_rows_kernel(float *xg, const float *x, const int *src, int H) {
    int p = blockIdx.x;
    const float *s = x + (size_t)src[p] * H;
    for (int i = threadIdx.x; i < H; i += blockDim.x) xg[(size_t)p * H + i] = s[i];
}

extern "C" void cu_gather_rows(cu_ctx *c, float *xg, const float *x, const int *src, int n, int H) {
    if (n > 0) gather_rows_kernel<<<n, 256, 0, c->stream>>>(xg, x, src, H);
}

__global__ void combine_kernel(float *out, const float *y, const int *pos, const float *w, int k, int H,
                               const float *sh, const float *shg) {
    int r = blockIdx.x;
    float g = sh ? dev_sigmoid(shg[r]) : 0.0f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < k; j++) acc += y[(size_t)pos[(size_t)r * k + j] * H + i] * w[(size_t)r * k + j];
        if (sh) acc += g * sh[(size_t)r * H + i];
        out[(size_t)r * H + i] = acc;
    }
}

extern "C" void cu_moe_combine(cu_ctx *c, float *out, const float *y, const int *pos, const float *w, int T,
                               int k, int H, const float *sh, const float *shg) {
    if (T > 0) combine_kernel<<<T, 256, 0, c->stream>>>(out, y, pos, w, k, H, sh, shg);
}

/* per row: the k choices in ascending expert order (the CPU accumulates experts in index order) */
__global__ void sort_slots_kernel(int *idx, float *w, int T, int k) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= T) return;
    int *ir = idx + (size_t)r * k;
    float *wr = w + (size_t)r * k;
    for (int a = 1; a < k; a++) {
        int ia = ir[a];
        float wa = wr[a];
        int b = a - 1;
        while (b >= 0 && ir[b] > ia) {
            ir[b + 1] = ir[b];
            wr[b + 1] = wr[b];
            b--;
        }
        ir[b + 1] = ia;
        wr[b + 1] = wa;
    }
}

extern "C" void cu_moe_sort_slots(cu_ctx *c, int *idx, float *w, int T, int k) {
    if (T > 0) sort_slots_kernel<<<cdiv((size_t)T, 64), 64, 0, c->stream>>>(idx, w, T, k);
}

/* grp = off [E + 1] | perm [S]: the slots of expert e are perm[off[e] .. off[e + 1]) (their order within an
 * expert is whatever the atomics gave: the grouped GEMV's values do not depend on it). One block. */
__global__ void __launch_bounds__(1024) moe_group_kernel(const int *idx, int S, int E, int *grp) {
    __shared__ int cnt[1025], fill[1024];
    for (int e = threadIdx.x; e <= E; e += blockDim.x) cnt[e] = 0;
    for (int e = threadIdx.x; e < E; e += blockDim.x) fill[e] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < S; p += blockDim.x) {
        int e = idx[p];
        atomicAdd(&cnt[e >= 0 && e < E ? e : 0], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) { /* exclusive prefix, E <= 1024 */
        int acc = 0;
        for (int e = 0; e < E; e++) {
            int v = cnt[e];
            cnt[e] = acc;
            acc += v;
        }
        cnt[E] = acc;
    }
    __syncthreads();
    for (int e = threadIdx.x; e <= E; e += blockDim.x) grp[e] = cnt[e];
    for (int p = threadIdx.x; p < S; p += blockDim.x) {
        int e = idx[p];
        e = e >= 0 && e < E ? e : 0;
        grp[E + 1 + cnt[e] + atomicAdd(&fill[e], 1)] = p;
    }
}

extern "C" void cu_moe_group(cu_ctx *c, const int *d_idx, int S, int E, int *d_grp) {
    if (S > 0 && E > 0 && E <= 1024) moe_group_kernel<<<1, 1024, 0, c->stream>>>(d_idx, S, E, d_grp);
}

/* cu_moe_group_tiles: cu_moe_group's grouping over many blocks (a histogram per block, one block's prefix, a
 * scatter), with cu_moe_tiles' tile offsets from the same prefix; scr [E] ints of scratch */
__global__ void __launch_bounds__(256) group_count_kernel(const int *idx, int S, int E, int *cnt) {
    __shared__ int h[1024];
    for (int e = threadIdx.x; e < E; e += blockDim.x) h[e] = 0;
    __syncthreads();
    int p0 = blockIdx.x * 1024;
    for (int p = p0 + threadIdx.x; p < p0 + 1024 && p < S; p += blockDim.x) {
        int e = idx[p];
        atomicAdd(&h[e >= 0 && e < E ? e : 0], 1);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        if (h[e]) atomicAdd(&cnt[e], h[e]);
}

__global__ void __launch_bounds__(1024)
    group_prefix_kernel(int E, int tile_rows, int *cnt, int *grp, int *tile_off) {
    __shared__ int c[1024], t[1024];
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        c[e] = cnt[e], t[e] = (cnt[e] + tile_rows - 1) / tile_rows;
    __syncthreads();
    if (threadIdx.x == 0) { /* exclusive prefixes, E <= 1024 */
        int acc = 0, tacc = 0;
        for (int e = 0; e < E; e++) {
            int v = c[e], tv = t[e];
            c[e] = acc, t[e] = tacc;
            acc += v, tacc += tv;
        }
        grp[E] = acc;
        tile_off[E] = tacc;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) grp[e] = c[e], tile_off[e] = t[e], cnt[e] = c[e];
}

__global__ void group_scatter_kernel(const int *idx, int S, int E, int *cursor, int *grp) {
    int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= S) return;
    int e = idx[p];
    e = e >= 0 && e < E ? e : 0;
    grp[E + 1 + atomicAdd(&cursor[e], 1)] = p;
}

extern "C" void cu_moe_group_tiles(cu_ctx *c, const int *d_idx, int S, int E, int *d_grp, int *d_tile_off,
                                   int tile_rows, int *d_scr) {
    if (S <= 0 || E <= 0 || E > 1024) return;
    cu_memset_async(c, d_scr, (size_t)E * sizeof(int)); /* marks the PDL break */
    group_count_kernel<<<cdiv((size_t)S, 1024), 256, 0, c->stream>>>(d_idx, S, E, d_scr);
    group_prefix_kernel<<<1, 1024, 0, c->stream>>>(E, tile_rows, d_scr, d_grp, d_tile_off);
    group_scatter_kernel<<<cdiv((size_t)S, 256), 256, 0, c->stream>>>(d_idx, S, E, d_scr, d_grp);
}

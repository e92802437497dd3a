/* attention.cu — gated full attention over the paged KV pool: q/k RMSNorm + partial RoPE with K and V
 * written into the sequence's blocks, then causal softmax attention split over position spans
 * (flash-decoding: each block runs an online softmax over its span, a combine pass merges the spans), and
 * the sigmoid output gate. */
#include "backend/cuda/common.cuh"

#include <type_traits>

#define KVB 16 /* = KV_BLOCK of runtime/kvcache.h */

__device__ __forceinline__ float *kv_row(float *pool, const cu_attn_args &a, const int *blocks, int pos) {
    size_t b = (size_t)blocks[pos / KVB];
    return pool + (((size_t)a.full * a.n_blocks + b) * KVB + (size_t)(pos % KVB)) * (size_t)(a.Hkv * a.hd);
}

#define NR_REG 8 /* norm_rope_warp: head dims up to 256 through registers */

/* rmsnorm(x) * w of one head (hd <= 32 NR_REG) by one warp into y: the head's values and norm weights
 * requested all at once into registers (a loop whose loads each wait for the store before them, y may alias
 * x, takes one L2 round trip per 32 values: H200 session 11, 2.66 us from the decode kernel's PDL wait to its
 * normed q at hd 256), then the sum of squares in order of the dims, lane by lane */
__device__ __forceinline__ void norm_regs(const cu_attn_args &a, const float *x, const float *w, float *y,
                                          int lane) {
    const int hd = a.hd;
    float v[NR_REG], wv[NR_REG], ss = 0.0f;
#pragma unroll
    for (int u = 0; u < NR_REG; u++) {
        int i = lane + 32 * u;
        v[u] = i < hd ? x[i] : 0.0f;
        wv[u] = i < hd ? w[i] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < NR_REG; u++)
        if (lane + 32 * u < hd) ss = fmaf(v[u], v[u], ss);
    ss = warp_sum(ss);
    float inv = 1.0f / sqrtf(ss / (float)hd + a.eps);
#pragma unroll
    for (int u = 0; u < NR_REG; u++)
        if (lane + 32 * u < hd) y[lane + 32 * u] = (v[u] * inv) * wv[u];
}

/* rmsnorm(x) * w, then the partial RoPE at position pos (row r's streams when multimodal), of one head by
 * one warp into y (hd floats). attn_prep_kernel and the fused decode kernel both run it: the same bits. */
__device__ __forceinline__ void norm_rope_warp(const cu_attn_args &a, const float *x, const float *w,
                                               float *y, int r, int pos, int lane) {
    int hd = a.hd, half = a.rope_dim / 2;
    if (hd <= NR_REG * 32) {
        norm_regs(a, x, w, y, lane);
    } else {
        float ss = 0.0f;
        for (int i = lane; i < hd; i += 32) {
            float v = x[i];
            y[i] = v;
            ss = fmaf(v, v, ss);
        }
        ss = warp_sum(ss);
        float inv = 1.0f / sqrtf(ss / (float)hd + a.eps);
        for (int i = lane; i < hd; i += 32) y[i] = (y[i] * inv) * w[i];
    }
    __syncwarp();
    for (int i = lane; i < half; i += 32) {
        int rp = pos;
        if (a.rope3) {
            int st = (i % 3 == 1 && i < 3 * a.mrope_h) ? 1 : (i % 3 == 2 && i < 3 * a.mrope_w) ? 2 : 0;
            rp = a.rope3[3 * r + st];
        }
        float ang = (float)rp * a.inv_freq[i];
        float cs = cosf(ang), sn = sinf(ang), p = y[i], q = y[i + half];
        y[i] = p * cs - q * sn;
        y[i + half] = q * cs + p * sn;
    }
    __syncwarp();
}

/* RoPE's cos / sin of pairs lane + 32 u for norm_rope_pre, from the position or the multimodal streams (both
 * uploaded before the step): computed before the fused decode kernel's PDL wait (cu_set_attn_dec_pre, the
 * default), so that after the wait no inv_freq load (an L2 round trip) nor cosf / sinf sits between the q / k
 * loads and the scores. H200 session 11 call 8, 4B b1 after 512 positions, alternating: without 404.3 / 404.6
 * / 406.1 tok/s, with 404.6 / 404.5 / 408.0; attention core ended (CINFER_CUDA_G3_STAMPS) +18.55 -> +17.48 us
 * from in_proj's end; the merging block from its PDL wait to its normed q 2.35 -> 1.27 us */
struct nr_pre {
    float c[NR_REG / 2], s[NR_REG / 2];
};
__device__ __forceinline__ void nr_pre_load(const cu_attn_args &a, int r, int pos, int lane, nr_pre &p) {
    const int half = a.rope_dim / 2;
#pragma unroll
    for (int u = 0; u < NR_REG / 2; u++) {
        int i = lane + 32 * u, rp = pos;
        p.c[u] = p.s[u] = 0.0f;
        if (i >= half) continue;
        if (a.rope3) {
            int st = (i % 3 == 1 && i < 3 * a.mrope_h) ? 1 : (i % 3 == 2 && i < 3 * a.mrope_w) ? 2 : 0;
            rp = a.rope3[3 * r + st];
        }
        float ang = (float)rp * a.inv_freq[i];
        p.c[u] = cosf(ang), p.s[u] = sinf(ang);
    }
}
/* norm_rope_warp (hd <= 32 NR_REG) with nr_pre's cos / sin: the same arithmetic in the same order, so the
 * same bits, and after the wait no inv_freq load (an L2 round trip) nor cosf / sinf */
__device__ __forceinline__ void norm_rope_pre(const cu_attn_args &a, const float *x, const float *w,
                                              const nr_pre &p, float *y, int lane) {
    const int half = a.rope_dim / 2;
    norm_regs(a, x, w, y, lane);
    __syncwarp();
#pragma unroll
    for (int u = 0; u < NR_REG / 2; u++) {
        int i = lane + 32 * u;
        if (i >= half) continue;
        float cs = p.c[u], sn = p.s[u], pv = y[i], q = y[i + half];
        y[i] = pv * cs - q * sn;
        y[i + half] = q * cs + pv * sn;
    }
    __syncwarp();
}

/* per row, a warp per head: q heads in place, k heads into the pool, v copied */
__global__ void attn_prep_kernel(cu_attn_args a) {
    __shared__ float buf[4][CU_ATTN_MAX_HD];
    int r = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, hd = a.hd;
    int pos = a.meta.row_pos[r];
    const int *blocks = a.meta.blocks + a.meta.e_boff[a.meta.row_entry[r]];
    float *row = a.qkv + (size_t)r * a.ld, *y = buf[warp];
    for (int h = warp; h < a.Hq + a.Hkv; h += 4) {
        int isq = h < a.Hq;
        const float *x =
            isq ? row + (size_t)h * 2 * hd : row + (size_t)a.Hq * 2 * hd + (size_t)(h - a.Hq) * hd;
        norm_rope_warp(a, x, isq ? a.q_norm : a.k_norm, y, r, pos, lane);
        float *dst =
            isq ? row + (size_t)h * 2 * hd : kv_row(a.kpool, a, blocks, pos) + (size_t)(h - a.Hq) * hd;
        for (int i = lane; i < hd; i += 32) dst[i] = y[i];
        __syncwarp();
    }
    float *vdst = kv_row(a.vpool, a, blocks, pos);
    const float *vsrc = row + (size_t)a.Hq * 2 * hd + (size_t)a.Hkv * hd;
    for (int i = threadIdx.x; i < a.Hkv * hd; i += blockDim.x) vdst[i] = vsrc[i];
}

/* the merge of a (row, head)'s spans: thread d owns output dims d, d + blockDim.x, ... (CG: the partials read
 * through L2, for partials other blocks of the same launch wrote) */
template <bool CG>
__device__ __forceinline__ void combine_rowhead(const cu_attn_args &a, int h, int r, const float *p0,
                                                int ns) {
    int hd = a.hd;
#define PART(i) (CG ? __ldcg(p0 + (i)) : p0[i])
    float M = -INFINITY;
    for (int s = 0; s < ns; s++) M = fmaxf(M, PART((size_t)s * (hd + 2)));
    float L = 0.0f;
    for (int s = 0; s < ns; s++)
        L = fmaf(PART((size_t)s * (hd + 2) + 1), expf(PART((size_t)s * (hd + 2)) - M), L);
    const float *gate = a.qkv + (size_t)r * a.ld + (size_t)h * 2 * hd + hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < ns; s++)
            o = fmaf(PART((size_t)s * (hd + 2) + 2 + d), expf(PART((size_t)s * (hd + 2)) - M), o);
        a.o[(size_t)r * a.Hq * hd + (size_t)h * hd + d] = (o / L) * dev_sigmoid(gate[d]);
    }
#undef PART
}

/* a block per (head, row, span); 4 warps stride over the span's positions with an online softmax each.
 * FUSED (a decode-only batch, cu_attn_args.dec_cnt): attn_prep_kernel and attn_combine_kernel folded in. Each
 * block norms and ropes its own q head (norm_rope_warp, redundant over the splits: one head vector); the
 * block of the split holding the row's own position does the same for its kv head's k and reads k and v of
 * that position from there and from the row (the values prep would have stored), and the first q head of
 * each kv head among them writes them into the pool (no other block of a decode-only launch reads a row's
 * own position). With several splits, the last of a (row, head)'s blocks to finish merges the partials
 * (combine_rowhead, a counter per (row, head) in dec_cnt set back to 0 by that block). The same bits as the
 * three kernels. */
/* one position's k and v (NPL values a lane each) into registers */
template <int NPL>
__device__ __forceinline__ void kv_load(float (&k)[NPL], float (&v)[NPL], const float *kp, const float *vp,
                                        int lane) {
#pragma unroll
    for (int i = 0; i < NPL; i++) k[i] = kp[lane + 32 * i], v[i] = vp[lane + 32 * i];
}

/* PF (CINFER_CUDA_ATTN_PF=1): each warp's next PF positions' k and v (one: deeper measured no faster, H200
 * session 6) are requested before the current one's dot product and update (one memory round trip a position
 * instead of ~three: the block table, then k, then v after the softmax), and under PDL a warp's first PF
 * positions, rows of earlier steps, before waiting for in_proj. The same values in the same order: the same
 * bits. */
/* a row's positions per split: the launch's span, or with the dec kernel on its own (cu_attn_row_span; an
 * MTP head resumed mid-sequence, meta.e_astart, keeps its one split of the launch's span) */
__device__ __forceinline__ int attn_span(const cu_attn_args &a, int pos) {
    if (a.dec_nsmax <= 0 || a.meta.e_astart) return a.span;
    int s = 64;
    while ((pos + s) / s > CU_ATTN_ROW_NS) s *= 2;
    return s;
}

template <int NPL, bool FUSED, int PF = 0>
__global__ void __launch_bounds__(128) attn_kernel(cu_attn_args a) {
    __shared__ float sm_m[4], sm_l[4], sm_acc[4][NPL * 32];
    __shared__ float qk_s[FUSED ? 2 : 1][FUSED ? NPL * 32 : 1];
    __shared__ int last;
    int h = blockIdx.x, r = blockIdx.y, sp = blockIdx.z, warp = threadIdx.x >> 5, lane = threadIdx.x & 31,
        hd = a.hd;
    const int pos = a.meta.row_pos[r], span = attn_span(a, pos), start = sp * span;
    /* a row of attn_dec_kernel's class (cu_attn_args.dec_p): its blocks only wait (PDL) and return */
    const bool other = a.dec_nsmax > 0 && pos >= a.dec_p;
    /* PF: the metadata (uploaded before the step) and this warp's first position of an earlier step */
    constexpr int D = PF > 0 ? PF : 1; /* positions a warp holds ahead */
    float kc[D][NPL], vc[D][NPL];
    int u0 = 0;
    if (PF && start <= pos && !other) {
        const int *bl = a.meta.blocks + a.meta.e_boff[a.meta.row_entry[r]];
        int fr = a.meta.e_astart ? a.meta.e_astart[a.meta.row_entry[r]] : 0;
        int en = pos + 1 < start + span ? pos + 1 : start + span, kh = h / (a.Hq / a.Hkv);
        u0 = (fr < start ? start : fr) + warp;
#pragma unroll
        for (int d = 0; d < D; d++) {
            int u = u0 + 4 * d;
            if (u < en && !(FUSED && u == pos))
                kv_load<NPL>(kc[d], vc[d], kv_row(a.kpool, a, bl, u) + (size_t)kh * hd,
                             kv_row(a.vpool, a, bl, u) + (size_t)kh * hd, lane);
        }
    }
    /* FUSED under CINFER_CUDA_PDL=1: the q/k/v row comes from the in_proj GEMV before this kernel, and every
     * block waits for it, even one with no positions (common.cuh) */
    if (FUSED) {
        griddep_wait();
        griddep_launch();
    }
    if (start > pos || other) return;
    int end = pos + 1 < start + span ? pos + 1 : start + span;
    int kvh = h / (a.Hq / a.Hkv);
    const int *blocks = a.meta.blocks + a.meta.e_boff[a.meta.row_entry[r]];
    const float *row = a.qkv + (size_t)r * a.ld, *qrow = row + (size_t)h * 2 * hd, *q = qrow;
    /* FUSED: the row's own k (normed, roped: qk_s[1]) and v, for the position pos */
    const float *kcur = NULL, *vcur = row + (size_t)a.Hq * 2 * hd + (size_t)(a.Hkv + kvh) * hd;
    if (FUSED) {
        int own = end == pos + 1; /* this split holds the row's own position */
        if (warp == 0) norm_rope_warp(a, qrow, a.q_norm, qk_s[0], r, pos, lane);
        if (warp == 1 && own)
            norm_rope_warp(a, row + (size_t)a.Hq * 2 * hd + (size_t)kvh * hd, a.k_norm, qk_s[1], r, pos,
                           lane);
        __syncthreads();
        if (own && h % (a.Hq / a.Hkv) == 0) {
            float *kd = kv_row(a.kpool, a, blocks, pos) + (size_t)kvh * hd;
            float *vd = kv_row(a.vpool, a, blocks, pos) + (size_t)kvh * hd;
            for (int i = threadIdx.x; i < hd; i += blockDim.x) kd[i] = qk_s[1][i], vd[i] = vcur[i];
        }
        q = qk_s[0], kcur = qk_s[1];
    }
    float qv[NPL], acc[NPL];
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        qv[i] = q[lane + 32 * i];
        acc[i] = 0.0f;
    }
    float scale = (float)(1.0 / sqrt((double)hd)), m = -INFINITY, l = 0.0f;
    /* an MTP head resumed mid-sequence attends only to its own rows (meta.e_astart; one split then) */
    int from = a.meta.e_astart ? a.meta.e_astart[a.meta.row_entry[r]] : 0;
    if (from < start) from = start;
    if (PF) {
#pragma unroll
        for (int d = 0; d < D; d++)
            if (FUSED && u0 + 4 * d == pos && u0 + 4 * d < end) kv_load<NPL>(kc[d], vc[d], kcur, vcur, lane);
        for (int u = u0; u < end; u += 4) {
            float kn[NPL], vn[NPL];
            int un = u + 4 * D;
            if (un < end)
                kv_load<NPL>(
                    kn, vn, FUSED && un == pos ? kcur : kv_row(a.kpool, a, blocks, un) + (size_t)kvh * hd,
                    FUSED && un == pos ? vcur : kv_row(a.vpool, a, blocks, un) + (size_t)kvh * hd, lane);
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < NPL; i++) s = fmaf(qv[i], kc[0][i], s);
            s = warp_sum(s) * scale;
            float mn = fmaxf(m, s), corr = expf(m - mn), p = expf(s - mn);
            l = fmaf(l, corr, p);
#pragma unroll
            for (int i = 0; i < NPL; i++) acc[i] = fmaf(p, vc[0][i], acc[i] * corr);
            m = mn;
#pragma unroll
            for (int d = 0; d + 1 < D; d++)
#pragma unroll
                for (int i = 0; i < NPL; i++) kc[d][i] = kc[d + 1][i], vc[d][i] = vc[d + 1][i];
#pragma unroll
            for (int i = 0; i < NPL; i++) kc[D - 1][i] = kn[i], vc[D - 1][i] = vn[i];
        }
    } else
        for (int u = from + warp; u < end; u += 4) {
            const float *k = FUSED && u == pos ? kcur : kv_row(a.kpool, a, blocks, u) + (size_t)kvh * hd;
            const float *v = FUSED && u == pos ? vcur : kv_row(a.vpool, a, blocks, u) + (size_t)kvh * hd;
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < NPL; i++) s = fmaf(qv[i], k[lane + 32 * i], s);
            s = warp_sum(s) * scale;
            float mn = fmaxf(m, s), corr = expf(m - mn), p = expf(s - mn);
            l = fmaf(l, corr, p);
#pragma unroll
            for (int i = 0; i < NPL; i++) acc[i] = fmaf(p, v[lane + 32 * i], acc[i] * corr);
            m = mn;
        }
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < NPL; i++) sm_acc[warp][lane + 32 * i] = acc[i];
    __syncthreads();
    float M = fmaxf(fmaxf(sm_m[0], sm_m[1]), fmaxf(sm_m[2], sm_m[3])), Lsum = 0.0f, f[4];
    for (int w = 0; w < 4; w++) {
        f[w] = sm_l[w] > 0.0f ? expf(sm_m[w] - M) : 0.0f;
        Lsum = fmaf(sm_l[w], f[w], Lsum);
    }
    const float *gate = qrow + hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < 4; w++) o = fmaf(sm_acc[w][d], f[w], o);
        if (a.nsplit == 1) {
            a.o[(size_t)r * a.Hq * hd + (size_t)h * hd + d] = (o / Lsum) * dev_sigmoid(gate[d]);
        } else {
            float *p = a.part + (((size_t)r * a.Hq + h) * a.nsplit + sp) * (size_t)(hd + 2);
            p[2 + d] = o;
            if (d == 0) {
                p[0] = M;
                p[1] = Lsum;
            }
        }
    }
    if (!FUSED || a.nsplit == 1) return;
    __threadfence();
    __syncthreads();
    unsigned *cnt = a.dec_cnt + (size_t)r * a.Hq + h;
    if (threadIdx.x == 0) last = atomicAdd(cnt, 1u) == (unsigned)(pos / span);
    __syncthreads();
    if (!last) return;
    __threadfence();
    combine_rowhead<true>(a, h, r, a.part + ((size_t)r * a.Hq + h) * a.nsplit * (size_t)(hd + 2),
                          pos / span + 1);
    if (threadIdx.x == 0) *cnt = 0u; /* ready for the next launch */
}

/* merges the spans of a (row, head) */
__global__ void attn_combine_kernel(cu_attn_args a) {
    int h = blockIdx.x, r = blockIdx.y;
    if (a.dec_nsmax > 0 && a.meta.row_pos[r] >= a.dec_p) return; /* attn_dec_kernel's row */
    combine_rowhead<false>(a, h, r, a.part + ((size_t)r * a.Hq + h) * a.nsplit * (size_t)(a.hd + 2),
                           a.meta.row_pos[r] / attn_span(a, a.meta.row_pos[r]) + 1);
}

/* merges the key spans of the tensor-core prefill tiles (cu_attn_split): a block per (head, row of mrows) */
__global__ void attn_split_merge_kernel(cu_attn_args a) {
    int h = blockIdx.x, r = a.split.mrows[blockIdx.y];
    int ns = a.meta.row_pos[r] / a.split.e_span[a.meta.row_entry[r]] + 1;
    combine_rowhead<false>(
        a, h, r, a.split.part + ((size_t)a.split.row_poff[r] * a.Hq + (size_t)h * ns) * (size_t)(a.hd + 2),
        ns);
}

/* ---- CINFER_CUDA_ATTN_DEC (the default; cu_attn_args.dec_nsmax > 0): the GQA decode kernel ----
 * A block per (kv head, row, span) serves the G = Hq / Hkv q heads sharing the kv head: each K / V row is
 * read once for all of them (attn_kernel reads it once per q head). The span's positions go through shared
 * memory in chunks of CU_ATTN_DEC_CH rows requested at once by cp.async, double-buffered (one memory latency
 * a chunk, not one a position), and under PDL the first chunk (rows of earlier steps) before waiting for
 * in_proj. Per chunk: the (q head, position) scores in parallel (4 threads a position, every head), per head
 * the chunk's max and sum over the lanes of one warp (an online softmax over the chunks), then P.V with each
 * thread owning 4 output dims of every head over a part of the positions. A row's span count follows its own
 * position (cu_attn_dec_span), so its bits do not depend on the other rows of the launch. FUSED (dec_cnt): q
 * / k norm + RoPE and the own position's K / V write folded in as in attn_kernel, and the last block of a
 * (row, kv head) merges the spans of its G heads (dec_merge); else attn_prep_kernel before and
 * attn_dec_combine_kernel after, the same arithmetic. */
#define DEC_NT   256 /* threads (4 warps measured latency-bound: ~17 cycles an instruction, H200 session 7) */
#define DEC_GMAX 8   /* q heads a thread holds (scores, P.V) */
#define DEC_DQ   (DEC_NT / CU_ATTN_DEC_CH) /* threads a position's scores (parts of the dims) */
#define DEC_KPAD 16 /* K rows padded: a warp's 8 positions x 4 quarters of float4 hit distinct banks */

__device__ __forceinline__ void cp_async16(void *dst, const void *src) {
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit(void) {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ int dec_span(int pos, int nsmax, int *ns) {
    int n = pos + 1, s = CU_ATTN_DEC_CH;
    while ((n + s - 1) / s > nsmax) s *= 2;
    *ns = (n + s - 1) / s;
    return s;
}

/* q heads a block of attn_dec_kernel serves (cu_attn_args.dec_hs): a divisor of the GQA group G, else G */
__host__ __device__ __forceinline__ int dec_gb(const cu_attn_args &a) {
    const int G = a.Hq / a.Hkv;
    return a.dec_hs > 0 && a.dec_hs < G && G % a.dec_hs == 0 ? a.dec_hs : G;
}

/* stages of attn_dec_kernel's chunks: one when every row's spans are one chunk (cu_attn_args.span) */
__host__ __device__ __forceinline__ int dec_stages(const cu_attn_args &a) {
    return a.span <= CU_ATTN_DEC_CH ? 1 : 2;
}
/* shared memory of attn_dec_kernel: nst stages of K [CH][hd + DEC_KPAD] and V [CH][hd], q [G][hd], scores
 * then p [G][CH], the own k [hd], per head m, l, corr [G] */
static size_t dec_smem(int hd, int G, int nst) {
    return ((size_t)nst * CU_ATTN_DEC_CH * (2 * hd + DEC_KPAD) + (size_t)G * hd + (size_t)G * CU_ATTN_DEC_CH +
            hd + 3 * (size_t)G) *
           sizeof(float);
}

/* the merge of a (row, kv head)'s ns spans for its G heads into o (gate applied): every span's (m, l) read at
 * once into shared memory, per head the weights expf(m_s - M) and L = sum_s l_s w_s in order of s, then each
 * thread 4 dims of a head, sum_s w_s acc_s in order of s (float4 loads, unrolled: the spans' loads in flight
 * together). Partials of DEC_PST(hd) floats, (m, l) then acc from float 4. sw: [G][ns] x 2 + [G] floats of
 * shared memory */
#define DEC_PST(hd) ((size_t)(hd) + 4)
#define DEC_MPF     16 /* spans of a thread's first output column requested with the (m, l) loads */
__device__ __forceinline__ unsigned long long dec_now(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
/* sts: NULL, or the stamps of CINFER_CUDA_ATTN_STAMPS (shared memory, thread 0 writes [6] and [7]) */
__device__ __forceinline__ void dec_merge(const cu_attn_args &a, int h0, int G, int r, int ns, float *sw,
                                          unsigned long long *sts = nullptr) {
    int hd = a.hd, tid = threadIdx.x, C4 = hd / 4;
    size_t st = DEC_PST(hd);
    const size_t st4 = st / 4;
    const float *p0 = a.part + ((size_t)r * a.Hq + (size_t)h0) * a.nsplit * st;
    float *sl = sw + G * ns, *sL = sl + G * ns;
    /* the first column's acc of its first DEC_MPF spans and its gate, in flight with the (m, l) loads: one
     * L2 round trip for the usual merge (at the 4B shape every thread one column, <= 16 spans) */
    float4 x[DEC_MPF], gt = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (tid < G * C4) {
        int g = tid / C4, d = 4 * (tid % C4);
        const float4 *pg = reinterpret_cast<const float4 *>(p0 + (size_t)g * a.nsplit * st + 4 + d);
#pragma unroll
        for (int s = 0; s < DEC_MPF; s++)
            if (s < ns) x[s] = __ldcg(pg + s * st4);
        const float *gp = a.qkv + (size_t)r * a.ld + (size_t)(h0 + g) * 2 * hd + hd + d;
        gt = make_float4(gp[0], gp[1], gp[2], gp[3]); /* ld need not be a multiple of 4 */
    }
    for (int i = tid; i < G * ns; i += DEC_NT) {
        const float2 ml =
            __ldcg(reinterpret_cast<const float2 *>(p0 + ((size_t)(i / ns) * a.nsplit + i % ns) * st));
        sw[i] = ml.x, sl[i] = ml.y;
    }
    __syncthreads();
    if (sts && threadIdx.x == 0) sts[6] = dec_now();
    /* per head a warp: the max and the weights over its lanes (max is exact in any order; each weight one
     * expf), then L by lane 0 in order of s: the bits of one thread doing all three */
    for (int g = tid >> 5; g < G; g += DEC_NT / 32) {
        const int lane = tid & 31;
        float M = -INFINITY;
        for (int s = lane; s < ns; s += 32) M = fmaxf(M, sw[g * ns + s]);
        M = warp_max(M);
        for (int s = lane; s < ns; s += 32) {
            float l = sl[g * ns + s];
            sw[g * ns + s] = l > 0.0f ? expf(sw[g * ns + s] - M) : 0.0f;
        }
        __syncwarp();
        if (lane == 0) {
            float L = 0.0f;
            for (int s = 0; s < ns; s++) L = fmaf(sl[g * ns + s], sw[g * ns + s], L);
            sL[g] = L;
        }
    }
    __syncthreads();
    if (sts && threadIdx.x == 0) sts[7] = dec_now();
    for (int i = tid; i < G * C4; i += DEC_NT) {
        int g = i / C4, d = 4 * (i % C4), h = h0 + g;
        const float4 *pg = reinterpret_cast<const float4 *>(p0 + (size_t)g * a.nsplit * st + 4 + d);
        const float *w = sw + g * ns;
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f), q;
        int s = 0;
        if (i == tid) { /* the prefetched spans */
#pragma unroll
            for (; s < DEC_MPF; s++) {
                if (s >= ns) break;
                o.x = fmaf(x[s].x, w[s], o.x), o.y = fmaf(x[s].y, w[s], o.y);
                o.z = fmaf(x[s].z, w[s], o.z), o.w = fmaf(x[s].w, w[s], o.w);
            }
            q = gt;
        } else {
            const float *gp = a.qkv + (size_t)r * a.ld + (size_t)h * 2 * hd + hd + d;
            q = make_float4(gp[0], gp[1], gp[2], gp[3]);
        }
#pragma unroll 8
        for (; s < ns; s++) {
            float4 v = __ldcg(pg + s * st4);
            o.x = fmaf(v.x, w[s], o.x), o.y = fmaf(v.y, w[s], o.y);
            o.z = fmaf(v.z, w[s], o.z), o.w = fmaf(v.w, w[s], o.w);
        }
        float L = sL[g];
        float *out = a.o + (size_t)r * a.Hq * hd + (size_t)h * hd + d;
        out[0] = (o.x / L) * dev_sigmoid(q.x), out[1] = (o.y / L) * dev_sigmoid(q.y);
        out[2] = (o.z / L) * dev_sigmoid(q.z), out[3] = (o.w / L) * dev_sigmoid(q.w);
    }
}

/* PRE (fused only, cu_set_attn_dec_pre): the RoPE's cos / sin before the PDL wait (norm_rope_pre) */
template <int NPL, bool FUSED, bool PRE = false>
__global__ void __launch_bounds__(DEC_NT, 2) attn_dec_kernel(cu_attn_args a) {
    extern __shared__ float4 dec_sm4[];
    constexpr int hd = NPL * 32, CH = CU_ATTN_DEC_CH, KS = hd + DEC_KPAD, C4 = hd / 4;
    constexpr int TPC = DEC_NT / C4; /* P.V: threads sharing an output column, each a part of the positions */
    /* G: the q heads of this block, h0 the first (the kv head's group split over Hq / Hkv / G blocks) */
    const int G = dec_gb(a), nsub = a.Hq / a.Hkv / G, kvh = blockIdx.x / nsub, r = blockIdx.y,
              sp = blockIdx.z, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int h0 = kvh * (a.Hq / a.Hkv) + (int)(blockIdx.x % nsub) * G;
    float *sm = reinterpret_cast<float *>(dec_sm4);
    const int nst = dec_stages(a);
    float *Ks = sm, *Vs = Ks + nst * CH * KS, *Qs = Vs + nst * CH * hd, *Ps = Qs + G * hd, *Kc = Ps + G * CH,
          *Sm = Kc + hd, *Sl = Sm + G, *Sc = Sl + G;
    __shared__ int last;
    __shared__ unsigned long long sts[CU_ATTN_STAMPS]; /* CINFER_CUDA_ATTN_STAMPS, thread 0 */
    const bool stamp = FUSED && a.dec_stamps && tid == 0;
    if (stamp) sts[0] = dec_now();
    const int pos = a.meta.row_pos[r], e = a.meta.row_entry[r];
    const bool other = pos < a.dec_p; /* a row of attn_kernel's class: its blocks only wait and return */
    int ns, span = dec_span(pos, a.dec_nsmax < a.nsplit ? a.dec_nsmax : a.nsplit, &ns);
    const int start = sp * span, end = pos + 1 < start + span ? pos + 1 : start + span;
    const int *blocks = a.meta.blocks + a.meta.e_boff[e];
    /* an MTP head resumed mid-sequence attends only to its own rows (meta.e_astart) */
    int from = a.meta.e_astart ? a.meta.e_astart[e] : 0;
    if (from < start) from = start;
    const int nch = sp < ns && from < end && !other ? (end - from + CH - 1) / CH : 0;
    /* chunk c's rows into its stage (FUSED: not the own position, which no kernel has written yet); with one
     * stage (every row's spans one chunk, or else chunk after chunk) */
    auto issue = [&](int c) {
        int c0 = from + c * CH, nj = end - c0 < CH ? end - c0 : CH, b = nst == 2 ? c & 1 : 0;
        float *kb = Ks + b * CH * KS, *vb = Vs + b * CH * hd;
        /* the chunk's (at most 3) KV blocks looked up once, all together; thread: column d, rows j0 + TPC k
         */
        int b0 = c0 / KVB, nb = (c0 + nj - 1) / KVB - b0 + 1;
        int id0 = blocks[b0], id1 = nb > 1 ? blocks[b0 + 1] : 0, id2 = nb > 2 ? blocks[b0 + 2] : 0;
        const int d = 4 * (tid % C4);
        const size_t kvd = (size_t)a.Hkv * hd, o = (size_t)kvh * hd + d;
        for (int j = tid / C4; j < nj; j += TPC) {
            int u = c0 + j, bi = u / KVB - b0;
            if (FUSED && u == pos) continue;
            size_t ro = (((size_t)a.full * a.n_blocks + (size_t)(bi == 0   ? id0
                                                                 : bi == 1 ? id1
                                                                           : id2)) *
                             KVB +
                         (size_t)(u % KVB)) *
                            kvd +
                        o;
            cp_async16(kb + j * KS + d, a.kpool + ro);
            cp_async16(vb + j * hd + d, a.vpool + ro);
        }
        cp_async_commit();
    };
    if (FUSED && nch > 0) issue(0); /* rows of earlier steps: before the wait under PDL (common.cuh) */
    nr_pre npre;
    if (PRE && hd <= NR_REG * 32 && !other && sp < ns) nr_pre_load(a, r, pos, lane, npre);
    if (FUSED) {
        griddep_wait();
        griddep_launch();
    }
    if (stamp) sts[1] = dec_now();
    if (sp >= ns || other) return;
    const float *row = a.qkv + (size_t)r * a.ld;
    const float *vcur = row + (size_t)a.Hq * 2 * hd + (size_t)(a.Hkv + kvh) * hd;
    const int own = end == pos + 1; /* this span holds the row's own position */
    if (!FUSED && nch > 0) issue(0);
    if (FUSED && (a.dec_diag & 2)) { /* diagnostics: q unnormed, no k */
        for (int i = tid; i < G * hd; i += DEC_NT) Qs[i] = row[(size_t)(h0 + i / hd) * 2 * hd + i % hd];
        for (int i = tid; i < hd; i += DEC_NT) Kc[i] = 0.0f;
    } else if (FUSED) {
        if constexpr (PRE && hd <= NR_REG * 32) {
            for (int w = warp; w < G + own; w += DEC_NT / 32) {
                if (w < G)
                    norm_rope_pre(a, row + (size_t)(h0 + w) * 2 * hd, a.q_norm, npre, Qs + w * hd, lane);
                else
                    norm_rope_pre(a, row + (size_t)a.Hq * 2 * hd + (size_t)kvh * hd, a.k_norm, npre, Kc,
                                  lane);
            }
        } else {
            for (int w = warp; w < G + own; w += DEC_NT / 32) {
                if (w < G)
                    norm_rope_warp(a, row + (size_t)(h0 + w) * 2 * hd, a.q_norm, Qs + w * hd, r, pos, lane);
                else
                    norm_rope_warp(a, row + (size_t)a.Hq * 2 * hd + (size_t)kvh * hd, a.k_norm, Kc, r, pos,
                                   lane);
            }
        }
        __syncthreads();
        if (own && h0 == kvh * (a.Hq / a.Hkv)) { /* the group's first block writes the pool */
            float *kd = kv_row(a.kpool, a, blocks, pos) + (size_t)kvh * hd;
            float *vd = kv_row(a.vpool, a, blocks, pos) + (size_t)kvh * hd;
            for (int i = tid; i < hd; i += DEC_NT) kd[i] = Kc[i], vd[i] = vcur[i];
        }
    } else {
        for (int i = tid; i < G * hd; i += DEC_NT) Qs[i] = row[(size_t)(h0 + i / hd) * 2 * hd + i % hd];
    }
    for (int g = tid; g < G; g += DEC_NT) Sm[g] = -INFINITY, Sl[g] = 0.0f;
    __syncthreads();
    if (stamp) sts[2] = dec_now();
    const float scale = (float)(1.0 / sqrt((double)hd));
    /* scores: thread (j = tid / DQ, part dq = tid % DQ) takes float4 columns dq, dq + DQ, ... of position j
     * for every head (each K float4 read once for the G heads; the 4 quarters' q reads one 64-byte line), the
     * quarters joined by two shuffles. P.V: thread (column pc = tid % C4, part pj = tid / C4) sums positions
     * pj, pj + TPC, ... for every head; the parts joined at the end */
    const int sj = tid / DEC_DQ, dq = tid % DEC_DQ, pc = tid % C4, pj = tid / C4;
    float4 acc[DEC_GMAX];
#pragma unroll
    for (int i = 0; i < DEC_GMAX; i++) acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int c = 0; c < nch; c++) {
        int c0 = from + c * CH, nj = end - c0 < CH ? end - c0 : CH;
        if (nst == 2 && c + 1 < nch) {
            issue(c + 1);
            cp_async_wait<1>();
        } else
            cp_async_wait<0>();
        int b = nst == 2 ? c & 1 : 0;
        float *kb = Ks + b * CH * KS, *vb = Vs + b * CH * hd;
        if (FUSED && pos >= c0 && pos < c0 + nj) {
            int j = pos - c0;
            for (int i = tid; i < hd; i += DEC_NT) kb[j * KS + i] = Kc[i], vb[j * hd + i] = vcur[i];
        }
        __syncthreads();
        if (a.dec_diag & 4) { /* diagnostics: loads only */
            if (nst == 1 && c + 1 < nch) issue(c + 1);
            continue;
        }
        {
            float s[DEC_GMAX];
#pragma unroll
            for (int g = 0; g < DEC_GMAX; g++) s[g] = 0.0f;
            const float4 *k4 = reinterpret_cast<const float4 *>(kb + sj * KS) + dq;
            const float4 *q4 = reinterpret_cast<const float4 *>(Qs) + dq;
#pragma unroll 4
            for (int i = 0; i < C4 / DEC_DQ; i++) {
                float4 k = k4[DEC_DQ * i];
#pragma unroll
                for (int g = 0; g < DEC_GMAX; g++) {
                    if (g >= G) break;
                    float4 q = q4[g * C4 + DEC_DQ * i];
                    s[g] = fmaf(q.x, k.x, s[g]), s[g] = fmaf(q.y, k.y, s[g]);
                    s[g] = fmaf(q.z, k.z, s[g]), s[g] = fmaf(q.w, k.w, s[g]);
                }
            }
#pragma unroll
            for (int g = 0; g < DEC_GMAX; g++) {
                if (g >= G) break;
                float v = s[g];
#pragma unroll
                for (int o = 1; o < DEC_DQ; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
                if (dq == 0) Ps[g * CH + sj] = sj < nj ? v * scale : -INFINITY;
            }
        }
        __syncthreads();
        /* per head: the chunk's max and sum over one warp's CH = 32 lanes, an online softmax over the chunks
         */
        for (int i = tid; i < G * CH; i += DEC_NT) {
            int g = i / CH, j = i % CH;
            float sc = Ps[i];
            float mc = warp_max(sc), mo = Sm[g], mn = fmaxf(mo, mc);
            float p = j < nj ? expf(sc - mn) : 0.0f, ps = warp_sum(p);
            Ps[i] = p;
            __syncwarp();
            if (j == 0) {
                float corr = expf(mo - mn); /* mo = -inf on the first chunk: 0 */
                Sc[g] = corr;
                Sl[g] = fmaf(Sl[g], corr, ps);
                Sm[g] = mn;
            }
        }
        __syncthreads();
        {
            const float4 *v4 = reinterpret_cast<const float4 *>(vb) + pc;
#pragma unroll
            for (int g = 0; g < DEC_GMAX; g++) {
                if (g >= G) break;
                float corr = Sc[g];
                acc[g].x *= corr, acc[g].y *= corr, acc[g].z *= corr, acc[g].w *= corr;
            }
            for (int j = pj; j < nj; j += TPC) {
                float4 v = v4[j * C4];
#pragma unroll
                for (int g = 0; g < DEC_GMAX; g++) {
                    if (g >= G) break;
                    float p = Ps[g * CH + j];
                    acc[g].x = fmaf(p, v.x, acc[g].x), acc[g].y = fmaf(p, v.y, acc[g].y);
                    acc[g].z = fmaf(p, v.z, acc[g].z), acc[g].w = fmaf(p, v.w, acc[g].w);
                }
            }
        }
        __syncthreads();
        if (nst == 1 && c + 1 < nch) issue(c + 1);
    }
    if (stamp) sts[3] = dec_now();
    /* the parts of each column joined in order of part (the stages' K and V hold them: dec_ready) */
    float4 *red = reinterpret_cast<float4 *>(Ks);
#pragma unroll
    for (int g = 0; g < DEC_GMAX; g++) {
        if (g >= G) break;
        red[((size_t)pj * G + g) * C4 + pc] = acc[g];
    }
    __syncthreads();
    /* the span's result: the output (one span) or its partial; thread i: head i / C4, column i % C4 */
    const size_t st = DEC_PST(hd);
    for (int i = tid; i < G * C4; i += DEC_NT) {
        int g = i / C4, d = 4 * (i % C4), h = h0 + g;
        float4 o = red[(size_t)g * C4 + i % C4];
        for (int t = 1; t < TPC; t++) {
            float4 q = red[((size_t)t * G + g) * C4 + i % C4];
            o.x += q.x, o.y += q.y, o.z += q.z, o.w += q.w;
        }
        if (ns == 1) {
            float L = Sl[g];
            const float *gate = row + (size_t)h * 2 * hd + hd + d;
            float *out = a.o + (size_t)r * a.Hq * hd + (size_t)h * hd + d;
            out[0] = (o.x / L) * dev_sigmoid(gate[0]), out[1] = (o.y / L) * dev_sigmoid(gate[1]);
            out[2] = (o.z / L) * dev_sigmoid(gate[2]), out[3] = (o.w / L) * dev_sigmoid(gate[3]);
        } else {
            float *p = a.part + (((size_t)r * a.Hq + h) * a.nsplit + sp) * st;
            *reinterpret_cast<float4 *>(p + 4 + d) = o;
            if (d == 0) p[0] = Sm[g], p[1] = Sl[g];
        }
    }
    if (!FUSED || ns == 1 || (a.dec_diag & 8)) return;
    __threadfence();
    __syncthreads();
    if (stamp) sts[4] = dec_now();
    unsigned *cnt = a.dec_cnt + (size_t)r * a.Hq + blockIdx.x; /* blockIdx.x < Hq */
    if (tid == 0) last = atomicAdd(cnt, 1u) == (unsigned)(ns - 1);
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (stamp) sts[5] = dec_now();
    if (!(a.dec_diag & 1))
        dec_merge(a, h0, G, r, ns, Ks, stamp ? sts : nullptr); /* the first stage's K is free now */
    if (tid == 0) *cnt = 0u;                                   /* ready for the next launch */
    if (stamp) {
        sts[8] = dec_now();
        unsigned long long i = atomicAdd(a.dec_stamps, 1ull);
        if (i < CU_ATTN_STAMP_CAP)
            for (int x = 0; x < CU_ATTN_STAMPS; x++) a.dec_stamps[1 + i * CU_ATTN_STAMPS + x] = sts[x];
    }
}

/* the unfused form's merge: a block per (kv head, row) with more than one span */
__global__ void __launch_bounds__(DEC_NT) attn_dec_combine_kernel(cu_attn_args a) {
    extern __shared__ float sw[]; /* [G][nsplit] x 2 + [G] */
    int kvh = blockIdx.x, r = blockIdx.y, ns;
    if (a.meta.row_pos[r] < a.dec_p) return; /* attn_kernel's row */
    dec_span(a.meta.row_pos[r], a.dec_nsmax < a.nsplit ? a.dec_nsmax : a.nsplit, &ns);
    if (ns > 1) dec_merge(a, kvh * (a.Hq / a.Hkv), a.Hq / a.Hkv, r, ns, sw);
}

/* 1 when attn_dec_kernel serves the shape: G within the heads a thread holds, the P.V parts [TPC][G][hd]
 * within one stage's K and V, the fused merge's [G][2 nsplit + 1] within the first stage's K, and the shared
 * memory within the device (the kernels' limit raised once, for DEC_GMAX heads) */
template <int NPL> static int dec_ready(int G, int nsplit) {
    static int ok = 0; /* 1 yes, -1 no, 0 not asked yet */
    constexpr int hd = NPL * 32;
    /* one stage: K [CH][hd + KPAD] then V [CH][hd] */
    const size_t k1 = (size_t)CU_ATTN_DEC_CH * (hd + DEC_KPAD), kv1 = k1 + (size_t)CU_ATTN_DEC_CH * hd;
    if (hd / 4 > DEC_NT || (hd / 4) % DEC_DQ || G > DEC_GMAX || (size_t)4 * DEC_NT * G > kv1 ||
        (size_t)G * (2 * nsplit + 1) > k1)
        return 0;
    if (!ok) {
        int dev = 0, optin = 0;
        int need = (int)dec_smem(hd, DEC_GMAX, 2);
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
        const cudaFuncAttribute A = cudaFuncAttributeMaxDynamicSharedMemorySize;
        ok = need <= optin && cudaFuncSetAttribute(attn_dec_kernel<NPL, true>, A, need) == cudaSuccess &&
                     cudaFuncSetAttribute(attn_dec_kernel<NPL, true, true>, A, need) == cudaSuccess &&
                     cudaFuncSetAttribute(attn_dec_kernel<NPL, false>, A, need) == cudaSuccess
                 ? 1
                 : -1;
    }
    return ok > 0;
}

/* the decode rows by attn_dec_kernel; 0 when it does not serve the shape (the caller then runs attn_kernel).
 * Unfused: attn_prep_kernel first (for every row of the launch: the one prep of a batch whose rows take
 * both kernels) */
/* dec_hs < 0: the fewest q heads a block (a divisor of G) whose grid holds at most two blocks an SM (the
 * kernel's residency), else the whole group; the same bits whatever the choice */
static int dec_auto_hs(const cu_attn_args *a) {
    static int n_sm = 0;
    if (!n_sm) {
        int dev = 0, v = 0;
        n_sm = cudaGetDevice(&dev) == cudaSuccess &&
                       cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && v > 0
                   ? v
                   : 132;
    }
    const int G = a->Hq / a->Hkv;
    const long per = (long)a->T * a->Hkv * a->nsplit; /* blocks with whole groups */
    for (int hs = 1; hs < G; hs++)
        if (G % hs == 0 && per * (G / hs) <= 2L * n_sm) return hs;
    return G;
}

/* the fused form with the RoPE's cos / sin before the PDL wait (nr_pre; CINFER_CUDA_ATTN_PRE=0: after it, as
 * before session 11): the same bits */
static int g_attn_dec_pre = 1;
extern "C" void cu_set_attn_dec_pre(int on) {
    g_attn_dec_pre = on != 0;
}

template <int NPL> static int attn_dec_npl(cu_ctx *c, const cu_attn_args *a0) {
    cu_attn_args hs_a = *a0;
    if (hs_a.dec_hs < 0) hs_a.dec_hs = dec_auto_hs(a0);
    const cu_attn_args *a = &hs_a;
    int G = a->Hq / a->Hkv, GB = dec_gb(*a), nst = dec_stages(*a);
    if (!dec_ready<NPL>(G, a->nsplit)) return 0;
    dim3 grid((unsigned)(a->Hkv * (G / GB)), (unsigned)a->T, (unsigned)a->nsplit);
    size_t sm = dec_smem(NPL * 32, GB, nst);
    if (a->dec_cnt) {
        cu_launch_pdl_smem(c, cu_pdl_on() >= 2 && (cu_pdl_mask() & PDL_ATTN),
                           g_attn_dec_pre ? attn_dec_kernel<NPL, true, true> : attn_dec_kernel<NPL, true>,
                           grid, dim3(DEC_NT), sm, *a);
        return 1;
    }
    attn_prep_kernel<<<a->T, 128, 0, c->stream>>>(*a);
    attn_dec_kernel<NPL, false><<<grid, DEC_NT, sm, c->stream>>>(*a);
    if (a->nsplit > 1)
        attn_dec_combine_kernel<<<dim3((unsigned)a->Hkv, (unsigned)a->T), DEC_NT,
                                  (size_t)G *(2 * a->nsplit + 1) * sizeof(float), c->stream>>>(*a);
    return 1;
}
/* fn(std::integral_constant<int, NPL>) for the head dims attn_dec_kernel is built for (hd = 32 NPL), else 0:
 * the one dispatch of the launch and of its readiness check, so the two cannot disagree */
template <class F> static int dec_by_npl(int hd, F fn) {
    switch (hd % 32 ? 0 : hd / 32) {
    case 1:
        return fn(std::integral_constant<int, 1>());
    case 2:
        return fn(std::integral_constant<int, 2>());
    case 4:
        return fn(std::integral_constant<int, 4>());
    case 8:
        return fn(std::integral_constant<int, 8>());
    case 16:
        return fn(std::integral_constant<int, 16>());
    default:
        return 0;
    }
}
static int attn_dec(cu_ctx *c, const cu_attn_args *a) {
    return dec_by_npl(a->hd, [&](auto n) { return attn_dec_npl<decltype(n)::value>(c, a); });
}

extern "C" int cu_attn_dec_init(int Hq, int Hkv, int hd, int nsmax) {
    if (Hkv <= 0 || Hq % Hkv || nsmax <= 0) return 0;
    int G = Hq / Hkv;
    return dec_by_npl(hd, [&](auto n) { return dec_ready<decltype(n)::value>(G, nsmax); });
}

extern "C" void cu_attn_tiled(cu_ctx *c, const cu_attn_args *a);
extern "C" void cu_attn_tiled_tc(cu_ctx *c, const cu_attn_args *a); /* attention_tc.cu */

static void attn_decode_fused(cu_ctx *c, const cu_attn_args *a);

/* the untiled rows by attn_kernel, unfused: the attention and the merge (prep: attn_prep_kernel first) */
static void attn_rows_unfused(cu_ctx *c, const cu_attn_args *a, int prep);

extern "C" void cu_attn_layer(cu_ctx *c, const cu_attn_args *a) {
    if (a->T <= 0) return;
    if (a->dec_nsmax > 0 && !a->tiles) {
        /* rows by class (cu_attn_args.dec_p): attn_dec_kernel's first (its rows the longer ones: their
         * first chunks requested while in_proj runs, under PDL), then attn_kernel's; each kernel's blocks of
         * the other class return at once. Under PDL the second launch waits for the first to complete (its
         * partials may then reuse the same memory) */
        int cls = a->dec_p <= 0 ? 2 : a->dec_cls ? a->dec_cls : 3;
        cu_attn_args d = *a;
        if (a->dec_span) d.span = a->dec_span;
        if (a->dec_nsplit) d.nsplit = a->dec_nsplit;
        if (a->dec_part) d.part = a->dec_part;
        if ((cls & 2) && !attn_dec(c, &d)) { /* not served (callers check cu_attn_dec_init): attn_kernel */
            d = *a;
            d.dec_nsmax = 0;
            cu_attn_layer(c, &d);
            return;
        }
        if (!(cls & 1)) return;
        if (a->dec_cnt)
            attn_decode_fused(c, a);
        else
            attn_rows_unfused(c, a, !(cls & 2));
        return;
    }
    if (a->dec_cnt && !a->tiles) {
        attn_decode_fused(c, a);
        return;
    }
    if (!a->tiles) {
        attn_rows_unfused(c, a, 1);
        return;
    }
    attn_prep_kernel<<<a->T, 128, 0, c->stream>>>(*a);
    if (a->tc) {
        cu_attn_tiled_tc(c, a);
        if (a->split.work && a->split.n_mrows > 0)
            attn_split_merge_kernel<<<dim3((unsigned)a->Hq, (unsigned)a->split.n_mrows), 128, 0, c->stream>>>(
                *a);
    } else
        cu_attn_tiled(c, a);
}

static void attn_rows_unfused(cu_ctx *c, const cu_attn_args *a, int prep) {
    if (prep) attn_prep_kernel<<<a->T, 128, 0, c->stream>>>(*a);
    dim3 grid((unsigned)a->Hq, (unsigned)a->T, (unsigned)a->nsplit);
    switch (a->hd / 32) {
    case 1:
        attn_kernel<1, false><<<grid, 128, 0, c->stream>>>(*a);
        break;
    case 2:
        attn_kernel<2, false><<<grid, 128, 0, c->stream>>>(*a);
        break;
    case 4:
        attn_kernel<4, false><<<grid, 128, 0, c->stream>>>(*a);
        break;
    case 8:
        attn_kernel<8, false><<<grid, 128, 0, c->stream>>>(*a);
        break;
    case 16:
        attn_kernel<16, false><<<grid, 128, 0, c->stream>>>(*a);
        break;
    default:
        return; /* rejected at context creation */
    }
    if (a->nsplit > 1) attn_combine_kernel<<<dim3((unsigned)a->Hq, (unsigned)a->T), 128, 0, c->stream>>>(*a);
}

/* decode-only batches (dec_cnt): one launch, prep and combine folded into attn_kernel */
static int g_attn_pf = 0;
extern "C" void cu_set_attn_decode_pf(int on) {
    g_attn_pf = on != 0;
}
/* the prefetch only for batches of at most g_attn_pf_rows rows (0: any; CINFER_CUDA_ATTN_PF_ROWS): H200
 * session 5, PDL on, 4B: +2% at batch 1, +4% at 32, -3% at 64. The same bits either way, so a row's result
 * does not depend on its batch */
static int g_attn_pf_rows = 32;
extern "C" void cu_set_attn_decode_pf_rows(int rows) {
    g_attn_pf_rows = rows > 0 ? rows : 0;
}
template <int NPL> static void attn_decode_npl(cu_ctx *c, const cu_attn_args *a, dim3 grid) {
    if (g_attn_pf_rows && a->T > g_attn_pf_rows)
        cu_launch_step(c, PDL_ATTN, attn_kernel<NPL, true>, grid, dim3(128), *a);
    else if (g_attn_pf)
        cu_launch_step(c, PDL_ATTN, attn_kernel<NPL, true, 1>, grid, dim3(128), *a);
    else
        cu_launch_step(c, PDL_ATTN, attn_kernel<NPL, true>, grid, dim3(128), *a);
}
static void attn_decode_fused(cu_ctx *c, const cu_attn_args *a) {
    dim3 grid((unsigned)a->Hq, (unsigned)a->T, (unsigned)a->nsplit);
    switch (a->hd / 32) {
    case 1:
        attn_decode_npl<1>(c, a, grid);
        break;
    case 2:
        attn_decode_npl<2>(c, a, grid);
        break;
    case 4:
        attn_decode_npl<4>(c, a, grid);
        break;
    case 8:
        attn_decode_npl<8>(c, a, grid);
        break;
    case 16:
        attn_decode_npl<16>(c, a, grid);
        break;
    default:
        break; /* rejected at context creation */
    }
}

/* Prefill: a block per (head, tile of up to 16 consecutive rows of one entry). K and V rows are staged in
 * shared memory 16 positions at a time and used by all the tile's rows (16x fewer loads than a block per
 * row). Each warp owns two rows: half-warp lanes score one position each (scores need no shuffles), then
 * every lane accumulates its output dims over the 16 positions with the probabilities broadcast. */
template <int NPL> __global__ void __launch_bounds__(256) attn_tile_kernel(cu_attn_args a) {
    extern __shared__ float sm[];
    const int hd = NPL * 32, ks = hd + 1; /* padded rows: the 16 positions of a chunk sit in distinct banks */
    float *Ks = sm, *Qs = Ks + CU_ATTN_TILE * ks, *Vs = Qs + CU_ATTN_TILE * ks;
    int h = blockIdx.x, r0 = a.tiles[blockIdx.y], warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int e = a.meta.row_entry[r0], end = a.meta.e_row0[e] + a.meta.e_n[e];
    int rows = end - r0 < CU_ATTN_TILE ? end - r0 : CU_ATTN_TILE;
    int pos0 = a.meta.row_pos[r0], maxpos = pos0 + rows - 1, kvh = h / (a.Hq / a.Hkv);
    const int *blocks = a.meta.blocks + a.meta.e_boff[e];
    for (int i = threadIdx.x; i < CU_ATTN_TILE * hd; i += blockDim.x) {
        int r = i / hd, d = i % hd;
        Qs[r * ks + d] = r < rows ? a.qkv[(size_t)(r0 + r) * a.ld + (size_t)h * 2 * hd + d] : 0.0f;
    }
    int half = lane >> 4, jl = lane & 15, myr = 2 * warp + half, mypos = pos0 + myr;
    float scale = (float)(1.0 / sqrt((double)hd));
    float m = -INFINITY, l = 0.0f, accA[NPL], accB[NPL];
#pragma unroll
    for (int i = 0; i < NPL; i++) accA[i] = accB[i] = 0.0f;
    for (int c0 = 0; c0 <= maxpos; c0 += CU_ATTN_TILE) {
        __syncthreads();
        /* 16-byte loads (hd is a multiple of 32); rows past the tile's last position are zeros */
        for (int i = threadIdx.x; i < CU_ATTN_TILE * hd / 4; i += blockDim.x) {
            int j = i / (hd / 4), d = 4 * (i % (hd / 4)), u = c0 + j;
            float4 kv = make_float4(0.0f, 0.0f, 0.0f, 0.0f), vv = kv;
            if (u <= maxpos) {
                kv = *reinterpret_cast<const float4 *>(kv_row(a.kpool, a, blocks, u) + (size_t)kvh * hd + d);
                vv = *reinterpret_cast<const float4 *>(kv_row(a.vpool, a, blocks, u) + (size_t)kvh * hd + d);
            }
            float *kd = Ks + j * ks + d;
            kd[0] = kv.x, kd[1] = kv.y, kd[2] = kv.z, kd[3] = kv.w;
            *reinterpret_cast<float4 *>(Vs + j * hd + d) = vv;
        }
        __syncthreads();
        int u = c0 + jl;
        float s = -INFINITY;
        if (myr < rows && u <= mypos) {
            float acc = 0.0f;
            const float *q = Qs + myr * ks, *k = Ks + jl * ks;
            for (int d = 0; d < hd; d++) acc = fmaf(q[d], k[d], acc);
            s = acc * scale;
        }
        float cm = s;
        for (int o = 8; o > 0; o >>= 1)
            cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, o)); /* within the half */
        float mn = fmaxf(m, cm);
        float corr = mn == -INFINITY ? 1.0f : expf(m - mn);
        float p = s == -INFINITY ? 0.0f : expf(s - mn);
        float ps = p;
        for (int o = 8; o > 0; o >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o);
        l = l * corr + ps;
        m = mn;
        float cA = __shfl_sync(0xffffffffu, corr, 0), cB = __shfl_sync(0xffffffffu, corr, 16);
#pragma unroll
        for (int i = 0; i < NPL; i++) accA[i] *= cA, accB[i] *= cB;
        for (int j = 0; j < CU_ATTN_TILE; j++) {
            float pA = __shfl_sync(0xffffffffu, p, j), pB = __shfl_sync(0xffffffffu, p, 16 + j);
            const float *v = Vs + j * hd;
#pragma unroll
            for (int i = 0; i < NPL; i++) {
                float vv = v[lane + 32 * i];
                accA[i] = fmaf(pA, vv, accA[i]);
                accB[i] = fmaf(pB, vv, accB[i]);
            }
        }
    }
    float lA = __shfl_sync(0xffffffffu, l, 0), lB = __shfl_sync(0xffffffffu, l, 16);
    for (int hr = 0; hr < 2; hr++) {
        int r = 2 * warp + hr;
        if (r >= rows) continue;
        const float *gate = a.qkv + (size_t)(r0 + r) * a.ld + (size_t)h * 2 * hd + hd;
        float *o = a.o + (size_t)(r0 + r) * a.Hq * hd + (size_t)h * hd;
#pragma unroll
        for (int i = 0; i < NPL; i++) {
            int d = lane + 32 * i;
            o[d] = ((hr ? accB[i] : accA[i]) / (hr ? lB : lA)) * dev_sigmoid(gate[d]);
        }
    }
}

static size_t tile_smem(int hd) {
    return (size_t)(2 * CU_ATTN_TILE * (hd + 1) + CU_ATTN_TILE * hd) * sizeof(float);
}

extern "C" int cu_attn_init(int hd) {
    int dev = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 0;
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (tile_smem(hd) > (size_t)optin) return 0;
    cudaError_t e = cudaSuccess;
    switch (hd / 32) {
    case 1:
        e = cudaFuncSetAttribute(attn_tile_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, optin);
        break;
    case 2:
        e = cudaFuncSetAttribute(attn_tile_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, optin);
        break;
    case 4:
        e = cudaFuncSetAttribute(attn_tile_kernel<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, optin);
        break;
    case 8:
        e = cudaFuncSetAttribute(attn_tile_kernel<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, optin);
        break;
    case 16:
        e = cudaFuncSetAttribute(attn_tile_kernel<16>, cudaFuncAttributeMaxDynamicSharedMemorySize, optin);
        break;
    default:
        return 0;
    }
    return e == cudaSuccess;
}

extern "C" void cu_attn_tiled(cu_ctx *c, const cu_attn_args *a) {
    dim3 grid((unsigned)a->Hq, (unsigned)a->n_tiles);
    size_t sm = tile_smem(a->hd);
    switch (a->hd / 32) {
    case 1:
        attn_tile_kernel<1><<<grid, 256, sm, c->stream>>>(*a);
        break;
    case 2:
        attn_tile_kernel<2><<<grid, 256, sm, c->stream>>>(*a);
        break;
    case 4:
        attn_tile_kernel<4><<<grid, 256, sm, c->stream>>>(*a);
        break;
    case 8:
        attn_tile_kernel<8><<<grid, 256, sm, c->stream>>>(*a);
        break;
    case 16:
        attn_tile_kernel<16><<<grid, 256, sm, c->stream>>>(*a);
        break;
    default:
        break;
    }
}

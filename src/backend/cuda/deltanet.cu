/* deltanet.cu — one Gated DeltaNet layer between in_proj and out_proj (spec §4): causal conv1d + SiLU with
 * the window kept per slot, l2norm of q/k (q scaled), beta = sigmoid(b), g = A softplus(a + dt_bias), the
 * recurrent form for a decode token continuing a sequence, the chunked (WY) form on the absolute 64-grid for
 * everything else, then the gated RMSNorm. The f32 state lives in its slot and is updated in place.
 * Sums run in the CPU's order (forward_cpu.c) wherever a thread owns the whole sum.
 *
 * Speculative windows: snapshot-and-replay, as on the CPU. A window's recurrence runs token by token from the
 * slot's S held in registers and never writes it back; each token's position-local inputs (pre-conv row,
 * normed q|k|v, beta, g: 2C + 2Hv floats, 64 KB a layer at the 4B shape) go to a per-slot record; the commit
 * replays the kept tokens on S with the same per-token update (rec_token). Per-position states would instead
 * write a full S (2 MB a layer at the 4B shape) per window token — k+1 state writes per window against one
 * read-modify-write at the commit, and k+1 times the state memory per slot — so on the GPU, where this
 * traffic is the cost, the replay is the cheaper of the two (verify: S read once; commit: S read and written
 * once, plus n_keep tokens of arithmetic on registers). */
#include <cooperative_groups.h>

#include "backend/cuda/common.cuh"

#define GDN_CH 64 /* chunk length, = GDN_CHUNK of forward.h */
#define GDN_DT 32 /* value columns per chunked block: U, D, O and S split by columns */

/* The per-element pieces of a layer, shared by the four-kernel path (conv_kernel, prep_kernel,
 * recurrent_kernel, gnorm_kernel) and the fused decode kernel: both run the same device code in the same
 * order, so a decode step gives the same bits either way (tests/unit/test_cuda_fused.c). */

#define CONV_MAXK 8

/* one channel, one token: silu(w . [window | xin]); win holds the K-1 earlier inputs, oldest first, wt their
 * weights, wl the current input's (the loop is unrolled with constant indices, so arrays filled the same way
 * stay in registers) */
template <int N>
__device__ __forceinline__ float conv_tap(const float (&wt)[N], const float (&win)[N], float wl, float xin,
                                          int K) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < N - 1; j++)
        if (j < K - 1) acc = fmaf(wt[j], win[j], acc);
    return dev_silu(fmaf(wl, xin, acc));
}

/* 1 / sqrt(sum x^2 + 1e-6) of one dk-vector by one warp (every lane gets it): l2norm_warp's factor */
__device__ __forceinline__ float l2inv_warp(const float *x, int dk, int lane) {
    float ss = 0.0f;
    for (int i = lane; i < dk; i += 32) ss = fmaf(x[i], x[i], ss);
    ss = warp_sum(ss);
    return 1.0f / sqrtf(ss + 1e-6f);
}

/* l2norm (eps 1e-6) of one dk-vector by one warp, times 1/sqrt(dk) for a query head; x and y may alias */
__device__ __forceinline__ void l2norm_warp(const float *x, float *y, int dk, int isq, int lane) {
    float scale = (float)(1.0 / sqrt((double)dk));
    float inv = l2inv_warp(x, dk, lane);
    for (int i = lane; i < dk; i += 32) {
        float v = x[i] * inv;
        y[i] = isq ? v * scale : v;
    }
}

/* beta = sigmoid(b) and g = A softplus(a + dt_bias) of value head h */
__device__ __forceinline__ float gdn_beta(float b) {
    return dev_sigmoid(b);
}
__device__ __forceinline__ float gdn_gate(const cu_gdn_args &a, float av, int h) {
    return a.A[h] * dev_softplus(av + a.dt_bias[h]);
}

/* rmsnorm(o_h) * gnorm * silu(z_h) of one value head by one warp, o read from src and written to dst (CG:
 * src read through L2, for rows other blocks of the same launch wrote) */
template <bool CG>
__device__ __forceinline__ void gnorm_warp(const float *src, float *dst, const float *z, const float *w,
                                           int dv, float eps, int lane) {
    float ss = 0.0f;
    for (int j = lane; j < dv; j += 32) {
        float v = CG ? __ldcg(src + j) : src[j];
        ss = fmaf(v, v, ss);
    }
    ss = warp_sum(ss);
    float inv = 1.0f / sqrtf(ss / (float)dv + eps);
    for (int j = lane; j < dv; j += 32) {
        float v = CG ? __ldcg(src + j) : src[j];
        dst[j] = ((v * inv) * w[j]) * dev_silu(z[j]);
    }
}

__global__ void conv_kernel(cu_gdn_args a) {
    int e = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= a.C) return;
    int n = a.meta.e_n[e], r0 = a.meta.e_row0[e], slot = a.meta.e_slot[e], K = a.K, C = a.C;
    float *st = a.conv_state + ((size_t)slot * a.n_lin + a.lin) * (size_t)(K - 1) * C + c;
    float win[CONV_MAXK], wt[CONV_MAXK];
    for (int j = 0; j < K - 1; j++) win[j] = st[(size_t)j * C];
    int keep = a.meta.e_keep ? a.meta.e_keep[e] : 0, spec = a.has_spec && a.meta.e_spec[e];
    if (keep > 0) {
        /* the slot's last window kept `keep` tokens: its commit (spec_conv_commit_kernel's copies) comes
         * first; a window writes the committed state here, since it leaves the slot as it finds it */
        size_t rf = CU_SPEC_REC(C, a.Hv);
        const float *rec = a.spec_rec + (size_t)(a.meta.e_par[e] ^ 1) * a.spec_buf +
                           ((size_t)slot * a.n_lin + a.lin) * a.spec_win * rf + c;
        for (int t = 0; t < keep; t++) {
            for (int j = 0; j + 1 < K - 1; j++) win[j] = win[j + 1];
            if (K > 1) win[K - 2] = rec[(size_t)t * rf];
        }
        if (spec)
            for (int j = 0; j < K - 1; j++) st[(size_t)j * C] = win[j];
    }
    for (int j = 0; j < K; j++) wt[j] = a.conv_w[(size_t)j * C + c];
    for (int t = 0; t < n; t++) {
        float xin = a.qkv[(size_t)(r0 + t) * a.qkv_ld + c];
        a.conv_out[(size_t)(r0 + t) * C + c] = conv_tap(wt, win, wt[K - 1], xin, K);
        for (int j = 0; j + 1 < K - 1; j++) win[j] = win[j + 1];
        if (K > 1) win[K - 2] = xin;
    }
    if (spec)
        return; /* a window: cu_gdn_spec_commit (or the slot's next step) advances it for what is kept */
    for (int j = 0; j < K - 1; j++) st[(size_t)j * C] = win[j];
}

/* the same conv for a prefill, a thread per (8 rows, channel) instead of a thread per channel walking all the
 * rows (at 4096 rows that walk is 4096 dependent global round trips per thread, 1.9 ms of a 4B layer on the
 * H200): the 8 rows' inputs are loaded at once, a window starts from the rows before it in the entry or from
 * the slot's window and then slides in registers; the same conv_tap, so the same bits. conv_window_kernel
 * then advances the slots' windows, after every row has read them. Used with the phased prefill
 * (cu_gdn_args.tc 2). */
#define CONV_RB 8 /* rows per thread: each row's input is the next row's window, kept in registers */
__global__ void conv_rows_kernel(cu_gdn_args a) {
    int c = blockIdx.x * blockDim.x + threadIdx.x, rb = blockIdx.y * CONV_RB;
    if (c >= a.C) return;
    int K = a.K, C = a.C, n = a.T - rb < CONV_RB ? a.T - rb : CONV_RB;
    /* loops over the array bounds with guards, so that the arrays stay in registers */
    float win[CONV_MAXK], wt[CONV_MAXK], xs[CONV_RB];
#pragma unroll
    for (int j = 0; j < CONV_MAXK; j++) win[j] = 0.0f, wt[j] = j < K - 1 ? a.conv_w[(size_t)j * C + c] : 0.0f;
    float wl = a.conv_w[(size_t)(K - 1) * C + c];
#pragma unroll
    for (int i = 0; i < CONV_RB; i++) /* all the rows' loads in flight at once */
        xs[i] = i < n ? a.qkv[(size_t)(rb + i) * a.qkv_ld + c] : 0.0f;
#pragma unroll
    for (int i = 0; i < CONV_RB; i++) {
        if (i >= n) break;
        int r = rb + i, e = a.meta.row_entry[r], t = r - a.meta.e_row0[e];
        if (i == 0 || t == 0) { /* the window from the rows before in the entry, or from the slot */
            const float *st =
                a.conv_state + ((size_t)a.meta.e_slot[e] * a.n_lin + a.lin) * (size_t)(K - 1) * C + c;
#pragma unroll
            for (int j = 0; j < CONV_MAXK - 1; j++) {
                int p = t - (K - 1) + j; /* the input's position in the entry; < 0: in the slot's window */
                if (j < K - 1)
                    win[j] = p >= 0 ? a.qkv[(size_t)(r - t + p) * a.qkv_ld + c] : st[(size_t)(p + K - 1) * C];
            }
        } else { /* row r - 1 is in the same entry: its input joins the window */
#pragma unroll
            for (int j = 0; j < CONV_MAXK - 1; j++)
                if (j < K - 1) win[j] = j + 1 < K - 1 ? win[j + 1] : xs[i > 0 ? i - 1 : 0];
        }
        a.conv_out[(size_t)r * C + c] = conv_tap(wt, win, wl, xs[i], K);
    }
}

__global__ void conv_window_kernel(cu_gdn_args a) {
    int e = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= a.C || (a.has_spec && a.meta.e_spec[e])) return; /* a window: cu_gdn_spec_commit advances it */
    int n = a.meta.e_n[e], r0 = a.meta.e_row0[e], K = a.K, C = a.C;
    float *st = a.conv_state + ((size_t)a.meta.e_slot[e] * a.n_lin + a.lin) * (size_t)(K - 1) * C + c;
    float x[CONV_MAXK];
    for (int j = 0; j < K - 1; j++) {
        int i = n - (K - 1) + j;
        x[j] = i >= 0 ? a.qkv[(size_t)(r0 + i) * a.qkv_ld + c] : st[(size_t)(i + K - 1) * C];
    }
    for (int j = 0; j < K - 1; j++) st[(size_t)j * C] = x[j];
}

/* speculative windows: each row's position-local inputs, after prep_kernel and before anything reuses the
 * rows */
__global__ void spec_record_kernel(cu_gdn_args a) {
    int r = blockIdx.x, e = a.meta.row_entry[r];
    if (!a.meta.e_spec[e]) return;
    int t = r - a.meta.e_row0[e], C = a.C, Hv = a.Hv, par = a.meta.e_par ? a.meta.e_par[e] : 0;
    size_t rf = CU_SPEC_REC(C, Hv);
    float *dst = a.spec_rec + (size_t)par * a.spec_buf +
                 (((size_t)a.meta.e_slot[e] * a.n_lin + a.lin) * a.spec_win + t) * rf;
    const float *pre = a.qkv + (size_t)r * a.qkv_ld, *post = a.conv_out + (size_t)r * C;
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        dst[i] = pre[i];
        dst[C + i] = post[i];
    }
    for (int i = threadIdx.x; i < 2 * Hv; i += blockDim.x)
        dst[2 * (size_t)C + i] = a.bg[(size_t)r * 2 * Hv + i];
}

/* per row: l2norm (eps 1e-6) of the 2 Hk q/k heads, q scaled by 1/sqrt(dk); beta and g per value head */
__global__ void prep_kernel(cu_gdn_args a) {
    int r = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    float *row = a.conv_out + (size_t)r * a.C;
    for (int h = warp; h < 2 * a.Hk; h += nw) {
        float *x = row + (size_t)h * a.dk;
        l2norm_warp(x, x, a.dk, h < a.Hk, lane);
    }
    for (int h = threadIdx.x; h < a.Hv; h += blockDim.x) {
        float b = a.b[(size_t)r * a.ba_ld + h], av = a.a[(size_t)r * a.ba_ld + h];
        a.bg[(size_t)r * 2 * a.Hv + h] = gdn_beta(b);
        a.bg[(size_t)r * 2 * a.Hv + a.Hv + h] = gdn_gate(a, av, h);
    }
}

/* decode: one token continuing a sequence. A block owns 32 columns j of S [dk][dv] (a head's slice) with 8
 * row groups: thread (g, jj) keeps rows i = g, g + 8, ... of column j in registers, so S is read once and
 * written once; the read-out S^T k and the output S^T q are summed per group, then over the 8 groups.
 * rec_token is one token's update of those registers; the decode kernel, a speculative window (several
 * tokens, S never written back) and the commit's replay all run it, so the three give the same bits. */
#define REC_GROUPS 8
#define REC_MAXR   32 /* rows per thread: dk <= 256 */
/* LAUNCH(R) with R = rows of S per thread for this dk (4, 8, 16 or 32): every kernel holding S in registers
 * is launched through this one choice */
#define REC_DISPATCH(dk, LAUNCH)                                                                             \
    do {                                                                                                     \
        if ((dk) <= 32)                                                                                      \
            LAUNCH(4);                                                                                       \
        else if ((dk) <= 64)                                                                                 \
            LAUNCH(8);                                                                                       \
        else if ((dk) <= 128)                                                                                \
            LAUNCH(16);                                                                                      \
        else                                                                                                 \
            LAUNCH(32);                                                                                      \
    } while (0)
/* R = rows per thread the kernels are built for (ceil(dk / 8): 4, 8, 16 or 32): the registers holding S are
 * sized to what dk needs, not to the largest dk (the same operations in the same order for any R >= dk / 8)
 */
template <int R>
__device__ __forceinline__ void rec_token(float *sv, const float *q, const float *k, float vj, float decay,
                                          float beta, int g, int jj, int ok, int dk, float (*red)[32],
                                          float *fin, float *o_out) {
    float m = 0.0f;
#pragma unroll
    for (int t = 0; t < R; t++) {
        int i = g + REC_GROUPS * t;
        if (i < dk && ok) {
            sv[t] = __fmul_rn(sv[t], decay);
            m = fmaf(k[i], sv[t], m);
        }
    }
    red[g][jj] = m;
    __syncthreads();
    if (g == 0) {
        float mm = 0.0f;
        for (int t = 0; t < REC_GROUPS; t++) mm += red[t][jj];
        fin[jj] = beta * ((ok ? vj : 0.0f) - mm);
    }
    __syncthreads();
    float mj = fin[jj], o = 0.0f;
#pragma unroll
    for (int t = 0; t < R; t++) {
        int i = g + REC_GROUPS * t;
        if (i < dk && ok) {
            sv[t] = fmaf(k[i], mj, sv[t]);
            o = fmaf(q[i], sv[t], o);
        }
    }
    __syncthreads(); /* red is reused */
    red[g][jj] = o;
    __syncthreads();
    if (g == 0 && ok && o_out) {
        float oo = 0.0f;
        for (int t = 0; t < REC_GROUPS; t++) oo += red[t][jj];
        *o_out = oo;
    }
    __syncthreads(); /* red, fin and the caller's q / k are reused by the next token */
}

template <int R> __global__ void __launch_bounds__(256) recurrent_kernel(cu_gdn_args a) {
    __shared__ float q[256], k[256], red[REC_GROUPS][32], fin[32];
    int e = blockIdx.z, n = a.meta.e_n[e], spec = a.has_spec && a.meta.e_spec[e];
    if (!spec && !(n == 1 && a.meta.e_len[e] > 0)) return;
    int h = blockIdx.y, jj = threadIdx.x & 31, g = threadIdx.x >> 5, j = blockIdx.x * 32 + jj, dk = a.dk,
        dv = a.dv;
    int r0 = a.meta.e_row0[e], kh = h / (a.Hv / a.Hk), kd = a.Hk * dk;
    int ok = j < dv;
    float *S = a.rec_state + (((size_t)a.meta.e_slot[e] * a.n_lin + a.lin) * a.Hv + h) * (size_t)dk * dv + j;
    float sv[R];
#pragma unroll
    for (int t = 0; t < R; t++) {
        int i = g + REC_GROUPS * t;
        sv[t] = i < dk && ok ? S[(size_t)i * dv] : 0.0f;
    }
    int keep = a.meta.e_keep ? a.meta.e_keep[e] : 0;
    if (keep > 0) {
        /* the commit of the slot's last window (spec_replay_kernel's loop, same arithmetic) before this
         * entry's tokens; a window stores the committed S, since it never writes its own */
        size_t rf = CU_SPEC_REC(a.C, a.Hv);
        const float *base = a.spec_rec + (size_t)(a.meta.e_par[e] ^ 1) * a.spec_buf +
                            ((size_t)a.meta.e_slot[e] * a.n_lin + a.lin) * a.spec_win * rf;
        for (int tt = 0; tt < keep; tt++) {
            const float *post = base + (size_t)tt * rf + a.C, *bg = post + a.C;
            for (int i = threadIdx.x; i < dk; i += blockDim.x) {
                q[i] = post[(size_t)kh * dk + i];
                k[i] = post[kd + (size_t)kh * dk + i];
            }
            __syncthreads();
            float decay = expf(bg[a.Hv + h]), beta = bg[h];
            float vj = ok ? post[2 * (size_t)kd + (size_t)h * dv + j] : 0.0f;
            rec_token<R>(sv, q, k, vj, decay, beta, g, jj, ok, dk, red, fin, NULL);
        }
        if (spec) {
#pragma unroll
            for (int t = 0; t < R; t++) {
                int i = g + REC_GROUPS * t;
                if (i < dk && ok) S[(size_t)i * dv] = sv[t];
            }
        }
    }
    for (int tt = 0; tt < n; tt++) {
        int r = r0 + tt;
        const float *row = a.conv_out + (size_t)r * a.C;
        for (int i = threadIdx.x; i < dk; i += blockDim.x) {
            q[i] = row[(size_t)kh * dk + i];
            k[i] = row[kd + (size_t)kh * dk + i];
        }
        __syncthreads();
        float decay = expf(a.bg[(size_t)r * 2 * a.Hv + a.Hv + h]), beta = a.bg[(size_t)r * 2 * a.Hv + h];
        float vj = ok ? row[2 * (size_t)kd + (size_t)h * dv + j] : 0.0f;
        rec_token<R>(sv, q, k, vj, decay, beta, g, jj, ok, dk, red, fin,
                     a.o + (size_t)r * a.Hv * dv + (size_t)h * dv + j);
    }
    if (spec) return; /* a window: the slot keeps the state from before it until the commit */
#pragma unroll
    for (int t = 0; t < R; t++) {
        int i = g + REC_GROUPS * t;
        if (i < dk && ok) S[(size_t)i * dv] = sv[t];
    }
}

/* Fused decode (cu_gdn_args.dec_cnt): a whole layer in one launch when every entry is one token continuing
 * its sequence — at batch 1 the four kernels above are each a few microseconds of launch and tail for ~4 MB
 * of state traffic. recurrent_kernel's grid and block layout (entry, value head, 32 value columns; 8 row
 * groups). Each block first runs the conv + SiLU and the l2norm of its key head's q and k itself (redundant
 * across the rr x dv/32 blocks sharing that key head, 2 dk + 32 channels: cheap next to its 16 KB slice of
 * S, whose loads are issued first) and of its own 32 value channels, with conv_tap / l2norm_warp / gdn_beta /
 * gdn_gate, then rec_token: the same bits as the four kernels. Ownership: a block writes the conv windows of
 * its value channels; the q/k windows of a key head are read by all the blocks of its group, so the last of
 * them to finish writes them (a counter per (entry, key head) in dec_cnt, set back to 0 by that block), and
 * that block also runs the gated norm of the group's rr heads once every column of them is written. */
template <int R> __global__ void __launch_bounds__(256) fused_decode_kernel(cu_gdn_args a) {
    __shared__ float q[256], k[256], red[REC_GROUPS][32], fin[32];
    __shared__ float xs[512], vs[32], bgs[2];
    __shared__ int last;
    int e = blockIdx.z;
    /* every block waits, even one with nothing to do (common.cuh: else the next kernel could see this one
     * complete before the in_proj it waits for) */
    if (!(a.meta.e_n[e] == 1 && a.meta.e_len[e] > 0)) { /* launched only when none is otherwise */
        griddep_wait();
        return;
    }
    int h = blockIdx.y, jj = threadIdx.x & 31, g = threadIdx.x >> 5, j0 = blockIdx.x * 32, j = j0 + jj;
    int dk = a.dk, dv = a.dv, K = a.K, C = a.C, tid = threadIdx.x, rr = a.Hv / a.Hk;
    int r = a.meta.e_row0[e], slot = a.meta.e_slot[e], kh = h / rr, kd = a.Hk * dk;
    int ok = j < dv;
    /* Before griddep_wait (under CINFER_CUDA_PDL=1 while the in_proj GEMV still runs): what no kernel of the
     * step writes — this layer's slice of S and conv windows (written by this kernel one step earlier), the
     * conv weights, the metadata. Only the in_proj row (q, k, v, z, b, a) waits. */
    float *S = a.rec_state + (((size_t)slot * a.n_lin + a.lin) * a.Hv + h) * (size_t)dk * dv + j;
    float sv[R];
#pragma unroll
    for (int t = 0; t < R; t++) {
        int i = g + REC_GROUPS * t;
        sv[t] = i < dk && ok ? S[(size_t)i * dv] : 0.0f;
    }
    /* conv + SiLU: q channels kh dk + i, k channels kd + kh dk + i (idx < 2 dk), then this block's values */
    float *cst = a.conv_state + ((size_t)slot * a.n_lin + a.lin) * (size_t)(K - 1) * C;
    const float *xrow = a.qkv + (size_t)r * a.qkv_ld;
    int nv = dv - j0 < 32 ? dv - j0 : 32, nc = 2 * dk + nv;
    /* the first channel's window and weights (idx = tid) */
    float win0[CONV_MAXK], wt0[CONV_MAXK], wl0 = 0.0f;
    {
        int idx = tid < nc ? tid : 0;
        int c = idx < dk       ? kh * dk + idx
                : idx < 2 * dk ? kd + kh * dk + (idx - dk)
                               : 2 * kd + h * dv + j0 + (idx - 2 * dk);
#pragma unroll
        for (int t = 0; t < CONV_MAXK - 1; t++) {
            win0[t] = t < K - 1 && tid < nc ? cst[(size_t)t * C + c] : 0.0f;
            wt0[t] = t < K - 1 && tid < nc ? a.conv_w[(size_t)t * C + c] : 0.0f;
        }
        if (tid < nc) wl0 = a.conv_w[(size_t)(K - 1) * C + c];
    }
    griddep_wait();   /* the in_proj row */
    griddep_launch(); /* out_proj may start requesting its weights */
    /* beta and g of this head, their loads issued with the others (not after a barrier) */
    if (tid == 64) {
        bgs[0] = gdn_beta(a.b[(size_t)r * a.ba_ld + h]);
        bgs[1] = gdn_gate(a, a.a[(size_t)r * a.ba_ld + h], h);
    }
    for (int idx = tid; idx < nc; idx += blockDim.x) {
        int c = idx < dk       ? kh * dk + idx
                : idx < 2 * dk ? kd + kh * dk + (idx - dk)
                               : 2 * kd + h * dv + j0 + (idx - 2 * dk);
        float win[CONV_MAXK], wt[CONV_MAXK], wl; /* constant indices only: registers */
        if (idx == tid) {
#pragma unroll
            for (int t = 0; t < CONV_MAXK - 1; t++) win[t] = win0[t], wt[t] = wt0[t];
            wl = wl0;
        } else {
#pragma unroll
            for (int t = 0; t < CONV_MAXK - 1; t++) {
                win[t] = t < K - 1 ? cst[(size_t)t * C + c] : 0.0f;
                wt[t] = t < K - 1 ? a.conv_w[(size_t)t * C + c] : 0.0f;
            }
            wl = a.conv_w[(size_t)(K - 1) * C + c];
        }
        float xin = xrow[c], y = conv_tap(wt, win, wl, xin, K);
        if (idx < dk) {
            q[idx] = y, xs[idx] = xin;
        } else if (idx < 2 * dk) {
            k[idx - dk] = y, xs[idx] = xin;
        } else {
            vs[idx - 2 * dk] = y;
#pragma unroll
            for (int t = 0; t < CONV_MAXK - 1; t++)
                if (t < K - 1) cst[(size_t)t * C + c] = t + 1 < K - 1 ? win[t + 1] : xin;
        }
    }
    __syncthreads();
    if (g == 0) l2norm_warp(q, q, dk, 1, jj);
    if (g == 1) l2norm_warp(k, k, dk, 0, jj);
    __syncthreads();
    float decay = expf(bgs[1]), beta = bgs[0];
    float vj = ok ? vs[jj] : 0.0f;
    float *orow = a.o + (size_t)r * a.Hv * dv;
    rec_token<R>(sv, q, k, vj, decay, beta, g, jj, ok, dk, red, fin, orow + (size_t)h * dv + j);
    /* the last block of the key head's group: every o column of its rr heads is written and every block has
     * read the q/k windows (a block's loads are consumed before its __syncthreads). Only warp 0 wrote o, so
     * only it fences, before S is stored: no fence waits for the state's 16 KB (no block reads S) */
    if (g == 0) __threadfence();
    __syncthreads();
    unsigned *cnt = a.dec_cnt + (size_t)e * a.Hk + kh;
    if (tid == 0) last = atomicAdd(cnt, 1u) == (unsigned)(rr * gridDim.x) - 1u;
#pragma unroll
    for (int t = 0; t < R; t++) {
        int i = g + REC_GROUPS * t;
        if (i < dk && ok) S[(size_t)i * dv] = sv[t];
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int idx = tid; idx < 2 * dk; idx += blockDim.x) {
        int c = idx < dk ? kh * dk + idx : kd + kh * dk + (idx - dk);
        for (int t = 0; t + 1 < K - 1; t++) cst[(size_t)t * C + c] = cst[(size_t)(t + 1) * C + c];
        if (K > 1) cst[(size_t)(K - 2) * C + c] = xs[idx];
    }
    for (int hh = kh * rr + g; hh < (kh + 1) * rr; hh += REC_GROUPS) {
        float *o = orow + (size_t)hh * dv;
        gnorm_warp<true>(o, o, a.z + (size_t)r * a.z_ld + (size_t)hh * dv, a.gnorm, dv, a.eps, jj);
    }
    if (tid == 0) *cnt = 0u; /* ready for the next launch (kernel boundaries order it) */
}

/* channel c's conv window (K - 1 taps of cst, oldest first) advanced by its input xin, from the old window
 * held in registers */
template <int KW>
__device__ __forceinline__ void win_advance(float *cst, int C, int c, const float (&win)[KW], float xin,
                                            int K) {
#pragma unroll
    for (int t = 0; t < KW - 1; t++)
        if (t < K - 1) cst[(size_t)t * C + c] = t + 1 < K - 1 ? win[t + 1] : xin;
}

/* one conv channel's output y (channel idx of the block: q below dk, k below 2 dk, else the block's values)
 * into shared memory; a value channel's window advanced by its input xin (its block owns it; the q / k windows
 * are shared by the key head's blocks and written once they have all read them) */
template <int KW>
__device__ __forceinline__ void conv_put(int idx, int dk, float y, float *q, float *k, float *vs, float *cst,
                                         int C, int c, const float (&win)[KW], float xin, int K) {
    if (idx < dk) {
        q[idx] = y;
    } else if (idx < 2 * dk) {
        k[idx - dk] = y;
    } else {
        vs[idx - 2 * dk] = y;
        win_advance(cst, C, c, win, xin, K);
    }
}

/* The fused decode kernel one block a value head (cu_gdn_args.dec_wide, CINFER_CUDA_GDN_WIDE; dk <= 128,
 * dv <= 128 and a multiple of 4, conv width K <= KW = 4 — Qwen3.5's; wider windows spill): for steps too
 * large for the clusters, where the state's traffic is the cost. fused_decode_kernel gives a block 32
 * columns (16 KB of S at the 4B shape): at batch 64 its 8,192 blocks a layer each hold their bytes in flight
 * only until a chain of barriers (conv, norms, the update, the counter, the last block's gated norm) starts
 * (DRAM at 29% of its peak, ncu, H200), and the q / k conv and l2norms run once per block, rr x dv/32 times a
 * key head. Here a thread keeps four adjacent columns (a warp reads a whole 512-byte row of S by one float4
 * load) for the same row group g (rows g, g + 8, ...), so a block holds the head's whole S (64 KB) and
 * every column's sums keep rec_token's operands and order: the read-out's partial per group by fmaf over t,
 * the 8 partials added in group order from 0.0f, the update and the output's partials likewise. The block
 * owns its head's outputs, so the gated norm (gnorm_warp's order, from shared memory) needs no fence, counter
 * or re-read; the counter is left only for the key head's q / k conv windows, which the group's rr blocks all
 * read and its last one writes (from its registers). The same bits as the four kernels
 * (tests/unit/test_cuda_fused.c). 4B batch 64 6,650 -> 7,400 tok/s (H200 session 14; bench/RESULTS.md).
 * Measured and not kept (every one the same bits, slower in the step): the blocks persistent, each item's S
 * brought into shared memory by bulk copies issued while the item before it ran (4B b64 7,350 tok/s: the
 * time is the per-item chain, 39% of ncu's warp samples at barriers, not the loads' latency); every warp
 * forming the two l2norm factors itself, z and the norm weight staged in shared memory (one barrier and one
 * round trip fewer, but 128 registers and a spill: 7,270 / 7,305 against 7,413 / 7,404 in the same call);
 * __ldcg / __stcg (st.global.cg.v4) for S: 7,210 / 7,220. */
template <int R, int KW>
__global__ void __launch_bounds__(256, 2) fused_decode_wide_kernel(cu_gdn_args a) {
    __shared__ __align__(16) float red[REC_GROUPS][128];
    __shared__ __align__(16) float red2[REC_GROUPS][128];
    __shared__ __align__(16) float q[128], k[128], vs[128], ob[128];
    __shared__ float bgs[2];
    __shared__ int last;
    int e = blockIdx.z;
    int en = a.meta.e_n[e], elen = a.meta.e_len[e], r = a.meta.e_row0[e], slot = a.meta.e_slot[e];
    if (!(en == 1 && elen > 0)) { /* every block waits (fused_decode_kernel's rule) */
        griddep_wait();
        return;
    }
    int h = blockIdx.y, tid = threadIdx.x, lane = tid & 31, g = tid >> 5;
    int dk = a.dk, dv = a.dv, K = a.K, C = a.C, rr = a.Hv / a.Hk, kh = h / rr, kd = a.Hk * dk;
    int j0 = 4 * lane, ok = j0 < dv; /* dv % 4 == 0: a thread's four columns exist together or not at all */
    /* before griddep_wait: this layer's S of the head and the conv windows and weights (nothing of the step
     * writes them before this kernel) */
    float *S = a.rec_state + (((size_t)slot * a.n_lin + a.lin) * a.Hv + h) * (size_t)dk * dv + j0;
    float4 sv[R];
#pragma unroll
    for (int t = 0; t < R; t++) {
        int i = g + REC_GROUPS * t;
        sv[t] = i < dk && ok ? *reinterpret_cast<const float4 *>(S + (size_t)i * dv)
                             : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    /* conv channels: idx < dk q (key head kh), < 2 dk k, then the head's dv values; idx = tid and tid + 256 */
    float *cst = a.conv_state + ((size_t)slot * a.n_lin + a.lin) * (size_t)(K - 1) * C;
    int nc = 2 * dk + dv;
    float win[2][KW], wt[2][KW], wl[2] = {0.0f, 0.0f};
    int ch[2];
#pragma unroll
    for (int u = 0; u < 2; u++) {
        int idx = tid + 256 * u, in = idx < nc;
        ch[u] = idx < dk       ? kh * dk + idx
                : idx < 2 * dk ? kd + kh * dk + (idx - dk)
                               : 2 * kd + h * dv + (idx - 2 * dk);
#pragma unroll
        for (int t = 0; t < KW; t++) {
            win[u][t] = t < K - 1 && in ? cst[(size_t)t * C + ch[u]] : 0.0f;
            wt[u][t] = t < K - 1 && in ? a.conv_w[(size_t)t * C + ch[u]] : 0.0f;
        }
        if (in) wl[u] = a.conv_w[(size_t)(K - 1) * C + ch[u]];
    }
    griddep_wait();   /* the in_proj row */
    griddep_launch(); /* out_proj may start requesting its weights */
    if (tid == 64) {
        bgs[0] = gdn_beta(a.b[(size_t)r * a.ba_ld + h]);
        bgs[1] = gdn_gate(a, a.a[(size_t)r * a.ba_ld + h], h);
    }
    const float *xrow = a.qkv + (size_t)r * a.qkv_ld;
    float xin[2];
#pragma unroll
    for (int u = 0; u < 2; u++) {
        int idx = tid + 256 * u;
        xin[u] = 0.0f;
        if (idx >= nc) continue;
        xin[u] = xrow[ch[u]];
        float y = conv_tap(wt[u], win[u], wl[u], xin[u], K);
        conv_put(idx, dk, y, q, k, vs, cst, C, ch[u], win[u], xin[u], K);
    }
    __syncthreads(); /* every q / k window read of this block is consumed */
    unsigned *cnt = a.dec_cnt + (size_t)e * a.Hk + kh;
    if (tid == 0) last = atomicAdd(cnt, 1u) == (unsigned)rr - 1u;
    if (g == 0) l2norm_warp(q, q, dk, 1, lane);
    if (g == 1) l2norm_warp(k, k, dk, 0, lane);
    __syncthreads();
    float decay = expf(bgs[1]), beta = bgs[0];
    float4 m = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int t = 0; t < R; t++) {
        int i = g + REC_GROUPS * t;
        if (i < dk) {
            float ki = k[i];
            sv[t].x = __fmul_rn(sv[t].x, decay), m.x = fmaf(ki, sv[t].x, m.x);
            sv[t].y = __fmul_rn(sv[t].y, decay), m.y = fmaf(ki, sv[t].y, m.y);
            sv[t].z = __fmul_rn(sv[t].z, decay), m.z = fmaf(ki, sv[t].z, m.z);
            sv[t].w = __fmul_rn(sv[t].w, decay), m.w = fmaf(ki, sv[t].w, m.w);
        }
    }
    *reinterpret_cast<float4 *>(&red[g][j0]) = m;
    __syncthreads();
    float4 mm = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int t = 0; t < REC_GROUPS; t++) {
        float4 p = *reinterpret_cast<const float4 *>(&red[t][j0]);
        mm.x += p.x, mm.y += p.y, mm.z += p.z, mm.w += p.w;
    }
    float4 v4 = ok ? *reinterpret_cast<const float4 *>(&vs[j0]) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 mj = make_float4(beta * (v4.x - mm.x), beta * (v4.y - mm.y), beta * (v4.z - mm.z),
                            beta * (v4.w - mm.w));
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int t = 0; t < R; t++) {
        int i = g + REC_GROUPS * t;
        if (i < dk) {
            float ki = k[i], qi = q[i];
            sv[t].x = fmaf(ki, mj.x, sv[t].x), o.x = fmaf(qi, sv[t].x, o.x);
            sv[t].y = fmaf(ki, mj.y, sv[t].y), o.y = fmaf(qi, sv[t].y, o.y);
            sv[t].z = fmaf(ki, mj.z, sv[t].z), o.z = fmaf(qi, sv[t].z, o.z);
            sv[t].w = fmaf(ki, mj.w, sv[t].w), o.w = fmaf(qi, sv[t].w, o.w);
        }
    }
    *reinterpret_cast<float4 *>(&red2[g][j0]) = o;
#pragma unroll
    for (int t = 0; t < R; t++) {
        int i = g + REC_GROUPS * t;
        /* a plain float4 assignment: nvcc 13 emits four scalar stores here (ncu counts 4x the sectors), which
         * measured faster in the step than one st.global.cg.v4 (__stcg) with __ldcg loads: 4B b64 7,390 /
         * 7,215 tok/s (H200 session 14, calls 1 and 6, bench/cuda-2026-12-02-s14) */
        if (i < dk && ok) *reinterpret_cast<float4 *>(S + (size_t)i * dv) = sv[t];
    }
    __syncthreads();
    if (g == 0) {
        float4 oo = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int t = 0; t < REC_GROUPS; t++) {
            float4 p = *reinterpret_cast<const float4 *>(&red2[t][j0]);
            oo.x += p.x, oo.y += p.y, oo.z += p.z, oo.w += p.w;
        }
        *reinterpret_cast<float4 *>(&ob[j0]) = oo;
        __syncwarp();
        gnorm_warp<false>(ob, a.o + (size_t)r * a.Hv * dv + (size_t)h * dv,
                          a.z + (size_t)r * a.z_ld + (size_t)h * dv, a.gnorm, dv, a.eps, lane);
    }
    if (last) {
        /* the key head's new q / k windows (every block of the group has read the old ones: its counter
         * add came after its barrier above), from this thread's registers: the same values every block read */
#pragma unroll
        for (int u = 0; u < 2; u++) {
            int idx = tid + 256 * u;
            if (idx < 2 * dk && idx < nc) win_advance(cst, C, ch[u], win[u], xin[u], K);
        }
        if (tid == 0) *cnt = 0u; /* ready for the next launch (kernel boundaries order it) */
    }
}

/* The fused decode kernel as thread block clusters (sm_90; cu_gdn_args.dec_cluster, CINFER_CUDA_GDN_CLUSTER):
 * fused_decode_kernel's grid and block layout, the rr x dv/32 blocks of a key head's group one cluster
 * (dims dv/32 x rr). What changes is the chain of dependent steps at batch 1 (one block per SM, nothing
 * hides a round trip), never a value: the same conv_tap, l2norm factor, gates, per-token update and gated
 * norm on the same operands in the same order, so the same bits (tests/unit/test_cuda_fused.c):
 *  - every channel's window and weights (the second iteration's too: 2 dk + 32 channels over 256 threads)
 *    and the gated norm's weight are loaded before griddep_wait; after it one round of loads (the in_proj
 *    row's inputs, b, a, z);
 *  - q / k stay un-normed in shared memory: each warp forms the two l2norm factors itself (l2inv_warp, as
 *    l2norm_warp does) and each thread scales its rows on the fly (the same products), one barrier fewer;
 *  - the single-token update: every thread sums the read-out's 8 partials itself (g == 0's sum, in its
 *    order), and the output's partials go to a second buffer: 2 barriers where rec_token has 4;
 *  - the gated norm's sum of squares: warp 0 of each block puts its 32 outputs into the shared memory of
 *    every column block of its head (distributed shared memory), one cluster barrier, then lane l sums
 *    o[l], o[l + 32], ... by fmaf as gnorm_warp does and each block normalizes its own columns; o is written
 *    once, normed (was: written, fenced, a global counter, the last block re-reading it);
 *  - the q / k conv windows: every block of the cluster has read them before the cluster barrier; after it
 *    the group's first block writes the new ones from its registers (no loads);
 *  - S is stored after the cluster barrier, whose release would otherwise wait for those stores. */
/* %globaltimer (ns), for CINFER_CUDA_GDN_STAMPS */
__device__ __forceinline__ unsigned long long gdn_now(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

template <int R> struct gdn_cl {
    /* channels per thread: 2 dk + 32 over 256 threads, dk <= 8 R */
    static constexpr int NIT = (16 * R + 32 + 255) / 256;
};

/* the row-scaled products of the update (rec_token's, with q / k normed on the fly: qn = (q inv_q) scale,
 * kn = k inv_k, l2norm_warp's products) for one token, S in registers; returns the output column (warp 0's
 * lanes; others 0) */
template <int R>
__device__ __forceinline__ float rec_token1(float *sv, const float *q, const float *k, float invq, float invk,
                                            float scale, float vj, float decay, float beta, int g, int jj,
                                            int ok, int dk, float (*red)[32], float (*red2)[32], int stamp,
                                            unsigned long long &t_mid) {
    float kn[R], m = 0.0f;
#pragma unroll
    for (int t = 0; t < R; t++) {
        int i = g + REC_GROUPS * t;
        kn[t] = 0.0f;
        if (i < dk && ok) {
            kn[t] = __fmul_rn(k[i], invk);
            sv[t] = __fmul_rn(sv[t], decay);
            m = fmaf(kn[t], sv[t], m);
        }
    }
    red[g][jj] = m;
    __syncthreads();
    if (stamp) t_mid = gdn_now(); /* CINFER_CUDA_GDN_STAMPS: the read-out's partials joined */
    float mm = 0.0f;
    for (int t = 0; t < REC_GROUPS; t++) mm += red[t][jj];
    float mj = beta * ((ok ? vj : 0.0f) - mm), o = 0.0f;
#pragma unroll
    for (int t = 0; t < R; t++) {
        int i = g + REC_GROUPS * t;
        if (i < dk && ok) {
            float qn = __fmul_rn(__fmul_rn(q[i], invq), scale);
            sv[t] = fmaf(kn[t], mj, sv[t]);
            o = fmaf(qn, sv[t], o);
        }
    }
    red2[g][jj] = o;
    __syncthreads();
    float oo = 0.0f;
    if (g == 0)
        for (int t = 0; t < REC_GROUPS; t++) oo += red2[t][jj];
    return oo;
}

/* the split cluster barrier (every thread of every block of the cluster executes both, converged) */
__device__ __forceinline__ void cl_arrive_relaxed(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void cl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
#endif
}

#define GDN_CL_MAXX 8 /* column blocks of a head a cluster holds: dv <= 256 */
/* KW: the conv arrays' size (4 for Qwen3.5's K = 4: registers for 3 taps, not CONV_MAXK - 1) */
template <int R, int KW>
__global__ void __launch_bounds__(256, R <= 16 ? 3 : 0) fused_decode_cluster_kernel(cu_gdn_args a) {
    constexpr int NIT = gdn_cl<R>::NIT;
    __shared__ float q[256], k[256], red[REC_GROUPS][32], red2[REC_GROUPS][32];
    __shared__ float vs[32], bgs[2], ob[GDN_CL_MAXX][32];
    int e = blockIdx.z;
    /* CINFER_CUDA_GDN_STAMPS: thread 0 of block (0, 0, 0) reads the clock at the phase boundaries */
    int stamp = a.dec_stamps && !(blockIdx.x | blockIdx.y | blockIdx.z | threadIdx.x);
    unsigned long long ts[CU_GDN_STAMPS] = {0};
    if (stamp) ts[0] = gdn_now();
    /* the entry's metadata in one round of loads (the state's address waits for the slot) */
    int en = a.meta.e_n[e], elen = a.meta.e_len[e], r = a.meta.e_row0[e], slot = a.meta.e_slot[e];
    /* a cluster is one entry: all its blocks return here or none */
    if (!(en == 1 && elen > 0)) {
        griddep_wait();
        return;
    }
    int h = blockIdx.y, jj = threadIdx.x & 31, g = threadIdx.x >> 5, j0 = blockIdx.x * 32, j = j0 + jj;
    int dk = a.dk, dv = a.dv, K = a.K, C = a.C, tid = threadIdx.x, rr = a.Hv / a.Hk;
    int kh = h / rr, kd = a.Hk * dk;
    int ok = j < dv, nv = dv - j0 < 32 ? dv - j0 : 32, nc = 2 * dk + nv;
    /* before griddep_wait: S, the windows, the conv and norm weights (fused_decode_kernel's rule) */
    float *S = a.rec_state + (((size_t)slot * a.n_lin + a.lin) * a.Hv + h) * (size_t)dk * dv + j;
    float sv[R];
#pragma unroll
    for (int t = 0; t < R; t++) {
        int i = g + REC_GROUPS * t;
        sv[t] = i < dk && ok ? S[(size_t)i * dv] : 0.0f;
    }
    float *cst = a.conv_state + ((size_t)slot * a.n_lin + a.lin) * (size_t)(K - 1) * C;
    const float *xrow = a.qkv + (size_t)r * a.qkv_ld;
    float win[NIT][KW], wt[NIT][KW], wl[NIT], xin[NIT];
    int ch[NIT];
#pragma unroll
    for (int it = 0; it < NIT; it++) {
        int idx = tid + 256 * it, in = idx < nc;
        ch[it] = !in            ? 0
                 : idx < dk     ? kh * dk + idx
                 : idx < 2 * dk ? kd + kh * dk + (idx - dk)
                                : 2 * kd + h * dv + j0 + (idx - 2 * dk);
#pragma unroll
        for (int t = 0; t < KW; t++) {
            win[it][t] = t < K - 1 && in ? cst[(size_t)t * C + ch[it]] : 0.0f;
            wt[it][t] = t < K - 1 && in ? a.conv_w[(size_t)t * C + ch[it]] : 0.0f;
        }
        wl[it] = in ? a.conv_w[(size_t)(K - 1) * C + ch[it]] : 0.0f;
    }
    float gw = g == 0 && ok ? a.gnorm[j] : 0.0f;
    /* the cluster's first barrier phase: every block has started before any writes into another's shared
     * memory (arrive now, wait just before those writes) */
    cl_arrive_relaxed();
    griddep_wait();   /* the in_proj row */
    griddep_launch(); /* out_proj may start requesting its weights */
    if (stamp) ts[1] = gdn_now();
#pragma unroll
    for (int it = 0; it < NIT; it++) xin[it] = tid + 256 * it < nc ? xrow[ch[it]] : 0.0f;
    float zj = g == 0 && ok ? a.z[(size_t)r * a.z_ld + (size_t)h * dv + j] : 0.0f;
    if (tid == 64) {
        bgs[0] = gdn_beta(a.b[(size_t)r * a.ba_ld + h]);
        bgs[1] = gdn_gate(a, a.a[(size_t)r * a.ba_ld + h], h);
    }
#pragma unroll
    for (int it = 0; it < NIT; it++) {
        int idx = tid + 256 * it;
        if (idx >= nc) continue;
        conv_put(idx, dk, conv_tap(wt[it], win[it], wl[it], xin[it], K), q, k, vs, cst, C, ch[it], win[it],
                 xin[it], K);
    }
    __syncthreads();
    if (stamp) ts[2] = gdn_now();
    float invq = l2inv_warp(q, dk, jj), invk = l2inv_warp(k, dk, jj);
    float scale =
        a.dec_qscale; /* l2norm_warp's factor, from the host (no f64 sequence on the critical path) */
    float decay = expf(bgs[1]), beta = bgs[0];
    float vj = ok ? vs[jj] : 0.0f;
    float sz = dev_silu(zj); /* the gated norm's gate, off the path after the cluster barrier */
    if (stamp) ts[3] = gdn_now();
    float oo =
        rec_token1<R>(sv, q, k, invq, invk, scale, vj, decay, beta, g, jj, ok, dk, red, red2, stamp, ts[4]);
    if (stamp) ts[5] = gdn_now();
    /* warp 0: this block's 32 outputs into slot blockIdx.x of every column block of the head (x fastest in
     * the cluster's block rank) */
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    cl_wait();
    if (g == 0) {
        unsigned me = cl.block_rank(), nbx = gridDim.x;
        for (unsigned b = 0; b < nbx; b++) {
            float *dst = cl.map_shared_rank(&ob[blockIdx.x][jj], me - blockIdx.x + b);
            *dst = oo;
        }
    }
    if (stamp) ts[6] = gdn_now();
    cl.sync(); /* every output of the group in place; every block has read the q / k windows */
    if (stamp) ts[7] = gdn_now();
        /* the state after the barrier: its arrival (a release) would otherwise wait for these 16 stores a
         * thread (H200 call 3: ~1 us of the kernel's 5 after the PDL wait went to sending the outputs and the
         * barrier) */
#pragma unroll
    for (int t = 0; t < R; t++) {
        int i = g + REC_GROUPS * t;
        if (i < dk && ok) S[(size_t)i * dv] = sv[t];
    }
    if (g == 0) {
        float ss = 0.0f;
        for (int b = 0; b * 32 + jj < dv; b++) ss = fmaf(ob[b][jj], ob[b][jj], ss); /* gnorm_warp's order */
        ss = warp_sum(ss);
        float inv = 1.0f / sqrtf(ss / (float)dv + a.eps);
        if (ok) a.o[(size_t)r * a.Hv * dv + (size_t)h * dv + j] = ((oo * inv) * gw) * sz;
    }
    if (blockIdx.x == 0 && h == kh * rr) {
#pragma unroll
        for (int it = 0; it < NIT; it++) {
            int idx = tid + 256 * it;
            if (idx >= 2 * dk) continue;
#pragma unroll
            for (int t = 0; t < KW - 1; t++)
                if (t < K - 1) cst[(size_t)t * C + ch[it]] = t + 1 < K - 1 ? win[it][t + 1] : xin[it];
        }
    }
    if (stamp) {
        ts[8] = gdn_now();
        unsigned long long i = atomicAdd(a.dec_stamps, 1ull);
        if (i < CU_GDN_STAMP_CAP)
            for (int x = 0; x < CU_GDN_STAMPS; x++) a.dec_stamps[1 + i * CU_GDN_STAMPS + x] = ts[x];
    }
}

/* The clustered kernel's second form (cu_gdn_args.dec_cluster == 2, forward_cuda's default): the same
 * values in the same order (conv_tap, l2inv_warp's sums, gdn_beta / gdn_gate, rec_token1, gnorm_warp's sums),
 * with a shorter chain after the PDL wait:
 *  - warp 0 runs the conv of the key head's dk q channels (lane l: channels l, l + 32, ..., l2inv_warp's
 *    order) and forms the l2norm factor from its registers, warp 1 the same for k, warp 2 the block's value
 *    channels, warps 3 / 4 beta / the decay: one barrier joins them (was: the conv, a barrier, every warp
 *    re-reading q and k for the two factors);
 *  - every kernel parameter, pointer and weight the post-wait part uses (A, dt_bias, the gated norm's weight)
 *    is read before the wait;
 *  - the outputs go to the head's column blocks by st.async onto an mbarrier in each (complete_tx), and a
 *    block waits only for its own 32 x dv/32 words: no cluster-wide barrier after the update (cl.sync() is
 *    a MEMBAR.ALL.GPU and a cluster arrive / wait in SASS), so nothing waits for the state's stores, which
 *    are issued right after the update;
 *  - the group's q / k conv windows are written by its first block once every block of the cluster has
 *    arrived on that block's second mbarrier after its last use of them;
 *  - S walked by one pointer without predicates where every row and column exists (FULL). */
__device__ __forceinline__ unsigned gdn_smem_addr(const void *p) {
    return (unsigned)__cvta_generic_to_shared(p);
}
/* the same shared-memory word in block `rank` of the cluster */
__device__ __forceinline__ unsigned gdn_mapa(unsigned addr, unsigned rank) {
    unsigned r = addr;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
#endif
    return r;
}
__device__ __forceinline__ void gdn_mb_init(unsigned bar, unsigned count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void gdn_mb_init_fence(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
__device__ __forceinline__ void gdn_mb_expect(unsigned bar, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
/* 4 bytes into another block's shared memory, counted on that block's mbarrier */
__device__ __forceinline__ void gdn_st_async(unsigned raddr, float v, unsigned rbar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(raddr),
                 "r"(__float_as_uint(v)), "r"(rbar)
                 : "memory");
#endif
}
/* relaxed: a release here is a GPU-scope MEMBAR (H200 call 1: cl.sync()'s MEMBAR.ALL.GPU held the first
 * form's warps); what it announces, loads whose values were consumed before a __syncthreads, is done without
 * one */
__device__ __forceinline__ void gdn_mb_arrive_remote(unsigned rbar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.relaxed.cluster.shared::cluster.b64 _, [%0];" ::"r"(rbar) : "memory");
#endif
}
/* wait for phase 0 of a local mbarrier (CL: acquire at cluster scope, for remote arrivals' releases) */
template <bool CL> __device__ __forceinline__ void gdn_mb_wait0(unsigned bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    unsigned done = 0;
    while (!done) {
        if (CL)
            asm volatile("{\n\t.reg .pred p;\n\t"
                         "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], 0;\n\t"
                         "selp.u32 %0, 1, 0, p;\n\t}"
                         : "=r"(done)
                         : "r"(bar)
                         : "memory");
        else
            asm volatile("{\n\t.reg .pred p;\n\t"
                         "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n\t"
                         "selp.u32 %0, 1, 0, p;\n\t}"
                         : "=r"(done)
                         : "r"(bar)
                         : "memory");
    }
#endif
}
/* keep a value computed (kernel parameters: constant-bank reads) before the PDL wait */
template <class T> __device__ __forceinline__ void gdn_pin(T *&p) {
    asm volatile("" : "+l"(p));
}
__device__ __forceinline__ void gdn_pin(float &x) {
    asm volatile("" : "+f"(x));
}
__device__ __forceinline__ void gdn_pin(int &x) {
    asm volatile("" : "+r"(x));
}

/* The conv windows, conv weights and the small per-head weights are read with an L2 evict_last policy (and
 * the windows written with it), before S: the kernel's blocks become resident in in_proj's tail, when DRAM is
 * busy with its weights (H200 session 9 call 3: 0.06 us from the PDL wait to the in_proj row, an L2 hit,
 * then 1.29 us to warp 0's conv + l2norm factor, whose inputs were requested ~2 us earlier; call 4: 4B b1
 * +0.8%, 35B-A3B +0.7% against the same form without the policy and with S read first, since removed) */
__device__ __forceinline__ float gdn_ld(const float *p, unsigned long long pol) {
    float v;
    asm volatile("ld.global.L2::cache_hint.f32 %0, [%1], %2;" : "=f"(v) : "l"(p), "l"(pol) : "memory");
    return v;
}
__device__ __forceinline__ void gdn_st(float *p, float v, unsigned long long pol) {
    asm volatile("st.global.L2::cache_hint.f32 [%0], %1, %2;" ::"l"(p), "f"(v), "l"(pol) : "memory");
}

/* fused_decode_cluster2_kernel's shared memory */
struct gdn_cl2_smem {
    float q[256], k[256], red[REC_GROUPS][32], red2[REC_GROUPS][32];
    float vs[32], bgs[2], invs[2], ob[GDN_CL_MAXX][32];
    unsigned long long mb[2]; /* [0] the head's outputs arrived, [1] the group's windows read */
};

/* rec_token1's arithmetic with kn = k inv_k formed again in the second half (the same product: no registers
 * held across the barrier for it); FULL: every row of the block's columns exists (dk = 8 R, 32 columns), no
 * predicates */
template <int R, bool FULL>
__device__ __forceinline__ float rec_token1f(float *sv, const float *q, const float *k, float invq,
                                             float invk, float scale, float vj, float decay, float beta,
                                             int g, int jj, int ok, int dk, float (*red)[32],
                                             float (*red2)[32], int stamp, unsigned long long &t_mid) {
    float m = 0.0f;
#pragma unroll
    for (int t = 0; t < R; t++) {
        int i = g + REC_GROUPS * t;
        if (FULL || (i < dk && ok)) {
            sv[t] = __fmul_rn(sv[t], decay);
            m = fmaf(__fmul_rn(k[i], invk), sv[t], m);
        }
    }
    red[g][jj] = m;
    __syncthreads();
    if (stamp) t_mid = gdn_now();
    float mm = 0.0f;
    for (int t = 0; t < REC_GROUPS; t++) mm += red[t][jj];
    float mj = beta * ((ok ? vj : 0.0f) - mm), o = 0.0f;
#pragma unroll
    for (int t = 0; t < R; t++) {
        int i = g + REC_GROUPS * t;
        if (FULL || (i < dk && ok)) {
            float qn = __fmul_rn(__fmul_rn(q[i], invq), scale);
            sv[t] = fmaf(__fmul_rn(k[i], invk), mj, sv[t]);
            o = fmaf(qn, sv[t], o);
        }
    }
    red2[g][jj] = o;
    __syncthreads();
    float oo = 0.0f;
    if (g == 0)
        for (int t = 0; t < REC_GROUPS; t++) oo += red2[t][jj];
    return oo;
}

/* one block of fused_decode_cluster2_kernel; FULL: dk = 8 R and 32 value columns (every Qwen3.5 shape), so
 * the state's rows are walked by one pointer without predicates (H200 call 1, ncu source counters of the
 * first form: each predicated store of S re-formed its 64-bit address, ~23 instructions, 370 of the ~510
 * after the cluster barrier) */
template <int R, int KW, bool ST, bool FULL>
__device__ __forceinline__ void gdn_cl2_body(const cu_gdn_args &a, gdn_cl2_smem &sm) {
    constexpr int NQ = (REC_GROUPS * R + 31) / 32; /* q (k) channels per lane of warp 0 (1): dk <= 8 R */
    int e = blockIdx.z;
    /* ST: the CINFER_CUDA_GDN_STAMPS instantiation (else no clock reads and no registers for them) */
    int stamp = ST && a.dec_stamps && !(blockIdx.x | blockIdx.y | blockIdx.z | threadIdx.x);
    unsigned long long ts[CU_GDN_STAMPS] = {0};
    if (stamp) ts[0] = gdn_now();
    int en = a.meta.e_n[e], elen = a.meta.e_len[e], r = a.meta.e_row0[e], slot = a.meta.e_slot[e];
    if (!(en == 1 && elen > 0)) { /* a cluster is one entry: all its blocks return here or none */
        griddep_wait();
        return;
    }
    int h = blockIdx.y, jj = threadIdx.x & 31, g = threadIdx.x >> 5, j0 = blockIdx.x * 32, j = j0 + jj;
    /* KW 4 is launched for K = 4 only: a constant, so the unused fourth tap takes no registers */
    int dk = FULL ? REC_GROUPS * R : a.dk, dv = a.dv, K = KW == 4 ? 4 : a.K, C = a.C, tid = threadIdx.x;
    int rr = a.Hv / a.Hk, kh = h / rr, kd = a.Hk * dk, nbx = gridDim.x;
    int ok = FULL || j < dv, nv = FULL ? 32 : (dv - j0 < 32 ? dv - j0 : 32);
    unsigned mb_out = gdn_smem_addr(&sm.mb[0]), mb_rd = gdn_smem_addr(&sm.mb[1]);
    if (tid == 0) {
        gdn_mb_init(mb_out, 1);
        gdn_mb_init(mb_rd, (unsigned)(rr * nbx));
        gdn_mb_init_fence();
        gdn_mb_expect(mb_out, (unsigned)(nbx * 32 * 4)); /* every column block of the head sends 32 words */
    }
    /* row g of this thread's column; rows g + 8 t follow at a stride of 8 dv */
    float *Sp =
        a.rec_state + (((size_t)slot * a.n_lin + a.lin) * a.Hv + h) * (size_t)dk * dv + j + (size_t)g * dv;
    const size_t sst = (size_t)REC_GROUPS * dv;
    gdn_pin(Sp); /* one address kept in registers, not formed again per row */
    float sv[R];
    unsigned long long pol;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
    float *cst = a.conv_state + ((size_t)slot * a.n_lin + a.lin) * (size_t)(K - 1) * C;
    const float *xrow = a.qkv + (size_t)r * a.qkv_ld;
    /* warps 0 / 1: q / k channel kh dk + l + 32 u; warp 2: value channel j (lane < nv) in slot 0 */
    float win[NQ][KW], wt[NQ][KW], wl[NQ], xin[NQ];
    int ch[NQ];
#pragma unroll
    for (int u = 0; u < NQ; u++) {
        int i = jj + 32 * u, in = g == 2 ? u == 0 && jj < nv : g < 2 && i < dk;
        ch[u] = !in ? 0 : g == 0 ? kh * dk + i : g == 1 ? kd + kh * dk + i : 2 * kd + h * dv + j;
#pragma unroll
        for (int t = 0; t < KW; t++) {
            win[u][t] = t < K - 1 && in ? gdn_ld(cst + (size_t)t * C + ch[u], pol) : 0.0f;
            wt[u][t] = t < K - 1 && in ? gdn_ld(a.conv_w + (size_t)t * C + ch[u], pol) : 0.0f;
        }
        wl[u] = in ? gdn_ld(a.conv_w + (size_t)(K - 1) * C + ch[u], pol) : 0.0f;
    }
    float gw = g == 0 && ok ? gdn_ld(a.gnorm + j, pol) : 0.0f;
    float Ah = 0.0f, dth = 0.0f;
    if (g == 4 && jj == 0) Ah = gdn_ld(a.A + h, pol), dth = gdn_ld(a.dt_bias + h, pol);
    { /* S after the conv's inputs */
        const float *p = Sp;
#pragma unroll
        for (int t = 0; t < R; t++, p += sst) {
            int i = g + REC_GROUPS * t;
            sv[t] = FULL || (i < dk && ok) ? *p : 0.0f;
        }
    }
    const void *zp = a.z + (size_t)r * a.z_ld + (size_t)h * dv + j;
    const void *bp = a.b + (size_t)r * a.ba_ld + h, *ap = a.a + (size_t)r * a.ba_ld + h;
    float eps = a.eps, scale = a.dec_qscale;
    gdn_pin(zp), gdn_pin(bp), gdn_pin(ap), gdn_pin(eps), gdn_pin(scale);
    /* the first barrier phase: every block has started and set up its mbarriers before any remote write */
    cl_arrive_relaxed();
    griddep_wait();   /* the in_proj row */
    griddep_launch(); /* out_proj may start requesting its weights */
    if (stamp) ts[1] = gdn_now();
    float zj = 0.0f;
    if (g < 3) {
#pragma unroll
        for (int u = 0; u < NQ; u++) {
            int i = jj + 32 * u, in = g == 2 ? u == 0 && jj < nv : i < dk;
            xin[u] = in ? xrow[ch[u]] : 0.0f;
        }
        if (g == 0 && ok) zj = *(const float *)zp;
        if (stamp) { /* the stamps: the row's first word arrived (a MOV that reads it waits for it) */
            float x0;
            asm volatile("mov.b32 %0, %1;" : "=f"(x0) : "f"(xin[0]));
            ts[2] = gdn_now() + (x0 != x0 ? 1 : 0);
        }
    }
    if (g < 2) {
        float ss = 0.0f;
        float *dst = g == 0 ? sm.q : sm.k;
#pragma unroll
        for (int u = 0; u < NQ; u++) {
            int i = jj + 32 * u;
            if (i < dk) {
                float y = conv_tap(wt[u], win[u], wl[u], xin[u], K);
                dst[i] = y;
                ss = fmaf(y, y, ss); /* l2inv_warp's order: i = lane, lane + 32, ... */
            }
        }
        ss = warp_sum(ss);
        if (jj == 0) sm.invs[g] = 1.0f / sqrtf(ss + 1e-6f);
    } else if (g == 2) {
        if (jj < nv) {
            float y = conv_tap(wt[0], win[0], wl[0], xin[0], K);
            sm.vs[jj] = y;
#pragma unroll
            for (int t = 0; t < KW - 1; t++) /* this block's own value channels: no other reads them */
                if (t < K - 1)
                    gdn_st(cst + (size_t)t * C + ch[0], t + 1 < K - 1 ? win[0][t + 1] : xin[0], pol);
        }
    } else if (g == 3 && jj == 0) { /* beta and the decay in two warps: two chains side by side */
        sm.bgs[0] = gdn_beta(*(const float *)bp);
    } else if (g == 4 && jj == 0) {
        sm.bgs[1] = expf(Ah * dev_softplus(*(const float *)ap + dth)); /* gdn_gate's value, then the decay */
    }
    __syncthreads();
    if (stamp) ts[3] = gdn_now(); /* warp 0's conv and l2norm factor, and the barrier that joins the warps */
    float invq = sm.invs[0], invk = sm.invs[1], decay = sm.bgs[1], beta = sm.bgs[0];
    float vj = ok ? sm.vs[jj] : 0.0f;
    float sz = dev_silu(zj);
    float oo = rec_token1f<R, FULL>(sv, sm.q, sm.k, invq, invk, scale, vj, decay, beta, g, jj, ok, dk, sm.red,
                                    sm.red2, stamp, ts[4]);
    if (stamp) ts[5] = gdn_now();
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    /* the group's first block is the cluster's rank 0 (x fastest, then the group's heads) */
    unsigned me = cl.block_rank();
    cl_wait(); /* the first phase: every block's mbarriers are set up */
    if (g == 0) {
        /* this block's 32 outputs into slot blockIdx.x of every column block of the head */
        unsigned src = gdn_smem_addr(&sm.ob[blockIdx.x][jj]);
        for (int b = 0; b < nbx; b++) {
            unsigned rank = me - blockIdx.x + (unsigned)b;
            gdn_st_async(gdn_mapa(src, rank), oo, gdn_mapa(mb_out, rank));
        }
        if (stamp) ts[6] = gdn_now();
    } else if (g == 1 && jj == 0) {
        /* this block's reads of the q / k windows are done: warps 0 / 1 consumed their values in the conv,
         * before the barriers since */
        gdn_mb_arrive_remote(gdn_mapa(mb_rd, 0));
    }
    {
        float *p = Sp;
#pragma unroll
        for (int t = 0; t < R; t++, p += sst) {
            int i = g + REC_GROUPS * t;
            if (FULL || (i < dk && ok)) *p = sv[t];
        }
    }
    if (g == 0) {
        gdn_mb_wait0<true>(mb_out);
        if (stamp) ts[7] = gdn_now();
        float ss = 0.0f;
        for (int b = 0; b * 32 + jj < dv; b++)
            ss = fmaf(sm.ob[b][jj], sm.ob[b][jj], ss); /* gnorm_warp's order */
        ss = warp_sum(ss);
        float inv = 1.0f / sqrtf(ss / (float)dv + eps);
        if (ok) a.o[(size_t)r * a.Hv * dv + (size_t)h * dv + j] = ((oo * inv) * gw) * sz;
    }
    if (me == 0 && g < 2) {
        gdn_mb_wait0<true>(mb_rd);
#pragma unroll
        for (int u = 0; u < NQ; u++) {
            if (jj + 32 * u >= dk) continue;
#pragma unroll
            for (int t = 0; t < KW - 1; t++)
                if (t < K - 1)
                    gdn_st(cst + (size_t)t * C + ch[u], t + 1 < K - 1 ? win[u][t + 1] : xin[u], pol);
        }
    }
    if (stamp) {
        ts[8] = gdn_now();
        unsigned long long i = atomicAdd(a.dec_stamps, 1ull);
        if (i < CU_GDN_STAMP_CAP)
            for (int x = 0; x < CU_GDN_STAMPS; x++) a.dec_stamps[1 + i * CU_GDN_STAMPS + x] = ts[x];
    }
}

/* registers capped for 3 blocks an SM where R <= 16, as fused_decode_cluster_kernel (H200 call 2: capped for
 * 2, no spills, 4B b1 / b2 406.2 / 635.9 tok/s against 403.3 / 646.5 and 400.5 / 641.4 with 3) */
template <int R, int KW, bool ST>
__global__ void __launch_bounds__(256, R <= 16 ? 3 : 0) fused_decode_cluster2_kernel(cu_gdn_args a) {
    __shared__ __align__(16) gdn_cl2_smem sm;
    if (a.dk == REC_GROUPS * R && (int)(blockIdx.x + 1) * 32 <= a.dv)
        gdn_cl2_body<R, KW, ST, true>(a, sm);
    else
        gdn_cl2_body<R, KW, ST, false>(a, sm);
}

/* Fused verify layer (cu_gdn_args.win_cnt): a whole layer in one launch when every entry is a speculative
 * window or one token continuing its sequence — the four kernels and the record kernel cost a verify step
 * four times the DeltaNet time of a decode step at the 4B shape (H200, 1.43 vs 0.35 ms).
 * fused_decode_kernel's layout (entry, value head, 32 value columns; 8 row groups), with the entry's n tokens
 * in shared memory (dynamic: spec_win x (2 dk + 34) floats). In order: the slot's deferred commit
 * (recurrent_kernel's replay loop), each (token, channel)'s conv + SiLU from its own K-1 inputs (the window's
 * rows, else the slot's conv state advanced by the kept tokens' recorded pre-conv rows: conv_kernel's window,
 * element for element), l2norm / beta / g per token (prep_kernel's functions), a window's records
 * (spec_record_kernel's values), rec_token over the tokens, then S and the conv windows where the unfused
 * path writes them (a decode token's; a window's only when a deferred commit was replayed into it), and the
 * gated norm of every row by the last block of the key head's group (win_cnt, as fused_decode_kernel). The
 * same device code on the same values: the same bits as the unfused path. */
/* V2 (cu_gdn_args.win_v2, CINFER_CUDA_SPEC_WINFUSED=2): the same values through the same device code, with
 * fewer dependent global round trips per block (at batch 1 one block per SM, nothing hides the latency): the
 * kept tokens' q / k / v / beta / g staged at once before the replay (was a load, a barrier and a load per
 * token); the conv by a thread per channel walking the tokens (conv_kernel's sliding window, its inputs and
 * weights loaded once: was a thread per (token, channel), n loads of the window), writing its value channels'
 * new windows from registers and staging the q / k channels' ones in shared memory for the group's last
 * block (was a second pass of loads); the gated norms of the group spread over all eight warps (was rr of
 * them, token after token); registers capped for four blocks per SM, as the decode kernel has (122 -> 64 at
 * dk 128, 4 bytes spilled): at batch 16 the grid is ~16 blocks per SM. */
template <int R, bool V2>
__global__ void __launch_bounds__(256, (V2 && R <= 16) ? 4 : 0) fused_window_kernel(cu_gdn_args a) {
    extern __shared__ float wsm[];
    __shared__ float red[REC_GROUPS][32], fin[32];
    __shared__ int last;
    int e = blockIdx.z, n = a.meta.e_n[e], spec = a.meta.e_spec[e];
    int h = blockIdx.y, jj = threadIdx.x & 31, g = threadIdx.x >> 5, j0 = blockIdx.x * 32, j = j0 + jj;
    int dk = a.dk, dv = a.dv, K = a.K, C = a.C, Hv = a.Hv, tid = threadIdx.x, rr = Hv / a.Hk;
    int r0 = a.meta.e_row0[e], slot = a.meta.e_slot[e], kh = h / rr, kd = a.Hk * dk;
    int ok = j < dv, nv = dv - j0 < 32 ? dv - j0 : 32, keep = a.meta.e_keep ? a.meta.e_keep[e] : 0;
    float *qs = wsm, *ks = qs + (size_t)a.spec_win * dk, *vs = ks + (size_t)a.spec_win * dk;
    float *bgs = vs + (size_t)a.spec_win * 32;
    float *qkw = bgs + 2 * (size_t)a.spec_win; /* V2: [K-1][2 dk] the q / k channels' new conv windows */
    size_t rf = CU_SPEC_REC(C, Hv);
    const float *prev = a.spec_rec + (size_t)(a.meta.e_par[e] ^ 1) * a.spec_buf +
                        ((size_t)slot * a.n_lin + a.lin) * a.spec_win * rf; /* the kept tokens' records */
    float *cst = a.conv_state + ((size_t)slot * a.n_lin + a.lin) * (size_t)(K - 1) * C;
    float *S = a.rec_state + (((size_t)slot * a.n_lin + a.lin) * Hv + h) * (size_t)dk * dv + j;
    float sv[R];
#pragma unroll
    for (int t = 0; t < R; t++) {
        int i = g + REC_GROUPS * t;
        sv[t] = i < dk && ok ? S[(size_t)i * dv] : 0.0f;
    }
    /* the deferred commit first (recurrent_kernel's replay: q / k of each kept token staged in qs / ks) */
    if (V2 && keep > 0) {
        for (int x = tid; x < keep * 2 * dk; x += blockDim.x) {
            int tt = x / (2 * dk), idx = x % (2 * dk);
            const float *post = prev + (size_t)tt * rf + C;
            if (idx < dk)
                qs[(size_t)tt * dk + idx] = post[(size_t)kh * dk + idx];
            else
                ks[(size_t)tt * dk + idx - dk] = post[kd + (size_t)kh * dk + idx - dk];
        }
        for (int x = tid; x < keep * 32; x += blockDim.x) {
            int tt = x / 32, jv = x % 32;
            vs[x] =
                j0 + jv < dv ? prev[(size_t)tt * rf + C + 2 * (size_t)kd + (size_t)h * dv + j0 + jv] : 0.0f;
        }
        for (int tt = tid; tt < keep; tt += blockDim.x) {
            const float *bg = prev + (size_t)tt * rf + 2 * (size_t)C;
            bgs[2 * tt] = bg[h], bgs[2 * tt + 1] = bg[Hv + h];
        }
        __syncthreads();
        for (int tt = 0; tt < keep; tt++) {
            float decay = expf(bgs[2 * tt + 1]), beta = bgs[2 * tt];
            float vj = ok ? vs[tt * 32 + jj] : 0.0f;
            rec_token<R>(sv, qs + (size_t)tt * dk, ks + (size_t)tt * dk, vj, decay, beta, g, jj, ok, dk, red,
                         fin, NULL); /* ends on a barrier: the stage is free for the conv below */
        }
    }
    for (int tt = 0; !V2 && tt < keep; tt++) {
        const float *post = prev + (size_t)tt * rf + C, *bg = post + C;
        for (int i = tid; i < dk; i += blockDim.x) {
            qs[i] = post[(size_t)kh * dk + i];
            ks[i] = post[kd + (size_t)kh * dk + i];
        }
        __syncthreads();
        float decay = expf(bg[Hv + h]), beta = bg[h];
        float vj = ok ? post[2 * (size_t)kd + (size_t)h * dv + j] : 0.0f;
        rec_token<R>(sv, qs, ks, vj, decay, beta, g, jj, ok, dk, red, fin, NULL);
    }
    if (keep > 0 && spec) {
#pragma unroll
        for (int t = 0; t < R; t++) {
            int i = g + REC_GROUPS * t;
            if (i < dk && ok) S[(size_t)i * dv] = sv[t];
        }
    }
    /* conv + SiLU of token t, channel c: input p (relative to the window's first row) is row r0 + p when
     * p >= 0, else element keep + K-1 + p of [conv state (K-1 rows) | kept pre-conv rows] */
    int nch = 2 * dk + nv, wr = !spec || keep > 0;
    for (int idx = tid; V2 && idx < nch; idx += blockDim.x) {
        int c = idx < dk       ? kh * dk + idx
                : idx < 2 * dk ? kd + kh * dk + (idx - dk)
                               : 2 * kd + h * dv + j0 + (idx - 2 * dk);
        float win[CONV_MAXK], wt[CONV_MAXK]; /* constant indices only: registers */
#pragma unroll
        for (int q = 0; q < CONV_MAXK - 1; q++) {
            float v = 0.0f, w = 0.0f;
            if (q < K - 1) { /* input q - (K-1): element keep + q of [conv state | kept pre-conv rows] */
                int b = keep + q;
                v = b < K - 1 ? cst[(size_t)b * C + c] : prev[(size_t)(b - (K - 1)) * rf + c];
                w = a.conv_w[(size_t)q * C + c];
            }
            win[q] = v, wt[q] = w;
        }
        win[CONV_MAXK - 1] = wt[CONV_MAXK - 1] = 0.0f;
        float wl = a.conv_w[(size_t)(K - 1) * C + c];
        for (int pass = 0; pass < 2; pass++) {
            /* pass 0: the tokens; the new window where the unfused path writes one: a window's committed
             * window (before its tokens), a decode token's advanced one (after) */
            if (wr && pass == (spec ? 0 : 1)) {
                if (idx < 2 * dk) {
#pragma unroll
                    for (int q = 0; q < CONV_MAXK - 1; q++)
                        if (q < K - 1) qkw[(size_t)q * 2 * dk + idx] = win[q];
                } else {
#pragma unroll
                    for (int q = 0; q < CONV_MAXK - 1; q++)
                        if (q < K - 1) cst[(size_t)q * C + c] = win[q];
                }
            }
            for (int t0 = 0; pass == 0 && t0 < n; t0 += 4) {
                float xv[4];
#pragma unroll
                for (int u = 0; u < 4; u++)
                    xv[u] = t0 + u < n ? a.qkv[(size_t)(r0 + t0 + u) * a.qkv_ld + c] : 0.0f;
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    int t = t0 + u;
                    if (t >= n) continue;
                    float y = conv_tap(wt, win, wl, xv[u], K);
                    if (idx < dk)
                        qs[(size_t)t * dk + idx] = y;
                    else if (idx < 2 * dk)
                        ks[(size_t)t * dk + idx - dk] = y;
                    else
                        vs[t * 32 + idx - 2 * dk] = y;
#pragma unroll
                    for (int q = 0; q + 1 < CONV_MAXK - 1; q++)
                        if (q + 1 < K - 1) win[q] = win[q + 1];
#pragma unroll
                    for (int q = 0; q < CONV_MAXK - 1; q++)
                        if (q == K - 2) win[q] = xv[u];
                }
            }
        }
    }
    for (int x = tid; !V2 && x < n * nch; x += blockDim.x) {
        int t = x / nch, idx = x % nch;
        int c = idx < dk       ? kh * dk + idx
                : idx < 2 * dk ? kd + kh * dk + (idx - dk)
                               : 2 * kd + h * dv + j0 + (idx - 2 * dk);
        float win[CONV_MAXK], wt[CONV_MAXK];
#pragma unroll
        for (int q = 0; q < CONV_MAXK - 1; q++) {
            float v = 0.0f, w = 0.0f;
            if (q < K - 1) {
                int p = t - (K - 1) + q, b = keep + (K - 1) + p;
                v = p >= 0      ? a.qkv[(size_t)(r0 + p) * a.qkv_ld + c]
                    : b < K - 1 ? cst[(size_t)b * C + c]
                                : prev[(size_t)(b - (K - 1)) * rf + c];
                w = a.conv_w[(size_t)q * C + c];
            }
            win[q] = v, wt[q] = w;
        }
        win[CONV_MAXK - 1] = wt[CONV_MAXK - 1] = 0.0f;
        float y =
            conv_tap(wt, win, a.conv_w[(size_t)(K - 1) * C + c], a.qkv[(size_t)(r0 + t) * a.qkv_ld + c], K);
        if (idx < dk)
            qs[(size_t)t * dk + idx] = y;
        else if (idx < 2 * dk)
            ks[(size_t)t * dk + idx - dk] = y;
        else
            vs[t * 32 + idx - 2 * dk] = y;
    }
    for (int t = tid; t < n; t += blockDim.x) {
        bgs[2 * t] = gdn_beta(a.b[(size_t)(r0 + t) * a.ba_ld + h]);
        bgs[2 * t + 1] = gdn_gate(a, a.a[(size_t)(r0 + t) * a.ba_ld + h], h);
    }
    __syncthreads();
    for (int task = g; task < 2 * n; task += REC_GROUPS) {
        float *x = (task & 1 ? ks : qs) + (size_t)(task >> 1) * dk;
        l2norm_warp(x, x, dk, !(task & 1), jj);
    }
    __syncthreads();
    if (spec) { /* the window's records: this block's value channels, its head's beta / g, and (one block per
                   key head) the q / k channels */
        float *dst = a.spec_rec + (size_t)a.meta.e_par[e] * a.spec_buf +
                     ((size_t)slot * a.n_lin + a.lin) * a.spec_win * rf;
        for (int x = tid; x < n * nv; x += blockDim.x) {
            int t = x / nv, jv = x % nv, c = 2 * kd + h * dv + j0 + jv;
            dst[(size_t)t * rf + c] = a.qkv[(size_t)(r0 + t) * a.qkv_ld + c];
            dst[(size_t)t * rf + C + c] = vs[t * 32 + jv];
        }
        if (blockIdx.x == 0)
            for (int t = tid; t < n; t += blockDim.x) {
                dst[(size_t)t * rf + 2 * (size_t)C + h] = bgs[2 * t];
                dst[(size_t)t * rf + 2 * (size_t)C + Hv + h] = bgs[2 * t + 1];
            }
        if (blockIdx.x == 0 && h == kh * rr)
            for (int x = tid; x < n * 2 * dk; x += blockDim.x) {
                int t = x / (2 * dk), idx = x % (2 * dk),
                    c = idx < dk ? kh * dk + idx : kd + kh * dk + (idx - dk);
                dst[(size_t)t * rf + c] = a.qkv[(size_t)(r0 + t) * a.qkv_ld + c];
                dst[(size_t)t * rf + C + c] =
                    idx < dk ? qs[(size_t)t * dk + idx] : ks[(size_t)t * dk + idx - dk];
            }
    }
    float *orow = a.o + (size_t)r0 * Hv * dv;
    for (int t = 0; t < n; t++) {
        float decay = expf(bgs[2 * t + 1]), beta = bgs[2 * t];
        float vj = ok ? vs[t * 32 + jj] : 0.0f;
        rec_token<R>(sv, qs + (size_t)t * dk, ks + (size_t)t * dk, vj, decay, beta, g, jj, ok, dk, red, fin,
                     orow + (size_t)t * Hv * dv + (size_t)h * dv + j);
    }
    if (!spec) {
#pragma unroll
        for (int t = 0; t < R; t++) {
            int i = g + REC_GROUPS * t;
            if (i < dk && ok) S[(size_t)i * dv] = sv[t];
        }
    }
    /* the conv windows where the unfused path writes them: a decode token's advanced window, a window's
     * committed one when a deferred commit was replayed; value channels here (no other block reads them), q /
     * k channels by the group's last block (every block of the group has read them by then) */
    int p0 = spec ? 0 : n;
    for (int idx = tid; !V2 && wr && idx < nv; idx += blockDim.x) {
        int c = 2 * kd + h * dv + j0 + idx;
        float nw[CONV_MAXK];
        for (int q = 0; q < K - 1; q++) {
            int p = p0 - (K - 1) + q, b = keep + (K - 1) + p;
            nw[q] = p >= 0      ? a.qkv[(size_t)(r0 + p) * a.qkv_ld + c]
                    : b < K - 1 ? cst[(size_t)b * C + c]
                                : prev[(size_t)(b - (K - 1)) * rf + c];
        }
        for (int q = 0; q < K - 1; q++) cst[(size_t)q * C + c] = nw[q];
    }
    if (g == 0) __threadfence(); /* warp 0 wrote o */
    __syncthreads();
    unsigned *cnt = a.win_cnt + (size_t)e * a.Hk + kh;
    if (tid == 0) last = atomicAdd(cnt, 1u) == (unsigned)(rr * gridDim.x) - 1u;
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int idx = tid; V2 && wr && idx < 2 * dk; idx += blockDim.x) {
        int c = idx < dk ? kh * dk + idx : kd + kh * dk + (idx - dk);
        for (int q = 0; q < K - 1; q++) cst[(size_t)q * C + c] = qkw[(size_t)q * 2 * dk + idx];
    }
    for (int task = g; V2 && task < n * rr; task += REC_GROUPS) {
        int t = task / rr, hh = kh * rr + task % rr;
        float *o = orow + (size_t)t * Hv * dv + (size_t)hh * dv;
        gnorm_warp<true>(o, o, a.z + (size_t)(r0 + t) * a.z_ld + (size_t)hh * dv, a.gnorm, dv, a.eps, jj);
    }
    for (int idx = tid; !V2 && wr && idx < 2 * dk; idx += blockDim.x) {
        int c = idx < dk ? kh * dk + idx : kd + kh * dk + (idx - dk);
        float nw[CONV_MAXK];
        for (int q = 0; q < K - 1; q++) {
            int p = p0 - (K - 1) + q, b = keep + (K - 1) + p;
            nw[q] = p >= 0      ? a.qkv[(size_t)(r0 + p) * a.qkv_ld + c]
                    : b < K - 1 ? cst[(size_t)b * C + c]
                                : prev[(size_t)(b - (K - 1)) * rf + c];
        }
        for (int q = 0; q < K - 1; q++) cst[(size_t)q * C + c] = nw[q];
    }
    for (int t = 0; !V2 && t < n; t++)
        for (int hh = kh * rr + g; hh < (kh + 1) * rr; hh += REC_GROUPS) {
            float *o = orow + (size_t)t * Hv * dv + (size_t)hh * dv;
            gnorm_warp<true>(o, o, a.z + (size_t)(r0 + t) * a.z_ld + (size_t)hh * dv, a.gnorm, dv, a.eps, jj);
        }
    if (tid == 0) *cnt = 0u;
}

/* the commit of a speculative window: the first n_keep recorded tokens replayed on the slot's S (per layer z)
 */
template <int R>
__global__ void __launch_bounds__(256)
    spec_replay_kernel(float *rec_state, const float *spec_rec, int slot, int n_keep, int n_lin, int win,
                       int Hk, int Hv, int dk, int dv, int C) {
    __shared__ float q[256], k[256], red[REC_GROUPS][32], fin[32];
    int l = blockIdx.z, h = blockIdx.y, jj = threadIdx.x & 31, g = threadIdx.x >> 5, j = blockIdx.x * 32 + jj;
    int kh = h / (Hv / Hk), kd = Hk * dk, ok = j < dv;
    size_t rf = CU_SPEC_REC(C, Hv);
    float *S = rec_state + (((size_t)slot * n_lin + l) * Hv + h) * (size_t)dk * dv + j;
    float sv[R];
#pragma unroll
    for (int t = 0; t < R; t++) {
        int i = g + REC_GROUPS * t;
        sv[t] = i < dk && ok ? S[(size_t)i * dv] : 0.0f;
    }
    for (int tt = 0; tt < n_keep; tt++) {
        const float *rec = spec_rec + (((size_t)slot * n_lin + l) * win + tt) * rf;
        const float *post = rec + C, *bg = rec + 2 * (size_t)C;
        for (int i = threadIdx.x; i < dk; i += blockDim.x) {
            q[i] = post[(size_t)kh * dk + i];
            k[i] = post[kd + (size_t)kh * dk + i];
        }
        __syncthreads();
        float decay = expf(bg[Hv + h]), beta = bg[h];
        float vj = ok ? post[2 * (size_t)kd + (size_t)h * dv + j] : 0.0f;
        rec_token<R>(sv, q, k, vj, decay, beta, g, jj, ok, dk, red, fin, NULL);
    }
#pragma unroll
    for (int t = 0; t < R; t++) {
        int i = g + REC_GROUPS * t;
        if (i < dk && ok) S[(size_t)i * dv] = sv[t];
    }
}

/* the commit's conv window: the last K-1 rows of [window | kept pre-conv rows] (per channel c, layer y) */
__global__ void spec_conv_commit_kernel(float *conv_state, const float *spec_rec, int slot, int n_keep,
                                        int n_lin, int win, int Hv, int K, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x, l = blockIdx.y;
    if (c >= C) return;
    size_t rf = CU_SPEC_REC(C, Hv);
    float *st = conv_state + ((size_t)slot * n_lin + l) * (size_t)(K - 1) * C + c;
    const float *rec = spec_rec + ((size_t)slot * n_lin + l) * win * rf + c;
    float x[CONV_MAXK];
    int tot = K - 1 + n_keep;
    for (int jj = 0; jj < K - 1; jj++) {
        int xi = tot - (K - 1) + jj;
        x[jj] = xi < K - 1 ? st[(size_t)xi * C] : rec[(size_t)(xi - (K - 1)) * rf];
    }
    for (int jj = 0; jj < K - 1; jj++) st[(size_t)jj * C] = x[jj];
}

extern "C" void cu_gdn_spec_commit(cu_ctx *c, float *conv_state, float *rec_state, const float *spec_rec,
                                   int slot, int n_keep, int n_lin, int win, int Hk, int Hv, int dk, int dv,
                                   int K, int C) {
    if (n_keep <= 0 || n_lin <= 0) return;
    if (K > 1)
        spec_conv_commit_kernel<<<dim3(cdiv((size_t)C, 128), (unsigned)n_lin), 128, 0, c->stream>>>(
            conv_state, spec_rec, slot, n_keep, n_lin, win, Hv, K, C);
    dim3 grid(cdiv((size_t)dv, 32), (unsigned)Hv, (unsigned)n_lin);
#define REPLAY(R_)                                                                                           \
    spec_replay_kernel<R_>                                                                                   \
        <<<grid, 256, 0, c->stream>>>(rec_state, spec_rec, slot, n_keep, n_lin, win, Hk, Hv, dk, dv, C)
    REC_DISPATCH(dk, REPLAY);
#undef REPLAY
}

/* shared memory of the chunked kernel: K and Q rows padded to dk + 1 (the Gram products read 32 different
 * rows at one column: with the pad they sit in 32 different banks) */
static size_t chunk_smem_floats(int dk) {
    return 2 * (size_t)GDN_CH * (dk + 1) + (size_t)GDN_CH * dk + 2 * (size_t)GDN_CH * GDN_CH +
           (size_t)GDN_CH * GDN_DT + (size_t)dk * GDN_DT + 4 * GDN_CH;
}

/* prefill: the chunked form of forward_cpu.c's gdn_chunked, a block per (entry, value head, 32 value
 * columns); W and the decay-weighted Gram matrices depend only on q/k/beta/g and are recomputed by each
 * column block. The factors e^(gam_r - gam_s), e^gam_r and e^(gam_L - gam_r) are formed once per chunk with
 * the CPU's expressions. */
__global__ void __launch_bounds__(256) chunked_kernel(cu_gdn_args a) {
    extern __shared__ float sm[];
    int e = blockIdx.z;
    int n = a.meta.e_n[e], pos0 = a.meta.e_len[e];
    if ((n == 1 && pos0 > 0) || (a.has_spec && a.meta.e_spec[e])) return; /* recurrent_kernel's */
    int h = blockIdx.y, j0 = blockIdx.x * GDN_DT, dk = a.dk, dv = a.dv, tid = threadIdx.x, nt = blockDim.x;
    int r0 = a.meta.e_row0[e], kh = h / (a.Hv / a.Hk), kd = a.Hk * dk, C = a.C, KS = dk + 1;
    float *Ks = sm, *Qs = Ks + GDN_CH * KS, *Ws = Qs + GDN_CH * KS, *G = Ws + GDN_CH * dk,
          *QK = G + GDN_CH * GDN_CH;
    float *U = QK + GDN_CH * GDN_CH, *S = U + GDN_CH * GDN_DT, *gam = S + dk * GDN_DT, *bet = gam + GDN_CH;
    float *egam = bet + GDN_CH, *fl = egam + GDN_CH;
    float *Sg = a.rec_state + (((size_t)a.meta.e_slot[e] * a.n_lin + a.lin) * a.Hv + h) * (size_t)dk * dv;
    for (int idx = tid; idx < dk * GDN_DT; idx += nt) {
        int i = idx / GDN_DT, jj = idx % GDN_DT;
        S[idx] = j0 + jj < dv ? Sg[(size_t)i * dv + j0 + jj] : 0.0f;
    }
    for (int c0 = 0, L; c0 < n; c0 += L) {
        L = GDN_CH - (pos0 + c0) % GDN_CH;
        if (L > n - c0) L = n - c0;
        __syncthreads();
        for (int idx = tid; idx < L * dk; idx += nt) {
            int t = idx / dk, i = idx % dk;
            const float *row = a.conv_out + (size_t)(r0 + c0 + t) * C;
            Qs[t * KS + i] = row[(size_t)kh * dk + i];
            Ks[t * KS + i] = row[kd + (size_t)kh * dk + i];
        }
        for (int idx = tid; idx < L * GDN_DT; idx += nt) {
            int t = idx / GDN_DT, jj = idx % GDN_DT;
            U[idx] = j0 + jj < dv
                         ? a.conv_out[(size_t)(r0 + c0 + t) * C + 2 * (size_t)kd + (size_t)h * dv + j0 + jj]
                         : 0.0f;
        }
        if (tid == 0) {
            float acc = 0.0f;
            for (int t = 0; t < L; t++) {
                const float *bg = a.bg + (size_t)(r0 + c0 + t) * 2 * a.Hv;
                acc += bg[a.Hv + h];
                gam[t] = acc;
                bet[t] = bg[h];
            }
            for (int t = 0; t < L; t++) {
                egam[t] = expf(gam[t]);
                fl[t] = expf(gam[L - 1] - gam[t]);
            }
        }
        __syncthreads();
        /* G = beta_r e^(gam_r - gam_s) k_r.k_s (s < r), QK = e^(gam_r - gam_s) q_r.k_s (s <= r) */
        for (int idx = tid; idx < L * L; idx += nt) {
            int r = idx / L, s = idx % L;
            if (s > r) continue;
            float g = 0.0f, qk = 0.0f;
            for (int i = 0; i < dk; i++) {
                g = fmaf(Ks[r * KS + i], Ks[s * KS + i], g);
                qk = fmaf(Qs[r * KS + i], Ks[s * KS + i], qk);
            }
            float d = expf(gam[r] - gam[s]);
            G[r * GDN_CH + s] = bet[r] * d * g;
            QK[r * GDN_CH + s] = d * qk;
        }
        __syncthreads();
        /* forward substitution: (I + L) W = beta Gam K, (I + L) U = beta V, row by row */
        for (int r = 0; r < L; r++) {
            float br = bet[r];
            for (int idx = tid; idx < dk + GDN_DT; idx += nt) {
                if (idx < dk) {
                    float w = (br * egam[r]) * Ks[r * KS + idx];
                    for (int s = 0; s < r; s++) w = fmaf(-G[r * GDN_CH + s], Ws[s * dk + idx], w);
                    Ws[r * dk + idx] = w;
                } else {
                    int jj = idx - dk;
                    float u = br * U[r * GDN_DT + jj];
                    for (int s = 0; s < r; s++) u = fmaf(-G[r * GDN_CH + s], U[s * GDN_DT + jj], u);
                    U[r * GDN_DT + jj] = u;
                }
            }
            __syncthreads();
        }
        /* D = U - W S0 (in place over U) */
        for (int idx = tid; idx < L * GDN_DT; idx += nt) {
            int r = idx / GDN_DT, jj = idx % GDN_DT;
            float d = U[idx];
            for (int i = 0; i < dk; i++) d = fmaf(-Ws[r * dk + i], S[i * GDN_DT + jj], d);
            U[idx] = d;
        }
        __syncthreads();
        /* O = (Gam Q) S0 + M D */
        for (int idx = tid; idx < L * GDN_DT; idx += nt) {
            int r = idx / GDN_DT, jj = idx % GDN_DT;
            if (j0 + jj >= dv) continue;
            float o = 0.0f;
            for (int i = 0; i < dk; i++) o = fmaf(Qs[r * KS + i], S[i * GDN_DT + jj], o);
            o *= egam[r];
            for (int s = 0; s <= r; s++) o = fmaf(QK[r * GDN_CH + s], U[s * GDN_DT + jj], o);
            a.o[(size_t)(r0 + c0 + r) * a.Hv * dv + (size_t)h * dv + j0 + jj] = o;
        }
        __syncthreads();
        /* S = Gam_L S0 + Σ_r e^{gam_L - gam_r} k_r ⊗ D_r */
        float egl = egam[L - 1];
        for (int idx = tid; idx < dk * GDN_DT; idx += nt) {
            int i = idx / GDN_DT, jj = idx % GDN_DT;
            float sv = S[idx] * egl;
            for (int r = 0; r < L; r++) sv = fmaf(fl[r] * Ks[r * KS + i], U[r * GDN_DT + jj], sv);
            S[idx] = sv;
        }
    }
    __syncthreads();
    for (int idx = tid; idx < dk * GDN_DT; idx += nt) {
        int i = idx / GDN_DT, jj = idx % GDN_DT;
        if (j0 + jj < dv) Sg[(size_t)i * dv + j0 + jj] = S[idx];
    }
}

/* per row: rmsnorm(o_h) * gnorm * silu(z_h) for each value head, a warp per head */
__global__ void gnorm_kernel(cu_gdn_args a) {
    int r = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5, dv = a.dv;
    for (int h = warp; h < a.Hv; h += nw) {
        float *o = a.o + (size_t)r * a.Hv * dv + (size_t)h * dv;
        const float *z = a.z + (size_t)r * a.z_ld + (size_t)h * dv;
        if (a.o_xb) { /* gnorm_warp's values into the out_proj GEMM's halves (CINFER_CUDA_PF_SPLIT) */
            float ss = 0.0f;
            for (int j = lane; j < dv; j += 32) ss = fmaf(o[j], o[j], ss);
            ss = warp_sum(ss);
            float inv = 1.0f / sqrtf(ss / (float)dv + a.eps);
            size_t base = (size_t)r * a.Hv * dv + (size_t)h * dv;
            for (int j = lane; j < dv; j += 32)
                split_put(a.o_xb, base + j, a.o_lo, __fmul_rn((o[j] * inv) * a.gnorm[j], dev_silu(z[j])));
        } else {
            gnorm_warp<false>(o, o, z, a.gnorm, dv, a.eps, lane);
        }
    }
}

extern "C" int cu_gdn_init(int dk) {
    int dev = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 0;
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    size_t smem = chunk_smem_floats(dk) * sizeof(float);
    if (smem > (size_t)optin) return 0;
    return cudaFuncSetAttribute(chunked_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin) ==
           cudaSuccess;
}

/* fused_decode_cluster2_kernel for conv width K (4: its own instantiation), with the stamps or without */
template <int R> static void (*cl2_kernel(int K, int st))(cu_gdn_args) {
    if (K == 4)
        return st ? fused_decode_cluster2_kernel<R, 4, true> : fused_decode_cluster2_kernel<R, 4, false>;
    return st ? fused_decode_cluster2_kernel<R, CONV_MAXK, true>
              : fused_decode_cluster2_kernel<R, CONV_MAXK, false>;
}

/* a decode step's kernel as clusters of cdims (cu_launch_step's PDL choice for PDL_GDN) */
static void launch_cluster(cu_ctx *c, void (*kern)(cu_gdn_args), dim3 grid, dim3 cdims, cu_gdn_args a) {
    int pdl = cu_pdl_on() >= 2 && (cu_pdl_mask() & PDL_GDN) && !c->pdl_break;
    c->pdl_break = 0;
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[2];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = cdims.x, at[0].val.clusterDim.y = cdims.y, at[0].val.clusterDim.z = cdims.z;
    at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[1].val.programmaticStreamSerializationAllowed = 1;
    cfg.gridDim = grid;
    cfg.blockDim = dim3(256);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = c->stream;
    cfg.attrs = at;
    cfg.numAttrs = pdl ? 2 : 1;
    cudaLaunchKernelEx(&cfg, kern, a);
}

extern "C" int cu_gdn_cluster_init(int Hk, int Hv, int dk, int dv) {
    int dev = 0, cc = 0, nbx = (dv + 31) / 32, rr = Hk > 0 ? Hv / Hk : 0;
    if (Hk <= 0 || Hv % Hk || dk > 256 || nbx > GDN_CL_MAXX || nbx * rr > 16) return 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 0;
    if (cudaDeviceGetAttribute(&cc, cudaDevAttrClusterLaunch, dev) != cudaSuccess || !cc) return 0;
    /* clusters of more than 8 blocks (27B: 3 heads x 4 column blocks) are "non-portable": sm_90 takes 16 */
    int n = 0;
#define CLI(R_)                                                                                              \
    do {                                                                                                     \
        void (*kern)(cu_gdn_args) = fused_decode_cluster_kernel<R_, 4>;                                      \
        void (*kern8)(cu_gdn_args) = fused_decode_cluster_kernel<R_, CONV_MAXK>;                             \
        void (*k2[4])(cu_gdn_args);                                                                          \
        for (int q_ = 0; q_ < 4; q_++) k2[q_] = cl2_kernel<R_>(q_ & 1 ? 8 : 4, q_ & 2);                      \
        int bad = 0;                                                                                         \
        for (int q_ = 0; q_ < 4 && nbx * rr > 8; q_++)                                                       \
            bad |= cudaFuncSetAttribute(k2[q_], cudaFuncAttributeNonPortableClusterSizeAllowed, 1) !=        \
                   cudaSuccess;                                                                              \
        if (nbx * rr > 8 &&                                                                                  \
            (bad ||                                                                                          \
             cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess || \
             cudaFuncSetAttribute(kern8, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess)) \
            break;                                                                                           \
        cudaLaunchConfig_t cfg = {};                                                                         \
        cudaLaunchAttribute at[1];                                                                           \
        at[0].id = cudaLaunchAttributeClusterDimension;                                                      \
        at[0].val.clusterDim.x = (unsigned)nbx, at[0].val.clusterDim.y = (unsigned)rr;                       \
        at[0].val.clusterDim.z = 1;                                                                          \
        cfg.gridDim = dim3((unsigned)nbx, (unsigned)Hv, 1);                                                  \
        cfg.blockDim = dim3(256);                                                                            \
        cfg.attrs = at;                                                                                      \
        cfg.numAttrs = 1;                                                                                    \
        if (cudaOccupancyMaxActiveClusters(&n, kern, &cfg) != cudaSuccess) n = 0;                            \
    } while (0)
    REC_DISPATCH(dk, CLI);
#undef CLI
    cudaGetLastError(); /* a refusal above is an answer, not a sticky error */
    return n > 0;
}

extern "C" int cu_gdn_chunked_phased(cu_ctx *c, const cu_gdn_args *a); /* deltanet_chunk.cu */

extern "C" void cu_gdn_layer(cu_ctx *c, const cu_gdn_args *a) {
    if (a->T <= 0) return;
    size_t smem = chunk_smem_floats(a->dk) * sizeof(float);
    if (a->dec_cnt && a->no_chunked && !a->has_spec && 2 * a->dk <= 512) {
        dim3 grid(cdiv((size_t)a->dv, 32), (unsigned)a->Hv, (unsigned)a->NE);
        if (a->dec_cluster && (a->dec_cluster_max <= 0 || a->NE <= a->dec_cluster_max)) {
            /* l2norm_warp's (float)(1 / sqrt(dk)): IEEE double sqrt and division are correctly rounded on
             * the host as on the device, so the same float */
            cu_gdn_args b = *a;
            b.dec_qscale = (float)(1.0 / sqrt((double)a->dk));
#define DECC(R_)                                                                                             \
    launch_cluster(c,                                                                                        \
                   a->dec_cluster >= 2 ? cl2_kernel<R_>(a->K, a->dec_stamps != NULL)                         \
                                       : (a->K == 4 ? fused_decode_cluster_kernel<R_, 4>                     \
                                                    : fused_decode_cluster_kernel<R_, CONV_MAXK>),           \
                   grid, dim3(grid.x, a->Hv / a->Hk, 1), b)
            REC_DISPATCH(a->dk, DECC);
#undef DECC
            return;
        }
        if (a->dec_wide && a->dk <= 128 && a->dv <= 128 && a->dv % 4 == 0 && a->K <= 4) {
            void (*kw)(cu_gdn_args);
#define WIDEK(R_) kw = fused_decode_wide_kernel<R_, 4>
            if (a->dk <= 32)
                WIDEK(4);
            else if (a->dk <= 64)
                WIDEK(8);
            else
                WIDEK(16);
#undef WIDEK
            cu_launch_step(c, PDL_GDN, kw, dim3(1, (unsigned)a->Hv, (unsigned)a->NE), dim3(256), *a);
            return;
        }
#define DECK(R_) cu_launch_step(c, PDL_GDN, fused_decode_kernel<R_>, grid, dim3(256), *a)
        REC_DISPATCH(a->dk, DECK);
#undef DECK
        return;
    }
    /* the stage (spec_win x (2 dk + 34) floats), with V2 the q / k windows ((K-1) x 2 dk) after it */
    size_t wsm =
        ((size_t)a->spec_win * (2 * (size_t)a->dk + 34) + (a->win_v2 ? (size_t)(a->K - 1) * 2 * a->dk : 0)) *
        sizeof(float);
    if (a->win_cnt && a->has_spec && a->no_chunked && 2 * a->dk <= 512 && wsm <= 48 * 1024) {
        dim3 grid(cdiv((size_t)a->dv, 32), (unsigned)a->Hv, (unsigned)a->NE);
#define WINK(R_)                                                                                             \
    do {                                                                                                     \
        if (a->win_v2)                                                                                       \
            fused_window_kernel<R_, true><<<grid, 256, wsm, c->stream>>>(*a);                                \
        else                                                                                                 \
            fused_window_kernel<R_, false><<<grid, 256, wsm, c->stream>>>(*a);                               \
    } while (0)
        REC_DISPATCH(a->dk, WINK);
#undef WINK
        return;
    }
    if (a->tc == 2 && !a->no_chunked) {
        conv_rows_kernel<<<dim3(cdiv((size_t)a->C, 128), cdiv((size_t)a->T, CONV_RB)), 128, 0, c->stream>>>(
            *a);
        conv_window_kernel<<<dim3(cdiv((size_t)a->C, 128), (unsigned)a->NE), 128, 0, c->stream>>>(*a);
    } else {
        conv_kernel<<<dim3(cdiv((size_t)a->C, 128), (unsigned)a->NE), 128, 0, c->stream>>>(*a);
    }
    prep_kernel<<<a->T, 128, 0, c->stream>>>(*a);
    if (a->has_spec) spec_record_kernel<<<a->T, 256, 0, c->stream>>>(*a);
    dim3 rgrid(cdiv((size_t)a->dv, 32), (unsigned)a->Hv, (unsigned)a->NE);
#define RECK(R_) recurrent_kernel<R_><<<rgrid, 256, 0, c->stream>>>(*a)
    REC_DISPATCH(a->dk, RECK);
#undef RECK
    if (a->no_chunked) {
        /* decode tokens and windows only: recurrent_kernel did them all */
    } else if (a->tc && cu_gdn_chunked_phased(c, a)) {
        /* the phased form took it */
    } else {
        chunked_kernel<<<dim3(cdiv((size_t)a->dv, GDN_DT), (unsigned)a->Hv, (unsigned)a->NE), 256, smem,
                         c->stream>>>(*a);
    }
    gnorm_kernel<<<a->T, 128, 0, c->stream>>>(*a);
}

/* Qwen3-Next: in_proj_qkvz rows hold per key head [q (dk) | k (dk) | v (rr dv) | z (rr dv)], in_proj_ba
 * rows [b (rr) | a (rr)] per key head (rr = Hv / Hk); the fused output row is [qkvz (2kd + 2vd) | ba (2 Hv)].
 */
__global__ void next_split_kernel(const float *in, int ld, float *qkv, float *z, float *b, float *av, int Hk,
                                  int Hv, int dk, int dv) {
    int r = blockIdx.x, rr = Hv / Hk, kd = Hk * dk, vd = Hv * dv, grp = 2 * dk + 2 * rr * dv, C = 2 * kd + vd;
    const float *src = in + (size_t)r * ld;
    for (int idx = threadIdx.x; idx < Hk * grp; idx += blockDim.x) {
        int g = idx / grp, o = idx % grp;
        float v = src[idx];
        if (o < dk)
            qkv[(size_t)r * C + (size_t)g * dk + o] = v;
        else if (o < 2 * dk)
            qkv[(size_t)r * C + kd + (size_t)g * dk + (o - dk)] = v;
        else if (o < 2 * dk + rr * dv)
            qkv[(size_t)r * C + 2 * kd + (size_t)g * rr * dv + (o - 2 * dk)] = v;
        else
            z[(size_t)r * vd + (size_t)g * rr * dv + (o - 2 * dk - rr * dv)] = v;
    }
    const float *bs = src + (size_t)Hk * grp;
    for (int idx = threadIdx.x; idx < 2 * Hv; idx += blockDim.x) {
        int g = idx / (2 * rr), o = idx % (2 * rr);
        if (o < rr)
            b[(size_t)r * Hv + g * rr + o] = bs[idx];
        else
            av[(size_t)r * Hv + g * rr + (o - rr)] = bs[idx];
    }
}

extern "C" void cu_next_split(cu_ctx *c, const float *in, int ld, float *qkv, float *z, float *b, float *av,
                              int T, int Hk, int Hv, int dk, int dv) {
    if (T > 0) next_split_kernel<<<T, 256, 0, c->stream>>>(in, ld, qkv, z, b, av, Hk, Hv, dk, dv);
}

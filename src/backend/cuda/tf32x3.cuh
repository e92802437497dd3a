/* tf32x3.cuh — f32-accurate products on the TF32 tensor cores, for the prefill kernels (deltanet_chunk.cu,
 * attention_tc.cu). One TF32 rounding of each operand (10 mantissa bits, ~2^-11 relative) cost ~4e-4 per
 * product against the f32 CPU code, and the fixture models amplified it to 1e-2..3e-2 at the logits (the
 * first device run of CINFER_CUDA_PREFILL=tc). So each operand x is split as hi = tf32(x), lo = tf32(x - hi)
 * (x to ~2^-22) and acc += lo·hi + hi·lo + hi·hi: three MMAs, the small terms first; lo·lo (~2^-22) is
 * dropped. Products of two TF32 values are exact in the f32 accumulator, so the result is within a few f32
 * roundings of the f32 sum. TF32_PASSES = 1 (CINFER_CUDA_TF32_PASSES=1) keeps the one-rounding form, only to
 * measure what the split costs. */
#ifndef CI_CUDA_TF32X3_CUH
#define CI_CUDA_TF32X3_CUH

#include <mma.h>
#include <type_traits>

/* acc += A B for fragments fa, fb loaded from f32 memory (their x[] still f32); neg: A enters negated.
 * P: 3 (split, f32-accurate) or 1 (one TF32 rounding). fa and fb are consumed. */
template <int P, class FA, class FB, class FC>
__device__ __forceinline__ void mma_tf32x(FC &acc, FA &fa, FB &fb, bool neg = false) {
    if constexpr (P == 1) {
#pragma unroll
        for (int t = 0; t < fa.num_elements; t++) {
            float v = nvcuda::wmma::__float_to_tf32(fa.x[t]);
            fa.x[t] = neg ? -v : v;
        }
#pragma unroll
        for (int t = 0; t < fb.num_elements; t++) fb.x[t] = nvcuda::wmma::__float_to_tf32(fb.x[t]);
        nvcuda::wmma::mma_sync(acc, fa, fb, acc);
    } else {
        FA al;
        FB bl;
#pragma unroll
        for (int t = 0; t < fa.num_elements; t++) {
            float v = neg ? -fa.x[t] : fa.x[t], h = nvcuda::wmma::__float_to_tf32(v);
            fa.x[t] = h;
            al.x[t] = nvcuda::wmma::__float_to_tf32(v - h);
        }
#pragma unroll
        for (int t = 0; t < fb.num_elements; t++) {
            float v = fb.x[t], h = nvcuda::wmma::__float_to_tf32(v);
            fb.x[t] = h;
            bl.x[t] = nvcuda::wmma::__float_to_tf32(v - h);
        }
        nvcuda::wmma::mma_sync(acc, al, fb, acc);
        nvcuda::wmma::mma_sync(acc, fa, bl, acc);
        nvcuda::wmma::mma_sync(acc, fa, fb, acc);
    }
}

/* acc += A[16][K] * B[K][16] for K a multiple of 8. A element (m, k) sits at A[m * lda + k] (row_major) or
 * A[m + k * lda] (col_major); B element (k, n) at B[k * ldb + n] (row_major) or B[k + n * ldb] (col_major);
 * either in shared or global memory (32-byte aligned, ld a multiple of 4). neg: A enters negated (D = U - W S
 * in one accumulator). P: TF32 passes.
 * The tensor cores accumulate in f32 but truncate at every MMA, a bias that grows with the chain (the H200
 * run of 06:05: ~1.4e-5 for 113 steps of 8 keys in attention), and a DeltaNet state updated in place would
 * carry it through every chunk of a long prompt. So each TC_KC of K goes into a fresh accumulator (3 x 4
 * MMAs) that joins acc through ordinary rounded f32 adds. */
#define TC_KC 32
typedef nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 8, float> tc_facc;
template <int P, class LA, class LB>
__device__ __forceinline__ void tc_mma(tc_facc &acc, const float *A, int lda, const float *B, int ldb, int K,
                                       bool neg = false) {
    nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 8, nvcuda::wmma::precision::tf32, LA> fa;
    nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 8, nvcuda::wmma::precision::tf32, LB> fb;
    for (int k0 = 0; k0 < K; k0 += TC_KC) {
        tc_facc part;
        nvcuda::wmma::fill_fragment(part, 0.0f);
        for (int k = k0; k < k0 + TC_KC && k < K; k += 8) {
            const float *pa = std::is_same<LA, nvcuda::wmma::row_major>::value ? A + k : A + (size_t)k * lda;
            const float *pb = std::is_same<LB, nvcuda::wmma::row_major>::value ? B + (size_t)k * ldb : B + k;
            nvcuda::wmma::load_matrix_sync(fa, pa, lda);
            nvcuda::wmma::load_matrix_sync(fb, pb, ldb);
            mma_tf32x<P>(part, fa, fb, neg);
        }
#pragma unroll
        for (int t = 0; t < acc.num_elements; t++) acc.x[t] += part.x[t];
    }
}

/* two tiles sharing A: acc0 += A B0, acc1 += A B1, each with exactly tc_mma's products, order and fresh
 * accumulators (so the same bits as two tc_mma calls), A loaded and split once, and the two chains of MMAs
 * interleaved so that one's latency hides behind the other's */
template <int P, class LA, class LB>
__device__ __forceinline__ void tc_mma2(tc_facc &acc0, tc_facc &acc1, const float *A, int lda,
                                        const float *B0, const float *B1, int ldb, int K, bool neg = false) {
    using namespace nvcuda;
    wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, LA> fa, al;
    wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, LB> f0, f1, l0, l1;
    for (int k0 = 0; k0 < K; k0 += TC_KC) {
        tc_facc p0, p1;
        wmma::fill_fragment(p0, 0.0f);
        wmma::fill_fragment(p1, 0.0f);
        for (int k = k0; k < k0 + TC_KC && k < K; k += 8) {
            const float *pa = std::is_same<LA, wmma::row_major>::value ? A + k : A + (size_t)k * lda;
            size_t ob = std::is_same<LB, wmma::row_major>::value ? (size_t)k * ldb : (size_t)k;
            wmma::load_matrix_sync(fa, pa, lda);
            wmma::load_matrix_sync(f0, B0 + ob, ldb);
            wmma::load_matrix_sync(f1, B1 + ob, ldb);
            if constexpr (P == 1) {
#pragma unroll
                for (int t = 0; t < fa.num_elements; t++) {
                    float v = wmma::__float_to_tf32(fa.x[t]);
                    fa.x[t] = neg ? -v : v;
                }
#pragma unroll
                for (int t = 0; t < f0.num_elements; t++) {
                    f0.x[t] = wmma::__float_to_tf32(f0.x[t]);
                    f1.x[t] = wmma::__float_to_tf32(f1.x[t]);
                }
                wmma::mma_sync(p0, fa, f0, p0);
                wmma::mma_sync(p1, fa, f1, p1);
            } else {
#pragma unroll
                for (int t = 0; t < fa.num_elements; t++) {
                    float v = neg ? -fa.x[t] : fa.x[t], h = wmma::__float_to_tf32(v);
                    fa.x[t] = h;
                    al.x[t] = wmma::__float_to_tf32(v - h);
                }
#pragma unroll
                for (int t = 0; t < f0.num_elements; t++) {
                    float v = f0.x[t], h = wmma::__float_to_tf32(v);
                    f0.x[t] = h;
                    l0.x[t] = wmma::__float_to_tf32(v - h);
                    v = f1.x[t], h = wmma::__float_to_tf32(v);
                    f1.x[t] = h;
                    l1.x[t] = wmma::__float_to_tf32(v - h);
                }
                wmma::mma_sync(p0, al, f0, p0);
                wmma::mma_sync(p1, al, f1, p1);
                wmma::mma_sync(p0, fa, l0, p0);
                wmma::mma_sync(p1, fa, l1, p1);
                wmma::mma_sync(p0, fa, f0, p0);
                wmma::mma_sync(p1, fa, f1, p1);
            }
        }
#pragma unroll
        for (int t = 0; t < acc0.num_elements; t++) {
            acc0.x[t] += p0.x[t];
            acc1.x[t] += p1.x[t];
        }
    }
}

#endif

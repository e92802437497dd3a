/* tf32x3.cuh — f32-accurate products on the TF32 tensor cores, for the prefill kernels (deltanet_tc.cu,
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

#endif

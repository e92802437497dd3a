/* matmul.h — the CPU's one heavy kernel: y = x · Wᵀ with f32 activations and bf16/f16/f32 weights in
 * HF [out, in] layout, threaded over output features. Every output element is reduced over K in one fixed
 * order that depends only on K (not on M, N, the thread count or which other rows are present), so a
 * row's result is bit-identical alone or in any batch. Dispatches at run time to AVX-512 (with
 * AVX512-BF16 where present), AVX2+FMA, or portable C. */
#ifndef CI_MATMUL_H
#define CI_MATMUL_H

#include <stdatomic.h>
#include <stddef.h>

#include "util/threadpool.h"

typedef enum { WT_F32 = 0, WT_BF16 = 1, WT_F16 = 2 } wtype;

/* y[m*N + n] = Σ_k x[m*K + k] * W[n*K + k] for m < M, n < N.  x: [M, K] f32; W: [N, K] of type wt;
 * y: [M, N] f32 (must not alias x). M may be 0. */
void cpu_matmul(threadpool *tp, float *y, const float *x, const void *w, wtype wt, int M, int N, int K);

/* The same product computed by the portable scalar path in the same reduction order (for tests). */
void cpu_matmul_ref(float *y, const float *x, const void *w, wtype wt, int M, int N, int K);

/* Which kernel family cpu_matmul uses on this machine: "avx512bf16", "avx512", "avx2", "scalar".
 * CINFER_SIMD=scalar|avx2|avx512 in the environment caps it (for tests and comparisons). */
const char *cpu_matmul_isa(void);

/* Sets the kernel family for later calls, for tests and benchmarks: "scalar", "avx2", "avx512", or NULL
 * to choose again from the machine and CINFER_SIMD. Returns 0, CINFER_EINVAL for an unknown name, or
 * CINFER_EUNSUPPORTED when this CPU lacks it. Process-wide; not for use while other threads multiply. */
int cpu_matmul_isa_force(const char *isa);

/* The same choice as a number, for the CPU's other vector ops (ops.c), which follow it so that tests can
 * pin each path: CPU_SIMD_SCALAR, CPU_SIMD_AVX2 (AVX2 + FMA + F16C) or CPU_SIMD_AVX512. Inline, because
 * ops dispatch on it per call and the DeltaNet issues tens of millions of 128-float calls per prefill. */
enum { CPU_SIMD_SCALAR = 0, CPU_SIMD_AVX2 = 1, CPU_SIMD_AVX512 = 2 };
extern atomic_int cpu_simd_cur; /* internal: the level in force, -1 before the first choice */
int cpu_simd_level_first(void);
static inline int cpu_simd_level(void) {
    int l = atomic_load_explicit(&cpu_simd_cur, memory_order_relaxed);
    return l >= 0 ? l : cpu_simd_level_first();
}

#endif

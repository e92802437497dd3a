/* runtime.cu — device discovery, the per-context stream and cuBLAS handle, memory, copies, graphs, timers,
 * and the roofline probes (device copy bandwidth, bf16 GEMM rate). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/common.cuh"

static int fail(char *err, size_t errlen, int code, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

#define CU_ENOMEM (-3)
#define CU_EIO    (-2)

extern "C" int cu_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* no driver / no device: clear the sticky-free error and say 0 */
        return 0;
    }
    return n;
}

extern "C" void cu_device_describe(char *buf, size_t len) {
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) {
        snprintf(buf, len, "no CUDA device");
        return;
    }
    snprintf(buf, len, "%s (sm_%d%d, %d SMs, %.1f GiB)", p.name, p.major, p.minor, p.multiProcessorCount,
             (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
}

extern "C" int cu_ctx_create(cu_ctx **out, char *err, size_t errlen) {
    cu_ctx *c = (cu_ctx *)calloc(1, sizeof(cu_ctx));
    if (!c) return fail(err, errlen, CU_ENOMEM, "out of memory");
    /* a blocking stream: it orders after the synchronous copies and memsets made on the legacy stream */
    cudaError_t e = cudaStreamCreate(&c->stream);
    if (e != cudaSuccess) {
        free(c);
        return fail(err, errlen, CU_EIO, "CUDA stream: %s", cudaGetErrorString(e));
    }
    if (cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS) {
        cudaStreamDestroy(c->stream);
        free(c);
        return fail(err, errlen, CU_EIO, "cuBLAS could not be initialised");
    }
    cublasSetStream(c->blas, c->stream);
    c->blas_ws_bytes = (size_t)64 << 20;
    if (cudaMalloc(&c->blas_ws, c->blas_ws_bytes) != cudaSuccess) {
        cublasDestroy(c->blas);
        cudaStreamDestroy(c->stream);
        free(c);
        return fail(err, errlen, CU_ENOMEM, "cannot allocate the cuBLAS workspace");
    }
    cublasSetWorkspace(c->blas, c->blas_ws, c->blas_ws_bytes);
    *out = c;
    return 0;
}

extern "C" void cu_ctx_destroy(cu_ctx *c) {
    if (!c) return;
    cudaStreamSynchronize(c->stream);
    cublasDestroy(c->blas);
    cudaFree(c->blas_ws);
    if (c->side) {
        cudaStreamSynchronize(c->side);
        cudaEventDestroy(c->side_done);
        cudaStreamDestroy(c->side);
    }
    cudaStreamDestroy(c->stream);
    free(c);
}

extern "C" int cu_alloc(void **p, size_t bytes, char *err, size_t errlen) {
    *p = NULL;
    if (!bytes) bytes = 16;
    cudaError_t e = cudaMalloc(p, bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *p = NULL;
        return fail(err, errlen, CU_ENOMEM, "cannot allocate %zu bytes of device memory: %s", bytes,
                    cudaGetErrorString(e));
    }
    /* cudaMemset may still be running when it returns: finish it here (allocations happen at creation only)
     */
    cudaMemset(*p, 0, bytes);
    e = cudaStreamSynchronize(0);
    if (e != cudaSuccess)
        return fail(err, errlen, CU_EIO, "zeroing device memory: %s", cudaGetErrorString(e));
    return 0;
}
extern "C" void cu_free(void *p) {
    if (p) cudaFree(p);
}
extern "C" int cu_alloc_host(void **p, size_t bytes, char *err, size_t errlen) {
    *p = NULL;
    cudaError_t e = cudaMallocHost(p, bytes ? bytes : 16);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *p = NULL;
        return fail(err, errlen, CU_ENOMEM, "cannot allocate %zu bytes of pinned memory: %s", bytes,
                    cudaGetErrorString(e));
    }
    return 0;
}
extern "C" void cu_free_host(void *p) {
    if (p) cudaFreeHost(p);
}
extern "C" int cu_upload(void *dst, const void *src, size_t bytes, char *err, size_t errlen) {
    /* from pageable memory cudaMemcpy may return before the DMA lands: wait for it */
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaStreamSynchronize(0);
    return e == cudaSuccess ? 0 : fail(err, errlen, CU_EIO, "copy to the device: %s", cudaGetErrorString(e));
}
extern "C" int cu_download(void *dst, const void *src, size_t bytes, char *err, size_t errlen) {
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
    return e == cudaSuccess ? 0
                            : fail(err, errlen, CU_EIO, "copy from the device: %s", cudaGetErrorString(e));
}
/* an operation that is not a kernel was enqueued: the next launch goes without PDL (common.cuh) */
static void pdl_break(cu_ctx *c) {
    c->pdl_break = cu_pdl_break_on();
}
extern "C" void cu_h2d_async(cu_ctx *c, void *dst, const void *src, size_t bytes) {
    pdl_break(c);
    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream);
}
extern "C" void cu_h2d_side(cu_ctx *c, void *dst, const void *src, size_t bytes) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (!c->side) {
        if (cudaStreamCreateWithFlags(&c->side, cudaStreamNonBlocking) != cudaSuccess) {
            (void)cudaGetLastError();
            c->side = NULL;
        } else if (cudaEventCreateWithFlags(&c->side_done, cudaEventDisableTiming) != cudaSuccess) {
            (void)cudaGetLastError();
            cudaStreamDestroy(c->side);
            c->side = NULL;
        }
    }
    /* no side stream, or a capture in progress (an event recorded outside it cannot be waited on there):
     * the copy in order on the stream */
    if (!c->side || cudaStreamIsCapturing(c->stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) {
        (void)cudaGetLastError();
        cu_h2d_async(c, dst, src, bytes);
        return;
    }
    pdl_break(c);
    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->side);
    cudaEventRecord(c->side_done, c->side);
    cudaStreamWaitEvent(c->stream, c->side_done, 0);
}
extern "C" void cu_d2h_async(cu_ctx *c, void *dst, const void *src, size_t bytes) {
    pdl_break(c);
    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream);
}
extern "C" void cu_d2d_async(cu_ctx *c, void *dst, const void *src, size_t bytes) {
    pdl_break(c);
    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream);
}
extern "C" size_t cu_mem_free(void) {
    size_t f = 0, t = 0;
    if (cudaMemGetInfo(&f, &t) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return f;
}
extern "C" void cu_copy_async(cu_ctx *c, void *dst, const void *src, size_t bytes) {
    pdl_break(c);
    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, c->stream);
}
extern "C" void cu_memset_async(cu_ctx *c, void *d, size_t bytes) {
    pdl_break(c);
    cudaMemsetAsync(d, 0, bytes, c->stream);
}

extern "C" int cu_sync(cu_ctx *c, char *err, size_t errlen) {
    cudaError_t e = cudaStreamSynchronize(c->stream);
    if (e == cudaSuccess) e = cudaGetLastError();
    return e == cudaSuccess ? 0 : fail(err, errlen, CU_EIO, "CUDA: %s", cudaGetErrorString(e));
}
extern "C" int cu_check(char *err, size_t errlen) {
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? 0 : fail(err, errlen, CU_EIO, "CUDA launch: %s", cudaGetErrorString(e));
}

extern "C" int cu_capture_begin(cu_ctx *c, char *err, size_t errlen) {
    pdl_break(c);
    cudaError_t e = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal);
    return e == cudaSuccess ? 0 : fail(err, errlen, CU_EIO, "graph capture: %s", cudaGetErrorString(e));
}
extern "C" int cu_capture_end(cu_ctx *c, void **exec, char *err, size_t errlen) {
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    if (e != cudaSuccess) return fail(err, errlen, CU_EIO, "graph capture: %s", cudaGetErrorString(e));
    cudaGraphExec_t x = NULL;
    e = cudaGraphInstantiate(&x, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) return fail(err, errlen, CU_EIO, "graph instantiate: %s", cudaGetErrorString(e));
    *exec = (void *)x;
    return 0;
}
/* Ends a capture into *exec, updating `old` in place when the driver accepts the new graph for it
 * (cudaGraphExecUpdate: the same topology, kernel arguments and launch shapes may differ — far cheaper than
 * an instantiation); otherwise instantiates a new one. *exec == old tells the caller which happened. */
extern "C" int cu_capture_end_update(cu_ctx *c, void *old, void **exec, char *err, size_t errlen) {
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    if (e != cudaSuccess) return fail(err, errlen, CU_EIO, "graph capture: %s", cudaGetErrorString(e));
    if (old) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate((cudaGraphExec_t)old, g, &info) == cudaSuccess) {
            cudaGraphDestroy(g);
            *exec = old;
            return 0;
        }
        (void)cudaGetLastError(); /* a refused update is not an error: instantiate */
    }
    cudaGraphExec_t x = NULL;
    e = cudaGraphInstantiate(&x, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) return fail(err, errlen, CU_EIO, "graph instantiate: %s", cudaGetErrorString(e));
    *exec = (void *)x;
    return 0;
}
extern "C" int cu_graph_launch(cu_ctx *c, void *exec, char *err, size_t errlen) {
    pdl_break(c);
    cudaError_t e = cudaGraphLaunch((cudaGraphExec_t)exec, c->stream);
    return e == cudaSuccess ? 0 : fail(err, errlen, CU_EIO, "graph launch: %s", cudaGetErrorString(e));
}
extern "C" void cu_graph_destroy(void *exec) {
    if (exec) cudaGraphExecDestroy((cudaGraphExec_t)exec);
}

struct cu_timer {
    cudaEvent_t a, b;
};
extern "C" int cu_timer_create(cu_timer **t) {
    *t = (cu_timer *)calloc(1, sizeof(cu_timer));
    if (!*t) return -1;
    cudaEventCreate(&(*t)->a);
    cudaEventCreate(&(*t)->b);
    return 0;
}
extern "C" void cu_timer_destroy(cu_timer *t) {
    if (!t) return;
    cudaEventDestroy(t->a);
    cudaEventDestroy(t->b);
    free(t);
}
extern "C" void cu_timer_start(cu_ctx *c, cu_timer *t) {
    pdl_break(c);
    cudaEventRecord(t->a, c->stream);
}
extern "C" float cu_timer_stop_ms(cu_ctx *c, cu_timer *t) {
    pdl_break(c);
    cudaEventRecord(t->b, c->stream);
    cudaEventSynchronize(t->b);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, t->a, t->b);
    return ms;
}

extern "C" float cu_timer_between_ms(cu_timer *a, cu_timer *b) {
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, a->a, b->a);
    return ms;
}

extern "C" int cu_measure_roofline(cu_ctx *c, double *copy_gbs, double *gemm_tflops, char *err,
                                   size_t errlen) {
    pdl_break(c); /* copies and memsets follow */
    /* copy: 1 GiB device-to-device, best of 5 (bytes read + bytes written) */
    size_t bytes = (size_t)1 << 30;
    void *a = NULL, *b = NULL;
    int rc;
    if ((rc = cu_alloc(&a, bytes, err, errlen)) || (rc = cu_alloc(&b, bytes, err, errlen))) {
        cu_free(a);
        return rc;
    }
    cu_timer *t;
    cu_timer_create(&t);
    double best = 1e30;
    for (int i = 0; i < 6; i++) {
        cu_timer_start(c, t);
        cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, c->stream);
        double ms = cu_timer_stop_ms(c, t);
        if (i > 0 && ms < best) best = ms;
    }
    *copy_gbs = 2.0 * (double)bytes / (best * 1e-3) / 1e9;
    /* GEMM: 8192^3 bf16 x bf16 -> f32 through the same cuBLAS call as the forward, best of 5 */
    int n = 8192;
    float *y = (float *)b; /* 256 MiB of output fits in the 1 GiB buffer */
    const uint16_t *w = (const uint16_t *)a, *x = (const uint16_t *)a + (size_t)n * n;
    cudaMemsetAsync(a, 0, bytes, c->stream);
    const float one = 1.0f, zero = 0.0f;
    best = 1e30;
    for (int i = 0; i < 6; i++) {
        cu_timer_start(c, t);
        cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, w, CUDA_R_16BF, n, x, CUDA_R_16BF, n,
                     &zero, y, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        double ms = cu_timer_stop_ms(c, t);
        if (i > 0 && ms < best) best = ms;
    }
    *gemm_tflops = 2.0 * (double)n * n * n / (best * 1e-3) / 1e12;
    cu_timer_destroy(t);
    cu_free(a);
    cu_free(b);
    return cu_sync(c, err, errlen);
}

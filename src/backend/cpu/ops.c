/* ops.c — see ops.h. Written so the compiler can vectorise the fixed-width inner loops without
 * reassociating (we build without -ffast-math: results must be reproducible). */
#include "backend/cpu/ops.h"

float ops_dot(const float *a, const float *b, int n) {
    float acc[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) acc[l] += a[i + l] * b[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += a[i] * b[i];
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) acc[l] += acc[l + w];
    return acc[0];
}

void ops_axpy(float *y, float s, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] += s * x[i];
}

void ops_rmsnorm(float *y, const float *x, const float *w, int n, float eps) {
    float ss = ops_dot(x, x, n);
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) y[i] = (x[i] * r) * w[i];
}

void ops_l2norm(float *y, const float *x, int n, float eps) {
    float ss = ops_dot(x, x, n);
    float r = 1.0f / sqrtf(ss + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * r;
}

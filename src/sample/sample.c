/* sample.c — see sample.h. */
#include "sample/sample.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void rng_seed(rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t rng_next(rng *r) {
    uint64_t *s = r->s, out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double rng_uniform(rng *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; }

int sample_argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

int sample_temperature(const float *x, int n, float temp, rng *r, float *work) {
    if (!(temp > 0.0f)) return sample_argmax(x, n);
    float mx = x[sample_argmax(x, n)];
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        work[i] = expf((x[i] - mx) / temp);
        sum += work[i];
    }
    double u = rng_uniform(r) * sum, acc = 0.0;
    for (int i = 0; i < n; i++) {
        acc += work[i];
        if (u < acc) return i;
    }
    return sample_argmax(x, n); /* rounding left u at the very top: the last positive mass wins */
}

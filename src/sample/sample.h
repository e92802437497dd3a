/* sample.h — choosing the next token from a row of logits: greedy argmax (ties to the lowest id) and
 * temperature sampling from a seeded generator (xoshiro256**, reproducible per seed). The full sampler
 * chain (top-k/p, min-p, penalties, logprobs) extends this for the server. */
#ifndef CI_SAMPLE_H
#define CI_SAMPLE_H

#include <stdint.h>

typedef struct rng {
    uint64_t s[4];
} rng;

void rng_seed(rng *r, uint64_t seed);
uint64_t rng_next(rng *r);
double rng_uniform(rng *r); /* [0, 1) with 53 random bits */

int sample_argmax(const float *logits, int n);
/* temp <= 0 is greedy. Uses work[n] as scratch. */
int sample_temperature(const float *logits, int n, float temp, rng *r, float *work);

#endif

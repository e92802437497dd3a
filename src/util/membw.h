/* membw.h — the machine's memory read bandwidth, measured the way the roofline figures use it: every
 * thread of a pool streaming its share of a buffer with wide loads (a scalar loop does not saturate DRAM
 * on its own). Shared by `cinfer bench` and bench/matmul.c so both report against the same ceiling. */
#ifndef CI_MEMBW_H
#define CI_MEMBW_H

#include <stddef.h>
#include <stdint.h>

#include "util/threadpool.h"

/* Best of reps passes, in GB/s, reading buf (bytes long, 64-byte aligned, a multiple of 256). */
double membw_read(threadpool *tp, const uint64_t *buf, size_t bytes, int reps);

/* Allocates and fills a buffer of `bytes`, measures, frees. 0 when the allocation fails. */
double membw_measure(threadpool *tp, size_t bytes, int reps);

#endif

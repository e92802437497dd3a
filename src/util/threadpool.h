/* threadpool.h — a fixed set of worker threads that run one function at a time, ggml style: fn(ctx, ith, nth)
 * runs once for every index ith < nth (nth = tp_size) and splits the work itself by index. Splits by index
 * keep results independent of timing; ops must also keep them independent of nth where bit-exactness
 * matters. Workers spin briefly before sleeping, because a decode step issues hundreds of small jobs. */
#ifndef CI_THREADPOOL_H
#define CI_THREADPOOL_H

typedef struct threadpool threadpool;
typedef void (*tp_fn)(void *ctx, int ith, int nth);

/* n_threads <= 0: number of online CPUs. Never fails (aborts on thread creation failure). */
threadpool *tp_create(int n_threads);
void tp_destroy(threadpool *tp);
int tp_size(const threadpool *tp);

/* Runs fn(ctx, ith, nth) once for each ith in [0, nth) and returns when all have returned. The caller runs
 * ith 0, and also any index that no worker has claimed by the time it is free: a worker that is not running
 * never holds up a job it has not started. So one thread may run several indices one after another (per-
 * index scratch stays private; thread-local state is reused serially), and fn must never wait for another
 * index (no barriers inside fn). Calls from one thread at a time. tp may be NULL: runs fn(ctx, 0, 1). */
void tp_run(threadpool *tp, tp_fn fn, void *ctx);

/* [begin, end) of n items for thread ith of nth (contiguous, balanced). */
static inline void tp_range(long n, int ith, int nth, long *begin, long *end) {
    long per = n / nth, rem = n % nth;
    *begin = ith * per + (ith < rem ? ith : rem);
    *end = *begin + per + (ith < rem ? 1 : 0);
}

#endif

/* threadpool.c — see threadpool.h. One 64-bit word publishes each job and hands out its indices: the job's
 * generation above, the next unclaimed index below. Threads claim indices with a compare-and-swap, so a
 * worker that is not running (descheduled on a shared or virtual CPU, or still waking up) claims nothing,
 * and the caller runs the indices it would have run instead of waiting for it. Measured on a loaded 2-vCPU
 * VM: an empty tp_run could cost 60-280 us waiting for a descheduled worker just to find its share empty
 * (a matmul's work is stolen anyway); with claiming, it costs what the caller's own share costs.
 * Workers spin on the word for a while (a decode step issues hundreds of small jobs), then sleep on a
 * condition variable; the caller only takes the mutex when someone sleeps. */
#include "util/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() __asm__ volatile("" ::: "memory")
#endif

/* A worker spins ~470 us (pause: ~23 ns on Zen 5) before it sleeps: longer than the gaps between the small
 * jobs of a decode step, shorter than a scheduler tick. Past ~50 us of spinning (YIELD_AFTER) it also yields
 * the CPU every 64 pauses, and so does the caller waiting for a worker's index: when other processes leave
 * the pool's threads sharing one CPU, a pure spin held that CPU for its whole slice while the thread with
 * the work waited (measured, loaded 2-vCPU VM, 5 us per index: p99 tp_run 500 us -> 10 us, mean 20.5 ->
 * 10.4 us). With a CPU to itself, sched_yield returns at once. */
#define SPIN_ITERS  20000
#define YIELD_AFTER 2000

static inline void spin_wait(int spins) {
    if (spins > YIELD_AFTER && (spins & 63) == 0)
        sched_yield();
    else
        CPU_RELAX();
}

#define IDX_BITS 16 /* n <= 256 < 2^16 */
#define IDX_MASK ((1ull << IDX_BITS) - 1)

struct threadpool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    tp_fn fn; /* the current job: written by the caller before it publishes state, read after a claim */
    void *ctx;
    _Alignas(64) atomic_ullong state; /* generation << IDX_BITS | next unclaimed index */
    _Alignas(64) atomic_int done;     /* indices finished by workers in the current job */
    _Alignas(64) atomic_int sleepers; /* workers blocked (or about to block) on cv */
    atomic_int stop;
    unsigned long long gen; /* the caller's: generation of the last job published */
};

typedef struct {
    threadpool *tp;
    int ith;
} worker_arg;

/* Claims the next index of the job in word s; -1 when the job has none left or the word moved on. */
static int claim(threadpool *tp, unsigned long long s) {
    unsigned long long idx = s & IDX_MASK;
    if (idx >= (unsigned long long)tp->n) return -1;
    if (!atomic_compare_exchange_strong_explicit(&tp->state, &s, s + 1, memory_order_acq_rel,
                                                 memory_order_relaxed))
        return -2; /* someone else moved it: look again */
    return (int)idx;
}

static void *worker(void *p) {
    worker_arg *a = p;
    threadpool *tp = a->tp;
    free(a);
    unsigned long long seen = 0; /* generation whose indices are all claimed (as far as we know) */
    for (;;) {
        unsigned long long s = atomic_load_explicit(&tp->state, memory_order_acquire);
        int spins = 0;
        while ((s >> IDX_BITS) == seen) {
            if (atomic_load_explicit(&tp->stop, memory_order_relaxed)) return NULL;
            if (++spins < SPIN_ITERS) {
                spin_wait(spins);
            } else {
                pthread_mutex_lock(&tp->mu);
                atomic_fetch_add(&tp->sleepers, 1); /* seq_cst: pairs with tp_run's store, then load */
                while ((atomic_load(&tp->state) >> IDX_BITS) == seen && !atomic_load(&tp->stop))
                    pthread_cond_wait(&tp->cv, &tp->mu);
                atomic_fetch_sub(&tp->sleepers, 1);
                pthread_mutex_unlock(&tp->mu);
                spins = 0;
            }
            s = atomic_load_explicit(&tp->state, memory_order_acquire);
        }
        int i = claim(tp, s);
        if (i == -1) {
            seen = s >> IDX_BITS;
            continue;
        }
        if (i < 0) continue;
        /* The job cannot change before our done is counted, so fn and ctx are this claim's. */
        tp->fn(tp->ctx, i, tp->n);
        atomic_fetch_add_explicit(&tp->done, 1, memory_order_release);
    }
}

threadpool *tp_create(int n_threads) {
    if (n_threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = c > 0 ? (int)c : 1;
    }
    if (n_threads > 256) n_threads = 256;
    threadpool *tp = aligned_alloc(64, (sizeof(threadpool) + 63) / 64 * 64);
    if (!tp) abort();
    memset(tp, 0, sizeof *tp);
    tp->n = n_threads;
    atomic_init(&tp->state, 0); /* generation 0, no job: workers start with seen = 0 */
    atomic_init(&tp->done, 0);
    atomic_init(&tp->sleepers, 0);
    atomic_init(&tp->stop, 0);
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->cv, NULL);
    tp->threads = calloc((size_t)n_threads, sizeof(pthread_t));
    if (!tp->threads) abort();
    for (int i = 1; i < n_threads; i++) {
        worker_arg *a = malloc(sizeof *a);
        if (!a) abort();
        a->tp = tp;
        a->ith = i;
        if (pthread_create(&tp->threads[i], NULL, worker, a)) {
            fprintf(stderr, "cinfer: cannot create worker thread\n");
            abort();
        }
    }
    return tp;
}

void tp_destroy(threadpool *tp) {
    if (!tp) return;
    pthread_mutex_lock(&tp->mu);
    atomic_store(&tp->stop, 1);
    pthread_cond_broadcast(&tp->cv);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 1; i < tp->n; i++) pthread_join(tp->threads[i], NULL);
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->cv);
    free(tp->threads);
    free(tp);
}

int tp_size(const threadpool *tp) {
    return tp ? tp->n : 1;
}

void tp_run(threadpool *tp, tp_fn fn, void *ctx) {
    if (!tp || tp->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    const int n = tp->n;
    tp->fn = fn;
    tp->ctx = ctx;
    atomic_store_explicit(&tp->done, 0, memory_order_relaxed);
    tp->gen++;
    /* Index 0 is the caller's from the start (the caller is thread 0 when all goes to plan). seq_cst:
     * ordered before the load of sleepers below (a worker increments sleepers, then reads state). */
    atomic_store(&tp->state, tp->gen << IDX_BITS | 1);
    if (atomic_load(&tp->sleepers) > 0) {
        pthread_mutex_lock(&tp->mu);
        pthread_cond_broadcast(&tp->cv);
        pthread_mutex_unlock(&tp->mu);
    }
    fn(ctx, 0, n);
    int mine = 1;
    for (;;) { /* indices no worker has started */
        unsigned long long s = atomic_load_explicit(&tp->state, memory_order_acquire);
        int i = claim(tp, s);
        if (i == -1) break;
        if (i < 0) continue;
        fn(ctx, i, n);
        mine++;
    }
    for (int spins = 1; atomic_load_explicit(&tp->done, memory_order_acquire) < n - mine; spins++)
        spin_wait(spins);
}

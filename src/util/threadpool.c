/* threadpool.c — see threadpool.h. A generation counter publishes each job; workers spin on it for a
 * while (cheap wake-up between the many small ops of a step), then block on a condition variable. */
#include "util/threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define CPU_RELAX() __asm__ volatile("" ::: "memory")
#else
#define CPU_RELAX() ((void)0)
#endif

#define SPIN_ITERS 200000

struct threadpool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint gen;     /* bumped once per job */
    atomic_int pending;  /* workers still running the current job */
    atomic_int stop;
    tp_fn fn;
    void *ctx;
};

typedef struct {
    threadpool *tp;
    int ith;
} worker_arg;

static void *worker(void *p) {
    worker_arg *a = p;
    threadpool *tp = a->tp;
    int ith = a->ith;
    free(a);
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&tp->gen, memory_order_acquire)) == seen && !atomic_load(&tp->stop)) {
            if (++spins < SPIN_ITERS) {
                CPU_RELAX();
                continue;
            }
            pthread_mutex_lock(&tp->mu);
            while (atomic_load(&tp->gen) == seen && !atomic_load(&tp->stop)) pthread_cond_wait(&tp->cv, &tp->mu);
            pthread_mutex_unlock(&tp->mu);
        }
        if (atomic_load(&tp->stop)) return NULL;
        seen = g;
        tp->fn(tp->ctx, ith, tp->n);
        atomic_fetch_sub_explicit(&tp->pending, 1, memory_order_acq_rel);
    }
}

threadpool *tp_create(int n_threads) {
    if (n_threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = c > 0 ? (int)c : 1;
    }
    if (n_threads > 256) n_threads = 256;
    threadpool *tp = calloc(1, sizeof *tp);
    if (!tp) abort();
    tp->n = n_threads;
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

int tp_size(const threadpool *tp) { return tp ? tp->n : 1; }

void tp_run(threadpool *tp, tp_fn fn, void *ctx) {
    if (!tp || tp->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    tp->fn = fn;
    tp->ctx = ctx;
    atomic_store(&tp->pending, tp->n - 1);
    pthread_mutex_lock(&tp->mu);
    atomic_fetch_add_explicit(&tp->gen, 1, memory_order_release);
    pthread_cond_broadcast(&tp->cv);
    pthread_mutex_unlock(&tp->mu);
    fn(ctx, 0, tp->n);
    while (atomic_load_explicit(&tp->pending, memory_order_acquire) > 0) CPU_RELAX();
}

/* test_util.c — bf16/f16 conversion, error formatting, the thread pool, the no-alloc guard. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <pthread.h>
#include <time.h>

#include "test.h"
#include "util/alloc.h"
#include "util/bf16.h"
#include "util/err.h"
#include "util/threadpool.h"

TEST(bf16_round_trip_and_rounding) {
    CHECK(bf16_to_f32(0x3f80) == 1.0f);
    CHECK(bf16_to_f32(0xc000) == -2.0f);
    CHECK(f32_to_bf16(1.0f) == 0x3f80);
    /* 1 + 2^-8 is exactly halfway between two bf16 values: ties go to even (1.0). */
    CHECK(f32_to_bf16(1.00390625f) == 0x3f80);
    /* 1 + 3*2^-8 is halfway too; the even neighbour is above. */
    CHECK(f32_to_bf16(1.01171875f) == 0x3f82);
    for (uint32_t h = 0; h < 0x10000; h += 7) {
        float f = bf16_to_f32((uint16_t)h);
        if (f == f) CHECK(f32_to_bf16(f) == h);
    }
}

TEST(f16_decode) {
    CHECK(f16_to_f32(0x3c00) == 1.0f);
    CHECK(f16_to_f32(0xc000) == -2.0f);
    CHECK(f16_to_f32(0x0001) == 5.9604644775390625e-08f); /* smallest subnormal */
    CHECK(f16_to_f32(0x7bff) == 65504.0f);
    CHECK(isinf(f16_to_f32(0x7c00)));
}

TEST(err_formats_and_returns_code) {
    char buf[64];
    int rc = ci_err(buf, sizeof buf, CINFER_EFORMAT, "bad %s at %d", "thing", 7);
    CHECK_EQ_INT(rc, CINFER_EFORMAT);
    CHECK(!strcmp(buf, "bad thing at 7"));
    ci_err_prefix(buf, sizeof buf, "file %s", "x.json");
    CHECK(!strcmp(buf, "file x.json: bad thing at 7"));
    CHECK(!strcmp(cinfer_strerror(CINFER_ENOMEM), "out of memory"));
}

typedef struct {
    atomic_long sum;
    long n;
} sum_job;

static void sum_fn(void *ctx, int ith, int nth) {
    sum_job *j = ctx;
    long b, e, s = 0;
    tp_range(j->n, ith, nth, &b, &e);
    for (long i = b; i < e; i++) s += i;
    atomic_fetch_add(&j->sum, s);
}

TEST(threadpool_covers_every_index_once) {
    threadpool *tp = tp_create(2);
    for (int rep = 0; rep < 200; rep++) {
        sum_job j = {0, 1000 + rep};
        tp_run(tp, sum_fn, &j);
        CHECK_EQ_INT(atomic_load(&j.sum), (j.n - 1) * j.n / 2);
    }
    tp_destroy(tp);
    sum_job j = {0, 10};
    tp_run(NULL, sum_fn, &j);
    CHECK_EQ_INT(atomic_load(&j.sum), 45);
}

/* Many tiny jobs on pools of several sizes: every index runs exactly once per job with nth = tp_size, index 0
 * on the calling thread, and tp_run returns only after every index's writes are done (each index spins a
 * little before writing, so a late one would be caught). */
typedef struct {
    int nth_seen;
    long job;
    atomic_int bad_nth;
    pthread_t caller;
    atomic_int zero_elsewhere;
    long ran[8];  /* per index: the job number it last ran for */
    int count[8]; /* per index: runs in this job */
} once_job;

static volatile unsigned once_sink;

static void once_fn(void *ctx, int ith, int nth) {
    once_job *j = ctx;
    if (nth != j->nth_seen) atomic_fetch_add(&j->bad_nth, 1);
    if (ith == 0 && !pthread_equal(pthread_self(), j->caller)) atomic_fetch_add(&j->zero_elsewhere, 1);
    for (int i = 0; i < (int)((j->job * 7 + ith * 13) % 200); i++) once_sink += (unsigned)i;
    j->count[ith]++;
    j->ran[ith] = j->job;
}

TEST(threadpool_each_index_once_per_job_stress) {
    static const int sizes[] = {1, 2, 3, 4, 7};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        threadpool *tp = tp_create(sizes[si]);
        int n = tp_size(tp);
        REQUIRE(n == sizes[si]);
        once_job j = {.nth_seen = n, .caller = pthread_self()};
        for (int i = 0; i < 8; i++) j.ran[i] = -1;
        int bad = 0;
        for (long job = 0; job < 20000; job++) {
            j.job = job;
            for (int i = 0; i < n; i++) j.count[i] = 0;
            tp_run(tp, once_fn, &j);
            for (int i = 0; i < n; i++)
                if (j.count[i] != 1 || j.ran[i] != job) bad++;
        }
        CHECK_EQ_INT(bad, 0);
        CHECK_EQ_INT(atomic_load(&j.bad_nth), 0);
        CHECK_EQ_INT(atomic_load(&j.zero_elsewhere), 0);
        tp_destroy(tp);
    }
}

/* Jobs spaced further apart than the workers spin, so they go to sleep and are woken for each job; and a
 * pool destroyed while its workers sleep. */
TEST(threadpool_wakes_sleeping_workers) {
    threadpool *tp = tp_create(3);
    once_job j = {.nth_seen = 3, .caller = pthread_self()};
    int bad = 0;
    for (long job = 0; job < 12; job++) {
        struct timespec ts = {0, 3 * 1000 * 1000}; /* 3 ms: far past the spin */
        nanosleep(&ts, NULL);
        j.job = job;
        for (int i = 0; i < 3; i++) j.count[i] = 0;
        tp_run(tp, once_fn, &j);
        for (int i = 0; i < 3; i++)
            if (j.count[i] != 1 || j.ran[i] != job) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(atomic_load(&j.zero_elsewhere), 0);
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
    tp_destroy(tp);
}

TEST(tp_range_partitions) {
    for (int nth = 1; nth < 6; nth++) {
        long next = 0;
        for (int i = 0; i < nth; i++) {
            long b, e;
            tp_range(17, i, nth, &b, &e);
            CHECK_EQ_INT(b, next);
            next = e;
        }
        CHECK_EQ_INT(next, 17);
    }
}

TEST(alloc_overflow_check) {
    size_t out;
    CHECK(ci_mul_overflow(SIZE_MAX / 2, 3, &out) < 0);
    CHECK(ci_mul_overflow(1000, 1000, &out) == 0 && out == 1000000);
    void *p = ci_try_alloc(100);
    REQUIRE(p);
    CHECK(((uintptr_t)p & 63) == 0);
    free(p);
    long before = alloc_count();
    free(xmalloc(10));
    CHECK_EQ_INT(alloc_count(), before + 1);
}

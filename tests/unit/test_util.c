/* test_util.c — bf16/f16 conversion, error formatting, the thread pool, the no-alloc guard. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

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

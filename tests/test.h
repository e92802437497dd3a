/* test.h — the test harness: TEST(name) registers a function at load time; CHECK records a failure and
 * goes on, REQUIRE records it and returns from the test. The runner (tests/run.c) prints one line per
 * failure and ends with "N passed, N failed". SKIP(msg) marks a test skipped with a reason. */
#ifndef CI_TEST_H
#define CI_TEST_H

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef void (*test_fn)(void);
void test_register(const char *name, const char *file, test_fn fn);
void test_fail(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void test_skip(const char *reason);
/* Directory of test data (tests/fixtures), from CINFER_FIXTURES or the default relative path. */
const char *test_fixtures_dir(void);
/* A fresh temp directory for this test (removed by the runner at exit). */
const char *test_tmpdir(void);
/* Runs cmd through the shell: its exit status, -1 when it did not exit normally. */
int test_run(const char *cmd);

#define TEST(name)                                                                                        \
    static void name(void);                                                                               \
    __attribute__((constructor)) static void reg_##name(void) { test_register(#name, __FILE__, name); }  \
    static void name(void)

#define CHECK(cond)                                                                                       \
    do {                                                                                                  \
        if (!(cond)) test_fail(__FILE__, __LINE__, "CHECK(%s)", #cond);                                   \
    } while (0)

#define REQUIRE(cond)                                                                                     \
    do {                                                                                                  \
        if (!(cond)) {                                                                                    \
            test_fail(__FILE__, __LINE__, "REQUIRE(%s)", #cond);                                          \
            return;                                                                                       \
        }                                                                                                 \
    } while (0)

#define CHECK_MSG(cond, ...)                                                                              \
    do {                                                                                                  \
        if (!(cond)) test_fail(__FILE__, __LINE__, __VA_ARGS__);                                          \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                                                \
    do {                                                                                                  \
        long long _a = (long long)(a), _b = (long long)(b);                                               \
        if (_a != _b) test_fail(__FILE__, __LINE__, "%s == %s: %lld != %lld", #a, #b, _a, _b);            \
    } while (0)

#define CHECK_STR_CONTAINS(hay, needle)                                                                   \
    do {                                                                                                  \
        const char *_h = (hay), *_n = (needle);                                                           \
        if (!_h || !strstr(_h, _n)) test_fail(__FILE__, __LINE__, "\"%s\" does not contain \"%s\"", _h ? _h : "(null)", _n); \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                                             \
    do {                                                                                                  \
        double _a = (double)(a), _b = (double)(b);                                                        \
        if (!(fabs(_a - _b) <= (tol))) test_fail(__FILE__, __LINE__, "%s ~ %s: %.9g vs %.9g (tol %g)", #a, #b, _a, _b, (double)(tol)); \
    } while (0)

#define SKIP(reason)                                                                                      \
    do {                                                                                                  \
        test_skip(reason);                                                                                \
        return;                                                                                           \
    } while (0)

#endif

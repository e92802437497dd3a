/* fixture.h — open a model fixture of tests/fixtures (test_fixtures_dir) by name for a test; a fixture that
 * does not open fails the test with the loader's message. Shared by the tests that build contexts and engines
 * on the parity fixtures. */
#ifndef CI_FIXTURE_H
#define CI_FIXTURE_H

#include <stdio.h>

#include "cinfer.h"
#include "test.h"

static inline cinfer_model *open_fixture(const char *name) {
    char dir[512], err[512];
    snprintf(dir, sizeof dir, "%s/%s", test_fixtures_dir(), name);
    cinfer_model *m = NULL;
    if (cinfer_model_open(dir, &m, err, sizeof err)) test_fail(__FILE__, __LINE__, "%s", err);
    return m;
}

#endif

/* test_npy.c — .npy write/parse round trip and rejection of malformed files. */
#include <stdlib.h>
#include <string.h>

#include "cinfer.h"
#include "test.h"
#include "util/file.h"
#include "util/npy.h"

TEST(npy_round_trip) {
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/a.npy", test_tmpdir());
    float v[6] = {1, -2, 3.5f, 0, 1e-3f, 7};
    int64_t shape[2] = {2, 3};
    REQUIRE(npy_write_f32(path, v, shape, 2, err, sizeof err) == 0);
    char *buf;
    size_t len;
    REQUIRE(file_read_all(path, 1 << 20, &buf, &len, err, sizeof err) == 0);
    CHECK_EQ_INT((len - 6 * 4) % 64, 0); /* header padded to 64 bytes */
    npy_array a;
    REQUIRE(npy_parse_f32(buf, len, &a, err, sizeof err) == 0);
    CHECK_EQ_INT(a.ndim, 2);
    CHECK_EQ_INT(a.shape[0], 2);
    CHECK_EQ_INT(a.shape[1], 3);
    CHECK(!memcmp(a.data, v, sizeof v));
    /* truncated data, wrong magic, wrong dtype */
    CHECK(npy_parse_f32(buf, len - 4, &a, err, sizeof err) == CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "shape needs");
    buf[1] = 'X';
    CHECK(npy_parse_f32(buf, len, &a, err, sizeof err) == CINFER_EFORMAT);
    buf[1] = 'N';
    char *d = strstr(buf + 10, "<f4");
    REQUIRE(d);
    d[2] = '8';
    CHECK(npy_parse_f32(buf, len, &a, err, sizeof err) == CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "dtype");
    free(buf);
}

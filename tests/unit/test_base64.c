/* test_base64.c — b64_decode (RFC 4648 vectors, URL-safe alphabet, whitespace, missing padding, every kind
 * of malformed input) and data_url_split. */
#include <stdint.h>
#include <string.h>

#include "cinfer.h"
#include "test.h"
#include "util/base64.h"

static int dec(const char *s, char *out, size_t cap, size_t *len) {
    char err[128];
    int rc = b64_decode(s, strlen(s), (uint8_t *)out, cap, len, err, sizeof err);
    if (rc == 0) out[*len] = 0;
    return rc;
}

TEST(b64_rfc4648_vectors) {
    const char *enc[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
    const char *raw[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    for (int i = 0; i < 7; i++) {
        char out[16];
        size_t n;
        REQUIRE(dec(enc[i], out, sizeof out - 1, &n) == 0);
        CHECK_MSG(n == strlen(raw[i]) && !strcmp(out, raw[i]), "%s -> %s", enc[i], out);
        CHECK(b64_decoded_max(strlen(enc[i])) >= n);
    }
}

TEST(b64_lenient_forms) {
    char out[32];
    size_t n;
    CHECK(dec("Zm9vYg", out, 31, &n) == 0 && !strcmp(out, "foob"));         /* no padding */
    CHECK(dec("Zm9v\r\nYmFy", out, 31, &n) == 0 && !strcmp(out, "foobar")); /* MIME line break */
    CHECK(dec("-_-_", out, 31, &n) == 0 && n == 3 && (unsigned char)out[0] == 0xfb &&
          (unsigned char)out[1] == 0xff && (unsigned char)out[2] == 0xbf);
    CHECK(dec("+/+/", out, 31, &n) == 0 && (unsigned char)out[0] == 0xfb);
}

TEST(b64_malformed) {
    char out[32], err[128];
    size_t n;
    CHECK_EQ_INT(b64_decode("Zm9v!", 5, (uint8_t *)out, 31, &n, err, sizeof err), CINFER_EFORMAT);
    CHECK_STR_CONTAINS(err, "offset 4");
    CHECK_EQ_INT(dec("Zm9vY", out, 31, &n), CINFER_EFORMAT);    /* lone final character */
    CHECK_EQ_INT(dec("Zg==Zg==", out, 31, &n), CINFER_EFORMAT); /* data after padding */
    CHECK_EQ_INT(dec("Zm9v=", out, 31, &n), CINFER_EFORMAT);    /* padding after a whole group */
    CHECK_EQ_INT(dec("Zg===", out, 31, &n), CINFER_EFORMAT);    /* too much padding */
    CHECK_EQ_INT(dec("Zm9vYmFy", out, 4, &n), CINFER_ERANGE);   /* output too small */
    CHECK_EQ_INT(b64_decode("Zm\0v", 4, (uint8_t *)out, 31, &n, err, sizeof err), CINFER_EFORMAT);
}

TEST(data_url_split_forms) {
    const char *mime, *b64;
    size_t ml, bl;
    char err[128];
    const char *u = "data:image/png;base64,iVBORw0KGgo=";
    REQUIRE(data_url_split(u, strlen(u), &mime, &ml, &b64, &bl, err, sizeof err) == 0);
    CHECK(ml == 9 && !strncmp(mime, "image/png", 9));
    CHECK(bl == 12 && !strncmp(b64, "iVBORw0KGgo=", 12));
    const char *u2 = "DATA:image/jpeg;name=x.jpg;BASE64,AAAA";
    REQUIRE(data_url_split(u2, strlen(u2), &mime, &ml, &b64, &bl, err, sizeof err) == 0);
    CHECK(ml == 10 && bl == 4);
    const char *u3 = "data:;base64,AAAA";
    REQUIRE(data_url_split(u3, strlen(u3), &mime, &ml, &b64, &bl, err, sizeof err) == 0);
    CHECK_EQ_INT(ml, 0);
    const char *bad[] = {"http://example.com/a.png",  "data:image/png,rawbytes",
                         "data:image/png;base64",     "dat",
                         "data:image/png;base64x,AA", "data:ima\x01ge/png;base64,AA"};
    for (int i = 0; i < 6; i++)
        CHECK_MSG(data_url_split(bad[i], strlen(bad[i]), &mime, &ml, &b64, &bl, err, sizeof err) ==
                      CINFER_EFORMAT,
                  "%s accepted", bad[i]);
}

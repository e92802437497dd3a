/* test_stop.c — the stop-string matcher: stops split across deltas at every byte position, overlapping
 * prefixes, which stop wins, multibyte text (nothing emitted ends inside a character), text without a stop
 * emitted in full at finish, and a randomised comparison against a whole-text reference under random
 * chunkings. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cinfer.h"
#include "sample/sample.h"
#include "sample/stop.h"
#include "test.h"

typedef struct {
    char out[4096]; /* everything emitted */
    size_t n;
    int matched;  /* stop index or -1 */
    int bad_utf8; /* an emitted piece ended inside a UTF-8 character */
    int max_held;
} run_result;

/* 1 if s[0..n) ends with a complete UTF-8 character (or is empty). */
static int ends_clean(const char *s, size_t n) {
    if (!n) return 1;
    size_t j = n - 1;
    int back = 0;
    while (j > 0 && back < 3 && ((unsigned char)s[j] & 0xC0) == 0x80) j--, back++;
    unsigned char b = (unsigned char)s[j];
    size_t need = b < 0x80 ? 1 : (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 1;
    return j + need == n;
}

/* Feeds text cut at the given points (cuts ascending, within (0, len)), then finishes. */
static void run(stop_matcher *m, const char *text, size_t len, const size_t *cuts, int n_cuts,
                run_result *r) {
    memset(r, 0, sizeof *r);
    r->matched = -1;
    char buf[4096 + STOP_HOLD_MAX];
    size_t prev = 0;
    for (int i = 0; i <= n_cuts; i++) {
        size_t end = i < n_cuts ? cuts[i] : len, k = 0;
        int rc = stop_feed(m, text + prev, end - prev, buf, sizeof buf, &k);
        CHECK(rc == 0 || rc == 1);
        if (!ends_clean(buf, k)) r->bad_utf8 = 1;
        memcpy(r->out + r->n, buf, k);
        r->n += k;
        if ((int)m->n_held > r->max_held) r->max_held = (int)m->n_held;
        prev = end;
        if (rc == 1) {
            r->matched = m->matched;
            /* after a match: further text is refused and finish sends nothing */
            CHECK_EQ_INT(stop_feed(m, "x", 1, buf, sizeof buf, &k), CINFER_ESTATE);
            CHECK_EQ_INT(stop_finish(m, buf, sizeof buf, &k), 0);
            CHECK_EQ_INT(k, 0);
            return;
        }
    }
    size_t k = 0;
    CHECK_EQ_INT(stop_finish(m, buf, sizeof buf, &k), 0);
    memcpy(r->out + r->n, buf, k);
    r->n += k;
}

static void init(stop_matcher *m, const char *const *stops, int n) {
    char err[128];
    int rc = stop_init(m, stops, NULL, n, err, sizeof err);
    CHECK_MSG(rc == 0, "stop_init: %s", err);
}

/* The whole-text reference: the occurrence that ends first, ties to the earlier start. */
static void reference(const char *text, size_t len, const char *const *stops, const size_t *lens, int n,
                      size_t *out_len, int *which) {
    size_t best_end = SIZE_MAX, best_start = 0;
    *which = -1;
    for (int i = 0; i < n; i++) {
        const char *h = memmem(text, len, stops[i], lens[i]);
        if (!h) continue;
        size_t st = (size_t)(h - text), end = st + lens[i];
        if (end < best_end || (end == best_end && st < best_start)) {
            best_end = end;
            best_start = st;
            *which = i;
        }
    }
    *out_len = *which >= 0 ? best_start : len;
}

TEST(stop_split_at_every_byte) {
    const char *text = "Hello world, this is the END of it. More after.";
    const char *stops[1] = {"END"};
    size_t len = strlen(text), want = strstr(text, "END") - text;
    stop_matcher m;
    for (size_t i = 1; i < len; i++)
        for (size_t j = i; j < len; j++) {
            size_t cuts[2] = {i, j};
            init(&m, stops, 1);
            run_result r;
            run(&m, text, len, cuts, i == j ? 1 : 2, &r);
            CHECK_MSG(r.matched == 0 && r.n == want && !memcmp(r.out, text, want),
                      "cuts %zu,%zu: matched %d, %zu bytes emitted", i, j, r.matched, r.n);
        }
    /* one byte at a time */
    size_t cuts[64];
    for (size_t i = 1; i < len; i++) cuts[i - 1] = i;
    init(&m, stops, 1);
    run_result r;
    run(&m, text, len, cuts, (int)len - 1, &r);
    CHECK_EQ_INT(r.matched, 0);
    CHECK_EQ_INT(r.n, want);
}

TEST(stop_partial_is_held_then_released) {
    const char *stops[2] = {"abc", "bcd"};
    stop_matcher m;
    init(&m, stops, 2);
    char buf[64];
    size_t k;
    /* "ab" could start "abc", and "b" could start "bcd": all of "ab" is held */
    CHECK_EQ_INT(stop_feed(&m, "xab", 3, buf, sizeof buf, &k), 0);
    CHECK_EQ_INT(k, 1);
    CHECK(!memcmp(buf, "x", 1));
    CHECK_EQ_INT(m.n_held, 2);
    /* "abx" cannot grow into either: released */
    CHECK_EQ_INT(stop_feed(&m, "x", 1, buf, sizeof buf, &k), 0);
    CHECK_EQ_INT(k, 3);
    CHECK(!memcmp(buf, "abx", 3));
    /* "ab" then "cd": "abc" ends first, at c */
    init(&m, stops, 2);
    CHECK_EQ_INT(stop_feed(&m, "ab", 2, buf, sizeof buf, &k), 0);
    CHECK_EQ_INT(k, 0);
    CHECK_EQ_INT(stop_feed(&m, "cd", 2, buf, sizeof buf, &k), 1);
    CHECK_EQ_INT(m.matched, 0);
    CHECK_EQ_INT(k, 0);
    /* "ab" then "d": neither completes; "abd" does not start either */
    init(&m, stops, 2);
    stop_feed(&m, "ab", 2, buf, sizeof buf, &k);
    CHECK_EQ_INT(stop_feed(&m, "d", 1, buf, sizeof buf, &k), 0);
    CHECK_EQ_INT(k, 3);
    /* "bcd" wins over "abce" when it completes first, even though "abce" would start earlier */
    const char *stops2[2] = {"abce", "bcd"};
    init(&m, stops2, 2);
    CHECK_EQ_INT(stop_feed(&m, "zabc", 4, buf, sizeof buf, &k), 0);
    CHECK_EQ_INT(k, 1); /* "abc" held: prefix of "abce" */
    CHECK_EQ_INT(stop_feed(&m, "de", 2, buf, sizeof buf, &k), 1);
    CHECK_EQ_INT(m.matched, 1);
    CHECK_EQ_INT(k, 1);
    CHECK(!memcmp(buf, "a", 1));
    /* the same text in one delta gives the same answer */
    init(&m, stops2, 2);
    CHECK_EQ_INT(stop_feed(&m, "zabcde", 6, buf, sizeof buf, &k), 1);
    CHECK_EQ_INT(m.matched, 1);
    CHECK_EQ_INT(k, 2);
    CHECK(!memcmp(buf, "za", 2));
    /* ending at the same byte: the longer (earlier-starting) one */
    const char *stops3[2] = {"cd", "bcd"};
    init(&m, stops3, 2);
    CHECK_EQ_INT(stop_feed(&m, "abcdef", 6, buf, sizeof buf, &k), 1);
    CHECK_EQ_INT(m.matched, 1);
    CHECK_EQ_INT(k, 1);
    /* a stop at the very start emits nothing */
    init(&m, stops3, 2);
    CHECK_EQ_INT(stop_feed(&m, "cd and more", 11, buf, sizeof buf, &k), 1);
    CHECK_EQ_INT(k, 0);
    /* a self-overlapping stop: "aab" in "aaab" */
    const char *stops4[1] = {"aab"};
    init(&m, stops4, 1);
    CHECK_EQ_INT(stop_feed(&m, "a", 1, buf, sizeof buf, &k), 0);
    CHECK_EQ_INT(stop_feed(&m, "a", 1, buf, sizeof buf, &k), 0);
    CHECK_EQ_INT(stop_feed(&m, "a", 1, buf, sizeof buf, &k), 0);
    CHECK_EQ_INT(k, 1); /* "aaa": only the last two can still begin "aab" */
    CHECK_EQ_INT(stop_feed(&m, "b", 1, buf, sizeof buf, &k), 1);
    CHECK_EQ_INT(k, 0);
}

TEST(stop_no_stop_emitted_in_full) {
    const char *text = "The quick brown fox jumps over the lazy dog; the end is near but not here.";
    const char *stops[3] = {"STOP", "</s>", "the end is here"};
    size_t len = strlen(text);
    stop_matcher m;
    for (size_t i = 1; i < len; i += 3) {
        size_t cuts[1] = {i};
        init(&m, stops, 3);
        run_result r;
        run(&m, text, len, cuts, 1, &r);
        CHECK_EQ_INT(r.matched, -1);
        CHECK_EQ_INT(r.n, len);
        CHECK(!memcmp(r.out, text, len));
    }
    /* text ending in a partial stop: held while streaming, sent at finish */
    init(&m, stops, 3);
    char buf[128];
    size_t k;
    CHECK_EQ_INT(stop_feed(&m, "so the end is", 13, buf, sizeof buf, &k), 0);
    CHECK_EQ_INT(k, 3);
    CHECK_EQ_INT(stop_finish(&m, buf, sizeof buf, &k), 0);
    CHECK_EQ_INT(k, 10);
    CHECK(!memcmp(buf, "the end is", 10));
    /* no stops at all: everything passes straight through */
    init(&m, NULL, 0);
    CHECK_EQ_INT(stop_feed(&m, "abc", 3, buf, sizeof buf, &k), 0);
    CHECK_EQ_INT(k, 3);
}

TEST(stop_multibyte) {
    /* é = C3 A9, 世 = E4 B8 96, 😀 = F0 9F 98 80 */
    const char *text = "caf\xC3\xA9 \xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\x98\x80!! \xE4\xB8\x96 end";
    const char *stops[2] = {"\xF0\x9F\x98\x80!!", "\xC3\xA9\xC3\xA9"};
    size_t len = strlen(text), want = strstr(text, "\xF0\x9F\x98\x80!!") - text;
    stop_matcher m;
    for (size_t i = 1; i < len; i++)
        for (size_t j = i + 1; j < len; j++) {
            size_t cuts[2] = {i, j};
            init(&m, stops, 2);
            run_result r;
            run(&m, text, len, cuts, 2, &r);
            CHECK_MSG(r.matched == 0 && r.n == want && !memcmp(r.out, text, want), "cuts %zu,%zu", i, j);
            CHECK_MSG(!r.bad_utf8, "cuts %zu,%zu: an emitted piece ends inside a character", i, j);
        }
    /* a partial character with no stop involved is held, then released whole */
    init(&m, NULL, 0);
    char buf[64];
    size_t k;
    CHECK_EQ_INT(stop_feed(&m, "caf\xC3", 4, buf, sizeof buf, &k), 0);
    CHECK_EQ_INT(k, 3);
    CHECK_EQ_INT(stop_feed(&m, "\xA9\xF0\x9F", 3, buf, sizeof buf, &k), 0);
    CHECK_EQ_INT(k, 2);
    CHECK(!memcmp(buf, "\xC3\xA9", 2));
    CHECK_EQ_INT(stop_feed(&m, "\x98", 1, buf, sizeof buf, &k), 0);
    CHECK_EQ_INT(k, 0);
    CHECK_EQ_INT(stop_feed(&m, "\x80", 1, buf, sizeof buf, &k), 0);
    CHECK_EQ_INT(k, 4);
    /* invalid bytes are passed through, not held forever: a lone lead byte followed by ASCII */
    CHECK_EQ_INT(stop_feed(&m, "\xE4z", 2, buf, sizeof buf, &k), 0);
    CHECK_EQ_INT(k, 2);
    /* at finish, an incomplete character is sent as it is (the text ended there) */
    CHECK_EQ_INT(stop_feed(&m, "\xE4\xB8", 2, buf, sizeof buf, &k), 0);
    CHECK_EQ_INT(k, 0);
    CHECK_EQ_INT(stop_finish(&m, buf, sizeof buf, &k), 0);
    CHECK_EQ_INT(k, 2);
}

TEST(stop_rejects_bad_input) {
    stop_matcher m;
    char err[128], buf[8];
    size_t k;
    const char *empty[1] = {""};
    CHECK_EQ_INT(stop_init(&m, empty, NULL, 1, err, sizeof err), CINFER_EINVAL);
    const char *bad_utf8[1] = {"\xA9x"};
    CHECK_EQ_INT(stop_init(&m, bad_utf8, NULL, 1, err, sizeof err), CINFER_EINVAL);
    CHECK_STR_CONTAINS(err, "UTF-8");
    const char *many[STOP_MAX + 1];
    for (int i = 0; i <= STOP_MAX; i++) many[i] = "x";
    CHECK_EQ_INT(stop_init(&m, many, NULL, STOP_MAX + 1, err, sizeof err), CINFER_EINVAL);
    CHECK_EQ_INT(stop_init(&m, many, NULL, STOP_MAX, err, sizeof err), 0);
    char longs[STOP_MAX_LEN + 2];
    memset(longs, 'a', sizeof longs);
    const char *lp[1] = {longs};
    size_t ll = STOP_MAX_LEN + 1;
    CHECK_EQ_INT(stop_init(&m, lp, &ll, 1, err, sizeof err), CINFER_EINVAL);
    ll = STOP_MAX_LEN;
    REQUIRE(stop_init(&m, lp, &ll, 1, err, sizeof err) == 0);
    /* a full-length stop: 255 bytes held, nothing lost */
    char big[STOP_MAX_LEN];
    memset(big, 'a', sizeof big);
    char out[STOP_MAX_LEN + STOP_HOLD_MAX];
    CHECK_EQ_INT(stop_feed(&m, big, STOP_MAX_LEN - 1, out, sizeof out, &k), 0);
    CHECK_EQ_INT(k, 0);
    CHECK_EQ_INT(m.n_held, STOP_MAX_LEN - 1);
    /* an output buffer too small is refused without consuming anything */
    CHECK_EQ_INT(stop_feed(&m, "b", 1, buf, sizeof buf, &k), CINFER_ERANGE);
    CHECK_EQ_INT(m.n_held, STOP_MAX_LEN - 1);
    CHECK_EQ_INT(stop_feed(&m, "a", 1, out, sizeof out, &k), 1);
    CHECK_EQ_INT(k, 0);
}

TEST(stop_random_against_reference) {
    /* alphabet with multibyte characters and stops that share prefixes and overlap */
    static const char *atoms[] = {"a", "b", "c", "\xC3\xA9", "\xE4\xB8\x96", " ", "\xF0\x9F\x98\x80"};
    static const char *pool[] = {"ab",
                                 "abc",
                                 "bca",
                                 "cab",
                                 "\xC3\xA9"
                                 "a",
                                 "a\xE4\xB8\x96",
                                 "aaa",
                                 "b b",
                                 "\xF0\x9F\x98\x80\xF0\x9F\x98\x80",
                                 "c\xC3\xA9"
                                 "c"};
    rng r;
    rng_seed(&r, 4242);
    int matched_cases = 0;
    for (int trial = 0; trial < 3000; trial++) {
        char text[512];
        size_t len = 0;
        int n_atoms = 1 + (int)(rng_next(&r) % 60);
        for (int i = 0; i < n_atoms; i++) {
            const char *a = atoms[rng_next(&r) % (sizeof atoms / sizeof atoms[0])];
            memcpy(text + len, a, strlen(a));
            len += strlen(a);
        }
        int ns = 1 + (int)(rng_next(&r) % 4);
        const char *stops[4];
        size_t lens[4];
        for (int i = 0; i < ns; i++) {
            stops[i] = pool[rng_next(&r) % (sizeof pool / sizeof pool[0])];
            lens[i] = strlen(stops[i]);
        }
        size_t want_len;
        int want_which;
        reference(text, len, stops, lens, ns, &want_len, &want_which);
        /* random cuts, anywhere (also inside characters) */
        size_t cuts[32];
        int nc = 0;
        for (size_t pos = 1 + rng_next(&r) % 8; pos < len && nc < 32; pos += 1 + rng_next(&r) % 8)
            cuts[nc++] = pos;
        stop_matcher m;
        char err[128];
        REQUIRE(stop_init(&m, stops, lens, ns, err, sizeof err) == 0);
        run_result res;
        run(&m, text, len, cuts, nc, &res);
        int which = res.matched >= 0 ? res.matched : -1;
        /* equal stop strings may appear twice in the pool draw: compare the strings, not the indices */
        int same_stop =
            which == want_which || (which >= 0 && want_which >= 0 && lens[which] == lens[want_which] &&
                                    !memcmp(stops[which], stops[want_which], lens[which]));
        CHECK_MSG(same_stop && res.n == want_len && !memcmp(res.out, text, want_len),
                  "trial %d: matched %d (want %d), %zu bytes (want %zu)", trial, which, want_which, res.n,
                  want_len);
        CHECK_MSG(!res.bad_utf8, "trial %d: an emitted piece ends inside a character", trial);
        CHECK(res.max_held <= STOP_HOLD_MAX);
        matched_cases += want_which >= 0;
    }
    /* the draw must exercise both outcomes */
    CHECK(matched_cases > 300 && matched_cases < 2700);
}

/* test_server_watch.c — the connection watcher: a peer that closes or resets its socket gets its callback
 * once, promptly; an entry removed first never does (even when its fd is then closed); pipelined bytes
 * are not a hang-up; fire_all runs every callback; destroy with entries left is clean. */
#include <poll.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/watch.h"
#include "test.h"

static void on_gone(void *ud) {
    atomic_fetch_add((atomic_int *)ud, 1);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Waits up to ms for *v to reach want; returns the value seen last. */
static int wait_for(atomic_int *v, int want, double ms) {
    double t0 = now_ms();
    while (atomic_load(v) < want && now_ms() - t0 < ms) {
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return atomic_load(v);
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

TEST(watch_reports_a_closed_peer_once) {
    srv_watch *w = NULL;
    char err[256];
    REQUIRE(watch_create(&w, err, sizeof err) == 0);
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    atomic_int hits = 0;
    uint64_t id = watch_add(w, sv[0], on_gone, &hits);
    CHECK(id > 0);
    CHECK_EQ_INT(watch_count(w), 1);
    sleep_ms(20);
    CHECK_EQ_INT(atomic_load(&hits), 0); /* nothing happened yet */
    double t0 = now_ms();
    close(sv[1]);
    CHECK_EQ_INT(wait_for(&hits, 1, 2000), 1);
    CHECK_MSG(now_ms() - t0 < 500, "hang-up reported after %.0f ms", now_ms() - t0);
    sleep_ms(20);
    CHECK_EQ_INT(atomic_load(&hits), 1); /* once, and the entry is gone */
    CHECK_EQ_INT(watch_count(w), 0);
    watch_remove(w, id); /* after the callback: a no-op */
    close(sv[0]);
    watch_destroy(w);
}

TEST(watch_removed_entry_is_never_called) {
    srv_watch *w = NULL;
    char err[256];
    REQUIRE(watch_create(&w, err, sizeof err) == 0);
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    atomic_int hits = 0;
    uint64_t id = watch_add(w, sv[0], on_gone, &hits);
    REQUIRE(id > 0);
    watch_remove(w, id);
    CHECK_EQ_INT(watch_count(w), 0);
    close(sv[1]);
    close(sv[0]); /* the fd the thread may still hold in its snapshot: POLLNVAL must not call anything */
    sleep_ms(50);
    CHECK_EQ_INT(atomic_load(&hits), 0);
    watch_destroy(w);
}

TEST(watch_pipelined_bytes_are_not_a_hangup) {
    srv_watch *w = NULL;
    char err[256];
    REQUIRE(watch_create(&w, err, sizeof err) == 0);
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    atomic_int hits = 0;
    uint64_t id = watch_add(w, sv[0], on_gone, &hits);
    REQUIRE(id > 0);
    CHECK(write(sv[1], "GET / HTTP/1.1\r\n", 16) == 16); /* unread data: readable, but the peer is there */
    sleep_ms(50);
    CHECK_EQ_INT(atomic_load(&hits), 0);
    CHECK_EQ_INT(watch_count(w), 1);
    shutdown(sv[1], SHUT_WR); /* then the peer's FIN, data still unread */
    CHECK_EQ_INT(wait_for(&hits, 1, 2000), 1);
    watch_remove(w, id);
    close(sv[0]);
    close(sv[1]);
    watch_destroy(w);
}

TEST(watch_many_entries_only_the_closed_ones_fire) {
    enum { N = 40 };
    srv_watch *w = NULL;
    char err[256];
    REQUIRE(watch_create(&w, err, sizeof err) == 0);
    int sv[N][2];
    atomic_int hits[N];
    uint64_t id[N];
    for (int i = 0; i < N; i++) {
        REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv[i]) == 0);
        atomic_init(&hits[i], 0);
        id[i] = watch_add(w, sv[i][0], on_gone, &hits[i]);
        CHECK(id[i] > 0);
    }
    CHECK_EQ_INT(watch_count(w), N);
    for (int i = 0; i < N; i += 3) close(sv[i][1]);
    for (int i = 0; i < N; i += 3) CHECK_EQ_INT(wait_for(&hits[i], 1, 2000), 1);
    sleep_ms(30);
    int fired = 0;
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT(atomic_load(&hits[i]), i % 3 == 0);
        fired += atomic_load(&hits[i]);
    }
    CHECK_EQ_INT(watch_count(w), N - fired);
    /* shutdown: fire_all calls each remaining entry once */
    watch_fire_all(w);
    CHECK_EQ_INT(watch_count(w), 0);
    for (int i = 0; i < N; i++) CHECK_EQ_INT(atomic_load(&hits[i]), 1);
    for (int i = 0; i < N; i++) {
        watch_remove(w, id[i]);
        close(sv[i][0]);
        if (i % 3) close(sv[i][1]);
    }
    watch_destroy(w);
}

TEST(watch_destroy_with_entries_and_bad_arguments) {
    srv_watch *w = NULL;
    char err[256];
    REQUIRE(watch_create(&w, err, sizeof err) == 0);
    atomic_int hits = 0;
    CHECK_EQ_INT(watch_add(w, -1, on_gone, &hits), 0);
    CHECK_EQ_INT(watch_add(w, 0, NULL, &hits), 0);
    CHECK_EQ_INT(watch_add(NULL, 0, on_gone, &hits), 0);
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    CHECK(watch_add(w, sv[0], on_gone, &hits) > 0);
    watch_destroy(w); /* entries left: dropped without callbacks */
    CHECK_EQ_INT(atomic_load(&hits), 0);
    close(sv[0]);
    close(sv[1]);
}

/* watch.c — see watch.h. The thread polls a snapshot of the entries plus an eventfd that says "the list
 * changed"; after every wake it re-reads the list under the lock, so an entry removed (and its fd perhaps
 * closed and reused) while poll() ran is never acted on: callbacks are matched by id, not by fd. */
#include "server/watch.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "cinfer.h"
#include "util/alloc.h"
#include "util/err.h"

#define WATCH_MAX 65536 /* entries at most: far past any connection limit */

typedef struct entry {
    uint64_t id;
    int fd;
    srv_watch_fn fn;
    void *ud;
} entry;

struct srv_watch {
    pthread_t thread;
    pthread_mutex_t mu;
    int wake_fd; /* eventfd: the list changed, or stop */
    int stop;    /* under mu */
    entry *e;    /* [n], under mu */
    int n, cap;
    uint64_t next_id;
};

static void wake(srv_watch *w) {
    uint64_t one = 1;
    /* a full counter (EAGAIN) already means "wake up": nothing is lost */
    ssize_t r = write(w->wake_fd, &one, sizeof one);
    (void)r;
}

/* Drops entry i (under mu); order does not matter. */
static void drop(srv_watch *w, int i) {
    w->e[i] = w->e[--w->n];
}

static void *watch_main(void *arg) {
    srv_watch *w = arg;
    struct pollfd *pf = NULL;
    uint64_t *ids = NULL;
    int cap = 0;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        if (w->stop) {
            pthread_mutex_unlock(&w->mu);
            break;
        }
        int n = w->n;
        if (n + 1 > cap) {
            cap = 2 * (n + 1);
            pf = xrealloc(pf, (size_t)cap * sizeof *pf);
            ids = xrealloc(ids, (size_t)cap * sizeof *ids);
        }
        pf[0] = (struct pollfd){.fd = w->wake_fd, .events = POLLIN};
        for (int i = 0; i < n; i++) {
            /* POLLRDHUP: the peer's FIN (an HTTP client does not half-close while it waits for the
             * answer). POLLIN is not asked for: pipelined bytes of a next request would wake us forever. */
            pf[i + 1] = (struct pollfd){.fd = w->e[i].fd, .events = POLLRDHUP};
            ids[i] = w->e[i].id;
        }
        pthread_mutex_unlock(&w->mu);
        int rc = poll(pf, (nfds_t)n + 1, -1);
        if (rc < 0) {
            if (errno == EINTR) continue;
            /* poll itself failed (ENOMEM): back off rather than spin; the HTTP threads' own checks still run
             */
            struct timespec ts = {0, 50 * 1000 * 1000};
            nanosleep(&ts, NULL);
            continue;
        }
        if (pf[0].revents) {
            uint64_t v;
            ssize_t r = read(w->wake_fd, &v, sizeof v);
            (void)r;
        }
        pthread_mutex_lock(&w->mu);
        for (int i = 0; i < n; i++) {
            if (!(pf[i + 1].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))) continue;
            for (int k = 0; k < w->n; k++)
                if (w->e[k].id == ids[i]) {
                    w->e[k].fn(w->e[k].ud);
                    drop(w, k);
                    break;
                }
        }
        pthread_mutex_unlock(&w->mu);
    }
    free(pf);
    free(ids);
    return NULL;
}

int watch_create(srv_watch **out, char *err, size_t errlen) {
    *out = NULL;
    srv_watch *w = xcalloc(1, sizeof *w);
    w->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (w->wake_fd < 0) {
        int e = errno;
        free(w);
        return ci_err(err, errlen, CINFER_EIO, "eventfd: %s", strerror(e));
    }
    pthread_mutex_init(&w->mu, NULL);
    w->next_id = 1;
    if (pthread_create(&w->thread, NULL, watch_main, w)) {
        close(w->wake_fd);
        pthread_mutex_destroy(&w->mu);
        free(w);
        return ci_err(err, errlen, CINFER_ENOMEM, "cannot start the connection watcher thread");
    }
    *out = w;
    return 0;
}

void watch_destroy(srv_watch *w) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_mutex_unlock(&w->mu);
    wake(w);
    pthread_join(w->thread, NULL);
    close(w->wake_fd);
    pthread_mutex_destroy(&w->mu);
    free(w->e);
    free(w);
}

uint64_t watch_add(srv_watch *w, int fd, srv_watch_fn fn, void *ud) {
    if (!w || fd < 0 || !fn) return 0;
    pthread_mutex_lock(&w->mu);
    if (w->n >= WATCH_MAX) {
        pthread_mutex_unlock(&w->mu);
        return 0;
    }
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 16;
        w->e = xrealloc(w->e, (size_t)w->cap * sizeof *w->e);
    }
    uint64_t id = w->next_id++;
    w->e[w->n++] = (entry){id, fd, fn, ud};
    pthread_mutex_unlock(&w->mu);
    wake(w);
    return id;
}

void watch_remove(srv_watch *w, uint64_t id) {
    if (!w || !id) return;
    pthread_mutex_lock(&w->mu);
    for (int k = 0; k < w->n; k++)
        if (w->e[k].id == id) {
            drop(w, k);
            break;
        }
    pthread_mutex_unlock(&w->mu);
    /* the thread's snapshot may still hold this fd: wake it so a closed fd is not polled (POLLNVAL
     * would only cost one more pass, but a reused fd would be watched for nothing) */
    wake(w);
}

void watch_fire_all(srv_watch *w) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    for (int k = 0; k < w->n; k++) w->e[k].fn(w->e[k].ud);
    w->n = 0;
    pthread_mutex_unlock(&w->mu);
    wake(w);
}

int watch_count(srv_watch *w) {
    if (!w) return 0;
    pthread_mutex_lock(&w->mu);
    int n = w->n;
    pthread_mutex_unlock(&w->mu);
    return n;
}

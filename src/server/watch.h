/* watch.h — one thread that watches the sockets of clients waiting on a generation and reports hang-ups.
 * Without it each waiting HTTP thread had to wake every few milliseconds to poll its own socket: with 64
 * streams queued behind a long prefill that was ~3,000 wake-ups a second taken from the compute threads
 * on a 2-vCPU machine. With it the HTTP threads sleep on the engine's events; a client that goes away gets
 * its callback (which cancels the engine requests, so their DONE wakes the HTTP thread). */
#ifndef CI_SRV_WATCH_H
#define CI_SRV_WATCH_H

#include <stddef.h>
#include <stdint.h>

typedef struct srv_watch srv_watch;

/* Runs on the watcher thread with the watch's lock held: keep it short and do not call back into the
 * watch. */
typedef void (*srv_watch_fn)(void *ud);

/* Starts the watcher thread. 0, or a negative CINFER_E* code with err filled. */
int watch_create(srv_watch **out, char *err, size_t errlen);
/* Stops and joins the thread; entries still present are dropped without their callbacks. */
void watch_destroy(srv_watch *w);

/* Watches fd (a connected socket) until watch_remove: when the peer closes or resets it, fn(ud) runs once
 * and the entry is dropped. Returns the entry's id (> 0), or 0 when the watch is full or absent (the
 * caller must then poll the socket itself). */
uint64_t watch_add(srv_watch *w, int fd, srv_watch_fn fn, void *ud);
/* Drops the entry (a no-op if its callback already ran). After it returns, fn for this entry is not
 * running and never will, so ud may be freed. */
void watch_remove(srv_watch *w, uint64_t id);
/* Runs every entry's callback now and drops them all (shutdown: wakes every waiting HTTP thread). */
void watch_fire_all(srv_watch *w);
/* Entries being watched (tests, metrics). */
int watch_count(srv_watch *w);

#endif

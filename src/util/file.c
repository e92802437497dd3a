/* file.c — see file.h. */
#include "util/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/alloc.h"
#include "util/err.h"

int file_read_all(const char *path, size_t max_bytes, char **out, size_t *out_len, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ci_err(err, errlen, errno == ENOENT ? CINFER_ENOTFOUND : CINFER_EIO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return ci_err(err, errlen, CINFER_EIO, "%s: not a regular file", path);
    }
    if ((size_t)st.st_size > max_bytes) {
        close(fd);
        return ci_err(err, errlen, CINFER_ERANGE, "%s: %lld bytes is over the limit of %zu", path,
                      (long long)st.st_size, max_bytes);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return ci_err(err, errlen, CINFER_ENOMEM, "%s: cannot allocate %zu bytes", path, n + 1);
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            free(buf);
            close(fd);
            return ci_err(err, errlen, CINFER_EIO, "%s: read failed: %s", path, r < 0 ? strerror(errno) : "short read");
        }
        got += (size_t)r;
    }
    close(fd);
    buf[n] = 0;
    *out = buf;
    if (out_len) *out_len = n;
    return 0;
}

int file_map(const char *path, const void **out, size_t *out_len, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ci_err(err, errlen, errno == ENOENT ? CINFER_ENOTFOUND : CINFER_EIO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return ci_err(err, errlen, CINFER_EIO, "%s: not a regular file", path);
    }
    *out_len = (size_t)st.st_size;
    *out = NULL;
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            close(fd);
            return ci_err(err, errlen, CINFER_EIO, "%s: mmap failed: %s", path, strerror(errno));
        }
        *out = p;
    }
    close(fd); /* the mapping stays valid after close */
    return 0;
}

void file_unmap(const void *p, size_t len) {
    if (p && len) munmap((void *)p, len);
}

int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

char *path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    int slash = a > 0 && dir[a - 1] != '/';
    char *s = xmalloc(a + b + 2);
    memcpy(s, dir, a);
    if (slash) s[a++] = '/';
    memcpy(s + a, name, b + 1);
    return s;
}

/* file.h — whole-file reads with a size cap, and read-only mmaps. */
#ifndef CI_FILE_H
#define CI_FILE_H

#include <stddef.h>

/* Reads path into a NUL-terminated buffer (free with free()). Files over max_bytes are an error. */
int file_read_all(const char *path, size_t max_bytes, char **out, size_t *out_len, char *err, size_t errlen);

/* Maps path read-only. *out_len may be 0 (then *out is NULL). Unmap with file_unmap. */
int file_map(const char *path, const void **out, size_t *out_len, char *err, size_t errlen);
void file_unmap(const void *p, size_t len);

int file_exists(const char *path);

/* Joins dir and name with one '/' into a new string (free with free()). */
char *path_join(const char *dir, const char *name);

#endif

/* args.h — small helpers shared by the CLI verbs: flag lookup and id lists. */
#ifndef CI_ARGS_H
#define CI_ARGS_H

#include <stdint.h>

/* The value after flag (e.g. "-m"), or NULL. A flag given without a value is reported and exits 2. */
const char *arg_value(int argc, char **argv, const char *flag, const char *alt);
int arg_flag(int argc, char **argv, const char *flag);
/* Rejects any argument that is not one of the known flags (value flags take the next argument). */
int arg_check(int argc, char **argv, const char *const *value_flags, const char *const *bool_flags, const char *verb);
/* Parses "1,2,3" into a new array; returns -1 with a message on stderr on malformed input. */
int parse_ids(const char *s, int32_t **out, int *n);
int parse_int(const char *s, const char *what, long lo, long hi, long *out);
int parse_float(const char *s, const char *what, double *out);

#endif

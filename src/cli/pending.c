/* pending.c — verbs whose files have not landed yet (removed as each lands). */
#include <stdio.h>
#include "cli/cli.h"
static int pending(const char *v) { fprintf(stderr, "cinfer %s: not built yet\n", v); return 1; }
int cli_logits(int argc, char **argv) { (void)argc; (void)argv; return pending("logits"); }
int cli_generate(int argc, char **argv) { (void)argc; (void)argv; return pending("generate"); }
int cli_info(int argc, char **argv) { (void)argc; (void)argv; return pending("info"); }
int cli_synth(int argc, char **argv) { (void)argc; (void)argv; return pending("synth"); }
int cli_bench(int argc, char **argv) { (void)argc; (void)argv; return pending("bench"); }

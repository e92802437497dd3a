/* cli.h — the verbs of the cinfer command line; each lives in its own file and returns the exit status
 * (0 ok, 1 runtime error, 2 usage error). */
#ifndef CI_CLI_H
#define CI_CLI_H

int cli_logits(int argc, char **argv);
int cli_perplexity(int argc, char **argv);
int cli_generate(int argc, char **argv);
int cli_info(int argc, char **argv);
int cli_synth(int argc, char **argv);
int cli_bench(int argc, char **argv);
int cli_tokenize(int argc, char **argv);
int cli_detokenize(int argc, char **argv);
int cli_template(int argc, char **argv);
int cli_chat(int argc, char **argv);
int cli_serve(int argc, char **argv);
/* bench_spec.c: `cinfer bench --spec-accept A` / `--spec mtp|ngram`; accept < 0: the drafter's own drafts */
int bench_spec(int argc, char **argv, const char *dir, double accept, int mode);
/* bench_cuda.c: `cinfer bench --like SHAPE --device cuda` (random weights made on the GPU) */
int bench_cuda(int argc, char **argv);
/* bench_prefix.c: `cinfer bench --prefix-turn P` */
int bench_prefix(int argc, char **argv, const char *dir, int P);

#endif

/* serve_main.c — cli_serve as a program's main: linked with mock_engine.c it is cinfer-mock-serve (the
 * HTTP layer tested on its own: fast, deterministic, no model files); linked with libcinfer it is
 * cinfer-serve, the real server, whatever verbs src/cli/main.c wires. */
int cli_serve(int argc, char **argv);

int main(int argc, char **argv) { return cli_serve(argc, argv); }

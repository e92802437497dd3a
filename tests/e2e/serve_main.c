/* mock_main.c — `cinfer-mock-serve`: the serve verb linked against mock_engine.c instead of libcinfer,
 * so the HTTP layer can be tested on its own (fast, deterministic, no model files). */
int cli_serve(int argc, char **argv);

int main(int argc, char **argv) { return cli_serve(argc, argv); }

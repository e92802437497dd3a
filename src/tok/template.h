/* template.h — chat templates: a Jinja2 interpreter for the subset real chat templates use, in the environment
 * transformers gives them (trim_blocks, lstrip_blocks, loop controls, raise_exception, strftime_now, its tojson),
 * and the helpers that turn a model folder and a conversation into the context apply_chat_template renders with.
 * Output is meant to be byte-identical to transformers' apply_chat_template(tokenize=False). */
#ifndef CI_TOK_TEMPLATE_H
#define CI_TOK_TEMPLATE_H

#include <stddef.h>
#include <stdint.h>

typedef struct tmpl tmpl;

/* Parses a template. Syntax errors are CINFER_EFORMAT with "line:col: message" in err. */
int tmpl_compile(const char *src, size_t len, tmpl **out, char *err, size_t errlen);
void tmpl_free(tmpl *t);

/* Bounds on one render; a template past any of them fails with CINFER_ERANGE instead of hanging or crashing. */
typedef struct tmpl_opts {
    size_t max_output;  /* bytes of rendered text (default 16 MiB) */
    size_t max_memory;  /* bytes the render may allocate (default 256 MiB) */
    int max_depth;      /* nested evaluation, macro recursion included (default 500) */
    uint64_t max_iters; /* loop iterations, all loops together (default 10 million) */
    int64_t now;        /* Unix time strftime_now() formats (local time); 0: the clock */
} tmpl_opts;

tmpl_opts tmpl_default_opts(void);

/* Renders with the variables of ctx_json, a JSON object (messages, tools, add_generation_prompt, bos_token,
 * ..., extra kwargs). *out is malloc'd and NUL-terminated (free with free()); *outlen may be NULL.
 * raise_exception(msg) gives CINFER_EINVAL with exactly msg in err; other runtime errors are CINFER_EINVAL with
 * "line:col: message"; a limit gives CINFER_ERANGE; a bad ctx_json CINFER_EFORMAT. opts may be NULL. */
int tmpl_render(const tmpl *t, const char *ctx_json, size_t len, char **out, char *err, size_t errlen);
int tmpl_render_opts(const tmpl *t, const char *ctx_json, size_t len, const tmpl_opts *opts, char **out,
                     size_t *outlen, char *err, size_t errlen);

/* Builds the context JSON the way transformers' apply_chat_template does: the tokenizer's special tokens
 * (bos/eos/unk/sep/pad/cls/mask from tokenizer_config.json, strings or AddedToken objects, absent when null),
 * then the extra kwargs (a JSON object) over them, then messages (a JSON array), tools (a JSON array, or null
 * when tools_json is NULL), documents (null) and add_generation_prompt. Any input may be NULL except
 * messages_json. *out is a malloc'd NUL-terminated JSON object. */
int tmpl_build_context(const char *messages_json, const char *tools_json, int add_generation_prompt,
                       const char *tokenizer_config_json, const char *kwargs_json, char **out, char *err,
                       size_t errlen);

/* The same context from a caller's object (what cinfer_apply_chat_template receives): the special tokens of
 * tokenizer_config_json (may be NULL) first, then every key of ctx_json over them, then "tools" and "documents"
 * as null and "add_generation_prompt" as false where ctx_json lacks them. *out is malloc'd JSON. */
int tmpl_context_merge(const char *ctx_json, size_t len, const char *tokenizer_config_json, char **out, char *err,
                       size_t errlen);

/* Finds a model folder's chat template as transformers does: chat_template.jinja, else chat_template.json's
 * "chat_template", else tokenizer_config.json's "chat_template" (a string, or a list of {name, template} whose
 * "default" entry is used). *src is malloc'd. *tokenizer_config (may be NULL) receives tokenizer_config.json's
 * text, or NULL when the folder has none. */
int tmpl_load_dir(const char *dir, char **src, size_t *len, char **tokenizer_config, char *err, size_t errlen);

#endif

/* req_util.h — field readers shared by the API parsers (api_openai.c, api_anthropic.c): each reads one
 * optional member of a JSON object, checks its type and range, and on failure fills the srv_error naming
 * the field. They return 1 when the field was present, 0 when absent (or null), -1 on error. */
#ifndef CI_SRV_REQ_UTIL_H
#define CI_SRV_REQ_UTIL_H

#include <jansson.h>

#include "server/api.h"

int ru_bool(const json_t *o, const char *key, int *out, srv_error *e);
int ru_int(const json_t *o, const char *key, long long lo, long long hi, long long *out, srv_error *e);
int ru_num(const json_t *o, const char *key, double lo, double hi, double *out, srv_error *e);
int ru_str(const json_t *o, const char *key, const char **out, srv_error *e);

/* Sampling fields common to the OpenAI endpoints (temperature, top_p, top_k, min_p, penalties, seed,
 * logit_bias, xtc_*, ignore_eos) into r->sampling / r->logit_bias. */
int ru_sampling(const json_t *body, srv_gen_req *r, srv_error *e);
/* stop (OpenAI: string or array) or stop_sequences (Anthropic: array) into r->stop. */
int ru_stop(const json_t *body, const char *key, srv_gen_req *r, srv_error *e);
/* Validates an OpenAI tools array (function tools with names). */
int ru_tools(const json_t *tools, const char *key, srv_error *e);
/* The chat template context: {"messages": messages, "tools": tools?, "add_generation_prompt": true} with
 * the server's chat_template_args and then extra (the request's kwargs) merged in. Takes ownership of
 * messages and tools. */
char *ru_template_ctx(json_t *messages, json_t *tools, const json_t *server_args, const json_t *extra);
/* Turns a message's content (string, or text and image parts) into validated form: image parts
 * ({"type":"image_url","image_url":{"url":"data:..."}} or a string url, "input_image") are decoded into
 * r->images and become {"type":"image"}; remote URLs, audio, files and unknown types are refused naming path.
 * Returns the content to keep (new reference) or NULL with e filled. */
json_t *ru_content(const json_t *content, const char *path, srv_gen_req *r, const srv_defaults *d, srv_error *e);
/* Decodes one base64 image payload (media type must be image/... or empty) into r->images, within the
 * request's limits; 0, or -1 with e filled. */
int ru_image_b64(const char *mime, size_t mime_len, const char *b64, size_t b64_len, const char *path, srv_gen_req *r,
                 const srv_defaults *d, srv_error *e);

#endif

/* api.h — what the HTTP layer and the API modules share: the parsed, validated generation request (one
 * shape for OpenAI chat, OpenAI completions and Anthropic messages), the per-choice output accumulator fed
 * with engine events, and request-error reporting with the HTTP status and the offending field.
 * Everything here is pure (no engine calls, no I/O), so it is unit-tested and fuzzed on its own. */
#ifndef CI_SRV_API_H
#define CI_SRV_API_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "cinfer.h"
#include "server/sbuf.h"

/* Bounds on what one request body may ask for. */
#define SRV_MAX_JSON_DEPTH 64   /* nesting of arrays/objects in a body */
#define SRV_MAX_N 16            /* choices per request (n) */
#define SRV_MAX_PROMPTS 16      /* prompts in one /v1/completions request */
#define SRV_MAX_STOP 16         /* stop strings (the engine copies at most 16) */
#define SRV_MAX_STOP_LEN 256    /* bytes per stop string */
#define SRV_MAX_LOGIT_BIAS 1024 /* entries of logit_bias */
#define SRV_MAX_TOP_LOGPROBS 20
#define SRV_MAX_IMAGES 16                    /* images per request, by default */
#define SRV_MAX_IMAGE_BYTES ((size_t)20 << 20) /* encoded bytes per image, by default */
#define SRV_MAX_IMAGE_PIXELS ((int64_t)1 << 25) /* decoded pixels per image, by default (32 Mpx) */

typedef enum { SRV_API_CHAT = 0, SRV_API_COMPLETION = 1, SRV_API_ANTHROPIC = 2 } srv_api;

/* A request the server refuses: the HTTP status, the field at fault ("" when none), the message, and the
 * error type/code words each API uses. */
typedef struct srv_error {
    int status;
    char param[96];
    char code[48];
    char message[768];
} srv_error;

/* Fills e and returns -1, so validators can `return srv_fail(e, 400, "temperature", "...")`. */
int srv_fail(srv_error *e, int status, const char *param, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Server-wide defaults and limits that shape request parsing (from the command line). */
typedef struct srv_defaults {
    int max_tokens;        /* used when a request names none; 0: up to the room left in the context */
    float temperature;     /* < 0: the API's own default (1.0) */
    float top_p;           /* < 0: off */
    int top_k;             /* < 0: off */
    float min_p;           /* < 0: off */
    float repetition_penalty; /* <= 0: off (1.0) */
    const json_t *chat_template_args; /* object merged under each request's chat_template_kwargs, or NULL */
    int max_images;           /* images in one request (0: SRV_MAX_IMAGES) */
    size_t max_image_bytes;   /* encoded bytes of one image after base64 (0: SRV_MAX_IMAGE_BYTES) */
    int64_t max_image_pixels; /* decoded width x height of one image (checked when the server loads it) */
} srv_defaults;

void srv_defaults_init(srv_defaults *d);

/* A validated generation request. Prompts are either text (rendered chat or a completion prompt, still to
 * be tokenized) or token ids given by the client; each prompt runs n times (seeds seed+i). */
typedef struct srv_gen_req {
    srv_api api;
    char *model;            /* the name the client sent, echoed in responses (NULL: the server's) */
    int stream;
    int include_usage;      /* stream_options.include_usage */
    int n;                  /* choices per prompt */
    int n_prompts;
    char **prompt_text;     /* [n_prompts]; NULL entries where ids were given */
    int32_t **prompt_ids;   /* [n_prompts]; NULL entries where text was given */
    int *n_prompt_ids;      /* [n_prompts] */
    char *template_ctx;     /* chat / messages: the JSON context for cinfer_apply_chat_template */
    int max_tokens;         /* 0: not given (the server default applies, else the room left) */
    cinfer_sampling sampling;
    cinfer_logit_bias *logit_bias; /* [sampling.n_logit_bias], owned here */
    char **stop;            /* [n_stop] */
    int n_stop;
    int ignore_eos;
    int has_tools;          /* tools reach the template and tool calls are parsed from the output */
    char *tools_json;       /* the tools array (OpenAI function shape) for the engine's argument typing */
    int thinking;           /* Anthropic: 1 enabled, 0 disabled, -1 not said */
    cinfer_constraint constraint; /* response_format json / a forced tool_choice */
    char *constraint_arg;   /* owned: the JSON Schema text, or the forced function's name */
    const char *constraint_param; /* the field an engine refusal of the constraint is reported against */
    struct srv_image {
        unsigned char *data; /* the encoded image (PNG, JPEG, ...), decoded from base64 */
        size_t len;
    } *images;              /* [n_images] in the order the template renders them; the messages keep a
                               {"type":"image"} part in their place */
    int n_images;
} srv_gen_req;

void srv_gen_req_free(srv_gen_req *r);

/* The sampling settings a request starts from before its own fields: the engine's neutral values with the
 * server defaults applied. */
cinfer_sampling srv_sampling_base(const srv_defaults *d);

/* Parses a request body: UTF-8 JSON with nesting at most max_depth, an object at the top. On failure
 * fills e (400, naming the position) and returns -1. */
int srv_parse_body(const char *data, size_t size, int max_depth, json_t **out, srv_error *e);

/* The API parsers: body → validated request. On failure they fill e (status 400 naming the field, unless
 * said otherwise) and return -1; r is then already freed. */
int oai_parse_chat(const json_t *body, const srv_defaults *d, srv_gen_req *r, srv_error *e);
int oai_parse_completion(const json_t *body, const srv_defaults *d, srv_gen_req *r, srv_error *e);
int ant_parse_messages(const json_t *body, const srv_defaults *d, srv_gen_req *r, srv_error *e);
/* /v1/messages/count_tokens: the same body less max_tokens; only the template context is built. */
int ant_parse_count_tokens(const json_t *body, const srv_defaults *d, srv_gen_req *r, srv_error *e);
/* /apply-template: {"messages", "tools"?, "chat_template_kwargs"?} → the template context. */
int oai_parse_apply_template(const json_t *body, const srv_defaults *d, char **template_ctx, srv_error *e);

/* How the engine should split the output of a rendered chat prompt: 1 when the prompt ends inside an
 * open <think> (the template opened the reasoning), else 2 (split <think>...</think> if the model writes
 * it). */
int srv_reasoning_mode(const char *prompt, size_t len);
/* The tool-call syntax a chat template teaches: QWEN_XML when it shows `<function=`, HERMES_JSON when it
 * shows <tool_call> with JSON, NONE when it has neither. */
cinfer_tool_format srv_tool_format(const char *chat_template);

/* ---- output: one choice's accumulated result ---- */
typedef struct srv_tool_call {
    char *id, *name;
    sbuf args;
} srv_tool_call;

typedef struct srv_choice {
    int index;
    sbuf content, reasoning;
    srv_tool_call *calls;  /* [n_calls], by the engine's tool_index */
    int n_calls;
    json_t *logprobs;      /* array of per-token entries in the API's shape, or NULL when not asked */
    char finish_reason[16];
    char *stop_string;     /* the stop string that ended it, if any */
    int prompt_tokens, completion_tokens, cached_tokens;
    int done;              /* DONE or ERROR seen */
    char *error;           /* the ERROR event's message */
} srv_choice;

void srv_choice_init(srv_choice *c, int index, int want_logprobs);
/* Folds one engine event into c (text deltas appended, tool-call deltas routed by index, logprobs
 * rendered in the api's shape, DONE's finish reason and usage kept). */
void srv_choice_add(srv_choice *c, srv_api api, const cinfer_event *ev);
void srv_choice_free(srv_choice *c);

/* One logprob entry in OpenAI chat shape: {"token","logprob","bytes","top_logprobs":[...]} (text that is
 * not valid UTF-8 is made valid; bytes keep it exact). */
json_t *oai_logprob_entry(const cinfer_event *ev);

/* A JSON string from bytes that may not be valid UTF-8 (invalid sequences become U+FFFD). */
json_t *srv_json_text(const char *s, size_t n);

/* ---- response bodies (new strings; free with free()) ---- */
typedef struct srv_resp_meta {
    const char *id;      /* "chatcmpl-...", "cmpl-...", "msg_..." */
    const char *model;
    long long created;   /* unix seconds */
} srv_resp_meta;

/* OpenAI error body {"error":{"message","type","param","code"}} and Anthropic's
 * {"type":"error","error":{"type","message"}}. */
char *oai_error_body(const srv_error *e);
char *ant_error_body(const srv_error *e);

/* Non-streaming responses from finished choices. */
char *oai_chat_response(const srv_resp_meta *m, const srv_choice *ch, int n_choices);
char *oai_completion_response(const srv_resp_meta *m, const srv_choice *ch, int n_choices, int n_per_prompt);
/* Completions logprobs {"tokens","token_logprobs","top_logprobs","text_offset"} from chat-shaped
 * entries; *offset is the text offset of the first and advances past the last. */
json_t *oai_completion_logprobs(const json_t *entries, size_t *offset);
char *ant_message_response(const srv_resp_meta *m, const srv_choice *c);

/* Usage object shared by OpenAI responses: prompt tokens are counted once per distinct prompt (choices
 * of the same prompt share it), completion tokens over all choices. */
json_t *oai_usage(const srv_choice *ch, int n_choices, int n_per_prompt);

/* Anthropic tool_use input from a call's accumulated arguments (an object; unparsable text is kept
 * under "_raw"), and the usage object (cache reads counted apart from input_tokens). */
json_t *ant_tool_input(const srv_tool_call *t);
json_t *ant_usage(int prompt_tokens, int cached_tokens, int output_tokens);

/* Anthropic's stop_reason for an engine finish reason. */
const char *ant_stop_reason(const char *finish_reason, const char *stop_string);

#endif

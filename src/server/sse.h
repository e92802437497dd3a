/* sse.h — Server-Sent Events for both APIs: framing, and the per-request stream state that turns engine
 * events into OpenAI chunks (chat.completion.chunk / text_completion) or Anthropic's event sequence
 * (message_start, content_block_start/delta/stop, message_delta, message_stop, ping). Pure: each call
 * appends the bytes to send to an sbuf. */
#ifndef CI_SRV_SSE_H
#define CI_SRV_SSE_H

#include "server/api.h"

/* "data: <json>\n\n", or "event: <name>\ndata: <json>\n\n" when name is non-NULL. json is consumed. */
void sse_frame(sbuf *out, const char *name, json_t *json);
/* "data: [DONE]\n\n", the OpenAI end of stream. */
void sse_done(sbuf *out);
/* A comment line that keeps idle proxies and clients from timing out; every SSE reader skips it. */
void sse_keepalive(sbuf *out);

typedef struct oai_stream_choice {
    int role_sent;
    sbuf carry_content, carry_reasoning; /* bytes of a UTF-8 character split across events */
    json_t *pending_logprobs;            /* entries not yet sent (chat shape), or NULL */
    size_t text_offset;                  /* completions logprobs: text offset of the next token */
    int n_tools;                         /* tool calls whose first delta has been sent */
} oai_stream_choice;

typedef struct oai_stream {
    srv_api api; /* CHAT or COMPLETION */
    char *id, *model;
    long long created;
    int n_choices;
    oai_stream_choice *c; /* [n_choices] */
} oai_stream;

void oai_stream_init(oai_stream *s, srv_api api, const srv_resp_meta *m, int n_choices, int want_logprobs);
void oai_stream_free(oai_stream *s);
/* The chunks for one event of choice i. DONE writes the choice's last chunk (finish_reason); ERROR writes
 * an {"error":...} frame, which the SDKs raise. */
void oai_stream_event(oai_stream *s, int i, const cinfer_event *ev, sbuf *out);
/* The usage chunk (choices: []) sent last when stream_options.include_usage is set. */
void oai_stream_usage(oai_stream *s, const srv_choice *ch, int n_choices, int n_per_prompt, sbuf *out);

typedef struct ant_stream {
    char *id, *model;
    int block;       /* index of the open content block, -1 when none */
    int kind;        /* of the open block: 0 none, 1 thinking, 2 text, 3 tool_use */
    int tool;        /* engine tool index of the open tool_use block */
    int n_blocks;    /* blocks opened so far */
    int output_tokens;
    sbuf carry;      /* bytes of a UTF-8 character split across events */
} ant_stream;

void ant_stream_init(ant_stream *s, const srv_resp_meta *m);
void ant_stream_free(ant_stream *s);
/* message_start (with the prompt's usage) and a first ping. */
void ant_stream_start(ant_stream *s, int prompt_tokens, int cached_tokens, sbuf *out);
/* Content events open/close blocks as the kind changes; DONE closes the open block and writes
 * message_delta (stop_reason, usage) and message_stop; ERROR writes an error event. LOGPROB is ignored
 * (the Messages API has none). */
void ant_stream_event(ant_stream *s, const cinfer_event *ev, sbuf *out);
void ant_stream_ping(sbuf *out);

#endif

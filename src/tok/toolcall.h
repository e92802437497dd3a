/* toolcall.h — incremental parsers for tool calls in generated text (the content stream, after the
 * reasoning splitter): Qwen3.5 / Qwen3-Coder XML and Qwen3 / Hermes JSON. They emit content deltas that
 * never contain tool-call markup, and tool calls both streamed the OpenAI way (name first, then argument
 * fragments) and complete. Whatever the chunking, the concatenated content and each call's name and
 * arguments come out the same. Malformed calls degrade to content; no input text is lost. */
#ifndef CI_TOK_TOOLCALL_H
#define CI_TOK_TOOLCALL_H

#include <stddef.h>

typedef struct tc_parser tc_parser;

typedef enum {
    /* <tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n</function>\n</tool_call>;
     * values typed by the tool's JSON schema. A bare <function=…>…</function> block (no <tool_call>
     * wrapper, which Qwen3.5 sometimes emits) is accepted too. */
    TC_FORMAT_QWEN_XML = 0,
    /* <tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call> (Qwen3, Qwen3-Next, Hermes). In the
     * usual key order the name goes out when its string closes and the arguments stream as the model's
     * own JSON text (as vLLM streams them); in any other shape the call is sent when its object closes,
     * with the arguments written as Python's json.dumps would (vLLM's non-streaming form). */
    TC_FORMAT_HERMES_JSON = 1,
} tc_format;

typedef enum {
    TC_EV_CONTENT = 0,    /* text, len: a content delta */
    TC_EV_CALL_BEGIN = 1, /* index, id, name: a call starts (OpenAI: the delta carrying id and name) */
    TC_EV_CALL_ARGS = 2,  /* index, text, len: the next fragment of the call's arguments JSON */
    TC_EV_CALL_END = 3,   /* index, id, name, text, len: the call is complete; text = all its arguments
                           * (a JSON object, always equal to the concatenated ARGS fragments) */
    TC_EV_CALL_ABORT = 4, /* index: a begun call turned out not to be one — the stream ended inside it,
                           * or (JSON) its object was invalid once complete; its text follows as
                           * TC_EV_CONTENT. A server that streamed it cannot take it back: it may send
                           * the content after it, as vLLM does. */
} tc_event_kind;

typedef struct tc_event {
    tc_event_kind kind;
    int index;        /* the call's position among this message's calls (0, 1, …); -1 for CONTENT */
    const char *id;   /* "call_" + 24 hex digits, NUL-terminated; NULL where not listed above */
    const char *name; /* NUL-terminated; NULL where not listed above */
    const char *text; /* not NUL-terminated; NULL where not listed above */
    size_t len;
} tc_event; /* every pointer is valid only during the callback */

typedef void (*tc_event_cb)(const tc_event *ev, void *ud);

/* tools_json: the request's `tools` array (OpenAI {"type":"function","function":{name, parameters}},
 * or flat {name, parameters} / Anthropic {name, input_schema}); NULL/0 for none. With tools given, a
 * call must name one of them (else it is content) and parameter values are typed by its schema; without,
 * any well-formed name is accepted and values stay strings. Returns 0, or CINFER_EFORMAT for tools that
 * are not a JSON array, CINFER_EINVAL for an unknown format. */
int tc_create(tc_parser **out, tc_format fmt, const char *tools_json, size_t tools_len, char *err,
              size_t errlen);

/* Feeds the next chunk of content text; emits zero or more events. Returns 0, or CINFER_ESTATE after
 * tc_finish. */
int tc_feed(tc_parser *p, const char *text, size_t len, tc_event_cb cb, void *ud);

/* End of the stream: completes or degrades what is pending. Returns 0, or CINFER_ESTATE when repeated. */
int tc_finish(tc_parser *p, tc_event_cb cb, void *ud);

/* Calls completed so far (a finish_reason of "tool_calls" when > 0). */
int tc_num_calls(const tc_parser *p);

void tc_free(tc_parser *p);

/* The schema conversion of one XML parameter value, exposed for tests: props is the tool's
 * parameters.properties object as JSON text (NULL: none), value the raw text (already stripped of its
 * one leading/trailing newline). Writes NUL-terminated JSON into out; returns its length, or
 * CINFER_ERANGE when outcap is too small. Mirrors vLLM Qwen3CoderToolParser._convert_param_value. */
int tc_convert_value(const char *props_json, const char *pname, const char *value, size_t vlen, char *out,
                     size_t outcap);

#endif

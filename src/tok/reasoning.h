/* reasoning.h — splits generated text into reasoning (`<think>…</think>`) and content, incrementally.
 * Fed decoded text in arbitrary chunks (a tag may be split at any byte), it emits each piece as soon as it
 * can no longer be part of a tag; only a possible partial tag is held back. The concatenated output is
 * the same whatever the chunking. It follows vLLM's Qwen3ReasoningParser for the final split (see
 * reasoning.c for the rules and where they differ). */
#ifndef CI_TOK_REASONING_H
#define CI_TOK_REASONING_H

#include <stddef.h>

typedef struct rs_parser rs_parser;

typedef enum {
    RS_EV_REASONING = 0, /* text belongs to the reasoning (OpenAI reasoning_content, Anthropic thinking) */
    RS_EV_CONTENT = 1,   /* text belongs to the answer; the tool-call parser reads this stream */
} rs_event_kind;

typedef struct rs_event {
    rs_event_kind kind;
    const char *text; /* not NUL-terminated; valid only during the callback */
    size_t len;       /* > 0 */
} rs_event;

typedef void (*rs_event_cb)(const rs_event *ev, void *ud);

/* started_in_think: the prompt already opened `<think>` (Qwen3.5's generation prompt ends with
 * "<think>\n"), so generation begins inside the reasoning. The server decides it the way mlx-lm does:
 * the rendered prompt's last `<think>` comes after its last `</think>`.
 * enabled = 0: thinking disabled (enable_thinking=false): everything is content, tags included.
 * Never fails (allocation failure aborts, as for all small bookkeeping). */
rs_parser *rs_create(int started_in_think, int enabled);

/* Feeds the next chunk; emits zero or more events. Returns 0, or CINFER_ESTATE after rs_finish. */
int rs_feed(rs_parser *p, const char *text, size_t len, rs_event_cb cb, void *ud);

/* End of generation: emits whatever was held back. Returns 0, or CINFER_ESTATE if already finished. */
int rs_finish(rs_parser *p, rs_event_cb cb, void *ud);

/* 1 while the parser is inside the reasoning (nothing after `</think>` seen yet). */
int rs_in_reasoning(const rs_parser *p);

void rs_free(rs_parser *p);

#endif

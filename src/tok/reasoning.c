/* reasoning.c — the incremental `<think>…</think>` splitter.
 *
 * Rules (vLLM vllm/reasoning/qwen3_reasoning_parser.py, extract_reasoning, is the reference for the final
 * split; mlx-lm's TextStateMachine for the state when the prompt did not open `<think>`):
 *  - thinking disabled: everything is content (vLLM routes deltas as content without calling the parser
 *    when the prompt already closed the think block).
 *  - inside reasoning, `</think>` ends it; what follows is content. Neither side is trimmed: like vLLM and
 *    mlx-lm we keep the template's newlines ("…\n" before `</think>`, "\n\n" after it) in the text.
 *  - inside reasoning, `<tool_call>` followed (after whitespace) by `<function` and a space or '=' ends
 *    the reasoning implicitly (Qwen3.5 sometimes calls a tool without closing `</think>`); the
 *    `<tool_call>` tag goes to content so the tool parser sees it. A bare `<tool_call>` mention stays
 *    reasoning. vLLM's non-streaming path checks only the first `<tool_call>`; like its streaming path we
 *    check every one.
 *  - a `<think>` generated while still inside reasoning, before any non-blank reasoning text, is dropped
 *    (older templates where the model writes `<think>` itself). vLLM drops everything up to the first
 *    `<think>` anywhere; we never discard text, so a later `<think>` is kept as text.
 *  - the prompt did not open `<think>`: text is content until a `<think>` (kept, as mlx-lm does; vLLM
 *    would discard it), then reasoning as above. Only one think block: after `</think>` all is content.
 *  - no `</think>` by the end: everything after the opening is reasoning (truncated output).
 */
#include "tok/reasoning.h"

#include <stdlib.h>
#include <string.h>

#include "cinfer.h"
#include "util/alloc.h"

enum { ST_PRE, ST_THINK, ST_CONTENT };

struct rs_parser {
    int state;
    int enabled;
    int seen_text; /* non-blank reasoning text already emitted (a later `<think>` is then kept) */
    int finished;
    char *buf; /* held-back text: [0, len) not yet emitted */
    size_t len, cap;
};

static const char TAG_OPEN[] = "<think>";
static const char TAG_CLOSE[] = "</think>";
static const char TAG_TOOL[] = "<tool_call>";

static int is_ws(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* 2: s starts with tag; 1: s is a proper prefix of tag (more text could complete it); 0: neither. */
static int tag_match(const char *s, size_t n, const char *tag) {
    size_t t = strlen(tag);
    size_t m = n < t ? n : t;
    if (memcmp(s, tag, m)) return 0;
    return n >= t ? 2 : 1;
}

rs_parser *rs_create(int started_in_think, int enabled) {
    rs_parser *p = xcalloc(1, sizeof *p);
    p->enabled = enabled;
    p->state = !enabled ? ST_CONTENT : started_in_think ? ST_THINK : ST_PRE;
    return p;
}

void rs_free(rs_parser *p) {
    if (!p) return;
    free(p->buf);
    free(p);
}

int rs_in_reasoning(const rs_parser *p) {
    return p->state == ST_THINK;
}

static void emit(rs_parser *p, rs_event_kind kind, const char *s, size_t n, rs_event_cb cb, void *ud) {
    if (!n) return;
    if (kind == RS_EV_REASONING && !p->seen_text)
        for (size_t i = 0; i < n; i++)
            if (!is_ws((unsigned char)s[i])) {
                p->seen_text = 1;
                break;
            }
    rs_event ev = {kind, s, n};
    if (cb) cb(&ev, ud);
}

static void consume(rs_parser *p, size_t n) {
    memmove(p->buf, p->buf + n, p->len - n);
    p->len -= n;
}

/* After `<tool_call>` at buf[at]: 2 = `<function[\s=]` follows (after whitespace), 1 = undecided (needs
 * more text), 0 = it does not. */
static int tool_call_genuine(const char *s, size_t n) {
    static const char fn[] = "<function";
    size_t q = 0;
    while (q < n && is_ws((unsigned char)s[q])) q++;
    size_t rest = n - q, fl = sizeof fn - 1;
    size_t m = rest < fl ? rest : fl;
    if (memcmp(s + q, fn, m)) return 0;
    if (rest <= fl) return 1;
    unsigned char c = (unsigned char)s[q + fl];
    return (c == '=' || is_ws(c)) ? 2 : 0;
}

/* Emits what is decided; holds the rest. final: end of stream, nothing more will come. */
static void process(rs_parser *p, int final, rs_event_cb cb, void *ud) {
    for (;;) {
        if (p->state == ST_CONTENT) {
            emit(p, RS_EV_CONTENT, p->buf, p->len, cb, ud);
            p->len = 0;
            return;
        }
        rs_event_kind kind = p->state == ST_THINK ? RS_EV_REASONING : RS_EV_CONTENT;
        size_t hold = p->len; /* first position that must wait for more text */
        int restart = 0;
        for (size_t i = 0; i < p->len && !restart; i++) {
            if (p->buf[i] != '<') continue;
            const char *s = p->buf + i;
            size_t n = p->len - i;
            if (p->state == ST_PRE) {
                int m = tag_match(s, n, TAG_OPEN);
                if (m == 2) {
                    emit(p, RS_EV_CONTENT, p->buf, i, cb, ud);
                    consume(p, i + sizeof TAG_OPEN - 1);
                    p->state = ST_THINK;
                    restart = 1;
                } else if (m == 1 && !final) {
                    hold = i;
                    break;
                }
                continue;
            }
            /* ST_THINK */
            int m = tag_match(s, n, TAG_CLOSE);
            if (m == 2) {
                emit(p, RS_EV_REASONING, p->buf, i, cb, ud);
                consume(p, i + sizeof TAG_CLOSE - 1);
                p->state = ST_CONTENT;
                restart = 1;
                continue;
            }
            int wait = m == 1;
            if (!p->seen_text) {
                int blank = 1;
                for (size_t k = 0; k < i && blank; k++) blank = is_ws((unsigned char)p->buf[k]);
                if (blank) {
                    int mo = tag_match(s, n, TAG_OPEN);
                    if (mo == 2) {
                        emit(p, RS_EV_REASONING, p->buf, i, cb, ud);
                        consume(p, i + sizeof TAG_OPEN - 1);
                        restart = 1;
                        continue;
                    }
                    wait |= mo == 1;
                }
            }
            int mt = tag_match(s, n, TAG_TOOL);
            if (mt == 2) {
                int g = tool_call_genuine(s + sizeof TAG_TOOL - 1, n - (sizeof TAG_TOOL - 1));
                if (g == 2) {
                    emit(p, RS_EV_REASONING, p->buf, i, cb, ud);
                    consume(p, i); /* the tag itself is content: the tool parser needs it */
                    p->state = ST_CONTENT;
                    restart = 1;
                    continue;
                }
                wait |= g == 1;
            } else {
                wait |= mt == 1;
            }
            if (wait && !final) {
                hold = i;
                break;
            }
        }
        if (restart) continue;
        emit(p, kind, p->buf, hold, cb, ud);
        consume(p, hold);
        return;
    }
}

int rs_feed(rs_parser *p, const char *text, size_t len, rs_event_cb cb, void *ud) {
    if (p->finished) return CINFER_ESTATE;
    if (!len) return 0;
    if (p->state == ST_CONTENT && p->len == 0) { /* the common case after the reasoning: no copy */
        rs_event ev = {RS_EV_CONTENT, text, len};
        if (cb) cb(&ev, ud);
        return 0;
    }
    if (p->len + len > p->cap) {
        p->cap = (p->len + len) * 2;
        p->buf = xrealloc(p->buf, p->cap);
    }
    memcpy(p->buf + p->len, text, len);
    p->len += len;
    process(p, 0, cb, ud);
    return 0;
}

int rs_finish(rs_parser *p, rs_event_cb cb, void *ud) {
    if (p->finished) return CINFER_ESTATE;
    process(p, 1, cb, ud);
    p->finished = 1;
    return 0;
}

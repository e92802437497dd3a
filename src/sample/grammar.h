/* grammar.h — constrained decoding. A JSON Schema subset, "any JSON object", or the model's own tool-call
 * syntax is compiled into a small grammar of nodes (literals, sequences, alternatives, bounded repeats and
 * a few JSON lexemes); a matcher runs it incrementally on bytes as a set of pushdown stacks, and computes
 * the tokens whose bytes keep the text a valid prefix by walking the vocabulary in sorted byte order, so
 * tokens that share a prefix share the work (a trie walk without building the trie). */
#ifndef CI_GRAMMAR_H
#define CI_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

typedef struct grammar grammar;       /* compiled; immutable, may be shared by matchers */
typedef struct gm_vocab gm_vocab;     /* a vocabulary's token bytes in sorted order; immutable */
typedef struct gm_matcher gm_matcher; /* one sequence's position in a grammar */

/* How the constrained text may start: GM_REASON_NONE at once; GM_REASON_INSIDE after free reasoning text
 * closed by "</think>" (the prompt opened <think>); GM_REASON_OPTIONAL an optional "<think>…</think>"
 * first. Blanks may follow "</think>". */
enum { GM_REASON_NONE = 0, GM_REASON_INSIDE = 1, GM_REASON_OPTIONAL = 2 };

/* The supported JSON Schema subset: type (one or a list) object / array / string / number / integer /
 * boolean / null; properties, required, additionalProperties (false, true or a schema); items, minItems,
 * maxItems; minLength, maxLength; enum, const; anyOf, oneOf (as anyOf); $ref into $defs / definitions (or
 * any JSON pointer in the document, "#" itself included, recursion allowed); annotations (title,
 * description, default, examples, $schema, $id, $comment) are ignored. Anything else is CINFER_EINVAL with
 * a message naming the keyword and where it is. Object members are written in the order of "properties",
 * required ones always, optional ones when the model chooses; extra members only where
 * additionalProperties is a schema or the object declares no properties. schema NULL: any JSON object
 * (response_format json_object). */
int grammar_compile_json(const char *schema, size_t len, int reasoning, grammar **out, char *err,
                         size_t errlen);

/* Tool calls in the model's syntax: xml nonzero for Qwen3.5's
 *   <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>
 * (string parameters as raw text, others as JSON), else Qwen3's
 *   <tool_call>\n{"name": "NAME", "arguments": {...}}\n</tool_call>.
 * tools_json is the request's tools array (OpenAI function tools, flat {name, parameters} or Anthropic
 * {name, input_schema}). name NULL: one or more calls (at most 8, "\n" between) of any of the tools;
 * otherwise exactly one call of that tool. */
int grammar_compile_tools(const char *tools_json, size_t len, int xml, const char *name, int reasoning,
                          grammar **out, char *err, size_t errlen);
void grammar_free(grammar *g);

/* tokens[i] / lens[i]: the bytes token i decodes to; NULL or length 0 for tokens that may never be chosen
 * under a grammar (special tokens, EOS: the caller allows EOS itself when gm_complete says so). Tokens
 * longer than GM_MAX_TOKEN_BYTES are left out. The bytes are copied. */
#define GM_MAX_TOKEN_BYTES 128
gm_vocab *gm_vocab_create(const char *const *tokens, const size_t *lens, int n_tokens);
void gm_vocab_free(gm_vocab *v);

gm_matcher *gm_matcher_create(const grammar *g);
void gm_matcher_free(gm_matcher *m);
/* Advances over bytes: 0, or -1 when they cannot continue a valid prefix (the matcher is then unchanged). */
int gm_feed(gm_matcher *m, const char *bytes, size_t n);
/* 1 when the text so far is a complete match (the end of the sequence may come now). */
int gm_complete(gm_matcher *m);
/* Sets bit t of mask (uint32 words, (n_tokens + 31) / 32 of them, cleared first) for every token of v
 * whose bytes can come next; returns how many. The answers for the last few states are remembered (inside
 * unbounded text the state repeats), so a repeated state costs a copy. Allocates only on a matcher's first
 * calls (its scratch and memo slots). */
int gm_mask(gm_matcher *m, const gm_vocab *v, uint32_t *mask);

#endif

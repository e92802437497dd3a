#!/usr/bin/env python3
"""tokenize_data.py — train the byte-level BPE tokenizer and turn prepare_data.py's output into token ids.

    python3 tools/train/tokenize_data.py --data DATA --out TOK [--vocab 8192] [--max-code-mb 400]

The tokenizer is tools/oracle/make_default_model.py's (Qwen3.5's pre-tokenizer regex, NFC, byte-level,
its 26 added tokens after the BPE vocabulary), trained here on the train split only (code in split-hash
order plus rendered chat samples). The chat template is tools/oracle/qwen35_chat_template.jinja, the real
Qwen3.5 template.

Chat samples are rendered exactly as `cinfer serve` renders a request (add_generation_prompt, thinking
left at the template's default) followed by the answer: the template's own rendering of [user, assistant]
is "<|im_start|>user\\n{u}<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n{a}<|im_end|>\\n",
whose prefix up to "<think>\\n" is the generation prompt; the prompt and the answer are tokenized
separately (as at inference, where the answer is generated after the tokenized prompt). A fast formatter
does the rendering; it is checked against transformers' apply_chat_template on a seeded sample of
conversations and the run stops if any differs.

Outputs in TOK: tokenizer.json, tokenizer_config.json, train_ids.npy (uint16 stream: documents in seeded
order, each followed by <|endoftext|>), heldout_ids.npy (heldout_sample.txt tokenized as one text without
special tokens: what perplexity is measured on), tok_stats.json.
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ORACLE = os.path.join(os.path.dirname(HERE), "oracle")
sys.path.insert(0, HERE)
sys.path.insert(0, ORACLE)

from prepare_data import unit_hash  # noqa: E402

CHAT_PROMPT = "<|im_start|>user\n{u}<|im_end|>\n<|im_start|>assistant\n<think>\n"
CHAT_FULL = "<|im_start|>user\n{u}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n{a}<|im_end|>\n"


def render_prompt(user):
    return CHAT_PROMPT.format(u=user.strip())


def render_full(user, assistant):
    return CHAT_FULL.format(u=user.strip(), a=assistant.strip())


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def template_text():
    with open(os.path.join(ORACLE, "qwen35_chat_template.jinja"), encoding="utf-8") as f:
        return f.read()


def tokenizer_config(base, template):
    """tokenizer_config.json as make_default_model.py writes it (added tokens after the BPE vocab)."""
    import make_default_model as MDM

    added = {}
    for i, (content, special) in enumerate(MDM.ADDED_TOKENS):
        added[str(base + i)] = {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
                                "single_word": False, "special": special}
    return {"add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": added,
            "bos_token": None, "chat_template": template, "clean_up_tokenization_spaces": False,
            "eos_token": "<|im_end|>", "errors": "replace", "model_max_length": 262144,
            "pad_token": "<|endoftext|>", "split_special_tokens": False,
            "tokenizer_class": "Qwen2Tokenizer", "unk_token": None}


def train_tokenizer(texts, vocab, desc):
    """make_default_model.train_tokenizer() on our corpus and vocabulary size."""
    import make_default_model as MDM

    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    MDM.BPE_VOCAB = vocab
    MDM.corpus_texts = lambda: (desc, texts, nbytes)
    return MDM.train_tokenizer()


def check_chat_rendering(tok_dir, chats, seed, n_check):
    """The fast formatter must equal transformers' apply_chat_template (and the prompt be its prefix)."""
    import transformers as T

    try:
        at = T.AutoTokenizer.from_pretrained(tok_dir)
        how = "transformers %s apply_chat_template (%s)" % (T.__version__, type(at).__name__)

        def apply(msgs, gen):
            return at.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
    except Exception as e:  # no config.json beside the tokenizer: render like transformers does
        import make_default_model as MDM

        print("note: AutoTokenizer failed (%s: %s); checking with make_default_model.render_chat" % (
            type(e).__name__, e))
        how = "make_default_model.render_chat (jinja2 sandbox as transformers)"
        tpl = template_text()

        def apply(msgs, gen):
            return MDM.render_chat(tpl, msgs, add_generation_prompt=gen)
    pick = sorted(range(len(chats)), key=lambda i: unit_hash("render", seed, i))[:n_check]
    bad = 0
    for i in pick:
        c = chats[i]
        msgs = [{"role": "user", "content": c["user"]}]
        p_hf = apply(msgs, True)
        f_hf = apply(msgs + [{"role": "assistant", "content": c["assistant"]}], False)
        p, f = render_prompt(c["user"]), render_full(c["user"], c["assistant"])
        if p_hf != p or f_hf != f or not f.startswith(p):
            bad += 1
            if bad <= 3:
                print("render mismatch:\n%r\n%r\n%r\n%r" % (p_hf, p, f_hf[:400], f[:400]))
    return {"checked": len(pick), "mismatches": bad, "checked_with": how,
            "generation_prompt_example": render_prompt("Write a Python function that adds two numbers.")}


def encode_many(tok, texts, batch=2048):
    import numpy as np

    enc = getattr(tok, "encode_batch_fast", None) or tok.encode_batch
    out = []
    for s in range(0, len(texts), batch):
        for e in enc(texts[s:s + batch], add_special_tokens=False):
            out.append(np.asarray(e.ids, dtype=np.uint16))
    return out


def build(data, out, vocab=8192, tok_corpus_mb=16.0, max_code_mb=400.0, chat_frac=0.2, max_chat=0, seed=1234,
          n_check=300, log=print):
    import numpy as np
    from tokenizers import Tokenizer

    t0 = time.time()
    os.makedirs(out, exist_ok=True)
    code = read_jsonl(os.path.join(data, "train_code.jsonl"))
    chats = read_jsonl(os.path.join(data, "train_chat.jsonl"))
    code.sort(key=lambda r: unit_hash("order", seed, r["sha"]))
    chats.sort(key=lambda c: unit_hash("order", seed, c["path"], c["name"], c["user"]))
    if max_chat:
        chats = chats[:max_chat]

    # Tokenizer corpus: code up to 80% of the budget, rendered chat for the rest.
    budget = int(tok_corpus_mb * (1 << 20))
    texts, n = [], 0
    for r in code:
        if n >= 0.8 * budget:
            break
        texts.append(r["text"])
        n += len(r["text"].encode("utf-8"))
    for c in chats:
        if n >= budget:
            break
        t = render_full(c["user"], c["assistant"])
        texts.append(t)
        n += len(t.encode("utf-8"))
    tok, tok_info = train_tokenizer(texts, vocab, "train split of %s" % data)
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config(tok_info["bpe_vocab"], template_text()), f, indent=1)
        f.write("\n")
    tok = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))  # what is on disk
    eot = tok.token_to_id("<|endoftext|>")
    log("tokenizer: %s (%.1f s)" % (tok_info, time.time() - t0))

    render = check_chat_rendering(out, chats, seed, n_check)
    log("chat rendering vs apply_chat_template: %s" % render)
    if render["mismatches"]:
        raise RuntimeError("the chat formatter differs from the template")

    # Training stream: code (capped), chat repeated so that it is about chat_frac of the tokens.
    cap = int(max_code_mb * (1 << 20)) if max_code_mb > 0 else None
    code_texts, n = [], 0
    for r in code:
        if cap is not None and n >= cap:
            break
        code_texts.append(r["text"])
        n += len(r["text"].encode("utf-8"))
    t1 = time.time()
    code_ids = encode_many(tok, code_texts)
    # A chat sample is the prompt's ids followed by the answer's ids, each tokenized on its own: at inference
    # the prompt (ending "<think>\n") is tokenized alone and the answer is generated after it, so a merge
    # across the boundary (<think> "\n\n" </think>) would teach a token sequence the model never meets.
    prompts = [render_prompt(c["user"]) for c in chats]
    fulls = [render_full(c["user"], c["assistant"]) for c in chats]
    for p, f in zip(prompts, fulls):
        if not f.startswith(p):
            raise RuntimeError("a rendered conversation does not start with its generation prompt")
    chat_ids = [np.concatenate([a, b]) for a, b in zip(encode_many(tok, prompts),
                                                        encode_many(tok, [f[len(p):] for p, f in zip(prompts, fulls)]))]
    n_code = sum(len(a) for a in code_ids)
    n_chat = sum(len(a) for a in chat_ids)
    reps = 1
    if n_chat and chat_frac > 0:
        reps = int(max(1, min(4, round(chat_frac * n_code / ((1 - chat_frac) * n_chat)))))
    docs = [("c", i) for i in range(len(code_ids))] + [("h%d" % r, i) for r in range(reps)
                                                        for i in range(len(chat_ids))]
    docs.sort(key=lambda d: unit_hash("stream", seed, d[0], d[1]))
    parts = []
    sep = np.asarray([eot], dtype=np.uint16)
    for kind, i in docs:
        parts.append(code_ids[i] if kind == "c" else chat_ids[i])
        parts.append(sep)
    stream = np.concatenate(parts)
    np.save(os.path.join(out, "train_ids.npy"), stream)
    with open(os.path.join(data, "heldout_sample.txt"), encoding="utf-8") as f:
        sample = f.read()
    held = np.asarray(tok.encode(sample, add_special_tokens=False).ids, dtype=np.int32)
    np.save(os.path.join(out, "heldout_ids.npy"), held)
    stats = {"tokenizer": tok_info, "tokenizer_corpus_bytes": sum(len(t.encode("utf-8")) for t in texts),
             "code_docs": len(code_ids), "code_bytes": n, "code_tokens": n_code, "chat_docs": len(chat_ids),
             "chat_tokens": n_chat, "chat_repeats": reps, "stream_tokens": int(stream.size),
             "chat_fraction_of_stream": round(n_chat * reps / max(1, stream.size), 4),
             "bytes_per_token_code": round(n / max(1, n_code), 3),
             "heldout_sample_bytes": len(sample.encode("utf-8")), "heldout_sample_tokens": int(held.size),
             "render_check": render, "encode_seconds": round(time.time() - t1, 1),
             "seconds": round(time.time() - t0, 1)}
    with open(os.path.join(out, "tok_stats.json"), "w") as f:
        json.dump(stats, f, indent=1)
        f.write("\n")
    return stats


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab", type=int, default=8192, help="BPE vocabulary (the 26 added tokens come after)")
    ap.add_argument("--tok-corpus-mb", type=float, default=16.0)
    ap.add_argument("--max-code-mb", type=float, default=400.0, help="0: all")
    ap.add_argument("--max-chat", type=int, default=0, help="0: all")
    ap.add_argument("--chat-frac", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--check", type=int, default=300, help="conversations checked against apply_chat_template")
    a = ap.parse_args()
    st = build(a.data, a.out, a.vocab, a.tok_corpus_mb, a.max_code_mb, a.chat_frac, a.max_chat, a.seed, a.check)
    print(json.dumps({k: v for k, v in st.items() if k != "render_check"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Make models/default: a small random-weight Qwen3.5 (Qwen3_5ForCausalLM, bf16, A_log F32)
with a real byte-level BPE tokenizer.json trained here on the Python standard library's
sources, Qwen3.5's pre-tokenizer / normalizer / decoder / added tokens, the real Qwen3.5 chat
template (qwen35_chat_template.jinja beside this file), and tests/fixtures/default_model/
(logits of one 12-token sequence + one greedy continuation; the weights stay in models/default).

    python3 tools/oracle/make_default_model.py --root OUTDIR

make_fixtures.py calls build() too, so one command remakes everything.
"""

import argparse
import json
import os
import shutil
import sys
import sysconfig
import time
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import common as C  # noqa: E402

# Qwen3.5's pre-tokenizer regex (spec 7.1; transformers' tokenization_qwen3_5.py): unlike
# Qwen2/3, \p{M} joins letters and digits split one by one.
PRETOKENIZE_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                     r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Qwen3.5's added tokens in id order (248044 + i in the real vocabulary); the flag is
# "special" as the Qwen2.5/3 tokenizer_config files set it (FIM, repo/file, tool and think
# tags are not special, so they decode as text).
ADDED_TOKENS = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False),
    ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False),
    ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False),
]

BPE_VOCAB = 4096
CORPUS_BYTES = 8 << 20
SEED = 2001

CHECK_TEXTS = [
    "The capital of France is",
    "def main():\n    print('hello, world')\n\n\nif __name__ == \"__main__\":\n    main()\n",
    "I'm sure they'll say we've done it; 12345 apples cost $3.50.",
    "caf\u0065\u0301 na\u00efve \u00c5ngstr\u00f6m \u4f60\u597d\u4e16\u754c \U0001F600",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    "  leading spaces\ttabs\r\nwindows line\n\n\ntrailing   ",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
]

CHAT_MESSAGES = [{"role": "user", "content": "Write a Python function that adds two numbers."}]


def corpus_texts():
    """The stdlib's .py files in sorted order, up to CORPUS_BYTES: text every machine of this
    kind has, read in a fixed order so the merges are reproducible."""
    root = sysconfig.get_paths()["stdlib"]
    paths = []
    for d, dirs, files in os.walk(root):
        dirs.sort()
        if "site-packages" in d or "dist-packages" in d:
            continue
        paths += [os.path.join(d, f) for f in sorted(files) if f.endswith(".py")]
    texts, total = [], 0
    for p in paths:
        try:
            with open(p, encoding="utf-8") as f:
                t = f.read()
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(t)
        total += len(t.encode("utf-8"))
        if total >= CORPUS_BYTES:
            break
    return root, texts, total


def train_tokenizer():
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="",
                               fuse_unk=False, byte_fallback=False, dropout=None))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    root, texts, nbytes = corpus_texts()
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[])
    tok.train_from_iterator(texts, trainer=trainer)
    base = tok.get_vocab_size(with_added_tokens=False)
    for i, (content, special) in enumerate(ADDED_TOKENS):
        at = AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=False,
                        special=special)
        if special:
            tok.add_special_tokens([at])
        else:
            tok.add_tokens([at])
        got = tok.token_to_id(content)
        if got != base + i:
            raise RuntimeError("added token %s got id %s, wanted %d" % (content, got, base + i))
    return tok, {"corpus": root, "corpus_files": len(texts), "corpus_bytes": nbytes,
                 "bpe_vocab": base, "full_vocab": tok.get_vocab_size(with_added_tokens=True)}


def render_chat(template, messages, add_generation_prompt=True, **kw):
    """Render like transformers does (sandboxed jinja2, trim_blocks, lstrip_blocks)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=messages,
                                            add_generation_prompt=add_generation_prompt, **kw)


COND_BOUND = 3e-5


def build(root):
    import transformers as T
    from tokenizers import Tokenizer

    t0 = time.time()
    out_dir = os.path.join(root, "models", "default")
    fix_dir = os.path.join(root, "tests", "fixtures", "default_model")
    for d in (out_dir, fix_dir):
        if os.path.isdir(d):
            shutil.rmtree(d)
        os.makedirs(d)
    with open(os.path.join(HERE, "qwen35_chat_template.jinja"), encoding="utf-8") as f:
        template = f.read()

    tok, tok_info = train_tokenizer()
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    tok = Tokenizer.from_file(os.path.join(out_dir, "tokenizer.json"))  # test what is on disk
    eot, im_end = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    V = (tok_info["full_vocab"] + 63) // 64 * 64

    added = {}
    base = tok_info["bpe_vocab"]
    for i, (content, special) in enumerate(ADDED_TOKENS):
        added[str(base + i)] = {"content": content, "lstrip": False, "normalized": False,
                                "rstrip": False, "single_word": False, "special": special}
    C.write_json(os.path.join(out_dir, "tokenizer_config.json"), {
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": added,
        "bos_token": None, "chat_template": template, "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>", "errors": "replace", "model_max_length": 262144,
        "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None})

    H = 256
    cfg = T.Qwen3_5TextConfig(
        vocab_size=V, hidden_size=H, intermediate_size=256, num_hidden_layers=8,
        num_attention_heads=4, num_key_value_heads=1, head_dim=64, linear_num_key_heads=4,
        linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
        linear_conv_kernel_dim=4, rms_norm_eps=1e-6, max_position_embeddings=32768,
        full_attention_interval=4, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                         "partial_rotary_factor": 0.25, "mrope_section": [3, 3, 2],
                         "mrope_interleaved": True},
        eos_token_id=[im_end, eot], pad_token_id=eot, bos_token_id=None)
    torch.manual_seed(SEED)
    sigma = 0.8 / H ** 0.5
    model = T.Qwen3_5ForCausalLM(cfg).float().eval()
    if model.lm_head.weight.data_ptr() != model.get_input_embeddings().weight.data_ptr():
        model.lm_head.weight = model.get_input_embeddings().weight  # tied: one tensor
    C.randomize_weights(model, SEED, sigma, H)
    std_pre, std_scaled = C.widen_logits(model, V, 3.0, SEED + 7)
    C.to_bf16_keep_alog(model, True)
    C.save_model(model, out_dir)
    del model
    inv = C.tensor_inventory(out_dir)
    if "lm_head.weight" in inv:  # tied: the file must not carry a separate lm_head
        from safetensors.torch import load_file, save_file
        p = os.path.join(out_dir, inv["lm_head.weight"][2])
        sd = load_file(p)
        del sd["lm_head.weight"]
        save_file(sd, p, metadata={"format": "pt"})

    def add_interval(c):
        c["full_attention_interval"] = 4  # real configs carry both this and layer_types
    cpath = os.path.join(out_dir, "config.json")
    with open(cpath) as f:
        cj = json.load(f)
    add_interval(cj)
    C.write_json(cpath, cj)
    C.write_json(os.path.join(out_dir, "generation_config.json"), {
        "bos_token_id": None, "eos_token_id": [im_end, eot], "pad_token_id": eot,
        "do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
        "transformers_version": T.__version__})

    # Tokenizer checks, straight from tokenizers, and whether transformers agrees.
    checks = []
    for text in CHECK_TEXTS:
        enc = tok.encode(text, add_special_tokens=False)
        checks.append({"text": text, "ids": enc.ids,
                       "decoded": tok.decode(enc.ids, skip_special_tokens=False)})
    roundtrip = all(c["decoded"] == unicodedata.normalize("NFC", c["text"])
                    for c in checks)
    chat_text = render_chat(template, CHAT_MESSAGES, add_generation_prompt=True)
    chat_ids = tok.encode(chat_text, add_special_tokens=False).ids
    hf = {}
    try:
        at = T.AutoTokenizer.from_pretrained(out_dir)
        hf["class"] = type(at).__name__
        hf["ids_match_tokenizers"] = all(
            at.encode(c["text"], add_special_tokens=False) == c["ids"] for c in checks)
        hf_chat = at.apply_chat_template(CHAT_MESSAGES, tokenize=False, add_generation_prompt=True)
        hf["chat_render_matches"] = hf_chat == chat_text
        hf["chat_render_no_think"] = at.apply_chat_template(
            CHAT_MESSAGES, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    except Exception as e:
        hf["error"] = "%s: %s" % (type(e).__name__, e)

    # Reference numbers on the model as stored.
    model = C.load_reference_model(T.Qwen3_5ForCausalLM, out_dir)
    # A 12-token window of the check texts whose float32 reference agrees with an independent float64
    # forward (np_reference.py) to COND_BOUND x std: see make_fixtures.py for why.
    import np_reference as NPR
    pool = []
    for t in CHECK_TEXTS:
        pool += tok.encode(t, add_special_tokens=False).ids
    best = None
    for start in range(0, max(1, len(pool) - 12), 3):
        cand = pool[start:start + 12]
        if len(cand) != 12:
            break
        lg_c = C.forward_logits(model, cand)
        err = float(np.abs(lg_c.astype(np.float64) - NPR.forward64(out_dir, cand)).max() / np.std(lg_c))
        if best is None or err < best[2]:
            best = (cand, lg_c, err)
        if err <= COND_BOUND:
            break
    toks, lg, ref_err = best
    print("default_model len12: f32 reference vs float64 = %.2e x std" % ref_err)
    C.save_logits(os.path.join(fix_dir, "len12.npy"), lg)
    new, margin, agree, drift = C.greedy(model, chat_ids, 24)
    C.write_json(os.path.join(fix_dir, "cases.json"), {
        "model": "default_model", "class": "Qwen3_5ForCausalLM", "weights": "models/default",
        "std": float(np.std(lg)),
        "cases": [{"name": "len12", "tokens": toks, "logits": "len12.npy", "std": float(np.std(lg)), "ref_vs_f64": ref_err,
                   "text": tok.decode(toks, skip_special_tokens=False)}],
        "greedy": [{"name": "chat", "prompt": chat_ids, "output": new, "min_margin": margin,
                    "argmax_of_full_forward_agrees": agree,
                    "hf_decode_vs_full_forward_max_abs_diff": drift,
                    "prompt_text": chat_text, "messages": CHAT_MESSAGES,
                    "output_text": tok.decode(new, skip_special_tokens=False)}],
        "generation": "transformers generate(do_sample=False, max_new_tokens=24, eos_token_id=None, "
                      "use_cache=True), float32 on the CPU; eos disabled so 24 tokens come out "
                      "even past <|im_end|>",
        "reference": "transformers float32 forward on the CPU, eager attention, use_cache=False",
        "tokenizer": dict(tok_info, vocab_size_in_config=V, endoftext=eot, im_end=im_end,
                          roundtrip_ok=roundtrip),
        "tokenizer_checks": checks,
        "chat_check": {"messages": CHAT_MESSAGES, "add_generation_prompt": True,
                       "rendered": chat_text, "ids": chat_ids},
        "transformers_tokenizer": hf,
        "layer_types": list(model.config.layer_types),
    })
    return {"std": float(np.std(lg)), "std_before_widen": std_pre, "std_widened_f32": std_scaled,
            "vocab_size": V, "tokenizer": tok_info, "roundtrip_ok": roundtrip,
            "transformers_tokenizer": {k: v for k, v in hf.items() if k != "chat_render_no_think"},
            "greedy_min_margin": margin, "greedy_agree": agree, "hf_decode_drift": drift,
            "layer_types": list(model.config.layer_types),
            "a_log_dtype": sorted({v[0] for k, v in C.tensor_inventory(out_dir).items()
                                   if k.endswith("A_log")}),
            "bytes": C.dir_size(out_dir), "fixture_bytes": C.dir_size(fix_dir),
            "seconds": round(time.time() - t0, 1)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    args = ap.parse_args()
    C.instrument_kernels()
    res = {}
    C.run_guarded("default_model", lambda: build(args.root), res)
    print(json.dumps(res, indent=1, default=str))
    return 0 if res["default_model"].get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""write_model_card.py — models/default/MODEL_CARD.md from the figures export_eval.py measured
(model_card.json) and, optionally, the summaries of serve_chat_eval.py runs. Standard library only.

    python3 tools/train/write_model_card.py --card RESULTS/train/model_card.json \\
        [--serve-sampled SUMMARY.json] [--serve-greedy SUMMARY.json] [--cinfer-ppl PPL.json] \\
        --out models/default/MODEL_CARD.md
"""

import argparse
import json
import sys


def load(path):
    if not path:
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def serve_line(s, how):
    if not s:
        return "- %s: not run." % how
    r = s["results"]
    parts = ["%d/%d %s prompts" % (v["parses"], v["asked"], k) for k, v in r.items()]
    return "- %s (max_tokens %d): %s gave Python that `ast.parse` accepts." % (how, s["max_tokens"], ", ".join(parts))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--card", required=True)
    ap.add_argument("--serve-sampled")
    ap.add_argument("--serve-greedy")
    ap.add_argument("--cinfer-ppl")
    ap.add_argument("--config", default="models/default/config.json")
    ap.add_argument("--chat-note", default="", help="a paragraph added to the Chat section")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    c = load(a.card)
    cfg = load(a.config)
    ss, sg, cp = load(a.serve_sampled), load(a.serve_greedy), load(a.cinfer_ppl)
    d, tk, tr, ex, ho = c.get("data", {}), c.get("tokenizer", {}), c.get("train", {}), c["export"], c["heldout"]
    v = c.get("versions", {})
    ti = tk.get("tokenizer", {})
    hf = c.get("hf_chat")
    L = []
    w = L.append
    w("# models/default — a small trained Qwen3.5 with an MTP head")
    w("")
    w("Made by `tools/train/` (`bash tools/train/run_on_device.sh` on one %s; see tools/train/README.md). "
      "Trained from scratch in %.0f s on Python source code; it writes plausible Python and is meant for testing "
      "and measuring the engine (speculation, quantization, serving) on real text, not for real use." % (
          v.get("device", "GPU"), tr.get("train_seconds", 0)))
    w("")
    w("## Model")
    w("")
    lt = "".join("F" if t == "full_attention" else "L" for t in cfg["layer_types"])
    w("- `Qwen3_5ForCausalLM` (`model_type: qwen3_5_text`): %d layers, 3:1 Gated DeltaNet / gated full attention "
      "(`%s`), hidden %d, MLP %d, %d query heads / %d KV heads of %d (partial RoPE %g, theta %g), DeltaNet %d key "
      "heads / %d value heads of %d, conv %d, zero-centred RMSNorms, tied embeddings, vocab %d." % (
          cfg["num_hidden_layers"], lt, cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"],
          cfg["num_key_value_heads"], cfg["head_dim"], cfg["rope_parameters"]["partial_rotary_factor"],
          cfg["rope_parameters"]["rope_theta"], cfg["linear_num_key_heads"], cfg["linear_num_value_heads"],
          cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"], cfg["vocab_size"]))
    w("- MTP head (spec §5, `mtp_num_hidden_layers: 1`): `mtp.fc` over [norm(embed(x_{t+1})), norm(h_t)], one "
      "full-attention decoder layer, `mtp.norm`, the shared lm_head; trained jointly to predict x_{t+2}.")
    w("- Parameters: %s in the main model, %s in the MTP head; `model.safetensors` %.1f MB (bf16, `A_log` F32)." % (
        "{:,}".format(ex["params_main"]), "{:,}".format(ex["params_mtp"]), ex["bytes_safetensors"] / 1e6))
    w("- Tokenizer: byte-level BPE with Qwen3.5's pre-tokenizer regex and NFC: %s tokens + Qwen3.5's 26 added "
      "tokens, trained on %.1f MB of the training split; the real Qwen3.5 chat template." % (
          ti.get("bpe_vocab", "?"), tk.get("tokenizer_corpus_bytes", 0) / 1e6))
    w("")
    w("## Data")
    w("")
    w("- Every `.py` file of the training machine's Python %s standard library and site-packages (%s): %s files "
      "seen, %s kept after filters (utf-8, 64 B to 1 MiB, no generated tables) and deduplication (%s exact and "
      "%s whitespace-only duplicates dropped)." % (
          d.get("python", "?"), ", ".join(d.get("roots", [])), "{:,}".format(d.get("files_seen", 0)),
          "{:,}".format(d.get("train_files", 0) + d.get("heldout_files", 0)), d.get("duplicates_exact", "?"),
          d.get("duplicates_whitespace", "?")))
    w("- Split by file with a seeded hash of the content: %s train files (%.0f MB), %s held-out files (%.1f MB)." % (
        "{:,}".format(d.get("train_files", 0)), d.get("train_bytes", 0) / 1e6, "{:,}".format(d.get("heldout_files", 0)),
        d.get("heldout_bytes", 0) / 1e6))
    w("- Chat part: %s functions with docstrings from train files, each as a user request (signature + the "
      "docstring's first sentence) answered with the function's source in a ```python fence, rendered with the "
      "chat template exactly as `cinfer serve` renders a request (generation prompt `<think>\\n`, then an empty "
      "think block). Repeated %dx, %.0f%% of the training stream." % (
          "{:,}".format(d.get("train_chat", 0)), tk.get("chat_repeats", 1), 100 * tk.get("chat_fraction_of_stream", 0)))
    w("- Training stream: %s tokens (%.0f MB of code at %.2f bytes/token, plus the chat part)." % (
        "{:,}".format(tk.get("stream_tokens", 0)), tk.get("code_bytes", 0) / 1e6, tk.get("bytes_per_token_code", 0)))
    w("")
    w("## Training")
    w("")
    w("- %s steps of %d x %d tokens, %s tokens seen, %.0f s on %s (torch %s, transformers %s; transformers' torch "
      "DeltaNet, no flash-linear-attention)." % (
          "{:,}".format(tr.get("step", 0)), tr.get("batch", 0), tr.get("seq", 0), "{:,}".format(tr.get("tokens", 0)),
          tr.get("train_seconds", 0), v.get("device", "?"), v.get("torch", "?"), v.get("transformers", "?")))
    w("- AdamW (fused; betas 0.9/0.95, weight decay 0.1 on matrices), peak LR %g, warmup then cosine to 10%% keyed "
      "on the time budget, bf16 autocast, grad clip 1.0, loss = main + %.1f x MTP; seed %s." % (
          tr.get("peak_lr", 0), tr.get("mtp_weight", 0.3), tr.get("seed", "?")))
    w("- Final training loss %.3f (MTP %.3f)." % (tr.get("final_loss") or 0, tr.get("final_mtp_loss") or 0))
    w("")
    w("## Held-out evaluation")
    w("")
    w("On `tests/fixtures/default_model/heldout_sample.txt` (%s bytes of whole held-out files, %s tokens), "
      "transformers float32 on the model reloaded from these files:" % (
          "{:,}".format(ho["sample_bytes"]), "{:,}".format(ho["tokens_total"])))
    w("")
    w("| figure | value |")
    w("|---|---|")
    w("| perplexity (windows of %d, first token of each not scored; %s tokens scored) | **%.3f** (mean NLL %.4f) |" % (
        ho["ctx"], "{:,}".format(ho["tokens_scored"]), ho["perplexity"], ho["mean_nll"]))
    if cp:
        w("| `cinfer perplexity` on the same file | %.3f (%+.3f%%) |" % (
            cp["perplexity"], 100 * (cp["perplexity"] / ho["perplexity"] - 1)))
    w("| main model top-1 (next token) | %.1f%% |" % (100 * ho["main_top1"]))
    w("| MTP top-1 (token t+2, teacher forced) | %.1f%% |" % (100 * ho["mtp_top1"]))
    w("| 1-token MTP draft accepted by the main model's greedy choice | **%.1f%%** |" % (100 * ho["mtp_acceptance"]))
    w("")
    w("## Chat")
    w("")
    if hf:
        w("- transformers, greedy, %d new tokens at most: %d/%d held-out prompts answered with Python that parses." % (
            hf["max_new_tokens"], hf["parses"], hf["asked"]))
    w(serve_line(ss, "`cinfer serve`, default sampling (generation_config: temperature 0.7, top_p 0.8, top_k 20, repetition_penalty 1.1)"))
    w(serve_line(sg, "`cinfer serve`, greedy (temperature 0)"))
    if a.chat_note:
        w("")
        w(a.chat_note)
    w("")
    mt = (ss or sg or {}).get("max_tokens", 512)
    w("Command: `build/cinfer serve --port 8080 &` then `python3 tools/train/serve_chat_eval.py --url "
      "http://127.0.0.1:8080 --max-tokens %d [--greedy]` (20 held-out prompts from tests/fixtures/default_model/heldout_prompts.jsonl "
      "and 20 everyday requests written in the script; the code is the first ```python fence of the answer)." % mt)
    w("")
    w("## Limits")
    w("")
    w("- %.0f M parameters trained for %.0f seconds: the code it writes is often syntactically fine and "
      "semantically wrong; it repeats itself, invents APIs, and knows nothing but Python source." % (
          ex["params_main"] / 1e6, tr.get("train_seconds", 0)))
    w("- The training text is whatever Python the GPU machine had installed (licenses of those packages apply "
      "to the text the model may reproduce); held-out files are disjoint by content, but vendored near-copies of "
      "a file can sit in both splits.")
    w("- Chat data is one pattern (ask for a function, get its source); there is no instruction tuning, no "
      "multi-turn data, no tool calls, and the think block is always empty.")
    w("- GPU kernels are not bit-deterministic and the run is time-budgeted, so retraining gives a close, not an "
      "identical, model.")
    w("")
    with open(a.out, "w", encoding="utf-8") as f:
        f.write("\n".join(L))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""export_eval.py — export the trained default model, reload it from disk with transformers, measure it,
and write the oracle fixtures.

    python3 tools/train/export_eval.py --work WORK --tok TOK --data DATA --root OUT [--ctx 512]
                                       [--deadline UNIX_TIME] [--preset real]

Writes OUT/models/default (model.safetensors in bf16 with A_log in F32 and the mtp.* tensors, config.json
with mtp_num_hidden_layers 1, generation_config.json, tokenizer.json, tokenizer_config.json with the chat
template), OUT/tests/fixtures/default_model (cases.json + len12.npy: the parity fixture in
make_default_model.py's format; mtp_cases.json + mtp_logits.npy + mtp_hidden.npy: the MTP oracle;
heldout_sample.txt; heldout_prompts.jsonl) and OUT/train/model_card.json (every figure of the card).

Held-out perplexity, exactly: heldout_sample.txt is tokenized as one text without special tokens (no
BOS/EOS added); the ids are cut into consecutive non-overlapping windows of --ctx tokens (the last one
shorter; a window of one token is dropped); each window is a fresh sequence starting at position 0; in
each window the tokens at positions 1..n-1 are scored with -log softmax(logits[j-1])[x_j] (the first token
of a window is context only). perplexity = exp(sum of NLL / tokens scored). float32 forward (eager
attention, no TF32), NLL summed in float64.

MTP on the same windows, teacher forced: row t of the head (inputs x_{t+1} and the main model's final-normed
hidden h_t, position t) drafts d_t = argmax; top-1 = P(d_t == x_{t+2}); acceptance = P(d_t == argmax of the
main model's logits at t+1), the rate at which a 1-token MTP draft is accepted under greedy decoding.
"""

import argparse
import ast
import json
import os
import re
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ORACLE = os.path.join(os.path.dirname(HERE), "oracle")
sys.path.insert(0, HERE)
sys.path.insert(0, ORACLE)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import common as C  # noqa: E402  (sets float32 matmuls to full precision)
from mtp import MTPHead, mtp_logits  # noqa: E402

torch.set_float32_matmul_precision("highest")


def log(*a):
    print(*a, flush=True)


def export(work, tok_dir, preset, out_dir):
    import transformers as T
    from safetensors.torch import load_file, save_file

    import train as TR

    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)
    ck = torch.load(os.path.join(work, "final.pt"), map_location="cpu", weights_only=False)
    cfg = TR.make_config(preset, tok_dir)
    model = T.Qwen3_5ForCausalLM(cfg).float().eval()
    if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        model.lm_head.weight = model.model.embed_tokens.weight
    missing, unexpected = model.load_state_dict(ck["model"], strict=False)
    if [k for k in missing if k != "lm_head.weight"] or unexpected:
        raise RuntimeError("state dict mismatch: missing %s unexpected %s" % (missing, unexpected))
    head = MTPHead(model.config)
    head.load_state_dict(ck["head"], strict=True)
    C.to_bf16_keep_alog(model, True)
    C.save_model(model, out_dir)
    files = C.safetensors_files(out_dir)
    if files != ["model.safetensors"] or os.path.exists(os.path.join(out_dir, "model.safetensors.index.json")):
        raise RuntimeError("expected one model.safetensors, got %s" % files)
    path = os.path.join(out_dir, "model.safetensors")
    sd = load_file(path)
    sd.pop("lm_head.weight", None)  # tied: the file carries embed_tokens only
    for k, v in head.state_dict().items():
        sd["mtp." + k] = v.detach().to(torch.bfloat16).contiguous()
    save_file(sd, path, metadata={"format": "pt"})

    cpath = os.path.join(out_dir, "config.json")
    with open(cpath) as f:
        cj = json.load(f)
    cj["full_attention_interval"] = 4  # real configs carry both this and layer_types
    cj["mtp_num_hidden_layers"] = 1
    cj["mtp_use_dedicated_embeddings"] = False
    C.write_json(cpath, cj)
    eos = cj["eos_token_id"]
    C.write_json(os.path.join(out_dir, "generation_config.json"), {
        "bos_token_id": None, "eos_token_id": eos, "pad_token_id": cj.get("pad_token_id"),
        "do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
        # a 24 M model loops without it: 1.1 took cinfer serve's chat answers that parse from 11-15/20 to 19/20
        "repetition_penalty": 1.1, "transformers_version": T.__version__})
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok_dir, fn), os.path.join(out_dir, fn))
    inv = C.tensor_inventory(out_dir)
    bad = [k for k, v in inv.items() if k.endswith("A_log") and v[0] != "F32"]
    if bad or any(v[0] not in ("BF16", "F32") for v in inv.values()):
        raise RuntimeError("unexpected dtypes: %s" % {k: v[0] for k, v in inv.items() if v[0] != "BF16"})
    if "lm_head.weight" in inv or "model.embed_tokens.weight" not in inv:
        raise RuntimeError("tensor names: %s" % sorted(inv)[:8])
    n_mtp = sum(int(np.prod(v[1])) for k, v in inv.items() if k.startswith("mtp."))
    n_main = sum(int(np.prod(v[1])) for k, v in inv.items() if not k.startswith("mtp."))
    return {"bytes_safetensors": os.path.getsize(path), "bytes_dir": C.dir_size(out_dir),
            "params_main": n_main, "params_mtp": n_mtp, "tensors": len(inv),
            "mtp_tensors": sorted(k for k in inv if k.startswith("mtp."))}


def load_exported(model_dir):
    """float32 eager transformers model from disk + the MTP head from the mtp.* tensors of the same file."""
    import transformers as T
    from safetensors.torch import load_file

    model = C.load_reference_model(T.Qwen3_5ForCausalLM, model_dir)
    sd = load_file(os.path.join(model_dir, "model.safetensors"))
    head = MTPHead(model.config).float().eval()
    head.load_state_dict({k[4:]: v.float() for k, v in sd.items() if k.startswith("mtp.")}, strict=True)
    return model, head


@torch.no_grad()
def heldout_eval(model, head, ids, ctx, dev, batch=16):
    wins = [ids[s:s + ctx] for s in range(0, len(ids), ctx)]
    wins = [w for w in wins if len(w) >= 2]
    groups = {}
    for w in wins:
        groups.setdefault(len(w), []).append(w)
    nll_sum, n = 0.0, 0
    top1 = mtp_top1 = accept = n_mtp = 0
    for L, ws in sorted(groups.items()):
        for s in range(0, len(ws), batch):
            x = torch.tensor(ws[s:s + batch], dtype=torch.long, device=dev)
            h = model.model(input_ids=x, use_cache=False).last_hidden_state
            logits = model.lm_head(h).float()
            lp = torch.log_softmax(logits[:, :-1], dim=-1)
            nll = -lp.gather(-1, x[:, 1:, None])[..., 0]
            nll_sum += float(nll.double().sum())
            n += nll.numel()
            top1 += int((logits[:, :-1].argmax(-1) == x[:, 1:]).sum())
            if L >= 3:
                ml = mtp_logits(head, model, x, h, explicit_mask=True).float()
                d = ml[:, :-1].argmax(-1)  # row t drafts x_{t+2}, t = 0..L-3
                mtp_top1 += int((d == x[:, 2:]).sum())
                accept += int((d == logits[:, 1:-1].argmax(-1)).sum())
                n_mtp += d.numel()
    return {"ctx": ctx, "windows": len(wins), "tokens_total": len(ids), "tokens_scored": n,
            "mean_nll": nll_sum / n, "perplexity": float(np.exp(nll_sum / n)), "main_top1": top1 / n,
            "mtp_top1": mtp_top1 / max(1, n_mtp), "mtp_acceptance": accept / max(1, n_mtp), "mtp_scored": n_mtp,
            "windowing": "non-overlapping windows of ctx tokens, each from position 0; first token of each "
                         "window not scored; windows of 1 token dropped"}


def parity_fixture(model, tok, model_dir, fix_dir):
    """tests/fixtures/default_model/cases.json + len12.npy, in make_default_model.py's format."""
    import make_default_model as MDM
    import np_reference as NPR

    with open(os.path.join(ORACLE, "qwen35_chat_template.jinja"), encoding="utf-8") as f:
        template = f.read()
    chat_text = MDM.render_chat(template, MDM.CHAT_MESSAGES, add_generation_prompt=True)
    chat_ids = tok.encode(chat_text, add_special_tokens=False).ids
    pool = []
    for t in MDM.CHECK_TEXTS:
        pool += tok.encode(t, add_special_tokens=False).ids
    best = None
    for start in list(range(0, max(1, len(pool) - 12), 3))[:40]:
        cand = pool[start:start + 12]
        if len(cand) != 12:
            break
        lg_c = C.forward_logits(model, cand)
        err = float(np.abs(lg_c.astype(np.float64) - NPR.forward64(model_dir, cand)).max() / np.std(lg_c))
        if best is None or err < best[2]:
            best = (cand, lg_c, err)
        if err <= MDM.COND_BOUND:
            break
    toks, lg, ref_err = best
    log("default_model len12: f32 reference vs float64 = %.2e x std" % ref_err)
    C.save_logits(os.path.join(fix_dir, "len12.npy"), lg)
    new, margin, agree, drift = C.greedy(model, chat_ids, 24)
    checks = []
    for text in MDM.CHECK_TEXTS:
        enc = tok.encode(text, add_special_tokens=False)
        checks.append({"text": text, "ids": enc.ids, "decoded": tok.decode(enc.ids, skip_special_tokens=False)})
    eot, im_end = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    C.write_json(os.path.join(fix_dir, "cases.json"), {
        "model": "default_model", "class": "Qwen3_5ForCausalLM", "weights": "models/default",
        "std": float(np.std(lg)),
        "cases": [{"name": "len12", "tokens": toks, "logits": "len12.npy", "std": float(np.std(lg)),
                   "ref_vs_f64": ref_err, "text": tok.decode(toks, skip_special_tokens=False)}],
        "greedy": [{"name": "chat", "prompt": chat_ids, "output": new, "min_margin": margin,
                    "argmax_of_full_forward_agrees": agree, "hf_decode_vs_full_forward_max_abs_diff": drift,
                    "prompt_text": chat_text, "messages": MDM.CHAT_MESSAGES,
                    "output_text": tok.decode(new, skip_special_tokens=False)}],
        "generation": "transformers generate(do_sample=False, max_new_tokens=24, eos_token_id=None, "
                      "use_cache=True), float32 on the CPU; eos disabled so 24 tokens come out even past <|im_end|>",
        "reference": "transformers float32 forward on the CPU, eager attention, use_cache=False",
        "tokenizer": {"vocab_size_in_config": model.config.vocab_size, "endoftext": eot, "im_end": im_end},
        "tokenizer_checks": checks,
        "chat_check": {"messages": MDM.CHAT_MESSAGES, "add_generation_prompt": True, "rendered": chat_text,
                       "ids": chat_ids},
        "layer_types": list(model.config.layer_types),
        "made_by": "tools/train/export_eval.py (the trained default model)",
    })
    return {"len12_ref_vs_f64": ref_err, "greedy_min_margin": margin, "greedy_agree": agree,
            "hf_decode_drift": drift, "greedy_text": tok.decode(new, skip_special_tokens=False)}


@torch.no_grad()
def mtp_fixture(model, head, model_dir, tokens, fix_dir, text):
    import mtp_np_reference as MNR

    x = torch.tensor([tokens], dtype=torch.long)
    h = model.model(input_ids=x, use_cache=False).last_hidden_state  # [1, T, H] final-normed
    main = model.lm_head(h)[0].float().numpy()
    ml = mtp_logits(head, model, x, h, explicit_mask=True)[0].float().numpy()  # [T-1, V]
    hid = h[0].float().numpy()
    C.save_logits(os.path.join(fix_dir, "mtp_logits.npy"), ml)
    C.save_logits(os.path.join(fix_dir, "mtp_hidden.npy"), hid)
    ref = MNR.mtp_forward64(model_dir, tokens, hid.astype(np.float64))
    std = float(np.std(ml))
    err = float(np.abs(ml.astype(np.float64) - ref).max() / std)
    T = len(tokens)
    C.write_json(os.path.join(fix_dir, "mtp_cases.json"), {
        "model": "default_model", "weights": "models/default", "tokens": tokens, "T": T,
        "logits": "mtp_logits.npy", "logits_shape": list(ml.shape), "hidden": "mtp_hidden.npy",
        "hidden_shape": list(hid.shape), "std": std, "ref_vs_f64": err,
        "definition": "mtp_logits[t] (t = 0..T-2) are the MTP head's float32 logits predicting tokens[t+2] "
                      "from e = embed_tokens[tokens[t+1]] and hh = mtp_hidden[t]: u = fc([rmsnorm1p(e, "
                      "pre_fc_norm_embedding), rmsnorm1p(hh, pre_fc_norm_hidden)]) (embedding first), one "
                      "full-attention decoder layer (mtp.layers.0) at RoPE position t attending causally over "
                      "rows 0..t of this same head, then rmsnorm1p(mtp.norm) and the tied lm_head. The last "
                      "row predicts the token after the sequence.",
        "hidden_definition": "mtp_hidden[t] is the main model's hidden state at position t after the final "
                             "norm (the lm_head input), float32, from one forward over all T tokens",
        "reference": "transformers float32 on the CPU, eager attention, the head built from "
                     "Qwen3_5DecoderLayer and loaded from the mtp.* tensors of models/default; ref_vs_f64 is "
                     "max |logit - float64 NumPy MTP forward (tools/train/mtp_np_reference.py)| / std",
        "mtp_argmax": [int(i) for i in ml.argmax(-1)],
        "main_argmax": [int(i) for i in main.argmax(-1)],
        "text": text,
    })
    return {"mtp_ref_vs_f64": err, "mtp_std": std}


def extract_code(answer):
    """The Python in a chat answer: the reasoning is cut at </think>, then the first ```python fence (or
    the first fence, or the whole text)."""
    if "</think>" in answer:
        answer = answer.split("</think>", 1)[1]
    answer = answer.replace("<|im_end|>", "").replace("<|endoftext|>", "")
    m = re.search(r"```(?:python|py)?\n(.*?)(```|$)", answer, re.S)
    return (m.group(1) if m else answer).strip()


def parses(code):
    try:
        ast.parse(code)
        return bool(code.strip())
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False


@torch.no_grad()
def hf_chat_eval(model, model_dir, prompts, dev, deadline, max_new=256):
    """Greedy answers of transformers on the held-out prompts: the figure C's serve run is compared with."""
    import transformers as T

    at = T.AutoTokenizer.from_pretrained(model_dir)
    eos = [at.convert_tokens_to_ids("<|im_end|>"), at.convert_tokens_to_ids("<|endoftext|>")]
    out, ok = [], 0
    for p in prompts:
        if deadline and time.time() > deadline - 20:
            break
        text = at.apply_chat_template(p["messages"], tokenize=False, add_generation_prompt=True)
        ids = torch.tensor([at.encode(text, add_special_tokens=False)], device=dev)
        g = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                           max_new_tokens=max_new, eos_token_id=eos, pad_token_id=eos[1])
        ans = at.decode(g[0, ids.shape[1]:].tolist(), skip_special_tokens=False)
        good = parses(extract_code(ans))
        ok += good
        out.append({"prompt": p["messages"][0]["content"], "answer": ans, "parses": good})
    return {"asked": len(out), "parses": ok, "max_new_tokens": max_new}, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--tok", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--preset", default="real")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--max-eval-tokens", type=int, default=0, help="smoke: score only the first N ids")
    ap.add_argument("--deadline", type=float, default=0)
    ap.add_argument("--chat-eval", type=int, default=20, help="held-out prompts answered by transformers")
    a = ap.parse_args()
    t0 = time.time()
    from tokenizers import Tokenizer

    model_dir = os.path.join(a.root, "models", "default")
    fix_dir = os.path.join(a.root, "tests", "fixtures", "default_model")
    card_dir = os.path.join(a.root, "train")
    for d in (fix_dir, card_dir):
        if os.path.isdir(d):
            shutil.rmtree(d)
        os.makedirs(d)
    card = {"versions": C.versions()}
    card["export"] = export(a.work, a.tok, a.preset, model_dir)
    log("export: %s" % {k: v for k, v in card["export"].items() if k != "mtp_tensors"})
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))

    shutil.copy(os.path.join(a.data, "heldout_sample.txt"), os.path.join(fix_dir, "heldout_sample.txt"))
    with open(os.path.join(fix_dir, "heldout_sample.txt"), encoding="utf-8") as f:
        sample = f.read()
    ids = tok.encode(sample, add_special_tokens=False).ids
    if a.max_eval_tokens:
        ids = ids[:a.max_eval_tokens]
    ref_ids = np.load(os.path.join(a.tok, "heldout_ids.npy")).tolist()
    if ids != ref_ids[:len(ids)]:
        raise RuntimeError("held-out sample tokenizes differently from tokenize_data.py's ids")

    model, head = load_exported(model_dir)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(dev)
    head.to(dev)
    t1 = time.time()
    ev = heldout_eval(model, head, ids, a.ctx, dev)
    ev["seconds"] = round(time.time() - t1, 1)
    ev["file"] = "tests/fixtures/default_model/heldout_sample.txt"
    ev["sample_bytes"] = len(sample.encode("utf-8"))
    card["heldout"] = ev
    log("held-out: %s" % ev)
    # the same on the first 2048 ids only: a figure a slow (sanitizer) build can check quickly
    pre = heldout_eval(model, head, ids[:2048], a.ctx, dev)
    C.write_json(os.path.join(fix_dir, "perplexity.json"), {
        "file": "heldout_sample.txt", "ctx": a.ctx, "tokens_total": ev["tokens_total"],
        "tokens_scored": ev["tokens_scored"], "mean_nll": ev["mean_nll"], "perplexity": ev["perplexity"],
        "prefix": {"max_tokens": 2048, "tokens_scored": pre["tokens_scored"], "mean_nll": pre["mean_nll"],
                   "perplexity": pre["perplexity"]},
        "windowing": ev["windowing"] + "; text tokenized as one string without special tokens",
        "reference": "transformers float32 (eager attention, no TF32) of models/default reloaded from disk",
        "tolerance_rel": 0.005})

    prompts = []
    with open(os.path.join(a.data, "heldout_prompts.jsonl"), encoding="utf-8") as f:
        prompts = [json.loads(line) for line in f]
    with open(os.path.join(fix_dir, "heldout_prompts.jsonl"), "w", encoding="utf-8") as f:
        for p in prompts:
            f.write(json.dumps({"messages": p["messages"], "path": p["path"], "name": p["name"]},
                               ensure_ascii=False) + "\n")

    model.to("cpu")
    head.to("cpu")
    card["parity"] = parity_fixture(model, tok, model_dir, fix_dir)
    log("parity fixture: %s" % card["parity"])
    s = min(64, max(0, len(ids) - 24))
    mtp_toks = [int(t) for t in ids[s:s + 24]]
    card["mtp_fixture"] = mtp_fixture(model, head, model_dir, mtp_toks, fix_dir,
                                      tok.decode(mtp_toks, skip_special_tokens=False))
    log("mtp fixture: %s" % card["mtp_fixture"])
    if card["mtp_fixture"]["mtp_ref_vs_f64"] > 1e-3:
        raise RuntimeError("MTP float32 vs float64 reference differ by %.3g x std" % card["mtp_fixture"]["mtp_ref_vs_f64"])

    if a.chat_eval:
        model.to(dev)
        res, samples = hf_chat_eval(model, model_dir, prompts[:a.chat_eval], dev, a.deadline)
        card["hf_chat"] = res
        with open(os.path.join(card_dir, "hf_chat_samples.jsonl"), "w", encoding="utf-8") as f:
            for r in samples:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        log("transformers greedy chat on held-out prompts: %s" % res)
        for r in samples[:3]:
            log("--- %s\n%s" % (r["prompt"], r["answer"][:600]))

    for name in ("train_state.json",):
        p = os.path.join(a.work, name)
        if os.path.exists(p):
            with open(p) as f:
                card["train"] = json.load(f)
    for name, key in (("stats.json", "data"), ("tok_stats.json", "tokenizer")):
        base = a.data if key == "data" else a.tok
        p = os.path.join(base, name)
        if os.path.exists(p):
            with open(p) as f:
                card[key] = json.load(f)
            shutil.copy(p, os.path.join(card_dir, name))
    card["export_eval_seconds"] = round(time.time() - t0, 1)
    C.write_json(os.path.join(card_dir, "model_card.json"), card)
    log("export_eval done in %.1f s" % card["export_eval_seconds"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""train.py — train the default model (Qwen3_5ForCausalLM + the MTP head) on tokenize_data.py's stream.

    python3 tools/train/train.py --tok TOK --work WORK [--preset real|tiny] [--seconds 330]
                                 [--deadline UNIX_TIME] [--max-steps N] [--resume]

- Model: Qwen3_5ForCausalLM (model_type qwen3_5_text), layer_types 3:1 linear/full attention, partial
  RoPE 0.25, zero-centred norms, tied embeddings; the MTP head of mtp.py trained jointly:
  loss = CE(main, x_{t+1}) + MTP_WEIGHT * CE(mtp, x_{t+2}), gradients of the MTP loss reach the trunk.
- Time-budgeted: the run stops cleanly after --seconds of training (or at --deadline, whichever is
  first); warmup then cosine decay to 10% are keyed on the fraction of that budget used, so a shorter
  budget still ends at the low learning rate.
- Seeded: weights from torch.manual_seed(seed); batch k's windows from a generator seeded (seed, k), so a
  resumed run sees the same batches as an uninterrupted one. (GPU kernels are not bit-deterministic and the
  step count depends on speed, so two runs are close, not identical.)
- Resumable: WORK/ckpt.pt (model, head, optimizer, step, seconds used, the budget) is written every
  --ckpt-every seconds and at the end; --resume continues from it with the budget it started with.
- bf16 autocast, fused AdamW (betas 0.9/0.95, weight decay 0.1 on matrices only), grad clip 1.0.
The final weights are WORK/final.pt (float32 state dicts + config) and WORK/train_state.json.
"""

import argparse
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from mtp import MTPHead, mtp_logits  # noqa: E402

MTP_WEIGHT = 0.3

PRESETS = {
    # ~24.2 M parameters in the main model, ~2.9 M in the MTP head: 54.3 MB of bf16.
    "real": dict(hidden_size=512, intermediate_size=960, num_hidden_layers=8, num_attention_heads=8,
                 num_key_value_heads=2, head_dim=64, linear_num_key_heads=4, linear_num_value_heads=8,
                 linear_key_head_dim=64, linear_value_head_dim=64, batch=64, seq=1024, lr=2e-3, warmup=0.04),
    # the smoke pass: every code path, seconds of work
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
                 linear_key_head_dim=32, linear_value_head_dim=32, batch=4, seq=256, lr=2e-3, warmup=0.1),
}


def log(*a):
    print(*a, flush=True)


def make_config(preset, tok_dir):
    import transformers as T
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    eot, im_end = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    V = (tok.get_vocab_size(with_added_tokens=True) + 63) // 64 * 64
    p = PRESETS[preset]
    hd = p["head_dim"]
    # rotary frequency pairs; the mRoPE sections must sum to it (like the real [11, 11, 10] for 32 pairs;
    # with text only the three position rows are equal, so the split changes nothing)
    rot = int(hd * 0.25) // 2
    sec = [-(-rot // 3), -(-rot // 3), rot - 2 * -(-rot // 3)]
    cfg = T.Qwen3_5TextConfig(
        vocab_size=V, hidden_size=p["hidden_size"], intermediate_size=p["intermediate_size"],
        num_hidden_layers=p["num_hidden_layers"], num_attention_heads=p["num_attention_heads"],
        num_key_value_heads=p["num_key_value_heads"], head_dim=hd,
        linear_num_key_heads=p["linear_num_key_heads"], linear_num_value_heads=p["linear_num_value_heads"],
        linear_key_head_dim=p["linear_key_head_dim"], linear_value_head_dim=p["linear_value_head_dim"],
        linear_conv_kernel_dim=4, rms_norm_eps=1e-6, max_position_embeddings=32768,
        full_attention_interval=4, tie_word_embeddings=True, initializer_range=0.02,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": sec, "mrope_interleaved": True},
        eos_token_id=[im_end, eot], pad_token_id=eot, bos_token_id=None)
    lt = list(cfg.layer_types)
    want = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(cfg.num_hidden_layers)]
    if lt != want:
        raise RuntimeError("layer_types %s, wanted %s" % (lt, want))
    return cfg


def build_model(cfg, seed, attn="sdpa"):
    import transformers as T

    torch.manual_seed(seed)
    model = T.Qwen3_5ForCausalLM(cfg)
    try:
        model.set_attn_implementation(attn)
    except Exception as e:  # older/newer API: keep the default, but say which one runs
        log("note: set_attn_implementation(%s) failed: %s" % (attn, e))
    if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        model.lm_head.weight = model.model.embed_tokens.weight  # tied: one tensor
    head = MTPHead(model.config)
    head.init_weights(cfg.initializer_range, torch.Generator().manual_seed(seed + 1))
    return model, head


def count_params(module):
    seen, n = set(), 0
    for p in module.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            n += p.numel()
    return n


def lr_at(frac, step, peak, warmup_frac, warmup_min_steps=20):
    """Linear warmup over warmup_frac of the budget (at least warmup_min_steps steps), cosine to 10%."""
    w = min(1.0, max(frac / max(warmup_frac, 1e-9), 0.0), (step + 1) / warmup_min_steps)
    decay = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))
    return peak * w * decay


def batch_at(stream, step, seed, B, S, device):
    g = torch.Generator().manual_seed(seed * 1000003 + step)
    off = torch.randint(0, stream.numel() - S, (B,), generator=g)
    idx = off.to(device)[:, None] + torch.arange(S, device=device)[None, :]
    return stream[idx]


def losses(model, head, x):
    V = model.config.vocab_size
    out = model.model(input_ids=x, use_cache=False)
    h = out.last_hidden_state  # [B, S, H] final-normed
    logits = model.lm_head(h)
    main = F.cross_entropy(logits[:, :-1].float().reshape(-1, V), x[:, 1:].reshape(-1))
    ml = mtp_logits(head, model, x, h)  # [B, S-1, V], row t -> x_{t+2}
    mtp = F.cross_entropy(ml[:, :-1].float().reshape(-1, V), x[:, 2:].reshape(-1))
    return main, mtp


def save_ckpt(path, model, head, opt, state):
    tmp = path + ".tmp"
    torch.save({"model": model.state_dict(), "head": head.state_dict(), "opt": opt.state_dict(),
                "state": state}, tmp)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tok", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--preset", default="real", choices=sorted(PRESETS))
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("TRAIN_SECONDS", 330)))
    ap.add_argument("--deadline", type=float, default=0, help="unix time the training must stop by")
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--ckpt-every", type=float, default=60.0, help="seconds between checkpoints")
    ap.add_argument("--log-every", type=float, default=20.0, help="seconds between progress lines")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--seq", type=int, default=0)
    ap.add_argument("--lr", type=float, default=0)
    a = ap.parse_args()

    p = PRESETS[a.preset]
    B, S, peak = a.batch or p["batch"], a.seq or p["seq"], a.lr or p["lr"]
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    os.makedirs(a.work, exist_ok=True)
    ckpt = os.path.join(a.work, "ckpt.pt")

    cfg = make_config(a.preset, a.tok)
    model, head = build_model(cfg, a.seed)
    n_main, n_head = count_params(model), count_params(head)
    log("model: %s attention=%s params main=%d mtp=%d total=%d (bf16 %.1f MB) vocab=%d layer_types=%s" % (
        type(model).__name__, model.config._attn_implementation, n_main, n_head, n_main + n_head,
        2 * (n_main + n_head) / 1e6, cfg.vocab_size, list(cfg.layer_types)))
    model.to(dev).train()
    head.to(dev).train()

    params = [(n, q) for n, q in list(model.named_parameters()) + [("mtp." + k, v) for k, v in head.named_parameters()]]
    decay = [q for n, q in params if q.dim() >= 2]
    no_decay = [q for n, q in params if q.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    try:
        opt = torch.optim.AdamW(groups, lr=peak, betas=(0.9, 0.95), eps=1e-8, fused=dev.type == "cuda")
    except (TypeError, RuntimeError) as e:
        log("note: fused AdamW unavailable (%s); using the default" % e)
        opt = torch.optim.AdamW(groups, lr=peak, betas=(0.9, 0.95), eps=1e-8)

    state = {"step": 0, "train_seconds": 0.0, "tokens": 0, "budget": None, "history": [], "seed": a.seed,
             "preset": a.preset, "batch": B, "seq": S, "peak_lr": peak, "mtp_weight": MTP_WEIGHT}
    if a.resume and os.path.exists(ckpt):
        ck = torch.load(ckpt, map_location=dev, weights_only=False)
        model.load_state_dict(ck["model"])
        head.load_state_dict(ck["head"])
        opt.load_state_dict(ck["opt"])
        state = ck["state"]
        log("resumed at step %d after %.1f s of training (budget %.1f s)" % (
            state["step"], state["train_seconds"], state["budget"]))
    elif a.resume:
        log("--resume: no checkpoint at %s, starting fresh" % ckpt)

    stream_np = np.load(os.path.join(a.tok, "train_ids.npy"))
    stream = torch.from_numpy(stream_np.astype(np.int64)).to(dev)
    log("stream: %d tokens; batch %d x %d = %d tokens/step" % (stream.numel(), B, S, B * S))

    if state["budget"] is None:
        budget = a.seconds
        if a.deadline:
            budget = min(budget, a.deadline - time.time())
        state["budget"] = max(1.0, budget)
    budget = state["budget"]
    if a.deadline:  # a resumed run must still end in time; the schedule keeps the original budget
        stop_at = a.deadline
    else:
        stop_at = float("inf")
    log("training budget %.1f s (%.1f s used), deadline in %.1f s" % (
        budget, state["train_seconds"], stop_at - time.time() if a.deadline else float("inf")))

    use_amp = dev.type == "cuda"
    t_last_log = t_last_ck = time.time()
    tok_since, loss_acc, n_acc = 0, [0.0, 0.0], 0
    while True:
        if state["train_seconds"] >= budget or (a.max_steps and state["step"] >= a.max_steps):
            break
        if time.time() >= stop_at:
            log("deadline reached")
            break
        t0 = time.time()
        frac = state["train_seconds"] / budget
        lr = lr_at(frac, state["step"], peak, p["warmup"])
        for g in opt.param_groups:
            g["lr"] = lr
        x = batch_at(stream, state["step"], a.seed, B, S, dev)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=use_amp):
            lm, lt = losses(model, head, x)
            loss = lm + MTP_WEIGHT * lt
        if not torch.isfinite(loss):
            raise RuntimeError("loss is %s at step %d" % (loss.item(), state["step"]))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_([q for _, q in params], 1.0)
        opt.step()
        loss_acc[0] += lm.item()
        loss_acc[1] += lt.item()
        n_acc += 1
        if dev.type == "cuda":
            torch.cuda.synchronize()
        state["step"] += 1
        state["tokens"] += B * S
        tok_since += B * S
        state["train_seconds"] += time.time() - t0
        now = time.time()
        if now - t_last_log >= a.log_every or state["step"] == 1 or state["train_seconds"] >= budget:
            rate = tok_since / max(1e-6, now - t_last_log) if state["step"] > 1 else 0.0
            rec = {"step": state["step"], "seconds": round(state["train_seconds"], 1), "lr": lr,
                   "loss": round(loss_acc[0] / n_acc, 4), "mtp_loss": round(loss_acc[1] / n_acc, 4),
                   "grad_norm": round(float(gn), 3), "tokens": state["tokens"], "tok_per_s": round(rate)}
            state["history"].append(rec)
            mem = torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else 0
            log("step %5d  %6.1fs  lr %.2e  loss %.4f  mtp %.4f  |g| %.2f  %.0f tok/s  %.1fM tokens  %.1f GiB" % (
                rec["step"], rec["seconds"], lr, rec["loss"], rec["mtp_loss"], rec["grad_norm"], rate,
                state["tokens"] / 1e6, mem))
            t_last_log, tok_since, loss_acc, n_acc = now, 0, [0.0, 0.0], 0
        if now - t_last_ck >= a.ckpt_every:
            save_ckpt(ckpt, model, head, opt, state)
            t_last_ck = time.time()

    save_ckpt(ckpt, model, head, opt, state)
    cfg_dict = model.config.to_dict()
    torch.save({"config": cfg_dict, "model": {k: v.float().cpu() for k, v in model.state_dict().items()},
                "head": {k: v.float().cpu() for k, v in head.state_dict().items()}},
               os.path.join(a.work, "final.pt"))
    out = dict(state, params_main=n_main, params_mtp=n_head, device=torch.cuda.get_device_name(0)
               if dev.type == "cuda" else "cpu", torch=torch.__version__,
               attention=model.config._attn_implementation,
               final_loss=state["history"][-1]["loss"] if state["history"] else None,
               final_mtp_loss=state["history"][-1]["mtp_loss"] if state["history"] else None)
    with open(os.path.join(a.work, "train_state.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    log("trained %d steps, %.1f s, %.1fM tokens" % (state["step"], state["train_seconds"], state["tokens"] / 1e6))
    return 0


if __name__ == "__main__":
    sys.exit(main())

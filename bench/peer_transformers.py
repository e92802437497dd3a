#!/usr/bin/env python3
"""bench/peer_transformers.py — the transformers peer of `cinfer bench --like SHAPE --device cuda`: the same
Qwen3.5 shapes (spec §1.3, the table of src/cli/synth.c) built with random bf16 weights directly on the GPU,
prefill tok/s for a single prompt and decode tok/s at a few batch sizes after a prompt of --ctx tokens, timed
with torch.cuda.synchronize around each measured region (eager PyTorch, no torch.compile; whatever
linear-attention kernels the machine's transformers finds: it prints whether flash-linear-attention and
causal-conv1d are importable, since without them transformers falls back to its PyTorch loops).

usage: python3 bench/peer_transformers.py --like qwen3.5-4b [--prefill 512,4096] [--batches 1,8] [-n 16] [--ctx 512]
"""
import argparse
import importlib.util
import sys
import time

import torch

SHAPES = {  # H, L, Hq, Hkv, Hk, Hv, I, E, k, Im, Is, tie, V  (as src/cli/synth.c)
    "qwen3.5-0.8b": (1024, 24, 8, 2, 16, 16, 3584, 0, 0, 0, 0, True, 248320),
    "qwen3.5-4b": (2560, 32, 16, 4, 16, 32, 9216, 0, 0, 0, 0, True, 248320),
    "qwen3.5-9b": (4096, 32, 16, 4, 16, 32, 12288, 0, 0, 0, 0, False, 248320),
    "qwen3.5-27b": (5120, 64, 24, 4, 16, 48, 17408, 0, 0, 0, 0, False, 248320),
    "qwen3.5-35b-a3b": (2048, 40, 16, 2, 16, 32, 0, 256, 8, 512, 512, False, 248320),
}


def build(like):
    import transformers as T
    H, L, Hq, Hkv, Hk, Hv, I, E, k, Im, Is, tie, V = SHAPES[like]
    common = dict(vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=Hq,
                  num_key_value_heads=Hkv, head_dim=256, linear_num_key_heads=Hk, linear_num_value_heads=Hv,
                  linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
                  rms_norm_eps=1e-6, max_position_embeddings=262144, full_attention_interval=4,
                  tie_word_embeddings=tie,
                  rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                                   "mrope_section": [11, 11, 10], "mrope_interleaved": True},
                  eos_token_id=None, pad_token_id=None, bos_token_id=None)
    if E:
        cfg = T.Qwen3_5MoeTextConfig(num_experts=E, num_experts_per_tok=k, moe_intermediate_size=Im,
                                     shared_expert_intermediate_size=Is, **common)
        cls = getattr(T, "Qwen3_5MoeForCausalLM")
    else:
        cfg = T.Qwen3_5TextConfig(intermediate_size=I, **common)
        cls = T.Qwen3_5ForCausalLM
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = cls(cfg)
    torch.set_default_dtype(torch.float32)
    model.eval()
    return model, V


def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--like", required=True, choices=sorted(SHAPES))
    ap.add_argument("--prefill", default="512,4096")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("-n", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=512)
    a = ap.parse_args()
    import transformers as T
    print(f"peer transformers {T.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name(0)}; "
          f"fla {'yes' if importlib.util.find_spec('fla') else 'no'}, "
          f"causal_conv1d {'yes' if importlib.util.find_spec('causal_conv1d') else 'no'}")
    model, V = build(a.like)
    print(f"shape {a.like}: {sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters, bf16, random")
    g = torch.Generator(device="cuda").manual_seed(1)
    with torch.inference_mode():
        ids = torch.randint(0, V, (1, 64), device="cuda", generator=g)
        timed(lambda: model(input_ids=ids, use_cache=True, logits_to_keep=1))  # warm-up
        for P in [int(x) for x in a.prefill.split(",")]:
            ids = torch.randint(0, V, (1, P), device="cuda", generator=g)
            try:
                _, dt = timed(lambda: model(input_ids=ids, use_cache=True, logits_to_keep=1))
                print(f"prefill {P:6d} tokens: {P / dt:10.1f} tok/s ({dt:.3f} s)")
            except torch.OutOfMemoryError:
                print(f"prefill {P:6d} tokens: out of memory")
            torch.cuda.empty_cache()
        for B in [int(x) for x in a.batches.split(",")]:
            ids = torch.randint(0, V, (B, a.ctx), device="cuda", generator=g)
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            pkv = out.past_key_values
            nxt = out.logits[:, -1:].argmax(-1)
            for _ in range(2):  # warm-up steps
                out = model(input_ids=nxt, past_key_values=pkv, use_cache=True)
                pkv, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)

            def steps():
                nonlocal pkv, nxt
                for _ in range(a.n):
                    o = model(input_ids=nxt, past_key_values=pkv, use_cache=True)
                    pkv, nxt = o.past_key_values, o.logits[:, -1:].argmax(-1)
            _, dt = timed(steps)
            print(f"decode batch {B:3d}: {B * a.n / dt:10.1f} tok/s ({dt / a.n * 1e3:.2f} ms/step, {a.n} steps after {a.ctx})")
            del pkv, out
            torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""mtp_np_reference.py — an independent float64 NumPy forward of the MTP head (spec/qwen35.md section 5),
written from the spec rather than from transformers, to check the MTP oracle fixture.

    python3 tools/train/mtp_np_reference.py DIR --tokens 1,2,3 --hidden hidden.npy --out mtp64.npy

hidden.npy is the main model's final-normed hidden state [T, H] (the lm_head input); the result is [T-1, V]:
row t = logits for x[t+2] from (embed(x[t+1]), hidden[t]) at RoPE position t, causal over rows 0..t.
Needs only NumPy; reads the safetensors with tools/oracle/np_reference.py's reader.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "oracle"))
from np_reference import load_safetensors  # noqa: E402


def mtp_forward64(d, ids, hidden, W=None):
    cfg = json.load(open(os.path.join(d, "config.json")))
    tc = cfg.get("text_config", cfg)
    W = W if W is not None else load_safetensors(d)
    P = "model.language_model." if "model.language_model.embed_tokens.weight" in W else "model."
    H = tc["hidden_size"]
    hd = tc.get("head_dim", H // tc["num_attention_heads"])
    Hq, Hkv = tc["num_attention_heads"], tc["num_key_value_heads"]
    eps = tc.get("rms_norm_eps", 1e-6)
    rp = tc.get("rope_parameters") or {}
    theta = rp.get("rope_theta", tc.get("rope_theta"))
    R = int(hd * rp.get("partial_rotary_factor", tc.get("partial_rotary_factor", 0.25)))
    ids = np.asarray(ids)
    hid = np.asarray(hidden, dtype=np.float64)
    T1 = len(ids) - 1
    emb = W[P + "embed_tokens.weight"]

    def rms1p(v, w):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * (1 + w)

    def silu(v):
        return v / (1 + np.exp(-v))

    x = np.concatenate([rms1p(emb[ids[1:]], W["mtp.pre_fc_norm_embedding.weight"]),
                        rms1p(hid[:T1], W["mtp.pre_fc_norm_hidden.weight"])], -1) @ W["mtp.fc.weight"].T
    inv = 1.0 / theta ** (np.arange(0, R, 2) / R)
    ang = np.arange(T1)[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(v):  # rotate-half on the first R dims of each head
        out = v.copy()
        a, b = v[..., :R // 2], v[..., R // 2:R]
        out[..., :R // 2] = a * cos - b * sin
        out[..., R // 2:R] = b * cos + a * sin
        return out

    lp = "mtp.layers.0."
    h = rms1p(x, W[lp + "input_layernorm.weight"])
    qg = (h @ W[lp + "self_attn.q_proj.weight"].T).reshape(T1, Hq, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:].reshape(T1, Hq * hd)
    k = (h @ W[lp + "self_attn.k_proj.weight"].T).reshape(T1, Hkv, hd)
    v = (h @ W[lp + "self_attn.v_proj.weight"].T).reshape(T1, Hkv, hd)
    q = rope(rms1p(q, W[lp + "self_attn.q_norm.weight"]))
    k = rope(rms1p(k, W[lp + "self_attn.k_norm.weight"]))
    o = np.zeros((T1, Hq, hd))
    for j in range(Hq):
        g = j // (Hq // Hkv)
        s = q[:, j] @ k[:, g].T / np.sqrt(hd) + np.triu(np.full((T1, T1), -np.inf), 1)
        p = np.exp(s - s.max(-1, keepdims=True))
        o[:, j] = (p / p.sum(-1, keepdims=True)) @ v[:, g]
    x = x + (o.reshape(T1, Hq * hd) / (1 + np.exp(-gate))) @ W[lp + "self_attn.o_proj.weight"].T
    h = rms1p(x, W[lp + "post_attention_layernorm.weight"])
    x = x + (silu(h @ W[lp + "mlp.gate_proj.weight"].T) * (h @ W[lp + "mlp.up_proj.weight"].T)) @ \
        W[lp + "mlp.down_proj.weight"].T
    head = W.get("lm_head.weight", emb)
    return rms1p(x, W["mtp.norm.weight"]) @ head.T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--hidden", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    ids = [int(t) for t in a.tokens.split(",")]
    np.save(a.out, mtp_forward64(a.dir, ids, np.load(a.hidden)).astype(np.float32))


if __name__ == "__main__":
    main()

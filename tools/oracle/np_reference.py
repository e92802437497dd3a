#!/usr/bin/env python3
"""np_reference.py — an independent float64 NumPy forward of Qwen3.5 / Qwen3.5-MoE / Qwen3-Next, written from
spec/qwen35.md (not from transformers), for diagnosing parity: it tells how far the C engine's float32 result
and transformers' float32 reference each are from the float64 answer.

    python3 tools/oracle/np_reference.py DIR --tokens 1,2,3 --out ref64.npy

Needs only NumPy (Debian python3-numpy); reads safetensors directly. Recurrent DeltaNet form (exact in f64)."""
import argparse, json, os, struct, sys
import numpy as np


def load_safetensors(d):
    files = []
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        files = sorted(set(json.load(open(idx))["weight_map"].values()))
    elif os.path.exists(os.path.join(d, "model.safetensors")):
        files = ["model.safetensors"]
    else:
        files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    out = {}
    for f in files:
        b = open(os.path.join(d, f), "rb").read()
        n = struct.unpack("<Q", b[:8])[0]
        h = json.loads(b[8:8 + n])
        base = 8 + n
        for k, v in h.items():
            if k == "__metadata__":
                continue
            s, e = v["data_offsets"]
            raw = b[base + s:base + e]
            if v["dtype"] == "BF16":
                a = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
                a = a.view(np.float32)
            elif v["dtype"] == "F16":
                a = np.frombuffer(raw, dtype=np.float16)
            elif v["dtype"] == "F32":
                a = np.frombuffer(raw, dtype=np.float32)
            else:
                continue
            out[k] = a.astype(np.float64).reshape(v["shape"])
    return out


_CACHE = {}


def forward64(d, ids, image_rows=None, positions=None):
    """float64 logits [T, V] of the model in directory d for token ids (weights cached per directory).

    image_rows: optional (row indices, array [n, H]) that replace those rows of the embeddings (the
    vision tower's output at the <|image_pad|> tokens); positions: optional 3 x T mRoPE positions
    (rows t, h, w; spec 3.4 interleaving). Without them, plain text positions 0..T-1."""
    # keyed by the files' mtimes too: make_fixtures rebuilds a model in the same directory when it
    # re-seeds, and stale weights would make every case look ill-conditioned
    key = (d, tuple(sorted((f, os.stat(os.path.join(d, f)).st_mtime_ns) for f in os.listdir(d)
                           if f.endswith((".safetensors", ".json")))))
    if key not in _CACHE:
        _CACHE.clear()
        _CACHE[key] = (json.load(open(os.path.join(d, "config.json"))), load_safetensors(d))
    cfg, W = _CACHE[key]
    tc = cfg.get("text_config", cfg)
    P = "model.language_model." if "model.language_model.embed_tokens.weight" in W else "model."
    H, L = tc["hidden_size"], tc["num_hidden_layers"]
    hd = tc.get("head_dim", H // tc["num_attention_heads"])
    Hq, Hkv = tc["num_attention_heads"], tc["num_key_value_heads"]
    Hk, Hv, dk, dv = tc["linear_num_key_heads"], tc["linear_num_value_heads"], tc["linear_key_head_dim"], tc["linear_value_head_dim"]
    eps = tc.get("rms_norm_eps", 1e-6)
    rp = tc.get("rope_parameters") or {}
    theta = rp.get("rope_theta", tc.get("rope_theta"))
    pf = rp.get("partial_rotary_factor", tc.get("partial_rotary_factor", 0.25))
    R = int(hd * pf)
    lt = tc.get("layer_types") or ["full_attention" if (i + 1) % tc.get("full_attention_interval", 4) == 0 else "linear_attention" for i in range(L)]
    mt = cfg.get("model_type")
    next_ = mt == "qwen3_next"
    E = tc.get("num_experts", 0)
    T = len(ids)
    x = W[P + "embed_tokens.weight"][ids]
    if image_rows is not None:
        x = x.copy()
        x[np.asarray(image_rows[0], dtype=np.int64)] = np.asarray(image_rows[1], dtype=np.float64)

    def rms1p(v, w):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * (1 + w)

    def silu(v):
        return v / (1 + np.exp(-v))

    def mlp(v, pre):
        return (silu(v @ W[pre + "gate_proj.weight"].T) * (v @ W[pre + "up_proj.weight"].T)) @ W[pre + "down_proj.weight"].T

    inv = 1.0 / theta ** (np.arange(0, R, 2) / R)
    if positions is None:
        pos = np.arange(T)[:, None] * inv[None, :]
    else:
        pr = np.asarray(positions, dtype=np.float64).reshape(3, T)
        sec = rp.get("mrope_section", [R // 2, 0, 0])
        row = np.zeros(R // 2, dtype=np.int64)
        for j in range(R // 2):
            if j % 3 == 1 and j < 3 * sec[1]:
                row[j] = 1
            elif j % 3 == 2 and j < 3 * sec[2]:
                row[j] = 2
        pos = pr[row].T * inv[None, :]
    cos, sin = np.cos(pos), np.sin(pos)

    def rope(v):  # v [T, heads, hd]
        r1, r2 = v[..., :R // 2], v[..., R // 2:R]
        c, s = cos[:, None, :], sin[:, None, :]
        out = v.copy()
        out[..., :R // 2] = r1 * c - r2 * s
        out[..., R // 2:R] = r2 * c + r1 * s
        return out

    for i in range(L):
        lp = P + f"layers.{i}."
        h = rms1p(x, W[lp + "input_layernorm.weight"])
        if lt[i] == "linear_attention":
            kd, vd = Hk * dk, Hv * dv
            r = Hv // Hk
            if next_:
                m = h @ W[lp + "linear_attn.in_proj_qkvz.weight"].T
                m = m.reshape(T, Hk, 2 * dk + 2 * r * dv)
                q = m[..., :dk].reshape(T, kd); k = m[..., dk:2 * dk].reshape(T, kd)
                v = m[..., 2 * dk:2 * dk + r * dv].reshape(T, vd); z = m[..., 2 * dk + r * dv:].reshape(T, vd)
                qkv = np.concatenate([q, k, v], -1)
                ba = (h @ W[lp + "linear_attn.in_proj_ba.weight"].T).reshape(T, Hk, 2 * r)
                b = ba[..., :r].reshape(T, Hv); al = ba[..., r:].reshape(T, Hv)
            else:
                qkv = h @ W[lp + "linear_attn.in_proj_qkv.weight"].T
                z = h @ W[lp + "linear_attn.in_proj_z.weight"].T
                b = h @ W[lp + "linear_attn.in_proj_b.weight"].T
                al = h @ W[lp + "linear_attn.in_proj_a.weight"].T
            cw = W[lp + "linear_attn.conv1d.weight"][:, 0, :]  # [C, K]
            K = cw.shape[1]
            X = np.concatenate([np.zeros((K - 1, qkv.shape[1])), qkv], 0)
            y = np.stack([(X[t:t + K] * cw.T).sum(0) for t in range(T)])
            y = silu(y)
            q = y[:, :kd].reshape(T, Hk, dk); k = y[:, kd:2 * kd].reshape(T, Hk, dk); v = y[:, 2 * kd:].reshape(T, Hv, dv)
            q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) / np.sqrt(dk)
            k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
            beta = 1 / (1 + np.exp(-b))
            sp = al + W[lp + "linear_attn.dt_bias"]
            sp = np.where(sp > 20, sp, np.log1p(np.exp(np.minimum(sp, 20))))
            g = -np.exp(W[lp + "linear_attn.A_log"]) * sp
            o = np.zeros((T, Hv, dv))
            for hh in range(Hv):
                kh = hh // r
                S = np.zeros((dk, dv))
                for t in range(T):
                    S *= np.exp(g[t, hh])
                    d = beta[t, hh] * (v[t, hh] - S.T @ k[t, kh])
                    S += np.outer(k[t, kh], d)
                    o[t, hh] = S.T @ q[t, kh]
            n = o / np.sqrt((o * o).mean(-1, keepdims=True) + eps) * W[lp + "linear_attn.norm.weight"]
            n = n * silu(z.reshape(T, Hv, dv))
            out = n.reshape(T, vd) @ W[lp + "linear_attn.out_proj.weight"].T
        else:
            qg = (h @ W[lp + "self_attn.q_proj.weight"].T).reshape(T, Hq, 2 * hd)
            q, gate = qg[..., :hd], qg[..., hd:]
            k = (h @ W[lp + "self_attn.k_proj.weight"].T).reshape(T, Hkv, hd)
            v = (h @ W[lp + "self_attn.v_proj.weight"].T).reshape(T, Hkv, hd)
            q = rope(rms1p(q, W[lp + "self_attn.q_norm.weight"]))
            k = rope(rms1p(k, W[lp + "self_attn.k_norm.weight"]))
            o = np.zeros((T, Hq, hd))
            for hh in range(Hq):
                kv = hh // (Hq // Hkv)
                s = q[:, hh] @ k[:, kv].T / np.sqrt(hd)
                s = s + np.triu(np.full((T, T), -np.inf), 1)
                p = np.exp(s - s.max(-1, keepdims=True))
                p /= p.sum(-1, keepdims=True)
                o[:, hh] = p @ v[:, kv]
            o = o * (1 / (1 + np.exp(-gate)))
            out = o.reshape(T, Hq * hd) @ W[lp + "self_attn.o_proj.weight"].T
        x = x + out
        h = rms1p(x, W[lp + "post_attention_layernorm.weight"])
        moe = E > 0 and (not next_ or (i not in tc.get("mlp_only_layers", []) and (i + 1) % tc.get("decoder_sparse_step", 1) == 0))
        if moe:
            lg = h @ W[lp + "mlp.gate.weight"].T
            p = np.exp(lg - lg.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
            kk = tc["num_experts_per_tok"]
            y = np.zeros_like(h)
            fused = lp + "mlp.experts.gate_up_proj" in W
            Im = tc["moe_intermediate_size"]
            for t in range(T):
                top = np.argsort(-p[t], kind="stable")[:kk]
                w = p[t, top]
                if (not next_) or tc.get("norm_topk_prob", True):
                    w = w / w.sum()
                for e, we in zip(top, w):
                    if fused:
                        gu = W[lp + "mlp.experts.gate_up_proj"][e]
                        a1 = silu(h[t] @ gu[:Im].T) * (h[t] @ gu[Im:].T)
                        y[t] += we * (a1 @ W[lp + "mlp.experts.down_proj"][e].T)
                    else:
                        y[t] += we * mlp(h[t:t + 1], lp + f"mlp.experts.{e}.")[0]
            if lp + "mlp.shared_expert.gate_proj.weight" in W:
                sg = 1 / (1 + np.exp(-(h @ W[lp + "mlp.shared_expert_gate.weight"].T)))
                y += sg * mlp(h, lp + "mlp.shared_expert.")
            x = x + y
        else:
            x = x + mlp(h, lp + "mlp.")
    x = rms1p(x, W[P + "norm.weight"])
    head = W.get("lm_head.weight", W[P + "embed_tokens.weight"])
    return x @ head.T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    ids = [int(x) for x in a.tokens.split(",")]
    np.save(a.out, forward64(a.dir, ids).astype(np.float32))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Make every oracle fixture: tiny random Qwen3.5 / Qwen3.5-MoE / Qwen3-Next checkpoints in
bf16, transformers' float32 CPU logits on them, greedy continuations from generate(), the
manifest, and (through make_default_model.py) models/default.

    python3 tools/oracle/make_fixtures.py --root OUTDIR [--only NAME[,NAME]] [--skip-default]

writes OUTDIR/tests/fixtures/<model>/ and OUTDIR/models/default/. Seeded: the same versions
give the same bytes. tools/oracle/README.md has the device command.
"""

import argparse
import datetime
import json
import os
import re
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import common as C  # noqa: E402
import np_reference as NPR  # noqa: E402

CASE_LENGTHS = [("len1", 1), ("len10", 10), ("len64", 64), ("len150", 150)]
COND_BOUND = 3e-5  # max |f32 reference - float64| / std accepted for a case
COND_TRIES = 40
GREEDY_LENGTHS = [("g1", 1), ("g7", 7), ("g70", 70)]
N_NEW = 24
TARGET_STD = 3.0
GREEDY_TRIES = 12
GREEDY_MIN_MARGIN = 0.03
MOE_SEED_TRIES = 8
MOE_MIN_GAP = 1e-4
GEN_NOTE = ("transformers generate(do_sample=False, max_new_tokens=24, eos_token_id=None, "
            "use_cache=True) in float32 on the CPU: chunked prefill of the prompt, then one "
            "recurrent decode step per token; eos disabled so exactly 24 tokens come out")


def L(n):  # layer-type shorthand for readable specs
    return {"L": "linear_attention", "F": "full_attention"}[n]


def text_fields(cfg):
    keys = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "intermediate_size", "linear_num_key_heads",
            "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
            "linear_conv_kernel_dim", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
            "shared_expert_intermediate_size", "norm_topk_prob", "mlp_only_layers",
            "decoder_sparse_step", "rms_norm_eps", "rope_parameters", "layer_types",
            "tie_word_embeddings"]
    return {k: getattr(cfg, k) for k in keys if hasattr(cfg, k)}


# ----------------------------------------------------------------------------- model specs

def spec_dense():
    import transformers as T
    H = 128
    text = dict(vocab_size=512, hidden_size=H, intermediate_size=128, num_hidden_layers=8,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                linear_num_key_heads=2, linear_num_value_heads=4,   # Hv = 2*Hk, grouped
                linear_key_head_dim=32, linear_value_head_dim=16,   # dk != dv on purpose
                linear_conv_kernel_dim=4, rms_norm_eps=1e-6, max_position_embeddings=4096,
                layer_types=[L(c) for c in "LFLLFFLF"], tie_word_embeddings=True,
                rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                                 "partial_rotary_factor": 0.5, "mrope_section": [3, 3, 2],
                                 "mrope_interleaved": True},
                eos_token_id=None, pad_token_id=None, bos_token_id=None)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3,
                  patch_size=16, temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=H,
                  num_position_embeddings=64)
    cfg = T.Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=True)
    return dict(name="qwen35_dense", cls=T.Qwen3_5ForConditionalGeneration, config=cfg, hidden=H,
                vocab=512, alog_f32=True, seed=1001, mtp=True, top_k=None)


def spec_text():
    import transformers as T
    H = 64
    cfg = T.Qwen3_5TextConfig(
        vocab_size=384, hidden_size=H, intermediate_size=128, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=32,
        linear_value_head_dim=32, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
        max_position_embeddings=4096, full_attention_interval=3, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                         "partial_rotary_factor": 0.5, "mrope_section": [3, 3, 2],
                         "mrope_interleaved": True},
        eos_token_id=None, pad_token_id=None, bos_token_id=None)
    return dict(name="qwen35_text", cls=T.Qwen3_5ForCausalLM, config=cfg, hidden=H, vocab=384,
                alog_f32=True, seed=1002, sharded=True, interval=3, top_k=None)


def spec_moe():
    import transformers as T
    H = 64
    text = dict(vocab_size=384, hidden_size=H, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, linear_num_key_heads=2,
                linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
                linear_conv_kernel_dim=4, num_experts=8, num_experts_per_tok=2,
                moe_intermediate_size=32, shared_expert_intermediate_size=64, rms_norm_eps=1e-6,
                max_position_embeddings=4096, layer_types=[L(c) for c in "LFLF"],
                tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                                 "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1],
                                 "mrope_interleaved": True},
                eos_token_id=None, pad_token_id=None, bos_token_id=None)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3,
                  patch_size=16, temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=H,
                  num_position_embeddings=64)
    cfg = T.Qwen3_5MoeConfig(text_config=text, vision_config=vision, tie_word_embeddings=False)
    return dict(name="qwen35_moe", cls=T.Qwen3_5MoeForConditionalGeneration, config=cfg, hidden=H,
                vocab=384, alog_f32=False, seed=1003, fused_copy=True, top_k=2)


def spec_next():
    import transformers as T
    H = 64
    cfg = T.Qwen3NextConfig(
        vocab_size=500, hidden_size=H, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=2, num_key_value_heads=1, head_dim=64, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
        linear_conv_kernel_dim=4, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[1], rms_norm_eps=1e-6, max_position_embeddings=4096,
        layer_types=[L(c) for c in "LFLF"], tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                         "partial_rotary_factor": 0.25},
        eos_token_id=None, pad_token_id=None, bos_token_id=None)
    return dict(name="qwen3_next", cls=T.Qwen3NextForCausalLM, config=cfg, hidden=H, vocab=500,
                alog_f32=True, seed=1004, top_k=2)


# ----------------------------------------------------------------------------- file surgery

def add_mtp_tensors(d, tcfg, seed, sigma):
    """Real Qwen3.5 files carry an MTP head next to the main weights; HF ignores it on load
    (_keys_to_ignore_on_load_unexpected = ^mtp.*) but the C loader must map it."""
    from safetensors.torch import load_file, save_file

    H, hd = tcfg.hidden_size, tcfg.head_dim
    Hq, Hkv, I = tcfg.num_attention_heads, tcfg.num_key_value_heads, tcfg.intermediate_size
    g = torch.Generator().manual_seed(seed)

    def w(*shape, std=sigma):
        return (torch.randn(shape, generator=g) * std).to(torch.bfloat16)

    t = {
        "mtp.fc.weight": w(H, 2 * H),
        "mtp.pre_fc_norm_embedding.weight": w(H, std=0.1),
        "mtp.pre_fc_norm_hidden.weight": w(H, std=0.1),
        "mtp.norm.weight": w(H, std=0.1),
        "mtp.layers.0.input_layernorm.weight": w(H, std=0.1),
        "mtp.layers.0.post_attention_layernorm.weight": w(H, std=0.1),
        "mtp.layers.0.self_attn.q_proj.weight": w(Hq * hd * 2, H),
        "mtp.layers.0.self_attn.k_proj.weight": w(Hkv * hd, H),
        "mtp.layers.0.self_attn.v_proj.weight": w(Hkv * hd, H),
        "mtp.layers.0.self_attn.o_proj.weight": w(H, Hq * hd),
        "mtp.layers.0.self_attn.q_norm.weight": w(hd, std=0.1),
        "mtp.layers.0.self_attn.k_norm.weight": w(hd, std=0.1),
        "mtp.layers.0.mlp.gate_proj.weight": w(I, H),
        "mtp.layers.0.mlp.up_proj.weight": w(I, H),
        "mtp.layers.0.mlp.down_proj.weight": w(H, I),
    }
    files = C.safetensors_files(d)
    target = os.path.join(d, files[-1])
    sd = load_file(target)
    sd.update(t)
    save_file(sd, target, metadata={"format": "pt"})
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            index = json.load(f)
        for k in t:
            index["weight_map"][k] = files[-1]
        C.write_json(idx, index)
    return sorted(t)


def edit_config(d, fn):
    p = os.path.join(d, "config.json")
    with open(p) as f:
        cfg = json.load(f)
    fn(cfg)
    C.write_json(p, cfg)
    return cfg


EXPERT_RE = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def write_fused_copy(src, dst):
    """Same weights, experts fused as real Qwen3.5-MoE checkpoints store them:
    experts.gate_up_proj [E, 2*Im, H] (rows 0..Im-1 gate, Im..2Im-1 up) and
    experts.down_proj [E, H, Im], no '.weight' suffix."""
    from safetensors.torch import load_file, save_file

    sd = {}
    for fn in C.safetensors_files(src):
        sd.update(load_file(os.path.join(src, fn)))
    groups, out = {}, {}
    for k, v in sd.items():
        m = EXPERT_RE.match(k)
        if m:
            groups.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = v
        else:
            out[k] = v
    if not groups:
        note = "source already had no per-expert tensors; copied as written"
    else:
        note = "stacked %d per-expert groups into gate_up_proj/down_proj" % len(groups)
    for pfx, experts in groups.items():
        E = len(experts)
        assert sorted(experts) == list(range(E)), pfx
        out[pfx + ".gate_up_proj"] = torch.stack(
            [torch.cat([experts[e]["gate_proj"], experts[e]["up_proj"]], dim=0) for e in range(E)])
        out[pfx + ".down_proj"] = torch.stack([experts[e]["down_proj"] for e in range(E)])
    os.makedirs(dst, exist_ok=True)
    save_file({k: out[k].contiguous() for k in sorted(out)}, os.path.join(dst, "model.safetensors"),
              metadata={"format": "pt"})
    for fn in ["config.json", "generation_config.json"]:
        if os.path.exists(os.path.join(src, fn)):
            shutil.copy(os.path.join(src, fn), os.path.join(dst, fn))
    return note


def save_sharded(model, d, want=(2, 3)):
    """Pick a max_shard_size that gives 2-3 shards plus model.safetensors.index.json."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for frac in [2.5, 2.0, 3.0, 1.6, 3.5]:
        if os.path.isdir(d):
            shutil.rmtree(d)
        C.save_model(model, d, max_shard_size=int(total / frac) + 1)
        n = len(C.safetensors_files(d))
        if want[0] <= n <= want[1]:
            return n, int(total / frac) + 1
    return n, None


# ----------------------------------------------------------------------------- one model

def build_one(spec, fixtures_root):
    name, cls, cfg = spec["name"], spec["cls"], spec["config"]
    d = os.path.join(fixtures_root, name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    t0 = time.time()
    torch.manual_seed(spec["seed"])
    H, V = spec["hidden"], spec["vocab"]
    sigma = 0.8 / (H ** 0.5)
    model = cls(cfg).float().eval()
    want_tied = bool(getattr(cfg, "tie_word_embeddings", False))
    if want_tied and model.lm_head.weight.data_ptr() != model.get_input_embeddings().weight.data_ptr():
        model.lm_head.weight = model.get_input_embeddings().weight  # one tensor, as in a tied file
    C.randomize_weights(model, spec["seed"], sigma, H)
    std_pre, std_scaled = C.widen_logits(model, V, TARGET_STD, spec["seed"] + 7)
    n_alog32 = C.to_bf16_keep_alog(model, spec["alog_f32"])
    notes = ["init: matrices N(0, %.4f), final norm scaled to logits std %.2f (was %.3f)" %
             (sigma, std_scaled, std_pre)]
    if spec.get("sharded"):
        n_shards, size = save_sharded(model, d)
        notes.append("saved in %d shards (max_shard_size=%s bytes)" % (n_shards, size))
    else:
        C.save_model(model, d)
    del model

    if spec.get("mtp"):
        tcfg = cfg.text_config if hasattr(cfg, "text_config") else cfg
        names = add_mtp_tensors(d, tcfg, spec["seed"] + 11, sigma)
        edit_config(d, lambda c: c["text_config"].update(
            {"mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False}))
        notes.append("added %d mtp.* tensors; text_config.mtp_num_hidden_layers = 1" % len(names))
    if spec.get("interval"):
        def drop_layer_types(c):
            c.pop("layer_types", None)
            c["full_attention_interval"] = spec["interval"]
        edit_config(d, drop_layer_types)
        notes.append("config.json: layer_types removed, full_attention_interval = %d" % spec["interval"])

    inv = C.tensor_inventory(d)
    if want_tied and "lm_head.weight" in inv:
        # A tied checkpoint must not carry its own lm_head: an engine would (rightly) use it.
        from safetensors.torch import load_file, save_file
        p = os.path.join(d, inv["lm_head.weight"][2])
        sd = load_file(p)
        del sd["lm_head.weight"]
        save_file(sd, p, metadata={"format": "pt"})
        notes.append("save_pretrained wrote lm_head.weight for a tied model; removed it")
        inv = C.tensor_inventory(d)
    alog = sorted({v[0] for k, v in inv.items() if k.endswith("A_log")})
    expert_names = sorted({re.sub(r"\.\d+\.", ".{i}.", k) for k in inv if ".experts." in k})[:6]
    if "lm_head.weight" in inv:
        notes.append("lm_head.weight present (untied)")
    else:
        notes.append("lm_head.weight absent (tied to embed_tokens)")

    # Reference: the model exactly as stored.
    model = C.load_reference_model(cls, d)
    tcfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    rot = C.find_rotary(model)
    rotary_dim = int(rot.inv_freq.numel() * 2) if rot is not None else None
    if spec.get("tie_check", True):
        emb = model.get_input_embeddings().weight
        tied = bool(torch.equal(model.lm_head.weight, emb))
        want_tied = bool(getattr(model.config, "tie_word_embeddings", False))
        if tied != want_tied:
            raise RuntimeError("lm_head tie state %s, config says %s" % (tied, want_tied))
    if spec.get("interval"):
        want = ["full_attention" if (i + 1) % spec["interval"] == 0 else "linear_attention"
                for i in range(tcfg.num_hidden_layers)]
        if list(tcfg.layer_types) != want:
            raise RuntimeError("layer_types from full_attention_interval: %s" % tcfg.layer_types)
    gdn = C.gdn_layer_report(model)
    gap = C.RouterGapRecorder(model, spec["top_k"]) if spec["top_k"] else None

    before = dict(C.CALLS)
    cases, all_logits = [], []
    for i, (cname, T) in enumerate(CASE_LENGTHS):
        # The reference must be accurate well inside the parity bound, or no float32 engine can match
        # it: tiny random models have ill-conditioned spots (a DeltaNet read-out whose q.k nearly
        # cancels, then a gated RMSNorm whose eps is comparable to it) where transformers' own float32
        # result is off the exact answer by up to 1e-3 x std. So each case's tokens are redrawn until
        # transformers' float32 logits agree with an independent float64 forward (np_reference.py,
        # written from the spec) to COND_BOUND x std; the figure is recorded in the case.
        best = None
        for t in range(COND_TRIES):
            toks = C.random_tokens(spec["seed"] * 100 + i + 1000 * t, T, V)
            lg = C.forward_logits(model, toks)
            assert lg.shape == (T, V), lg.shape
            ref64 = NPR.forward64(d, toks)
            err = float(np.abs(lg.astype(np.float64) - ref64).max() / np.std(lg))
            if best is None or err < best[2]:
                best = (toks, lg, err, t)
            if err <= COND_BOUND:
                break
        toks, lg, err, t = best
        C.log("%s %s: f32 reference vs float64 = %.2e x std (try %d)" % (name, cname, err, t))
        C.save_logits(os.path.join(d, cname + ".npy"), lg)
        all_logits.append(lg.reshape(-1))
        cases.append({"name": cname, "tokens": toks, "logits": cname + ".npy", "std": float(np.std(lg)),
                      "ref_vs_f64": err})
    fwd_calls = {k: v - before.get(k, 0) for k, v in C.CALLS.items() if v - before.get(k, 0)}
    std_all = float(np.std(np.concatenate(all_logits)))

    before = dict(C.CALLS)
    greedy_cases = []
    if gap is not None:
        gap.enabled = False  # rejected prompts must not count; the chosen ones are re-measured
    for i, (gname, T) in enumerate(GREEDY_LENGTHS):
        # Random prompts, but keep one whose greedy path is not decided by a near-tie: the
        # C engine matches transformers to ~1e-4 * std, so a top-1/top-2 gap must be far above.
        best = None
        for t in range(GREEDY_TRIES):
            pseed = spec["seed"] * 100 + 50 + i + 1000 * t
            prompt = C.random_tokens(pseed, T, V)
            new, margin, agree, drift = C.greedy(model, prompt, N_NEW)
            if best is None or margin > best["min_margin"]:
                best = {"name": gname, "prompt": prompt, "output": new, "min_margin": margin,
                        "argmax_of_full_forward_agrees": agree,
                        "hf_decode_vs_full_forward_max_abs_diff": drift,
                        "prompt_seed": pseed, "prompt_tries": t + 1}
            if margin >= GREEDY_MIN_MARGIN:
                break
        greedy_cases.append(best)
    gen_calls = {k: v - before.get(k, 0) for k, v in C.CALLS.items() if v - before.get(k, 0)}
    if gap is not None:
        gap.enabled = True
        for g in greedy_cases:
            C.forward_logits(model, g["prompt"] + g["output"])
        gap.close()

    out = {"model": name, "class": cls.__name__, "std": std_all, "cases": cases,
           "greedy": greedy_cases, "generation": GEN_NOTE,
           "reference": "transformers float32 forward on the CPU over the whole sequence, "
                        "eager attention, use_cache=False, no attention mask",
           "config_summary": text_fields(tcfg), "rotary_dim": rotary_dim,
           "a_log_dtype": alog, "seed": spec["seed"], "notes": notes}
    if gap is not None:
        out["min_router_topk_gap"] = gap.min_gap
    C.write_json(os.path.join(d, "cases.json"), out)
    result = {"std": std_all, "case_std": {c["name"]: c["std"] for c in cases},
              "layer_types": list(getattr(tcfg, "layer_types", [])), "rotary_dim": rotary_dim,
              "a_log_dtype": alog, "expert_names": expert_names, "notes": notes,
              "forward_calls": fwd_calls, "generate_calls": gen_calls, "gdn_layer": gdn,
              "greedy_min_margin": min(g["min_margin"] for g in greedy_cases),
              "greedy_agree": all(g["argmax_of_full_forward_agrees"] for g in greedy_cases),
              "hf_decode_drift": max(g["hf_decode_vs_full_forward_max_abs_diff"] for g in greedy_cases),
              "n_tensors": len(inv), "bytes": C.dir_size(d), "seconds": round(time.time() - t0, 1)}
    if gap is not None:
        result["min_router_topk_gap"] = gap.min_gap

    if spec.get("fused_copy"):
        fd = os.path.join(fixtures_root, name + "_fused")
        if os.path.isdir(fd):
            shutil.rmtree(fd)
        note = write_fused_copy(d, fd)
        for c in cases:
            shutil.copy(os.path.join(d, c["logits"]), os.path.join(fd, c["logits"]))
        # Does transformers read the fused layout as the same model? It should: the module's
        # own parameters are experts.gate_up_proj / experts.down_proj.
        try:
            fm = C.load_reference_model(cls, fd)
            diff = max(float(np.max(np.abs(C.forward_logits(fm, c["tokens"]) -
                                           np.load(os.path.join(d, c["logits"])))))
                       for c in cases[:2])
            del fm
        except Exception as e:
            diff = "load failed: %s" % e
        fout = dict(out)
        fout["model"] = name + "_fused"
        fout["notes"] = notes + [note, "logits/greedy are those of %s (same weights); "
                                 "transformers re-loading this directory gives max |diff| = %s "
                                 "on len1/len10" % (name, diff)]
        C.write_json(os.path.join(fd, "cases.json"), fout)
        finv = C.tensor_inventory(fd)
        result["fused"] = {"note": note, "hf_reload_max_abs_diff": diff, "bytes": C.dir_size(fd),
                           "expert_names": sorted({re.sub(r"\.\d+\.", ".{i}.", k) for k in finv
                                                   if ".experts." in k})}
    del model
    return result


# ----------------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True, help="output root (gets tests/fixtures and models/default)")
    ap.add_argument("--only", default="", help="comma-separated model names to (re)make")
    ap.add_argument("--skip-default", action="store_true")
    args = ap.parse_args()

    t0 = time.time()
    C.log("env:", json.dumps(C.environment_report()))
    C.log("kernels:", json.dumps(C.instrument_kernels()))
    fixtures_root = os.path.join(args.root, "tests", "fixtures")
    os.makedirs(fixtures_root, exist_ok=True)

    specs = [spec_dense, spec_text, spec_moe, spec_next]
    only = set(filter(None, args.only.split(",")))
    results = {}
    for sf in specs:
        def run(sf=sf):
            spec = sf()
            if only and spec["name"] not in only:
                return {"skipped": True}
            C.log("== building", spec["name"])
            if not spec["top_k"]:
                return build_one(spec, fixtures_root)
            # MoE: a token whose k-th and (k+1)-th router probabilities nearly tie can pick a
            # different expert in any other float32 implementation; re-seed the model until
            # the smallest gap seen over every reference token is comfortable, keep the best.
            base, tried, best = spec["seed"], [], None
            for t in range(MOE_SEED_TRIES):
                spec["seed"] = base + 10000 * t
                res = build_one(spec, fixtures_root)
                tried.append((spec["seed"], res["min_router_topk_gap"]))
                if best is None or res["min_router_topk_gap"] > best[1]:
                    best = (spec["seed"], res["min_router_topk_gap"])
                if res["min_router_topk_gap"] >= MOE_MIN_GAP:
                    break
            if spec["seed"] != best[0]:
                spec["seed"] = best[0]
                res = build_one(spec, fixtures_root)
            res["seed_tries"] = tried
            return res
        key = sf.__name__.replace("spec_", "")
        C.run_guarded(key, run, results)
        C.log(json.dumps(results[key], default=str)[:3000])

    if not args.skip_default and (not only or "default_model" in only):
        import make_default_model

        C.run_guarded("default_model", lambda: make_default_model.build(args.root), results)
        C.log(json.dumps(results["default_model"], default=str)[:3000])

    scripts = sorted(f for f in os.listdir(HERE) if f.endswith((".py", ".jinja", ".sh", ".md")))
    manifest = {"versions": C.versions(),
                "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "command": "python3 tools/oracle/make_fixtures.py " + " ".join(sys.argv[1:]),
                "scripts_sha256": {f: C.sha256_file(os.path.join(HERE, f)) for f in scripts},
                "environment": C.environment_report(),
                "results": {k: {kk: vv for kk, vv in v.items() if kk != "traceback"}
                            for k, v in results.items()}}
    C.write_json(os.path.join(fixtures_root, "MANIFEST.json"), manifest)

    C.log("\n===== SUMMARY (%.0f s) =====" % (time.time() - t0))
    for k, v in results.items():
        if not v.get("ok"):
            C.log("%-16s FAILED: %s" % (k, v.get("error")))
        elif v.get("skipped"):
            C.log("%-16s skipped" % k)
        else:
            C.log("%-16s ok std=%.3f bytes=%d calls fwd=%s gen=%s margin=%.4g agree=%s drift=%.3g gap=%s" % (
                k, v.get("std", float("nan")), v.get("bytes", 0), v.get("forward_calls"),
                v.get("generate_calls"), v.get("greedy_min_margin", float("nan")),
                v.get("greedy_agree"), v.get("hf_decode_drift", float("nan")),
                v.get("min_router_topk_gap")))
    return 0 if all(v.get("ok") for v in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

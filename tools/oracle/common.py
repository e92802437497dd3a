"""Shared helpers for the oracle scripts (run on the GPU machine, CPU-only math).

Everything here is deterministic given a seed: weights come from explicit torch.Generator
streams, token sequences from numpy default_rng. The reference numbers are always computed
from a model re-loaded from the files we wrote (float32, CPU, eager attention), so the
fixtures describe exactly what is on disk (bf16 rounding and F32 A_log included).
"""

import collections
import functools
import hashlib
import importlib
import importlib.util
import json
import math
import os
import sys
import traceback

import numpy as np
import torch

# Reference runs are CPU float32; make matmuls as exact and repeatable as torch allows.
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.set_num_threads(min(16, os.cpu_count() or 1))

CALLS = collections.Counter()  # which gated-delta / conv implementation ran, by name

KERNEL_FN_NAMES = [
    "torch_chunk_gated_delta_rule",
    "torch_recurrent_gated_delta_rule",
    "chunk_gated_delta_rule",
    "fused_recurrent_gated_delta_rule",
    "causal_conv1d_fn",
    "causal_conv1d_update",
    "torch_causal_conv1d_update",
]
MODELING_MODULES = [
    "transformers.models.qwen3_5.modeling_qwen3_5",
    "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
    "transformers.models.qwen3_next.modeling_qwen3_next",
]


def log(*a):
    print(*a, flush=True)


def environment_report():
    """Say which fast paths exist; the fixtures must come from the pure-torch ones."""
    rep = {}
    for name in ["fla", "causal_conv1d", "kernels", "flash_attn"]:
        try:
            rep[name + "_installed"] = importlib.util.find_spec(name) is not None
        except Exception as e:  # a broken package counts as absent, but say so
            rep[name + "_installed"] = "error: %s" % e
    try:
        from transformers.utils import import_utils as iu

        for fn in ["is_flash_linear_attention_available", "is_causal_conv1d_available"]:
            f = getattr(iu, fn, None)
            if f is not None:
                try:
                    rep[fn] = bool(f())
                except Exception as e:
                    rep[fn] = "error: %s" % e
    except Exception as e:
        rep["import_utils"] = "error: %s" % e
    return rep


def _counting(fn, label):
    @functools.wraps(fn)
    def wrapper(*a, **k):
        CALLS[label] += 1
        return fn(*a, **k)

    wrapper.__oracle_wrapped__ = True
    return wrapper


def instrument_kernels():
    """Wrap the module-level delta-rule / conv functions with call counters.

    Must run before any model is built: Qwen3-Next binds them onto each layer in __init__,
    Qwen3.5 looks them up as module globals at call time; both then hit the counters."""
    found = {}
    for mn in MODELING_MODULES:
        try:
            m = importlib.import_module(mn)
        except Exception as e:
            found[mn] = "import error: %s" % e
            continue
        short = mn.split(".")[-1]
        names = []
        for fname in KERNEL_FN_NAMES:
            f = getattr(m, fname, None)
            if callable(f) and not getattr(f, "__oracle_wrapped__", False):
                setattr(m, fname, _counting(f, "%s.%s" % (short, fname)))
                names.append("%s (defined in %s)" % (fname, getattr(f, "__module__", "?")))
            elif f is None and hasattr(m, fname):
                names.append("%s = None" % fname)
        found[mn] = names
    return found


def gdn_layer_report(model):
    """What each GatedDeltaNet layer object will call (Qwen3-Next binds them as attributes)."""
    out = []
    for name, mod in model.named_modules():
        if type(mod).__name__.endswith("GatedDeltaNet"):
            attrs = {}
            for a in ["chunk_gated_delta_rule", "recurrent_gated_delta_rule", "causal_conv1d_fn",
                      "causal_conv1d_update"]:
                if hasattr(mod, a):
                    v = getattr(mod, a)
                    attrs[a] = None if v is None else getattr(v, "__name__", repr(v))
            out.append({"layer": name, "class": type(mod).__name__, "bound": attrs})
            break  # one is enough: all layers are built the same way
    return out


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def dir_size(path):
    total = 0
    for root, _, files in os.walk(path):
        for fn in files:
            total += os.path.getsize(os.path.join(root, fn))
    return total


def save_logits(path, arr):
    """[T, vocab] float32 little-endian, C order; np.save writes format 1.0 for these headers."""
    a = np.ascontiguousarray(np.asarray(arr, dtype="<f4"))
    assert a.ndim == 2
    np.save(path, a, allow_pickle=False)
    with open(path, "rb") as f:
        head = f.read(8)
    assert head[6:8] == b"\x01\x00", "expected .npy version 1.0, got %r" % head[6:8]


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")


def random_tokens(seed, n, vocab):
    rng = np.random.default_rng(seed)
    return [int(x) for x in rng.integers(0, vocab, size=n)]


def randomize_weights(model, seed, sigma, hidden):
    """Seeded re-initialisation, wider than HF's default so the logits are spread.

    - zero-centred RMSNorm weights (used as 1+w): N(0, 0.1), so a w-vs-(1+w) mix-up shows;
    - gated RMSNorm (plain w): 1 + N(0, 0.1);
    - A_log = log U(0.01, 16) (HF's range), dt_bias = 1 + N(0, 0.5), conv1d N(0, 0.5);
    - MoE routers N(0, 2/sqrt(H)) so that top-k choices are far from ties;
    - every other matrix (embeddings, projections, experts, lm_head, vision) N(0, sigma).
    1-D vision params (LayerNorm, biases) keep HF's init."""
    g = torch.Generator().manual_seed(seed)

    def normal(shape, std, mean=0.0):
        return torch.randn(tuple(shape), generator=g, dtype=torch.float32) * std + mean

    done = set()
    with torch.no_grad():
        for mname, mod in sorted(model.named_modules(), key=lambda x: x[0]):
            cls = type(mod).__name__
            pfx = mname + "." if mname else ""
            if cls.endswith("RMSNormGated"):
                mod.weight.copy_(normal(mod.weight.shape, 0.1, 1.0))
                done.add(pfx + "weight")
            elif cls.endswith("RMSNorm"):
                mod.weight.copy_(normal(mod.weight.shape, 0.1))
                done.add(pfx + "weight")
            elif cls.endswith("TopKRouter") or (cls == "Linear" and mname.endswith("mlp.gate")):
                mod.weight.copy_(normal(mod.weight.shape, 2.0 / math.sqrt(hidden)))
                done.add(pfx + "weight")
            if isinstance(getattr(mod, "A_log", None), torch.nn.Parameter):
                n = mod.A_log.shape[0]
                a = torch.empty(n, dtype=torch.float32).uniform_(0.01, 16.0, generator=g)
                mod.A_log.copy_(a.log())
                mod.dt_bias.copy_(normal(mod.dt_bias.shape, 0.5, 1.0))
                mod.conv1d.weight.copy_(normal(mod.conv1d.weight.shape, 0.5))
                done.update([pfx + "A_log", pfx + "dt_bias", pfx + "conv1d.weight"])
        for name, p in sorted(model.named_parameters(), key=lambda x: x[0]):
            if name in done:
                continue
            if p.dim() >= 2:
                p.copy_(normal(p.shape, sigma))
            elif "visual" not in name:
                log("note: 1-D parameter %s %s keeps its HF init" % (name, tuple(p.shape)))


def find_final_norm(model):
    mods = dict(model.named_modules())
    for n in ["model.language_model.norm", "model.norm"]:
        if n in mods:
            return n, mods[n]
    raise RuntimeError("final norm not found")


def find_rotary(model):
    mods = dict(model.named_modules())
    for n in ["model.language_model.rotary_emb", "model.rotary_emb"]:
        if n in mods:
            return mods[n]
    return None


@torch.no_grad()
def forward_logits(model, ids):
    out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
    return out.logits[0].float().cpu().numpy()


def widen_logits(model, vocab, target_std, seed):
    """Scale the final norm's (1+w) so the logits' std is about target_std.

    The final norm feeds lm_head linearly, so this scales every logit row without touching
    the rest of the network."""
    ids = random_tokens(seed, 64, vocab)
    std0 = float(np.std(forward_logits(model, ids)))
    _, norm = find_final_norm(model)
    s = target_std / max(std0, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(s * (1.0 + norm.weight.float()) - 1.0)
    std1 = float(np.std(forward_logits(model, ids)))
    return std0, std1


def to_bf16_keep_alog(model, alog_f32):
    """Cast to bf16 like a real checkpoint; optionally keep A_log in F32 (real Qwen3.5 files do)."""
    model.to(torch.bfloat16)
    n = 0
    if alog_f32:
        for mod in model.modules():
            p = getattr(mod, "A_log", None)
            if isinstance(p, torch.nn.Parameter):
                p.data = p.data.float()
                n += 1
    return n


def save_model(model, out_dir, max_shard_size=None):
    kw = {}
    if max_shard_size is not None:
        kw["max_shard_size"] = max_shard_size
    try:
        model.save_pretrained(out_dir, safe_serialization=True, **kw)
    except TypeError:  # newer versions dropped the flag: safetensors is the only format
        model.save_pretrained(out_dir, **kw)


def safetensors_files(d):
    return sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))


def safetensors_header(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n))


def tensor_inventory(d):
    """name -> (dtype, shape, file) over all shards, straight from the headers."""
    inv = {}
    for fn in safetensors_files(d):
        for k, v in safetensors_header(os.path.join(d, fn)).items():
            if k == "__metadata__":
                continue
            inv[k] = (v["dtype"], v["shape"], fn)
    return inv


def load_reference_model(cls, d):
    """float32, eager attention (and the eager per-expert loop where the version has the
    switch): the plainest math transformers offers."""
    tries = [dict(dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"),
             dict(dtype=torch.float32, attn_implementation="eager"),
             dict(torch_dtype=torch.float32, attn_implementation="eager")]
    err = None
    for kw in tries:
        try:
            m = cls.from_pretrained(d, **kw)
            break
        except (TypeError, ValueError) as e:
            err = e
    else:
        raise err
    m.eval()
    if next(m.parameters()).dtype != torch.float32:
        raise RuntimeError("reference model is not float32")
    return m


class RouterGapRecorder:
    """Smallest gap between the k-th and (k+1)-th router probability seen in the reference
    forwards: a tiny gap means an engine may legitimately pick another expert."""

    def __init__(self, model, top_k):
        self.top_k = top_k
        self.min_gap = float("inf")
        self.enabled = True
        self.handles = []
        for name, mod in model.named_modules():
            cls = type(mod).__name__
            if cls.endswith("TopKRouter") or (cls == "Linear" and name.endswith("mlp.gate")):
                self.handles.append(mod.register_forward_hook(self._hook))

    def _hook(self, mod, inp, out):
        if not self.enabled:
            return
        x = inp[0].reshape(-1, mod.weight.shape[1]).double()
        p = torch.softmax(x @ mod.weight.double().t(), dim=-1)
        s = torch.sort(p, dim=-1, descending=True).values
        gap = (s[:, self.top_k - 1] - s[:, self.top_k]).min().item()
        self.min_gap = min(self.min_gap, gap)

    def close(self):
        for h in self.handles:
            h.remove()


@torch.no_grad()
def greedy(model, prompt, n_new):
    """generate() with the cache: chunked prefill of the prompt, then recurrent decode."""
    from transformers import GenerationConfig

    model.generation_config.eos_token_id = None
    gc = GenerationConfig(do_sample=False, max_new_tokens=n_new, eos_token_id=None, pad_token_id=0,
                          use_cache=True, output_logits=True, return_dict_in_generate=True)
    ids = torch.tensor([prompt], dtype=torch.long)
    # An explicit all-ones mask: otherwise generate() infers one from pad_token_id and would
    # mask every prompt token that happens to equal it.
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gc)
    seq = out.sequences[0].tolist()
    new = seq[len(prompt):]
    if len(new) != n_new:
        raise RuntimeError("generate returned %d new tokens, wanted %d" % (len(new), n_new))
    step_logits = torch.stack([l[0].float() for l in out.logits]).numpy()  # [n_new, V]
    top2 = np.sort(step_logits, axis=-1)[:, -2:]
    min_margin = float(np.min(top2[:, 1] - top2[:, 0]))
    # The same tokens through one uncached forward: a greedy path that argmax agrees with,
    # and how far HF's own decode drifts from its own prefill.
    full = forward_logits(model, prompt + new[:-1])[len(prompt) - 1:]
    agree = bool(np.all(np.argmax(full, axis=-1) == np.array(new)))
    drift = float(np.max(np.abs(full - step_logits)))
    return new, min_margin, agree, drift


def versions():
    import platform

    v = {"python": sys.version.split()[0], "torch": torch.__version__, "numpy": np.__version__,
         "platform": platform.platform(), "cpu_threads": torch.get_num_threads()}
    for mod in ["transformers", "tokenizers", "safetensors"]:
        try:
            v[mod] = importlib.import_module(mod).__version__
        except Exception as e:
            v[mod] = "unavailable: %s" % e
    try:
        v["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
    except Exception as e:
        v["device"] = "unknown: %s" % e
    v["compute"] = "CPU float32 (reference forwards and generate run on the CPU)"
    return v


def run_guarded(name, fn, results):
    """One model's failure must not lose the others' fixtures from the same device call."""
    try:
        results[name] = fn()
        results[name]["ok"] = True
    except Exception:
        tb = traceback.format_exc()
        log("FAILED %s\n%s" % (name, tb))
        results[name] = {"ok": False, "error": tb.strip().splitlines()[-1], "traceback": tb}

#!/usr/bin/env python3
"""peer_llamacpp_gguf.py: write a random-weight Qwen3.5 GGUF (llama.cpp's `qwen35` / `qwen35moe` layout, bf16)
of the shapes `cinfer bench --like` / `cinfer synth --like` use, to measure llama.cpp's CUDA backend on the
same shapes as cinfer (issue 5). Python 3 + numpy only; our own GGUF v3 writer (no gguf-py).

    python3 bench/peer_llamacpp_gguf.py --like qwen3.5-27b --out /dev/shm/q27.gguf [--max-bytes N]

Why random weights written here: a converted bf16 GGUF of the 27B (54 GB) or the 35B-A3B (70 GB) does not
fit the GPU machine's 64 GB disk beside a checkpoint, so the GGUF is made directly, streamed tensor by tensor
(nothing is held in memory but a 32 MB pool of random bf16 values).

Values, in llama.cpp's stored form (what convert_hf_to_gguf.py writes from a trained checkpoint):
  - matrices bf16, uniform with std 0.02 (as `cinfer synth`), drawn from a fixed-seed pool: each tensor is a
    window of the pool at its own seeded offset. Throughput does not depend on the values; their scale keeps
    every activation finite.
  - RMSNorm weights (attn_norm, post_attention_norm, output_norm, attn_q_norm, attn_k_norm) f32 near 1: the
    checkpoint's zero-centred weight + 1, the +1 that the converter folds in. ssm_norm f32 near 1 (not folded).
  - ssm_a = -exp(A_log) f32 in [-16, -1]; ssm_dt.bias f32 in [-0.5, 0.5]; ssm_conv1d f32 {4, conv_dim} taps in
    [-0.3, 0.3]; the router ffn_gate_inp and ffn_gate_inp_shexp f32 (the converter keeps those in f32).
  - no MTP layers (nextn_predict_layers absent): cinfer bench does not run MTP either.
--max-bytes leaves the largest tensors (MoE experts first: they are the largest) as holes of a sparse file
(zeros, taking no space) until the written data fits; the output says which. Zero weights cost a GEMM or
GEMV exactly as much as random ones (bf16 kernels do not skip zeros), so the speed is the same; the MoE
output is zero, but the router's random logits still pick experts the usual way.

Vocab: the tokenizer we ship, models/default/tokenizer.json (byte-level BPE with Qwen3.5's pre-tokenizer
regex and Qwen3.5's 26 added tokens; 8,192 learned tokens), padded with unused placeholder tokens to the real
Qwen3.5 vocab size 248,320 (the embedding and lm_head rows, which is what costs time). The real 248k-token
Qwen3.5 tokenizer is not in the repository; llama-bench feeds token ids, so the speed does not depend on it.
"""
import argparse
import json
import os
import struct
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

# name: (arch, H, L, Hq, Hkv, Hk, Hv, I, E, k, Im, Is, tie, V). The same numbers as src/cli/synth.c's presets
# (spec/qwen35.md §1.3); head_dim 256, DeltaNet head dims 128, conv 4, every 4th layer full attention.
SHAPES = {
    "qwen3.5-0.8b": ("qwen35", 1024, 24, 8, 2, 16, 16, 3584, 0, 0, 0, 0, 1, 248320),
    "qwen3.5-2b": ("qwen35", 2048, 24, 8, 2, 16, 16, 6144, 0, 0, 0, 0, 1, 248320),
    "qwen3.5-4b": ("qwen35", 2560, 32, 16, 4, 16, 32, 9216, 0, 0, 0, 0, 1, 248320),
    "qwen3.5-9b": ("qwen35", 4096, 32, 16, 4, 16, 32, 12288, 0, 0, 0, 0, 0, 248320),
    "qwen3.5-27b": ("qwen35", 5120, 64, 24, 4, 16, 48, 17408, 0, 0, 0, 0, 0, 248320),
    "qwen3.5-35b-a3b": ("qwen35moe", 2048, 40, 16, 2, 16, 32, 0, 256, 8, 512, 512, 0, 248320),
    "qwen3.5-122b-a10b": ("qwen35moe", 3072, 48, 32, 2, 16, 64, 0, 256, 8, 1024, 1024, 0, 248320),
}
HEAD_DIM, DK, DV, CONV_K, FULL_EVERY = 256, 128, 128, 4, 4

# GGUF value types and ggml tensor types (GGUF v3).
GV_UINT32, GV_INT32, GV_FLOAT32, GV_BOOL, GV_STRING, GV_ARRAY, GV_UINT64 = 4, 5, 6, 7, 8, 9, 10
GT_F32, GT_BF16 = 0, 30
ALIGN = 32
POOL_N = 1 << 24  # 16 M bf16 values (32 MB), doubled in memory so any window up to POOL_N is contiguous
CHUNK = 1 << 24  # elements a write


def gguf_str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def gguf_kv(key, vtype, val):
    out = gguf_str(key) + struct.pack("<I", vtype)
    if vtype == GV_STRING:
        return out + gguf_str(val)
    if vtype == GV_ARRAY:
        etype, items = val
        out += struct.pack("<IQ", etype, len(items))
        if etype == GV_STRING:
            return out + b"".join(gguf_str(x) for x in items)
        fmt = {GV_INT32: "<i", GV_UINT32: "<I", GV_FLOAT32: "<f"}[etype]
        return out + b"".join(struct.pack(fmt, x) for x in items)
    fmt = {GV_UINT32: "<I", GV_INT32: "<i", GV_FLOAT32: "<f", GV_BOOL: "<?", GV_UINT64: "<Q"}[vtype]
    return out + struct.pack(fmt, val)


def load_vocab(path, n_vocab):
    """tokens, token types, merges from a HF tokenizer.json, padded to n_vocab with unused placeholders."""
    with open(path, encoding="utf-8") as f:
        tj = json.load(f)
    model = tj["model"]
    if model.get("type") != "BPE":
        raise SystemExit(f"{path}: not a BPE tokenizer")
    toks = {i: t for t, i in model["vocab"].items()}
    types = {i: 1 for i in toks}  # LLAMA_TOKEN_TYPE_NORMAL
    special = {}
    for a in tj.get("added_tokens", []):
        toks[a["id"]] = a["content"]
        types[a["id"]] = 3 if a.get("special") else 4  # CONTROL / USER_DEFINED
        special[a["content"]] = a["id"]
    n_real = max(toks) + 1
    if n_real > n_vocab:
        raise SystemExit(f"{path}: {n_real} tokens > --vocab {n_vocab}")
    tokens, ttypes = [], []
    for i in range(n_vocab):
        if i in toks:
            tokens.append(toks[i])
            ttypes.append(types[i])
        else:
            tokens.append(f"<|cinfer_unused_{i}|>")
            ttypes.append(5)  # LLAMA_TOKEN_TYPE_UNUSED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return tokens, ttypes, merges, special, n_real


def plan(args):
    """The (name, dims in ggml order ne0.., ggml type, init kind) of every tensor, in file order."""
    arch, H, L, Hq, Hkv, Hk, Hv, I, E, k, Im, Is, tie, V = SHAPES[args.like]
    L = args.layers or L
    V = args.vocab or V
    E = (args.experts or E) if E else 0  # --experts only shrinks a MoE shape
    k = min(k, E) if E else 0
    kd, vd = Hk * DK, Hv * DV
    C = 2 * kd + vd
    T = []

    def mat(name, *ne):
        T.append((name, ne, GT_BF16, "mat"))

    def f32(name, init, *ne):
        T.append((name, ne, GT_F32, init))

    mat("token_embd.weight", H, V)
    f32("output_norm.weight", "norm1", H)
    if not tie:
        mat("output.weight", H, V)
    for i in range(L):
        p = f"blk.{i}."
        f32(p + "attn_norm.weight", "norm1", H)
        f32(p + "post_attention_norm.weight", "norm1", H)
        if (i + 1) % FULL_EVERY != 0:
            mat(p + "attn_qkv.weight", H, C)
            mat(p + "attn_gate.weight", H, vd)
            f32(p + "ssm_conv1d.weight", "conv", CONV_K, C)
            f32(p + "ssm_dt.bias", "dt", Hv)
            f32(p + "ssm_a", "a", Hv)
            mat(p + "ssm_beta.weight", H, Hv)
            mat(p + "ssm_alpha.weight", H, Hv)
            f32(p + "ssm_norm.weight", "norm1", DV)
            mat(p + "ssm_out.weight", vd, H)
        else:
            mat(p + "attn_q.weight", H, Hq * HEAD_DIM * 2)  # query and output gate, per head [q | gate]
            mat(p + "attn_k.weight", H, Hkv * HEAD_DIM)
            mat(p + "attn_v.weight", H, Hkv * HEAD_DIM)
            mat(p + "attn_output.weight", Hq * HEAD_DIM, H)
            f32(p + "attn_q_norm.weight", "norm1", HEAD_DIM)
            f32(p + "attn_k_norm.weight", "norm1", HEAD_DIM)
        if E:
            f32(p + "ffn_gate_inp.weight", "mat", H, E)
            mat(p + "ffn_gate_exps.weight", H, Im, E)
            mat(p + "ffn_up_exps.weight", H, Im, E)
            mat(p + "ffn_down_exps.weight", Im, H, E)
            f32(p + "ffn_gate_inp_shexp.weight", "mat", H)
            mat(p + "ffn_gate_shexp.weight", H, Is)
            mat(p + "ffn_up_shexp.weight", H, Is)
            mat(p + "ffn_down_shexp.weight", Is, H)
        else:
            mat(p + "ffn_gate.weight", H, I)
            mat(p + "ffn_up.weight", H, I)
            mat(p + "ffn_down.weight", I, H)
    kv = {
        "context_length": (GV_UINT32, 262144),
        "embedding_length": (GV_UINT32, H),
        "block_count": (GV_UINT32, L),
        "attention.head_count": (GV_UINT32, Hq),
        "attention.head_count_kv": (GV_UINT32, Hkv),
        "attention.key_length": (GV_UINT32, HEAD_DIM),
        "attention.value_length": (GV_UINT32, HEAD_DIM),
        "attention.layer_norm_rms_epsilon": (GV_FLOAT32, 1e-6),
        "rope.dimension_count": (GV_UINT32, HEAD_DIM // 4),  # partial_rotary_factor 0.25
        "rope.freq_base": (GV_FLOAT32, 1e7),
        "rope.dimension_sections": (GV_ARRAY, (GV_INT32, [11, 11, 10, 0])),
        "ssm.conv_kernel": (GV_UINT32, CONV_K),
        "ssm.state_size": (GV_UINT32, DK),
        "ssm.group_count": (GV_UINT32, Hk),
        "ssm.time_step_rank": (GV_UINT32, Hv),
        "ssm.inner_size": (GV_UINT32, vd),
        "full_attention_interval": (GV_UINT32, FULL_EVERY),
    }
    if E:
        kv.update({
            "expert_count": (GV_UINT32, E),
            "expert_used_count": (GV_UINT32, k),
            "expert_feed_forward_length": (GV_UINT32, Im),
            "expert_shared_feed_forward_length": (GV_UINT32, Is),
        })
    else:
        kv["feed_forward_length"] = (GV_UINT32, I)
    return arch, V, T, kv


def nbytes(ne, gt):
    n = 1
    for d in ne:
        n *= d
    return n * (2 if gt == GT_BF16 else 4)


def bf16_bits(x):
    """float32 array -> bf16 bit patterns (round to nearest even)."""
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def small_values(init, n, rng):
    u = rng.uniform(-1.0, 1.0, n).astype(np.float32)
    if init == "norm1":
        return 1.0 + 0.05 * u
    if init == "a":
        return -(1.0 + 15.0 * (0.5 * u + 0.5))
    if init == "dt":
        return 0.5 * u
    if init == "conv":
        return 0.3 * u
    return 0.0346 * u  # "mat": std 0.02


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--like", required=True, choices=sorted(SHAPES))
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=0, help="fewer layers (validation)")
    ap.add_argument("--vocab", type=int, default=0, help="fewer vocab rows (validation; >= the tokenizer's)")
    ap.add_argument("--experts", type=int, default=0, help="fewer experts (validation)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--max-bytes", type=float, default=0, help="write at most this many bytes of tensor "
                    "data: the largest tensors beyond it stay holes (zeros) of a sparse file")
    ap.add_argument("--threads", type=int, default=8, help="parallel writers (pwrite releases the GIL)")
    ap.add_argument("--tokenizer", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                                         "models", "default", "tokenizer.json"))
    ap.add_argument("--plan", action="store_true", help="print the sizes and exit")
    args = ap.parse_args()
    t0 = time.time()

    arch, V, T, hp = plan(args)
    tokens, ttypes, merges, special, n_real = load_vocab(args.tokenizer, V)

    total = sum(nbytes(ne, gt) for _, ne, gt, _ in T)
    holes = set()
    if args.max_bytes and total > args.max_bytes:
        # experts first (the bulk of a MoE model, and a zero expert still runs its GEMMs), then by size
        order = sorted(range(len(T)), key=lambda i: ("_exps." not in T[i][0], -nbytes(T[i][1], T[i][2])))
        left = total
        for i in order:
            if left <= args.max_bytes:
                break
            holes.add(i)
            left -= nbytes(T[i][1], T[i][2])
    hole_bytes = sum(nbytes(T[i][1], T[i][2]) for i in holes)
    print(f"gguf {args.like} ({arch}): {len(T)} tensors, {total / 1e9:.2f} GB of tensor data, "
          f"vocab {V} ({n_real} real tokens + {V - n_real} unused placeholders)")
    if holes:
        kinds = sorted({T[i][0].split(".", 2)[-1] if T[i][0].startswith("blk.") else T[i][0] for i in holes})
        nlay = len({T[i][0].split(".")[1] for i in holes if T[i][0].startswith("blk.")})
        print(f"  HOLES: {len(holes)} tensors ({hole_bytes / 1e9:.2f} GB) left as zeros (sparse): {', '.join(kinds)}"
              f" in {nlay} layers")
    else:
        print("  no holes: every tensor has random values")
    if args.plan:
        return

    kvs = [
        gguf_kv("general.architecture", GV_STRING, arch),
        gguf_kv("general.name", GV_STRING, f"cinfer random {args.like}"),
        gguf_kv("general.alignment", GV_UINT32, ALIGN),
        gguf_kv("general.file_type", GV_UINT32, 32),  # LLAMA_FTYPE_MOSTLY_BF16
    ]
    for k, (vt, v) in hp.items():
        kvs.append(gguf_kv(f"{arch}.{k}", vt, v))
    eos = special.get("<|im_end|>", 0)
    pad = special.get("<|endoftext|>", eos)
    kvs += [
        gguf_kv("tokenizer.ggml.model", GV_STRING, "gpt2"),
        gguf_kv("tokenizer.ggml.pre", GV_STRING, "qwen35"),
        gguf_kv("tokenizer.ggml.tokens", GV_ARRAY, (GV_STRING, tokens)),
        gguf_kv("tokenizer.ggml.token_type", GV_ARRAY, (GV_INT32, ttypes)),
        gguf_kv("tokenizer.ggml.merges", GV_ARRAY, (GV_STRING, merges)),
        gguf_kv("tokenizer.ggml.eos_token_id", GV_UINT32, eos),
        gguf_kv("tokenizer.ggml.padding_token_id", GV_UINT32, pad),
        gguf_kv("tokenizer.ggml.bos_token_id", GV_UINT32, pad),
        gguf_kv("tokenizer.ggml.add_bos_token", GV_BOOL, False),
    ]

    infos, offs, off = [], [], 0
    for name, ne, gt, _ in T:
        off = (off + ALIGN - 1) // ALIGN * ALIGN
        offs.append(off)
        infos.append(gguf_str(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
                     + struct.pack("<IQ", gt, off))
        off += nbytes(ne, gt)
    head = b"GGUF" + struct.pack("<IQQ", 3, len(T), len(kvs)) + b"".join(kvs) + b"".join(infos)
    data0 = (len(head) + ALIGN - 1) // ALIGN * ALIGN
    fsize = data0 + off

    rng = np.random.default_rng(args.seed)
    pool = bf16_bits(rng.uniform(-0.0346, 0.0346, POOL_N))
    pool2 = np.concatenate([pool, pool])
    pmv = memoryview(pool2).cast("B")

    fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, fsize)  # holes stay zeros and take no space
        os.pwrite(fd, head, 0)
        jobs = []  # (file position, pool element offset, elements) or (file position, bytes)
        for i, (name, ne, gt, init) in enumerate(T):
            if i in holes:
                continue
            pos = data0 + offs[i]
            if init == "mat" and gt == GT_BF16:
                n = nbytes(ne, gt) // 2
                start = int(rng.integers(0, POOL_N))
                done = 0
                while done < n:
                    m = min(CHUNK, n - done)
                    s = (start + done) % POOL_N
                    jobs.append((pos + 2 * done, s, m))
                    done += m
            else:
                n = nbytes(ne, gt) // 4
                jobs.append((pos, small_values(init, n, rng).astype("<f4").tobytes(), None))

        def run(job):
            pos, a, m = job
            buf = a if m is None else pmv[2 * a:2 * (a + m)]
            while len(buf):
                w = os.pwrite(fd, buf, pos)
                pos += w
                buf = buf[w:]

        with ThreadPoolExecutor(max_workers=max(1, args.threads)) as ex:
            list(ex.map(run, jobs))
    finally:
        os.close(fd)
    dt = time.time() - t0
    written = total - hole_bytes
    print(f"  wrote {args.out}: {fsize / 1e9:.2f} GB file, {written / 1e9:.2f} GB written in {dt:.1f} s "
          f"({written / 1e9 / max(dt, 1e-9):.2f} GB/s), seed {args.seed}")


if __name__ == "__main__":
    sys.exit(main())

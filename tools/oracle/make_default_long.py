#!/usr/bin/env python3
"""make_default_long.py — a long oracle case for the trained default model (models/default): N ids of
tests/fixtures/default_model/heldout_sample.txt from --offset, one sequence through transformers' float32
forward (CPU, eager attention, use_cache=False, no TF32), logits kept at ROWS positions spread over it so the
file stays under 2 MB. It is what the CUDA forward's prefill paths need as an oracle: more than 64 rows reach
the tensor-core GEMMs, the chunked DeltaNet and the tiled attention (the 12-token len12 case runs on the f32
GEMV path), so precision fast is held to 1e-2 / top-1 on real text there (tests/parity/test_parity_cuda.c,
cuda_*_parity_default_long).

    python3 tools/oracle/make_default_long.py [--model models/default] [--out tests/fixtures/default_model]
                                              [--offset 2048] [--n 512] [--rows 56] [--no-f64]

Writes OUT/long_cases.json and OUT/long512.npy ([ROWS][vocab] float32, the rows at "positions"). The same
tokenization as the held-out perplexity (export_eval.py): the whole text as one string, no special tokens.
A float64 NumPy forward (np_reference.py) of the same ids then measures the reference's own error (ref_vs_f64,
max |f32 - f64| in units of the logits' std; --no-f64 skips it), written into the JSON when it finishes.
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import common as C  # noqa: E402  (float32 matmuls at full precision, no TF32)

torch.set_float32_matmul_precision("highest")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/default")
    ap.add_argument("--out", default="tests/fixtures/default_model")
    ap.add_argument("--text", default="tests/fixtures/default_model/heldout_sample.txt")
    ap.add_argument("--offset", type=int, default=2048)
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--rows", type=int, default=56)
    ap.add_argument("--no-f64", action="store_true", help="skip the float64 check")
    a = ap.parse_args()
    import transformers as T
    from tokenizers import Tokenizer

    t0 = time.time()
    tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    with open(a.text, encoding="utf-8") as f:
        ids = tok.encode(f.read(), add_special_tokens=False).ids
    if len(ids) < a.offset + a.n:
        raise SystemExit("the text has %d ids, %d needed" % (len(ids), a.offset + a.n))
    ids = [int(x) for x in ids[a.offset:a.offset + a.n]]
    # spread over the sequence, the last position always in (the deepest attention and DeltaNet state)
    pos = sorted(set(int(round(i * (a.n - 1) / (a.rows - 1))) for i in range(a.rows)))
    model = C.load_reference_model(T.Qwen3_5ForCausalLM, a.model)
    with torch.no_grad():
        lg = C.forward_logits(model, ids)  # [n][V] float32
    rows = np.ascontiguousarray(lg[pos])
    std = float(np.std(rows))
    os.makedirs(a.out, exist_ok=True)
    C.save_logits(os.path.join(a.out, "long512.npy"), rows)
    case = {"name": "heldout%d" % a.n, "tokens": ids, "positions": pos, "logits": "long512.npy", "std": std,
            "ref_vs_f64": None, "text_offset_ids": a.offset, "text": tok.decode(ids, skip_special_tokens=False)}
    doc = {"model": "default_model", "weights": "models/default", "cases": [case],
           "reference": "transformers float32 forward on the CPU, eager attention, use_cache=False, no TF32; "
                        "logits rows at 'positions' of the one sequence",
           "made_by": "tools/oracle/make_default_long.py", "versions": C.versions()}
    path = os.path.join(a.out, "long_cases.json")
    C.write_json(path, doc)  # written before the f64 check, which may not finish in time
    C.log("long512: %d ids, %d rows, std %.3f, %.1f s" % (len(ids), len(pos), std, time.time() - t0))
    if not a.no_f64:
        try:
            import np_reference as NPR

            t1 = time.time()
            lg64 = NPR.forward64(a.model, ids)
            case["ref_vs_f64"] = float(np.abs(rows.astype(np.float64) - lg64[pos]).max() / std)
            C.write_json(path, doc)
            C.log("f64 check %.1f s: f32 reference vs float64 = %.2e x std" % (time.time() - t1, case["ref_vs_f64"]))
        except Exception as e:  # the check is a diagnostic: the fixture stands without it
            C.log("f64 check skipped: %r" % (e,))


if __name__ == "__main__":
    main()

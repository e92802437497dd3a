#!/usr/bin/env python3
"""Issue 7's check outside CI: NEW images and prompts through `cinfer logits --image` against transformers.

Makes seeded images the qwen35_vision fixture does not have (odd sizes, a square that is downscaled, a 6.7:1
panorama, a JPEG, a 16x16 that is upscaled), writes chat prompts with one or two of them, and for each prompt
compares the logits of every position from transformers (float32 on the CPU, eager, on the fixture's model)
with `cinfer logits -m FIXTURE --tokens LIST --image F ... --out X.npy --device D` for each device asked:
per-position ||d|| / ||ref|| (worst), max |d| / std(ref), and argmax agreement. Prints a table and writes
OUT/vision_logits.json. Needs torch, transformers (5.x), Pillow and numpy (the oracle's environment).

    python3 tools/oracle/check_vision_logits.py --bin build/cinfer [--devices cpu,cuda] [--out DIR]
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

import common as C  # noqa: E402
import make_vision_fixtures as MVF  # noqa: E402

# name, width, height, seed, format: none of them is a fixture image
IMAGES = [("odd_97x61", 97, 61, 21, "png"),
          ("square_256", 256, 256, 22, "png"),
          ("pano_400x60", 400, 60, 23, "png"),
          ("portrait_70x130", 70, 130, 24, "jpeg"),
          ("mini_16x16", 16, 16, 25, "png")]

# parts: "I" is the next image of the case, other strings are text
CASES = [("odd", ["odd_97x61"], ["Look:", "I", "What is in it?"]),
         ("square", ["square_256"], ["I", "Describe the scene in detail."]),
         ("pano_and_jpeg", ["pano_400x60", "portrait_70x130"], ["I", "and", "I", "Which one is wider?"]),
         ("mini_then_odd", ["mini_16x16", "odd_97x61"], ["Tiny:", "I", "I", "Two pictures, compare."]),
         ("jpeg_only", ["portrait_70x130"], ["Is this a portrait?", "I"])]


def compare(got, ref):
    d = got.astype(np.float64) - ref
    rel = np.sqrt((d * d).sum(-1) / np.maximum((ref * ref).sum(-1), 1e-30))
    return {"worst_row_rel": float(rel.max()), "max_abs_over_std": float(np.abs(d).max() / ref.std()),
            "argmax_agree": int((got.argmax(-1) == ref.argmax(-1)).sum()), "positions": int(ref.shape[0]),
            "last_argmax_equal": bool(got[-1].argmax() == ref[-1].argmax())}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/cinfer")
    ap.add_argument("--model", default=os.path.join(REPO, "tests", "fixtures", "qwen35_vision"))
    ap.add_argument("--devices", default="cpu")
    ap.add_argument("--out", default="/tmp/vision-logits")
    args = ap.parse_args()
    t0 = time.time()
    from PIL import Image
    from tokenizers import Tokenizer
    import transformers as T

    os.makedirs(args.out, exist_ok=True)
    d = args.model
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), encoding="utf-8") as f:
        template = json.load(f)["chat_template"]
    image_id, video_id = tok.token_to_id("<|image_pad|>"), tok.token_to_id("<|video_pad|>")
    MVF.MM_TYPES.update(image=image_id, video=video_id)
    ip, ip_name = MVF.make_image_processor()
    model = C.load_reference_model(T.Qwen3_5ForConditionalGeneration, d)

    files, pil = {}, {}
    for name, w, h, seed, fmt in IMAGES:
        arr = MVF.make_image(w, h, seed)
        path = os.path.join(args.out, name + (".jpg" if fmt == "jpeg" else ".png"))
        Image.fromarray(arr).save(path, **({"quality": 90} if fmt == "jpeg" else {}))
        files[name] = path
        with Image.open(path) as im:  # what both sides decode: the file
            pil[name] = im.convert("RGB")

    rows = []
    for cname, names, parts in CASES:
        try:
            rows.append(run_case(args, tok, template, ip, model, files, pil, cname, names, parts))
        except Exception:
            import traceback

            C.log("%s FAILED\n%s" % (cname, traceback.format_exc()))
            rows.append({"case": cname, "error": traceback.format_exc().strip().splitlines()[-1]})
    out = {"transformers": T.__version__, "image_processor": ip_name, "model": d, "devices": args.devices,
           "cases": rows, "seconds": round(time.time() - t0, 1)}
    with open(os.path.join(args.out, "vision_logits.json"), "w") as f:
        json.dump(out, f, indent=1)
    bad = [r["case"] for r in rows if "error" in r or any("error" in r[v] for v in args.devices.split(","))]
    C.log("%d cases, %.1f s%s" % (len(rows), time.time() - t0, "; errors in %s" % bad if bad else ""))
    return 1 if bad else 0


def run_case(args, tok, template, ip, model, files, pil, cname, names, parts):
    d = args.model
    pv_list, grids = [], []
    for n in names:
        pv, grid = MVF.run_image_processor(ip, [pil[n]])
        pv_list.append(pv)
        grids.append([int(x) for x in grid[0]])
    pv = np.concatenate(pv_list, axis=0)
    content = [{"type": "image"} if p == "I" else {"type": "text", "text": p} for p in parts]
    chat = MVF.render_chat(template, [{"role": "user", "content": content}])
    collapsed = tok.encode(chat, add_special_tokens=False).ids
    ids = tok.encode(MVF.expand_pads(chat, grids), add_special_tokens=False).ids
    model.model.rope_deltas = None
    ref, _ = MVF.mm_forward(model, ids, pv, np.array(grids, dtype=np.int64))
    row = {"case": cname, "images": names, "grids": grids, "T": len(ids), "std": float(ref.std())}
    for dev in args.devices.split(","):
        outp = os.path.join(args.out, "%s.%s.npy" % (cname, dev))
        cmd = [args.bin, "logits", "--device", dev, "-m", d, "--tokens", ",".join(map(str, collapsed)),
               "--out", outp]
        for n in names:
            cmd += ["--image", files[n]]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            row[dev] = {"error": (p.stderr or p.stdout)[-400:]}
            continue
        got = np.load(outp)
        row[dev] = compare(got, ref) if got.shape == ref.shape else {"error": "shape %s vs %s" % (
            got.shape, ref.shape)}
    line = "%-14s T=%-3d grids=%-24s" % (cname, len(ids), grids)
    for dev in args.devices.split(","):
        r = row[dev]
        line += ("  %s: %s" % (dev, r["error"][:120]) if "error" in r else
                 "  %s: row ||d||/||ref|| %.2e, max|d|/std %.2e, argmax %d/%d" % (
                     dev, r["worst_row_rel"], r["max_abs_over_std"], r["argmax_agree"], r["positions"]))
    C.log(line)
    return row


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""prepare_data.py — the default model's training data, from the Python sources this machine holds.

Standard library only (it is tested on the CPU machine, which has no numpy/torch):

    python3 tools/train/prepare_data.py --out DIR [--seed 1234] [--heldout-frac 0.02] [--workers 16]

1. Every .py file under the running interpreter's stdlib and site-packages (sysconfig paths plus
   site.getsitepackages()), each real file once (by realpath), newlines normalised to \\n.
2. Filters: utf-8, 64 B .. 1 MiB, no line over 2000 characters and a mean line length <= 100 (generated
   tables and minified blobs teach nothing).
3. Dedup: exact content hash (sha256), then a whitespace-insensitive hash (every line stripped, blank
   lines dropped), first path in sorted order wins.
4. Split BY FILE: held-out when sha256("split:<seed>:<content hash>") maps below --heldout-frac, so the
   split depends only on the seed and the file's content, not on the walk order or the machine.
5. Chat part: for each function with a docstring (ast), the user asks for a function with that signature
   and the docstring's first sentence; the assistant answers with the function's source in a ```python
   fence. Functions from held-out files only ever go to the held-out chat set.

Outputs in DIR: train_code.jsonl and heldout_code.jsonl ({"path", "sha", "text"} per file, sorted by
path), train_chat.jsonl and heldout_chat.jsonl ({"user", "assistant", "path", "name"}),
heldout_prompts.jsonl (20 small held-out functions asked for as a user would), heldout_sample.txt (whole
held-out files, about --sample-bytes, the text held-out perplexity is measured on), stats.json.
"""

import argparse
import ast
import hashlib
import json
import multiprocessing
import os
import re
import site
import sys
import sysconfig
import textwrap
import time
import warnings

MAX_FILE_BYTES = 1 << 20
MIN_FILE_BYTES = 64
MAX_LINE = 2000
MAX_MEAN_LINE = 100
MAX_FUNCS_PER_FILE = 40
FUNC_MIN_LINES, FUNC_MAX_LINES, FUNC_MAX_CHARS = 3, 60, 2500
SMALL_FUNC_MAX_LINES = 15
# Text that the tokenizer would turn into added tokens; the perplexity sample avoids it.
SPECIAL_MARKS = ("<|", "|>", "<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
                 "</tool_response>")

# Prompt shapes; which one a function gets is a hash of (seed, file, name), so it is reproducible.
TEMPLATES = [
    "Write a Python function `{sig}`: {summary}",
    "Implement `{sig}` in Python. {summary}",
    "Write a Python function named `{name}` with the signature `{sig}`. Docstring: {summary}",
    "Can you write `{sig}` in Python? It should do this: {summary}",
]
# Used instead when the summary starts with an imperative verb ("Return the ...").
THAT_TEMPLATES = [
    "Write a Python function that {that}",
    "Write a Python function `{sig}` that {that}",
]


def roots():
    """Where this interpreter's Python sources live: stdlib and every site-packages directory."""
    paths = sysconfig.get_paths()
    cand = [paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")]
    try:
        cand += site.getsitepackages()
    except AttributeError:  # some virtualenvs' site module lacks it
        pass
    out = []
    for p in cand:
        if p and os.path.isdir(p):
            r = os.path.realpath(p)
            if r not in out:
                out.append(r)
    return sorted(out)


def list_files(root_list):
    """(realpath, display path) of every .py file, each real file once, in sorted order."""
    seen, out = set(), []
    for root in root_list:
        label = os.path.basename(root.rstrip("/"))
        for d, dirs, files in os.walk(root):
            dirs.sort()
            for f in sorted(files):
                if not f.endswith(".py"):
                    continue
                p = os.path.join(d, f)
                rp = os.path.realpath(p)
                if rp in seen or not os.path.isfile(rp):
                    continue
                seen.add(rp)
                out.append((rp, label + "/" + os.path.relpath(p, root)))
    out.sort(key=lambda x: x[1])
    return out


def unit_hash(*parts):
    """A float in [0, 1) from sha256 of the parts: the seeded, order-free coin used for splits."""
    h = hashlib.sha256(":".join(str(p) for p in parts).encode("utf-8")).digest()
    return int.from_bytes(h[:8], "big") / float(1 << 64)


def read_source(path):
    """The file's text with \\n newlines, or (None, reason) when it is filtered out."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return None, "unreadable"
    if size < MIN_FILE_BYTES:
        return None, "small"
    if size > MAX_FILE_BYTES:
        return None, "large"
    try:
        with open(path, "rb") as f:
            raw = f.read()
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None, "not_utf8"
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if "\x00" in text:
        return None, "binary"
    lines = text.split("\n")
    if max(len(ln) for ln in lines) > MAX_LINE or len(text) / max(1, len(lines)) > MAX_MEAN_LINE:
        return None, "long_lines"
    return text, None


def ws_hash(text):
    """Hash that ignores indentation changes, trailing spaces and blank lines."""
    norm = "\n".join(ln.strip() for ln in text.split("\n") if ln.strip())
    return hashlib.sha256(norm.encode("utf-8")).hexdigest()


IMPERATIVE = re.compile(r"^([A-Z][a-z]+)\b(.*)$")
# Imperative verbs a docstring summary may start with ("Return the ..."): only these become
# "Write a Python function that returns the ...", so nouns ("Key for ...") never turn into verbs.
VERBS = set("""accept add append apply attach bind build calculate call cancel check choose clean clear close
collect combine compare compile compress compute concatenate connect construct convert copy count create decode
decompress delete deserialize detach determine disable disconnect display do download draw dump emit enable encode
ensure escape estimate evaluate execute expand export extract fetch fill filter find fix flatten flush format
generate get guess handle hash import increment infer initialize insert install invoke iterate join list load
locate lookup make map mark match merge move normalize open pad parse pick plot pop prepare print process push put
quote raise read receive recompute refresh register reload remove rename render replace reset resize resolve
restore retrieve return reverse rotate round run sample save scale scan search select send serialize set show
shuffle sign skip sort split start stop store strip substitute sum swap test toggle transform translate truncate
try unescape unpack unquote unregister unwrap update upload validate verify wait walk wrap write yield""".split())


def third_person(verb):
    v = verb.lower()
    if v in ("do", "go"):
        return v + "es"
    if re.search(r"(s|sh|ch|x|z)$", v):
        return v + "es"
    if re.search(r"[^aeiou]y$", v):
        return v[:-1] + "ies"
    return v + "s"


def summary_of(doc):
    """First sentence of the docstring's first paragraph, one line, or None if it is not usable."""
    if not doc:
        return None
    para = doc.strip().split("\n\n")[0]
    s = " ".join(para.split())
    m = re.match(r"(.+?[.!?])(\s|$)", s)
    if m:
        s = m.group(1)
    if not (12 <= len(s) <= 200) or not re.search(r"[A-Za-z]{3}", s) or len(s.split()) < 3:
        return None
    if s.startswith((":", ">>>", "..", "#", "{", "[", "(", "-", "*", "=", "`")):
        return None
    return s


def that_clause(summary):
    """'Return the sum of x.' -> 'returns the sum of x.' when the summary starts with a known verb."""
    m = IMPERATIVE.match(summary)
    if not m or m.group(1).lower() not in VERBS or m.group(1).lower() in ("yield", "yields"):
        return None
    return third_person(m.group(1)) + m.group(2)


def signature(node):
    args = ast.unparse(node.args)
    ret = " -> " + ast.unparse(node.returns) if node.returns is not None else ""
    prefix = "async def " if isinstance(node, ast.AsyncFunctionDef) else ""
    return "%s%s(%s)%s" % (prefix, node.name, args, ret)


def functions(text, path, seed):
    """Chat samples from the functions with docstrings in one file's source."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # invalid escape sequences in old code, etc.
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
            return []
    lines = text.split("\n")
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if node.name.startswith("test") or node.end_lineno is None:
            continue
        try:
            doc = ast.get_docstring(node)
        except Exception:
            continue
        summary = summary_of(doc)
        if summary is None:
            continue
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        src_lines = lines[first - 1:node.end_lineno]
        if not (FUNC_MIN_LINES <= len(src_lines) <= FUNC_MAX_LINES):
            continue
        src = textwrap.dedent("\n".join(src_lines)).strip("\n")
        if len(src) > FUNC_MAX_CHARS or not src.lstrip().startswith(("def ", "async def ", "@")):
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                ast.parse(src)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                continue
        try:
            sig = signature(node)
        except Exception:
            continue
        if len(sig) > 160:
            continue
        pick = unit_hash("prompt", seed, path, node.name, node.lineno)
        that = that_clause(summary)
        if that is not None and pick < 0.5:
            user = THAT_TEMPLATES[int(pick * 2 * len(THAT_TEMPLATES))].format(sig=sig, name=node.name, that=that)
        else:
            user = TEMPLATES[int(pick * len(TEMPLATES))].format(sig=sig, name=node.name, summary=summary)
        out.append({"user": user, "assistant": "```python\n" + src + "\n```", "path": path,
                    "name": node.name, "lines": len(src_lines)})
        if len(out) >= MAX_FUNCS_PER_FILE:
            break
    return out


def work(item):
    """Worker: read, filter and mine one file. Returns a small dict (text included when kept)."""
    real, disp, seed, want_chat = item
    text, why = read_source(real)
    if text is None:
        return {"path": disp, "skip": why}
    sha = hashlib.sha256(text.encode("utf-8")).hexdigest()
    res = {"path": disp, "text": text, "sha": sha, "ws": ws_hash(text)}
    if want_chat:
        res["chat"] = functions(text, disp, seed)
    return res


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def build(out_dir, seed=1234, heldout_frac=0.02, workers=None, sample_bytes=150_000, n_prompts=20,
          root_list=None, max_files=None, log=print):
    t0 = time.time()
    os.makedirs(out_dir, exist_ok=True)
    root_list = root_list or roots()
    files = list_files(root_list)
    if max_files:
        files = files[:max_files]
    log("prepare_data: %d .py files under %s" % (len(files), root_list))
    items = [(real, disp, seed, True) for real, disp in files]
    workers = workers or min(16, os.cpu_count() or 1)
    if workers > 1:
        with multiprocessing.Pool(workers) as pool:
            results = list(pool.imap(work, items, chunksize=32))
    else:
        results = [work(it) for it in items]
    skipped = {}
    seen_sha, seen_ws = set(), set()
    train, held = [], []
    dup_exact = dup_ws = 0
    for r in results:  # in sorted path order: the first copy of a file wins
        if "skip" in r:
            skipped[r["skip"]] = skipped.get(r["skip"], 0) + 1
            continue
        if r["sha"] in seen_sha:
            dup_exact += 1
            continue
        if r["ws"] in seen_ws:
            dup_ws += 1
            continue
        seen_sha.add(r["sha"])
        seen_ws.add(r["ws"])
        (held if unit_hash("split", seed, r["sha"]) < heldout_frac else train).append(r)

    # Chat samples: dedup on the answer text (the same helper is copied between packages).
    seen_ans = set()

    def chats(rows):
        out = []
        for r in rows:
            for c in r.get("chat", []):
                k = hashlib.sha256(c["assistant"].encode("utf-8")).hexdigest()
                if k in seen_ans:
                    continue
                seen_ans.add(k)
                out.append(c)
        return out

    held_chat = chats(held)  # held-out first: a function in both splits counts as held-out
    train_chat = chats(train)

    write_jsonl(os.path.join(out_dir, "train_code.jsonl"),
                ({"path": r["path"], "sha": r["sha"], "text": r["text"]} for r in train))
    write_jsonl(os.path.join(out_dir, "heldout_code.jsonl"),
                ({"path": r["path"], "sha": r["sha"], "text": r["text"]} for r in held))
    write_jsonl(os.path.join(out_dir, "train_chat.jsonl"), train_chat)
    write_jsonl(os.path.join(out_dir, "heldout_chat.jsonl"), held_chat)

    # 20 held-out prompts for small functions, as a user would ask: the message only.
    small = [c for c in held_chat if c["lines"] <= SMALL_FUNC_MAX_LINES]
    small.sort(key=lambda c: unit_hash("eval", seed, c["path"], c["name"]))
    prompts = [{"messages": [{"role": "user", "content": c["user"]}], "path": c["path"], "name": c["name"],
                "reference": c["assistant"]} for c in small[:n_prompts]]
    write_jsonl(os.path.join(out_dir, "heldout_prompts.jsonl"), prompts)

    # The perplexity sample: whole held-out files of 1-24 KB in split-hash order up to sample_bytes.
    order = sorted(held, key=lambda r: unit_hash("sample", seed, r["sha"]))
    parts, total, used = [], 0, []
    for r in order:
        n = len(r["text"].encode("utf-8"))
        if not (1000 <= n <= 24000) or total + n > sample_bytes * 1.2:
            continue
        if any(m in r["text"] for m in SPECIAL_MARKS):  # would tokenize as added tokens
            continue
        parts.append(r["text"] if r["text"].endswith("\n") else r["text"] + "\n")
        used.append(r["path"])
        total += n
        if total >= sample_bytes:
            break
    sample = "\n".join(parts)
    with open(os.path.join(out_dir, "heldout_sample.txt"), "w", encoding="utf-8", newline="\n") as f:
        f.write(sample)

    nbytes = lambda rows: sum(len(r["text"].encode("utf-8")) for r in rows)  # noqa: E731
    stats = {
        "roots": root_list, "python": sys.version.split()[0], "seed": seed, "heldout_frac": heldout_frac,
        "files_seen": len(files), "skipped": skipped, "duplicates_exact": dup_exact,
        "duplicates_whitespace": dup_ws, "train_files": len(train), "heldout_files": len(held),
        "train_bytes": nbytes(train), "heldout_bytes": nbytes(held),
        "train_chat": len(train_chat), "heldout_chat": len(held_chat),
        "train_chat_bytes": sum(len(c["user"]) + len(c["assistant"]) for c in train_chat),
        "heldout_prompts": len(prompts), "sample_bytes": len(sample.encode("utf-8")),
        "sample_files": used, "seconds": round(time.time() - t0, 1),
    }
    with open(os.path.join(out_dir, "stats.json"), "w") as f:
        json.dump(stats, f, indent=1)
        f.write("\n")
    return stats


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--heldout-frac", type=float, default=0.02)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--sample-bytes", type=int, default=150_000)
    ap.add_argument("--max-files", type=int, default=0, help="only the first N files (smoke tests)")
    ap.add_argument("--root", action="append", help="walk these instead of the interpreter's own paths")
    a = ap.parse_args()
    st = build(a.out, a.seed, a.heldout_frac, a.workers or None, a.sample_bytes, root_list=a.root,
               max_files=a.max_files or None)
    show = {k: v for k, v in st.items() if k != "sample_files"}
    print(json.dumps(show, indent=1))
    if st["train_files"] == 0 or st["heldout_files"] == 0 or st["train_chat"] == 0:
        print("prepare_data: empty split", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

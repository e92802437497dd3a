#!/usr/bin/env python3
"""serve_chat_eval.py — ask a running `cinfer serve` for small Python functions, as a new user would, and
count the answers whose Python parses. Standard library only.

    build/cinfer serve &                                   # the README's first command (models/default)
    python3 tools/train/serve_chat_eval.py [--url http://127.0.0.1:8080] [--set heldout|simple|both]
                                           [--greedy] [--max-tokens 512] [--out results.jsonl]
                                           [--extra JSON]

Sets: "heldout" = tests/fixtures/default_model/heldout_prompts.jsonl (20 functions from held-out files, asked
the way the chat training data asks); "simple" = 20 everyday requests written here ("Write a Python function
that ..."). Each answer's code is the first ```python fence of message.content (else the whole content); it
counts when python's ast.parse accepts it. Sampling is the server's default (the model's
generation_config.json) unless --greedy (temperature 0).
"""

import argparse
import ast
import json
import os
import re
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SIMPLE = [
    "Write a Python function that adds two numbers.",
    "Write a Python function that reverses a string.",
    "Write a Python function that returns the maximum of a list of numbers.",
    "Write a Python function that checks whether a number is prime.",
    "Write a Python function that counts the vowels in a string.",
    "Write a Python function that computes the factorial of n.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Write a Python function that removes duplicates from a list while keeping the order.",
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a Python function that merges two dictionaries.",
    "Write a Python function that flattens a list of lists.",
    "Write a Python function that reads a text file and returns its lines.",
    "Write a Python function that converts Celsius to Fahrenheit.",
    "Write a Python function that returns the sum of the squares of a list.",
    "Write a Python function that splits a list into chunks of size n.",
    "Write a Python function that counts how often each word occurs in a text.",
    "Write a Python function that returns the greatest common divisor of two integers.",
    "Write a Python function that joins a list of strings with commas.",
    "Write a Python function that returns the average of a list of numbers.",
    "Write a Python function that sorts a list of dictionaries by a key.",
]


def extract_code(content):
    content = content or ""
    if "</think>" in content:  # a server without the reasoning parser would leave it in
        content = content.split("</think>", 1)[1]
    m = re.search(r"```(?:python|py)?[ \t]*\n(.*?)(```|$)", content, re.S)
    return (m.group(1) if m else content).strip()


def parses(code):
    if not code.strip():
        return False
    try:
        ast.parse(code)
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False


def ask(url, messages, max_tokens, greedy, timeout, extra=None):
    body = {"messages": messages, "max_tokens": max_tokens}
    body.update(extra or {})
    if greedy:
        body["temperature"] = 0
    req = urllib.request.Request(url.rstrip("/") + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    t0 = time.time()
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out = json.loads(r.read())
    msg = out["choices"][0]["message"]
    return msg, out["choices"][0].get("finish_reason"), out.get("usage", {}), time.time() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--set", default="both", choices=["heldout", "simple", "both"])
    ap.add_argument("--greedy", action="store_true")
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--out", default="")
    ap.add_argument("--extra", default="{}", help="JSON merged into every request, e.g. '{\"repetition_penalty\": 1.1}'")
    a = ap.parse_args()
    sets = []
    if a.set in ("heldout", "both"):
        with open(os.path.join(ROOT, "tests/fixtures/default_model/heldout_prompts.jsonl"), encoding="utf-8") as f:
            sets.append(("heldout", [json.loads(line)["messages"] for line in f]))
    if a.set in ("simple", "both"):
        sets.append(("simple", [[{"role": "user", "content": p}] for p in SIMPLE]))
    rows, summary = [], {}
    for name, prompts in sets:
        ok = 0
        for msgs in prompts:
            msg, finish, usage, dt = ask(a.url, msgs, a.max_tokens, a.greedy, a.timeout, json.loads(a.extra))
            code = extract_code(msg.get("content"))
            good = parses(code)
            ok += good
            rows.append({"set": name, "prompt": msgs[-1]["content"], "content": msg.get("content"),
                         "reasoning_content": msg.get("reasoning_content"), "finish_reason": finish,
                         "completion_tokens": usage.get("completion_tokens"), "seconds": round(dt, 2),
                         "parses": good})
            print("%-7s %s  %s" % (name, "PARSES" if good else "fails ", msgs[-1]["content"][:90]), flush=True)
        summary[name] = {"asked": len(prompts), "parses": ok}
    print(json.dumps({"greedy": a.greedy, "max_tokens": a.max_tokens, "extra": json.loads(a.extra), "results": summary}))
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

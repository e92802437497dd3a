#!/usr/bin/env python3
"""Image requests to `cinfer serve --device cuda` against `--device cpu`, on a GPU machine (plain HTTP).

On the vision fixture (tests/fixtures/qwen35_vision): OpenAI image_url requests with one and with two images
and an Anthropic base64 image request, greedy, 8 tokens each. The CUDA server encodes images with its GPU
tower at admission. Checks: every request 200; prompt token counts equal (image token counts); the greedy
text against the CPU server's (bf16 may flip a near-tie: the first divergence is printed, a majority must
agree); 8 image requests at once each give their solo answer on the CUDA server.
Exits 1 when a check fails.

usage: python3 tests/gpu/vision_serve.py BIN [MODEL_DIR] [DEVICE]   (DEVICE cpu: try the script without a GPU)
"""
import base64
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

BIN = sys.argv[1]
MODEL = sys.argv[2] if len(sys.argv) > 2 else "tests/fixtures/qwen35_vision"
DEV = sys.argv[3] if len(sys.argv) > 3 else "cuda"
FAILS = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        FAILS.append(what)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def start(device):
    port = free_port()
    logp = "/tmp/vision-serve-%s-%d.log" % (device, port)
    p = subprocess.Popen([BIN, "serve", "-m", MODEL, "--device", device, "--port", str(port), "--ctx-size", "512",
                          "--max-seqs", "8"], stdout=open(logp, "w"), stderr=subprocess.STDOUT)
    url = "http://127.0.0.1:%d" % port
    for _ in range(600):
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return p, url
        except Exception:
            pass
        if p.poll() is not None:
            break
        time.sleep(0.1)
    print(open(logp).read()[-3000:])
    raise SystemExit("server %s did not come up" % device)


def post(url, path, body, timeout=120):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "anthropic-version": "2023-06-01"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def b64(name):
    return base64.b64encode(open(os.path.join(MODEL, "images", name), "rb").read()).decode()


def oai(images, text):
    parts = [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64(n)}} for n in images]
    return {"model": "default", "messages": [{"role": "user", "content": parts + [{"type": "text", "text": text}]}],
            "max_tokens": 8, "temperature": 0}


REQS = [("oai one image", "/v1/chat/completions", oai(["wide_150x90.png"], "Describe this picture.")),
        ("oai two images", "/v1/chat/completions", oai(["tall_50x170.png", "big_300x200.png"], "Compare them.")),
        ("oai small image", "/v1/chat/completions", oai(["small_40x36.png"], "What is this?")),
        ("anthropic image", "/v1/messages",
         {"model": "default", "max_tokens": 8, "temperature": 0,
          "messages": [{"role": "user", "content": [
              {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64("tiny_20x30.png")}},
              {"type": "text", "text": "Hmm?"}]}]})]


def answer(path, r):
    if path == "/v1/messages":
        return "".join(b.get("text", "") for b in r.get("content", [])), r.get("usage", {}).get("input_tokens")
    return r["choices"][0]["message"]["content"], r["usage"]["prompt_tokens"]


servers = []
try:
    ref_p, ref = start("cpu")
    servers.append(ref_p)
    dev_p, dev = start(DEV)
    servers.append(dev_p)
    same = 0
    solo = {}
    for name, path, body in REQS:
        t0 = time.time()
        s1, r1 = post(dev, path, body)
        dt = time.time() - t0
        s0, r0 = post(ref, path, body)
        check(s1 == 200 and s0 == 200, "%s: status %s (%s), cpu %s" % (name, s1, DEV, s0))
        if s1 != 200 or s0 != 200:
            print("   ", r1, r0)
            continue
        a1, n1 = answer(path, r1)
        a0, n0 = answer(path, r0)
        solo[name] = a1
        check(n1 == n0, "%s: prompt tokens %s (%s) vs %s (cpu)" % (name, n1, DEV, n0))
        same += a1 == a0
        print("     %-16s %.2f s  %s: %r  cpu: %r" % (name, dt, DEV, a1, a0))
    check(same * 2 > len(REQS), "greedy answers equal to the cpu server's: %d/%d" % (same, len(REQS)))
    # 8 at once (two of each), each its solo answer
    out = [None] * 8

    def go(i):
        name, path, body = REQS[i % len(REQS)]
        s, r = post(dev, path, body)
        out[i] = (name, s, answer(path, r)[0] if s == 200 else r)

    th = [threading.Thread(target=go, args=(i,)) for i in range(8)]
    t0 = time.time()
    for t in th:
        t.start()
    for t in th:
        t.join()
    ok = all(s == 200 and a == solo.get(n) for n, s, a in out)
    check(ok, "8 image requests at once on %s: each its solo answer (%.2f s)" % (DEV, time.time() - t0))
    if not ok:
        print("   ", out)
finally:
    for p in servers:
        p.terminate()
        p.wait()
print("%d checks failed" % len(FAILS))
sys.exit(1 if FAILS else 0)

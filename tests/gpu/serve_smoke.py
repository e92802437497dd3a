#!/usr/bin/env python3
"""`cinfer serve --device cuda` against `cinfer serve --device cpu` on the same model, on a GPU machine.

No npm there, so plain HTTP (urllib). Starts both servers, then checks and prints:
  1. greedy chat completions (8 prompts): the CUDA server's text against the CPU server's (the GPU's bf16
     GEMMs may flip a near-tie; the first divergence is printed, and a majority must agree);
  2. a stream: chunks, one finish_reason, [DONE], and the streamed text == the non-streamed text;
  3. 32 requests at once: all 200, each greedy output == its solo output on the same server;
  4. a client that disconnects mid-stream: the server goes on answering;
  5. bad JSON → 400 in OpenAI's error shape; /metrics answers;
  6. throughput: 32 concurrent requests of 128 tokens, output tokens/s on each device.
Exits 1 when a check fails (each failure printed), 0 otherwise.

usage: python3 tests/gpu/serve_smoke.py BIN MODEL_DIR [DEVICE]   (DEVICE: cuda, or cpu to try the script)
"""
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

BIN, MODEL = sys.argv[1], sys.argv[2]
DEV = sys.argv[3] if len(sys.argv) > 3 else "cuda"  # cpu: try the script itself on a machine without a GPU
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


def start(device, extra=()):
    port = free_port()
    log = open("/tmp/serve-%s-%d.log" % (device, port), "w")
    p = subprocess.Popen([BIN, "serve", "-m", MODEL, "--device", device, "--port", str(port), "--ctx-size", "1024",
                          "--max-seqs", "32", *extra], stdout=log, stderr=subprocess.STDOUT)
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
    print(open("/tmp/serve-%s-%d.log" % (device, port)).read()[-3000:])
    raise SystemExit("server %s did not come up" % device)


def post(url, path, body, timeout=300):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


PROMPTS = ["Write a Python function that returns the sum of a list of numbers.",
           "Write a function `is_prime(n)` in Python.",
           "How do I reverse a string in Python?",
           "Write a Python function that reads a JSON file and returns the parsed object.",
           "Write a class Stack with push and pop.",
           "Write a function that flattens a nested list.",
           "Write a Python function to count the words in a text.",
           "Write a function that merges two sorted lists."]


def chat(url, prompt, n=64, stream=False, seed=None):
    b = {"model": "default", "messages": [{"role": "user", "content": prompt}], "max_tokens": n, "temperature": 0}
    if stream:
        b["stream"] = True
    return b


def text_of(url, prompt, n=64):
    st, j = post(url, "/v1/chat/completions", chat(url, prompt, n))
    if st != 200:
        return None, j
    return j["choices"][0]["message"].get("content") or "", j


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b)) if len(a) != len(b) else -1


def main():
    gpu, gurl = start(DEV)
    cpu, curl = start("cpu")
    try:
        # 1. greedy, GPU vs CPU
        agree = 0
        solo = {}
        for p in PROMPTS:
            g, gj = text_of(gurl, p)
            c, _ = text_of(curl, p)
            check(g is not None, "cuda 200 for %r (%s)" % (p[:40], "" if g is not None else gj))
            solo[p] = g
            d = first_diff(g or "", c or "")
            agree += d < 0
            print("     %-60r cuda==cpu: %s%s" % (p[:60], d < 0, "" if d < 0 else " (first difference at char %d)" % d))
        check(agree * 2 > len(PROMPTS), "greedy cuda == cpu on a majority of prompts (%d/%d)" % (agree, len(PROMPTS)))

        # 2. stream
        req = urllib.request.Request(gurl + "/v1/chat/completions", data=json.dumps(chat(gurl, PROMPTS[0], stream=True)).encode(),
                                     headers={"Content-Type": "application/json"})
        chunks, finish, done, parts = 0, [], False, []
        with urllib.request.urlopen(req, timeout=300) as r:
            for line in r:
                line = line.decode().strip()
                if not line.startswith("data:"):
                    continue
                d = line[5:].strip()
                if d == "[DONE]":
                    done = True
                    continue
                j = json.loads(d)
                chunks += 1
                for ch in j.get("choices", []):
                    parts.append(ch.get("delta", {}).get("content") or "")
                    if ch.get("finish_reason"):
                        finish.append(ch["finish_reason"])
        check(done and len(finish) == 1 and chunks > 2, "stream: %d chunks, finish %s, [DONE] %s" % (chunks, finish, done))
        check("".join(parts) == solo[PROMPTS[0]], "streamed text == non-streamed text")

        # 3. 32 at once, each == its solo run
        res = [None] * 32

        def one(i):
            res[i] = text_of(gurl, PROMPTS[i % len(PROMPTS)])[0]
        th = [threading.Thread(target=one, args=(i,)) for i in range(32)]
        [t.start() for t in th]
        [t.join() for t in th]
        same = sum(res[i] == solo[PROMPTS[i % len(PROMPTS)]] for i in range(32))
        check(all(r is not None for r in res), "32 concurrent: all answered")
        print("     32 concurrent: %d/32 identical to the solo run (GEMV vs tensor-core rows may flip near-ties)" % same)
        check(same >= 24, "32 concurrent: most identical to solo (%d/32)" % same)

        # 4. disconnect mid-stream, then the server still answers
        req = urllib.request.Request(gurl + "/v1/chat/completions", data=json.dumps(chat(gurl, PROMPTS[1], n=400, stream=True)).encode(),
                                     headers={"Content-Type": "application/json"})
        r = urllib.request.urlopen(req, timeout=60)
        r.readline(), r.readline(), r.readline()
        r.close()
        time.sleep(0.5)
        g, _ = text_of(gurl, PROMPTS[2])
        check(g == solo[PROMPTS[2]], "after a disconnect mid-stream the server answers the same")

        # 5. errors and metrics
        st, j = post(gurl, "/v1/chat/completions", b"{not json")
        check(st == 400 and "error" in j and "message" in j["error"], "bad JSON -> 400 %s" % json.dumps(j)[:120])
        with urllib.request.urlopen(gurl + "/metrics", timeout=10) as r:
            m = r.read().decode()
        check("cinfer" in m, "/metrics answers (%d bytes)" % len(m))

        # 6. throughput: 32 x 128 tokens on each device
        for name, url in (("cuda", gurl), ("cpu", curl)):
            toks = [0] * 32

            def tp(i):
                st, j = post(url, "/v1/chat/completions", {"model": "default", "max_tokens": 128, "temperature": 0.8, "seed": i,
                                                           "messages": [{"role": "user", "content": PROMPTS[i % 8]}]})
                if st == 200:
                    toks[i] = j["usage"]["completion_tokens"]
            t0 = time.time()
            th = [threading.Thread(target=tp, args=(i,)) for i in range(32)]
            [t.start() for t in th]
            [t.join() for t in th]
            dt = time.time() - t0
            print("     throughput %s: 32 requests, %d output tokens in %.2f s = %.0f tok/s" % (name, sum(toks), dt, sum(toks) / dt))
    finally:
        for p in (gpu, cpu):
            p.terminate()
        for p in (gpu, cpu):
            try:
                p.wait(10)
            except Exception:
                p.kill()
    print("serve_smoke: %d failures" % len(FAILS))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())

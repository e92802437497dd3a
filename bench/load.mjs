#!/usr/bin/env node
// load.mjs — a load generator for `cinfer serve`: C concurrent streaming /v1/completions clients (closed
// loop: each sends its next request when the last one ends), timing every token as its SSE chunk arrives.
// Reports per concurrency level: aggregate output tokens/s, TTFT and inter-token latency p50/p99, and the
// single-stream decode rate. node:http + a small SSE reader rather than the `openai` SDK or fetch: fewer
// layers between the socket and the clock, nothing buffered, and little client CPU per chunk (the client
// shares the server's CPUs: ~40 us of client CPU per token against ~80 us with fetch's web streams).
//
// Synthetic checkpoints have random weights and a 4160-token tokenizer against a 248k vocabulary, so most
// tokens the model picks decode to no text and would produce no chunk to time. --bias (default on) asks
// the server once (/tokenize with pieces) for N ids whose text is plain ASCII and sends them as logit_bias
// +100 with temperature 0: every step then picks one of them, every token becomes exactly one chunk, and
// the forward pass is unchanged (the sampler adds N biases to the row before its argmax). The report
// counts chunks against the server's usage.completion_tokens and says when they differ.
//
// usage: node bench/load.mjs --url http://127.0.0.1:8080 [--concurrency 1,8,32,64] [--requests-per-stream 1]
//        [--prompt-tokens 128] [--max-tokens 64:128] [--bias 256|0] [--seed 1] [--json out.json]
//        [--warmup 1] [--timeout-s 1800]
import os from 'node:os';
import fs from 'node:fs';
import http from 'node:http';

function parseArgs(argv) {
  const o = {
    url: 'http://127.0.0.1:8080', concurrency: '1,8,32,64', requestsPerStream: 1, promptTokens: 128,
    maxTokens: '64:128', bias: 256, seed: 1, json: null, warmup: 1, timeoutS: 1800, vocab: 0, model: null,
  };
  const names = {
    '--url': 'url', '--concurrency': 'concurrency', '--requests-per-stream': 'requestsPerStream',
    '--prompt-tokens': 'promptTokens', '--max-tokens': 'maxTokens', '--bias': 'bias', '--seed': 'seed',
    '--json': 'json', '--warmup': 'warmup', '--timeout-s': 'timeoutS', '--vocab': 'vocab', '--model': 'model',
  };
  for (let i = 2; i < argv.length; i++) {
    const k = names[argv[i]];
    if (argv[i] === '-h' || argv[i] === '--help') {
      console.log(fs.readFileSync(new URL(import.meta.url), 'utf8').split('\n').filter((l) => l.startsWith('//')).join('\n'));
      process.exit(0);
    }
    if (!k || i + 1 >= argv.length) throw new Error(`unknown or incomplete option ${argv[i]}`);
    o[k] = argv[++i];
  }
  for (const k of ['requestsPerStream', 'promptTokens', 'bias', 'seed', 'warmup', 'timeoutS', 'vocab']) {
    o[k] = Number(o[k]);
    if (!Number.isInteger(o[k]) || o[k] < 0) throw new Error(`--${k}: not a non-negative integer`);
  }
  o.levels = String(o.concurrency).split(',').map(Number);
  if (o.levels.some((c) => !Number.isInteger(c) || c < 1)) throw new Error('--concurrency: a list of positive integers');
  const [lo, hi] = String(o.maxTokens).split(':').map(Number);
  o.maxLo = lo;
  o.maxHi = hi ?? lo;
  if (!(o.maxLo >= 1 && o.maxHi >= o.maxLo)) throw new Error('--max-tokens: N or LO:HI');
  o.url = o.url.replace(/\/+$/, '');
  return o;
}

// xorshift64*: deterministic prompts and lengths for a given --seed, so runs are repeatable.
function rng(seed) {
  let x = BigInt(seed) * 0x9e3779b97f4a7c15n + 1n;
  const M = (1n << 64n) - 1n;
  return () => {
    x ^= x >> 12n; x ^= (x << 25n) & M; x ^= x >> 27n;
    return Number(((x * 0x2545f4914f6cdd1dn) & M) >> 11n) / 2 ** 53;
  };
}

// Nearest-rank percentile of an unsorted array (NaN when empty).
export function pct(a, p) {
  if (!a.length) return NaN;
  const s = Float64Array.from(a).sort();
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
}

async function getJson(url, body) {
  const r = await fetch(url, body ? { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) } : {});
  const t = await r.text();
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}: ${t.slice(0, 300)}`);
  return JSON.parse(t);
}

// Ids whose own text is 1..8 printable ASCII bytes: decoded alone, each is a complete chunk of text.
async function safeTokens(url, n) {
  const text = 'the quick brown fox jumps over the lazy dog while a server streams tokens to many clients at once ' +
    'and every one of them measures when each piece of text arrives so that latency can be counted exactly ' +
    'from the first byte to the last one in the stream 0 1 2 3 4 5 6 7 8 9 A B C D E F G H I J K L M N O P Q R S T U V W X Y Z ' +
    'a b c d e f g h i j k l m n o p q r s t u v w x y z , . ; : ! ? ( ) [ ] { } < > = + - * / % & | ^ ~ # @ $';
  const r = await getJson(url + '/tokenize', { content: text, with_pieces: true });
  const ids = new Set();
  for (const t of r.tokens) {
    if (typeof t.piece === 'string' && /^[\x20-\x7e]{1,8}$/.test(t.piece)) ids.add(t.id);
    if (ids.size >= n) break;
  }
  return [...ids];
}

// One streaming completion. Returns {ok, t0, ttft, arrivals[], tokens (usage), chunks, err}.
const agent = new http.Agent({ keepAlive: true, maxSockets: Infinity });
function oneRequest(o, prompt, maxTokens, bias, deadline) {
  const body = {
    model: o.model ?? 'bench', prompt, max_tokens: maxTokens, temperature: 0, ignore_eos: true, stream: true,
    stream_options: { include_usage: true },
  };
  if (bias) body.logit_bias = bias;
  const payload = Buffer.from(JSON.stringify(body));
  const rec = { ok: false, t0: performance.now(), arrivals: [], chunks: 0, tokens: -1, prompt_tokens: -1, max_tokens: maxTokens, err: null };
  const u = new URL(o.url + '/v1/completions');
  return new Promise((resolve) => {
    let done = false, settled = false, buf = '';
    const finish = (err) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      if (!err && !done) err = 'stream ended without [DONE]';
      rec.err = err ?? null;
      rec.ok = !err;
      rec.t1 = performance.now();
      rec.ttft = rec.arrivals.length ? rec.arrivals[0] - rec.t0 : NaN;
      resolve(rec);
    };
    const req = http.request({
      host: u.hostname, port: u.port, path: u.pathname, method: 'POST', agent,
      headers: { 'content-type': 'application/json', 'content-length': payload.length },
    }, (res) => {
      res.setEncoding('utf8');
      if (res.statusCode !== 200) {
        let t = '';
        res.on('data', (d) => { t += d; });
        res.on('end', () => finish(`HTTP ${res.statusCode}: ${t.slice(0, 200)}`));
        return;
      }
      res.on('data', (part) => {
        const now = performance.now();
        buf += part;
        let k;
        while ((k = buf.indexOf('\n\n')) >= 0) {
          const ev = buf.slice(0, k);
          buf = buf.slice(k + 2);
          for (const line of ev.split('\n')) {
            if (!line.startsWith('data: ')) continue;
            const d = line.slice(6);
            if (d === '[DONE]') { done = true; continue; }
            let j;
            try { j = JSON.parse(d); } catch (e) { req.destroy(); return finish(`bad JSON chunk: ${d.slice(0, 100)}`); }
            if (j.error) { req.destroy(); return finish(`stream error: ${j.error.message}`); }
            const c = j.choices?.[0];
            if (c && typeof c.text === 'string' && c.text.length) {
              rec.chunks++;
              rec.arrivals.push(now);
            }
            if (j.usage) {
              rec.tokens = j.usage.completion_tokens;
              rec.prompt_tokens = j.usage.prompt_tokens;
            }
          }
        }
      });
      res.on('end', () => finish(null));
      res.on('error', (e) => finish(String(e.message ?? e)));
    });
    const timer = setTimeout(() => { req.destroy(); finish('timed out'); }, Math.max(1, deadline - Date.now()));
    req.on('error', (e) => finish(String(e.message ?? e)));
    req.end(payload);
  });
}

async function runLevel(o, C, bias, rand, vocab) {
  const deadline = Date.now() + o.timeoutS * 1000;
  const recs = [];
  const mkPrompt = () => Array.from({ length: o.promptTokens }, () => Math.floor(rand() * vocab));
  const mkMax = () => o.maxLo + Math.floor(rand() * (o.maxHi - o.maxLo + 1));
  // Prompts and lengths are drawn up front so the sequence does not depend on completion order.
  const plan = Array.from({ length: C }, () => Array.from({ length: o.requestsPerStream }, () => [mkPrompt(), mkMax()]));
  const load0 = os.loadavg();
  const tStart = performance.now();
  await Promise.all(plan.map(async (reqs, w) => {
    for (const [p, m] of reqs) {
      const r = await oneRequest(o, p, m, bias, deadline);
      r.worker = w;
      recs.push(r);
    }
  }));
  const tEnd = performance.now();
  return { C, recs, tStart, tEnd, load0, load1: os.loadavg() };
}

function summarize(L) {
  const ok = L.recs.filter((r) => r.ok);
  const ttft = ok.map((r) => r.ttft);
  const itl = [];
  const perStream = [];
  let tokens = 0, chunks = 0, mismatch = 0;
  for (const r of ok) {
    tokens += r.tokens;
    chunks += r.chunks;
    if (r.tokens !== r.chunks) mismatch++;
    for (let i = 1; i < r.arrivals.length; i++) itl.push(r.arrivals[i] - r.arrivals[i - 1]);
    const n = r.arrivals.length;
    if (n > 1) perStream.push((n - 1) / ((r.arrivals[n - 1] - r.arrivals[0]) / 1e3));
  }
  const wall = (L.tEnd - L.tStart) / 1e3;
  // Steady window: every stream has its first token and none has ended yet (one request per stream);
  // the tokens that arrive inside it over its length.
  let steady = NaN, steadyS = 0;
  if (ok.length === L.recs.length && ok.length > 1) {
    const a = Math.max(...ok.map((r) => r.arrivals[0] ?? Infinity));
    const b = Math.min(...ok.map((r) => r.arrivals[r.arrivals.length - 1] ?? -Infinity));
    if (b > a) {
      let n = 0;
      for (const r of ok) for (const t of r.arrivals) if (t > a && t <= b) n++;
      steadyS = (b - a) / 1e3;
      steady = n / steadyS;
    }
  }
  return {
    concurrency: L.C, requests: L.recs.length, ok: ok.length, errors: L.recs.filter((r) => !r.ok).map((r) => r.err).slice(0, 3),
    output_tokens: tokens, chunks, chunk_token_mismatch: mismatch, wall_s: wall,
    aggregate_tok_s: tokens / wall, steady_tok_s: steady, steady_window_s: steadyS,
    ttft_ms: { p50: pct(ttft, 50), p99: pct(ttft, 99), max: Math.max(...ttft) },
    itl_ms: { p50: pct(itl, 50), p99: pct(itl, 99), max: itl.length ? Math.max(...itl) : NaN, n: itl.length },
    stream_decode_tok_s: { p50: pct(perStream, 50), min: Math.min(...perStream) },
    loadavg_start: L.load0.map((x) => +x.toFixed(2)), loadavg_end: L.load1.map((x) => +x.toFixed(2)),
  };
}

const f = (x, d = 1) => (Number.isFinite(x) ? x.toFixed(d) : 'n/a');

async function main() {
  const o = parseArgs(process.argv);
  const health = await fetch(o.url + '/health');
  if (!health.ok) throw new Error(`${o.url}/health: HTTP ${health.status}`);
  const models = await getJson(o.url + '/v1/models');
  const vocab = o.vocab || models.data?.[0]?.meta?.n_vocab;
  if (!vocab) throw new Error('/v1/models has no meta.n_vocab; pass --vocab');
  o.model ??= models.data[0].id;
  let bias = null;
  if (o.bias > 0) {
    const ids = await safeTokens(o.url, o.bias);
    if (!ids.length) throw new Error('no ASCII tokens found for --bias');
    bias = Object.fromEntries(ids.map((id) => [String(id), 100]));
    console.error(`load: logit_bias +100 on ${ids.length} ASCII token ids`);
  }
  const rand = rng(o.seed);
  if (o.warmup) {
    const w = await oneRequest(o, Array.from({ length: 8 }, () => Math.floor(rand() * vocab)), 4, bias, Date.now() + 600e3);
    if (!w.ok) throw new Error(`warm-up request failed: ${w.err}`);
  }
  console.log(`# ${new Date().toISOString()} ${o.url} model ${o.model} vocab ${vocab}; prompt ${o.promptTokens} tokens, ` +
    `max_tokens ${o.maxLo}${o.maxHi !== o.maxLo ? ':' + o.maxHi : ''}, ${o.requestsPerStream} request(s) per stream, ` +
    `${bias ? Object.keys(bias).length + ' biased ids' : 'no bias'}; ${os.cpus().length} CPUs`);
  console.log('conc  reqs  ok   out_tok  wall_s  agg_tok/s  steady_tok/s  ttft_p50_ms  ttft_p99_ms  itl_p50_ms  itl_p99_ms  stream_tok/s_p50  chunks!=tokens  load_start->end');
  const all = [];
  for (const C of o.levels) {
    const L = await runLevel(o, C, bias, rand, vocab);
    const s = summarize(L);
    all.push({ summary: s, requests: L.recs.map((r) => ({ worker: r.worker, ok: r.ok, err: r.err, t0: r.t0 - L.tStart, t1: r.t1 - L.tStart, tokens: r.tokens, prompt_tokens: r.prompt_tokens, arrivals: r.arrivals.map((t) => +(t - L.tStart).toFixed(3)) })) });
    console.log(`${String(C).padStart(4)}  ${String(s.requests).padStart(4)}  ${String(s.ok).padStart(3)}  ${String(s.output_tokens).padStart(7)}  ` +
      `${f(s.wall_s).padStart(6)}  ${f(s.aggregate_tok_s, 2).padStart(9)}  ${f(s.steady_tok_s, 2).padStart(12)}  ` +
      `${f(s.ttft_ms.p50).padStart(11)}  ${f(s.ttft_ms.p99).padStart(11)}  ${f(s.itl_ms.p50).padStart(10)}  ${f(s.itl_ms.p99).padStart(10)}  ` +
      `${f(s.stream_decode_tok_s.p50, 2).padStart(16)}  ${String(s.chunk_token_mismatch).padStart(14)}  ` +
      `${s.loadavg_start[0]}->${s.loadavg_end[0]}`);
    if (s.errors.length) console.log(`      errors: ${s.errors.join(' | ')}`);
  }
  if (o.json) fs.writeFileSync(o.json, JSON.stringify({ args: o, levels: all }, null, 1));
  const bad = all.some((l) => l.summary.ok !== l.summary.requests);
  process.exit(bad ? 1 : 0);
}

main().catch((e) => {
  console.error(`load: ${e.message ?? e}`);
  process.exit(2);
});

// run.mjs — end-to-end tests of `cinfer serve` with the official OpenAI and Anthropic SDKs (installed by
// scripts/install-deps.sh into third_party/npm/e2e). Starts servers on random loopback ports, runs every
// test, prints "N passed, N failed" and exits non-zero on any failure.
//
//   node tests/e2e/run.mjs --bin build/cinfer [--model models/default] [--mock] [filter]
//
// --mock: the binary is cinfer-mock-serve (the HTTP layer over a fake engine; no model files), which
// also makes the "503 while loading" test possible. Without it the real engine serves --model.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const req = createRequire(path.join(root, 'third_party/npm/e2e/x.js'));
let OpenAI, Anthropic;
try {
  OpenAI = req('openai').default;
  Anthropic = req('@anthropic-ai/sdk').default;
} catch (e) {
  console.error('e2e: the SDKs are missing: run scripts/install-deps.sh (' + e.message + ')');
  console.log('0 passed, 1 failed');
  process.exit(1);
}

const args = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = args.indexOf(name);
  if (i < 0) return dflt;
  const v = args[i + 1];
  args.splice(i, 2);
  return v;
};
const flag = (name) => { const i = args.indexOf(name); if (i >= 0) args.splice(i, 1); return i >= 0; };
const MOCK = flag('--mock');
// --no-verb: the binary is a server itself (cli_serve as main), not `cinfer` taking the serve verb
const NO_VERB = flag('--no-verb') || MOCK;
const BIN = path.resolve(root, opt('--bin', MOCK ? 'build/cinfer-mock-serve' : 'build/cinfer'));
const MODEL = path.resolve(root, opt('--model', 'models/default'));
// a model with a vision tower, tokenizer and chat template for the image tests (the oracle's fixture)
const VISION_MODEL = path.resolve(root, opt('--vision-model', 'tests/fixtures/qwen35_vision'));
const FILTER = args[0] || '';
const KEY = 'e2e-secret-key';
// Answers go to `content` (the tests compare it); a request can still turn thinking on, which the
// thinking test does. This also exercises --chat-template-args.
const NOTHINK = ['--chat-template-args', '{"enable_thinking":false}'];

// ---- servers ----
const servers = [];
async function startServer(extra = [], env = {}, model = MODEL) {
  const argv = (NO_VERB ? [] : ['serve']).concat(['--model', model, '--port', '0', '--threads', '2'], extra);
  const p = spawn(BIN, argv, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env } });
  let out = '', errText = '';
  p.stderr.on('data', (d) => { errText += d; if (errText.length > 1e6) errText = errText.slice(-5e5); });
  const url = await new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error('server did not print its URL in 30 s: ' + errText)), 30000);
    p.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on (http:\/\/[^\s]+)/);
      if (m) { clearTimeout(t); resolve(m[1]); }
    });
    p.on('exit', (code) => { clearTimeout(t); reject(new Error(`server exited (${code}): ${errText}`)); });
  });
  const s = { p, url, stderr: () => errText, exited: null };
  p.on('exit', (code, sig) => { s.exited = { code, sig }; });
  servers.push(s);
  return s;
}
async function waitReady(s, key) {
  for (let i = 0; i < 600; i++) {
    try {
      const r = await fetch(s.url + '/health');
      if (r.status === 200) return;
    } catch {}
    await sleep(50);
  }
  throw new Error('server not ready after 30 s: ' + s.stderr());
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function stopAll() {
  for (const s of servers) {
    if (s.exited) continue;
    s.p.kill('SIGTERM');
    const t0 = Date.now();
    while (!s.exited && Date.now() - t0 < 10000) await sleep(20);
    if (!s.exited) s.p.kill('SIGKILL');
  }
}

// ---- tiny harness ----
const tests = [];
const test = (name, fn) => tests.push({ name, fn });
class Fail extends Error {}
// a test that cannot run here (its fixture is not made yet): reported, not counted as a failure
class Skip extends Error {}
const assert = (c, msg) => { if (!c) throw new Fail(msg || 'assertion failed'); };
const eq = (a, b, msg) => {
  const ja = JSON.stringify(a), jb = JSON.stringify(b);
  if (ja !== jb) throw new Fail(`${msg || 'not equal'}: ${ja?.slice(0, 300)} != ${jb?.slice(0, 300)}`);
};
async function expectStatus(promise, status, check) {
  try {
    await promise;
  } catch (e) {
    assert(e.status === status, `expected HTTP ${status}, got ${e.status}: ${e.message}`);
    if (check) check(e);
    return e;
  }
  throw new Fail(`expected HTTP ${status}, the call succeeded`);
}
async function metrics(s, key) {
  const r = await fetch(s.url + '/metrics', { headers: key ? { Authorization: 'Bearer ' + key } : {} });
  const text = await r.text();
  const m = {};
  for (const line of text.split('\n')) {
    const mm = line.match(/^([a-z_:]+(?:\{[^}]*\})?) ([-0-9.e+]+)$/);
    if (mm) m[mm[1]] = Number(mm[2]);
  }
  return m;
}
const post = (s, p, body, headers = {}) =>
  fetch(s.url + p, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: typeof body === 'string' ? body : JSON.stringify(body) });

// ---- the servers under test ----
let main, auth, small, tiny, vision = null;
const oai = (s, key = 'none') => new OpenAI({ apiKey: key, baseURL: s.url + '/v1', maxRetries: 0, timeout: 120000 });
const ant = (s, key = 'none') => new Anthropic({ apiKey: key, baseURL: s.url, maxRetries: 0, timeout: 120000 });
const user = (text) => [{ role: 'user', content: text }];
const greedy = { temperature: 0 };

async function chatText(client, text, extra = {}) {
  const r = await client.chat.completions.create({ model: 'default', messages: user(text), max_tokens: 16, ...greedy, ...extra });
  return r;
}
async function streamChat(client, body, opts = {}) {
  const stream = await client.chat.completions.create({ ...body, stream: true }, opts);
  let text = '', finish = null, usage = null, chunks = 0, reasoning = '';
  for await (const ch of stream) {
    chunks++;
    if (ch.usage) usage = ch.usage;
    for (const c of ch.choices) {
      if (c.delta?.content) text += c.delta.content;
      if (c.delta?.reasoning_content) reasoning += c.delta.reasoning_content;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { text, finish, usage, chunks, reasoning };
}

// ---- tests: basics ----
test('health and models', async () => {
  const h = await fetch(main.url + '/health');
  eq(h.status, 200);
  eq((await h.json()).status, 'ok');
  const models = await oai(main).models.list();
  assert(models.data.length === 1 && models.data[0].id === 'default', JSON.stringify(models.data));
});

test('chat: non-streaming answer with usage', async () => {
  const r = await chatText(oai(main), 'Say something.', { max_tokens: 12 });
  eq(r.object, 'chat.completion');
  eq(r.choices.length, 1);
  assert(typeof r.choices[0].message.content === 'string', 'content is a string');
  assert(['stop', 'length'].includes(r.choices[0].finish_reason), r.choices[0].finish_reason);
  assert(r.usage.prompt_tokens > 0, 'prompt tokens counted');
  assert(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 12, 'completion tokens ' + r.usage.completion_tokens);
  eq(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert(r.usage.prompt_tokens_details && typeof r.usage.prompt_tokens_details.cached_tokens === 'number', 'cached_tokens');
});

test('chat: streaming equals non-streaming (greedy), include_usage', async () => {
  const body = { model: 'default', messages: user('Tell me about rivers.'), max_tokens: 20, ...greedy };
  const whole = await oai(main).chat.completions.create(body);
  const s = await streamChat(oai(main), { ...body, stream_options: { include_usage: true } });
  eq(s.text, whole.choices[0].message.content, 'streamed text');
  eq(s.finish, whole.choices[0].finish_reason, 'finish reason');
  assert(s.usage, 'usage chunk present');
  eq(s.usage.completion_tokens, whole.usage.completion_tokens, 'completion tokens');
  eq(s.usage.prompt_tokens, whole.usage.prompt_tokens, 'prompt tokens');
  const s2 = await streamChat(oai(main), body);
  assert(!s2.usage, 'no usage chunk unless asked');
});

test('completions: text and token-array prompts, streaming and not', async () => {
  const c = oai(main);
  const r = await c.completions.create({ model: 'default', prompt: 'Once upon a time', max_tokens: 10, ...greedy });
  eq(r.object, 'text_completion');
  assert(r.usage.completion_tokens >= 1, 'generated');
  const tok = await (await post(main, '/tokenize', { content: 'Once upon a time', add_special: true })).json();
  assert(Array.isArray(tok.tokens) && tok.tokens.length > 0, 'tokenize');
  eq(r.usage.prompt_tokens, tok.tokens.length, 'prompt tokens = /tokenize count');
  const r2 = await c.completions.create({ model: 'default', prompt: tok.tokens, max_tokens: 10, ...greedy });
  eq(r2.choices[0].text, r.choices[0].text, 'token-array prompt gives the same text');
  const stream = await c.completions.create({ model: 'default', prompt: 'Once upon a time', max_tokens: 10, ...greedy, stream: true });
  let text = '';
  for await (const ch of stream) text += ch.choices[0]?.text || '';
  eq(text, r.choices[0].text, 'streamed completion');
});

test('stop strings end the output before the match', async () => {
  const c = oai(main);
  const base = await chatText(c, 'Write a long line.', { max_tokens: 24 });
  const full = base.choices[0].message.content;
  // a stop string from the middle of the greedy output: the answer must end right before it
  let k = -1, stop = '';
  for (let i = 2; i + 2 <= full.length && k < 0; i++) {
    const cand = full.slice(i, i + 2);
    if (cand.trim().length === 2 && full.indexOf(cand) === i) { k = i; stop = cand; }
  }
  if (k < 0) throw new Fail('greedy output too short to pick a stop string: ' + JSON.stringify(full));
  const r = await chatText(c, 'Write a long line.', { max_tokens: 24, stop: [stop] });
  eq(r.choices[0].message.content, full.slice(0, k), `output with stop ${JSON.stringify(stop)}`);
  eq(r.choices[0].finish_reason, 'stop');
  const s = await streamChat(c, { model: 'default', messages: user('Write a long line.'), max_tokens: 24, ...greedy, stop });
  eq(s.text, full.slice(0, k), 'streamed output with stop');
});

test('logprobs with top_logprobs', async () => {
  const r = await chatText(oai(main), 'Numbers:', { max_tokens: 6, logprobs: true, top_logprobs: 3 });
  const lp = r.choices[0].logprobs?.content;
  assert(Array.isArray(lp), 'logprobs.content');
  eq(lp.length, r.usage.completion_tokens, 'one entry per generated token');
  for (const e of lp) {
    assert(typeof e.token === 'string' && e.logprob <= 0 && Array.isArray(e.bytes), JSON.stringify(e));
    eq(e.top_logprobs.length, 3, 'top_logprobs count');
    // greedy: the chosen token is the most likely one
    assert(e.top_logprobs[0].logprob >= e.logprob - 1e-4, 'greedy picks the top token');
  }
  // the tokens spell the content (unless a special token, skipped in the text, was sampled)
  const joined = Buffer.concat(lp.map((e) => Buffer.from(e.bytes))).toString('utf8');
  if (!lp.some((e) => /^<[^<>]+>$/.test(e.token))) eq(joined, r.choices[0].message.content, 'token bytes spell the content');
  const c = await oai(main).completions.create({ model: 'default', prompt: 'Numbers:', max_tokens: 4, logprobs: 2, ...greedy });
  eq(c.choices[0].logprobs.tokens.length, c.usage.completion_tokens);
  eq(c.choices[0].logprobs.text_offset[0], 0);
});

test('seed reproducibility and n choices', async () => {
  const c = oai(main);
  const body = { model: 'default', messages: user('Random words:'), max_tokens: 12, temperature: 1.0, seed: 1234 };
  const a = await c.chat.completions.create(body), b = await c.chat.completions.create(body);
  eq(a.choices[0].message.content, b.choices[0].message.content, 'same seed, same text');
  const outs = new Set([a.choices[0].message.content]);
  for (const seed of [1, 2, 3, 4]) outs.add((await c.chat.completions.create({ ...body, seed })).choices[0].message.content);
  assert(outs.size > 1, 'different seeds give different samples');
  const n = await c.chat.completions.create({ ...body, n: 3 });
  eq(n.choices.length, 3);
  eq(n.choices.map((x) => x.index), [0, 1, 2]);
  // choice i uses seed + i: choice 0 equals the single request with the same seed
  eq(n.choices[0].message.content, a.choices[0].message.content, 'choice 0 uses the seed');
  const single1 = await c.chat.completions.create({ ...body, seed: 1235 });
  eq(n.choices[1].message.content, single1.choices[0].message.content, 'choice 1 uses seed + 1');
  eq(n.usage.prompt_tokens, a.usage.prompt_tokens, 'prompt counted once for n choices');
});

test('max_tokens past the context is clamped with finish_reason length', async () => {
  const r = await oai(tiny).chat.completions.create({ model: 'default', messages: user('go'), max_tokens: 100000, ...greedy, ignore_eos: true });
  assert(r.usage.prompt_tokens + r.usage.completion_tokens <= 64, 'fits the context');
  eq(r.choices[0].finish_reason, 'length');
  eq(r.usage.prompt_tokens + r.usage.completion_tokens, 64, 'ran to the end of the context');
});

test('tools reach the prompt', async () => {
  const tools = [{ type: 'function', function: { name: 'get_weather_xyz', description: 'weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];
  const t = await (await post(main, '/apply-template', { messages: user('Weather in Paris?'), tools })).json();
  assert(t.prompt.includes('get_weather_xyz'), 'tool name in the rendered prompt');
  const t0 = await (await post(main, '/apply-template', { messages: user('Weather in Paris?') })).json();
  assert(!t0.prompt.includes('get_weather_xyz'), 'no tool without tools');
  const c = oai(main);
  const withTools = await c.chat.completions.create({ model: 'default', messages: user('Weather in Paris?'), tools, max_tokens: 4, ...greedy });
  const without = await c.chat.completions.create({ model: 'default', messages: user('Weather in Paris?'), max_tokens: 4, ...greedy });
  assert(withTools.usage.prompt_tokens > without.usage.prompt_tokens, 'tools make the prompt longer');
  const tok = await (await post(main, '/tokenize', { content: t.prompt })).json();
  eq(withTools.usage.prompt_tokens, tok.tokens.length, 'prompt tokens = tokens of the rendered template');
  // an assistant turn with tool_calls (arguments as a JSON string) and a tool result render
  const conv = [
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather_xyz', arguments: '{"city":"Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: 'sunny-and-warm' },
  ];
  const t2 = await (await post(main, '/apply-template', { messages: conv, tools })).json();
  assert(t2.prompt && t2.prompt.includes('sunny-and-warm') && t2.prompt.includes('Paris'), 'tool call and result rendered: ' + JSON.stringify(t2).slice(0, 300));
  await c.chat.completions.create({ model: 'default', messages: conv, tools, max_tokens: 4, ...greedy });
});

test('thinking switch via chat_template_kwargs', async () => {
  const on = await (await post(main, '/apply-template', { messages: user('hi'), chat_template_kwargs: { enable_thinking: true } })).json();
  const off = await (await post(main, '/apply-template', { messages: user('hi'), chat_template_kwargs: { enable_thinking: false } })).json();
  assert(on.prompt !== off.prompt, 'enable_thinking changes the prompt');
  if (on.prompt.trimEnd().endsWith('<think>')) {
    // the model starts inside its reasoning: the first text is reasoning_content
    const s = await streamChat(oai(main), { model: 'default', messages: user('hi'), max_tokens: 8, ...greedy, chat_template_kwargs: { enable_thinking: true } });
    assert(s.reasoning.length > 0 || s.text.length === 0, 'reasoning_content streamed');
    const r = await oai(main).chat.completions.create({ model: 'default', messages: user('hi'), max_tokens: 8, ...greedy, chat_template_kwargs: { enable_thinking: true } });
    eq(r.choices[0].message.reasoning_content || '', s.reasoning, 'reasoning_content');
  }
});

test('tokenize / detokenize round trip', async () => {
  const t = await (await post(main, '/tokenize', { content: 'Hello world', with_pieces: true })).json();
  assert(t.tokens.length > 0 && typeof t.tokens[0].id === 'number', 'pieces');
  const ids = t.tokens.map((x) => x.id);
  const d = await (await post(main, '/detokenize', { tokens: ids })).json();
  eq(d.content, 'Hello world');
  eq((await post(main, '/detokenize', { tokens: [-1] })).status, 400);
});

test('server defaults: --temp, --max-tokens; --log-format json and text', async () => {
  const c = oai(tiny);
  const a = await c.chat.completions.create({ model: 'default', messages: user('defaults') });
  eq(a.usage.completion_tokens <= 5, true, '--max-tokens caps a request that names none');
  const b = await c.chat.completions.create({ model: 'default', messages: user('defaults'), temperature: 0, max_tokens: 5 });
  eq(a.choices[0].message.content, b.choices[0].message.content, '--temp 0: greedy by default');
  await sleep(50);
  const lines = tiny.stderr().split('\n').filter((l) => l.startsWith('{'));
  const entry = lines.map((l) => JSON.parse(l)).find((o) => o.path === '/v1/chat/completions');
  assert(entry && entry.method === 'POST' && entry.status === 200 && entry.ms >= 0, 'JSON access log: ' + lines.slice(-2));
  await post(auth, '/v1/chat/completions', { messages: user('x') });
  await sleep(50);
  assert(/cinfer serve: POST \/v1\/chat\/completions 401 /.test(auth.stderr()), 'text access log: ' + auth.stderr().slice(-200));
});

// ---- tests: errors ----
test('errors: 400 invalid JSON and bad fields name the field', async () => {
  const r = await post(main, '/v1/chat/completions', '{"messages": [');
  eq(r.status, 400);
  const j = await r.json();
  assert(j.error && j.error.type === 'invalid_request_error' && /invalid JSON/.test(j.error.message), JSON.stringify(j));
  await expectStatus(oai(main).chat.completions.create({ model: 'default', messages: user('x'), temperature: 'hot' }), 400, (e) => {
    eq(e.error?.param ?? e.param, 'temperature');
  });
  await expectStatus(oai(main).chat.completions.create({ model: 'default', messages: [] }), 400, (e) => eq(e.param, 'messages'));
  await expectStatus(oai(main).chat.completions.create({ model: 'default', messages: user('x'), response_format: { type: 'xml' } }), 400,
    (e) => eq(e.param, 'response_format'));
  await expectStatus(oai(main).chat.completions.create({ model: 'default', messages: user('x'), tool_choice: 'required' }), 400,
    (e) => eq(e.param, 'tool_choice'));
  const deep = '{"messages":' + '['.repeat(100) + ']'.repeat(100) + '}';
  eq((await post(main, '/v1/chat/completions', deep)).status, 400, 'deep JSON');
  await expectStatus(ant(main).messages.create({ model: 'x', max_tokens: 0, messages: user('x') }), 400, (e) => {
    eq(e.error?.type, 'error');
    eq(e.error?.error?.type, 'invalid_request_error');
  });
});

test('errors: prompt longer than the context is 400 with the counts', async () => {
  const long = 'word '.repeat(100);
  await expectStatus(oai(tiny).chat.completions.create({ model: 'default', messages: user(long), max_tokens: 4 }), 400, (e) => {
    assert(/64/.test(e.message) && /tokens/.test(e.message), e.message);
  });
  await expectStatus(oai(tiny).completions.create({ model: 'default', prompt: long, max_tokens: 4 }), 400);
  await expectStatus(ant(tiny).messages.create({ model: 'default', messages: user(long), max_tokens: 4 }), 400, (e) => {
    eq(e.error?.error?.type, 'invalid_request_error');
  });
});

test('errors: 404, 405, 413', async () => {
  const r = await fetch(main.url + '/v1/nothing');
  eq(r.status, 404);
  assert((await r.json()).error, 'OpenAI error shape');
  const r2 = await fetch(main.url + '/v1/chat/completions');
  eq(r2.status, 405);
  assert(/POST/.test(r2.headers.get('allow') || ''), 'Allow header');
  const r3 = await post(main, '/v1/models', '{}');
  eq(r3.status, 405);
  const big = JSON.stringify({ messages: user('x'.repeat(70 * 1024)) });
  const r4 = await post(small, '/v1/chat/completions', big);
  eq(r4.status, 413);
  const r5 = await post(small, '/v1/messages', big);
  eq(r5.status, 413);
  eq((await r5.json()).error.type, 'request_too_large', 'Anthropic shape on /v1/messages');
});

test('errors: 401 without or with a wrong key; right key works', async () => {
  await expectStatus(oai(auth, 'wrong').chat.completions.create({ model: 'default', messages: user('x'), max_tokens: 2 }), 401);
  await expectStatus(ant(auth, 'wrong').messages.create({ model: 'default', messages: user('x'), max_tokens: 2 }), 401, (e) => {
    eq(e.error?.error?.type, 'authentication_error');
  });
  eq((await post(auth, '/v1/chat/completions', { messages: user('x') })).status, 401);
  eq((await fetch(auth.url + '/metrics')).status, 401);
  eq((await fetch(auth.url + '/health')).status, 200, '/health stays public');
  const r = await oai(auth, KEY).chat.completions.create({ model: 'default', messages: user('x'), max_tokens: 2 });
  assert(r.choices.length === 1, 'Bearer key accepted');
  const a = await ant(auth, KEY).messages.create({ model: 'default', messages: user('x'), max_tokens: 2 });
  eq(a.type, 'message', 'x-api-key accepted');
});

test('CORS: allowed origin gets headers, preflight answers', async () => {
  const r = await fetch(main.url + '/v1/models', { headers: { Origin: 'http://allowed.example' } });
  eq(r.headers.get('access-control-allow-origin'), 'http://allowed.example');
  const r2 = await fetch(main.url + '/v1/models', { headers: { Origin: 'http://evil.example' } });
  eq(r2.headers.get('access-control-allow-origin'), null);
  const p = await fetch(main.url + '/v1/chat/completions', { method: 'OPTIONS', headers: { Origin: 'http://allowed.example', 'Access-Control-Request-Method': 'POST' } });
  eq(p.status, 204);
  assert(/POST/.test(p.headers.get('access-control-allow-methods') || ''), 'allow-methods');
});

// A raw connection to s: resolves with what the server sent when it closes, or 'open' after ms.
function rawConnection(s, send, ms) {
  const u = new URL(s.url);
  return new Promise((resolve) => {
    const sock = net.connect(Number(u.port), u.hostname);
    let got = '';
    const t = setTimeout(() => { sock.destroy(); resolve({ closed: false, got }); }, ms);
    sock.on('connect', () => { if (send) sock.write(send); });
    sock.on('data', (d) => { got += d; });
    sock.on('close', () => { clearTimeout(t); resolve({ closed: true, got }); });
    sock.on('error', () => {});
  });
}

test('idle and slow clients are timed out; oversized headers refused', async () => {
  const t0 = Date.now();
  const idle = await rawConnection(small, null, 8000);
  assert(idle.closed, 'idle connection closed');
  assert(Date.now() - t0 < 6000, 'closed within the 2 s timeout (+slack): ' + (Date.now() - t0));
  // a request that stops halfway through its headers
  const slow = await rawConnection(small, 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-', 8000);
  assert(slow.closed, 'slow client closed');
  const big = await rawConnection(main, 'GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ' + 'a'.repeat(100 * 1024) + '\r\n\r\n', 8000);
  assert(/^HTTP\/1\.1 4(31|13)/.test(big.got) || (big.closed && !/200 OK/.test(big.got)), 'oversized header refused: ' + big.got.slice(0, 80));
  eq((await fetch(main.url + '/health')).status, 200, 'server still answers');
});

// ---- tests: Anthropic ----
test('anthropic: message, count_tokens, stop_sequences', async () => {
  const a = ant(main);
  const m = await a.messages.create({ model: 'default', max_tokens: 10, system: 'You are terse.', messages: user('Hello there'), temperature: 0 });
  eq(m.type, 'message');
  eq(m.role, 'assistant');
  assert(m.content.length >= 1 && m.content.some((b) => b.type === 'text'), JSON.stringify(m.content));
  assert(['end_turn', 'max_tokens', 'stop_sequence'].includes(m.stop_reason), m.stop_reason);
  const ct = await a.messages.countTokens({ model: 'default', system: 'You are terse.', messages: user('Hello there') });
  eq(ct.input_tokens, m.usage.input_tokens + (m.usage.cache_read_input_tokens || 0), 'count_tokens = usage input');
  const text = m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  if (text.length >= 4) {
    const stop = text.slice(2, 4);
    if (text.indexOf(stop) === 2) {
      const m2 = await a.messages.create({ model: 'default', max_tokens: 10, system: 'You are terse.', messages: user('Hello there'), temperature: 0, stop_sequences: [stop] });
      eq(m2.stop_reason, 'stop_sequence');
      eq(m2.stop_sequence, stop);
      eq(m2.content.filter((b) => b.type === 'text').map((b) => b.text).join(''), text.slice(0, 2));
    }
  }
  // tool_use / tool_result turns are accepted and rendered
  const tools = [{ name: 'lookup_zz', description: 'look up', input_schema: { type: 'object', properties: { q: { type: 'string' } } } }];
  const m3 = await a.messages.create({
    model: 'default', max_tokens: 4, tools, temperature: 0,
    messages: [
      { role: 'user', content: 'find cats' },
      { role: 'assistant', content: [{ type: 'text', text: 'Looking.' }, { type: 'tool_use', id: 'toolu_1', name: 'lookup_zz', input: { q: 'cats' } }] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: 'cats are mammals' }] },
    ],
  });
  assert(m3.usage.input_tokens > m.usage.input_tokens, 'tools and results in the prompt');
});

test('anthropic: streaming events in order, text equals non-streaming', async () => {
  const a = ant(main);
  const body = { model: 'default', max_tokens: 12, messages: user('Tell a story'), temperature: 0 };
  const whole = await a.messages.create(body);
  const stream = await a.messages.create({ ...body, stream: true });
  const types = [];
  let text = '', stopReason = null, outTokens = null, inTokens = null;
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === 'message_start') inTokens = ev.message.usage.input_tokens;
    if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') text += ev.delta.text;
    if (ev.type === 'message_delta') { stopReason = ev.delta.stop_reason; outTokens = ev.usage.output_tokens; }
  }
  eq(types[0], 'message_start');
  eq(types[types.length - 1], 'message_stop');
  eq(types[types.length - 2], 'message_delta');
  // blocks are well nested: start, deltas, stop
  let open = false;
  for (const t of types.slice(1, -2)) {
    if (t === 'content_block_start') { assert(!open, 'nested block'); open = true; }
    else if (t === 'content_block_delta') assert(open, 'delta outside a block');
    else if (t === 'content_block_stop') { assert(open, 'stop without start'); open = false; }
    else assert(t === 'ping', 'unexpected event ' + t);
  }
  assert(!open, 'a block left open');
  eq(text, whole.content.filter((b) => b.type === 'text').map((b) => b.text).join(''), 'streamed text');
  eq(stopReason, whole.stop_reason);
  eq(outTokens, whole.usage.output_tokens);
  eq(inTokens, whole.usage.input_tokens);
  // the SDK's accumulating helper agrees
  const final = await a.messages.stream(body).finalMessage();
  eq(final.content.filter((b) => b.type === 'text').map((b) => b.text).join(''), text);
});

// ---- tests: concurrency ----
test('32 concurrent streams each get their solo greedy output', async () => {
  const c = oai(main);
  const jobs = Array.from({ length: 32 }, (_, i) => ({
    model: 'default', messages: user(`Prompt number ${i}: ${'abc '.repeat(i % 7)} tell me ${i * 7}`), max_tokens: 4 + (i % 9) * 3, ...greedy,
  }));
  const solo = [];
  for (const j of jobs) solo.push((await c.chat.completions.create(j)).choices[0].message.content);
  const got = await Promise.all(jobs.map((j) => streamChat(c, j)));
  for (let i = 0; i < jobs.length; i++) eq(got[i].text, solo[i], `stream ${i}`);
  // the engine drops a finished sequence at its next step, which may come just after the last chunk
  let m;
  for (let k = 0; k < 40; k++) {
    m = await metrics(main);
    if (m.cinfer_requests_running === 0 && m.cinfer_kv_blocks_used === 0) break;
    await sleep(50);
  }
  eq(m.cinfer_requests_running, 0, 'nothing left running');
  eq(m.cinfer_kv_blocks_used, 0, 'no KV block in use');
});

test('8 clients that disconnect mid-stream leave nothing running', async () => {
  const c = oai(main);
  const ctrls = [], done = [];
  for (let i = 0; i < 8; i++) {
    const ac = new AbortController();
    ctrls.push(ac);
    done.push((async () => {
      let n = 0;
      try {
        const stream = await c.chat.completions.create({ model: 'default', messages: user(`endless ${i}`), max_tokens: 100000, ...greedy, ignore_eos: true, stream: true }, { signal: ac.signal });
        for await (const ch of stream) { if (++n === 3) ac.abort(); }
      } catch (e) { /* aborted */ }
      return n;
    })());
  }
  const counts = await Promise.all(done);
  assert(counts.every((n) => n >= 3), 'each stream started: ' + counts);
  let m;
  for (let k = 0; k < 100; k++) {
    m = await metrics(main);
    if (m.cinfer_requests_running === 0 && m.cinfer_kv_blocks_used === 0 && m.cinfer_requests_waiting === 0) break;
    await sleep(50);
  }
  eq(m.cinfer_requests_running, 0, 'running sequences');
  eq(m.cinfer_kv_blocks_used, 0, 'KV blocks in use');
  eq(m.cinfer_state_slots_used, 0, 'state slots in use');
  assert(m.cinfer_requests_cancelled_total >= 8, 'cancellations counted: ' + m.cinfer_requests_cancelled_total);
});

test('requests beyond the queue get 429 while /health answers', async () => {
  // small: 1 running + 1 queued. Two long streams fill it; more are refused.
  const c = oai(small);
  const ctrls = [new AbortController(), new AbortController()];
  const started = [];
  const runs = ctrls.map((ac, i) => (async () => {
    try {
      const stream = await c.chat.completions.create({ model: 'default', messages: user('long ' + i), max_tokens: 100000, ...greedy, ignore_eos: true, stream: true }, { signal: ac.signal });
      for await (const ch of stream) { if (!started[i]) started[i] = true; }
    } catch {}
  })());
  for (let k = 0; k < 500 && !started.some(Boolean); k++) await sleep(10);
  assert(started.some(Boolean), 'one stream running');
  let full = false;
  for (let k = 0; k < 200 && !full; k++) {
    const m0 = await metrics(small);
    full = m0.cinfer_requests_running === 1 && m0.cinfer_requests_waiting === 1;
    if (!full) await sleep(10);
  }
  if (!full) console.log(JSON.stringify(await metrics(small)));
  assert(full, "one running and one waiting");
  // all at once, while the two streams hold the running slot and the queue
  const extra = await Promise.all([
    ...[0, 1, 2, 3].map(() => post(small, '/v1/chat/completions', { messages: user('more'), max_tokens: 2 })),
    post(small, '/v1/messages', { messages: user('more'), max_tokens: 2 }),
    fetch(small.url + '/health'),
  ]);
  const health = extra.pop();
  eq(health.status, 200, '/health answers while full');
  let busy = 0;
  for (const [k, r] of extra.entries()) {
    if (r.status !== 429) { await r.text(); continue; }
    busy++;
    eq(r.headers.get('retry-after'), '1', 'Retry-After');
    eq((await r.json()).error.type, 'rate_limit_error', k === 4 ? 'Anthropic shape' : 'OpenAI shape');
  }
  const m = await metrics(small);
  assert(m.cinfer_requests_rejected_busy_total >= busy, 'rejections counted');
  ctrls.forEach((ac) => ac.abort());
  await Promise.all(runs);
  assert(busy === 5, `all 5 extra requests refused (${busy})`);
  for (let k = 0; k < 100; k++) {
    const m = await metrics(small);
    if (m.cinfer_requests_running === 0 && m.cinfer_requests_waiting === 0) return;
    await sleep(50);
  }
  throw new Fail('queue did not drain');
});

// ---- tests: speculation and the prefix cache through the server (issue 6) ----
// Two more servers with the prefix cache on, one drafting with a draft model (the model itself: every greedy
// draft holds), one with n-gram lookup: greedy, seeded, stopped and logprob answers are the plain server's; a
// second turn reports its cached prefix (OpenAI cached_tokens, Anthropic cache_read_input_tokens);
// /metrics counts hits, misses, snapshot bytes and drafts; a stream cancelled mid-way leaves nothing behind.
test('speculation with the prefix cache: same answers, cached tokens, metrics, cancellation', async () => {
  if (MOCK) throw new Skip('the real engine only');
  const specs = await Promise.all([
    startServer(['--max-seqs', '4', '--ctx-size', '2048', '--prefix-cache-memory', '64M', '--spec', 'draft', '--draft-model', MODEL, ...NOTHINK]),
    startServer(['--max-seqs', '4', '--ctx-size', '2048', '--prefix-cache-memory', '64M', '--spec', 'ngram', ...NOTHINK]),
  ]);
  await Promise.all(specs.map((s) => waitReady(s)));
  const turn1 = user('Tell me a story about a cat and a dog. The cat and the dog were friends, and the cat and the dog played.');
  const plain1 = await oai(main).chat.completions.create({ model: 'default', messages: turn1, max_tokens: 24, ...greedy });
  const turn2 = [...turn1, { role: 'assistant', content: plain1.choices[0].message.content }, { role: 'user', content: 'What did they do next?' }];
  const plain2 = await oai(main).chat.completions.create({ model: 'default', messages: turn2, max_tokens: 24, ...greedy });
  const seeded = { model: 'default', messages: user('Name three colours.'), max_tokens: 16, temperature: 0.8, seed: 7 };
  const plainSeeded = await oai(main).chat.completions.create(seeded);
  const lpBody = { model: 'default', messages: user('Count from one to ten.'), max_tokens: 12, ...greedy, logprobs: true, top_logprobs: 3 };
  const plainLp = await oai(main).chat.completions.create(lpBody);
  const text1 = plain1.choices[0].message.content;
  const stopAt = text1.length > 8 ? text1.slice(5, 8) : null;
  const plainStop = stopAt ? await oai(main).chat.completions.create({ model: 'default', messages: turn1, max_tokens: 24, ...greedy, stop: [stopAt] }) : null;
  for (const [k, s] of specs.entries()) {
    const tag = k ? 'ngram' : 'draft model';
    const m0 = await metrics(s);
    const r1 = await oai(s).chat.completions.create({ model: 'default', messages: turn1, max_tokens: 24, ...greedy });
    eq(r1.choices[0].message.content, text1, `${tag}: turn 1`);
    const r2 = await oai(s).chat.completions.create({ model: 'default', messages: turn2, max_tokens: 24, ...greedy });
    eq(r2.choices[0].message.content, plain2.choices[0].message.content, `${tag}: turn 2`);
    const cached = r2.usage.prompt_tokens_details.cached_tokens;
    assert(cached > 0 && cached < r2.usage.prompt_tokens, `${tag}: turn 2 cached_tokens ${cached} of ${r2.usage.prompt_tokens}`);
    eq(plain2.usage.prompt_tokens_details.cached_tokens, 0, 'no prefix cache on the plain server');
    // Anthropic: the same second turn, its cached prefix as cache_read_input_tokens
    const a2 = await ant(s).messages.create({ model: 'default', max_tokens: 24, messages: turn2, temperature: 0 });
    assert(a2.usage.cache_read_input_tokens > 0, `${tag}: cache_read_input_tokens ${a2.usage.cache_read_input_tokens}`);
    const ct = await ant(s).messages.countTokens({ model: 'default', messages: turn2 });
    eq(a2.usage.input_tokens + a2.usage.cache_read_input_tokens, ct.input_tokens, `${tag}: input + cache read = count_tokens`);
    eq(a2.content.filter((b) => b.type === 'text').map((b) => b.text).join(''), plain2.choices[0].message.content, `${tag}: Anthropic turn 2`);
    // seeds, stop strings, logprobs
    eq((await oai(s).chat.completions.create(seeded)).choices[0].message.content, plainSeeded.choices[0].message.content, `${tag}: seeded`);
    if (plainStop) {
      const st = await oai(s).chat.completions.create({ model: 'default', messages: turn1, max_tokens: 24, ...greedy, stop: [stopAt] });
      eq(st.choices[0].message.content, plainStop.choices[0].message.content, `${tag}: stop string`);
      eq(st.choices[0].finish_reason, plainStop.choices[0].finish_reason, `${tag}: stop finish`);
    }
    const lp = await oai(s).chat.completions.create(lpBody);
    const a = plainLp.choices[0].logprobs.content, b = lp.choices[0].logprobs.content;
    eq(b.map((t) => t.token), a.map((t) => t.token), `${tag}: logprob tokens`);
    for (let i = 0; i < a.length; i++) {
      assert(Math.abs(a[i].logprob - b[i].logprob) < 1e-4, `${tag}: token ${i} logprob ${b[i].logprob} vs ${a[i].logprob}`);
      eq(b[i].top_logprobs.map((t) => t.token), a[i].top_logprobs.map((t) => t.token), `${tag}: token ${i} top logprobs`);
    }
    // a stream cancelled after 3 chunks
    const ac = new AbortController();
    try {
      const stream = await oai(s).chat.completions.create({ model: 'default', messages: user('endless spec'), max_tokens: 100000, ...greedy, ignore_eos: true, stream: true }, { signal: ac.signal });
      let n = 0;
      for await (const ch of stream) if (++n === 3) ac.abort();
    } catch { /* aborted */ }
    let m;
    for (let i = 0; i < 100; i++) {
      m = await metrics(s);
      if (m.cinfer_requests_running === 0 && m.cinfer_kv_blocks_used === 0) break;
      await sleep(50);
    }
    eq(m.cinfer_requests_running, 0, `${tag}: nothing running after the cancel`);
    eq(m.cinfer_kv_blocks_used, 0, `${tag}: no KV block in use after the cancel`);
    eq(m.cinfer_state_slots_used, 0, `${tag}: no state slot in use after the cancel`);
    assert(m.cinfer_requests_cancelled_total > m0.cinfer_requests_cancelled_total, `${tag}: the cancel counted`);
    // metrics
    assert(m.cinfer_prefix_cache_hits_total >= 2, `${tag}: prefix hits ${m.cinfer_prefix_cache_hits_total}`);
    assert(m.cinfer_prefix_cache_misses_total >= 1, `${tag}: prefix misses ${m.cinfer_prefix_cache_misses_total}`);
    eq(m.cinfer_prefix_cache_lookups_total, m.cinfer_prefix_cache_hits_total + m.cinfer_prefix_cache_misses_total, `${tag}: lookups`);
    assert(m.cinfer_prefix_cache_bytes > 0, `${tag}: snapshot bytes ${m.cinfer_prefix_cache_bytes}`);
    assert(m.cinfer_prefix_cache_evictions_total >= 0 && m.cinfer_prefix_cache_tokens_total >= cached, `${tag}: evictions / tokens`);
    assert(m.cinfer_spec_draft_tokens_total > 0, `${tag}: drafts ${m.cinfer_spec_draft_tokens_total}`);
    assert(m.cinfer_spec_accepted_tokens_total > 0 && m.cinfer_spec_accepted_tokens_total <= m.cinfer_spec_draft_tokens_total, `${tag}: accepted ${m.cinfer_spec_accepted_tokens_total}`);
  }
});

if (MOCK) {
  // The stand-in engine answers a prompt containing CALLTOOL with a scripted call to the first tool:
  // this checks the tool-call shapes against the SDKs' own parsers and accumulators.
  const wtools = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];
  test('tool calls through the OpenAI SDK (whole, streamed, accumulated)', async () => {
    const c = oai(main);
    const body = { model: 'default', messages: user('CALLTOOL please'), tools: wtools, max_tokens: 20 };
    const r = await c.chat.completions.create(body);
    eq(r.choices[0].finish_reason, 'tool_calls');
    const call = r.choices[0].message.tool_calls[0];
    eq([call.id, call.type, call.function.name], ['call_mock1', 'function', 'get_weather']);
    eq(JSON.parse(call.function.arguments), { city: 'Paris' });
    eq(r.choices[0].message.content, 'ok');
    const final = await c.chat.completions.stream(body).finalChatCompletion();
    const fc = final.choices[0].message.tool_calls[0];
    eq(fc.function.name, 'get_weather');
    eq(JSON.parse(fc.function.arguments), { city: 'Paris' });
    eq(final.choices[0].finish_reason, 'tool_calls');
    const none = await c.chat.completions.create({ ...body, tool_choice: 'none' });
    assert(!none.choices[0].message.tool_calls, 'tool_choice none: no call parsed');
  });
  test('tool_use through the Anthropic SDK (whole, streamed, accumulated)', async () => {
    const a = ant(main);
    const body = { model: 'default', max_tokens: 20, messages: user('CALLTOOL please'),
      tools: [{ name: 'get_weather', input_schema: { type: 'object', properties: { city: { type: 'string' } } } }] };
    const m = await a.messages.create(body);
    eq(m.stop_reason, 'tool_use');
    const tu = m.content.find((b) => b.type === 'tool_use');
    eq([tu.id, tu.name], ['call_mock1', 'get_weather']);
    eq(tu.input, { city: 'Paris' });
    const final = await a.messages.stream(body).finalMessage();
    eq(final.stop_reason, 'tool_use');
    eq(final.content.map((b) => b.type), ['text', 'tool_use']);
    eq(final.content[1].input, { city: 'Paris' });
  });
  test('thinking blocks through the Anthropic SDK', async () => {
    const a = ant(main);
    const body = { model: 'default', max_tokens: 10, messages: user('think first'), temperature: 0, thinking: { type: 'enabled', budget_tokens: 1024 } };
    const m = await a.messages.create(body);
    eq(m.content[0].type, 'thinking');
    assert(m.content[0].thinking.length > 0, 'thinking text');
    const final = await a.messages.stream(body).finalMessage();
    eq(final.content.map((b) => b.type), m.content.map((b) => b.type));
    eq(final.content[0].thinking, m.content[0].thinking);
  });

  test('503 while loading (mock load delay), then 200', async () => {
    const s = await startServer([], { MOCK_LOAD_DELAY_MS: '1500' });
    const h = await fetch(s.url + '/health');
    eq(h.status, 503);
    eq(h.headers.get('retry-after'), '1');
    const r = await post(s, '/v1/chat/completions', { messages: user('x') });
    eq(r.status, 503);
    assert((await r.json()).error, 'error body');
    await waitReady(s);
    eq((await fetch(s.url + '/health')).status, 200);
  });
}

if (!MOCK) {
  // Constrained decoding on the real engine: models/default has random weights, so whatever comes out
  // well-formed is the grammar's doing. The schemas bound every string and array so answers end.
  const person = {
    type: 'object',
    properties: { name: { type: 'string', maxLength: 10 }, age: { type: 'integer' }, tags: { type: 'array', items: { enum: ['x', 'y'] }, maxItems: 2 },
      pet: { anyOf: [{ type: 'null' }, { $ref: '#/$defs/pet' }] } },
    required: ['name', 'age'], additionalProperties: false,
    $defs: { pet: { type: 'object', properties: { kind: { enum: ['cat', 'dog'] } }, required: ['kind'], additionalProperties: false } },
  };
  const checkPerson = (v) => {
    assert(v && typeof v === 'object' && !Array.isArray(v), 'an object: ' + JSON.stringify(v));
    assert(typeof v.name === 'string' && [...v.name].length <= 10, 'name: ' + JSON.stringify(v));
    assert(Number.isInteger(v.age), 'age: ' + JSON.stringify(v));
    if ('tags' in v) assert(Array.isArray(v.tags) && v.tags.length <= 2 && v.tags.every((t) => t === 'x' || t === 'y'), 'tags: ' + JSON.stringify(v));
    if ('pet' in v) assert(v.pet === null || ['cat', 'dog'].includes(v.pet.kind), 'pet: ' + JSON.stringify(v));
    for (const k of Object.keys(v)) assert(['name', 'age', 'tags', 'pet'].includes(k), 'extra key ' + k);
  };
  test('response_format json_schema: every answer parses and validates (openai SDK)', async () => {
    const c = oai(main);
    const body = { model: 'default', messages: user('Describe a person as JSON.'), max_tokens: 600, temperature: 1,
      response_format: { type: 'json_schema', json_schema: { name: 'person', schema: person, strict: true } } };
    for (const seed of [1, 2, 3, 4, 5, 6]) {
      const r = await c.chat.completions.create({ ...body, seed });
      eq(r.choices[0].finish_reason, 'stop', 'seed ' + seed + ': ' + r.choices[0].message.content);
      checkPerson(JSON.parse(r.choices[0].message.content));
    }
    const s = await streamChat(c, { ...body, seed: 11 });
    eq(s.finish, 'stop');
    checkPerson(JSON.parse(s.text));
    const o = await c.chat.completions.create({ ...body, seed: 3, max_tokens: 300, response_format: { type: 'json_object' } });
    const txt = o.choices[0].message.content;
    assert(txt.startsWith('{'), 'json_object starts an object: ' + txt);
    if (o.choices[0].finish_reason === 'stop') assert(typeof JSON.parse(txt) === 'object', 'json_object: ' + txt);
    await expectStatus(c.chat.completions.create({ ...body, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string', pattern: '^a' } } } }),
      400, (e) => { eq(e.param, 'response_format'); assert(/'pattern'/.test(e.message), e.message); });
  });
  const weather = { type: 'object', properties: { city: { type: 'string', maxLength: 12 }, days: { type: 'integer' }, unit: { type: 'string', enum: ['c', 'f'] } },
    required: ['city', 'days'] };
  const ftools = [
    { type: 'function', function: { name: 'lookup', parameters: { type: 'object', properties: { q: { type: 'string', maxLength: 8 } }, required: ['q'] } } },
    { type: 'function', function: { name: 'get_weather', parameters: weather } },
  ];
  const checkWeather = (args) => {
    const a = JSON.parse(args);
    assert(typeof a.city === 'string' && [...a.city].length <= 12 && Number.isInteger(a.days), 'arguments: ' + args);
    if ('unit' in a) assert(a.unit === 'c' || a.unit === 'f', 'unit: ' + args);
  };
  test('tool_choice named / required: tool_calls with valid arguments (openai SDK)', async () => {
    const c = oai(main);
    // room for "required" / "any" to make its 8 calls: the trained default model goes on calling (~60 tokens each)
    const body = { model: 'default', messages: user('Weather in Oslo?'), tools: ftools, max_tokens: 1200, temperature: 1,
      tool_choice: { type: 'function', function: { name: 'get_weather' } } };
    for (const seed of [1, 2, 3]) {
      const r = await c.chat.completions.create({ ...body, seed });
      eq(r.choices[0].finish_reason, 'tool_calls', 'seed ' + seed + ': ' + JSON.stringify(r.choices[0].message));
      const calls = r.choices[0].message.tool_calls;
      eq(calls.length, 1);
      eq(calls[0].function.name, 'get_weather');
      checkWeather(calls[0].function.arguments);
    }
    const final = await c.chat.completions.stream({ ...body, seed: 7 }).finalChatCompletion();
    eq(final.choices[0].message.tool_calls[0].function.name, 'get_weather');
    checkWeather(final.choices[0].message.tool_calls[0].function.arguments);
    const req = await c.chat.completions.create({ ...body, tool_choice: 'required', seed: 5 });
    eq(req.choices[0].finish_reason, 'tool_calls');
    assert(req.choices[0].message.tool_calls.length >= 1, 'required: at least one call');
    for (const tc of req.choices[0].message.tool_calls) assert(['lookup', 'get_weather'].includes(tc.function.name), tc.function.name);
    await expectStatus(c.chat.completions.create({ ...body, tool_choice: { type: 'function', function: { name: 'nope' } } }), 400,
      (e) => { eq(e.param, 'tool_choice'); assert(/nope/.test(e.message), e.message); });
  });
  test('tool_choice tool: a tool_use block (Anthropic SDK)', async () => {
    const a = ant(main);
    const body = { model: 'default', max_tokens: 1200, temperature: 1, messages: user('Weather in Oslo?'),
      tools: [{ name: 'lookup', input_schema: ftools[0].function.parameters }, { name: 'get_weather', input_schema: weather }],
      tool_choice: { type: 'tool', name: 'get_weather' } };
    const m = await a.messages.create(body);
    eq(m.stop_reason, 'tool_use');
    const tu = m.content.find((b) => b.type === 'tool_use');
    assert(tu, 'a tool_use block: ' + JSON.stringify(m.content));
    eq(tu.name, 'get_weather');
    checkWeather(JSON.stringify(tu.input));
    const final = await a.messages.stream({ ...body, tool_choice: { type: 'any' } }).finalMessage();
    eq(final.stop_reason, 'tool_use');
    assert(final.content.some((b) => b.type === 'tool_use'), 'streamed tool_use');
  });
}

// ---- tests: images ----
const imgB64 = (dir, name) => fs.readFileSync(path.join(dir, name)).toString('base64');
const fixtureImg = (name) => imgB64(path.join(root, 'tests/fixtures/images'), name);
const oaiImageMsg = (b64s, text) => [{ role: 'user', content: [...b64s.map((b) => ({ type: 'image_url', image_url: { url: 'data:image/png;base64,' + b } })), { type: 'text', text }] }];
const antImageMsg = (b64s, text) => [{ role: 'user', content: [...b64s.map((b) => ({ type: 'image', source: { type: 'base64', media_type: 'image/png', data: b } })), { type: 'text', text }] }];

test('images: remote URLs and models without a vision tower are clear 400s', async () => {
  const remote = [{ role: 'user', content: [{ type: 'text', text: 'hi' }, { type: 'image_url', image_url: { url: 'https://example.com/a.png' } }] }];
  await expectStatus(oai(main).chat.completions.create({ model: 'default', messages: remote, max_tokens: 4 }), 400,
    (e) => assert(/does not fetch/.test(e.message), e.message));
  await expectStatus(ant(main).messages.create({ model: 'default', max_tokens: 4,
    messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'url', url: 'https://example.com/a.png' } }] }] }), 400,
    (e) => assert(/does not fetch/.test(e.message), e.message));
  await expectStatus(oai(main).chat.completions.create({ model: 'default', messages: oaiImageMsg([fixtureImg('bilevel_97x61.png')], 'What?'), max_tokens: 4 }),
    400, (e) => assert(/no vision tower/.test(e.message), e.message));
});

const visionDir = () => VISION_MODEL;
const needVision = () => {
  if (!vision) throw new Skip(VISION_MODEL + ' is not made yet (tools/oracle/make_vision_fixtures.py makes it)');
};

test('vision: OpenAI image_url and Anthropic image give the same greedy answer; streaming equals whole; usage counts image tokens', async () => {
  if (MOCK) return;
  needVision();
  const b64 = imgB64(path.join(visionDir(), 'images'), 'small_40x36.png');
  const body = { model: 'default', messages: oaiImageMsg([b64], 'What is this?'), max_tokens: 8, ...greedy };
  const r = await oai(vision).chat.completions.create(body);
  eq(r.choices.length, 1);
  const text = r.choices[0].message.content;
  assert(typeof text === 'string', 'content');
  const s = await streamChat(oai(vision), body);
  eq(s.text, text, 'streamed text');
  // the same words without the image: the image adds <|vision_start|>, its 6 pads (grid 1x6x4) and <|vision_end|>
  const t = await oai(vision).chat.completions.create({ model: 'default', messages: user('What is this?'), max_tokens: 1, ...greedy });
  eq(r.usage.prompt_tokens - t.usage.prompt_tokens, 8, 'image tokens in usage');
  const a = await ant(vision).messages.create({ model: 'default', max_tokens: 8, temperature: 0, messages: antImageMsg([b64], 'What is this?') });
  eq(a.content.map((c) => c.text || '').join(''), text, 'anthropic answer');
  eq(a.usage.input_tokens, r.usage.prompt_tokens, 'anthropic input_tokens');
  const ct = await ant(vision).messages.countTokens({ model: 'default', messages: antImageMsg([b64], 'What is this?') });
  eq(ct.input_tokens, r.usage.prompt_tokens, 'count_tokens');
});

test('vision: two images in one message; image and text requests at once each give their solo answer', async () => {
  if (MOCK) return;
  needVision();
  const dir = path.join(visionDir(), 'images');
  const a = imgB64(dir, 'tall_50x170.png'), b = imgB64(dir, 'wide_150x90.png');
  const bodies = [
    { model: 'default', messages: oaiImageMsg([a, b], 'Compare them.'), max_tokens: 6, ...greedy },
    { model: 'default', messages: user('Just text here.'), max_tokens: 6, ...greedy },
    { model: 'default', messages: oaiImageMsg([b], 'And this one?'), max_tokens: 6, ...greedy },
    { model: 'default', messages: user('More text, no picture.'), max_tokens: 6, ...greedy },
  ];
  const solo = [];
  for (const body of bodies) solo.push((await oai(vision).chat.completions.create(body)).choices[0].message.content);
  const together = await Promise.all(bodies.map((body) => oai(vision).chat.completions.create(body)));
  for (let i = 0; i < bodies.length; i++) eq(together[i].choices[0].message.content, solo[i], 'request ' + i);
  // n choices each get the images (the tower runs once per request, the copies share its features)
  const nn = await oai(vision).chat.completions.create({ ...bodies[0], n: 2 });
  eq(nn.choices.map((c) => c.message.content), [solo[0], solo[0]], 'n = 2');
  // the picture matters: swapping the two images changes the prompt (not necessarily the answer), and the
  // prompt token count follows the images' sizes (tall: 10 tokens, wide: 15)
  const one = await oai(vision).chat.completions.create({ ...bodies[2], max_tokens: 1 });
  const two = await oai(vision).chat.completions.create({ ...bodies[0], max_tokens: 1 });
  assert(two.usage.prompt_tokens > one.usage.prompt_tokens, `${two.usage.prompt_tokens} vs ${one.usage.prompt_tokens}`);
});

test('vision: bad images are 400s in each API\'s error shape', async () => {
  if (MOCK) return;
  needVision();
  const dir = path.join(visionDir(), 'images');
  const good = fs.readFileSync(path.join(dir, 'small_40x36.png'));
  const truncated = good.subarray(0, Math.floor(good.length / 2)).toString('base64');
  await expectStatus(oai(vision).chat.completions.create({ model: 'default', messages: oaiImageMsg([truncated], 'x'), max_tokens: 2 }), 400,
    (e) => assert(/image 0/.test(e.message), e.message));
  await expectStatus(ant(vision).messages.create({ model: 'default', max_tokens: 2, messages: antImageMsg(['###not-base64###'], 'x') }), 400,
    (e) => assert(e.error?.type === 'error' && /base64/.test(e.message), JSON.stringify(e.error)));
  // over --max-image-pixels (the vision server allows 14000; 300x200 is 60000)
  await expectStatus(oai(vision).chat.completions.create({ model: 'default', messages: oaiImageMsg([imgB64(dir, 'big_300x200.png')], 'x'), max_tokens: 2 }), 400,
    (e) => assert(/image 0/.test(e.message), e.message));
  const txt = Buffer.from('just text').toString('base64');
  await expectStatus(oai(vision).chat.completions.create({ model: 'default',
    messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'data:text/plain;base64,' + txt } }] }], max_tokens: 2 }), 400,
    (e) => assert(/not an image/.test(e.message), e.message));
  // the server is still fine
  const r = await oai(vision).chat.completions.create({ model: 'default', messages: oaiImageMsg([good.toString('base64')], 'x'), max_tokens: 2, ...greedy });
  eq(r.choices.length, 1);
});

// ---- main ----
let passed = 0, failed = 0, skipped = 0;
try {
  [main, auth, small, tiny] = await Promise.all([
    startServer(['--max-seqs', '8', '--queue-limit', '64', '--allowed-origins', 'http://allowed.example', '--ctx-size', '2048', ...NOTHINK]),
    startServer(['--api-key', KEY, '--max-seqs', '2', '--ctx-size', '512', ...NOTHINK]),
    startServer(['--max-seqs', '1', '--queue-limit', '1', '--ctx-size', '1024', '--max-body', '64K', '--timeout', '2', ...NOTHINK]),
    startServer(['--max-seqs', '1', '--ctx-size', '64', '--temp', '0', '--max-tokens', '5', '--log-format', 'json', ...NOTHINK]),
  ]);
  await Promise.all([waitReady(main), waitReady(auth), waitReady(small), waitReady(tiny)]);
  if (!MOCK && fs.existsSync(path.join(VISION_MODEL, 'config.json'))) {
    vision = await startServer(['--max-seqs', '4', '--ctx-size', '512', '--max-image-pixels', '14000', ...NOTHINK], {}, VISION_MODEL);
    await waitReady(vision);
  }
  for (const t of tests) {
    if (FILTER && !t.name.includes(FILTER)) continue;
    const t0 = Date.now();
    try {
      await t.fn();
      passed++;
      console.log(`ok   ${t.name} (${Date.now() - t0} ms)`);
    } catch (e) {
      if (e instanceof Skip) {
        skipped++;
        console.log(`skip ${t.name}: ${e.message}`);
        continue;
      }
      failed++;
      console.log(`FAIL ${t.name}: ${e instanceof Fail ? e.message : e.stack}`);
    }
    for (const s of servers)
      if (s.exited && !s.reported) { console.log(`FAIL server died (${JSON.stringify(s.exited)}): ${s.stderr().slice(-3000)}`); failed++; s.reported = true; }
  }
} catch (e) {
  failed++;
  console.log('FAIL setup: ' + (e.stack || e));
}
await stopAll();
// A clean shutdown on SIGTERM exits 0 (under ASan, leaks would make it non-zero).
for (const s of servers)
  if (!s.reported && s.exited && !(s.exited.code === 0 || s.exited.sig === 'SIGTERM')) {
    console.log(`FAIL server exit ${JSON.stringify(s.exited)}: ${s.stderr().slice(-2000)}`);
    failed++;
  }
console.log(`${passed} passed, ${failed} failed${skipped ? `, ${skipped} skipped` : ''}`);
process.exit(failed ? 1 : 0);

// browser.mjs — the chat page in headless Chromium (Debian's chromium, driven by playwright-core, both
// installed by scripts/install-deps.sh): GET / has the right content type and CSP; typing a message
// streams an answer into the page; Stop ends a long answer mid-stream and the server's sequence with it;
// regenerate and new chat work; a server error shows in the page; no console errors or CSP violations.
//
//   node tests/e2e/browser.mjs --bin build/cinfer-serve [--model models/default]
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const req = createRequire(path.join(root, 'third_party/npm/e2e/x.js'));
const CHROMIUM = '/usr/bin/chromium';
let chromium;
try {
  ({ chromium } = req('playwright-core'));
} catch (e) {
  console.log('FAIL playwright-core is missing: run scripts/install-deps.sh (' + e.message + ')');
  console.log('0 passed, 1 failed');
  process.exit(1);
}
if (!fs.existsSync(CHROMIUM)) {
  console.log('FAIL ' + CHROMIUM + ' is missing: run scripts/install-deps.sh');
  console.log('0 passed, 1 failed');
  process.exit(1);
}

const args = process.argv.slice(2);
const opt = (name, dflt) => { const i = args.indexOf(name); return i < 0 ? dflt : args[i + 1]; };
const BIN = path.resolve(root, opt('--bin', 'build/cinfer-serve'));
const MODEL = path.resolve(root, opt('--model', 'models/default'));

class Fail extends Error {}
const assert = (c, msg) => { if (!c) throw new Fail(msg); };

function startServer(extra) {
  const p = spawn(BIN, ['--model', MODEL, '--port', '0', '--threads', '2', ...extra], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '', err = '';
  p.stderr.on('data', (d) => { err += d; if (err.length > 1e6) err = err.slice(-5e5); });
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error('server did not start: ' + err)), 30000);
    p.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on (http:\/\/[^\s]+)/);
      if (m) { clearTimeout(t); resolve({ p, url: m[1], stderr: () => err }); }
    });
    p.on('exit', (code) => reject(new Error('server exited ' + code + ': ' + err)));
  });
}

async function waitReady(url) {
  for (let i = 0; i < 300; i++) {
    try { if ((await fetch(url + '/health')).status === 200) return; } catch (e) { /* not yet */ }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error('server not ready');
}

async function running(url) {
  const text = await (await fetch(url + '/metrics', { headers: { authorization: 'Bearer ' + KEY } })).text();
  const m = text.match(/^cinfer_requests_running ([0-9.]+)$/m);
  return m ? Number(m[1]) : NaN;
}

let passed = 0, failed = 0;
const tests = [];
const test = (name, fn) => tests.push({ name, fn });

let server, browser, page;
const problems = []; // console errors, page errors, CSP violations

test('GET / serves the page with content type and CSP; assets too', async () => {
  const r = await fetch(server.url + '/');
  assert(r.status === 200, 'status ' + r.status);
  assert(r.headers.get('content-type') === 'text/html; charset=utf-8', 'content-type ' + r.headers.get('content-type'));
  const csp = r.headers.get('content-security-policy') || '';
  assert(/default-src 'none'/.test(csp) && /script-src 'self'/.test(csp) && /connect-src 'self'/.test(csp), 'CSP: ' + csp);
  eqHeader(r, 'x-content-type-options', 'nosniff');
  const html = await r.text();
  assert(html.includes('<script src="/app.js"') && !/https?:\/\//.test(html.replace(/http-equiv/g, '')), 'self-contained page');
  const js = await fetch(server.url + '/app.js');
  assert(js.status === 200 && js.headers.get('content-type').startsWith('text/javascript'), 'app.js');
  const css = await fetch(server.url + '/app.css');
  assert(css.status === 200 && css.headers.get('content-type').startsWith('text/css'), 'app.css');
  assert((await fetch(server.url + '/nope.js')).status === 404, '404 for other paths');
  // the page needs no key even when the API does (the server under test has one)
  assert((await fetch(server.url + '/v1/models')).status === 401, 'the API still wants the key');
});
function eqText(got, want) {
  assert(got === want, `text ${JSON.stringify(got)} != ${JSON.stringify(want)}`);
}
function eqHeader(r, name, want) {
  assert(r.headers.get(name) === want, `${name}: ${r.headers.get(name)} != ${want}`);
}

test('a message streams an answer into the page', async () => {
  await page.goto(server.url + '/');
  await page.click('#settings summary');
  await page.fill('#api-key', KEY);
  await page.fill('#max-tokens', '24');
  await page.fill('#temperature', '0');
  await page.uncheck('#thinking');
  await page.fill('#input', 'Write a Python function that adds two numbers, like this:\n```python\ndef add(a, b):\n    return a + b\n```');
  // count content updates while it streams: a streamed answer grows in several steps
  await page.evaluate(() => {
    window.__updates = 0;
    new MutationObserver(() => window.__updates++).observe(document.getElementById('log'), { childList: true, subtree: true, characterData: true });
  });
  await page.click('#send');
  await page.waitForFunction(() => document.body.dataset.busy === '0' && document.querySelectorAll('.msg.assistant').length === 1, null, { timeout: 60000 });
  const text = await page.textContent('.msg.assistant .content');
  assert(text.length > 0, 'an answer appeared');
  const updates = await page.evaluate(() => window.__updates);
  assert(updates >= 3, 'streamed in steps (' + updates + ' updates)');
  assert((await page.textContent('.msg.user .content')).includes('adds two numbers'), 'the user message is shown');
  // fenced code is a code block (text, not markup), with its language
  eqText(await page.textContent('.msg.user pre.code code'), 'def add(a, b):\n    return a + b\n');
  eqText(await page.textContent('.msg.user pre.code .code-lang'), 'python');
  assert(await page.isEnabled('#regenerate'), 'regenerate enabled after an answer');
  assert(!(await page.isVisible('#error')), 'no error shown');
});

test('stop ends a long answer mid-stream; the server drops the sequence', async () => {
  // random weights may end early: this one request ignores EOS (added on the way out), so it runs long
  await page.route('**/v1/chat/completions', (route) => {
    const body = JSON.parse(route.request().postData());
    route.continue({ postData: JSON.stringify({ ...body, ignore_eos: true }) });
  }, { times: 1 });
  await page.fill('#max-tokens', '3000');
  await page.fill('#input', 'Tell me a very long story.');
  await page.click('#send');
  await page.waitForFunction(() => {
    const c = document.querySelectorAll('.msg.assistant .content');
    return c.length === 2 && c[1].textContent.length > 20;
  }, null, { timeout: 60000 });
  assert(await page.isEnabled('#stop'), 'stop enabled while streaming');
  await page.click('#stop');
  await page.waitForFunction(() => document.body.dataset.busy === '0', null, { timeout: 10000 });
  const status = await page.textContent('.msg.assistant:last-child .status');
  assert(status.includes('stopped'), 'status: ' + status);
  const len1 = (await page.textContent('.msg.assistant:last-child .content')).length;
  await new Promise((r) => setTimeout(r, 500));
  const len2 = (await page.textContent('.msg.assistant:last-child .content')).length;
  assert(len1 === len2, 'no more text after stop');
  let n = NaN;
  for (let i = 0; i < 50; i++) {
    n = await running(server.url);
    if (n === 0) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  assert(n === 0, 'running sequences after stop: ' + n);
});

test('regenerate replaces the last answer; new chat clears the page', async () => {
  await page.fill('#max-tokens', '8');
  await page.click('#regenerate');
  await page.waitForFunction(() => document.body.dataset.busy === '0', null, { timeout: 60000 });
  assert((await page.$$('.msg.assistant')).length === 2, 'still two answers');
  assert(!(await page.textContent('.msg.assistant:last-child .status')).includes('stopped'), 'the new answer replaced the stopped one');
  await page.click('#new-chat');
  assert((await page.$$('.msg')).length === 0, 'cleared');
});

test('a server error is shown in the page', async () => {
  await page.fill('#max-tokens', '8');
  await page.fill('#max-tokens', '0'); // out of range: 400 from the server
  await page.fill('#input', 'hello');
  await page.click('#send');
  await page.waitForFunction(() => document.body.dataset.busy === '0', null, { timeout: 30000 });
  assert(await page.isVisible('#error'), 'error banner shown');
  const t = await page.textContent('#error');
  assert(/max_tokens/.test(t), 'error names the field: ' + t);
  assert((await page.textContent('.msg.assistant:last-child .status')).includes('error'), 'the answer is marked');
  const msgs = await page.evaluate(() => fetch('/v1/models').then((r) => r.status));
  assert(msgs === 401, 'fetch without key from the page: ' + msgs);
});

test('no console errors and no CSP violations', async () => {
  // the failed requests above (400, 401) are expected network results, not script errors
  const real = problems.filter((p) => !/status of 40[01]/.test(p));
  assert(real.length === 0, real.join('\n'));
});

const KEY = 'browser-key';
const userDataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'cinfer-chromium-'));
try {
  server = await startServer(['--api-key', KEY, '--max-seqs', '2', '--ctx-size', '4096', '--chat-template-args', '{"enable_thinking":false}']);
  await waitReady(server.url);
  const ctx = await chromium.launchPersistentContext(userDataDir, {
    executablePath: CHROMIUM,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update',
      '--disable-sync', '--no-first-run'],
  });
  browser = ctx;
  page = ctx.pages()[0] || await ctx.newPage();
  page.on('console', (m) => { if (m.type() === 'error') problems.push('console: ' + m.text()); });
  page.on('pageerror', (e) => problems.push('page error: ' + e.message));
  for (const t of tests) {
    const t0 = Date.now();
    try {
      await t.fn();
      passed++;
      console.log(`ok   ${t.name} (${Date.now() - t0} ms)`);
    } catch (e) {
      failed++;
      console.log(`FAIL ${t.name}: ${e instanceof Fail ? e.message : e.stack}`);
    }
  }
} catch (e) {
  failed++;
  console.log('FAIL setup: ' + (e.stack || e));
} finally {
  if (browser) await browser.close().catch(() => {});
  if (server) {
    server.p.removeAllListeners('exit');
    server.p.kill('SIGTERM');
  }
  fs.rmSync(userDataDir, { recursive: true, force: true });
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);

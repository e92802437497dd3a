// app.js — the chat page: keeps the conversation in memory, streams answers from /v1/chat/completions
// (server-sent events read from fetch), shows reasoning apart in a collapsible block and code fences as
// code blocks. Everything is built with textContent, never innerHTML: model output is untrusted text.
'use strict';

const $ = (id) => document.getElementById(id);
const state = { messages: [], controller: null, busy: false };

function headers() {
  const h = { 'content-type': 'application/json' };
  const key = $('api-key').value.trim();
  if (key) h.authorization = 'Bearer ' + key;
  return h;
}

function showError(text) {
  const e = $('error');
  e.textContent = text;
  e.hidden = !text;
}

function setBusy(busy) {
  state.busy = busy;
  document.body.dataset.busy = busy ? '1' : '0';
  $('send').disabled = busy;
  $('stop').disabled = !busy;
  $('regenerate').disabled = busy || !state.messages.some((m) => m.role === 'assistant');
}

// Text with ``` fences → text nodes and <pre class="code"> blocks. An unclosed fence (still streaming)
// is shown as code too.
function renderContent(el, text) {
  el.replaceChildren();
  const parts = text.split('```');
  parts.forEach((part, i) => {
    if (i % 2 === 0) {
      if (part) el.append(document.createTextNode(part));
      return;
    }
    const nl = part.indexOf('\n');
    const lang = nl >= 0 ? part.slice(0, nl).trim() : '';
    const body = nl >= 0 ? part.slice(nl + 1) : part;
    const pre = document.createElement('pre');
    pre.className = 'code';
    if (lang) {
      const l = document.createElement('div');
      l.className = 'code-lang';
      l.textContent = lang;
      pre.append(l);
    }
    const code = document.createElement('code');
    code.textContent = body;
    pre.append(code);
    el.append(pre);
  });
}

function addMessageView(msg) {
  const div = document.createElement('div');
  div.className = 'msg ' + msg.role;
  const role = document.createElement('span');
  role.className = 'role';
  role.textContent = msg.role;
  div.append(role);
  if (msg.role === 'assistant') {
    const det = document.createElement('details');
    det.className = 'reasoning';
    det.hidden = true;
    const sum = document.createElement('summary');
    sum.textContent = 'Reasoning';
    const rtext = document.createElement('div');
    rtext.className = 'reasoning-text';
    det.append(sum, rtext);
    div.append(det);
    msg.view = { det, rtext };
  }
  const content = document.createElement('div');
  content.className = 'content';
  div.append(content);
  const status = document.createElement('div');
  status.className = 'status';
  div.append(status);
  msg.view = { ...(msg.view || {}), div, content, status };
  renderMessage(msg);
  $('log').append(div);
  return div;
}

function renderMessage(msg) {
  const v = msg.view;
  if (msg.role === 'assistant') {
    v.det.hidden = !msg.reasoning;
    v.rtext.textContent = msg.reasoning || '';
    renderContent(v.content, msg.content);
  } else {
    renderContent(v.content, msg.content);
  }
  v.status.textContent = msg.status || '';
  v.div.classList.toggle('error', !!msg.error);
  const log = $('log');
  log.scrollTop = log.scrollHeight;
}

function requestMessages() {
  const out = [];
  const sys = $('system').value.trim();
  if (sys) out.push({ role: 'system', content: sys });
  for (const m of state.messages) if (!m.error && (m.content || m.role === 'user')) out.push({ role: m.role, content: m.content });
  return out;
}

async function errorText(resp) {
  try {
    const j = await resp.json();
    return (j.error && (j.error.message || j.error.type)) || JSON.stringify(j);
  } catch (e) {
    return resp.status + ' ' + resp.statusText;
  }
}

// Streams one answer into a new assistant message.
async function generate() {
  showError('');
  const msg = { role: 'assistant', content: '', reasoning: '', status: '…' };
  const body = {
    model: 'default', stream: true, messages: requestMessages(),
    temperature: Number($('temperature').value), max_tokens: Number($('max-tokens').value),
    chat_template_kwargs: { enable_thinking: $('thinking').checked },
  };
  state.messages.push(msg);
  addMessageView(msg);
  const controller = new AbortController();
  state.controller = controller;
  setBusy(true);
  try {
    const resp = await fetch('/v1/chat/completions', { method: 'POST', headers: headers(), body: JSON.stringify(body), signal: controller.signal });
    if (!resp.ok) throw new Error(await errorText(resp));
    const reader = resp.body.getReader();
    const dec = new TextDecoder();
    let buf = '', finish = null;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, i);
        buf = buf.slice(i + 2);
        for (const line of ev.split('\n')) {
          if (!line.startsWith('data:')) continue;
          const data = line.slice(5).trim();
          if (data === '[DONE]') continue;
          const j = JSON.parse(data);
          if (j.error) throw new Error(j.error.message || 'error');
          for (const c of j.choices || []) {
            if (c.delta && c.delta.reasoning_content) msg.reasoning += c.delta.reasoning_content;
            if (c.delta && c.delta.content) msg.content += c.delta.content;
            if (c.finish_reason) finish = c.finish_reason;
          }
        }
      }
      msg.status = '…';
      renderMessage(msg);
    }
    msg.status = finish === 'length' ? '(cut at max tokens)' : '';
  } catch (e) {
    if (e.name === 'AbortError') {
      msg.status = '(stopped)';
    } else {
      msg.error = true;
      msg.status = 'error: ' + e.message;
      showError(e.message);
    }
  } finally {
    state.controller = null;
    renderMessage(msg);
    setBusy(false);
  }
}

function send(ev) {
  ev.preventDefault();
  const text = $('input').value;
  if (!text.trim() || state.busy) return;
  $('input').value = '';
  const msg = { role: 'user', content: text };
  state.messages.push(msg);
  addMessageView(msg);
  generate();
}

function stop() {
  if (state.controller) state.controller.abort();
}

function regenerate() {
  if (state.busy) return;
  while (state.messages.length && state.messages[state.messages.length - 1].role === 'assistant') {
    state.messages.pop().view.div.remove();
  }
  if (state.messages.length) generate();
}

function newChat() {
  stop();
  state.messages = [];
  $('log').replaceChildren();
  showError('');
  setBusy(false);
}

async function loadModel() {
  try {
    const r = await fetch('/v1/models', { headers: headers() });
    if (!r.ok) return;
    const j = await r.json();
    if (j.data && j.data[0]) $('model').textContent = j.data[0].id;
  } catch (e) {
    // the page still works; the model name is decoration
  }
}

document.addEventListener('DOMContentLoaded', () => {
  $('composer').addEventListener('submit', send);
  $('input').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey) send(e);
  });
  $('stop').addEventListener('click', stop);
  $('regenerate').addEventListener('click', regenerate);
  $('new-chat').addEventListener('click', newChat);
  setBusy(false);
  loadModel();
});

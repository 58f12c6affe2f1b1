// Notifications in the web client (web/sw.js, web/notify.js, web/waiting.js,
// web/presence.js) in headless Chromium. Run by tests/browser.rs, which
// starts a server with auth and Web Push on (TANDEM_URL, a short quiet
// delay) and mints Ann's token (she makes the sessions: their owner) and
// Pat's (a participant, the server's default):
//
//   TANDEM_URL=… ANN_TOKEN=… PAT_TOKEN=… node --test web/tests/notify.test.mjs
//
// What headless Chromium cannot do, and what stands in for it:
//
// - `PushManager.subscribe` has no push service here: a Playwright context
//   is an off-the-record profile, where Chromium refuses every push
//   subscription at once ("Registration failed - permission denied", and
//   it logs that incognito has no Push API, crbug.com/41124656; a
//   persistent profile instead waits for Google's push service, which this
//   closed network never answers). The first test pins what the page then
//   says. The second puts a stand-in `PushManager` in the page (an init
//   script) whose subscription names a push endpoint this test serves, with
//   keys this test holds: the server's real pushes (VAPID-signed, RFC 8291
//   encrypted) reach it, are decrypted here, and are handed to the page's
//   service worker through DevTools (`ServiceWorker.deliverPushMessage`),
//   as a push service would.
// - A click on a notification (`notificationclick`) cannot be made: neither
//   DevTools nor Playwright can click a notification, so the worker's way
//   to the chat is not exercised.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { launch } from './chromium.mjs';

const BASE = (process.env.TANDEM_URL ?? 'http://127.0.0.1:7420/').replace(/\/?$/, '/');
const ORIGIN = new URL(BASE).origin;
const ANN = process.env.ANN_TOKEN;
const PAT = process.env.PAT_TOKEN;
const HERE = path.dirname(fileURLToPath(import.meta.url));
const SHOTS = process.env.TANDEM_SCREENSHOTS ?? path.resolve(HERE, '../../docs/screenshots');
const WAIT = 15000;
/** How long a push handed to the worker has to show before it is handed again. */
const REDELIVER = 3000;
const tail = (uri) => uri.replace(/^ahp-(session|chat):\//, '');

let browser;

before(async () => {
  fs.mkdirSync(SHOTS, { recursive: true });
  browser = await launch([]);
});

after(async () => {
  await browser?.close();
});

/**
 * A page in its own browser context, notifications allowed, with a
 * DevTools session that sees its service worker registrations, and every
 * frame its sockets send.
 */
async function device(token, { initScript } = {}) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  await context.grantPermissions(['notifications'], { origin: ORIGIN });
  if (initScript) await context.addInitScript(initScript.fn, initScript.arg);
  const page = await context.newPage();
  page.setDefaultTimeout(WAIT);
  page.errors = [];
  page.on('pageerror', (e) => page.errors.push(e.message));
  page.on('console', (m) => {
    // Chromium says itself why it refuses the subscription (the first test's point).
    if (m.type() === 'error' && !/^Chrome currently does not support the Push API in incognito mode/.test(m.text())) page.errors.push(m.text());
  });
  page.sent = watch();
  page.on('websocket', (ws) => ws.on('framesent', (f) => {
    try {
      page.sent.add(JSON.parse(f.payload));
    } catch { /* not JSON-RPC */ }
  }));
  page.cdp = await context.newCDPSession(page);
  page.registrations = new Map();
  page.cdp.on('ServiceWorker.workerRegistrationUpdated', ({ registrations }) => {
    for (const r of registrations) {
      if (r.isDeleted) page.registrations.delete(r.scopeURL);
      else page.registrations.set(r.scopeURL, r.registrationId);
    }
  });
  await page.cdp.send('ServiceWorker.enable');
  await page.goto(`${BASE}?token=${encodeURIComponent(token)}#/`);
  await page.waitForSelector('.conn[data-conn="live"]');
  return page;
}

/** What arrives, kept; `next(pred)` resolves with the first (from now on, or kept) that matches. */
function watch() {
  const got = [];
  const waiters = [];
  return {
    got,
    add(x) {
      got.push(x);
      for (const w of [...waiters]) {
        if (w.pred(x)) {
          waiters.splice(waiters.indexOf(w), 1);
          w.resolve(x);
        }
      }
    },
    /** The first item from index `from` that matches `pred`. */
    next(pred, { from = got.length, what = 'the awaited item', timeout = WAIT } = {}) {
      const seen = got.slice(from).find(pred);
      if (seen) return Promise.resolve(seen);
      return new Promise((resolve, reject) => {
        const w = { pred, resolve };
        waiters.push(w);
        setTimeout(() => {
          if (waiters.includes(w)) {
            waiters.splice(waiters.indexOf(w), 1);
            reject(new Error(`${what}: none within ${timeout} ms`));
          }
        }, timeout);
      });
    },
  };
}

const presence = (pred) => (m) => m.method === 'tandem/setPresence' && pred(m.params);

const rpc = (page, method, params) => page.evaluate(([m, p]) => window.tandem.client.request(m, p), [method, params]);

/** A new session of the scripted agent; its URI and its default chat's. */
async function newSession(page, title) {
  return page.evaluate(async (t) => {
    const c = window.tandem.client;
    const session = `ahp-session:/${crypto.randomUUID()}`;
    await c.request('createSession', { channel: session, provider: 'scripted' });
    const state = await c.subscribe(session);
    if (t) c.dispatch(session, { type: 'session/titleChanged', title: t });
    const chat = state.defaultChat;
    await c.unsubscribe(session);
    return { session, chat };
  }, title);
}

async function openChat(page, { session, chat }) {
  await page.evaluate((h) => { location.hash = h; }, `#/s/${tail(session)}/${tail(chat)}`);
  await page.waitForSelector('.composer-input:not([disabled])');
}

async function send(page, text) {
  await page.waitForSelector('.btn-send:not([disabled])');
  await page.fill('.composer-input', text);
  await page.press('.composer-input', 'Enter');
}

const ask = (message) => `/ask ${JSON.stringify({ message, questions: [{ kind: 'text', id: 'answer', message }] })}`;

/** The page looks hidden (as a tab in the background), or shown again. */
const setHidden = (page, hidden) => page.evaluate((h) => {
  if (h) Object.defineProperty(document, 'visibilityState', { value: 'hidden', configurable: true });
  else delete document.visibilityState;
  document.dispatchEvent(new Event('visibilitychange'));
}, hidden);

/** The notifications the page's service worker shows now. */
const shown = (page) => page.evaluate(async () => {
  const reg = await navigator.serviceWorker.ready;
  return (await reg.getNotifications()).map((n) => ({ title: n.title, body: n.body, tag: n.tag, url: n.data?.url }));
});

/**
 * Wait until the page's worker shows `n` notifications (the first with body
 * `body`, if given). waitForFunction does not wait for a promise: each poll
 * asks once the last answer is in.
 */
async function waitShown(page, n, body, { timeout = WAIT } = {}) {
  await page.waitForFunction(([count, text]) => {
    const w = (window.notePoll ??= { list: null, asking: false });
    if (!w.asking) {
      w.asking = true;
      navigator.serviceWorker.ready.then((r) => r.getNotifications())
        .then((list) => { w.list = list.map((x) => x.body); })
        .finally(() => { w.asking = false; });
    }
    return w.list !== null && w.list.length === count && (text == null || w.list[0] === text);
  }, [n, body], { timeout });
  // The next wait starts from a fresh answer.
  await page.evaluate(() => { window.notePoll = null; });
}

/** Hand `payload` to the page's service worker as its push service would. */
async function deliver(page, payload) {
  const registrationId = page.registrations.get(BASE);
  assert.ok(registrationId, `a registration for ${BASE}: ${[...page.registrations.keys()]}`);
  await page.cdp.send('ServiceWorker.deliverPushMessage', { origin: ORIGIN, registrationId, data: JSON.stringify(payload) });
}

/**
 * Hand `payload` to the worker, then wait until it shows `n` notifications
 * (see waitShown). Chromium now and then drops a push handed to a running
 * worker through DevTools (the worker active, no notification, nothing
 * logged); a push service delivers again what was not taken, and so does
 * this, every few seconds within the wait. One request is one tag, so a
 * second delivery replaces rather than adds.
 */
async function pushed(page, payload, n, body) {
  const deadline = Date.now() + WAIT;
  for (;;) {
    await deliver(page, payload);
    try {
      await waitShown(page, n, body, { timeout: Math.min(REDELIVER, Math.max(1, deadline - Date.now())) });
      return;
    } catch (e) {
      await page.evaluate(() => { window.notePoll = null; });
      if (Date.now() >= deadline) throw e;
    }
  }
}

async function notifyState(page, state) {
  await page.waitForSelector(`.notify-device[data-notify-state="${state}"]`);
  return page.locator('.notify-device .notify-text').textContent();
}

test('the service worker is active; Notify me stops at the missing push service and says so; the worker shows a pushed request and closes it when it settles; the choice here is kept', async () => {
  assert.ok(ANN && PAT, 'ANN_TOKEN and PAT_TOKEN are set');
  const ann = await device(ANN);
  const s = await newSession(ann, 'Worker');
  await openChat(ann, s);

  // The worker at the root, active, and DevTools knows its registration.
  const reg = await ann.evaluate(() => navigator.serviceWorker.ready.then((r) => ({ scope: r.scope, state: r.active?.state, script: r.active?.scriptURL })));
  assert.deepEqual(reg, { scope: BASE, state: 'activated', script: `${BASE}sw.js` });
  await ann.waitForFunction(() => navigator.serviceWorker.controller !== null);

  // Notify me: permission (granted), the worker, the server's key; then the
  // browser refuses the subscription, and the panel says so in its words.
  const settings = await rpc(ann, 'tandem/notifySettings', { channel: s.session });
  assert.match(settings.publicKey, /^[A-Za-z0-9_-]{87}$/, 'a P-256 point, base64url');
  assert.equal(settings.devices, 0);
  assert.equal(settings.mode, 'all', 'the default choice');
  await ann.click('[data-action="notify"]');
  await ann.waitForSelector('[data-panel="notify"]:not([hidden])');
  const said = await notifyState(ann, 'unsupported');
  assert.equal(await ann.locator('.notify-title').textContent(), 'This browser cannot receive push here');
  assert.match(said, /^The browser said: Registration failed - permission denied\.$/);
  assert.equal(await ann.locator('[data-action="notify-device"]').textContent(), 'Try again');
  assert.equal(await ann.evaluate(() => Notification.permission), 'granted');
  assert.equal(await ann.evaluate(async () => (await navigator.serviceWorker.ready).pushManager.getSubscription()), null);
  assert.equal((await rpc(ann, 'tandem/notifySettings', {})).devices, 0, 'nothing handed to the server');

  // A request opens: the worker shows it, once per tag.
  const tag = `${s.chat}#r-1`;
  const url = `${BASE}#/s/${tail(s.session)}/${tail(s.chat)}`;
  const opened = {
    type: 'opened', tag, session: s.session, chat: s.chat, id: 'r-1', kind: 'input',
    title: 'The agent needs you', body: 'Which window?', url,
  };
  await pushed(ann, opened, 1);
  assert.deepEqual(await shown(ann), [{ title: 'The agent needs you', body: 'Which window?', tag, url }]);
  await pushed(ann, { ...opened, body: 'Which window, again?' }, 1, 'Which window, again?');
  assert.equal((await shown(ann)).length, 1, 'the same tag replaces');
  // ... and settles: it goes.
  await pushed(ann, { type: 'settled', tag, session: s.session, chat: s.chat, id: 'r-1', outcome: 'answered' }, 0);

  // The choice for this session, kept by the server.
  await ann.selectOption('[data-field="notify-mode"]', 'approvals');
  await ann.waitForSelector('[data-field="notify-mode"][data-mode="approvals"]:not([disabled])');
  assert.equal((await rpc(ann, 'tandem/notifySettings', { channel: s.session })).mode, 'approvals');
  await ann.reload();
  await ann.waitForSelector('.conn[data-conn="live"]');
  await ann.waitForSelector('[data-field="notify-mode"][data-mode="approvals"]:not([disabled])', { state: 'attached' });
  await ann.click('[data-action="notify"]');
  assert.equal(await ann.inputValue('[data-field="notify-mode"]'), 'approvals');
  assert.equal(await ann.locator('[data-field="notify-mode"] option:checked').textContent(), 'Only tool approvals');
  // Another session has its own (the default).
  const other = await newSession(ann, 'Other');
  assert.equal((await rpc(ann, 'tandem/notifySettings', { channel: other.session })).mode, 'all');

  assert.deepEqual(ann.errors, []);
  await ann.context().close();
});

// ─── A stand-in push service ───────────────────────────────────────────

/** An HTTP push endpoint on loopback: every POST it gets, kept. */
async function pushService() {
  const pushes = watch();
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      res.writeHead(201).end();
      pushes.add({ at: Date.now(), url: req.url, headers: req.headers, body: Buffer.concat(chunks) });
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { pushes, endpoint: `http://127.0.0.1:${server.address().port}/push/ann`, close: () => server.close() };
}

/** A browser's push keys: a P-256 key pair and a 16-byte secret. */
function browserKeys() {
  const ecdh = crypto.createECDH('prime256v1');
  ecdh.generateKeys();
  return { ecdh, auth: crypto.randomBytes(16) };
}

/** The payload of an RFC 8291 `aes128gcm` push body (one record). */
function decrypt(body, { ecdh, auth }) {
  const salt = body.subarray(0, 16);
  const idlen = body[20];
  const serverKey = body.subarray(21, 21 + idlen);
  const sealed = body.subarray(21 + idlen);
  const shared = ecdh.computeSecret(serverKey);
  const info = Buffer.concat([Buffer.from('WebPush: info\0'), ecdh.getPublicKey(), serverKey]);
  const ikm = Buffer.from(crypto.hkdfSync('sha256', shared, auth, info, 32));
  const cek = Buffer.from(crypto.hkdfSync('sha256', ikm, salt, Buffer.from('Content-Encoding: aes128gcm\0'), 16));
  const nonce = Buffer.from(crypto.hkdfSync('sha256', ikm, salt, Buffer.from('Content-Encoding: nonce\0'), 12));
  const d = crypto.createDecipheriv('aes-128-gcm', cek, nonce);
  d.setAuthTag(sealed.subarray(sealed.length - 16));
  const plain = Buffer.concat([d.update(sealed.subarray(0, sealed.length - 16)), d.final()]);
  let end = plain.length - 1;
  while (end > 0 && plain[end] === 0) end -= 1;
  assert.equal(plain[end], 2, 'the last record ends with its delimiter');
  return JSON.parse(plain.subarray(0, end).toString('utf8'));
}

/**
 * In the page, before it runs: a `PushManager` whose subscription is
 * `endpoint` with the test's keys, kept in localStorage across reloads.
 */
function standInPushManager({ endpoint, p256dh, auth }) {
  const KEY = 'test.pushSubscription';
  const make = (kept) => ({
    endpoint: kept.endpoint,
    expirationTime: null,
    options: { userVisibleOnly: true, applicationServerKey: Uint8Array.from(atob(kept.key), (c) => c.charCodeAt(0)).buffer },
    toJSON: () => ({ endpoint: kept.endpoint, expirationTime: null, keys: { p256dh, auth } }),
    unsubscribe: async () => { localStorage.removeItem(KEY); return true; },
  });
  PushManager.prototype.subscribe = async function subscribe(opts) {
    const kept = { endpoint, key: btoa(String.fromCharCode(...new Uint8Array(opts.applicationServerKey))) };
    localStorage.setItem(KEY, JSON.stringify(kept));
    return make(kept);
  };
  PushManager.prototype.getSubscription = async function getSubscription() {
    const kept = localStorage.getItem(KEY);
    return kept ? make(JSON.parse(kept)) : null;
  };
}

test('Notify me turns on (a stand-in push service), presence says when the page is hidden, a question asked then is pushed and shown, its end closes it', async () => {
  const service = await pushService();
  const keys = browserKeys();
  const b64 = (b) => Buffer.from(b).toString('base64url');
  const ann = await device(ANN, {
    initScript: { fn: standInPushManager, arg: { endpoint: service.endpoint, p256dh: b64(keys.ecdh.getPublicKey()), auth: b64(keys.auth) } },
  });
  const s = await newSession(ann, 'Release');
  await openChat(ann, s);

  const onChat = ann.sent.got.length;
  await ann.click('[data-action="notify"]');
  await notifyState(ann, 'on');
  assert.equal(await ann.locator('.notify-title').textContent(), 'On in this browser');
  assert.equal(await ann.locator('[data-action="notify-device"]').textContent(), 'Turn off in this browser');
  const { publicKey, devices } = await rpc(ann, 'tandem/notifySettings', {});
  assert.equal(devices, 1);
  await ann.click('[data-action="close-notify"]');

  // Out of the composer (on the panel's buttons): on the chat, in no field,
  // looking; back in it: on the draft.
  await ann.sent.next(presence((p) => p.channel === s.chat && !p.target), { from: onChat, what: 'a presence in no field' });
  const draftHere = (focused) => presence((p) => p.channel === s.chat && p.focused === focused && p.target?.draft === true);
  const inField = ann.sent.got.length;
  await ann.click('.composer-input');
  await ann.sent.next(draftHere(true), { from: inField, what: 'a focused presence on the draft' });
  const left = ann.sent.got.slice(onChat).filter(presence((p) => p.channel === s.chat));
  assert.ok(left.length > 0 && left.every((m) => m.params.state === 'active' && m.params.focused === true), JSON.stringify(left));
  // Hidden: the same presence again, not looking.
  const mark = ann.sent.got.length;
  await setHidden(ann, true);
  const away = await ann.sent.next(draftHere(false), { from: mark, what: 'a presence with focused: false' });
  assert.equal(away.params.state, 'active');
  const hiddenAt = Date.now();

  // Asked while hidden: after the quiet delay the server pushes it here.
  await send(ann, ask('Which window?'));
  await ann.waitForSelector('.input-card[data-state="open"]');
  const push = await service.pushes.next(() => true, { from: 0, what: 'a push' });
  assert.ok(push.at >= hiddenAt);
  assert.equal(push.url, '/push/ann');
  assert.equal(push.headers['content-encoding'], 'aes128gcm');
  assert.equal(push.headers.urgency, 'high');
  assert.equal(push.headers.ttl, '86400');
  assert.ok(push.headers.topic, 'a topic, so the end replaces the start');
  assert.match(push.headers.authorization, new RegExp(`^vapid t=[\\w-]+\\.[\\w-]+\\.[\\w-]+, k=${publicKey}$`));
  const opened = decrypt(push.body, keys);
  const requestId = await ann.locator('.input-card[data-state="open"]').getAttribute('data-request-id');
  assert.deepEqual(
    { type: opened.type, tag: opened.tag, session: opened.session, chat: opened.chat, id: opened.id, kind: opened.kind },
    { type: 'opened', tag: `${s.chat}#${requestId}`, session: s.session, chat: s.chat, id: requestId, kind: 'input' },
  );
  assert.equal(opened.title, 'The agent needs you');
  assert.match(opened.body, /Which window\?/);
  assert.equal(new URL(opened.url).hash, `#/s/${tail(s.session)}/${tail(s.chat)}`);
  await pushed(ann, opened, 1);
  assert.deepEqual(await shown(ann), [{ title: opened.title, body: opened.body, tag: opened.tag, url: opened.url }]);

  // Shown again: looking, with the draft where it was.
  const back = ann.sent.got.length;
  await setHidden(ann, false);
  await ann.sent.next(draftHere(true), { from: back, what: 'a presence with focused: true' });

  // Answered here: its end is pushed (less urgent, the same topic), and the notification goes.
  await ann.locator('.question[data-qid="answer"] input').fill('the left one');
  await ann.locator('.input-card [data-action="submit"]').click();
  await ann.waitForSelector('.input-card[data-state="settled"]');
  const end = await service.pushes.next((p) => p !== push, { from: 0, what: 'the push of its end' });
  assert.equal(end.headers.urgency, 'normal');
  assert.equal(end.headers.topic, push.headers.topic);
  const settled = decrypt(end.body, keys);
  assert.equal(settled.type, 'settled');
  assert.equal(settled.tag, opened.tag);
  await pushed(ann, settled, 0);

  // A reload finds it on; turning it off forgets it on both sides.
  await ann.reload();
  await ann.waitForSelector('.conn[data-conn="live"]');
  await ann.click('[data-action="notify"]');
  await notifyState(ann, 'on');
  await ann.click('[data-action="notify-device"]');
  await notifyState(ann, 'off');
  assert.equal((await rpc(ann, 'tandem/notifySettings', {})).devices, 0);
  assert.equal(await ann.evaluate(() => localStorage.getItem('test.pushSubscription')), null);
  assert.equal(service.pushes.got.length, 2, 'one push for the start, one for the end');

  assert.deepEqual(ann.errors, []);
  await ann.context().close();
  service.close();
});

test('waiting on you: the requests each person can answer across sessions, oldest first, on the tab\'s title and icon, gone once answered', async () => {
  const ann = await device(ANN);
  const pat = await device(PAT);
  const count = (page) => page.locator('.waiting-count').textContent();
  const title = (page) => page.evaluate(() => document.title);
  const icon = (page) => page.evaluate(() => document.querySelector('link[rel="icon"]').getAttribute('href'));
  const waitCount = (page, n) => page.waitForFunction((k) => {
    const btn = document.querySelector('[data-action="waiting"]');
    return k === 0 ? btn.hidden : !btn.hidden && btn.querySelector('.waiting-count').textContent === String(k);
  }, n);
  assert.equal(await title(ann), 'Tandem');
  assert.ok(await ann.locator('[data-action="waiting"]').isHidden(), 'nothing waits: no button');

  // A question in one session ...
  const one = await newSession(ann, 'Plan the release');
  await openChat(ann, one);
  await send(ann, ask('Which window?'));
  await ann.waitForSelector('.input-card[data-state="open"]');
  await waitCount(ann, 1);
  await ann.waitForFunction(() => document.title === '(1) Plan the release · Tandem');
  await ann.waitForFunction(() => document.querySelector('link[rel="icon"]').href.startsWith('data:image/png'));
  // ... and a tool approval in another.
  const two = await newSession(ann, 'Deploy');
  await openChat(ann, two);
  await send(ann, '/tool deploy {"env":"prod"}');
  await ann.waitForSelector('.tool-card[data-status="pending-confirmation"]');
  await waitCount(ann, 2);
  await ann.waitForFunction(() => document.title === '(2) Deploy · Tandem');

  // Ann (their owner) may answer both, oldest first, each a link to its chat.
  await ann.click('[data-action="waiting"]');
  await ann.waitForSelector('[data-panel="waiting"]:not([hidden])');
  const rows = () => ann.locator('.waiting-item').evaluateAll((els) => els.map((e) => ({
    kind: e.dataset.kind, href: e.getAttribute('href'), text: [...e.querySelectorAll('.waiting-kind, .waiting-what, .waiting-where')].map((x) => x.textContent),
  })));
  await ann.waitForFunction(() => document.querySelectorAll('.waiting-item').length === 2);
  assert.deepEqual(await rows(), [
    { kind: 'input', href: `#/s/${tail(one.session)}/${tail(one.chat)}`, text: ['Question', 'Which window?', 'Plan the release'] },
    { kind: 'toolApproval', href: `#/s/${tail(two.session)}/${tail(two.chat)}`, text: ['Approval', 'Run deploy?', 'Deploy'] },
  ]);
  await ann.screenshot({ path: path.join(SHOTS, 'waiting.png') });

  // Pat, a participant, may answer the question, not approve the tool.
  await waitCount(pat, 1);
  assert.equal(await title(pat), '(1) Tandem');
  await pat.click('[data-action="waiting"]');
  assert.deepEqual(
    await pat.locator('.waiting-item').evaluateAll((els) => els.map((e) => [e.dataset.kind, e.dataset.session])),
    [['input', one.session]],
  );
  await pat.keyboard.press('Escape');
  await pat.waitForSelector('[data-panel="waiting"][hidden]', { state: 'attached' });

  // Ann follows the first link and answers: one left.
  await ann.click('.waiting-item[data-kind="input"]');
  await ann.waitForSelector('[data-panel="waiting"][hidden]', { state: 'attached' });
  await ann.waitForSelector('.input-card[data-state="open"]');
  assert.equal(new URL(ann.url()).hash, `#/s/${tail(one.session)}/${tail(one.chat)}`);
  await ann.locator('.question[data-qid="answer"] input').fill('next Tuesday');
  await ann.locator('.input-card [data-action="submit"]').click();
  await waitCount(ann, 1);
  await ann.waitForFunction(() => document.title === '(1) Plan the release · Tandem');
  await waitCount(pat, 0);
  assert.equal(await title(pat), 'Tandem');
  assert.equal(await icon(pat), '/favicon.svg');

  // The approval, from the list again: none left, the plain title and icon.
  await ann.click('[data-action="waiting"]');
  await ann.click('.waiting-item[data-kind="toolApproval"]');
  await ann.waitForSelector('.tool-card[data-status="pending-confirmation"]');
  await ann.locator('.tool-card [data-option="approve-once"]').click();
  await ann.waitForSelector('.tool-card[data-status="completed"]');
  await waitCount(ann, 0);
  await ann.waitForFunction(() => document.title === 'Deploy · Tandem');
  assert.equal(await icon(ann), '/favicon.svg');
  assert.equal(await count(ann), '0');

  for (const p of [ann, pat]) {
    assert.deepEqual(p.errors, []);
    await p.context().close();
  }
});

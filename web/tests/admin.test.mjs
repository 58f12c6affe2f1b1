// The admin view (#/admin) in headless Chromium against a server with auth:
// an admin token sees the connections, the session waiting for a person
// and the metrics charts; a client token is refused. Run by
// tests/browser.rs, which passes the server's address and two tokens:
//
//   TANDEM_URL=http://127.0.0.1:PORT/ ADMIN_TOKEN=… CLIENT_TOKEN=… node --test web/tests/admin.test.mjs

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { launch } from './chromium.mjs';

const BASE = (process.env.TANDEM_URL ?? 'http://127.0.0.1:7420/').replace(/\/?$/, '/');
const ADMIN = process.env.ADMIN_TOKEN;
const CLIENT = process.env.CLIENT_TOKEN;
const HERE = path.dirname(fileURLToPath(import.meta.url));
const SHOTS = process.env.TANDEM_SCREENSHOTS ?? path.resolve(HERE, '../../docs/screenshots');
const WAIT = 15000;

let browser;

before(async () => {
  fs.mkdirSync(SHOTS, { recursive: true });
  browser = await launch([]);
});

after(async () => {
  await browser?.close();
});

async function page(tokenValue, hash) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const p = await context.newPage();
  p.errors = [];
  p.on('pageerror', (e) => p.errors.push(e.message));
  await p.goto(`${BASE}?token=${encodeURIComponent(tokenValue)}${hash}`);
  return p;
}

test('an admin sees connections, who waits and the metrics; a client token is refused', async () => {
  assert.ok(ADMIN && CLIENT, 'ADMIN_TOKEN and CLIENT_TOKEN are set');
  // A person's page opens a question: the session now waits for someone.
  const ann = await page(CLIENT, '#/');
  await ann.waitForSelector('.conn[data-conn="live"]', { timeout: WAIT });
  assert.equal(await ann.locator('[data-action="admin"]').count(), 0, 'no admin link for a client token');
  await ann.click('[data-action="new-session"]');
  await ann.waitForSelector('.composer-input');
  const spec = { message: 'Which release window?', questions: [{ kind: 'text', id: 'window', message: 'Window?' }] };
  await ann.fill('.composer-input', `/ask ${JSON.stringify(spec)}`);
  await ann.press('.composer-input', 'Enter');
  await ann.waitForSelector('.input-card[data-state="open"]', { timeout: WAIT });

  // The admin view.
  const ops = await page(ADMIN, '#/admin');
  await ops.waitForSelector('.admin-waiting[data-kind="input"]', { timeout: WAIT });
  assert.match(await ops.locator('.admin-waiting-title').first().textContent(), /Which release window\?/);
  assert.match(await ops.locator('.admin-waited').first().textContent(), /\d+ s/);
  await ops.waitForFunction(() => document.querySelectorAll('.admin-conn').length >= 2, null, { timeout: WAIT });
  const rows = await ops.locator('.admin-conn').evaluateAll((trs) => trs.map((tr) => [...tr.children].map((td) => td.textContent)));
  // Person, subject, role, client, subscriptions, …: a token without a
  // `name` claim shows its subject as the person's name.
  const annRow = rows.find((r) => r[1] === 'ann');
  assert.ok(annRow, JSON.stringify(rows));
  assert.equal(annRow[0], 'ann');
  assert.equal(annRow[2], 'client');
  assert.match(annRow[3], /^web-/);
  assert.ok(Number(annRow[4]) >= 2, `ann's subscriptions: ${annRow[4]}`);
  assert.ok(rows.some((r) => r[1] === 'ops' && r[2] === 'admin'), JSON.stringify(rows));
  // The session lists the role its creator holds.
  assert.match(await ops.locator('.admin-session-head .muted').first().textContent(), /1 owner\b/);

  // Traffic while the charts fill: Ann types a draft.
  for (const ch of 'tonight after 8') {
    await ann.locator('.question[data-qid="window"] input').pressSequentially(ch);
    await ann.waitForTimeout(60);
  }
  await ops.waitForFunction(() => {
    const line = document.querySelector('[data-chart="deliveries"] polyline');
    return line && line.getAttribute('points').split(' ').length >= 3;
  }, null, { timeout: WAIT });
  const delivered = await ops.locator('[data-chart="deliveries"] strong').textContent();
  assert.notEqual(delivered, '—');
  // More typing, so the charts show it when the picture is taken.
  for (const ch of ', or tomorrow at 9') {
    await ann.locator('.question[data-qid="window"] input').pressSequentially(ch);
    await ann.waitForTimeout(150);
  }
  await ops.screenshot({ path: path.join(SHOTS, 'admin-view.png') });

  // A client token cannot open it (the page says so; the server refuses).
  const bob = await page(CLIENT, '#/admin');
  await bob.waitForSelector('.admin-refused', { timeout: WAIT });
  assert.match(await bob.locator('.admin-refused').textContent(), /admin token/);
  const statuses = await bob.evaluate(async (t) => Promise.all(['/admin/overview', '/metrics'].map(async (p) => (await fetch(p, { headers: { Authorization: `Bearer ${t}` } })).status)), CLIENT);
  assert.deepEqual(statuses, [403, 403]);

  for (const p of [ann, ops, bob]) assert.deepEqual(p.errors, []);
});

// The web client over TLS: the page loads over https:// from a server
// started with --tls-cert/--tls-key (a certificate made by the test run) and
// speaks AHP over wss:// to it. Run by tests/browser.rs:
//
//   TANDEM_URL=https://localhost:PORT/ node --test web/tests/tls.test.mjs
//
// Chromium is told to accept the test's self-signed certificate; only
// loopback traffic.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { launch } from './chromium.mjs';

const BASE = (process.env.TANDEM_URL ?? 'https://localhost:7420/').replace(/\/?$/, '/');

let browser;

before(async () => {
  browser = await launch(['--ignore-certificate-errors']);
});

after(async () => {
  await browser?.close();
});

test('the page loads over https and talks AHP over wss', async () => {
  const context = await browser.newContext({ ignoreHTTPSErrors: true });
  const page = await context.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  const sockets = [];
  page.on('websocket', (ws) => sockets.push(ws.url()));
  await page.goto(BASE);
  assert.equal(await page.evaluate(() => location.protocol), 'https:');
  await page.waitForSelector('.conn[data-conn="live"]', { timeout: 15000 });
  await page.click('[data-action="new-session"]');
  await page.waitForSelector('.composer-input');
  // The chat's state has arrived (the empty state shows only then): Enter
  // before that has no chat to send to.
  await page.waitForSelector('.chat-empty:not([hidden])', { timeout: 15000 });
  await page.waitForSelector('.btn-send:not([disabled])', { timeout: 15000 });
  await page.fill('.composer-input', 'hello over TLS');
  await page.press('.composer-input', 'Enter');
  // The scripted agent answers; the turn ends.
  await page.waitForFunction(() => [...document.querySelectorAll('.markdown')].some((m) => m.textContent.length > 0), null, { timeout: 15000 });
  await page.waitForSelector('.crumbs .badge[data-activity="idle"]', { timeout: 15000 });
  assert.ok(sockets.length > 0 && sockets.every((u) => u.startsWith('wss://')), JSON.stringify(sockets));
  assert.deepEqual(errors, []);
  await context.close();
});

// Invite links in the web client (web/invites.js, web/activity.js) in
// headless Chromium. Run by tests/browser.rs, which starts a server with
// auth (TANDEM_URL) and mints Ann's token, an owner of the session SESSION:
//
//   TANDEM_URL=… SESSION=ahp-session:/… ANN_TOKEN=… node --test web/tests/invites.test.mjs

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { launch } from './chromium.mjs';

const BASE = (process.env.TANDEM_URL ?? 'http://127.0.0.1:7420/').replace(/\/?$/, '/');
const SESSION = process.env.SESSION;
const ANN = process.env.ANN_TOKEN;
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

/** A page in its own browser context: its own device and localStorage. */
async function device(url, { live = true } = {}) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await context.newPage();
  page.setDefaultTimeout(WAIT);
  page.errors = [];
  page.on('pageerror', (e) => page.errors.push(e.message));
  page.on('console', (m) => {
    // The browser logs the answers of the link's checks and a refused
    // upgrade itself: seeing those is the point here.
    const expected = /^WebSocket connection to .* failed|^Failed to load resource: the server responded with a status of (400|403)/;
    if (m.type() === 'error' && !expected.test(m.text())) page.errors.push(m.text());
  });
  if (url) {
    await page.goto(url);
    if (live) await page.waitForSelector('.conn[data-conn="live"]');
  }
  return page;
}

/** Wait until the last `selector` reads `re`. */
async function waitText(page, selector, re, opts) {
  await page.waitForFunction(([s, src]) => {
    const els = document.querySelectorAll(s);
    const el = els[els.length - 1];
    return !!el && !el.hidden && new RegExp(src).test(el.textContent);
  }, [selector, re.source], opts);
}

const stats = (page) => page.evaluate(() => window.tandem.stats());

/** The page says the link lets it in no more, and nothing is connected or about to be. */
async function refused(page, re, opts) {
  await waitText(page, '.invite-banner .invite-banner-title', re, opts);
  await page.waitForSelector('.conn[data-conn="ended"]');
  const s = await stats(page);
  assert.equal(s.status, 'ended');
  assert.equal(s.socket, false, 'no socket');
  assert.equal(s.reconnectScheduled, false, 'no reconnect waiting');
  assert.equal(await page.locator('.chat-page').count(), 0, 'the chat is gone from the page');
  return s;
}

async function openShare(ann) {
  await ann.click('[data-action="share"]');
  await ann.waitForSelector('dialog[data-dialog="share"][open]');
}

test('Ann shares a viewer link from the dialog, Gus comes in by name and watches, Ann revokes it and Gus is out for good', async () => {
  assert.ok(SESSION && ANN, 'SESSION and ANN_TOKEN are set');
  const chatHash = `#/s/${SESSION.replace('ahp-session:/', '')}`;
  const ann = await device(`${BASE}?token=${encodeURIComponent(ANN)}#/`);
  await ann.evaluate((s) => window.tandem.client.request('createSession', { channel: s, provider: 'scripted' }), SESSION);
  await ann.evaluate((h) => { location.hash = h; }, chatHash);
  await ann.waitForSelector('.role-badge[data-role="owner"]:not([hidden])');
  await ann.waitForSelector('.composer-input:not([disabled])');

  // The Share dialog: a viewer link for 60 s.
  await openShare(ann);
  await ann.waitForSelector('.share-empty:not([hidden])');
  await ann.selectOption('[data-field="access"]', 'viewer');
  await ann.selectOption('[data-field="ttl"]', '60');
  await ann.click('[data-action="create-invite"]');
  await ann.waitForFunction(() => document.querySelector('[data-invite-link]')?.value.includes('?invite='));
  const link = await ann.inputValue('[data-invite-link]');
  assert.match(link, new RegExp(`^${BASE.replace(/[.?/]/g, '\\$&')}\\?invite=[0-9a-f]{12}\\.[0-9a-f]{32}${chatHash}$`));
  assert.ok(await ann.locator('.share-note').isHidden(), 'with auth there is no warning');
  await waitText(ann, '.share-made-info', /^A viewer link, ending in \d+ s\./);
  const row = ann.locator('.invite-row').first();
  await row.waitFor();
  assert.equal(await row.getAttribute('data-state'), 'open');
  assert.deepEqual(
    await row.locator('td').evaluateAll((tds) => tds.slice(0, 5).map((td) => td.textContent)).then((t) => [t[0], t[1], t[2], t[4]]),
    ['viewer', 'open', '0', 'Ann'],
  );
  assert.match(await row.locator('[data-col="ends"]').textContent(), /^in \d+ s$/);
  await ann.click('[data-action="close-share"]');
  await ann.waitForSelector('dialog[data-dialog="share"]', { state: 'hidden' });

  // Gus opens the link on his own device: he is asked his name first.
  const gus = await device(link, { live: false });
  await waitText(gus, '.invite-card h1', /^You were invited$/);
  await gus.waitForSelector('[data-action="join"]:visible');
  assert.equal(await gus.inputValue('[data-invite-name]'), '', 'nothing remembered on a new device');
  assert.equal((await stats(gus)).opens, 0, 'no socket before the name');
  await gus.fill('[data-invite-name]', 'Gus');
  await gus.click('[data-action="join"]');
  await gus.waitForSelector('.conn[data-conn="live"]');
  // In the chat, watching: a viewer's badge and a closed composer, no Share.
  await gus.waitForSelector('.role-badge[data-role="viewer"]:not([hidden])');
  await gus.waitForSelector('.chat-empty:not([hidden])');
  assert.ok(await gus.locator('.composer-input').isDisabled());
  assert.equal(await gus.getAttribute('.composer-input', 'placeholder'), 'Watching: you cannot send messages here');
  assert.equal(await gus.locator('[data-action="share"]:visible').count(), 0, 'only an owner shares');
  assert.equal(await gus.inputValue('.name-input'), 'Gus');
  const kept = await gus.evaluate(() => ({ name: localStorage.getItem('tandem.name'), guest: localStorage.getItem('tandem.guest') }));
  assert.equal(kept.name, 'Gus');
  assert.ok(kept.guest.length >= 8 && kept.guest.length <= 128, kept.guest);
  // Each sees the other here; Gus sees what Ann says.
  await waitText(ann, '.here .here-person:not(.here-me)', /^Gus$/);
  await waitText(gus, '.here .here-person:not(.here-me)', /^Ann$/);
  await ann.fill('.composer-input', 'hello Gus');
  await ann.press('.composer-input', 'Enter');
  await waitText(gus, '.msg-user .bubble', /^hello Gus$/);
  await waitText(gus, '.msg-user .msg-author', /^Ann$/);

  // The record: Ann made the link, Gus came in through it.
  await ann.click('[data-action="activity"]');
  await waitText(ann, '.audit-entry[data-kind="inviteCreated"]', /^\d\d:\d\dAnn created a viewer invite$/);
  await waitText(ann, '.audit-entry[data-kind="inviteUsed"]', /^\d\d:\d\dGus used a viewer invite$/);

  // The listing counts him; the picture is of the dialog.
  await openShare(ann);
  await waitText(ann, '.invite-row[data-state="open"] [data-col="used"]', /^1$/);
  await ann.screenshot({ path: path.join(SHOTS, 'invite.png') });

  // Ann revokes: Gus's page says so within 5 s, and stays out.
  await ann.click('.invite-row[data-state="open"] [data-action="revoke-invite"]');
  const revokedAt = Date.now();
  const before = await refused(gus, /^This invite link was revoked$/, { timeout: 5000 });
  assert.ok(Date.now() - revokedAt < 5000);
  assert.equal(before.endReason, 'this invite link was revoked');
  assert.equal(before.opens, 1, 'one socket, never another');
  await waitText(gus, '.invite-banner p', /no longer in this session/);
  await ann.waitForSelector('.invite-row[data-state="revoked"]');
  assert.equal(await ann.locator('.invite-row [data-action="revoke-invite"]').count(), 0);
  // Ann's page sees him go and the revocation on the record, while Gus's page tries nothing.
  await ann.waitForFunction(() => ![...document.querySelectorAll('.here .here-person')].some((el) => el.textContent === 'Gus'));
  await waitText(ann, '.audit-entry[data-kind="inviteRevoked"]', /^\d\d:\d\dAnn revoked a viewer invite \(used by 1\)$/);
  const entries = await ann.locator('.audit-entry .audit-line').allTextContents();
  assert.deepEqual(entries, ['Ann created a viewer invite', 'Gus used a viewer invite', 'Ann revoked a viewer invite (used by 1)']);
  const after = await stats(gus);
  assert.equal(after.opens, 1, 'no reconnect after a 4403');
  assert.equal(after.status, 'ended');

  // A reload of the link: refused again at once, nothing connects.
  await gus.reload();
  const again = await refused(gus, /^This invite link was revoked$/);
  assert.equal(again.opens, 0, 'the link is checked before any socket');
  assert.equal(await gus.locator('[data-action="join"]').count(), 0, 'no name asked for a dead link');

  for (const p of [ann, gus]) {
    assert.deepEqual(p.errors, []);
    await p.context().close();
  }
});

test('a link that has expired is refused when opened, and one revoked while the name is typed is refused on joining', async () => {
  const ann = await device(`${BASE}?token=${encodeURIComponent(ANN)}#/`);
  const session = await ann.evaluate(async () => {
    const s = `ahp-session:/${crypto.randomUUID()}`;
    await window.tandem.client.request('createSession', { channel: s, provider: 'scripted' });
    return s;
  });
  const make = (ttlSecs) => ann.evaluate(([channel, ttl]) => window.tandem.client.request('tandem/createInvite', { channel, access: 'viewer', ttlSecs: ttl }), [session, ttlSecs]);
  const linkOf = (code) => `${BASE}?invite=${code}#/s/${session.replace('ahp-session:/', '')}`;

  // A one-second link: wait until the server lists it as expired.
  const brief = await make(1);
  // (waitForFunction does not wait for a promise: each poll asks once the
  // last answer is in.)
  await ann.waitForFunction(([channel, id]) => {
    const w = (window.expiryPoll ??= { state: null, asking: false });
    if (!w.asking) {
      w.asking = true;
      window.tandem.client.request('tandem/listInvites', { channel })
        .then((r) => { w.state = r.invites.find((i) => i.id === id)?.state; })
        .finally(() => { w.asking = false; });
    }
    return w.state === 'expired';
  }, [session, brief.id], { polling: 200 });
  const lee = await device(linkOf(brief.code), { live: false });
  const s = await refused(lee, /^This invite link has expired$/);
  assert.equal(s.opens, 0);
  assert.equal(await lee.locator('[data-action="join"]').count(), 0);

  // Ann's dialog lists it as expired.
  await ann.evaluate((sid) => { location.hash = `#/s/${sid}`; }, session.replace('ahp-session:/', ''));
  await openShare(ann);
  await ann.waitForSelector(`.invite-row[data-invite-id="${brief.id}"][data-state="expired"]`);
  await waitText(ann, `.invite-row[data-invite-id="${brief.id}"] [data-col="ends"]`, /^expired \d\d:\d\d$/);

  // A live link, revoked while Mia types her name: the socket is refused
  // (a browser cannot read the 403), the page asks why and says so.
  const open = await make(60);
  const mia = await device(linkOf(open.code), { live: false });
  await mia.waitForSelector('[data-action="join"]:visible');
  await ann.evaluate(([channel, id]) => window.tandem.client.request('tandem/revokeInvite', { channel, id }), [session, open.id]);
  await ann.waitForSelector(`.invite-row[data-invite-id="${open.id}"][data-state="revoked"]`);
  await mia.fill('[data-invite-name]', 'Mia');
  await mia.click('[data-action="join"]');
  const m = await refused(mia, /^This invite link was revoked$/);
  assert.equal(m.opens, 1, 'one refused socket, then no retry');

  for (const p of [ann, lee, mia]) {
    assert.deepEqual(p.errors, []);
    await p.context().close();
  }
});

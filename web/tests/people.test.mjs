// People in the web client (web/people.js) in headless Chromium. Run by
// tests/browser.rs, which starts a server with auth (TANDEM_URL), one
// without (TANDEM_OPEN_URL), and mints tokens for the session SESSION:
// Ann's (owner), Vic's (viewer) and Pat's (no claim: a participant).
//
//   TANDEM_URL=… TANDEM_OPEN_URL=… SESSION=ahp-session:/… ANN_TOKEN=… VIC_TOKEN=… PAT_TOKEN=… \
//     node --test web/tests/people.test.mjs

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { launch } from './chromium.mjs';

const BASE = (process.env.TANDEM_URL ?? 'http://127.0.0.1:7420/').replace(/\/?$/, '/');
const OPEN = (process.env.TANDEM_OPEN_URL ?? 'http://127.0.0.1:7421/').replace(/\/?$/, '/');
const SESSION = process.env.SESSION;
const ANN = process.env.ANN_TOKEN;
const VIC = process.env.VIC_TOKEN;
const PAT = process.env.PAT_TOKEN;
const HERE = path.dirname(fileURLToPath(import.meta.url));
const SHOTS = process.env.TANDEM_SCREENSHOTS ?? path.resolve(HERE, '../../docs/screenshots');
const WAIT = 15000;
const TIME = /\d\d:\d\d/;

let browser;

before(async () => {
  fs.mkdirSync(SHOTS, { recursive: true });
  browser = await launch([]);
});

after(async () => {
  await browser?.close();
});

/** A page in its own browser context: its own device and localStorage. */
async function device(url) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 1000 } });
  const page = await context.newPage();
  page.setDefaultTimeout(WAIT);
  page.errors = [];
  page.on('pageerror', (e) => page.errors.push(e.message));
  page.on('console', (m) => { if (m.type() === 'error') page.errors.push(m.text()); });
  if (url) {
    await page.goto(url);
    await page.waitForSelector('.conn[data-conn="live"]');
  }
  return page;
}

const text = (page, selector) => page.locator(selector).last().textContent();

/** Wait until the last `selector` reads `re`. */
async function waitText(page, selector, re) {
  await page.waitForFunction(([s, src]) => {
    const els = document.querySelectorAll(s);
    const el = els[els.length - 1];
    return !!el && !el.hidden && new RegExp(src).test(el.textContent);
  }, [selector, re.source]);
}

async function send(page, message) {
  await page.waitForSelector('.btn-send:not([disabled])');
  await page.fill('.composer-input', message);
  await page.press('.composer-input', 'Enter');
}

test('Ann approves and answers, Vic (a viewer) and Pat (a participant) watch: roles gate the cards, all see who did it', async () => {
  assert.ok(SESSION && ANN && VIC && PAT, 'SESSION, ANN_TOKEN, VIC_TOKEN and PAT_TOKEN are set');
  const chatHash = `#/s/${SESSION.replace('ahp-session:/', '')}`;
  // Ann makes the session (its URI is the one the tokens name) and opens it.
  const ann = await device(`${BASE}?token=${encodeURIComponent(ANN)}#/`);
  await ann.evaluate((s) => window.tandem.client.request('createSession', { channel: s, provider: 'scripted' }), SESSION);
  await ann.evaluate((h) => { location.hash = h; }, chatHash);
  const vic = await device(`${BASE}?token=${encodeURIComponent(VIC)}${chatHash}`);
  const pat = await device(`${BASE}?token=${encodeURIComponent(PAT)}${chatHash}`);
  const everyone = [ann, vic, pat];

  // The token names each person: the name field shows it and is read-only.
  for (const [p, name, role] of [[ann, 'Ann', 'owner'], [vic, 'Vic', 'viewer'], [pat, 'Pat', 'participant']]) {
    await p.waitForSelector(`.role-badge[data-role="${role}"]:not([hidden])`);
    assert.equal(await p.inputValue('.name-input'), name);
    assert.equal(await p.locator('.name-input').getAttribute('readonly'), '');
  }
  await vic.click('.name-input');
  await waitText(vic, '.name-why', /comes from their token/);
  await vic.press('.name-input', 'Escape');
  await vic.waitForSelector('.name-why', { state: 'hidden' });

  // A viewer's composer is closed, and says why.
  for (const p of [ann, pat]) await p.waitForSelector('.composer-input:not([disabled])');
  await vic.waitForSelector('.chat-empty:not([hidden])');
  assert.ok(await vic.locator('.composer-input').isDisabled());
  assert.equal(await vic.getAttribute('.composer-input', 'placeholder'), 'Watching: you cannot send messages here');
  await waitText(vic, '.composer-note', /^You are a viewer in this session: sending messages needs the participant role$/);

  // The agent asks to run a tool: all see the card; only Ann has its buttons.
  await send(ann, '/tool deploy {"env":"prod"}');
  for (const p of everyone) {
    await p.waitForSelector('.tool-card[data-status="pending-confirmation"]');
    await waitText(p, '.msg-user .msg-author', /^Ann$/);
    assert.equal(await text(p, '.msg-user .bubble'), '/tool deploy {"env":"prod"}');
  }
  const tool = (p) => p.locator('.tool-card').last();
  assert.equal(await tool(vic).locator('[data-option]:visible').count(), 0, 'no approve/deny buttons for a viewer');
  assert.equal(await tool(vic).locator('[data-action="edit-input"]:visible').count(), 0);
  assert.equal(await tool(vic).locator('.role-note').textContent(), 'You are a viewer in this session: approving needs the approver role');
  assert.match(await tool(vic).locator('.tool-input').textContent(), /"env": "prod"/, 'a viewer still sees what it would run');
  assert.equal(await tool(pat).locator('[data-option]:visible').count(), 0, 'no approve/deny buttons for a participant');
  assert.equal(await tool(pat).locator('.role-note').textContent(), 'You are a participant in this session: approving needs the approver role');
  assert.equal(await tool(ann).locator('.role-note:visible').count(), 0);
  await tool(ann).locator('[data-option="approve-once"]').click();

  // Every page says who approved, on the card and in the chat.
  for (const p of everyone) {
    await p.waitForSelector('.tool-card[data-status="completed"]');
    await waitText(p, '.tool-card .card-act', /^Approved by Ann · \d\d:\d\d$/);
    await waitText(p, '.act-note[data-act="toolCallConfirmed"]', /^Approved by Ann · \d\d:\d\d$/);
    assert.equal(await tool(p).locator('.role-note:visible').count(), 0, 'nothing left to approve');
  }

  // A form: Vic sees it read-only, with why; Pat may answer it; Ann answers.
  await send(ann, `/ask ${JSON.stringify({ message: 'Which release window?', questions: [{ kind: 'text', id: 'window', message: 'Window?' }] })}`);
  const card = (p) => p.locator('.input-card').last();
  for (const p of everyone) await p.waitForSelector('.input-card[data-state="open"]');
  await waitText(vic, '.input-card .role-note', /^You are a viewer in this session: answering needs the participant role$/);
  assert.equal(await card(vic).locator('[data-action="submit"]:visible, [data-action="decline"]:visible, [data-action="cancel"]:visible').count(), 0);
  assert.ok(await card(vic).locator('.question[data-qid="window"] input').isDisabled());
  await card(pat).locator('[data-action="submit"]').waitFor();
  assert.equal(await card(pat).locator('.role-note:visible').count(), 0);
  assert.ok(await card(pat).locator('.question[data-qid="window"] input').isEnabled());
  await card(ann).locator('.question[data-qid="window"] input').fill('tonight after 8');
  await vic.waitForFunction(() => document.querySelector('.question[data-qid="window"] input')?.value === 'tonight after 8');
  // The picture: Vic's page, with Ann's approval above and the form he may only watch.
  await vic.waitForTimeout(700); // let the smooth scroll to the new card settle
  await vic.locator('.tool-card .card-act').last().evaluate((el) => {
    const scroller = el.closest('.scroller');
    scroller.scrollTop += el.getBoundingClientRect().top - scroller.getBoundingClientRect().top - 24;
  });
  await vic.screenshot({ path: path.join(SHOTS, 'people.png') });

  await card(ann).locator('[data-action="submit"]').click();
  for (const p of everyone) {
    await p.waitForSelector('.input-card[data-state="settled"]');
    await waitText(p, '.input-card .card-act', /^Answered by Ann · \d\d:\d\d$/);
    await waitText(p, '.act-note[data-act="inputCompleted"]', /^Answered by Ann/);
    assert.equal(await p.locator('.msg-user .msg-author').count(), 2);
    assert.deepEqual(await p.locator('.msg-user .msg-author').allTextContents(), ['Ann', 'Ann']);
  }
  assert.match(await text(vic, '.act-note[data-act="toolCallConfirmed"]'), TIME);
  for (const p of everyone) {
    assert.deepEqual(p.errors, []);
    await p.context().close();
  }
});

test('without auth a person picks a name: it signs their messages and caret, and a reload keeps it', async () => {
  const robin = await device(`${OPEN}#/`);
  // Nobody named yet: the server's guest name is the hint.
  assert.equal(await robin.inputValue('.name-input'), '');
  assert.equal(await robin.locator('.name-input').getAttribute('readonly'), null);
  await robin.fill('.name-input', '  Robin  ');
  await robin.press('.name-input', 'Enter');
  await robin.waitForFunction(() => localStorage.getItem('tandem.name') === 'Robin');
  assert.equal(await robin.inputValue('.name-input'), 'Robin');
  await robin.click('[data-action="new-session"]');
  await robin.waitForSelector('.composer-input:not([disabled])');
  // Everyone owns a session without auth: no role badge, every button.
  assert.equal(await robin.locator('.role-badge:visible').count(), 0);
  await send(robin, 'hello from Robin');
  await waitText(robin, '.msg-user .msg-author', /^Robin$/);

  // Sam, on another device, names himself before opening the chat.
  const sam = await device(`${OPEN}#/`);
  await sam.fill('.name-input', 'Sam');
  await sam.press('.name-input', 'Enter');
  await sam.waitForFunction(() => localStorage.getItem('tandem.name') === 'Sam');
  await sam.goto(robin.url());
  await sam.waitForSelector('.composer-input:not([disabled])');
  await waitText(sam, '.msg-user .msg-author', /^Robin$/);
  // His caret in the shared composer carries his name.
  await sam.click('.composer-input');
  await sam.keyboard.type('hi');
  await waitText(robin, '.composer-peers .peer', /^Sam/);

  // A reload: the name comes back from localStorage and goes in `initialize`.
  await sam.keyboard.press('ControlOrMeta+a');
  await sam.keyboard.press('Delete');
  await robin.waitForFunction(() => document.querySelector('.composer-input')?.value === '');
  await robin.reload();
  await robin.waitForSelector('.composer-input:not([disabled])');
  assert.equal(await robin.inputValue('.name-input'), 'Robin');
  await send(robin, 'back again');
  await robin.waitForFunction(() => document.querySelectorAll('.msg-user .msg-author').length === 2);
  assert.deepEqual(await robin.locator('.msg-user .msg-author').allTextContents(), ['Robin', 'Robin']);
  for (const p of [robin, sam]) assert.deepEqual(p.errors, []);
  await robin.context().close();
  await sam.context().close();
});

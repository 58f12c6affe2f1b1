// Browser test for the Tandem web client, in real headless Chromium driven by
// playwright-core. Run by tests/browser.rs, which starts a server and passes
// its address in TANDEM_URL:
//
//   TANDEM_URL=http://127.0.0.1:7420/ node --test web/tests/browser.test.mjs
//
// Only loopback traffic: the pages load from TANDEM_URL and speak AHP to its
// /ahp; the URL request points back at the server's /healthz.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { launch } from './chromium.mjs';

const BASE = (process.env.TANDEM_URL ?? 'http://127.0.0.1:7420/').replace(/\/?$/, '/');
const HERE = path.dirname(fileURLToPath(import.meta.url));
const SHOTS = process.env.TANDEM_SCREENSHOTS ?? path.resolve(HERE, '../../docs/screenshots');
const WAIT = 15000;

const DESKTOP = { width: 1280, height: 800 };
const PHONE = { width: 390, height: 844 };

let browser;

before(async () => {
  browser = await launch([]);
});

after(async () => {
  await browser?.close();
});

/** A page in its own browser context (its own device, as far as the server knows). */
async function device(viewport, opts = {}) {
  const context = await browser.newContext({ viewport, deviceScaleFactor: opts.scale ?? 1, isMobile: opts.mobile ?? false, hasTouch: opts.mobile ?? false });
  const page = await context.newPage();
  page.setDefaultTimeout(WAIT);
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
  page.errors = errors;
  return page;
}

const card = (page) => page.locator('.input-card').last();
const q = (page, id) => card(page).locator(`.question[data-qid="${id}"]`);

async function waitLive(page) {
  await page.waitForSelector('.conn[data-conn="live"]');
}

async function shot(page, name) {
  fs.mkdirSync(SHOTS, { recursive: true });
  // Let smooth scrolling and the highlight animation settle.
  await page.waitForTimeout(700);
  await page.screenshot({ path: path.join(SHOTS, name) });
}

/** Scroll the chat so the open card's top sits near the top of the view. */
async function scrollCardIntoView(page, selector) {
  await page.locator(selector).last().evaluate((el) => {
    const scroller = el.closest('.scroller');
    scroller.scrollTop += el.getBoundingClientRect().top - scroller.getBoundingClientRect().top - 12;
  });
}

/** The chat's state as a brand-new subscriber gets it, over a second socket. */
async function freshSnapshot(page) {
  return page.evaluate(() => new Promise((resolve, reject) => {
    const c = window.tandem.client;
    const chat = [...c.channels.keys()].find((u) => u.startsWith('ahp-chat:'));
    const ws = new WebSocket(c.url);
    const send = (id, method, params) => ws.send(JSON.stringify({ jsonrpc: '2.0', id, method, params }));
    ws.onopen = () => send(1, 'initialize', { channel: 'ahp-root://', protocolVersions: ['1.0.0'], clientId: `fresh-${Date.now()}` });
    ws.onmessage = (e) => {
      const m = JSON.parse(e.data);
      if (m.error) reject(new Error(m.error.message));
      else if (m.id === 1) send(2, 'subscribe', { channel: chat });
      else if (m.id === 2) { ws.close(); resolve(m.result.snapshot.state); }
    };
  }));
}

async function confirmedAnswers(page) {
  return page.evaluate(() => {
    const c = window.tandem.client;
    const chat = [...c.channels.keys()].find((u) => u.startsWith('ahp-chat:'));
    const t = c.confirmedState(chat)?.activeTurn;
    const part = t?.responseParts.find((p) => p.kind === 'inputRequest');
    return { pending: c.pending.length, answers: part?.request.answers ?? {} };
  });
}

test('two pages share /demo: live drafts, a dropped socket catches up, one submit settles both, approval in A reaches B', async () => {
  const a = await device(DESKTOP);
  const b = await device(PHONE, { mobile: true, scale: 2 });

  // Page A creates a session with the scripted agent; page B opens the same chat.
  await a.goto(BASE);
  await waitLive(a);
  await a.click('[data-action="new-session"]');
  await a.waitForSelector('.composer-input');
  const url = a.url();
  assert.match(url, /#\/s\/[0-9a-f-]{36}$/);
  await b.goto(url);
  await waitLive(b);
  await b.waitForSelector('.chat-empty:not([hidden])');
  for (const p of [a, b]) assert.equal(await p.getAttribute('.crumbs .badge', 'data-activity'), 'idle');

  // The agent asks /demo: both pages show the form and "input needed".
  await a.fill('.composer-input', '/demo');
  await a.press('.composer-input', 'Enter');
  for (const p of [a, b]) {
    await p.waitForSelector('.input-card[data-state="open"]');
    await p.waitForSelector('.crumbs .badge[data-activity="input-needed"]');
    assert.deepEqual(
      await card(p).locator('.question').evaluateAll((els) => els.map((e) => e.dataset.kind)),
      ['text', 'integer', 'boolean', 'single-select', 'multi-select'],
    );
  }
  // Required marks, rule hints, option descriptions and the recommended option.
  assert.equal(await card(b).locator('.question .req').count(), 3);
  assert.equal(await q(b, 'name').locator('.q-rule').textContent(), '1–40 characters');
  assert.equal(await q(b, 'replicas').locator('.q-rule').textContent(), 'whole number · 1–10');
  assert.match(await q(b, 'region').locator('.option-recommended').textContent(), /EU West\s*Recommended\s*Dublin/);
  assert.equal(await q(b, 'checks').locator('.q-rule').textContent(), 'pick 1–3');

  // Text typed in A appears in B, as a live draft.
  await q(a, 'name').locator('input').pressSequentially('spring', { delay: 25 });
  await b.waitForFunction(() => document.querySelector('.question[data-qid="name"] input')?.value === 'spring');
  await b.waitForSelector('.question[data-qid="name"] .q-remote:not([hidden])');
  assert.equal(await q(a, 'name').locator('.counter').textContent(), '6 / 40');

  // B's socket drops mid-form and stays away while A keeps drafting.
  const seqBefore = await b.evaluate(() => window.tandem.stats().lastSeenServerSeq);
  await b.evaluate(() => window.tandem.dropSocket({ hold: true }));
  await b.waitForSelector('.conn[data-conn="offline"]');
  await q(a, 'replicas').locator('input').fill('12'); // out of bounds: a draft may be, a submission may not
  await q(a, 'region').locator('.option', { hasText: 'US East' }).click();
  await q(a, 'checks').locator('.option', { hasText: 'Unit tests' }).click();
  await q(a, 'checks').locator('.option', { hasText: 'Lint' }).click();
  await q(a, 'canary').locator('.seg', { hasText: 'No' }).click();
  await a.waitForSelector('.question[data-qid="replicas"].has-error');
  assert.equal(await q(a, 'replicas').locator('.q-error').textContent(), 'The maximum is 10.');
  await a.waitForFunction(() => window.tandem.client.pending.length === 0);
  await a.waitForFunction(() => {
    const c = window.tandem.client;
    const chat = [...c.channels.keys()].find((u) => u.startsWith('ahp-chat:'));
    const ans = c.confirmedState(chat).activeTurn.responseParts.find((p) => p.kind === 'inputRequest').request.answers ?? {};
    return ans.replicas?.value?.value === 12 && ans.region && ans.checks?.value?.value?.length === 2 && ans.canary;
  });
  // B has not seen any of it.
  assert.equal(await q(b, 'replicas').locator('input').inputValue(), '');

  // B comes back: `reconnect` with its last serverSeq replays what it missed.
  await b.evaluate(() => window.tandem.reconnectNow());
  await waitLive(b);
  const stats = await b.evaluate(() => window.tandem.stats());
  assert.equal(stats.lastReconnect, 'replay');
  assert.ok(stats.lastSeenServerSeq > seqBefore, 'B advanced past the missed envelopes');
  await b.waitForFunction(() => document.querySelector('.question[data-qid="replicas"] input')?.value === '12');
  assert.equal(await q(b, 'name').locator('input').inputValue(), 'spring');
  assert.ok(await q(b, 'region').locator('input[value="us-east"]').isChecked());
  assert.ok(await q(b, 'checks').locator('input[value="unit"]').isChecked());
  assert.ok(await q(b, 'checks').locator('input[value="lint"]').isChecked());
  assert.ok(!(await q(b, 'checks').locator('input[value="e2e"]').isChecked()));
  assert.ok(await q(b, 'canary').locator('input[value="no"]').isChecked());

  // Screenshots of the open form: desktop (A) and phone (B), from the top of the chat.
  for (const p of [a, b]) await p.locator('.scroller').evaluate((el) => { el.scrollTop = 0; });
  await shot(a, 'chat-form-desktop.png');
  await shot(b, 'chat-form-phone.png');

  // B submits: inline validation blocks what the server would refuse.
  await card(b).locator('[data-action="submit"]').click();
  await b.waitForSelector('.question[data-qid="replicas"].has-error');
  assert.equal(await q(b, 'replicas').locator('.q-error').textContent(), 'The maximum is 10.');
  assert.equal(await b.evaluate(() => window.tandem.client.pending.length), 0, 'nothing was sent');
  // A fraction is refused for an integer question, even as a draft: kept local.
  await q(b, 'replicas').locator('input').fill('2.5');
  await b.waitForFunction(() => document.querySelector('.question[data-qid="replicas"] .q-error')?.textContent.includes('whole number'));
  await b.waitForTimeout(300);
  assert.equal((await confirmedAnswers(b)).answers.replicas.value.value, 12, 'the fraction never left B');
  await q(b, 'replicas').locator('input').fill('4');
  await b.waitForFunction(() => !document.querySelector('.question[data-qid="replicas"]').classList.contains('has-error'));
  await card(b).locator('[data-action="submit"]').click();

  // Both pages show the same settled answers.
  const expected = [
    ['Name', 'spring'], ['Replicas', '4'], ['Canary', 'No'], ['Region', 'US East'], ['Checks', 'Unit tests, Lint'],
  ];
  const settled = [];
  for (const p of [a, b]) {
    await p.waitForSelector('.input-card[data-state="settled"]');
    assert.equal((await card(p).locator('.chip').textContent()).trim(), 'Answered');
    const rows = await card(p).locator('.answer-row').evaluateAll((els) => els.map((e) => [e.querySelector('dt').textContent, e.querySelector('dd').textContent]));
    assert.deepEqual(rows, expected);
    settled.push(rows);
  }
  assert.deepEqual(settled[0], settled[1]);

  // The tool approval: both see it; A edits the input and approves once.
  for (const p of [a, b]) await p.waitForSelector('.tool-card[data-status="pending-confirmation"]');
  const tool = (p) => p.locator('.tool-card').last();
  assert.deepEqual(
    await tool(b).locator('[data-option]').evaluateAll((els) => els.map((e) => e.dataset.option)),
    ['approve-once', 'approve-session', 'deny'],
  );
  assert.match(await tool(a).locator('.tool-input').textContent(), /"replicas"/);
  await scrollCardIntoView(a, '.tool-card');
  await shot(a, 'tool-approval-desktop.png');
  await tool(a).locator('[data-action="edit-input"]').click();
  await tool(a).locator('textarea.code-input').fill('{"release": "spring", "replicas": 4, "approvedFrom": "page A"}');
  await tool(a).locator('[data-option="approve-once"]').click();
  for (const p of [a, b]) {
    await p.waitForSelector('.tool-card[data-status="completed"]');
    await p.waitForSelector('.crumbs .badge[data-activity="idle"]');
    assert.match(await tool(p).locator('.result').textContent(), /"approvedFrom": "page A"/);
    assert.match(await tool(p).locator('.card-sub').textContent(), /Approve once/);
    await p.waitForFunction(() => [...document.querySelectorAll('.markdown')].some((m) => m.textContent.includes('tool deploy: approved')));
  }

  // Both pages hold the same state, equal to what the server confirmed.
  const stateOf = (p) => p.evaluate(() => {
    const c = window.tandem.client;
    const chat = [...c.channels.keys()].find((u) => u.startsWith('ahp-chat:'));
    return { view: c.state(chat), confirmed: c.confirmedState(chat), pending: c.pending.length };
  });
  const [sa, sb] = [await stateOf(a), await stateOf(b)];
  assert.equal(sa.pending + sb.pending, 0);
  assert.deepEqual(sa.confirmed, sb.confirmed);
  assert.deepEqual(sa.view, sa.confirmed);
  // ... and equal to a fresh snapshot from the server: the JS reducer port
  // reduced every envelope exactly as the server's official reducer did.
  assert.deepEqual(sa.confirmed, await freshSnapshot(a));
  assert.deepEqual(a.errors, []);
  assert.deepEqual(b.errors, []);
  await a.context().close();
  await b.context().close();
});

test('two pages type into one answer at once: both keep both words, neither caret jumps, each sees the other', async () => {
  const a = await device(DESKTOP);
  const b = await device(DESKTOP);
  await a.goto(BASE);
  await waitLive(a);
  await a.click('[data-action="new-session"]');
  await a.waitForSelector('.composer-input');
  await b.goto(a.url());
  await waitLive(b);
  const spec = { questions: [{ kind: 'text', id: 'notes', message: 'Release notes?' }] };
  await a.fill('.composer-input', `/ask ${JSON.stringify(spec)}`);
  await a.press('.composer-input', 'Enter');
  const field = (p) => q(p, 'notes').locator('input');
  for (const p of [a, b]) {
    await p.waitForSelector('.input-card[data-state="open"]');
    await field(p).click();
  }
  // Each sees the other present on the field.
  for (const p of [a, b]) await q(p, 'notes').locator('.peers .peer').waitFor();

  // Interleaved keystrokes, each typed before the other's arrive.
  const [wa, wb] = ['alpha beta', 'gamma delta'];
  for (let i = 0; i < Math.max(wa.length, wb.length); i++) {
    await Promise.all([
      wa[i] ? a.keyboard.type(wa[i]) : null,
      wb[i] ? b.keyboard.type(wb[i]) : null,
    ]);
  }
  const settle = (p) => p.waitForFunction((n) => document.querySelector('.question[data-qid="notes"] input')?.value.length === n, wa.length + wb.length);
  await settle(a);
  await settle(b);
  await a.waitForTimeout(300);
  const look = (p) => field(p).evaluate((el) => ({ value: el.value, caret: el.selectionStart, focused: document.activeElement === el }));
  const [la, lb] = [await look(a), await look(b)];
  assert.equal(la.value, lb.value, 'both pages end with one text');
  assert.ok(la.value.includes(wa) && la.value.includes(wb), la.value);
  // Each caret is still where its own typing ended.
  assert.ok(la.focused && lb.focused);
  assert.equal(la.caret, la.value.indexOf(wa) + wa.length, `A's caret: ${JSON.stringify(la)}`);
  assert.equal(lb.caret, lb.value.indexOf(wb) + wb.length, `B's caret: ${JSON.stringify(lb)}`);
  // The other's caret is drawn over the field with their name.
  await q(a, 'notes').locator('.peer-caret').waitFor();
  await shot(a, 'typing-together.png');

  // The composer is the chat's shared draft: typed in one page, it is in the other's.
  const draft = (p) => p.locator('.composer-input');
  await draft(a).click();
  await a.keyboard.type('ship it');
  await b.waitForFunction(() => document.querySelector('.composer-input')?.value === 'ship it');
  await draft(b).click();
  await b.keyboard.press('End');
  await b.keyboard.type(' today');
  await a.waitForFunction(() => document.querySelector('.composer-input')?.value === 'ship it today');
  // B's caret is drawn in A's composer (a <textarea>) at the end of its
  // text, and a line lower once B starts a second line.
  const peerCaret = (p) => p.waitForFunction(() => {
    const bar = document.querySelector('.composer-peers .peer-caret');
    const box = document.querySelector('.composer-input').getBoundingClientRect();
    if (!bar) return null;
    const r = bar.getBoundingClientRect();
    return r.left > box.left + 20 && r.left <= box.right && r.top >= box.top - 1 && r.bottom <= box.bottom + 1
      ? { left: r.left - box.left, top: r.top - box.top, name: bar.title } : null;
  }).then((h) => h.jsonValue());
  const first = await peerCaret(a);
  await b.keyboard.press('Shift+Enter');
  await b.keyboard.type('x');
  await a.waitForFunction(() => document.querySelector('.composer-input')?.value === 'ship it today\nx');
  await a.waitForFunction((top) => {
    const bar = document.querySelector('.composer-peers .peer-caret');
    const box = document.querySelector('.composer-input').getBoundingClientRect();
    return bar && bar.getBoundingClientRect().top - box.top > top + 8;
  }, first.top);
  await shot(a, 'typing-together-composer.png');
  await b.keyboard.press('ControlOrMeta+a');
  await b.keyboard.press('Delete');
  await a.waitForFunction(() => document.querySelector('.composer-input')?.value === '');

  // One submit takes the merged text.
  await card(a).locator('[data-action="submit"]').click();
  for (const p of [a, b]) {
    await p.waitForSelector('.input-card[data-state="settled"]');
    assert.equal(await card(p).locator('.answer-row dd').first().textContent(), la.value);
  }
  for (const p of [a, b]) assert.deepEqual(p.errors, []);
});

test('URL request with a confirm step; deny with a reason; approve for this session', async () => {
  const p = await device(DESKTOP);
  await p.goto(BASE);
  await waitLive(p);
  await p.click('[data-action="new-session"]');
  await p.waitForSelector('.composer-input');
  const send = async (text) => {
    await p.waitForSelector('.btn-send:not([disabled])');
    await p.fill('.composer-input', text);
    await p.press('.composer-input', 'Enter');
  };

  // A URL request is a link behind a confirm step.
  const target = `${BASE}healthz`;
  await send(`/ask ${JSON.stringify({ message: 'Check the health page', url: target })}`);
  await p.waitForSelector('.input-card[data-state="open"] .url-block');
  assert.equal(await p.locator('.url-text').last().textContent(), target);
  assert.ok(!(await p.locator('[data-action="open-url"]').isVisible()), 'no link before the confirm step');
  assert.equal(await p.locator('.url-host').last().textContent(), new URL(target).host, 'the host is shown up front');
  // Only http(s) links, by the server's rule; anything else stays text.
  const verdicts = await p.evaluate(async () => {
    const { linkTarget } = await import('/validate.js');
    return ['javascript:alert(1)', 'data:text/html,x', 'file:///etc/passwd', '/relative', 'https://u:p@a.example/', 'https://a.example/x']
      .map((u) => linkTarget(u).href ?? null);
  });
  assert.deepEqual(verdicts, [null, null, null, null, null, 'https://a.example/x']);
  await p.click('[data-action="review-url"]');
  const link = p.locator('[data-action="open-url"]');
  assert.equal(await link.getAttribute('href'), target);
  assert.equal(await link.getAttribute('rel'), 'noopener noreferrer');
  const [popup] = await Promise.all([p.context().waitForEvent('page'), link.click()]);
  await popup.close();
  await p.waitForSelector('.url-opened:not([hidden])');
  await card(p).locator('[data-action="submit"]').click();
  await p.waitForSelector('.input-card[data-state="settled"]');
  await p.waitForFunction(() => [...document.querySelectorAll('.markdown')].some((m) => m.textContent.startsWith('settled: answered')));

  // Deny with a reason.
  await send('/tool write_file {"path":"notes.txt"}');
  const tool = p.locator('.tool-card').last();
  await p.waitForSelector('.tool-card[data-status="pending-confirmation"]');
  await tool.locator('[data-option="deny"]').click();
  await tool.locator('.deny-box textarea').fill('not on a Friday');
  await tool.locator('[data-action="deny-confirm"]').click();
  await p.waitForSelector('.tool-card[data-status="cancelled"]');
  assert.equal((await tool.locator('.chip').textContent()).trim(), 'Denied');
  assert.match(await tool.locator('.reason').textContent(), /not on a Friday/);
  await p.waitForFunction(() => [...document.querySelectorAll('.markdown')].some((m) => m.textContent === 'tool write_file: denied'));

  // Approve for this session: the next call of that tool runs without asking.
  await send('/tool write_file {"path":"a.txt"}');
  await p.waitForSelector('.tool-card[data-status="pending-confirmation"]');
  await p.locator('.tool-card').last().locator('[data-option="approve-session"]').click();
  await p.waitForFunction(() => document.querySelectorAll('.tool-card[data-status="completed"]').length === 1);
  await send('/tool write_file {"path":"b.txt"}');
  await p.waitForFunction(() => document.querySelectorAll('.tool-card[data-status="completed"]').length === 2);
  assert.equal(await p.locator('.tool-card[data-status="pending-confirmation"]').count(), 0);

  // Decline settles a form without answers.
  await send('/ask {"questions":[{"kind":"text","id":"why","message":"Why?","required":true}]}');
  await p.waitForSelector('.input-card[data-state="open"]');
  await card(p).locator('[data-action="submit"]').click();
  assert.equal(await q(p, 'why').locator('.q-error').textContent(), 'Required.');
  await card(p).locator('[data-action="decline"]').click();
  // This card, not the URL request settled above (the view renders on the next frame).
  await card(p).and(p.locator('[data-state="settled"]')).waitFor();
  assert.equal((await card(p).locator('.chip').textContent()).trim(), 'Declined');
  assert.deepEqual(p.errors, []);
  await p.context().close();
});

test('an ACP agent behind Tandem: two pages see its stream, one approves its permission request, the other sees it settle', async () => {
  const a = await device(DESKTOP);
  const b = await device(DESKTOP);
  await a.goto(BASE);
  await waitLive(a);
  // The operator declared the test ACP agent; it is in the picker.
  const agents = await a.locator('select[aria-label="Agent"] option').evaluateAll((els) => els.map((e) => e.value));
  assert.ok(agents.includes('acp-test'), `the picker lists the ACP agent: ${agents}`);
  await a.selectOption('select[aria-label="Agent"]', 'acp-test');
  await a.click('[data-action="new-session"]');
  await a.waitForSelector('.composer-input');
  await b.goto(a.url());
  await waitLive(b);
  await b.waitForSelector('.composer-input');

  const send = async (text) => {
    await a.waitForSelector('.btn-send:not([disabled])');
    await a.fill('.composer-input', text);
    await a.press('.composer-input', 'Enter');
  };
  // The agent streams; both pages show the whole answer.
  await send('/stream 6 30');
  for (const p of [a, b]) {
    await p.waitForFunction(() => [...document.querySelectorAll('.markdown')].some((m) => m.textContent.includes('chunk 6')));
  }

  // A permission request: both pages show the agent's own options; A allows it once.
  await send('/tool deploy');
  const tool = (p) => p.locator('.tool-card').last();
  for (const p of [a, b]) await p.waitForSelector('.tool-card[data-status="pending-confirmation"]');
  assert.deepEqual(
    await tool(b).locator('[data-option]').evaluateAll((els) => els.map((e) => e.dataset.option)),
    ['allow-once', 'allow-always', 'reject-once', 'reject-always'],
  );
  await scrollCardIntoView(a, '.tool-card');
  await shot(a, 'acp-approval-desktop.png');
  await tool(a).locator('[data-option="allow-once"]').click();
  for (const p of [a, b]) {
    await p.waitForSelector('.tool-card[data-status="completed"]');
    await p.waitForFunction(() => [...document.querySelectorAll('.markdown')].some((m) => m.textContent.includes('tool deploy: allow-once')));
  }
  assert.equal(await b.locator('.tool-card[data-status="pending-confirmation"]').count(), 0);
  assert.deepEqual(await freshSnapshot(a), await freshSnapshot(b));
  assert.deepEqual(a.errors, []);
  assert.deepEqual(b.errors, []);
  await a.context().close();
  await b.context().close();
});

test('the client-side rules agree with the server on every question kind', async () => {
  const p = await device(DESKTOP);
  await p.goto(BASE);
  await waitLive(p);
  const disagreements = await p.evaluate(async () => {
    const { checkAnswer } = await import('/validate.js');
    const c = window.tandem.client;
    const questions = [
      { kind: 'text', id: 't', message: 't', min: 2, max: 5 },
      { kind: 'number', id: 'n', message: 'n', min: -1.5, max: 2.5 },
      { kind: 'integer', id: 'i', message: 'i', min: 1, max: 10 },
      { kind: 'boolean', id: 'b', message: 'b' },
      { kind: 'single-select', id: 's', message: 's', options: [{ id: 'x', label: 'X' }, { id: 'y', label: 'Y' }] },
      { kind: 'single-select', id: 'sf', message: 'sf', allowFreeformInput: true, options: [{ id: 'x', label: 'X' }] },
      { kind: 'multi-select', id: 'm', message: 'm', min: 1, max: 2, options: [{ id: 'x', label: 'X' }, { id: 'y', label: 'Y' }, { id: 'z', label: 'Z' }] },
      { kind: 'multi-select', id: 'mf', message: 'mf', allowFreeformInput: true, max: 2, options: [{ id: 'x', label: 'X' }] },
    ];
    const sub = (value) => ({ state: 'submitted', value });
    const draft = (value) => ({ state: 'draft', value });
    const text = (v) => ({ kind: 'text', value: v });
    const num = (v) => ({ kind: 'number', value: v });
    const sel = (v, f) => (f ? { kind: 'selected', value: v, freeformValues: f } : { kind: 'selected', value: v });
    const many = (v, f) => (f ? { kind: 'selected-many', value: v, freeformValues: f } : { kind: 'selected-many', value: v });
    const cases = [
      ['t', sub(text('ab'))], ['t', sub(text('a'))], ['t', draft(text('a'))], ['t', sub(text('abcdef'))], ['t', sub(text('äöü'))],
      ['t', sub(num(1))],
      ['n', sub(num(2.5))], ['n', sub(num(2.6))], ['n', draft(num(99))], ['n', sub(num(-1.5))], ['n', sub(num(-2))],
      ['i', sub(num(3))], ['i', sub(num(3.5))], ['i', draft(num(3.5))], ['i', sub(num(0))], ['i', draft(num(0))], ['i', sub(num(11))],
      ['b', sub({ kind: 'boolean', value: false })], ['b', sub(text('yes'))],
      ['s', sub(sel('x'))], ['s', sub(sel('nope'))], ['s', sub(sel('x', ['free']))],
      ['sf', sub(sel('mine', ['mine']))], ['sf', sub(sel('mine'))], ['sf', draft(sel('mine'))], ['sf', sub(sel('x'))],
      ['m', sub(many(['x']))], ['m', sub(many([]))], ['m', draft(many([]))], ['m', sub(many(['x', 'y', 'z']))],
      ['m', sub(many(['x', 'x']))], ['m', sub(many(['q']))], ['m', sub(many(['x'], ['f']))],
      ['mf', sub(many(['x'], ['a']))], ['mf', sub(many(['x'], ['a', 'b']))], ['mf', draft(many(['x'], ['a', 'b']))],
      ['s', { state: 'skipped' }],
    ];
    // A session, a chat, an open request with these questions.
    const session = `ahp-session:/${crypto.randomUUID()}`;
    await c.request('createSession', { channel: session, provider: 'scripted' });
    const chat = (await c.subscribe(session)).defaultChat;
    await c.subscribe(chat);
    const opened = new Promise((resolve) => {
      const on = () => {
        const part = c.confirmedState(chat).activeTurn?.responseParts.find((x) => x.kind === 'inputRequest');
        if (part) { c.removeEventListener('change', on); resolve(part.request.id); }
      };
      c.addEventListener('change', on);
    });
    c.dispatch(chat, {
      type: 'chat/turnStarted', turnId: crypto.randomUUID(), startedAt: new Date().toISOString(),
      message: { text: `/ask ${JSON.stringify({ questions })}`, origin: { kind: 'user' } },
    });
    const requestId = await opened;
    const out = [];
    for (const [qid, answer] of cases) {
      const question = questions.find((x) => x.id === qid);
      const clientSays = checkAnswer(question, answer);
      const seq = c.dispatch(chat, { type: 'chat/inputAnswerChanged', requestId, questionId: qid, answer });
      const serverSays = await new Promise((resolve) => {
        const onRej = (e) => { if (e.detail.clientSeq === seq) finish(e.detail.reason); };
        const onEnv = (e) => {
          const o = e.detail.envelope.origin;
          if (o?.clientId === c.clientId && o.clientSeq === seq) finish(null);
        };
        function finish(v) {
          c.removeEventListener('rejected', onRej);
          c.removeEventListener('envelope', onEnv);
          resolve(v);
        }
        c.addEventListener('rejected', onRej);
        c.addEventListener('envelope', onEnv);
      });
      if ((clientSays === null) !== (serverSays === null)) out.push({ qid, answer, clientSays, serverSays });
    }
    // Optimistic apply, then the rejection reverts the view to what the server holds.
    const answerOf = (state) => state.activeTurn.responseParts.find((x) => x.kind === 'inputRequest').request.answers.i;
    const before = answerOf(c.state(chat));
    const seq = c.dispatch(chat, { type: 'chat/inputAnswerChanged', requestId, questionId: 'i', answer: sub(num(7.5)) });
    const optimistic = answerOf(c.state(chat));
    const reason = await new Promise((resolve) => {
      const on = (e) => { if (e.detail.clientSeq === seq) { c.removeEventListener('rejected', on); resolve(e.detail.reason); } };
      c.addEventListener('rejected', on);
    });
    const after = answerOf(c.state(chat));
    return { out, count: cases.length, revert: { before, optimistic, after, reason, pending: c.pending.length } };
  });
  assert.equal(disagreements.count, 37);
  assert.deepEqual(disagreements.out, []);
  const { revert } = disagreements;
  assert.equal(revert.optimistic.value.value, 7.5, 'shown at once');
  assert.match(revert.reason, /not a whole number/);
  assert.deepEqual(revert.after, revert.before, 'reverted on rejection');
  assert.equal(revert.pending, 0);
  await p.waitForSelector('.toast-err');
  await p.context().close();
});

test('a new session\'s composer opens only once its chat has loaded, and the message typed then is sent', async () => {
  const p = await device(DESKTOP);
  // Hold everything the server says for a second once the page subscribes
  // to the new session, in order: the chat view is up before the session
  // and its chat are.
  let holdUntil = 0;
  let chain = Promise.resolve();
  await p.routeWebSocket(/\/ahp/, (ws) => {
    const server = ws.connectToServer();
    ws.onMessage((m) => {
      if (typeof m === 'string' && m.includes('"subscribe"') && m.includes('ahp-session:')) holdUntil = Date.now() + 1000;
      server.send(m);
    });
    server.onMessage((m) => {
      chain = chain.then(async () => {
        const wait = holdUntil - Date.now();
        if (wait > 0) await new Promise((r) => setTimeout(r, wait));
        ws.send(m);
      });
    });
  });
  await p.goto(BASE);
  await waitLive(p);
  await p.click('[data-action="new-session"]');
  await p.waitForSelector('.composer-input');
  // Typing waits for the composer to open, as a person would; the text is
  // neither dropped nor replaced by the chat's (empty) shared draft.
  await p.fill('.composer-input', 'typed while loading');
  assert.ok(holdUntil > 0 && Date.now() >= holdUntil - 50, 'the composer opened only with the chat');
  await p.press('.composer-input', 'Enter');
  await p.waitForFunction(() => [...document.querySelectorAll('.msg-user')].some((m) => m.textContent.includes('typed while loading')));
  await p.waitForFunction(() => [...document.querySelectorAll('.markdown')].some((m) => m.textContent.length > 0));
  assert.equal(await p.inputValue('.composer-input'), '');
  assert.deepEqual(p.errors, []);
  await p.context().close();
});

// The two interactive parts of a chat: the input request card (questions,
// forms, URL requests) and the tool call card (approval and result). Each is a
// small component: built once per request / tool call, then `update(part)` on
// every state change keeps it in place, so a person typing never loses focus
// while drafts from other clients stream in.
import { SharedField } from './coedit.js';
import { h, setChildren, setText } from './dom.js';
import { inline, escapeHtml } from './markdown.js';
import { checkAnswer, checkAccept, formatHint, linkTarget, ruleHint } from './validate.js';
import { can, roleNote, actText } from './people.js';

const DRAFT_DEBOUNCE_MS = 150;

function textOf(som) {
  if (som == null) return '';
  return typeof som === 'string' ? som : som.markdown ?? '';
}

function inlineEl(tag, cls, som) {
  return h(tag, { class: cls, html: inline(textOf(som)) });
}

function chip(text, kind) {
  return h('span', { class: `chip chip-${kind}` }, text);
}

/** The line naming who settled a card ("Approved by Ann · 10:42"), from its act. */
function showAct(el, act) {
  const line = act ? actText(act) : null;
  setText(el, line ?? '');
  el.hidden = !line;
}

/**
 * Offer a card's actions only to a role that may take them: hide `actionsEl`
 * and show why in `noteEl`. Returns whether they are offered.
 */
function gate(role, need, what, actionsEl, noteEl) {
  const ok = can(role, need);
  if (actionsEl) actionsEl.hidden = !ok;
  const why = !ok && role ? roleNote(role, what, need) : '';
  setText(noteEl, why);
  noteEl.hidden = !why;
  return ok;
}

// ─── Input requests ──────────────────────────────────────────────────────

const RESPONSE_LABEL = { accept: ['Answered', 'ok'], decline: ['Declined', 'muted'], cancel: ['Cancelled', 'muted'] };

/** How an answer reads in the settled view. */
export function describeAnswer(q, a) {
  if (!a) return null;
  if (a.state === 'skipped') return 'Skipped';
  const v = a.value;
  if (!v) return null;
  switch (v.kind) {
    case 'text':
      return v.value === '' ? '(empty)' : v.value;
    case 'number':
      return String(v.value);
    case 'boolean':
      return v.value ? 'Yes' : 'No';
    case 'selected': {
      const o = q?.options?.find((x) => x.id === v.value);
      return o ? o.label : (v.freeformValues?.[0] ?? v.value);
    }
    case 'selected-many': {
      const labels = v.value.map((id) => q?.options?.find((x) => x.id === id)?.label ?? id);
      return [...labels, ...(v.freeformValues ?? [])].join(', ') || '(none)';
    }
    default:
      return JSON.stringify(v);
  }
}

/** One question's control: build, read the value a person entered, show a value. */
function makeControl(q, onEdit) {
  const name = `q-${q.id}-${Math.random().toString(36).slice(2, 8)}`;
  switch (q.kind) {
    case 'text': {
      const type = { email: 'email', uri: 'url', date: 'date', 'date-time': 'datetime-local' }[q.format] ?? 'text';
      const long = q.max != null && q.max > 120;
      const input = long
        ? h('textarea', { class: 'input', rows: 3, name, id: name })
        : h('input', { class: 'input', type, name, id: name, autocomplete: 'off', spellcheck: 'false' });
      if (q.max != null) input.setAttribute('maxlength', String(q.max + 20)); // Let people overshoot a little and see why.
      if (q.defaultValue != null) input.placeholder = q.defaultValue;
      const counter = q.max != null || q.min != null ? h('span', { class: 'counter' }) : null;
      const refreshCounter = () => {
        if (counter) setText(counter, q.max != null ? `${[...input.value].length} / ${q.max}` : `${[...input.value].length}`);
      };
      input.addEventListener('input', () => { refreshCounter(); onEdit(); });
      return {
        el: h('div', { class: 'control control-text' }, input, counter),
        focus: input,
        refresh: refreshCounter,
        read: () => (input.value === '' ? undefined : { kind: 'text', value: input.value }),
        show(v) {
          const text = v?.kind === 'text' ? v.value : '';
          if (input.value !== text) {
            const focused = document.activeElement === input;
            const { selectionStart: s, selectionEnd: e } = input;
            input.value = text;
            if (focused && s != null) {
              try { input.setSelectionRange(Math.min(s, text.length), Math.min(e, text.length)); } catch { /* not selectable */ }
            }
          }
          refreshCounter();
        },
        setDisabled(d) { input.disabled = d; },
      };
    }
    case 'number':
    case 'integer': {
      const input = h('input', {
        class: 'input input-number', type: 'number', name, id: name, inputmode: q.kind === 'integer' ? 'numeric' : 'decimal',
        step: q.kind === 'integer' ? '1' : 'any',
      });
      if (q.min != null) input.min = String(q.min);
      if (q.max != null) input.max = String(q.max);
      if (q.defaultValue != null) input.placeholder = String(q.defaultValue);
      input.addEventListener('input', onEdit);
      const stepper = (d) => h('button', {
        class: 'stepper', type: 'button', tabindex: '-1', 'aria-label': d > 0 ? 'Increase' : 'Decrease',
        onclick: () => {
          const cur = input.value === '' ? (q.defaultValue ?? q.min ?? 0) : Number(input.value);
          let next = cur + d * (q.kind === 'integer' ? 1 : 1);
          if (q.min != null) next = Math.max(q.min, next);
          if (q.max != null) next = Math.min(q.max, next);
          input.value = String(next);
          onEdit();
        },
      }, d > 0 ? '+' : '−');
      return {
        el: h('div', { class: 'control control-number' }, stepper(-1), input, stepper(1)),
        focus: input,
        read: () => {
          if (input.value === '') return input.validity.badInput ? { kind: 'number', value: NaN } : undefined;
          return { kind: 'number', value: Number(input.value) };
        },
        show(v) {
          const n = v?.kind === 'number' ? v.value : undefined;
          const text = n == null ? '' : String(n);
          if (input.value !== text) input.value = text;
        },
        setDisabled(d) { input.disabled = d; },
      };
    }
    case 'boolean': {
      const yes = h('input', { type: 'radio', name, value: 'yes' });
      const no = h('input', { type: 'radio', name, value: 'no' });
      yes.addEventListener('change', onEdit);
      no.addEventListener('change', onEdit);
      return {
        el: h('div', { class: 'control segmented', role: 'radiogroup' },
          h('label', { class: 'seg' }, yes, h('span', null, 'Yes')),
          h('label', { class: 'seg' }, no, h('span', null, 'No'))),
        focus: yes,
        read: () => (yes.checked ? { kind: 'boolean', value: true } : no.checked ? { kind: 'boolean', value: false } : undefined),
        show(v) {
          const b = v?.kind === 'boolean' ? v.value : (v === undefined ? q.defaultValue : undefined);
          yes.checked = b === true;
          no.checked = b === false;
        },
        setDisabled(d) { yes.disabled = d; no.disabled = d; },
      };
    }
    case 'single-select': {
      const radios = q.options.map((o) => {
        const r = h('input', { type: 'radio', name, value: o.id });
        r.addEventListener('change', onEdit);
        return [o, r];
      });
      let other = null;
      let otherText = null;
      if (q.allowFreeformInput) {
        other = h('input', { type: 'radio', name, value: '' });
        otherText = h('input', { class: 'input input-inline', type: 'text', placeholder: 'Type your own answer', 'aria-label': 'Other answer' });
        other.addEventListener('change', () => { otherText.focus(); onEdit(); });
        otherText.addEventListener('input', () => { other.checked = true; onEdit(); });
      }
      const defaultId = q.options.find((o) => o.recommended)?.id;
      return {
        el: h('div', { class: 'control options', role: 'radiogroup' },
          radios.map(([o, r]) => optionRow(o, r)),
          other && h('label', { class: 'option option-other' }, other,
            h('span', { class: 'option-body' }, h('span', { class: 'option-label' }, 'Other'), otherText))),
        focus: radios[0]?.[1],
        read: () => {
          const hit = radios.find(([, r]) => r.checked);
          if (hit) return { kind: 'selected', value: hit[0].id };
          if (other?.checked) {
            const t = otherText.value.trim();
            return t ? { kind: 'selected', value: t, freeformValues: [t] } : undefined;
          }
          return undefined;
        },
        show(v) {
          let id = v?.kind === 'selected' ? v.value : (v === undefined ? defaultId : undefined);
          const known = radios.some(([o]) => o.id === id);
          let free = '';
          if (v?.kind === 'selected' && (!known || v.freeformValues?.length)) {
            free = v.freeformValues?.[0] ?? v.value;
            id = null;
          }
          for (const [o, r] of radios) r.checked = o.id === id;
          if (other) {
            other.checked = free !== '';
            if (document.activeElement !== otherText || free !== '') {
              if (otherText.value !== free) otherText.value = free;
            }
          }
        },
        setDisabled(d) {
          for (const [, r] of radios) r.disabled = d;
          if (other) { other.disabled = d; otherText.disabled = d; }
        },
      };
    }
    case 'multi-select': {
      const boxes = q.options.map((o) => {
        const c = h('input', { type: 'checkbox', value: o.id });
        c.addEventListener('change', onEdit);
        return [o, c];
      });
      const otherText = q.allowFreeformInput
        ? h('input', { class: 'input input-inline', type: 'text', placeholder: 'Add your own (comma-separated)', 'aria-label': 'Other answers' })
        : null;
      otherText?.addEventListener('input', onEdit);
      return {
        el: h('div', { class: 'control options' },
          boxes.map(([o, c]) => optionRow(o, c)),
          otherText && h('div', { class: 'option option-other' }, h('span', { class: 'option-body' }, h('span', { class: 'option-label' }, 'Other'), otherText))),
        focus: boxes[0]?.[1],
        read: () => {
          const ids = boxes.filter(([, c]) => c.checked).map(([o]) => o.id);
          const free = otherText ? otherText.value.split(',').map((s) => s.trim()).filter(Boolean) : [];
          if (!ids.length && !free.length) return undefined;
          const v = { kind: 'selected-many', value: ids };
          if (free.length) v.freeformValues = free;
          return v;
        },
        show(v) {
          const ids = v?.kind === 'selected-many' ? v.value : [];
          for (const [o, c] of boxes) c.checked = ids.includes(o.id);
          if (otherText && document.activeElement !== otherText) {
            const t = v?.kind === 'selected-many' ? (v.freeformValues ?? []).join(', ') : '';
            if (otherText.value !== t) otherText.value = t;
          }
        },
        setDisabled(d) {
          for (const [, c] of boxes) c.disabled = d;
          if (otherText) otherText.disabled = d;
        },
      };
    }
    default:
      return {
        el: h('div', { class: 'control muted' }, `This client cannot show a “${q.kind}” question.`),
        read: () => undefined,
        show() {},
        setDisabled() {},
      };
  }
}

function optionRow(o, input) {
  return h('label', { class: `option${o.recommended ? ' option-recommended' : ''}` },
    input,
    h('span', { class: 'option-body' },
      h('span', { class: 'option-label' }, o.label, o.recommended && h('span', { class: 'tag' }, 'Recommended')),
      o.description && h('span', { class: 'option-desc' }, o.description)));
}

/**
 * The value a question takes when nobody entered one: text and number
 * defaults are shown as placeholders and used on submit. (Boolean defaults and
 * a recommended single-select option are shown pre-selected, so `read()`
 * already returns them.)
 */
export function defaultAnswerValue(q) {
  if (q.defaultValue == null) return undefined;
  if (q.kind === 'text') return { kind: 'text', value: q.defaultValue };
  if (q.kind === 'number' || q.kind === 'integer') return { kind: 'number', value: q.defaultValue };
  return undefined;
}

function sameValue(a, b) {
  return JSON.stringify(a ?? null) === JSON.stringify(b ?? null);
}

/**
 * An input request part. `ctx`: {client, chat, myId, editors: Map, rejections: Map, live}.
 */
export class InputRequestCard {
  constructor(part, ctx) {
    this.ctx = ctx;
    this.requestId = part.request.id;
    this.el = h('section', { class: 'card input-card', 'data-request-id': this.requestId });
    this.mode = null;
    this.submitTried = false;
    this.questions = new Map(); // qid -> {q, control, row, errEl, hintEl, dirty, timer}
    this.update(part, ctx);
  }

  get request() {
    return this.part.request;
  }

  update(part, ctx = this.ctx) {
    this.part = part;
    this.ctx = ctx;
    const mode = part.response != null ? `settled-${part.response}` : ctx.live ? 'open' : 'unanswered';
    if (mode !== this.mode) {
      this.mode = mode;
      this.el.dataset.state = mode === 'open' ? 'open' : 'settled';
      if (mode === 'open') this.buildOpen(); else { this.closeShared(); this.buildSettled(); }
    }
    if (mode === 'open') this.refreshOpen(); else this.refreshSettled();
  }

  head(stateChip) {
    const r = this.request;
    const title = r.message ?? (r.url ? 'The agent asks you to open a link' : 'The agent needs your input');
    return h('header', { class: 'card-head' },
      h('span', { class: 'card-icon icon-input', 'aria-hidden': 'true' }, r.url && !r.questions?.length ? '↗' : '?'),
      h('div', { class: 'card-titles' }, inlineEl('div', 'card-title', title),
        r.questions?.length ? h('div', { class: 'card-sub' }, `${r.questions.length} question${r.questions.length === 1 ? '' : 's'}`) : null),
      stateChip);
  }

  // ── open ──

  closeShared() {
    for (const entry of this.questions.values()) entry.shared?.close();
  }

  buildOpen() {
    const r = this.request;
    this.closeShared();
    this.questions.clear();
    this.stateChip = chip('Waiting for you', 'warn');
    const qs = (r.questions ?? []).map((q) => this.buildQuestion(q));
    // Short controls (numbers, yes/no) that follow each other share a row on wide screens.
    const narrow = (q) => ['number', 'integer', 'boolean'].includes(q?.kind);
    const list = r.questions ?? [];
    for (let i = 0; i + 1 < list.length; i++) {
      if (narrow(list[i]) && narrow(list[i + 1])) {
        qs[i].classList.add('half');
        qs[i + 1].classList.add('half');
        i += 1;
      }
    }
    this.errorEl = h('div', { class: 'card-error', role: 'alert', hidden: true });
    const urlOnly = r.url && !(r.questions ?? []).length;
    this.submitBtn = h('button', { class: 'btn btn-primary', type: 'submit', 'data-action': 'submit' }, urlOnly ? 'Done' : 'Submit');
    this.roleEl = h('div', { class: 'role-note', role: 'note', hidden: true });
    this.allowed = undefined;
    const form = h('form', { class: 'card-body', novalidate: true, onsubmit: (e) => { e.preventDefault(); this.submit(); } },
      r.url ? this.buildUrl(r.url) : null,
      qs.length ? h('div', { class: 'questions' }, qs) : null,
      this.errorEl,
      this.roleEl,
      this.actionsEl = h('footer', { class: 'card-actions' },
        this.submitBtn,
        h('button', { class: 'btn', type: 'button', 'data-action': 'decline', onclick: () => this.complete('decline') }, 'Decline'),
        h('button', { class: 'btn btn-ghost', type: 'button', 'data-action': 'cancel', onclick: () => this.complete('cancel') }, 'Cancel')));
    setChildren(this.el, this.head(this.stateChip), form);
  }

  buildUrl(url) {
    const target = linkTarget(url);
    if (!target.href) {
      // Never a link: shown as text, with why.
      return h('div', { class: 'url-block' },
        h('div', { class: 'url-row url-unsafe' }, h('span', { class: 'url-text', title: url }, url)),
        h('div', { class: 'url-warning', role: 'alert' }, `Not opened as a link: ${target.problem}. Only http and https links are offered.`));
    }
    const { href, host } = target;
    const confirmRow = h('div', { class: 'url-confirm', hidden: true },
      h('span', null, 'Open ', h('strong', { class: 'url-confirm-host' }, host), ' in a new tab? Only continue if you trust this site.'),
      h('span', { class: 'url-confirm-actions' },
        h('a', {
          class: 'btn btn-primary btn-small', href, target: '_blank', rel: 'noopener noreferrer', 'data-action': 'open-url',
          onclick: () => { confirmRow.hidden = true; opened.hidden = false; openBtn.hidden = true; },
        }, 'Open'),
        h('button', { class: 'btn btn-small', type: 'button', onclick: () => { confirmRow.hidden = true; openBtn.hidden = false; } }, 'Back')));
    const opened = h('span', { class: 'url-opened', hidden: true }, '✓ Opened — press Done when you have finished there.');
    const openBtn = h('button', {
      class: 'btn btn-small', type: 'button', 'data-action': 'review-url',
      onclick: () => { confirmRow.hidden = false; openBtn.hidden = true; },
    }, 'Open link…');
    // The host first and bold: where the link really goes, whatever the path says.
    return h('div', { class: 'url-block' },
      h('div', { class: 'url-row' }, h('strong', { class: 'url-host' }, host), h('span', { class: 'url-text', title: url }, url), openBtn),
      confirmRow, opened);
  }

  buildQuestion(q) {
    const entry = { q, dirty: false, timer: null };
    entry.control = makeControl(q, () => this.onEdit(entry));
    if (q.kind === 'text' && this.ctx.client) {
      // Several people may type here at once: edits, not whole texts.
      entry.peersEl = h('div', { class: 'peers' });
      entry.control.el.append(entry.peersEl);
      entry.shared = new SharedField({
        client: this.ctx.client,
        chat: this.ctx.chat,
        target: { requestId: this.requestId, questionId: q.id },
        input: entry.control.focus,
        marks: entry.peersEl,
        onText: () => { entry.control.refresh?.(); this.showError(entry); },
      });
    }
    entry.errEl = h('div', { class: 'q-error', role: 'alert' });
    entry.hintEl = h('div', { class: 'q-hint' });
    entry.remoteEl = h('span', { class: 'q-remote', hidden: true, title: 'Someone on another client changed this answer' }, '● live');
    entry.skipBtn = q.required ? null : h('button', { class: 'link', type: 'button', 'data-action': 'skip', onclick: () => this.skip(entry) }, 'Skip');
    entry.skippedEl = h('div', { class: 'q-skipped', hidden: true }, 'Skipped. ',
      h('button', { class: 'link', type: 'button', 'data-action': 'unskip', onclick: () => this.unskip(entry) }, 'Answer it'));
    const rule = ruleHint(q);
    const labelFor = entry.control.focus?.id;
    entry.row = h('div', { class: 'question', 'data-qid': q.id, 'data-kind': q.kind },
      h('div', { class: 'q-head' },
        h(labelFor ? 'label' : 'span', { class: 'q-title', for: labelFor || null }, q.title ?? q.id,
          q.required ? h('span', { class: 'req', title: 'Required' }, ' *') : null),
        entry.remoteEl,
        h('span', { class: 'q-aside' }, rule ? h('span', { class: 'q-rule' }, rule) : null, entry.skipBtn)),
      q.message && q.message !== q.title ? inlineEl('div', 'q-message', q.message) : null,
      entry.control.el,
      entry.skippedEl,
      h('div', { class: 'q-foot' }, entry.errEl, entry.hintEl));
    this.questions.set(q.id, entry);
    return entry.row;
  }

  answers() {
    return this.request.answers ?? {};
  }

  /** Answering needs a participant: a viewer sees the card, read-only, and why. */
  refreshRole() {
    const ok = gate(this.ctx.role, 'participant', 'answering', this.actionsEl, this.roleEl);
    if (ok === this.allowed) return ok;
    this.allowed = ok;
    for (const entry of this.questions.values()) {
      entry.control.setDisabled(!ok);
      if (entry.skipBtn) entry.skipBtn.disabled = !ok;
    }
    setText(this.stateChip, ok ? 'Waiting for you' : 'Waiting');
    return ok;
  }

  refreshOpen() {
    const ok = this.refreshRole();
    const answers = this.answers();
    for (const [qid, entry] of this.questions) {
      const a = answers[qid];
      const skipped = a?.state === 'skipped';
      entry.row.classList.toggle('is-skipped', skipped);
      entry.skippedEl.hidden = !skipped;
      entry.control.el.hidden = skipped;
      if (entry.skipBtn) entry.skipBtn.hidden = skipped || !ok;
      entry.skippedEl.querySelector('[data-action="unskip"]').hidden = !ok;
      if (!entry.dirty && !skipped && !entry.shared?.active) {
        const before = entry.control.read();
        entry.control.show(a?.value);
        const after = entry.control.read();
        const editor = this.ctx.editors.get(`${this.requestId}/${qid}`);
        if (!sameValue(before, after) && editor && editor !== this.ctx.myId) {
          entry.row.classList.remove('flash');
          void entry.row.offsetWidth; // restart the animation
          entry.row.classList.add('flash');
        }
      }
      const editor = this.ctx.editors.get(`${this.requestId}/${qid}`);
      entry.remoteEl.hidden = !(editor && editor !== this.ctx.myId);
      this.showError(entry);
    }
    const rejection = this.ctx.rejections.get(`input:${this.requestId}`);
    this.errorEl.hidden = !rejection;
    setText(this.errorEl, rejection ? `The server refused that: ${rejection}` : '');
  }

  /** The error shown under a question: the value rules at once, `required` once a submit was tried. */
  showError(entry) {
    const { q } = entry;
    const a = this.answers()[q.id];
    let err = null;
    let hint = null;
    if (a?.state !== 'skipped') {
      const v = entry.control.read() ?? defaultAnswerValue(q);
      if (v !== undefined) {
        const draftErr = checkAnswer(q, { state: 'draft', value: v });
        const subErr = checkAnswer(q, { state: 'submitted', value: v });
        // Whoever entered it, a value the server would refuse on submit is flagged now.
        err = draftErr ?? subErr;
        if (q.kind === 'text') hint = formatHint(q, v.value);
      } else if (q.required && this.submitTried) {
        err = 'Required.';
      }
    }
    if (entry.forcedError && this.submitTried) err = entry.forcedError;
    setText(entry.errEl, err ?? '');
    setText(entry.hintEl, err ? '' : hint ?? '');
    entry.row.classList.toggle('has-error', !!err);
  }

  onEdit(entry) {
    if (entry.shared?.active) {
      // The shared field sends the edit itself.
      entry.forcedError = null;
      this.showError(entry);
      return;
    }
    entry.dirty = true;
    entry.forcedError = null;
    this.ctx.rejections.delete(`input:${this.requestId}`);
    this.showError(entry);
    clearTimeout(entry.timer);
    entry.timer = setTimeout(() => this.flush(entry), DRAFT_DEBOUNCE_MS);
  }

  /** Send the entry's current value as a draft (or remove it when empty). */
  flush(entry) {
    clearTimeout(entry.timer);
    entry.timer = null;
    if (!entry.dirty) return;
    entry.dirty = false;
    const v = entry.control.read();
    const current = this.answers()[entry.q.id];
    let answer;
    if (v === undefined) {
      if (current === undefined) return;
      answer = undefined;
    } else {
      answer = { state: 'draft', value: v };
      // The server refuses drafts of the wrong kind or with fractions for an
      // integer question; keep those local and show why.
      if (checkAnswer(entry.q, answer)) return;
      if (current?.state === 'draft' && sameValue(current.value, v)) return;
    }
    const action = { type: 'chat/inputAnswerChanged', requestId: this.requestId, questionId: entry.q.id };
    if (answer) action.answer = answer;
    this.ctx.editors.set(`${this.requestId}/${entry.q.id}`, this.ctx.myId);
    this.ctx.client.dispatch(this.ctx.chat, action);
  }

  flushAll() {
    for (const entry of this.questions.values()) this.flush(entry);
  }

  skip(entry) {
    clearTimeout(entry.timer);
    entry.dirty = false;
    this.ctx.editors.set(`${this.requestId}/${entry.q.id}`, this.ctx.myId);
    this.ctx.client.dispatch(this.ctx.chat, {
      type: 'chat/inputAnswerChanged', requestId: this.requestId, questionId: entry.q.id, answer: { state: 'skipped' },
    });
  }

  unskip(entry) {
    this.ctx.client.dispatch(this.ctx.chat, {
      type: 'chat/inputAnswerChanged', requestId: this.requestId, questionId: entry.q.id,
    });
    setTimeout(() => entry.control.focus?.focus(), 0);
  }

  /** The `answers` of an accepting completion: every question with a value. */
  collect() {
    const out = {};
    const current = this.answers();
    for (const [qid, entry] of this.questions) {
      if (current[qid]?.state === 'skipped') {
        out[qid] = { state: 'skipped' };
        continue;
      }
      const v = entry.control.read() ?? defaultAnswerValue(entry.q);
      if (v !== undefined) out[qid] = { state: 'submitted', value: v };
    }
    return out;
  }

  submit() {
    this.submitTried = true;
    this.flushAll();
    const answers = this.collect();
    const errors = checkAccept(this.request, answers, this.answers());
    for (const [qid, entry] of this.questions) {
      entry.forcedError = errors[qid] ?? null;
      this.showError(entry);
    }
    const first = [...this.questions.values()].find((e) => errors[e.q.id]);
    if (first) {
      first.row.scrollIntoView({ block: 'nearest', behavior: 'smooth' });
      first.control.focus?.focus({ preventScroll: true });
      return;
    }
    this.ctx.rejections.delete(`input:${this.requestId}`);
    const action = { type: 'chat/inputCompleted', requestId: this.requestId, response: 'accept' };
    if (Object.keys(answers).length) action.answers = answers;
    this.ctx.client.dispatch(this.ctx.chat, action);
  }

  complete(response) {
    for (const entry of this.questions.values()) {
      clearTimeout(entry.timer);
      entry.dirty = false;
    }
    this.ctx.rejections.delete(`input:${this.requestId}`);
    this.ctx.client.dispatch(this.ctx.chat, { type: 'chat/inputCompleted', requestId: this.requestId, response });
  }

  // ── settled ──

  buildSettled() {
    for (const entry of this.questions.values()) clearTimeout(entry.timer);
    this.questions.clear();
    const [label, kind] = RESPONSE_LABEL[this.part.response] ?? ['Not answered', 'muted'];
    this.stateChip = chip(label, kind);
    this.answersEl = h('dl', { class: 'answers' });
    this.urlEl = this.request.url ? h('div', { class: 'url-row settled' }, h('span', { class: 'url-text' }, this.request.url)) : null;
    this.actEl = h('div', { class: 'card-act', hidden: true });
    setChildren(this.el, this.head(this.stateChip), h('div', { class: 'card-body' }, this.urlEl, this.answersEl, this.actEl));
  }

  refreshSettled() {
    const r = this.request;
    const answers = r.answers ?? {};
    const act = this.ctx.acts?.get(`input:${this.requestId}`) ?? null;
    showAct(this.actEl, act);
    const rows = (r.questions ?? []).map((q) => {
      const a = answers[q.id];
      const text = describeAnswer(q, a);
      const final = this.part.response === 'accept' ? a?.state === 'submitted' || a?.state === 'skipped' : false;
      const by = act?.answeredBy?.[q.id];
      return h('div', { class: `answer-row${final ? '' : ' is-draft'}`, 'data-qid': q.id, title: by ? `Answered by ${by}` : null },
        h('dt', null, q.title ?? q.id),
        h('dd', null, text == null ? h('span', { class: 'muted' }, '—') : text,
          a?.state === 'draft' ? h('span', { class: 'tag tag-muted' }, 'draft') : null));
    });
    const sig = JSON.stringify([r.answers, this.part.response, act?.answeredBy]);
    if (sig !== this.sig) {
      this.sig = sig;
      setChildren(this.answersEl, rows);
      this.answersEl.hidden = rows.length === 0;
    }
  }

  dispose() {
    for (const entry of this.questions.values()) clearTimeout(entry.timer);
  }
}

// ─── Tool calls ──────────────────────────────────────────────────────────

const TOOL_CHIP = {
  streaming: ['Preparing', 'info'],
  'pending-confirmation': ['Needs approval', 'warn'],
  running: ['Running', 'info'],
  'auth-required': ['Needs sign-in', 'warn'],
  'pending-result-confirmation': ['Review result', 'warn'],
};

function prettyInput(input) {
  if (input == null) return '';
  if (typeof input !== 'string') return `(stored at ${input.uri})`;
  try {
    return JSON.stringify(JSON.parse(input), null, 2);
  } catch {
    return input;
  }
}

function resultText(tc) {
  return (tc.content ?? []).map((c) => {
    if (c.type === 'text') return prettyInput(c.text);
    return `[${c.type}]`;
  }).join('\n');
}

/** A tool call part. `ctx`: {client, chat, turnId, rejections}. */
export class ToolCallCard {
  constructor(part, ctx) {
    this.ctx = ctx;
    this.toolCallId = part.toolCall.toolCallId;
    this.el = h('section', { class: 'card tool-card', 'data-tool-call-id': this.toolCallId });
    this.status = null;
    this.update(part, ctx);
  }

  update(part, ctx = this.ctx) {
    this.ctx = ctx;
    this.tc = part.toolCall;
    const status = this.tc.status;
    this.el.dataset.status = status;
    if (status !== this.status) {
      this.status = status;
      this.build();
    }
    this.refresh();
  }

  chipFor() {
    const tc = this.tc;
    if (tc.status === 'completed') return tc.success ? chip('Done', 'ok') : chip('Failed', 'err');
    if (tc.status === 'cancelled') {
      return chip({ denied: 'Denied', skipped: 'Skipped', 'result-denied': 'Result denied' }[tc.reason] ?? 'Cancelled', 'muted');
    }
    const [label, kind] = TOOL_CHIP[tc.status] ?? [tc.status, 'muted'];
    return chip(label, kind);
  }

  build() {
    const tc = this.tc;
    const title = tc.status === 'pending-confirmation' && tc.confirmationTitle
      ? tc.confirmationTitle
      : tc.status === 'completed' ? (tc.pastTenseMessage ?? `Ran ${tc.displayName}`) : (tc.invocationMessage ?? tc.displayName);
    const head = h('header', { class: 'card-head' },
      h('span', { class: `card-icon icon-tool${tc.status === 'running' || tc.status === 'streaming' ? ' spin' : ''}`, 'aria-hidden': 'true' }, '⚙'),
      h('div', { class: 'card-titles' },
        inlineEl('div', 'card-title', title),
        h('div', { class: 'card-sub' }, h('code', null, tc.toolName ?? tc.displayName), this.metaLine())),
      this.chipFor());
    const body = h('div', { class: 'card-body' });
    // Approving needs an approver: others see the card, without buttons, and why.
    this.roleEl = h('div', { class: 'role-note', role: 'note', hidden: true });
    this.decideEl = null;
    this.editBtn = null;
    if (tc.status === 'pending-confirmation') this.buildPending(body);
    else this.buildInfo(body);
    this.actEl = h('div', { class: 'card-act', hidden: true });
    body.append(this.roleEl, this.actEl);
    setChildren(this.el, head, body);
  }

  metaLine() {
    const tc = this.tc;
    const bits = [];
    if (tc.selectedOption && tc.status !== 'cancelled') bits.push(tc.selectedOption.label);
    else if (tc.confirmed === 'setting') bits.push('approved by a session setting');
    else if (tc.confirmed === 'not-needed' && tc.status === 'completed') bits.push('no approval needed');
    return bits.length ? ` · ${bits.join(' · ')}` : '';
  }

  buildInfo(body) {
    const tc = this.tc;
    if (tc.status === 'streaming') {
      body.append(h('pre', { class: 'code small' }, tc.partialInput ?? '…'));
      return;
    }
    if (tc.status === 'cancelled' && tc.reasonMessage) {
      body.append(h('div', { class: 'reason' }, 'Reason: ', textOf(tc.reasonMessage)));
    }
    const input = prettyInput(tc.toolInput);
    if (input) {
      body.append(h('details', { class: 'io' }, h('summary', null, 'Input'), h('pre', { class: 'code small' }, input)));
    }
    if (tc.status === 'completed' || tc.status === 'pending-result-confirmation') {
      const out = resultText(tc);
      if (out) body.append(h('details', { class: 'io', open: true }, h('summary', null, 'Result'), h('pre', { class: 'code small result' }, out)));
      if (tc.error) body.append(h('div', { class: 'card-error' }, textOf(tc.error.message ?? tc.error)));
    }
    if (tc.status === 'pending-result-confirmation') {
      body.append(this.decideEl = h('footer', { class: 'card-actions' },
        h('button', { class: 'btn btn-primary', type: 'button', onclick: () => this.confirmResult(true) }, 'Accept result'),
        h('button', { class: 'btn btn-danger', type: 'button', onclick: () => this.confirmResult(false) }, 'Reject result')));
    }
    if (tc.status === 'running') body.append(h('div', { class: 'muted small' }, 'Running…'));
  }

  buildPending(body) {
    const tc = this.tc;
    const inline = typeof tc.toolInput === 'string';
    const original = inline ? tc.toolInput : null;
    this.original = original;
    if (tc.invocationMessage) body.append(inlineEl('div', 'invocation', tc.invocationMessage));
    this.inputView = h('pre', { class: 'code small tool-input' }, prettyInput(tc.toolInput));
    this.editor = h('textarea', { class: 'input code-input', rows: 8, spellcheck: 'false', 'aria-label': 'Tool input', hidden: true });
    this.editorHint = h('div', { class: 'q-error', role: 'alert' });
    this.editor.addEventListener('input', () => this.checkEdit());
    const editable = tc.editable === true && inline;
    this.editBtn = editable ? h('button', { class: 'link', type: 'button', 'data-action': 'edit-input', onclick: () => this.toggleEdit() }, 'Edit input') : null;
    body.append(h('div', { class: 'io-head' }, h('span', { class: 'label' }, 'Input'), this.editBtn), this.inputView, this.editor, this.editorHint);

    const options = tc.options?.length ? tc.options : [
      { id: undefined, label: 'Approve', kind: 'approve' },
      { id: undefined, label: 'Deny', kind: 'deny' },
    ];
    this.denyBox = h('div', { class: 'deny-box', hidden: true },
      h('label', { class: 'label', for: `deny-${this.toolCallId}` }, 'Why? (optional — the agent sees this)'),
      this.reasonInput = h('textarea', { class: 'input', rows: 2, id: `deny-${this.toolCallId}`, placeholder: 'e.g. not during business hours' }),
      h('div', { class: 'card-actions' },
        this.denyConfirm = h('button', { class: 'btn btn-danger', type: 'button', 'data-action': 'deny-confirm' }, 'Deny'),
        h('button', { class: 'btn btn-ghost', type: 'button', onclick: () => { this.denyBox.hidden = true; this.actions.hidden = false; } }, 'Back')));
    let firstApprove = true;
    let lastGroup = null;
    const buttons = [];
    for (const o of options) {
      if (lastGroup != null && o.group != null && o.group !== lastGroup) buttons.push(h('span', { class: 'divider' }));
      lastGroup = o.group ?? lastGroup;
      if (o.kind === 'approve') {
        const cls = firstApprove ? 'btn btn-primary' : 'btn';
        firstApprove = false;
        buttons.push(h('button', { class: cls, type: 'button', 'data-option': o.id ?? 'approve', onclick: () => this.approve(o) }, o.label));
      } else {
        buttons.push(h('button', {
          class: 'btn btn-danger-outline', type: 'button', 'data-option': o.id ?? 'deny',
          onclick: () => {
            this.actions.hidden = true;
            this.denyBox.hidden = false;
            this.denyConfirm.onclick = () => this.deny(o);
            this.reasonInput.focus();
          },
        }, o.label));
      }
    }
    this.actions = h('footer', { class: 'card-actions' }, buttons);
    this.errorEl = h('div', { class: 'card-error', role: 'alert', hidden: true });
    this.decideEl = h('div', { class: 'decide' }, this.actions, this.denyBox);
    body.append(this.errorEl, this.decideEl);
  }

  refresh() {
    showAct(this.actEl, this.ctx.acts?.get(`tool:${this.toolCallId}`) ?? null);
    if (this.decideEl) {
      const what = this.status === 'pending-confirmation' ? 'approving' : 'accepting a result';
      const ok = gate(this.ctx.role, 'approver', what, this.decideEl, this.roleEl);
      if (this.editBtn) this.editBtn.hidden = !ok;
    }
    if (this.status !== 'pending-confirmation') return;
    const rejection = this.ctx.rejections.get(`tool:${this.toolCallId}`);
    this.errorEl.hidden = !rejection;
    setText(this.errorEl, rejection ? `The server refused that: ${rejection}` : '');
    if (this.editor.hidden) setText(this.inputView, prettyInput(this.tc.toolInput));
  }

  toggleEdit() {
    const editing = this.editor.hidden;
    this.editor.hidden = !editing;
    this.inputView.hidden = editing;
    setText(this.editBtn, editing ? 'Discard edits' : 'Edit input');
    if (editing) {
      this.editor.value = prettyInput(this.original);
      this.editor.focus({ preventScroll: true });
      this.editor.setSelectionRange(0, 0);
      this.editor.scrollTop = 0;
    }
    this.checkEdit();
  }

  /** The edited input, or undefined when unchanged / not editing. Null when invalid. */
  editedInput() {
    if (this.editor.hidden) return undefined;
    const text = this.editor.value;
    let originalJson = true;
    try { JSON.parse(this.original); } catch { originalJson = false; }
    if (originalJson) {
      let parsed;
      try { parsed = JSON.parse(text); } catch { return null; }
      const compact = JSON.stringify(parsed);
      return compact === JSON.stringify(JSON.parse(this.original)) ? undefined : compact;
    }
    return text === this.original ? undefined : text;
  }

  checkEdit() {
    const v = this.editedInput();
    setText(this.editorHint, v === null ? 'The input must stay valid JSON.' : '');
    return v;
  }

  approve(option) {
    const edited = this.checkEdit();
    if (edited === null) return;
    const action = {
      type: 'chat/toolCallConfirmed', turnId: this.ctx.turnId, toolCallId: this.toolCallId,
      approved: true, confirmed: 'user-action',
    };
    if (option.id) action.selectedOptionId = option.id;
    if (edited !== undefined) action.editedToolInput = edited;
    this.ctx.rejections.delete(`tool:${this.toolCallId}`);
    this.ctx.client.dispatch(this.ctx.chat, action);
  }

  deny(option) {
    const action = {
      type: 'chat/toolCallConfirmed', turnId: this.ctx.turnId, toolCallId: this.toolCallId,
      approved: false, confirmed: 'user-action', reason: 'denied',
    };
    if (option.id) action.selectedOptionId = option.id;
    const why = this.reasonInput.value.trim();
    if (why) action.reasonMessage = why;
    this.ctx.rejections.delete(`tool:${this.toolCallId}`);
    this.ctx.client.dispatch(this.ctx.chat, action);
  }

  confirmResult(approved) {
    this.ctx.client.dispatch(this.ctx.chat, {
      type: 'chat/toolCallResultConfirmed', turnId: this.ctx.turnId, toolCallId: this.toolCallId, approved,
    });
  }

  dispose() {}
}

export { escapeHtml };

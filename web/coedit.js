// Typing together in one text (Tandem's `tandem/openText` / `tandem/editText`
// / `tandem/setPresence`): the browser side of `src/coedit`.
//
// An operation is the wire form itself: an array walking the whole text in
// UTF-16 code units (JavaScript string indices) — a positive number keeps
// that many, a negative one deletes that many, a string inserts itself.

import { sendPresence } from './presence.js';

/** Append a step to `op`, keeping the canonical form the server keeps. */
function push(op, step) {
  if (step === 0 || step === '') return;
  const last = op[op.length - 1];
  if (typeof step === 'string') {
    if (typeof last === 'string') op[op.length - 1] = last + step;
    else if (typeof last === 'number' && last < 0) {
      const before = op[op.length - 2];
      if (typeof before === 'string') op[op.length - 2] = before + step;
      else op.splice(op.length - 1, 0, step);
    } else op.push(step);
  } else if (typeof last === 'number' && Math.sign(last) === Math.sign(step)) {
    op[op.length - 1] = last + step;
  } else op.push(step);
}

const baseLen = (op) => op.reduce((n, s) => (typeof s === 'string' ? n : n + Math.abs(s)), 0);

/** `op` applied to `text`. */
export function apply(op, text) {
  if (baseLen(op) !== text.length) throw new Error(`the edit covers ${baseLen(op)} units but the text has ${text.length}`);
  let out = '';
  let at = 0;
  for (const s of op) {
    if (typeof s === 'string') out += s;
    else if (s > 0) { out += text.slice(at, at + s); at += s; } else at -= s;
  }
  return out;
}

/** A walk over an op that can stop inside a step. */
class Walk {
  constructor(op) { this.op = op; this.i = 0; this.off = 0; }
  peek() {
    const s = this.op[this.i];
    if (s === undefined) return undefined;
    if (typeof s === 'string') return s.slice(this.off);
    return s > 0 ? s - this.off : s + this.off;
  }
  take(n) {
    const s = this.op[this.i];
    const len = typeof s === 'string' ? s.length : Math.abs(s);
    this.off += n;
    if (this.off >= len) { this.i += 1; this.off = 0; }
  }
}

const size = (p) => (typeof p === 'string' ? p.length : Math.abs(p));

/** `a` then `b` as one op. */
export function compose(a, b) {
  const out = [];
  const x = new Walk(a);
  const y = new Walk(b);
  for (;;) {
    const p = x.peek();
    const q = y.peek();
    if (p === undefined && q === undefined) return out;
    if (typeof p === 'number' && p < 0) { push(out, p); x.take(-p); continue; }
    if (typeof q === 'string') { push(out, q); y.take(q.length); continue; }
    if (p === undefined || q === undefined) throw new Error('compose: lengths differ');
    const n = Math.min(size(p), size(q));
    if (typeof p === 'string') {
      if (q > 0) push(out, p.slice(0, n));
    } else if (q > 0) push(out, n);
    else push(out, -n);
    x.take(n);
    y.take(n);
  }
}

/** [a', b'] such that a then b' = b then a'; at one place a's insert goes first. */
export function transform(a, b) {
  const a2 = [];
  const b2 = [];
  const x = new Walk(a);
  const y = new Walk(b);
  for (;;) {
    const p = x.peek();
    const q = y.peek();
    if (p === undefined && q === undefined) return [a2, b2];
    if (typeof p === 'string') { push(a2, p); push(b2, p.length); x.take(p.length); continue; }
    if (typeof q === 'string') { push(a2, q.length); push(b2, q); y.take(q.length); continue; }
    if (p === undefined || q === undefined) throw new Error('transform: lengths differ');
    const n = Math.min(size(p), size(q));
    if (p > 0 && q > 0) { push(a2, n); push(b2, n); } else if (p < 0 && q > 0) push(a2, -n);
    else if (p > 0 && q < 0) push(b2, -n);
    x.take(n);
    y.take(n);
  }
}

/** Where caret `index` is after `op`; text inserted at an `own` caret goes after it. */
export function transformIndex(op, index, own) {
  let left = index;
  let moved = index;
  for (const s of op) {
    if (typeof s === 'string') {
      if (own && left === 0) break;
      moved += s.length;
    } else if (s > 0) {
      if (s > left) break;
      left -= s;
    } else {
      moved -= Math.min(left, -s);
      if (-s > left) break;
      left += s;
    }
  }
  return moved;
}

/**
 * The op from `a` to `b` as one changed range (what one input event does).
 * With `caret` (where the caret is in `b`), the range ends there: typing
 * "a" after "a" inserts after the caret's "a", not after the last one.
 */
export function diff(a, b, caret) {
  let start = 0;
  while (start < a.length && start < b.length && a[start] === b[start]) start++;
  if (caret != null) start = Math.min(start, Math.max(0, caret - Math.max(0, b.length - a.length)));
  let end = 0;
  while (end < a.length - start && end < b.length - start && a[a.length - 1 - end] === b[b.length - 1 - end]) end++;
  // Never split a surrogate pair.
  if (start > 0 && /[\uD800-\uDBFF]/.test(a[start - 1] ?? '')) start--;
  if (end > 0 && /[\uDC00-\uDFFF]/.test(a[a.length - end] ?? '')) end--;
  const op = [];
  push(op, start);
  push(op, b.slice(start, b.length - end));
  push(op, -(a.length - start - end));
  push(op, end);
  return op;
}

const isNoop = (op) => op.every((s) => typeof s === 'number' && s > 0);

/** One editor of a shared text (as `tandem::coedit::TextClient`). */
export class TextEditor {
  constructor(author, text, rev) {
    this.author = author;
    this.rev = rev;
    this.server = text;
    this.text = text;
    this.sent = null; // { seq, op }
    this.buffer = null;
    this.nextSeq = 1;
  }

  settled() { return !this.sent && !this.buffer; }

  send(op) {
    this.sent = { seq: this.nextSeq++, op };
    return { seq: this.sent.seq, base: this.rev, op };
  }

  /** The person typed `op`; the edit to send now, if none is in flight. */
  local(op) {
    this.text = apply(op, this.text);
    if (!this.sent) return this.send(op);
    this.buffer = this.buffer ? compose(this.buffer, op) : op;
    return null;
  }

  /** An edit the server published: { remote: op } | { acked: next|null } | null. */
  receive(edit) {
    if (edit.rev <= this.rev) return null;
    if (edit.rev !== this.rev + 1) throw new Error(`missed edits: at ${this.rev}, got ${edit.rev}`);
    this.server = apply(edit.op, this.server);
    this.rev = edit.rev;
    if (edit.author === this.author && this.sent?.seq === edit.seq) {
      this.sent = null;
      const b = this.buffer;
      this.buffer = null;
      return { acked: b ? this.send(b) : null };
    }
    let op = edit.op;
    if (this.sent) { const [s2, o2] = transform(this.sent.op, op); this.sent.op = s2; op = o2; }
    if (this.buffer) { const [b2, o2] = transform(this.buffer, op); this.buffer = b2; op = o2; }
    this.text = apply(op, this.text);
    return { remote: op };
  }

  /** Re-base on the server's `text` at `rev` (`taken`: its last edit number taken from here). */
  rebase(text, rev, taken) {
    let known = this.server;
    let mine = this.buffer;
    if (this.sent && this.sent.seq <= taken) known = apply(this.sent.op, this.server);
    else if (this.sent) mine = this.buffer ? compose(this.sent.op, this.buffer) : this.sent.op;
    this.sent = null;
    this.buffer = null;
    const theirs = diff(known, text);
    const before = this.text;
    this.server = text;
    this.rev = rev;
    let out = null;
    if (mine) {
      const [m2] = transform(mine, theirs);
      this.text = apply(m2, text);
      if (!isNoop(m2)) out = this.send(m2);
    } else this.text = text;
    return { shown: diff(before, this.text), out };
  }
}

const sameTarget = (a, b) => JSON.stringify(a) === JSON.stringify(b);
const PRESENCE_EVERY_MS = 150;

/**
 * A text field several people type into at once: binds an <input> or
 * <textarea> to one of a chat's texts. Until the server answers
 * `tandem/openText` (or when it cannot, e.g. an older server) the field is
 * `active === false` and the caller keeps sending whole-text drafts.
 */
export class SharedField {
  constructor({ client, chat, target, input, marks, onText }) {
    Object.assign(this, { client, chat, target, input, marks, onText });
    this.active = false;
    this.editor = null;
    this.others = new Map(); // clientId -> { name, caret, rev, state }
    this.lastPresence = 0;
    this.presenceTimer = null;
    this.handlers = {
      input: () => this.typed(),
      select: () => this.presence(),
      keyup: () => this.presence(),
      click: () => this.presence(),
      focus: () => this.presence(),
      // Away only when focus went nowhere: a move to another shared field
      // says where the person is now (presence is one place per page).
      blur: () => setTimeout(() => {
        const el = document.activeElement;
        if (!el || !['INPUT', 'TEXTAREA'].includes(el.tagName)) this.away();
      }, 0),
    };
    for (const [ev, f] of Object.entries(this.handlers)) input.addEventListener(ev, f);
    this.onEnvelope = (e) => this.envelope(e.detail.envelope);
    this.onNote = (e) => this.note(e.detail);
    client.addEventListener('envelope', this.onEnvelope);
    client.addEventListener('notification', this.onNote);
    this.open();
  }

  close() {
    for (const [ev, f] of Object.entries(this.handlers)) this.input.removeEventListener(ev, f);
    this.client.removeEventListener('envelope', this.onEnvelope);
    this.client.removeEventListener('notification', this.onNote);
    clearTimeout(this.presenceTimer);
    this.active = false;
    this.others.clear();
    this.render();
  }

  async open() {
    let r;
    try {
      r = await this.client.request('tandem/openText', { channel: this.chat, target: this.target });
    } catch {
      return; // Not editable together here: whole-text drafts as before.
    }
    const typed = this.input.value;
    let resend = null;
    if (!this.editor) this.editor = new TextEditor(this.client.clientId, r.text, r.rev);
    else {
      const { shown, out } = this.editor.rebase(r.text, r.rev, r.taken);
      this.show(shown);
      resend = out;
    }
    this.active = true;
    if (resend) {
      // What was typed here and not taken yet, carried onto the text.
      this.send(resend);
    } else if (typed !== this.editor.text && typed !== '') {
      // Typed while the text was being opened: that goes first.
      this.send(this.editor.local(diff(this.editor.text, typed)));
    } else if (typed !== this.editor.text) {
      this.input.value = this.editor.text;
    }
    this.onText?.();
    this.presence();
    try {
      const list = await this.client.request('tandem/listPresence', { channel: this.chat });
      for (const p of list.presence ?? []) this.note({ method: 'tandem/presence', params: p });
    } catch { /* presence is a nicety */ }
  }

  typed() {
    if (!this.active) return;
    const op = diff(this.editor.text, this.input.value, this.input.selectionEnd);
    if (isNoop(op)) return;
    this.send(this.editor.local(op));
    for (const o of this.others.values()) if (o.caret) o.caret = mapCaret(op, o.caret, false);
    this.presence();
    this.render();
  }

  async send(out) {
    if (!out) return;
    try {
      await this.client.request('tandem/editText', {
        channel: this.chat, target: this.target, base: out.base, seq: out.seq, op: out.op,
      });
    } catch (e) {
      if (e.code === -32011 && e.data) {
        // An answer about an edit no longer in flight is old news.
        if (this.editor.sent?.seq !== out.seq) return;
        const { shown, out: next } = this.editor.rebase(e.data.text, e.data.rev, e.data.taken);
        this.show(shown);
        this.send(next);
      } else if (e.code === -1 || e.code === -2) {
        // The connection went (or the answer did not come): send it again,
        // as it now stands, once there is a connection; it is taken once.
        const f = this.editor.sent;
        if (f && f.seq === out.seq) this.send({ seq: f.seq, base: this.editor.rev, op: f.op });
      } else {
        console.warn('edit not taken', e.message);
        // Whether it was kept is unknown (say, the node that runs the chat
        // did not answer): re-base on the text as it stands after a pause
        // (the re-base sends it again unless it was taken). Not for an edit
        // that is itself refused, nor where editing is not allowed.
        if (e.code !== -32602 && e.code !== -32009) {
          setTimeout(() => { if (this.editor?.sent?.seq === out.seq) this.open(); }, 1000);
        }
      }
    }
  }

  envelope(env) {
    const a = env.action;
    if (!this.editor || a?.type !== 'tandem/textEdited' || !sameTarget(a.target, this.target)) return;
    let r;
    try {
      r = this.editor.receive(a);
    } catch {
      this.open(); // Edits were missed (a snapshot instead of a replay): re-base.
      return;
    }
    if (!r) return;
    // Others' carets on the revision before this edit move with it — but
    // not over this page's own edit, which moved them when it was typed.
    for (const o of this.others.values()) {
      if (!o.caret || o.rev !== a.rev - 1) continue;
      if (!('acked' in r)) o.caret = mapCaret(a.op, o.caret, false);
      o.rev = a.rev;
    }
    if ('acked' in r) {
      this.send(r.acked);
      // Everything typed here is taken: the caret is exact now.
      if (!r.acked) this.presence();
      this.render();
    } else this.show(r.remote);
  }

  /** Show what others did (`op`) without moving this person's caret. */
  show(op) {
    const el = this.input;
    if (el.value === this.editor.text) return;
    const { selectionStart: s, selectionEnd: e, selectionDirection: d } = el;
    el.value = this.editor.text;
    if (s != null && document.activeElement === el) {
      try { el.setSelectionRange(transformIndex(op, s, true), transformIndex(op, e, true), d ?? 'none'); } catch { /* not selectable */ }
    }
    this.onText?.();
    this.render();
  }

  /** Say where this person is in the field (only while it has the focus). */
  presence() {
    if (!this.active) return;
    clearTimeout(this.presenceTimer);
    const el = this.input;
    if (document.activeElement !== el) return;
    const wait = this.lastPresence + PRESENCE_EVERY_MS - Date.now();
    if (wait > 0) {
      this.presenceTimer = setTimeout(() => this.presence(), wait);
      return;
    }
    this.lastPresence = Date.now();
    const params = { channel: this.chat, target: this.target, rev: this.editor.rev, state: 'active' };
    // Carets count on the server's text: only a settled editor's caret is exact.
    if (el.selectionStart != null && this.editor.settled()) {
      params.caret = { anchor: el.selectionStart, head: el.selectionEnd };
    }
    sendPresence(this.client, params).catch(() => {});
  }

  /**
   * The person left every field, not the chat: here, in no text. Not
   * `idle`, which tells the server nobody is looking (a person reading the
   * chat, or pressing a card's button, would be sent their requests).
   */
  away() {
    if (!this.active) return;
    clearTimeout(this.presenceTimer);
    sendPresence(this.client, { channel: this.chat, state: 'active' }).catch(() => {});
  }

  note({ method, params: p }) {
    if (method !== 'tandem/presence' || p?.channel !== this.chat || p.clientId === this.client.clientId) return;
    if (p.state === 'gone' || !sameTarget(p.target, this.target)) this.others.delete(p.clientId);
    else {
      // A caret counts on the text at `rev`: drawn while this page is at
      // that revision too (one ahead of here is drawn once it catches up).
      // The server names each entry's person (`name`); an older one did not.
      const name = p.name || (p.subject && p.subject !== 'local' ? p.subject : `guest ${p.clientId.replace(/^web-/, '').slice(0, 4)}`);
      this.others.set(p.clientId, { name, caret: p.caret ?? null, rev: p.rev, state: p.state });
    }
    this.render();
  }

  /** Others on this text: a chip each, and their named caret over the field. */
  render() {
    if (!this.marks) return;
    this.marks.replaceChildren();
    const el = this.input;
    for (const [id, o] of this.others) {
      const here = o.caret && o.state === 'active' && o.rev === this.editor?.rev;
      const where = here ? (o.caret.anchor === o.caret.head ? `at ${o.caret.head}` : `${Math.min(o.caret.anchor, o.caret.head)}–${Math.max(o.caret.anchor, o.caret.head)}`) : '';
      const chipEl = document.createElement('span');
      chipEl.className = `peer peer-${o.state}`;
      chipEl.dataset.client = id;
      chipEl.textContent = `${o.name}${o.state === 'idle' ? ' (away)' : ''}${where ? ` · ${where}` : ''}`;
      this.marks.append(chipEl);
      const box = here ? caretBox(el, o.caret.head) : null;
      if (box) {
        const bar = document.createElement('span');
        bar.className = 'peer-caret';
        bar.dataset.client = id;
        bar.title = o.name;
        Object.assign(bar.style, { left: `${box.x}px`, top: `${box.y}px`, height: `${box.h}px` });
        bar.textContent = o.name;
        this.marks.append(bar);
      }
    }
  }
}

function mapCaret(op, c, own) {
  return { anchor: transformIndex(op, c.anchor, own), head: transformIndex(op, c.head, own) };
}

let mirror;
/**
 * Where the caret before unit `i` of field `el` is drawn, in the box of
 * `el`'s offset parent (where the marks are placed too): `{x, y, h}`, or
 * null when it is scrolled out of sight. A hidden copy of the field with
 * the same font, padding and width lays out the text up to `i` (wrapped as
 * a <textarea> wraps it) and a marker after it gives the spot.
 */
function caretBox(el, i) {
  mirror ??= document.createElement('div');
  if (!mirror.isConnected) document.body.append(mirror);
  const cs = getComputedStyle(el);
  const one = el.tagName === 'INPUT';
  const px = (v) => parseFloat(v) || 0;
  const style = mirror.style;
  style.cssText = 'position:absolute;visibility:hidden;top:0;left:-9999px;overflow:hidden;box-sizing:border-box';
  for (const k of ['font', 'letterSpacing', 'wordSpacing', 'textTransform', 'textIndent', 'tabSize', 'lineHeight',
    'paddingTop', 'paddingRight', 'paddingBottom', 'paddingLeft',
    'borderTopWidth', 'borderRightWidth', 'borderBottomWidth', 'borderLeftWidth', 'borderStyle']) style[k] = cs[k];
  style.whiteSpace = one ? 'pre' : 'pre-wrap';
  style.overflowWrap = 'break-word';
  // A <textarea> wraps inside its client width (without its scroll bar).
  style.width = one ? 'auto' : `${el.clientWidth + px(cs.borderLeftWidth) + px(cs.borderRightWidth)}px`;
  mirror.textContent = el.value.slice(0, i);
  const mark = document.createElement('span');
  mark.textContent = '\u200b';
  mirror.append(mark);
  const x = el.offsetLeft + mark.offsetLeft - el.scrollLeft;
  if (one) return { x, y: el.offsetTop + 2, h: el.offsetHeight - 4 };
  const y = el.offsetTop + mark.offsetTop - el.scrollTop;
  const h = mark.offsetHeight || px(cs.lineHeight) || 18;
  const top = el.offsetTop + px(cs.borderTopWidth);
  if (y < top - 1 || y + h > top + el.clientHeight + 1) return null;
  return { x, y, h };
}

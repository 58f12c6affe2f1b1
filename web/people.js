// People in the web client (docs/protocol.md, "People"): the person's name,
// their role in the open session, and how the record's authors and acts
// read.
//
// - Without authentication the person names themself: a "Your name" field,
//   remembered in localStorage, sent as `_meta["tandem/name"]` in
//   `initialize` / `reconnect` and with `tandem/setName` when changed. With a
//   token the token names them: the field shows that name, read-only.
// - `tandem/access` gives the person's role in a session; the cards and the
//   composer offer only what that role may do, and say why not.
// - A message's `_meta["tandem/author"]` and a system notification's
//   `_meta["tandem/act"]` (written by the host only) name who did what.

import { h, setChildren, setText } from './dom.js';
import { sendPresence, forgetPresence } from './presence.js';

export const ROLES = ['viewer', 'participant', 'approver', 'owner'];

/**
 * Whether `role` includes `need`. `undefined`: not known yet (nothing is
 * offered until it is); `null`: this server has no roles (all is offered,
 * the server decides).
 */
export function can(role, need) {
  if (role === null) return true;
  if (role === undefined) return false;
  return ROLES.indexOf(role) >= ROLES.indexOf(need);
}

const article = (word) => (/^[aeiou]/.test(word) ? 'an' : 'a');

/** Why `role` cannot do `what`: "You are a viewer in this session: approving needs the approver role". */
export function roleNote(role, what, need) {
  return `You are ${article(role)} ${role} in this session: ${what} needs the ${need} role`;
}

/** The payload of a JWT, or null (shown names only: the server decides). */
export function tokenClaims(token) {
  try {
    return JSON.parse(atob(token.split('.')[1].replace(/-/g, '+').replace(/_/g, '/')));
  } catch {
    return null;
  }
}

const NAME_KEY = 'tandem.name';

function stored() {
  try {
    return localStorage.getItem(NAME_KEY) ?? '';
  } catch {
    return '';
  }
}

function store(name) {
  try {
    localStorage.setItem(NAME_KEY, name);
  } catch { /* private mode: the name lasts as long as the page */ }
}

/** The person this page speaks for. Emits `name` when the shown name changes. */
export class People extends EventTarget {
  constructor({ client, token }) {
    super();
    this.client = client;
    // With a token the server takes the name from it (its `name` claim,
    // else its subject) and refuses `tandem/setName`.
    this.locked = !!token;
    this.lockReason = 'Set by your sign-in token: on this server a person\'s name comes from their token, not from the page.';
    const claims = token ? tokenClaims(token) : null;
    this.chosen = this.locked ? '' : stored();
    this.name = this.locked ? (claims?.name ?? claims?.sub ?? '') : this.chosen;
    // What the server calls a person who chose no name ("guest …").
    this.serverName = '';
    client.meta = () => this.meta();
  }

  /** `_meta` for `initialize` / `reconnect`. */
  meta() {
    return !this.locked && this.chosen ? { 'tandem/name': this.chosen } : undefined;
  }

  /** The name the server gave (from `tandem/access`). */
  heard(name) {
    if (!name) return;
    this.serverName = name;
    if (this.locked || !this.chosen) {
      if (this.locked) this.name = name;
      this.emit();
    }
  }

  /**
   * Name oneself before connecting (a guest coming in through a link): the
   * name goes in `initialize`, and is remembered like a chosen one.
   */
  choose(raw) {
    const name = raw.trim();
    if (this.locked || !name) return;
    this.chosen = name;
    this.name = name;
    store(name);
    this.emit();
  }

  /** Choose a name (without authentication): resolves with the name as shown. */
  async setName(raw) {
    if (this.locked) throw new Error(this.lockReason);
    const r = await this.client.request('tandem/setName', { name: raw }).catch((e) => {
      if (e.code === -32009) {
        // This server names people by their tokens after all.
        this.locked = true;
        this.lockReason = e.message;
        this.emit();
      }
      throw e;
    });
    this.chosen = r.name;
    this.name = r.name;
    store(r.name);
    this.emit();
    return r.name;
  }

  emit() {
    this.dispatchEvent(new CustomEvent('name', { detail: { name: this.name } }));
  }
}

/**
 * The "Your name" field for the top bar. `onError(message)` shows a failure.
 */
export function nameField(people, { onError } = {}) {
  const input = h('input', {
    class: 'name-input', type: 'text', 'aria-label': 'Your name', placeholder: 'Your name',
    maxlength: '80', autocomplete: 'nickname', spellcheck: 'false', 'data-name': '',
  });
  const why = h('div', { class: 'name-why', role: 'note', hidden: true });
  const el = h('div', { class: 'name-field' }, h('span', { class: 'name-label', 'aria-hidden': 'true' }, 'You'), input, why);
  const show = () => {
    el.dataset.locked = people.locked ? 'true' : 'false';
    input.readOnly = people.locked;
    input.title = people.locked ? people.lockReason : 'Your name, as others see it';
    setText(why, people.locked ? people.lockReason : '');
    if (document.activeElement !== input || people.locked) input.value = people.name;
    input.placeholder = people.serverName && !people.locked ? people.serverName : 'Your name';
  };
  const commit = async () => {
    if (people.locked) return;
    const name = input.value.trim();
    if (!name || name === people.name) {
      input.value = people.name;
      return;
    }
    try {
      await people.setName(name);
    } catch (e) {
      onError?.(`Could not change your name: ${e.message}`);
    }
    show();
  };
  input.addEventListener('focus', () => { why.hidden = !people.locked; });
  input.addEventListener('blur', () => { why.hidden = true; commit(); });
  input.addEventListener('keydown', (e) => {
    if (e.key === 'Enter') { e.preventDefault(); input.blur(); }
    if (e.key === 'Escape') { input.value = people.name; input.blur(); }
  });
  people.addEventListener('name', show);
  show();
  return el;
}

/**
 * The caller's role in one session: `tandem/access` on open, again after a
 * reconnect and whenever the session's `_meta["tandem/access"]` changes.
 * `onChange(role)` is called when it changes.
 */
export class SessionAccess {
  constructor({ client, people, session, onChange }) {
    Object.assign(this, { client, people, session, onChange });
    this.role = undefined;
    this.sig = undefined;
    this.onReconnected = () => this.fetch();
    client.addEventListener('reconnected', this.onReconnected);
  }

  /** Ask the server; resolves once the role is known. */
  async fetch() {
    const asked = (this.asked ?? 0) + 1;
    this.asked = asked;
    let role;
    try {
      const r = await this.client.request('tandem/access', { channel: this.session });
      this.people.heard(r.name);
      role = r.access;
    } catch (e) {
      if (e.code === -1) return; // The connection went; `reconnected` asks again.
      // An older server without roles: offer everything, the server decides.
      role = e.code === -32601 ? null : (this.role ?? null);
    }
    if (this.closed || asked !== this.asked) return;
    if (role !== this.role) {
      this.role = role;
      this.onChange?.(role);
    }
  }

  /** The session's state changed: ask again when its access table did. */
  check(sessionState) {
    const sig = JSON.stringify(sessionState?._meta?.['tandem/access'] ?? null);
    if (this.sig === undefined) {
      this.sig = sig;
      return;
    }
    if (sig !== this.sig) {
      this.sig = sig;
      this.fetch();
    }
  }

  close() {
    this.closed = true;
    this.client.removeEventListener('reconnected', this.onReconnected);
  }
}

// ─── Who is here ───────────────────────────────────────────────────────

/** A presence entry's person, as shown (the server names each; an older one did not). */
export function presenceName(p) {
  return p.name || (p.subject && p.subject !== 'local' ? p.subject : `guest ${String(p.clientId ?? '').replace(/^web-/, '').slice(0, 4)}`);
}

/**
 * Who is on a chat now (`tandem/presence`, `tandem/listPresence`): a chip
 * for each person. The page says it is here (a presence without a text:
 * a viewer may too) once it is subscribed, and again after a reconnect;
 * its shared fields then say where in them it is.
 */
export class PresenceList {
  constructor({ client, chat, people }) {
    Object.assign(this, { client, chat, people });
    this.others = new Map(); // clientId -> entry
    this.el = h('div', { class: 'here', role: 'group', 'aria-label': 'Who is here' });
    this.onNote = (e) => this.note(e.detail);
    this.onReconnected = () => this.start();
    this.onName = () => this.render();
    client.addEventListener('notification', this.onNote);
    client.addEventListener('reconnected', this.onReconnected);
    people.addEventListener('name', this.onName);
    this.render();
  }

  /** Say this page is here, then ask who else is. */
  async start() {
    sendPresence(this.client, { channel: this.chat, state: 'active' }).catch(() => {});
    try {
      const r = await this.client.request('tandem/listPresence', { channel: this.chat });
      if (this.closed) return;
      this.others.clear();
      for (const p of r.presence ?? []) this.note({ method: 'tandem/presence', params: p }, false);
    } catch { /* presence is a nicety */ }
    this.render();
  }

  note({ method, params: p }, render = true) {
    if (method !== 'tandem/presence' || p?.channel !== this.chat || !p.clientId || p.clientId === this.client.clientId) return;
    if (p.state === 'gone') this.others.delete(p.clientId);
    else this.others.set(p.clientId, p);
    if (render) this.render();
  }

  render() {
    // One chip a person, however many pages they have open.
    const people = new Map();
    for (const p of this.others.values()) {
      const name = presenceName(p);
      const key = `${p.subject ?? ''}\n${name}`;
      const seen = people.get(key);
      if (!seen || (seen.state !== 'active' && p.state === 'active')) people.set(key, { name, subject: p.subject, state: p.state });
    }
    const me = this.people.name || this.people.serverName || 'you';
    setChildren(this.el,
      h('span', { class: 'here-label' }, 'Here'),
      h('span', { class: 'here-person here-me', title: 'You' }, `${me} (you)`),
      [...people.values()].map((p) => h('span', {
        class: `here-person here-${p.state === 'idle' ? 'idle' : 'active'}`, 'data-subject': p.subject ?? '', title: p.subject ? `${p.name} (${p.subject})` : p.name,
      }, p.name)));
  }

  close() {
    this.closed = true;
    forgetPresence(this.client, this.chat);
    this.client.removeEventListener('notification', this.onNote);
    this.client.removeEventListener('reconnected', this.onReconnected);
    this.people.removeEventListener('name', this.onName);
  }
}

// ─── Who did what ──────────────────────────────────────────────────────

/** The person who sent a message (`{name, subject, clientId}`), or null. */
export function authorOf(message) {
  const a = message?._meta?.['tandem/author'];
  return a && typeof a.name === 'string' ? a : null;
}

/** The act a system-notification part records, or null. */
export function actOf(part) {
  if (part?.kind !== 'systemNotification') return null;
  const act = part._meta?.['tandem/act'];
  return act && typeof act === 'object' && act.kind ? act : null;
}

/** Local HH:MM of an RFC 3339 time ('' when unreadable). */
export function hhmm(iso) {
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return '';
  return `${String(d.getHours()).padStart(2, '0')}:${String(d.getMinutes()).padStart(2, '0')}`;
}

/** An act as one short line: "Approved by Ann · 10:42", "Denied by Ann · 10:42: reason". */
export function actText(act) {
  const who = act.by?.name ?? 'someone';
  const at = hhmm(act.at);
  const when = at ? ` · ${at}` : '';
  switch (act.kind) {
    case 'toolCallConfirmed': {
      if (act.approved) {
        const scope = act.selectedOptionId === 'approve-session' ? ' for this session' : '';
        return `Approved by ${who}${scope}${when}`;
      }
      return `Denied by ${who}${when}${act.reason ? `: ${act.reason}` : ''}`;
    }
    case 'inputCompleted': {
      const verb = { accept: 'Answered', decline: 'Declined', cancel: 'Cancelled' }[act.response] ?? 'Settled';
      return `${verb} by ${who}${when}`;
    }
    case 'turnCancelled':
      return `${who} stopped the turn${when}`;
    default:
      return null;
  }
}

/** The acts of a chat's turns, by what they settled: `tool:<id>`, `input:<id>`, `turn:<id>`. */
export function actsIn(chat) {
  const out = new Map();
  const turns = [...(chat?.turns ?? []), ...(chat?.activeTurn ? [chat.activeTurn] : [])];
  for (const t of turns) {
    for (const part of t.responseParts ?? []) {
      const act = actOf(part);
      if (!act) continue;
      if (act.kind === 'toolCallConfirmed' && act.toolCallId) out.set(`tool:${act.toolCallId}`, act);
      else if (act.kind === 'inputCompleted' && act.requestId) out.set(`input:${act.requestId}`, act);
      else if (act.kind === 'turnCancelled') out.set(`turn:${act.turnId ?? t.id}`, act);
    }
  }
  return out;
}

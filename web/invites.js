// Invite links in the web client (docs/protocol.md, "People"):
//
// - A guest opens `/?invite=<code>#/s/<session>`: a "You were invited"
//   screen asks their name, then the page connects to
//   `/ahp?invite=<code>&guest=<device>&name=<name>`, where `<device>` is an
//   id this browser keeps (localStorage), so a reload is the same person
//   and counts once against the link's uses.
// - A link that lets nobody in is refused `403` on the upgrade, which a
//   browser's WebSocket cannot read: a plain `GET /ahp?invite=…` (the same
//   checks, no upgrade) tells why. A link revoked or expired while the
//   guest is in closes their socket with code 4403 and the reason. Either
//   way the page says so and does not try again.
// - An owner's "Share" dialog makes links (`tandem/createInvite`), lists
//   them (`tandem/listInvites`) and revokes them (`tandem/revokeInvite`).

import { h, setChildren, setText } from './dom.js';
import { hhmm } from './people.js';

/** The invite code of this page's URL (`?invite=…`), or null. */
export function inviteOf(search = location.search) {
  const code = new URLSearchParams(search).get('invite');
  return code && code.trim() ? code.trim() : null;
}

const GUEST_KEY = 'tandem.guest';
let deviceId = null;

/** This browser's guest id (8 to 128 characters), kept in localStorage. */
export function guestId() {
  if (deviceId) return deviceId;
  try {
    deviceId = localStorage.getItem(GUEST_KEY);
  } catch { /* private mode */ }
  if (!deviceId || deviceId.length < 8 || deviceId.length > 128) {
    const b = crypto.getRandomValues(new Uint8Array(16));
    deviceId = `web-${[...b].map((x) => x.toString(16).padStart(2, '0')).join('')}`;
    try {
      localStorage.setItem(GUEST_KEY, deviceId);
    } catch { /* the id lasts as long as the page */ }
  }
  return deviceId;
}

const query = ({ code, guest, name }) => {
  const q = new URLSearchParams({ invite: code, guest });
  if (name) q.set('name', name);
  return q.toString();
};

/** The socket URL a guest connects to. */
export function inviteSocketUrl({ code, guest, name }) {
  return `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}/ahp?${query({ code, guest, name })}`;
}

/** The link to hand out for `code` into `session` (`ahp-session:/<id>`). */
export function inviteLink(code, session) {
  return `${location.origin}/?invite=${encodeURIComponent(code)}#/s/${session.replace(/^ahp-session:\//, '')}`;
}

/**
 * Whether the server lets this guest in through `code` now: resolves with
 * the refusal's words ("this invite link was revoked"), or null when it
 * lets them in; rejects when the server did not answer.
 */
export async function inviteRefusal(code, guest) {
  const res = await fetch(`/ahp?${query({ code, guest })}`, { cache: 'no-store', credentials: 'omit' });
  if (res.status !== 403) return null; // 400: let in, only not an upgrade.
  const body = await res.json().catch(() => null);
  return body?.error?.message || 'this invite link no longer works';
}

/** A refusal's words as a sentence: "This invite link was revoked". */
function sentence(reason) {
  const s = (reason || 'this invite link no longer works').trim().replace(/\.$/, '');
  return s.charAt(0).toUpperCase() + s.slice(1);
}

/**
 * The page a guest sees when a link lets them in no more. `reason`: the
 * server's words, or null when it did not say (the socket never opened).
 */
export function endedPage(reason) {
  const known = !!reason;
  return h('div', { class: 'page invite-page' },
    h('div', { class: 'invite-card invite-banner', role: 'alert', 'data-reason': reason ?? '' },
      h('div', { class: 'invite-banner-title' }, sentence(reason)),
      h('p', { class: 'muted' }, known
        ? 'You are no longer in this session. Ask whoever shared the link for a new one.'
        : 'The server did not let this page in. Ask whoever shared the link for a new one, or try again.'),
      known ? null : h('button', { class: 'btn', type: 'button', 'data-action': 'retry', onclick: () => location.reload() }, 'Try again')));
}

/**
 * The "You were invited" screen: asks a name (prefilled with `name`),
 * then calls `onJoin(name)`. Shows "checking" until `ask()` is called.
 */
export class InviteScreen {
  constructor({ name, onJoin }) {
    this.input = h('input', {
      class: 'input', type: 'text', name: 'name', maxlength: '80', autocomplete: 'nickname', spellcheck: 'false',
      required: true, placeholder: 'Your name', 'aria-label': 'Your name', 'data-invite-name': '',
    });
    this.input.value = name ?? '';
    this.joinBtn = h('button', { class: 'btn btn-primary', type: 'submit', 'data-action': 'join' }, 'Join');
    this.form = h('form', {
      class: 'invite-form', hidden: true,
      onsubmit: (e) => {
        e.preventDefault();
        const n = this.input.value.trim();
        if (!n) {
          this.input.focus();
          return;
        }
        this.joinBtn.disabled = true;
        this.input.disabled = true;
        setText(this.joinBtn, 'Joining…');
        onJoin(n);
      },
    },
    h('label', { class: 'invite-label' }, 'Your name, as the others will see it', this.input),
    h('div', { class: 'invite-actions' }, this.joinBtn));
    this.status = h('p', { class: 'muted invite-status' }, 'Checking the link…');
    this.el = h('div', { class: 'page invite-page' },
      h('div', { class: 'invite-card', 'data-invite': '' },
        h('img', { src: '/favicon.svg', alt: '', width: 36, height: 36 }),
        h('h1', null, 'You were invited'),
        h('p', { class: 'muted' }, 'Someone shared a Tandem session with you: an AI agent\'s chat that several people follow together. What you may do there depends on the link.'),
        this.status,
        this.form));
  }

  ask() {
    this.status.hidden = true;
    this.form.hidden = false;
    this.input.focus();
    if (this.input.value) this.input.select();
  }
}

// ─── The Share dialog ──────────────────────────────────────────────────

const ROLE_HELP = {
  viewer: 'Viewer — watches the chat',
  participant: 'Participant — also chats and answers',
  approver: 'Approver — also approves tool calls',
};

const EXPIRY = [
  [60, '1 minute'],
  [600, '10 minutes'],
  [3600, '1 hour'],
  [86400, '1 day'],
  [7 * 86400, '7 days'],
  [30 * 86400, '30 days'],
];

const STATE_CHIP = { open: 'chip-ok', expired: 'chip-muted', revoked: 'chip-err' };

/** When a link ends, from now: "in 59 s", "in 3 h", "Jun 4, 14:05". */
function untilText(iso, state) {
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return '';
  const d = new Date(t);
  const at = d.toDateString() === new Date().toDateString() ? hhmm(iso) : `${d.toLocaleDateString()} ${hhmm(iso)}`;
  if (state === 'revoked') return '—';
  if (state !== 'open') return `expired ${at}`;
  const s = Math.round((t - Date.now()) / 1000);
  if (s < 90) return `in ${Math.max(s, 0)} s`;
  if (s < 5400) return `in ${Math.round(s / 60)} min`;
  if (s < 36 * 3600) return `in ${Math.round(s / 3600)} h (${at})`;
  return `until ${at}`;
}

/** An owner's dialog for a session's invite links. */
export class ShareDialog {
  constructor({ client, session }) {
    Object.assign(this, { client, session });
    this.codes = new Map(); // id -> code, for the links made on this page
    this.invites = [];
    this.access = h('select', { class: 'input select', name: 'access', 'data-field': 'access' },
      Object.entries(ROLE_HELP).map(([v, label]) => h('option', { value: v }, label)));
    this.ttl = h('select', { class: 'input select', name: 'ttl', 'data-field': 'ttl' },
      EXPIRY.map(([secs, label]) => h('option', { value: String(secs) }, label)));
    this.ttl.value = '86400';
    this.uses = h('input', { class: 'input', type: 'number', min: '1', step: '1', name: 'uses', placeholder: 'Anyone', 'data-field': 'uses' });
    this.createBtn = h('button', { class: 'btn btn-primary', type: 'submit', 'data-action': 'create-invite' }, 'Create link');
    this.linkInput = h('input', { class: 'input share-link', type: 'text', readonly: true, 'aria-label': 'Invite link', 'data-invite-link': '' });
    this.copyBtn = h('button', { class: 'btn', type: 'button', 'data-action': 'copy-invite', onclick: () => this.copy(this.linkInput.value, this.copyBtn) }, 'Copy');
    this.madeInfo = h('div', { class: 'share-made-info muted' });
    this.noteEl = h('div', { class: 'share-note', role: 'note', hidden: true });
    this.made = h('div', { class: 'share-made', hidden: true },
      h('div', { class: 'share-link-row' }, this.linkInput, this.copyBtn), this.madeInfo, this.noteEl);
    this.errorEl = h('div', { class: 'card-error', role: 'alert', hidden: true });
    this.listEl = h('tbody');
    this.emptyEl = h('p', { class: 'muted share-empty' }, 'No links yet.');
    this.table = h('table', { class: 'invite-table', hidden: true },
      h('thead', null, h('tr', null, ['Role', 'State', 'Used', 'Ends', 'Made by', ''].map((t) => h('th', null, t)))),
      this.listEl);
    this.el = h('dialog', { class: 'share-dialog', 'aria-labelledby': 'share-title', 'data-dialog': 'share' },
      h('div', { class: 'share-head' },
        h('h2', { id: 'share-title' }, 'Share this session'),
        h('button', { class: 'btn btn-ghost btn-small', type: 'button', 'aria-label': 'Close', 'data-action': 'close-share', onclick: () => this.close() }, '✕')),
      h('p', { class: 'muted share-intro' }, 'Whoever opens the link comes into this session only, with the role you pick, until it ends or you revoke it.'),
      h('form', { class: 'share-form', onsubmit: (e) => { e.preventDefault(); this.create(); } },
        h('label', null, h('span', { class: 'label' }, 'Role'), this.access),
        h('label', null, h('span', { class: 'label' }, 'Ends after'), this.ttl),
        h('label', null, h('span', { class: 'label' }, 'People'), this.uses),
        this.createBtn),
      this.made,
      this.errorEl,
      h('h3', null, 'Links'),
      this.emptyEl,
      this.table);
    this.el.addEventListener('close', () => this.closed());
    this.onChange = (e) => {
      if (e.detail.uri !== this.session || !this.el.open) return;
      // A link made, used or revoked (here or elsewhere) changes the session.
      const sig = JSON.stringify(this.client.state(this.session)?._meta?.['tandem/invites'] ?? null);
      if (sig !== this.sig) {
        this.sig = sig;
        this.load();
      }
    };
  }

  open() {
    if (!this.el.isConnected) document.body.append(this.el);
    if (!this.el.open) this.el.showModal();
    this.sig = JSON.stringify(this.client.state(this.session)?._meta?.['tandem/invites'] ?? null);
    this.client.addEventListener('change', this.onChange);
    this.load();
  }

  close() {
    if (this.el.open) this.el.close();
  }

  closed() {
    this.client.removeEventListener('change', this.onChange);
    clearTimeout(this.timer);
  }

  dispose() {
    this.close();
    this.closed();
    this.el.remove();
  }

  showError(message) {
    setText(this.errorEl, message ?? '');
    this.errorEl.hidden = !message;
  }

  async create() {
    const params = { channel: this.session, access: this.access.value, ttlSecs: Number(this.ttl.value) };
    const uses = this.uses.value.trim();
    if (uses) {
      const n = Number(uses);
      if (!Number.isInteger(n) || n < 1) {
        this.showError('People: a whole number, 1 or more (or empty for anyone).');
        return;
      }
      params.uses = n;
    }
    this.createBtn.disabled = true;
    this.showError(null);
    try {
      const r = await this.client.request('tandem/createInvite', params);
      this.codes.set(r.id, r.code);
      this.linkInput.value = inviteLink(r.code, this.session);
      setText(this.copyBtn, 'Copy');
      setText(this.madeInfo, `A ${r.access} link${r.uses ? ` for ${r.uses} ${r.uses === 1 ? 'person' : 'people'}` : ''}, ending ${untilText(r.expiresAt, 'open')}. It is shown only now: copy it.`);
      setText(this.noteEl, r.note ?? '');
      this.noteEl.hidden = !r.note;
      this.made.hidden = false;
      this.linkInput.select();
      this.load();
    } catch (e) {
      this.showError(`Could not create a link: ${e.message}`);
    } finally {
      this.createBtn.disabled = false;
    }
  }

  async copy(text, btn) {
    try {
      await navigator.clipboard.writeText(text);
    } catch {
      // No clipboard API (an insecure origin): the old way.
      this.linkInput.value = text;
      this.linkInput.select();
      document.execCommand?.('copy');
    }
    setText(btn, 'Copied');
    setTimeout(() => setText(btn, 'Copy'), 1500);
  }

  async load() {
    const asked = (this.asked ?? 0) + 1;
    this.asked = asked;
    let r;
    try {
      r = await this.client.request('tandem/listInvites', { channel: this.session });
    } catch (e) {
      if (e.code !== -1) this.showError(`Could not list the links: ${e.message}`);
      return;
    }
    if (asked !== this.asked) return;
    this.invites = r.invites ?? [];
    this.render();
    // An open link's state changes when it ends: look again then.
    clearTimeout(this.timer);
    const ends = this.invites.filter((i) => i.state === 'open').map((i) => Date.parse(i.expiresAt)).filter((t) => !Number.isNaN(t));
    if (ends.length && this.el.open) {
      const wait = Math.min(Math.max(Math.min(...ends) - Date.now() + 500, 500), 2 ** 31 - 1);
      this.timer = setTimeout(() => this.load(), wait);
    }
  }

  render() {
    const order = { open: 0, expired: 1, revoked: 2 };
    const list = [...this.invites].sort((a, b) => (order[a.state] ?? 3) - (order[b.state] ?? 3) || (b.createdAt ?? '').localeCompare(a.createdAt ?? ''));
    this.emptyEl.hidden = list.length > 0;
    this.table.hidden = list.length === 0;
    setChildren(this.listEl, list.map((i) => {
      const code = this.codes.get(i.id);
      const actions = h('td', { class: 'invite-actions' },
        i.state === 'open' && code ? h('button', {
          class: 'btn btn-small', type: 'button', 'data-action': 'copy-listed',
          onclick: (e) => this.copy(inviteLink(code, this.session), e.currentTarget),
        }, 'Copy') : null,
        i.state === 'open' ? h('button', {
          class: 'btn btn-small btn-danger-outline', type: 'button', 'data-action': 'revoke-invite',
          onclick: (e) => this.revoke(i, e.currentTarget),
        }, 'Revoke') : null);
      return h('tr', { class: 'invite-row', 'data-invite-id': i.id, 'data-state': i.state },
        h('td', { 'data-col': 'access' }, i.access),
        h('td', { 'data-col': 'state' }, h('span', { class: `chip ${STATE_CHIP[i.state] ?? 'chip-muted'}` }, i.state)),
        h('td', { 'data-col': 'used' }, i.uses ? `${i.used} of ${i.uses}` : String(i.used ?? 0)),
        h('td', { 'data-col': 'ends', title: i.expiresAt }, untilText(i.expiresAt, i.state)),
        h('td', { 'data-col': 'by', title: i.createdBy?.subject ?? '' }, i.createdBy?.name ?? ''),
        actions);
    }));
  }

  async revoke(invite, btn) {
    btn.disabled = true;
    this.showError(null);
    try {
      await this.client.request('tandem/revokeInvite', { channel: this.session, id: invite.id });
    } catch (e) {
      this.showError(`Could not revoke the link: ${e.message}`);
      btn.disabled = false;
    }
    this.load();
  }
}

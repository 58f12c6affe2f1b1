// A session's audit log in the web client (`tandem/auditLog`, docs/protocol.md
// "People"): the Activity panel, one line per entry — when, who, what —
// oldest first, a page at a time. Read when the panel opens, and again
// (from where it left off) while it is open when an act that is audited
// is echoed: a change of the session (its settings, roles, invites) or a
// settled card or stopped turn in its chat.

import { h, setChildren, setText } from './dom.js';
import { hhmm } from './people.js';

const PAGE = 100;
// Acts come in bursts (a card settled, then its note): read once they pause.
const SETTLE_MS = 300;
// A chat's actions that are audited (the session's all may be).
const AUDITED = new Set(['chat/toolCallConfirmed', 'chat/inputCompleted', 'chat/turnCancelled']);

const article = (word) => (/^[aeiou]/i.test(word) ? 'an' : 'a');

function scalar(v) {
  return typeof v === 'string' || typeof v === 'number' || typeof v === 'boolean';
}

/**
 * What an entry did, in words ("approved deploy", "created a viewer
 * invite"). `nameOf(subject)` names a person the entry names by subject.
 */
export function auditText(e, nameOf = (s) => s) {
  const tool = e.toolName ?? 'a tool';
  switch (e.kind) {
    case 'answered':
      return { accept: 'answered a request', decline: 'declined a request', cancel: 'cancelled a request' }[e.response]
        ?? `settled a request (${e.response ?? '?'})`;
    case 'approved':
      return `approved ${tool}`;
    case 'granted':
      return `always allowed ${tool}`;
    case 'denied':
      return `denied ${tool}${e.reason ? ` — ${e.reason}` : ''}`;
    case 'turnCancelled':
      return 'stopped a turn';
    case 'configChanged': {
      const set = Object.entries(e.config ?? {}).map(([k, v]) => (scalar(v) ? `${k} to ${v}` : k));
      return set.length ? `changed ${set.join(', ')}` : 'changed the session\'s settings';
    }
    case 'roleChanged': {
      const who = nameOf(e.subject ?? '?');
      return e.access ? `changed ${who}'s role to ${e.access}` : `reset ${who}'s role`;
    }
    case 'inviteCreated': {
      const role = e.access ?? 'an';
      const people = e.uses ? ` for ${e.uses} ${e.uses === 1 ? 'person' : 'people'}` : '';
      return `created ${article(role)} ${role} invite${people}`;
    }
    case 'inviteUsed':
      return `used ${article(e.access ?? 'an')} ${e.access ?? ''} invite`.replace(/\s+/g, ' ');
    case 'inviteRevoked': {
      const used = typeof e.used === 'number' ? ` (used by ${e.used})` : '';
      return `revoked ${article(e.access ?? 'an')} ${e.access ?? ''} invite${used}`.replace(/\s+/g, ' ');
    }
    default:
      return String(e.kind ?? 'did something').replace(/([A-Z])/g, ' $1').toLowerCase();
  }
}

/** The Activity panel of one session. */
export class ActivityPanel {
  constructor({ client, session, chat }) {
    Object.assign(this, { client, session, chat });
    this.entries = [];
    this.cursor = undefined;
    this.more = false;
    this.names = new Map(); // subject -> name, from the entries' `by`
    this.listEl = h('ol', { class: 'audit-list' });
    this.emptyEl = h('p', { class: 'muted audit-empty', hidden: true }, 'Nothing on the record yet: answers, approvals, role changes and invites show here.');
    this.moreBtn = h('button', { class: 'btn btn-small', type: 'button', 'data-action': 'audit-more', hidden: true, onclick: () => this.fetch() }, 'Load more');
    this.errorEl = h('div', { class: 'card-error', role: 'alert', hidden: true });
    this.scrollEl = h('div', { class: 'audit-scroll' }, this.emptyEl, this.listEl, this.moreBtn, this.errorEl);
    this.el = h('aside', { class: 'activity-panel', hidden: true, 'aria-label': 'Activity', 'data-panel': 'activity' },
      h('div', { class: 'activity-head' },
        h('h2', null, 'Activity'),
        h('button', { class: 'btn btn-ghost btn-small', type: 'button', 'aria-label': 'Close', 'data-action': 'close-activity', onclick: () => this.toggle(false) }, '✕')),
      this.scrollEl);
    this.onEnvelope = (e) => {
      const env = e.detail.envelope;
      if (env.channel === this.session || (env.channel === this.chat && AUDITED.has(env.action?.type))) this.soon();
    };
    this.onReconnected = () => this.soon();
  }

  get isOpen() {
    return !this.el.hidden;
  }

  /** Open or close (`open`: which; default the other). Resolves when read. */
  toggle(open = !this.isOpen) {
    this.el.hidden = !open;
    this.onToggle?.(open);
    clearTimeout(this.timer);
    if (!open) {
      this.client.removeEventListener('envelope', this.onEnvelope);
      this.client.removeEventListener('reconnected', this.onReconnected);
      return Promise.resolve();
    }
    this.client.addEventListener('envelope', this.onEnvelope);
    this.client.addEventListener('reconnected', this.onReconnected);
    return this.fetch();
  }

  /** Read again once changes pause (only while open). */
  soon() {
    if (!this.isOpen) return;
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.fetch(), SETTLE_MS);
  }

  /** The entries after the last one read (one page). */
  async fetch() {
    if (this.loading) {
      this.again = true;
      return this.loading;
    }
    this.loading = (async () => {
      try {
        const params = { session: this.session, limit: PAGE };
        if (this.cursor != null) params.cursor = this.cursor;
        const r = await this.client.request('tandem/auditLog', params);
        this.add(r.entries ?? []);
        if (r.cursor != null) this.cursor = r.cursor;
        this.more = !!r.more;
        this.showError(null);
      } catch (e) {
        if (e.code !== -1) this.showError(`Could not read the activity: ${e.message}`);
      }
      this.render();
    })();
    await this.loading;
    this.loading = null;
    if (this.again) {
      this.again = false;
      if (this.isOpen) return this.fetch();
    }
    return undefined;
  }

  add(entries) {
    for (const e of entries) {
      if (e.by?.subject && e.by.name) this.names.set(e.by.subject, e.by.name);
      this.entries.push(e);
    }
  }

  nameOf(subject) {
    if (this.names.has(subject)) return this.names.get(subject);
    if (String(subject).startsWith('invite:')) return 'a guest';
    return subject;
  }

  showError(message) {
    setText(this.errorEl, message ?? '');
    this.errorEl.hidden = !message;
  }

  render() {
    const s = this.scrollEl;
    const atEnd = s.scrollHeight - s.scrollTop - s.clientHeight < 40;
    const shown = this.listEl.children.length;
    // Entries only ever come after the ones shown.
    const lines = this.entries.slice(shown).map((e) => {
      const when = new Date(e.at);
      const who = e.by?.name ?? 'someone';
      return h('li', { class: 'audit-entry', 'data-kind': e.kind ?? '' },
        h('time', { datetime: e.at ?? '', title: Number.isNaN(when.getTime()) ? '' : when.toLocaleString() }, hhmm(e.at)),
        h('span', { class: 'audit-line' },
          h('span', { class: 'audit-who', title: e.by?.subject ?? '' }, who), ' ',
          h('span', { class: 'audit-what' }, auditText(e, (sub) => this.nameOf(sub)))));
    });
    if (lines.length) this.listEl.append(...lines);
    this.emptyEl.hidden = this.entries.length > 0;
    this.moreBtn.hidden = !this.more;
    if (atEnd || !shown) s.scrollTop = s.scrollHeight;
  }

  dispose() {
    this.toggle(false);
    setChildren(this.listEl);
  }
}

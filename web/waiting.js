// "Waiting on you": every request, across the sessions this page may see,
// that this person can answer — questions and links for a participant or
// higher, tool approvals for an approver or higher — oldest first, each a
// link to its chat. The count is also on the tab: the title reads
// "(N) …" and the icon carries a red dot with N.
//
// The sessions and their roll-up status come from `listSessions` and the
// root notifications; a session whose status says input is needed is asked
// what waits (`tandem/listPending`) and what this person may do there
// (`tandem/access`). It is asked again when its summary changes, and when
// a request in a channel this page watches opens or settles.

import { ROOT } from './ahp.js';
import { activityOf } from './reducers.js';
import { h, setChildren, setText } from './dom.js';
import { can } from './people.js';

const tail = (uri) => uri.replace(/^ahp-(session|chat):\//, '');

/** Every session this page may see (at most 500), most recently modified first. */
export async function listAllSessions(client) {
  const items = [];
  let cursor;
  do {
    const page = await client.request('listSessions', { channel: ROOT, limit: 100, cursor });
    items.push(...page.items);
    cursor = page.nextCursor;
  } while (cursor && items.length < 500);
  return items;
}

// Actions after which what waits in a session may have changed.
const SETTLING = new Set([
  'session/inputNeededSet', 'session/inputNeededRemoved',
  'chat/inputRequested', 'chat/inputCompleted', 'chat/toolCallReady', 'chat/toolCallConfirmed',
  'chat/toolCallResultConfirmed', 'chat/turnComplete', 'chat/turnCancelled', 'chat/error',
]);

/** The role a kind of request needs. */
const NEEDS = { input: 'participant', toolApproval: 'approver' };

/**
 * The list and its button, for the top bar. Emits `count` (detail
 * `{count}`) when the number of waiting requests changes.
 */
export class WaitingList extends EventTarget {
  constructor({ client }) {
    super();
    this.client = client;
    this.summaries = new Map(); // session -> summary
    this.pending = new Map(); // session -> [entries this person can answer]
    this.asking = new Map(); // session -> {again} while a look is under way
    this.chats = new Map(); // chat -> session, for the chats listed
    this.known = new Map(); // roll-up entry id -> entry, what each request asks
    this.count = 0;
    this.countEl = h('span', { class: 'waiting-count' }, '0');
    this.button = h('button', {
      class: 'waiting-btn', type: 'button', 'data-action': 'waiting', 'aria-expanded': 'false', hidden: true,
      title: 'Requests waiting for you', onclick: () => this.toggle(),
    }, h('span', { class: 'waiting-label' }, 'Waiting on you'), this.countEl);
    this.listEl = h('ol', { class: 'waiting-list' });
    this.emptyEl = h('p', { class: 'waiting-empty muted' }, 'Nothing waits on you.');
    this.panel = h('div', { class: 'waiting-panel', role: 'dialog', 'aria-label': 'Waiting on you', 'data-panel': 'waiting', hidden: true },
      h('div', { class: 'waiting-head' }, h('h2', null, 'Waiting on you'),
        h('span', { class: 'muted small' }, 'oldest first')),
      this.listEl, this.emptyEl);
    this.el = h('div', { class: 'waiting' }, this.button, this.panel);
    this.onDocClick = (e) => { if (!this.el.contains(e.target)) this.close(); };
    this.onKey = (e) => { if (e.key === 'Escape') this.close(); };
    client.addEventListener('notification', (e) => this.notification(e.detail));
    client.addEventListener('reconnected', () => this.load());
    client.addEventListener('envelope', (e) => this.envelope(e.detail.envelope));
    // A hash change is a click on one of the links, or another page.
    window.addEventListener('hashchange', () => this.close());
  }

  /** Every session again, then what waits in those that need input. */
  async load() {
    let items;
    try {
      items = await listAllSessions(this.client);
    } catch {
      return; // The connection went: `reconnected` loads again.
    }
    this.summaries = new Map(items.map((s) => [s.resource, s]));
    for (const session of [...this.pending.keys()]) {
      if (!this.summaries.has(session)) this.pending.delete(session);
    }
    for (const s of items) this.look(s.resource);
    this.render();
  }

  notification({ method, params }) {
    let session;
    if (method === 'root/sessionAdded') {
      session = params.summary.resource;
      this.summaries.set(session, params.summary);
    } else if (method === 'root/sessionRemoved') {
      session = params.session;
      this.summaries.delete(session);
    } else if (method === 'root/sessionSummaryChanged') {
      session = params.session;
      const s = this.summaries.get(session);
      if (s) Object.assign(s, params.changes);
      else this.summaries.set(session, { resource: session, ...params.changes });
    } else return;
    this.look(session);
  }

  envelope(env) {
    if (!SETTLING.has(env.action?.type)) return;
    const session = env.channel.startsWith('ahp-session:') ? env.channel : this.chats.get(env.channel) ?? this.sessionOfChat(env.channel);
    if (session) this.look(session, true);
  }

  /** The session a watched chat belongs to, from the session states this page holds. */
  sessionOfChat(chat) {
    for (const uri of this.client.channels.keys()) {
      if (!uri.startsWith('ahp-session:')) continue;
      if (this.client.state(uri)?.chats?.some((c) => c.resource === chat)) return uri;
    }
    return null;
  }

  /**
   * Ask what waits in `session` for this person (nothing when its status
   * says no input is needed, unless `anyway`). One look at a time per
   * session: a look asked for meanwhile follows it.
   */
  async look(session, anyway = false) {
    const running = this.asking.get(session);
    if (running) {
      running.again = true;
      running.anyway ||= anyway;
      return;
    }
    const summary = this.summaries.get(session);
    if (!summary || (!anyway && activityOf(summary.status) !== 'input-needed')) {
      if (this.pending.delete(session)) this.render();
      return;
    }
    const run = { again: false, anyway: false };
    this.asking.set(session, run);
    try {
      const [p, a] = await Promise.all([
        this.client.request('tandem/listPending', { channel: session }),
        this.client.request('tandem/access', { channel: session }).catch((e) => {
          // A server without roles: everyone may answer (the server decides).
          if (e.code === -32601) return { access: null };
          throw e;
        }),
      ]);
      const mine = (p.pending ?? []).filter((x) => can(a.access, NEEDS[x.kind] ?? 'owner'));
      if (mine.length) this.pending.set(session, mine.map((x) => ({ ...x, session })));
      else this.pending.delete(session);
    } catch (e) {
      // Gone, or not this person's any more: nothing waits there for them.
      if (e.code !== -1 && e.code !== -2) this.pending.delete(session);
    } finally {
      this.asking.delete(session);
    }
    this.render();
    if (run.again) this.look(session, run.anyway);
  }

  /** The requests waiting, oldest first. */
  items() {
    return [...this.pending.values()].flat().sort((x, y) => (x.serverSeq ?? 0) - (y.serverSeq ?? 0));
  }

  render() {
    const items = this.items();
    this.chats = new Map(items.map((x) => [x.chat, x.session]));
    const listed = new Set(items.map((x) => `${x.chat}#${x.kind === 'toolApproval' ? 'tool' : 'input'}/${x.requestId ?? x.toolCallId}`));
    for (const key of this.known.keys()) if (!listed.has(key)) this.known.delete(key);
    setChildren(this.listEl, items.map((x) => this.row(x)));
    this.emptyEl.hidden = items.length > 0;
    setText(this.countEl, String(items.length));
    this.button.hidden = items.length === 0 && this.panel.hidden;
    if (items.length !== this.count) {
      this.count = items.length;
      this.dispatchEvent(new CustomEvent('count', { detail: { count: this.count } }));
    }
  }

  row(x) {
    const summary = this.summaries.get(x.session);
    const { kind, what } = this.describe(x);
    const id = x.requestId ?? x.toolCallId;
    return h('li', null,
      h('a', {
        class: 'waiting-item', href: `#/s/${tail(x.session)}/${tail(x.chat)}`,
        'data-kind': x.kind, 'data-session': x.session, 'data-chat': x.chat, 'data-id': id,
      },
      h('span', { class: `waiting-kind waiting-kind-${x.kind}` }, kind),
      h('span', { class: 'waiting-main' },
        h('span', { class: 'waiting-what' }, what),
        h('span', { class: 'waiting-where muted' }, summary?.title || 'Untitled session'))));
  }

  /**
   * What is asked, as far as this page knows: the session's state says, while
   * the page holds it (the session it shows); remembered after.
   */
  describe(x) {
    const key = x.kind === 'toolApproval' ? `${x.chat}#tool/${x.toolCallId}` : `${x.chat}#input/${x.requestId}`;
    const entry = (this.client.state(x.session)?.inputNeeded ?? []).find((e) => e.id === key);
    if (entry) this.known.set(key, entry);
    const e = this.known.get(key);
    if (x.kind === 'toolApproval') {
      const name = e?.toolCall?.displayName || e?.toolCall?.toolName;
      return { kind: 'Approval', what: name ? `Run ${name}?` : 'A tool call to approve' };
    }
    const r = e?.request;
    if (r?.url && !r.questions?.length) return { kind: 'Link', what: r.message || 'A link to open' };
    const first = r?.questions?.[0];
    return { kind: 'Question', what: r?.message || first?.title || first?.message || 'A question for you' };
  }

  toggle() {
    if (this.panel.hidden) this.open();
    else this.close();
  }

  open() {
    this.panel.hidden = false;
    this.button.setAttribute('aria-expanded', 'true');
    document.addEventListener('click', this.onDocClick, true);
    document.addEventListener('keydown', this.onKey);
    this.render();
  }

  close() {
    if (this.panel.hidden) return;
    this.panel.hidden = true;
    this.button.setAttribute('aria-expanded', 'false');
    document.removeEventListener('click', this.onDocClick, true);
    document.removeEventListener('keydown', this.onKey);
    this.render();
  }
}

// ─── The tab's title and icon ──────────────────────────────────────────

const ICON = '/favicon.svg';
const ICON_PX = 64;

/**
 * The document's title and icon with a count: "(N) title" and the icon
 * with a red dot holding N; the plain ones at 0.
 */
export class TabBadge {
  constructor() {
    this.base = document.title;
    this.count = 0;
    this.link = document.querySelector('link[rel="icon"]') ?? document.head.appendChild(h('link', { rel: 'icon', href: ICON }));
    this.image = null;
  }

  /** The title without the count. */
  title(base) {
    this.base = base;
    this.write();
  }

  set(count) {
    if (count === this.count) return;
    this.count = count;
    this.write();
    this.icon();
  }

  write() {
    const t = this.count > 0 ? `(${this.count}) ${this.base}` : this.base;
    if (document.title !== t) document.title = t;
  }

  async icon() {
    const count = this.count;
    if (count === 0) {
      this.link.type = 'image/svg+xml';
      this.link.href = ICON;
      return;
    }
    this.image ??= new Promise((resolve, reject) => {
      const img = new Image();
      img.onload = () => resolve(img);
      img.onerror = () => reject(new Error('the icon did not load'));
      img.src = ICON;
    });
    let img;
    try {
      img = await this.image;
    } catch {
      this.image = null;
      return; // The title still says it.
    }
    if (count !== this.count) return; // A newer count draws its own.
    const canvas = document.createElement('canvas');
    canvas.width = ICON_PX;
    canvas.height = ICON_PX;
    const g = canvas.getContext('2d');
    g.drawImage(img, 0, 0, ICON_PX, ICON_PX);
    const r = ICON_PX * 0.3;
    const [cx, cy] = [ICON_PX - r, r];
    g.beginPath();
    g.arc(cx, cy, r, 0, 2 * Math.PI);
    g.fillStyle = '#e11d48';
    g.fill();
    g.lineWidth = ICON_PX * 0.04;
    g.strokeStyle = '#ffffff';
    g.stroke();
    g.fillStyle = '#ffffff';
    g.font = `bold ${Math.round(r * (count > 9 ? 1.05 : 1.4))}px system-ui, sans-serif`;
    g.textAlign = 'center';
    g.textBaseline = 'middle';
    g.fillText(count > 9 ? '9+' : String(count), cx, cy + r * 0.06);
    this.link.type = 'image/png';
    this.link.href = canvas.toDataURL('image/png');
  }
}

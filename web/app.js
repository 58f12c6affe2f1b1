// Tandem web client: session list and chat view over one AHP connection.
// Routes: #/ (sessions), #/s/<session-uuid>[/<chat-uuid>] (a chat), #/admin
// (the server: connections, who waits, metrics; an admin token). A page
// opened from an invite link (`/?invite=<code>#/s/<session-uuid>`) asks the
// guest's name first and connects through the link (web/invites.js).

import { AhpClient, ROOT, RpcError, uuid } from './ahp.js';
import { activityOf } from './reducers.js';
import { h, setChildren, setText, reconcile } from './dom.js';
import { renderMarkdown, inline } from './markdown.js';
import { InputRequestCard, ToolCallCard } from './cards.js';
import { SharedField } from './coedit.js';
import { AdminView } from './admin.js';
import { People, SessionAccess, PresenceList, nameField, tokenClaims, can, roleNote, authorOf, actOf, actText, actsIn } from './people.js';
import { InviteScreen, ShareDialog, endedPage, guestId, inviteOf, inviteRefusal, inviteSocketUrl } from './invites.js';
import { ActivityPanel } from './activity.js';
import { NotifyControl, registerWorker } from './notify.js';
import { WaitingList, TabBadge, listAllSessions } from './waiting.js';

// A server with a secret wants a bearer token on the upgrade; a browser passes
// it as `?token=…`, taken here from the page's own URL (`/?token=…#/`).
const token = new URLSearchParams(location.search).get('token');
// A guest comes in through an invite link instead (`?invite=…`): no token,
// this browser's guest id and the name they pick go on the socket's URL.
const invite = token ? null : inviteOf();
const guest = invite ? guestId() : null;
const wsUrl = `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}/ahp${token ? `?token=${encodeURIComponent(token)}` : ''}`;
// One id per page load: a reload starts over with `initialize` (its state is
// gone anyway), and a duplicated tab must not share an id with its original.
const clientId = `web-${uuid()}`;

const client = new AhpClient({ url: wsUrl, clientId });
// Who this page speaks for: the name sent in `initialize` (no auth) or the token's.
const people = new People({ client, token });
if (invite) {
  client.url = inviteSocketUrl({ code: invite, guest, name: people.chosen });
  // A refused upgrade cannot be read here: ask why the plain way, and stop
  // after a few sockets that never opened.
  client.admission = () => inviteRefusal(invite, guest);
  client.maxFailedOpens = 3;
  // A reconnect carries the name the guest goes by now.
  people.addEventListener('name', () => {
    client.url = inviteSocketUrl({ code: invite, guest, name: people.chosen });
  });
}

const ACTIVITY_LABEL = {
  'input-needed': 'Input needed',
  'in-progress': 'In progress',
  idle: 'Idle',
  error: 'Error',
};

function badge(status) {
  const a = activityOf(status);
  return h('span', { class: `badge badge-${a}`, 'data-activity': a }, h('span', { class: 'dot' }), ACTIVITY_LABEL[a]);
}

function updateBadge(el, status) {
  const a = activityOf(status);
  if (el.dataset.activity === a) return;
  el.dataset.activity = a;
  el.className = `badge badge-${a}`;
  setChildren(el, h('span', { class: 'dot' }), ACTIVITY_LABEL[a]);
}

function relTime(iso) {
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return '';
  const s = Math.round((Date.now() - t) / 1000);
  if (s < 45) return 'just now';
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return new Date(t).toLocaleDateString();
}

const uuidOf = (uri) => uri.replace(/^ahp-(session|chat):\//, '');

// ─── Shell ───────────────────────────────────────────────────────────────

const connEl = h('span', { class: 'conn', 'data-conn': 'connecting', title: 'Connection to the server' }, 'Connecting…');
const crumbsEl = h('div', { class: 'crumbs' });
const viewEl = h('main', { class: 'view' });
const toastsEl = h('div', { class: 'toasts', 'aria-live': 'polite' });

// The role a token claims (shown links only; the server decides). Without
// a token the server has no auth (loopback): everyone is an admin.
const adminLink = !invite && (!token || tokenClaims(token)?.role === 'admin')
  ? h('a', { class: 'admin-link', href: '#/admin', 'data-action': 'admin' }, 'Admin')
  : null;

// What waits on this person across sessions, on every page; its count is
// on the tab too.
const waiting = new WaitingList({ client });
const tab = new TabBadge();
waiting.addEventListener('count', (e) => tab.set(e.detail.count));

document.getElementById('app').replaceChildren(
  h('header', { class: 'topbar' },
    h('a', { class: 'brand', href: '#/' }, h('img', { src: '/favicon.svg', alt: '', width: 22, height: 22 }), h('span', null, 'Tandem')),
    crumbsEl,
    adminLink,
    waiting.el,
    nameField(people, { onError: (m) => toast(m, 'err') }),
    connEl),
  viewEl,
  toastsEl);

const CONN_LABEL = {
  connecting: 'Connecting…', live: 'Live', reconnecting: 'Reconnecting…', offline: 'Offline',
  expired: 'Token expired — open the page with a fresh token', ended: 'Not connected',
};
client.addEventListener('status', (e) => {
  connEl.dataset.conn = e.detail.status;
  setText(connEl, CONN_LABEL[e.detail.status] ?? e.detail.status);
});

// The server let this page in no more (an invite link revoked or expired):
// say so in place of the view; nothing reconnects.
let ended = false;
function showEnded(reason) {
  if (ended) return;
  ended = true;
  currentView?.dispose();
  currentView = null;
  setChildren(crumbsEl);
  viewEl.replaceChildren(endedPage(reason));
  tab.title('Invite ended · Tandem');
}
client.addEventListener('ended', (e) => showEnded(e.detail.reason));

export function toast(text, kind = 'info') {
  const el = h('div', { class: `toast toast-${kind}`, role: 'status' }, text);
  toastsEl.append(el);
  setTimeout(() => el.classList.add('out'), 4500);
  setTimeout(() => el.remove(), 5000);
}

// Rejections: a toast, plus the reason on the card it concerns.
const rejections = new Map();
client.addEventListener('rejected', (e) => {
  const { action, reason, quiet } = e.detail;
  if (action.requestId) rejections.set(`input:${action.requestId}`, reason);
  if (action.toolCallId) rejections.set(`tool:${action.toolCallId}`, reason);
  if (!quiet) toast(`Not accepted: ${reason}`, 'err');
  currentView?.onRejected?.(e.detail);
});

// Who last changed each answer (requestId/questionId → clientId), for the
// "live" marker on drafts that came from another client.
const editors = new Map();
client.addEventListener('envelope', (e) => {
  const { envelope } = e.detail;
  const a = envelope.action;
  if (a.type === 'chat/inputAnswerChanged' && envelope.origin) {
    editors.set(`${a.requestId}/${a.questionId}`, envelope.origin.clientId);
  }
  if (a.type === 'tandem/textEdited' && a.target?.requestId) {
    // Typed together: the edit names its author.
    editors.set(`${a.target.requestId}/${a.target.questionId}`, a.author || 'a plain client');
  }
});

// ─── Session list ────────────────────────────────────────────────────────

class SessionsView {
  constructor() {
    this.sessions = new Map();
    this.listEl = h('ul', { class: 'session-list' });
    this.agentSelect = h('select', { class: 'input select', 'aria-label': 'Agent' });
    this.createBtn = h('button', { class: 'btn btn-primary', type: 'button', 'data-action': 'new-session', hidden: !!invite, onclick: () => this.create() }, 'New session');
    this.el = h('div', { class: 'page sessions-page' },
      h('section', { class: 'hero' },
        h('div', null,
          h('h1', null, 'Sessions'),
          h('p', { class: 'muted' }, 'Every tab, device and teammate on a session sees the same chat, live. Answer the agent from anywhere.')),
        h('div', { class: 'hero-actions' }, this.agentSelect, this.createBtn)),
      this.listEl);
    this.onNotification = (e) => this.notification(e.detail);
    this.onReconnected = () => this.load();
    this.onRoot = (e) => { if (e.detail.uri === ROOT) this.renderAgents(); };
    client.addEventListener('notification', this.onNotification);
    client.addEventListener('reconnected', this.onReconnected);
    client.addEventListener('change', this.onRoot);
    setChildren(crumbsEl);
    this.renderAgents();
    this.load();
  }

  renderAgents() {
    const root = client.state(ROOT);
    const agents = root?.agents ?? [];
    const current = this.agentSelect.value;
    setChildren(this.agentSelect, agents.map((a) => h('option', { value: a.provider }, a.displayName ?? a.provider)));
    if (agents.some((a) => a.provider === current)) this.agentSelect.value = current;
    else if (agents.some((a) => a.provider === 'scripted')) this.agentSelect.value = 'scripted';
    this.agentSelect.hidden = agents.length <= 1 || !!invite;
  }

  async load() {
    try {
      const items = await listAllSessions(client);
      this.sessions = new Map(items.map((s) => [s.resource, s]));
      this.render();
    } catch (e) {
      if (!(e instanceof RpcError && e.code === -1)) toast(`Could not list sessions: ${e.message}`, 'err');
    }
  }

  notification({ method, params }) {
    if (method === 'root/sessionAdded') this.sessions.set(params.summary.resource, params.summary);
    else if (method === 'root/sessionRemoved') this.sessions.delete(params.session);
    else if (method === 'root/sessionSummaryChanged') {
      const s = this.sessions.get(params.session);
      if (s) Object.assign(s, params.changes);
    } else return;
    this.render();
  }

  render() {
    const items = [...this.sessions.values()].sort((a, b) => (b.modifiedAt ?? '').localeCompare(a.modifiedAt ?? ''));
    if (!items.length) {
      setChildren(this.listEl, h('li', { class: 'empty' },
        h('div', { class: 'empty-title' }, 'No sessions yet'),
        h('div', { class: 'muted' }, 'Start one with the scripted agent and send /demo to see a form and a tool approval.')));
      return;
    }
    setChildren(this.listEl, items.map((s) => h('li', null,
      h('a', { class: 'session-row', href: `#/s/${uuidOf(s.resource)}`, 'data-session': s.resource },
        h('div', { class: 'session-main' },
          h('div', { class: 'session-title' }, s.title || 'Untitled session'),
          h('div', { class: 'session-meta muted' }, `${s.provider} · ${relTime(s.modifiedAt)}`)),
        badge(s.status),
        h('span', { class: 'chevron', 'aria-hidden': 'true' }, '›')))));
  }

  async create() {
    const provider = this.agentSelect.value || 'scripted';
    const id = uuid();
    this.createBtn.disabled = true;
    try {
      await client.request('createSession', { channel: `ahp-session:/${id}`, provider });
      location.hash = `#/s/${id}`;
    } catch (e) {
      toast(`Could not create a session: ${e.message}`, 'err');
    } finally {
      this.createBtn.disabled = false;
    }
  }

  dispose() {
    client.removeEventListener('notification', this.onNotification);
    client.removeEventListener('reconnected', this.onReconnected);
    client.removeEventListener('change', this.onRoot);
  }
}

// ─── Chat ────────────────────────────────────────────────────────────────

const SUGGESTIONS = [
  ['/demo', 'A form with every question kind, then a tool approval'],
  ['/ask {"message":"Review the change","url":"https://example.com/pr/1"}', 'A URL to open'],
  ['/tool write_file {"path":"notes.txt"}', 'A tool call to approve'],
  ['/slow 1500 Streaming **markdown** arrives in small pieces, as an agent would type it.', 'Streamed text'],
];

class TurnView {
  constructor(id) {
    this.id = id;
    this.userEl = h('div', { class: 'msg msg-user' });
    this.partsEl = h('div', { class: 'parts' });
    this.footEl = h('div', { class: 'turn-foot' });
    this.el = h('article', { class: 'turn', 'data-turn-id': id }, this.userEl, this.partsEl, this.footEl);
    this.parts = new Map(); // key -> {el, update, dispose, kind}
  }

  update(turn, live, ctx) {
    const text = turn.message?.text ?? '';
    // Who sent it, as the host stamped it (none until the echo, or an agent's).
    const author = authorOf(turn.message);
    const sig = JSON.stringify([text, author?.name, author?.subject]);
    if (this.userSig !== sig) {
      this.userSig = sig;
      setChildren(this.userEl,
        author && h('div', { class: 'msg-author', title: author.subject ? `${author.name} (${author.subject})` : author.name }, author.name),
        h('div', { class: 'bubble' }, text));
    }
    this.el.classList.toggle('is-live', live);
    this.el.classList.toggle('is-pending', !!ctx.pendingTurn);
    const seen = new Set();
    const nodes = [];
    const parts = turn.responseParts ?? [];
    parts.forEach((part, i) => {
      const key = partKey(part, i);
      seen.add(key);
      let comp = this.parts.get(key);
      const pctx = { ...ctx, turnId: turn.id, live };
      if (!comp) {
        comp = makePart(part, pctx);
        this.parts.set(key, comp);
      } else {
        comp.update(part, pctx);
      }
      comp.el.classList.toggle('streaming', live && part.kind === 'markdown' && i === parts.length - 1);
      nodes.push(comp.el);
    });
    for (const [key, comp] of this.parts) {
      if (!seen.has(key)) {
        comp.dispose?.();
        this.parts.delete(key);
      }
    }
    if (live && parts.length === 0) nodes.push(this.typing ?? (this.typing = h('div', { class: 'typing', 'aria-label': 'The agent is working' }, h('span'), h('span'), h('span'))));
    reconcile(this.partsEl, nodes);
    let foot = '';
    if (!live && turn.state === 'cancelled') foot = 'Turn cancelled';
    else if (!live && turn.state === 'error') foot = 'Turn ended with an error';
    setText(this.footEl, foot);
    this.footEl.hidden = !foot;
  }

  dispose() {
    for (const comp of this.parts.values()) comp.dispose?.();
  }
}

function partKey(part, i) {
  switch (part.kind) {
    case 'markdown': return `md:${part.id}`;
    case 'reasoning': return `rs:${part.id}`;
    case 'toolCall': return `tc:${part.toolCall?.toolCallId}`;
    case 'inputRequest': return `in:${part.request?.id}`;
    default: return `${part.kind}:${i}`;
  }
}

function makePart(part, ctx) {
  switch (part.kind) {
    case 'inputRequest':
      return new InputRequestCard(part, ctx);
    case 'toolCall':
      return new ToolCallCard(part, ctx);
    case 'markdown': {
      const el = h('div', { class: 'msg msg-agent markdown' });
      const comp = {
        el,
        update(p) {
          if (p.content !== comp.content) {
            comp.content = p.content;
            el.innerHTML = renderMarkdown(p.content);
          }
        },
      };
      comp.update(part);
      return comp;
    }
    case 'reasoning': {
      const body = h('div', { class: 'reasoning-body' });
      const el = h('details', { class: 'reasoning' }, h('summary', null, 'Reasoning'), body);
      const comp = { el, update(p) { setText(body, p.content); } };
      comp.update(part);
      return comp;
    }
    case 'error': {
      const el = h('div', { class: 'card error-card', role: 'alert' });
      const comp = {
        el,
        update(p) {
          setChildren(el, h('strong', null, p.error?.errorType ?? 'Error'), ': ', p.error?.message ?? '');
        },
      };
      comp.update(part);
      return comp;
    }
    case 'systemNotification': {
      const el = h('div', { class: 'system-note' });
      const comp = {
        el,
        update(p) {
          // A person's act (written by the host): one compact line.
          const act = actOf(p);
          const line = act && actText(act);
          if (line) {
            el.classList.add('act-note');
            el.dataset.act = act.kind;
            setText(el, line);
            return;
          }
          el.innerHTML = inline(typeof p.content === 'string' ? p.content : p.content?.markdown ?? '');
        },
      };
      comp.update(part);
      return comp;
    }
    default: {
      const el = h('div', { class: 'system-note muted' }, `(${part.kind ?? 'unknown'} part)`);
      return { el, update() {} };
    }
  }
}

class ChatView {
  constructor(sessionId, chatId) {
    this.session = `ahp-session:/${sessionId}`;
    this.chat = chatId ? `ahp-chat:/${chatId}` : null;
    this.turns = new Map();
    this.announced = new Set(); // cards already scrolled into view
    this.badgeEl = badge(1);
    this.titleEl = h('span', { class: 'crumb-title' }, '…');
    // The person's role here (with a token: without one everyone owns everything).
    this.roleEl = h('span', { class: 'role-badge', hidden: true, title: 'Your role in this session' });
    setChildren(crumbsEl, h('a', { class: 'crumb-back', href: '#/', 'aria-label': 'All sessions' }, '‹'), this.titleEl, this.badgeEl, this.roleEl);
    this.access = new SessionAccess({ client, people, session: this.session, onChange: (role) => this.roleChanged(role) });

    this.transcriptEl = h('div', { class: 'transcript', 'aria-live': 'polite' });
    // Hidden until the chat's state has arrived: an empty chat says so then,
    // not while a chat with turns is still loading.
    this.emptyEl = h('div', { class: 'chat-empty', hidden: true },
      h('div', { class: 'empty-title' }, 'Say something to the agent'),
      h('div', { class: 'muted' }, 'The scripted agent understands a few commands:'),
      h('div', { class: 'suggestions' }, SUGGESTIONS.map(([text, label]) => h('button', {
        class: 'suggestion', type: 'button', title: text,
        onclick: () => { this.input.value = text; this.draftChanged(); this.input.focus(); },
      }, h('code', null, text.split(' ')[0]), h('span', null, label)))));
    this.scrollEl = h('div', { class: 'scroller' }, h('div', { class: 'thread' }, this.emptyEl, this.transcriptEl));

    // Closed until the chat's state and its shared draft are here: text
    // typed before would have no chat to go to, or be replaced by the draft.
    this.placeholder = matchMedia('(max-width: 640px)').matches ? 'Message the agent' : 'Message the agent — try /demo';
    this.input = h('textarea', { class: 'composer-input', rows: 1, 'aria-label': 'Message', disabled: true, placeholder: this.placeholder });
    this.input.addEventListener('input', () => this.autosize());
    this.input.addEventListener('keydown', (e) => {
      if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        this.send();
      }
    });
    this.sendBtn = h('button', { class: 'btn btn-primary btn-send', type: 'submit', 'data-action': 'send', disabled: true }, 'Send');
    this.stopBtn = h('button', { class: 'btn btn-danger-outline', type: 'button', 'data-action': 'stop', hidden: true, onclick: () => this.stop() }, 'Stop');
    this.composerNote = h('div', { class: 'composer-note muted' });
    // The chat's draft is shared: everyone on the chat types in one composer text.
    this.draftPeers = h('div', { class: 'peers composer-peers' });
    this.composer = h('form', { class: 'composer', onsubmit: (e) => { e.preventDefault(); this.send(); } },
      h('div', { class: 'composer-box' }, this.input, this.stopBtn, this.sendBtn), this.draftPeers, this.composerNote);

    // Who is here, the session's record, and (for an owner) its links.
    this.presence = null;
    this.hereEl = h('div', { class: 'here-slot' });
    this.activity = new ActivityPanel({ client, session: this.session, chat: this.chat });
    this.activityBtn = h('button', {
      class: 'btn btn-small', type: 'button', 'data-action': 'activity', 'aria-pressed': 'false',
      title: 'Who answered, approved, changed roles and shared links', onclick: () => this.activity.toggle(),
    }, 'Activity');
    this.activity.onToggle = (open) => this.activityBtn.setAttribute('aria-pressed', String(open));
    this.share = null;
    this.shareBtn = h('button', {
      class: 'btn btn-small btn-primary', type: 'button', 'data-action': 'share', hidden: true,
      title: 'Invite people with a link', onclick: () => this.openShare(),
    }, 'Share');
    // Be told in this browser when the agent needs this person here.
    this.notify = new NotifyControl({ client, session: this.session });
    this.barEl = h('div', { class: 'session-bar' }, this.hereEl, h('div', { class: 'session-actions' }, this.notify.button, this.activityBtn, this.shareBtn));

    this.el = h('div', { class: 'page chat-page' }, this.barEl, this.scrollEl, this.composer, this.activity.el, this.notify.panel);
    this.onChange = (e) => {
      if (e.detail.uri === this.chat || e.detail.uri === this.session) this.schedule();
    };
    this.onMissing = (e) => {
      if (e.detail.uri === this.session || e.detail.uri === this.chat) {
        toast('This session is gone.', 'err');
        location.hash = '#/';
      }
    };
    client.addEventListener('change', this.onChange);
    client.addEventListener('missing', this.onMissing);
    this.open();
  }

  async open() {
    try {
      const session = await client.subscribe(this.session);
      if (this.disposed) return;
      if (!this.chat) this.chat = session?.defaultChat ?? session?.chats?.[0]?.resource;
      if (!this.chat) throw new Error('the session has no chat');
      this.activity.chat = this.chat;
      // What this person may do here, asked while the chat loads.
      await Promise.all([client.subscribe(this.chat), this.access.fetch()]);
      if (this.disposed) return;
      // Here before the shared fields say where (presence is one place a page).
      this.presence ??= new PresenceList({ client, chat: this.chat, people });
      this.hereEl.replaceChildren(this.presence.el);
      this.presence.start();
      this.draftField ??= new SharedField({
        client, chat: this.chat, target: { draft: true }, input: this.input, marks: this.draftPeers,
        onText: () => this.autosize(),
      });
      this.loaded = true;
      this.input.disabled = !this.canSend();
      this.render();
      this.scrollToBottom(true);
      this.announced.clear();
      this.revealNewCards('instant');
      if (!matchMedia('(pointer: coarse)').matches && !this.input.disabled) this.input.focus();
    } catch (e) {
      setChildren(this.transcriptEl, h('div', { class: 'card error-card' }, `Could not open this session: ${e.message}`));
    }
  }

  schedule() {
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = null;
      this.render();
    });
  }

  render() {
    if (this.disposed) return;
    const session = client.state(this.session);
    const chat = this.chat && client.state(this.chat);
    if (session) {
      setText(this.titleEl, session.title || 'Untitled session');
      tab.title(`${session.title || 'Session'} · Tandem`);
      this.access.check(session);
    }
    if (!chat) return;
    updateBadge(this.badgeEl, chat.status);
    this.el.dataset.activity = activityOf(chat.status);
    const nearBottom = this.isNearBottom();
    const confirmed = client.confirmedState(this.chat);
    const confirmedIds = new Set([...(confirmed?.turns ?? []).map((t) => t.id), confirmed?.activeTurn?.id]);
    const ctx = { client, chat: this.chat, myId: client.clientId, editors, rejections, role: this.access.role, acts: actsIn(chat) };
    const list = [...chat.turns.map((t) => [t, false]), ...(chat.activeTurn ? [[chat.activeTurn, true]] : [])];
    const nodes = [];
    const seen = new Set();
    for (const [turn, live] of list) {
      seen.add(turn.id);
      let tv = this.turns.get(turn.id);
      if (!tv) {
        tv = new TurnView(turn.id);
        this.turns.set(turn.id, tv);
      }
      tv.update(turn, live, { ...ctx, pendingTurn: !confirmedIds.has(turn.id) });
      nodes.push(tv.el);
    }
    for (const [id, tv] of this.turns) {
      if (!seen.has(id)) {
        tv.dispose();
        this.turns.delete(id);
      }
    }
    reconcile(this.transcriptEl, nodes);
    this.emptyEl.hidden = list.length > 0;

    const active = chat.activeTurn;
    this.activeTurnId = active?.id ?? null;
    const canSend = this.canSend();
    this.sendBtn.disabled = !!active || !canSend;
    this.stopBtn.hidden = !active || !canSend;
    const a = activityOf(chat.status);
    const role = this.access.role;
    let note = '';
    if (!canSend && role) note = roleNote(role, 'sending messages', 'participant');
    else if (active && a !== 'input-needed') note = 'The agent is working…';
    else if (active) {
      note = can(role, 'approver') ? 'The agent is waiting for you — answer the card above.' : 'The agent is waiting for someone — see the card above.';
    }
    setText(this.composerNote, note);
    this.composerNote.classList.toggle('role-note', !canSend && !!role);
    if (nearBottom) this.scrollToBottom(true);
    this.revealNewCards();
  }

  /** Whether this person may send messages and type the shared draft here. */
  canSend() {
    return can(this.access.role, 'participant');
  }

  roleChanged(role) {
    // Without a token (and not a guest) everyone owns everything: no badge.
    this.roleEl.hidden = !(token || invite) || !role;
    // Only an owner makes links (without auth, everyone is one).
    this.shareBtn.hidden = role !== 'owner';
    if (role !== 'owner') this.share?.close();
    setText(this.roleEl, role ?? '');
    if (role) this.roleEl.dataset.role = role;
    if (this.loaded) this.input.disabled = !this.canSend();
    this.input.placeholder = role && !this.canSend() ? 'Watching: you cannot send messages here' : this.placeholder;
    this.schedule();
  }

  openShare() {
    this.share ??= new ShareDialog({ client, session: this.session });
    this.share.open();
  }

  /** Bring a card that newly waits for a person into view (once per card). */
  revealNewCards(behavior = 'smooth') {
    const cards = this.transcriptEl.querySelectorAll('.input-card[data-state="open"], .tool-card[data-status="pending-confirmation"]');
    for (const card of cards) {
      const key = card.dataset.requestId ?? card.dataset.toolCallId;
      if (this.announced.has(key)) continue;
      this.announced.add(key);
      const box = this.scrollEl.getBoundingClientRect();
      const r = card.getBoundingClientRect();
      if (r.top < box.top || r.bottom > box.bottom) {
        this.scrollEl.scrollBy({ top: r.top - box.top - 16, behavior });
      }
      break;
    }
  }

  isNearBottom() {
    const s = this.scrollEl;
    return s.scrollHeight - s.scrollTop - s.clientHeight < 120;
  }

  scrollToBottom(force) {
    if (force || this.isNearBottom()) this.scrollEl.scrollTop = this.scrollEl.scrollHeight;
  }

  autosize() {
    this.input.style.height = 'auto';
    this.input.style.height = `${Math.min(this.input.scrollHeight, 200)}px`;
  }

  send() {
    const text = this.input.value.trim();
    if (!text || !this.chat || !this.canSend()) return;
    const chat = client.state(this.chat);
    if (chat?.activeTurn) {
      toast('The agent is still on the last message. Stop it or wait.', 'info');
      return;
    }
    this.lastSent = text;
    this.input.value = '';
    this.draftChanged();
    client.dispatch(this.chat, {
      type: 'chat/turnStarted',
      turnId: uuid(),
      startedAt: new Date().toISOString(),
      message: { text, origin: { kind: 'user' } },
    });
    // Name an untitled session after its first message.
    const session = client.state(this.session);
    if (session && (!session.title || session.title === 'New session')) {
      client.dispatch(this.session, { type: 'session/titleChanged', title: text.length > 60 ? `${text.slice(0, 57)}…` : text });
    }
    this.scrollToBottom(true);
  }

  stop() {
    const chat = client.state(this.chat);
    const t = chat?.activeTurn;
    if (!t) return;
    const started = Date.parse(t.startedAt);
    client.dispatch(this.chat, {
      type: 'chat/turnCancelled', turnId: t.id, duration: Number.isNaN(started) ? 0 : Math.max(0, Date.now() - started),
    });
  }

  onRejected({ action }) {
    if (action.type === 'chat/turnStarted' && !this.input.value && this.lastSent === action.message?.text) {
      this.input.value = action.message.text;
      this.draftChanged();
    }
    this.render();
  }

  /** The composer's text was set here (not typed): share it like typing. */
  draftChanged() {
    this.autosize();
    this.draftField?.typed();
  }

  dispose() {
    this.disposed = true;
    this.access.close();
    this.presence?.close();
    this.activity.dispose();
    this.notify.dispose();
    this.share?.dispose();
    this.draftField?.close();
    if (this.frame) cancelAnimationFrame(this.frame);
    client.removeEventListener('change', this.onChange);
    client.removeEventListener('missing', this.onMissing);
    for (const tv of this.turns.values()) tv.dispose();
    client.unsubscribe(this.session);
    if (this.chat) client.unsubscribe(this.chat);
  }
}

// ─── Router ──────────────────────────────────────────────────────────────

let currentView = null;

function route() {
  if (ended) return;
  const m = location.hash.match(/^#\/s\/([\w-]+)(?:\/([\w-]+))?/);
  currentView?.dispose();
  tab.title('Tandem');
  if (location.hash === '#/admin') currentView = new AdminView({ token, crumbsEl });
  else currentView = m ? new ChatView(m[1], m[2]) : new SessionsView();
  viewEl.replaceChildren(currentView.el);
}

window.addEventListener('hashchange', route);

// Debug hooks (the browser test uses them): drop the socket as a network
// failure would; the client reconnects with its last seen serverSeq.
window.tandem = {
  client,
  dropSocket: (opts) => client.dropSocket(opts),
  reconnectNow: () => client.reconnectNow(),
  stats: () => ({
    ...client.stats, status: client.status, lastSeenServerSeq: client.lastSeenServerSeq, clientId,
    ended: client.ended, endReason: client.endReason, socket: !!client.ws, reconnectScheduled: client.reconnectTimer != null,
  }),
};

function connect() {
  connEl.dataset.conn = client.status;
  setText(connEl, CONN_LABEL[client.status] ?? client.status);
  client.start().then(() => {
    route();
    waiting.load();
  }, (e) => {
    if (client.ended) return; // The page says why already.
    setChildren(viewEl, h('div', { class: 'page' }, h('div', { class: 'card error-card' }, `Could not connect: ${e.message}`)));
  });
}

// A guest who joined in this tab comes back in at once on a reload.
const JOINED_KEY = 'tandem.invite.joined';
const joinedHere = () => {
  try {
    return sessionStorage.getItem(JOINED_KEY) === invite;
  } catch {
    return false;
  }
};

/** An invite link: check it, ask the guest's name, then connect through it. */
async function startAsGuest() {
  const screen = new InviteScreen({
    name: people.chosen,
    onJoin: (name) => {
      people.choose(name);
      try {
        sessionStorage.setItem(JOINED_KEY, invite);
      } catch { /* asked again on a reload */ }
      connect();
    },
  });
  viewEl.replaceChildren(screen.el);
  connEl.dataset.conn = 'offline';
  setText(connEl, 'Not connected');
  // A link that lets nobody in says so before anyone types a name.
  let why = null;
  try {
    why = await inviteRefusal(invite, guest);
  } catch { /* the server did not answer: the socket will find out */ }
  if (why) {
    client.end(why);
    return;
  }
  if (joinedHere() && people.chosen) connect();
  else screen.ask();
}

if (invite) startAsGuest();
else connect();
// The worker that shows this person's notifications (web/sw.js).
registerWorker().catch((e) => console.warn('the service worker did not register', e));

// The admin view (#/admin): who is connected, which sessions wait for a
// person and for how long, and the server's metrics as small charts — all
// from the server itself (`/admin/overview` and `/metrics`, read with the
// page's token every two seconds), no other service.

import { h, setChildren, setText } from './dom.js';

const EVERY_MS = 2000;
/** Samples each chart keeps (two minutes). */
const KEEP = 60;

/** Parse a Prometheus text exposition into [{name, labels, value}]. */
export function parseMetrics(text) {
  const out = [];
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = line.match(/^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)/);
    if (!m) continue;
    const labels = {};
    for (const l of (m[2] ?? '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
    out.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return out;
}

/** The sum of `name`'s samples whose labels include `where`. */
function total(samples, name, where = {}) {
  return samples
    .filter((s) => s.name === name && Object.entries(where).every(([k, v]) => s.labels[k] === v))
    .reduce((a, s) => a + s.value, 0);
}

function duration(secs) {
  if (secs < 60) return `${Math.floor(secs)} s`;
  if (secs < 3600) return `${Math.floor(secs / 60)} min ${Math.floor(secs % 60)} s`;
  return `${Math.floor(secs / 3600)} h ${Math.floor((secs % 3600) / 60)} min`;
}

function bytes(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1 << 20) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / (1 << 20)).toFixed(1)} MiB`;
}

const SVG = 'http://www.w3.org/2000/svg';

/** A small line chart of `points` (numbers), scaled to its own maximum. */
function sparkline(points, w = 220, hgt = 48) {
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('class', 'spark');
  svg.setAttribute('viewBox', `0 0 ${w} ${hgt}`);
  svg.setAttribute('width', w);
  svg.setAttribute('height', hgt);
  const max = Math.max(1e-9, ...points);
  const step = w / Math.max(1, KEEP - 1);
  const x0 = w - step * (points.length - 1);
  const xy = points.map((p, i) => `${(x0 + i * step).toFixed(1)},${(hgt - 2 - (p / max) * (hgt - 6)).toFixed(1)}`);
  if (xy.length) {
    const area = document.createElementNS(SVG, 'path');
    area.setAttribute('d', `M${x0.toFixed(1)},${hgt} L${xy.join(' L')} L${w},${hgt} Z`);
    area.setAttribute('class', 'spark-area');
    const line = document.createElementNS(SVG, 'polyline');
    line.setAttribute('points', xy.join(' '));
    line.setAttribute('class', 'spark-line');
    svg.append(area, line);
  }
  return svg;
}

/** The charts: what each draws from two successive scrapes. */
const CHARTS = [
  { key: 'deliveries', title: 'Deliveries / s', rate: (s) => total(s, 'tandem_deliveries_total') },
  { key: 'actions', title: 'Actions accepted / s', rate: (s) => total(s, 'tandem_actions_accepted_total') },
  { key: 'rejected', title: 'Actions refused / s', rate: (s) => total(s, 'tandem_actions_rejected_total') },
  { key: 'sent', title: 'Bytes sent / s', rate: (s) => total(s, 'tandem_sent_bytes_total'), unit: bytes },
  { key: 'connections', title: 'Connections', gauge: (s) => total(s, 'tandem_connections') },
  {
    key: 'commit', title: 'Journal commit, mean ms',
    ratio: (s) => [total(s, 'tandem_journal_commit_seconds_sum') * 1000, total(s, 'tandem_journal_commit_seconds_count')],
  },
];

export class AdminView {
  constructor({ token, crumbsEl }) {
    this.token = token;
    this.history = Object.fromEntries(CHARTS.map((c) => [c.key, []]));
    this.last = null;
    this.statsEl = h('div', { class: 'admin-stats' });
    this.chartsEl = h('div', { class: 'admin-charts' });
    this.connsEl = h('tbody');
    this.sessionsEl = h('div', { class: 'admin-sessions' });
    this.noteEl = h('div', { class: 'muted admin-note' });
    this.notifyEl = h('div', { class: 'admin-notify' });
    this.el = h('div', { class: 'page admin-page' },
      h('div', { class: 'page-inner' },
        h('h1', null, 'Server'),
        this.statsEl,
        this.chartsEl,
        h('h2', null, 'Waiting for a person'),
        this.sessionsEl,
        h('h2', null, 'Connections'),
        h('table', { class: 'admin-table' },
          h('thead', null, h('tr', null, ...['Person', 'Subject', 'Role', 'Client', 'Subscriptions', 'Queued', 'Open for'].map((t) => h('th', null, t)))),
          this.connsEl),
        h('h2', null, 'Notifications'),
        this.notifyEl,
        this.noteEl));
    setChildren(crumbsEl, h('a', { class: 'crumb-back', href: '#/', 'aria-label': 'All sessions' }, '‹'), h('span', { class: 'crumb-title' }, 'Admin'));
    this.refresh();
    this.timer = setInterval(() => this.refresh(), EVERY_MS);
  }

  async get(path) {
    const res = await fetch(path, { headers: this.token ? { Authorization: `Bearer ${this.token}` } : {}, cache: 'no-store' });
    if (res.status === 401 || res.status === 403) {
      const err = new Error((await res.text()).trim());
      err.refused = true;
      throw err;
    }
    if (!res.ok) throw new Error(`${path}: HTTP ${res.status}`);
    return res;
  }

  async refresh() {
    // One at a time: a slow answer must not interleave with the next.
    if (this.busy) return;
    this.busy = true;
    try {
      await this.refreshOnce();
    } finally {
      this.busy = false;
    }
  }

  async refreshOnce() {
    let overview;
    let samples;
    try {
      [overview, samples] = await Promise.all([
        this.get('/admin/overview').then((r) => r.json()),
        this.get('/metrics').then((r) => r.text()).then(parseMetrics),
      ]);
    } catch (e) {
      if (e.refused) {
        clearInterval(this.timer);
        setChildren(this.el, h('div', { class: 'page-inner' },
          h('div', { class: 'card error-card admin-refused' },
            h('strong', null, 'This view needs an admin token. '),
            `The server said: ${e.message}. Open the page as /?token=<admin token>#/admin.`)));
      } else {
        setText(this.noteEl, `Not refreshed: ${e.message}`);
      }
      return;
    }
    this.charts(samples);
    this.stats(overview, samples);
    this.connections(overview.connections);
    this.sessions(overview.sessions);
    this.notifications(overview.notify);
    setText(this.noteEl, `Refreshed ${new Date().toLocaleTimeString()} · serverSeq ${overview.serverSeq}`);
  }

  charts(samples) {
    const now = performance.now();
    for (const c of CHARTS) {
      let v = null;
      if (c.gauge) v = c.gauge(samples);
      else if (this.last && c.rate) v = Math.max(0, (c.rate(samples) - c.rate(this.last.samples)) / ((now - this.last.at) / 1000));
      else if (this.last && c.ratio) {
        const [s1, n1] = c.ratio(samples);
        const [s0, n0] = c.ratio(this.last.samples);
        v = n1 > n0 ? (s1 - s0) / (n1 - n0) : 0;
      }
      if (v == null) continue;
      const h2 = this.history[c.key];
      h2.push(v);
      if (h2.length > KEEP) h2.shift();
    }
    this.last = { samples, at: now };
    setChildren(this.chartsEl, CHARTS.map((c) => {
      const pts = this.history[c.key];
      const cur = pts.at(-1);
      const shown = cur == null ? '—' : c.unit ? `${c.unit(Math.round(cur))}` : cur >= 100 ? Math.round(cur).toLocaleString() : cur.toFixed(cur >= 10 ? 1 : 2);
      return h('div', { class: 'admin-chart', 'data-chart': c.key },
        h('div', { class: 'admin-chart-head' }, h('span', null, c.title), h('strong', null, shown)),
        sparkline(pts));
    }));
  }

  stats(overview, samples) {
    const waiting = overview.sessions.reduce((a, s) => a + s.waiting.length, 0);
    const items = [
      ['Connections', total(samples, 'tandem_connections')],
      ['Subscriptions', total(samples, 'tandem_subscriptions')],
      ['Sessions', total(samples, 'tandem_channels', { kind: 'session' })],
      ['Chats', total(samples, 'tandem_channels', { kind: 'chat' })],
      ['Waiting for a person', waiting],
      ['Evictions', total(samples, 'tandem_evictions_total')],
      ['Agents connected', total(samples, 'tandem_providers_connected')],
      ['Agent processes', total(samples, 'tandem_agent_processes')],
    ];
    setChildren(this.statsEl, items.map(([k, v]) => h('div', { class: 'admin-stat' }, h('div', { class: 'admin-stat-value' }, String(v)), h('div', { class: 'muted' }, k))));
  }

  connections(list) {
    setChildren(this.connsEl, list.length
      ? list.map((c) => h('tr', { class: 'admin-conn', 'data-conn': c.conn },
        h('td', { class: 'admin-person' }, c.name ?? '—', c.invite ? h('span', { class: 'muted', title: `came in through invite link ${c.invite}` }, ' · by invite') : null),
        h('td', null, c.subject), h('td', null, c.role), h('td', { class: 'mono' }, c.clientId ?? '—'),
        h('td', null, String(c.subscriptions)), h('td', null, bytes(c.queuedBytes)), h('td', null, duration(c.openSecs))))
      : h('tr', null, h('td', { colspan: 7, class: 'muted' }, 'No connections.')));
  }

  sessions(list) {
    const waiting = list.filter((s) => s.waiting.length);
    setChildren(this.sessionsEl, waiting.length
      ? waiting.map((s) => h('div', { class: 'card admin-session', 'data-session': s.session },
        h('div', { class: 'admin-session-head' },
          h('a', { href: `#/s/${s.session.replace(/^ahp-session:\//, '')}` }, s.session),
          h('span', { class: 'muted' }, `${s.provider ?? ''} · ${s.chats} chat(s) · ${s.subscribers} watching${roles(s)}`)),
        h('ul', { class: 'admin-waiting-list' }, s.waiting.map((w) => h('li', { class: 'admin-waiting', 'data-kind': w.kind },
          h('span', { class: `admin-kind admin-kind-${w.kind}` }, w.kind),
          h('span', { class: 'admin-waiting-title' }, w.title),
          h('span', { class: 'admin-waited', title: 'waiting for' }, duration(w.waitingSecs)))))))
      : h('div', { class: 'muted' }, `Nobody is being waited on (${list.length} session(s)).`));
  }

  notifications(n) {
    if (!n) return;
    const push = n.webPush ?? {};
    const pushLine = !push.on ? 'Web Push is off.'
      : push.error ? `Web Push: ${push.error}`
        : `Web Push: ${push.people} person(s), ${push.devices} browser(s) registered.`;
    const last = (l) => !l ? 'nothing sent yet'
      : `${l.outcome}${l.status ? ` (HTTP ${l.status})` : ''} · ${new Date(l.at).toLocaleTimeString()}${l.attempts > 1 ? ` · ${l.attempts} attempts` : ''}${l.error ? ` · ${l.error}` : ''}`;
    setChildren(this.notifyEl,
      h('div', { class: 'muted admin-push' }, pushLine),
      n.webhooks.length
        ? h('table', { class: 'admin-table' },
          h('thead', null, h('tr', null, ...['Webhook', 'Target', 'Format', 'Told of', 'Last delivery'].map((t) => h('th', null, t)))),
          h('tbody', null, n.webhooks.map((w) => h('tr', { class: 'admin-webhook', 'data-webhook': w.name },
            h('td', null, w.name, w.signed ? h('span', { class: 'muted' }, ' · signed') : null),
            h('td', { class: 'mono' }, w.target), h('td', null, w.format),
            h('td', null, `${w.only === 'approvals' ? 'approvals' : 'every request'}${w.sessions ? ` in ${w.sessions.length} session(s)` : ''}`),
            h('td', { class: `admin-last admin-last-${w.last?.outcome ?? 'none'}` }, last(w.last))))))
        : h('div', { class: 'muted' }, 'No webhooks configured.'));
  }

  dispose() {
    clearInterval(this.timer);
  }
}

/** " · 2 owners, 1 viewer · 1 open invite": the roles a session's owner set. */
function roles(s) {
  const counts = {};
  for (const a of Object.values(s.members ?? {})) counts[a] = (counts[a] ?? 0) + 1;
  const named = Object.entries(counts).map(([a, n]) => `${n} ${a}${n > 1 ? 's' : ''}`).join(', ');
  const invites = s.openInvites ? ` · ${s.openInvites} open invite${s.openInvites > 1 ? 's' : ''}` : '';
  return (named ? ` · ${named}` : '') + invites;
}

// AHP 1.0 client over one WebSocket: JSON-RPC requests, channel state kept
// with the official reducers (ported in reducers.js), optimistic dispatch with
// reconciliation against the server's echo, and `reconnect` with the last
// seen `serverSeq` after the socket drops.
//
// State per channel:
//   confirmed — the snapshot plus every accepted envelope newer than it, in
//               serverSeq order: exactly what the server holds;
//   view      — confirmed plus this client's own actions still waiting for
//               their echo, re-applied in clientSeq order. This is what the
//               UI shows. An echo moves an action from pending into confirmed;
//               a rejection drops it, so the view reverts.

import { applyToChannel } from './reducers.js';

export const ROOT = 'ahp-root://';
const PROTOCOL_VERSIONS = ['1.0.0'];
const REQUEST_TIMEOUT_MS = 20000;
const BACKOFF_MS = [200, 500, 1000, 2000, 4000];
// The server closes a socket with this code when its token expires
// (src/transport/close.rs TOKEN_EXPIRED_CLOSE_CODE).
const TOKEN_EXPIRED_CLOSE = 4401;
// ... and this one when the invite link it came in through is revoked or
// expires (INVITE_ENDED_CLOSE_CODE); the reason says which.
const INVITE_ENDED_CLOSE = 4403;

/** A v4 UUID; `crypto.randomUUID` exists only in secure contexts. */
export function uuid() {
  if (globalThis.crypto?.randomUUID) return crypto.randomUUID();
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const hex = [...b].map((x) => x.toString(16).padStart(2, '0')).join('');
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

export class RpcError extends Error {
  constructor(error) {
    super(error?.message ?? String(error));
    this.code = error?.code;
    this.data = error?.data;
  }
}

export class AhpClient extends EventTarget {
  /**
   * @param {{url: string, clientId: string}} opts
   */
  constructor({ url, clientId }) {
    super();
    this.url = url;
    this.clientId = clientId;
    this.meta = null; // () => `_meta` for initialize / reconnect, or undefined
    this.ws = null;
    this.status = 'connecting'; // connecting | live | reconnecting | offline | expired | ended
    this.initialized = false; // after the first successful initialize
    this.lastSeenServerSeq = 0;
    this.nextId = 1;
    this.nextClientSeq = 1;
    this.requests = new Map(); // id -> {resolve, reject, onResult, timer}
    this.channels = new Map(); // uri -> {confirmed, view, fromSeq}
    this.pending = []; // own actions awaiting their echo: {clientSeq, channel, action, sent, quiet}
    this.waiting = []; // requests to send once the handshake is done
    this.attempt = 0;
    this.hold = false;
    this.reconnectTimer = null;
    // A browser cannot read why an upgrade was refused: `admission()`, when
    // set, asks another way after a socket closed without ever opening. It
    // resolves with the refusal's words (the client stops: `ended`), or null
    // (not refused: try again); after `maxFailedOpens` such closes in a row
    // the client stops too.
    this.admission = null;
    this.maxFailedOpens = Infinity;
    this.failedOpens = 0;
    this.ended = false;
    this.endReason = null;
    this.stats = { reconnects: 0, lastReconnect: null, replayed: 0, rejections: 0, opens: 0 };
  }

  // ─── Connection ────────────────────────────────────────────────────────

  /** Open the socket and initialize; resolves with the initialize result. */
  start() {
    return new Promise((resolve, reject) => {
      this.onFirstReady = { resolve, reject };
      this.open();
    });
  }

  open() {
    clearTimeout(this.reconnectTimer);
    this.reconnectTimer = null;
    if (this.ended) return; // Let in no more: only a new page tries again.
    this.stats.opens += 1;
    const ws = new WebSocket(this.url);
    this.ws = ws;
    ws.onopen = () => {
      ws.opened = true;
      this.failedOpens = 0;
      this.handshake(ws);
    };
    ws.onmessage = (ev) => this.onMessage(ev.data);
    ws.onclose = (ev) => this.onClose(ws, ev);
    ws.onerror = () => { /* onclose follows */ };
  }

  setStatus(status) {
    if (this.status === status) return;
    this.status = status;
    this.emit('status', { status });
  }

  handshake(ws) {
    if (ws !== this.ws) return;
    if (!this.initialized) {
      this.rawRequest('initialize', {
        channel: ROOT,
        protocolVersions: PROTOCOL_VERSIONS,
        clientId: this.clientId,
        clientInfo: { name: 'tandem-web', version: '1' },
        initialSubscriptions: [ROOT],
        ...this.metaParams(),
      }, (result) => {
        this.initialized = true;
        const seqs = result.snapshots.map((s) => s.fromSeq);
        this.lastSeenServerSeq = seqs.length ? Math.min(...seqs) : result.serverSeq;
        for (const s of result.snapshots) this.installSnapshot(s);
        this.init = result;
        this.ready();
        this.onFirstReady?.resolve(result);
        this.onFirstReady = null;
      }).catch((e) => {
        this.onFirstReady?.reject(e);
        this.onFirstReady = null;
      });
      return;
    }
    // Resume: the server replays what we missed or sends fresh snapshots.
    this.rawRequest('reconnect', {
      channel: ROOT,
      clientId: this.clientId,
      lastSeenServerSeq: this.lastSeenServerSeq,
      subscriptions: [...this.channels.keys()],
      ...this.metaParams(),
    }, (result) => {
      this.stats.reconnects += 1;
      this.stats.lastReconnect = result.type;
      if (result.type === 'replay') {
        this.stats.replayed += result.actions.length;
        for (const env of result.actions) this.onEnvelope(env, { replay: true });
        for (const uri of result.missing ?? []) {
          this.channels.delete(uri);
          this.emit('missing', { uri });
        }
      } else {
        const got = new Set();
        for (const s of result.snapshots ?? []) {
          this.installSnapshot(s);
          got.add(s.resource);
        }
        for (const uri of [...this.channels.keys()]) {
          if (!got.has(uri)) {
            this.channels.delete(uri);
            this.emit('missing', { uri });
          }
        }
        // Which of our in-flight actions the server took is unknowable now;
        // resend them quietly (drafts are idempotent, the rest is refused).
        for (const p of this.pending) p.quiet = true;
      }
      this.ready();
      this.emit('reconnected', { type: result.type });
    }).catch((e) => {
      console.warn('reconnect failed', e);
      this.ws?.close();
    });
  }

  /** `{_meta}` for `initialize` / `reconnect` when `this.meta()` gives one (e.g. the person's name). */
  metaParams() {
    const meta = this.meta?.();
    return meta ? { _meta: meta } : {};
  }

  ready() {
    this.attempt = 0;
    this.setStatus('live');
    // Actions made while away (or lost in flight) go out again, in order.
    for (const p of this.pending) {
      if (!p.sent) this.sendDispatch(p);
    }
    const waiting = this.waiting;
    this.waiting = [];
    for (const w of waiting) w();
  }

  onClose(ws, ev) {
    if (ws !== this.ws) return;
    this.ws = null;
    for (const [, r] of this.requests) {
      clearTimeout(r.timer);
      r.reject(new RpcError({ code: -1, message: 'connection lost' }));
    }
    this.requests.clear();
    for (const p of this.pending) p.sent = false;
    if (!this.initialized && this.onFirstReady) {
      // Never got going: keep trying, the page shows "connecting".
    }
    if (ev?.code === TOKEN_EXPIRED_CLOSE) {
      // The same token would be refused: wait for a page with a fresh one.
      this.setStatus('expired');
      return;
    }
    if (ev?.code === INVITE_ENDED_CLOSE) {
      // The link was revoked or expired: it lets nobody back in.
      this.end(ev.reason || null);
      return;
    }
    if (!ws.opened && this.admission && !this.hold) {
      this.setStatus('reconnecting');
      this.checkAdmission();
      return;
    }
    this.setStatus(this.hold ? 'offline' : 'reconnecting');
    if (!this.hold) this.scheduleReconnect();
  }

  /** A socket closed before it opened: refused, or only unlucky? */
  async checkAdmission() {
    this.failedOpens += 1;
    let why = null;
    try {
      why = await this.admission();
    } catch {
      why = null; // Not answered: as unlucky as the socket.
    }
    if (this.ws || this.ended || this.hold) return;
    if (why) this.end(why);
    else if (this.failedOpens >= this.maxFailedOpens) this.end(null);
    else this.scheduleReconnect();
  }

  /**
   * Stop for good (`reason`: why, or null when unknown): no reconnect is
   * tried again; the page says so (`ended`).
   */
  end(reason) {
    clearTimeout(this.reconnectTimer);
    this.reconnectTimer = null;
    this.ended = true;
    this.endReason = reason;
    const ws = this.ws;
    this.ws = null;
    ws?.close();
    this.setStatus('ended');
    this.emit('ended', { reason });
    this.onFirstReady?.reject(new RpcError({ code: -32009, message: reason ?? 'not let in' }));
    this.onFirstReady = null;
  }

  scheduleReconnect() {
    clearTimeout(this.reconnectTimer);
    if (this.ended) return;
    const delay = BACKOFF_MS[Math.min(this.attempt, BACKOFF_MS.length - 1)];
    this.attempt += 1;
    this.reconnectTimer = setTimeout(() => this.open(), delay);
  }

  /**
   * Debug hook (also used by the browser test): close the socket as a network
   * drop would. With `hold`, stay offline until `reconnectNow()`.
   */
  dropSocket({ hold = false } = {}) {
    this.hold = hold;
    this.ws?.close(4000, 'dropped by the client (debug)');
  }

  reconnectNow() {
    this.hold = false;
    if (!this.ws && !this.ended) {
      this.setStatus('reconnecting');
      this.open();
    }
  }

  // ─── JSON-RPC ──────────────────────────────────────────────────────────

  rawRequest(method, params, onResult) {
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.requests.delete(id);
        reject(new RpcError({ code: -2, message: `${method} timed out` }));
      }, REQUEST_TIMEOUT_MS);
      this.requests.set(id, { resolve, reject, onResult, timer });
      try {
        this.ws.send(JSON.stringify({ jsonrpc: '2.0', id, method, params }));
      } catch (e) {
        clearTimeout(timer);
        this.requests.delete(id);
        reject(e);
      }
    });
  }

  /** A request after the handshake; waits for the connection if it is down. */
  request(method, params, onResult) {
    if (this.status === 'live' && this.ws?.readyState === WebSocket.OPEN) {
      return this.rawRequest(method, params, onResult);
    }
    return new Promise((resolve, reject) => {
      this.waiting.push(() => this.rawRequest(method, params, onResult).then(resolve, reject));
    });
  }

  onMessage(data) {
    let msg;
    try {
      msg = JSON.parse(data);
    } catch {
      console.warn('bad frame', data);
      return;
    }
    if (msg.id != null && (msg.result !== undefined || msg.error !== undefined)) {
      const r = this.requests.get(msg.id);
      if (!r) return;
      this.requests.delete(msg.id);
      clearTimeout(r.timer);
      if (msg.error) return r.reject(new RpcError(msg.error));
      // Handled synchronously, before the next frame: a subscribe or reconnect
      // result must be in place before the envelopes that follow it.
      try {
        r.onResult?.(msg.result);
      } catch (e) {
        console.error(e);
      }
      r.resolve(msg.result);
      return;
    }
    if (msg.method === 'action') {
      this.onEnvelope(msg.params, { replay: false });
    } else if (msg.method) {
      this.emit('notification', { method: msg.method, params: msg.params });
    }
  }

  // ─── Channels ──────────────────────────────────────────────────────────

  installSnapshot(snap) {
    const ch = { confirmed: snap.state, fromSeq: snap.fromSeq, view: null };
    this.channels.set(snap.resource, ch);
    this.recompute(snap.resource, null);
  }

  /** Subscribe and resolve with the channel's (view) state. */
  async subscribe(uri) {
    if (this.channels.has(uri)) return this.state(uri);
    await this.request('subscribe', { channel: uri }, (result) => {
      if (result.snapshot) this.installSnapshot(result.snapshot);
    });
    return this.state(uri);
  }

  async unsubscribe(uri) {
    if (!this.channels.delete(uri)) return;
    this.pending = this.pending.filter((p) => p.channel !== uri);
    try {
      await this.request('unsubscribe', { channel: uri });
    } catch {
      // Gone with the connection; a reconnect will not list it.
    }
  }

  /** What the UI shows for `uri` (confirmed + own pending actions). */
  state(uri) {
    return this.channels.get(uri)?.view ?? null;
  }

  /** What the server holds for `uri`, as far as this client has heard. */
  confirmedState(uri) {
    return this.channels.get(uri)?.confirmed ?? null;
  }

  recompute(uri, env) {
    const ch = this.channels.get(uri);
    if (!ch) return;
    const mine = this.pending.filter((p) => p.channel === uri);
    if (mine.length === 0) {
      ch.view = ch.confirmed;
    } else {
      const view = structuredClone(ch.confirmed);
      for (const p of mine) applyToChannel(uri, view, structuredClone(p.action));
      ch.view = view;
    }
    this.emit('change', { uri, envelope: env });
  }

  onEnvelope(env, { replay }) {
    if (typeof env.serverSeq === 'number' && env.serverSeq > this.lastSeenServerSeq) {
      this.lastSeenServerSeq = env.serverSeq;
    }
    const mine = env.origin?.clientId === this.clientId;
    const idx = mine ? this.pending.findIndex((p) => p.clientSeq === env.origin.clientSeq) : -1;
    const p = idx >= 0 ? this.pending.splice(idx, 1)[0] : null;
    const ch = this.channels.get(env.channel);
    if (env.rejectionReason != null) {
      if (p) {
        this.stats.rejections += 1;
        this.emit('rejected', { channel: env.channel, clientSeq: p.clientSeq, action: env.action, reason: env.rejectionReason, quiet: p.quiet });
        this.recompute(env.channel, null);
      }
      return;
    }
    if (ch && env.serverSeq > ch.fromSeq) {
      applyToChannel(env.channel, ch.confirmed, structuredClone(env.action));
    }
    if (ch) this.recompute(env.channel, env);
    this.emit('envelope', { envelope: env, replay, mine });
  }

  /**
   * Dispatch an action: applied to the view at once, sent now or after the
   * next reconnect, confirmed by its echo or reverted by its rejection.
   */
  dispatch(channel, action) {
    const p = { clientSeq: this.nextClientSeq++, channel, action, sent: false, quiet: false };
    this.pending.push(p);
    this.recompute(channel, null);
    if (this.status === 'live') this.sendDispatch(p);
    return p.clientSeq;
  }

  sendDispatch(p) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return;
    p.sent = true;
    this.rawRequest('dispatchAction', { channel: p.channel, clientSeq: p.clientSeq, action: p.action })
      .catch(() => { /* the echo (or a reconnect) settles it */ });
  }

  emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail }));
  }
}

// "Notify me" (docs/protocol.md, "Notifications"): Web Push to this browser
// when the agent needs the person and they are not looking, and their
// choice per session of what they are told.
//
// Turning it on: the browser's permission (`Notification.requestPermission`),
// the service worker (`/sw.js`), the server's VAPID key
// (`tandem/notifySettings`), a push subscription made with it
// (`PushManager.subscribe`), handed to the server (`tandem/pushSubscribe`).
// Each step that can fail says so in the panel: notifications blocked, a
// browser that cannot receive push here (with its own words), a server
// with Web Push off. Turning it off forgets the subscription on both sides.
// The choice per session (`tandem/setNotify`: all, only approvals, off) is
// the server's, read back from `tandem/notifySettings`.

import { h, setText } from './dom.js';

/** How long a push service may take to make a subscription before the page gives up on it. */
const SUBSCRIBE_TIMEOUT_MS = 20000;

const MODES = [
  ['all', 'Every request'],
  ['approvals', 'Only tool approvals'],
  ['off', 'Nothing'],
];

/** Whether this page can hold a push subscription at all; else why not. */
function pushUnavailable() {
  if (!window.isSecureContext) return 'the page is not served over https';
  if (!('serviceWorker' in navigator)) return 'this browser has no service workers here';
  if (!('PushManager' in window)) return 'this browser has no Push API';
  if (!('Notification' in window)) return 'this browser has no notifications';
  return null;
}

let registering = null;

/**
 * Register the service worker (once a page); resolves with its
 * registration once it is active, or null where there are no workers.
 */
export function registerWorker() {
  if (!('serviceWorker' in navigator) || !window.isSecureContext) return Promise.resolve(null);
  registering ??= (async () => {
    // A click on a notification while an older page is not controlled by
    // the worker: the worker asks the page to show the chat.
    navigator.serviceWorker.addEventListener('message', (e) => {
      if (e.data?.type === 'tandem/open' && typeof e.data.hash === 'string' && e.data.hash.startsWith('#/')) {
        location.hash = e.data.hash;
      }
    });
    await navigator.serviceWorker.register('/sw.js');
    return navigator.serviceWorker.ready;
  })();
  return registering;
}

/** base64url → bytes (`applicationServerKey`). */
function keyBytes(b64) {
  const s = atob(b64.replace(/-/g, '+').replace(/_/g, '/'));
  return Uint8Array.from(s, (c) => c.charCodeAt(0));
}

function sameKey(sub, publicKey) {
  const had = sub.options?.applicationServerKey;
  if (!had) return true; // Not readable here: take it as the same.
  const a = new Uint8Array(had);
  const b = keyBytes(publicKey);
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

function withTimeout(promise, ms, what) {
  let timer;
  return Promise.race([
    promise,
    new Promise((_, reject) => { timer = setTimeout(() => reject(new Error(what)), ms); }),
  ]).finally(() => clearTimeout(timer));
}

/** What the panel says of this browser, by state. */
const DEVICE = {
  loading: ['Checking…', '', null],
  working: ['Turning on…', '', null],
  on: ['On in this browser', 'You are told here when the agent needs you and you are not looking at the chat.', 'Turn off in this browser'],
  off: ['Off in this browser', 'Turn it on to be told here when the agent needs you.', 'Turn on'],
  dismissed: ['Off in this browser', 'The browser did not get an answer about notifications.', 'Turn on'],
  denied: ['Notifications are blocked', 'This browser blocks notifications from this site. Allow them in its site settings, then try again.', 'Try again'],
  unsupported: ['This browser cannot receive push here', '', 'Try again'],
  failed: ['Not turned on', '', 'Try again'],
  'server-off': ['Web Push is off on this server', 'The server has no push key: ask its operator. Webhooks may still tell your team.', null],
};

/**
 * The "Notify me" button and its panel for one session: `button` goes in
 * the session bar, `panel` in the chat page.
 */
export class NotifyControl {
  constructor({ client, session }) {
    Object.assign(this, { client, session });
    this.state = 'loading';
    this.detail = '';
    this.devices = null;
    this.publicKey = undefined;
    this.button = h('button', {
      class: 'btn btn-small notify-btn', type: 'button', 'data-action': 'notify', 'aria-expanded': 'false',
      title: 'Be told in this browser when the agent needs you', onclick: () => this.clicked(),
    }, h('span', { class: 'notify-dot', 'aria-hidden': 'true' }), 'Notify me');
    this.titleEl = h('div', { class: 'notify-title' });
    this.textEl = h('p', { class: 'notify-text muted' });
    this.actionBtn = h('button', { class: 'btn btn-small', type: 'button', 'data-action': 'notify-device', onclick: () => this.deviceAction() });
    this.deviceEl = h('section', { class: 'notify-device', 'data-notify-state': 'loading' }, this.titleEl, this.textEl, this.actionBtn);
    this.mode = h('select', { class: 'input select', 'data-field': 'notify-mode', disabled: true, 'aria-label': 'Tell me about', onchange: () => this.setMode() },
      MODES.map(([v, label]) => h('option', { value: v }, label)));
    this.modeNote = h('p', { class: 'notify-text muted' }, 'In every browser where notifications are on, while you are not looking.');
    this.modeError = h('div', { class: 'card-error', role: 'alert', hidden: true });
    this.panel = h('div', { class: 'notify-panel', role: 'dialog', 'aria-label': 'Notifications', 'data-panel': 'notify', hidden: true },
      h('div', { class: 'notify-head' },
        h('h2', null, 'Notifications'),
        h('button', { class: 'btn btn-ghost btn-small', type: 'button', 'aria-label': 'Close', 'data-action': 'close-notify', onclick: () => this.close() }, '✕')),
      this.deviceEl,
      h('section', { class: 'notify-session' },
        h('label', { class: 'notify-mode' }, h('span', { class: 'label' }, 'In this session, tell me about'), this.mode),
        this.modeNote,
        this.modeError));
    this.onKey = (e) => { if (e.key === 'Escape') this.close(); };
    this.onReconnected = () => this.load();
    client.addEventListener('reconnected', this.onReconnected);
    this.show();
    this.load();
  }

  /** The server's key, this person's device count and their choice here; then this browser's state. */
  async load() {
    let r;
    try {
      r = await this.client.request('tandem/notifySettings', { channel: this.session });
    } catch (e) {
      if (e.code === -1 || this.disposed) return; // The connection went: `reconnected` asks again.
      this.publicKey = null;
      this.set('failed', `The server did not say: ${e.message}`);
      return;
    }
    if (this.disposed) return;
    this.publicKey = r.publicKey ?? null;
    this.devices = r.devices ?? 0;
    if (r.mode) this.mode.value = r.mode;
    this.mode.disabled = false;
    this.mode.dataset.mode = this.mode.value;
    if (this.state === 'working') return;
    await this.check();
  }

  /** This browser's state, without asking the person anything. */
  async check() {
    const why = pushUnavailable();
    if (why) return this.set('unsupported', `Push needs it: ${why}.`);
    if (this.publicKey === null) return this.set('server-off');
    if (Notification.permission === 'denied') return this.set('denied');
    const reg = await navigator.serviceWorker.getRegistration('/');
    const sub = await reg?.pushManager.getSubscription();
    if (!sub) return this.set('off');
    if (!sameKey(sub, this.publicKey)) return this.set('off', 'The server has a new push key: turn it on again.');
    // Still this browser's: the server keeps it fresh (the same endpoint replaces itself).
    try {
      const r = await this.client.request('tandem/pushSubscribe', { subscription: sub.toJSON() });
      this.devices = r.devices;
      this.set('on');
    } catch (e) {
      this.set('failed', `The server did not take this browser's subscription: ${e.message}`);
    }
  }

  clicked() {
    if (!this.panel.hidden) {
      this.close();
      return;
    }
    this.open();
    if (this.state === 'off' || this.state === 'dismissed') this.turnOn();
  }

  open() {
    this.panel.hidden = false;
    this.button.setAttribute('aria-expanded', 'true');
    document.addEventListener('keydown', this.onKey);
  }

  close() {
    this.panel.hidden = true;
    this.button.setAttribute('aria-expanded', 'false');
    document.removeEventListener('keydown', this.onKey);
  }

  deviceAction() {
    if (this.state === 'on') this.turnOff();
    else this.turnOn();
  }

  /** The whole flow, each step as far as this browser and server allow. */
  async turnOn() {
    const why = pushUnavailable();
    if (why) return this.set('unsupported', `Push needs it: ${why}.`);
    this.set('working');
    const permission = await Notification.requestPermission();
    if (permission === 'denied') return this.set('denied');
    if (permission !== 'granted') return this.set('dismissed');
    let reg;
    try {
      reg = await registerWorker();
    } catch (e) {
      return this.set('unsupported', `The service worker did not start: ${e.message}`);
    }
    if (this.publicKey === undefined) await this.load();
    if (this.publicKey === undefined) return this.set('failed', 'The server did not answer.');
    if (this.publicKey === null) return this.set('server-off');
    let sub;
    try {
      const had = await reg.pushManager.getSubscription();
      if (had && !sameKey(had, this.publicKey)) await had.unsubscribe();
      sub = (had && sameKey(had, this.publicKey)) ? had : await withTimeout(
        reg.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: keyBytes(this.publicKey) }),
        SUBSCRIBE_TIMEOUT_MS,
        `the browser's push service did not answer within ${SUBSCRIBE_TIMEOUT_MS / 1000} s`,
      );
    } catch (e) {
      return this.set('unsupported', `The browser said: ${e.message || e.name}.`);
    }
    try {
      const r = await this.client.request('tandem/pushSubscribe', { subscription: sub.toJSON() });
      this.devices = r.devices;
      this.set('on');
    } catch (e) {
      // Not kept by the server: not kept here either.
      await sub.unsubscribe().catch(() => {});
      this.set('failed', `The server did not take this browser's subscription: ${e.message}`);
    }
  }

  async turnOff() {
    this.set('working');
    const reg = await navigator.serviceWorker.getRegistration('/');
    const sub = await reg?.pushManager.getSubscription();
    let note = '';
    if (sub) {
      try {
        const r = await this.client.request('tandem/pushUnsubscribe', { endpoint: sub.endpoint });
        this.devices = r.devices;
      } catch (e) {
        note = `The server did not hear it (${e.message}); this browser gets nothing more anyway.`;
      }
      await sub.unsubscribe().catch(() => {});
    }
    this.set('off', note);
  }

  async setMode() {
    const mode = this.mode.value;
    const was = this.mode.dataset.mode;
    this.modeError.hidden = true;
    this.mode.disabled = true;
    try {
      const r = await this.client.request('tandem/setNotify', { channel: this.session, mode });
      this.mode.value = r.mode;
    } catch (e) {
      this.mode.value = was;
      setText(this.modeError, `Not changed: ${e.message}`);
      this.modeError.hidden = false;
    } finally {
      this.mode.disabled = false;
      this.mode.dataset.mode = this.mode.value;
    }
  }

  set(state, detail = '') {
    if (this.disposed) return;
    this.state = state;
    this.detail = detail;
    this.show();
  }

  show() {
    const [title, text, action] = DEVICE[this.state];
    this.deviceEl.dataset.notifyState = this.state;
    this.button.dataset.notifyState = this.state;
    setText(this.titleEl, title);
    let more = this.detail || text;
    if (this.state === 'on' && this.devices > 1) more += ` ${this.devices} browsers of yours are on.`;
    setText(this.textEl, more);
    this.textEl.hidden = !more;
    this.actionBtn.hidden = !action;
    if (action) setText(this.actionBtn, action);
  }

  dispose() {
    this.disposed = true;
    this.close();
    this.client.removeEventListener('reconnected', this.onReconnected);
  }
}

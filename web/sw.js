// Tandem's service worker: the browser side of Web Push (docs/protocol.md,
// "Notifications"). Served at `/sw.js`, so its scope is the whole origin.
//
// - `push` with `{type: "opened", tag, title, body, url}`: show it, one
//   notification per request (`tag` is `<chat>#<id>`).
// - `push` with `{type: "settled", tag}`: the request ended (answered here,
//   elsewhere, or by the agent): its notification goes.
// - A click on a notification brings a Tandem window of this origin to the
//   request's chat, or opens one.

self.addEventListener('install', () => self.skipWaiting());
self.addEventListener('activate', (event) => event.waitUntil(self.clients.claim()));

self.addEventListener('push', (event) => {
  let msg;
  try {
    msg = event.data?.json();
  } catch {
    return; // Not ours to read.
  }
  if (!msg || typeof msg.tag !== 'string') return;
  if (msg.type === 'opened') {
    event.waitUntil(self.registration.showNotification(msg.title || 'The agent needs you', {
      body: msg.body ?? '',
      tag: msg.tag,
      data: { url: msg.url },
      icon: '/favicon.svg',
      // One request, one notification: shown once, gone when it settles.
      renotify: false,
      requireInteraction: false,
    }));
  } else if (msg.type === 'settled') {
    event.waitUntil(self.registration.getNotifications({ tag: msg.tag })
      .then((shown) => { for (const n of shown) n.close(); }));
  }
});

self.addEventListener('notificationclick', (event) => {
  event.notification.close();
  const url = event.notification.data?.url;
  event.waitUntil(openChat(url));
});

/**
 * Show the chat `url` names. A window of this origin keeps its own address
 * (a token or an invite in its query) and only moves to the link's `#/…`;
 * a link to elsewhere, or no window, opens the link.
 */
async function openChat(url) {
  const target = new URL(url || '/', self.registration.scope);
  const windows = await self.clients.matchAll({ type: 'window', includeUncontrolled: true });
  const ours = windows.filter((w) => new URL(w.url).origin === self.location.origin);
  if (target.origin !== self.location.origin || ours.length === 0) {
    return self.clients.openWindow(target.href);
  }
  const shown = ours.find((w) => new URL(w.url).hash === target.hash)
    ?? ours.find((w) => w.focused)
    ?? ours[0];
  const there = new URL(shown.url);
  there.hash = target.hash;
  const focused = await shown.focus();
  if (there.href === shown.url) return focused;
  try {
    return await focused.navigate(there.href);
  } catch {
    // Not controlled by this worker (opened before it was installed).
    focused.postMessage({ type: 'tandem/open', hash: target.hash });
    return focused;
  }
}

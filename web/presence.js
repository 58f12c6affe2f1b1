// Presence that says whether the person is looking (docs/protocol.md,
// "Presence" and "Notifications"): every `tandem/setPresence` this page
// sends carries `focused` — the page is shown and has the focus — and the
// last one for each chat is sent again, as it was, when that changes
// (`visibilitychange`, window `focus` and `blur`). The server tells a
// person of a request only when no page of theirs on the chat is looking,
// so a hidden tab or a window behind another must say so.

/** Whether the person can see this page now. */
export function looking() {
  return document.visibilityState === 'visible' && document.hasFocus();
}

// client -> (chat -> {params, focused}): what was last said on each chat.
const said = new Map();

/**
 * Send `tandem/setPresence` with `params` (`channel`, `state`, and a
 * shared field's `target`, `caret`, `rev`) and `focused`; remembered so a
 * change of focus sends it again. Resolves like the request.
 */
export function sendPresence(client, params) {
  listen();
  const focused = looking();
  let chats = said.get(client);
  if (!chats) said.set(client, (chats = new Map()));
  chats.set(params.channel, { params, focused });
  return client.request('tandem/setPresence', { ...params, focused });
}

/** The page left `chat`: a change of focus says nothing more about it. */
export function forgetPresence(client, chat) {
  said.get(client)?.delete(chat);
}

/** Say again, with the focus as it is now, what changed since it was said. */
function refocus() {
  const focused = looking();
  for (const [client, chats] of said) {
    for (const [chat, entry] of chats) {
      // A field that said it was left after its chat was: nothing to say.
      if (!client.channels.has(chat)) {
        chats.delete(chat);
        continue;
      }
      if (entry.focused === focused) continue;
      entry.focused = focused;
      client.request('tandem/setPresence', { ...entry.params, focused }).catch(() => {});
    }
  }
}

let listening = false;

function listen() {
  if (listening) return;
  listening = true;
  // After the event, once `document.hasFocus()` reads the new focus.
  const later = () => setTimeout(refocus, 0);
  document.addEventListener('visibilitychange', later);
  // Only the window's own focus and blur, not those of its fields.
  window.addEventListener('focus', (e) => { if (e.target === window) later(); });
  window.addEventListener('blur', (e) => { if (e.target === window) later(); });
}

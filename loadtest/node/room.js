// The Node.js peer of `loadtest fanout`: what a team would write instead of
// Tandem — a room broadcast on `ws` (with `bufferutil`). It answers the same
// AHP frames as the tokio baseline (loadtest/src/baseline.rs): one
// server-wide serverSeq, each `action` envelope serialized once and sent to
// every socket of the room; no validation, no reducer, no journal, no replay.
//
// Usage: node room.js [PORT]   (or PORT=…; default 7422). Stops on SIGINT/SIGTERM.
'use strict';

const { WebSocketServer } = require('ws');

const port = Number(process.argv[2] || process.env.PORT || 7422);
const host = '127.0.0.1';

/** Channel → Set of sockets. */
const rooms = new Map();
let serverSeq = 0;

function reply(ws, id, result) {
  ws.send(JSON.stringify({ jsonrpc: '2.0', id, result }));
}

function join(ws, channel) {
  let room = rooms.get(channel);
  if (!room) rooms.set(channel, (room = new Set()));
  room.add(ws);
  ws.channels.add(channel);
}

function leave(ws, channel) {
  const room = rooms.get(channel);
  if (room) {
    room.delete(ws);
    if (room.size === 0) rooms.delete(channel);
  }
  ws.channels.delete(channel);
}

function publish(ws, channel, action, clientSeq) {
  serverSeq += 1;
  const str = JSON.stringify({
    jsonrpc: '2.0',
    method: 'action',
    params: { channel, action, serverSeq, origin: { clientId: ws.clientId, clientSeq } },
  });
  const room = rooms.get(channel);
  if (room) for (const s of room) s.send(str);
  // The sender sees its own action, as on Tandem.
  if (!room || !room.has(ws)) ws.send(str);
}

function handle(ws, text) {
  let req;
  try {
    req = JSON.parse(text);
  } catch {
    ws.send('{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse error"}}');
    return;
  }
  const id = req.id === undefined ? null : req.id;
  const p = req.params || {};
  const channel = p.channel || '';
  switch (req.method) {
    case 'initialize':
      ws.clientId = p.clientId || 'anonymous';
      reply(ws, id, {
        protocolVersion: '1.0.0',
        serverSeq,
        serverInfo: { name: 'tandem-node-room' },
        snapshots: [],
      });
      break;
    case 'reconnect':
      ws.clientId = p.clientId || 'anonymous';
      for (const ch of p.subscriptions || []) join(ws, ch);
      reply(ws, id, { type: 'snapshot', snapshots: [] });
      break;
    case 'subscribe': {
      // A session's snapshot names a default chat; a chat's is empty.
      const state = channel.startsWith('ahp-session:/')
        ? { defaultChat: `ahp-chat:/${channel.slice('ahp-session:/'.length)}-default` }
        : {};
      join(ws, channel);
      reply(ws, id, { snapshot: { resource: channel, state, fromSeq: serverSeq } });
      break;
    }
    case 'unsubscribe':
      leave(ws, channel);
      reply(ws, id, null);
      break;
    case 'dispatchAction':
      reply(ws, id, null);
      publish(ws, channel, p.action === undefined ? null : p.action, p.clientSeq || 0);
      break;
    default:
      // ping, createSession, and everything else: accepted as is.
      if (req.id !== undefined) reply(ws, id, null);
  }
}

const wss = new WebSocketServer({ host, port, perMessageDeflate: false });

wss.on('connection', (ws) => {
  ws.clientId = 'anonymous';
  ws.channels = new Set();
  ws.on('message', (data, isBinary) => {
    if (!isBinary) handle(ws, data.toString());
  });
  ws.on('close', () => {
    for (const ch of [...ws.channels]) leave(ws, ch);
  });
  ws.on('error', () => ws.terminate());
});

wss.on('listening', () => {
  const a = wss.address();
  console.error(`tandem-node-room listening on ws://${a.address}:${a.port}/ahp`);
});

for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => process.exit(0));

// A JavaScript port of the official AHP 1.0 reducers (crate `ahp` 1.0,
// src/reducers.rs) for the scopes this client holds: root, session and chat.
// The server reduces with the same rules, so a client that applies the same
// envelopes in `serverSeq` order converges on the server's state. Reducers
// mutate in place and return one of APPLIED / NOOP / OUT_OF_SCOPE.

export const APPLIED = 'applied';
export const NOOP = 'noop';
export const OUT_OF_SCOPE = 'out-of-scope';

// SessionStatus bits (ahp-types state.rs).
export const Status = Object.freeze({
  Idle: 1,
  Error: 2,
  InProgress: 8,
  InputNeeded: 24,
  IsRead: 32,
  IsArchived: 64,
});
const ACTIVITY_MASK = (1 << 5) - 1;

/** The activity of a status bitset: 'input-needed' | 'in-progress' | 'error' | 'idle'. */
export function activityOf(status) {
  const a = (status ?? 0) & ACTIVITY_MASK;
  if ((a & Status.InputNeeded) === Status.InputNeeded) return 'input-needed';
  if (a & Status.InProgress) return 'in-progress';
  if (a & Status.Error) return 'error';
  return 'idle';
}

function withFlag(status, flag, set) {
  return set ? status | flag : status & ~flag;
}

// ─── Chat ────────────────────────────────────────────────────────────────

export function toolCallIdOf(tc) {
  return tc && typeof tc.toolCallId === 'string' ? tc.toolCallId : '';
}

const KNOWN_TOOL_STATUSES = new Set([
  'streaming', 'pending-confirmation', 'running', 'auth-required',
  'pending-result-confirmation', 'completed', 'cancelled',
]);

function hasOpenInputRequest(state) {
  const t = state.activeTurn;
  return !!t && t.responseParts.some((p) => p.kind === 'inputRequest' && p.response == null);
}

function hasBlockingToolCall(state) {
  const t = state.activeTurn;
  return !!t && t.responseParts.some((p) => p.kind === 'toolCall'
    && ['pending-confirmation', 'pending-result-confirmation', 'auth-required'].includes(p.toolCall?.status));
}

function summaryStatus(state, terminal) {
  let activity;
  if (terminal != null) activity = terminal;
  else if (hasOpenInputRequest(state) || hasBlockingToolCall(state)) activity = Status.InputNeeded;
  else if (state.activeTurn) activity = Status.InProgress;
  else activity = Status.Idle;
  return (state.status & ~ACTIVITY_MASK) | activity;
}

function refreshStatus(state) {
  state.status = summaryStatus(state, undefined);
}

function addMillis(timestamp, duration) {
  const start = Date.parse(timestamp);
  if (Number.isNaN(start)) return null;
  const end = new Date(start + duration);
  return Number.isNaN(end.getTime()) ? null : end.toISOString();
}

// The fields every tool call state shares (reducers.rs `tool_call_meta`).
function base(tc) {
  const b = {
    toolCallId: tc.toolCallId,
    toolName: tc.toolName,
    displayName: tc.displayName,
  };
  for (const k of ['intention', 'contributor', '_meta']) if (tc[k] !== undefined) b[k] = tc[k];
  if (tc.status !== 'streaming' && tc.toolInput !== undefined) b.toolInput = tc.toolInput;
  return b;
}

function clean(obj) {
  for (const k of Object.keys(obj)) if (obj[k] === undefined || obj[k] === null) delete obj[k];
  return obj;
}

function endTurn(state, turnId, duration, turnState, terminal, errorPart) {
  const active = state.activeTurn;
  if (!active || active.id !== turnId) return NOOP;
  duration = Math.max(0, duration ?? 0);
  const modifiedAt = addMillis(active.startedAt, duration);
  if (modifiedAt == null) return NOOP; // Invalid: state untouched.
  delete state.activeTurn;
  const parts = active.responseParts.map((part) => {
    if (part.kind !== 'toolCall') return part;
    const tc = part.toolCall;
    if (!KNOWN_TOOL_STATUSES.has(tc?.status)) {
      // Unknown variant: reducers.rs turns it into an empty cancelled call.
      return {
        kind: 'toolCall',
        toolCall: {
          status: 'cancelled', toolCallId: '', toolName: '', displayName: '',
          invocationMessage: '', reason: 'skipped',
        },
      };
    }
    if (tc.status === 'completed' || tc.status === 'cancelled') return part;
    const cancelled = clean({
      status: 'cancelled',
      ...base(tc),
      invocationMessage: tc.invocationMessage ?? '',
      reason: 'skipped',
    });
    return { kind: 'toolCall', toolCall: cancelled };
  });
  if (errorPart) parts.push(errorPart);
  const turn = clean({
    id: active.id,
    startedAt: active.startedAt,
    duration,
    message: active.message,
    responseParts: parts,
    usage: active.usage,
    state: turnState,
  });
  state.turns.push(turn);
  state.modifiedAt = modifiedAt;
  state.status = summaryStatus(state, terminal);
  return APPLIED;
}

function findOpenInput(state, requestId) {
  const t = state.activeTurn;
  if (!t) return null;
  return t.responseParts.find((p) => p.kind === 'inputRequest' && p.response == null && p.request.id === requestId) ?? null;
}

function upsertInputRequest(state, request) {
  const t = state.activeTurn;
  if (!t) return NOOP;
  const existing = findOpenInput(state, request.id);
  if (existing) {
    const answers = request.answers ?? existing.request.answers;
    const next = { ...request };
    if (answers !== undefined) next.answers = answers; else delete next.answers;
    existing.request = next;
    delete existing.response;
  } else {
    t.responseParts.push({ kind: 'inputRequest', request });
  }
  state.status = summaryStatus(state, undefined);
  state.status = withFlag(state.status, Status.IsRead, false);
  return APPLIED;
}

function updateToolCall(state, turnId, toolCallId, updater) {
  const t = state.activeTurn;
  if (!t || t.id !== turnId) return NOOP;
  for (const part of t.responseParts) {
    if (part.kind === 'toolCall' && toolCallIdOf(part.toolCall) === toolCallId) {
      part.toolCall = updater(part.toolCall);
      return APPLIED;
    }
  }
  return NOOP;
}

function partId(part) {
  if (part.kind === 'toolCall') return toolCallIdOf(part.toolCall);
  if (part.kind === 'markdown' || part.kind === 'reasoning') return part.id;
  return null;
}

function updateResponsePart(state, turnId, id, updater) {
  const t = state.activeTurn;
  if (!t || t.id !== turnId) return NOOP;
  for (const part of t.responseParts) {
    if (partId(part) === id) {
      updater(part);
      return APPLIED;
    }
  }
  return NOOP;
}

function refineContributor(current, next) {
  if (next == null) return current;
  if (current?.kind === 'client') {
    if (next.kind === 'client' && next.clientId === current.clientId) return next;
    return current;
  }
  if (next.kind === 'client') return current;
  return next;
}

function toolCallReady(a) {
  return (tc) => {
    if (!['streaming', 'running', 'pending-confirmation'].includes(tc.status)) return tc;
    const b = base(tc);
    b.intention = a.intention ?? b.intention;
    b.toolInput = a.toolInput ?? b.toolInput;
    b.contributor = refineContributor(b.contributor, a.contributor);
    const meta = a._meta ?? b._meta;
    const pending = tc.status === 'pending-confirmation' ? tc : null;
    if (a.confirmed != null) {
      return clean({
        status: 'running', ...b, _meta: meta,
        invocationMessage: a.invocationMessage,
        confirmed: a.confirmed,
      });
    }
    return clean({
      status: 'pending-confirmation', ...b, _meta: meta,
      invocationMessage: a.invocationMessage,
      confirmationTitle: a.confirmationTitle ?? pending?.confirmationTitle,
      riskAssessment: a.riskAssessment ?? pending?.riskAssessment,
      edits: a.edits ?? pending?.edits,
      editable: a.editable ?? pending?.editable,
      options: a.options ?? pending?.options,
    });
  };
}

function toolCallConfirmed(a) {
  return (tc) => {
    if (tc.status !== 'pending-confirmation') return tc;
    const selectedOption = a.selectedOptionId != null
      ? (tc.options ?? []).find((o) => o.id === a.selectedOptionId)
      : undefined;
    const common = {
      toolCallId: tc.toolCallId,
      toolName: tc.toolName,
      displayName: tc.displayName,
      intention: tc.intention,
      contributor: tc.contributor,
      _meta: a._meta ?? tc._meta,
      invocationMessage: tc.invocationMessage,
    };
    if (a.approved) {
      let toolInput = tc.toolInput;
      if (a.editedToolInput != null && typeof tc.toolInput === 'string') toolInput = a.editedToolInput;
      return clean({
        status: 'running', ...common, toolInput,
        confirmed: a.confirmed ?? 'not-needed',
        selectedOption,
      });
    }
    return clean({
      status: 'cancelled', ...common, toolInput: tc.toolInput,
      reason: a.reason ?? 'denied',
      reasonMessage: a.reasonMessage,
      userSuggestion: a.userSuggestion,
      selectedOption,
    });
  };
}

function toolCallComplete(a) {
  return (tc) => {
    const b = base(tc);
    const meta = a._meta ?? b._meta;
    let confirmed; let selectedOption; let preAuthContent; let fromAuth = false;
    if (tc.status === 'running') {
      confirmed = tc.confirmed; selectedOption = tc.selectedOption;
    } else if (tc.status === 'pending-confirmation') {
      confirmed = 'not-needed';
    } else if (tc.status === 'auth-required') {
      if (a.result.success) return tc;
      confirmed = tc.confirmed; selectedOption = tc.selectedOption; preAuthContent = tc.content; fromAuth = true;
    } else {
      return tc;
    }
    const out = {
      ...b,
      _meta: meta,
      invocationMessage: tc.invocationMessage,
      toolInput: tc.toolInput,
      success: a.result.success,
      pastTenseMessage: a.result.pastTenseMessage,
      content: a.result.content ?? preAuthContent,
      structuredContent: a.result.structuredContent,
      error: a.result.error,
      confirmed,
      selectedOption,
    };
    const status = a.requiresResultConfirmation && !fromAuth ? 'pending-result-confirmation' : 'completed';
    return clean({ status, ...out });
  };
}

function toolCallResultConfirmed(a) {
  return (tc) => {
    if (tc.status !== 'pending-result-confirmation') return tc;
    const { status: _s, success, pastTenseMessage, content, structuredContent, error, confirmed, ...rest } = tc;
    if (a.approved) {
      return clean({
        ...rest, status: 'completed', _meta: a._meta ?? tc._meta,
        success, pastTenseMessage, content, structuredContent, error, confirmed,
      });
    }
    return clean({
      toolCallId: tc.toolCallId, toolName: tc.toolName, displayName: tc.displayName,
      intention: tc.intention, toolInput: tc.toolInput, contributor: tc.contributor,
      _meta: a._meta ?? tc._meta, invocationMessage: tc.invocationMessage,
      status: 'cancelled', reason: 'result-denied', selectedOption: tc.selectedOption,
    });
  };
}

/** Apply one action to a ChatState in place (reducers.rs `apply_action_to_chat`). */
export function applyToChat(state, action) {
  const a = action;
  switch (a.type) {
    case 'chat/turnStarted': {
      state.activeTurn = { id: a.turnId, startedAt: a.startedAt, message: a.message, responseParts: [] };
      state.status = summaryStatus(state, undefined);
      state.modifiedAt = a.startedAt;
      state.status = withFlag(state.status, Status.IsRead, false);
      if (a.queuedMessageId != null) {
        if (state.steeringMessage?.id === a.queuedMessageId) delete state.steeringMessage;
        if (state.queuedMessages) {
          state.queuedMessages = state.queuedMessages.filter((m) => m.id !== a.queuedMessageId);
          if (!state.queuedMessages.length) delete state.queuedMessages;
        }
      }
      return APPLIED;
    }
    case 'chat/delta':
      return updateResponsePart(state, a.turnId, a.partId, (p) => {
        if (p.kind === 'markdown') p.content += a.content;
      });
    case 'chat/reasoning':
      return updateResponsePart(state, a.turnId, a.partId, (p) => {
        if (p.kind === 'reasoning') p.content += a.content;
      });
    case 'chat/responsePart': {
      const t = state.activeTurn;
      if (!t || t.id !== a.turnId) return NOOP;
      if (a.part?.kind === 'error') return NOOP;
      t.responseParts.push(a.part);
      return APPLIED;
    }
    case 'chat/turnComplete':
      return endTurn(state, a.turnId, a.duration, 'complete');
    case 'chat/turnCancelled':
      return endTurn(state, a.turnId, a.duration, 'cancelled');
    case 'chat/error':
      return endTurn(state, a.turnId, a.duration, 'error', Status.Error, { kind: 'error', ...a.part });
    case 'chat/turnResume': {
      if (state.activeTurn) return NOOP;
      const last = state.turns[state.turns.length - 1];
      if (!last || last.id !== a.turnId || last.state !== 'error') return NOOP;
      const err = last.responseParts[last.responseParts.length - 1];
      if (err?.kind !== 'error' || err.resumable !== true) return NOOP;
      state.turns.pop();
      state.activeTurn = clean({
        id: last.id, startedAt: last.startedAt ?? state.modifiedAt, message: last.message,
        responseParts: last.responseParts, usage: last.usage,
      });
      refreshStatus(state);
      state.status = withFlag(state.status, Status.IsRead, false);
      return APPLIED;
    }
    case 'chat/activityChanged':
      if (a.activity == null) delete state.activity; else state.activity = a.activity;
      return APPLIED;
    case 'chat/toolCallStart': {
      const t = state.activeTurn;
      if (!t || t.id !== a.turnId) return NOOP;
      t.responseParts.push({
        kind: 'toolCall',
        toolCall: clean({
          status: 'streaming', toolCallId: a.toolCallId, toolName: a.toolName,
          displayName: a.displayName, intention: a.intention, contributor: a.contributor, _meta: a._meta,
        }),
      });
      return APPLIED;
    }
    case 'chat/toolCallDelta':
      return updateToolCall(state, a.turnId, a.toolCallId, (tc) => {
        if (tc.status !== 'streaming') return tc;
        const next = { ...tc };
        if (a.content != null) next.partialInput = (tc.partialInput ?? '') + a.content;
        if (a._meta != null) next._meta = a._meta;
        if (a.invocationMessage != null) next.invocationMessage = a.invocationMessage;
        return next;
      });
    case 'chat/toolCallReady':
    case 'chat/toolCallConfirmed':
    case 'chat/toolCallComplete':
    case 'chat/toolCallResultConfirmed': {
      const updater = {
        'chat/toolCallReady': toolCallReady,
        'chat/toolCallConfirmed': toolCallConfirmed,
        'chat/toolCallComplete': toolCallComplete,
        'chat/toolCallResultConfirmed': toolCallResultConfirmed,
      }[a.type](a);
      const res = updateToolCall(state, a.turnId, a.toolCallId, updater);
      if (res === APPLIED) refreshStatus(state);
      return res;
    }
    case 'chat/toolCallContentChanged':
      return updateToolCall(state, a.turnId, a.toolCallId, (tc) => {
        if (tc.status !== 'running') return tc;
        const next = { ...tc, content: a.content };
        if (a._meta != null) next._meta = a._meta;
        return next;
      });
    case 'chat/usage': {
      const t = state.activeTurn;
      if (!t || t.id !== a.turnId) return NOOP;
      t.usage = a.usage;
      return APPLIED;
    }
    case 'chat/truncated': {
      if (a.turnId == null) {
        state.turns = [];
        delete state.turnsNextCursor;
      } else {
        const idx = state.turns.findIndex((t) => t.id === a.turnId);
        if (idx < 0) return NOOP;
        state.turns.length = idx + 1;
      }
      delete state.activeTurn;
      state.status = summaryStatus(state, undefined);
      return APPLIED;
    }
    case 'chat/turnsLoaded': {
      const have = new Set(state.turns.map((t) => t.id));
      state.turns = a.turns.filter((t) => !have.has(t.id)).concat(state.turns);
      if (a.turnsNextCursor == null) delete state.turnsNextCursor; else state.turnsNextCursor = a.turnsNextCursor;
      return APPLIED;
    }
    case 'chat/inputRequested':
      return upsertInputRequest(state, structuredClone(a.request));
    case 'chat/inputAnswerChanged': {
      const part = findOpenInput(state, a.requestId);
      if (!part) return NOOP;
      const answers = part.request.answers ?? {};
      if (a.answer == null) delete answers[a.questionId];
      else answers[a.questionId] = a.answer;
      if (Object.keys(answers).length) part.request.answers = answers; else delete part.request.answers;
      return APPLIED;
    }
    case 'chat/inputCompleted': {
      const part = findOpenInput(state, a.requestId);
      if (!part) return NOOP;
      const finalAnswers = { ...(part.request.answers ?? {}), ...(a.answers ?? {}) };
      if (Object.keys(finalAnswers).length) part.request.answers = finalAnswers; else delete part.request.answers;
      part.response = a.response;
      refreshStatus(state);
      return APPLIED;
    }
    case 'chat/pendingMessageSet': {
      const entry = { id: a.id, message: a.message };
      if (a.kind === 'steering') state.steeringMessage = entry;
      else {
        const list = state.queuedMessages ?? (state.queuedMessages = []);
        const i = list.findIndex((m) => m.id === entry.id);
        if (i >= 0) list[i] = entry; else list.push(entry);
      }
      return APPLIED;
    }
    case 'chat/pendingMessageRemoved': {
      if (a.kind === 'steering') {
        if (state.steeringMessage?.id !== a.id) return NOOP;
        delete state.steeringMessage;
        return APPLIED;
      }
      const list = state.queuedMessages;
      if (!list) return NOOP;
      const next = list.filter((m) => m.id !== a.id);
      if (next.length === list.length) return NOOP;
      if (next.length) state.queuedMessages = next; else delete state.queuedMessages;
      return APPLIED;
    }
    case 'chat/queuedMessagesReordered': {
      const list = state.queuedMessages;
      if (!list) return NOOP;
      const byId = new Map(list.map((m) => [m.id, m]));
      const out = [];
      for (const id of a.order) {
        if (byId.has(id)) { out.push(byId.get(id)); byId.delete(id); }
      }
      out.push(...[...byId.values()].sort((x, y) => (x.id < y.id ? -1 : x.id > y.id ? 1 : 0)));
      state.queuedMessages = out;
      return APPLIED;
    }
    case 'chat/draftChanged':
      if (a.draft == null) delete state.draft; else state.draft = a.draft;
      return APPLIED;
    case 'chat/isReadChanged':
      state.status = withFlag(state.status, Status.IsRead, a.isRead);
      return APPLIED;
    case 'chat/isArchivedChanged':
      state.status = withFlag(state.status, Status.IsArchived, a.isArchived);
      return APPLIED;
    case 'chat/movableChanged':
      state.movable = a.movable;
      return APPLIED;
    case 'chat/backgroundWorkSet':
    case 'chat/backgroundWorkRemoved':
    case 'chat/changesetsChanged':
    case 'chat/canvasesChanged':
    case 'chat/workingDirectorySet':
    case 'chat/workingDirectoryRemoved':
    case 'chat/toolCallAuthRequired':
    case 'chat/toolCallAuthResolved':
      // Not rendered by this client; they never change what it shows.
      return NOOP;
    default:
      return OUT_OF_SCOPE;
  }
}

// ─── Session ─────────────────────────────────────────────────────────────

function inputNeededStatus(status, list) {
  if ((list ?? []).some((r) => r.kind !== 'toolClientExecution')) {
    return (status & ~ACTIVITY_MASK) | Status.InputNeeded;
  }
  return status & ~(Status.InputNeeded & ~Status.InProgress);
}

/** Apply one action to a SessionState in place (the parts this client shows). */
export function applyToSession(state, a) {
  switch (a.type) {
    case 'session/ready':
      state.lifecycle = 'ready';
      return APPLIED;
    case 'session/creationFailed':
      state.lifecycle = 'failed';
      state.creationError = a.error;
      return APPLIED;
    case 'session/chatAdded': {
      const i = state.chats.findIndex((c) => c.resource === a.summary.resource);
      if (i >= 0) state.chats[i] = a.summary; else state.chats.push(a.summary);
      return APPLIED;
    }
    case 'session/chatRemoved': {
      const i = state.chats.findIndex((c) => c.resource === a.chat);
      if (i < 0) return NOOP;
      state.chats.splice(i, 1);
      if (state.defaultChat === a.chat) delete state.defaultChat;
      return APPLIED;
    }
    case 'session/chatUpdated': {
      const chat = state.chats.find((c) => c.resource === a.chat);
      if (!chat) return NOOP;
      for (const k of ['title', 'status', 'activity', 'modifiedAt', 'changes', 'origin', 'workingDirectories']) {
        if (a.changes?.[k] != null) chat[k] = a.changes[k];
      }
      return APPLIED;
    }
    case 'session/defaultChatChanged':
      if (a.defaultChat == null) delete state.defaultChat; else state.defaultChat = a.defaultChat;
      return APPLIED;
    case 'session/titleChanged':
      state.title = a.title;
      return APPLIED;
    case 'session/isReadChanged':
      state.status = withFlag(state.status, Status.IsRead, a.isRead);
      return APPLIED;
    case 'session/isArchivedChanged':
      state.status = withFlag(state.status, Status.IsArchived, a.isArchived);
      return APPLIED;
    case 'session/activityChanged':
      if (a.activity == null) delete state.activity; else state.activity = a.activity;
      return APPLIED;
    case 'session/configChanged': {
      if (!state.config) return NOOP;
      state.config.values = a.replace ? { ...a.config } : { ...state.config.values, ...a.config };
      return APPLIED;
    }
    case 'session/metaChanged':
      if (a._meta == null) delete state._meta; else state._meta = a._meta;
      return APPLIED;
    case 'session/activeClientSet': {
      const list = state.activeClients ?? (state.activeClients = []);
      const i = list.findIndex((c) => c.clientId === a.activeClient.clientId);
      if (i >= 0) list[i] = a.activeClient; else list.push(a.activeClient);
      return APPLIED;
    }
    case 'session/activeClientRemoved': {
      const list = state.activeClients ?? [];
      const i = list.findIndex((c) => c.clientId === a.clientId);
      if (i < 0) return NOOP;
      list.splice(i, 1);
      return APPLIED;
    }
    case 'session/inputNeededSet': {
      const id = a.request?.id;
      if (id == null) return NOOP;
      const list = state.inputNeeded ?? (state.inputNeeded = []);
      const i = list.findIndex((r) => r.id === id);
      if (i >= 0) list[i] = a.request; else list.push(a.request);
      state.status = inputNeededStatus(state.status, state.inputNeeded);
      return APPLIED;
    }
    case 'session/inputNeededRemoved': {
      const list = state.inputNeeded;
      if (!list) return NOOP;
      const i = list.findIndex((r) => r.id === a.id);
      if (i < 0) return NOOP;
      list.splice(i, 1);
      if (!list.length) delete state.inputNeeded;
      state.status = inputNeededStatus(state.status, state.inputNeeded);
      return APPLIED;
    }
    default:
      return a.type?.startsWith('session/') ? NOOP : OUT_OF_SCOPE;
  }
}

// ─── Root ────────────────────────────────────────────────────────────────

export function applyToRoot(state, a) {
  switch (a.type) {
    case 'root/agentsChanged':
      state.agents = a.agents;
      return APPLIED;
    case 'root/activeSessionsChanged':
      state.activeSessions = a.activeSessions;
      return APPLIED;
    case 'root/terminalsChanged':
      state.terminals = a.terminals;
      return APPLIED;
    case 'root/configChanged':
      if (!state.config) return NOOP;
      state.config.values = a.replace ? { ...a.config } : { ...state.config.values, ...a.config };
      return APPLIED;
    default:
      return OUT_OF_SCOPE;
  }
}

/** Apply to whichever scope `uri` names. */
export function applyToChannel(uri, state, action) {
  if (uri.startsWith('ahp-chat:')) return applyToChat(state, action);
  if (uri.startsWith('ahp-session:')) return applyToSession(state, action);
  if (uri.startsWith('ahp-root:')) return applyToRoot(state, action);
  return OUT_OF_SCOPE;
}

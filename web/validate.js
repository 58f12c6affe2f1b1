// Client-side mirror of the server's input rules (src/channels/validate.rs,
// docs/protocol.md "Validation"), so a person sees why an answer would be refused
// before it is sent. Each check returns null (fine) or a message. The rules are
// the server's; the wording is for people.

const VALUE_KIND = {
  text: 'text',
  number: 'number',
  integer: 'number',
  boolean: 'boolean',
  'single-select': 'selected',
  'multi-select': 'selected-many',
};

/** The answer value kind a question takes. */
export function valueKindFor(question) {
  return VALUE_KIND[question.kind];
}

function plural(n, one, many) {
  return `${n} ${n === 1 ? one : many}`;
}

/** Length in Unicode scalar values, as Rust's `chars().count()`. */
export function charCount(s) {
  return [...s].length;
}

/**
 * Check one answer against its question, as `check_answer` does: bounds apply
 * to submitted answers only (a draft may pass through invalid states while a
 * person types); kinds, option ids and whole numbers apply to drafts too.
 */
export function checkAnswer(q, answer) {
  if (!answer || answer.state === 'skipped') return null;
  const submitted = answer.state === 'submitted';
  const v = answer.value;
  if (!v) return 'An answer needs a value.';
  if (!VALUE_KIND[q.kind]) return 'This question has a kind this client does not know.';
  if (v.kind !== VALUE_KIND[q.kind]) return `A ${v.kind} answer does not fit a ${q.kind} question.`;
  switch (q.kind) {
    case 'text': {
      const len = charCount(v.value);
      if (submitted && q.min != null && len < q.min) {
        return `At least ${plural(q.min, 'character', 'characters')} required (${len} now).`;
      }
      if (submitted && q.max != null && len > q.max) {
        return `At most ${plural(q.max, 'character', 'characters')} allowed (${len} now).`;
      }
      return null;
    }
    case 'number':
    case 'integer': {
      if (typeof v.value !== 'number' || !Number.isFinite(v.value)) return 'Enter a number.';
      if (q.kind === 'integer' && !Number.isInteger(v.value)) return `Enter a whole number; ${v.value} is not one.`;
      if (submitted && q.min != null && v.value < q.min) return `The minimum is ${q.min}.`;
      if (submitted && q.max != null && v.value > q.max) return `The maximum is ${q.max}.`;
      return null;
    }
    case 'boolean':
      return null;
    case 'single-select': {
      const freeform = !!q.allowFreeformInput;
      const known = q.options.some((o) => o.id === v.value);
      const extra = (v.freeformValues ?? []).length;
      if (!known && !freeform) return `“${v.value}” is not one of the options.`;
      if (extra > 0 && !freeform) return 'This question does not take free-form input.';
      if (submitted && !known && extra === 0) return 'Choose an option or type an answer.';
      return null;
    }
    case 'multi-select': {
      const freeform = !!q.allowFreeformInput;
      const bad = v.value.find((id) => !q.options.some((o) => o.id === id));
      if (bad !== undefined) return `“${bad}” is not one of the options.`;
      const seen = new Set();
      const dup = v.value.find((id) => (seen.has(id) ? true : (seen.add(id), false)));
      if (dup !== undefined) return `“${dup}” is selected twice.`;
      const extra = (v.freeformValues ?? []).length;
      if (extra > 0 && !freeform) return 'This question does not take free-form input.';
      if (submitted) {
        const count = v.value.length + extra;
        if (q.min != null && count < q.min) return `Pick at least ${q.min} (${count} now).`;
        if (q.max != null && count > q.max) return `Pick at most ${q.max} (${count} now).`;
      }
      return null;
    }
    default:
      return null;
  }
}

/**
 * What `chat/inputCompleted` with `response: accept` would be refused for,
 * per question: `answers` (the action's) overlaid on `current` (the request's
 * drafts). Returns a map questionId → message; empty when it would be accepted.
 */
export function checkAccept(request, answers, current = request.answers ?? {}) {
  const errors = {};
  const merged = { ...current, ...answers };
  for (const q of request.questions ?? []) {
    const a = merged[q.id];
    if (a?.state === 'submitted') {
      const e = checkAnswer(q, a);
      if (e) errors[q.id] = e;
    } else if (q.required && a?.state !== 'submitted') {
      errors[q.id] = a?.state === 'skipped' ? 'Required: this question cannot be skipped.' : 'Required.';
    }
  }
  for (const [qid, a] of Object.entries(answers)) {
    const q = (request.questions ?? []).find((x) => x.id === qid);
    if (!q) errors[qid] = 'Not a question of this request.';
    else if (!errors[qid]) {
      const e = checkAnswer(q, a);
      if (e) errors[qid] = e;
    }
  }
  return errors;
}

/** A soft, non-blocking hint for text formats the server does not enforce. */
export function formatHint(q, text) {
  if (q.kind !== 'text' || !q.format || !text) return null;
  switch (q.format) {
    case 'email':
      return /^[^\s@]+@[^\s@]+\.[^\s@]+$/.test(text) ? null : 'This does not look like an email address.';
    case 'uri':
      try { new URL(text); return null; } catch { return 'This does not look like a URL.'; }
    case 'date':
      return /^\d{4}-\d{2}-\d{2}$/.test(text) ? null : 'Expected a date like 2025-03-10.';
    case 'date-time':
      return Number.isNaN(Date.parse(text)) ? 'Expected a date and time.' : null;
    default:
      return null;
  }
}

/** A one-line description of a question's rules, shown under its title. */
export function ruleHint(q) {
  switch (q.kind) {
    case 'text': {
      const parts = [];
      if (q.min != null && q.max != null) parts.push(`${q.min}–${q.max} characters`);
      else if (q.min != null) parts.push(`at least ${plural(q.min, 'character', 'characters')}`);
      else if (q.max != null) parts.push(`up to ${plural(q.max, 'character', 'characters')}`);
      if (q.format) parts.push(q.format);
      return parts.join(' · ');
    }
    case 'number':
    case 'integer': {
      const parts = [q.kind === 'integer' ? 'whole number' : 'number'];
      if (q.min != null && q.max != null) parts.push(`${q.min}–${q.max}`);
      else if (q.min != null) parts.push(`≥ ${q.min}`);
      else if (q.max != null) parts.push(`≤ ${q.max}`);
      return parts.join(' · ');
    }
    case 'multi-select': {
      if (q.min != null && q.max != null) return q.min === q.max ? `pick ${q.min}` : `pick ${q.min}–${q.max}`;
      if (q.min != null) return `pick at least ${q.min}`;
      if (q.max != null) return `pick up to ${q.max}`;
      return 'pick any';
    }
    default:
      return '';
  }
}

/**
 * Whether an agent's `url` may become a link, by the server's rule
 * (src/interactions/link.rs): an absolute http(s) URL with a host and no user
 * name or password. A `javascript:` or `data:` link would run in this page,
 * which holds the session and its token. Returns `{ href, host }` for a link,
 * or `{ problem }` to show the URL as text with a warning.
 */
export function linkTarget(url) {
  let u;
  try {
    u = new URL(url);
  } catch {
    return { problem: 'not an absolute URL' };
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') return { problem: `the scheme ${u.protocol} is not allowed` };
  if (!u.host) return { problem: 'it has no host' };
  if (u.username || u.password) return { problem: 'it carries a user name or password' };
  return { href: u.href, host: u.host };
}

// A small, safe Markdown renderer for agent output: everything is escaped
// first, then a subset is turned into HTML — fenced code, headings, lists,
// quotes, paragraphs, `code`, **bold**, *italic*, [links](https://…). A line
// that is a whole JSON object or array is shown as formatted code. Partial
// input (a stream cut mid-fence) renders sensibly.

const ESC = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };

export function escapeHtml(s) {
  return String(s).replace(/[&<>"']/g, (c) => ESC[c]);
}

function safeHref(url) {
  const u = url.trim();
  return /^(https?:|mailto:)/i.test(u) ? u : null;
}

/** Inline markup on one line of raw text. */
export function inline(text) {
  // Split out code spans first so their content is left alone.
  const out = [];
  const re = /`([^`]+)`/g;
  let last = 0;
  let m;
  while ((m = re.exec(text))) {
    out.push(emphasis(text.slice(last, m.index)));
    out.push(`<code>${escapeHtml(m[1])}</code>`);
    last = m.index + m[0].length;
  }
  out.push(emphasis(text.slice(last)));
  return out.join('');
}

function emphasis(raw) {
  // Links on the raw text (so the URL is checked before escaping).
  const parts = [];
  const re = /\[([^\]]+)\]\(([^)\s]+)\)/g;
  let last = 0;
  let m;
  while ((m = re.exec(raw))) {
    parts.push(styled(escapeHtml(raw.slice(last, m.index))));
    const href = safeHref(m[2]);
    parts.push(href
      ? `<a href="${escapeHtml(href)}" target="_blank" rel="noopener noreferrer">${styled(escapeHtml(m[1]))}</a>`
      : styled(escapeHtml(m[0])));
    last = m.index + m[0].length;
  }
  parts.push(styled(escapeHtml(raw.slice(last))));
  return parts.join('');
}

function styled(s) {
  return s
    .replace(/\*\*([^*]+)\*\*/g, '<strong>$1</strong>')
    .replace(/(^|[^*\w])\*([^*\s][^*]*?)\*(?!\w)/g, '$1<em>$2</em>')
    .replace(/(^|[^_\w])_([^_\s][^_]*?)_(?!\w)/g, '$1<em>$2</em>');
}

function jsonLine(line) {
  const t = line.trim();
  if (!((t.startsWith('{') && t.endsWith('}')) || (t.startsWith('[') && t.endsWith(']')))) return null;
  try {
    return JSON.stringify(JSON.parse(t), null, 2);
  } catch {
    return null;
  }
}

/** Markdown source → HTML string (safe to assign to innerHTML). */
export function renderMarkdown(src) {
  const lines = String(src ?? '').replace(/\r\n?/g, '\n').split('\n');
  const html = [];
  let para = [];
  let list = null; // {type: 'ul'|'ol', items: []}
  const flushPara = () => {
    if (para.length) html.push(`<p>${para.map(inline).join('<br>')}</p>`);
    para = [];
  };
  const flushList = () => {
    if (list) html.push(`<${list.type}>${list.items.map((i) => `<li>${inline(i)}</li>`).join('')}</${list.type}>`);
    list = null;
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = line.match(/^\s*```\s*([\w+-]*)\s*$/);
    if (fence) {
      flushPara();
      flushList();
      const body = [];
      i += 1;
      while (i < lines.length && !/^\s*```\s*$/.test(lines[i])) body.push(lines[i++]);
      const lang = fence[1] ? ` data-lang="${escapeHtml(fence[1])}"` : '';
      html.push(`<pre class="code"${lang}><code>${escapeHtml(body.join('\n'))}</code></pre>`);
      continue;
    }
    if (/^\s*$/.test(line)) {
      flushPara();
      flushList();
      continue;
    }
    const json = jsonLine(line);
    if (json) {
      flushPara();
      flushList();
      const pre = `<pre class="code json"><code>${escapeHtml(json)}</code></pre>`;
      const n = json.split('\n').length;
      // Long JSON (an agent's report, say) starts folded.
      html.push(n > 8 ? `<details class="json-block"><summary>JSON · ${n} lines</summary>${pre}</details>` : pre);
      continue;
    }
    const heading = line.match(/^(#{1,6})\s+(.*)$/);
    if (heading) {
      flushPara();
      flushList();
      const level = Math.min(heading[1].length + 2, 6); // Keep headings modest inside a chat.
      html.push(`<h${level}>${inline(heading[2])}</h${level}>`);
      continue;
    }
    const quote = line.match(/^>\s?(.*)$/);
    if (quote) {
      flushPara();
      flushList();
      html.push(`<blockquote>${inline(quote[1])}</blockquote>`);
      continue;
    }
    const ul = line.match(/^\s*[-*+]\s+(.*)$/);
    const ol = line.match(/^\s*\d+[.)]\s+(.*)$/);
    if (ul || ol) {
      flushPara();
      const type = ul ? 'ul' : 'ol';
      if (list && list.type !== type) flushList();
      if (!list) list = { type, items: [] };
      list.items.push((ul ?? ol)[1]);
      continue;
    }
    flushList();
    para.push(line);
  }
  flushPara();
  flushList();
  return html.join('');
}

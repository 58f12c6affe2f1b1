// A small DOM builder: h('div', {class: 'x', onclick: fn}, 'text', child).

export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  if (props) {
    for (const [k, v] of Object.entries(props)) {
      if (v == null || v === false) continue;
      if (k === 'class') el.className = v;
      else if (k === 'style' && typeof v === 'object') Object.assign(el.style, v);
      else if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
      else if (k === 'html') el.innerHTML = v;
      else if (k in el && typeof v !== 'string') el[k] = v;
      else el.setAttribute(k, v === true ? '' : String(v));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c == null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** Replace all children of `el`. */
export function setChildren(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** Set text only when it changed (keeps selection and avoids layout work). */
export function setText(el, text) {
  if (el.textContent !== text) el.textContent = text;
}

/** Reorder/insert `nodes` as the children of `parent`, touching only what moved. */
export function reconcile(parent, nodes) {
  let cursor = parent.firstChild;
  for (const n of nodes) {
    if (n === cursor) {
      cursor = cursor.nextSibling;
    } else {
      parent.insertBefore(n, cursor);
    }
  }
  while (cursor) {
    const next = cursor.nextSibling;
    cursor.remove();
    cursor = next;
  }
}

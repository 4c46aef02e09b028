// DOM building and formatting helpers shared by every page.
//
// Everything a task carries (inputs, outputs, errors, labels, ids, comments) reaches the
// page through h()/svg() as text nodes or attributes set with setAttribute: nothing here
// parses HTML, so markup in a value is shown, never run. The Content-Security-Policy
// forbids inline style and script anyway; h() refuses `style` and `on*` strings (handlers
// are functions) to keep it that way.

const SVG_NS = 'http://www.w3.org/2000/svg';

function build(el, attrs, children) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === 'style') {
      throw new Error('h(): no style attribute (the Content-Security-Policy refuses it)');
    }
    if (key.startsWith('on') && typeof value === 'function') {
      el.addEventListener(key.slice(2), value);
    } else if (key.startsWith('on')) {
      throw new Error(`h(): ${key} must be a function`);
    } else if (key === 'class' && Array.isArray(value)) {
      el.setAttribute('class', value.filter(Boolean).join(' '));
    } else if (value === true) {
      el.setAttribute(key, '');
    } else {
      el.setAttribute(key, String(value));
    }
  }
  append(el, children);
  return el;
}

/** Append children: strings and numbers become text nodes; arrays are flattened. */
export function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else if (child instanceof Node) el.appendChild(child);
    else el.appendChild(document.createTextNode(String(child)));
  }
  return el;
}

/** An HTML element: h('a', {href: '/ui/', class: 'x'}, 'text', otherNode). */
export function h(tag, attrs, ...children) {
  return build(document.createElement(tag), attrs, children);
}

/** An SVG element, same signature as h(). */
export function svg(tag, attrs, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

/** Replace the children of `el` with `children`. */
export function fill(el, ...children) {
  return append(clear(el), children);
}

/** A JSON value as indented text (undefined shows as "null"). */
export function prettyJson(value) {
  if (value === undefined) return 'null';
  // A string is shown as it is (a rendered email body reads better than its JSON).
  if (typeof value === 'string') return value;
  return JSON.stringify(value, null, 2);
}

/** A <pre> holding a JSON value as text. */
export function jsonBlock(value, attrs = {}) {
  return h('pre', {class: 'json', ...attrs}, prettyJson(value));
}

// ---------------------------------------------------------------------------- time

const pad = (n) => String(n).padStart(2, '0');

export function nowSeconds() {
  return Date.now() / 1000;
}

/** UNIX seconds as local "YYYY-MM-DD HH:MM:SS" ("—" for 0, the wire's "unset"). */
export function localTime(sec) {
  if (!sec) return '—';
  const d = new Date(sec * 1000);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

/** A duration in seconds, short: "0.25s", "42s", "3m 05s", "2h 10m", "3d 4h". */
export function duration(seconds) {
  const s = Math.max(0, seconds);
  if (s < 10) return `${s < 1 ? s.toFixed(2) : s.toFixed(1)}s`;
  if (s < 60) return `${Math.round(s)}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${pad(Math.floor(s % 60))}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${pad(Math.floor((s % 3600) / 60))}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

/** "3m 05s ago" or "in 2h 10m" relative to now. */
export function relative(sec, now = nowSeconds()) {
  if (!sec) return '';
  const delta = sec - now;
  if (Math.abs(delta) < 1) return 'now';
  return delta < 0 ? `${duration(-delta)} ago` : `in ${duration(delta)}`;
}

/** A <time> element: local time, the relative time beside it, UTC in its tooltip. */
export function timeEl(sec, attrs = {}) {
  if (!sec) return h('span', {class: 'muted'}, '—');
  const iso = new Date(sec * 1000).toISOString();
  return h('time', {datetime: iso, title: iso, ...attrs}, localTime(sec),
    h('span', {class: 'rel'}, ` (${relative(sec)})`));
}

// ---------------------------------------------------------------------------- chips

/** Node states and task statuses share one palette (classes s-<STATE> in app.css). */
export function badge(state, attrs = {}) {
  return h('span', {class: `badge s-${state}`, ...attrs}, state);
}

export function labelChips(labels) {
  const entries = Object.entries(labels || {}).sort(([a], [b]) => a.localeCompare(b));
  if (!entries.length) return h('span', {class: 'muted'}, '—');
  return h('span', {class: 'chips'},
    entries.map(([k, v]) => h('span', {class: 'chip', title: `${k}=${v}`}, `${k}=${v}`)));
}

/** Paths of the UI; ids are URL-encoded, so an id can never leave its path segment. */
export const paths = {
  tasks: () => '/ui/',
  task: (id) => `/ui/tasks/${encodeURIComponent(id)}`,
  timeline: (id) => `/ui/tasks/${encodeURIComponent(id)}/timeline`,
  approvals: () => '/ui/approvals',
  dags: () => '/ui/dags',
  dag: (hash) => `/ui/dags/${encodeURIComponent(hash)}`,
  login: () => '/ui/login',
};

/**
 * A value for a person to read: an object as a field list (strings as wrapped text, so
 * an email body shows its lines), anything else as JSON text.
 */
export function fieldsView(value, attrs = {}) {
  if (!value || typeof value !== 'object' || Array.isArray(value) ||
      Object.keys(value).length === 0 || Object.keys(value).length > 30) {
    return jsonBlock(value, attrs);
  }
  return h('dl', {class: 'fields', ...attrs}, Object.entries(value).map(([k, v]) => [
    h('dt', {}, k),
    h('dd', {}, typeof v === 'string' ? h('div', {class: 'text-value'}, v)
      : jsonBlock(v)),
  ]));
}

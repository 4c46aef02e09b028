// "Where is the waiting" (seed 001): every node attempt as a row of bars on one time
// axis — queued (ready → claimed), running (claimed → committed, failed or expired),
// paused (paused → resumed or decided), backoff (a failure → its retry time) — with
// lease expiries, stalls, decisions and failures marked.
//
// deriveTimeline() is pure (events and snapshots in, rows out); renderTimeline() draws.

import {duration, h, localTime, svg} from './dom.js';

export const BAR_KINDS = ['queued', 'running', 'paused', 'backoff'];

const MARKER_KINDS = {
  lease_expired: 'lease', stall_note: 'stall', stall_warning: 'stall',
  stall_extended: 'stall', decided: 'decision', failed: 'failure', dead: 'failure',
  retry: 'failure', unavailable: 'unavailable', cancelled: 'cancelled', progress: 'progress',
};

/** Seconds of a "(retry in 1.5s)" or "(offered again in 30s)" detail; null if none. */
function delayOf(detail) {
  const m = /(?:retry in|offered again in) ([0-9.]+)s\)/.exec(detail || '');
  return m ? Number(m[1]) : null;
}

/**
 * Rows of bars and markers from a task's events (in commit order) and node snapshots.
 *
 * @param {object[]} events event JSON (kind, at, node_id, attempt, detail, seq)
 * @param {string[]} order node ids in document order (rows of a node stay together)
 * @param {number} now where bars still open end (the task is not final)
 * @returns {{rows: object[], skipped: string[], start: number, end: number,
 *   totals: Object<string, number>, taskMarkers: object[]}}
 */
export function deriveTimeline(events, order, now) {
  // One transaction's events share a seq; their ids keep the order it wrote them in.
  const sorted = [...events].sort((a, b) => (a.seq - b.seq)
    || String(a.event_id).localeCompare(String(b.event_id)));
  const nodes = new Map();
  const rows = [];
  const taskMarkers = [];
  const skipped = [];
  const node = (id) => {
    if (!nodes.has(id)) nodes.set(id, {open: null, pending: null, last: null});
    return nodes.get(id);
  };
  const newRow = (id, attempt, kind = 'attempt') => {
    const row = {node: id, attempt, kind, segments: [], markers: [], outcome: '', detail: ''};
    rows.push(row);
    node(id).last = row;
    return row;
  };
  const segment = (row, kind, start, end, open = false) => {
    if (end > start || kind === 'running') row.segments.push({kind, start, end, open});
  };
  const close = (n, at, outcome, detail = '') => {
    if (!n.open) return null;
    segment(n.open.row, n.open.kind, n.open.start, at);
    n.open.row.outcome = outcome;
    if (detail) n.open.row.detail = detail;
    const row = n.open.row;
    n.open = null;
    return row;
  };
  // A wait with no row yet (never claimed) gets one of its own.
  const flushPending = (id, n, at) => {
    if (!n.pending) return null;
    const row = newRow(id, 0, 'waiting');
    segment(row, n.pending.kind, n.pending.start, at);
    n.pending = null;
    return row;
  };

  for (const e of sorted) {
    const t = e.at;
    if (!e.node_id || e.kind === 'retried') {
      taskMarkers.push({kind: e.kind, at: t, detail: e.detail, node: e.node_id || ''});
      if (!e.node_id) continue;
    }
    const id = e.node_id;
    const n = node(id);
    const mark = (row, kind) => {
      const target = row || n.open?.row || n.last;
      if (target) target.markers.push({kind, event: e.kind, at: t, detail: e.detail});
    };
    switch (e.kind) {
      case 'ready':
        close(n, t, 'ended');
        n.pending = {kind: 'queued', start: t};
        break;
      case 'claimed': {
        close(n, t, 'expired');
        const row = newRow(id, e.attempt);
        if (n.pending) segment(row, 'queued', n.pending.start, t);
        n.pending = null;
        n.open = {row, kind: 'running', start: t};
        break;
      }
      case 'committed': {
        const row = close(n, t, 'succeeded');
        if (!row) {
          // A condition is evaluated on the spot: no claim, a run of no length.
          const inline = flushPending(id, n, t) || newRow(id, e.attempt);
          inline.attempt = e.attempt;
          inline.kind = 'attempt';
          segment(inline, 'running', t, t);
          inline.outcome = 'succeeded';
        }
        break;
      }
      case 'retry':
      case 'unavailable': {
        const row = close(n, t, e.kind === 'retry' ? 'failed' : 'unavailable', e.detail)
          || n.last || newRow(id, e.attempt);
        mark(row, MARKER_KINDS[e.kind]);
        const delay = delayOf(e.detail);
        if (delay !== null && delay > 0) {
          segment(row, 'backoff', t, t + delay);
          n.pending = {kind: 'queued', start: t + delay};
        } else {
          n.pending = {kind: 'queued', start: t};
        }
        break;
      }
      case 'lease_expired': {
        const row = close(n, t, 'expired', e.detail);
        mark(row, 'lease');
        n.pending = {kind: 'queued', start: t};
        break;
      }
      case 'paused': {
        let row = close(n, t, 'paused');
        if (!row) {
          n.pending = null;
          row = newRow(id, Math.max(e.attempt, 1), 'gate');
        }
        n.open = {row, kind: 'paused', start: t};
        break;
      }
      case 'resumed':
        close(n, t, 'resumed');
        n.pending = {kind: 'queued', start: t};
        break;
      case 'decided': {
        const decision = (e.detail || '').split(' ')[0];
        const row = close(n, t, decision, e.detail) || n.last || newRow(id, 1, 'gate');
        mark(row, 'decision');
        break;
      }
      case 'failed':
      case 'dead':
      case 'cancelled': {
        const row = close(n, t, e.kind, e.detail) || flushPending(id, n, t);
        if (row) {
          row.outcome = e.kind;
          row.detail = e.detail;
        }
        n.pending = null;
        mark(row, MARKER_KINDS[e.kind]);
        break;
      }
      case 'skipped':
        skipped.push(id);
        break;
      case 'retried':
        break;
      default:
        if (MARKER_KINDS[e.kind]) mark(null, MARKER_KINDS[e.kind]);
    }
  }
  for (const [id, n] of nodes) {
    if (n.open) {
      segment(n.open.row, n.open.kind, n.open.start, Math.max(now, n.open.start), true);
      n.open.row.outcome = n.open.kind;
      n.open = null;
    }
    if (n.pending) {
      const row = newRow(id, 0, 'waiting');
      segment(row, n.pending.kind, n.pending.start, Math.max(now, n.pending.start), true);
      row.outcome = 'waiting';
      n.pending = null;
    }
  }

  // Nodes in the order they first did something (a waterfall); their rows in order.
  const first = new Map();
  const rank = new Map(order.map((id, i) => [id, i]));
  for (const row of rows) {
    const at = Math.min(...row.segments.map((s) => s.start), ...row.markers.map((m) => m.at));
    row.start = Number.isFinite(at) ? at : 0;
    if (!first.has(row.node) || first.get(row.node) > row.start) first.set(row.node, row.start);
  }
  const byNode = new Map();
  rows.forEach((row, i) => {
    row.seq = i;
    if (!byNode.has(row.node)) byNode.set(row.node, []);
    byNode.get(row.node).push(row);
  });
  const nodeOrder = [...byNode.keys()].sort((a, b) => (first.get(a) - first.get(b))
    || ((rank.get(a) ?? 1e9) - (rank.get(b) ?? 1e9)));
  const ordered = nodeOrder.flatMap((id) => byNode.get(id));

  const totals = Object.fromEntries(BAR_KINDS.map((k) => [k, 0]));
  let start = Infinity;
  let end = -Infinity;
  for (const row of ordered) {
    for (const s of row.segments) {
      totals[s.kind] += s.end - s.start;
      start = Math.min(start, s.start);
      end = Math.max(end, s.end);
    }
    for (const m of row.markers) {
      start = Math.min(start, m.at);
      end = Math.max(end, m.at);
    }
  }
  for (const m of taskMarkers) {
    start = Math.min(start, m.at);
    end = Math.max(end, m.at);
  }
  if (!Number.isFinite(start)) {
    start = now;
    end = now;
  }
  return {rows: ordered, skipped, start, end, totals, taskMarkers};
}

// ---------------------------------------------------------------------------- drawing

const STEPS = [0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600,
  7200, 10800, 21600, 43200, 86400, 172800, 604800];

function tickStep(span, maxTicks) {
  return STEPS.find((s) => span / s <= maxTicks) || STEPS.at(-1);
}

/** "+1.5s", "+30s", "+2m 00s": one precision along the whole axis (the step's). */
function tickLabel(offset, step) {
  if (offset === 0) return '0';
  if (step < 60) {
    const digits = step < 0.1 ? 2 : step < 1 ? 1 : 0;
    return `+${offset.toFixed(digits)}s`;
  }
  return `+${duration(offset)}`;
}

const LABEL_W = 230;
const ROW_H = 30;
const AXIS_H = 26;
const BAR_H = 14;

function markerShape(kind, x, y) {
  switch (kind) {
    case 'lease':
      return [svg('path', {d: `M${x - 5},${y - 5} L${x + 5},${y + 5} M${x - 5},${y + 5} L${x + 5},${y - 5}`})];
    case 'stall':
      return [svg('path', {d: `M${x},${y - 6} L${x + 6},${y} L${x},${y + 6} L${x - 6},${y} z`})];
    case 'decision':
      return [svg('path', {d: `M${x},${y + 8} L${x},${y - 9} L${x + 9},${y - 6} L${x},${y - 3}`})];
    case 'progress':
      // Above the bar, small: a running node may report progress often.
      return [svg('path', {d: `M${x},${y - 12} L${x},${y - 8}`})];
    case 'cancelled':
      return [svg('rect', {x: x - 4, y: y - 4, width: 8, height: 8})];
    default:
      return [svg('circle', {cx: x, cy: y, r: 4.5})];
  }
}

/**
 * Draw a derived timeline.
 *
 * @param {ReturnType<typeof deriveTimeline>} tl
 * @param {number} width pixels available
 * @param {(id: string) => string} nodeHref link of a node (its panel on the task page)
 */
export function renderTimeline(tl, width, nodeHref) {
  const chartW = Math.max(200, width - LABEL_W - 16);
  const span = Math.max(tl.end - tl.start, 0.001);
  const scale = chartW / span;
  const xOf = (t) => LABEL_W + (t - tl.start) * scale;
  const height = AXIS_H + tl.rows.length * ROW_H + 8;
  const root = svg('svg', {class: 'timeline', width, height, viewBox: `0 0 ${width} ${height}`,
    role: 'img', 'aria-label': `timeline of ${tl.rows.length} node attempts`});

  const axis = svg('g', {class: 'axis'});
  const step = tickStep(span, Math.max(2, Math.floor(chartW / 90)));
  for (let off = 0; off <= span + 1e-9; off += step) {
    const x = xOf(tl.start + off);
    axis.appendChild(svg('line', {class: 'tick', x1: x, x2: x, y1: AXIS_H - 6, y2: height}));
    axis.appendChild(svg('text', {class: 'tick-label', x: x + 3, y: AXIS_H - 10},
      tickLabel(off, step)));
  }
  root.appendChild(axis);

  tl.rows.forEach((row, i) => {
    const y = AXIS_H + i * ROW_H;
    const mid = y + ROW_H / 2;
    const seconds = Object.fromEntries(BAR_KINDS.map((k) => [k, 0]));
    for (const s of row.segments) seconds[s.kind] += s.end - s.start;
    const g = svg('g', {class: `trow ${i % 2 ? 'odd' : 'even'}`, 'data-node': row.node,
      'data-attempt': row.attempt, 'data-row-kind': row.kind, 'data-outcome': row.outcome});
    g.appendChild(svg('rect', {class: 'row-bg', x: 0, y, width, height: ROW_H}));
    const label = row.kind === 'gate' ? 'gate' : row.kind === 'waiting' ? 'not claimed'
      : `attempt ${row.attempt}`;
    const link = svg('a', {href: nodeHref(row.node), class: 'row-link'},
      svg('text', {class: 'row-node', x: 8, y: mid - 1}, row.node.length > 26
        ? `${row.node.slice(0, 25)}…` : row.node),
      svg('text', {class: 'row-sub', x: 8, y: mid + 11},
        `${label}${row.outcome ? ` · ${row.outcome}` : ''}`));
    g.appendChild(link);
    g.appendChild(svg('title', {}, `${row.node} ${label}\n` + BAR_KINDS
      .filter((k) => seconds[k] > 0 || (k === 'running' && row.segments.some((s) => s.kind === k)))
      .map((k) => `${k} ${duration(seconds[k])}`).join(', ') +
      (row.detail ? `\n${row.detail}` : '')));
    for (const s of row.segments) {
      const x = xOf(s.start);
      const w = Math.max(2, (s.end - s.start) * scale);
      g.appendChild(svg('rect', {class: `bar k-${s.kind}${s.open ? ' open' : ''}`,
        x: x.toFixed(1), y: (mid - BAR_H / 2).toFixed(1), width: w.toFixed(1), height: BAR_H,
        rx: 2, 'data-kind': s.kind, 'data-start': s.start.toFixed(3),
        'data-end': s.end.toFixed(3), 'data-seconds': (s.end - s.start).toFixed(3),
        'data-open': s.open ? 'true' : null},
      svg('title', {}, `${s.kind} ${duration(s.end - s.start)}${s.open ? ' (so far)' : ''}\n` +
        `${localTime(s.start)} → ${s.open ? 'now' : localTime(s.end)}`)));
    }
    for (const m of row.markers) {
      g.appendChild(svg('g', {class: `mark m-${m.kind}`, 'data-kind': m.kind,
        'data-event': m.event, 'data-at': m.at.toFixed(3)},
      svg('title', {}, `${m.event} at ${localTime(m.at)}\n${m.detail || ''}`),
      markerShape(m.kind, xOf(m.at), mid)));
    }
    root.appendChild(g);
  });
  return root;
}

/** The legend: a swatch per bar kind and per marker. */
export function legend() {
  const swatch = (kind, text, title) => h('span', {class: 'legend-item', title},
    h('span', {class: `swatch k-${kind}`}), text);
  const marker = (kind, text, title) => {
    const icon = svg('svg', {class: 'legend-mark', width: 16, height: 16, viewBox: '0 0 16 16'},
      svg('g', {class: `mark m-${kind}`}, markerShape(kind, 8, kind === 'progress' ? 18 : 8)));
    return h('span', {class: 'legend-item', title}, icon, text);
  };
  return h('div', {class: 'legend'},
    swatch('queued', 'queued', 'ready, waiting for a worker to claim it'),
    swatch('running', 'running', 'claimed: running under a lease'),
    swatch('paused', 'paused', 'a gate waiting for a decision, or a node its handler paused'),
    swatch('backoff', 'backoff', 'after a retryable failure, until the retry may start'),
    marker('lease', 'lease expired', 'the owner lost the node; another attempt follows'),
    marker('stall', 'stall', 'a blocking verdict: noted, warned, extended'),
    marker('decision', 'decision', 'a person approved or rejected'),
    marker('failure', 'failure', 'a failed attempt (retried or final)'),
    marker('cancelled', 'cancelled', 'cancelled by an admin'),
    marker('progress', 'progress', 'the node reported progress'));
}

// The DAG as SVG: a box per node (coloured by its state when a task is shown), an arrow
// per edge (taken edges solid and dark, edges not taken dashed and grey).

import {svg} from './dom.js';
import {edgePath, layout} from './layout.js';

const ID_CHARS = 24;

function short(text, chars) {
  return text.length > chars ? `${text.slice(0, chars - 1)}…` : text;
}

/** A guard as a short label: "{{ .output.decision == 'approve' }}" -> "decision == 'approve'". */
export function guardLabel(edge) {
  if (edge.when !== undefined && edge.when !== null) return String(edge.when);
  if (!edge.condition) return '';
  return String(edge.condition).replace(/^\s*\{\{\s*|\s*\}\}\s*$/g, '')
    .replace(/\.output\./g, '').trim();
}

/** How an edge was decided: taken, not-taken, or pending (its source not decided). */
export function edgeState(snaps, from, to) {
  const source = snaps?.[from];
  if (!source) return 'pending';
  const hop = (source.next_hops || []).find((h) => h.target === to);
  if (hop) return hop.taken ? 'taken' : 'not-taken';
  if (['SKIPPED', 'CANCELLED', 'FAILED', 'DEAD'].includes(source.state)) return 'not-taken';
  return 'pending';
}

/** Where an edge's label goes: the first spot along the edge where its box would cover
 * no label placed before and no node; the first spot tried when every one would. */
function placeLabel(points, text, placed, nodes) {
  const w = text.length * 5.9 + 6;
  const h = 13;
  const at = (leg, t) => {
    const [x0, y0] = points[leg];
    const [x1, y1] = points[leg + 1];
    return [x0 + (x1 - x0) * t, y0 + (y1 - y0) * t];
  };
  const last = points.length - 2;
  const spots = [at(0, 0.5), at(last, 0.55), at(0, 0.3), at(0, 0.75), at(last, 0.3),
    ...points.slice(1, -1).map((p, i) => at(i + 1, 0.5))];
  const hits = (a, b) => Math.abs(a.x - b.x) * 2 < a.w + b.w && Math.abs(a.y - b.y) * 2 < a.h + b.h;
  const boxes = [...nodes.values()].map((n) => ({x: n.x, y: n.y, w: n.w, h: n.h}));
  const free = spots.find(([x, y]) => {
    const box = {x, y, w, h};
    return !placed.some((p) => hits(p, box)) && !boxes.some((b) => hits(b, box));
  });
  const [x, y] = free || spots[0];
  placed.push({x, y, w, h});
  return [x, y];
}

function arrowMarker(id) {
  return svg('marker', {id, viewBox: '0 0 10 10', refX: 9, refY: 5, markerWidth: 9,
    markerHeight: 9, markerUnits: 'userSpaceOnUse', orient: 'auto-start-reverse',
    class: `arrow ${id}`},
  svg('path', {d: 'M0,0 L10,5 L0,10 z'}));
}

function subtitle(def, snap) {
  const kind = def.type === 'tool_call' && def.tool ? `tool ${def.tool}`
    : def.type === 'llm_call' && def.model ? `llm ${def.model}` : def.type;
  if (!snap) return def.map ? `${short(kind, 16)} · map` : kind;
  // A map's items done of all; a loop node's visit (from the second on).
  const more = def.map && snap.items ? ` · ${snap.items_done}/${snap.items}`
    : snap.visit > 1 ? ` · visit ${snap.visit}` : '';
  const attempt = snap.attempt > 1 && !def.map ? ` · #${snap.attempt}` : '';
  return `${short(kind, more ? 8 : 16)} · ${snap.state}${more}${attempt}`;
}

/**
 * Render a DAG.
 *
 * @param {object} dag the canonical DAG ({nodes: {id: {type, next: [...]}}})
 * @param {object|null} snaps node snapshots by id (a task), or null (a stored DAG)
 * @param {string} selected the selected node id ('' for none)
 * @param {(id: string) => void} onSelect called when a node is clicked
 */
export function renderGraph(dag, snaps, selected, onSelect) {
  const defs = dag.nodes || {};
  const ids = Object.keys(defs);
  const edges = [];
  for (const id of ids) {
    for (const e of defs[id].next || []) edges.push({from: id, to: e.target, guard: guardLabel(e)});
  }
  const laid = layout(ids, edges);
  const root = svg('svg', {class: 'graph', width: laid.width.toFixed(0),
    height: laid.height.toFixed(0), viewBox: `0 0 ${laid.width.toFixed(1)} ${laid.height.toFixed(1)}`,
    role: 'img', 'aria-label': `graph of ${ids.length} nodes`},
  svg('defs', {}, ['taken', 'not-taken', 'pending'].map((k) => arrowMarker(`ax-arrow-${k}`))));

  const guards = new Map(edges.map((e) => [`${e.from}\u0000${e.to}`, e.guard]));
  const placed = [];
  const edgeLayer = svg('g', {class: 'edges'});
  const labelLayer = svg('g', {class: 'edge-labels'});
  for (const e of laid.edges) {
    const state = snaps ? edgeState(snaps, e.from, e.to) : 'pending';
    const guard = guards.get(`${e.from}\u0000${e.to}`) || '';
    edgeLayer.appendChild(svg('path', {class: `edge e-${state}`, d: edgePath(e.points),
      'data-from': e.from, 'data-to': e.to, 'data-edge': state,
      'marker-end': `url(#ax-arrow-${state})`},
    svg('title', {}, `${e.from} → ${e.to}${guard ? ` when ${guard}` : ''} (${state})`)));
    if (guard) {
      const text = short(guard, 26);
      const [x, y] = placeLabel(e.points, text, placed, laid.nodes);
      labelLayer.appendChild(svg('text', {class: `edge-label e-${state}`,
        x: x.toFixed(1), y: (y + 3).toFixed(1), 'text-anchor': 'middle'}, text));
    }
  }
  root.appendChild(edgeLayer);

  const nodeLayer = svg('g', {class: 'nodes'});
  for (const id of ids) {
    const box = laid.nodes.get(id);
    const snap = snaps ? snaps[id] : null;
    const state = snap ? snap.state : 'DEF';
    const left = box.x - box.w / 2;
    const top = box.y - box.h / 2;
    const classes = ['gnode', `s-${state}`, `t-${defs[id].type}`, id === selected && 'selected'];
    const g = svg('g', {class: classes.filter(Boolean).join(' '), 'data-node': id,
      'data-state': snap ? snap.state : null, 'data-type': defs[id].type, tabindex: 0,
      role: 'button', 'aria-label': `${id}${snap ? `, ${snap.state}` : ''}`},
    svg('title', {}, `${id}\n${defs[id].type}${snap ? ` · ${snap.state}` : ''}` +
      (defs[id].description ? `\n${defs[id].description}` : '')),
    svg('rect', {class: 'box', x: left.toFixed(1), y: top.toFixed(1), width: box.w,
      height: box.h, rx: defs[id].type === 'condition' ? 14 : 6}),
    // A gate waits for a person: a second outline inside its box.
    defs[id].type === 'human_gateway' ? svg('rect', {class: 'inner', x: (left + 3).toFixed(1),
      y: (top + 3).toFixed(1), width: box.w - 6, height: box.h - 6, rx: 4}) : null,
    svg('text', {class: 'nid', x: (left + 10).toFixed(1), y: (top + 18).toFixed(1)},
      short(id, ID_CHARS)),
    svg('text', {class: 'nsub', x: (left + 10).toFixed(1), y: (top + 34).toFixed(1)},
      subtitle(defs[id], snap)));
    g.addEventListener('click', () => onSelect(id));
    g.addEventListener('keydown', (ev) => {
      if (ev.key === 'Enter' || ev.key === ' ') {
        ev.preventDefault();
        onSelect(id);
      }
    });
    nodeLayer.appendChild(g);
  }
  root.appendChild(nodeLayer);
  root.appendChild(labelLayer);
  // Shrunk to fit its column, but never below 70 %: a wider DAG scrolls instead.
  root.style.minWidth = `${(laid.width * 0.7).toFixed(0)}px`;
  return root;
}

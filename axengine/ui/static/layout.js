// A layered ("Sugiyama") layout of a DAG, top to bottom. Pure: ids and edges in, boxes
// and edge polylines out; no DOM. Deterministic: the same DAG gives the same picture.
//
// 1. layers by longest path from the entry nodes (so every edge points down);
// 2. an edge spanning several layers gets a chain of dummy points, one per layer it
//    crosses, so it is routed around the nodes and ordered like them;
// 3. the order within each layer by barycentre sweeps (down, then up, repeated), keeping
//    the order with the fewest crossings seen;
// 4. x by isotonic regression per layer: each node as close as possible to the mean of
//    its neighbours' x, nodes kept in order at least one gap apart (pool adjacent
//    violators), alternating down and up passes.

const DEFAULTS = {
  nodeWidth: 188, nodeHeight: 44, dummyWidth: 14, layerGap: 40, nodeGap: 24, margin: 14,
  sweeps: 12, passes: 8,
};

/** Edges that close a cycle (a DAG has none; a bad document should still draw). */
function backEdges(ids, succ) {
  const state = new Map();  // 1 = on the stack, 2 = done
  const back = new Set();
  const visit = (v) => {
    state.set(v, 1);
    for (const w of succ.get(v)) {
      if (state.get(w) === 1) back.add(`${v}\u0000${w}`);
      else if (!state.has(w)) visit(w);
    }
    state.set(v, 2);
  };
  for (const v of ids) if (!state.has(v)) visit(v);
  return back;
}

function longestPathLayers(ids, preds, succ) {
  const layer = new Map();
  const indegree = new Map(ids.map((v) => [v, preds.get(v).length]));
  const queue = ids.filter((v) => indegree.get(v) === 0);
  for (let i = 0; i < queue.length; i++) {
    const v = queue[i];
    layer.set(v, Math.max(0, ...preds.get(v).map((p) => layer.get(p) + 1)));
    for (const w of succ.get(v)) {
      indegree.set(w, indegree.get(w) - 1);
      if (indegree.get(w) === 0) queue.push(w);
    }
  }
  return layer;
}

/** Crossings between two adjacent layers (edges given as [upperPos, lowerPos]). */
function crossingsBetween(pairs) {
  pairs.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  let count = 0;
  for (let i = 0; i < pairs.length; i++) {
    for (let j = i + 1; j < pairs.length; j++) {
      if (pairs[j][0] > pairs[i][0] && pairs[j][1] < pairs[i][1]) count++;
    }
  }
  return count;
}

/** Positions x (in order) minimising sum w(x - want)^2 with x[i+1] - x[i] >= gap[i]. */
function placeInOrder(want, weight, gap) {
  const offset = [0];
  for (let i = 1; i < want.length; i++) offset.push(offset[i - 1] + gap[i - 1]);
  // y = x - offset must be non-decreasing: pool adjacent violators on want - offset.
  const blocks = [];
  want.forEach((w, i) => {
    blocks.push({value: w - offset[i], weight: weight[i], size: 1});
    while (blocks.length > 1 && blocks.at(-2).value > blocks.at(-1).value) {
      const b = blocks.pop();
      const a = blocks.pop();
      const total = a.weight + b.weight;
      blocks.push({value: (a.value * a.weight + b.value * b.weight) / total,
        weight: total, size: a.size + b.size});
    }
  });
  const out = [];
  for (const block of blocks) for (let k = 0; k < block.size; k++) out.push(block.value);
  return out.map((y, i) => y + offset[i]);
}

/**
 * Lay out a DAG.
 *
 * @param {string[]} ids node ids in document order
 * @param {{from: string, to: string}[]} edges
 * @returns {{width: number, height: number,
 *   nodes: Map<string, {x: number, y: number, w: number, h: number, layer: number}>,
 *   edges: {from: string, to: string, points: number[][]}[]}}
 *   x, y are box centres; an edge's points run from the source's bottom to the target's
 *   top, through its dummy points.
 */
export function layout(ids, edges, options = {}) {
  const o = {...DEFAULTS, ...options};
  const known = new Set(ids);
  const unique = [];
  const seen = new Set();
  for (const e of edges) {
    const key = `${e.from}\u0000${e.to}`;
    if (known.has(e.from) && known.has(e.to) && e.from !== e.to && !seen.has(key)) {
      seen.add(key);
      unique.push(e);
    }
  }
  const succ0 = new Map(ids.map((v) => [v, []]));
  for (const e of unique) succ0.get(e.from).push(e.to);
  const back = backEdges(ids, succ0);
  // Work on an acyclic copy: a back edge is laid out reversed and drawn the right way.
  const work = unique.map((e) => (back.has(`${e.from}\u0000${e.to}`)
    ? {from: e.to, to: e.from, reversed: true, edge: e}
    : {from: e.from, to: e.to, reversed: false, edge: e}));
  const preds = new Map(ids.map((v) => [v, []]));
  const succ = new Map(ids.map((v) => [v, []]));
  for (const e of work) {
    preds.get(e.to).push(e.from);
    succ.get(e.from).push(e.to);
  }
  const layerOf = longestPathLayers(ids, preds, succ);

  // Graph of real and dummy vertices, edges between adjacent layers only.
  const vertex = new Map();  // id -> {id, layer, dummy, w}
  for (const v of ids) {
    vertex.set(v, {id: v, layer: layerOf.get(v), dummy: false, w: o.nodeWidth});
  }
  const up = new Map(ids.map((v) => [v, []]));
  const down = new Map(ids.map((v) => [v, []]));
  const chains = [];
  let dummies = 0;
  for (const e of work) {
    const chain = [e.from];
    for (let l = layerOf.get(e.from) + 1; l < layerOf.get(e.to); l++) {
      const id = `\u0000d${dummies++}`;
      vertex.set(id, {id, layer: l, dummy: true, w: o.dummyWidth});
      up.set(id, []);
      down.set(id, []);
      chain.push(id);
    }
    chain.push(e.to);
    for (let i = 0; i + 1 < chain.length; i++) {
      down.get(chain[i]).push(chain[i + 1]);
      up.get(chain[i + 1]).push(chain[i]);
    }
    chains.push({...e, chain});
  }
  const depth = Math.max(0, ...[...vertex.values()].map((v) => v.layer)) + 1;
  const layers = Array.from({length: depth}, () => []);

  // Initial order: depth-first from the entry nodes in document order, so siblings
  // start next to each other.
  const placed = new Set();
  const dfs = (v) => {
    if (placed.has(v)) return;
    placed.add(v);
    layers[vertex.get(v).layer].push(v);
    for (const w of down.get(v)) dfs(w);
  };
  for (const v of ids) if (preds.get(v).length === 0) dfs(v);
  for (const v of vertex.keys()) dfs(v);

  const position = new Map();
  const index = () => layers.forEach((row) => row.forEach((v, i) => position.set(v, i)));
  const crossings = () => {
    let total = 0;
    for (let l = 0; l + 1 < depth; l++) {
      const pairs = [];
      for (const v of layers[l]) {
        for (const w of down.get(v)) pairs.push([position.get(v), position.get(w)]);
      }
      total += crossingsBetween(pairs);
    }
    return total;
  };
  index();
  let best = layers.map((row) => [...row]);
  let fewest = crossings();
  for (let sweep = 0; sweep < o.sweeps && fewest > 0; sweep++) {
    const downward = sweep % 2 === 0;
    const order = downward ? [...Array(depth).keys()].slice(1)
      : [...Array(depth).keys()].reverse().slice(1);
    for (const l of order) {
      const neighbours = downward ? up : down;
      const keyed = layers[l].map((v, i) => {
        const ns = neighbours.get(v);
        const bary = ns.length
          ? ns.reduce((sum, n) => sum + position.get(n), 0) / ns.length : i;
        return {v, bary, i};
      });
      keyed.sort((a, b) => a.bary - b.bary || a.i - b.i);
      layers[l] = keyed.map((k) => k.v);
      layers[l].forEach((v, i) => position.set(v, i));
    }
    const now = crossings();
    if (now < fewest) {
      fewest = now;
      best = layers.map((row) => [...row]);
    }
  }
  best.forEach((row, l) => { layers[l] = row; });
  index();

  // x coordinates.
  const x = new Map();
  for (const row of layers) {
    let at = 0;
    for (const v of row) {
      const w = vertex.get(v).w;
      x.set(v, at + w / 2);
      at += w + o.nodeGap;
    }
  }
  const gapsOf = (row) => row.slice(1).map((v, i) =>
    (vertex.get(row[i]).w + vertex.get(v).w) / 2 + o.nodeGap);
  for (let pass = 0; pass < o.passes; pass++) {
    const downward = pass % 2 === 0;
    const order = downward ? [...Array(depth).keys()] : [...Array(depth).keys()].reverse();
    for (const l of order) {
      const row = layers[l];
      const want = row.map((v) => {
        const ns = pass >= o.passes - 2 ? [...up.get(v), ...down.get(v)]
          : (downward ? up : down).get(v);
        return ns.length ? ns.reduce((s, n) => s + x.get(n), 0) / ns.length : x.get(v);
      });
      // A dummy pulls harder: long edges stay straight.
      const weight = row.map((v) => (vertex.get(v).dummy ? 2 : 1));
      placeInOrder(want, weight, gapsOf(row)).forEach((value, i) => x.set(row[i], value));
    }
  }
  let minX = Infinity;
  let maxX = -Infinity;
  for (const [v, value] of x) {
    minX = Math.min(minX, value - vertex.get(v).w / 2);
    maxX = Math.max(maxX, value + vertex.get(v).w / 2);
  }
  if (!Number.isFinite(minX)) {
    minX = 0;
    maxX = 0;
  }
  const shift = o.margin - minX;
  const yOf = (layer) => o.margin + layer * (o.nodeHeight + o.layerGap) + o.nodeHeight / 2;

  const nodes = new Map();
  for (const v of ids) {
    const layer = vertex.get(v).layer;
    nodes.set(v, {x: x.get(v) + shift, y: yOf(layer), w: o.nodeWidth, h: o.nodeHeight, layer});
  }
  const outEdges = chains.map(({chain, reversed, edge}) => {
    const points = chain.map((v, i) => {
      const cx = x.get(v) + shift;
      const cy = yOf(vertex.get(v).layer);
      if (i === 0) return [cx, cy + o.nodeHeight / 2];
      if (i === chain.length - 1) return [cx, cy - o.nodeHeight / 2];
      return [cx, cy];
    });
    return {from: edge.from, to: edge.to, points: reversed ? points.reverse() : points,
      reversed};
  });
  return {
    width: maxX - minX + 2 * o.margin,
    height: depth * (o.nodeHeight + o.layerGap) - o.layerGap + 2 * o.margin,
    nodes, edges: outEdges, crossings: fewest,
  };
}

/** An SVG path through `points` (top to bottom), smoothed with vertical tangents. */
export function edgePath(points) {
  if (!points.length) return '';
  let d = `M${points[0][0].toFixed(1)},${points[0][1].toFixed(1)}`;
  for (let i = 1; i < points.length; i++) {
    const [x0, y0] = points[i - 1];
    const [x1, y1] = points[i];
    const dy = (y1 - y0) / 2;
    d += ` C${x0.toFixed(1)},${(y0 + dy).toFixed(1)} ${x1.toFixed(1)},${(y1 - dy).toFixed(1)}` +
      ` ${x1.toFixed(1)},${y1.toFixed(1)}`;
  }
  return d;
}

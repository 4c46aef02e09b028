// A task: its DAG as a graph coloured by node state, live; a click on a node opens its
// panel (the node is kept in the URL, ?node=<id>, so the view can be linked).

import {api, hasRole} from './api.js';
import {fill, h, paths} from './dom.js';
import {renderGraph} from './graph.js';
import {nodePanel} from './node_panel.js';
import {isFinal, liveTask, taskHeader} from './task_header.js';

/** DAGs by hash: a stored DAG never changes. */
const dagCache = new Map();

export async function loadDag(hash) {
  if (!dagCache.has(hash)) {
    dagCache.set(hash, api(`/v1/dags/${encodeURIComponent(hash)}`).catch((err) => {
      dagCache.delete(hash);
      throw err;
    }));
  }
  return dagCache.get(hash);
}

export async function render(ctx) {
  const taskId = ctx.params[0];
  let selected = ctx.query.get('node') || '';
  let task = await api(`/v1/tasks/${encodeURIComponent(taskId)}`);
  const dag = (await loadDag(task.dag_hash)).dag;
  if (!ctx.alive()) return;

  const header = taskHeader(taskId, 'graph', () => refresh().then(() => live.ensure()));
  const graphHost = h('div', {class: 'graph-host', id: 'graph'});
  const panel = h('aside', {class: 'node-panel', id: 'node-panel', 'aria-live': 'polite'});
  const stale = h('div', {class: 'error-banner', role: 'alert', hidden: true});
  fill(ctx.main, header.el, stale,
    h('div', {class: 'task-body'}, h('div', {class: 'graph-col'}, graphHost, graphLegend()),
      panel));

  const select = (id) => {
    selected = id === selected ? '' : id;
    const url = selected ? `${paths.task(taskId)}?node=${encodeURIComponent(selected)}`
      : paths.task(taskId);
    history.pushState(null, '', url);
    draw();
  };

  function draw() {
    header.update(task);
    header.setSelected(selected);
    fill(graphHost, renderGraph(dag, task.nodes, selected, select));
    const def = definitionOf(dag, selected);
    if (selected && def) {
      const actions = task.nodes[selected]?.state === 'PAUSED' &&
        def.type === 'human_gateway' && hasRole('approve')
        ? h('p', {class: 'decide-hint'}, 'This gate waits for a decision: ',
          h('a', {href: paths.approvals()}, 'decide in the approvals inbox'), '.')
        : null;
      fill(panel, nodePanel(task, selected, def, actions, (id) => {
        selected = '';
        select(id);
      }));
      panel.classList.add('open');
    } else {
      fill(panel, h('div', {class: 'panel-empty'},
        h('p', {}, 'Click a node to see its input, output, attempts and decisions.'),
        summary()));
      panel.classList.remove('open');
    }
  }

  function summary() {
    const counts = {};
    for (const snap of Object.values(task.nodes || {})) {
      counts[snap.state] = (counts[snap.state] || 0) + 1;
    }
    return h('ul', {class: 'state-summary'}, Object.entries(counts).map(([state, n]) =>
      h('li', {}, h('span', {class: `dot s-${state}`}), `${n} ${state.toLowerCase()}`)));
  }

  let drawn = JSON.stringify(task);

  async function refresh() {
    let next;
    try {
      next = await api(`/v1/tasks/${encodeURIComponent(taskId)}`);
      stale.hidden = true;
    } catch (err) {
      fill(stale, `Could not refresh: ${err.message}`);
      stale.hidden = false;
      return;
    }
    if (!ctx.alive()) return;
    if (isFinal(next)) live.stop();
    // The stream replays the task's history first: redraw only what changed.
    const text = JSON.stringify(next);
    if (text === drawn) return;
    task = next;
    drawn = text;
    draw();
  }

  const live = liveTask(ctx, taskId, refresh);
  draw();
  if (!isFinal(task)) live.ensure();
}

/** The definition of node `id` in the canonical DAG: a map's item (node[3]) and a kept
 * visit (node#2) are their node's; a sub-DAG's node (review/check) is found inside its
 * dag node's `dag`. Null when the DAG has no such node. */
export function definitionOf(dag, id) {
  if (!id) return null;
  const path = id.replace(/(\[\d+\]|#\d+)$/, '').split('/');
  let nodes = dag.nodes || {};
  let def = null;
  for (const part of path) {
    def = Object.prototype.hasOwnProperty.call(nodes, part) ? nodes[part] : null;
    if (!def) return null;
    nodes = def.dag?.nodes || {};
  }
  return def;
}

function graphLegend() {
  const states = ['PENDING', 'WAITING', 'RUNNING', 'PAUSED', 'SUCCEEDED', 'FAILED', 'SKIPPED',
    'CANCELLED'];
  return h('div', {class: 'graph-legend'},
    states.map((s) => h('span', {class: 'legend-item'}, h('span', {class: `dot s-${s}`}),
      s.toLowerCase())),
    h('span', {class: 'legend-item'}, h('span', {class: 'edge-sample taken'}), 'taken'),
    h('span', {class: 'legend-item'}, h('span', {class: 'edge-sample not-taken'}), 'not taken'));
}

// The node panel of the task page: what one node was given, did and decided. Every
// value is text (a node's output may carry markup; it is shown, never parsed).

import {badge, duration, fieldsView, h, jsonBlock, paths, timeEl} from './dom.js';

function section(title, ...content) {
  return h('section', {class: 'panel-section'}, h('h3', {}, title), ...content);
}

function fact(name, value) {
  return [h('dt', {}, name), h('dd', {}, value)];
}

function has(value) {
  return value !== null && value !== undefined && value !== '';
}

/** The rendered parameters: {input, prompt?, description?} as the engine stores them. */
function inputSections(input) {
  if (input === null || input === undefined) {
    return [section('Input', h('p', {class: 'muted'}, 'Not rendered yet (the node has not ' +
      'been reached).'))];
  }
  const known = typeof input === 'object' && !Array.isArray(input) && 'input' in input;
  if (!known) return [section('Input', jsonBlock(input, {'data-field': 'input'}))];
  const out = [];
  if (has(input.description)) {
    out.push(section('Description', h('p', {class: 'description', 'data-field': 'description'},
      String(input.description))));
  }
  out.push(section('Input', fieldsView(input.input, {'data-field': 'input'})));
  if (has(input.prompt)) out.push(section('Prompt', jsonBlock(input.prompt, {'data-field': 'prompt'})));
  const rest = Object.fromEntries(Object.entries(input)
    .filter(([k]) => !['input', 'prompt', 'description'].includes(k)));
  if (Object.keys(rest).length) out.push(section('Other parameters', jsonBlock(rest)));
  return out;
}

/** The node's outbox records (side effects done at most once): key, state, result. */
function effectsSection(effects) {
  if (!Array.isArray(effects) || !effects.length) return null;
  return section(`Effects (${effects.length})`, h('ul', {class: 'effects',
    'data-field': 'effects'}, effects.map((e) => {
    if (!e || typeof e !== 'object' || Array.isArray(e)) return h('li', {}, jsonBlock(e));
    return h('li', {class: 'effect', 'data-state': e.state ?? ''},
      h('div', {class: 'effect-head'},
        e.state ? h('span', {class: 'effect-state'}, String(e.state)) : null,
        h('span', {class: 'mono small effect-key', title: String(e.key ?? '')},
          String(e.key ?? '')),
        e.updated_at ? timeEl(e.updated_at) : null),
      has(e.result) ? jsonBlock(e.result) : null);
  })));
}

/** The instances of node `id` in the task: a map's items (id[3]), a loop's kept visits
 * (id#2) and a sub-DAG's own nodes (id/check), in the order the API lists them. */
export function instancesOf(task, id) {
  const items = [];
  const visits = [];
  const children = [];
  for (const key of Object.keys(task.nodes || {})) {
    if (!key.startsWith(id) || key === id) continue;
    const rest = key.slice(id.length);
    if (/^\[\d+\]$/.test(rest)) items.push(key);
    else if (/^#\d+$/.test(rest)) visits.push(key);
    else if (/^\/[A-Za-z_][A-Za-z0-9_]*$/.test(rest)) children.push(key);
  }
  return {items, visits, children};
}

function instanceList(task, title, ids, field, onSelect) {
  if (!ids.length) return null;
  return section(`${title} (${ids.length})`, h('ul', {class: 'instances', 'data-field': field},
    ids.map((key) => {
      const state = task.nodes[key]?.state || '';
      const link = h('a', {href: `${paths.task(task.task_id)}?node=${encodeURIComponent(key)}`,
        class: 'mono', 'data-instance': key}, key);
      if (onSelect) {
        link.addEventListener('click', (event) => {
          event.preventDefault();
          onSelect(key);
        });
      }
      return h('li', {'data-state': state}, h('span', {class: `dot s-${state}`}), link,
        h('span', {class: 'muted small'}, ` ${state.toLowerCase()}`));
    })));
}

/**
 * The panel of node `id` of `task` (GET /v1/tasks/{id}); `def` is its DAG definition.
 * `actions` (nodes or null) are appended under the heading (retry, decide link);
 * `onSelect(id)` opens another node's panel (a map's item, a kept visit, a sub-DAG node).
 */
export function nodePanel(task, id, def, actions, onSelect) {
  const snap = task.nodes?.[id];
  if (!snap) {
    return h('div', {class: 'panel-empty'}, `The task has no node ${id}.`);
  }
  const hops = snap.next_hops || [];
  const decision = snap.decision;
  const {items, visits, children} = instancesOf(task, id);
  const progress = snap.progress_at
    ? [timeEl(snap.progress_at), snap.progress_marker
      ? h('div', {class: 'mono small'}, snap.progress_marker) : null]
    : timeEl(0);
  return h('div', {class: 'node-panel-body', 'data-node': id, 'data-state': snap.state},
    h('div', {class: 'panel-head'},
      h('h2', {class: 'mono'}, id),
      badge(snap.state, {'data-field': 'state'}),
      h('span', {class: 'muted'}, def?.type || snap.type || ''),
      h('a', {href: `${paths.timeline(task.task_id)}`, class: 'small'}, 'timeline')),
    actions,
    def?.description && snap.type !== 'human_gateway'
      ? h('p', {class: 'muted description'}, String(def.description)) : null,
    h('dl', {class: 'facts'},
      fact('Attempt', `${snap.attempt}${def ? ` of ${1 + (def.retry || 0)}` : ''}`),
      fact('Fence', String(snap.fence)),
      fact('Owner', snap.owner || h('span', {class: 'muted'}, '—')),
      fact('Ready', timeEl(snap.ready_at)),
      fact('Started', timeEl(snap.started_at)),
      fact('Finished', timeEl(snap.finished_at)),
      fact('Heartbeat', timeEl(snap.heartbeat_at)),
      fact('Progress', progress),
      snap.lease_until ? fact('Lease until', timeEl(snap.lease_until)) : null,
      snap.not_before ? fact('Not before', timeEl(snap.not_before)) : null,
      snap.gate_until ? fact(snap.type === 'human_gateway' ? 'Decide by' : 'Paused until',
        timeEl(snap.gate_until)) : null,
      snap.paused_seconds ? fact('Paused for', duration(snap.paused_seconds)) : null),
    instanceList(task, 'Items', items, 'items', onSelect),
    instanceList(task, 'Earlier visits', visits, 'visits', onSelect),
    instanceList(task, 'Sub-DAG nodes', children, 'children', onSelect),
    hops.length ? section('Next hops', h('ul', {class: 'hops'}, hops.map((hop) =>
      h('li', {class: hop.taken ? 'taken' : 'not-taken', 'data-target': hop.target},
        h('span', {class: 'hop-arrow'}, hop.taken ? '→ ' : '⇢ '),
        h('span', {class: 'mono'}, hop.target), h('span', {class: 'muted'},
          hop.taken ? ' taken' : ' not taken'))))) : null,
    decision ? section('Decision', h('dl', {class: 'facts', 'data-field': 'decision'},
      fact('Decision', String(decision.decision ?? '')),
      fact('By', String(decision.by ?? '')),
      decision.at ? fact('At', timeEl(decision.at)) : null,
      fact('Comment', has(decision.comment) ? String(decision.comment)
        : h('span', {class: 'muted'}, '—')),
      Object.keys(decision).filter((k) => !['decision', 'by', 'at', 'comment'].includes(k))
        .map((k) => fact(k, jsonBlock(decision[k]))))) : null,
    has(snap.error) ? section('Error', h('pre', {class: 'error-text', 'data-field': 'error'},
      String(snap.error)), snap.error_retryable
      ? h('p', {class: 'muted small'}, 'retryable') : null) : null,
    has(snap.evidence) ? section('Evidence', h('pre', {class: 'evidence',
      'data-field': 'evidence'}, String(snap.evidence))) : null,
    inputSections(snap.input),
    section('Output', snap.state === 'SUCCEEDED' || has(snap.output)
      ? jsonBlock(snap.output, {'data-field': 'output'})
      : h('p', {class: 'muted'}, ['WAITING', 'RUNNING', 'PAUSED', 'PENDING'].includes(snap.state)
        ? 'No output yet.' : 'No output.')),
    has(snap.checkpoint) ? section('Checkpoint', jsonBlock(snap.checkpoint)) : null,
    has(snap.resume) ? section('Resume data', jsonBlock(snap.resume)) : null,
    effectsSection(snap.effects ?? task.effects?.[id]));
}

// Stored DAG versions by content hash; one version: its graph, a node's definition, and
// the whole document as YAML (the canonical form the hash is computed from).

import {api} from './api.js';
import {fill, h, jsonBlock, paths} from './dom.js';
import {renderGraph} from './graph.js';
import {loadDag} from './page_task.js';
import {toYaml} from './yaml.js';

const PAGE = 100;

const item = (name, value) => h('span', {class: 'meta-item'}, h('span', {class: 'k'}, name),
  value);

export async function renderList(ctx) {
  const body = h('tbody', {id: 'dag-rows'});
  const more = h('button', {type: 'button', id: 'load-more', hidden: true}, 'Load more');
  let next = '';
  const add = (dags) => {
    for (const d of dags) {
      body.appendChild(h('tr', {'data-hash': d.hash},
        h('td', {}, h('a', {href: paths.dag(d.hash)}, d.name)),
        h('td', {class: 'mono'}, h('a', {href: paths.dag(d.hash), title: d.hash},
          d.hash.slice(0, 16))),
        h('td', {class: 'num'}, String(d.nodes)),
        h('td', {class: 'num muted'}, String(d.stored_revision ?? ''))));
    }
  };
  const page = async () => {
    const got = await api('/v1/dags', {query: {limit: PAGE, page_token: next}});
    if (!ctx.alive()) return;
    add(got.dags || []);
    next = got.next_page_token || '';
    more.hidden = !next;
  };
  more.addEventListener('click', page);
  fill(ctx.main, h('div', {class: 'page-head'}, h('h1', {}, 'DAGs'),
    h('span', {class: 'muted'}, 'Every stored version, by content hash.')),
  h('table', {class: 'list', id: 'dags'},
    h('thead', {}, h('tr', {}, h('th', {}, 'Name'), h('th', {}, 'Hash'),
      h('th', {class: 'num'}, 'Nodes'), h('th', {class: 'num'}, 'Stored at revision'))),
    body), more);
  await page();
  if (!body.firstChild) body.appendChild(h('tr', {}, h('td', {colspan: 4, class: 'muted'},
    'No DAG stored yet.')));
}

export async function renderOne(ctx) {
  const hash = ctx.params[0];
  const stored = await loadDag(hash);
  if (!ctx.alive()) return;
  const dag = stored.dag;
  let selected = ctx.query.get('node') || '';
  const graphHost = h('div', {class: 'graph-host', id: 'graph'});
  const panel = h('aside', {class: 'node-panel', id: 'node-panel'});
  const select = (id) => {
    selected = id === selected ? '' : id;
    history.pushState(null, '', selected
      ? `${paths.dag(hash)}?node=${encodeURIComponent(selected)}` : paths.dag(hash));
    draw();
  };
  const draw = () => {
    fill(graphHost, renderGraph(dag, null, selected, select));
    const def = selected ? dag.nodes?.[selected] : null;
    fill(panel, def ? h('div', {class: 'node-panel-body'},
      h('div', {class: 'panel-head'}, h('h2', {class: 'mono'}, selected),
        h('span', {class: 'muted'}, def.type)),
      def.description ? h('p', {class: 'description'}, String(def.description)) : null,
      h('pre', {class: 'yaml'}, toYaml({[selected]: def})))
      : h('div', {class: 'panel-empty'}, 'Click a node to see its definition.'));
  };
  fill(ctx.main,
    h('header', {class: 'task-header'},
      h('div', {class: 'title-row'}, h('h1', {}, h('span', {class: 'muted'}, 'DAG '),
        stored.name)),
      h('div', {class: 'task-meta'},
        item('Hash', h('span', {class: 'mono small'}, stored.hash)),
        item('Nodes', String(Object.keys(dag.nodes || {}).length)),
        dag.description ? item('Description', String(dag.description)) : null,
        item('Tasks', h('a', {href: `${paths.tasks()}?dag=${encodeURIComponent(stored.name)}`},
          `tasks of ${stored.name}`)))),
    h('div', {class: 'task-body'}, h('div', {class: 'graph-col'}, graphHost), panel),
    h('section', {class: 'dag-source'},
      h('h2', {}, 'Document'),
      h('p', {class: 'muted small'}, 'The stored canonical form (defaults applied), as ' +
        'YAML; its content hash is the one above.'),
      h('pre', {class: 'yaml', id: 'dag-yaml'}, toYaml(dag)),
      h('details', {}, h('summary', {}, 'As JSON'), jsonBlock(dag))));
  draw();
}

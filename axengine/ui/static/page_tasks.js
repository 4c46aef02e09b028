// Tasks, newest first: live counts per status (which double as the status filter), a
// DAG name and a label selector; the filters live in the query string, so a filtered
// list can be linked.

import {ApiError, api} from './api.js';
import {badge, fill, h, labelChips, paths, timeEl} from './dom.js';

export const STATUSES = ['RUNNING', 'PAUSED', 'SUCCEEDED', 'FAILED', 'DEAD', 'CANCELLED'];
const PAGE = 50;
const REFRESH_MS = 3000;

function filtersOf(query) {
  return {
    status: query.getAll('status').map((s) => s.toUpperCase()).filter((s) => STATUSES.includes(s)),
    dag: query.get('dag') || '',
    label: query.get('label') || '',
  };
}

function queryOf(filters) {
  const q = new URLSearchParams();
  for (const s of filters.status) q.append('status', s);
  if (filters.dag) q.set('dag', filters.dag);
  if (filters.label) q.set('label', filters.label);
  const text = q.toString();
  return text ? `?${text}` : '';
}

function taskRow(task) {
  return h('tr', {'data-task': task.task_id, 'data-status': task.status},
    h('td', {class: 'mono'}, h('a', {href: paths.task(task.task_id)}, task.task_id)),
    h('td', {}, task.dag_name),
    h('td', {}, badge(task.status)),
    h('td', {}, timeEl(task.created_at)),
    h('td', {}, timeEl(task.finished_at)),
    h('td', {}, labelChips(task.labels)),
    h('td', {}, task.submitted_by || h('span', {class: 'muted'}, '—')));
}

export async function render(ctx) {
  const filters = filtersOf(ctx.query);
  const state = {tasks: [], next: '', shown: PAGE};
  const counts = h('div', {class: 'status-filter', id: 'status-counts', role: 'group',
    'aria-label': 'status filter'});
  const dagInput = h('input', {type: 'text', id: 'filter-dag', placeholder: 'DAG name',
    value: filters.dag});
  const labelInput = h('input', {type: 'text', id: 'filter-label',
    placeholder: 'labels: team=risk', value: filters.label,
    title: 'label selector: key=value, key!=value or key, comma-separated'});
  const error = h('div', {class: 'error-banner', role: 'alert', hidden: true});
  const body = h('tbody', {id: 'task-rows'});
  const more = h('button', {type: 'button', id: 'load-more', hidden: true}, 'Load more');
  const empty = h('p', {class: 'muted empty', hidden: true}, 'No task matches these filters.');
  const form = h('form', {class: 'filters', id: 'task-filters'},
    counts, dagInput, labelInput,
    h('button', {type: 'submit'}, 'Apply'),
    h('button', {type: 'button', class: 'link-button', onclick: () => {
      filters.status = [];
      dagInput.value = '';
      labelInput.value = '';
      apply();
    }}, 'Clear'));

  fill(ctx.main,
    h('div', {class: 'page-head'}, h('h1', {}, 'Tasks')),
    form, error,
    h('table', {class: 'list', id: 'tasks'},
      h('thead', {}, h('tr', {},
        ['Task', 'DAG', 'Status', 'Created', 'Finished', 'Labels', 'Submitted by']
          .map((t) => h('th', {}, t)))),
      body),
    empty, more);

  let countsData = null;
  const drawCounts = () => {
    const total = countsData ? Object.values(countsData).reduce((a, b) => a + b, 0) : null;
    fill(counts,
      h('button', {type: 'button', class: `status-toggle all${filters.status.length ? '' : ' on'}`,
        'aria-pressed': String(!filters.status.length),
        onclick: () => { filters.status = []; apply(); }},
      'All', total === null ? null : h('span', {class: 'n'}, String(total))),
      STATUSES.map((s) => {
        const on = filters.status.includes(s);
        return h('button', {type: 'button', class: `status-toggle${on ? ' on' : ''}`,
          'data-status': s, 'aria-pressed': String(on), onclick: () => {
            filters.status = on ? filters.status.filter((x) => x !== s) : [...filters.status, s];
            apply();
          }},
        h('span', {class: `dot s-${s}`}), s,
        countsData ? h('span', {class: 'n', 'data-count': s}, String(countsData[s] ?? 0))
          : null);
      }));
  };

  const query = (limit, token) => ({status: filters.status, dag: filters.dag,
    label: filters.label, limit, page_token: token});

  const loadCounts = async () => {
    try {
      countsData = (await api('/v1/task-counts')).counts || null;
    } catch {
      countsData = null;  // an older server: the filter still works, without numbers
    }
    if (ctx.alive()) drawCounts();
  };

  const load = async () => {
    try {
      const page = await api('/v1/tasks', {query: query(Math.min(state.shown, 1000), '')});
      if (!ctx.alive()) return;
      state.tasks = page.tasks || [];
      state.next = page.next_page_token || '';
      error.hidden = true;
      draw();
    } catch (err) {
      if (!ctx.alive()) return;
      fill(error, err instanceof ApiError ? `${err.status}: ${err.message}` : String(err));
      error.hidden = false;
    }
  };

  const draw = () => {
    fill(body, state.tasks.map(taskRow));
    empty.hidden = state.tasks.length > 0;
    more.hidden = !state.next;
  };

  more.addEventListener('click', async () => {
    more.disabled = true;
    try {
      const page = await api('/v1/tasks', {query: query(PAGE, state.next)});
      state.tasks.push(...(page.tasks || []));
      state.shown = state.tasks.length;
      state.next = page.next_page_token || '';
      draw();
    } finally {
      more.disabled = false;
    }
  });

  function apply() {
    filters.dag = dagInput.value.trim();
    filters.label = labelInput.value.trim();
    state.shown = PAGE;
    history.replaceState(null, '', paths.tasks() + queryOf(filters));
    drawCounts();
    load();
  }

  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    apply();
  });

  drawCounts();
  await Promise.all([load(), loadCounts()]);
  ctx.every(REFRESH_MS, () => {
    loadCounts();
    load();
  });
}

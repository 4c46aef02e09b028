// A task's timeline: where its time went, per node attempt, and in total.

import {allPages, api} from './api.js';
import {duration, fill, h, localTime, nowSeconds, paths} from './dom.js';
import {isFinal, liveTask, taskHeader} from './task_header.js';
import {BAR_KINDS, deriveTimeline, legend, renderTimeline} from './timeline.js';

const REDRAW_MS = 2000;

function summary(tl, task) {
  const waiting = tl.totals.queued + tl.totals.paused + tl.totals.backoff;
  const running = tl.totals.running;
  const total = waiting + running;
  const share = (x) => (total > 0 ? x / total : 0);
  const bar = h('div', {class: 'share-bar'});
  for (const kind of BAR_KINDS) {
    const part = h('span', {class: `k-${kind}`, title: `${kind} ${duration(tl.totals[kind])}`});
    part.style.width = `${(share(tl.totals[kind]) * 100).toFixed(2)}%`;
    bar.appendChild(part);
  }
  const wall = (isFinal(task) && task.finished_at ? task.finished_at : nowSeconds())
    - task.created_at;
  return h('div', {class: 'tl-summary', id: 'timeline-summary',
    'data-waiting': waiting.toFixed(3), 'data-running': running.toFixed(3),
    'data-queued': tl.totals.queued.toFixed(3), 'data-paused': tl.totals.paused.toFixed(3),
    'data-backoff': tl.totals.backoff.toFixed(3)},
  h('div', {class: 'tl-totals'},
    h('span', {class: 'big'}, duration(waiting)), ' waiting ',
    h('span', {class: 'muted'}, `(${(share(waiting) * 100).toFixed(0)}%)`),
    ' vs ', h('span', {class: 'big'}, duration(running)), ' running ',
    h('span', {class: 'muted'}, `(${(share(running) * 100).toFixed(0)}%)`),
    h('span', {class: 'muted'}, ` · summed over ${tl.rows.length} ` +
      `${tl.rows.length === 1 ? 'row' : 'rows'} (node attempts); ` +
      `task wall time ${duration(Math.max(wall, 0))}`)),
  bar,
  h('div', {class: 'tl-kinds'}, BAR_KINDS.map((k) => h('span', {class: 'legend-item'},
    h('span', {class: `swatch k-${k}`}), `${k} ${duration(tl.totals[k])}`))));
}

export async function render(ctx) {
  const taskId = ctx.params[0];
  const enc = encodeURIComponent(taskId);
  let [task, events] = await Promise.all([
    api(`/v1/tasks/${enc}`), allPages(`/v1/tasks/${enc}/events`, 'events', {limit: 1000})]);
  if (!ctx.alive()) return;
  const header = taskHeader(taskId, 'timeline', () => refresh().then(() => live.ensure()));
  const host = h('div', {class: 'timeline-host', id: 'timeline'});
  const top = h('div', {class: 'tl-top'});
  const foot = h('div', {class: 'tl-foot'});
  fill(ctx.main, header.el, top, legend(), host, foot);

  const draw = () => {
    header.update(task);
    const order = Object.keys(task.nodes || {});
    const tl = deriveTimeline(events, order, nowSeconds());
    fill(top, summary(tl, task), h('p', {class: 'muted small'},
      `From ${localTime(tl.start)} to ${localTime(tl.end)} ` +
      `(${duration(tl.end - tl.start)}). Hover a bar for exact times; a node's name opens ` +
      'its panel.'));
    const width = Math.max(700, host.clientWidth || ctx.main.clientWidth || 1200);
    fill(host, renderTimeline(tl, width,
      (node) => `${paths.task(taskId)}?node=${encodeURIComponent(node)}`));
    const taskEvents = tl.taskMarkers.filter((m) => m.kind !== 'submitted');
    fill(foot,
      tl.skipped.length ? h('p', {class: 'muted', id: 'timeline-skipped'},
        `Skipped (no taken edge led there): ${tl.skipped.join(', ')}`) : null,
      taskEvents.length ? h('ul', {class: 'task-events'}, taskEvents.map((m) =>
        h('li', {}, h('span', {class: 'mono small'}, localTime(m.at)), ` ${m.kind} `,
          h('span', {class: 'muted'}, m.detail || '')))) : null);
  };

  async function refresh() {
    const after = events.length ? events[events.length - 1].seq : 0;
    const [next, more] = await Promise.all([api(`/v1/tasks/${enc}`),
      allPages(`/v1/tasks/${enc}/events`, 'events', {limit: 1000, after_seq: after})]);
    if (!ctx.alive()) return;
    task = next;
    const seen = new Set(events.map((e) => e.event_id));
    events = events.concat(more.filter((e) => !seen.has(e.event_id)));
    draw();
    if (isFinal(task)) live.stop();
  }

  const live = liveTask(ctx, taskId, refresh);
  let resizing = null;
  const onResize = () => {
    clearTimeout(resizing);
    resizing = setTimeout(() => ctx.alive() && draw(), 150);
  };
  window.addEventListener('resize', onResize);
  ctx.onCleanup(() => window.removeEventListener('resize', onResize));
  draw();
  if (!isFinal(task)) {
    live.ensure();
    // Open bars grow with the clock even when nothing happens.
    ctx.every(REDRAW_MS, () => !isFinal(task) && draw());
  }
}

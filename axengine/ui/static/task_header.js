// The header of a task's pages (graph and timeline): status, DAG, times, labels, the
// tabs, and for admins Cancel and Retry from the selected node. It also keeps a task's
// page live: a server-sent event stream while the task is not final.

import {ApiError, api, session} from './api.js';
import {badge, fieldsView, fill, h, jsonBlock, labelChips, paths, timeEl} from './dom.js';

const FINAL = ['SUCCEEDED', 'FAILED', 'DEAD', 'CANCELLED'];
const RETRYABLE = ['SUCCEEDED', 'FAILED', 'DEAD', 'CANCELLED', 'SKIPPED'];
/** While the stream is down, poll this often (ms). */
const FALLBACK_POLL_MS = 3000;

export function isFinal(task) {
  return FINAL.includes(task.status);
}

export function isAdmin() {
  return (session.current?.roles || []).includes('admin');
}

/** An inline confirmation (no window.confirm: it blocks the page and its updates). */
function confirmBox(host, {message, withReason = false, confirmLabel, onConfirm}) {
  const reason = withReason ? h('input', {type: 'text', class: 'reason', maxlength: 500,
    placeholder: 'reason (recorded with your name)', id: 'action-reason'}) : null;
  const error = h('span', {class: 'error-text', role: 'alert'});
  const ok = h('button', {type: 'button', class: 'danger', id: 'action-confirm'}, confirmLabel);
  const close = () => fill(host);
  ok.addEventListener('click', async () => {
    ok.disabled = true;
    try {
      await onConfirm(reason ? reason.value.trim() : '');
      close();
    } catch (err) {
      fill(error, err instanceof ApiError ? `${err.status}: ${err.message}` : String(err));
      ok.disabled = false;
    }
  });
  fill(host, h('div', {class: 'confirm-box'}, h('span', {}, message), reason, ok,
    h('button', {type: 'button', onclick: close}, 'Keep'), error));
  (reason || ok).focus();
}

/**
 * Build the header; returns {el, update(task), setSelected(nodeId)}.
 * `tab` is 'graph' or 'timeline'; `onChanged` runs after an admin action succeeded.
 */
export function taskHeader(taskId, tab, onChanged) {
  let task = null;
  let selected = '';
  const status = h('span', {id: 'task-status'});
  const meta = h('div', {class: 'task-meta'});
  const input = h('details', {class: 'task-input'});
  const actions = h('div', {class: 'admin-actions', id: 'admin-actions'});
  const confirmHost = h('div', {class: 'confirm-host'});
  const tabs = h('div', {class: 'tabs'},
    h('a', {href: paths.task(taskId), class: tab === 'graph' ? 'tab active' : 'tab'}, 'Graph'),
    h('a', {href: paths.timeline(taskId), class: tab === 'timeline' ? 'tab active' : 'tab'},
      'Timeline'));
  const el = h('header', {class: 'task-header'},
    h('div', {class: 'title-row'},
      h('h1', {}, h('span', {class: 'muted'}, 'Task '), h('span', {class: 'mono'}, taskId)),
      status, tabs, h('span', {class: 'spacer'}), actions),
    confirmHost, meta, input);

  const drawActions = () => {
    if (!task || !isAdmin()) {
      fill(actions);
      return;
    }
    const cancel = isFinal(task) ? null : h('button', {type: 'button', id: 'cancel-task',
      class: 'danger-outline', onclick: () => confirmBox(confirmHost, {
        message: `Cancel every unfinished node of ${taskId}?`, withReason: true,
        confirmLabel: 'Cancel task', onConfirm: async (reason) => {
          await api(`/v1/tasks/${encodeURIComponent(taskId)}/cancel`, {method: 'POST',
            body: {reason}});
          onChanged();
        }})}, 'Cancel…');
    const snap = selected ? task.nodes?.[selected] : null;
    // A map's item, a kept visit or a sub-DAG's node is retried through its node.
    const instance = /[[#/]/.test(selected);
    const canRetry = Boolean(snap && RETRYABLE.includes(snap.state)) && !instance;
    const retry = h('button', {type: 'button', id: 'retry-node', disabled: !canRetry,
      title: canRetry ? '' : instance
        ? `retry from the node ${selected.split(/[[#/]/)[0]} (it runs this one again)`
        : 'select a finished node in the graph to retry from it',
      onclick: () => confirmBox(confirmHost, {
        message: `Re-run ${selected} and everything after it?`,
        confirmLabel: `Retry from ${selected}`, onConfirm: async () => {
          await api(`/v1/tasks/${encodeURIComponent(taskId)}/retry`, {method: 'POST',
            body: {from_node: selected}});
          onChanged();
        }})}, selected ? `Retry from ${selected}…` : 'Retry from…');
    fill(actions, cancel, retry);
  };

  const update = (next) => {
    task = next;
    fill(status, badge(task.status, {'data-status': task.status, id: 'task-status-badge'}));
    status.setAttribute('data-status', task.status);
    const item = (name, value, attrs = {}) => h('span', {class: 'meta-item', ...attrs},
      h('span', {class: 'k'}, name), value);
    fill(meta,
      item('DAG', [h('a', {href: paths.dag(task.dag_hash)}, task.dag_name),
        h('span', {class: 'muted mono small'}, ` ${task.dag_hash.slice(0, 12)}`)]),
      item('Created', timeEl(task.created_at)),
      isFinal(task) ? item('Finished', timeEl(task.finished_at), {id: 'task-finished'})
        : item('Updated', timeEl(task.updated_at)),
      item('By', task.submitted_by || '—'),
      task.priority ? item('Priority', String(task.priority)) : null,
      task.deadline ? item('Deadline', timeEl(task.deadline)) : null,
      item('Labels', h('span', {id: 'task-labels'}, labelChips(task.labels))));
    if (!input.firstChild) {
      fill(input, h('summary', {}, 'Task input'), fieldsView(task.input, {id: 'task-input'}),
        h('details', {class: 'raw'}, h('summary', {}, 'as JSON'), jsonBlock(task.input)));
    }
    drawActions();
  };

  const setSelected = (id) => {
    selected = id;
    drawActions();
  };
  return {el, update, setSelected};
}

/**
 * Keep a task page live: `refresh()` on every event of the task's watch stream (coalesced),
 * until the stream says the task is final. Falls back to polling when the stream is down.
 * Returns {ensure()} to restart it after a retry made a final task run again.
 */
export function liveTask(ctx, taskId, refresh, onEvent = null) {
  let source = null;
  let poll = null;
  let pending = false;
  const kick = () => {
    if (pending) return;
    pending = true;
    // Events come in bursts (one transaction writes several); one fetch per burst.
    setTimeout(() => {
      pending = false;
      if (ctx.alive()) refresh();
    }, 120);
  };
  const stopPoll = () => {
    if (poll) clearInterval(poll);
    poll = null;
  };
  // How the page follows the task, for people debugging it (and the tests).
  const mode = (value) => { ctx.main.dataset.live = value; };
  const stop = () => {
    if (source) source.close();
    source = null;
    stopPoll();
    mode('off');
  };
  const ensure = () => {
    if (source || !ctx.alive()) return;
    source = new EventSource(`/v1/tasks/${encodeURIComponent(taskId)}/watch`);
    source.onopen = () => {
      stopPoll();
      mode('stream');
    };
    source.onmessage = (msg) => {
      if (onEvent) {
        try {
          onEvent(JSON.parse(msg.data));
        } catch {
          // a malformed event still triggers the refresh below
        }
      }
      kick();
    };
    source.addEventListener('end', () => {
      stop();
      kick();
    });
    source.onerror = () => {
      // CLOSED: the server refused (401, 404...); otherwise the browser reconnects by
      // itself with Last-Event-ID. Either way, poll until the stream is back.
      if (source && source.readyState === EventSource.CLOSED) source = null;
      if (!poll) poll = setInterval(() => ctx.alive() && refresh(), FALLBACK_POLL_MS);
      mode('polling');
    };
  };
  ctx.onCleanup(stop);
  return {ensure, stop};
}

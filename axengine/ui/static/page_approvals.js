// The approvals inbox: every gate waiting for a decision, across tasks. Approve or reject
// with a comment; "approve with edits" replaces the data the gate passes on (the JSON is
// checked here first: invalid JSON sends nothing).

import {ApiError, allPages, api, hasRole} from './api.js';
import {fieldsView, fill, h, jsonBlock, paths, timeEl} from './dom.js';

const REFRESH_MS = 4000;

const keyOf = (a) => `${a.task_id}\u0000${a.node_id}`;

export async function render(ctx) {
  const canDecide = hasRole('approve');
  const flash = h('div', {class: 'flash', id: 'inbox-flash', role: 'status', hidden: true});
  const list = h('div', {class: 'approvals', id: 'approvals'});
  const empty = h('p', {class: 'muted empty', id: 'inbox-empty', hidden: true},
    'No gate is waiting for a decision.');
  const error = h('div', {class: 'error-banner', role: 'alert', hidden: true});
  fill(ctx.main,
    h('div', {class: 'page-head'}, h('h1', {}, 'Approvals'),
      h('span', {class: 'muted'}, canDecide ? 'Gates waiting for your decision.'
        : 'Gates waiting for a decision (your token cannot decide: it needs the approve ' +
          'role).')),
    flash, error, list, empty);

  const cards = new Map();  // key -> {el, dirty()}

  const say = (text) => {
    fill(flash, text);
    flash.hidden = false;
  };

  const card = (a) => {
    const cardError = h('div', {class: 'error-text', role: 'alert'});
    const comment = h('textarea', {class: 'comment', rows: 2, maxlength: 2000,
      placeholder: 'Comment (recorded with your decision)', 'aria-label': 'comment'});
    const edits = h('textarea', {class: 'edits mono', rows: 10, spellcheck: 'false',
      'aria-label': 'data the gate passes on (JSON)'});
    edits.value = JSON.stringify(a.input ?? null, null, 2);
    const original = edits.value;
    const editsError = h('div', {class: 'error-text edits-error', role: 'alert'});
    const editor = h('div', {class: 'editor', hidden: true},
      h('label', {}, 'Data the gate passes on, as JSON (it replaces the input shown above ' +
        'for the next node):'), edits, editsError,
      h('button', {type: 'button', class: 'primary approve-edits',
        onclick: () => decide('approve', true)}, 'Approve with these edits'));
    const buttons = [];
    const decide = async (decision, withEdits = false) => {
      fill(cardError);
      fill(editsError);
      const body = {decision, comment: comment.value};
      if (withEdits) {
        try {
          body.data = JSON.parse(edits.value);
        } catch (err) {
          fill(editsError, `Not valid JSON: ${err.message}. Nothing was sent.`);
          return;
        }
      }
      buttons.forEach((b) => { b.disabled = true; });
      try {
        await api(`/v1/tasks/${encodeURIComponent(a.task_id)}/nodes/` +
          `${encodeURIComponent(a.node_id)}/decision`, {method: 'POST', body});
        el.remove();
        cards.delete(keyOf(a));
        empty.hidden = cards.size > 0;
        const verb = decision === 'approve' ? 'Approved' : 'Rejected';
        say(`${verb} ${a.node_id} of task ${a.task_id}${withEdits ? ' with edits' : ''}.`);
        ctx.refreshBadge();
      } catch (err) {
        fill(cardError, err instanceof ApiError ? `${err.status} ${err.type}: ${err.message}`
          : String(err));
        buttons.forEach((b) => { b.disabled = false; });
      }
    };
    const approve = h('button', {type: 'button', class: 'primary approve',
      onclick: () => decide('approve')}, 'Approve');
    const reject = h('button', {type: 'button', class: 'danger-outline reject',
      onclick: () => decide('reject')}, 'Reject');
    const toggle = h('button', {type: 'button', class: 'edit-toggle', onclick: () => {
      editor.hidden = !editor.hidden;
      toggle.textContent = editor.hidden ? 'Approve with edits…' : 'Hide edits';
      if (!editor.hidden) edits.focus();
    }}, 'Approve with edits…');
    buttons.push(approve, reject, toggle, editor.querySelector('button'));
    const el = h('article', {class: 'approval', 'data-task': a.task_id, 'data-node': a.node_id},
      h('header', {},
        h('span', {class: 'mono gate-name'}, a.node_id),
        h('span', {class: 'muted'}, ' in '),
        h('a', {href: `${paths.task(a.task_id)}?node=${encodeURIComponent(a.node_id)}`,
          class: 'mono'}, a.task_id),
        h('span', {class: 'muted'}, ` · ${a.dag_name}`),
        a.submitted_by ? h('span', {class: 'muted'}, ` · submitted by ${a.submitted_by}`) : null),
      h('p', {class: 'description'}, a.description || h('span', {class: 'muted'},
        '(no description)')),
      h('div', {class: 'approval-grid'},
        h('div', {}, h('h3', {}, 'Input'), fieldsView(a.input, {'data-field': 'input'}),
          h('details', {class: 'raw'}, h('summary', {}, 'as JSON'),
            jsonBlock(a.input, {class: 'json gate-input'}))),
        h('dl', {class: 'facts'},
          h('dt', {}, 'Waiting since'), h('dd', {}, timeEl(a.waiting_since)),
          h('dt', {}, 'Deadline'), h('dd', {}, a.gate_until ? timeEl(a.gate_until)
            : h('span', {class: 'muted'}, 'none')))),
      canDecide ? h('div', {class: 'decide'}, comment,
        h('div', {class: 'buttons'}, approve, reject, toggle), editor, cardError) : null);
    return {el, dirty: () => Boolean(comment.value) || edits.value !== original ||
      el.contains(document.activeElement)};
  };

  const load = async () => {
    let found;
    try {
      found = await allPages('/v1/approvals', 'approvals', {limit: 100});
      error.hidden = true;
    } catch (err) {
      fill(error, `Could not load the approvals: ${err.message}`);
      error.hidden = false;
      return;
    }
    if (!ctx.alive()) return;
    const keys = new Set(found.map(keyOf));
    for (const [key, c] of cards) {
      if (!keys.has(key) && !c.dirty()) {
        c.el.remove();
        cards.delete(key);
      }
    }
    // Newest first, as the server lists them; a new card goes before the next known one.
    let before = null;
    for (const a of [...found].reverse()) {
      const key = keyOf(a);
      if (!cards.has(key)) {
        cards.set(key, card(a));
        list.insertBefore(cards.get(key).el, before);
      }
      before = cards.get(key).el;
    }
    empty.hidden = cards.size > 0;
  };

  await load();
  ctx.every(REFRESH_MS, load);
}

// The ax web UI: a single page with History API routing under /ui/.
//
//   /ui/                        tasks (filters in the query string)
//   /ui/tasks/<id>[?node=<n>]   a task: graph, node panel, admin actions
//   /ui/tasks/<id>/timeline     where the time went, per node attempt
//   /ui/approvals               gates waiting for a decision
//   /ui/dags, /ui/dags/<hash>   stored DAG versions
//   /ui/login                   token sign-in
//
// Each page is a module exporting render(ctx); ctx.every() polls while the page is shown
// and the tab visible, ctx.onCleanup() runs when the page is left.

import {ApiError, api, loadSession, logout, session,
  setUnauthorizedHandler} from './api.js';
import {fill, h, paths} from './dom.js';
import * as approvalsPage from './page_approvals.js';
import * as dagsPage from './page_dags.js';
import * as loginPage from './page_login.js';
import * as taskPage from './page_task.js';
import * as tasksPage from './page_tasks.js';
import * as timelinePage from './page_timeline.js';

const ROUTES = [
  [/^\/ui\/?$/, tasksPage.render, 'tasks'],
  [/^\/ui\/tasks\/([^/]+)\/timeline\/?$/, timelinePage.render, 'tasks'],
  [/^\/ui\/tasks\/([^/]+)\/?$/, taskPage.render, 'tasks'],
  [/^\/ui\/approvals\/?$/, approvalsPage.render, 'approvals'],
  [/^\/ui\/dags\/?$/, dagsPage.renderList, 'dags'],
  [/^\/ui\/dags\/([^/]+)\/?$/, dagsPage.renderOne, 'dags'],
  [/^\/ui\/login\/?$/, loginPage.render, 'login'],
];

/** Seconds between refreshes of the approvals badge. */
const BADGE_EVERY = 5000;

let current = null;  // the page shown: {cleanups: [], alive: bool}

const nav = {root: null, links: {}, badge: null, who: null, signOut: null};

function buildNav() {
  const link = (key, href, text, extra) => {
    nav.links[key] = h('a', {href, class: 'nav-link', 'data-nav': key}, text, extra);
    return nav.links[key];
  };
  nav.badge = h('span', {class: 'count-badge', id: 'approvals-badge', hidden: true}, '0');
  nav.who = h('span', {class: 'who', id: 'who'});
  nav.signOut = h('button', {type: 'button', class: 'link-button', id: 'sign-out',
    onclick: signOut}, 'Sign out');
  nav.root = h('nav', {class: 'top'},
    h('a', {href: paths.tasks(), class: 'brand'}, h('img', {src: '/ui/static/icon.svg',
      alt: '', width: 20, height: 20}), 'ax'),
    link('tasks', paths.tasks(), 'Tasks'),
    link('approvals', paths.approvals(), 'Approvals', nav.badge),
    link('dags', paths.dags(), 'DAGs'),
    h('span', {class: 'spacer'}),
    nav.who, nav.signOut);
  fill(document.getElementById('top'), nav.root);
}

function updateNav(active) {
  for (const [key, el] of Object.entries(nav.links)) {
    el.classList.toggle('active', key === active);
  }
  const s = session.current;
  const signedIn = Boolean(s);
  nav.root.classList.toggle('signed-out', !signedIn);
  fill(nav.who, signedIn ? [h('span', {class: 'who-name'}, s.name),
    h('span', {class: 'who-roles'}, (s.roles || []).join(', '))] : []);
  nav.signOut.hidden = !signedIn || s.auth === false;
}

/** Refresh the count of waiting gates in the nav (also called after a decision). */
async function refreshBadge() {
  if (!session.current) return;
  try {
    const page = await api('/v1/approvals', {query: {limit: 100}});
    const n = (page.approvals || []).length;
    nav.badge.textContent = page.next_page_token ? `${n}+` : String(n);
    nav.badge.hidden = n === 0;
  } catch {
    // The badge is a hint; the inbox itself reports errors.
  }
}

async function signOut() {
  try {
    await logout();
  } finally {
    navigate(paths.login(), {replace: true});
  }
}

function showError(main, err) {
  const message = err instanceof ApiError ? `${err.status} ${err.type}: ${err.message}`
    : String(err?.message || err);
  fill(main, h('div', {class: 'error-banner', role: 'alert'}, message));
}

/** Show `url` (a path under /ui/ with its query), pushing it onto the history. */
/** A path segment decoded (a malformed escape is kept as it is: the page says not found). */
function decoded(segment) {
  try {
    return decodeURIComponent(segment);
  } catch {
    return segment;
  }
}

function navigate(url, {replace = false} = {}) {
  if (replace) history.replaceState(null, '', url);
  else history.pushState(null, '', url);
  route();
}

async function route() {
  if (current) {
    current.alive = false;
    for (const fn of current.cleanups) fn();
  }
  const page = {cleanups: [], alive: true};
  current = page;
  const {pathname, search} = window.location;
  const main = document.getElementById('main');
  delete main.dataset.live;
  const found = ROUTES.map(([re, render, key]) => [re.exec(pathname), render, key])
    .find(([m]) => m);
  if (!found) {
    updateNav('');
    fill(main, h('div', {class: 'error-banner'}, `No page at ${pathname}.`));
    return;
  }
  const [match, render, key] = found;
  if (key !== 'login' && !session.current) {
    navigate(`${paths.login()}?next=${encodeURIComponent(pathname + search)}`, {replace: true});
    return;
  }
  updateNav(key);
  const ctx = {
    main,
    params: match.slice(1).map(decoded),
    query: new URLSearchParams(search),
    navigate,
    alive: () => page.alive,
    onCleanup: (fn) => page.cleanups.push(fn),
    every(ms, fn) {
      const timer = setInterval(() => {
        if (page.alive && document.visibilityState === 'visible') fn();
      }, ms);
      page.cleanups.push(() => clearInterval(timer));
    },
    refreshBadge,
    afterSignIn: () => {
      updateNav('');
      refreshBadge();
    },
  };
  fill(main, h('div', {class: 'loading'}, 'Loading…'));
  try {
    await render(ctx);
  } catch (err) {
    if (page.alive) showError(main, err);
  }
}

function onClick(ev) {
  if (ev.defaultPrevented || ev.button !== 0 || ev.metaKey || ev.ctrlKey || ev.shiftKey ||
      ev.altKey) return;
  const a = ev.target.closest('a');
  // getAttribute: an SVG <a> (timeline rows) has an object as its `target` property.
  if (!a || a.getAttribute('target') || a.hasAttribute('download')) return;
  const href = a.getAttribute('href') ?? a.getAttribute('xlink:href');
  if (!href) return;
  const url = new URL(href, window.location.href);
  if (url.origin !== window.location.origin || !url.pathname.startsWith('/ui/') ||
      url.pathname.startsWith('/ui/static/')) return;
  ev.preventDefault();
  navigate(url.pathname + url.search);
}

async function start() {
  buildNav();
  setUnauthorizedHandler(() => {
    session.current = null;
    const {pathname, search} = window.location;
    if (!pathname.startsWith(paths.login())) {
      navigate(`${paths.login()}?next=${encodeURIComponent(pathname + search)}`,
        {replace: true});
    }
  });
  document.addEventListener('click', onClick);
  window.addEventListener('popstate', route);
  document.addEventListener('visibilitychange', () => {
    if (document.visibilityState === 'visible') refreshBadge();
  });
  try {
    await loadSession();
  } catch (err) {
    showError(document.getElementById('main'), err);
    return;
  }
  setInterval(() => {
    if (document.visibilityState === 'visible') refreshBadge();
  }, BADGE_EVERY);
  refreshBadge();
  await route();
}

start();

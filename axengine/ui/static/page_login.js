// Sign-in: the token goes to POST /ui/login once; from then on an HttpOnly cookie (which
// this page cannot read) authenticates, and the CSRF token from the answer signs POSTs.

import {ApiError, login, session} from './api.js';
import {fill, h, paths} from './dom.js';

/** Where to go after signing in: a /ui/ path only (never another site). */
function nextPath(query) {
  const next = query.get('next') || '';
  return /^\/ui\/(?!\/)/.test(next) && !next.startsWith(paths.login()) ? next : paths.tasks();
}

export async function render(ctx) {
  const next = nextPath(ctx.query);
  if (session.current) {
    ctx.navigate(next, {replace: true});
    return;
  }
  const token = h('input', {type: 'password', id: 'token', name: 'token', required: true,
    autocomplete: 'current-password', spellcheck: 'false', autofocus: true});
  const error = h('div', {class: 'error-banner', id: 'login-error', role: 'alert', hidden: true});
  const button = h('button', {type: 'submit', class: 'primary', id: 'sign-in'}, 'Sign in');
  const form = h('form', {class: 'login-form', id: 'login-form', novalidate: true},
    h('h1', {}, 'Sign in to ax'),
    h('p', {class: 'muted'}, 'Use an API token of this server’s tokens file. Your roles ' +
      'are the token’s roles.'),
    h('label', {for: 'token'}, 'Token'), token, error, button);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    error.hidden = true;
    if (!token.value.trim()) {
      fill(error, 'Enter a token.');
      error.hidden = false;
      return;
    }
    button.disabled = true;
    try {
      await login(token.value.trim());
      token.value = '';
      ctx.afterSignIn();
      ctx.navigate(next, {replace: true});
    } catch (err) {
      const text = err instanceof ApiError && err.status === 401
        ? 'This token is not known to the server.' : `Sign-in failed: ${err.message}`;
      fill(error, text);
      error.hidden = false;
    } finally {
      button.disabled = false;
    }
  });
  fill(ctx.main, h('div', {class: 'login-page'}, form));
  token.focus();
}

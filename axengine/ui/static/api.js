// The server, as the pages see it: the session (name, roles, CSRF token) and JSON calls.
//
// Authentication is the HttpOnly cookie the server set at sign-in; the page never sees
// the token. Every state-changing call carries X-CSRF-Token, which the server checks
// against the session (a cross-site form or fetch cannot read it, so cannot send it).

export class ApiError extends Error {
  constructor(status, type, message) {
    super(message);
    this.status = status;
    this.type = type;
  }
}

/** The signed-in principal: {name, roles, csrf, auth}, or null before sign-in. */
export const session = {current: null};

export function hasRole(role) {
  const roles = session.current?.roles || [];
  return roles.includes(role) || roles.includes('admin');
}

async function parse(response) {
  const text = await response.text();
  let body = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    body = null;
  }
  if (!response.ok) {
    const error = body?.error;
    throw new ApiError(response.status, error?.type || `HTTP ${response.status}`,
      error?.message || text.slice(0, 300) || response.statusText);
  }
  return body;
}

/** Called on a 401 from a /v1 route (the cookie expired or was revoked). */
let onUnauthorized = () => {};

export function setUnauthorizedHandler(fn) {
  onUnauthorized = fn;
}

/**
 * A JSON call. `query` values may be arrays (repeated parameters); empty values are left
 * out. POSTs send `body` as JSON with the CSRF header.
 */
export async function api(path, {method = 'GET', query = null, body = undefined} = {}) {
  const url = new URL(path, window.location.origin);
  for (const [key, value] of Object.entries(query || {})) {
    for (const v of Array.isArray(value) ? value : [value]) {
      if (v !== '' && v !== null && v !== undefined) url.searchParams.append(key, String(v));
    }
  }
  const headers = {Accept: 'application/json'};
  const init = {method, credentials: 'same-origin', headers};
  if (method !== 'GET') {
    headers['X-CSRF-Token'] = session.current?.csrf || '';
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body === undefined ? {} : body);
  }
  const response = await fetch(url, init);
  if (response.status === 401 && path.startsWith('/v1/')) onUnauthorized();
  return parse(response);
}

/** GET /ui/session: the current session, or null when not signed in. */
export async function loadSession() {
  try {
    session.current = await api('/ui/session');
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) {
      session.current = null;
    } else {
      throw err;
    }
  }
  return session.current;
}

export async function login(token) {
  session.current = await api('/ui/login', {method: 'POST', body: {token}});
  return session.current;
}

export async function logout() {
  try {
    await api('/ui/logout', {method: 'POST', body: {}});
  } finally {
    session.current = null;
  }
}

/** Every page of a paged list route: `key` names the list in each answer. */
export async function allPages(path, key, query = {}) {
  const items = [];
  let token = '';
  do {
    const page = await api(path, {query: {...query, page_token: token}});
    items.push(...(page[key] || []));
    token = page.next_page_token || '';
  } while (token);
  return items;
}

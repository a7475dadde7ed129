// The admin token (from the link the server writes beside its store, /ui#token=..., or the login form) and the data requests.

const TOKEN_KEY = "otel-rl-token";

export class Unauthorized extends Error {}

// A `#token=...` fragment is moved into the tab's session storage at once: the address bar, the history and
// every link the page makes then hold no secret. `#token=...&route=/rollout/ID` opens that page after it: a
// link to any page can carry the token (the route stays a fragment of this page, never another address).
export function takeTokenFromLocation() {
  const match = location.hash.match(/^#token=([^&/]+)(?:&route=(.*))?$/);
  if (!match) return;
  sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(match[1]));
  const route = match[2] ? decodeURIComponent(match[2]) : "/rollouts";
  history.replaceState(null, "", `${location.pathname}#${route.startsWith("/") ? route : "/rollouts"}`);
}

export const token = () => sessionStorage.getItem(TOKEN_KEY);
export const setToken = (value) => sessionStorage.setItem(TOKEN_KEY, value);
export const forgetToken = () => sessionStorage.removeItem(TOKEN_KEY);

async function request(path, options = {}) {
  const headers = { Authorization: `Bearer ${token() || ""}`, ...(options.headers || {}) };
  const response = await fetch(path, { ...options, headers });
  if (response.status === 401 || response.status === 403) throw new Unauthorized(await detail(response));
  if (!response.ok) throw new Error(`${response.status}: ${await detail(response)}`);
  return response;
}

async function detail(response) {
  const text = await response.text();
  try {
    const body = JSON.parse(text);
    return typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail);
  } catch {
    return text;
  }
}

export async function getJSON(path) {
  return (await request(path)).json();
}

// The SQL box: one read-only statement through the server's sandboxed /v1/query endpoint.
export async function runSQL(sql) {
  const response = await request("/v1/query", {
    method: "POST",
    headers: { "Content-Type": "application/json", Accept: "application/json" },
    body: JSON.stringify({ sql }),
  });
  return response.json();
}

// A download needs the bearer header, which a plain link cannot send: fetch, then save the blob.
export async function download(path, format) {
  const url = `${path}${path.includes("?") ? "&" : "?"}format=${format}`;
  const response = await request(url);
  const name = (response.headers.get("Content-Disposition") || "").match(/filename="([^"]+)"/);
  const link = document.createElement("a");
  link.href = URL.createObjectURL(await response.blob());
  link.download = name ? name[1] : `data.${format}`;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 10_000);
}

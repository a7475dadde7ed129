// The web view: hash routes (#/rollouts, #/rollout/ID, #/sample/ID, #/training), each page linkable.

import { Unauthorized, forgetToken, setToken, takeTokenFromLocation, token } from "./api.js";
import { el } from "./dom.js";
import { rolloutPage } from "./rollout.js";
import { rolloutsPage } from "./rollouts.js";
import { samplePage } from "./sample.js";
import { trainingPage } from "./training.js";

const PAGES = { rollouts: rolloutsPage, rollout: rolloutPage, sample: samplePage, training: trainingPage };
let stopPage = null; // what the current page runs in the background (the training page's polling)

function parseRoute() {
  const [path, query = ""] = location.hash.replace(/^#\/?/, "").split("?");
  const [name, ...rest] = path.split("/");
  return { name: name || "rollouts", id: rest.map(decodeURIComponent).join("/"), params: new URLSearchParams(query) };
}

function login(main, message) {
  const input = el("input", { type: "password", name: "token", autocomplete: "current-password", required: true });
  const form = el(
    "form",
    // The route stays in the address bar while the form shows: a shared #/rollout/ID opens after the login.
    { class: "login", onsubmit: (event) => { event.preventDefault(); setToken(input.value.trim()); route(); } },
    el("h1", {}, "admin token"),
    el("p", { class: "muted" }, "Open the link `otel-rl serve` wrote beside its store (<store>.ui-link, …/ui#token=…), or paste the admin token (.otel_rl/token)."),
    message ? el("p", { class: "error" }, message) : null,
    input,
    el("button", { type: "submit" }, "open"),
  );
  main.replaceChildren(form);
  input.focus();
}

async function route() {
  if (stopPage) stopPage();
  stopPage = null;
  const main = document.getElementById("page");
  document.getElementById("logout").hidden = !token();
  if (!token()) return login(main);
  const { name, id, params } = parseRoute();
  const page = PAGES[name];
  if (!page) {
    main.replaceChildren(el("p", { class: "error" }, `no page ${name}: see the links above`));
    return;
  }
  const rendering = location.hash;
  document.body.dataset.rendered = "";
  try {
    stopPage = (await page(main, id, params)) || null;
    document.body.dataset.rendered = rendering; // what tests (and scripts) wait for: this route is drawn
  } catch (error) {
    if (error instanceof Unauthorized) {
      forgetToken();
      return login(main, `the server refused the token: ${error.message}`);
    }
    main.replaceChildren(el("p", { class: "error", role: "alert" }, String(error.message || error)));
  }
}

takeTokenFromLocation();
document.getElementById("logout").addEventListener("click", () => { forgetToken(); route(); });
window.addEventListener("hashchange", route);
route();

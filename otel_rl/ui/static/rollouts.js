// The rollouts page: a filterable table of every rollout, and a SQL box over the store.

import { getJSON, runSQL } from "./api.js";
import { display, downloads, el, section, shortId, table, time } from "./dom.js";

const FILTERS = [
  ["split", "text", "train, val"],
  ["status", "text", "ok, error, timeout…"],
  ["min_reward", "number", "≥"],
  ["max_reward", "number", "≤"],
  ["group", "text", "group id"],
  ["task", "text", "task id"],
  ["harness", "text", "service.name"],
  ["since", "datetime-local", ""],
  ["until", "datetime-local", ""],
  ["flagged", "checkbox", ""], // flagged by any hack detector (hack_flags)
  ["detector", "text", "test_tampering…"],
];
const COLUMNS = ["rollout", "split", "status", "reward", "flagged", "group", "task", "started", "ms", "calls", "errors", "harness", "versions"];
const EXAMPLE_SQL = "SELECT split, status, count(*) AS rollouts, avg(outcome_reward) AS reward FROM rollouts GROUP BY ALL ORDER BY ALL";

function cell(row, column) {
  switch (column) {
    case "rollout": return el("a", { href: `#/rollout/${encodeURIComponent(row.rollout_id)}`, title: row.rollout_id }, shortId(row.rollout_id));
    case "reward": return row.outcome_reward;
    // the hack detectors that flagged it, each a link to the rollouts it flagged
    case "flagged": return row.hack_detectors ? el("span", { class: "flagged" }, row.hack_detectors.flatMap((d, i) =>
      [i ? ", " : null, el("a", { href: `#/rollouts?detector=${encodeURIComponent(d)}` }, d)])) : null;
    case "group": return shortId(row.group_id);
    case "task": return shortId(row.task_id);
    case "started": return time(row.started_ms);
    case "ms": return row.duration_ms === null ? null : Math.round(row.duration_ms);
    case "calls": return row.n_calls;
    case "errors": return row.n_error_calls;
    case "harness": return row.service_name;
    case "versions": return row.policy_version_min === null ? null : `${row.policy_version_min}–${row.policy_version_max}`;
    default: return row[column];
  }
}

function apiQuery(params) {
  const query = new URLSearchParams();
  for (const [name, type] of FILTERS) {
    const value = params.get(name);
    if (!value) continue;
    query.set(name, type === "datetime-local" ? new Date(value).toISOString() : type === "checkbox" ? "true" : value);
  }
  query.set("limit", params.get("limit") || "200");
  query.set("offset", params.get("offset") || "0");
  return query;
}

export async function rolloutsPage(main, _id, params) {
  const form = el("form", { class: "filters", onsubmit: (event) => {
    event.preventDefault();
    const next = new URLSearchParams();
    for (const [name, value] of new FormData(form)) if (value) next.set(name, value);
    location.hash = `#/rollouts?${next}`;
  } });
  for (const [name, type, placeholder] of FILTERS) {
    const step = type === "number" ? "any" : null;
    const input = type === "checkbox" ? { checked: params.has(name) } : { placeholder, step, value: params.get(name) || "" };
    form.append(el("label", {}, name, el("input", { name, type, ...input })));
  }
  form.append(el("button", { type: "submit" }, "filter"), el("a", { href: "#/rollouts" }, "clear"));

  const path = `/ui/api/rollouts?${apiQuery(params)}`;
  const result = await getJSON(path);
  const offset = Number(params.get("offset") || 0);
  const pager = el("p", { class: "muted" }, `${result.rows.length} rollouts from ${offset + 1}`);
  if (result.more) {
    const next = new URLSearchParams(params);
    next.set("offset", String(offset + result.rows.length));
    pager.append(" · ", el("a", { href: `#/rollouts?${next}` }, "more"));
  }
  main.replaceChildren(
    section("rollouts", form, el("div", { class: "toolbar" }, pager, downloads(path)),
      el("div", { class: "scroll", id: "rollouts-table" }, table(COLUMNS, result.rows, cell))),
    sqlBox(),
  );
}

function sqlBox() {
  const input = el("textarea", { name: "sql", rows: 4, spellcheck: "false" }, EXAMPLE_SQL);
  const output = el("div", { class: "scroll", id: "sql-result" });
  const form = el("form", { class: "sql", onsubmit: async (event) => {
    event.preventDefault();
    output.replaceChildren(el("p", { class: "muted" }, "running…"));
    try {
      const rows = await runSQL(input.value);
      const columns = rows.length ? Object.keys(rows[0]) : [];
      output.replaceChildren(el("p", { class: "muted" }, `${rows.length} row(s)`), table(columns, rows, (r, c) => display(r[c])));
    } catch (error) {
      output.replaceChildren(el("p", { class: "error", role: "alert" }, String(error.message || error)));
    }
  } }, input, el("button", { type: "submit" }, "run"));
  return section("SQL (read-only, sandboxed: the views of docs/views.md)", form, output);
}

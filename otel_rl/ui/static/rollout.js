// A rollout: its timeline (model calls, tool calls, agent steps, rewards, errors, policy versions), the
// messages of each call and its token usage.

import { getJSON } from "./api.js";
import { COLORS, svg } from "./charts.js";
import { display, el, section, shortId, table, time } from "./dom.js";

const LANES = ["agent steps", "model calls", "tool calls", "rewards"];
const WIDTH = 900;
const LANE = 26;

function timeline(rollout, calls, tools, steps, rewards, flagged) {
  const times = [rollout.started_ms, ...calls.flatMap((c) => [c.started_ms, c.ended_ms]),
    ...tools.flatMap((t) => [t.started_ms, t.ended_ms]),
    ...steps.flatMap((s) => [s.started_ms, s.ended_ms]), ...rewards.map((r) => r.time_ms)].filter(Number.isFinite);
  const start = Math.min(...times);
  const span = Math.max(Math.max(...times) - start, 1);
  const left = 96;
  const x = (ms) => left + ((ms - start) / span) * (WIDTH - left - 10);
  const root = svg("svg", { viewBox: `0 0 ${WIDTH} ${LANE * LANES.length + 24}`, class: "timeline", role: "img" });
  LANES.forEach((name, i) => root.append(svg("text", { x: 4, y: i * LANE + 17, class: "label" }, name)));
  const bar = (lane, from, to, color, title, className) => {
    const rect = svg("rect", { x: x(from), y: lane * LANE + 4, width: Math.max(2, x(to) - x(from)), height: LANE - 8, fill: color, class: className });
    rect.append(svg("title", {}, title));
    root.append(rect);
  };
  for (const step of steps) bar(0, step.started_ms, step.ended_ms, "#94a3b8", `${step.kind} ${step.agent_name || step.name}`, "step");
  calls.forEach((call, i) => {
    const color = call.is_error ? COLORS[1] : COLORS[0];
    const title = `call ${i + 1}: ${call.response_model || call.request_model || ""} v${call.policy_version ?? "?"}` +
      ` ${call.input_tokens ?? "?"}→${call.output_tokens ?? "?"} tokens${call.is_error ? ` error ${call.error_type || ""}` : ""}`;
    bar(1, call.started_ms, call.ended_ms, color, title, "call");
    if (call.policy_version !== null) {
      root.append(svg("text", { x: x(call.started_ms) + 2, y: 2 * LANE - 8, class: "version" }, `v${call.policy_version}`));
    }
  });
  const askedBy = new Map(calls.map((call) => [call.span_id, call]));
  for (const tool of tools) {
    const title = `${tool.name}(${tool.arguments ?? ""}) → ${tool.result ?? "?"}`;
    const hack = flagged.get(toolKey(tool));
    const [color, className] = hack ? [COLORS[1], "tool flagged"] : [COLORS[4], "tool"];
    const shown = hack ? `flagged (${hack.join(", ")}): ${title}` : title;
    if (Number.isFinite(tool.started_ms)) bar(2, tool.started_ms, tool.ended_ms, color, shown, className);
    else if (askedBy.has(tool.span_id)) { // no tool span recorded: marked where the call that asked ended
      const at = askedBy.get(tool.span_id).ended_ms;
      bar(2, at, at, color, `${shown} (no tool span)`, className);
    }
  }
  for (const reward of rewards) {
    const dot = svg("circle", { cx: x(reward.time_ms), cy: 3 * LANE + LANE / 2, r: 6, fill: COLORS[2], class: "reward" });
    dot.append(svg("title", {}, `${reward.level} ${reward.name} = ${reward.value} (${reward.source || "no source"})`));
    root.append(dot);
  }
  root.append(svg("text", { x: left, y: LANE * LANES.length + 18, class: "tick" }, time(start)));
  root.append(svg("text", { x: WIDTH - 10, y: LANE * LANES.length + 18, "text-anchor": "end", class: "tick" }, `+${(span / 1000).toFixed(2)} s`));
  return root;
}

function parsed(json) {
  if (json === null || json === undefined) return null;
  try {
    return typeof json === "string" ? JSON.parse(json) : json;
  } catch {
    return null;
  }
}

function messages(list, title) {
  const items = parsed(list);
  if (!items) return el("p", { class: "muted" }, `${title}: not recorded`);
  return el("div", { class: "messages" }, el("h4", {}, title), items.map((m) => el(
    "div", { class: `message role-${m.role}` },
    el("span", { class: "role" }, m.role),
    m.content !== null && m.content !== undefined ? el("pre", {}, String(m.content)) : null,
    m.reasoning ? el("pre", { class: "reasoning" }, `reasoning: ${m.reasoning}`) : null,
    (m.tool_calls || []).map((t) => el("pre", { class: "tool-call" }, `→ ${t.name}(${t.arguments})`)),
    m.finish_reason ? el("span", { class: "muted" }, ` finish: ${m.finish_reason}`) : null,
  )));
}

// A tool call as the detectors name it (tool_call_texts: its call id, else its span; the asking call's span).
const toolKey = (tool) => `${tool.tool_call_id ?? tool.span_id ?? tool.tool_span_id}/${tool.span_id ?? tool.tool_span_id}`;

// The hack detectors' evidence (the `detections` view): each detector, what it matched, the tool call that
// showed it and a link that opens the model call that asked for it (or names the span that holds it).
function hackFlags(detections, calls) {
  const cards = new Map(calls.map((call, i) => [call.span_id, i]));
  const where = (d) => {
    if (!cards.has(d.span_id)) return `span ${shortId(d.span_id)}`;
    const index = cards.get(d.span_id);
    return el("button", { type: "button", class: "link", "data-call": index, onclick: () => {
      const card = document.querySelectorAll("#calls details.call")[index];
      card.open = true;
      card.scrollIntoView();
    } }, `call ${index + 1}`);
  };
  const rows = detections.map((d) => ({ ...d, tool: d.tool_name, where: where(d) }));
  return el("div", { id: "hack-flags" }, table(["detector", "evidence", "tool", "arguments", "where"], rows));
}

function callCard(call, index, tools) {
  const own = tools.filter((t) => t.span_id === call.span_id);
  const usage = `${call.input_tokens ?? "?"} in → ${call.output_tokens ?? "?"} out` +
    (call.cache_read_tokens ? ` (${call.cache_read_tokens} cached)` : "");
  return el(
    "details", { class: `call${call.is_error ? " failed" : ""}`, open: index === 0 },
    el("summary", {}, `call ${index + 1} · ${call.response_model || call.request_model || call.dialect} · policy v${call.policy_version ?? "–"} · ${usage} tokens · ${Math.round(call.duration_ms ?? 0)} ms`,
      call.is_error ? el("span", { class: "error" }, ` error ${call.error_type || ""}`) : null),
    messages(call.input_messages, "input"),
    messages(call.output_messages, "output"),
    own.length ? el("div", {}, el("h4", {}, "tool calls"), table(["name", "arguments", "result"], own)) : null,
  );
}

function bySource(rewards) {
  return rewards ? Object.entries(rewards).map(([source, value]) => `${source}: ${value}`).join(", ") : null;
}

// Every outcome reward of the rollout under every name, a row per name and source: a framework's evaluation
// under its own name beside `outcome`; `trusted` is the value training uses when configured with that name.
function byName(rewards) {
  const rows = Object.entries(rewards || {}).flatMap(([name, { trusted, sources }]) =>
    sources.map((s) => ({ name, trusted, source: s.source, value: s.value, vouched: s.vouched })));
  return rows.length ? el("div", { id: "rewards-by-name" }, table(["name", "trusted", "source", "value", "vouched"], rows)) : null;
}

// Which reward `reward` is: the one the rollout's training run trains on (its `reward` settings, as the
// trainer reported them), else training's default.
function rewardSpec(spec) {
  if (!spec) return null;
  const run = spec.run_id ? `run ${spec.run_id}` : "training's default";
  return `${spec.name} from ${spec.trusted_sources.join(", ")}, rule ${spec.rule} (${run})`;
}

export async function rolloutPage(main, id) {
  const data = await getJSON(`/ui/api/rollouts/${encodeURIComponent(id)}`);
  const r = data.rollout;
  const facts = [
    // the trusted reward training uses (a grader's by default), which one that is, then every source's latest:
    // a harness's self-report shows beside it
    ["status", r.status], ["reward", r.outcome_reward], ["reward spec", rewardSpec(r.outcome_reward_spec)],
    ["reward by source", bySource(r.outcome_rewards_by_source)],
    ["rewards by name", byName(r.outcome_rewards_by_name)],
    ["split", r.split], ["group", r.group_id], ["task", r.task_id],
    ["harness", r.service_name], ["attempt", r.attempt_id], ["exit code", r.exit_code], ["started", time(r.started_ms)],
    ["calls", `${r.n_calls} (${r.n_error_calls} failed)`], ["policy versions", r.policy_version_min === null ? null : `${r.policy_version_min}–${r.policy_version_max}`],
  ];
  const flagged = new Map();
  for (const d of data.detections) {
    const key = `${d.evidence_id}/${d.span_id}`;
    flagged.set(key, [...new Set([...(flagged.get(key) || []), d.detector])]);
  }
  main.replaceChildren(
    section(`rollout ${shortId(r.rollout_id)}`,
      el("p", {}, el("a", { href: `#/sample/${encodeURIComponent(r.rollout_id)}`, id: "inspect" }, "inspect its training samples (token masks)"),
        " · ", r.group_id ? el("a", { href: `#/rollouts?group=${encodeURIComponent(r.group_id)}` }, "its group") : null),
      el("dl", { class: "facts" }, facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, display(v))])),
      timeline(r, data.calls, data.tools, data.steps, data.rewards, flagged)),
    data.detections.length ? section(`hack flags (${new Set(data.detections.map((d) => d.detector)).size})`,
      hackFlags(data.detections, data.calls)) : el("span"),
    section(`model calls (${data.calls.length})`, el("div", { id: "calls" }, data.calls.map((c, i) => callCard(c, i, data.tools)))),
    data.steps.length ? section("agent steps", table(["kind", "agent_name", "name", "duration_ms", "is_error"], data.steps)) : el("span"),
    section("rewards", data.rewards.length ? table(["level", "name", "value", "label", "source", "explanation"], data.rewards)
      : el("p", { class: "muted" }, "no reward recorded")),
  );
}

// The training page: reward and success per split, train/serve mismatch, loss, staleness, step time, reload
// phases, of online, offline RL and SFT runs alike; polled while a run goes on.

import { getJSON } from "./api.js";
import { lineChart, stackedBars } from "./charts.js";
import { downloads, el, section, time } from "./dom.js";

const POLL_MS = 3000;
// A step's wall time: its batch is collected and built during the update before it, so what the step
// waited for it (batch_wait_s) comes first; a step recorded before that overlap waited for all of both.
const STEP_PARTS = ["batch_wait_s", "train_s", "save_s", "reload_s"];
const waited = (s) => ({ ...s, batch_wait_s: s.batch_wait_s ?? s.collect_s + s.transform_s });
const TRANSFORM_PARTS = ["transform_wait_s", "transform_read_s", "transform_build_s"];
const RELOAD_PARTS = ["drain_ms", "pause_ms", "reload_ms", "verify_ms", "resume_ms"];

function chart(title, path, body) {
  return el("div", { class: "chart-box" }, el("h3", {}, title, " ", downloads(path)), body);
}

const series = (rows, name, column, x = "step") => ({ name, points: rows.map((r) => [r[x], r[column]]) });

function byEval(evals, column) {
  const names = [...new Set(evals.map((e) => e.eval))];
  return names.map((name) => series(evals.filter((e) => e.eval === name), `val (${name})`, column));
}

// How far the normalized tables (what a step's samples are read from) are behind the raw ones: /healthz.
function normalizedLag(health) {
  const n = health.normalized;
  if (!n) return "";
  if (n.failure) return `normalized tables: ${n.failure}`;
  return n.lag ? `normalized tables ${n.lag} commits (${n.lag_seconds.toFixed(1)} s) behind` : "normalized tables caught up";
}

async function draw(board, run, lag) {
  const query = run ? `?run_id=${encodeURIComponent(run)}` : "";
  const paths = Object.fromEntries(["steps", "evals", "reloads", "staleness"].map((c) => [c, `/ui/api/training/${c}${query}`]));
  const [steps, evals, reloads, staleness, health] = await Promise.all([...Object.values(paths), "/healthz"].map(getJSON));
  lag.textContent = normalizedLag(health);
  if (!steps.length && !evals.length) {
    board.replaceChildren(el("p", { class: "muted", id: "no-training" }, "no training step recorded yet (otel-rl train records each step here)"));
    return;
  }
  board.replaceChildren(
    chart("reward per split", paths.steps, lineChart([series(steps, "train", "reward_mean"), ...byEval(evals, "reward_mean")], { yLabel: "mean reward" })),
    chart("success per split", paths.evals, lineChart([series(steps, "train", "success_rate"), ...byEval(evals, "success_rate")], { yLabel: "success" })),
    chart("train/serve mismatch", paths.steps, lineChart([series(steps, "mismatch", "mismatch")], { yLabel: "|Δ logprob|" })),
    // every run's objective: an offline or SFT run has no rollouts of its own, so this is its curve
    chart("loss", paths.steps, lineChart([series(steps, "loss", "loss")], { yLabel: "loss" })),
    chart("staleness", paths.staleness, lineChart([series(staleness, "max versions behind", "max_lag"), series(staleness, "mean", "mean_lag"),
      series(steps, "stale groups dropped", "stale_groups")], { yLabel: "versions / groups" })),
    chart("screened by hack detectors", paths.steps, lineChart([series(steps, "rollouts screened", "screened")], { yLabel: "rollouts" })),
    chart("step time", paths.steps, stackedBars(STEP_PARTS, steps.map((s) => ({ x: s.step, values: waited(s) })), { yLabel: "s" })),
    // the transform's parts: waiting for the normalized tables, reading the step's rows, building samples
    chart("transform time", paths.steps, stackedBars(TRANSFORM_PARTS, steps.map((s) => ({ x: s.step, values: s })), { yLabel: "s" })),
    chart("reload phases", paths.reloads, reloads.length
      ? stackedBars(RELOAD_PARTS, reloads.map((r, i) => ({ x: r.policy_version ?? i, values: r })), { xLabel: "policy version", yLabel: "ms" })
      : el("p", { class: "muted" }, "no reload recorded")),
  );
}

export async function trainingPage(main, _id, params) {
  const runs = await getJSON("/ui/api/training/runs");
  const run = params.get("run") || (runs[0] && runs[0].run_id) || null;
  const picker = el("select", { name: "run", onchange: (event) => { location.hash = `#/training?run=${encodeURIComponent(event.target.value)}`; } },
    runs.map((r) => el("option", { value: r.run_id, selected: r.run_id === run }, `${r.run_id} · ${r.steps} steps · ${time(r.last_ms)}`)));
  const status = el("span", { class: "muted" });
  const lag = el("span", { class: "muted", id: "normalized-lag" });
  const board = el("div", { class: "charts", id: "charts" });
  main.replaceChildren(section("training", el("p", {}, runs.length ? picker : null, " ", status, " · ", lag), board));
  await draw(board, run, lag);
  status.textContent = `updated ${new Date().toLocaleTimeString()} · live (every ${POLL_MS / 1000} s)`;
  const timer = setInterval(async () => {
    try {
      await draw(board, run, lag);
      status.textContent = `updated ${new Date().toLocaleTimeString()} · live (every ${POLL_MS / 1000} s)`;
    } catch (error) {
      status.textContent = `update failed: ${error.message}`;
    }
  }, POLL_MS);
  return () => clearInterval(timer);
}

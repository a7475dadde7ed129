// The token-mask inspector: a rollout's training samples token by token, trained tokens set apart from the
// prompt and from inserted ones (tool results, later turns), with each token's advantage and vLLM logprob.

import { getJSON } from "./api.js";
import { lineChart } from "./charts.js";
import { downloads, el, section, shortId } from "./dom.js";

function tokenClass(segment, i) {
  if (segment.mask[i]) return "token trained";
  return i < segment.prompt_tokens ? "token prompt" : "token inserted";
}

function tokenView(segment) {
  const starts = new Map(segment.calls.map((call, k) => [call.start, k]));
  const box = el("div", { class: "tokens" });
  segment.ids.forEach((id, i) => {
    if (starts.has(i)) box.append(el("span", { class: "boundary", title: `call ${starts.get(i) + 1}: span ${segment.calls[starts.get(i)].span_id}` }, `call ${starts.get(i) + 1}`));
    const text = segment.text ? segment.text[i] : String(id);
    const title = [`#${i} id ${id}`, segment.mask[i] ? "trained" : "not trained",
      segment.logprob[i] !== null ? `vLLM logprob ${segment.logprob[i].toFixed(4)}` : null,
      segment.advantage_per_token[i] !== null ? `advantage ${segment.advantage_per_token[i].toFixed(4)}` : null].filter(Boolean).join(" · ");
    box.append(el("span", { class: tokenClass(segment, i), title, "data-position": i }, text.replace(/\n/g, "⏎\n")));
  });
  return box;
}

function segmentView(segment, index, path) {
  const trained = segment.mask.reduce((sum, m) => sum + m, 0);
  const logprobs = segment.logprob.map((lp, i) => [i, lp]).filter((p) => p[1] !== null);
  return el(
    "article", { class: "segment" },
    el("h3", {}, `segment ${index + 1}: ${segment.calls.length} call(s) merged`),
    el("p", {},
      `${segment.tokens} tokens: ${segment.prompt_tokens} prompt, ${trained} trained, ${segment.tokens - segment.prompt_tokens - trained} inserted`,
      ` · reward ${segment.reward} · advantage ${segment.advantage.toFixed(4)} · loss weight ${segment.loss_weight.toFixed(4)}`,
      segment.policy_version_min === null ? "" : ` · policy v${segment.policy_version_min}–${segment.policy_version_max}`,
      ` · token source ${segment.token_source}`,
      segment.truncated ? " · truncated" : "",
      segment.shown_tokens < segment.tokens ? ` · first ${segment.shown_tokens} shown` : ""),
    tokenView(segment),
    logprobs.length ? el("div", { class: "chart-box" }, el("h4", {}, "vLLM logprob of each trained token"),
      lineChart([{ name: "vLLM logprob", points: logprobs }], { xLabel: "token position", yLabel: "logprob" })) : null,
  );
}

export async function samplePage(main, id) {
  const path = `/ui/api/rollouts/${encodeURIComponent(id)}/samples`;
  const data = await getJSON(path);
  const dropped = Object.entries(data.dropped).map(([reason, n]) => `${reason}: ${n}`).join(", ");
  main.replaceChildren(section(
    `samples of rollout ${shortId(id)}`,
    el("p", {}, el("a", { href: `#/rollout/${encodeURIComponent(id)}` }, "back to the rollout"), " · ", downloads(path)),
    el("p", { class: "legend" },
      el("span", { class: "token prompt" }, "prompt"), el("span", { class: "token trained" }, "trained (sampled by the policy)"),
      el("span", { class: "token inserted" }, "inserted (tool results, next turns: masked)"), el("span", { class: "boundary" }, "call boundary")),
    el("p", { class: "muted" },
      "Built as the samples pipeline builds them: over the rollout's whole group (GRPO advantages), trusting every reward source. ",
      data.decoded ? "Tokens decoded with the server's model tokenizer. " : "Token ids shown: the server knows no model folder (serve --model or --tokenizer). ",
      "The trainer's logprobs are not recorded per token: the training page shows each step's train/serve mismatch."),
    data.segments.length ? el("div", { id: "segments" }, data.segments.map((s, i) => segmentView(s, i, path)))
      : el("p", { class: "error", id: "no-samples" }, `the pipeline made no sample of this rollout (dropped in its group: ${dropped || "none"})`),
  ));
}

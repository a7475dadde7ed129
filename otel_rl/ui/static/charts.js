// SVG charts drawn by hand: a line chart (several series over one x axis) and a stacked bar chart.
// No library: a few dozen lines, every asset served by otel-rl, nothing fetched from elsewhere.

const SVG = "http://www.w3.org/2000/svg";
const WIDTH = 560;
const HEIGHT = 240;
const PAD = { left: 52, right: 12, top: 24, bottom: 36 };
export const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#64748b", "#ca8a04"];

export function svg(tag, attributes = {}, text = null) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, String(value));
  if (text !== null) node.textContent = text;
  return node;
}

function extent(values) {
  const finite = values.filter((v) => Number.isFinite(v));
  if (!finite.length) return [0, 1];
  let lo = Math.min(...finite);
  let hi = Math.max(...finite);
  if (lo === hi) {
    lo -= lo === 0 ? 0.5 : Math.abs(lo) * 0.1;
    hi += hi === 0 ? 0.5 : Math.abs(hi) * 0.1;
  }
  return [lo, hi];
}

function ticks(lo, hi, count = 5) {
  const step = (hi - lo) / (count - 1);
  return Array.from({ length: count }, (_, i) => lo + i * step);
}

export function formatNumber(value) {
  if (value === null || value === undefined || !Number.isFinite(value)) return "–";
  const magnitude = Math.abs(value);
  if (magnitude !== 0 && (magnitude < 1e-3 || magnitude >= 1e5)) return value.toExponential(1);
  return Number(value.toPrecision(3)).toString();
}

function frame(yLo, yHi, xLo, xHi, xLabel, yLabel, xTicks = null) {
  const root = svg("svg", { viewBox: `0 0 ${WIDTH} ${HEIGHT}`, class: "chart", role: "img" });
  const x = (v) => PAD.left + ((v - xLo) / (xHi - xLo || 1)) * (WIDTH - PAD.left - PAD.right);
  const y = (v) => HEIGHT - PAD.bottom - ((v - yLo) / (yHi - yLo || 1)) * (HEIGHT - PAD.top - PAD.bottom);
  for (const t of ticks(yLo, yHi)) {
    root.append(svg("line", { x1: PAD.left, x2: WIDTH - PAD.right, y1: y(t), y2: y(t), class: "grid" }));
    root.append(svg("text", { x: PAD.left - 6, y: y(t) + 4, "text-anchor": "end", class: "tick" }, formatNumber(t)));
  }
  for (const t of xTicks || ticks(xLo, xHi, Math.min(6, Math.max(2, Math.round(xHi - xLo) + 1)))) {
    root.append(svg("text", { x: x(t), y: HEIGHT - PAD.bottom + 16, "text-anchor": "middle", class: "tick" }, formatNumber(t)));
  }
  root.append(svg("text", { x: WIDTH / 2, y: HEIGHT - 4, "text-anchor": "middle", class: "label" }, xLabel));
  root.append(svg("text", { x: 4, y: 12, class: "label" }, yLabel));
  return { root, x, y };
}

function legend(names) {
  const box = document.createElement("div");
  box.className = "legend";
  names.forEach((name, i) => {
    const item = document.createElement("span");
    const swatch = document.createElement("i");
    swatch.style.background = COLORS[i % COLORS.length];
    item.append(swatch, document.createTextNode(name));
    box.append(item);
  });
  return box;
}

// series: [{name, points: [[x, y], ...]}]; points with a null y are gaps.
export function lineChart(series, { xLabel = "step", yLabel = "" } = {}) {
  const all = series.flatMap((s) => s.points);
  const [xLo, xHi] = extent(all.map((p) => p[0]));
  const [yLo, yHi] = extent(all.map((p) => p[1]));
  const { root, x, y } = frame(yLo, yHi, xLo, xHi, xLabel, yLabel);
  series.forEach((s, i) => {
    const color = COLORS[i % COLORS.length];
    const points = s.points.filter((p) => Number.isFinite(p[1]));
    if (points.length > 1) {
      const d = points.map((p, j) => `${j ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join("");
      root.append(svg("path", { d, fill: "none", stroke: color, "stroke-width": 2, class: "series" }));
    }
    for (const p of points) {
      const dot = svg("circle", { cx: x(p[0]), cy: y(p[1]), r: 3, fill: color, class: "point" });
      dot.append(svg("title", {}, `${s.name}: ${formatNumber(p[1])} at ${formatNumber(p[0])}`));
      root.append(dot);
    }
  });
  const wrap = document.createElement("div");
  wrap.append(root, legend(series.map((s) => s.name)));
  return wrap;
}

// stacks: the names of the parts; bars: [{x, values: {name: number}}].
export function stackedBars(stacks, bars, { xLabel = "step", yLabel = "s" } = {}) {
  const totals = bars.map((b) => stacks.reduce((sum, name) => sum + (b.values[name] || 0), 0));
  const [xLo, xHi] = extent(bars.map((b) => b.x));
  const xTicks = bars.length <= 12 ? bars.map((b) => b.x) : null;
  const { root, x, y } = frame(0, Math.max(...totals, 1e-9), xLo - 0.5, xHi + 0.5, xLabel, yLabel, xTicks);
  const width = Math.max(2, ((WIDTH - PAD.left - PAD.right) / Math.max(bars.length, 1)) * 0.7);
  for (const bar of bars) {
    let base = 0;
    stacks.forEach((name, i) => {
      const value = bar.values[name] || 0;
      if (value <= 0) return;
      const rect = svg("rect", {
        x: x(bar.x) - width / 2, y: y(base + value), width, height: Math.max(0, y(base) - y(base + value)),
        fill: COLORS[i % COLORS.length], class: "bar",
      });
      rect.append(svg("title", {}, `${name}: ${formatNumber(value)} ${yLabel} at ${xLabel} ${bar.x}`));
      root.append(rect);
      base += value;
    });
  }
  const wrap = document.createElement("div");
  wrap.append(root, legend(stacks));
  return wrap;
}

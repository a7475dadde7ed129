// Small DOM helpers: every value from the store goes in as text, never as markup.

import { download } from "./api.js";

export function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "class") node.className = value;
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function table(columns, rows, cell = (row, column) => row[column]) {
  return el(
    "table",
    {},
    el("thead", {}, el("tr", {}, columns.map((c) => el("th", {}, c)))),
    el("tbody", {}, rows.map((row) => el("tr", {}, columns.map((c) => el("td", {}, display(cell(row, c))))))),
  );
}

export function display(value) {
  if (value instanceof Node) return value;
  if (value === null || value === undefined) return el("span", { class: "muted" }, "–");
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : Number(value.toPrecision(4)).toString();
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

// "csv" and "parquet" buttons for the data behind a chart or a table.
export function downloads(path) {
  return el(
    "span",
    { class: "downloads" },
    ["csv", "parquet"].map((format) =>
      el("button", { type: "button", class: "link", "data-download": format, onclick: () => download(path, format) }, format),
    ),
  );
}

export function section(title, ...children) {
  return el("section", {}, el("h2", {}, title), ...children);
}

export const shortId = (id) => (id && id.length > 14 ? `${id.slice(0, 12)}…` : id);

export function time(ms) {
  return ms === null || ms === undefined ? null : new Date(ms).toISOString().replace("T", " ").slice(0, 19);
}

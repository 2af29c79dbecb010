// Two nodes side by side (docs/viewer.md#compare): their answers, and the exact requests the model
// saw, as a diff of messages -- what is the same is folded into one line, what only one side had is
// shown on its side (the edited question, the old tool results that are not on the new branch).

import { drawMessage, el, fill, readItems, toolNames } from "./messages.js";

// The messages of an upstream request body, in any API's shape (chat, Responses, Messages).
function requestMessages(body) {
  if (!body || typeof body !== "object") return { list: [], api: "chat" };
  if (Array.isArray(body.input)) return { list: body.input, api: "responses" };
  const list = Array.isArray(body.messages) ? body.messages : [];
  if (typeof body.system === "string" || Array.isArray(body.system)) { // (chat bodies have no system field)
    return { list: [{ role: "system", content: body.system }, ...list], api: "messages" };
  }
  return { list, api: "chat" };
}

// The longest common subsequence of two lists of keys: pairs (i, j) in order.
function common(a, b) {
  const n = a.length, m = b.length;
  const table = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
  for (let i = n - 1; i >= 0; i--) {
    for (let j = m - 1; j >= 0; j--) {
      table[i][j] = a[i] === b[j] ? table[i + 1][j + 1] + 1 : Math.max(table[i + 1][j], table[i][j + 1]);
    }
  }
  const pairs = [];
  let i = 0, j = 0;
  while (i < n && j < m) {
    if (a[i] === b[j]) { pairs.push([i, j]); i++; j++; }
    else if (table[i + 1][j] >= table[i][j + 1]) i++;
    else j++;
  }
  return pairs;
}

function drawItems(list, api, cls) {
  const read = readItems(list, api);
  const names = toolNames(read);
  return read.map((m) => el("div", { class: `msg ${m.role} ${cls}` }, el("div", { class: "role" }, m.role), ...drawMessage(m, names)));
}

// The diff of two requests' messages, as rows: "n the same" lines and (left only | right only) rows.
function parsed(body) {
  if (typeof body !== "string") return body;
  try {
    return JSON.parse(body);
  } catch {
    return null;
  }
}

export function diffRequests(bodyA, bodyB) {
  bodyA = parsed(bodyA);
  bodyB = parsed(bodyB);
  const a = requestMessages(bodyA), b = requestMessages(bodyB);
  const keysA = a.list.map((m) => JSON.stringify(m)), keysB = b.list.map((m) => JSON.stringify(m));
  const rows = [];
  let i = 0, j = 0, same = 0, runFrom = 0;
  const flushSame = () => { // (folded: unfolding shows them)
    if (same) {
      rows.push(el("details", { class: "same" }, el("summary", {}, `${same} message${same === 1 ? "" : "s"} the same on both sides`),
        el("div", { class: "lazy", "data-from": String(runFrom), "data-to": String(runFrom + same) })));
    }
    same = 0;
  };
  for (const [pi, pj] of [...common(keysA, keysB), [a.list.length, b.list.length]]) {
    if (i < pi || j < pj) {
      flushSame();
      rows.push(el("div", { class: "row" },
        el("div", { class: "side-a" }, ...drawItems(a.list.slice(i, pi), a.api, "only-a")),
        el("div", { class: "side-b" }, ...drawItems(b.list.slice(j, pj), b.api, "only-b"))));
    }
    if (pi < a.list.length) {
      if (!same) runFrom = pi;
      same++;
    }
    i = pi + 1;
    j = pj + 1;
  }
  flushSame();
  for (const box of rows.filter((r) => r.classList.contains("same"))) {
    box.addEventListener("toggle", () => {
      const lazy = box.querySelector(".lazy");
      if (box.open && lazy && !lazy.childElementCount) {
        fill(lazy, ...drawItems(a.list.slice(Number(lazy.dataset.from), Number(lazy.dataset.to)), a.api, ""));
      }
    });
  }
  // the other fields that differ (model, tools, temperature ...)
  const fields = new Set([...Object.keys(bodyA || {}), ...Object.keys(bodyB || {})]);
  for (const key of ["messages", "input", "system"]) fields.delete(key);
  const differing = [...fields].filter((k) => JSON.stringify(bodyA?.[k]) !== JSON.stringify(bodyB?.[k]));
  if (differing.length) {
    rows.push(el("div", { class: "fields" }, "other fields that differ: ",
      differing.map((k) => `${k} (${JSON.stringify(bodyA?.[k]) ?? "—"} → ${JSON.stringify(bodyB?.[k]) ?? "—"})`).join("; ")));
  }
  return rows;
}

// a, b: /admin/nodes rows; requestA, requestB: {body, verified} of their /request.
export function drawCompare(container, a, b, requestA, requestB, { onClose, select }) {
  const title = (node, label) => el("h4", {}, `${label}: `, el("button", { class: "link", onclick: () => select(node.id) },
    node.id.slice(-12)), ` · ${node.kind} · ${node.status}${node.model ? ` · ${node.model}` : ""}`);
  const answers = (node, cls) => (node.status === "success" ? drawItems(node.received, node.api, cls)
    : [el("p", { class: "error" }, node.error?.message ?? node.status)]);
  fill(container,
    el("header", {}, el("strong", {}, "Compare"), el("span", { class: "spacer" }),
      el("button", { class: "close", onclick: onClose }, "× close")),
    el("div", { class: "body" },
      el("div", { class: "sides" },
        el("div", { class: "side answer-a" }, title(a, "A"), ...answers(a, "")),
        el("div", { class: "side answer-b" }, title(b, "B"), ...answers(b, ""))),
      el("h4", {}, "What the model saw: the two requests"),
      el("div", { class: "diff" }, ...diffRequests(requestA.body, requestB.body))));
}

// The head path read as a chat (docs/viewer.md#the-chat): each node's new items, then its answer,
// with `‹ i/n ›` arrows on every node that has siblings.

import { drawMessage, el, fill, readItems, toolNames } from "./messages.js";
import { siblingsOf } from "./tree.js";

function roleLabel(role) {
  return { user: "user", assistant: "assistant", tool: "tool result", system: "system", developer: "developer",
           reasoning: "reasoning" }[role] ?? role;
}

// The branches a node's arrows move between: its siblings that can hold the head (a call that
// succeeded, or failed transiently) -- the switch would leave it on one the upstream refused.
function arrows(index, node, onSwitch) {
  const siblings = siblingsOf(index, node.id).filter((id) => id === node.id || holdsHead(index.byId.get(id)));
  if (siblings.length < 2) return null;
  const at = siblings.indexOf(node.id);
  const go = (i) => (event) => {
    event.stopPropagation();
    onSwitch(siblings[i]);
  };
  return el("span", { class: "arrows", role: "group", "aria-label": "branches" },
    el("button", { class: "quiet", "aria-label": "previous branch", title: "previous branch",
                   disabled: at === 0, onclick: go(at - 1) }, "‹"),
    el("span", { class: "position" }, `${at + 1}/${siblings.length}`),
    el("button", { class: "quiet", "aria-label": "next branch", title: "next branch",
                   disabled: at === siblings.length - 1, onclick: go(at + 1) }, "›"));
}

function holdsHead(node) {
  return node !== undefined && (node.outcome === "success" || node.outcome === "transient");
}

function message(m, extra = null, names = undefined, onNode = null) {
  return el("div", { class: `msg ${m.role}` },
    el("div", { class: "role" }, roleLabel(m.role), extra),
    ...drawMessage(m, names, onNode));
}

// what a compaction node is: a summary, or old tool results cleared (context editing)
function compactionLine(node, sent) {
  if (node.method !== "clear_tool_results") {
    return `compaction: ${sent.length} items stand for the conversation before this point`;
  }
  const cleared = node.params?.cleared_results ?? 0;
  const freed = node.params?.freed_tokens;
  return `${cleared} tool results cleared${freed ? ` (about ${freed.toLocaleString("en")} tokens)` : ""}: `
    + `${sent.length} items, the old results as placeholders, stand for the conversation before this point`;
}

// path: the /path rows (root first); index: the tree's index (for sibling ids).
export function drawChat(container, path, index, { selected, onSelect, onSwitch }) {
  const blocks = [];
  const names = new Map(); // tool call id -> name, along the path
  for (const node of path) {
    const sent = readItems(node.sent, node.api);
    const received = node.status === "success" ? readItems(node.received, node.api) : [];
    toolNames(sent, names);
    toolNames(received, names);
    const branch = arrows(index, node, onSwitch);
    const parts = [];
    if (node.kind === "compaction") {
      const original = node.compacted_from
        ? el("button", { class: "link replaced", onclick: (event) => { event.stopPropagation(); onSelect(node.compacted_from); } },
          "the path it replaces")
        : null;
      parts.push(el("details", { class: `msg system compaction${node.method === "clear_tool_results" ? " cleared" : ""}` },
        el("summary", {}, compactionLine(node, sent), original ? " · " : null, original),
        ...sent.map((m) => message(m, null, names, onSelect))));
      if (branch) parts.unshift(el("div", { class: "msg system" }, branch));
    } else {
      let first = true;
      for (const m of sent) {
        // a system prompt the client repeats each call is still shown once per node that sent it
        parts.push(message(m, first ? branch : null, names, onSelect));
        first = false;
      }
      if (first && branch) parts.push(el("div", { class: "msg system" }, branch));
      if (node.kind === "transform") parts.unshift(el("div", { class: "msg system" }, "side call (transform)"));
      if (node.kind === "items") parts.unshift(el("div", { class: "msg system" }, "items added (Conversations API, no model call)"));
      for (const m of received) parts.push(message(m, null, names, onSelect));
      if (node.status === "pending") parts.push(el("div", { class: "msg assistant pending" }, "… answering"));
      if (node.error) {
        parts.push(el("div", { class: "msg failed" },
          el("div", { class: "role" }, `failed: ${node.error.code ?? node.error.type ?? "error"}`),
          el("div", { class: "text" }, node.error.message ?? JSON.stringify(node.error))));
      }
    }
    const block = el("section", { class: `turn ${node.kind}${node.id === selected ? " selected" : ""}`, "data-node": node.id,
                                  onclick: () => onSelect(node.id) }, ...parts);
    blocks.push(block);
  }
  if (!blocks.length) blocks.push(el("p", { class: "notice" }, "No context yet: the next message starts a new root."));
  fill(container, ...blocks);
  container.scrollTop = container.scrollHeight;
}

// A message being answered right now: returns {answer(text), fail(message)}.
export function drawPending(container, userText) {
  const answer = el("div", { class: "text" });
  const box = el("div", { class: "msg assistant streaming" }, el("div", { class: "role" }, "assistant (streaming)"), answer);
  container.append(el("section", { class: "turn pending" },
    userText ? el("div", { class: "msg user" }, el("div", { class: "role" }, "user"), el("div", { class: "text" }, userText)) : null,
    box));
  container.scrollTop = container.scrollHeight;
  return {
    answer(text) {
      answer.textContent += text;
      container.scrollTop = container.scrollHeight;
    },
    fail(text) {
      box.classList.add("failed");
      box.append(el("div", { class: "text error" }, text));
    },
  };
}

// What a node's items say, in a form the views draw: chat messages, Responses items and Anthropic
// messages alike.

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  return fill(node, ...children);
}

// Replaces a node's children; nested arrays are flattened, null/undefined/false left out.
export function fill(node, ...children) {
  node.replaceChildren(...children.flat(Infinity).filter((c) => c !== undefined && c !== null && c !== false)
    .map((c) => (c instanceof Node ? c : document.createTextNode(String(c)))));
  return node;
}

export function pretty(value) {
  if (typeof value === "string") {
    try {
      return JSON.stringify(JSON.parse(value), null, 2);
    } catch {
      return value;
    }
  }
  return JSON.stringify(value, null, 2);
}

// A list as stored, or none: a stored item's fields hold what an upstream or an import gave them,
// and one odd shape must not keep a whole conversation from being drawn.
const list = (value) => (Array.isArray(value) ? value : []);

function textOf(content) {
  if (content === null || content === undefined) return "";
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content.map((part) => {
      if (typeof part === "string") return part;
      if (typeof part?.text === "string") return part.text;
      if (part?.type === "refusal") return `[refused] ${part.refusal}`;
      if (part?.type === "image_url" || part?.type === "input_image") return "[image]";
      return JSON.stringify(part);
    }).join("");
  }
  return JSON.stringify(content);
}

// -> [{role, text, calls: [{id, name, arguments}], callId, output}]
// One Messages item (an Anthropic message or a fragment of one): text, tool uses, tool results,
// thinking -- each block as the views draw it.
function readBlocks(item, out) {
  const blocks = typeof item.content === "string" ? [{ type: "text", text: item.content }] : list(item.content);
  if (item.role === "system") {
    out.push({ role: "system", text: textOf(blocks) });
    return;
  }
  let current = null;
  for (const block of blocks) {
    if (block?.type === "tool_result") {
      current = null;
      out.push({ role: "tool", callId: block.tool_use_id, isError: block.is_error === true,
        output: typeof block.content === "string" ? block.content : textOf(block.content) });
    } else if (block?.type === "thinking") {
      out.push({ role: "reasoning", text: typeof block.thinking === "string" ? block.thinking : "" });
    } else if (block?.type === "redacted_thinking") {
      out.push({ role: "reasoning", text: "[redacted thinking]" });
    } else {
      if (!current) {
        current = { role: item.role, text: "", calls: [] };
        out.push(current);
      }
      if (block?.type === "tool_use") current.calls.push({ id: block.id, name: block.name, arguments: JSON.stringify(block.input ?? {}) });
      else if (block?.type === "image") current.text += "[image]";
      else current.text += typeof block?.text === "string" ? block.text : JSON.stringify(block);
    }
  }
}

export function readItems(items, api) {
  const out = [];
  if (api === "messages") {
    for (const item of list(items)) if (item && typeof item === "object") readBlocks(item, out);
    return out;
  }
  for (const item of list(items)) {
    if (!item || typeof item !== "object") continue;
    const type = item.type ?? (item.role ? "message" : null);
    if (api === "responses" && type === "function_call") {
      out.push({ role: "assistant", text: "", calls: [{ id: item.call_id, name: item.name, arguments: item.arguments }] });
    } else if (api === "responses" && type === "function_call_output") {
      out.push({ role: "tool", callId: item.call_id, output: item.output });
    } else if (api === "responses" && type === "reasoning") {
      const summary = list(item.summary).map((s) => (typeof s?.text === "string" ? s.text : "")).join("");
      if (summary) out.push({ role: "reasoning", text: summary });
    } else if (type === "message" || item.role) {
      const calls = list(item.tool_calls).map((c) => ({ id: c?.id, name: c?.function?.name, arguments: c?.function?.arguments }));
      if (item.role === "tool") out.push({ role: "tool", callId: item.tool_call_id, output: item.content });
      else out.push({ role: item.role, text: textOf(item.content), calls, refusal: item.refusal });
    } else {
      out.push({ role: "item", text: JSON.stringify(item) });
    }
  }
  return out;
}

// Agent sessions hold tool results of tens of kilobytes: each tool call and result is one folded
// line (name, size, status), unfolded on demand, and a long one shows its first SHOWN characters
// until "show all" -- what the page holds stays small however long the session.
export const SHOWN = 4000;

export function size(text) {
  const n = new TextEncoder().encode(text).length;
  return n < 1024 ? `${n} B` : n < 1024 * 1024 ? `${(n / 1024).toFixed(1)} KB` : `${(n / 1048576).toFixed(1)} MB`;
}

function clipped(text) {
  if (text.length <= SHOWN) return el("pre", {}, text);
  const pre = el("pre", { class: "clipped" }, text.slice(0, SHOWN) + "…");
  const all = el("button", { class: "link show-all", onclick: () => { pre.textContent = text; pre.classList.remove("clipped"); all.remove(); } },
    `show all (${size(text)})`);
  return [pre, all];
}

function folded(label, text, open = false) {
  return el("details", { class: "fold-item", open }, el("summary", {}, label), clipped(text));
}

// A tool result that context editing replaced by a placeholder (docs/behaviour.md#context-editing):
// the node holding the original, or null.
const CLEARED = /^\[Tool result cleared to save context\b[^]*? in node ([0-9a-f-]{36})\.\]$/;
export function clearedFrom(output) {
  const found = typeof output === "string" ? CLEARED.exec(output) : null;
  return found ? found[1] : null;
}

// names: tool call id -> the tool's name (a result says which tool it answers); onNode: open a
// node (a cleared result's original is one click away)
export function drawMessage(m, names = new Map(), onNode = null) {
  const body = [];
  if (m.text) body.push(el("div", { class: "text" }, m.text));
  if (m.refusal) body.push(el("div", { class: "text error" }, `Refused: ${m.refusal}`));
  for (const call of m.calls || []) {
    const args = pretty(call.arguments ?? "");
    body.push(folded(`tool call ${call.name} (${call.id}) · ${size(args)}`, args));
  }
  if (m.role === "tool") {
    const output = typeof m.output === "string" ? pretty(m.output) : pretty(m.output ?? "");
    const name = names.get(m.callId);
    const original = clearedFrom(m.output);
    if (original) {
      body.push(el("div", { class: "fold-item cleared" },
        `result of ${m.callId}${name ? ` (${name})` : ""} · cleared · `,
        onNode ? el("button", { class: "link original", onclick: (event) => { event.stopPropagation(); onNode(original); } },
          `the original: node ${original.slice(-12)}`) : `the original: node ${original}`,
        el("div", { class: "text placeholder" }, m.output)));
    } else {
      body.push(folded(`result of ${m.callId}${name ? ` (${name})` : ""} · ${size(output)}${m.isError ? " · error" : ""}`, output));
    }
  }
  return body;
}

// tool call id -> name, over read messages
export function toolNames(read, names = new Map()) {
  for (const m of read) for (const call of m.calls || []) names.set(call.id, call.name);
  return names;
}

// Items as chat messages for the chat endpoint (chat nodes keep theirs exactly).
export function asChatMessages(items, api) {
  if (api !== "responses" && api !== "messages") return structuredClone(items || []);
  const out = [];
  for (const m of readItems(items, api)) {
    if (m.role === "tool") {
      out.push({ role: "tool", tool_call_id: m.callId, content: typeof m.output === "string" ? m.output : JSON.stringify(m.output) });
    } else if (m.calls?.length) {
      out.push({ role: "assistant", content: m.text || null,
                 tool_calls: m.calls.map((c) => ({ id: c.id, type: "function", function: { name: c.name, arguments: c.arguments ?? "" } })) });
    } else if (["user", "assistant", "system", "developer"].includes(m.role)) {
      out.push({ role: m.role, content: m.text });
    }
  }
  return out;
}

// A node's messages with its (last) question replaced by `text`: an edit keeps the system prompt.
export function withQuestion(items, api, text) {
  const messages = asChatMessages(items, api);
  for (let i = messages.length - 1; i >= 0; i--) {
    if (messages[i].role === "user") {
      messages[i] = { ...messages[i], content: text };
      return messages;
    }
  }
  messages.push({ role: "user", content: text });
  return messages;
}

export function lastUserText(items, api) {
  const users = readItems(items, api).filter((m) => m.role === "user");
  return users.length ? users[users.length - 1].text : "";
}

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

// What a message's content is when it is sent again through the chat endpoint (Regenerate, Edit
// question): each part in chat's form, as the proxy itself reads a Responses or Messages request
// (proxy/dialects) -- an image stays an image, a PDF a file; the text alone when there is only
// text. The views draw "[image]" instead; what is sent must be the part itself.
function chatPart(part, api) {
  if (typeof part === "string") return { type: "text", text: part };
  if (!part || typeof part !== "object" || part.type === "refusal") return null;
  if (typeof part.text === "string" && ["text", "input_text", "output_text"].includes(part.type)) {
    return { type: "text", text: part.text };
  }
  if (api === "responses" && part.type === "input_image" && !part.image_url && part.file_id) {
    // (by OpenAI file id: a line naming it, as the proxy's own translation writes it)
    return { type: "text", text: `[image (file ${part.file_id}): not readable by this model]` };
  }
  if (api === "responses" && part.type === "input_image") {
    const image = { url: part.image_url ?? null };
    if (part.detail) image.detail = part.detail;
    return { type: "image_url", image_url: image };
  }
  if (api === "responses" && part.type === "input_file") {
    return { type: "file", file: Object.fromEntries(["file_id", "file_data", "file_url", "filename"]
      .filter((k) => k in part).map((k) => [k, part[k]])) };
  }
  if (api !== "messages") return part; // (chat's own parts, and what is not understood: as it came)
  const source = part.source && typeof part.source === "object" ? part.source : {};
  if (part.type === "image" && source.type === "base64" && typeof source.data === "string") {
    return { type: "image_url", image_url: { url: `data:${source.media_type ?? ""};base64,${source.data}` } };
  }
  if (part.type === "image" && typeof source.url === "string" && source.url) {
    return { type: "image_url", image_url: { url: source.url } };
  }
  // (an image by Anthropic file id is nothing another provider can fetch: a line naming it, below,
  // as the proxy's own translation writes it)
  if (part.type === "document" && source.type === "base64" && typeof source.media_type === "string" && typeof source.data === "string") {
    const name = typeof part.title === "string" && part.title ? part.title : source.media_type === "application/pdf" ? "document.pdf" : "document";
    return { type: "file", file: { filename: name, file_data: `data:${source.media_type};base64,${source.data}` } };
  }
  // a block chat has no part for, as text (a plain-text document's own text)
  const title = typeof part.title === "string" ? ` ${part.title}` : "";
  if (part.type === "document" && source.type === "text" && typeof source.data === "string") {
    return { type: "text", text: `[document${title}]\n${source.data}` };
  }
  if (part.type === "document" && source.type === "content") {
    const texts = (typeof source.content === "string" ? [{ type: "text", text: source.content }] : list(source.content))
      .filter((b) => b?.type === "text" && typeof b.text === "string").map((b) => b.text);
    return { type: "text", text: `[document${title}]\n${texts.join("\n")}` };
  }
  if (part.type === "search_result") {
    const texts = list(part.content).filter((b) => typeof b?.text === "string").map((b) => b.text);
    return { type: "text", text: `[search result${title}: ${part.source ?? ""}]\n${texts.join("\n")}` };
  }
  // (naming its URL or file id: the proxy matches a resent history by this line)
  const named = [source.url, source.file_id, part.file_id].find((v) => typeof v === "string" && v) ?? "";
  const what = [source.media_type || source.type, named].filter((w) => w).join(" ");
  return { type: "text", text: `[${part.type}${title}${what ? ` (${what})` : ""}: not readable by this model]` };
}

function chatContent(content, api) {
  if (content === null || content === undefined || typeof content === "string") return content ?? "";
  if (!Array.isArray(content)) return content;
  const parts = content.map((part) => chatPart(part, api)).filter((part) => part !== null);
  return parts.every((part) => part.type === "text" && typeof part.text === "string")
    ? parts.map((part) => part.text).join("") : parts;
}

// The text of chat content: what the composer offers to edit (the other parts are kept).
function textParts(content) {
  if (typeof content === "string") return content;
  return list(content).filter((part) => part?.type === "text" && typeof part.text === "string").map((part) => part.text).join("");
}

// -> [{role, text, calls: [{id, name, arguments}], callId, output, chat}] -- `chat`: the message's
// content as the chat endpoint takes it (chatContent)
// One Messages item (an Anthropic message or a fragment of one): text, tool uses, tool results,
// thinking -- each block as the views draw it.
function readBlocks(item, out) {
  const blocks = typeof item.content === "string" ? [{ type: "text", text: item.content }] : list(item.content);
  if (item.role === "system") {
    // (a system prompt's text blocks, one a line, as the proxy reads them)
    const chat = typeof item.content === "string" ? item.content
      : blocks.filter((b) => b?.type === "text" && typeof b.text === "string").map((b) => b.text).join("\n");
    out.push({ role: "system", text: textOf(blocks), chat });
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
        current = { role: item.role, text: "", calls: [], blocks: [] };
        out.push(current);
      }
      if (block?.type === "tool_use") current.calls.push({ id: block.id, name: block.name, arguments: JSON.stringify(block.input ?? {}) });
      else {
        current.blocks.push(block);
        current.text += block?.type === "image" ? "[image]" : typeof block?.text === "string" ? block.text : JSON.stringify(block);
      }
    }
  }
}

export function readItems(items, api) {
  const out = [];
  if (api === "messages") {
    for (const item of list(items)) if (item && typeof item === "object") readBlocks(item, out);
    for (const m of out) {
      if (!m.blocks) continue;
      m.chat = chatContent(m.blocks, "messages");
      delete m.blocks;
    }
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
      else out.push({ role: item.role, text: textOf(item.content), calls, refusal: item.refusal, chat: chatContent(item.content, api) });
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
      out.push({ role: m.role, content: m.chat ?? m.text });
    }
  }
  return out;
}

// Chat content with its text replaced by `text`: the text parts give way to one (where the first
// stood), images and files stay where they were.
function replaceText(content, text) {
  if (!Array.isArray(content)) return text;
  const out = [];
  let placed = false;
  for (const part of content) {
    if (part?.type !== "text") out.push(part);
    else if (!placed) {
      out.push({ ...part, text });
      placed = true;
    }
  }
  if (!placed) out.push({ type: "text", text });
  return out;
}

// A node's messages with its (last) question's text replaced by `text`: an edit keeps the system
// prompt, and the question's images and files.
export function withQuestion(items, api, text) {
  const messages = asChatMessages(items, api);
  for (let i = messages.length - 1; i >= 0; i--) {
    if (messages[i].role === "user") {
      messages[i] = { ...messages[i], content: replaceText(messages[i].content, text) };
      return messages;
    }
  }
  messages.push({ role: "user", content: text });
  return messages;
}

function lastQuestion(items, api) {
  const users = readItems(items, api).filter((m) => m.role === "user");
  return users.length ? users[users.length - 1] : null;
}

// The text of a node's (last) question: what Edit question offers, and what the chat shows while
// a regeneration streams.
export function lastUserText(items, api) {
  const question = lastQuestion(items, api);
  return question ? textParts(question.chat ?? question.text) : "";
}

// How many parts of a node's (last) question are not text (images, files): an edit keeps them.
export function attachmentsOf(items, api) {
  const content = lastQuestion(items, api)?.chat;
  return Array.isArray(content) ? content.filter((part) => part?.type !== "text").length : 0;
}

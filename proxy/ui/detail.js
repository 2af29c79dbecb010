// One node in full (docs/viewer.md#a-node): what it sent and received, model, usage, timings,
// error, the exact upstream request, and what can be done from it.

import { drawMessage, el, fill, pretty, readItems, toolNames } from "./messages.js";

function when(value) {
  return value ? new Date(value).toLocaleString() : "—";
}

function duration(node) {
  if (!node.finished_at) return node.status === "pending" ? "in flight" : "—";
  return `${Math.max(0, Date.parse(node.finished_at) - Date.parse(node.created_at))} ms`;
}

function usage(value) {
  if (!value) return "—";
  // (Anthropic's input_tokens leave out what was read from or written to its prompt cache;
  // Responses' count it, with its input_tokens_details)
  const cache = value.input_tokens_details ? 0 : (value.cache_read_input_tokens ?? 0) + (value.cache_creation_input_tokens ?? 0);
  const input = value.prompt_tokens ?? (value.input_tokens === undefined ? undefined : value.input_tokens + cache);
  const output = value.completion_tokens ?? value.output_tokens;
  const total = value.total_tokens ?? (input !== undefined && output !== undefined ? input + output : undefined);
  return `${input ?? "?"} in · ${output ?? "?"} out · ${total ?? "?"} total`;
}

function items(title, list, api, names, onNode) {
  const read = readItems(list, api);
  if (!read.length) return el("p", { class: "notice" }, `${title}: nothing`);
  return el("section", {}, el("h4", {}, title),
    ...read.map((m) => el("div", { class: `msg ${m.role}` }, el("div", { class: "role" }, m.role), ...drawMessage(m, names, onNode))));
}

// how a compaction node was made (docs/behaviour.md#context-editing)
function method(node) {
  if (node.method === "clear_tool_results") {
    const freed = node.params?.freed_tokens;
    return `old tool results cleared (${node.params?.cleared_results ?? "?"}${freed ? `, about ${freed.toLocaleString("en")} tokens` : ""}), no model call`;
  }
  return "summary";
}

function badge(text, kind) {
  return el("span", { class: `badge ${kind ?? ""}` }, text);
}

// node: the full /admin/nodes/{id} row; canSend: the composer can call the chat endpoint here.
// actions: {setHead, switchTo, fork, reply, edit, regenerate, request, select}, each a function
// of the node id (request resolves to {body, verified}).
export function drawDetail(container, node, { head, conversation, canSend, actions }) {
  const link = (id) => (id ? el("button", { class: "link", onclick: () => actions.select(id) }, id.slice(-12)) : "—");
  const status = node.status === "success" ? badge("success", "ok")
    : node.status === "failed" ? badge(`failed (${node.outcome})`, "bad") : badge(node.status);
  const inherited = conversation && node.conversation_id !== conversation;
  const hasQuestion = readItems(node.sent, node.api).some((m) => m.role === "user");
  const names = toolNames(readItems(node.received, node.api), toolNames(readItems(node.sent, node.api)));
  // the head rule: a turn or compaction that succeeded or failed transiently (a retry hangs beside it)
  const headable = node.kind !== "transform";
  const canBeHead = headable && (node.outcome === "success" || node.outcome === "transient");
  const canReply = canSend && headable && node.outcome === "success";

  const requestBox = el("div", { class: "request" });
  const showRequest = async () => {
    fill(requestBox, el("p", { class: "notice" }, "loading…"));
    try {
      const { body, verified } = await actions.request(node.id);
      const verdict = verified === "true" ? badge("verified: byte-identical to what was sent", "ok")
        : verified === "false" ? badge("NOT verified: differs from what was sent", "bad")
          : badge("verification unknown (stored before hashes were kept)");
      fill(requestBox, verdict, el("pre", { class: "exact-request" }, pretty(body)));
    } catch (error) {
      fill(requestBox, el("p", { class: "error" }, error.message));
    }
  };

  fill(container,
    el("h3", {}, `${node.kind} node `, status, node.id === head ? badge("head", "ok") : null,
      inherited ? badge(`from ${node.conversation_id}`) : null),
    el("dl", {},
      el("dt", {}, "id"), el("dd", { class: "mono" }, node.id),
      el("dt", {}, "parent"), el("dd", {}, link(node.parent_id)),
      node.compacted_from ? [el("dt", {}, "replaces"), el("dd", {}, link(node.compacted_from))] : null,
      node.kind === "compaction" ? [el("dt", {}, "method"), el("dd", { class: "method" }, method(node))] : null,
      el("dt", {}, "model"), el("dd", {}, node.model ?? "—"),
      el("dt", {}, "upstream"), el("dd", {}, node.provider ?? "—"),
      el("dt", {}, "client API"), el("dd", {}, { responses: "Responses API", messages: "Messages API" }[node.api] ?? "chat completions"),
      el("dt", {}, "usage"), el("dd", {}, usage(node.usage)),
      el("dt", {}, "finish"), el("dd", {}, node.finish_reason ?? "—"),
      el("dt", {}, "started"), el("dd", {}, when(node.created_at)),
      el("dt", {}, "took"), el("dd", {}, duration(node)),
      el("dt", {}, "depth"), el("dd", {}, String(node.depth))),
    el("div", { class: "actions" },
      headable ? el("button", { onclick: () => actions.switchTo(node.id), title: "head to the newest leaf under this node" }, "Switch here") : null,
      canBeHead ? el("button", { onclick: () => actions.setHead(node.id) }, "Set head") : null,
      el("button", { onclick: () => actions.fork(node.id) }, "Fork from here"),
      canReply ? el("button", { onclick: () => actions.reply(node.id) }, "Reply from here") : null,
      canSend && hasQuestion && node.kind === "turn" ? el("button", { onclick: () => actions.edit(node.id) }, "Edit question") : null,
      canSend && node.kind !== "compaction" ? el("button", { onclick: () => actions.regenerate(node.id) }, "Regenerate") : null,
      actions.compare ? el("button", { class: "compare", onclick: () => actions.compare(node.id),
                                       title: "pick another node to see both side by side" }, "Compare with…") : null),
    node.error ? el("section", {}, el("h4", { class: "error" }, "error"), el("pre", { class: "error" }, pretty(node.error))) : null,
    items("sent", node.sent, node.api, names, actions.select),
    node.status === "success" ? items("received", node.received, node.api, names, actions.select) : null,
    Object.keys(node.params || {}).length
      ? el("details", {}, el("summary", {}, "request parameters"), el("pre", {}, pretty(node.params))) : null,
    node.usage ? el("details", {}, el("summary", {}, "usage (raw)"), el("pre", {}, pretty(node.usage))) : null,
    el("section", {}, el("h4", {}, "exact upstream request"),
      el("button", { class: "show-request", onclick: showRequest }, "Show the request the model saw"), requestBox),
  );
}

// The viewer's entry point (docs/viewer.md): sign-in, the conversation list and one conversation.
// Routes live in the URL hash: `#/` the list, `#/c/<id>` a conversation.

import { Api, ApiError, storedKey, storeKey } from "./api.js";
import { drawChat, drawPending } from "./chat.js";
import { drawCompare } from "./compare.js";
import { drawDetail } from "./detail.js";
import { drawDaily, drawPathTokens, loadDaily } from "./spend.js";
import { asChatMessages, attachmentsOf, el, fill, lastUserText, withQuestion } from "./messages.js";
import { TreeView } from "./tree.js";

const POLL_MS = 2000;
const PAGE = 25;
const main = document.getElementById("main");
const crumb = document.getElementById("crumb");
const signOutButton = document.getElementById("signout");

let api = storedKey() ? new Api(storedKey()) : null;
let current = null; // the open view: {stop()}

function signOut(message) {
  storeKey(null);
  api = null;
  current?.stop();
  current = null;
  signIn(message);
}

// Any call may learn that the key stopped working (revoked, or the server restarted with other
// keys): back to the sign-in form with the reason.
function refused(error) {
  if (error instanceof ApiError && error.status === 401) {
    signOut(`The key was refused: ${error.message}. Sign in again.`);
    return true;
  }
  return false;
}

function signIn(message) {
  signOutButton.hidden = true;
  crumb.textContent = "";
  const key = el("input", { type: "password", id: "key", name: "key", autocomplete: "off", required: true,
                            placeholder: "sk-…", "aria-label": "API key" });
  const error = el("p", { class: "error", id: "signin-error", role: "alert" }, message ?? "");
  const form = el("form", { class: "signin" },
    el("h2", {}, "Sign in"),
    el("p", { class: "notice" }, "Use the bearer key your clients send to Branchpoint. It stays in this tab only."),
    key, el("button", { class: "primary", type: "submit" }, "Sign in"), error);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    error.textContent = "";
    // (a request header carries Latin-1 only, and no line break: fetch refuses anything else
    // before sending, with a message about fetch -- the character is named instead; a zero-width
    // space pasted with a key is the usual one)
    const odd = [...key.value.trim()].find((c) => c.codePointAt(0) > 0xff || /[\0\r\n]/.test(c));
    if (odd) {
      const code = `U+${odd.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")}`;
      const what = /[\p{Cf}\p{Cc}\p{Z}]/u.test(odd) ? `an invisible character (${code})` : `"${odd}" (${code})`;
      error.textContent = `This key cannot be sent as typed: it holds ${what}, which a request header cannot carry. `
        + "Type or paste the key again.";
      return;
    }
    const candidate = new Api(key.value.trim());
    try {
      await candidate.conversations(null, null);
    } catch (failure) {
      error.textContent = failure instanceof ApiError && failure.status === 401
        ? `This key was refused (${failure.code ?? "401"}): ${failure.message}`
        : `Could not reach Branchpoint: ${failure.message}`;
      return;
    }
    storeKey(candidate.key);
    api = candidate;
    route();
  });
  fill(main, form);
  key.focus();
}

function route() {
  current?.stop();
  current = null;
  if (!api) return signIn();
  signOutButton.hidden = false;
  // #/c/<id>, or #/t/<tenant>/c/<id> for an admin key looking into another tenant
  const match = location.hash.match(/^#\/(?:t\/([^/]+)\/)?c\/([^?]+)(?:\?node=(.+))?$/);
  let parts = null;
  try {
    parts = match && [decodeURIComponent(match[2]), match[1] ? decodeURIComponent(match[1]) : null,
                      match[3] ? decodeURIComponent(match[3]) : null];
  } catch {
    // a link whose escapes do not decode (`#/c/%`, cut in the middle of a character): the list
  }
  current = parts ? new ConversationView(...parts) : new ListView(match ? `Not a conversation link: ${location.hash}` : null);
}

function conversationLink(id, tenant) {
  return tenant ? `#/t/${encodeURIComponent(tenant)}/c/${encodeURIComponent(id)}` : `#/c/${encodeURIComponent(id)}`;
}

// -- the conversation list ---------------------------------------------------------------------

class ListView {
  constructor(notice = null) {
    crumb.textContent = "conversations";
    this.search = el("input", { type: "search", placeholder: "search by id", "aria-label": "search by id" });
    this.scope = el("select", { "aria-label": "search in", onchange: () => {
      this.search.placeholder = this.scope.value === "text" ? "search what was said" : "search by id";
      this.reset();
    } }, el("option", { value: "id" }, "ids"), el("option", { value: "text" }, "messages"));
    this.rows = el("tbody");
    this.more = el("button", { hidden: true, onclick: () => this.load() }, "Load more");
    this.status = el("p", { class: "notice", role: "status" });
    this.usage = el("p", { class: "notice usage" });
    this.spend = el("div", { class: "spend" });
    let timer = null;
    this.search.addEventListener("input", () => {
      clearTimeout(timer);
      this.more.hidden = true; // (the rows shown are not the new term's: no more of them to page)
      timer = setTimeout(() => this.reset(), 250);
    });
    this.file = el("input", { type: "file", accept: ".jsonl,application/jsonl", "aria-label": "export file", hidden: true,
      onchange: () => this.importFile() });
    fill(main, el("div", { class: "list" }, notice ? el("p", { class: "error", role: "alert" }, notice) : null,
      el("div", { class: "row" }, this.search, this.scope, el("button", { onclick: () => this.reset() }, "Refresh"),
        el("span", { class: "spacer" }), this.file, el("button", { onclick: () => this.file.click() }, "Import…")),
      el("table", {}, el("thead", {}, el("tr", {}, ...["conversation", "nodes", "tokens", "state", "created", "updated"].map((h) => el("th", {}, h)))), this.rows),
      this.more, this.status, this.usage, this.spend));
    this.reset();
    this.search.focus();
    this.showUsage();
  }

  // What this key's calls used in the last 30 days, by model (GET /admin/usage).
  async showUsage() {
    let report;
    try {
      report = await api.usage();
    } catch (error) {
      return; // the list says what is wrong, if anything
    }
    if (!report.calls) return;
    const models = report.data.map((line) => `${line.tenant ? `${line.tenant} · ` : ""}${line.model ?? "no model"} `
      + line.total_tokens.toLocaleString()).join(", ");
    this.usage.textContent = `Last 30 days: ${report.calls.toLocaleString()} calls, `
      + `${report.total_tokens.toLocaleString()} tokens (${models}).`;
    try {
      drawDaily(this.spend, await loadDaily(api));
    } catch (error) {
      this.spend.textContent = `tokens per day: ${error.message}`;
    }
  }

  stop() {}

  // An export file (from the Export button or `branchpoint conversations export`) becomes a new
  // conversation; its id is asked for, the file's name offered.
  async importFile() {
    const file = this.file.files[0];
    this.file.value = "";
    if (!file) return;
    const id = prompt("Id of the new conversation:", file.name.replace(/\.jsonl$/, "") + "-imported");
    if (!id) return;
    this.status.textContent = "importing…";
    try {
      const conv = await api.importTree(id.trim(), file);
      location.hash = conversationLink(conv.id, null);
    } catch (error) {
      if (!refused(error)) this.status.textContent = error.message;
    }
  }

  reset() {
    this.cursor = null;
    this.generation = (this.generation ?? 0) + 1; // (a page asked for before this one is not shown)
    fill(this.rows);
    this.load();
  }

  async load() {
    const term = this.search.value.trim();
    const byText = this.scope.value === "text" && term;
    const generation = this.generation;
    this.more.hidden = true; // (one page at a time: shown again with the next cursor)
    let page;
    try {
      page = await api.conversations(this.cursor, byText ? null : term, byText ? term : null);
    } catch (error) {
      if (!refused(error)) this.status.textContent = error.message;
      if (generation === this.generation) this.more.hidden = !this.cursor; // (the same page may be asked again)
      return;
    }
    if (generation !== this.generation) return; // the list was started again meanwhile
    if (term !== this.search.value.trim()) return; // a newer search is on its way
    for (const c of page.data) {
      // a match opens the conversation on the node that matched
      const open = conversationLink(c.id, c.tenant) + (c.match ? `?node=${encodeURIComponent(c.match.node_id)}` : "");
      this.rows.append(el("tr", { class: "row", onclick: () => { location.hash = open; } },
        el("td", {}, el("a", { href: open }, c.id), c.tenant ? el("span", { class: "badge" }, `tenant ${c.tenant}`) : null,
          c.forked_from ? el("span", { class: "badge" }, `fork of ${c.forked_from}`) : null,
          c.match ? el("div", { class: "snippet" }, c.match.snippet) : null),
        el("td", {}, String(c.node_count)),
        el("td", {}, c.usage ? c.usage.total_tokens.toLocaleString() : ""),
        el("td", {}, c.busy ? el("span", { class: "badge" }, "call in flight") : ""),
        el("td", {}, new Date(c.created_at).toLocaleString()),
        el("td", {}, new Date(c.updated_at).toLocaleString())));
    }
    this.cursor = page.next_cursor;
    this.more.hidden = !this.cursor;
    this.status.textContent = this.rows.children.length ? ""
      : byText ? `No conversation's messages hold "${term}".`
      : term ? `No conversation id contains "${term}".`
        : "No conversations for this key yet. (Without configured keys every key is a tenant of its own: use the key your clients send.)";
  }
}

// -- one conversation --------------------------------------------------------------------------

class ConversationView {
  constructor(id, tenant, node = null) {
    this.id = id;
    this.tenant = tenant; // an admin key looking into another tenant
    this.api = tenant ? api.within(tenant) : api;
    this.expanded = new Set();
    this.selected = node; // (a search's match opens the conversation on its node)
    this.mode = { kind: "head" };
    this.signature = null;
    fill(crumb, el("a", { href: "#/" }, "conversations"), " / ", id);

    this.meta = el("span", { class: "meta" });
    this.status = el("span", { class: "status", role: "status" });
    this.graph = el("div", { class: "graph", tabindex: "-1" });
    this.messages = el("div", { class: "messages" });
    this.detail = el("aside", { class: "detail" }, el("p", { class: "notice" }, "Select a node to see it in full."));
    this.modeLabel = el("span", { class: "mode" });
    this.cancelMode = el("button", { class: "quiet", hidden: true, onclick: () => this.setMode({ kind: "head" }) }, "× back to the head");
    this.model = el("input", { class: "model", "aria-label": "model", placeholder: "model" });
    this.input = el("textarea", { "aria-label": "message", placeholder: "Message (Ctrl+Enter sends)" });
    this.send = el("button", { class: "primary", onclick: () => this.submit() }, "Send");
    this.input.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) this.submit();
    });
    this.tree = new TreeView(this.graph, {
      onSelect: (node) => this.select(node),
      onExpand: (run) => {
        this.expanded.add(run);
        this.drawGraph();
      },
    });
    fill(main,
      el("div", { class: "toolbar" }, this.meta, el("span", { class: "spacer" }), this.status,
        this.tokensPanel = el("details", { class: "tokens-per-call" }, el("summary", {}, "tokens per call"),
          this.tokensChart = el("div", {})),
        el("button", { onclick: () => this.reload() }, "Refresh"),
        el("button", { onclick: () => this.compact() }, "Compact now"),
        el("button", { onclick: () => this.compact("clear_tool_results"),
                       title: "replace old tool results by placeholders (no model call; the originals stay)" }, "Clear old tool results"),
        el("button", { onclick: () => this.download() }, "Export"),
        el("button", { class: "danger", onclick: () => this.confirmDelete() }, "Delete…")),
      el("div", { class: "workspace" },
        el("div", { class: "graph-pane" }, el("div", { class: "legend" },
          ...[["turn", "turn"], ["transform", "side call"], ["compaction", "compaction"], ["failed", "failed"], ["pending", "in flight"]]
            .map(([cls, label]) => el("span", {}, el("i", { class: cls }), label))), this.graph),
        el("div", { class: "chat" }, this.messages,
          this.tenant
            // the chat endpoint works in the key's own tenant only
            ? el("p", { class: "composer notice" }, `Read-only: an admin key sees tenant ${this.tenant}'s conversations; `
                + "to send in this one, sign in with a key of that tenant.")
            : el("div", { class: "composer" }, el("div", { class: "row" }, this.modeLabel, this.cancelMode, el("span", { class: "spacer" }), this.model),
              this.input, el("div", { class: "row" }, el("span", { class: "spacer" }), this.send))),
        this.detail));
    this.setMode({ kind: "head" });
    this.opened = performance.now();
    this.reload().then(() => this.graph.querySelector("svg")?.setAttribute("data-open-ms", (performance.now() - this.opened).toFixed(1)));
    this.timer = setInterval(() => this.poll(), POLL_MS);
    this.onEscape = (event) => {
      if (event.key !== "Escape") return;
      if (this.comparing) {
        this.comparing = null;
        this.say("");
      }
      this.closeCompare();
    };
    document.addEventListener("keydown", this.onEscape);
  }

  stop() {
    clearInterval(this.timer);
    this.stopped = true;
    this.closeCompare();
    document.removeEventListener("keydown", this.onEscape);
  }

  say(text, isError = false) {
    this.status.textContent = text;
    this.status.classList.toggle("error", isError);
  }

  failed(error) {
    if (!refused(error)) this.say(error.message, true);
  }

  async reload() {
    let conv, tree, path;
    try {
      [conv, tree, path] = await Promise.all([this.api.conversation(this.id), this.api.tree(this.id), this.api.path(this.id)]);
    } catch (error) {
      if (error instanceof ApiError && error.status === 404) {
        this.stop();
        fill(main, el("div", { class: "list" }, el("p", { class: "error" }, `Conversation ${this.id} does not exist (or was deleted).`),
          el("a", { href: "#/" }, "Back to the conversations")));
        return;
      }
      return this.failed(error);
    }
    if (this.stopped) return;
    this.conv = conv;
    this.nodes = tree.data;
    this.path = path.data;
    this.signature = this.signatureOf(conv);
    fill(this.meta, el("strong", {}, conv.id), ` · ${conv.node_count} nodes`,
      conv.usage?.total_tokens ? el("span", { class: "tokens", title: `prompt ${conv.usage.prompt_tokens.toLocaleString()}, `
        + `completion ${conv.usage.completion_tokens.toLocaleString()} (every call, side calls included)` },
      ` · ${conv.usage.total_tokens.toLocaleString()} tokens`,
      conv.usage.cached_tokens ? ` (${conv.usage.cached_tokens.toLocaleString()} of the prompt through the cache)` : null) : null,
      conv.busy ? el("span", { class: "badge" }, "call in flight") : null,
      conv.forked_from ? [" · fork of ", el("a", { href: conversationLink(conv.forked_from, this.tenant) }, conv.forked_from)] : null,
      this.tenant ? el("span", { class: "badge" }, `tenant ${this.tenant}`) : null,
      conv.metadata ? Object.entries(conv.metadata).map(([k, v]) => el("span", { class: "badge metadata" }, `${k}: ${v}`)) : null);
    if (this.selected && !this.nodes.some((n) => n.id === this.selected)) {
      // deleted elsewhere (a Responses delete, the conversation deleted and made again): its
      // detail and actions go with it
      this.selected = null;
      this.selectedNode = null;
      fill(this.detail, el("p", { class: "notice" }, "Select a node to see it in full."));
    }
    if (this.mode.node && !this.nodes.some((n) => n.id === this.mode.node.id)) this.setMode({ kind: "head" });
    this.drawGraph();
    drawPathTokens(this.tokensChart, this.path);
    drawChat(this.messages, this.path, this.tree.index, {
      selected: this.selected,
      onSelect: (node) => this.select(node),
      onSwitch: (node) => this.act(() => this.api.switchTo(this.id, node), "switched branch"),
    });
    if (!this.model.value) this.model.value = this.defaultModel();
    if (this.selected) await this.showDetail(this.selected);
  }

  signatureOf(conv) {
    return `${conv.node_count}|${conv.head_node_id}|${conv.updated_at}|${conv.busy}`;
  }

  // New nodes from other clients: the conversation's counters change, then the views reload.
  async poll() {
    if (document.hidden || this.sending || this.stopped) return;
    try {
      const conv = await this.api.conversation(this.id);
      if (this.signatureOf(conv) !== this.signature || await this.landed()) await this.reload();
    } catch (error) {
      if (error instanceof ApiError && error.status === 404) return this.reload();
      if (!refused(error)) this.say(`refresh failed: ${error.message}`, true);
    }
  }

  // A side call finishing changes none of the conversation's counters: while a drawn node is in
  // flight the tree is asked too, and a node that is no longer in flight redraws the views.
  async landed() {
    const pending = this.nodes?.filter((n) => n.status === "pending") ?? [];
    if (!pending.length) return false;
    const now = new Map((await this.api.tree(this.id)).data.map((n) => [n.id, n.status]));
    return pending.some((n) => now.get(n.id) !== "pending");
  }

  drawGraph() {
    this.tree.render(this.nodes, { head: this.conv.head_node_id, selected: this.selected, expanded: this.expanded,
                                   conversation: this.id });
  }

  defaultModel() {
    const withModel = [...this.path].reverse().find((n) => n.model) ?? [...this.nodes].reverse().find((n) => n.model);
    return withModel?.model ?? "";
  }

  // "Compare with…": the next node picked is shown beside this one.
  compare(nodeId) {
    this.comparing = nodeId;
    this.say("Pick another node to compare with (Esc cancels).");
  }

  async showCompare(first, second) {
    this.comparing = null;
    let a, b, ra, rb;
    try {
      [a, b, ra, rb] = await Promise.all([this.api.node(first), this.api.node(second), this.api.request(first),
                                          this.api.request(second)]);
    } catch (error) {
      return this.failed(error);
    }
    this.say("");
    this.closeCompare();
    this.compareView = el("section", { class: "compare-view", role: "dialog", "aria-label": "compare two nodes" });
    drawCompare(this.compareView, a, b, ra, rb, { onClose: () => this.closeCompare(), select: (id) => {
      this.closeCompare();
      this.select(id);
    } });
    document.body.append(this.compareView);
  }

  closeCompare() {
    this.compareView?.remove();
    this.compareView = null;
  }

  async select(nodeId) {
    if (this.comparing && this.comparing !== nodeId) return this.showCompare(this.comparing, nodeId);
    this.selected = nodeId;
    if (!this.tree.elements.has(nodeId)) this.drawGraph(); // inside a fold: unfold it
    else if (this.tree.selected !== nodeId) this.tree.select(nodeId, { quiet: true });
    for (const section of this.messages.querySelectorAll("[data-node]")) {
      section.classList.toggle("selected", section.dataset.node === nodeId);
    }
    await this.showDetail(nodeId);
  }

  async showDetail(nodeId) {
    let node;
    try {
      node = await this.api.node(nodeId);
    } catch (error) {
      return this.failed(error);
    }
    if (this.selected !== nodeId) return; // another node was chosen meanwhile
    this.selectedNode = node;
    drawDetail(this.detail, node, {
      head: this.conv.head_node_id,
      conversation: this.id,
      canSend: !this.tenant,
      actions: {
        select: (id) => this.select(id),
        request: (id) => this.api.request(id),
        switchTo: (id) => this.act(() => this.api.switchTo(this.id, id), "switched branch"),
        setHead: (id) => this.act(() => this.api.setHead(this.id, id), "head moved"),
        fork: (id) => this.fork(id),
        reply: () => this.setMode({ kind: "reply", node }),
        edit: () => this.setMode({ kind: "edit", node }),
        regenerate: () => this.regenerate(node),
        compare: (id) => this.compare(id),
      },
    });
  }

  async act(call, done) {
    try {
      await call();
      this.say(done);
      await this.reload();
    } catch (error) {
      this.failed(error);
    }
  }

  async fork(nodeId) {
    try {
      const fork = await this.api.fork(this.id, nodeId);
      location.hash = conversationLink(fork.id, this.tenant);
    } catch (error) {
      this.failed(error);
    }
  }

  async compact(method) {
    this.say(method ? "clearing…" : "compacting…");
    try {
      const result = await this.api.compact(this.id, method);
      const done = method ? `${result.cleared_results} tool results cleared` : "compacted";
      this.say(result.compacted ? done : `not ${method ? "cleared" : "compacted"}: ${result.reason ?? "nothing to do"}`);
      await this.reload();
    } catch (error) {
      this.failed(error);
    }
  }

  // The export needs the bearer key, so a plain link cannot fetch it: fetch, then save the Blob.
  async download() {
    this.say("exporting…");
    try {
      const blob = await this.api.exportTree(this.id);
      const link = el("a", { href: URL.createObjectURL(blob), download: `${this.id}.jsonl` });
      document.body.append(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(link.href), 60_000);
      this.say("exported");
    } catch (error) {
      this.failed(error);
    }
  }

  confirmDelete() {
    const dialog = el("dialog", { class: "confirm" },
      el("p", {}, `Delete conversation ${this.id} and its ${this.conv?.node_count ?? ""} nodes?`),
      el("p", { class: "notice" }, "Nodes that a fork of it still reaches are kept for the fork."),
      el("form", { method: "dialog", class: "row" },
        el("button", { value: "cancel", autofocus: true }, "Cancel"),
        el("button", { value: "delete", class: "danger" }, "Delete")));
    dialog.addEventListener("close", async () => {
      dialog.remove();
      if (dialog.returnValue !== "delete") return;
      try {
        await this.api.remove(this.id);
        location.hash = "#/";
      } catch (error) {
        this.failed(error);
      }
    });
    document.body.append(dialog);
    dialog.showModal();
  }

  // -- the composer --------------------------------------------------------------------------

  setMode(mode) {
    this.mode = mode;
    const short = (node) => node.id.slice(-8);
    const kept = mode.kind === "edit" ? attachmentsOf(mode.node.sent, mode.node.api) : 0;
    this.modeLabel.textContent = {
      head: "Send from the head",
      reply: mode.node ? `Reply under node …${short(mode.node)} (a new branch)` : "",
      edit: mode.node ? `Edit the question of node …${short(mode.node)} (a new branch beside it`
        + `${kept ? `; its ${kept === 1 ? "image or file is" : `${kept} images and files are`} kept` : ""})` : "",
    }[mode.kind];
    this.cancelMode.hidden = mode.kind === "head";
    if (mode.kind === "edit") this.input.value = lastUserText(mode.node.sent, mode.node.api);
    if (mode.node?.model) this.model.value = mode.node.model;
    if (mode.kind !== "head") this.input.focus();
  }

  parentFor(node) {
    return node.parent_id ?? "root";
  }

  async submit() {
    const text = this.input.value.trim();
    if (!text || this.sending) return;
    const { kind, node } = this.mode;
    const call = kind === "edit"
      ? { messages: withQuestion(node.sent, node.api, text), parent: this.parentFor(node) }
      : { messages: [{ role: "user", content: text }], parent: kind === "reply" ? node.id : null };
    if (await this.stream(call, text)) {
      this.input.value = "";
      this.setMode({ kind: "head" });
    }
  }

  // Another answer beside the node's: a side call's is a side call too (it stays out of the
  // conversation's context and never moves the head).
  regenerate(node) {
    return this.stream({ messages: asChatMessages(node.sent, node.api), parent: this.parentFor(node), model: node.model,
                         kind: node.kind }, lastUserText(node.sent, node.api));
  }

  // One chat call through the chat endpoint, its answer streamed into the chat; then the views
  // reload and the new node is selected.
  async stream({ messages, parent, model, kind }, shown) {
    const chosen = model || this.model.value.trim();
    if (!chosen) {
      this.say("Name a model first.", true);
      this.model.focus();
      return false;
    }
    this.sending = true;
    this.send.disabled = true;
    const pending = drawPending(this.messages, shown);
    this.say("answering…");
    let created = null;
    let ok = true;
    try {
      const headers = await this.api.chat(this.id, { model: chosen, messages, parent, kind, onDelta: (t) => pending.answer(t) });
      created = headers.get("x-node-id");
      this.say("answered");
    } catch (error) {
      ok = false;
      if (refused(error)) return false;
      pending.fail(error.message);
      this.say(error.message, true);
    } finally {
      this.sending = false;
      this.send.disabled = false;
    }
    if (created) this.selected = created;
    await this.reload();
    return ok;
  }
}

signOutButton.addEventListener("click", () => signOut());
window.addEventListener("hashchange", route);
route();

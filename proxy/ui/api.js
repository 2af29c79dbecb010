// The only way the viewer talks to Branchpoint: the admin API and the chat endpoint, with the
// bearer key the user signed in with (kept in sessionStorage: gone when the tab closes).

const KEY = "branchpoint.key";

export class ApiError extends Error {
  constructor(status, message, code) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export function storedKey() {
  return sessionStorage.getItem(KEY);
}

export function storeKey(key) {
  if (key) sessionStorage.setItem(KEY, key);
  else sessionStorage.removeItem(KEY);
}

const enc = encodeURIComponent;

// The server's root, also when it is mounted under a path prefix: this module lives at <root>/ui/.
const ROOT = new URL("..", import.meta.url).pathname.replace(/\/$/, "");

export class Api {
  // tenant: set when an admin key looks into another tenant's conversation (`?tenant=`).
  constructor(key, tenant = null) {
    this.key = key;
    this.tenant = tenant;
  }

  within(tenant) {
    return new Api(this.key, tenant);
  }

  async raw(method, path, body, headers = {}) {
    if (this.tenant && path.startsWith("/admin/conversations/")) {
      path += `${path.includes("?") ? "&" : "?"}tenant=${enc(this.tenant)}`;
    }
    const init = { method, headers: { Authorization: `Bearer ${this.key}`, ...headers } };
    if (body instanceof Blob) {
      init.body = body; // a file, sent as it is (an import)
    } else if (body !== undefined) {
      init.body = JSON.stringify(body);
      init.headers["Content-Type"] = "application/json";
    }
    const response = await fetch(ROOT + path, init);
    if (!response.ok) {
      let message = `${response.status} ${response.statusText}`;
      let code = null;
      try {
        const error = (await response.json()).error;
        message = error.message || message;
        code = error.code;
      } catch {
        // not JSON: keep the status line
      }
      throw new ApiError(response.status, message, code);
    }
    return response;
  }

  async json(method, path, body) {
    return (await this.raw(method, path, body)).json();
  }

  conversations(cursor, search, words) {
    const query = new URLSearchParams({ limit: "25" });
    if (cursor) query.set("cursor", cursor);
    if (search) query.set("search", search);
    if (words) query.set("q", words); // by what was said: ranked, each with its best node
    return this.json("GET", `/admin/conversations?${query}`);
  }
  conversation(id) { return this.json("GET", `/admin/conversations/${enc(id)}`); }
  usage(since, until) {
    const query = new URLSearchParams(Object.entries({ since, until }).filter(([, v]) => v)).toString();
    return this.json("GET", `/admin/usage${query ? `?${query}` : ""}`);
  }
  tree(id) { return this.json("GET", `/admin/conversations/${enc(id)}/tree`); }
  path(id) { return this.json("GET", `/admin/conversations/${enc(id)}/path`); }
  node(id) { return this.json("GET", `/admin/nodes/${enc(id)}`); }
  switchTo(id, node) { return this.json("POST", `/admin/conversations/${enc(id)}/switch`, { node_id: node }); }
  setHead(id, node) { return this.json("PUT", `/admin/conversations/${enc(id)}/head`, { node_id: node }); }
  fork(id, node) { return this.json("POST", `/admin/conversations/${enc(id)}/fork`, { node_id: node }); }
  // method: "summary" (default) or "clear_tool_results" (context editing: no model call)
  compact(id, method) {
    return this.json("POST", `/admin/conversations/${enc(id)}/compact`, method ? { method } : undefined);
  }
  remove(id) { return this.json("DELETE", `/admin/conversations/${enc(id)}`); }
  // The whole tree as JSON Lines (what `branchpoint conversations import` reads), as a Blob.
  async exportTree(id) { return (await this.raw("GET", `/admin/conversations/${enc(id)}/export`)).blob(); }
  // An export (a File or Blob) re-created as the new conversation `id`.
  async importTree(id, file) {
    return (await this.raw("POST", `/admin/conversations/${enc(id)}/import`, file,
      { "Content-Type": "application/jsonl" })).json();
  }

  async request(node) {
    const response = await this.raw("GET", `/admin/nodes/${enc(node)}/request`);
    return { body: await response.text(), verified: response.headers.get("x-request-verified") };
  }

  // One streamed chat call in a conversation; onDelta(text) for each piece of the answer.
  // Returns the response headers (the new node's id among them).
  // kind: "transform" for a side call (it never moves the head), else a turn.
  async chat(conversation, { model, messages, parent, kind, onDelta }) {
    // Delta mode whatever the server's default: the viewer sends only the new messages.
    const headers = { Accept: "text/event-stream", "X-Context-Mode": "delta" };
    if (parent) headers["X-Parent-Node-Id"] = parent;
    if (kind === "transform") headers["X-Node-Kind"] = "transform";
    const response = await this.raw("POST", `/c/${enc(conversation)}/v1/chat/completions`,
      { model, messages, stream: true }, headers);
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true }).replaceAll("\r\n", "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") continue;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new ApiError(502, chunk.error.message, chunk.error.code);
          const delta = chunk.choices?.[0]?.delta?.content;
          if (delta) onDelta(delta);
        }
      }
    }
    return response.headers;
  }
}

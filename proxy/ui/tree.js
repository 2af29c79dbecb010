// The conversation tree drawn as an SVG graph (docs/viewer.md#the-graph).
//
// Layout: every node hangs under its parent; a compaction node (which has no parent) hangs under
// the node it replaces, linked by a dashed edge. Leaves take the next free column in depth-first
// order and a parent sits above its first child, so a conversation's main line stays straight and
// each branch opens a column to its right. Long single-child runs fold into one box (a compaction
// is never folded away).
//
// Pure layout (`layoutTree`) is separate from drawing (`TreeView`), which updates the selection
// and the head by toggling classes, so that selecting a node in a 1,000-node tree touches two
// elements, not a thousand.

const SVG = "http://www.w3.org/2000/svg";
const COL = 30;
const ROW = 30;
const PAD = 18;
const R = 8;
const LABEL_ROOM = 240;
const CHAR = 6.3; // average width of a label character, px
export const FOLD_MIN = 12; // runs at least this long fold (their first node and last two stay)

// nodes: the /tree rows, oldest first. -> {byId, children, layoutParent, roots}
export function indexTree(nodes) {
  const byId = new Map(nodes.map((n) => [n.id, n]));
  const children = new Map();
  const layoutParent = new Map();
  const roots = [];
  for (const n of nodes) {
    const up = n.parent_id ?? n.compacted_from;
    if (up && byId.has(up)) {
      layoutParent.set(n.id, up);
      if (!children.has(up)) children.set(up, []);
      children.get(up).push(n.id);
    } else {
      roots.push(n.id);
    }
  }
  return { byId, children, layoutParent, roots };
}

// The node ids from `head` up to its root (following compactions to what they replace).
export function headPath(index, head) {
  const path = new Set();
  for (let id = head; id && index.byId.has(id) && !path.has(id); id = index.layoutParent.get(id)) path.add(id);
  return path;
}

// The siblings of a node as the branch arrows count them: same parent and same kind (roots among
// the roots of that kind; compaction nodes among those replacing the same node), oldest first.
export function siblingsOf(index, id) {
  if (!index.groups) {
    index.groups = new Map();
    for (const n of index.byId.values()) {
      // (a turn and items added without a call are one kind here, as the server counts them:
      // an item delete's branch begins with an items node beside the turn it copies)
      const kind = n.kind === "items" ? "turn" : n.kind;
      const key = n.parent_id ? `p ${n.parent_id} ${kind}`
        : n.kind === "compaction" ? `c ${n.compacted_from}` : `r ${kind}`;
      if (!index.groups.has(key)) index.groups.set(key, []);
      index.groups.get(key).push(n.id);
      index.groupOf ??= new Map();
      index.groupOf.set(n.id, index.groups.get(key));
    }
  }
  return index.groupOf?.get(id) ?? [id];
}

// -> {points: Map id -> {x, y}, folds: [{id, x, y, hidden: [ids], last}], edges, width, height}
// `expanded`: ids of run starts the user unfolded; `keepOpen`: ids that must stay visible.
export function layoutTree(index, { expanded = new Set(), keepOpen = new Set() } = {}) {
  // 1. The drawn tree: items are nodes or fold boxes, each with the items under it.
  const items = [];
  const item = (props) => {
    const made = { ...props, children: [], x: 0, y: 0 };
    items.push(made);
    return made;
  };
  // A run continues from a node into its only child; a compaction always shows, so it breaks runs.
  const continues = (id) => {
    const kids = index.children.get(id) || [];
    return kids.length === 1 && index.byId.get(kids[0]).kind !== "compaction";
  };
  const runFrom = (id) => {
    const run = [id];
    while (continues(run[run.length - 1])) run.push(index.children.get(run[run.length - 1])[0]);
    return run;
  };
  const startsRun = (id) => {
    const up = index.layoutParent.get(id);
    return continues(id) && !(up && continues(up));
  };
  const tops = [];
  const stack = index.roots.map((id) => ({ id, under: null, edge: "tree" })).reverse();
  while (stack.length) {
    const { id, under, edge } = stack.pop();
    const made = item({ id, edge });
    (under ? under.children : tops).push(made);
    let tail = made;
    let kids = index.children.get(id) || [];
    if (startsRun(id)) {
      const run = runFrom(id);
      const hidden = run.slice(1, -2);
      if (run.length >= FOLD_MIN && !expanded.has(id) && !hidden.some((h) => keepOpen.has(h))) {
        const fold = item({ fold: id, hidden, edge: "fold" });
        made.children.push(fold);
        tail = fold;
        kids = [run[run.length - 2]];
      }
    }
    for (let i = kids.length - 1; i >= 0; i--) {
      const node = index.byId.get(kids[i]);
      stack.push({ id: kids[i], under: tail, edge: tail.fold ? "fold" : node.parent_id ? "tree" : "compacted" });
    }
  }

  // 2. Rows by depth; columns: leaves left to right in depth-first order, a parent above its
  // first child.
  const order = [];
  const walk = tops.map((t) => [t, 0]).reverse();
  let column = 0;
  let maxRow = 0;
  while (walk.length) {
    const [at, row] = walk.pop();
    at.y = row;
    maxRow = Math.max(maxRow, row);
    order.push(at);
    if (!at.children.length) at.x = column++;
    for (let i = at.children.length - 1; i >= 0; i--) walk.push([at.children[i], row + 1]);
  }
  for (let i = order.length - 1; i >= 0; i--) if (order[i].children.length) order[i].x = order[i].children[0].x;

  const points = new Map();
  const folds = [];
  const edges = []; // [from item, to item, kind]
  for (const at of items) {
    if (at.fold) folds.push({ id: at.fold, x: at.x, y: at.y, hidden: at.hidden });
    else points.set(at.id, { x: at.x, y: at.y });
    for (const child of at.children) edges.push([at, child, child.edge]);
  }
  const labels = LABEL_ROOM; // the labels right of the last column
  return { points, folds, edges, width: Math.max(column, 1) * COL + 2 * PAD + labels, height: (maxRow + 1) * ROW + 2 * PAD };
}

const cx = (x) => PAD + x * COL + COL / 2;
const cy = (y) => PAD + y * ROW + R;

function svg(tag, attrs = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  return node;
}

function statusClass(node) {
  if (node.status === "pending") return "pending";
  if (node.status === "failed" || (node.outcome && node.outcome !== "success")) return "failed";
  return "ok";
}

export class TreeView {
  // onSelect(id) when a node is chosen (click, keyboard); onExpand(foldId) when a fold opens.
  constructor(container, { onSelect, onExpand }) {
    this.container = container;
    this.onSelect = onSelect;
    this.onExpand = onExpand;
    this.elements = new Map();
    this.selected = null;
  }

  // Draws the whole graph; returns the milliseconds layout and drawing took.
  render(nodes, { head, selected, expanded, conversation }) {
    const started = performance.now();
    this.index = indexTree(nodes);
    this.head = head;
    this.onPath = headPath(this.index, head);
    const keepOpen = new Set([head, selected].filter(Boolean));
    this.layout = layoutTree(this.index, { expanded, keepOpen });
    const { points, folds, edges, width, height } = this.layout;

    const root = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "tree",
                              "aria-label": "conversation tree" });
    const pathOf = { tree: [], head: [], compacted: [], fold: [] };
    for (const [a, b, kind] of edges) {
      const x1 = cx(a.x), y1 = cy(a.y), x2 = cx(b.x), y2 = cy(b.y);
      const d = x1 === x2 ? `M${x1} ${y1}V${y2}` : `M${x1} ${y1}V${y2 - ROW / 2}H${x2}V${y2}`;
      const onHead = this.onPath.has(a.id ?? a.hidden[0]) && this.onPath.has(b.id ?? b.hidden.at(-1));
      pathOf[kind === "compacted" ? "compacted" : onHead ? "head" : "tree"].push(d);
    }
    for (const [kind, ds] of Object.entries(pathOf)) {
      if (ds.length) root.append(svg("path", { class: `edge ${kind}`, d: ds.join("") }));
    }

    // a label runs right until the next thing drawn on its row
    const rows = new Map();
    for (const [key, point] of [...points, ...folds.map((f) => [f.id + "#fold", f])]) {
      if (!rows.has(point.y)) rows.set(point.y, []);
      rows.get(point.y).push([point.x, key]);
    }
    const right = new Map();
    for (const row of rows.values()) {
      row.sort((a, b) => a[0] - b[0]);
      for (let i = 0; i + 1 < row.length; i++) right.set(row[i][1], (row[i + 1][0] - row[i][0]) * COL);
    }

    this.elements = new Map();
    for (const [id, point] of points) {
      const node = this.index.byId.get(id);
      const classes = ["node", node.kind, statusClass(node)];
      if (node.method === "clear_tool_results") classes.push("cleared");  // (context editing: no summary)
      if (this.onPath.has(id)) classes.push("onpath");
      if (id === head) classes.push("head");
      if (conversation && node.conversation_id !== conversation) classes.push("inherited");
      const g = svg("g", { class: classes.join(" "), "data-id": id, tabindex: "-1", role: "treeitem",
                           transform: `translate(${cx(point.x)},${cy(point.y)})`,
                           "aria-label": `${node.kind} ${node.status}${id === head ? " (head)" : ""}: ${node.preview ?? ""}` });
      g.append(svg("circle", { r: R }));
      const title = svg("title");
      title.textContent = `${node.kind} · ${node.status}${node.model ? ` · ${node.model}` : ""}\n${node.preview ?? ""}`;
      g.append(title);
      const room = Math.floor(((right.get(id) ?? LABEL_ROOM) - R - 8) / CHAR);
      const what = node.method === "clear_tool_results" ? "old tool results cleared" : node.preview ?? node.kind;
      const text = `${id === head ? "head · " : ""}${what}`.replace(/\s+/g, " ");
      if (room >= 4) {
        const label = svg("text", { x: R + 5, y: 4, class: id === head ? "head-label" : "" });
        label.textContent = text.length > room ? `${text.slice(0, room - 1)}…` : text;
        g.append(label);
      }
      root.append(g);
      this.elements.set(id, g);
    }
    for (const fold of folds) {
      const containsHead = fold.hidden.some((id) => this.onPath.has(id));
      const g = svg("g", { class: `fold${containsHead ? " onpath" : ""}`, "data-fold": fold.id, tabindex: "0", role: "button",
                           "aria-label": `${fold.hidden.length} nodes folded: press Enter to unfold`,
                           transform: `translate(${cx(fold.x)},${cy(fold.y)})` });
      g.append(svg("rect", { x: -9, y: -9, width: 18, height: 18, rx: 4 }));
      const label = svg("text", { x: 14, y: 4 });
      label.textContent = `${fold.hidden.length} more`;
      g.append(label);
      root.append(g);
    }
    root.addEventListener("click", (event) => this.#clicked(event));
    root.addEventListener("keydown", (event) => this.#key(event));
    const first = !this.svg;
    const { scrollLeft, scrollTop } = this.container;
    this.container.replaceChildren(root);
    this.svg = root;
    if (first) this.elements.get(head)?.scrollIntoView({ block: "center", inline: "center" });
    else Object.assign(this.container, { scrollLeft, scrollTop });
    this.select(selected && this.elements.has(selected) ? selected : null, { quiet: true });
    const elapsed = performance.now() - started;
    root.dataset.nodes = String(nodes.length);
    root.dataset.renderMs = elapsed.toFixed(1);
    return elapsed;
  }

  select(id, { quiet = false, focus = false } = {}) {
    if (this.selected && this.elements.has(this.selected)) {
      const old = this.elements.get(this.selected);
      old.classList.remove("selected");
      old.setAttribute("tabindex", "-1");
      old.removeAttribute("aria-selected");
    }
    this.selected = id;
    const element = id ? this.elements.get(id) : null;
    if (element) {
      element.classList.add("selected");
      element.setAttribute("tabindex", "0");
      element.setAttribute("aria-selected", "true");
      if (focus) element.focus();
      element.scrollIntoView?.({ block: "nearest", inline: "nearest" });
    } else if (this.elements.size) { // nothing selected: Tab lands on the head (or the first node)
      (this.elements.get(this.head) ?? this.elements.values().next().value).setAttribute("tabindex", "0");
    }
    if (!quiet && id) this.onSelect(id);
  }

  #clicked(event) {
    const fold = event.target.closest("[data-fold]");
    if (fold) return this.onExpand(fold.dataset.fold);
    const node = event.target.closest("[data-id]");
    if (node) this.select(node.dataset.id, { focus: true });
  }

  // Arrow keys walk the tree: up to the parent, down to a child (the one on the head path first),
  // left/right to the neighbouring sibling; Home goes to the root, End to the head.
  #key(event) {
    const fold = event.target.closest("[data-fold]");
    if (fold && (event.key === "Enter" || event.key === " ")) {
      event.preventDefault();
      return this.onExpand(fold.dataset.fold);
    }
    const at = event.target.closest("[data-id]")?.dataset.id ?? this.selected;
    if (!at) return;
    if (event.key === "Enter" || event.key === " ") {
      event.preventDefault();
      return this.select(at, { focus: true });
    }
    const visible = (id) => this.elements.has(id);
    const up = (id) => this.index.layoutParent.get(id);
    let next = null;
    if (event.key === "ArrowUp") {
      for (next = up(at); next && !visible(next);) next = up(next);
    } else if (event.key === "ArrowDown") {
      let kids = this.index.children.get(at) || [];
      next = kids.find((k) => this.onPath.has(k)) ?? kids[0];
      while (next && !visible(next)) {
        kids = this.index.children.get(next) || [];
        next = kids.find((k) => this.onPath.has(k)) ?? kids[0];
      }
    } else if (event.key === "ArrowLeft" || event.key === "ArrowRight") {
      const parent = up(at);
      const row = parent ? this.index.children.get(parent) : this.index.roots;
      const i = row.indexOf(at) + (event.key === "ArrowLeft" ? -1 : 1);
      next = row[i] ?? null;
    } else if (event.key === "Home") {
      next = [...this.onPath].pop() ?? this.index.roots[0];
    } else if (event.key === "End") {
      next = this.head;
    } else {
      return;
    }
    event.preventDefault();
    if (next && visible(next)) this.select(next, { focus: true });
  }
}

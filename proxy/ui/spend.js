// Spend you can see (docs/viewer.md#spend): tokens per day by model -- prompt, cached, completion --
// over the last 30 days (from
// /admin/usage, one window per day), and a conversation's tokens per call along its path. Plain SVG.

const SVG = "http://www.w3.org/2000/svg";
const PALETTE = ["#2f6fde", "#0f9d8a", "#8b5cf6", "#d9a400", "#d14343", "#5b6b7f", "#e66fb0", "#3fa34d"];
const DAY_MS = 86400000;

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== undefined && v !== null) node.setAttribute(k, String(v));
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

// The prompt and completion tokens of a usage object, in any API's terms (Anthropic's input
// tokens leave out its prompt cache's reads and writes: counted back in; Responses' count them,
// with its input_tokens_details). As the database's bp_prompt_tokens and bp_cached_tokens.
export function tokensOf(usage) {
  if (!usage || typeof usage !== "object") return { prompt: 0, completion: 0, cached: 0 };
  const n = (v) => (Number.isFinite(v) && v > 0 ? v : 0);
  const cached = n(usage.prompt_tokens_details?.cached_tokens) + n(usage.input_tokens_details?.cached_tokens)
    + n(usage.cache_read_input_tokens) + n(usage.cache_creation_input_tokens); // (as cached_tokens: reads and writes)
  const prompt = usage.prompt_tokens !== undefined ? n(usage.prompt_tokens)
    : usage.input_tokens_details && typeof usage.input_tokens_details === "object" ? n(usage.input_tokens)
    : n(usage.input_tokens) + n(usage.cache_read_input_tokens) + n(usage.cache_creation_input_tokens);
  return { prompt, completion: n(usage.completion_tokens ?? usage.output_tokens), cached };
}

function bars({ width, height, columns, label, stacks }) {
  // stacks: per column, [{value, color, title}] bottom first
  const max = Math.max(1, ...stacks.map((s) => s.reduce((t, p) => t + p.value, 0)));
  const top = 14, bottom = 18, left = 44;
  const plot = height - top - bottom;
  const step = (width - left) / Math.max(1, columns.length);
  const chart = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "data-max": max });
  chart.append(svg("text", { x: 0, y: 11, class: "axis" }, `${max.toLocaleString()} tokens`));
  chart.append(svg("line", { x1: left - 4, y1: top, x2: width, y2: top, class: "grid" }));
  chart.append(svg("line", { x1: left - 4, y1: top + plot, x2: width, y2: top + plot, class: "grid" }));
  columns.forEach((column, i) => {
    let y = top + plot;
    const group = svg("g", { class: "bar", "data-column": column, "data-total": stacks[i].reduce((t, p) => t + p.value, 0) });
    for (const part of stacks[i]) {
      if (!part.value) continue;
      const h = (part.value / max) * plot;
      y -= h;
      group.append(svg("rect", { x: left + i * step + 1, y, width: Math.max(1, step - 2), height: h, fill: part.color,
                                 "data-kind": part.kind }, svg("title", {}, part.title)));
    }
    chart.append(group);
    if (label(i)) chart.append(svg("text", { x: left + i * step, y: height - 4, class: "axis" }, label(i)));
  });
  return chart;
}

function shade(color, light) {
  return light ? `${color}88` : color;
}

// days: [{day: "YYYY-MM-DD", lines: [{model, prompt_tokens, completion_tokens}]}], oldest first
export function drawDaily(container, days) {
  const models = [...new Set(days.flatMap((d) => d.lines.map((l) => l.model ?? "no model")))].sort();
  const color = new Map(models.map((m, i) => [m, PALETTE[i % PALETTE.length]]));
  const stacks = days.map((d) => d.lines.flatMap((l) => {
    const model = l.model ?? "no model";
    const cached = Math.min(l.cached_tokens ?? 0, l.prompt_tokens);
    return [
      { value: cached, color: `${color.get(model)}44`, kind: "cached",
        title: `${d.day} · ${model} · prompt through the cache ${cached.toLocaleString()}` },
      { value: l.prompt_tokens - cached, color: shade(color.get(model), true), kind: "prompt",
        title: `${d.day} · ${model} · prompt ${l.prompt_tokens.toLocaleString()}` },
      { value: l.completion_tokens, color: color.get(model), kind: "completion",
        title: `${d.day} · ${model} · completion ${l.completion_tokens.toLocaleString()}` },
    ];
  }));
  const chart = bars({ width: 640, height: 150, columns: days.map((d) => d.day), stacks,
                       label: (i) => (i % 7 === 0 || i === days.length - 1 ? days[i].day.slice(5) : "") });
  chart.classList.add("spend-daily");
  const legend = document.createElement("p");
  legend.className = "legend-models";
  for (const m of models) {
    const key = document.createElement("span");
    const swatch = document.createElement("i");
    swatch.style.background = color.get(m);
    key.append(swatch, ` ${m}`);
    legend.append(key);
  }
  legend.append(" (palest: prompt through the cache -- read from it or written to it, lighter: the rest of the prompt, darker: completion)");
  container.replaceChildren(chart, legend);
}

// The last 30 days, one /admin/usage window per UTC day (the days with calls only are drawn as bars).
export async function loadDaily(api, now = new Date()) {
  const end = Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), now.getUTCDate()) + DAY_MS;
  const windows = Array.from({ length: 30 }, (_, i) => end - (30 - i) * DAY_MS);
  const reports = await Promise.all(windows.map((start) => api.usage(new Date(start).toISOString(),
                                                                     new Date(start + DAY_MS).toISOString())));
  return windows.map((start, i) => ({ day: new Date(start).toISOString().slice(0, 10), lines: reports[i].data }));
}

// path: /path rows, root first -- one bar per call along it (prompt below, completion above)
export function drawPathTokens(container, path) {
  const calls = path.filter((n) => n.usage);
  const stacks = calls.map((n) => {
    const t = tokensOf(n.usage);
    return [
      { value: t.prompt, color: "#2f6fde88", kind: "prompt", title: `${n.id.slice(-12)} · prompt ${t.prompt.toLocaleString()}`
        + (t.cached ? ` (${t.cached.toLocaleString()} cached)` : "") },
      { value: t.completion, color: "#2f6fde", kind: "completion", title: `${n.id.slice(-12)} · completion ${t.completion.toLocaleString()}` },
    ];
  });
  const chart = bars({ width: Math.max(240, Math.min(900, 12 * calls.length + 60)), height: 120, columns: calls.map((n) => n.id),
                       stacks, label: (i) => (i === 0 ? "1" : i === calls.length - 1 ? String(calls.length) : "") });
  chart.classList.add("spend-path");
  container.replaceChildren(chart);
}

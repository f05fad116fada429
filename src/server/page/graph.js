// The run's calls as a graph: one node per call, one edge per dependency (a call whose params
// read a path another call writes: the call's `waits_for`), drawn as inline SVG and redrawn
// with every update of the run. Nodes are placed in columns by how deep their dependencies go.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const NODE_W = 150;
const NODE_H = 34;
const COL_GAP = 70;
const ROW_GAP = 14;

function svg(tag, attrs, ...children) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== undefined && v !== null) e.setAttribute(k, String(v));
  }
  for (const c of children) {
    if (c !== null && c !== undefined) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

// The dependency edges [{from, to}] of `calls`: one per call a call waits for (`waits_for`:
// the earlier calls of its agent that write a path it reads, as the server's view has them).
function dependencies(calls) {
  const ids = new Set(calls.map((c) => c.id));
  return calls.flatMap((c) => (c.waits_for || []).filter((w) => ids.has(w)).map((w) => ({ from: w, to: c.id })));
}

function renderGraph(run) {
  const box = $("#graph");
  const calls = run.calls || [];
  if (!calls.length) {
    box.replaceChildren();
    return;
  }
  const edges = dependencies(calls);
  const level = new Map();
  for (const c of [...calls].sort((a, b) => a.id - b.id)) {
    const deps = edges.filter((e) => e.to === c.id).map((e) => level.get(e.from) || 0);
    level.set(c.id, deps.length ? Math.max(...deps) + 1 : 0);
  }
  const rows = new Map();
  const pos = new Map();
  for (const c of [...calls].sort((a, b) => a.id - b.id)) {
    const col = level.get(c.id);
    const row = rows.get(col) || 0;
    rows.set(col, row + 1);
    pos.set(c.id, { x: 4 + col * (NODE_W + COL_GAP), y: 4 + row * (NODE_H + ROW_GAP) });
  }
  const width = 8 + (Math.max(...level.values()) + 1) * (NODE_W + COL_GAP) - COL_GAP;
  const height = 8 + Math.max(...rows.values()) * (NODE_H + ROW_GAP) - ROW_GAP;
  const arrow = svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" },
    svg("path", { d: "M 0 0 L 10 5 L 0 10 z", class: "arrowhead" }));
  const lines = edges.map((e) => {
    const a = pos.get(e.from);
    const b = pos.get(e.to);
    const x1 = a.x + NODE_W, y1 = a.y + NODE_H / 2, x2 = b.x, y2 = b.y + NODE_H / 2;
    const mid = (x1 + x2) / 2;
    return svg("path", { class: "edge", "data-from": e.from, "data-to": e.to, "marker-end": "url(#arrow)",
      d: `M ${x1} ${y1} C ${mid} ${y1}, ${mid} ${y2}, ${x2} ${y2}` },
    svg("title", {}, "#" + e.to + " reads what #" + e.from + " writes"));
  });
  const nodes = calls.map((c) => {
    const p = pos.get(c.id);
    const status = c.interrupted && c.status === "awaiting_approval" ? "awaiting_approval" : c.status;
    let label = (c.tool || "?") + " #" + c.id;
    if (label.length > 20) label = label.slice(0, 19) + "…";
    return svg("g", { class: "node", "data-call-id": c.id, "data-status": status, transform: `translate(${p.x},${p.y})` },
      svg("title", {}, (c.tool || "?") + " #" + c.id + ": " + statusLabel(status)),
      svg("rect", { width: NODE_W, height: NODE_H, rx: 7 }),
      svg("circle", { class: "dot", cx: 13, cy: NODE_H / 2, r: 5 }),
      svg("text", { x: 24, y: NODE_H / 2 + 4 }, label));
  });
  box.replaceChildren(svg("svg", { class: "graph", width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
    "aria-label": calls.length + " calls, " + edges.length + " dependencies" },
  svg("defs", {}, arrow), ...lines, ...nodes));
}

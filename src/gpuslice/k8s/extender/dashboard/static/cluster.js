// gpuslice cluster dashboard: reads view.json (the whole cluster, one request) every 3 s and redraws in
// place. The GPU map is virtualised: its scroll area is sized for every node, but only the rows in view
// (and a few either side) are in the DOM, so 1,000 nodes cost the same as 10.
//
// Safety rule: every name comes from the cluster (pods, nodes, claims, reasons), so this script only
// creates elements and sets their text (textContent, createTextNode, setAttribute on title/class/data-*);
// it never assigns HTML. The page's Content-Security-Policy forbids inline scripts too.
"use strict";

const REFRESH_MS = 3000;
const TIMEOUT_MS = 10000; // a 1,000-node view is a few MB
const ROW_PX = 58; // one node's row; .node's height in cluster.css
const OVERSCAN_ROWS = 4; // rows drawn above and below the visible ones, so a small scroll shows no gap
const LIST_SHOWN = 200; // pending pods and claims listed; the count says how many more match
// A MIG instance's start counts in the GPU's memory slices, 8 on the A100 and H100 (hardware/mig.py).
const MIG_SLOTS = 8;
const SVG = "http://www.w3.org/2000/svg";

const state = {
  view: null, // the last view.json
  search: [], // per node: its name and its pods' names, lower case, for the filter
  shown: [], // indices into view.nodes of the nodes the filter keeps, in order
  query: "",
  lastOk: null, // Date of the last successful refresh
  rendered: false, // the map has been drawn once (performance mark "map-rendered")
};

// ---- small DOM helpers: text only -------------------------------------------------------------------

function el(tag, className, ...children) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function withTitle(node, title) {
  node.setAttribute("title", String(title));
  return node;
}

function svg(tag, attributes) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, String(value));
  return node;
}

function percent(value) {
  return `${Number(value).toFixed(1).replace(/\.0$/, "")}%`;
}

function mib(value) {
  return value >= 1024 ? `${(value / 1024).toFixed(1).replace(/\.0$/, "")} GiB` : `${value} MiB`;
}

function formatAge(seconds) {
  const s = Math.max(0, seconds);
  if (s < 120) return `${Math.round(s)}s`;
  if (s < 7200) return `${Math.round(s / 60)}m`;
  return `${(s / 3600).toFixed(1)}h`;
}

function clock(epochSeconds) {
  return new Date(epochSeconds * 1000).toLocaleTimeString([], { hour12: false });
}

function podName(pod) {
  // "namespace/name" -> "name": the label inside a segment is short; the full name is its title
  const slash = pod.indexOf("/");
  return slash < 0 ? pod : pod.slice(slash + 1);
}

// ---- fetching ---------------------------------------------------------------------------------------

async function getView() {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), TIMEOUT_MS);
  try {
    const response = await fetch("view.json", { signal: controller.signal, cache: "no-store" });
    if (!response.ok) throw new Error(`view.json: HTTP ${response.status}`);
    return await response.json();
  } finally {
    clearTimeout(timer);
  }
}

// ---- totals -----------------------------------------------------------------------------------------

function drawTotals(totals) {
  const items = [
    ["nodes", totals.nodes],
    ["GPUs", totals.gpus],
    ["unallocated", percent(totals.unallocated_percent)],
    ["fragmented", percent(totals.fragmentation_percent)],
    ["pending", totals.pending],
    ["preemptions", totals.preemptions],
  ];
  document.getElementById("totals").replaceChildren(
    ...items.map(([name, value]) => {
      const item = el("div", "total", el("dd", null, value), el("dt", null, name));
      item.dataset.total = name;
      return item;
    }),
  );
}

// ---- the GPU map ------------------------------------------------------------------------------------

function segment(className, pod, left, width, title) {
  const seg = withTitle(el("div", `seg ${className}`, el("span", "seg-label", podName(pod))), title);
  seg.dataset.pod = pod;
  seg.style.left = `${Math.max(0, Math.min(100, left))}%`; // CSSOM, not an inline style attribute
  seg.style.width = `${Math.max(0, Math.min(100 - left, width))}%`;
  return seg;
}

function gpuCell(gpu) {
  const unhealthy = gpu.healthy === false;
  const cell = el("div", ["gpu", gpu.mig ? "mig" : null, unhealthy ? "unhealthy" : null].filter(Boolean).join(" "));
  cell.dataset.gpu = String(gpu.index);
  if (gpu.uuid) withTitle(cell, gpu.uuid);
  let free = `${percent(gpu.milli_free / 10)} · ${mib(gpu.memory_free_mib)} free`;
  if (gpu.mig) free = `MIG · ${gpu.slices.length} in use`;
  if (unhealthy) free = "unhealthy: nothing new lands here";
  cell.append(el("div", "gpu-label", el("strong", null, `GPU ${gpu.index}`), ` ${free}`));
  const bar = el("div", "bar");
  let left = 0; // shares are drawn side by side, each as wide as its compute share
  for (const slice of gpu.slices) {
    // a slice whose pod the extender no longer knows (deleted between two reads) still takes its room
    const s = { ...slice, pod: slice.pod || "(a pod being deleted)" };
    if (s.mig_profile) {
      // an instance sits where the GPU placed it: its start, as many slots as its memory takes
      const slots = s.mig_slots ?? Math.max(1, Math.round((MIG_SLOTS * s.memory_mib) / gpu.memory_mib));
      const title = `${s.pod}: MIG ${s.mig_profile} at slot ${s.mig_start} (${mib(s.memory_mib)})`;
      bar.append(segment("mig", s.pod, (100 * s.mig_start) / MIG_SLOTS, (100 * slots) / MIG_SLOTS, title));
    } else {
      const width = s.milli / 10;
      const title = `${s.pod}: ${s.milli} milli-GPU, ${mib(s.memory_mib)}`;
      bar.append(segment("share", s.pod, left, width, title));
      left += width;
    }
  }
  cell.append(bar);
  return cell;
}

function nodeRow(node, position) {
  const row = el("div", "node");
  row.dataset.node = node.name;
  row.style.top = `${position * ROW_PX}px`;
  row.append(el("div", "node-head",
    withTitle(el("div", "node-name", node.name), node.name),
    el("div", "node-stats", node.model),
    el("div", "node-stats", `${percent(node.unallocated_percent)} free · ` +
      `${percent(node.fragmentation_percent)} fragmented`)));
  const gpus = el("div", "gpus", ...node.gpus.map(gpuCell));
  gpus.style.setProperty("--gpus", String(Math.max(1, node.gpus.length)));
  row.append(gpus);
  return row;
}

function drawRows() {
  const map = document.getElementById("map");
  if (!state.view) return;
  const first = Math.max(0, Math.floor(map.scrollTop / ROW_PX) - OVERSCAN_ROWS);
  const last = Math.min(state.shown.length, Math.ceil((map.scrollTop + map.clientHeight) / ROW_PX) + OVERSCAN_ROWS);
  const rows = [];
  for (let position = first; position < last; position++) {
    rows.push(nodeRow(state.view.nodes[state.shown[position]], position));
  }
  document.getElementById("map-space").replaceChildren(...rows);
  if (!state.rendered) {
    state.rendered = true;
    performance.mark("map-rendered"); // benchmarks/cluster_dashboard.py: navigation start -> here
  }
}

function matches(text) {
  return !state.query || text.toLowerCase().includes(state.query);
}

function applyFilter() {
  const nodes = state.view.nodes;
  state.shown = [];
  for (let i = 0; i < nodes.length; i++) {
    if (!state.query || state.search[i].includes(state.query)) state.shown.push(i);
  }
  document.getElementById("map-space").style.height = `${state.shown.length * ROW_PX}px`;
  document.getElementById("map-count").textContent = state.query
    ? `${state.shown.length} of ${nodes.length} nodes` : `${nodes.length} nodes`;
  const empty = document.getElementById("map-empty");
  empty.hidden = state.shown.length > 0;
  empty.textContent = nodes.length ? "No node or pod matches the filter." : "No node advertises GPUs yet.";
  drawRows();
  drawPending(state.view.pending);
  drawClaims(state.view.claims, state.view.claims_error || "");
}

// ---- pending pods, claims ---------------------------------------------------------------------------

function fillTable(id, rows, matching) {
  document.querySelector(`#${id} tbody`).replaceChildren(...rows);
  document.getElementById(`${id}-empty`).hidden = matching > 0;
  document.getElementById(id).hidden = matching === 0;
  const more = document.getElementById(`${id}-more`);
  more.hidden = matching <= rows.length;
  more.textContent = `and ${matching - rows.length} more (view.json has them all)`;
}

function drawPending(pending) {
  const now = Date.now() / 1000;
  const kept = pending.filter((p) => matches(p.pod));
  document.getElementById("pending-count").textContent = String(pending.length);
  fillTable("pending", kept.slice(0, LIST_SHOWN).map((p) => {
    const row = el("tr", null,
      el("td", "pod", p.pod),
      el("td", "age", p.since === null || p.since === undefined ? "—" : formatAge(now - p.since)),
      withTitle(el("td", "reason", p.reason), p.code));
    row.dataset.pod = p.pod;
    return row;
  }), kept.length);
}

function drawClaims(claims, error) {
  // the extender could not list them (no permission on resourceclaims, no DRA API): say so, not "none"
  const said = document.getElementById("claims-error");
  said.textContent = error;
  said.hidden = !error;
  const kept = claims.filter((c) => matches(c.claim) || matches(c.node || ""));
  document.getElementById("claims-count").textContent = String(claims.length);
  fillTable("claims", kept.slice(0, LIST_SHOWN).map((c) => {
    const row = el("tr", null,
      el("td", "pod", c.claim),
      el("td", null, c.node ?? "—"),
      el("td", null, c.pool ?? "—"),
      el("td", null, (c.devices || []).join(", ")),
      el("td", null, c.share ?? ""));
    row.dataset.claim = c.claim;
    return row;
  }), kept.length);
  if (error) document.getElementById("claims-empty").hidden = true;
}

// ---- fragmentation over time: two lines, 0-100 % ----------------------------------------------------

function drawHistory(history, target) {
  document.getElementById("history-target").textContent = target ? `, measured against ${target}` : "";
  const chart = document.getElementById("history");
  document.getElementById("history-empty").hidden = history.length > 0;
  chart.hidden = history.length === 0;
  if (!history.length) return;
  const [width, height, left, right, top, bottom] = [600, 180, 40, 10, 10, 24];
  const start = history[0].t;
  const span = Math.max(1, history[history.length - 1].t - start);
  const x = (t) => left + ((t - start) / span) * (width - left - right);
  const y = (p) => top + (1 - Math.max(0, Math.min(100, p)) / 100) * (height - top - bottom);
  const parts = [];
  for (const p of [0, 50, 100]) {
    parts.push(svg("line", { class: "grid", x1: left, x2: width - right, y1: y(p), y2: y(p) }));
    const label = svg("text", { class: "axis", x: left - 6, y: y(p) + 4, "text-anchor": "end" });
    label.textContent = `${p}%`;
    parts.push(label);
  }
  for (const [t, anchor] of [[start, "start"], [start + span, "end"]]) {
    const label = svg("text", { class: "axis", x: x(t), y: height - 6, "text-anchor": anchor });
    label.textContent = clock(t);
    parts.push(label);
  }
  for (const key of ["unallocated_percent", "fragmentation_percent"]) {
    const points = history.map((h) => `${x(h.t).toFixed(1)},${y(h[key]).toFixed(1)}`).join(" ");
    const name = key.split("_")[0];
    parts.push(svg("polyline", { class: `line ${name}`, points }));
    const latest = history[history.length - 1];
    parts.push(svg("circle", { class: `last ${name}`, cx: x(latest.t), cy: y(latest[key]), r: 3 }));
  }
  chart.replaceChildren(...parts);
}

// ---- the whole page ---------------------------------------------------------------------------------

function draw(view) {
  state.view = view;
  state.search = view.nodes.map((n) =>
    [n.name, ...n.gpus.flatMap((g) => g.slices.map((s) => s.pod))].join("\n").toLowerCase());
  drawTotals(view.totals);
  applyFilter();
  drawHistory(view.history, view.fragmentation_target);
}

function showStatus(error) {
  const banner = document.getElementById("banner");
  const ok = !error;
  document.body.classList.toggle("stale", !ok);
  document.getElementById("dot").className = ok ? "dot ok" : "dot down";
  const at = (date) => date.toLocaleTimeString([], { hour12: false });
  if (ok) {
    document.getElementById("updated").textContent = `updated ${at(state.lastOk)}`;
    banner.hidden = state.view.synced;
    banner.textContent = "The extender is starting: it has not yet listed every node and pod, so the map " +
      "may be missing some. It fills in by itself.";
    return;
  }
  const since = state.lastOk ? `; showing data from ${at(state.lastOk)}` : "";
  banner.textContent = `Cannot reach the gpuslice extender at ${location.host} (${error.message || error})` +
    `${since}. Is kubectl port-forward still running? Retrying every ${REFRESH_MS / 1000} s.`;
  banner.hidden = false;
}

async function refresh() {
  try {
    if (document.hidden && state.view) return; // a tab in the background asks the extender for nothing
    const view = await getView();
    state.lastOk = new Date();
    draw(view);
    showStatus(null);
  } catch (error) {
    showStatus(error.name === "AbortError" ? new Error(`no answer in ${TIMEOUT_MS / 1000} s`) : error);
  } finally {
    // The next refresh starts 3 s after this one ended: a slow extender never gets overlapping reads.
    setTimeout(refresh, REFRESH_MS);
  }
}

function start() {
  let pending = false; // one redraw per frame however many scroll events arrive
  const redraw = () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      drawRows();
    });
  };
  document.getElementById("map").addEventListener("scroll", redraw, { passive: true });
  window.addEventListener("resize", redraw);
  document.getElementById("filter").addEventListener("input", (event) => {
    state.query = event.target.value.trim().toLowerCase();
    document.getElementById("map").scrollTop = 0;
    if (state.view) applyFilter();
  });
  refresh();
}

document.addEventListener("DOMContentLoaded", start);

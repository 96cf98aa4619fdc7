// gpuslice dashboard: reads the server's read-only JSON API every 2 s and redraws the page in place.
//
// Safety rule: every value from the API is user input somewhere (commands, reasons, tenants), so this
// script only creates elements and sets their text (textContent, createTextNode, setAttribute on
// title/class); it never assigns HTML. The page's Content-Security-Policy forbids inline scripts too.
"use strict";

const REFRESH_MS = 2000;
const TIMEOUT_MS = 5000;
const EVENTS_KEPT = 40;
const EVENT_PAGE = 1000; // /v1/events pages oldest first; we page forward once, then only ask for new ones
const FINISHED_SHOWN = 12;
const SLICE_COLOURS = 8;
const ALERT_KINDS = new Set(["gpu-health", "anomaly"]); // events about a GPU that a person should see // .c0 … .c7 in dashboard.css; a job keeps its colour on every tile and table

const state = {
  lastEventId: 0,
  events: [], // newest last, at most EVENTS_KEPT
  uptime: null, // the server's uptime at the last refresh: a smaller one means it restarted
  lastOk: null, // Date of the last successful refresh
};

// ---- small DOM helpers: text only -------------------------------------------------------------------

// What a person reads must be what runs: control characters and the bidirectional overrides (which can
// show a command's characters in another order) are written out as \xNN / \uNNNN, as the CLI does
// (cli/terminal.py): C0 but tab and newline, DEL, C1, U+202A-U+202E, U+2066-U+2069.
const CONTROLS = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u202a-\u202e\u2066-\u2069]/g;

function visible(text) {
  return String(text).replace(CONTROLS, (c) => {
    const code = c.charCodeAt(0);
    const hex = code.toString(16);
    return code < 0x100 ? `\\x${hex.padStart(2, "0")}` : `\\u${hex.padStart(4, "0")}`;
  });
}

function el(tag, className, ...children) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(visible(child)));
  }
  return node;
}

function withTitle(node, title) {
  node.setAttribute("title", visible(title));
  return node;
}

function cell(content, className) {
  return el("td", className, content);
}

// ---- formatting (the same units as the CLI: binary sizes, "20 GiB") ---------------------------------

function formatSize(bytes) {
  const units = [["TiB", 2 ** 40], ["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]];
  for (const [unit, factor] of units) {
    if (Math.abs(bytes) >= factor) {
      const text = (bytes / factor).toFixed(1).replace(/\.0$/, "");
      return `${text} ${unit}`;
    }
  }
  return `${bytes} B`;
}

function formatAge(seconds) {
  const s = Math.max(0, seconds);
  if (s < 120) return `${Math.round(s)}s`;
  if (s < 7200) return `${Math.round(s / 60)}m`;
  return `${(s / 3600).toFixed(1)}h`;
}

function ago(epochSeconds) {
  return epochSeconds === null || epochSeconds === undefined ? "—" : formatAge(Date.now() / 1000 - epochSeconds);
}

function clock(epochSeconds) {
  return new Date(epochSeconds * 1000).toLocaleTimeString([], { hour12: false });
}

function commandText(job) {
  return job ? job.command.join(" ") : "";
}

// The command as shown: the program's file name rather than its whole path (the full command is the
// element's title, shown on hover).
function shortCommand(job) {
  if (!job) return "";
  const [program, ...args] = job.command;
  return [program.split("/").pop(), ...args].join(" ");
}

function commandSpan(job) {
  return withTitle(el("span", "command", shortCommand(job)), commandText(job));
}

function sliceText(spec) {
  if (spec.mig_profile) return `MIG ${spec.mig_profile}`;
  const parts = [];
  if (spec.gpu_memory_bytes) parts.push(formatSize(spec.gpu_memory_bytes));
  if (spec.compute_percent > 0 && spec.compute_percent < 100) parts.push(`${spec.compute_percent}%`);
  if (!parts.length) parts.push(`${spec.gpus} GPU${spec.gpus === 1 ? "" : "s"}`);
  if (spec.exclusive) parts.push("exclusive");
  return parts.join(" · ");
}

function colourClass(jobId) {
  let h = 0;
  for (const ch of String(jobId)) h = (h * 31 + ch.charCodeAt(0)) >>> 0;
  return `c${h % SLICE_COLOURS}`;
}

function jobLabel(jobId) {
  return el("span", `job-id ${colourClass(jobId)}`, jobId);
}

function commandCell(job) {
  return cell(commandSpan(job), "command-cell");
}

// ---- fetching ---------------------------------------------------------------------------------------

async function getJson(path) {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), TIMEOUT_MS);
  try {
    const response = await fetch(path, { signal: controller.signal, cache: "no-store" });
    if (response.status === 401) {
      // Reads need the token: the sign-in link printed by `gpuslice serve` leaves a cookie for them.
      throw new Error("not signed in: open the dashboard link that `gpuslice serve` printed (…/?token=…)");
    }
    if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
    return await response.json();
  } finally {
    clearTimeout(timer);
  }
}

async function newEvents(after) {
  // Page forward from the last id seen; a first load of a long-lived server takes a few pages, once
  // (at most 20 a refresh, so a huge log is caught up over a few refreshes instead of in one long one).
  let last = after;
  let fresh = [];
  for (let page = 0; page < 20; page++) {
    const batch = await getJson(`v1/events?after=${last}&limit=${EVENT_PAGE}`);
    if (!batch.length) break;
    last = batch[batch.length - 1].id;
    fresh = fresh.concat(batch).slice(-EVENTS_KEPT);
    if (batch.length < EVENT_PAGE) break;
  }
  return { fresh, last };
}

async function load() {
  const health = await getJson("v1/health");
  if (state.uptime !== null && health.uptime_seconds < state.uptime) {
    state.lastEventId = 0; // a restarted server may hold another event log: read it afresh
    state.events = [];
  }
  state.uptime = health.uptime_seconds;
  const [gpus, queue, active, finished, events] = await Promise.all([
    getJson("v1/gpus"),
    getJson("v1/queue"),
    getJson("v1/jobs?state=RUNNING&state=PENDING&state=PREEMPTED&limit=10000"),
    getJson(`v1/jobs?state=SUCCEEDED&state=FAILED&state=CANCELLED&limit=${FINISHED_SHOWN}`),
    newEvents(state.lastEventId),
  ]);
  // Only now, with every read answered: a failed refresh leaves the event cursor where it was.
  state.lastEventId = events.last;
  state.events = state.events.concat(events.fresh).slice(-EVENTS_KEPT);
  return { health, gpus, queue, active, finished };
}

// ---- drawing ----------------------------------------------------------------------------------------

function drawHeader(health) {
  const kind = health.simulated ? "simulated" : "real";
  document.getElementById("machine").textContent =
    `${health.machine} · ${health.gpus} GPUs (${kind}) · sharing ${health.sharing} · v${health.version}`;
  const counts = document.getElementById("counts");
  const order = ["RUNNING", "PENDING", "SUCCEEDED", "FAILED", "CANCELLED"];
  counts.replaceChildren(
    ...order.map((s) => el("span", `state-count state-${s.toLowerCase()}`, `${health.jobs[s] ?? 0} ${s.toLowerCase()}`)),
  );
}

function memoryBar(gpu, jobsById) {
  const bar = el("div", "bar");
  bar.setAttribute("role", "img");
  const total = gpu.memory_total_bytes;
  const used = total - gpu.memory_free_bytes;
  bar.setAttribute("aria-label", `${formatSize(used)} of ${formatSize(total)} taken`);
  const add = (bytes, className, title) => {
    if (bytes <= 0 || total <= 0) return;
    const segment = withTitle(el("span", `segment ${className}`), title);
    segment.style.width = `${Math.min(100, (100 * bytes) / total)}%`; // CSSOM, not an inline style attribute
    bar.append(segment);
  };
  for (const s of gpu.jobs) {
    add(s.memory_bytes, colourClass(s.id), `job ${s.id}: ${formatSize(s.memory_bytes)} — ${commandText(jobsById.get(s.id))}`);
  }
  add(gpu.external_memory_bytes, "external", `${formatSize(gpu.external_memory_bytes)} held by processes gpuslice did not start`);
  return bar;
}

function healthBadge(gpu) {
  if (gpu.healthy === false) {
    return el("span", "badge unhealthy", "UNHEALTHY");
  }
  return el("span", "badge healthy", "healthy");
}

function telemetry(gpu) {
  const parts = [];
  if (gpu.utilization_percent !== null && gpu.utilization_percent !== undefined) {
    parts.push(`util ${Math.round(gpu.utilization_percent)}%`);
  }
  if (gpu.memory_used_bytes !== null && gpu.memory_used_bytes !== undefined) {
    parts.push(`${formatSize(gpu.memory_used_bytes)} in use`);
  }
  if (gpu.temperature_celsius !== null && gpu.temperature_celsius !== undefined) {
    parts.push(`${Math.round(gpu.temperature_celsius)} °C`);
  }
  if (gpu.power_watts !== null && gpu.power_watts !== undefined) {
    parts.push(`${Math.round(gpu.power_watts)} W`);
  }
  return parts.length ? el("div", "telemetry", parts.join(" · ")) : null;
}

function sliceRow(s, jobsById) {
  const job = jobsById.get(s.id);
  const amount = s.mig ? `MIG ${s.mig}` : formatSize(s.memory_bytes);
  const compute = s.compute_percent && !s.mig ? ` · ${s.compute_percent}%` : "";
  const measured = s.used_memory_bytes === null || s.used_memory_bytes === undefined
    ? null : el("span", "measured", ` (uses ${formatSize(s.used_memory_bytes)})`);
  return el("li", "slice",
    jobLabel(s.id),
    commandSpan(job),
    el("span", "amount", amount + compute, measured));
}

function gpuTile(gpu, jobsById) {
  const unhealthy = gpu.healthy === false;
  const tile = el("article", unhealthy ? "tile unhealthy" : "tile");
  tile.dataset.gpu = String(gpu.index);
  tile.append(el("header", "tile-head",
    el("span", "gpu-name", `GPU ${gpu.index}`),
    withTitle(el("span", "gpu-model", gpu.model), gpu.uuid),
    healthBadge(gpu)));
  if (unhealthy) {
    tile.append(el("div", "unhealthy-reason", gpu.unhealthy_reason || "marked unhealthy; no new jobs are placed here"));
  }
  tile.append(memoryBar(gpu, jobsById));
  const free = el("div", "free",
    el("strong", null, `${formatSize(gpu.memory_free_bytes)} free`),
    ` of ${formatSize(gpu.memory_total_bytes)} · compute ${Math.round(gpu.compute_free_percent)}% free`,
    gpu.external_memory_bytes > 0 ? ` · ${formatSize(gpu.external_memory_bytes)} used outside gpuslice` : null);
  tile.append(free);
  const extra = telemetry(gpu);
  if (extra) tile.append(extra);
  if (gpu.jobs.length) {
    tile.append(el("ul", "slices", ...gpu.jobs.map((s) => sliceRow(s, jobsById))));
  } else {
    tile.append(el("div", "idle", "idle"));
  }
  return tile;
}

function drawGpus(gpus, jobsById) {
  const free = gpus.reduce((sum, g) => sum + g.memory_free_bytes, 0);
  const total = gpus.reduce((sum, g) => sum + g.memory_total_bytes, 0);
  const sick = gpus.filter((g) => g.healthy === false).length;
  document.getElementById("gpus-summary").textContent =
    `${formatSize(free)} free of ${formatSize(total)}` + (sick ? ` · ${sick} unhealthy` : "");
  document.getElementById("gpus").replaceChildren(...gpus.map((g) => gpuTile(g, jobsById)));
}

function fillTable(id, rows) {
  document.querySelector(`#${id} tbody`).replaceChildren(...rows);
  document.getElementById(`${id}-empty`).hidden = rows.length > 0;
  document.getElementById(id).hidden = rows.length === 0;
}

function drawRunning(active) {
  const running = active.filter((j) => j.state === "RUNNING").sort((a, b) => a.started_at - b.started_at);
  document.getElementById("running-count").textContent = String(running.length);
  fillTable("running", running.map((j) => {
    const row = el("tr", j.stopping ? "stopping" : null,
      cell(jobLabel(j.id), "id"),
      commandCell(j),
      cell(sliceText(j.spec)),
      cell(j.gpus.join(",")),
      cell(j.tenant),
      cell(j.priority),
      cell(ago(j.started_at) + (j.suspended ? " (suspended)" : "") + (j.stopping ? ` (stopping: ${j.stopping})` : "")));
    row.dataset.job = j.id;
    return row;
  }));
}

function drawQueue(queue, jobsById) {
  document.getElementById("queue-count").textContent = String(queue.length);
  fillTable("queue", queue.map((q) => {
    const job = jobsById.get(q.id);
    const row = el("tr", null,
      cell(String(q.position), "num"),
      cell(jobLabel(q.id), "id"),
      commandCell(job),
      cell(job ? sliceText(job.spec) : ""),
      cell(`${q.priority} · ${q.tenant}`),
      cell(ago(q.submitted_at)),
      cell(q.reason, "reason"));
    row.dataset.job = q.id;
    return row;
  }));
}

function drawFinished(finished) {
  fillTable("finished", finished.map((j) => {
    const row = el("tr", null,
      cell(jobLabel(j.id), "id"),
      cell(el("span", `state state-${j.state.toLowerCase()}`, j.state.toLowerCase())),
      commandCell(j),
      cell(j.finished_at ? `${ago(j.finished_at)} ago` : "—"),
      cell(j.reason, "reason"));
    row.dataset.job = j.id;
    return row;
  }));
}

function drawEvents() {
  const items = state.events.slice().reverse().map((e) => {
    const change = e.new_state
      ? el("span", `state state-${e.new_state.toLowerCase()}`, (e.old_state ? `${e.old_state.toLowerCase()} → ` : "") + e.new_state.toLowerCase())
      : el("span", ALERT_KINDS.has(e.kind) ? "kind alert" : "kind", e.kind);
    const gpu = e.detail && Number.isInteger(e.detail.gpu) ? `GPU ${e.detail.gpu}` : "server";
    return el("li", null,
      el("time", null, clock(e.time)),
      e.job_id ? jobLabel(e.job_id) : el("span", "job-id server", gpu),
      change,
      el("span", "reason", e.reason));
  });
  document.getElementById("events").replaceChildren(...items);
  document.getElementById("events-empty").hidden = items.length > 0;
}

function draw(data) {
  const jobsById = new Map(data.active.map((j) => [j.id, j]));
  drawHeader(data.health);
  drawGpus(data.gpus, jobsById);
  drawRunning(data.active);
  drawQueue(data.queue, jobsById);
  drawFinished(data.finished);
  drawEvents();
}

function showReachable(ok, error) {
  const banner = document.getElementById("banner");
  document.body.classList.toggle("stale", !ok);
  document.getElementById("dot").className = ok ? "dot ok" : "dot down";
  if (ok) {
    banner.hidden = true;
    document.getElementById("updated").textContent = `updated ${state.lastOk.toLocaleTimeString([], { hour12: false })}`;
    return;
  }
  const since = state.lastOk ? `; showing data from ${state.lastOk.toLocaleTimeString([], { hour12: false })}` : "";
  banner.textContent = `Cannot reach the gpuslice server at ${location.host} (${error.message || error})${since}. ` +
    `Retrying every ${REFRESH_MS / 1000} s.`;
  banner.hidden = false;
}

async function refresh() {
  try {
    const data = await load();
    state.lastOk = new Date();
    draw(data);
    showReachable(true);
  } catch (error) {
    showReachable(false, error.name === "AbortError" ? new Error("no answer in 5 s") : error);
  } finally {
    // The next refresh starts 2 s after this one ended, so a slow server never gets overlapping reads.
    setTimeout(refresh, REFRESH_MS);
  }
}

document.addEventListener("DOMContentLoaded", refresh);

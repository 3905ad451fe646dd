/* gpusched's dashboard: polls the daemon's JSON (/api/status, /api/job, /api/usage) and
   builds each page with DOM calls only. Every string from the daemon (job names, commands,
   users, waiting reasons, hints) becomes a text node (textContent, append(string)), never
   markup: no innerHTML anywhere. Charts are SVG made the same way. No library, no build. */
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const POLL_MS = { server: 2000, queue: 2000, job: 3000, usage: 10000 };

/* ---- building blocks ------------------------------------------------------------- */

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("data-")) node.setAttribute(key, value);
    else node[key] = value;
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
}

function jobLink(id) {
  return el("a", { href: "/job?id=" + encodeURIComponent(String(id)), text: String(id) });
}

/* One decimal, a tie to even as Python's format does (17.25 -> "17.2"; toFixed says 17.3). */
function oneDecimal(value) {
  const scaled = value * 10;
  let whole = Math.round(scaled);
  if (Math.abs(scaled % 1) === 0.5 && whole % 2 !== 0) whole -= Math.sign(scaled);
  return (whole / 10).toFixed(1);
}

/* Sizes and durations as the CLI prints them (gpusched.core.units, table form). */
function fmtSize(bytes) {
  if (bytes === null || bytes === undefined) return "-";
  let value = bytes;
  for (const suffix of ["B", "K", "M", "G", "T"]) {
    if (suffix === "B" && Math.abs(value) < 1024) return value.toFixed(0) + "B";
    if (suffix === "T" || Math.abs(Math.round(value * 10) / 10) < 1024) {
      return oneDecimal(value) + suffix;
    }
    value /= 1024;
  }
  return "-";
}

function fmtDuration(seconds) {
  const s = Math.max(0, Math.floor(seconds));
  const pad = (n) => String(n).padStart(2, "0");
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m";
  if (s < 86400) return Math.floor(s / 3600) + "h" + pad(Math.floor((s % 3600) / 60)) + "m";
  return Math.floor(s / 86400) + "d" + pad(Math.floor((s % 86400) / 3600)) + "h";
}

function fmtTime(iso) {
  return iso ? iso.slice(0, 19).replace("T", " ") : "-";
}

function seconds(fromIso, toIso) {
  return (Date.parse(toIso) - Date.parse(fromIso)) / 1000;
}

function fmtPercent(value) {
  return value === null || value === undefined ? "-" : Math.round(value) + "%";
}

/* Its name, else its command's words, an array's job and an interactive job marked so:
   all another user sees of them when commands are hidden ("a1[0] (hidden)"), as the
   CLI's job_words draws them. */
function jobWords(job) {
  if (job.name) return [job.name];
  const marks = [];
  if (job.array_id !== null && job.array_id !== undefined) {
    marks.push("a" + job.array_id + "[" + job.array_index + "]");
  }
  if (job.interactive) marks.push("(interactive)");
  return [...marks, ...(job.command || [])];
}

function what(job) {
  return jobWords(job).join(" ");
}

/* A table's Job cell: one line. A long path loses its directories first, longest first
   (".../train.py", the CLI's fit_words), so the script's name stays in view; the style
   sheet cuts what is still too long, and the whole command is the cell's tooltip. */
const JOB_CHARS = 40;
function jobCell(job) {
  const words = jobWords(job);
  const join = () => words.join(" ");
  const paths = words.map((_, i) => i).filter((i) => words[i].replace(/\/+$/, "").includes("/"))
    .sort((a, b) => words[b].length - words[a].length);
  for (const i of paths) {
    if (join().length <= JOB_CHARS) break;
    const short = ".../" + words[i].replace(/\/+$/, "").split("/").pop();
    if (short.length < words[i].length) words[i] = short;
  }
  return el("span", { class: "job-what", title: what(job), text: join() });
}

function gpuList(job) {
  if (!job.gpu_indices || !job.gpu_indices.length) return "-";
  const cards = job.gpu_indices.join(",");
  return job.node && clustered ? job.node + ":" + cards : cards;
}

/* Whether the daemon shares its queue with other servers (the last status said so): GPUs
   are then grouped by node, and a job's GPUs are named with their node. */
let clustered = false;

/* How it ended, each fact once: the CLI's ended label ("done exit 0", "cancelled",
   "failed (SIGKILL)", "failed (oom)") and the detail where it adds to it; a detail that
   begins with the label is said alone ("cancelled by alice", not "cancelled: cancelled
   by alice"). */
function endedLabel(job) {
  if (job.reason === null || job.reason === undefined || job.reason === "exit") {
    return job.state + (job.exit_code === null || job.exit_code === undefined ? "" : " exit " + job.exit_code);
  }
  if (job.reason === "signal" && job.reason_detail) return job.state + " (" + job.reason_detail + ")";
  return job.reason === job.state ? job.state : job.state + " (" + job.reason + ")";
}

function ending(job) {
  const label = endedLabel(job);
  const detail = job.reason_detail;
  if (!detail || label.includes(detail)) return label;
  return detail.startsWith(label + " ") ? detail : label + ": " + detail;
}

/* `text` as nodes, each "job N" after "retried as " or "retry of " a link to that job's
   page; the rest stays text. */
function withJobLinks(text) {
  const parts = [];
  const pattern = /(retried as |retry of )job (\d+)/g;
  let from = 0;
  for (const match of text.matchAll(pattern)) {
    const at = match.index + match[1].length;
    parts.push(text.slice(from, at), "job ", jobLink(match[2]));
    from = at + ("job " + match[2]).length;
  }
  parts.push(text.slice(from));
  return parts.filter((part) => part !== "");
}

/* ---- polling ----------------------------------------------------------------------- */

function showProblem(message) {
  const box = document.getElementById("problem");
  box.hidden = message === null;
  box.textContent = message || "";
}

/* Fetch `url` every `everyMs` and hand the JSON to `render`; it returns false to stop
   (a job that ended). A failed fetch is shown on the page, and tried again. */
function poll(url, render, everyMs) {
  async function once() {
    let again = true;
    try {
      const response = await fetch(url, { cache: "no-store" });
      const data = await response.json();
      if (!response.ok) {
        showProblem(data.error || response.statusText);
        again = response.status >= 500;
      } else {
        showProblem(null);
        again = render(data) !== false;
        document.getElementById("updated").textContent = "updated " + fmtTime(data.now) + " UTC";
      }
    } catch (error) {
      showProblem("cannot reach the gpusched daemon (" + error.message + "); trying again");
    }
    if (again) setTimeout(once, everyMs);
  }
  once();
}

function header(data) {
  if (data.host) {
    document.getElementById("host").textContent = "on " + data.host;
    document.title = document.title.split(" \u2014 ")[0] + " \u2014 " + data.host;
  }
  const drain = document.getElementById("drain");
  drain.hidden = !data.drain;
  if (data.drain) {
    const why = data.drain.reason ? ": " + data.drain.reason : "";
    drain.textContent = "Draining since " + fmtTime(data.drain.since) + " UTC (by " +
      data.drain.by + why + "): no new job starts.";
  }
}

function table(id, columns, rows, more) {
  const body = rows.length
    ? rows
    : [el("tr", {}, el("td", { class: "muted", colSpan: columns.length, text: "none" }))];
  if (more > 0) {
    body.push(el("tr", { class: "more" },
      el("td", { colSpan: columns.length, text: "and " + more + " more, not listed" })));
  }
  const head = el("tr", {}, ...columns.map(([key, h]) => el("th", { class: "col-" + key, text: h })));
  document.getElementById(id).replaceChildren(el("thead", {}, head), el("tbody", {}, ...body));
}

/* ---- the server: one row per GPU --------------------------------------------------- */

const SEGMENTS = [
  ["jobs", "gpusched jobs"],
  ["others", "other processes"],
  ["reserved", "reserved for starting jobs"],
  ["free", "free"],
];

function memoryBar(gpu) {
  const jobs = Math.max(0, gpu.used_by_jobs);
  const others = Math.max(0, gpu.used_by_others);
  const reserved = Math.max(0, gpu.reserved);
  const sizes = { jobs, others, reserved, free: Math.max(0, gpu.total - jobs - others - reserved) };
  const bar = el("div", { class: "bar", role: "img" });
  bar.setAttribute("aria-label", SEGMENTS.map(([k, label]) => label + " " + fmtSize(sizes[k])).join(", "));
  for (const [key, label] of SEGMENTS) {
    const part = el("div", { class: "seg seg-" + key, title: label + ": " + fmtSize(sizes[key]) });
    part.setAttribute("data-segment", key);
    part.setAttribute("data-bytes", String(sizes[key]));
    part.style.width = (gpu.total > 0 ? (100 * sizes[key]) / gpu.total : 0) + "%";
    bar.append(part);
  }
  return bar;
}

function utilBar(util) {
  const bar = el("div", { class: "bar util" });
  const part = el("div", { class: "seg seg-util" });
  part.style.width = (util === null ? 0 : util) + "%";
  bar.append(part);
  return bar;
}

/* `running`: the running jobs listed by id. Each job on the card is shown with what it
   holds there and, where listed, what it declared per GPU ("3.0G/4.0G": an overrun
   shows at a glance). */
function gpuRow(gpu, running) {
  const state = gpu.state === "ok" ? null : el("span", { class: "badge bad", text: gpu.state });
  const jobs = el("span", { class: "gpu-jobs" });
  const held = gpu.job_mem || {};
  for (const id of gpu.jobs) {
    const job = running.get(id);
    const declared = job ? "/" + (job.mem === null ? "whole" : fmtSize(job.mem)) : "";
    jobs.append(jobLink(id), String(id) in held
      ? " (" + fmtSize(held[String(id)]) + declared + ")  " : "  ");
  }
  const others = (gpu.others || []).map((p) =>
    (p.user || "?") + ":" + (p.command || "?") + "/" + p.pid + " (" + fmtSize(p.used) + ")");
  return el("div", { class: "gpu", "data-index": String(gpu.index) },
    el("div", { class: "gpu-title" },
      el("strong", { text: "GPU " + gpu.index }), " ", el("span", { class: "gpu-name", text: gpu.name }),
      " ", state),
    memoryBar(gpu),
    el("div", { class: "gpu-figures" },
      el("span", { class: "gpu-used", text: fmtSize(gpu.used) + "/" + fmtSize(gpu.total) }),
      el("span", { class: "muted", text: " used, " }),
      el("span", { class: "gpu-available", text: fmtSize(gpu.available) }),
      el("span", { class: "muted", text: " available" })),
    el("div", { class: "gpu-util-row" },
      el("span", { class: "muted", text: "utilization " }),
      el("span", { class: "gpu-util", text: fmtPercent(gpu.util) }), utilBar(gpu.util)),
    el("div", { class: "muted" }, gpu.jobs.length ? "jobs: " : "no gpusched job", jobs),
    ...(others.length ? [el("div", { class: "muted gpu-others", text: "others: " + others.join(", ") })] : []));
}

function nodeSection(node, gpus, running) {
  const state = el("span", { class: "badge node-state" + (node.state === "up" ? "" : " bad"), text: node.state });
  const cards = gpus.filter((gpu) => gpu.node === node.name);
  return el("section", { class: "node", "data-node": node.name },
    el("h3", { class: "node-title" },
      el("span", { class: "node-name", text: node.name }), " ", state, " ",
      el("span", { class: "muted node-seen", text: "heard " + fmtDuration(node.last_seen) + " ago" })),
    ...(cards.length ? cards.map((gpu) => gpuRow(gpu, running)) : [el("div", { class: "muted", text: "no GPU reported" })]));
}

function renderServer(data) {
  header(data);
  clustered = (data.nodes || []).length > 1;
  const running = new Map(data.running.map((job) => [job.id, job]));
  document.getElementById("gpus").replaceChildren(...(clustered
    ? data.nodes.map((node) => nodeSection(node, data.gpus, running))
    : data.gpus.map((gpu) => gpuRow(gpu, running))));
  const legend = document.getElementById("legend");
  if (!legend.childElementCount) {
    for (const [key, label] of SEGMENTS) {
      legend.append(el("span", { class: "key seg-" + key }), " " + label + " ");
    }
  }
  const c = data.counts;
  document.getElementById("summary").replaceChildren(
    el("a", { href: "/queue", text: c.running + " running, " + c.queued + " queued, " + c.held + " held" }));
}

/* ---- the queue ---------------------------------------------------------------------- */

/* A table's columns: [key, heading]. Each cell has the class col-KEY, which the style
   sheet sizes (ID and Job on one line) and drops on a narrow window. */
const RUNNING_COLUMNS = [["id", "ID"], ["user", "User"], ["job", "Job"], ["gpu", "GPU"],
  ["mem", "Used/declared"], ["time", "Time"]];
const WAITING_COLUMNS = [["id", "ID"], ["user", "User"], ["job", "Job"], ["mem", "Memory"],
  ["priority", "Priority"], ["waiting", "Waiting"], ["why", "Why"]];
const ENDED_COLUMNS = [["id", "ID"], ["user", "User"], ["job", "Job"], ["ended", "Ended"],
  ["how", "How"], ["peak", "Peak"], ["hints", "Hints"]];

function row(job, columns, cells) {
  const all = [jobLink(job.id), cells[0], jobCell(job), ...cells.slice(1)];
  return el("tr", { "data-job": String(job.id) }, ...all.map((cell, i) => {
    const props = { class: "col-" + columns[i][0] };
    return cell instanceof Node ? el("td", props, cell) : el("td", { ...props, text: cell });
  }));
}

/* What a job declared, per GPU: "4.0G per GPU" or "a whole GPU". */
function declaredText(job) {
  return job.mem === null || job.mem === undefined ? "a whole GPU" : fmtSize(job.mem) + " per GPU";
}

/* How a --notify hook ended: "exited 127: sh: 1: mail: not found". */
function notifyText(result) {
  const how = result.kind === "timeout" ? "killed at hook_timeout"
    : result.kind === "failed_to_start" ? "could not start" : "exited " + result.exit_code;
  const output = (result.output || "").split("\n").filter((line) => line).join(" | ");
  return output ? how + ": " + output : how;
}

function hintList(hints) {
  return el("ul", { class: "hints" }, ...(hints || []).map((h) => el("li", {}, ...withJobLinks(h))));
}

function renderQueue(data) {
  header(data);
  clustered = (data.nodes || []).length > 1;
  const c = data.counts;
  const mem = (job) => (job.mem === null ? "whole GPU" : fmtSize(job.mem)) + (job.gpus > 1 ? " x" + job.gpus : "");
  // What a running job holds now before what it declared, as the CLI's USED/MEM column
  // (without a reading yet, the declared alone).
  const used = (job) => (job.mem_used === null || job.mem_used === undefined ? "" : fmtSize(job.mem_used) + "/") + mem(job);
  table("running", RUNNING_COLUMNS,
    data.running.map((job) => row(job, RUNNING_COLUMNS, [job.user, gpuList(job), used(job),
      fmtDuration(seconds(job.started_at, data.now))])), c.running - data.running.length);
  table("waiting", WAITING_COLUMNS,
    data.waiting.map((job) => row(job, WAITING_COLUMNS, [job.user, mem(job), String(job.priority),
      fmtDuration(seconds(job.submitted_at, data.now)),
      el("span", { class: "reason" }, ...withJobLinks(job.waiting_reason || ""))])),
    c.queued + c.held - data.waiting.length);
  table("ended", ENDED_COLUMNS,
    data.ended.map((job) => row(job, ENDED_COLUMNS, [job.user, fmtTime(job.ended_at),
      el("span", { class: "how state-" + job.state, text: ending(job) }),
      fmtSize(job.peak_mem) + " of " + declaredText(job), hintList(job.hints)])), 0);
  document.getElementById("running-count").textContent = "(" + c.running + ")";
  document.getElementById("waiting-count").textContent = "(" + (c.queued + c.held) + ")";
}

/* ---- a job and its charts ------------------------------------------------------------ */

const CHART = { width: 1000, height: 200, left: 64, right: 16, top: 14, bottom: 28 };

/* An SVG line chart of `points` ({t: epoch ms, v: number or null}) from t0 to t1 and 0 to
   yMax; a null breaks the line. `mark`: a horizontal dashed line {value, label}. */
function lineChart(points, t0, t1, yMax, yLabel, mark) {
  const { width, height, left, right, top, bottom } = CHART;
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, class: "plot" });
  const x = (t) => left + ((width - left - right) * (t - t0)) / Math.max(1, t1 - t0);
  const y = (v) => top + (height - top - bottom) * (1 - Math.min(v, yMax) / yMax);
  for (let i = 0; i <= 4; i += 1) {
    const v = (yMax * i) / 4;
    chart.append(svg("line", { x1: left, x2: width - right, y1: y(v), y2: y(v), class: "grid" }));
    chart.append(svg("text", { x: left - 6, y: y(v) + 4, class: "axis", "text-anchor": "end" }, yLabel(v)));
  }
  const spanS = (t1 - t0) / 1000;
  const step = tickStep(spanS);
  for (let s = 0; s <= spanS + 1e-6; s += step) {  // round times since the start: 0:00, 0:30...
    const t = t0 + s * 1000;
    chart.append(svg("text", { x: x(t), y: height - 8, class: "axis tick", "text-anchor": "middle" },
      fmtClock(s)));
  }
  if (mark) {
    chart.append(svg("line", { x1: left, x2: width - right, y1: y(mark.value), y2: y(mark.value), class: "declared" }));
    chart.append(svg("text", { x: width - right - 4, y: y(mark.value) - 5, class: "declared-label", "text-anchor": "end" }, mark.label));
  }
  let run = [];
  const flush = () => {
    if (run.length === 1) {
      chart.append(svg("circle", { cx: run[0][0], cy: run[0][1], r: 2.5, class: "series-dot" }));
    } else if (run.length > 1) {
      chart.append(svg("polyline", { points: run.map((p) => p.join(",")).join(" "), class: "series" }));
    }
    run = [];
  };
  for (const p of points) {
    if (p.v === null || p.v === undefined) flush();
    else run.push([x(p.t).toFixed(1), y(p.v).toFixed(1)]);
  }
  flush();
  if (!points.some((p) => p.v !== null && p.v !== undefined)) {
    // In the middle of the plot, or of the larger part the declared line leaves (above
    // it its label): never across the line.
    let [from, to] = [top, height - bottom];
    if (mark) {
      const at = y(mark.value);
      [from, to] = at - top > height - bottom - at ? [top, at - 16] : [at, height - bottom];
    }
    chart.append(svg("text", { x: (left + width - right) / 2, y: (from + to) / 2 + 5, class: "empty", "text-anchor": "middle" }, "no samples"));
  }
  return chart;
}

/* The time axis: a round step giving at most six ticks, and labels as m:ss (h:mm:ss past
   an hour), exact at each tick, never rounded down. */
const TICK_STEPS_S = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800,
  21600, 43200, 86400];
function tickStep(spanS) {
  for (const step of TICK_STEPS_S) if (spanS / step <= 6) return step;
  return 86400 * Math.ceil(spanS / 6 / 86400);
}

function fmtClock(totalS) {
  const s = Math.round(totalS);
  const pad = (n) => String(n).padStart(2, "0");
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  return h ? h + ":" + pad(m) + ":" + pad(s % 60) : m + ":" + pad(s % 60);
}

/* A hole in the samples (a daemon restart) drawn as a gap: a null point where two points
   are more than three times as far apart as their neighbours (gpusched.cli.sparkline's
   rule). */
function withGaps(points) {
  const spans = points.slice(1).map((p, i) => p.t - points[i].t);
  const out = [];
  points.forEach((p, i) => {
    out.push(p);
    if (i >= spans.length) return;
    const beside = [spans[i - 1], spans[i + 1]].filter((v) => v !== undefined);
    if (beside.length && spans[i] > 3 * Math.max(...beside)) {
      out.push({ t: p.t + spans[i] / 2, memory: null, util: null });
    }
  });
  return out;
}

/* The memory axis's top: four round steps (of 256M, 512M, 1G, 2G, 4G, 5G, 10G...) above
   the highest value plus a tenth. */
function niceMax(value) {
  const wanted = Math.max(value * 1.1, 2 ** 30) / 4;
  for (const gib of [0.25, 0.5, 1, 2, 4, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000]) {
    if (gib * 2 ** 30 >= wanted) return 4 * gib * 2 ** 30;
  }
  return 4 * wanted;
}

function renderCharts(job, now) {
  const timeline = withGaps((job.timeline || []).map((p) => ({ t: Date.parse(p.t), memory: p.memory, util: p.util })));
  const first = timeline.length ? timeline[0].t : Date.parse(now);
  const t0 = job.started_at ? Math.min(Date.parse(job.started_at), first) : first;
  const last = timeline.length ? timeline[timeline.length - 1].t : t0;
  const t1 = Math.max(job.ended_at ? Date.parse(job.ended_at) : Date.parse(now), last, t0 + 1000);
  const declared = job.mem === null ? null : job.mem * Math.max(1, job.gpus);
  const highest = Math.max(declared || 0, job.peak_mem || 0, ...timeline.map((p) => p.memory || 0));
  const mark = declared === null ? null : { value: declared, label: "declared " + fmtSize(declared) };
  document.getElementById("memory-chart").replaceChildren(lineChart(
    timeline.map((p) => ({ t: p.t, v: p.memory })), t0, t1, niceMax(highest), fmtSize, mark));
  document.getElementById("util-chart").replaceChildren(lineChart(
    timeline.map((p) => ({ t: p.t, v: p.util })), t0, t1, 100, (v) => v + "%", null));
  const rows = (job.timeline || []).map((p) => el("tr", {},
    el("td", { text: fmtTime(p.t) }), el("td", { text: fmtSize(p.memory) }), el("td", { text: fmtPercent(p.util) })));
  const samples = document.getElementById("samples-table");
  samples.replaceChildren(el("thead", {}, el("tr", {}, ...["Time (UTC)", "Memory", "Utilization"].map((h) => el("th", { text: h })))),
    el("tbody", {}, ...rows));
  document.getElementById("samples").querySelector("summary").textContent = "Samples (" + rows.length + ")";
}

// What sharing a busy card cost the job (the CLI's core/hints.sharing_note, same words).
function sharingNote(job) {
  const speed = job.sharing_speed;
  if (speed === null || speed === undefined || speed >= 0.9 || !(job.gpu_indices || []).length) return null;
  const cards = job.gpu_indices.join(", ");
  const where = (job.gpu_indices.length === 1 ? "GPU " : "GPUs ") + cards;
  const others = job.shared_with || [];
  const whom = others.length === 0 ? "other busy processes"
    : (others.length === 1 ? "job " : "jobs ") + others.join(", ") + ", also busy";
  return "ran at about " + speed.toFixed(1) + "x: it shared " + where + " with " + whom;
}

function renderJob(data) {
  header(data);
  const job = data.job;
  document.getElementById("job-title").replaceChildren(
    "Job " + job.id + (job.name ? ": " + job.name : ""), " ",
    el("span", { class: "badge state-" + job.state, text: job.state }));
  document.title = "gpusched: job " + job.id;
  const facts = [
    ["user", job.user],
    ["command", (job.command || []).join(" ")],
    ["waiting", job.waiting_reason],
    ["GPU", gpuList(job)],
    ["memory", (job.mem === null ? "whole GPU" : fmtSize(job.mem) + " per GPU") + (job.gpus > 1 ? ", " + job.gpus + " GPUs" : "")],
    ["peak memory", fmtSize(job.peak_mem) + " (declared " + declaredText(job) + ")"],
    ["mean utilization", fmtPercent(job.mean_util)],
    ["GPU demand", job.demand === null || job.demand === undefined ? null : job.demand.toFixed(2) + " of a GPU's busy time"],
    ["sharing", sharingNote(job)],
    ["submitted", fmtTime(job.submitted_at)],
    ["started", fmtTime(job.started_at)],
    ["ended", fmtTime(job.ended_at)],
    ["ran for", job.started_at ? fmtDuration(seconds(job.started_at, job.ended_at || data.now)) : "-"],
    ["exit", job.ended_at ? ending(job) : "-"],
    ["retry of", job.retry_of === null || job.retry_of === undefined ? null : el("span", {}, "job ", jobLink(job.retry_of))],
    ["retried as", job.retried_as === null || job.retried_as === undefined ? null : el("span", {}, "job ", jobLink(job.retried_as))],
    ["notify", job.notify_result ? notifyText(job.notify_result) : null],
    // A requeued job's earlier runs (its node declared down), oldest first.
    ...(job.attempts || []).map((a) => ["run " + a.attempt,
      "node " + (a.node || "-") + ", " + fmtTime(a.started_at) + " to " + fmtTime(a.ended_at) + ": " + a.outcome]),
  ];
  document.getElementById("job-facts").replaceChildren(...facts.filter(([, v]) => v !== null && v !== undefined)
    .flatMap(([k, v]) => [el("dt", { text: k }),
      v instanceof Node ? el("dd", { "data-fact": k }, v) : el("dd", { "data-fact": k, text: String(v) })]));
  const hints = document.getElementById("job-hints");
  hints.replaceChildren(...(job.hints && job.hints.length ? [el("h3", { text: "Hints" }), hintList(job.hints)] : []));
  renderCharts(job, data.now);
  return !job.ended_at;  // an ended job changes no more
}

/* ---- usage ---------------------------------------------------------------------------- */

function renderUsage(data) {
  header(data);
  document.getElementById("usage-explained").textContent =
    "When two or more users have jobs waiting, fair share orders them by each user's recent " +
    "GPU memory-time: the user who used least goes first (then priority, then submit time). " +
    "A job holding 1G for an hour adds " +
    "1 GiB-hour, halved every " + fmtDuration(data.half_life_s) + "; after " +
    fmtDuration(data.window_s) + " it no longer counts. Least first:";
  const gibHours = (v) => (v / 2 ** 30 / 3600).toFixed(2);
  table("usage", [["user", "User"], ["usage", "GiB-hours"], ["share", "Share"], ["running", "Running"],
    ["queued", "Queued"], ["held", "Held"]],
    data.users.map((u) => {
      const share = el("div", { class: "bar share" });
      const part = el("div", { class: "seg seg-jobs" });
      part.style.width = 100 * u.share + "%";
      share.append(part);
      return el("tr", { "data-user": u.user }, el("td", { text: u.user }), el("td", { text: gibHours(u.usage) }),
        el("td", {}, share, " " + Math.round(100 * u.share) + "%"),
        el("td", { text: String(u.running) }), el("td", { text: String(u.queued) }), el("td", { text: String(u.held) }));
    }), 0);
}

/* ---- start -------------------------------------------------------------------------------- */

function start() {
  const page = document.body.dataset.page;
  for (const link of document.querySelectorAll("nav a")) {
    if (link.dataset.nav === page) link.className = "here";
  }
  if (page === "server") poll("/api/status", renderServer, POLL_MS.server);
  else if (page === "queue") poll("/api/status", renderQueue, POLL_MS.queue);
  else if (page === "usage") poll("/api/usage", renderUsage, POLL_MS.usage);
  else if (page === "job") {
    const id = new URLSearchParams(window.location.search).get("id") || "";
    poll("/api/job?id=" + encodeURIComponent(id), renderJob, POLL_MS.job);
  }
}

document.addEventListener("DOMContentLoaded", start);

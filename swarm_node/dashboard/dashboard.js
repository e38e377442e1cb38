// The dashboard page: polls /api/data and redraws the tables and charts. Every text from the data (peer
// names, peers' ids, rejection reasons) goes in through textContent, never as HTML.
"use strict";

const POLL_MS = 2000;
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                "#bcbd22", "#17becf"];
const HAS_CHARTS = typeof window.uPlot !== "undefined";
let renders = 0;

// as report.md writes numbers (Python's format(v, ".3f")): toFixed rounds an exact tie such as 0.3125 (5/16)
// up, Python to even, so exact ties are rounded to even here
function fmt(v, digits = 3) {
  if (v === null || v === undefined) return "-";
  // an exact tie is an odd multiple of 2^-(digits+1) (times a power of two: exact in floating point)
  const halves = Number(v) * 2 ** (digits + 1);
  if (Number.isInteger(halves) && halves % 2 !== 0) {
    const f = Math.floor(Number(v) * 10 ** digits);
    return ((f % 2 === 0 ? f : f + 1) / 10 ** digits).toFixed(digits);
  }
  return Number(v).toFixed(digits);
}

function bytes(n) {
  for (const [unit, scale] of [["GB", 1e9], ["MB", 1e6], ["KB", 1e3]]) {
    if (n >= scale) return (n / scale).toFixed(1) + " " + unit;
  }
  return n + " B";
}

function ago(s) {
  if (s === null || s === undefined) return "-";
  if (s < 90) return Math.max(0, Math.round(s)) + " s ago";
  if (s < 5400) return Math.round(s / 60) + " min ago";
  return Math.round(s / 3600) + " h ago";
}

function el(tag, text, attrs) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}

function label(p, single) {
  const base = p.arm === "node" || single ? p.name : p.name + " (" + p.arm + ")";
  return p.id.split("/").length > 2 ? p.dir + ": " + base : base;
}

// one color per peer name (a peer's swarm and alone arms share it; alone is dashed)
function colorOf(names, name) {
  return COLORS[names.indexOf(name) % COLORS.length];
}

function renderPeers(doc, names) {
  const body = document.querySelector("#peers tbody");
  body.replaceChildren();
  const single = new Set(doc.peers.map((p) => p.arm)).size === 1;
  for (const p of doc.peers) {
    const s = p.summary;
    const tr = el("tr", null, {"data-peer": p.name, "data-arm": p.arm, "data-id": p.id});
    const parts = Object.entries(p.parts_last || {}).map(([k, v]) => k + " " + fmt(v)).join(", ");
    const rejected = Object.values(s.rejected || {}).reduce((a, b) => a + b, 0);
    const cells = [
      ["peer", label(p, single)], ["arm", p.arm], ["model", p.model || "-"], ["round", p.round],
      ["last-row", p.writing ? "writing..." : ago(p.seconds_since_row)],
      ["acc-start", fmt(s.start_accuracy)], ["acc-end", fmt(s.end_accuracy)], ["acc-best", fmt(s.best_accuracy)],
      ["parts", parts || "-"], ["reward", fmt(p.reward_rolling)], ["external", s.external_groups],
      ["filtered-share", fmt(p.filtered_share)], ["ratio-ext", fmt(p.mean_ratio_external)],
      ["rejected", rejected], ["sent", bytes(s.bytes_out)], ["received", bytes(s.bytes_in)],
    ];
    for (const [cls, text] of cells) {
      const td = el("td", text, {"class": cls + (["peer", "arm", "model", "parts"].includes(cls) ? " text" : "")});
      if (cls === "peer") td.style.borderLeft = "4px solid " + colorOf(names, p.name);
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
}

// one line per series; `pick(peer)` gives [suffix, points [[round, value]], dashed] per line of a peer
function lineSeries(doc, names, pick) {
  const single = new Set(doc.peers.map((p) => p.arm)).size === 1;
  const out = [];
  for (const p of doc.peers) {
    for (const [suffix, pts, dotted] of pick(p)) {
      if (!pts || !pts.length) continue;
      out.push({label: label(p, single) + suffix, pts, color: colorOf(names, p.name),
                dash: dotted ? [2, 4] : (p.arm === "alone" ? [8, 5] : undefined)});
    }
  }
  return out;
}

// uPlot wants one x array shared by all series: the union of their rounds, with null where a series has none
function aligned(series) {
  const xs = [...new Set(series.flatMap((s) => s.pts.map((q) => q[0])))].sort((a, b) => a - b);
  const at = new Map(xs.map((x, i) => [x, i]));
  return [xs, ...series.map((s) => {
    const ys = new Array(xs.length).fill(null);
    for (const [x, y] of s.pts) ys[at.get(x)] = y;
    return ys;
  })];
}

const charts = {};  // element id -> {plot, key}

function chartSize(el) {
  return {width: Math.max(300, el.clientWidth - 4), height: 260};
}

function drawChart(id, title, ylabel, series, opts) {
  const el = document.getElementById(id);
  const key = JSON.stringify([title, series.map((s) => [s.label, s.color, s.dash])]);
  const data = aligned(series);
  let c = charts[id];
  if (!c || c.key !== key) {
    if (c) c.plot.destroy();
    el.replaceChildren();
    const points = (opts && opts.points) || false;
    const plot = new uPlot({
      title, ...chartSize(el), scales: {x: {time: false}, y: (opts && opts.y) || {}},
      axes: [{label: "round"}, {label: ylabel}], cursor: {drag: {x: true, y: false}}, legend: {live: false},
      series: [{label: "round"}, ...series.map((s) => ({
        label: s.label, stroke: s.color, width: 2, dash: s.dash, spanGaps: true, points: {show: points, size: 5},
      }))],
    }, data, el);
    c = charts[id] = {plot, key};
    el._uplot = plot;  // for the browser test: the data the chart drew
  } else {
    c.plot.setData(data);
  }
  el.dataset.points = JSON.stringify(series.map((s) => s.pts.length));
}

window.addEventListener("resize", () => {
  for (const [id, c] of Object.entries(charts)) c.plot.setSize(chartSize(document.getElementById(id)));
});

function renderCharts(doc, names) {
  if (!HAS_CHARTS) {
    document.getElementById("no-charts").hidden = false;
    return;
  }
  const dpo = doc.peers.some((p) => p.dpo);
  drawChart("chart-accuracy", dpo ? "held-out preference accuracy" : "held-out accuracy (greedy; dotted: per part)",
    "accuracy", lineSeries(doc, names, (p) => [
      ["", p.series.accuracy, false],
      ...Object.entries(p.series.parts || {}).map(([part, pts]) => [" · " + part, pts, true]),
    ]), {points: true, y: {range: [0, 1]}});
  drawChart("chart-reward", dpo ? "train preference accuracy (5-round mean)" : "reward of own samples (5-round mean)",
    "reward", lineSeries(doc, names, (p) => [["", p.series.reward_rolling, false]]));
  drawChart("chart-filtered", "F-TIS: share of sequences filtered", "share",
    lineSeries(doc, names, (p) => [["", p.series.filtered_share, false]]));
  drawChart("chart-ratio", "F-TIS: mean importance ratio pi/q (dotted: own samples)", "ratio",
    lineSeries(doc, names, (p) => [[" · peers'", p.series.mean_ratio_external, false],
                                   [" · own", p.series.mean_ratio_local, true]]));
}

function keyTable(caption, entries, cls) {
  const t = el("table", null, {"class": cls});
  t.appendChild(el("caption", caption));
  if (!entries.length) {
    const tr = el("tr");
    tr.appendChild(el("td", "none", {"class": "text"}));
    t.appendChild(tr);
    return t;
  }
  for (const [k, v] of entries.sort((a, b) => b[1] - a[1])) {
    const tr = el("tr");
    tr.appendChild(el("td", k, {"class": "text"}));
    tr.appendChild(el("td", v));
    t.appendChild(tr);
  }
  return t;
}

function renderExchange(doc) {
  const box = document.getElementById("exchange");
  box.replaceChildren();
  const single = new Set(doc.peers.map((p) => p.arm)).size === 1;
  for (const p of doc.peers) {
    const div = el("div", null, {"data-peer": p.name, "data-arm": p.arm});
    div.appendChild(el("h3", label(p, single)));
    const pair = el("div", null, {"class": "pair"});
    pair.appendChild(keyTable("external groups by sender", Object.entries(p.summary.external_groups_by_peer || {}),
      "by-sender"));
    pair.appendChild(keyTable("rejected by reason", Object.entries(p.summary.rejected || {}), "by-reason"));
    div.appendChild(pair);
    box.appendChild(div);
  }
}

const TIME_COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f"];

// mean seconds per round of each timed part, as numbers and as one stacked bar per peer (same scale for all)
function renderTimes(doc) {
  const keys = [...new Set(doc.peers.flatMap((p) => Object.keys(p.time_split_mean || {})))];
  const head = document.querySelector("#times thead");
  const body = document.querySelector("#times tbody");
  const tr = el("tr");
  for (const [i, k] of ["peer", ...keys, "split"].entries()) {
    const th = el("th", k);
    if (i > 0 && i <= keys.length) th.style.borderBottom = "3px solid " + TIME_COLORS[(i - 1) % TIME_COLORS.length];
    tr.appendChild(th);
  }
  head.replaceChildren(tr);
  body.replaceChildren();
  const single = new Set(doc.peers.map((p) => p.arm)).size === 1;
  const total = (p) => keys.reduce((a, k) => a + ((p.time_split_mean || {})[k] || 0), 0);
  const widest = Math.max(1e-9, ...doc.peers.map(total));
  for (const p of doc.peers) {
    const row = el("tr", null, {"data-peer": p.name, "data-arm": p.arm});
    row.appendChild(el("td", label(p, single), {"class": "text"}));
    for (const k of keys) row.appendChild(el("td", fmt((p.time_split_mean || {})[k])));
    const cell = el("td", null, {"class": "bar"});
    keys.forEach((k, i) => {
      const v = (p.time_split_mean || {})[k] || 0;
      const seg = el("span", null, {"title": k + " " + fmt(v) + " s", "class": "seg"});
      seg.style.width = (200 * v / widest).toFixed(1) + "px";
      seg.style.background = TIME_COLORS[i % TIME_COLORS.length];
      cell.appendChild(seg);
    });
    row.appendChild(cell);
    body.appendChild(row);
  }
}

function renderSwarm(doc) {
  const box = document.getElementById("swarm");
  box.replaceChildren();
  const sw = doc.swarm;
  if (!sw) {
    box.appendChild(el("p", "No swarm view: start `swarm-node dashboard DIR --initial-peers MULTIADDR` to list " +
      "the swarm's live peers from the DHT.", {"class": "note"}));
    return;
  }
  if (sw.error) box.appendChild(el("p", sw.error, {"class": "note error"}));
  else if (sw.state === "joining") box.appendChild(el("p", "joining the DHT...", {"class": "note"}));
  const now = doc.generated;
  for (const [sid, members] of Object.entries(sw.swarms || {})) {
    box.appendChild(el("h3", "swarm '" + sid + "': " + members.length + " live peer(s)"));
    if (!members.length) continue;
    const t = el("table", null, {"class": "members", "data-swarm": sid});
    const h = el("tr");
    for (const c of ["peer id", "mode", "model", "task", "round", "seen"]) h.appendChild(el("th", c));
    t.appendChild(h);
    for (const m of members) {
      const tr = el("tr", null, {"data-peer-id": m.peer_id});
      for (const [v, cls] of [[m.peer_id, "text"], [m.mode, "text"], [m.model_name, "text"], [m.task_id, "text"],
        [m.round, ""], [ago(now - m.updated), ""]]) tr.appendChild(el("td", v, {"class": cls}));
      t.appendChild(tr);
    }
    box.appendChild(t);
  }
}

function renderProblems(doc) {
  const ul = document.getElementById("problems");
  ul.replaceChildren(...doc.problems.map((p) => el("li", p)));
  ul.hidden = doc.problems.length === 0;
}

function render(doc) {
  document.getElementById("title").textContent = doc.title;
  const names = [...new Set(doc.peers.map((p) => p.name))];
  renderProblems(doc);
  renderPeers(doc, names);
  renderCharts(doc, names);
  renderExchange(doc);
  renderTimes(doc);
  renderSwarm(doc);
  renders += 1;
  document.body.dataset.renders = String(renders);
  const rounds = doc.peers.map((p) => p.round);
  const st = document.getElementById("status");
  st.className = "";
  st.textContent = "updated " + new Date(doc.generated * 1000).toLocaleTimeString() + " · " + doc.peers.length +
    " peer(s)" + (rounds.length ? " · rounds " + Math.min(...rounds) + "-" + Math.max(...rounds) : "");
  if (renders === 1) performance.mark("dashboard-rendered");
}

async function poll() {
  try {
    const first = window.firstData;  // page.html asked for the first answer before the scripts loaded
    window.firstData = null;
    const res = await (first || fetch("api/data", {cache: "no-store"}));
    const doc = await res.json();
    if (!res.ok) throw new Error(doc.error || res.statusText);
    render(doc);
  } catch (err) {
    const st = document.getElementById("status");
    st.className = "error";
    st.textContent = "cannot update (" + (err && err.message ? err.message : err) +
      "): the server stopped? showing the last data";
  }
  setTimeout(poll, POLL_MS);
}

poll();

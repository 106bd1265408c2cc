// vlmdata dashboard: polls /api/data and draws each chart on a canvas (no libraries).
// Every chart element exposes what it shows for tests and scripts:
//   data-chart (id), data-lines (number of lines), data-points (points of its longest line),
//   data-latest (JSON: line name -> latest value or null), data-max (largest value of any line).
"use strict";

const COLORS = ["#4dabf7", "#ffa94d", "#69db7c", "#f783ac", "#b197fc", "#ffd43b", "#63e6be", "#ff8787"];
const WINDOW_SECONDS = 300;   // at most this much history on screen
const MIN_WINDOW_SECONDS = 20;
const state = { refreshes: 0, errors: 0, cards: {} };

function fmt(v, unit) {
  if (v === null || v === undefined || !isFinite(v)) return "–";
  if (unit === "fraction") return (100 * v).toFixed(1) + " %";
  const a = Math.abs(v);
  const suffix = unit === "B/s" ? "B/s" : "/s";
  const steps = [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
  for (const [scale, p] of steps) if (a >= scale) return (v / scale).toFixed(2) + " " + p + suffix;
  return v.toFixed(a >= 100 ? 0 : a >= 10 ? 1 : 2) + " " + suffix;
}

function card(chart) {
  let c = state.cards[chart.id];
  if (c) return c;
  const el = document.createElement("section");
  el.className = "chart";
  el.id = "chart-" + chart.id;
  el.dataset.chart = chart.id;
  el.innerHTML = '<h2><span class="title"></span><span class="latest"></span></h2>' +
                 '<canvas width="600" height="200"></canvas><div class="legend"></div>';
  el.querySelector(".title").textContent = chart.title;
  document.getElementById("charts").appendChild(el);
  c = { el, canvas: el.querySelector("canvas"), legend: el.querySelector(".legend"),
        latest: el.querySelector(".latest") };
  state.cards[chart.id] = c;
  return c;
}

function draw(chart) {
  const c = card(chart);
  const names = Object.keys(chart.series).sort();
  const latest = {};
  let points = 0;
  for (const n of names) {
    const s = chart.series[n];
    points = Math.max(points, s.length);
    latest[n] = s.length ? s[s.length - 1][1] : null;
  }
  c.el.dataset.lines = String(names.length);
  c.el.dataset.points = String(points);
  c.el.dataset.latest = JSON.stringify(latest);
  c.latest.textContent = names.length === 1 ? fmt(latest[names[0]], chart.unit)
                                            : names.map(n => n + ": " + fmt(latest[n], chart.unit)).join("  ");

  const cv = c.canvas;
  const dpr = window.devicePixelRatio || 1;
  const w = Math.max(200, cv.clientWidth || 600), h = Math.max(100, cv.clientHeight || 200);
  if (cv.width !== Math.round(w * dpr)) { cv.width = Math.round(w * dpr); cv.height = Math.round(h * dpr); }
  const g = cv.getContext("2d");
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, w, h);
  const left = 64, right = 8, top = 8, bottom = 20;
  let tmax = 0, tfirst = Infinity, vmax = 0;
  for (const n of names) for (const [t, v] of chart.series[n]) {
    tmax = Math.max(tmax, t);
    tfirst = Math.min(tfirst, t);
    if (v !== null) vmax = Math.max(vmax, v);
  }
  c.el.dataset.max = String(vmax);
  if (!tmax) { tmax = Date.now() / 1000; tfirst = tmax; }
  // the window grows with the data (a fresh run fills the chart) up to WINDOW_SECONDS
  const span = Math.min(WINDOW_SECONDS, Math.max(MIN_WINDOW_SECONDS, tmax - tfirst));
  const tmin = tmax - span;
  if (chart.unit === "fraction") vmax = 1; else vmax = vmax > 0 ? vmax * 1.15 : 1;
  const x = t => left + (w - left - right) * (t - tmin) / (tmax - tmin);
  const y = v => top + (h - top - bottom) * (1 - v / vmax);

  g.strokeStyle = "#2a3540"; g.fillStyle = "#8a96a3"; g.lineWidth = 1; g.font = "11px sans-serif";
  g.textAlign = "right"; g.textBaseline = "middle";
  for (let i = 0; i <= 4; i++) {
    const v = vmax * i / 4, yy = y(v);
    g.beginPath(); g.moveTo(left, yy); g.lineTo(w - right, yy); g.stroke();
    g.fillText(fmt(v, chart.unit), left - 6, yy);
  }
  g.textAlign = "center"; g.textBaseline = "alphabetic";
  const tick = [5, 10, 15, 30, 60, 120].find(step => span / step <= 6) || 120;
  for (let s = tick; s < span; s += tick) g.fillText("-" + s + "s", x(tmax - s), h - 4);
  g.textAlign = "right";
  g.fillText("now", w - right, h - 4);

  c.legend.textContent = "";
  names.forEach((n, i) => {
    const color = COLORS[i % COLORS.length];
    g.strokeStyle = color; g.lineWidth = 2; g.beginPath();
    let pen = false;
    for (const [t, v] of chart.series[n]) {
      if (v === null || t < tmin) { pen = false; continue; }
      if (pen) g.lineTo(x(t), y(v)); else g.moveTo(x(t), y(v));
      pen = true;
    }
    g.stroke();
    const item = document.createElement("span");
    item.innerHTML = '<i></i>';
    item.querySelector("i").style.background = color;
    item.appendChild(document.createTextNode(n));
    c.legend.appendChild(item);
  });
}

function showTargets(targets) {
  const up = targets.filter(t => t.up).length;
  const st = document.getElementById("status");
  st.dataset.targets = String(targets.length);
  st.dataset.targetsUp = String(up);
  st.textContent = up + " / " + targets.length + " targets up";
  st.className = up === targets.length ? "" : "down";
  const ul = document.getElementById("targets");
  ul.textContent = "";
  for (const t of targets) {
    const li = document.createElement("li");
    li.className = t.up ? "up" : "down";
    li.textContent = t.url + (t.up ? " — up, " + t.scrapes + " scrapes" : " — down: " + t.last_error);
    ul.appendChild(li);
  }
}

async function refresh() {
  try {
    const resp = await fetch("/api/data", { cache: "no-store" });
    if (!resp.ok) throw new Error("HTTP " + resp.status);
    const data = await resp.json();
    data.charts.forEach(draw);
    showTargets(data.targets);
    state.refreshes += 1;
    document.body.dataset.refreshes = String(state.refreshes);
    return data.interval;
  } catch (err) {
    state.errors += 1;
    document.body.dataset.errors = String(state.errors);
    document.getElementById("status").textContent = "dashboard server unreachable: " + err.message;
    return null;
  }
}

async function loop() {
  const interval = await refresh();
  setTimeout(loop, 1000 * Math.max(0.25, interval || 2));
}

loop();

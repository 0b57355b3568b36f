// ember console: the runs table's column chooser and the compare page's chart (plotly.js, vendored:
// static/plotly.min.js). The run page's charts are run.js (uPlot). No build step.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const state = { x: "step", smoothing: 0, log: false };

  // Plotly renders a subset of HTML in titles, legends and hover labels (<a href>, <b>, <span
  // style>...): run and metric names are the users' text, so they are escaped to show as typed.
  function esc(text) {
    return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }
  const cache = {};  // key -> series JSON

  // Exponential moving average with the start-up bias removed (as TensorBoard smooths).
  function ema(values, weight) {
    if (!weight) return values;
    let acc = 0, n = 0;
    return values.map((v) => {
      if (v === null) return null;
      n += 1;
      acc = acc * weight + (1 - weight) * v;
      return acc / (1 - Math.pow(weight, n));
    });
  }

  function traces(label, s, color) {
    const x = state.x === "epoch" ? s.epoch : s.step;
    label = esc(label);
    const raw = { x: x, y: s.value, name: label, type: "scatter", mode: s.value.length < 60 ? "lines+markers" : "lines",
                  line: { width: 1.5, color: color }, connectgaps: false };
    if (!state.smoothing) return [raw];
    raw.opacity = 0.3; raw.showlegend = false; raw.hoverinfo = "skip";
    return [raw, { x: x, y: ema(s.value, state.smoothing), name: label + " (smoothed)", type: "scatter", mode: "lines",
                   line: { width: 2, color: color } }];
  }

  function layout(title) {
    return {
      title: { text: esc(title), font: { size: 14 } }, margin: { l: 50, r: 12, t: 34, b: 38 }, hovermode: "x unified",
      xaxis: { title: { text: state.x }, zeroline: false }, yaxis: { type: state.log ? "log" : "linear", zeroline: false },
      legend: { orientation: "h", y: -0.25 }, paper_bgcolor: "#fff", plot_bgcolor: "#fff",
    };
  }
  // Nothing leaves the machine: no "send to cloud" / "edit in Chart Studio", no link to plotly.com.
  const config = { responsive: true, displaylogo: false, showSendToCloud: false, showEditInChartStudio: false,
                   showLink: false, showTips: false, modeBarButtonsToRemove: ["lasso2d", "select2d", "sendDataToCloud"] };

  async function getJSON(url) {
    const r = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!r.ok) throw new Error((await r.json().catch(() => ({}))).detail || r.statusText);
    return r.json();
  }

  // ---- compare page ----
  const compare = $("compare-chart");
  const palette = ["#1f5fbf", "#c2410c", "#067647", "#7a2ea0", "#b42318", "#0e7490", "#a16207", "#4b5563"];
  async function loadCompare() {
    const metric = $("compare-metric").value, cut = metric.indexOf("/");
    const type = metric.slice(0, cut), name = metric.slice(cut + 1);
    const ids = JSON.parse(compare.dataset.runs), names = JSON.parse(compare.dataset.names);
    for (const id of ids) {
      const key = id + "|" + type;
      if (!cache[key]) cache[key] = await getJSON(compare.dataset.prefix + "/runs/" + id + "/series?type=" + encodeURIComponent(type));
    }
    drawCompare(ids, names, type, name);
  }
  function drawCompare(ids, names, type, name) {
    let all = [], drawn = 0;
    ids.forEach((id, i) => {
      const s = (cache[id + "|" + type] || { metrics: {} }).metrics[name];
      if (s) { all = all.concat(traces(names[i], s, palette[i % palette.length])); drawn += 1; }
    });
    compare.dataset.traces = String(drawn);
    Plotly.react(compare, all, layout(type + "/" + name), config);
  }

  function redraw() {
    if (compare) loadCompare().catch(showError);
  }
  function showError(e) {
    const note = $("chart-note");
    if (note) note.textContent = "charts could not load: " + e.message;
  }
  function wire() {
    if ($("x-axis")) $("x-axis").addEventListener("change", (e) => { state.x = e.target.value; redraw(); });
    if ($("log-scale")) $("log-scale").addEventListener("change", (e) => { state.log = e.target.checked; redraw(); });
    if ($("smoothing")) $("smoothing").addEventListener("input", (e) => {
      state.smoothing = Number(e.target.value); $("smoothing-value").textContent = e.target.value; redraw();
    });
    if ($("compare-metric")) $("compare-metric").addEventListener("change", redraw);
  }

  // ---- runs table: the column chooser, remembered per folder in this browser ----
  function columnChooser() {
    const table = $("runs-table"), chooser = $("columns");
    if (!table || !chooser) return;
    const key = "ember.columns:" + table.dataset.columnsKey;
    let saved = {};
    try { saved = JSON.parse(localStorage.getItem(key) || "{}") || {}; } catch (e) { saved = {}; }
    const boxes = Array.from(chooser.querySelectorAll("input[data-col]"));
    function show(col, on) {
      for (const cell of table.querySelectorAll("[data-col]")) if (cell.dataset.col === col) cell.hidden = !on;
    }
    for (const box of boxes) {
      const col = box.dataset.col;
      if (col in saved) { box.checked = !!saved[col]; show(col, box.checked); }
      box.addEventListener("change", () => {
        show(col, box.checked);
        if (box.checked === (box.dataset.default === "1")) delete saved[col]; else saved[col] = box.checked;
        localStorage.setItem(key, JSON.stringify(saved));
      });
    }
    $("columns-reset").addEventListener("click", () => {
      saved = {}; localStorage.removeItem(key);
      for (const box of boxes) { box.checked = box.dataset.default === "1"; show(box.dataset.col, box.checked); }
    });
  }

  wire();
  columnChooser();
  if (compare) loadCompare().catch(showError);
})();

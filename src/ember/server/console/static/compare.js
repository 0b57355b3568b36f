// ember console, the compare page: every shared metric in a grid, hparams -> metric (parallel
// coordinates and a scatter). The page's runs, colours, summaries and best-value modes come in
// #compare-data; series are fetched per run and metric type. Charts are drawn only through draw()
// below, so the chart library can change in one place.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const data = JSON.parse($("compare-data").textContent);
  const state = { x: "step", smoothing: 0, log: false };

  // Plotly renders a subset of HTML in titles, legends and hover labels: names are the users'
  // text, so they are escaped to show as typed.
  function esc(text) {
    return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }
  // Nothing leaves the machine: no "send to cloud" / "edit in Chart Studio", no link to plotly.com.
  const config = { responsive: true, displaylogo: false, showSendToCloud: false, showEditInChartStudio: false,
                   showLink: false, showTips: false, modeBarButtonsToRemove: ["lasso2d", "select2d", "sendDataToCloud"] };
  function draw(div, traces, layout) {
    const base = { margin: { l: 56, r: 16, t: 34, b: 40 }, paper_bgcolor: "#fff", plot_bgcolor: "#fff", hovermode: "closest" };
    return Plotly.react(div, traces, Object.assign(base, layout), config);
  }

  const better = (metric, a, b) => (data.modes[metric] === "max" ? a > b : a < b);
  const fmt = (v) => (v === null || v === undefined ? "—" : Math.abs(v) >= 1e4 || (v !== 0 && Math.abs(v) < 1e-3) ? v.toExponential(3) : +v.toPrecision(4));

  // Exponential moving average with the start-up bias removed (as TensorBoard smooths).
  function ema(values, weight) {
    if (!weight) return values;
    let acc = 0, n = 0;
    return values.map((v) => {
      if (v === null) return null;
      n += 1; acc = acc * weight + (1 - weight) * v;
      return acc / (1 - Math.pow(weight, n));
    });
  }

  // ---- series, fetched once per (run, type), a few at a time ----
  const series = new Map();
  const queue = [];
  let active = 0;
  function pump() {
    while (active < 6 && queue.length) {
      const job = queue.shift(); active += 1;
      fetch(job.url, { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then((r) => (r.ok ? r.json() : Promise.reject(new Error(r.status + " " + r.statusText))))
        .then(job.resolve, job.reject)
        .finally(() => { active -= 1; pump(); });
    }
  }
  function seriesOf(runId, type) {
    const key = runId + "|" + type;
    if (!series.has(key)) {
      const url = data.prefix + "/runs/" + encodeURIComponent(runId) + "/series?type=" + encodeURIComponent(type);
      series.set(key, new Promise((resolve, reject) => { queue.push({ url, resolve, reject }); pump(); }));
    }
    return series.get(key);
  }

  // ---- the grid: one chart per shared metric, every run in its colour, the best point starred ----
  const lineRuns = data.runs.slice(0, data.line_runs);
  async function drawMetric(div) {
    const metric = div.dataset.metric, cut = metric.indexOf("/");
    const type = metric.slice(0, cut), name = metric.slice(cut + 1);
    const traces = [];
    let best = null, ties = [];  // ties: one point per other run that holds best.y as well
    for (const run of lineRuns) {
      if (!(metric in run.metrics)) continue;
      const s = (await seriesOf(run.id, type)).metrics[name];
      if (!s) continue;
      const x = state.x === "epoch" ? s.epoch : s.step;
      const y = ema(s.value, state.smoothing);
      traces.push({ x: x, y: y, name: esc(run.name), type: "scatter", mode: s.value.length < 60 ? "lines+markers" : "lines",
                    line: { width: 1.6, color: run.color }, marker: { size: 4, color: run.color }, connectgaps: false,
                    showlegend: false, hovertemplate: esc(run.name) + "<br>%{x}: %{y:.4g}<extra></extra>" });
      s.value.forEach((v, i) => {
        if (v === null || !isFinite(v)) return;
        const point = { x: s.step[i], xs: x[i], y: v, run: run };
        if (best === null || better(metric, v, best.y)) { best = point; ties = []; }
        else if (v === best.y && run !== best.run && !ties.some((t) => t.run === run)) ties.push(point);
      });
    }
    const stars = best ? [best, ...ties] : [];  // every run that holds the best value
    for (const b of stars) {
      traces.push({ x: [b.xs], y: [b.y], type: "scatter", mode: "markers", showlegend: false, name: "best",
                    marker: { symbol: "star", size: 15, color: b.run.color, line: { color: "#111", width: 1 } },
                    hovertemplate: "best (" + data.modes[metric] + "): " + esc(b.run.name) + "<br>" + fmt(b.y) + " at step " + b.x + "<extra></extra>" });
    }
    div.dataset.traces = String(traces.length - stars.length);
    div.dataset.colors = JSON.stringify(traces.filter((t) => t.name !== "best").map((t) => t.line.color));
    div.dataset.bestRun = stars.map((b) => b.run.id).join(" ");
    div.dataset.bestValue = best ? String(best.y) : "";
    const title = esc(metric) + (best ? "  <span style='font-size:11px;color:#555'>best " + fmt(best.y) + " · " + stars.map((b) => esc(b.run.name)).join(", ") + "</span>" : "");
    await draw(div, traces, { title: { text: title, font: { size: 14 } }, showlegend: false,
                              xaxis: { title: { text: state.x }, zeroline: false },
                              yaxis: { type: state.log ? "log" : "linear", zeroline: false } });
  }
  function drawGrid() {
    const divs = Array.from(document.querySelectorAll("#compare-grid .chart"));
    return Promise.all(divs.map((div) => drawMetric(div).catch((e) => {
      $("chart-note").textContent = "charts could not load: " + e.message;
    })));
  }

  // ---- hparams -> metric: parallel coordinates and a scatter over every run ----
  function valueOf(run, metric, which) {
    const s = run.metrics[metric];
    const v = s ? s[which] : null;
    return v === null || v === undefined || !isFinite(v) ? null : v;
  }
  // Parallel coordinates drawn as SVG lines (plotly's parcoords needs WebGL, which a headless or
  // GPU-less browser lacks): one vertical axis per hparam and the metric, each scaled to [0, 1]
  // (a positive numeric one spanning 100x or more on a log scale), a line per run coloured by the
  // metric, brighter is better, the best run drawn thick on top.
  const VIRIDIS = ["#440154", "#46327e", "#365c8d", "#277f8e", "#1fa187", "#4ac16d", "#a0da39", "#fde725"];
  function axis(label, values) {
    const numeric = values.every((v) => typeof v === "number" && isFinite(v));
    if (!numeric) {
      const cats = Array.from(new Set(values.map((v) => String(v)))).sort();
      const at = (v) => (cats.length < 2 ? 0.5 : cats.indexOf(String(v)) / (cats.length - 1));
      return { label: label, pos: values.map(at), ticks: cats.map((c) => [at(c), c]) };
    }
    const lo = Math.min(...values), hi = Math.max(...values);
    const log = lo > 0 && hi / lo >= 100;
    const f = (v) => (log ? Math.log10(v) : v);
    const span = f(hi) - f(lo);
    const at = (v) => (span ? (f(v) - f(lo)) / span : 0.5);
    return { label: label, pos: values.map(at), ticks: lo === hi ? [[0.5, fmt(lo)]] : [[0, fmt(lo)], [1, fmt(hi)]], log: log };
  }
  function parallel(div, runs, ys, metric, which, bestI) {
    const axes = data.hparams.map((k) => axis(k, runs.map((r) => r.hparams[k])));
    axes.push(axis(which + " " + metric, ys));
    const goodness = axes[axes.length - 1].pos.map((t) => (data.modes[metric] === "min" ? 1 - t : t));
    const buckets = VIRIDIS.map((color) => ({ x: [], y: [], text: [], type: "scatter", mode: "lines", showlegend: false,
      line: { color: color, width: 1.3 }, opacity: 0.75, hovertemplate: "%{text}<extra></extra>", connectgaps: false }));
    runs.forEach((r, i) => {
      const b = buckets[Math.min(VIRIDIS.length - 1, Math.floor(goodness[i] * VIRIDIS.length))];
      const label = esc(r.name) + "<br>" + esc(which + " " + metric) + " = " + fmt(ys[i]);
      axes.forEach((a, j) => { b.x.push(j); b.y.push(a.pos[i]); b.text.push(label); });
      b.x.push(null); b.y.push(null); b.text.push(null);
    });
    const traces = buckets.filter((b) => b.x.length);
    if (bestI >= 0) traces.push({ x: axes.map((_, j) => j), y: axes.map((a) => a.pos[bestI]), type: "scatter", mode: "lines+markers",
      name: "best", showlegend: false, line: { color: "#c2410c", width: 3.5 }, marker: { size: 7 },
      hovertemplate: "best: " + esc(runs[bestI].name) + "<br>" + esc(metric) + " = " + fmt(ys[bestI]) + "<extra></extra>" });
    const notes = axes.map((a, j) => ({ x: j, y: 1.1, text: "<b>" + esc(a.label) + "</b>" + (a.log ? " (log)" : ""), showarrow: false, font: { size: 12 } }));
    axes.forEach((a, j) => a.ticks.forEach(([at, text]) => notes.push({ x: j, y: at, text: esc(text), showarrow: false, xanchor: "left",
      xshift: 4, font: { size: 10, color: "#444" }, bgcolor: "rgba(255,255,255,0.7)" })));
    const shapes = axes.map((_, j) => ({ type: "line", x0: j, x1: j, y0: 0, y1: 1, line: { color: "#667085", width: 1.5 }, layer: "above" }));
    return draw(div, traces, { title: { text: "Parallel coordinates: hyper-parameters → " + esc(which + " " + metric) +
        " <span style='font-size:11px;color:#555'>(brighter is better)</span>", font: { size: 14 } },
      showlegend: false, annotations: notes, shapes: shapes, margin: { l: 30, r: 60, t: 60, b: 20 }, hovermode: "closest",
      xaxis: { visible: false, range: [-0.25, axes.length - 0.6], fixedrange: true },
      yaxis: { visible: false, range: [-0.06, 1.16], fixedrange: true } });
  }
  function drawSweep() {
    const section = $("sweep");
    if (!section) return Promise.resolve();
    const metric = $("cmp-metric").value, which = $("cmp-value").value, hp = $("cmp-hparam").value;
    const runs = data.runs.filter((r) => valueOf(r, metric, which) !== null);
    const ys = runs.map((r) => valueOf(r, metric, which));
    let bestI = -1;
    ys.forEach((v, i) => { if (bestI < 0 || better(metric, v, ys[bestI])) bestI = i; });
    const missing = data.runs.length - runs.length;
    $("sweep-note").textContent = (bestI >= 0 ? "the best run by " + which + " " + metric + ": " + runs[bestI].name + " (" + fmt(ys[bestI]) + "). " : "") +
      (missing ? missing + " run(s) without " + metric + " are left out." : "");
    const par = $("parcoords"), sc = $("scatter");
    par.dataset.runs = String(runs.length); sc.dataset.runs = String(runs.length);
    sc.dataset.bestRun = bestI >= 0 ? runs[bestI].id : "";
    const parDone = parallel(par, runs, ys, metric, which, bestI);
    const xs = runs.map((r) => r.hparams[hp]);
    const numeric = xs.every((v) => typeof v === "number");
    const positive = numeric && xs.length && xs.every((v) => v > 0);
    const logX = positive && Math.max(...xs) / Math.min(...xs) >= 100;
    const hover = runs.map((r, i) => esc(r.name) + "<br>" + esc(hp) + " = " + esc(String(xs[i])) + "<br>" + esc(metric) + " = " + fmt(ys[i]));
    // Text values: one column per value, the runs spread a little sideways so they do not hide each other.
    const cats = numeric ? [] : Array.from(new Set(xs.map(String))).sort();
    const px = numeric ? xs : xs.map((v, i) => cats.indexOf(String(v)) + (((i * 0.618034) % 1) - 0.5) * 0.4);
    const points = { x: px, y: ys, type: "scatter", mode: "markers", name: "runs",
                     text: hover, hovertemplate: "%{text}<extra></extra>", customdata: runs.map((r) => r.id),
                     marker: { size: 9, color: runs.map((r) => r.color), line: { color: "#333", width: 0.5 } } };
    const star = bestI < 0 ? [] : [{ x: [points.x[bestI]], y: [ys[bestI]], type: "scatter", mode: "markers", name: "best",
                     hovertemplate: "best: " + hover[bestI] + "<extra></extra>",
                     marker: { symbol: "star", size: 18, color: runs[bestI].color, line: { color: "#111", width: 1.2 } } }];
    const scDone = draw(sc, [points].concat(star), {
      title: { text: esc(hp) + " vs " + esc(which + " " + metric) + " (click a point to open its run)", font: { size: 14 } },
      showlegend: false, xaxis: numeric ? { title: { text: esc(hp) }, type: logX ? "log" : "linear" }
        : { title: { text: esc(hp) }, type: "linear", tickvals: cats.map((_, i) => i), ticktext: cats.map(esc),
            range: [-0.6, cats.length - 0.4], zeroline: false },
      yaxis: { title: { text: esc(metric) }, type: state.log ? "log" : "linear" } }).then(() => {
      if (!sc.dataset.wired) {
        sc.dataset.wired = "1";
        sc.on("plotly_click", (ev) => {
          const id = ev.points && ev.points[0] && ev.points[0].customdata;
          if (id) window.location.href = data.prefix + "/runs/" + encodeURIComponent(id);
        });
      }
    });
    return Promise.all([parDone, scDone]);
  }

  function wire() {
    const on = (id, event, fn) => { if ($(id)) $(id).addEventListener(event, fn); };
    on("cmp-x", "change", (e) => { state.x = e.target.value; drawGrid(); });
    on("cmp-log", "change", (e) => { state.log = e.target.checked; drawGrid(); drawSweep(); });
    on("cmp-smoothing", "input", (e) => { state.smoothing = Number(e.target.value); $("cmp-smoothing-value").textContent = e.target.value; drawGrid(); });
    for (const id of ["cmp-metric", "cmp-value", "cmp-hparam"]) on(id, "change", drawSweep);
  }

  wire();
  Promise.all([drawGrid(), drawSweep()]).then(() => { document.body.dataset.compareReady = "1"; });
})();

// ember console, the compare page: every shared metric in a grid of uPlot line charts (the run
// page's library), hparams -> metric (parallel coordinates and a scatter, drawn with plotly
// through draw() below). The page's runs, colours, summaries, best values and modes come in
// #compare-data; series are fetched a metric type at a time for 100 runs a request. Run names
// are the users' text: set as textContent, escaped for plotly.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const data = JSON.parse($("compare-data").textContent);
  const params = new URLSearchParams(window.location.search);
  const state = { x: "step", smoothing: 0, log: false, groups: groupKeysOf(params.get("group")) };

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

  async function getJSON(url) {
    const r = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!r.ok) throw new Error((await r.json().catch(() => ({}))).detail || r.status + " " + r.statusText);
    return r.json();
  }

  // ---- series: one metric type of every run, 100 runs a request, each downsampled to its share ----
  // The URLs are the server's (data.series), which the page preloads: these fetches take those answers.
  const byType = new Map();  // type -> Promise of { run id: that run's series answer }
  function typeSeries(type) {
    if (!byType.has(type)) {
      const asks = (data.series[type] || []).map((url) => getJSON(url));
      byType.set(type, Promise.all(asks).then((parts) => Object.assign({}, ...parts.map((part) => part.runs))));
    }
    return byType.get(type);
  }

  // ---- the line charts (uPlot, as the run page): every run in its colour, the best point starred ----
  // The best value and the runs holding it come from the server, over every run compared (the
  // table's ★); each star sits on that run's recorded point of that value, whatever the smoothing.
  const AXES = { step: "step", epoch: "epoch", relative: "relative time (s)" };
  const hidden = new Set();  // run ids switched off in the legend
  const views = [];
  function xsOf(s) {
    if (state.x === "epoch") return s.epoch || [];
    if (state.x === "relative") {
      const t0 = Math.min(...(s.time || []).filter((t) => t !== null));
      return (s.time || []).map((t) => (t === null ? null : t - t0));
    }
    return s.step;
  }

  // A 5-pointed star at each best point of a shown run (uPlot draws lines only).
  function starsPlugin(view) {
    return { hooks: { draw: (u) => {
      const ctx = u.ctx, px = devicePixelRatio;
      ctx.save();
      for (const star of view.stars) {
        if (!u.series[star.series].show) continue;
        const cx = u.valToPos(star.x, "x", true), cy = u.valToPos(star.y, "y", true);
        ctx.beginPath();
        for (let k = 0; k < 10; k++) {
          const r = (k % 2 ? 3.2 : 8) * px, a = -Math.PI / 2 + (k * Math.PI) / 5;
          ctx.lineTo(cx + r * Math.cos(a), cy + r * Math.sin(a));
        }
        ctx.closePath();
        ctx.fillStyle = star.run.color; ctx.fill();
        ctx.lineWidth = 1.2 * px; ctx.strokeStyle = "#111"; ctx.stroke();
      }
      ctx.restore();
    } } };
  }

  // Smoothed, each shown run's raw line is drawn faint beneath its smoothed one (as on the run page),
  // before uPlot draws the series; the stars sit on raw points, the values recorded.
  function rawPlugin(view) {
    return { hooks: { drawAxes: (u) => {
      if (!view.smoothed || view.grouped) return;
      const ctx = u.ctx, b = u.bbox;
      ctx.save();
      ctx.beginPath(); ctx.rect(b.left, b.top, b.width, b.height); ctx.clip();
      ctx.globalAlpha = 0.3; ctx.lineWidth = devicePixelRatio;
      view.tables.forEach((t, k) => {
        if (!u.series[k + 1].show) return;
        ctx.strokeStyle = t.run.color; ctx.beginPath();
        let pen = false;
        t.x.forEach((x, i) => {
          if (t.raw[i] === null) { pen = false; return; }
          const px = u.valToPos(x, "x", true), py = u.valToPos(t.raw[i], "y", true);
          if (pen) ctx.lineTo(px, py); else ctx.moveTo(px, py);
          pen = true;
        });
        ctx.stroke();
      });
      ctx.restore();
    } } };
  }
  // The y range of a smoothed chart holds the raw values too (their spikes are drawn beneath).
  function rawRange(view, log) {
    return (u, lo, hi) => {
      for (const [k, t] of view.tables.entries()) {
        if (!u.series[k + 1].show) continue;
        for (const v of t.raw) if (v !== null) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
      }
      return log ? uPlot.rangeLog(lo, hi, 10, true) : uPlot.rangeNum(lo, hi, 0.1, true);
    };
  }

  // What the cursor is on: the best point under it, else the run whose line is picked out.
  function hoverText(view, u) {
    const left = u.cursor.left, top = u.cursor.top;
    if (left === undefined || left < 0) { view.hover.textContent = ""; return; }
    for (const star of view.stars) {
      const dx = u.valToPos(star.x, "x") - left, dy = u.valToPos(star.y, "y") - top;
      if (u.series[star.series].show && dx * dx + dy * dy < 100) {
        view.hover.textContent = "best (" + data.modes[view.metric] + "): " + star.run.name + " · " + fmt(star.y) + " at step " + star.step;
        return;
      }
    }
    const i = view.focus, idx = u.cursor.idx;
    if (!i || idx === null || idx === undefined) { view.hover.textContent = ""; return; }
    const mean = view.grouped ? i - ((i - 1) % 3) : i;  // a band's edge: its group's mean
    const v = u.data[mean][idx];
    const label = view.grouped ? u.series[mean].label + " mean" : view.tables[i - 1].run.name;
    view.hover.textContent = label + " · " + AXES[state.x] + " " + fmt(u.data[0][idx]) + ": " + (v === null || v === undefined ? "—" : fmt(v));
  }

  function build(div) {
    const metric = div.dataset.metric, cut = metric.indexOf("/");
    const view = { metric: metric, type: metric.slice(0, cut), name: metric.slice(cut + 1), div: div, plot: null,
                   log: null, smoothing: null, stars: [], tables: [], focus: null };
    const head = document.createElement("div"); head.className = "chart-head";
    const title = document.createElement("span"); title.className = "chart-title"; title.textContent = metric;
    const bestNote = document.createElement("span"); bestNote.className = "chart-best small";
    const log = document.createElement("label"); log.className = "small";
    const logBox = document.createElement("input"); logBox.type = "checkbox"; logBox.className = "chart-log";
    log.append(logBox, " log");
    const smooth = document.createElement("label"); smooth.className = "small";
    const smoothIn = document.createElement("input"); smoothIn.type = "number"; smoothIn.className = "chart-smoothing";
    smoothIn.min = "0"; smoothIn.max = "0.99"; smoothIn.step = "0.1"; smoothIn.placeholder = "page";
    smooth.append("smoothing ", smoothIn);
    head.append(title, bestNote, log, smooth);
    const hover = document.createElement("div"); hover.className = "chart-hover";
    const plot = document.createElement("div"); plot.className = "chart-plot";
    div.append(head, hover, plot);
    logBox.addEventListener("change", () => { view.log = logBox.checked; drawMetric(view).catch(showError); });
    smoothIn.addEventListener("input", () => {
      view.smoothing = smoothIn.value === "" ? null : Math.min(0.99, Math.max(0, Number(smoothIn.value)));
      drawMetric(view).catch(showError);
    });
    Object.assign(view, { bestNote: bestNote, logBox: logBox, smoothIn: smoothIn, hover: hover, plotDiv: plot });
    return view;
  }

  // ---- grouped runs: one band per combination of the values of some hparams (seeds folded), mean ± std at each x ----
  // The keys grouped by, from the address (?group=opt,lr): those that differ here, each once.
  function groupKeysOf(text) {
    return Array.from(new Set(String(text || "").split(",").map((k) => k.trim()))).filter((k) => data.hparams.includes(k));
  }
  const hparamOf = (run, k) => (run.hparams[k] === undefined ? null : run.hparams[k]);
  const groupKey = (run) => JSON.stringify(state.groups.map((k) => hparamOf(run, k)));
  function groupsOf() {
    const out = new Map();
    for (const run of data.runs) {
      const key = groupKey(run);
      if (!out.has(key)) {
        const label = state.groups.map((k) => k + "=" + (hparamOf(run, k) === null ? "—" : String(hparamOf(run, k)))).join(" · ");
        out.set(key, { key: key, label: label, runs: [] });
      }
      out.get(key).runs.push(run);
    }
    Array.from(out.values()).forEach((g, i) => { g.color = data.runs[i].color; });
    return out;
  }
  // Per group: [mean, mean + std, mean - std] over its runs that have a value at each x (std: the
  // population's, 0 for one run), on the page's x column.
  function groupStats(tables, xs, group) {
    const at = new Map(xs.map((x, i) => [x, i]));
    const sum = new Float64Array(xs.length), sq = new Float64Array(xs.length), n = new Uint32Array(xs.length);
    for (const t of tables) {
      if (!group.runs.includes(t.run)) continue;
      t.x.forEach((x, i) => { const v = t.y[i]; if (v === null) return; const j = at.get(x); sum[j] += v; sq[j] += v * v; n[j] += 1; });
    }
    const mean = new Array(xs.length), hi = new Array(xs.length), lo = new Array(xs.length);
    for (let j = 0; j < xs.length; j++) {
      if (!n[j]) continue;
      const m = sum[j] / n[j], sd = Math.sqrt(Math.max(0, sq[j] / n[j] - m * m));
      mean[j] = m; hi[j] = m + sd; lo[j] = m - sd;
    }
    return [mean, hi, lo];
  }
  function groupedPlot(view, tables, xs) {
    const groups = Array.from(groupsOf().values()).filter((g) => tables.some((t) => g.runs.includes(t.run)));
    const cols = [xs], series = [{ label: AXES[state.x] }], bands = [];
    for (const g of groups) {
      const [mean, hi, lo] = groupStats(tables, xs, g);
      const k = cols.length, show = !hidden.has(g.key);
      const count = tables.filter((t) => g.runs.includes(t.run)).length;
      cols.push(mean, hi, lo);
      series.push({ label: g.label + " (" + count + ")", stroke: g.color, width: 2, show: show, spanGaps: true },
                  { label: g.label + " +std", stroke: "transparent", width: 0, show: show, spanGaps: true, points: { show: false } },
                  { label: g.label + " -std", stroke: "transparent", width: 0, show: show, spanGaps: true, points: { show: false } });
      bands.push({ series: [k + 1, k + 2], fill: g.color.startsWith("#") ? g.color + "33" : g.color.replace("hsl(", "hsla(").replace(")", ", 0.2)") });
    }
    view.groups = groups;
    view.div.dataset.groups = JSON.stringify(groups.map((g) => [g.label, tables.filter((t) => g.runs.includes(t.run)).length]));
    return { cols: cols, series: series, bands: bands };
  }

  // The page's log scale puts a minimised metric (a loss) on a log axis, never a maximised one (an
  // accuracy): that takes the chart's own log box.
  const pageLog = (metric) => data.modes[metric] === "min";

  async function drawMetric(view) {
    const answers = await typeSeries(view.type);
    const log = view.log === null ? state.log && pageLog(view.metric) : view.log;
    const smoothing = view.smoothing === null ? state.smoothing : view.smoothing;
    view.logBox.checked = log;
    const tables = [];
    for (const run of data.runs) {
      const s = answers[run.id] && answers[run.id].metrics[view.name];
      if (!s) continue;
      const xs = xsOf(s), idx = [];
      for (let i = 0; i < xs.length; i++) if (xs[i] !== null && xs[i] !== undefined) idx.push(i);
      idx.sort((a, b) => xs[a] - xs[b]);
      const raw = idx.map((i) => { const v = s.value[i]; return v === null || (log && v <= 0) ? null : v; });
      tables.push({ run: run, x: idx.map((i) => xs[i]), raw: raw, y: ema(raw, smoothing), step: idx.map((i) => s.step[i]) });
    }
    // One x column for every run (uPlot's shape): where a run has no point, undefined (the line
    // goes on); a NaN or infinite value is null (a gap).
    const xs = Array.from(new Set(tables.flatMap((t) => t.x))).sort((a, b) => a - b);
    const at = new Map(xs.map((x, i) => [x, i]));
    const cols = [xs].concat(tables.map((t) => { const col = new Array(xs.length); t.x.forEach((x, i) => { col[at.get(x)] = t.y[i]; }); return col; }));
    const best = data.best[view.metric];
    view.stars = [];
    for (const [k, t] of tables.entries()) {
      if (!best || !best.runs.includes(t.run.id)) continue;
      let near = -1;
      t.raw.forEach((v, i) => { if (v !== null && (near < 0 || Math.abs(v - best.value) < Math.abs(t.raw[near] - best.value))) near = i; });
      if (near >= 0) view.stars.push({ series: k + 1, run: t.run, x: t.x[near], y: t.raw[near], step: t.step[near] });
    }
    view.tables = tables;
    view.smoothed = smoothing > 0;
    const div = view.div;
    div.dataset.traces = String(tables.length);
    div.dataset.colors = JSON.stringify(tables.map((t) => t.run.color));
    div.dataset.bestRun = best ? best.runs.join(" ") : "";
    div.dataset.stars = view.stars.map((st) => st.run.id).join(" ");
    div.dataset.bestValue = best ? String(best.value) : "";
    const names = best ? best.runs.map((id) => data.runs.find((r) => r.id === id).name) : [];
    view.bestNote.textContent = best ? "best " + fmt(best.value) + " · " + names.slice(0, 3).join(", ") + (names.length > 3 ? " +" + (names.length - 3) : "") : "";
    view.bestNote.title = best ? "the best " + view.metric + " (" + data.modes[view.metric] + ") of all " + data.runs.length + " runs: " + names.join(", ") : "";
    if (view.plot) { view.plot.destroy(); view.plot = null; }
    const width = Math.max(200, view.plotDiv.clientWidth || div.clientWidth || 400);
    let series = [{ label: AXES[state.x] }].concat(tables.map((t) => ({
      label: t.run.name, stroke: t.run.color, width: 1.4, show: !hidden.has(t.run.id),
      points: { show: t.x.length < 60, size: 4 } })));
    let plotCols = cols, bands = [];
    view.grouped = state.groups.length > 0;
    div.dataset.groups = "";
    if (view.grouped) {  // no stars: the runs' own lines are not drawn; the best stays named above
      ({ cols: plotCols, series: series, bands: bands } = groupedPlot(view, tables, xs));
      view.stars = [];
      div.dataset.stars = "";
    }
    view.plot = new uPlot({
      width: width, height: 250, series: series, bands: bands, plugins: [rawPlugin(view), starsPlugin(view)],
      scales: { x: { time: false }, y: Object.assign({ distr: log ? 3 : 1 }, view.smoothed && !view.grouped ? { range: rawRange(view, log) } : {}) },
      axes: [{ label: AXES[state.x], labelSize: 18, size: 36 }, { size: 56 }],
      legend: { show: false }, focus: { alpha: 0.15 },
      cursor: { focus: { prox: 24 }, drag: { x: true, y: false, setScale: true } },
      hooks: {
        setSeries: [(u, i, opts) => { if (opts && "focus" in opts) { view.focus = i; legendHot(!i ? null : view.grouped ? view.groups[Math.floor((i - 1) / 3)].key : view.tables[i - 1].run.id); } }],
        setCursor: [(u) => hoverText(view, u)],
      },
    }, plotCols, view.plotDiv);
    div.uplot = view.plot;  // for the tests and the browser's console
    div.dataset.drawn = "1";
  }

  function legendHot(id) {
    for (const li of document.querySelectorAll("#compare-legend li")) li.classList.toggle("hot", (li.dataset.run || li.dataset.group) === id);
  }
  // The legend: a run an entry, or, grouped, a group an entry with its count of runs.
  const runLegend = $("compare-legend") ? Array.from($("compare-legend").children) : [];
  function renderLegend() {
    const legend = $("compare-legend");
    if (!legend) return;
    hidden.clear();
    if (!state.groups.length) { legend.replaceChildren(...runLegend); runLegend.forEach((li) => li.classList.remove("off")); }
    else {
      legend.replaceChildren(...Array.from(groupsOf().values()).map((g) => {
        const li = document.createElement("li"), sw = document.createElement("span");
        li.dataset.group = g.key; li.tabIndex = 0;
        sw.className = "swatch"; sw.style.background = g.color;
        li.append(sw, g.label + " (" + g.runs.length + " run" + (g.runs.length > 1 ? "s" : "") + ")");
        return li;
      }));
    }
    const count = $("legend-count");
    if (count) count.textContent = String(legend.children.length);
  }
  function setGroups(keys) {
    state.groups = keys;
    const url = new URL(window.location.href);
    if (keys.length) url.searchParams.set("group", keys.join(",")); else url.searchParams.delete("group");
    window.history.replaceState(null, "", url);  // the grouping is kept in the address, for a reload or a link
    showGroupKeys();
    renderLegend();
    return drawGrid();
  }
  // The keys grouped by, each a button that takes it away; the select then offers the others.
  function showGroupKeys() {
    const box = $("cmp-group-keys"), select = $("cmp-group");
    if (!box || !select) return;
    box.replaceChildren(...state.groups.map((k) => {
      const b = document.createElement("button");
      b.type = "button"; b.className = "group-key"; b.dataset.key = k; b.title = "stop grouping by " + k;
      b.textContent = k + " ×";
      return b;
    }));
    select.value = "";
    select.options[0].textContent = state.groups.length ? "+ and by…" : "— each run —";
    for (const o of select.options) if (o.value) o.disabled = state.groups.includes(o.value);
  }
  function toggleGroup(key) {
    if (hidden.has(key)) hidden.delete(key); else hidden.add(key);
    for (const li of document.querySelectorAll("#compare-legend li")) li.classList.toggle("off", hidden.has(li.dataset.group));
    const count = $("legend-count");
    if (count) count.textContent = String($("compare-legend").children.length - hidden.size);
    return drawGrid();
  }
  // The legend filters: a click hides a run's lines (and its star) in every chart, another shows them.
  function toggleRun(runId) {
    if (hidden.has(runId)) hidden.delete(runId); else hidden.add(runId);
    for (const li of document.querySelectorAll("#compare-legend li")) li.classList.toggle("off", hidden.has(li.dataset.run));
    for (const view of views) {
      if (!view.plot) continue;
      const k = view.tables.findIndex((t) => t.run.id === runId);
      if (k >= 0) view.plot.setSeries(k + 1, { show: !hidden.has(runId) });
    }
    const count = $("legend-count");
    if (count) count.textContent = String(data.runs.length - hidden.size);
  }
  function showError(e) { $("chart-note").textContent = "charts could not load: " + e.message; }
  function drawGrid() {
    return Promise.all(views.map((view) => drawMetric(view).catch(showError)));
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
      yaxis: { title: { text: esc(metric) }, type: state.log && pageLog(metric) ? "log" : "linear" } }).then(() => {
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

  // ---- the page's settings kept in its address, so a reload or a shared link shows the same page:
  // x axis, smoothing, log scale (the page's and each chart's own), hidden runs or groups, group by,
  // and the metric, value and hparam of "Hyper-parameters -> metric". Written on every change. ----
  const SELECTS = { metric: "cmp-metric", value: "cmp-value", scatter: "cmp-hparam" };
  function readSettings() {
    if (AXES[params.get("x")]) state.x = params.get("x");
    const smoothing = Number(params.get("smoothing"));
    if (smoothing > 0 && smoothing < 1) state.smoothing = smoothing;
    state.log = params.get("log") === "1";
    const view = (metric) => views.find((v) => v.metric === metric);
    for (const m of params.getAll("chart_log")) if (view(m)) view(m).log = true;
    for (const m of params.getAll("chart_linear")) if (view(m)) view(m).log = false;
    for (const pair of params.getAll("chart_smoothing")) {
      const cut = pair.lastIndexOf(":"), v = Number(pair.slice(cut + 1));
      const chart = cut > 0 && view(pair.slice(0, cut));
      if (chart && v >= 0 && v < 1) { chart.smoothing = v; chart.smoothIn.value = String(v); }
    }
    if ($("cmp-x")) $("cmp-x").value = state.x;
    if ($("cmp-smoothing")) { $("cmp-smoothing").value = String(state.smoothing); $("cmp-smoothing-value").textContent = String(state.smoothing); }
    if ($("cmp-log")) $("cmp-log").checked = state.log;
    for (const [key, id] of Object.entries(SELECTS)) {
      const box = $(id), want = params.get(key);
      if (box && want !== null && Array.from(box.options).some((o) => o.value === want)) box.value = want;
    }
    const known = new Set(Array.from(document.querySelectorAll("#compare-legend li")).map((li) => li.dataset.run || li.dataset.group));
    for (const key of params.getAll("hide")) if (known.has(key)) hidden.add(key);
    for (const li of document.querySelectorAll("#compare-legend li")) li.classList.toggle("off", hidden.has(li.dataset.run || li.dataset.group));
    if ($("legend-count")) $("legend-count").textContent = String($("compare-legend").children.length - hidden.size);
  }
  function saveSettings() {
    const url = new URL(window.location.href), p = url.searchParams;
    for (const key of ["x", "smoothing", "log", "chart_log", "chart_linear", "chart_smoothing", "hide", "group", ...Object.keys(SELECTS)]) p.delete(key);
    if (state.x !== "step") p.set("x", state.x);
    if (state.smoothing) p.set("smoothing", String(state.smoothing));
    if (state.log) p.set("log", "1");
    for (const v of views) {
      if (v.log !== null) p.append(v.log ? "chart_log" : "chart_linear", v.metric);
      if (v.smoothing !== null) p.append("chart_smoothing", v.metric + ":" + v.smoothing);
    }
    for (const key of hidden) p.append("hide", key);
    if (state.groups.length) p.set("group", state.groups.join(","));
    for (const [key, id] of Object.entries(SELECTS)) if ($(id) && $(id).selectedIndex > 0) p.set(key, $(id).value);
    window.history.replaceState(null, "", url);
  }

  function wire() {
    for (const div of document.querySelectorAll("#compare-grid .chart")) views.push(build(div));
    const on = (id, event, fn) => { if ($(id)) $(id).addEventListener(event, fn); };
    const pick = (li) => (li.dataset.group !== undefined ? toggleGroup(li.dataset.group) : toggleRun(li.dataset.run));
    on("compare-legend", "click", (e) => { const li = e.target.closest("li"); if (li) pick(li); });
    on("compare-legend", "keydown", (e) => { const li = e.target.closest("li"); if (li && (e.key === "Enter" || e.key === " ")) { e.preventDefault(); pick(li); } });
    // "group by" adds a key (one group per combination of their values); a key's button takes it away
    on("cmp-group", "change", (e) => setGroups(e.target.value ? state.groups.concat([e.target.value]) : []));
    on("cmp-group-keys", "click", (e) => {
      const b = e.target.closest("button[data-key]");
      if (b) setGroups(state.groups.filter((k) => k !== b.dataset.key));
    });
    showGroupKeys();
    if (state.groups.length) renderLegend();
    let resize = null;
    window.addEventListener("resize", () => {
      clearTimeout(resize);
      resize = setTimeout(() => { for (const v of views) if (v.plot) v.plot.setSize({ width: Math.max(200, v.plotDiv.clientWidth), height: 250 }); }, 100);
    });
    on("cmp-x", "change", (e) => { state.x = e.target.value; drawGrid(); });
    on("cmp-log", "change", (e) => { state.log = e.target.checked; drawGrid(); drawSweep(); });
    on("cmp-smoothing", "input", (e) => { state.smoothing = Number(e.target.value); $("cmp-smoothing-value").textContent = e.target.value; drawGrid(); });
    for (const id of ["cmp-metric", "cmp-value", "cmp-hparam"]) on(id, "change", drawSweep);
    readSettings();
    for (const section of ["metrics", "sweep"]) for (const event of ["change", "input", "click", "keydown"]) on(section, event, saveSettings);
  }

  wire();
  Promise.all([drawGrid(), drawSweep()]).then(() => { document.body.dataset.compareReady = "1"; });
})();

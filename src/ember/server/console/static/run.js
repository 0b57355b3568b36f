// ember run page: every metric's chart, drawn with uPlot (vendored: uPlot.iife.min.js, MIT,
// uPlot.LICENSE), a 50 kB library built for long time series. No build step.
//
// A chart's zoom is a stretch of the run's steps (view.steps), kept until a double click.
// Smoothing, log scale and the live refresh redraw it at the same x range. Another x axis shows
// the same stretch: its ends, fractional steps, are placed between the recorded points on the
// new axis; a chart without a point on that axis (no epoch) keeps its steps and zooms again
// when an axis has them. A zoomed downsampled series asks the server for its visible step range,
// finer, and keeps it on every axis. Metric names are the users' text: they are only ever set
// as textContent.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const root = $("charts");
  if (!root) return;
  const state = { x: "step", smoothing: 0, log: false, filter: "" };
  const answers = {};  // type -> the series answer of the server
  const views = {};    // chart id -> { type, name, div, plot, zoom, steps, log, smoothing, fine, key }
  let t0 = null;       // the run's first recorded time: relative time counts from it
  const AXES = { step: "step", epoch: "epoch", time: "wall time", relative: "relative time (s)" };

  // Chart ids are unique per (type, name): '-' separates them and every other character that is
  // not a letter or digit is written as _<hex>_, so 'val/ema-acc' and 'val-ema/acc' differ.
  const enc = (s) => String(s).replace(/[^A-Za-z0-9]/g, (c) => "_" + c.charCodeAt(0).toString(16) + "_");
  const chartId = (type, name) => "chart-" + enc(type) + "-" + enc(name);

  // Losses first, then the rest by name (as a reader scans a run: is it learning?).
  const rank = (name) => (/(^|[/_.-])loss($|[/_.-])/i.test(name) || name === "loss" ? 0 : /loss/i.test(name) ? 1 : 2);
  const byRank = (a, b) => rank(a) - rank(b) || (a < b ? -1 : a > b ? 1 : 0);

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

  async function getJSON(url) {
    const r = await fetch(url, { credentials: "same-origin" });  // as the page's preloads ask, to reuse them
    if (!r.ok) throw new Error((await r.json().catch(() => ({}))).detail || r.statusText);
    return r.json();
  }
  const seriesUrl = (type, range) => root.dataset.series + "?type=" + encodeURIComponent(type) +
    (range ? "&start=" + range[0] + "&end=" + range[1] : "");

  function xsOf(s) {
    if (state.x === "epoch") return s.epoch;
    if (state.x === "time") return s.time;
    if (state.x === "relative") return s.time.map((t) => (t === null || t0 === null ? null : t - t0));
    return s.step;
  }

  // The points that have an x on this axis as [from, to] pairs, where from/to are 0 for the step
  // and 1 for the x, in the order of `from` (of the step where x ties).
  function pairs(s, from) {
    const xs = xsOf(s), out = [];
    s.step.forEach((st, i) => { if (xs[i] !== null && xs[i] !== undefined) out.push([st, xs[i]]); });
    out.sort((a, b) => a[from] - b[from] || a[0] - b[0]);
    return out.map((p) => [p[from], p[1 - from]]);
  }

  // The `to` at `v` on the line between the recorded points around it; where points tie at `v`,
  // the first of them for a range's low end, the last for its high end. Clamped to the ends.
  function along(ps, v, low) {
    const n = ps.length;
    if (v < ps[0][0]) return ps[0][1];
    if (v > ps[n - 1][0]) return ps[n - 1][1];
    let i;
    if (low) { i = 0; while (ps[i][0] < v) i++; } else { i = n - 1; while (ps[i][0] > v) i--; }
    if (ps[i][0] === v) return ps[i][1];
    const [a, b] = low ? [ps[i - 1], ps[i]] : [ps[i], ps[i + 1]];
    return a[1] + (v - a[0]) / (b[0] - a[0]) * (b[1] - a[1]);
  }

  // A zoom's x range on this axis -> the stretch of steps it shows (fractional steps).
  function toSteps(s, range) {
    if (state.x === "step") return range.slice();
    const ps = pairs(s, 1);
    return ps.length ? [along(ps, range[0], true), along(ps, range[1], false)] : null;
  }

  // A stretch of steps -> its x range on this axis; null where the chart has no point on it or
  // the stretch has no width there (every point in it at one epoch).
  function toX(s, steps) {
    if (state.x === "step") return steps.slice();
    const ps = pairs(s, 0);
    if (!ps.length) return null;
    const lo = along(ps, steps[0], true), hi = along(ps, steps[1], false);
    return hi > lo ? [lo, hi] : null;
  }

  // The page's log scale puts a minimised metric (a loss) on a log axis, never a maximised one (an
  // accuracy, whose best is its maximum): that takes the chart's own log box. Modes come from the server.
  const modes = JSON.parse(root.dataset.modes || "{}");
  const pageLog = (view) => modes[view.type + "/" + view.name] === "min";

  // [x, value, smoothed?] columns for uPlot, sorted by x, without the points that have no x.
  function columns(view, s) {
    const xs = xsOf(s), log = view.log === null ? state.log && pageLog(view) : view.log;
    const smoothing = view.smoothing === null ? state.smoothing : view.smoothing;
    const idx = [];
    for (let i = 0; i < xs.length; i++) if (xs[i] !== null && xs[i] !== undefined) idx.push(i);
    idx.sort((a, b) => xs[a] - xs[b]);
    const x = idx.map((i) => xs[i]);
    const y = idx.map((i) => { const v = s.value[i]; return v === null || (log && v <= 0) ? null : v; });
    const cols = [x, y];
    if (smoothing) cols.push(ema(y, smoothing));
    const marks = [];  // NaN / inf: where they are on this axis
    const at = {};
    s.step.forEach((st, i) => { at[st] = i; });
    for (const [st, what] of s.nonfinite || []) {
      const i = at[st];
      if (i !== undefined && xs[i] !== null) marks.push([xs[i], what]);
    }
    return { cols, marks, smoothing, log };
  }

  function nonfinitePlugin(view) {
    return { hooks: { draw: (u) => {
      const marks = view.marks || [];
      if (!marks.length) return;
      const ctx = u.ctx, top = u.bbox.top, bottom = u.bbox.top + u.bbox.height;
      ctx.save();
      ctx.strokeStyle = "#d92d20"; ctx.fillStyle = "#d92d20"; ctx.lineWidth = 1.5 * devicePixelRatio;
      ctx.setLineDash([4 * devicePixelRatio, 3 * devicePixelRatio]);
      ctx.font = (10 * devicePixelRatio) + "px system-ui, sans-serif";
      marks.forEach(([x, what], k) => {
        const px = u.valToPos(x, "x", true);
        if (px < u.bbox.left || px > u.bbox.left + u.bbox.width) return;
        ctx.beginPath(); ctx.moveTo(px, top); ctx.lineTo(px, bottom); ctx.stroke();
        // labels of neighbouring marks on alternate rows, so that they do not overlap
        const label = what === "NaN" ? "NaN" : what === "Infinity" ? "+inf" : "-inf";
        ctx.fillText(label, px + 3, top + (12 + 12 * (k % 2)) * devicePixelRatio);
      });
      ctx.restore();
    } } };
  }

  function options(view, shape, width) {
    const time = state.x === "time";
    // wall time hovers to the second (uPlot's default stops at the minute)
    const x = time ? { label: AXES[state.x], value: "{YYYY}-{MM}-{DD} {HH}:{mm}:{ss}" } : { label: AXES[state.x] };
    const series = [x, { label: "value", stroke: "#1f5fbf", width: 1.5,
      alpha: shape.smoothing ? 0.3 : 1, points: { show: shape.cols[0].length < 60, size: 5 } }];
    if (shape.smoothing) series.push({ label: "smoothed", stroke: "#1f5fbf", width: 2 });
    return {
      width: width, height: 250, series: series, plugins: [nonfinitePlugin(view)],
      scales: { x: { time: time }, y: { distr: shape.log ? 3 : 1 } },
      axes: [{ label: AXES[state.x], labelSize: 18, size: 36 }, { size: 56 }],
      legend: { live: true },
      cursor: { drag: { x: true, y: false, setScale: true } },
      hooks: { setScale: [(u, key) => { if (key === "x") zoomed(view, u); }] },
    };
  }

  function zoomed(view, u) {
    if (view.quiet) return;
    const min = u.scales.x.min, max = u.scales.x.max, xs = u.data[0];
    if (!xs.length || (min <= xs[0] && max >= xs[xs.length - 1])) {  // a double click: the whole series
      view.zoom = null; view.steps = null;
      if (view.fine) { view.fine = null; setTimeout(() => draw(view), 0); }
      view.div.dataset.zoom = "";
      return;
    }
    // uPlot may call this after draw() ends, for the zoom draw() set: its steps stay as they are
    // (read back through wall time they would come back off by float rounding).
    if (view.zoom && min === view.zoom[0] && max === view.zoom[1]) return;
    view.zoom = [min, max];
    view.steps = toSteps(view.fine ? view.fine.s : answers[view.type].metrics[view.name], view.zoom);
    view.div.dataset.zoom = view.zoom.join(",");
    clearTimeout(view.timer);
    view.timer = setTimeout(() => refine(view).catch(showError), 150);
  }

  // A zoomed downsampled series: ask for the visible steps (the step range of the x range).
  async function refine(view) {
    const s = view.fine ? view.fine.s : answers[view.type].metrics[view.name];  // what is shown
    if (!s || !s.downsampled || !view.zoom) return;
    const xs = xsOf(s);
    let lo = null, hi = null;
    xs.forEach((x, i) => {
      if (x === null) return;
      if (x <= view.zoom[0]) lo = s.step[i];
      if (hi === null && x >= view.zoom[1]) hi = s.step[i];
    });
    const range = [lo === null ? s.step[0] : lo, hi === null ? s.step[s.step.length - 1] : hi];
    if (view.fine && view.fine.range[0] === range[0] && view.fine.range[1] === range[1]) return;
    const answer = await getJSON(seriesUrl(view.type, range));
    const fine = answer.metrics[view.name];
    if (!fine || !view.zoom) return;
    view.fine = { range: range, s: fine };
    draw(view);
  }

  function build(view) {
    const div = document.createElement("div");
    div.className = "chart"; div.id = view.id; div.dataset.metric = view.type + "/" + view.name;
    const head = document.createElement("div"); head.className = "chart-head";
    const title = document.createElement("span"); title.className = "chart-title"; title.textContent = view.type + "/" + view.name;
    const log = document.createElement("label"); log.className = "small";
    const logBox = document.createElement("input"); logBox.type = "checkbox"; logBox.className = "chart-log";
    log.append(logBox, " log");
    const smooth = document.createElement("label"); smooth.className = "small";
    const smoothIn = document.createElement("input"); smoothIn.type = "number"; smoothIn.className = "chart-smoothing";
    smoothIn.min = "0"; smoothIn.max = "0.99"; smoothIn.step = "0.1"; smoothIn.placeholder = "page";
    smooth.append("smoothing ", smoothIn);
    const note = document.createElement("span"); note.className = "chart-note small";
    head.append(title, log, smooth, note);
    const plot = document.createElement("div"); plot.className = "chart-plot";
    const empty = document.createElement("p"); empty.className = "chart-empty muted"; empty.hidden = true;
    div.append(head, plot, empty);
    logBox.addEventListener("change", () => { view.log = logBox.checked; draw(view, true); });
    smoothIn.addEventListener("input", () => {
      view.smoothing = smoothIn.value === "" ? null : Math.min(0.99, Math.max(0, Number(smoothIn.value)));
      draw(view, true);
    });
    view.div = div; view.plotDiv = plot; view.empty = empty; view.note = note; view.logBox = logBox;
    return div;
  }

  function draw(view, rebuild) {
    const coarse = answers[view.type].metrics[view.name];
    const s = view.fine ? view.fine.s : coarse;
    const shape = columns(view, s);
    const div = view.div;
    view.marks = shape.marks;
    div.dataset.points = String(s.value.length); div.dataset.count = String(coarse.count);
    div.dataset.nonfinite = String((s.nonfinite || []).length);
    div.dataset.fine = view.fine ? "1" : "";
    view.logBox.checked = shape.log;
    const nf = s.nonfinite || [];
    view.note.textContent = nf.length ? nf.length + " NaN/inf point" + (nf.length > 1 ? "s" : "") + " (first at step " + nf[0][0] + ")" : "";
    if (!shape.cols[0].length) {
      if (view.plot) { view.plot.destroy(); view.plot = null; }
      view.empty.hidden = false;
      view.empty.textContent = state.x === "epoch" ? "No epoch recorded for this metric: choose step or time."
        : "No point of this metric has a value on this axis.";
      div.dataset.drawn = "1";
      return;
    }
    view.empty.hidden = true;
    const key = state.x + "|" + shape.log + "|" + shape.cols.length;
    const width = Math.max(200, view.plotDiv.clientWidth || div.clientWidth || 400);
    view.quiet = true;
    if (!view.plot || rebuild || view.key !== key) {
      if (view.plot) view.plot.destroy();
      view.plot = new uPlot(options(view, shape, width), shape.cols, view.plotDiv);
      div.uplot = view.plot;  // for the tests and the browser's console
      view.key = key;
    } else {
      view.plot.setData(shape.cols, !view.zoom);
    }
    if (view.zoom) view.plot.setScale("x", { min: view.zoom[0], max: view.zoom[1] });
    view.quiet = false;
    div.dataset.zoom = view.zoom ? view.zoom.join(",") : "";
    div.dataset.drawn = "1";
  }

  function section(type) {
    let grid = root.querySelector('.chart-grid[data-type="' + CSS.escape(type) + '"]');
    if (grid) return grid;
    // A metric type that appeared while the run is live: its heading, downloads and grid.
    const h3 = document.createElement("h3"); h3.className = "chart-type"; h3.dataset.type = type; h3.textContent = type + " ";
    const links = document.createElement("span"); links.className = "small";
    for (const fmt of ["csv", "json"]) {
      const a = document.createElement("a");
      a.href = root.dataset.downloads + "." + fmt + "?type=" + encodeURIComponent(type); a.download = "";
      a.textContent = fmt.toUpperCase(); links.append(a, " ");
    }
    h3.append(links);
    grid = document.createElement("div"); grid.className = "chart-grid"; grid.dataset.type = type;
    root.append(h3, grid);
    return grid;
  }

  function render() {
    for (const type of Object.keys(answers)) {
      const grid = section(type);
      for (const name of Object.keys(answers[type].metrics).sort(byRank)) {
        const id = chartId(type, name);
        let view = views[id];
        if (!view) {
          view = views[id] = { id: id, type: type, name: name, zoom: null, steps: null, log: null, smoothing: null, fine: null };
          grid.append(build(view));
        }
        draw(view);
      }
    }
    applyFilter();
    const notes = [];
    for (const view of Object.values(views)) {
      const s = answers[view.type].metrics[view.name];
      if (s && s.downsampled) notes.push(view.type + "/" + view.name + ": " + s.count.toLocaleString() +
        " points shown as the min and max of " + Math.round(s.value.length / 2) + " step ranges; zoom in for every point");
    }
    $("chart-note").textContent = notes.join(" · ");
  }

  function applyFilter() {
    const words = state.filter.toLowerCase().split(/\s+/).filter(Boolean);
    let shown = 0;
    for (const view of Object.values(views)) {
      const label = (view.type + "/" + view.name).toLowerCase();
      const on = words.every((w) => label.includes(w));
      view.div.hidden = !on; shown += on;
    }
    for (const grid of root.querySelectorAll(".chart-grid")) {
      const any = Array.from(grid.children).some((c) => !c.hidden);
      grid.hidden = !any;
      const h3 = grid.previousElementSibling;
      if (h3) h3.hidden = !any;
    }
    const none = $("filter-none");
    if (none) none.hidden = shown > 0 || !words.length;
  }

  // Every type at once (in parallel); then the charts.
  async function load() {
    const types = JSON.parse(root.dataset.types);
    for (const h3 of root.querySelectorAll("h3[data-type]")) if (!types.includes(h3.dataset.type)) types.push(h3.dataset.type);
    const got = await Promise.all(types.map((t) => getJSON(seriesUrl(t))));
    let status = null;
    got.forEach((data, i) => { answers[types[i]] = data; status = data.status; });
    for (const data of got) for (const s of Object.values(data.metrics))
      for (const t of s.time || []) if (t !== null && (t0 === null || t < t0)) t0 = t;
    render();
    return status;
  }

  // While the run is live: new types from the run's metric list, new output lines.
  async function refresh() {
    const info = await getJSON(root.dataset.liveUrl);
    const types = JSON.parse(root.dataset.types);
    for (const t of info.types) if (!types.includes(t)) types.push(t);
    root.dataset.types = JSON.stringify(types);
    const status = await load();
    const log = $("log-lines");
    if (log && log.dataset.tail === "1") {
      log.textContent = info.lines.length ? info.lines.join("\n") + "\n" : "(empty)";
      $("log-count").textContent = "(" + info.total_lines.toLocaleString("en-US") + " lines, last " + info.lines.length + ")";
    }
    return status;
  }

  function wire() {
    $("x-axis").addEventListener("change", (e) => {
      state.x = e.target.value;
      for (const view of Object.values(views)) {  // the same steps on the new axis (finer data covers them still)
        view.zoom = view.steps && toX(view.fine ? view.fine.s : answers[view.type].metrics[view.name], view.steps);
      }
      render();
    });
    $("log-scale").addEventListener("change", (e) => { state.log = e.target.checked; render(); });
    $("smoothing").addEventListener("input", (e) => {
      state.smoothing = Number(e.target.value); $("smoothing-value").textContent = e.target.value; render();
    });
    $("metric-filter").addEventListener("input", (e) => { state.filter = e.target.value; applyFilter(); });
    let resize = null;
    window.addEventListener("resize", () => {
      clearTimeout(resize);
      resize = setTimeout(() => { for (const v of Object.values(views)) if (v.plot) v.plot.setSize({ width: Math.max(200, v.plotDiv.clientWidth), height: 250 }); }, 100);
    });
  }
  function showError(e) { $("chart-note").textContent = "charts could not load: " + e.message; }

  wire();
  load().then(() => {
    if (root.dataset.live !== "1") return;
    const timer = setInterval(async () => {
      try {
        const now = await refresh();
        $("run-status").textContent = now;
        if (now !== "Running") { clearInterval(timer); const live = $("live"); if (live) live.textContent = "finished"; }
      } catch (e) { showError(e); }
    }, Number(root.dataset.every || 5000));
  }).catch(showError);
})();

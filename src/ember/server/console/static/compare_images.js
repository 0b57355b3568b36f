// ember console: the compare page's images. For each image name the runs logged, one step slider over
// every step any of them has, and each run's image at that step (or its last one before it), side by
// side in the run's colour. A click opens the lightbox (images.js) at full resolution.
"use strict";
(function () {
  const section = document.getElementById("compare-images");
  const dataNode = document.getElementById("compare-data");
  if (!section || !dataNode) return;
  const runs = JSON.parse(dataNode.textContent).runs;
  const names = document.getElementById("cmp-image-names");
  const encodeName = (name) => name.split("/").map(encodeURIComponent).join("/");
  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;  // names are the user's text: never innerHTML
    return node;
  }
  const urlOf = (runId, name) => (item) => section.dataset.runsUrl + "/" + runId + "/images/" + item.step + "/" + encodeName(name);

  // the last item at or before step (items sorted by step), or null
  function atOrBefore(items, step) {
    let found = null;
    for (const item of items) { if (item.step <= step) found = item; else break; }
    return found;
  }

  function row(name, byRun) {
    const steps = [...new Set([].concat(...[...byRun.values()].map((items) => items.map((i) => i.step))))].sort((a, b) => a - b);
    const box = el("div", { class: "cmp-image-name", "data-name": name });
    const slider = el("input", { type: "range", min: "0", max: String(steps.length - 1), step: "1", value: String(steps.length - 1),
      class: "cmp-image-step", "aria-label": name + " step" });
    slider.disabled = steps.length < 2;
    const value = el("output", { class: "small cmp-image-step-value" });
    const head = el("h3", {}, name);
    const controls = el("div", { class: "small" });
    controls.append("step ", slider, " ", value);
    const cells = el("div", { class: "cmp-image-row" });
    box.append(head, controls, cells);
    for (const r of runs) {
      const items = byRun.get(r.id);
      if (!items) continue;
      const cell = el("figure", { class: "cmp-image-cell", "data-run": r.id });
      const caption = el("figcaption", { class: "small" });
      const swatch = el("span", { class: "swatch" });
      swatch.style.background = r.color;
      caption.append(swatch, r.name, el("span", { class: "muted cmp-image-at" }));
      const img = el("img", { class: "cmp-image", alt: name + " of " + r.name });
      img.addEventListener("click", () => {
        const shown = items.findIndex((i) => String(i.step) === img.dataset.step);
        window.emberLightbox(name + " · " + r.name, items, urlOf(r.id, name), Math.max(0, shown));
      });
      cell.append(caption, img);
      cells.append(cell);
    }
    function show() {
      const step = steps[Number(slider.value)];
      value.textContent = String(step);
      for (const cell of cells.children) {
        const items = byRun.get(cell.dataset.run), item = atOrBefore(items, step), img = cell.querySelector("img");
        img.hidden = !item;
        cell.querySelector(".cmp-image-at").textContent = item ? " step " + item.step : " no image by step " + step;
        if (!item) continue;
        const url = urlOf(cell.dataset.run, name)(item);
        if (img.getAttribute("src") !== url) img.setAttribute("src", url);
        img.width = item.width; img.height = item.height;
        img.dataset.step = String(item.step);
      }
    }
    slider.addEventListener("input", show);
    show();
    return box;
  }

  async function load() {
    const query = runs.map((r) => "ids=" + encodeURIComponent(r.id)).join("&");
    const answer = await fetch(section.dataset.list + "?" + query, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!answer.ok) throw new Error(answer.statusText);
    const byName = new Map();  // name -> Map(run id -> items)
    for (const [runId, items] of Object.entries((await answer.json()).runs)) {
      for (const item of items) {
        if (!byName.has(item.name)) byName.set(item.name, new Map());
        const byRun = byName.get(item.name);
        if (!byRun.has(runId)) byRun.set(runId, []);
        byRun.get(runId).push(item);
      }
    }
    if (!byName.size) return;
    section.hidden = false;
    for (const [name, byRun] of [...byName].sort((a, b) => (a[0] < b[0] ? -1 : 1))) names.append(row(name, byRun));
    section.dataset.ready = "1";
  }
  load().catch((e) => { document.getElementById("cmp-images-note").textContent = "images could not load: " + e.message; });
})();

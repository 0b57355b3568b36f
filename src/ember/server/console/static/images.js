// ember console: the run page's images (run.log_image), one panel per name with a step slider.
// The list comes from /ui/runs/<id>/images; each PNG from /ui/runs/<id>/images/<step>/<name>.
// Any image opens in a lightbox at full resolution with its own step slider (window.emberLightbox, which
// the compare page's images use too).
"use strict";
(function () {
  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;  // names are the user's text: never innerHTML
    return node;
  }
  const encodeName = (name) => name.split("/").map(encodeURIComponent).join("/");

  // The lightbox: one <dialog>, the image at its own size (scrolls when larger than the window).
  // items: [{step, width, height}] of one name; url(item): its PNG; at: the index shown first.
  function lightbox(title, items, url, at) {
    let box = document.getElementById("lightbox");
    if (!box) {
      box = el("dialog", { id: "lightbox", "aria-label": "image at full resolution" });
      const head = el("div", { class: "lightbox-head" });
      head.append(el("strong", { class: "lightbox-title" }), el("label", { class: "small" }, " step "),
        el("input", { type: "range", min: "0", step: "1", class: "lightbox-step", "aria-label": "step" }),
        el("output", { class: "lightbox-step-value small" }), el("button", { type: "button", class: "lightbox-close" }, "Close"));
      const frame = el("div", { class: "lightbox-frame" });
      frame.append(el("img", { class: "lightbox-image", alt: "" }));
      box.append(head, frame);
      document.body.append(box);
      box.querySelector(".lightbox-close").addEventListener("click", () => box.close());
      box.addEventListener("click", (e) => { if (e.target === box) box.close(); });  // the backdrop
      box.querySelector(".lightbox-step").addEventListener("input", () => showFull(box));
    }
    box._items = items; box._url = url;
    box.querySelector(".lightbox-title").textContent = title;
    const slider = box.querySelector(".lightbox-step");
    slider.max = String(items.length - 1);
    slider.value = String(at);
    slider.disabled = items.length < 2;
    showFull(box);
    if (!box.open) box.showModal();
  }
  function showFull(box) {
    const item = box._items[Number(box.querySelector(".lightbox-step").value)];
    const img = box.querySelector(".lightbox-image");
    img.setAttribute("src", box._url(item));
    img.width = item.width; img.height = item.height;  // its own pixels, not scaled to fit
    img.dataset.step = String(item.step);
    box.querySelector(".lightbox-step-value").textContent = item.step + " (" + item.width + "×" + item.height + ")";
  }
  window.emberLightbox = lightbox;

  const section = document.getElementById("images");
  if (!section) return;
  const panels = document.getElementById("image-panels");

  function panel(name, items, known) {
    let box = known.get(name);
    if (!box) {
      box = el("div", { class: "image-panel", "data-name": name });
      const title = el("h3", {}, name);
      const slider = el("input", { type: "range", min: "0", step: "1", class: "image-step", "aria-label": name + " step" });
      const label = el("output", { class: "image-step-value small" });
      const img = el("img", { class: "image-view", alt: name });
      box.append(title, el("label", { class: "small" }, "step "), slider, label, el("div", { class: "image-frame" }));
      box.querySelector(".image-frame").appendChild(img);
      slider.addEventListener("input", () => show(box));
      img.addEventListener("click", () => lightbox(name, box._items, (item) => section.dataset.list + "/" + item.step + "/" + encodeName(name),
        Number(slider.value)));
      panels.appendChild(box);
      known.set(name, box);
    }
    const slider = box.querySelector(".image-step");
    const atEnd = slider.value === "" || Number(slider.value) === Number(slider.max);
    box._items = items;
    slider.max = String(items.length - 1);
    if (atEnd) slider.value = String(items.length - 1);  // a live run follows its newest image
    slider.disabled = items.length < 2;
    show(box);
  }

  function show(box) {
    const item = box._items[Number(box.querySelector(".image-step").value)];
    const img = box.querySelector(".image-view");
    const url = section.dataset.list + "/" + item.step + "/" + encodeName(box.dataset.name);
    if (img.getAttribute("src") !== url) img.setAttribute("src", url);
    img.width = item.width; img.height = item.height;
    img.dataset.step = String(item.step);
    box.querySelector(".image-step-value").textContent = item.step + " (" + item.width + "×" + item.height + ")";
  }

  const known = new Map();
  async function load() {
    const r = await fetch(section.dataset.list, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!r.ok) throw new Error(r.statusText);
    const byName = new Map();
    for (const item of (await r.json()).images) {
      if (!byName.has(item.name)) byName.set(item.name, []);
      byName.get(item.name).push(item);
    }
    if (!byName.size) return 0;
    section.hidden = false;
    for (const [name, items] of byName) panel(name, items, known);
    return byName.size;
  }
  function failed(e) { document.getElementById("images-note").textContent = "images could not load: " + e.message; }
  load().catch(failed);
  const charts = document.getElementById("charts");
  if (charts && charts.dataset.live === "1") {  // a running run: new images appear without a reload
    const timer = setInterval(() => {
      const status = document.getElementById("run-status");
      if (status && status.textContent.trim() !== "Running") clearInterval(timer);
      load().catch(failed);
    }, 5000);
  }
})();

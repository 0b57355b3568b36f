// ember console: the runs table's column chooser (folder and runs pages) and its filter box. The run page's charts
// are run.js (uPlot), the compare page's compare.js (plotly.js, vendored). No build step.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);

  // The column chooser, remembered per folder in this browser.
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

  // A filter the server could not read: the cursor where it stopped (the message names the column).
  function filterError() {
    const box = document.querySelector("#filters input[name=where][data-error-column]");
    if (!box) return;
    const at = Math.min(Number(box.dataset.errorColumn) - 1, box.value.length);
    box.focus();
    box.setSelectionRange(at, at);
  }

  // "Compare selected" with nothing ticked says so beside the button instead of opening an empty comparison.
  function compareGuard() {
    const button = $("compare"), note = $("compare-none");
    if (!button || !note) return;
    const form = button.form, ticked = () => form.querySelector("input[name=ids]:checked") !== null;
    form.addEventListener("submit", (e) => {
      if (ticked()) return;
      e.preventDefault();
      note.hidden = false;
    });
    form.addEventListener("change", () => { if (ticked()) note.hidden = true; });
  }

  // Labels and the trash for the runs ticked in the table: one POST form (with the CSRF token) per click.
  function bulkEdit() {
    const bar = $("bulk");
    if (!bar) return;
    for (const button of bar.querySelectorAll("[data-bulk]")) {
      button.addEventListener("click", () => {
        const ids = [...document.querySelectorAll("#runs-table input[name=ids]:checked")].map((b) => b.value);
        const label = $("bulk-label").value.trim();
        let note = $("bulk-note");
        if (!note) { note = document.createElement("span"); note.id = "bulk-note"; note.className = "error small"; bar.append(note); }
        note.textContent = !ids.length ? "Tick the runs first." : button.dataset.bulk !== "trash" && !label ? "Type the label first." : "";
        if (note.textContent) return;
        const form = document.createElement("form");
        form.method = "post";
        form.action = bar.dataset.action;
        const fields = [["csrf", bar.dataset.csrf], ["action", button.dataset.bulk], ["label", label],
          ["back", location.pathname + location.search], ...ids.map((id) => ["ids", id])];
        for (const [name, value] of fields) {
          const input = document.createElement("input");
          input.type = "hidden"; input.name = name; input.value = value;
          form.append(input);
        }
        document.body.append(form);
        form.submit();
      });
    }
  }

  // A grouped runs table (?group=a,b): a click on a group's row shows or hides its runs.
  function runGroups() {
    const table = $("runs-table");
    if (!table) return;
    table.addEventListener("click", (e) => {
      const button = e.target.closest("button.group-toggle");
      if (!button) return;
      const open = button.getAttribute("aria-expanded") !== "true";
      button.setAttribute("aria-expanded", String(open));
      button.textContent = (open ? "▾ " : "▸ ") + button.textContent.slice(2);
      for (const row of table.querySelectorAll("tr[data-member-of='" + button.dataset.group + "']")) row.hidden = !open;
    });
  }

  columnChooser();
  filterError();
  compareGuard();
  bulkEdit();
  runGroups();
})();

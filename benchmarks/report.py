"""Results files: the JSON record, the markdown table, the PNG chart, and the targets of issue 6."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

Json = dict[str, Any]


# -- targets ----------------------------------------------------------------------------------
def _find(cases: Mapping[str, Any], case: str, group_prefix: str, contender: str) -> Json | None:
    for group in cases.get(case, {}).get("groups", []):
        if group["name"].startswith(group_prefix):
            for c in group["contenders"]:
                if c["name"] == contender and c["status"] == "ok":
                    return c
    return None


def _median(c: Json | None, key: str) -> float | None:
    if c is None:
        return None
    if key in ("cpu_s", "wall_s"):
        return float(c["summary"][key]["median"])
    if key.startswith("ratio"):
        return float(c["summary"][key])
    extra = c["summary"]["extra"].get(key)
    return None if extra is None else float(extra["median"])


def _target(name: str, limit: str, value: float | None, ok: bool | None, shown: str) -> Json:
    status = "not measured" if value is None or ok is None else ("met" if ok else "missed")
    return {"target": name, "limit": limit, "measured": shown if value is not None else "-", "status": status}


def evaluate_targets(cases: Mapping[str, Any]) -> list[Json]:
    """Each target of issue 6, with the measured value and met / missed / not measured."""
    out: list[Json] = []
    for model, prefix, limit in (("tiny MLP", "tiny MLP", 1.02), ("CNN", "small CNN", 1.01)):
        r = _median(_find(cases, "step", prefix, "ember Trainer, default hooks"), "ratio_cpu")
        out.append(_target(f"Trainer, default hooks vs hand loop, {model} (CPU time)", f"<= {limit}x", r,
                           None if r is None else r <= limit, f"{r:.3f}x" if r else ""))  # fmt: skip
    rate = _median(_find(cases, "tracking", "logging", "ember Run.log"), "enqueue_values_per_s")
    out.append(_target("Run.log values/s enqueued", ">= 500,000/s", rate, None if rate is None else rate >= 5e5,
                       f"{rate:,.0f}/s" if rate else ""))  # fmt: skip
    r = _median(_find(cases, "tracking", "tiny MLP Trainer", "ember Trainer, default hooks + TrackingHook every step"),
                "ratio_cpu")  # fmt: skip
    out.append(_target("tracked Trainer vs untracked (CPU time)", "<= 1.03x", r, None if r is None else r <= 1.03,
                       f"{r:.3f}x" if r else ""))  # fmt: skip
    ember_mbs = _median(_find(cases, "checkpoint", "save", "ember checkpoint.save"), "MB_per_s")
    # The target is against torch.save, which stops at the page cache; the second line
    # (not an issue target) compares with a save as durable as ember's atomic, fsynced one.
    for baseline, label in (("torch.save", "torch.save"),
                            ("torch.save + fsync", "torch.save + fsync (same durability; context)")):  # fmt: skip
        base_mbs = _median(_find(cases, "checkpoint", "save", baseline), "MB_per_s")
        ratio = ember_mbs / base_mbs if ember_mbs and base_mbs else None
        out.append(_target(f"checkpoint save throughput vs {label}", ">= 0.9x", ratio,
                           None if ratio is None else ratio >= 0.9,
                           f"{ratio:.2f}x ({ember_mbs:,.0f} vs {base_mbs:,.0f} MB/s)" if ratio else ""))  # fmt: skip
    sync = _median(_find(cases, "checkpoint", "training stall", "CheckpointHook (sync)"), "stall_ms_per_save")
    opt_in = "async_save with background_copy=True: stall vs a sync save (opt-in; context)"
    for contender, label in (("CheckpointHook (async_save)", "async_save stall vs a sync save"),
                             ("CheckpointHook (async_save, background_copy)", opt_in)):  # fmt: skip
        asyn = _median(_find(cases, "checkpoint", "training stall", contender), "stall_ms_per_save")
        frac = asyn / sync if asyn is not None and sync else None
        out.append(_target(label, "<= 10%", frac, None if frac is None else frac <= 0.10,
                           f"{frac:.0%} ({asyn:.0f} vs {sync:.0f} ms per save)" if frac is not None else ""))  # type: ignore[str-format]  # fmt: skip
    for label in ("ember Trainer, no hooks", "ember Trainer, default hooks"):
        r = _median(_find(cases, "ddp", "DDP", label), "ratio_wall")
        out.append(_target(f"DDP {label.removeprefix('ember ')} vs hand DDP loop (ms/step)", "<= 1.02x", r,
                           None if r is None else r <= 1.02, f"{r:.3f}x" if r else ""))  # fmt: skip
    added = _median(_find(cases, "import", "import", "import ember after torch (timed in-process)"), "import_ms")
    shown = f"{added:.0f} ms" if added is not None else ""
    out.append(_target("`import ember` added to `import torch` (wall)", "<= 150 ms", added,
                       None if added is None else added <= 150, shown))  # fmt: skip
    helps = _median(_find(cases, "import", "import", "ember --help"), "wall_s")
    out.append(_target("`ember --help` (wall)", "<= 1 s", helps, None if helps is None else helps <= 1.0,
                       f"{helps * 1e3:.0f} ms" if helps is not None else ""))  # fmt: skip
    return out


# -- markdown ---------------------------------------------------------------------------------
_EXTRA_FORMATS = {
    "us_per_step_cpu": ("µs/step (CPU)", "{:,.0f}"),
    "enqueue_values_per_s": ("values/s enqueued", "{:,.0f}"),
    "values_per_s": ("values/s until durable", "{:,.0f}"),
    "durable_s": ("s until durable", "{:.3f}"),
    "MB_per_s": ("MB/s", "{:,.0f}"),
    "ms_per_step": ("ms/step", "{:.2f}"),
    "tokens_per_s": ("tokens/s", "{:,.0f}"),
    "mfu": ("MFU", "{:.1%}"),
    "saves": ("saves", "{:.0f}"),
    "stall_ms_per_save": ("ms stalled per save", "{:.0f}"),
    "drain_ms": ("ms drain at fit end", "{:.0f}"),
    "import_ms": ("ms for the import alone (in-process)", "{:.0f}"),
}


def _fmt_spread(s: Mapping[str, float]) -> str:
    return f"{s['median']:.3f} ({s['min']:.3f}–{s['max']:.3f})"


def _extras(c: Json) -> str:
    parts = []
    for key, (label, fmt) in _EXTRA_FORMATS.items():
        e = c["summary"].get("extra", {}).get(key)
        if e is not None and not math.isinf(e["median"]):
            parts.append(f"{fmt.format(e['median'])} {label}")
    return "; ".join(parts)


def group_table(group: Mapping[str, Any]) -> str:
    """One group as a markdown table."""
    per = " (per unit of work)" if any(c["summary"].get("ratio_cpu") for c in group["contenders"]) else ""
    lines = [
        f"#### {group['name']}",
        "",
        f"Baseline: {group['baseline']}; work check: {group['unit']}, tolerance {group['rel_tol']:g} (relative).",
        "",
        f"| contender | CPU s, median (min–max) | wall s, median (min–max) | CPU ratio{per} | wall ratio "
        f"| paired CPU ratio (min–max) | {group['unit']} | other |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in group["contenders"]:
        s = c["summary"]
        if not s:
            lines.append(f"| {c['name']} | {c['status']}: {c['note']} | | | | | | |")
            continue
        paired = s.get("ratio_cpu_paired")
        paired_text = f"{paired['median']:.3f} ({paired['min']:.3f}–{paired['max']:.3f})" if paired else ""
        flag = "" if c["status"] == "ok" else f" **{c['status']}**: {c['note']}"
        lines.append(
            f"| {c['name']}{flag} | {_fmt_spread(s['cpu_s'])} | {_fmt_spread(s['wall_s'])} "
            f"| {_ratio(s.get('ratio_cpu'))} | {_ratio(s.get('ratio_wall'))} "
            f"| {paired_text} "
            f"| {s['work']:.6g} | {_extras(c)} |"
        )
    return "\n".join(lines)


def _ratio(r: float | None) -> str:
    return "" if r is None else f"{r:.3f}x" if r < 100 else f"{r:,.0f}x"


def markdown(record: Mapping[str, Any]) -> str:
    """The whole record as markdown: machine, command, targets, then every group's table."""
    m = record["machine"]
    lines = [
        f"### ember benchmarks, {record['date']} on {m['host']}",
        "",
        f"- machine: {m['cpus']} CPUs ({m['cpu_model']}), {m['platform']}, Python {m['python']}, torch {m['torch']}",
        f"- command: `{record['command']}` ({record['rounds']} rounds, contenders interleaved, each run in a "
        f"fresh process: {record['isolated']})",
        "",
        "#### Targets (issue 6)",
        "",
        "| target | limit | measured | status |",
        "|---|---|---|---|",
    ]
    lines += [f"| {t['target']} | {t['limit']} | {t['measured']} | **{t['status']}** |" for t in record["targets"]]
    for name, case in record["cases"].items():
        load = case.get("loadavg_before"), case.get("loadavg_after")
        lines += ["", f"### case `{name}`: {case['title']}", ""]
        if case.get("note"):
            lines += [case["note"], ""]
        if load[0] is not None:
            lines += [f"Load average (1/5/15 min) before {_load(load[0])}, after {_load(load[1])}; "
                      f"took {case['seconds']:.0f} s.", ""]  # fmt: skip
        for group in case["groups"]:
            lines += [group_table(group), ""]
    return "\n".join(lines).rstrip() + "\n"


def _load(values: Sequence[float] | None) -> str:
    return "-" if values is None else "/".join(f"{v:.2f}" for v in values)


# -- chart ------------------------------------------------------------------------------------
def chart(record: Mapping[str, Any], path: Path) -> bool:
    """One panel per group: each contender's CPU-time ratio to the baseline (log scale past 10x)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    groups = [g for case in record["cases"].values() for g in case["groups"]
              if any(c["summary"].get("ratio_cpu") for c in g["contenders"])]  # fmt: skip
    if not groups:
        return False
    heights = [0.6 + 0.32 * len(g["contenders"]) for g in groups]
    fig, axes = plt.subplots(len(groups), 1, figsize=(9, sum(heights)), gridspec_kw={"height_ratios": heights})
    for ax, g in zip(axes if len(groups) > 1 else [axes], groups, strict=True):
        shown = [c for c in g["contenders"] if c["summary"].get("ratio_cpu")]
        names = [c["name"] for c in shown][::-1]
        ratios = [c["summary"]["ratio_cpu"] for c in shown][::-1]
        colors = ["#d95f02" if "ember" in n else "#7570b3" if n == g["baseline"] else "#999999"
                  for n in names]  # fmt: skip
        ax.barh(names, ratios, color=colors)
        if max(ratios) > 10 or min(ratios) < 0.1:
            ax.set_xscale("log")
        else:
            ax.set_xlim(0, max(ratios) * 1.18)
        ax.axvline(1.0, color="black", linewidth=0.8)
        for y, r in enumerate(ratios):
            ax.text(r, y, f" {r:.2f}x" if r < 100 else f" {r:,.0f}x", va="center", fontsize=7)
        ax.set_title(f"{g['name']} — CPU time / {g['baseline']}", fontsize=9)
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write(record: Mapping[str, Any], out_dir: Path, stem: str) -> list[Path]:
    """Write ``<stem>.json``, ``<stem>.md`` and ``<stem>.png`` (when matplotlib is there)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.md"]
    paths[0].write_text(json.dumps(record, indent=1) + "\n")
    paths[1].write_text(markdown(record))
    png = out_dir / f"{stem}.png"
    if chart(record, png):
        paths.append(png)
    return paths


def merge(old: Mapping[str, Any] | None, new: Mapping[str, Any], keep: Iterable[str]) -> dict[str, Any]:
    """``new`` with the cases of ``old`` it did not run (a single-case run updates one case)."""
    if old is None:
        return dict(new)
    cases = {k: v for k, v in old.get("cases", {}).items() if k in set(keep) and k not in new["cases"]}
    return {**new, "cases": {**cases, **new["cases"]}}

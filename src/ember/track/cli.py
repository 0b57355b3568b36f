"""``ember runs ls|show|compare|export|rm``: the local store from the command line.

``ember.cli`` calls :func:`add_commands`; each sub-command's handler is stored as
``args.handler`` and returns the exit code. Bad input raises :class:`~ember.errors.TrackingError`
(``main`` here, like ``ember.cli.main``, prints it and returns 2). ``python -m ember.track.cli runs ls`` works too.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from ember._cli import run_commands
from ember.errors import TrackingError
from ember.track import _report as rp
from ember.track import lineage
from ember.track._fs import read_json, resolve_home
from ember.track._values import encode_metrics
from ember.track.store import (
    PLATFORM_FILE,
    last_metrics,
    list_runs,
    metric_types,
    read_metrics,
    resolve,
    run_info,
)


def _home(args: argparse.Namespace) -> Path:
    return resolve_home(args.store)


def cmd_ls(args: argparse.Namespace) -> int:
    """Print a table of the runs in the store."""
    home = _home(args)
    infos = list_runs(home)
    if not infos:
        print(f"no runs in {home / 'runs'}")
        return 0
    rows = []
    for info in infos:
        last = rp.last_metrics_text(last_metrics(info.path)) if info.error is None else info.error
        rows.append(
            [
                info.folder,
                info.status,
                rp.fmt_time(info.meta.get("start_time")),
                rp.fmt_duration(info.duration()),
                last,
            ]
        )
    print(rp.table(["NAME", "STATUS", "STARTED", "DURATION", "LAST METRICS"], rows))
    return 0


def _platform_lines(platform: dict[str, Any]) -> list[list[str]]:
    plat = platform.get("platform") or {}
    torch = plat.get("torch") or {}
    gpus = ", ".join(g["name"] for g in torch.get("gpus", [])) or "none"
    git = platform.get("git")
    git_text = "-"
    if git and git.get("commit"):
        git_text = f"{git['commit'][:12]} on {git.get('branch')}" + (" (dirty)" if git.get("dirty") else "")
    command = platform.get("command") or {}
    return [
        ["os", str(plat.get("os", "-"))],
        ["python", str((plat.get("python") or {}).get("version", "-"))],
        ["torch", f"{torch.get('version', '-')} (CUDA {torch.get('cuda')}, GPUs: {gpus})"],
        ["cpus", str(plat.get("cpu_count", "-"))],
        ["memory", rp.fmt_bytes(plat["memory_bytes"]) if plat.get("memory_bytes") else "-"],
        ["git", git_text],
        ["command", " ".join(command.get("argv", [])) or "-"],
    ]


def _node_text(ref: dict[str, Any], home: Path) -> str:
    folder = lineage.resolve_ref(ref, home)
    extra = ""
    if ref.get("kind") == "artifact" and (folder / "artifact.json").is_file():
        files = read_json(folder / "artifact.json").get("files", [])
        extra = f", {len(files)} file(s), {rp.fmt_bytes(sum(int(f['size']) for f in files))}"
    elif not folder.exists():
        extra = ", missing"
    return f"{ref.get('kind')} {ref.get('name')} ({ref.get('path')}{extra})"


def cmd_show(args: argparse.Namespace) -> int:
    """Print a run's metadata, hparams, platform, metric summary and lineage."""
    home = _home(args)
    info = run_info(resolve(args.run, home))
    if info.error is not None:
        raise TrackingError(info.error)
    meta = info.meta
    rows: list[list[Any]] = [
        ["run", info.folder],
        ["id", meta.get("id")],
        ["name", meta.get("name")],
        ["status", info.status],
        ["folder", meta.get("folder")],
        ["path", str(info.path)],
        ["started", rp.fmt_time(meta.get("start_time"))],
        ["ended", rp.fmt_time(meta.get("end_time"))],
        ["duration", rp.fmt_duration(info.duration())],
        ["labels", ", ".join(meta.get("labels", [])) or "-"],
        ["description", meta.get("description") or "-"],
        ["host", f"{meta.get('hostname')} (pid {meta.get('pid')})"],
        ["resumed", str(len(meta.get("resumes", [])))],
    ]
    out = [rp.kv(rows)]
    hparams = rp.flatten(meta.get("hparams", {}))
    out.append("\nhparams" + ("" if hparams else ": none"))
    if hparams:
        out.append(rp.kv([[k, json.dumps(v)] for k, v in hparams.items()], "  "))
    platform = read_json(info.path / PLATFORM_FILE) if (info.path / PLATFORM_FILE).is_file() else {}
    out.append("\nplatform")
    out.append(rp.kv(_platform_lines(platform), "  "))
    summaries = rp.run_summaries(info.path)
    out.append("\nmetrics" + ("" if summaries else ": none"))
    metric_rows = []
    for type_, per_metric in summaries.items():
        for name, s in per_metric.items():
            steps = f"{s['first_step']}-{s['last_step']}"
            values = [rp.fmt_number(s[k]) if s[k] is not None else "-" for k in ("last", "min", "max")]
            metric_rows.append([type_, name, s["count"], steps, *values])
    if metric_rows:
        out.append(rp.table(["TYPE", "METRIC", "POINTS", "STEPS", "LAST", "MIN", "MAX"], metric_rows, "  "))
    edges = lineage.read_edges(info.path)
    out.append("\nlineage" + ("" if edges else ": none"))
    lineage_rows = []
    for edge in edges:
        if edge["target"]["id"] == meta.get("id"):
            lineage_rows.append(["input", _node_text(edge["source"], home)])
        else:
            lineage_rows.append(["output", _node_text(edge["target"], home)])
    if lineage_rows:
        out.append(rp.kv(lineage_rows, "  "))
    print("\n".join(out))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Print the hparams that differ and final/best metrics of several runs side by side."""
    home = _home(args)
    infos = [run_info(resolve(ref, home)) for ref in args.runs]
    names = [i.folder for i in infos]
    if len(set(names)) != len(names):
        raise TrackingError(f"compare: the same run is named twice in {args.runs}")
    flat = [rp.flatten(i.meta.get("hparams", {})) for i in infos]
    keys = sorted({k for f in flat for k in f})
    differing = [k for k in keys if len({json.dumps(f.get(k, None), sort_keys=True) for f in flat}) > 1]
    out = [rp.table(["", *names], [["status", *[i.status for i in infos]]])]
    out.append(f"\nhparams that differ ({len(keys) - len(differing)} identical not shown)")
    rows = [[k, *[json.dumps(f[k]) if k in f else "-" for f in flat]] for k in differing]
    if rows:
        out.append(rp.table(["NAME", *names], rows, "  "))
    summaries = [rp.run_summaries(i.path) for i in infos]
    series = sorted({(t, m) for s in summaries for t, per in s.items() for m in per})
    if args.metric is not None:
        series = [(t, m) for t, m in series if m == args.metric]
        if not series:
            raise TrackingError(f"compare: no run has a metric named {args.metric!r}")
    metric_rows = []
    for type_, metric in series:
        maximise = args.mode == "max" or (args.mode == "auto" and rp.higher_is_better(metric))
        best_key = "max" if maximise else "min"
        finals, bests = [], []
        for s in summaries:
            entry = s.get(type_, {}).get(metric)
            finals.append(rp.fmt_number(entry["last"]) if entry else "-")
            bests.append(rp.fmt_number(entry[best_key]) if entry and entry[best_key] is not None else "-")
        metric_rows.append([f"{type_}/{metric}", "final", *finals])
        metric_rows.append([f"{type_}/{metric}", f"best ({best_key})", *bests])
    out.append("\nmetrics" + ("" if metric_rows else ": none"))
    if metric_rows:
        out.append(rp.table(["METRIC", "", *names], metric_rows, "  "))
    print("\n".join(out))
    return 0


def _export_json(path: Path) -> str:
    data = {
        "run": read_json(path / "run.json"),
        "platform": read_json(path / PLATFORM_FILE) if (path / PLATFORM_FILE).is_file() else None,
        "metrics": {t: read_metrics(path, t) for t in metric_types(path)},
        "lineage": lineage.read_edges(path),
    }
    for points in data["metrics"].values():
        for point in points:  # the store's encoding of NaN/inf, so the output is strict JSON
            point["metrics"] = json.loads(encode_metrics(point["metrics"]))
    return json.dumps(data, indent=2, allow_nan=False) + "\n"


def _export_csv(path: Path) -> str:
    rows = [(t, p) for t in metric_types(path) for p in read_metrics(path, t)]
    names = sorted({name for _, p in rows for name in p["metrics"]})
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["type", "step", "epoch", "time", *names])
    for type_, p in rows:
        epoch = "" if p["epoch"] is None else p["epoch"]
        writer.writerow([type_, p["step"], epoch, p["time"], *[p["metrics"].get(n, "") for n in names]])
    return buffer.getvalue()


def cmd_export(args: argparse.Namespace) -> int:
    """Write a run's metrics (csv) or everything about it (json) to a file or stdout."""
    path = resolve(args.run, _home(args))
    text = _export_json(path) if args.format == "json" else _export_csv(path)
    if args.output is None:
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text, encoding="utf-8")
        print(f"wrote {args.output}", file=sys.stderr)
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    """Delete runs from the store (asks first unless --yes)."""
    home = _home(args)
    infos = [run_info(resolve(ref, home)) for ref in args.runs]
    for info in infos:
        if info.status == "Running":
            raise TrackingError(
                f"run {info.folder} is still running (pid {info.meta.get('pid')} on "
                f"{info.meta.get('hostname')}); stop it first, nothing was removed"
            )
    if not args.yes:
        if not sys.stdin.isatty():
            raise TrackingError("rm: not asking on a non-interactive input; pass --yes to remove")
        answer = input(f"remove {', '.join(i.folder for i in infos)}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing removed")
            return 1
    for info in infos:
        shutil.rmtree(info.path)
        print(f"removed {info.path}")
    return 0


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register ``runs`` and its sub-commands on the ``ember`` command's subparsers.

    Args:
        subparsers: what ``parser.add_subparsers()`` returned; each command sets ``handler``.

    Example:
        >>> parser = argparse.ArgumentParser(prog="ember")
        >>> add_commands(parser.add_subparsers(dest="command", required=True))
        >>> args = parser.parse_args(["runs", "ls"]); args.handler(args)
    """
    runs = subparsers.add_parser("runs", help="list, show, compare, export and remove tracked runs")
    sub = runs.add_subparsers(dest="runs_command", required=True, metavar="COMMAND")
    store = argparse.ArgumentParser(add_help=False)
    store.add_argument("--store", metavar="DIR", help="store root (default: $EMBER_HOME or ./.ember)")
    run_help = "a run's folder path, folder name or unique prefix"

    p = sub.add_parser("ls", parents=[store], help="a table of runs: status, start, duration, last metrics")
    p.set_defaults(handler=cmd_ls)
    p = sub.add_parser("show", parents=[store], help="hparams, platform, metrics summary and lineage")
    p.add_argument("run", metavar="RUN", help=run_help)
    p.set_defaults(handler=cmd_show)
    p = sub.add_parser("compare", parents=[store], help="hparam differences and final/best metrics")
    p.add_argument("runs", metavar="RUN", nargs="+", help=run_help)
    p.add_argument("--metric", metavar="NAME", help="only this metric (in every type)")
    p.add_argument(
        "--mode",
        choices=("auto", "min", "max"),
        default="auto",
        help="what 'best' means; auto: max for accuracy-like names, else min",
    )
    p.set_defaults(handler=cmd_compare)
    p = sub.add_parser("export", parents=[store], help="metrics as CSV, or the whole run as JSON")
    p.add_argument("run", metavar="RUN", help=run_help)
    p.add_argument("--format", choices=("csv", "json"), required=True)
    p.add_argument("--output", metavar="FILE", help="write here instead of stdout")
    p.set_defaults(handler=cmd_export)
    p = sub.add_parser("rm", parents=[store], help="delete runs from the store")
    p.add_argument("runs", metavar="RUN", nargs="+", help=run_help)
    p.add_argument("--yes", action="store_true", help="do not ask")
    p.set_defaults(handler=cmd_rm)


def main(argv: list[str] | None = None) -> int:
    """Run ``runs ...`` on its own: ``python -m ember.track.cli runs ls``."""
    return run_commands(add_commands, argv)


if __name__ == "__main__":
    sys.exit(main())

"""``ember runs ls|show|compare|export|rm|rename|label|note``: the local store from the command line.

``ember.cli`` calls :func:`add_commands`; each sub-command's handler is stored as
``args.handler`` and returns the exit code. Bad input raises :class:`~ember.errors.TrackingError`
(``main`` here, like ``ember.cli.main``, prints it and returns 2). ``python -m ember.track.cli runs ls`` works too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from ember._atomic import atomic_open, why_write_failed
from ember._format import format_bytes, format_duration
from ember._subcommands import output_file, run_commands
from ember.errors import TrackingError, short_repr
from ember.track import _report as rp
from ember.track import export, lineage, local_query, query
from ember.track._fs import read_json, resolve_home
from ember.track.best import majority_mode, recorded_modes
from ember.track.hparams import flatten
from ember.track.run import edit_run
from ember.track.store import (
    DAMAGED,
    RunInfo,
    last_metrics,
    list_runs,
    read_platform,
    resolve,
    resolve_many,
    run_info,
)


def _home(args: argparse.Namespace) -> Path:
    return resolve_home(args.store)


def _last_text(info: RunInfo) -> tuple[str, str | None]:
    """The LAST METRICS text of a run and, when reading its metrics shows damage, the reason
    (its paths relative to the run folder, so that the table's column shows what is wrong)."""
    if info.error is not None:
        return _in_run(info.error, info), info.error
    try:
        return rp.last_metrics_text(last_metrics(info.path, info.types)), None
    except TrackingError as e:
        return _in_run(str(e), info), str(e)


def _in_run(text: str, info: RunInfo) -> str:
    return text.replace(f"{info.path}{os.sep}", "").replace(str(info.path), "the run folder")


def cmd_ls(args: argparse.Namespace) -> int:
    """Print a table of the runs in the store (those --filter keeps); a damaged run is listed Damaged, with why."""
    home = _home(args)
    try:
        tree = query.parse_all(args.filter or [])
    except query.FilterError as e:
        raise TrackingError(f"--filter {e}\n  {e.pointer().replace(chr(10), chr(10) + '  ')}") from None
    infos = list_runs(home)
    if not infos:
        print(f"no runs in {home / 'runs'}")
        return 0
    if tree is not None:
        selection = local_query.select_runs(tree, infos)
        for why in selection.unreadable:
            print(f"not checked against the filter's metrics (damaged): {why}", file=sys.stderr)
        infos = selection.kept
        if not infos:
            print(f"no run in {home / 'runs'} matches the filter: " + "; ".join(selection.why_none))
            return 0
    if args.sort:
        infos = local_query.sort_runs(infos, args.sort)
    rows = []
    damaged = 0
    for info in infos:
        last, damage = _last_text(info)
        damaged += damage is not None
        status = DAMAGED if damage is not None else info.status
        start = rp.fmt_time(info.meta.get("start_time"))
        rows.append([info.folder, status, start, _duration_text(info), rp.shorten(last, 60)])
    print(rp.table(["NAME", "STATUS", "STARTED", "DURATION", "LAST METRICS"], rows))
    if damaged:
        print(f"{damaged} damaged run(s): `ember runs show NAME` says why", file=sys.stderr)
    return 0


def _duration_text(info: RunInfo) -> str:
    """A run's duration; a Crashed run's says it ends at its last record (as the console says)."""
    text = format_duration(info.duration())
    return f"{text} (until its last record)" if info.status == "Crashed" and text != "-" else text


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
        ["memory", format_bytes(plat["memory_bytes"]) if plat.get("memory_bytes") else "-"],
        ["git", git_text],
        ["command", " ".join(command.get("argv", [])) or "-"],
    ]


def _node_text(ref: dict[str, Any], home: Path) -> str:
    folder = lineage.resolve_ref(ref, home)
    extra = ""
    if ref.get("kind") == "artifact" and (folder / "artifact.json").is_file():
        try:
            files = read_json(folder / "artifact.json", follow_links=False).get("files", [])
            extra = f", {len(files)} file(s), {format_bytes(sum(int(f['size']) for f in files))}"
        except (TrackingError, AttributeError, KeyError, TypeError, ValueError) as e:
            extra = f", damaged: {e}"
    elif not folder.exists():
        extra = ", missing"
    return f"{ref.get('kind')} {ref.get('name')} ({ref.get('path')}{extra})"


def _guarded(read: Any, *args: Any) -> tuple[Any, str | None]:
    """``read(*args)`` and None, or None and the damage it reported."""
    try:
        return read(*args), None
    except TrackingError as e:
        return None, str(e)


def cmd_show(args: argparse.Namespace) -> int:
    """Print a run's metadata, hparams, platform, metric summary and lineage (exit 1 when it is damaged)."""
    home = _home(args)
    info = run_info(resolve(args.run, home))
    if info.error is not None:
        print(rp.kv([["run", info.folder], ["status", DAMAGED], ["path", str(info.path)], ["damage", info.error]]))
        return 1
    meta = info.meta
    summaries, metrics_damage = _guarded(rp.run_summaries, info.path)
    platform, platform_damage = _guarded(_platform, info.path)
    edges, lineage_damage = _guarded(lineage.read_edges, info.path)
    damage = metrics_damage or platform_damage or lineage_damage
    rows: list[list[Any]] = [
        ["run", info.folder],
        ["id", meta.get("id")],
        ["name", meta.get("name")],
        ["status", DAMAGED if damage else info.status],
        ["reason", meta.get("reason") or "-"],
        ["folder", meta.get("folder")],
        ["path", str(info.path)],
        ["started", rp.fmt_time(meta.get("start_time"))],
        ["ended", rp.fmt_time(meta.get("end_time"))],
        ["duration", _duration_text(info)],
        ["labels", ", ".join(meta.get("labels", [])) or "-"],
        ["description", meta.get("description") or "-"],
        ["host", f"{meta.get('hostname')} (pid {meta.get('pid')})"],
        ["resumed", str(len(meta.get("resumes", [])))],
    ]
    if damage:
        rows.insert(5, ["damage", damage])
    out = [rp.kv(rows)]
    hparams = flatten(meta.get("hparams", {}))
    out.append("\nhparams" + ("" if hparams else ": none"))
    if hparams:
        out.append(rp.kv([[k, json.dumps(v)] for k, v in hparams.items()], "  "))
    out.append("\nplatform" + (f": damaged ({platform_damage})" if platform_damage else ""))
    if platform is not None:
        out.append(rp.kv(_platform_lines(platform), "  "))
    out.append("\nmetrics" + (f": damaged ({metrics_damage})" if metrics_damage else "" if summaries else ": none"))
    metric_rows = []
    for type_, per_metric in (summaries or {}).items():
        for name, s in per_metric.items():
            steps = f"{s['first_step']}-{s['last_step']}"
            values = [rp.fmt_number(s[k]) if s[k] is not None else "-" for k in ("last", "min", "max")]
            metric_rows.append([type_, name, s["count"], steps, *values])
    if metric_rows:
        out.append(rp.table(["TYPE", "METRIC", "POINTS", "STEPS", "LAST", "MIN", "MAX"], metric_rows, "  "))
    out.append("\nlineage" + (f": damaged ({lineage_damage})" if lineage_damage else "" if edges else ": none"))
    lineage_rows = []
    for edge in edges or []:
        if edge["target"]["id"] == meta.get("id"):
            lineage_rows.append(["input", _node_text(edge["source"], home)])
        else:
            lineage_rows.append(["output", _node_text(edge["target"], home)])
    if lineage_rows:
        out.append(rp.kv(lineage_rows, "  "))
    print("\n".join(out))
    return 1 if damage else 0


def _platform(run_path: Path) -> dict[str, Any]:
    """The run's platform.json ({} when it has none)."""
    return read_platform(run_path) or {}


def cmd_compare(args: argparse.Namespace) -> int:
    """Print the hparams that differ and final/best metrics of several runs side by side.

    "best" is each metric's recorded mode (the one most of these runs recorded), else the name
    rule (:mod:`ember.track.best`), unless ``--mode`` says min or max.

    A damaged run keeps its column: status Damaged, its reason, and "-" where nothing can be read.
    """
    home = _home(args)
    infos = [run_info(p) for p in resolve_many(args.runs, home)]
    names = [i.folder for i in infos]
    if len(set(names)) != len(names):
        raise TrackingError(f"compare: the same run is named twice in {args.runs}")
    summaries: list[dict[str, Any]] = []
    damages: list[str | None] = []
    for info in infos:
        summary, damage = (None, info.error) if info.error is not None else _guarded(rp.run_summaries, info.path)
        summaries.append(summary or {})
        damages.append(damage)
    flat = [flatten(i.meta.get("hparams", {})) if d is None else {} for i, d in zip(infos, damages, strict=True)]
    keys = sorted({k for f in flat for k in f})
    differing = [k for k in keys if len({json.dumps(f.get(k, None), sort_keys=True) for f in flat}) > 1]
    statuses = [DAMAGED if d is not None else i.status for i, d in zip(infos, damages, strict=True)]
    status_rows = [["status", *statuses]]
    if any(damages):
        status_rows.append(["damage", *[rp.shorten(d, 60) if d else "-" for d in damages]])
    out = [rp.table(["", *names], status_rows)]
    out.append(f"\nhparams that differ ({len(keys) - len(differing)} identical not shown)")
    rows = [[k, *[json.dumps(f[k]) if k in f else "-" for f in flat]] for k in differing]
    if rows:
        out.append(rp.table(["NAME", *names], rows, "  "))
    series = sorted({(t, m) for s in summaries for t, per in s.items() for m in per})
    if args.metric is not None:
        series = [(t, m) for t, m in series if m == args.metric]
        if not series:
            raise TrackingError(f"compare: no run has a metric named {short_repr(args.metric)}")
    recorded = [recorded_modes(i.meta) for i in infos]
    metric_rows = []
    for type_, metric in series:
        key = f"{type_}/{metric}"
        best_key = majority_mode(key, [r.get(key) for r in recorded]) if args.mode == "auto" else args.mode
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


def cmd_export(args: argparse.Namespace) -> int:
    """Write a run's metrics (csv) or everything about it (json) to a file or stdout, streamed."""
    path = resolve(args.run, _home(args))
    out = None if args.output is None else output_file(args.output, "runs export --output", TrackingError)
    info = run_info(path)
    if info.error is not None:
        raise TrackingError(f"run {path.name} is damaged, nothing was exported: {info.error}")
    write = export.write_json if args.format == "json" else export.write_csv
    if out is None:
        try:
            write(path, sys.stdout)
            sys.stdout.flush()
        except BrokenPipeError:  # `ember runs export RUN | head`: the reader has all it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush writes nowhere
            return 0
        except OSError as e:
            raise TrackingError(f"cannot write to the standard output: {why_write_failed(e)}") from None
    else:
        try:
            with atomic_open(out, "w", encoding="utf-8", newline="") as f:  # a failed export leaves the old file
                write(path, f)
        except OSError as e:
            raise TrackingError(f"cannot write {args.output}: {why_write_failed(e)}; nothing was exported") from None
        print(f"wrote {args.output}", file=sys.stderr)
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    """Delete runs from the store (asks first unless --yes); with --server, the same runs on the
    server too: to its trash, or deleted with --purge."""
    if args.purge and not args.server:
        raise TrackingError("rm: --purge applies to the server's copy: add --server (the folder here always goes)")
    home = _home(args)
    infos = [run_info(p) for p in resolve_many(args.runs, home)]
    for info in infos:
        if info.status == "Running":
            raise TrackingError(
                f"run {info.folder} is still running (pid {info.meta.get('pid')} on "
                f"{info.meta.get('hostname')}); stop it first, nothing was removed"
            )
        if args.server and not info.meta.get("id"):
            raise TrackingError(
                f"run {info.folder} has no readable id ({info.error or 'run.json names none'}), so its copy on the "
                "server cannot be found: remove it without --server; nothing was removed"
            )
    client = None
    if args.server:  # its credentials are checked before anything is asked or removed
        from ember.track.client import Client

        client = Client()
    with client if client is not None else contextlib.nullcontext():
        if not args.yes and not _confirmed(infos, args.server, args.purge):
            print("nothing removed")
            return 1
        for info in infos:
            # The server's copy first: a refusal there (not found, no right, unreachable) stops
            # before this run's folder is deleted, so it can be tried again.
            if client is not None:
                try:
                    _remove_on_server(client, str(info.meta["id"]), args.purge)
                except TrackingError as e:  # UploadError: refused, or unreachable
                    raise TrackingError(
                        f"{e}; run {info.folder} and the runs after it were kept here (without --server, rm "
                        "removes them here only)"
                    ) from None
            if info.path.is_symlink() or not info.path.is_dir():  # a link: the link, never what it points at
                info.path.unlink()
            else:
                shutil.rmtree(info.path)
            print(f"removed {info.path}")
    return 0


def _confirmed(infos: list[RunInfo], server: bool, purge: bool) -> bool:
    """Ask on the terminal whether to remove these runs; refused on a non-interactive input."""
    if not sys.stdin.isatty():
        raise TrackingError("rm: not asking on a non-interactive input; pass --yes to remove")
    there = ""
    if server:
        there = " here and on the server" + (" (deleted there for good)" if purge else " (to its trash)")
    answer = input(f"remove {', '.join(i.folder for i in infos)}{there}? [y/N] ")
    return answer.strip().lower() in ("y", "yes")


def _remove_on_server(client: Any, run_id: str, purge: bool) -> None:
    """``DELETE /runs/{id}``: to the server's trash, or (``purge``) deleted with its points."""
    answer = client.call("DELETE", f"/runs/{run_id}", params={"purge": "true"} if purge else None)
    if purge:
        print(f"deleted run {run_id} on {client.creds.host}")
    else:
        until = answer.get("purge_after", "?") if isinstance(answer, dict) else "?"
        print(f"moved run {run_id} to the trash on {client.creds.host} (restorable until {until})")


def _edited(args: argparse.Namespace, info: RunInfo, **fields: Any) -> None:
    """Write the fields into the run's run.json, then (``--server``) onto the same run on the server."""
    meta = edit_run(info.path, **fields)
    print(f"changed {', '.join(fields)} of {info.folder}")
    if args.server:
        from ember.track.client import Client

        with Client() as client:
            client.call("PATCH", f"/runs/{meta['id']}", json={k: meta[k] for k in fields})
        print(f"changed {', '.join(fields)} of run {meta['id']} on {client.creds.host}")


def cmd_rename(args: argparse.Namespace) -> int:
    """Give a finished run another name (its folder keeps its own)."""
    info = run_info(resolve(args.run, _home(args)))
    _edited(args, info, name=args.name)
    return 0


def cmd_label(args: argparse.Namespace) -> int:
    """Add and remove labels on finished runs."""
    if not args.add and not args.remove:
        raise TrackingError("label: say what to change with --add LABEL and/or --remove LABEL")
    for info in [run_info(p) for p in resolve_many(args.runs, _home(args))]:
        held = [x for x in info.meta.get("labels") or [] if x not in args.remove]
        _edited(args, info, labels=held + [x for x in args.add if x not in held])
    return 0


def cmd_note(args: argparse.Namespace) -> int:
    """Set a finished run's description (notes); '' clears it."""
    info = run_info(resolve(args.run, _home(args)))
    _edited(args, info, description=args.text)
    return 0


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register ``runs`` and its sub-commands (see :data:`ember._subcommands.AddCommands`).

    Example:
        >>> main(["runs", "ls"])
    """
    runs = subparsers.add_parser("runs", help="list, show, compare, export, edit and remove tracked runs")
    sub = runs.add_subparsers(dest="runs_command", required=True, metavar="COMMAND")
    store = argparse.ArgumentParser(add_help=False)
    store.add_argument("--store", metavar="DIR", help="store root (default: $EMBER_HOME or ./.ember)")
    run_help = "a run's folder path, folder name or unique prefix"

    p = sub.add_parser("ls", parents=[store], help="a table of runs: status, start, duration, last metrics")
    p.add_argument(
        "--filter",
        action="append",
        metavar="EXPR",
        help="only the runs that match, e.g. 'm:val/acc.best > 0.9 and hp:lr < 1e-3' (docs/tracking.md, "
        "'Filtering runs': and/or/not, = != < <= > >= ~ in; hp:, m:TYPE/NAME[.best|.min|.max], status, label, "
        "name, start); given twice, both must hold",
    )
    p.add_argument(
        "--sort",
        metavar="KEY",
        help="order the runs by name, status, start, duration, folder, hp:KEY or m:TYPE/NAME (its last value; "
        "m:TYPE/NAME.best, .min, .max as --filter reads them); --sort=-KEY descending; runs without it last "
        "(default: by start, oldest first)",
    )
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
        help="what 'best' means; auto: the console's rule (ember.track.best): the mode the runs recorded "
        "(Run.define_metric; the most of them), else max for scores such as acc, else min",
    )
    p.set_defaults(handler=cmd_compare)
    p = sub.add_parser("export", parents=[store], help="metrics as CSV, or the whole run as JSON")
    p.add_argument("run", metavar="RUN", help=run_help)
    p.add_argument("--format", choices=("csv", "json"), required=True)
    p.add_argument("--output", metavar="FILE", help="write here instead of stdout")
    p.set_defaults(handler=cmd_export)
    server = argparse.ArgumentParser(add_help=False)
    server.add_argument(
        "--server",
        action="store_true",
        help="also change the same run (by id) on the tracking server you logged into (ember login); "
        "an edit made there wins over later uploads",
    )
    p = sub.add_parser("rm", parents=[store], help="delete runs from the store (--server: and on the server)")
    p.add_argument("runs", metavar="RUN", nargs="+", help=run_help)
    p.add_argument("--yes", action="store_true", help="do not ask")
    p.add_argument(
        "--server",
        action="store_true",
        help="also remove the same run (by id) on the tracking server you logged into (ember login): "
        "to its trash, restorable there, unless --purge",
    )
    p.add_argument("--purge", action="store_true", help="with --server: delete the server's copy now, not to its trash")
    p.set_defaults(handler=cmd_rm)
    p = sub.add_parser("rename", parents=[store, server], help="give a finished run another name")
    p.add_argument("run", metavar="RUN", help=run_help)
    p.add_argument("name", metavar="NAME", help="the new name")
    p.set_defaults(handler=cmd_rename)
    p = sub.add_parser("label", parents=[store, server], help="add or remove labels of finished runs")
    p.add_argument("runs", metavar="RUN", nargs="+", help=run_help)
    p.add_argument("--add", action="append", default=[], metavar="LABEL", help="a label to add (repeatable)")
    p.add_argument("--remove", action="append", default=[], metavar="LABEL", help="a label to remove (repeatable)")
    p.set_defaults(handler=cmd_label)
    p = sub.add_parser("note", parents=[store, server], help="set a finished run's description (notes)")
    p.add_argument("run", metavar="RUN", help=run_help)
    p.add_argument("text", metavar="TEXT", help="the notes ('' clears them)")
    p.set_defaults(handler=cmd_note)


def main(argv: list[str] | None = None) -> int:
    """Run ``runs ...`` on its own: ``python -m ember.track.cli runs ls``."""
    return run_commands(add_commands, argv)


if __name__ == "__main__":
    sys.exit(main())

"""``ember checkpoint inspect|export``: look inside a checkpoint, take the model weights out.

``ember.cli`` calls :func:`add_commands`. Each handler returns the exit code; bad input raises
:class:`~ember.errors.CheckpointError`, which ``ember.cli.main`` prints and turns into exit code 2.
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path
from typing import Any

from ember._format import format_bytes
from ember._subcommands import output_file
from ember.errors import CheckpointError


def _resolve(path: str) -> Path:
    """A checkpoint file or sharded checkpoint directory, or the newest one in a directory."""
    from ember.checkpoint import latest
    from ember.checkpoint.sharded import is_checkpoint_dir

    p = Path(path)
    if p.is_dir() and not is_checkpoint_dir(p):
        found = latest(p)
        if found is None:
            raise CheckpointError(f"no checkpoint in {path!r} (files named like 'ckpt-e0001-s000000100.ckpt')")
        return found
    return p


def _when(time: Any) -> str:
    """A checkpoint's save time, local, to the second ('?' when missing or out of range)."""
    try:
        return datetime.datetime.fromtimestamp(time).isoformat(sep=" ", timespec="seconds")
    except (TypeError, ValueError, OverflowError, OSError):
        return "?"


def _read_meta(path: Path) -> dict[str, Any]:
    """The checkpoint's metadata, reading no tensor data (the file is memory-mapped; a sharded
    checkpoint's shard files are checked for completeness, not read)."""
    from ember.checkpoint.io import load_file
    from ember.checkpoint.sharded import is_checkpoint_dir, read_sharded
    from ember.checkpoint.validate import check_state

    if is_checkpoint_dir(path):
        return dict(read_sharded(path)["meta"])
    state = load_file(path, mmap=True)
    check_state(state, f"checkpoint {str(path)!r}")
    return dict(state["meta"])


def cmd_inspect(args: argparse.Namespace) -> int:
    """Print a checkpoint's step, epoch, metrics, where it came from and its sections' sizes."""
    from ember.checkpoint.sharded import directory_bytes

    path = _resolve(args.path)
    meta = _read_meta(path)
    sharded = path.is_dir()
    size = directory_bytes(path) if sharded else path.stat().st_size
    when = _when(meta.get("time"))
    where = f"{meta['epoch_iter']} batches into epoch {meta['epoch']}" if meta["epoch_iter"] else "at its start"
    optional = ("reason", "micro_step", "samples_seen", "accumulation_micro_step", "data_parallel_size", "parallel",
                "ember_version", "torch_version")  # fmt: skip
    shown = {k: meta.get(k, "?") for k in optional}
    active = meta.get("fit_active")
    fit = "?" if active is None else "in progress (resume continues it)" if active else "finished"
    rows = [
        ("file", f"{path} ({format_bytes(size)}{', sharded: torch.distributed.checkpoint' if sharded else ''})"),
        ("saved", f"{when} ({shown['reason']})"),
        ("epoch", f"{meta['epoch']} ({where})"),
        ("step", f"{meta['step']} optimizer updates, {shown['micro_step']} batches, {shown['samples_seen']} samples"),
        ("accumulation", f"{shown['accumulation_micro_step']} micro-step(s) into a cycle"),
        ("fit", fit),
        ("processes", f"{meta['world_size']} ({shown['parallel']}, data parallel {shown['data_parallel_size']})"),
        ("versions", f"ember {shown['ember_version']}, torch {shown['torch_version']}"),
    ]
    for name, value in sorted(meta.get("metrics", {}).items()):
        rows.append((name, f"{value:.6g}"))
    for section, section_size in meta.get("sizes", {}).items():
        rows.append((f"size of {section}", format_bytes(section_size) if isinstance(section_size, int) else "?"))
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k:<{width}}  {v}" for k, v in rows))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Write the bare model weights of a checkpoint (``.pt``, or ``.safetensors``); a sharded
    checkpoint's shards are assembled into full tensors first."""
    from ember.checkpoint import model_state
    from ember.checkpoint.export import write_weights

    out = output_file(args.out, "checkpoint export OUT", CheckpointError)  # before reading: fail fast
    path = _resolve(args.path)
    out = write_weights(model_state(path), out)
    print(f"wrote the model weights of {path} to {out} ({format_bytes(out.stat().st_size)})")
    return 0


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register ``checkpoint inspect`` and ``checkpoint export`` (see :data:`ember._subcommands.AddCommands`).

    Example:
        >>> ember._subcommands.run_commands(add_commands, ["checkpoint", "inspect", "ckpt"])
    """
    ckpt = subparsers.add_parser("checkpoint", help="inspect checkpoints and export their model weights")
    sub = ckpt.add_subparsers(dest="checkpoint_command", required=True, metavar="COMMAND")
    what = "a checkpoint file, or a directory (its newest checkpoint)"
    p = sub.add_parser("inspect", help="step, epoch, metrics and sizes, without loading the tensors")
    p.add_argument("path", metavar="PATH", help=what)
    p.set_defaults(handler=cmd_inspect)
    p = sub.add_parser("export", help="write the bare model weights (.pt, or .safetensors)")
    p.add_argument("path", metavar="PATH", help=what)
    p.add_argument("out", metavar="OUT", help="the file to write: NAME.pt, or NAME.safetensors")
    p.set_defaults(handler=cmd_export)

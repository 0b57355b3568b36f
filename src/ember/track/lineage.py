"""Lineage edges (artifact -> run input, run -> artifact output, run -> run) on disk.

Each run or artifact folder holds an append-only ``lineage.jsonl``; an edge is appended, as
one line, to the files of both of its ends::

    {"time": 1716200000.5, "source": {"kind": "run", "id": "...", "name": "mnist",
     "path": "runs/mnist_240520_101500_a1b2c3"}, "target": {"kind": "artifact", ...}}

``path`` is relative to the store root holding that ``lineage.jsonl`` when the other end lives
in the same store, absolute otherwise. Ids are what a server joins on.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Protocol

from ember.errors import TrackingError, short_repr
from ember.track._fs import append_line, complete_lines, read_json

LINEAGE_FILE = "lineage.jsonl"


class Node(Protocol):
    """What a lineage end (a Run or an Artifact) exposes."""

    @property
    def id(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def path(self) -> Path | None: ...

    @property
    def kind(self) -> str: ...


def node_ref(node: Node, home: Path) -> dict[str, Any]:
    """A reference to ``node`` as written into a lineage file under store root ``home``."""
    assert node.path is not None
    path = node.path
    try:
        shown = path.relative_to(home).as_posix()
    except ValueError:
        shown = str(path)
    return {"kind": node.kind, "id": node.id, "name": node.name, "path": shown}


def record_edge(source: Node, target: Node) -> dict[str, Any]:
    """Append the edge ``source -> target`` to both ends' lineage files; return it."""
    edge: dict[str, Any] = {}
    now = round(time.time(), 6)
    for owner in (source, target):
        assert owner.path is not None
        home = owner.path.parent.parent
        edge = {
            "time": now,
            "source": node_ref(source, home),
            "target": node_ref(target, home),
        }
        append_line(owner.path / LINEAGE_FILE, json.dumps(edge) + "\n")
    return edge


def read_edges(folder: Path) -> list[dict[str, Any]]:
    """The distinct edges recorded in ``folder/lineage.jsonl`` (a torn last line is ignored)."""
    path = folder / LINEAGE_FILE
    edges: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    for number, line in complete_lines(path):
        try:
            edge = json.loads(line)
            ends = (edge["source"], edge["target"])
            if not all(isinstance(end.get(k), str) for end in ends for k in ("kind", "id", "name", "path")):
                raise ValueError("an end without the strings kind, id, name and path")
            key = (ends[0]["id"], ends[1]["id"])
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
            raise TrackingError(
                f"{path}: line {number} is damaged ({short_repr(str(e), 200)}); move the file away or delete that line"
            ) from None
        if key not in seen:
            seen.add(key)
            edges.append(edge)
    return edges


def resolve_ref(ref: dict[str, Any], home: Path) -> Path:
    """The folder a reference read from a lineage file under store root ``home`` points to."""
    path = ref.get("path", "")
    return Path(path) if os.path.isabs(path) else home / path


def run_folder(path: Path) -> str | None:
    """The tracking folder an artifact belongs in: its run's, read from its ``lineage.jsonl``.

    The run whose output it is, else the first run that used it as an input; None when no run of
    the store names it (or its lineage, or that run's ``run.json``, cannot be read). ``ember
    upload`` of a store and ``ember ui`` file an artifact there, beside its run, and in ``default``
    only when this is None (before, every artifact went to ``default``, away from its run).

    Example:
        >>> run_folder(Path(".ember/artifacts/model_260520_101700_x1y2z3"))
        'mnist'
    """
    try:
        edges = read_edges(path)
    except TrackingError:
        return None
    produced = [
        e["source"] for e in edges if e["source"].get("kind") == "run" and e["target"].get("kind") == "artifact"
    ]
    used = [e["target"] for e in edges if e["target"].get("kind") == "run" and e["source"].get("kind") == "artifact"]
    for ref in produced + used:
        meta_file = resolve_ref(ref, path.parent.parent) / "run.json"
        try:
            meta = read_json(meta_file, follow_links=False) if meta_file.is_file() else None
        except TrackingError:
            continue
        folder = meta.get("folder") if isinstance(meta, dict) else None
        if isinstance(folder, str) and folder.strip("/"):
            return folder
    return None

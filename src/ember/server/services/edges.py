"""Lineage: edges between runs and artifacts, stored from a node's ``lineage.jsonl``, read as a viewer may see them.

An edge joins two nodes by their kind and id (``("run", id)``, ``("artifact", id)``); either
end may not be uploaded (yet). A node sends the lines of its own ``lineage.jsonl``
(:func:`store_edges`), and every edge it sends must have that node, of that kind, as one end.

A viewer sees only the edges whose *other* end is a run or artifact they may view
(:func:`edges_of`): an edge written by someone's private run onto yours, or one to a node never
uploaded, is left out, and only counted (``hidden``). So nobody writes into another user's view,
and the graph is no oracle of private nodes or their names.

:func:`edges_of` walks ``depth`` levels upstream (inputs, their inputs...) and downstream
(outputs, their outputs...), or every level, with a constant number of queries a level however
many nodes it holds, and only through nodes the viewer may view. Edges come from uploads, which
anyone with a run can write, so the walk is bounded: a node is entered once a direction (a cycle
ends), an edge is kept once (a diamond's two paths reach one node), and the walk stops at
:data:`MAX_EDGES` edges or :data:`MAX_NODES` nodes, counting the visible edges it found and left
out (``more``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ColumnElement, and_, case, exists, false, func, or_, select
from sqlalchemy.orm import Session

from ember.server.services import ingest, listing, naming
from ember.server.storage.domain_errors import Invalid
from ember.server.storage.models import Artifact, Edge, Run, User
from ember.server.storage.schemas import EdgeIn

STREAM = "lineage.jsonl"
MAX_EDGES = 500
"""The most edges a lineage answers (level by level, the oldest first); ``more`` counts the others."""
MAX_NODES = 300
"""The most nodes a lineage walk enters, the node itself included; ``more`` counts the edges left out."""


NodeKey = tuple[str, str]
"""A node by its kind and id: ``("run", id)`` or ``("artifact", id)``."""


@dataclass(frozen=True)
class Lineage:
    """A node's lineage as one viewer sees it, ``depth`` levels each way.

    Attributes:
        edges: ``{"time", "source": {"kind", "id", "name", "visible"}, "target": {...}}``, level by
            level, each level's oldest first; at most :data:`MAX_EDGES`.
        hidden: edges of the nodes walked whose other end the viewer may not view, or that was
            never uploaded.
        more: visible edges found and left out at :data:`MAX_EDGES` or :data:`MAX_NODES` (the walk
            stopped there: nodes further away were not looked for).
        levels: every node drawn and its level: 0 the node itself, -1 its inputs, -2 their
            inputs..., 1 its outputs, 2 theirs...; a node both upstream and downstream (on a cycle
            through the node) at the level where the walk met it first.
        depth: the levels asked for each way (``None``: every level).
    """

    edges: list[dict[str, Any]]
    hidden: int = 0
    more: int = 0
    levels: dict[NodeKey, int] = field(default_factory=dict)
    depth: int | None = 1


def parse_depth(text: str | int | None) -> int | None:
    """A lineage depth asked for: ``1``, ``2``... levels of inputs and outputs, or ``"all"`` (``None``).

    Args:
        text: a query parameter's value; empty or ``None`` is 1.

    Returns:
        The number of levels, or ``None`` for every level (the walk's caps still bound it).

    Raises:
        Invalid: anything else (422), naming the value and what is allowed.

    Example:
        >>> parse_depth("2"), parse_depth("all")
        (2, None)
    """
    if text is None or text == "":
        return 1
    if isinstance(text, str) and text.strip().lower() == "all":
        return None
    try:
        depth = int(text)
    except ValueError:
        raise Invalid.field("depth", f"{str(text)[:20]!r} is not a lineage depth: give 1, 2, ... or 'all'") from None
    if depth < 1:
        raise Invalid.field("depth", f"lineage depth {depth} is below 1: give 1, 2, ... or 'all'")
    return depth


def store_edges(session: Session, kind: str, node_id: str, edges: list[EdgeIn], start: int, end: int) -> int:
    """Insert lineage edges read from a node's ``lineage.jsonl``; each must touch that node (422 otherwise)."""
    ingest.lock_cursor(session, kind, node_id, STREAM)
    ingest.check_start(session, kind, node_id, STREAM, start, end)
    keys = ["source_kind", "source_id", "target_kind", "target_id"]
    ingest.insert_ignore(session, Edge, edge_rows(kind, node_id, edges), keys)
    return ingest.advance(session, kind, node_id, STREAM, end)


def edge_rows(kind: str, node_id: str, edges: list[EdgeIn]) -> list[dict[str, Any]]:
    """The ``lineage`` rows of lines sent for a node (422 for a bad id, or an edge not touching that node)."""
    rows = []
    for edge in edges:
        naming.node_id(edge.source.id, "lineage source id")
        naming.node_id(edge.target.id, "lineage target id")
        if (kind, node_id) not in ((edge.source.kind, edge.source.id), (edge.target.kind, edge.target.id)):
            raise Invalid(f"a lineage edge sent for {kind} {node_id} must have that {kind} as its source or target")
        rows.append(
            {
                "source_kind": edge.source.kind,
                "source_id": edge.source.id,
                "source_name": edge.source.name[:100],
                "target_kind": edge.target.kind,
                "target_id": edge.target.id,
                "target_name": edge.target.name[:100],
                "time": edge.time,
            }
        )
    return rows


def edges_of(session: Session, kind: str, node_id: str, name: str, user: User, depth: int | None = 1) -> Lineage:
    """The lineage of a node the caller may view (named ``name``), ``depth`` levels each way (``None``:
    all), as they may see it (see the module).

    Each level is three queries (its counts, its edges, their nodes' names), whatever the number of
    nodes in it: the nodes reached at one level are the next level's frontier, bounded by
    :data:`MAX_NODES`.

    Example:
        >>> lineage = edges_of(session, "run", run.id, run.name, user, depth=None)
        >>> sorted(set(lineage.levels.values()))  # a chain of three runs read from its middle
        [-1, 0, 1]
    """
    folders = listing.visible_folders(user)  # a query: no list of ids however many folders one may view
    source_ok = _visible(session, user, folders, Edge.source_kind, Edge.source_id)
    target_ok = _visible(session, user, folders, Edge.target_kind, Edge.target_id)
    me = (kind, node_id)
    levels = {me: 0}
    entered: dict[int, set[NodeKey]] = {-1: {me}, 1: {me}}  # -1 upstream, 1 downstream: once a way each
    frontier: dict[int, set[NodeKey]] = {-1: {me}, 1: {me}}
    kept: list[Any] = []
    hidden = more = level = 0
    while (frontier[-1] or frontier[1]) and (depth is None or level < depth) and not more:
        level += 1
        up = _among(Edge.target_kind, Edge.target_id, frontier[-1])
        down = _among(Edge.source_kind, Edge.source_id, frontier[1])
        found = or_(up, down) if not kept else and_(or_(up, down), Edge.id.not_in([row.id for row in kept]))
        shown = or_(and_(up, source_ok), and_(down, target_ok))
        total, seen = session.execute(select(func.count(), func.count(case((shown, 1)))).where(found)).one()
        hidden += int(total) - int(seen)
        rows = session.execute(
            select(Edge.id, Edge.time, Edge.source_kind, Edge.source_id, Edge.target_kind, Edge.target_id)
            .add_columns(source_ok.label("source_ok"), target_ok.label("target_ok"))
            .where(found, shown)
            .order_by(Edge.time, Edge.id)
            .limit(MAX_EDGES - len(kept))
        ).all()
        more += int(seen) - len(rows)
        reached: dict[int, set[NodeKey]] = {-1: set(), 1: set()}
        for row in rows:
            source, target = (row.source_kind, row.source_id), (row.target_kind, row.target_id)
            steps = [(-1, source)] if target in frontier[-1] and row.source_ok else []
            steps += [(1, target)] if source in frontier[1] and row.target_ok else []
            if len(levels) + len({node for _, node in steps if node not in levels}) > MAX_NODES:
                more += 1
                continue
            kept.append(row)
            for way, node in steps:
                levels.setdefault(node, way * level)
                if node not in entered[way]:
                    entered[way].add(node)
                    reached[way].add(node)
        frontier = reached
    names = _names(session, "run", [i for k, i in levels if k == "run"])
    names.update(_names(session, "artifact", [i for k, i in levels if k == "artifact"]))
    names[me] = name

    def end(node: NodeKey) -> dict[str, Any]:
        return {"kind": node[0], "id": node[1], "name": names.get(node, ""), "visible": True}

    out = [
        {"time": r.time, "source": end((r.source_kind, r.source_id)), "target": end((r.target_kind, r.target_id))}
        for r in kept
    ]
    return Lineage(out, hidden, more, levels, depth)


def touching(lineage: Lineage, kind: str, node_id: str) -> list[dict[str, Any]]:
    """The edges of ``lineage`` with the node (``kind``, ``node_id``) as an end: its own inputs and outputs."""
    return [e for e in lineage.edges if (kind, node_id) in ((e[w]["kind"], e[w]["id"]) for w in ("source", "target"))]


def lineage_fields(lineage: Lineage) -> dict[str, Any]:
    """A lineage as the API answers it: ``lineage`` (the edges), ``lineage_hidden``, ``lineage_more``,
    ``lineage_depth`` (a number, or ``"all"``) and ``lineage_levels`` (``[{"kind", "id", "level"}]``,
    the node itself at 0, inputs below, outputs above)."""
    return {
        "lineage": lineage.edges,
        "lineage_hidden": lineage.hidden,
        "lineage_more": lineage.more,
        "lineage_depth": "all" if lineage.depth is None else lineage.depth,
        "lineage_levels": [{"kind": k, "id": i, "level": n} for (k, i), n in lineage.levels.items()],
    }


def _among(kinds: Any, ids: Any, nodes: set[NodeKey]) -> ColumnElement[bool]:
    """An edge end (its kind and id columns) is one of ``nodes`` (at most :data:`MAX_NODES`)."""
    by_kind = {k: sorted(i for kk, i in nodes if kk == k) for k in ("run", "artifact")}
    return or_(false(), *(and_(kinds == k, ids.in_(i)) for k, i in by_kind.items() if i))


def _visible(session: Session, user: User, folders: Any, kinds: Any, ids: Any) -> ColumnElement[bool]:
    """An edge end (its kind and id columns) is a run or artifact ``user`` may view."""
    return or_(
        and_(kinds == "run", exists().where(Run.id == ids, listing.visible_condition(session, user, Run, folders))),
        and_(
            kinds == "artifact",
            exists().where(Artifact.id == ids, listing.visible_condition(session, user, Artifact, folders)),
        ),
    )


def _names(session: Session, kind: str, ids: list[str]) -> dict[tuple[str, str], str]:
    if not ids:
        return {}
    model = Run if kind == "run" else Artifact
    return {(kind, i): n for i, n in session.execute(select(model.id, model.name).where(model.id.in_(set(ids))))}

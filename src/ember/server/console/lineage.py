"""The lineage graph of a run or artifact: inputs on the left, the node, outputs on the right.

Laid out on the server as SVG with links, so it needs no script. A neighbour the viewer may
not see is left out (its name would leak); one that was never uploaded is shown greyed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ember.server.console.session import PREFIX
from ember.server.models import Artifact, Run, User
from ember.server.perms import Level, level

NODE_W, NODE_H, GAP_Y, COL_X = 200, 44, 16, (10, 290, 570)


@dataclass
class Node:
    """One box of the graph."""

    kind: str
    id: str
    name: str
    href: str | None
    x: int
    y: int
    center: bool = False


def _visible(session: Session, user: User, kind: str, node_id: str) -> tuple[bool, str | None]:
    """(uploaded, name if the viewer may see it)."""
    node: Run | Artifact | None
    if kind == "run":
        node = session.scalar(select(Run).where(Run.id == node_id))
    else:
        node = session.scalar(select(Artifact).where(Artifact.id == node_id))
    if node is None:
        return False, None
    return True, node.name if level(session, user, node) >= Level.VIEW else None


def graph(session: Session, user: User, kind: str, node_id: str, name: str, edges: list[dict[str, Any]]) -> dict:
    """Nodes, edges and the canvas size for ``_lineage.html``."""
    inputs: dict[str, dict[str, Any]] = {}
    outputs: dict[str, dict[str, Any]] = {}
    for e in edges:
        if e["target"]["id"] == node_id and e["source"]["id"] != node_id:
            inputs[e["source"]["id"]] = e["source"]
        elif e["source"]["id"] == node_id and e["target"]["id"] != node_id:
            outputs[e["target"]["id"]] = e["target"]
    columns: list[list[Node]] = [[], [], []]
    for index, ends in ((0, inputs), (2, outputs)):
        for end in ends.values():
            uploaded, shown = _visible(session, user, end["kind"], end["id"])
            if uploaded and shown is None:
                continue
            href = f"{PREFIX}/{end['kind']}s/{end['id']}" if uploaded else None
            label = shown if shown is not None else "(not on the server)"
            columns[index].append(Node(end["kind"], end["id"], label, href, COL_X[index], 0))
    columns[1].append(Node(kind, node_id, name, None, COL_X[1], 0, center=True))
    height = max(len(c) for c in columns) * (NODE_H + GAP_Y) + GAP_Y
    for col in columns:
        top = (height - len(col) * (NODE_H + GAP_Y) + GAP_Y) // 2
        for i, node in enumerate(col):
            node.y = top + i * (NODE_H + GAP_Y)
    center = columns[1][0]
    lines = [(n.x + NODE_W, n.y + NODE_H // 2, center.x, center.y + NODE_H // 2) for n in columns[0]]
    lines += [(center.x + NODE_W, center.y + NODE_H // 2, n.x, n.y + NODE_H // 2) for n in columns[2]]
    return {
        "nodes": [n for c in columns for n in c],
        "lines": lines,
        "width": COL_X[2] + NODE_W + 10,
        "height": height,
        "w": NODE_W,
        "h": NODE_H,
        "empty": not columns[0] and not columns[2],
    }

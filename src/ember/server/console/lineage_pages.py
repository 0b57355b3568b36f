"""The lineage graph of a run or artifact: inputs on the left, the node, outputs on the right.

Laid out on the server as SVG with links, so it needs no script. It draws only the edges whose
other end the viewer may view (:func:`ember.server.services.edges.edges_of`); the others are only
counted below it, one number for edges to private runs and artifacts and to ones never
uploaded, so the graph tells nobody whether a private node exists, and nobody can draw on
another user's graph from a node that user cannot see.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ember.server.console.session import PREFIX
from ember.server.services.edges import MAX_EDGES, Lineage

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


def graph_of(kind: str, node_id: str, name: str, lineage: Lineage) -> dict:
    """Nodes, edges, the canvas size and the hidden edges' count for ``_lineage.html``."""
    me = (kind, node_id)
    inputs: dict[tuple[str, str], dict[str, Any]] = {}
    outputs: dict[tuple[str, str], dict[str, Any]] = {}
    for e in lineage.edges:
        source, target = (e["source"]["kind"], e["source"]["id"]), (e["target"]["kind"], e["target"]["id"])
        if target == me and source != me:
            inputs[source] = e["source"]
        elif source == me and target != me:
            outputs[target] = e["target"]
    columns: list[list[Node]] = [[], [], []]
    for index, ends in ((0, inputs), (2, outputs)):
        for end in ends.values():
            href = f"{PREFIX}/{end['kind']}s/{end['id']}"
            columns[index].append(Node(end["kind"], end["id"], end["name"], href, COL_X[index], 0))
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
        "hidden": lineage.hidden,
        "more": lineage.more,
        "max": MAX_EDGES,
    }

"""The lineage graph of a run or artifact: inputs on the left, the node, outputs on the right.

Laid out on the server as SVG with links, so it needs no script. A neighbour the viewer may
not see is shown exactly like one that was never uploaded: greyed, without name or link (the
edges come from :func:`ember.server.ingest.edges_of`, which masks them), so the graph tells
nobody whether a private run or artifact exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ember.server.console.session import PREFIX

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


HIDDEN = "(missing or not shared)"  # short enough not to be truncated in its box


def graph(kind: str, node_id: str, name: str, edges: list[dict[str, Any]]) -> dict:
    """Nodes, edges and the canvas size for ``_lineage.html`` (``edges`` as the viewer may see them)."""
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
            href = f"{PREFIX}/{end['kind']}s/{end['id']}" if end["visible"] else None
            label = end["name"] if end["visible"] else HIDDEN
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

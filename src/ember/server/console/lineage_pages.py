"""The lineage graph of a run or artifact: one column a level, inputs left, the node, outputs right.

Laid out on the server as SVG with links, so it needs no script. ``?lineage_depth=`` (1, 2, ...
or ``all``) picks how many levels each way the walk reads
(:func:`ember.server.services.edges.edges_of`): the page's depth links change it. The graph draws
only the edges whose other end the viewer may view; the others are only counted below it, one
number for edges to private runs and artifacts and to ones never uploaded, so the graph tells
nobody whether a private node exists, and nobody can draw on another user's graph from a node that
user cannot see. What the walk's caps left out is counted too.
"""

from __future__ import annotations

from dataclasses import dataclass

from ember.server.console.session import PREFIX
from ember.server.services.edges import MAX_EDGES, MAX_NODES, Lineage

NODE_W, NODE_H, GAP_Y, COL_STEP, BEND, LOOP = 200, 44, 16, 280, 60, 36
DEPTHS = ("1", "2", "3", "all")
"""The depth links offered above the graph (any other number can be typed in the address)."""


@dataclass
class Node:
    """One box of the graph."""

    kind: str
    id: str
    name: str
    href: str | None
    level: int
    x: int
    y: int
    center: bool = False


def graph_of(kind: str, node_id: str, name: str, lineage: Lineage) -> dict:
    """Nodes, edges (SVG paths), the canvas size, the depth and what was left out for ``_lineage.html``."""
    me = (kind, node_id)
    names = {me: name}
    for e in lineage.edges:
        for end in (e["source"], e["target"]):
            names[(end["kind"], end["id"])] = end["name"]
    levels = lineage.levels or {me: 0}
    low = min(levels.values())
    columns: dict[int, list[Node]] = {}
    for (k, i), level in levels.items():
        href = None if (k, i) == me else f"{PREFIX}/{k}s/{i}"
        node = Node(k, i, names.get((k, i), ""), href, level, 10 + (level - low) * COL_STEP, 0, (k, i) == me)
        columns.setdefault(level, []).append(node)
    height = max(len(c) for c in columns.values()) * (NODE_H + GAP_Y) + GAP_Y
    for col in columns.values():
        top = (height - len(col) * (NODE_H + GAP_Y) + GAP_Y) // 2
        for row, node in enumerate(col):
            node.y = top + row * (NODE_H + GAP_Y)
    boxes = {(n.kind, n.id): n for col in columns.values() for n in col}
    paths = []
    below = height + LOOP  # back edges (a cycle, or an edge within a level) loop under the boxes
    for e in lineage.edges:
        source = boxes[(e["source"]["kind"], e["source"]["id"])]
        target = boxes[(e["target"]["kind"], e["target"]["id"])]
        if target.x > source.x:  # forwards: leaves right, arrives from the left
            x1, y1, x2, y2 = source.x + NODE_W, source.y + NODE_H // 2, target.x, target.y + NODE_H // 2
            paths.append((f"M{x1},{y1} C{x1 + BEND},{y1} {x2 - BEND},{y2} {x2},{y2}", False))
        else:
            x1, y1, x2, y2 = source.x + NODE_W // 2, source.y + NODE_H, target.x + NODE_W // 3, target.y + NODE_H
            paths.append((f"M{x1},{y1} C{x1},{below} {x2},{below} {x2},{y2}", True))
    if any(back for _, back in paths):
        height += LOOP
    width = (max(levels.values()) - low) * COL_STEP + NODE_W + 20
    depth = "all" if lineage.depth is None else str(lineage.depth)
    return {
        "nodes": [n for level in sorted(columns) for n in columns[level]],
        "paths": paths,
        "width": width,
        "height": height,
        "w": NODE_W,
        "h": NODE_H,
        "empty": len(levels) == 1,
        "hidden": lineage.hidden,
        "more": lineage.more,
        "max_edges": MAX_EDGES,
        "max_nodes": MAX_NODES,
        "depth": depth,
        "depths": DEPTHS if depth in DEPTHS else (*DEPTHS[:-1], depth, DEPTHS[-1]),
    }

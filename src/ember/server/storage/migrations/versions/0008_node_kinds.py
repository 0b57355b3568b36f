"""Cursors and lineage edges are keyed by the node's kind and id, not by the id alone.

A run and an artifact could hold the same id (each kind checked only its own table), and the
cursors of that id, and its lineage, were one: an artifact made with the id of someone's run
moved the run's ``lineage.jsonl`` cursor and drew edges on it, and deleting the artifact
deleted the run's cursors. ``cursors.node_kind`` is added and filled from the table holding
the id; a cursor of an id that both kinds hold goes to the run for the run's own files
(metrics, output, images), and its ``lineage.jsonl`` cursor is dropped, so both nodes send
their lineage again from the start (edges are stored once, so nothing doubles). Cursors of
nodes that are gone are dropped. ``uq_cursor`` becomes (kind, id, stream); ``uq_edge``
(source kind, source id, target kind, target id).

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_RUN = "node_id IN (SELECT id FROM runs)"
_ARTIFACT = "node_id IN (SELECT id FROM artifacts)"


def upgrade() -> None:
    with op.batch_alter_table("cursors") as batch:
        batch.add_column(sa.Column("node_kind", sa.String(length=16), nullable=True))
    for statement in (
        f"UPDATE cursors SET node_kind = 'run' WHERE {_RUN} AND NOT {_ARTIFACT}",
        f"UPDATE cursors SET node_kind = 'artifact' WHERE {_ARTIFACT} AND NOT {_RUN}",
        f"UPDATE cursors SET node_kind = 'run' WHERE node_kind IS NULL AND {_RUN} AND stream <> 'lineage.jsonl'",
        "DELETE FROM cursors WHERE node_kind IS NULL",
    ):
        op.execute(sa.text(statement))
    with op.batch_alter_table("cursors") as batch:
        batch.alter_column("node_kind", existing_type=sa.String(length=16), nullable=False)
        batch.drop_constraint("uq_cursor", type_="unique")
        batch.create_unique_constraint("uq_cursor", ["node_kind", "node_id", "stream"])
    with op.batch_alter_table("lineage") as batch:
        batch.drop_constraint("uq_edge", type_="unique")
        batch.create_unique_constraint("uq_edge", ["source_kind", "source_id", "target_kind", "target_id"])


def downgrade() -> None:
    # Edges that differ only by kind cannot live under the old key: the later ones go.
    op.execute(
        sa.text("DELETE FROM lineage WHERE id NOT IN (SELECT min(id) FROM lineage GROUP BY source_id, target_id)")
    )
    op.execute(sa.text("DELETE FROM cursors WHERE id NOT IN (SELECT min(id) FROM cursors GROUP BY node_id, stream)"))
    with op.batch_alter_table("lineage") as batch:
        batch.drop_constraint("uq_edge", type_="unique")
        batch.create_unique_constraint("uq_edge", ["source_id", "target_id"])
    with op.batch_alter_table("cursors") as batch:
        batch.drop_constraint("uq_cursor", type_="unique")
        batch.create_unique_constraint("uq_cursor", ["node_id", "stream"])
        batch.drop_column("node_kind")

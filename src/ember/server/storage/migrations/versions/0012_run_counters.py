"""A run counts its metric points and distinct metrics; a user's runs and folders are indexed by owner.

``runs.metric_points`` (the points stored) puts points in the owner's quota and
``runs.metric_names`` (the distinct type and name pairs) bounds a run's metrics
(``--max-run-metrics``): both are kept by ingest in the transaction that inserts the points, so
neither check counts points. Filled here from ``metric_points``, one run at a time (each count
is one range of the table's key). ``ix_runs_owner_id`` and ``ix_folders_owner_id`` let a user's
runs and folders be counted (``--max-user-runs``, ``--max-user-folders``) without reading
another user's.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # In place (SQLite adds a column with a constant default): a batch copy of ``runs`` would lose
    # the expression index of migration 0005, which SQLite cannot reflect.
    op.add_column("runs", sa.Column("metric_points", sa.BigInteger(), server_default="0", nullable=False))
    op.add_column("runs", sa.Column("metric_names", sa.Integer(), server_default="0", nullable=False))
    op.create_index("ix_runs_owner_id", "runs", ["owner_id"], unique=False)
    op.create_index("ix_folders_owner_id", "folders", ["owner_id"], unique=False)
    conn = op.get_bind()
    points = sa.table("metric_points", sa.column("run_pk"), sa.column("type"), sa.column("name"))
    runs = [pk for (pk,) in conn.execute(sa.text("SELECT pk FROM runs"))]
    for run_pk in runs:
        mine = points.c.run_pk == run_pk
        count = conn.execute(sa.select(sa.func.count()).select_from(points).where(mine)).scalar_one()
        if not count:
            continue
        series = sa.select(points.c.type, points.c.name).where(mine).distinct().subquery()
        names = conn.execute(sa.select(sa.func.count()).select_from(series)).scalar_one()
        conn.execute(
            sa.text("UPDATE runs SET metric_points = :points, metric_names = :names WHERE pk = :pk"),
            {"points": count, "names": names, "pk": run_pk},
        )


def downgrade() -> None:
    op.drop_index("ix_folders_owner_id", table_name="folders")
    op.drop_index("ix_runs_owner_id", table_name="runs")
    op.drop_column("runs", "metric_names")  # SQLite 3.35 and later drop a column in place
    op.drop_column("runs", "metric_points")

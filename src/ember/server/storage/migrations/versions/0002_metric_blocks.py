"""Metric points keyed by series (run, type, name, step), and block summaries for charts.

``metric_points`` is rebuilt without its surrogate id: the (run, type, step, name) unique index
becomes the primary key (run, type, name, step), so a series is one key range, and on SQLite
the table is that one B-tree (``WITHOUT ROWID``). ``metric_blocks`` holds, per metric and per
128 steps, the min/max/count that charts read; it is filled here from the points already stored.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

BLOCK = 128  # frozen here: models.BLOCK may change only with a migration that rebuilds metric_blocks
_COLUMNS = "run_pk, type, name, step, epoch, time, value"


def _points_table(name: str, with_id: bool) -> None:
    key = [sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False)] if with_id else []
    constraints = (
        [sa.PrimaryKeyConstraint("id"), sa.UniqueConstraint("run_pk", "type", "step", "name", name="uq_point")]
        if with_id
        else [sa.PrimaryKeyConstraint("run_pk", "type", "name", "step", name="pk_metric_points")]
    )
    op.create_table(
        name,
        *key,
        sa.Column("run_pk", sa.Integer(), nullable=False),
        sa.Column("type", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("step", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("epoch", sa.Float(), nullable=True),
        sa.Column("time", sa.Float(), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["run_pk"], ["runs.pk"], ondelete="CASCADE", name="metric_points_run_pk_fkey"),
        *constraints,
        sqlite_with_rowid=with_id,
    )


def _rebuild_points(with_id: bool) -> None:
    _points_table("metric_points_rebuilt", with_id)
    op.execute(sa.text(f"INSERT INTO metric_points_rebuilt ({_COLUMNS}) SELECT {_COLUMNS} FROM metric_points"))
    op.drop_table("metric_points")
    op.rename_table("metric_points_rebuilt", "metric_points")


def upgrade() -> None:
    _rebuild_points(with_id=False)
    op.create_table(
        "metric_blocks",
        sa.Column("run_pk", sa.Integer(), nullable=False),
        sa.Column("type", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("block", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("first_step", sa.BigInteger(), nullable=False),
        sa.Column("last_step", sa.BigInteger(), nullable=False),
        sa.Column("min_epoch", sa.Float(), nullable=True),
        sa.Column("max_epoch", sa.Float(), nullable=True),
        sa.Column("min_value", sa.Float(), nullable=True),
        sa.Column("max_value", sa.Float(), nullable=True),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["run_pk"], ["runs.pk"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_pk", "type", "name", "block", name="pk_metric_blocks"),
        sqlite_with_rowid=False,
    )
    # Steps are never negative, so integer division is the floor on SQLite and PostgreSQL alike.
    op.execute(
        sa.text(
            "INSERT INTO metric_blocks (run_pk, type, name, block, first_step, last_step, min_epoch, max_epoch,"
            " min_value, max_value, count)"
            f" SELECT run_pk, type, name, step / {BLOCK}, min(step), max(step), min(epoch), max(epoch),"
            " min(value), max(value), count(*)"
            f" FROM metric_points GROUP BY run_pk, type, name, step / {BLOCK}"
        )
    )


def downgrade() -> None:
    op.drop_table("metric_blocks")
    _rebuild_points(with_id=True)

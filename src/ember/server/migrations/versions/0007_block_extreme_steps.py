"""Block summaries keep the step of their minimum and of their maximum.

``metric_blocks.min_step``/``max_step``: the first step of the block holding its ``min_value``/
``max_value``, so a chart draws each extreme at its exact step from the summaries alone (before,
the first view of a long run after a server start looked each one up among its block's points).
Filled here from the points already stored; NULL where every value of the block is NaN.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def _first_step_holding(column: str) -> str:
    return (
        "(SELECT min(p.step) FROM metric_points p WHERE p.run_pk = metric_blocks.run_pk"
        " AND p.type = metric_blocks.type AND p.name = metric_blocks.name"
        " AND p.step BETWEEN metric_blocks.first_step AND metric_blocks.last_step"
        f" AND p.value = metric_blocks.{column})"
    )


def upgrade() -> None:
    op.add_column("metric_blocks", sa.Column("min_step", sa.BigInteger(), nullable=True))
    op.add_column("metric_blocks", sa.Column("max_step", sa.BigInteger(), nullable=True))
    op.execute(
        sa.text(
            f"UPDATE metric_blocks SET min_step = {_first_step_holding('min_value')},"
            f" max_step = {_first_step_holding('max_value')}"
        )
    )


def downgrade() -> None:
    op.drop_column("metric_blocks", "max_step")  # SQLite 3.35 and later drop a column in place
    op.drop_column("metric_blocks", "min_step")

"""Block summaries keep where their minimum and their maximum are.

``metric_blocks.min_at_step``/``min_at_epoch``/``min_at_time``: the step, epoch and time of the
first point of the block holding its ``min_value``; ``max_at_*`` the same for ``max_value``. A
chart then draws each extreme at its exact step (epoch, time) from the summaries alone; before,
the first view of a long run after a server start looked each one up among its block's points.
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

_COLUMNS: dict[str, type[sa.BigInteger] | type[sa.Float]] = {
    "min_at_step": sa.BigInteger,
    "min_at_epoch": sa.Float,
    "min_at_time": sa.Float,
    "max_at_step": sa.BigInteger,
    "max_at_epoch": sa.Float,
    "max_at_time": sa.Float,
}
_SERIES = "p.run_pk = metric_blocks.run_pk AND p.type = metric_blocks.type AND p.name = metric_blocks.name"


def _first_step_holding(extreme: str) -> str:
    return (
        f"(SELECT min(p.step) FROM metric_points p WHERE {_SERIES}"
        " AND p.step BETWEEN metric_blocks.first_step AND metric_blocks.last_step"
        f" AND p.value = metric_blocks.{extreme})"
    )


def _at(column: str, step: str) -> str:
    return f"(SELECT p.{column} FROM metric_points p WHERE {_SERIES} AND p.step = metric_blocks.{step})"


def upgrade() -> None:
    for name, type_ in _COLUMNS.items():
        op.add_column("metric_blocks", sa.Column(name, type_(), nullable=True))
    op.execute(
        sa.text(
            f"UPDATE metric_blocks SET min_at_step = {_first_step_holding('min_value')},"
            f" max_at_step = {_first_step_holding('max_value')}"
        )
    )
    op.execute(
        sa.text(
            f"UPDATE metric_blocks SET min_at_epoch = {_at('epoch', 'min_at_step')},"
            f" min_at_time = {_at('time', 'min_at_step')}, max_at_epoch = {_at('epoch', 'max_at_step')},"
            f" max_at_time = {_at('time', 'max_at_step')}"
        )
    )


def downgrade() -> None:
    for name in reversed(_COLUMNS):  # SQLite 3.35 and later drop a column in place
        op.drop_column("metric_blocks", name)

"""Images a run logged (``run.log_image``), sent by ``POST /runs/{id}/images``.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_images",
        sa.Column("run_pk", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("step", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
        sa.Column("width", sa.Integer(), nullable=False),
        sa.Column("height", sa.Integer(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("png", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["run_pk"], ["runs.pk"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_pk", "name", "step", name="pk_run_images"),
    )


def downgrade() -> None:
    op.drop_table("run_images")

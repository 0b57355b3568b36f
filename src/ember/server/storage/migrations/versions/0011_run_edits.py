"""Runs edited on the server, and the trash (``runs.edited``, ``runs.deleted``).

``edited`` lists the fields of a run changed on the server (``name``, ``labels``,
``description``): a later upload of the run's ``run.json`` leaves those alone. ``deleted`` is
when the run was moved to the trash (NULL: not in the trash); a run in the trash is hidden
from every page and listing, restorable, and purged after ``TRASH_DAYS``.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("edited", sa.JSON(), nullable=False, server_default="[]"))
        batch.add_column(sa.Column("deleted", sa.DateTime(timezone=True), nullable=True))
        batch.create_index(batch.f("ix_runs_deleted"), ["deleted"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_index(batch.f("ix_runs_deleted"))
        batch.drop_column("deleted")
        batch.drop_column("edited")

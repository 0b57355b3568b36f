"""A user's row keeps a bound on the bytes their storage holds, for the quota's check.

``users.stored_bytes`` is never below what ``blobs.usage`` sums for the user: each write that adds
to their storage raises it in its transaction, under the lock of the row, so the quota's check
adds what a request stored to it instead of summing the user's whole store; only a bound past
the quota is summed again (exactly). NULL (every row here) means not known yet: the user's next
check sums their store once and keeps the result, so there is nothing to fill at the upgrade.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("users", sa.Column("stored_bytes", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column("users", "stored_bytes")  # SQLite 3.35 and later drop a column in place

"""API keys remember the key that minted them (``api_keys.parent_id``).

A key made through ``POST /api/v1/keys`` (or the first key of a user an admin creates through
the API) expires no later than the key that made it, and revoking that key revokes it too.
Keys made before have no parent: they keep the expiry they were given.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("parent_id", sa.Integer(), nullable=True))
        batch.create_foreign_key("fk_api_keys_parent_id", "api_keys", ["parent_id"], ["id"], ondelete="CASCADE")
        batch.create_index(batch.f("ix_api_keys_parent_id"), ["parent_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_index(batch.f("ix_api_keys_parent_id"))
        batch.drop_constraint("fk_api_keys_parent_id", type_="foreignkey")
        batch.drop_column("parent_id")

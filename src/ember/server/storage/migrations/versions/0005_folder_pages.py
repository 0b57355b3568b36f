"""A folder's contents in pages: indexes for the runs newest first and the artifacts by name.

``GET /api/v1/folders`` answers a page at a time from where the last page ended
(``ember.server.services.folder_paging``); these indexes make each page an index range.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_runs_folder_start", "runs", ["folder_id", sa.text("coalesce(start_time, '')"), "pk"], unique=False
    )
    op.create_index("ix_artifacts_folder_name", "artifacts", ["folder_id", "name", "pk"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_artifacts_folder_name", table_name="artifacts")
    op.drop_index("ix_runs_folder_start", table_name="runs")

"""Blobs are private, folder trees have one owner.

``blob_uploads`` records who uploaded a blob's bytes (only they, and viewers of an artifact
holding it, may list it in an artifact); the owner of each artifact that lists a blob now is
taken as one of its uploaders. ``artifact_files.sha256`` gets an index (which artifacts hold a
blob: the permission check and the collection of unreferenced blobs). Every folder, run and
artifact is given to the owner of the home its folder tree starts at: an editor who created a
sub-folder in a shared folder no longer owns it.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# The home a folder lies in: the root folder whose path is the folder's or a prefix of it up to a '/'.
_HOME_OWNER = (
    "(SELECT h.owner_id FROM folders h WHERE h.parent_id IS NULL AND "
    "(h.path = folders.path OR substr(folders.path, 1, length(h.path) + 1) = h.path || '/'))"
)


def upgrade() -> None:
    op.create_table(
        "blob_uploads",
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("uploaded", sa.DateTime(timezone=True), nullable=False),
        sa.Column("pending_until", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["sha256"], ["blobs.sha256"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("sha256", "user_id", name="pk_blob_uploads"),
    )
    op.create_index(op.f("ix_blob_uploads_user_id"), "blob_uploads", ["user_id"], unique=False)
    op.create_index(op.f("ix_artifact_files_sha256"), "artifact_files", ["sha256"], unique=False)
    op.execute(
        sa.text(
            "INSERT INTO blob_uploads (sha256, user_id, uploaded) "
            "SELECT DISTINCT f.sha256, a.owner_id, b.created FROM artifact_files f "
            "JOIN artifacts a ON a.pk = f.artifact_pk JOIN blobs b ON b.sha256 = f.sha256"
        )
    )
    op.execute(sa.text(f"UPDATE folders SET owner_id = {_HOME_OWNER} WHERE {_HOME_OWNER} IS NOT NULL"))
    for table in ("runs", "artifacts"):
        op.execute(
            sa.text(f"UPDATE {table} SET owner_id = (SELECT f.owner_id FROM folders f WHERE f.id = {table}.folder_id)")
        )


def downgrade() -> None:
    op.drop_index(op.f("ix_artifact_files_sha256"), table_name="artifact_files")
    op.drop_index(op.f("ix_blob_uploads_user_id"), table_name="blob_uploads")
    op.drop_table("blob_uploads")

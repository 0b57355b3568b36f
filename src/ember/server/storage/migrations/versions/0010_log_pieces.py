"""A run's output is stored in pieces numbered by line (``log_pieces``), and its size on the run.

``log_chunks`` held each upload request's text as one row (up to 16 Mi characters), so the run
page read and split the whole output on every view. ``log_pieces`` holds it in pieces of at most
65,536 characters, each with its offset in the stored text (UTF-8 bytes), the line it starts in
and its newlines: the tail, a window of lines or a search reads a few pieces by key. Filled here
from ``log_chunks``, one run at a time and one chunk at a time (a run's output is never held
whole); ``runs.log_bytes`` is set to each run's stored size. ``log_chunks`` is dropped.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

# The piece size of this revision, kept here: a migration keeps writing the schema of its
# revision whatever ember.server.services.logs does later.
PIECE_CHARS = 1 << 16

_pieces = sa.table(
    "log_pieces",
    sa.column("run_pk", sa.Integer),
    sa.column("start", sa.BigInteger),
    sa.column("end", sa.BigInteger),
    sa.column("line", sa.BigInteger),
    sa.column("newlines", sa.Integer),
    sa.column("text", sa.Text),
)


def _flush(conn: Any, run_pk: int, text: str, start: int, line: int, final: bool) -> tuple[str, int, int]:
    """Write the whole pieces of ``text`` (the last, short one too when ``final``); return what is left."""
    rows: list[dict[str, Any]] = []
    whole = len(text) if final else len(text) - len(text) % PIECE_CHARS
    for at in range(0, whole, PIECE_CHARS):
        part = text[at : min(at + PIECE_CHARS, whole)]
        size, newlines = len(part.encode("utf-8")), part.count("\n")
        rows.append({"run_pk": run_pk, "start": start, "end": start + size, "line": line, "newlines": newlines})
        rows[-1]["text"] = part
        start, line = start + size, line + newlines
    if rows:
        conn.execute(_pieces.insert(), rows)
    return text[whole:], start, line


def upgrade() -> None:
    op.create_table(
        "log_pieces",
        sa.Column("run_pk", sa.Integer(), nullable=False),
        sa.Column("start", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("end", sa.BigInteger(), nullable=False),
        sa.Column("line", sa.BigInteger(), nullable=False),
        sa.Column("newlines", sa.Integer(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["run_pk"], ["runs.pk"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_pk", "start", name="pk_log_pieces"),
    )
    op.create_index("ix_log_pieces_line", "log_pieces", ["run_pk", "line"], unique=False)
    # In place (SQLite adds a column with a constant default): a batch copy of ``runs`` would lose
    # the expression index of migration 0005, which SQLite cannot reflect.
    op.add_column("runs", sa.Column("log_bytes", sa.BigInteger(), server_default="0", nullable=False))
    conn = op.get_bind()
    chunks = sa.table("log_chunks", sa.column("id"), sa.column("run_pk"), sa.column("start"), sa.column("text"))
    runs = [r for (r,) in conn.execute(sa.select(chunks.c.run_pk).distinct())]
    for run_pk in runs:
        ids = [i for (i,) in conn.execute(sa.select(chunks.c.id).where(chunks.c.run_pk == run_pk).order_by("start"))]
        left, start, line = "", 0, 0
        for chunk_id in ids:
            text = conn.execute(sa.select(chunks.c.text).where(chunks.c.id == chunk_id)).scalar_one()
            left, start, line = _flush(conn, run_pk, left + text, start, line, final=False)
        _, start, _ = _flush(conn, run_pk, left, start, line, final=True)
        conn.execute(sa.text("UPDATE runs SET log_bytes = :size WHERE pk = :pk"), {"size": start, "pk": run_pk})
    op.drop_table("log_chunks")


def downgrade() -> None:
    op.create_table(
        "log_chunks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_pk", sa.Integer(), nullable=False),
        sa.Column("start", sa.BigInteger(), nullable=False),
        sa.Column("end", sa.BigInteger(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["run_pk"], ["runs.pk"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("run_pk", "start", name="uq_log_chunk"),
    )
    op.execute(
        sa.text('INSERT INTO log_chunks (run_pk, start, "end", text) SELECT run_pk, start, "end", text FROM log_pieces')
    )
    op.drop_table("log_pieces")
    op.drop_column("runs", "log_bytes")  # SQLite 3.35 and later drop a column in place

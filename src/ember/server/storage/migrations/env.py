"""Alembic environment: runs the migrations on the connection :func:`ember.server.storage.db.migrate` gives."""

from __future__ import annotations

from alembic import context

from ember.server.storage.models import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()

"""Alembic migrations of the server's schema (run by :func:`ember.server.storage.db.migrate`)."""

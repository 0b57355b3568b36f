"""Alembic migrations of the server's schema (run by :func:`ember.server.db.migrate`)."""

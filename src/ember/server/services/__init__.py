"""The server's services: plain functions over a SQLAlchemy session (no HTTP), raising ``storage.domain_errors``."""

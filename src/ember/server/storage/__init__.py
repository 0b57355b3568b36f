"""The server's storage tier: the tables, the database and its migrations, request schemas, settings."""

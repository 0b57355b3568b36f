"""The server's HTTP API (``/api/v1``): routes, the API key check, the host guard, errors and responses."""

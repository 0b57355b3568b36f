"""``ember server``, ``ember server init|db upgrade|db current|user add|key create|key revoke``, ``ember login``,
``ember upload``.

Importing this module is cheap: FastAPI, SQLAlchemy and httpx are imported by the handlers.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys

from ember._subcommands import run_commands
from ember.errors import EmberError


def _settings(args: argparse.Namespace):
    from ember.server.storage.settings import MiB, Settings

    body = int(args.max_body_mb * MiB) if getattr(args, "max_body_mb", None) else None
    blob = int(args.max_blob_mb * MiB) if getattr(args, "max_blob_mb", None) else None
    quota = int(args.quota_mb * MiB) if getattr(args, "quota_mb", None) else None
    log = int(args.max_log_mb * MiB) if getattr(args, "max_log_mb", None) else None
    grace = args.blob_grace_hours * 3600 if getattr(args, "blob_grace_hours", None) is not None else None
    return Settings.make(
        data_dir=args.data,
        db_url=args.db,
        max_body_bytes=body,
        max_blob_bytes=blob,
        quota_bytes=quota,
        blob_grace_s=grace,
        allowed_hosts=_allowed_hosts(args) if hasattr(args, "allowed_hosts") else None,
        api_docs=True if getattr(args, "api_docs", False) else None,
        max_run_images=getattr(args, "max_run_images", None),
        max_log_bytes=log,
        max_user_runs=getattr(args, "max_user_runs", None),
        max_user_folders=getattr(args, "max_user_folders", None),
        max_run_metrics=getattr(args, "max_run_metrics", None),
    )


def _allowed_hosts(args: argparse.Namespace) -> list[str]:
    """``--allowed-hosts`` (comma-separated, repeatable), else loopback names and the ``--host`` address."""
    from ember.server.storage.settings import LOOPBACK_HOSTS

    if args.allowed_hosts:
        return [h for item in args.allowed_hosts for h in item.split(",") if h.strip()]
    listen = [] if args.host in ("0.0.0.0", "::", "") else [args.host]
    return [*LOOPBACK_HOSTS, *listen]


def cmd_serve(args: argparse.Namespace) -> int:
    """Check the schema once (an older one is refused), then serve with uvicorn (``--workers`` processes)."""
    import uvicorn

    from ember.server.storage.db import check_database, make_engine, prepare

    settings = _settings(args)
    engine = make_engine(settings.db_url)
    try:
        check_database(engine)
        prepare(engine)
    finally:
        engine.dispose()
    settings.export_env()
    where = engine.url.render_as_string(hide_password=True)
    print(f"ember server: database {where}, data {settings.data_dir}", file=sys.stderr, flush=True)
    uvicorn.run(
        "ember.server.app:app_from_env",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=args.log_level,
        proxy_headers=True,
    )
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    from ember.server.services import admin

    key = admin.init(_settings(args), args.admin)
    print(f"created admin {args.admin!r}; its API key (shown only now, store it safely):\n{key}")
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from ember.server.storage.db import upgrade_url

    settings = _settings(args)
    before, after = upgrade_url(settings.db_url)
    if before == after:
        print(f"the database is at the newest schema, {after}; nothing to do")
    else:
        print(f"upgraded the database from schema {before or '(none)'} to {after}")
    return 0


def cmd_db_current(args: argparse.Namespace) -> int:
    from ember.server.storage.db import check_database, current_revision, head_revision, make_engine, upgrade_command

    engine = make_engine(_settings(args).db_url)
    try:
        check_database(engine)
        current, head = current_revision(engine), head_revision()
        if current == head:
            print(f"{current} (the newest schema)")
        elif current is None:
            print(f"(none): no ember schema yet; `ember server init` creates schema {head}")
        else:
            print(f"{current} (this ember needs {head}: back the database up, then run `{upgrade_command(engine)}`)")
    finally:
        engine.dispose()
    return 0


def cmd_user_add(args: argparse.Namespace) -> int:
    from ember.server.services import admin

    key = admin.add_user(_settings(args), args.name, args.admin)
    print(f"created user {args.name!r}; its API key (shown only now):\n{key}")
    return 0


def cmd_key_create(args: argparse.Namespace) -> int:
    from ember.server.services import admin

    key = admin.create_key(_settings(args), args.user, args.label, args.expires_days)
    print(f"new API key for {args.user!r} (shown only now):\n{key}")
    return 0


def cmd_key_revoke(args: argparse.Namespace) -> int:
    from ember.server.services import admin

    key_id = admin.revoke_key(_settings(args), args.key)
    print(f"revoked key {key_id}")
    return 0


def cmd_login(args: argparse.Namespace) -> int:
    from ember.track.client import ENV_KEY, login

    key = args.api_key or os.environ.get(ENV_KEY)
    if not key:
        if not sys.stdin.isatty():
            raise EmberError(f"no API key: pass --api-key, set ${ENV_KEY}, or run `ember login` in a terminal")
        key = getpass.getpass("API key: ").strip()
    name = login(args.host, key)
    print(f"logged in to {args.host} as {name}")
    return 0


def cmd_logout(args: argparse.Namespace) -> int:
    from ember.track.client import logout

    print("logged out" if logout() else "was not logged in")
    return 0


def cmd_upload(args: argparse.Namespace) -> int:
    from ember.track.client import upload

    for result in upload(args.path, args.folder, args.make_folder, args.conflict):
        print(f"{result['action']:8} {result['id']} -> {result['folder']}")
    return 0


def cmd_ui(args: argparse.Namespace) -> int:
    from ember.server.local.ui import serve

    return serve(args.store, args.port, args.data)


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register ``server``, ``login``, ``logout``, ``upload`` and ``ui`` on the ``ember`` command.

    Example:
        >>> parser = argparse.ArgumentParser(prog="ember")
        >>> add_commands(parser.add_subparsers(dest="command"))
    """
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--db", metavar="URL", help="database URL (default sqlite:///DATA/ember.db; $EMBER_SERVER_DB)")
    where.add_argument("--data", metavar="DIR", help="blob and SQLite folder (default ./.ember-server)")
    # The subcommands take --db/--data too; their default must not overwrite one given before
    # the subcommand (`ember server --db URL init ...`), so there it is left unset.
    where_sub = argparse.ArgumentParser(add_help=False)
    where_sub.add_argument("--db", metavar="URL", default=argparse.SUPPRESS, help="as for `ember server`")
    where_sub.add_argument("--data", metavar="DIR", default=argparse.SUPPRESS, help="as for `ember server`")

    server = subparsers.add_parser("server", parents=[where], help="run the tracking server, or administer it")
    server.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    server.add_argument("--port", type=int, default=8765, help="port (default 8765)")
    server.add_argument("--workers", type=int, default=1, help="server processes (use PostgreSQL for more than 1)")
    server.add_argument("--max-body-mb", type=float, help="largest JSON request in MiB (2**20 bytes; default 32)")
    server.add_argument("--max-blob-mb", type=float, help="largest artifact file in MiB (2**20 bytes; default 8192)")
    server.add_argument(
        "--quota-mb",
        type=float,
        help="storage per user, artifact files, run images, run output and metric points, in MiB (2**20 bytes; "
        "default: no quota)",
    )
    server.add_argument("--max-run-images", type=int, help="the most images one run may hold (default 10000)")
    server.add_argument(
        "--max-log-mb", type=float, help="the most output (stdout.log) one run may hold, in MiB (default 64)"
    )
    server.add_argument(
        "--max-user-runs", type=int, help="the most runs one user's folders may hold (default 100000; 0: no limit)"
    )
    server.add_argument(
        "--max-user-folders", type=int, help="the most folders one user may hold (default 100000; 0: no limit)"
    )
    server.add_argument(
        "--max-run-metrics",
        type=int,
        help="the most distinct metrics (type and name) one run may hold (default 10000; 0: no limit)",
    )
    server.add_argument(
        "--blob-grace-hours", type=float, help="keep uploaded files no artifact lists this long (default 24)"
    )
    server.add_argument(
        "--allowed-hosts",
        action="append",
        metavar="NAMES",
        help="Host header names to answer, comma-separated, e.g. ember.example.org behind a proxy; '*': any "
        "(default: 127.0.0.1, localhost, ::1 and the --host address)",
    )
    server.add_argument(
        "--api-docs", action="store_true", help="serve the Swagger UI page /api/v1/docs (it loads a script from a CDN)"
    )
    server.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    server.set_defaults(handler=cmd_serve)
    sub = server.add_subparsers(dest="server_command", metavar="COMMAND")
    p = sub.add_parser("init", parents=[where_sub], help="create the database and the first admin; print its key")
    p.add_argument("--admin", required=True, metavar="NAME", help="the admin's user name")
    p.set_defaults(handler=cmd_init)
    db = sub.add_parser("db", help="the database's schema").add_subparsers(dest="db_command", required=True)
    p = db.add_parser(
        "upgrade", parents=[where_sub], help="bring the schema to this ember's newest (back the database up first)"
    )
    p.set_defaults(handler=cmd_db_upgrade)
    p = db.add_parser("current", parents=[where_sub], help="print the schema revision and whether it is the newest")
    p.set_defaults(handler=cmd_db_current)
    user = sub.add_parser("user", help="manage users").add_subparsers(dest="user_command", required=True)
    p = user.add_parser("add", parents=[where_sub], help="add a user; print its first key")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--admin", action="store_true", help="make the user an admin")
    p.set_defaults(handler=cmd_user_add)
    key = sub.add_parser("key", help="manage API keys").add_subparsers(dest="key_command", required=True)
    p = key.add_parser("create", parents=[where_sub], help="a new key for a user (printed once)")
    p.add_argument("user", metavar="USER")
    p.add_argument("--label", default="", help="a note on what the key is for")
    p.add_argument("--expires-days", type=float, help="expire after this many days")
    p.set_defaults(handler=cmd_key_create)
    p = key.add_parser("revoke", parents=[where_sub], help="revoke a key (the key or its id)")
    p.add_argument("key", metavar="KEY_OR_ID")
    p.set_defaults(handler=cmd_key_revoke)

    p = subparsers.add_parser("login", help="store a tracking server's address and your API key")
    p.add_argument("--host", required=True, help="e.g. http://127.0.0.1:8765")
    p.add_argument("--api-key", help="the key (prompted for when omitted; $EMBER_API_KEY)")
    p.set_defaults(handler=cmd_login)
    p = subparsers.add_parser("logout", help="forget the stored server credentials")
    p.set_defaults(handler=cmd_logout)
    p = subparsers.add_parser("upload", help="upload a run, an artifact, or a whole local store")
    p.add_argument("path", metavar="PATH", help="a run or artifact folder, or a store root (.ember)")
    p.add_argument("--folder", help="server folder (relative: under your home; default: each run's own)")
    p.add_argument("--make-folder", action="store_true", help="create the folder when missing")
    p.add_argument("--conflict", default="new", choices=("new", "skip", "error", "replace"))
    p.set_defaults(handler=cmd_upload)
    p = subparsers.add_parser(
        "ui", help="browse a local store's runs in the web console (loopback, opened by the link it prints)"
    )
    p.add_argument("--store", metavar="DIR", help="store root (default: $EMBER_HOME or ./.ember)")
    p.add_argument("--port", type=int, default=8766, help="loopback port (default 8766)")
    p.add_argument("--data", metavar="DIR", help="keep the console's database here (default: a temporary folder)")
    p.set_defaults(handler=cmd_ui)


def main(argv: list[str] | None = None) -> int:
    """Run these commands on their own: ``python -m ember.server.cli server --port 8765``."""
    return run_commands(add_commands, argv)


if __name__ == "__main__":
    sys.exit(main())

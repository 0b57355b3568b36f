"""Administration straight on the database: the first admin, users, keys (``ember server ...``).

There is no default account and no sign-up: ``init`` creates the first admin and prints its key
once; after that an admin adds users (here or through ``POST /api/v1/users``).
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from ember.server.services import naming
from ember.server.services.keys import key_id_of, new_key, revoke
from ember.server.services.perms import forget_grantee, make_home
from ember.server.storage.db import check_database, make_engine, migrate, prepare, session_factory, transaction
from ember.server.storage.domain_errors import Invalid
from ember.server.storage.models import ApiKey, User, now
from ember.server.storage.settings import ServerError, Settings


def _sessions(settings: Settings, upgrade: bool = False):
    """Sessions on the newest schema: created on an empty database, else checked (or upgraded)."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    engine = make_engine(settings.db_url)
    check_database(engine)
    if upgrade:
        migrate(engine)
    else:
        prepare(engine)
    return session_factory(engine)


def _name(name: str) -> str:
    try:
        return naming.user_name(name)
    except Invalid as e:
        raise ServerError(e.detail) from None


def init(settings: Settings, admin: str, upgrade: bool = False) -> str:
    """Create the newest schema and the first user, an admin; return the admin's key.

    Args:
        settings: where the database is.
        admin: the admin's user name.
        upgrade: bring an older schema up to date first (``ember ui``'s own database); else an
            older schema is refused with the command that upgrades it.

    Raises:
        ServerError: the database already has users (init runs once), or an older schema.
    """
    name = _name(admin)
    with transaction(_sessions(settings, upgrade)) as session:
        if session.scalar(select(func.count()).select_from(User)):
            raise ServerError("the server already has users; add more with `ember server user add NAME`")
        return _add(session, name, is_admin=True)


def add_user(settings: Settings, name: str, is_admin: bool = False) -> str:
    """Create a user (with a home folder) and return its first key."""
    name = _name(name)
    try:
        with transaction(_sessions(settings)) as session:
            return _add(session, name, is_admin)
    except IntegrityError:
        raise ServerError(f"user {name!r} exists already") from None


def _add(session, name: str, is_admin: bool) -> str:
    user = User(name=name, is_admin=is_admin, created=now())
    session.add(user)
    session.flush()
    forget_grantee(session, name)
    make_home(session, user)
    return new_key(session, user, "first key")[0]


def create_key(settings: Settings, name: str, label: str = "", days: float | None = None) -> str:
    """A new key for an existing user, optionally expiring after ``days``."""
    with transaction(_sessions(settings)) as session:
        user = session.scalar(select(User).where(User.name == _name(name)))
        if user is None:
            raise ServerError(f"no user {name!r}; add one with `ember server user add {name}`")
        expires = now() + timedelta(days=days) if days else None
        return new_key(session, user, label, expires)[0]


def revoke_key(settings: Settings, key_or_id: str) -> str:
    """Revoke a key given whole or by its id (the 16 hex digits after ``ember_``), and the keys made with it;
    return the id."""
    key_id = key_id_of(key_or_id) or key_or_id
    with transaction(_sessions(settings)) as session:
        row = session.scalar(select(ApiKey).where(ApiKey.key_id == key_id))
        if row is None:
            raise ServerError(f"no key with id {key_id[:16]!r}; `GET /api/v1/keys` lists a user's key ids")
        revoke(session, row)
        return key_id

"""Users and API keys: list, create and revoke keys; create a user with a home and a first key.

The service behind ``/api/v1/keys`` and ``/api/v1/users`` (:mod:`ember.server.api.folder_routes`).
A key is shown once, in the answer that creates it; only its id and label are kept readable.
A key made through the API can do no more than the key the request came with
(:func:`ember.server.services.keys.new_key`): it expires no later and is revoked with it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from ember.server.services import naming
from ember.server.services.keys import new_key, revoke
from ember.server.services.perms import forget_grantee, make_home
from ember.server.storage.domain_errors import Conflict, Forbidden, NotFound, TooLarge
from ember.server.storage.models import ApiKey, User, now

MAX_KEYS = 1_000
"""Live (unrevoked, unexpired) keys one user may hold: ``POST /keys`` past it is a 413."""


def list_keys(session: Session, user: User) -> list[dict[str, Any]]:
    """The caller's keys: ids, labels and dates, never the keys."""
    rows = session.scalars(select(ApiKey).where(ApiKey.user_id == user.id).order_by(ApiKey.id)).all()
    ids = {k.id: k.key_id for k in rows}
    return [
        {
            "key_id": k.key_id,
            "label": k.label,
            "created": k.created,
            "expires": k.expires,
            "revoked": k.revoked,
            "made_with": ids.get(k.parent_id) if k.parent_id is not None else None,
        }
        for k in rows
    ]


def create_key(
    session: Session, user: User, label: str, expires_days: float | None, maker: ApiKey | None
) -> dict[str, Any]:
    """A new key for the caller; the key is in this answer only.

    Args:
        expires_days: None (or 0) for none; either way the key expires no later than ``maker``,
            the key the request came with, and is revoked with it. ``expires`` in the answer is
            when it does expire.
    """
    live = session.scalar(
        select(func.count()).where(
            ApiKey.user_id == user.id, ApiKey.revoked.is_(None), or_(ApiKey.expires.is_(None), ApiKey.expires > now())
        )
    )
    if (live or 0) >= MAX_KEYS:
        raise TooLarge(f"{user.name!r} holds {live} keys, the most one user may: revoke those no longer used first")
    expires = now() + timedelta(days=expires_days) if expires_days else None
    key, expires = new_key(session, user, label, expires, maker)
    return {"key": key, "expires": expires, "made_with": maker.key_id if maker is not None else None}


def revoke_key(session: Session, user: User, key_id: str) -> dict[str, Any]:
    """Revoke one of the caller's keys and the keys made with it; an admin may revoke any (404 for a key
    that is not theirs). ``also``: how many keys made with it were revoked too."""
    row = session.scalar(select(ApiKey).where(ApiKey.key_id == key_id))
    if row is None or (row.user_id != user.id and not user.is_admin):
        raise NotFound(f"no key {key_id!r} of yours")
    already = row.revoked is not None
    count = revoke(session, row)
    return {"key_id": key_id, "revoked": True, "also": count - (0 if already else 1)}


def create_user(session: Session, user: User, name: str, admin: bool, maker: ApiKey | None) -> dict[str, Any]:
    """Create a user, their home folder and first key (admins only: 403 otherwise; 409 for a name taken).

    The first key can do no more than ``maker``, the admin's key the request came with: it
    expires no later and is revoked with it (an expiring admin key cannot make a lasting one).
    """
    if not user.is_admin:
        raise Forbidden("only an admin may create users")
    name = naming.user_name(name)
    if session.scalar(select(User).where(User.name == name)) is not None:
        raise Conflict(f"user {name!r} exists already")
    created = User(name=name, is_admin=admin, created=now())
    session.add(created)
    session.flush()
    forget_grantee(session, name)
    make_home(session, created)
    key, expires = new_key(session, created, "first key", None, maker)
    return {"name": name, "key": key, "expires": expires}

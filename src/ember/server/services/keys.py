"""API keys: made random, shown once, stored as a sha256 digest, compared in constant time.

A key reads ``ember_<key id>_<secret>``: the key id (16 hex digits, not secret) finds the row,
then the digest of the whole key is compared with :func:`hmac.compare_digest`. Keys carry 256
bits of randomness, so a fast hash is enough (there is nothing to brute-force). Keys are never
logged; error messages name the key id at most. Checking a request's key: :mod:`ember.server.api.auth`.

A key made with a key (``POST /api/v1/keys``, or the first key of a user an admin creates
through the API) can do no more than its maker: it expires no later (it gets the maker's expiry
when it asks for none or a later one), and revoking the maker revokes it too (:func:`revoke`).
Keys carry no other scope than their user, so that is all a key can pass on. Keys an admin
makes on the server (``ember server key create``) have no maker.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from ember.server.storage.models import ApiKey, User, aware, now

KEY_PREFIX = "ember_"
_KEY = re.compile(r"^ember_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")
# Compared against when no key row matches, so both paths cost one compare_digest.
_DUMMY_DIGEST = hashlib.sha256(b"no such key").hexdigest()


def digest(key: str) -> str:
    """The stored form of a key."""
    return hashlib.sha256(key.encode()).hexdigest()


def new_key(
    session: Session, user: User, label: str = "", expires: datetime | None = None, maker: ApiKey | None = None
) -> tuple[str, datetime | None]:
    """Create an API key for ``user``; return it (the only time the full key exists) and when it expires.

    Args:
        maker: the key the request that makes this one came with: the new key expires no later
            than it and is revoked with it. None for an admin on the server.

    Example:
        >>> key, expires = new_key(session, alice, label="laptop")   # print it once, store nothing else
    """
    if maker is not None and maker.expires is not None:
        limit = aware(maker.expires)
        expires = limit if expires is None else min(aware(expires), limit)
    key_id = secrets.token_hex(8)
    key = f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
    session.add(
        ApiKey(
            key_id=key_id,
            digest=digest(key),
            user_id=user.id,
            label=label[:100],
            created=now(),
            expires=expires,
            parent_id=maker.id if maker is not None else None,
        )
    )
    return key, expires


def revoke(session: Session, row: ApiKey) -> int:
    """Revoke a key and every key made with it, at any depth; return how many were revoked now."""
    stamp, count, level = now(), 0, [row.id]
    if row.revoked is None:
        row.revoked, count = stamp, 1
    while level:
        children = list(session.scalars(select(ApiKey.id).where(ApiKey.parent_id.in_(level))))
        if children:
            done = session.execute(
                update(ApiKey).where(ApiKey.id.in_(children), ApiKey.revoked.is_(None)).values(revoked=stamp)
            )
            count += int(getattr(done, "rowcount", 0) or 0)
        level = children
    return count


def key_id_of(key: str) -> str | None:
    """The public id part of a key, or None when it is not shaped like one."""
    match = _KEY.match(key)
    return match.group(1) if match else None


def verify_key(session: Session, key: str) -> ApiKey | None:
    """The stored row of a key that is known, unrevoked and unexpired; None otherwise (or when malformed)."""
    match = _KEY.match(key)
    row = session.scalar(select(ApiKey).where(ApiKey.key_id == match.group(1))) if match else None
    stored = row.digest if row is not None else _DUMMY_DIGEST
    if not hmac.compare_digest(stored, digest(key)) or row is None:
        return None
    if row.revoked is not None:
        return None
    if row.expires is not None and aware(row.expires) <= now():
        return None
    return row


def verify(session: Session, key: str) -> User | None:
    """The user a key belongs to, or None when it is unknown, revoked, expired or malformed."""
    row = verify_key(session, key)
    return session.get(User, row.user_id) if row is not None else None

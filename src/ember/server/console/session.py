"""Browser sessions: a random token in a cookie after logging in with an API key, CSRF tokens for forms.

The session cookie holds a random token (256 bits); the server keeps only its sha256 digest, in
``console_sessions``, with the user, the API key logged in with and an expiry
(:data:`MAX_AGE_S`). The API key itself never leaves the login form. Each request looks the
token up and checks that the key is still valid, so revoking a key ends its browser sessions
too; logging out deletes the row, so a copy of the cookie taken before logout is refused after
it. The cookie is HttpOnly, SameSite=Strict, scoped to ``/ui`` and Secure behind HTTPS.

Forms carry a CSRF token derived from a random per-browser cookie (signed double submit, HMAC
with a secret kept in the data folder, so every server process shares it), and a POST whose
``Origin`` names another host is refused.

In ``ember ui`` mode (``local_user`` set) there is no login, but the console is not open to
whatever reaches the port: the server answers only ``Host`` names of loopback (against DNS
rebinding, :class:`ember.server.api.guard.HostCheck`), and every page needs a per-launch token.
``ember ui`` prints its URL with ``?token=...`` (as notebook servers do); opening it sets an
HttpOnly, SameSite=Strict cookie holding the token and redirects to the same page without it.
Another local user's browser, or a page of another site, does not have the token.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlencode, urlsplit

from fastapi import HTTPException, Request, Response
from fastapi.responses import RedirectResponse
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from ember.server.services.keys import digest, key_id_of, verify
from ember.server.storage.models import ApiKey, ConsoleSession, User, aware, now

SESSION_COOKIE = "ember_session"
CSRF_COOKIE = "ember_csrf"
MAX_AGE_S = 12 * 3600
MAX_SESSIONS_PER_KEY = 100
"""Live console sessions one API key may have; logging in again past it ends the oldest."""
PREFIX = "/ui"
LOOPBACK = {"127.0.0.1", "::1", "localhost", "testclient"}


class NeedLogin(Exception):
    """Raised by a page that needs a signed-in user; the console answers with the login page."""


def load_secret(data_dir: Path) -> bytes:
    """The signing secret in ``<data>/console.secret``, created (mode 0600) on first use."""
    path = data_dir / "console.secret"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return bytes.fromhex(path.read_text().strip())
    secret = secrets.token_bytes(32)
    with os.fdopen(fd, "w") as out:
        out.write(secret.hex())
    return secret


def _sign(secret: bytes, message: str) -> str:
    return hmac.new(secret, message.encode(), hashlib.sha256).hexdigest()


def start_session(request: Request, response: Response, session: Session, api_key: str) -> User | None:
    """Check a key typed into the login form; on success store a new session, set its cookie, return the user."""
    user = verify(session, api_key.strip())
    key_id = key_id_of(api_key.strip())
    if user is None or key_id is None:
        return None
    issued = now()
    session.execute(delete(ConsoleSession).where(ConsoleSession.expires <= issued))  # keep the table small
    # Logging in again and again with one key must not grow the table without end: its oldest go.
    older = (
        select(ConsoleSession.digest)
        .where(ConsoleSession.key_id == key_id)
        .order_by(ConsoleSession.created.desc(), ConsoleSession.digest)
        .offset(MAX_SESSIONS_PER_KEY - 1)
    )
    session.execute(delete(ConsoleSession).where(ConsoleSession.digest.in_(older.scalar_subquery())))
    token = secrets.token_urlsafe(32)
    session.add(
        ConsoleSession(
            digest=digest(token),
            user_id=user.id,
            key_id=key_id,
            created=issued,
            expires=issued + timedelta(seconds=MAX_AGE_S),
        )
    )
    response.set_cookie(
        SESSION_COOKIE,
        token,
        max_age=MAX_AGE_S,
        path=PREFIX,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return user


def end_session(request: Request, response: Response, session: Session) -> None:
    """Log out: delete this browser's session on the server and forget its cookie."""
    token = request.cookies.get(SESSION_COOKIE, "")
    if token:
        session.execute(delete(ConsoleSession).where(ConsoleSession.digest == digest(token)))
    response.delete_cookie(SESSION_COOKIE, path=PREFIX, httponly=True, samesite="strict")


def _secret(request: Request) -> bytes:
    return request.app.state.console_secret


def local_cookie(token: str) -> str:
    """The name of an ``ember ui`` launch's cookie (one per launch: two consoles on two ports do not clash)."""
    return "ember_ui_" + hashlib.sha256(token.encode()).hexdigest()[:12]


def local_pass(request: Request) -> bool:
    """Whether a request to ``ember ui`` carries this launch's token in its cookie."""
    token: str | None = request.app.state.console_token
    if token is None:
        return True
    held = request.cookies.get(local_cookie(token), "")
    return hmac.compare_digest(held.encode(), token.encode())


def local_entry(request: Request) -> Response | None:
    """``?token=...`` of the URL ``ember ui`` printed: set its cookie and redirect to the page without it."""
    token: str | None = request.app.state.console_token
    given = request.query_params.get("token")
    if token is None or given is None or not hmac.compare_digest(given.encode(), token.encode()):
        return None
    rest = urlencode([(k, v) for k, v in request.query_params.multi_items() if k != "token"])
    response = RedirectResponse(request.url.path + (f"?{rest}" if rest else ""), status_code=303)
    response.set_cookie(local_cookie(token), token, path=PREFIX, httponly=True, samesite="strict")
    response.headers["Cache-Control"] = "no-store"
    response.headers["Referrer-Policy"] = "no-referrer"
    return response


def viewer(request: Request, session: Session) -> User | None:
    """The signed-in user (or the local user of ``ember ui``), None when nobody is."""
    local = request.app.state.console_local_user
    if local is not None:
        host = request.client.host if request.client else ""
        if host not in LOOPBACK:
            raise HTTPException(403, "`ember ui` answers only on loopback")
        if not local_pass(request):
            raise HTTPException(
                403,
                "this console opens only with the link `ember ui` printed when it started "
                "(http://127.0.0.1:PORT/ui/?token=...): open that link in this browser",
            )
        return session.scalar(select(User).where(User.name == local))
    token = request.cookies.get(SESSION_COOKIE, "")
    if not token or len(token) > 100:
        return None
    # Looked up by the digest of a 256-bit random token: nothing to learn from timing.
    row = session.get(ConsoleSession, digest(token))
    if row is None or aware(row.expires) <= now():
        return None
    key = session.scalar(select(ApiKey).where(ApiKey.key_id == row.key_id))
    if key is None or key.revoked is not None or (key.expires is not None and aware(key.expires) <= now()):
        return None
    return session.get(User, row.user_id)


def require_viewer(request: Request, session: Session) -> User:
    """The signed-in user; :class:`NeedLogin` (the login page) otherwise."""
    user = viewer(request, session)
    if user is None:
        raise NeedLogin()
    return user


def csrf_token(request: Request, response: Response | None = None) -> str:
    """The token forms must carry; sets the per-browser CSRF cookie on ``response`` when missing."""
    seed = request.cookies.get(CSRF_COOKIE) or request.state.__dict__.get("csrf_seed")
    if not seed:
        seed = secrets.token_urlsafe(24)
        request.state.csrf_seed = seed
    if response is not None and CSRF_COOKIE not in request.cookies:
        response.set_cookie(
            CSRF_COOKIE, seed, path=PREFIX, httponly=True, samesite="strict", secure=request.url.scheme == "https"
        )
    return _sign(_secret(request), f"csrf|{seed}")


def check_csrf(request: Request, token: str) -> None:
    """403 unless ``token`` matches this browser's CSRF cookie and the request comes from this site."""
    origin = request.headers.get("origin")
    if origin and origin != "null" and urlsplit(origin).netloc != request.headers.get("host", ""):
        raise HTTPException(403, "this form was sent from another site: reload the page and try again")
    seed = request.cookies.get(CSRF_COOKIE, "")
    if not seed or not hmac.compare_digest(token, _sign(_secret(request), f"csrf|{seed}")):
        raise HTTPException(403, "the form's security token is missing or stale: reload the page and try again")


def safe_next(target: str | None) -> str:
    """A post-login redirect inside the console only (no open redirect)."""
    if target and target.startswith(PREFIX + "/") and not target.startswith("//") and "\\" not in target:
        return target
    return PREFIX + "/"

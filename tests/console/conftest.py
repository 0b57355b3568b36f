"""Fixtures for the console's browser tests: Debian's Chromium driven by Playwright for Python.

Under CI (``$CI`` set) a missing Chromium or Playwright fails these tests instead of skipping
them (``scripts/chromium.sh`` installs Chromium). One browser per module; pages are reused.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx
import pytest

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
RESULTS = Path(__file__).resolve().parents[2] / "results" / "console"


def _missing(why: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{why} under CI: run scripts/chromium.sh and pip install -e '.[dev]' first")
    pytest.skip(why)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium for the whole module."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed")
    if not Path(CHROMIUM).is_file():
        _missing(f"{CHROMIUM} is missing")
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield chromium
        chromium.close()


QUIET_S = 0.15
"""How long a page must have no request in flight to count as settled (Playwright's ``networkidle``
waits 500 ms after every page and click, which was a fifth of these tests' time)."""

LINK_WORKERS = 4
"""How many of a page's links :meth:`Checked.check` asks at once."""

_LINKS_OK: dict[tuple[str, frozenset[tuple[str, str]]], set[str]] = {}
"""Per site (base URL) and who asks (the cookies but the CSRF one), the in-app links already seen to answer 200, shared
by the pages of a session: a test that opens the same run page again does not ask its links again."""


@dataclass
class Checked:
    """A browser page that records console errors and checks the app's links on every page."""

    page: Any
    base: str
    errors: list[str] = field(default_factory=list)
    in_flight: int = 0

    def __post_init__(self) -> None:
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(f"console: {m.text}"))
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        self.page.on("request", self._started)
        self.page.on("requestfinished", self._ended)
        self.page.on("requestfailed", self._failed)
        self.page.on("response", lambda r: r.status >= 400 and self.errors.append(f"{r.status}: {r.url}"))

    def _started(self, request: Any) -> None:
        self.in_flight += 1

    def _ended(self, request: Any) -> None:
        self.in_flight = max(0, self.in_flight - 1)

    def _failed(self, request: Any) -> None:
        self._ended(request)
        # A request the browser cancels (net::ERR_ABORTED: the next page opened before the favicon or an
        # image's samples arrived, under load) is not the app's failure; a failed answer is a response
        # >= 400, recorded above, and any other network failure is recorded here.
        if request.failure == "net::ERR_ABORTED":
            return
        self.errors.append(f"request failed: {request.url} ({request.failure})")

    def goto(self, path: str) -> Any:
        response = self.page.goto(urljoin(self.base, path))
        self.settle()
        return response

    def settle(self, timeout: float = 60.0) -> None:
        """Wait for the page's load event, then until no request of the page has been in flight for
        :data:`QUIET_S` (the page's own fetches done, as ``networkidle`` but without its 500 ms)."""
        self.page.wait_for_load_state("load")
        deadline = time.monotonic() + timeout
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < QUIET_S:
            assert time.monotonic() < deadline, f"{self.page.url}: {self.in_flight} requests still in flight"
            self.page.wait_for_timeout(25)  # lets Playwright deliver the request events meanwhile
            if self.in_flight:
                quiet_since = time.monotonic()

    def check(self, shot: str | None = None) -> None:
        """No console error so far; every in-app link on this page answers 200; a screenshot."""
        assert not self.errors, self.errors
        cookies = self.page.context.cookies()
        who = frozenset((c["name"], c["value"]) for c in cookies if "csrf" not in c["name"])
        checked = _LINKS_OK.setdefault((self.base, who), set())
        hrefs = self.page.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href'))")
        links: dict[str, str] = {}  # url -> the href it came from, each url once
        for href in hrefs:
            url = urljoin(self.page.url, href)
            if urlsplit(url).netloc == urlsplit(self.base).netloc and url not in checked:
                links.setdefault(url, href)
        checked.update(links)
        if links:
            self._ask(links, cookies)
        if shot:
            RESULTS.mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=str(RESULTS / f"{shot}.png"), full_page=True)

    def _ask(self, links: dict[str, str], cookies: list[Any]) -> None:
        """Every url of ``links`` (url -> the href it came from) answers 200 to this page's cookies and user
        agent, after redirects. Asked :data:`LINK_WORKERS` at a time (Playwright's sync API asks one at a
        time: the 150 run links of the compare page of a sweep took 9 s of that test's 14)."""
        headers = {"user-agent": self.page.evaluate("navigator.userAgent")}
        jar = {c["name"]: c["value"] for c in cookies}
        with (
            httpx.Client(cookies=jar, headers=headers, follow_redirects=True, max_redirects=5, timeout=60) as http,
            ThreadPoolExecutor(LINK_WORKERS) as pool,
        ):
            answers = list(pool.map(http.get, links))
        for href, r in zip(links.values(), answers, strict=True):
            assert r.status_code == 200, (self.page.url, href, r.status_code, r.text[:300])


def new_page(browser: Any, base: str, **context: Any) -> Checked:
    """A fresh context (cookies) and page on ``base``."""
    ctx = browser.new_context(viewport={"width": 1366, "height": 900}, **context)
    return Checked(ctx.new_page(), base)


from tests.server.conftest import db_url  # noqa: E402, F401  (the SQLite/PostgreSQL fixture, for these tests too)

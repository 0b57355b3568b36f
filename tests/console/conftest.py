"""Fixtures for the console's browser tests: Debian's Chromium driven by Playwright for Python.

Under CI (``$CI`` set) a missing Chromium or Playwright fails these tests instead of skipping
them (``scripts/chromium.sh`` installs Chromium). One browser per module; pages are reused.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

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


@dataclass
class Checked:
    """A browser page that records console errors and checks the app's links on every page."""

    page: Any
    base: str
    errors: list[str] = field(default_factory=list)
    checked: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(f"console: {m.text}"))
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        self.page.on("requestfailed", self._failed)
        self.page.on("response", lambda r: r.status >= 400 and self.errors.append(f"{r.status}: {r.url}"))

    def _failed(self, request: Any) -> None:
        # A request the browser cancels (net::ERR_ABORTED: the next page opened before the favicon or an
        # image's samples arrived, under load) is not the app's failure; a failed answer is a response
        # >= 400, recorded above, and any other network failure is recorded here.
        if request.failure == "net::ERR_ABORTED":
            return
        self.errors.append(f"request failed: {request.url} ({request.failure})")

    def goto(self, path: str) -> Any:
        response = self.page.goto(urljoin(self.base, path))
        self.page.wait_for_load_state("networkidle")
        return response

    def check(self, shot: str | None = None) -> None:
        """No console error so far; every in-app link on this page answers 200; a screenshot."""
        assert not self.errors, self.errors
        hrefs = self.page.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href'))")
        for href in hrefs:
            url = urljoin(self.page.url, href)
            parts = urlsplit(url)
            if parts.netloc != urlsplit(self.base).netloc or url in self.checked:
                continue
            self.checked.add(url)
            r = self.page.request.get(url, max_redirects=5)
            assert r.status == 200, (self.page.url, href, r.status, r.text()[:300])
        if shot:
            RESULTS.mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=str(RESULTS / f"{shot}.png"), full_page=True)


def new_page(browser: Any, base: str, **context: Any) -> Checked:
    """A fresh context (cookies) and page on ``base``."""
    ctx = browser.new_context(viewport={"width": 1366, "height": 900}, **context)
    return Checked(ctx.new_page(), base)


from tests.server.conftest import db_url  # noqa: E402, F401  (the SQLite/PostgreSQL fixture, for these tests too)

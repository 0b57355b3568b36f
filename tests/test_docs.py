"""The documentation site builds with ``mkdocs build --strict`` (issue 22, item 9).

A broken link, a missing anchor (in docs/ or in the README's links into docs/), a link to a file
of the repository that does not exist, or a docstring mkdocstrings cannot read fails the build,
and so this test. The small projects below check that the strict settings of mkdocs.yml do
refuse what they should, and that GitHub's anchors are the site's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e '.[docs]')")
pytest.importorskip("mkdocstrings", reason="the docs extra is not installed (pip install -e '.[docs]')")

ROOT = Path(__file__).resolve().parents[1]


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_the_site_builds_strict_with_the_api_reference(tmp_path: Path) -> None:
    out = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert out.returncode == 0, out.stdout + out.stderr
    site = tmp_path / "site"
    assert "make demo" in (site / "index.html").read_text()  # the README is the home page
    trainer = (site / "reference" / "trainer" / "index.html").read_text()
    assert 'id="ember.trainer.Trainer"' in trainer and 'id="ember.trainer.Trainer.fit"' in trainer
    assert 'id="ember.launcher.launch_from_torch"' in (site / "reference" / "ember" / "index.html").read_text()
    assert ":func:" not in trainer


def _project(tmp_path: Path, readme: str, pages: dict[str, str]) -> Path:
    """A small site with mkdocs.yml's settings (INHERIT) and its own pages and README."""
    (tmp_path / "docs").mkdir()
    for name, text in pages.items():
        (tmp_path / "docs" / name).write_text(text)
    (tmp_path / "README.md").write_text(readme)
    (tmp_path / "CHANGELOG.md").write_text("# Changelog\n")
    nav = "".join(f"  - {name}\n" for name in ["index.md", *pages])
    (tmp_path / "mkdocs.yml").write_text(
        f"INHERIT: {ROOT / 'mkdocs.yml'}\n"
        "docs_dir: docs\n"
        f"hooks: [{ROOT / 'scripts' / 'mkdocs_hooks.py'}]\n"
        "plugins: []\n"
        "theme: mkdocs\n"  # quicker than Material; the links and anchors are checked alike
        f"nav:\n{nav}"
    )
    (tmp_path / "docs" / "index.md").write_text("<!-- the README -->\n")
    return tmp_path / "mkdocs.yml"


GUIDE = (
    "# Guide\n\n## `fit`, `evaluate`, `predict`\n\n## ember ui at 100–10,000 runs (issue 18)\n\n"
    "## Names\n\n## Names\n"  # GitHub: names, names-1
)


def test_github_anchors_and_the_readme_links_resolve(tmp_path: Path) -> None:
    readme = (
        "# Project\n\n[fit](docs/guide.md#fit-evaluate-predict), [changes](CHANGELOG.md), ![picture](docs/img.png)\n"
    )
    other = "# Other\n\n[scale](guide.md#ember-ui-at-10010000-runs-issue-18) [again](guide.md#names-1)\n"
    config = _project(tmp_path, readme, {"guide.md": GUIDE, "other.md": other})
    (tmp_path / "docs" / "img.png").write_bytes(b"")
    out = _build(config, tmp_path / "site")
    assert out.returncode == 0, out.stdout + out.stderr
    index = (tmp_path / "site" / "index.html").read_text()
    assert 'href="guide/#fit-evaluate-predict"' in index
    assert 'href="https://github.com/ember-ml/ember/blob/main/CHANGELOG.md"' in index


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    readme = "# P\n\n[a](docs/guide.md#fit) [b](NOTES.md)\n"
    other = "# O\n\n[c](guide.md#no-such-heading) [d](missing.md) [e](../src/nothing.py)\n"
    config = _project(tmp_path, readme, {"guide.md": GUIDE, "other.md": other})
    out = _build(config, tmp_path / "site")
    assert out.returncode != 0
    for message in [
        "'guide.md#fit', but the doc 'guide.md' does not contain an anchor '#fit'",  # the README's
        "does not contain an anchor '#no-such-heading'",
        "a link 'missing.md', but the target is not found among documentation files",
        "README.md links to NOTES.md, which does not exist",
        "docs/other.md links to ../src/nothing.py, which does not exist",
    ]:
        assert message in out.stdout + out.stderr

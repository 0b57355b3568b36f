"""The package's conventions (issue 22, items 7 and 8): one version source, a changelog that has
its version, every ``EMBER_*`` variable documented, the project's metadata."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest

import ember

ROOT = Path(__file__).resolve().parents[1]
# A whole name: not _EMBER_NAMES, not the EMBER_SERVER_ of "$EMBER_SERVER_*".
VARIABLE = re.compile(r"(?<![A-Za-z0-9_])EMBER_[A-Z][A-Z0-9_]*[A-Z0-9](?![A-Za-z0-9_*])")


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_version_has_one_source_ember_dunder_version() -> None:
    data = _pyproject()
    assert "version" not in data["project"] and "version" in data["project"]["dynamic"]
    assert data["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "ember.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+([ab]\d+|rc\d+)?(\.dev\d+)?", ember.__version__)
    try:
        installed = importlib.metadata.version("ember")
    except importlib.metadata.PackageNotFoundError:
        return
    assert installed == ember.__version__


def test_the_changelog_keeps_a_changelog_with_this_version() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    assert "[Keep a Changelog]" in text and "## [Unreleased]" in text
    assert re.search(rf"^## \[{re.escape(ember.__version__)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", text, re.M)


def test_every_ember_variable_the_code_reads_is_documented() -> None:
    doc = (ROOT / "docs" / "environment.md").read_text()
    documented = set(VARIABLE.findall(doc))
    used: dict[str, Path] = {}
    for folder, pattern in (("src", "*.py"), ("scripts", "*.sh"), ("examples", "*")):
        for path in (ROOT / folder).rglob(pattern):
            if path.is_file() and path.suffix in (".py", ".sh", ".sbatch", ""):
                for name in VARIABLE.findall(path.read_text(errors="replace")):
                    used.setdefault(name, path.relative_to(ROOT))
    missing = {name: str(path) for name, path in used.items() if name not in documented}
    assert not missing, f"add these to docs/environment.md: {missing}"
    assert {"EMBER_HOME", "EMBER_RESUME", "EMBER_SERVER_DB"} <= set(used)  # the search finds them


def test_the_project_has_urls_authors_and_classifiers() -> None:
    project = _pyproject()["project"]
    assert {"Homepage", "Documentation", "Changelog", "Issues"} <= set(project["urls"])
    assert project["authors"] and all("name" in a for a in project["authors"])
    classifiers = project["classifiers"]
    assert "Typing :: Typed" in classifiers
    assert any(c.startswith("Programming Language :: Python :: 3.1") for c in classifiers)

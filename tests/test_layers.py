"""The layer rules docs/architecture.md states that a test can check: imports read from the source."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "ember"
COMPAT = PACKAGE / "compat"


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> Iterator[tuple[str, str | None]]:
    """``(module, name)`` for every import in ``path``, relative imports resolved (name None: ``import m``)."""
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                yield base, alias.name


def _sources(root: Path) -> list[Path]:
    return sorted(root.rglob("*.py"))


@pytest.mark.parametrize("path", [p for p in _sources(PACKAGE) if COMPAT not in p.parents], ids=str)
def test_nothing_below_compat_imports_it(path: Path) -> None:
    found = [m for m, _ in _imports(path) if m == "ember.compat" or m.startswith("ember.compat.")]
    assert not found, f"{path.relative_to(SRC)} imports {found}: compat is the top layer"


@pytest.mark.parametrize("path", _sources(COMPAT), ids=str)
def test_compat_uses_only_embers_public_names(path: Path) -> None:
    private: list[str] = []
    for module, name in _imports(path):
        if not module.startswith("ember") or module.startswith("ember.compat"):
            continue  # torch, the standard library, and compat's own modules
        if any(part.startswith("_") for part in module.split(".")) or (name or "").startswith("_"):
            private.append(f"{module}:{name}" if name else module)
    assert not private, f"{path.relative_to(SRC)} reaches into ember's private names {private}"

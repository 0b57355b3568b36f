"""The layer rules docs/architecture.md states that a test can check: imports read from the source."""

from __future__ import annotations

import ast
import sys
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


# The layers of docs/architecture.md, lowest first: a module imports its own package and the
# layers below it, never one above. "" is the package root, ``ember/__init__.py``.
LAYERS: list[tuple[str, ...]] = [
    (
        "errors",
        "_version",
        "_exit",
        "_atomic",
        "_lock",
        "_format",
        "_lazy",
        "_subcommands",
        "_same_config",
        "_rendezvous",
    ),
    ("config",),
    ("distributed", "logging", "layout", "context"),
    ("data", "amp", "loss_check", "launcher", "batch", "track"),
    ("parallel",),
    ("engine",),
    ("initializer",),
    ("checkpoint",),
    ("trainer",),
    ("server",),
    ("cli", "__main__", "_worker", "_supervisor", "_run_report"),
    ("",),
    ("compat",),
]
RANK = {f"ember.{name}".rstrip("."): rank for rank, names in enumerate(LAYERS) for name in names}
MODULES = frozenset(_module_name(p) for p in _sources(PACKAGE))
# The Trainer's loop and its machinery: they reach hooks through events, never by name.
LOOP = ("trainer", "_bus", "_control", "_state", "_resume", "_setup")


def _unit(module: str) -> str:
    """What a module's layer is read from: ``ember.trainer.hooks.base`` -> ``ember.trainer``."""
    return ".".join(module.split(".")[:2])


def _targets(path: Path) -> set[str]:
    """The ember modules ``path`` imports: ``from ember import context`` is ``ember.context``."""
    found = set()
    for module, name in _imports(path):
        full = f"{module}.{name}" if name else module
        if module.split(".")[0] == "ember":
            found.add(full if full in MODULES else module)
    return found


@pytest.mark.parametrize("path", _sources(PACKAGE), ids=str)
def test_no_import_points_up_a_layer(path: Path) -> None:
    here = _unit(_module_name(path))
    assert here in RANK, f"{here} is on no layer: add it to LAYERS here and to docs/architecture.md"
    up = sorted(t for t in _targets(path) if _unit(t) != here and RANK[_unit(t)] > RANK[here])
    assert not up, f"{path.relative_to(SRC)} (layer {RANK[here]}) imports {up} from a higher layer"


@pytest.mark.parametrize("name", LOOP)
def test_the_loop_imports_no_concrete_hook(name: str) -> None:
    path = PACKAGE / "trainer" / f"{name}.py"
    hooks = sorted(t for t in _targets(path) if t.startswith("ember.trainer.hooks") and t != "ember.trainer.hooks.base")
    assert not hooks, f"{path.relative_to(SRC)} imports {hooks}: the loop reaches hooks through events only"


def test_the_layer_check_sees_a_lazy_upward_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule covers imports inside functions and under TYPE_CHECKING, where cycles hide."""
    probe = tmp_path / "ember" / "checkpoint" / "probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ember.engine import Engine\n"
        "def f():\n    from ember import trainer\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path)
    here = RANK[_unit(_module_name(probe))]
    assert sorted(t for t in _targets(probe) if RANK[_unit(t)] > here) == ["ember.trainer"]

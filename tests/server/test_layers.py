"""The server's tiers, read from its source: one folder per tier, and what each may import.

- Every module sits in a tier folder (``storage``, ``services``, ``api``, ``console``, ``local``)
  or is one of the package's own files (``__init__``, ``app``, ``cli``); a module imports the
  server's modules of its own tier and the tiers below it only (``TIERS``, lowest first; lazy
  imports and ``TYPE_CHECKING`` blocks count too).
- A route module is one that makes an ``APIRouter`` (the API's ``*_routes.py``, the console's
  pages): no route module imports another.
- The storage and the services import neither FastAPI nor Starlette (not even for types): they
  raise :mod:`ember.server.storage.domain_errors`, which one handler (``api/errors.py``) answers.
- No server module imports a private (``_name``) module or name of another package. ember's
  root-level private modules on layer 0 (``ember._atomic``, ``ember._format``,
  ``ember._subcommands``, ...; docs/architecture.md) are its internal utilities, meant for every
  ember package, so they are not another package's; their private names are, and so are a
  subpackage's private modules (``ember.track._fs``) and the root-level ones above layer 0
  (``ember._worker``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import ember.server
from tests.test_layers import LAYERS, PACKAGE

SERVER = Path(ember.server.__file__).parent
TIERS = ("__init__", "storage", "services", "api", "console", "app", "local", "cli")
"""Lowest first: ``storage`` (tables, database, migrations, request schemas, settings), ``services``
(what the server does, over a session), ``api`` (``/api/v1``), ``console`` (the pages), ``app``
(the ASGI app that wires them), ``local`` (``ember ui``: the console over a local store and its
index), ``cli`` (``ember server``, ``ember ui``, ``ember upload``)."""
NO_HTTP = ("storage", "services")
HTTP = ("fastapi", "starlette")
# ember's internal utilities: the root-level private modules on layer 0, for every ember package.
UTILITIES = {f"ember.{name}" for name in LAYERS[0] if name.startswith("_")}


def _modules() -> dict[str, Path]:
    """Every module of the server by its name under ``ember.server`` ('runs', 'console.pages')."""
    return {
        ".".join(p.relative_to(SERVER).with_suffix("").parts): p
        for p in SERVER.rglob("*.py")
        if "migrations" not in p.parts
    }


def _imports(path: Path) -> set[str]:
    """Every module a file imports, anywhere in it (functions and ``TYPE_CHECKING`` blocks too).

    ``from ember.server.services import runs`` counts as ``ember.server.services.runs``.
    """
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def _local(imported: set[str]) -> set[str]:
    """The server's own modules among ``imported``, by their names under ``ember.server``."""
    names = _modules()
    return {m.removeprefix("ember.server.") for m in imported if m.removeprefix("ember.server.") in names}


def _is_route_module(path: Path) -> bool:
    """Whether a module makes an ``APIRouter`` (``app.py``, which includes them all, is not one)."""
    return path.name != "app.py" and any(
        isinstance(node, ast.Call) and getattr(node.func, "id", None) == "APIRouter"
        for node in ast.walk(ast.parse(path.read_text()))
    )


def _tier(name: str) -> str:
    """The tier of a module named under ``ember.server`` ('services.runs' -> 'services', 'app' -> 'app')."""
    return name.split(".")[0]


def test_every_module_sits_in_a_tier() -> None:
    found = sorted(name for name in _modules() if _tier(name) not in TIERS)
    assert not found, f"put each server module in a tier folder ({', '.join(TIERS)}): {found}"
    assert {"storage", "services", "api", "console", "local"} <= {p.name for p in SERVER.iterdir() if p.is_dir()}


def test_no_module_imports_a_higher_tier() -> None:
    found = []
    for name, path in sorted(_modules().items()):
        rank = TIERS.index(_tier(name))
        found += [(name, other) for other in sorted(_local(_imports(path))) if TIERS.index(_tier(other)) > rank]
    assert not found, f"a tier imports only its own and lower tiers ({' < '.join(TIERS)}): {found}"


def test_no_route_module_imports_another() -> None:
    modules = _modules()
    routes = {name for name, path in modules.items() if _is_route_module(path)}
    assert {"api.run_routes", "api.artifact_routes", "api.folder_routes", "api.image_routes", "console.pages"} <= routes
    found = {(name, other) for name in routes for other in _local(_imports(modules[name])) & routes if other != name}
    assert not found, f"route modules importing route modules (share a service instead): {sorted(found)}"


def test_storage_and_services_know_no_http() -> None:
    found = []
    for name, path in sorted(_modules().items()):
        if _tier(name) in NO_HTTP:
            found += [(name, m) for m in _imports(path) if m.split(".")[0] in HTTP]
    assert not found, (
        f"the storage and the services import no FastAPI/Starlette "
        f"(raise ember.server.storage.domain_errors instead): {found}"
    )


def _private_of_another_package(imported: str) -> str | None:
    """The private module or name of another ember package that ``imported`` reaches, or None.

    ``ember.track._fs`` and ``ember.track.store._x`` are; ``ember._format`` (a layer-0 utility) is
    not, but ``ember._format._UNITS`` is.
    """
    parts = imported.split(".")
    if parts[0] != "ember" or len(parts) < 2 or parts[1] == "server":
        return None
    start = 2 if ".".join(parts[:2]) in UTILITIES else 1
    private = next((i for i in range(start, len(parts)) if parts[i].startswith("_")), None)
    return None if private is None else ".".join(parts[: private + 1])


@pytest.mark.parametrize(
    ("imported", "private"),
    [("ember._format", None), ("ember._subcommands.run_commands", None), ("ember._atomic", None),
     ("ember.track.layout", None), ("ember.server._x", None), ("ember._format._UNITS", "ember._format._UNITS"),
     ("ember.track._fs", "ember.track._fs"), ("ember.track.store._x", "ember.track.store._x"),
     ("ember._worker", "ember._worker"), ("ember._nothing", "ember._nothing")],
)  # fmt: skip
def test_the_private_rule_lets_only_the_layer_0_utilities_through(imported: str, private: str | None) -> None:
    assert _private_of_another_package(imported) == private


def test_the_utilities_are_root_level_modules() -> None:
    assert {"ember._atomic", "ember._format", "ember._subcommands"} <= UTILITIES
    assert all((PACKAGE / f"{m.removeprefix('ember.')}.py").is_file() for m in UTILITIES), UTILITIES


def test_no_server_module_imports_a_private_module_of_another_package() -> None:
    found = set()
    for name, path in _modules().items():
        for imported in _imports(path):
            private = _private_of_another_package(imported)
            if private is not None:
                found.add((name, private))
    assert not found, f"make the name public in its package instead: {sorted(found)}"

"""The server's layers, read from its source: routes -> services -> models, and what each may import.

- A route module is one that makes an ``APIRouter`` (``routes_*.py``, the console's pages; not
  ``app.py``, which includes them): no route module imports another.
- The services and the models import neither FastAPI nor Starlette (not even for types), nor
  a module of the HTTP layer: they raise :mod:`ember.server.domain_errors`, which one handler
  (``errors.py``) answers.
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
MODELS = {"models", "db", "schemas", "settings", "domain_errors"}
SERVICES = {
    "accounts",
    "artifacts",
    "blobs",
    "codec",
    "columns",
    "downloads",
    "filtering",
    "folder_pages",
    "folders",
    "images",
    "ingest",
    "keys",
    "listing",
    "liveness",
    "lookup",
    "naming",
    "perms",
    "runs",
    "series",
}
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

    ``from ember.server import runs`` counts as ``ember.server.runs``.
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


def test_the_layer_lists_name_modules_that_exist() -> None:
    missing = (SERVICES | MODELS) - set(_modules())
    assert not missing, f"listed as services or models but not in ember/server: {sorted(missing)}"


def test_no_route_module_imports_another() -> None:
    modules = _modules()
    routes = {name for name, path in modules.items() if _is_route_module(path)}
    assert {"routes_runs", "routes_artifacts", "routes_folders", "routes_images", "console.pages"} <= routes
    found = {(name, other) for name in routes for other in _local(_imports(modules[name])) & routes if other != name}
    assert not found, f"route modules importing route modules (share a service instead): {sorted(found)}"


def test_services_and_models_know_no_http() -> None:
    modules = _modules()
    found = []
    for name in sorted(SERVICES | MODELS):
        imported = _imports(modules[name])
        found += [(name, m) for m in imported if m.split(".")[0] in HTTP]
        found += [(name, f"ember.server.{m}") for m in _local(imported) if m not in SERVICES | MODELS]
    assert not found, (
        f"services and models import no FastAPI/Starlette and no module of the HTTP layer "
        f"(raise ember.server.domain_errors instead): {found}"
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

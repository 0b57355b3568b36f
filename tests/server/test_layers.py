"""The server's layers, read from its source: routes -> services -> models, and what each may import.

- A route module is one that makes an ``APIRouter`` (``routes_*.py``, the console's pages; not
  ``app.py``, which includes them): no route module imports another.
- The services and the models import neither FastAPI nor Starlette (not even for types), nor
  a module of the HTTP layer: they raise :mod:`ember.server.domain_errors`, which one handler
  (``errors.py``) answers.
- No server module imports a private (``_name``) module or name of another package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import ember.server

SERVER = Path(ember.server.__file__).parent
MODELS = {"models", "db", "schemas", "settings", "domain_errors"}
SERVICES = {
    "accounts",
    "artifacts",
    "blobs",
    "codec",
    "columns",
    "downloads",
    "folder_pages",
    "folders",
    "images",
    "ingest",
    "keys",
    "listing",
    "lookup",
    "naming",
    "perms",
    "runs",
    "series",
}
HTTP = ("fastapi", "starlette")
# Private modules of other packages still imported, each with the item that removes it.
KNOWN_PRIVATE = {("cli", "ember._subcommands")}  # the plumbing every `ember` subcommand family shares


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


def test_no_server_module_imports_a_private_module_of_another_package() -> None:
    found = set()
    for name, path in _modules().items():
        for imported in _imports(path):
            parts = imported.split(".")
            private = next((i for i, p in enumerate(parts) if i and p.startswith("_")), None)
            if parts[0] == "ember" and parts[1] != "server" and private is not None:
                # ember.track._fs, or a private name of another package (from ember.x import _y)
                found.add((name, ".".join(parts[: private + 1])))
    assert not found - KNOWN_PRIVATE, f"make the name public in its package instead: {sorted(found - KNOWN_PRIVATE)}"

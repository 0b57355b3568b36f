"""mkdocs hooks (mkdocs.yml ``hooks:``): the README as the home page, and links out of docs/.

- ``docs/index.md`` is the README: its links into ``docs/`` (``docs/engine.md#x``) become the
  site's (``engine.md#x``), so the strict build checks the README's links and anchors too.
- A relative link from a page to a file of the repository outside ``docs/`` (``../benchmarks/...``,
  ``CHANGELOG.md``) becomes a link to that file on GitHub; a file that does not exist is an error,
  which ``mkdocs build --strict`` turns into a failed build.
- A repeated heading's anchor is GitHub's (``names-1``), not Python-Markdown's (``names_1``); with
  the toc's slugify (mkdocs.yml) every anchor is the one GitHub shows.
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path
from typing import Any

from markdown.extensions import toc

log = logging.getLogger("mkdocs.plugins.ember")

_LINK = re.compile(r"(!?\[[^\]\n]*\]\()([^)\s]+)(\))")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)


def _github_unique(id: str, ids: Any, *args: Any, **kwargs: Any) -> str:
    if not id:
        return _markdown_unique(id, ids, *args, **kwargs)
    n = 0
    unique = id
    while unique in ids:
        n += 1
        unique = f"{id}-{n}"
    ids.add(unique)
    return unique


_markdown_unique = toc.unique


def on_config(config: Any) -> Any:
    toc.unique = _github_unique  # the toc extension looks the name up at each heading
    return config


def _repo_root(config: Any) -> Path:
    return Path(config["config_file_path"]).resolve().parent


def _rewrite(markdown: str, page_dir: str, docs_dir: Path, root: Path, blob: str, where: str) -> str:
    def link(match: re.Match[str]) -> str:
        target = match.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:|^#|^/", target):
            return match.group(0)
        path, _, anchor = target.partition("#")
        resolved = posixpath.normpath(posixpath.join(page_dir, path))
        if resolved == "docs" or resolved.startswith("docs/"):
            # Inside docs/: leave it to mkdocs' own validation, relative to the page.
            rel = posixpath.relpath(resolved, page_dir if page_dir else ".")
            return match.group(1) + rel + (f"#{anchor}" if anchor else "") + match.group(3)
        if not (root / resolved).exists():
            log.error("%s links to %s, which does not exist in the repository", where, target)
            return match.group(0)
        return match.group(1) + f"{blob}/{resolved}" + (f"#{anchor}" if anchor else "") + match.group(3)

    parts = []
    last = 0
    for fence in _FENCE.finditer(markdown):
        parts.append(_LINK.sub(link, markdown[last : fence.start()]))
        parts.append(fence.group(0))
        last = fence.end()
    parts.append(_LINK.sub(link, markdown[last:]))
    return "".join(parts)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    root = _repo_root(config)
    docs_dir = Path(config["docs_dir"]).resolve()
    blob = config["repo_url"].rstrip("/") + "/blob/main"
    src = page.file.src_uri
    if src == "index.md":
        markdown = (root / "README.md").read_text(encoding="utf-8")
        # The README sits at the root: its links are relative to the root, and docs/ is the site.
        out = _rewrite(markdown, "", docs_dir, root, blob, "README.md")
        return re.sub(r"(\]\()docs/", r"\1", out)
    page_dir = posixpath.dirname("docs/" + src)
    out = _rewrite(markdown, page_dir, docs_dir, root, blob, f"docs/{src}")
    return out


# :func:`launch` and :class:`~ember.engine.Engine` (the last name only, as Sphinx shows it).
_ROLE = re.compile(r":(?:func|meth|class|attr|mod|data|exc|obj|const):<code>(?:~(?:[\w.]+\.)?)?")


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    # Docstrings cross-reference in Sphinx's roles (:func:`launch`); show them as the code they name.
    if page.file.src_uri.startswith("reference/"):
        return _ROLE.sub("<code>", html)
    return html

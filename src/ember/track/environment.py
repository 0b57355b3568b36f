"""What a run records about where it ran: platform, git state and the command line."""

from __future__ import annotations

import email
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from ember.track._fs import hostname


def _memory_bytes() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None  # not a POSIX system: the total is simply not recorded


def _torch_info() -> dict[str, Any]:
    import torch  # imported here: a run records it, `import ember.track` must stay cheap

    info: dict[str, Any] = {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": bool(torch.cuda.is_available()),
        "gpus": [],
    }
    if info["cuda_available"]:
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            info["gpus"].append({"name": props.name, "memory_bytes": int(props.total_memory)})
    return info


# ``<name>-<version>.dist-info`` (the wheel spec escapes '-' in both parts), or the egg-info
# form ``<name>-<version>[-py<X.Y>[-<platform>]].egg-info``.
_DIST_DIR_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._]*)-([^-]+?)(?:-py\d[^-]*(?:-.+)?)?\.(?:dist|egg)-info$")


def _normalized(name: str) -> str:
    """PEP 503's comparable form of a distribution name ('PyYAML' -> 'pyyaml', 'a_b' -> 'a-b')."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _packages() -> dict[str, str]:
    """Every installed distribution visible on ``sys.path``: normalized name -> version.

    Read from the names of the ``*.dist-info`` / ``*.egg-info`` entries, which carry both,
    rather than by parsing every METADATA file (0.3-0.7 s for 140 distributions); an entry
    whose name does not carry them is read with :mod:`importlib.metadata`. As for imports,
    the first ``sys.path`` entry holding a distribution wins.
    """
    from importlib import metadata

    found: dict[str, str] = {}
    for entry in sys.path:
        folder = entry or "."
        try:
            names = os.listdir(folder)
        except NotADirectoryError:  # a zip archive on sys.path: importlib.metadata reads it
            for dist in metadata.distributions(path=[folder]):
                meta = dist.metadata  # parsed at each access
                if meta["Name"]:
                    found.setdefault(_normalized(meta["Name"]), meta["Version"])
            continue
        except OSError:  # missing or unreadable: nothing can be imported from it either
            continue
        for name in names:
            if not name.endswith(("dist-info", "egg-info")):
                continue
            match = _DIST_DIR_RE.match(name)
            if match is not None and "_" not in match[2]:  # '_' may stand for an escaped '-'
                found.setdefault(_normalized(match[1]), match[2])
                continue
            dist = metadata.PathDistribution(Path(folder, name))
            # read_text("") is the entry itself: an egg-info that is a file, not a folder
            text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or dist.read_text("")
            if not text:
                continue  # a leftover folder without metadata: nothing importable was installed
            message = email.message_from_string(text)
            if message["Name"] and message["Version"]:
                found.setdefault(_normalized(message["Name"]), message["Version"])
    return dict(sorted(found.items()))


def collect_platform() -> dict[str, Any]:
    """OS, Python, torch/CUDA/GPUs, host, CPU count, memory and installed packages."""
    return {
        "os": platform.platform(),
        "system": platform.system(),
        "release": platform.release(),
        "machine": platform.machine(),
        "hostname": hostname(),
        "cpu_count": os.cpu_count(),
        "memory_bytes": _memory_bytes(),
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
        },
        "torch": _torch_info(),
        "packages": _packages(),
    }


def _git(args: list[str], cwd: Path) -> str:
    out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=True)
    return out.stdout.strip()


def _without_credentials(url: str) -> str:
    """``https://user:token@host/x`` -> ``https://host/x``: a token must not land in a run."""
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest.split("/", 1)[0]:
        return f"{scheme}://{rest.split('@', 1)[1]}"
    return url


def collect_git(cwd: Path | None = None) -> dict[str, Any] | None:
    """Commit, branch, dirty flag and remote of the repository around ``cwd``; None outside one.

    Two git commands (``status --porcelain=v2 --branch`` answers the commit, the branch and the
    changes at once; then the remotes), since every run a process creates asks again.
    When git is missing or the folder is not in a repository's work tree there is nothing to
    record; the reason is kept in the ``error`` field only when git itself failed unexpectedly.
    """
    cwd = cwd or Path.cwd()
    try:
        status = _git(["status", "--porcelain=v2", "--branch", "--untracked-files=no"], cwd).splitlines()
    except FileNotFoundError:
        return None  # git is not installed
    except subprocess.CalledProcessError:
        return None  # not inside a repository's work tree
    except subprocess.TimeoutExpired as e:
        return {"error": f"git timed out: {e}"}
    header = dict(line[2:].split(" ", 1) for line in status if line.startswith("# ") and " " in line[2:])
    oid, head = header.get("branch.oid"), header.get("branch.head")
    commit = None if oid in (None, "(initial)") else oid  # None: a repository with no commit yet
    branch = "HEAD" if head in (None, "(detached)") else head  # as `git rev-parse --abbrev-ref HEAD` says
    dirty = any(not line.startswith("#") for line in status)
    try:
        remotes = _git(["remote", "-v"], cwd).splitlines()
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        return {"commit": commit, "error": f"git failed: {e}"}
    remote = _without_credentials(remotes[0].split()[1]) if remotes else None
    return {"commit": commit, "branch": branch, "dirty": dirty, "remote": remote}


def collect_command() -> dict[str, Any]:
    """The command line, interpreter and working directory of this process."""
    return {
        "argv": list(sys.argv),
        "orig_argv": list(getattr(sys, "orig_argv", sys.argv)),
        "executable": sys.executable,
        "cwd": os.getcwd(),
        "pid": os.getpid(),
    }


def collect_all() -> dict[str, Any]:
    """Everything ``platform.json`` holds."""
    return {"platform": collect_platform(), "git": collect_git(), "command": collect_command()}

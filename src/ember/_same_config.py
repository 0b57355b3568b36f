"""Every process of a job must launch with the same config: a hash compared across ranks at launch.

A mismatch (machines started with different files or overrides, a value computed per machine
such as a time stamp) otherwise shows up later as a hang in a collective or as silently
different training on some ranks.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
from collections.abc import Mapping
from typing import Any

import torch.distributed as dist

from ember.errors import LaunchError


def check_same_config(cfg: Mapping[str, Any], world_size: int) -> None:
    """Compare a hash of ``cfg`` across the ranks (a collective); raise naming what differs.

    Raises:
        LaunchError: on every rank when any rank's config differs from rank 0's; it names up to
            three such ranks with their hosts, and up to five keys each with both values.
    """
    flat = _flat_config(cfg)
    digest = hashlib.sha256(json.dumps(sorted(flat.items())).encode()).hexdigest()
    seen: list[Any] = [None] * world_size
    dist.all_gather_object(seen, (digest, socket.gethostname()))
    if all(d == seen[0][0] for d, _ in seen):
        return
    configs: list[Any] = [None] * world_size
    dist.all_gather_object(configs, flat)  # only on a mismatch: to name the keys
    ref = configs[0]
    parts = []
    others = [r for r in range(1, world_size) if seen[r][0] != seen[0][0]]
    for r in others[:3]:
        keys = sorted(k for k in ref.keys() | configs[r].keys() if ref.get(k) != configs[r].get(k))
        shown = "; ".join(
            f"{k}: {ref.get(k, '(not set)')} on rank 0, {configs[r].get(k, '(not set)')} on rank {r}" for k in keys[:5]
        )
        more = f" (and {len(keys) - 5} more keys)" if len(keys) > 5 else ""
        parts.append(f"rank {r} on host {seen[r][1]} differs from rank 0 on host {seen[0][1]} in {shown}{more}")
    if len(others) > 3:
        parts.append(f"{len(others) - 3} more rank(s) differ from rank 0")
    raise LaunchError(
        f"the config is not the same on every process of this job (their hashes differ at launch): "
        f"{'. '.join(parts)}. Start every machine with the same config file and the same overrides; "
        "a value that must differ per machine (a local path) belongs in an environment variable, not the config"
    )


def _flat_config(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"a.b": text}`` for every leaf: text that is equal when the values are (no object addresses)."""
    flat: dict[str, str] = {}
    for key in sorted(cfg, key=str):
        value, name = cfg[key], f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(_flat_config(value, f"{name}."))
        else:
            flat[name] = _canonical(value)[:200]
    return flat


def _canonical(value: Any) -> str:
    """``repr`` without object addresses, sets sorted (their order differs between processes)."""
    if isinstance(value, list | tuple):
        inner = ", ".join(_canonical(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if isinstance(value, set | frozenset):
        return "{" + ", ".join(sorted(_canonical(v) for v in value)) + "}"
    if isinstance(value, Mapping):
        items = sorted(value.items(), key=lambda kv: str(kv[0]))
        return "{" + ", ".join(f"{k!r}: {_canonical(v)}" for k, v in items) + "}"
    return _ADDRESS.sub("", repr(value))


_ADDRESS = re.compile(r" (?:object )?at 0x[0-9a-fA-F]+")

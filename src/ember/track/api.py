"""``create_run`` and ``load_run``: where runs come from."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ember.errors import ConfigError, TrackingError, describe, short_repr
from ember.track._fs import (
    RUNS_DIR,
    check_description,
    check_folder,
    check_labels,
    check_name,
    get_rank,
    resolve_home,
)
from ember.track.hparams import HParams
from ember.track.run import NoOpRun, Run, new_meta
from ember.track.store import resolve

CONFIG_KEYS = ("name", "hparams", "labels", "description", "folder")


def _read_config(config_path: str | os.PathLike[str]) -> dict[str, Any]:
    """The overrides in a run's YAML config file, checked against :data:`CONFIG_KEYS`."""
    from ember.config.sources import read_yaml  # ember's one YAML loader; only runs made from a config file pay

    if not isinstance(config_path, str | os.PathLike):
        raise TrackingError(f"config_path must be the path of a YAML file, got {describe(config_path)}")
    path = Path(config_path)
    if not path.exists():
        raise TrackingError(f"config_path {path} does not exist; pass the path of a YAML file")
    try:
        data = read_yaml(path, f"config_path {path}")
    except ConfigError as e:
        raise TrackingError(str(e)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise TrackingError(
            f"config_path {path} must hold a mapping such as 'name: mnist', not a {type(data).__name__}"
        )
    unknown = sorted(str(k) for k in data if k not in CONFIG_KEYS)
    if unknown:
        raise TrackingError(
            f"config_path {path}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(CONFIG_KEYS)}"
        )
    return data


def create_run(
    name: str = "default",
    hparams: dict[str, Any] | None = None,
    labels: list[str] | None = None,
    description: str = "",
    config_path: str | os.PathLike[str] | None = None,
    folder: str = "default",
    home: str | os.PathLike[str] | None = None,
    auto_upload: bool = False,
    make_folder: bool = False,
    conflict_strategy: str = "new",
) -> Run:
    """Start a run in the local store; ranks other than 0 get a :class:`NoOpRun`.

    Records the platform, git state and command line in ``platform.json`` and tees the
    process's stdout/stderr into ``stdout.log`` until :meth:`Run.finish` (or exit).

    Args:
        name: the run's name, the start of its folder name (no '/', '\\', '..').
        hparams: hyper-parameters, JSON-serialisable.
        labels: labels to filter runs by.
        description: free text.
        config_path: a YAML file whose keys (name, hparams, labels, description, folder)
            override these arguments; its hparams are merged over ``hparams``.
        folder: the console folder the run is filed under when uploaded.
        home: the store root; default ``$EMBER_HOME`` or ``./.ember`` (runs go in ``runs/``).
        auto_upload: also stream the run to the server you logged in to, from a background
            thread that never blocks or fails training (see :mod:`ember.track.client`).
        make_folder: with ``auto_upload``, create ``folder`` on the server when missing.
        conflict_strategy: with ``auto_upload``, what to do when the server folder already
            holds another run of this name: new, skip, error or replace.

    Returns:
        The open :class:`Run`. Unfinished runs are finished at interpreter exit (Failed or
        Interrupted when an exception ended the program, else Complete).

    Raises:
        TrackingError: a bad argument or config file; nothing is created.

    Example:
        >>> run = track.create_run(name="mnist-ddp", hparams={"lr": 1e-3, "batch_size": 64})
        >>> run.log("train", {"loss": 0.31}, step=500, epoch=1)
        >>> run.finish()
    """
    merged_hparams = dict(hparams or {})
    if config_path is not None:
        config = _read_config(config_path)
        name = config.get("name", name)
        labels = config.get("labels", labels)
        description = config.get("description", description)
        folder = config.get("folder", folder)
        extra = config.get("hparams") or {}
        if not isinstance(extra, dict):
            raise TrackingError(f"config_path {config_path}: hparams must be a mapping")
        merged_hparams.update(extra)
    checked = HParams({}, lambda: None)
    checked.update(merged_hparams)
    meta = new_meta(
        check_name(name),
        check_folder(folder),
        check_labels(labels),
        check_description(description),
        checked.to_dict(),
    )
    from ember.track.client import CONFLICTS, credentials

    if conflict_strategy not in CONFLICTS:  # checked with or without auto_upload: a typo is never silent
        raise TrackingError(f"conflict_strategy {short_repr(conflict_strategy)}: use one of {', '.join(CONFLICTS)}")
    for flag, value in (("auto_upload", auto_upload), ("make_folder", make_folder)):
        if not isinstance(value, bool):
            raise TrackingError(f"{flag} must be True or False, got {describe(value)}")
    if get_rank() != 0:
        return NoOpRun(meta)
    upload = None
    if auto_upload:
        credentials()  # not logged in: say so now, not from the background thread
        upload = {"folder": meta["folder"], "make_folder": make_folder, "conflict_strategy": conflict_strategy}
    return Run.create(resolve_home(home) / RUNS_DIR, meta, upload)


def load_run(
    path: str | os.PathLike[str],
    resume: bool = False,
    home: str | os.PathLike[str] | None = None,
) -> Run:
    """Open a run of the store to read it or, with ``resume=True``, to continue it.

    Resuming sets the status back to Running, appends to the same metric files (after cutting
    a line torn by a crash), tees stdout again and notes the resume in ``run.json``. To not
    log a step twice, skip steps ``<= run.last_step(type)``.

    Args:
        path: the run's folder, its folder name, or a unique prefix of the name.
        resume: reopen for writing; on ranks other than 0 this returns a :class:`NoOpRun`.
        home: the store root searched for names; default ``$EMBER_HOME`` or ``./.ember``.

    Returns:
        The :class:`Run` (read-only unless ``resume``).

    Raises:
        TrackingError: no such run, an ambiguous prefix, or (resume) a process still owns it: it
            holds the run's lock (held from create_run or a resume until ``finish``, released by
            the OS when that process dies), or run.json says Running in a live process.

    Example:
        >>> run = track.load_run(".ember/runs/mnist_240520_101500_a1b2c3", resume=True)
        >>> start = (run.last_step("train") or -1) + 1
    """
    if resume and get_rank() != 0:
        return NoOpRun(new_meta("default", "default", [], "", {}))
    folder = resolve(path, resolve_home(home))
    return Run.reopen(folder) if resume else Run.load(folder)

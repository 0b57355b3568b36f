"""T9k's ``em`` module on :mod:`ember.track`: the same calls, ember's runs and artifacts.

======================================================  =====================================
T9k                                                     ember
======================================================  =====================================
``em.create_run(config_path, name, hparams, ...)``      :func:`create_run` (adapter: order)
``em.load_run(path, auto_upload, folder, ...)``         :func:`load_run` (adapter: arguments)
``em.create_artifact(name, labels, description)``       :func:`ember.track.create_artifact`
``em.load_artifact(path)``                              :func:`ember.track.load_artifact`
``em.login(ais_host, api_key)``                         :func:`login` (adapter: names)
``em.logout()``                                         :func:`ember.track.logout`
``em.upload(path, folder, make_folder, ...)``           :func:`ember.track.client.upload`
``em.Run`` / ``em.Artifact``                            :class:`ember.track.Run` / ``Artifact``
======================================================  =====================================

The objects are ember's own: ``run.log``, ``run.hparams``, ``run.mark_input/mark_output``,
``run.finish``, ``run.upload`` and ``artifact.add_file/add_dir/add_reference`` are the methods
of :class:`ember.track.Run` and :class:`ember.track.Artifact`. On ranks other than 0 the
functions return ember's no-op run and artifact (same API, nothing stored), so T9k's
``if rank == 0:`` guards are kept or dropped alike.
"""

from __future__ import annotations

import os
from typing import Any

from ember import track
from ember.errors import TrackingError
from ember.track import Artifact, Run, create_artifact, load_artifact, logout
from ember.track.client import upload

__all__ = [
    "Artifact",
    "Run",
    "create_artifact",
    "create_run",
    "load_artifact",
    "load_run",
    "login",
    "logout",
    "upload",
]


def create_run(
    config_path: str | os.PathLike[str] | None = None,
    name: str = "default",
    hparams: dict[str, Any] | None = None,
    labels: list[str] | None = None,
    description: str = "",
    auto_upload: bool = False,
    folder: str = "default",
    make_folder: bool = False,
    conflict_strategy: str = "new",
) -> Run:
    """Start a run: :func:`ember.track.create_run` with T9k's argument order (``config_path`` first).

    Args:
        config_path: a YAML file whose ``name``, ``hparams``, ``labels``, ``description`` and
            ``folder`` override the arguments (its hparams are merged over ``hparams``).
        name: the run's name.
        hparams: hyper-parameters (JSON data).
        labels: labels of the run.
        description: free text.
        auto_upload: stream the run to the server you logged in to while it trains.
        folder: the server folder the run is filed under (relative: under your home).
        make_folder: create ``folder`` on the server when missing (with ``auto_upload``).
        conflict_strategy: for another run of this name there: new, skip, error or replace.

    Returns:
        ember's :class:`~ember.track.Run` (a no-op one on ranks other than 0).

    Example:
        >>> run = em.create_run(name="mnist_torch_distributed", hparams={"batch_size": 64})
    """
    return track.create_run(
        name=name,
        hparams=hparams,
        labels=labels,
        description=description,
        config_path=config_path,
        folder=folder,
        auto_upload=auto_upload,
        make_folder=make_folder,
        conflict_strategy=conflict_strategy,
    )


def load_run(
    path: str | os.PathLike[str],
    auto_upload: bool = False,
    folder: str = "default",
    make_folder: bool = False,
    conflict_strategy: str = "new",
) -> Run:
    """Open a run of the local store to read or upload it (:func:`ember.track.load_run`).

    Args:
        path: the run's folder, its folder name, or a unique prefix of the name.
        auto_upload: not available on a loaded run; ``run.upload(folder, make_folder,
            conflict_strategy)`` uploads it, and ``ember.track.load_run(path, resume=True)``
            continues it.
        folder, make_folder, conflict_strategy: used with ``auto_upload`` only, as in T9k.

    Returns:
        The read-only :class:`~ember.track.Run`.

    Raises:
        TrackingError: no such run, or ``auto_upload=True``.

    Example:
        >>> run = em.load_run(".ember/runs/mnist_torch_231222_141932_61p5jc")
        >>> run.upload(folder="default", make_folder=True)
    """
    if auto_upload:
        raise TrackingError(
            f"load_run({str(path)!r}, auto_upload=True): ember uploads a loaded run with "
            f"run.upload(folder={folder!r}, make_folder={make_folder}, conflict_strategy={conflict_strategy!r}); "
            "to go on logging to it, use ember.track.load_run(path, resume=True)"
        )
    return track.load_run(path)


def login(ais_host: str | None = None, api_key: str | None = None, timeout: float | None = None) -> str:
    """Check an API key against an ember tracking server and remember both.

    :func:`ember.track.login` under T9k's argument names. With no arguments the server and
    key come from ``$EMBER_HOST``/``$EMBER_API_KEY``, else from the credentials stored by the
    last login (``ember login`` or this function).

    Args:
        ais_host: the server, e.g. ``http://127.0.0.1:8765``.
        api_key: the API key.
        timeout: not supported: ember's client waits up to 60 s a request. Leave it None.

    Returns:
        The user name the server knows the key by.

    Raises:
        ember.track.client.UploadError: not configured, unreachable, or the key is refused.
        TrackingError: ``timeout`` was given.

    Example:
        >>> em.login()                      # $EMBER_HOST / $EMBER_API_KEY or the stored login
    """
    if timeout is not None:
        raise TrackingError(
            f"login(timeout={timeout!r}): ember's client has a fixed 60 s timeout a request; drop the timeout argument"
        )
    return track.login(ais_host, api_key)

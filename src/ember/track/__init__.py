"""Experiment tracking: runs, hyper-parameters, metrics, artifacts and lineage, stored locally.

The store needs nothing running: runs go to ``./.ember/runs`` and artifacts to
``./.ember/artifacts`` (``$EMBER_HOME`` or a ``home=`` argument moves both). Only rank 0
writes; the other ranks get objects with the same API that check arguments and store nothing.
The on-disk layout is described in ``docs/tracking.md``.

Example:
    >>> from ember import track
    >>> run = track.create_run(name="mnist-ddp", hparams={"lr": 1e-3, "batch_size": 64})
    >>> run.log(type="train", metrics={"loss": 0.31}, step=500, epoch=1)
    >>> art = track.create_artifact(name="mnist-model")
    >>> art.add_file("model.pt")
    >>> run.mark_output(art)
    >>> run.finish()

Importing this package is cheap: torch is imported only when a run records the platform,
PyYAML only for ``config_path``.
"""

from __future__ import annotations

from ember.track.api import create_run, load_run
from ember.track.artifact import Artifact, NoOpArtifact, create_artifact, load_artifact
from ember.track.hparams import HParams
from ember.track.run import NoOpRun, Run, edit_run


def login(host: str | None = None, api_key: str | None = None) -> str:
    """Check an API key against a tracking server and remember both (``~/.ember/credentials``).

    See :func:`ember.track.client.login`. Example: ``track.login("http://127.0.0.1:8765", key)``.
    """
    from ember.track.client import login as _login

    return _login(host, api_key)


def logout() -> bool:
    """Forget the stored server credentials; return whether there were any."""
    from ember.track.client import logout as _logout

    return _logout()


__all__ = [
    "Artifact",
    "HParams",
    "NoOpArtifact",
    "NoOpRun",
    "Run",
    "create_artifact",
    "create_run",
    "edit_run",
    "load_artifact",
    "load_run",
    "login",
    "logout",
]

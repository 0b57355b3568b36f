"""A local store's layout, public: its home folder, and the folders of runs and artifacts in it.

For readers outside ``ember.track`` (``ember ui`` indexes a store, :mod:`ember.server.console`);
the names are defined beside the store's file helpers (``_fs.py``).

Example:
    >>> from ember.track.layout import RUNS_DIR, resolve_home
    >>> resolve_home(None) / RUNS_DIR   # $EMBER_HOME/runs, else ./.ember/runs (absolute)
    PosixPath('/work/project/.ember/runs')
"""

from __future__ import annotations

from ember.track._fs import ARTIFACTS_DIR, RUNS_DIR, resolve_home

__all__ = ["ARTIFACTS_DIR", "RUNS_DIR", "resolve_home"]

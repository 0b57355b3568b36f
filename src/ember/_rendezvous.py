"""``ember run`` across machines: torch's c10d rendezvous, with failures that say what was seen.

torchrun's c10d rendezvous (``torch.distributed.elastic``) ends a wait for missing machines
with a bare ``RendezvousTimeoutError``, and an unreachable endpoint with "The connection to
the C10d store has failed". ``ember run`` uses the same rendezvous under the backend name
:data:`BACKEND`: each agent also records its host name and pid in the rendezvous store when
it arrives, so that a timeout names the endpoint, the job id, the machines that did come and
the timeout, and an unreachable endpoint names itself.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING

from torch.distributed.elastic.rendezvous import (
    RendezvousConnectionError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousTimeoutError,
    rendezvous_handler_registry,
)

from ember.errors import LaunchError

if TYPE_CHECKING:
    from torch.distributed import Store

BACKEND = "ember-c10d"
"""The rendezvous backend name ``ember run`` passes to torchrun: c10d underneath."""

DEFAULT_JOIN_TIMEOUT_S = 600
"""torch's default ``join_timeout``: how long machines may take to arrive."""


def check_endpoint(endpoint: str) -> None:
    """Refuse an ``--rdzv-endpoint`` that is not ``HOST:PORT`` (torch would raise a bare ValueError later)."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise LaunchError(
            f"ember run: --rdzv-endpoint {endpoint!r} is not HOST:PORT: give the address of the first machine "
            "and a free port on it that every machine can reach, e.g. --rdzv-endpoint node0.cluster:29400"
        )


def register() -> None:
    """Make :data:`BACKEND` known to torchrun (idempotent)."""
    rendezvous_handler_registry.register(BACKEND, _create)


def _create(params: RendezvousParameters) -> RendezvousHandler:
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

    try:
        backend, store = create_backend(params)
    except RendezvousConnectionError as exc:
        cause = str(exc.__cause__ or exc).strip().splitlines()[0].rstrip(".")  # not torch's C++ frames
        read_timeout = params.get_as_int("read_timeout", 60)
        raise RendezvousConnectionError(
            f"could not reach the rendezvous at {params.endpoint} (job id {params.run_id!r}) within "
            f"{read_timeout} s: {cause}. Start `ember run` on the machine named in --rdzv-endpoint "
            f"(it hosts the rendezvous), and check that this machine can reach that host and port "
            "(host name, firewall)"
        ) from None
    return _NamingRendezvous(create_handler(store, backend, params), store, params)


class _NamingRendezvous(RendezvousHandler):
    """torch's dynamic (c10d) rendezvous handler, plus a list of the agents that came."""

    def __init__(self, inner: RendezvousHandler, store: Store, params: RendezvousParameters) -> None:
        self._inner, self._store = inner, store
        self._endpoint, self._run_id = params.endpoint, params.run_id
        self._min_nodes, self._max_nodes = params.min_nodes, params.max_nodes
        self._join_timeout = params.get_as_int("join_timeout", DEFAULT_JOIN_TIMEOUT_S)
        self._key = f"ember.rendezvous.{params.run_id}"
        self._me = f"{socket.gethostname()} (pid {os.getpid()})"
        self._announced = False

    def get_backend(self) -> str:
        return BACKEND

    @property
    def use_agent_store(self) -> bool:
        return self._inner.use_agent_store

    def next_rendezvous(self) -> RendezvousInfo:
        self._announce()
        try:
            return self._inner.next_rendezvous()
        except RendezvousTimeoutError:
            raise RendezvousTimeoutError(self._timeout_message()) from None

    def is_closed(self) -> bool:
        return self._inner.is_closed()

    def set_closed(self) -> None:
        self._inner.set_closed()

    def num_nodes_waiting(self) -> int:
        return self._inner.num_nodes_waiting()

    def get_run_id(self) -> str:
        return self._inner.get_run_id()

    def shutdown(self) -> bool:
        return self._inner.shutdown()

    def _announce(self) -> None:
        """Record this agent in the store once: ``<key>.count`` and ``<key>.<n>`` = "host (pid N)"."""
        if self._announced:
            return
        n = self._store.add(f"{self._key}.count", 1)
        self._store.set(f"{self._key}.{n}", self._me)
        self._announced = True

    def _seen(self) -> list[str]:
        """The agents that came to this rendezvous so far, this one marked."""
        count = self._store.add(f"{self._key}.count", 0)
        names = [self._store.get(f"{self._key}.{n}").decode() for n in range(1, count + 1)]
        return [f"{name} (this machine)" if name == self._me else name for name in names]

    def _timeout_message(self) -> str:
        nodes = (
            f"{self._min_nodes}"
            if self._min_nodes == self._max_nodes
            else f"at least {self._min_nodes} (of {self._min_nodes}:{self._max_nodes})"
        )
        try:
            seen = self._seen()
            came = f"{len(seen)} came: {', '.join(seen)}"
        except (RuntimeError, OSError) as exc:  # the store's host went away meanwhile
            came = f"the machines that came cannot be listed (the rendezvous store did not answer: {exc})"
        return (
            f"the rendezvous at {self._endpoint} (--rdzv-id {self._run_id}) did not complete within "
            f"{self._join_timeout} s: it needs {nodes} machine(s) (--nnodes) and {came}. Start `ember run` "
            f"with the same --nnodes, --rdzv-endpoint and --rdzv-id on the missing machine(s), check that "
            f"each can reach {self._endpoint} (firewall), or wait longer with --rdzv-conf join_timeout=SECONDS"
        )

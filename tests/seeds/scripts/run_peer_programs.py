"""Run the vendored example programs one after another in this process (or this torchrun job).

``python run_peer_programs.py "[NAME=VALUE...] PROGRAM [ARG...]"...`` runs each program as its ``__main__``
(``runpy``), from its own folder and with its own command line, and reports per program the
lines it printed and logged. Each program starts as a fresh job would: the launch of the one
before is forgotten (``ember.context.reset()``) and, under torchrun, the next one meets at a
new port that rank 0 hosts (a process group cannot be set up twice on one torchrun store).
On a machine without CUDA the programs' ``tensor.cuda()`` and ``torch.cuda.synchronize()``
(ColossalAI-Examples call them unconditionally) stay on the CPU: the harness maps them to
no-ops, the programs are unchanged.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import logging
import os
import re
import runpy
import shlex
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from tests.dist import report

import ember

PROGRAMS = Path(__file__).parents[1] / "programs"


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def _cpu_for_cuda_calls() -> Iterator[None]:
    if torch.cuda.is_available():
        yield
        return
    cuda, sync = torch.Tensor.cuda, torch.cuda.synchronize
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
    torch.cuda.synchronize = lambda *args, **kwargs: None
    try:
        yield
    finally:
        torch.Tensor.cuda, torch.cuda.synchronize = cuda, sync  # type: ignore[method-assign]


def _fresh_rendezvous(index: int) -> None:
    """Under torchrun: move the job's rendezvous to a new port chosen by rank 0 (through a file)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or index == 0:
        return
    exchange = Path(os.environ["EMBER_TEST_OUT"]) / f"port{index}"
    if os.environ.get("RANK") == "0":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        exchange.with_suffix(".tmp").write_text(str(port))
        exchange.with_suffix(".tmp").rename(exchange)
    deadline = time.monotonic() + 60
    while not exchange.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0 chose no port for program {index}")
        time.sleep(0.05)
    os.environ["MASTER_PORT"] = exchange.read_text()
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "False"  # rank 0 hosts the new store


def run(spec: str, index: int = 0) -> list[str]:
    """Run ``[NAME=value...] programs/<path> [args]`` as ``__main__`` in its folder, with those
    environment variables set (as a shell would); the lines it printed or logged. ``CWD=dir``
    among them runs it from ``dir`` instead (for a program that writes into its working folder,
    as pytorch-accelerated's ``SaveBestModelCallback`` does): its folder still comes first on
    ``sys.path``, as under ``python path/to/program.py``."""
    words = shlex.split(spec)
    env = dict(w.split("=", 1) for w in itertools.takewhile(lambda w: re.match(r"[A-Z_][A-Z0-9_]*=", w), words))
    path, *args = words[len(env) :]
    _fresh_rendezvous(index)
    before = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    program = PROGRAMS / path
    out, logged, cwd, argv = io.StringIO(), _Lines(), os.getcwd(), sys.argv
    ours = logging.getLogger("ember")
    level = ours.level
    ours.setLevel(logging.INFO)  # what a program's logging setup would show: its logger.info lines
    logging.getLogger().addHandler(logged)
    sys.path.insert(0, str(program.parent))  # as `python program.py` puts its folder first
    modules = set(sys.modules)
    try:
        os.chdir(env.get("CWD", program.parent))
        sys.argv = [str(program), *args]
        with contextlib.redirect_stdout(out), _cpu_for_cuda_calls():
            runpy.run_path(str(program), run_name="__main__")
    finally:
        sys.path.remove(str(program.parent))
        for name in set(sys.modules) - modules:  # the program's own modules (`from resnet import ...`)
            if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(program.parent)):
                del sys.modules[name]
        for name, value in before.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value
        os.chdir(cwd)
        sys.argv = argv
        logging.getLogger().removeHandler(logged)
        ours.setLevel(level)
        if ember.context.is_launched():
            ember.context.reset()
    return [*out.getvalue().splitlines(), *logged.lines]


if __name__ == "__main__":
    report({spec: run(spec, i) for i, spec in enumerate(sys.argv[1:])})

"""Run the vendored example programs one after another in this process (or this torchrun job).

``python run_peer_programs.py "[NAME=VALUE...] PROGRAM [ARG...]"...`` runs each program as its ``__main__``
(``runpy``), from its own folder and with its own command line, and reports per program the
lines it printed and logged, and under ``"trainers"`` what its pytorch-accelerated Trainers
hold at the end (:func:`trainer_summary`: what the output cannot show, such as the scheduler's
state, and a digest of the weights to compare the processes'). Each program starts as a fresh
job would: the launch of the one before is forgotten (``ember.context.reset()``) and, under
torchrun, the next one meets at a new port that rank 0 hosts (a process group cannot be set up
twice on one torchrun store).
On a machine without CUDA the programs' ``tensor.cuda()`` and ``torch.cuda.synchronize()``
(ColossalAI-Examples call them unconditionally) stay on the CPU: the harness maps them to
no-ops, the programs are unchanged.
"""

from __future__ import annotations

import contextlib
import faulthandler
import hashlib
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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


class EpochRecorder:
    """A pytorch-accelerated callback, added last: at each epoch's end (after the program's own
    callbacks, ``SaveBestModelCallback``'s save included) it notes the run history's epoch, its
    latest metrics and a copy of the model's weights in :attr:`epochs`; at the end of each
    ``train`` call (after ``SaveBestModelCallback`` loaded the best weights back) a copy of the
    weights in :attr:`ends`."""

    def __init__(self) -> None:
        self.epochs: list[dict[str, Any]] = []
        self.ends: list[dict[str, Any]] = []

    def on_training_run_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        history = trainer.run_history
        self.epochs.append({
            "epoch": history.current_epoch,
            "metrics": {name: float(history.get_latest_metric(name)) for name in history.get_metric_names()},
            "weights": _weights(trainer),
        })  # fmt: skip

    def on_training_run_end(self, trainer: Any, **kwargs: Any) -> None:
        self.ends.append({"epochs_before": len(self.epochs), "weights": _weights(trainer)})


def _weights(trainer: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


@contextlib.contextmanager
def trainers_built() -> Iterator[list[Any]]:
    """The pytorch-accelerated Trainers (``ember.compat``) built inside, each with an
    :class:`EpochRecorder` as ``trainer.recorder``: the programs keep their Trainer in a local,
    and what it holds at the end (its scheduler, the weights it reloaded) is what the tests check
    beyond the printed lines."""
    from ember.compat.pytorch_accelerated.trainer import Trainer

    built: list[Any] = []
    init = Trainer.__init__

    def recording(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.recorder = EpochRecorder()
        self.callback_handler.add_callback(self.recorder)
        built.append(self)

    Trainer.__init__ = recording  # type: ignore[method-assign]
    try:
        yield built
    finally:
        Trainer.__init__ = init  # type: ignore[method-assign]


def digest(weights: dict[str, torch.Tensor]) -> str:
    """A hash of a state dict's names and exact values: equal digests, equal weights."""
    h = hashlib.sha256()
    for name, tensor in weights.items():
        h.update(name.encode())
        h.update(tensor.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def trainer_summary(trainer: Any) -> dict[str, Any]:
    """What a Trainer holds after the program, as JSON: the process count, pytorch-accelerated's
    update counts, the last scheduler's plain state, the first group's learning rate, the run
    history, a digest of the weights at each epoch's end and at the end, and
    ``trainer.gather`` of this process's rank (a collective: every process calls it)."""
    scheduler = trainer.scheduler
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    return {
        "world": torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1,
        "updates_per_epoch": trainer.run_config.num_update_steps_per_epoch,
        "local_updates_per_epoch": trainer.run_config.num_local_update_steps_per_epoch,
        "scheduler": None if scheduler is None else {
            k: v for k, v in scheduler.state_dict().items() if isinstance(v, (int, float, str))},
        "lr": trainer.optimizer.param_groups[0]["lr"],
        "metrics": {k: [float(v) for v in trainer.run_history.get_metric_values(k)]
                    for k in trainer.run_history.get_metric_names()},
        "epochs": [{**e, "weights": digest(e["weights"])} for e in trainer.recorder.epochs],
        "weights": digest(trainer.model.state_dict()),
        "gathered": trainer.gather(torch.tensor([float(rank)])).tolist(),
    }  # fmt: skip


def run(spec: str, index: int = 0, inspect: Callable[[], Any] | None = None) -> list[str]:
    """Run ``[NAME=value...] programs/<path> [args]`` as ``__main__`` in its folder, with those
    environment variables set (as a shell would); the lines it printed or logged. ``CWD=dir``
    among them runs it from ``dir`` instead (for a program that writes into its working folder,
    as pytorch-accelerated's ``SaveBestModelCallback`` does): its folder still comes first on
    ``sys.path``, as under ``python path/to/program.py``. ``inspect()`` runs after the program,
    before its launch is forgotten (while its process group is up)."""
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
        if inspect is not None:
            inspect()
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


def main(specs: list[str]) -> None:
    """Run each program in turn; report its lines and its Trainers' summaries.

    With ``$PEER_PROGRAMS_DUMP_AFTER_S`` set, a process still running after that many seconds
    prints every thread's Python stack to stderr and exits: a hung launch then fails with the
    place it hung in the test's report, before pytest's own timeout kills torchrun unheard.
    """
    if os.environ.get("PEER_PROGRAMS_DUMP_AFTER_S"):
        faulthandler.dump_traceback_later(float(os.environ["PEER_PROGRAMS_DUMP_AFTER_S"]), exit=True)
    lines: dict[str, list[str]] = {}
    summaries: dict[str, list[dict[str, Any]]] = {}
    for i, spec in enumerate(specs):
        with trainers_built() as built:
            lines[spec] = run(spec, i, inspect=lambda: summaries.__setitem__(spec, [trainer_summary(t) for t in built]))  # noqa: B023
    report({**lines, "trainers": summaries})


if __name__ == "__main__":
    main(sys.argv[1:])

"""Record a Trainer run in ember's tracking store: hyper-parameters, metrics, checkpoints."""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ember import distributed
from ember.batch import batches_per_epoch
from ember.errors import HookError
from ember.trainer.hooks.base import Priority
from ember.trainer.hooks.memory import memory_usage
from ember.trainer.hooks.timing import ThroughputHook, ThroughputMeter
from ember.trainer.hooks.writer import StepWriter
from ember.trainer.storage import Mode

if TYPE_CHECKING:
    from ember.track import Artifact, Run


EPOCH_POINT_TYPES: dict[str, str] = {"train": "train_epoch", "test": "val"}
"""The tracking point type of each ``trainer.history`` phase, recorded at each epoch's end.

The Trainer's test pass during ``fit`` is a validation: the tracking store calls it ``val``,
as MLflow's and T9k's ``log(type="val")`` and detectron2's evaluation during training do,
while the history keeps ember's (and Colossal-AI's) ``test/<metric>`` names, which
``save_best="test/loss"`` and ``monitor=`` refer to. This table is the one place the two meet.
"""

_POINT_NAMES: dict[str, str] = {"throughput/samples_per_s": "samples_per_s"}
"""Storage names whose ``train`` point name is not the storage name less ``train/``."""


@functools.cache  # called for every value of every point: a few names, each looked up once
def point_name(storage_name: str) -> str:
    """The name a step-storage scalar has in a ``train`` point: ``train/loss`` is ``loss``,
    ``throughput/samples_per_s`` is ``samples_per_s``, any other ``train/<x>`` is ``<x>``,
    and every other name stays as put (``time/step_s``, ``lr``)."""
    named = _POINT_NAMES.get(storage_name)
    if named is not None:
        return named
    return storage_name[len("train/") :] if storage_name.startswith("train/") else storage_name


@runtime_checkable
class DeclaresMetricModes(Protocol):
    """A hook that knows which way the history metrics it watches are better: an
    ``EarlyStoppingHook`` or a ``CheckpointHook(save_best=...)`` given a ``mode``, or your own.

    The :class:`TrackingHook` records each in its run (:func:`tracked_names` gives the run's
    names of a history metric), so that "best" in the console and ``ember runs compare`` follows
    the mode the training used rather than the metric's name.

    Example:
        >>> class MyHook(BaseHook):
        ...     def metric_modes(self) -> dict[str, Mode]:
        ...         return {"test/score_gap": "min"}
    """

    def metric_modes(self) -> Mapping[str, Mode]:
        """``{history name: "min" or "max"}`` (``{}``: nothing to say)."""
        ...


def tracked_names(history_name: str) -> list[str]:
    """The run's ``TYPE/NAME`` keys of a ``trainer.history`` metric (see :data:`EPOCH_POINT_TYPES`):
    ``test/acc`` is ``val/acc``; ``train/acc`` is ``train_epoch/acc`` and, for the ``train``
    points' scalar of the same name, ``train/acc``; other phases are not tracked (``[]``).

    Example:
        >>> tracked_names("test/score_gap"), tracked_names("train/loss")
        (['val/score_gap'], ['train_epoch/loss', 'train/loss'])
    """
    phase, _, metric = history_name.partition("/")
    type_ = EPOCH_POINT_TYPES.get(phase)
    if type_ is None or not metric:
        return []
    return [f"{type_}/{metric}", f"train/{metric}"] if phase == "train" else [f"{type_}/{metric}"]


class TrackingHook(StepWriter):
    """Log the run to ``ember.track`` (one run per job: only rank 0 writes).

    What is recorded:

    - hparams: the ember config's settings, the optimizer's class and defaults, per-rank batch
      size, world size, accumulation, epochs / max_steps, plus ``hparams`` you pass;
    - type ``train``, every ``log_every_n_steps`` optimizer updates: what ``trainer.storage``
      got since the previous ``train`` point, each scalar's newest value (this hook is a
      :class:`~ember.trainer.hooks.writer.StepWriter`, like the step logger and TensorBoard),
      named by :func:`point_name`: ``loss`` (a ``LossHook``'s ``train/loss``: the loss of the
      batch that made the update), ``samples_per_s``, ``time/step_s`` and ``time/eta_s``, your
      hooks' scalars; and ``lr``. Throughput is measured once: by the ``ThroughputHook`` when
      one is registered (its ``every_n`` window), otherwise by this hook's own
      :class:`~ember.trainer.hooks.timing.ThroughputMeter` over the ``log_every_n_steps``
      window (samples of all ranks over wall time, test passes left out);
    - type ``train_epoch``, each epoch: the epoch's averaged train metrics (``loss``, ``accuracy``...);
    - type ``val``, after each test pass during ``fit``: the test metrics (the history's
      ``test/<metric>``; see :data:`EPOCH_POINT_TYPES` for why the two names differ);
    - type ``system``, every ``system_interval_s`` seconds: process memory (and CUDA memory),
      ``cpu_percent`` (this process's CPU time over the interval's wall time; 100 is one busy
      core) and ``load_1m`` (the 1-minute load average, where the OS has one);
    - the mode (``min``/``max``) of each metric that another hook watches with an explicit
      ``mode`` (an ``EarlyStoppingHook``, a ``CheckpointHook(save_best=...)``: any
      :class:`DeclaresMetricModes`), through ``Run.define_metric``, so that the console's "best"
      of ``val/score_gap`` is its minimum when early stopping minimised it;
    - at the end: the final and best checkpoints of a :class:`CheckpointHook`, in one output
      artifact ``<run name>-checkpoints`` per run, and the run's status with its reason
      (``trainer.fit_outcome``): Complete, Failed (an exception, or another hook's ``after_train``
      raised), Interrupted (``KeyboardInterrupt``) or Preempted (SIGTERM/SIGINT with a
      CheckpointHook: saved, and resumed by running the job again, which sets it back to Running).

    The run's id and path are part of this hook's ``state_dict``, so a job resumed from a
    checkpoint continues the same run and skips the steps it had already logged; its end
    updates the run's checkpoints artifact (found through the run's lineage) to the final and
    best checkpoints of then, rather than adding a second one.

    Args:
        name: the run's name (default: ``"train"``).
        hparams: extra hyper-parameters to record.
        run: an existing run to log to (the hook then does not finish it).
        log_every_n_steps: optimizer updates between ``train`` points.
        system_interval_s: seconds between ``system`` points (None: never).
        labels: run labels.
        folder: the server folder the run is meant for (see ``docs/tracking.md``).
        home: the store's root (default ``$EMBER_HOME`` or ``./.ember``).

    Example:
        >>> trainer.fit(train_dl, epochs=3, hooks=[hooks.LossHook(), hooks.TrackingHook(name="digits")])
    """

    def __init__(
        self,
        name: str | None = None,
        hparams: Mapping[str, Any] | None = None,
        run: Run | None = None,
        log_every_n_steps: int = 1,
        system_interval_s: float | None = 30.0,
        labels: list[str] | None = None,
        folder: str = "default",
        home: str | None = None,
        priority: int | str = Priority.LOWEST,
    ) -> None:
        super().__init__(log_every_n_steps, priority, None, every_n_arg="log_every_n_steps")
        self.run_name = name or "train"
        self.extra_hparams = dict(hparams or {})
        self.run = run
        self._owns_run = run is None
        self.system_interval_s = system_interval_s
        self.labels = labels
        self.folder = folder
        self.home = home
        self._resume_path: str | None = None
        self._skip_until: dict[str, int] = {}
        self._skip_train = -1  # _skip_until["train"], read at every step
        self._last_system = 0.0
        self._last_cpu = 0.0  # process CPU seconds at the last system point
        self._meter: ThroughputMeter | None = None  # ours, when no ThroughputHook measures

    @property
    def log_every_n_steps(self) -> int:
        """Optimizer updates between ``train`` points (the writer's ``every_n``)."""
        return self.every_n

    # -- lifecycle ----------------------------------------------------------------------------
    def before_train(self) -> None:
        from ember import track

        if self.run is None:
            if self._resume_path is not None and distributed.rank() == 0:
                self.run = track.load_run(self._resume_path, resume=True, home=self.home)
                self._skip_until = {t: s for t in ("train", *EPOCH_POINT_TYPES.values(), "system")
                                    if (s := self.run.last_step(t)) is not None}  # fmt: skip
                self._skip_train = self._skip_until.get("train", -1)
            else:
                self.run = track.create_run(name=self.run_name, labels=self.labels, folder=self.folder, home=self.home)
        self.run.hparams.update(self._hparams(), override=True)
        self._define_metrics(self.run)
        self._last_system, self._last_cpu = time.monotonic(), time.process_time()
        trainer = self.trainer
        measured = any(isinstance(h, ThroughputHook) for h in trainer.hooks)
        self._meter = None if measured else ThroughputMeter(self.every_n)
        if self._meter is not None:
            self._meter.before_train(trainer)

    def before_train_epoch(self) -> None:
        if self._meter is not None:
            self._meter.before_train_epoch(self.trainer)

    def before_test(self) -> None:
        if self._meter is not None:
            self._meter.before_test(self.trainer)

    def after_test(self) -> None:
        if self._meter is not None:
            self._meter.after_test(self.trainer)

    def after_update(self) -> None:
        # Runs at every update: kept to a few attribute reads, and per point one storage read
        # (the one device sync) and one Run.log of plain floats.
        if self._meter is not None:
            self._meter.after_update(self.trainer)
        super().after_update()

    def writes_at(self, step: int) -> bool:
        """Not the steps a resumed run has already."""
        return step > self._skip_train

    def write(self, step: int, scalars: dict[str, float]) -> None:
        """A ``train`` point of ``scalars``, and a ``system`` point when one is due."""
        run = self.run
        assert run is not None
        points = {point_name(n): v for n, v in scalars.items()}
        if len(points) < len(scalars):
            _name_clash(scalars)
        if points:
            run.log("train", points, step=step, epoch=self._epoch())
        interval = self.system_interval_s
        if interval is not None:
            wall = time.monotonic()
            if wall - self._last_system >= interval:
                self._log("system", self._system_metrics(wall))

    def after_train_epoch(self) -> None:
        trainer = self.trainer
        if self._meter is not None:
            self._meter.after_train_epoch(trainer)
        values = trainer.history.at(trainer.cur_epoch)
        for phase, type_ in EPOCH_POINT_TYPES.items():
            self._log(type_, _strip(values, f"{phase}/"))

    def after_train(self) -> None:
        run = self.run
        if run is None:
            return
        self._mark_checkpoints(run)
        if self._owns_run:
            status, reason = self.trainer.fit_outcome
            run.finish(status, reason)
        else:
            run.flush()

    # -- state --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        run = self.run
        if run is None or not run.active:
            return {"run_path": self._resume_path}
        run.flush()
        return {"run_path": str(run.path), "run_id": run.id}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._resume_path = state.get("run_path")

    # -- helpers ------------------------------------------------------------------------------
    def _system_metrics(self, wall: float) -> dict[str, float]:
        """Memory, CPU use since the last system point, and the load average; restarts the interval."""
        metrics = memory_usage(self.trainer.engine.device)
        cpu = time.process_time()
        elapsed = wall - self._last_system
        if elapsed > 0:
            metrics["cpu_percent"] = 100.0 * (cpu - self._last_cpu) / elapsed
        self._last_system, self._last_cpu = wall, cpu
        try:
            metrics["load_1m"] = os.getloadavg()[0]
        except (AttributeError, OSError):  # Windows has none; some systems cannot tell
            pass
        return metrics

    def _epoch(self) -> float:
        """Epochs trained so far, fractional: 0.5 halfway through the first, 1.0 at its end (issue 19).

        Every point of an epoch used to carry the epoch's integer index, so a chart over epochs drew
        vertical bars and the validation after the first epoch sat at 0. A loader without a length
        gives the epochs completed (the epoch in progress counts once it has ended).
        """
        trainer = self.trainer
        total = batches_per_epoch(trainer.train_dataloader)
        if not total:
            return float(trainer.cur_epoch + (1 if trainer.state.closing_epoch else 0))
        return trainer.cur_epoch + min(trainer.epoch_iter, total) / total

    def _log(self, type_: str, metrics: dict[str, Any]) -> None:
        assert self.run is not None
        step = self.trainer.cur_step
        if not metrics or step <= self._skip_until.get(type_, -1):
            return
        self.run.log(type_, metrics, step=step, epoch=self._epoch())

    def _hparams(self) -> dict[str, Any]:
        trainer = self.trainer
        engine = trainer.engine
        optimizer = engine.optimizer
        params: dict[str, Any] = {
            "optimizer": type(optimizer).__name__,
            "world_size": distributed.world_size(),
            "gradient_accumulation": engine.gradient_accumulation,
            "epochs": trainer.max_epochs,
            "max_steps": trainer.max_steps,
        }
        loader = trainer.train_dataloader
        if getattr(loader, "batch_size", None) is not None:
            params["batch_size"] = loader.batch_size
        for key, value in getattr(optimizer, "defaults", {}).items():
            if _plain(value):
                params[f"optimizer.{key}"] = value
        for key, value in engine.config.items():
            if _plain(value):
                params[f"config.{key}"] = value
        params.update(self.extra_hparams)
        return params

    def _define_metrics(self, run: Run) -> None:
        """Record in the run the modes the Trainer's hooks watch their metrics with (the first
        hook in run order wins where two disagree; a warning says so)."""
        chosen: dict[str, tuple[Mode, str]] = {}
        for hook in self.trainer.hooks:
            if not isinstance(hook, DeclaresMetricModes):
                continue
            for name, mode in hook.metric_modes().items():
                first = chosen.setdefault(name, (mode, hook.name))
                if first[0] != mode:
                    self.trainer.logger.warning(
                        f"TrackingHook: {hook.name} watches {name!r} with mode={mode!r} but {first[1]} "
                        f"with mode={first[0]!r}; the run records {first[0]!r}"
                    )
        for name, (mode, _) in chosen.items():
            for key in tracked_names(name):
                run.define_metric(key, mode)

    def _mark_checkpoints(self, run: Run) -> None:
        """Make the run's checkpoints artifact hold the final and best checkpoints that exist now."""
        if not run.active or run.path is None:
            return
        wanted: dict[str, Path] = {}  # obj_path in the artifact -> checkpoint file or folder
        for hook in self.trainer.hooks:
            for attr in ("best_path", "last_path"):
                path = getattr(hook, attr, None)
                if path is None or not Path(path).exists():  # a crash can leave a write unfinished
                    continue
                path = Path(path).absolute()
                obj = path.name if wanted.get(path.name, path) == path else f"{path.parent.name}/{path.name}"
                wanted[obj] = path
        if not wanted:
            return
        artifact = _checkpoints_artifact(run)
        new = artifact is None
        if artifact is None:
            from ember import track

            artifact = track.create_artifact(name=f"{run.name}-checkpoints", home=run.path.parent.parent)
        _hold_exactly(artifact, wanted)
        if new:
            run.mark_output(artifact)


def _checkpoints_artifact(run: Run) -> Artifact | None:
    """The ``<run name>-checkpoints`` artifact an earlier attempt of this run marked as its output."""
    from ember import track
    from ember.errors import TrackingError
    from ember.track.lineage import resolve_ref

    assert run.path is not None
    name = f"{run.name}-checkpoints"
    for edge in reversed(run.lineage()):
        target = edge["target"]
        if edge["source"]["id"] == run.id and target.get("kind") == "artifact" and target.get("name") == name:
            try:
                return track.load_artifact(resolve_ref(target, run.path.parent.parent))
            except TrackingError:
                return None  # removed by hand: start a new one
    return None


def _hold_exactly(artifact: Artifact, wanted: Mapping[str, Path]) -> None:
    """Drop from ``artifact`` the checkpoints not in ``wanted`` (retention may have deleted them); copy in the rest."""

    def belongs(record: dict[str, Any], obj: str, src: Path) -> bool:
        inside = record["path"] == obj or record["path"].startswith(obj + "/")
        return inside and (record["source"] == str(src) or record["source"].startswith(str(src) + os.sep))

    held = artifact.files
    keep = [r for r in held if any(belongs(r, obj, src) for obj, src in wanted.items())]
    if len(keep) < len(held):
        artifact.remove(r["path"] for r in held if r not in keep)
    for obj, src in wanted.items():
        if any(belongs(r, obj, src) for r in keep):
            continue  # the same checkpoint file: a name holds the step, so the content is the same
        if src.is_dir():  # a sharded checkpoint
            artifact.add_dir(src, obj_path=obj)
        else:
            artifact.add_file(src, obj_path=obj)


def _name_clash(scalars: Mapping[str, float]) -> None:
    """Raise: two storage scalars would be one name in a ``train`` point."""
    by_point: dict[str, list[str]] = {}
    for name in scalars:
        by_point.setdefault(point_name(name), []).append(name)
    clashes = "; ".join(f"{names} -> {point!r}" for point, names in by_point.items() if len(names) > 1)
    raise HookError(
        f"TrackingHook: step-storage scalars would share a train point name ({clashes}): rename the one your hook puts"
    )


def _strip(values: Mapping[str, float], prefix: str) -> dict[str, float]:
    return {k[len(prefix) :]: v for k, v in values.items() if k.startswith(prefix)}


def _plain(value: Any) -> bool:
    """A value that belongs in an hparams table: a finite number, a string, a bool or None."""
    if isinstance(value, float):
        return math.isfinite(value)
    return value is None or isinstance(value, bool | int | str)

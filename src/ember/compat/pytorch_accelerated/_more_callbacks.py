"""pytorch-accelerated's callbacks that change how a run goes: batch limits, sync batch norm,
evaluations inside an epoch, training-state saves and the WSD schedule's checkpoints
(re-exported by :mod:`.callbacks`)."""

from __future__ import annotations

import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

from torch import nn

from ember import distributed
from ember.errors import TrainerError

from .callbacks import TrainerCallback
from .utils import DataLoaderSlice

__all__ = [
    "ConvertSyncBatchNormCallback",
    "LimitBatchesCallback",
    "LimitEvalStepsCallback",
    "SaveTrainingStateCallback",
    "StepBasedEvaluationCallback",
    "WSDCheckpointCallback",
]


def _positive_int(owner: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TrainerError(f"{owner}({name}=...) must be an int >= 1, got {value!r}")
    return value


class LimitBatchesCallback(TrainerCallback):
    """Limits every training and evaluation epoch to ``num_batches`` batches (a quick check of a
    program); added first to every Trainer built inside ``utils.LimitBatches`` or with
    ``$PT_ACC_LIMIT_BATCHES`` set. The Trainer cuts its loaders when ``train``/``evaluate``
    starts, so the scheduler placeholders count the batches that run."""

    def __init__(self, num_batches: int) -> None:
        self.num_batches = _positive_int("LimitBatchesCallback", "num_batches", num_batches)

    def limit(self, loader: Any) -> Any:
        """``loader`` cut to ``num_batches`` batches (None stays None)."""
        return None if loader is None else DataLoaderSlice(loader, min(self.num_batches, len(loader)))


class ConvertSyncBatchNormCallback(TrainerCallback):
    """Makes every ``BatchNorm*d`` of the model a ``torch.nn.SyncBatchNorm`` when training with
    several processes (statistics over the whole batch of all processes). The layers are replaced
    inside the model, keeping their parameters and running statistics, when the run starts."""

    def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
        """Convert the batch-norm layers (with several processes only)."""
        if not trainer.run_config.is_distributed:
            return
        model = trainer.get_model()
        if isinstance(model, nn.modules.batchnorm._BatchNorm):
            raise TrainerError("ConvertSyncBatchNormCallback: the model itself is a BatchNorm; wrap it in a module")
        for name, child in list(model.named_children()):
            setattr(model, name, nn.SyncBatchNorm.convert_sync_batchnorm(child))


class StepBasedEvaluationCallback(TrainerCallback):
    """Runs an evaluation epoch every ``eval_every_n_steps`` training steps inside an epoch (the
    loss goes to the run history as ``intermediate_eval_loss`` for the callbacks of that
    evaluation, and is deleted after it). Callbacks see ``is_intermediate=True`` in its
    ``on_eval_epoch_start``/``on_eval_epoch_end``.

    Args:
        eval_every_n_steps: training batches between two evaluations (counted within the epoch).
    """

    def __init__(self, eval_every_n_steps: int) -> None:
        self.eval_every_n_steps = _positive_int("StepBasedEvaluationCallback", "eval_every_n_steps",
                                                eval_every_n_steps)  # fmt: skip

    def on_train_step_end(
        self, trainer: Any, batch: Any = None, batch_output: Any = None, step: int = 0, **kwargs: Any
    ) -> None:
        """Evaluate when ``step`` is a multiple of ``eval_every_n_steps`` (not at step 0)."""
        if step != 0 and step % self.eval_every_n_steps == 0:
            trainer.print(f"\nRunning evaluation after {step} training steps")
            trainer.run_intermediate_evaluation()
            trainer.run_history.delete_metric("intermediate_eval_loss")
            trainer.print("\nResuming training...")


class LimitEvalStepsCallback(TrainerCallback):
    """Limits evaluation epochs to ``num_eval_steps`` steps over all processes (each runs
    ``num_eval_steps // processes``); with ``limit_intermediate_only`` only the evaluations of
    :class:`StepBasedEvaluationCallback`. Put it before that callback in the list."""

    def __init__(self, num_eval_steps: int, limit_intermediate_only: bool = True) -> None:
        self.num_eval_steps = _positive_int("LimitEvalStepsCallback", "num_eval_steps", num_eval_steps)
        self.limit_intermediate_only = limit_intermediate_only
        self._original_eval_dataloader: Any = None

    def on_eval_epoch_start(self, trainer: Any, is_intermediate: bool = False, **kwargs: Any) -> None:
        """Cut the evaluation loader for this epoch."""
        if is_intermediate or not self.limit_intermediate_only:
            per_process = max(self.num_eval_steps // distributed.world_size(), 1)
            self._original_eval_dataloader = trainer.limit_eval_batches(per_process)
            trainer.print(f"Limiting evaluation to {per_process} steps per process")

    def on_eval_epoch_end(self, trainer: Any, is_intermediate: bool = False, **kwargs: Any) -> None:
        """Give the evaluation loader back its length."""
        if self._original_eval_dataloader is not None:
            trainer.limit_eval_batches(None, restore=self._original_eval_dataloader)
            self._original_eval_dataloader = None


class SaveTrainingStateCallback(TrainerCallback):
    """Saves the whole training state (``trainer.save_training_state``: an ember checkpoint in a
    folder) every ``save_every_n_epochs`` epochs, every ``save_every_n_steps`` training steps
    and/or at the end, keeping the newest ``max_checkpoints`` folders. Resume with
    ``trainer.train(..., resume_from=folder)``.

    Args:
        save_dir: where the folders (``epoch_N``, ``step_N``, ``final``) go.
        save_every_n_epochs: save after every N-th epoch (None: not by epoch).
        save_every_n_steps: save after every N-th training step (None: not by step).
        save_at_end: save when training ends.
        max_checkpoints: keep at most this many folders (the oldest are deleted); None keeps all.
    """

    def __init__(
        self,
        save_dir: str = "training_states",
        save_every_n_epochs: int | None = None,
        save_every_n_steps: int | None = None,
        save_at_end: bool = True,
        max_checkpoints: int | None = None,
    ) -> None:
        for name, value in (("save_every_n_epochs", save_every_n_epochs), ("save_every_n_steps", save_every_n_steps),
                            ("max_checkpoints", max_checkpoints)):  # fmt: skip
            if value is not None:
                _positive_int("SaveTrainingStateCallback", name, value)
        self.save_dir = Path(save_dir)
        self.save_every_n_epochs, self.save_every_n_steps = save_every_n_epochs, save_every_n_steps
        self.save_at_end, self.max_checkpoints = save_at_end, max_checkpoints
        self._saved_checkpoints: list[Path] = []
        self._global_step = 0

    def _save(self, trainer: Any, name: str) -> None:
        folder = self.save_dir / name
        trainer.save_training_state(str(folder), checkpoint_kwargs={"global_step": self._global_step})
        self._saved_checkpoints.append(folder)
        trainer.print(f"\nSaved training state to {folder}")
        while self.max_checkpoints is not None and len(self._saved_checkpoints) > self.max_checkpoints:
            old = self._saved_checkpoints.pop(0)
            if old.exists() and distributed.rank() == 0:
                shutil.rmtree(old)
                trainer.print(f"Removed old training state: {old}")

    def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
        """Create the folder; count steps from 0."""
        self.save_dir.mkdir(parents=True, exist_ok=True)
        self._global_step = 0

    def on_train_step_end(
        self, trainer: Any, batch: Any = None, batch_output: Any = None, step: int = 0, **kwargs: Any
    ) -> None:
        """Count the step; save every ``save_every_n_steps``."""
        self._global_step += 1
        if self.save_every_n_steps is not None and self._global_step % self.save_every_n_steps == 0:
            self._save(trainer, f"step_{self._global_step}")

    def on_train_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        """Save every ``save_every_n_epochs`` epochs."""
        epoch = trainer.run_history.current_epoch
        if self.save_every_n_epochs is not None and epoch % self.save_every_n_epochs == 0:
            self._save(trainer, f"epoch_{epoch}")

    def on_training_run_end(self, trainer: Any, **kwargs: Any) -> None:
        """Save the final state (with ``save_at_end``)."""
        if self.save_at_end:
            self._save(trainer, "final")


class WSDCheckpointCallback(TrainerCallback):
    """The checkpoints of a :class:`~.schedulers.WSDLrScheduler` run: before each decay phase the
    whole training state (``save_training_state``, a folder: continue from it), at the end of each
    decay a model export (``save_checkpoint``, a ``.pt`` file), with the step, the checkpoint type,
    the run's length and the decay fraction in their ``checkpoint_kwargs``.

    Args:
        save_dir: where they go (``checkpoint_<step>_wsd_pre_decay/``, ``checkpoint_<step>_wsd_post_decay.pt``).
        save_optimizer: keep the optimizer's state in the exports.
        save_scheduler: keep the scheduler's state in the exports.
        initial_checkpoint: loaded when training starts: a folder as a training state, a file as
            an export.

    Raises:
        TrainerError: when training starts with a scheduler that has no ``get_checkpoint_steps``.
    """

    def __init__(self, save_dir: str = "checkpoints", save_optimizer: bool = True, save_scheduler: bool = True,
                 initial_checkpoint: str | Path | None = None) -> None:  # fmt: skip
        self.save_dir = Path(save_dir)
        self.save_optimizer, self.save_scheduler = save_optimizer, save_scheduler
        self.initial_checkpoint = Path(initial_checkpoint) if initial_checkpoint else None
        self.last_checkpoint_step: int | None = None
        self.checkpoint_steps: set[int] | None = None
        self.decay_fraction: float | None = None
        self.decay_info: Any = None
        self.save_dir.mkdir(parents=True, exist_ok=True)

    def _kwargs(self, trainer: Any, step: int, kind: str) -> dict[str, Any]:
        return {"step": step, "checkpoint_type": kind, "total_steps": trainer.run_config.max_num_train_steps,
                "decay_fraction": self.decay_fraction, "timestamp": datetime.now().isoformat()}  # fmt: skip

    def _save_pre_decay(self, trainer: Any, step: int) -> None:
        folder = self.save_dir / f"checkpoint_{step}_wsd_pre_decay"
        trainer.save_training_state(str(folder), checkpoint_kwargs=self._kwargs(trainer, step, "wsd_pre_decay"))
        trainer.print(f"\nSaved wsd_pre_decay training state at step {step}")

    def _save_post_decay(self, trainer: Any, step: int) -> None:
        path = self.save_dir / f"checkpoint_{step}_wsd_post_decay.pt"
        trainer.save_checkpoint(path, save_optimizer=self.save_optimizer, save_scheduler=self.save_scheduler,
                                checkpoint_kwargs=self._kwargs(trainer, step, "wsd_post_decay"))  # fmt: skip
        trainer.print(f"\nSaved wsd_post_decay checkpoint at step {step}")

    def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
        """Read the schedule's checkpoints; load ``initial_checkpoint`` if there is one."""
        if not hasattr(trainer.scheduler, "get_checkpoint_steps"):
            raise TrainerError("WSDCheckpointCallback needs a WSDLrScheduler (create_scheduler_fn=WSDLrScheduler...)")
        self.checkpoint_steps = set(trainer.scheduler.get_checkpoint_steps())
        self.decay_fraction = trainer.scheduler.decay_phase_ratio
        self.decay_info = trainer.scheduler.get_decay_info()
        start = self.initial_checkpoint
        if start is None or not start.exists():
            return
        trainer.print(f"\nLoading checkpoint from {start}")
        loaded = trainer.load_training_state(str(start)) if start.is_dir() else trainer.load_checkpoint(start)
        self.last_checkpoint_step = loaded.get("step")
        kind = loaded.get("checkpoint_type", "wsd_pre_decay" if start.is_dir() else "wsd_post_decay")
        trainer.print(f"Loaded {kind} checkpoint from step {self.last_checkpoint_step}")

    def on_train_step_end(self, trainer: Any, batch: Any = None, batch_output: Any = None, step: int = 0,
                          **kwargs: Any) -> None:  # fmt: skip
        """Save when the updates made reach a period's decay start or its end."""
        done = trainer.scheduler.get_current_step() + 1
        if done == self.last_checkpoint_step:
            return
        phase = trainer.scheduler.get_phase_info(done)
        if done == phase["pre_decay_step"]:
            trainer.print(f"\nWSD Lr Scheduler entering decay phase at step {done}")
            self._save_pre_decay(trainer, done)
            self.last_checkpoint_step = done
        elif done == phase["period_end"]:
            self._save_post_decay(trainer, done)
            self.last_checkpoint_step = done

    def on_training_run_end(self, trainer: Any, **kwargs: Any) -> None:
        """Save the final export if the run ended a period and it is not saved yet."""
        done = trainer.scheduler.get_current_step() + 1
        if self.last_checkpoint_step != done and done == trainer.scheduler.get_phase_info(done)["period_end"]:
            self._save_post_decay(trainer, done)
            self.last_checkpoint_step = done

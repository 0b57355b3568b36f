"""Colossal-AI's ``colossalai.engine.schedule``: how a batch runs, as adapters onto ember's schedules.

* :class:`NonPipelineSchedule` is ember's :class:`~ember.trainer.DefaultSchedule` (forward, loss,
  backward through the Engine), with Colossal-AI's ``data_process_func``.
* :class:`PipelineSchedule` is the pipeline schedule ember builds from the config's
  ``parallel.pipeline`` (``engine.schedule``): the number of micro-batches given here must be
  the config's ``parallel.pipeline.microbatches``, since the stages were built for it.
* :class:`InterleavedPipelineSchedule` with one model chunk is :class:`PipelineSchedule`; ember
  has no interleaved (virtual-stage) schedule, so more chunks are a ``ConfigError``.

Each also has Colossal-AI's ``forward_backward_step(engine, data_iter, forward_only,
return_loss, return_output_label)`` for loops that drive a schedule by hand.

Example:
    >>> trainer = Trainer(engine=engine, schedule=NonPipelineSchedule(data_process_func=unpack))
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ember.errors import ConfigError
from ember.trainer import DefaultSchedule, Steps

__all__ = ["BaseSchedule", "InterleavedPipelineSchedule", "NonPipelineSchedule", "PipelineSchedule"]


class BaseSchedule(DefaultSchedule):
    """A schedule with Colossal-AI's ``data_process_func``: applied to each batch first (e.g. to
    turn a dict into ``(inputs, label)``).

    Args:
        data_process_func: ``batch -> batch`` (None: the batch as it is).
    """

    def __init__(self, data_process_func: Callable[[Any], Any] | None = None) -> None:
        if data_process_func is not None and not callable(data_process_func):
            raise ConfigError(f"data_process_func must be a function of the batch, got {data_process_func!r}")
        self.data_process_func = data_process_func

    def _batch(self, batch: Any) -> Any:
        return batch if self.data_process_func is None else self.data_process_func(batch)

    def _inner(self, steps: Steps) -> Any:
        """The ember schedule that runs the batch."""
        return DefaultSchedule()

    def forward_backward(self, steps: Steps, batch: Any, boundary: bool) -> dict[str, Any]:
        """One training batch (see :class:`ember.trainer.Schedule`)."""
        return self._inner(steps).forward_backward(steps, self._batch(batch), boundary)

    def forward(self, steps: Steps, batch: Any) -> dict[str, Any]:
        """One evaluation batch."""
        return self._inner(steps).forward(steps, self._batch(batch))

    def forward_backward_step(
        self, engine: Any, data_iter: Iterator[Any], forward_only: bool = False, return_loss: bool = True,
        return_output_label: bool = True,
    ) -> tuple[Any, Any, Any]:  # fmt: skip
        """Colossal-AI's hand-driven step: the next batch of ``data_iter`` through ``engine``.

        Returns:
            ``(output, label, loss)`` (output and label None without ``return_output_label``,
            loss None without ``return_loss``); the backward pass is done unless ``forward_only``.
        """
        from ember.trainer import Trainer  # a throw-away Trainer: its step functions, the default ones

        steps = Trainer(engine=engine, schedule=self).schedule_steps()
        batch = next(data_iter)
        result = self.forward(steps, batch) if forward_only else self.forward_backward(steps, batch, False)
        output, label = (result["output"], result["label"]) if return_output_label else (None, None)
        return output, label, result["loss"] if return_loss else None


class NonPipelineSchedule(BaseSchedule):
    """Forward, loss and backward of each batch through the Engine: ember's default schedule."""


class PipelineSchedule(BaseSchedule):
    """The pipeline schedule ember built from the config (``parallel.pipeline``).

    Args:
        num_microbatches: micro-batches per batch; must equal ``parallel.pipeline.microbatches``.
        data_process_func: ``batch -> batch``, applied first.
        tensor_shape: accepted (ember's stages learn the shapes from the model).
        scatter_gather_tensors: accepted (ember sends whole tensors between stages).

    Raises:
        ConfigError: at the first batch, when the Engine has no pipeline (set ``parallel =
            dict(pipeline=P)`` in the config) or its micro-batches differ.
    """

    def __init__(self, num_microbatches: int = 1, data_process_func: Callable[[Any], Any] | None = None,
                 tensor_shape: Any = None, scatter_gather_tensors: bool = False) -> None:  # fmt: skip
        super().__init__(data_process_func)
        if isinstance(num_microbatches, bool) or not isinstance(num_microbatches, int) or num_microbatches < 1:
            raise ConfigError(f"PipelineSchedule(num_microbatches=...) must be an int >= 1, got {num_microbatches!r}")
        self.num_microbatches = num_microbatches
        self.tensor_shape, self.scatter_gather_tensors = tensor_shape, scatter_gather_tensors

    def _inner(self, steps: Steps) -> Any:
        schedule = steps.engine.schedule
        if schedule is None:
            raise ConfigError(
                f"{type(self).__name__}: the Engine runs no pipeline; set parallel = dict(pipeline=dict(size=P, "
                f"microbatches={self.num_microbatches})) in the config (ember builds the stages from it)"
            )
        theirs = getattr(schedule, "microbatches", self.num_microbatches)
        if theirs != self.num_microbatches:
            raise ConfigError(
                f"{type(self).__name__}(num_microbatches={self.num_microbatches}) but the config's pipeline runs "
                f"{theirs}: set parallel.pipeline.microbatches = {self.num_microbatches} (or pass {theirs})"
            )
        return schedule


class InterleavedPipelineSchedule(PipelineSchedule):
    """Colossal-AI's interleaved 1F1B; with ``num_model_chunks=1`` ember's pipeline schedule.

    Raises:
        ConfigError: ``num_model_chunks`` > 1: ember has no interleaved (virtual-stage) schedule.
    """

    def __init__(self, num_microbatches: int, num_model_chunks: int, data_process_func: Callable[[Any], Any] | None
                 = None, tensor_shape: Any = None, scatter_gather_tensors: bool = False) -> None:  # fmt: skip
        if num_model_chunks != 1:
            raise ConfigError(
                f"InterleavedPipelineSchedule(num_model_chunks={num_model_chunks}): ember's pipeline runs one model "
                "chunk per stage (GPipe or 1F1B: parallel.pipeline.schedule); use num_model_chunks=1 or "
                "PipelineSchedule"
            )
        super().__init__(num_microbatches, data_process_func, tensor_shape, scatter_gather_tensors)
        self.num_model_chunks = num_model_chunks

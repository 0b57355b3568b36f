"""The check of every training loss for NaN and infinity (config key ``nonfinite_loss``).

A NaN loss poisons the gradients, then the weights, and a run that goes on trains nothing while
looking busy, saves non-finite weights and ends "Complete". The Engine looks at each loss it is
given to back-propagate (``Engine.backward``), so the Trainer and hand-written loops get the
same check:

* ``"error"`` (the default): stop at the first non-finite loss with a
  :class:`~ember.errors.NonFiniteLossError` naming the step, before anything is back-propagated;
* ``"warn"``: log the first one and then each time their number doubles, and go on;
* ``"ignore"``: do not look.

Cost: on the CPU one ``loss.item()`` a batch (a read, no synchronisation). On an accelerator
reading the loss would make the host wait for the device at every batch, so the check stays on
the device: each loss is folded into a flag by two small kernels, the flag is copied to pinned
host memory without waiting when an update closes its accumulation cycle, and read at the next
one (by then long complete), or when something must know now (:meth:`LossCheck.settle`: before a
checkpoint is written). A non-finite loss is then reported one update late there, naming the
update it happened in; in ``"error"`` mode that update is applied before training stops, and no
checkpoint is written after it.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from ember.errors import NonFiniteLossError
from ember.logging import get_dist_logger

Mode = Literal["error", "warn", "ignore"]
MODES: tuple[Mode, ...] = ("error", "warn", "ignore")


class LossCheck:
    """Watches the losses of one Engine; :meth:`note` each loss, :meth:`boundary` at each update.

    Args:
        mode: ``"error"`` or ``"warn"`` (``"ignore"`` needs no check).
        device: where the losses are: on the CPU each is read at once, elsewhere on the device.
        on_device: keep the flag on the device and read it an update late (default: when
            ``device`` is not the CPU).

    Attributes:
        first_step: the step (1-based optimizer update) of the first non-finite loss seen, or None.
        count: how many non-finite losses were seen.
    """

    def __init__(self, mode: Mode, device: torch.device, on_device: bool | None = None) -> None:
        self.mode = mode
        self.first_step: int | None = None
        self.count = 0
        self._on_device = device.type != "cpu" if on_device is None else on_device
        self._bad: torch.Tensor | None = None
        self._host: torch.Tensor | None = None
        self._event: torch.cuda.Event | None = None
        self._pending: int | None = None  # the step whose flag is on its way to the host
        if self._on_device:
            self._bad = torch.zeros((), dtype=torch.bool, device=device)
            self._host = torch.zeros((), dtype=torch.bool, pin_memory=device.type == "cuda")

    def note(self, loss: torch.Tensor, step: int, micro: int) -> None:
        """Look at the loss of micro-batch ``micro`` (1-based) of update ``step`` (1-based).

        Raises:
            NonFiniteLossError: on the CPU, in ``"error"`` mode, when it is NaN or infinite.
        """
        if self._bad is None:
            value = loss.item()
            if value - value != 0.0:  # NaN or ±inf, without a call
                self._found(step, micro, value)
            return
        self._bad.logical_or_(loss.detach().isfinite().logical_not_())

    def boundary(self, step: int) -> None:
        """Update ``step`` closed its accumulation cycle: read the previous flag, send this one.

        Raises:
            NonFiniteLossError: on an accelerator, in ``"error"`` mode, when the previous update's
                flag says one of its losses was not finite.
        """
        if self._bad is None or self._host is None:
            return
        self.settle()
        self._host.copy_(self._bad, non_blocking=True)
        if self._host.is_pinned():
            self._event = torch.cuda.Event()
            self._event.record()
        self._bad.zero_()
        self._pending = step

    def settle(self) -> int | None:
        """Read a flag still on its way from the device (waiting for it); return :attr:`first_step`.

        Raises:
            NonFiniteLossError: in ``"error"`` mode, when the flag says a loss was not finite.
        """
        pending, self._pending = self._pending, None
        if pending is not None and self._host is not None:
            if self._event is not None:
                self._event.synchronize()
            if bool(self._host.item()):
                self._found(pending, 1, math.nan)
        return self.first_step

    def _found(self, step: int, micro: int, value: float) -> None:
        self.count += 1
        if self.first_step is None:
            self.first_step = step
        shown = "nan or inf" if self._bad is not None else str(value)
        where = f"step {step}" + (f" (micro-batch {micro} of its accumulation cycle)" if micro > 1 else "")
        if self.mode == "error":
            raise NonFiniteLossError(
                f"non-finite loss ({shown}) at {where}: training stopped (config nonfinite_loss='error', the "
                "default). Look for the cause (a learning rate too high, a log of 0, bad data); to go on "
                "regardless set nonfinite_loss='warn' or 'ignore' in the config",
                step=step,
            )
        if self.count & (self.count - 1) == 0:  # the first, then each time the number doubles
            get_dist_logger().warning(
                f"non-finite loss ({shown}) at {where}; {self.count} so far, the first at step {self.first_step} "
                "(nonfinite_loss='warn': training goes on; checkpoints saved from now on may hold non-finite "
                "weights)"
            )

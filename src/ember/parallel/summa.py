"""SUMMA on a q × q grid: the matrix product of 2-D and of each depth layer of 2.5-D tensor parallelism.

:class:`SummaLayer` is the base of the layers of :mod:`ember.parallel.tensor2d` and
:mod:`ember.parallel.tensor2p5d`: it names the grid's axes by role (the row splits the
features, the column the rows of the batch; 2.5-D adds the depth). The product ``x @ W.T``
runs in q steps, broadcasting one block of ``x`` along each row and one block of ``W`` along
each column per step (Van de Geijn and Watts' SUMMA, as Optimus and Tesseract use it): no rank
ever holds more than one block of each.
"""

from __future__ import annotations

from typing import Any

import torch

from ember.parallel import grid_comm
from ember.parallel.grid import GridLayer, TensorGrid
from ember.parallel.grid_layers import divisible, resolve_grid
from ember.parallel.grid_ops import amp_state, autocast_as, split

__all__ = ["SummaLayer", "batch_axis", "summa_linear"]


# -- the roles of a SUMMA grid's axes (2-D; 2.5-D adds the depth) ---------------------------------
def batch_axis(grid: TensorGrid) -> str:
    """The (combined) axis whose ranks hold different rows of the batch: the column under 2-D,
    depth × column under 2.5-D."""
    return "tensor_xz" if grid.mode == "2.5d" else "tensor_col"


def split_of(grid: TensorGrid, **dims: int) -> tuple[int | None, ...]:
    """The split tuple of a parameter: ``tensor_row=0`` splits dimension 0 along the row axis."""
    return tuple(dims.get(axis) for axis in grid.axes)


# -- SUMMA ---------------------------------------------------------------------------------------
class _SummaLinear(torch.autograd.Function):
    """``y = x @ W.T`` with x split [rows by column i, features by row j] and W [out by j, in by i].

    Forward, step k: ``x[i, k]`` is broadcast along the row and ``W[out j, in k]`` along the
    column; ``y[i, j] += x[i, k] @ W[j, k].T``. Backward, step k: ``W[j, k]`` broadcast along the
    column, ``dy[i, j] @ W[j, k]`` reduced along the row onto ``(i, k)`` (``dx``); ``x[i, k]``
    broadcast along the row, ``dy[i, j].T @ x[i, k]`` reduced along the column onto ``(k, j)`` (``dW``).
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, row: Any, col: Any) -> torch.Tensor:
        state = amp_state(x.device.type)
        if state[1]:  # autocast: move the fp16/bf16 blocks, as the matmul would cast them anyway
            x, w = x.to(state[2]), w.to(state[2])
        ctx.save_for_backward(x, w)
        ctx.row, ctx.col, ctx.amp = row, col, state
        out = None
        for k in range(grid_comm.size(row)):
            part = grid_comm.broadcast(x, k, row) @ grid_comm.broadcast(w, k, col).t()
            out = part if out is None else out + part
        assert out is not None  # q >= 1 steps
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        x, w = ctx.saved_tensors
        row, col = ctx.row, ctx.col
        gx = gw = None
        flat = grad.reshape(-1, grad.shape[-1])
        with autocast_as(ctx.amp):
            for k in range(grid_comm.size(row)):
                if ctx.needs_input_grad[0]:
                    mine = grid_comm.reduce_to(grad @ grid_comm.broadcast(w, k, col), k, row)
                    gx = mine if mine is not None else gx
                if ctx.needs_input_grad[1]:
                    xk = grid_comm.broadcast(x, k, row)
                    mine = grid_comm.reduce_to(flat.t() @ xk.reshape(-1, xk.shape[-1]), k, col)
                    gw = mine if mine is not None else gw
        return gx, gw, None, None


class SummaLayer(GridLayer):
    """What the 2-D and 2.5-D layers share: their grid's axes by role."""

    mode = "2d"

    def __init__(self, grid: TensorGrid | None) -> None:
        super().__init__(resolve_grid(grid, self.mode, type(self).__name__))
        self.q = self.grid.q

    @property
    def row(self) -> Any:
        """The row axis's group: the ranks holding different blocks of the features."""
        return self.grid.group("tensor_row")

    @property
    def col(self) -> Any:
        """The column axis's group: the ranks holding different batch rows of one depth layer."""
        return self.grid.group("tensor_col")

    @property
    def rows(self) -> Any:
        """The group of every rank holding other batch rows (column, or depth × column)."""
        return self.grid.group(batch_axis(self.grid))

    @property
    def dep(self) -> Any:
        """The depth axis's group (2.5-D), over which weight blocks are replicated; else None."""
        return self.grid.group("tensor_dep") if self.grid.mode == "2.5d" else None

    def split(self, **dims: int) -> tuple[int | None, ...]:
        """The split tuple of a parameter on this grid."""
        return split_of(self.grid, **dims)

    def divisible(self, what: str, value: int, by: int) -> None:
        """Raise ConfigError unless ``by`` divides ``value``."""
        divisible(type(self).__name__, what, value, by, self.grid)

    def split_rows(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a batch that every rank of the tensor group holds whole."""
        return split(x, 0, self.rows, "batch")


def summa_linear(x: torch.Tensor, weight: torch.Tensor, row: Any, col: Any) -> torch.Tensor:
    """``x @ weight.T`` by SUMMA: ``x [rows i, in j]``, ``weight [out j, in i]`` on rank ``(i, j)``,
    the result ``[rows i, out j]``; ``row``/``col`` the row and column groups."""
    return _SummaLinear.apply(x, weight, row, col)

"""Run under torchrun with 2 processes: DDP through the Engine equals one process on the global batch."""

from __future__ import annotations

import torch
from tests.dist import report
from tests.models import params_of, tiny_dataset, tiny_mlp
from torch import nn
from torch.utils.data import DataLoader

import ember
from ember import distributed

torch.set_num_threads(1)


def reference(ds, steps_batch: int) -> list[torch.Tensor]:
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for x, y in DataLoader(ds, batch_size=steps_batch):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return params_of(model)


def engine_run(ds, per_rank_batch: int, accumulation: int) -> list[torch.Tensor]:
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    engine, loader, _, _ = ember.initialize(
        model, opt, nn.CrossEntropyLoss(), DataLoader(ds, batch_size=per_rank_batch),
        config={"gradient_accumulation": accumulation},
    )  # fmt: skip
    for x, y in loader:
        engine.zero_grad()
        engine.backward(engine.criterion(engine(x), y))
        engine.step()
    return params_of(model)


def main() -> None:
    ember.launch_from_torch(config={"seed": 0}, verbose=False)
    ds = tiny_dataset(32 * 6)
    ref = reference(ds, 32)
    out: dict = {"world_size": ember.context.world_size}
    for accumulation, batch in ((1, 16), (2, 8)):
        params = engine_run(ds, batch, accumulation)
        out[f"max_diff_accum{accumulation}"] = max((a - b).abs().max().item() for a, b in zip(ref, params, strict=True))
        flat = torch.cat([p.flatten() for p in params])
        gathered = [torch.zeros_like(flat) for _ in range(2)]
        torch.distributed.all_gather(gathered, flat)
        out[f"ranks_identical_accum{accumulation}"] = bool(torch.equal(gathered[0], gathered[1]))
    out["any_true"] = distributed.any_true(ember.context.rank == 1)
    report(out)


if __name__ == "__main__":
    main()

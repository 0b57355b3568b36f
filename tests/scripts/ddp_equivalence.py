"""Run under torchrun with 2 processes: DDP through the Engine equals one process on the global batch.

Besides the parameters, each run reports how many gradient all-reduces every backward made
(a counting DDP comm hook: identical results cannot tell a broken ``no_sync``, since summing
averaged gradients equals averaging summed ones), what ``find_unused_parameters`` the DDP
module got from the config, and, with ``compile``, what DDP wraps and how many graphs compiled.
"""

from __future__ import annotations

from typing import Any

import torch
from tests.dist import report
from tests.models import params_of, tiny_dataset, tiny_mlp
from torch import nn
from torch._dynamo.eval_frame import OptimizedModule
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

import ember
from ember import distributed

torch.set_num_threads(1)

GRAPHS: list[int] = []
"""One entry per graph dynamo handed to :func:`counting_backend` (module-level, so copies of the config share it)."""


def counting_backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
    """A torch.compile backend that runs the captured graph as is (no C++ toolchain) and counts it."""
    GRAPHS.append(1)
    return gm.forward


def reference(ds, steps_batch: int) -> list[torch.Tensor]:
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for x, y in DataLoader(ds, batch_size=steps_batch):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return params_of(model)


def engine_run(ds, per_rank_batch: int, accumulation: int, **config: Any) -> tuple[list[torch.Tensor], dict[str, Any]]:
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    engine, loader, _, _ = ember.initialize(
        model, opt, nn.CrossEntropyLoss(), DataLoader(ds, batch_size=per_rank_batch),
        config={"gradient_accumulation": accumulation, **config},
    )  # fmt: skip
    ddp = engine.wrapped_model
    assert isinstance(ddp, DistributedDataParallel), type(ddp)
    allreduces = [0]

    def counting_allreduce(group, bucket):  # unannotated: DDP rejects string annotations on comm hooks
        allreduces[0] += 1
        return allreduce_hook(group, bucket)  # DDP's own behaviour: all-reduce, divide by the group size

    ddp.register_comm_hook(ddp.process_group, counting_allreduce)
    per_backward = []
    for x, y in loader:
        engine.zero_grad()
        before = allreduces[0]
        engine.backward(engine.criterion(engine(x), y))
        per_backward.append(allreduces[0] - before)
        engine.step()
    info = {
        "allreduces_per_backward": per_backward,
        "find_unused_parameters": ddp.find_unused_parameters,
        "ddp_wraps_compiled": isinstance(ddp.module, OptimizedModule),
        "model_is_bare": not isinstance(engine.model, (OptimizedModule, DistributedDataParallel)),
        "state_keys": sorted(engine.state_dict()["model"]),
    }
    return params_of(model), info


def find_unused_flag(config: dict[str, Any]) -> bool:
    """What ``find_unused_parameters`` the Engine's DDP module got from ``config`` (no training)."""
    model = tiny_mlp()
    engine = ember.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), config=config)[0]
    return bool(engine.wrapped_model.find_unused_parameters)


def main() -> None:
    ember.launch_from_torch(config={"seed": 0}, verbose=False)
    ds = tiny_dataset(32 * 6)
    ref = reference(ds, 32)
    out: dict = {"world_size": ember.context.world_size, "bare_keys": sorted(tiny_mlp().state_dict())}
    runs = {
        "accum1": (16, 1, {}),
        "accum2": (8, 2, {}),
        "compile": (16, 1, {"compile": {"backend": counting_backend}}),  # compiled, then wrapped in DDP
    }
    for name, (batch, accumulation, config) in runs.items():
        params, info = engine_run(ds, batch, accumulation, **config)
        out[f"max_diff_{name}"] = max((a - b).abs().max().item() for a, b in zip(ref, params, strict=True))
        flat = torch.cat([p.flatten() for p in params])
        gathered = [torch.zeros_like(flat) for _ in range(2)]
        torch.distributed.all_gather(gathered, flat)
        out[f"ranks_identical_{name}"] = bool(torch.equal(gathered[0], gathered[1]))
        out[name] = info
    out["compiled_graphs"] = len(GRAPHS)
    out["find_unused"] = {
        "alias": find_unused_flag({"find_unused_parameters": True}),
        "ddp_section": find_unused_flag({"ddp": {"find_unused_parameters": True}}),
    }
    out["any_true"] = distributed.any_true(ember.context.rank == 1)
    report(out)


if __name__ == "__main__":
    main()

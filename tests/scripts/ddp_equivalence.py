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


def set_first_layer(model: nn.Module, trainable: bool) -> None:
    for p in model[0].parameters():
        p.requires_grad = trainable


def reference(ds, steps_batch: int, unfreeze_at: int | None = None) -> list[torch.Tensor]:
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if unfreeze_at is not None:
        set_first_layer(model, False)
    for step, (x, y) in enumerate(DataLoader(ds, batch_size=steps_batch)):
        if step == unfreeze_at:
            set_first_layer(model, True)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return params_of(model)


def engine_run(
    ds, per_rank_batch: int, accumulation: int, unfreeze_at: int | None = None, **config: Any
) -> tuple[list[torch.Tensor], dict[str, Any]]:
    """Train through the Engine; with ``unfreeze_at``, the first layer is frozen before
    ``initialize`` and made trainable again before that micro-batch (pets_finetune's recipe)."""
    model = tiny_mlp()
    if unfreeze_at is not None:
        set_first_layer(model, False)
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
    for i, (x, y) in enumerate(loader):
        if i == unfreeze_at:
            set_first_layer(model, True)
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
        "rebuilt": engine.wrapped_model is not ddp,
    }
    return params_of(model), info


def sharded_unfreeze(ds, unfreeze_at: int) -> list[torch.Tensor] | None:
    """FSDP2 (zero stage 2) follows ``requires_grad`` itself: the full weights on rank 0 (None elsewhere)."""
    model = tiny_mlp()
    set_first_layer(model, False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    engine, loader, _, _ = ember.initialize(
        model, opt, nn.CrossEntropyLoss(), DataLoader(ds, batch_size=16), config={"zero": {"stage": 2}}
    )
    for i, (x, y) in enumerate(loader):
        if i == unfreeze_at:
            set_first_layer(engine.model, True)
        engine.zero_grad()
        engine.backward(engine.criterion(engine(x), y))
        engine.step()
    state = engine.state_dict()["model"]
    return [state[k] for k in tiny_mlp().state_dict()] if state else None


def frozen_after_initialize(ds) -> dict[str, Any]:
    """A parameter frozen after the DDP wrapper was built: the boundary backward raises, before the update."""
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    engine, loader, _, _ = ember.initialize(model, opt, nn.CrossEntropyLoss(), DataLoader(ds, batch_size=16))
    batches = iter(loader)
    x, y = next(batches)
    engine.backward(engine.criterion(engine(x), y))
    engine.step()
    before = params_of(model)
    set_first_layer(model, False)
    x, y = next(batches)
    engine.zero_grad()
    try:
        engine.backward(engine.criterion(engine(x), y))
    except ember.errors.EngineError as err:
        unchanged = all(torch.equal(a, b) for a, b in zip(before, params_of(model), strict=True))
        return {"error": str(err), "unchanged": unchanged}
    return {"error": None}


def find_unused_flag(config: dict[str, Any]) -> bool:
    """What ``find_unused_parameters`` the Engine's DDP module got from ``config`` (no training)."""
    model = tiny_mlp()
    engine = ember.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), config=config)[0]
    return bool(engine.wrapped_model.find_unused_parameters)


def static_graph_refusal() -> str | None:
    """``ddp.static_graph`` with accumulation: one ember error before DDP is built (torch asserted)."""
    model = tiny_mlp()
    config = {"ddp": {"static_graph": True}, "gradient_accumulation": 2}
    try:
        ember.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), config=config)
    except ember.errors.ConfigError as err:
        return str(err)
    return None


def main() -> None:
    ember.launch_from_torch(config={"seed": 0}, verbose=False)
    ds = tiny_dataset(32 * 6)
    ref = reference(ds, 32)
    out: dict = {"world_size": ember.context.world_size, "bare_keys": sorted(tiny_mlp().state_dict())}
    unfrozen = {3: reference(ds, 32, unfreeze_at=3), 2: reference(ds, 32, unfreeze_at=2)}
    runs = {
        "accum1": (16, 1, None, {}),
        "accum2": (8, 2, None, {}),
        "compile": (16, 1, None, {"compile": {"backend": counting_backend}}),  # compiled, then wrapped in DDP
        # frozen at initialize, unfrozen before update 3: its gradients arrive in a boundary backward
        "unfreeze": (16, 1, 3, {}),
        # unfrozen at the first micro-batch of update 2's cycle: DDP is rebuilt inside the cycle
        "unfreeze_accum2": (8, 2, 4, {}),
        "unfreeze_zero1": (16, 1, 3, {"zero": {"stage": 1}}),
    }
    for name, (batch, accumulation, unfreeze_at, config) in runs.items():
        params, info = engine_run(ds, batch, accumulation, unfreeze_at, **config)
        expected = ref if unfreeze_at is None else unfrozen[unfreeze_at // accumulation]
        out[f"max_diff_{name}"] = max((a - b).abs().max().item() for a, b in zip(expected, params, strict=True))
        flat = torch.cat([p.flatten() for p in params])
        gathered = [torch.zeros_like(flat) for _ in range(2)]
        torch.distributed.all_gather(gathered, flat)
        out[f"ranks_identical_{name}"] = bool(torch.equal(gathered[0], gathered[1]))
        out[name] = info
    sharded = sharded_unfreeze(ds, 3)
    out["max_diff_unfreeze_fsdp"] = (
        None if sharded is None else max((a - b).abs().max().item() for a, b in zip(unfrozen[3], sharded, strict=True))
    )
    out["frozen_after"] = frozen_after_initialize(ds)
    out["compiled_graphs"] = len(GRAPHS)
    out["find_unused"] = {
        "alias": find_unused_flag({"find_unused_parameters": True}),
        "ddp_section": find_unused_flag({"ddp": {"find_unused_parameters": True}}),
    }
    out["static_graph"] = static_graph_refusal()
    out["any_true"] = distributed.any_true(ember.context.rank == 1)
    report(out)


if __name__ == "__main__":
    main()

"""Case 4, data parallel: two gloo processes, the hand DDP loop vs ember's Trainer.

The contender starts two processes (``torch.multiprocessing``, spawn); each trains the tiny
MLP on its half of the batches (rank r takes batches r, r+2, ...) and times its own loop.
Reported: CPU time summed over the ranks, wall time of the slower rank, and ms per step.
Process start, ``init_process_group``/``ember.launch`` and the DDP wrapping are outside the
timer. The final loss is rank 0's model after training (DDP keeps the ranks identical).
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks.case_step import hand_epochs
from benchmarks.harness import Contender, Group, Outcome, Timer

M = "benchmarks.case_ddp"
WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _shard(params: Mapping[str, Any], rank: int) -> Any:
    from benchmarks.workloads import Workload

    w = Workload(params)
    w.batches = w.batches[rank::WORLD]
    w.dataset.batches = w.batches
    return w


def _hand(rank: int, params: Mapping[str, Any], timer: Timer) -> Any:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    w = _shard(params, rank)
    model, loader = DistributedDataParallel(w.model), w.loader()
    with timer:
        hand_epochs(w, loader, model)
    return w


def _ember(rank: int, params: Mapping[str, Any], timer: Timer) -> Any:
    import ember
    from benchmarks.case_step import default_hooks
    from ember.trainer import Trainer

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD))
    ember.launch_from_torch(config={}, backend="gloo", seed=0, verbose=False)
    w = _shard(params, rank)
    engine, _, _, _ = ember.initialize(w.model, w.optimizer, w.criterion)
    logger = ember.get_dist_logger()
    trainer = Trainer(engine=engine, logger=logger)
    chosen = default_hooks(w, logger) if params.get("hooks") == "default" else []
    loader = w.loader()
    with timer:
        trainer.fit(loader, epochs=w.epochs, hooks=chosen)
    return w


def _child(rank: int, kind: str, params: dict[str, Any], out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from ember._exit import leave_process_group_at_exit

    # Teardown only (outside the timer): leave the gloo group at exit without the abort that
    # can end a plain init_process_group script (see ember._exit); ember.launch does the same.
    leave_process_group_at_exit()
    torch.set_num_threads(1)
    timer = Timer()
    w = (_hand if kind == "hand" else _ember)(rank, params, timer)
    dist.barrier()
    result = {"cpu_s": timer.cpu_s, "wall_s": timer.wall_s, "steps": w.steps, "loss": w.final_loss()}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))


def ddp_run(params: Mapping[str, Any], timer: Timer) -> Outcome:
    """Train on two gloo ranks; ``params["kind"]``: hand or ember."""
    import torch.multiprocessing as mp

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_child, args=(str(params["kind"]), dict(params), out), nprocs=WORLD, join=True)
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(WORLD)]
    wall = max(r["wall_s"] for r in ranks)
    steps = ranks[0]["steps"]
    return Outcome(
        work=ranks[0]["loss"],
        extra={"ms_per_step": wall / steps * 1e3, "rank_loss_spread": abs(ranks[0]["loss"] - ranks[1]["loss"])},
        cpu_s=sum(r["cpu_s"] for r in ranks),
        wall_s=wall,
    )


def groups(quick: bool = False, with_peers: bool = True) -> list[Group]:
    """The tiny MLP, 1,000 steps per rank (batch 64 per rank) on 2 ranks."""
    params: dict[str, Any] = {"model": "mlp", "batch_size": 64, "batches": 200, "epochs": 10, "seed": 0}
    if quick:
        params.update(batches=8, epochs=1)
    contenders = (
        Contender("hand DDP loop", f"{M}:ddp_run", params={"kind": "hand"}),
        Contender("ember Trainer, no hooks", f"{M}:ddp_run", params={"kind": "ember", "hooks": "none"}),
        Contender("ember Trainer, default hooks", f"{M}:ddp_run", params={"kind": "ember", "hooks": "default"}),
    )
    return [Group(f"DDP tiny MLP, {WORLD} gloo processes", contenders, "hand DDP loop", params)]

"""Seed 004's workflow under torchrun with plain torch.distributed (gloo) and ember.track.

Every rank makes the same tracking calls, with no ``if rank == 0``; rank 0 alone writes. Each
rank reports what it computed and logged; the test compares the store with rank 0's report.
Arguments: the folder to save the model in.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from tests.dist import report
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ember import _exit as ember_exit
from ember import track
from ember.errors import TrackingError

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
out_dir = Path(sys.argv[1])

torch.manual_seed(0)
x_all = torch.randn(64, 8)
y_all = (x_all.sum(dim=1) > 0).long()
x_test, y_test = torch.randn(32, 8), torch.randint(0, 2, (32,))
model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
hparams = {"lr": 0.1, "batch_size": 8, "epochs": 2, "world_size": world}

run = track.create_run(name="mnist-ddp", hparams=hparams, labels=["ddp"], description="seed 004")
print(f"rank {rank} starts", flush=True)
logged: dict[str, list[list[float]]] = {"train": [], "val": [], "test": []}


def global_mean(value: torch.Tensor) -> torch.Tensor:
    value = value.detach().clone()
    dist.all_reduce(value)
    return value / world


step = 0
for epoch in range(2):
    shard = range(rank * 8, 64, 8 * world)  # each rank its own batches
    for start in shard:
        xb, yb = x_all[start : start + 8], y_all[start : start + 8]
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()
        mean_loss = global_mean(loss)
        run.log("training", {"loss": mean_loss}, step=step, epoch=epoch)  # a one-element tensor
        logged["train"].append([step, mean_loss.item()])
        step += 1
    with torch.no_grad():
        acc = global_mean((model(x_all).argmax(1) == y_all).float().mean())
    run.log("validation", {"acc": acc.item()}, step=step, epoch=epoch)
    logged["val"].append([step, acc.item()])

with torch.no_grad():
    test_acc = global_mean((model(x_test).argmax(1) == y_test).float().mean()).item()
run.log("evaluate", {"acc": test_acc}, step=step)
logged["test"].append([step, test_acc])

try:
    run.log("train", {"loss": "not a number"}, step=step)
    bad_metric_raised = False
except TrackingError:
    bad_metric_raised = True

model_path = out_dir / "model.pt"
if rank == 0:
    torch.save(model.module.state_dict(), model_path)
dist.barrier()
artifact = track.create_artifact(name="mnist-model")
artifact.add_file(model_path)
run.mark_output(artifact)
run.finish()

report(
    {
        "active": run.active,
        "path": None if run.path is None else str(run.path),
        "artifact": None if artifact.path is None else str(artifact.path),
        "logged": logged,
        "bad_metric_raised": bad_metric_raised,
        "pid": os.getpid(),
        "exit_guard": ember_exit._registered,  # gloo's exit race, guarded as under ember.launch
    }
)
dist.destroy_process_group()

"""A tiny tracked training run made with ember.track directly (no Trainer needed)."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import torch

from ember import track


def train_tiny(store: Path, steps: int = 30, name: str = "tiny", **run_kwargs: object) -> tuple[track.Run, Path]:
    """Train a 2-layer net on random data, logging train/val metrics; save and link the model."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(64, 4), torch.randint(0, 2, (64,))
    run = track.create_run(name=name, hparams={"lr": 0.1, "hidden": 8}, labels=["tiny"], home=store, **run_kwargs)
    for step in range(steps):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        extra = {"weird": math.nan if step == 3 else (math.inf if step == 4 else float(step))}
        run.log("train", {"loss": loss, "lr": 0.1, **extra}, step=step, epoch=step // 10)
        if step % 10 == 9:
            acc = (model(x).argmax(1) == y).float().mean()
            run.log("val", {"acc": acc}, step=step, epoch=step // 10)
            print(f"step {step} loss {loss.item():.4f}")
    weights = store.parent / "model.pt"
    torch.save(model.state_dict(), weights)
    art = track.create_artifact(name="tiny-model", home=store)
    art.add_file(weights)
    run.mark_output(art)
    return run, weights


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()

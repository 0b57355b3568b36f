"""T9k's distributed-training tracking example, written with ember's names (digits data).

Every rank runs the same code; only rank 0 writes the run (the other ranks' run object is a
no-op with the same API), so the job leaves exactly one run in the store.

Run: torchrun --nproc_per_node 2 examples/ddp_tracking.py      (or: python examples/ddp_tracking.py)
Then: ember runs ls
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
from torch import nn

import ember
from ember import track

sys.path.insert(0, str(Path(__file__).parent))
from digits import DigitsCNN, digits_datasets


def evaluate(engine: ember.Engine, loader) -> tuple[float, float]:
    """Loss and accuracy over this rank's share, summed across ranks (padding repeats dropped)."""
    engine.eval()
    totals = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, seen
    remaining = loader.sampler.real_num_samples
    with torch.no_grad():
        for x, y in loader:
            keep = min(len(y), remaining)
            remaining -= keep
            out = engine(x[:keep])
            totals += torch.tensor([engine.criterion(out, y[:keep]).item() * keep,
                                    (out.argmax(1) == y[:keep]).sum().item(), keep], dtype=torch.float64)  # fmt: skip
    ember.distributed.all_reduce(totals)
    engine.train()
    return (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--out", default="digits-model.pt")
    args = parser.parse_args()

    if "RANK" in os.environ:
        ember.launch_from_torch(config={"seed": 0})
    else:
        ember.launch(config={"seed": 0})
    run = track.create_run(name="digits-ddp", hparams={"lr": args.lr, "batch_size": args.batch_size,
                                                       "epochs": args.epochs,
                                                       "world_size": ember.context.world_size})  # fmt: skip
    train_ds, test_ds = digits_datasets()
    train_dl = ember.get_dataloader(train_ds, shuffle=True, batch_size=args.batch_size)
    test_dl = ember.get_dataloader(test_ds, batch_size=128)
    model = DigitsCNN()
    engine, train_dl, test_dl, _ = ember.initialize(
        model, torch.optim.Adam(model.parameters(), lr=args.lr), nn.CrossEntropyLoss(), train_dl, test_dl
    )

    step = 0
    for epoch in range(args.epochs):
        train_dl.sampler.set_epoch(epoch)
        for x, y in train_dl:
            engine.zero_grad()
            loss = engine.criterion(engine(x), y)
            engine.backward(loss)
            step += engine.step()
            if step % 10 == 0:
                run.log(type="train", metrics={"loss": loss}, step=step, epoch=epoch)
        val_loss, val_acc = evaluate(engine, test_dl)
        run.log(type="val", metrics={"loss": val_loss, "accuracy": val_acc}, step=step, epoch=epoch)
        ember.get_dist_logger().info(f"epoch {epoch}: val loss {val_loss:.4f} acc {val_acc:.2%}", ranks=[0])

    test_loss, test_acc = evaluate(engine, test_dl)
    run.log(type="test", metrics={"loss": test_loss, "accuracy": test_acc}, step=step)
    if ember.context.is_main_process:
        torch.save(engine.model.state_dict(), args.out)
    model_artifact = track.create_artifact(name="digits-model")
    model_artifact.add_file(args.out)
    run.mark_output(model_artifact)
    run.finish()


if __name__ == "__main__":
    main()

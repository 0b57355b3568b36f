"""Case 1, step overhead: the same training run through the hand loop, ember and the peers.

Timed: the training run itself (the loop, or ``fit``/``train``); building the model,
optimizer, data, Engine, Trainer object and ``Accelerator.prepare`` is outside the timer.
Every contender trains the same seeded model on the same in-memory batches with the same SGD
and ends with the same loss (checked by the harness).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from benchmarks.harness import Contender, Group, NotInstalled, Outcome, Timer
from benchmarks.workloads import Workload, unwrap

M = "benchmarks.case_step"


def _outcome(w: Workload, timer: Timer) -> Outcome:
    return Outcome(work=w.final_loss(), extra={"us_per_step_cpu": timer.cpu_s / w.steps * 1e6})


def hand_epochs(w: Workload, loader: Iterable[Any], model: Any = None) -> None:
    """The hand loop's training run: ``w.epochs`` epochs of PyTorch's own loop, nothing else.

    ``model``: what the forward runs through instead of ``w.model`` (the DDP wrapper in case 4).
    """
    model, opt, crit = w.model if model is None else model, w.optimizer, w.criterion
    for _ in range(w.epochs):
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            loss = crit(model(x), y)
            loss.backward()
            opt.step()


def hand_epochs_same_work(w: Workload, loader: Iterable[Any], logger: Any) -> None:
    """The hand loop doing what :func:`default_hooks` ask of the Trainer: each epoch's
    sample-weighted mean loss (every batch's loss read, as a PyTorch tutorial's ``running_loss``
    does), the per-epoch LR schedule and a log line per epoch. The yardstick for ember's own cost
    with those hooks: what the Trainer adds beyond the work they do."""
    model, opt, crit = w.model, w.optimizer, w.criterion
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: 1.0)
    for epoch in range(w.epochs):
        total, seen = 0.0, 0
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            loss = crit(model(x), y)
            loss.backward()
            opt.step()
            n = len(y)
            total, seen = total + loss.item() * n, seen + n
        sched.step()
        logger.info(f"epoch {epoch}: train/loss {total / seen:.5g}, lr {sched.get_last_lr()[0]:.3g}")


def engine_epochs(engine: Any, loader: Iterable[Any], epochs: int) -> None:
    """The same run with ember's Engine standing in for model, optimizer and loss."""
    for _ in range(epochs):
        for x, y in loader:
            engine.zero_grad()
            loss = engine.criterion(engine(x), y)
            engine.backward(loss)
            engine.step()


def hand_loop(params: Mapping[str, Any], timer: Timer) -> Outcome:
    """The limit: PyTorch's own loop, nothing else."""
    w = Workload(params)
    loader = w.loader()
    w.model.train()
    with timer:
        hand_epochs(w, loader)
    return _outcome(w, timer)


def _engine(w: Workload) -> Any:
    import ember

    engine, _, _, _ = ember.initialize(w.model, w.optimizer, w.criterion)
    return engine


def ember_engine(params: Mapping[str, Any], timer: Timer) -> Outcome:
    """The plain loop with ember's Engine standing in for model, optimizer and loss."""
    w = Workload(params)
    engine, loader = _engine(w), w.loader()
    engine.train()
    with timer:
        engine_epochs(engine, loader, w.epochs)
    return _outcome(w, timer)


def default_hooks(w: Workload, logger: Any) -> list[Any]:
    """The Colossal-AI tutorial's hook list (examples/demo.py) without the tracking run: loss, LR schedule by
    epoch, accuracy, per-epoch metric log, per-epoch memory log. The scheduler keeps the LR
    constant so the run does the same work as the hand loop (its per-epoch cost is still paid)."""
    from ember.trainer import hooks

    sched = torch.optim.lr_scheduler.LambdaLR(w.optimizer, lambda epoch: 1.0)
    return [
        hooks.LossHook(),
        hooks.LRSchedulerHook(sched, by_epoch=True),
        hooks.AccuracyHook(),
        hooks.LogMetricByEpochHook(logger),
        hooks.LogMemoryByEpochHook(logger),
    ]


def ember_trainer(params: Mapping[str, Any], timer: Timer) -> Outcome:
    """ember's Trainer; ``params["hooks"]``: none / default / default+progress / default+tracking."""
    import ember
    from ember.trainer import Trainer, hooks

    w = Workload(params)
    logger = ember.get_dist_logger()
    trainer = Trainer(engine=_engine(w), logger=logger)
    kind = str(params.get("hooks", "none"))
    chosen = [] if kind == "none" else default_hooks(w, logger)
    if kind == "default+tracking":
        chosen.append(hooks.TrackingHook(name="bench", log_every_n_steps=1))
    loader = w.loader()
    with timer:
        trainer.fit(loader, epochs=w.epochs, hooks=chosen, display_progress=kind == "default+progress")
    return _outcome(w, timer)


def accelerate_loop(params: Mapping[str, Any], timer: Timer) -> Outcome:
    """HF accelerate: ``prepare`` then the plain loop with ``accelerator.backward``."""
    from accelerate import Accelerator

    w = Workload(params)
    accelerator = Accelerator(cpu=True)
    model, opt, loader = accelerator.prepare(w.model, w.optimizer, w.loader())
    crit = w.criterion
    model.train()
    with timer:
        for _ in range(w.epochs):
            for x, y in loader:
                opt.zero_grad(set_to_none=True)
                loss = crit(model(x), y)
                accelerator.backward(loss)
                opt.step()
    return _outcome(w, timer)


def pytorch_accelerated(params: Mapping[str, Any], timer: Timer) -> Outcome:
    """pytorch-accelerated's Trainer; ``params["callbacks"]``: none or default."""
    try:
        from pytorch_accelerated import Trainer
    except ImportError as exc:
        raise NotInstalled(f"pytorch_accelerated: {exc}") from exc

    w = Workload(params)
    kwargs: dict[str, Any] = {}
    if params.get("callbacks") == "none":
        kwargs["callbacks"] = []
    trainer = Trainer(model=w.model, loss_func=w.criterion, optimizer=w.optimizer, **kwargs)
    with timer:
        trainer.train(
            train_dataset=w.dataset,
            num_epochs=w.epochs,
            per_device_batch_size=int(params["batch_size"]),
            train_dataloader_kwargs={"batch_size": 1, "shuffle": False, "num_workers": 0, "pin_memory": False},
            collate_fn=unwrap,
        )
    return _outcome(w, timer)


def lightning_fit(params: Mapping[str, Any], timer: Timer) -> Outcome:
    """Lightning with logger, checkpointing, progress bar and model summary off."""
    import lightning as L

    w = Workload(params)

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = w.model

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return w.criterion(self.model(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return w.optimizer

    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_epochs=w.epochs, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
    )  # fmt: skip
    module, loader = Module(), w.loader()
    with timer:
        trainer.fit(module, train_dataloaders=loader)
    return _outcome(w, timer)


def contenders(with_peers: bool = True) -> tuple[Contender, ...]:
    """The contenders of case 1 (the peers only with ``with_peers``)."""
    ember_side = (
        Contender("hand loop", f"{M}:hand_loop"),
        Contender("ember Engine loop", f"{M}:ember_engine"),
        Contender("ember Trainer, no hooks", f"{M}:ember_trainer", params={"hooks": "none"}),
        Contender("ember Trainer, default hooks", f"{M}:ember_trainer", params={"hooks": "default"}),
        Contender(
            "ember Trainer, default hooks + progress", f"{M}:ember_trainer", params={"hooks": "default+progress"}
        ),
    )
    if not with_peers:
        return ember_side
    return (
        *ember_side,
        Contender("accelerate", f"{M}:accelerate_loop", needs=("accelerate",)),
        Contender("pytorch-accelerated, no callbacks", f"{M}:pytorch_accelerated", ("pytorch_accelerated",),
                  {"callbacks": "none"}),
        Contender("pytorch-accelerated, default callbacks", f"{M}:pytorch_accelerated", ("pytorch_accelerated",),
                  {"callbacks": "default"}),
        Contender("Lightning", f"{M}:lightning_fit", needs=("lightning",)),
    )  # fmt: skip


def groups(quick: bool = False, with_peers: bool = True) -> list[Group]:
    """Tiny MLP (2,000 steps) and small CNN (300 steps), batch 64; ``quick``: a few steps."""
    mlp = {"model": "mlp", "batch_size": 64, "batches": 200, "epochs": 10, "seed": 0}
    cnn = {"model": "cnn", "batch_size": 64, "batches": 100, "epochs": 3, "seed": 0}
    if quick:
        mlp.update(batches=10, epochs=2)
        cnn.update(batches=4, epochs=1)
    return [
        Group("tiny MLP 784-128-10, batch 64", contenders(with_peers), "hand loop", mlp),
        Group("small CNN 1x28x28, batch 64", contenders(with_peers), "hand loop", cnn),
    ]

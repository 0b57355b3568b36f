"""A detectron2/LiBai-style trainer program (HookBase, TrainerBase, SimpleTrainer, EventStorage,
the engine hooks, a checkpointer) on ember, with only its imports rewritten.

The program follows LiBai's trainer design: every optional step of training is a HookBase in a
list given to ``register_hooks`` (``None`` entries allowed), a SimpleTrainer runs a model that
returns a dict of losses, ``train(start_iter, max_iter)`` runs it, a periodic checkpointer saves
and ``resume_or_load`` continues from a later ``start_iter``, an EvalHook evaluates every N
iterations, an LRScheduler hook steps the schedule.
"""

from __future__ import annotations

import json
import logging
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

# detectron2.checkpoint / detectron2.engine / detectron2.utils.events, rewritten:
from ember.compat.detectron2.checkpoint import DetectionCheckpointer
from ember.compat.detectron2.engine import HookBase, SimpleTrainer, TrainerBase, hooks
from ember.compat.detectron2.utils.events import CommonMetricPrinter, EventStorage, JSONWriter, get_event_storage
from ember.errors import CheckpointError, HookError, TrainerError
from ember.logging import get_dist_logger
from ember.trainer import Placeholders
from ember.trainer import hooks as ember_hooks
from ember.trainer.storage import UnknownScalarError
from tests.dist import torchrun
from tests.models import tiny_dataset, tiny_mlp

MAX_ITER = 48  # 3 epochs of 16 batches
PERIOD = 10
DDP_SCRIPT = Path(__file__).parent / "scripts" / "detectron2_ddp.py"


# -- the program --------------------------------------------------------------------------------
class Net(nn.Module):
    """A detectron2-style model: a dict of losses in training, predictions in evaluation."""

    def __init__(self) -> None:
        super().__init__()
        self.body = tiny_mlp()

    def forward(self, batch: Any) -> Any:
        x, y = batch
        logits = self.body(x)
        if not self.training:
            return logits
        return {"loss_cls": F.cross_entropy(logits, y), "loss_l2": 1e-4 * logits.pow(2).mean()}


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader[Any]) -> dict[str, float]:
    model.eval()
    correct = sum(int((model((x, y)).argmax(1) == y).sum()) for x, y in loader)
    model.train()
    return {"accuracy": correct / len(loader.dataset)}  # type: ignore[arg-type]


class Recorder(HookBase):
    """A user's hook: notes when it runs, what the trainer and the storage say, and puts a scalar."""

    def __init__(self, name: str, calls: list[tuple[str, str, int, int]]) -> None:
        self.name, self.calls = name, calls

    def _note(self, event: str) -> None:
        self.calls.append((self.name, event, self.trainer.iter, self.trainer.storage.iter))

    def before_train(self) -> None:
        self._note("before_train")

    def before_step(self) -> None:
        self._note("before_step")

    def after_step(self) -> None:
        self._note("after_step")
        get_event_storage().put_scalar(f"{self.name}/iter", self.trainer.iter, smoothing_hint=False)

    def after_train(self) -> None:
        self._note("after_train")


class CrashAt(HookBase):
    """Stands in for a job that dies at an iteration."""

    def __init__(self, iteration: int) -> None:
        self.iteration = iteration

    def before_step(self) -> None:
        if self.trainer.iter == self.iteration:
            raise RuntimeError(f"killed at iteration {self.iteration}")


def build(out: Path, calls: list[tuple[str, str, int, int]], crash_at: int | None = None) -> tuple[Any, Any]:
    """What a LiBai DefaultTrainer builds: model, loader, optimizer, trainer, checkpointer, hooks."""
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    data = DataLoader(tiny_dataset(256), batch_size=16, shuffle=True)  # for build_detection_train_loader
    test_data = DataLoader(tiny_dataset(256, seed=2), batch_size=64)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[32, 40], gamma=0.1)
    trainer = SimpleTrainer(model, data, optimizer)
    checkpointer = DetectionCheckpointer(model, str(out), trainer=trainer)
    trainer.register_hooks(
        [
            hooks.IterationTimer(),
            hooks.LRScheduler(optimizer=optimizer, scheduler=scheduler),
            hooks.PeriodicCheckpointer(checkpointer, PERIOD),
            hooks.EvalHook(PERIOD, lambda: {"val": evaluate(model, test_data)}),
            Recorder("first", calls),
            None,
            CrashAt(crash_at) if crash_at is not None else None,
            Recorder("second", calls),
            hooks.PeriodicWriter([CommonMetricPrinter(MAX_ITER), JSONWriter(out / "metrics.json")], period=PERIOD),
        ]
    )
    return trainer, checkpointer


def main(out: Path, calls: list[tuple[str, str, int, int]], resume: bool = False, crash_at: int | None = None) -> Any:
    trainer, checkpointer = build(out, calls, crash_at)
    checkpointer.resume_or_load("", resume=resume)
    start_iter = trainer.iter + 1 if resume and checkpointer.has_checkpoint() else 0
    trainer.train(start_iter, MAX_ITER)
    return trainer


# -- what it promises ---------------------------------------------------------------------------
class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The program run once, start to end, with its log lines."""
    out, calls, lines = tmp_path_factory.mktemp("d2_run"), [], Lines()
    logger = get_dist_logger().logger
    logger.addHandler(lines)
    level, _ = logger.level, logger.setLevel(logging.INFO)  # as ember.launch sets it up outside pytest
    try:
        trainer = main(out, calls)
    finally:
        logger.removeHandler(lines)
        logger.setLevel(level)
    return {"trainer": trainer, "calls": calls, "out": out, "lines": lines.lines}


def test_hooks_run_in_registration_order_and_keep_detectron2s_invariants(uninterrupted: dict[str, Any]) -> None:
    calls = uninterrupted["calls"]
    assert all(trainer_iter == storage_iter for *_, trainer_iter, storage_iter in calls)
    steps = [(name, event, it) for name, event, it, _ in calls if event.endswith("_step")]
    order = [(name, event) for event in ("before_step", "after_step") for name in ("first", "second")]
    assert steps == [(name, event, it) for it in range(MAX_ITER) for name, event in order]
    assert calls[:2] == [("first", "before_train", 0, 0), ("second", "before_train", 0, 0)]
    assert calls[-2:] == [("first", "after_train", MAX_ITER, MAX_ITER), ("second", "after_train", MAX_ITER, MAX_ITER)]
    assert uninterrupted["trainer"].iter == MAX_ITER


def test_event_storage_holds_what_hooks_and_the_trainer_put(uninterrupted: dict[str, Any]) -> None:
    storage = uninterrupted["trainer"].storage
    assert storage.history("first/iter").values() == [(float(i), i) for i in range(MAX_ITER)]
    lrs = [lr for lr, _ in storage.history("lr").values()]
    assert lrs == pytest.approx([0.2] * 32 + [0.02] * 8 + [0.002] * 8)  # MultiStepLR, stepped per iteration
    assert [it for _, it in storage.history("time").values()] == list(range(2, MAX_ITER))  # after the warm-up
    assert {"total_loss", "loss_cls", "loss_l2", "data_time"} <= set(storage.histories())
    total = [v for v, _ in storage.history("total_loss").values()]
    assert sum(total[-5:]) < 0.5 * sum(total[:5])
    assert storage.latest()["total_loss"] == (pytest.approx(total[-1]), MAX_ITER - 1)
    assert storage.smoothing_hints()["lr"] is False and storage.smoothing_hints()["total_loss"] is True
    accuracy = storage.history("val/accuracy").values()
    assert [it for _, it in accuracy] == [9, 19, 29, 39, MAX_ITER]  # every PERIOD, the last one after training
    assert accuracy[-1][0] >= 0.9


def test_writers_print_and_write_json_every_period(uninterrupted: dict[str, Any]) -> None:
    rows = [json.loads(line) for line in (uninterrupted["out"] / "metrics.json").read_text().splitlines()]
    assert [row["iteration"] for row in rows] == [9, 19, 29, 39, MAX_ITER - 1, MAX_ITER]
    assert {"total_loss", "lr", "time", "first/iter"} <= set(rows[0]) and "val/accuracy" in rows[-1]
    printed = [line for line in uninterrupted["lines"] if line.lstrip().startswith("eta:")]
    assert len(printed) == 5 and "iter: 19" in printed[1] and "total_loss:" in printed[1] and "lr: 0.2" in printed[1]
    assert any(line.startswith(f"Overall training speed: {MAX_ITER - 2} iterations") for line in uninterrupted["lines"])


def test_periodic_checkpoints_resume_bit_identically_from_a_later_start_iter(
    uninterrupted: dict[str, Any], tmp_path: Path
) -> None:
    crashed: list[tuple[str, str, int, int]] = []
    with pytest.raises(RuntimeError, match="killed at iteration 25"):
        main(tmp_path, crashed, crash_at=25)
    assert crashed[-1] == ("second", "after_train", 25, 25)  # after_train ran, and can tell the run failed
    files = sorted(p.name for p in tmp_path.glob("*.ckpt"))
    assert files == ["ckpt-e0000-s000000010.ckpt", "ckpt-e0001-s000000020.ckpt"]  # 16 iterations an epoch

    calls: list[tuple[str, str, int, int]] = []
    resumed = main(tmp_path, calls, resume=True)
    assert calls[0] == ("first", "before_train", 20, 20)
    steps = [it for name, event, it, _ in calls if (name, event) == ("first", "before_step")]
    assert steps == list(range(20, MAX_ITER))
    full = uninterrupted["trainer"]
    for a, b in zip(full.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert resumed.storage.history("total_loss").values() == full.storage.history("total_loss").values()[20:]
    assert resumed.storage.history("lr").values() == full.storage.history("lr").values()[20:]
    assert resumed.optimizer.state_dict()["param_groups"] == full.optimizer.state_dict()["param_groups"]


@pytest.mark.multiprocess
def test_two_processes_with_the_checkpointer_and_writer_on_the_main_process_only(tmp_path: Path) -> None:
    ranks = torchrun(DDP_SCRIPT, nproc=2, args=[str(tmp_path)]).results
    first, second = ranks[0], ranks[1]
    assert first["world"] == 2 and first["batches_per_epoch"] == 8  # 256 samples, batches of 16, two shards
    assert first["total_loss"] == second["total_loss"]  # the losses are averaged across ranks
    assert first["params"] == second["params"] and first["accuracy"] == second["accuracy"]
    assert [it for _, it in first["accuracy"]] == [4, 9, 14, 20] and first["accuracy"][-1][0] >= 0.9
    assert first["lr"] == pytest.approx([0.2] * 8 + [0.1] * 8 + [0.05] * 4)
    # rank 0 wrote each save once; rank 1, without a PeriodicCheckpointer of its own, took part in it
    assert {int(name.split("-s")[1][:9]) for name in first["files"]} == {5, 10, 15, 20}
    assert all("PeriodicCheckpointer differs between ranks" in r["mismatch"] for r in (first, second))
    # detectron2's utils.comm on ember's process group
    for r, mine in enumerate((first["comm"], second["comm"])):
        assert (mine["world"], mine["rank"], mine["local_rank"], mine["main"]) == (2, r, r, r == 0)
        assert mine["all_gather"] == [{"rank": 0}, {"rank": 1}] and mine["seed"] == first["comm"]["seed"]
    assert first["comm"]["gather"] == [0, 10] and second["comm"]["gather"] == []
    assert first["comm"]["reduced"] == 1.5  # (1 + 2) / 2 on rank 0, detectron2's reduce_dict average
    # the crash stops every rank at an agreed update after it; the resumed job continues bit-identically
    for rank in (first, second):
        assert rank["crashed"] == "killed" and rank["resumed_equal"]
        assert rank["start_iter"] in (10, 15) and rank["start_iter"] == first["start_iter"]
        assert rank["resumed_loss"] == first["total_loss"][first["start_iter"] :]


class ReportsToNative(ember_hooks.BaseHook):
    """An ember hook: sees the same step count and storage as the detectron2 hooks."""

    def __init__(self, calls: list[Any], priority: str) -> None:
        super().__init__(priority=priority, name=f"native-{priority}")
        self.calls = calls

    def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
        self.calls.append((self.name, "after_train_iter", self.trainer.cur_step - 1, None))  # the iteration done


def test_ember_hooks_mix_with_detectron2_hooks(tmp_path: Path) -> None:
    calls: list[Any] = []
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = SimpleTrainer(model, DataLoader(tiny_dataset(64), batch_size=16), optimizer)
    decay = partial(torch.optim.lr_scheduler.LinearLR, end_factor=0.0, total_iters=Placeholders.TOTAL_UPDATE_STEPS)
    schedule = ember_hooks.LRSchedulerHook(decay, by_epoch=False)
    native_high, native_low = ReportsToNative(calls, "HIGH"), ReportsToNative(calls, "LOW")
    loss = ember_hooks.LossHook(on=("train",))
    trainer.register_hooks([native_high, Recorder("d2", calls), loss, native_low, schedule, None])
    trainer.train(0, 6)
    second = [name for name, event, it, _ in calls if event in ("after_train_iter", "after_step") and it == 1]
    assert second == ["native-HIGH", "d2", "native-LOW"]  # ember's priorities around the detectron2 block
    assert [v for v, _ in trainer.storage.history("train/loss").values()] == pytest.approx(
        [v for v, _ in trainer.storage.history("total_loss").values()]
    )  # ember's LossHook puts into the EventStorage, tagged with the iteration
    assert [it for _, it in trainer.storage.history("train/loss").values()] == list(range(6))
    assert trainer.ember_trainer.placeholder_values[Placeholders.TOTAL_UPDATE_STEPS] == 6
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.0)  # the decay ran over the 6 iterations
    assert trainer.ember_trainer.history.epochs("train/loss") == [0, 1]  # 4 batches an epoch

    calls.clear()
    trainer.train(6, 9)  # a second call goes on counting from where the first ended
    assert [it for name, event, it, _ in calls if (name, event) == ("d2", "before_step")] == [6, 7, 8]
    assert trainer.iter == 9 and trainer.engine.num_updates == 9
    calls.clear()
    trainer.train(9, 9)  # nothing left to run: the hooks' before_train and after_train only
    assert [(event, it) for name, event, it, _ in calls if name == "d2"] == [("before_train", 9), ("after_train", 9)]
    assert trainer.engine.num_updates == 9


class HandLoop(TrainerBase):
    """A trainer with its own run_step, as the seed's TrainerBase asks for."""

    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__()
        self.model = tiny_mlp()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.data = tiny_dataset(64)
        self.fail_at = fail_at

    def run_step(self) -> None:
        if self.iter == self.fail_at:
            raise ValueError("bad batch")
        x, y = self.data.tensors[0][:16], self.data.tensors[1][:16]
        loss = F.cross_entropy(self.model(x), y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        get_event_storage().put_scalar("total_loss", loss.detach())


def test_an_own_run_step_runs_in_detectron2s_loop_with_its_hooks() -> None:
    calls: list[tuple[str, str, int, int]] = []
    trainer = HandLoop()
    schedule = torch.optim.lr_scheduler.StepLR(trainer.optimizer, step_size=2, gamma=0.5)
    seen: list[int] = []
    trainer.register_hooks([hooks.LRScheduler(scheduler=schedule), Recorder("mine", calls), hooks.IterationTimer(0)])
    trainer.register_hooks([hooks.CallbackHook(after_step=lambda t: seen.append(t.iter))])
    trainer.train(3, 7)
    assert seen == [3, 4, 5, 6]
    assert [(e, it) for _, e, it, s in calls if it == s] == [
        ("before_train", 3),
        *[(e, i) for i in range(3, 7) for e in ("before_step", "after_step")],
        ("after_train", 7),
    ]
    assert trainer.storage.history("lr").values() == [(0.1, 3), (0.1, 4), (0.05, 5), (0.05, 6)]
    assert len(trainer.storage.history("total_loss").values()) == len(trainer.storage.history("time").values()) == 4
    with pytest.raises(HookError, match="needs ember's Trainer"):
        trainer.register_hooks([ember_hooks.LossHook()])
    with pytest.raises(HookError, match="needs ember's Trainer"):
        trainer.register_hooks([hooks.PeriodicCheckpointer(DetectionCheckpointer(trainer.model, "unused"), 5)])


def test_a_failed_step_leaves_iter_there_and_after_train_still_runs() -> None:
    calls: list[tuple[str, str, int, int]] = []
    evaluated: list[int] = []
    trainer = HandLoop(fail_at=2)
    trainer.register_hooks([Recorder("mine", calls), hooks.EvalHook(0, lambda: evaluated.append(1))])
    with pytest.raises(ValueError, match="bad batch"):
        trainer.train(0, 5)
    assert calls[-1] == ("mine", "after_train", 2, 2) and evaluated == []  # no final evaluation of a failed run


class WithGradNorm(SimpleTrainer):
    """A SimpleTrainer whose run_step adds to the standard one: it runs in detectron2's loop."""

    def run_step(self) -> None:
        super().run_step()
        norm = torch.norm(torch.stack([p.grad.norm() for p in self.model.parameters() if p.grad is not None]))
        get_event_storage().put_scalar("grad_norm", norm)


def test_a_simple_trainer_with_its_own_run_step_uses_the_standard_step_underneath() -> None:
    model = Net()
    trainer = WithGradNorm(model, DataLoader(tiny_dataset(64), batch_size=16), torch.optim.SGD(model.parameters(), 0.1))
    trainer.register_hooks([hooks.IterationTimer()])
    trainer.train(0, 4)
    assert [it for _, it in trainer.storage.history("grad_norm").values()] == [0, 1, 2, 3]
    assert len(trainer.storage.history("total_loss").values()) == 4 and trainer.engine.num_updates == 4
    with pytest.raises(TrainerError, match="ran out after 4 batches"):
        trainer.train(4, 6)  # a run_step of one's own reads batches itself: an endless loader is needed


def test_register_hooks_drops_none_and_explains_what_is_not_a_hook() -> None:
    trainer = HandLoop()
    trainer.register_hooks([None, hooks.IterationTimer(), None])
    assert len(trainer._hooks) == 1 and trainer._hooks[0].trainer.iter == 0

    class Typo(HookBase):
        def after_stpe(self) -> None: ...

    class EmberNamed(HookBase):
        def after_train_iter(self) -> None: ...

    with pytest.raises(HookError, match="did you mean 'after_step'"):
        trainer.register_hooks([Typo()])
    with pytest.raises(HookError, match="did you mean 'after_step'"):
        trainer.register_hooks([EmberNamed()])
    with pytest.raises(HookError, match="got a str"):
        trainer.register_hooks(["IterationTimer"])  # type: ignore[list-item]
    with pytest.raises(HookError, match="not registered"):
        _ = hooks.IterationTimer().trainer
    with pytest.raises(TrainerError, match="0 <= start_iter <= max_iter"):
        trainer.train(5, 3)
    with pytest.raises(CheckpointError, match=r"Checkpointer\(scheduler=...\) needs an object with state_dict"):
        DetectionCheckpointer(trainer.model, "out", optimizer=trainer.optimizer, scheduler=3)
    with pytest.raises(CheckpointError, match=r"the names \['engine'\] are the checkpoint's own"):
        DetectionCheckpointer(trainer.model, "out", engine=trainer.optimizer)


def test_event_storage_is_detectron2s_over_one_step_storage() -> None:
    with pytest.raises(TrainerError, match="no open EventStorage"):
        get_event_storage()
    with EventStorage(5) as storage:
        assert get_event_storage() is storage
        for i, loss in enumerate([4.0, 1.0, 3.0, 5.0]):
            storage.put_scalars(loss=torch.tensor(loss), cur_iter=5 + i)
        storage.put_scalar("lr", 0.1, smoothing_hint=False)
        with storage.name_scope("val"):
            storage.put_scalar("accuracy", 0.75)
        storage.step()
        assert storage.iter == storage.iteration == 6
        loss = storage.history("loss")
        assert loss.values() == [(4.0, 5), (1.0, 6), (3.0, 7), (5.0, 8)]
        assert (loss.latest(), loss.median(3), loss.avg(2), loss.global_avg()) == (5.0, 3.0, 4.0, 3.25)
        assert storage.count_samples("loss", 2) == 2
        assert storage.latest() == {"loss": (5.0, 8), "lr": (0.1, 5), "val/accuracy": (0.75, 5)}
        assert storage.latest_with_smoothing_hint(3)["loss"] == (3.0, 8)  # median of iterations 6-8
        assert storage.latest_with_smoothing_hint(3)["lr"] == (0.1, 5)
        with pytest.raises(TrainerError, match="smoothing_hint=False before"):
            storage.put_scalar("lr", 0.2)
        with pytest.raises(TrainerError, match="must be a number"):
            storage.put_scalar("name", "fast")
        with pytest.raises(KeyError):  # detectron2's writers catch a KeyError for a scalar not put yet
            storage.history("time")
        with pytest.raises(UnknownScalarError, match="known: loss, lr, val/accuracy"):
            storage.history("time")
    with pytest.raises(TrainerError, match="no open EventStorage"):
        get_event_storage()  # the block closed


def test_comm_works_alone_and_refuses_what_it_cannot_reduce() -> None:
    from ember.compat.detectron2.utils import comm

    assert (comm.get_world_size(), comm.get_rank(), comm.get_local_rank(), comm.get_local_size()) == (1, 0, 0, 1)
    assert comm.is_main_process() and comm.all_gather({"a": 1}) == [{"a": 1}] and comm.gather(3) == [3]
    losses = {"loss_cls": torch.tensor(0.5), "loss_box": torch.tensor(1.5)}
    assert comm.reduce_dict(losses) is losses
    assert isinstance(comm.shared_random_seed(), int)
    comm.synchronize()
    with pytest.raises(TrainerError, match=r"reduce_dict takes one-element tensors.*\['a'\]"):
        comm.reduce_dict({"a": "x"})  # type: ignore[dict-item]

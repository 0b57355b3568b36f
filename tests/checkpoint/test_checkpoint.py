"""Checkpoints in one process: resume rules, damaged files, retention, preemption, async, export, inspect."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import ember
from ember import checkpoint
from ember.checkpoint.io import BEST_POINTER, POINTER, find_checkpoints, read_pointer
from ember.cli import main as ember_main
from ember.errors import CheckpointError, HookError, TrainerError
from ember.trainer import PREEMPTED_EXIT_CODE, Preempted, Trainer, hooks
from tests.checkpoint import common
from tests.checkpoint.common import Crash, params
from tests.models import tiny_mlp
from tests.trainer.helpers import RecordingLogger

STEP8 = "ckpt-e0001-s000000008.ckpt"  # update 8: batch 15, in the second epoch
EPOCH2 = "ckpt-e0002-s000000010.ckpt"  # the end of the second epoch


@pytest.fixture(scope="module")
def reference() -> tuple[list[torch.Tensor], dict[str, Any]]:
    trainer = common.run(None)
    recorder = trainer.get_hook("Recorder")
    return params(trainer), {"losses": recorder.losses, "history": trainer.history.state_dict()}  # type: ignore[attr-defined]


def crashed_run(directory: Path, at: int = 20, **ckpt_kwargs: Any) -> None:
    with pytest.raises(RuntimeError, match="crashed"):
        common.run(directory, extra=[Crash(at)], **ckpt_kwargs)


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def assert_matches(trainer: Any, reference: tuple[list[torch.Tensor], dict[str, Any]]) -> None:
    ref_params, ref = reference
    assert all(torch.equal(a, b) for a, b in zip(params(trainer), ref_params, strict=True))
    losses = trainer.get_hook("Recorder").losses
    assert losses == {b: ref["losses"][b] for b in losses}
    assert trainer.history.state_dict() == ref["history"]


# -- resume rules ---------------------------------------------------------------------------------
def test_auto_resumes_from_the_newest_checkpoint_bit_identically(tmp_path: Path, reference: Any) -> None:
    crashed_run(tmp_path)  # newest: update 10, the end of epoch 2 (batch 18)
    trainer = common.run(tmp_path)
    assert trainer.get_hook("CheckpointHook").resumed_from == tmp_path / EPOCH2  # type: ignore[attr-defined]
    assert trainer.get_hook("Recorder").resumed_at == 18  # type: ignore[attr-defined]
    assert_matches(trainer, reference)


def test_a_truncated_checkpoint_is_a_clear_error_when_loaded_explicitly(tmp_path: Path) -> None:
    crashed_run(tmp_path)
    truncate(tmp_path / EPOCH2)
    trainer, _, _ = common.build()
    with pytest.raises(CheckpointError, match=rf"checkpoint '.*{EPOCH2}' is truncated or corrupt"):
        checkpoint.load(tmp_path / EPOCH2, trainer)
    with pytest.raises(CheckpointError, match=EPOCH2):
        common.run(tmp_path, resume=tmp_path / EPOCH2)


def test_auto_falls_back_past_a_truncated_checkpoint_and_says_so(tmp_path: Path, reference: Any) -> None:
    crashed_run(tmp_path)
    truncate(tmp_path / EPOCH2)
    logger = RecordingLogger()
    trainer = common.run(tmp_path, logger=logger)
    warning = logger.lines("falling back")
    assert len(warning) == 1 and EPOCH2 in warning[0] and "truncated or corrupt" in warning[0]
    assert trainer.get_hook("CheckpointHook").resumed_from == tmp_path / STEP8  # type: ignore[attr-defined]
    assert_matches(trainer, reference)


def test_auto_with_no_checkpoint_says_so_and_starts_fresh(tmp_path: Path, reference: Any) -> None:
    logger = RecordingLogger()
    trainer = common.run(tmp_path / "new", logger=logger)
    assert logger.lines("no checkpoint in") and trainer.get_hook("Recorder").resumed_at == 0  # type: ignore[attr-defined]
    assert_matches(trainer, reference)


def test_a_directory_path_resumes_from_its_newest_and_a_missing_path_is_an_error(tmp_path: Path) -> None:
    crashed_run(tmp_path / "a")
    trainer = common.run(tmp_path / "b", resume=tmp_path / "a")
    assert trainer.get_hook("CheckpointHook").resumed_from == tmp_path / "a" / EPOCH2  # type: ignore[attr-defined]
    with pytest.raises(CheckpointError, match="does not exist"):
        common.run(tmp_path / "c", resume=tmp_path / "nothing.ckpt")
    (tmp_path / "c").mkdir()
    with pytest.raises(CheckpointError, match="no checkpoint in"):
        common.run(tmp_path / "c", resume=tmp_path / "c")


def test_ember_resume_auto_in_the_environment_resumes_fit_with_resume_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    crashed_run(tmp_path)
    monkeypatch.setenv("EMBER_RESUME", "auto")
    trainer = common.run(tmp_path, resume=None)
    assert trainer.get_hook("Recorder").resumed_at == 18  # type: ignore[attr-defined]
    logger = RecordingLogger()
    common.run(None, logger=logger, resume=None)  # no CheckpointHook: say so, train from scratch
    assert logger.lines("EMBER_RESUME=auto, but no CheckpointHook")


@pytest.mark.parametrize(("resume", "fragment"), [("auto", "no CheckpointHook"), (3, "takes None, 'auto' or a")])
def test_bad_resume_arguments_are_trainer_errors(resume: Any, fragment: str) -> None:
    with pytest.raises(TrainerError, match=fragment):
        common.run(None, resume=resume)


def test_functional_save_mid_cycle_and_load_before_fit_continue_bit_identically(tmp_path: Path, reference: Any) -> None:
    class SaveThenCrash(hooks.BaseHook):
        def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
            if self.trainer.micro_step == 12:  # the first half of an accumulation cycle
                checkpoint.save(tmp_path / "manual.ckpt", self.trainer)
                raise RuntimeError("crashed")

    with pytest.raises(RuntimeError, match="crashed"):
        common.run(None, extra=[SaveThenCrash()])
    trainer, train, test = common.build()
    meta = checkpoint.load(tmp_path / "manual.ckpt", trainer)
    assert (meta["micro_step"], meta["accumulation_micro_step"], meta["step"]) == (12, 1, 6)
    trainer.fit(train, epochs=3, test_dataloader=test, hooks=common.hook_list(trainer, None, [SaveThenCrash(name="x")]))
    assert_matches(trainer, reference)


def test_save_keeps_the_callers_extra_entries_and_load_returns_them(tmp_path: Path) -> None:
    trainer, _, _ = common.build()
    extra = {"eval_loss_epoch": 0.25, "tag": "best", "scores": [1, 2], "mask": torch.ones(2)}
    checkpoint.save(tmp_path / "x.ckpt", trainer, extra=extra)
    meta = checkpoint.load(tmp_path / "x.ckpt", common.build()[0])
    assert meta["extra"]["eval_loss_epoch"] == 0.25 and meta["extra"]["scores"] == [1, 2]
    assert torch.equal(meta["extra"]["mask"], torch.ones(2))
    with pytest.raises(CheckpointError, match=r"entry extra\['where'\] is a pathlib"):
        checkpoint.save(tmp_path / "y.ckpt", trainer, extra={"where": tmp_path})
    assert not (tmp_path / "y.ckpt").exists()


def test_model_state_maps_the_file_and_returns_the_weights_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer, _, _ = common.build()
    checkpoint.save(tmp_path / "x.ckpt", trainer)
    calls: list[dict[str, Any]] = []
    real_load = torch.load

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    weights = checkpoint.model_state(tmp_path / "x.ckpt")
    # mapped: the optimizer's bytes (two thirds of an Adam checkpoint) are never read
    assert [(c["mmap"], c["weights_only"]) for c in calls] == [(True, True)]
    expected = trainer.engine.model.state_dict()
    assert weights.keys() == expected.keys() and all(torch.equal(weights[k], expected[k]) for k in expected)
    weights[next(iter(weights))].add_(1.0)  # copy-on-write: the file is not changed
    monkeypatch.undo()
    again = checkpoint.model_state(tmp_path / "x.ckpt")
    assert all(torch.equal(again[k], expected[k]) for k in expected)


def test_a_checkpoint_of_another_kind_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    torch.save(tiny_mlp(0).state_dict(), tmp_path / "weights.pt")
    trainer, _, _ = common.build()
    with pytest.raises(CheckpointError, match="not an ember checkpoint"):
        checkpoint.load(tmp_path / "weights.pt", trainer)


def test_hook_state_that_would_not_load_safely_is_refused_when_saving(tmp_path: Path) -> None:
    class Pathy(hooks.BaseHook):
        def state_dict(self) -> dict[str, Any]:
            return {"where": tmp_path}

        def load_state_dict(self, state: Any) -> None:
            pass

    with pytest.raises(CheckpointError, match=r"hooks\['Pathy'\]\['where'\] is a pathlib\.\w*Path"):
        common.run(tmp_path, extra=[Pathy()])


# -- retention ------------------------------------------------------------------------------------
def names(directory: Path) -> list[str]:
    return [f.path.name for f in find_checkpoints(directory)]


def test_keep_last_keeps_the_newest_and_the_best_and_points_at_both(tmp_path: Path) -> None:
    # train/loss falls, so with mode="max" the first epoch stays the best
    trainer = common.run(tmp_path, every_n_steps=1, keep_last=2, save_best="train/loss", mode="max")
    hook = trainer.get_hook("CheckpointHook")
    best = "ckpt-e0001-s000000005.ckpt"
    assert names(tmp_path) == [best, "ckpt-e0002-s000000014.ckpt", "ckpt-e0003-s000000015.ckpt"]
    assert hook.best_path == tmp_path / best and hook.best_epoch == 0  # type: ignore[attr-defined]
    assert read_pointer(tmp_path, BEST_POINTER) == best
    assert read_pointer(tmp_path, POINTER) == "ckpt-e0003-s000000015.ckpt"


def test_save_best_follows_an_improving_metric_and_deletes_the_old_best(tmp_path: Path) -> None:
    trainer = common.run(tmp_path, every_n_steps=None, every_n_epochs=None, keep_last=1, save_best="train/loss",
                         mode="min")  # fmt: skip
    assert names(tmp_path) == ["ckpt-e0003-s000000015.ckpt"]  # the best is also the newest
    assert trainer.get_hook("CheckpointHook").best == min(trainer.history.values("train/loss"))  # type: ignore[attr-defined]


def test_the_checkpoint_resumed_from_is_never_deleted(tmp_path: Path) -> None:
    crashed_run(tmp_path, at=10)  # newest: update 5 at the end of epoch 1
    common.run(tmp_path, every_n_steps=1, keep_last=1)
    assert names(tmp_path) == ["ckpt-e0001-s000000005.ckpt", "ckpt-e0003-s000000015.ckpt"]


def test_save_last_saves_where_fit_ends_and_can_be_turned_off(tmp_path: Path) -> None:
    common.run(tmp_path / "on", every_n_steps=None, every_n_epochs=None, max_steps=7)
    # update 7 is batch 13, in the second epoch, which max_steps closes: the state is epoch 2's start
    assert names(tmp_path / "on") == ["ckpt-e0002-s000000007.ckpt"]
    meta = checkpoint.read(tmp_path / "on" / "ckpt-e0002-s000000007.ckpt")["meta"]
    assert (meta["reason"], meta["fit_active"], meta["micro_step"]) == ("final", False, 13)
    common.run(tmp_path / "off", every_n_steps=None, every_n_epochs=None, max_steps=7, save_last=False)
    assert names(tmp_path / "off") == []


def test_a_finished_run_resumed_with_auto_trains_no_further(tmp_path: Path) -> None:
    common.run(tmp_path, every_n_steps=None, every_n_epochs=None)
    trainer = common.run(tmp_path)
    assert trainer.get_hook("Recorder").losses == {} and (trainer.cur_epoch, trainer.cur_step) == (3, 15)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"every_n_steps": 0}, "every_n_steps"),
        ({"keep_last": 1.5}, "keep_last"),
        ({"save_best": "accuracy"}, "history name like"),
        ({"mode": "best"}, "'max' or 'min'"),
        ({"dir": None}, "directory path"),
    ],
)
def test_bad_checkpoint_hook_arguments_are_refused(kwargs: dict[str, Any], fragment: str) -> None:
    with pytest.raises(HookError, match=fragment):
        hooks.CheckpointHook(**{"dir": "ckpt", **kwargs})


def test_two_checkpoint_hooks_on_one_directory_are_refused(tmp_path: Path) -> None:
    with pytest.raises(HookError, match="both save to"):
        common.run(tmp_path, extra=[hooks.CheckpointHook(tmp_path, name="other")])


# -- preemption and background writes -------------------------------------------------------------
def test_sigterm_saves_at_the_next_update_runs_after_train_and_exits_with_the_code(
    tmp_path: Path, reference: Any
) -> None:
    ended: list[bool] = []

    class AfterTrain(hooks.BaseHook):
        def after_train(self) -> None:
            ended.append((tmp_path / "ckpt-e0001-s000000007.ckpt").is_file())

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Preempted) as info:
        common.run(tmp_path, kill_at=12, sig=signal.SIGTERM, extra=[AfterTrain()])
    assert info.value.code == PREEMPTED_EXIT_CODE == 75 and "SIGTERM" in info.value.reason
    assert info.value.path == tmp_path / "ckpt-e0001-s000000007.ckpt"  # batch 13 closed the cycle
    assert ended == [True]  # saved before after_train
    assert signal.getsignal(signal.SIGTERM) is before
    meta = checkpoint.read(info.value.path)["meta"]
    assert (meta["reason"], meta["fit_active"], meta["micro_step"]) == ("preempt", True, 13)
    trainer = common.run(tmp_path)
    assert trainer.get_hook("Recorder").resumed_at == 13  # type: ignore[attr-defined]
    assert_matches(trainer, reference)


def test_sigint_is_preemption_too(tmp_path: Path) -> None:
    with pytest.raises(Preempted, match="SIGINT"):
        common.run(tmp_path, kill_at=3, sig=signal.SIGINT)
    assert names(tmp_path) == ["ckpt-e0000-s000000002.ckpt"]  # batch 4 closes update 2: saved once


def test_async_save_writes_the_same_checkpoints_and_fit_waits_for_them(tmp_path: Path) -> None:
    common.run(tmp_path / "sync")
    trainer = common.run(tmp_path / "async", async_save=True)
    assert trainer.get_hook("CheckpointHook").checkpointer._writer._thread is None  # type: ignore[attr-defined]
    assert names(tmp_path / "async") == names(tmp_path / "sync")
    assert not [p for p in (tmp_path / "async").iterdir() if p.name.startswith(".")]
    for name in names(tmp_path / "sync"):
        a, b = checkpoint.read(tmp_path / "sync" / name), checkpoint.read(tmp_path / "async" / name)
        assert all(torch.equal(a["engine"]["model"][k], v) for k, v in b["engine"]["model"].items())
        assert a["trainer"] == b["trainer"] and a["ranks"][0]["rng"]["python"] == b["ranks"][0]["rng"]["python"]


def _slow_background_copies(monkeypatch: pytest.MonkeyPatch, seconds: float = 0.2) -> None:
    """Make background_copy's copy of parameters and optimizer state start ``seconds`` later."""
    from ember.checkpoint.state import DeferredCopy

    real = DeferredCopy.run

    def slow(self: DeferredCopy) -> None:
        time.sleep(seconds)
        real(self)

    monkeypatch.setattr(DeferredCopy, "run", slow)


class _Negate(hooks.BaseHook):
    """Negates the parameters in place for the test pass and back (exact), as EMAHook swaps weights in."""

    priority = hooks.Priority.HIGHEST

    def before_test_epoch(self) -> None:
        self._flip()

    def after_test_epoch(self) -> None:
        self._flip()

    @torch.no_grad()
    def _flip(self) -> None:
        for p in self.trainer.engine.model.parameters():
            p.neg_()


def _same_weights(a_dir: Path, b_dir: Path) -> None:
    assert names(a_dir) == names(b_dir) and names(a_dir)
    for name in names(a_dir):
        a, b = checkpoint.read(a_dir / name), checkpoint.read(b_dir / name)
        assert all(torch.equal(a["engine"]["model"][k], v) for k, v in b["engine"]["model"].items()), name


def _same_checkpoints(a_dir: Path, b_dir: Path) -> None:
    assert names(a_dir) == names(b_dir) and names(a_dir)
    for name in names(a_dir):
        a, b = checkpoint.read(a_dir / name), checkpoint.read(b_dir / name)
        assert all(torch.equal(a["engine"]["model"][k], v) for k, v in b["engine"]["model"].items()), name
        opt_a, opt_b = a["engine"]["optimizer"]["state"], b["engine"]["optimizer"]["state"]
        assert all(torch.equal(opt_a[i]["momentum_buffer"], s["momentum_buffer"]) for i, s in opt_b.items()), name


@pytest.mark.parametrize("background_copy", [False, True], ids=["optimizer-state", "and-parameters"])
@pytest.mark.parametrize(
    "case, kwargs",
    [
        # one micro-step per update, saves mid-epoch: the optimizer step is the first change after a save
        ("step", {"config": {"gradient_accumulation": 1}, "every_n_steps": 3}),
        # saves on an epoch's last batch, then a hook negates the weights for the test pass
        ("hook", {"extra": [_Negate()], "every_n_steps": 5, "every_n_epochs": None}),
    ],
)
def test_async_save_finishes_its_background_copy_before_the_step_or_a_hook_changes_the_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str, kwargs: dict[str, Any], background_copy: bool
) -> None:
    common.run(tmp_path / "sync", **kwargs)
    _slow_background_copies(monkeypatch)
    if case == "step":  # the optimizer's pre-step hook alone must hold the step back
        from ember.trainer._bus import HookBus

        monkeypatch.setattr(HookBus, "hold_until", lambda self, ready: None)
    kwargs = {**kwargs, "extra": [_Negate()]} if case == "hook" else kwargs
    trainer = common.run(tmp_path / "async", async_save=True, background_copy=background_copy, **kwargs)
    _same_checkpoints(tmp_path / "sync", tmp_path / "async")  # weights and momentum buffers
    hook = trainer.get_hook("CheckpointHook")
    assert hook.stall_s >= 0.15  # type: ignore[attr-defined]  # the waits for the slowed copies are counted


class _Touch(hooks.BaseHook):
    """Writes the weights in place without changing them (their version counter moves), after
    the CheckpointHook in the same event."""

    priority = hooks.Priority.LOWEST

    @torch.no_grad()
    def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
        for p in self.trainer.engine.model.parameters():
            p.mul_(1.0)


def test_a_hook_after_the_checkpoint_hook_in_the_same_event_waits_for_the_background_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _slow_background_copies(monkeypatch)
    trainer, train, _ = common.build()
    ckpt = hooks.CheckpointHook(
        tmp_path,
        every_n_steps=1,
        every_n_epochs=None,
        keep_last=None,
        save_last=False,
        async_save=True,
        background_copy=True,
    )
    trainer.fit(train, epochs=1, hooks=[ckpt, _Touch()])  # would raise CheckpointError if _Touch did not wait
    assert len(checkpoint.find_checkpoints(tmp_path)) == trainer.cur_step


class _RenormEmbedding(nn.Module):
    """An embedding whose forward renormalises its rows in place (``max_norm``), then a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 6, max_norm=0.5)
        self.head = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x).mean(1))


def _renorm_trainer() -> tuple[Trainer, list[tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(0)
    model = _RenormEmbedding()
    engine = ember.initialize(model, torch.optim.SGD(model.parameters(), lr=0.5), nn.CrossEntropyLoss())[0]
    g = torch.Generator().manual_seed(1)
    data = [(torch.randint(0, 10, (8, 4), generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(6)]
    return Trainer(engine), data


def test_async_save_copies_at_once_by_default_so_a_forward_that_writes_its_weights_is_saved_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _slow_background_copies(monkeypatch)  # would only matter with background_copy=True
    for kind, async_save in (("sync", False), ("async", True)):
        trainer, data = _renorm_trainer()
        ckpt = hooks.CheckpointHook(tmp_path / kind, every_n_steps=2, every_n_epochs=None, keep_last=None,
                                    save_last=False, async_save=async_save)  # fmt: skip
        trainer.fit(data, epochs=1, hooks=[ckpt])
    _same_weights(tmp_path / "sync", tmp_path / "async")


def test_background_copy_refuses_a_checkpoint_whose_weights_the_forward_changed_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _slow_background_copies(monkeypatch)
    trainer, data = _renorm_trainer()
    ckpt = hooks.CheckpointHook(tmp_path, every_n_steps=2, every_n_epochs=None, save_last=False, async_save=True,
                                background_copy=True)  # fmt: skip
    with pytest.raises(CheckpointError, match=r"changed in place between the save and the optimizer step"):
        trainer.fit(data, epochs=1, hooks=[ckpt])
    assert not checkpoint.find_checkpoints(tmp_path)


def test_background_copy_needs_async_save() -> None:
    with pytest.raises(HookError, match="needs async_save=True"):
        hooks.CheckpointHook("ckpt", background_copy=True)


def test_staging_buffers_are_reused_from_save_to_save_and_hold_exact_copies() -> None:
    from ember.checkpoint.state import StagingBuffers, to_cpu

    staging = StagingBuffers()
    live = {"w": torch.randn(3, 4), "opt": [torch.arange(5), (torch.tensor(2.0),)], "step": 7}
    first = to_cpu(live, staging)
    assert torch.equal(first["w"], live["w"]) and first["w"].data_ptr() != live["w"].data_ptr()
    kept = first["w"].data_ptr()
    live["w"].add_(1.0)  # training goes on: the copy does not change
    assert not torch.equal(first["w"], live["w"])
    second = to_cpu(live, staging)  # the same shapes: copied into the same memory
    assert second["w"].data_ptr() == kept and torch.equal(second["w"], live["w"])
    assert second["opt"][1][0].item() == 2.0 and second["step"] == 7
    live["w"] = torch.randn(2, 2)  # another shape: a new buffer; a shorter state drops the rest
    third = to_cpu({"w": live["w"]}, staging)
    assert third["w"].data_ptr() != kept and torch.equal(third["w"], live["w"])
    assert len(staging._used) == 1


# -- the command line and bare weights ------------------------------------------------------------
def test_export_writes_weights_that_load_strictly_into_the_plain_model(tmp_path: Path) -> None:
    trainer = common.run(tmp_path)
    assert ember_main(["checkpoint", "export", str(tmp_path), str(tmp_path / "model.pt")]) == 0
    plain = tiny_mlp(0, dropout=0.3)
    plain.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True), strict=True)
    assert all(torch.equal(a, b) for a, b in zip(plain.parameters(), params(trainer), strict=True))
    checkpoint.save_model(tmp_path / "direct.pt", trainer.engine)
    tiny_mlp(0, dropout=0.3).load_state_dict(torch.load(tmp_path / "direct.pt", weights_only=True), strict=True)


def test_export_to_safetensors_loads_strictly(tmp_path: Path) -> None:
    safetensors = pytest.importorskip("safetensors.torch")
    common.run(tmp_path)
    assert ember_main(["checkpoint", "export", str(tmp_path), str(tmp_path / "model.safetensors")]) == 0
    tiny_mlp(0, dropout=0.3).load_state_dict(safetensors.load_file(tmp_path / "model.safetensors"), strict=True)


def test_inspect_prints_step_epoch_metrics_and_sizes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common.run(tmp_path)
    assert ember_main(["checkpoint", "inspect", str(tmp_path / EPOCH2)]) == 0
    out = capsys.readouterr().out
    assert "step             10 optimizer updates, 18 batches, 144 samples" in out
    assert "epoch            2 (at its start)" in out
    for line in ("train/loss", "test/accuracy", "size of engine", "processes        1"):
        assert line in out


def test_the_command_line_names_a_damaged_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "ckpt-e0000-s000000001.ckpt").write_bytes(b"not a checkpoint")
    assert ember_main(["checkpoint", "inspect", str(tmp_path)]) == 2
    assert "ckpt-e0000-s000000001.ckpt' is truncated or corrupt" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("out", "message"),
    [("existing", "is a directory: give a file name in it"), ("missing/sub/model.pt", "missing/sub' does not exist")],
)
def test_export_refuses_a_directory_or_a_missing_folder_and_creates_no_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], out: str, message: str
) -> None:
    common.run(tmp_path / "ckpt")
    (tmp_path / "existing").mkdir()
    assert ember_main(["checkpoint", "export", str(tmp_path / "ckpt"), str(tmp_path / out)]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "missing").exists() and not any((tmp_path / "existing").iterdir())


def test_a_checkpointer_in_a_loop_of_ones_own_keeps_the_newest_and_resumes_from_the_newest_that_reads(
    tmp_path: Path,
) -> None:
    """The Checkpointer the hook saves through works alone: lock, pointer, retention, latest good file."""
    trainer, train, _ = common.build()
    trainer.fit(train, max_steps=2)
    ckpt = checkpoint.Checkpointer(tmp_path, keep_last=2)
    ckpt.open(trainer.engine)
    with pytest.raises(CheckpointError, match="being written by another trainer"):
        checkpoint.Checkpointer(tmp_path).open()
    saved = [ckpt.save(trainer, checkpoint.checkpoint_name(1, step), reason="step") for step in (3, 4, 5)]
    ckpt.close()
    assert names(tmp_path) == [p.name for p in saved[1:]] and read_pointer(tmp_path) == saved[-1].name
    assert ckpt.last_path == saved[-1] and checkpoint.read(saved[-1])["meta"]["reason"] == "step"
    saved[-1].write_bytes(b"not a checkpoint")
    found = ckpt.latest_good(trainer.logger)
    assert found is not None and found[0] == saved[1]
    assert (tmp_path / f"{saved[-1].name}.damaged").is_file() and names(tmp_path) == [saved[1].name]
    with pytest.raises(CheckpointError, match="keep_last"):
        checkpoint.Checkpointer(tmp_path, keep_last=0)

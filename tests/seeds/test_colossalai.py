"""Colossal-AI programs run on ember after the import rewrite (``colossalai`` -> ``ember.compat.colossalai``).

The first tests run the tutorial's Engine and Trainer programs and the write-up's ``eval.py``
(``tests/seeds/scripts/colossalai_*.py``) under 2 gloo processes, as the seeds do, and check what
the seeds promise: training reaches an accuracy, ``CosineAnnealingLR(total_steps=NUM_EPOCHS)``
steps once per epoch, the test loader built with ``add_sampler=False`` is evaluated in full on
each rank, the custom hook runs with the priority it was given. The rest check the compat
pieces one by one in this process, the LR schedulers against their formulas.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import ember
from ember.data import is_kept_unsharded
from ember.errors import ConfigError, ContextError, EngineError, HookError, TrainerError
from tests.dist import torchrun
from tests.models import tiny_dataset, tiny_mlp

SCRIPTS = Path(__file__).parent / "scripts"
TEST_SET = 202  # the stand-in CIFAR10 test set
multiprocess = pytest.mark.multiprocess


def _cosine(epochs: int) -> list[float]:
    """The rate after each epoch of CosineAnnealingLR(lr=0.1, total_steps=epochs) stepped per epoch."""
    return [0.1 * (1 + math.cos(math.pi * (e + 1) / epochs)) / 2 for e in range(epochs)]


def _run(script: str) -> dict[int, dict[str, Any]]:
    results = torchrun(SCRIPTS / script, nproc=2, timeout=240).results
    assert sorted(results) == [0, 1]
    return results


@pytest.fixture(scope="module")
def engine_program() -> dict[int, dict[str, Any]]:
    return _run("colossalai_resnet_engine.py")


@pytest.fixture(scope="module")
def trainer_program() -> dict[int, dict[str, Any]]:
    return _run("colossalai_resnet_trainer.py")


@pytest.fixture(scope="module")
def eval_program() -> dict[int, dict[str, Any]]:
    return _run("colossalai_eval.py")


# -- the seed programs, 2 processes ---------------------------------------------------------------
@multiprocess
def test_engine_program_trains_with_the_config_files_fp16_and_steps_the_cosine_per_epoch(
    engine_program: dict[int, dict[str, Any]],
) -> None:
    for r in (0, 1):
        got = engine_program[r]
        assert got["world"] == got["data_world"] == 2 and got["rank"] == r
        assert got["amp"] == "fp16"  # config.py's fp16=dict(mode=AMP_TYPE.TORCH)
        assert got["train_batches"] == 8  # 512 samples, 32 per batch, split over 2 ranks
        epochs = got["epochs"]
        assert [e["lr_after"] for e in epochs] == pytest.approx(_cosine(4), abs=1e-12)
        assert [e["lr_used"] for e in epochs] == pytest.approx([0.1, *_cosine(4)[:-1]], abs=1e-12)
        assert epochs[-1]["acc"] >= 0.6 and epochs[-1]["acc"] > epochs[0]["acc"]


@multiprocess
@pytest.mark.parametrize("program", ["engine_program", "eval_program"])
def test_each_rank_evaluates_the_whole_test_set_built_with_add_sampler_false(
    program: str, request: pytest.FixtureRequest
) -> None:
    ranks = request.getfixturevalue(program)
    for r in (0, 1):
        assert all(e["total"] == TEST_SET for e in ranks[r]["epochs"])
    assert ranks[0]["epochs"] == ranks[1]["epochs"]  # the same weights, the same whole set: the same accuracy


@multiprocess
def test_trainer_program_trains_with_colossal_hooks_and_steps_the_scheduler_per_epoch(
    trainer_program: dict[int, dict[str, Any]],
) -> None:
    for r in (0, 1):
        got = trainer_program[r]
        assert got["cur_epoch"] == 4 and got["steps_per_epoch"] == 8
        assert got["accuracy"][-1] >= 0.6 and got["train_loss"][-1] < got["train_loss"][0]
        assert [e["lr_after"] for e in got["epochs"]] == pytest.approx(_cosine(4), abs=1e-12)
        assert [e["lr_used"] for e in got["epochs"]] == pytest.approx([0.1, *_cosine(4)[:-1]], abs=1e-12)
        assert all(e["test_samples"] == TEST_SET for e in got["epochs"])  # every epoch tests, in full


@multiprocess
def test_trainer_program_runs_hooks_by_colossal_priorities_and_the_custom_hook_with_its_own(
    trainer_program: dict[int, dict[str, Any]],
) -> None:
    got = trainer_program[0]
    assert got["hooks"][:6] == [["LossHook", 0], ["AccuracyHook", 0], ["LRSchedulerHook", 1],
                                ["LogMetricByEpochHook", 10], ["LogMemoryByEpochHook", 10],
                                ["LogMessageHook", 10]]  # fmt: skip
    assert got["custom_priority"] == 10  # its __init__ never calls super().__init__
    messages = got["messages"]
    assert messages.index("training starts") < messages.index("training finished")
    assert "training finished" in trainer_program[1]["messages"]  # the hook logs on every rank
    assert any(m.startswith("epoch 4/4 | ") and "test/accuracy" in m and "lr 0" in m for m in messages)
    assert "backend='nccl' needs CUDA, which this machine lacks: using 'gloo'" in messages
    assert not any("nccl" in m for m in trainer_program[1]["messages"])  # said once, by rank 0


@multiprocess
def test_eval_program_runs_from_a_config_object_and_saves_plain_model_keys(
    eval_program: dict[int, dict[str, Any]],
) -> None:
    for r in (0, 1):
        got = eval_program[r]
        # fp16 nested under the user key CONFIG is the program's constant, not a setting (as in Colossal-AI)
        assert got["amp"] is None and got["nested"] == "torch"
        assert [e["lr_after"] for e in got["epochs"]] == pytest.approx(_cosine(3), abs=1e-12)
        assert got["epochs"][-1]["acc"] >= 0.3  # 10 classes: chance is 0.1
        assert got["reloaded_equal"] and got["keys"] == ["0.bias", "0.weight", "3.bias", "3.weight"]


# -- launch, config, gpc, logging, data, initialize: one process ------------------------------------
@pytest.fixture
def colossal_log() -> Any:
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logger = ember.get_dist_logger().logger
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


def _launch(config: Any = None) -> None:
    import ember.compat.colossalai as colossalai

    colossalai.launch(config={} if config is None else config, rank=0, world_size=1, host="127.0.0.1", port=29500,
                      verbose=False)  # fmt: skip


@pytest.mark.skipif(torch.cuda.is_available(), reason="the fallback is for machines without CUDA")
def test_launch_falls_back_from_nccl_to_gloo_with_one_warning(colossal_log: list[str]) -> None:
    _launch({"BATCH_SIZE": 8})
    assert colossal_log == ["backend='nccl' needs CUDA, which this machine lacks: using 'gloo'"]
    assert ember.context.device.type == "cpu"


def test_apex_amp_is_refused_naming_the_torch_and_naive_modes() -> None:
    from ember.compat.colossalai.amp import AMP_TYPE

    with pytest.raises(ConfigError, match=r"'apex'.*mode='torch'.*mode='naive'"):
        _launch({"fp16": {"mode": AMP_TYPE.APEX}})


def test_config_and_gpc_read_the_launched_context() -> None:
    from ember.compat.colossalai.amp import AMP_TYPE
    from ember.compat.colossalai.context import Config, ParallelMode
    from ember.compat.colossalai.core import global_context as gpc

    assert not gpc.is_initialized(ParallelMode.DATA)
    with pytest.raises(ContextError, match="launch_from_torch"):
        gpc.config  # noqa: B018 - reading it is the test
    _launch(Config({"BATCH_SIZE": 16, "fp16": dict(mode=AMP_TYPE.TORCH)}))
    assert gpc.config.BATCH_SIZE == 16 and gpc.config.amp == "fp16"
    assert gpc.get_global_rank() == 0
    assert [gpc.get_world_size(m) for m in (ParallelMode.GLOBAL, ParallelMode.DATA, "tensor")] == [1, 1, 1]
    assert gpc.get_local_rank(ParallelMode.DATA) == 0 and gpc.is_last_rank(ParallelMode.PIPELINE)
    assert gpc.is_initialized(ParallelMode.DATA) and not gpc.is_initialized(ParallelMode.SEQUENCE)
    assert gpc.data_parallel_size == gpc.tensor_parallel_size == gpc.pipeline_parallel_size == 1
    with pytest.raises(ContextError, match=r"ParallelMode\.PARALLEL_2D_ROW is not initialised"):
        gpc.get_local_rank(ParallelMode.PARALLEL_2D_ROW)
    with pytest.raises(ConfigError, match="parallel_mode must be one of"):
        gpc.get_world_size("everything")


def test_get_dataloader_takes_colossals_positional_order_and_add_sampler_false_is_kept() -> None:
    from ember.compat.colossalai.utils import get_dataloader

    ds = tiny_dataset(10)
    sharded = get_dataloader(ds, True, 7, True, batch_size=4)  # dataset, shuffle, seed, add_sampler
    assert sharded.sampler.shuffle and sharded.sampler.seed == 7 and sharded.batch_size == 4
    whole = get_dataloader(ds, add_sampler=False, batch_size=4)
    model = tiny_mlp()
    _, _, test_dl, _ = ember.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), None, whole, whole)
    assert test_dl is whole and is_kept_unsharded(test_dl)


def test_initialize_returns_the_four_tuple_and_refuses_op_hooks() -> None:
    import ember.compat.colossalai as colossalai
    from ember.compat.colossalai.nn.lr_scheduler import CosineAnnealingLR

    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = CosineAnnealingLR(opt, total_steps=3)
    engine, train_dl, test_dl, lr = colossalai.initialize(model, opt, nn.CrossEntropyLoss(), lr_scheduler=sched,
                                                          verbose=False)  # fmt: skip
    assert isinstance(engine, ember.Engine) and train_dl is None and test_dl is None and lr is sched
    with pytest.raises(EngineError, match="ophooks"):
        colossalai.initialize(model, opt, ophooks=[object()])
    args = colossalai.get_default_parser().parse_args(["--config", "c.py", "--rank", "1"])
    assert (args.config, args.rank, args.backend) == ("c.py", 1, "nccl")


# -- trainer and hooks ----------------------------------------------------------------------------
def _engine() -> Any:
    model = tiny_mlp()
    return ember.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss())[0]


def test_builtin_hooks_have_colossals_signatures_and_default_priorities(tmp_path: Path) -> None:
    from ember.compat.colossalai.nn.metric import Accuracy
    from ember.compat.colossalai.trainer import hooks

    opt = torch.optim.SGD(tiny_mlp().parameters(), lr=0.1)
    logger = ember.get_dist_logger()
    built = {
        hooks.LossHook(): 0,
        hooks.AccuracyHook(Accuracy()): 0,
        hooks.LRSchedulerHook(torch.optim.lr_scheduler.StepLR(opt, 1), True): 1,
        hooks.LogMetricByEpochHook(logger): 10,
        hooks.LogMetricByStepHook(): 10,
        hooks.LogMemoryByEpochHook(logger, 2): 10,
        hooks.LogTimingByEpochHook(None, logger): 10,
        hooks.ThroughputHook(): 10,
        hooks.SaveCheckpointHook(1, tmp_path): 100,  # ember's checkpoint runs last
    }
    for hook, priority in built.items():
        assert hook.priority == priority, hook
        assert isinstance(hook, hooks.BaseHook) and isinstance(hook, ember.hooks.BaseHook)
    with pytest.raises(HookError, match="checkpoint_dir"):
        hooks.SaveCheckpointHook()
    with pytest.raises(HookError, match="record_metric"):
        hooks.MetricHook(1)
    with pytest.raises(HookError, match="tflop_per_step"):
        hooks.ThroughputHook(tflop_per_step=5)


def test_a_custom_hook_gets_its_priority_without_super_init_and_mixes_with_native_hooks() -> None:
    from ember.compat.colossalai.trainer import Trainer, hooks

    calls: list[str] = []

    class LogMessageHook(hooks.BaseHook):
        def __init__(self, priority=10):  # never calls super().__init__
            self.tag = "m"

        def before_train(self, trainer):
            calls.append(f"{self.tag} before_train epoch={trainer.cur_epoch}")

        def after_train_iter(self, trainer, output, label, loss):
            if trainer.cur_step == 1:
                calls.append(f"{self.tag} after_train_iter {tuple(output.shape)}")

    class Native(ember.hooks.BaseHook):  # ember's form, no trainer argument
        def before_train(self) -> None:
            calls.append("native before_train")

    first, later = LogMessageHook(priority=5), LogMessageHook()
    later.tag = "l"
    assert (first.priority, later.priority) == (5, 10)
    trainer = Trainer(_engine())
    trainer.fit(ember.get_dataloader(tiny_dataset(16), batch_size=8), epochs=1, hooks=[later, Native(), first])
    assert calls == ["m before_train epoch=0", "l before_train epoch=0", "native before_train",
                     "m after_train_iter (8, 4)", "l after_train_iter (8, 4)"]  # fmt: skip
    assert isinstance(trainer, ember.Trainer) and trainer.steps_per_epoch == 2 and trainer.states == {}


def test_trainer_takes_colossals_constructor_and_refuses_a_logger_in_the_timer_slot() -> None:
    from ember.compat.colossalai.trainer import Trainer

    logger = ember.get_dist_logger()
    engine = _engine()
    assert Trainer(engine, None, logger).logger is logger
    with pytest.raises(TrainerError, match=r"pass logger=\.\.\."):
        Trainer(engine, logger)
    with pytest.raises(TrainerError, match=r"takes a colossalai\.utils\.MultiTimer, got str"):
        Trainer(engine=engine, logger=logger, timer="t")


def test_the_trainers_timer_times_epochs_and_steps_through_multitimer() -> None:
    from ember.compat.colossalai.trainer import Trainer, hooks
    from ember.compat.colossalai.utils import MultiTimer, Timer

    timer = MultiTimer()
    trainer = Trainer(engine=_engine(), timer=timer)
    train_dl = ember.get_dataloader(tiny_dataset(24, seed=3), batch_size=8)
    trainer.fit(train_dl, epochs=2, test_dataloader=ember.get_dataloader(tiny_dataset(8, seed=4), batch_size=4),
                hooks=[hooks.LossHook()])  # fmt: skip
    steps, epochs = timer.get_timer("Train-step"), timer.get_timer("Train-epoch")
    mean, total = steps.get_history_mean(), steps.get_history_sum()
    assert mean > 0 and total == pytest.approx(6 * mean) and total < epochs.get_history_sum()  # 6 steps, 2 epochs
    test_steps = timer.get_timer("Test-step")
    assert test_steps.get_history_sum() == pytest.approx(4 * test_steps.get_history_mean())  # 2 test passes of 2
    assert {name for name, _ in timer} == {"Train-epoch", "Train-step", "Test-epoch", "Test-step"}
    timer.reset()
    assert not steps.has_history
    with pytest.raises(TrainerError, match="no timer 'nope'"):
        timer.get_timer("nope")
    one = Timer()
    one.start()
    assert one.stop(keep_in_history=True) >= 0 and one.has_history
    with pytest.raises(TrainerError, match=r"stop\(\) without start\(\)"):
        one.stop()


def test_accuracy_counts_correct_predictions_like_ember_default() -> None:
    from ember.compat.colossalai.nn.metric import Accuracy
    from ember.compat.colossalai.trainer import Trainer, hooks

    logits, labels = torch.tensor([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]]), torch.tensor([1, 1, 1])
    assert int(Accuracy()(logits, labels)) == 2
    trainer = Trainer(_engine())
    test_dl = ember.get_dataloader(tiny_dataset(20, seed=5), batch_size=6)
    ours = trainer.evaluate(test_dl, hooks=[hooks.AccuracyHook(accuracy_func=Accuracy())])
    native = trainer.evaluate(test_dl, [ember.hooks.AccuracyHook()], False, False)  # Colossal's positional form
    assert ours == native and 0.0 <= ours["test/accuracy"] <= 1.0


# -- LR schedulers --------------------------------------------------------------------------------
def _opt() -> torch.optim.Optimizer:
    a, b = nn.Parameter(torch.zeros(1)), nn.Parameter(torch.zeros(1))
    return torch.optim.SGD([{"params": [a]}, {"params": [b], "lr": 0.05}], lr=0.1, momentum=0.9)


def _cos(base: float, lo: float, t: int, span: int) -> float:
    return lo + (base - lo) * (1 + math.cos(math.pi * t / span)) / 2


def _warm(w: int, after: Callable[[float, int], float]) -> Callable[[float, int], float]:
    return lambda b, t: b * (t + 1) / w if t < w else after(b, t - w)


def _poly(b: float, t: int, span: int, end: float = 1e-4, power: float = 2.0) -> float:
    return (b - end) * (1 - min(t, span) / span) ** power + end


SCHEDULES: dict[str, tuple[dict[str, Any], Callable[[float, int], float]]] = {
    "CosineAnnealingLR": ({"total_steps": 10, "eta_min": 0.001}, lambda b, t: _cos(b, 0.001, t, 10)),
    "CosineAnnealingWarmupLR": ({"total_steps": 20, "warmup_steps": 5, "eta_min": 0.001},
                                _warm(5, lambda b, t: _cos(b, 0.001, t, 15))),
    "FlatAnnealingLR": ({"total_steps": 20, "pct_start": 0.5}, lambda b, t: b if t <= 10 else _cos(b, 0, t - 10, 10)),
    "FlatAnnealingWarmupLR": ({"total_steps": 24, "warmup_steps": 4, "pct_start": 0.5, "eta_min": 0.001},
                              _warm(4, lambda b, t: b if t <= 10 else _cos(b, 0.001, t - 10, 10))),
    "LinearWarmupLR": ({"total_steps": 20, "warmup_steps": 5},
                       lambda b, t: b * (t + 1) / 6 if t < 5 else b * max(0, 20 - t) / 15),
    "MultiStepLR": ({"total_steps": 20, "milestones": [3, 7, 7, 12], "gamma": 0.5},
                    lambda b, t: b * 0.5 ** sum(m <= t for m in (3, 7, 7, 12))),
    "MultiStepWarmupLR": ({"total_steps": 20, "warmup_steps": 4, "milestones": [2, 4, 9], "gamma": 0.5},
                          _warm(4, lambda b, t: b * 0.5 ** sum(4 <= m <= t + 4 for m in (2, 4, 9)))),
    "PolynomialLR": ({"total_steps": 15, "power": 2.0}, lambda b, t: _poly(b, t, 15)),
    "PolynomialWarmupLR": ({"total_steps": 20, "warmup_steps": 5, "power": 2.0},
                           _warm(5, lambda b, t: _poly(b, t, 15))),
    "StepLR": ({"total_steps": 20, "step_size": 3, "gamma": 0.5}, lambda b, t: b * 0.5 ** (t // 3)),
    "ExponentialLR": ({"total_steps": 20, "gamma": 0.9}, lambda b, t: b * 0.9**t),
    "LambdaLR": ({"total_steps": 20, "lr_lambda": lambda s: 1 / (s + 1)}, lambda b, t: b / (t + 1)),
    "MultiplicativeLR": ({"total_steps": 20, "lr_lambda": lambda s: 0.9}, lambda b, t: b * 0.9**t),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_scheduler_follows_its_formula_and_its_state_dict_round_trips_exactly(name: str) -> None:
    from ember.compat.colossalai.nn import lr_scheduler

    kwargs, formula = SCHEDULES[name]
    opt = _opt()
    sched = getattr(lr_scheduler, name)(opt, **kwargs)
    assert isinstance(sched, torch.optim.lr_scheduler.LRScheduler)
    for t in range(26):
        assert [g["lr"] for g in opt.param_groups] == pytest.approx([formula(0.1, t), formula(0.05, t)], abs=1e-12)
        if t == 7:
            saved = sched.state_dict()
            resumed_opt = _opt()
            resumed_opt.load_state_dict(opt.state_dict())
            resumed = getattr(lr_scheduler, name)(resumed_opt, **kwargs)
            resumed.load_state_dict(saved)
        opt.step()
        sched.step()
        if t >= 7:
            resumed_opt.step()
            resumed.step()
            assert [g["lr"] for g in resumed_opt.param_groups] == [g["lr"] for g in opt.param_groups]


def test_a_linear_warmup_longer_than_the_run_is_colossals_ramp_then_zero() -> None:
    from ember.compat.colossalai.nn.lr_scheduler import LinearWarmupLR

    opt = _opt()  # ColossalAI-Examples' ViT: 50 warmup steps, 2 epochs
    sched = LinearWarmupLR(opt, warmup_steps=50, total_steps=2)
    rates = []
    for _ in range(4):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert rates == pytest.approx([0.1 / 51, 0.2 / 51, 0.0, 0.0], abs=1e-15)


def test_one_cycle_takes_each_groups_rate_as_its_peak() -> None:
    from ember.compat.colossalai.nn.lr_scheduler import OneCycleLR

    opt = _opt()
    sched = OneCycleLR(opt, total_steps=10, pct_start=0.3)
    peaks = [[g["lr"] for g in opt.param_groups]]
    for _ in range(9):
        opt.step()
        sched.step()
        peaks.append([g["lr"] for g in opt.param_groups])
    assert max(p[0] for p in peaks) == pytest.approx(0.1) and max(p[1] for p in peaks) == pytest.approx(0.05)
    assert peaks[0] == pytest.approx([0.1 / 25, 0.05 / 25])


@pytest.mark.parametrize(
    ("build", "culprit"),
    [
        (lambda o, s: s.CosineAnnealingLR(o, 10, warmup_steps=3), "CosineAnnealingWarmupLR"),
        (lambda o, s: s.CosineAnnealingLR(o, 10, T_max=3), "T_max"),
        (lambda o, s: s.CosineAnnealingWarmupLR(o, 10, warmup_steps=10), "less than total_steps"),
        (lambda o, s: s.MultiStepLR(o, 10), "milestones"),
        (lambda o, s: s.LambdaLR(o, 10), "lr_lambda"),
        (lambda o, s: s.OneCycleLR(o, 10, epochs=2), "epochs"),
        (lambda o, s: s.PolynomialLR(o, 0), "total_steps"),
    ],
)
def test_bad_scheduler_arguments_are_engine_errors_naming_them(build: Callable[..., Any], culprit: str) -> None:
    from ember.compat.colossalai.nn import lr_scheduler

    with pytest.raises(EngineError, match=culprit):
        build(_opt(), lr_scheduler)


# -- issue 29: the names ColossalAI-Examples import ---------------------------------------------------


def test_fused_optimizers_are_torchs_and_refuse_what_torch_cannot_do() -> None:
    from ember.compat.colossalai.nn import FusedAdam, FusedSGD, Lamb
    from ember.compat.colossalai.nn.optimizer import FusedLAMB

    def run(make: Callable[[Any], torch.optim.Optimizer]) -> list[torch.Tensor]:
        model = tiny_mlp(seed=2)
        opt = make(model.parameters())
        for step in range(3):
            opt.zero_grad()
            model(torch.randn(4, 8, generator=torch.Generator().manual_seed(step))).square().mean().backward()
            opt.step()
        return [p.detach().clone() for p in model.parameters()]

    same = [(lambda p: FusedAdam(p, lr=0.01, weight_decay=0.1),
             lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1)),
            (lambda p: FusedAdam(p, lr=0.01, adam_w_mode=False), lambda p: torch.optim.Adam(p, lr=0.01)),
            (lambda p: FusedSGD(p, lr=0.1, momentum=0.9, nesterov=True),
             lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True))]  # fmt: skip
    for ours, torchs in same:
        assert all(torch.equal(a, b) for a, b in zip(run(ours), run(torchs), strict=True))
    with pytest.raises(ConfigError, match="bias_correction=False"):
        FusedAdam(tiny_mlp().parameters(), bias_correction=False)
    with pytest.raises(ConfigError, match="wd_after_momentum=True"):
        FusedSGD(tiny_mlp().parameters(), wd_after_momentum=True)
    with pytest.raises(ConfigError, match="FusedSGD: Invalid learning rate"):
        FusedSGD(tiny_mlp().parameters(), lr=-1.0)
    with pytest.raises(ConfigError, match="FusedAdam needs the model's parameters"):
        FusedAdam(5)  # type: ignore[arg-type]
    # LAMB by hand for one tensor: no bias correction, trust ratio min(||p||, 10) / ||step||
    p = torch.nn.Parameter(torch.tensor([3.0, -4.0]))
    p.grad = torch.tensor([0.5, 1.0])
    Lamb([p], lr=0.1, weight_decay=0.01).step()
    m, v = 0.1 * torch.tensor([0.5, 1.0]), 0.001 * torch.tensor([0.25, 1.0])
    step = m / (v.sqrt() + 1e-6) + 0.01 * torch.tensor([3.0, -4.0])
    expected = torch.tensor([3.0, -4.0]) - 0.1 * (5.0 / step.norm()) * step
    assert torch.allclose(p.detach(), expected, atol=1e-6) and FusedLAMB is Lamb


def test_log_to_file_takes_colossals_folder_as_well_as_a_file(tmp_path: Path) -> None:
    from ember.compat.colossalai.logging import get_dist_logger

    logger = get_dist_logger()
    (tmp_path / "logs").mkdir()  # image/moe: os.mkdir(log_path); logger.log_to_file(log_path)
    logger.log_to_file(tmp_path / "logs")
    logger.log_to_file(tmp_path / "logs", suffix="train", level="WARNING")
    logger.log_to_file(tmp_path / "one.log", mode="w")
    level = logger.logger.level
    logger.logger.setLevel(logging.INFO)
    try:
        logger.info("an info line", ranks=[0])
        logger.warning("a warning line")
    finally:
        logger.logger.setLevel(level)
        for handler in [h for h in logger.logger.handlers if isinstance(h, logging.FileHandler)]:
            logger.logger.removeHandler(handler)
            handler.close()
    for name, lines in {"logs/rank_0.log": 2, "logs/rank_0_train.log": 1, "one.log": 2}.items():
        text = (tmp_path / name).read_text()
        assert text.count("line") == lines and "a warning line" in text, (name, text)


def test_colossal_utils_logging_globals_and_destroy() -> None:
    from ember.compat.colossalai.core import global_context as gpc
    from ember.compat.colossalai.global_variables import tensor_parallel_env
    from ember.compat.colossalai.logging import disable_existing_loggers
    from ember.compat.colossalai.utils import print_rank_0

    lines: list[str] = []

    class Logger:
        def info(self, msg: str) -> None:
            lines.append(msg)

    print_rank_0("hello", logger=Logger())
    assert lines == ["hello"]
    noisy, ours = logging.getLogger("some.library"), logging.getLogger("ember.compat.test")
    noisy.setLevel(logging.INFO)
    ours.setLevel(logging.INFO)
    disable_existing_loggers()
    assert noisy.level == logging.ERROR and ours.level == logging.INFO
    assert tensor_parallel_env.mode is None and tensor_parallel_env.save()["vocab_parallel"] is False
    with pytest.raises(ConfigError, match=r"tensor_parallel_env\.load got"):
        tensor_parallel_env.load(modee="1d")
    from ember.compat.colossalai.utils import is_using_pp

    assert not is_using_pp()
    ember.launch(config={}, rank=0, world_size=1, host="127.0.0.1", port=0, verbose=False)
    assert ember.context.is_launched() and not is_using_pp() and tensor_parallel_env.mode is None
    tensor_parallel_env.load(mode="1d")  # a setting given overrides the launched config's until forgotten
    assert tensor_parallel_env.mode == "1d"
    tensor_parallel_env.load_from_config()
    assert tensor_parallel_env.mode is None
    gpc.destroy()
    assert not ember.context.is_launched()


def test_engine_schedules_are_embers_with_colossals_arguments() -> None:
    from ember.compat.colossalai.engine import Engine
    from ember.compat.colossalai.engine.schedule import (
        InterleavedPipelineSchedule,
        NonPipelineSchedule,
        PipelineSchedule,
    )
    from ember.compat.colossalai.trainer import Trainer, hooks

    engine = _engine()
    assert isinstance(engine, Engine)
    seen: list[int] = []

    def unpack(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        seen.append(len(batch["y"]))
        return batch["x"], batch["y"]

    x, y = tiny_dataset(16, seed=2).tensors
    batches = [{"x": x[i : i + 8], "y": y[i : i + 8]} for i in (0, 8)]
    trainer = Trainer(engine, schedule=NonPipelineSchedule(data_process_func=unpack))
    trainer.fit(batches, epochs=1, hooks=[hooks.LossHook()])
    assert seen == [8, 8] and trainer.cur_step == 2
    output, label, loss = NonPipelineSchedule(unpack).forward_backward_step(engine, iter(batches), forward_only=True)
    assert output.shape[0] == 8 and torch.equal(label, batches[0]["y"]) and loss.dim() == 0
    with pytest.raises(ConfigError, match="the Engine runs no pipeline"):
        Trainer(engine, schedule=PipelineSchedule(num_microbatches=2)).fit(batches, epochs=1)
    with pytest.raises(ConfigError, match="num_model_chunks=2"):
        InterleavedPipelineSchedule(num_microbatches=4, num_model_chunks=2)


def test_names_ember_leaves_out_say_the_ember_way() -> None:
    from ember.compat._not_provided import NotProvidedError

    cases = [
        ("ember.compat.colossalai.utils", "checkpointing", "ember's checkpoints"),
        ("ember.compat.colossalai.nn.optimizer", "CPUAdam", "FusedAdam"),
        ("ember.compat.colossalai.engine", "ophooks", "no op hooks"),
        ("ember.compat.pytorch_accelerated.callbacks", "ModelEmaCallback", "EMAHook"),
        ("ember.compat.pytorch_accelerated.utils", "ModelEma", "EMAHook"),
        ("ember.compat.pytorch_accelerated", "notebook_launcher", "ember run --nproc N"),
        ("ember.compat.detectron2.engine", "DefaultTrainer", "SimpleTrainer"),
        ("ember.compat.detectron2.engine", "AMPTrainer", "amp='fp16'"),
    ]
    for module, name, advice in cases:
        with pytest.raises(NotProvidedError, match=advice):
            exec(f"from {module} import {name}", {})
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        exec("from ember.compat.colossalai import utils; utils.no_such_name", {})

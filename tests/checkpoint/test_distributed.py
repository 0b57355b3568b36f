"""Checkpoints with 2 gloo processes: kill/preempt-and-resume, mid-cycle saves, 2 -> 1 and 1 -> 2 processes.

One torchrun (see ``scripts/dist.py``), restarted by torchrun three times, runs three jobs one
after the other: the uninterrupted reference (which also continues a one-process checkpoint on
two processes and checks a functional mid-cycle save); a job restarted twice: killed while
writing a checkpoint, then preempted by SIGTERM to one rank; and a job restarted once after one
rank is SIGKILLed mid-epoch, mid-cycle. The launch's output is split where the third job starts,
so each job's checks read only what was logged about it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from ember import checkpoint
from ember.trainer import PREEMPTED_EXIT_CODE, hooks
from tests.checkpoint import common
from tests.checkpoint.common import epoch_order, params, read_result
from tests.dist import torchrun
from tests.models import tiny_dataset

pytestmark = pytest.mark.multiprocess

SCRIPT = Path(__file__).parent / "scripts" / "dist.py"
MID_CYCLE_STARTS = "=== the chain has finished: the mid-cycle job starts"  # scripts/dist.py
RESTARTS = {"EMBER_RESUME": "auto", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
ONE_PROC_CKPT = "ckpt-e0000-s000000006.ckpt"  # 1 process, batch 4: 12 of 18 batches into epoch 0


@pytest.fixture(scope="module")
def launch(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """The launch's folder, and its output before and after the mid-cycle job started."""
    out = tmp_path_factory.mktemp("dist")
    common.run(out / "one", bs=4)  # the one-process checkpoints that two processes continue
    # --standalone (a c10d rendezvous) as `ember run` uses: restarts under the static one can hang
    run = torchrun(SCRIPT, nproc=2, args=[str(out), str(out / "one" / ONE_PROC_CKPT)], env=RESTARTS, timeout=480,
                   torchrun_args=("--standalone", "--max-restarts=3"))  # fmt: skip
    before, marker, after = run.stderr.partition(MID_CYCLE_STARTS)
    assert marker, "the mid-cycle job never started\n" + run.stderr[-6000:]
    return out, before, after  # ember and torchrun log to stderr


@pytest.fixture(scope="module")
def reference(launch: tuple[Path, str, str]) -> Path:
    return launch[0] / "reference"


@pytest.fixture(scope="module")
def chain(launch: tuple[Path, str, str]) -> tuple[Path, str]:
    return launch[0] / "chain", launch[1]


@pytest.fixture(scope="module")
def killed_mid_cycle(launch: tuple[Path, str, str]) -> tuple[Path, str]:
    return launch[0] / "mid-cycle", launch[2]


def attempt(out: Path, a: int, rank: int) -> dict[str, Any]:
    return json.loads((out / f"attempt{a}-rank{rank}.json").read_text())


def assert_like_reference(reference: Path, out: Path) -> None:
    for rank in (0, 1):
        ref_params, ref = read_result(reference / "ref", rank)
        got_params, got = read_result(out, rank)
        assert all(torch.equal(a, b) for a, b in zip(got_params, ref_params, strict=True)), f"rank {rank}"
        assert got["losses"] == {b: ref["losses"][b] for b in got["losses"]}
        assert sorted(got["losses"]) == list(range(got["resumed_at"] + 1, 28))
        assert got["history"] == ref["history"] and got["counters"] == ref["counters"]


def test_two_ranks_killed_while_writing_a_checkpoint_resume_bit_identically(
    reference: Path, chain: tuple[Path, str]
) -> None:
    out, log = chain
    assert attempt(out, 0, 1)["finished"] is False and not (out / "attempt0-rank0.json").exists()  # SIGKILLed
    # rank 0 died before renaming update 8's checkpoint: attempt 1 resumed from update 6's
    assert "resumed from" in log and "ckpt-e0001-s000000006.ckpt': epoch 1, 2 batches into it" in log
    assert_like_reference(reference, out / "res")


def test_a_rank_sigkilled_mid_epoch_and_mid_cycle_resumes_with_auto_bit_identically(
    reference: Path, killed_mid_cycle: tuple[Path, str]
) -> None:
    out, log = killed_mid_cycle
    assert not (out / "attempt0-rank1.json").exists(), "rank 1 of attempt 0 was not killed"
    assert "exitcode: -9" in log or "SIGKILL" in log, log[-3000:]
    # rank 0 failed in its next collective, or torchrun stopped it first: it never finished
    assert not (out / "attempt0-rank0.json").exists() or attempt(out, 0, 0)["finished"] is False
    # killed after batch 16, half-way through update 9's cycle (and epoch 1): the newest complete
    # checkpoint is update 8's, 6 batches into epoch 1; the partial gradients of batch 16 are lost
    assert "ckpt-e0001-s000000008.ckpt': epoch 1, 6 batches into it" in log
    assert [attempt(out, 1, r) for r in (0, 1)] == [{"finished": True, "resumed_at": 15}] * 2
    assert_like_reference(reference, out / "res")  # params, post-resume losses, history, counters


def test_sigterm_to_one_rank_of_two_saves_on_both_and_both_exit_with_the_preemption_code(
    reference: Path, chain: tuple[Path, str]
) -> None:
    out, _ = chain
    ended = [attempt(out, 1, r) for r in (0, 1)]
    assert [e["exit"] for e in ended] == [PREEMPTED_EXIT_CODE] * 2
    assert all(e["reason"] == "preempted: rank 1 received SIGTERM" for e in ended)
    # SIGTERM at batch 23; batch 24 closes update 13, where the ranks start agreeing on it; they
    # learn the answer at the next update's end (batch 26, update 14) and save there.
    assert ended[0]["path"] == str(out / "ckpt" / "ckpt-e0002-s000000014.ckpt")
    assert read_result(out / "res")[1]["resumed_at"] == 26  # the last attempt continued from it
    assert_like_reference(reference, out / "res")


def test_a_save_mid_cycle_keeps_each_ranks_partial_gradients(reference: Path) -> None:
    meta = json.loads((reference / "functional" / "meta.json").read_text())
    assert meta["accumulation_micro_step"] == 1
    assert_like_reference(reference, reference / "functional")


def test_a_one_process_checkpoint_continues_on_two_from_the_same_sample(reference: Path) -> None:
    ranks = [json.loads((reference / f"from-one-rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["saved_epoch_iter"] == 12 and ranks[0]["epoch"] == 0
    seen = ranks[0]["seen"] + ranks[1]["seen"]
    assert sorted(seen) == sorted(epoch_order(0)[48:])  # 12 batches of 4 were consumed: the rest, once
    assert ranks[0]["counters"] == ranks[1]["counters"] == [3, 18]  # 2 updates left in epoch 0, then 5 + 5


def test_a_two_process_checkpoint_loads_into_one_process_and_continues(reference: Path, tmp_path: Path) -> None:
    path = reference / "ref" / "ckpt" / "ckpt-e0001-s000000006.ckpt"  # 2 batches of 4 per rank into epoch 1
    saved = checkpoint.read(path)
    assert saved["meta"]["world_size"] == 2
    trainer, train, test = common.build(bs=8)
    checkpoint.load(path, trainer)
    assert all(torch.equal(p, saved["engine"]["model"][k]) for k, p in trainer.engine.model.state_dict().items())
    assert (trainer.cur_epoch, trainer.epoch_iter, trainer.cur_step) == (1, 2, 6)  # 16 samples = 2 batches of 8

    seen: list[int] = []
    rows = {tuple(r.tolist()): i for i, r in enumerate(tiny_dataset(common.N, 1).tensors[0])}

    def record(module: Any, args: Any) -> None:
        if module.training and trainer.cur_epoch == 1:
            seen.extend(rows[tuple(r.tolist())] for r in args[0])

    trainer.engine.model.register_forward_pre_hook(record)
    ckpt = hooks.CheckpointHook(tmp_path, every_n_epochs=None, save_last=False)
    trainer.fit(train, epochs=3, test_dataloader=test, hooks=common.hook_list(trainer, ckpt))
    assert seen == epoch_order(1)[16:]
    assert (trainer.cur_epoch, trainer.cur_step) == (3, 15)
    assert len(trainer.history.values("train/loss")) == 3
    assert all(torch.isfinite(p).all() for p in params(trainer))

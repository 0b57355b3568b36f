"""The benchmark harness at tiny sizes, one round, without the peers: it runs and reports.

Nothing here is timed against a limit (timed assertions do not belong in the test suite); the
tests prove the harness still measures ember and the hand loop, checks the work they did,
flags a contender that did different work, and writes its results files.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from benchmarks.__main__ import main
from benchmarks.harness import Contender, Group, Outcome, Timer, run_group


def test_quick_run_of_the_cpu_cases_measures_ember_and_the_hand_loop(tmp_path: Path) -> None:
    main(["step", "tracking", "checkpoint", "cuda", "--quick", "--rounds", "1", "--inline", "--no-peers",
          "--out", str(tmp_path)])  # fmt: skip
    [json_path] = tmp_path.glob("*-quick.json")
    record = json.loads(json_path.read_text())
    assert json_path.with_suffix(".md").read_text().startswith("### ember benchmarks")
    for name in ("step", "tracking", "checkpoint"):
        for group in record["cases"][name]["groups"]:
            for c in group["contenders"]:
                assert c["status"] == "ok", (name, group["name"], c["name"], c["note"])
                assert c["summary"]["cpu_s"]["median"] > 0
                assert c["summary"]["ratio_cpu"] > 0
    cuda = [c["status"] for g in record["cases"]["cuda"]["groups"] for c in g["contenders"]]
    assert set(cuda) <= {"ok", "skipped"}
    assert {t["target"] for t in record["targets"]} >= {"Run.log values/s enqueued"}


def same_work(params: Mapping[str, Any], timer: Timer) -> Outcome:
    with timer:
        pass
    return Outcome(work=1.0)


def other_work(params: Mapping[str, Any], timer: Timer) -> Outcome:
    with timer:
        pass
    return Outcome(work=1.5)


def test_a_contender_that_did_different_work_is_flagged_and_a_missing_peer_is_not_installed() -> None:
    group = Group(
        "flags",
        (
            Contender("base", f"{__name__}:same_work"),
            Contender("cheat", f"{__name__}:other_work"),
            Contender("peer", f"{__name__}:same_work", needs=("no_such_peer_library_xyz",)),
        ),
        "base",
        {},
    )
    result = {c.name: c for c in run_group(group, rounds=1, isolate=False, log=lambda _: None).contenders}
    assert result["base"].status == "ok"
    assert result["cheat"].status == "different work"
    assert result["peer"].status == "not installed"


def test_instruction_counts_run_each_contender_and_difference_two_sizes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """benchmarks.instructions with a stand-in valgrind: the real workers run, the counts are fake."""
    from benchmarks import instructions

    fake = tmp_path / "bin" / "valgrind"
    fake.parent.mkdir()
    # Runs the command after valgrind's options, then reports 1,000 instructions a batch for the
    # hand loop and 1,010 for the others, on top of a fixed start-up cost.
    fake.write_text(
        "#!/bin/sh\n"
        'while [ "${1#--}" != "$1" ]; do shift; done\n'  # drop valgrind's options
        '"$@" || exit $?\n'  # python -m benchmarks.instructions --worker TARGET BATCHES PARAMS
        'per=1010; case "$5" in *hand_loop) per=1000;; esac\n'
        'echo "==1== Collected : $((5000000 + $6 * per))" >&2\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    two = [c for c in instructions.contenders(with_peers=False) if c.name in ("hand loop", "ember Trainer, no hooks")]
    monkeypatch.setattr(instructions, "contenders", lambda with_peers: two)  # 4 runs instead of 10
    assert instructions.main(["--small", "1", "--large", "3", "--jobs", "2", "--out", str(tmp_path)]) == 0
    [json_path] = tmp_path.glob("*-instructions.json")
    rows = {r["contender"]: r for r in json.loads(json_path.read_text())["rows"]}
    assert rows["hand loop"]["instructions_per_step"] == 1000 and rows["hand loop"]["ratio"] == 1.0
    assert rows["ember Trainer, no hooks"]["instructions_per_step"] == 1010
    assert "| ember Trainer, no hooks | 1,010 | 1.0100x | +10 |" in json_path.with_suffix(".md").read_text()


def test_in_process_overhead_runs_every_contender_interleaved_and_checks_the_work(tmp_path: Path) -> None:
    """benchmarks.overhead at a tiny size: every contender trains, ends equal, and is reported."""
    from benchmarks import overhead

    threads = torch.get_num_threads()
    args = ["--model", "linear", "--rounds", "2", "--batches", "3", "--epochs", "2", "--short", "1"]
    args += ["--out", str(tmp_path)]
    assert overhead.main(args) == 0
    assert torch.get_num_threads() == threads  # the one-thread setting does not leak into the caller
    [json_path] = tmp_path.glob("*-overhead-linear.json")
    record = json.loads(json_path.read_text())
    assert record["steps_per_run"] == 6
    rows = {r["contender"]: r for r in record["rows"]}
    assert list(rows) == list(overhead.CONTENDERS)
    assert all(len(r["cpu_s"]) == 2 and all(t > 0 for t in r["cpu_s"]) for r in rows.values())
    assert rows["hand loop"]["paired_ratio"] == 1.0 and rows["hand loop"]["overhead_us_per_step"] == 0.0
    assert rows["hand loop"]["marginal_overhead_us"] == 0.0 and record["short_batches"] == 1
    assert all(len(r["cpu_s_short"]) == 2 and "fixed_ms_per_run" in r for r in rows.values())
    text = json_path.with_suffix(".md").read_text()
    assert text.count("| ember Trainer, default hooks |") == 2  # the run table and the marginal one


def test_in_process_overhead_parts_add_the_default_hooks_one_part_at_a_time(tmp_path: Path) -> None:
    from benchmarks import overhead

    args = ["--model", "linear", "--rounds", "1", "--batches", "2", "--epochs", "1", "--parts", "--out", str(tmp_path)]
    assert overhead.main(args) == 0
    [json_path] = tmp_path.glob("*-overhead-linear-parts.json")
    rows = json.loads(json_path.read_text())["rows"]
    assert [r["contender"] for r in rows] == list(overhead.PARTS)


def test_in_process_overhead_refuses_contenders_that_did_different_work(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import overhead

    real_build = overhead.build

    def build(name: str, params: dict[str, object]) -> object:
        run, w = real_build(name, {**params, "seed": 1} if name == "ember Engine loop" else params)
        return run, w

    monkeypatch.setattr(overhead, "build", build)
    params = {"model": "linear", "batch_size": 64, "batches": 2, "epochs": 1, "seed": 0}
    with pytest.raises(RuntimeError, match="different work"):
        overhead.measure(params, rounds=1, log=lambda _: None)


def test_the_store_and_checkpoint_size_benchmarks_run_at_tiny_sizes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    from benchmarks import checkpoint_sizes, store_scale

    monkeypatch.setattr(sys, "argv", ["store_scale", "lookups", "--sizes", "12", "--repeat", "1"])
    assert store_scale.main() == 0
    assert "compare 10 names" in capsys.readouterr().out
    # ember's save and the baseline (the other two contenders are the same code with a flag): a process each
    savers = ["torch.save", "ember"]
    argv = ["checkpoint_sizes", "--sizes", "0.5", "--rounds", "1", "--saves", "2", "--savers", *savers]
    monkeypatch.setattr(sys, "argv", argv)
    assert checkpoint_sizes.main() == 0
    rows = re.findall(r"^ *\d+MB  (.+?) +[\d.]+ +[\d.]+ +[\d,]+$", capsys.readouterr().out, re.MULTILINE)
    assert sorted(rows) == sorted(savers)


def test_the_console_scale_benchmark_runs_at_a_tiny_size(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    from benchmarks import console_scale

    monkeypatch.setattr(sys, "argv", ["console_scale", "--sizes", "60", "--repeat", "1", "--idle-seconds", "0.5"])
    assert console_scale.main() == 0
    # the table rows (a progress line, "60  listed and counted at ...", starts with the size too)
    lines = [line for line in capsys.readouterr().out.splitlines() if "listed and counted" not in line]
    ui_row = next(line for line in lines if line.split()[:1] == ["60"])
    assert "nan" not in ui_row  # the first page held the 50 newest runs, and every run was indexed
    folder_row = next(line for line in lines[lines.index(ui_row) + 1 :] if line.split()[:1] == ["60"])
    assert folder_row.split()[3] == "60" and folder_row.split()[5] == "1"  # one page

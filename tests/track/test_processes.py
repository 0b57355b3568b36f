"""Tracking across processes: torchrun ranks, SIGKILL, exit without finish, concurrent writers."""

from __future__ import annotations

import hashlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ember import track
from ember.track import store as st
from ember.track._values import read_points
from tests.dist import ROOT, torchrun

pytestmark = pytest.mark.multiprocess
SCRIPTS = Path(__file__).parent / "scripts"


class Worker:
    """``scripts/worker.py`` in a subprocess, its stdout read line by line in a thread."""

    def __init__(self, mode: str, n: int, store: Path) -> None:
        env = {
            **os.environ,
            "EMBER_HOME": str(store),
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        self.proc = subprocess.Popen(
            [sys.executable, str(SCRIPTS / "worker.py"), mode, str(n)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_for(self, word: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while word not in self.seen:
            try:
                self.seen.append(self.lines.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                self.proc.kill()
                pytest.fail(f"worker never printed {word}; stderr:\n{self.proc.communicate()[1]}")

    @property
    def path(self) -> Path:
        self.wait_for("LOGGED")
        return Path(next(line for line in self.seen if line.startswith("PATH "))[5:])


def _assert_every_file_readable(run_path: Path) -> None:
    json.loads((run_path / "run.json").read_text())
    json.loads((run_path / "platform.json").read_text())
    for metrics in (run_path / "metrics").glob("*.jsonl"):
        read_points(metrics)
    (run_path / "stdout.log").read_text(encoding="utf-8")


def _steps(run_path: Path) -> list[int]:
    return [p["step"] for p in st.read_metrics(run_path, "train")]


def test_seed004_workflow_under_two_gloo_processes_leaves_one_run_with_rank0_metrics(
    store: Path, tmp_path: Path
) -> None:
    res = torchrun(
        SCRIPTS / "seed004_ddp.py",
        nproc=2,
        args=[str(tmp_path)],
        env={"EMBER_HOME": str(store)},
    ).results
    assert sorted(res) == [0, 1]
    assert res[1]["active"] is False and res[1]["path"] is None and res[1]["artifact"] is None
    assert res[0]["bad_metric_raised"] and res[1]["bad_metric_raised"]  # both ranks raise alike
    assert res[0]["exit_guard"] and res[1]["exit_guard"]  # tracking found the user's group
    runs = st.list_runs(store)
    assert len(runs) == 1 and str(runs[0].path) == res[0]["path"]
    info = runs[0]
    assert info.status == "Complete" and info.meta["pid"] == res[0]["pid"]
    assert info.meta["hparams"] == {"lr": 0.1, "batch_size": 8, "epochs": 2, "world_size": 2}
    for type_, expected in res[0]["logged"].items():
        stored = [[p["step"], *p["metrics"].values()] for p in st.read_metrics(info.path, type_)]
        assert stored == expected, type_
    assert len(list((store / "artifacts").iterdir())) == 1
    artifact = track.load_artifact(res[0]["artifact"])
    model_sha = hashlib.sha256((tmp_path / "model.pt").read_bytes()).hexdigest()
    assert [(f["path"], f["sha256"]) for f in artifact.files] == [("model.pt", model_sha)]
    edges = track.load_run(info.path).lineage()
    assert [(e["source"]["kind"], e["target"]["id"]) for e in edges] == [("run", artifact.id)]
    assert "rank 0 starts" in (info.path / "stdout.log").read_text()


def test_sigkill_after_a_two_second_pause_keeps_every_point_and_lists_as_crashed(store: Path) -> None:
    worker = Worker("kill", 2000, store)
    worker.wait_for("SLEPT")
    worker.proc.kill()
    worker.proc.wait()
    path = worker.path
    assert _steps(path) == list(range(2000))
    _assert_every_file_readable(path)
    assert st.run_info(path).status == "Crashed"
    assert "LOGGED" in (path / "stdout.log").read_text()

    resumed = track.load_run(path, resume=True)  # a crashed run can be continued
    assert resumed.last_step("train") == 1999
    resumed.log("train", {"loss": 0.0, "step_sq": 0}, step=2000)
    resumed.finish()
    assert _steps(path) == list(range(2001)) and st.run_info(path).status == "Complete"


def test_sigkill_right_after_logging_keeps_a_readable_prefix_of_the_points(store: Path) -> None:
    worker = Worker("killnow", 20000, store)
    path = worker.path
    worker.proc.kill()
    worker.proc.wait()
    steps = _steps(path)
    assert steps == list(range(len(steps)))  # whatever was flushed, in order, nothing torn
    _assert_every_file_readable(path)
    assert st.run_info(path).status == "Crashed"


def test_runs_left_open_are_finished_at_exit_with_the_status_of_how_the_program_ended(store: Path) -> None:
    workers = {mode: Worker(mode, 10, store) for mode in ("exit", "raise", "interrupt")}
    for worker in workers.values():
        worker.proc.wait(timeout=60)
    statuses = {mode: st.run_info(w.path).status for mode, w in workers.items()}
    assert statuses == {"exit": "Complete", "raise": "Failed", "interrupt": "Interrupted"}
    for worker in workers.values():
        assert _steps(worker.path) == list(range(10))
    assert "RuntimeError: the training script failed" in (workers["raise"].path / "stdout.log").read_text()


def test_two_processes_write_two_runs_while_a_reader_lists_them(store: Path) -> None:
    writers = [Worker("writer", 3000, store) for _ in range(2)]
    seen_counts: dict[Path, list[int]] = {}
    while any(w.proc.poll() is None for w in writers):
        for info in st.list_runs(store):  # reads run.json, tails and whole metric files mid-write
            assert info.error is None and info.status in ("Running", "Complete")
            st.last_metrics(info.path)
            seen_counts.setdefault(info.path, []).append(len(_steps(info.path)))
        time.sleep(0.05)
    for worker in writers:
        assert worker.proc.returncode == 0, worker.proc.communicate()[1]
        path = worker.path
        assert _steps(path) == list(range(3000)) and st.run_info(path).status == "Complete"
        counts = seen_counts[path]
        assert counts == sorted(counts)  # the reader never saw points disappear
        assert any(0 < c < 3000 for c in counts)  # it did read while the writer was writing


def test_a_run_open_in_another_process_cannot_be_resumed_until_that_process_dies(store: Path) -> None:
    from ember.errors import TrackingError

    worker = Worker("killnow", 10, store)
    path = worker.path
    # As if the writer had been seen finished (run.json read between two writes, or edited):
    # only the lock tells that the writer is alive.
    meta = json.loads((path / "run.json").read_text())
    (path / "run.json").write_text(json.dumps({**meta, "status": "Failed"}))
    pattern = rf"run {path.name} .* is open for writing in another process \(pid {worker.proc.pid} on "
    with pytest.raises(TrackingError, match=pattern):
        track.load_run(path, resume=True)
    worker.proc.kill()  # kill -9: the lock goes with the process, never stale
    worker.proc.wait()
    resumed = track.load_run(path, resume=True)
    resumed.log("train", {"loss": 0.0, "step_sq": 0}, step=10)
    resumed.finish()
    steps = _steps(path)  # what the killed worker had flushed, then the resumed step
    assert steps == [*range(len(steps) - 1), 10]


def test_a_resumed_run_is_locked_against_a_second_resume_in_another_process(store: Path) -> None:
    run = track.create_run(name="twice")
    run.finish("Failed")
    code = (
        "import sys; from ember import track; from ember.errors import TrackingError\n"
        "try:\n    track.load_run(sys.argv[1], resume=True)\nexcept TrackingError as e:\n    print(e)\n"
    )
    resumed = track.load_run(run.path, resume=True)  # type: ignore[arg-type]
    out = subprocess.run([sys.executable, "-c", code, str(run.path)], capture_output=True, text=True, timeout=120)
    assert f"open for writing in another process (pid {os.getpid()} on " in out.stdout, out.stderr
    resumed.finish()  # releases it
    out = subprocess.run([sys.executable, "-c", code, str(run.path)], capture_output=True, text=True, timeout=120)
    assert out.stdout == "" and out.returncode == 0, out.stderr

"""Runs through the public API: creation, logging, hparams, status, recording, no-op ranks."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ember import track
from ember.errors import TrackingError
from ember.track import store as st
from ember.track.environment import collect_git

FOLDER_RE = re.compile(r"^(?P<name>.+)_\d{6}_\d{6}_[a-z0-9]{6}$")


def test_run_folder_is_name_date_time_and_six_random_chars_under_ember_home(store: Path) -> None:
    run = track.create_run(name="mnist-ddp")
    run.finish()
    assert run.path is not None and run.path.parent == store / "runs"
    match = FOLDER_RE.match(run.path.name)
    assert match and match["name"] == "mnist-ddp"
    assert re.fullmatch(r"[0-9a-f]{32}", run.id)
    assert sorted(p.name for p in run.path.iterdir()) == [
        "metrics",
        "platform.json",
        "run.json",
        "stdout.log",
    ]


def test_default_store_is_dot_ember_in_the_working_directory_and_home_argument_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EMBER_HOME")
    monkeypatch.chdir(tmp_path)
    a = track.create_run(name="a")
    b = track.create_run(name="b", home=tmp_path / "elsewhere")
    art = track.create_artifact(name="m")
    a.finish()
    b.finish()
    assert a.path is not None and a.path.parent == tmp_path / ".ember" / "runs"
    assert b.path is not None and b.path.parent == tmp_path / "elsewhere" / "runs"
    assert art.path is not None and art.path.parent == tmp_path / ".ember" / "artifacts"


def test_logged_points_read_back_with_aliases_normalised_and_nan_inf_kept() -> None:
    run = track.create_run(name="values")
    run.log("training", {"loss": 0.5, "n": 3}, step=0, epoch=0)
    run.log("validate", {"acc": np.float32(0.25), "count": np.int64(7)}, step=1)
    run.log("evaluation", {"t": torch.tensor(1.5), "i": torch.tensor([2])}, step=2, epoch=1.5)
    run.log("Train", {"nan": math.nan, "inf": math.inf, "ninf": -math.inf}, step=3)
    run.log("system", {"cpu": 12.5}, step=4)
    run.finish()
    assert run.metric_types() == ["train", "val", "test", "system"]
    train = run.metrics("train")
    assert [p["step"] for p in train] == [0, 3]
    assert train[0]["metrics"] == {"loss": 0.5, "n": 3} and train[0]["epoch"] == 0
    nan_point = train[1]["metrics"]
    assert math.isnan(nan_point["nan"]) and nan_point["inf"] == math.inf and nan_point["ninf"] == -math.inf
    assert run.metrics("val")[0]["metrics"] == {"acc": 0.25, "count": 7}
    assert run.metrics("eval")[0]["metrics"] == {"t": 1.5, "i": 2}
    assert run.metrics("test")[0]["epoch"] == 1.5
    raw = (run.path / "metrics" / "train.jsonl").read_text().splitlines()  # type: ignore[operator]
    assert '"nan":"NaN"' in raw[1] and '"inf":"Infinity"' in raw[1] and '"ninf":"-Infinity"' in raw[1]
    for line in raw:
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))


def test_points_are_on_disk_within_a_second_without_finish_or_flush() -> None:
    run = track.create_run(name="background")
    run.log("train", {"loss": 1.0}, step=0)
    import time

    deadline = time.monotonic() + 2.0
    path = run.path / "metrics" / "train.jsonl"  # type: ignore[operator]
    while time.monotonic() < deadline and not (path.exists() and path.read_text()):
        time.sleep(0.05)
    assert path.read_text().startswith('{"step":0,')
    run.finish()


def test_hparams_update_override_and_keep_are_saved_to_run_json() -> None:
    run = track.create_run(name="hp", hparams={"lr": 0.1, "opt": {"name": "sgd"}})
    run.hparams.update({"lr": 0.5, "batch_size": 64}, override=False)
    run.hparams.update({"momentum": np.float64(0.9)})
    run.hparams["warmup"] = (1, 2)
    assert dict(run.hparams) == {
        "lr": 0.1,
        "opt": {"name": "sgd"},
        "batch_size": 64,
        "momentum": 0.9,
        "warmup": [1, 2],
    }
    saved = json.loads((run.path / "run.json").read_text())  # type: ignore[operator]
    assert saved["hparams"] == dict(run.hparams)
    run.finish()
    assert track.load_run(run.path).hparams["momentum"] == 0.9  # type: ignore[arg-type]


def test_labels_description_status_and_timestamps() -> None:
    run = track.create_run(name="meta", labels=["ddp"], description="first try", folder="team/mnist")
    assert run.status == "Running" and run.end_time is None and run.folder == "team/mnist"
    run.labels = ["ddp", "baseline"]
    run.description = "second try"
    run.finish()
    loaded = track.load_run(run.path)  # type: ignore[arg-type]
    assert loaded.labels == ["ddp", "baseline"] and loaded.description == "second try"
    assert loaded.status == "Complete"
    assert loaded.start_time <= loaded.end_time  # type: ignore[operator]


@pytest.mark.parametrize(
    ("exc", "status"),
    [(None, "Complete"), (ValueError("boom"), "Failed"), (KeyboardInterrupt(), "Interrupted")],
)
def test_context_manager_sets_the_status_from_how_the_block_ended(exc: BaseException | None, status: str) -> None:
    expected = pytest.raises(type(exc)) if exc is not None else _nothing()
    with expected, track.create_run(name="ctx") as run:
        run.log("train", {"loss": 1.0}, step=0)
        if exc is not None:
            raise exc
    assert run.status == status
    assert track.load_run(run.path).status == status  # type: ignore[arg-type]


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *args: object) -> None:
        return None


def test_finish_twice_is_a_no_op_and_logging_after_finish_says_how_to_resume() -> None:
    run = track.create_run(name="done")
    run.finish()
    run.finish("Failed")
    assert run.status == "Complete"
    with pytest.raises(TrackingError, match=r"finished; reopen it with track.load_run\(path, resume=True\)"):
        run.log("train", {"loss": 1.0}, step=0)
    with pytest.raises(TrackingError, match="finish\\(status='Done'\\)"):
        track.create_run(name="x").finish("Done")


def test_stdout_and_stderr_are_teed_into_the_run_and_restored_on_finish(
    capsys: pytest.CaptureFixture[str],
) -> None:
    before_out, before_err = sys.stdout, sys.stderr
    run = track.create_run(name="tee")
    print("hello from training")
    print("a warning", file=sys.stderr)
    run.finish()
    print("after finish")
    assert sys.stdout is before_out and sys.stderr is before_err
    seen = capsys.readouterr()
    assert "hello from training" in seen.out and "after finish" in seen.out  # still on the console
    assert "a warning" in seen.err
    log = (run.path / "stdout.log").read_text()  # type: ignore[operator]
    assert "hello from training\n" in log and "a warning\n" in log and "after finish" not in log


def test_a_stream_replaced_after_the_run_started_is_left_in_place() -> None:
    import io

    run = track.create_run(name="tee2")
    replacement = io.StringIO()
    saved = sys.stdout
    sys.stdout = replacement
    try:
        run.finish()
        assert sys.stdout is replacement
    finally:
        sys.stdout = saved


def test_platform_git_and_command_are_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    (repo / "train.py").write_text("print(1)\n")
    subprocess.run([*git, "add", "train.py"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "init"], cwd=repo, check=True)
    (repo / "train.py").write_text("print(2)\n")
    monkeypatch.chdir(repo)
    run = track.create_run(name="platform")
    run.finish()
    recorded = run.platform
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout
    assert recorded["git"] == {"commit": commit.strip(), "branch": "main", "dirty": True, "remote": None}
    # clean, a remote whose URL holds a token, a detached HEAD; a repository with no commit; outside one
    subprocess.run([*git, "commit", "-q", "-am", "two"], cwd=repo, check=True)
    subprocess.run([*git, "remote", "add", "origin", "https://bot:secret@example.com/r.git"], cwd=repo, check=True)
    second = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    remote = "https://example.com/r.git"
    assert collect_git(repo) == {"commit": second, "branch": "main", "dirty": False, "remote": remote}
    subprocess.run([*git, "checkout", "-q", "--detach"], cwd=repo, check=True)
    assert collect_git(repo) == {"commit": second, "branch": "HEAD", "dirty": False, "remote": remote}
    (tmp_path / "empty").mkdir()
    subprocess.run([*git, "init", "-q"], cwd=tmp_path / "empty", check=True)
    assert collect_git(tmp_path / "empty") == {"commit": None, "branch": "main", "dirty": False, "remote": None}
    assert collect_git(repo / ".git") is None  # inside a repository but not its work tree
    plat = recorded["platform"]
    assert plat["torch"]["version"] == torch.__version__
    assert plat["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert plat["hostname"] and plat["cpu_count"] >= 1 and "numpy" in plat["packages"]
    assert recorded["command"]["argv"] == sys.argv and recorded["command"]["cwd"] == str(repo)


def test_no_git_repository_records_git_as_null(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    run = track.create_run(name="nogit")
    run.finish()
    assert run.platform["git"] is None


def test_config_file_values_override_the_arguments_and_merge_hparams(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("name: from-yaml\nlabels: [yaml]\nhparams:\n  lr: 0.01\n  epochs: 3\nfolder: exp\n")
    run = track.create_run(name="arg", hparams={"lr": 0.1, "batch_size": 8}, config_path=config)
    run.finish()
    assert run.name == "from-yaml" and run.labels == ["yaml"] and run.folder == "exp"
    assert dict(run.hparams) == {"lr": 0.01, "batch_size": 8, "epochs": 3}
    assert run.path is not None and run.path.name.startswith("from-yaml_")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nmae: x\n", "unknown key\\(s\\) nmae; allowed: name"),
        ("[1, 2]\n", "must hold a mapping"),
        (":\n- a", "not valid YAML"),
    ],
)
def test_bad_config_file_names_the_problem(tmp_path: Path, store: Path, text: str, message: str) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    with pytest.raises(TrackingError, match=message):
        track.create_run(config_path=config)
    with pytest.raises(TrackingError, match="does not exist"):
        track.create_run(config_path=tmp_path / "missing.yaml")
    assert not (store / "runs").exists()


def test_other_ranks_get_a_no_op_run_that_still_checks_arguments(
    store: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RANK", "1")
    run = track.create_run(name="ddp", hparams={"lr": 0.1})
    art = track.create_artifact(name="model")
    assert isinstance(run, track.NoOpRun) and isinstance(run, track.Run) and not run.active
    assert run.path is None and art.path is None and not art.active
    run.log("train", {"loss": torch.tensor(0.5)}, step=0)
    run.hparams.update({"batch_size": 64})
    assert run.hparams["batch_size"] == 64
    art.add_file(tmp_path / "only-on-rank-0.pt")  # rank 0 saved it; this rank need not have it
    run.mark_output(art)
    assert run.last_step("train") is None and run.metrics("train") == []
    with pytest.raises(TrackingError, match="is not a number"):
        run.log("train", {"loss": "high"}, step=1)
    with pytest.raises(TrackingError, match="cannot be stored as JSON"):
        run.hparams.update({"model": object()})
    run.finish()
    assert run.status == "Complete"
    assert track.load_run("anything", resume=True).active is False
    assert not store.exists()


def test_load_run_read_only_refuses_changes_with_a_hint() -> None:
    run = track.create_run(name="ro")
    run.log("train", {"loss": 1.0}, step=3)
    run.finish()
    loaded = track.load_run(run.path.name)  # type: ignore[union-attr]
    assert loaded.id == run.id and loaded.last_step("train") == 3
    with pytest.raises(TrackingError, match=r"read-only; reopen it with track\.load_run\(path, resume=True\)"):
        loaded.log("train", {"loss": 1.0}, step=4)
    with pytest.raises(TrackingError, match="read-only"):
        loaded.hparams.update({"lr": 1})


def test_resume_continues_the_same_run_and_last_step_prevents_duplicate_steps() -> None:
    run = track.create_run(name="resumable", hparams={"lr": 0.1})
    for step in range(5):
        run.log("train", {"loss": 1.0 / (step + 1)}, step=step)
    run.log("val", {"acc": 0.5}, step=4)
    run.finish("Interrupted")

    resumed = track.load_run(run.path, resume=True)  # type: ignore[arg-type]
    assert resumed.id == run.id and resumed.path == run.path and resumed.status == "Running"
    assert resumed.last_step("train") == 4 and resumed.last_step("val") == 4
    assert resumed.last_step("test") is None
    for step in range(3, 8):  # a checkpoint from step 3: the trainer replays 3 and 4
        done = resumed.last_step("train")
        if done is None or step > done:
            resumed.log("train", {"loss": 1.0 / (step + 1)}, step=step)
    resumed.finish()
    steps = [p["step"] for p in resumed.metrics("train")]
    assert steps == list(range(8))
    meta = json.loads((run.path / "run.json").read_text())  # type: ignore[operator]
    assert meta["status"] == "Complete" and len(meta["resumes"]) == 1 and meta["hparams"] == {"lr": 0.1}
    assert len(list(st.list_runs(run.path.parent.parent))) == 1  # type: ignore[union-attr]


def test_resume_cuts_a_torn_last_line_before_appending() -> None:
    run = track.create_run(name="torn")
    run.log("train", {"loss": 1.0}, step=0)
    run.finish()
    path = run.path / "metrics" / "train.jsonl"  # type: ignore[operator]
    with open(path, "a") as f:
        f.write('{"step":1,"epoch":null,"ti')  # what a crash mid-write leaves
    assert [p["step"] for p in track.load_run(run.path).metrics("train")] == [0]  # type: ignore[arg-type]
    resumed = track.load_run(run.path, resume=True)  # type: ignore[arg-type]
    resumed.log("train", {"loss": 0.5}, step=1)
    resumed.finish()
    assert [p["step"] for p in resumed.metrics("train")] == [0, 1]
    assert all(json.loads(line) for line in path.read_text().splitlines())


def test_resume_refuses_a_run_that_is_still_open() -> None:
    run = track.create_run(name="open")
    with pytest.raises(TrackingError, match="already open in this process"):
        track.load_run(run.path, resume=True)  # type: ignore[arg-type]
    run.finish()


def test_a_forked_child_writes_nothing_twice_and_cannot_log(capfd: pytest.CaptureFixture[str]) -> None:
    import os

    run = track.create_run(name="fork")
    for step in range(3):
        run.log("train", {"loss": 1.0}, step=step)  # still queued in memory at the fork
    print("parent line")
    pid = os.fork()
    if pid == 0:  # a DataLoader worker, say
        try:
            run.log("train", {"loss": 2.0}, step=99)
            code = 1
        except TrackingError:
            code = 0
        print("child line")
        sys.stdout.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    run.finish()
    assert [p["step"] for p in run.metrics("train")] == [0, 1, 2]
    assert (run.path / "stdout.log").read_text().count("parent line") == 1  # type: ignore[operator]
    assert "child line" in capfd.readouterr().out


def test_runs_are_written_unlocked_where_there_are_no_flock_locks(monkeypatch: pytest.MonkeyPatch) -> None:
    # Windows: no fcntl; the run works as before locks existed.
    import sys

    monkeypatch.setitem(sys.modules, "fcntl", None)  # import fcntl raises ImportError, as on Windows
    run = track.create_run(name="no-locks")
    run.log("train", {"loss": 1.0}, step=0)
    run.finish("Failed")
    resumed = track.load_run(run.path, resume=True)  # type: ignore[arg-type]
    resumed.finish()
    assert resumed.status == "Complete" and run._folder_lock is None


def test_a_run_json_that_cannot_be_written_at_start_or_resume_releases_the_folder_lock(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ember.track import run as run_module
    from ember.track._fs import lock_folder, unlock_folder

    ended = track.create_run(name="ended")
    ended.finish("Failed")
    real = run_module.write_json_atomic

    def disk_full_for_run_json(path: Path, data: object) -> None:
        if path.name == st.RUN_FILE:
            raise OSError(28, "No space left on device")
        real(path, data)

    monkeypatch.setattr(run_module, "write_json_atomic", disk_full_for_run_json)
    with pytest.raises(OSError, match="No space left"):
        track.load_run(ended.path, resume=True)  # type: ignore[arg-type]
    with pytest.raises(OSError, match="No space left"):
        track.create_run(name="unstarted")
    monkeypatch.setattr(run_module, "write_json_atomic", real)
    (unstarted,) = (store / "runs").glob("unstarted_*")
    lock = lock_folder(unstarted, "the unstarted run", lambda: "nobody")  # refused if the failed create held it
    unlock_folder(lock)
    resumed = track.load_run(ended.path, resume=True)  # type: ignore[arg-type]
    resumed.finish()
    assert resumed.status == "Complete" and resumed.reason is None


def test_the_registry_of_open_runs_imports_nothing_of_ember_so_no_import_circle() -> None:
    # _live finishes each open run at exit through the run's own _end; it imported run.py for
    # ending_status before, while run.py imports _live: a circle broken by a local import.
    import ast

    from ember.track import _live

    tree = ast.parse(Path(_live.__file__).read_text())
    imported = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert sorted(m for m in imported if m.split(".")[0] == "ember") == []

"""T9k experiment management (``from t9k import em``) on ember.compat.t9k: the DDP MNIST program
under ``ember run --nproc 2`` (gloo), uploaded to a real ``ember server``; and the ``em`` names."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ember import track
from ember.compat.t9k import em
from ember.errors import TrackingError
from ember.track import client
from ember.track import store as st

SCRIPT = Path(__file__).parent / "scripts" / "t9k_ddp.py"
HPARAMS = {
    "batch_size": 64,
    "epochs": 3,
    "learning_rate": 0.002,
    "learning_rate_decay_period": 1,
    "learning_rate_decay_factor": 0.7,
    "conv_channels1": 32,
    "conv_channels2": 64,
    "conv_channels3": 64,
    "conv_kernel_size": 3,
    "maxpool_size": 2,
    "linear_features1": 64,
    "seed": 1,
}
STEPS_PER_EPOCH = 25  # 1,600 training images in batches of 64
LOG_EVERY = 5  # 10 // world_size


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh local store ($EMBER_HOME), $HOME for the stored login, no server configured, rank 0."""
    monkeypatch.setenv("EMBER_HOME", str(tmp_path / "store"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in ("EMBER_HOST", "EMBER_API_KEY", "RANK"):
        monkeypatch.delenv(name, raising=False)
    yield tmp_path
    from ember.track import _live

    for run in list(_live._live.values()):
        run.finish("Failed")


@pytest.mark.multiprocess
def test_the_ddp_program_tracks_one_run_with_metrics_artifact_and_output_then_uploads_it(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    from ember.server.services import admin
    from ember.server.storage.settings import Settings
    from tests.server.conftest import ServerProcess

    db_url = f"sqlite:///{tmp_path / 'server.db'}"
    settings = Settings.make(data_dir=tmp_path / "server", db_url=db_url)
    key = admin.init(settings, "alice")
    server = ServerProcess(settings.data_dir, db_url)  # its address is known before it starts
    work, user_home = tmp_path / "job", tmp_path / "home"
    work.mkdir()
    user_home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("EMBER_HOME", "RANK", "WORLD_SIZE")}
    # em.login() with no arguments reads the server and key from the environment
    env.update(HOME=str(user_home), EMBER_HOST=server.url, EMBER_API_KEY=key, OMP_NUM_THREADS="1")
    job = subprocess.Popen(
        [sys.executable, "-m", "ember.cli", "run", str(SCRIPT), "--nproc", "2"],
        cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        server.start()  # while the job trains: it logs in at the end
        output, _ = job.communicate(timeout=300)
        assert job.returncode == 0, output
        run_id = _one_run(work).meta["id"]
        uploaded = {
            "run": _get(server.url, key, f"/runs/{run_id}"),
            "points": _get(server.url, key, f"/runs/{run_id}/metrics", type="train")["points"],
            "log": _get(server.url, key, f"/runs/{run_id}/log")["text"],
        }
    finally:
        if job.poll() is None:  # SIGTERM: the launcher stops its workers too
            job.terminate()
            job.wait(60)
        server.kill()

    # the local store (./.ember in the job's working directory): one run, from rank 0 only
    info = _one_run(work)
    assert info.meta["name"] == "mnist_torch_distributed" and info.status == "Complete"
    assert info.meta["hparams"] == HPARAMS
    train, val, test = (st.read_metrics(info.path, type_) for type_ in ("train", "val", "test"))
    epochs = range(1, HPARAMS["epochs"] + 1)
    steps = range(LOG_EVERY, STEPS_PER_EPOCH + 1, LOG_EVERY)
    assert [(p["step"], p["epoch"]) for p in train] == [
        ((e - 1) * STEPS_PER_EPOCH + s, e) for e in epochs for s in steps
    ]
    assert [(p["step"], p["epoch"]) for p in val] == [(e * STEPS_PER_EPOCH, e) for e in epochs]
    assert [(p["step"], p["epoch"]) for p in test] == [(HPARAMS["epochs"] * STEPS_PER_EPOCH, None)]
    assert sorted(val[-1]["metrics"]) == sorted(test[0]["metrics"]) == ["accuracy", "loss"]
    assert test[0]["metrics"]["accuracy"] >= 0.9 and val[-1]["metrics"]["accuracy"] >= 0.9  # it learned
    assert train[-1]["metrics"]["loss"] < train[0]["metrics"]["loss"]

    # the saved model, as an artifact marked as the run's output (the lineage the console draws)
    (edge,) = track.load_run(info.path).lineage()
    assert edge["source"]["id"] == info.meta["id"] and edge["target"]["kind"] == "artifact"
    artifact = track.load_artifact(info.path.parent.parent / edge["target"]["path"])
    weights = hashlib.sha256((work / "model_state_dict.pt").read_bytes()).hexdigest()
    assert artifact.name == "mnist_torch_saved_model"
    assert [(f["path"], f["sha256"]) for f in artifact.files] == [("model_state_dict.pt", weights)]

    # what `logging` printed after create_run (basicConfig ran at import) is the run's output
    log = (info.path / "stdout.log").read_text()
    assert "epoch 1/3, batch     5/25 with loss: " in log and "epoch 3/3 with val loss: " in log
    assert "test loss: " in log and log.count("test loss: ") == 1  # rank 0's lines only
    assert "Using distributed PyTorch" not in log  # printed before the run existed

    # em.login() + run.upload(folder="em-examples", make_folder=True): all of it on the server
    run = uploaded["run"]
    assert run["folder"] == "/alice/em-examples" and run["hparams"] == HPARAMS and run["status"] == "Complete"
    assert {m["type"]: m["count"] for m in run["metrics"]} == {"train": len(train), "val": len(val), "test": len(test)}
    assert [p["step"] for p in uploaded["points"]] == [p["step"] for p in train]
    assert [(e["source"]["id"], e["target"]["id"]) for e in run["lineage"]] == [(info.meta["id"], artifact.id)]
    assert uploaded["log"] == log


def _one_run(work: Path) -> Any:
    (info,) = st.list_runs(work / ".ember")
    return info


def _get(url: str, key: str, path: str, **params: str) -> Any:
    import httpx

    r = httpx.get(f"{url}/api/v1{path}", params=params, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def test_em_names_are_embers_tracking_objects() -> None:
    assert em.create_artifact is track.create_artifact and em.load_artifact is track.load_artifact
    assert em.logout is track.logout and em.upload is client.upload
    assert em.Run is track.Run and em.Artifact is track.Artifact


def test_create_run_takes_t9ks_argument_order_with_the_config_file_first(home: Path) -> None:
    config = home / "run_config.yaml"
    config.write_text("name: cnn_keras\nhparams:\n  batch_size: 32\nlabels:\n- Keras\ndescription: from the file\n")
    from_file = em.create_run(str(config), "ignored", {"epochs": 1, "batch_size": 8})
    positional = em.create_run(None, "cnn", {"lr": 0.1}, ["torch"], "positional", False, "cv/mnist")
    for run in (from_file, positional):
        run.log(type="training", metrics={"loss": 0.5}, step=1, epoch=1)  # T9k's alias of train
        run.finish()
    assert (from_file.name, dict(from_file.hparams), from_file.labels) == (
        "cnn_keras",
        {"epochs": 1, "batch_size": 32},
        ["Keras"],
    )
    assert (positional.name, positional.labels, positional.description, positional.folder) == (
        "cnn", ["torch"], "positional", "cv/mnist",
    )  # fmt: skip
    assert [p["step"] for p in positional.metrics("train")] == [1]


def test_load_run_reads_a_run_and_says_how_to_upload_instead_of_auto_upload(home: Path) -> None:
    run = em.create_run(name="mnist_torch", hparams={"lr": 0.1})
    run.finish()
    loaded = em.load_run(str(run.path))
    assert loaded.id == run.id and dict(loaded.hparams) == {"lr": 0.1}
    with pytest.raises(TrackingError, match=r"run.upload\(folder='team', make_folder=True"):
        em.load_run(str(run.path), auto_upload=True, folder="team", make_folder=True)


def test_login_and_upload_without_a_server_say_how_to_log_in(home: Path) -> None:
    run = em.create_run(name="offline")
    run.finish()
    with pytest.raises(client.UploadError, match="not logged in: run `ember login --host URL`"):
        em.login()
    with pytest.raises(client.UploadError, match="not logged in"):
        run.upload(folder="em-examples", make_folder=True)
    with pytest.raises(TrackingError, match=r"login\(timeout=5\): .*drop the timeout argument"):
        em.login(timeout=5)
    assert em.logout() is False  # nothing was stored


def test_artifacts_take_t9ks_calls(home: Path) -> None:
    (home / "model.pt").write_bytes(b"weights")
    (home / "data").mkdir()
    (home / "data" / "a.txt").write_text("a")
    artifact = em.create_artifact(name="mnist_dataset", labels=["dataset", "MNIST"], description="digits")
    artifact.add_file(str(home / "model.pt"), obj_path="dataset/model.pt")
    artifact.add_dir(str(home / "data"), obj_path="dataset/raw")
    artifact.add_reference(uri="https://example.org/mnist/train-images-idx3-ubyte.gz", obj_path="dataset/train.gz")
    loaded = em.load_artifact(str(artifact.path))
    assert [f["path"] for f in loaded.files] == ["dataset/model.pt", "dataset/raw/a.txt"]
    assert [r["path"] for r in loaded.references] == ["dataset/train.gz"]
    assert json.loads((artifact.path / "artifact.json").read_text())["labels"] == ["dataset", "MNIST"]  # type: ignore[operator]

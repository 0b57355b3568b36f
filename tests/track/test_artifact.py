"""Artifacts (copied files with size and sha256, references) and lineage between runs and artifacts."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from ember import track
from ember.errors import TrackingError


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_add_file_copies_and_records_size_and_sha256(tmp_path: Path, store: Path) -> None:
    model = tmp_path / "model.pt"
    model.write_bytes(b"\x00weights" * 1000)
    art = track.create_artifact("mnist-model", labels=["cnn"], description="final")
    record = art.add_file(model)
    art.add_file(model, obj_path="backup/model-copy.pt")
    assert art.path is not None and art.path.parent == store / "artifacts"
    assert record == {"path": "model.pt", "size": 8000, "sha256": _sha(model), "source": str(model)}
    assert (art.path / "files" / "model.pt").read_bytes() == model.read_bytes()
    assert (art.path / "files" / "backup" / "model-copy.pt").is_file()
    model.write_bytes(b"changed later")  # the artifact keeps its own copy
    loaded = track.load_artifact(art.path)
    assert loaded.id == art.id and loaded.labels == ["cnn"] and loaded.description == "final"
    assert [f["path"] for f in loaded.files] == ["model.pt", "backup/model-copy.pt"]
    assert _sha(art.path / "files" / "model.pt") == record["sha256"]


def test_add_dir_copies_the_tree_and_add_reference_copies_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "a.txt").write_text("a")
    (data / "sub" / "b.txt").write_text("bb")
    art = track.create_artifact("dataset")
    records = art.add_dir(data)
    ref = art.add_reference("s3://bucket/mnist/raw/")
    assert [(r["path"], r["size"]) for r in records] == [("data/a.txt", 1), ("data/sub/b.txt", 2)]
    assert (art.path / "files" / "data" / "sub" / "b.txt").read_text() == "bb"  # type: ignore[operator]
    assert ref == {"uri": "s3://bucket/mnist/raw/", "path": "raw"}
    meta = json.loads((art.path / "artifact.json").read_text())  # type: ignore[operator]
    assert meta["references"] == [ref] and len(meta["files"]) == 2


def test_a_taken_obj_path_is_refused_and_nothing_is_overwritten(tmp_path: Path) -> None:
    (tmp_path / "model.pt").write_bytes(b"1")
    art = track.create_artifact("m")
    art.add_file(tmp_path / "model.pt")
    with pytest.raises(TrackingError, match=r"already holds 'model\.pt'.*pass another obj_path"):
        art.add_file(tmp_path / "model.pt")
    with pytest.raises(TrackingError, match="clashes"):
        art.add_reference("s3://b/x", obj_path="model.pt/inner")
    assert len(art.files) == 1 and art.references == []


def test_mark_input_and_output_record_the_edge_in_both_ends(tmp_path: Path) -> None:
    (tmp_path / "model.pt").write_bytes(b"w")
    data = track.create_artifact("mnist-data")
    data.add_reference("s3://bucket/mnist")
    run = track.create_run(name="train")
    run.mark_input(data)
    model = track.create_artifact("mnist-model")
    model.add_file(tmp_path / "model.pt")
    run.mark_output(model)
    run.mark_output(model)  # once is enough
    run.finish()
    evaluation = track.create_run(name="eval")
    evaluation.mark_input(run)
    evaluation.finish()

    def pair(edge: dict) -> tuple[str, str]:
        return edge["source"]["id"], edge["target"]["id"]

    assert [pair(e) for e in run.lineage()] == [(data.id, run.id), (run.id, model.id), (run.id, evaluation.id)]
    assert [pair(e) for e in data.lineage()] == [(data.id, run.id)]
    assert [pair(e) for e in model.lineage()] == [(run.id, model.id)]
    assert [pair(e) for e in evaluation.lineage()] == [(run.id, evaluation.id)]
    edge = model.lineage()[0]
    assert edge["source"] == {"kind": "run", "id": run.id, "name": "train", "path": f"runs/{run.path.name}"}  # type: ignore[union-attr]
    assert edge["target"]["path"] == f"artifacts/{model.path.name}"  # type: ignore[union-attr]
    lines = (run.path / "lineage.jsonl").read_text().splitlines()  # type: ignore[operator]
    assert len(lines) == 3


def test_an_artifact_belongs_in_the_folder_of_the_run_that_wrote_it_else_of_one_that_used_it(tmp_path: Path) -> None:
    """Issue 33, item 10: `ember ui` and `ember upload` of a store filed every artifact in ``default``."""
    from ember.track.lineage import run_folder

    data, model, loose = (track.create_artifact(n) for n in ("data", "model", "loose"))
    train = track.create_run(name="train", folder="vision/resnet")
    train.mark_input(data)
    train.mark_output(model)
    train.finish()
    later = track.create_run(name="eval", folder="evals")
    later.mark_input(model)  # used elsewhere too: the writer's folder wins
    later.finish()
    assert run_folder(model.path) == "vision/resnet"  # type: ignore[arg-type]
    assert run_folder(data.path) == "vision/resnet"  # type: ignore[arg-type]  # only used: the user's folder
    assert run_folder(loose.path) is None  # type: ignore[arg-type]  # no run: the caller's default
    (train.path / "run.json").write_text("{")  # type: ignore[operator]  # its run damaged: the next run that names it
    assert run_folder(model.path) == "evals"  # type: ignore[arg-type]


def test_remove_drops_records_copies_and_empty_folders(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "a.bin").write_bytes(b"a")
    (src / "b.bin").write_bytes(b"b")
    art = track.create_artifact("ckpts", home=tmp_path / "store")
    art.add_dir(src, obj_path="d")
    art.remove(["d/sub/a.bin"])
    assert [f["path"] for f in track.load_artifact(art.path).files] == ["d/b.bin"]
    assert not (art.path / "files" / "d" / "sub").exists() and (art.path / "files" / "d" / "b.bin").exists()
    with pytest.raises(TrackingError, match="holds no file"):
        art.remove(["d/nope.bin"])

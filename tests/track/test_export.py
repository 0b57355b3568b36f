"""``ember runs export`` streams: bounded memory whatever the number of points, the same bytes as
building the whole document would give, a checked output path."""

from __future__ import annotations

import csv
import io
import json
import math
import tracemalloc
from pathlib import Path

import pytest

from ember import track
from ember.track import _values
from ember.track._values import encode_metrics
from ember.track.cli import main
from ember.track.store import metric_types, read_metrics

POINTS = 8_000


@pytest.fixture
def long_run() -> Path:
    run = track.create_run(name="long", hparams={"lr": 0.1})
    for i in range(POINTS):
        run.log("train", {"loss": 1.0 / (i + 1), "acc": i * 1e-5}, step=i, epoch=i // 1000)
    run.log("val", {"loss": math.nan, "top5": math.inf}, step=3)
    run.finish()
    assert run.path is not None
    return run.path


def _whole_json(path: Path) -> str:
    """The document as the earlier, in-memory export built it."""
    data = {
        "run": json.loads((path / "run.json").read_text()),
        "platform": json.loads((path / "platform.json").read_text()),
        "metrics": {t: read_metrics(path, t) for t in metric_types(path)},
        "lineage": [],
    }
    for points in data["metrics"].values():
        for point in points:
            point["metrics"] = json.loads(encode_metrics(point["metrics"]))
    return json.dumps(data, indent=2, allow_nan=False) + "\n"


def _whole_csv(path: Path) -> str:
    rows = [(t, p) for t in metric_types(path) for p in read_metrics(path, t)]
    names = sorted({name for _, p in rows for name in p["metrics"]})
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["type", "step", "epoch", "time", *names])
    for type_, p in rows:
        epoch = "" if p["epoch"] is None else p["epoch"]
        writer.writerow([type_, p["step"], epoch, p["time"], *[p["metrics"].get(n, "") for n in names]])
    return buffer.getvalue()


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_export_holds_one_chunk_not_every_point_and_writes_the_same_bytes(
    long_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    monkeypatch.setattr(_values, "READ_CHUNK", 16 << 10)
    expected = _whole_csv(long_run) if fmt == "csv" else _whole_json(long_run)
    tracemalloc.start()
    read_metrics(long_run, "train")
    whole = tracemalloc.get_traced_memory()[1]  # every point as a dict: what the export used to hold
    tracemalloc.reset_peak()
    out = tmp_path / f"out.{fmt}"
    assert main(["runs", "export", long_run.name, "--format", fmt, "--output", str(out)]) == 0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < whole / 5, (peak, whole)
    assert out.read_text(encoding="utf-8") == expected


@pytest.mark.parametrize(
    ("output", "message"),
    [("existing", "is a directory"), ("missing/sub/out.csv", "missing/sub' does not exist")],
)
def test_export_refuses_a_directory_or_a_missing_folder_as_output(
    long_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], output: str, message: str
) -> None:
    (tmp_path / "existing").mkdir()
    assert main(["runs", "export", long_run.name, "--format", "csv", "--output", str(tmp_path / output)]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "missing").exists() and not any((tmp_path / "existing").iterdir())


def test_export_to_a_file_replaces_it_only_when_complete(long_run: Path, tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    target.write_text("old")
    assert main(["runs", "export", long_run.name, "--format", "json", "--output", str(target)]) == 0
    assert json.loads(target.read_text())["run"]["name"] == "long"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json", "store"]

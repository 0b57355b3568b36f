"""One damaged run never hides the others: every reader lists or marks it (status Damaged, with the
reason) and goes on; no reader follows a symbolic link out of a run folder."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ember import track
from ember.errors import TrackingError
from ember.track.cli import add_commands
from ember.track.store import effective_status, list_runs, run_info


def ember(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="ember")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    try:
        return int(args.handler(args))
    except TrackingError as e:  # what ember.cli.main prints, with exit code 2
        print(f"ember: error: {e}", file=sys.stderr)
        return 2


def _edit_meta(change: Callable[[dict], object]) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        meta = json.loads((run / "run.json").read_text())
        change(meta)
        (run / "run.json").write_text(json.dumps(meta))

    return damage


def _write(name: str, data: bytes) -> Callable[[Path], None]:
    return lambda run: (run / name).write_bytes(data)


def _link(name: str, target: Callable[[Path], Path]) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        (run / name).unlink() if (run / name).is_file() else None
        os.symlink(target(run), run / name)

    return damage


def _relink_folder(run: Path) -> None:
    elsewhere = run.parent.parent / "elsewhere"
    run.rename(elsewhere)
    os.symlink(elsewhere, run)


def _append(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def _text_of(run: Path) -> str:
    return (run / "run.json").read_text()


DAMAGE: dict[str, Callable[[Path], None]] = {
    "run.json truncated": lambda run: (run / "run.json").write_text(_text_of(run)[:40]),
    "run.json empty": _write("run.json", b""),
    "run.json a list": _write("run.json", b"[]"),
    "run.json null": _write("run.json", b"null"),
    "run.json not UTF-8": _write("run.json", b'{"name": "\xff\xfe"}'),
    "run.json missing id": _edit_meta(lambda m: m.pop("id")),
    "run.json bare NaN": lambda run: (run / "run.json").write_text(_text_of(run).replace('"lr"', '"x": NaN, "lr"', 1)),
    "garbage start_time": _edit_meta(lambda m: m.update(start_time="yesterday")),
    "garbage heartbeat": _edit_meta(lambda m: m.update(status="Running", heartbeat="soon")),
    "hparams a list": _edit_meta(lambda m: m.update(hparams=[1])),
    "damaged metrics line": lambda run: _append(run / "metrics" / "train.jsonl", "not json\n"),
    "a folder named x.jsonl": lambda run: (run / "metrics" / "x.jsonl").mkdir(),
    "run.json a link": _link("run.json", lambda run: run.parent.parent / "secret.json"),
    "metrics file a link to /dev/zero": _link("metrics/train.jsonl", lambda run: Path("/dev/zero")),
    "metrics folder a link": lambda run: (shutil.rmtree(run / "metrics"), os.symlink(run.parent, run / "metrics")),
    "run folder a link": _relink_folder,
    "platform.json a link": _link("platform.json", lambda run: run.parent.parent / "secret.json"),
    "damaged lineage line": _write("lineage.jsonl", b'{"source": 1}\n'),
}  # fmt: skip
NOT_LISTED = {"damaged lineage line", "platform.json a link"}  # ls and compare read run.json and metrics only


@pytest.fixture
def store_with_victim(store: Path) -> tuple[list[str], Path]:
    names = []
    for i in range(3):
        run = track.create_run(name=f"good{i}", hparams={"lr": 0.1 * (i + 1)})
        run.log("train", {"loss": 1.0 / (i + 1)}, step=1)
        run.finish()
        assert run.path is not None
        names.append(run.path.name)
    victim = track.create_run(name="victim", hparams={"lr": 1.0})
    victim.log("train", {"loss": 0.5}, step=1)
    victim.finish()
    assert victim.path is not None
    (store / "secret.json").write_text(json.dumps(json.loads(_text_of(victim.path)) | {"name": "not mine"}))
    return names, victim.path


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_run_is_listed_as_damaged_and_every_other_run_still_reads(
    store_with_victim: tuple[list[str], Path], case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    good, victim = store_with_victim
    DAMAGE[case](victim)
    capsys.readouterr()

    assert ember("runs", "ls") == 0
    out, err = capsys.readouterr()
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert set(rows) == {*good, victim.name}
    assert all(" Complete " in rows[name] for name in good)
    if case not in NOT_LISTED:
        assert " Damaged " in rows[victim.name] and "1 damaged run(s)" in err

    assert ember("runs", "show", victim.name) == 1
    out, err = capsys.readouterr()
    assert "Damaged" in out and "damage" in out and "Traceback" not in out + err

    assert ember("runs", "compare", good[0], victim.name, good[1]) == 0
    out = capsys.readouterr().out
    assert out.count("Complete") == 2 + (case in NOT_LISTED) and ("Damaged" in out) == (case not in NOT_LISTED)

    assert ember("runs", "export", victim.name, "--format", "json") == 2
    assert "ember: error: " in capsys.readouterr().err
    for name in good:
        assert ember("runs", "export", name, "--format", "json") == 0
        assert json.loads(capsys.readouterr().out)["run"]["name"].startswith("good")
    assert "not mine" not in out  # no link was followed


@pytest.mark.parametrize("case", sorted(k for k in DAMAGE if k.startswith(("run.json", "garbage", "hparams", "run "))))
def test_loading_a_run_whose_metadata_is_damaged_is_one_tracking_error(
    store_with_victim: tuple[list[str], Path], case: str
) -> None:
    _, victim = store_with_victim
    DAMAGE[case](victim)
    with pytest.raises(TrackingError, match="is damaged"):
        track.load_run(victim.name)
    assert [i.folder for i in list_runs(victim.parent.parent) if i.error is not None] == [victim.name]
    assert run_info(victim).status == "Damaged"


def test_a_garbage_heartbeat_from_anywhere_never_raises_in_the_status_rule() -> None:
    # the server shows uploaded runs with the same rule
    assert effective_status({"status": "Running", "heartbeat": "soon", "pid": "x"}) == "Running"
    assert effective_status({"status": "Running", "heartbeat": 12}) == "Running"

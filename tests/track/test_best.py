"""One rule for a metric's best value (issue 22, item 10; issue 19): ``ember runs compare`` and the console agree.

Before, the CLI maximised accuracy-like names and minimised the rest, while the console minimised
loss-like names and maximised the rest: a ``grad_norm`` column showed its minimum in one and its
maximum in the other.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from ember import track
from ember.track.best import best_value, metric_mode
from ember.track.cli import add_commands


@pytest.mark.parametrize(
    ("name", "mode"),
    [
        ("train/loss", "min"),
        ("val/acc", "max"),
        ("accuracy", "max"),
        ("grad_norm", "min"),  # the console called this one's maximum the best
        ("lr", "min"),
        ("top1_err", "min"),  # an error, although it holds top1
        ("top5", "max"),
        ("val/f1", "max"),
        ("perplexity", "min"),
        ("samples_per_s", "max"),
        ("step_time", "min"),
    ],
)
def test_a_metric_is_minimised_or_maximised_by_its_name(name: str, mode: str) -> None:
    assert metric_mode(name) == mode
    assert best_value(name, 1.0, 2.0) == (1.0 if mode == "min" else 2.0)


def test_ember_runs_compare_and_the_console_show_the_same_best(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("fastapi")
    from ember.track.client import Client, Credentials, upload_run
    from tests.server.conftest import make_server

    runs = []
    for i in range(2):
        run = track.create_run(name=f"r{i}")
        for step, norm in enumerate((3.0, 1.0, 2.0)):
            run.log("train", {"grad_norm": norm + i, "acc": 0.1 * step, "top1_err": 0.5 - 0.1 * step}, step=step)
        run.finish()
        runs.append(run)
    parser = argparse.ArgumentParser(prog="ember")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["runs", "compare", "r0", "r1"])
    assert args.handler(args) == 0
    cli = {
        (line.split()[0], line.split()[2]): line.split()[3:]
        for line in capsys.readouterr().out.splitlines()
        if line.strip().startswith("train/") and " best " in line
    }
    server = make_server(tmp_path, f"sqlite:///{tmp_path / 'server.db'}")
    with server.client:
        client = Client(Credentials("http://testserver", server.keys["alice"]), http=server.client)
        for run in runs:
            upload_run(run.path, "t", True, "new", client)
        page = server.req("GET", "/search/runs", params={"sort": "name"}).json()
    for metric, mode in (("grad_norm", "min"), ("acc", "max"), ("top1_err", "min")):
        key = f"train/{metric}"
        assert page["metric_modes"][key] == mode
        shown = [row["metrics"][key]["best"] for row in page["runs"]]
        assert cli[(key, f"({mode})")] == [f"{v:g}" for v in shown], (key, cli, shown)

"""ember's logger is a ``logging`` citizen (issue 22, item 4): records propagate, every method works, ranks filter."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Callable

import pytest

import ember
from ember import distributed
from ember.compat.colossalai import logging as colossal_logging
from ember.logging import DistributedLogger


@pytest.mark.parametrize("get", [ember.get_dist_logger, colossal_logging.get_dist_logger], ids=["ember", "colossalai"])
def test_records_reach_caplog_through_propagation_and_ranks_filter_them(
    get: Callable[..., DistributedLogger], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="ember")
    logger = get()
    assert logger is ember.get_dist_logger() and logger.logger is logging.getLogger("ember")
    logger.info("epoch %d done", 1, ranks=[0])
    logger.info("not on this rank", ranks=[1])
    logger.debug("on every rank")
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("ember", "INFO", "epoch 1 done"),
        ("ember", "DEBUG", "on every rank"),
    ]
    assert caplog.records[0].filename == "test_logging.py"  # the caller, not ember/logging.py
    assert logging.getLogger("ember").propagate and not logging.getLogger("ember").handlers


def test_exception_critical_exc_info_and_stacklevel_work_with_ranks(caplog: pytest.LogCaptureFixture) -> None:
    logger = ember.get_dist_logger("ember.test")
    assert logger is ember.get_dist_logger("ember.test")

    def helper() -> None:
        logger.warning("blamed on the caller", stacklevel=2, ranks=[0])

    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("step %d failed", 7, ranks=[0])
        logger.error("with exc_info", exc_info=True)
    logger.critical("stop", ranks=[0, 1])
    helper()
    line = sys._getframe().f_lineno - 1
    records = {r.getMessage(): r for r in caplog.records}
    assert records["step 7 failed"].exc_info is not None and records["step 7 failed"].levelname == "ERROR"
    assert records["with exc_info"].exc_info is not None and "ValueError: boom" in caplog.text
    assert records["stop"].levelname == "CRITICAL"
    blamed = records["blamed on the caller"]
    assert blamed.lineno == line and blamed.funcName.startswith("test_")


def test_on_another_rank_records_for_rank_0_are_dropped_and_name_the_rank(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(distributed, "rank", lambda: 1)
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    logger = ember.get_dist_logger()
    logger.warning("rank 0 only", ranks=[0])
    logger.warning("everyone")
    logger.warning("ranks 1 and 2", ranks=(1, 2))
    kept = [(r.getMessage(), r.rank) for r in caplog.records]
    assert kept == [("everyone", " (rank 1)"), ("ranks 1 and 2", " (rank 1)")]


def _python(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


LAUNCH = "ember.launch(rank=0, world_size=1)"


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        # nothing configured: the library alone prints nothing; the launch sets up ember's own output
        ("", "", ["INFO ember: launched 1 process(es)", "WARNING ember: after"]),
        # the application configured logging first: its handler and format, ember adds none
        ("logging.basicConfig(format='APP %(name)s %(message)s', level=logging.INFO)", "",
         ["APP ember launched 1 process(es)", "APP ember after"]),
        # configured after the launch: the application's handler takes over, nothing printed twice
        ("", "logging.basicConfig(format='APP %(name)s %(message)s')", ["INFO ember: launched 1 process(es)",
                                                                         "APP ember after"]),
    ],
    ids=["unconfigured", "configured-before", "configured-after"],
)  # fmt: skip
def test_only_the_launch_sets_up_output_and_only_when_the_application_has_not(
    before: str, after: str, expected: list[str]
) -> None:
    code = (
        "import logging, ember\n"
        "ember.get_dist_logger().warning('before any launch')\n"  # Python's last resort: message only
        "assert not logging.getLogger('ember').handlers and logging.getLogger('ember').level == logging.NOTSET\n"
        f"{before}\n{LAUNCH}\n{after}\n"
        "ember.get_dist_logger().warning('after', ranks=[0])\n"
    )
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0] == "before any launch"
    assert len(lines) == 1 + len(expected)
    for line, want in zip(lines[1:], expected, strict=True):
        assert want in line

"""Console capture: ``logging`` handlers made before a run write through its tee, and are put back."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ember import track
from ember.track import store as st

LOGGER = "ember-test-console"


@pytest.fixture
def handler() -> Iterator[logging.StreamHandler[Any]]:
    """A StreamHandler on the logger :data:`LOGGER`, holding the stream ``sys.stderr`` is now (as
    ``logging.basicConfig()`` does)."""
    log = logging.getLogger(LOGGER)
    log.setLevel(logging.INFO)
    log.propagate = False
    made = logging.StreamHandler()
    log.addHandler(made)
    yield made
    for added in log.handlers[:]:
        if type(added) is logging.StreamHandler:  # not the handlers pytest adds
            log.removeHandler(added)


@pytest.fixture
def logger(handler: logging.StreamHandler[Any]) -> logging.Logger:
    """The logger the ``handler`` fixture is attached to."""
    return logging.getLogger(LOGGER)


def _log_text(run: track.Run) -> str:
    assert run.path is not None
    return (run.path / "stdout.log").read_text()


def test_a_handler_made_before_the_run_is_captured_and_given_back_its_stream(
    logger: logging.Logger, handler: logging.StreamHandler[Any]
) -> None:
    original = handler.stream
    run = track.create_run(name="logging")
    logger.info("epoch 1/3 with loss 0.25")
    run.finish()
    logger.info("after finish")
    assert handler.stream is original and sys.stderr is original
    log = _log_text(run)
    assert "epoch 1/3 with loss 0.25\n" in log and "after finish" not in log


def test_a_handler_on_stdout_is_captured_too(logger: logging.Logger) -> None:
    on_stdout = logging.StreamHandler(sys.stdout)
    logger.addHandler(on_stdout)
    run = track.create_run(name="logging-stdout")
    logger.info("to stdout and stderr")
    run.finish()
    assert on_stdout.stream is sys.stdout
    assert _log_text(run).count("to stdout and stderr\n") == 2  # through both handlers


def test_a_handler_made_during_the_run_is_captured_and_left_on_the_real_stream(logger: logging.Logger) -> None:
    original = sys.stderr
    run = track.create_run(name="logging-later")
    later = logging.StreamHandler()  # picks up sys.stderr: the run's tee
    logger.addHandler(later)
    logger.info("from the later handler")
    run.finish()
    assert later.stream is original  # not a finished run's tee that a next run would miss
    assert _log_text(run).count("from the later handler\n") == 2


def test_a_handler_given_another_stream_during_the_run_keeps_it(
    logger: logging.Logger, handler: logging.StreamHandler[Any]
) -> None:
    run = track.create_run(name="logging-moved")
    elsewhere = io.StringIO()
    handler.setStream(elsewhere)
    logger.info("to the StringIO")
    run.finish()
    assert handler.stream is elsewhere and elsewhere.getvalue() == "to the StringIO\n"
    assert "to the StringIO" not in _log_text(run)


@pytest.mark.parametrize("first_finished", ["inner", "outer"])
def test_two_open_runs_both_capture_and_every_stream_ends_unwrapped(
    logger: logging.Logger, handler: logging.StreamHandler[Any], first_finished: str
) -> None:
    original = handler.stream
    outer = track.create_run(name="outer")
    logger.info("only outer")
    inner = track.create_run(name="inner")
    logger.info("both")
    (inner if first_finished == "inner" else outer).finish()
    logger.info("after the first finish")
    (outer if first_finished == "inner" else inner).finish()
    logger.info("after both")
    assert handler.stream is original and sys.stderr is original
    still_open = outer if first_finished == "inner" else inner
    assert _log_text(outer).startswith("only outer\nboth\n")
    assert _log_text(inner).startswith("both\n")
    for run in (outer, inner):
        log = _log_text(run)
        assert ("after the first finish" in log) == (run is still_open)
        assert "after both" not in log


def test_finishing_twice_puts_nothing_back_the_second_time(handler: logging.StreamHandler[Any]) -> None:
    original = handler.stream
    run = track.create_run(name="twice")
    run.finish()
    elsewhere = io.StringIO()
    handler.setStream(elsewhere)
    run.finish()
    assert handler.stream is elsewhere and sys.stderr is original


def test_a_no_op_run_of_another_rank_touches_no_stream(
    handler: logging.StreamHandler[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "1")
    original_out, original_err = sys.stdout, handler.stream
    run = track.create_run(name="rank1")
    assert not run.active
    assert sys.stdout is original_out and sys.stderr is original_err and handler.stream is original_err
    run.finish()
    assert sys.stderr is original_err and handler.stream is original_err


def test_a_program_that_dies_keeps_its_logging_lines_and_traceback(store: Path, tmp_path: Path) -> None:
    """The seed's shape: basicConfig at import, the run after it, an uncaught error ends the process."""
    script = tmp_path / "dies.py"
    script.write_text(
        textwrap.dedent(
            """
            import logging
            from ember import track

            logging.basicConfig(format="%(message)s", level=logging.INFO)
            run = track.create_run(name="dies")
            logging.info("epoch 1/10, batch 250/1875 with loss: 0.4321")
            raise ValueError("diverged")
            """
        )
    )
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "EMBER_HOME": str(store)},
    )
    assert proc.returncode == 1 and "epoch 1/10" in proc.stderr  # still on the console
    (info,) = st.list_runs(store)
    assert info.status == "Failed"
    log = (info.path / "stdout.log").read_text()
    assert "epoch 1/10, batch 250/1875 with loss: 0.4321\n" in log
    assert log.rstrip().endswith("ValueError: diverged")

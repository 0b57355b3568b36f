"""The buffered, append-only writer behind ``Run.log`` and the stdout/stderr tee.

``Run.log`` only validates and appends a tuple to a list under a lock. A daemon thread wakes
every ``interval`` seconds (sooner when many points wait), encodes the waiting points and
appends them to ``metrics/<type>.jsonl`` with one ``os.write`` per file per flush, through
file descriptors opened once. Nothing is fsynced: a crash loses at most the last interval.
Unbuffered descriptors also mean a forked child (a DataLoader worker) holds no copy of
unwritten bytes that it could write a second time.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from time import time as _time
from typing import Any, TextIO

from ember.track._fs import write_all
from ember.track._values import encode_batch

FLUSH_INTERVAL_S = 0.5
_WAKE_AT = 50_000


class LogSink:
    """Text written to the tee'd streams, waiting for the flusher."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parts: list[str] = []
        self.enabled = True

    def write(self, text: object) -> None:
        if self.enabled and type(text) is str and text:
            with self._lock:
                self._parts.append(text)

    def drain(self) -> bytes:
        with self._lock:
            parts, self._parts = self._parts, []
        return "".join(parts).encode("utf-8", errors="replace")


class TeeStream:
    """Wraps a text stream: writes go to it and to a :class:`LogSink`; the rest is delegated."""

    def __init__(self, original: TextIO, sink: LogSink) -> None:
        self._original = original
        self._sink = sink
        self.active = True

    def write(self, text: str) -> int:
        n = self._original.write(text)
        if self.active:
            self._sink.write(text)
        return n

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._original.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._original, name)


def install_tee(sink: LogSink) -> tuple[TeeStream, TeeStream]:
    """Wrap the current ``sys.stdout`` and ``sys.stderr`` in tees writing to ``sink``."""
    out = TeeStream(sys.stdout, sink)
    err = TeeStream(sys.stderr, sink)
    if sys.stdout is not None:  # None under pythonw or a daemon with closed streams
        sys.stdout = out
    if sys.stderr is not None:
        sys.stderr = err
    return out, err


def remove_tee(out: TeeStream, err: TeeStream) -> None:
    """Put back the streams the tees wrapped; a tee someone has wrapped since only goes quiet."""
    out.active = err.active = False
    if sys.stdout is out:
        sys.stdout = out._original
    if sys.stderr is err:
        sys.stderr = err._original


class Writer:
    """Buffers points and console text of one run and appends them from a daemon thread."""

    def __init__(
        self,
        folder: Path,
        tick: Callable[[], None],
        interval: float,
        last_steps: dict[str, int] | None = None,
    ) -> None:
        self._metrics_dir = folder / "metrics"
        self._stdout_path = folder / "stdout.log"
        self._tick = tick
        self._interval = interval
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._pending: list[tuple] = []
        self._fds: dict[str, int] = {}
        self._wake = threading.Event()
        self._closing = False
        self.error: str | None = None
        self.last_steps: dict[str, int] = dict(last_steps or {})
        self.sink = LogSink()
        self._thread = threading.Thread(target=self._loop, name=f"ember-track-writer-{folder.name}", daemon=True)
        self._thread.start()

    def add(self, type_: str, step: int, epoch: int | float | None, names: tuple[str, ...], values: tuple) -> None:
        """Queue one point stamped with the current time (``Run.log``'s hot path)."""
        with self._lock:
            pending = self._pending
            pending.append((type_, step, epoch, _time(), names, *values))
            last = self.last_steps.get(type_)
            if last is None or step > last:
                self.last_steps[type_] = step
        if len(pending) >= _WAKE_AT:
            self._wake.set()

    def _fd(self, key: str, path: Path) -> int:
        fd = self._fds.get(key)
        if fd is None:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._fds[key] = fd
        return fd

    def flush(self) -> None:
        """Append everything queued so far to the files (no fsync)."""
        with self._flush_lock:
            with self._lock:
                batch, self._pending = self._pending, []
            try:
                if batch:
                    for type_, chunk in encode_batch(batch).items():
                        fd = self._fd(type_, self._metrics_dir / f"{type_}.jsonl")
                        write_all(fd, "".join(chunk).encode("utf-8"))
                text = self.sink.drain()
                if text:
                    write_all(self._fd(":stdout", self._stdout_path), text)
            except OSError as e:
                self.error = (
                    f"writing to {self._metrics_dir.parent} failed ({e}); up to {len(batch)} "
                    "points and some console output were lost"
                )

    def _loop(self) -> None:
        while not self._closing:
            self._wake.wait(self._interval)
            self._wake.clear()
            if self._closing:
                break
            self.flush()
            self._tick()

    def close(self) -> None:
        """Stop the thread, write what is left and close the files."""
        self._closing = True
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        self.flush()
        self.sink.enabled = False
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def forget_after_fork(self) -> None:
        """In a forked child: drop the parent's queued data and descriptors, never write."""
        # Another thread may have held these locks at the fork: the child gets fresh ones.
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._pending = []
        self.sink.enabled = False
        self.sink._lock = threading.Lock()
        self.sink._parts = []
        self._closing = True
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

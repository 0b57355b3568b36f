"""The buffered, append-only writer behind ``Run.log`` and the stdout/stderr tee.

``Run.log`` only validates and appends a tuple to a :class:`collections.deque` (an atomic
append under the GIL: no lock per call). A daemon thread wakes every ``interval`` seconds
(sooner when many points wait), takes the points queued so far off the front of the deque,
encodes them and appends them to ``metrics/<type>.jsonl`` with one ``os.write`` per file per
chunk of points, through file descriptors opened once. Nothing is fsynced: a crash loses at
most the last interval.
Unbuffered descriptors also mean a forked child (a DataLoader worker) holds no copy of
unwritten bytes that it could write a second time.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from ember.track._fs import write_all
from ember.track._values import Record, encode_batch

FLUSH_INTERVAL_S = 0.5
# Queued points that wake the writer before its interval is up: bounds the memory a tight
# logging loop holds (a queued point of one metric takes about 300 bytes).
WAKE_AT = 50_000
# Points encoded and written at a time: bounds the text held in memory during a flush.
_CHUNK = 10_000


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
    """Buffers points and console text of one run and appends them from a daemon thread.

    ``Run.log`` appends records (see :data:`ember.track._values.Record`) to :attr:`queue` itself
    and calls :meth:`wake` when it holds :data:`WAKE_AT` of them; everything else happens
    under the flush lock.
    """

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
        self._flush_lock = threading.Lock()
        self.queue: deque[Record] = deque()
        self._fds: dict[str, int] = {}
        self._wake = threading.Event()
        self._closing = False
        self.error: str | None = None
        self._last_steps: dict[str, int] = dict(last_steps or {})
        self.sink = LogSink()
        self._thread = threading.Thread(target=self._loop, name=f"ember-track-writer-{folder.name}", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Flush now instead of at the end of the interval."""
        # Run.log calls this at every point while WAKE_AT or more wait; Event.set takes a lock.
        if not self._wake.is_set():
            self._wake.set()

    def last_step(self, type_: str) -> int | None:
        """The highest step of ``type_`` queued or written (or given at creation), or None."""
        with self._flush_lock:  # never between a point leaving the queue and being counted
            top = self._last_steps.get(type_, -1)
            for record in list(self.queue):  # list() copies the deque in one step under the GIL
                if record[0] == type_ and record[2] > top:
                    top = record[2]
        return None if top < 0 else top

    def _fd(self, key: str, path: Path) -> int:
        fd = self._fds.get(key)
        if fd is None:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._fds[key] = fd
        return fd

    def flush(self) -> None:
        """Append everything queued so far to the files (no fsync)."""
        with self._flush_lock:
            popleft = self.queue.popleft
            left = len(self.queue)  # points queued from now on wait for the next flush
            lost = 0
            try:
                while left:
                    n = lost = min(left, _CHUNK)
                    chunk = [popleft() for _ in range(n)]
                    for type_, lines in encode_batch(chunk, self._last_steps).items():
                        write_all(self._fd(type_, self._metrics_dir / f"{type_}.jsonl"), "".join(lines).encode())
                    left -= n
                lost = 0
                text = self.sink.drain()
                if text:
                    write_all(self._fd(":stdout", self._stdout_path), text)
            except OSError as e:
                # The points still queued stay there for the next flush to try again.
                self.error = (
                    f"writing to {self._metrics_dir.parent} failed ({e}); up to {lost} points "
                    "or some console output were lost"
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
        # Another thread may have held this lock at the fork: the child gets a fresh one.
        self._flush_lock = threading.Lock()
        self.queue = deque()
        self.sink.enabled = False
        self.sink._lock = threading.Lock()
        self.sink._parts = []
        self._closing = True
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

"""The buffered, append-only writer behind ``Run.log`` and the stdout/stderr tee.

``Run.log`` only validates a point and puts it in a :class:`~ember.track._queue.PointQueue`
(one ``list.extend``, atomic under the GIL: no lock per call). A daemon thread wakes every
``interval`` seconds (sooner when the list grows long), encodes the points queued so far, appends
them to ``metrics/<type>.jsonl`` with one ``os.write`` per file per chunk of points, through file
descriptors opened once, and then drops them from the front of the queue. Nothing is fsynced: a
crash loses at most the last interval. The queue is bounded: at :data:`MAX_QUEUED` slots
``Run.log`` waits for the writer (a tight loop logs at the writer's pace, in bounded memory).
Unbuffered descriptors also mean a forked child (a DataLoader worker) holds no copy of
unwritten bytes that it could write a second time.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from ember.track._fs import write_all
from ember.track._queue import PointQueue

FLUSH_INTERVAL_S = 0.5
# Queued slots (7 for a point of one metric, 2 more a metric) that wake the writer before its
# interval is up, about 20 bytes a slot (a point of one metric takes 140 bytes with its float
# value, time and step), so about 20 MB.
WAKE_AT = 1 << 20
# Queued slots at which Run.log waits for the writer to catch up (about 40 MB, ~300,000 points of
# one metric): a loop that logs faster than the points can be formatted and written is slowed to
# the writer's pace instead of holding every point in memory.
MAX_QUEUED = 2 * WAKE_AT
# Points encoded and written at a time: bounds the text held during a flush, and the time the
# writer holds the GIL in one C call (~4 ms here, under the 5 ms switch interval; 20,000 at a
# time halved the rate of a thread logging meanwhile).
_CHUNK = 5_000


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


def _unwrapped(stream: Any) -> Any:
    """``stream`` without the tees of finished runs around it (they only pass writes on)."""
    while isinstance(stream, TeeStream) and not stream.active:
        stream = stream._original
    return stream


def _logging_handlers() -> list[logging.StreamHandler[Any]]:
    """The stream handlers attached to a logger of the ``logging`` tree, the root's first."""
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    found: dict[int, logging.StreamHandler[Any]] = {}
    for logger in loggers:
        for handler in getattr(logger, "handlers", ()):  # a PlaceHolder has none
            if isinstance(handler, logging.StreamHandler):
                found.setdefault(id(handler), handler)
    return list(found.values())


class ConsoleTee:
    """One run's capture of console output into a :class:`LogSink`.

    ``sys.stdout`` and ``sys.stderr`` are each wrapped in a :class:`TeeStream`. A ``logging``
    handler made before the run (``logging.basicConfig()`` at import time, say) holds the
    stream object itself, not ``sys.stderr``, so it would bypass the wrapper: each handler of
    the logging tree whose stream *is* one of the two wrapped streams is pointed at its tee
    while the run is open. :meth:`remove` points back every handler that still writes to a
    tee of this run, those made during the run included (``logging.StreamHandler()`` picks
    up ``sys.stderr``, which was the tee); a handler given another stream meanwhile is left
    alone. Tees nest: a second run open at the same time wraps the first one's tees.
    """

    def __init__(self, sink: LogSink) -> None:
        self.out = TeeStream(sys.stdout, sink)
        self.err = TeeStream(sys.stderr, sink)
        if sys.stdout is not None:  # None under pythonw or a daemon with closed streams
            sys.stdout = self.out
        if sys.stderr is not None:
            sys.stderr = self.err
        self._handlers: list[logging.StreamHandler[Any]] = []
        for handler in _logging_handlers():
            tee = self._tee_of(handler.stream, wrapped=True)
            if tee is not None and handler.setStream(tee) is not None:
                self._handlers.append(handler)

    def _tee_of(self, stream: object, wrapped: bool) -> TeeStream | None:
        """The tee whose wrapped stream (or, with ``wrapped=False``, which itself) is ``stream``."""
        for tee in (self.out, self.err):
            if stream is (tee._original if wrapped else tee) and tee._original is not None:
                return tee
        return None

    def remove(self) -> None:
        """Stop capturing; put back the streams (and handlers) that still hold this run's tees.

        A stream someone replaced since the run started (pytest's capture, say) is left in
        place and the tee inside it only goes quiet. Calling it again does nothing.
        """
        self.out.active = self.err.active = False
        if sys.stdout is self.out:
            sys.stdout = _unwrapped(self.out)
        if sys.stderr is self.err:
            sys.stderr = _unwrapped(self.err)
        handlers = {id(h): h for h in [*self._handlers, *_logging_handlers()]}
        for handler in handlers.values():
            tee = self._tee_of(handler.stream, wrapped=False)
            if tee is not None:
                handler.setStream(_unwrapped(tee))
        self._handlers.clear()


class Writer:
    """Buffers points and console text of one run and appends them from a daemon thread.

    ``Run.log`` puts points in :attr:`pending` itself and calls :meth:`wake` when it holds
    :data:`WAKE_AT` slots; everything else happens under the flush lock. Only the writer takes
    points off, from the front; the queue is never replaced while the run is open, so a caller
    holding it cannot add to a queue nobody reads.
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
        self.pending = PointQueue()
        self._fds: dict[str, int] = {}
        self._wake = threading.Event()
        self._room = threading.Condition()  # notified when a flush took points off the queue
        self._closing = False
        self.error: str | None = None
        self.stopped: str | None = None  # set when the thread died of a bug: every later call says so
        self._last_steps: dict[str, int] = dict(last_steps or {})
        self.sink = LogSink()
        self._thread = threading.Thread(target=self._loop, name=f"ember-track-writer-{folder.name}", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Flush now instead of at the end of the interval; wait while :data:`MAX_QUEUED` slots are queued."""
        # Run.log calls this at every point while WAKE_AT or more wait; Event.set takes a lock.
        if not self._wake.is_set():
            self._wake.set()
        if self.pending.end() >= MAX_QUEUED:
            self._wait_for_room()

    def _wait_for_room(self) -> None:
        """Block the logging thread until the writer has taken points off a full queue.

        Not when the writer cannot do so: it stopped, a write failed (the next ``log`` raises
        that error), the run is closing, or this is the writer thread itself.
        """
        if threading.current_thread() is self._thread:
            return
        with self._room:
            while (
                self.pending.end() >= MAX_QUEUED
                and self.error is None
                and not self._closing
                and self._thread.is_alive()
            ):
                self._wake.set()
                self._room.wait(0.1)

    def last_step(self, type_: str) -> int | None:
        """The highest step of ``type_`` queued or written (or given at creation), or None."""
        with self._flush_lock:  # never between a point leaving the queue and being counted
            top = max((step for queued, step in self.pending.points() if queued == type_), default=-1)
            top = max(top, self._last_steps.get(type_, -1))
        return None if top < 0 else top

    def queued(self) -> int:
        """How many points wait in :attr:`pending`."""
        return sum(1 for _ in self.pending.points())

    def _fd(self, key: str, path: Path) -> int:
        fd = self._fds.get(key)
        if fd is None:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._fds[key] = fd
        return fd

    def flush(self) -> None:
        """Append everything queued so far to the files (no fsync)."""
        with self._flush_lock:
            pending = self.pending
            end = pending.end()  # points queued from now on wait for the next flush
            done = lost = 0
            try:
                while done < end:
                    texts, done, lost = pending.encode(done, end, self._last_steps, _CHUNK)
                    for type_, lines in texts.items():
                        write_all(self._fd(type_, self._metrics_dir / f"{type_}.jsonl"), "".join(lines).encode())
                lost = 0
                text = self.sink.drain()
                if text:
                    write_all(self._fd(":stdout", self._stdout_path), text)
            except OSError as e:
                # The points of the chunk that failed are lost; those after it stay queued for
                # the next flush to try again.
                self.error = (
                    f"writing to {self._metrics_dir.parent} failed ({e}); up to {lost} points "
                    "or some console output were lost"
                )
            finally:
                pending.advance(done)  # Run.log only ever adds at the end: this is all ours
                with self._room:
                    self._room.notify_all()

    def _loop(self) -> None:
        try:
            while not self._closing:
                self._wake.wait(self._interval)
                self._wake.clear()
                if self._closing:
                    break
                self.flush()
                self._tick()
        except Exception as e:
            # A bug, not a disk error (flush handles OSError): the next log()/flush() raises it
            # (Run checks writer.error), and threading's excepthook prints the traceback.
            self.stopped = f"the background writer of {self._metrics_dir.parent} stopped: {e!r}"
            self.error = self.stopped
            raise

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
        self._room = threading.Condition()
        self.pending = PointQueue()
        self.sink.enabled = False
        self.sink._lock = threading.Lock()
        self.sink._parts = []
        self._closing = True
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

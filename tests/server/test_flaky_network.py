"""Uploads survive a flaky network (issue 22, item 5): retries with backoff and jitter, a deadline, a clear final error.

The server is a real ``ember server`` process; in front of it, an httpx transport refuses
connections, loses answers after the server did the work, and answers 503, 429 and the
server's own 409 "retry" at random.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.exc import IntegrityError

from ember import track
from ember.server.api import errors
from ember.track import client as client_mod
from ember.track.client import Client, Credentials, ServerUnavailable, UploadError, upload_run
from ember.track.retry import Retry, retry_after, should_retry
from tests.server._runs import sha256, train_tiny
from tests.server.conftest import Server, ServerProcess

QUICK = Retry(deadline_s=20.0, base_s=0.01, max_backoff_s=0.05)
FAULTS = ("refused", "answer lost", "503", "429", "409 retry")


class Flaky(httpx.BaseTransport):
    """A real connection to the server, with a fault instead of it one time in three."""

    def __init__(self, seed: int, rate: float = 1 / 3) -> None:
        self.inner = httpx.HTTPTransport()
        self.rng, self.rate = random.Random(seed), rate
        self.faults: Counter[str] = Counter()
        self.sent = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        fault = self.rng.choice(FAULTS) if self.rng.random() < self.rate else None
        if fault is not None:
            self.faults[fault] += 1
        if fault == "refused":
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        if fault == "503":
            return httpx.Response(503, text="Service Unavailable")
        if fault == "429":
            return httpx.Response(429, headers={"Retry-After": "0"}, json={"detail": "too many requests"})
        if fault == "409 retry":  # what ember.server.api.errors answers when a concurrent request won
            detail = {"detail": "a concurrent request changed the same data; retry the request"}
            return httpx.Response(409, headers={"Retry-After": "0"}, json=detail)
        self.sent += 1
        response = self.inner.handle_request(request)
        if fault == "answer lost":  # the server did the work; the client never hears of it
            response.read()
            response.close()
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)
        return response

    def close(self) -> None:
        self.inner.close()


def _stored(proc: ServerProcess, key: str, path: str, **params: str) -> Any:
    r = httpx.get(f"{proc.url}/api/v1{path}", params=params, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json() if r.headers["content-type"].startswith("application/json") else r.content


def test_an_upload_through_a_flaky_network_is_complete_and_has_nothing_twice(
    server_process: tuple[ServerProcess, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc, key = server_process
    monkeypatch.setattr(client_mod, "BATCH_LINES", 3)  # many small requests: every fault happens
    run, weights = train_tiny(tmp_path / "store", steps=40)
    run.finish()
    flaky = Flaky(seed=22)
    http = httpx.Client(base_url=proc.url, transport=flaky)
    with Client(Credentials(proc.url, key), http=http, retry=QUICK) as client:
        upload_run(run.path, folder="flaky", make_folder=True, client=client)
        upload_run(run.path, client=client)  # again, through the same faults: nothing new, nothing twice
    assert set(flaky.faults) == set(FAULTS) and sum(flaky.faults.values()) >= 10, flaky.faults
    local = sum(len(json.loads(line)["metrics"]) for f in (run.path / "metrics").glob("*.jsonl") for line in f.open())
    got = _stored(proc, key, f"/runs/{run.id}")
    assert sum(m["count"] for m in got["metrics"]) == local
    assert [p["step"] for p in _stored(proc, key, f"/runs/{run.id}/metrics", type="train")["points"]] == list(range(40))
    assert "step 9 loss" in _stored(proc, key, f"/runs/{run.id}/log")["text"]
    art = next(e["target"] for e in got["lineage"] if e["target"]["kind"] == "artifact")
    assert _stored(proc, key, f"/artifacts/{art['id']}/files/model.pt") == weights.read_bytes()
    assert len(got["lineage"]) == len((run.path / "lineage.jsonl").read_text().splitlines())
    assert sha256(weights)


def test_a_server_that_stays_down_fails_at_the_deadline_naming_it_and_what_was_kept(
    server: Server, tmp_path: Path
) -> None:
    run, _ = train_tiny(tmp_path / "store", steps=5)
    run.finish()
    times: list[float] = []

    def unavailable(request: httpx.Request) -> httpx.Response:
        times.append(time.monotonic())
        return httpx.Response(503, text="Service Unavailable")

    http = httpx.Client(base_url="http://flaky.example:8765", transport=httpx.MockTransport(unavailable))
    retry = Retry(deadline_s=1.5, base_s=0.05, max_backoff_s=0.4)
    client = Client(Credentials("http://flaky.example:8765", "k"), http=http, retry=retry)
    started = time.monotonic()
    with pytest.raises(ServerUnavailable) as caught:
        upload_run(run.path, client=client)
    elapsed = time.monotonic() - started
    message = str(caught.value)
    assert message.startswith("cannot reach the tracking server http://flaky.example:8765: PUT /runs/")
    assert f"failed {len(times)} time(s)" in message and "the last with 503 Service Unavailable" in message
    assert f"Nothing is lost: the run {run.path} stays complete in the local store" in message
    assert f"`ember upload {run.path}` continues" in message
    assert 0.8 <= elapsed <= 1.5 + 0.2 and len(times) >= 4  # retried until the deadline, not past it
    waits = [b - a for a, b in itertools.pairwise(times)]
    assert max(waits) <= 0.4 + 0.1  # the backoff's ceiling


def test_backoff_is_exponential_with_full_jitter_and_respects_retry_after() -> None:
    retry = Retry(base_s=0.5, max_backoff_s=8.0)
    rng = random.Random(0)
    draws = {n: [retry.backoff(n, rng) for _ in range(2000)] for n in range(6)}
    for n, values in draws.items():
        ceiling = min(8.0, 0.5 * 2**n)
        assert all(0.0 <= v <= ceiling for v in values)
        assert statistics.mean(values) == pytest.approx(ceiling / 2, rel=0.1)  # uniform over [0, ceiling]
        assert len({round(v, 6) for v in values}) > 1900  # jittered: clients cut off together spread out
    assert retry_after({"Retry-After": "3"}) == 3.0 and retry_after({}) is None
    assert retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0  # a date in the past
    assert [should_retry(s, {}) for s in (429, 500, 502, 503, 504, 409, 404)] == [1, 0, 1, 1, 1, 0, 0]
    assert should_retry(409, {"Retry-After": "1"})


def test_the_server_marks_its_conflict_409_for_retry_and_the_cursor_409_is_final(
    server: Server, tmp_path: Path
) -> None:
    answer = asyncio.run(errors._conflict(None, IntegrityError("INSERT", {}, Exception("unique"))))  # type: ignore[arg-type]
    assert answer.status_code == 409 and answer.headers["retry-after"] == "1"
    run, _ = train_tiny(tmp_path / "store", steps=3)
    run.finish()
    client = Client(Credentials("http://testserver", server.keys["alice"]), http=server.client, retry=QUICK)
    upload_run(run.path, client=client)
    started = time.monotonic()
    with pytest.raises(UploadError, match=r"409: stdout\.log: the server has bytes up to") as caught:
        client.call("POST", f"/runs/{run.id}/log", json={"start": 10**6, "end": 10**6 + 1, "text": "x"})
    assert not isinstance(caught.value, ServerUnavailable) and time.monotonic() - started < 1


def test_the_auto_uploader_keeps_one_client_for_the_run(
    server_process: tuple[ServerProcess, str], home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc, key = server_process
    monkeypatch.setenv("EMBER_HOST", proc.url)
    monkeypatch.setenv("EMBER_API_KEY", key)
    monkeypatch.setattr(client_mod.AutoUploader.__init__, "__defaults__", (0.05, QUICK))
    made: list[Client] = []

    class Counted(Client):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(client_mod, "Client", Counted)
    run = track.create_run(name="auto", home=tmp_path / "store", auto_upload=True)
    for step in range(20):
        run.log("train", {"loss": float(step)}, step=step)
        run.flush()
        time.sleep(0.03)  # several uploads while it trains
    run.finish()
    got = _stored(proc, key, f"/runs/{run.id}")
    assert sum(m["count"] for m in got["metrics"]) == 20 and got["status"] == "Complete"
    assert len(made) == 1  # one connection pool for the run's life, not one per upload

"""Case 2, tracking cost: metric values logged in a tight loop, and the tracked Trainer.

Logging: each contender logs ``n`` values of one metric at steps 0..n-1 (one value per call,
or per row for ``log_batch``). Timed: the loop, then the call that makes the data durable
(``Run.finish``, ``mlflow.end_run``, ``SummaryWriter.close``). Reported: values/s enqueued
(the loop alone), the time until durable, and overall values/s. The work check reads the
values back from the store (outside the timer) and reports the fraction found (must be 1).
``enqueue_values_per_cpu_s`` (in the JSON) divides by the calling thread's CPU time in the loop
instead of wall time: the caller's own cost, less sensitive to a loaded machine.
MLflow's one-call-per-value paths are too slow for 100,000 values: they log fewer, and the
ratios are per value.

Trainer: the tiny MLP of case 1 with the Colossal-AI tutorial's hooks, with and without a ``TrackingHook``
logging loss and LR at every step; ``ember.track`` is imported before the timer (imports are set-up).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks.harness import Contender, Group, Outcome, Timer

M = "benchmarks.case_tracking"


def _values(n: int) -> list[float]:
    return [1.0 / (i + 1) for i in range(n)]


def _rates(n: int, enqueue_s: float, total_s: float, enqueue_cpu_s: float) -> dict[str, float]:
    return {
        "enqueue_values_per_s": n / enqueue_s if enqueue_s > 0 else float("inf"),
        "enqueue_values_per_cpu_s": n / enqueue_cpu_s if enqueue_cpu_s > 0 else float("inf"),
        "values_per_s": n / total_s if total_s > 0 else float("inf"),
        "durable_s": total_s,
    }


def ember_log(params: Mapping[str, Any], timer: Timer) -> Outcome:
    """``Run.log`` one value per call; durable after ``run.finish()``."""
    from ember import track

    n = int(params["n"])
    values = _values(n)
    run = track.create_run(name="bench", home=os.environ.get("EMBER_HOME", ".ember"))
    log = run.log
    with timer:
        c0, t0 = time.thread_time(), time.perf_counter()
        for i, v in enumerate(values):
            log("train", {"loss": v}, step=i)
        t1, c1 = time.perf_counter(), time.thread_time()
        run.finish()
        t2 = time.perf_counter()
    assert run.path is not None
    with open(Path(run.path) / "metrics" / "train.jsonl", "rb") as f:
        stored = sum(1 for _ in f)
    return Outcome(work=stored / n, extra=_rates(n, t1 - t0, t2 - t0, c1 - c0))


def _mlflow(uri: str) -> Any:
    import logging

    import mlflow

    logging.getLogger("mlflow").setLevel(logging.ERROR)
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("bench")
    return mlflow


def _mlflow_stored(mlflow: Any, run_id: str) -> int:
    return len(mlflow.MlflowClient().get_metric_history(run_id, "loss"))


def mlflow_log_metric(params: Mapping[str, Any], timer: Timer) -> Outcome:
    """``mlflow.log_metric`` one value per call, on ``params["store"]`` (sqlite or file)."""
    store = str(params["store"])
    uri = f"sqlite:///{Path.cwd() / 'mlflow.db'}" if store == "sqlite" else (Path.cwd() / "mlruns").as_uri()
    mlflow = _mlflow(uri)
    n = int(params["n"])
    values = _values(n)
    run = mlflow.start_run()
    with timer:
        c0, t0 = time.thread_time(), time.perf_counter()
        for i, v in enumerate(values):
            mlflow.log_metric("loss", v, step=i)
        t1, c1 = time.perf_counter(), time.thread_time()
        mlflow.end_run()
        t2 = time.perf_counter()
    return Outcome(work=_mlflow_stored(mlflow, run.info.run_id) / n, extra=_rates(n, t1 - t0, t2 - t0, c1 - c0))


def mlflow_log_batch(params: Mapping[str, Any], timer: Timer) -> Outcome:
    """``MlflowClient.log_batch`` with 1,000 values per call (MLflow's cap), on SQLite."""
    from mlflow.entities import Metric

    mlflow = _mlflow(f"sqlite:///{Path.cwd() / 'mlflow.db'}")
    n, per_call = int(params["n"]), 1000
    values = _values(n)
    client = mlflow.MlflowClient()
    run = mlflow.start_run()
    run_id = run.info.run_id
    with timer:
        c0, t0 = time.thread_time(), time.perf_counter()
        for start in range(0, n, per_call):
            now = int(time.time() * 1000)
            rows = [Metric("loss", values[i], now, i) for i in range(start, min(n, start + per_call))]
            client.log_batch(run_id, metrics=rows, synchronous=True)
        t1, c1 = time.perf_counter(), time.thread_time()
        mlflow.end_run()
        t2 = time.perf_counter()
    return Outcome(work=_mlflow_stored(mlflow, run_id) / n, extra=_rates(n, t1 - t0, t2 - t0, c1 - c0))


def tensorboard_add_scalar(params: Mapping[str, Any], timer: Timer) -> Outcome:
    """``SummaryWriter.add_scalar`` one value per call; durable after ``close()``."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from torch.utils.tensorboard import SummaryWriter

    n = int(params["n"])
    values = _values(n)
    logdir = Path.cwd() / "tb"
    writer = SummaryWriter(str(logdir))
    with timer:
        c0, t0 = time.thread_time(), time.perf_counter()
        for i, v in enumerate(values):
            writer.add_scalar("loss", v, i)
        t1, c1 = time.perf_counter(), time.thread_time()
        writer.close()
        t2 = time.perf_counter()
    stored = sum(
        len(event.summary.value)
        for path in logdir.glob("events.out.tfevents.*")
        for event in EventFileLoader(str(path)).Load()
        if event.HasField("summary")
    )
    return Outcome(work=stored / n, extra=_rates(n, t1 - t0, t2 - t0, c1 - c0))


def ember_trainer_tracked(params: Mapping[str, Any], timer: Timer) -> Outcome:
    """``case_step.ember_trainer`` with ``ember.track`` imported before the timer, like every other
    import (``TrackingHook`` imports it in ``before_train``; without bytecode caches, as under
    ``PYTHONDONTWRITEBYTECODE=1``, that import compiles the package: ~20 ms of CPU)."""
    import ember.track  # noqa: F401
    from benchmarks.case_step import ember_trainer

    return ember_trainer(params, timer)


def groups(quick: bool = False, with_peers: bool = True) -> list[Group]:
    """Logging 100,000 values (scaled for MLflow), and the tracked vs untracked Trainer."""
    n = 2_000 if quick else 100_000
    logging_contenders = [Contender("ember Run.log", f"{M}:ember_log", params={"n": n})]
    if with_peers:
        logging_contenders += [
            Contender("MLflow log_metric (SQLite)", f"{M}:mlflow_log_metric", ("mlflow",),
                      {"store": "sqlite", "n": 50 if quick else 500}),
            Contender("MLflow log_metric (file store)", f"{M}:mlflow_log_metric", ("mlflow",),
                      {"store": "file", "n": 200 if quick else 2_000}),
            Contender("MLflow log_batch x1000 (SQLite)", f"{M}:mlflow_log_batch", ("mlflow",),
                      {"n": 2_000 if quick else 20_000}),
            Contender("TensorBoard add_scalar", f"{M}:tensorboard_add_scalar", ("tensorboard",), {"n": n}),
        ]  # fmt: skip
    step = "benchmarks.case_step:ember_trainer"
    mlp = {"model": "mlp", "batch_size": 64, "batches": 200, "epochs": 10, "seed": 0}
    if quick:
        mlp.update(batches=10, epochs=2)
    trainer_contenders = (
        Contender("ember Trainer, default hooks", step, params={"hooks": "default"}),
        Contender("ember Trainer, default hooks + TrackingHook every step", f"{M}:ember_trainer_tracked",
                  params={"hooks": "default+tracking"}),
    )  # fmt: skip
    return [
        Group(f"logging {n:,} metric values", tuple(logging_contenders), "ember Run.log", {}, rel_tol=0.0,
              unit="fraction stored", scale_key="n"),
        Group("tiny MLP Trainer: tracked vs untracked", trainer_contenders, "ember Trainer, default hooks", mlp),
    ]  # fmt: skip

"""Per-step overhead in one process: the hand loop, the Engine loop and the Trainer, interleaved.

``python -m benchmarks.overhead [--model mlp|linear] [--rounds 15] [--short N] [--parts]``

Case 1 runs every measurement in a fresh process. That isolates the contenders, but on a VM
with noisy neighbours a process's speed moves by ~10% from one run to the next (the hand
loop's tiny-MLP time spanned 1.52–2.14 s within one 5-round run), more than the 2% target.
Here each contender is built once, in one process, and the rounds alternate between them: a
round is one whole run per contender, as long as case 1's (``epochs`` epochs of ``batches``
batches), in an order rotated by the round number. Neighbouring runs share the machine's
state of the moment, so on a quiet day the per-round paired ratio is stable to about 1%. On a
busy one (paired ratios spanning 0.7–1.8× within a run) read each contender's fastest run
instead: neighbours only ever add time, so the minimum is the estimate they touch least.

The last contender is the hand loop doing the work the default hooks ask for (each epoch's mean
loss from every batch's loss, the per-epoch LR schedule, a log line per epoch): the Trainer's
ratio to it is ember's own cost, the ratio to the bare hand loop includes that work.

``--model linear`` trains a single 8→10 linear layer, where a step is almost all framework and
dispatch overhead: the difference to the hand loop is then the Python that ember adds per
step, in µs. Unlike callgrind's instruction counts (:mod:`benchmarks.instructions`), this is
time: the interpreter runs far fewer instructions per cycle than a vectorised GEMM, so a 2%
instruction overhead can cost 5% of the time.

Every contender trains its own copy of the same seeded model on the same batches, so they
end with the same loss (checked). Writes
``benchmarks/results/<date>-<host>-overhead-<model>.{json,md}``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import ember
from benchmarks import case_step
from benchmarks.workloads import Workload
from ember.trainer.hooks import BaseHook

RESULTS = Path(__file__).resolve().parent / "results"
CONTENDERS = (
    "hand loop", "ember Engine loop", "ember Trainer, no hooks", "ember Trainer, default hooks",
    "hand loop, the default hooks' work",
)  # fmt: skip
PARTS = (
    "hand loop", "hand loop, the default hooks' work", "ember Engine loop",
    "ember Engine loop, nonfinite_loss='ignore'", "ember Trainer, no hooks", "ember Trainer, a hook that does nothing",
    "ember Trainer, LossHook", "ember Trainer, LossHook + LRSchedulerHook", "ember Trainer, default hooks",
)  # fmt: skip
"""With ``--parts``: the default hook list grown one part at a time, to see what each costs; the
Engine without its non-finite loss check; the hook dispatch alone (an ``after_train_iter`` that
does nothing)."""
_HOOKS_KEPT = {
    "ember Trainer, no hooks": 0, "ember Trainer, LossHook": 1, "ember Trainer, LossHook + LRSchedulerHook": 2,
    "ember Trainer, default hooks": 5,
}  # fmt: skip
"""How many of :func:`case_step.default_hooks` (loss, LR schedule, accuracy, metric log, memory log) each keeps."""


class _Idle(BaseHook):
    """A hook whose ``after_train_iter`` does nothing: the cost of the hook dispatch itself."""

    def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
        """Nothing."""


def build(name: str, params: dict[str, Any]) -> tuple[Callable[[], None], Workload]:
    """A function that runs one whole training run of ``name`` on its own model and optimizer."""
    w = Workload(params)
    loader, epochs = w.loader(), w.epochs
    if name == "hand loop":
        w.model.train()
        return lambda: case_step.hand_epochs(w, loader), w
    if name == "hand loop, the default hooks' work":
        w.model.train()
        return lambda: case_step.hand_epochs_same_work(w, loader, ember.get_dist_logger()), w
    if name == "ember Engine loop, nonfinite_loss='ignore'":
        engine = ember.initialize(w.model, w.optimizer, w.criterion, config={"nonfinite_loss": "ignore"})[0]
        engine.train()
        return lambda: case_step.engine_epochs(engine, loader, epochs), w
    engine = case_step._engine(w)
    if name == "ember Engine loop":
        engine.train()
        return lambda: case_step.engine_epochs(engine, loader, epochs), w
    from ember.trainer import Trainer

    logger = ember.get_dist_logger()
    trainer = Trainer(engine=engine, logger=logger)
    if name == "ember Trainer, a hook that does nothing":
        return lambda: trainer.fit(loader, epochs=epochs, hooks=[_Idle()]), w
    kept = _HOOKS_KEPT[name]  # none: no LR scheduler built either (it wraps the optimizer's step)
    chosen = case_step.default_hooks(w, logger)[:kept] if kept else []
    return lambda: trainer.fit(loader, epochs=epochs, hooks=chosen), w


def measure(
    params: dict[str, Any],
    rounds: int,
    log: Callable[[str], None] = print,
    short: int | None = None,
    names: tuple[str, ...] = CONTENDERS,
) -> dict[str, Any]:
    """Run the contenders ``rounds`` times, interleaved, after one untimed warm-up run each.

    ``short``: also run every contender with ``short`` batches per epoch (same epochs) in the
    same rounds, and report the marginal cost of a step (see :func:`_marginal`).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _measure(params, rounds, log, short, names)
    finally:
        torch.set_num_threads(threads)


def _measure(
    params: dict[str, Any], rounds: int, log: Callable[[str], None], short: int | None, names: tuple[str, ...]
) -> dict[str, Any]:
    sizes = [params["batches"]] if short is None else [params["batches"], short]
    built = {(name, n): build(name, {**params, "batches": n}) for name in names for n in sizes}
    for run, _ in built.values():
        run()
    keys = list(built)
    cpu: dict[tuple[str, int], list[float]] = {key: [] for key in keys}
    for r in range(rounds):
        for key in keys[r % len(keys) :] + keys[: r % len(keys)]:
            t0 = time.process_time()
            built[key][0]()
            cpu[key].append(time.process_time() - t0)
        log(f"  round {r + 1}/{rounds}: " + ", ".join(f"{n} {cpu[n, sizes[0]][-1]:.3f} s" for n in names))
    losses = {key: w.final_loss() for key, (_, w) in built.items()}
    for n in sizes:
        base_loss = losses[names[0], n]
        if any(abs(losses[name, n] - base_loss) > 1e-5 * abs(base_loss) for name in names):
            raise RuntimeError(f"the contenders did different work: final losses {losses}")
    long = sizes[0]
    steps = built[names[0], long][1].steps
    hand = cpu[names[0], long]
    rows = []
    for name in names:
        times = cpu[name, long]
        us = statistics.median(times) / steps * 1e6
        paired = [a / b for a, b in zip(times, hand, strict=True)]
        diffs = [(a - b) / steps * 1e6 for a, b in zip(times, hand, strict=True)]
        quartiles = statistics.quantiles(diffs, n=4) if len(diffs) > 1 else [diffs[0]] * 3
        rows.append({
            "contender": name,
            "us_per_step": us,
            "overhead_us_per_step": us - statistics.median(hand) / steps * 1e6,
            "ratio": statistics.median(times) / statistics.median(hand),
            "paired_ratio": statistics.median(paired),
            "paired_min": min(paired),
            "paired_max": max(paired),
            "paired_overhead_us": statistics.median(diffs),
            "paired_overhead_iqr_us": [quartiles[0], quartiles[2]],
            "fastest_us_per_step": min(times) / steps * 1e6,
            "fastest_ratio": min(times) / min(hand),
            "cpu_s": times,
        })  # fmt: skip
        if short is not None:
            rows[-1].update(_marginal(cpu[name, long], cpu[name, short], params["epochs"] * (long - short), steps))
            rows[-1]["cpu_s_short"] = cpu[name, short]
    if short is not None:
        for row in rows:
            row["marginal_overhead_us"] = row["marginal_us_per_step"] - rows[0]["marginal_us_per_step"]
    record = {"params": params, "rounds": rounds, "steps_per_run": steps, "final_loss": losses[names[0], long]}
    return {**record, "short_batches": short, "rows": rows}


def _marginal(long: list[float], short: list[float], extra_steps: int, steps: int) -> dict[str, float]:
    """The cost of one more step, from the fastest long and short runs; and what is left of a run.

    The two runs differ only in batches per epoch, so set-up, per-``fit`` and per-epoch costs
    cancel in the difference: ``(fastest long - fastest short) / extra steps``.
    """
    per_step = (min(long) - min(short)) / extra_steps
    return {"marginal_us_per_step": per_step * 1e6, "fixed_ms_per_run": (min(long) - per_step * steps) * 1e3}


def markdown(record: dict[str, Any]) -> str:
    """The results as a markdown section."""
    p = record["params"]
    lines = [
        f"### Per-step overhead in one process, {p['model']} model, batch {p['batch_size']} "
        f"({record['date']}, {record['host']})",
        "",
        f"`{record['command']}`: {record['rounds']} interleaved rounds of one {record['steps_per_run']}-step "
        f"run per contender, one process, one torch thread; process CPU time. Every contender ended "
        f"with loss {record['final_loss']:.6g}."
        + (
            f" Load average (1, 5, 15 min) at the end: {', '.join(f'{x:.1f}' for x in record['load_average'])}."
            if "load_average" in record
            else ""
        ),
        "",
        "| contender | µs per step (median) | overhead vs the hand loop | ratio of medians | paired ratio (min–max) "
        "| fastest run: µs per step | ratio of fastest runs | paired overhead, µs per step (IQR) |",
        "|---|---|---|---|---|---|---|---|",
        *(
            f"| {r['contender']} | {r['us_per_step']:,.1f} | {r['overhead_us_per_step']:+,.1f} µs | "
            f"{r['ratio']:.3f}x | {r['paired_ratio']:.3f}x ({r['paired_min']:.3f}–{r['paired_max']:.3f}) | "
            f"{r['fastest_us_per_step']:,.1f} | {r['fastest_ratio']:.3f}x | {r['paired_overhead_us']:+,.1f} "
            f"({r['paired_overhead_iqr_us'][0]:+,.1f} to {r['paired_overhead_iqr_us'][1]:+,.1f}) |"
            for r in record["rows"]
        ),
        "",
        "Neighbours on a shared machine only ever add time, so each contender's fastest run is the "
        "estimate least touched by them; the paired ratio and the paired overhead compare runs made "
        "moments apart (the median over rounds of each round's difference to the hand loop). On a "
        "noisy VM many short rounds (`--batches 200 --epochs 2 --rounds 60`) pin the overhead down "
        "better than a few long ones.",
        "",
    ]
    if record.get("short_batches"):
        base = record["rows"][0]["marginal_us_per_step"]
        lines += [
            f"Marginal cost of a step: the fastest {p['batches']}-batch run less the fastest "
            f"{record['short_batches']}-batch run (same epochs, interleaved in the same rounds), over the "
            "steps between them. Set-up, per-`fit` and per-epoch costs cancel; they are the last column.",
            "",
            "| contender | µs per step | over the hand loop | ratio | rest of a run (set-up, fit, epochs) |",
            "|---|---|---|---|---|",
            *(
                f"| {r['contender']} | {r['marginal_us_per_step']:,.1f} | {r['marginal_overhead_us']:+,.1f} µs | "
                f"{r['marginal_us_per_step'] / base:.3f}x | {r['fixed_ms_per_run']:,.2f} ms |"
                for r in record["rows"]
            ),
            "",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("mlp", "linear"), default="mlp", help="mlp: case 1's tiny MLP")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (default 15)")
    parser.add_argument("--batches", type=int, default=200, help="batches per epoch (default 200, as case 1)")
    parser.add_argument("--epochs", type=int, default=10, help="epochs per run (default 10, as case 1)")
    parser.add_argument("--short", type=int, help="also run SHORT batches per epoch: report the marginal step cost")
    parser.add_argument(
        "--parts", action="store_true", help="also the Trainer with the LossHook, then the LR schedule added"
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"results folder (default {RESULTS})")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.batches < 1 or args.epochs < 1:
        parser.error("--rounds, --batches and --epochs must be at least 1")
    if args.short is not None and not 0 < args.short < args.batches:
        parser.error("--short must be between 0 and --batches")
    params = {"model": args.model, "batch_size": 64, "batches": args.batches, "epochs": args.epochs, "seed": 0}
    record = measure(params, args.rounds, short=args.short, names=PARTS if args.parts else CONTENDERS)
    record.update(
        date=dt.date.today().isoformat(),
        host=socket.gethostname().split(".")[0],
        python=sys.version.split()[0],
        torch=torch.__version__,
        command="python -m benchmarks.overhead " + " ".join(argv if argv is not None else sys.argv[1:]),
        ember=str(Path(ember.__file__).parent),  # the tree measured: PYTHONPATH=src, else the venv's install
        load_average=list(os.getloadavg()),
    )
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"{record['date']}-{record['host']}-overhead-{args.model}{'-parts' if args.parts else ''}"
    stem.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    text = markdown(record)
    stem.with_suffix(".md").write_text(text)
    print(text)
    print(f"wrote {stem}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())

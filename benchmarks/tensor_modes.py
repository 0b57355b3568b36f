"""Communication, memory and time of one transformer block under 1-D, 2-D, 2.5-D and 3-D tensor parallelism.

Issue 27, item 6. One pre-norm transformer block (LayerNorm, fused qkv ``h -> 3h``, attention,
``h -> h`` projection, LayerNorm, ``h -> 4h``, GELU, ``4h -> h``; bias everywhere) at a fixed
hidden size and batch, built from each mode's layers (:func:`ember.parallel.layers_for`), its
input already in the mode's layout. One *step* is the block's forward and backward (with data
replicas, plus the average of the gradients over ``"data"``). Per configuration, in its own
torchrun on gloo:

* **bytes** each rank moves, counted at the collective calls: ``torch.distributed``'s
  ``all_reduce``, ``all_gather_into_tensor``, ``reduce_scatter_tensor``, ``broadcast`` and
  ``reduce`` are wrapped (in this benchmark only) to add up, per call, the ring algorithm's
  volume per rank — ``2(p-1)/p · n`` for an all-reduce of ``n`` bytes over ``p`` ranks,
  ``(p-1)/p · n`` for the others (``n`` the whole gathered / scattered / broadcast tensor) —
  beside the calls and the bytes handed to them;
* **memory**: this rank's parameter bytes, and the bytes of the tensors the forward saves for the
  backward (``saved_tensors_hooks``; each storage once): the activation memory of the step;
* **time**: the median step over ``--steps`` after two warm-up steps.

Next to each, the formula of the algorithm (the volume its collectives must move, in the same
ring model; the papers state the orders: 1-D ``O(1)`` activations and ``2(P-1)/P`` traffic per
layer, 2-D ``O(1/q²)`` memory, 2.5-D ``O(1/(d·q²))`` activations, 3-D ``O(1/q³)``).

    .venv/bin/python -m benchmarks.tensor_modes                 # h=256, batch 8 × 64 tokens, 4 and 8 processes
    .venv/bin/python -m benchmarks.tensor_modes --hidden 512 --steps 20 --only 2d 3d

Timings on a shared CPU machine measure gloo and oversubscribed cores as much as the
algorithms: read them for orders of magnitude, the bytes and memory for the comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIGS: dict[str, tuple[int, dict[str, Any]]] = {
    "1d-4": (4, {"tensor": {"size": 4, "mode": "1d"}}),
    "2d-4": (4, {"tensor": {"size": 4, "mode": "2d"}}),
    "2.5d-4": (4, {"tensor": {"size": 4, "mode": "2.5d", "depth": 1}}),
    "1d-8": (8, {"tensor": {"size": 8, "mode": "1d"}}),
    "2d-8": (8, {"tensor": {"size": 4, "mode": "2d"}, "data": 2}),
    "2.5d-8": (8, {"tensor": {"size": 8, "mode": "2.5d", "depth": 2}}),
    "3d-8": (8, {"tensor": {"size": 8, "mode": "3d"}}),
}
"""Name -> (processes, ``parallel`` config). 2-D needs a square: on 8 it is 2 × 2 with 2 data replicas."""


# -- the formulas ----------------------------------------------------------------------------------
def linears(h: int) -> list[tuple[int, int]]:
    """The block's Linears as (in, out)."""
    return [(h, 3 * h), (h, h), (h, 4 * h), (4 * h, h)]


def formula(mode: str, parallel: dict[str, Any], m: int, h: int) -> dict[str, float]:
    """Elements moved per rank per step by the algorithm's collectives (ring volume), and its
    parameter and activation shares, for ``m`` tokens and hidden ``h``."""
    tensor = parallel["tensor"]
    size, depth, data = tensor["size"], tensor.get("depth", 1), parallel.get("data", 1)
    params = sum(k * n + n for k, n in linears(h)) + 4 * h  # + the two norms
    if mode == "1d":
        p = size
        volume = 4 * 2 * (p - 1) / p * m * h  # qkv, fc1: dx all-reduced; proj, fc2: y all-reduced
        share = (params - 4 * h - h - h) / p + 4 * h + 2 * h  # norms and row biases whole
        act = 1.0
    elif mode in ("2d", "2.5d"):
        q = round((size // depth) ** 0.5)
        rows = m / depth  # each depth layer multiplies its own rows by SUMMA
        volume = sum(3 * (q - 1) / q**2 * (rows * k + n * k) for k, n in linears(h))
        volume += sum(2 * (depth - 1) / depth * n * k / q**2 for k, n in linears(h))  # weight grads over depth
        ranks = depth * q  # biases and norms: whole blocks replicated over (depth ×) column
        volume += sum(2 * (ranks - 1) / ranks * n / q for _, n in linears(h)) + 2 * 2 * (ranks - 1) / ranks * 2 * h / q
        volume += 2 * 8 * (q - 1) / q * rows / q  # the norms' statistics over the row (mean, variance; 2 sums back)
        share = (params - 4 * h) / q**2 + sum(n / q - n / q**2 for _, n in linears(h)) + 4 * h / q
        act = 1 / (depth * q * q)
    else:  # 3d
        q = round(size ** (1 / 3))
        volume = sum(2 * (q - 1) / q**3 * (m * k + n * k + m * n) for k, n in linears(h))
        volume += (
            sum(2 * (q * q - 1) / (q * q) * n / q for _, n in linears(h)) + 2 * 2 * (q * q - 1) / (q * q) * 2 * h / q
        )
        volume += 2 * 8 * (q - 1) / q * m / q**2  # the norms' statistics over the output axis
        share = sum(k * n / q**3 + n / q for k, n in linears(h)) + 4 * h / q
        act = 1 / q**3
    if data > 1:
        volume += 2 * (data - 1) / data * share  # the gradients averaged over the data replicas
    return {"elements": volume, "param_elements": share, "activation_share": act}


# -- the worker (one rank of one configuration) -----------------------------------------------------
def _count_collectives() -> dict[str, Any]:
    """Wrap torch.distributed's collectives to count, per call, the ring volume per rank."""
    import torch.distributed as dist

    counts: dict[str, Any] = {"calls": 0, "payload": 0, "volume": 0.0, "by_op": {}}

    def wrap(name: str, factor: float, tensor_arg: int) -> None:
        original = getattr(dist, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            group = kwargs.get("group")
            p = dist.get_world_size(group)
            tensor = args[tensor_arg] if len(args) > tensor_arg else kwargs.get("tensor", kwargs.get("input"))
            n = tensor.numel() * tensor.element_size()
            volume = factor * (p - 1) / p * n
            counts["calls"] += 1
            counts["payload"] += n
            counts["volume"] += volume
            counts["by_op"][name] = counts["by_op"].get(name, 0.0) + volume
            return original(*args, **kwargs)

        setattr(dist, name, counted)

    wrap("all_reduce", 2.0, 0)
    wrap("all_gather_into_tensor", 1.0, 0)  # the output: the whole gathered tensor
    wrap("reduce_scatter_tensor", 1.0, 1)  # the input: the whole tensor scattered
    wrap("broadcast", 1.0, 0)
    wrap("reduce", 1.0, 0)
    return counts


def worker(parallel: dict[str, Any], hidden: int, heads: int, batch: int, tokens: int, steps: int, out: Path) -> None:
    """One rank: build the block, run warm-up, one counted and ``steps`` timed steps; rank 0 writes JSON."""
    counts = _count_collectives()
    import torch
    from torch import nn

    import ember
    from ember.parallel.grid import grid_of, shard_specs
    from ember.parallel.grid_policy import average_gradients
    from ember.parallel.layers import layers_for

    torch.set_num_threads(1)
    ember.launch_from_torch(config={"seed": 0, "parallel": parallel}, verbose=False)
    layout = ember.context.layout
    grid = grid_of(layout)
    L = layers_for(grid)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head_dim = hidden // heads
            self.ln1, self.qkv, self.proj = L.LayerNorm(hidden), L.Linear(hidden, 3 * hidden), L.Linear(hidden, hidden)
            self.ln2, self.fc1, self.fc2 = (
                L.LayerNorm(hidden),
                L.Linear(hidden, 4 * hidden),
                L.Linear(4 * hidden, hidden),
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, s, -1, 3 * self.head_dim).transpose(1, 2).chunk(3, dim=-1)
            y = nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, -1)
            x = x + self.proj(y)
            return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))

    block = Block()
    mode, q = layout.tensor_mode, grid.q
    rows = {"1d": batch, "2d": batch // q, "2.5d": batch // (grid.depth * q), "3d": batch // (q * q)}[mode]
    features = hidden if mode == "1d" else hidden // q
    generator = torch.Generator().manual_seed(ember.context.rank)
    x = torch.randn(rows, tokens, features, generator=generator, requires_grad=True)
    upstream = torch.randn(rows, tokens, features, generator=generator)
    data_group = ember.context.get_group("data")

    def step() -> None:
        block.zero_grad(set_to_none=True)
        (block(x) * upstream).sum().backward()
        average_gradients(block.parameters(), data_group)

    for _ in range(2):
        step()
    for key in ("calls", "payload", "volume"):
        counts[key] = 0
    counts["by_op"] = {}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    counted = {k: counts[k] for k in ("calls", "payload", "volume", "by_op")}
    times = []
    for _ in range(steps):
        torch.distributed.barrier()
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    specs = shard_specs(block)
    local = sum(p.numel() for p in block.parameters())
    whole = sum(spec.shape.numel() for spec in specs.values())
    result = {
        **counted, "step_s": statistics.median(times), "param_bytes": 4 * local, "whole_param_bytes": 4 * whole,
        "activation_bytes": sum(saved.values()), "input_bytes": x.numel() * 4, "policy_axes": list(grid.axes),
    }  # fmt: skip
    gathered: list[Any] = [None] * ember.distributed.world_size()
    torch.distributed.all_gather_object(gathered, result)
    if ember.context.rank == 0:
        out.write_text(json.dumps(gathered))


# -- the driver ----------------------------------------------------------------------------------------
def run(name: str, args: argparse.Namespace) -> dict[str, Any]:
    nproc, parallel = CONFIGS[name]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", f"--master_port={_port()}",
               "-m", "benchmarks.tensor_modes", "--worker", json.dumps(parallel), "--hidden", str(args.hidden),
               "--heads", str(args.heads), "--batch", str(args.batch), "--tokens", str(args.tokens),
               "--steps", str(args.steps), "--out", str(out)]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1200)
        if proc.returncode != 0:
            raise RuntimeError(f"{name} failed:\n{proc.stderr[-3000:]}")
        ranks = json.loads(out.read_text())
    mode = parallel["tensor"]["mode"]
    m = args.batch * args.tokens
    expected = formula(mode, parallel, m, args.hidden)
    rank0 = ranks[0]
    return {
        "name": name, "processes": nproc, "mode": mode,
        "mb_moved": statistics.mean(r["volume"] for r in ranks) / 2**20,
        "mb_formula": 4 * expected["elements"] / 2**20,
        "calls": rank0["calls"], "by_op": rank0["by_op"],
        "param_mb": statistics.mean(r["param_bytes"] for r in ranks) / 2**20,
        "param_mb_formula": 4 * expected["param_elements"] / 2**20,
        "whole_param_mb": rank0["whole_param_bytes"] / 2**20,
        "activation_mb": statistics.mean(r["activation_bytes"] for r in ranks) / 2**20,
        "step_ms": 1000 * statistics.median(r["step_s"] for r in ranks),
    }  # fmt: skip


def _port() -> int:
    """A free TCP port on loopback for the rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def table(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    head = (
        f"One block, hidden {args.hidden}, {args.heads} heads, batch {args.batch} × {args.tokens} tokens, fp32, gloo; "
        f"per rank and step (forward + backward).\n\n"
        "| config | procs | MB moved (counted) | MB (formula) | collective calls | params MB (formula) | "
        "activations MB | step ms |\n|---|---|---|---|---|---|---|---|\n"
    )
    lines = [
        f"| {r['name']} | {r['processes']} | {r['mb_moved']:.2f} | {r['mb_formula']:.2f} | {r['calls']} | "
        f"{r['param_mb']:.2f} ({r['param_mb_formula']:.2f}) | {r['activation_mb']:.2f} | {r['step_ms']:.1f} |"
        for r in rows
    ]
    return head + "\n".join(lines) + f"\n\nThe whole block: {rows[0]['whole_param_mb']:.2f} MB of parameters.\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--only", nargs="*", help="modes to run (1d 2d 2.5d 3d)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help="the JSON results (worker), or the markdown table (driver)")
    args = parser.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker), args.hidden, args.heads, args.batch, args.tokens, args.steps, args.out)
        return
    print(f"load average before: {os.getloadavg()}", file=sys.stderr)
    names = [n for n in CONFIGS if not args.only or n.split("-")[0] in args.only]
    rows = []
    for name in names:
        rows.append(run(name, args))
        print(json.dumps(rows[-1]), file=sys.stderr)
    print(f"load average after: {os.getloadavg()}", file=sys.stderr)
    text = table(rows, args)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()

"""Case 6, CUDA: a GPT-style model in bf16 autocast, the hand loop vs ember's Trainer.

Runs only where CUDA is available (each contender raises :class:`Skipped` otherwise). The
model (``d_model`` 768, 12 layers, 12 heads, context 512, vocabulary 32,000: about 110M
parameters) trains on random tokens with AdamW; with ``compile`` the model goes through
``torch.compile`` (the compile itself is warmed up outside the timer). Reported: tokens/s and
model FLOPs utilisation (6·N·tokens plus attention, over the device's bf16 peak).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from benchmarks.harness import Contender, Group, Outcome, Skipped, Timer

M = "benchmarks.case_cuda"
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L4": 121.0, "A10": 125.0}


def _require_cuda() -> Any:
    import torch

    if not torch.cuda.is_available():
        raise Skipped("no CUDA here")
    return torch


def _gpt(params: Mapping[str, Any]) -> Any:
    import torch
    from torch import nn

    d, layers, heads, vocab, ctx = (int(params[k]) for k in ("d_model", "layers", "heads", "vocab", "context"))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(vocab, d)
            self.pos = nn.Embedding(ctx, d)
            layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
            self.blocks = nn.TransformerEncoder(layer, layers)
            self.norm = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(ctx), persistent=False)

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            t = idx.shape[1]
            x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
            x = self.blocks(x, mask=self.mask[:t, :t], is_causal=True)
            return self.head(self.norm(x)).flatten(0, 1)

    return GPT()


def _flops_per_token(n_params: int, params: Mapping[str, Any]) -> float:
    return 6.0 * n_params + 12.0 * int(params["layers"]) * int(params["d_model"]) * int(params["context"])


def _peak(name: str) -> float | None:
    return next((v * 1e12 for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def gpt_run(params: Mapping[str, Any], timer: Timer) -> Outcome:
    """``params["kind"]``: hand or ember; ``params["compile"]``: bool."""
    torch = _require_cuda()
    from torch import nn

    torch.manual_seed(0)
    device = torch.device("cuda")
    model = _gpt(params).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    crit = nn.CrossEntropyLoss()
    g = torch.Generator(device=device).manual_seed(1)
    b, t, vocab = int(params["batch_size"]), int(params["context"]), int(params["vocab"])
    steps, warmup = int(params["steps"]), int(params["warmup"])
    data = [torch.randint(0, vocab, (b, t + 1), device=device, generator=g) for _ in range(8)]
    batches = [(x[:, :-1], x[:, 1:].flatten()) for x in data]
    if params["kind"] == "hand":
        run = model if not params["compile"] else torch.compile(model)

        def train(n: int) -> None:
            for i in range(n):
                x, y = batches[i % len(batches)]
                opt.zero_grad(set_to_none=True)
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = crit(run(x), y)
                loss.backward()
                opt.step()
    else:
        import ember
        from ember.trainer import Trainer

        engine, _, _, _ = ember.initialize(model, opt, crit, config={"amp": "bf16", "compile": bool(params["compile"])})
        trainer = Trainer(engine=engine)

        def train(n: int) -> None:
            trainer.fit([batches[i % len(batches)] for i in range(n)], epochs=1)

    train(warmup)  # compile, cuDNN autotuning, allocator warm-up
    torch.cuda.synchronize()
    with timer:
        train(steps)
        torch.cuda.synchronize()
    tokens = steps * b * t
    tps = tokens / timer.wall_s
    extra = {"tokens_per_s": tps, "params_M": n_params / 1e6}
    peak = _peak(torch.cuda.get_device_name())
    if peak:
        extra["mfu"] = tps * _flops_per_token(n_params, params) / peak
    with torch.no_grad():
        x, y = batches[0]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            final = float(crit(model(x), y))
    return Outcome(work=final, extra=extra)


def groups(quick: bool = False, with_peers: bool = True) -> list[Group]:
    """GPT ~110M, bf16, batch 16 x 512 tokens; eager and compiled."""
    params: dict[str, Any] = {"d_model": 768, "layers": 12, "heads": 12, "vocab": 32000, "context": 512,
                              "batch_size": 16, "steps": 100, "warmup": 8}  # fmt: skip
    if quick:
        params.update(d_model=64, layers=2, heads=2, vocab=256, context=32, steps=3, warmup=1)
    out = []
    for compiled in (False, True):
        tag = "compiled" if compiled else "eager"
        contenders = (
            Contender("hand loop", f"{M}:gpt_run", params={"kind": "hand", "compile": compiled}),
            Contender("ember Trainer", f"{M}:gpt_run", params={"kind": "ember", "compile": compiled}),
        )
        out.append(Group(f"GPT bf16 ({tag})", contenders, "hand loop", params, rel_tol=2e-2, torch_threads=4))
    return out

"""torchrun, 4 processes, launched with Colossal-AI's ``tensor=dict(size=2, mode="sequence")``
(ember's context 2, contiguous, × data 2): ring attention on 2 and 4 ranks against one-process
SDPA; context-parallel Engines (per-Engine layouts, and the launched one through the Trainer)
against a one-process loop; activation checkpointing against no checkpointing under DDP,
FSDP2 × tensor parallel and context parallelism; the bad inputs; Colossal-AI's ring layers."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tests.dist import report
from tests.parallel.common import dataset, max_diff, optimizer_state_diff, run_engine, sgd, stack_gpt
from tests.parallel.context_common import corpus, lm_reference, tiny_lm, token_loss
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import ember
from ember.compat.colossalai.context import ParallelMode
from ember.compat.colossalai.core import global_context as gpc
from ember.compat.colossalai.nn.layer.parallel_sequence import RingAV, RingQK, TransformerSelfAttentionRing
from ember.parallel import plans
from ember.parallel.context_parallel import launched_sharding
from ember.parallel.ring import SequenceSplit, gather_sequence, ring_attention
from ember.trainer import Trainer, hooks

torch.set_num_threads(1)
STEPS, GLOBAL, LENGTH = 4, 8, 16


def ring_functions() -> dict[str, Any]:
    """``ring_attention`` and ``gather_sequence`` on the 2-rank groups {0, 1}, {2, 3} and on all 4
    ranks, against SDPA on the whole sequences: the output and every input's gradient."""
    rank, out = dist.get_rank(), {}
    pair, _ = dist.new_subgroups_by_enumeration([[0, 1], [2, 3]])
    for n, group in ((2, pair), (4, dist.new_group([0, 1, 2, 3]))):
        torch.manual_seed(0)
        q, k, v, grad = (torch.randn(2, 2, 8 * n, 4) / 2 for _ in range(4))  # activation-sized values
        for balanced in (True, False):
            for causal in (True, False):
                full = [t.clone().requires_grad_() for t in (q, k, v)]
                F.scaled_dot_product_attention(*full, is_causal=causal).backward(grad)
                split = SequenceSplit(n, rank % n, balanced)
                mine = [split.shard(t, 2).requires_grad_() for t in (q, k, v)]
                y = ring_attention(*mine, group, split, is_causal=causal)
                y.backward(split.shard(grad, 2))
                with torch.no_grad():
                    whole = gather_sequence(y, 2, group, split)
                    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                diffs = [(whole - expected).abs().max().item()]
                diffs += [(m.grad - split.shard(f.grad, 2)).abs().max().item() for m, f in zip(mine, full, strict=True)]
                out[f"ring.{n}.{'zigzag' if balanced else 'contiguous'}.{'causal' if causal else 'full'}"] = diffs
        x = torch.randn(2, 8 * n, 3, requires_grad=True)
        split = SequenceSplit(n, rank % n, True)
        mine = split.shard(x.detach(), 1).requires_grad_()
        (gather_sequence(mine, 1, group, split) * torch.arange(8.0 * n).view(1, -1, 1)).sum().backward()
        out[f"gather.{n}"] = (
            (mine.grad - n * split.shard(torch.arange(8.0 * n).view(1, -1, 1).expand(2, -1, 3), 1)).abs().max().item()
        )
    return out


def routed_sdpa() -> dict[str, Any]:
    """SDPA calls as models make them, inside the launched layout's routing (context 2,
    contiguous): grouped-query heads, 3-D inputs, bf16 autocast; and the positions warning."""
    sharding = launched_sharding()
    assert sharding is not None
    split, out = sharding.split, {}
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 4, 16, 8), torch.randn(2, 2, 16, 8), torch.randn(2, 2, 16, 8)
    cases = {
        "gqa": ((q, k, v), {"enable_gqa": True, "is_causal": True}),
        "3d": ((q[:, 0], k[:, 0], v[:, 0]), {"is_causal": True}),
    }
    for name, (tensors, kwargs) in cases.items():
        expected = F.scaled_dot_product_attention(*tensors, **kwargs)
        with sharding.attention():
            got = F.scaled_dot_product_attention(*(split.shard(t, -2) for t in tensors), **kwargs)
        out[f"routed.{name}"] = (got - split.shard(expected, -2)).abs().max().item()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        with sharding.attention():
            got = F.scaled_dot_product_attention(*(split.shard(q, 2),) * 3, is_causal=True)
    out["routed.bf16"] = [str(got.dtype), (got.float() - split.shard(expected, 2).float()).abs().max().item()]
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("ember").addHandler(handler)
    with sharding.attention(local_length=8):
        torch.arange(0, 8)  # a model numbering its slice from 0
    logging.getLogger("ember").removeHandler(handler)
    out["routed.arange_warning"] = any("use ember.parallel.context_parallel.positions" in m for m in seen)
    return out


def engine_layout(
    name: str, config: dict[str, Any] | None, causal: bool = True, accumulation: int = 1
) -> dict[str, Any]:
    """The Engine loop under ``config`` (None: the launched layout) against one process, 4 updates."""
    ds = corpus(GLOBAL * STEPS * accumulation, LENGTH)
    clip = (config or {}).get("clip_grad_norm")
    ref = lm_reference(tiny_lm(causal=causal), ds, GLOBAL * accumulation, STEPS, clip)  # one batch per update
    model = tiny_lm(causal=causal)
    replicas = ember.context.layout.data if config is None else config["parallel"].get("data", 1)
    loader = ember.get_dataloader(ds, batch_size=GLOBAL // replicas)
    settings = {**(config or {}), "gradient_accumulation": accumulation}
    engine, loader, _, _ = ember.initialize(model, sgd(model), token_loss, loader, config=settings)
    run = run_engine(engine, loader, STEPS)
    state = engine.state_dict()
    out: dict[str, Any] = {
        f"{name}.loss_diff": max(abs(a - b) for a, b in zip(run["losses"], ref["losses"], strict=True)),
        f"{name}.norm_diff": max((abs(a - b) for a, b in zip(run["norms"], ref["norms"], strict=True)), default=0.0),
        f"{name}.norms": len(run["norms"]),
        f"{name}.policy": engine.parallel.name,
        f"{name}.local_shape": list(next(iter(loader))[0].shape),
    }
    if dist.get_rank() == 0:
        out[f"{name}.param_diff"] = max_diff(state["model"], ref["model"])
        out[f"{name}.optim_diff"] = optimizer_state_diff(state["optimizer"], ref["optimizer"])
    return out


def cp(size: int, balanced: bool = True) -> dict[str, Any]:
    """A ``parallel.context`` section (the launched one is contiguous: per-Engine configs say which)."""
    return {"size": size, "load_balance": balanced}


def trainer_on_the_launched_layout() -> dict[str, Any]:
    """Trainer.fit + evaluate on the launched layout (context 2 contiguous × data 2), saving a
    checkpoint every 2 updates; then a fresh Engine resumes from update 2 and finishes."""
    ds, test_ds = corpus(GLOBAL * STEPS, LENGTH), corpus(8, LENGTH, seed=5)
    ref_model = tiny_lm()
    ref = lm_reference(ref_model, ds, GLOBAL, STEPS)
    with torch.no_grad():
        ref_eval = float(token_loss(ref_model(test_ds.tensors[0]), test_ds.tensors[1]))
    saves = Path(os.environ["EMBER_TEST_OUT"]) / "checkpoints"
    states = []
    for resume in (None, saves / "ckpt-e0000-s000000002.ckpt"):
        model = tiny_lm(seed=9 if resume else 0)  # the resumed run's weights come from the checkpoint
        train_dl = ember.get_dataloader(ds, batch_size=GLOBAL // 2)
        test_dl = ember.get_dataloader(test_ds, batch_size=4)
        engine, train_dl, test_dl, _ = ember.initialize(model, sgd(model), token_loss, train_dl, test_dl)
        trainer = Trainer(engine)
        trainer.fit(train_dl, epochs=1, hooks=[hooks.LossHook(), hooks.CheckpointHook(saves, every_n_steps=2)],
                    resume=resume)  # fmt: skip
        states.append(engine.state_dict())
        if resume is None:
            metrics = trainer.evaluate(test_dl, hooks=[hooks.LossHook()])
    out = {
        "trainer.eval_diff": abs(float(metrics["test/loss"]) - ref_eval),
        "trainer.steps": trainer.state.step,
        "trainer.policy": engine.parallel.name,
        "trainer.other_rank_state": states[0]["model"] == {},
    }
    if dist.get_rank() == 0:
        out["trainer.param_diff"] = max_diff(states[0]["model"], ref["model"])
        out["trainer.resumed_bitwise"] = all(
            torch.equal(v, states[1]["model"][k]) for k, v in states[0]["model"].items()
        )
    return out


def checkpointing_is_bitwise() -> dict[str, Any]:
    """The same 3 updates with and without activation checkpointing (dropout 0.1 in every MLP)."""
    tensor = {"size": 2, "plan": plans.gpt_block(prefix="blocks.*")}
    layouts = {
        "ddp": {"parallel": {"context": 1}},
        "fsdp_tp": {"parallel": {"context": 1, "data": 2, "tensor": tensor}, "zero": {"stage": 3}},
        "cp": {"parallel": {"context": cp(2), "data": 2}},
    }  # fmt: skip
    out: dict[str, Any] = {}
    for name, config in layouts.items():
        states = []
        for checkpointing in (None, True):
            model = tiny_lm(dropout=0.1)
            ds = corpus(GLOBAL * 3, LENGTH)
            replicas = config["parallel"].get("data") or 4
            loader = ember.get_dataloader(ds, batch_size=GLOBAL // replicas)
            engine, loader, _, _ = ember.initialize(
                model, sgd(model), token_loss, loader, config={**config, "activation_checkpointing": checkpointing}
            )
            torch.manual_seed(100 + dist.get_rank())  # the same dropout draws in both runs
            run_engine(engine, loader, 3)
            states.append(engine.state_dict()["model"])
        if dist.get_rank() == 0:
            out[f"ckpt.{name}.bitwise"] = all(torch.equal(states[0][k], states[1][k]) for k in states[0])
            out[f"ckpt.{name}.moved"] = max_diff(states[1], tiny_lm(dropout=0.1).state_dict()) > 0
        out[f"ckpt.{name}.policy"] = engine.parallel.name
    return out | checkpointed_pipeline()


def checkpointed_pipeline() -> dict[str, Any]:
    """Pipeline 2 × data 2 (GPipe, 2 micro-batches) through the Trainer, with and without
    checkpointing every block of each stage: identical weights."""
    states, stages = [], []
    for checkpointing in (None, True):
        model = stack_gpt()
        loader = ember.get_dataloader(dataset(GLOBAL * 3, tokens=4), batch_size=GLOBAL // 2)
        config = {"parallel": {"context": 1, "pipeline": {"size": 2, "microbatches": 2}, "data": 2},
                  "activation_checkpointing": checkpointing}  # fmt: skip
        engine, loader, _, _ = ember.initialize(model, sgd(model), nn.CrossEntropyLoss(), loader, config=config)
        Trainer(engine, schedule=engine.schedule).fit(loader, max_steps=3)
        states.append(engine.state_dict()["model"])
        stages.append([n for n, m in model.named_modules() if "forward" in m.__dict__])
    out: dict[str, Any] = {"ckpt.pipeline.checkpointed": stages[1], "ckpt.pipeline.policy": engine.parallel.name}
    if dist.get_rank() == 0:
        out["ckpt.pipeline.bitwise"] = all(torch.equal(v, states[1][k]) for k, v in states[0].items())
    return out


class HandAttention(nn.Module):
    """Attention written by hand (softmax(q k^T) v): no SDPA call."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 8)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        return torch.softmax(x @ x.transpose(1, 2), -1) @ x


class Masked(nn.Module):
    """SDPA with ``kind``: an explicit mask, attention dropout, or nn.MultiheadAttention."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind, self.emb, self.mha = kind, nn.Embedding(16, 8), nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx).unsqueeze(1)
        if self.kind == "mask":
            return F.scaled_dot_product_attention(x, x, x, attn_mask=torch.ones(x.size(2), x.size(2), dtype=torch.bool))
        if self.kind == "dropout":
            return F.scaled_dot_product_attention(x, x, x, dropout_p=0.1)
        return self.mha(x[:, 0], x[:, 0], x[:, 0])[0]


def bad_inputs() -> dict[str, Any]:
    """Each refused on every rank with the same ember error (so no rank waits in a collective)."""
    out: dict[str, Any] = {}
    cases: dict[str, tuple[nn.Module, int]] = {
        "no_sdpa": (HandAttention(), 16),
        "mask": (Masked("mask"), 16),
        "dropout": (Masked("dropout"), 16),
        "mha": (Masked("mha"), 16),
        "length": (tiny_lm(), 12),  # 12 tokens do not cut into 2 x 4 chunks
    }
    for name, (model, length) in cases.items():
        ds = TensorDataset(torch.randint(0, 16, (8, length)), torch.randint(0, 16, (8, length)))
        loader = DataLoader(ds, batch_size=4)
        engine, loader, _, _ = ember.initialize(
            model, sgd(model), None, loader, config={"parallel": {"context": cp(4)}}
        )
        try:
            engine(next(iter(loader))[0]).sum().backward()
            out[f"bad.{name}"] = "no error"
        except ember.errors.EmberError as error:
            out[f"bad.{name}"] = f"{type(error).__name__}: {error}"
    return out


def colossal_ring_layer() -> dict[str, Any]:
    """Colossal-AI's ring self-attention on the launched sequence-parallel group (contiguous
    slices) against the same arithmetic on the whole sequence in one process; every gradient."""
    group = gpc.get_group(ParallelMode.SEQUENCE)
    rank, n = gpc.get_local_rank(ParallelMode.SEQUENCE), gpc.get_world_size(ParallelMode.SEQUENCE)
    seq, batch, hidden, heads = 8, 2, 8, 2
    torch.manual_seed(3)
    layer = TransformerSelfAttentionRing(hidden, heads, 0.0, lambda s, m: s.masked_fill(m, -10000.0), layer_number=2,
                                         apply_query_key_layer_scaling=True)  # fmt: skip
    x, grad = torch.randn(seq, batch, hidden), torch.randn(seq, batch, hidden)
    mask = torch.rand(batch, 1, seq, seq) < 0.3
    mask[..., 0] = False  # every query sees at least one key
    rows = slice(rank * seq // n, (rank + 1) * seq // n)
    mine = x[rows].clone().requires_grad_()
    output, bias = layer(mine, mask[:, :, rows])
    (output * grad[rows]).sum().backward()
    ref = _colossal_reference(layer, x, mask, grad)
    param_diffs = []
    for name, p in layer.named_parameters():
        if p.grad is None:  # the dense layer's bias is returned, not added
            continue
        summed = p.grad.clone()
        dist.all_reduce(summed, group=group)  # each rank's loss counts once
        param_diffs.append((summed - ref[name]).abs().max().item())
    q, k = (0.5 * torch.randn(4, seq, 3) for _ in range(2))
    q_mine, k_mine = (t[:, rows].clone().requires_grad_() for t in (q, k))
    RingAV.apply(RingQK.apply(q_mine, k_mine, 2, 2, seq // n), k_mine, 2, 2, 3, seq // n).sum().backward()
    q_full, k_full = q.clone().requires_grad_(), k.clone().requires_grad_()
    ((q_full @ k_full.transpose(2, 1)) @ k_full).sum().backward()
    k_grad = k_mine.grad.clone()
    return {
        "colossal.output_diff": (output - ref["output"][rows]).abs().max().item(),
        "colossal.input_grad_diff": (mine.grad - ref["input"][rows]).abs().max().item(),
        "colossal.param_grad_diff": max(param_diffs),
        "colossal.bias_is_dense_bias": bias is layer.dense.bias,
        "colossal.ring_q_grad_diff": (q_mine.grad - q_full.grad[:, rows]).abs().max().item(),
        "colossal.ring_k_grad_diff": (k_grad - k_full.grad[:, rows]).abs().max().item(),
        "gpc.sequence": [rank, n],
        "gpc.sequence_dp": [gpc.get_local_rank(ParallelMode.SEQUENCE_DP), gpc.get_world_size(ParallelMode.SEQUENCE_DP)],
        "gpc.data": [gpc.get_local_rank(ParallelMode.DATA), gpc.get_world_size(ParallelMode.DATA)],
        "gpc.initialised": gpc.is_initialized(ParallelMode.SEQUENCE),
    }


def _colossal_reference(layer: nn.Module, x: torch.Tensor, mask: torch.Tensor, grad: torch.Tensor) -> dict[str, Any]:
    """Colossal-AI's arithmetic on the whole sequence, with copies of ``layer``'s parameters."""
    params = {name: p.detach().clone().requires_grad_() for name, p in layer.named_parameters()}
    x = x.clone().requires_grad_()
    seq, batch, hidden = x.shape
    heads, size = layer.num_attention_heads, hidden // layer.num_attention_heads
    mixed = F.linear(x, params["query_key_value.weight"], params["query_key_value.bias"]).view(seq, batch, heads, -1)
    q, k, v = (t.reshape(seq, batch * heads, size).transpose(0, 1) for t in torch.split(mixed, size, dim=-1))
    scores = (q @ k.transpose(1, 2) / (hidden**0.5 * layer.layer_number)).view(batch, heads, seq, seq)
    probs = torch.softmax((scores * layer.layer_number).masked_fill(mask, -10000.0), -1).view(batch * heads, seq, seq)
    context = (probs @ v).view(batch, heads, seq, size).permute(2, 0, 1, 3).reshape(seq, batch, hidden)
    output = F.linear(context, params["dense.weight"])
    (output * grad).sum().backward()
    return {"output": output.detach(), "input": x.grad, **{name: p.grad for name, p in params.items()}}


def main() -> None:
    ember.launch_from_torch(config={"seed": 0, "parallel": {"tensor": {"size": 2, "mode": "sequence"}}})
    results: dict[str, Any] = {"launched": repr(ember.context.layout), "coords": ember.context.coords}
    results |= ring_functions()
    results |= routed_sdpa()
    results |= engine_layout("cp4", {"parallel": {"context": cp(4)}, "clip_grad_norm": 0.5})
    results |= engine_layout("cp2_dp2_full", {"parallel": {"context": cp(2), "data": 2}}, causal=False, accumulation=2)
    tensor = {"size": 2, "plan": plans.gpt_block(prefix="blocks.*")}
    results |= engine_layout("cp2_tp2", {"parallel": {"context": cp(2, balanced=False), "tensor": tensor}})
    results |= trainer_on_the_launched_layout()
    results |= checkpointing_is_bitwise()
    results |= bad_inputs()
    results |= colossal_ring_layer()
    report(results)


if __name__ == "__main__":
    main()

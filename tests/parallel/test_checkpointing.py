"""Activation checkpointing in one process: gradients bitwise those without it (dropout, bf16
autocast, through the Engine and torch.compile), which modules the config chooses, its errors,
and Colossal-AI's ``colossalai.utils.checkpoint``. Under DDP, FSDP2 × TP and context parallelism
it is checked in ``test_context_parallel.py``."""

from __future__ import annotations

import copy
import logging
import pickle
from typing import Any

import pytest
import torch
from torch import nn

import ember
from ember.compat.colossalai.utils import checkpoint as colossal_checkpoint
from ember.config import load_config
from ember.errors import ConfigError
from ember.parallel.checkpointing import apply_activation_checkpointing, checkpointed_modules
from tests.parallel.context_common import Block, corpus, tiny_lm, token_loss


def _grads(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], autocast: bool = False) -> list[torch.Tensor]:
    torch.manual_seed(7)  # the same dropout draws in both runs
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = token_loss(model(batch[0]), batch[1])
    loss.backward()
    return [p.grad for p in model.parameters()]


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16_autocast"])
def test_checkpointed_gradients_are_bitwise_those_without_checkpointing(autocast: bool) -> None:
    batch = corpus(4, 16).tensors
    plain, checkpointed = tiny_lm(dropout=0.2), tiny_lm(dropout=0.2)
    assert apply_activation_checkpointing(checkpointed, {"every": 1}) == ["blocks.0", "blocks.1"]
    expected, got = _grads(plain, batch, autocast), _grads(checkpointed, batch, autocast)
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
    assert list(plain.state_dict()) == list(checkpointed.state_dict())  # keys unchanged


def test_checkpointed_blocks_really_recompute_in_the_backward_pass() -> None:
    model = tiny_lm()
    apply_activation_checkpointing(model, {"modules": ["blocks.0.mlp"]})
    calls: list[bool] = []
    model.blocks[0].mlp.fc1.register_forward_hook(lambda *_: calls.append(torch.is_grad_enabled()))
    batch = corpus(2, 8).tensors
    token_loss(model(batch[0]), batch[1]).backward()
    assert len(calls) == 2  # the forward pass, then its recomputation


def _engine_run(config: dict[str, Any]) -> dict[str, torch.Tensor]:
    model = tiny_lm(dropout=0.1)
    loader = torch.utils.data.DataLoader(corpus(16, 16), batch_size=4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    engine, loader, _, _ = ember.initialize(model, opt, token_loss, loader, config={"seed": 0, **config})
    torch.manual_seed(3)
    for x, y in loader:
        engine.zero_grad()
        engine.backward(engine.criterion(engine(x), y))
        engine.step()
    return {k: v.clone() for k, v in engine.model.state_dict().items()}


@pytest.mark.parametrize(
    "config",
    [{"amp": "bf16", "gradient_accumulation": 2, "clip_grad_norm": 0.5}, {"compile": {"backend": "aot_eager"}}],
    ids=["bf16_accumulation_clip", "compile"],
)
def test_the_engine_with_checkpointing_from_the_config_trains_bitwise_as_without(config: dict[str, Any]) -> None:
    plain = _engine_run(config)
    checkpointed = _engine_run({**config, "activation_checkpointing": {"types": ["Block"]}})
    assert all(torch.equal(plain[k], checkpointed[k]) for k in plain)


def test_the_config_chooses_blocks_every_kth_types_and_patterns_outermost_only() -> None:
    model = tiny_lm(layers=4)
    assert checkpointed_modules(model, {}) == ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]
    assert checkpointed_modules(model, {"every": 2}) == ["blocks.0", "blocks.2"]
    assert checkpointed_modules(model, {"types": [Block]}) == checkpointed_modules(model, {"types": ["Block"]})
    assert checkpointed_modules(model, {"modules": ["blocks.*.mlp", "blocks.1.mlp.fc1"]}) == [
        f"blocks.{i}.mlp" for i in range(4)
    ]
    assert checkpointed_modules(model, {"modules": ["blocks.3.attn"], "types": ["LayerNorm"]})[-2:] == [
        "blocks.3.ln2",
        "ln",
    ]
    assert checkpointed_modules(model, None) == []


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"modules": ["block.*.mlp"]}, r"entry 'block.\*.mlp' matches no module of TinyLM \(did you mean"),
        (
            {"types": ["TransformerBlock"]},
            r"'TransformerBlock' is the class of no module of TinyLM; its module classes",
        ),
    ],
)
def test_a_choice_that_matches_nothing_is_a_config_error(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        checkpointed_modules(tiny_lm(), spec)


def test_a_model_without_module_lists_needs_a_choice() -> None:
    with pytest.raises(ConfigError, match=r"has none: choose modules with activation_checkpointing=dict\(modules"):
        checkpointed_modules(nn.Sequential(nn.Linear(2, 2)), {})


def test_config_key_checks() -> None:
    assert load_config({"activation_checkpointing": True}).activation_checkpointing == {
        "modules": None,
        "types": None,
        "every": 1,
    }
    assert load_config({"activation_checkpointing": False}).activation_checkpointing is None
    with pytest.raises(ConfigError, match=r"did you mean 'activation_checkpointing.every'"):
        load_config({"activation_checkpointing": {"evry": 2}})
    with pytest.raises(ConfigError, match=r"'activation_checkpointing.every' got 0"):
        load_config({"activation_checkpointing": {"every": 0}})
    with pytest.raises(
        ConfigError, match=r"'gradient_checkpointing' is HF Transformers's name.*'activation_checkpointing'"
    ):
        load_config({"gradient_checkpointing": True})


def test_a_copied_or_pickled_model_recomputes_its_own_blocks() -> None:
    model = tiny_lm()
    apply_activation_checkpointing(model, {})
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        with torch.no_grad():
            for p in twin.parameters():
                p.add_(1.0)
        x = corpus(2, 8).tensors[0]
        assert not torch.equal(twin(x), model(x))  # its own (changed) weights, not the original's
        assert twin.blocks[0].forward.module is twin.blocks[0]


def test_colossalai_checkpoint_matches_a_plain_call_and_notes_offload_on_cpu(caplog: Any) -> None:
    block, x = tiny_lm(dropout=0.3).blocks[0], torch.randn(2, 8, 16, requires_grad=True)
    torch.manual_seed(1)
    expected = block(x)
    expected.sum().backward()
    expected_grad, x.grad = x.grad, None
    torch.manual_seed(1)
    with caplog.at_level(logging.INFO, logger="ember"):
        got = colossal_checkpoint(block, True, x)
        got.sum().backward()
    assert torch.equal(got, expected) and torch.equal(x.grad, expected_grad)
    assert any("already live in host memory" in r.getMessage() for r in caplog.records)

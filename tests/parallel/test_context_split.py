"""Context parallelism in one process: the split of a sequence, batch slicing, positions, the
config (Colossal-AI's ``mode='sequence'`` included) and the combinations refused before any
collective. The multi-process proof is ``test_context_parallel.py``."""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import pytest
import torch

from ember.config import load_config
from ember.errors import ConfigError, DataError
from ember.layout import ParallelLayout
from ember.parallel.context_parallel import positions, shard_batch
from ember.parallel.context_policy import check_context
from ember.parallel.ring import SequenceSplit
from ember.parallel.strategy import check_parallel
from tests.parallel.context_common import tiny_lm


@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("balanced", [True, False])
def test_the_ranks_slices_cover_the_sequence_once_and_positions_name_them(size: int, balanced: bool) -> None:
    sequence = torch.arange(8 * size)
    slices = [SequenceSplit(size, r, balanced).shard(sequence, 0) for r in range(size)]
    assert sorted(torch.cat(slices).tolist()) == sequence.tolist()
    for r, piece in enumerate(slices):
        assert SequenceSplit(size, r, balanced).positions(len(piece)).tolist() == piece.tolist()
    assert torch.equal(SequenceSplit(size, 0, balanced).unshard(slices, 0), sequence)


def test_zigzag_gives_each_rank_a_chunk_from_each_end() -> None:
    chunks = [SequenceSplit(2, r).shard(torch.arange(8), 0).tolist() for r in range(2)]
    assert chunks == [[0, 1, 6, 7], [2, 3, 4, 5]]


def test_a_length_that_does_not_cut_is_refused_not_padded() -> None:
    with pytest.raises(
        DataError, match=r"length 12, which context parallelism over 4 ranks cannot cut into 2 × 4"
    ) as e:
        SequenceSplit(4, 0).check_length(12, "batch[0]")
    assert "multiple of 8 (e.g. 8 or 16" in str(e.value) and "load_balance=False" in str(e.value)
    SequenceSplit(4, 0, balanced=False).check_length(12, "batch[0]")  # 4 contiguous chunks of 3


def test_batches_are_cut_along_their_sequence_dim_and_per_sample_labels_kept() -> None:
    split = SequenceSplit(2, 1)
    x, y, label = torch.arange(16).view(2, 8), torch.arange(16).view(2, 8) + 100, torch.tensor([3, 4])
    cut = shard_batch((x, y, label), split)
    assert cut[0].tolist() == [[2, 3, 4, 5], [10, 11, 12, 13]] and torch.equal(cut[1], cut[0] + 100)
    assert cut[2] is label
    pair = namedtuple("pair", "ids labels")
    assert isinstance(shard_batch(pair(x, y), split), pair)
    nested = shard_batch({"inputs": {"ids": x}, "labels": [y]}, split)
    assert torch.equal(nested["inputs"]["ids"], cut[0]) and torch.equal(nested["labels"][0], cut[1])


def test_a_seq_dim_mapping_keeps_entries_whole_or_cuts_another_dim() -> None:
    split = SequenceSplit(2, 0, balanced=False)
    batch = {"ids": torch.zeros(2, 8), "image": torch.zeros(2, 3, 5), "seq_first": torch.zeros(8, 2)}
    cut = shard_batch(batch, split, {"image": None, "seq_first": 0})
    assert [list(v.shape) for v in cut.values()] == [[2, 4], [2, 3, 5], [4, 2]]
    assert [list(t.shape) for t in shard_batch((torch.zeros(8, 2), torch.zeros(2, 8)), split, {0: 0})] == [
        [4, 2],
        [2, 4],
    ]


def test_tensors_of_different_sequence_lengths_are_refused_naming_both() -> None:
    with pytest.raises(DataError, match=r"batch\['ids'\] and batch\['mask'\].*\(8 and 4") as e:
        shard_batch({"ids": torch.zeros(2, 8), "mask": torch.zeros(2, 4)}, SequenceSplit(2, 0))
    assert "seq_dim={key or position: None}" in str(e.value)


def test_positions_outside_context_parallelism_are_an_arange() -> None:
    assert positions(5).tolist() == [0, 1, 2, 3, 4]


def test_config_context_section_defaults_and_shorthand() -> None:
    assert load_config({"parallel": {"context": 4}}).parallel.context == {"size": 4, "seq_dim": 1, "load_balance": True}
    seq = load_config({"parallel": {"context": {"size": 2, "seq_dim": {"labels": 1, "pixels": None}}}})
    assert seq.parallel.context.seq_dim == {"labels": 1, "pixels": None}
    with pytest.raises(ConfigError, match=r"did you mean 'parallel.context.load_balance'"):
        load_config({"parallel": {"context": {"size": 2, "loadbalance": False}}})
    with pytest.raises(ConfigError, match=r"'parallel.context.seq_dim' got -1"):
        load_config({"parallel": {"context": {"seq_dim": -1}}})
    with pytest.raises(ConfigError, match=r"'context_parallel_size' is Megatron/torchtitan's name.*'parallel'"):
        load_config({"context_parallel_size": 2})


def test_colossalai_sequence_mode_is_contiguous_context_parallelism() -> None:
    cfg = load_config(
        {
            "parallel": {"pipeline": 1, "tensor": {"size": 4, "mode": "sequence"}},
            "gradient_handler": [{"type": "SequenceParallelGradientHandler"}],
        }
    )
    assert cfg.parallel.context == {"size": 4, "seq_dim": 1, "load_balance": False}
    assert cfg.parallel.tensor.size == 1 and cfg.gradient_handler == []  # ember's policy does the handler's work
    assert ParallelLayout.from_config(cfg.parallel, 8).group_ranks("data_context") == [list(range(8))]
    with pytest.raises(ConfigError, match="both split the sequence"):
        load_config({"parallel": {"tensor": {"size": 2, "mode": "sequence"}, "context": 2}})


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({"parallel": {"context": 2}, "zero": {"stage": 1}}, "zero.stage=1"),
        ({"parallel": {"context": 2, "data": 1, "tensor": {"size": 4, "mode": "2d"}}}, "parallel.tensor.mode='2d'"),
        ({"parallel": {"context": 2}, "compile": True, "activation_checkpointing": True}, "compile together"),
    ],
)
def test_combinations_context_parallelism_does_not_run_are_refused_before_any_collective(
    config: dict[str, Any], needle: str
) -> None:
    model = tiny_lm()
    with pytest.raises(ConfigError, match="cannot be combined with") as e:
        check_parallel(load_config(config), model, torch.optim.SGD(model.parameters(), lr=0.1), world_size=8)
    assert needle in str(e.value) and "runs alone, × data" in str(e.value)


def test_pipeline_and_experts_are_refused_too() -> None:
    with pytest.raises(ConfigError, match=r"parallel.pipeline.size=2, parallel.expert=2 in this ember version"):
        check_context(ParallelLayout(pipeline=2, data=2, context=2, expert=2), 0, True)


def test_context_parallelism_on_cuda_names_torchs_context_parallel() -> None:
    with pytest.raises(ConfigError, match=r"torch\.distributed\.tensor\.experimental\.context_parallel"):
        check_context(ParallelLayout(data=1, context=2), 0, False, device=torch.device("cuda", 0))


def test_tensor_times_data_needs_no_fsdp_under_context_parallelism() -> None:
    model = tiny_lm()
    config = load_config({"parallel": {"context": 2, "data": 2, "tensor": {"size": 2, "plan": None}}})
    plan = check_parallel(config, model, torch.optim.SGD(model.parameters(), lr=0.1), world_size=8)
    assert plan.layout.context == 2 and plan.tensor_plan

"""ResumableSampler: deterministic per-epoch order, sharding with padding, mid-epoch start."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import ember
from ember.data import ResumableSampler, is_kept_unsharded, keep_unsharded, make_resumable
from ember.errors import DataError

DATA = list(range(10))


@pytest.mark.parametrize("shuffle", [False, True])
def test_ranks_cover_every_sample_and_pad_the_tail(shuffle: bool) -> None:
    shares = [ResumableSampler(DATA, num_replicas=4, rank=r, shuffle=shuffle, seed=3) for r in range(4)]
    lists = [s.indices() for s in shares]
    assert all(len(x) == 3 for x in lists)
    assert sorted({i for x in lists for i in x}) == DATA
    real = [x[: s.real_num_samples] for s, x in zip(shares, lists, strict=True)]
    assert sorted(i for x in real for i in x) == DATA  # dropping the padded tail counts each once
    assert [s.real_num_samples for s in shares] == [3, 3, 2, 2]


def test_order_depends_only_on_seed_and_epoch() -> None:
    a = ResumableSampler(DATA, num_replicas=1, rank=0, seed=7)
    b = ResumableSampler(DATA, num_replicas=1, rank=0, seed=7)
    a.set_epoch(2)
    b.set_epoch(2)
    assert list(a) == list(b)
    b.set_epoch(3)
    assert list(a) != list(b)


def test_start_at_skips_without_reading_and_only_once() -> None:
    s = ResumableSampler(DATA, num_replicas=2, rank=1, seed=1)
    s.set_epoch(4)
    full = list(s)
    s.start_at(2)
    assert len(s) == 3
    assert list(s) == full[2:]
    assert list(s) == full  # the next epoch starts from the beginning again


def test_drop_last_cuts_to_equal_shares() -> None:
    shares = [ResumableSampler(DATA, num_replicas=3, rank=r, shuffle=False, drop_last=True) for r in range(3)]
    assert [len(s) for s in shares] == [3, 3, 3]
    assert sorted(i for s in shares for i in s) == list(range(9))


def test_get_dataloader_uses_resumable_sampler() -> None:
    ds = TensorDataset(torch.arange(10.0))
    dl = ember.get_dataloader(ds, shuffle=True, batch_size=4, seed=0)
    assert isinstance(dl.sampler, ResumableSampler)
    assert len(dl) == 3
    assert sorted(torch.cat([b[0] for b in dl]).tolist()) == list(range(10))


def test_add_sampler_false_is_a_choice_initialize_keeps() -> None:
    ds = TensorDataset(torch.arange(10.0), torch.zeros(10, dtype=torch.long))
    dl = ember.get_dataloader(ds, batch_size=4, add_sampler=False)
    assert is_kept_unsharded(dl) and not isinstance(dl.sampler, ResumableSampler)
    mine = ember.get_dataloader(ds, batch_size=4, add_sampler=False, sampler=[9, 8, 7])  # your sampler, kept
    assert [b[0].tolist() for b in mine] == [[9.0, 8.0, 7.0]]
    model = torch.nn.Linear(1, 2)
    _, train_dl, test_dl, _ = ember.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), None, dl, mine)
    assert train_dl is dl and test_dl is mine  # returned as built: no sampler of ember's put in
    assert not is_kept_unsharded(ember.get_dataloader(ds, batch_size=4))


def test_keep_unsharded_marks_plain_loaders_and_refuses_split_ones() -> None:
    ds = TensorDataset(torch.arange(10.0))
    plain = DataLoader(ds, batch_size=2)
    assert keep_unsharded(plain) is plain and is_kept_unsharded(plain)
    split = ember.get_dataloader(ds, batch_size=2)
    split.sampler.num_replicas = 2
    with pytest.raises(DataError, match="splits the data across 2 ranks"):
        keep_unsharded(split)


def test_make_resumable_keeps_loader_settings() -> None:
    ds = TensorDataset(torch.arange(10.0))
    dl = make_resumable(DataLoader(ds, batch_size=3, shuffle=True, drop_last=True), seed=0)
    assert isinstance(dl.sampler, ResumableSampler) and dl.sampler.shuffle
    assert dl.batch_size == 3 and dl.drop_last and len(dl) == 3


@pytest.mark.parametrize(
    ("call", "culprit"),
    [
        (lambda: ember.get_dataloader(TensorDataset(torch.zeros(3)), batch_size=0), "batch_size"),
        (lambda: ember.get_dataloader(iter([1, 2]), batch_size=1), "map-style"),
        (lambda: ResumableSampler(DATA, num_replicas=2, rank=2), "rank 2"),
        (lambda: ResumableSampler(DATA, num_replicas=1, rank=0).start_at(11), "position 11"),
    ],
)
def test_bad_data_arguments_raise_data_error(call, culprit: str) -> None:
    with pytest.raises(DataError, match=culprit):
        call()


def test_loader_draws_depend_on_epoch_not_on_global_rng() -> None:
    ds = TensorDataset(torch.arange(10.0))
    dl = ember.get_dataloader(ds, shuffle=True, batch_size=4, seed=0)

    def draw(epoch: int) -> int:
        dl.sampler.set_epoch(epoch)
        it = iter(dl)
        return it._base_seed

    first = draw(3)
    torch.manual_seed(12345)  # a different global RNG state must not change the loader's draw
    assert draw(3) == first
    assert draw(4) != first

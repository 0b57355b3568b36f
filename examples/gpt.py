"""A small GPT-style language model and a toy corpus, shared by the ``gpt_*.py`` parallel examples.

The model is written so that every kind of ember parallelism can use it as it is:

* its forward is its children in order (``embed``, ``blocks.0`` … ``blocks.N``, ``head``), so
  pipeline parallelism can split it between any two of them;
* attention has separate ``q_proj``/``k_proj``/``v_proj``/``out_proj`` Linears and derives the
  head count from the tensors, and the MLP is ``fc1``/``fc2``, so tensor parallelism recognises
  both without a plan (``parallel=dict(tensor=2)``);
* the blocks sit in an ``nn.ModuleList``, which FSDP2 (``zero=dict(stage=3)``) shards block by block.

The data: sequences that count up modulo the vocabulary from a random start; the model learns
to predict the next number (the loss falls from ~3.5 to well under 1 in two epochs).
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

import ember
from ember.trainer import Trainer, hooks

VOCAB, SEQ = 32, 16


class Embed(nn.Module):
    """Token plus learned position embeddings."""

    def __init__(self, vocab: int, dim: int, seq: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))


class Attention(nn.Module):
    """Causal self-attention; ``view(B, T, -1, head_dim)`` lets tensor parallelism split the heads."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, -1, self.head_dim).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out_proj(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.attn, self.ln2, self.mlp = nn.LayerNorm(dim), Attention(dim, heads), nn.LayerNorm(dim), MLP(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Head(nn.Module):
    """Final LayerNorm and the projection to the vocabulary."""

    def __init__(self, dim: int, vocab: int) -> None:
        super().__init__()
        self.ln, self.out = nn.LayerNorm(dim), nn.Linear(dim, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


class GPT(nn.Module):
    """``embed`` → ``blocks`` → ``head``: logits of shape (batch, sequence, vocabulary)."""

    def __init__(self, vocab: int = VOCAB, dim: int = 64, heads: int = 4, layers: int = 4, seq: int = SEQ) -> None:
        super().__init__()
        self.embed = Embed(vocab, dim, seq)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.head = Head(dim, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy over every position."""
    return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def counting_dataset(n: int, seed: int = 0) -> TensorDataset:
    """``n`` sequences ``s, s+1, …`` (mod VOCAB) and the same shifted by one as targets."""
    start = torch.randint(0, VOCAB, (n, 1), generator=torch.Generator().manual_seed(seed))
    seq = (start + torch.arange(SEQ + 1)) % VOCAB
    return TensorDataset(seq[:, :-1], seq[:, 1:])


def train(config: dict[str, Any], description: str) -> None:
    """Launch from torchrun's environment with ``config``, then train the GPT with the Trainer."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32, help="per data-parallel replica")
    args = parser.parse_args()

    ember.launch_from_torch(config={"seed": 0, **config}, verbose=False)
    logger = ember.get_dist_logger()
    torch.manual_seed(0)  # the same initial weights on every rank
    model = GPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    train_dl = ember.get_dataloader(counting_dataset(512), shuffle=True, batch_size=args.batch_size)
    test_dl = ember.get_dataloader(counting_dataset(128, seed=1), batch_size=args.batch_size)
    engine, train_dl, test_dl, _ = ember.initialize(model, optimizer, lm_loss, train_dl, test_dl)
    logger.info(f"{description}: {engine.parallel.name}", ranks=[0])

    # engine.schedule is the pipeline schedule under parallel.pipeline, else None (the default loop).
    trainer = Trainer(engine, logger=logger, schedule=engine.schedule)
    history = trainer.fit(train_dl, epochs=args.epochs, test_dataloader=test_dl,
                          hooks=[hooks.LossHook(), hooks.LogMetricByEpochHook(logger)])  # fmt: skip
    losses = history.values("train/loss")
    logger.info(f"train/loss {losses[0]:.3f} -> {losses[-1]:.3f}; test/loss {history.values('test/loss')[-1]:.3f}",
                ranks=[0])  # fmt: skip

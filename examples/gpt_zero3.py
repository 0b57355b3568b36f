"""The GPT of ``gpt.py`` with ZeRO stage 3 (FSDP2 ``fully_shard``) over 2 processes.

Parameters, gradients and AdamW state are sharded over the data-parallel ranks: each block is
gathered for its forward and backward and freed after. ``engine.state_dict()`` still gives the
full model on rank 0. Each rank trains on its own half of every global batch.

Run: torchrun --nproc_per_node 2 examples/gpt_zero3.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from gpt import train

if __name__ == "__main__":
    train({"zero": {"stage": 3}}, "GPT, ZeRO-3 (FSDP2)")

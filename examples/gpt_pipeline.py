"""The GPT of ``gpt.py`` with pipeline parallelism over 2 processes.

Rank 0 holds ``embed`` and ``blocks.0-1``, rank 1 ``blocks.2-3`` and ``head`` (the split point
``"blocks.2"``; leave ``split_points`` out for an even split). Each batch of 32 runs as 4
micro-batches through torch's 1F1B schedule: ``Trainer(engine, schedule=engine.schedule)``.
The last stage's loss is broadcast, so the loss hooks log on every rank.

Run: torchrun --nproc_per_node 2 examples/gpt_pipeline.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from gpt import train

if __name__ == "__main__":
    pipeline = {"size": 2, "microbatches": 4, "schedule": "1f1b", "split_points": ["blocks.2"]}
    train({"parallel": {"pipeline": pipeline}}, "GPT, pipeline parallel 2")

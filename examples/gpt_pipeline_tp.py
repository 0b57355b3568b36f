"""The GPT of ``gpt.py`` on 4 processes: pipeline parallel 2 × tensor parallel 2.

Ranks 0-1 hold stage 0 (``embed``, ``blocks.0-1``), ranks 2-3 stage 1 (``blocks.2-3``,
``head``); inside each stage the two ranks split the attention and MLP Linears of its blocks
(the recognised plan, as ``plans.gpt_block(prefix="blocks.*")`` would give). Each batch of 32
runs as 4 micro-batches through torch's 1F1B schedule: ``Trainer(engine, schedule=engine.schedule)``.
The losses are those of ``gpt_pipeline.py`` and ``gpt_tensor_parallel.py`` (same model and batches).

Run: torchrun --nproc_per_node 4 examples/gpt_pipeline_tp.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from gpt import train

if __name__ == "__main__":
    pipeline = {"size": 2, "microbatches": 4, "schedule": "1f1b", "split_points": ["blocks.2"]}
    train({"parallel": {"pipeline": pipeline, "tensor": 2}}, "GPT, pipeline parallel 2 × tensor parallel 2")

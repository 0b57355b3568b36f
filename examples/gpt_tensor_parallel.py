"""The GPT of ``gpt.py`` with tensor parallelism over 2 processes.

Each rank holds half of every attention and MLP projection (``q_proj``/``k_proj``/``v_proj`` and
``fc1`` split by columns, ``out_proj`` and ``fc2`` by rows); ember recognises these blocks, so no
plan is needed (``parallel=dict(tensor=dict(size=2, plan=plans.gpt_block(prefix="blocks.*")))``
says the same explicitly). Both ranks see the same batches.

Run: torchrun --nproc_per_node 2 examples/gpt_tensor_parallel.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from gpt import train

if __name__ == "__main__":
    train({"parallel": {"tensor": 2}}, "GPT, tensor parallel 2")

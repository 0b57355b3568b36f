"""The GPT of ``gpt.py`` on a 2 × 2 mesh of 4 processes: FSDP2 over data, tensor parallel inside.

Ranks 0-1 and 2-3 are the two tensor-parallel pairs (they see the same batches); ranks 0, 2 and
1, 3 shard their halves of the weights with ZeRO stage 3 over the data dim.

Run: torchrun --nproc_per_node 4 examples/gpt_fsdp_tp.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from gpt import train

if __name__ == "__main__":
    train({"parallel": {"tensor": 2}, "zero": {"stage": 3}}, "GPT, 2 × 2 FSDP2 × tensor parallel")

"""Colossal-AI's ``colossalai.nn.layer.moe`` over :mod:`ember.parallel.moe`.

``Experts``/``FFNExperts`` hold this rank's experts (``num_experts / max_ep_size`` of them),
``Top1Router``/``Top2Router`` route with Colossal-AI's capacity rule and auxiliary losses,
``MoeLayer`` and ``MoeModule`` return ``(output, l_aux)`` as Colossal-AI's do: add ``l_aux`` with
``MOE_CONTEXT.add_loss`` and wrap the criterion in ``MoeLoss`` (``colossalai.nn.loss``). Token
exchange, gradient reduction and clipping are ember's expert parallelism (docs/parallel.md);
it runs on CPU/gloo and GPU/NCCL (Colossal-AI's asserted CUDA). ``TPExperts`` (fewer experts than
ranks, each split by tensor parallelism) is not provided.
"""

from __future__ import annotations

from .layers import Experts, FFNExperts, MoeLayer, MoeModule, TPExperts, build_ffn_experts
from .routers import MoeRouter, NormalNoiseGenerator, Top1Router, Top2Router, UniformNoiseGenerator

__all__ = [
    "Experts",
    "FFNExperts",
    "MoeLayer",
    "MoeModule",
    "MoeRouter",
    "NormalNoiseGenerator",
    "TPExperts",
    "Top1Router",
    "Top2Router",
    "UniformNoiseGenerator",
    "build_ffn_experts",
]

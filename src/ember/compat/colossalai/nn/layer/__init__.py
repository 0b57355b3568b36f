"""Colossal-AI's ``colossalai.nn.layer``: its parallel layers, by mode, under the same sub-module paths
(``parallel_sequence``: ring self-attention on ember's context parallelism; ``moe``: mixture of
experts on ember's expert parallelism)."""

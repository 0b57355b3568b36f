"""Colossal-AI's ``colossalai.nn.layer``: its sub-packages (``moe``) import on use."""

"""Ready tensor-parallel plans for common blocks, and recognition of models that fit them.

A plan maps module names (``fnmatch`` patterns such as ``"blocks.*.attn.q_proj"``) to a style:
``"colwise"`` (split the output features), ``"rowwise"`` (split the input features; the outputs
are summed across the tensor group), ``"sequence"`` (split activations along the sequence dim),
or one of torch's :class:`~torch.distributed.tensor.parallel.ParallelStyle` objects. Put it in
the config as ``parallel=dict(tensor=dict(size=2, plan=...))``.

Example:
    >>> from ember.parallel import plans
    >>> plans.mlp("fc1", "fc2", prefix="blocks.*.mlp")
    {'blocks.*.mlp.fc1': 'colwise', 'blocks.*.mlp.fc2': 'rowwise'}
    >>> plan = {**plans.attention(prefix="blocks.*.attn"), **plans.mlp(prefix="blocks.*.mlp")}
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ember.errors import ConfigError

Plan = dict[str, Any]
"""Module-name pattern -> ``"colwise"`` | ``"rowwise"`` | ``"sequence"`` | a torch ParallelStyle."""

ATTENTION_NAMES = (("q_proj", "k_proj", "v_proj", "out_proj"), ("query", "key", "value", "out"))
MLP_NAMES = (("fc1", "fc2"), ("up_proj", "down_proj"), ("c_fc", "c_proj"), ("w1", "w2"))


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def mlp(up: str = "fc1", down: str = "fc2", prefix: str = "") -> Plan:
    """Megatron's MLP split: the first Linear column-wise, the second row-wise.

    The activation between them runs on each rank's slice of the hidden features, so the
    block needs one all-reduce (after ``down``) forward and one backward.

    Args:
        up: the name of the Linear that widens (``d -> hidden``).
        down: the name of the Linear that narrows (``hidden -> d``).
        prefix: where the MLP sits in the model, a pattern (``"blocks.*.mlp"``) or ``""``.

    Returns:
        ``{prefix.up: "colwise", prefix.down: "rowwise"}``.

    Example:
        >>> mlp("0", "2")   # nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
        {'0': 'colwise', '2': 'rowwise'}
    """
    return {_join(prefix, up): "colwise", _join(prefix, down): "rowwise"}


def attention(q: str = "q_proj", k: str = "k_proj", v: str = "v_proj", out: str = "out_proj", prefix: str = "") -> Plan:
    """A GPT-style self-attention block: q, k and v column-wise, the output projection row-wise.

    Each rank then holds ``heads / tensor_size`` whole heads. The block's ``forward`` must
    derive the head count from the tensors it gets, e.g. ``q.view(B, T, -1, head_dim)``, not
    from a fixed ``n_heads`` (the local q has ``C / tensor_size`` features); the number of
    heads must divide by the tensor size. A fused qkv projection (one Linear giving 3C) cannot
    be split column-wise this way: give it three Linears.

    Args:
        q: name of the query projection.
        k: name of the key projection.
        v: name of the value projection.
        out: name of the output projection.
        prefix: where the attention module sits, a pattern (``"blocks.*.attn"``) or ``""``.

    Returns:
        The plan for the four projections.

    Example:
        >>> attention(prefix="attn")
        {'attn.q_proj': 'colwise', 'attn.k_proj': 'colwise', 'attn.v_proj': 'colwise', 'attn.out_proj': 'rowwise'}
    """
    return {
        _join(prefix, q): "colwise",
        _join(prefix, k): "colwise",
        _join(prefix, v): "colwise",
        _join(prefix, out): "rowwise",
    }


def gpt_block(attn: str = "attn", mlp_name: str = "mlp", prefix: str = "", **names: str) -> Plan:
    """:func:`attention` under ``prefix.attn`` plus :func:`mlp` under ``prefix.mlp_name``.

    Args:
        attn: the attention module's name inside the block.
        mlp_name: the MLP module's name inside the block.
        prefix: the block(s), e.g. ``"blocks.*"`` for every block of a ``ModuleList``.
        **names: the projection names (``q``, ``k``, ``v``, ``out``, ``up``, ``down``).

    Example:
        >>> sorted(gpt_block(prefix="blocks.*", up="c_fc", down="c_proj"))[:2]
        ['blocks.*.attn.k_proj', 'blocks.*.attn.out_proj']
    """
    attn_names = {k: names.pop(k) for k in ("q", "k", "v", "out") if k in names}
    mlp_names = {k: names.pop(k) for k in ("up", "down") if k in names}
    if names:
        raise ConfigError(f"gpt_block got unknown projection names {sorted(names)}; use q, k, v, out, up, down")
    return {**attention(prefix=_join(prefix, attn), **attn_names), **mlp(prefix=_join(prefix, mlp_name), **mlp_names)}


def recognise(model: nn.Module) -> Plan:
    """A plan for the parts of ``model`` that match a ready plan (empty when nothing does).

    Recognised: a module whose children are the Linears ``q_proj, k_proj, v_proj, out_proj``
    (or ``query, key, value, out``) -> :func:`attention`; a module whose children are the
    Linears ``fc1, fc2`` (or ``up_proj, down_proj``, ``c_fc, c_proj``, ``w1, w2``) -> :func:`mlp`;
    an ``nn.Sequential`` of exactly ``Linear, activation, Linear`` -> :func:`mlp`.
    """
    plan: Plan = {}
    for name, module in model.named_modules():
        children = dict(module.named_children())
        for q, k, v, out in ATTENTION_NAMES:
            if all(isinstance(children.get(n), nn.Linear) for n in (q, k, v, out)):
                plan.update(attention(q, k, v, out, prefix=name))
        for up, down in MLP_NAMES:
            if all(isinstance(children.get(n), nn.Linear) for n in (up, down)):
                plan.update(mlp(up, down, prefix=name))
        if isinstance(module, nn.Sequential) and _is_linear_act_linear(module):
            plan.update(mlp("0", "2", prefix=name))
    return plan


def _is_linear_act_linear(seq: nn.Sequential) -> bool:
    if len(seq) != 3:
        return False
    first, act, last = seq
    elementwise = not any(True for _ in act.parameters()) and not isinstance(act, (nn.Linear, nn.Sequential))
    return isinstance(first, nn.Linear) and isinstance(last, nn.Linear) and elementwise

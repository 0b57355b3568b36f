"""Other libraries' names on ember's objects, so their programs run after an import rewrite.

=====================================  ==========================================
their import                           ember's
=====================================  ==========================================
``colossalai`` (and sub-modules)       ``ember.compat.colossalai`` (same paths)
``pytorch_accelerated`` (and subs)     ``ember.compat.pytorch_accelerated``
detectron2/LiBai ``engine``, events    ``ember.compat.detectron2``
``from t9k import em``                 ``from ember.compat.t9k import em``
=====================================  ==========================================

Each name is an alias of, or a thin adapter over, ember's own object: one training loop (the
:class:`ember.trainer.Trainer`), one checkpoint format, one tracking store. This is the top
layer: it imports ember's public names only, and nothing in ember imports it. What still
differs, and why, is in ``docs/migrating.md``.
"""

"""detectron2's and LiBai's trainer API on ember: ``engine``, ``engine.hooks``, ``utils.events``.

=============================================  =================================================
their import                                   ember's
=============================================  =================================================
``detectron2.engine`` / ``libai.engine``       ``ember.compat.detectron2.engine``
``detectron2.engine.train_loop``               ``ember.compat.detectron2.engine.train_loop``
``libai.engine.trainer``                       ``ember.compat.detectron2.engine.trainer``
``detectron2.engine.hooks`` / ``libai...``     ``ember.compat.detectron2.engine.hooks``
``detectron2.utils.events`` / ``libai...``     ``ember.compat.detectron2.utils.events``
``detectron2.checkpoint``                      ``ember.compat.detectron2.checkpoint``
``libai.utils.checkpoint``                     ``ember.compat.detectron2.utils.checkpoint``
=============================================  =================================================

``SimpleTrainer`` runs on ember's :class:`~ember.trainer.Trainer` (``fit(max_steps=...)``), its
hooks adapted onto ember's events, its storage an ember ``StepStorage``, its checkpoints
ember's. What differs from detectron2, and why: ``docs/migrating.md``.
"""

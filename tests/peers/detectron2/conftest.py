"""detectron2's own tests: the one that needs a GPU carries ember's ``cuda`` mark.

``test_simple_trainer_cuda`` is detectron2's ``test_simple_trainer`` on ``device="cuda"``; without
a GPU detectron2's own ``skipIf`` would skip it. Marked ``cuda``, it is deselected from ``make test``
like ember's other GPU tests (``-m 'not cuda'``) and runs with ``pytest -m cuda tests/peers``.
"""

from __future__ import annotations

import pytest

NEEDS_A_GPU = ("test_engine.py::TestTrainer::test_simple_trainer_cuda",)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by mark
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.endswith(NEEDS_A_GPU):
            item.add_marker(pytest.mark.cuda)

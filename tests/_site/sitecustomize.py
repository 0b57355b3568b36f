"""Imported at start-up by every Python process the tests start (``tests/conftest.py`` puts this
folder on ``PYTHONPATH``): at exit, after every other exit handler, freeze the garbage collector.

Interpreter shutdown otherwise walks every object torch's import made (~300,000) to collect
cycles: 0.37 s of CPU a process on the 2-core development VM, and the suite starts many
(torchrun agents and ranks, ``ember`` commands, servers): the multi-process tests took 451 s
summed over the workers before, 379 s after. The handler is registered first, so it runs last:
the other exit handlers (ember's close its live runs and leave the process group there),
``weakref.finalize`` callbacks and the flushing of standard streams all happen as usual; only
cyclic garbage left at exit is not collected before the process ends. Tests only: ember itself
changes nothing at exit.
"""

import atexit
import gc

atexit.register(gc.freeze)

"""Imported at start-up by every Python process the tests start (``tests/conftest.py`` puts this
folder on ``PYTHONPATH``): at exit, after every other exit handler, freeze the garbage collector.

Interpreter shutdown otherwise walks every object torch's import made (~300,000) to collect
cycles: 0.37 s of CPU a process on the 2-core CI machine, and the suite starts a few hundred
(torchrun agents and ranks, ``ember`` commands, servers). The handler is registered first, so it
runs last: exit handlers and ``weakref.finalize`` callbacks (ember's runs close in those) and the
flushing of standard streams all happen as usual; only cyclic garbage left at exit is not
collected before the process ends. Tests only: ember itself changes nothing at exit.
"""

import atexit
import gc

atexit.register(gc.freeze)

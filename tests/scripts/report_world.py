"""Reports this rank's view of the job and its own arguments (for the `ember run` test)."""

from __future__ import annotations

import os
import sys

from tests.dist import report

import ember

ember.launch_from_torch(verbose=False)
report({"world_size": ember.context.world_size, "argv": sys.argv[1:],
        "rdzv_fix": os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE")})  # fmt: skip

"""A tracked process for the multi-process tests: ``worker.py MODE N`` (store from EMBER_HOME).

Modes: ``kill`` logs N points, prints LOGGED, sleeps 2 s, prints SLEPT and waits to be killed;
``killnow`` prints LOGGED and waits at once; ``writer`` logs N points over about 2 s and
finishes; ``exit`` / ``raise`` / ``interrupt`` log N points and end without ``finish()``.
"""

from __future__ import annotations

import sys
import time

from ember import track

mode, n = sys.argv[1], int(sys.argv[2])
run = track.create_run(name=f"worker-{mode}", hparams={"mode": mode, "n": n})
print(f"PATH {run.path}", flush=True)
for step in range(n):
    run.log("train", {"loss": 1.0 / (step + 1), "step_sq": step * step}, step=step, epoch=step // 100)
    if mode == "writer" and step % 25 == 0:
        time.sleep(0.015)
print("LOGGED", flush=True)
if mode == "kill":
    time.sleep(2.0)
    print("SLEPT", flush=True)
if mode in ("kill", "killnow"):
    time.sleep(120)
elif mode == "writer":
    run.finish()
elif mode == "raise":
    raise RuntimeError("the training script failed")
elif mode == "interrupt":
    raise KeyboardInterrupt

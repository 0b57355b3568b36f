"""Runs one contender in a fresh process: reads the spec as JSON on stdin, prints the result as JSON."""

from __future__ import annotations

import json
import sys

from benchmarks.harness import run_inline


def main() -> int:
    spec = json.loads(sys.stdin.read())
    result = run_inline(spec)
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

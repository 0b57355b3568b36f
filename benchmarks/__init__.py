"""ember's benchmarks: ember against the hand-written loop and the peers, side by side.

Run ``python -m benchmarks`` (every case) or ``python -m benchmarks CASE`` (see ``--help``);
``docs/performance.md`` explains the cases and shows the latest results.
"""

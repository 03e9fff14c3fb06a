"""Benchmarks of session-router, each printing ratios measured side by side in one run.

Run one from the repository root with ``python -m bench.NAME [--quick]``; ``bench.harness``
holds what they share (statistics, load generation, drivers, the local cluster, tables).
"""

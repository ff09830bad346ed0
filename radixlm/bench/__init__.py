"""Benchmarks: offline throughput vs transformers, dtype on the CPU, server cold start.

Entry point: `radixlm bench offline | dtype | cold-start` (see `radixlm/bench/cli.py`);
results are described in docs/benchmarks.md.
"""

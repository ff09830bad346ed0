"""Benchmarks: a serving load generator, offline throughput vs transformers, one-batch
roofline, long-prompt ITL, dtype on the CPU, server cold start.

Entry point: `radixlm bench serve | offline | one-batch | long-prompt | dtype | cold-start`
(see `radixlm/bench/cli.py`); results are described in docs/benchmarks.md.
"""

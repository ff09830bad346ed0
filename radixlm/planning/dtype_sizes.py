"""Bytes per element of the run and KV-cache dtypes, and the planner's weight formats.

Torch-free (no model config either): `radixlm memory`'s parser takes its choices from
here, and every `radixlm` command builds that parser, `serve` included, before it starts
its children; importing the planner there would load torch first (~1.5 s of a start).
"""

from __future__ import annotations

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# --kv-cache-dtype values. fp8 is known to the planner (`radixlm memory`) only for now.
KV_CACHE_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8_e4m3": 1, "fp8_e5m2": 1}
# `radixlm memory --quantization` values other than auto.
QUANTIZATIONS = ("none", "fp8", "int4")

"""The C++ kernels' entries as torch ops (`radixlm::<name>`), which compiled decode graphs
hold. Each op's schema and output shape (its fake, for tracing) are defined here, in
Python, by `kernel_op`; its CPU implementation is registered by the kernel's own library
when `build.load_kernel` loads it (`TORCH_LIBRARY_IMPL` under RADIXLM_TORCH_OPS), so a
graph's call reaches the C++ function through the dispatcher with no Python between
(~2 us a call, where a Python custom op took ~10: ~1.5 ms of a 10 ms decode step).

Invariant: an op runs only once its kernel has loaded (the methods that call it under
torch.compile loaded it when they were built; eager callers call the kernel module
directly). Other builds of a source (tests' variants, benchmarks' old versions) register
nothing (cpu_kernels/build.py, MAIN_CFLAGS).
"""

from __future__ import annotations

from typing import Callable

import torch

_LIB = torch.library.Library("radixlm", "FRAGMENT")


def kernel_op(schema: str) -> Callable[[Callable], Callable]:
    """Define `radixlm::<schema>` (e.g. "f(Tensor x, int n) -> Tensor") and register the
    decorated function as its fake (the output's shape and dtype from the inputs')."""
    name = schema.split("(", 1)[0]
    _LIB.define(schema)

    def register(fake: Callable) -> Callable:
        torch.library.register_fake(f"radixlm::{name}", fake, lib=_LIB)
        return fake

    return register

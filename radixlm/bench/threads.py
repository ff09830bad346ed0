"""torch's intra-op thread count, set for a benchmark and restored afterwards."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Every engine measured inside runs with `n` threads (process-global in torch)."""
    if n < 1:
        raise ValueError(f"--num-threads must be >= 1, got {n}")
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)

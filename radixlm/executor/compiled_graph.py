"""CompiledGraph: a decode forward compiled by torch.compile for one batch size.

The CPU's counterpart of a CUDA graph (`decode_graph_runner.py` holds one per batch size
and pads batches to it). Inductor's CPU backend fuses the step's elementwise work (RMSNorm,
RoPE, SiLU x up, residual adds, the KV write) into generated C++ and calls the matmuls and
the attention kernel as external ops, so the step no longer pays per-op dispatch and
Python for each of its ~1,000 small ops.

More: docs/executor.md, "executor/compiled_graph.py".
"""

from __future__ import annotations

import os
from typing import Callable

import torch

from radixlm.runtime.cache_dir import cache_root


def use_persistent_inductor_cache() -> str:
    """Point inductor's caches into radixlm's cache folder unless the user chose one;
    returns the folder used."""
    if not os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_root() / "inductor")
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]


class CompiledGraph:
    """One batch size's compiled decode forward (the `Graph` protocol)."""

    # The runner's graphs share one code object (the capture lambda): one dynamo cache
    # entry per batch size, so capture raises the recompile limit to the number of sizes.
    def __init__(self, num_sizes: int) -> None:
        self.num_sizes = num_sizes
        self.fn: Callable[[], torch.Tensor] | None = None

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        import torch._inductor.config as inductor_config

        self.fn = torch.compile(fn, fullgraph=True, dynamic=False)
        # Compilation happens at this first call, under these settings.
        with torch._dynamo.config.patch(recompile_limit=max(8, self.num_sizes + 1)), \
                inductor_config.patch(freezing=True):
            return self.fn()

    def replay(self) -> torch.Tensor:
        with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
            return self.fn()


def compiled_graph_factory(num_sizes: int) -> Callable[[], CompiledGraph]:
    use_persistent_inductor_cache()
    return lambda: CompiledGraph(num_sizes)

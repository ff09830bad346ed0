"""CompiledGraph: a decode forward compiled by torch.compile for one batch size.

The CPU's counterpart of a CUDA graph (`decode_graph_runner.py` holds one per batch size
and pads batches to it). Inductor's CPU backend fuses the step's elementwise work (RMSNorm,
RoPE, SiLU x up, residual adds, the KV write) into generated C++ and calls the matmuls and
the attention kernel as external ops, so the step no longer pays per-op dispatch and
Python for each of its ~1,000 small ops.

Invariant (a CUDA graph's): a replay reads the tensors the capture read, by identity --
the runner's static buffers, the pools' buffers and the weights -- so it calls inductor's
compiled function on them directly, without dynamo's frame, guards or input gathering.

More: docs/executor.md, "executor/compiled_graph.py".
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import torch

from radixlm.runtime.cache_dir import cache_root


def use_persistent_inductor_cache() -> str:
    """Point inductor's caches into radixlm's cache folder unless the user chose one;
    returns the folder used."""
    if not os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_root() / "inductor")
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]


# Ops whose weights oneDNN packed ahead (models/linear/: the dense and w8a8 methods).
_PREPACKED_NAMESPACES = ("mkldnn", "onednn")


def _reads_prepacked_weights(gm: torch.fx.GraphModule) -> bool:
    """Does the graph call a oneDNN linear on a prepacked weight? Inductor lowers those
    only with the weights as constants: freezing, which AOTAutograd's cache refuses."""
    return any(isinstance(n.target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket))
               and str(n.target).split(".")[0] in _PREPACKED_NAMESPACES
               for n in gm.graph.nodes)


class _NeedsFreezing(Exception):
    """Raised by the backend for a graph traced without freezing that needs it."""


@dataclass
class CompileChoice:
    """Settled by the first graph of a runner and kept for the others: freeze (the
    weights as constants, decided before tracing) once a graph read prepacked weights."""
    freezing: bool = False


class CompiledGraph:
    """One batch size's compiled decode forward (the `Graph` protocol)."""

    # The runner's graphs share one code object (the capture lambda): one dynamo cache
    # entry per batch size, so capture raises the recompile limit to the number of sizes.
    def __init__(self, num_sizes: int, choice: CompileChoice) -> None:
        self.num_sizes = num_sizes
        self.choice = choice
        self.compiled: Callable[..., list[torch.Tensor]] | None = None
        self.inputs: list[torch.Tensor] = []

    def _backend(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        """Dynamo's backend: inductor, keeping its compiled function and the graph's
        inputs (the real tensors, in the function's order) for `replay`."""
        from torch._inductor.compile_fx import compile_fx

        outputs = gm.graph.output_node().args[0]
        if len(outputs) != 1:
            raise RuntimeError(f"a decode graph must return only the logits, not "
                               f"{len(outputs)} values")
        if not self.choice.freezing and _reads_prepacked_weights(gm):
            raise _NeedsFreezing()
        self.compiled = compile_fx(gm, example_inputs)
        self.inputs = list(example_inputs)
        return self.compiled

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        try:
            return self._compile_and_run(fn)
        except torch._dynamo.exc.BackendCompilerFailed as e:
            if not isinstance(e.inner_exception, _NeedsFreezing):
                raise
        self.choice.freezing = True
        return self._compile_and_run(fn)

    def _compile_and_run(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        import torch._inductor.config as inductor_config

        compiled = torch.compile(fn, backend=self._backend, fullgraph=True, dynamic=False)
        # Compilation happens at this first call, under these settings. No inference-mode
        # entry in the graph (the caller holds inference mode) and freezing only where
        # prepacked weights need it: AOTAutograd's cache refuses both, and a graph in it
        # loads at a second start instead of being traced and lowered again. No input
        # size asserts: the inputs are the captured tensors (the invariant above).
        with torch._dynamo.config.patch(recompile_limit=max(8, self.num_sizes + 1)), \
                inductor_config.patch(freezing=self.choice.freezing, size_asserts=False,
                                      alignment_asserts=False):
            return compiled()

    def replay(self) -> torch.Tensor:
        return self.compiled(*self.inputs)[0]


def compiled_graph_factory(num_sizes: int) -> Callable[[], CompiledGraph]:
    use_persistent_inductor_cache()
    choice = CompileChoice()
    return lambda: CompiledGraph(num_sizes, choice)

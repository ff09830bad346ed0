"""DecodeGraphRunner: decode forwards run from graphs made once per batch size.

A decode step of a small model is hundreds of small ops whose per-op overhead dominates:
kernel launches on a GPU, dispatch and Python on a CPU. At start-up the runner makes one
graph of the model's decode forward per batch size in `batch_sizes`
(`capture_batch_sizes`, up to --cuda-graph-max-bs / --torch-compile-max-bs) and afterwards
a decode batch of B requests runs the graph of the smallest size P >= B. A graph is:

    CudaGraph       a captured CUDA graph, replayed (CUDA);
    CompiledGraph   the forward compiled by torch.compile for that size (the CPU's
                    "CPU graph": executor/compiled_graph.py);
    EagerReplayGraph  the forward re-run eagerly (the CPU stand-in in tests).

More: docs/executor.md, "executor/decode_graph_runner.py".
"""

from __future__ import annotations

import bisect
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

import torch

from radixlm.forward_batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from radixlm.mem import ReqToTokenPool, TokenToKVPool

logger = logging.getLogger(__name__)


class EagerRunner(Protocol):
    """What the graphs capture (executor/model_runner.py's ModelRunner): the eager forward
    over the pools on one device."""
    device: torch.device
    req_to_token_pool: "ReqToTokenPool"
    token_to_kv_pool: "TokenToKVPool"

    def run_model(self, fb: ForwardBatch) -> torch.Tensor: ...


def capture_batch_sizes(max_bs: int) -> list[int]:
    """1, 2, 4, 8, 12, 16, 24, 32, 40, ... (steps of 8), up to and including max_bs.

    Fine steps at small sizes, where padding costs most in relative terms; a batch of B
    pads to the next size, at most 7 rows above 16 (SGLang uses a similar ladder).
    """
    if max_bs < 1:
        raise ValueError(f"--cuda-graph-max-bs must be at least 1, got {max_bs}")
    ladder = [1, 2, 4, 8, 12] + list(range(16, max_bs + 1, 8))
    sizes = sorted({s for s in ladder if s <= max_bs} | {max_bs})
    return sizes


class Graph(Protocol):
    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Record fn (reading only the static buffers); return its first output."""

    def replay(self) -> torch.Tensor:
        """Run the recorded fn again on the buffers' current contents; its output."""


GraphFactory = Callable[[], Graph]


class CudaGraph:
    """torch.cuda.CUDAGraph; all graphs of a runner share one memory pool (their
    activations never live at the same time)."""

    def __init__(self, pool) -> None:
        self.graph = torch.cuda.CUDAGraph()
        self.pool = pool

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        with torch.cuda.graph(self.graph, pool=self.pool):
            self.out = fn()
        return self.out

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.out


class EagerReplayGraph:
    """The CPU stand-in for tests: `replay` runs the recorded forward again and copies its
    result into the captured output, exactly the contract of a CUDA graph replay (one
    output tensor, overwritten in place)."""

    def __init__(self) -> None:
        self.fn: Callable[[], torch.Tensor] | None = None
        self.out: torch.Tensor | None = None

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        self.fn = fn
        self.out = fn()
        return self.out

    def replay(self) -> torch.Tensor:
        self.out.copy_(self.fn())
        return self.out


def cuda_graph_factory() -> GraphFactory:
    pool = torch.cuda.graph_pool_handle()
    return lambda: CudaGraph(pool)


@dataclass
class _StaticInputs:
    """The decode inputs of the largest captured batch; graph P reads rows [0, P)."""
    input_ids: torch.Tensor  # [max_bs] int64
    positions: torch.Tensor  # [max_bs] int64
    req_pool_indices: torch.Tensor  # [max_bs] int64
    seq_lens: torch.Tensor  # [max_bs] int64
    out_cache_loc: torch.Tensor  # [max_bs] int64
    logits_indices: torch.Tensor  # [max_bs] int64, arange: one token per request


class DecodeGraphRunner:
    def __init__(self, runner: EagerRunner, batch_sizes: list[int],
                 graph_factory: GraphFactory | None = None, kind: str = "CUDA graphs") -> None:
        """kind: what the graphs are, for the log line."""
        self.runner = runner
        self.kind = kind
        self.batch_sizes = sorted(set(batch_sizes))
        self.max_bs = self.batch_sizes[-1]
        self.dummy_row = runner.req_to_token_pool.dummy_row
        dev = runner.device
        zeros = lambda: torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.static = _StaticInputs(
            input_ids=zeros(), positions=zeros(),
            req_pool_indices=torch.full((self.max_bs,), self.dummy_row, dtype=torch.int64,
                                        device=dev),
            seq_lens=torch.ones(self.max_bs, dtype=torch.int64, device=dev),
            out_cache_loc=zeros(), logits_indices=torch.arange(self.max_bs, device=dev))
        self.graphs: dict[int, Graph] = {}
        self.replays = 0
        self.padded_rows = 0  # padding rows computed over all replays
        self._capture(graph_factory or cuda_graph_factory())

    def _static_batch(self, bs: int) -> ForwardBatch:
        """A ForwardBatch over rows [0, bs) of the static buffers. seq_lens_cpu is a
        placeholder (the graph-capable backends never read it in decode)."""
        s = self.static
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE, batch_size=bs, input_ids=s.input_ids[:bs],
            positions=s.positions[:bs], req_pool_indices=s.req_pool_indices[:bs],
            seq_lens=s.seq_lens[:bs], out_cache_loc=s.out_cache_loc[:bs],
            logits_indices=s.logits_indices[:bs], seq_lens_cpu=[1] * bs,
            req_to_token_pool=self.runner.req_to_token_pool,
            token_to_kv_pool=self.runner.token_to_kv_pool)

    @torch.inference_mode()
    def _capture(self, factory: GraphFactory) -> None:
        """Largest size first, so the shared memory pool (CUDA) is sized by the largest
        graph and the smaller ones fit in what it already holds. The static buffers hold the dummy
        request in every row during capture: the warm-up and captured runs write K/V only
        into slot 0."""
        t0 = time.perf_counter()
        run = self.runner.run_model
        for bs in reversed(self.batch_sizes):
            fb = self._static_batch(bs)
            run(fb)  # warm-up: triton autotuning/compilation, cuBLAS workspaces (eager)
            if self.runner.device.type == "cuda":
                torch.cuda.synchronize(self.runner.device)
            graph = factory()
            graph.capture(lambda fb=fb: run(fb))
            self.graphs[bs] = graph
        self.capture_s = time.perf_counter() - t0
        logger.info("made %d decode %s (batch sizes %s) in %.1f s", len(self.graphs),
                    self.kind, _ranges(self.batch_sizes), self.capture_s)

    def can_run(self, fb: ForwardBatch) -> bool:
        return fb.forward_mode is ForwardMode.DECODE and fb.batch_size <= self.max_bs

    def padded_size(self, bs: int) -> int:
        return self.batch_sizes[bisect.bisect_left(self.batch_sizes, bs)]

    @torch.inference_mode()
    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        """The logits [B, vocab] of a decode batch (a view of the graph's output)."""
        bs = fb.batch_size
        size = self.padded_size(bs)
        s = self.static
        s.input_ids[:bs].copy_(fb.input_ids)
        s.positions[:bs].copy_(fb.positions)
        s.req_pool_indices[:bs].copy_(fb.req_pool_indices)
        s.seq_lens[:bs].copy_(fb.seq_lens)
        s.out_cache_loc[:bs].copy_(fb.out_cache_loc)
        if size > bs:
            # A larger earlier batch left real rows here: reset them to the dummy request.
            s.input_ids[bs:size].zero_()
            s.positions[bs:size].zero_()
            s.req_pool_indices[bs:size].fill_(self.dummy_row)
            s.seq_lens[bs:size].fill_(1)
            s.out_cache_loc[bs:size].zero_()
        out = self.graphs[size].replay()
        self.replays += 1
        self.padded_rows += size - bs
        return out[:bs]


def _ranges(sizes: list[int]) -> str:
    return ", ".join(map(str, sizes)) if len(sizes) <= 8 else \
        f"{', '.join(map(str, sizes[:5]))}, ..., {sizes[-1]}"

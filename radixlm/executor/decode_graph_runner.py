"""DecodeGraphRunner: decode forwards run from graphs made once per batch size.

A decode step of a small model is hundreds of small ops whose per-op overhead dominates
(kernel launches on a GPU, dispatch and Python on a CPU). The runner makes one graph of
the decode forward per size in `batch_sizes` (`capture_batch_sizes`); a decode batch of B
requests runs the graph of the smallest size P >= B, else eagerly. `background` (CPU):
a thread makes the graphs while the steps run eagerly (docs/executor.md). A graph is:

    CudaGraph       a captured CUDA graph, replayed (CUDA);
    CompiledGraph   the forward compiled by torch.compile for that size (the CPU's
                    "CPU graph": executor/compiled_graph.py);
    EagerReplayGraph  the forward re-run eagerly (the CPU stand-in in tests).

More: docs/executor.md, "executor/decode_graph_runner.py".
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

import torch

from radixlm.forward_batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from radixlm.attention.base import AttentionBackend
    from radixlm.mem import ReqToTokenPool, TokenToKVPool

logger = logging.getLogger(__name__)


class EagerRunner(Protocol):
    """What the graphs capture (executor/model_runner.py's ModelRunner): the eager forward
    over the pools on one device."""
    device: torch.device
    req_to_token_pool: "ReqToTokenPool"
    token_to_kv_pool: "TokenToKVPool"

    def run_model(self, fb: ForwardBatch,
                  attn_backend: "AttentionBackend | None" = None) -> torch.Tensor: ...

    def new_attention_backend(self) -> "AttentionBackend": ...


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
    """The decode inputs of one captured batch size P (each size has its own)."""
    input_ids: torch.Tensor  # [P] int64
    positions: torch.Tensor  # [P] int64
    req_pool_indices: torch.Tensor  # [P] int64
    seq_lens: torch.Tensor  # [P] int64
    out_cache_loc: torch.Tensor  # [P] int64
    logits_indices: torch.Tensor  # [P] int64, arange: one token per request


class DecodeGraphRunner:
    def __init__(self, runner: EagerRunner, batch_sizes: list[int],
                 graph_factory: GraphFactory | None = None, kind: str = "CUDA graphs",
                 background: bool = False) -> None:
        """kind: what the graphs are, for the log line. background: make them in a thread
        (CPU graphs only: the steps meanwhile run eagerly), see `wait_ready`."""
        self.runner = runner
        self.kind = kind
        self.batch_sizes = sorted(set(batch_sizes))
        self.dummy_row = runner.req_to_token_pool.dummy_row
        self.static = {bs: self._new_static(bs) for bs in self.batch_sizes}
        self.graphs: dict[int, Graph] = {}
        # The sizes whose graph is in use, sorted; set whole once a capture ends (never
        # changed in place), so a step reads one consistent list.
        self.ready_sizes: list[int] = []
        self.replays = 0
        self.padded_rows = 0  # padding rows computed over all replays
        self.capture_s: float | None = None
        self.error: BaseException | None = None
        factory = graph_factory or cuda_graph_factory()
        self._thread: threading.Thread | None = None
        if background:
            logger.info("making %d decode %s (batch sizes %s) in the background; decode "
                        "steps run eagerly until all are made", len(self.batch_sizes),
                        kind, _ranges(self.batch_sizes))
            self._thread = threading.Thread(
                target=self._capture, args=(factory, self.batch_sizes,
                                            runner.new_attention_backend()),
                name="decode-graphs", daemon=True)
            self._thread.start()
        else:
            self._capture(factory, list(reversed(self.batch_sizes)))

    def _new_static(self, bs: int) -> _StaticInputs:
        """Size bs's buffers, every row the dummy request (slot 0)."""
        dev = self.runner.device
        zeros = lambda: torch.zeros(bs, dtype=torch.int64, device=dev)
        return _StaticInputs(
            input_ids=zeros(), positions=zeros(),
            req_pool_indices=torch.full((bs,), self.dummy_row, dtype=torch.int64, device=dev),
            seq_lens=torch.ones(bs, dtype=torch.int64, device=dev),
            out_cache_loc=zeros(), logits_indices=torch.arange(bs, device=dev))

    def _static_batch(self, bs: int) -> ForwardBatch:
        """A ForwardBatch over size bs's static buffers. seq_lens_cpu is a placeholder
        (the graph-capable backends never read it in decode)."""
        s = self.static[bs]
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE, batch_size=bs, input_ids=s.input_ids,
            positions=s.positions, req_pool_indices=s.req_pool_indices,
            seq_lens=s.seq_lens, out_cache_loc=s.out_cache_loc,
            logits_indices=s.logits_indices, seq_lens_cpu=[1] * bs,
            req_to_token_pool=self.runner.req_to_token_pool,
            token_to_kv_pool=self.runner.token_to_kv_pool)

    @torch.inference_mode()
    def _capture(self, factory: GraphFactory, order: list[int],
                 attn_backend: "AttentionBackend | None" = None) -> None:
        """Blocking: largest size first, so the shared memory pool (CUDA) is sized by the
        largest graph and the smaller ones fit in what it already holds. Background: with
        an attention backend of its own (the eager steps' keeps their metadata); the
        graphs are used once all are made, or those made before a failure. The static
        buffers hold the dummy request in every row during capture: the warm-up and
        captured runs write K/V only into slot 0, which no request owns."""
        t0 = time.perf_counter()
        run = self.runner.run_model
        try:
            for bs in order:
                fb = self._static_batch(bs)
                # warm-up (eager): triton autotuning/compilation, cuBLAS workspaces
                run(fb, attn_backend)
                if self.runner.device.type == "cuda":
                    torch.cuda.synchronize(self.runner.device)
                graph = factory()
                graph.capture(lambda fb=fb: run(fb, attn_backend))
                self.graphs[bs] = graph
        except Exception as e:
            if self._thread is None:
                raise
            self.error = e
            self.ready_sizes = sorted(self.graphs)
            logger.warning("making decode %s stopped (%s: %s); batch sizes above %s run "
                           "eagerly", self.kind, type(e).__name__, e,
                           self.ready_sizes[-1] if self.ready_sizes else 0)
            return
        # All at once, at the end: a replay beside a capture that holds the GIL waits for
        # it at every op call (each releases it; ~4 tok/s where the eager step ran ~30).
        self.ready_sizes = sorted(self.graphs)
        self.capture_s = time.perf_counter() - t0
        logger.info("made %d decode %s (batch sizes %s) in %.1f s%s", len(self.graphs),
                    self.kind, _ranges(self.batch_sizes), self.capture_s,
                    ", in the background" if self._thread is not None else "")

    @property
    def capturing(self) -> bool:
        """Is a background capture still making graphs?"""
        return self._thread is not None and self._thread.is_alive()

    def wait_ready(self, timeout_s: float | None = None) -> bool:
        """Block until a background capture has ended (at once when not in the
        background); True when every size's graph is made."""
        if self._thread is not None:
            self._thread.join(timeout_s)
        return len(self.ready_sizes) == len(self.batch_sizes)

    def stats(self) -> dict:
        """For /server_info: the sizes, those ready, whether a background capture runs."""
        return {"kind": self.kind, "batch_sizes": self.batch_sizes, "ready": self.ready_sizes,
                "capturing": self.capturing, "replays": self.replays,
                "error": None if self.error is None else repr(self.error)}

    def can_run(self, fb: ForwardBatch) -> bool:
        ready = self.ready_sizes
        return (fb.forward_mode is ForwardMode.DECODE and bool(ready)
                and fb.batch_size <= ready[-1])

    def padded_size(self, bs: int) -> int:
        """The smallest ready size >= bs (`can_run` said there is one)."""
        ready = self.ready_sizes
        return ready[bisect.bisect_left(ready, bs)]

    @torch.inference_mode()
    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        """The logits [B, vocab] of a decode batch (a view of the graph's output)."""
        bs = fb.batch_size
        size = self.padded_size(bs)
        s = self.static[size]
        s.input_ids[:bs].copy_(fb.input_ids)
        s.positions[:bs].copy_(fb.positions)
        s.req_pool_indices[:bs].copy_(fb.req_pool_indices)
        s.seq_lens[:bs].copy_(fb.seq_lens)
        s.out_cache_loc[:bs].copy_(fb.out_cache_loc)
        if size > bs:
            # A fuller earlier batch of this size left real rows here: reset them to the
            # dummy request.
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

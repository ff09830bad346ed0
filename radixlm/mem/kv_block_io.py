"""Copy whole K/V blocks between the device pool and flat bytes, and the hicache's two IO
threads (a writer and a loader) with their queues.

A block's bytes are laid out [K|V][layer][token][head][dim] in the pool's dtype, viewed as
uint8 (`KVTier`): a block copied out and back lands bit-identical. The scheduler thread
only enqueues: the writer thread puts blocks into the tiers (host, storage), the loader
thread reads them (pending writes first, then host, then storage), copies them into the
slots the scheduler allocated for the job and puts the job on the completion queue.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from radixlm.mem.tiered_kv_store import TieredKVStore
from radixlm.mem.token_to_kv_pool import TokenToKVPool

logger = logging.getLogger(__name__)


def gather_blocks(pool: TokenToKVPool, slots: torch.Tensor, block_tokens: int) -> torch.Tensor:
    """uint8 CPU tensor [n, block_bytes] of the K/V in `slots` (n * block_tokens slots)."""
    idx = slots.to(pool.device, torch.int64)
    kv = torch.stack([torch.stack([b[idx] for b in pool.k_buffers]),
                      torch.stack([b[idx] for b in pool.v_buffers])])  # [2, L, nB, H, D]
    two, layers, nb, heads, dim = kv.shape
    n = nb // block_tokens
    kv = kv.reshape(two, layers, n, block_tokens, heads, dim).permute(2, 0, 1, 3, 4, 5)
    return kv.contiguous().cpu().view(torch.uint8).reshape(n, -1)


def scatter_blocks(pool: TokenToKVPool, slots: torch.Tensor, data: torch.Tensor,
                   block_tokens: int) -> None:
    """Write blocks `data` (uint8 [n, block_bytes]) into `slots` (n * block_tokens)."""
    n = data.shape[0]
    kv = data.reshape(-1).view(pool.dtype).reshape(
        n, 2, pool.num_layers, block_tokens, pool.kv_heads, pool.head_dim)
    kv = kv.permute(1, 2, 0, 3, 4, 5).reshape(2, pool.num_layers, n * block_tokens,
                                               pool.kv_heads, pool.head_dim)
    kv = kv.to(pool.device, non_blocking=False)
    idx = slots.to(pool.device, torch.int64)
    for layer in range(pool.num_layers):
        pool.k_buffers[layer][idx] = kv[0, layer]
        pool.v_buffers[layer][idx] = kv[1, layer]
    if pool.device.type == "cuda":
        torch.cuda.current_stream(pool.device).synchronize()


@dataclass
class LoadJob:
    """Blocks `keys` to load into `slots` (len(keys) * block_tokens) for `req`."""
    req: Any
    keys: list[bytes]
    slots: torch.Tensor
    start: int  # token position of the first block
    device_prefix: int  # tokens the device pool already matched
    prefix_slots: torch.Tensor  # the device's slots of positions [0, start)
    node: Any  # the locked TreeNode ending at device_prefix
    loaded: int = 0  # blocks loaded (a prefix of keys)
    from_host: int = 0  # of those, read from host memory (host tier or queued writes)
    seconds: float = 0.0
    t_submit: float = field(default_factory=time.perf_counter)


class BlockIO:
    """The writer and loader threads over the tiers below the device pool."""

    def __init__(self, store: TieredKVStore, pool: TokenToKVPool, block_tokens: int,
                 max_pending_bytes: int = 1 << 30) -> None:
        self.store = store
        self.pool = pool
        self.block_tokens = block_tokens
        self.max_pending_bytes = max_pending_bytes
        self._mu = threading.Lock()
        self._pending: dict[bytes, torch.Tensor] = {}  # queued writes, readable by loads
        self._writes: queue.Queue = queue.Queue()
        self._loads: queue.Queue = queue.Queue()
        self.done: queue.Queue[LoadJob] = queue.Queue()
        self.written = 0
        self.dropped = 0
        self._threads = [threading.Thread(target=self._write_loop, name="hicache-writer", daemon=True),
                         threading.Thread(target=self._load_loop, name="hicache-loader", daemon=True)]
        for t in self._threads:
            t.start()

    # --- scheduler side ------------------------------------------------------------------

    def has(self, key: bytes) -> bool:
        with self._mu:
            if key in self._pending:
                return True
        return self.store.contains(key)

    def write(self, keys: list[bytes], data: torch.Tensor) -> int:
        """Queue blocks for the storage tier; returns how many were queued (the rest
        dropped: the backlog is over max_pending_bytes)."""
        queued = 0
        with self._mu:
            for key, block in zip(keys, data):
                if key in self._pending:
                    continue
                if (len(self._pending) + 1) * self.store.block_bytes > self.max_pending_bytes:
                    self.dropped += 1
                    continue
                self._pending[key] = block
                self._writes.put(key)
                queued += 1
        return queued

    def has_pending(self) -> bool:
        with self._mu:
            return bool(self._pending)

    def load(self, job: LoadJob) -> None:
        self._loads.put(job)

    def drain(self, timeout: float = 60.0) -> None:
        """Wait until every queued write is on disk."""
        deadline = time.monotonic() + timeout
        while self._writes.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.005)

    def close(self) -> None:
        self.drain()
        self._writes.put(None)
        self._loads.put(None)
        for t in self._threads:
            t.join(timeout=5.0)

    # --- threads ---------------------------------------------------------------------------

    def _write_loop(self) -> None:
        while True:
            key = self._writes.get()
            try:
                if key is None:
                    return
                with self._mu:
                    block = self._pending.get(key)
                if block is not None and self.store.put(key, block):
                    self.written += 1
                with self._mu:
                    self._pending.pop(key, None)
            except Exception:  # a bad write is a miss later, never a dead thread
                logger.exception("hicache writer")
            finally:
                self._writes.task_done()

    def _read(self, key: bytes) -> tuple[torch.Tensor | None, str]:
        with self._mu:
            block = self._pending.get(key)
        return (block, "pending") if block is not None else self.store.get_tier(key)

    def _load_loop(self) -> None:
        while True:
            job = self._loads.get()
            if job is None:
                return
            t0 = time.perf_counter()
            try:
                blocks = []
                for key in job.keys:
                    block, tier = self._read(key)
                    if block is None:
                        break  # a missing or bad block ends the chain here
                    blocks.append(block)
                    job.from_host += tier == "host" or (tier == "pending"
                                                        and self.store.host is not None)
                if blocks:
                    n = len(blocks) * self.block_tokens
                    scatter_blocks(self.pool, job.slots[:n], torch.stack(blocks), self.block_tokens)
                job.loaded = len(blocks)
            except Exception:
                logger.exception("hicache loader")
                job.loaded = 0
            job.seconds = time.perf_counter() - t0
            self.done.put(job)

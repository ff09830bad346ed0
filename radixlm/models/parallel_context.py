"""ParallelContext: which tensor-parallel rank a model instance is, and its collectives.

One explicit object handed to the model constructor (no global process-group state is
read by the layers). With `tp_size == 1` every collective is the identity and no
torch.distributed call is made, so a single-process engine never initializes a group.

Invariant: every rank calls the collectives of one forward in the same order with tensors
of the same shape (the layers are built from the same config, and every rank runs the same
batch), which is what torch.distributed requires of collectives on one group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class ParallelContext:
    tp_rank: int = 0
    tp_size: int = 1
    # The torch.distributed group of the TP ranks for the forward's collectives (None:
    # the default group; NCCL on CUDA, gloo on the CPU).
    group: Any = None
    # A separate gloo group for host-side objects (scheduler inputs, the memory plan). It
    # is separate even on the CPU: the scheduler thread broadcasts on it while the forward
    # thread all-reduces on `group`, and one group must not be used by two threads.
    cpu_group: Any = None

    def __post_init__(self) -> None:
        if self.tp_size < 1 or not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"bad tensor-parallel rank {self.tp_rank} of {self.tp_size}")

    @property
    def is_parallel(self) -> bool:
        return self.tp_size > 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of `x` over the ranks (in place); identity for one rank."""
        if self.is_parallel:
            dist.all_reduce(x, op=dist.ReduceOp.SUM, group=self.group)
        return x

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        """[..., n] on every rank -> [..., tp_size * n], rank r's part at [r*n, (r+1)*n)."""
        if not self.is_parallel:
            return x
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.tp_size)]
        dist.all_gather(parts, x, group=self.group)
        return torch.cat(parts, dim=-1)


SINGLE = ParallelContext()


def split_evenly(total: int, tp_size: int, what: str) -> int:
    """total / tp_size, refusing a remainder (each rank must get the same share)."""
    if total % tp_size:
        raise ValueError(f"--tp-size {tp_size} does not divide the {total} {what}")
    return total // tp_size


def kv_head_range(num_kv_heads: int, tp_size: int, tp_rank: int) -> tuple[int, int]:
    """[start, end) of the KV heads rank `tp_rank` holds.

    num_kv_heads >= tp_size: split, kv/tp heads each (tp must divide kv).
    num_kv_heads <  tp_size: replicated, one head per rank, each head held by tp/kv
    consecutive ranks (kv must divide tp). Rank r's Q heads [r*h/tp, (r+1)*h/tp) then all
    use KV head r // (tp/kv): a GQA group is g = h/kv heads, so Q head i uses KV head
    i // g, and r*h/tp // g = r*kv/tp = r // (tp/kv); the rank's h/tp Q heads divide g
    (g / (h/tp) = tp/kv), so they never straddle two KV heads.
    """
    if num_kv_heads >= tp_size:
        n = split_evenly(num_kv_heads, tp_size, "KV heads")
        return tp_rank * n, (tp_rank + 1) * n
    if tp_size % num_kv_heads:
        raise ValueError(f"--tp-size {tp_size} and the {num_kv_heads} KV heads: one must "
                         f"divide the other")
    head = tp_rank // (tp_size // num_kv_heads)
    return head, head + 1

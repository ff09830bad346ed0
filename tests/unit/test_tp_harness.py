"""The tensor-parallel harness's retry (tests/tp_harness.py): a rendezvous port taken
between picking it and rank 0 binding it is retried with fresh ports; any other failure
of a rank raises at once."""

from __future__ import annotations

import socket

import pytest
import torch.distributed as dist
import torch.multiprocessing as tmp

from radixlm.runtime.distributed import free_port
from tests.tp_harness import spawn_ranks


def _join(rank: int, addr: str, world: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://{addr}", world_size=world, rank=rank)
    dist.destroy_process_group()


def _fail(rank: int) -> None:
    raise ValueError(f"rank {rank} failed")


def test_a_taken_port_is_retried_with_fresh_args() -> None:
    with socket.socket() as held:  # another process took the port after it was picked
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        taken = held.getsockname()[1]
        attempts: list[int] = []

        def make_args() -> tuple:
            attempts.append(1)
            port = taken if len(attempts) == 1 else free_port()
            return (f"127.0.0.1:{port}", 2)

        spawn_ranks(_join, make_args, nprocs=2)
    assert len(attempts) == 2


def test_other_failures_raise_without_a_retry() -> None:
    attempts: list[int] = []
    with pytest.raises(tmp.ProcessRaisedException, match="failed"):
        spawn_ranks(_fail, lambda: attempts.append(1) or (), nprocs=2)
    assert len(attempts) == 1

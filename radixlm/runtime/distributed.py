"""Process-group setup for tensor parallelism (`--tp-size`, `--nnodes`, `--node-rank`,
`--dist-init-addr`).

Ranks: `tp_size` ranks spread over `nnodes` hosts, `tp_per_node = tp_size / nnodes` on
each; the process with local index `local_rank` on node `node_rank` is global rank
`node_rank * tp_per_node + local_rank` (rank 0: node 0's first process, the one that
decides). On CUDA local rank i drives GPU i.

Rendezvous is torch.distributed's own TCP store (`init_method="tcp://HOST:PORT"`): rank 0
listens on the port, every other rank connects to it. Backend: NCCL on CUDA, gloo on the
CPU; plus one gloo group for host-side objects (`ParallelContext.cpu_group`).
"""

from __future__ import annotations

import datetime
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

from radixlm.config import ServerArgs
from radixlm.models.parallel_context import ParallelContext


@dataclass(frozen=True)
class RankPlacement:
    tp_size: int
    nnodes: int
    node_rank: int
    local_rank: int

    @property
    def tp_per_node(self) -> int:
        return self.tp_size // self.nnodes

    @property
    def rank(self) -> int:
        return self.node_rank * self.tp_per_node + self.local_rank


def check_placement(args: ServerArgs) -> None:
    if args.tp_size < 1 or args.nnodes < 1:
        raise ValueError(f"--tp-size and --nnodes must be >= 1, got {args.tp_size}, {args.nnodes}")
    if args.tp_size % args.nnodes:
        raise ValueError(f"--nnodes {args.nnodes} does not divide --tp-size {args.tp_size}")
    if not 0 <= args.node_rank < args.nnodes:
        raise ValueError(f"--node-rank must be in [0, {args.nnodes}), got {args.node_rank}")
    if args.nnodes > 1 and not args.dist_init_addr:
        raise ValueError("--nnodes > 1 needs --dist-init-addr HOST:PORT (node 0's address)")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def resolve_dist_init_addr(args: ServerArgs) -> ServerArgs:
    """One host without --dist-init-addr: a free local port, chosen once by the process
    that spawns the ranks (so they all get the same address)."""
    if args.dist_init_addr:
        return args
    return args.replace(dist_init_addr=f"127.0.0.1:{free_port()}")


def init_tensor_parallel(args: ServerArgs, local_rank: int,
                         device: torch.device) -> ParallelContext:
    """Join the process group as this process's rank; returns its ParallelContext.
    Blocks until all `tp_size` ranks have joined (the TCP rendezvous)."""
    check_placement(args)
    place = RankPlacement(args.tp_size, args.nnodes, args.node_rank, local_rank)
    if not args.dist_init_addr:
        raise ValueError("init_tensor_parallel needs dist_init_addr (resolve_dist_init_addr)")
    if device.type == "cuda":
        torch.cuda.set_device(local_rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://{args.dist_init_addr}",
                            world_size=place.tp_size, rank=place.rank,
                            timeout=datetime.timedelta(minutes=30))
    cpu_group = dist.new_group(backend="gloo")
    return ParallelContext(tp_rank=place.rank, tp_size=place.tp_size, group=None,
                           cpu_group=cpu_group)


def destroy_tensor_parallel() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()

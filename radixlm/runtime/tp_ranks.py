"""Tensor-parallel ranks other than 0: each runs the scheduler loop (scheduler_loop.py) and
follows rank 0, which decides. Each TP rank is a process with its own `Scheduler` (pools,
radix cache, queues) over its slice of the model. Only rank 0 talks to the API and
detokenizer processes. Every loop iteration rank 0 broadcasts what it received
(`StepInputs`, over the gloo `ParallelContext.cpu_group`), every rank applies those
messages in the same order and runs the same `Scheduler.step()`. The scheduler is
deterministic given its inputs (no clock, no thread timing in its decisions; sampled
tokens are equal on all ranks because the logits are all-gathered whole to every rank and
each request's generator is seeded alike), so the ranks form identical batches and call
the forward's collectives in the same order. Only rank 0 sends outputs. Shutdown is rank
0's: these ranks ignore SIGTERM, SIGINT and the launcher's STOP_SIGNAL
(process_utils.leave_shutdown_to_rank0) and exit 0 when rank 0's loop broadcasts its stop.
A follower node's own process (`--node-rank K`, K > 0) takes a SIGTERM/SIGINT as a note
(drain node 0 and it stops too); a second one SIGKILLs its ranks and exits 1; STOP_SIGNAL
(its owner's "stop now") SIGKILLs them and exits 0. More: docs/tensor-parallel.md.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
from types import FrameType

from radixlm.config import ServerArgs
from radixlm.runtime.process_threads import setup_compute_process
from radixlm.runtime.process_utils import (
    STOP_SIGNAL, die_with_parent, leave_shutdown_to_rank0, set_process_name, setup_logging,
)
from radixlm.runtime.fast_exit import exit_now
from radixlm.runtime.scheduler_loop import run_loop

logger = logging.getLogger(__name__)


def run_follower_rank(args: ServerArgs, local_rank: int) -> None:
    """Process entry of a rank other than 0: join the group, build the scheduler, follow
    rank 0 until it says stop (or dies, which fails the next collective)."""
    die_with_parent()
    leave_shutdown_to_rank0()  # a group SIGTERM/SIGINT, the launcher's stop: rank 0 decides
    set_process_name(f"radixlm-tp{local_rank}")
    setup_logging(args.log_level, f"scheduler-node{args.node_rank}-local{local_rank}")
    setup_compute_process(args)  # before torch loads (below)
    from radixlm.runtime.distributed import destroy_tensor_parallel, init_tensor_parallel
    from radixlm.runtime.device import resolve_device
    from radixlm.runtime.build import build_scheduler

    ctx = init_tensor_parallel(args, local_rank, resolve_device(args.device))
    sched, _ = build_scheduler(args, ctx)
    try:
        run_loop(sched, ctx, None, None)
    finally:
        sched.shutdown()
        destroy_tensor_parallel()
    exit_now(0)  # stopped cleanly: skip the slow interpreter teardown (fast_exit.py)


def spawn_follower_ranks(args: ServerArgs, first_local_rank: int) -> list[mp.Process]:
    """Start local ranks [first_local_rank, tp_size / nnodes) of this host."""
    mpctx = mp.get_context("spawn")
    procs = [mpctx.Process(target=run_follower_rank, args=(args, i), daemon=True,
                           name=f"scheduler-tp-local{i}")
             for i in range(first_local_rank, args.tp_size // args.nnodes)]
    for p in procs:
        p.start()
    return procs


class FollowerSignals:
    """SIGTERM/SIGINT in a follower node's process: the first is logged and left to node 0
    (its ranks keep serving the requests in flight), the second kills the ranks now.
    STOP_SIGNAL (an owner's stop, not a group signal) kills them at once; `stopped` then
    says the exit was asked for."""

    def __init__(self, procs: list[mp.Process], node_rank: int) -> None:
        self.procs, self.node_rank = procs, node_rank
        self.count = 0
        self.stopped = False

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.handle)
        signal.signal(STOP_SIGNAL, self.stop)

    def handle(self, sig: int, frame: FrameType | None) -> None:
        self.count += 1
        name = signal.Signals(sig).name
        if self.count == 1:
            logger.warning("%s: node %d's ranks serve node 0's requests and stop when node 0 "
                           "stops (signal node 0 to drain); %s again stops them now",
                           name, self.node_rank, name)
            return
        logger.warning("%s again: stopping node %d's ranks now", name, self.node_rank)
        self.kill_ranks()

    def stop(self, sig: int, frame: FrameType | None) -> None:
        logger.warning("%s: stopping node %d's ranks now", signal.Signals(sig).name,
                       self.node_rank)
        self.stopped = True
        self.kill_ranks()

    def kill_ranks(self) -> None:
        for p in self.procs:
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signal.SIGKILL)


def run_follower_node(args: ServerArgs) -> None:
    """`radixlm serve --node-rank K` (K > 0): this host runs only its scheduler ranks; it
    returns when they all exit 0 (rank 0 stopped them) or STOP_SIGNAL stopped them, else
    raises (a rank failed, or a second signal stopped them)."""
    from radixlm.runtime.distributed import check_placement

    check_placement(args)
    signals = FollowerSignals([], args.node_rank)
    signals.install()  # before the ranks start: no moment where a signal kills this process
    procs = signals.procs = spawn_follower_ranks(args, 0)
    if signals.stopped:  # STOP_SIGNAL came while they started
        signals.kill_ranks()
    for p in procs:
        p.join()
    failed = [p.name for p in procs if p.exitcode]
    if signals.stopped:
        logger.info("node %d's ranks stopped", args.node_rank)
        return
    if failed:
        why = "stopped by a second signal" if signals.count > 1 else "failed"
        raise RuntimeError(f"scheduler ranks {why}: {', '.join(failed)}")

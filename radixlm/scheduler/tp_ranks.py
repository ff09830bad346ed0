"""The scheduler loop of every tensor-parallel rank: rank 0 decides, the others follow.

Each TP rank is a process with its own `Scheduler` (pools, radix cache, queues) over its
slice of the model. Only rank 0 talks to the API and detokenizer processes. Every loop
iteration rank 0 broadcasts what it received (`StepInputs`, over the gloo
`ParallelContext.cpu_group`), every rank applies those messages in the same order and
runs the same `Scheduler.step()`. The scheduler is deterministic given its inputs (no
clock, no thread timing in its decisions; sampled tokens are equal on all ranks because
the logits are all-gathered whole to every rank and each request's generator is seeded
alike), so the ranks form identical batches and call the forward's collectives in the
same order. Only rank 0 sends outputs.

Idle ranks still exchange inputs at least once a second (rank 0's bounded wait), so no
collective waits anywhere near the process group's timeout.

Placement: on the host running the server (node 0) the server spawns rank 0 as the usual
scheduler process (`run_scheduler_process`) and local ranks 1.. as `run_follower_rank`;
on every other host `run_follower_node` spawns all of that host's ranks.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from radixlm.config import ServerArgs
from radixlm.messages import BatchTokenIDOut, DashboardReq, FlushCacheReq, PoolStatsReq
from radixlm.process_threads import setup_compute_process
from radixlm.process_utils import die_with_parent, set_process_name, setup_logging

if TYPE_CHECKING:  # torch stays out of the API process, which imports this module
    from radixlm.models.parallel_context import ParallelContext
    from radixlm.scheduler.scheduler import Scheduler

logger = logging.getLogger(__name__)


@dataclass
class StepInputs:
    """What rank 0 received before one loop iteration; `stop` ends every rank's loop."""
    msgs: list[object] = field(default_factory=list)
    stop: bool = False


def exchange_inputs(inputs: StepInputs | None, ctx: "ParallelContext") -> StepInputs:
    """Rank 0 passes its inputs, the other ranks None; every rank gets rank 0's."""
    if not ctx.is_parallel:
        assert inputs is not None
        return inputs
    import torch.distributed as dist

    box = [inputs]
    dist.broadcast_object_list(box, src=0, group=ctx.cpu_group)
    return box[0]


def run_loop(sched: "Scheduler", ctx: "ParallelContext",
             collect: Callable[[bool], StepInputs] | None,
             send: Callable[[object], None] | None) -> None:
    """The scheduler loop, on every rank.

    `collect(has_work)` (rank 0 only; None elsewhere): the messages that arrived; with no
    work it may block for a bounded time, and return no messages. `send` (rank 0 only):
    where outputs and control replies go. Control requests are answered between steps;
    they run on every rank too, since they settle in-flight batches or flush the cache.
    """
    while True:
        had_work = sched.has_work()  # equal on every rank: same state
        inputs = exchange_inputs(collect(had_work) if collect is not None else None, ctx)
        if inputs.stop:
            return
        if not had_work and not inputs.msgs:
            sched.on_idle()  # a poll period without work (rank 0's collect blocks ~1 s)
            continue
        for msg in inputs.msgs:
            if isinstance(msg, PoolStatsReq):
                reply: object = sched.pool_stats(msg.rid)
            elif isinstance(msg, FlushCacheReq):
                reply = sched.flush_cache(msg.rid)
            elif isinstance(msg, DashboardReq):
                reply = sched.dashboard.snapshot(sched, msg)
            else:
                sched.handle(msg)
                continue
            if send is not None:
                send(reply)
        outs = sched.step()
        if outs and send is not None:
            send(BatchTokenIDOut(outs))


def run_follower_rank(args: ServerArgs, local_rank: int) -> None:
    """Process entry of a rank other than 0: join the group, build the scheduler, follow
    rank 0 until it says stop (or dies, which fails the next collective)."""
    die_with_parent()
    set_process_name(f"radixlm-tp{local_rank}")
    setup_logging(args.log_level, f"scheduler-node{args.node_rank}-local{local_rank}")
    setup_compute_process(args)  # before torch loads (below)
    from radixlm.executor.distributed import destroy_tensor_parallel, init_tensor_parallel
    from radixlm.executor.model_runner import resolve_device
    from radixlm.scheduler.process import build_scheduler

    ctx = init_tensor_parallel(args, local_rank, resolve_device(args.device))
    sched, _ = build_scheduler(args, ctx)
    try:
        run_loop(sched, ctx, None, None)
    finally:
        sched.shutdown()
        destroy_tensor_parallel()


def spawn_follower_ranks(args: ServerArgs, first_local_rank: int) -> list[mp.Process]:
    """Start local ranks [first_local_rank, tp_size / nnodes) of this host."""
    mpctx = mp.get_context("spawn")
    procs = [mpctx.Process(target=run_follower_rank, args=(args, i), daemon=True,
                           name=f"scheduler-tp-local{i}")
             for i in range(first_local_rank, args.tp_size // args.nnodes)]
    for p in procs:
        p.start()
    return procs


def run_follower_node(args: ServerArgs) -> None:
    """`radixlm serve --node-rank K` (K > 0): this host runs only its scheduler ranks; it
    returns when they all exit (rank 0 stopped, or a rank failed)."""
    from radixlm.executor.distributed import check_placement

    check_placement(args)
    procs = spawn_follower_ranks(args, 0)
    for p in procs:
        p.join()
    failed = [p.name for p in procs if p.exitcode]
    if failed:
        raise RuntimeError(f"scheduler ranks failed: {', '.join(failed)}")

"""The one scheduler loop, on every rank (TP 1 included): collect inputs, apply them in
order, step, send outputs. Rank 0 broadcasts what it received so every rank forms the same
batches (runtime/tp_ranks.py; docs/tensor-parallel.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from radixlm.messages import BatchTokenIDOut, DashboardReq, FlushCacheReq, PoolStatsReq

if TYPE_CHECKING:  # torch stays out of the API process, which imports this module
    from radixlm.models.parallel_context import ParallelContext
    from radixlm.scheduler.scheduler import Scheduler


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
                reply = sched.flush_cache(msg.rid, msg.storage)
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

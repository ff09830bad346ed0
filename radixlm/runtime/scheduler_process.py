"""The scheduler process: load the model, announce readiness, then loop over `step()`.

Blocking rule: with no work, block on the input socket (bounded, to notice a dead
parent; a signal's wake-up fd ends the wait at once); with work, drain whatever input
is there without blocking and step again.
Stop rule: the launcher's STOP_SIGNAL (process_utils.StopFlag) or a dead parent ends the
loop at its next iteration, and with --tp-size N every rank's loop with it (a broadcast
stop: the other ranks, on this host or another, exit 0 instead of failing a collective).
"""

from __future__ import annotations

import logging
import os
import traceback

import zmq

from radixlm.config import ServerArgs
from radixlm.ipc import IpcEndpoints, dumps, loads, make_socket
from radixlm.messages import SchedulerFailed, SchedulerReady
from radixlm.runtime.process_threads import setup_compute_process
from radixlm.runtime.process_utils import (
    die_with_parent, drain_fd, leave_shutdown_to_parent, set_process_name, setup_logging,
    signal_wakeup_fd, stop_on_signal,
)
from radixlm.runtime.build import build_scheduler
from radixlm.runtime.fast_exit import exit_now
from radixlm.runtime.scheduler_loop import StepInputs, run_loop

logger = logging.getLogger(__name__)


def run_scheduler_process(args: ServerArgs, endpoints: IpcEndpoints) -> None:
    die_with_parent()
    leave_shutdown_to_parent()  # a group SIGTERM/SIGINT: the parent drains first
    stop = stop_on_signal()  # the launcher's stop: end the loop, and every TP rank's
    set_process_name("radixlm-sched")
    setup_logging(args.log_level, "scheduler")
    ctx = zmq.Context()
    control = make_socket(ctx, zmq.PUSH, endpoints.control, bind=False)
    try:
        setup_compute_process(args)  # before torch loads (below)
        # Tensor parallelism: this process is rank 0 (runtime/tp_ranks.py).
        tp = None
        if args.tp_size > 1:
            from radixlm.runtime.distributed import init_tensor_parallel
            from radixlm.runtime.device import resolve_device
            tp = init_tensor_parallel(args, 0, resolve_device(args.device))
        sched, _ = build_scheduler(args, tp)
    except Exception as e:  # report why we cannot serve, then exit
        logger.error("scheduler failed to start: %s", e)
        control.send(dumps(SchedulerFailed(f"{type(e).__name__}: {e}\n{traceback.format_exc()}")))
        return
    import torch  # loaded by the model; this module stays torch-free for the API process

    recv = make_socket(ctx, zmq.PULL, endpoints.scheduler_input, bind=True)
    send = make_socket(ctx, zmq.PUSH, endpoints.detokenizer_input, bind=False)
    runner = sched.runner
    control.send(dumps(SchedulerReady(max_total_tokens=runner.max_total_tokens,
                                      max_running_requests=runner.max_running_requests,
                                      context_len=sched.context_len, vocab_size=runner.vocab_size,
                                      memory_plan=runner.plan,
                                      cuda_graph_batch_sizes=runner.cuda_graph_batch_sizes,
                                      dtype=str(runner.dtype).removeprefix("torch."),
                                      dtype_reason=runner.dtype_reason,
                                      num_threads=torch.get_num_threads())))
    parent = os.getppid()
    wake = signal_wakeup_fd()  # the launcher's stop ends an idle wait at once
    poller = zmq.Poller()
    poller.register(recv, zmq.POLLIN)
    poller.register(wake, zmq.POLLIN)

    def collect(has_work: bool) -> StepInputs:
        if stop.requested:
            return StepInputs(stop=True)
        if not has_work:
            ready = dict(poller.poll(timeout=1000))
            if wake in ready:
                drain_fd(wake)
            if recv not in ready:
                return StepInputs(stop=os.getppid() != parent or stop.requested)
        msgs = []
        while True:
            try:
                msgs.append(loads(recv.recv(zmq.NOBLOCK)))
            except zmq.Again:
                return StepInputs(msgs)

    # The one loop (with --tp-size N it also drives the other ranks: tp_ranks.py).
    run_loop(sched, runner.ctx, collect, lambda msg: send.send(dumps(msg)))
    sched.shutdown()  # the forward thread; the hierarchical cache's queued writes
    # Stopped cleanly: skip torch's slow interpreter teardown (runtime/fast_exit.py).
    exit_now(0)

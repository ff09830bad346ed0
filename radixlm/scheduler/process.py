"""The scheduler process: load the model, announce readiness, then loop over `step()`.

Blocking rule: with no work, block on the input socket (bounded, to notice a dead
parent); with work, drain whatever input is there without blocking and step again.
"""

from __future__ import annotations

import logging
import os
import traceback

import zmq

from radixlm.config import ServerArgs
from radixlm.ipc import IpcEndpoints, dumps, loads, make_socket
from radixlm.messages import SchedulerFailed, SchedulerReady
from radixlm.process_threads import setup_compute_process
from radixlm.process_utils import die_with_parent, set_process_name, setup_logging
from radixlm.scheduler.tp_ranks import StepInputs, run_loop

logger = logging.getLogger(__name__)


def build_scheduler(args: ServerArgs, ctx=None):
    """Model runner + tokenizer + Scheduler, as the offline Engine builds them too.
    `ctx`: the tensor-parallel rank (a ParallelContext; None: single process)."""
    from radixlm.executor.model_runner import ModelRunner
    from radixlm.models import resolve_model_path
    from radixlm.scheduler.scheduler import Scheduler
    from radixlm.tokenizer.loader import load_tokenizer

    model_path = resolve_model_path(args.model)
    tokenizer = load_tokenizer(model_path, args.tokenizer)
    runner = ModelRunner(args, model_path) if ctx is None else ModelRunner(args, model_path, ctx)
    eos = list(runner.model_config.eos_token_ids)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos:
        eos.append(tokenizer.eos_token_id)
    sched = Scheduler(runner, tokenizer, eos, args.max_prefill_tokens, args.random_seed,
                      disable_radix_cache=args.disable_radix_cache,
                      chunked_prefill_size=runner.chunked_prefill_size,
                      schedule_policy=args.schedule_policy,
                      init_new_token_ratio=args.init_new_token_ratio,
                      min_new_token_ratio=args.min_new_token_ratio,
                      new_token_ratio_decay=args.new_token_ratio_decay,
                      enable_mixed_chunk=args.enable_mixed_chunk,
                      overlap=use_overlap_schedule(args.disable_overlap_schedule, runner.device),
                      grammar_compile_timeout=args.grammar_compile_timeout,
                      grammar_synchronous=args.tp_size > 1,
                      disable_jump_forward=args.disable_jump_forward)
    return sched, tokenizer


def use_overlap_schedule(disable: bool | None, device) -> bool:
    """--disable-overlap-schedule as given, else by device: overlap on CUDA (the forward
    thread only enqueues kernels), serial on the CPU. There the forward's compute threads
    take every core, and the scheduler thread running beside them makes each parallel op
    wait for a descheduled thread at its barrier: a batch-1 decode step of the default
    model took 25-30 ms with overlap vs 12.5 ms serial on 2 cores (docs/benchmarks.md)."""
    if disable is not None:
        return not disable
    return device.type == "cuda"


def run_scheduler_process(args: ServerArgs, endpoints: IpcEndpoints) -> None:
    die_with_parent()
    set_process_name("radixlm-sched")
    setup_logging(args.log_level, "scheduler")
    ctx = zmq.Context()
    control = make_socket(ctx, zmq.PUSH, endpoints.control, bind=False)
    try:
        setup_compute_process(args)  # before torch loads (below)
        # Tensor parallelism: this process is rank 0 (scheduler/tp_ranks.py).
        tp = None
        if args.tp_size > 1:
            from radixlm.executor.distributed import init_tensor_parallel
            from radixlm.executor.model_runner import resolve_device
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

    def collect(has_work: bool) -> StepInputs:
        if not has_work and not recv.poll(timeout=1000):
            return StepInputs(stop=os.getppid() != parent)
        msgs = []
        while True:
            try:
                msgs.append(loads(recv.recv(zmq.NOBLOCK)))
            except zmq.Again:
                return StepInputs(msgs)

    # The one loop (with --tp-size N it also drives the other ranks: tp_ranks.py).
    run_loop(sched, runner.ctx, collect, lambda msg: send.send(dumps(msg)))

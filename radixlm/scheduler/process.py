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
from radixlm.messages import (BatchTokenIDOut, FlushCacheReq, PoolStatsReq, SchedulerFailed,
                              SchedulerReady)
from radixlm.process_utils import die_with_parent, setup_logging

logger = logging.getLogger(__name__)


def build_scheduler(args: ServerArgs):
    """Model runner + tokenizer + Scheduler, as the offline Engine builds them too."""
    from radixlm.executor.model_runner import ModelRunner
    from radixlm.models import resolve_model_path
    from radixlm.scheduler.scheduler import Scheduler
    from radixlm.tokenizer.loader import load_tokenizer

    model_path = resolve_model_path(args.model)
    tokenizer = load_tokenizer(model_path, args.tokenizer)
    runner = ModelRunner(args, model_path)
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
                      enable_mixed_chunk=args.enable_mixed_chunk)
    return sched, tokenizer


def run_scheduler_process(args: ServerArgs, endpoints: IpcEndpoints) -> None:
    die_with_parent()
    setup_logging(args.log_level, "scheduler")
    ctx = zmq.Context()
    control = make_socket(ctx, zmq.PUSH, endpoints.control, bind=False)
    try:
        sched, _ = build_scheduler(args)
    except Exception as e:  # report why we cannot serve, then exit
        logger.error("scheduler failed to start: %s", e)
        control.send(dumps(SchedulerFailed(f"{type(e).__name__}: {e}\n{traceback.format_exc()}")))
        return
    recv = make_socket(ctx, zmq.PULL, endpoints.scheduler_input, bind=True)
    send = make_socket(ctx, zmq.PUSH, endpoints.detokenizer_input, bind=False)
    runner = sched.runner
    control.send(dumps(SchedulerReady(max_total_tokens=runner.max_total_tokens,
                                      max_running_requests=runner.max_running_requests,
                                      context_len=sched.context_len, vocab_size=runner.vocab_size)))
    parent = os.getppid()
    while True:
        if not sched.has_work():
            if not recv.poll(timeout=1000):
                if os.getppid() != parent:
                    return
                continue
        while True:
            try:
                msg = loads(recv.recv(zmq.NOBLOCK))
            except zmq.Again:
                break
            # Control requests are answered at once, between steps.
            if isinstance(msg, PoolStatsReq):
                send.send(dumps(sched.pool_stats(msg.rid)))
            elif isinstance(msg, FlushCacheReq):
                send.send(dumps(sched.flush_cache(msg.rid)))
            else:
                sched.handle(msg)
        outs = sched.step()
        if outs:
            send.send(dumps(BatchTokenIDOut(outs)))

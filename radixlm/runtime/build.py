"""Build a Scheduler from ServerArgs: model runner, tokenizer, the Scheduler over them; as the
server's scheduler process, each TP rank and the offline Engine all do."""

from __future__ import annotations

from radixlm.config import ServerArgs


def build_scheduler(args: ServerArgs, ctx=None):
    """Model runner + tokenizer + Scheduler, as the offline Engine builds them too.
    `ctx`: the tensor-parallel rank (a ParallelContext; None: single process)."""
    from radixlm.executor.model_runner import ModelRunner
    from radixlm.models import resolve_model_path
    from radixlm.runtime.hicache_setup import hicache_config
    from radixlm.scheduler.scheduler import Scheduler
    from radixlm.speculative.controller import SpecConfig
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
                      disable_jump_forward=args.disable_jump_forward,
                      speculative=SpecConfig.from_args(args),
                      hicache=hicache_config(args, runner, model_path),
                      stream_interval=args.stream_interval)
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

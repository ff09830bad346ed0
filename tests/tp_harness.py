"""Multi-process tensor-parallel test harness: spawned ranks on gloo, one CPU thread each.

`spawn_ranks(fn, make_args, nprocs)` runs `fn(local_index, *make_args())` in `nprocs` spawned
processes (torch.multiprocessing: a failing rank raises in the caller with its traceback);
`make_args` picks the rendezvous ports, again for a retry when one was taken meanwhile.
`drive_rank0` feeds requests into the real scheduler loop (`scheduler_loop.run_loop`) as the
ZMQ inbox of the scheduler process would, and collects each request's output tokens.
Kept free of pytest/transformers imports so spawned children start fast.
"""

from __future__ import annotations

import json
import os
import random
from typing import Any, Callable

import torch
import torch.multiprocessing as tmp

from radixlm.messages import BatchTokenIDOut, TokenizedGenerateReq
from radixlm.sampling_params import SamplingParams
from radixlm.runtime.scheduler_loop import StepInputs, run_loop


# A port picked free (`free_port`) can be taken before rank 0's store binds it.
_PORT_TAKEN = ("EADDRINUSE", "address already in use")


def spawn_ranks(fn: Callable[..., None], make_args: Callable[[], tuple], nprocs: int,
                tries: int = 3) -> None:
    """Up to `tries` attempts, each with fresh `make_args()`; only a rendezvous port taken
    between picking and binding it is retried, any other failure raises at once."""
    for attempt in range(tries):
        try:
            tmp.spawn(fn, args=make_args(), nprocs=nprocs, join=True)
            return
        except tmp.ProcessRaisedException as e:
            text = str(e).lower()
            if attempt + 1 == tries or not any(m.lower() in text for m in _PORT_TAKEN):
                raise


def child_setup() -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    torch.set_num_threads(1)


def make_requests(n: int, vocab: int, seed: int = 0, max_new: int = 10) -> list[TokenizedGenerateReq]:
    rng = random.Random(seed)
    return [TokenizedGenerateReq(
        rid=f"r{i}", input_ids=[rng.randrange(3, vocab) for _ in range(rng.randrange(3, 30))],
        sampling_params=SamplingParams(max_new_tokens=max_new, temperature=0.0, ignore_eos=True))
        for i in range(n)]


def drive_rank0(sched: Any, ctx: Any, reqs: list[TokenizedGenerateReq]) -> dict[str, list[int]]:
    """Request i arrives at the (2i)-th inbox read, so later ones join running batches; the
    loop is told to stop once every request has finished and the scheduler is idle (the
    overlap scheduler still holds a launched batch after the last output)."""
    outputs: dict[str, list[int]] = {}
    finished: set[str] = set()
    reads = 0

    def collect(has_work: bool) -> StepInputs:
        nonlocal reads
        msgs = [r for i, r in enumerate(reqs) if 2 * i == reads]
        reads += 1
        return StepInputs(msgs, stop=len(finished) == len(reqs) and not has_work)

    def send(msg: object) -> None:
        assert isinstance(msg, BatchTokenIDOut)
        for o in msg.outs:
            outputs.setdefault(o.rid, []).extend(o.new_token_ids)
            if o.finish_reason is not None:
                finished.add(o.rid)

    run_loop(sched, ctx, collect, send)
    return outputs


def write_json(path: str, obj: Any) -> None:
    with open(path, "w") as f:
        json.dump(obj, f)


def read_json(path: str) -> Any:
    with open(path) as f:
        return json.load(f)

"""The load generator: send a dataset's requests to one server at a given arrival process.

Arrivals: `request_rate` requests/s as a Poisson process (exponential gaps drawn from
`seed`), or all at once for `inf`; `max_concurrency` caps the requests in flight (a
semaphore, as in SGLang's bench_serving). A multi-turn conversation sends its turns one
after another, each after the previous answer (holding a concurrency slot per turn).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from radixlm.bench.datasets import BenchRequest
from radixlm.bench.serve_client import Clock, Target, send_request
from radixlm.bench.serve_metrics import RequestResult


@dataclass(frozen=True)
class LoadConfig:
    request_rate: float = math.inf
    max_concurrency: int | None = None
    seed: int = 0
    show_progress: bool = True

    def validate(self) -> None:
        if not self.request_rate > 0:
            raise ValueError(f"--request-rate must be > 0 (or inf), got {self.request_rate}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"--max-concurrency must be >= 1, got {self.max_concurrency}")


def arrival_gaps(n: int, rate: float, seed: int) -> list[float]:
    """Seconds to wait before each of `n` requests: exponential with mean 1/rate (a
    Poisson process); zeros for an infinite rate. Pure function of its arguments."""
    if math.isinf(rate):
        return [0.0] * n
    rng = random.Random(seed)
    return [rng.expovariate(rate) for _ in range(n)]


async def run_load(client: httpx.AsyncClient, target: Target, requests: list[BenchRequest],
                   load: LoadConfig, count_tokens: Callable[[str], int],
                   clock: Clock = time.perf_counter,
                   sleep: Callable[[float], object] = asyncio.sleep,
                   ) -> tuple[list[RequestResult], float]:
    """Run every request (every turn of every conversation); return the per-request results
    in the order they were issued and the wall time from the first send to the last reply.
    `count_tokens` counts a text prompt (for later turns of a conversation)."""
    load.validate()
    sem = asyncio.Semaphore(load.max_concurrency) if load.max_concurrency else None
    total = sum(1 + len(r.follow_ups) for r in requests)
    bar = _progress(total, load.show_progress)
    results: list[list[RequestResult]] = [[] for _ in requests]

    async def one(prompt: str | list[int], prompt_len: int, output_len: int) -> RequestResult:
        if sem is None:
            res = await send_request(client, target, prompt, prompt_len, output_len, clock)
        else:
            async with sem:
                res = await send_request(client, target, prompt, prompt_len, output_len, clock)
        if bar is not None:
            bar.update(1)
        return res

    async def conversation(i: int, req: BenchRequest) -> None:
        prompt, prompt_len = req.prompt, req.prompt_len
        for turn in range(1 + len(req.follow_ups)):
            res = await one(prompt, prompt_len, req.output_len)
            results[i].append(res)
            if turn == len(req.follow_ups) or not res.success:
                return
            if not isinstance(prompt, str):
                raise ValueError("multi-turn prompts must be text (see datasets.to_text)")
            follow = req.follow_ups[turn]
            assert isinstance(follow, str)
            prompt = prompt + res.generated_text + follow
            prompt_len = count_tokens(prompt)

    start = clock()
    tasks = []
    for i, (req, gap) in enumerate(zip(requests, arrival_gaps(len(requests), load.request_rate,
                                                              load.seed))):
        if gap > 0:
            await sleep(gap)
        tasks.append(asyncio.create_task(conversation(i, req)))
    await asyncio.gather(*tasks)
    duration = clock() - start
    if bar is not None:
        bar.close()
    return [r for conv in results for r in conv], duration


def _progress(total: int, show: bool):
    if not show:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="requests", unit="req", leave=False)

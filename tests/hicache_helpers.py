"""Shared by the hierarchical cache's engine tests (tests/integration/test_hicache*.py):
the greedy sampling they compare, random prompts, an engine with the storage tier, a
reference without any cache (the `want` fixture), and one-request-at-a-time generation
that checks the pool invariant after each."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from radixlm import SamplingParams
from radixlm.engine import Engine

G = SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)


def prompts(n: int, seed: int, length: int = 200) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 256) for _ in range(length)] for _ in range(n)]


@pytest.fixture(scope="module")
def want(tiny_llama_dir):
    """Greedy output ids of the prompts on an engine without a prefix cache."""
    ref = Engine(model=tiny_llama_dir, max_total_tokens=4096, disable_radix_cache=True,
                 chunked_prefill_size=-1)
    return lambda ps: [o["output_ids"] for o in ref.generate(ps, G)]


def hi(model: str, storage: Path, **kw) -> Engine:
    kw.setdefault("max_total_tokens", 512)
    return Engine(model=model, enable_hierarchical_cache=True, hicache_storage_dir=str(storage),
                  **kw)


def one_by_one(eng: Engine, ps: list[list[int]]) -> list[dict]:
    out = []
    for p in ps:
        out.append(eng.generate(p, G))
        eng.check_invariant()
    return out

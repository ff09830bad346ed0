"""The Engine with --attention-backend triton gives the torch backend's greedy outputs.

On the CPU the kernels run in Triton's interpreter (slow), so the workload is small but
touches every path: cache-hit extends (shared prefixes), decode batches of several
requests, page_size > 1, and MIXED batches (--enable-mixed-chunk with chunked prefill).
"""

from __future__ import annotations

import os
import random

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

from radixlm import SamplingParams  # noqa: E402
from radixlm.attention.factory import triton_available  # noqa: E402
from radixlm.engine import Engine  # noqa: E402
from tests.engine_checks import assert_all_slots_back, run_staggered  # noqa: E402

pytestmark = pytest.mark.skipif(not triton_available(),
                                reason="triton is not installed (pip install triton)")


def _prompts() -> list[list[int]]:
    rng = random.Random(5)
    shared = [rng.randrange(3, 256) for _ in range(24)]
    return ([shared + [rng.randrange(3, 256) for _ in range(rng.randrange(1, 12))] for _ in range(3)]
            + [[rng.randrange(3, 256) for _ in range(rng.randrange(5, 40))] for _ in range(2)])


def test_triton_engine_matches_torch(tiny_llama_dir):
    # page_size 1 is covered kernel-level (tests/unit/test_triton_attention.py); one engine
    # run keeps the interpreter's time down.
    extra = dict(page_size=4, enable_mixed_chunk=True, chunked_prefill_size=16)
    params = SamplingParams(max_new_tokens=5, temperature=0.0, ignore_eos=True)
    outputs = {}
    for backend in ("torch", "triton"):
        # float32 on the GPU too: bf16 rounding differences could flip a greedy near-tie.
        engine = Engine(model=tiny_llama_dir, max_total_tokens=1024, max_running_requests=8,
                        attention_backend=backend, dtype="float32", **extra)
        outputs[backend] = run_staggered(engine, _prompts(), params, seed=1)
        assert_all_slots_back(engine)
    assert outputs["triton"] == outputs["torch"]

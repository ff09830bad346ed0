"""The CPU's default serving configuration through the scheduler, against a reference.

Without the suite's capability pin (tests/conftest.py makes `--dtype auto` float32): the
real CPU decides -- bfloat16 where it has native bf16 dot products -- with the default
model's Q4_1 weights on the int4 kernels and compiled decode graphs (one bucket, batch 1:
a compile is slow). Every served greedy token must be the float32 model's choice or within
MARGIN of it (teacher-forced logits of the whole output), so wrong kernels, graphs or
dtype handling show, while bf16 rounding of near ties does not.
"""

from __future__ import annotations

import pytest
import torch

from radixlm import Engine, SamplingParams
from radixlm.runtime import cpu_features
from radixlm.models import load_model, resolve_model_path
from radixlm.models.linear.int4 import Int4GroupwiseLinear, int4_kernel_runs_on
from tests import machine_facts
from tests.conftest import requires_default_model
from tests.conftest_models import PoolHarness
from tests.engine_checks import assert_all_slots_back

pytestmark = [requires_default_model, pytest.mark.slow]

PROMPTS = ["The capital of France is", "1, 2, 3, 4,"]
NEW = 8
MARGIN = 1.0  # logits; bf16 vs float32 moves a 135M model's logits by ~0.1-0.3


@pytest.fixture
def real_cpu(monkeypatch):
    """Undo tests/conftest.py's pin: the capability probe sees this machine."""
    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: cpu_features._cpuinfo()[1])


def test_default_cpu_serving_config_gives_the_models_tokens(real_cpu) -> None:
    eng = Engine(enable_torch_compile=True, torch_compile_max_bs=1, max_total_tokens=1024)
    runner = eng.scheduler.runner
    bf16 = set(machine_facts.BF16_FLAGS) & machine_facts.cpu_flags()  # from /proc/cpuinfo
    want_dtype = torch.bfloat16 if bf16 else torch.float32
    assert runner.dtype == want_dtype
    if want_dtype == torch.bfloat16 and int4_kernel_runs_on(runner.device):
        # (the int4 method serves bfloat16 runs only: models/linear/policy.py)
        assert any(isinstance(m, Int4GroupwiseLinear) for m in runner.model.modules())
    graphs = runner.decode_graphs
    assert graphs is not None, "compiled decode graphs were refused"
    assert graphs.wait_ready(900), graphs.error  # made in the background by default
    params = SamplingParams(max_new_tokens=NEW, temperature=0, ignore_eos=True)
    outs = [eng.generate(p, params) for p in PROMPTS]  # one at a time: batch 1, compiled
    assert graphs.replays >= len(PROMPTS) * (NEW - 1)
    assert_all_slots_back(eng)

    ref, cfg = load_model(resolve_model_path(None), torch.float32, "cpu")
    h = PoolHarness(ref, cfg)
    exact = 0
    for prompt, out in zip(PROMPTS, outs):
        ids = eng.tokenizer.encode(prompt)
        got = out["output_ids"]
        assert len(got) == NEW
        logits = h.extend([h.new_request()], [ids + got[:-1]], all_logits=True)[len(ids) - 1:]
        for pos, tok in enumerate(got):
            best = float(logits[pos].max())
            assert float(logits[pos, tok]) >= best - MARGIN, (prompt, pos, tok)
            exact += int(logits[pos].argmax()) == tok
    assert exact >= 0.75 * NEW * len(PROMPTS)

"""Speculation on a bfloat16 CPU run of the default model, where the linear layers are
int4/int8 kernels for calls of at most 8 rows (a dense GEMM beyond): every verify step keeps
within 8 rows (speculative/verify_rows.py), a copy-heavy prompt still accepts drafts, the
pool gets every slot back, and the greedy output equals the one without speculation
(the verify rows take the same int4/int8 kernels and the same per-row attention kernel as a
decode step)."""

from __future__ import annotations

import pytest

from radixlm import SamplingParams
from radixlm.engine import Engine
from radixlm.models.linear.int4 import int4_bf16_kernel_usable
from radixlm.speculative.verify_rows import cheap_verify_rows
from tests.conftest import requires_default_model
from tests.engine_checks import assert_all_slots_back
from tests.integration.test_speculative import COPY

pytestmark = [requires_default_model, pytest.mark.slow]

POOL = 2048


def _engine(**kw) -> Engine:
    return Engine(dtype="bfloat16", device="cpu", max_total_tokens=POOL,
                  disable_overlap_schedule=True, **kw)


def test_verify_rows_stay_on_the_small_batch_kernels():
    ref = _engine()
    if cheap_verify_rows(ref.scheduler.runner.model) is None:
        pytest.skip("no int4/int8 small-batch kernels on this CPU in bfloat16")
    tok = ref.tokenizer
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": COPY}],
                                                tokenize=False, add_generation_prompt=True),
                        add_special_tokens=False)
    params = SamplingParams(max_new_tokens=48, temperature=0.0)
    want = ref.generate(prompt, params)["output_ids"]
    del ref
    eng = _engine(speculative_algorithm="NGRAM", speculative_num_draft_tokens=10)
    spec = eng.scheduler.speculative
    # The int4 x bf16 kernel (AVX512-BF16) and the int8-group kernel take 8 rows; without
    # it the int4 kernels take 4.
    cap = 8 if int4_bf16_kernel_usable() else 4
    assert spec.row_cap == cap
    got = eng.generate(prompt, params)["output_ids"]
    stats = spec.stats
    assert stats.accepted > 0, stats.as_dict()
    assert stats.drafted <= (cap - 1) * stats.verifies  # batch 1: 1 + cap - 1 drafts
    assert not any(stats.accept_hist[cap:])
    assert_all_slots_back(eng, POOL)
    assert got == want

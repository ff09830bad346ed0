"""The verify step's row cap (speculative/verify_rows.py): drafts are cut so that a verify
stays within the quantized linear methods' small-batch row limit."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from radixlm.models.linear.method import DenseLinear, SmallBatchQuantized
from radixlm.speculative.controller import SpeculativeDecoding
from radixlm.speculative.drafter import Draft
from radixlm.speculative.verify_rows import cap_draft_budgets, cheap_verify_rows


class _Quantized(SmallBatchQuantized):
    def small(self, x: torch.Tensor) -> torch.Tensor:
        return self.fallback(x)


def test_cap_fills_rows_round_robin():
    assert cap_draft_budgets([4], 4) == [3]  # batch 1: k + 1 = 4 rows
    assert cap_draft_budgets([4, 4], 4) == [1, 1]
    assert cap_draft_budgets([4, 4, 4], 4) == [1, 0, 0]
    assert cap_draft_budgets([0, 4], 6) == [0, 4]  # a request not drafting leaves room
    assert cap_draft_budgets([1, 4], 6) == [1, 3]
    assert cap_draft_budgets([2, 2], 8) == [2, 2]  # under the cap: unchanged


def test_no_cap_without_a_limit_or_at_a_large_batch():
    assert cap_draft_budgets([4, 4], None) == [4, 4]
    assert cap_draft_budgets([4] * 4, 4) == [4] * 4  # the requests alone fill the rows
    assert cap_draft_budgets([4] * 5, 4) == [4] * 5


def test_cheap_rows_is_the_smallest_quantized_limit():
    w = torch.randn(8, 8)
    model = nn.Sequential(_Quantized(DenseLinear(w), 4), _Quantized(DenseLinear(w), 6),
                          DenseLinear(w))
    assert cheap_verify_rows(model) == 4
    assert cheap_verify_rows(nn.Sequential(DenseLinear(w))) is None  # float32: dense only
    assert cheap_verify_rows(None) is None


class _Drafter:
    """Drafts as many tokens as asked plus two (the controller cuts them)."""
    name, costly, tracked = "FAKE", False, set()

    def propose(self, reqs, max_tokens):
        return [Draft(list(range(n + 2))) for n in max_tokens]

    def forget(self, rid):
        pass


def test_controller_proposes_within_the_cap():
    reqs = [SimpleNamespace(rid=str(i), remaining_new_tokens=100, seq_len=10) for i in range(2)]
    capped = SpeculativeDecoding(_Drafter(), 4, 4, row_cap=4)
    assert [len(d.tokens) for d in capped._propose(reqs[:1], 1000)] == [3]
    assert [len(d.tokens) for d in capped._propose(reqs, 1000)] == [1, 1]
    free = SpeculativeDecoding(_Drafter(), 4, 4)
    assert [len(d.tokens) for d in free._propose(reqs, 1000)] == [4, 4]


def test_int8_group_methods_take_eight_verify_rows():
    """The int8-group methods (the default model's Q8_0 head) keep their kernel up to 8
    rows, so they do not cap a verify at 4 (k = 7 drafts at batch 1, not 3)."""
    import pytest

    from radixlm.models.linear.int8_groups import Int8Groups, Int8GroupwiseLinear
    from radixlm.models.linear.policy import LinearPolicy, make_head_method, make_linear_method

    policy = LinearPolicy(quantization="auto")  # the model runner's (no row limit given)
    if not policy.keeps_int8(torch.bfloat16, torch.device("cpu")):
        pytest.skip("the int8_groups kernel did not build")
    g = torch.Generator().manual_seed(0)
    groups = Int8Groups(torch.randint(-128, 128, (64, 64), generator=g, dtype=torch.int8),
                        torch.rand(64, 2, generator=g) * 1e-2)
    weight = groups.dequantize().bfloat16()
    proj = make_linear_method(weight, None, policy, int8=groups)
    assert isinstance(proj, Int8GroupwiseLinear) and proj.max_m == 8
    assert cheap_verify_rows(nn.Sequential(proj)) == 8
    big = Int8Groups(groups.q.repeat(512, 1), groups.s.repeat(512, 1))  # 32768-row head
    head = make_head_method(big.dequantize().bfloat16(), big, policy)
    assert isinstance(head, Int8GroupwiseLinear) and head.max_m == 8
    x = torch.randn(8, 64).bfloat16()
    assert torch.equal(head(x), head.small(x))  # 8 rows: the kernel, not the dense head

"""logit_bias in the sampler: a row's biases move only that row's logits (greedy and
sampled rows, mixed with unbiased neighbours and penalties); the logprobs stay the model's;
values outside [-100, 100] and unknown token ids are refused by SamplingParams.validate."""

import pytest
import torch

from tests.unit.test_sampler import V, make_req, sample


def test_bias_moves_only_its_own_row() -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, V)
    top = logits.argmax(-1).tolist()
    reqs = [make_req(0, temperature=0.0, logit_bias={7: 100.0}),
            make_req(1, temperature=0.0),
            make_req(2, temperature=0.9, logit_bias={11: 100.0, top[2]: -100.0}),
            make_req(3, temperature=0.0, logit_bias={top[3]: -100.0}, frequency_penalty=0.5)]
    out = sample(reqs, logits).next_token_ids.tolist()
    assert out[0] == 7 and out[1] == top[1] and out[2] == 11
    second = logits[3].clone()
    second[top[3]] = -1e9
    assert out[3] == second.argmax().item()


def test_logprobs_are_the_models() -> None:
    logits = torch.randn(1, V)
    out = sample([make_req(0, temperature=0.0, logprobs=True, logit_bias={5: 100.0})], logits)
    (lp,) = out.token_logprobs()
    assert lp.token_id == 5
    assert lp.logprob == pytest.approx(torch.log_softmax(logits, -1)[0, 5].item(), abs=1e-5)


@pytest.mark.parametrize("bias, needle", [({1: 100.5}, "[-100, 100]"), ({1: -101}, "[-100, 100]"),
                                          ({V: 1.0}, "out of range")])
def test_out_of_range_is_refused(bias: dict, needle: str) -> None:
    from radixlm.sampling_params import SamplingParams

    with pytest.raises(ValueError, match="logit_bias") as e:
        SamplingParams(logit_bias=bias).validate(V)
    assert needle in str(e.value)

"""Forced out-of-memory on a tiny model: a small activation budget in prefill and decode.

The recovery hook (`OOMRecovery.launch_allowed`) runs in `Scheduler.step` between building
a batch and launching it.
"""

import pytest
import torch

from radixlm import Engine
from radixlm.planning.activation_guard import ActivationBudgetExceeded
from radixlm.sampling_params import SamplingParams
from tests.engine_checks import assert_all_slots_back

GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)  # 6 tokens whatever the draw


def run(engine, prompts, params=GREEDY):
    rids = [engine.submit(p, params) for p in prompts]
    while not all(engine.result(r)["finished"] for r in rids):
        engine.step()
        engine.check_invariant()
    engine.settle()  # overlap: the last launched batch
    return [engine.pop_result(r) for r in rids]


@pytest.fixture(params=[True, False], ids=["overlap", "serial"])
def make(tiny_llama_dir, request):
    def make(**kw):
        return Engine(model=tiny_llama_dir, max_total_tokens=2048,
                      disable_overlap_schedule=not request.param, **kw)
    return make


def test_prefill_oom_retries_with_smaller_chunks(make):
    prompts = [list(range(3, 3 + 100))]
    want = [r["output_ids"] for r in run(make(chunked_prefill_size=128), prompts)]
    eng = make(chunked_prefill_size=128)
    guard = eng.scheduler.runner.activation_guard
    act = guard.model
    # The 100-token prompt in one go does not fit; smaller chunks of it do.
    guard.budget = act.extend_bytes([100], [100]) - 1
    assert act.max_chunk_within(guard.budget, 100) > 0
    got = run(eng, prompts)
    assert [r["output_ids"] for r in got] == want
    assert got[0]["meta_info"]["error"] is None
    assert eng.scheduler.max_prefill_tokens < 100
    assert_all_slots_back(eng)


def test_prefill_oom_without_chunking_fails_the_request_and_keeps_serving(make):
    eng = make(chunked_prefill_size=-1)
    guard = eng.scheduler.runner.activation_guard
    guard.budget = guard.model.extend_bytes([40], [40])
    (big,) = run(eng, [list(range(3, 103))])
    err = big["meta_info"]["error"]
    assert big["meta_info"]["finish_reason"] == "abort"
    assert "Out of memory in prefill" in err and "activation pool" in err
    assert "--chunked-prefill-size to" in err
    assert_all_slots_back(eng)
    (small,) = run(eng, [list(range(3, 23))])  # the engine still serves what fits
    assert small["meta_info"]["error"] is None and len(small["output_ids"]) == 6
    assert_all_slots_back(eng)


def test_decode_oom_retracts_and_lowers_max_running(make):
    prompts = [list(range(3 + i, 40 + i)) for i in range(6)]
    kw = dict(chunked_prefill_size=-1, max_prefill_tokens=40)  # one prompt per prefill
    want = [r["output_ids"] for r in run(make(**kw), prompts)]
    eng = make(**kw)
    runner = eng.scheduler.runner
    guard = runner.activation_guard
    # A prefill of one prompt fits, and a decode of 3 requests; one of 6 does not.
    guard.budget = guard.model.extend_bytes([37], [37])
    assert guard.model.decode_bytes(3, 44) <= guard.budget < guard.model.decode_bytes(6, 38)
    got = run(eng, prompts)
    assert [r["output_ids"] for r in got] == want  # retracted requests recompute exactly
    assert all(r["meta_info"]["error"] is None for r in got)
    assert eng.scheduler.max_running_requests < 6  # the scheduler's limit (RunLimits)
    assert_all_slots_back(eng)


class DecodeNeverFits:
    def check(self, fb):
        if fb.forward_mode.is_decode():
            raise ActivationBudgetExceeded(10**6, 10)


def test_decode_that_never_fits_fails_with_the_decode_diagnosis(make):
    eng = make()
    eng.scheduler.runner.activation_guard = DecodeNeverFits()
    (r,) = run(eng, [list(range(3, 20))])
    err = r["meta_info"]["error"]
    assert r["meta_info"]["finish_reason"] == "abort"
    assert "Out of memory in decode" in err and "activation pool" in err
    # The pool is capped by --max-total-tokens here, so the fix gives KV memory back.
    assert "Fix: lower --max-total-tokens to" in err
    assert len(r["output_ids"]) == 1  # the prefill's token came out
    assert_all_slots_back(eng)


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "serial"])
def test_forward_oom_is_retried_in_halves_with_identical_outputs(tiny_llama_dir, overlap):
    """A torch OutOfMemoryError inside the forward (what CUDA raises) for any forward of
    more than 3 requests: the worker re-runs the launched batch in halves; outputs equal a
    run without the fault; a lone request that still fails is not retried forever."""
    kw = dict(model=tiny_llama_dir, max_total_tokens=2048, chunked_prefill_size=64,
              disable_overlap_schedule=not overlap)
    prompts = [[5 + i, 7, 9 + i] * (3 + i) for i in range(7)]
    want = [r["output_ids"] for r in run(Engine(**kw), prompts)]
    eng = Engine(**kw)
    runner = eng.scheduler.runner
    forward, sizes = runner.forward, []

    def fragile(fb):
        sizes.append(fb.batch_size)
        if fb.batch_size > 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return forward(fb)

    runner.forward = fragile
    got = [r["output_ids"] for r in run(eng, prompts)]
    assert got == want
    assert max(sizes) == 7 and eng.scheduler.worker.timer.oom_splits > 0
    assert eng.scheduler.pool_stats("s").step_timing["oom_splits"] > 0
    assert_all_slots_back(eng)
    # One request alone that still runs out: it fails with the diagnosis, no endless
    # halving, and the scheduler goes on (tests/integration/test_request_oom.py has more).
    runner.forward = lambda fb: (_ for _ in ()).throw(torch.OutOfMemoryError("no memory"))
    (lone,) = run(eng, [[5, 6, 7]])
    assert lone["meta_info"]["finish_reason"] == "abort"
    assert "Out of memory" in lone["meta_info"]["error"]
    assert_all_slots_back(eng)
    # An error that is not an OOM surfaces.
    runner.forward = lambda fb: (_ for _ in ()).throw(RuntimeError("a bug"))
    eng.submit([5, 6, 7], GREEDY)
    with pytest.raises(RuntimeError, match="a bug"):
        for _ in range(4):
            eng.step()

"""A request whose forward runs out of memory even alone (after the forward worker's
split) fails by itself with the memory diagnosis and status 507; the other requests of
its batch complete with their normal output, the scheduler keeps serving, the pool
invariant holds, and nothing the failed forward wrote is served from the radix cache."""

from __future__ import annotations

import pytest
import torch

from radixlm import Engine
from radixlm.forward_batch import ForwardMode
from radixlm.sampling_params import SamplingParams
from tests.engine_checks import assert_all_slots_back

PARAMS = SamplingParams(max_new_tokens=8, temperature=0, ignore_eos=True)
BIG = list(range(3, 3 + 120))
SMALL = list(range(50, 58))


def run(engine: Engine, prompts: list[list[int]]) -> list[dict]:
    rids = [engine.submit(p, PARAMS) for p in prompts]
    while not all(engine.result(r)["finished"] for r in rids):
        engine.step()
        engine.check_invariant()
    engine.settle()
    return [engine.pop_result(r) for r in rids]


@pytest.fixture(params=[True, False], ids=["overlap", "serial"])
def make(tiny_llama_dir: str, request):
    def make() -> Engine:
        return Engine(model=tiny_llama_dir, max_total_tokens=2048, chunked_prefill_size=-1,
                      disable_overlap_schedule=not request.param)
    return make


def _inject_oom(engine: Engine, fails) -> list[int]:
    """Make `runner.forward` raise torch.OutOfMemoryError whenever `fails(fb)`; returns a
    list that counts the raised errors."""
    runner = engine.scheduler.runner
    forward = runner.forward
    raised: list[int] = []

    def patched(fb):
        if fails(fb):
            raised.append(fb.batch_size)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return forward(fb)

    runner.forward = patched
    return raised


def test_lone_prefill_oom_fails_alone_and_the_other_completes(make) -> None:
    want_small, want_big = [r["output_ids"] for r in run(make(), [SMALL, BIG])]
    eng = make()
    raised = _inject_oom(eng, lambda fb: fb.forward_mode.is_extend()
                         and max(fb.extend_seq_lens_cpu) > 100)
    small, big = run(eng, [SMALL, BIG])
    assert raised[0] == 2 and raised[-1] == 1  # the batch, then the big request alone
    meta = big["meta_info"]
    assert meta["finish_reason"] == "abort" and big["output_ids"] == []
    err = meta["error"]
    assert "Out of memory in prefill" in err and "torch.OutOfMemoryError" in err, err
    assert "activation pool" in err
    assert meta["error_status"] == 507  # HTTP 507 Insufficient Storage, not a 500
    assert small["output_ids"] == want_small and small["meta_info"]["error"] is None
    assert eng.scheduler.worker.timer.oom_failures == 1
    assert_all_slots_back(eng)
    # Still serving; and the garbage K/V of the failed prefill is not reused: the same
    # prompt, memory permitting again, gives the output of a fresh engine.
    eng.scheduler.runner.forward = type(eng.scheduler.runner).forward.__get__(eng.scheduler.runner)
    (again,) = run(eng, [BIG])
    assert again["output_ids"] == want_big
    assert again["meta_info"]["cached_tokens"] == 0
    assert_all_slots_back(eng)


def test_lone_decode_oom_fails_alone_and_the_other_completes(make) -> None:
    long_prompt = list(range(3, 3 + 40))
    want = [r["output_ids"] for r in run(make(), [SMALL, long_prompt])]
    eng = make()
    # Decode of the long request at its 4th output token (seq_len 40 + 3) runs out.
    raised = _inject_oom(eng, lambda fb: fb.forward_mode == ForwardMode.DECODE
                         and len(long_prompt) + 3 in fb.seq_lens_cpu)
    small, long = run(eng, [SMALL, long_prompt])
    assert raised, "the injected OOM never triggered"
    assert long["meta_info"]["finish_reason"] == "abort"
    assert "Out of memory in decode" in long["meta_info"]["error"]
    assert long["meta_info"]["error_status"] == 507
    assert long["output_ids"] == want[1][:len(long["output_ids"])]
    assert small["output_ids"] == want[0] and small["meta_info"]["error"] is None
    assert_all_slots_back(eng)


def test_next_batch_never_matches_a_failed_prefill_overlap(tiny_llama_dir: str) -> None:
    """Overlap: request B arrives while A's prefill is on the forward thread and shares
    A's whole prompt. A's forward fails; B must not have matched (and computed from) the
    K/V that forward never wrote: B's output is a fresh engine's, its prompt uncached."""
    b_prompt = BIG + [7, 8, 9]
    (want_b,) = [r["output_ids"] for r in run(
        Engine(model=tiny_llama_dir, max_total_tokens=2048, chunked_prefill_size=-1,
               disable_overlap_schedule=True), [b_prompt])]
    eng = Engine(model=tiny_llama_dir, max_total_tokens=2048, chunked_prefill_size=-1,
                 disable_overlap_schedule=False)
    assert eng.scheduler.overlap
    raised = _inject_oom(eng, lambda fb: fb.forward_mode.is_extend()
                         and fb.extend_seq_lens_cpu == [len(BIG)])
    a = eng.submit(BIG, PARAMS)
    eng.step()  # A's prefill launched (its prompt KV entered the cache at launch)
    assert eng.scheduler.inflight is not None
    b = eng.submit(b_prompt, PARAMS)
    while not (eng.result(a)["finished"] and eng.result(b)["finished"]):
        eng.step()
        eng.check_invariant()
    eng.settle()
    assert raised == [1]
    assert eng.pop_result(a)["meta_info"]["error_status"] == 507
    got = eng.pop_result(b)
    assert got["meta_info"]["error"] is None
    assert got["meta_info"]["cached_tokens"] == 0
    assert got["output_ids"] == want_b
    assert_all_slots_back(eng)

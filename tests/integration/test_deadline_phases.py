"""A request's deadline aborts it wherever it is. The API process enforces the deadline
(TokenizerManager: a timer that sends AbortReq and answers 408, tests/unit/
test_server_hardening.py); here the real scheduler gets that AbortReq in each phase --
waiting behind a full batch, between two chunks of a chunked prefill, decoding -- in
the overlap and the serial loop: the request leaves, its KV goes back, a request beside
it completes with its normal output, and the pool invariant holds after every step."""

from __future__ import annotations

import pytest

from radixlm import Engine
from radixlm.messages import AbortReq
from radixlm.sampling_params import SamplingParams
from tests.engine_checks import assert_all_slots_back

PARAMS = SamplingParams(max_new_tokens=12, temperature=0, ignore_eos=True)
OTHER = list(range(60, 70))


def _phase_of(eng: Engine, rid: str) -> str:
    sched = eng.scheduler
    for r in sched.waiting:
        if r.rid == rid:
            return "chunked" if r.req_pool_idx is not None else "waiting"
    if any(r.rid == rid for r in sched.running):
        return "decoding"
    return "gone"


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "serial"])
@pytest.mark.parametrize("phase", ["waiting", "chunked", "decoding"])
def test_deadline_abort_in_each_phase(tiny_llama_dir: str, phase: str, overlap: bool) -> None:
    def engine() -> Engine:
        return Engine(model=tiny_llama_dir, max_total_tokens=2048, chunked_prefill_size=16,
                      max_running_requests=1 if phase == "waiting" else 4,
                      disable_overlap_schedule=not overlap)

    want = engine().generate(OTHER, PARAMS)["output_ids"]
    eng = engine()
    other = eng.submit(OTHER, PARAMS)
    prompt = list(range(3, 3 + (100 if phase == "chunked" else 12)))
    rid = eng.submit(prompt, PARAMS, stream=True)
    for _ in range(200):  # step until the request is in the phase
        # "waiting": behind a full batch, i.e. after `other` took the one running slot.
        if _phase_of(eng, rid) == phase and (phase != "decoding"
                                             or eng.result(rid)["output_ids"]) and (
                phase != "waiting" or _phase_of(eng, other) == "decoding"):
            break
        eng.step()
        eng.check_invariant()
    else:
        pytest.fail(f"never reached {phase}")
    eng.scheduler.handle(AbortReq(rid))  # what the deadline timer sends
    eng.run_until_done([rid, other])
    eng.check_invariant()
    assert eng.result(rid)["meta_info"]["finish_reason"] == "abort"
    assert len(eng.result(rid)["output_ids"]) < PARAMS.max_new_tokens
    if phase == "waiting":
        assert eng.result(rid)["output_ids"] == []  # never admitted
    assert eng.result(other)["output_ids"] == want
    assert_all_slots_back(eng)

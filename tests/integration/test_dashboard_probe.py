"""The scheduler's DashboardProbe on a real (tiny) engine: no step is recorded while nobody
watches; after a snapshot request steps are, with their prefill / decode split; a
snapshot is bounded (nodes, requests) and agrees with the pool; it changes nothing."""

from __future__ import annotations

import random

import pytest

from radixlm import SamplingParams
from radixlm.engine import Engine
from radixlm.messages import DashboardReq
from radixlm.scheduler.dashboard_probe import STEP_FIELDS
from tests.engine_checks import assert_all_slots_back

TOTAL = 2048


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    eng = Engine(model=tiny_llama_dir, max_total_tokens=TOTAL, max_running_requests=8,
                 max_prefill_tokens=256)
    yield eng
    eng.check_invariant()
    assert_all_slots_back(eng, TOTAL)


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(3, 256) for _ in range(16)]
    return [shared + [rng.randrange(3, 256) for _ in range(rng.randrange(3, 20))]
            for _ in range(n)]


def greedy(max_new: int = 8) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new, temperature=0.0, ignore_eos=True)


def test_probe_records_only_while_watched_and_snapshots_are_bounded(engine):
    sched = engine.scheduler
    probe = sched.dashboard
    engine.generate(prompts(4), greedy())
    assert not probe.watching and len(probe.steps) == 0 and probe.step_seq == 0

    first = probe.snapshot(sched, DashboardReq("r0")).data  # a page starts watching
    assert probe.watching and first["steps"] == []
    assert first["pool"]["held_by_cache"] == sched.tree_cache.total_size() > 0
    engine.generate(prompts(6, seed=1), greedy())
    snap = probe.snapshot(sched, DashboardReq("r1", max_nodes=3, max_reqs=2)).data
    steps = [dict(zip(STEP_FIELDS, s)) for s in snap["steps"]]
    assert len(steps) == probe.step_seq > 0
    assert sum(s["prefill_tokens"] for s in steps) > 0
    assert sum(s["decode_tokens"] for s in steps) > 0
    assert {s["mode"] for s in steps} <= {"extend", "decode", "mixed"}
    assert sum(s["sampled"] for s in steps) == 6 * 8  # one token per request per step
    # Bounded: at most 3 nodes (the root first), the rest counted as hidden or truncated.
    nodes = snap["tree"]["nodes"]
    assert len(nodes) <= 3 and nodes[0]["parent"] is None
    assert snap["tree"]["truncated"] or any(n["hidden"] for n in nodes)
    # Only new steps the next time; the pool map adds up.
    again = probe.snapshot(sched, DashboardReq("r2", since_seq=snap["step_seq"])).data
    assert again["steps"] == []
    pool = again["pool"]
    assert sum(again["slot_map"]["free"]) == pool["free_kv_slots"]
    assert pool["free_kv_slots"] + pool["held_by_cache"] + pool["held_by_requests"] == TOTAL
    assert again["cache"]["prompt_tokens_total"] == sched.prompt_tokens_total > 0
    engine.check_invariant()

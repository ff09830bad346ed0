"""The batch builders build host tensors (executor/cuda_streams.py), whose values are those
a forward must read: every ForwardBatch of a run (extends, chunks, MIXED riders, decodes
with relay placeholders, pages) is checked field by field against values computed from the
requests alone, and the forward receives exactly those values."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from radixlm import SamplingParams
from radixlm.engine import Engine
from radixlm.executor.cuda_streams import HostStreams
from tests.engine_checks import assert_all_slots_back, run_staggered


def expected_fields(batch) -> dict[str, list[int]]:
    """The batch's inputs from its requests (called before the launch moves kv_len)."""
    fb = batch.forward_batch
    counts = (fb.extend_seq_lens_cpu if fb.forward_mode.is_extend() else [1] * fb.batch_size)
    riders = set(map(id, batch.decode_reqs)) if fb.forward_mode.is_extend() else None
    positions, input_ids, future_idx, future_rows = [], [], [], []
    for r, n in zip(batch.reqs, counts):
        decoding = riders is None or id(r) in riders
        positions += range(r.kv_len, r.kv_len + n)
        if decoding and r.pending_samples:  # its newest token is still being sampled
            future_idx.append(len(input_ids))
            future_rows.append(r.req_pool_idx)
            input_ids.append(0)
        elif decoding:
            input_ids.append(r.output_ids[-1])
        else:
            input_ids += r.fill_ids[r.kv_len:r.kv_len + n]
    table = batch.req_to_token_pool.req_to_token
    rows = [r.req_pool_idx for r in batch.reqs]
    token_rows = [row for row, n in zip(rows, counts) for _ in range(n)]
    return {
        "input_ids": input_ids, "positions": positions, "req_pool_indices": rows,
        "seq_lens": [r.kv_len + n for r, n in zip(batch.reqs, counts)],
        "logits_indices": [c - 1 for c in itertools.accumulate(counts)],
        # The slots the builder recorded for each (row, position).
        "out_cache_loc": [int(table[row, p]) for row, p in zip(token_rows, positions)],
        "future_token_idx": future_idx, "future_token_rows": future_rows,
    }


@pytest.mark.parametrize("cfg", [
    dict(max_total_tokens=2048, chunked_prefill_size=16, disable_overlap_schedule=False),
    dict(max_total_tokens=2048, chunked_prefill_size=12, page_size=4, enable_mixed_chunk=True,
         disable_overlap_schedule=False),
    dict(max_total_tokens=2048, disable_overlap_schedule=True),
], ids=["chunked", "mixed-pages", "serial"])
def test_builders_stage_host_tensors_with_the_forwards_values(tiny_llama_dir, cfg):
    eng = Engine(model=tiny_llama_dir, max_running_requests=6, **cfg)
    sched = eng.scheduler
    assert isinstance(sched.worker.streams, HostStreams)
    checked: list[dict[str, list[int]]] = []
    launch = sched._launch

    def checking_launch(batch):
        want = expected_fields(batch)
        fb = batch.forward_batch
        for name, values in want.items():
            t = getattr(fb, name)
            if name.startswith("future_") and not values:
                assert t is None, name
                continue
            assert t.device.type == "cpu" and t.dtype == torch.int64, name
            assert t.tolist() == values, name
        assert fb.seq_lens_cpu == want["seq_lens"]
        if fb.forward_mode.is_extend():  # the kernels' per-request index tensors
            counts = fb.extend_seq_lens_cpu
            assert fb.req_pool_indices_cpu == want["req_pool_indices"]
            for name, values in (("extend_prefix_lens", [r.kv_len for r in batch.reqs]),
                                 ("extend_seq_lens", counts),
                                 ("extend_start_loc", [0, *itertools.accumulate(counts)][:-1])):
                t = getattr(fb, name)
                assert t.device.type == "cpu" and t.dtype == torch.int32, name
                assert t.tolist() == values, name
        checked.append(want)
        return launch(batch)

    seen: list[dict[str, list[int]]] = []
    forward = sched.runner.forward

    def spy(fb):
        # What the forward reads (placeholders already filled from the relay).
        seen.append({n: getattr(fb, n).tolist() for n in ("positions", "req_pool_indices",
                                                          "seq_lens", "out_cache_loc",
                                                          "logits_indices")})
        return forward(fb)

    sched._launch = checking_launch
    sched.runner.forward = spy
    rng = random.Random(4)
    ps = [[rng.randrange(3, 256) for _ in range(rng.randrange(4, 40))] for _ in range(8)]
    params = [SamplingParams(max_new_tokens=rng.randrange(2, 12), ignore_eos=True,
                             temperature=0.0 if i % 2 else 0.8, seed=i) for i in range(8)]
    outs = run_staggered(eng, ps, params, seed=2)
    assert all(len(o) == p.max_new_tokens for o, p in zip(outs, params))
    assert len(seen) == len(checked) > 8
    for want, got in zip(checked, seen):
        assert got == {k: want[k] for k in got}
    if not cfg.get("disable_overlap_schedule"):
        assert any(w["future_token_idx"] for w in checked)  # placeholders were exercised
    assert_all_slots_back(eng)
    sched.shutdown()

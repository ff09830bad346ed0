"""The CUDA code path of the forward worker, wired on the CPU: `CudaStreams` with stand-ins
for the torch.cuda pieces (streams and events that only record host times, no pinned
memory) runs the whole engine, so staging (host SamplingBatchInfo at launch, packing,
unpacking into the task), `running`, `to_host` and the event timing are exercised without
a GPU and must give the serial loop's tokens. What only a GPU can show (real streams,
non-blocking copies, record_stream) is in test_cuda_overlap.py / test_cuda_streams.py."""

from __future__ import annotations

import contextlib
import random
import time

import pytest
import torch

from radixlm import SamplingParams
from radixlm.engine import Engine
from radixlm.executor import cuda_streams
from radixlm.executor.cuda_streams import CudaStreams
from tests.engine_checks import assert_all_slots_back, run_staggered


class FakeEvent:
    def __init__(self, enable_timing: bool = False) -> None:
        self.t: float | None = None

    def record(self, stream=None) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        assert self.t is not None, "waited for an event never recorded"

    def query(self) -> bool:
        return self.t is not None

    def elapsed_time(self, end: "FakeEvent") -> float:
        return (end.t - self.t) * 1000.0


class FakeStream:
    def __init__(self, device=None) -> None:
        self.waited: list[FakeEvent] = []

    def wait_event(self, event: FakeEvent) -> None:
        assert event.t is not None, "a stream waits for an event never recorded"
        self.waited.append(event)


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda's stream API as host no-ops; pinned allocations as plain ones."""
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: FakeStream())
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, s: None, raising=False)
    monkeypatch.setattr(cuda_streams, "pack",
                        lambda tensors, pin: _real_pack(tensors, pin=False))
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, pin_memory=False, **kw: empty(*a, **kw))

    def make() -> CudaStreams:
        s = CudaStreams.__new__(CudaStreams)
        s.device, s.forward, s.copy = torch.device("cpu"), FakeStream(), FakeStream()
        return s

    return make


_real_pack = cuda_streams.pack


def test_the_cuda_worker_path_gives_the_serial_loops_tokens(tiny_llama_dir, fake_cuda):
    rng = random.Random(8)
    ps = [[rng.randrange(3, 256) for _ in range(rng.randrange(4, 40))] for _ in range(8)]
    # Greedy, seeded and penalties: the SamplingBatchInfo is built at launch, the penalty
    # counts are attached in the task.
    params = [SamplingParams(max_new_tokens=rng.randrange(2, 16), ignore_eos=True,
                             temperature=0.0 if i % 3 == 0 else 0.9, seed=i,
                             presence_penalty=0.5 if i % 3 == 2 else 0.0) for i in range(8)]
    kw = dict(model=tiny_llama_dir, max_total_tokens=2048, max_running_requests=6,
              chunked_prefill_size=16, enable_mixed_chunk=True, page_size=2)
    serial = Engine(disable_overlap_schedule=True, **kw)
    want = run_staggered(serial, ps, params, seed=5)

    eng = Engine(disable_overlap_schedule=False, **kw)
    sched = eng.scheduler
    streams = sched.worker.streams = fake_cuda()
    prebuilt: list[bool] = []
    penalized: list[bool] = []
    run = sched.worker._run

    def spy(task, sync):
        info = task.sampling_info
        prebuilt.append(info is not None)
        assert (info is not None) == bool(task.sampling_reqs)  # built iff someone samples
        if info is not None:
            penalized.append(bool(info.penalized_rows))
            assert info.output_counts is None  # attached by the task, not at launch
        return run(task, sync)

    sched.worker._run = spy
    got = run_staggered(eng, ps, params, seed=5)
    assert got == want
    assert any(penalized) and not all(penalized)
    # Every task waited for its uploads and for the scheduler stream's writes.
    assert len(streams.forward.waited) == 2 * len(prebuilt)
    t = sched.worker.timer
    assert t.forwards == len(prebuilt) and t.last_end is None  # timed by the events
    assert t.forward_s > 0 and t.bubble_s >= 0
    assert_all_slots_back(eng)
    sched.shutdown()
    serial.scheduler.shutdown()

"""The overlap scheduler on CUDA with a forward stream and a copy stream (GPU only; skipped
elsewhere): outputs equal the serial loop's, the bubble comes from CUDA events and lies
within the wall time, the scheduler thread's launch does not wait for a running forward,
the forward thread enqueues a greedy decode without waiting for the device, and results
reach the scheduler as pinned host tensors."""

from __future__ import annotations

import time
from typing import Callable

import pytest
import torch

from radixlm import SamplingParams
from radixlm.engine import Engine
from radixlm.executor.cuda_streams import CudaStreams
from radixlm.executor.step_timer import StepTimer
from tests.engine_checks import assert_all_slots_back, random_prompts, run_staggered
from tests.engine_checks import mixed_params as shared_mixed_params

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)


prompts = random_prompts


def mixed_params(n: int, seed: int) -> list[SamplingParams]:
    """Greedy, seeded sampling, penalties (counts attached in the task), logprobs."""
    return shared_mixed_params(n, seed, max_new=30, greedy_presence=0.0)


CONFIGS = {
    "plain": dict(max_total_tokens=4096),
    "chunked-mixed-pages": dict(max_total_tokens=4096, chunked_prefill_size=16, page_size=4,
                                enable_mixed_chunk=True),
    "retract": dict(max_total_tokens=300, chunked_prefill_size=16),
    "torch-attn": dict(max_total_tokens=4096, attention_backend="torch"),
}


def engine(tiny_llama_dir: str, **kw) -> Engine:
    # float32: bf16 rounding could flip a greedy near-tie between two runs' batch shapes.
    eng = Engine(model=tiny_llama_dir, max_running_requests=8, dtype="float32", **kw)
    assert eng.scheduler.runner.device.type == "cuda"
    assert isinstance(eng.scheduler.worker.streams, CudaStreams)
    return eng


@pytest.mark.parametrize("name", list(CONFIGS))
def test_overlap_on_cuda_gives_the_serial_loops_tokens(tiny_llama_dir, name):
    cfg = CONFIGS[name]
    ps = prompts(10, seed=len(name))
    workloads = [[GREEDY] * len(ps), mixed_params(len(ps), seed=1)]
    if name == "retract":
        workloads = [[SamplingParams(max_new_tokens=60, temperature=p.temperature, seed=p.seed,
                                     ignore_eos=True) for p in params] for params in workloads]
    runs = {}
    for overlap in (False, True):
        # One engine per loop runs both workloads: the same history, so the same cache.
        eng = engine(tiny_llama_dir, disable_overlap_schedule=not overlap, **cfg)
        runs[overlap] = [run_staggered(eng, ps, params, seed=3) for params in workloads]
        assert_all_slots_back(eng)
        if name == "retract":
            assert eng.scheduler.num_retractions > 0
        eng.scheduler.shutdown()
    assert runs[True] == runs[False]


@pytest.mark.parametrize("overlap", [True, False])
def test_bubble_from_cuda_events_lies_within_the_wall_time(tiny_llama_dir, overlap):
    eng = engine(tiny_llama_dir, max_total_tokens=4096, disable_overlap_schedule=not overlap)
    eng.generate(prompts(4, seed=0), GREEDY)  # warm-up: kernels compiled, buffers cached
    sched = eng.scheduler
    sched.worker.timer = timer = StepTimer()
    t0 = time.perf_counter()
    eng.generate(prompts(16, seed=1), SamplingParams(max_new_tokens=32, temperature=0.0,
                                                     ignore_eos=True))
    wall = time.perf_counter() - t0
    print(f"overlap={overlap}: wall {wall * 1e3:.1f} ms, {timer.as_dict()}")
    assert timer.forwards >= 32
    assert timer.last_end is None and timer.last_end_event is not None  # the device clock
    assert 0.0 < timer.forward_s <= wall
    assert 0.0 <= timer.bubble_s <= wall
    assert timer.forward_s + timer.bubble_s <= wall * 1.01
    if not overlap:
        assert timer.bubble_s > 0.0  # the device waits for every step's CPU work
    sched.shutdown()


def sleep_cycles(seconds: float) -> int:
    """GPU clock cycles that torch.cuda._sleep spins for about `seconds`."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    n = 20_000_000
    start.record()
    torch.cuda._sleep(n)
    end.record()
    end.synchronize()
    return int(n * seconds * 1000 / start.elapsed_time(end))


def slow_forwards(eng: Engine, seconds: float) -> Callable[[], None]:
    """Every forward first keeps its stream busy for `seconds` on the device; returns the
    function that undoes it."""
    runner = eng.scheduler.runner
    forward, cycles = runner.forward, sleep_cycles(seconds)

    def slow(fb):
        torch.cuda._sleep(cycles)  # on the current stream: the forward stream
        return forward(fb)

    runner.forward = slow
    return lambda: setattr(runner, "forward", forward)


def test_launch_does_not_wait_for_a_running_forward(tiny_llama_dir):
    eng = engine(tiny_llama_dir, max_total_tokens=4096)
    eng.generate(prompts(4, seed=5), GREEDY)  # warm-up with the same shapes
    sched = eng.scheduler
    restore = slow_forwards(eng, 0.5)
    launch, launch_s = sched.worker.launch, []

    def timed_launch(task):
        t0 = time.perf_counter()
        handle = launch(task)
        launch_s.append(time.perf_counter() - t0)
        return handle

    sched.worker.launch = timed_launch
    rids = [eng.submit(p, GREEDY) for p in prompts(4, seed=5)]
    t0 = time.perf_counter()
    eng.step()  # launches the prefill (0.5 s on the device); nothing to process yet
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    eng.step()  # builds and launches decode 1 while the prefill runs, then waits for it
    second = time.perf_counter() - t0
    print(f"launches {[f'{s * 1e3:.2f} ms' for s in launch_s]}, steps {first:.3f} s, "
          f"{second:.3f} s")
    assert second > 0.35  # the prefill really held the device that long ...
    assert first < 0.2  # ... yet neither its own launch
    assert launch_s[1] < 0.1  # ... nor the next batch's waited for it
    restore()
    eng.run_until_done(rids)
    assert all(len(eng.pop_result(r)["output_ids"]) == GREEDY.max_new_tokens for r in rids)
    sched.shutdown()


# Seeded top-p with penalties: the SamplingBatchInfo staged at launch, counts attached in
# the task, multinomial draws with per-request generators.
PENALIZED = SamplingParams(max_new_tokens=8, temperature=0.8, top_p=0.9, seed=3,
                           frequency_penalty=0.5, repetition_penalty=1.2, ignore_eos=True)
# Logprobs with alternatives: read on the scheduler thread from pinned copies.
LOGPROBS = SamplingParams(max_new_tokens=8, temperature=0.0, logprobs=True, top_logprobs=3,
                          ignore_eos=True)


@pytest.mark.parametrize("phase", ["prefill", "decode"])
@pytest.mark.parametrize("params", [GREEDY, PENALIZED, LOGPROBS],
                         ids=["greedy", "penalized", "logprobs"])
def test_forward_thread_enqueues_a_step_without_waiting_for_the_device(tiny_llama_dir, phase,
                                                                      params):
    """No host sync on the forward thread in a prefill (triton extend, CUDA-graph-free) or
    a decode step (a graph replay), greedy, sampled with penalties, or with logprobs: the
    task's future completes while the device is still running it."""
    eng = engine(tiny_llama_dir, max_total_tokens=4096)
    eng.generate(prompts(4, seed=6), params)  # warm-up with the same shapes
    assert eng.scheduler.flush_cache().success  # the prefill below computes its prompts again
    sched = eng.scheduler
    rids = [eng.submit(p, params) for p in prompts(4, seed=6)]
    if phase == "decode":
        eng.step()  # the prefill
        eng.step()  # decode 1
        # Decode 1's forward is called before the patch below, so only decode 2 sleeps.
        sched.inflight.handle.future.result(timeout=30)
    restore = slow_forwards(eng, 0.5)
    t0 = time.perf_counter()
    eng.step()  # the step (0.5 s on the device) launched; the previous one processed
    handle = sched.inflight.handle
    handle.future.result(timeout=5)
    enqueued = time.perf_counter() - t0
    still_running = not handle.sync.ended.query()
    print(f"decode step launched and enqueued in {enqueued * 1e3:.2f} ms")
    restore()
    assert still_running and enqueued < 0.2
    eng.run_until_done(rids)
    sched.shutdown()


def test_results_reach_the_scheduler_as_pinned_host_tensors(tiny_llama_dir):
    eng = engine(tiny_llama_dir, max_total_tokens=4096)
    sched = eng.scheduler
    host_batches, launched = [], []
    process = sched.output_processor.process

    def spy(reqs, sampled):
        ids = sampled.next_token_ids
        host_batches.append(ids.device.type == "cpu" and ids.is_pinned())
        return process(reqs, sampled)

    sched.output_processor.process = spy
    launch = sched._launch

    def checking_launch(batch):
        fb = batch.forward_batch  # the scheduler's view: host tensors but the slots
        launched.append(fb.input_ids.device.type == "cpu" and fb.positions.device.type == "cpu"
                        and fb.out_cache_loc.is_cuda)
        return launch(batch)

    sched._launch = checking_launch
    eng.generate(prompts(6, seed=7), mixed_params(6, seed=7))
    assert host_batches and all(host_batches)
    assert launched and all(launched)
    assert_all_slots_back(eng)
    sched.shutdown()

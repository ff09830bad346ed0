"""Decode CUDA graphs (executor/decode_graph_runner.py): replays equal eager forwards.

On the CPU the graphs are `EagerReplayGraph`s (the forward re-run on the static buffers,
the triton kernels in Triton's interpreter): this checks the static buffers, the padding
with the dummy request row and dummy slot 0, and that a replay touches no real KV slot.
On a GPU (scripts/gpu_check.sh) the same tests capture real CUDA graphs, and the engine
tests compare serving with graphs on and off.
"""

from __future__ import annotations

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

from radixlm import SamplingParams  # noqa: E402
from radixlm.attention.factory import triton_available  # noqa: E402
from radixlm.config import ServerArgs  # noqa: E402
from radixlm.executor.decode_graph_runner import (DecodeGraphRunner,  # noqa: E402
                                                  EagerReplayGraph, capture_batch_sizes,
                                                  cuda_graph_factory)
from radixlm.forward_batch import ForwardMode  # noqa: E402
from radixlm.executor.model_runner import ModelRunner  # noqa: E402
from tests.conftest_models import PoolHarness
from tests.graph_checks import replay_matches_eager  # noqa: E402

pytestmark = pytest.mark.skipif(not triton_available(),
                                reason="triton is not installed (pip install triton)")
requires_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (scripts/gpu_check.sh)")


def test_capture_batch_sizes():
    assert capture_batch_sizes(1) == [1]
    assert capture_batch_sizes(10) == [1, 2, 4, 8, 10]
    assert capture_batch_sizes(40) == [1, 2, 4, 8, 12, 16, 24, 32, 40]
    assert capture_batch_sizes(45) == [1, 2, 4, 8, 12, 16, 24, 32, 40, 45]
    with pytest.raises(ValueError):
        capture_batch_sizes(0)


@pytest.fixture(scope="module")
def runner(tiny_llama_dir):
    # Graphs are added by the test (disable_cuda_graph: none captured at start on CUDA).
    args = ServerArgs(model=tiny_llama_dir, device="cuda" if CUDA else "cpu",
                      attention_backend="triton", dtype="float32", max_total_tokens=512,
                      max_running_requests=8, disable_cuda_graph=True)
    return ModelRunner(args, tiny_llama_dir)


def test_replay_equals_eager_and_touches_only_the_dummy_slot(runner):
    graphs = DecodeGraphRunner(runner, [1, 2, 4],
                             cuda_graph_factory() if CUDA else EagerReplayGraph)
    assert runner.req_to_token_pool.dummy_row == runner.req_to_token_pool.size
    h = PoolHarness.on_runner(runner)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 256, (n,), generator=gen).tolist() for n in (5, 9, 14, 30)]
    rows = [h.new_request() for _ in prompts]
    last = runner.forward(h.batch(ForwardMode.EXTEND, rows, prompts)).argmax(-1).tolist()
    # Decode all four (captured size 4, no padding), then three (padded to 4: the padding
    # row still holds the fourth request's row and slot from the step before), then one.
    for active in ([0, 1, 2, 3], [0, 1, 2], [2], [1, 3]):
        fb = h.batch(ForwardMode.DECODE, [rows[i] for i in active], [[last[i]] for i in active])
        eager = replay_matches_eager(runner, graphs, fb)
        for i, tok in zip(active, eager.argmax(-1).tolist()):
            last[i] = tok
    assert graphs.replays == 4 and graphs.padded_rows == 0 + 1 + 0 + 0
    assert graphs.can_run(fb) and graphs.padded_size(3) == 4
    # Only the dummy row was ever read for padding; it is still all zeros (slot 0).
    assert int(runner.req_to_token_pool.req_to_token[graphs.dummy_row].abs().sum()) == 0


def test_prefill_and_large_batches_stay_eager(runner):
    graphs = DecodeGraphRunner(runner, [1, 2], cuda_graph_factory() if CUDA else EagerReplayGraph)
    h = PoolHarness.on_runner(runner)
    rows = [h.new_request() for _ in range(3)]
    fb = h.batch(ForwardMode.EXTEND, rows, [[5, 6], [7], [8, 9, 10]])
    assert not graphs.can_run(fb)
    runner.forward(fb)
    dec = h.batch(ForwardMode.DECODE, rows, [[11], [12], [13]])
    assert not graphs.can_run(dec)  # 3 > the largest captured size
    for row in rows:
        runner.req_to_token_pool.free(row)


def test_backends_without_graph_support_are_not_captured(tiny_llama_dir):
    from radixlm.attention import create_attention_backend

    assert create_attention_backend("triton", torch.device("cuda" if CUDA else "cpu")).supports_decode_graphs
    # The torch backend's decode reads host values except through its CPU kernel.
    assert not create_attention_backend("torch", torch.device("cuda")).supports_decode_graphs
    # On the CPU no CUDA graphs are captured whatever the flags say (and no compiled
    # graphs without --enable-torch-compile).
    r = ModelRunner(ServerArgs(model=tiny_llama_dir, device="cpu", max_total_tokens=256,
                               max_running_requests=4), tiny_llama_dir)
    assert r.decode_graphs is None and r.cuda_graph_batch_sizes is None


@pytest.mark.skipif(CUDA, reason="the CUDA engine tests below capture real graphs")
def test_engine_with_replayed_graphs_matches_torch_backend(tiny_llama_dir):
    """A whole serving run (overlap scheduler, staggered arrivals, requests finishing at
    different steps, so decode batches of every size) with every decode replayed."""
    from radixlm.engine import Engine
    from tests.engine_checks import assert_all_slots_back, run_staggered

    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, 256, (int(n),), generator=gen).tolist()
               for n in torch.randint(4, 30, (6,), generator=gen)]
    params = [SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True)
              for n in (3, 7, 5, 8, 2, 6)]
    outputs, graphs = {}, None
    for backend in ("torch", "triton"):
        engine = Engine(model=tiny_llama_dir, max_total_tokens=1024, max_running_requests=8,
                        attention_backend=backend, dtype="float32",
                        disable_overlap_schedule=False)
        if backend == "triton":
            runner = engine.scheduler.runner
            graphs = runner.decode_graphs = DecodeGraphRunner(runner, [1, 2, 4, 8],
                                                                EagerReplayGraph)
        outputs[backend] = run_staggered(engine, prompts, params, seed=1)
        assert_all_slots_back(engine)
    assert graphs.replays > 0 and graphs.padded_rows > 0
    assert outputs["triton"] == outputs["torch"]


def test_out_of_memory_while_capturing_names_the_flags(tiny_llama_dir, monkeypatch):
    import radixlm.executor.model_runner as mr

    args = ServerArgs(model=tiny_llama_dir, device="cpu", max_total_tokens=256,
                      max_running_requests=4)
    r = ModelRunner(args, tiny_llama_dir)

    def no_memory(*_a, **_k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    # Pretend to be a CUDA runner with a graph-capable backend whose capture runs out.
    monkeypatch.setattr(r, "device", torch.device("cuda"))
    monkeypatch.setattr(r.attn_backend, "supports_decode_graphs", True)
    monkeypatch.setattr(mr, "DecodeGraphRunner", no_memory)
    with pytest.raises(mr.MemoryPlanError, match="--cuda-graph-max-bs.*--disable-cuda-graph"):
        r._cuda_graphs(args)
    assert r._cuda_graphs(args.replace(disable_cuda_graph=True)) is None


def _engine_outputs(model: str, **kw) -> tuple[list[list[int]], object]:
    from radixlm.engine import Engine
    from tests.engine_checks import assert_all_slots_back, run_staggered

    engine = Engine(model=model, device="cuda", dtype="float32", max_total_tokens=4096,
                    max_running_requests=16, **kw)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 256, (int(n),), generator=gen).tolist()
               for n in torch.randint(4, 60, (12,), generator=gen)]
    params = SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True)
    outs = run_staggered(engine, prompts, params, seed=2)
    assert_all_slots_back(engine)
    return outs, engine


@requires_cuda
def test_engine_with_cuda_graphs_matches_eager(tiny_llama_dir):
    eager, _ = _engine_outputs(tiny_llama_dir, attention_backend="triton", disable_cuda_graph=True)
    graphed, engine = _engine_outputs(tiny_llama_dir, attention_backend="triton",
                                      cuda_graph_max_bs=8)
    graphs = engine.scheduler.runner.decode_graphs
    assert graphs is not None and graphs.batch_sizes == [1, 2, 4, 8]
    assert graphs.replays > 0
    assert graphed == eager


@requires_cuda
def test_torch_backend_on_cuda_runs_eagerly(tiny_llama_dir):
    _, engine = _engine_outputs(tiny_llama_dir, attention_backend="torch")
    assert engine.scheduler.runner.decode_graphs is None

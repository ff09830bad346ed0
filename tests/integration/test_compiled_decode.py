"""Compiled decode graphs on the CPU (--enable-torch-compile; executor/compiled_graph.py
driven by executor/decode_graph_runner.py): each batch size's torch.compile'd forward
equals the eager forward, pads with the dummy request, writes only its own KV slots and
slot 0, and never recompiles in steady state. Smallest shapes: a tiny Llama in float32."""

from __future__ import annotations

import pytest
import torch

from radixlm import SamplingParams
from radixlm.cpu_kernels.ops import decode_attention_available
from radixlm.config import ServerArgs
from radixlm.executor.compiled_graph import compiled_graph_factory
from radixlm.executor.decode_graph_runner import DecodeGraphRunner
from radixlm.forward_batch import ForwardMode
from radixlm.executor.model_runner import ModelRunner
from tests.conftest_models import PoolHarness
from tests.graph_checks import replay_matches_eager

pytestmark = pytest.mark.skipif(not decode_attention_available(),
                                reason="compiled decode needs the C++ CPU decode kernel (g++)")
SIZES = [1, 4, 8]


@pytest.fixture(scope="module")
def compiled(tiny_llama_dir):
    args = ServerArgs(model=tiny_llama_dir, device="cpu", dtype="float32", max_total_tokens=1024,
                      max_running_requests=8)
    runner = ModelRunner(args, tiny_llama_dir)
    graphs = runner.decode_graphs = DecodeGraphRunner(runner, SIZES,
                                                      compiled_graph_factory(len(SIZES)),
                                                      kind="test")
    return runner, graphs


def test_compiled_equals_eager_and_writes_only_own_slots(compiled):
    runner, graphs = compiled
    h = PoolHarness.on_runner(runner)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 256, (int(n),), generator=gen).tolist()
               for n in torch.randint(3, 40, (8,), generator=gen)]
    rows = [h.new_request() for _ in prompts]
    last = runner.forward(h.batch(ForwardMode.EXTEND, rows, prompts)).argmax(-1).tolist()
    # 1 (exact), 3 (padded to 4), 8 (exact), then 3 again: rows 3..7 of the static buffers
    # still hold the batch of 8's real requests and must be reset to the dummy request.
    for active in ([0], [0, 1, 2], list(range(8)), [5, 6, 7], [4]):
        fb = h.batch(ForwardMode.DECODE, [rows[i] for i in active], [[last[i]] for i in active])
        eager = replay_matches_eager(runner, graphs, fb)
        for i, tok in zip(active, eager.argmax(-1).tolist()):
            last[i] = tok
    assert graphs.padded_rows == 1 + 1  # 3 -> 4 twice
    assert int(runner.req_to_token_pool.req_to_token[graphs.dummy_row].abs().sum()) == 0
    for row in rows:
        h.allocator.free(runner.req_to_token_pool.req_to_token[row, :h.seq_lens[row]].long())
        runner.req_to_token_pool.free(row)


def test_no_recompile_while_batches_join_and_leave(compiled):
    """50 decode steps with batch sizes changing every step: a recompile raises."""
    runner, graphs = compiled
    h = PoolHarness.on_runner(runner)
    gen = torch.Generator().manual_seed(1)
    rows = [h.new_request() for _ in range(8)]
    last = runner.forward(h.batch(ForwardMode.EXTEND, rows, [[5, 6, 7]] * 8)).argmax(-1).tolist()
    replays = graphs.replays
    with torch.compiler.set_stance("fail_on_recompile"):
        for step in range(50):
            n = int(torch.randint(1, 9, (1,), generator=gen))
            active = sorted(torch.randperm(8, generator=gen)[:n].tolist())
            fb = h.batch(ForwardMode.DECODE, [rows[i] for i in active],
                         [[last[i]] for i in active])
            for i, tok in zip(active, runner.forward(fb).argmax(-1).tolist()):
                last[i] = tok
    assert graphs.replays == replays + 50
    for row in rows:
        h.allocator.free(runner.req_to_token_pool.req_to_token[row, :h.seq_lens[row]].long())
        runner.req_to_token_pool.free(row)


def test_graph_goes_to_the_disk_cache_and_replays_without_dynamo(compiled, tiny_llama_dir):
    """A graph's compile is one AOTAutograd's cache can store (a second start loads it
    instead of tracing and lowering again: no inference-mode entry and no freezing in
    it), unless oneDNN-prepacked weights need freezing (the fixture's dense layers); a
    replay calls inductor's function on the captured tensors, so it runs on after
    dynamo's caches are dropped, where a replay through dynamo would recompile."""
    from torch._dynamo.utils import counters

    _, prepacked = compiled
    assert all(g.choice.freezing for g in prepacked.graphs.values())
    args = ServerArgs(model=tiny_llama_dir, device="cpu", dtype="float32", max_total_tokens=256,
                      max_running_requests=2, disable_weight_prepack=True)
    runner = ModelRunner(args, tiny_llama_dir)
    counters.clear()
    graphs = runner.decode_graphs = DecodeGraphRunner(runner, [2], compiled_graph_factory(1),
                                                      kind="test")
    aot = counters["aot_autograd"]
    assert aot["autograd_cache_bypass"] == 0
    assert aot["autograd_cache_hit"] + aot["autograd_cache_miss"] == 1
    assert not graphs.graphs[2].choice.freezing
    torch._dynamo.reset()
    h = PoolHarness.on_runner(runner)
    rows = [h.new_request() for _ in range(2)]
    last = runner.forward(h.batch(ForwardMode.EXTEND, rows, [[5, 6, 7], [8, 9]])).argmax(-1)
    with torch.compiler.set_stance("fail_on_recompile"):
        for _ in range(2):
            fb = h.batch(ForwardMode.DECODE, rows, [[t] for t in last.tolist()])
            last = replay_matches_eager(runner, graphs, fb).argmax(-1)
    assert graphs.replays == 2


def test_engine_with_torch_compile_matches_eager(tiny_llama_dir):
    """A whole serving run (staggered arrivals, requests finishing at different steps, so
    decode batches of every size, some above the largest compiled one) with
    --enable-torch-compile equals the eager run token for token, every slot back: run
    again and again while the graphs are made in the background (eager steps beside the
    capture thread's forwards, then graphs as they come), and once more after."""
    from radixlm.engine import Engine
    from tests.engine_checks import assert_all_slots_back, run_staggered

    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, 256, (int(n),), generator=gen).tolist()
               for n in torch.randint(4, 30, (6,), generator=gen)]
    params = [SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True)
              for n in (3, 7, 5, 8, 2, 6)]
    kw = dict(model=tiny_llama_dir, max_total_tokens=1024, max_running_requests=8,
              dtype="float32", torch_compile_max_bs=4)
    eager = Engine(**kw)
    assert eager.scheduler.runner.decode_graphs is None
    want = run_staggered(eager, prompts, params, seed=1)
    engine = Engine(enable_torch_compile=True, **kw)
    graphs = engine.scheduler.runner.decode_graphs
    assert graphs.batch_sizes == [1, 2, 4] and graphs.ready_sizes != graphs.batch_sizes
    runs_while_capturing = 0
    while True:
        last = not graphs.capturing
        assert run_staggered(engine, prompts, params, seed=1) == want
        assert_all_slots_back(engine)
        if last:
            break
        runs_while_capturing += 1
    assert runs_while_capturing > 0
    assert graphs.error is None and graphs.wait_ready() and graphs.replays > 0


def test_gemma3_compiles_and_matches_eager(tmp_path):
    """Gemma 3's layers (per-head q/k norms, sandwich norms, a sliding layer) trace: their
    norms take the torch code in a graph (the kernel's strided head rows are eager only;
    tracing them failed), and a compiled step equals the eager one."""
    import transformers

    from tests.conftest import make_tiny_tokenizer_files

    cfg = transformers.Gemma3TextConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=256,
        bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(tmp_path)
    make_tiny_tokenizer_files(str(tmp_path), 256)
    args = ServerArgs(model=str(tmp_path), device="cpu", dtype="float32", max_total_tokens=512,
                      max_running_requests=2)
    runner = ModelRunner(args, str(tmp_path))
    graphs = runner.decode_graphs = DecodeGraphRunner(runner, [2], compiled_graph_factory(1),
                                                      kind="test")
    h = PoolHarness.on_runner(runner)
    prompts = [list(range(3, 23)), list(range(40, 52))]  # one past the window, one not
    rows = [h.new_request() for _ in prompts]
    last = runner.forward(h.batch(ForwardMode.EXTEND, rows, prompts)).argmax(-1).tolist()
    for _ in range(3):
        fb = h.batch(ForwardMode.DECODE, rows, [[t] for t in last])
        last = replay_matches_eager(runner, graphs, fb).argmax(-1).tolist()
    assert graphs.replays == 3

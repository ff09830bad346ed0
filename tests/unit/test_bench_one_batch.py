"""bench one-batch (bytes per decode step, roofline share), bench long-prompt (ITL windows)
and bench offline with a shared-prefix dataset and ablations, on tiny random Llamas."""

from __future__ import annotations

import json

import pytest
import torch

from radixlm.bench.datasets import SharedPrefixDataset
from radixlm.bench.engine_args import Ablation
from radixlm.bench.long_prompt import (LongPromptConfig, Timeline, long_prompt_table,
                                       run_long_prompt, summarize_round)
from radixlm.bench.offline import OfflineConfig, offline_table, run_offline
from radixlm.bench.one_batch import (OneBatchConfig, measure_copy_bandwidth, one_batch_table,
                                     run_one_batch, step_bytes)
from radixlm.engine import Engine
from radixlm.models.linear.policy import top_level_methods
from tests.conftest import make_tiny_llama


@pytest.fixture(scope="module")
def tied_dir(tmp_path_factory) -> str:
    return make_tiny_llama(str(tmp_path_factory.mktemp("tied")), tie=True)


def test_step_bytes_counts_weights_and_kv(tiny_llama_dir: str, tied_dir: str) -> None:
    # tiny Llama: vocab 256, hidden 64, 2 layers, 2 KV heads of 64 / 4 = 16 dims, float32.
    kv_per_token = 2 * 2 * 2 * 16 * 4  # layers * (K, V) * kv_heads * head_dim * bytes
    for path, tied in ((tiny_llama_dir, False), (tied_dir, True)):
        engine = Engine(path, dtype="float32", max_total_tokens=256, max_running_requests=4)
        model = engine.scheduler.runner.model
        emb = 256 * 64 * 4
        norms = sum(p.numel() * p.element_size() for p in model.parameters()) - emb
        # The linear layers and the head (tied or not: its own prepacked copy) are read
        # whole; of the input embedding only the batch's 3 rows.
        assert model.logits_method.own_bytes() == emb
        layers = sum(m.own_bytes() for m in top_level_methods(model))
        assert layers > emb
        expected = layers + norms + 3 * 64 * 4
        sb = step_bytes(engine, batch=3)
        assert sb.weights == expected
        assert sb.kv_per_token == kv_per_token
        assert sb.decode_step(3, 10) == expected + 3 * 10 * kv_per_token


def test_copy_bandwidth_is_positive_and_finite() -> None:
    bw = measure_copy_bandwidth(8 << 20, torch.device("cpu"), tries=2)
    assert 1e8 < bw < 1e13


def test_one_batch_record(tiny_llama_dir: str, tmp_path) -> None:
    out = tmp_path / "one_batch.jsonl"
    cfg = OneBatchConfig(model=tiny_llama_dir, batch_sizes=(1, 3), prompt_len=8, decode_steps=3,
                         repeat=2, copy_mib=8, num_threads=1, output_file=str(out))
    rec = run_one_batch(cfg, log=lambda *_: None)
    assert json.loads(out.read_text()) == json.loads(json.dumps(rec))
    assert [r["batch_size"] for r in rec["results"]] == [1, 3]
    for r in rec["results"]:
        assert len(r["runs"]) == 2 and all(len(run["decode_step_s"]) == 3 for run in r["runs"])
        assert r["decode_tok_s"] == pytest.approx(r["batch_size"] / (r["decode_step_ms"] / 1e3))
        assert r["roofline_share"] == pytest.approx(r["achieved_gb_s"]
                                                    / rec["copy_bandwidth_gb_s"])
        assert r["prefill_tok_s"] == pytest.approx(r["batch_size"] * 8 / r["prefill_s"])
    assert "roofline share" in one_batch_table(rec)


def test_itl_windows_of_a_timeline() -> None:
    # Two streams; the long prompt arrives at t=1.0, its first token at 3.0, window to 3.5.
    t = Timeline([[0.0, 0.5, 1.0, 3.0, 3.5], [0.1, 0.6, 2.0, 3.5]], long_arrival=1.0,
                 long_first_token=3.0, window_end=3.5)
    s = summarize_round(t)
    # before: 0.5, 0.5 (stream 0), 0.5 (stream 1); during: 2.0, 0.5 | 1.4, 1.5
    assert s["itl_before_median_ms"] == pytest.approx(500)
    assert s["itl_during_samples"] == 4
    assert s["itl_during_median_ms"] == pytest.approx(1450)
    assert s["itl_during_max_ms"] == pytest.approx(2000)
    assert s["long_prompt_ttft_s"] == pytest.approx(2.0)


def test_long_prompt_record(tiny_llama_dir: str, tmp_path) -> None:
    out = tmp_path / "long.jsonl"
    cfg = LongPromptConfig(model=tiny_llama_dir,
                           configs=(Ablation("chunk16", {"chunked_prefill_size": 16}),
                                    Ablation("no-chunk", {"chunked_prefill_size": -1})),
                           num_streams=2, stream_prompt_len=4, long_prompt_len=64, warm_steps=2,
                           tail_steps=1, num_threads=1, output_file=str(out),
                           engine_args={"max_total_tokens": 512})
    rec = run_long_prompt(cfg, log=lambda *_: None)
    line = json.loads(out.read_text())
    assert "_timelines" not in line and line["results"][0]["config"] == "chunk16"
    chunked, whole = rec["results"]
    # 64 tokens in 16-token chunks: the streams decode between chunks, so they get more
    # tokens (ITL samples) during the long prefill than with one 64-token prefill.
    assert chunked["itl_during_samples"] > whole["itl_during_samples"] > 0
    assert "ITL during p99 ms" in long_prompt_table(rec)


def test_offline_shared_prefix_with_ablation(tiny_llama_dir: str) -> None:
    # 40 >= the 32 shared tokens from which the scheduler defers a same-round duplicate.
    ds = SharedPrefixDataset(num_groups=2, prompts_per_group=3, system_prompt_len=40,
                             question_len=4, output_len=3, seed=0)
    cfg = OfflineConfig(model=tiny_llama_dir, shared_prefix=ds, max_running_requests=8,
                        max_total_tokens=1024, max_prefill_tokens=256, baseline="none",
                        num_threads=1, ablations=(Ablation("no-radix",
                                                           {"disable_radix_cache": True}),))
    rec = run_offline(cfg, log=lambda *_: None)
    assert rec["engines"] == ["radixlm", "no-radix"]
    run = rec["radixlm"]["runs"][0]
    assert run["requests"] == 6 and run["input_tokens"] == 6 * 44 and run["output_tokens"] == 18
    # Each group's system prompt is computed once: the other 2 of 3 prompts hit it.
    assert rec["radixlm"]["median_cache_hit_rate"] == pytest.approx(2 * 2 * 40 / (6 * 44))
    assert rec["no-radix"]["median_cache_hit_rate"] == 0.0
    assert "no-radix" in offline_table(rec)

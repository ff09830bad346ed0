"""`radixlm bench serve` end to end: the command starts a radixlm server on a tiny random
Llama itself, runs a tiny shared-prefix benchmark through it, and writes one JSON line per
run with SGLang bench_serving's field names."""

from __future__ import annotations

import json

import pytest

from radixlm.cli import main

pytestmark = pytest.mark.slow

# SGLang bench_serving's result fields (a subset we promise to fill).
SGLANG_FIELDS = ("duration", "completed", "total_input_tokens", "total_output_tokens",
                 "request_throughput", "input_throughput", "output_throughput",
                 "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
                 "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms",
                 "mean_e2e_latency_ms", "median_e2e_latency_ms", "p99_e2e_latency_ms",
                 "concurrency", "max_concurrency", "request_rate")


def test_bench_serve_starts_radixlm_and_writes_json_lines(tiny_llama_dir, tmp_path,
                                                         capsys) -> None:
    out = tmp_path / "serve.jsonl"
    plots = tmp_path / "plots"
    main(["bench", "serve", "--model", tiny_llama_dir, "--llama-server", "none",
          "--dataset", "generated-shared-prefix", "--gsp-num-groups", "2",
          "--gsp-prompts-per-group", "3", "--gsp-system-prompt-len", "48",
          "--gsp-question-len", "6", "--gsp-output-len", "5", "--max-concurrency", "2", "inf",
          "--engine-arg", "max_total_tokens=2048", "--output-file", str(out),
          "--output-details", "--plot", str(plots), "--disable-tqdm"])
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [rec["max_concurrency"] for rec in lines] == [2, None]
    for rec in lines:
        for f in SGLANG_FIELDS:
            assert f in rec, f
        assert rec["benchmark"] == "serve" and rec["server"] == "radixlm"
        assert rec["backend"] == "radixlm" and rec["dataset_name"] == "generated-shared-prefix"
        assert rec["completed"] == 6 and rec["failed"] == 0 and rec["errors"] == []
        assert rec["total_output_tokens"] == 6 * 5  # ignore_eos: exactly max_tokens each
        assert rec["request_throughput"] == pytest.approx(6 / rec["duration"])
        assert rec["engine_args"] == {"max_total_tokens": 2048}
        # The cache was flushed after warm-up: the first prompt of each group misses, the
        # other two hit (at least) its 48-token system prompt.
        assert rec["cache_hit_rate"] is not None and rec["cache_hit_rate"] > 0.3
        assert rec["server_cache_hit_rate"] == pytest.approx(rec["cache_hit_rate"])
        assert len(rec["details"]["ttfts"]) == 6
        assert rec["median_ttft_ms"] > 0 and rec["median_itl_ms"] > 0
        # The server's mean decode step over the run, beside the ITL clients saw.
        assert 0 < rec["decode_step_ms"] < 10_000
        assert rec["itl_over_decode_step"] == pytest.approx(
            rec["median_itl_ms"] / rec["decode_step_ms"])
    printed = capsys.readouterr().out
    assert "out tok/s" in printed and "cache hit" in printed and "decode step" in printed
    assert sorted(p.name for p in plots.iterdir()) == ["serve_throughput_vs_concurrency.png",
                                                       "serve_ttft_itl_cdf.png"]

"""bench offline on a tiny random Llama: the record's fields and equal work on both sides."""

import json
import pstats

import pytest

from radixlm.bench.cold_start import first_completion, free_port
from radixlm.bench.offline import OfflineConfig, greedy_agreement, offline_table, run_offline
from radixlm.bench.workload import RandomWorkload
from tests.conftest import make_tiny_llama


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    model = make_tiny_llama(str(tmp_path_factory.mktemp("bench_llama")))
    out = tmp_path_factory.mktemp("bench_out") / "offline.jsonl"
    cfg = OfflineConfig(model=model, dtype="float32",
                        workload=RandomWorkload(5, 4, 30, 6, seed=3), max_running_requests=4,
                        max_total_tokens=1024, max_prefill_tokens=64,
                        repeat=2, baseline_batch_size=3, num_threads=1, output_file=str(out),
                        profile_file=str(out.with_suffix(".prof")))
    rec = run_offline(cfg, log=lambda *_: None)
    return rec, out


def test_record_fields_and_json_line(record):
    rec, out = record
    lines = out.read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0]) == json.loads(json.dumps(rec))
    assert rec["benchmark"] == "offline"
    cfg = rec["config"]
    assert cfg["workload"] == {"num_prompts": 5, "input_len_min": 4, "input_len_max": 30,
                               "output_len": 6, "seed": 3}
    assert cfg["resolved_dtype"] == "torch.float32" and cfg["torch_threads"] == 1
    assert cfg["baseline_batch_size"] == 3
    for side in ("radixlm", "transformers"):
        s = rec[side]
        assert len(s["runs"]) == 2
        for key in ("median_wall_s", "median_output_tok_s", "median_total_tok_s"):
            assert s[key] > 0
    assert rec["ratio_output_tok_s"] == pytest.approx(
        rec["radixlm"]["median_output_tok_s"] / rec["transformers"]["median_output_tok_s"])
    assert 0.0 <= rec["greedy_agreement"] <= 1.0
    assert "radixlm / transformers" in offline_table(rec)
    stats = pstats.Stats(str(out.with_suffix(".prof")))  # the engine loop was profiled
    assert any("step" in func[2] for func in stats.stats)


def test_both_engines_do_the_same_work(record):
    rec, _ = record
    for ours, theirs in zip(rec["radixlm"]["runs"], rec["transformers"]["runs"]):
        assert ours["requests"] == theirs["requests"] == 5
        assert ours["input_tokens"] == theirs["input_tokens"]
        assert ours["output_tokens"] == theirs["output_tokens"] == 5 * 6
    # Repeat i runs the workload with seed + i: a different set of prompts.
    runs = rec["radixlm"]["runs"]
    assert runs[0]["input_tokens"] != runs[1]["input_tokens"]


def test_greedy_agreement():
    assert greedy_agreement([[1, 2, 3, 4]], [[1, 2, 3, 4]]) == 1.0
    assert greedy_agreement([[1, 2, 3, 4], [5, 6]], [[1, 9, 3, 4], [5, 6]]) == pytest.approx(0.625)


def test_no_baseline_and_bad_config(tiny_llama_dir):
    cfg = OfflineConfig(model=tiny_llama_dir, workload=RandomWorkload(2, 4, 8, 2),
                        max_running_requests=2, max_total_tokens=256, baseline="none",
                        num_threads=1)
    rec = run_offline(cfg, log=lambda *_: None)
    assert "transformers" not in rec and "ratio_output_tok_s" not in rec
    with pytest.raises(ValueError):
        run_offline(OfflineConfig(model=tiny_llama_dir, repeat=0), log=lambda *_: None)


def test_cold_start_probe_on_a_closed_port():
    assert first_completion(free_port(), timeout_s=1.0) is False


def test_dtype_bench_on_tiny_llama(tiny_llama_dir, tmp_path):
    from radixlm.bench.dtype import DtypeBenchConfig, dtype_table, run_dtype_bench

    # 4 x 300 prompt tokens: more than one default CPU prefill chunk, still one step.
    cfg = DtypeBenchConfig(model=tiny_llama_dir, dtypes=("float32", "bfloat16"), batch_size=4,
                           prompt_len=300, decode_steps=3, repeat=2, num_threads=1,
                           output_file=str(tmp_path / "dtype.jsonl"))
    rec = run_dtype_bench(cfg, log=lambda *_: None)
    assert [r["dtype"] for r in rec["results"]] == ["float32", "bfloat16"]
    assert rec["prefill_tokens"] == 1200 and rec["decode_tokens"] == 12
    assert all(len(r["runs"]) == 2 and r["decode_tok_s"] > 0 for r in rec["results"])
    assert rec["fastest_decode"] in ("float32", "bfloat16")
    assert "bfloat16" in dtype_table(rec)

"""bench: deterministic random-token workloads, the table and JSON-line helpers, the CLI."""

import json

import pytest

from radixlm.bench.report import Throughput, append_json_line, format_table, summarize
from radixlm.bench.workload import RandomWorkload, random_prompts, special_token_ids
from radixlm.cli import build_parser

W = RandomWorkload(num_prompts=20, input_len_min=5, input_len_max=40, output_len=4, seed=7)


def test_prompts_are_deterministic_under_the_seed():
    a = random_prompts(W, 300, {0, 1, 2})
    assert a == random_prompts(W, 300, {0, 1, 2})
    assert a != random_prompts(RandomWorkload(20, 5, 40, 4, seed=8), 300, {0, 1, 2})


def test_lengths_in_range_and_no_special_ids():
    excluded = {0, 1, 2, 299}
    prompts = random_prompts(W, 300, excluded)
    assert len(prompts) == W.num_prompts
    assert all(W.input_len_min <= len(p) <= W.input_len_max for p in prompts)
    ids = {i for p in prompts for i in p}
    assert not ids & excluded
    assert all(0 <= i < 300 for i in ids)
    assert len({len(p) for p in prompts}) > 1  # lengths actually vary


def test_fixed_length_and_invalid_workloads():
    assert {len(p) for p in random_prompts(RandomWorkload(5, 9, 9, 1), 50)} == {9}
    with pytest.raises(ValueError):
        random_prompts(RandomWorkload(5, 10, 9, 1), 50)
    with pytest.raises(ValueError):
        random_prompts(RandomWorkload(5, 1, 9, 1), 3, {0, 1, 2})


def test_special_token_ids_of_a_tokenizer(tiny_llama_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    assert {0, 1, 2} <= special_token_ids(tok)  # <unk>, <s>, </s>
    assert 3 not in special_token_ids(tok)


def test_throughput_summary_table_and_json_line(tmp_path):
    runs = [Throughput(4, 100, 40, 2.0), Throughput(4, 100, 40, 1.0), Throughput(4, 100, 40, 4.0)]
    s = summarize(runs)
    assert s["median_wall_s"] == 2.0 and s["median_output_tok_s"] == 20.0
    assert s["median_total_tok_s"] == 70.0
    table = format_table(["engine", "tok/s"], [["radixlm", 20.0], ["transformers", 7.5]])
    assert table.splitlines()[2].split() == ["radixlm", "20.00"]
    path = tmp_path / "out.jsonl"
    append_json_line(str(path), {"a": 1})
    append_json_line(str(path), {"a": 2})
    assert [json.loads(ln)["a"] for ln in path.read_text().splitlines()] == [1, 2]


def test_cli_wiring():
    p = build_parser()
    ns = p.parse_args(["bench", "offline", "--num-prompts", "3", "--repeat", "2",
                       "--baseline", "none"])
    assert (ns.num_prompts, ns.repeat, ns.baseline, ns.output_len) == (3, 2, "none", 128)
    ns = p.parse_args(["bench", "dtype", "--dtypes", "float32", "bfloat16"])
    assert ns.dtypes == ["float32", "bfloat16"]
    ns = p.parse_args(["bench", "cold-start", "--timeout", "5", "--", "--dtype", "float32"])
    assert ns.timeout == 5.0 and ns.server_args[-2:] == ["--dtype", "float32"]


def test_engine_arg_parsing():
    import argparse

    from radixlm.bench.cli import parse_engine_arg

    assert parse_engine_arg("chunked_prefill_size=-1") == ("chunked_prefill_size", -1)
    assert parse_engine_arg("--max-total-tokens=4096") == ("max_total_tokens", 4096)
    assert parse_engine_arg("enable_mixed_chunk=true") == ("enable_mixed_chunk", True)
    assert parse_engine_arg("context_length=none") == ("context_length", None)
    for bad in ("no_such_field=1", "max_total_tokens", "max_total_tokens=lots"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_engine_arg(bad)
    ns = build_parser().parse_args(["bench", "offline", "--engine-arg", "chunked_prefill_size=-1"])
    assert dict(ns.engine_arg) == {"chunked_prefill_size": -1}

"""Benchmark datasets are deterministic under a seed and have the promised shapes; the
ablation / engine-arg parsing and the server command lines built from them."""

from __future__ import annotations

import json

import pytest

from radixlm.bench.datasets import (BenchRequest, DatasetArgs, RandomDataset, ShareGPTDataset,
                                    SharedPrefixDataset, TokenPool, to_text)
from radixlm.bench.engine_args import Ablation, parse_ablation
from radixlm.bench.serve import slot_context
from radixlm.bench.server_proc import engine_args_to_flags, llama_server_spec, radixlm_spec

POOL = TokenPool.from_vocab(100, {0, 1, 2})


def test_token_pool_excludes_special_ids() -> None:
    assert POOL.ids == tuple(range(3, 100))
    with pytest.raises(ValueError):
        TokenPool.from_vocab(2, {0, 1})


def test_random_dataset_is_deterministic_with_lengths_in_range() -> None:
    ds = RandomDataset(num_prompts=50, input_len=40, output_len=20, range_ratio=0.5, seed=3)
    a, b = ds.generate(POOL), ds.generate(POOL)
    assert a == b and a != RandomDataset(50, 40, 20, 0.5, seed=4).generate(POOL)
    for r in a:
        assert 20 <= r.prompt_len == len(r.prompt) <= 40 and 10 <= r.output_len <= 20
        assert all(3 <= t < 100 for t in r.prompt)
    assert len({r.prompt_len for r in a}) > 1
    fixed = RandomDataset(5, 16, 8, 1.0, 0).generate(POOL)
    assert {(r.prompt_len, r.output_len) for r in fixed} == {(16, 8)}
    with pytest.raises(ValueError):
        RandomDataset(range_ratio=0.0).generate(POOL)


def test_shared_prefix_dataset_shares_exactly_the_system_prompt() -> None:
    ds = SharedPrefixDataset(num_groups=3, prompts_per_group=4, system_prompt_len=20,
                             question_len=5, output_len=7, seed=1)
    reqs = ds.generate(POOL)
    assert reqs == ds.generate(POOL) and len(reqs) == ds.num_prompts == 12
    # Interleaved across groups: g0, g1, g2, g0, ...
    assert [r.group for r in reqs] == [0, 1, 2] * 4
    for r in reqs:
        assert r.prompt_len == len(r.prompt) == 25 and r.output_len == 7 and not r.follow_ups
    by_group = {g: [r.prompt for r in reqs if r.group == g] for g in range(3)}
    for g, prompts in by_group.items():
        assert len({tuple(p[:20]) for p in prompts}) == 1  # one system prompt per group
        assert len({tuple(p[20:]) for p in prompts}) == 4  # distinct questions
    assert len({tuple(by_group[g][0][:20]) for g in range(3)}) == 3


def test_multi_turn_follow_ups() -> None:
    reqs = SharedPrefixDataset(2, 2, 10, 4, 3, num_turns=3, seed=0).generate(POOL)
    assert all(len(r.follow_ups) == 2 and all(len(f) == 4 for f in r.follow_ups) for r in reqs)


def test_sharegpt_filters_and_shuffles(tmp_path) -> None:
    class WordTokenizer:
        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            return [1] * len(text.split())

    convs = [{"conversations": [{"from": "human", "value": " ".join(["w"] * n)},
                                {"from": "gpt", "value": " ".join(["w"] * (n + 1))}]}
             for n in (2, 5, 6, 7, 2000)]
    convs.append({"conversations": [{"from": "gpt", "value": "starts with the model"}]})
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(convs))
    reqs = ShareGPTDataset(str(path), num_prompts=10, seed=0).generate(WordTokenizer())
    # Too short (2 words) and too long (2000) are skipped.
    assert sorted((r.prompt_len, r.output_len) for r in reqs) == [(5, 6), (6, 7), (7, 8)]
    fixed = ShareGPTDataset(str(path), num_prompts=2, output_len=9, seed=0)
    assert [r.output_len for r in fixed.generate(WordTokenizer())] == [9, 9]
    with pytest.raises(ValueError):
        DatasetArgs(name="sharegpt").build(WordTokenizer(), POOL)


def test_to_text_recounts_with_the_tokenizer(tiny_llama_dir) -> None:
    from radixlm.tokenizer.loader import load_tokenizer

    tok = load_tokenizer(tiny_llama_dir)
    pool = TokenPool.from_tokenizer(tok)
    reqs = SharedPrefixDataset(2, 2, 6, 3, 2, num_turns=2, seed=0).generate(pool)
    texts = to_text(reqs, tok)
    for r, t in zip(reqs, texts):
        assert isinstance(t.prompt, str) and t.prompt == tok.decode(r.prompt)
        assert t.prompt_len == len(tok.encode(t.prompt, add_special_tokens=False))
        assert all(isinstance(f, str) for f in t.follow_ups)
    args = DatasetArgs(name="random", num_prompts=3, random_input_len=8, random_output_len=2)
    assert args.build(tok, pool) == args.build(tok, pool)
    assert args.build(tok, pool) != args.build(tok, pool, seed_offset=1)


def test_parse_ablation_and_server_flags() -> None:
    assert parse_ablation("no-radix:disable_radix_cache=true") == \
        Ablation("no-radix", {"disable_radix_cache": True})
    assert parse_ablation("chunked_prefill_size=-1,page_size=16") == \
        Ablation("chunked_prefill_size=-1,page_size=16",
                 {"chunked_prefill_size": -1, "page_size": 16})
    assert parse_ablation("defaults:") == Ablation("defaults", {})
    for bad in ("no-such-field=1", "name:no_such_field=1", "plain"):
        with pytest.raises(Exception):
            parse_ablation(bad)
    flags = engine_args_to_flags({"disable_radix_cache": True, "enable_mixed_chunk": False,
                                  "chunked_prefill_size": -1, "context_length": None})
    assert flags == ["--disable-radix-cache", "--no-enable-mixed-chunk",
                     "--chunked-prefill-size", "-1"]
    spec = radixlm_spec("r", "/m", {"page_size": 4}, port=1234)
    assert spec.cmd[-6:] == ("--port", "1234", "--model", "/m", "--page-size", "4")
    assert spec.base_url == "http://127.0.0.1:1234" and spec.backend == "radixlm"
    ls = llama_server_spec("/bin/llama-server", "/m.gguf", parallel=4, slot_ctx=512,
                           threads=2, port=9, amx=False)
    assert ls.cmd[ls.cmd.index("-c") + 1] == "2048" and ls.cmd[ls.cmd.index("-np") + 1] == "4"
    assert "--no-repack" not in ls.cmd  # its defaults...
    assert llama_server_spec("/bin/llama-server", "/m.gguf", 4, 512, 2, port=9,
                             amx=True).cmd[-1] == "--no-repack"  # ...but on AMX Xeons
    assert ls.restart_to_flush  # no endpoint empties its prompt cache: restarted per run
    assert not radixlm_spec("radixlm", None, {}, port=9).restart_to_flush
    with pytest.raises(ValueError):
        llama_server_spec("/bin/llama-server", "/m-dir", 1, 512, 2)


def test_slot_context_covers_the_longest_conversation() -> None:
    assert slot_context([BenchRequest("x", 100, 50), BenchRequest("y", 300, 10)]) == 512
    conv = BenchRequest("x", 100, 50, follow_ups=("a",))  # 100 + 2*50 + (25 + 64) + 64
    assert slot_context([conv]) == 512 and slot_context([conv]) >= 100 + 2 * 50 + 100


_PID_SERVER = """
import http.server, json, os, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"pid": os.getpid()}).encode()
        self.send_response(200); self.send_header("content-length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_launched_server_restart_is_a_new_process_on_the_same_port() -> None:
    import sys

    import httpx

    from radixlm.bench.server_proc import LaunchedServer, ServerSpec
    from tests.process_tree import free_port

    port = free_port()
    spec = ServerSpec("pid", (sys.executable, "-c", _PID_SERVER, str(port)), port, "openai",
                      restart_to_flush=True)
    with LaunchedServer(spec, timeout_s=30) as s:
        first = httpx.get(spec.base_url + "/health").json()["pid"]
        old = s.proc
        s.restart()
        assert old.poll() is not None  # the old process is gone
        assert httpx.get(spec.base_url + "/health").json()["pid"] not in (first, None)
    assert s.proc.poll() is not None

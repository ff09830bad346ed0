import json
import os

import pytest

from radixlm.cli import build_parser, main
from radixlm.config import ServerArgs, from_cli_args


def test_serve_flags_are_generated_from_server_args():
    ns = build_parser().parse_args(["serve", "--port", "1234", "--dtype", "bfloat16",
                                    "--max-total-tokens", "999", "--api-key", "k",
                                    "--num-threads", "3"])
    args = from_cli_args(ns)
    assert args == ServerArgs(port=1234, dtype="bfloat16", max_total_tokens=999, api_key="k",
                              num_threads=3)
    assert ServerArgs().port == 30000 and ServerArgs().num_threads is None


def test_cli_leaves_omp_wait_policy_to_the_user(monkeypatch):
    """libgomp's default (spin, then sleep) is fastest on an idle machine; radixlm no
    longer sets OMP_WAIT_POLICY=PASSIVE (the tests' conftest sets it for the tests)."""
    import radixlm.cli as cli

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    seen = []
    monkeypatch.setattr(cli, "_serve", lambda ns: seen.append(os.environ.get("OMP_WAIT_POLICY")))
    cli.main(["serve", "--num-threads", "2"])
    assert seen == [None] and "OMP_WAIT_POLICY" not in os.environ


def test_invalid_choice_is_rejected():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--dtype", "float8"])


def test_generate_prints_json(tiny_llama_dir, capsys):
    main(["generate", "--model", tiny_llama_dir, "--prompt", "w5 w6 w7", "--max-new-tokens", "3",
          "--max-total-tokens", "256", "--json"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["meta_info"]["completion_tokens"] <= 3
    assert out["meta_info"]["finish_reason"] in ("length", "stop")

"""`radixlm bench spec`'s bookkeeping: the acceptance delta between two /get_server_info
reads and the side-by-side table (ratio to the off run of the same workload)."""

from radixlm.bench.spec import _delta, _workloads, SpecBenchConfig, spec_table


def test_delta_and_table():
    before = {"verify_steps": 2, "verifies": 2, "drafted": 8, "accepted": 3}
    after = {"verify_steps": 6, "verifies": 6, "drafted": 24, "accepted": 15}
    d = _delta(after, before)
    assert d == {"verify_steps": 4, "verifies": 4, "drafted": 16, "accepted": 12,
                 "mean_acceptance_length": 4.0}
    assert _delta(None, None) is None
    runs = [{"config": "off", "workload": "copy", "tok_s": 10.0, "loadavg": 1.0, "spec": None},
            {"config": "NGRAM", "workload": "copy", "tok_s": 25.0, "loadavg": 1.0, "spec": d}]
    table = spec_table({"runs": runs})
    assert "2.5" in table and "4.0" in table


def test_workloads_cover_the_issue():
    names = [n for n, _ in _workloads(SpecBenchConfig(streams=(8, 32)))]
    assert names == ["copy-heavy", "repeat-chat", "random", "random x8 streams",
                     "random x32 streams"]


def test_starts_interleave_and_the_table_takes_medians():
    from radixlm.bench.spec import start_order
    assert start_order([None, "NGRAM"], 3) == [(0, None), (0, "NGRAM"), (1, "NGRAM"),
                                               (1, None), (2, None), (2, "NGRAM")]
    d = {"verify_steps": 1, "verifies": 1, "drafted": 3, "accepted": 1}
    runs = [{"config": c, "workload": "random", "start": i, "tok_s": t, "loadavg": 1.0,
             "spec": None if c == "off" else d}
            for i, (c, t) in enumerate([("off", 10.0), ("off", 20.0), ("off", 12.0),
                                        ("NGRAM", 11.0), ("NGRAM", 30.0), ("NGRAM", 9.0)])]
    table = spec_table({"runs": runs})
    line = next(l for l in table.splitlines() if "NGRAM" in l)
    # median 11 over median 12 (not the mean ratio, which the 30 would inflate)
    assert "0.917" in line and "9.0-30.0" in line and "2.0" in line


def test_a_config_may_name_its_draft_count():
    from radixlm.bench.spec import config_args
    assert config_args(None) == {}
    assert config_args("NGRAM") == {"speculative_algorithm": "NGRAM"}
    assert config_args("NGRAM:7") == {"speculative_algorithm": "NGRAM",
                                      "speculative_num_draft_tokens": 7}


def test_llama_server_peer_configs_and_counters(tmp_path):
    """--llama-server-spec entries become llama-server configurations (its plain decoding
    first, the baseline of their ratios), launched with --spec-type / --spec-draft-n-max
    and --metrics, whose counters map onto radixlm's acceptance fields."""
    from radixlm.bench.spec import is_llama, llama_configs, llama_spec_stats, server_spec

    assert llama_configs(()) == []
    assert llama_configs(("ngram-simple", "ngram-mod:7", "none")) == [
        "llama-server:none", "llama-server:ngram-simple", "llama-server:ngram-mod:7"]
    assert is_llama("llama-server:none") and not is_llama("NGRAM:7") and not is_llama(None)

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    cfg = SpecBenchConfig(model=str(gguf), streams=(8,), llama_server="/bin/true")
    cmd = list(server_spec(cfg, "llama-server:ngram-simple:7").cmd)
    assert cmd[:3] == ["/bin/true", "-m", str(gguf)]
    assert cmd[cmd.index("-np") + 1] == "8" and "--metrics" in cmd
    assert cmd[cmd.index("--spec-type") + 1] == "ngram-simple"
    assert cmd[cmd.index("--spec-ngram-simple-size-m") + 1] == "7"
    assert "--spec-ngram-simple-size-n" not in cmd  # llama-server's default lookup
    from radixlm.bench.spec import llama_spec_flags
    assert llama_spec_flags("ngram-simple", "7", "3") == [
        "--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", "7",
        "--spec-ngram-simple-size-n", "3"]
    assert llama_spec_flags("ngram-mod", "8") == [
        "--spec-type", "ngram-mod", "--spec-ngram-mod-n-min", "8", "--spec-ngram-mod-n-max", "8"]
    assert llama_spec_flags("draft-simple", "5") == ["--spec-type", "draft-simple",
                                                     "--spec-draft-n-max", "5"]
    assert llama_spec_flags("none", "5") == []
    plain = list(server_spec(cfg, "llama-server:none").cmd)
    assert "--spec-type" not in plain and "--metrics" in plain
    assert "--speculative-algorithm" in server_spec(cfg, "NGRAM").cmd

    text = ("# HELP llamacpp:spec_decode_num_draft_tokens_total Total draft tokens\n"
            "llamacpp:spec_decode_num_draft_tokens_total 120\n"
            "llamacpp:spec_decode_num_accepted_tokens_total 45\n"
            "llamacpp:spec_decode_num_drafts_total 30\n"
            "llamacpp:tokens_predicted_total 400\n")
    assert llama_spec_stats(text) == {"drafted": 120, "accepted": 45, "verifies": 30,
                                      "verify_steps": 30}
    assert llama_spec_stats("llamacpp:tokens_predicted_total 400\n") is None


def test_llama_server_ratios_are_to_its_own_plain_run():
    runs = [{"config": c, "workload": "copy-heavy", "tok_s": t, "loadavg": 1.0, "spec": None}
            for c, t in [("off", 10.0), ("NGRAM", 20.0), ("llama-server:none", 40.0),
                         ("llama-server:ngram-simple", 60.0)]]
    lines = spec_table({"runs": runs}).splitlines()
    peer = next(l for l in lines if "ngram-simple" in l)
    assert "1.500" in peer.split()  # 60 / 40, not 60 / 10
    order = [l.split()[1] for l in lines[2:]]
    assert order == ["off", "NGRAM", "llama-server:none", "llama-server:ngram-simple"]

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

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

"""bench/proc_stats.py: a server's processes found by the names they give themselves,
and their CPU seconds and RSS."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from radixlm.bench.proc_stats import (cpu_delta, cpu_ms_per_token, cpu_seconds, rss_mib,
                                      server_processes)

# A child that names itself as the scheduler does, burns CPU until told, then exits.
_CHILD = """
import sys, time
from radixlm.runtime.process_utils import set_process_name
set_process_name("radixlm-sched")
print("named", flush=True)
end = time.process_time() + float(sys.argv[1])
while time.process_time() < end:
    pass
sys.stdin.read()
"""


def test_roles_cpu_and_rss_of_a_process_tree():
    child = subprocess.Popen([sys.executable, "-c", _CHILD, "0.3"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "named"
        assert psutil.Process(child.pid).name() == "radixlm-sched"
        procs = server_processes(psutil.Process().pid)  # this test process is the "api"
        assert set(procs) >= {"api", "scheduler"}
        assert procs["scheduler"].pid == child.pid
        before = cpu_seconds(procs)
        deadline = time.monotonic() + 30
        while cpu_seconds(procs)["scheduler"] - before["scheduler"] < 0.2:
            assert time.monotonic() < deadline, "the child's CPU time did not grow"
            time.sleep(0.05)
        used = cpu_delta(before, cpu_seconds(procs))
        assert used["scheduler"] >= 0.2 and used["api"] >= 0.0
        assert rss_mib(procs)["scheduler"] > 1
    finally:
        child.communicate("", timeout=30)
    assert server_processes(child.pid) == {}  # gone: nothing, no error


def test_cpu_ms_per_token():
    assert cpu_ms_per_token({"api": 0.5, "detokenizer": 0.064}, 1000) == {
        "api": 0.5, "detokenizer": 0.064}
    assert cpu_ms_per_token({"api": 2.0}, 64) == {"api": 31.25}
    assert cpu_ms_per_token({"api": 2.0}, 0) == {}

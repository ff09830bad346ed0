"""Seconds from `radixlm serve` to /health answering and to the first token, for two or
more source trees (git worktrees of two commits), alternating, a fresh server each time;
medians per tree. Warm caches (kernels built, tokenizer converted): the start a user
makes every time after the first.

    git worktree add /tmp/before <commit>
    python scripts/bench_start_ab.py --tree before=/tmp/before --tree after=$PWD \
        [--repeat 5] [-- serve flags]

Each tree is put first on the server's PYTHONPATH (run from outside both trees: a
checkout in the working directory would shadow them).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from radixlm.bench.cold_start import first_completion, free_port
from radixlm.bench.report import machine_info
from radixlm.bench.server_proc import LaunchedServer, ServerSpec


def one_start(tree: str, flags: list[str], timeout_s: float = 300) -> tuple[float, float]:
    """(seconds to /health 200, seconds to the first completion token) of one server."""
    port = free_port()
    cmd = (sys.executable, "-m", "radixlm", "serve", "--port", str(port), *flags)
    spec = ServerSpec(os.path.basename(tree), cmd, port, "radixlm", env={"PYTHONPATH": tree})
    t0 = time.monotonic()
    with LaunchedServer(spec, timeout_s=timeout_s, poll_s=0.05):
        healthy = time.monotonic() - t0
        if not first_completion(port, timeout_s=60):
            raise RuntimeError(f"server from {tree} answered no completion")
        return healthy, time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", action="append", required=True, metavar="NAME=PATH")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("flags", nargs=argparse.REMAINDER, help="serve flags, after --")
    ns = ap.parse_args()
    trees = dict(t.split("=", 1) for t in ns.tree)
    flags = [f for f in ns.flags if f != "--"]
    m = machine_info()
    print(f"cpu: {m['cpu']}, {m['cores']} cores, flags {m['cpu_flags']}; torch {m['torch']}; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    for r in range(ns.repeat):
        for name, path in trees.items():
            healthy, first = one_start(os.path.abspath(path), flags)
            times[name].append((healthy, first))
            print(f"round {r} {name}: healthy {healthy:.2f} s, first token {first:.2f} s",
                  flush=True)
            time.sleep(2)
    for name, t in times.items():
        print(f"{name}: median healthy {statistics.median(h for h, _ in t):.2f} s, "
              f"first token {statistics.median(f for _, f in t):.2f} s (n={len(t)})")
    print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

"""Two `radixlm serve` start-ups one after the other vs side by side
(tests/server_harness.started_together), alternating, each until both answer /health,
then both stopped. What the e2e modules that need two servers (test_speculative_server.py,
test_deterministic_server.py) pay before their first test.

    PYTHONPATH=$PWD python scripts/bench_server_starts.py [--model DIR] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from contextlib import ExitStack

sys.path.insert(0, os.getcwd())

from tests.conftest import make_tiny_llama  # noqa: E402
from tests.server_harness import running_server, started_together  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None,
                    help="model path; 'default' = the default model; omitted: a tiny Llama")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    model = None if a.model == "default" else a.model
    if a.model is None:
        model = make_tiny_llama(tempfile.mkdtemp(prefix="tiny-"))
    flags = ("--max-total-tokens", "4096", "--max-running-requests", "8")
    for r in range(a.rounds):
        t0 = time.monotonic()
        with ExitStack() as stack:
            for _ in range(2):
                stack.enter_context(running_server(model, *flags))
            ready = time.monotonic() - t0
        serial = (ready, time.monotonic() - t0)
        t0 = time.monotonic()
        with started_together(running_server(model, *flags), running_server(model, *flags)):
            ready = time.monotonic() - t0
        together = (ready, time.monotonic() - t0)
        print(f"round {r}: one after the other ready {serial[0]:.1f} s (with stop "
              f"{serial[1]:.1f}), side by side ready {together[0]:.1f} s (with stop "
              f"{together[1]:.1f}); load {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()

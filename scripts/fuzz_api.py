"""The long schemathesis run against a server's own OpenAPI schema (make test runs a
bounded one: tests/e2e/test_api_fuzz.py).

Starts `radixlm serve` (the default model unless --model) or uses --base-url, fuzzes
every operation with --examples generated requests per mode (positive and negative),
then checks the server is still healthy and no KV slot leaked. Rules per response:
tests/fuzz_driver.py. Exits 1 on any failure.

  python scripts/fuzz_api.py [--model PATH] [--examples 2000] [--base-url URL]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import httpx

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from radixlm.bench.server_proc import LaunchedServer, radixlm_spec  # noqa: E402
from tests.fuzz_driver import fuzz  # noqa: E402


def _idle_pool(url: str) -> dict:
    for _ in range(600):
        pool = httpx.get(url + "/server_info", timeout=30).json()["pool"]
        if pool["running"] == 0 and pool["waiting"] == 0:
            break
        time.sleep(0.1)
    return pool


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--base-url", default=None)
    ap.add_argument("--examples", type=int, default=2000, help="Per operation and mode.")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--context-length", type=int, default=512,
                    help="Of the server this script starts: keeps generations short.")
    ns = ap.parse_args()

    def run(url: str) -> int:
        t0 = time.monotonic()
        headers = {"Authorization": f"Bearer {ns.api_key}"} if ns.api_key else None
        report = fuzz(url, ns.examples, headers=headers)
        print(f"{report.summary()} in {time.monotonic() - t0:.0f} s")
        for f in report.failures[:50]:
            print("FAIL", f)
        for n in report.accepted_negative[:20]:
            print("accepted (negative)", n)
        healthy = httpx.get(url + "/health", timeout=10).status_code == 200
        pool = _idle_pool(url)
        leak = pool["held_by_requests"] or pool["invariant_error"] is not None or \
            pool["free_kv_slots"] + pool["held_by_cache"] != pool["total_kv_slots"]
        print(f"healthy afterwards: {healthy}; pool: {pool['free_kv_slots']} free + "
              f"{pool['held_by_cache']} cached of {pool['total_kv_slots']}, "
              f"{pool['held_by_requests']} held by requests")
        return 0 if healthy and not leak and not report.failures else 1

    if ns.base_url:
        return run(ns.base_url.rstrip("/"))
    spec = radixlm_spec("radixlm", ns.model, {"context_length": ns.context_length,
                                              "api_key": ns.api_key})
    with LaunchedServer(spec) as server:
        return run(server.spec.base_url)


if __name__ == "__main__":
    sys.exit(main())

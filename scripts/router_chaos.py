"""Router chaos run: kill one of two instances mid-load.

Starts two radixlm instances and `radixlm router` in front of them, drives a mixed load
through the router (non-streaming completions and streams), SIGKILLs instance 0 (its
API process; the scheduler and detokenizer die with it) after --kill-after-s, keeps the
load going, then checks:
  * every non-streaming request was answered 200 (the router retried it elsewhere);
  * every stream ended with `data: [DONE]`, either complete or after an error event;
  * no request hung (each has a client timeout of --client-timeout-s);
  * the surviving instance is idle with no KV slot held by a request.
Prints a JSON summary; exits 1 if any check fails.

  python scripts/router_chaos.py [--model PATH] [--seconds 40] [--kill-after-s 12]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import time
from collections import Counter

import httpx

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from radixlm.bench.cold_start import free_port  # noqa: E402
from radixlm.bench.server_proc import LaunchedServer, ServerSpec, radixlm_spec  # noqa: E402


async def _unary(http: httpx.AsyncClient, url: str, rng: random.Random) -> str:
    body = {"prompt": f"Tell me about item {rng.randrange(10**6)}.", "max_tokens": 24,
            "temperature": 0.7}
    r = await http.post(url + "/v1/completions", json=body)
    return "ok" if r.status_code == 200 and r.json().get("choices") else f"http_{r.status_code}"


async def _stream(http: httpx.AsyncClient, url: str, rng: random.Random) -> str:
    body = {"prompt": f"Write a story about {rng.randrange(10**6)}.", "max_tokens": 64,
            "temperature": 0.7, "stream": True}
    events: list[str] = []
    async with http.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            return f"http_{r.status_code}"
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    if not events or events[-1] != "[DONE]":
        return "no_done"
    if any(e.startswith('{"error"') for e in events[:-1]):
        return "error_event"
    return "ok"


async def _client(kind: str, http: httpx.AsyncClient, url: str, end: float, seed: int,
                  outcomes: Counter) -> None:
    rng = random.Random(seed)
    fn = _unary if kind == "unary" else _stream
    while time.monotonic() < end:
        try:
            outcome = await fn(http, url, rng)
        except httpx.TimeoutException:
            outcome = "hung"
        except httpx.HTTPError as e:
            outcome = f"transport_{type(e).__name__}"
        outcomes[f"{kind}:{outcome}"] += 1


async def _load(url: str, seconds: float, kill_after: float, victim: LaunchedServer,
                clients: int, timeout_s: float) -> tuple[Counter, float]:
    outcomes: Counter = Counter()
    end = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=timeout_s) as http:
        tasks = [asyncio.create_task(_client("unary" if i % 2 else "stream", http, url, end, i,
                                             outcomes)) for i in range(clients)]
        await asyncio.sleep(kill_after)
        assert victim.proc is not None
        os.kill(victim.proc.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        await asyncio.gather(*tasks)
    return outcomes, killed_at


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--kill-after-s", type=float, default=12.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--client-timeout-s", type=float, default=120.0)
    ap.add_argument("--engine-arg", action="append", default=[], metavar="FLAG",
                    help="Extra `radixlm serve` flags for both instances (repeatable), "
                    "e.g. --engine-arg=--max-total-tokens=8192")
    ap.add_argument("--policy", default="round_robin",
                    help="Router policy (round_robin: both instances get load for sure).")
    ns = ap.parse_args()

    specs = [radixlm_spec(f"instance{i}", ns.model, {}) for i in range(2)]
    specs = [ServerSpec(s.name, s.cmd + tuple(ns.engine_arg), s.port, s.backend) for s in specs]
    rport = free_port()
    router_cmd = (sys.executable, "-m", "radixlm", "router", "--port", str(rport),
                  "--health-check-interval-s", "1", "--policy", ns.policy, "--worker-urls",
                  *[s.base_url for s in specs])
    router = ServerSpec("router", router_cmd, rport, "openai")
    with LaunchedServer(specs[0]) as victim, LaunchedServer(specs[1]) as survivor, \
            LaunchedServer(router) as front:
        t0 = time.monotonic()
        outcomes, killed_at = asyncio.run(_load(front.spec.base_url, ns.seconds,
                                                ns.kill_after_s, victim, ns.clients,
                                                ns.client_timeout_s))
        for _ in range(300):
            pool = httpx.get(survivor.spec.base_url + "/server_info", timeout=30).json()["pool"]
            if pool["running"] == 0 and pool["waiting"] == 0:
                break
            time.sleep(0.1)
        metrics = httpx.get(front.spec.base_url + "/metrics", timeout=30).text
    retries = next((float(x.split()[-1]) for x in metrics.splitlines()
                    if x.startswith("radixlm_router_retries_total")), 0.0)
    unary_bad = {k: v for k, v in outcomes.items() if k.startswith("unary:") and k != "unary:ok"}
    stream_bad = {k: v for k, v in outcomes.items()
                  if k.startswith("stream:") and k not in ("stream:ok", "stream:error_event")}
    leaked = pool["held_by_requests"] or pool["invariant_error"] is not None
    summary = {"outcomes": dict(sorted(outcomes.items())), "killed_after_s": killed_at - t0,
               "router_retries": retries, "survivor_pool": pool,
               "unary_not_answered": unary_bad, "streams_without_done_or_hung": stream_bad,
               "passed": not unary_bad and not stream_bad and not leaked}
    print(json.dumps(summary, indent=1))
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""`radixlm bench soak --minutes N`: a long mixed workload and what it leaves behind.

More: docs/bench-tools.md, "bench/soak.py".
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from radixlm.bench.proc_stats import rss_mib, server_processes

IDLE_RSS_WAIT_S = 2.5
KINDS = {"stream": 0.35, "unary": 0.25, "cancel": 0.2, "bad": 0.15, "timeout": 0.05}
BAD_BODIES: list[tuple[str, Any]] = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "seed": -3}),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": -1}),
    ("/v1/completions", b'{"prompt": "hi", '),
    ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}),
]


@dataclass
class SoakConfig:
    base_url: str
    minutes: float
    concurrency: int = 8
    window_s: float = 15.0
    idle_every_s: float = 60.0
    max_tokens: int = 48
    seed: int = 0
    server_pid: int | None = None  # RSS of this process and its children (None: skip)


@dataclass
class Window:
    t_s: float  # seconds since the start, at the end of the window
    rss_mib: dict[str, float]
    outcomes: dict[str, int]
    p50_s: float | None
    p99_s: float | None


@dataclass
class IdleCheck:
    t_s: float
    free_kv_slots: int
    held_by_cache: int
    held_by_requests: int
    total_kv_slots: int
    invariant_error: str | None
    rss_mib: dict[str, float] = field(default_factory=dict)  # by role, at rest


@dataclass
class SoakResult:
    config: dict[str, Any]
    windows: list[Window] = field(default_factory=list)
    idle_checks: list[IdleCheck] = field(default_factory=list)
    totals: dict[str, int] = field(default_factory=dict)

    @property
    def failures(self) -> int:
        bad = ("5xx", "transport_error", "lost", "bad_not_4xx", "timeout_not_408")
        leaks = sum(c.held_by_requests > 0 or c.invariant_error is not None
                    or c.free_kv_slots + c.held_by_cache != c.total_kv_slots
                    for c in self.idle_checks)
        return sum(self.totals.get(k, 0) for k in bad) + leaks

    def to_json(self) -> str:
        return json.dumps({"config": self.config, "windows": [asdict(w) for w in self.windows],
                           "idle_checks": [asdict(c) for c in self.idle_checks],
                           "totals": self.totals, "failures": self.failures})


class _Run:
    def __init__(self, cfg: SoakConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.window_outcomes: Counter = Counter()
        self.totals: Counter = Counter()
        self.latencies: list[float] = []
        self.running = asyncio.Event()
        self.running.set()
        self.in_flight = 0
        self.prefixes = [" ".join(f"shared{g}word{i}" for i in range(40)) for g in range(4)]

    def count(self, outcome: str) -> None:
        self.window_outcomes[outcome] += 1
        self.totals[outcome] += 1

    async def client(self, http: httpx.AsyncClient, end: float, idx: int) -> None:
        rng = random.Random(self.cfg.seed * 1000 + idx)
        kinds, weights = list(KINDS), list(KINDS.values())
        while time.monotonic() < end:
            await self.running.wait()
            kind = rng.choices(kinds, weights)[0]
            self.in_flight += 1
            t0 = time.monotonic()
            try:
                outcome = await getattr(self, "_" + kind)(http, rng)
            except httpx.HTTPError as e:
                outcome = "transport_error"
                self.totals[f"transport_error:{type(e).__name__}"] += 1
            finally:
                self.in_flight -= 1
            self.count(f"{kind}:{outcome}" if outcome in ("ok", "rejected_429") else outcome)
            if outcome == "ok" and kind in ("stream", "unary"):
                self.latencies.append(time.monotonic() - t0)

    def _prompt(self, rng: random.Random) -> str:
        suffix = " ".join(f"q{rng.randrange(1000)}" for _ in range(rng.randrange(4, 30)))
        return rng.choice(self.prefixes) + " " + suffix

    async def _stream(self, http: httpx.AsyncClient, rng: random.Random, *, cancel_after: int = 0,
                      timeout: float | None = None) -> str:
        body: dict[str, Any] = {"prompt": self._prompt(rng), "stream": True,
                                "max_tokens": self.cfg.max_tokens * (20 if timeout else 1),
                                "temperature": 0.7, "ignore_eos": bool(timeout)}
        if timeout:
            body["timeout"] = timeout
        events: list[str] = []
        async with http.stream("POST", self.cfg.base_url + "/v1/completions", json=body) as r:
            if r.status_code == 429:
                return "rejected_429"
            if r.status_code >= 500:
                return "5xx"
            if r.status_code != 200:
                return f"unexpected_{r.status_code}"
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    if cancel_after and len(events) >= cancel_after:
                        return "ok"
        if not events or events[-1] != "[DONE]":
            return "lost"
        errors = [json.loads(e)["error"] for e in events[:-1] if '"error"' in e[:12]]
        if timeout:
            return "ok" if errors and errors[-1]["code"] == 408 else "timeout_not_408"
        if errors:
            return "5xx" if errors[-1].get("code", 500) >= 500 else "stream_error_4xx"
        return "ok"

    async def _cancel(self, http: httpx.AsyncClient, rng: random.Random) -> str:
        return await self._stream(http, rng, cancel_after=rng.randrange(1, 6))

    async def _timeout(self, http: httpx.AsyncClient, rng: random.Random) -> str:
        return await self._stream(http, rng, timeout=0.3 + rng.random())

    async def _unary(self, http: httpx.AsyncClient, rng: random.Random) -> str:
        body = {"messages": [{"role": "system", "content": rng.choice(self.prefixes)},
                             {"role": "user", "content": self._prompt(rng)}],
                "max_tokens": self.cfg.max_tokens, "temperature": 0.7}
        r = await http.post(self.cfg.base_url + "/v1/chat/completions", json=body)
        if r.status_code == 429:
            return "rejected_429"
        if r.status_code >= 500:
            return "5xx"
        if r.status_code != 200 or not r.json().get("choices"):
            return f"unexpected_{r.status_code}"
        return "ok"

    async def _bad(self, http: httpx.AsyncClient, rng: random.Random) -> str:
        path, body = rng.choice(BAD_BODIES)
        if isinstance(body, bytes):
            r = await http.post(self.cfg.base_url + path, content=body,
                                headers={"content-type": "application/json"})
        else:
            r = await http.post(self.cfg.base_url + path, json=body)
        if r.status_code >= 500:
            return "5xx"
        try:
            ok = 400 <= r.status_code < 500 and r.json()["error"]["code"] == r.status_code
        except (ValueError, KeyError, TypeError):
            ok = False
        return "bad:ok" if ok else "bad_not_4xx"

    async def idle_check(self, http: httpx.AsyncClient, t_s: float) -> IdleCheck:
        """Pause the clients, wait for every request to end and the scheduler to go idle,
        read the pool; resume."""
        self.running.clear()
        try:
            while self.in_flight:
                await asyncio.sleep(0.05)
            for _ in range(600):
                pool = (await http.get(self.cfg.base_url + "/server_info")).json()["pool"]
                if pool["running"] == 0 and pool["waiting"] == 0:
                    break
                await asyncio.sleep(0.05)
            # RSS at rest: after the scheduler's first idle poll period (~1 s), in which
            # it hands its free heap back (Scheduler.on_idle).
            await asyncio.sleep(IDLE_RSS_WAIT_S)
            rss = rss_mib(server_processes(self.cfg.server_pid)) if self.cfg.server_pid else {}
            return IdleCheck(t_s, pool["free_kv_slots"], pool["held_by_cache"],
                             pool["held_by_requests"], pool["total_kv_slots"],
                             pool["invariant_error"], rss)
        finally:
            self.running.set()

    def close_window(self, t_s: float) -> Window:
        lat = sorted(self.latencies)
        p50 = statistics.median(lat) if lat else None
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else None
        rss = rss_mib(server_processes(self.cfg.server_pid)) if self.cfg.server_pid else {}
        w = Window(t_s, rss, dict(self.window_outcomes), p50, p99)
        self.window_outcomes, self.latencies = Counter(), []
        return w


async def run_soak_async(cfg: SoakConfig, log=print) -> SoakResult:
    run = _Run(cfg)
    result = SoakResult(config=asdict(cfg))
    start = time.monotonic()
    end = start + cfg.minutes * 60
    limits = httpx.Limits(max_connections=cfg.concurrency + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0), limits=limits) as http:
        clients = [asyncio.create_task(run.client(http, end, i)) for i in range(cfg.concurrency)]
        next_window, next_idle = start + cfg.window_s, start + cfg.idle_every_s
        while time.monotonic() < end:
            await asyncio.sleep(0.2)
            now = time.monotonic()
            if now >= next_idle:
                check = await run.idle_check(http, now - start)
                result.idle_checks.append(check)
                log(f"[{now - start:6.0f} s] idle: {check.held_by_requests} slots held by "
                    f"requests, {check.free_kv_slots} free + {check.held_by_cache} cached of "
                    f"{check.total_kv_slots}")
                next_idle = time.monotonic() + cfg.idle_every_s
                now = time.monotonic()
            if now >= next_window:
                w = run.close_window(now - start)
                result.windows.append(w)
                log(f"[{w.t_s:6.0f} s] p99 {w.p99_s or 0:.2f} s, rss "
                    f"{sum(w.rss_mib.values()):.0f} MiB, {w.outcomes}")
                next_window = max(next_window + cfg.window_s, now + 1.0)
        await asyncio.gather(*clients)
        result.windows.append(run.close_window(time.monotonic() - start))
        result.idle_checks.append(await run.idle_check(http, time.monotonic() - start))
    result.totals = dict(run.totals)
    return result


def run_soak(cfg: SoakConfig, log=print) -> SoakResult:
    return asyncio.run(run_soak_async(cfg, log))


def long_lived_processes(windows: list[Window]) -> list[str]:
    """The server's own processes: those in at least half of the windows (not the
    compiler a first start on a new machine runs to build the C++ kernels, say)."""
    seen = Counter(n for w in windows for n in w.rss_mib)
    return sorted(n for n, k in seen.items() if 2 * k >= len(windows))


def plot_soak(result: SoakResult, path: str) -> str:
    """Three panels over time: RSS per process (under load, and at rest at the idle
    checks), p99 latency, idle KV slots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    ws = result.windows
    names = long_lived_processes(ws)
    for n in names:
        axes[0].plot([w.t_s for w in ws if n in w.rss_mib], [w.rss_mib[n] for w in ws
                                                              if n in w.rss_mib], label=n)
    for n in names:  # the same processes at rest (idle checks), as markers
        pts = [(c.t_s, c.rss_mib[n]) for c in result.idle_checks if n in c.rss_mib]
        if pts:
            axes[0].plot([p[0] for p in pts], [p[1] for p in pts], "x", label=f"{n} at rest")
    axes[0].set_ylabel("RSS (MiB)")
    if names:
        axes[0].legend(fontsize=7)
    pts = [(w.t_s, w.p99_s) for w in ws if w.p99_s is not None]
    axes[1].plot([p[0] for p in pts], [p[1] for p in pts], marker="o")
    axes[1].set_ylabel("p99 latency (s)")
    ic = result.idle_checks
    axes[2].plot([c.t_s for c in ic], [c.free_kv_slots + c.held_by_cache for c in ic],
                 marker="o", label="free + cached")
    axes[2].plot([c.t_s for c in ic], [c.held_by_requests for c in ic], marker="x",
                 label="held by requests (leak)")
    axes[2].set_ylabel("KV slots when idle")
    axes[2].set_xlabel("time (s)")
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path

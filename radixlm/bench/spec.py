"""`radixlm bench spec`: speculative decoding on vs off through the HTTP API, side by side.

Per configuration (off, each --algorithms entry NAME[:K], and with --llama-server-spec
llama.cpp's llama-server as the peer: its plain decoding and each --spec-type TYPE[:M[:N]])
a fresh server runs copy-heavy (edit a ~300-token code snippet, quote a passage), a chat
that asks to repeat its earlier answer (then replayed: SUFFIX's case), random prompts
(single stream, greedy), then random prompts at each --streams concurrency. Reported:
output tok/s, the ratio to the same server's plain run, the acceptance (radixlm's
/get_server_info, llama-server's /metrics). With --starts N each configuration starts N
times, interleaved, and the table gives medians over starts and their spread.

More: docs/bench-tools.md, "bench/spec.py".
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from radixlm.bench.report import append_json_line, format_table, machine_info, utc_now
from radixlm.bench.server_proc import (LaunchedServer, ServerSpec, find_llama_server,
                                       llama_server_spec, radixlm_spec)
from radixlm.models.loader import resolve_model_path

CODE = '''import json
from dataclasses import dataclass, field


@dataclass
class Inventory:
    """Items in a store, with their prices and quantities."""
    items: dict[str, float] = field(default_factory=dict)
    quantities: dict[str, int] = field(default_factory=dict)

    def add_item(self, name: str, price: float, quantity: int = 1) -> None:
        if price < 0:
            raise ValueError("price must not be negative")
        self.items[name] = price
        self.quantities[name] = self.quantities.get(name, 0) + quantity

    def remove_item(self, name: str, quantity: int = 1) -> None:
        if name not in self.quantities:
            raise KeyError(name)
        self.quantities[name] -= quantity
        if self.quantities[name] <= 0:
            del self.quantities[name]
            del self.items[name]

    def total_value(self) -> float:
        total = 0.0
        for name, price in self.items.items():
            total += price * self.quantities[name]
        return total

    def to_json(self) -> str:
        return json.dumps({"items": self.items, "quantities": self.quantities})
'''
PASSAGE = ('The committee met on Tuesday to review the new library plan. "We need more '
           'space for children," said the chair, Maria Lopez. The architect, Tom Reed, '
           'answered: "The second floor can hold a reading room of two hundred square '
           'meters." Several members worried about the cost. "The budget is fixed at four '
           'million," the treasurer reminded everyone. In the end the committee voted to '
           'ask for a revised design by March, with "a quiet room for study" added.')
COPY_PROMPTS = [
    "Rename the class Inventory to Store in this code and output the complete code:\n\n" + CODE,
    "Add a docstring to the method total_value and output the complete code:\n\n" + CODE,
    "Summarize this passage, quoting every sentence in quotation marks exactly:\n\n" + PASSAGE,
]
CHAT_QUESTIONS = ["Explain in a few sentences how a bicycle gear works.",
                  "Describe how bread rises, in a short paragraph."]
REPEAT_ASK = "Thank you. Please repeat your previous answer word for word."
WORDS = ("river stone blue market quietly seven paper window engine garden orange "
         "history cloud simple travel metal forest music letter bright winter coffee "
         "planet number yellow ocean silver mountain teacher island").split()


@dataclass(frozen=True)
class SpecBenchConfig:
    model: str | None = None
    algorithms: tuple[str, ...] = ("NGRAM", "SUFFIX")
    max_tokens: int = 256
    random_prompts: int = 4
    streams: tuple[int, ...] = (8, 32)
    stream_max_tokens: int = 64
    engine_args: dict[str, Any] = field(default_factory=dict)
    output_file: str | None = None
    startup_timeout_s: float = 900.0
    seed: int = 0
    starts: int = 1  # fresh server starts per configuration (interleaved); medians reported
    llama_server_spec: tuple[str, ...] = ()  # TYPE[:M[:N]] configurations of llama-server
    llama_server: str | None = None  # its binary (None: find_llama_server's search)


def random_words_prompt(rng: random.Random) -> str:
    """The random workload's prompt: a list of 40 common words drawn by `rng`."""
    return "Continue this list of words: " + " ".join(rng.choice(WORDS) for _ in range(40))


async def _chat(client: httpx.AsyncClient, messages: list[dict], max_tokens: int) -> tuple[str, int]:
    r = await client.post("/v1/chat/completions", json={
        "model": "default", "messages": messages, "max_tokens": max_tokens, "temperature": 0})
    r.raise_for_status()
    body = r.json()
    return body["choices"][0]["message"]["content"], body["usage"]["completion_tokens"]


async def _sequential(base: str, convs: list[list[dict]], max_tokens: int) -> tuple[int, float]:
    async with httpx.AsyncClient(base_url=base, timeout=None) as c:
        t0, toks = time.perf_counter(), 0
        for m in convs:
            toks += (await _chat(c, m, max_tokens))[1]
        return toks, time.perf_counter() - t0


async def _repeat_chat(base: str, max_tokens: int) -> tuple[int, float]:
    """Turn 1, then a turn asking to repeat it, then the whole conversation replayed."""
    async with httpx.AsyncClient(base_url=base, timeout=None) as c:
        t0, toks = time.perf_counter(), 0
        for q in CHAT_QUESTIONS:
            msgs = [{"role": "user", "content": q}]
            answer, n = await _chat(c, msgs, max_tokens)
            msgs += [{"role": "assistant", "content": answer},
                     {"role": "user", "content": REPEAT_ASK}]
            toks += n + (await _chat(c, msgs, max_tokens))[1]
            toks += (await _chat(c, msgs, max_tokens))[1]  # the replayed conversation
        return toks, time.perf_counter() - t0


async def _concurrent(base: str, prompts: list[str], streams: int, max_tokens: int) -> tuple[int, float]:
    sem = asyncio.Semaphore(streams)
    async with httpx.AsyncClient(base_url=base, timeout=None,
                                 limits=httpx.Limits(max_connections=streams + 4)) as c:
        async def one(p: str) -> int:
            async with sem:
                return (await _chat(c, [{"role": "user", "content": p}], max_tokens))[1]
        t0 = time.perf_counter()
        toks = sum(await asyncio.gather(*(one(p) for p in prompts)))
        return toks, time.perf_counter() - t0


LLAMA = "llama-server"
# llama-server's /metrics counters (with --metrics) -> the names radixlm's server info uses.
_LLAMA_COUNTERS = {"llamacpp:spec_decode_num_draft_tokens_total": "drafted",
                   "llamacpp:spec_decode_num_accepted_tokens_total": "accepted",
                   "llamacpp:spec_decode_num_drafts_total": "verifies"}


def _spec_stats(base: str, llama: bool = False) -> dict | None:
    if llama:
        return llama_spec_stats(httpx.get(base + "/metrics", timeout=30).text)
    info = httpx.get(base + "/get_server_info", timeout=30).json()
    return info.get("pool", {}).get("speculative")


def llama_spec_stats(metrics: str) -> dict | None:
    """radixlm's speculative counters from llama-server's Prometheus text (None when
    it has none: speculation off, or an older build). A draft there is one verified request
    step, so verify_steps = verifies."""
    out = {}
    for line in metrics.splitlines():
        name, _, value = line.partition(" ")
        if name in _LLAMA_COUNTERS:
            out[_LLAMA_COUNTERS[name]] = int(float(value))
    if len(out) < len(_LLAMA_COUNTERS):
        return None
    out["verify_steps"] = out["verifies"]
    return out


def _delta(after: dict | None, before: dict | None) -> dict | None:
    if after is None:
        return None
    b = before or {}
    d = {k: after[k] - b.get(k, 0) for k in ("verify_steps", "verifies", "drafted", "accepted")}
    d["mean_acceptance_length"] = round(1 + d["accepted"] / d["verifies"], 2) if d["verifies"] else None
    return d


def _workloads(cfg: SpecBenchConfig):
    rng = random.Random(cfg.seed)
    randoms = [random_words_prompt(rng) for _ in range(cfg.random_prompts)]
    yield "copy-heavy", lambda b: _sequential(
        b, [[{"role": "user", "content": p}] for p in COPY_PROMPTS], cfg.max_tokens)
    yield "repeat-chat", lambda b: _repeat_chat(b, cfg.max_tokens)
    yield "random", lambda b: _sequential(
        b, [[{"role": "user", "content": p}] for p in randoms], cfg.max_tokens)
    for s in cfg.streams:
        many = [random_words_prompt(rng) for _ in range(2 * s)]
        yield f"random x{s} streams", (lambda b, s=s, many=many: _concurrent(
            b, many, s, cfg.stream_max_tokens))


def start_order(configs: list[str | None], starts: int) -> list[tuple[int, str | None]]:
    """(start, config) in run order: the configurations forward, then backward, ... so that
    a load trend over the run favours none of them."""
    out = []
    for i in range(starts):
        out += [(i, c) for c in (configs if i % 2 == 0 else configs[::-1])]
    return out


def is_llama(conf: str | None) -> bool:
    return bool(conf) and conf.split(":")[0] == LLAMA


def baseline(conf: str) -> str:
    """The configuration a ratio is taken against: llama-server's plain decoding for its
    own configurations, radixlm's off for the others."""
    return f"{LLAMA}:none" if is_llama(conf) else "off"


def server_spec(cfg: SpecBenchConfig, conf: str | None) -> ServerSpec:
    """The server of one configuration: radixlm (off or an --algorithms entry) or
    llama-server ("llama-server:TYPE[:M[:N]]")."""
    if not is_llama(conf):
        return radixlm_spec(conf or "off", cfg.model, {**cfg.engine_args, **config_args(conf)})
    _, spec_type, m, n = (conf.split(":") + ["", "", ""])[:4]
    binary = find_llama_server(cfg.llama_server)
    if binary is None:
        raise FileNotFoundError("llama-server not found (--llama-server PATH, or "
                                "scripts/build_llama_server.sh)")
    # One slot per stream; a slot holds the longest conversation (repeat-chat's three turns).
    base = llama_server_spec(binary, resolve_model_path(cfg.model), max(cfg.streams, default=1),
                             4096, os.cpu_count() or 1)
    extra = ("--metrics", *llama_spec_flags(spec_type, m, n))
    return dataclasses.replace(base, name=conf, cmd=base.cmd + extra)


def llama_spec_flags(spec_type: str, m: str = "", n: str = "") -> list[str]:
    """llama-server's flags for --spec-type `spec_type` with draft length m and lookup
    length n where given (its own defaults otherwise: ngram-simple/-map-k drafts of 48
    after a 12-token match, ngram-mod 48-64 after 24, a draft model 3)."""
    if not spec_type or spec_type == "none":
        return []
    flags = ["--spec-type", spec_type]
    if spec_type in ("ngram-simple", "ngram-map-k", "ngram-map-k4v"):
        flags += ([f"--spec-{spec_type}-size-m", m] if m else []) + (
            [f"--spec-{spec_type}-size-n", n] if n else [])
    elif spec_type == "ngram-mod":
        flags += (["--spec-ngram-mod-n-min", m, "--spec-ngram-mod-n-max", m] if m else []) + (
            ["--spec-ngram-mod-n-match", n] if n else [])
    elif m:
        flags += ["--spec-draft-n-max", m]
    return flags


def llama_configs(entries: tuple[str, ...]) -> list[str]:
    """--llama-server-spec entries as configuration names, llama-server's plain decoding
    (its baseline) first."""
    names = [f"{LLAMA}:{e}" for e in entries if e.split(":")[0] != "none"]
    return [baseline(LLAMA), *names] if entries else []


def config_args(alg: str | None) -> dict[str, Any]:
    """The engine arguments of one configuration: None is off; NAME or NAME:K (K drafts)."""
    if not alg:
        return {}
    name, _, k = alg.partition(":")
    return {"speculative_algorithm": name, **({"speculative_num_draft_tokens": int(k)} if k else {})}


def _one_start(cfg: SpecBenchConfig, alg: str | None, start: int, log) -> list[dict[str, Any]]:
    spec = server_spec(cfg, alg)
    llama = is_llama(alg)
    log(f"starting {' '.join(spec.cmd)} (start {start + 1}/{cfg.starts})")
    runs = []
    with LaunchedServer(spec, cfg.startup_timeout_s):
        base = spec.base_url
        asyncio.run(_sequential(base, [[{"role": "user", "content": "Hello"}]], 8))  # warm
        for name, work in _workloads(cfg):
            before = _spec_stats(base, llama)
            load = os.getloadavg()[0]
            toks, dt = asyncio.run(work(base))
            run = {"config": alg or "off", "workload": name, "start": start, "tokens": toks,
                   "seconds": round(dt, 2), "tok_s": round(toks / dt, 2),
                   "loadavg": round(load, 2),
                   "spec": _delta(_spec_stats(base, llama), before)}
            runs.append(run)
            log(f"{run['config']:>6} {name:<18} {run['tok_s']:7.1f} tok/s "
                f"({toks} tok, {dt:.1f} s, load {load:.1f}) {run['spec']}")
    return runs


def run_spec_bench(cfg: SpecBenchConfig, log=print) -> dict[str, Any]:
    if cfg.starts < 1:
        raise ValueError(f"--starts must be >= 1, got {cfg.starts}")
    runs: list[dict[str, Any]] = []
    configs = [None, *cfg.algorithms, *llama_configs(cfg.llama_server_spec)]
    for start, alg in start_order(configs, cfg.starts):
        runs += _one_start(cfg, alg, start, log)
    record = {"bench": "spec", "date": utc_now(), "machine": machine_info(),
              "config": {k: v for k, v in cfg.__dict__.items() if k != "output_file"},
              "runs": runs}
    if cfg.output_file:
        append_json_line(cfg.output_file, record)
    return record


def _summed(spec: list[dict | None]) -> dict:
    tot = {k: sum((s or {}).get(k, 0) for s in spec)
           for k in ("verify_steps", "verifies", "drafted", "accepted")}
    tot["mean_acceptance_length"] = (round(1 + tot["accepted"] / tot["verifies"], 2)
                                     if tot["verifies"] else None)
    return tot


def spec_table(record: dict[str, Any]) -> str:
    """One row per (workload, config): the median tok/s over its starts, the spread
    (min-max, when there were several), the ratio of medians to off (llama-server's
    configurations: to its `none`), and the acceptance summed over starts."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in record["runs"]:
        groups.setdefault((r["workload"], r["config"]), []).append(r)
    med = {key: statistics.median(r["tok_s"] for r in rs) for key, rs in groups.items()}
    rows = []
    for (work, conf), rs in groups.items():
        sp = _summed([r["spec"] for r in rs])
        off = med.get((work, baseline(conf)))
        rates = [r["tok_s"] for r in rs]
        spread = f"{min(rates):.1f}-{max(rates):.1f}" if len(rs) > 1 else ""
        rows.append([work, conf, len(rs), round(med[(work, conf)], 2), spread,
                     round(med[(work, conf)] / off, 3) if off else "",
                     sp["mean_acceptance_length"] or "", sp["accepted"] or "",
                     sp["drafted"] or "", round(statistics.median(r["loadavg"] for r in rs), 2)])
    rows.sort(key=lambda row: (row[0], is_llama(row[1]), row[1] != baseline(row[1]), row[1]))
    return format_table(["workload", "config", "starts", "tok/s (median)", "spread",
                         "x off", "accept len", "accepted", "drafted", "load"], rows)

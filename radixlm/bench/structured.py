"""`radixlm bench structured`: the cost of constrained decoding.

1. Decode throughput with every request constrained vs none, per batch size, side by side
   in one run (interleaved repeats), for each scheduling loop asked for. The constraint
   is a JSON array of objects that cannot end within the output length (`minItems`), so
   both sides decode exactly `output_len` tokens per request; only decode steps are
   timed (from the step after every request has its first token).
2. Jump-forward on vs off (`--disable-jump-forward`), side by side in one run
   (interleaved repeats, two engines): greedy requests over the schema corpus, each to
   its grammar's end, at each batch size; completion tok/s, wall time, the share of
   output tokens jumped (not sampled), the share of outputs valid against their schema;
   and unconstrained requests on both engines (the feature's cost where nothing jumps).
3. Grammar compile time p50/p99 over the schema corpus (`schema_corpus.py`) with the
   model's tokenizer, and the cache's effect: the queue latency of a schema the first time
   (compiled) vs again (a cache hit).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from radixlm.bench.report import append_json_line, format_table, machine_info, utc_now

LONG_SCHEMA = {"type": "array", "minItems": 1000, "items": {
    "type": "object", "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 100000},
        "name": {"type": "string", "maxLength": 12},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]},
                 "maxItems": 3},
        "ok": {"type": "boolean"}}, "required": ["id", "name", "tags", "ok"]}}


@dataclass
class StructuredBenchConfig:
    model: str | None = None
    batch_sizes: list[int] = field(default_factory=lambda: [1, 32])
    output_len: int = 64
    repeat: int = 2
    overlap_modes: list[bool] = field(default_factory=lambda: [False, True])
    num_threads: int | None = None
    engine_args: dict[str, Any] = field(default_factory=dict)
    output_file: str | None = None
    sections: list[str] = field(default_factory=lambda: ["decode", "jump", "compile"])


def _decode_tok_s(engine: Any, prompts: list[list[int]], params: Any) -> float:
    rids = [engine.submit(p, params, stream=True) for p in prompts]  # tokens as they come
    while not all(engine.result(r)["output_ids"] for r in rids):
        engine.step()
    t0 = time.perf_counter()
    done0 = sum(len(engine.result(r)["output_ids"]) for r in rids)
    engine.run_until_done(rids)
    dt = time.perf_counter() - t0
    total = sum(len(engine.pop_result(r)["output_ids"]) for r in rids)
    return (total - done0) / dt


def run_decode(cfg: StructuredBenchConfig) -> list[dict[str, Any]]:
    from radixlm import Engine, SamplingParams
    from radixlm.constrained.request_mapping import constraint_from_request

    constraint = constraint_from_request({"json_schema": LONG_SCHEMA})
    rows = []
    for overlap in cfg.overlap_modes:
        engine = Engine(cfg.model, disable_overlap_schedule=not overlap,
                        max_running_requests=max(cfg.batch_sizes),
                        num_threads=cfg.num_threads, **cfg.engine_args)
        text = engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": "List the items as JSON."}], tokenize=False,
            add_generation_prompt=True)
        base = list(engine.tokenizer.encode(text, add_special_tokens=False))
        sp = {name: SamplingParams(max_new_tokens=cfg.output_len, temperature=0.0,
                                   ignore_eos=True, constraint=c)
              for name, c in (("none", None), ("constrained", constraint))}
        # Warm-up: the grammar compiled and cached, the kernels touched.
        engine.generate(base, dataclasses.replace(sp["constrained"], max_new_tokens=4))
        for bs in cfg.batch_sizes:
            # Distinct prompts (a different last token): no request is a pure cache hit.
            prompts = [base + [100 + i] for i in range(bs)]
            got: dict[str, list[float]] = {"none": [], "constrained": []}
            for _ in range(cfg.repeat):
                for name in ("none", "constrained"):
                    engine.scheduler.tree_cache.reset()
                    got[name].append(_decode_tok_s(engine, prompts, sp[name]))
            none, con = statistics.median(got["none"]), statistics.median(got["constrained"])
            g = engine.scheduler.constrained.stats
            rows.append({"overlap": overlap, "batch": bs, "none_tok_s": none,
                         "constrained_tok_s": con, "ratio": con / none,
                         "runs": got, "mask_ms_per_step": 1e3 * g.mask_s / max(g.mask_steps, 1)})
        engine.check_invariant()
        engine.scheduler.shutdown()
    return rows


def _corpus_prompts(engine: Any, n: int) -> list[list[int]]:
    text = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Reply with one JSON object that fits the schema."}],
        tokenize=False, add_generation_prompt=True)
    base = list(engine.tokenizer.encode(text, add_special_tokens=False))
    return [base + [100 + i] for i in range(n)]  # distinct: no request is a pure cache hit


def _timed(engine: Any, prompts: list[list[int]], params: list[Any]) -> tuple[float, list]:
    engine.scheduler.tree_cache.reset()
    t0 = time.perf_counter()
    outs = engine.generate(prompts, params)
    return time.perf_counter() - t0, outs


def run_jump_forward(cfg: StructuredBenchConfig) -> list[dict[str, Any]]:
    import jsonschema

    from radixlm import Engine, SamplingParams
    from radixlm.bench.schema_corpus import schema_corpus
    from radixlm.constrained.request_mapping import constraint_from_request

    schemas = schema_corpus()
    constraints = [constraint_from_request({"json_schema": s}) for s in schemas]
    rows = []
    for overlap in cfg.overlap_modes:
        engines = {name: Engine(cfg.model, disable_overlap_schedule=not overlap,
                                max_running_requests=max(cfg.batch_sizes),
                                num_threads=cfg.num_threads, disable_jump_forward=off,
                                **cfg.engine_args)
                   for name, off in (("on", False), ("off", True))}
        for e in engines.values():  # warm-up: every grammar compiled, the kernels touched
            e.generate(_corpus_prompts(e, len(constraints)),
                       [SamplingParams(max_new_tokens=2, temperature=0.0, constraint=c)
                        for c in constraints])
        for bs in cfg.batch_sizes:
            idx = [i % len(constraints) for i in range(bs)]
            params = [SamplingParams(max_new_tokens=cfg.output_len, temperature=0.0,
                                     constraint=constraints[i]) for i in idx]
            free = [SamplingParams(max_new_tokens=cfg.output_len, temperature=0.0,
                                   ignore_eos=True)] * bs
            got: dict[str, dict[str, list[float]]] = {
                n: {"tok_s": [], "wall_s": [], "jumped": [], "valid": [], "none_tok_s": []}
                for n in engines}
            for _ in range(cfg.repeat):
                for name, e in engines.items():
                    prompts = _corpus_prompts(e, bs)
                    jf = e.scheduler.jump_forward
                    jumped0 = jf.stats.jumped_tokens if jf is not None else 0
                    wall, outs = _timed(e, prompts, params)
                    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
                    jumped = (jf.stats.jumped_tokens if jf is not None else 0) - jumped0
                    valid = 0
                    for i, o in zip(idx, outs):
                        try:
                            jsonschema.validate(json.loads(o["text"]), schemas[i])
                            valid += 1
                        except (ValueError, jsonschema.ValidationError):
                            pass
                    g = got[name]
                    g["tok_s"].append(tokens / wall)
                    g["wall_s"].append(wall)
                    g["jumped"].append(jumped / max(tokens, 1))
                    g["valid"].append(valid / bs)
                    wall, outs = _timed(e, prompts, free)
                    g["none_tok_s"].append(sum(o["meta_info"]["completion_tokens"]
                                               for o in outs) / wall)
            med = {n: {k: statistics.median(v) for k, v in g.items()} for n, g in got.items()}
            rows.append({"overlap": overlap, "batch": bs, "on": med["on"], "off": med["off"],
                         "tok_s_ratio": med["on"]["tok_s"] / med["off"]["tok_s"],
                         "wall_ratio": med["on"]["wall_s"] / med["off"]["wall_s"],
                         "none_ratio": med["on"]["none_tok_s"] / med["off"]["none_tok_s"],
                         "runs": got})
        for e in engines.values():
            e.check_invariant()
            e.scheduler.shutdown()
    return rows


def run_compile(cfg: StructuredBenchConfig) -> dict[str, Any]:
    from radixlm.bench.schema_corpus import schema_corpus
    from radixlm.constrained.constraint import Constraint
    from radixlm.constrained.grammar_queue import GrammarQueue
    from radixlm.constrained.request_mapping import constraint_from_request
    from radixlm.constrained.xgrammar_backend import XGrammarBackend
    from radixlm.models import resolve_model_path
    from radixlm.tokenizer.loader import load_tokenizer

    tok = load_tokenizer(resolve_model_path(cfg.model), None)
    t0 = time.perf_counter()
    backend = XGrammarBackend.from_tokenizer(tok, len(tok), [tok.eos_token_id])
    setup_s = time.perf_counter() - t0
    constraints = [constraint_from_request({"json_schema": s}) for s in schema_corpus()]
    times = []
    for c in constraints:
        t = time.perf_counter()
        backend.compile(c)
        times.append(time.perf_counter() - t)
    times.sort()

    def pct(p: float) -> float:
        return times[min(len(times) - 1, round(p * (len(times) - 1)))]

    # The cache: queue latency (submit -> matcher ready) of a fresh schema, then again.
    q = GrammarQueue(lambda: backend, timeout_s=60)
    lat = {}
    for label in ("first (compile)", "repeat (cache hit)"):
        req = type("R", (), {"rid": label, "grammar": None})()
        t = time.perf_counter()
        q.submit(req, Constraint(constraints[6].kind, constraints[6].spec, "bench"))
        while not q.ready():
            q.wait_any(0.01)
        lat[label] = time.perf_counter() - t
    q.shutdown()
    return {"schemas": len(times), "backend_setup_s": setup_s, "p50_s": pct(0.5),
            "p99_s": pct(0.99), "max_s": times[-1], "mean_s": statistics.mean(times),
            "cache_latency_s": lat}


def run_structured_bench(cfg: StructuredBenchConfig) -> dict[str, Any]:
    record = {"bench": "structured", "date": utc_now(), "machine": machine_info(),
              "config": dataclasses.asdict(cfg)}
    for name, run in (("decode", run_decode), ("jump", run_jump_forward),
                      ("compile", run_compile)):
        if name in cfg.sections:
            record[name] = run(cfg)
    if cfg.output_file:
        append_json_line(cfg.output_file, record)
    return record


def structured_table(record: dict[str, Any]) -> str:
    out = []
    if "decode" in record:
        rows = [["overlap" if r["overlap"] else "serial", r["batch"], r["none_tok_s"],
                 r["constrained_tok_s"], f"{r['ratio']:.3f}", f"{r['mask_ms_per_step']:.3f}"]
                for r in record["decode"]]
        out.append(format_table(["loop", "batch", "none tok/s", "constrained tok/s", "ratio",
                                 "mask ms/step"], rows))
    if "jump" in record:
        rows = [["overlap" if r["overlap"] else "serial", r["batch"], r["on"]["tok_s"],
                 r["off"]["tok_s"], f"{r['tok_s_ratio']:.3f}", f"{r['wall_ratio']:.3f}",
                 f"{r['on']['jumped']:.3f}", f"{r['on']['valid']:.2f}/{r['off']['valid']:.2f}",
                 f"{r['none_ratio']:.3f}"] for r in record["jump"]]
        out.append(format_table(["loop", "batch", "jump-fwd tok/s", "off tok/s", "tok/s ratio",
                                 "wall ratio", "jumped share", "valid on/off",
                                 "none ratio on/off"], rows))
    if "compile" not in record:
        return "\n".join(out)
    c = record["compile"]
    out += [f"compile over {c['schemas']} schemas: p50 {1e3 * c['p50_s']:.2f} ms, p99 "
           f"{1e3 * c['p99_s']:.2f} ms, max {1e3 * c['max_s']:.2f} ms (backend set-up "
           f"{c['backend_setup_s']:.2f} s)",
            "cache: " + ", ".join(f"{k} {1e3 * v:.2f} ms"
                                  for k, v in c["cache_latency_s"].items())]
    return "\n".join(out)


if __name__ == "__main__":  # pragma: no cover
    print(json.dumps(run_structured_bench(StructuredBenchConfig()), indent=1))

"""Print the summary table of scripts/gpu_check.sh from its output folder.

Standard library only, so that the summary prints even when radixlm cannot be imported.
Reads OUT/steps.tsv (one line per step: name, status, seconds, log hint) and OUT/bench.jsonl
(the JSON lines of `radixlm bench offline`, `radixlm bench one-batch` and `radixlm bench
overlap`).
"""

from __future__ import annotations

import json
import os
import sys


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
    return "\n".join([fmt(headers), fmt(["-" * w for w in widths]), *map(fmt, rows)])


def _steps(path: str) -> str:
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            rows = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    rows = [(r + [""] * 4)[:4] for r in rows]
    return _table(["step", "status", "seconds", "note"], rows)


def _records(path: str) -> list[dict]:
    out = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    return out


def _model(rec: dict) -> str:
    return os.path.basename(str(rec.get("config", {}).get("model_path", "?")).rstrip("/"))


def _offline(records: list[dict]) -> str:
    rows = []
    for rec in records:
        engines = rec.get("engines", [])
        ref = rec.get(engines[0], {}).get("median_output_tok_s") if engines else None
        ablations = {a.get("name"): a.get("engine_args", {})
                     for a in rec.get("config", {}).get("ablations", [])}
        base_args = rec.get("config", {}).get("engine_args", {})
        for name in engines:
            s = rec.get(name, {})
            args = ablations.get(name, base_args if name == "radixlm" else {})
            tok_s = s.get("median_output_tok_s")
            rows.append([_model(rec), name, ", ".join(f"{k}={v}" for k, v in args.items()),
                         f"{s.get('median_wall_s', float('nan')):.2f}",
                         f"{tok_s:.1f}" if tok_s else "?",
                         f"{tok_s / ref:.2f}x" if tok_s and ref else "?"])
    return _table(["model", "engine", "overrides", "wall s", "output tok/s", "vs first"], rows)


def _one_batch(records: list[dict]) -> str:
    rows = []
    for rec in records:
        engine_args = rec.get("config", {}).get("engine_args", {})
        backend = engine_args.get("attention_backend", "auto")
        if engine_args.get("disable_cuda_graph"):
            backend += " (no CUDA graph)"
        for r in rec.get("results", []):
            rows.append([_model(rec), backend, str(r.get("batch_size")),
                         f"{r.get('decode_step_ms', float('nan')):.2f}",
                         f"{r.get('decode_tok_s', float('nan')):.0f}",
                         f"{r.get('achieved_gb_s', float('nan')):.0f}",
                         f"{100 * r.get('roofline_share', float('nan')):.1f}%",
                         f"{rec.get('copy_bandwidth_gb_s', float('nan')):.0f}"])
    return _table(["model", "attention", "batch", "decode step ms", "decode tok/s",
                   "achieved GB/s", "roofline share", "copy GB/s"], rows)


def _overlap(records: list[dict]) -> str:
    rows = []
    for rec in records:
        on, off = rec.get("overlap", {}), rec.get("serial", {})
        pct = lambda r: f"{100 * r.get('median_bubble_share_of_wall', float('nan')):.2f}%"
        rows.append([os.path.basename(str(rec.get("model", "?")).rstrip("/")),
                     f"{on.get('median_output_tok_s', float('nan')):.1f}",
                     f"{off.get('median_output_tok_s', float('nan')):.1f}",
                     f"{rec.get('throughput_ratio_median', float('nan')):.3f}x",
                     pct(on), pct(off),
                     f"{off.get('median_schedule_ms_per_step', float('nan')):.2f}",
                     f"{off.get('median_forward_ms_per_step', float('nan')):.2f}"])
    return _table(["model", "overlap tok/s", "serial tok/s", "overlap/serial",
                   "bubble overlap", "bubble serial", "sched ms/step", "fwd ms/step"], rows)


def summary(out_dir: str) -> str:
    records = _records(os.path.join(out_dir, "bench.jsonl"))
    offline = [r for r in records if r.get("benchmark") == "offline"]
    one_batch = [r for r in records if r.get("benchmark") == "one-batch"]
    overlap = [r for r in records if r.get("bench") == "overlap"]
    parts = ["== gpu_check summary ==", "", "steps (logs: gpu_check.log):",
             _steps(os.path.join(out_dir, "steps.tsv"))]
    machine = next((r.get("machine") for r in records if r.get("machine")), None)
    if machine:
        parts += ["", f"machine: {json.dumps(machine)}"]
    parts += ["", "offline throughput (radixlm bench offline, median of repeats):",
              _offline(offline) if offline else "(no results)",
              "", "one-batch decode (radixlm bench one-batch):",
              _one_batch(one_batch) if one_batch else "(no results)",
              "", "overlap vs serial scheduler, decode (radixlm bench overlap, medians):",
              _overlap(overlap) if overlap else "(no results)"]
    return "\n".join(parts)


if __name__ == "__main__":
    print(summary(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", ".")))

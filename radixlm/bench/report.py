"""Reporting helpers: throughput figures, medians, the console table, JSON lines, machine."""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from radixlm.runtime.cpu_features import cpu_summary


@dataclass(frozen=True)
class Throughput:
    """One timed run of one engine over one workload."""

    requests: int
    input_tokens: int
    output_tokens: int
    wall_s: float

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.wall_s

    @property
    def total_tok_s(self) -> float:
        return (self.input_tokens + self.output_tokens) / self.wall_s

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "output_tok_s": self.output_tok_s, "total_tok_s": self.total_tok_s}


def summarize(runs: Sequence[Throughput]) -> dict[str, Any]:
    """Every run plus the median of each throughput figure (each taken independently)."""
    return {
        "runs": [r.to_dict() for r in runs],
        "median_wall_s": statistics.median(r.wall_s for r in runs),
        "median_output_tok_s": statistics.median(r.output_tok_s for r in runs),
        "median_total_tok_s": statistics.median(r.total_tok_s for r in runs),
    }


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table, numbers right-aligned; floats with 2 decimals (3 below 10)."""

    def cell(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.3f}" if abs(v) < 10 else f"{v:.2f}"
        return str(v)

    cells = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]

    def line(values: Sequence[str], raw: Sequence[Any] | None = None) -> str:
        parts = []
        for i, v in enumerate(values):
            numeric = raw is not None and isinstance(raw[i], (int, float))
            parts.append(v.rjust(widths[i]) if numeric else v.ljust(widths[i]))
        return "  ".join(parts).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), sep, *(line(c, r) for c, r in zip(cells, rows))])


def append_json_line(path: str, record: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def machine_info() -> dict[str, Any]:
    """CPU model, cores, RAM, library versions: enough to tell two result lines apart."""
    import torch
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    ram_gib = None
    try:
        with open("/proc/meminfo") as f:
            kib = next(int(ln.split()[1]) for ln in f if ln.startswith("MemTotal:"))
        ram_gib = round(kib / 2**20, 1)
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "ram_gib": ram_gib,
            # Other processes share the CPU: the 1-minute load at the start tells how much.
            "load_avg_1m": os.getloadavg()[0],
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            # avx2 / avx512f / avx512_bf16 / amx_bf16 / ...: what --dtype auto goes by.
            "cpu_flags": cpu_summary()["flags"],
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__}


def load_warning(record: dict[str, Any]) -> str | None:
    """A line to print when other processes were busy as the benchmark started. (The load
    at the end, `load_avg_1m_end`, includes the benchmark's own threads.)"""
    cores = record["machine"]["cores"] or 1
    load = record["machine"]["load_avg_1m"]
    if load < 0.5 * cores:
        return None
    return (f"warning: 1-minute load average {load:.1f} on {cores} cores as the benchmark "
            f"started: other processes share the CPU, figures are noisy")

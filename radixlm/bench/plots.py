"""PNG plots of benchmark records (matplotlib, Agg backend: no display needed).

`--plot DIR` on `radixlm bench serve | offline | long-prompt` writes these; each function
returns the paths it wrote.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, out_dir: str, name: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def _median_by(records: list[dict[str, Any]], field: str) -> dict[tuple[str, Any], float]:
    groups: dict[tuple[str, Any], list[float]] = {}
    for r in records:
        groups.setdefault((r["server"], r["max_concurrency"]), []).append(r[field])
    return {k: float(np.median(v)) for k, v in groups.items()}


def _servers(records: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["server"] for r in records))


def plot_serve(records: list[dict[str, Any]], out_dir: str, prefix: str = "serve") -> list[str]:
    """Throughput vs concurrency (when several were run), TTFT and ITL distributions
    (empirical CDFs, all runs of a server pooled), and output-throughput bars per server."""
    plt = _pyplot()
    paths = []
    servers = _servers(records)
    thr = _median_by(records, "output_throughput")
    concs = list(dict.fromkeys(r["max_concurrency"] for r in records))
    if len(concs) > 1:
        fig, ax = plt.subplots(figsize=(6, 4))
        xs = [c if c is not None else max(c2 or 0 for c2 in concs) * 2 for c in concs]
        for s in servers:
            ax.plot(xs, [thr.get((s, c), np.nan) for c in concs], marker="o", label=s)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("max concurrency")
        ax.set_ylabel("output tokens/s (median)")
        ax.set_title("Throughput vs concurrency")
        ax.legend()
        ax.grid(alpha=0.3)
        paths.append(_save(fig, out_dir, f"{prefix}_throughput_vs_concurrency.png"))

    if all("details" in r for r in records):
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for s in servers:
            recs = [r for r in records if r["server"] == s]
            ttft = np.sort([t * 1e3 for r in recs for t, ok in
                            zip(r["details"]["ttfts"], r["details"]["success"]) if ok])
            itl = np.sort([g * 1e3 for r in recs for gaps in r["details"]["itls"] for g in gaps])
            for ax, vals in ((axes[0], ttft), (axes[1], itl)):
                if vals.size:
                    ax.plot(vals, np.arange(1, vals.size + 1) / vals.size, label=s)
        for ax, what in ((axes[0], "TTFT"), (axes[1], "ITL")):
            ax.set_xscale("log")
            ax.set_xlabel(f"{what} (ms, log scale)")
            ax.set_ylabel("fraction of samples <= x")
            ax.set_title(f"{what} distribution")
            ax.grid(alpha=0.3)
            ax.legend()
        paths.append(_save(fig, out_dir, f"{prefix}_ttft_itl_cdf.png"))

    if len(servers) > 1:
        fig, ax = plt.subplots(figsize=(1.6 * len(servers) * len(concs) + 2, 4))
        width = 0.8 / len(concs)
        for j, c in enumerate(concs):
            vals = [thr.get((s, c), 0.0) for s in servers]
            bars = ax.bar(np.arange(len(servers)) + j * width, vals, width,
                          label=f"concurrency {c or 'inf'}")
            ax.bar_label(bars, fmt="%.1f", fontsize=8)
        ax.set_xticks(np.arange(len(servers)) + width * (len(concs) - 1) / 2, servers)
        ax.set_ylabel("output tokens/s (median)")
        ax.set_title("Output throughput per server")
        if len(concs) > 1:
            ax.legend()
        paths.append(_save(fig, out_dir, f"{prefix}_throughput_bars.png"))
    return paths


def plot_bars(labels: list[str], values: list[float], ylabel: str, title: str, out_dir: str,
              name: str) -> str:
    """One bar per configuration (offline ablations, cache hit rates)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(1.5 * len(labels) + 2, 4))
    bars = ax.bar(labels, values, color="tab:blue")
    ax.bar_label(bars, fmt="%.2f", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return _save(fig, out_dir, name)


def plot_timeline(series: dict[str, tuple[list[float], list[float]]],
                  marks: dict[str, tuple[float, float]], out_dir: str, name: str,
                  title: str) -> str:
    """Inter-token gaps over time, one panel per configuration: `series[label] = (times s,
    gaps ms)`; `marks[label]` = (when the long prompt arrived, when its first token came)."""
    plt = _pyplot()
    fig, axes = plt.subplots(len(series), 1, figsize=(8, 2.4 * len(series)), sharey=True,
                             squeeze=False)
    for ax, (label, (ts, gaps)) in zip(axes[:, 0], series.items()):
        ax.scatter(ts, gaps, s=4)
        if label in marks:
            arrived, first = marks[label]
            ax.axvline(arrived, color="tab:red", linestyle="--", label="long prompt arrives")
            ax.axvline(first, color="tab:green", linestyle=":", label="its first token")
            ax.legend(loc="upper right", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("ITL (ms)")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("time since the streams started (s)")
    fig.suptitle(title)
    return _save(fig, out_dir, name)

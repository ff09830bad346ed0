"""A benchmarked server's processes by role, and what each uses (RSS, CPU seconds).

radixlm's children name themselves (`process_utils.set_process_name`): radixlm-sched,
radixlm-tpN, radixlm-detok; the process a benchmark started is the API process (for
llama-server, the whole server). Keys are roles; a role held by several processes (a
second unnamed child) gets its pid appended.
"""

from __future__ import annotations

from typing import Any

_ROLES = {"radixlm-sched": "scheduler", "radixlm-detok": "detokenizer"}


def server_processes(pid: int) -> dict[str, Any]:
    """role -> psutil.Process for `pid` and its descendants ({} if `pid` is gone)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return {}
    out: dict[str, Any] = {}
    for p in procs:
        try:
            name = p.name()
        except psutil.Error:
            continue
        if p.pid == pid:
            role = "api" if name.startswith("python") else name
        elif name.startswith("radixlm-tp"):
            role = name.removeprefix("radixlm-")
        else:
            role = _ROLES.get(name, "resource_tracker" if name.startswith("python") else name)
        out[role if role not in out else f"{role}[{p.pid}]"] = p
    return out


def rss_mib(procs: dict[str, Any]) -> dict[str, float]:
    import psutil

    out = {}
    for role, p in procs.items():
        try:
            out[role] = p.memory_info().rss / 2**20
        except psutil.Error:
            continue
    return out


def cpu_seconds(procs: dict[str, Any]) -> dict[str, float]:
    """User + system CPU seconds each process has used so far (its threads together)."""
    import psutil

    out = {}
    for role, p in procs.items():
        try:
            t = p.cpu_times()
            out[role] = t.user + t.system
        except psutil.Error:
            continue
    return out


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds each process used between two `cpu_seconds` readings."""
    return {role: round(after[role] - before.get(role, 0.0), 3) for role in after}


def cpu_ms_per_token(cpu_s: dict[str, float], tokens: int) -> dict[str, float]:
    """CPU milliseconds per generated token of each process (`cpu_delta`'s over a run that
    generated `tokens`): what the HTTP path costs next to the forward ({} for no tokens)."""
    if tokens <= 0:
        return {}
    return {role: round(1000.0 * s / tokens, 4) for role, s in cpu_s.items()}

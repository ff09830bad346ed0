"""Server processes in the e2e tests: a free port, waiting until a started server is
healthy, stopping it, and process-tree checks (which processes it started, whether any
outlives it, read from /proc; zombies count as gone)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable

import httpx
import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(proc: subprocess.Popen, url: str, timeout_s: float,
                 log_tail: Callable[[], str], poll_s: float = 0.3) -> None:
    """Poll `url`/health until it answers 200; fail the test (with the server's log tail)
    if the process exits first or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode} during start-up:\n{log_tail()}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"server not healthy after {timeout_s} s:\n{log_tail()}")
        time.sleep(poll_s)


def _stat(pid: str) -> tuple[str, int] | None:
    """(state, ppid) of a process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces, so split after the last ')'.
    state, ppid = stat.rsplit(")", 1)[1].split()[:2]
    return state, int(ppid)


def children(pid: int) -> list[int]:
    """Live direct children of `pid`."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(entry)) is not None:
            state, ppid = st
            if ppid == pid and state != "Z":
                out.append(int(entry))
    return out


def descendants(pid: int) -> set[int]:
    """Live descendants of `pid`, at any depth."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(entry)) is not None and st[0] != "Z":
            tree.setdefault(st[1], []).append(int(entry))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    st = _stat(str(pid))
    return st is not None and st[0] != "Z"


def comm(pid: int) -> str:
    """A process's name (Linux's comm, as set_process_name sets it); '' once it is gone."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def terminate_tree(proc: subprocess.Popen, started: set[int], term_wait_s: float = 30,
                   reap_wait_s: float = 15) -> tuple[bool, list[int]]:
    """SIGTERM `proc` (SIGKILL if it has not exited after `term_wait_s`), then wait up to
    `reap_wait_s` for the processes it started (`started`, taken while it ran) to exit.
    Returns whether it obeyed SIGTERM and the started pids still alive."""
    obeyed = True
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=term_wait_s)
        except subprocess.TimeoutExpired:
            obeyed = False
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + reap_wait_s
    while any(alive(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.2)
    return obeyed, [p for p in started if alive(p)]

"""Process-tree checks for the e2e tests: which processes a server started, and whether
any of them outlives it. Read from /proc; zombies count as gone."""

from __future__ import annotations

import os


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


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""

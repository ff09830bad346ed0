"""Helpers for child processes: die with the parent, signals, a process name, logging.

Signals: the children of an instance ignore SIGTERM/SIGINT (a signal to the whole group
is the API process's to handle: it drains). Scheduler rank 0 takes STOP_SIGNAL as "stop
at the next loop iteration" (`StopFlag`), and tells the other TP ranks so; they ignore
STOP_SIGNAL too (`leave_shutdown_to_rank0`), so that none dies before that word comes.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send this process `sig` (default SIGKILL) when its parent dies (no
    orphans); a process that must clean up first asks for a signal it handles."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            PR_SET_PDEATHSIG = 1
            libc.prctl(PR_SET_PDEATHSIG, sig)
        except OSError:
            pass


# The launcher stops its children with this signal (default action: terminate), since
# they ignore SIGTERM and SIGINT (leave_shutdown_to_parent).
STOP_SIGNAL = signal.SIGUSR1


def _parent_decides(signum: int, frame: object) -> None:
    """SIGTERM/SIGINT in a child: nothing (a handler, not SIG_IGN, so that processes the
    child starts do not inherit the disposition)."""


def leave_shutdown_to_parent() -> None:
    """Ignore SIGTERM and SIGINT in a child process: a signal sent to the whole process
    group (Ctrl-C, systemd's KillMode=control-group) must not kill it while the parent
    drains; the parent stops it afterwards with STOP_SIGNAL (stop_child)."""
    signal.signal(signal.SIGTERM, _parent_decides)
    signal.signal(signal.SIGINT, _parent_decides)
    signal.signal(STOP_SIGNAL, signal.SIG_DFL)


class StopFlag:
    """Set by STOP_SIGNAL in scheduler rank 0 (`stop_on_signal`): its loop ends at the next
    iteration, broadcasting the stop to the other TP ranks (scheduler_loop.StepInputs)."""

    def __init__(self) -> None:
        self.requested = False

    def _set(self, signum: int, frame: object) -> None:
        self.requested = True


def stop_on_signal() -> StopFlag:
    """In scheduler rank 0, after leave_shutdown_to_parent: STOP_SIGNAL sets the flag."""
    flag = StopFlag()
    signal.signal(STOP_SIGNAL, flag._set)
    return flag


def signal_wakeup_fd() -> int:
    """The read end of a pipe that turns readable whenever a signal with a Python handler
    arrives (`signal.set_wakeup_fd`; main thread only): a poll that also waits on it ends
    at once on STOP_SIGNAL instead of at its timeout. Empty it with `drain_fd`."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w)
    return r


def drain_fd(fd: int) -> None:
    """Read a non-blocking fd until it is empty."""
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def leave_shutdown_to_rank0() -> None:
    """A TP rank other than 0: SIGTERM, SIGINT and STOP_SIGNAL are all left to rank 0,
    whose loop stops them (a stop broadcast) or whose death fails their next collective;
    a launcher that must stop one at once uses SIGKILL."""
    leave_shutdown_to_parent()
    signal.signal(STOP_SIGNAL, _parent_decides)


def stop_child(pid: int) -> None:
    """Ask a child that called leave_shutdown_to_parent to exit now."""
    try:
        os.kill(pid, STOP_SIGNAL)
    except ProcessLookupError:
        pass


def set_process_name(name: str) -> None:
    """Name this process (Linux's comm, at most 15 bytes: what `ps -o comm`, `top` and
    psutil's name() show), so that tools tell the server's processes apart: their command
    lines are all multiprocessing's spawn line."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            PR_SET_NAME = 15
            libc.prctl(PR_SET_NAME, name.encode()[:15])
        except OSError:
            pass


def setup_logging(level: str, name: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper()),
                        format=f"[%(asctime)s {name} pid={os.getpid()}] %(levelname)s %(message)s",
                        datefmt="%H:%M:%S", force=True)

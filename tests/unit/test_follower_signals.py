"""Signals of tensor-parallel ranks (runtime/process_utils.py, runtime/tp_ranks.py): a rank
other than 0 survives SIGTERM, SIGINT and the launcher's STOP_SIGNAL (rank 0 stops it);
rank 0's STOP_SIGNAL only sets its stop flag; a follower node's process takes the first
SIGTERM/SIGINT as a note and kills its ranks on the second."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import time
from dataclasses import dataclass

from radixlm.runtime.process_utils import STOP_SIGNAL, leave_shutdown_to_rank0, stop_on_signal
from radixlm.runtime.tp_ranks import FollowerSignals


def _follower_rank(ready) -> None:
    leave_shutdown_to_rank0()
    ready.set()
    time.sleep(60)


def _wait_dead(p: mp.Process, timeout_s: float = 10.0) -> None:
    p.join(timeout_s)
    assert not p.is_alive()


def test_a_follower_rank_leaves_every_stop_to_rank0() -> None:
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    p = ctx.Process(target=_follower_rank, args=(ready,), daemon=True)
    p.start()
    try:
        assert ready.wait(60)
        for sig in (signal.SIGTERM, signal.SIGINT, STOP_SIGNAL):
            os.kill(p.pid, sig)
        time.sleep(0.5)
        assert p.is_alive()
    finally:
        p.kill()
    _wait_dead(p)
    assert p.exitcode == -signal.SIGKILL


def test_rank0_stop_signal_sets_the_flag() -> None:
    before = signal.getsignal(STOP_SIGNAL)
    try:
        flag = stop_on_signal()
        assert not flag.requested
        os.kill(os.getpid(), STOP_SIGNAL)
        time.sleep(0.05)  # the handler runs between two bytecodes of this thread
        assert flag.requested
    finally:
        signal.signal(STOP_SIGNAL, before)


@dataclass
class _Rank:
    """What FollowerSignals reads of a multiprocessing.Process."""
    proc: subprocess.Popen

    @property
    def pid(self) -> int:
        return self.proc.pid

    def is_alive(self) -> bool:
        return self.proc.poll() is None


def test_follower_node_first_signal_is_a_note_second_stops_the_ranks() -> None:
    ranks = [_Rank(subprocess.Popen(["sleep", "60"])) for _ in range(2)]
    try:
        signals = FollowerSignals(ranks, node_rank=1)  # type: ignore[arg-type]
        signals.handle(signal.SIGTERM, None)
        time.sleep(0.2)
        assert all(r.is_alive() for r in ranks)
        signals.handle(signal.SIGINT, None)
        assert [r.proc.wait(10) for r in ranks] == [-signal.SIGKILL] * 2
    finally:
        for r in ranks:
            if r.is_alive():
                r.proc.kill()

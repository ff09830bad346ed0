"""Signals of tensor-parallel ranks (runtime/process_utils.py, runtime/tp_ranks.py): a rank
other than 0 survives SIGTERM, SIGINT and the launcher's STOP_SIGNAL (rank 0 stops it);
rank 0's STOP_SIGNAL only sets its stop flag; a follower node's process takes the first
SIGTERM/SIGINT as a note and kills its ranks on the second, and STOP_SIGNAL (Ray's
TPNodeRanks going away) as "stop now": a real `radixlm serve --node-rank 1` tree exits 0
at once with no rank left."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from radixlm.runtime.process_utils import STOP_SIGNAL, leave_shutdown_to_rank0, stop_on_signal
from radixlm.runtime.tp_ranks import FollowerSignals
from tests.process_tree import alive, descendants, free_port


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


def test_follower_node_obeys_the_stop_signal_at_once(tiny_llama_dir: str) -> None:
    """Node 1 alone: its rank waits for rank 0 at the rendezvous (which never comes). A
    SIGTERM is a note; STOP_SIGNAL stops the tree at once, exit 0."""
    cmd = [sys.executable, "-m", "radixlm", "serve", "--model", tiny_llama_dir, "--device",
           "cpu", "--num-threads", "1", "--tp-size", "2", "--nnodes", "2", "--node-rank", "1",
           "--dist-init-addr", f"127.0.0.1:{free_port()}"]
    log = tempfile.TemporaryFile("w+")
    node1 = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    ranks: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while not (ranks := descendants(node1.pid)) and time.monotonic() < deadline:
            assert node1.poll() is None, "node 1 exited during start-up"
            time.sleep(0.2)
        assert ranks, "node 1 started no rank"
        time.sleep(1.0)  # the rank is on its way to the rendezvous
        os.kill(node1.pid, signal.SIGTERM)
        time.sleep(1.0)
        assert node1.poll() is None and all(alive(p) for p in ranks)
        t0 = time.monotonic()
        os.kill(node1.pid, STOP_SIGNAL)
        rc = node1.wait(10)
        took = time.monotonic() - t0
        log.seek(0)
        assert rc == 0, log.read()[-3000:]
        assert took < 5, f"node 1 took {took:.1f} s to stop"
        deadline = time.monotonic() + 5
        while any(alive(p) for p in ranks) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in ranks if alive(p)], "ranks left behind"
    finally:
        if node1.poll() is None:
            os.killpg(node1.pid, signal.SIGKILL)
            node1.wait()
        for pid in ranks:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)

"""tests/server_harness.started_together: the context managers are entered at the same
time (each waits for the other at a barrier: entered one after the other they would
time out), exited in reverse order, and a failed start stops the ones that started."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.server_harness import started_together


@contextmanager
def fake_server(name: str, barrier: threading.Barrier, log: list[str],
                fail: bool = False) -> Iterator[str]:
    barrier.wait(timeout=10)  # BrokenBarrierError unless the other enters meanwhile
    if fail:
        raise RuntimeError(f"{name} did not start")
    log.append(f"enter {name}")
    try:
        yield name
    finally:
        log.append(f"exit {name}")


def test_entered_at_once_and_exited_in_reverse_order() -> None:
    barrier, log = threading.Barrier(2), []
    with started_together(fake_server("a", barrier, log), fake_server("b", barrier, log)) as got:
        assert got == ["a", "b"]
        assert sorted(log) == ["enter a", "enter b"]
    assert log[2:] == ["exit b", "exit a"]


def test_a_failed_start_stops_the_others_and_raises() -> None:
    barrier, log = threading.Barrier(2), []
    with pytest.raises(RuntimeError, match="b did not start"):
        with started_together(fake_server("a", barrier, log),
                              fake_server("b", barrier, log, fail=True)):
            pytest.fail("the body must not run")
    assert log == ["enter a", "exit a"]

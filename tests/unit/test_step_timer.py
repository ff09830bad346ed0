"""StepTimer: forward time and the bubble on the host clock (CPU) and the device clock
(CUDA timing events, faked here), with the idle rule: a gap after mark_idle is no bubble."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from radixlm.executor import step_timer
from radixlm.executor.forward_worker import StepTimer as ReExported
from radixlm.executor.step_timer import StepTimer


@dataclass
class FakeEvent:
    """A complete timing event at `ms` on the device clock."""
    ms: float

    def elapsed_time(self, end: "FakeEvent") -> float:
        return end.ms - self.ms


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    c = FakeClock()
    monkeypatch.setattr(step_timer.time, "perf_counter", c)
    return c


def test_host_clock_counts_gaps_between_forwards_unless_idle(clock):
    t = StepTimer()

    def forward(start: float, end: float) -> None:
        clock.now = start
        s = t.forward_started()
        clock.now = end
        t.forward_ended(s)

    forward(0.0, 1.0)  # the first forward: no gap before it
    forward(1.5, 2.0)  # 0.5 s bubble
    t.mark_idle()
    forward(10.0, 11.0)  # after idle: not bubble
    forward(11.25, 12.0)  # 0.25 s bubble
    assert t.forwards == 4
    assert t.forward_s == pytest.approx(1.0 + 0.5 + 1.0 + 0.75)
    assert t.bubble_s == pytest.approx(0.75)
    assert t.bubble_share == pytest.approx(0.75 / (3.25 + 0.75))


def test_device_clock_counts_gaps_between_tasks_unless_idle_at_launch():
    t = StepTimer()
    # Launches capture the idle rule; results are read a step late, in launch order.
    g1 = t.launched()
    g2 = t.launched()
    assert (g1, g2) == (False, True)  # nothing precedes the first launch
    t.device_task_done(FakeEvent(0.0), FakeEvent(10.0), g1)
    t.device_task_done(FakeEvent(12.0), FakeEvent(20.0), g2)  # 2 ms bubble
    t.mark_idle()
    g3 = t.launched()
    g4 = t.launched()
    assert (g3, g4) == (False, True)
    t.device_task_done(FakeEvent(100.0), FakeEvent(110.0), g3)  # 80 ms idle: not bubble
    t.device_task_done(FakeEvent(111.0), FakeEvent(115.0), g4)  # 1 ms bubble
    assert t.forwards == 4
    assert t.forward_s == pytest.approx((10 + 8 + 10 + 4) / 1000)
    assert t.bubble_s == pytest.approx(3 / 1000)
    assert t.last_end is None  # the host clock was never used


def test_device_clock_idle_while_a_task_is_in_flight_applies_to_the_next_launch():
    t = StepTimer()
    g1 = t.launched()
    t.device_task_done(FakeEvent(0.0), FakeEvent(1.0), g1)
    g2 = t.launched()  # in flight ...
    t.mark_idle()  # ... when the scheduler found nothing else to do
    t.device_task_done(FakeEvent(3.0), FakeEvent(4.0), g2)  # launched while busy: counts
    g3 = t.launched()
    t.device_task_done(FakeEvent(50.0), FakeEvent(51.0), g3)  # after the idle: does not
    assert (g1, g2, g3) == (False, True, False)
    assert t.bubble_s == pytest.approx(2 / 1000)


def test_device_clock_never_counts_a_negative_gap():
    t = StepTimer()
    t.launched()
    t.device_task_done(FakeEvent(0.0), FakeEvent(5.0), False)
    t.device_task_done(FakeEvent(4.999), FakeEvent(6.0), t.launched())
    assert t.bubble_s == 0.0


def test_as_dict_keys_are_stable_and_the_timer_is_reexported():
    assert ReExported is StepTimer  # radixlm bench overlap imports it from forward_worker
    assert list(StepTimer().as_dict()) == ["forwards", "forward_s", "decode_forwards",
                                           "decode_forward_s", "bubble_s", "schedule_s",
                                           "bubble_share", "oom_splits", "oom_failures"]

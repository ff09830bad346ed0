"""Streams of the forward worker: how a batch's inputs reach the device and its sampled
tokens come back, without the scheduler thread ever waiting for a running forward.

More: docs/executor.md, "executor/cuda_streams.py".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from radixlm.executor.step_timer import StepTimer

# A staged item: a tensor, a dataclass whose tensor fields are staged (not recursively),
# or None.
Item = Any


@dataclass
class CudaTaskSync:
    """The events of one task on CUDA."""
    inputs_ready: torch.cuda.Event  # copy stream: the task's uploads are done
    pools_ready: torch.cuda.Event  # scheduler stream: its writes for the task are done
    gap_counts: bool  # StepTimer.launched(): the device gap before this task is bubble
    started: torch.cuda.Event  # forward stream, timing: the task starts
    ended: torch.cuda.Event  # forward stream, timing: the task's results are on the host
    decode: bool = False  # a decode batch (set by `running`): StepTimer's decode counts


class ForwardStreams(Protocol):
    # Build the SamplingBatchInfo at launch, as host tensors staged with the batch (the
    # penalty counts are attached on the forward thread), instead of on the forward thread.
    sampling_info_at_launch: bool

    def stage(self, items: list[Item], gap_counts: bool) -> tuple[list[Item], Any]:
        """Scheduler thread, at launch: `items` with their host tensors on the device, and
        the task's sync token (for `running` / `finish`)."""

    def running(self, sync: Any, timer: StepTimer, decode: bool) -> Any:
        """Forward thread: a context that runs the task's device work in order after its
        inputs, and times it (`decode`: a decode batch, also counted as one)."""

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        """Inside `running`: `t` on the host once `finish` returned."""

    def finish(self, sync: Any, timer: StepTimer) -> None:
        """Scheduler thread, after the task returned: wait until its results are on the
        host; account its device time."""


class HostStreams:
    """The CPU: a passthrough, timed on the host clock."""
    sampling_info_at_launch = False

    def stage(self, items: list[Item], gap_counts: bool) -> tuple[list[Item], None]:
        return items, None

    @contextmanager
    def running(self, sync: None, timer: StepTimer, decode: bool) -> Iterator[None]:
        started = timer.forward_started()
        try:
            yield
        finally:
            timer.forward_ended(started, decode)

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def finish(self, sync: None, timer: StepTimer) -> None:
        return None


class CudaStreams:
    """A forward stream and a copy stream on `device`, with events (module docstring)."""
    sampling_info_at_launch = True

    def __init__(self, device: torch.device) -> None:
        index = device.index if device.index is not None else torch.cuda.current_device()
        self.device = torch.device("cuda", index)
        # Pool streams are created non-blocking: they never wait for the legacy default
        # stream the scheduler thread uses, nor it for them.
        self.forward = torch.cuda.Stream(self.device)
        self.copy = torch.cuda.Stream(self.device)

    def stage(self, items: list[Item], gap_counts: bool) -> tuple[list[Item], CudaTaskSync]:
        # By identity: a tensor held twice is uploaded once and stays one tensor.
        unique = {id(t): t for item in items for t in _tensors_of(item)}
        host = [t for t in unique.values() if t.device.type == "cpu"]
        groups = pack(host, pin=True)
        with torch.cuda.stream(self.copy):
            buffers = [g.buffer.to(self.device, non_blocking=True) for g in groups]
            inputs_ready = torch.cuda.Event()
            inputs_ready.record(self.copy)
        for b in buffers:
            b.record_stream(self.forward)  # allocated on the copy stream, read on forward
        moved = {id(t): d for t, d in zip(host, unpack(groups, buffers))}
        for key, t in unique.items():
            if t.device.type != "cpu":
                t.record_stream(self.forward)  # made on the scheduler stream
                moved[key] = t
        pools_ready = torch.cuda.Event()
        pools_ready.record(torch.cuda.current_stream(self.device))
        sync = CudaTaskSync(inputs_ready=inputs_ready, pools_ready=pools_ready,
                            gap_counts=gap_counts,
                            started=torch.cuda.Event(enable_timing=True),
                            ended=torch.cuda.Event(enable_timing=True))
        return [_with_tensors(item, moved) for item in items], sync

    @contextmanager
    def running(self, sync: CudaTaskSync, timer: StepTimer, decode: bool) -> Iterator[None]:
        # The current device is per thread; the forward thread starts on cuda:0.
        sync.decode = decode
        with torch.cuda.device(self.device), torch.cuda.stream(self.forward):
            self.forward.wait_event(sync.inputs_ready)
            self.forward.wait_event(sync.pools_ready)
            sync.started.record(self.forward)
            try:
                yield
            finally:
                sync.ended.record(self.forward)

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)  # on the forward stream; `ended` follows it
        return host

    def finish(self, sync: CudaTaskSync, timer: StepTimer) -> None:
        sync.ended.synchronize()
        timer.device_task_done(sync.started, sync.ended, sync.gap_counts, sync.decode)


def make_streams(device: torch.device) -> HostStreams | CudaStreams:
    return CudaStreams(device) if device.type == "cuda" else HostStreams()


# --- packing: one buffer (one copy) per dtype -----------------------------------------------

@dataclass
class PackedGroup:
    """Tensors of one dtype laid back to back in `buffer` (1-D), in `members` order."""
    buffer: torch.Tensor
    members: list[int]  # their positions in the list given to `pack`
    shapes: list[torch.Size]


def pack(tensors: list[torch.Tensor], pin: bool) -> list[PackedGroup]:
    """Group host tensors by dtype; each group is copied into one fresh (pinned) buffer."""
    by_dtype: dict[torch.dtype, list[int]] = {}
    for i, t in enumerate(tensors):
        by_dtype.setdefault(t.dtype, []).append(i)
    groups = []
    for dtype, members in by_dtype.items():
        flat = [tensors[i].reshape(-1) for i in members]
        buffer = torch.empty(sum(f.numel() for f in flat), dtype=dtype, pin_memory=pin)
        torch.cat(flat, out=buffer)
        groups.append(PackedGroup(buffer, members, [tensors[i].shape for i in members]))
    return groups


def unpack(groups: list[PackedGroup], buffers: list[torch.Tensor]) -> list[torch.Tensor]:
    """Views of `buffers` (the groups' buffers, copied anywhere) shaped as the tensors
    given to `pack`, in that order."""
    out: dict[int, torch.Tensor] = {}
    for g, buffer in zip(groups, buffers):
        sizes = [math.prod(s) for s in g.shapes]
        for i, part, shape in zip(g.members, buffer.split(sizes), g.shapes):
            out[i] = part.view(shape)
    return [out[i] for i in range(len(out))]


def _tensors_of(item: Item) -> list[torch.Tensor]:
    if item is None:
        return []
    if isinstance(item, torch.Tensor):
        return [item]
    return [v for f in dataclasses.fields(item)
            if isinstance(v := getattr(item, f.name), torch.Tensor)]


def _with_tensors(item: Item, moved: dict[int, torch.Tensor]) -> Item:
    if item is None:
        return None
    if isinstance(item, torch.Tensor):
        return moved[id(item)]
    return dataclasses.replace(item, **{
        f.name: moved[id(v)] for f in dataclasses.fields(item)
        if isinstance(v := getattr(item, f.name), torch.Tensor)})

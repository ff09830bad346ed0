"""The forward worker's streams (executor/cuda_streams.py): the CPU passthrough, the packing
of a task's host tensors into one buffer per dtype, and (on a GPU only) the CUDA staging:
uploads, record_stream, the forward stream, pinned results and event timing."""

from __future__ import annotations

import pytest
import torch

from radixlm.executor.cuda_streams import (CudaStreams, HostStreams, _tensors_of, _with_tensors,
                                           make_streams, pack, unpack)
from radixlm.forward_batch import ForwardBatch, ForwardMode
from radixlm.executor.step_timer import StepTimer

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def small_batch(device: str = "cpu") -> ForwardBatch:
    i64 = dict(dtype=torch.int64)
    return ForwardBatch(
        forward_mode=ForwardMode.EXTEND, batch_size=2,
        input_ids=torch.tensor([5, 6, 7, 0], **i64), positions=torch.tensor([0, 1, 2, 3], **i64),
        req_pool_indices=torch.tensor([3, 1], **i64), seq_lens=torch.tensor([3, 4], **i64),
        out_cache_loc=torch.tensor([11, 12, 13, 14], device=device, **i64),
        logits_indices=torch.tensor([2, 3], **i64), seq_lens_cpu=[3, 4],
        extend_prefix_lens_cpu=[0, 3], extend_seq_lens_cpu=[3, 1],
        future_token_idx=torch.tensor([3], **i64), future_token_rows=torch.tensor([1], **i64))


# --- CPU: a passthrough ------------------------------------------------------------------

def test_cpu_streams_are_a_passthrough():
    streams = make_streams(torch.device("cpu"))
    assert isinstance(streams, HostStreams) and not streams.sampling_info_at_launch
    fb, keep = small_batch(), torch.tensor([1])
    items = [fb, None, keep]
    staged, sync = streams.stage(items, gap_counts=True)
    assert staged is items and sync is None  # no copy of anything
    ids = torch.tensor([4, 2])
    assert streams.to_host(ids) is ids
    streams.finish(sync, StepTimer())  # nothing to wait for


def test_cpu_streams_time_the_task_on_the_host_clock_even_when_it_raises():
    streams, timer = HostStreams(), StepTimer()
    with streams.running(None, timer, True):
        pass
    with pytest.raises(RuntimeError):
        with streams.running(None, timer, False):
            raise RuntimeError("forward failed")
    assert timer.forwards == 2 and timer.last_end is not None
    # Decode batches are counted apart too (the mean decode step of /metrics).
    assert timer.decode_forwards == 1 and 0 < timer.decode_forward_s <= timer.forward_s


# --- packing (pure tensor logic, checked on the CPU) ---------------------------------------

def test_pack_groups_by_dtype_and_unpack_restores_every_tensor():
    tensors = [torch.tensor([1, 2, 3]), torch.tensor([[0.5, 1.5]], dtype=torch.float32),
               torch.tensor([], dtype=torch.int64), torch.tensor(7), torch.arange(6).view(2, 3),
               torch.tensor([True, False]), torch.tensor([2.5], dtype=torch.float32)]
    groups = pack(tensors, pin=False)
    assert [g.buffer.dtype for g in groups] == [torch.int64, torch.float32, torch.bool]
    assert groups[0].buffer.tolist() == [1, 2, 3, 7, 0, 1, 2, 3, 4, 5]
    copies = [g.buffer.clone() for g in groups]  # stands in for the device copies
    out = unpack(groups, copies)
    assert len(out) == len(tensors)
    for a, b in zip(tensors, out):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    # The results are views of the copied buffers: one copy per dtype, nothing else.
    assert out[0].untyped_storage().data_ptr() == copies[0].untyped_storage().data_ptr()


def test_dataclass_tensor_fields_are_swapped_and_the_rest_kept():
    fb = small_batch()
    found = _tensors_of(fb)
    assert len(found) == 8  # every tensor field of an EXTEND batch with future tokens
    moved = {id(t): t + 100 for t in found}
    out = _with_tensors(fb, moved)
    assert out is not fb and out.input_ids.tolist() == [105, 106, 107, 100]
    assert out.seq_lens_cpu is fb.seq_lens_cpu and out.forward_mode is fb.forward_mode
    assert fb.input_ids.tolist() == [5, 6, 7, 0]  # the scheduler's host batch is untouched
    assert _tensors_of(None) == [] and _with_tensors(None, moved) is None


# --- CUDA (runs on the GPU machine only) ----------------------------------------------------

@requires_cuda
@torch.inference_mode()
def test_cuda_stage_uploads_host_tensors_and_keeps_device_ones():
    streams = CudaStreams(torch.device("cuda"))
    assert streams.sampling_info_at_launch
    fb, keep = small_batch(device="cuda"), torch.tensor([1])
    (dfb, none, dkeep, same), sync = streams.stage([fb, None, keep, keep], gap_counts=True)
    assert none is None and same is dkeep  # a tensor given twice is uploaded once
    assert dfb.out_cache_loc is fb.out_cache_loc  # already on the device: not copied
    for name in ("input_ids", "positions", "req_pool_indices", "seq_lens", "logits_indices",
                 "future_token_idx", "future_token_rows"):
        host, dev = getattr(fb, name), getattr(dfb, name)
        assert host.device.type == "cpu" and dev.is_cuda, name
    timer = StepTimer()
    with streams.running(sync, timer, True):
        assert torch.cuda.current_stream() == streams.forward
        # What a task reads on the forward stream after its waits: the uploaded values.
        got = streams.to_host(torch.cat([dfb.input_ids, dfb.positions, dfb.seq_lens, dkeep]))
    assert torch.cuda.current_stream() != streams.forward  # restored
    streams.finish(sync, timer)
    assert got.device.type == "cpu" and got.is_pinned()
    assert got.tolist() == [5, 6, 7, 0, 0, 1, 2, 3, 3, 4, 1]
    assert timer.forwards == 1 and timer.forward_s >= 0.0 and timer.last_end is None


@requires_cuda
@torch.inference_mode()
def test_cuda_forward_stream_waits_for_the_scheduler_streams_writes():
    """A write the scheduler stream queues before the launch (as req_to_token writes are)
    is seen by the task, even when the scheduler stream is held up on the device."""
    streams = CudaStreams(torch.device("cuda"))
    table = torch.zeros(4, dtype=torch.int64, device="cuda")
    torch.cuda._sleep(50_000_000)  # the scheduler stream is busy for a while ...
    table[2] = 42  # ... then writes
    (idx,), sync = streams.stage([torch.tensor([2])], gap_counts=False)
    timer = StepTimer()
    with streams.running(sync, timer, True):
        got = streams.to_host(table[idx])
    streams.finish(sync, timer)
    assert got.tolist() == [42]

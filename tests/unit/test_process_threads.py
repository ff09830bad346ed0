"""Thread counts by process role (radixlm/runtime/process_threads.py), with psutil and the CPU
affinity patched: nothing here depends on the machine's cores."""

from __future__ import annotations

import os
import sys
import types

import pytest
import torch

from radixlm.runtime import process_threads as pt
from radixlm.config import ServerArgs


@pytest.fixture
def cores(monkeypatch):
    """cores(physical, affinity): psutil reports `physical` physical cores (None: cannot
    tell), the affinity mask holds `affinity` CPUs (None: no sched_getaffinity)."""
    def set_cores(physical: int | None, affinity: int | None, logical: int = 64) -> None:
        def cpu_count(logical_cpus: bool = True) -> int | None:
            return logical if logical_cpus else physical

        fake = types.SimpleNamespace(cpu_count=lambda logical=True: cpu_count(logical))
        monkeypatch.setitem(sys.modules, "psutil", fake)
        monkeypatch.setattr(os, "cpu_count", lambda: logical)
        if affinity is None:
            monkeypatch.delattr(os, "sched_getaffinity", raising=False)
        else:
            monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(affinity)),
                                raising=False)
    return set_cores


@pytest.fixture
def restore_torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_physical_cores_bounded_by_affinity(cores):
    cores(8, 16)
    assert pt.physical_cores() == 8  # 16 logical CPUs allowed, 8 physical cores
    cores(8, 3)
    assert pt.physical_cores() == 3  # taskset -c 0-2
    cores(8, None)
    assert pt.physical_cores() == 8  # no affinity API: psutil alone
    cores(None, 6, logical=12)
    assert pt.physical_cores() == 6  # psutil cannot tell: os.cpu_count(), bounded
    cores(None, None, logical=12)
    assert pt.physical_cores() == 12


def test_compute_threads_default_explicit_and_tensor_parallel(cores):
    cores(8, 16)
    assert pt.compute_threads(ServerArgs()) == 8
    assert pt.compute_threads(ServerArgs(num_threads=3)) == 3
    # CPU tensor parallelism: this host's ranks share the cores, one at least each.
    assert pt.compute_threads(ServerArgs(device="cpu", tp_size=2)) == 4
    assert pt.compute_threads(ServerArgs(device="cpu", tp_size=4, nnodes=2)) == 4
    assert pt.compute_threads(ServerArgs(device="cpu", tp_size=16)) == 1
    assert pt.compute_threads(ServerArgs(device="cpu", tp_size=2, num_threads=6)) == 6
    # On CUDA each rank drives its own GPU: no sharing out.
    assert pt.compute_threads(ServerArgs(device="cuda", tp_size=2)) == 8
    with pytest.raises(ValueError, match="--num-threads"):
        pt.compute_threads(ServerArgs(num_threads=0))


def test_setup_compute_threads(cores, monkeypatch, restore_torch_threads):
    cores(3, 16)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert pt.setup_compute_threads(ServerArgs()) == 3
    assert torch.get_num_threads() == 3
    # torch is loaded here, so the environment is left alone (too late for it).
    assert "OMP_NUM_THREADS" not in os.environ
    assert pt.setup_compute_threads(ServerArgs(num_threads=1), set_env=False) == 1
    assert torch.get_num_threads() == 1


def test_setup_helper_threads(restore_torch_threads):
    torch.set_num_threads(2)
    pt.setup_helper_threads()  # the inter-op pool may have started: no error either way
    assert torch.get_num_threads() == 1
    assert pt.current_torch_threads() == 1


def test_environment_set_before_torch_loads(tmp_path):
    """In a fresh process (as a spawned child is), OMP_NUM_THREADS is set before torch
    loads, and torch's pools follow."""
    import subprocess

    code = ("import os, sys\n"
            "from radixlm.config import ServerArgs\n"
            "from radixlm.runtime import process_threads as pt\n"
            "assert 'torch' not in sys.modules\n"
            "role = sys.argv[1]\n"
            "if role == 'helper':\n"
            "    pt.setup_helper_threads()\n"
            "    assert 'torch' not in sys.modules  # a helper may never need it\n"
            "    assert pt.current_torch_threads() == 1  # what /server_info reports\n"
            "else:\n"
            "    pt.setup_compute_threads(ServerArgs(num_threads=2))\n"
            "import torch\n"
            "print(os.environ['OMP_NUM_THREADS'], torch.get_num_threads(),"
            " torch.get_num_interop_threads())\n")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    out = {}
    for role in ("helper", "compute"):
        r = subprocess.run([sys.executable, "-c", code, role], capture_output=True, text=True,
                           env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        out[role] = r.stdout.split()
    # The helper's inter-op pool (started lazily, by work no helper submits) keeps
    # torch's default size.
    assert out["helper"][:2] == ["1", "1"]
    assert out["compute"][:2] == ["2", "2"]


def test_threads_read_while_another_thread_imports_torch():
    """The API process loads torch in a background thread (with xgrammar) while
    /server_info may ask for its thread count: a half-imported torch is not asked (it
    raised AttributeError, a 500)."""
    import subprocess

    # The asking thread sleeps between calls: a busy loop would keep the GIL for whole
    # switch intervals and stretch the import ~20x.
    code = ("import os, sys, threading, time\n"
            "from radixlm.runtime import process_threads as pt\n"
            "pt.setup_helper_threads()\n"
            "t = threading.Thread(target=lambda: __import__('torch'))\n"
            "t.start()\n"
            "seen = set()\n"
            "while t.is_alive():\n"
            "    seen.add(pt.current_torch_threads())\n"
            "    time.sleep(0.0002)\n"
            "t.join()\n"
            "print(sorted(seen), pt.current_torch_threads())\n")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["[1]", "1"]


def test_engine_keeps_the_callers_threads_unless_told(tiny_llama_dir, restore_torch_threads):
    from radixlm.engine import Engine

    torch.set_num_threads(1)
    Engine(tiny_llama_dir, max_total_tokens=256, max_running_requests=2)
    assert torch.get_num_threads() == 1  # a guest in the caller's process
    Engine(tiny_llama_dir, max_total_tokens=256, max_running_requests=2, num_threads=2)
    assert torch.get_num_threads() == 2

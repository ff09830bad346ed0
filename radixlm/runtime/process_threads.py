"""Thread counts by process role: the scheduler computes, the other processes help.

* compute (`setup_compute_process`): the scheduler process and each tensor-parallel rank
  run the model with torch's intra-op pool of `--num-threads` threads; default one per
  physical core available to the process, shared out among this host's TP ranks on the
  CPU. The offline Engine runs in the caller's process and sets the count only when
  `num_threads` is given (torch's own default is one thread per physical core too).
* helper (`setup_helper_threads`): the API (HTTP) process and the detokenizer run torch
  single-threaded (they tokenize and detokenize; an intra-op pool there would only take
  cores from the scheduler).

Each is called first thing in the process's entry function. Where torch is not loaded
yet (the spawned scheduler, TP rank and detokenizer processes) OMP_NUM_THREADS is set to
match first, which torch and other OpenMP libraries read at load.
"""

from __future__ import annotations

import logging
import os
import sys

from radixlm.config import ServerArgs
from radixlm.runtime.host_malloc import tune_host_malloc

logger = logging.getLogger(__name__)


def physical_cores() -> int:
    """Physical cores this process may run on: psutil's physical core count, at most the
    number of CPUs in the affinity mask (taskset, cgroup cpusets); os.cpu_count() when
    psutil cannot tell."""
    n: int | None = None
    try:
        import psutil

        n = psutil.cpu_count(logical=False)
    except Exception:  # psutil missing or unable to read the topology
        n = None
    if not n:
        n = os.cpu_count() or 1
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        allowed = 0
    if allowed:
        n = min(n, allowed)
    return max(1, n)


def _ranks_on_this_host(args: ServerArgs) -> int:
    """TP ranks sharing this host's cores: tp_size / nnodes on the CPU, else 1 (on CUDA
    each rank drives its own GPU and its CPU threads barely work)."""
    ranks = max(1, args.tp_size // max(1, args.nnodes))
    if ranks == 1 or args.device == "cuda":
        return 1
    if args.device == "auto":
        import torch

        if torch.cuda.is_available():
            return 1
    return ranks


def compute_threads(args: ServerArgs) -> int:
    """The intra-op thread count of a compute process for ServerArgs `args`."""
    if args.num_threads is not None:
        if args.num_threads < 1:
            raise ValueError(f"--num-threads must be >= 1, got {args.num_threads}")
        return args.num_threads
    return max(1, physical_cores() // _ranks_on_this_host(args))


def setup_compute_threads(args: ServerArgs, set_env: bool = True) -> int:
    """Scheduler process, TP rank (and an Engine given num_threads):
    torch.set_num_threads(compute_threads). `set_env=False` (the Engine, a guest in the
    caller's process) leaves os.environ alone."""
    n = compute_threads(args)
    if set_env and "torch" not in sys.modules:
        os.environ["OMP_NUM_THREADS"] = str(n)
    import torch

    torch.set_num_threads(n)
    logger.info("compute threads: %d (torch intra-op)", n)
    return n


def setup_compute_process(args: ServerArgs, guest: bool = False) -> None:
    """First thing in a compute process (scheduler, TP rank): its threads and the host
    allocator (radixlm/runtime/host_malloc.py). `guest`: the offline Engine in its caller's
    process, which keeps the caller's thread count unless `num_threads` is given and
    leaves os.environ alone."""
    if not guest or args.num_threads is not None:
        setup_compute_threads(args, set_env=not guest)
    tune_host_malloc()


def setup_helper_threads() -> None:
    """API and detokenizer processes: torch single-threaded. Where torch is not loaded
    yet, OMP_NUM_THREADS alone (torch's intra-op pool reads it when torch loads; its
    inter-op pool starts only for work these processes never submit): the detokenizer
    never needs torch, and importing it here would cost ~2 s of CPU at every start."""
    if "torch" not in sys.modules:
        os.environ["OMP_NUM_THREADS"] = "1"
        return
    import torch

    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # the inter-op pool has started already (or was set before)
        pass


def current_torch_threads() -> int | None:
    """This process's torch intra-op thread count; where torch is not loaded (a helper
    with a GGUF model's tokenizer), or is being loaded by another thread (the API
    process loads xgrammar, and torch with it, in the background), the count it loads
    with (OMP_NUM_THREADS, as the setup functions above set it); None when neither is
    known."""
    torch = sys.modules.get("torch")
    if torch is not None and not getattr(torch.__spec__, "_initializing", False):
        return torch.get_num_threads()
    env = os.environ.get("OMP_NUM_THREADS", "")
    return int(env) if env.isdigit() else None

"""`radixlm serve --dp-size N`: N engine instances on internal ports plus the router on
`--host/--port`, all on this host.

    this process: router (uvicorn)  --HTTP-->  instance i (child process dp<i>):
                                               API + scheduler + detokenizer, 127.0.0.1:<port i>

Each instance is a spawned child running the ordinary `launch_server` with `dp_size=1` and
a free port; it asks the kernel to kill it when this process dies, and its own children do
the same for it, so nothing outlives the parent. On a GPU host instance i sees only its
own --tp-size GPUs (CUDA_VISIBLE_DEVICES, set in the child before torch is imported: so
this module, which the spawned child imports to find its entry point, must not import
torch); on the CPU the instances split the host's available memory (`place_instances`).
"""

from __future__ import annotations

import glob
import logging
import multiprocessing as mp
import os
import re
import socket
import time
from dataclasses import dataclass

import httpx

from radixlm.config import ServerArgs

logger = logging.getLogger(__name__)


class DPLaunchError(RuntimeError):
    pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def visible_gpus() -> list[str]:
    """GPU ids the instances may use: CUDA_VISIBLE_DEVICES if set, else one per
    /dev/nvidia<N> device file (no CUDA initialisation, no torch import)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g for g in env.split(",") if g.strip()]
    ids = sorted(int(m.group(1)) for f in glob.glob("/dev/nvidia*")
                 if (m := re.fullmatch(r"/dev/nvidia(\d+)", f)))
    return [str(i) for i in ids]


def host_mem_available() -> int:
    """MemAvailable from /proc/meminfo, in bytes (0 if unreadable)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@dataclass(frozen=True)
class InstancePlacement:
    cuda_visible_devices: str | None  # None: leave the environment alone (CPU)
    device_memory: str | None  # None: the instance plans with the device's own figure


def place_instances(args: ServerArgs, gpus: list[str], mem_available: int) -> list[InstancePlacement]:
    """Where each of the dp_size instances runs, and its memory budget when instances
    share a device (each plans its pools from the memory it sees at start, so two
    starting side by side on one device would each plan for all of it).

    GPUs: instance i gets GPUs [i*tp, (i+1)*tp) of `gpus` (tp = --tp-size). Sharing GPUs
    (fewer than dp_size * tp) needs an explicit --device-memory per instance. CPU: the
    instances share the host, so unless --device-memory is given each gets
    MemAvailable / dp_size."""
    n, tp = args.dp_size, args.tp_size
    if gpus:
        if len(gpus) < n * tp and args.device_memory is None:
            raise DPLaunchError(
                f"--dp-size {n} x --tp-size {tp} needs {n * tp} GPUs, {len(gpus)} visible; "
                "to share GPUs give each instance its budget with --device-memory")
        return [InstancePlacement(",".join(gpus[(i * tp + j) % len(gpus)] for j in range(tp)),
                                  args.device_memory) for i in range(n)]
    if args.device_memory is not None or mem_available <= 0:
        return [InstancePlacement(None, args.device_memory)] * n
    share_mib = mem_available // n // 2**20
    return [InstancePlacement(None, f"{share_mib}MiB")] * n


def _run_instance(args: ServerArgs, rank: int, gpu: str | None) -> None:
    """Child process entry: one ordinary engine instance."""
    from radixlm.runtime.process_utils import die_with_parent, setup_logging

    die_with_parent()
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu  # before anything imports torch
    setup_logging(args.log_level, f"dp{rank}")
    from radixlm.runtime.fast_exit import exit_now
    from radixlm.server.launch import launch_server

    launch_server(args)
    exit_now(0)  # stopped cleanly: skip the slow interpreter teardown (fast_exit.py)


def start_instances(args: ServerArgs) -> tuple[list[mp.Process], list[str]]:
    """Spawn dp_size instances on free local ports; return them and their URLs."""
    ctx = mp.get_context("spawn")
    gpus = visible_gpus() if args.device != "cpu" else []
    placements = place_instances(args, gpus, host_mem_available())
    procs: list[mp.Process] = []
    urls: list[str] = []
    for rank, place in enumerate(placements):
        port = free_port()
        inst = args.replace(host="127.0.0.1", port=port, dp_size=1,
                            device_memory=place.device_memory)
        logger.info("instance dp%d: port %d, GPUs %s, memory budget %s", rank, port,
                    place.cuda_visible_devices or "none", place.device_memory or "the device's")
        # Not daemonic: an instance has children of its own (scheduler, detokenizer).
        p = ctx.Process(target=_run_instance, args=(inst, rank, place.cuda_visible_devices),
                        name=f"dp{rank}")
        p.start()
        procs.append(p)
        urls.append(f"http://127.0.0.1:{port}")
    return procs, urls


def wait_healthy(procs: list[mp.Process], urls: list[str], timeout_s: float = 1800.0) -> None:
    """Block until every instance answers /health with 200; raise if one exits first."""
    deadline = time.monotonic() + timeout_s
    pending = dict(zip(urls, procs))
    while pending:
        for url, p in list(pending.items()):
            if not p.is_alive():
                raise DPLaunchError(f"instance {p.name} ({url}) exited during start-up "
                                    f"(exit code {p.exitcode})")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    del pending[url]
                    logger.info("instance %s ready at %s", p.name, url)
            except httpx.HTTPError:
                pass
        if time.monotonic() > deadline:
            raise DPLaunchError(f"instances not ready after {timeout_s:.0f} s: "
                                f"{', '.join(pending)}")
        if pending:
            time.sleep(0.5)


def stop_instances(procs: list[mp.Process]) -> None:
    """SIGTERM (the instance stops its own children), then SIGKILL after 15 s."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=15)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)


def launch_dp(args: ServerArgs) -> None:
    from radixlm.router.config import RouterArgs
    from radixlm.router.launch import run_router

    procs: list[mp.Process] = []
    try:
        procs, urls = start_instances(args)
        logger.info("starting %d instances: %s", len(urls), ", ".join(urls))
        wait_healthy(procs, urls)
        run_router(RouterArgs(host=args.host, port=args.port, log_level=args.log_level,
                              api_key=args.api_key), urls)
    finally:
        stop_instances(procs)

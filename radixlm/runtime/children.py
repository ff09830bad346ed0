"""The server's child processes: spawn the scheduler (and this host's other TP ranks) and the
detokenizer, wait for SchedulerReady, stop them, watch for one dying.

Children are spawned (not forked), ask the kernel to kill them when their parent dies,
ignore SIGTERM/SIGINT (a signal to the whole group is the parent's to handle: it drains
first) and are stopped with SIGUSR1 on the way out (docs/request-path.md, "Processes")."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from dataclasses import dataclass

import zmq

from radixlm.config import ServerArgs
from radixlm.ipc import IpcEndpoints, loads, make_socket
from radixlm.messages import SchedulerFailed, SchedulerReady
from radixlm.runtime.detokenizer_process import run_detokenizer_process
from radixlm.runtime.process_utils import stop_child
from radixlm.runtime.scheduler_process import run_scheduler_process


class LaunchError(RuntimeError):
    pass


@dataclass
class Spawned:
    """Children started, not yet ready: `wait_ready` blocks until the scheduler says so."""

    procs: list[mp.Process]
    control: zmq.Socket


def spawn_children(args: ServerArgs, endpoints: IpcEndpoints) -> Spawned:
    """Spawn scheduler (+ detokenizer, --detokenizer-mode process; + this host's other TP
    ranks) and return at once: they load the model while the caller goes on."""
    ctx = mp.get_context("spawn")
    control = make_socket(zmq.Context.instance(), zmq.PULL, endpoints.control, bind=True)
    if args.tp_size > 1:  # every rank must get the same rendezvous address
        from radixlm.runtime.distributed import resolve_dist_init_addr
        args = resolve_dist_init_addr(args)
    procs = [ctx.Process(target=run_scheduler_process, args=(args, endpoints), name="scheduler", daemon=True)]
    if args.detokenizer_mode == "process":  # else the API process detokenizes
        procs.append(ctx.Process(target=run_detokenizer_process, args=(args, endpoints),
                                 name="detokenizer", daemon=True))
    try:
        for p in procs:
            p.start()
        if args.tp_size > 1:  # the scheduler above is TP rank 0; this host's other ranks
            from radixlm.runtime.tp_ranks import spawn_follower_ranks
            procs += spawn_follower_ranks(args, 1)
    except BaseException:
        stop_children(procs)
        control.close()
        raise
    return Spawned(procs, control)


def wait_ready(spawned: Spawned, timeout_s: float = 1800.0) -> SchedulerReady:
    """Block until the scheduler reports ready; on failure (its error, a child's death,
    the timeout, a signal) stop every child and raise."""
    procs, control = spawned.procs, spawned.control
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if control.poll(500):
                msg = loads(control.recv())
                if isinstance(msg, SchedulerFailed):
                    raise LaunchError(f"the scheduler could not start:\n{msg.error}")
                assert isinstance(msg, SchedulerReady)
                return msg
            dead = [p.name for p in procs if not p.is_alive()]
            if dead:
                raise LaunchError(f"child process exited during start-up: {', '.join(dead)}")
        raise LaunchError(f"the scheduler did not become ready in {timeout_s:.0f} s")
    except BaseException:
        stop_children(procs)
        raise
    finally:
        control.close()


def start_children(args: ServerArgs, endpoints: IpcEndpoints,
                   timeout_s: float = 1800.0) -> tuple[list[mp.Process], SchedulerReady]:
    """spawn_children, then wait_ready."""
    spawned = spawn_children(args, endpoints)
    return spawned.procs, wait_ready(spawned, timeout_s)


def stop_children(procs: list[mp.Process]) -> None:
    """Stop the children (they ignore SIGTERM/SIGINT: process_utils.leave_shutdown_to_parent)."""
    for p in procs:
        if p.is_alive() and p.pid is not None:
            stop_child(p.pid)
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()


def watch_children(procs: list[mp.Process], on_death, serving: threading.Event) -> None:
    """Thread: when a child dies while `serving` is set, call on_death once."""
    while serving.is_set():
        for p in procs:
            if not p.is_alive() and serving.is_set():
                on_death(p)
                return
        time.sleep(0.5)

"""Launch one engine instance: scheduler and detokenizer processes, then the HTTP server.

    API process (this one): FastAPI + uvicorn + TokenizerManager
      --ZMQ--> scheduler process --ZMQ--> detokenizer process --ZMQ--> API process

Children are spawned (not forked), ask the kernel to kill them when this process dies,
ignore SIGTERM/SIGINT (a signal to the whole group is this process's to handle: it
drains first) and are stopped with SIGUSR1 on the way out; if one dies while serving, the
server shuts down rather than leave requests hanging.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import threading
import time

import zmq

from radixlm.config import ServerArgs
from radixlm.ipc import IpcEndpoints, loads, make_socket
from radixlm.messages import SchedulerFailed, SchedulerReady
from radixlm.process_utils import stop_child
from radixlm.scheduler.process import run_scheduler_process
from radixlm.tokenizer.process import run_detokenizer_process

logger = logging.getLogger(__name__)


class LaunchError(RuntimeError):
    pass


def start_children(args: ServerArgs, endpoints: IpcEndpoints,
                   timeout_s: float = 1800.0) -> tuple[list[mp.Process], SchedulerReady]:
    """Spawn scheduler + detokenizer; block until the scheduler reports ready."""
    ctx = mp.get_context("spawn")
    zctx = zmq.Context.instance()
    control = make_socket(zctx, zmq.PULL, endpoints.control, bind=True)
    if args.tp_size > 1:  # every rank must get the same rendezvous address
        from radixlm.executor.distributed import resolve_dist_init_addr
        args = resolve_dist_init_addr(args)
    procs = [ctx.Process(target=run_scheduler_process, args=(args, endpoints), name="scheduler", daemon=True),
             ctx.Process(target=run_detokenizer_process, args=(args, endpoints), name="detokenizer", daemon=True)]
    for p in procs:
        p.start()
    if args.tp_size > 1:  # the scheduler above is TP rank 0; this host's other ranks
        from radixlm.scheduler.tp_ranks import spawn_follower_ranks
        procs += spawn_follower_ranks(args, 1)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if control.poll(500):
                msg = loads(control.recv())
                if isinstance(msg, SchedulerFailed):
                    raise LaunchError(f"the scheduler could not start:\n{msg.error}")
                assert isinstance(msg, SchedulerReady)
                return procs, msg
            dead = [p.name for p in procs if not p.is_alive()]
            if dead:
                raise LaunchError(f"child process exited during start-up: {', '.join(dead)}")
        raise LaunchError(f"the scheduler did not become ready in {timeout_s:.0f} s")
    except BaseException:
        stop_children(procs)
        raise
    finally:
        control.close()


def stop_children(procs: list[mp.Process]) -> None:
    """Stop the children (they ignore SIGTERM/SIGINT: process_utils.leave_shutdown_to_parent)."""
    for p in procs:
        if p.is_alive() and p.pid is not None:
            stop_child(p.pid)
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()


def _watch_children(procs: list[mp.Process], on_death, serving: threading.Event) -> None:
    """Thread: when a child dies while `serving` is set, call on_death once."""
    while serving.is_set():
        for p in procs:
            if not p.is_alive() and serving.is_set():
                on_death(p)
                return
        time.sleep(0.5)


def launch_server(args: ServerArgs) -> None:
    import asyncio

    import uvicorn

    from radixlm.process_threads import setup_helper_threads

    setup_helper_threads()  # the API process runs torch single-threaded
    from radixlm.models import resolve_model_path
    from radixlm.server.admission import AdmissionControl
    from radixlm.server.app import create_app
    from radixlm.server.drain import DrainingServer
    from radixlm.server.tokenizer_manager import TokenizerManager
    from radixlm.tokenizer.loader import load_tokenizer

    if args.node_rank > 0:  # another host of a multi-node TP model: scheduler ranks only
        from radixlm.scheduler.tp_ranks import run_follower_node
        return run_follower_node(args)
    model_path = resolve_model_path(args.model)
    endpoints = IpcEndpoints.create()
    t0 = time.perf_counter()
    procs: list[mp.Process] = []
    try:
        procs, ready = start_children(args, endpoints)
        tokenizer = load_tokenizer(model_path, args.tokenizer)
        logger.info("model ready in %.1f s: context %d tokens, KV pool %d tokens, %d running requests max",
                    time.perf_counter() - t0, ready.context_len, ready.max_total_tokens,
                    ready.max_running_requests)
        tm = TokenizerManager(args, tokenizer, endpoints, ready.context_len, ready.vocab_size)
        tm.memory_plan = ready.memory_plan
        tm.max_running_requests = ready.max_running_requests
        tm.admission = AdmissionControl.from_limits(ready.max_running_requests,
                                                    args.max_queued_requests)
        tm.cuda_graph_batch_sizes = ready.cuda_graph_batch_sizes
        tm.dtype = {"requested": args.dtype, "resolved": ready.dtype, "reason": ready.dtype_reason}
        tm.scheduler_threads = ready.num_threads
        name = args.served_model_name or os.path.basename(model_path.rstrip("/"))
        app = create_app(tm, args, name)

        def on_death(p: mp.Process) -> None:
            tm.healthy = False
            logger.error("%s process died (exit code %s); shutting down", p.name, p.exitcode)
            os.kill(os.getpid(), signal.SIGTERM)

        serving = threading.Event()
        serving.set()  # cleared once uvicorn is done: stopping the children is no death
        threading.Thread(target=_watch_children, args=(procs, on_death, serving),
                         daemon=True).start()
        config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                timeout_keep_alive=30)
        server = DrainingServer(config, tm, args.shutdown_timeout)  # SIGTERM: drain, exit 0

        async def serve() -> None:
            await tm.start()
            await server.serve()

        try:
            asyncio.run(serve())
        finally:
            serving.clear()
        if not tm.healthy:
            raise LaunchError("a child process died while serving (see the log above)")
    finally:
        stop_children(procs)
        endpoints.cleanup()

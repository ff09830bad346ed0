"""Launch one engine instance's HTTP side: start the children (runtime/children.py), then
serve FastAPI + uvicorn + TokenizerManager in this, the API process.

    API process (this one) --ZMQ--> scheduler process --ZMQ--> detokenizer process --ZMQ--> API

Children ignore SIGTERM/SIGINT (a group signal is this process's to handle: it drains
first); if one dies while serving, the server shuts down rather than leave requests hanging.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import threading
import time

from radixlm.config import ServerArgs
from radixlm.ipc import IpcEndpoints
from radixlm.runtime.children import (
    LaunchError, spawn_children, stop_children, wait_ready, watch_children,
)

logger = logging.getLogger(__name__)


def launch_server(args: ServerArgs) -> None:
    if args.node_rank > 0:  # another host of a multi-node TP model: scheduler ranks only
        from radixlm.runtime.tp_ranks import run_follower_node
        return run_follower_node(args)
    endpoints = IpcEndpoints.create(detokenize_in_api=args.detokenizer_mode == "api")
    t0 = time.perf_counter()
    # The children spawn first and load the model while this process imports its own
    # modules and loads the tokenizer (~3 s that used to come before the spawn).
    spawned = spawn_children(args, endpoints)
    procs: list[mp.Process] = spawned.procs
    try:
        import asyncio

        import uvicorn

        from radixlm.runtime.process_threads import setup_helper_threads

        setup_helper_threads()  # the API process runs torch single-threaded
        from radixlm.model_path import resolve_model_path
        from radixlm.server.admission import AdmissionControl
        from radixlm.server.app import create_app
        from radixlm.server.drain import DrainingServer
        from radixlm.server.tokenizer_manager import TokenizerManager
        from radixlm.tokenizer.loader import load_tokenizer

        model_path = resolve_model_path(args.model)
        tokenizer = load_tokenizer(model_path, args.tokenizer)
        ready = wait_ready(spawned)
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
        threading.Thread(target=watch_children, args=(procs, on_death, serving),
                         daemon=True).start()
        # h11 and asyncio whatever else is installed (ray[serve] brings httptools, uvloop).
        config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                timeout_keep_alive=30, http="h11", loop="asyncio")
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
        spawned.control.close()  # (wait_ready closes it too; closing twice is fine)
        endpoints.cleanup()

"""`radixlm serve-ray`: `radixlm serve`'s engine flags plus RayServeArgs; serves the app on
--host/--port through Ray Serve's HTTP proxy until Ctrl-C or SIGTERM, then shuts Serve
down (and the local Ray cluster, if it started one). Ray is imported only when run."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from radixlm.config import ServerArgs, add_cli_args, from_cli_args
from radixlm.ray.config import RayServeArgs


def _run(ns: argparse.Namespace) -> None:
    try:
        import ray
        from ray import serve
    except ImportError:
        print("radixlm serve-ray: Ray is not installed (pip install 'radixlm[ray]')",
              file=sys.stderr)
        sys.exit(1)
    from radixlm.ray.application import build_app
    from radixlm.runtime.process_utils import setup_logging

    server_args: ServerArgs = from_cli_args(ns, ServerArgs)
    ray_args: RayServeArgs = from_cli_args(ns, RayServeArgs)
    setup_logging(server_args.log_level, "serve-ray")
    if ray_args.ray_address:
        ray.init(address=ray_args.ray_address)
    else:
        try:
            ray.init(address="auto")
        except ConnectionError:
            ray.init(include_dashboard=False)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": server_args.host, "port": server_args.port})
        serve.run(build_app(ray_args, server_args), name=ray_args.app_name,
                  route_prefix=ray_args.route_prefix, blocking=False)
        print(f"radixlm on Ray Serve: http://{server_args.host}:{server_args.port}"
              f"{ray_args.route_prefix.rstrip('/')}/v1", flush=True)
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()


def add_serve_ray_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve-ray", help="Serve a model on Ray Serve: engine replicas "
                       "routed by the cache-aware policy (pip install 'radixlm[ray]').")
    add_cli_args(p, ServerArgs)
    add_cli_args(p, RayServeArgs)
    p.set_defaults(func=_run)

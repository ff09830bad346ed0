"""`radixlm router`: argparse wiring only (flags generated from RouterArgs)."""

from __future__ import annotations

import argparse

from radixlm.config import add_cli_args, from_cli_args
from radixlm.router.config import RouterArgs


def _run(ns: argparse.Namespace) -> None:
    from radixlm.runtime.process_utils import setup_logging
    from radixlm.router.launch import run_router

    args: RouterArgs = from_cli_args(ns, RouterArgs)
    setup_logging(args.log_level, "router")
    try:
        run_router(args, ns.worker_urls)
    except KeyboardInterrupt:
        pass


def add_router_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("router", help="Balance requests over several engine instances.")
    p.add_argument("--worker-urls", nargs="*", default=[], metavar="URL",
                   help="Engine instances, e.g. http://127.0.0.1:30001 (more can be added "
                   "at run time with POST /workers).")
    add_cli_args(p, RouterArgs)
    p.set_defaults(func=_run)

"""`radixlm serve | generate | bench | memory | router | serve-ray`: the command line, flags generated from ServerArgs."""

from __future__ import annotations

import argparse
import json
import sys

from radixlm.config import ServerArgs, add_cli_args, from_cli_args


def _serve(ns: argparse.Namespace) -> None:
    from radixlm.model_path import ModelNotFoundError
    from radixlm.runtime.process_utils import setup_logging
    from radixlm.router.launch_dp import DPLaunchError, launch_dp
    from radixlm.server.launch import LaunchError, launch_server

    from radixlm.runtime.fast_exit import exit_now

    args = from_cli_args(ns)
    setup_logging(args.log_level, "api" if args.dp_size <= 1 else "router")
    try:
        if args.dp_size > 1:
            launch_dp(args)
        else:
            launch_server(args)
    except (LaunchError, DPLaunchError, ModelNotFoundError) as e:
        print(f"radixlm serve: {e}", file=sys.stderr)
        exit_now(1)
    except KeyboardInterrupt:
        pass
    # The children are stopped and the sockets closed: leave without the slow teardown
    # of torch and friends (runtime/fast_exit.py). Any other exception exits as usual.
    exit_now(0)


def _generate(ns: argparse.Namespace) -> None:
    from radixlm.engine import Engine
    from radixlm.runtime.process_utils import setup_logging
    from radixlm.sampling_params import SamplingParams

    args = from_cli_args(ns)
    setup_logging(args.log_level, "generate")
    engine = Engine(**{k: v for k, v in vars(args).items()})
    prompt = ns.prompt
    if ns.chat:
        prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": ns.prompt}],
                                                      add_generation_prompt=True, tokenize=True)
        if isinstance(prompt, dict):  # transformers >= 5 may return a BatchEncoding
            prompt = prompt["input_ids"]
    params = SamplingParams(max_new_tokens=ns.max_new_tokens, temperature=ns.temperature,
                            top_p=ns.top_p, top_k=ns.top_k, seed=ns.seed)
    out = engine.generate(prompt, params)
    if ns.json:
        print(json.dumps(out))
    else:
        print(out["text"])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixlm", description="An LLM serving engine.")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="Serve a model over the OpenAI API.")
    add_cli_args(serve, ServerArgs)
    serve.set_defaults(func=_serve)

    gen = sub.add_parser("generate", help="Generate text for one prompt, offline.")
    add_cli_args(gen, ServerArgs)
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--chat", action="store_true", help="Wrap the prompt in the chat template.")
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=-1)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--json", action="store_true", help="Print the whole result as JSON.")
    gen.set_defaults(func=_generate)

    from radixlm.bench.cli import add_bench_parser

    add_bench_parser(sub)

    from radixlm.planning.memory_cli import add_memory_parser

    add_memory_parser(sub)

    from radixlm.router.cli import add_router_parser

    add_router_parser(sub)

    from radixlm.ray.cli import add_serve_ray_parser

    add_serve_ray_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    # OMP_WAIT_POLICY is left to the user: libgomp's default (spin a while before sleeping)
    # is fastest on an idle machine; PASSIVE helps on a busy, shared CPU (docs/tuning.md).
    ns = build_parser().parse_args(argv)
    ns.func(ns)

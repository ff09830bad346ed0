"""Flags shared by several `radixlm bench` commands: datasets, ablations, plots."""

from __future__ import annotations

import argparse

from radixlm.bench.datasets import DATASETS, DatasetArgs
from radixlm.bench.engine_args import parse_ablation
from radixlm.bench.sglang_flags import DATASET_ALIASES, normalize_dataset


def add_dataset_args(p: argparse.ArgumentParser, default: str = "random",
                     choices: tuple[str, ...] = DATASETS) -> None:
    d = DatasetArgs()
    g = p.add_argument_group("dataset")
    # --dataset-name: SGLang bench_serving's name for it (bench/sglang_flags.py).
    g.add_argument("--dataset", "--dataset-name", dest="dataset", default=default,
                   choices=(*choices, *DATASET_ALIASES))
    g.add_argument("--num-prompts", type=int, default=d.num_prompts,
                   help="random / sharegpt: number of requests.")
    g.add_argument("--random-input-len", type=int, default=d.random_input_len)
    g.add_argument("--random-output-len", type=int, default=d.random_output_len)
    g.add_argument("--random-range-ratio", type=float, default=d.random_range_ratio,
                   help="Lengths uniform in [len * ratio, len]; 1.0 = fixed lengths.")
    g.add_argument("--gsp-num-groups", type=int, default=d.gsp_num_groups)
    g.add_argument("--gsp-prompts-per-group", type=int, default=d.gsp_prompts_per_group)
    g.add_argument("--gsp-system-prompt-len", type=int, default=d.gsp_system_prompt_len)
    g.add_argument("--gsp-question-len", type=int, default=d.gsp_question_len)
    g.add_argument("--gsp-output-len", type=int, default=d.gsp_output_len)
    if "sharegpt" in choices:
        g.add_argument("--gsp-num-turns", type=int, default=d.gsp_num_turns,
                       help="Turns per conversation; each turn appends the previous answer "
                       "and a new question.")
        g.add_argument("--dataset-path", default=None, help="ShareGPT-format JSON file.")
        g.add_argument("--sharegpt-output-len", type=int, default=None,
                       help="Fixed output length (default: the reply's length).")
    g.add_argument("--seed", type=int, default=0, help="Dataset seed; repeat i uses seed + i.")


def dataset_args_from(ns: argparse.Namespace) -> DatasetArgs:
    return DatasetArgs(
        name=normalize_dataset(ns.dataset), num_prompts=ns.num_prompts, random_input_len=ns.random_input_len,
        random_output_len=ns.random_output_len, random_range_ratio=ns.random_range_ratio,
        gsp_num_groups=ns.gsp_num_groups, gsp_prompts_per_group=ns.gsp_prompts_per_group,
        gsp_system_prompt_len=ns.gsp_system_prompt_len, gsp_question_len=ns.gsp_question_len,
        gsp_output_len=ns.gsp_output_len, gsp_num_turns=getattr(ns, "gsp_num_turns", 1),
        dataset_path=getattr(ns, "dataset_path", None),
        sharegpt_output_len=getattr(ns, "sharegpt_output_len", None), seed=ns.seed)


def add_ablation_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ablation", type=parse_ablation, action="append", default=[],
                   metavar="[NAME:]KEY=VALUE[,KEY=VALUE]",
                   help="Also run radixlm with these ServerArgs overrides, side by side "
                   "(repeatable), e.g. no-radix:disable_radix_cache=true, "
                   "no-chunk:chunked_prefill_size=-1, no-overlap:disable_overlap_schedule=true.")

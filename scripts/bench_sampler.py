"""Times `Sampler.__call__` (greedy; temperature > 0 plain, with top_p, with top_k) on random
bf16 logits, for vocabularies of 49152 (SmolLM2) and 262144 (Gemma 3) and 1, 8 and 32 rows:

    PYTHONPATH=$PWD python scripts/bench_sampler.py [--baseline OLD_SAMPLER_PY] [--repeat 20]

--baseline: a sampler.py from an earlier commit (`git show REV:radixlm/executor/sampler.py >
old.py`), timed side by side in the same process (alternating). The logits are random x 4, so
that a top-p 0.9 nucleus is a few hundred tokens, as with a real model's; medians in ms.

--engine: instead, the default model's engine generates 48 tokens for 32 prompts per
configuration (top_p 0.9 / T=1 / greedy) and every `Sampler.__call__` of 24+ rows is timed,
with the CPU sampling kernel and with its torch path (`sampling_kernel` patched to None),
twice each, alternated: the sampler's cost on real logits in the real step.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time

import torch

from radixlm.executor import sampler as current
from radixlm.runtime.host_malloc import tune_host_malloc
from radixlm.sampling_params import SamplingParams
from radixlm.scheduler.output_processor import OutputProcessor
from radixlm.scheduler.req import Req


def load(path: str):
    spec = importlib.util.spec_from_file_location("baseline_sampler", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["baseline_sampler"] = module
    spec.loader.exec_module(module)
    return module


def make_reqs(n: int, vocab: int, **kw) -> list[Req]:
    reqs = []
    for i in range(n):
        req = Req(rid=str(i), input_ids=[1, 2, 3], sampling_params=SamplingParams(**kw))
        req.generator = torch.Generator().manual_seed(i)
        OutputProcessor(None, 100, vocab, torch.device("cpu")).init_penalty_state(req)
        reqs.append(req)
    return reqs


def engine_main() -> None:
    from radixlm.engine import Engine

    times: list[tuple[int, float]] = []
    call = current.Sampler.__call__

    def timed(self, logits, info):
        t0 = time.perf_counter()
        out = call(self, logits, info)
        times.append((logits.shape[0], time.perf_counter() - t0))
        return out

    current.Sampler.__call__ = timed
    kernel = current.sampling_kernel
    eng = Engine()
    prompts = [f"Write a short story about a {w} who learns to code." for w in
               ("cat", "dog", "fox", "owl", "bee", "ant", "elk", "yak")] * 4
    try:
        for params in (dict(temperature=1.0, top_p=0.9), dict(temperature=1.0),
                       dict(temperature=0.0)):
            for name, fn in (("kernel", kernel), ("torch", lambda: None)) * 2:
                current.sampling_kernel = fn
                times.clear()
                eng.generate(prompts, SamplingParams(max_new_tokens=48, ignore_eos=True, **params))
                big = [t for n, t in times if n >= 24]
                print(f"{params} {name:6s} {len(big)} calls of 24+ rows: median "
                      f"{statistics.median(big) * 1e3:.2f} ms", flush=True)
    finally:
        current.sampling_kernel = kernel
        eng.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", default="")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--engine", action="store_true", help="time the sampler inside the engine")
    args = ap.parse_args()
    if args.engine:
        return engine_main()
    tune_host_malloc()  # as a compute process allocates
    modules = {"new": current}
    if args.baseline:
        modules["old"] = load(args.baseline)
    cases = {"greedy": dict(temperature=0.0), "T=1": dict(temperature=1.0),
             "top_p=0.9,T=0.7": dict(temperature=0.7, top_p=0.9),
             "top_k=50,T=0.7": dict(temperature=0.7, top_k=50)}
    for vocab in (49152, 262144):
        for rows in (1, 8, 32):
            for name, kw in cases.items():
                reqs = make_reqs(rows, vocab, **kw)
                logits = (torch.randn(rows, vocab) * 4).to(torch.bfloat16)
                info = current.SamplingBatchInfo.from_reqs(reqs, vocab, torch.device("cpu"))
                times: dict[str, list[float]] = {k: [] for k in modules}
                for _ in range(args.repeat):
                    for key, mod in modules.items():
                        s = mod.Sampler()
                        t0 = time.perf_counter()
                        s(logits, info)
                        times[key].append(time.perf_counter() - t0)
                cells = "  ".join(f"{k} {statistics.median(v) * 1e3:8.2f} ms" for k, v in times.items())
                ratio = (f"  old/new {statistics.median(times['old']) / statistics.median(times['new']):.1f}x"
                         if "old" in times else "")
                print(f"V={vocab:6d} rows={rows:2d} {name:16s} {cells}{ratio}")


if __name__ == "__main__":
    main()

"""Engine: the offline Python API. Same Scheduler and Detokenizer as the server, in-process.

    from radixlm import Engine, SamplingParams
    engine = Engine()                      # default model, CPU or GPU
    out = engine.generate("The capital of France is", SamplingParams(max_new_tokens=16))
    print(out["text"])
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Iterable

from radixlm.config import ServerArgs
from radixlm.messages import AbortReq, ReqStrOut, TokenizedGenerateReq
from radixlm.runtime.process_threads import setup_compute_process
from radixlm.sampling_params import SamplingParams
from radixlm.runtime.build import build_scheduler
from radixlm.tokenizer.detokenizer import Detokenizer

Prompt = str | list[int]


class Engine:
    def __init__(self, model: str | None = None, **server_args: Any) -> None:
        self.args = ServerArgs(model=model, **server_args)
        # The scheduler runs in the caller's process: its thread count is the caller's
        # (torch's default: one per physical core) unless num_threads is given.
        setup_compute_process(self.args, guest=True)
        self.scheduler, self.tokenizer = build_scheduler(self.args)
        self.detokenizer = Detokenizer(self.tokenizer)
        self._ids = itertools.count()
        self._results: dict[str, dict[str, Any]] = {}

    # --- fine-grained control (tests, benchmarks) ------------------------------------

    def submit(self, prompt: Prompt, params: SamplingParams | None = None, stream: bool = False) -> str:
        """Queue one request; returns its rid. Raises ValueError on invalid input."""
        params = dataclasses.replace(params) if params is not None else SamplingParams()
        params.validate(self.scheduler.runner.vocab_size)
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        rid = f"engine-{next(self._ids)}"
        self._results[rid] = {"text": "", "output_ids": [], "meta_info": {}, "finished": False}
        self.scheduler.handle(TokenizedGenerateReq(rid, ids, params, stream))
        return rid

    def abort(self, rid: str) -> None:
        self.scheduler.handle(AbortReq(rid))

    def step(self) -> list[ReqStrOut]:
        """Run one scheduler step; fold its outputs into the results."""
        outs = [self.detokenizer.handle(o) for o in self.scheduler.step()]
        for o in outs:
            res = self._results[o.rid]
            res["text"] += o.text_delta
            res["output_ids"] += o.token_ids_delta
            if o.logprobs:
                res.setdefault("logprobs", []).extend(o.logprobs)
            if o.prompt_logprobs is not None:
                res["prompt_logprobs"] = o.prompt_logprobs
            if o.finish_reason is not None:
                res["finished"] = True
                res["meta_info"] = {"prompt_tokens": o.prompt_tokens,
                                    "completion_tokens": o.completion_tokens,
                                    "cached_tokens": o.cached_tokens,
                                    "finish_reason": o.finish_reason,
                                    "matched_stop": o.matched_stop, "error": o.error,
                                    "error_status": o.error_status}
        return outs

    def result(self, rid: str) -> dict[str, Any]:
        return self._results[rid]

    def pop_result(self, rid: str) -> dict[str, Any]:
        return self._results.pop(rid)

    def run_until_done(self, rids: Iterable[str]) -> None:
        rids = list(rids)
        while not all(self._results[r]["finished"] for r in rids):
            self.step()
        self.settle()

    def settle(self) -> None:
        """Overlap scheduling answers a request one step before its last launched batch
        completes: when nothing else runs, finish that batch so the pools are idle."""
        while self.scheduler.only_settling():
            self.step()

    # --- batch API ---------------------------------------------------------------------

    def generate(self, prompt: Prompt | list[Prompt],
                 sampling_params: SamplingParams | list[SamplingParams] | dict | None = None):
        """Generate for one prompt (returns a dict) or a list of prompts (a list of dicts).

        A prompt is a string or a list of token ids. Each result has "text",
        "output_ids" and "meta_info" (token counts, finish_reason, matched_stop).
        """
        single = isinstance(prompt, str) or (prompt and isinstance(prompt[0], int))
        prompts: list[Prompt] = [prompt] if single else list(prompt)
        if isinstance(sampling_params, dict):
            sampling_params = SamplingParams(**sampling_params)
        params = (sampling_params if isinstance(sampling_params, list)
                  else [sampling_params] * len(prompts))
        rids = [self.submit(p, sp) for p, sp in zip(prompts, params)]
        self.run_until_done(rids)
        results = [self.pop_result(r) for r in rids]
        for r in results:
            r.pop("finished")
        return results[0] if single else results

    def check_invariant(self) -> None:
        self.scheduler.check_invariant()

    def shutdown(self) -> None:
        """The offline engine runs in the caller's process: only the hierarchical cache's
        IO threads stop (its queued writes reach the disk first) and its storage directory
        is unlocked."""
        self.scheduler.tree_cache.close()

"""Benchmark datasets: random, generated shared prefix (optionally multi-turn), ShareGPT.

Every generator is a pure function of its arguments and a seed. Prompts are built as token
ids (drawn from `TokenPool`, the vocabulary minus special tokens); `to_text` decodes them
for servers that take text, and re-counts the prompt length with the tokenizer, since a
decode/encode round trip need not give back the same number of tokens.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from typing import Any

from radixlm.bench.workload import special_token_ids

DATASETS = ("random", "generated-shared-prefix", "sharegpt")


@dataclass(frozen=True)
class BenchRequest:
    """One request (or, with `follow_ups`, one conversation) of a benchmark.

    `prompt` is token ids or text; `prompt_len` its length in tokens. A multi-turn
    conversation sends `prompt` first; turn k+1's prompt is turn k's prompt + its answer +
    `follow_ups[k]`, so each turn extends the previous one (a prefix-cache hit)."""

    prompt: list[int] | str
    prompt_len: int
    output_len: int
    group: int = 0  # shared-prefix group (0 for datasets without groups)
    follow_ups: tuple[list[int] | str, ...] = ()


@dataclass(frozen=True)
class TokenPool:
    """Token ids a random prompt may contain: range(vocab_size) minus `excluded`."""

    ids: tuple[int, ...]

    @classmethod
    def from_vocab(cls, vocab_size: int, excluded: set[int] = frozenset()) -> "TokenPool":
        ids = tuple(i for i in range(vocab_size) if i not in excluded)
        if not ids:
            raise ValueError("no token ids left to draw from")
        return cls(ids)

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> "TokenPool":
        return cls.from_vocab(len(tokenizer), special_token_ids(tokenizer))

    def draw(self, rng: random.Random, n: int) -> list[int]:
        return [self.ids[rng.randrange(len(self.ids))] for _ in range(n)]


@dataclass(frozen=True)
class RandomDataset:
    """SGLang's `random`: input lengths uniform in [input_len * range_ratio, input_len],
    output lengths likewise (range_ratio 1.0 = every request exactly input_len/output_len)."""

    num_prompts: int = 64
    input_len: int = 256
    output_len: int = 64
    range_ratio: float = 1.0
    seed: int = 0

    def validate(self) -> None:
        if self.num_prompts < 1 or self.input_len < 1 or self.output_len < 1:
            raise ValueError("--num-prompts, --random-input-len and --random-output-len must "
                             "be >= 1")
        if not 0.0 < self.range_ratio <= 1.0:
            raise ValueError(f"--random-range-ratio must be in (0, 1], got {self.range_ratio}")

    def generate(self, pool: TokenPool) -> list[BenchRequest]:
        self.validate()
        rng = random.Random(self.seed)
        # Lengths first, then ids: one prompt's length change does not shift the others.
        lo_in = max(1, int(self.input_len * self.range_ratio))
        lo_out = max(1, int(self.output_len * self.range_ratio))
        lens = [(rng.randint(lo_in, self.input_len), rng.randint(lo_out, self.output_len))
                for _ in range(self.num_prompts)]
        return [BenchRequest(pool.draw(rng, n_in), n_in, n_out) for n_in, n_out in lens]


@dataclass(frozen=True)
class SharedPrefixDataset:
    """SGLang's `generated-shared-prefix`: `num_groups` system prompts of
    `system_prompt_len` tokens, each followed by `prompts_per_group` different questions of
    `question_len` tokens. With `num_turns` > 1 every prompt is a conversation: each later
    turn appends the previous answer and a new question of `question_len` tokens.
    Requests are interleaved across groups (g0q0, g1q0, ..., g0q1, ...), so a group's
    prefix is not simply reused by the very next request."""

    num_groups: int = 8
    prompts_per_group: int = 16
    system_prompt_len: int = 1024
    question_len: int = 64
    output_len: int = 64
    num_turns: int = 1
    seed: int = 0

    def validate(self) -> None:
        if min(self.num_groups, self.prompts_per_group, self.system_prompt_len,
               self.question_len, self.output_len, self.num_turns) < 1:
            raise ValueError("generated-shared-prefix sizes must all be >= 1")

    def generate(self, pool: TokenPool) -> list[BenchRequest]:
        self.validate()
        rng = random.Random(self.seed)
        systems = [pool.draw(rng, self.system_prompt_len) for _ in range(self.num_groups)]
        questions = [[pool.draw(rng, self.question_len) for _ in range(self.prompts_per_group)]
                     for _ in range(self.num_groups)]
        follow = [[tuple(pool.draw(rng, self.question_len) for _ in range(self.num_turns - 1))
                   for _ in range(self.prompts_per_group)] for _ in range(self.num_groups)]
        out = []
        for q in range(self.prompts_per_group):
            for g in range(self.num_groups):
                prompt = systems[g] + questions[g][q]
                out.append(BenchRequest(prompt, len(prompt), self.output_len, g, follow[g][q]))
        return out

    @property
    def num_prompts(self) -> int:
        return self.num_groups * self.prompts_per_group


@dataclass(frozen=True)
class ShareGPTDataset:
    """A ShareGPT-format JSON file: a list of {"conversations": [{"from": "human"|"gpt",
    "value": text}, ...]}. Each conversation's first human turn is the prompt; the reply
    that follows gives the output length (unless `output_len` fixes it). As in SGLang,
    pairs with a prompt or reply under 4 tokens, a prompt over 1024 tokens or prompt + reply
    over 2048 are skipped; conversations are shuffled with `seed`."""

    path: str
    num_prompts: int = 64
    output_len: int | None = None
    seed: int = 0
    max_prompt_len: int = 1024
    max_total_len: int = 2048

    def generate(self, tokenizer: Any) -> list[BenchRequest]:
        with open(self.path) as f:
            data = json.load(f)
        pairs = []
        for conv in data:
            turns = conv.get("conversations") or conv.get("conversation") or []
            if len(turns) >= 2 and turns[0].get("from") == "human":
                pairs.append((turns[0]["value"], turns[1]["value"]))
        random.Random(self.seed).shuffle(pairs)
        out: list[BenchRequest] = []
        for prompt, reply in pairs:
            if len(out) == self.num_prompts:
                break
            n_in = len(tokenizer.encode(prompt, add_special_tokens=False))
            n_out = (self.output_len if self.output_len is not None
                     else len(tokenizer.encode(reply, add_special_tokens=False)))
            if n_in < 4 or n_out < 4 or n_in > self.max_prompt_len or \
                    n_in + n_out > self.max_total_len:
                continue
            out.append(BenchRequest(prompt, n_in, n_out))
        if not out:
            raise ValueError(f"{self.path}: no usable conversations")
        return out


def to_text(requests: list[BenchRequest], tokenizer: Any) -> list[BenchRequest]:
    """Decode token-id prompts (and follow-ups) to text; `prompt_len` becomes the token
    count of that text as the tokenizer encodes it (what a server will see)."""
    out = []
    for r in requests:
        if isinstance(r.prompt, str):
            out.append(r)
            continue
        text = tokenizer.decode(r.prompt)
        follow = tuple(tokenizer.decode(f) if not isinstance(f, str) else f for f in r.follow_ups)
        out.append(replace(r, prompt=text, follow_ups=follow,
                           prompt_len=len(tokenizer.encode(text, add_special_tokens=False))))
    return out


@dataclass(frozen=True)
class DatasetArgs:
    """The dataset flags of `radixlm bench serve` / `offline`, in one place."""

    name: str = "random"
    num_prompts: int = 64
    random_input_len: int = 256
    random_output_len: int = 64
    random_range_ratio: float = 1.0
    gsp_num_groups: int = 8
    gsp_prompts_per_group: int = 16
    gsp_system_prompt_len: int = 1024
    gsp_question_len: int = 64
    gsp_output_len: int = 64
    gsp_num_turns: int = 1
    dataset_path: str | None = None
    sharegpt_output_len: int | None = None
    seed: int = 0

    def build(self, tokenizer: Any, pool: TokenPool, seed_offset: int = 0) -> list[BenchRequest]:
        """The requests, as token ids for random/shared-prefix (text for ShareGPT)."""
        seed = self.seed + seed_offset
        if self.name == "random":
            return RandomDataset(self.num_prompts, self.random_input_len, self.random_output_len,
                                 self.random_range_ratio, seed).generate(pool)
        if self.name == "generated-shared-prefix":
            return SharedPrefixDataset(self.gsp_num_groups, self.gsp_prompts_per_group,
                                       self.gsp_system_prompt_len, self.gsp_question_len,
                                       self.gsp_output_len, self.gsp_num_turns,
                                       seed).generate(pool)
        if self.name == "sharegpt":
            if not self.dataset_path:
                raise ValueError("--dataset sharegpt needs --dataset-path FILE.json")
            return ShareGPTDataset(self.dataset_path, self.num_prompts, self.sharegpt_output_len,
                                   seed).generate(tokenizer)
        raise ValueError(f"--dataset must be one of {DATASETS}, got {self.name!r}")
